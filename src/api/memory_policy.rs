//! `MemoryPolicy`: the portable long-term memory policy of `spec/001_78d7ff78f70a2a2a.txt`
//! §1 ("Optional portable long-term memory policy") as a Kubernetes object, plus the
//! selector of the agents it governs. The deployment policy can only make it stricter.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Long-term memory policy for a set of agents: which scopes they read, where and how
/// they may write, which kinds of memory, how retrieval works, and which deployment
/// retention policy applies.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "harness-engine.dev",
    version = "v1alpha1",
    kind = "MemoryPolicy",
    plural = "memorypolicies",
    singular = "memorypolicy",
    shortname = "mempol",
    category = "harness-engine",
    namespaced,
    status = "MemoryPolicyStatus",
    derive = "PartialEq",
    doc = "Long-term memory policy for the agents it selects: read scopes, write scope and policy, kinds, retrieval, and retention.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Enabled", type_ = "boolean", json_path = ".spec.enabled"),
    printcolumn(name = "Write Scope", type_ = "string", json_path = ".spec.writeScope"),
    printcolumn(
        name = "Write Policy",
        type_ = "string",
        json_path = ".spec.writePolicy"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.writeScope != 'organization'").message("writeScope cannot be organization: organization memory is written only by applications and administrators, never configured for agents"))]
#[x_kube(validation = Rule::new("self.writePolicy == 'disabled' || self.kinds.size() > 0").message("kinds must list at least one memory kind when writes are enabled"))]
pub struct MemoryPolicySpec {
    /// Which agents this policy governs.
    pub agent_selector: AgentSelector,

    /// Whether the selected agents get cross-thread memory at all.
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// Scopes the agents may read.
    #[serde(default = "default_read_scopes")]
    #[schemars(length(max = 3))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub read_scopes: Vec<MemoryScope>,

    /// The one scope the agents write to. `user` is the default; `agent` (shared
    /// learning) must be enabled explicitly; `organization` is never agent-writable.
    #[serde(default)]
    pub write_scope: MemoryScope,

    /// How writes are admitted. Deployment policy may only make this stricter.
    #[serde(default)]
    pub write_policy: WritePolicy,

    /// Kinds of memory the agents may write.
    #[serde(default = "default_kinds")]
    #[schemars(length(max = 3))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub kinds: Vec<MemoryKind>,

    /// When memory is retrieved; both modes authorize and filter before ranking.
    #[serde(default)]
    pub retrieval: Retrieval,

    /// Most records one search returns.
    #[serde(default = "default_max_results")]
    #[schemars(range(min = 1, max = 100))]
    pub max_results: i32,

    /// Stable id of a deployment-owned retention policy (never an arbitrary TTL).
    #[serde(default = "default_retention")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$")
    )]
    pub retention_policy: String,

    /// What a write with a stale expected revision does: `disabled` refuses it,
    /// `merge` writes a new revision that records every source revision.
    #[serde(default)]
    pub consolidation: Consolidation,
}

fn default_true() -> bool {
    true
}
fn default_read_scopes() -> Vec<MemoryScope> {
    vec![MemoryScope::User]
}
fn default_kinds() -> Vec<MemoryKind> {
    vec![MemoryKind::Semantic]
}
fn default_max_results() -> i32 {
    10
}
fn default_retention() -> String {
    "standard".into()
}

/// Selects agents by id. Exactly one of `agentIds` or `allAgents` is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "has(self.agentIds) != has(self.allAgents)", "message": "set exactly one of agentIds or allAgents"}, {"rule": "!has(self.allAgents) || self.allAgents", "message": "allAgents, when set, must be true"}]))]
pub struct AgentSelector {
    /// Agent ids this policy applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), inner(length(min = 1, max = 128)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub agent_ids: Option<Vec<String>>,
    /// Apply to every agent in the namespace (a more specific policy wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_agents: Option<bool>,
}

/// Memory scope (`spec/000_fa938a4e6ac75730.txt`, "Memory scopes").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// environment + subject + agent.
    #[default]
    User,
    /// environment + agent (shared learning).
    Agent,
    /// environment + organization + agent/policy set.
    Organization,
}

/// Write admission policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WritePolicy {
    /// No writes.
    Disabled,
    /// Writes that pass scanning and redaction are stored at once.
    AutomaticScoped,
    /// Writes classified sensitive wait for human approval.
    #[default]
    ApprovalForSensitive,
}

/// Memory kind (`spec/000_fa938a4e6ac75730.txt`, "Memory kinds").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    /// Facts and preferences.
    Semantic,
    /// An authorized summary of, or reference to, prior thread state.
    EpisodicReference,
    /// A learned procedure.
    Procedural,
}

/// Retrieval mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Retrieval {
    /// A bounded set retrieved when a run starts.
    StartupBounded,
    /// Retrieved when the agent asks.
    #[default]
    OnDemand,
}

/// Conflict handling for stale writes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Consolidation {
    #[default]
    Disabled,
    Merge,
}

/// Observed state of a memory policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPolicyStatus {
    /// `Ready` says whether the policy is valid against the deployment policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Agent ids of the bindings this policy currently governs (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub selected_agents: Vec<String>,
}
