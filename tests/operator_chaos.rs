//! Controller chaos: two `harness-engine operator` replicas with leader election against
//! the local control plane, sharing a MongoDB store (FerretDB); again and again a worker pod is deleted, and as soon as the
//! replacement has started (a new lease generation written, not yet Ready) the current
//! leader is SIGKILLed and a fresh replica started in its place. Watches record every
//! claim and every lease generation the whole time. Invariants: never two live claims
//! for the binding, the lease generation never goes back and rises with every
//! replacement, and the binding is Ready again after each kill (the worst and median
//! time back to Ready are printed). The run goes on until the wanted number of kills
//! landed while a replacement was in flight.
//!
//! `make test` runs 5 kills; `HARNESS_CHAOS_LEADER_KILLS=50 cargo test --test
//! operator_chaos` is the long run recorded in docs/reliability.md.

mod common;

use std::time::{Duration, Instant};

use common::{
    eventually,
    operator::{Operator, apply_samples, chaos_replica, drop_finalizers, live_claims},
};
use harness_engine::api::{HarnessBinding, Lifecycle, conditions, sandbox::SandboxClaim};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::DeleteParams};

const BINDING: &str = "conversation-sample";
const LEASE_SECONDS: u64 = 2;

fn replica(ns: &str, data: &std::path::Path) -> Operator {
    chaos_replica(ns, data, LEASE_SECONDS)
}

/// Whether `op` says it holds the leader lease (`harness_engine_operator_leader 1`).
async fn leads(http: &reqwest::Client, op: &Operator) -> bool {
    let Ok(resp) = http.get(format!("{}/metrics", op.admin)).send().await else {
        return false;
    };
    resp.text().await.is_ok_and(|t| {
        t.lines()
            .any(|l| l.trim() == "harness_engine_operator_leader 1")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kills_during_replacements_keep_one_live_claim_and_rising_generations() {
    let kills: usize = std::env::var("HARNESS_CHAOS_LEADER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "op-chaos").await;
    apply_samples(&ns.name);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let http = reqwest::Client::new();

    let mut replicas = vec![replica(&ns.name, &data), replica(&ns.name, &data)];
    let ready_above = |above: i64| {
        let bindings = bindings.clone();
        async move {
            eventually(
                Duration::from_secs(120),
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

    // Every claim event and every lease generation, for the whole run.
    let watch =
        common::lease_watch::LeaseWatch::start(claims.clone(), bindings.clone(), &uid, BINDING);

    let mut generation = first
        .status
        .and_then(|s| s.lease)
        .map(|l| l.generation)
        .unwrap_or(0);
    let mut back_to_ready = Vec::new();
    let mut mid_replacement = 0usize;
    let mut pauses = 0usize;
    // Until `kills` leaders died while a replacement was in flight (a replacement that
    // finished before the kill landed does not count, but its kill still happens).
    let mut kill = 0;
    while mid_replacement < kills {
        kill += 1;
        assert!(
            kill <= 3 * kills,
            "only {mid_replacement} of {kill} kills hit a replacement in flight"
        );
        // The leader before the pod goes, so the kill follows the new generation at once.
        let leader = eventually(Duration::from_secs(30), "a leader", || async {
            for (i, op) in replicas.iter().enumerate() {
                if leads(&http, op).await {
                    return Some(i);
                }
            }
            None
        })
        .await;
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
                "kill {kill}: no replacement started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        if started != Some(Lifecycle::Ready) {
            mid_replacement += 1;
        }
        let t = Instant::now();
        // Every third round the leader is paused instead (SIGSTOP): another replica
        // takes over once its lease expires; resumed afterwards, the old leader must
        // see it lost the lease and exit, and must not have broken anything meanwhile.
        let mut paused = None;
        if kill % 3 == 0 {
            replicas[leader].signal("STOP");
            paused = Some(replicas.remove(leader));
            pauses += 1;
        } else {
            replicas[leader].kill();
            replicas.remove(leader);
        }
        replicas.push(replica(&ns.name, &data));
        let b = ready_above(generation).await;
        back_to_ready.push(t.elapsed());
        if let Some(mut old) = paused {
            old.signal("CONT");
            let exited = tokio::task::block_in_place(|| old.exits_within(Duration::from_secs(20)));
            assert!(
                exited,
                "round {kill}: the resumed old leader kept running after losing its lease:\n{}",
                old.log_text()
            );
            assert!(
                old.log_text().contains("lost the leader lease"),
                "round {kill}: {}",
                old.log_text()
            );
        }
        generation = b
            .status
            .and_then(|s| s.lease)
            .map(|l| l.generation)
            .unwrap_or(0);
        let live_now = live_claims(&claims, &uid).await;
        assert!(live_now <= 1, "kill {kill}: {live_now} live claims");
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
    assert!(
        generation > i64::try_from(kill).unwrap_or(i64::MAX),
        "{kill} replacements should have raised the generation past {kill}: {generation}"
    );
    assert!(max <= 1, "{max} live claims for one binding were observed");
    back_to_ready.sort();
    let worst = back_to_ready.last().copied().unwrap_or_default();
    let median = back_to_ready
        .get(back_to_ready.len() / 2)
        .copied()
        .unwrap_or_default();
    println!(
        "controller chaos: {kill} rounds, the leader killed or paused ({pauses} paused) with the replacement in flight in {mid_replacement}, final generation {generation}, \
         back to Ready: median {:.2} s, worst {:.2} s; at most {max} live claim(s); {} generation changes observed",
        median.as_secs_f64(),
        worst.as_secs_f64(),
        seen.len()
    );
    drop_finalizers(&ns.name);
}
