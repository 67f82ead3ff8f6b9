//! Long-term memory storage (`harness_memories`, `spec/001_78d7ff78f70a2a2a.txt` §5).
//!
//! The store sees only prepared records and authorized namespaces: the write pipeline
//! (authorize, validate, scan, redact, refuse authority, approval) ran in
//! [`crate::domain::memory::pipeline`] before a call gets here. What the store owns is
//! step 6 and 7 of that pipeline, atomically per record: compare the expected revision
//! (refuse, or consolidate with [`consolidate`]), persist with provenance, and write an
//! audit record. The revision rules are the pure `plan_*` functions below, so both
//! backends decide identically.
//!
//! Every read takes a [`Namespace`] and filters by it before anything else: a lookup is
//! by `(namespace, key)`, and search candidates come from an index whose first key is
//! the namespace. Ranking happens afterwards, in [`crate::domain::memory::rank`].

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Result;
use crate::domain::{
    ids::BindingId,
    memory::{
        ApprovalRecord, ApprovalStatus, Consolidation, MemoryKind, MemoryRecord,
        MemoryWriteOutcome, Namespace, WriteOutcomeKind, consolidate, kind_str, rank::Candidate,
        scope_str,
    },
    state::{Rejection, StateScope},
};

/// A prepared write and its concurrency expectation.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPut {
    /// From the pipeline: revision 0, content scanned, provenance and approval set.
    pub record: MemoryRecord,
    /// `None` or `Some(0)`: create only. `Some(n)`: replace revision `n`.
    pub expected_revision: Option<u64>,
    /// What a stale expectation does: refuse, or merge into a new revision.
    pub consolidation: Consolidation,
    /// For a sandbox worker's write: the binding, epoch and lease generation it holds.
    /// The write is refused (`stale_epoch`, `stale_lease`) unless they are still the
    /// binding's fence (DESIGN §3): atomically with the write on SQLite; checked just
    /// before it on MongoDB, as for the other side-document writes there.
    pub fence: Option<StateScope>,
}

/// What search asks the store for: candidates from one namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateQuery {
    /// Lower-cased query terms ([`crate::domain::memory::rank::query_terms`]).
    pub terms: Vec<String>,
    /// Only these kinds (empty: all).
    pub kinds: Vec<MemoryKind>,
    /// Most lexical candidates returned (best BM25 first).
    pub lexical_limit: usize,
    /// The query's embedding: the namespace's records nearest to it in direction are
    /// candidates too (from every record of the namespace, [`crate::store::vectors`]).
    pub embedding: Option<Vec<f32>>,
    /// Most nearest-by-vector candidates returned (0: none).
    pub vector_limit: usize,
    pub now_ms: i64,
}

/// An approval decision on a pending (or revoked, under review) record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryDecision {
    pub approve: bool,
    pub expected_revision: u64,
    pub decided_by: String,
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// What a memory expiry sweep removed (also written as an audit record).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySweepReport {
    pub swept_at_ms: i64,
    pub expired: u64,
    /// Expired records per retention policy id.
    pub by_policy: BTreeMap<String, u64>,
}

/// Most records one listing returns.
pub const MAX_LIST: usize = 500;

/// `harness_memories`.
#[async_trait]
pub trait MemoryStore: Send + Sync {
    /// The record under `key` in the namespace, if present and unexpired. Records that
    /// are not admitted (pending, rejected, revoked) are returned only when
    /// `include_unadmitted` (an approver reviewing them).
    async fn get_memory(
        &self,
        namespace: &Namespace,
        key: &str,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Option<MemoryRecord>>;

    /// Compare-and-set of one record (see [`plan_put`]), with an audit record.
    async fn put_memory(&self, put: &MemoryPut) -> Result<MemoryWriteOutcome>;

    /// Deletes the record if its revision is `expected_revision`, with an audit record.
    async fn delete_memory(
        &self,
        namespace: &Namespace,
        key: &str,
        expected_revision: u64,
        actor: &str,
    ) -> Result<MemoryWriteOutcome>;

    /// Approves or rejects a pending (or revoked) record at `expected_revision`; the
    /// decision is a new revision. Audited.
    async fn decide_memory(
        &self,
        namespace: &Namespace,
        key: &str,
        decision: &MemoryDecision,
    ) -> Result<MemoryWriteOutcome>;

    /// Search candidates: admitted, unexpired records of this namespace only, with their
    /// BM25 score over the namespace (0 for records that came in only as recent).
    async fn memory_candidates(
        &self,
        namespace: &Namespace,
        query: &CandidateQuery,
    ) -> Result<Vec<Candidate>>;

    /// Records of one namespace in key order with keys after `after_key`, at most
    /// `limit` (capped at [`MAX_LIST`]): admitted and unexpired ones, or every unexpired
    /// one when `include_unadmitted` (an approver reviewing them).
    async fn list_memories(
        &self,
        namespace: &Namespace,
        after_key: Option<&str>,
        limit: usize,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Vec<MemoryRecord>>;

    /// How many unexpired records of one namespace are in each approval status.
    async fn count_memories(
        &self,
        namespace: &Namespace,
        now_ms: i64,
    ) -> Result<BTreeMap<String, u64>>;

    /// Deletes every record whose retention expired by `now_ms`; one audit record.
    async fn sweep_memory(&self, now_ms: i64) -> Result<MemorySweepReport>;

    /// A source thread (binding) was revoked: its episodic references become `revoked`
    /// and `review_required` (invisible to search until an approver decides), each as a
    /// new revision; nothing else changes. Returns how many. Audited.
    async fn revoke_memory_source(
        &self,
        source_binding: &BindingId,
        actor: &str,
        now_ms: i64,
    ) -> Result<u64>;

    /// Bulk load of already-prepared records at their own revisions, for trusted
    /// imports (migrations, benchmarks). Bypasses the write pipeline and revision
    /// checks; an existing id is an error. Never reachable from the API.
    async fn load_memories(&self, records: Vec<MemoryRecord>) -> Result<u64>;
}

/// What a put does: write a new revision, or answer an identical retry with the revision
/// its first attempt made (nothing written, nothing audited again).
#[derive(Debug)]
pub enum PutPlan {
    Write(MemoryRecord, WriteOutcomeKind),
    Replay(MemoryWriteOutcome),
}

/// Decides a put against the current record. A keyed write whose key made the current
/// revision is a retry: the same request is answered with that revision, another
/// request under the same key is refused. (Once a later write has replaced that
/// revision, a retry is judged like any write: by its expected revision.)
pub fn plan_put(
    current: Option<&MemoryRecord>,
    put: &MemoryPut,
) -> std::result::Result<PutPlan, Rejection> {
    if let (Some(cur), Some(key)) = (current, &put.record.provenance.write_key)
        && let Some(made) = &cur.provenance.write_key
        && made.key == key.key
    {
        if made.request != key.request {
            return Err(Rejection::IdempotencyMismatch);
        }
        return Ok(PutPlan::Replay(MemoryWriteOutcome {
            outcome: made.outcome,
            record: cur.clone(),
            replayed: true,
        }));
    }
    plan_write(current, put).map(|(record, outcome)| {
        let mut record = record;
        if let Some(key) = &mut record.provenance.write_key {
            key.outcome = outcome;
        }
        PutPlan::Write(record, outcome)
    })
}

/// Step 6 of the pipeline: the record a put writes, given the current one.
/// - no current record: create at revision 1 when `expected_revision` is `None` or 0;
///   a positive expectation is a conflict with actual 0;
/// - current at the expected revision: replace it (revision + 1, source revision =
///   the replaced one);
/// - otherwise, with `merge`: [`consolidate`] (a new revision recording every source
///   revision); without: `revision_conflict`.
fn plan_write(
    current: Option<&MemoryRecord>,
    put: &MemoryPut,
) -> std::result::Result<(MemoryRecord, WriteOutcomeKind), Rejection> {
    let mut record = put.record.clone();
    let expected = put.expected_revision.filter(|r| *r > 0);
    match (current, expected) {
        (None, None) => {
            record.revision = 1;
            record.source_revisions = Vec::new();
            Ok((record, WriteOutcomeKind::Created))
        }
        (None, Some(e)) => Err(Rejection::RevisionConflict {
            expected: e,
            actual: 0,
        }),
        (Some(cur), Some(e)) if e == cur.revision => {
            record.id = cur.id.clone();
            record.revision = cur.revision + 1;
            record.source_revisions = vec![cur.revision];
            record.created_at_ms = cur.created_at_ms;
            Ok((record, WriteOutcomeKind::Updated))
        }
        (Some(cur), e) => {
            if put.consolidation == Consolidation::Merge {
                if cur.kind != record.kind {
                    return Err(Rejection::Conflict {
                        what: format!(
                            "cannot consolidate {} memory into {} memory under one key",
                            kind_str(record.kind),
                            kind_str(cur.kind)
                        ),
                    });
                }
                Ok((consolidate(cur, &record, e), WriteOutcomeKind::Consolidated))
            } else {
                Err(Rejection::RevisionConflict {
                    expected: e.unwrap_or(0),
                    actual: cur.revision,
                })
            }
        }
    }
}

/// A delete must name the current revision.
pub fn plan_delete(
    current: Option<&MemoryRecord>,
    key: &str,
    expected_revision: u64,
) -> std::result::Result<MemoryRecord, Rejection> {
    let cur = current.ok_or_else(|| Rejection::NotFound(format!("memory {key:?}")))?;
    if cur.revision != expected_revision {
        return Err(Rejection::RevisionConflict {
            expected: expected_revision,
            actual: cur.revision,
        });
    }
    Ok(cur.clone())
}

/// An approval decision: only pending or revoked records, at the expected revision.
pub fn plan_decision(
    current: Option<&MemoryRecord>,
    key: &str,
    d: &MemoryDecision,
) -> std::result::Result<(MemoryRecord, WriteOutcomeKind), Rejection> {
    let cur = current.ok_or_else(|| Rejection::NotFound(format!("memory {key:?}")))?;
    if cur.revision != d.expected_revision {
        return Err(Rejection::RevisionConflict {
            expected: d.expected_revision,
            actual: cur.revision,
        });
    }
    if !matches!(
        cur.approval_status,
        ApprovalStatus::Pending | ApprovalStatus::Revoked
    ) {
        return Err(Rejection::Conflict {
            what: format!(
                "memory {key:?} is {}, not awaiting a decision",
                cur.approval_status.as_str()
            ),
        });
    }
    let mut next = cur.clone();
    next.revision = cur.revision + 1;
    next.source_revisions = vec![cur.revision];
    next.updated_at_ms = d.at_ms;
    next.review_required = false;
    next.approval = ApprovalRecord {
        decided_by: Some(d.decided_by.clone()),
        decided_at_ms: Some(d.at_ms),
        reason: d.reason.clone(),
    };
    let outcome = if d.approve {
        next.approval_status = ApprovalStatus::Approved;
        WriteOutcomeKind::Approved
    } else {
        next.approval_status = ApprovalStatus::Rejected;
        WriteOutcomeKind::Rejected
    };
    Ok((next, outcome))
}

/// A revoked source thread's episodic reference, as its next revision.
pub fn plan_revocation(current: &MemoryRecord, actor: &str, now_ms: i64) -> MemoryRecord {
    let mut next = current.clone();
    next.revision = current.revision + 1;
    next.source_revisions = vec![current.revision];
    next.approval_status = ApprovalStatus::Revoked;
    next.review_required = true;
    next.updated_at_ms = now_ms;
    next.approval = ApprovalRecord {
        decided_by: Some(actor.to_owned()),
        decided_at_ms: Some(now_ms),
        reason: Some("source thread revoked".into()),
    };
    next
}

/// The audit detail of a memory write: ids, revisions, hashes and the actor, never the
/// content.
pub fn audit_detail(
    outcome: WriteOutcomeKind,
    record: &MemoryRecord,
    actor: &str,
) -> serde_json::Value {
    serde_json::json!({
        "outcome": outcome,
        "memory_id": record.id,
        "scope": scope_str(record.namespace.scope),
        "namespace_key": record.namespace.key,
        "kind": kind_str(record.kind),
        "revision": record.revision,
        "source_revisions": record.source_revisions,
        "content_hash": record.content_hash,
        "approval_status": record.approval_status.as_str(),
        "actor": actor,
        "source_run_id": record.provenance.source_run_id,
    })
}

/// The audit action name of an outcome.
pub fn audit_action(outcome: WriteOutcomeKind) -> &'static str {
    match outcome {
        WriteOutcomeKind::Created | WriteOutcomeKind::Updated => "memory.put",
        WriteOutcomeKind::Consolidated => "memory.consolidate",
        WriteOutcomeKind::Deleted => "memory.delete",
        WriteOutcomeKind::Approved => "memory.approve",
        WriteOutcomeKind::Rejected => "memory.reject",
    }
}

/// The source binding of a record as a binding id, for the audit record's column.
pub fn source_binding(record: &MemoryRecord) -> Option<BindingId> {
    record
        .provenance
        .source_binding_id
        .as_deref()
        .and_then(BindingId::parse)
}
