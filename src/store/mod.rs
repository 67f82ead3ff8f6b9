//! The state store: traits every backend implements, and the backends.
//!
//! - [`sqlite`]: the embedded default. One file, WAL, one writer thread with group
//!   commit (a commit is acknowledged only after its transaction is fsynced), a reader pool.
//! - [`mongo`]: for teams that run MongoDB. Every compare-and-set is one single-document
//!   atomic update with its expectations in the filter; idempotency rests on unique
//!   indexes; no multi-document transactions, no TTL indexes.
//!
//! Both pass one conformance suite (`tests/store_conformance/`). The rules themselves
//! (fencing, scopes, limits, error codes) live in [`crate::domain`].

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::{
    ids::{BindingId, IdempotencyDigest},
    state::{
        BindingRecord, CommitRequest, DurableStateHead, Fence, PendingInterrupt, PendingStateRef,
        Rejection, ResumeOutcome, ResumeRequest, StateScope, UncertainRun,
    },
};

pub mod commit;
pub mod ledger;
pub mod memory;
pub mod mongo;
pub mod sqlite;
pub mod vectors;

pub use ledger::LedgerStore;
pub use memory::MemoryStore;

/// Why a store call failed: the request broke a rule (a stable code for the caller), or
/// the backend failed (retry may help; the outcome of a write may be unknown).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("{backend} store failed: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}

impl StoreError {
    pub fn backend(backend: &'static str, err: impl std::fmt::Display) -> Self {
        StoreError::Backend {
            backend,
            message: err.to_string(),
        }
    }
    /// The rejection, if this is one.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            StoreError::Rejected(r) => Some(r),
            StoreError::Backend { .. } => None,
        }
    }
    /// The stable error code (`unavailable` for backend failures).
    pub fn code(&self) -> &'static str {
        self.rejection().map_or("unavailable", Rejection::code)
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// How `put_object` treats an existing key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum PutMode {
    /// Create the key. An identical body under the same key is an idempotent retry and
    /// returns the existing object; a different body is refused (`conflict`).
    Create,
    /// Replace the key only if its current version is `expected_version` (0: absent).
    /// A retry of a replacement that happened (the object is at `expected_version + 1`
    /// with this very body) returns the object; anything else is refused (`conflict`).
    Replace { expected_version: u64 },
    /// Write unconditionally (creates or replaces). The body already stored is a retry:
    /// nothing changes, not even the version.
    Upsert,
}

/// Metadata of a native object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub key: String,
    /// Starts at 1, +1 on every replace.
    pub version: u64,
    pub size: u64,
    pub content_digest: String,
    pub updated_at_ms: i64,
}

/// A native object, with its body when asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredObject {
    pub meta: ObjectMeta,
    pub body: Option<Vec<u8>>,
}

/// A listing of native objects: keys under `prefix`, strictly below `before` when set,
/// in descending key order (newest first for time-ordered keys), at most `limit`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectQuery {
    pub prefix: String,
    pub before: Option<String>,
    pub limit: usize,
    pub with_bodies: bool,
}

/// An entry to append to a native stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEntry {
    /// Caller-chosen id (e.g. the SDK's entry uuid); appends are de-duplicated by it.
    pub id: String,
    pub body: Vec<u8>,
}

/// A stored stream entry; `seq` orders entries within the stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEntry {
    pub seq: u64,
    pub id: String,
    pub body: Vec<u8>,
}

/// What an append did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendOutcome {
    pub appended: u64,
    pub duplicates: u64,
    /// Highest sequence number in the stream after the append (0: empty).
    pub last_seq: u64,
}

/// A stream in a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    pub name: String,
    pub entries: u64,
    pub last_seq: u64,
    pub updated_at_ms: i64,
}

/// What a clear removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearReport {
    pub epoch: u64,
    pub states_deleted: u64,
    pub objects_deleted: u64,
    pub stream_entries_deleted: u64,
}

/// A deployment-owned retention policy (stable id, never a per-request TTL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    pub id: String,
    /// Pending state never committed is deleted after this long.
    pub pending_ttl_ms: i64,
    /// A binding with no write for this long has all its thread state deleted
    /// (bindings, heads, native state, objects, streams; never memory). `None`: keep.
    pub conversation_ttl_ms: Option<i64>,
}

/// What a sweep deleted; also written as an audit record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReport {
    pub policy_id: String,
    pub swept_at_ms: i64,
    pub pending_states_deleted: u64,
    pub bindings_deleted: u64,
    pub states_deleted: u64,
    pub objects_deleted: u64,
    pub stream_entries_deleted: u64,
}

/// An audit record: who or what deleted or changed state outside the turn path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub at_ms: i64,
    /// e.g. `retention.sweep`, `binding.clear`.
    pub action: String,
    pub binding_id: Option<BindingId>,
    pub detail: serde_json::Value,
}

/// Writes that would not otherwise touch the binding record refresh its activity time
/// only when it is older than this: idleness and retention are measured in minutes to
/// days, and a binding-record write on every object put or append would double their
/// cost.
pub const ACTIVITY_GRANULARITY_MS: i64 = 60_000;

/// Bindings and their fences (`harness_sessions`).
#[async_trait]
pub trait BindingStore: Send + Sync {
    /// Creates the binding, or returns the existing one (`created == false`). The id is a
    /// keyed digest of its identity, so an existing row with another identity is refused.
    async fn ensure_binding(&self, record: &BindingRecord) -> Result<(BindingRecord, bool)>;
    async fn get_binding(&self, id: &BindingId) -> Result<Option<BindingRecord>>;
    /// When the binding last saw a write (state, object, stream, fence or clear), in ms
    /// since the epoch, to within [`ACTIVITY_GRANULARITY_MS`]: what idleness is measured
    /// against. `None` for an unknown binding.
    async fn last_activity_ms(&self, id: &BindingId) -> Result<Option<i64>>;
    /// Raises the fence to `(epoch, generation)` within the current epoch: monotonic
    /// (a lower generation is refused with `stale_lease`) and idempotent (equal is a
    /// no-op). Moving the epoch is `clear`'s job.
    async fn raise_fence(&self, id: &BindingId, epoch: u64, lease_generation: u64)
    -> Result<Fence>;
    /// Moves the binding to `new_epoch` (current + 1), deleting the old epoch's pending
    /// state, heads, interrupts, objects and streams. Re-running with the current epoch
    /// finishes an interrupted clear. Memory is never touched.
    async fn clear(&self, id: &BindingId, new_epoch: u64) -> Result<ClearReport>;
}

/// The thread-state commit protocol (`spec/000_fa938a4e6ac75730.txt` "ThreadStateStore").
#[async_trait]
pub trait ThreadStateStore: NativeStore + Send + Sync {
    /// The last durable head of the scope's epoch; never a pending entry.
    async fn load_head(&self, scope: &StateScope) -> Result<Option<DurableStateHead>>;
    /// The body of a stored state (pending or committed) of the scope's epoch.
    async fn read_state(&self, scope: &StateScope, state_id: &str) -> Result<Option<Vec<u8>>>;
    /// Stores `payload` as pending, idempotently: the same key and payload return the
    /// same reference, the same key with another payload is `idempotency_mismatch`.
    async fn write_native_state(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
    ) -> Result<PendingStateRef>;
    /// Compare-and-set of the durable head on `expected_revision`, checking epoch and
    /// lease generation in the same atomic step; records the run id, its terminal
    /// metadata and the pending interrupt in the same document. The store stamps the
    /// interrupt with the new revision and the commit time (a resume must present that
    /// revision). The state must be a pending entry of the scope's epoch: a commit
    /// consumes it, so a state becomes a head once (`not_found` after). A run marked
    /// uncertain cannot commit (`run_uncertain`). Retrying a commit that already
    /// succeeded (same state id and run id at `expected_revision + 1`) returns the head it
    /// produced instead of a conflict.
    async fn commit_head(
        &self,
        scope: &StateScope,
        request: &CommitRequest,
    ) -> Result<DurableStateHead>;
    /// Steps 3 and 4 of the commit protocol in one call: stores `payload` as pending
    /// (idempotently, as `write_native_state`) and commits it (as `commit_head`, whose
    /// `request.state_id` is replaced by the new state's id); with `index`, also stores
    /// `payload` as that native object (an upsert, see `index_committed`). A backend
    /// that can runs all of it in one transaction, so a refused commit leaves nothing
    /// behind and the turn costs one durable write; this default runs the steps one
    /// after the other (the index key is checked before anything is written).
    async fn write_and_commit(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
        request: &CommitRequest,
        index: Option<&str>,
    ) -> Result<(PendingStateRef, DurableStateHead)> {
        if let Some(key) = index {
            self.check_object(key, payload)?;
        }
        let pending = self.write_native_state(scope, payload, idempotency).await?;
        let request = CommitRequest {
            state_id: pending.state_id.clone(),
            ..request.clone()
        };
        let head = self.commit_head(scope, &request).await?;
        if let Some(key) = index {
            self.index_committed(scope, key, payload, &pending).await?;
        }
        Ok((pending, head))
    }
    /// Refuses an object key or body the backend's limits do not allow.
    fn check_object(&self, key: &str, body: &[u8]) -> Result<()>;
    /// The object put of `write_and_commit` with an index key, after the commit of
    /// `state`, whose body is `payload`: an upsert. A backend overrides it to refer to
    /// the committed state instead of storing a second copy of the body.
    async fn index_committed(
        &self,
        scope: &StateScope,
        key: &str,
        payload: &[u8],
        state: &PendingStateRef,
    ) -> Result<()> {
        let _ = state;
        self.put_object(scope, key, payload, PutMode::Upsert)
            .await
            .map(|_| ())
    }
    /// Marks a run's durability uncertain: the previous head stays, and nothing commits
    /// under that run until `reconcile_run`.
    async fn mark_uncertain(&self, scope: &StateScope, run_id: &str, reason: &str) -> Result<()>;
    /// Lifts the fence on an uncertain run after explicit reconciliation.
    async fn reconcile_run(&self, scope: &StateScope, run_id: &str) -> Result<()>;
    /// Runs currently marked uncertain.
    async fn uncertain_runs(&self, scope: &StateScope) -> Result<Vec<UncertainRun>>;
}

/// Binding-scoped native objects and streams, the primitives the harness adapters use.
#[async_trait]
pub trait NativeStore: Send + Sync {
    async fn put_object(
        &self,
        scope: &StateScope,
        key: &str,
        body: &[u8],
        mode: PutMode,
    ) -> Result<ObjectMeta>;
    async fn get_object(&self, scope: &StateScope, key: &str) -> Result<Option<StoredObject>>;
    async fn list_objects(
        &self,
        scope: &StateScope,
        query: &ObjectQuery,
    ) -> Result<Vec<StoredObject>>;
    /// Deletes every object whose key starts with `prefix`; returns how many.
    async fn delete_objects(&self, scope: &StateScope, prefix: &str) -> Result<u64>;
    /// Appends in order, skipping entries whose id the stream already holds.
    async fn append(
        &self,
        scope: &StateScope,
        stream: &str,
        entries: &[NewEntry],
    ) -> Result<AppendOutcome>;
    /// Entries with `seq > after_seq`, in order, at most `limit`.
    async fn load_stream(
        &self,
        scope: &StateScope,
        stream: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>>;
    /// Streams whose name starts with `prefix`.
    async fn list_streams(&self, scope: &StateScope, prefix: &str) -> Result<Vec<StreamMeta>>;
    /// Deletes the stream and its sub-streams (`stream/...`); returns entries deleted.
    async fn delete_stream(&self, scope: &StateScope, stream: &str) -> Result<u64>;
}

/// Pending interrupts (`spec/001_78d7ff78f70a2a2a.txt` §6).
#[async_trait]
pub trait InterruptStore: Send + Sync {
    async fn pending_interrupt(&self, scope: &StateScope) -> Result<Option<PendingInterrupt>>;
    /// Consumes the interrupt atomically when binding, interrupt id, revision, caller (the
    /// binding owner) and decision all match. Resumes come from control-plane callers on
    /// the user's behalf, so only the epoch of the scope is checked, not the lease
    /// generation. The same idempotency key returns the prior outcome; another key
    /// for a consumed interrupt is refused.
    async fn resume(&self, scope: &StateScope, request: &ResumeRequest) -> Result<ResumeOutcome>;
}

/// Retention sweeps and their audit trail.
#[async_trait]
pub trait RetentionStore: Send + Sync {
    async fn sweep(&self, policy: &RetentionPolicy, now_ms: i64) -> Result<SweepReport>;
    /// Most recent audit records first.
    async fn audit_records(&self, limit: usize) -> Result<Vec<AuditRecord>>;
}

/// Everything a backend provides.
pub trait Store:
    BindingStore
    + ThreadStateStore
    + NativeStore
    + InterruptStore
    + RetentionStore
    + MemoryStore
    + LedgerStore
{
}
impl<
    T: BindingStore
        + ThreadStateStore
        + NativeStore
        + InterruptStore
        + RetentionStore
        + MemoryStore
        + LedgerStore,
> Store for T
{
}

/// Input checks every backend makes before touching storage, so both refuse the same
/// requests with the same codes and messages.
pub(crate) mod checks {
    use crate::domain::{
        ids::IdempotencyDigest,
        limits::Limits,
        state::{Rejection, check_key},
    };

    use super::NewEntry;

    fn count(n: usize) -> u64 {
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// A native state payload and its idempotency digest.
    pub(crate) fn native_state(
        limits: &Limits,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
    ) -> Result<(), Rejection> {
        if payload.len() > limits.max_state_bytes {
            return Err(Rejection::TooLarge {
                what: "native state",
                size: count(payload.len()),
                limit: count(limits.max_state_bytes),
            });
        }
        check_key(
            "idempotency digest",
            idempotency.as_str(),
            limits.max_key_bytes,
        )
    }

    /// A native object's key and body.
    pub(crate) fn object(limits: &Limits, key: &str, body: &[u8]) -> Result<(), Rejection> {
        check_key("object key", key, limits.max_key_bytes)?;
        if body.len() > limits.max_object_bytes {
            return Err(Rejection::TooLarge {
                what: "object",
                size: count(body.len()),
                limit: count(limits.max_object_bytes),
            });
        }
        Ok(())
    }

    /// A stream append: the stream name, the batch size, each entry id and body.
    pub(crate) fn append(
        limits: &Limits,
        stream: &str,
        entries: &[NewEntry],
    ) -> Result<(), Rejection> {
        check_key("stream name", stream, limits.max_key_bytes)?;
        if entries.len() > limits.max_entries_per_append {
            return Err(Rejection::TooMany {
                what: "entries per append",
                limit: count(limits.max_entries_per_append),
            });
        }
        for entry in entries {
            check_key("entry id", &entry.id, limits.max_key_bytes)?;
            if entry.body.len() > limits.max_entry_bytes {
                return Err(Rejection::TooLarge {
                    what: "stream entry",
                    size: count(entry.body.len()),
                    limit: count(limits.max_entry_bytes),
                });
            }
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
