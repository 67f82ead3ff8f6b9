//! `SandboxProfile` rules: the timeouts parse and fit inside the lease lifetime, the
//! warm pool lives in the profile's own namespace (a `SandboxClaim`'s `warmPoolRef` names
//! a pool in the claim's namespace, and a profile must not reach into another team's),
//! and every field Harness Engine does not apply yet is refused with a message that
//! says so, instead of being accepted and ignored (docs/crds.md lists which).

use std::time::Duration;

use super::Violation;
use crate::api::{SandboxProfileSpec, profile::WorkspaceMode};
use crate::domain::duration;

/// Checks a profile in `namespace`.
pub fn validate(namespace: &str, spec: &SandboxProfileSpec) -> Vec<Violation> {
    let mut violations = Vec::new();
    let t = &spec.timeouts;
    let mut timeout = |name: &str, text: &str| -> Option<Duration> {
        let field = format!("spec.timeouts.{name}");
        match duration::parse(text) {
            Ok(d) if d.is_zero() => {
                violations.push(Violation::invalid(
                    field,
                    format!("{text:?} must be longer than zero"),
                ));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                violations.push(Violation::invalid(field, e.to_string()));
                None
            }
        }
    };
    let claim = timeout("claimReadinessDeadline", &t.claim_readiness_deadline);
    let idle = timeout("idleTTL", &t.idle_ttl);
    let max = timeout("maxLifetime", &t.max_lifetime);

    if let Some(max) = max {
        let shown = duration::display(max);
        if let Some(idle) = idle
            && idle >= max
        {
            violations.push(Violation::invalid(
                "spec.timeouts.idleTTL",
                format!(
                    "{} must be shorter than spec.timeouts.maxLifetime ({shown}): a lease would reach its maximum lifetime before it could ever go idle",
                    duration::display(idle)
                ),
            ));
        }
        if let Some(claim) = claim
            && claim >= max
        {
            violations.push(Violation::invalid(
                "spec.timeouts.claimReadinessDeadline",
                format!(
                    "{} must be shorter than spec.timeouts.maxLifetime ({shown}): a claim may not take longer to become Ready than a lease may live",
                    duration::display(claim)
                ),
            ));
        }
    }

    if let Some(pool_namespace) = &spec.warm_pool_ref.namespace
        && pool_namespace != namespace
    {
        violations.push(Violation::forbidden(
            "spec.warmPoolRef.namespace",
            format!(
                "{pool_namespace:?} is not the profile's namespace {namespace:?}: a SandboxClaim draws only from a warm pool in its own namespace, and a profile may not use another namespace's pool; leave it empty or set it to {namespace:?}"
            ),
        ));
    }
    violations.extend(ledger_rules(spec));
    violations.extend(unsupported(spec));
    violations
}

/// `spec.ledger`: a per-turn limit above the per-run one could never be reached.
fn ledger_rules(spec: &SandboxProfileSpec) -> Vec<Violation> {
    let Some(budgets) = spec.ledger.as_ref().and_then(|l| l.budgets.as_ref()) else {
        return Vec::new();
    };
    let (Some(turn), Some(run)) = (&budgets.per_turn, &budgets.per_run) else {
        return Vec::new();
    };
    [
        ("steps", turn.steps, run.steps),
        ("tokens", turn.tokens, run.tokens),
        ("costUnits", turn.cost_units, run.cost_units),
        (
            "irreversibleEffects",
            turn.irreversible_effects,
            run.irreversible_effects,
        ),
    ]
    .into_iter()
    .filter_map(|(field, turn, run)| match (turn, run) {
        (Some(t), Some(r)) if t > r => Some(Violation::invalid(
            format!("spec.ledger.budgets.perTurn.{field}"),
            format!("{t} is above spec.ledger.budgets.perRun.{field} ({r}): a turn is part of a run, so the per-turn limit could never be reached"),
        )),
        _ => None,
    })
    .collect()
}

/// Fields the schema declares but Harness Engine does not apply yet: each is refused,
/// naming the field and why, so that no profile says more than it does.
fn unsupported(spec: &SandboxProfileSpec) -> Vec<Violation> {
    const TEMPLATE: &str = "worker resources come from the warm pool's SandboxTemplate, which a SandboxClaim cannot override; set them in the template";
    let mut set = Vec::new();
    if let Some(l) = &spec.limits {
        for (field, present) in [
            ("cpu", l.cpu.is_some()),
            ("memory", l.memory.is_some()),
            ("ephemeralStorage", l.ephemeral_storage.is_some()),
            ("pids", l.pids.is_some()),
        ] {
            if present {
                set.push((format!("spec.limits.{field}"), TEMPLATE));
            }
        }
        if l.max_concurrent_turns.is_some() {
            set.push((
                "spec.limits.maxConcurrentTurns".into(),
                "the data plane has no per-worker turn count to enforce it with; leave it unset",
            ));
        }
    }
    if spec.timeouts.turn_timeout.is_some() {
        set.push((
            "spec.timeouts.turnTimeout".into(),
            "the data plane does not end a turn; bound turns in the harness and leave it unset",
        ));
    }
    if spec.workspace.mode != WorkspaceMode::Ephemeral {
        set.push((
            "spec.workspace.mode".into(),
            "only `ephemeral` is supported; a persistent workspace needs a volume claim in the SandboxTemplate",
        ));
    }
    if spec.workspace.size_limit.is_some() {
        set.push(("spec.workspace.sizeLimit".into(), TEMPLATE));
    }
    set.into_iter()
        .map(|(field, why)| Violation::invalid(field, format!("is not supported yet: {why}")))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::profile::SandboxTimeouts;

    pub(crate) fn profile_spec() -> SandboxProfileSpec {
        serde_json::from_value(serde_json::json!({
            "warmPoolRef": {"name": "pool"},
            "allowedHarnessIds": ["deepagents"],
            "allowedWorkerImageDigests": [format!("sha256:{}", "a".repeat(64))],
            "adapterVersion": "1.0.0",
            "workerProtocolVersions": [1],
            "egressPolicyClass": "data-plane-only",
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn with_timeouts(claim: &str, idle: &str, max: &str) -> SandboxProfileSpec {
        let mut spec = profile_spec();
        spec.timeouts = SandboxTimeouts {
            claim_readiness_deadline: claim.into(),
            turn_timeout: None,
            idle_ttl: idle.into(),
            max_lifetime: max.into(),
        };
        spec
    }

    fn fields(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn defaults_and_sensible_timeouts_pass() {
        assert!(validate("team-a", &profile_spec()).is_empty());
        assert!(validate("team-a", &with_timeouts("90s", "1h30m", "12h")).is_empty());
    }

    #[test]
    fn unparsable_or_zero_timeouts_name_their_field() {
        let v = validate("ns", &with_timeouts("soon", "30m", "12h"));
        assert_eq!(fields(&v), ["spec.timeouts.claimReadinessDeadline"]);
        assert!(v[0].message.contains("\"soon\" is not a duration"));

        let v = validate("ns", &with_timeouts("2m", "0s", "12h"));
        assert_eq!(fields(&v), ["spec.timeouts.idleTTL"]);
        assert!(v[0].message.contains("longer than zero"));

        let v = validate("ns", &with_timeouts("2m", "30m", "1d"));
        assert_eq!(fields(&v), ["spec.timeouts.maxLifetime"]);
    }

    #[test]
    fn idle_ttl_must_be_shorter_than_max_lifetime() {
        for (idle, max) in [("2h", "1h"), ("1h", "1h"), ("90m", "1h30m")] {
            let v = validate("ns", &with_timeouts("1m", idle, max));
            assert_eq!(fields(&v), ["spec.timeouts.idleTTL"], "{idle} vs {max}");
            assert!(
                v[0].message
                    .contains("must be shorter than spec.timeouts.maxLifetime")
            );
        }
    }

    #[test]
    fn claim_deadline_must_be_shorter_than_max_lifetime() {
        let v = validate("ns", &with_timeouts("1h", "10m", "1h"));
        assert_eq!(fields(&v), ["spec.timeouts.claimReadinessDeadline"]);
        assert!(v[0].message.contains("(1h)"));
    }

    /// Every field Harness Engine does not apply is refused by name, as not supported yet.
    #[test]
    fn fields_not_applied_are_refused_as_not_supported_yet() {
        let cases: [(serde_json::Value, &str); 8] = [
            (
                serde_json::json!({"limits": {"cpu": "1"}}),
                "spec.limits.cpu",
            ),
            (
                serde_json::json!({"limits": {"memory": "1Gi"}}),
                "spec.limits.memory",
            ),
            (
                serde_json::json!({"limits": {"ephemeralStorage": "1Gi"}}),
                "spec.limits.ephemeralStorage",
            ),
            (
                serde_json::json!({"limits": {"pids": 100}}),
                "spec.limits.pids",
            ),
            (
                serde_json::json!({"limits": {"maxConcurrentTurns": 1}}),
                "spec.limits.maxConcurrentTurns",
            ),
            (
                serde_json::json!({"timeouts": {"turnTimeout": "15m"}}),
                "spec.timeouts.turnTimeout",
            ),
            (
                serde_json::json!({"workspace": {"mode": "persistentVolumeClaim"}}),
                "spec.workspace.mode",
            ),
            (
                serde_json::json!({"workspace": {"sizeLimit": "1Gi"}}),
                "spec.workspace.sizeLimit",
            ),
        ];
        for (patch, field) in cases {
            let mut value = serde_json::to_value(profile_spec()).unwrap_or_default();
            if let (Some(obj), Some(extra)) = (value.as_object_mut(), patch.as_object()) {
                for (k, v) in extra {
                    obj.insert(k.clone(), v.clone());
                }
            }
            let spec: SandboxProfileSpec =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("{field}: {e}"));
            let v = validate("ns", &spec);
            assert_eq!(fields(&v), [field], "{patch}");
            assert!(
                v[0].message.starts_with("is not supported yet: "),
                "{}",
                v[0]
            );
            assert_eq!(v[0].kind.http_code(), 422);
        }
    }

    /// The fields Harness Engine applies are accepted: maxActiveLeases (binding
    /// admission in the operator), runtimeClassName (template check), hibernation,
    /// workload and egress classes (claim labels).
    #[test]
    fn fields_that_are_applied_are_accepted() {
        let mut value = serde_json::to_value(profile_spec()).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("limits".into(), serde_json::json!({"maxActiveLeases": 3}));
            obj.insert("runtimeClassName".into(), "gvisor".into());
            obj.insert("hibernation".into(), "release".into());
            obj.insert("workloadClass".into(), "untrusted-code".into());
            obj.insert("workspace".into(), serde_json::json!({"mode": "ephemeral"}));
            obj.insert(
                "ledger".into(),
                serde_json::json!({
                    "budgets": {"perTurn": {"steps": 50, "irreversibleEffects": 1},
                                "perRun": {"steps": 500, "costUnits": 1000}},
                    "tools": [{"name": "issue_refund", "defence": "queryableByKey"},
                              {"name": "send_email", "defence": "none"}]
                }),
            );
        }
        let spec: SandboxProfileSpec =
            serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
        assert!(validate("ns", &spec).is_empty());
    }

    #[test]
    fn a_per_turn_budget_above_the_per_run_one_is_refused() {
        let mut value = serde_json::to_value(profile_spec()).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "ledger".into(),
                serde_json::json!({"budgets": {
                    "perTurn": {"steps": 50, "tokens": 9000},
                    "perRun": {"steps": 40, "tokens": 9000}}}),
            );
        }
        let spec: SandboxProfileSpec =
            serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
        let v = validate("ns", &spec);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "spec.ledger.budgets.perTurn.steps");
        assert!(
            v[0].message.contains("perRun.steps (40)"),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn warm_pool_must_be_in_the_profile_namespace() {
        let mut spec = profile_spec();
        spec.warm_pool_ref.namespace = Some("team-a".into());
        assert!(validate("team-a", &spec).is_empty());
        spec.warm_pool_ref.namespace = Some("team-b".into());
        let v = validate("team-a", &spec);
        assert_eq!(fields(&v), ["spec.warmPoolRef.namespace"]);
        assert_eq!(v[0].kind.http_code(), 403);
        assert!(
            v[0].message
                .contains("\"team-b\" is not the profile's namespace \"team-a\"")
        );
    }
}
