//! Retention sweeps and the audit trail (`spec/001_78d7ff78f70a2a2a.txt`, "Retention and
//! deletion"). Deletions run in bounded batches, each its own writer transaction, so a
//! large sweep never holds the turn path's commits behind one long transaction.

use std::{collections::HashSet, sync::Arc};

use rusqlite::{Connection, OptionalExtension, params};

use super::{
    SqlContext,
    bindings::{Purged, RESET_EPOCH_COLUMNS, purge_epochs},
    corrupt,
    readers::ReaderPool,
    writer::Writer,
};
use crate::{
    domain::{
        ids::BindingId,
        state::{Rejection, check_key},
    },
    store::{AuditRecord, Result, RetentionPolicy, SweepReport},
};

/// Stale bindings fetched per round of a sweep.
const STALE_BATCH: i64 = 64;

/// Longest retention policy id.
const MAX_POLICY_ID_BYTES: usize = 128;

pub(super) fn audit(
    conn: &Connection,
    at_ms: i64,
    action: &str,
    binding: Option<&str>,
    detail: &serde_json::Value,
) -> Result<()> {
    conn.prepare_cached("INSERT INTO harness_audit (at_ms, action, binding_id, detail_json) VALUES (?1, ?2, ?3, ?4)")
        .ctx("preparing the audit insert")?
        .execute(params![at_ms, action, binding, detail.to_string()])
        .ctx("writing an audit record")?;
    Ok(())
}

pub(super) fn audit_records(conn: &Connection, limit: i64) -> Result<Vec<AuditRecord>> {
    let mut stmt = conn
        .prepare_cached("SELECT at_ms, action, binding_id, detail_json FROM harness_audit ORDER BY id DESC LIMIT ?1")
        .ctx("preparing the audit listing")?;
    let rows = stmt
        .query_map([limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .ctx("listing audit records")?;
    let mut records = Vec::new();
    for row in rows {
        let (at_ms, action, binding, detail) = row.ctx("reading an audit record")?;
        let binding_id = match binding {
            Some(id) => {
                Some(BindingId::parse(&id).ok_or_else(|| corrupt("audit binding id", &id))?)
            }
            None => None,
        };
        let detail = serde_json::from_str(&detail).map_err(|e| corrupt("audit detail", e))?;
        records.push(AuditRecord {
            at_ms,
            action,
            binding_id,
            detail,
        });
    }
    Ok(records)
}

/// Deletes a batch of never-committed states created before `cutoff` (never a head).
fn purge_pending(conn: &Connection, cutoff: i64, batch: i64) -> Result<u64> {
    let n = conn
        .prepare_cached(
            "DELETE FROM harness_session_state WHERE rowid IN ( \
                 SELECT s.rowid FROM harness_session_state AS s \
                 WHERE s.committed = 0 AND s.created_at_ms < ?1 \
                   AND NOT EXISTS (SELECT 1 FROM harness_sessions AS h \
                                   WHERE h.id = s.binding_id AND h.head_state_id = s.state_id) \
                 LIMIT ?2)",
        )
        .ctx("preparing the pending purge")?
        .execute(params![cutoff, batch])
        .ctx("purging pending states")?;
    Ok(super::count(n))
}

fn stale_bindings(conn: &Connection, cutoff: i64) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT id FROM harness_sessions WHERE updated_at_ms < ?1 ORDER BY updated_at_ms LIMIT ?2")
        .ctx("preparing the stale-binding listing")?;
    let rows = stmt
        .query_map(params![cutoff, STALE_BATCH], |r| r.get(0))
        .ctx("listing stale bindings")?;
    rows.collect::<rusqlite::Result<Vec<String>>>()
        .ctx("reading stale bindings")
}

/// Progress of deleting one binding.
#[derive(Clone, Copy, Debug)]
enum Retire {
    /// Deleted already, or written to since it was listed: nothing to do.
    Skipped,
    /// Rows of epochs below `below` are being purged; `deleted` once the row is gone.
    Progress {
        below: i64,
        purged: Purged,
        deleted: bool,
    },
}

/// Starts deleting a binding that is still stale: first moves it to a fresh, empty epoch
/// (as a clear would), so from this transaction on none of its rows is readable or
/// writable and a batch-by-batch purge never exposes a half-deleted conversation.
fn retire_start(conn: &Connection, id: &str, cutoff: i64, batch: i64) -> Result<Retire> {
    let row = conn
        .prepare_cached("SELECT epoch, updated_at_ms FROM harness_sessions WHERE id = ?1")
        .ctx("preparing the retirement check")?
        .query_row([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .optional()
        .ctx("checking a binding for retirement")?;
    let Some((epoch, updated_at_ms)) = row else {
        return Ok(Retire::Skipped);
    };
    if updated_at_ms >= cutoff {
        return Ok(Retire::Skipped);
    }
    let below = epoch
        .checked_add(1)
        .ok_or_else(|| corrupt("epoch", epoch))?;
    // `updated_at_ms` is left alone: the binding stays stale, so a sweep interrupted
    // here is finished by the next one.
    let sql =
        format!("UPDATE harness_sessions SET epoch = ?2, {RESET_EPOCH_COLUMNS} WHERE id = ?1");
    conn.prepare_cached(&sql)
        .ctx("preparing the retirement")?
        .execute(params![id, below])
        .ctx("retiring a binding")?;
    retire_continue(conn, id, below, cutoff, batch)
}

/// Purges the next batch; the transaction that finds nothing left deletes the binding
/// row, unless the binding was written to meanwhile (then it survives, empty).
fn retire_continue(
    conn: &Connection,
    id: &str,
    below: i64,
    cutoff: i64,
    batch: i64,
) -> Result<Retire> {
    let purged = purge_epochs(conn, id, below, batch)?;
    let mut deleted = false;
    if purged.done {
        deleted = conn
            .prepare_cached("DELETE FROM harness_sessions WHERE id = ?1 AND updated_at_ms < ?2")
            .ctx("preparing the binding delete")?
            .execute(params![id, cutoff])
            .ctx("deleting a binding")?
            > 0;
    }
    Ok(Retire::Progress {
        below,
        purged,
        deleted,
    })
}

pub(super) async fn sweep(
    writer: &Writer,
    readers: &Arc<ReaderPool>,
    policy: &RetentionPolicy,
    now_ms: i64,
    batch: i64,
) -> Result<SweepReport> {
    check_key("retention policy id", &policy.id, MAX_POLICY_ID_BYTES)?;
    if policy.pending_ttl_ms < 0 || policy.conversation_ttl_ms.is_some_and(|ttl| ttl < 0) {
        return Err(Rejection::Invalid(format!(
            "retention policy {}: TTLs must not be negative",
            policy.id
        ))
        .into());
    }
    let mut report = SweepReport {
        policy_id: policy.id.clone(),
        swept_at_ms: now_ms,
        ..SweepReport::default()
    };

    let pending_cutoff = now_ms.saturating_sub(policy.pending_ttl_ms);
    loop {
        let n = writer
            .run(move |conn| purge_pending(conn, pending_cutoff, batch))
            .await?;
        report.pending_states_deleted += n;
        if n < u64::try_from(batch).unwrap_or(0) {
            break;
        }
    }

    if let Some(ttl) = policy.conversation_ttl_ms {
        let cutoff = now_ms.saturating_sub(ttl);
        // Every binding handled leaves the stale set (deleted, or active again), so this
        // terminates; `seen` makes sure of it even if one did not.
        let mut seen = HashSet::new();
        loop {
            let stale = readers.read(move |tx| stale_bindings(tx, cutoff)).await?;
            let fresh: Vec<String> = stale
                .into_iter()
                .filter(|id| seen.insert(id.clone()))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for id in fresh {
                let first = id.clone();
                let mut step = writer
                    .run(move |conn| retire_start(conn, &first, cutoff, batch))
                    .await?;
                while let Retire::Progress {
                    below,
                    purged,
                    deleted,
                } = step
                {
                    report.states_deleted += purged.states;
                    report.objects_deleted += purged.objects;
                    report.stream_entries_deleted += purged.entries;
                    if purged.done {
                        report.bindings_deleted += u64::from(deleted);
                        break;
                    }
                    let next = id.clone();
                    step = writer
                        .run(move |conn| retire_continue(conn, &next, below, cutoff, batch))
                        .await?;
                }
            }
        }
    }

    let detail = serde_json::to_value(&report)
        .map_err(|e| Rejection::Invalid(format!("sweep report: {e}")))?;
    writer
        .run(move |conn| audit(conn, now_ms, "retention.sweep", None, &detail))
        .await?;
    Ok(report)
}
