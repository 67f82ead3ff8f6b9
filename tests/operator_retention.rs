//! Retention sweeps run by the operator itself: a real `harness-engine operator` process
//! (leader by `--no-leader-election`) against the local control plane, on a data
//! directory the test filled beforehand through the store's own API (a conversation with
//! a committed head and an uncommitted pending write, memory records one of which has
//! expired). With sweeps every second and TTLs of a second, the operator deletes what
//! expired, keeps what did not, exports the counts on `/metrics`, and the store holds
//! one audit record per sweep kind.

mod common;
mod store_conformance;

use std::time::Duration;

use common::operator::{Operator, OperatorOptions};
use harness_engine::{
    domain::{
        ids::content_digest,
        memory::{ApprovalStatus, MemoryContext, MemoryKind, MemoryRecord, MemoryScope, Namespace},
    },
    store::{
        BindingStore, RetentionStore, ThreadStateStore, memory::MemoryStore, now_ms,
        sqlite::SqliteStore,
    },
};

fn record(ns: &Namespace, key: &str, expires_at_ms: Option<i64>) -> MemoryRecord {
    let now = now_ms();
    let body = format!("memory {key}");
    MemoryRecord {
        id: ns.record_id(key),
        namespace: ns.clone(),
        kind: MemoryKind::Semantic,
        memory_key: key.into(),
        media_type: "text/plain".into(),
        content_hash: content_digest(body.as_bytes()),
        body,
        provenance: Default::default(),
        approval_status: ApprovalStatus::NotRequired,
        approval: Default::default(),
        classification: Default::default(),
        importance: 0.5,
        embedding: None,
        revision: 1,
        source_revisions: vec![],
        retention_policy: if expires_at_ms.is_some() {
            "short"
        } else {
            "indefinite"
        }
        .into(),
        review_required: false,
        created_at_ms: now - 10_000,
        updated_at_ms: now - 10_000,
        expires_at_ms,
    }
}

/// The value of an unlabelled-enough series line starting with `prefix`.
fn series(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_sweeps_expired_state_and_memory_and_audits_it() {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "retention").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let db = data.join("state.db");

    // 1. What the sweep will find, written through the store's API.
    let (old, expired_ns) = {
        let store = SqliteStore::open(&db, store_conformance::limits())
            .await
            .expect("open the store");
        let (old, scope) = store_conformance::new_binding(&store, "idle-conversation").await;
        store_conformance::turn(&store, &scope, b"turn one", 0, "run-1").await;
        store
            .write_native_state(
                &scope,
                b"never committed",
                &store_conformance::key(&scope, "orphan"),
            )
            .await
            .expect("pending write");
        let ctx = MemoryContext {
            subject: old.owner.clone(),
            agent_id: "agent-1".into(),
            organization: None,
        };
        let ns = Namespace::derive(&store_conformance::keyring(), &ctx, MemoryScope::User)
            .expect("namespace");
        let loaded = store
            .load_memories(vec![
                record(&ns, "expired", Some(now_ms() - 1_000)),
                record(&ns, "kept", None),
            ])
            .await
            .expect("load memories");
        assert_eq!(loaded, 2);
        (old, ns)
    };
    // The conversation's last write must be older than its TTL (1 s) when the sweep runs.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // 2. The operator sweeps every second.
    let mut op = Operator::start(OperatorOptions {
        namespace: &ns.name,
        data_dir: &data,
        leader_lease_seconds: None,
        extra: [
            "--sweep-interval-seconds",
            "1",
            "--pending-ttl-seconds",
            "1",
            "--conversation-ttl-seconds",
            "1",
        ]
        .map(String::from)
        .to_vec(),
    });
    let http = reqwest::Client::new();
    let metrics = common::eventually(
        Duration::from_secs(60),
        "a sweep of each kind deleted something",
        || {
            let (http, admin) = (http.clone(), op.admin.clone());
            async move {
                let text = http
                    .get(format!("{admin}/metrics"))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                let state = series(
                    &text,
                    "harness_engine_retention_deleted_total{kind=\"state\"}",
                )?;
                let memory = series(
                    &text,
                    "harness_engine_retention_deleted_total{kind=\"memory\"}",
                )?;
                (state >= 1.0 && memory >= 1.0).then_some(text)
            }
        },
    )
    .await;
    assert!(
        series(
            &metrics,
            "harness_engine_retention_sweeps_total{kind=\"memory\",result=\"ok\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert!(
        !metrics.contains("result=\"error\""),
        "a sweep failed:\n{metrics}"
    );
    let log = op.log_text();
    op.stop();
    assert!(
        log.contains("retention sweeps scheduled on this leader")
            && log.contains("retention sweep of memory done"),
        "{log}"
    );

    // 3. What is left, and the audit trail.
    let store = SqliteStore::open(&db, store_conformance::limits())
        .await
        .expect("reopen the store");
    assert_eq!(
        store.get_binding(&old.binding_id).await.expect("get"),
        None,
        "the idle conversation's thread state is gone"
    );
    let now = now_ms();
    assert!(
        store
            .get_memory(&expired_ns, "expired", true, now)
            .await
            .expect("get")
            .is_none(),
        "the expired memory is gone"
    );
    assert!(
        store
            .get_memory(&expired_ns, "kept", true, now)
            .await
            .expect("get")
            .is_some(),
        "memory under an indefinite retention stays"
    );
    let audit = store.audit_records(100).await.expect("audit records");
    let state_sweep = audit
        .iter()
        .find(|a| a.action == "retention.sweep" && a.detail["bindings_deleted"].as_u64() >= Some(1))
        .unwrap_or_else(|| {
            panic!("no retention.sweep audit record deleting the binding: {audit:#?}")
        });
    assert_eq!(
        state_sweep.detail["policy_id"], "deployment",
        "{state_sweep:?}"
    );
    assert!(
        audit
            .iter()
            .any(|a| a.action == "memory.sweep" && a.detail.to_string().contains("short")),
        "no memory.sweep audit record for the expired record: {audit:#?}"
    );
}
