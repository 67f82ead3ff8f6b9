//! The run ledger on SQLite: one writer transaction per append checks the fence, looks up
//! the idempotency digest, decides against the folded head and writes the event and moves
//! the head (see [`crate::store::ledger`]). The head's folded state is checkpointed every
//! [`HEAD_CHECKPOINT_EVERY`] appends; a read folds the events after the checkpoint, and
//! the writer keeps decoded heads between appends ([`HeadCache`]).

use rusqlite::{Connection, OptionalExtension, params};

use super::{ScopeKey, SqlContext, admit, corrupt, get_u64, sql_int, touch};
use crate::{
    domain::ledger::{AppendPlan, AppendRequest, LedgerEvent, LedgerState},
    store::{
        Result,
        ledger::{Decision, LedgerAppend, LedgerSnapshot, RunSnapshot, decode, plan},
    },
};

/// Schema version 3: the run ledger. Applied on top of version 2.
pub(super) const SCHEMA_V3: &str = r"
CREATE TABLE harness_ledger_heads (
    binding_id    TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch         INTEGER NOT NULL,
    last_seq      INTEGER NOT NULL CHECK (last_seq >= 0),
    updated_at_ms INTEGER NOT NULL,
    state_json    TEXT    NOT NULL,
    PRIMARY KEY (binding_id, epoch)
) STRICT, WITHOUT ROWID;

CREATE TABLE harness_ledger_events (
    binding_id         TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch              INTEGER NOT NULL,
    seq                INTEGER NOT NULL CHECK (seq >= 1),
    run_id             TEXT    NOT NULL,
    idempotency_digest TEXT,
    event_json         TEXT    NOT NULL,
    PRIMARY KEY (binding_id, epoch, seq)
) STRICT;
-- Idempotent appends: one event per digest per binding and epoch.
CREATE UNIQUE INDEX harness_ledger_events_idempotency
    ON harness_ledger_events (binding_id, epoch, idempotency_digest)
    WHERE idempotency_digest IS NOT NULL;
-- Run reads.
CREATE INDEX harness_ledger_events_run ON harness_ledger_events (binding_id, epoch, run_id, seq);

CREATE TABLE harness_ledger_snapshots (
    binding_id  TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch       INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    taken_at_ms INTEGER NOT NULL,
    state_json  TEXT    NOT NULL,
    PRIMARY KEY (binding_id, epoch, seq)
) STRICT;
";

/// Decoded ledger heads the writer keeps between appends, so an append does not parse
/// the head it wrote a moment ago. An entry is used only while the stored head still has
/// the sequence and time it was cached with: a group commit that rolled back, a clear or
/// a deleted binding leaves the stored head different, and the head is read again.
#[derive(Default)]
pub(super) struct HeadCache {
    heads: std::sync::Mutex<std::collections::HashMap<(String, i64), CachedHead>>,
}

struct CachedHead {
    last_seq: i64,
    updated_at_ms: i64,
    state: LedgerState,
}

/// Entries kept at most; past it the cache starts again (the heads stay in the table).
const HEAD_CACHE_ENTRIES: usize = 4096;

impl HeadCache {
    fn take(&self, id: &str, epoch: i64, last_seq: i64, updated_at_ms: i64) -> Option<LedgerState> {
        let mut heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        let cached = heads.remove(&(id.to_owned(), epoch))?;
        (cached.last_seq == last_seq && cached.updated_at_ms == updated_at_ms)
            .then_some(cached.state)
    }

    fn put(&self, id: &str, epoch: i64, last_seq: i64, updated_at_ms: i64, state: LedgerState) {
        let mut heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        if heads.len() >= HEAD_CACHE_ENTRIES {
            heads.clear();
        }
        heads.insert(
            (id.to_owned(), epoch),
            CachedHead {
                last_seq,
                updated_at_ms,
                state,
            },
        );
    }
}

/// The head for an append: the cached one when the stored head is still the one it
/// was cached as, else the stored one decoded.
fn head_for_append(
    conn: &Connection,
    cache: &HeadCache,
    id: &str,
    epoch: i64,
) -> Result<LedgerState> {
    let stamp: Option<(i64, i64)> = conn
        .prepare_cached(
            "SELECT last_seq, updated_at_ms FROM harness_ledger_heads WHERE binding_id = ?1 AND epoch = ?2",
        )
        .ctx("preparing the ledger head stamp read")?
        .query_row(params![id, epoch], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .ctx("reading the ledger head stamp")?;
    match stamp {
        None => Ok(LedgerState::default()),
        Some((seq, at)) => match cache.take(id, epoch, seq, at) {
            Some(state) => Ok(state),
            None => head(conn, id, epoch),
        },
    }
}

/// The head's folded state is written every this many appends (and on the first):
/// `state_json` holds the state at its own `last_seq`, and a reader folds the few
/// events after it. The row's `last_seq` moves with every append.
const HEAD_CHECKPOINT_EVERY: u64 = 32;

/// The folded state after the last event: the stored checkpoint and the events after
/// it, in the same read.
fn head(conn: &Connection, id: &str, epoch: i64) -> Result<LedgerState> {
    let row: Option<(u64, String)> = conn
        .prepare_cached(
            "SELECT last_seq, state_json FROM harness_ledger_heads WHERE binding_id = ?1 AND epoch = ?2",
        )
        .ctx("preparing the ledger head read")?
        .query_row(params![id, epoch], |r| Ok((get_u64(r, 0)?, r.get(1)?)))
        .optional()
        .ctx("reading the ledger head")?;
    let Some((last_seq, json)) = row else {
        return Ok(LedgerState::default());
    };
    let mut state: LedgerState =
        decode("ledger head", &json).map_err(|e| corrupt("ledger head", e))?;
    if state.last_seq < last_seq {
        let mut statement = conn
            .prepare_cached(
                "SELECT event_json FROM harness_ledger_events \
                 WHERE binding_id = ?1 AND epoch = ?2 AND seq > ?3 AND seq <= ?4 ORDER BY seq",
            )
            .ctx("preparing the ledger tail read")?;
        let rows = statement
            .query_map(
                params![
                    id,
                    epoch,
                    sql_int("sequence", state.last_seq)?,
                    sql_int("sequence", last_seq)?
                ],
                |r| r.get::<_, String>(0),
            )
            .ctx("reading the ledger tail")?;
        for json in rows {
            let event = event_of(&json.ctx("reading a ledger tail event")?)?;
            state.apply(&event);
        }
    }
    if state.last_seq != last_seq {
        return Err(corrupt(
            "ledger head",
            format!(
                "folded to sequence {} but the head is at {last_seq}",
                state.last_seq
            ),
        ));
    }
    Ok(state)
}

/// Writes the head row with its folded state as a checkpoint at `seq`.
fn write_head(
    conn: &Connection,
    id: &str,
    epoch: i64,
    seq: i64,
    now: i64,
    state: &LedgerState,
) -> Result<()> {
    let state_json = serde_json::to_string(state).map_err(|e| corrupt("ledger head", e))?;
    conn.prepare_cached(
        "INSERT INTO harness_ledger_heads (binding_id, epoch, last_seq, updated_at_ms, state_json) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (binding_id, epoch) DO UPDATE SET \
         last_seq = excluded.last_seq, updated_at_ms = excluded.updated_at_ms, \
         state_json = excluded.state_json",
    )
    .ctx("preparing the ledger head write")?
    .execute(params![id, epoch, seq, now, state_json])
    .ctx("writing the ledger head")?;
    Ok(())
}

fn event_of(json: &str) -> Result<LedgerEvent> {
    decode("ledger event", json).map_err(|e| corrupt("ledger event", e))
}

pub(super) fn append(
    conn: &Connection,
    cache: &HeadCache,
    scope: &ScopeKey,
    request: &AppendRequest,
    now: i64,
) -> Result<LedgerAppend> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let original = match &request.idempotency {
        None => None,
        Some(digest) => conn
            .prepare_cached(
                "SELECT event_json FROM harness_ledger_events \
                 WHERE binding_id = ?1 AND epoch = ?2 AND idempotency_digest = ?3",
            )
            .ctx("preparing the ledger idempotency lookup")?
            .query_row(params![id, epoch, digest], |r| r.get::<_, String>(0))
            .optional()
            .ctx("looking up the ledger idempotency key")?
            .map(|json| event_of(&json))
            .transpose()?,
    };
    let state = head_for_append(conn, cache, id, epoch)?;
    match plan(&state, original, request, id, scope.epoch, now)? {
        Decision::Replay(event) => Ok(LedgerAppend {
            event: *event,
            replayed: true,
            signals: Default::default(),
        }),
        Decision::Append(planned) => {
            let AppendPlan {
                event,
                state,
                signals,
            } = *planned;
            let event_json =
                serde_json::to_string(&event).map_err(|e| corrupt("ledger event", e))?;
            let seq = sql_int("sequence", event.seq)?;
            conn.prepare_cached(
                "INSERT INTO harness_ledger_events \
                 (binding_id, epoch, seq, run_id, idempotency_digest, event_json) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .ctx("preparing the ledger append")?
            .execute(params![
                id,
                epoch,
                seq,
                event.run_id,
                request.idempotency,
                event_json
            ])
            .ctx("appending the ledger event")?;
            // Between checkpoints only the head's sequence and time move (the event is
            // already stored; a reader folds it onto the last checkpoint).
            let moved = if event.seq == 1 || event.seq % HEAD_CHECKPOINT_EVERY == 0 {
                0
            } else {
                conn.prepare_cached(
                    "UPDATE harness_ledger_heads SET last_seq = ?3, updated_at_ms = ?4 \
                     WHERE binding_id = ?1 AND epoch = ?2 AND last_seq = ?3 - 1",
                )
                .ctx("preparing the ledger head move")?
                .execute(params![id, epoch, seq, now])
                .ctx("moving the ledger head")?
            };
            if moved == 0 {
                write_head(conn, id, epoch, seq, now, &state)?;
            }
            touch(conn, id, now)?;
            cache.put(id, epoch, seq, now, state);
            Ok(LedgerAppend {
                event,
                replayed: false,
                signals,
            })
        }
    }
}

pub(super) fn events(
    conn: &Connection,
    scope: &ScopeKey,
    run_id: Option<&str>,
    after: u64,
    limit: i64,
) -> Result<Vec<LedgerEvent>> {
    let epoch = admit(conn, scope)?;
    let after = sql_int("after sequence", after)?;
    let rows: Vec<String> = match run_id {
        Some(run) => conn
            .prepare_cached(
                "SELECT event_json FROM harness_ledger_events \
                 WHERE binding_id = ?1 AND epoch = ?2 AND run_id = ?3 AND seq > ?4 \
                 ORDER BY seq LIMIT ?5",
            )
            .ctx("preparing the run read")?
            .query_map(params![scope.id(), epoch, run, after, limit], |r| r.get(0))
            .ctx("reading run events")?
            .collect::<rusqlite::Result<_>>()
            .ctx("reading run events")?,
        None => conn
            .prepare_cached(
                "SELECT event_json FROM harness_ledger_events \
                 WHERE binding_id = ?1 AND epoch = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4",
            )
            .ctx("preparing the ledger read")?
            .query_map(params![scope.id(), epoch, after, limit], |r| r.get(0))
            .ctx("reading ledger events")?
            .collect::<rusqlite::Result<_>>()
            .ctx("reading ledger events")?,
    };
    rows.iter().map(|j| event_of(j)).collect()
}

/// [`crate::store::ledger::LedgerStore::run_snapshot`] in one read transaction.
pub(super) fn run_snapshot(
    conn: &Connection,
    scope: &ScopeKey,
    run_id: &str,
    after: u64,
    limit: i64,
) -> Result<RunSnapshot> {
    let state = state(conn, scope)?;
    let mut page = events(conn, scope, Some(run_id), after, limit)?;
    let full_page = i64::try_from(page.len()).unwrap_or(i64::MAX) >= limit;
    page.retain(|e| e.seq <= state.last_seq);
    let head_event = if state.last_seq == 0 {
        Some(0)
    } else {
        events(conn, scope, None, state.last_seq - 1, 1)?
            .first()
            .map(|e| e.seq)
            .filter(|seq| *seq == state.last_seq)
    };
    Ok(RunSnapshot {
        state,
        events: page,
        full_page,
        head_event,
    })
}

/// Rebuilds the head of the scope's epoch from all its events with this server's
/// reducer, in the writer's transaction (nothing appends meanwhile).
pub(super) fn repair(
    conn: &Connection,
    cache: &HeadCache,
    scope: &ScopeKey,
    now: i64,
) -> Result<LedgerState> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let mut state = LedgerState::default();
    {
        let mut statement = conn
            .prepare_cached(
                "SELECT event_json FROM harness_ledger_events \
                 WHERE binding_id = ?1 AND epoch = ?2 ORDER BY seq",
            )
            .ctx("preparing the ledger replay")?;
        let rows = statement
            .query_map(params![id, epoch], |r| r.get::<_, String>(0))
            .ctx("reading the ledger for a repair")?;
        for json in rows {
            state.apply(&event_of(&json.ctx("reading a ledger event")?)?);
        }
    }
    if state.last_seq == 0 {
        return Ok(state);
    }
    let seq = sql_int("sequence", state.last_seq)?;
    write_head(conn, id, epoch, seq, now, &state)?;
    cache.put(id, epoch, seq, now, state.clone());
    Ok(state)
}

pub(super) fn state(conn: &Connection, scope: &ScopeKey) -> Result<LedgerState> {
    let epoch = admit(conn, scope)?;
    head(conn, scope.id(), epoch)
}

pub(super) fn snapshot(conn: &Connection, scope: &ScopeKey, now: i64) -> Result<LedgerSnapshot> {
    let epoch = admit(conn, scope)?;
    let state = head(conn, scope.id(), epoch)?;
    let json = serde_json::to_string(&state).map_err(|e| corrupt("ledger head", e))?;
    conn.prepare_cached(
        "INSERT INTO harness_ledger_snapshots (binding_id, epoch, seq, taken_at_ms, state_json) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )
    .ctx("preparing the snapshot write")?
    .execute(params![
        scope.id(),
        epoch,
        sql_int("sequence", state.last_seq)?,
        now,
        json
    ])
    .ctx("writing the snapshot")?;
    latest_snapshot(conn, scope.id(), epoch)?
        .ok_or_else(|| corrupt("ledger snapshot", "missing after its write"))
}

fn latest_snapshot(conn: &Connection, id: &str, epoch: i64) -> Result<Option<LedgerSnapshot>> {
    let row = conn
        .prepare_cached(
            "SELECT seq, taken_at_ms, state_json FROM harness_ledger_snapshots \
             WHERE binding_id = ?1 AND epoch = ?2 ORDER BY seq DESC LIMIT 1",
        )
        .ctx("preparing the snapshot read")?
        .query_row(params![id, epoch], |r| {
            Ok((get_u64(r, 0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })
        .optional()
        .ctx("reading the snapshot")?;
    row.map(|(seq, taken_at_ms, json)| {
        Ok(LedgerSnapshot {
            seq,
            taken_at_ms,
            state: decode("ledger snapshot", &json).map_err(|e| corrupt("ledger snapshot", e))?,
        })
    })
    .transpose()
}

pub(super) fn snapshot_of(conn: &Connection, scope: &ScopeKey) -> Result<Option<LedgerSnapshot>> {
    let epoch = admit(conn, scope)?;
    latest_snapshot(conn, scope.id(), epoch)
}
