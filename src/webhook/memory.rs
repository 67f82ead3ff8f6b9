//! `MemoryPolicy` rules: organization memory is never agent-writable, the agent selector
//! selects someone, and a policy may only be stricter than the deployment's memory
//! configuration (`spec/001_78d7ff78f70a2a2a.txt` §1, "Optional portable long-term memory
//! policy"; `spec/000_fa938a4e6ac75730.txt`, "Memory scopes").
//!
//! The deployment's side is [`DeploymentMemoryConfig`], the one type the data plane's
//! write pipeline reads too (`--memory-config`, the chart's `memory.config`): the
//! loosest write policy, whether shared learning (agent-scope writes) and `merge`
//! consolidation are allowed, the kinds agents may write, the `maxResults` cap, the
//! retention policy ids, and the organization (without one there is no organization
//! scope to read).

use super::Violation;
use crate::{
    api::{
        MemoryPolicySpec,
        memory_policy::{Consolidation, MemoryKind, MemoryScope, WritePolicy},
    },
    domain::memory::policy::DeploymentMemoryConfig,
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

/// Checks a memory policy against the deployment's memory configuration.
pub fn validate(spec: &MemoryPolicySpec, deployment: &DeploymentMemoryConfig) -> Vec<Violation> {
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
        if *scope == MemoryScope::Organization && deployment.organization.is_none() {
            violations.push(Violation::forbidden(
                format!("spec.readScopes[{i}]"),
                "this deployment has no organization scope (set organization in the deployment memory configuration)",
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
    let writes = spec.write_policy != WritePolicy::Disabled;
    if strictness(spec.write_policy) < strictness(deployment.max_write_policy) {
        violations.push(Violation::forbidden(
            "spec.writePolicy",
            format!(
                "{} is looser than the deployment memory configuration allows, which is at most {}; a memory policy may only be stricter (order: disabled, approval_for_sensitive, automatic_scoped)",
                write_policy_name(spec.write_policy),
                write_policy_name(deployment.max_write_policy),
            ),
        ));
    }
    if writes && spec.write_scope == MemoryScope::Agent && !deployment.allow_shared_learning {
        violations.push(Violation::forbidden(
            "spec.writeScope",
            "agent-shared writes need shared learning enabled in the deployment memory configuration (allowSharedLearning: true); use user, or writePolicy disabled",
        ));
    }
    if writes && let Some(allowed) = &deployment.allowed_kinds {
        for (i, kind) in spec.kinds.iter().enumerate() {
            if !allowed.contains(kind) {
                let names: Vec<&str> = allowed.iter().map(|k| kind_name(*k)).collect();
                violations.push(Violation::forbidden(
                    format!("spec.kinds[{i}]"),
                    format!(
                        "{} memory may not be written to scope {scope} in this deployment (allowed: [{}])",
                        kind_name(*kind),
                        names.join(", ")
                    ),
                ));
            }
        }
    }
    if i64::from(spec.max_results) > i64::from(deployment.max_results) {
        violations.push(Violation::forbidden(
            "spec.maxResults",
            format!(
                "{} exceeds the deployment cap of {}",
                spec.max_results, deployment.max_results
            ),
        ));
    }
    if deployment.retention(&spec.retention_policy).is_none() {
        let known: Vec<&str> = deployment.retention.iter().map(|r| r.id.as_str()).collect();
        violations.push(Violation::invalid(
            "spec.retentionPolicy",
            format!(
                "{:?} is not a retention policy of this deployment (known: [{}]); retention policies are deployment-owned ids, never arbitrary TTLs",
                spec.retention_policy,
                known.join(", ")
            ),
        ));
    }
    if spec.consolidation == Consolidation::Merge && !deployment.allow_consolidation {
        violations.push(Violation::forbidden(
            "spec.consolidation",
            "merge consolidation is turned off in this deployment (allowConsolidation: false)",
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

    fn deployment(yaml: &str) -> DeploymentMemoryConfig {
        DeploymentMemoryConfig::from_yaml_str(yaml).unwrap_or_else(|e| panic!("{e}"))
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
    fn defaults_pass_the_default_deployment_configuration() {
        let d = DeploymentMemoryConfig::default();
        assert!(validate(&spec(json!({})), &d).is_empty());
        assert!(validate(&spec(json!({"writePolicy": "automatic_scoped"})), &d).is_empty());
        assert!(
            validate(
                &spec(
                    json!({"agentSelector": {"allAgents": true}, "readScopes": ["user", "agent"]})
                ),
                &d
            )
            .is_empty()
        );
    }

    #[test]
    fn organization_writes_are_never_configurable_and_reads_need_an_organization() {
        let v = validate(
            &spec(json!({"writeScope": "organization", "writePolicy": "disabled"})),
            &DeploymentMemoryConfig::default(),
        );
        assert_eq!(fields(&v), ["spec.writeScope"]);
        assert_eq!(v[0].kind.http_code(), 403);
        assert!(v[0].message.contains("never agent-configurable"));
        let reads = spec(json!({"readScopes": ["user", "organization"]}));
        let v = validate(&reads, &DeploymentMemoryConfig::default());
        assert_eq!(fields(&v), ["spec.readScopes[1]"]);
        assert!(v[0].message.contains("no organization scope"));
        assert!(validate(&reads, &deployment("organization: acme\n")).is_empty());
    }

    #[test]
    fn agent_selector_must_select_someone() {
        let d = DeploymentMemoryConfig::default();
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
        let d = deployment("maxWritePolicy: approval_for_sensitive\n");
        let v = validate(&spec(json!({"writePolicy": "automatic_scoped"})), &d);
        assert_eq!(fields(&v), ["spec.writePolicy"]);
        assert!(v[0].message.contains(
            "automatic_scoped is looser than the deployment memory configuration allows, which is at most approval_for_sensitive"
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
        let d = DeploymentMemoryConfig::default();
        assert!(!d.allow_shared_learning, "shared learning is opt-in");
        let v = validate(
            &spec(
                json!({"writeScope": "agent", "writePolicy": "approval_for_sensitive", "readScopes": ["agent"]}),
            ),
            &d,
        );
        assert_eq!(fields(&v), ["spec.writeScope"]);
        assert!(v[0].message.contains("shared learning"));
        assert!(
            validate(
                &spec(json!({"writeScope": "agent", "writePolicy": "disabled"})),
                &d
            )
            .is_empty()
        );
        let enabled = deployment("allowSharedLearning: true\n");
        assert!(
            validate(
                &spec(json!({"writeScope": "agent", "writePolicy": "approval_for_sensitive", "readScopes": ["agent"]})),
                &enabled
            )
            .is_empty()
        );
    }

    #[test]
    fn kinds_cap_retention_and_consolidation() {
        let d = deployment(
            "allowedKinds: [semantic]\nmaxResults: 20\nallowConsolidation: false\nretention: [{id: standard, maxAgeSeconds: 60}]\n",
        );
        let v = validate(
            &spec(json!({
                "kinds": ["semantic", "procedural"],
                "maxResults": 50,
                "retentionPolicy": "forever",
                "consolidation": "merge",
            })),
            &d,
        );
        assert_eq!(
            fields(&v),
            [
                "spec.kinds[1]",
                "spec.maxResults",
                "spec.retentionPolicy",
                "spec.consolidation"
            ]
        );
        assert!(
            v[0].message
                .contains("procedural memory may not be written")
        );
        assert!(v[1].message.contains("50 exceeds the deployment cap of 20"));
        assert!(v[2].message.contains(
            "\"forever\" is not a retention policy of this deployment (known: [standard])"
        ));
        // Kinds do not matter when writes are disabled.
        assert!(
            validate(
                &spec(json!({"writePolicy": "disabled", "kinds": ["procedural"]})),
                &d
            )
            .is_empty()
        );
    }
}
