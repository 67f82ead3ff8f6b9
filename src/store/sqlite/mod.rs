//! Embedded SQLite backend: one file, WAL, one writer thread with group commit, a pool of
//! read-only connections.
//!
//! Durability: a write is acknowledged only after the transaction holding it has
//! committed with `synchronous=FULL`, i.e. after its WAL frames are fsynced
//! ([`writer`]). Atomicity: every scoped write checks the binding's fence
//! (`spec/000_fa938a4e6ac75730.txt`, "Reads and writes require exact binding, epoch,
//! adapter codec, and current lease generation") inside the same transaction as the
//! write, and every scoped read checks it in the same snapshot as the data it returns.
//! Rules and error codes come from [`crate::domain`]; this module only maps them onto
//! tables (`spec/001_78d7ff78f70a2a2a.txt` §2, §4, §6, §7).

#[doc(hidden)]
pub mod baseline;
mod bindings;
mod ledger;
mod memory;
mod native;
mod readers;
mod retention;
mod schema;
mod state;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};

use crate::{
    domain::{
        ids::{BindingId, IdempotencyDigest, content_digest},
        limits::{Limits, WriteRateLimiter},
        state::{
            BindingRecord, CommitRequest, DurableStateHead, Fence, PendingInterrupt,
            PendingStateRef, Rejection, ResumeOutcome, ResumeRequest, StateScope, UncertainRun,
            check_json_size, check_key,
        },
    },
    store::{
        AppendOutcome, AuditRecord, BindingStore, ClearReport, InterruptStore, NativeStore,
        NewEntry, ObjectMeta, ObjectQuery, PutMode, Result, RetentionPolicy, RetentionStore,
        StoreError, StoredEntry, StoredObject, StreamMeta, SweepReport, ThreadStateStore, now_ms,
    },
};

/// The decoders of stored rows, public for the fuzz targets (docs/reliability.md
/// "Fuzzing"): corrupt values give an error, never a panic.
pub use self::{memory::decode_memory_row, state::decode_head_row};
use self::{readers::ReaderPool, writer::Writer};

const BACKEND: &str = "sqlite";

/// Longest reason `mark_uncertain` accepts: a short machine-readable code, never content.
const MAX_REASON_BYTES: usize = 256;

/// Rows deleted per table per transaction when a clear or a sweep removes a lot: keeps
/// each writer transaction (and the commits queued behind it) short.
const PURGE_BATCH: i64 = 2_000;

/// Why the SQLite backend failed; surfaces to callers as `StoreError::Backend`.
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
    #[error("{context}: {source}")]
    Sql {
        context: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the database has schema version {found}, newer than the {supported} this build supports; \
         run a newer harness-engine or restore a backup taken before the upgrade"
    )]
    NewerSchema { found: i64, supported: i64 },
    #[error("journal_mode is {0:?}, not \"wal\": the database's filesystem does not support WAL")]
    NoWal(String),
    #[error("a pragma did not take effect: {0}")]
    Pragma(String),
    #[error("stored {what} is malformed: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// The write's group transaction failed; the text says whether it was rolled back
    /// or (COMMIT failed) its outcome is unknown.
    #[error("the write's transaction failed, {0}")]
    GroupFailed(String),
    #[error("starting the writer thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the writer thread has stopped")]
    WriterGone,
    #[error("{0}")]
    Task(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl From<SqliteError> for StoreError {
    fn from(e: SqliteError) -> Self {
        StoreError::Backend {
            backend: BACKEND,
            message: e.to_string(),
        }
    }
}

/// Attaches what the store was doing to a SQLite error.
pub(crate) trait SqlContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| SqliteError::Sql { context, source }.into())
    }
}

fn corrupt(what: &'static str, detail: impl std::fmt::Display) -> StoreError {
    SqliteError::Corrupt {
        what,
        detail: detail.to_string(),
    }
    .into()
}

/// SQLite integers are signed: a value above `i64::MAX` cannot be stored or matched.
fn sql_int(what: &str, value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Rejection::Invalid(format!("{what} {value} is out of range")).into())
}

/// Reads a non-negative integer column. (rusqlite maps `u64` only with its
/// `fallible_uint` feature; a negative value here means a corrupt row.)
fn get_u64(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let v: i64 = row.get(idx)?;
    u64::try_from(v).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(idx, v))
}

fn get_opt_u64(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Option<u64>> {
    let v: Option<i64> = row.get(idx)?;
    v.map(|v| u64::try_from(v).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(idx, v)))
        .transpose()
}

/// Converts a count SQLite reported (never negative) for a report.
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A page size: 0 means "the largest page", anything larger is clamped to it.
fn page(limit: usize, max_page: usize) -> i64 {
    let max_page = max_page.max(1);
    let n = if limit == 0 {
        max_page
    } else {
        limit.min(max_page)
    };
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn not_found_binding(id: &str) -> StoreError {
    Rejection::NotFound(format!("binding {id}")).into()
}

/// What a scoped operation carries into the writer or a reader: owned, so the command
/// can outlive the caller's borrow.
#[derive(Clone, Debug)]
struct ScopeKey {
    binding: BindingId,
    epoch: u64,
    lease_generation: u64,
    codec: String,
}

impl ScopeKey {
    fn of(scope: &StateScope) -> Self {
        ScopeKey {
            binding: scope.binding_id.clone(),
            epoch: scope.epoch,
            lease_generation: scope.lease_generation,
            codec: scope.codec.clone(),
        }
    }
    fn id(&self) -> &str {
        self.binding.as_str()
    }
}

fn load_fence(conn: &Connection, id: &str) -> Result<Option<Fence>> {
    conn.prepare_cached("SELECT epoch, lease_generation FROM harness_sessions WHERE id = ?1")
        .ctx("preparing the fence read")?
        .query_row([id], |row| {
            Ok(Fence {
                epoch: get_u64(row, 0)?,
                lease_generation: get_u64(row, 1)?,
            })
        })
        .optional()
        .ctx("reading the fence")
}

/// Admits a scope against the binding's fence, in the caller's transaction (so the check
/// is atomic with whatever the caller then reads or writes). Returns the epoch in its
/// stored form.
fn admit(conn: &Connection, scope: &ScopeKey) -> Result<i64> {
    let fence = load_fence(conn, scope.id())?.ok_or_else(|| not_found_binding(scope.id()))?;
    fence.admit(scope.epoch, scope.lease_generation)?;
    sql_int("epoch", fence.epoch)
}

/// Records write activity on the binding (what conversation retention measures).
fn touch(conn: &Connection, id: &str, now: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE harness_sessions SET updated_at_ms = max(updated_at_ms, ?2) WHERE id = ?1",
    )
    .ctx("preparing the activity update")?
    .execute(rusqlite::params![id, now])
    .ctx("recording activity")?;
    Ok(())
}

/// The embedded state store.
pub struct SqliteStore {
    limits: Limits,
    rate: WriteRateLimiter,
    // Declared before `writer`: readers close first, so the writer's connection is the
    // last one and its close checkpoints and removes the WAL.
    readers: Arc<ReaderPool>,
    writer: Writer,
    ledger_heads: Arc<ledger::HeadCache>,
    /// Memory search's vector index, by rowid (`memory.rs`).
    vectors: Arc<crate::store::vectors::VectorIndex<i64>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, migrating its schema; refuses a
    /// database written by a newer schema version.
    pub async fn open(path: &Path, limits: Limits) -> Result<Self> {
        let path = path.to_path_buf();
        let (write_conn, read_conns) = tokio::task::spawn_blocking(move || open_files(&path))
            .await
            .map_err(|e| SqliteError::Task(format!("opening the database: {e}")))??;
        let vectors = Arc::new(crate::store::vectors::VectorIndex::default());
        let writer = Writer::start(
            write_conn,
            Some(Arc::new(memory::VectorHook(vectors.clone()))),
        )?;
        Ok(SqliteStore {
            vectors,
            rate: WriteRateLimiter::new(&limits),
            limits,
            readers: ReaderPool::new(read_conns),
            writer,
            ledger_heads: Arc::default(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
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

    /// The commit's input checks, and its terminal metadata rendered for the row.
    fn prepare_commit(&self, request: &CommitRequest) -> Result<state::Commit> {
        let max_key = self.limits.max_key_bytes;
        check_key("state id", &request.state_id, max_key)?;
        check_key("run id", &request.run_id, max_key)?;
        sql_int("expected revision", request.expected_revision)?;
        let terminal_json = match &request.terminal {
            Some(terminal) => {
                check_json_size(
                    "run terminal metadata",
                    &terminal.metadata,
                    self.limits.max_metadata_bytes,
                )?;
                Some(
                    serde_json::to_string(terminal)
                        .map_err(|e| Rejection::Invalid(format!("run terminal metadata: {e}")))?,
                )
            }
            None => None,
        };
        if let Some(interrupt) = &request.interrupt {
            check_key("interrupt id", &interrupt.interrupt_id, max_key)?;
        }
        Ok(state::Commit {
            request: request.clone(),
            terminal_json,
            max_interrupt_bytes: self.limits.max_metadata_bytes,
        })
    }

    /// Validation and the rate limit for a scoped write; returns the owned scope.
    fn scoped_write(&self, scope: &StateScope) -> Result<ScopeKey> {
        self.rate_check(&scope.binding_id)?;
        Ok(ScopeKey::of(scope))
    }

    fn page(&self, limit: usize) -> i64 {
        page(limit, self.limits.max_page)
    }
}

fn open_files(path: &Path) -> Result<(Connection, Vec<Connection>)> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| SqliteError::Io {
            context: "creating the database directory",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let mut conn = schema::open_writer(path)?;
    schema::migrate(&mut conn)?;
    let readers = (0..readers::READERS)
        .map(|_| schema::open_reader(path))
        .collect::<Result<Vec<_>>>()?;
    Ok((conn, readers))
}

#[async_trait]
impl BindingStore for SqliteStore {
    async fn ensure_binding(&self, record: &BindingRecord) -> Result<(BindingRecord, bool)> {
        let max = self.limits.max_key_bytes;
        check_key("environment", &record.environment, max)?;
        check_key("agent id", &record.agent_id, max)?;
        check_key("conversation id", &record.conversation_id, max)?;
        check_key("harness", &record.harness, max)?;
        sql_int("epoch", record.epoch)?;
        sql_int("lease generation", record.lease_generation)?;
        let record = record.clone();
        self.writer
            .run(move |conn| bindings::ensure(conn, &record, now_ms()))
            .await
    }

    async fn get_binding(&self, id: &BindingId) -> Result<Option<BindingRecord>> {
        let id = id.clone();
        self.readers
            .read(move |tx| bindings::get(tx, id.as_str()))
            .await
    }

    async fn last_activity_ms(&self, id: &BindingId) -> Result<Option<i64>> {
        // Every write to a binding's rows moves `updated_at_ms` (see `touch`).
        let id = id.clone();
        self.readers
            .read(move |tx| {
                tx.prepare_cached("SELECT updated_at_ms FROM harness_sessions WHERE id = ?1")
                    .ctx("preparing the activity read")?
                    .query_row([id.as_str()], |r| r.get::<_, i64>(0))
                    .optional()
                    .ctx("reading a binding's activity")
            })
            .await
    }

    async fn raise_fence(
        &self,
        id: &BindingId,
        epoch: u64,
        lease_generation: u64,
    ) -> Result<Fence> {
        sql_int("lease generation", lease_generation)?;
        let id = id.clone();
        self.writer
            .run(move |conn| bindings::raise_fence(conn, id.as_str(), epoch, lease_generation))
            .await
    }

    async fn clear(&self, id: &BindingId, new_epoch: u64) -> Result<ClearReport> {
        sql_int("epoch", new_epoch)?;
        let binding = id.clone();
        let mut step = self
            .writer
            .run(move |conn| {
                bindings::start_clear(conn, &binding, new_epoch, now_ms(), PURGE_BATCH)
            })
            .await?;
        // The epoch moved atomically in the first transaction (old rows are invisible
        // from then on); the rows of older epochs go in batches, each its own transaction.
        while !step.done {
            let binding = id.clone();
            let so_far = step.clone();
            step = self
                .writer
                .run(move |conn| {
                    bindings::continue_clear(conn, &binding, so_far, now_ms(), PURGE_BATCH)
                })
                .await?;
        }
        Ok(step.report())
    }
}

#[async_trait]
impl crate::store::ledger::LedgerStore for SqliteStore {
    async fn append_event(
        &self,
        scope: &StateScope,
        request: &crate::domain::ledger::AppendRequest,
    ) -> Result<crate::store::ledger::LedgerAppend> {
        crate::store::ledger::check(request, self.limits.max_key_bytes)?;
        let scope = self.scoped_write(scope)?;
        let request = request.clone();
        let heads = self.ledger_heads.clone();
        self.writer
            .run(move |conn| ledger::append(conn, &heads, &scope, &request, now_ms()))
            .await
    }

    async fn ledger_events(
        &self,
        scope: &StateScope,
        run_id: Option<&str>,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<crate::domain::ledger::LedgerEvent>> {
        let scope = ScopeKey::of(scope);
        let run_id = run_id.map(str::to_owned);
        let limit = self.page(limit);
        self.readers
            .read(move |tx| ledger::events(tx, &scope, run_id.as_deref(), after_seq, limit))
            .await
    }

    async fn ledger_state(&self, scope: &StateScope) -> Result<crate::domain::ledger::LedgerState> {
        let scope = ScopeKey::of(scope);
        self.readers.read(move |tx| ledger::state(tx, &scope)).await
    }

    async fn run_snapshot(
        &self,
        scope: &StateScope,
        run_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<crate::store::ledger::RunSnapshot> {
        let scope = ScopeKey::of(scope);
        let run_id = run_id.to_owned();
        let limit = self.page(limit);
        self.readers
            .read(move |tx| ledger::run_snapshot(tx, &scope, &run_id, after_seq, limit))
            .await
    }

    async fn repair_ledger(
        &self,
        scope: &StateScope,
    ) -> Result<crate::domain::ledger::LedgerState> {
        let scope = self.scoped_write(scope)?;
        let heads = self.ledger_heads.clone();
        self.writer
            .run(move |conn| ledger::repair(conn, &heads, &scope, now_ms()))
            .await
    }

    async fn snapshot_ledger(
        &self,
        scope: &StateScope,
    ) -> Result<crate::store::ledger::LedgerSnapshot> {
        let scope = self.scoped_write(scope)?;
        self.writer
            .run(move |conn| ledger::snapshot(conn, &scope, now_ms()))
            .await
    }

    async fn ledger_snapshot(
        &self,
        scope: &StateScope,
    ) -> Result<Option<crate::store::ledger::LedgerSnapshot>> {
        let scope = ScopeKey::of(scope);
        self.readers
            .read(move |tx| ledger::snapshot_of(tx, &scope))
            .await
    }
}

#[async_trait]
impl ThreadStateStore for SqliteStore {
    async fn load_head(&self, scope: &StateScope) -> Result<Option<DurableStateHead>> {
        let scope = ScopeKey::of(scope);
        self.readers
            .read(move |tx| state::load_head(tx, &scope))
            .await
    }

    async fn read_state(&self, scope: &StateScope, state_id: &str) -> Result<Option<Vec<u8>>> {
        check_key("state id", state_id, self.limits.max_key_bytes)?;
        let scope = ScopeKey::of(scope);
        let state_id = state_id.to_owned();
        self.readers
            .read(move |tx| state::read_state(tx, &scope, &state_id))
            .await
    }

    async fn write_native_state(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
    ) -> Result<PendingStateRef> {
        crate::store::checks::native_state(&self.limits, payload, idempotency)?;
        let scope = self.scoped_write(scope)?;
        // Hashed here, on the caller's task: the writer thread only does database work.
        let write = state::NativeWrite {
            content_digest: content_digest(payload),
            payload: payload.to_vec(),
            idempotency: idempotency.clone(),
            max_pending: self.limits.max_pending_entries,
        };
        self.writer
            .run(move |conn| state::write_native_state(conn, &scope, write, now_ms()))
            .await
    }

    async fn commit_head(
        &self,
        scope: &StateScope,
        request: &CommitRequest,
    ) -> Result<DurableStateHead> {
        let commit = self.prepare_commit(request)?;
        let scope = self.scoped_write(scope)?;
        self.writer
            .run(move |conn| state::commit_head(conn, &scope, commit, now_ms()))
            .await
    }

    fn check_object(&self, key: &str, body: &[u8]) -> Result<()> {
        Ok(crate::store::checks::object(&self.limits, key, body)?)
    }

    async fn write_and_commit(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
        request: &CommitRequest,
        index: Option<&str>,
    ) -> Result<(PendingStateRef, DurableStateHead)> {
        crate::store::checks::native_state(&self.limits, payload, idempotency)?;
        if let Some(key) = index {
            self.check_object(key, payload)?;
        }
        let scope = self.scoped_write(scope)?;
        let write = state::NativeWrite {
            content_digest: content_digest(payload),
            payload: payload.to_vec(),
            idempotency: idempotency.clone(),
            max_pending: self.limits.max_pending_entries,
        };
        // The object refers to the state row instead of holding a second copy of the body.
        let index = index.map(str::to_owned);
        let max_objects = self.limits.max_objects;
        // The state id is not known yet: checked with a placeholder of the same shape,
        // replaced inside the job once the pending write has made it.
        let mut commit = self.prepare_commit(&CommitRequest {
            state_id: "ps_pending".to_owned(),
            ..request.clone()
        })?;
        // One writer job, so one transaction: a refused commit leaves nothing behind.
        self.writer
            .run(move |conn| {
                let now = now_ms();
                let pending = state::write_native_state(conn, &scope, write, now)?;
                commit.request.state_id = pending.state_id.clone();
                let head = state::commit_head(conn, &scope, commit, now)?;
                if let Some(key) = index {
                    let put = native::Put {
                        key,
                        content_digest: pending.content_digest.clone(),
                        body: native::Body::State {
                            state_id: pending.state_id.clone(),
                            size: pending.size,
                        },
                        mode: PutMode::Upsert,
                        max_objects,
                    };
                    native::put_object(conn, &scope, put, now)?;
                }
                Ok((pending, head))
            })
            .await
    }

    async fn mark_uncertain(&self, scope: &StateScope, run_id: &str, reason: &str) -> Result<()> {
        check_key("run id", run_id, self.limits.max_key_bytes)?;
        if reason.len() > MAX_REASON_BYTES {
            return Err(Rejection::Invalid(format!(
                "an uncertainty reason is at most {MAX_REASON_BYTES} bytes, got {}",
                reason.len()
            ))
            .into());
        }
        let scope = self.scoped_write(scope)?;
        let (run_id, reason) = (run_id.to_owned(), reason.to_owned());
        self.writer
            .run(move |conn| state::mark_uncertain(conn, &scope, &run_id, &reason, now_ms()))
            .await
    }

    async fn reconcile_run(&self, scope: &StateScope, run_id: &str) -> Result<()> {
        check_key("run id", run_id, self.limits.max_key_bytes)?;
        let scope = self.scoped_write(scope)?;
        let run_id = run_id.to_owned();
        self.writer
            .run(move |conn| state::reconcile_run(conn, &scope, &run_id, now_ms()))
            .await
    }

    async fn uncertain_runs(&self, scope: &StateScope) -> Result<Vec<UncertainRun>> {
        let scope = ScopeKey::of(scope);
        self.readers
            .read(move |tx| {
                let epoch = admit(tx, &scope)?;
                state::uncertain_runs(tx, scope.id(), epoch)
            })
            .await
    }
}

#[async_trait]
impl NativeStore for SqliteStore {
    async fn put_object(
        &self,
        scope: &StateScope,
        key: &str,
        body: &[u8],
        mode: PutMode,
    ) -> Result<ObjectMeta> {
        crate::store::checks::object(&self.limits, key, body)?;
        if let PutMode::Replace { expected_version } = mode {
            sql_int("expected version", expected_version)?;
        }
        let scope = self.scoped_write(scope)?;
        let put = native::Put {
            key: key.to_owned(),
            content_digest: content_digest(body),
            body: native::Body::Inline(body.to_vec()),
            mode,
            max_objects: self.limits.max_objects,
        };
        self.writer
            .run(move |conn| native::put_object(conn, &scope, put, now_ms()))
            .await
    }

    async fn get_object(&self, scope: &StateScope, key: &str) -> Result<Option<StoredObject>> {
        check_key("object key", key, self.limits.max_key_bytes)?;
        let scope = ScopeKey::of(scope);
        let key = key.to_owned();
        self.readers
            .read(move |tx| native::get_object(tx, &scope, &key))
            .await
    }

    async fn list_objects(
        &self,
        scope: &StateScope,
        query: &ObjectQuery,
    ) -> Result<Vec<StoredObject>> {
        let scope = ScopeKey::of(scope);
        let query = query.clone();
        let limit = self.page(query.limit);
        self.readers
            .read(move |tx| native::list_objects(tx, &scope, &query, limit))
            .await
    }

    async fn delete_objects(&self, scope: &StateScope, prefix: &str) -> Result<u64> {
        let scope = self.scoped_write(scope)?;
        let prefix = prefix.to_owned();
        self.writer
            .run(move |conn| native::delete_objects(conn, &scope, &prefix, now_ms()))
            .await
    }

    async fn append(
        &self,
        scope: &StateScope,
        stream: &str,
        entries: &[NewEntry],
    ) -> Result<AppendOutcome> {
        let limits = &self.limits;
        crate::store::checks::append(limits, stream, entries)?;
        let scope = self.scoped_write(scope)?;
        let append = native::Append {
            stream: stream.to_owned(),
            entries: entries.to_vec(),
            max_streams: limits.max_streams,
            max_stream_entries: limits.max_stream_entries,
        };
        self.writer
            .run(move |conn| native::append(conn, &scope, append, now_ms()))
            .await
    }

    async fn load_stream(
        &self,
        scope: &StateScope,
        stream: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>> {
        check_key("stream name", stream, self.limits.max_key_bytes)?;
        let scope = ScopeKey::of(scope);
        let stream = stream.to_owned();
        // Nothing is stored above i64::MAX, so a larger cursor simply finds nothing.
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = self.page(limit);
        self.readers
            .read(move |tx| native::load_stream(tx, &scope, &stream, after, limit))
            .await
    }

    async fn list_streams(&self, scope: &StateScope, prefix: &str) -> Result<Vec<StreamMeta>> {
        let scope = ScopeKey::of(scope);
        let prefix = prefix.to_owned();
        self.readers
            .read(move |tx| native::list_streams(tx, &scope, &prefix))
            .await
    }

    async fn delete_stream(&self, scope: &StateScope, stream: &str) -> Result<u64> {
        check_key("stream name", stream, self.limits.max_key_bytes)?;
        let scope = self.scoped_write(scope)?;
        let stream = stream.to_owned();
        self.writer
            .run(move |conn| native::delete_stream(conn, &scope, &stream, now_ms()))
            .await
    }
}

#[async_trait]
impl InterruptStore for SqliteStore {
    async fn pending_interrupt(&self, scope: &StateScope) -> Result<Option<PendingInterrupt>> {
        let scope = ScopeKey::of(scope);
        self.readers
            .read(move |tx| state::pending_interrupt(tx, &scope))
            .await
    }

    async fn resume(&self, scope: &StateScope, request: &ResumeRequest) -> Result<ResumeOutcome> {
        check_key(
            "interrupt id",
            &request.interrupt_id,
            self.limits.max_key_bytes,
        )?;
        check_key("decision", &request.decision, self.limits.max_key_bytes)?;
        check_key(
            "idempotency digest",
            request.idempotency.as_str(),
            self.limits.max_key_bytes,
        )?;
        check_json_size(
            "resume response",
            &request.response,
            self.limits.max_metadata_bytes,
        )?;
        // Resumes come from the control plane on the user's behalf: only the epoch is
        // fenced, not the lease generation (src/store/mod.rs, `InterruptStore::resume`).
        let scope = self.scoped_write(scope)?;
        let request = request.clone();
        self.writer
            .run(move |conn| state::resume(conn, &scope, &request, now_ms()))
            .await
    }
}

#[async_trait]
impl RetentionStore for SqliteStore {
    async fn sweep(&self, policy: &RetentionPolicy, now_ms: i64) -> Result<SweepReport> {
        retention::sweep(&self.writer, &self.readers, policy, now_ms, PURGE_BATCH).await
    }

    async fn audit_records(&self, limit: usize) -> Result<Vec<AuditRecord>> {
        let limit = self.page(limit);
        self.readers
            .read(move |tx| retention::audit_records(tx, limit))
            .await
    }
}

#[cfg(test)]
mod tests;

#[async_trait]
impl crate::store::MemoryStore for SqliteStore {
    async fn get_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Option<crate::domain::memory::MemoryRecord>> {
        let (ns, key) = (namespace.clone(), key.to_owned());
        self.readers
            .read(move |tx| memory::get(tx, &ns, &key, include_unadmitted, now_ms))
            .await
    }

    async fn put_memory(
        &self,
        put: &crate::store::memory::MemoryPut,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        let put = put.clone();
        self.writer.run(move |conn| memory::put(conn, &put)).await
    }

    async fn delete_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        expected_revision: u64,
        actor: &str,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        let (ns, key, actor) = (namespace.clone(), key.to_owned(), actor.to_owned());
        self.writer
            .run(move |conn| memory::delete(conn, &ns, &key, expected_revision, &actor, now_ms()))
            .await
    }

    async fn decide_memory(
        &self,
        namespace: &crate::domain::memory::Namespace,
        key: &str,
        decision: &crate::store::memory::MemoryDecision,
    ) -> Result<crate::domain::memory::MemoryWriteOutcome> {
        let (ns, key, d) = (namespace.clone(), key.to_owned(), decision.clone());
        self.writer
            .run(move |conn| memory::decide(conn, &ns, &key, &d))
            .await
    }

    async fn memory_candidates(
        &self,
        namespace: &crate::domain::memory::Namespace,
        query: &crate::store::memory::CandidateQuery,
    ) -> Result<Vec<crate::domain::memory::rank::Candidate>> {
        let (ns, q) = (namespace.clone(), query.clone());
        // Registered before the read's transaction begins (`store::vectors`).
        let space =
            (q.embedding.is_some() && q.vector_limit > 0).then(|| self.vectors.space(&ns.key));
        self.readers
            .read(move |tx| memory::candidates(tx, &ns, &q, space.as_deref()))
            .await
    }

    async fn list_memories(
        &self,
        namespace: &crate::domain::memory::Namespace,
        after_key: Option<&str>,
        limit: usize,
        include_unadmitted: bool,
        now_ms: i64,
    ) -> Result<Vec<crate::domain::memory::MemoryRecord>> {
        let (ns, after) = (namespace.clone(), after_key.map(str::to_owned));
        self.readers
            .read(move |tx| {
                memory::list(tx, &ns, after.as_deref(), limit, include_unadmitted, now_ms)
            })
            .await
    }

    async fn count_memories(
        &self,
        namespace: &crate::domain::memory::Namespace,
        now_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, u64>> {
        let ns = namespace.clone();
        self.readers
            .read(move |tx| memory::count(tx, &ns, now_ms))
            .await
    }

    async fn sweep_memory(&self, now_ms: i64) -> Result<crate::store::memory::MemorySweepReport> {
        let mut report = crate::store::memory::MemorySweepReport {
            swept_at_ms: now_ms,
            ..Default::default()
        };
        loop {
            let batch = self
                .writer
                .run(move |conn| memory::sweep_batch(conn, now_ms))
                .await?;
            if batch.is_empty() {
                break;
            }
            for (policy, n) in batch {
                report.expired += n;
                *report.by_policy.entry(policy).or_insert(0) += n;
            }
        }
        let audit = report.clone();
        self.writer
            .run(move |conn| memory::sweep_audit(conn, &audit))
            .await?;
        Ok(report)
    }

    async fn revoke_memory_source(
        &self,
        source_binding: &BindingId,
        actor: &str,
        now_ms: i64,
    ) -> Result<u64> {
        let (source, actor) = (source_binding.as_str().to_owned(), actor.to_owned());
        self.writer
            .run(move |conn| memory::revoke_source(conn, &source, &actor, now_ms))
            .await
    }

    async fn load_memories(
        &self,
        records: Vec<crate::domain::memory::MemoryRecord>,
    ) -> Result<u64> {
        self.writer
            .run(move |conn| memory::load(conn, &records))
            .await
    }
}
