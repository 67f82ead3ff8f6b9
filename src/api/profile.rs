//! `SandboxProfile`: operator-owned description of where and how a harness's workers run,
//! the "Sandbox profile" of `spec/001_78d7ff78f70a2a2a.txt` (non-persisted entities).
//! Profiles are never taken from an agent document or a request: platform teams apply
//! them with GitOps, and bindings only reference them by name.

use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::binding::HarnessId;

/// Where and how a harness's sandboxed workers run: the Agent Sandbox warm pool to claim
/// from, which harnesses and worker images are allowed, limits, timeouts and the idle,
/// hibernation and lifetime rules of every lease.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "harness-engine.dev",
    version = "v1alpha1",
    kind = "SandboxProfile",
    plural = "sandboxprofiles",
    singular = "sandboxprofile",
    shortname = "sbp",
    category = "harness-engine",
    namespaced,
    status = "SandboxProfileStatus",
    derive = "PartialEq",
    doc = "Operator-owned profile for sandboxed harness workers: warm pool, allowed harnesses and worker images, limits, timeouts and lease rules.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Warm Pool",
        type_ = "string",
        json_path = ".spec.warmPoolRef.name"
    ),
    printcolumn(
        name = "Leases",
        type_ = "integer",
        json_path = ".status.activeLeases",
        description = "Active leases using this profile"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("duration(self.timeouts.idleTTL) < duration(self.timeouts.maxLifetime)").message("timeouts.idleTTL must be shorter than timeouts.maxLifetime"))]
pub struct SandboxProfileSpec {
    /// Whether new leases may be taken with this profile. Existing leases are unaffected.
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// The `SandboxWarmPool` (group `extensions.agents.x-k8s.io`) new claims draw from.
    pub warm_pool_ref: WarmPoolReference,

    /// Harness ids allowed to run with this profile.
    #[schemars(length(min = 1, max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_harness_ids: Vec<HarnessId>,

    /// Worker image digests (`sha256:` and 64 hex digits) a worker may run. A lease
    /// becomes Ready only when its pod reports one of these.
    #[schemars(
        length(min = 1, max = 32),
        inner(regex(pattern = r"^sha256:[0-9a-f]{64}$"))
    )]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_worker_image_digests: Vec<String>,

    /// Harness adapter version the certified worker image carries.
    #[schemars(length(min = 1, max = 64))]
    pub adapter_version: String,

    /// Worker protocol versions the worker may negotiate.
    #[schemars(length(min = 1, max = 8), inner(range(min = 1, max = 1000)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub worker_protocol_versions: Vec<i32>,

    /// Workload or risk class, for platform reporting (for example `standard`, `untrusted-code`).
    /// Every SandboxClaim of the profile carries it as label
    /// `harness-engine.dev/workload-class`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub workload_class: Option<String>,

    /// RuntimeClass (isolation level) the warm pool's template must use, if any. The
    /// profile is Ready only when the template's pod spec names exactly this
    /// `runtimeClassName` (reason `RuntimeClassMismatch` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub runtime_class_name: Option<String>,

    /// Resource and concurrency limits. Only `maxActiveLeases` is supported; the
    /// admission webhook refuses the others (not supported yet: worker resources are set
    /// in the SandboxTemplate, which a SandboxClaim cannot override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<SandboxLimits>,

    /// Timeouts and lease lifetime rules.
    #[serde(default)]
    pub timeouts: SandboxTimeouts,

    /// Workspace (sandbox filesystem) policy. Only the default (`mode: ephemeral`, no
    /// `sizeLimit`) is supported; the admission webhook refuses the others.
    #[serde(default)]
    pub workspace: WorkspacePolicy,

    /// Name of the platform-defined egress policy class the template's network policy
    /// implements (for example `data-plane-only`). Not enforced by Harness Engine: every
    /// SandboxClaim of the profile carries it as label
    /// `harness-engine.dev/egress-policy-class`, for the platform's admission and audit.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub egress_policy_class: String,

    /// What happens when a lease is idle for `timeouts.idleTTL`.
    #[serde(default)]
    pub hibernation: HibernationPolicy,

    /// How a claim is released. Only `destroy` is supported: a released sandbox is never
    /// handed to another conversation.
    #[serde(default)]
    pub release_mode: ReleaseMode,

    /// The run ledger's rules for this profile's bindings: budgets (circuit breakers,
    /// `spec/002_6a0ddaf11b83bfe4.txt` §10.1) and each tool's defence against a repeated
    /// effect (§5.2). Applied by the data plane at every event append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<LedgerPolicy>,
}

/// The run ledger's rules for a profile's bindings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerPolicy {
    /// Limits per turn and per run. A limit left out keeps the deployment's default
    /// (`docs/ledger.md`, "Budgets"); an append past a limit is refused with
    /// `budget_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<LedgerBudgetsSpec>,
    /// Tools and how a repeated call of each is defended. A tool with defence `none`
    /// needs a person's approval (a human review resolved `approved`) before every
    /// attempt; an attempt without one is refused with `approval_required`. Tools not
    /// listed are not gated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub tools: Vec<ToolDefence>,
}

/// Budgets per turn and per run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerBudgetsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_turn: Option<BudgetLimits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_run: Option<BudgetLimits>,
}

/// Limits of one scope (a turn or a run); each one left out keeps the default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetLimits {
    /// Events appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub steps: Option<i64>,
    /// Tokens, as reported in event payloads' `usage.tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub tokens: Option<i64>,
    /// Cost units (the deployment's unit), as reported in `usage.cost_units`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cost_units: Option<i64>,
    /// Attempts of effects marked irreversible (0: none allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub irreversible_effects: Option<i64>,
}

/// One tool's defence against a repeated effect.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefence {
    /// The tool name as the worker records it in `EffectAttempted.tool`.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    pub defence: Defence,
}

/// How a tool's provider lets a repeated call be told apart (§5.2).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Defence {
    /// The provider honours an idempotency key: a repeat returns the first result.
    ProviderIdempotency,
    /// The provider can be asked by key whether a call landed (reconciliation).
    QueryableByKey,
    /// A landed call can be undone by a compensating call.
    Compensable,
    /// None of these: every attempt needs a person's approval first.
    None,
}

fn default_true() -> bool {
    true
}

/// Reference to a `SandboxWarmPool`, with an optional UID expectation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolReference {
    /// Name of the `SandboxWarmPool`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the warm pool; defaults to the profile's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// Expected UID of the warm pool. When set, a pool with the same name but another
    /// UID (deleted and recreated) is refused instead of silently used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uid: Option<String>,
}

/// Limits of one worker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLimits {
    /// CPU limit of the worker container. Not supported yet (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory limit of the worker container. Not supported yet (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Ephemeral storage limit. Not supported yet (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<Quantity>,
    /// Maximum number of processes. Not supported yet (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pids: Option<i64>,
    /// Maximum number of leases holding a SandboxClaim at once with this profile. A
    /// binding that needs a first claim (or a claim after an idle release) beyond it waits
    /// with `Ready=False`, reason `MaxActiveLeasesReached`; a replacement of a held lease
    /// is never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_active_leases: Option<i32>,
    /// Maximum concurrent turns one worker runs. Not supported yet (refused): the data
    /// plane has no per-worker turn count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_concurrent_turns: Option<i32>,
}

/// Timeouts and lifetime rules, as Go-style durations (`90s`, `15m`, `1h30m`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTimeouts {
    /// How long a claim may take to become Ready before it is replaced.
    #[serde(default = "default_claim_deadline")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub claim_readiness_deadline: String,
    /// Longest single turn. Not supported yet (refused when set): the data plane does
    /// not end a turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub turn_timeout: Option<String>,
    /// Idle time after which the lease hibernates (see `hibernation`).
    #[serde(default = "default_idle_ttl")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[serde(rename = "idleTTL")]
    pub idle_ttl: String,
    /// Maximum lifetime of one lease; at the end the worker is replaced (next generation).
    #[serde(default = "default_max_lifetime")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub max_lifetime: String,
}

impl Default for SandboxTimeouts {
    fn default() -> Self {
        SandboxTimeouts {
            claim_readiness_deadline: default_claim_deadline(),
            turn_timeout: None,
            idle_ttl: default_idle_ttl(),
            max_lifetime: default_max_lifetime(),
        }
    }
}

fn default_claim_deadline() -> String {
    "2m".into()
}
fn default_idle_ttl() -> String {
    "30m".into()
}
fn default_max_lifetime() -> String {
    "12h".into()
}

/// Workspace (sandbox filesystem) policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspacePolicy {
    /// `ephemeral` (lost with the pod). `persistentVolumeClaim` is not supported yet
    /// (refused).
    #[serde(default)]
    pub mode: WorkspaceMode,
    /// Size limit of the workspace. Not supported yet (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
}

/// Workspace storage mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WorkspaceMode {
    #[default]
    Ephemeral,
    PersistentVolumeClaim,
}

/// Hibernation on idle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HibernationPolicy {
    /// Suspend the sandbox (Agent Sandbox `operatingMode: Suspended`) after the idle TTL;
    /// the next bind resumes it under the same lease generation.
    #[default]
    Suspend,
    /// Release (delete) the SandboxClaim after the idle TTL; the next bind claims a new
    /// sandbox at a new lease generation.
    Release,
    /// Never hibernate: keep the sandbox running until its maximum lifetime.
    Never,
}

/// Release mode; destroy is the only one until reset conformance evidence exists
/// (`spec/001_78d7ff78f70a2a2a.txt`, "Sandbox profile").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReleaseMode {
    #[default]
    Destroy,
}

/// Observed state of a profile.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxProfileStatus {
    /// `Ready` says whether the warm pool resolved and matches every expectation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// UID of the warm pool the profile resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool_uid: Option<String>,
    /// Number of bindings currently holding a lease with this profile.
    #[serde(default)]
    pub active_leases: i32,
}
