//! Long-term memory rules (`spec/000_fa938a4e6ac75730.txt` "MemoryBroker",
//! `spec/001_78d7ff78f70a2a2a.txt` §5): scopes and their keyed namespaces, the record,
//! the write pipeline (authorize, validate, scan, redact, refuse authority, approval),
//! consolidation, and ranking with budgeted selection (`spec/002_6a0ddaf11b83bfe4.txt` §4).
//!
//! Pure: no IO. The server derives a [`MemoryContext`] from the authenticated caller and
//! its binding, the rules here turn a request into a prepared record, and a store only
//! compares revisions and persists. A caller never supplies a namespace.

pub mod pipeline;
pub mod policy;
pub mod rank;
pub mod receipt;
pub mod scan;
pub mod secrets;

use serde::{Deserialize, Serialize};

pub use crate::api::memory_policy::{Consolidation, MemoryKind, MemoryScope, WritePolicy};
use crate::domain::{
    ids::{Keyring, SubjectRef, content_digest},
    state::Rejection,
};

/// The authenticated context a namespace is computed from. Every field comes from the
/// server's own state (the caller's binding and the deployment configuration), never
/// from a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryContext {
    pub subject: SubjectRef,
    pub agent_id: String,
    /// The organization the deployment serves, when one is configured.
    pub organization: Option<String>,
}

/// One authorized namespace: the scope, its keyed digest, and the ownership dimensions
/// stored next to each record (`spec/001` §5: `namespace_key`, `agent_id`, `subject_ref`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Namespace {
    pub environment: String,
    pub scope: MemoryScope,
    /// `mn_` and 64 hex digits: HMAC of the scope's components.
    pub key: String,
    pub agent_id: String,
    /// Set for the user scope only.
    pub subject_ref: Option<String>,
}

impl Namespace {
    /// The namespace of `scope` for `ctx` (`spec/000` "Memory scopes"):
    /// user = environment + subject + agent; agent = environment + agent;
    /// organization = environment + organization + agent.
    pub fn derive(
        keyring: &Keyring,
        ctx: &MemoryContext,
        scope: MemoryScope,
    ) -> Result<Namespace, Rejection> {
        let (key, subject_ref) = match scope {
            MemoryScope::User => (
                keyring.memory_namespace("user", &[ctx.subject.as_str(), &ctx.agent_id]),
                Some(ctx.subject.as_str().to_owned()),
            ),
            MemoryScope::Agent => (keyring.memory_namespace("agent", &[&ctx.agent_id]), None),
            MemoryScope::Organization => {
                let org = ctx.organization.as_deref().ok_or_else(|| {
                    Rejection::Forbidden(
                        "no organization is configured for this deployment, so there is no organization memory"
                            .into(),
                    )
                })?;
                (
                    keyring.memory_namespace("organization", &[org, &ctx.agent_id]),
                    None,
                )
            }
        };
        Ok(Namespace {
            environment: keyring.environment().to_owned(),
            scope,
            key,
            agent_id: ctx.agent_id.clone(),
            subject_ref,
        })
    }

    /// The record id of `memory_key` in this namespace: `hm_` and 32 hex digits, a plain
    /// digest of the (already keyed) namespace and the key, so it reveals neither.
    pub fn record_id(&self, memory_key: &str) -> String {
        let d = content_digest(format!("{}\u{0}{}", self.key, memory_key).as_bytes());
        format!("hm_{}", &d["sha256:".len().."sha256:".len() + 32])
    }
}

pub fn scope_str(scope: MemoryScope) -> &'static str {
    match scope {
        MemoryScope::User => "user",
        MemoryScope::Agent => "agent",
        MemoryScope::Organization => "organization",
    }
}

pub fn parse_scope(s: &str) -> Option<MemoryScope> {
    match s {
        "user" => Some(MemoryScope::User),
        "agent" => Some(MemoryScope::Agent),
        "organization" => Some(MemoryScope::Organization),
        _ => None,
    }
}

pub fn kind_str(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Semantic => "semantic",
        MemoryKind::EpisodicReference => "episodic_reference",
        MemoryKind::Procedural => "procedural",
    }
}

pub fn parse_kind(s: &str) -> Option<MemoryKind> {
    match s {
        "semantic" => Some(MemoryKind::Semantic),
        "episodic_reference" => Some(MemoryKind::EpisodicReference),
        "procedural" => Some(MemoryKind::Procedural),
        _ => None,
    }
}

/// `spec/001` §5 `approval_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    NotRequired,
    Pending,
    Approved,
    Rejected,
    Revoked,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::NotRequired => "not_required",
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Revoked => "revoked",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "not_required" => ApprovalStatus::NotRequired,
            "pending" => ApprovalStatus::Pending,
            "approved" => ApprovalStatus::Approved,
            "rejected" => ApprovalStatus::Rejected,
            "revoked" => ApprovalStatus::Revoked,
            _ => return None,
        })
    }
    /// Whether search may return the record: only admitted content is ever ranked.
    pub fn searchable(self) -> bool {
        matches!(self, ApprovalStatus::NotRequired | ApprovalStatus::Approved)
    }
}

/// Who wrote a record and from where (`spec/001` §5 `provenance`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// `agent_write` (a sandbox worker), `application_write` (a control-plane caller) or
    /// `consolidation` (a merge of concurrent revisions).
    pub source: String,
    /// The authenticated principal that wrote it.
    pub writer: String,
    pub source_binding_id: Option<String>,
    pub source_run_id: Option<String>,
    pub harness: Option<String>,
    pub model_version: Option<String>,
    /// The idempotency key of the write that made this revision (its keyed digest, never
    /// the key), so an identical retry finds it. Stored, never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_key: Option<WriteKey>,
}

/// What a keyed write leaves on the revision it made: the key's digest, the digest of
/// the request it came with, and what the write did. A retry with the same key and the
/// same request is answered with that revision; the same key with another request is
/// refused (`idempotency_mismatch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteKey {
    pub key: String,
    pub request: String,
    pub outcome: WriteOutcomeKind,
}

/// The approval record: who decided, when, why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub decided_by: Option<String>,
    pub decided_at_ms: Option<i64>,
    pub reason: Option<String>,
}

/// What scanning found (never the content itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// Always includes `untrusted`; plus e.g. `redacted`, `personal_data`,
    /// `instruction_like`.
    pub labels: Vec<String>,
    /// Secrets replaced by `[REDACTED:<kind>]`.
    pub redactions: u32,
    /// Whether `approval_for_sensitive` holds the write for approval.
    pub sensitive: bool,
}

/// A stored memory record (`spec/001` §5, `harness_memories`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// `hm_` and 32 hex digits.
    pub id: String,
    pub namespace: Namespace,
    pub kind: MemoryKind,
    pub memory_key: String,
    pub media_type: String,
    /// Inline content, after redaction.
    pub body: String,
    /// `sha256:` of `body`.
    pub content_hash: String,
    pub provenance: Provenance,
    pub approval_status: ApprovalStatus,
    pub approval: ApprovalRecord,
    pub classification: Classification,
    /// 0 to 1, caller's estimate; one term of ranking.
    pub importance: f32,
    /// Optional caller-supplied embedding (cosine term of ranking).
    pub embedding: Option<Vec<f32>>,
    /// Starts at 1, +1 on every write.
    pub revision: u64,
    /// Revisions this one was derived from: the replaced revision, or every revision a
    /// consolidation merged.
    pub source_revisions: Vec<u64>,
    /// Stable id of the deployment retention policy.
    pub retention_policy: String,
    /// Set when its source thread was revoked (`spec/001` §5 retention rules).
    pub review_required: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub expires_at_ms: Option<i64>,
}

impl MemoryRecord {
    /// The words indexed for lexical search: the key's words and the body's.
    pub fn index_text(&self) -> String {
        format!(
            "{} {}",
            self.memory_key.replace(['/', '_', '-', '.'], " "),
            self.body
        )
    }
}

/// What a successful put, delete, approve or reject did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcomeKind {
    Created,
    Updated,
    Consolidated,
    Deleted,
    Approved,
    Rejected,
}

/// The store's answer to a write.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryWriteOutcome {
    pub outcome: WriteOutcomeKind,
    pub record: MemoryRecord,
    /// An identical retry of an earlier keyed write: nothing was written, `record` is
    /// what that write made and `outcome` what it did.
    pub replayed: bool,
}

/// Merges `incoming` into `current` (the `merge` consolidation policy): the new revision
/// keeps both texts (the current one first, an identical paragraph once), the higher
/// importance, the more restrictive approval state, and records both source revisions
/// (`spec/001` §5: "Any merge/consolidation writes a new revision with all source
/// revisions recorded").
pub fn consolidate(
    current: &MemoryRecord,
    incoming: &MemoryRecord,
    based_on: Option<u64>,
) -> MemoryRecord {
    let mut merged = incoming.clone();
    let body = if current.body.split("\n\n").any(|p| p == incoming.body) {
        current.body.clone()
    } else {
        format!("{}\n\n{}", current.body, incoming.body)
    };
    merged.content_hash = content_digest(body.as_bytes());
    merged.body = body;
    merged.id = current.id.clone();
    merged.revision = current.revision + 1;
    let mut sources: Vec<u64> = based_on.into_iter().filter(|r| *r > 0).collect();
    sources.push(current.revision);
    sources.sort_unstable();
    sources.dedup();
    merged.source_revisions = sources;
    merged.created_at_ms = current.created_at_ms;
    merged.importance = current.importance.max(incoming.importance);
    merged.provenance.source = "consolidation".into();
    // A merge of a pending write stays pending; of two admitted ones stays admitted.
    if !incoming.approval_status.searchable() || !current.approval_status.searchable() {
        merged.approval_status = ApprovalStatus::Pending;
        merged.approval = ApprovalRecord::default();
    }
    let mut labels = current.classification.labels.clone();
    labels.extend(incoming.classification.labels.iter().cloned());
    labels.sort();
    labels.dedup();
    merged.classification = Classification {
        labels,
        redactions: current.classification.redactions + incoming.classification.redactions,
        sensitive: current.classification.sensitive || incoming.classification.sensitive,
    };
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring() -> Keyring {
        Keyring::new(vec![9u8; 32], "primary").unwrap_or_else(|e| panic!("{e}"))
    }

    fn ctx(subject: &str, agent: &str, org: Option<&str>) -> MemoryContext {
        MemoryContext {
            subject: keyring().subject_ref(subject),
            agent_id: agent.into(),
            organization: org.map(str::to_owned),
        }
    }

    #[test]
    fn namespaces_follow_the_scope_table() {
        let k = keyring();
        let ns =
            |c: &MemoryContext, s| Namespace::derive(&k, c, s).unwrap_or_else(|e| panic!("{e}"));
        let alice = ctx("alice", "agent-1", Some("acme"));
        let bob = ctx("bob", "agent-1", Some("acme"));
        let alice2 = ctx("alice", "agent-2", Some("acme"));
        let other_org = ctx("alice", "agent-1", Some("globex"));
        // user: subject and agent both matter.
        assert_ne!(
            ns(&alice, MemoryScope::User).key,
            ns(&bob, MemoryScope::User).key
        );
        assert_ne!(
            ns(&alice, MemoryScope::User).key,
            ns(&alice2, MemoryScope::User).key
        );
        // agent: shared by subjects of one agent, not across agents.
        assert_eq!(
            ns(&alice, MemoryScope::Agent).key,
            ns(&bob, MemoryScope::Agent).key
        );
        assert_ne!(
            ns(&alice, MemoryScope::Agent).key,
            ns(&alice2, MemoryScope::Agent).key
        );
        // organization: shared by subjects, not across organizations.
        assert_eq!(
            ns(&alice, MemoryScope::Organization).key,
            ns(&bob, MemoryScope::Organization).key
        );
        assert_ne!(
            ns(&alice, MemoryScope::Organization).key,
            ns(&other_org, MemoryScope::Organization).key
        );
        // scopes never share a namespace.
        let keys = [
            ns(&alice, MemoryScope::User).key,
            ns(&alice, MemoryScope::Agent).key,
            ns(&alice, MemoryScope::Organization).key,
        ];
        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);
        assert!(
            keys.iter()
                .all(|k| k.starts_with("mn_") && !k.contains("alice"))
        );
        assert_eq!(
            ns(&alice, MemoryScope::User).subject_ref,
            Some(alice.subject.as_str().into())
        );
        assert_eq!(ns(&alice, MemoryScope::Agent).subject_ref, None);
    }

    #[test]
    fn organization_scope_needs_a_configured_organization() {
        let err = Namespace::derive(&keyring(), &ctx("a", "b", None), MemoryScope::Organization);
        assert_eq!(err.map_err(|e| e.code()).err(), Some("forbidden_scope"));
    }

    #[test]
    fn record_ids_are_opaque_and_per_namespace() {
        let k = keyring();
        let a = Namespace::derive(&k, &ctx("alice", "a", None), MemoryScope::User)
            .unwrap_or_else(|e| panic!("{e}"));
        let b = Namespace::derive(&k, &ctx("bob", "a", None), MemoryScope::User)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a.record_id("prefs"), b.record_id("prefs"));
        assert_eq!(a.record_id("prefs"), a.record_id("prefs"));
        assert_eq!(a.record_id("prefs").len(), 35);
    }

    #[test]
    fn names_round_trip() {
        for s in [
            MemoryScope::User,
            MemoryScope::Agent,
            MemoryScope::Organization,
        ] {
            assert_eq!(parse_scope(scope_str(s)), Some(s));
        }
        for k in [
            MemoryKind::Semantic,
            MemoryKind::EpisodicReference,
            MemoryKind::Procedural,
        ] {
            assert_eq!(parse_kind(kind_str(k)), Some(k));
        }
        for a in ["not_required", "pending", "approved", "rejected", "revoked"] {
            assert_eq!(
                ApprovalStatus::parse(a).map(ApprovalStatus::as_str),
                Some(a)
            );
        }
        assert_eq!(parse_scope("global"), None);
    }
}
