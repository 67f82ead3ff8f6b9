//! The Helm chart (charts/harness-engine), checked as a platform team would meet it:
//! `helm lint --strict` with the defaults and with every option on; `values.schema.json`
//! refusing what cannot work; the rendered manifests accepted by the real API server's
//! server-side dry run (tests/common's control plane, with our CRDs installed); and the
//! chart kept equal to the kustomize path in config/ (CRDs, RBAC, webhook registration)
//! so the two cannot drift. Helm is built from Go modules by e2e/scripts/build-tools.sh
//! (a no-op once cached; `make test` builds it before the tests run).

mod common;

use std::{path::PathBuf, process::Command, sync::OnceLock};

use std::time::Duration;

use axum::http::StatusCode;
use harness_engine::{
    operator::OperatorMetrics,
    server::{
        admin,
        error::{ErrorCode, ErrorMark},
    },
};
use serde_json::Value;

const CHART: &str = "charts/harness-engine";
/// Every option that renders more objects: monitoring, cert-manager, MongoDB, replicas.
const ALL_ON: &str = "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,\
metrics.dashboard.enabled=true,store.mongodb.uri=mongodb://mongo:27017/,replicaCount=2,\
service.mcpAllowedHosts={harness-engine.example.com}";

fn helm_bin() -> &'static PathBuf {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new(common::repo_path("e2e/scripts/build-tools.sh"))
            .output()
            .expect("e2e/scripts/build-tools.sh runs");
        assert!(
            out.status.success(),
            "building helm failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("helm")
    })
}

/// Runs helm with its own config/cache dirs; returns (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(helm_bin())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env_remove("KUBECONFIG")
        .args(args)
        .output()
        .expect("helm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "harness-engine",
        CHART,
        "--namespace",
        "harness-engine-system",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {extra:?} failed: {err}");
    serde_saphyr::from_multiple::<Value>(&out)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn read_yaml(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(common::repo_path(rel)).expect(rel);
    serde_saphyr::from_multiple::<Value>(&text).expect(rel)
}

#[test]
fn lint_is_clean_with_defaults_and_with_every_option() {
    for set in [
        None,
        Some(ALL_ON),
        Some("webhook.certificates.mode=certManager"),
        Some("webhook.certificates.mode=operator"),
    ] {
        let mut args = vec!["lint", "--strict", CHART];
        if let Some(s) = set {
            args.extend_from_slice(&["--set", s]);
        }
        let (ok, out, err) = helm(&args);
        assert!(ok, "helm lint {set:?}: {out}{err}");
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

/// `/mcp` answers the host names the values list (and any when the list is empty).
#[test]
fn mcp_allowed_hosts_reach_the_operator() {
    let (ok, out, err) = helm(&[
        "template",
        "x",
        CHART,
        "--set",
        "service.mcpAllowedHosts={he.example.com,he.internal}",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("- --mcp-allowed-host=he.example.com"), "{out}");
    assert!(out.contains("- --mcp-allowed-host=he.internal"), "{out}");
    let (ok, out, err) = helm(&["template", "x", CHART]);
    assert!(ok, "{err}");
    assert!(!out.contains("--mcp-allowed-host"), "none by default");
}

#[test]
fn schema_refuses_what_cannot_work() {
    // Two replicas on the embedded store would be two SQLite writers.
    let (ok, _, err) = helm(&["template", "x", CHART, "--set", "replicaCount=2"]);
    assert!(!ok, "two replicas without MongoDB must be refused");
    assert!(err.contains("/store/mongodb/uri"), "{err}");
    for bad in [
        "webhook.certificates.mode=selfsigned",
        "environment=Not_Valid",
        "image.pullPolicy=Sometimes",
        "identityKey.create=false",
        "unknownKey=1",
    ] {
        let (ok, _, err) = helm(&["template", "x", CHART, "--set", bad]);
        assert!(!ok, "{bad} must be refused");
        assert!(err.contains("schema"), "{bad}: {err}");
    }
}

#[test]
fn chart_and_config_cannot_drift() {
    // CRDs: the chart's crds/ is the generated crds/ (make crds writes both).
    for entry in std::fs::read_dir(common::repo_path("crds")).expect("crds/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let chart = common::repo_path(&format!("{CHART}/crds/{name}"));
        assert_eq!(
            std::fs::read_to_string(&path).expect("crd"),
            std::fs::read_to_string(&chart).unwrap_or_default(),
            "{CHART}/crds/{name} differs from crds/{name}: run `make crds`"
        );
    }
    let docs = render(&[]);
    // RBAC: the same rules, and nothing more, as config/rbac.
    let role = &read_yaml("config/rbac/role.yaml")[0];
    let chart_role = find(&docs, "ClusterRole", "harness-engine-operator");
    assert_eq!(
        chart_role["rules"], role["rules"],
        "ClusterRole rules differ from config/rbac/role.yaml"
    );
    let leader = &read_yaml("config/rbac/leader_election_role.yaml")[0];
    let chart_leader = find(&docs, "Role", "harness-engine-leader-election");
    assert_eq!(chart_leader["rules"], leader["rules"]);
    assert_eq!(
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .count(),
        2
    );
    // Webhook registration: same hooks, paths, rules, failure policy, side effects.
    let vwc = &read_yaml("config/webhook/validating-webhook-configuration.yaml")[0];
    let chart_vwc = find(
        &docs,
        "ValidatingWebhookConfiguration",
        "harness-engine-validating-webhook",
    );
    let strip = |hooks: &Value| -> Vec<Value> {
        hooks
            .as_array()
            .expect("webhooks")
            .iter()
            .map(|h| {
                let mut h = h.clone();
                h["clientConfig"]
                    .as_object_mut()
                    .expect("clientConfig")
                    .remove("caBundle");
                h
            })
            .collect()
    };
    assert_eq!(strip(&chart_vwc["webhooks"]), strip(&vwc["webhooks"]));
    // The chart's webhook CA is the one its configuration trusts.
    let secret = find(&docs, "Secret", "harness-engine-webhook-tls");
    for hook in chart_vwc["webhooks"].as_array().expect("webhooks") {
        assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    }
    // Services and the Deployment: same names, ports and operator arguments.
    let manager = read_yaml("config/manager/manager.yaml");
    let svc = find(&manager, "Service", "harness-engine");
    assert_eq!(
        find(&docs, "Service", "harness-engine")["spec"]["ports"][0]["port"],
        svc["spec"]["ports"][0]["port"]
    );
    let wsvc = &read_yaml("config/webhook/service.yaml")[0];
    assert_eq!(
        find(&docs, "Service", "harness-engine-webhook")["spec"]["ports"][0]["port"],
        wsvc["spec"]["ports"][0]["port"]
    );
    let args = |d: &Value| -> Vec<String> {
        d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg").to_owned())
            .collect()
    };
    let chart_args = args(find(&docs, "Deployment", "harness-engine"));
    for arg in args(find(&manager, "Deployment", "harness-engine")) {
        assert!(
            chart_args.contains(&arg),
            "config/manager passes {arg}, the chart does not: {chart_args:?}"
        );
    }
    let ctx = &find(&docs, "Deployment", "harness-engine")["spec"]["template"]["spec"]["containers"]
        [0]["securityContext"];
    assert_eq!(ctx["readOnlyRootFilesystem"], true);
    assert_eq!(ctx["allowPrivilegeEscalation"], false);
}

/// `webhook.certificates.mode=operator`: no certificate is generated at render time (the
/// same manifests every time, as GitOps wants); the operator gets the flags that make it
/// manage the certificates, a writable directory for its serving pair, and permission
/// for exactly its own Secret and webhook configuration.
#[test]
fn operator_managed_certificates_render_no_secret_and_only_their_own_permissions() {
    let set = ["--set", "webhook.certificates.mode=operator"];
    // Apart from the identity key (random on first install, then kept from the cluster).
    let stable = |docs: Vec<Value>| -> Vec<Value> {
        docs.into_iter()
            .filter(|d| d["metadata"]["name"] != "harness-engine-identity")
            .collect()
    };
    let docs = stable(render(&set));
    assert_eq!(stable(render(&set)), docs, "two renders differ");
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Secret" && d["type"] == "kubernetes.io/tls"),
        "the chart must not own the managed Secret"
    );
    let vwc = find(
        &docs,
        "ValidatingWebhookConfiguration",
        "harness-engine-validating-webhook",
    );
    let hooks = vwc["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 4);
    assert!(
        hooks
            .iter()
            .all(|h| h["clientConfig"]["caBundle"].is_null()),
        "the caBundle is the operator's to write: {vwc:#}"
    );
    assert!(vwc["metadata"]["annotations"].is_null(), "{vwc:#}");
    let deployment = find(&docs, "Deployment", "harness-engine");
    let pod = &deployment["spec"]["template"]["spec"];
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--webhook-certs-secret=harness-engine-webhook-managed",
        "--webhook-configuration=harness-engine-validating-webhook",
        "--webhook-cert-hosts=harness-engine-webhook.harness-engine-system.svc,\
harness-engine-webhook.harness-engine-system.svc.cluster.local",
        "--webhook-cert-lifetime-seconds=7776000",
        "--webhook-ca-lifetime-seconds=315360000",
        "--webhook-cert-dir=/etc/harness-engine/webhook-tls",
    ] {
        assert!(args.contains(&want), "{want} missing from {args:#?}");
    }
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "webhook-tls")
        .expect("webhook-tls volume");
    assert!(
        volume["secret"].is_null() && volume["emptyDir"].is_object(),
        "{volume}"
    );
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == "webhook-tls")
        .expect("webhook-tls mount");
    assert_eq!(mount["readOnly"], false, "{mount}");
    let role = find(&docs, "Role", "harness-engine-webhook-certificates");
    assert_eq!(
        role["rules"][1]["resourceNames"],
        serde_json::json!(["harness-engine-webhook-managed"])
    );
    assert_eq!(role["rules"][0]["verbs"], serde_json::json!(["create"]));
    let cluster_role = find(&docs, "ClusterRole", "harness-engine-webhook-ca-bundle");
    assert_eq!(
        cluster_role["rules"][0]["resourceNames"],
        serde_json::json!(["harness-engine-validating-webhook"])
    );
    assert_eq!(
        cluster_role["rules"][0]["verbs"],
        serde_json::json!(["get", "patch"])
    );
    // The default mode grants none of it.
    let defaults = render(&[]);
    assert!(
        !defaults
            .iter()
            .any(|d| d["metadata"]["name"] == "harness-engine-webhook-certificates")
    );
}

#[test]
fn alerts_and_dashboard_use_series_the_operator_exports() {
    // A labelled family renders only once it has a child: record one of each.
    let operator = OperatorMetrics::default();
    let metrics = admin::Metrics::with_extra(|r| operator.register(r));
    let ok: Result<(), harness_engine::operator::Error> = Ok(());
    operator.observe_reconcile("HarnessBinding", &ok, Duration::from_millis(1));
    operator.waited("claim_ready");
    metrics.observe_request(
        "/v1/bindings/{binding_id}/state/commit".into(),
        "POST".into(),
        StatusCode::CONFLICT,
        Duration::from_millis(1),
        Some(ErrorMark {
            code: ErrorCode::RunUncertain,
            from_store: true,
        }),
    );
    harness_engine::telemetry::stats().dropped("queue_full");
    let text = metrics.render();
    let mut exported = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let mut parts = line.split_whitespace();
        let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        match kind {
            "counter" => exported.push(format!("{name}_total")),
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    exported.push(format!("{name}{s}"));
                }
            }
            _ => exported.push(name.to_owned()),
        }
    }
    let docs = render(&["--set", ALL_ON]);
    let rule = find(&docs, "PrometheusRule", "harness-engine");
    let dashboard = find(&docs, "ConfigMap", "harness-engine-dashboard");
    let mut exprs: Vec<String> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["expr"].as_str().expect("expr").to_owned())
        .collect();
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["alert"].as_str().expect("alert"))
        .collect();
    for want in [
        "UnknownOutcomesWaiting",
        "UncertainHeads",
        "ReplacementLoop",
        "WebhookErrors",
        "TelemetryExportDrops",
    ] {
        assert!(
            alerts.iter().any(|a| a.ends_with(want)),
            "no {want} alert in {alerts:?}"
        );
    }
    let board: Value = serde_json::from_str(
        dashboard["data"]["harness-engine.json"]
            .as_str()
            .expect("json"),
    )
    .expect("dashboard JSON");
    for panel in board["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    let mut checked = 0;
    for expr in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("harness_engine_") {
                assert!(
                    exported.iter().any(|e| e == word),
                    "{word} (in `{expr}`) is not exported; exported: {exported:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "only {checked} series checked");
}

/// The rendered chart is what the API server accepts: every object goes through a
/// server-side dry run (admission, schema, defaulting) against the local control plane.
/// The kinds of cert-manager and the Prometheus Operator are not installed there, so
/// those documents are left out of the dry run (their shape is checked above).
#[test]
fn rendered_chart_passes_server_side_dry_run() {
    let ns = format!("chart-dry-run-{}", std::process::id());
    let (ok, _, err) = common::kubectl(&["create", "namespace", &ns]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&[
        "apply",
        "--server-side",
        "-f",
        common::repo_path(&format!("{CHART}/crds"))
            .to_str()
            .expect("path"),
    ]);
    assert!(ok, "installing the chart's CRDs: {err}");
    let (ok, _, err) = common::kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        common::repo_path(&format!("{CHART}/crds"))
            .to_str()
            .expect("path"),
    ]);
    assert!(ok, "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    for (label, set) in [
        ("defaults", None),
        ("all-on", Some(ALL_ON)),
        (
            "operator-certificates",
            Some("webhook.certificates.mode=operator"),
        ),
    ] {
        let mut args = vec![
            "template",
            "harness-engine",
            CHART,
            "--namespace",
            ns.as_str(),
        ];
        if let Some(s) = set {
            args.extend_from_slice(&["--set", s]);
        }
        let (ok, out, err) = helm(&args);
        assert!(ok, "{err}");
        let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&out)
            .expect("parses")
            .into_iter()
            .filter(|d| !d.is_null())
            .filter(|d| {
                let api = d["apiVersion"].as_str().unwrap_or("");
                !api.starts_with("monitoring.coreos.com/") && !api.starts_with("cert-manager.io/")
            })
            .collect();
        assert!(docs.len() >= 12, "{label}: only {} objects", docs.len());
        let file = dir.path().join(format!("{label}.json"));
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
        std::fs::write(&file, serde_json::to_vec(&list).expect("json")).expect("write");
        let (ok, out, err) = common::kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            &ns,
            "-f",
            file.to_str().expect("path"),
        ]);
        assert!(
            ok,
            "{label}: the API server refused the rendered chart: {err}\n{out}"
        );
        assert!(
            out.contains("deployment.apps/harness-engine") && out.contains("(server dry run)"),
            "{out}"
        );
    }
    common::kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}
