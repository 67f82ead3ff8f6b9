//! Kubernetes authentication of the data-plane API against the real API server of the
//! local control plane (`make test` starts it; see `tests/common`): real ServiceAccounts,
//! TokenRequest-issued pod-bound tokens with audience `harness-engine`, a real Agent
//! Sandbox `Sandbox` whose pod the sandbox controller creates (and kwok "runs"), a
//! HarnessBinding whose lease status points at that Sandbox, and RBAC for service callers.
//!
//! The test serves the data plane in-process as the operator does (`server::app` and
//! `/mcp` beside it) with the `KubernetesAuthenticator` on the embedded SQLite store, over
//! real HTTP on a loopback port.

mod api_support;
mod common;

use std::{sync::Arc, time::Duration};

use api_support::{Api as Http, Reply, send};
use base64::Engine;
use harness_engine::{
    api::HarnessBinding,
    domain::{ids::Keyring, limits::Limits, state::BindingRecord},
    server::{
        self, AppState, ServerConfig,
        auth::kubernetes::{BINDING_ID_LABEL, KubernetesAuthConfig, KubernetesAuthenticator},
    },
    store::{BindingStore, ThreadStateStore, now_ms, sqlite::SqliteStore},
};
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use reqwest::Method;
use serde_json::json;

const WORKER_IMAGE: &str =
    "busybox@sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e";

fn keyring() -> Keyring {
    Keyring::new(b"api-kubernetes-test-key-0123456789abcdef".to_vec(), "e2e")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
}

/// The API server, the store and our server, for one namespace.
struct Fixture {
    client: Client,
    ns: common::TestNamespace,
    store: Arc<SqliteStore>,
    base: String,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(prefix: &str) -> Self {
        let client = common::client().await;
        common::install_our_crds(&client).await;
        let ns = common::TestNamespace::new(&client, prefix).await;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = Arc::new(
            SqliteStore::open(&dir.path().join("state.db"), Limits::default())
                .await
                .unwrap_or_else(|e| panic!("store: {e}")),
        );
        let auth = KubernetesAuthenticator::new(client.clone(), KubernetesAuthConfig::default());
        let state = AppState::new(
            store.clone(),
            keyring(),
            Arc::new(auth),
            ServerConfig::new(Limits::default()),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let base = format!(
            "http://{}",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        // The data plane as the operator serves it: /v1 and /mcp beside it.
        let router = harness_engine::mcp::with_mcp(
            state.clone(),
            server::app(state),
            harness_engine::mcp::HostPolicy::default(),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Fixture {
            client,
            ns,
            store,
            base,
            _dir: dir,
        }
    }

    fn ns(&self) -> &str {
        &self.ns.name
    }

    async fn service_account(&self, name: &str) -> ServiceAccount {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), self.ns());
        api.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": name}})),
        )
        .await
        .unwrap_or_else(|e| panic!("serviceaccount {name}: {e}"))
    }

    /// A TokenRequest-issued token for `sa`, optionally bound to a pod.
    async fn token(&self, sa: &str, audience: &str, pod: Option<&Pod>) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), self.ns());
        let bound = pod.map(|p| BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: p.metadata.name.clone(),
            uid: p.metadata.uid.clone(),
        });
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![audience.into()]),
                expiration_seconds: Some(600),
                bound_object_ref: bound,
                ..Default::default()
            }),
            ..Default::default()
        };
        let issued = api
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("token for {sa}: {e}"));
        issued.status.and_then(|s| s.token).unwrap_or_default()
    }

    fn sandboxes(&self) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("agents.x-k8s.io", "v1beta1", "Sandbox"),
            "sandboxes",
        );
        Api::namespaced_with(self.client.clone(), self.ns(), &resource)
    }

    /// A real Sandbox; the Agent Sandbox controller creates its pod, running as `sa`.
    async fn sandbox(&self, name: &str, sa: &str) -> (DynamicObject, Pod) {
        let sandbox: DynamicObject = from_json(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": {"metadata": {}, "spec": {
                "serviceAccountName": sa,
                "containers": [{"name": "agent", "image": WORKER_IMAGE, "command": ["sleep", "infinity"]}]
            }}}
        }));
        let sandbox = self
            .sandboxes()
            .create(&PostParams::default(), &sandbox)
            .await
            .unwrap_or_else(|e| panic!("sandbox {name}: {e}"));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let uid = sandbox.metadata.uid.clone().unwrap_or_default();
        let pod = common::eventually(
            Duration::from_secs(60),
            &format!("the pod of Sandbox {name}"),
            || {
                let pods = pods.clone();
                let uid = uid.clone();
                async move {
                    let pod = pods.get_opt(name).await.ok().flatten()?;
                    let owned =
                        pod.metadata.owner_references.as_ref()?.iter().any(|r| {
                            r.kind == "Sandbox" && r.uid == uid && r.controller == Some(true)
                        });
                    owned.then_some(pod)
                }
            },
        )
        .await;
        (sandbox, pod)
    }

    /// A HarnessBinding for (subject, agent, conversation), labelled with its store id,
    /// whose lease holds `sandbox` at `generation`; and the store's binding record.
    async fn binding(
        &self,
        name: &str,
        subject: &str,
        conversation: &str,
        sandbox: &DynamicObject,
        generation: i64,
    ) -> (HarnessBinding, BindingRecord) {
        let kr = keyring();
        let id = kr.binding_id(subject, "agent-1", conversation);
        let api: Api<HarnessBinding> = Api::namespaced(self.client.clone(), self.ns());
        let object: HarnessBinding = from_json(json!({
            "apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
            "metadata": {"name": name, "labels": {BINDING_ID_LABEL: id.as_str()}},
            "spec": {"agentId": "agent-1", "conversationId": conversation, "subjectRef": kr.subject_ref(subject).as_str(),
                     "harness": {"id": "strands"}, "sandboxProfileRef": {"name": "default"}}
        }));
        let created = api
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("harnessbinding {name}: {e}"));
        self.lease(name, sandbox, generation, "ready").await;
        let record = BindingRecord {
            binding_id: id,
            environment: kr.environment().to_owned(),
            owner: kr.subject_ref(subject),
            agent_id: "agent-1".into(),
            conversation_id: conversation.into(),
            harness: "strands".into(),
            epoch: 0,
            lease_generation: u64::try_from(generation).unwrap_or(1),
            created_at_ms: now_ms(),
        };
        self.store
            .ensure_binding(&record)
            .await
            .unwrap_or_else(|e| panic!("ensure_binding: {e}"));
        (created, record)
    }

    /// Writes the lease into the binding's status subresource, as the operator would.
    async fn lease(&self, name: &str, sandbox: &DynamicObject, generation: i64, lifecycle: &str) {
        let api: Api<HarnessBinding> = Api::namespaced(self.client.clone(), self.ns());
        let status = json!({"status": {"lifecycle": lifecycle, "lease": {
            "generation": generation, "sandboxName": sandbox.metadata.name, "sandboxUid": sandbox.metadata.uid
        }}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("status of {name}: {e}"));
    }

    fn http(&self, token: &str) -> Http {
        Http::new(&self.base, token)
    }
}

fn code(reply: &Reply) -> (u16, String) {
    (reply.status, reply.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_confined_to_the_binding_their_sandbox_holds() {
    let fx = Fixture::new("api-worker").await;
    fx.service_account("worker").await;
    let (sandbox, pod) = fx.sandbox("sb-one", "worker").await;
    let (binding_a, record_a) = fx
        .binding("conv-a", "user:alice", "conv-a", &sandbox, 1)
        .await;
    let (_, record_b) = fx
        .binding(
            "conv-b",
            "user:bob",
            "conv-b",
            &sandbox_placeholder(&fx).await,
            1,
        )
        .await;
    let a = record_a.binding_id.to_string();
    let b = record_b.binding_id.to_string();

    let token = fx.token("worker", "harness-engine", Some(&pod)).await;
    let worker = fx.http(&token);
    let me = send(worker.req(Method::GET, &format!("/v1/bindings/{a}"))).await;
    assert_eq!(me.status, 200, "{}", String::from_utf8_lossy(&me.body));
    assert_eq!(
        worker.turn(&a, (0, 1), b"worker state", 0, "run-1").await,
        1
    );

    // Binding B: another conversation's binding, named by id. Refused, and untouched.
    let other = worker.write_pending(&b, (0, 1), "sneaky", b"into b").await;
    assert_eq!(code(&other), (403, "forbidden_scope".into()));
    let read_other =
        send(worker.worker(Method::GET, &format!("/v1/bindings/{b}/state/head"), 0, 1)).await;
    assert_eq!(code(&read_other), (403, "forbidden_scope".into()));
    assert_eq!(
        admin_revision(&fx, &record_b, 1).await,
        0,
        "binding B changed nothing"
    );

    // The worker cannot widen its scope with headers.
    let ahead = worker.write_pending(&a, (0, 2), "ahead", b"x").await;
    assert_eq!(code(&ahead), (409, "stale_lease".into()));
    let other_epoch = worker.write_pending(&a, (1, 1), "epoch", b"x").await;
    assert_eq!(code(&other_epoch), (409, "stale_epoch".into()));
    assert_eq!(
        code(&worker.bind("agent-1", "conv-new", None).await),
        (403, "forbidden_scope".into()),
        "workers do not create bindings"
    );
    let resume = send(
        worker
            .req(Method::POST, &format!("/v1/bindings/{a}/interrupt/resume"))
            .header("Idempotency-Key", "r")
            .json(&json!({"interrupt_id": "i", "revision": 1, "decision": "approve"})),
    )
    .await;
    assert_eq!(
        code(&resume),
        (403, "forbidden_scope".into()),
        "a worker never answers its own interrupt"
    );

    // Forged, wrong-audience and expired tokens are refused and change nothing.
    let forged = forge(&token);
    assert_eq!(
        code(
            &fx.http(&forged)
                .write_pending(&a, (0, 1), "forged", b"forged")
                .await
        ),
        (401, "unauthenticated".into())
    );
    let wrong_audience = fx
        .token(
            "worker",
            "https://kubernetes.default.svc.cluster.local",
            Some(&pod),
        )
        .await;
    let r = fx
        .http(&wrong_audience)
        .write_pending(&a, (0, 1), "aud", b"aud")
        .await;
    assert_eq!(code(&r), (401, "unauthenticated".into()));
    let sa: ServiceAccount = Api::namespaced(fx.client.clone(), fx.ns())
        .get("worker")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let expired = self_signed_token(fx.ns(), &sa, &pod, -3600);
    let r = fx
        .http(&expired)
        .write_pending(&a, (0, 1), "expired", b"expired")
        .await;
    assert_eq!(
        code(&r),
        (401, "unauthenticated".into()),
        "an expired token"
    );
    let fresh = self_signed_token(fx.ns(), &sa, &pod, 600);
    assert_eq!(
        send(
            fx.http(&fresh)
                .req(Method::GET, &format!("/v1/bindings/{a}"))
        )
        .await
        .status,
        200,
        "the same token, unexpired, is accepted: expiry is what was refused"
    );
    assert_eq!(
        admin_revision(&fx, &record_a, 1).await,
        1,
        "no refused request changed binding A"
    );

    // The operator replaces the worker: lease generation 2 on a new Sandbox, fence raised.
    own_sandbox(&fx, "sb-one", &binding_a).await;
    let (sandbox_two, pod_two) = fx.sandbox("sb-two", "worker").await;
    fx.lease("conv-a", &sandbox_two, 2, "ready").await;
    fx.store
        .raise_fence(&record_a.binding_id, 0, 2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let new_worker = fx.http(&fx.token("worker", "harness-engine", Some(&pod_two)).await);
    assert_eq!(
        new_worker
            .turn(&a, (0, 2), b"new worker state", 1, "run-2")
            .await,
        2
    );

    // The old worker: with its cached identity the store's fence refuses it; with a fresh
    // token its sandbox maps to no current lease, and the binding still owns it.
    let cached = worker.write_pending(&a, (0, 1), "late-1", b"late").await;
    assert_eq!(code(&cached), (409, "stale_lease".into()));
    let renewed = fx.http(&fx.token("worker", "harness-engine", Some(&pod)).await);
    let late = renewed.write_pending(&a, (0, 1), "late-2", b"late").await;
    assert_eq!(code(&late), (409, "stale_lease".into()));
    let late_read = renewed.head(&a, (0, 2)).await;
    assert_eq!(
        code(&late_read),
        (409, "stale_lease".into()),
        "even claiming the new generation"
    );
    assert_eq!(
        admin_revision(&fx, &record_a, 2).await,
        2,
        "only the current worker's turn landed"
    );

    // While the lease is being replaced, nobody works on it.
    fx.lease("conv-a", &sandbox_two, 3, "replacing").await;
    let replacing = fx
        .http(&fx.token("worker", "harness-engine", Some(&pod_two)).await)
        .head(&a, (0, 3))
        .await;
    assert_eq!(code(&replacing), (409, "stale_lease".into()));
}

/// One MCP `tools/call` as a worker, with its fence headers; the tool's result.
async fn mcp_call(
    http: &Http,
    fence: Option<(u64, u64)>,
    tool: &str,
    arguments: serde_json::Value,
) -> (u16, serde_json::Value) {
    let mut request = http
        .req(Method::POST, "/mcp")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-06-18");
    if let Some((epoch, generation)) = fence {
        request = request
            .header("Harness-Epoch", epoch.to_string())
            .header("Harness-Lease-Generation", generation.to_string());
    }
    let reply = send(
        request.json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})),
    )
    .await;
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    (reply.status, body)
}

/// `/mcp` in operator mode: a sandbox worker authenticated by TokenReview reaches its own
/// workspace's ledger through the MCP tools, at its own fence only; another binding and
/// a stale generation are refused as on `/v1`, and an unauthenticated request never
/// reaches a tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_worker_uses_its_own_workspace_over_mcp() {
    let fx = Fixture::new("api-mcp").await;
    fx.service_account("worker").await;
    let (sandbox, pod) = fx.sandbox("sb-mcp", "worker").await;
    let (_, record_a) = fx
        .binding("conv-mcp-a", "user:alice", "conv-mcp-a", &sandbox, 1)
        .await;
    let (_, record_b) = fx
        .binding(
            "conv-mcp-b",
            "user:bob",
            "conv-mcp-b",
            &sandbox_placeholder(&fx).await,
            1,
        )
        .await;
    let (a, b) = (
        record_a.binding_id.to_string(),
        record_b.binding_id.to_string(),
    );
    let token = fx.token("worker", "harness-engine", Some(&pod)).await;
    let worker = fx.http(&token);

    let (status, begun) = mcp_call(
        &worker,
        Some((0, 1)),
        "begin_run",
        json!({"workspace_key": a, "idempotency_key": "run-1"}),
    )
    .await;
    let result = &begun["result"];
    assert_eq!(
        (status, result["isError"].as_bool()),
        (200, Some(false)),
        "{begun}"
    );
    let run_id = result["structuredContent"]["run_id"]
        .as_str()
        .unwrap_or_default();
    assert!(run_id.starts_with("run_"), "{begun}");

    let refused = |body: &serde_json::Value| {
        body["result"]["structuredContent"]["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (_, other) = mcp_call(
        &worker,
        Some((0, 1)),
        "begin_run",
        json!({"workspace_key": b, "idempotency_key": "run-b"}),
    )
    .await;
    assert_eq!(refused(&other), "forbidden_scope", "{other}");
    let (_, stale) = mcp_call(
        &worker,
        Some((0, 2)),
        "begin_run",
        json!({"workspace_key": a, "idempotency_key": "run-2"}),
    )
    .await;
    assert_eq!(refused(&stale), "stale_lease", "{stale}");
    let (_, read) = mcp_call(
        &worker,
        None,
        "get_run",
        json!({"workspace_key": a, "run_id": run_id}),
    )
    .await;
    assert_eq!(
        read["result"]["structuredContent"]["events"][0]["type"], "RunStarted",
        "{read}"
    );
    let (status, _) = mcp_call(&fx.http("not-a-token"), None, "get_run", json!({})).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_callers_are_authorized_by_rbac_and_impersonation() {
    let fx = Fixture::new("api-service").await;
    fx.service_account("backend").await;
    fx.service_account("nobody").await;
    let ns = fx.ns().to_owned();
    let roles: Api<Role> = Api::namespaced(fx.client.clone(), &ns);
    roles
        .create(&PostParams::default(), &from_json(json!({"metadata": {"name": "bindings"}, "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings"], "verbs": ["get", "create", "update"]}]})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let bindings: Api<RoleBinding> = Api::namespaced(fx.client.clone(), &ns);
    bindings
        .create(&PostParams::default(), &from_json(json!({"metadata": {"name": "backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"}, "subjects": [{"kind": "ServiceAccount", "name": "backend", "namespace": ns}]})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let _impersonation =
        common::Impersonation::create(&fx.client, &format!("{ns}-impersonate-alice"), &ns).await;

    let backend = fx.http(&fx.token("backend", "harness-engine", None).await);
    let created = backend
        .bind("agent-1", "conv-svc", Some("user:alice"))
        .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let id = created.json()["binding_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        id,
        keyring()
            .binding_id("user:alice", "agent-1", "conv-svc")
            .to_string(),
        "the binding belongs to the impersonated subject"
    );

    let mallory = backend
        .bind("agent-1", "conv-svc", Some("user:mallory"))
        .await;
    assert_eq!(
        code(&mallory),
        (403, "forbidden_scope".into()),
        "no impersonate permission for this subject"
    );
    let as_alice = send(
        backend
            .req(Method::GET, &format!("/v1/bindings/{id}"))
            .header("Harness-Subject", "user:alice"),
    )
    .await;
    assert_eq!(as_alice.status, 200);
    let as_itself = send(backend.req(Method::GET, &format!("/v1/bindings/{id}"))).await;
    assert_eq!(
        code(&as_itself),
        (404, "not_found".into()),
        "without naming the subject, the caller acts as itself and owns nothing here"
    );
    let own = backend.bind("agent-1", "conv-own", None).await;
    assert_eq!(own.status, 201, "a service may own bindings as itself");

    let nobody = fx.http(&fx.token("nobody", "harness-engine", None).await);
    let refused = nobody.bind("agent-1", "conv-nobody", None).await;
    assert_eq!(
        code(&refused),
        (403, "forbidden_scope".into()),
        "no RBAC on harnessbindings"
    );
    let unauthenticated = fx.http("not-a-token").bind("agent-1", "conv-x", None).await;
    assert_eq!(code(&unauthenticated), (401, "unauthenticated".into()));
    let wrong_audience = fx
        .http(
            &fx.token(
                "backend",
                "https://kubernetes.default.svc.cluster.local",
                None,
            )
            .await,
        )
        .bind("agent-1", "conv-y", Some("user:alice"))
        .await;
    assert_eq!(code(&wrong_audience), (401, "unauthenticated".into()));
}

/// The revision of a binding's head, read straight from the store.
async fn admin_revision(fx: &Fixture, record: &BindingRecord, generation: u64) -> u64 {
    let scope = harness_engine::domain::state::StateScope {
        binding_id: record.binding_id.clone(),
        environment: record.environment.clone(),
        harness: record.harness.clone(),
        epoch: 0,
        codec: "strands-session-v1".into(),
        lease_generation: generation,
    };
    fx.store
        .load_head(&scope)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .map_or(0, |h| h.revision)
}

/// A Sandbox with no pod of ours behind it, for a binding no worker of this test holds.
async fn sandbox_placeholder(fx: &Fixture) -> DynamicObject {
    fx.sandbox("sb-placeholder", "worker").await.0
}

/// Records the binding as the Sandbox's owner, as the operator's claims do.
async fn own_sandbox(fx: &Fixture, sandbox: &str, binding: &HarnessBinding) {
    let patch = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
        "name": binding.metadata.name, "uid": binding.metadata.uid
    }]}});
    fx.sandboxes()
        .patch(sandbox, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The same token with its signature altered.
fn forge(token: &str) -> String {
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    if let Some(sig) = parts.last_mut() {
        let flipped = if sig.starts_with('A') { 'B' } else { 'A' };
        sig.replace_range(0..1, &flipped.to_string());
    }
    parts.join(".")
}

/// A pod-bound ServiceAccount token signed with the control plane's own signing key
/// (`certs/sa.key` of the e2e run), with `exp` `expires_in` seconds from now: the only
/// way to hold a really expired token without waiting out the 10-minute minimum.
fn self_signed_token(ns: &str, sa: &ServiceAccount, pod: &Pod, expires_in: i64) -> String {
    let env_file = std::env::var("HARNESS_E2E_ENV").unwrap_or_else(|_| panic!("HARNESS_E2E_ENV"));
    let env = std::fs::read_to_string(&env_file).unwrap_or_default();
    let run = env
        .lines()
        .find_map(|l| l.strip_prefix("export HARNESS_E2E_RUN="))
        .unwrap_or_else(|| panic!("no HARNESS_E2E_RUN in {env_file}"));
    let key = std::path::Path::new(run.trim()).join("certs/sa.key");
    let now = now_ms() / 1000;
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let header = json!({"alg": "RS256", "typ": "JWT"});
    let claims = json!({
        "aud": ["harness-engine"],
        "exp": now + expires_in,
        "iat": now + expires_in - 600,
        "nbf": now + expires_in - 600,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": format!("system:serviceaccount:{ns}:{}", sa.metadata.name.clone().unwrap_or_default()),
        "kubernetes.io": {
            "namespace": ns,
            "serviceaccount": {"name": sa.metadata.name, "uid": sa.metadata.uid},
            "pod": {"name": pod.metadata.name, "uid": pod.metadata.uid}
        }
    });
    let signing_input = format!("{}.{}", b64(&header), b64(&claims));
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(&key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(signing_input.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(out.status.success(), "openssl failed to sign");
    format!(
        "{signing_input}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out.stdout)
    )
}
