//! End-to-end: a conversation started through the data plane alone. A control-plane
//! ServiceAccount (RBAC on harnessbindings, impersonation of its end user) binds over
//! HTTP; the real `harness-engine operator` process, running as its own ServiceAccount
//! with the ClusterRole of `config/rbac` (the chart's), creates the HarnessBinding, the
//! Agent Sandbox controller claims a sandbox and kwok runs its pod.
//! Nothing is mocked; the local control plane comes from `e2e/scripts/with-control-plane.sh`.

mod common;

use std::time::Duration;

use common::{
    eventually, kubectl,
    operator::{Operator, OperatorOptions, apply_samples, drop_finalizers},
};
use harness_engine::{
    api::{
        BINDING_ID_LABEL, HarnessBinding, Lifecycle, conditions,
        sandbox::{Sandbox, SandboxClaim},
    },
    domain::ids::Keyring,
};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};

const SUBJECT: &str = "user:alice";
const AGENT: &str = "research-assistant";

/// A ServiceAccount token with audience harness-engine, as a backend's projected
/// token volume holds it.
async fn token(client: &Client, ns: &str, sa: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    api.create_token_request(
        sa,
        &PostParams::default(),
        &TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec!["harness-engine".into()]),
                expiration_seconds: Some(600),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .expect("token request")
    .status
    .and_then(|s| s.token)
    .expect("token")
}

async fn service_account(client: &Client, ns: &str, name: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa"),
    )
    .await
    .expect("service account");
}

/// `POST /v1/bindings` as `token`, acting for `subject`.
async fn bind(op: &Operator, token: &str, subject: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/bindings", op.api))
        .bearer_auth(token)
        .header("Harness-Subject", subject)
        .header("Idempotency-Key", format!("bind-{}", rand_suffix()))
        .json(&body)
        .send()
        .await
        .expect("data plane answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The operator's identity as the chart deploys it: a ServiceAccount bound to the
/// ClusterRole of `config/rbac/role.yaml` (the chart's, kept equal by `tests/chart.rs`),
/// and a kubeconfig holding its token. The cluster-scoped role and binding are deleted on
/// drop.
struct OperatorIdentity {
    client: Client,
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl OperatorIdentity {
    async fn create(client: &Client, ns: &str, dir: &std::path::Path) -> Self {
        service_account(client, ns, "harness-engine").await;
        let text = std::fs::read_to_string(common::repo_path("config/rbac/role.yaml"))
            .expect("config/rbac/role.yaml");
        let mut role: ClusterRole = serde_saphyr::from_str(&text).expect("ClusterRole yaml");
        let name = format!("{ns}-operator");
        role.metadata.name = Some(name.clone());
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .expect("operator ClusterRole");
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}, "subjects": [{"kind": "ServiceAccount", "name": "harness-engine", "namespace": ns}]})).expect("binding"))
            .await
            .expect("operator ClusterRoleBinding");
        // The API server's own audience: the operator talks to the API server with it,
        // as with its projected ServiceAccount token in a pod.
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        let token = api
            .create_token_request(
                "harness-engine",
                &PostParams::default(),
                &TokenRequest {
                    spec: Some(TokenRequestSpec {
                        audiences: Some(vec![]),
                        expiration_seconds: Some(3600),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await
            .expect("operator token")
            .status
            .and_then(|s| s.token)
            .expect("token");
        let admin =
            std::fs::read_to_string(&common::control_plane().kubeconfig).expect("kubeconfig");
        let admin: Value = serde_saphyr::from_str(&admin).expect("kubeconfig yaml");
        let cluster = admin["clusters"][0].clone();
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": "operator", "user": {"token": token}}],
            "contexts": [{"name": "operator", "context": {"cluster": cluster["name"], "user": "operator", "namespace": ns}}],
            "current-context": "operator",
        });
        let path = dir.join("operator.kubeconfig");
        std::fs::write(&path, kubeconfig.to_string()).expect("operator kubeconfig");
        OperatorIdentity {
            client: client.clone(),
            name,
            kubeconfig: path,
        }
    }
}

impl Drop for OperatorIdentity {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let _ = std::thread::spawn(move || {
                handle.block_on(async move {
                    let _ = Api::<ClusterRoleBinding>::all(client.clone())
                        .delete(&name, &DeleteParams::default())
                        .await;
                    let _ = Api::<ClusterRole>::all(client)
                        .delete(&name, &DeleteParams::default())
                        .await;
                })
            })
            .join();
        }
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_started_through_the_data_plane_gets_a_ready_binding_and_a_sandbox() {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns_guard = common::TestNamespace::new(&client, "op-bind").await;
    let ns = ns_guard.name.clone();
    apply_samples(&ns);
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns);
    // Only the bindings this test makes through the data plane (the operator is not
    // running yet, so the sample has no finalizer).
    bindings
        .delete("conversation-sample", &DeleteParams::default())
        .await
        .expect("delete the sample binding");

    let dir = tempfile::tempdir().expect("tempdir");
    let key = b"operator-bind-e2e-identity-key-0123456789".to_vec();
    let key_file = dir.path().join("identity.key");
    std::fs::write(&key_file, &key).expect("key file");
    let keyring = Keyring::new(key, "e2e").expect("keyring");
    // The operator runs as the chart runs it: its own ServiceAccount and ClusterRole, so
    // the HarnessBinding a bind creates is created with exactly that RBAC.
    let identity = OperatorIdentity::create(&client, &ns, dir.path()).await;
    let mut op = Operator::start_with_kubeconfig(
        OperatorOptions {
            namespace: &ns,
            data_dir: &dir.path().join("data"),
            leader_lease_seconds: None,
            extra: vec!["--identity-key-file".into(), key_file.display().to_string()],
        },
        &identity.kubeconfig,
    );

    // The backend: may create and read bindings here, and act for alice only.
    service_account(&client, &ns, "backend").await;
    service_account(&client, &ns, "nobody").await;
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bindings"}, "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings"], "verbs": ["get", "create", "update"]}]})).expect("role"))
        .await
        .expect("role");
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    role_bindings
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"}, "subjects": [{"kind": "ServiceAccount", "name": "backend", "namespace": ns}]})).expect("role binding"))
        .await
        .expect("role binding");
    let _impersonation =
        common::Impersonation::create(&client, &format!("{ns}-act-for-alice"), &ns).await;
    let backend = token(&client, &ns, "backend").await;

    // 1. A new conversation: 201 with the HarnessBinding's name and uid.
    let conversation = "conv-through-data-plane";
    let request = json!({
        "agent_id": AGENT,
        "conversation_id": conversation,
        "harness": "deepagents",
        "sandbox_profile": "python-worker",
        "memory_policy": "research-assistant",
    });
    let (status, first) = bind(&op, &backend, SUBJECT, request.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = keyring.binding_id(SUBJECT, AGENT, conversation);
    assert_eq!(first["binding_id"].as_str(), Some(id.as_str()), "{first}");
    let name = first["harness_binding"]["name"]
        .as_str()
        .expect("the answer names the HarnessBinding")
        .to_owned();
    assert_eq!(
        name,
        format!("hb-{}", id.as_str().trim_start_matches("hb_"))
    );
    assert_eq!(
        first["harness_binding"]["namespace"].as_str(),
        Some(ns.as_str())
    );
    let uid = first["harness_binding"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();

    // The operator leases it: Ready=True, a SandboxClaim and its Sandbox.
    let ready = eventually(
        Duration::from_secs(120),
        "the bound conversation is Ready",
        || async {
            let b = bindings.get_opt(&name).await.ok()??;
            let status = b.status.clone()?;
            (status.lifecycle == Some(Lifecycle::Ready)
                && conditions::is_true(&status.conditions, "Ready"))
            .then_some(b)
        },
    )
    .await;
    assert_eq!(ready.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(
        ready.spec.subject_ref,
        keyring.subject_ref(SUBJECT).as_str()
    );
    assert_eq!(ready.spec.sandbox_profile_ref.name, "python-worker");
    assert_eq!(
        ready
            .spec
            .memory_policy_ref
            .as_ref()
            .map(|r| r.name.as_str()),
        Some("research-assistant")
    );
    assert_eq!(
        ready.labels().get(BINDING_ID_LABEL).map(String::as_str),
        Some(id.as_str())
    );
    let lease = ready.status.clone().and_then(|s| s.lease).expect("lease");
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims
        .get(lease.claim_name.as_deref().expect("claim name"))
        .await
        .expect("the lease's SandboxClaim exists");
    assert_eq!(claim.uid(), lease.claim_uid);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let sandbox = sandboxes
        .get(lease.sandbox_name.as_deref().expect("sandbox name"))
        .await
        .expect("the lease's Sandbox exists");
    assert_eq!(sandbox.uid(), lease.sandbox_uid);
    let (ok, out, err) = kubectl(&["get", "harnessbinding", &name, "-n", &ns]);
    assert!(ok, "kubectl get: {err}");
    let row = out.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with(&name) && row.split_whitespace().nth(1) == Some("True"),
        "kubectl shows the binding Ready:\n{out}"
    );

    // 2. A repeat bind: 200, the same object and id, nothing new created.
    let (status, again) = bind(&op, &backend, SUBJECT, request.clone()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["binding_id"], first["binding_id"]);
    assert_eq!(
        again["harness_binding"]["name"].as_str(),
        Some(name.as_str())
    );
    assert_eq!(again["harness_binding"]["uid"].as_str(), Some(uid.as_str()));
    assert_eq!(again["lease_generation"].as_u64(), Some(1), "{again}");

    // 3. A new conversation naming a profile that does not exist: 422, nothing created.
    let missing = "conv-missing-profile";
    let (status, refused) = bind(
        &op,
        &backend,
        SUBJECT,
        json!({"agent_id": AGENT, "conversation_id": missing, "harness": "deepagents",
               "sandbox_profile": "no-such-profile"}),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["code"], "invalid", "{refused}");
    assert_eq!(
        refused["details"]["violations"][0]["field"], "sandbox_profile",
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"no-such-profile\" does not exist")),
        "{refused}"
    );
    // And one naming no profile at all.
    let (status, unnamed) = bind(
        &op,
        &backend,
        SUBJECT,
        json!({"agent_id": AGENT, "conversation_id": missing, "harness": "deepagents"}),
    )
    .await;
    assert_eq!(status, 422, "{unnamed}");
    assert_eq!(unnamed["details"]["field"], "sandbox_profile", "{unnamed}");
    let missing_id = keyring.binding_id(SUBJECT, AGENT, missing);
    let selector = format!("{BINDING_ID_LABEL}={}", missing_id.as_str());
    assert!(
        bindings
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list")
            .items
            .is_empty(),
        "a refused bind creates no HarnessBinding"
    );

    // 4. Callers without the RBAC: refused, nothing created.
    let nobody = token(&client, &ns, "nobody").await;
    let (status, body) = bind(&op, &nobody, SUBJECT, request.clone()).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "forbidden_scope", "{body}");
    let mut for_mallory = request.clone();
    for_mallory["conversation_id"] = json!("conv-for-mallory");
    let (status, body) = bind(&op, &backend, "user:mallory", for_mallory).await;
    assert_eq!(status, 403, "may not impersonate mallory: {body}");
    let all = bindings.list(&ListParams::default()).await.expect("list");
    assert_eq!(
        all.items.iter().map(|b| b.name_any()).collect::<Vec<_>>(),
        vec![name.clone()],
        "only the one bound conversation has a HarnessBinding"
    );

    // 5. Two binds of a new conversation at once (a client retry, two replicas): one
    //    object, both answers name it, one of them created it.
    let mut raced = request.clone();
    raced["conversation_id"] = json!("conv-raced");
    let (a, b) = tokio::join!(
        bind(&op, &backend, SUBJECT, raced.clone()),
        bind(&op, &backend, SUBJECT, raced.clone())
    );
    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 201], "{} {}", a.1, b.1);
    assert_eq!(
        a.1["harness_binding"], b.1["harness_binding"],
        "{} {}",
        a.1, b.1
    );
    let raced_id = keyring.binding_id(SUBJECT, AGENT, "conv-raced");
    let selector = format!("{BINDING_ID_LABEL}={}", raced_id.as_str());
    assert_eq!(
        bindings
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    op.stop();
    drop_finalizers(&ns);
}
