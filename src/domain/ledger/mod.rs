//! The run ledger (`spec/002_6a0ddaf11b83bfe4.txt` §3, §5, §8.3, §10): an append-only
//! sequence of events per binding and epoch, the rules an append must pass, and the
//! reducer that folds events into state.
//!
//! Everything here is pure. A store keeps the folded [`LedgerState`] of a binding's
//! epoch next to its events and, in the same atomic step as the fence check, runs
//! [`plan_append`] on it: the plan is the event to store and the state after it. Reading
//! a run folds the same way, so state replay is the reducer applied to the events
//! ([`LedgerState::apply`]), versioned by [`REDUCER_VERSION`].

mod envelope;
pub mod episode;
mod fold;
mod metrics;
mod payload;
pub mod shadow;
pub mod signal;
pub mod verification;

pub use envelope::{
    EventType, FEEDBACK_RUN, LedgerEvent, NewEvent, Versions, canonical_json, event_id,
    intent_hash, request_digest,
};
pub use episode::{ArtifactRef, Episode, OutcomeHead, OutcomeStrength, WorkItem, WorkItemStatus};
pub use fold::{
    Budget, Budgets, EffectRecord, EffectStatus, FeedbackHead, LedgerState, ProjectionHealth,
    Reducer, RunState, RunStatus, TurnUsage, UTILISATION_BUCKETS_PERMILLE,
};
pub use metrics::{BindingMetrics, RunMetrics, binding_metrics, run_metrics};
pub use payload::{
    MAX_ATTRIBUTED, MAX_PAYLOAD_BYTES, Outcome, RUN_OUTCOMES, RunOutcomeKind, Via, forbidden_field,
    validate_payload,
};

use serde::{Deserialize, Serialize};

use crate::domain::state::Rejection;

/// The reducer version every event is recorded with; a change in [`LedgerState::apply`]
/// that folds old events differently must bump it.
pub const REDUCER_VERSION: &str = "ledger-reducer/1";

/// Identical intent hashes in a row that count as a loop (§8.3).
pub const LOOP_THRESHOLD: usize = 3;

/// Intent hashes kept per run for the repeated-action ratio (§8.3).
pub const INTENT_WINDOW: usize = 20;

/// What an append needs besides the event: its preconditions and limits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppendRequest {
    pub event: NewEvent,
    /// The SHA-256 digest of the caller's idempotency key (only digests are stored).
    pub idempotency: Option<String>,
    /// Append only if the binding's last sequence is this one (0: empty).
    pub expected_last_seq: Option<u64>,
    /// Circuit breakers (§10.1), from the binding's `SandboxProfile`.
    pub budgets: Budgets,
    /// The event's tool has defence `none` in the binding's `SandboxProfile`: an
    /// `EffectAttempted` needs an approved human review first (§5.2).
    pub approval_required: bool,
    /// The run-level compare-and-swap preconditions of a governed-v2 event
    /// (`spec/003` "Event And Outcome Authority"; epoch and generation are the scope's).
    pub preconditions: Option<RunPreconditions>,
}

/// What a governed-v2 writer asserts about the run it appends to: the run's last
/// sequence and the status of what the event moves (the work item it names, else the
/// run). Any mismatch refuses the append without a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunPreconditions {
    pub run_last_seq: u64,
    pub status: String,
}

/// The decided append: the event to store, the state after it, and what changed.
#[derive(Clone, Debug, PartialEq)]
pub struct AppendPlan {
    pub event: LedgerEvent,
    pub state: LedgerState,
    pub signals: AppendSignals,
}

/// What an append changed that a caller or a metric wants to see without reading the
/// state: derived by [`signals`] from the state before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppendSignals {
    /// This append made [`LOOP_THRESHOLD`] identical effect intents in a row (§8.3).
    pub loop_detected: bool,
    /// The effect named by the event's `idempotency_key`, after the append.
    pub effect: Option<EffectRecord>,
    /// The effect's status before the append (`None`: the key was new).
    pub effect_before: Option<EffectStatus>,
    /// The signal a signal event names, after the append.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<(String, signal::SignalRecord)>,
}

impl AppendSignals {
    /// +1 when the append left an effect waiting for reconciliation or a person (unknown,
    /// awaiting a human) that was not waiting before, -1 when it settled one, else 0.
    pub fn waiting_delta(&self) -> i64 {
        let waiting = |s: Option<EffectStatus>| {
            matches!(s, Some(EffectStatus::Unknown | EffectStatus::AwaitingHuman))
        };
        let after = self.effect.as_ref().map(|e| e.status);
        i64::from(waiting(after)) - i64::from(waiting(self.effect_before))
    }
}

/// The signals of an append of `event` that took `before` to `after`.
pub fn signals(before: &LedgerState, after: &LedgerState, event: &LedgerEvent) -> AppendSignals {
    let loops = |s: &LedgerState| s.runs.get(&event.run_id).map_or(0, |r| r.loops_detected);
    let key = event
        .payload
        .get("idempotency_key")
        .and_then(|k| k.as_str());
    let signal = event
        .event_type
        .is_signal()
        .then(|| event.payload.get("signal_id").and_then(|v| v.as_str()))
        .flatten()
        .and_then(|id| after.signals.get(id).map(|s| (id.to_owned(), s.clone())));
    AppendSignals {
        loop_detected: loops(after) > loops(before),
        effect: key.and_then(|k| after.effects.get(k)).cloned(),
        effect_before: key.and_then(|k| before.effects.get(k)).map(|e| e.status),
        signal,
    }
}

/// Decides an append against the folded state of the binding's epoch. `event_id` and
/// `now_ms` come from the store (server-minted). Refusals change nothing.
pub fn plan_append(
    state: &LedgerState,
    request: &AppendRequest,
    binding_id: &str,
    epoch: u64,
    event_id: String,
    now_ms: i64,
) -> Result<AppendPlan, Rejection> {
    let new = &request.event;
    new.check()?;
    // Projections folded by another reducer: every run write fails closed until repair.
    state.check_reducer()?;
    validate_payload(new.event_type, &new.payload)?;
    if let Some(expected) = request.expected_last_seq
        && expected != state.last_seq
    {
        return Err(Rejection::SequenceConflict {
            expected,
            actual: state.last_seq,
        });
    }
    episode::check_governed(
        state.runs.get(&new.run_id),
        new,
        request.preconditions.as_ref(),
    )?;
    state.admit(new, &request.budgets, request.approval_required)?;
    if new.event_type.is_signal() {
        signal::admit(&state.signals, new, now_ms)?;
    }
    let mut versions = new.versions.clone();
    versions.reducer = REDUCER_VERSION.to_owned();
    if versions.schema.is_empty() {
        versions.schema = format!("{}/1", new.event_type.as_str());
    }
    let event = LedgerEvent {
        seq: state.last_seq + 1,
        event_id,
        event_type: new.event_type,
        binding_id: binding_id.to_owned(),
        epoch,
        run_id: new.run_id.clone(),
        turn_id: new.turn_id.clone(),
        agent_id: new.agent_id.clone(),
        lamport: state.lamport.max(new.lamport.unwrap_or(0)) + 1,
        recorded_at_ms: now_ms,
        intent_hash: intent_hash(new.event_type, &new.payload),
        versions,
        payload: new.payload.clone(),
        request_digest: request_digest(new),
    };
    let mut next = state.clone();
    next.apply(&event);
    let signals = signals(state, &next, &event);
    Ok(AppendPlan {
        event,
        state: next,
        signals,
    })
}

/// An idempotent retry: the same key with the same request returns the original event;
/// with another request it is `idempotency_mismatch`.
pub fn replay_or_mismatch(original: LedgerEvent, new: &NewEvent) -> Result<LedgerEvent, Rejection> {
    if original.request_digest == request_digest(new) {
        Ok(original)
    } else {
        Err(Rejection::IdempotencyMismatch)
    }
}

#[cfg(test)]
mod tests;
