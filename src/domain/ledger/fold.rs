//! The reducer: events folded into the state of a binding's epoch, and the admission
//! rules that state decides (runs, effects, budgets).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    EventType, INTENT_WINDOW, LOOP_THRESHOLD, LedgerEvent, NewEvent,
    episode::{self, Episode},
    payload::{Outcome, RunOutcomeKind, Via, via_of},
};
use crate::domain::state::Rejection;

/// Upper bounds (per mille of the memory budget) of the utilisation buckets.
pub const UTILISATION_BUCKETS_PERMILLE: [u64; 5] = [250, 500, 750, 900, 1000];

/// Where an effect key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectStatus {
    /// Attempted, no outcome observed yet (the worker may have died mid-call).
    Attempted,
    Confirmed,
    /// Definitively did not land: a new attempt is allowed.
    Refused,
    /// Indeterminate: reconcile by key, never retry blindly.
    Unknown,
    /// Reconciliation gave up: a person decides.
    AwaitingHuman,
    /// Not attempted yet: the tool has no defence against a repeat (`defence: none` in
    /// the binding's `SandboxProfile`), and a person approves each attempt (§5.2).
    AwaitingApproval,
    /// A person approved the next attempt; the attempt consumes the approval.
    Approved,
}

impl EffectStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectStatus::Attempted => "attempted",
            EffectStatus::Confirmed => "confirmed",
            EffectStatus::Refused => "refused",
            EffectStatus::Unknown => "unknown",
            EffectStatus::AwaitingHuman => "awaiting_human",
            EffectStatus::AwaitingApproval => "awaiting_approval",
            EffectStatus::Approved => "approved",
        }
    }

    /// Not settled: no new attempt until reconciled or decided (an approval not yet
    /// given counts: the run cannot claim success past it).
    pub fn is_unresolved(self) -> bool {
        matches!(
            self,
            EffectStatus::Attempted
                | EffectStatus::Unknown
                | EffectStatus::AwaitingHuman
                | EffectStatus::AwaitingApproval
        )
    }
}

/// One effect key's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    pub status: EffectStatus,
    pub tool: String,
    pub run_id: String,
    pub turn_id: String,
    pub attempts: u64,
    pub irreversible: bool,
    pub last_attempt_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
    /// The recorded result of a confirmed outcome (what a replay returns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// Usage counted against budgets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnUsage {
    /// Events appended.
    pub steps: u64,
    pub tokens: u64,
    pub cost_units: u64,
    /// Attempts of effects marked `irreversible`.
    pub irreversible: u64,
}

/// Limits of one scope; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    pub steps: Option<u64>,
    pub tokens: Option<u64>,
    pub cost_units: Option<u64>,
    pub irreversible: Option<u64>,
}

/// Circuit breakers per turn and per run (§10.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budgets {
    pub per_turn: Budget,
    pub per_run: Budget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
}

/// A run folded from its events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<RunOutcomeKind>,
    pub started_seq: u64,
    pub last_seq: u64,
    pub events: u64,
    pub usage: TurnUsage,
    pub turns: BTreeMap<String, TurnUsage>,
    pub guardrails_passed: u64,
    pub guardrails_blocked: u64,
    pub guardrails_skipped: u64,
    /// Effect attempts (the actions loop detection looks at).
    pub actions: u64,
    /// Actions whose intent hash was already in the window.
    pub repeated_actions: u64,
    /// Times [`LOOP_THRESHOLD`] identical intents came in a row.
    pub loops_detected: u64,
    pub intent_window: Vec<String>,
    pub identical_in_a_row: u64,
    pub outcomes_confirmed: u64,
    pub outcomes_refused: u64,
    pub outcomes_unknown: u64,
    pub human_reviews_requested: u64,
    /// Memory budget utilisation (used / limit) of each `ContextAssembled`, counted in
    /// the buckets of [`UTILISATION_BUCKETS_PERMILLE`] (the last counts overruns).
    pub context_utilisation: [u64; 6],
    /// The episode contract's work tree, artifacts and outcome head (`spec/003`).
    #[serde(default)]
    pub episode: Episode,
}

impl RunState {
    fn new(run_id: &str, seq: u64) -> Self {
        RunState {
            run_id: run_id.to_owned(),
            status: RunStatus::Running,
            outcome: None,
            started_seq: seq,
            last_seq: seq,
            events: 0,
            usage: TurnUsage::default(),
            turns: BTreeMap::new(),
            guardrails_passed: 0,
            guardrails_blocked: 0,
            guardrails_skipped: 0,
            actions: 0,
            repeated_actions: 0,
            loops_detected: 0,
            intent_window: Vec::new(),
            identical_in_a_row: 0,
            outcomes_confirmed: 0,
            outcomes_refused: 0,
            outcomes_unknown: 0,
            human_reviews_requested: 0,
            context_utilisation: [0; 6],
            episode: Episode::default(),
        }
    }
}

/// The reducer that folded a head from its first event: a new head is this server's
/// ([`super::REDUCER_VERSION`]); a stored head keeps the label it was folded under (a
/// head stored before heads carried one was folded by `ledger-reducer/1`). Only a full
/// replay of the events ([`LedgerState::replay`]) relabels it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Reducer(pub String);

impl Default for Reducer {
    fn default() -> Self {
        Reducer(super::REDUCER_VERSION.to_owned())
    }
}

impl Reducer {
    fn legacy() -> Self {
        Reducer("ledger-reducer/1".to_owned())
    }
}

/// The health of a head's projections (spec 003 "get_run": `projection_health`,
/// `degraded`): the reducer that folded it and whether the head and the events it was
/// read with agree. Degraded projections make run writes fail closed until a repair
/// rebuilds the head from the events; reads keep answering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProjectionHealth {
    /// `healthy` or `degraded`.
    pub status: &'static str,
    /// The reducer that folded the stored head.
    pub reducer: String,
    /// This server's reducer.
    pub expected_reducer: &'static str,
    /// What is wrong, for a person (empty when healthy).
    pub problems: Vec<String>,
}

impl ProjectionHealth {
    pub fn degraded(&self) -> bool {
        self.status != "healthy"
    }
}

/// The folded state of a binding's epoch: what the store keeps beside the events and
/// what every append is decided against.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerState {
    /// The reducer that folded this head.
    #[serde(default = "Reducer::legacy")]
    pub reducer: Reducer,
    pub last_seq: u64,
    pub lamport: u64,
    pub runs: BTreeMap<String, RunState>,
    pub effects: BTreeMap<String, EffectRecord>,
    /// The workspace's leased coordination signals, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub signals: BTreeMap<String, super::signal::SignalRecord>,
    /// The effective feedback head per memory and recall receipt (`memory|receipt_hash`):
    /// the latest `memory_feedback` for that exposure. Review evidence only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_feedback: BTreeMap<String, FeedbackHead>,
}

/// The latest feedback on one memory as one signed recall showed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackHead {
    pub memory_id: String,
    pub receipt_hash: String,
    pub rank: u64,
    pub content_hash: String,
    /// `helpful`, `misleading` or `outdated`.
    pub signal: String,
    pub seq: u64,
}

fn usage_of(payload: &Value) -> (u64, u64) {
    let usage = payload.get("usage");
    let get = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    (get("tokens"), get("cost_units"))
}

fn key_of(payload: &Value) -> Option<&str> {
    payload.get("idempotency_key").and_then(Value::as_str)
}

/// A `HumanReviewRequested` that asks approval for an attempt (not an outcome review).
fn approval_of(payload: &Value) -> bool {
    payload
        .get("approval")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn irreversible_of(payload: &Value) -> bool {
    payload
        .get("irreversible")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn check_budget(
    scope: &str,
    used: &TurnUsage,
    add: &TurnUsage,
    limit: &Budget,
) -> Result<(), Rejection> {
    let checks = [
        ("steps", used.steps, add.steps, limit.steps),
        ("tokens", used.tokens, add.tokens, limit.tokens),
        (
            "cost_units",
            used.cost_units,
            add.cost_units,
            limit.cost_units,
        ),
        (
            "irreversible effects",
            used.irreversible,
            add.irreversible,
            limit.irreversible,
        ),
    ];
    for (what, used, add, limit) in checks {
        if let Some(limit) = limit
            && add > 0
            && used.saturating_add(add) > limit
        {
            return Err(Rejection::BudgetExceeded {
                what: format!("per-{scope} {what}"),
                limit,
            });
        }
    }
    Ok(())
}

fn conflict(what: String) -> Rejection {
    Rejection::Conflict { what }
}

impl LedgerState {
    /// Whether `new` may be appended now (the state-dependent rules; payload shape is
    /// checked by [`super::validate_payload`]).
    /// `approval_required`: the event's tool has no defence against a repeat, so an
    /// attempt needs a person's approval first (§5.2).
    pub fn admit(
        &self,
        new: &NewEvent,
        budgets: &Budgets,
        approval_required: bool,
    ) -> Result<(), Rejection> {
        let reserved = super::envelope::RESERVED_RUNS.contains(&new.run_id.as_str());
        match new.event_type.workspace_run() {
            // Signals and memory feedback belong to the workspace, not to a run (the
            // signal rules need the clock: `signal::admit`, from `plan_append`).
            Some(run) if run == new.run_id => return Ok(()),
            Some(run) => {
                return Err(Rejection::Invalid(format!(
                    "{} is recorded under run id `{run}`",
                    new.event_type.as_str()
                )));
            }
            None if reserved => {
                return Err(Rejection::Invalid(format!(
                    "run id `{}` is reserved for the workspace's own events (signals, memory feedback)",
                    new.run_id
                )));
            }
            None => {}
        }
        let run = self.runs.get(&new.run_id);
        match (new.event_type, run) {
            (EventType::RunStarted, Some(_)) => {
                return Err(conflict(format!("run {} has already started", new.run_id)));
            }
            (EventType::RunStarted, None) => {}
            (_, None) => {
                return Err(conflict(format!(
                    "run {} has not started; append RunStarted first",
                    new.run_id
                )));
            }
            (EventType::RunOutcomeCorrected, Some(_)) => {}
            (_, Some(run)) if run.status == RunStatus::Completed => {
                return Err(conflict(format!("run {} is completed", new.run_id)));
            }
            (_, Some(_)) => {}
        }
        if let Some(run) = run {
            episode::admit(run, new)?;
        }
        let (tokens, cost_units) = usage_of(&new.payload);
        let add = TurnUsage {
            steps: 1,
            tokens,
            cost_units,
            irreversible: u64::from(
                new.event_type == EventType::EffectAttempted && irreversible_of(&new.payload),
            ),
        };
        if let Some(run) = run {
            let turn = run.turns.get(&new.turn_id).copied().unwrap_or_default();
            check_budget("turn", &turn, &add, &budgets.per_turn)?;
            check_budget("run", &run.usage, &add, &budgets.per_run)?;
        }
        let key = key_of(&new.payload);
        let effect = key.and_then(|k| self.effects.get(k));
        match new.event_type {
            EventType::EffectAttempted => match effect {
                Some(e) if e.status == EffectStatus::Confirmed => Err(Rejection::EffectConfirmed {
                    key: key.unwrap_or_default().to_owned(),
                }),
                Some(e) if e.status.is_unresolved() => Err(Rejection::EffectUnresolved {
                    key: key.unwrap_or_default().to_owned(),
                    status: e.status.as_str().to_owned(),
                }),
                Some(e) if e.status == EffectStatus::Approved => Ok(()),
                _ if approval_required => Err(Rejection::ApprovalRequired {
                    key: key.unwrap_or_default().to_owned(),
                    tool: new
                        .payload
                        .get("tool")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                }),
                _ => Ok(()),
            },
            EventType::EffectOutcomeObserved => {
                let key = key.unwrap_or_default();
                let Some(effect) = effect else {
                    return Err(Rejection::NotFound(format!(
                        "an attempt of effect {key} (append EffectAttempted first)"
                    )));
                };
                let via = via_of(&new.payload);
                match (effect.status, via) {
                    (EffectStatus::Attempted, _)
                    | (EffectStatus::Unknown, Via::Reconciliation | Via::Human)
                    | (EffectStatus::AwaitingHuman, Via::Human) => Ok(()),
                    (EffectStatus::Unknown, Via::Direct) => Err(conflict(format!(
                        "effect {key} is unknown: only reconciliation or a person can observe its outcome now"
                    ))),
                    (EffectStatus::AwaitingHuman, _) => {
                        Err(conflict(format!("effect {key} awaits a person's decision")))
                    }
                    (status, _) => Err(conflict(format!(
                        "effect {key} already has the outcome {}",
                        status.as_str()
                    ))),
                }
            }
            EventType::HumanReviewRequested if approval_of(&new.payload) => {
                let key = key.unwrap_or_default();
                match effect.map(|e| e.status) {
                    None | Some(EffectStatus::Refused) => Ok(()),
                    Some(status) => Err(conflict(format!(
                        "effect {key} is {}; an approval is asked before an attempt, when none is pending",
                        status.as_str()
                    ))),
                }
            }
            EventType::HumanReviewRequested => match (key, effect) {
                (Some(key), None) => Err(Rejection::NotFound(format!("effect {key}"))),
                (Some(key), Some(e)) if !e.status.is_unresolved() => Err(conflict(format!(
                    "effect {key} is {}; nothing to review",
                    e.status.as_str()
                ))),
                _ => Ok(()),
            },
            EventType::HumanReviewResolved => match (key, effect) {
                (Some(key), None) => Err(Rejection::NotFound(format!("effect {key}"))),
                (Some(key), Some(e)) if !e.status.is_unresolved() => Err(conflict(format!(
                    "effect {key} is {}; nothing to decide",
                    e.status.as_str()
                ))),
                (Some(key), Some(e)) => {
                    let decision = new.payload.get("decision").and_then(Value::as_str);
                    let approval = matches!(decision, Some("approved" | "rejected"));
                    if approval == (e.status == EffectStatus::AwaitingApproval) {
                        Ok(())
                    } else if approval {
                        Err(conflict(format!(
                            "effect {key} is {}: decide its outcome (confirmed or refused), not an approval",
                            e.status.as_str()
                        )))
                    } else {
                        Err(conflict(format!(
                            "effect {key} awaits approval: decide approved or rejected"
                        )))
                    }
                }
                _ => Ok(()),
            },
            EventType::RunCompleted => {
                let outcome = new
                    .payload
                    .get("outcome")
                    .and_then(Value::as_str)
                    .and_then(RunOutcomeKind::parse);
                let claims_success = matches!(
                    outcome,
                    Some(RunOutcomeKind::Resolved | RunOutcomeKind::PartiallyResolved)
                );
                if claims_success
                    && let Some((key, e)) = self
                        .effects
                        .iter()
                        .find(|(_, e)| e.run_id == new.run_id && e.status.is_unresolved())
                {
                    return Err(Rejection::EffectUnresolved {
                        key: key.clone(),
                        status: e.status.as_str().to_owned(),
                    });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The reducer. Applies an event that [`Self::admit`] accepted (replay applies
    /// recorded events, which were).
    pub fn apply(&mut self, event: &LedgerEvent) {
        self.last_seq = event.seq;
        self.lamport = self.lamport.max(event.lamport);
        let p = &event.payload;
        if event.event_type == EventType::RunStarted {
            self.runs
                .entry(event.run_id.clone())
                .or_insert_with(|| RunState::new(&event.run_id, event.seq));
        }
        if event.event_type.is_signal() {
            super::signal::apply(&mut self.signals, event);
            return;
        }
        if event.event_type == EventType::MemoryAnnotated {
            return;
        }
        if event.event_type == EventType::MemoryFeedback {
            let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
            self.memory_feedback.insert(
                format!("{}|{}", text("memory_id"), text("receipt_hash")),
                FeedbackHead {
                    memory_id: text("memory_id").to_owned(),
                    receipt_hash: text("receipt_hash").to_owned(),
                    rank: p.get("rank").and_then(Value::as_u64).unwrap_or(0),
                    content_hash: text("content_hash").to_owned(),
                    signal: text("signal").to_owned(),
                    seq: event.seq,
                },
            );
            return;
        }
        let key = key_of(p).map(str::to_owned);
        match event.event_type {
            EventType::EffectAttempted => {
                if let Some(key) = &key {
                    let attempts = self.effects.get(key).map_or(0, |e| e.attempts);
                    self.effects.insert(
                        key.clone(),
                        EffectRecord {
                            status: EffectStatus::Attempted,
                            tool: p
                                .get("tool")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            run_id: event.run_id.clone(),
                            turn_id: event.turn_id.clone(),
                            attempts: attempts + 1,
                            irreversible: irreversible_of(p),
                            last_attempt_seq: event.seq,
                            outcome_seq: None,
                            via: None,
                            result: None,
                        },
                    );
                }
            }
            EventType::EffectOutcomeObserved => {
                if let Some(e) = key.as_ref().and_then(|k| self.effects.get_mut(k)) {
                    let outcome = p
                        .get("outcome")
                        .and_then(Value::as_str)
                        .and_then(Outcome::parse);
                    e.status = match outcome {
                        Some(Outcome::Confirmed) => EffectStatus::Confirmed,
                        Some(Outcome::Refused) => EffectStatus::Refused,
                        _ if e.status == EffectStatus::AwaitingHuman => EffectStatus::AwaitingHuman,
                        _ => EffectStatus::Unknown,
                    };
                    e.outcome_seq = Some(event.seq);
                    e.via = Some(via_of(p));
                    e.result = (e.status == EffectStatus::Confirmed)
                        .then(|| p.get("result").cloned())
                        .flatten();
                }
            }
            EventType::HumanReviewRequested if approval_of(p) => {
                if let Some(key) = &key {
                    let e = self
                        .effects
                        .entry(key.clone())
                        .or_insert_with(|| EffectRecord {
                            status: EffectStatus::AwaitingApproval,
                            tool: p
                                .get("tool")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            run_id: event.run_id.clone(),
                            turn_id: event.turn_id.clone(),
                            attempts: 0,
                            irreversible: false,
                            last_attempt_seq: 0,
                            outcome_seq: None,
                            via: None,
                            result: None,
                        });
                    e.status = EffectStatus::AwaitingApproval;
                }
            }
            EventType::HumanReviewRequested => {
                if let Some(e) = key.as_ref().and_then(|k| self.effects.get_mut(k)) {
                    e.status = EffectStatus::AwaitingHuman;
                }
            }
            EventType::HumanReviewResolved => {
                if let Some(e) = key.as_ref().and_then(|k| self.effects.get_mut(k)) {
                    let decision = p
                        .get("decision")
                        .and_then(Value::as_str)
                        .and_then(Outcome::parse);
                    let approval = p.get("decision").and_then(Value::as_str);
                    e.status = match (decision, approval) {
                        (Some(Outcome::Confirmed), _) => EffectStatus::Confirmed,
                        (Some(Outcome::Refused), _) | (_, Some("rejected")) => {
                            EffectStatus::Refused
                        }
                        (_, Some("approved")) => EffectStatus::Approved,
                        _ => e.status,
                    };
                    e.outcome_seq = Some(event.seq);
                    e.via = Some(Via::Human);
                    e.result = (e.status == EffectStatus::Confirmed)
                        .then(|| p.get("result").cloned())
                        .flatten();
                }
            }
            _ => {}
        }
        let Some(run) = self.runs.get_mut(&event.run_id) else {
            return;
        };
        run.last_seq = event.seq;
        run.events += 1;
        let (tokens, cost_units) = usage_of(p);
        let irreversible =
            u64::from(event.event_type == EventType::EffectAttempted && irreversible_of(p));
        for usage in [
            &mut run.usage,
            run.turns.entry(event.turn_id.clone()).or_default(),
        ] {
            usage.steps += 1;
            usage.tokens += tokens;
            usage.cost_units += cost_units;
            usage.irreversible += irreversible;
        }
        episode::apply(run, event);
        match event.event_type {
            EventType::RunCompleted | EventType::RunOutcomeCorrected => {
                run.status = RunStatus::Completed;
                run.outcome = p
                    .get("outcome")
                    .and_then(Value::as_str)
                    .and_then(RunOutcomeKind::parse);
            }
            EventType::GuardrailEvaluated => match p.get("result").and_then(Value::as_str) {
                Some("pass") => run.guardrails_passed += 1,
                Some("block") => run.guardrails_blocked += 1,
                _ => run.guardrails_skipped += 1,
            },
            EventType::EffectAttempted => {
                run.actions += 1;
                if run.intent_window.contains(&event.intent_hash) {
                    run.repeated_actions += 1;
                }
                if run.intent_window.last() == Some(&event.intent_hash) {
                    run.identical_in_a_row += 1;
                } else {
                    run.identical_in_a_row = 1;
                }
                if run.identical_in_a_row == LOOP_THRESHOLD as u64 {
                    run.loops_detected += 1;
                }
                run.intent_window.push(event.intent_hash.clone());
                if run.intent_window.len() > INTENT_WINDOW {
                    run.intent_window.remove(0);
                }
            }
            EventType::EffectOutcomeObserved => match p.get("outcome").and_then(Value::as_str) {
                Some("confirmed") => run.outcomes_confirmed += 1,
                Some("refused") => run.outcomes_refused += 1,
                _ => run.outcomes_unknown += 1,
            },
            EventType::HumanReviewRequested => run.human_reviews_requested += 1,
            EventType::ContextAssembled => {
                let budget = p.get("budget");
                let used = budget
                    .and_then(|b| b.get("used_tokens"))
                    .and_then(Value::as_u64);
                let limit = budget
                    .and_then(|b| b.get("limit_tokens"))
                    .and_then(Value::as_u64)
                    .filter(|l| *l > 0);
                if let (Some(used), Some(limit)) = (used, limit) {
                    let permille = used.saturating_mul(1000) / limit;
                    let bucket = UTILISATION_BUCKETS_PERMILLE
                        .iter()
                        .position(|upper| permille <= *upper)
                        .unwrap_or(UTILISATION_BUCKETS_PERMILLE.len());
                    if let Some(slot) = run.context_utilisation.get_mut(bucket) {
                        *slot += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// The state of the events, folded from nothing.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a LedgerEvent>) -> Self {
        let mut state = LedgerState::default();
        for e in events {
            state.apply(e);
        }
        state
    }

    /// Refuses a write against a head another reducer folded (fail closed).
    pub fn check_reducer(&self) -> Result<(), crate::domain::state::Rejection> {
        if self.reducer.0 == super::REDUCER_VERSION {
            return Ok(());
        }
        Err(crate::domain::state::Rejection::ProjectionDegraded {
            found: self.reducer.0.clone(),
            expected: super::REDUCER_VERSION.to_owned(),
        })
    }

    /// The health of this head, read together with the stored event at its position
    /// (`head_event`: that event's sequence, `None` when it is not stored).
    pub fn projection_health(&self, head_event: Option<u64>) -> ProjectionHealth {
        let mut problems = Vec::new();
        if self.reducer.0 != super::REDUCER_VERSION {
            problems.push(format!(
                "the head was folded by {}, not {}",
                self.reducer.0,
                super::REDUCER_VERSION
            ));
        }
        if head_event != Some(self.last_seq) {
            problems.push(format!(
                "the head summarizes events up to {}, but that event is not stored",
                self.last_seq
            ));
        }
        ProjectionHealth {
            status: if problems.is_empty() {
                "healthy"
            } else {
                "degraded"
            },
            reducer: self.reducer.0.clone(),
            expected_reducer: super::REDUCER_VERSION,
            problems,
        }
    }

    /// Effects with no settled outcome (attempted, unknown or awaiting a person).
    pub fn unresolved_effects(&self) -> impl Iterator<Item = (&String, &EffectRecord)> {
        self.effects
            .iter()
            .filter(|(_, e)| e.status.is_unresolved())
    }
}
