//! `HarnessBinding` rules.
//!
//! Spec (create and update):
//! - `spec.harness.options` holds nothing named or shaped like secrets, environment
//!   dictionaries, module paths, commands or code, and is at most 32 KiB ([`super::options`]);
//! - identity (`agentId`, `conversationId`, `subjectRef`) never changes; `harness.id` and
//!   `sandboxProfileRef` change only together with an epoch raise; the epoch only rises
//!   by one (DESIGN §3, clearing);
//! - the referenced `SandboxProfile` exists in the namespace, is enabled and allows the
//!   harness; the referenced `MemoryPolicy`, when set, exists and selects the agent.
//!
//! The reference checks run on create and when the fields they depend on change, never on
//! metadata-only updates: a binding whose profile was deleted must still let the operator
//! remove its finalizer.
//!
//! Status (the `status` subresource): only the operator identities may change
//! `status.lease`, the fencing token of DESIGN §3.

use super::{LookupError, ObjectLookup, Violation, options};
use crate::api::{
    HarnessBinding, HarnessBindingSpec, HarnessBindingStatus, MemoryPolicy, SandboxProfile,
};

/// Rules that need no other object: options, identity, epoch.
pub fn validate_spec(new: &HarnessBindingSpec, old: Option<&HarnessBindingSpec>) -> Vec<Violation> {
    let mut violations = Vec::new();

    let options_changed = old.is_none_or(|old| old.harness.options != new.harness.options);
    if options_changed && let Some(opts) = &new.harness.options {
        violations.extend(options::validate(opts));
    }

    if new.epoch < 0 {
        violations.push(Violation::invalid(
            "spec.epoch",
            format!("{} is negative; epochs start at 0", new.epoch),
        ));
    }

    let Some(old) = old else {
        return violations;
    };
    for (field, before, after, why) in [
        (
            "spec.agentId",
            &old.agent_id,
            &new.agent_id,
            "create a new HarnessBinding for another agent",
        ),
        (
            "spec.conversationId",
            &old.conversation_id,
            &new.conversation_id,
            "create a new HarnessBinding for another conversation",
        ),
        (
            "spec.subjectRef",
            &old.subject_ref,
            &new.subject_ref,
            "a binding never changes owner",
        ),
    ] {
        if before != after {
            violations.push(Violation::invalid(
                field,
                format!("is immutable (was {before:?}, now {after:?}): {why}"),
            ));
        }
    }

    if new.epoch != old.epoch && new.epoch != old.epoch + 1 {
        violations.push(Violation::invalid(
            "spec.epoch",
            format!(
                "may only stay {} or rise to {} (one conversation clear at a time), not {}",
                old.epoch,
                old.epoch + 1,
                new.epoch
            ),
        ));
    }
    if new.epoch == old.epoch {
        if new.harness.id != old.harness.id {
            violations.push(Violation::invalid(
                "spec.harness.id",
                format!(
                    "is immutable within an epoch (was {:?}, now {:?}): raise spec.epoch to {} in the same update to clear the conversation and change harness",
                    old.harness.id.as_str(),
                    new.harness.id.as_str(),
                    old.epoch + 1
                ),
            ));
        }
        if new.sandbox_profile_ref.name != old.sandbox_profile_ref.name {
            violations.push(Violation::invalid(
                "spec.sandboxProfileRef.name",
                format!(
                    "is immutable within an epoch (was {:?}, now {:?}): raise spec.epoch to {} in the same update to clear the conversation and change profile",
                    old.sandbox_profile_ref.name,
                    new.sandbox_profile_ref.name,
                    old.epoch + 1
                ),
            ));
        }
    }
    violations
}

/// Which referenced objects an admission request must read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReferenceChecks {
    pub profile: bool,
    pub memory_policy: bool,
}

/// On create: both. On update: the profile when the profile, the harness or the epoch
/// changes (a new lease will be claimed with it), the memory policy when its reference
/// changes. Nothing while the binding is being deleted.
pub fn reference_checks(
    new: &HarnessBindingSpec,
    old: Option<&HarnessBindingSpec>,
    deleting: bool,
) -> ReferenceChecks {
    if deleting {
        return ReferenceChecks {
            profile: false,
            memory_policy: false,
        };
    }
    match old {
        None => ReferenceChecks {
            profile: true,
            memory_policy: new.memory_policy_ref.is_some(),
        },
        Some(old) => ReferenceChecks {
            profile: old.sandbox_profile_ref != new.sandbox_profile_ref
                || old.harness.id != new.harness.id
                || old.epoch != new.epoch,
            memory_policy: new.memory_policy_ref.is_some()
                && old.memory_policy_ref != new.memory_policy_ref,
        },
    }
}

/// The referenced profile exists, is enabled and allows the harness.
pub fn check_profile(
    namespace: &str,
    spec: &HarnessBindingSpec,
    profile: Option<&SandboxProfile>,
) -> Vec<Violation> {
    let name = &spec.sandbox_profile_ref.name;
    let Some(profile) = profile else {
        return vec![Violation::invalid(
            "spec.sandboxProfileRef.name",
            format!(
                "SandboxProfile {name:?} does not exist in namespace {namespace:?}: create the profile first or fix the name"
            ),
        )];
    };
    let mut violations = Vec::new();
    if !profile.spec.enabled {
        violations.push(Violation::forbidden(
            "spec.sandboxProfileRef.name",
            format!(
                "SandboxProfile {name:?} is disabled (spec.enabled: false) and takes no new leases: enable it or choose another profile"
            ),
        ));
    }
    if !profile.spec.allowed_harness_ids.contains(&spec.harness.id) {
        let allowed: Vec<&str> = profile
            .spec
            .allowed_harness_ids
            .iter()
            .map(|h| h.as_str())
            .collect();
        violations.push(Violation::forbidden(
            "spec.harness.id",
            format!(
                "SandboxProfile {name:?} does not allow harness {:?} (allowed: [{}])",
                spec.harness.id.as_str(),
                allowed.join(", ")
            ),
        ));
    }
    violations
}

/// The referenced memory policy exists and governs the binding's agent.
pub fn check_memory_policy(
    namespace: &str,
    spec: &HarnessBindingSpec,
    policy: Option<&MemoryPolicy>,
) -> Vec<Violation> {
    let Some(reference) = &spec.memory_policy_ref else {
        return Vec::new();
    };
    let name = &reference.name;
    let Some(policy) = policy else {
        return vec![Violation::invalid(
            "spec.memoryPolicyRef.name",
            format!(
                "MemoryPolicy {name:?} does not exist in namespace {namespace:?}: create the policy first, fix the name, or remove memoryPolicyRef"
            ),
        )];
    };
    let selector = &policy.spec.agent_selector;
    let selects = selector.all_agents == Some(true)
        || selector
            .agent_ids
            .as_ref()
            .is_some_and(|ids| ids.contains(&spec.agent_id));
    if selects {
        Vec::new()
    } else {
        vec![Violation::invalid(
            "spec.memoryPolicyRef.name",
            format!(
                "MemoryPolicy {name:?} does not select agent {:?}: add the agent to its spec.agentSelector.agentIds or reference a policy that selects it",
                spec.agent_id
            ),
        )]
    }
}

/// Every spec rule, reading the referenced objects through `lookup` as needed.
pub async fn validate(
    lookup: &dyn ObjectLookup,
    namespace: &str,
    new: &HarnessBinding,
    old: Option<&HarnessBinding>,
) -> Result<Vec<Violation>, LookupError> {
    let old_spec = old.map(|o| &o.spec);
    let mut violations = validate_spec(&new.spec, old_spec);
    let deleting = new.metadata.deletion_timestamp.is_some();
    let checks = reference_checks(&new.spec, old_spec, deleting);
    if checks.profile {
        let profile = lookup
            .sandbox_profile(namespace, &new.spec.sandbox_profile_ref.name)
            .await?;
        violations.extend(check_profile(namespace, &new.spec, profile.as_ref()));
    }
    if checks.memory_policy
        && let Some(reference) = &new.spec.memory_policy_ref
    {
        let policy = lookup.memory_policy(namespace, &reference.name).await?;
        violations.extend(check_memory_policy(namespace, &new.spec, policy.as_ref()));
    }
    Ok(violations)
}

/// Status subresource updates: `status.lease` changes only when `username` is one of the
/// operator identities.
pub fn validate_status(
    new: Option<&HarnessBindingStatus>,
    old: Option<&HarnessBindingStatus>,
    username: &str,
    operator_identities: &[String],
) -> Vec<Violation> {
    let new_lease = new.and_then(|s| s.lease.as_ref());
    let old_lease = old.and_then(|s| s.lease.as_ref());
    if new_lease == old_lease || operator_identities.iter().any(|id| id == username) {
        return Vec::new();
    }
    let who = if operator_identities.is_empty() {
        "no identity is configured to".to_owned()
    } else {
        format!("only {} may", operator_identities.join(", "))
    };
    vec![Violation::forbidden(
        "status.lease",
        format!(
            "{who} change the sandbox lease, and {username:?} is not one of them: the lease generation is the fencing token every state write is checked against, so only the operator's binding controller moves it"
        ),
    )]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::api::{HarnessId, Lease};

    fn binding_spec() -> HarnessBindingSpec {
        serde_json::from_value(json!({
            "agentId": "agent-1",
            "conversationId": "conv-1",
            "subjectRef": format!("hmac-sha256:{}", "0".repeat(64)),
            "harness": {"id": "deepagents", "options": {"model_provider_mode": "configured"}},
            "sandboxProfileRef": {"name": "standard"},
            "memoryPolicyRef": {"name": "memory"},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn fields(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn a_good_binding_passes_create_and_update() {
        let spec = binding_spec();
        assert!(validate_spec(&spec, None).is_empty());
        assert!(validate_spec(&spec, Some(&spec)).is_empty());
    }

    #[test]
    fn options_are_scanned_on_create_and_when_changed() {
        let mut bad = binding_spec();
        bad.harness.options = serde_json::from_value(json!({"apiKey": "x"})).ok();
        let v = validate_spec(&bad, None);
        assert_eq!(fields(&v), ["spec.harness.options.apiKey"]);
        let v = validate_spec(&bad, Some(&binding_spec()));
        assert_eq!(fields(&v), ["spec.harness.options.apiKey"]);
        // Unchanged options admitted earlier do not block an unrelated update.
        assert!(validate_spec(&bad, Some(&bad)).is_empty());
    }

    #[test]
    fn identity_is_immutable() {
        let old = binding_spec();
        for (field, change) in [
            ("spec.agentId", json!({"agentId": "agent-2"})),
            ("spec.conversationId", json!({"conversationId": "conv-2"})),
            (
                "spec.subjectRef",
                json!({"subjectRef": format!("hmac-sha256:{}", "1".repeat(64))}),
            ),
        ] {
            let mut value = serde_json::to_value(&old).unwrap_or_else(|e| panic!("{e}"));
            if let (Some(v), Some(c)) = (value.as_object_mut(), change.as_object()) {
                v.extend(c.clone());
            }
            let new: HarnessBindingSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
            // Even together with an epoch raise.
            let mut raised = new.clone();
            raised.epoch = 1;
            for candidate in [new, raised] {
                let v = validate_spec(&candidate, Some(&old));
                assert_eq!(fields(&v), [field]);
                assert!(v[0].message.starts_with("is immutable"), "{}", v[0]);
            }
        }
    }

    #[test]
    fn epoch_only_rises_by_one() {
        let old = binding_spec();
        let mut new = old.clone();
        new.epoch = 1;
        assert!(validate_spec(&new, Some(&old)).is_empty());
        for bad in [2, -1] {
            new.epoch = bad;
            let v = validate_spec(&new, Some(&old));
            assert!(fields(&v).contains(&"spec.epoch"), "{bad}");
        }
        let mut lowered = old.clone();
        lowered.epoch = 3;
        let mut back = old.clone();
        back.epoch = 2;
        let v = validate_spec(&back, Some(&lowered));
        assert_eq!(fields(&v), ["spec.epoch"]);
        assert!(v[0].message.contains("may only stay 3 or rise to 4"));
    }

    #[test]
    fn harness_and_profile_change_only_with_a_new_epoch() {
        let old = binding_spec();
        let mut new = old.clone();
        new.harness.id = HarnessId::Strands;
        new.sandbox_profile_ref.name = "other".into();
        let v = validate_spec(&new, Some(&old));
        assert_eq!(
            fields(&v),
            ["spec.harness.id", "spec.sandboxProfileRef.name"]
        );
        assert!(v[0].message.contains("raise spec.epoch to 1"));
        new.epoch = 1;
        assert!(validate_spec(&new, Some(&old)).is_empty());
    }

    #[test]
    fn reference_checks_skip_metadata_only_updates_and_deletion() {
        let spec = binding_spec();
        assert_eq!(
            reference_checks(&spec, None, false),
            ReferenceChecks {
                profile: true,
                memory_policy: true
            }
        );
        assert_eq!(
            reference_checks(&spec, Some(&spec), false),
            ReferenceChecks {
                profile: false,
                memory_policy: false
            }
        );
        let mut cleared = spec.clone();
        cleared.epoch = 1;
        assert!(reference_checks(&cleared, Some(&spec), false).profile);
        assert!(!reference_checks(&cleared, Some(&spec), true).profile);
        let mut repointed = spec.clone();
        repointed.memory_policy_ref = Some(crate::api::binding::LocalObjectReference {
            name: "other".into(),
        });
        assert!(reference_checks(&repointed, Some(&spec), false).memory_policy);
    }

    fn profile(enabled: bool, harnesses: &[&str]) -> SandboxProfile {
        let mut spec = crate::webhook::profile::tests::profile_spec();
        spec.enabled = enabled;
        spec.allowed_harness_ids = harnesses
            .iter()
            .map(|h| serde_json::from_value(json!(h)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        SandboxProfile::new("standard", spec)
    }

    fn memory_policy(selector: serde_json::Value) -> MemoryPolicy {
        let spec = serde_json::from_value(json!({ "agentSelector": selector }))
            .unwrap_or_else(|e| panic!("{e}"));
        MemoryPolicy::new("memory", spec)
    }

    #[test]
    fn profile_must_exist_be_enabled_and_allow_the_harness() {
        let spec = binding_spec();
        assert!(check_profile("ns", &spec, Some(&profile(true, &["deepagents"]))).is_empty());

        let v = check_profile("ns", &spec, None);
        assert_eq!(fields(&v), ["spec.sandboxProfileRef.name"]);
        assert!(
            v[0].message
                .contains("SandboxProfile \"standard\" does not exist in namespace \"ns\"")
        );

        let v = check_profile("ns", &spec, Some(&profile(false, &["deepagents"])));
        assert_eq!(fields(&v), ["spec.sandboxProfileRef.name"]);
        assert!(v[0].message.contains("is disabled"));

        let v = check_profile("ns", &spec, Some(&profile(true, &["strands", "agentcore"])));
        assert_eq!(fields(&v), ["spec.harness.id"]);
        assert!(
            v[0].message
                .contains("does not allow harness \"deepagents\" (allowed: [strands, agentcore])")
        );
    }

    #[test]
    fn memory_policy_must_exist_and_select_the_agent() {
        let spec = binding_spec();
        for selector in [json!({"agentIds": ["agent-1"]}), json!({"allAgents": true})] {
            let p = memory_policy(selector);
            assert!(check_memory_policy("ns", &spec, Some(&p)).is_empty());
        }
        let v = check_memory_policy("ns", &spec, None);
        assert_eq!(fields(&v), ["spec.memoryPolicyRef.name"]);
        assert!(
            v[0].message
                .contains("MemoryPolicy \"memory\" does not exist")
        );
        let p = memory_policy(json!({"agentIds": ["someone-else"]}));
        let v = check_memory_policy("ns", &spec, Some(&p));
        assert!(v[0].message.contains("does not select agent \"agent-1\""));
        let mut without = spec.clone();
        without.memory_policy_ref = None;
        assert!(check_memory_policy("ns", &without, None).is_empty());
    }

    /// Fixture lookup: the unit tests' stand-in for the API server (the e2e test uses the
    /// real one).
    #[derive(Default)]
    struct Fixtures {
        profiles: HashMap<(String, String), SandboxProfile>,
        policies: HashMap<(String, String), MemoryPolicy>,
        fail: bool,
    }

    #[async_trait]
    impl ObjectLookup for Fixtures {
        async fn sandbox_profile(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<SandboxProfile>, LookupError> {
            if self.fail {
                return Err(LookupError {
                    kind: "SandboxProfile",
                    namespace: namespace.into(),
                    name: name.into(),
                    message: "connection refused".into(),
                });
            }
            Ok(self
                .profiles
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned())
        }

        async fn memory_policy(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<MemoryPolicy>, LookupError> {
            Ok(self
                .policies
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned())
        }
    }

    #[tokio::test]
    async fn validate_reads_references_in_the_binding_namespace() {
        let mut fixtures = Fixtures::default();
        fixtures.profiles.insert(
            ("team-a".into(), "standard".into()),
            profile(true, &["deepagents"]),
        );
        fixtures.policies.insert(
            ("team-a".into(), "memory".into()),
            memory_policy(json!({"allAgents": true})),
        );
        let binding = HarnessBinding::new("b", binding_spec());
        let ok = validate(&fixtures, "team-a", &binding, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ok.is_empty(), "{ok:?}");
        // The same names in another namespace do not count.
        let v = validate(&fixtures, "team-b", &binding, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            fields(&v),
            ["spec.sandboxProfileRef.name", "spec.memoryPolicyRef.name"]
        );
        // A metadata-only update of a binding whose profile is gone is admitted.
        let v = validate(&fixtures, "team-b", &binding, Some(&binding))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(v.is_empty());
        fixtures.fail = true;
        let err = validate(&fixtures, "team-a", &binding, None).await;
        assert!(err.is_err());
    }

    fn status_with_generation(generation: i64) -> HarnessBindingStatus {
        HarnessBindingStatus {
            lease: Some(Lease {
                generation,
                ..Lease::default()
            }),
            ..HarnessBindingStatus::default()
        }
    }

    #[test]
    fn only_the_operator_moves_the_lease() {
        let operator = "system:serviceaccount:harness-engine-system:harness-engine".to_owned();
        let ids = vec![operator.clone()];
        let old = status_with_generation(1);
        let new = status_with_generation(2);
        assert!(validate_status(Some(&new), Some(&old), &operator, &ids).is_empty());

        let v = validate_status(Some(&new), Some(&old), "alice", &ids);
        assert_eq!(fields(&v), ["status.lease"]);
        assert_eq!(v[0].kind.http_code(), 403);
        assert!(v[0].message.contains(&format!("only {operator} may")));
        assert!(v[0].message.contains("\"alice\" is not one of them"));
        // Setting a first lease or removing it is a change too.
        assert_eq!(validate_status(Some(&new), None, "alice", &ids).len(), 1);
        assert_eq!(
            validate_status(
                Some(&HarnessBindingStatus::default()),
                Some(&old),
                "alice",
                &ids
            )
            .len(),
            1
        );
        // Other status fields are not this rule's business.
        let mut conditions_only = old.clone();
        conditions_only.observed_generation = Some(7);
        assert!(validate_status(Some(&conditions_only), Some(&old), "alice", &ids).is_empty());
        // With no operator identity configured nobody may move it.
        let v = validate_status(Some(&new), Some(&old), &operator, &[]);
        assert!(v[0].message.contains("no identity is configured"));
    }
}
