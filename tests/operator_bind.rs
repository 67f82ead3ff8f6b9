//! End-to-end: a conversation started through the data plane alone. A control-plane
//! ServiceAccount (RBAC on harnessbindings, impersonation of its end user) binds over
//! HTTP; the real `harness-engine operator` process, running as its own ServiceAccount
//! with the ClusterRole of `config/rbac` (the chart's), creates the HarnessBinding, the
//! Agent Sandbox controller claims a sandbox and kwok runs its pod.
//! Nothing is mocked; the local control plane comes from `e2e/scripts/with-control-plane.sh`.

mod common;
mod store_conformance;

use std::time::Duration;

use common::{
    eventually, kubectl,
    operator::{Operator, OperatorOptions, apply_samples, drop_finalizers},
};
use harness_engine::{
    api::{
        BINDING_ID_LABEL, HarnessBinding, Lifecycle, MemoryPolicy, conditions,
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
            name,
            kubeconfig: path,
        }
    }
}

impl Drop for OperatorIdentity {
    fn drop(&mut self) {
        let name = self.name.clone();
        common::cleanup_blocking("operator identity", move |client| async move {
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&name, &DeleteParams::default())
                .await;
            let _ = Api::<ClusterRole>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A test namespace with the samples, an operator running as its own ServiceAccount
/// (`extra` flags, given the namespace and a directory of the test's), and control-plane
/// ServiceAccounts (`backend`, plus `accounts`) that may create, read and update
/// bindings there and act for alice; `nobody` may do nothing.
struct Setup {
    ns: String,
    keyring: Keyring,
    op: Operator,
    bindings: Api<HarnessBinding>,
    backend: String,
    // Dropped last to first: the operator stops before its namespace goes.
    _impersonation: common::Impersonation,
    _identity: OperatorIdentity,
    _dir: tempfile::TempDir,
    _ns: common::TestNamespace,
}

async fn setup(
    client: &Client,
    prefix: &str,
    accounts: &[&str],
    extra: impl FnOnce(&str, &std::path::Path) -> Vec<String>,
) -> Setup {
    common::install_our_crds(client).await;
    let ns_guard = common::TestNamespace::new(client, prefix).await;
    let ns = ns_guard.name.clone();
    apply_samples(&ns);
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns);
    // Only the bindings the test makes through the data plane (the operator is not
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
    let identity = OperatorIdentity::create(client, &ns, dir.path()).await;
    let mut flags = vec!["--identity-key-file".into(), key_file.display().to_string()];
    flags.extend(extra(&ns, dir.path()));
    let op = Operator::start_with_kubeconfig(
        OperatorOptions {
            namespace: &ns,
            data_dir: &dir.path().join("data"),
            leader_lease_seconds: None,
            extra: flags,
        },
        &identity.kubeconfig,
    );

    // The backend: may create and read bindings here, and act for alice only.
    let mut all_accounts = vec!["backend"];
    all_accounts.extend_from_slice(accounts);
    for account in all_accounts.iter().chain(&["nobody"]) {
        service_account(client, &ns, account).await;
    }
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bindings"}, "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings"], "verbs": ["get", "create", "update"]}]})).expect("role"))
        .await
        .expect("role");
    let subjects: Vec<Value> = all_accounts
        .iter()
        .map(|a| json!({"kind": "ServiceAccount", "name": a, "namespace": ns}))
        .collect();
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    role_bindings
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"}, "subjects": subjects})).expect("role binding"))
        .await
        .expect("role binding");
    let impersonation = common::Impersonation::create_for(
        client,
        &format!("{ns}-act-for-alice"),
        &ns,
        &all_accounts,
    )
    .await;
    let backend = token(client, &ns, "backend").await;
    Setup {
        ns,
        keyring,
        op,
        bindings,
        backend,
        _impersonation: impersonation,
        _identity: identity,
        _dir: dir,
        _ns: ns_guard,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_started_through_the_data_plane_gets_a_ready_binding_and_a_sandbox() {
    let client = common::client().await;
    // Every field bound (a `..` would drop the namespace and the operator's identity
    // at once); the operator is bound last, so it stops first.
    let Setup {
        _ns,
        _dir,
        _identity,
        _impersonation,
        ns,
        keyring,
        bindings,
        backend,
        mut op,
    } = setup(&client, "op-bind", &[], |_, _| Vec::new()).await;

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

/// A memory call as `token`, acting for alice, in the context of binding `binding`.
async fn memory(
    op: &Operator,
    token: &str,
    path: &str,
    binding: &str,
    body: Value,
) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(
            if path.ends_with("/records") {
                reqwest::Method::PUT
            } else {
                reqwest::Method::POST
            },
            format!("{}{path}", op.api),
        )
        .bearer_auth(token)
        .header("Harness-Subject", SUBJECT)
        .header("Harness-Binding", binding)
        .header("Idempotency-Key", format!("memory-{}", rand_suffix()))
        .json(&body)
        .send()
        .await
        .expect("data plane answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Long-term memory in operator mode, configured as the chart configures it (a
/// deployment memory configuration file naming an approver): a sensitive write by the
/// backend is held, the configured approver (another ServiceAccount) approves it and it
/// becomes searchable; the writer cannot approve its own write; an agent that no
/// MemoryPolicy selects is refused long-term memory altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_in_operator_mode_needs_a_policy_and_a_configured_approver() {
    let client = common::client().await;
    let Setup {
        _ns,
        _dir,
        _identity,
        _impersonation,
        ns,
        keyring: _,
        bindings: _,
        backend,
        mut op,
    } = setup(&client, "op-memory", &["reviewer"], |ns, dir| {
        let config = dir.join("memory.yaml");
        std::fs::write(
            &config,
            format!("approvers: [\"system:serviceaccount:{ns}:reviewer\"]\n"),
        )
        .expect("memory config");
        vec!["--memory-config".into(), config.display().to_string()]
    })
    .await;
    let reviewer = token(&client, &ns, "reviewer").await;
    let start = |agent: &str, conversation: &str| {
        json!({"agent_id": agent, "conversation_id": conversation, "harness": "deepagents",
               "sandbox_profile": "python-worker"})
    };
    let (status, bound) = bind(&op, &backend, SUBJECT, start(AGENT, "conv-memory")).await;
    assert_eq!(status, 201, "{bound}");
    let binding = bound["binding_id"].as_str().expect("binding id").to_owned();

    // The sample MemoryPolicy selects research-assistant: user memory, approval for
    // sensitive writes. A secret makes the write sensitive: held, redacted.
    let held = eventually(
        Duration::from_secs(30),
        "the operator has loaded the sample MemoryPolicy",
        || async {
            let (status, body) = memory(
                &op,
                &backend,
                "/v1/memory/user/records",
                &binding,
                json!({"key": "infra/db", "kind": "semantic",
                       "content": "billing db is postgres://svc:Hunter2Hunter2@db:5432/billing"}),
            )
            .await;
            (status == 201).then_some(body)
        },
    )
    .await;
    assert_eq!(held["record"]["approval_status"], "pending", "{held}");
    let search = |token: String| {
        let (op, binding) = (&op, binding.clone());
        async move {
            let (status, body) = memory(
                op,
                &token,
                "/v1/memory/search",
                &binding,
                json!({"query": "billing db"}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            body["results"].as_array().map(Vec::len).unwrap_or(0)
        }
    };
    assert_eq!(
        search(backend.clone()).await,
        0,
        "a held write is not searchable"
    );

    // The writer is not an approver; the configured reviewer is.
    let decision = json!({"key": "infra/db", "expected_revision": 1, "reason": "secret redacted"});
    let (status, body) = memory(
        &op,
        &backend,
        "/v1/memory/user/records/approve",
        &binding,
        decision.clone(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("forbidden_scope")),
        "{body}"
    );
    let (status, body) = memory(
        &op,
        &reviewer,
        "/v1/memory/user/records/approve",
        &binding,
        decision,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["record"]["approval"]["decided_by"],
        format!("system:serviceaccount:{ns}:reviewer"),
        "{body}"
    );
    assert_eq!(body["record"]["approval_status"], "approved", "{body}");
    assert_eq!(
        search(backend.clone()).await,
        1,
        "approved memory is searchable"
    );

    // An agent no MemoryPolicy selects: no long-term memory, reads and writes refused.
    let (status, other) = bind(
        &op,
        &backend,
        SUBJECT,
        start("unlisted-agent", "conv-no-policy"),
    )
    .await;
    assert_eq!(status, 201, "{other}");
    let other = other["binding_id"].as_str().expect("binding id").to_owned();
    for (path, body) in [
        (
            "/v1/memory/user/records",
            json!({"key": "k", "kind": "semantic", "content": "likes tea"}),
        ),
        ("/v1/memory/search", json!({"query": "tea"})),
    ] {
        let (status, refused) = memory(&op, &backend, path, &other, body).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (403, Some("forbidden_scope")),
            "{path}: {refused}"
        );
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains("no MemoryPolicy selects agent")),
            "{path}: {refused}"
        );
    }

    // A binding's memoryPolicyRef names the one policy that applies: a read-only policy
    // for the same agent makes its writes refused, where the namespace's own selection
    // (the sample policy) would have admitted them.
    let policies: Api<MemoryPolicy> = Api::namespaced(client.clone(), &ns);
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "read-only"},
                "spec": {"agentSelector": {"agentIds": [AGENT]}, "writePolicy": "disabled"}}))
            .expect("policy"),
        )
        .await
        .expect("create the read-only policy");
    let mut by_ref = start(AGENT, "conv-by-ref");
    by_ref["memory_policy"] = json!("read-only");
    let (status, bound) = bind(&op, &backend, SUBJECT, by_ref).await;
    assert_eq!(status, 201, "{bound}");
    let by_ref = bound["binding_id"].as_str().expect("binding id").to_owned();
    let refused = eventually(
        Duration::from_secs(30),
        "the write under the named read-only policy is refused",
        || async {
            let (status, body) = memory(
                &op,
                &backend,
                "/v1/memory/user/records",
                &by_ref,
                json!({"key": "k2", "kind": "semantic", "content": "likes oolong"}),
            )
            .await;
            (status == 403).then_some(body)
        },
    )
    .await;
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("read-only")),
        "{refused}"
    );
    let (status, body) = memory(
        &op,
        &backend,
        "/v1/memory/search",
        &by_ref,
        json!({"query": "billing db"}),
    )
    .await;
    assert_eq!(status, 200, "reads stay allowed: {body}");
    assert_eq!(
        body["results"].as_array().map(Vec::len),
        Some(1),
        "the same user's approved memory: {body}"
    );
    op.stop();
    drop_finalizers(&ns);
}

/// An effect whose outcome is unknown waits for a person, and `kubectl describe` says
/// so: the run ledger of a Ready binding records a refund attempted and observed
/// `unknown` (appended through the store the operator serves, as a worker's appends
/// would land); the binding's `EffectsSettled` turns False naming the refund, with a
/// Warning Event; once reconciliation confirms it, `EffectsSettled` is True again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_describe_shows_an_unknown_effect_waiting_for_a_person() {
    use harness_engine::{
        domain::ledger::EventType,
        store::{BindingStore, ledger::LedgerStore, sqlite::SqliteStore},
    };
    use store_conformance::ledger::{append, attempt, event, observed, request};
    let client = common::client().await;
    let Setup {
        _ns,
        _dir,
        _identity,
        _impersonation,
        ns,
        keyring: _,
        bindings,
        backend,
        mut op,
    } = setup(&client, "op-effects", &[], |_, _| {
        vec!["--state-projection-seconds".into(), "1".into()]
    })
    .await;
    let (status, bound) = bind(
        &op,
        &backend,
        SUBJECT,
        json!({"agent_id": AGENT, "conversation_id": "conv-refund", "harness": "deepagents",
               "sandbox_profile": "python-worker"}),
    )
    .await;
    assert_eq!(status, 201, "{bound}");
    let name = bound["harness_binding"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    let id = harness_engine::domain::ids::BindingId::parse(
        bound["binding_id"].as_str().expect("binding id"),
    )
    .expect("binding id");
    let ready = eventually(Duration::from_secs(120), "the binding is Ready", || async {
        let b = bindings.get_opt(&name).await.ok()??;
        let s = b.status.clone()?;
        conditions::is_true(&s.conditions, "Ready").then_some(s)
    })
    .await;
    let generation = u64::try_from(ready.lease.expect("lease").generation).expect("generation");

    // The worker's ledger: a refund attempted, its outcome unknown (the pod was evicted
    // mid-call, say).
    let store = SqliteStore::open(
        &_dir.path().join("data/state.db"),
        store_conformance::limits(),
    )
    .await
    .expect("the operator's store");
    let record = store
        .get_binding(&id)
        .await
        .expect("get")
        .expect("the bound binding");
    let scope = store_conformance::scope_of(&record, 0, generation);
    for e in [
        event(EventType::RunStarted, "run-7", "t1", json!({})),
        event(
            EventType::EffectAttempted,
            "run-7",
            "t1",
            attempt("refund-42"),
        ),
        event(
            EventType::EffectOutcomeObserved,
            "run-7",
            "t1",
            observed("refund-42", "unknown", "direct"),
        ),
    ] {
        append(&store, &scope, &request(e)).await;
    }
    let describe = || {
        let (ok, out, err) = kubectl(&["describe", "harnessbinding", &name, "-n", &ns]);
        assert!(ok, "kubectl describe: {err}");
        out
    };
    let out = eventually(
        Duration::from_secs(90),
        "describe shows the unknown refund",
        || async {
            let out = describe();
            (out.contains("EffectOutcomeUnknown")
                && out.contains("issue_refund (key refund-42, run run-7)")
                && out.contains("Warning"))
            .then_some(out)
        },
    )
    .await;
    assert!(out.contains("EffectsSettled"), "{out}");

    // Reconciliation confirms it: settled.
    append(
        &store,
        &scope,
        &request(event(
            EventType::EffectOutcomeObserved,
            "run-7",
            "t1",
            observed("refund-42", "confirmed", "reconciliation"),
        )),
    )
    .await;
    assert_eq!(
        store
            .ledger_state(&scope)
            .await
            .expect("state")
            .effects
            .len(),
        1
    );
    eventually(
        Duration::from_secs(90),
        "the binding shows the effect settled",
        || async {
            let b = bindings.get_opt(&name).await.ok()??;
            let s = b.status?;
            conditions::is_true(&s.conditions, "EffectsSettled").then_some(())
        },
    )
    .await;
    drop(store);
    op.stop();
    drop_finalizers(&ns);
}
