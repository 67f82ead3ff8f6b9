//! The event envelope (`spec/002_6a0ddaf11b83bfe4.txt` §3.4) and its digests.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::domain::state::{Rejection, check_key};

/// The vocabulary (§3.3, §5). There is no `ToolExecuted`: a caller knows it attempted an
/// effect and what it observed, never that the effect happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    #[default]
    RunStarted,
    RunCompleted,
    /// The memory search's budget report (§4.4).
    ContextAssembled,
    /// Emitted on pass, block and skip.
    GuardrailEvaluated,
    /// Durable before the call.
    EffectAttempted,
    /// `confirmed` | `refused` | `unknown`, via `direct` | `reconciliation` | `human`.
    EffectOutcomeObserved,
    HumanReviewRequested,
    HumanReviewResolved,
    /// A superseding correction of a completed run's outcome (`spec/003_bab976795353d872.txt`
    /// "complete_run"): the outcome head moves, `terminal_at` stays.
    RunOutcomeCorrected,
    /// The episode contract's work tree (`spec/003` "Event And Outcome Authority"): a child
    /// work item under an active parent, its id minted by the server.
    #[serde(rename = "work_item_created")]
    WorkItemCreated,
    /// Pending, active or blocked work becomes active (a second start is the resume path).
    #[serde(rename = "work_item_started")]
    WorkItemStarted,
    #[serde(rename = "work_item_blocked")]
    WorkItemBlocked,
    #[serde(rename = "work_item_completed")]
    WorkItemCompleted,
    #[serde(rename = "work_item_failed")]
    WorkItemFailed,
    #[serde(rename = "work_item_abandoned")]
    WorkItemAbandoned,
    /// A reference to an artifact (digest, MIME type, URI, bounded metadata), never its
    /// body; the artifact id is minted by the server.
    #[serde(rename = "artifact_created")]
    ArtifactCreated,
    /// Receipt-bound memory attribution (`spec/003` "Receipt-Bound Memory Attribution"):
    /// which results of a signed recall the run selected. Stored as the receipt's hash
    /// and the selected memory, rank and exact content version; never the receipt.
    #[serde(rename = "memory_recalled")]
    MemoryRecalled,
    /// A memory the run applied: linked to an earlier `memory_recalled` of the run, or a
    /// manual reference (always review-required).
    #[serde(rename = "memory_applied")]
    MemoryApplied,
    #[serde(rename = "memory_rejected")]
    MemoryRejected,
    /// A leased coordination signal of the workspace (recorded under run `signals`).
    #[serde(rename = "signal_claimed")]
    SignalClaimed,
    #[serde(rename = "signal_lease_extended")]
    SignalLeaseExtended,
    #[serde(rename = "signal_acked")]
    SignalAcked,
    /// Feedback on a memory a signed recall showed (helpful, misleading, outdated):
    /// review evidence only, recorded under run id `memory`; never changes ranking.
    #[serde(rename = "memory_feedback")]
    MemoryFeedback,
    /// A note on a memory at its exact content version (run id `memory`); the content
    /// version does not change.
    #[serde(rename = "memory_annotated")]
    MemoryAnnotated,
    /// Acceptance criteria, evaluator and run configuration approved before a run's
    /// success is judged (`spec/003` "complete_run": the approved preflight), by a
    /// control-plane caller, never the run's own sandbox worker.
    #[serde(rename = "verification_preflight_approved")]
    VerificationPreflightApproved,
    /// The named evaluator's verdict on the run against the current preflight and the
    /// run's current artifacts; a `pass` earns a server-minted verification receipt.
    #[serde(rename = "verification_evaluated")]
    VerificationEvaluated,
}

impl EventType {
    pub const ALL: [EventType; 26] = [
        EventType::RunStarted,
        EventType::RunCompleted,
        EventType::ContextAssembled,
        EventType::GuardrailEvaluated,
        EventType::EffectAttempted,
        EventType::EffectOutcomeObserved,
        EventType::HumanReviewRequested,
        EventType::HumanReviewResolved,
        EventType::RunOutcomeCorrected,
        EventType::WorkItemCreated,
        EventType::WorkItemStarted,
        EventType::WorkItemBlocked,
        EventType::WorkItemCompleted,
        EventType::WorkItemFailed,
        EventType::WorkItemAbandoned,
        EventType::ArtifactCreated,
        EventType::MemoryRecalled,
        EventType::MemoryApplied,
        EventType::MemoryRejected,
        EventType::SignalClaimed,
        EventType::SignalLeaseExtended,
        EventType::SignalAcked,
        EventType::MemoryFeedback,
        EventType::MemoryAnnotated,
        EventType::VerificationPreflightApproved,
        EventType::VerificationEvaluated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::RunStarted => "RunStarted",
            EventType::RunCompleted => "RunCompleted",
            EventType::ContextAssembled => "ContextAssembled",
            EventType::GuardrailEvaluated => "GuardrailEvaluated",
            EventType::EffectAttempted => "EffectAttempted",
            EventType::EffectOutcomeObserved => "EffectOutcomeObserved",
            EventType::HumanReviewRequested => "HumanReviewRequested",
            EventType::HumanReviewResolved => "HumanReviewResolved",
            EventType::RunOutcomeCorrected => "RunOutcomeCorrected",
            EventType::WorkItemCreated => "work_item_created",
            EventType::WorkItemStarted => "work_item_started",
            EventType::WorkItemBlocked => "work_item_blocked",
            EventType::WorkItemCompleted => "work_item_completed",
            EventType::WorkItemFailed => "work_item_failed",
            EventType::WorkItemAbandoned => "work_item_abandoned",
            EventType::ArtifactCreated => "artifact_created",
            EventType::MemoryRecalled => "memory_recalled",
            EventType::MemoryApplied => "memory_applied",
            EventType::MemoryRejected => "memory_rejected",
            EventType::SignalClaimed => "signal_claimed",
            EventType::SignalLeaseExtended => "signal_lease_extended",
            EventType::SignalAcked => "signal_acked",
            EventType::MemoryFeedback => "memory_feedback",
            EventType::MemoryAnnotated => "memory_annotated",
            EventType::VerificationPreflightApproved => "verification_preflight_approved",
            EventType::VerificationEvaluated => "verification_evaluated",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The workspace's signal events (no run: recorded under run `signals`).
    pub fn is_signal(self) -> bool {
        matches!(
            self,
            EventType::SignalClaimed | EventType::SignalLeaseExtended | EventType::SignalAcked
        )
    }

    /// The run id a workspace-level event is recorded under (signals, memory feedback):
    /// those events belong to no run, and no other event may use these ids.
    pub fn workspace_run(self) -> Option<&'static str> {
        match self {
            EventType::SignalClaimed | EventType::SignalLeaseExtended | EventType::SignalAcked => {
                Some(super::signal::SIGNAL_RUN)
            }
            EventType::MemoryFeedback | EventType::MemoryAnnotated => Some(FEEDBACK_RUN),
            _ => None,
        }
    }

    /// The events that carry a `memory_attribution` (and the only ones that may).
    pub fn attributes_memory(self) -> bool {
        matches!(
            self,
            EventType::MemoryRecalled | EventType::MemoryApplied | EventType::MemoryRejected
        )
    }

    /// The work-item events that move an existing item (not its creation).
    pub fn work_item_transition(self) -> Option<super::WorkItemStatus> {
        use super::WorkItemStatus as S;
        match self {
            EventType::WorkItemStarted => Some(S::Active),
            EventType::WorkItemBlocked => Some(S::Blocked),
            EventType::WorkItemCompleted => Some(S::Completed),
            EventType::WorkItemFailed => Some(S::Failed),
            EventType::WorkItemAbandoned => Some(S::Abandoned),
            _ => None,
        }
    }
}

/// The run id memory feedback is recorded under.
pub const FEEDBACK_RUN: &str = "memory";

/// Run ids reserved for workspace-level events.
pub const RESERVED_RUNS: [&str; 2] = [super::signal::SIGNAL_RUN, FEEDBACK_RUN];

/// What every event records about the software that produced it (§3.4). The server sets
/// `reducer`; `schema` defaults to `<Type>/1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Versions {
    pub reducer: String,
    pub schema: String,
    pub model: String,
    pub prompt: String,
    pub tools: String,
    pub policy: String,
}

/// An event as a worker proposes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub run_id: String,
    pub turn_id: String,
    pub agent_id: String,
    /// The worker's Lamport clock; the server records `max(seen, this) + 1`.
    #[serde(default)]
    pub lamport: Option<u64>,
    #[serde(default)]
    pub versions: Versions,
    pub payload: Value,
}

const MAX_ID_BYTES: usize = 256;

impl NewEvent {
    /// The identifiers are non-empty, bounded, printable.
    pub fn check(&self) -> Result<(), Rejection> {
        check_key("run id", &self.run_id, MAX_ID_BYTES)?;
        check_key("turn id", &self.turn_id, MAX_ID_BYTES)?;
        check_key("agent id", &self.agent_id, MAX_ID_BYTES)?;
        for (name, v) in [
            ("versions.schema", &self.versions.schema),
            ("versions.model", &self.versions.model),
            ("versions.prompt", &self.versions.prompt),
            ("versions.tools", &self.versions.tools),
            ("versions.policy", &self.versions.policy),
        ] {
            if v.len() > MAX_ID_BYTES {
                return Err(Rejection::Invalid(format!(
                    "{name} is longer than {MAX_ID_BYTES} bytes"
                )));
            }
        }
        Ok(())
    }
}

/// A recorded event: the envelope of §3.4 plus the binding's sequence number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerEvent {
    /// 1, 2, 3... per binding and epoch, without gaps.
    pub seq: u64,
    /// Server-minted, sortable by time (26 Crockford base-32 characters).
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub binding_id: String,
    pub epoch: u64,
    pub run_id: String,
    pub turn_id: String,
    pub agent_id: String,
    pub lamport: u64,
    pub recorded_at_ms: i64,
    /// `sha256:` over the type and the canonical payload: what loop detection counts.
    pub intent_hash: String,
    pub versions: Versions,
    pub payload: Value,
    /// Digest of the whole request (what an idempotent retry must match).
    pub request_digest: String,
}

/// JSON with object keys sorted at every level and no insignificant whitespace.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(*k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn sha256_tagged(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// SHA-256 over the type and the canonical payload (§3.4).
pub fn intent_hash(event_type: EventType, payload: &Value) -> String {
    sha256_tagged(&[event_type.as_str(), &canonical_json(payload)])
}

/// SHA-256 over everything a retry must repeat: type, run, turn, agent, versions and the
/// canonical payload (not the Lamport clock, which a retry may advance).
pub fn request_digest(event: &NewEvent) -> String {
    let versions = serde_json::to_value(&event.versions).unwrap_or(Value::Null);
    sha256_tagged(&[
        event.event_type.as_str(),
        &event.run_id,
        &event.turn_id,
        &event.agent_id,
        &canonical_json(&versions),
        &canonical_json(&event.payload),
    ])
}

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A sortable event id: 48 bits of milliseconds then 80 random bits, as 26 Crockford
/// base-32 characters (ids of later milliseconds sort after earlier ones).
pub fn event_id(now_ms: i64, random: u128) -> String {
    let ms = u128::from(u64::try_from(now_ms.max(0)).unwrap_or(0) & ((1 << 48) - 1));
    let value: u128 = (ms << 80) | (random & ((1u128 << 80) - 1));
    let mut out = [0u8; 26];
    for (i, slot) in out.iter_mut().enumerate() {
        let shift = 5 * (25 - i);
        let index = usize::try_from((value >> shift) & 0x1f).unwrap_or(0);
        *slot = CROCKFORD.get(index).copied().unwrap_or(b'0');
    }
    String::from_utf8_lossy(&out).into_owned()
}
