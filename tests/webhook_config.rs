//! `config/webhook/` agrees with the webhook's router: every path the configuration
//! calls is one the router serves, for the kinds and operations it validates, failing
//! closed, without side effects, over the Service the operator's webhook port sits behind.
//! No control plane needed.

use std::path::Path;

use harness_engine::webhook;
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Service,
};

fn read<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/webhook")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn configuration_matches_the_router_and_fails_closed() {
    let vwc: ValidatingWebhookConfiguration = read("validating-webhook-configuration.yaml");
    let annotations = vwc.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("cert-manager.io/inject-ca-from")
            .map(String::as_str),
        Some("harness-engine-system/harness-engine-webhook-cert")
    );
    let hooks = vwc.webhooks.unwrap_or_default();
    let mut seen = Vec::new();
    for hook in &hooks {
        assert_eq!(
            hook.failure_policy.as_deref(),
            Some("Fail"),
            "{}",
            hook.name
        );
        assert_eq!(hook.side_effects, "None", "{}", hook.name);
        assert_eq!(hook.admission_review_versions, ["v1"], "{}", hook.name);
        let service = hook
            .client_config
            .service
            .clone()
            .unwrap_or_else(|| panic!("{}: no service", hook.name));
        assert_eq!(service.name, "harness-engine-webhook");
        assert_eq!(service.namespace, "harness-engine-system");
        assert_eq!(service.port, Some(9443));
        let rules = hook.rules.clone().unwrap_or_default();
        assert_eq!(rules.len(), 1, "{}", hook.name);
        let rule = &rules[0];
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["harness-engine.dev".to_owned()][..])
        );
        let resource = rule.resources.clone().unwrap_or_default().join(",");
        let operations = rule.operations.clone().unwrap_or_default().join(",");
        seen.push((service.path.unwrap_or_default(), resource, operations));
    }
    seen.sort();
    let mut expected = vec![
        (
            webhook::PATH_HARNESS_BINDINGS.to_owned(),
            "harnessbindings".to_owned(),
            "CREATE,UPDATE".to_owned(),
        ),
        (
            webhook::PATH_HARNESS_BINDINGS_STATUS.to_owned(),
            "harnessbindings/status".to_owned(),
            "UPDATE".to_owned(),
        ),
        (
            webhook::PATH_MEMORY_POLICIES.to_owned(),
            "memorypolicies".to_owned(),
            "CREATE,UPDATE".to_owned(),
        ),
        (
            webhook::PATH_SANDBOX_PROFILES.to_owned(),
            "sandboxprofiles".to_owned(),
            "CREATE,UPDATE".to_owned(),
        ),
    ];
    expected.sort();
    assert_eq!(seen, expected);
}

#[test]
fn service_reaches_the_webhook_port() {
    let service: Service = read("service.yaml");
    assert_eq!(
        service.metadata.name.as_deref(),
        Some("harness-engine-webhook")
    );
    assert_eq!(
        service.metadata.namespace.as_deref(),
        Some("harness-engine-system")
    );
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, 9443);
}
