//! The thread-state vocabulary of `spec/000_fa938a4e6ac75730.txt` ("ThreadStateStore",
//! "Commit protocol") and `spec/001_78d7ff78f70a2a2a.txt` §4 and §6: scopes, pending
//! references, durable heads, interrupts, and the stable error codes callers see.

use serde::{Deserialize, Serialize};

use super::ids::{BindingId, IdempotencyDigest, SubjectRef};

/// The codec of a metadata-only reader (the operator's `status.state` projection): it
/// matches any stored codec. Never accepted from a request (`Harness-Codec` allows only
/// lowercase letters, digits and dashes).
pub const ANY_CODEC: &str = "*";

/// What one state operation may touch. Derived by the server from authenticated state;
/// a caller can never widen it. Reads and writes require the exact epoch and the
/// current lease generation of the binding's fence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateScope {
    pub binding_id: BindingId,
    pub environment: String,
    pub harness: String,
    pub epoch: u64,
    /// Adapter codec and its major version, e.g. `langgraph-checkpoint-v1`.
    pub codec: String,
    pub lease_generation: u64,
}

/// The binding record the store keeps (the `harness_sessions` row): identity, owner and
/// the fence. Kubernetes owns the lease; this row mirrors the fence for atomic checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    pub binding_id: BindingId,
    pub environment: String,
    pub owner: SubjectRef,
    pub agent_id: String,
    pub conversation_id: String,
    pub harness: String,
    pub epoch: u64,
    pub lease_generation: u64,
    pub created_at_ms: i64,
}

/// The fence of a binding: writes must carry exactly this epoch and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub epoch: u64,
    pub lease_generation: u64,
}

impl Fence {
    /// Checks a scope against the fence: the epoch first (a cleared conversation), then
    /// the generation (a replaced worker).
    pub fn admit(&self, epoch: u64, lease_generation: u64) -> Result<(), Rejection> {
        if epoch != self.epoch {
            return Err(Rejection::StaleEpoch {
                presented: epoch,
                current: self.epoch,
            });
        }
        if lease_generation != self.lease_generation {
            return Err(Rejection::StaleLease {
                presented: lease_generation,
                current: self.lease_generation,
            });
        }
        Ok(())
    }
}

/// A native state payload stored as pending. The same idempotency key with the same
/// payload always yields the same reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingStateRef {
    /// Opaque id of the stored payload (`ps_` and hex), deterministic per idempotency key.
    pub state_id: String,
    pub epoch: u64,
    pub codec: String,
    pub size: u64,
    pub content_digest: String,
}

/// Derives a pending state id from the idempotency digest: a retried write finds the
/// same row, and the id reveals nothing about the client's key.
pub fn pending_state_id(digest: &IdempotencyDigest) -> String {
    format!("ps_{}", &digest.as_str()[..32.min(digest.as_str().len())])
}

/// How the run that produced a commit ended (`spec/000_fa938a4e6ac75730.txt` step 5:
/// terminal run metadata in the same logical commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Interrupted,
    Failed,
    Cancelled,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "completed",
            RunOutcome::Interrupted => "interrupted",
            RunOutcome::Failed => "failed",
            RunOutcome::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "completed" => RunOutcome::Completed,
            "interrupted" => RunOutcome::Interrupted,
            "failed" => RunOutcome::Failed,
            "cancelled" => RunOutcome::Cancelled,
            _ => return None,
        })
    }
}

/// Terminal metadata of the committing run: outcome and a bounded, opaque JSON object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunTerminal {
    pub outcome: RunOutcome,
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// A pending interrupt as committed with the head (`spec/001_78d7ff78f70a2a2a.txt` §6).
/// `body` carries the canonical prompt/fields/tool approvals, already redacted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingInterrupt {
    pub interrupt_id: String,
    /// `form_input` or `tool_approval`.
    #[serde(rename = "type")]
    pub kind: String,
    pub run_id: String,
    /// Parent/subagent path.
    #[serde(default)]
    pub namespace: Vec<String>,
    pub agent_id: String,
    /// Decisions a resume may take (e.g. `approve`, `reject`, `edit`, `respond`).
    pub allowed_decisions: Vec<String>,
    /// Revision a resume must present; prevents a double resume.
    pub revision: u64,
    pub created_at_ms: i64,
    #[serde(default)]
    pub body: serde_json::Value,
}

/// Durability of the latest turn (`spec/001_78d7ff78f70a2a2a.txt` §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    Committed,
    Uncertain,
}

/// The durable head of a binding epoch: what a restore selects, never a pending entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DurableStateHead {
    pub binding_id: BindingId,
    pub epoch: u64,
    /// Monotonic; 0 means "nothing committed yet" and is never returned as a head.
    pub revision: u64,
    /// The committed native state (a former pending entry).
    pub state_id: String,
    pub codec: String,
    pub content_digest: String,
    pub size: u64,
    pub run_id: String,
    pub committed_at_ms: i64,
    pub lease_generation: u64,
    pub terminal: Option<RunTerminal>,
    pub interrupt: Option<PendingInterrupt>,
    pub durability: Durability,
    /// Runs marked uncertain and not yet reconciled: nothing commits under them.
    #[serde(default)]
    pub uncertain_runs: Vec<UncertainRun>,
}

/// A run whose durability is ambiguous (`spec/000_fa938a4e6ac75730.txt`: "mark the run
/// uncertain_durability, retain the previous durable head, fence the run").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncertainRun {
    pub run_id: String,
    /// Short machine-readable reason (bounded; never model or tool content).
    pub reason: String,
    pub marked_at_ms: i64,
}

/// A head commit request (`commit_head`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitRequest {
    pub state_id: String,
    pub expected_revision: u64,
    pub run_id: String,
    pub terminal: Option<RunTerminal>,
    /// The interrupt the run left waiting, or `None` to clear any previous one.
    pub interrupt: Option<PendingInterrupt>,
}

/// A resume of a pending interrupt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumeRequest {
    pub interrupt_id: String,
    pub revision: u64,
    pub caller: SubjectRef,
    pub decision: String,
    pub idempotency: IdempotencyDigest,
    /// Bounded response payload (form values, edited arguments).
    #[serde(default)]
    pub response: serde_json::Value,
}

/// The recorded result of a resume; a duplicate with the same key returns it unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumeOutcome {
    pub interrupt_id: String,
    pub decision: String,
    pub revision: u64,
    pub resumed_at_ms: i64,
    pub response: serde_json::Value,
}

/// A rule a request broke. Each has a stable code callers can branch on
/// (`DESIGN` §6 codes, plus `run_uncertain` and `conflict` for what §6 does not name).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("lease generation {presented} is not the binding's current generation {current}")]
    StaleLease { presented: u64, current: u64 },
    #[error("epoch {presented} is not the binding's current epoch {current}")]
    StaleEpoch { presented: u64, current: u64 },
    #[error("expected revision {expected}, but the durable revision is {actual}")]
    RevisionConflict { expected: u64, actual: u64 },
    #[error("idempotency key was already used with a different payload")]
    IdempotencyMismatch,
    #[error("run {run_id} is marked uncertain; reconcile it before anything commits under it")]
    RunUncertain { run_id: String },
    #[error("{what}")]
    Conflict { what: String },
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{what}: limit of {limit} reached")]
    TooMany { what: &'static str, limit: u64 },
    #[error("write rate limit reached for this binding; retry in {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    /// A ledger append's expected last sequence is not the ledger's.
    #[error("expected last sequence {expected}, but the ledger is at {actual}")]
    SequenceConflict { expected: u64, actual: u64 },
    /// A circuit breaker (`spec/002_6a0ddaf11b83bfe4.txt` §10.1) would trip.
    #[error("{what} budget of {limit} is exhausted")]
    BudgetExceeded { what: String, limit: u64 },
    /// The effect under this key already has a confirmed outcome: never attempt it again.
    #[error("effect {key} already has a confirmed outcome; return its recorded result")]
    EffectConfirmed { key: String },
    /// The effect under this key has no settled outcome (in flight, unknown or under
    /// review): it must be reconciled or decided by a person before another attempt.
    #[error("effect {key} is {status}; reconcile it before attempting it again")]
    EffectUnresolved { key: String, status: String },
    /// The tool has no defence against a repeated call (`defence: none` in the binding's
    /// `SandboxProfile`): a person approves each attempt first.
    #[error(
        "tool {tool} has no defence against a repeated call: effect {key} needs a person's approval before each attempt (append HumanReviewRequested with approval: true, then wait for HumanReviewResolved approved)"
    )]
    ApprovalRequired { key: String, tool: String },
    /// The binding's ledger projections (its folded head) were built by another reducer
    /// than this server's: run writes fail closed until the head is rebuilt from the
    /// events (`POST /v1/bindings/{id}/runs/repair`); reads still answer.
    #[error(
        "the run ledger's projections were folded by {found}, not this server's {expected}: run writes are refused until POST /v1/bindings/{{binding_id}}/runs/repair rebuilds them from the events"
    )]
    ProjectionDegraded { found: String, expected: String },
}

impl Rejection {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::StaleLease { .. } => "stale_lease",
            Rejection::StaleEpoch { .. } => "stale_epoch",
            Rejection::RevisionConflict { .. } => "revision_conflict",
            Rejection::IdempotencyMismatch => "idempotency_mismatch",
            Rejection::RunUncertain { .. } => "run_uncertain",
            Rejection::Conflict { .. } => "conflict",
            Rejection::TooLarge { .. } | Rejection::TooMany { .. } => "too_large",
            Rejection::RateLimited { .. } => "rate_limited",
            Rejection::Invalid(_) => "invalid",
            Rejection::NotFound(_) => "not_found",
            Rejection::Forbidden(_) => "forbidden_scope",
            Rejection::SequenceConflict { .. } => "sequence_conflict",
            Rejection::BudgetExceeded { .. } => "budget_exceeded",
            Rejection::EffectConfirmed { .. } => "effect_confirmed",
            Rejection::EffectUnresolved { .. } => "effect_unresolved",
            Rejection::ApprovalRequired { .. } => "approval_required",
            Rejection::ProjectionDegraded { .. } => "projection_degraded",
        }
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(&self) -> u16 {
        match self {
            Rejection::StaleLease { .. }
            | Rejection::StaleEpoch { .. }
            | Rejection::RevisionConflict { .. }
            | Rejection::IdempotencyMismatch
            | Rejection::RunUncertain { .. }
            | Rejection::Conflict { .. }
            | Rejection::SequenceConflict { .. }
            | Rejection::BudgetExceeded { .. }
            | Rejection::EffectConfirmed { .. }
            | Rejection::EffectUnresolved { .. }
            | Rejection::ApprovalRequired { .. }
            | Rejection::ProjectionDegraded { .. } => 409,
            Rejection::TooLarge { .. } | Rejection::TooMany { .. } => 413,
            Rejection::RateLimited { .. } => 429,
            Rejection::Invalid(_) => 422,
            Rejection::NotFound(_) => 404,
            Rejection::Forbidden(_) => 403,
        }
    }
}

/// Validates an opaque key (object key, stream name, entry id, run id): bounded, printable,
/// no control characters. Keys are caller-chosen names, so they are checked, never trusted.
pub fn check_key(what: &'static str, key: &str, max_bytes: usize) -> Result<(), Rejection> {
    if key.is_empty() {
        return Err(Rejection::Invalid(format!("{what} must not be empty")));
    }
    if key.len() > max_bytes {
        return Err(Rejection::TooLarge {
            what,
            size: key.len() as u64,
            limit: max_bytes as u64,
        });
    }
    if key.chars().any(char::is_control) {
        return Err(Rejection::Invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

/// Checks a JSON document against a byte bound.
pub fn check_json_size(
    what: &'static str,
    value: &serde_json::Value,
    limit: usize,
) -> Result<(), Rejection> {
    let size = serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > limit {
        return Err(Rejection::TooLarge {
            what,
            size: size as u64,
            limit: limit as u64,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_checks_epoch_before_generation() {
        let fence = Fence {
            epoch: 2,
            lease_generation: 5,
        };
        let cases = [
            ((2, 5), None),
            ((2, 4), Some("stale_lease")),
            ((2, 6), Some("stale_lease")),
            ((1, 5), Some("stale_epoch")),
            ((1, 4), Some("stale_epoch")),
            ((3, 5), Some("stale_epoch")),
        ];
        for ((epoch, generation), want) in cases {
            let got = fence.admit(epoch, generation).err().map(|r| r.code());
            assert_eq!(got, want, "epoch {epoch} generation {generation}");
        }
    }

    #[test]
    fn codes_map_to_statuses() {
        let cases: [(Rejection, &str, u16); 8] = [
            (
                Rejection::StaleLease {
                    presented: 1,
                    current: 2,
                },
                "stale_lease",
                409,
            ),
            (
                Rejection::StaleEpoch {
                    presented: 1,
                    current: 2,
                },
                "stale_epoch",
                409,
            ),
            (
                Rejection::RevisionConflict {
                    expected: 1,
                    actual: 2,
                },
                "revision_conflict",
                409,
            ),
            (Rejection::IdempotencyMismatch, "idempotency_mismatch", 409),
            (
                Rejection::TooLarge {
                    what: "x",
                    size: 2,
                    limit: 1,
                },
                "too_large",
                413,
            ),
            (
                Rejection::RateLimited { retry_after_ms: 5 },
                "rate_limited",
                429,
            ),
            (Rejection::Invalid("bad".into()), "invalid", 422),
            (Rejection::Forbidden("no".into()), "forbidden_scope", 403),
        ];
        for (rejection, code, status) in cases {
            assert_eq!(
                (rejection.code(), rejection.http_status()),
                (code, status),
                "{rejection}"
            );
        }
    }

    #[test]
    fn keys_are_bounded_and_printable() {
        assert!(check_key("object key", "checkpoints/abc", 16).is_ok());
        assert_eq!(
            check_key("object key", "", 16).err().map(|r| r.code()),
            Some("invalid")
        );
        assert_eq!(
            check_key("object key", &"k".repeat(17), 16)
                .err()
                .map(|r| r.code()),
            Some("too_large")
        );
        assert_eq!(
            check_key("object key", "a\nb", 16).err().map(|r| r.code()),
            Some("invalid")
        );
    }
}
