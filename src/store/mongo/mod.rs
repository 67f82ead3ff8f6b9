//! MongoDB backend, for teams that run MongoDB (`DESIGN.md` §7).
//!
//! Every compare-and-set is one single-document atomic update (`findAndModify`) with its
//! expectations (epoch, lease generation, revision, pending registration, interrupt id,
//! ...) in the filter; idempotency rests on deterministic document ids and unique
//! indexes. No multi-document transactions and no TTL indexes, so the store runs on a
//! standalone server, a replica set and a sharded cluster, and on FerretDB v1 (which
//! the tests use) in a compatibility mode that makes up for its non-atomic updates
//! ([`atomic`]). The document layout is in [`layout`].
//!
//! Sharding: shard `harness_session_state` by `{_id: 1}`. Its ids start with the binding
//! id, so one binding's documents stay together, every point read and conditional write
//! (all by `_id`) targets one shard, and no index there needs to be unique. Keep
//! `harness_sessions` unsharded (one small document per conversation), or shard it by
//! `{_id: 1}` after recreating its identity index without `unique` (MongoDB allows a
//! unique index on a sharded collection only when prefixed by the shard key; the `_id`
//! is a keyed digest of that identity, so only the guard against two keys deriving two
//! ids for one conversation is lost).
//!
//! Fencing. The fence lives in the binding document, so anything that changes that
//! document (the head commit, pending registrations, interrupts, uncertain runs) checks
//! the fence atomically in its own filter: exact. Writes to other documents (state
//! bodies, objects, stream entries) cannot be atomic with a check of another document
//! without transactions; they check the fence before writing, tag what they write with
//! epoch and lease generation, and re-check the fence afterwards, undoing their own
//! write when it moved ([`bindings`] explains the window that remains and why the head
//! is still exact).
//!
//! Durability: writes that carry the protocol (head commits, registrations, state
//! bodies, objects, entries, fence changes) use the configured write concern, by
//! default `{w: "majority", j: true}`. Bookkeeping writes whose loss is harmless use
//! `{w: 1}`: activity timestamps, object and stream counter reservations (a lost one
//! leaves a counter low by one until the next recount), and stream sequence
//! reservations. Each of these is followed, on the same primary, by a protocol write
//! (the document it reserved for), and replication applies the oplog in order, so once
//! that write is majority-acknowledged so is the reservation before it.

mod atomic;
mod bindings;
mod layout;
mod ledger;
mod memory;
pub use memory::decode_memory_document;
mod native;
mod retention;
mod state;

use std::{fmt::Display, time::Duration};

use async_trait::async_trait;
use mongodb::{
    Client, Collection, IndexModel,
    bson::{Document, doc},
    error::{ErrorKind, WriteFailure},
    options::{
        Acknowledgment, ClientOptions, CollectionOptions, IndexOptions, ReadPreference,
        SelectionCriteria, WriteConcern,
    },
};

use self::layout::{AUDIT, SESSIONS, STATE};
use crate::{
    domain::{
        ids::{BindingId, IdempotencyDigest},
        limits::{Limits, WriteRateLimiter},
        state::{
            BindingRecord, CommitRequest, DurableStateHead, Fence, PendingInterrupt,
            PendingStateRef, Rejection, ResumeOutcome, ResumeRequest, StateScope, UncertainRun,
        },
    },
    store::{
        AppendOutcome, AuditRecord, BindingStore, ClearReport, InterruptStore, NativeStore,
        NewEntry, ObjectMeta, ObjectQuery, PutMode, Result, RetentionPolicy, RetentionStore,
        StoreError, StoredEntry, StoredObject, StreamMeta, SweepReport, ThreadStateStore,
    },
};

const BACKEND: &str = "mongo";

/// MongoDB's duplicate-key error code (FerretDB reports the same).
const DUPLICATE_KEY: i32 = 11000;

/// Attempts of a compare-and-set whose filter missed although a re-read found every
/// expectation met (a concurrent change that was undone in between) before giving up.
const CAS_ATTEMPTS: usize = 4;

/// Lock stripes of the per-binding serialization (see [`MongoOptions::ferretdb`]).
const SERIAL_STRIPES: usize = 1024;

/// Options beyond the URI.
#[derive(Clone, Debug, Default)]
pub struct MongoOptions {
    /// Write concern of protocol writes. `None`: the URI's (`w=`, `journal=`), and
    /// without one there `{w: "majority", j: true}`. FerretDB accepts and ignores it
    /// (its SQLite backend commits each write before acknowledging), so the default is
    /// safe on every deployment this store supports.
    pub write_concern: Option<WriteConcern>,
    /// FerretDB compatibility mode. `None`: detected from the server's build info.
    ///
    /// FerretDB v1 does not apply a conditional update atomically: `findAndModify` and
    /// `update` read the matching documents, evaluate filter and update in the proxy,
    /// and write the result back by `_id` with nothing re-checking the filter, so two
    /// concurrent compare-and-sets on one revision both "succeed" and concurrent `$inc`s
    /// lose updates (inserts stay atomic: a unique key). It also serves only an exact
    /// `{_id: ...}` filter from an index and scans the collection for anything else.
    /// In this mode the store holds a per-binding lock for every call that mutates a
    /// binding's documents and issues its conditional writes as a read by `_id`, a
    /// check, and a write by `_id` ([`atomic`]). That makes one engine process correct
    /// on FerretDB; several processes sharing one FerretDB database are not. MongoDB
    /// needs none of it.
    pub ferretdb: Option<bool>,
}

/// The MongoDB state store.
pub struct MongoStore {
    sessions: Collection<Document>,
    state: Collection<Document>,
    audit: Collection<Document>,
    memories: Collection<Document>,
    /// The run ledger's events, idempotency digests and snapshots (`harness_ledger`).
    ledger: Collection<Document>,
    limits: Limits,
    rate: WriteRateLimiter,
    /// Write concern of bookkeeping writes (see the module documentation).
    hint: WriteConcern,
    /// FerretDB compatibility mode (see [`MongoOptions::ferretdb`]).
    ferretdb: bool,
    /// Per-binding lock stripes, in FerretDB compatibility mode.
    serial: Option<Vec<futures::lock::Mutex<()>>>,
    /// Memory search's vector index, by record id (`memory.rs`).
    vectors: std::sync::Arc<crate::store::vectors::VectorIndex<String>>,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.sessions.namespace().db)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl MongoStore {
    /// Connects to `uri`, using `database`, and creates the collections' indexes
    /// (idempotent: existing indexes with the same definition are left alone; an index
    /// of the same name with another definition is an error naming it).
    pub async fn connect(uri: &str, database: &str, limits: Limits) -> Result<Self> {
        Self::connect_with(uri, database, limits, MongoOptions::default()).await
    }

    pub async fn connect_with(
        uri: &str,
        database: &str,
        limits: Limits,
        options: MongoOptions,
    ) -> Result<Self> {
        let mut client_options = ClientOptions::parse(uri)
            .await
            .ctx("parsing the MongoDB connection string")?;
        if client_options.app_name.is_none() {
            client_options.app_name = Some("harness-engine".to_owned());
        }
        let write_concern = options
            .write_concern
            .or_else(|| client_options.write_concern.clone())
            .unwrap_or_else(|| {
                WriteConcern::builder()
                    .w(Acknowledgment::Majority)
                    .journal(true)
                    .build()
            });
        let client = Client::with_options(client_options).ctx("configuring the MongoDB client")?;
        let db = client.database(database);
        let ferretdb = match options.ferretdb {
            Some(ferretdb) => ferretdb,
            None => {
                let info = db
                    .run_command(doc! { "buildInfo": 1 })
                    .await
                    .ctx("reading the server's build info")?;
                info.contains_key("ferretdbVersion")
            }
        };
        // Fence checks and compare-and-set diagnostics must see the latest write: always
        // the primary, whatever read preference the URI asks for.
        let collection_options = CollectionOptions::builder()
            .write_concern(write_concern)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build();
        let store = MongoStore {
            sessions: db.collection_with_options(SESSIONS, collection_options.clone()),
            state: db.collection_with_options(STATE, collection_options.clone()),
            audit: db.collection_with_options(AUDIT, collection_options.clone()),
            memories: db.collection_with_options(memory::MEMORIES, collection_options.clone()),
            ledger: db.collection_with_options(ledger::LEDGER, collection_options),
            rate: WriteRateLimiter::new(&limits),
            limits,
            hint: WriteConcern::builder().w(Acknowledgment::Nodes(1)).build(),
            ferretdb,
            serial: ferretdb.then(|| {
                (0..SERIAL_STRIPES)
                    .map(|_| futures::lock::Mutex::new(()))
                    .collect()
            }),
            vectors: std::sync::Arc::default(),
        };
        store.create_indexes().await?;
        Ok(store)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// One `createIndexes` command per index: FerretDB v1 drops the connection when one
    /// command names two or more indexes that already exist.
    async fn create_indexes(&self) -> Result<()> {
        let index = |keys: Document, name: &str, unique: bool, sparse: bool| {
            let mut options = IndexOptions::builder().name(name.to_owned()).build();
            if unique {
                options.unique = Some(true);
            }
            // Sparse: only documents carrying the field (uncommitted states) are indexed.
            // FerretDB v1 ignores the option, which costs it nothing but space.
            if sparse {
                options.sparse = Some(true);
            }
            IndexModel::builder().keys(keys).options(options).build()
        };
        for model in [
            index(
                doc! { "environment_id": 1, "owner_subject": 1, "agent_id": 1, "conversation_id": 1, "epoch": 1 },
                layout::IDX_SESSIONS_IDENTITY,
                true,
                false,
            ),
            index(
                doc! { "last_activity_at": 1 },
                layout::IDX_SESSIONS_ACTIVITY,
                false,
                false,
            ),
        ] {
            self.sessions
                .create_index(model)
                .await
                .ctx("creating the harness_sessions indexes")?;
        }
        for model in [
            // Point lookups and idempotency go by `_id` (unique by nature, and an
            // injective encoding of binding, epoch, kind, name and key); this index
            // serves prefix listings of objects and streams and per-epoch purges. Not
            // declared unique on top: it would add no guarantee, and MongoDB allows a
            // unique index on a sharded collection only when prefixed by the shard key
            // (`_id`, see the module documentation).
            index(
                doc! { "binding_id": 1, "epoch": 1, "kind": 1, "name": 1, "key": 1 },
                layout::IDX_STATE_KEY,
                false,
                false,
            ),
            index(
                doc! { "binding_id": 1, "epoch": 1, "kind": 1, "name": 1, "seq": 1 },
                layout::IDX_STATE_SEQ,
                false,
                false,
            ),
            index(
                doc! { "pending_since": 1 },
                layout::IDX_STATE_PENDING_SINCE,
                false,
                true,
            ),
        ] {
            self.state
                .create_index(model)
                .await
                .ctx("creating the harness_session_state indexes")?;
        }
        self.audit
            .create_index(index(
                doc! { "at": -1, "_id": -1 },
                layout::IDX_AUDIT_AT,
                false,
                false,
            ))
            .await
            .ctx("creating the harness_audit indexes")?;
        for model in [
            index(
                doc! { "binding_id": 1, "epoch": 1, "kind": 1, "seq": 1 },
                "binding_epoch_kind_seq",
                false,
                false,
            ),
            index(
                doc! { "binding_id": 1, "epoch": 1, "kind": 1, "run_id": 1, "seq": 1 },
                "binding_epoch_kind_run_seq",
                false,
                false,
            ),
        ] {
            self.ledger
                .create_index(model)
                .await
                .ctx("creating the harness_ledger indexes")?;
        }
        self.create_memory_indexes().await
    }

    /// Holds the binding's lock when updates must be serialized in-process (FerretDB);
    /// `None` otherwise. Taken once per mutating call, after validation and the rate
    /// check (a refused call never waits), and never while holding another.
    async fn exclusive(&self, binding: &BindingId) -> Option<futures::lock::MutexGuard<'_, ()>> {
        let stripes = self.serial.as_ref()?;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(binding, &mut hasher);
        let index =
            usize::try_from(std::hash::Hasher::finish(&hasher) % count(stripes.len())).unwrap_or(0);
        Some(stripes.get(index)?.lock().await)
    }

    /// Takes one write token for the binding.
    fn rate_check(&self, binding: &BindingId) -> Result<()> {
        self.rate.acquire(binding).map_err(|wait: Duration| {
            let ms = u64::try_from(wait.as_micros().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1);
            Rejection::RateLimited { retry_after_ms: ms }.into()
        })
    }

    fn page(&self, limit: usize) -> i64 {
        let max_page = self.limits.max_page.max(1);
        let n = if limit == 0 {
            max_page
        } else {
            limit.min(max_page)
        };
        i64::try_from(n).unwrap_or(i64::MAX)
    }
}

/// Attaches what the store was doing to a driver error.
trait MongoContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> MongoContext<T> for mongodb::error::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|e| backend(context, &e))
    }
}

fn backend(context: &'static str, e: &mongodb::error::Error) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message: format!("{context}: {}", e.kind),
    }
}

fn corrupt(what: &'static str, detail: impl Display) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message: format!("stored {what} is malformed: {detail}"),
    }
}

/// BSON integers are signed: a value above `i64::MAX` cannot be stored or matched.
fn int(what: &str, value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Rejection::Invalid(format!("{what} {value} is out of range")).into())
}

/// A stored counter or revision, which this store never writes negative.
fn uint(what: &'static str, value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| corrupt(what, format!("negative value {value}")))
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn not_found_binding(id: &BindingId) -> StoreError {
    Rejection::NotFound(format!("binding {id}")).into()
}

/// Whether the error is a duplicate key (of a single write or a `findAndModify` upsert).
fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == DUPLICATE_KEY,
        ErrorKind::Command(c) => c.code == DUPLICATE_KEY,
        _ => false,
    }
}

/// For an `insertMany` that failed only on duplicate keys (no write-concern error, no
/// other write error): the indexes of the documents that were duplicates.
fn duplicate_indexes(e: &mongodb::error::Error) -> Option<Vec<usize>> {
    match e.kind.as_ref() {
        ErrorKind::InsertMany(failure) if failure.write_concern_error.is_none() => {
            let errors = failure.write_errors.as_ref()?;
            errors
                .iter()
                .all(|w| w.code == DUPLICATE_KEY)
                .then(|| errors.iter().map(|w| w.index).collect())
        }
        _ => None,
    }
}

#[async_trait]
impl BindingStore for MongoStore {
    async fn ensure_binding(&self, record: &BindingRecord) -> Result<(BindingRecord, bool)> {
        self.ensure_binding_impl(record).await
    }

    async fn get_binding(&self, id: &BindingId) -> Result<Option<BindingRecord>> {
        self.get_binding_impl(id).await
    }

    async fn last_activity_ms(&self, id: &BindingId) -> Result<Option<i64>> {
        self.last_activity_impl(id).await
    }

    async fn raise_fence(
        &self,
        id: &BindingId,
        epoch: u64,
        lease_generation: u64,
    ) -> Result<Fence> {
        self.raise_fence_impl(id, epoch, lease_generation).await
    }

    async fn clear(&self, id: &BindingId, new_epoch: u64) -> Result<ClearReport> {
        self.clear_impl(id, new_epoch).await
    }
}

#[async_trait]
impl crate::store::ledger::LedgerStore for MongoStore {
    async fn append_event(
        &self,
        scope: &StateScope,
        request: &crate::domain::ledger::AppendRequest,
    ) -> Result<crate::store::ledger::LedgerAppend> {
        crate::store::ledger::check(request, self.limits.max_key_bytes)?;
        self.append_event_impl(scope, request).await
    }

    async fn ledger_events(
        &self,
        scope: &StateScope,
        run_id: Option<&str>,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<crate::domain::ledger::LedgerEvent>> {
        self.ledger_events_impl(scope, run_id, after_seq, limit)
            .await
    }

    async fn ledger_state(&self, scope: &StateScope) -> Result<crate::domain::ledger::LedgerState> {
        self.ledger_state_impl(scope).await
    }

    async fn snapshot_ledger(
        &self,
        scope: &StateScope,
    ) -> Result<crate::store::ledger::LedgerSnapshot> {
        self.snapshot_ledger_impl(scope).await
    }

    async fn ledger_snapshot(
        &self,
        scope: &StateScope,
    ) -> Result<Option<crate::store::ledger::LedgerSnapshot>> {
        self.ledger_snapshot_impl(scope).await
    }

    async fn repair_ledger(
        &self,
        scope: &StateScope,
    ) -> Result<crate::domain::ledger::LedgerState> {
        self.repair_ledger_impl(scope).await
    }
}

#[async_trait]
impl ThreadStateStore for MongoStore {
    async fn load_head(&self, scope: &StateScope) -> Result<Option<DurableStateHead>> {
        self.load_head_impl(scope).await
    }

    async fn read_state(&self, scope: &StateScope, state_id: &str) -> Result<Option<Vec<u8>>> {
        self.read_state_impl(scope, state_id).await
    }

    async fn write_native_state(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
    ) -> Result<PendingStateRef> {
        self.write_native_state_impl(scope, payload, idempotency)
            .await
    }

    async fn commit_head(
        &self,
        scope: &StateScope,
        request: &CommitRequest,
    ) -> Result<DurableStateHead> {
        self.commit_head_impl(scope, request).await
    }

    fn check_object(&self, key: &str, body: &[u8]) -> Result<()> {
        Ok(crate::store::checks::object(&self.limits, key, body)?)
    }

    /// FerretDB v1 and a standalone MongoDB have no multi-document transaction, so
    /// `write_and_commit` runs its steps in order: a worker that dies after the commit
    /// leaves the head without its index object, which the adapter writes back from the
    /// head (see the LangGraph saver's repair). The index object refers to the state
    /// document instead of holding a second copy of the body.
    async fn index_committed(
        &self,
        scope: &StateScope,
        key: &str,
        _payload: &[u8],
        state: &PendingStateRef,
    ) -> Result<()> {
        self.index_state_impl(scope, key, state).await.map(|_| ())
    }

    async fn mark_uncertain(&self, scope: &StateScope, run_id: &str, reason: &str) -> Result<()> {
        self.mark_uncertain_impl(scope, run_id, reason).await
    }

    async fn reconcile_run(&self, scope: &StateScope, run_id: &str) -> Result<()> {
        self.reconcile_run_impl(scope, run_id).await
    }

    async fn uncertain_runs(&self, scope: &StateScope) -> Result<Vec<UncertainRun>> {
        self.uncertain_runs_impl(scope).await
    }
}

#[async_trait]
impl NativeStore for MongoStore {
    async fn put_object(
        &self,
        scope: &StateScope,
        key: &str,
        body: &[u8],
        mode: PutMode,
    ) -> Result<ObjectMeta> {
        self.put_object_impl(scope, key, body, mode).await
    }

    async fn get_object(&self, scope: &StateScope, key: &str) -> Result<Option<StoredObject>> {
        self.get_object_impl(scope, key).await
    }

    async fn list_objects(
        &self,
        scope: &StateScope,
        query: &ObjectQuery,
    ) -> Result<Vec<StoredObject>> {
        self.list_objects_impl(scope, query).await
    }

    async fn delete_objects(&self, scope: &StateScope, prefix: &str) -> Result<u64> {
        self.delete_objects_impl(scope, prefix).await
    }

    async fn append(
        &self,
        scope: &StateScope,
        stream: &str,
        entries: &[NewEntry],
    ) -> Result<AppendOutcome> {
        self.append_impl(scope, stream, entries).await
    }

    async fn load_stream(
        &self,
        scope: &StateScope,
        stream: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>> {
        self.load_stream_impl(scope, stream, after_seq, limit).await
    }

    async fn list_streams(&self, scope: &StateScope, prefix: &str) -> Result<Vec<StreamMeta>> {
        self.list_streams_impl(scope, prefix).await
    }

    async fn delete_stream(&self, scope: &StateScope, stream: &str) -> Result<u64> {
        self.delete_stream_impl(scope, stream).await
    }
}

#[async_trait]
impl InterruptStore for MongoStore {
    async fn pending_interrupt(&self, scope: &StateScope) -> Result<Option<PendingInterrupt>> {
        self.pending_interrupt_impl(scope).await
    }

    async fn resume(&self, scope: &StateScope, request: &ResumeRequest) -> Result<ResumeOutcome> {
        self.resume_impl(scope, request).await
    }
}

#[async_trait]
impl RetentionStore for MongoStore {
    async fn sweep(&self, policy: &RetentionPolicy, now_ms: i64) -> Result<SweepReport> {
        self.sweep_impl(policy, now_ms).await
    }

    async fn audit_records(&self, limit: usize) -> Result<Vec<AuditRecord>> {
        self.audit_records_impl(limit).await
    }
}

#[async_trait]
impl crate::store::MemoryStore for MongoStore {
    async fn get_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Option<crate::domain::memory::MemoryRecord>> {
        self.get_memory_impl(namespace, key, include_unadmitted, now_ms)
            .await
    }

    async fn put_memory(
        &self,
        put: &crate::store::memory::MemoryPut,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        self.put_memory_impl(put).await
    }

    async fn list_memories(
        &self,
        namespace: &crate::domain::memory::Namespace,
        after_key: Option<&str>,
        limit: usize,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Vec<crate::domain::memory::MemoryRecord>> {
        self.list_memories_impl(namespace, after_key, limit, include_unadmitted, now_ms)
            .await
    }

    async fn count_memories(
        &self,
        namespace: &crate::domain::memory::Namespace,
        now_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, u64>> {
        self.count_memories_impl(namespace, now_ms).await
    }

    async fn delete_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        expected_revision: u64,
        actor: &str,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        self.delete_memory_impl(namespace, key, expected_revision, actor)
            .await
    }

    async fn decide_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        decision: &crate::store::memory::MemoryDecision,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        self.decide_memory_impl(namespace, key, decision).await
    }

    async fn memory_candidates(
        &self,
        namespace: &crate::domain::memory::Namespace,
        query: &crate::store::memory::CandidateQuery,
    ) -> Result<Vec<crate::domain::memory::rank::Candidate>> {
        self.memory_candidates_impl(namespace, query).await
    }

    async fn sweep_memory(&self, now_ms: i64) -> Result<crate::store::memory::MemorySweepReport> {
        self.sweep_memory_impl(now_ms).await
    }

    async fn revoke_memory_source(
        &self,
        source_binding: &BindingId,
        actor: &str,
        now_ms: i64,
    ) -> Result<u64> {
        self.revoke_memory_source_impl(source_binding, actor, now_ms)
            .await
    }

    async fn load_memories(
        &self,
        records: Vec<crate::domain::memory::MemoryRecord>,
    ) -> Result<u64> {
        self.load_memories_impl(records).await
    }
}
