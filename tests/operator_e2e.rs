//! End-to-end: the real `harness-engine operator` process against the local control plane
//! (etcd, kube-apiserver, kube-controller-manager, the real Agent Sandbox controller, kwok
//! running the pods), with the samples from `config/samples` applied as a user would.
//!
//! Nothing is mocked: claims, sandboxes and pods are made by Agent Sandbox and kwok, the
//! data-plane calls go over HTTP with TokenRequest-issued pod-bound tokens, and the
//! operator is killed with SIGKILL where the test says so.

mod common;

use std::time::Duration;

use common::{
    eventually, kubectl,
    operator::{Operator, OperatorOptions, apply_samples, drop_finalizers},
};
use harness_engine::{
    api::{
        HarnessBinding, Lifecycle, SandboxProfile, conditions,
        sandbox::{Sandbox, SandboxClaim},
    },
    domain::ids::Keyring,
    operator::binding::{BINDING_UID_LABEL, RESUME_ANNOTATION},
    server::auth::kubernetes::BINDING_ID_LABEL,
};
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const BINDING: &str = "conversation-sample";

struct Fixture {
    client: Client,
    ns: common::TestNamespace,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(prefix: &str) -> Fixture {
        let client = common::client().await;
        common::install_our_crds(&client).await;
        let ns = common::TestNamespace::new(&client, prefix).await;
        apply_samples(&ns.name);
        Fixture {
            client,
            ns,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn ns(&self) -> &str {
        &self.ns.name
    }

    fn operator(&self, leader_lease_seconds: Option<u64>) -> Operator {
        Operator::start(OperatorOptions {
            namespace: self.ns(),
            data_dir: &self.dir.path().join("data"),
            leader_lease_seconds,
            extra: vec!["--state-projection-seconds".into(), "1".into()],
        })
    }

    fn bindings(&self) -> Api<HarnessBinding> {
        Api::namespaced(self.client.clone(), self.ns())
    }
    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.client.clone(), self.ns())
    }
    fn sandboxes(&self) -> Api<Sandbox> {
        Api::namespaced(self.client.clone(), self.ns())
    }
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    async fn binding(&self) -> HarnessBinding {
        self.bindings().get(BINDING).await.expect("binding")
    }

    /// Waits until the binding is Ready at a generation above `above`; returns it.
    async fn ready_above(&self, above: i64, what: &str) -> HarnessBinding {
        eventually(Duration::from_secs(120), what, || async {
            let b = self.bindings().get_opt(BINDING).await.ok()??;
            let status = b.status.clone()?;
            let generation = status.lease.as_ref()?.generation;
            (status.lifecycle == Some(Lifecycle::Ready)
                && generation > above
                && conditions::is_true(&status.conditions, "Ready"))
            .then_some(b)
        })
        .await
    }

    /// Live (not deleting) claims this binding owns.
    async fn live_claims(&self, b: &HarnessBinding) -> Vec<String> {
        let uid = b.uid().unwrap_or_default();
        self.claims()
            .list(&ListParams::default().labels(&format!("{BINDING_UID_LABEL}={uid}")))
            .await
            .expect("claims")
            .items
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.name_any())
            .collect()
    }

    /// A pod-bound token of the worker ServiceAccount, audience harness-engine: what
    /// the sandbox's projected token volume holds.
    async fn worker_token(&self, pod: &Pod) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), self.ns());
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec!["harness-engine".into()]),
                expiration_seconds: Some(600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        api.create_token_request("harness-worker", &PostParams::default(), &request)
            .await
            .expect("token request")
            .status
            .and_then(|s| s.token)
            .expect("token")
    }

    async fn current_worker(&self) -> (HarnessBinding, Pod, String) {
        let b = self.binding().await;
        let pod_name = b
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .and_then(|l| l.worker_pod_name.clone())
            .expect("lease names its worker pod");
        let pod = self.pods().get(&pod_name).await.expect("worker pod");
        let token = self.worker_token(&pod).await;
        (b, pod, token)
    }

    fn describe(&self) -> String {
        let (ok, out, err) = kubectl(&["describe", "harnessbinding", BINDING, "-n", self.ns()]);
        assert!(ok, "kubectl describe: {err}");
        out
    }

    /// Shortens the profile's idle TTL until the binding is hibernated, then restores
    /// it; returns the hibernated binding.
    async fn hibernate(&self) -> HarnessBinding {
        let profiles: Api<SandboxProfile> = Api::namespaced(self.client.clone(), self.ns());
        let idle_ttl = |ttl: &str| json!({"spec": {"timeouts": {"idleTTL": ttl}}});
        profiles
            .patch(
                "python-worker",
                &PatchParams::default(),
                &Patch::Merge(idle_ttl("2s")),
            )
            .await
            .expect("short idle TTL");
        let hibernated = eventually(Duration::from_secs(90), "hibernated", || async {
            let b = self.binding().await;
            (b.status.as_ref()?.lifecycle == Some(Lifecycle::Hibernated)).then_some(b)
        })
        .await;
        profiles
            .patch(
                "python-worker",
                &PatchParams::default(),
                &Patch::Merge(idle_ttl("30m")),
            )
            .await
            .expect("idle TTL back");
        hibernated
    }

    /// `kubectl describe` once it mentions every needle (events are published off the
    /// reconcile path, so the last one may trail the status by a moment), or after 15 s.
    async fn describe_with(&self, needles: &[&str]) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let text = self.describe();
            if needles.iter().all(|n| text.contains(n)) || std::time::Instant::now() > deadline {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One data-plane call with a worker's token and fence.
#[allow(clippy::too_many_arguments)]
async fn call(
    http: &reqwest::Client,
    op: &Operator,
    token: &str,
    (epoch, generation): (i64, i64),
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<reqwest::Body>,
    json_body: Option<Value>,
) -> (u16, Value) {
    let mut req = http
        .request(method, format!("{}{path}", op.api))
        .bearer_auth(token)
        .header("Harness-Epoch", epoch.to_string())
        .header("Harness-Lease-Generation", generation.to_string());
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    if let Some(b) = body {
        req = req
            .header("Content-Type", "application/octet-stream")
            .body(b);
    }
    if let Some(j) = json_body {
        req = req.json(&j);
    }
    let resp = req.send().await.expect("data plane answers");
    let status = resp.status().as_u16();
    let value = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_is_leased_replaced_cleared_hibernated_resumed_and_released() {
    let fx = Fixture::new("op-life").await;
    let mut op = fx.operator(None);
    let http = reqwest::Client::new();

    // Samples applied: the binding becomes Ready at lease generation 1, and
    // `kubectl wait` sees it.
    let target = format!("harnessbinding/{BINDING}");
    let (ok, out, err) = kubectl(&[
        "wait",
        "--for=condition=Ready",
        &target,
        "-n",
        fx.ns(),
        "--timeout=120s",
    ]);
    assert!(ok, "kubectl wait: {out}{err}\n{}", op.log_text());
    let b = fx.binding().await;
    let status = b.status.clone().expect("status");
    let lease = status.lease.clone().expect("lease");
    assert_eq!(lease.generation, 1);
    assert_eq!(status.lifecycle, Some(Lifecycle::Ready));
    assert_eq!(lease.epoch, Some(0));
    assert!(
        lease
            .worker_image_digest
            .as_deref()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{lease:?}"
    );
    assert_eq!(lease.protocol_version, Some(1));
    let binding_id = b
        .labels()
        .get(BINDING_ID_LABEL)
        .cloned()
        .expect("binding-id label");
    assert_eq!(
        fx.live_claims(&b).await,
        vec![lease.claim_name.clone().unwrap()]
    );
    let claim = fx
        .claims()
        .get(lease.claim_name.as_deref().unwrap())
        .await
        .expect("claim");
    let owner = &claim.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(owner.kind, "HarnessBinding");
    assert_eq!(Some(&owner.uid), b.metadata.uid.as_ref());
    assert!(claim.name_any().ends_with("-g1"), "{}", claim.name_any());

    // The sandbox's pod is deleted: the binding is replaced at generation 2.
    let old_pod = lease.worker_pod_name.clone().expect("pod");
    fx.pods()
        .delete(&old_pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    let b2 = fx.ready_above(1, "the binding Ready at generation 2").await;
    let lease2 = b2.status.clone().unwrap().lease.unwrap();
    assert_eq!(lease2.generation, 2);
    assert_ne!(lease2.worker_pod_uid, lease.worker_pod_uid);
    let live = eventually(Duration::from_secs(30), "one live claim", || async {
        let live = fx.live_claims(&b2).await;
        (live.len() == 1).then_some(live)
    })
    .await;
    assert_eq!(live, vec![lease2.claim_name.clone().unwrap()]);

    // The fence: generation 1 refused, generation 2 accepted.
    let (_, _, token) = fx.current_worker().await;
    let base = format!("/v1/bindings/{binding_id}/state");
    let (code, body) = call(
        &http,
        &op,
        &token,
        (0, 2),
        reqwest::Method::POST,
        &format!("{base}/pending"),
        Some("turn-1-state"),
        Some(reqwest::Body::from(b"checkpoint after turn 1".to_vec())),
        None,
    )
    .await;
    assert!(code == 200 || code == 201, "pending write: {code} {body}");
    let state_id = body["state_id"].as_str().expect("state_id").to_owned();
    let commit = json!({"state_id": state_id, "expected_revision": 0, "run_id": "run-1",
        "terminal": {"outcome": "completed", "metadata": {}}});
    let (code, body) = call(
        &http,
        &op,
        &token,
        (0, 1),
        reqwest::Method::POST,
        &format!("{base}/commit"),
        Some("turn-1-commit-stale"),
        None,
        Some(commit.clone()),
    )
    .await;
    assert_eq!(code, 409, "a commit carrying generation 1: {body}");
    assert_eq!(body["code"], "stale_lease", "{body}");
    let (code, body) = call(
        &http,
        &op,
        &token,
        (0, 2),
        reqwest::Method::POST,
        &format!("{base}/commit"),
        Some("turn-1-commit"),
        None,
        Some(commit),
    )
    .await;
    assert_eq!(code, 200, "a commit carrying generation 2: {body}");

    // The durable head is projected into status.state.
    let mut projected = false;
    for _ in 0..150 {
        let b = fx.binding().await;
        if b.status
            .and_then(|s| s.state)
            .is_some_and(|s| s.durable_revision == 1)
        {
            projected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        projected,
        "status.state never reached revision 1; operator log:\n{}",
        op.log_text()
    );

    // `kubectl describe` tells the whole story.
    let needles = [
        "LeaseStarted",
        "WorkerPodLost",
        "Replacing",
        "lease generation 1 -> 2",
        &format!("worker pod {old_pod}"),
        "ClaimReleased",
        "LeaseReady",
        "lease generation 2 bound to Sandbox",
        "Replaced",
        "worker verified and bound at lease generation 2",
        "durable head at revision 1",
    ];
    let text = fx.describe_with(&needles).await;
    for needle in needles {
        assert!(text.contains(needle), "describe lacks {needle:?}:\n{text}");
    }

    // Epoch clear: a fresh lease for epoch 1, the old epoch's head gone.
    fx.bindings()
        .patch(
            BINDING,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"epoch": 1}})),
        )
        .await
        .expect("raise epoch");
    let b3 = eventually(Duration::from_secs(120), "Ready in epoch 1", || async {
        let b = fx.binding().await;
        let s = b.status.clone()?;
        let l = s.lease.as_ref()?;
        (l.epoch == Some(1) && s.lifecycle == Some(Lifecycle::Ready)).then_some(b)
    })
    .await;
    let g3 = b3.status.clone().unwrap().lease.unwrap().generation;
    assert!(g3 > 2, "a clear starts a new lease generation, got {g3}");
    let (_, _, token) = fx.current_worker().await;
    let (code, body) = call(
        &http,
        &op,
        &token,
        (1, g3),
        reqwest::Method::GET,
        &format!("{base}/head"),
        None,
        None,
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body["head"].is_null(), "the new epoch starts empty: {body}");
    assert!(
        fx.describe_with(&["ConversationCleared"])
            .await
            .contains("ConversationCleared")
    );

    // Idle TTL hibernates (Sandbox suspended); a bind request resumes.
    let hibernated = fx.hibernate().await;
    let sb_name = hibernated
        .status
        .clone()
        .unwrap()
        .lease
        .unwrap()
        .sandbox_name
        .unwrap();
    let sb = fx.sandboxes().get(&sb_name).await.expect("sandbox");
    assert_eq!(sb.spec.operating_mode.as_deref(), Some("Suspended"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    fx.bindings()
        .patch(
            BINDING,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RESUME_ANNOTATION: now}}})),
        )
        .await
        .expect("resume request");
    let resumed = fx.ready_above(g3, "resumed at a new generation").await;
    let lease4 = resumed.status.clone().unwrap().lease.unwrap();
    assert_eq!(lease4.sandbox_name.as_deref(), Some(sb_name.as_str()));
    let sb = fx.sandboxes().get(&sb_name).await.expect("sandbox");
    assert_eq!(sb.spec.operating_mode.as_deref(), Some("Running"));
    let text = fx.describe_with(&["Hibernated", "Resuming"]).await;
    assert!(
        text.contains("Hibernated") && text.contains("Resuming"),
        "{text}"
    );

    // Delete: the claim is released, the sandbox goes with it, nothing is orphaned.
    fx.bindings()
        .delete(BINDING, &DeleteParams::default())
        .await
        .expect("delete binding");
    eventually(Duration::from_secs(60), "binding gone", || async {
        fx.bindings()
            .get_opt(BINDING)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    eventually(Duration::from_secs(60), "no claims left", || async {
        fx.claims()
            .list(&ListParams::default().labels(BINDING_UID_LABEL))
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(60),
        "the leased sandbox gone",
        || async {
            fx.sandboxes()
                .get_opt(&sb_name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    op.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_during_a_replacement_converges_with_one_live_claim() {
    let fx = Fixture::new("op-kill").await;
    let mut first = fx.operator(Some(3));
    let b1 = fx.ready_above(0, "Ready at generation 1").await;
    let uid = b1.uid().unwrap();

    // Watch every claim event and every binding status; remember the worst we saw.
    let watch = common::lease_watch::LeaseWatch::start(fx.claims(), fx.bindings(), &uid, BINDING);

    // Delete the worker pod and kill the operator as soon as the replacement started.
    let pod = b1.status.unwrap().lease.unwrap().worker_pod_name.unwrap();
    fx.pods()
        .delete(&pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    let mut polls = 0;
    loop {
        let b = fx.binding().await;
        let s = b.status.unwrap_or_default();
        if s.lease.as_ref().map(|l| l.generation).unwrap_or(0) >= 2 {
            assert_ne!(
                s.lifecycle,
                Some(Lifecycle::Ready),
                "the replacement finished before the kill; the test would prove nothing"
            );
            break;
        }
        polls += 1;
        assert!(polls < 3000, "no replacement started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill();

    // A new process (a new identity) takes the leader lease after it expires and
    // finishes the replacement.
    let second = fx.operator(Some(3));
    let b2 = fx.ready_above(1, "Ready after the restart").await;
    let final_generation = b2.status.clone().unwrap().lease.unwrap().generation;
    assert!(final_generation >= 2);
    assert!(
        second.log_text().contains("leading:"),
        "{}",
        second.log_text()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (max_live, seen) = watch.finish();
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the lease generation went backwards: {seen:?}"
    );
    assert!(
        max_live <= 1,
        "two live claims for one binding were observed"
    );
    assert_eq!(fx.live_claims(&b2).await.len(), 1);

    // The store fence matches the lease: the current generation is accepted, the one
    // before refused.
    let (_, _, token) = fx.current_worker().await;
    let binding_id = b2.labels().get(BINDING_ID_LABEL).cloned().unwrap();
    let http = reqwest::Client::new();
    let path = format!("/v1/bindings/{binding_id}/state/head");
    let (code, body) = call(
        &http,
        &second,
        &token,
        (0, final_generation),
        reqwest::Method::GET,
        &path,
        None,
        None,
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(
        &http,
        &second,
        &token,
        (0, final_generation - 1),
        reqwest::Method::POST,
        &format!("/v1/bindings/{binding_id}/state/pending"),
        Some("late"),
        Some(reqwest::Body::from(b"late write".to_vec())),
        None,
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["code"], "stale_lease");

    let mut second = second;
    second.stop();
    drop_finalizers(fx.ns());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_whose_pool_runs_an_unlisted_image_is_not_ready_and_says_why() {
    let fx = Fixture::new("op-prof").await;
    let profiles: Api<SandboxProfile> = Api::namespaced(fx.client.clone(), fx.ns());
    // Only another digest is allowed: the template's image is not.
    profiles
        .patch(
            "python-worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedWorkerImageDigests": [
                "sha256:0000000000000000000000000000000000000000000000000000000000000000"
            ]}})),
        )
        .await
        .expect("patch profile");
    let mut op = fx.operator(None);
    let cond = eventually(Duration::from_secs(60), "profile not Ready", || async {
        let p = profiles.get("python-worker").await.ok()?;
        let c = conditions::get(&p.status?.conditions, "Ready")?.clone();
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(cond.reason, "ImageNotAllowed", "{cond:?}");
    assert!(
        cond.message.contains("not in allowedWorkerImageDigests"),
        "{cond:?}"
    );
    let b = eventually(Duration::from_secs(60), "binding refused", || async {
        let b = fx.binding().await;
        let c = conditions::get(&b.status.clone()?.conditions, "ProfileAccepted")?.clone();
        (c.status == "False").then_some(b)
    })
    .await;
    assert!(
        b.status.unwrap().lease.is_none(),
        "no claim without an accepted profile"
    );
    assert!(fx.live_claims(&fx.binding().await).await.is_empty());

    // Fixing the profile lets the binding through, without touching the binding.
    profiles
        .patch(
            "python-worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedWorkerImageDigests": [
                "sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e"
            ]}})),
        )
        .await
        .expect("fix profile");
    fx.ready_above(0, "Ready once the profile is fixed").await;
    op.stop();
    drop_finalizers(fx.ns());
}

/// The data plane's bind is what resumes a hibernated conversation: a service binding
/// for its end user (RBAC on harnessbindings, impersonation of the user) asks, the
/// operator resumes the Sandbox at a new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_through_the_data_plane_resumes_a_hibernated_binding() {
    let fx = Fixture::new("op-resume").await;
    // A known identity key, so that the test can name the end user the binding is for.
    let key = b"operator-e2e-identity-key-0123456789abcdef".to_vec();
    let key_file = fx.dir.path().join("identity.key");
    std::fs::write(&key_file, &key).expect("key file");
    let keyring = Keyring::new(key, "e2e").expect("keyring");
    let subject = "user:alice";
    // The sample, re-created for alice (the owner of a binding never changes).
    let sample = fx.binding().await;
    fx.bindings()
        .delete(BINDING, &DeleteParams::default())
        .await
        .expect("delete the sample");
    eventually(Duration::from_secs(30), "sample gone", || async {
        fx.bindings()
            .get_opt(BINDING)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let mut spec = sample.spec.clone();
    spec.subject_ref = keyring.subject_ref(subject).as_str().to_owned();
    fx.bindings()
        .create(&PostParams::default(), &HarnessBinding::new(BINDING, spec))
        .await
        .expect("binding for alice");
    let mut op = Operator::start(OperatorOptions {
        namespace: fx.ns(),
        data_dir: &fx.dir.path().join("data"),
        leader_lease_seconds: None,
        extra: vec![
            "--state-projection-seconds".into(),
            "1".into(),
            "--identity-key-file".into(),
            key_file.display().to_string(),
        ],
    });
    let first = fx.ready_above(0, "first lease").await;
    let spec = first.spec.clone();

    // The backend service: may use bindings in this namespace and act for alice.
    let ns = fx.ns().to_owned();
    let sas: Api<ServiceAccount> = Api::namespaced(fx.client.clone(), &ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "backend"}})).expect("sa"),
    )
    .await
    .expect("service account");
    let roles: Api<Role> = Api::namespaced(fx.client.clone(), &ns);
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bindings"}, "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings"], "verbs": ["get", "create", "update"]}]})).expect("role"))
        .await
        .expect("role");
    let role_bindings: Api<RoleBinding> = Api::namespaced(fx.client.clone(), &ns);
    role_bindings
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"}, "subjects": [{"kind": "ServiceAccount", "name": "backend", "namespace": ns}]})).expect("role binding"))
        .await
        .expect("role binding");
    let _impersonation =
        common::Impersonation::create(&fx.client, &format!("{ns}-act-for-alice"), &ns).await;

    // Idle: hibernated.
    let hibernated = fx.hibernate().await;
    let asleep = hibernated
        .status
        .clone()
        .and_then(|s| s.lease)
        .expect("lease");
    let sb_name = asleep.sandbox_name.clone().expect("sandbox");
    assert!(
        fx.binding()
            .await
            .annotations()
            .get(RESUME_ANNOTATION)
            .is_none(),
        "nothing asked for a resume yet"
    );
    // The resume request must be later than the hibernation (RFC 3339 seconds).
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // The backend binds the conversation again, for alice: 200 (it exists), same id.
    let api: Api<ServiceAccount> = Api::namespaced(fx.client.clone(), &ns);
    let token = api
        .create_token_request(
            "backend",
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
        .expect("token");
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/bindings", op.api))
        .bearer_auth(&token)
        .header("Harness-Subject", subject)
        .header("Idempotency-Key", "resume-by-bind-1")
        .json(&json!({
            "agent_id": spec.agent_id,
            "conversation_id": spec.conversation_id,
            "harness": spec.harness.id.as_str(),
        }))
        .send()
        .await
        .expect("bind");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "the conversation exists: {body}");
    assert_eq!(
        body["binding_id"].as_str(),
        Some(
            keyring
                .binding_id(subject, &spec.agent_id, &spec.conversation_id)
                .as_str()
        ),
        "{body}"
    );

    // The bind asked for a resume; the operator resumed the same Sandbox at a new
    // generation, and a new worker is bound.
    let resumed = fx
        .ready_above(asleep.generation, "resumed after the bind")
        .await;
    assert!(
        resumed.annotations().get(RESUME_ANNOTATION).is_some(),
        "the bind set the resume request"
    );
    let lease = resumed.status.clone().and_then(|s| s.lease).expect("lease");
    assert_eq!(lease.sandbox_name.as_deref(), Some(sb_name.as_str()));
    let sb = fx.sandboxes().get(&sb_name).await.expect("sandbox");
    assert_eq!(sb.spec.operating_mode.as_deref(), Some("Running"));
    let text = fx.describe_with(&["Hibernated", "Resuming"]).await;
    assert!(text.contains("Resuming"), "{text}");

    op.stop();
    drop_finalizers(fx.ns());
}
