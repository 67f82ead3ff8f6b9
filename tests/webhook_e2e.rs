//! The admission webhook against the real API server of the local control plane
//! (`e2e/scripts/with-control-plane.sh cargo test --test webhook_e2e`).
//!
//! The webhook runs in this process over real TLS (a self-signed CA) on a free loopback
//! port; a ValidatingWebhookConfiguration, unique to the test and limited to the test's
//! namespace, points the API server at it. Every rule is shown refusing its bad case
//! through the API server (the kube client and `kubectl apply`) with its message, and a
//! good object of each kind is admitted. Rules that the CRDs' CEL validation already
//! enforces are refused by the API server before any webhook is called, so for those the
//! test checks the API server's refusal and also posts the AdmissionReview straight to
//! the webhook over TLS to check the webhook's own message. Finally the certificate
//! files are rotated under the running webhook and the API server keeps getting answers.

mod common;

use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use base64::Engine;
use harness_engine::{
    api::{HarnessBinding, MemoryPolicy, SandboxProfile},
    webhook::{self, KubeLookup, Webhook, WebhookConfig, certs, tls::ReloadingAcceptor},
};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn subject_ref() -> String {
    format!("hmac-sha256:{}", "ab".repeat(32))
}

fn profile(name: &str, spec_patch: Value) -> SandboxProfile {
    let mut spec = json!({
        "warmPoolRef": {"name": "pool"},
        "allowedHarnessIds": ["deepagents"],
        "allowedWorkerImageDigests": [DIGEST],
        "adapterVersion": "1.0.0",
        "workerProtocolVersions": [1],
        "egressPolicyClass": "data-plane-only",
    });
    merge(&mut spec, spec_patch);
    from_json(
        json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "SandboxProfile",
        "metadata": {"name": name}, "spec": spec}),
    )
}

fn memory_policy(name: &str, spec_patch: Value) -> MemoryPolicy {
    let mut spec = json!({"agentSelector": {"agentIds": ["agent-1"]}});
    merge(&mut spec, spec_patch);
    from_json(
        json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "MemoryPolicy",
        "metadata": {"name": name}, "spec": spec}),
    )
}

fn binding_value(name: &str, spec_patch: Value) -> Value {
    let mut spec = json!({
        "agentId": "agent-1",
        "conversationId": format!("conv-{name}"),
        "subjectRef": subject_ref(),
        "harness": {"id": "deepagents", "options": {"model_provider_mode": "configured", "max_tokens": 4096}},
        "sandboxProfileRef": {"name": "standard"},
        "memoryPolicyRef": {"name": "memory"},
    });
    merge(&mut spec, spec_patch);
    json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
        "metadata": {"name": name}, "spec": spec})
}

fn binding(name: &str, spec_patch: Value) -> HarnessBinding {
    from_json(binding_value(name, spec_patch))
}

/// JSON merge patch semantics, enough for fixtures: objects merge, `null` removes.
fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

/// A refusal's HTTP code and message, or a panic naming what was wrongly admitted.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> (u16, String) {
    match result {
        Ok(v) => panic!("{what} was admitted: {v:?}"),
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        Err(e) => panic!("{what}: unexpected error {e}"),
    }
}

/// Asserts that the webhook refused with `code` and a message containing every `parts`.
fn assert_webhook_refusal<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    what: &str,
    code: u16,
    parts: &[&str],
) {
    let (got, message) = refused(result, what);
    assert!(
        message.contains("denied the request"),
        "{what}: not refused by the webhook: {message}"
    );
    assert_eq!(got, code, "{what}: {message}");
    for part in parts {
        assert!(message.contains(part), "{what}: {message:?} lacks {part:?}");
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

fn webhook_configuration(
    name: &str,
    namespace: &str,
    port: u16,
    ca_pem: &str,
) -> ValidatingWebhookConfiguration {
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let hook = |hook_name: &str, path: &str, resource: &str, operations: Value| {
        json!({
            "name": hook_name,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle},
            "rules": [{"apiGroups": ["harness-engine.dev"], "apiVersions": ["v1alpha1"],
                "operations": operations, "resources": [resource], "scope": "Namespaced"}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        })
    };
    from_json(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            hook("harnessbindings.harness-engine.dev", webhook::PATH_HARNESS_BINDINGS, "harnessbindings", json!(["CREATE", "UPDATE"])),
            hook("harnessbindings-status.harness-engine.dev", webhook::PATH_HARNESS_BINDINGS_STATUS, "harnessbindings/status", json!(["UPDATE"])),
            hook("sandboxprofiles.harness-engine.dev", webhook::PATH_SANDBOX_PROFILES, "sandboxprofiles", json!(["CREATE", "UPDATE"])),
            hook("memorypolicies.harness-engine.dev", webhook::PATH_MEMORY_POLICIES, "memorypolicies", json!(["CREATE", "UPDATE"])),
        ],
    }))
}

/// Posts an AdmissionReview straight to the webhook over TLS, trusting only `ca_file`.
async fn post_review(
    addr: SocketAddr,
    ca_file: &Path,
    path: &str,
    request: Value,
) -> io::Result<Value> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(io::Error::other)? {
        roots
            .add(cert.map_err(io::Error::other)?)
            .map_err(io::Error::other)?;
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").map_err(io::Error::other)?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request,
    }))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(&body).await?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (_, json_body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no HTTP body in {text:?}")))?;
    serde_json::from_str(json_body).map_err(io::Error::other)
}

fn admission_request(
    kind: &str,
    namespace: &str,
    operation: &str,
    object: Value,
    old: Value,
) -> Value {
    json!({
        "uid": "e2e-direct",
        "kind": {"group": "harness-engine.dev", "version": "v1alpha1", "kind": kind},
        "resource": {"group": "harness-engine.dev", "version": "v1alpha1", "resource": "x"},
        "name": object["metadata"]["name"],
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "e2e"},
        "object": object,
        "oldObject": old,
    })
}

/// The direct answer must refuse with `parts` in the message.
fn assert_direct_refusal(reply: &Value, what: &str, code: u64, parts: &[&str]) {
    let response = &reply["response"];
    assert_eq!(response["uid"], "e2e-direct", "{what}: {reply}");
    assert_eq!(response["allowed"], false, "{what}: {reply}");
    assert_eq!(response["status"]["code"], code, "{what}: {reply}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    for part in parts {
        assert!(message.contains(part), "{what}: {message:?} lacks {part:?}");
    }
}

/// A client that acts as `user` (the admin kubeconfig may impersonate anyone).
async fn client_as(user: &str) -> Client {
    let cp = common::control_plane();
    let kubeconfig = Kubeconfig::read_from(&cp.kubeconfig).unwrap_or_else(|e| panic!("{e}"));
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).unwrap_or_else(|e| panic!("{e}"))
}

struct Running {
    addr: SocketAddr,
    acceptor: Arc<ReloadingAcceptor>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

async fn start_webhook(client: &Client, cert_dir: &Path, operator: &str) -> Running {
    // The deployment memory configuration, as `--memory-config` or the chart's
    // `memory.config` gives it (no organization: that scope cannot be read).
    let memory = harness_engine::domain::memory::policy::SharedMemoryPolicies::default();
    memory.set_deployment(
        harness_engine::domain::memory::policy::DeploymentMemoryConfig::from_yaml_str(
            "maxWritePolicy: approval_for_sensitive\nmaxResults: 50\nallowedKinds: [semantic, episodic_reference]\n",
        )
        .unwrap_or_else(|e| panic!("{e}")),
    );
    let config = WebhookConfig {
        operator_identities: vec![operator.to_owned()],
        memory,
    };
    let hook = Arc::new(Webhook::new(
        config,
        Arc::new(KubeLookup::new(client.clone())),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let acceptor = Arc::new(
        ReloadingAcceptor::new(cert_dir.join("tls.crt"), cert_dir.join("tls.key"))
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(webhook::tls::serve_with(
        listener,
        acceptor.clone(),
        webhook::router(hook),
        async {
            let _ = stopped.await;
        },
    ));
    Running {
        addr,
        acceptor,
        stop: Some(stop),
        task: Some(task),
    }
}

fn kubectl_apply(namespace: &str, dir: &Path, file: &str, object: &Value) -> (bool, String) {
    let path: PathBuf = dir.join(file);
    std::fs::write(&path, serde_json::to_vec_pretty(object).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let shown = path.display().to_string();
    let (ok, out, err) = common::kubectl(&["apply", "-n", namespace, "-f", &shown]);
    (ok, format!("{out}{err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_refuses_its_bad_case_through_the_api_server() {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "webhook").await;
    let namespace = ns.name.clone();
    let operator = format!("system:serviceaccount:{namespace}:harness-engine");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cert_dir = dir.path().join("certs");
    let hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let first = certs::self_signed(&cert_dir, &hosts).unwrap_or_else(|e| panic!("{e}"));
    let first_ca = dir.path().join("first-ca.crt");
    std::fs::copy(&first.ca_file, &first_ca).unwrap_or_else(|e| panic!("{e}"));

    let mut running = start_webhook(&client, &cert_dir, &operator).await;
    let port = running.addr.port();
    let vwc_name = format!("harness-engine-e2e-{namespace}");
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwcs.create(
        &PostParams::default(),
        &webhook_configuration(&vwc_name, &namespace, port, &first.ca_pem),
    )
    .await
    .unwrap_or_else(|e| panic!("registering the webhook: {e}"));
    let _registration = common::WebhookRegistration {
        name: vwc_name.clone(),
    };

    let profiles: Api<SandboxProfile> = Api::namespaced(client.clone(), &namespace);
    let policies: Api<MemoryPolicy> = Api::namespaced(client.clone(), &namespace);
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &namespace);
    let pp = PostParams::default();

    // The API server picks the configuration up asynchronously: wait until it calls us.
    let foreign_pool = profile(
        "foreign",
        json!({"warmPoolRef": {"name": "pool", "namespace": "kube-system"}}),
    );
    common::eventually(
        Duration::from_secs(30),
        "the API server to call the webhook",
        || {
            let profiles = profiles.clone();
            let foreign_pool = foreign_pool.clone();
            async move {
                match profiles.create(&dry_run(), &foreign_pool).await {
                    Err(kube::Error::Api(s)) if s.message.contains("denied the request") => {
                        Some(())
                    }
                    _ => None,
                }
            }
        },
    )
    .await;

    // ---- SandboxProfile ----
    assert_webhook_refusal(
        profiles.create(&pp, &foreign_pool).await,
        "warm pool in another namespace",
        403,
        &[
            "spec.warmPoolRef.namespace",
            "\"kube-system\" is not the profile's namespace",
        ],
    );
    assert_webhook_refusal(
        profiles
            .create(&pp, &profile("slow-claim", json!({"timeouts": {"claimReadinessDeadline": "2h", "maxLifetime": "1h30m", "idleTTL": "10m"}})))
            .await,
        "claim deadline beyond the lifetime",
        422,
        &["spec.timeouts.claimReadinessDeadline", "2h must be shorter than spec.timeouts.maxLifetime (1h30m)"],
    );
    // Every field Harness Engine does not apply yet is refused by name (docs/crds.md).
    for (name, patch, field) in [
        ("cpu", json!({"limits": {"cpu": "1"}}), "spec.limits.cpu"),
        (
            "memory",
            json!({"limits": {"memory": "1Gi"}}),
            "spec.limits.memory",
        ),
        (
            "ephemeral",
            json!({"limits": {"ephemeralStorage": "1Gi"}}),
            "spec.limits.ephemeralStorage",
        ),
        ("pids", json!({"limits": {"pids": 64}}), "spec.limits.pids"),
        (
            "turns",
            json!({"limits": {"maxConcurrentTurns": 2}}),
            "spec.limits.maxConcurrentTurns",
        ),
        (
            "turn-timeout",
            json!({"timeouts": {"turnTimeout": "15m"}}),
            "spec.timeouts.turnTimeout",
        ),
        (
            "pvc",
            json!({"workspace": {"mode": "persistentVolumeClaim"}}),
            "spec.workspace.mode",
        ),
        (
            "workspace-size",
            json!({"workspace": {"sizeLimit": "1Gi"}}),
            "spec.workspace.sizeLimit",
        ),
    ] {
        assert_webhook_refusal(
            profiles.create(&pp, &profile(name, patch)).await,
            field,
            422,
            &[field, "is not supported yet"],
        );
    }
    // idleTTL < maxLifetime is also a CEL rule: the API server refuses first.
    let idle = profile("idle", json!({"timeouts": {"idleTTL": "13h"}}));
    let (_, message) = refused(
        profiles.create(&pp, &idle).await,
        "idle TTL beyond the lifetime",
    );
    assert!(
        message.contains("idleTTL must be shorter than timeouts.maxLifetime"),
        "{message}"
    );
    let mut idle_value = serde_json::to_value(&idle).unwrap_or_default();
    idle_value["metadata"]["namespace"] = json!(namespace);
    let reply = post_review(
        running.addr,
        &first.ca_file,
        webhook::PATH_SANDBOX_PROFILES,
        admission_request(
            "SandboxProfile",
            &namespace,
            "CREATE",
            idle_value,
            Value::Null,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_direct_refusal(
        &reply,
        "idle TTL (direct)",
        422,
        &["spec.timeouts.idleTTL: 13h must be shorter than spec.timeouts.maxLifetime (12h)"],
    );

    // Good profiles are admitted (the same namespace may be named explicitly).
    profiles
        .create(&pp, &profile("standard", json!({"warmPoolRef": {"name": "pool", "namespace": namespace}, "timeouts": {"claimReadinessDeadline": "90s", "idleTTL": "1h30m", "maxLifetime": "12h"}, "limits": {"maxActiveLeases": 10}, "runtimeClassName": "gvisor", "hibernation": "release", "workloadClass": "standard", "workspace": {"mode": "ephemeral"}})))
        .await
        .unwrap_or_else(|e| panic!("a good profile was refused: {e}"));
    profiles
        .create(&pp, &profile("switched-off", json!({"enabled": false})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    profiles
        .create(
            &pp,
            &profile("strands-only", json!({"allowedHarnessIds": ["strands"]})),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // An update is validated too.
    let (code, message) = refused(
        profiles
            .patch(
                "standard",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"warmPoolRef": {"namespace": "default"}}})),
            )
            .await,
        "profile update to a foreign pool",
    );
    assert_eq!(code, 403, "{message}");

    // ---- MemoryPolicy ----
    policies
        .create(&pp, &memory_policy("memory", json!({"writePolicy": "approval_for_sensitive", "kinds": ["semantic"], "maxResults": 20})))
        .await
        .unwrap_or_else(|e| panic!("a good memory policy was refused: {e}"));
    policies
        .create(
            &pp,
            &memory_policy(
                "others",
                json!({"agentSelector": {"agentIds": ["agent-9"]}}),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_webhook_refusal(
        policies
            .create(
                &pp,
                &memory_policy("loose", json!({"writePolicy": "automatic_scoped"})),
            )
            .await,
        "write policy looser than the deployment",
        403,
        &[
            "spec.writePolicy: automatic_scoped is looser than the deployment memory configuration allows, which is at most approval_for_sensitive",
        ],
    );
    assert_webhook_refusal(
        policies
            .create(
                &pp,
                &memory_policy(
                    "shared",
                    json!({"writeScope": "agent", "writePolicy": "approval_for_sensitive", "readScopes": ["user", "agent"]}),
                ),
            )
            .await,
        "agent-shared writes without shared learning",
        403,
        &["spec.writeScope", "shared learning"],
    );
    assert_webhook_refusal(
        policies
            .create(&pp, &memory_policy("many", json!({"maxResults": 100})))
            .await,
        "max results above the cap",
        403,
        &["spec.maxResults: 100 exceeds the deployment cap of 50"],
    );
    assert_webhook_refusal(
        policies
            .create(
                &pp,
                &memory_policy("procedural", json!({"kinds": ["semantic", "procedural"]})),
            )
            .await,
        "kind the deployment does not allow",
        403,
        &["spec.kinds[1]: procedural memory may not be written"],
    );
    assert_webhook_refusal(
        policies
            .create(
                &pp,
                &memory_policy("forever", json!({"retentionPolicy": "forever"})),
            )
            .await,
        "unknown retention policy",
        422,
        &["spec.retentionPolicy: \"forever\" is not a retention policy"],
    );
    assert_webhook_refusal(
        policies
            .create(
                &pp,
                &memory_policy(
                    "org-reader",
                    json!({"readScopes": ["user", "organization"]}),
                ),
            )
            .await,
        "reading a scope the deployment keeps closed",
        403,
        &["spec.readScopes[1]: this deployment has no organization scope"],
    );
    // Organization writes and empty selectors are CEL rules too: API server first, then
    // the webhook's own answer.
    let org = memory_policy(
        "org",
        json!({"writeScope": "organization", "writePolicy": "disabled"}),
    );
    let (_, message) = refused(policies.create(&pp, &org).await, "organization writes");
    assert!(
        message.contains("writeScope cannot be organization"),
        "{message}"
    );
    for (what, object, parts) in [
        (
            "organization writes (direct)",
            serde_json::to_value(&org).unwrap_or_default(),
            vec!["spec.writeScope", "never agent-configurable"],
        ),
        (
            "empty selector (direct)",
            serde_json::to_value(memory_policy(
                "nobody",
                json!({"agentSelector": {"agentIds": []}}),
            ))
            .unwrap_or_default(),
            vec!["spec.agentSelector: selects no agent"],
        ),
    ] {
        let reply = post_review(
            running.addr,
            &first.ca_file,
            webhook::PATH_MEMORY_POLICIES,
            admission_request("MemoryPolicy", &namespace, "CREATE", object, Value::Null),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let code = if what.starts_with("organization") {
            403
        } else {
            422
        };
        assert_direct_refusal(&reply, what, code, &parts);
    }
    let (_, message) = refused(
        policies
            .create(
                &pp,
                &memory_policy(
                    "nobody",
                    json!({"agentSelector": {"agentIds": null, "allAgents": false}}),
                ),
            )
            .await,
        "empty selector",
    );
    assert!(message.contains("allAgents"), "{message}");

    // ---- HarnessBinding: references ----
    let good = bindings
        .create(&pp, &binding("good", json!({})))
        .await
        .unwrap_or_else(|e| panic!("a good binding was refused: {e}"));
    assert_eq!(good.spec.epoch, 0);
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding(
                    "no-profile",
                    json!({"sandboxProfileRef": {"name": "missing"}}),
                ),
            )
            .await,
        "missing profile",
        422,
        &[
            "spec.sandboxProfileRef.name",
            &format!("SandboxProfile \"missing\" does not exist in namespace \"{namespace}\""),
        ],
    );
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding(
                    "off",
                    json!({"sandboxProfileRef": {"name": "switched-off"}}),
                ),
            )
            .await,
        "disabled profile",
        403,
        &["SandboxProfile \"switched-off\" is disabled"],
    );
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding(
                    "wrong-harness",
                    json!({"sandboxProfileRef": {"name": "strands-only"}}),
                ),
            )
            .await,
        "harness the profile does not allow",
        403,
        &[
            "spec.harness.id: SandboxProfile \"strands-only\" does not allow harness \"deepagents\" (allowed: [strands])",
        ],
    );
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding("no-policy", json!({"memoryPolicyRef": {"name": "absent"}})),
            )
            .await,
        "missing memory policy",
        422,
        &["spec.memoryPolicyRef.name: MemoryPolicy \"absent\" does not exist"],
    );
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding(
                    "not-selected",
                    json!({"memoryPolicyRef": {"name": "others"}}),
                ),
            )
            .await,
        "memory policy that does not select the agent",
        422,
        &["does not select agent \"agent-1\""],
    );

    // ---- HarnessBinding: options ----
    let big = "x".repeat(33 * 1024);
    for (name, options, parts) in [
        (
            "opt-key",
            json!({"apiKey": "hello"}),
            vec!["spec.harness.options.apiKey", "looks like a secret"],
        ),
        (
            "opt-nested-token",
            json!({"provider": {"auth": {"access_token": "t"}}}),
            vec!["spec.harness.options.provider.auth", "looks like a secret"],
        ),
        (
            "opt-env",
            json!({"env": {"PATH": "/bin"}}),
            vec!["spec.harness.options.env", "environment dictionary"],
        ),
        (
            "opt-module",
            json!({"tools": [{"module": "evil.tools"}]}),
            vec![
                "spec.harness.options.tools[0].module",
                "module or import path",
            ],
        ),
        (
            "opt-command",
            json!({"startup": {"command": ["sh"]}}),
            vec!["spec.harness.options.startup.command", "command or shell"],
        ),
        (
            "opt-code",
            json!({"hooks": {"pre_turn_script": "print(1)"}}),
            vec![
                "spec.harness.options.hooks.pre_turn_script",
                "code or a script",
            ],
        ),
        (
            "opt-bearer",
            json!({"headers": {"x-upstream": "Bearer abcdefghijklmnop"}}),
            vec!["spec.harness.options.headers.x-upstream", "a bearer token"],
        ),
        (
            "opt-pem",
            json!({"tls": {"material": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"}}),
            vec!["a PEM key"],
        ),
        (
            "opt-sk",
            json!({"model": "sk-abcdefghijklmnopqrstuvwx"}),
            vec!["spec.harness.options.model", "an API key"],
        ),
        (
            "opt-aws",
            json!({"region_hint": "AKIAABCDEFGHIJKLMNOP"}),
            vec!["an AWS access key id"],
        ),
        (
            "opt-url",
            json!({"store_url": "postgres://app:hunter2@db:5432/x"}),
            vec!["a URL with a password"],
        ),
        (
            "opt-shebang",
            json!({"notes": "#!/bin/bash\necho hi"}),
            vec!["a script (shebang line)"],
        ),
        (
            "opt-import",
            json!({"notes": ["ok", "import os"]}),
            vec!["spec.harness.options.notes[1]", "an import statement"],
        ),
        (
            "opt-require",
            json!({"notes": "const cp = require('child_process')"}),
            vec!["a `require(...)` call"],
        ),
        (
            "opt-size",
            json!({"blob": big}),
            vec![
                "spec.harness.options: encoded as JSON the options are",
                "the limit is 32768 bytes",
            ],
        ),
    ] {
        assert_webhook_refusal(
            bindings
                .create(
                    &pp,
                    &binding(name, json!({"harness": {"options": options}})),
                )
                .await,
            name,
            422,
            &parts,
        );
    }
    // As a user sees it with kubectl.
    let (ok, output) = kubectl_apply(
        &namespace,
        dir.path(),
        "secret.json",
        &binding_value(
            "kubectl-secret",
            json!({"harness": {"options": {"openai": {"OPENAI_API_KEY": "sk-abcdefghijklmnopqrstuvwx"}}}}),
        ),
    );
    assert!(!ok, "kubectl apply admitted a secret: {output}");
    // For a 422 kubectl prints the webhook's causes, field by field.
    assert!(
        output.contains("The HarnessBinding \"kubectl-secret\" is invalid"),
        "{output}"
    );
    assert!(
        output.contains(
            "spec.harness.options.openai.OPENAI_API_KEY: the field name looks like a secret"
        ),
        "{output}"
    );
    let (ok, output) = kubectl_apply(
        &namespace,
        dir.path(),
        "fine.json",
        &binding_value("kubectl-fine", json!({})),
    );
    assert!(ok, "kubectl apply refused a good binding: {output}");

    // Adding a secret to an existing binding's options is refused on update.
    assert_webhook_refusal(
        bindings
            .patch(
                "good",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"harness": {"options": {"password": "x"}}}})),
            )
            .await,
        "secret added on update",
        422,
        &["spec.harness.options.password"],
    );

    // ---- HarnessBinding: identity and epoch (CEL first, then the webhook's answer) ----
    let good_value = serde_json::to_value(&good).unwrap_or_default();
    // A harness or profile change also re-checks the profile, which adds a 403.
    for (what, patch, cel, webhook_part, code) in [
        (
            "agentId change",
            json!({"spec": {"agentId": "agent-2"}}),
            "agentId is immutable",
            "spec.agentId: is immutable",
            422,
        ),
        (
            "conversationId change",
            json!({"spec": {"conversationId": "other"}}),
            "conversationId is immutable",
            "spec.conversationId: is immutable",
            422,
        ),
        (
            "subjectRef change",
            json!({"spec": {"subjectRef": format!("hmac-sha256:{}", "cd".repeat(32))}}),
            "subjectRef is immutable",
            "spec.subjectRef: is immutable",
            422,
        ),
        (
            "epoch +2",
            json!({"spec": {"epoch": 2}}),
            "epoch may only stay the same or rise by exactly 1",
            "spec.epoch: may only stay 0 or rise to 1",
            422,
        ),
        (
            "harness change within the epoch",
            json!({"spec": {"harness": {"id": "strands"}}}),
            "harness.id is immutable within an epoch",
            "spec.harness.id: is immutable within an epoch",
            403,
        ),
        (
            "profile change within the epoch",
            json!({"spec": {"sandboxProfileRef": {"name": "strands-only"}}}),
            "sandboxProfileRef is immutable within an epoch",
            "spec.sandboxProfileRef.name: is immutable within an epoch",
            403,
        ),
    ] {
        let (_, message) = refused(
            bindings
                .patch(
                    "good",
                    &PatchParams::default(),
                    &Patch::Merge(patch.clone()),
                )
                .await,
            what,
        );
        assert!(message.contains(cel), "{what}: {message}");
        let mut changed = good_value.clone();
        merge(&mut changed, patch);
        let reply = post_review(
            running.addr,
            &first.ca_file,
            webhook::PATH_HARNESS_BINDINGS,
            admission_request(
                "HarnessBinding",
                &namespace,
                "UPDATE",
                changed,
                good_value.clone(),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_direct_refusal(&reply, what, code, &[webhook_part]);
    }
    // A clear (epoch + 1) re-checks the profile and is admitted; so is a harness change
    // that comes with it when the new profile allows the new harness.
    let cleared = bindings
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"epoch": 1}})),
        )
        .await
        .unwrap_or_else(|e| panic!("epoch + 1 was refused: {e}"));
    assert_eq!(cleared.spec.epoch, 1);
    let switched = bindings
        .patch("good", &PatchParams::default(), &Patch::Merge(json!({"spec": {"epoch": 2, "harness": {"id": "strands"}, "sandboxProfileRef": {"name": "strands-only"}}})))
        .await
        .unwrap_or_else(|e| panic!("a clear with a new harness was refused: {e}"));
    assert_eq!(switched.spec.epoch, 2);
    // But not into a disabled profile.
    assert_webhook_refusal(
        bindings
            .patch("good", &PatchParams::default(), &Patch::Merge(json!({"spec": {"epoch": 3, "sandboxProfileRef": {"name": "switched-off"}, "harness": {"id": "deepagents"}}})))
            .await,
        "clear into a disabled profile",
        403,
        &["is disabled"],
    );

    // ---- HarnessBinding status: only the operator moves the lease ----
    let lease =
        Patch::Merge(json!({"status": {"lease": {"generation": 1, "claimName": "good-1"}}}));
    assert_webhook_refusal(
        bindings
            .patch_status("good", &PatchParams::default(), &lease)
            .await,
        "lease moved by an administrator",
        403,
        &[
            "status.lease",
            &format!("only {operator} may change the sandbox lease"),
        ],
    );
    let roles: Api<Role> = Api::namespaced(client.clone(), &namespace);
    roles
        .create(&pp, &from_json(json!({"metadata": {"name": "lease-writer"},
            "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings", "harnessbindings/status"], "verbs": ["get", "patch", "update"]}]})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &namespace);
    role_bindings
        .create(&pp, &from_json(json!({"metadata": {"name": "lease-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "harness-engine", "namespace": namespace}]})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let as_operator: Api<HarnessBinding> = Api::namespaced(client_as(&operator).await, &namespace);
    let leased = common::eventually(
        Duration::from_secs(20),
        "the operator identity to move the lease",
        || {
            let api = as_operator.clone();
            let lease = lease.clone();
            async move {
                api.patch_status("good", &PatchParams::default(), &lease)
                    .await
                    .ok()
            }
        },
    )
    .await;
    assert_eq!(
        leased.status.and_then(|s| s.lease).map(|l| l.generation),
        Some(1)
    );
    // Anyone may write the rest of the status (the lease stays as it is).
    bindings
        .patch_status(
            "good",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 4}})),
        )
        .await
        .unwrap_or_else(|e| panic!("a status update that leaves the lease alone was refused: {e}"));
    assert_webhook_refusal(
        bindings
            .patch_status(
                "good",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"lease": {"generation": 2}}})),
            )
            .await,
        "lease generation raised by an administrator",
        403,
        &["is not one of them"],
    );

    // ---- Certificate rotation without a restart ----
    let second = certs::self_signed(&cert_dir, &hosts).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(second.ca_pem, first.ca_pem);
    let mut vwc = vwcs.get(&vwc_name).await.unwrap_or_else(|e| panic!("{e}"));
    for hook in vwc.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle =
            Some(k8s_openapi::ByteString(second.ca_pem.clone().into_bytes()));
    }
    vwcs.replace(&vwc_name, &pp, &vwc)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The API server switches to the new CA asynchronously; until then its calls fail
    // closed (failurePolicy Fail). Wait for a good object to be admitted again.
    common::eventually(
        Duration::from_secs(30),
        "admission with the rotated certificate",
        || {
            let profiles = profiles.clone();
            // Until the API server has switched to the new CA it may still admit over a
            // connection it opened before the rotation; done means admitted over a
            // handshake with the rotated certificate.
            let reloaded = running.acceptor.reloads() >= 1;
            async move {
                let admitted = profiles
                    .create(&dry_run(), &profile("after-rotation", json!({})))
                    .await
                    .is_ok();
                (admitted && reloaded).then_some(())
            }
        },
    )
    .await;
    assert!(
        running.acceptor.reloads() >= 1,
        "the webhook did not reload its certificate"
    );
    assert_webhook_refusal(
        profiles.create(&pp, &foreign_pool).await,
        "a bad profile after rotation",
        403,
        &["spec.warmPoolRef.namespace"],
    );
    assert_webhook_refusal(
        bindings
            .create(
                &pp,
                &binding(
                    "after-rotation",
                    json!({"harness": {"options": {"apiKey": "x"}}}),
                ),
            )
            .await,
        "a secret after rotation",
        422,
        &["spec.harness.options.apiKey"],
    );
    // New connections present the new certificate: the first CA no longer verifies it.
    let probe = admission_request(
        "SandboxProfile",
        &namespace,
        "CREATE",
        serde_json::to_value(&foreign_pool).unwrap_or_default(),
        Value::Null,
    );
    assert!(
        post_review(
            running.addr,
            &first_ca,
            webhook::PATH_SANDBOX_PROFILES,
            probe.clone()
        )
        .await
        .is_err()
    );
    let reply = post_review(
        running.addr,
        &second.ca_file,
        webhook::PATH_SANDBOX_PROFILES,
        probe,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reply["response"]["allowed"], false);

    // Stop the webhook; the registration guard deletes its configuration.
    if let Some(stop) = running.stop.take() {
        let _ = stop.send(());
    }
    if let Some(task) = running.task.take() {
        task.await.unwrap_or_else(|e| panic!("{e}"));
    }
}
