//! The document layout (`spec/001_78d7ff78f70a2a2a.txt` §2, §4, §6, "Indexes"): collection
//! and index names, document ids, field names, and the typed views the store decodes.
//!
//! Three collections:
//! - `harness_sessions`: one document per binding (`_id` = binding id). It holds the
//!   fence, the durable head (`state_ref`), the terminal metadata of the committing run,
//!   the pending interrupt, uncertain runs, recent resume outcomes, the registry of
//!   pending (uncommitted) states and per-epoch counters, so every compare-and-set the
//!   protocol needs is a single-document update.
//! - `harness_session_state`: everything bulky, one document per pending/committed
//!   state, native object, stream head and stream entry, discriminated by `kind` and
//!   always carrying `binding_id` and `epoch`. Ids are deterministic (see [`state_doc_id`]
//!   and friends) so idempotent writes are plain inserts that collide on `_id`, and point
//!   reads are `_id` lookups (the one query shape every MongoDB-compatible server,
//!   FerretDB included, serves from an index).
//! - `harness_audit`: audit records.
//!
//! Opaque JSON (terminal metadata, interrupt bodies, resume responses, audit details)
//! is stored as JSON text, not as BSON documents: caller-chosen keys may start with `$`
//! or contain `.`, which MongoDB and FerretDB refuse as field names, and JSON numbers
//! would not round-trip exactly through BSON's numeric types.

use std::collections::BTreeMap;

use mongodb::bson::{DateTime, Document, doc, from_document};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::corrupt;
use crate::{domain::ids::BindingId, store::Result};

pub(super) const SESSIONS: &str = "harness_sessions";
pub(super) const STATE: &str = "harness_session_state";
pub(super) const AUDIT: &str = "harness_audit";

/// `schema_version` of binding documents this build writes.
pub(super) const SCHEMA_VERSION: i32 = 1;

/// `kind` values in `harness_session_state`.
pub(super) const KIND_STATE: &str = "state";
pub(super) const KIND_OBJECT: &str = "object";
pub(super) const KIND_STREAM: &str = "stream";
pub(super) const KIND_ENTRY: &str = "entry";

/// Index names. The binding identity index is the data-model spec's "Indexes" item 1;
/// activity stands in for item 4 (this store has no `status`); items 2 and 3 index
/// fields this store does not keep, and item 5 is a TTL index, which this store never
/// creates (retention is the audited sweep).
pub(super) const IDX_SESSIONS_IDENTITY: &str = "environment_owner_agent_conversation_epoch_unique";
pub(super) const IDX_SESSIONS_ACTIVITY: &str = "last_activity_at";
pub(super) const IDX_STATE_KEY: &str = "binding_epoch_kind_name_key";
pub(super) const IDX_STATE_SEQ: &str = "binding_epoch_kind_name_seq";
pub(super) const IDX_STATE_PENDING_SINCE: &str = "pending_since";
pub(super) const IDX_AUDIT_AT: &str = "at_desc";

/// `"<binding>:<epoch>:"`: a binding id is `hb_` and hex, an epoch is decimal, so the
/// prefix is unambiguous; what follows is a one-letter kind and the kind's key.
fn prefix(binding: &BindingId, epoch: i64) -> String {
    format!("{}:{epoch}:", binding.as_str())
}

/// A native state's document id: the state id is derived from the idempotency digest,
/// so a retried write collides with its first attempt on `_id`.
pub(super) fn state_doc_id(binding: &BindingId, epoch: i64, state_id: &str) -> String {
    format!("{}s:{state_id}", prefix(binding, epoch))
}

pub(super) fn object_doc_id(binding: &BindingId, epoch: i64, key: &str) -> String {
    format!("{}o:{key}", prefix(binding, epoch))
}

pub(super) fn stream_doc_id(binding: &BindingId, epoch: i64, stream: &str) -> String {
    format!("{}h:{stream}", prefix(binding, epoch))
}

/// An entry's id carries the stream name's length, so `("a/b", "c")` and `("a", "b/c")`
/// never collide although both parts are caller-chosen.
pub(super) fn entry_doc_id(
    binding: &BindingId,
    epoch: i64,
    stream: &str,
    entry_id: &str,
) -> String {
    format!(
        "{}e:{}:{stream}:{entry_id}",
        prefix(binding, epoch),
        stream.len()
    )
}

/// Field name under `uncertain_runs` for a run. Run ids are caller-chosen and may contain
/// `.` or start with `$`, so the map is keyed by a digest. A map rather than an array:
/// "not marked" is then `{uncertain_runs.<key>: {$exists: false}}`, which FerretDB v1
/// evaluates correctly, whereas it matches `{"uncertain_runs.run_id": {$ne: run}}`
/// (and `$not/$elemMatch`) even when the array holds the run.
pub(super) fn uncertain_key(run_id: &str) -> String {
    let digest = Sha256::digest(run_id.as_bytes());
    format!("r{}", hex::encode(&digest[..16]))
}

/// The smallest string above every string starting with `prefix` (`None`: no bound),
/// so `prefix <= s < successor` is a prefix match on an index range, with no pattern
/// syntax for `%`, `_` or regex metacharacters to leak through. Strings compare by UTF-8
/// bytes, i.e. by code point, so incrementing the last code point is enough.
pub(super) fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
        // `last` was char::MAX: carry into the previous character.
    }
    None
}

pub(super) fn dt(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

/// Decodes a document into a typed view; a mismatch is corruption (or a document this
/// build does not understand), reported as a backend failure.
pub(super) fn decode<T: for<'de> Deserialize<'de>>(what: &'static str, doc: Document) -> Result<T> {
    from_document(doc).map_err(|e| corrupt(what, e))
}

/// The fence fields of a binding document, and what side-document writes need with it.
#[derive(Debug, Deserialize)]
pub(super) struct FenceView {
    pub epoch: i64,
    pub lease_generation: i64,
    #[serde(default)]
    pub retiring: Option<bool>,
    #[serde(default)]
    pub last_activity_at: Option<DateTime>,
}

/// Projection for [`FenceView`].
pub(super) fn fence_projection() -> Document {
    doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "last_activity_at": 1 }
}

/// A whole binding document (or a projection of it: every field but the fence defaults).
#[derive(Debug, Deserialize)]
pub(super) struct SessionView {
    #[serde(rename = "_id")]
    pub id: String,
    #[serde(default)]
    pub environment_id: String,
    #[serde(default)]
    pub owner_subject: String,
    #[serde(default)]
    pub agent_id: String,
    #[serde(default)]
    pub conversation_id: String,
    #[serde(default)]
    pub harness_id: String,
    pub epoch: i64,
    pub lease_generation: i64,
    #[serde(default)]
    pub retiring: Option<bool>,
    #[serde(default)]
    pub state_ref: Option<StateRefView>,
    #[serde(default)]
    pub terminal: Option<TerminalView>,
    #[serde(default)]
    pub pending_interrupt: Option<InterruptView>,
    #[serde(default)]
    pub uncertain_runs: BTreeMap<String, UncertainView>,
    #[serde(default)]
    pub uncertain_count: i64,
    #[serde(default)]
    pub recent_resumes: Vec<ResumeView>,
    /// Uncommitted states of the epoch: state id -> registration time.
    #[serde(default)]
    pub pending: BTreeMap<String, DateTime>,
    #[serde(default)]
    pub counts: CountsView,
    #[serde(default)]
    pub created_at: Option<DateTime>,
}

/// `counts`: per-epoch counters (see `bindings::Counter`; `pending` is exact, it moves
/// with the `pending` map in the same updates).
#[derive(Debug, Default, Deserialize)]
pub(super) struct CountsView {
    #[serde(default)]
    pub pending: i64,
}

impl SessionView {
    pub fn is_retiring(&self) -> bool {
        self.retiring.unwrap_or(false)
    }
}

/// `state_ref` (spec 001 §4).
#[derive(Debug, Default, Deserialize)]
pub(super) struct StateRefView {
    #[serde(default)]
    pub durable_revision: i64,
    #[serde(default)]
    pub durable_head: Option<String>,
    #[serde(default)]
    pub codec: Option<String>,
    #[serde(default)]
    pub content_digest: Option<String>,
    #[serde(default)]
    pub size: Option<i64>,
    #[serde(default)]
    pub last_committed_run_id: Option<String>,
    #[serde(default)]
    pub committed_at: Option<DateTime>,
    #[serde(default)]
    pub head_lease_generation: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct TerminalView {
    pub outcome: String,
    pub metadata_json: String,
}

/// The canonical pending interrupt (spec 001 §6): its routing fields as BSON, its
/// redacted body as JSON text.
#[derive(Debug, Deserialize)]
pub(super) struct InterruptView {
    pub interrupt_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub run_id: String,
    #[serde(default)]
    pub namespace: Vec<String>,
    pub agent_id: String,
    #[serde(default)]
    pub allowed_decisions: Vec<String>,
    pub revision: i64,
    pub created_at: DateTime,
    pub body_json: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct UncertainView {
    pub run_id: String,
    pub reason: String,
    pub marked_at: DateTime,
}

/// A recorded resume outcome, kept so a duplicate resume replays it.
#[derive(Debug, Deserialize)]
pub(super) struct ResumeView {
    pub interrupt_id: String,
    pub idempotency: String,
    pub decision: String,
    pub revision: i64,
    pub resumed_at: DateTime,
    pub response_json: String,
}

/// A native state document without its body.
#[derive(Debug, Deserialize)]
pub(super) struct StateView {
    pub idempotency: String,
    pub codec: String,
    pub size: i64,
    pub content_digest: String,
}

pub(super) fn state_meta_projection() -> Document {
    doc! { "idempotency": 1, "codec": 1, "size": 1, "content_digest": 1 }
}

/// A native object document; `body` only when projected.
#[derive(Debug, Deserialize)]
pub(super) struct ObjectView {
    pub key: String,
    pub version: i64,
    pub size: i64,
    pub content_digest: String,
    pub updated_at: DateTime,
    #[serde(default)]
    pub body: Option<mongodb::bson::Binary>,
    /// The state document holding the body instead (an indexed commit).
    #[serde(default)]
    pub body_state: Option<String>,
}

pub(super) fn object_meta_projection() -> Document {
    doc! { "key": 1, "version": 1, "size": 1, "content_digest": 1, "updated_at": 1 }
}

/// A stream head: the sequence counter and entry count of one stream.
#[derive(Debug, Deserialize)]
pub(super) struct StreamView {
    pub name: String,
    pub last_seq: i64,
    pub entries: i64,
    pub updated_at: DateTime,
}

#[derive(Debug, Deserialize)]
pub(super) struct EntryView {
    pub key: String,
    pub seq: i64,
    pub body: mongodb::bson::Binary,
}

#[derive(Debug, Deserialize)]
pub(super) struct AuditView {
    pub at: DateTime,
    pub action: String,
    #[serde(default)]
    pub binding_id: Option<String>,
    pub detail_json: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_bounds_exactly_the_prefix() {
        assert_eq!(prefix_successor("ckpt/").as_deref(), Some("ckpt0"));
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_successor("\u{10FFFF}"), None);
        assert_eq!(prefix_successor("x\u{D7FF}").as_deref(), Some("x\u{E000}"));
        let succ = prefix_successor("ab").unwrap_or_default();
        for (s, inside) in [
            ("ab", true),
            ("ab\u{10FFFF}", true),
            ("abz", true),
            ("aa", false),
            ("ac", false),
            ("a", false),
        ] {
            assert_eq!(s >= "ab" && s < succ.as_str(), inside, "{s:?}");
        }
    }

    #[test]
    fn entry_ids_never_alias_across_streams() {
        let b =
            BindingId::parse("hb_0123456789abcdef0123456789abcdef").unwrap_or_else(|| panic!("id"));
        assert_ne!(
            entry_doc_id(&b, 0, "a/b", "c"),
            entry_doc_id(&b, 0, "a", "b/c")
        );
        assert_ne!(
            state_doc_id(&b, 1, "ps_1"),
            state_doc_id(&b, 11, "ps_1"),
            "epochs are delimited"
        );
        assert_ne!(uncertain_key("run-1"), uncertain_key("run-2"));
        assert!(
            uncertain_key("a.b$c")
                .bytes()
                .all(|c| c.is_ascii_alphanumeric()),
            "a safe field name"
        );
    }
}
