//! `MemoryPolicy` rules: organization memory is never agent-writable, the agent selector
//! selects someone, and a policy may only be stricter than the deployment memory policy
//! (`spec/001_78d7ff78f70a2a2a.txt` §1, "Optional portable long-term memory policy";
//! `spec/000_fa938a4e6ac75730.txt`, "Memory scopes").
//!
//! The deployment memory policy is operator configuration, loaded from a YAML file. Per
//! memory scope it says the loosest write policy allowed, the memory kinds agents may
//! write, the cap on `maxResults`, the retention policy ids that exist, and whether the
//! scope may be read. Its defaults follow spec 000's default write policy per scope:
//! `user` writes go through scanning and approval (`automatic_scoped` is the loosest),
//! `agent` is read-only until shared learning is enabled here, `organization` is
//! read-only (application and administrator writes only).

use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Violation;
use crate::api::{
    MemoryPolicySpec,
    memory_policy::{MemoryKind, MemoryScope, WritePolicy},
};

/// How strict a write policy is: higher is stricter.
/// `disabled` > `approval_for_sensitive` > `automatic_scoped`.
pub fn strictness(policy: WritePolicy) -> u8 {
    match policy {
        WritePolicy::Disabled => 2,
        WritePolicy::ApprovalForSensitive => 1,
        WritePolicy::AutomaticScoped => 0,
    }
}

fn write_policy_name(policy: WritePolicy) -> &'static str {
    match policy {
        WritePolicy::Disabled => "disabled",
        WritePolicy::ApprovalForSensitive => "approval_for_sensitive",
        WritePolicy::AutomaticScoped => "automatic_scoped",
    }
}

fn scope_name(scope: MemoryScope) -> &'static str {
    match scope {
        MemoryScope::User => "user",
        MemoryScope::Agent => "agent",
        MemoryScope::Organization => "organization",
    }
}

fn kind_name(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Semantic => "semantic",
        MemoryKind::EpisodicReference => "episodic_reference",
        MemoryKind::Procedural => "procedural",
    }
}

/// The deployment's limits for one memory scope.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScopeLimits {
    /// The loosest write policy a `MemoryPolicy` writing to this scope may ask for.
    /// Omitted in a scope that the file lists: `disabled` (fail closed).
    #[serde(default = "strictest")]
    pub loosest_write_policy: WritePolicy,
    /// Memory kinds agents may write to this scope.
    #[serde(default = "all_kinds")]
    pub allowed_kinds: Vec<MemoryKind>,
    /// Largest `maxResults` a policy may set.
    #[serde(default = "default_max_results_cap")]
    pub max_results: i32,
    /// Retention policy ids that exist in this deployment for this scope.
    #[serde(default = "default_retention_policies")]
    pub retention_policies: Vec<String>,
    /// Whether agents may read this scope at all.
    #[serde(default = "default_true")]
    pub readable: bool,
}

impl ScopeLimits {
    fn with_loosest(policy: WritePolicy) -> Self {
        ScopeLimits {
            loosest_write_policy: policy,
            allowed_kinds: all_kinds(),
            max_results: default_max_results_cap(),
            retention_policies: default_retention_policies(),
            readable: true,
        }
    }
}

fn strictest() -> WritePolicy {
    WritePolicy::Disabled
}
fn all_kinds() -> Vec<MemoryKind> {
    vec![
        MemoryKind::Semantic,
        MemoryKind::EpisodicReference,
        MemoryKind::Procedural,
    ]
}
fn default_max_results_cap() -> i32 {
    100
}
fn default_retention_policies() -> Vec<String> {
    vec!["standard".into()]
}
fn default_true() -> bool {
    true
}
fn default_user() -> ScopeLimits {
    ScopeLimits::with_loosest(WritePolicy::AutomaticScoped)
}
fn default_read_only() -> ScopeLimits {
    ScopeLimits::with_loosest(WritePolicy::Disabled)
}

/// The deployment memory policy: what any `MemoryPolicy` may at most allow, per scope.
///
/// YAML (every key optional; omitted scopes keep their defaults):
///
/// ```yaml
/// user:
///   loosestWritePolicy: approval_for_sensitive
///   allowedKinds: [semantic, episodic_reference]
///   maxResults: 50
///   retentionPolicies: [standard, short]
/// agent:
///   loosestWritePolicy: approval_for_sensitive   # enables shared learning
/// organization:
///   readable: false
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeploymentMemoryPolicy {
    #[serde(default = "default_user")]
    pub user: ScopeLimits,
    #[serde(default = "default_read_only")]
    pub agent: ScopeLimits,
    /// Organization memory is never agent-writable, whatever this says; only
    /// `readable`, `maxResults` and the retention ids of this entry matter.
    #[serde(default = "default_read_only")]
    pub organization: ScopeLimits,
}

impl Default for DeploymentMemoryPolicy {
    fn default() -> Self {
        DeploymentMemoryPolicy {
            user: default_user(),
            agent: default_read_only(),
            organization: default_read_only(),
        }
    }
}

#[derive(Debug, Error)]
pub enum DeploymentPolicyError {
    #[error("reading the deployment memory policy {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the deployment memory policy {path} is not valid YAML for this schema: {message}")]
    Parse { path: String, message: String },
    #[error("the deployment memory policy {path}: {message}")]
    Invalid { path: String, message: String },
}

impl DeploymentMemoryPolicy {
    /// Loads and checks a YAML file (see the type's documentation for the shape).
    pub fn from_yaml_file(path: &Path) -> Result<Self, DeploymentPolicyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| DeploymentPolicyError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_yaml_str(&text).map_err(|e| match e {
            DeploymentPolicyError::Parse { message, .. } => DeploymentPolicyError::Parse {
                path: shown,
                message,
            },
            DeploymentPolicyError::Invalid { message, .. } => DeploymentPolicyError::Invalid {
                path: shown,
                message,
            },
            other => other,
        })
    }

    /// Parses and checks YAML text. An empty document is the default policy.
    pub fn from_yaml_str(text: &str) -> Result<Self, DeploymentPolicyError> {
        let policy: DeploymentMemoryPolicy = if text.trim().is_empty() {
            DeploymentMemoryPolicy::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| DeploymentPolicyError::Parse {
                path: "<text>".into(),
                message: e.to_string(),
            })?
        };
        for (scope, limits) in [
            ("user", &policy.user),
            ("agent", &policy.agent),
            ("organization", &policy.organization),
        ] {
            if limits.max_results < 1 {
                return Err(DeploymentPolicyError::Invalid {
                    path: "<text>".into(),
                    message: format!("{scope}.maxResults must be at least 1"),
                });
            }
            if limits.retention_policies.is_empty() {
                return Err(DeploymentPolicyError::Invalid {
                    path: "<text>".into(),
                    message: format!("{scope}.retentionPolicies must name at least one id"),
                });
            }
        }
        Ok(policy)
    }

    pub fn scope(&self, scope: MemoryScope) -> &ScopeLimits {
        match scope {
            MemoryScope::User => &self.user,
            MemoryScope::Agent => &self.agent,
            MemoryScope::Organization => &self.organization,
        }
    }
}

/// Checks a memory policy against the deployment policy.
pub fn validate(spec: &MemoryPolicySpec, deployment: &DeploymentMemoryPolicy) -> Vec<Violation> {
    let mut violations = Vec::new();

    match (
        &spec.agent_selector.agent_ids,
        spec.agent_selector.all_agents,
    ) {
        (Some(ids), None) if !ids.is_empty() => {
            for (i, id) in ids.iter().enumerate() {
                if id.trim().is_empty() {
                    violations.push(Violation::invalid(
                        format!("spec.agentSelector.agentIds[{i}]"),
                        "an agent id cannot be empty",
                    ));
                }
            }
        }
        (None, Some(true)) => {}
        (Some(_), Some(_)) => violations.push(Violation::invalid(
            "spec.agentSelector",
            "set exactly one of agentIds or allAgents, not both",
        )),
        _ => violations.push(Violation::invalid(
            "spec.agentSelector",
            "selects no agent: list at least one id in agentIds, or set allAgents: true",
        )),
    }

    for (i, scope) in spec.read_scopes.iter().enumerate() {
        if !deployment.scope(*scope).readable {
            violations.push(Violation::forbidden(
                format!("spec.readScopes[{i}]"),
                format!(
                    "the deployment memory policy does not let agents read {} memory",
                    scope_name(*scope)
                ),
            ));
        }
    }

    if spec.write_scope == MemoryScope::Organization {
        violations.push(Violation::forbidden(
            "spec.writeScope",
            "organization memory is written only by applications and administrators and is never agent-configurable (data-model spec §1; memory scopes in spec 000); use user or agent",
        ));
        return violations;
    }

    let scope = scope_name(spec.write_scope);
    let limits = deployment.scope(spec.write_scope);
    if strictness(spec.write_policy) < strictness(limits.loosest_write_policy) {
        let hint = if spec.write_scope == MemoryScope::Agent
            && limits.loosest_write_policy == WritePolicy::Disabled
        {
            " (agent-shared writes need shared learning enabled in the deployment memory policy)"
        } else {
            ""
        };
        violations.push(Violation::forbidden(
            "spec.writePolicy",
            format!(
                "{} is looser than the deployment memory policy allows for write scope {scope}, which is at most {}{hint}; a memory policy may only be stricter (order: disabled, approval_for_sensitive, automatic_scoped)",
                write_policy_name(spec.write_policy),
                write_policy_name(limits.loosest_write_policy),
            ),
        ));
    }
    if spec.write_policy != WritePolicy::Disabled {
        for (i, kind) in spec.kinds.iter().enumerate() {
            if !limits.allowed_kinds.contains(kind) {
                let allowed: Vec<&str> =
                    limits.allowed_kinds.iter().map(|k| kind_name(*k)).collect();
                violations.push(Violation::forbidden(
                    format!("spec.kinds[{i}]"),
                    format!(
                        "{} memory may not be written to scope {scope} in this deployment (allowed: [{}])",
                        kind_name(*kind),
                        allowed.join(", ")
                    ),
                ));
            }
        }
    }
    if spec.max_results > limits.max_results {
        violations.push(Violation::forbidden(
            "spec.maxResults",
            format!(
                "{} exceeds the deployment cap of {} for scope {scope}",
                spec.max_results, limits.max_results
            ),
        ));
    }
    if !limits.retention_policies.contains(&spec.retention_policy) {
        violations.push(Violation::invalid(
            "spec.retentionPolicy",
            format!(
                "{:?} is not a retention policy of this deployment for scope {scope} (known: [{}]); retention policies are deployment-owned ids, never arbitrary TTLs",
                spec.retention_policy,
                limits.retention_policies.join(", ")
            ),
        ));
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> MemoryPolicySpec {
        let mut base = json!({"agentSelector": {"agentIds": ["agent-1"]}});
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(base).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fields(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn strictness_order() {
        assert!(strictness(WritePolicy::Disabled) > strictness(WritePolicy::ApprovalForSensitive));
        assert!(
            strictness(WritePolicy::ApprovalForSensitive)
                > strictness(WritePolicy::AutomaticScoped)
        );
    }

    #[test]
    fn defaults_pass_the_default_deployment_policy() {
        let d = DeploymentMemoryPolicy::default();
        assert!(validate(&spec(json!({})), &d).is_empty());
        assert!(validate(&spec(json!({"writePolicy": "automatic_scoped"})), &d).is_empty());
        assert!(
            validate(
                &spec(json!({"agentSelector": {"allAgents": true}, "readScopes": ["user", "agent", "organization"]})),
                &d
            )
            .is_empty()
        );
    }

    #[test]
    fn organization_writes_are_never_configurable() {
        let v = validate(
            &spec(json!({"writeScope": "organization", "writePolicy": "disabled"})),
            &DeploymentMemoryPolicy::default(),
        );
        assert_eq!(fields(&v), ["spec.writeScope"]);
        assert_eq!(v[0].kind.http_code(), 403);
        assert!(v[0].message.contains("never agent-configurable"));
        // Not even when the deployment file would allow it.
        let mut loose = DeploymentMemoryPolicy::default();
        loose.organization.loosest_write_policy = WritePolicy::AutomaticScoped;
        let v = validate(&spec(json!({"writeScope": "organization"})), &loose);
        assert_eq!(fields(&v), ["spec.writeScope"]);
    }

    #[test]
    fn agent_selector_must_select_someone() {
        let d = DeploymentMemoryPolicy::default();
        for selector in [
            json!({}),
            json!({"agentIds": []}),
            json!({"allAgents": false}),
            json!({"agentIds": ["a"], "allAgents": true}),
        ] {
            let v = validate(&spec(json!({ "agentSelector": selector })), &d);
            assert_eq!(fields(&v), ["spec.agentSelector"], "{selector}");
        }
        let v = validate(
            &spec(json!({"agentSelector": {"agentIds": ["a", " "]}})),
            &d,
        );
        assert_eq!(fields(&v), ["spec.agentSelector.agentIds[1]"]);
    }

    #[test]
    fn only_stricter_than_the_deployment_write_policy() {
        let mut d = DeploymentMemoryPolicy::default();
        d.user.loosest_write_policy = WritePolicy::ApprovalForSensitive;
        let v = validate(&spec(json!({"writePolicy": "automatic_scoped"})), &d);
        assert_eq!(fields(&v), ["spec.writePolicy"]);
        assert!(v[0].message.contains(
            "automatic_scoped is looser than the deployment memory policy allows for write scope user, which is at most approval_for_sensitive"
        ));
        for ok in ["approval_for_sensitive", "disabled"] {
            assert!(
                validate(&spec(json!({ "writePolicy": ok })), &d).is_empty(),
                "{ok}"
            );
        }
    }

    #[test]
    fn agent_shared_writes_need_shared_learning() {
        let d = DeploymentMemoryPolicy::default();
        let v = validate(
            &spec(json!({"writeScope": "agent", "writePolicy": "approval_for_sensitive"})),
            &d,
        );
        assert_eq!(fields(&v), ["spec.writePolicy"]);
        assert!(v[0].message.contains("shared learning"));
        assert!(
            validate(
                &spec(json!({"writeScope": "agent", "writePolicy": "disabled"})),
                &d
            )
            .is_empty()
        );
        let mut enabled = d.clone();
        enabled.agent.loosest_write_policy = WritePolicy::ApprovalForSensitive;
        assert!(
            validate(
                &spec(json!({"writeScope": "agent", "writePolicy": "approval_for_sensitive"})),
                &enabled
            )
            .is_empty()
        );
    }

    #[test]
    fn kinds_cap_retention_and_read_scopes() {
        let mut d = DeploymentMemoryPolicy::default();
        d.user.allowed_kinds = vec![MemoryKind::Semantic];
        d.user.max_results = 20;
        d.organization.readable = false;
        let v = validate(
            &spec(json!({
                "kinds": ["semantic", "procedural"],
                "maxResults": 50,
                "retentionPolicy": "forever",
                "readScopes": ["user", "organization"],
            })),
            &d,
        );
        assert_eq!(
            fields(&v),
            [
                "spec.readScopes[1]",
                "spec.kinds[1]",
                "spec.maxResults",
                "spec.retentionPolicy"
            ]
        );
        assert!(
            v[1].message
                .contains("procedural memory may not be written")
        );
        assert!(v[2].message.contains("50 exceeds the deployment cap of 20"));
        assert!(
            v[3].message
                .contains("\"forever\" is not a retention policy")
        );
        // Kinds do not matter when writes are disabled.
        assert!(
            validate(
                &spec(json!({"writePolicy": "disabled", "kinds": ["procedural"]})),
                &d
            )
            .is_empty()
        );
    }

    #[test]
    fn deployment_policy_yaml() {
        let d = DeploymentMemoryPolicy::from_yaml_str(
            "user:\n  loosestWritePolicy: approval_for_sensitive\n  maxResults: 50\n  retentionPolicies: [standard, short]\nagent:\n  loosestWritePolicy: approval_for_sensitive\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            d.user.loosest_write_policy,
            WritePolicy::ApprovalForSensitive
        );
        assert_eq!(d.user.max_results, 50);
        assert_eq!(d.user.allowed_kinds.len(), 3);
        assert_eq!(
            d.organization,
            DeploymentMemoryPolicy::default().organization
        );
        assert_eq!(
            DeploymentMemoryPolicy::from_yaml_str("").unwrap_or_else(|e| panic!("{e}")),
            DeploymentMemoryPolicy::default()
        );
        for bad in [
            "user:\n  loosestWritePolicy: whenever\n",
            "usr: {}\n",
            "user:\n  loosestWritePolicy: disabled\n  maxResults: 0\n",
            "user:\n  loosestWritePolicy: disabled\n  retentionPolicies: []\n",
        ] {
            assert!(DeploymentMemoryPolicy::from_yaml_str(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("memory.yaml");
        let missing = DeploymentMemoryPolicy::from_yaml_file(&path);
        assert!(matches!(missing, Err(DeploymentPolicyError::Read { .. })));
        std::fs::write(
            &path,
            "agent:\n  readable: false\n  loosestWritePolicy: disabled\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let loaded =
            DeploymentMemoryPolicy::from_yaml_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!loaded.agent.readable);
    }
}
