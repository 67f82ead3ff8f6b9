//! The validating admission webhook for `HarnessBinding`, `SandboxProfile` and
//! `MemoryPolicy`: the rules a CRD's CEL validation cannot express (they read other
//! objects, the request's user, or deployment configuration), plus the identity rules CEL
//! already enforces, repeated so that a request reaching the webhook gets a message that
//! names the field and the rule.
//!
//! Layout, from pure to IO:
//! - [`options`]: pure scanners (durations come from `domain::duration`);
//! - [`binding`], [`profile`], [`memory`]: pure validators over the [`crate::api`] types,
//!   returning [`Violation`]s; a `MemoryPolicy` may only tighten the deployment memory
//!   configuration ([`crate::domain::memory::policy::DeploymentMemoryConfig`]);
//! - [`lookup`]: how a binding's referenced objects are read (the API server in
//!   production, fixtures in unit tests);
//! - [`review`]: AdmissionReview v1 in, AdmissionReview v1 out, and the axum [`router`];
//! - [`tls`]: [`serve_tls`], HTTPS with certificate files re-read when they change;
//! - [`certs`]: self-signed development certificates.
//!
//! Nothing here writes to the API server: the webhook has no side effects.

pub mod binding;
pub mod certs;

pub mod lookup;
pub mod memory;
pub mod options;
pub mod profile;
pub mod review;
pub mod tls;

use std::fmt;

pub use lookup::{KubeLookup, LookupError, ObjectLookup};
pub use review::{Webhook, WebhookConfig, router};
pub use tls::{TlsError, serve_tls};

/// The default operator identity: the ServiceAccount `config/` installs the operator as.
pub const DEFAULT_OPERATOR_IDENTITY: &str =
    "system:serviceaccount:harness-engine-system:harness-engine";

/// Paths the router serves, one per webhook in the ValidatingWebhookConfiguration.
pub const PATH_HARNESS_BINDINGS: &str = "/validate/harnessbindings";
/// Status subresource updates of `HarnessBinding` (the lease rule).
pub const PATH_HARNESS_BINDINGS_STATUS: &str = "/validate/harnessbindings-status";
/// `SandboxProfile` create and update.
pub const PATH_SANDBOX_PROFILES: &str = "/validate/sandboxprofiles";
/// `MemoryPolicy` create and update.
pub const PATH_MEMORY_POLICIES: &str = "/validate/memorypolicies";

/// Why a violation refuses the request; decides the HTTP code and reason in the
/// AdmissionReview response status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// The object is malformed or inconsistent (422 `Invalid`).
    Invalid,
    /// The object is well formed but asks for something its author may not have
    /// (403 `Forbidden`).
    Forbidden,
}

impl ViolationKind {
    pub fn http_code(self) -> u16 {
        match self {
            ViolationKind::Invalid => 422,
            ViolationKind::Forbidden => 403,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            ViolationKind::Invalid => "Invalid",
            ViolationKind::Forbidden => "Forbidden",
        }
    }
}

/// One broken rule: the field (JSON path as `kubectl explain` spells it, for example
/// `spec.harness.options.apiKey`) and a sentence saying which rule and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
    pub kind: ViolationKind,
}

impl Violation {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Violation {
            field: field.into(),
            message: message.into(),
            kind: ViolationKind::Invalid,
        }
    }

    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Violation {
            field: field.into(),
            message: message.into(),
            kind: ViolationKind::Forbidden,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// At most this many violations are spelled out in one message; the rest are counted.
const MAX_MESSAGES: usize = 5;

/// The one message a refused request carries: every violation (up to a bound), each
/// naming its field.
pub fn summarize(violations: &[Violation]) -> String {
    let mut parts: Vec<String> = violations
        .iter()
        .take(MAX_MESSAGES)
        .map(ToString::to_string)
        .collect();
    if violations.len() > MAX_MESSAGES {
        parts.push(format!(
            "and {} more violation(s)",
            violations.len() - MAX_MESSAGES
        ));
    }
    parts.join("; ")
}

/// The HTTP code of a refusal: 403 when any violation is about authority, else 422.
pub fn overall_kind(violations: &[Violation]) -> ViolationKind {
    if violations
        .iter()
        .any(|v| v.kind == ViolationKind::Forbidden)
    {
        ViolationKind::Forbidden
    } else {
        ViolationKind::Invalid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_every_field_and_bounds_the_length() {
        let one = vec![Violation::invalid("spec.a", "bad")];
        assert_eq!(summarize(&one), "spec.a: bad");
        let many: Vec<_> = (0..8)
            .map(|i| Violation::invalid(format!("spec.f{i}"), "bad"))
            .collect();
        let text = summarize(&many);
        assert!(text.contains("spec.f0: bad"));
        assert!(text.contains("spec.f4: bad"));
        assert!(!text.contains("spec.f5"));
        assert!(text.ends_with("and 3 more violation(s)"));
    }

    #[test]
    fn forbidden_wins_over_invalid() {
        let mixed = vec![
            Violation::invalid("spec.a", "x"),
            Violation::forbidden("spec.b", "y"),
        ];
        assert_eq!(overall_kind(&mixed).http_code(), 403);
        assert_eq!(overall_kind(&mixed[..1]).http_code(), 422);
    }
}
