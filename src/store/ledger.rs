//! The run ledger's storage (`spec/002_6a0ddaf11b83bfe4.txt` §3, §5; rules in
//! [`crate::domain::ledger`]).
//!
//! A backend keeps, per binding and epoch, the events (sequence 1, 2, 3... without gaps)
//! and the folded [`LedgerState`] after the last of them (the "head"). An append is one
//! atomic step that checks the fence (epoch and lease generation), looks up the
//! idempotency digest, decides with [`plan`] against the head, and stores the event and
//! the new head together. Both backends decide through the same functions here, so they
//! refuse the same requests with the same codes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Result;
use crate::domain::{
    ledger::{
        AppendPlan, AppendRequest, AppendSignals, EffectRecord, LedgerEvent, LedgerState, RunState,
        event_id, plan_append, replay_or_mismatch,
    },
    state::{Rejection, StateScope, check_key},
};

/// What an append returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerAppend {
    pub event: LedgerEvent,
    /// `true`: an idempotent retry; `event` is the one recorded the first time.
    pub replayed: bool,
    /// What the append changed (default on a replay: it changed nothing).
    #[serde(default)]
    pub signals: AppendSignals,
}

/// The folded state at a sequence number, stored so a reader can start there instead of
/// at the first event (§3.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerSnapshot {
    pub seq: u64,
    pub taken_at_ms: i64,
    pub state: LedgerState,
}

/// A run read (§3.5 state replay): its events after a sequence and its folded state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRead {
    pub run_id: String,
    /// The binding's last sequence number when read.
    pub last_seq: u64,
    /// Events of this run with `seq > after`, in order, at most the page size.
    pub events: Vec<LedgerEvent>,
    /// The run folded by the recorded reducer over all of its events.
    pub state: RunState,
    /// Effects this run attempted, by key.
    pub effects: BTreeMap<String, EffectRecord>,
}

/// What [`LedgerStore::run_snapshot`] read.
#[derive(Clone, Debug)]
pub struct RunSnapshot {
    pub state: LedgerState,
    pub events: Vec<LedgerEvent>,
    /// The events page was full before the cut at the head (more may follow).
    pub full_page: bool,
    pub head_event: Option<u64>,
}

impl RunSnapshot {
    /// The head's projection health.
    pub fn health(&self) -> crate::domain::ledger::ProjectionHealth {
        self.state.projection_health(self.head_event)
    }
}

/// `harness_ledger`: events, heads and snapshots per binding and epoch.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Appends one event: fenced, optionally on the expected last sequence, idempotent
    /// by digest, decided by [`plan`].
    async fn append_event(
        &self,
        scope: &StateScope,
        request: &AppendRequest,
    ) -> Result<LedgerAppend>;
    /// Events of the scope's epoch with `seq > after_seq` (only `run_id`'s when given), in
    /// order, at most `limit` (capped at the page bound).
    async fn ledger_events(
        &self,
        scope: &StateScope,
        run_id: Option<&str>,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<LedgerEvent>>;
    /// The folded state after the last event of the scope's epoch.
    async fn ledger_state(&self, scope: &StateScope) -> Result<LedgerState>;
    /// Stores the current head as a snapshot (idempotent per sequence); returns it.
    async fn snapshot_ledger(&self, scope: &StateScope) -> Result<LedgerSnapshot>;
    /// The latest snapshot of the scope's epoch.
    async fn ledger_snapshot(&self, scope: &StateScope) -> Result<Option<LedgerSnapshot>>;

    /// One consistent read of a run (spec 003 "get_run"): the folded head, the run's
    /// events after `after_seq` (at most `limit`; none past the head), and the sequence of
    /// the stored event at the head's position (`None`: the head names an event that is
    /// not stored; always `Some(0)` for an empty ledger). The default reads the head
    /// first and cuts the events at it, which is a snapshot because events are immutable
    /// and gapless; a backend with read transactions reads all of it in one.
    async fn run_snapshot(
        &self,
        scope: &StateScope,
        run_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<RunSnapshot> {
        let state = self.ledger_state(scope).await?;
        let mut events = self
            .ledger_events(scope, Some(run_id), after_seq, limit)
            .await?;
        let full_page = events.len() >= limit;
        events.retain(|e| e.seq <= state.last_seq);
        let head_event = if state.last_seq == 0 {
            Some(0)
        } else {
            self.ledger_events(scope, None, state.last_seq - 1, 1)
                .await?
                .first()
                .map(|e| e.seq)
                .filter(|seq| *seq == state.last_seq)
        };
        Ok(RunSnapshot {
            state,
            events,
            full_page,
            head_event,
        })
    }

    /// Rebuilds the scope's head from its events with this server's reducer (the repair
    /// of degraded projections); the events are not touched. Returns the new head.
    async fn repair_ledger(&self, scope: &StateScope) -> Result<LedgerState>;

    /// A run's events after `after_seq` and its folded state.
    async fn read_run(
        &self,
        scope: &StateScope,
        run_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<RunRead> {
        let state = self.ledger_state(scope).await?;
        let Some(run) = state.runs.get(run_id).cloned() else {
            return Err(Rejection::NotFound(format!("run {run_id}")).into());
        };
        let events = self
            .ledger_events(scope, Some(run_id), after_seq, limit)
            .await?;
        let effects = state
            .effects
            .iter()
            .filter(|(_, e)| e.run_id == run_id)
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        Ok(RunRead {
            run_id: run_id.to_owned(),
            last_seq: state.last_seq,
            events,
            state: run,
            effects,
        })
    }
}

/// Input checks made before touching storage.
pub(crate) fn check(request: &AppendRequest, max_key_bytes: usize) -> Result<()> {
    if let Some(digest) = &request.idempotency {
        check_key("idempotency digest", digest, max_key_bytes)?;
    }
    request.event.check()?;
    Ok(())
}

/// The decision of an append against the stored head: a new event (and head), or the
/// original event of an idempotent retry. `original` is the event already stored under
/// the request's idempotency digest, if any.
pub(crate) enum Decision {
    Append(Box<AppendPlan>),
    Replay(Box<LedgerEvent>),
}

pub(crate) fn plan(
    head: &LedgerState,
    original: Option<LedgerEvent>,
    request: &AppendRequest,
    binding_id: &str,
    epoch: u64,
    now_ms: i64,
) -> std::result::Result<Decision, Rejection> {
    if let Some(original) = original {
        return replay_or_mismatch(original, &request.event).map(|e| Decision::Replay(Box::new(e)));
    }
    let id = event_id(now_ms, rand::random::<u128>());
    plan_append(head, request, binding_id, epoch, id, now_ms).map(|p| Decision::Append(Box::new(p)))
}

/// A stored JSON document that does not parse is corruption, not a request error.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    json: &str,
) -> std::result::Result<T, String> {
    serde_json::from_str(json).map_err(|e| format!("{what}: {e}"))
}
