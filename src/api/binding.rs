//! `HarnessBinding`: one per conversation. Its spec is the conversation's identity and
//! desired configuration; its status is the sandbox lease (the fencing token) and a
//! projection of the durable thread-state head.
//!
//! Field meanings follow `spec/001_78d7ff78f70a2a2a.txt` §2 (session binding), §3 (sandbox
//! lease snapshot), §4 (thread persistence metadata) and §6 (pending interrupt).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A conversation's binding to a sandboxed harness worker. Create one per conversation;
/// the operator claims a sandbox for it, fences every worker with a lease generation, and
/// keeps its durable thread-state head outside the sandbox pod. Clear the conversation by
/// raising `spec.epoch` by one.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "harness-engine.dev",
    version = "v1alpha1",
    kind = "HarnessBinding",
    plural = "harnessbindings",
    singular = "harnessbinding",
    shortname = "hb",
    category = "harness-engine",
    namespaced,
    status = "HarnessBindingStatus",
    derive = "PartialEq",
    doc = "A conversation's binding to a sandboxed agent harness: identity and desired configuration in spec; sandbox lease (fencing generation) and durable thread-state projection in status.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Lifecycle", type_ = "string", json_path = ".status.lifecycle"),
    printcolumn(
        name = "Lease",
        type_ = "integer",
        json_path = ".status.lease.generation",
        description = "Lease generation: the fencing token of the current worker"
    ),
    printcolumn(
        name = "Epoch",
        type_ = "integer",
        json_path = ".spec.epoch",
        description = "Conversation epoch: raised by one on every clear"
    ),
    printcolumn(
        name = "Revision",
        type_ = "integer",
        json_path = ".status.state.durableRevision",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.agentId == oldSelf.agentId").message("agentId is immutable: create a new HarnessBinding for another agent"))]
#[x_kube(validation = Rule::new("self.conversationId == oldSelf.conversationId").message("conversationId is immutable: create a new HarnessBinding for another conversation"))]
#[x_kube(validation = Rule::new("self.subjectRef == oldSelf.subjectRef").message("subjectRef is immutable: a binding never changes owner"))]
#[x_kube(validation = Rule::new("self.epoch == oldSelf.epoch || self.epoch == oldSelf.epoch + 1").message("epoch may only stay the same or rise by exactly 1 (one conversation clear)"))]
#[x_kube(validation = Rule::new("self.epoch != oldSelf.epoch || self.harness.id == oldSelf.harness.id").message("harness.id is immutable within an epoch: clear the conversation (epoch + 1) to change harness"))]
#[x_kube(validation = Rule::new("self.epoch != oldSelf.epoch || self.sandboxProfileRef.name == oldSelf.sandboxProfileRef.name").message("sandboxProfileRef is immutable within an epoch: clear the conversation (epoch + 1) to change profile"))]
pub struct HarnessBindingSpec {
    /// The agent this conversation talks to (an existing agent id).
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?$")
    )]
    pub agent_id: String,

    /// The conversation this binding serves (an existing conversation id).
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?$")
    )]
    pub conversation_id: String,

    /// The conversation owner as a keyed digest (`hmac-sha256:` and 64 hex digits),
    /// computed with the environment-held key. Never a raw subject, user name or email.
    #[schemars(regex(pattern = r"^hmac-sha256:[0-9a-f]{64}$"))]
    pub subject_ref: String,

    /// Which harness runs the conversation, and how.
    pub harness: HarnessSpec,

    /// The `SandboxProfile` (same namespace) that decides where and how workers run.
    pub sandbox_profile_ref: LocalObjectReference,

    /// The `MemoryPolicy` (same namespace) governing long-term memory for this
    /// conversation. Without one, the conversation gets no cross-thread memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_policy_ref: Option<LocalObjectReference>,

    /// Conversation epoch. Raise it by exactly one to clear the conversation: the old
    /// epoch's pending state, heads and interrupts can never become the new head.
    /// Long-term memory is not touched by a clear.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub epoch: i64,
}

/// Harness selection (`spec/001_78d7ff78f70a2a2a.txt` §1).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HarnessSpec {
    /// Registered harness id.
    pub id: HarnessId,

    /// Canonical adapter contract version the adapter must support.
    #[serde(default = "default_contract_version")]
    #[schemars(range(min = 1, max = 1000))]
    pub contract_version: i32,

    /// What happens to this conversation when the agent's harness changes: `pin` keeps the
    /// harness the conversation started with, `new_conversation` starts a new one,
    /// `certified_transfer` moves state only where a transfer is certified.
    #[serde(default)]
    pub conversation_policy: ConversationPolicy,

    /// Adapter-owned options. At most 32 KiB encoded; secrets, tokens, credentials,
    /// environment dictionaries, module paths, commands and code are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::harness_options")]
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
}

fn default_contract_version() -> i32 {
    1
}

/// Registered harness ids (the static harness registry).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum HarnessId {
    #[serde(rename = "deepagents")]
    DeepAgents,
    #[serde(rename = "claude_agent_sdk")]
    ClaudeAgentSdk,
    #[serde(rename = "strands")]
    Strands,
    #[serde(rename = "agentcore")]
    AgentCore,
}

impl HarnessId {
    pub fn as_str(self) -> &'static str {
        match self {
            HarnessId::DeepAgents => "deepagents",
            HarnessId::ClaudeAgentSdk => "claude_agent_sdk",
            HarnessId::Strands => "strands",
            HarnessId::AgentCore => "agentcore",
        }
    }
}

/// Conversation policy on harness change (`spec/001_78d7ff78f70a2a2a.txt` §1).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConversationPolicy {
    #[default]
    Pin,
    NewConversation,
    CertifiedTransfer,
}

/// A reference to an object in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// Observed state of a binding. Written only by the operator: the lease with a
/// compare-and-set on `resourceVersion`, everything else by server-side apply.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HarnessBindingStatus {
    /// Standard conditions: `Ready` (the binding can take a turn), `SandboxReady` (the
    /// current lease's sandbox is Ready and its worker verified), `StateDurable` (the
    /// latest turn is committed), and others that explain a failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Where the binding is in its lease lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,

    /// The current sandbox lease: the fencing token and the exact identity of the
    /// claimed sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,

    /// A rate-limited projection of the durable thread-state head. The state store is
    /// the source of truth; this is for `kubectl` and never read back as truth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateProjection>,

    /// The interrupt waiting for input, if any (a summary: the body stays in the store),
    /// mirrored from the store's pending interrupt of the current epoch at the state
    /// projection's cadence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_interrupt: Option<PendingInterruptSummary>,
}

/// Lease lifecycle (`spec/001_78d7ff78f70a2a2a.txt` §3), plus `clearing` while an epoch
/// clear is in progress.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// A sandbox has been claimed and is not Ready yet.
    Claiming,
    /// The worker is verified and can take a turn.
    Ready,
    /// A turn is running: the epoch's run ledger has a run started and not completed
    /// (mirrored at the state projection's cadence, `--state-projection-seconds`). A
    /// busy lease is never hibernated.
    Busy,
    /// The sandbox is suspended after its idle TTL; the next bind resumes it.
    Hibernated,
    /// The lease generation was raised and a new sandbox is being claimed.
    Replacing,
    /// The claim is being released (binding deleted).
    Releasing,
    /// The binding cannot make progress; the conditions say why.
    Failed,
    /// The conversation is being cleared into a new epoch.
    Clearing,
}

/// The sandbox lease snapshot (`spec/001_78d7ff78f70a2a2a.txt` §3). `generation` is the
/// fencing token: every state, memory or ledger write carrying an older generation is
/// refused.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Monotonic fencing value, raised by one on every worker replacement.
    #[schemars(range(min = 0))]
    pub generation: i64,
    /// The conversation epoch this lease serves. A lease of an older epoch is replaced
    /// by a fresh one after the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub epoch: Option<i64>,
    /// Name of the `SandboxClaim` of this generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// UID of that claim: guards against name reuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_uid: Option<String>,
    /// Name of the bound `Sandbox`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_name: Option<String>,
    /// UID of the bound `Sandbox`; unique to this binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_uid: Option<String>,
    /// Name of the worker pod verified for this generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_pod_name: Option<String>,
    /// UID of that pod. A new pod (even under the same Sandbox) is a new worker and gets
    /// a new generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_pod_uid: Option<String>,
    /// Image digest the worker actually runs (from its pod's container status), checked
    /// against the profile's allowed digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_image_digest: Option<String>,
    /// Worker protocol version negotiated with the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<i32>,
    /// When this generation's claim was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<Time>,
    /// When the worker was verified and the lease became Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
    /// Last time the worker was seen active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<Time>,
    /// When the lease reaches the profile's maximum lifetime and is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

/// Projection of the thread-state head (`spec/001_78d7ff78f70a2a2a.txt` §4).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateProjection {
    /// Monotonic revision of the durable head.
    #[schemars(range(min = 0))]
    pub durable_revision: i64,
    /// Durability of the latest turn.
    pub durability_status: DurabilityStatus,
    /// When the durable head was last committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_at: Option<Time>,
}

/// Durability of the latest turn (`spec/001_78d7ff78f70a2a2a.txt` §4).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityStatus {
    /// Native state written, head not committed yet.
    #[default]
    Pending,
    /// Native state and head committed: the turn is durable.
    Committed,
    /// A crash or failure left the outcome ambiguous; the run is fenced until reconciled.
    Uncertain,
    /// The commit failed; the previous head stands.
    Failed,
}

/// Summary of the pending interrupt (`spec/001_78d7ff78f70a2a2a.txt` §6). Prompts, fields
/// and tool arguments stay in the state store.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingInterruptSummary {
    /// Stable, opaque id, unique within the binding epoch.
    pub interrupt_id: String,
    /// `form_input` or `tool_approval`.
    #[serde(rename = "type")]
    pub kind: InterruptType,
    /// The run that raised the interrupt (opaque).
    pub run_id: String,
    /// Revision a resume must match.
    pub revision: i64,
    /// When the interrupt was raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
}

/// Kind of pending interrupt.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InterruptType {
    FormInput,
    ToolApproval,
}
