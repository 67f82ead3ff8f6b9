//! `SandboxProfile` rules: the timeouts parse and fit inside the lease lifetime, and the
//! warm pool lives in the profile's own namespace (a `SandboxClaim`'s `warmPoolRef` names
//! a pool in the claim's namespace, and a profile must not reach into another team's).

use std::time::Duration;

use super::Violation;
use crate::api::SandboxProfileSpec;
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
    let turn = timeout("turnTimeout", &t.turn_timeout);
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
        if let Some(turn) = turn
            && turn > max
        {
            violations.push(Violation::invalid(
                "spec.timeouts.turnTimeout",
                format!(
                    "{} must not exceed spec.timeouts.maxLifetime ({shown}): no turn can outlive the lease it runs in",
                    duration::display(turn)
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
    violations
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

    fn with_timeouts(claim: &str, turn: &str, idle: &str, max: &str) -> SandboxProfileSpec {
        let mut spec = profile_spec();
        spec.timeouts = SandboxTimeouts {
            claim_readiness_deadline: claim.into(),
            turn_timeout: turn.into(),
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
        assert!(validate("team-a", &with_timeouts("90s", "15m", "1h30m", "12h")).is_empty());
        // A turn may take the whole lifetime, no more.
        assert!(validate("team-a", &with_timeouts("1m", "2h", "30m", "2h")).is_empty());
    }

    #[test]
    fn unparsable_or_zero_timeouts_name_their_field() {
        let v = validate("ns", &with_timeouts("soon", "15m", "30m", "12h"));
        assert_eq!(fields(&v), ["spec.timeouts.claimReadinessDeadline"]);
        assert!(v[0].message.contains("\"soon\" is not a duration"));

        let v = validate("ns", &with_timeouts("2m", "0s", "30m", "12h"));
        assert_eq!(fields(&v), ["spec.timeouts.turnTimeout"]);
        assert!(v[0].message.contains("longer than zero"));

        let v = validate("ns", &with_timeouts("2m", "15m", "30m", "1d"));
        assert_eq!(fields(&v), ["spec.timeouts.maxLifetime"]);
    }

    #[test]
    fn idle_ttl_must_be_shorter_than_max_lifetime() {
        for (idle, max) in [("2h", "1h"), ("1h", "1h"), ("90m", "1h30m")] {
            let v = validate("ns", &with_timeouts("1m", "1m", idle, max));
            assert_eq!(fields(&v), ["spec.timeouts.idleTTL"], "{idle} vs {max}");
            assert!(
                v[0].message
                    .contains("must be shorter than spec.timeouts.maxLifetime")
            );
        }
    }

    #[test]
    fn claim_deadline_must_be_shorter_than_max_lifetime() {
        let v = validate("ns", &with_timeouts("1h", "1m", "10m", "1h"));
        assert_eq!(fields(&v), ["spec.timeouts.claimReadinessDeadline"]);
        assert!(v[0].message.contains("(1h)"));
    }

    #[test]
    fn turn_timeout_must_fit_the_lifetime() {
        let v = validate("ns", &with_timeouts("1m", "3h", "10m", "2h"));
        assert_eq!(fields(&v), ["spec.timeouts.turnTimeout"]);
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
