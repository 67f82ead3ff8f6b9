//! `make bench-operator`: N HarnessBindings created at once on the local control plane
//! (real API server, real Agent Sandbox controller, kwok), against a real
//! `harness-engine operator` process (release build).
//!
//! Prints: time until all are Ready; p50/p99 of our own overhead (the binding seen Ready
//! minus its SandboxClaim seen Ready, both observed by watches in this process, so the
//! watch delay cancels out); Kubernetes API requests the operator sent per binding (its
//! own request counter, from `/metrics`); operator resident memory with all N bound.
//! Writes the same figures as flat JSON to `target/bench/operator.json`.
//!
//! The baseline runs first, in the same run: as many bare SandboxClaims on an identical
//! warm pool, no operator, and the time until all of them are Ready; the bindings' time
//! to all Ready is reported as a ratio to it (target at most 1.10). With
//! `HARNESS_BENCH_REAL_NODE=1` (`make bench-operator REAL_NODE=1`) both phases run on one
//! real node with our pause image as the worker, and the restart phase is skipped.
//!
//! `cargo bench --bench operator` creates 500 bindings; without `--bench` (as
//! `cargo test --all-targets` runs it) it creates 5. `HARNESS_BENCH_BINDINGS` sets another
//! count and `HARNESS_BENCH_CONCURRENCY` the operator's `--concurrency`. Targets: overhead p50 <= 50 ms,
//! p99 <= 250 ms; RSS <= 100 MiB at 500 bindings. A count past the three kwok nodes'
//! 750 pods adds fake nodes of the same shape for the run and removes them after.

#[path = "../tests/common/mod.rs"]
mod common;

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::operator::{Operator, OperatorOptions};
use futures::StreamExt;
use harness_engine::{
    api::{HarnessBinding, conditions, sandbox::SandboxClaim},
    operator::binding::BINDING_UID_LABEL,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
    runtime::watcher,
};
use serde_json::json;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("HARNESS_BENCH_BINDINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 500 } else { 5 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let only_restarts = std::env::var("HARNESS_BENCH_ONLY").as_deref() == Ok("restarts");
    runtime.block_on(async {
        let mut out = serde_json::Map::new();
        out.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
        let real = real_node_image().await;
        if let Some(image) = &real {
            out.insert("node".into(), "real".into());
            out.insert("worker_image".into(), image.clone().into());
        }
        let extra_nodes = if real.is_none() && !only_restarts {
            kwok_capacity(n).await
        } else {
            Vec::new()
        };
        if !only_restarts {
            // Phases alternate (bare claims, bindings, bare claims, ...) so both see the
            // same machine; the ratio reported is the median of the rounds.
            let rounds: usize = std::env::var("HARNESS_BENCH_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if real.is_some() { 3 } else { 1 });
            let mut ratios = Vec::new();
            for round in 0..rounds.max(1) {
                println!("\nround {} of {rounds}", round + 1);
                let bare = bare_claims(n, full, real.as_deref(), &mut out).await;
                ratios.push(run(n, full, real.as_deref(), bare, &mut out).await);
            }
            ratios.sort_by(f64::total_cmp);
            let median = percentile(&ratios, 0.5);
            println!(
                "\nall-Ready ratio to bare claims over {} round(s): {:?}, median {median:.3} (target <= 1.10: {})",
                ratios.len(),
                ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                verdict(median <= 1.10)
            );
            out.insert("ready_ratios".into(), ratios.clone().into());
            out.insert("ready_ratio_median".into(), median.into());
        }
        remove_nodes(&extra_nodes).await;
        if real.is_none() {
            restarts(full, &mut out).await;
        } else {
            println!("restart recovery: measured on the kwok tier (`make bench-operator`), not on the real node");
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("operator.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&out).unwrap_or_default(),
        )
        .expect("write json");
        println!("wrote {}", path.display());
    });
}

/// Pods one fake node takes (its /24 pod range holds 254).
const PODS_PER_NODE: usize = 250;

/// The control plane's three kwok nodes hold 750 pods; a larger run adds fake nodes of
/// the same shape until `n` workers, the warm pools and some margin fit, and returns
/// their names (removed after the run). Without this, claims past the capacity stay
/// unscheduled and the run measures the scheduler's refusal.
async fn kwok_capacity(n: usize) -> Vec<String> {
    let client = common::client().await;
    let nodes: Api<Node> = Api::all(client);
    let existing = nodes
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .expect("list kwok nodes")
        .items;
    let have: usize = existing
        .iter()
        .filter_map(|node| node.status.as_ref()?.capacity.as_ref()?.get("pods"))
        .filter_map(|q| q.0.parse::<usize>().ok())
        .sum();
    let need = n + 128;
    let mut added = Vec::new();
    let mut i = 0usize;
    while have + added.len() * PODS_PER_NODE < need {
        let name = format!("kwok-bench-node-{i}");
        let cidr = format!("10.245.{i}.0/24");
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            },
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            "status": {
                "addresses": [{"type": "Hostname", "address": name}],
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": PODS_PER_NODE.to_string(), "ephemeral-storage": "1Ti"},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": PODS_PER_NODE.to_string(), "ephemeral-storage": "1Ti"}
            }
        }))
        .expect("node");
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => added.push(name),
            Err(kube::Error::Api(e)) if e.code == 409 => added.push(name),
            Err(e) => panic!("creating {name}: {e}"),
        }
        i += 1;
    }
    if !added.is_empty() {
        println!(
            "added {} fake nodes ({} pods) to the {} of the control plane ({have} pods)",
            added.len(),
            added.len() * PODS_PER_NODE,
            existing.len()
        );
        common::eventually(Duration::from_secs(120), "added nodes Ready", || {
            let nodes = nodes.clone();
            let added = added.clone();
            async move {
                let mut ready = 0;
                for name in &added {
                    let Ok(node) = nodes.get(name).await else {
                        return None;
                    };
                    ready += usize::from(node.status.and_then(|s| s.conditions).is_some_and(|c| {
                        c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    }));
                }
                (ready == added.len()).then_some(())
            }
        })
        .await;
    }
    added
}

async fn remove_nodes(names: &[String]) {
    if names.is_empty() {
        return;
    }
    let nodes: Api<Node> = Api::all(common::client().await);
    for name in names {
        let _ = nodes.delete(name, &Default::default()).await;
    }
}

/// Issue 19: recovery after a restart. Six bindings in their own namespace; the
/// operator SIGKILLed and started again on the same data directory, a worker pod deleted
/// around each kill (see `tests/common/restarts.rs`); the time from the new process's
/// spawn until every binding is Ready on a live pod, the touched ones at a higher lease
/// generation. `HARNESS_BENCH_RESTARTS` sets the count (20 with `--bench`, 3 without).
async fn restarts(full: bool, out: &mut serde_json::Map<String, serde_json::Value>) {
    let count: usize = std::env::var("HARNESS_BENCH_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 20 } else { 3 });
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "bench-restart").await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let outcome = common::restarts::run(
        &client,
        &ns.name,
        &scratch.path().join("data"),
        6,
        count,
        Duration::from_secs(120),
    )
    .await;
    let took: Vec<Duration> = outcome.restarts.iter().map(|r| r.recovery).collect();
    let pct = |p| common::restarts::percentile(&took, p).as_secs_f64();
    let (p50, p99, max) = (pct(50.0), pct(99.0), pct(100.0));
    let over_15 = took.iter().filter(|d| d.as_secs_f64() > 15.0).count();
    println!();
    println!(
        "restart recovery: {count} SIGKILL restarts, 6 bindings, a worker pod deleted around each kill"
    );
    println!("{:<44} {:>12}", "figure", "value");
    println!(
        "{:<44} {:>12.2}",
        "recovery p50 (s, spawn -> all Ready)", p50
    );
    println!("{:<44} {:>12.2}", "recovery p99 (s)", p99);
    println!("{:<44} {:>12.2}", "recovery max (s)", max);
    println!("{:<44} {:>12}", "restarts over 15 s", over_15);
    for (i, r) in outcome.restarts.iter().enumerate() {
        println!(
            "  restart {i:2}: pod deleted {:6} (mid-replacement: {:5}) recovered in {:.2} s",
            r.when,
            r.mid_replacement,
            r.recovery.as_secs_f64()
        );
    }
    out.insert("restarts".into(), count.into());
    out.insert("restart_recovery_p50_s".into(), p50.into());
    out.insert("restart_recovery_p99_s".into(), p99.into());
    out.insert("restart_recovery_max_s".into(), max.into());
    out.insert("restarts_over_15_s".into(), over_15.into());
    common::operator::drop_finalizers(&ns.name);
    drop(ns);
}

/// With `HARNESS_BENCH_REAL_NODE=1` (set by `make bench-operator REAL_NODE=1`): the
/// worker image for the real node, our own pause image as the kubelet lists it under its
/// manifest digest (`realnode.sh` imports every image under name@digest), so the pods
/// really run and the profile can allow exactly that digest. `None` on kwok.
async fn real_node_image() -> Option<String> {
    if std::env::var("HARNESS_BENCH_REAL_NODE").as_deref() != Ok("1") {
        return None;
    }
    let client = common::client().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let list = nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    let image = list
        .items
        .iter()
        .filter_map(|n| n.status.as_ref()?.images.as_ref())
        .flatten()
        .flat_map(|i| i.names.clone().unwrap_or_default())
        .find(|name| name.starts_with("localhost/harness-engine/pause@sha256:"));
    Some(image.expect("the real node lists no localhost/harness-engine/pause@sha256: image (realnode.sh up imports it)"))
}

/// The workload both phases run on: a worker ServiceAccount, a SandboxTemplate and a
/// SandboxWarmPool (2 warm sandboxes), and with `profile` the SandboxProfile the
/// bindings name. On kwok these are `config/samples`; on the real node the same objects
/// with the pause image pinned by digest. Returns once the warm pool's sandboxes are
/// Ready, so both phases start from a filled pool.
async fn apply_workload(client: &kube::Client, ns: &str, real: Option<&str>, profile: bool) {
    match real {
        None => {
            let mut files = vec![
                "worker_service_account.yaml",
                "sandbox_template.yaml",
                "sandbox_warm_pool.yaml",
            ];
            if profile {
                files.push("sandbox_profile.yaml");
            }
            for file in files {
                let path = common::repo_path(&format!("config/samples/{file}"));
                let (ok, out, err) =
                    common::kubectl(&["apply", "-f", path.to_str().unwrap_or(""), "-n", ns]);
                assert!(ok, "{file}: {out}{err}");
            }
        }
        Some(image) => {
            let digest = image.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
            let mut yaml = format!(
                r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: harness-worker}}
automountServiceAccountToken: false
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {{name: python-worker}}
spec:
  podTemplate:
    metadata:
      labels: {{app.kubernetes.io/name: harness-worker}}
      annotations: {{harness-engine.dev/worker-protocol-version: "1"}}
    spec:
      serviceAccountName: harness-worker
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
      - name: worker
        image: {image}
        imagePullPolicy: Never
        resources: {{requests: {{cpu: 1m, memory: 8Mi}}}}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {{name: python-worker}}
spec: {{replicas: 2, sandboxTemplateRef: {{name: python-worker}}}}
"#
            );
            if profile {
                yaml.push_str(&format!(
                    r#"---
apiVersion: harness-engine.dev/v1alpha1
kind: SandboxProfile
metadata: {{name: python-worker}}
spec:
  warmPoolRef: {{name: python-worker}}
  allowedHarnessIds: [deepagents]
  allowedWorkerImageDigests: ["{digest}"]
  adapterVersion: "1.0.0"
  workerProtocolVersions: [1]
  egressPolicyClass: data-plane-only
  timeouts: {{claimReadinessDeadline: 10m, idleTTL: 6h, maxLifetime: 12h}}
  hibernation: never
"#
                ));
            }
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("workload.yaml");
            std::fs::write(&path, yaml).expect("write workload");
            let (ok, out, err) =
                common::kubectl(&["apply", "-f", path.to_str().unwrap_or(""), "-n", ns]);
            assert!(ok, "real-node workload: {out}{err}");
        }
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    common::eventually(Duration::from_secs(180), "2 warm sandboxes Ready", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let ready = list
                .items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            (ready >= 2).then_some(())
        }
    })
    .await;
}

/// The baseline, in the same run: `n` bare SandboxClaims on an identical warm pool in
/// a namespace of their own, created the same way (32 in flight), no operator involved;
/// the time until all of them are Ready (their own condition, seen by a watch). The
/// namespace is deleted and gone before the bindings' phase starts.
async fn bare_claims(
    n: usize,
    full: bool,
    real: Option<&str>,
    out: &mut serde_json::Map<String, serde_json::Value>,
) -> f64 {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    wait_for_quiet(&client).await;
    let ns = common::TestNamespace::new(&client, "bench-op-bare").await;
    apply_workload(&client, &ns.name, real, false).await;
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns.name);
    let ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let ready = ready.clone();
        let stream = watcher(claims.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event else {
                    continue;
                };
                if c.status
                    .as_ref()
                    .is_some_and(|s| harness_engine::api::sandbox::is_ready(&s.conditions))
                {
                    ready
                        .lock()
                        .unwrap()
                        .entry(c.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let claims = claims.clone();
            async move {
                let claim = SandboxClaim::new(
                    &format!("bare-{i:04}"),
                    harness_engine::api::sandbox::SandboxClaimSpec {
                        warm_pool_ref: harness_engine::api::sandbox::NameRef {
                            name: "python-worker".into(),
                        },
                    },
                );
                claims
                    .create(&PostParams::default(), &claim)
                    .await
                    .expect("create claim");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let timeout = Duration::from_secs(if full { 1500 } else { 180 });
    while ready.lock().unwrap().len() < n {
        assert!(
            started.elapsed() < timeout,
            "only {} of {n} bare claims Ready after {timeout:?}",
            ready.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_ready = started.elapsed().as_secs_f64();
    watch.abort();
    println!();
    println!(
        "baseline: {n} bare SandboxClaims created at once (32 in flight) on an identical warm pool, no operator{}",
        if real.is_some() {
            ", real node"
        } else {
            ", kwok"
        }
    );
    println!("{:<44} {:>12.2}", "bare claims all Ready (s)", all_ready);
    out.insert("bare_claims_all_ready_seconds".into(), all_ready.into());
    drop(ns);
    all_ready
}

/// An earlier run's namespace (a thousand pods and Sandboxes) is still being deleted
/// for a while after that run ends; measuring on top of that cleanup measures it.
async fn wait_for_quiet(client: &kube::Client) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let quiet_by = Instant::now() + Duration::from_secs(300);
    loop {
        let left = namespaces
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| n.name_any().starts_with("bench-op"))
                    .count()
            })
            .unwrap_or(0);
        if left == 0 || Instant::now() > quiet_by {
            break;
        }
        println!("bench: waiting for {left} earlier benchmark namespace(s) to be deleted");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[derive(Default)]
struct Seen {
    /// binding UID -> when its claim was first seen Ready.
    claim_ready: HashMap<String, Instant>,
    /// binding name -> (uid, when first seen Ready).
    binding_ready: HashMap<String, (String, Instant)>,
}

async fn run(
    n: usize,
    full: bool,
    real: Option<&str>,
    bare_all_ready: f64,
    out: &mut serde_json::Map<String, serde_json::Value>,
) -> f64 {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    wait_for_quiet(&client).await;
    let ns = common::TestNamespace::new(&client, "bench-op").await;
    apply_workload(&client, &ns.name, real, true).await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let mut op = Operator::start(OperatorOptions {
        namespace: &ns.name,
        data_dir: &scratch.path().join("data"),
        leader_lease_seconds: Some(15),
        extra: std::env::var("HARNESS_BENCH_CONCURRENCY")
            .map(|c| vec!["--concurrency".to_owned(), c])
            .unwrap_or_default(),
    });
    let http = reqwest::Client::new();
    // Wait for the profile to be accepted before the clock starts.
    let profiles: Api<harness_engine::api::SandboxProfile> =
        Api::namespaced(client.clone(), &ns.name);
    common::eventually(Duration::from_secs(60), "profile Ready", || async {
        let p = profiles.get("python-worker").await.ok()?;
        conditions::is_true(&p.status?.conditions, "Ready").then_some(())
    })
    .await;
    let requests_before = kube_requests(&http, &op).await;

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns.name);
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);
    let claim_watch = {
        let seen = seen.clone();
        let stream = watcher(claims, watcher::Config::default().labels(BINDING_UID_LABEL));
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event else {
                    continue;
                };
                let ready = c
                    .status
                    .as_ref()
                    .is_some_and(|s| harness_engine::api::sandbox::is_ready(&s.conditions));
                if let (true, Some(uid)) = (ready, c.labels().get(BINDING_UID_LABEL)) {
                    seen.lock()
                        .unwrap()
                        .claim_ready
                        .entry(uid.clone())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    let binding_watch = {
        let seen = seen.clone();
        let stream = watcher(bindings.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(b) | watcher::Event::InitApply(b)) = event else {
                    continue;
                };
                let ready = b
                    .status
                    .as_ref()
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"));
                if ready {
                    seen.lock()
                        .unwrap()
                        .binding_ready
                        .entry(b.name_any())
                        .or_insert_with(|| (b.uid().unwrap_or_default(), Instant::now()));
                }
            }
        })
    };

    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let bindings = bindings.clone();
            async move {
                let b: HarnessBinding = serde_json::from_value(json!({
                    "apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
                    "metadata": {"name": format!("b-{i:04}")},
                    "spec": {
                        "agentId": "bench-agent",
                        "conversationId": format!("conv-{i:04}"),
                        "subjectRef": format!("hmac-sha256:{:064x}", i + 1),
                        "harness": {"id": "deepagents"},
                        "sandboxProfileRef": {"name": "python-worker"}
                    }
                }))
                .expect("binding");
                bindings
                    .create(&PostParams::default(), &b)
                    .await
                    .expect("create binding");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created_in = started.elapsed();

    let timeout = Duration::from_secs(if full { 1500 } else { 180 });
    loop {
        let ready = seen.lock().unwrap().binding_ready.len();
        if ready >= n {
            break;
        }
        if started.elapsed() > timeout {
            panic!(
                "only {ready} of {n} bindings Ready after {timeout:?}; operator log tail:\n{}",
                tail(&op.log_text(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_ready = started.elapsed();
    // A binding may be Ready before its claim says so (the lease waits for the Sandbox,
    // not for the claim's own condition): let the claims catch up before reading them.
    let claims_deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().claim_ready.len() < n && Instant::now() < claims_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let requests = kube_requests(&http, &op)
        .await
        .saturating_sub(requests_before);
    let rss = rss_mib(op.pid());
    claim_watch.abort();
    binding_watch.abort();

    // (overhead ms, claim Ready at, seconds since the first create) per binding.
    let (pairs, missing) = {
        let seen = seen.lock().unwrap();
        let mut out = Vec::new();
        let mut missing = 0;
        for (uid, at) in seen.binding_ready.values() {
            match seen.claim_ready.get(uid) {
                Some(claim_at) => out.push((
                    at.saturating_duration_since(*claim_at).as_secs_f64() * 1000.0,
                    claim_at.saturating_duration_since(started).as_secs_f64(),
                    at < claim_at,
                )),
                None => missing += 1,
            }
        }
        (out, missing)
    };
    let mut overhead: Vec<f64> = pairs.iter().map(|(o, _, _)| *o).collect();
    let ahead = pairs.iter().filter(|(_, _, ahead)| *ahead).count();
    overhead.sort_by(f64::total_cmp);
    let p50 = percentile(&overhead, 0.50);
    let p99 = percentile(&overhead, 0.99);
    let per_binding = requests as f64 / n as f64;

    println!();
    println!(
        "operator bench ({}): {n} HarnessBindings created at once (32 in flight), embedded store",
        if full { "full" } else { "smoke" }
    );
    println!("{:<44} {:>12}", "figure", "value");
    println!(
        "{:<44} {:>12.2}",
        "create calls done (s)",
        created_in.as_secs_f64()
    );
    println!("{:<44} {:>12.2}", "all Ready (s)", all_ready.as_secs_f64());
    println!(
        "{:<44} {:>12.1}",
        "overhead p50 (ms, binding - claim Ready)", p50
    );
    println!("{:<44} {:>12.1}", "overhead p99 (ms)", p99);
    println!(
        "{:<44} {:>12.1}",
        "overhead max (ms)",
        overhead.last().copied().unwrap_or(0.0)
    );
    println!(
        "{:<44} {:>12.1}",
        "Kubernetes API requests per binding", per_binding
    );
    println!("{:<44} {:>12.1}", "operator RSS (MiB)", rss);
    if missing > 0 {
        println!("({missing} bindings had no claim Ready event observed: excluded)");
    }
    println!(
        "bindings Ready before their claim's own Ready condition (overhead 0): {ahead} of {}",
        pairs.len()
    );
    // Where the tail comes from: how the overheads spread, and when (since the first
    // create) the claims of the slow ones became Ready.
    let bucket = |lo: f64, hi: f64| overhead.iter().filter(|o| **o >= lo && **o < hi).count();
    println!(
        "overhead spread: <50 ms {}, 50-250 ms {}, 250 ms-1 s {}, 1-5 s {}, >=5 s {}",
        bucket(0.0, 50.0),
        bucket(50.0, 250.0),
        bucket(250.0, 1000.0),
        bucket(1000.0, 5000.0),
        bucket(5000.0, f64::INFINITY)
    );
    let mut slow_at: Vec<f64> = pairs
        .iter()
        .filter(|(o, _, _)| *o >= 1000.0)
        .map(|(_, at, _)| *at)
        .collect();
    slow_at.sort_by(f64::total_cmp);
    if !slow_at.is_empty() {
        println!(
            "claims of the >=1 s ones were Ready at {:.1}..{:.1} s (median {:.1} s) after the first create",
            slow_at[0],
            slow_at[slow_at.len() - 1],
            percentile(&slow_at, 0.5)
        );
    }
    let metrics = http
        .get(format!("{}/metrics", op.admin))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    for line in metrics.lines().filter(|l| {
        l.starts_with("harness_engine_operator_binding_waits_total")
            || l.starts_with("harness_engine_operator_status_conflicts_total")
            || l.starts_with("harness_engine_operator_events_dropped_total")
            || (l.starts_with("harness_engine_operator_reconciles_total")
                && l.contains("harnessbinding"))
    }) {
        println!("  {}", line.trim_start_matches("harness_engine_operator_"));
    }
    for (name, what) in [
        (
            "bind_overhead_seconds",
            "operator-side overhead (claim seen Ready -> Ready written)",
        ),
        ("status_write_seconds", "status write latency"),
    ] {
        let (p50, p99) = (
            histogram_quantile(&metrics, name, 0.5),
            histogram_quantile(&metrics, name, 0.99),
        );
        println!(
            "{what}: p50 <= {:.0} ms, p99 <= {:.0} ms (bucket bounds)",
            p50 * 1000.0,
            p99 * 1000.0
        );
    }
    let log = op.log_text();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconcile failed"))
        .collect();
    println!("reconcile failures in the operator log: {}", failures.len());
    // By kind of failure: the message after "reconcile failed", names and numbers
    // blanked, so a thousand timeouts show as one line with its count.
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for line in &failures {
        let message = line.split("reconcile failed").nth(1).unwrap_or(line);
        let shape: String = message
            .split_whitespace()
            .map(|w| {
                if w.chars().any(|c| c.is_ascii_digit()) {
                    "#"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(160)
            .collect();
        *kinds.entry(shape).or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    for (shape, count) in kinds.iter().take(5) {
        println!("  {count:>6} x {shape}");
    }
    out.insert("reconcile_failures".into(), failures.len().into());
    let ratio = all_ready.as_secs_f64() / bare_all_ready.max(f64::EPSILON);
    println!(
        "{:<44} {:>12.3}",
        "all Ready / bare claims all Ready (ratio)", ratio
    );
    if full {
        println!(
            "targets: overhead p50 <= 50 ms [{}], p99 <= 250 ms [{}], RSS <= {} MiB [{}], all-Ready ratio <= 1.10 [{}]",
            verdict(p50 <= 50.0),
            verdict(p99 <= 250.0),
            rss_target(n),
            verdict(rss <= rss_target(n)),
            verdict(ratio <= 1.10)
        );
    }
    out.insert("ready_ratio_to_bare_claims".into(), ratio.into());
    out.insert("bindings".into(), n.into());
    out.insert("create_seconds".into(), created_in.as_secs_f64().into());
    out.insert("all_ready_seconds".into(), all_ready.as_secs_f64().into());
    out.insert("overhead_p50_ms".into(), p50.into());
    out.insert("overhead_p99_ms".into(), p99.into());
    out.insert(
        "overhead_max_ms".into(),
        overhead.last().copied().unwrap_or(0.0).into(),
    );
    out.insert("api_requests_per_binding".into(), per_binding.into());
    out.insert("operator_rss_mib".into(), rss.into());
    out.insert("ready_before_claim".into(), ahead.into());
    assert_eq!(overhead.len() + missing, n);

    // Leave nothing behind: the operator goes, then the bindings lose their finalizer
    // and the namespace (claims, sandboxes, pods) is deleted with them.
    op.stop();
    let names: Vec<String> = bindings
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|b| b.name_any()).collect())
        .unwrap_or_default();
    futures::stream::iter(names)
        .map(|name| {
            let bindings = bindings.clone();
            async move {
                let _ = bindings
                    .patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    drop(ns);
    ratio
}

async fn kube_requests(http: &reqwest::Client, op: &Operator) -> u64 {
    let text = http
        .get(format!("{}/metrics", op.admin))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("harness_engine_operator_kubernetes_requests_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .expect("the operator exports its Kubernetes request counter")
}

/// The upper bound of the histogram bucket holding quantile `q` of the operator's
/// `harness_engine_operator_<name>` (Prometheus text format).
fn histogram_quantile(metrics: &str, name: &str, q: f64) -> f64 {
    let prefix = format!("harness_engine_operator_{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total && total > 0.0)
        .map(|(le, _)| *le)
        .unwrap_or(0.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// The resident-memory target: 100 MiB up to 500 bindings (the first round), 200 MiB
/// at 5,000 (the second round's bar).
fn rss_target(n: usize) -> f64 {
    if n <= 500 { 100.0 } else { 200.0 }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
