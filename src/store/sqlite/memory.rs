//! `harness_memories` on SQLite (`spec/001_78d7ff78f70a2a2a.txt` §5).
//!
//! One row per record, unique on `(namespace_key, memory_key)`; the namespace's other
//! components (environment, scope, agent, subject) are stored next to it for audit and
//! listing. Lexical search uses an FTS5 table holding only admitted records, whose
//! terms are namespace-qualified: the word `tea` of a record in namespace `mn_3fa9...` is
//! indexed as the token `3fa9...tea` (the first 24 hex digits of the namespace digest,
//! then the word). A query asks for the qualified tokens of its own namespace only, so
//! the namespace is the index key itself: postings of other namespaces are never read,
//! document frequencies are the namespace's own, and a record of another namespace can
//! never become a candidate (the join back to the row checks the full namespace key as
//! well). BM25 comes from FTS5.
//!
//! Writes run on the store's single writer, so a compare-and-set is the read and the
//! write inside one transaction, with its audit record in the same transaction.
//!
//! Search with an embedding also takes the nearest records of the namespace from its
//! vector index ([`crate::store::vectors`]): every row write stages the row's vector
//! change on the writer thread, and [`VectorHook`] hands the staged changes to the index
//! once their group is durable (a command rolled back to its savepoint drops its own).

use std::{cell::RefCell, collections::BTreeMap, sync::Arc};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

use super::{SqlContext, corrupt, retention::audit, sql_int, writer::GroupHook};
use crate::{
    domain::{
        memory::{
            ApprovalRecord, ApprovalStatus, Classification, MemoryKind, MemoryRecord,
            MemoryWriteOutcome, Namespace, Provenance, WriteOutcomeKind, kind_str, parse_kind,
            parse_scope,
            rank::{self, Candidate},
            scope_str,
        },
        state::Rejection,
    },
    store::{
        Result,
        memory::{
            CandidateQuery, MemoryDecision, MemoryPut, MemorySweepReport, PutPlan, audit_action,
            audit_detail, plan_decision, plan_delete, plan_put, plan_revocation,
        },
        vectors::{self, Change, Space, VectorIndex},
    },
};

/// Schema version 2: memory. Applied on top of version 1.
pub(super) const SCHEMA_V2: &str = r"
CREATE TABLE harness_memories (
    rowid             INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,
    environment_id    TEXT    NOT NULL,
    scope             TEXT    NOT NULL,
    namespace_key     TEXT    NOT NULL,
    agent_id          TEXT    NOT NULL,
    subject_ref       TEXT,
    kind              TEXT    NOT NULL,
    memory_key        TEXT    NOT NULL,
    approval_status   TEXT    NOT NULL,
    revision          INTEGER NOT NULL CHECK (revision >= 1),
    importance        REAL    NOT NULL,
    retention_policy  TEXT    NOT NULL,
    review_required   INTEGER NOT NULL CHECK (review_required IN (0, 1)),
    source_binding_id TEXT,
    source_run_id     TEXT,
    content_hash      TEXT    NOT NULL,
    media_type        TEXT    NOT NULL,
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL,
    expires_at_ms     INTEGER,
    meta_json         TEXT    NOT NULL,
    embedding         BLOB,
    body              TEXT    NOT NULL,
    UNIQUE (namespace_key, memory_key)
) STRICT;
-- Authorized listing and recent candidates (spec 001 §5 index 2).
CREATE INDEX harness_memories_listing ON harness_memories (namespace_key, updated_at_ms DESC);
-- Audit and revocation (index 3).
CREATE INDEX harness_memories_source ON harness_memories (source_binding_id, source_run_id)
    WHERE source_binding_id IS NOT NULL;
-- Expiry sweeps (index 4 is a TTL index on MongoDB; here the sweeper uses this).
CREATE INDEX harness_memories_expiry ON harness_memories (expires_at_ms)
    WHERE expires_at_ms IS NOT NULL;
-- Lexical search over admitted records only; rowid = harness_memories.rowid.
CREATE VIRTUAL TABLE harness_memories_fts USING fts5(text);
";

const COLUMNS: &str = "rowid, id, environment_id, scope, namespace_key, agent_id, subject_ref, kind, memory_key, approval_status, revision, importance, retention_policy, review_required, content_hash, media_type, created_at_ms, updated_at_ms, expires_at_ms, meta_json, embedding, body";

/// Expired records deleted per sweep transaction.
const SWEEP_BATCH: i64 = 2_000;

/// What is stored as JSON: the parts never filtered on.
#[derive(Serialize, Deserialize)]
struct Meta {
    provenance: Provenance,
    approval: ApprovalRecord,
    classification: Classification,
    source_revisions: Vec<u64>,
}

fn embedding_blob(e: &Option<Vec<f32>>) -> Option<Vec<u8>> {
    e.as_ref()
        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn embedding_of(blob: Option<Vec<u8>>) -> Option<Vec<f32>> {
    blob.map(|b| {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    })
}

/// Hex digits of the namespace digest that qualify each indexed term (96 bits).
const QUALIFIER_HEX: usize = 24;

/// The term qualifier of a namespace.
fn qualifier(namespace_key: &str) -> &str {
    let hex = namespace_key.strip_prefix("mn_").unwrap_or(namespace_key);
    hex.get(..QUALIFIER_HEX).unwrap_or(hex)
}

/// The indexed text of a record: each of its terms qualified by its namespace.
fn qualified_text(namespace_key: &str, text: &str) -> String {
    let q = qualifier(namespace_key);
    rank::tokenize(text)
        .iter()
        .map(|t| format!("{q}{t}"))
        .collect::<Vec<_>>()
        .join(" ")
}

struct Raw {
    rowid: i64,
    record: MemoryRecord,
}

fn decode(row: &Row<'_>) -> rusqlite::Result<(i64, Result<MemoryRecord>)> {
    let rowid: i64 = row.get(0)?;
    let scope: String = row.get(3)?;
    let kind: String = row.get(7)?;
    let status: String = row.get(9)?;
    let meta: String = row.get(19)?;
    let revision: i64 = row.get(10)?;
    let importance: f64 = row.get(11)?;
    let review: i64 = row.get(13)?;
    let fields = (
        row.get::<_, String>(1)?,
        row.get::<_, String>(2)?,
        row.get::<_, String>(4)?,
        row.get::<_, String>(5)?,
        row.get::<_, Option<String>>(6)?,
        row.get::<_, String>(8)?,
        row.get::<_, String>(12)?,
        row.get::<_, String>(14)?,
        row.get::<_, String>(15)?,
        row.get::<_, i64>(16)?,
        row.get::<_, i64>(17)?,
        row.get::<_, Option<i64>>(18)?,
        row.get::<_, Option<Vec<u8>>>(20)?,
        row.get::<_, String>(21)?,
    );
    let build = move || -> Result<MemoryRecord> {
        let (
            id,
            environment,
            ns_key,
            agent_id,
            subject_ref,
            memory_key,
            retention,
            hash,
            media,
            created,
            updated,
            expires,
            emb,
            body,
        ) = fields;
        let meta: Meta = serde_json::from_str(&meta).map_err(|e| corrupt("memory metadata", e))?;
        Ok(MemoryRecord {
            id,
            namespace: Namespace {
                environment,
                scope: parse_scope(&scope).ok_or_else(|| corrupt("memory scope", &scope))?,
                key: ns_key,
                agent_id,
                subject_ref,
            },
            kind: parse_kind(&kind).ok_or_else(|| corrupt("memory kind", &kind))?,
            memory_key,
            media_type: media,
            body,
            content_hash: hash,
            provenance: meta.provenance,
            approval_status: ApprovalStatus::parse(&status)
                .ok_or_else(|| corrupt("approval status", &status))?,
            approval: meta.approval,
            classification: meta.classification,
            importance: importance as f32,
            embedding: embedding_of(emb),
            revision: u64::try_from(revision).map_err(|e| corrupt("memory revision", e))?,
            source_revisions: meta.source_revisions,
            retention_policy: retention,
            review_required: review != 0,
            created_at_ms: created,
            updated_at_ms: updated,
            expires_at_ms: expires,
        })
    };
    Ok((rowid, build()))
}

/// Decodes a memory row as the store selects it (`COLUMNS`): any stored values, corrupt
/// or not, give a record or an error. For the fuzz targets.
pub fn decode_memory_row(row: &Row<'_>) -> Result<MemoryRecord> {
    decode(row).map_err(|e| corrupt("memory row", e))?.1
}

fn current(conn: &Connection, namespace_key: &str, key: &str) -> Result<Option<Raw>> {
    let found = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM harness_memories WHERE namespace_key = ?1 AND memory_key = ?2"
        ))
        .ctx("preparing the memory read")?
        .query_row(params![namespace_key, key], decode)
        .optional()
        .ctx("reading a memory")?;
    match found {
        None => Ok(None),
        Some((rowid, record)) => Ok(Some(Raw {
            rowid,
            record: record?,
        })),
    }
}

fn expired(record: &MemoryRecord, now_ms: i64) -> bool {
    record.expires_at_ms.is_some_and(|at| at <= now_ms)
}

thread_local! {
    /// Vector changes of the writer's current group, in order (writer thread only).
    static STAGED: RefCell<Vec<Change<i64>>> = const { RefCell::new(Vec::new()) };
}

fn stage(change: Change<i64>) {
    STAGED.with(|s| s.borrow_mut().push(change));
}

/// Passes the vector changes of each durable group to the index.
pub(super) struct VectorHook(pub Arc<VectorIndex<i64>>);

impl GroupHook for VectorHook {
    fn mark(&self) -> usize {
        STAGED.with(|s| s.borrow().len())
    }
    fn rollback_to(&self, mark: usize) {
        STAGED.with(|s| s.borrow_mut().truncate(mark));
    }
    fn committed(&self) {
        let changes = STAGED.with(|s| std::mem::take(&mut *s.borrow_mut()));
        if !changes.is_empty() {
            self.0.apply(changes);
        }
    }
    fn lost(&self) {
        STAGED.with(|s| s.borrow_mut().clear());
    }
}

/// Inserts or replaces (by rowid) a record and keeps the FTS row in step.
fn write_row(conn: &Connection, rowid: Option<i64>, r: &MemoryRecord) -> Result<i64> {
    let meta = serde_json::to_string(&Meta {
        provenance: r.provenance.clone(),
        approval: r.approval.clone(),
        classification: r.classification.clone(),
        source_revisions: r.source_revisions.clone(),
    })
    .map_err(|e| corrupt("memory metadata", e))?;
    let revision = sql_int("memory revision", r.revision)?;
    let rowid: i64 = conn
        .prepare_cached(
            "INSERT INTO harness_memories (rowid, id, environment_id, scope, namespace_key, agent_id, subject_ref, kind, memory_key, approval_status, revision, importance, retention_policy, review_required, source_binding_id, source_run_id, content_hash, media_type, created_at_ms, updated_at_ms, expires_at_ms, meta_json, embedding, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)
             ON CONFLICT (rowid) DO UPDATE SET kind = excluded.kind, approval_status = excluded.approval_status, revision = excluded.revision, importance = excluded.importance, retention_policy = excluded.retention_policy, review_required = excluded.review_required, source_binding_id = excluded.source_binding_id, source_run_id = excluded.source_run_id, content_hash = excluded.content_hash, media_type = excluded.media_type, updated_at_ms = excluded.updated_at_ms, expires_at_ms = excluded.expires_at_ms, meta_json = excluded.meta_json, embedding = excluded.embedding, body = excluded.body
             RETURNING rowid",
        )
        .ctx("preparing the memory write")?
        .query_row(
            params![
                rowid,
                r.id,
                r.namespace.environment,
                scope_str(r.namespace.scope),
                r.namespace.key,
                r.namespace.agent_id,
                r.namespace.subject_ref,
                kind_str(r.kind),
                r.memory_key,
                r.approval_status.as_str(),
                revision,
                f64::from(r.importance),
                r.retention_policy,
                i64::from(r.review_required),
                r.provenance.source_binding_id,
                r.provenance.source_run_id,
                r.content_hash,
                r.media_type,
                r.created_at_ms,
                r.updated_at_ms,
                r.expires_at_ms,
                meta,
                embedding_blob(&r.embedding),
                r.body,
            ],
            |row| row.get(0),
        )
        .ctx("writing a memory")?;
    index(conn, rowid, r)?;
    stage(Change::of_write(rowid, r));
    Ok(rowid)
}

/// Keeps the FTS row of `rowid` equal to the record: present only while admitted.
fn index(conn: &Connection, rowid: i64, r: &MemoryRecord) -> Result<()> {
    unindex(conn, rowid)?;
    if r.approval_status.searchable() {
        conn.prepare_cached("INSERT INTO harness_memories_fts (rowid, text) VALUES (?1, ?2)")
            .ctx("preparing the memory index write")?
            .execute(params![
                rowid,
                qualified_text(&r.namespace.key, &r.index_text())
            ])
            .ctx("indexing a memory")?;
    }
    Ok(())
}

fn unindex(conn: &Connection, rowid: i64) -> Result<()> {
    conn.prepare_cached("DELETE FROM harness_memories_fts WHERE rowid = ?1")
        .ctx("preparing the memory index delete")?
        .execute([rowid])
        .ctx("unindexing a memory")?;
    Ok(())
}

fn delete_row(conn: &Connection, rowid: i64) -> Result<()> {
    unindex(conn, rowid)?;
    conn.prepare_cached("DELETE FROM harness_memories WHERE rowid = ?1")
        .ctx("preparing the memory delete")?
        .execute([rowid])
        .ctx("deleting a memory")?;
    stage(Change::removal(rowid));
    Ok(())
}

fn audit_write(
    conn: &Connection,
    outcome: WriteOutcomeKind,
    r: &MemoryRecord,
    actor: &str,
    at: i64,
) -> Result<()> {
    audit(
        conn,
        at,
        audit_action(outcome),
        r.provenance.source_binding_id.as_deref(),
        &audit_detail(outcome, r, actor),
    )
}

/// Removes an expired record found on the write path (the sweep would have), audited.
fn drop_expired(conn: &Connection, raw: Raw, now_ms: i64) -> Result<()> {
    delete_row(conn, raw.rowid)?;
    audit(
        conn,
        now_ms,
        "memory.expire",
        raw.record.provenance.source_binding_id.as_deref(),
        &serde_json::json!({"memory_id": raw.record.id, "revision": raw.record.revision, "retention_policy": raw.record.retention_policy}),
    )
}

pub(super) fn get(
    conn: &Connection,
    ns: &Namespace,
    key: &str,
    include_unadmitted: bool,
    now_ms: i64,
) -> Result<Option<MemoryRecord>> {
    Ok(current(conn, &ns.key, key)?
        .map(|raw| raw.record)
        .filter(|r| !expired(r, now_ms) && (include_unadmitted || r.approval_status.searchable())))
}

pub(super) fn list(
    conn: &Connection,
    ns: &Namespace,
    after_key: Option<&str>,
    limit: usize,
    include_unadmitted: bool,
    now_ms: i64,
) -> Result<Vec<MemoryRecord>> {
    let limit = i64::try_from(limit.min(crate::store::memory::MAX_LIST)).unwrap_or(0);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM harness_memories
             WHERE namespace_key = ?1 AND memory_key > ?2
               AND (expires_at_ms IS NULL OR expires_at_ms > ?3)
               AND (?4 OR approval_status IN ('approved', 'not_required'))
             ORDER BY memory_key LIMIT ?5"
        ))
        .ctx("preparing the memory listing")?;
    let rows = stmt
        .query_map(
            params![
                ns.key,
                after_key.unwrap_or(""),
                now_ms,
                include_unadmitted,
                limit
            ],
            decode,
        )
        .ctx("listing memories")?;
    let mut out = Vec::new();
    for row in rows {
        let (_, record) = row.ctx("listing memories")?;
        out.push(record?);
    }
    Ok(out)
}

pub(super) fn count(
    conn: &Connection,
    ns: &Namespace,
    now_ms: i64,
) -> Result<BTreeMap<String, u64>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT approval_status, COUNT(*) FROM harness_memories
             WHERE namespace_key = ?1 AND (expires_at_ms IS NULL OR expires_at_ms > ?2)
             GROUP BY approval_status",
        )
        .ctx("preparing the memory count")?;
    let rows = stmt
        .query_map(params![ns.key, now_ms], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })
        .ctx("counting memories")?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (status, n) = row.ctx("counting memories")?;
        out.insert(status, u64::try_from(n).unwrap_or(0));
    }
    Ok(out)
}

pub(super) fn put(conn: &Connection, put: &MemoryPut) -> Result<MemoryWriteOutcome> {
    if let Some(scope) = &put.fence {
        super::admit(conn, &super::ScopeKey::of(scope))?;
    }
    let ns = &put.record.namespace;
    let now = put.record.updated_at_ms;
    let mut existing = current(conn, &ns.key, &put.record.memory_key)?;
    if let Some(raw) = existing.take_if(|raw| expired(&raw.record, now)) {
        drop_expired(conn, raw, now)?;
    }
    let (next, outcome) = match plan_put(existing.as_ref().map(|r| &r.record), put)? {
        PutPlan::Write(next, outcome) => (next, outcome),
        PutPlan::Replay(original) => return Ok(original),
    };
    write_row(conn, existing.map(|r| r.rowid), &next)?;
    audit_write(conn, outcome, &next, &next.provenance.writer, now)?;
    Ok(MemoryWriteOutcome {
        outcome,
        record: next,
        replayed: false,
    })
}

pub(super) fn delete(
    conn: &Connection,
    ns: &Namespace,
    key: &str,
    expected_revision: u64,
    actor: &str,
    now_ms: i64,
) -> Result<MemoryWriteOutcome> {
    let existing = current(conn, &ns.key, key)?.filter(|raw| !expired(&raw.record, now_ms));
    let record = plan_delete(existing.as_ref().map(|r| &r.record), key, expected_revision)?;
    if let Some(raw) = existing {
        delete_row(conn, raw.rowid)?;
    }
    audit_write(conn, WriteOutcomeKind::Deleted, &record, actor, now_ms)?;
    Ok(MemoryWriteOutcome {
        outcome: WriteOutcomeKind::Deleted,
        record,
        replayed: false,
    })
}

pub(super) fn decide(
    conn: &Connection,
    ns: &Namespace,
    key: &str,
    d: &MemoryDecision,
) -> Result<MemoryWriteOutcome> {
    let existing = current(conn, &ns.key, key)?.filter(|raw| !expired(&raw.record, d.at_ms));
    let (next, outcome) = plan_decision(existing.as_ref().map(|r| &r.record), key, d)?;
    write_row(conn, existing.map(|r| r.rowid), &next)?;
    audit_write(conn, outcome, &next, &d.decided_by, d.at_ms)?;
    Ok(MemoryWriteOutcome {
        outcome,
        record: next,
        replayed: false,
    })
}

/// The FTS5 query for `terms` in one namespace: its namespace-qualified terms, OR-ed.
/// Terms are alphanumeric (from `rank::query_terms`), quoted anyway so no term can be
/// read as FTS syntax; one the FTS tokenizer splits becomes a phrase of its pieces,
/// exactly as it was indexed.
fn match_expression(namespace_key: &str, terms: &[String]) -> Option<String> {
    let q = qualifier(namespace_key);
    let quoted: Vec<String> = terms
        .iter()
        .filter(|t| t.chars().all(char::is_alphanumeric))
        .map(|t| format!("\"{q}{t}\""))
        .collect();
    if quoted.is_empty() {
        return None;
    }
    Some(quoted.join(" OR "))
}

/// Builds the namespace's vector index from the rows, if it is not built yet. `space`
/// must have been registered before this read's transaction began.
fn build_vectors(conn: &Connection, ns: &Namespace, space: &Space<i64>) -> Result<()> {
    if space.built().is_some() {
        return Ok(());
    }
    let loaded = conn
        .prepare_cached(
            "SELECT rowid, embedding FROM harness_memories INDEXED BY harness_memories_listing
             WHERE namespace_key = ?1 AND approval_status IN ('approved', 'not_required')
             AND embedding IS NOT NULL",
        )
        .ctx("preparing the vector index read")?
        .query_map([&ns.key], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Option<Vec<u8>>>(1)?))
        })
        .ctx("reading a namespace's embeddings")?
        .filter_map(|row| match row {
            Ok((rowid, blob)) => embedding_of(blob).map(|v| Ok((rowid, v))),
            Err(e) => Some(Err(e)),
        })
        .collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading a namespace's embeddings")?;
    space.install(loaded, None);
    Ok(())
}

pub(super) fn candidates(
    conn: &Connection,
    ns: &Namespace,
    q: &CandidateQuery,
    space: Option<&Space<i64>>,
) -> Result<Vec<Candidate>> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let keep = |r: &MemoryRecord| {
        r.namespace.key == ns.key
            && r.approval_status.searchable()
            && !expired(r, q.now_ms)
            && (q.kinds.is_empty() || q.kinds.contains(&r.kind))
    };
    if let Some(expr) = match_expression(&ns.key, &q.terms) {
        let limit = i64::try_from(q.lexical_limit).unwrap_or(i64::MAX);
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {cols}, c.score FROM (
                     SELECT rowid AS rid, -rank AS score
                     FROM harness_memories_fts WHERE harness_memories_fts MATCH ?1
                     ORDER BY rank LIMIT ?2
                 ) c JOIN harness_memories m ON m.rowid = c.rid
                 WHERE m.namespace_key = ?3",
                cols = COLUMNS
                    .split(", ")
                    .map(|c| format!("m.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .ctx("preparing the memory search")?;
        let rows = stmt
            .query_map(params![expr, limit, ns.key], |row| {
                Ok((decode(row)?, row.get::<_, f64>(22)?))
            })
            .ctx("searching memory")?;
        for row in rows {
            let ((rowid, record), score) = row.ctx("reading a memory candidate")?;
            let record = record?;
            if keep(&record) && seen.insert(rowid) {
                out.push(Candidate {
                    record,
                    lexical: score.max(0.0),
                });
            }
        }
    }
    if let (Some(space), Some(query)) = (space, q.embedding.as_deref())
        && q.vector_limit > 0
    {
        build_vectors(conn, ns, space)?;
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM harness_memories WHERE rowid = ?1"
            ))
            .ctx("preparing the nearest-memory read")?;
        // The nearest that pass the filters (kinds, expiry), widening the look while
        // the filters drop too many (see `vectors::widen`).
        let mut looked = std::collections::HashSet::new();
        let mut taken = 0;
        for asked in vectors::widen(q.vector_limit) {
            let nearest = space.nearest(query, asked);
            let exhausted = nearest.len() < asked;
            for rowid in nearest {
                if taken >= q.vector_limit {
                    break;
                }
                if !looked.insert(rowid) {
                    continue;
                }
                if seen.contains(&rowid) {
                    taken += 1;
                    continue;
                }
                // A row deleted since the index saw it is simply gone.
                let Some((rowid, record)) = stmt
                    .query_row([rowid], decode)
                    .optional()
                    .ctx("reading a nearest memory")?
                else {
                    continue;
                };
                let record = record?;
                if keep(&record) && seen.insert(rowid) {
                    taken += 1;
                    out.push(Candidate {
                        record,
                        lexical: 0.0,
                    });
                }
            }
            if taken >= q.vector_limit || exhausted {
                break;
            }
        }
    }
    Ok(out)
}

/// One batch of the expiry sweep; returns what it removed by policy (empty: done).
pub(super) fn sweep_batch(conn: &Connection, now_ms: i64) -> Result<BTreeMap<String, u64>> {
    let expired: Vec<(i64, String)> = conn
        .prepare_cached(
            "SELECT rowid, retention_policy FROM harness_memories INDEXED BY harness_memories_expiry
             WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1 LIMIT ?2",
        )
        .ctx("preparing the memory expiry scan")?
        .query_map(params![now_ms, SWEEP_BATCH], |r| Ok((r.get(0)?, r.get(1)?)))
        .ctx("scanning expired memories")?
        .collect::<rusqlite::Result<_>>()
        .ctx("scanning expired memories")?;
    let mut by_policy = BTreeMap::new();
    for (rowid, policy) in expired {
        delete_row(conn, rowid)?;
        *by_policy.entry(policy).or_insert(0u64) += 1;
    }
    Ok(by_policy)
}

pub(super) fn sweep_audit(conn: &Connection, report: &MemorySweepReport) -> Result<()> {
    audit(
        conn,
        report.swept_at_ms,
        "memory.sweep",
        None,
        &serde_json::to_value(report).map_err(|e| corrupt("sweep report", e))?,
    )
}

pub(super) fn revoke_source(
    conn: &Connection,
    source: &str,
    actor: &str,
    now_ms: i64,
) -> Result<u64> {
    let rows: Vec<(i64, Result<MemoryRecord>)> = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM harness_memories INDEXED BY harness_memories_source
             WHERE source_binding_id = ?1 AND kind = ?2 AND approval_status != 'revoked'"
        ))
        .ctx("preparing the revocation scan")?
        .query_map(
            params![source, kind_str(MemoryKind::EpisodicReference)],
            decode,
        )
        .ctx("scanning a source's memories")?
        .collect::<rusqlite::Result<_>>()
        .ctx("scanning a source's memories")?;
    let mut n = 0u64;
    for (rowid, record) in rows {
        let next = plan_revocation(&record?, actor, now_ms);
        write_row(conn, Some(rowid), &next)?;
        n += 1;
    }
    audit(
        conn,
        now_ms,
        "memory.revoke_source",
        Some(source),
        &serde_json::json!({"episodic_references_revoked": n, "actor": actor}),
    )?;
    Ok(n)
}

pub(super) fn load(conn: &Connection, records: &[MemoryRecord]) -> Result<u64> {
    for r in records {
        if r.revision == 0 {
            return Err(Rejection::Invalid("a loaded memory needs a revision".into()).into());
        }
        write_row(conn, None, r)?;
    }
    Ok(records.len() as u64)
}
