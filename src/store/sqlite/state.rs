//! The commit protocol (`spec/000_fa938a4e6ac75730.txt`, "Commit protocol"): pending
//! native state, the durable head, uncertain runs, and pending interrupts
//! (`spec/001_78d7ff78f70a2a2a.txt` §4, §6).

use rusqlite::{Connection, OptionalExtension, params};

use super::{
    ScopeKey, SqlContext, SqliteError, admit, corrupt, get_opt_u64, get_u64, not_found_binding,
    sql_int, touch,
};
use crate::{
    domain::{
        ids::IdempotencyDigest,
        state::{
            CommitRequest, Durability, DurableStateHead, PendingInterrupt, PendingStateRef,
            Rejection, ResumeOutcome, ResumeRequest, RunTerminal, StateScope, UncertainRun,
            pending_state_id,
        },
    },
    store::{
        Result,
        commit::{CommitPlan, HeadView, plan_commit, stamp_interrupt},
    },
};

/// A pending write, prepared (hashed, bounded) outside the writer.
pub(super) struct NativeWrite {
    pub content_digest: String,
    pub payload: Vec<u8>,
    pub idempotency: IdempotencyDigest,
    pub max_pending: u64,
}

pub(super) fn write_native_state(
    conn: &Connection,
    scope: &ScopeKey,
    write: NativeWrite,
    now: i64,
) -> Result<PendingStateRef> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    // The state id is cut from the idempotency digest, so the primary key finds the row a
    // key made (schema 6 has no second index on the digest: one index page fewer to
    // write per binding in every group commit).
    let state_id = pending_state_id(&write.idempotency);
    let existing = conn
        .prepare_cached(
            "SELECT epoch, idempotency_digest, codec, size, content_digest FROM harness_session_state \
             WHERE binding_id = ?1 AND state_id = ?2",
        )
        .ctx("preparing the idempotency lookup")?
        .query_row(params![id, state_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                get_u64(r, 3)?,
                r.get::<_, String>(4)?,
            ))
        })
        .optional()
        .ctx("looking up the idempotency key")?;
    if let Some((row_epoch, row_key, codec, size, content_digest)) = existing {
        if row_epoch == epoch {
            if row_key != write.idempotency.as_str() {
                // Two digests sharing the 128-bit prefix the state id is cut from.
                return Err(Rejection::Conflict {
                    what: format!("state id {state_id} is taken by another idempotency key"),
                }
                .into());
            }
            // A retry: the same key must carry the same payload (and codec).
            if content_digest == write.content_digest && codec == scope.codec {
                return Ok(PendingStateRef {
                    state_id,
                    epoch: scope.epoch,
                    codec,
                    size,
                    content_digest,
                });
            }
            return Err(Rejection::IdempotencyMismatch.into());
        }
        // A row of an older epoch that a clear has not purged yet: it can never be read
        // or committed again, so it does not hold the id against the new epoch.
        conn.prepare_cached("DELETE FROM harness_session_state WHERE binding_id = ?1 AND state_id = ?2 AND epoch < ?3")
            .ctx("preparing the stale-key delete")?
            .execute(params![id, state_id, epoch])
            .ctx("dropping a cleared epoch's state")?;
    }
    let pending: u64 = conn
        .prepare_cached("SELECT count(*) FROM harness_session_state WHERE binding_id = ?1 AND epoch = ?2 AND committed = 0")
        .ctx("preparing the pending count")?
        .query_row(params![id, epoch], |r| get_u64(r, 0))
        .ctx("counting pending entries")?;
    if pending >= write.max_pending {
        return Err(Rejection::TooMany {
            what: "pending state entries",
            limit: write.max_pending,
        }
        .into());
    }
    let size = super::count(write.payload.len());
    let inserted = conn
        .prepare_cached(
            "INSERT INTO harness_session_state (binding_id, epoch, state_id, idempotency_digest, codec, size, \
             content_digest, created_at_ms, committed, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9)",
        )
        .ctx("preparing the state insert")?
        .execute(params![
            id,
            epoch,
            state_id,
            write.idempotency.as_str(),
            scope.codec,
            sql_int("size", size)?,
            write.content_digest,
            now,
            write.payload,
        ]);
    match inserted {
        Ok(_) => {}
        // The lookup above found no row of this id and the writer is the only one, so
        // this is not expected; should it happen, it is a refusal, not a backend error.
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => {
            return Err(Rejection::Conflict {
                what: format!("state id {state_id} is taken by another idempotency key"),
            }
            .into());
        }
        Err(e) => return Err(e).ctx("storing native state"),
    }
    touch(conn, id, now)?;
    Ok(PendingStateRef {
        state_id,
        epoch: scope.epoch,
        codec: scope.codec.clone(),
        size,
        content_digest: write.content_digest,
    })
}

pub(super) fn read_state(
    conn: &Connection,
    scope: &ScopeKey,
    state_id: &str,
) -> Result<Option<Vec<u8>>> {
    let epoch = admit(conn, scope)?;
    let row = conn
        .prepare_cached("SELECT codec, body FROM harness_session_state WHERE binding_id = ?1 AND state_id = ?2 AND epoch = ?3")
        .ctx("preparing the state read")?
        .query_row(params![scope.id(), state_id, epoch], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)))
        .optional()
        .ctx("reading native state")?;
    match row {
        None => Ok(None),
        Some((codec, body)) => {
            check_codec(scope, &codec)?;
            Ok(Some(body))
        }
    }
}

/// Native payloads are opaque and versioned: a scope reads and commits only state of its
/// own adapter codec (`spec/000_fa938a4e6ac75730.txt`, "Thread-state invariants").
fn check_codec(scope: &ScopeKey, stored: &str) -> Result<()> {
    if stored == scope.codec || scope.codec == crate::domain::state::ANY_CODEC {
        return Ok(());
    }
    Err(Rejection::Forbidden(format!(
        "state was written with codec {stored}; this scope reads {}",
        scope.codec
    ))
    .into())
}

/// The head columns of `harness_sessions`, as stored.
struct HeadRow {
    revision: u64,
    state_id: Option<String>,
    codec: Option<String>,
    digest: Option<String>,
    size: Option<u64>,
    run_id: Option<String>,
    committed_at_ms: Option<i64>,
    lease_generation: Option<u64>,
    terminal_json: Option<String>,
    interrupt_json: Option<String>,
}

/// The head columns in the order `read_head_row` selects them.
fn head_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<HeadRow> {
    Ok(HeadRow {
        revision: get_u64(r, 0)?,
        state_id: r.get(1)?,
        codec: r.get(2)?,
        digest: r.get(3)?,
        size: get_opt_u64(r, 4)?,
        run_id: r.get(5)?,
        committed_at_ms: r.get(6)?,
        lease_generation: get_opt_u64(r, 7)?,
        terminal_json: r.get(8)?,
        interrupt_json: r.get(9)?,
    })
}

/// Decodes stored head columns (`durable_revision` through `interrupt_json`) for a scope
/// of `scope`: any stored values give a head, no head, or an error. For the fuzz targets.
pub fn decode_head_row(
    row: &rusqlite::Row<'_>,
    scope: &StateScope,
) -> Result<Option<DurableStateHead>> {
    let head = head_row(row).map_err(|e| corrupt("durable head", e))?;
    head_from_row(&ScopeKey::of(scope), head, Vec::new())
}

fn read_head_row(conn: &Connection, id: &str) -> Result<HeadRow> {
    conn.prepare_cached(
        "SELECT durable_revision, head_state_id, head_codec, head_digest, head_size, head_run_id, committed_at_ms, \
         head_lease_generation, terminal_json, interrupt_json FROM harness_sessions WHERE id = ?1",
    )
    .ctx("preparing the head read")?
    .query_row([id], head_row)
    .optional()
    .ctx("reading the head")?
    .ok_or_else(|| not_found_binding(id))
}

fn parse_interrupt(json: Option<&str>) -> Result<Option<PendingInterrupt>> {
    json.map(|j| serde_json::from_str(j).map_err(|e| corrupt("pending interrupt", e)))
        .transpose()
}

/// Builds the head from its row; `None` while nothing is committed (revision 0).
fn head_from_row(
    scope: &ScopeKey,
    row: HeadRow,
    uncertain_runs: Vec<UncertainRun>,
) -> Result<Option<DurableStateHead>> {
    if row.revision == 0 {
        return Ok(None);
    }
    let HeadRow {
        revision,
        state_id,
        codec,
        digest,
        size,
        run_id,
        committed_at_ms,
        lease_generation,
        terminal_json,
        interrupt_json,
    } = row;
    let missing = move || {
        corrupt(
            "durable head",
            format!("revision {revision} has unset head columns"),
        )
    };
    let codec = codec.ok_or_else(missing)?;
    check_codec(scope, &codec)?;
    let terminal = terminal_json
        .as_deref()
        .map(|j| serde_json::from_str::<RunTerminal>(j).map_err(|e| corrupt("run terminal", e)))
        .transpose()?;
    Ok(Some(DurableStateHead {
        binding_id: scope.binding.clone(),
        epoch: scope.epoch,
        revision,
        state_id: state_id.ok_or_else(missing)?,
        codec,
        content_digest: digest.ok_or_else(missing)?,
        size: size.ok_or_else(missing)?,
        run_id: run_id.ok_or_else(missing)?,
        committed_at_ms: committed_at_ms.ok_or_else(missing)?,
        lease_generation: lease_generation.ok_or_else(missing)?,
        terminal,
        interrupt: parse_interrupt(interrupt_json.as_deref())?,
        durability: if uncertain_runs.is_empty() {
            Durability::Committed
        } else {
            Durability::Uncertain
        },
        uncertain_runs,
    }))
}

pub(super) fn load_head(conn: &Connection, scope: &ScopeKey) -> Result<Option<DurableStateHead>> {
    let epoch = admit(conn, scope)?;
    let row = read_head_row(conn, scope.id())?;
    if row.revision == 0 {
        return Ok(None);
    }
    let runs = uncertain_runs(conn, scope.id(), epoch)?;
    head_from_row(scope, row, runs)
}

pub(super) fn uncertain_runs(conn: &Connection, id: &str, epoch: i64) -> Result<Vec<UncertainRun>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT run_id, reason, marked_at_ms FROM harness_uncertain_runs \
             WHERE binding_id = ?1 AND epoch = ?2 ORDER BY marked_at_ms, run_id",
        )
        .ctx("preparing the uncertain-run listing")?;
    let rows = stmt
        .query_map(params![id, epoch], |r| {
            Ok(UncertainRun {
                run_id: r.get(0)?,
                reason: r.get(1)?,
                marked_at_ms: r.get(2)?,
            })
        })
        .ctx("listing uncertain runs")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading uncertain runs")
}

/// A commit, with what could be prepared outside the writer.
pub(super) struct Commit {
    pub request: CommitRequest,
    pub terminal_json: Option<String>,
    pub max_interrupt_bytes: usize,
}

pub(super) fn commit_head(
    conn: &Connection,
    scope: &ScopeKey,
    commit: Commit,
    now: i64,
) -> Result<DurableStateHead> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let request = &commit.request;
    // Only state of this binding and epoch can become its head: state of a cleared
    // epoch never can (`spec/000_fa938a4e6ac75730.txt`: "old state cannot become the new
    // epoch's head").
    let (codec, size, content_digest, committed) = conn
        .prepare_cached("SELECT codec, size, content_digest, committed FROM harness_session_state WHERE binding_id = ?1 AND state_id = ?2 AND epoch = ?3")
        .ctx("preparing the state lookup")?
        .query_row(params![id, request.state_id, epoch], |r| Ok((r.get::<_, String>(0)?, get_u64(r, 1)?, r.get::<_, String>(2)?, r.get::<_, bool>(3)?)))
        .optional()
        .ctx("looking up the state to commit")?
        .ok_or_else(|| Rejection::NotFound(format!("state {} in epoch {}", request.state_id, scope.epoch)))?;
    check_codec(scope, &codec)?;

    let uncertain = conn
        .prepare_cached("SELECT 1 FROM harness_uncertain_runs WHERE binding_id = ?1 AND epoch = ?2 AND run_id = ?3")
        .ctx("preparing the uncertain-run check")?
        .exists(params![id, epoch, request.run_id])
        .ctx("checking for an uncertain run")?;
    let head = read_head_row(conn, id)?;
    let view = HeadView {
        revision: head.revision,
        state_id: head.state_id.as_deref(),
        run_id: head.run_id.as_deref(),
    };
    let next = match plan_commit(view, request, uncertain)? {
        CommitPlan::Retry => {
            // A retry of the commit that produced this head (its reply was lost).
            let runs = uncertain_runs(conn, id, epoch)?;
            return head_from_row(scope, head, runs)?
                .ok_or_else(|| corrupt("durable head", "revision above 0 without a head"));
        }
        // A state becomes a head once: the trait's contract (`commit_head`) is that it
        // must still be pending, as on MongoDB, where a commit consumes the pending entry.
        CommitPlan::Commit { .. } if committed => {
            return Err(Rejection::NotFound(format!(
                "pending state {} in epoch {}",
                request.state_id, scope.epoch
            ))
            .into());
        }
        CommitPlan::Commit { next } => next,
    };
    // The store stamps the interrupt: a resume must present this commit's revision.
    let (interrupt, interrupt_json) =
        match stamp_interrupt(request, next, now, commit.max_interrupt_bytes)? {
            Some((interrupt, json)) => (Some(interrupt), Some(json)),
            None => (None, None),
        };
    let updated = conn
        .prepare_cached(
            "UPDATE harness_sessions SET durable_revision = ?2, head_state_id = ?3, head_codec = ?4, head_digest = ?5, \
             head_size = ?6, head_run_id = ?7, committed_at_ms = ?8, head_lease_generation = ?9, terminal_json = ?10, \
             interrupt_json = ?11, durability = 'committed', updated_at_ms = max(updated_at_ms, ?8) \
             WHERE id = ?1 AND durable_revision = ?12",
        )
        .ctx("preparing the head update")?
        .execute(params![
            id,
            sql_int("revision", next)?,
            request.state_id,
            codec,
            content_digest,
            sql_int("size", size)?,
            request.run_id,
            now,
            sql_int("lease generation", scope.lease_generation)?,
            commit.terminal_json,
            interrupt_json,
            sql_int("revision", request.expected_revision)?,
        ])
        .ctx("committing the head")?;
    if updated != 1 {
        // The single writer read this revision a moment ago in the same transaction.
        return Err(SqliteError::Internal("the head moved inside its own transaction").into());
    }
    conn.prepare_cached(
        "UPDATE harness_session_state SET committed = 1 WHERE binding_id = ?1 AND state_id = ?2",
    )
    .ctx("preparing the state commit")?
    .execute(params![id, request.state_id])
    .ctx("marking the state committed")?;
    let uncertain_runs = uncertain_runs(conn, id, epoch)?;
    Ok(DurableStateHead {
        binding_id: scope.binding.clone(),
        epoch: scope.epoch,
        revision: next,
        state_id: request.state_id.clone(),
        codec,
        content_digest,
        size,
        run_id: request.run_id.clone(),
        committed_at_ms: now,
        lease_generation: scope.lease_generation,
        terminal: request.terminal.clone(),
        interrupt,
        durability: if uncertain_runs.is_empty() {
            Durability::Committed
        } else {
            Durability::Uncertain
        },
        uncertain_runs,
    })
}

pub(super) fn mark_uncertain(
    conn: &Connection,
    scope: &ScopeKey,
    run_id: &str,
    reason: &str,
    now: i64,
) -> Result<()> {
    let epoch = admit(conn, scope)?;
    // Marking twice keeps the first mark: its time is when the ambiguity began.
    conn.prepare_cached(
        "INSERT INTO harness_uncertain_runs (binding_id, epoch, run_id, reason, marked_at_ms) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (binding_id, epoch, run_id) DO NOTHING",
    )
    .ctx("preparing the uncertain mark")?
    .execute(params![scope.id(), epoch, run_id, reason, now])
    .ctx("marking a run uncertain")?;
    touch(conn, scope.id(), now)
}

pub(super) fn reconcile_run(
    conn: &Connection,
    scope: &ScopeKey,
    run_id: &str,
    now: i64,
) -> Result<()> {
    let epoch = admit(conn, scope)?;
    let deleted = conn
        .prepare_cached("DELETE FROM harness_uncertain_runs WHERE binding_id = ?1 AND epoch = ?2 AND run_id = ?3")
        .ctx("preparing the reconciliation")?
        .execute(params![scope.id(), epoch, run_id])
        .ctx("reconciling a run")?;
    if deleted == 0 {
        return Err(Rejection::NotFound(format!("uncertain run {run_id}")).into());
    }
    touch(conn, scope.id(), now)
}

pub(super) fn pending_interrupt(
    conn: &Connection,
    scope: &ScopeKey,
) -> Result<Option<PendingInterrupt>> {
    admit(conn, scope)?;
    let json: Option<String> = conn
        .prepare_cached("SELECT interrupt_json FROM harness_sessions WHERE id = ?1")
        .ctx("preparing the interrupt read")?
        .query_row([scope.id()], |r| r.get(0))
        .ctx("reading the pending interrupt")?;
    parse_interrupt(json.as_deref())
}

/// Consumes the pending interrupt (`spec/001_78d7ff78f70a2a2a.txt` §6): binding, interrupt
/// id, revision, caller and decision must all match; the consumption and the recorded
/// outcome are one transaction, so a duplicate either replays the outcome or is refused.
pub(super) fn resume(
    conn: &Connection,
    scope: &ScopeKey,
    request: &ResumeRequest,
    now: i64,
) -> Result<ResumeOutcome> {
    let id = scope.id();
    let (epoch, owner, interrupt_json) = conn
        .prepare_cached(
            "SELECT epoch, owner_subject_ref, interrupt_json FROM harness_sessions WHERE id = ?1",
        )
        .ctx("preparing the resume read")?
        .query_row([id], |r| {
            Ok((
                get_u64(r, 0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .optional()
        .ctx("reading the binding to resume")?
        .ok_or_else(|| not_found_binding(id))?;
    // Epoch only: resumes arrive from the control plane, not from the fenced worker.
    if scope.epoch != epoch {
        return Err(Rejection::StaleEpoch {
            presented: scope.epoch,
            current: epoch,
        }
        .into());
    }
    let epoch = sql_int("epoch", epoch)?;
    // The owner check comes first, so a stranger learns nothing about the interrupt
    // (whether it exists, its revision, or a recorded outcome).
    if owner != request.caller.as_str() {
        return Err(Rejection::Forbidden(
            "only the binding's owner may resume its interrupts".into(),
        )
        .into());
    }
    let prior: Vec<(String, String)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT idempotency_digest, outcome_json FROM harness_interrupt_resumes \
                 WHERE binding_id = ?1 AND epoch = ?2 AND interrupt_id = ?3",
            )
            .ctx("preparing the resume lookup")?;
        let rows = stmt
            .query_map(params![id, epoch, request.interrupt_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .ctx("looking up prior resumes")?;
        rows.collect::<rusqlite::Result<_>>()
            .ctx("reading prior resumes")?
    };
    if let Some((_, outcome)) = prior
        .iter()
        .find(|(digest, _)| digest == request.idempotency.as_str())
    {
        return serde_json::from_str(outcome).map_err(|e| corrupt("resume outcome", e));
    }
    let current = parse_interrupt(interrupt_json.as_deref())?
        .filter(|i| i.interrupt_id == request.interrupt_id);
    let Some(current) = current else {
        return Err(if prior.is_empty() {
            Rejection::NotFound(format!("interrupt {}", request.interrupt_id))
        } else {
            Rejection::Conflict {
                what: format!("interrupt {} was already resumed", request.interrupt_id),
            }
        }
        .into());
    };
    if current.revision != request.revision {
        return Err(Rejection::RevisionConflict {
            expected: request.revision,
            actual: current.revision,
        }
        .into());
    }
    if !current
        .allowed_decisions
        .iter()
        .any(|d| d == &request.decision)
    {
        return Err(Rejection::Invalid(format!(
            "decision {:?} is not allowed for interrupt {} (allowed: {})",
            request.decision,
            current.interrupt_id,
            current.allowed_decisions.join(", ")
        ))
        .into());
    }
    let outcome = ResumeOutcome {
        interrupt_id: current.interrupt_id,
        decision: request.decision.clone(),
        revision: current.revision,
        resumed_at_ms: now,
        response: request.response.clone(),
    };
    let outcome_json = serde_json::to_string(&outcome)
        .map_err(|e| Rejection::Invalid(format!("resume response: {e}")))?;
    conn.prepare_cached("UPDATE harness_sessions SET interrupt_json = NULL, updated_at_ms = max(updated_at_ms, ?2) WHERE id = ?1")
        .ctx("preparing the interrupt consumption")?
        .execute(params![id, now])
        .ctx("consuming the interrupt")?;
    conn.prepare_cached(
        "INSERT INTO harness_interrupt_resumes (binding_id, epoch, interrupt_id, revision, idempotency_digest, resumed_at_ms, \
         outcome_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .ctx("preparing the resume record")?
    .execute(params![id, epoch, outcome.interrupt_id, sql_int("revision", outcome.revision)?, request.idempotency.as_str(), now, outcome_json])
    .ctx("recording the resume")?;
    Ok(outcome)
}
