//! `harness_memories` on MongoDB and FerretDB (`spec/001_78d7ff78f70a2a2a.txt` §5).
//!
//! One document per record, `_id` = the record id (a digest of namespace and key), so
//! every compare-and-set is a conditional write by `_id` with the revision in the filter
//! ([`super::atomic`]), which FerretDB v1 serves from its index and which the store
//! serializes in-process in FerretDB mode. Each document also carries `terms`, the
//! distinct lexical terms of its text: a search asks for
//! `{namespace_key: <ns>, approval_status: admitted, terms: {$in: query terms}}`, so
//! the namespace is in the query itself; BM25 is then computed in process over exactly
//! those documents, with the namespace's own document count ([`rank::bm25`]). No text
//! index is assumed (FerretDB v1 has none), and no TTL index: expiry is the sweep.

use std::collections::HashSet;

use futures::TryStreamExt;
use mongodb::{
    IndexModel,
    bson::{self, Bson, DateTime, Document, doc},
    options::IndexOptions,
};
use serde::{Deserialize, Serialize};

use super::{
    CAS_ATTEMPTS, MongoContext, MongoStore, corrupt, int, is_duplicate_key, layout::dt, uint,
};
use crate::{
    domain::{
        ids::BindingId,
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
            audit_detail, plan_decision, plan_delete, plan_put, plan_revocation, source_binding,
        },
        vectors::{self, Change, Space},
    },
};

pub(super) const MEMORIES: &str = "harness_memories";
const IDX_IDENTITY: &str = "environment_scope_namespace_agent_kind_key_unique";
const IDX_LISTING: &str = "environment_scope_namespace_agent_updated_desc";
const IDX_SOURCE: &str = "provenance_source_binding_run";
const IDX_TERMS: &str = "namespace_terms";
const IDX_EXPIRY: &str = "expires_at";
const IDX_BY_KEY: &str = "namespace_key";

/// Most documents one search examines for lexical scoring.
const MAX_LEXICAL_SCAN: i64 = 10_000;
/// Expired documents examined per sweep round trip.
const SWEEP_BATCH: i64 = 500;
/// A namespace's vector index is rebuilt from the collection when it is this old, so
/// writes of other processes reach it (this process's own writes reach it at once).
const VECTORS_REBUILD_AFTER: std::time::Duration = std::time::Duration::from_secs(60);
/// Most recently updated records added to vector candidates: what other processes wrote
/// since the index was built.
const RECENT_FOR_VECTORS: i64 = 256;

/// Documents per `insertMany` of a bulk load.
const LOAD_BATCH: usize = 1_000;
const SCHEMA_VERSION: i32 = 1;

#[derive(Serialize, Deserialize)]
struct ContentRef {
    kind: String,
    media_type: String,
    body: String,
}

/// The stored document (`spec/001` §5 field names).
#[derive(Serialize, Deserialize)]
struct MemoryDoc {
    #[serde(rename = "_id")]
    id: String,
    schema_version: i32,
    environment_id: String,
    scope: String,
    namespace_key: String,
    agent_id: String,
    subject_ref: Option<String>,
    kind: String,
    memory_key: String,
    content_ref: ContentRef,
    content_hash: String,
    provenance: Provenance,
    approval_status: String,
    approval: ApprovalRecord,
    classification: Classification,
    importance: f64,
    embedding: Option<Vec<f64>>,
    revision: i64,
    source_revisions: Vec<i64>,
    retention_policy: String,
    review_required: bool,
    created_at: DateTime,
    updated_at: DateTime,
    expires_at: Option<DateTime>,
    terms: Vec<String>,
}

fn to_doc(r: &MemoryRecord) -> Result<Document> {
    let mut terms = rank::tokenize(&r.index_text());
    terms.sort_unstable();
    terms.dedup();
    let d = MemoryDoc {
        id: r.id.clone(),
        schema_version: SCHEMA_VERSION,
        environment_id: r.namespace.environment.clone(),
        scope: scope_str(r.namespace.scope).into(),
        namespace_key: r.namespace.key.clone(),
        agent_id: r.namespace.agent_id.clone(),
        subject_ref: r.namespace.subject_ref.clone(),
        kind: kind_str(r.kind).into(),
        memory_key: r.memory_key.clone(),
        content_ref: ContentRef {
            kind: "inline".into(),
            media_type: r.media_type.clone(),
            body: r.body.clone(),
        },
        content_hash: r.content_hash.clone(),
        provenance: r.provenance.clone(),
        approval_status: r.approval_status.as_str().into(),
        approval: r.approval.clone(),
        classification: r.classification.clone(),
        importance: f64::from(r.importance),
        embedding: r
            .embedding
            .as_ref()
            .map(|e| e.iter().map(|x| f64::from(*x)).collect()),
        revision: int("memory revision", r.revision)?,
        source_revisions: r
            .source_revisions
            .iter()
            .map(|s| int("source revision", *s))
            .collect::<Result<_>>()?,
        retention_policy: r.retention_policy.clone(),
        review_required: r.review_required,
        created_at: dt(r.created_at_ms),
        updated_at: dt(r.updated_at_ms),
        expires_at: r.expires_at_ms.map(dt),
        terms,
    };
    bson::to_document(&d).map_err(|e| corrupt("memory document", e))
}

/// Decodes a stored memory document from its BSON bytes, as a read does (for the fuzz
/// targets and tests: a corrupt document is an error, never a panic).
pub fn decode_memory_document(bytes: &[u8]) -> Result<MemoryRecord> {
    let d = Document::from_reader(bytes).map_err(|e| corrupt("memory document", e))?;
    from_doc(d)
}

fn from_doc(d: Document) -> Result<MemoryRecord> {
    let d: MemoryDoc = bson::from_document(d).map_err(|e| corrupt("memory document", e))?;
    Ok(MemoryRecord {
        id: d.id,
        namespace: Namespace {
            environment: d.environment_id,
            scope: parse_scope(&d.scope).ok_or_else(|| corrupt("memory scope", &d.scope))?,
            key: d.namespace_key,
            agent_id: d.agent_id,
            subject_ref: d.subject_ref,
        },
        kind: parse_kind(&d.kind).ok_or_else(|| corrupt("memory kind", &d.kind))?,
        memory_key: d.memory_key,
        media_type: d.content_ref.media_type,
        body: d.content_ref.body,
        content_hash: d.content_hash,
        provenance: d.provenance,
        approval_status: ApprovalStatus::parse(&d.approval_status)
            .ok_or_else(|| corrupt("approval status", &d.approval_status))?,
        approval: d.approval,
        classification: d.classification,
        importance: d.importance as f32,
        embedding: d
            .embedding
            .map(|e| e.into_iter().map(|x| x as f32).collect()),
        revision: uint("memory revision", d.revision)?,
        source_revisions: d
            .source_revisions
            .into_iter()
            .map(|s| uint("source revision", s))
            .collect::<Result<_>>()?,
        retention_policy: d.retention_policy,
        review_required: d.review_required,
        created_at_ms: d.created_at.timestamp_millis(),
        updated_at_ms: d.updated_at.timestamp_millis(),
        expires_at_ms: d.expires_at.map(|t| t.timestamp_millis()),
    })
}

fn expired(r: &MemoryRecord, now_ms: i64) -> bool {
    r.expires_at_ms.is_some_and(|at| at <= now_ms)
}

fn admitted() -> Bson {
    Bson::Document(doc! { "$in": ["approved", "not_required"] })
}

impl MongoStore {
    pub(super) async fn create_memory_indexes(&self) -> Result<()> {
        let index = |keys: Document, name: &str, unique: bool| {
            let mut options = IndexOptions::builder().name(name.to_owned()).build();
            if unique {
                options.unique = Some(true);
            }
            IndexModel::builder().keys(keys).options(options).build()
        };
        for model in [
            index(
                doc! { "environment_id": 1, "scope": 1, "namespace_key": 1, "agent_id": 1, "kind": 1, "memory_key": 1 },
                IDX_IDENTITY,
                true,
            ),
            index(
                doc! { "environment_id": 1, "scope": 1, "namespace_key": 1, "agent_id": 1, "updated_at": -1 },
                IDX_LISTING,
                false,
            ),
            index(
                doc! { "provenance.source_binding_id": 1, "provenance.source_run_id": 1 },
                IDX_SOURCE,
                false,
            ),
            // spec 001 §5 index 5: a search index must start with the namespace.
            index(doc! { "namespace_key": 1, "terms": 1 }, IDX_TERMS, false),
            // Listing by key (browse, export).
            index(
                doc! { "namespace_key": 1, "memory_key": 1 },
                IDX_BY_KEY,
                false,
            ),
            index(doc! { "expires_at": 1 }, IDX_EXPIRY, false),
        ] {
            self.memories
                .create_index(model)
                .await
                .ctx("creating the harness_memories indexes")?;
        }
        Ok(())
    }

    /// The in-process lock of one record in FerretDB mode (see `MongoOptions::ferretdb`).
    async fn memory_lock(&self, id: &str) -> Option<futures::lock::MutexGuard<'_, ()>> {
        let stripes = self.serial.as_ref()?;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(id, &mut hasher);
        let i =
            usize::try_from(std::hash::Hasher::finish(&hasher) % stripes.len() as u64).unwrap_or(0);
        Some(stripes.get(i)?.lock().await)
    }

    async fn read_memory(&self, id: &str) -> Result<Option<MemoryRecord>> {
        self.memories
            .find_one(doc! { "_id": id })
            .await
            .ctx("reading a memory")?
            .map(from_doc)
            .transpose()
    }

    async fn audit_memory(
        &self,
        outcome: WriteOutcomeKind,
        r: &MemoryRecord,
        actor: &str,
    ) -> Result<()> {
        self.write_audit(
            audit_action(outcome),
            source_binding(r).as_ref(),
            &audit_detail(outcome, r, actor),
        )
        .await
    }

    /// Removes an expired record met on the write path, audited; `false`: it changed.
    async fn drop_expired(&self, r: &MemoryRecord) -> Result<bool> {
        let gone = self
            .delete_if(
                &self.memories,
                doc! { "_id": &r.id, "revision": int("revision", r.revision)? },
                "deleting an expired memory",
            )
            .await?;
        if gone {
            self.write_audit(
                "memory.expire",
                source_binding(r).as_ref(),
                &serde_json::json!({"memory_id": r.id, "revision": r.revision, "retention_policy": r.retention_policy}),
            )
            .await?;
        }
        Ok(gone)
    }

    /// Writes `next` over `current` (by revision) or inserts it; `false`: someone else
    /// moved first (retry from a fresh read).
    async fn swap(&self, current: Option<&MemoryRecord>, next: &MemoryRecord) -> Result<bool> {
        let swapped = self.swap_doc(current, next).await?;
        if swapped {
            self.vectors
                .apply([Change::of_write(next.id.clone(), next)]);
        }
        Ok(swapped)
    }

    async fn swap_doc(&self, current: Option<&MemoryRecord>, next: &MemoryRecord) -> Result<bool> {
        let replacement = to_doc(next)?;
        match current {
            Some(cur) => {
                self.replace_if(
                    &self.memories,
                    doc! { "_id": &cur.id, "revision": int("revision", cur.revision)? },
                    replacement,
                    "writing a memory",
                )
                .await
            }
            None => match self.memories.insert_one(replacement).await {
                Ok(_) => Ok(true),
                Err(e) if is_duplicate_key(&e) => Ok(false),
                Err(e) => Err(e).ctx("creating a memory"),
            },
        }
    }

    pub(super) async fn get_memory_impl(
        &self,
        ns: &Namespace,
        key: &str,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Option<MemoryRecord>> {
        Ok(self.read_memory(&ns.record_id(key)).await?.filter(|r| {
            r.namespace.key == ns.key
                && !expired(r, now_ms)
                && (include_unadmitted || r.approval_status.searchable())
        }))
    }

    pub(super) async fn put_memory_impl(&self, put: &MemoryPut) -> Result<MemoryWriteOutcome> {
        let id = put.record.id.clone();
        let now = put.record.updated_at_ms;
        let _guard = self.memory_lock(&id).await;
        if let Some(scope) = &put.fence {
            self.admit(scope).await?;
        }
        for _ in 0..CAS_ATTEMPTS {
            let mut current = self.read_memory(&id).await?;
            if let Some(cur) = current.take_if(|c| expired(c, now))
                && !self.drop_expired(&cur).await?
            {
                continue;
            }
            let (next, outcome) = match plan_put(current.as_ref(), put)? {
                PutPlan::Write(next, outcome) => (next, outcome),
                PutPlan::Replay(original) => return Ok(original),
            };
            if self.swap(current.as_ref(), &next).await? {
                self.audit_memory(outcome, &next, &next.provenance.writer)
                    .await?;
                return Ok(MemoryWriteOutcome {
                    outcome,
                    record: next,
                    replayed: false,
                });
            }
        }
        let actual = self.read_memory(&id).await?.map_or(0, |r| r.revision);
        Err(Rejection::RevisionConflict {
            expected: put.expected_revision.unwrap_or(0),
            actual,
        }
        .into())
    }

    pub(super) async fn delete_memory_impl(
        &self,
        ns: &Namespace,
        key: &str,
        expected_revision: u64,
        actor: &str,
    ) -> Result<MemoryWriteOutcome> {
        let id = ns.record_id(key);
        let _guard = self.memory_lock(&id).await;
        let current = self
            .read_memory(&id)
            .await?
            .filter(|r| !expired(r, crate::store::now_ms()));
        let record = plan_delete(current.as_ref(), key, expected_revision)?;
        let gone = self
            .delete_if(
                &self.memories,
                doc! { "_id": &id, "revision": int("revision", expected_revision)? },
                "deleting a memory",
            )
            .await?;
        if gone {
            self.vectors.apply([Change::removal(id.clone())]);
        } else {
            let actual = self.read_memory(&id).await?.map_or(0, |r| r.revision);
            return Err(Rejection::RevisionConflict {
                expected: expected_revision,
                actual,
            }
            .into());
        }
        self.audit_memory(WriteOutcomeKind::Deleted, &record, actor)
            .await?;
        Ok(MemoryWriteOutcome {
            outcome: WriteOutcomeKind::Deleted,
            record,
            replayed: false,
        })
    }

    pub(super) async fn decide_memory_impl(
        &self,
        ns: &Namespace,
        key: &str,
        d: &MemoryDecision,
    ) -> Result<MemoryWriteOutcome> {
        let id = ns.record_id(key);
        let _guard = self.memory_lock(&id).await;
        let current = self
            .read_memory(&id)
            .await?
            .filter(|r| !expired(r, d.at_ms));
        let (next, outcome) = plan_decision(current.as_ref(), key, d)?;
        if !self.swap(current.as_ref(), &next).await? {
            let actual = self.read_memory(&id).await?.map_or(0, |r| r.revision);
            return Err(Rejection::RevisionConflict {
                expected: d.expected_revision,
                actual,
            }
            .into());
        }
        self.audit_memory(outcome, &next, &d.decided_by).await?;
        Ok(MemoryWriteOutcome {
            outcome,
            record: next,
            replayed: false,
        })
    }

    async fn find_memories(
        &self,
        filter: Document,
        sort: Option<Document>,
        limit: i64,
    ) -> Result<Vec<MemoryRecord>> {
        let mut find = self.memories.find(filter).limit(limit);
        if let Some(sort) = sort {
            find = find.sort(sort);
        }
        let docs: Vec<Document> = find
            .await
            .ctx("searching memory")?
            .try_collect()
            .await
            .ctx("searching memory")?;
        docs.into_iter().map(from_doc).collect()
    }

    pub(super) async fn list_memories_impl(
        &self,
        ns: &Namespace,
        after_key: Option<&str>,
        limit: usize,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Vec<MemoryRecord>> {
        let limit = limit.min(crate::store::memory::MAX_LIST);
        let mut filter = doc! {
            "namespace_key": &ns.key,
            "memory_key": { "$gt": after_key.unwrap_or("") },
        };
        if !include_unadmitted {
            filter.insert("approval_status", admitted());
        }
        // Expired records are filtered here rather than in the query: a sweep removes
        // them soon, and `expires_at` is absent on most records.
        let mut out = Vec::new();
        let mut after = after_key.unwrap_or("").to_owned();
        while out.len() < limit {
            filter.insert("memory_key", doc! { "$gt": &after });
            let want = i64::try_from(limit - out.len()).unwrap_or(0);
            let page = self
                .find_memories(filter.clone(), Some(doc! { "memory_key": 1 }), want)
                .await?;
            let Some(last) = page.last().map(|r| r.memory_key.clone()) else {
                break;
            };
            let full = page.len() as i64 == want;
            out.extend(page.into_iter().filter(|r| !expired(r, now_ms)));
            if !full {
                break;
            }
            after = last;
        }
        Ok(out)
    }

    pub(super) async fn count_memories_impl(
        &self,
        ns: &Namespace,
        now_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, u64>> {
        let mut out = std::collections::BTreeMap::new();
        for status in ["not_required", "pending", "approved", "rejected", "revoked"] {
            let n = self
                .memories
                .count_documents(doc! {
                    "namespace_key": &ns.key,
                    "approval_status": status,
                    "$or": [
                        { "expires_at": Bson::Null },
                        { "expires_at": { "$gt": DateTime::from_millis(now_ms) } },
                    ],
                })
                .await
                .ctx("counting memories")?;
            if n > 0 {
                out.insert(status.to_owned(), n);
            }
        }
        Ok(out)
    }

    pub(super) async fn memory_candidates_impl(
        &self,
        ns: &Namespace,
        q: &CandidateQuery,
    ) -> Result<Vec<Candidate>> {
        let keep = |r: &MemoryRecord| {
            r.namespace.key == ns.key
                && r.approval_status.searchable()
                && !expired(r, q.now_ms)
                && (q.kinds.is_empty() || q.kinds.contains(&r.kind))
        };
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        if !q.terms.is_empty() {
            let found = self
                .find_memories(
                    doc! { "namespace_key": &ns.key, "approval_status": admitted(), "terms": { "$in": &q.terms } },
                    None,
                    MAX_LEXICAL_SCAN,
                )
                .await?;
            // The namespace's size (BM25's N) only matters when something matched.
            let namespace_docs = if found.is_empty() {
                0
            } else {
                self.memories
                    .count_documents(
                        doc! { "namespace_key": &ns.key, "approval_status": admitted() },
                    )
                    .await
                    .ctx("counting a memory namespace")?
            };
            let texts: Vec<String> = found.iter().map(MemoryRecord::index_text).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let scores = rank::bm25(&q.terms, &refs, namespace_docs);
            let mut scored: Vec<(f64, MemoryRecord)> = scores
                .into_iter()
                .zip(found)
                .filter(|(s, r)| *s > 0.0 && keep(r))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
            scored.truncate(q.lexical_limit);
            for (lexical, record) in scored {
                seen.insert(record.id.clone());
                out.push(Candidate { record, lexical });
            }
        }
        if let Some(query) = q.embedding.as_deref()
            && q.vector_limit > 0
        {
            let space = self.vectors.space(&ns.key);
            let stale = space
                .built()
                .is_none_or(|at| at.elapsed() >= VECTORS_REBUILD_AFTER);
            if stale {
                self.build_vectors(ns, &space).await?;
            }
            // The nearest that pass the filters (kinds, expiry), widening the look
            // while the filters drop too many (see `vectors::widen`).
            let mut looked = HashSet::new();
            let mut taken = 0;
            for asked in vectors::widen(q.vector_limit) {
                let nearest = space.nearest(query, asked);
                let exhausted = nearest.len() < asked;
                let mut ids = Vec::new();
                for id in nearest {
                    if !looked.insert(id.clone()) {
                        continue;
                    }
                    if seen.contains(&id) {
                        taken += 1;
                    } else {
                        ids.push(id);
                    }
                }
                if !ids.is_empty() {
                    // By id: one `$in` on MongoDB, point reads on FerretDB (which scans
                    // the whole collection for an `$in`).
                    let mut nearest = self
                        .find_by_ids(&self.memories, &ids, doc! {})
                        .await?
                        .into_values()
                        .map(from_doc)
                        .collect::<Result<Vec<_>>>()?;
                    // In the index's order, for the same candidates whatever order the
                    // server returns them in.
                    let order: std::collections::HashMap<&str, usize> = ids
                        .iter()
                        .enumerate()
                        .map(|(i, id)| (id.as_str(), i))
                        .collect();
                    nearest.sort_by_key(|r| order.get(r.id.as_str()).copied());
                    for record in nearest {
                        if taken >= q.vector_limit {
                            break;
                        }
                        if keep(&record) && seen.insert(record.id.clone()) {
                            taken += 1;
                            out.push(Candidate {
                                record,
                                lexical: 0.0,
                            });
                        }
                    }
                }
                if taken >= q.vector_limit || exhausted {
                    break;
                }
            }
            // The namespace key determines the environment, scope and agent; naming them
            // lets the listing index serve the filter and the sort (a namespace can hold
            // 100,000 records: no in-memory sort of all of them).
            let recent = self
                .find_memories(
                    doc! {
                        "environment_id": &ns.environment,
                        "scope": scope_str(ns.scope),
                        "namespace_key": &ns.key,
                        "agent_id": &ns.agent_id,
                        "approval_status": admitted(),
                    },
                    Some(doc! { "updated_at": -1 }),
                    RECENT_FOR_VECTORS,
                )
                .await?;
            for record in recent {
                if keep(&record) && seen.insert(record.id.clone()) {
                    out.push(Candidate {
                        record,
                        lexical: 0.0,
                    });
                }
            }
        }
        Ok(out)
    }

    /// (Re)builds the namespace's vector index from the collection: its admitted records
    /// with an embedding. `space` is registered before the read, so writes of this
    /// process meanwhile are replayed onto it.
    async fn build_vectors(&self, ns: &Namespace, space: &Space<String>) -> Result<()> {
        let began = space.begin_build();
        let docs: Vec<Document> = self
            .memories
            .find(doc! {
                "namespace_key": &ns.key,
                "approval_status": admitted(),
                "embedding": { "$type": "array" },
            })
            .projection(doc! { "_id": 1, "embedding": 1 })
            .await
            .ctx("reading a namespace's embeddings")?
            .try_collect()
            .await
            .ctx("reading a namespace's embeddings")?;
        let loaded = docs
            .into_iter()
            .filter_map(|d| {
                let id = d.get_str("_id").ok()?.to_owned();
                let vector = d
                    .get_array("embedding")
                    .ok()?
                    .iter()
                    .map(|x| x.as_f64().map(|f| f as f32))
                    .collect::<Option<Vec<f32>>>()?;
                Some((id, vector))
            })
            .collect();
        space.install(loaded, Some(began));
        Ok(())
    }

    pub(super) async fn sweep_memory_impl(&self, now_ms: i64) -> Result<MemorySweepReport> {
        let mut report = MemorySweepReport {
            swept_at_ms: now_ms,
            ..Default::default()
        };
        loop {
            let batch = self
                .find_memories(
                    doc! { "expires_at": { "$lte": dt(now_ms) } },
                    None,
                    SWEEP_BATCH,
                )
                .await?;
            if batch.is_empty() {
                break;
            }
            let mut removed = 0;
            for r in batch {
                let _guard = self.memory_lock(&r.id).await;
                if self
                    .delete_if(
                        &self.memories,
                        doc! { "_id": &r.id, "revision": int("revision", r.revision)? },
                        "sweeping a memory",
                    )
                    .await?
                {
                    self.vectors.apply([Change::removal(r.id.clone())]);
                    removed += 1;
                    report.expired += 1;
                    *report
                        .by_policy
                        .entry(r.retention_policy.clone())
                        .or_insert(0) += 1;
                }
            }
            if removed == 0 {
                break;
            }
        }
        let detail = serde_json::to_value(&report).map_err(|e| corrupt("sweep report", e))?;
        self.write_audit("memory.sweep", None, &detail).await?;
        Ok(report)
    }

    pub(super) async fn revoke_memory_source_impl(
        &self,
        source: &BindingId,
        actor: &str,
        now_ms: i64,
    ) -> Result<u64> {
        let found = self
            .find_memories(
                doc! {
                    "provenance.source_binding_id": source.as_str(),
                    "kind": kind_str(MemoryKind::EpisodicReference),
                    "approval_status": { "$ne": "revoked" },
                },
                None,
                i64::MAX,
            )
            .await?;
        let mut n = 0u64;
        for record in found {
            let _guard = self.memory_lock(&record.id).await;
            let next = plan_revocation(&record, actor, now_ms);
            if self.swap(Some(&record), &next).await? {
                n += 1;
            }
        }
        self.write_audit(
            "memory.revoke_source",
            Some(source),
            &serde_json::json!({"episodic_references_revoked": n, "actor": actor}),
        )
        .await?;
        Ok(n)
    }

    pub(super) async fn load_memories_impl(&self, records: Vec<MemoryRecord>) -> Result<u64> {
        let mut n = 0u64;
        for chunk in records.chunks(LOAD_BATCH) {
            if chunk.iter().any(|r| r.revision == 0) {
                return Err(Rejection::Invalid("a loaded memory needs a revision".into()).into());
            }
            let docs = chunk.iter().map(to_doc).collect::<Result<Vec<_>>>()?;
            self.memories
                .insert_many(docs)
                .await
                .ctx("loading memories")?;
            self.vectors
                .apply(chunk.iter().map(|r| Change::of_write(r.id.clone(), r)));
            n += chunk.len() as u64;
        }
        Ok(n)
    }
}
