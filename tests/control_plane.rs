//! First tests against the real local control plane (`e2e/`): our CRDs install and serve,
//! their CEL rules refuse bad objects with readable messages, `kubectl` shows what a
//! platform engineer scans for, the Agent Sandbox controller and kwok make a warm pool and
//! a claim Ready, and FerretDB speaks the MongoDB protocol to the mongodb crate.

mod common;

use std::time::Duration;

use common::{TestNamespace, client, control_plane, eventually, install_our_crds, kubectl};
use harness_engine::api::{
    HarnessBinding, HarnessBindingStatus, Lease, Lifecycle, MemoryPolicy,
    conditions::{self, Desired},
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery::ApiResource,
};
use serde_json::json;

const SUBJECT: &str =
    "hmac-sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn binding(name: &str) -> HarnessBinding {
    serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1",
        "kind": "HarnessBinding",
        "metadata": {"name": name},
        "spec": {
            "agentId": "agent-example",
            "conversationId": "conversation-1",
            "subjectRef": SUBJECT,
            "harness": {"id": "strands", "options": {"model_provider_mode": "configured"}},
            "sandboxProfileRef": {"name": "strands-standard"}
        }
    }))
    .expect("valid binding")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_create_read_and_status_patch() {
    let client = client().await;
    install_our_crds(&client).await;
    let ns = TestNamespace::new(&client, "hb-status").await;
    let api: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);

    let created = api
        .create(&PostParams::default(), &binding("conv-1"))
        .await
        .expect("create");
    assert_eq!(created.spec.epoch, 0, "epoch defaults to 0");
    assert_eq!(
        created.spec.harness.contract_version, 1,
        "contractVersion defaults to 1"
    );

    // The operator writes status through the status subresource with server-side apply.
    let now = Time(Timestamp::now());
    let mut status = HarnessBindingStatus {
        lifecycle: Some(Lifecycle::Ready),
        lease: Some(Lease {
            generation: 1,
            claim_name: Some("hb-abc-1".into()),
            ..Lease::default()
        }),
        observed_generation: created.metadata.generation,
        ..HarnessBindingStatus::default()
    };
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: "Ready",
            status: conditions::TRUE,
            reason: "LeaseReady",
            message: "worker verified at lease generation 1".into(),
        },
        created.metadata.generation,
        &now,
    );
    let patch = json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding", "status": status});
    api.patch_status(
        "conv-1",
        &PatchParams::apply("harness-engine-tests").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("status apply");

    let read = api.get("conv-1").await.expect("get");
    let read_status = read.status.expect("status persisted");
    assert_eq!(read_status.lease.map(|l| l.generation), Some(1));
    assert_eq!(read_status.lifecycle, Some(Lifecycle::Ready));
    assert!(conditions::is_true(&read_status.conditions, "Ready"));
    assert_eq!(read.spec, created.spec, "a status write leaves spec alone");

    // What a platform engineer sees.
    let (ok, out, err) = kubectl(&["get", "harnessbindings", "-n", &ns.name]);
    assert!(ok, "kubectl get failed: {err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "READY", "LIFECYCLE", "LEASE", "EPOCH", "AGE"],
        "columns: {out}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..5],
        ["conv-1", "True", "ready", "1", "0"],
        "row: {out}"
    );

    let (ok, out, _) = kubectl(&["get", "hb", "-n", &ns.name, "-o", "name"]);
    assert!(
        ok && out.trim() == "harnessbinding.harness-engine.dev/conv-1",
        "short name hb works: {out}"
    );
    let (ok, out, _) = kubectl(&["get", "harness-engine", "-n", &ns.name, "-o", "name"]);
    assert!(
        ok && out.contains("harnessbinding.harness-engine.dev/conv-1"),
        "category lists bindings: {out}"
    );

    let (ok, out, err) = kubectl(&["explain", "harnessbinding.spec"]);
    assert!(ok, "{err}");
    for needle in [
        "keyed digest",
        "Raise it by exactly one to clear",
        "sandboxProfileRef",
        "Registered harness id",
    ] {
        assert!(
            out.contains(needle) || explain_field_contains("harnessbinding.spec.harness", needle),
            "kubectl explain harnessbinding.spec lacks {needle:?}:\n{out}"
        );
    }
    let (ok, out, err) = kubectl(&["explain", "harnessbinding.status.lease"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("fencing token"),
        "kubectl explain harnessbinding.status.lease:\n{out}"
    );

    let (ok, _, err) = kubectl(&[
        "wait",
        "--for=condition=Ready",
        "-n",
        &ns.name,
        "harnessbinding/conv-1",
        "--timeout=10s",
    ]);
    assert!(
        ok,
        "kubectl wait --for=condition=Ready works on the status we wrote: {err}"
    );
}

fn explain_field_contains(path: &str, needle: &str) -> bool {
    let (ok, out, _) = kubectl(&["explain", path]);
    ok && out.contains(needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_refuse_bad_objects_with_readable_messages() {
    let client = client().await;
    install_our_crds(&client).await;
    let ns = TestNamespace::new(&client, "hb-cel").await;
    let api: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);
    api.create(&PostParams::default(), &binding("conv-1"))
        .await
        .expect("create");

    async fn refused(api: &Api<HarnessBinding>, patch: serde_json::Value) -> String {
        match api
            .patch("conv-1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => panic!("patch {patch} was accepted"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{status:?}");
                status.message
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    let msg = refused(&api, json!({"spec": {"epoch": 2}})).await;
    assert!(
        msg.contains("epoch may only stay the same or rise by exactly 1"),
        "{msg}"
    );
    let msg = refused(&api, json!({"spec": {"agentId": "another-agent"}})).await;
    assert!(msg.contains("agentId is immutable"), "{msg}");
    let msg = refused(&api, json!({"spec": {"harness": {"id": "deepagents"}}})).await;
    assert!(
        msg.contains("harness.id is immutable within an epoch"),
        "{msg}"
    );
    let msg = refused(
        &api,
        json!({"spec": {"harness": {"conversationPolicy": "whenever"}}}),
    )
    .await;
    assert!(msg.contains("Unsupported value: \"whenever\""), "{msg}");

    // A clear (epoch + 1) may also change the harness.
    let cleared = api
        .patch(
            "conv-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"epoch": 1, "harness": {"id": "deepagents"}}})),
        )
        .await
        .expect("epoch + 1 with a new harness is a legal clear");
    assert_eq!(cleared.spec.epoch, 1);

    // A raw subject (an email) is never accepted as a subject reference.
    let mut raw = binding("conv-2");
    raw.spec.subject_ref = "user:alice@example.com".into();
    let err = api
        .create(&PostParams::default(), &raw)
        .await
        .expect_err("raw subject refused");
    assert!(err.to_string().contains("spec.subjectRef"), "{err}");

    // Organization memory is never agent-writable.
    let policies: Api<MemoryPolicy> = Api::namespaced(client.clone(), &ns.name);
    let policy: MemoryPolicy = serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1", "kind": "MemoryPolicy",
        "metadata": {"name": "org-writer"},
        "spec": {"agentSelector": {"allAgents": true}, "writeScope": "organization"}
    }))
    .expect("policy");
    let err = policies
        .create(&PostParams::default(), &policy)
        .await
        .expect_err("organization write scope refused");
    assert!(
        err.to_string()
            .contains("writeScope cannot be organization"),
        "{err}"
    );

    let both: MemoryPolicy = serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1", "kind": "MemoryPolicy",
        "metadata": {"name": "ambiguous"},
        "spec": {"agentSelector": {"allAgents": true, "agentIds": ["a"]}}
    }))
    .expect("policy");
    let err = policies
        .create(&PostParams::default(), &both)
        .await
        .expect_err("ambiguous selector refused");
    assert!(
        err.to_string()
            .contains("set exactly one of agentIds or allAgents"),
        "{err}"
    );
}

fn gvk_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sandbox_claim_from_warm_pool_becomes_ready() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "sbx-smoke").await;
    let text = std::fs::read_to_string(common::repo_path("e2e/testdata/sandbox-smoke.yaml"))
        .expect("smoke yaml");
    let docs: Vec<DynamicObject> = serde_saphyr::from_multiple(&text).expect("smoke yaml parses");
    for mut obj in docs {
        let types = obj.types.clone().expect("typed object");
        let (group, version) = types
            .api_version
            .split_once('/')
            .expect("grouped api version");
        let plural = format!("{}s", types.kind.to_lowercase());
        let ar = gvk_resource(group, version, &types.kind, &plural);
        obj.metadata.namespace = Some(ns.name.clone());
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
        let name = obj.metadata.name.clone().expect("named");
        api.patch(
            &name,
            &PatchParams::apply("harness-engine-tests"),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", types.kind));
    }

    let claims: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &gvk_resource(
            "extensions.agents.x-k8s.io",
            "v1beta1",
            "SandboxClaim",
            "sandboxclaims",
        ),
    );
    let claim = eventually(
        Duration::from_secs(90),
        "the SandboxClaim to become Ready",
        || {
            let claims = claims.clone();
            async move {
                let list = claims.list(&Default::default()).await.ok()?;
                list.items.into_iter().find(|c| ready(&c.data))
            }
        },
    )
    .await;

    // The claim is bound to a Sandbox whose pod kwok runs.
    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &gvk_resource("agents.x-k8s.io", "v1beta1", "Sandbox", "sandboxes"),
    );
    let sandbox = eventually(Duration::from_secs(30), "a Ready Sandbox", || {
        let sandboxes = sandboxes.clone();
        async move {
            sandboxes
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|s| ready(&s.data))
        }
    })
    .await;
    assert!(sandbox.metadata.uid.is_some());
    assert!(claim.metadata.uid.is_some());

    let (ok, out, err) = kubectl(&[
        "get",
        "pods",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.items[*].status.phase}",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.split_whitespace().any(|p| p == "Running"),
        "a sandbox pod runs on a kwok node: {out}"
    );
}

fn ready(data: &serde_json::Value) -> bool {
    data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferretdb_round_trips_a_document() {
    use mongodb::bson::doc;
    let cp = control_plane();
    let mongo = mongodb::Client::with_uri_str(&cp.mongodb_uri)
        .await
        .expect("mongodb client");
    let db = mongo.database(&format!("harness_test_{}", std::process::id()));
    let coll = db.collection::<mongodb::bson::Document>("harness_sessions");
    coll.insert_one(doc! {"_id": "hs_1", "epoch": 0_i64, "revision": 3_i64, "body": mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] }})
        .await
        .expect("insert");
    // A compare-and-set: the update applies only when the expected revision matches.
    let stale = coll
        .update_one(
            doc! {"_id": "hs_1", "revision": 2_i64},
            doc! {"$set": {"revision": 4_i64}},
        )
        .await
        .expect("update");
    assert_eq!(stale.matched_count, 0, "a stale revision matches nothing");
    let fresh = coll
        .update_one(
            doc! {"_id": "hs_1", "revision": 3_i64},
            doc! {"$set": {"revision": 4_i64}},
        )
        .await
        .expect("update");
    assert_eq!(fresh.modified_count, 1);
    let read = coll
        .find_one(doc! {"_id": "hs_1"})
        .await
        .expect("find")
        .expect("document present");
    assert_eq!(read.get_i64("revision").ok(), Some(4));
    assert_eq!(
        read.get_binary_generic("body").ok(),
        Some(&vec![0, 1, 2, 255])
    );
    db.drop().await.expect("drop test database");
}
