//! Operator restarts with worker pods deleted around each kill (issue 19), shared by
//! `tests/operator_restarts.rs` (which asserts) and `benches/operator.rs` (which
//! reports percentiles).
//!
//! Several bindings on one warm pool; the real `harness-engine operator` process is
//! SIGKILLed and started again on the same data directory, over and over. Around each
//! kill one binding's worker pod is deleted before the kill, during a replacement, or
//! after the kill, and a second binding's worker pod is deleted while the operator is
//! down. After each start the clock runs until every binding is Ready on a live pod, the
//! two touched ones at a higher lease generation than before.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use harness_engine::api::{HarnessBinding, Lifecycle, conditions};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

use super::operator::{Operator, OperatorOptions, apply_samples};

/// One status of a binding as its watch saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub generation: i64,
    pub ready: bool,
    pub lifecycle: Option<Lifecycle>,
    /// The `Replaced` condition's reason, when true.
    pub replaced: Option<String>,
}

/// What one restart did and how long the bindings took to recover.
#[derive(Debug)]
pub struct Restart {
    /// `before`, `during` or `after` (when the first binding's pod was deleted).
    pub when: &'static str,
    /// For `during`: whether the kill really hit a replacement in flight.
    pub mid_replacement: bool,
    /// The two bindings whose pods were deleted, with their generations before.
    pub touched: [(String, i64); 2],
    /// When the new process was spawned.
    pub started: Instant,
    /// From the spawn until every binding was Ready on a live pod, the touched ones
    /// at a higher generation.
    pub recovery: Duration,
}

pub struct Outcome {
    pub restarts: Vec<Restart>,
    /// Every status each binding's watch showed, in order.
    pub seen: HashMap<String, Vec<Seen>>,
    /// The last operator's log.
    pub log: String,
}

fn snapshot(b: &HarnessBinding) -> Option<Seen> {
    let s = b.status.as_ref()?;
    Some(Seen {
        at: Instant::now(),
        generation: s.lease.as_ref().map(|l| l.generation).unwrap_or(0),
        ready: conditions::is_true(&s.conditions, "Ready"),
        lifecycle: s.lifecycle,
        replaced: s
            .conditions
            .iter()
            .find(|c| c.type_ == "Replaced" && c.status == "True")
            .map(|c| c.reason.clone()),
    })
}

/// The binding's generation when it is Ready on the live pod its lease verified.
async fn ready_on_live_pod(pods: &Api<Pod>, b: &HarnessBinding) -> Option<i64> {
    let s = b.status.as_ref()?;
    let lease = s.lease.as_ref()?;
    if s.lifecycle != Some(Lifecycle::Ready) || !conditions::is_true(&s.conditions, "Ready") {
        return None;
    }
    let pod = pods
        .get_opt(lease.worker_pod_name.as_deref()?)
        .await
        .ok()??;
    (pod.metadata.uid == lease.worker_pod_uid && pod.metadata.deletion_timestamp.is_none())
        .then_some(lease.generation)
}

fn generation(b: &HarnessBinding) -> i64 {
    b.status
        .as_ref()
        .and_then(|s| s.lease.as_ref())
        .map(|l| l.generation)
        .unwrap_or(0)
}

async fn delete_worker(bindings: &Api<HarnessBinding>, pods: &Api<Pod>, name: &str) -> i64 {
    let b = bindings.get(name).await.expect("binding");
    let pod = b
        .status
        .as_ref()
        .and_then(|s| s.lease.as_ref())
        .and_then(|l| l.worker_pod_name.clone())
        .expect("a Ready binding names its worker pod");
    // Like `kubectl delete pod --wait=false`.
    let _ = pods.delete(&pod, &DeleteParams::default()).await;
    generation(&b)
}

/// Waits until every binding is Ready on a live pod and each of `above` is at a higher
/// generation than given; `None` after `limit`.
async fn all_ready(
    bindings: &Api<HarnessBinding>,
    pods: &Api<Pod>,
    names: &[String],
    above: &[(String, i64)],
    limit: Duration,
) -> Option<()> {
    let deadline = Instant::now() + limit;
    'poll: loop {
        if Instant::now() > deadline {
            return None;
        }
        for name in names {
            let Ok(b) = bindings.get(name).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'poll;
            };
            let floor = above
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, g)| *g)
                .unwrap_or(0);
            match ready_on_live_pod(pods, &b).await {
                Some(g) if g > floor => {}
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue 'poll;
                }
            }
        }
        return Some(());
    }
}

/// Runs `restarts` kill-and-start rounds over `n` bindings in `ns` (samples applied
/// here), with the operator's data in `data_dir`. Panics when a round does not recover
/// within `limit` (with the operator's log).
pub async fn run(
    client: &Client,
    ns: &str,
    data_dir: &Path,
    n: usize,
    restarts: usize,
    limit: Duration,
) -> Outcome {
    apply_samples(ns);
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sample = bindings
        .get("conversation-sample")
        .await
        .expect("the sample binding");
    let mut names = vec![sample.name_any()];
    for i in 1..n {
        let name = format!("conversation-{i}");
        let mut b: HarnessBinding = serde_json::from_value(json!({
            "apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
            "metadata": {"name": name},
            "spec": serde_json::to_value(&sample.spec).expect("spec"),
        }))
        .expect("binding");
        b.spec.conversation_id = format!("conv-restart-{i}");
        bindings
            .create(&PostParams::default(), &b)
            .await
            .expect("create binding");
        names.push(name);
    }
    // A pool as large as the bindings keeps replacements warm.
    let pools: Api<harness_engine::api::sandbox::SandboxWarmPool> =
        Api::namespaced(client.clone(), ns);
    let _ = pools
        .patch(
            "python-worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": n.min(6)}})),
        )
        .await;

    let start = |dir: &Path| {
        Operator::start(OperatorOptions {
            namespace: ns,
            data_dir: dir,
            leader_lease_seconds: None,
            extra: vec![],
        })
    };
    let mut op = start(data_dir);
    if all_ready(&bindings, &pods, &names, &[], Duration::from_secs(180))
        .await
        .is_none()
    {
        panic!(
            "the bindings never became Ready; operator log:\n{}",
            op.log_text()
        );
    }

    // The operator watches only pods carrying Agent Sandbox's label: the workers do.
    for name in &names {
        let b = bindings.get(name).await.expect("binding");
        let pod_name = b
            .status
            .and_then(|s| s.lease)
            .and_then(|l| l.worker_pod_name)
            .expect("worker pod name");
        let pod = pods.get(&pod_name).await.expect("worker pod");
        assert!(
            pod.labels()
                .contains_key(harness_engine::operator::SANDBOX_POD_LABEL),
            "worker pod {pod_name} lacks {}: {:?}",
            harness_engine::operator::SANDBOX_POD_LABEL,
            pod.labels()
        );
    }

    let seen: Arc<Mutex<HashMap<String, Vec<Seen>>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let stream = watcher(bindings.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(b) | watcher::Event::InitApply(b)) = event else {
                    continue;
                };
                if let Some(s) = snapshot(&b) {
                    seen.lock()
                        .unwrap()
                        .entry(b.name_any())
                        .or_default()
                        .push(s);
                }
            }
        })
    };

    let mut rounds = Vec::new();
    for i in 0..restarts {
        let a = names[i % n].clone();
        let b = names[(i + n / 2) % n].clone();
        let when = ["before", "during", "after"][i % 3];
        let mut mid_replacement = false;
        let gen_a = match when {
            "before" => {
                let g = delete_worker(&bindings, &pods, &a).await;
                op.kill();
                g
            }
            "during" => {
                let g = delete_worker(&bindings, &pods, &a).await;
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline {
                    if let Ok(cur) = bindings.get(&a).await
                        && generation(&cur) > g
                    {
                        mid_replacement =
                            cur.status.as_ref().and_then(|s| s.lifecycle) != Some(Lifecycle::Ready);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                op.kill();
                g
            }
            _ => {
                op.kill();
                delete_worker(&bindings, &pods, &a).await
            }
        };
        let gen_b = delete_worker(&bindings, &pods, &b).await;
        // The pods are being replaced by the Sandbox controller while no operator runs.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        op = start(data_dir);
        let touched = [(a, gen_a), (b, gen_b)];
        if all_ready(&bindings, &pods, &names, &touched, limit)
            .await
            .is_none()
        {
            panic!(
                "restart {i} ({when}): not every binding was Ready on a live pod within \
                 {limit:?} (touched {touched:?}); operator log:\n{}",
                op.log_text()
            );
        }
        rounds.push(Restart {
            when,
            mid_replacement,
            touched,
            started,
            recovery: started.elapsed(),
        });
    }
    // The watch delivers the last statuses a moment after the API answers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch.abort();
    let log = op.log_text();
    op.stop();
    let seen = seen.lock().unwrap().clone();
    Outcome {
        restarts: rounds,
        seen,
        log,
    }
}

/// The p-th percentile (0..=100) of `values` by nearest rank.
pub fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut v = values.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
