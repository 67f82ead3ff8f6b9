//! Controller chaos, second part: the control plane itself fails under the operator.
//! Two `harness-engine operator` replicas with leader election (the default 15 s lease)
//! share a MongoDB store; in each round a worker pod is deleted and, as soon as the
//! replacement has started (a new lease generation written), one component of the
//! control plane is SIGKILLed and started again: the kube-apiserver, etcd (the
//! API server loses its storage mid-reconcile), or the Agent Sandbox controller (kept
//! down for 5 s, so the replacement's claim waits for it). A replica that exits (a
//! leader that could not renew within its renew deadline does) is started again, as its
//! Deployment would. Watches record every claim and lease generation throughout, and
//! reconnect after the API server comes back.
//!
//! Invariants: never two live claims for the binding; the lease generation never goes
//! back and rises with every replacement; the binding is Ready again after every round
//! (the time from the fault to Ready is printed: the bound stated in
//! docs/reliability.md).
//!
//! `make test` runs one round per component; `HARNESS_CHAOS_CONTROL_PLANE_ROUNDS=N` runs
//! N per component. The test restarts processes of the shared control plane, so it is a
//! test binary of its own (cargo runs test binaries one after another).

mod common;

use std::time::{Duration, Instant};

use common::{
    components::Component,
    eventually,
    operator::{Operator, apply_samples, chaos_replica, drop_finalizers, live_claims},
};
use harness_engine::api::{
    HarnessBinding, Lifecycle, conditions,
    sandbox::{SandboxClaim, is_ready},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams},
};

const BINDING: &str = "conversation-sample";
const LEASE_SECONDS: u64 = 15;

fn replica(ns: &str, data: &std::path::Path) -> Operator {
    chaos_replica(ns, data, LEASE_SECONDS)
}

/// The API server answers again (a list through the test's client).
async fn api_back(bindings: &Api<HarnessBinding>) {
    eventually(Duration::from_secs(120), "the API server back", || async {
        bindings.list(&ListParams::default().limit(1)).await.ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_restarts_mid_replacement_keep_one_live_claim_and_rising_generations() {
    let rounds: usize = std::env::var("HARNESS_CHAOS_CONTROL_PLANE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "cp-chaos").await;
    apply_samples(&ns.name);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let mut replicas = vec![replica(&ns.name, &data), replica(&ns.name, &data)];
    let ready_above = |above: i64| {
        let bindings = bindings.clone();
        async move {
            // After an API-server restart this can take up to the claim readiness
            // deadline (2 minutes, docs/reliability.md): a margin beyond it.
            eventually(
                Duration::from_secs(300),
                "the binding Ready again",
                || async {
                    let b = bindings.get_opt(BINDING).await.ok()??;
                    let s = b.status.clone()?;
                    let g = s.lease.as_ref()?.generation;
                    (s.lifecycle == Some(Lifecycle::Ready)
                        && g > above
                        && conditions::is_true(&s.conditions, "Ready"))
                    .then_some(b)
                },
            )
            .await
        }
    };
    let first = ready_above(0).await;
    let uid = first.uid().expect("uid");
    let watch =
        common::lease_watch::LeaseWatch::start(claims.clone(), bindings.clone(), &uid, BINDING);
    let mut generation = first
        .status
        .and_then(|s| s.lease)
        .map(|l| l.generation)
        .unwrap_or(0);

    let all = ["kube-apiserver", "etcd", "agent-sandbox-controller"];
    // HARNESS_CHAOS_COMPONENTS=kube-apiserver,etcd picks some.
    let chosen = std::env::var("HARNESS_CHAOS_COMPONENTS").unwrap_or_default();
    let components: Vec<&str> = all
        .into_iter()
        .filter(|c| chosen.is_empty() || chosen.split(',').any(|x| x.trim() == *c))
        .collect();
    // (component, replacement in flight, fault to binding Ready, claim Ready to binding Ready)
    let mut results: Vec<(&str, bool, Duration, Duration)> = Vec::new();
    let mut restarted_replicas = 0usize;
    for round in 0..rounds * components.len() {
        let name = components[round % components.len()];
        let component = tokio::task::block_in_place(|| Component::find(name));
        let b = bindings.get(BINDING).await.expect("binding");
        let pod = b
            .status
            .and_then(|s| s.lease)
            .and_then(|l| l.worker_pod_name)
            .expect("worker pod");
        pods.delete(&pod, &DeleteParams::default())
            .await
            .expect("delete the worker pod");
        let deadline = Instant::now() + Duration::from_secs(60);
        let started = loop {
            if let Some(s) = bindings
                .get_opt(BINDING)
                .await
                .ok()
                .flatten()
                .and_then(|b| b.status)
                && s.lease.as_ref().is_some_and(|l| l.generation > generation)
            {
                break s.lifecycle;
            }
            assert!(
                Instant::now() < deadline,
                "round {round} ({name}): no replacement started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let in_flight = started != Some(Lifecycle::Ready);
        let fault = Instant::now();
        tokio::task::block_in_place(|| component.kill());
        let down = if name == "agent-sandbox-controller" {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(1)
        };
        tokio::time::sleep(down).await;
        tokio::task::block_in_place(|| component.start());
        api_back(&bindings).await;
        let serving = fault.elapsed();
        // A replica that stopped leading exits; its Deployment would start it again.
        for op in &mut replicas {
            if tokio::task::block_in_place(|| op.exits_within(Duration::ZERO)) {
                let log = op.log_text();
                assert!(
                    log.contains("renew deadline") || log.contains("lost the leader lease"),
                    "round {round} ({name}): a replica exited for another reason:\n{log}"
                );
                *op = replica(&ns.name, &data);
                restarted_replicas += 1;
            }
        }
        // The replacement's claim Ready (Agent Sandbox, the scheduler and kwok did their
        // part), then the binding Ready (ours).
        let claim_ready = eventually(
            Duration::from_secs(240),
            "the replacement's claim Ready",
            || async {
                let b = bindings.get_opt(BINDING).await.ok()??;
                let lease = b.status?.lease?;
                let claim = claims.get_opt(lease.claim_name.as_deref()?).await.ok()??;
                (lease.generation > generation
                    && is_ready(&claim.status.map(|s| s.conditions).unwrap_or_default()))
                .then(|| fault.elapsed())
            },
        )
        .await;
        let b = ready_above(generation).await;
        let ready = fault.elapsed();
        println!(
            "round {round}: {name} restarted; API server answering after {:.2} s, the claim Ready after {:.2} s, the binding Ready after {:.2} s",
            serving.as_secs_f64(),
            claim_ready.as_secs_f64(),
            ready.as_secs_f64()
        );
        if ready.saturating_sub(claim_ready) > Duration::from_secs(10) {
            for op in &replicas {
                let log = op.log_text();
                let tail: Vec<&str> = log.lines().rev().take(80).collect();
                println!(
                    "--- a replica's log (last lines, newest first):\n{}",
                    tail.join("\n")
                );
            }
        }
        results.push((name, in_flight, ready, ready.saturating_sub(claim_ready)));
        generation = b
            .status
            .and_then(|s| s.lease)
            .map(|l| l.generation)
            .unwrap_or(0);
        let live_now = live_claims(&claims, &uid).await;
        assert!(
            live_now <= 1,
            "round {round} ({name}): {live_now} live claims"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (max, seen) = watch.finish();
    for mut op in replicas {
        op.stop();
    }
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the lease generation went backwards: {seen:?}"
    );
    let total = i64::try_from(results.len()).unwrap_or(i64::MAX);
    assert!(
        generation > total,
        "{total} replacements should have raised the generation past {total}: {generation}"
    );
    assert!(max <= 1, "{max} live claims for one binding were observed");
    for name in components {
        let ours: Vec<&(&str, bool, Duration, Duration)> =
            results.iter().filter(|r| r.0 == name).collect();
        let mut total: Vec<Duration> = ours.iter().map(|r| r.2).collect();
        let mut after_claim: Vec<Duration> = ours.iter().map(|r| r.3).collect();
        total.sort();
        after_claim.sort();
        let in_flight = ours.iter().filter(|r| r.1).count();
        let median = |v: &[Duration]| {
            v.get(v.len() / 2)
                .copied()
                .unwrap_or_default()
                .as_secs_f64()
        };
        let worst = |v: &[Duration]| v.last().copied().unwrap_or_default().as_secs_f64();
        println!(
            "control-plane chaos: {name} restarted {} times ({in_flight} with the replacement in flight); \
             fault to Ready: median {:.2} s, worst {:.2} s; claim Ready to binding Ready: median {:.2} s, worst {:.2} s",
            total.len(),
            median(&total),
            worst(&total),
            median(&after_claim),
            worst(&after_claim),
        );
    }
    println!(
        "control-plane chaos: final generation {generation}, at most {max} live claim(s), {} generation changes observed, {restarted_replicas} replica(s) restarted after losing the lease",
        seen.len()
    );
    drop_finalizers(&ns.name);
}
