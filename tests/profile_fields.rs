//! End-to-end: what each applied `SandboxProfile` field does to real objects, under the
//! local control plane (etcd, kube-apiserver, the real Agent Sandbox controller, kwok
//! running the pods) with the real `harness-engine operator` process. The refusals of
//! the fields that are not applied are in `tests/webhook_e2e.rs`; the lease rules'
//! every branch in `src/operator/binding/tests.rs`.
//!
//! - claim labels (`workloadClass`, `egressPolicyClass`, the profile name);
//! - `limits.maxActiveLeases`: a second binding waits (`MaxActiveLeasesReached`);
//! - `hibernation: release`: the idle claim is deleted, which frees the slot; a bind
//!   after it claims a new sandbox at a new generation;
//! - `runtimeClassName`: a template without it makes the profile not Ready;
//! - `busy` and `status.pendingInterrupt` follow the data plane; a worker cannot clear
//!   an uncertain run, a backend service acting for the user can, and `StateDurable`
//!   follows.

mod common;

use std::time::Duration;

use common::{
    eventually,
    operator::{Operator, OperatorOptions, apply_samples, drop_finalizers},
};
use harness_engine::{
    api::{HarnessBinding, Lifecycle, SandboxProfile, conditions, sandbox::SandboxClaim},
    domain::ids::Keyring,
    operator::binding::{
        BINDING_UID_LABEL, EGRESS_CLASS_LABEL, PROFILE_LABEL, RESUME_ANNOTATION,
        WORKLOAD_CLASS_LABEL,
    },
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

const FIRST: &str = "conversation-sample";
const SECOND: &str = "conversation-two";
const PROFILE: &str = "python-worker";

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

    fn operator(&self) -> Operator {
        Operator::start(OperatorOptions {
            namespace: self.ns(),
            data_dir: &self.dir.path().join("data"),
            leader_lease_seconds: None,
            extra: vec!["--state-projection-seconds".into(), "1".into()],
        })
    }

    fn bindings(&self) -> Api<HarnessBinding> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    fn profiles(&self) -> Api<SandboxProfile> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    async fn patch_profile(&self, spec: Value) {
        self.profiles()
            .patch(
                PROFILE,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch profile {spec}: {e}"));
    }

    async fn binding(&self, name: &str) -> HarnessBinding {
        self.bindings().get(name).await.expect("binding")
    }

    /// Waits until `name` says `f` of its status; returns the binding.
    async fn until(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&HarnessBinding) -> bool,
    ) -> HarnessBinding {
        eventually(Duration::from_secs(120), what, || async {
            let b = self.bindings().get_opt(name).await.ok()??;
            f(&b).then_some(b)
        })
        .await
    }

    /// Live (not deleting) claims `b` owns.
    async fn live_claims(&self, b: &HarnessBinding) -> Vec<SandboxClaim> {
        let uid = b.uid().unwrap_or_default();
        Api::<SandboxClaim>::namespaced(self.client.clone(), self.ns())
            .list(&ListParams::default().labels(&format!("{BINDING_UID_LABEL}={uid}")))
            .await
            .expect("claims")
            .items
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// A pod-bound token of the worker ServiceAccount for the binding's current pod.
    async fn worker_token(&self, b: &HarnessBinding) -> String {
        let pod_name = b
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .and_then(|l| l.worker_pod_name.clone())
            .expect("lease names its worker pod");
        let pod = Api::<Pod>::namespaced(self.client.clone(), self.ns())
            .get(&pod_name)
            .await
            .expect("worker pod");
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
        Api::<ServiceAccount>::namespaced(self.client.clone(), self.ns())
            .create_token_request("harness-worker", &PostParams::default(), &request)
            .await
            .expect("token request")
            .status
            .and_then(|s| s.token)
            .expect("token")
    }
}

fn lifecycle(b: &HarnessBinding) -> Option<Lifecycle> {
    b.status.as_ref().and_then(|s| s.lifecycle)
}

fn generation(b: &HarnessBinding) -> i64 {
    b.status
        .as_ref()
        .and_then(|s| s.lease.as_ref())
        .map_or(0, |l| l.generation)
}

fn condition(b: &HarnessBinding, type_: &str) -> Option<(String, String)> {
    let c = conditions::get(&b.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

fn ready(b: &HarnessBinding) -> bool {
    lifecycle(b) == Some(Lifecycle::Ready)
        && b.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_fields_shape_the_claims_the_leases_and_the_template_check() {
    let fx = Fixture::new("prof-fields").await;
    fx.patch_profile(json!({
        "workloadClass": "untrusted-code",
        "hibernation": "release",
        "limits": {"maxActiveLeases": 1},
    }))
    .await;
    let mut op = fx.operator();

    // The claim carries the profile's labels.
    let first = fx.until(FIRST, "first binding Ready", ready).await;
    let claims = fx.live_claims(&first).await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    let labels = claims[0].labels();
    assert_eq!(labels.get(PROFILE_LABEL).map(String::as_str), Some(PROFILE));
    assert_eq!(
        labels.get(WORKLOAD_CLASS_LABEL).map(String::as_str),
        Some("untrusted-code")
    );
    assert_eq!(
        labels.get(EGRESS_CLASS_LABEL).map(String::as_str),
        Some("data-plane-only")
    );

    // maxActiveLeases 1: a second conversation waits, with no claim.
    let mut second = fx.binding(FIRST).await;
    second.metadata = kube::api::ObjectMeta {
        name: Some(SECOND.into()),
        ..Default::default()
    };
    second.spec.conversation_id = "conv-0002".into();
    second.status = None;
    fx.bindings()
        .create(&PostParams::default(), &second)
        .await
        .expect("second binding");
    let waiting = fx
        .until(SECOND, "second binding waits for a lease", |b| {
            condition(b, "Ready").is_some_and(|(_, r)| r == "MaxActiveLeasesReached")
        })
        .await;
    assert!(
        fx.live_claims(&waiting).await.is_empty(),
        "no claim beyond the limit"
    );

    // hibernation: release. Idle past a short TTL: the first lease's claim is deleted,
    // which frees the slot for the second.
    fx.patch_profile(json!({"timeouts": {"idleTTL": "2s"}}))
        .await;
    let released = fx
        .until(FIRST, "first binding released on idle", |b| {
            lifecycle(b) == Some(Lifecycle::Hibernated)
        })
        .await;
    fx.patch_profile(json!({"timeouts": {"idleTTL": "30m"}}))
        .await;
    assert_eq!(
        condition(&released, "SandboxReady"),
        Some(("False".into(), "Released".into()))
    );
    eventually(
        Duration::from_secs(60),
        "the idle claim deleted",
        || async { fx.live_claims(&released).await.is_empty().then_some(()) },
    )
    .await;
    fx.until(SECOND, "second binding Ready in the freed slot", ready)
        .await;

    // A bind after the release needs a new claim: the slot is taken, so it waits; a
    // larger limit lets it through at a new generation on a new claim.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    fx.bindings()
        .patch(
            FIRST,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RESUME_ANNOTATION: now}}})),
        )
        .await
        .expect("resume");
    fx.until(FIRST, "the resumed binding waits for a slot", |b| {
        condition(b, "Ready").is_some_and(|(_, r)| r == "MaxActiveLeasesReached")
    })
    .await;
    fx.patch_profile(json!({"limits": {"maxActiveLeases": 2}}))
        .await;
    let resumed = fx
        .until(
            FIRST,
            "the resumed binding Ready at a new generation",
            |b| ready(b) && generation(b) > generation(&first),
        )
        .await;
    assert_eq!(
        condition(&resumed, "Replaced"),
        Some(("True".into(), "Resumed".into()))
    );
    let claims = fx.live_claims(&resumed).await;
    assert_eq!(claims.len(), 1);
    assert_ne!(
        claims[0].name_any(),
        first
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .and_then(|l| l.claim_name.clone())
            .unwrap_or_default(),
        "a new claim"
    );

    // runtimeClassName: the sample template names none, so a profile requiring one is
    // not Ready and says why; removing it makes it Ready again.
    fx.patch_profile(json!({"runtimeClassName": "gvisor"}))
        .await;
    let reason = eventually(Duration::from_secs(60), "profile not Ready", || async {
        let p = fx.profiles().get(PROFILE).await.ok()?;
        let c = conditions::get(&p.status?.conditions, "Ready")?.clone();
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(reason.reason, "RuntimeClassMismatch", "{reason:?}");
    assert!(reason.message.contains("requires \"gvisor\""), "{reason:?}");
    fx.patch_profile(json!({"runtimeClassName": null})).await;
    eventually(Duration::from_secs(60), "profile Ready again", || async {
        let p = fx.profiles().get(PROFILE).await.ok()?;
        conditions::is_true(&p.status?.conditions, "Ready").then_some(())
    })
    .await;
    op.stop();
    drop_finalizers(fx.ns());
}

/// One worker call with the binding's fence.
async fn worker_call(
    http: &reqwest::Client,
    op: &Operator,
    token: &str,
    b: &HarnessBinding,
    path: &str,
    key: &str,
    body: Value,
) -> (u16, Value) {
    let id = b
        .labels()
        .get(BINDING_ID_LABEL)
        .cloned()
        .unwrap_or_default();
    let resp = http
        .post(format!("{}/v1/bindings/{id}/{path}", op.api))
        .bearer_auth(token)
        .header("Harness-Epoch", "0")
        .header("Harness-Lease-Generation", generation(b).to_string())
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("data plane answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The sample binding re-created for alice, with a known identity key, so that a
/// backend service can act for her; the operator started on it.
async fn operator_for_alice(fx: &Fixture) -> Operator {
    // The sample re-created for alice, with a known identity key, so that a backend
    // service can act for her (the uncertain run's clear at the end).
    let key = b"profile-e2e-identity-key-0123456789abcdef".to_vec();
    let key_file = fx.dir.path().join("identity.key");
    std::fs::write(&key_file, &key).expect("key file");
    let keyring = Keyring::new(key, "e2e").expect("keyring");
    let sample = fx.binding(FIRST).await;
    fx.bindings()
        .delete(FIRST, &DeleteParams::default())
        .await
        .expect("delete the sample");
    eventually(Duration::from_secs(30), "sample gone", || async {
        fx.bindings()
            .get_opt(FIRST)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let mut spec = sample.spec.clone();
    spec.subject_ref = keyring.subject_ref("user:alice").as_str().to_owned();
    fx.bindings()
        .create(&PostParams::default(), &HarnessBinding::new(FIRST, spec))
        .await
        .expect("binding for alice");
    Operator::start(OperatorOptions {
        namespace: fx.ns(),
        data_dir: &fx.dir.path().join("data"),
        leader_lease_seconds: None,
        extra: vec![
            "--state-projection-seconds".into(),
            "1".into(),
            "--identity-key-file".into(),
            key_file.display().to_string(),
        ],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_the_pending_interrupt_follow_the_data_plane() {
    let fx = Fixture::new("prof-busy").await;
    let mut op = operator_for_alice(&fx).await;
    let http = reqwest::Client::new();
    let b = fx.until(FIRST, "binding Ready", ready).await;
    let token = fx.worker_token(&b).await;
    let event = |t: &str, payload: Value| {
        json!({"type": t, "run_id": "run-1", "turn_id": "t1", "agent_id": "research-assistant",
               "versions": {"model": "scripted-1"}, "payload": payload})
    };

    // A run starts: busy. It completes: ready.
    let (code, body) = worker_call(
        &http,
        &op,
        &token,
        &b,
        "runs/events",
        "e1",
        event("RunStarted", json!({})),
    )
    .await;
    assert_eq!(code, 201, "{body}\n{}", op.log_text());
    fx.until(FIRST, "busy while the run is in flight", |b| {
        lifecycle(b) == Some(Lifecycle::Busy)
    })
    .await;
    let (code, body) = worker_call(
        &http,
        &op,
        &token,
        &b,
        "runs/events",
        "e2",
        event("RunCompleted", json!({"outcome": "resolved"})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    fx.until(FIRST, "ready once the run completed", ready).await;

    // A commit that raises an interrupt: the status mirrors it (never its body).
    let id = b
        .labels()
        .get(BINDING_ID_LABEL)
        .cloned()
        .unwrap_or_default();
    let pending = http
        .post(format!("{}/v1/bindings/{id}/state/pending", op.api))
        .bearer_auth(&token)
        .header("Harness-Epoch", "0")
        .header("Harness-Lease-Generation", generation(&b).to_string())
        .header("Idempotency-Key", "p1")
        .header("Content-Type", "application/octet-stream")
        .body(b"waiting for approval".to_vec())
        .send()
        .await
        .expect("pending write");
    assert!(pending.status().is_success(), "{}", pending.status());
    let pending: Value = pending.json().await.unwrap_or(Value::Null);
    let state_id = pending["state_id"].as_str().unwrap_or_default().to_owned();
    let (code, body) = worker_call(&http, &op, &token, &b, "state/commit", "c2", json!({
        "state_id": state_id, "expected_revision": 0, "run_id": "run-2",
        "terminal": {"outcome": "interrupted"},
        "interrupt": {"interrupt_id": "int-1", "type": "tool_approval",
                      "allowed_decisions": ["approve", "reject"], "body": {"tool": "send_email"}}
    }))
    .await;
    assert_eq!(code, 200, "{body}");
    let waiting = fx
        .until(FIRST, "status.pendingInterrupt mirrored", |b| {
            b.status
                .as_ref()
                .and_then(|s| s.pending_interrupt.as_ref())
                .is_some_and(|i| i.interrupt_id == "int-1")
        })
        .await;
    let summary = waiting
        .status
        .and_then(|s| s.pending_interrupt)
        .expect("summary");
    assert_eq!((summary.run_id.as_str(), summary.revision), ("run-2", 1));

    // An uncertain run: StateDurable=False; the worker cannot clear it itself.
    let (code, body) = worker_call(
        &http,
        &op,
        &token,
        &b,
        "state/uncertain",
        "u1",
        json!({"run_id": "run-3", "reason": "commit_timeout"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    fx.until(FIRST, "StateDurable=False RunUncertain", |b| {
        condition(b, "StateDurable") == Some(("False".into(), "RunUncertain".into()))
    })
    .await;
    let (code, body) = worker_call(
        &http,
        &op,
        &token,
        &b,
        "state/uncertain/reconcile",
        "r1",
        json!({"run_id": "run-3"}),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("a control-plane service reconciles it")),
        "{body}"
    );

    // A backend service (RBAC on harnessbindings, impersonating alice) clears it: the
    // condition follows.
    let backend = backend_token(&fx).await;
    let _impersonation =
        common::Impersonation::create(&fx.client, &format!("{}-act-for-alice", fx.ns()), fx.ns())
            .await;
    let id = b
        .labels()
        .get(BINDING_ID_LABEL)
        .cloned()
        .unwrap_or_default();
    let resp = http
        .post(format!(
            "{}/v1/bindings/{id}/state/uncertain/reconcile",
            op.api
        ))
        .bearer_auth(&backend)
        .header("Harness-Subject", "user:alice")
        .header("Idempotency-Key", "reconcile-run-3")
        .json(&json!({"run_id": "run-3"}))
        .send()
        .await
        .expect("reconcile");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{body}\n{}", op.log_text());
    assert_eq!(body["uncertain_runs"], json!([]));
    fx.until(FIRST, "StateDurable=True after the clear", |b| {
        condition(b, "StateDurable").is_some_and(|(s, _)| s == "True")
    })
    .await;
    op.stop();
    drop_finalizers(fx.ns());
}

/// A token of a `backend` ServiceAccount that may get and update harnessbindings in the
/// namespace (the impersonation of alice is [`common::Impersonation`]).
async fn backend_token(fx: &Fixture) -> String {
    let ns = fx.ns().to_owned();
    let sas: Api<ServiceAccount> = Api::namespaced(fx.client.clone(), &ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "backend"}})).expect("sa"),
    )
    .await
    .expect("service account");
    Api::<Role>::namespaced(fx.client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "bindings"}, "rules": [{"apiGroups": ["harness-engine.dev"], "resources": ["harnessbindings"], "verbs": ["get", "update"]}]})).expect("role"))
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(fx.client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bindings"}, "subjects": [{"kind": "ServiceAccount", "name": "backend", "namespace": ns}]})).expect("role binding"))
        .await
        .expect("role binding");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec!["harness-engine".into()]),
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    sas.create_token_request("backend", &PostParams::default(), &request)
        .await
        .expect("token request")
        .status
        .and_then(|s| s.token)
        .expect("token")
}

/// `spec.ledger` of the profile, applied by the data plane of the installed operator:
/// a per-turn step budget trips with `budget_exceeded` (and a raised limit applies live);
/// a tool declared `defence: none` cannot be attempted without a person's approval, the
/// worker cannot approve it itself, a backend service relays the approval, and the one
/// attempt it admits consumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_budgets_and_tool_defences_come_from_the_profile() {
    let fx = Fixture::new("prof-ledger").await;
    fx.patch_profile(json!({"ledger": {
        "budgets": {"perTurn": {"steps": 4}},
        "tools": [{"name": "send_fax", "defence": "none"},
                  {"name": "issue_refund", "defence": "queryableByKey"}]
    }}))
    .await;
    let mut op = operator_for_alice(&fx).await;
    let http = reqwest::Client::new();
    let b = fx.until(FIRST, "binding Ready", ready).await;
    let token = fx.worker_token(&b).await;
    let event = |t: &str, turn: &str, payload: Value| {
        json!({"type": t, "run_id": "run-1", "turn_id": turn, "agent_id": "research-assistant",
               "versions": {"model": "scripted-1"}, "payload": payload})
    };
    let fax = json!({"tool": "send_fax", "idempotency_key": "fax-1", "args": {"to": "+1 555"},
                     "irreversible": true});
    let append = |key: &'static str, body: Value| {
        let (http, op, token, b) = (&http, &op, &token, &b);
        async move { worker_call(http, op, token, b, "runs/events", key, body).await }
    };

    let (code, body) = append("e1", event("RunStarted", "t1", json!({}))).await;
    assert_eq!(code, 201, "{body}\n{}", op.log_text());
    // The gated tool: refused until approved, nothing appended.
    let (code, body) = append("e2", event("EffectAttempted", "t1", fax.clone())).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("approval_required")),
        "{body}"
    );
    assert_eq!(body["details"]["tool"], "send_fax", "{body}");
    // A tool with a defence is not gated.
    let refund = json!({"tool": "issue_refund", "idempotency_key": "refund-1",
                        "args": {"order": "A-1"}, "irreversible": true});
    let (code, body) = append("e3", event("EffectAttempted", "t1", refund)).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = append(
        "e4",
        event(
            "HumanReviewRequested",
            "t1",
            json!({"idempotency_key": "fax-1",
              "reason": "send_fax has no defence against a repeat", "approval": true,
              "tool": "send_fax"}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // The worker cannot approve its own request.
    let (code, body) = append(
        "e5",
        event(
            "HumanReviewResolved",
            "t1",
            json!({"idempotency_key": "fax-1", "decision": "approved"}),
        ),
    )
    .await;
    assert_eq!(
        (code, body["code"].as_str()),
        (403, Some("forbidden_scope")),
        "{body}"
    );

    // A backend service acting for alice relays the person's approval.
    let backend = backend_token(&fx).await;
    let _impersonation =
        common::Impersonation::create(&fx.client, &format!("{}-act-for-alice", fx.ns()), fx.ns())
            .await;
    let id = b
        .labels()
        .get(BINDING_ID_LABEL)
        .cloned()
        .unwrap_or_default();
    let resp = http
        .post(format!("{}/v1/bindings/{id}/runs/events", op.api))
        .bearer_auth(&backend)
        .header("Harness-Subject", "user:alice")
        .header("Harness-Epoch", "0")
        .header("Harness-Lease-Generation", generation(&b).to_string())
        .header("Idempotency-Key", "approve-fax-1")
        .json(&event(
            "HumanReviewResolved",
            "t2",
            json!({"idempotency_key": "fax-1", "decision": "approved"}),
        ))
        .send()
        .await
        .expect("approval");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 201, "{body}\n{}", op.log_text());
    assert_eq!(body["effect"]["status"], "approved", "{body}");

    // Approved: one attempt goes ahead (in turn t2: t1 has used 3 of its 4 steps).
    let (code, body) = append("e6", event("EffectAttempted", "t2", fax.clone())).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["effect"]["status"], "attempted", "{body}");

    // The per-turn step budget of the profile: t1 has 3 events; the 4th fits, the 5th
    // trips.
    let (code, body) = append(
        "e7",
        event(
            "GuardrailEvaluated",
            "t1",
            json!({"guardrail": "pii", "result": "pass"}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = append(
        "e8",
        event(
            "GuardrailEvaluated",
            "t1",
            json!({"guardrail": "pii", "result": "pass"}),
        ),
    )
    .await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("budget_exceeded")),
        "{body}"
    );
    assert_eq!(body["details"]["limit"], 4, "{body}");
    assert_eq!(body["details"]["what"], "per-turn steps", "{body}");

    // A raised limit applies without a restart, once the replica's watch sees it.
    fx.patch_profile(json!({"ledger": {"budgets": {"perTurn": {"steps": 10}}}}))
        .await;
    eventually(
        Duration::from_secs(30),
        "the raised budget applies",
        || async {
            let (code, _) = append(
                "e8",
                event(
                    "GuardrailEvaluated",
                    "t1",
                    json!({"guardrail": "pii", "result": "pass"}),
                ),
            )
            .await;
            (code == 201).then_some(())
        },
    )
    .await;
    op.stop();
    drop_finalizers(fx.ns());
}
