//! Which memory an agent may read and write, and how writes are admitted.
//!
//! Two layers (`spec/000_fa938a4e6ac75730.txt` "Memory scopes", `spec/001` §1 "the
//! deployment policy can only make it stricter"):
//! - [`DeploymentMemoryConfig`]: the platform team's ceiling, loaded from configuration:
//!   organization, approvers, application writers, retention policies, and limits;
//! - `MemoryPolicy` objects ([`MemoryPolicySpec`]) selecting agents.
//!
//! [`MemoryPolicySet::effective`] intersects them; nothing in a `MemoryPolicy` can widen
//! what the deployment allows. [`SharedMemoryPolicies`] is the swappable snapshot the
//! server reads on every request and the operator (or `serve`'s files) replaces.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use serde::{Deserialize, Serialize};

use super::{Consolidation, MemoryKind, MemoryScope, WritePolicy, scope_str};
use crate::{api::memory_policy::MemoryPolicySpec, domain::state::Rejection};

/// A deployment-owned retention policy for memory (a stable id, never a per-request TTL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryRetention {
    /// Stable id a `MemoryPolicy` names in `retentionPolicy`.
    pub id: String,
    /// Records expire this many seconds after their last write; absent: kept until deleted.
    #[serde(default)]
    pub max_age_seconds: Option<u64>,
}

impl MemoryRetention {
    pub fn expires_at(&self, now_ms: i64) -> Option<i64> {
        self.max_age_seconds.map(|s| {
            now_ms.saturating_add(i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX))
        })
    }
}

/// The deployment's memory configuration (YAML, `serve --memory-config`, or the chart's
/// values in Kubernetes mode). Every field narrows; none widens a `MemoryPolicy`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentMemoryConfig {
    /// The organization this deployment serves; without it there is no organization scope.
    #[serde(default)]
    pub organization: Option<String>,
    /// Principals who may approve or reject pending writes (never a sandbox worker).
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Principals whose writes are application/admin writes: the only writers of
    /// organization memory, and writers of any scope without approval.
    #[serde(default)]
    pub application_writers: Vec<String>,
    /// The least strict write policy any agent gets (`disabled` turns writes off).
    #[serde(default = "default_ceiling")]
    pub max_write_policy: WritePolicy,
    /// Whether a `MemoryPolicy` may turn on agent-scope (shared learning) writes. Off
    /// unless the deployment opts in (spec 000: agent memory is read-only by default).
    #[serde(default)]
    pub allow_shared_learning: bool,
    /// Whether the `merge` consolidation policy may be used.
    #[serde(default = "yes")]
    pub allow_consolidation: bool,
    /// Kinds any agent may write; absent: all three.
    #[serde(default)]
    pub allowed_kinds: Option<Vec<MemoryKind>>,
    /// Hold every agent write for approval, sensitive or not.
    #[serde(default)]
    pub require_approval: bool,
    /// Most records one search returns.
    #[serde(default = "default_max_results")]
    pub max_results: u32,
    /// Largest memory body, bytes.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Largest caller-supplied embedding, dimensions.
    #[serde(default = "default_max_dims")]
    pub max_embedding_dims: usize,
    /// Retention policies by stable id.
    #[serde(default = "default_retention")]
    pub retention: Vec<MemoryRetention>,
}

fn yes() -> bool {
    true
}
fn default_ceiling() -> WritePolicy {
    WritePolicy::AutomaticScoped
}
fn default_max_results() -> u32 {
    50
}
fn default_max_body() -> usize {
    16 << 10
}
fn default_max_dims() -> usize {
    4096
}
fn default_retention() -> Vec<MemoryRetention> {
    vec![
        MemoryRetention {
            id: "standard".into(),
            max_age_seconds: Some(365 * 24 * 3600),
        },
        MemoryRetention {
            id: "short".into(),
            max_age_seconds: Some(30 * 24 * 3600),
        },
        MemoryRetention {
            id: "indefinite".into(),
            max_age_seconds: None,
        },
    ]
}

impl Default for DeploymentMemoryConfig {
    fn default() -> Self {
        DeploymentMemoryConfig {
            organization: None,
            approvers: Vec::new(),
            application_writers: Vec::new(),
            max_write_policy: default_ceiling(),
            allow_shared_learning: false,
            allow_consolidation: true,
            allowed_kinds: None,
            require_approval: false,
            max_results: default_max_results(),
            max_body_bytes: default_max_body(),
            max_embedding_dims: default_max_dims(),
            retention: default_retention(),
        }
    }
}

impl DeploymentMemoryConfig {
    /// Parses YAML (or JSON) and checks it; an empty document is the default. The error
    /// says what is wrong without a file name (the caller adds it).
    pub fn from_yaml_str(text: &str) -> Result<Self, String> {
        let blank = text
            .lines()
            .map(str::trim)
            .all(|l| l.is_empty() || l.starts_with('#') || l == "---");
        let config: DeploymentMemoryConfig = if blank {
            DeploymentMemoryConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| e.to_string())?
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks what a YAML file cannot express in types.
    pub fn validate(&self) -> Result<(), String> {
        if self.retention.is_empty() {
            return Err("retention must list at least one policy".into());
        }
        let mut ids: Vec<&str> = self.retention.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err("retention policy ids must be unique".into());
        }
        if let Some(org) = &self.organization
            && (org.is_empty() || org.len() > 128 || org.chars().any(char::is_control))
        {
            return Err("organization must be 1 to 128 printable characters".into());
        }
        if self.max_results == 0 || self.max_body_bytes == 0 {
            return Err("maxResults and maxBodyBytes must be positive".into());
        }
        Ok(())
    }

    pub fn retention(&self, id: &str) -> Option<&MemoryRetention> {
        self.retention.iter().find(|r| r.id == id)
    }
}

/// Strictness order: `disabled` > `approval_for_sensitive` > `automatic_scoped`.
fn strictness(p: WritePolicy) -> u8 {
    match p {
        WritePolicy::AutomaticScoped => 0,
        WritePolicy::ApprovalForSensitive => 1,
        WritePolicy::Disabled => 2,
    }
}

/// The stricter of two write policies.
pub fn stricter(a: WritePolicy, b: WritePolicy) -> WritePolicy {
    if strictness(a) >= strictness(b) { a } else { b }
}

/// What one agent gets after intersecting its `MemoryPolicy` with the deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectivePolicy {
    /// The `MemoryPolicy` that selected the agent (`None`: the built-in default).
    pub policy: Option<String>,
    pub enabled: bool,
    pub read_scopes: Vec<MemoryScope>,
    /// The one agent-writable scope; `None`: read-only.
    pub write_scope: Option<MemoryScope>,
    pub write_policy: WritePolicy,
    pub kinds: Vec<MemoryKind>,
    pub max_results: u32,
    pub retention: MemoryRetention,
    pub consolidation: Consolidation,
    pub require_approval: bool,
    /// Why writes are off, when a policy asked for something the deployment forbids.
    pub restriction: Option<String>,
}

/// Where a binding's HarnessBinding lives, for choosing its memory policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyScope {
    pub namespace: String,
    /// `spec.memoryPolicyRef.name`, when the binding names its policy.
    pub policy_ref: Option<String>,
}

/// Binding id -> [`PolicyScope`], kept by the operator's HarnessBinding watch on every
/// replica (the data plane reads it on each memory call).
#[derive(Clone, Debug, Default)]
pub struct BindingScopes(Arc<RwLock<BTreeMap<String, PolicyScope>>>);

impl BindingScopes {
    pub fn get(&self, binding_id: &str) -> Option<PolicyScope> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(binding_id)
            .cloned()
    }
    pub fn set(&self, binding_id: &str, scope: PolicyScope) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(binding_id.to_owned(), scope);
    }
    pub fn remove(&self, binding_id: &str) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(binding_id);
    }
    pub fn replace(&self, all: BTreeMap<String, PolicyScope>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = all;
    }
}

/// A named `MemoryPolicy` (`namespace/name` in Kubernetes, the file's name in `serve`).
#[derive(Clone, Debug, PartialEq)]
pub struct NamedPolicy {
    pub name: String,
    pub spec: MemoryPolicySpec,
}

/// The deployment configuration and every loaded `MemoryPolicy`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryPolicySet {
    pub deployment: DeploymentMemoryConfig,
    /// By name, so replacing one policy is a map insert.
    pub policies: BTreeMap<String, MemoryPolicySpec>,
}

impl MemoryPolicySet {
    /// The policy selecting `agent_id`: one naming the agent wins over `allAgents`; ties
    /// go to the first name in order, so the choice never depends on load order.
    pub fn select(&self, agent_id: &str) -> Option<NamedPolicy> {
        self.select_where(agent_id, |_| true)
    }

    /// [`MemoryPolicySet::select`] among the policies whose name passes `keep`.
    fn select_where(&self, agent_id: &str, keep: impl Fn(&str) -> bool) -> Option<NamedPolicy> {
        let candidates = || self.policies.iter().filter(|(name, _)| keep(name));
        let named = candidates().find(|(_, p)| {
            p.agent_selector
                .agent_ids
                .as_ref()
                .is_some_and(|ids| ids.iter().any(|id| id == agent_id))
        });
        let any = || candidates().find(|(_, p)| p.agent_selector.all_agents == Some(true));
        named.or_else(any).map(|(name, spec)| NamedPolicy {
            name: name.clone(),
            spec: spec.clone(),
        })
    }

    /// The effective policy of `agent_id`: its `MemoryPolicy` narrowed by the
    /// deployment. An agent no policy selects gets no long-term memory at all
    /// (`spec/001_78d7ff78f70a2a2a.txt` §1: memory is opt-in per agent).
    pub fn effective(&self, agent_id: &str) -> EffectivePolicy {
        match self.select(agent_id) {
            Some(p) => self.narrow(p.name, p.spec),
            None => EffectivePolicy::none(&self.deployment, agent_id),
        }
    }

    /// [`MemoryPolicySet::effective`] for a binding in Kubernetes: only the policies of
    /// the binding's own namespace select its agent (policy names are `namespace/name`),
    /// and a `memoryPolicyRef` on the binding names the one policy that applies.
    pub fn effective_in(&self, agent_id: &str, scope: &PolicyScope) -> EffectivePolicy {
        let prefix = format!("{}/", scope.namespace);
        let Some(reference) = &scope.policy_ref else {
            return match self.select_where(agent_id, |name| name.starts_with(&prefix)) {
                Some(p) => self.narrow(p.name, p.spec),
                None => EffectivePolicy::none(&self.deployment, agent_id),
            };
        };
        let key = format!("{prefix}{reference}");
        match self.policies.get(&key) {
            Some(spec)
                if spec.agent_selector.all_agents == Some(true)
                    || spec
                        .agent_selector
                        .agent_ids
                        .as_ref()
                        .is_some_and(|ids| ids.iter().any(|id| id == agent_id)) =>
            {
                self.narrow(key, spec.clone())
            }
            Some(_) => EffectivePolicy::refused(
                &self.deployment,
                format!(
                    "the MemoryPolicy {key} named by this binding's memoryPolicyRef does not select agent {agent_id:?}"
                ),
            ),
            None => EffectivePolicy::refused(
                &self.deployment,
                format!(
                    "the MemoryPolicy {key} named by this binding's memoryPolicyRef does not exist or is not valid"
                ),
            ),
        }
    }

    /// `spec` (the policy `name`) narrowed by the deployment.
    fn narrow(&self, name: String, spec: MemoryPolicySpec) -> EffectivePolicy {
        let name = Some(name);
        let d = &self.deployment;
        let mut restriction = None;
        let mut write_policy = stricter(spec.write_policy, d.max_write_policy);
        let mut write_scope = Some(spec.write_scope);
        match spec.write_scope {
            MemoryScope::User => {}
            MemoryScope::Agent if d.allow_shared_learning => {}
            MemoryScope::Agent => {
                restriction = Some(
                    "the deployment does not allow shared-learning (agent scope) writes".to_owned(),
                );
                write_scope = None;
            }
            MemoryScope::Organization => {
                restriction = Some(
                    "organization memory is written only by applications and administrators"
                        .to_owned(),
                );
                write_scope = None;
            }
        }
        let kinds: Vec<MemoryKind> = spec
            .kinds
            .iter()
            .copied()
            .filter(|k| d.allowed_kinds.as_ref().is_none_or(|a| a.contains(k)))
            .collect();
        let retention = match d.retention(&spec.retention_policy) {
            Some(r) => r.clone(),
            None => {
                restriction = Some(format!(
                    "retention policy {:?} is not configured in this deployment",
                    spec.retention_policy
                ));
                write_policy = WritePolicy::Disabled;
                d.retention[0].clone()
            }
        };
        if !spec.enabled {
            write_policy = WritePolicy::Disabled;
        }
        if write_policy == WritePolicy::Disabled {
            write_scope = None;
        }
        let consolidation = if d.allow_consolidation {
            spec.consolidation
        } else {
            Consolidation::Disabled
        };
        EffectivePolicy {
            policy: name,
            enabled: spec.enabled,
            read_scopes: if spec.enabled {
                spec.read_scopes.clone()
            } else {
                Vec::new()
            },
            write_scope,
            write_policy,
            kinds,
            max_results: u32::try_from(spec.max_results.max(1))
                .unwrap_or(1)
                .min(d.max_results),
            retention,
            consolidation,
            require_approval: d.require_approval,
            restriction,
        }
    }
}

impl EffectivePolicy {
    /// No `MemoryPolicy` selects the agent: nothing to read, nothing to write.
    fn none(deployment: &DeploymentMemoryConfig, agent_id: &str) -> Self {
        Self::refused(
            deployment,
            format!(
                "no MemoryPolicy selects agent {agent_id:?}, so it has no long-term memory (create one whose agentSelector names it)"
            ),
        )
    }

    /// No long-term memory, for the reason `why`.
    fn refused(deployment: &DeploymentMemoryConfig, why: String) -> Self {
        EffectivePolicy {
            policy: None,
            enabled: false,
            read_scopes: Vec::new(),
            write_scope: None,
            write_policy: WritePolicy::Disabled,
            kinds: Vec::new(),
            max_results: 1,
            retention: deployment.retention[0].clone(),
            consolidation: Consolidation::Disabled,
            require_approval: deployment.require_approval,
            restriction: Some(why),
        }
    }
}

/// Who is writing: a sandbox worker (model-produced content) or a control-plane
/// application, and whether the deployment lists it as an application writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    pub principal: String,
    pub is_worker: bool,
    pub is_application_writer: bool,
}

impl Writer {
    pub fn of(deployment: &DeploymentMemoryConfig, principal: &str, is_worker: bool) -> Self {
        Writer {
            principal: principal.to_owned(),
            is_worker,
            is_application_writer: !is_worker
                && deployment
                    .application_writers
                    .iter()
                    .any(|w| w == principal),
        }
    }
}

/// Pipeline step 1 for reads: the scope must be one the policy reads (application
/// writers read every scope they may write).
pub fn authorize_read(
    policy: &EffectivePolicy,
    writer: &Writer,
    scope: MemoryScope,
) -> Result<(), Rejection> {
    if writer.is_application_writer || policy.read_scopes.contains(&scope) {
        Ok(())
    } else if policy.policy.is_none()
        && let Some(why) = &policy.restriction
    {
        Err(Rejection::Forbidden(why.clone()))
    } else {
        Err(Rejection::Forbidden(format!(
            "the memory policy of this agent does not allow reading {} memory",
            scope_str(scope)
        )))
    }
}

/// Pipeline step 1 for writes (`spec/000` "Memory scopes" table): user memory through
/// the policy, agent memory only with shared learning enabled, organization memory only
/// by application writers. Application writers may write any scope.
pub fn authorize_write(
    policy: &EffectivePolicy,
    writer: &Writer,
    scope: MemoryScope,
    kind: MemoryKind,
) -> Result<(), Rejection> {
    if writer.is_application_writer {
        return Ok(());
    }
    if scope == MemoryScope::Organization {
        return Err(Rejection::Forbidden(
            "organization memory is read-only; only application writers configured by the deployment write it".into(),
        ));
    }
    if policy.write_scope != Some(scope) {
        let why = policy
            .restriction
            .clone()
            .unwrap_or_else(|| match policy.write_scope {
                None => "the memory policy of this agent makes memory read-only".into(),
                Some(s) => format!("this agent writes only {} memory", scope_str(s)),
            });
        return Err(Rejection::Forbidden(format!(
            "writing {} memory is not allowed: {why}",
            scope_str(scope)
        )));
    }
    if !policy.kinds.contains(&kind) {
        return Err(Rejection::Forbidden(format!(
            "the memory policy of this agent does not allow writing {} memory",
            super::kind_str(kind)
        )));
    }
    Ok(())
}

/// Approve and reject have their own authorization: a configured approver, never a
/// sandbox worker, never the principal that wrote the record.
pub fn authorize_decision(
    deployment: &DeploymentMemoryConfig,
    principal: &str,
    is_worker: bool,
    record_writer: &str,
) -> Result<(), Rejection> {
    if is_worker {
        return Err(Rejection::Forbidden(
            "a sandbox worker cannot approve or reject memory".into(),
        ));
    }
    if !deployment.approvers.iter().any(|a| a == principal) {
        return Err(Rejection::Forbidden(format!(
            "{principal} is not a memory approver in this deployment"
        )));
    }
    if principal == record_writer {
        return Err(Rejection::Forbidden(
            "the writer of a memory cannot approve or reject it".into(),
        ));
    }
    Ok(())
}

/// The swappable snapshot every request reads. `serve` fills it from files at start;
/// the operator's `MemoryPolicy` watch calls [`SharedMemoryPolicies::upsert`] and
/// [`SharedMemoryPolicies::remove`] (or [`SharedMemoryPolicies::replace`]) as objects
/// change. Readers take an `Arc` of the current set, so a swap never blocks a search.
#[derive(Clone, Debug, Default)]
pub struct SharedMemoryPolicies(Arc<RwLock<Arc<MemoryPolicySet>>>);

impl SharedMemoryPolicies {
    pub fn new(set: MemoryPolicySet) -> Self {
        SharedMemoryPolicies(Arc::new(RwLock::new(Arc::new(set))))
    }
    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<MemoryPolicySet> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn update(&self, f: impl FnOnce(&mut MemoryPolicySet)) {
        let mut guard = self.0.write().unwrap_or_else(|p| p.into_inner());
        let mut next = (**guard).clone();
        f(&mut next);
        *guard = Arc::new(next);
    }
    /// Replaces everything (a fresh list from a watch re-sync).
    pub fn replace(&self, set: MemoryPolicySet) {
        self.update(|s| *s = set);
    }
    /// Replaces the deployment configuration, keeping the policies.
    pub fn set_deployment(&self, deployment: DeploymentMemoryConfig) {
        self.update(|s| s.deployment = deployment);
    }
    /// Adds or replaces one `MemoryPolicy` by name.
    pub fn upsert(&self, name: &str, spec: MemoryPolicySpec) {
        self.update(|s| {
            s.policies.insert(name.to_owned(), spec);
        });
    }
    /// Removes one `MemoryPolicy` by name.
    pub fn remove(&self, name: &str) {
        self.update(|s| {
            s.policies.remove(name);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> MemoryPolicySpec {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    fn set(
        policies: &[(&str, serde_json::Value)],
        deployment: DeploymentMemoryConfig,
    ) -> MemoryPolicySet {
        MemoryPolicySet {
            deployment,
            policies: policies
                .iter()
                .map(|(n, j)| ((*n).to_owned(), spec(j.clone())))
                .collect(),
        }
    }

    fn worker() -> Writer {
        Writer {
            principal: "w".into(),
            is_worker: true,
            is_application_writer: false,
        }
    }

    /// The CRD's defaults: what a policy selecting everyone with no other field gets.
    fn all_agents() -> MemoryPolicySet {
        set(
            &[(
                "all",
                serde_json::json!({"agentSelector": {"allAgents": true}}),
            )],
            DeploymentMemoryConfig::default(),
        )
    }

    #[test]
    fn deployment_configuration_text() {
        for empty in ["", "# the defaults\n", "---\n# nothing\n"] {
            assert_eq!(
                DeploymentMemoryConfig::from_yaml_str(empty),
                Ok(DeploymentMemoryConfig::default()),
                "{empty:?}"
            );
        }
        let d = DeploymentMemoryConfig::from_yaml_str(
            "organization: acme\napprovers: [r]\nallowSharedLearning: true\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.organization.as_deref(), Some("acme"));
        assert!(d.allow_shared_learning);
        for (bad, says) in [
            ("approvers: r: x\n", ""),
            ("approver: [r]\n", "approver"),
            ("retention: []\n", "retention must list at least one policy"),
            (
                "retention: [{id: a}, {id: a}]\n",
                "retention policy ids must be unique",
            ),
        ] {
            let e = DeploymentMemoryConfig::from_yaml_str(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn in_kubernetes_policies_select_only_their_namespace_and_a_ref_names_one() {
        let s = set(
            &[
                (
                    "team-a/all",
                    serde_json::json!({"agentSelector": {"allAgents": true}}),
                ),
                (
                    "team-a/strict",
                    serde_json::json!({"agentSelector": {"agentIds": ["bot"]}, "writePolicy": "disabled"}),
                ),
                (
                    "team-b/all",
                    serde_json::json!({"agentSelector": {"allAgents": true}, "maxResults": 3}),
                ),
            ],
            DeploymentMemoryConfig::default(),
        );
        let scope = |ns: &str, r: Option<&str>| PolicyScope {
            namespace: ns.into(),
            policy_ref: r.map(str::to_owned),
        };
        // (agent, scope, chosen policy or None, part of the refusal)
        let cases = [
            ("bot", scope("team-a", None), Some("team-a/strict"), ""),
            ("other", scope("team-a", None), Some("team-a/all"), ""),
            ("bot", scope("team-b", None), Some("team-b/all"), ""),
            (
                "bot",
                scope("team-c", None),
                None,
                "no MemoryPolicy selects agent",
            ),
            ("bot", scope("team-a", Some("all")), Some("team-a/all"), ""),
            (
                "other",
                scope("team-a", Some("strict")),
                None,
                "does not select agent",
            ),
            ("bot", scope("team-a", Some("gone")), None, "does not exist"),
            ("bot", scope("team-c", Some("all")), None, "team-c/all"),
        ];
        for (agent, sc, want, why) in cases {
            let e = s.effective_in(agent, &sc);
            assert_eq!(e.policy.as_deref(), want, "{agent} in {sc:?}");
            if want.is_none() {
                assert!(!e.enabled && e.read_scopes.is_empty(), "{agent} in {sc:?}");
                assert!(
                    e.restriction.as_deref().is_some_and(|r| r.contains(why)),
                    "{agent} in {sc:?}: {:?}",
                    e.restriction
                );
            }
        }
        assert_eq!(s.effective_in("x", &scope("team-b", None)).max_results, 3);
    }

    #[test]
    fn no_policy_means_no_long_term_memory() {
        let e = MemoryPolicySet::default().effective("agent-1");
        assert_eq!(e.policy, None);
        assert!(!e.enabled);
        assert_eq!(e.write_scope, None);
        assert!(e.read_scopes.is_empty());
        for scope in [MemoryScope::User, MemoryScope::Agent] {
            let refused = authorize_read(&e, &worker(), scope).unwrap_err();
            assert!(
                format!("{refused:?}").contains("no MemoryPolicy selects agent"),
                "{refused:?}"
            );
            let refused = authorize_write(&e, &worker(), scope, MemoryKind::Semantic).unwrap_err();
            assert!(
                format!("{refused:?}").contains("no MemoryPolicy selects"),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn default_is_user_scope_with_approval_for_sensitive() {
        let e = all_agents().effective("agent-1");
        assert_eq!(e.policy.as_deref(), Some("all"));
        assert_eq!(e.write_scope, Some(MemoryScope::User));
        assert_eq!(e.write_policy, WritePolicy::ApprovalForSensitive);
        assert_eq!(e.read_scopes, vec![MemoryScope::User]);
        assert_eq!(e.kinds, vec![MemoryKind::Semantic]);
        assert_eq!(e.retention.id, "standard");
    }

    #[test]
    fn deployment_only_narrows() {
        // table: (policy write policy, deployment ceiling, effective)
        let cases = [
            (
                "automatic_scoped",
                WritePolicy::AutomaticScoped,
                WritePolicy::AutomaticScoped,
            ),
            (
                "automatic_scoped",
                WritePolicy::ApprovalForSensitive,
                WritePolicy::ApprovalForSensitive,
            ),
            (
                "approval_for_sensitive",
                WritePolicy::AutomaticScoped,
                WritePolicy::ApprovalForSensitive,
            ),
            (
                "automatic_scoped",
                WritePolicy::Disabled,
                WritePolicy::Disabled,
            ),
            (
                "disabled",
                WritePolicy::AutomaticScoped,
                WritePolicy::Disabled,
            ),
        ];
        for (policy, ceiling, want) in cases {
            let d = DeploymentMemoryConfig {
                max_write_policy: ceiling,
                ..Default::default()
            };
            let s = set(
                &[(
                    "p",
                    serde_json::json!({"agentSelector": {"allAgents": true}, "writePolicy": policy}),
                )],
                d,
            );
            let e = s.effective("a");
            assert_eq!(e.write_policy, want, "{policy} under {ceiling:?}");
            assert_eq!(e.write_scope.is_none(), want == WritePolicy::Disabled);
        }
    }

    #[test]
    fn shared_learning_and_kinds_follow_the_deployment() {
        let p = serde_json::json!({"agentSelector": {"agentIds": ["a"]}, "writeScope": "agent",
            "kinds": ["semantic", "procedural"], "writePolicy": "automatic_scoped"});
        let open = set(
            &[("p", p.clone())],
            DeploymentMemoryConfig {
                allow_shared_learning: true,
                ..Default::default()
            },
        )
        .effective("a");
        assert_eq!(open.write_scope, Some(MemoryScope::Agent));
        let closed = set(
            &[("p", p)],
            DeploymentMemoryConfig {
                allow_shared_learning: false,
                allowed_kinds: Some(vec![MemoryKind::Semantic]),
                ..Default::default()
            },
        )
        .effective("a");
        assert_eq!(closed.write_scope, None);
        assert_eq!(closed.kinds, vec![MemoryKind::Semantic]);
        assert!(
            closed
                .restriction
                .is_some_and(|r| r.contains("shared-learning"))
        );
    }

    #[test]
    fn a_specific_policy_beats_all_agents_and_unknown_retention_fails_closed() {
        let s = set(
            &[
                (
                    "a-all",
                    serde_json::json!({"agentSelector": {"allAgents": true}, "maxResults": 5}),
                ),
                (
                    "z-named",
                    serde_json::json!({"agentSelector": {"agentIds": ["x"]}, "retentionPolicy": "nope"}),
                ),
            ],
            DeploymentMemoryConfig::default(),
        );
        assert_eq!(s.effective("y").policy.as_deref(), Some("a-all"));
        assert_eq!(s.effective("y").max_results, 5);
        let x = s.effective("x");
        assert_eq!(x.policy.as_deref(), Some("z-named"));
        assert_eq!(x.write_policy, WritePolicy::Disabled);
        assert!(x.restriction.is_some_and(|r| r.contains("nope")));
    }

    #[test]
    fn write_authorization_table() {
        let e = all_agents().effective("a");
        let app = Writer {
            principal: "app".into(),
            is_worker: false,
            is_application_writer: true,
        };
        let plain = Writer {
            principal: "svc".into(),
            is_worker: false,
            is_application_writer: false,
        };
        let cases = [
            (&worker(), MemoryScope::User, MemoryKind::Semantic, None),
            (
                &worker(),
                MemoryScope::Agent,
                MemoryKind::Semantic,
                Some("forbidden_scope"),
            ),
            (
                &worker(),
                MemoryScope::Organization,
                MemoryKind::Semantic,
                Some("forbidden_scope"),
            ),
            (
                &worker(),
                MemoryScope::User,
                MemoryKind::Procedural,
                Some("forbidden_scope"),
            ),
            (
                &plain,
                MemoryScope::Organization,
                MemoryKind::Semantic,
                Some("forbidden_scope"),
            ),
            (&plain, MemoryScope::User, MemoryKind::Semantic, None),
            (
                &app,
                MemoryScope::Organization,
                MemoryKind::Procedural,
                None,
            ),
        ];
        for (w, scope, kind, want) in cases {
            let got = authorize_write(&e, w, scope, kind).err().map(|r| r.code());
            assert_eq!(got, want, "{} {scope:?} {kind:?}", w.principal);
        }
        assert!(authorize_read(&e, &worker(), MemoryScope::Organization).is_err());
        assert!(authorize_read(&e, &worker(), MemoryScope::User).is_ok());
    }

    #[test]
    fn decisions_need_an_approver_who_is_not_the_writer() {
        let d = DeploymentMemoryConfig {
            approvers: vec!["reviewer".into()],
            ..Default::default()
        };
        assert!(authorize_decision(&d, "reviewer", false, "svc").is_ok());
        assert!(authorize_decision(&d, "reviewer", true, "svc").is_err());
        assert!(authorize_decision(&d, "svc", false, "other").is_err());
        assert!(authorize_decision(&d, "reviewer", false, "reviewer").is_err());
    }

    #[test]
    fn the_shared_snapshot_swaps() {
        let shared = SharedMemoryPolicies::default();
        let before = shared.snapshot();
        shared.upsert(
            "p",
            spec(serde_json::json!({"agentSelector": {"agentIds": ["a"]}, "enabled": false})),
        );
        assert!(
            before.policies.is_empty(),
            "a held snapshot does not change"
        );
        assert!(!shared.snapshot().effective("a").enabled);
        shared.upsert(
            "p",
            spec(serde_json::json!({"agentSelector": {"agentIds": ["a"]}})),
        );
        assert!(shared.snapshot().effective("a").enabled);
        shared.remove("p");
        assert!(shared.snapshot().effective("a").policy.is_none());
    }
}
