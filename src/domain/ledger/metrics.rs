//! Metrics derived from the ledger (`spec/002_6a0ddaf11b83bfe4.txt` §8.3), as pure
//! functions of the folded state: what a run read returns and what a dashboard charts.
//!
//! Ratios are `None` where their denominator is zero (no guardrail ran or was skipped,
//! no action, no completed run): "no data" is not 0 % and not 100 %.

use super::{
    EffectStatus, LedgerState, RunOutcomeKind, RunState, RunStatus, UTILISATION_BUCKETS_PERMILLE,
};

/// One run's derived metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct RunMetrics {
    /// Guardrail evaluations recorded: passed + blocked + skipped.
    pub guardrail_evaluations: u64,
    /// Evaluations that ran (passed or blocked) over those that should have run (all,
    /// skips counted in the denominator).
    pub guardrail_coverage: Option<f64>,
    /// Effect attempts whose intent hash was already in the sliding window, over all
    /// effect attempts.
    pub repeated_action_ratio: Option<f64>,
    pub loops_detected: u64,
    /// How the run ended; `None` while it runs.
    pub outcome: Option<RunOutcomeKind>,
    pub effects_attempted: u64,
    pub tokens: u64,
    pub cost_units: u64,
    /// Cost units per effect attempt.
    pub cost_per_attempted_effect: Option<f64>,
    /// `ContextAssembled` memory budget utilisation, counted per bucket: upper bound in
    /// per mille of the budget (`None`: over the budget) and count.
    pub context_utilisation: Vec<(Option<u64>, u64)>,
}

/// A binding epoch's derived metrics over all of its runs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BindingMetrics {
    pub runs: u64,
    pub runs_running: u64,
    pub resolved: u64,
    pub partially_resolved: u64,
    pub handed_to_human: u64,
    pub abandoned: u64,
    pub failed: u64,
    /// Resolved runs over completed runs.
    pub resolution_rate: Option<f64>,
    /// Cost units of all completed runs over the resolved ones.
    pub cost_per_resolved_outcome: Option<f64>,
    /// Cost units of all completed runs over the completed runs (every attempted outcome).
    pub cost_per_attempted_outcome: Option<f64>,
    /// Effects whose outcome is unknown or that await a person's decision.
    pub unknown_effects_waiting: u64,
    /// Effects attempted with no outcome observed yet.
    pub effects_in_flight: u64,
    /// Effects of tools without a defence waiting for a person to approve the attempt.
    pub approvals_waiting: u64,
    pub guardrail_coverage: Option<f64>,
    pub repeated_action_ratio: Option<f64>,
    pub loops_detected: u64,
}

fn ratio(numerator: u64, denominator: u64) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

fn buckets(counts: &[u64; 6]) -> Vec<(Option<u64>, u64)> {
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| (UTILISATION_BUCKETS_PERMILLE.get(i).copied(), *c))
        .collect()
}

/// The metrics of one run.
pub fn run_metrics(run: &RunState) -> RunMetrics {
    let ran = run.guardrails_passed + run.guardrails_blocked;
    let evaluations = ran + run.guardrails_skipped;
    RunMetrics {
        guardrail_evaluations: evaluations,
        guardrail_coverage: ratio(ran, evaluations),
        repeated_action_ratio: ratio(run.repeated_actions, run.actions),
        loops_detected: run.loops_detected,
        outcome: run.outcome,
        effects_attempted: run.actions,
        tokens: run.usage.tokens,
        cost_units: run.usage.cost_units,
        cost_per_attempted_effect: ratio(run.usage.cost_units, run.actions),
        context_utilisation: buckets(&run.context_utilisation),
    }
}

/// The metrics of every run of a binding's epoch.
pub fn binding_metrics(state: &LedgerState) -> BindingMetrics {
    let mut m = BindingMetrics::default();
    let (mut ran, mut evaluations, mut repeated, mut actions, mut completed_cost) =
        (0, 0, 0, 0, 0u64);
    for run in state.runs.values() {
        m.runs += 1;
        m.loops_detected += run.loops_detected;
        ran += run.guardrails_passed + run.guardrails_blocked;
        evaluations += run.guardrails_passed + run.guardrails_blocked + run.guardrails_skipped;
        repeated += run.repeated_actions;
        actions += run.actions;
        if run.status == RunStatus::Running {
            m.runs_running += 1;
            continue;
        }
        completed_cost = completed_cost.saturating_add(run.usage.cost_units);
        match run.outcome {
            Some(RunOutcomeKind::Resolved | RunOutcomeKind::VerifiedSuccess) => m.resolved += 1,
            Some(RunOutcomeKind::PartiallyResolved) => m.partially_resolved += 1,
            Some(RunOutcomeKind::HandedToHuman) => m.handed_to_human += 1,
            Some(RunOutcomeKind::Abandoned) => m.abandoned += 1,
            Some(
                RunOutcomeKind::Failed | RunOutcomeKind::UserCorrected | RunOutcomeKind::Regression,
            )
            | None => m.failed += 1,
        }
    }
    let completed = m.runs - m.runs_running;
    m.resolution_rate = ratio(m.resolved, completed);
    m.cost_per_resolved_outcome = ratio(completed_cost, m.resolved);
    m.cost_per_attempted_outcome = ratio(completed_cost, completed);
    m.guardrail_coverage = ratio(ran, evaluations);
    m.repeated_action_ratio = ratio(repeated, actions);
    for effect in state.effects.values() {
        match effect.status {
            EffectStatus::Unknown | EffectStatus::AwaitingHuman => m.unknown_effects_waiting += 1,
            EffectStatus::Attempted => m.effects_in_flight += 1,
            EffectStatus::AwaitingApproval => m.approvals_waiting += 1,
            EffectStatus::Confirmed | EffectStatus::Refused | EffectStatus::Approved => {}
        }
    }
    m
}
