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
mod fold;
mod payload;

pub use envelope::{
    EventType, LedgerEvent, NewEvent, Versions, canonical_json, event_id, intent_hash,
    request_digest,
};
pub use fold::{
    Budget, Budgets, EffectRecord, EffectStatus, LedgerState, RunState, RunStatus, TurnUsage,
    UTILISATION_BUCKETS_PERMILLE,
};
pub use payload::{
    MAX_PAYLOAD_BYTES, Outcome, RunOutcomeKind, Via, forbidden_field, validate_payload,
};

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
}

/// The decided append: the event to store and the state after it.
#[derive(Clone, Debug, PartialEq)]
pub struct AppendPlan {
    pub event: LedgerEvent,
    pub state: LedgerState,
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
    validate_payload(new.event_type, &new.payload)?;
    if let Some(expected) = request.expected_last_seq
        && expected != state.last_seq
    {
        return Err(Rejection::SequenceConflict {
            expected,
            actual: state.last_seq,
        });
    }
    state.admit(new, &request.budgets)?;
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
    Ok(AppendPlan { event, state: next })
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
