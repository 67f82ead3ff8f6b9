//! Who is calling, and what they may act for.
//!
//! An [`Authenticator`] turns a bearer token into a [`Caller`] and answers the two
//! questions the routes ask: may this caller use bindings at all (with a verb), and may
//! it act for a given end-user subject. Two implementations:
//! - [`static_tokens`]: `serve` mode, a file of token digests, each mapped to a principal
//!   and the subjects it may act for;
//! - [`kubernetes`]: TokenReview for identity, the pod → Sandbox → HarnessBinding chain
//!   for a worker's scope, SubjectAccessReview for service callers and impersonation.
//!
//! Which binding a request may touch is decided in [`crate::server::authz`], on top of
//! these answers; the store never sees a caller, only the scope derived for it.

use std::{collections::BTreeMap, sync::Arc};

use async_trait::async_trait;

use crate::domain::ids::BindingId;

pub mod kubernetes;
pub mod static_tokens;

/// Longest bearer token accepted; projected ServiceAccount tokens are about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 8 << 10;

/// The authenticated identity of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Caller {
    /// A static-token principal (`serve` mode).
    Principal {
        name: String,
        subjects: Arc<Vec<String>>,
    },
    /// A Kubernetes ServiceAccount that is not a sandbox worker: a control-plane service.
    Service(ServiceIdentity),
    /// A sandbox worker, whose scope was derived from its pod by the server.
    Worker(WorkerScope),
}

impl Caller {
    /// A short, non-secret name for logs and error messages.
    pub fn principal(&self) -> &str {
        match self {
            Caller::Principal { name, .. } => name,
            Caller::Service(s) => &s.username,
            Caller::Worker(w) => &w.username,
        }
    }
}

/// A Kubernetes user as TokenReview reported it; SubjectAccessReviews are asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceIdentity {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// The ServiceAccount's namespace: authorization is asked there.
    pub namespace: String,
}

/// The one binding scope a worker may touch: its binding and the lease generation and
/// epoch its sandbox holds. Never widened by anything the worker sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerScope {
    pub username: String,
    pub binding_id: BindingId,
    pub epoch: u64,
    pub lease_generation: u64,
    /// `namespace/name` of the HarnessBinding, for messages.
    pub binding_ref: String,
    /// The HarnessBinding's identity (`spec.agentId`, `spec.conversationId`,
    /// `spec.subjectRef`): the store's record must match it, so a label naming another
    /// conversation's binding id gets nowhere.
    pub agent_id: String,
    pub conversation_id: String,
    pub subject_ref: String,
}

/// What a caller wants to do with bindings; a Kubernetes verb on `harnessbindings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingVerb {
    /// Create-or-get a binding.
    Create,
    /// Read a binding, its head, objects, streams or interrupt.
    Get,
    /// Write state, objects, streams, or resume an interrupt.
    Update,
}

impl BindingVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            BindingVerb::Create => "create",
            BindingVerb::Get => "get",
            BindingVerb::Update => "update",
        }
    }
}

/// Why a caller was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No, malformed, unknown, expired, forged or wrong-audience credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// The worker's sandbox no longer holds its binding's lease: it was replaced.
    #[error("{0}")]
    StaleLease(String),
    /// The caller is known but may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The lease exists but is not ready to serve a worker yet (claiming, hibernated).
    #[error("{0}")]
    LeaseNotReady(String),
    /// The authority (the Kubernetes API server) could not answer.
    #[error("{0}")]
    Unavailable(String),
}

/// Turns credentials into callers and answers authorization questions about them.
#[async_trait]
pub trait Authenticator: Send + Sync {
    /// Authenticates a bearer token (without the `Bearer ` prefix).
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthError>;

    /// May `caller` perform `verb` on bindings at all? (Kubernetes: a
    /// SubjectAccessReview on `harnessbindings` in the caller's namespace.) Workers are
    /// confined to their own binding by [`crate::server::authz`], not here.
    async fn may_use_bindings(&self, caller: &Caller, verb: BindingVerb)
    -> Result<bool, AuthError>;

    /// May `caller` act for the end-user `subject`? (Kubernetes: `impersonate` on
    /// `users` named `subject`.)
    async fn may_act_for(&self, caller: &Caller, subject: &str) -> Result<bool, AuthError>;
}

/// Checks a subject a caller names: 1 to 256 bytes, no control characters. Subjects are
/// hashed before they are stored, so this only bounds what we hash and log.
pub fn valid_subject(subject: &str) -> bool {
    !subject.is_empty() && subject.len() <= 256 && !subject.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_bounded_and_printable() {
        assert!(valid_subject("user:alice@example.com"));
        assert!(!valid_subject(""));
        assert!(!valid_subject("a\u{0}b"));
        assert!(!valid_subject(&"x".repeat(257)));
    }
}
