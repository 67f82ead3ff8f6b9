//! Leased coordination signals (`spec/003_bab976795353d872.txt` "claim_signal",
//! "extend_signal_lease", "ack_signal"; the blackboard claims of
//! `spec/002_6a0ddaf11b83bfe4.txt` §7), kept in the workspace's ledger.
//!
//! A signal is claimed by at most one holder at a time, for a lease. A claim of a free,
//! expired or acknowledged signal takes it with a fencing token one above the last, so
//! tokens only move up and a stale holder's token never matches again. Extending and
//! acknowledging need the current token and an unexpired lease. The rules are decided
//! against the folded state at the server's clock in the same atomic step as the
//! workspace's fence, like every ledger append; the lease's expiry is recorded in the
//! state from the event's server time, so replay folds to the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{EventType, LedgerEvent, NewEvent};
use crate::domain::state::Rejection;

/// Shortest and longest lease.
pub const MIN_LEASE_MS: u64 = 1_000;
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// The run id signal events are recorded under: signals belong to the workspace, not to
/// a run.
pub const SIGNAL_RUN: &str = "signals";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalState {
    Held,
    Acked,
}

/// One signal of a workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRecord {
    pub holder: String,
    pub fencing_token: u64,
    pub state: SignalState,
    pub lease_expires_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_at_ms: Option<i64>,
    /// The event that last changed it.
    pub seq: u64,
}

impl SignalRecord {
    /// Held by someone whose lease has not run out at `now_ms`.
    pub fn held_at(&self, now_ms: i64) -> bool {
        self.state == SignalState::Held && self.lease_expires_at_ms > now_ms
    }
}

fn text<'a>(p: &'a Value, k: &str) -> &'a str {
    p.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn number(p: &Value, k: &str) -> u64 {
    p.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn conflict(what: String) -> Rejection {
    Rejection::Conflict { what }
}

/// Whether `new` (a signal event) may be appended now.
pub fn admit(
    signals: &BTreeMap<String, SignalRecord>,
    new: &NewEvent,
    now_ms: i64,
) -> Result<(), Rejection> {
    let p = &new.payload;
    let id = text(p, "signal_id");
    let current = signals.get(id);
    match new.event_type {
        EventType::SignalClaimed => match current {
            Some(s) if s.held_at(now_ms) => Err(conflict(format!(
                "signal {id} is held by {} (fencing token {}) until {}; claim it after the lease expires",
                s.holder, s.fencing_token, s.lease_expires_at_ms
            ))),
            _ => Ok(()),
        },
        EventType::SignalLeaseExtended | EventType::SignalAcked => {
            let token = number(p, "fencing_token");
            let Some(s) = current else {
                return Err(Rejection::NotFound(format!("signal {id}")));
            };
            if s.fencing_token != token {
                return Err(conflict(format!(
                    "fencing token {token} is not signal {id}'s current one ({}): another holder took it over",
                    s.fencing_token
                )));
            }
            if new.event_type == EventType::SignalAcked && s.state == SignalState::Acked {
                return Err(conflict(format!("signal {id} is already acknowledged")));
            }
            if !s.held_at(now_ms) {
                return Err(conflict(format!(
                    "the lease of signal {id} (fencing token {token}) expired at {}; claim it again",
                    s.lease_expires_at_ms
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Folds an admitted signal event.
pub fn apply(signals: &mut BTreeMap<String, SignalRecord>, event: &LedgerEvent) {
    let p = &event.payload;
    let id = text(p, "signal_id").to_owned();
    let lease = |ms: u64| {
        event
            .recorded_at_ms
            .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
    };
    match event.event_type {
        EventType::SignalClaimed => {
            let token = signals.get(&id).map_or(0, |s| s.fencing_token) + 1;
            signals.insert(
                id,
                SignalRecord {
                    holder: text(p, "holder").to_owned(),
                    fencing_token: token,
                    state: SignalState::Held,
                    lease_expires_at_ms: lease(number(p, "lease_ms")),
                    acked_at_ms: None,
                    seq: event.seq,
                },
            );
        }
        EventType::SignalLeaseExtended => {
            if let Some(s) = signals.get_mut(&id) {
                s.lease_expires_at_ms = lease(number(p, "lease_ms"));
                s.seq = event.seq;
            }
        }
        EventType::SignalAcked => {
            if let Some(s) = signals.get_mut(&id) {
                s.state = SignalState::Acked;
                s.acked_at_ms = Some(event.recorded_at_ms);
                s.seq = event.seq;
            }
        }
        _ => {}
    }
}
