//! `harness_sessions` rows: creation, the fence, and clearing an epoch.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::json;

use super::{SqlContext, corrupt, get_u64, load_fence, not_found_binding, retention, sql_int};
use crate::{
    domain::{
        ids::{BindingId, SubjectRef},
        state::{BindingRecord, Fence, Rejection},
    },
    store::{ClearReport, Result},
};

/// Resets the head and the per-epoch counters; shared by clear and retention, which both
/// move a binding to a fresh, empty epoch.
pub(super) const RESET_EPOCH_COLUMNS: &str = "durable_revision = 0, head_state_id = NULL, head_codec = NULL, \
     head_digest = NULL, head_size = NULL, head_run_id = NULL, committed_at_ms = NULL, \
     head_lease_generation = NULL, terminal_json = NULL, interrupt_json = NULL, durability = NULL, \
     object_count = 0, stream_count = 0";

pub(super) fn get(conn: &Connection, id: &str) -> Result<Option<BindingRecord>> {
    let row = conn
        .prepare_cached(
            "SELECT environment, owner_subject_ref, agent_id, conversation_id, harness, epoch, lease_generation, created_at_ms \
             FROM harness_sessions WHERE id = ?1",
        )
        .ctx("preparing the binding read")?
        .query_row([id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                get_u64(r, 5)?,
                get_u64(r, 6)?,
                r.get::<_, i64>(7)?,
            ))
        })
        .optional()
        .ctx("reading a binding")?;
    let Some((
        environment,
        owner,
        agent_id,
        conversation_id,
        harness,
        epoch,
        lease_generation,
        created_at_ms,
    )) = row
    else {
        return Ok(None);
    };
    Ok(Some(BindingRecord {
        binding_id: BindingId::parse(id).ok_or_else(|| corrupt("binding id", id))?,
        environment,
        owner: SubjectRef::parse(&owner).ok_or_else(|| corrupt("owner subject ref", &owner))?,
        agent_id,
        conversation_id,
        harness,
        epoch,
        lease_generation,
        created_at_ms,
    }))
}

/// Creates the binding, or returns the existing one when its identity matches.
pub(super) fn ensure(
    conn: &Connection,
    record: &BindingRecord,
    now: i64,
) -> Result<(BindingRecord, bool)> {
    let id = record.binding_id.as_str();
    if let Some(existing) = get(conn, id)? {
        let same_identity = existing.environment == record.environment
            && existing.owner == record.owner
            && existing.agent_id == record.agent_id
            && existing.conversation_id == record.conversation_id;
        if !same_identity {
            return Err(Rejection::Conflict {
                what: format!("binding {id} already exists for another identity"),
            }
            .into());
        }
        return Ok((existing, false));
    }
    let inserted = conn
        .prepare_cached(
            "INSERT INTO harness_sessions (id, environment, owner_subject_ref, agent_id, conversation_id, harness, \
             epoch, lease_generation, created_at_ms, updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )
        .ctx("preparing the binding insert")?
        .execute(params![
            id,
            record.environment,
            record.owner.as_str(),
            record.agent_id,
            record.conversation_id,
            record.harness,
            sql_int("epoch", record.epoch)?,
            sql_int("lease generation", record.lease_generation)?,
            record.created_at_ms,
            now,
        ]);
    match inserted {
        Ok(_) => Ok((record.clone(), true)),
        // The id is free but the identity index is not: another key derived another id
        // for this conversation.
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => {
            Err(Rejection::Conflict {
                what: format!("another binding already holds the identity of {id}"),
            }
            .into())
        }
        Err(e) => Err(e).ctx("inserting a binding"),
    }
}

/// Raises the lease generation within the current epoch: monotonic and idempotent.
pub(super) fn raise_fence(
    conn: &Connection,
    id: &str,
    epoch: u64,
    lease_generation: u64,
) -> Result<Fence> {
    let fence = load_fence(conn, id)?.ok_or_else(|| not_found_binding(id))?;
    if epoch < fence.epoch {
        return Err(Rejection::StaleEpoch {
            presented: epoch,
            current: fence.epoch,
        }
        .into());
    }
    if epoch > fence.epoch {
        return Err(Rejection::Invalid(format!(
            "epoch {epoch} is ahead of the binding's epoch {}; use clear to move the epoch",
            fence.epoch
        ))
        .into());
    }
    if lease_generation < fence.lease_generation {
        return Err(Rejection::StaleLease {
            presented: lease_generation,
            current: fence.lease_generation,
        }
        .into());
    }
    if lease_generation > fence.lease_generation {
        conn.prepare_cached("UPDATE harness_sessions SET lease_generation = ?2 WHERE id = ?1")
            .ctx("preparing the fence update")?
            .execute(params![id, sql_int("lease generation", lease_generation)?])
            .ctx("raising the fence")?;
    }
    Ok(Fence {
        epoch,
        lease_generation,
    })
}

/// Rows a purge removed (the ones a report counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Purged {
    pub states: u64,
    pub objects: u64,
    pub entries: u64,
    /// No row of the purged epochs is left.
    pub done: bool,
}

impl Purged {
    pub(super) fn add(&mut self, other: Purged) {
        self.states += other.states;
        self.objects += other.objects;
        self.entries += other.entries;
        self.done = other.done;
    }
    fn any(&self) -> bool {
        self.states + self.objects + self.entries > 0
    }
}

/// Deletes at most `batch` rows per table of the binding's epochs below `below_epoch`.
/// Streams, uncertain runs and resume records go once their bulkier neighbours are gone
/// (streams only after their entries, so the cascade never deletes uncounted entries).
pub(super) fn purge_epochs(
    conn: &Connection,
    id: &str,
    below_epoch: i64,
    batch: i64,
) -> Result<Purged> {
    let chunk = |sql: &'static str, context: &'static str| -> Result<u64> {
        let n = conn
            .prepare_cached(sql)
            .ctx("preparing a purge")?
            .execute(params![id, below_epoch, batch])
            .ctx(context)?;
        Ok(super::count(n))
    };
    let states = chunk(
        "DELETE FROM harness_session_state WHERE rowid IN \
         (SELECT rowid FROM harness_session_state WHERE binding_id = ?1 AND epoch < ?2 LIMIT ?3)",
        "purging states",
    )?;
    let objects = chunk(
        "DELETE FROM harness_objects WHERE rowid IN \
         (SELECT rowid FROM harness_objects WHERE binding_id = ?1 AND epoch < ?2 LIMIT ?3)",
        "purging objects",
    )?;
    let entries = chunk(
        "DELETE FROM harness_stream_entries WHERE rowid IN \
         (SELECT rowid FROM harness_stream_entries WHERE binding_id = ?1 AND epoch < ?2 LIMIT ?3)",
        "purging stream entries",
    )?;
    let limit = u64::try_from(batch).unwrap_or(0);
    let done = states < limit && objects < limit && entries < limit;
    if done {
        for (sql, context) in [
            (
                "DELETE FROM harness_streams WHERE binding_id = ?1 AND epoch < ?2",
                "purging streams",
            ),
            (
                "DELETE FROM harness_uncertain_runs WHERE binding_id = ?1 AND epoch < ?2",
                "purging uncertain runs",
            ),
            (
                "DELETE FROM harness_interrupt_resumes WHERE binding_id = ?1 AND epoch < ?2",
                "purging resume records",
            ),
        ] {
            conn.prepare_cached(sql)
                .ctx("preparing a purge")?
                .execute(params![id, below_epoch])
                .ctx(context)?;
        }
    }
    Ok(Purged {
        states,
        objects,
        entries,
        done,
    })
}

/// Progress of a clear across its transactions.
#[derive(Clone, Debug)]
pub(super) struct ClearStep {
    pub epoch: u64,
    /// The epoch the clear moved from; `None` when it only finished an earlier clear.
    pub from_epoch: Option<u64>,
    pub purged: Purged,
    pub done: bool,
}

impl ClearStep {
    pub(super) fn report(&self) -> ClearReport {
        ClearReport {
            epoch: self.epoch,
            states_deleted: self.purged.states,
            objects_deleted: self.purged.objects,
            stream_entries_deleted: self.purged.entries,
        }
    }
}

/// Moves the binding to `new_epoch` (current + 1) and purges a first batch; with
/// `new_epoch == current` it only resumes the purge of an interrupted clear.
pub(super) fn start_clear(
    conn: &Connection,
    id: &BindingId,
    new_epoch: u64,
    now: i64,
    batch: i64,
) -> Result<ClearStep> {
    let fence = load_fence(conn, id.as_str())?.ok_or_else(|| not_found_binding(id.as_str()))?;
    let from_epoch = if new_epoch == fence.epoch {
        None
    } else if new_epoch < fence.epoch {
        return Err(Rejection::StaleEpoch {
            presented: new_epoch,
            current: fence.epoch,
        }
        .into());
    } else if Some(new_epoch) != fence.epoch.checked_add(1) {
        return Err(Rejection::Invalid(format!(
            "clear moves the epoch by one: from {} to {}, not {new_epoch}",
            fence.epoch,
            fence.epoch.saturating_add(1)
        ))
        .into());
    } else {
        // The lease generation stays: the current worker keeps its fence.
        let sql = format!(
            "UPDATE harness_sessions SET epoch = ?2, {RESET_EPOCH_COLUMNS}, updated_at_ms = max(updated_at_ms, ?3) WHERE id = ?1"
        );
        conn.prepare_cached(&sql)
            .ctx("preparing the epoch move")?
            .execute(params![id.as_str(), sql_int("epoch", new_epoch)?, now])
            .ctx("moving the epoch")?;
        Some(fence.epoch)
    };
    let step = ClearStep {
        epoch: new_epoch,
        from_epoch,
        purged: Purged::default(),
        done: false,
    };
    continue_clear(conn, id, step, now, batch)
}

/// Purges the next batch; the transaction that finds nothing left writes the audit record.
pub(super) fn continue_clear(
    conn: &Connection,
    id: &BindingId,
    mut step: ClearStep,
    now: i64,
    batch: i64,
) -> Result<ClearStep> {
    let purged = purge_epochs(conn, id.as_str(), sql_int("epoch", step.epoch)?, batch)?;
    step.purged.add(purged);
    step.done = purged.done;
    // A clear that moved nothing and found nothing (a plain retry) is not worth a record.
    if step.done && (step.from_epoch.is_some() || step.purged.any()) {
        let detail = json!({
            "from_epoch": step.from_epoch,
            "epoch": step.epoch,
            "states_deleted": step.purged.states,
            "objects_deleted": step.purged.objects,
            "stream_entries_deleted": step.purged.entries,
        });
        retention::audit(conn, now, "binding.clear", Some(id.as_str()), &detail)?;
    }
    Ok(step)
}
