//! Issue 19, end to end: the real `harness-engine operator` process, SIGKILLed and
//! started again on the same data directory twenty times, with six bindings on the
//! local control plane (real API server, real Agent Sandbox controller, kwok pods) and
//! worker pods deleted before, during and after a replacement around each kill.
//!
//! Asserted, as a user of `kubectl wait --for=condition=Ready` would see it: after every
//! start, every binding is Ready on a live pod, each touched one at a higher lease
//! generation, within 15 s (the periodic recheck of a Ready binding comes after 60 s,
//! so it cannot be what recovered them); a binding whose verified pod was deleted while
//! no operator ran goes `Ready=False` (replaced because `WorkerPodLost`) before it is
//! Ready again, with a Warning Event; lease generations never go back.
//! Timings are reported by `make bench-operator`, not asserted here beyond the 15 s.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::{Api, api::ListParams};

const BINDINGS: usize = 6;
const RESTARTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_lose_no_binding_and_ready_turns_false_while_the_verified_pod_is_gone() {
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "op-restart").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = common::restarts::run(
        &client,
        &ns.name,
        &dir.path().join("data"),
        BINDINGS,
        RESTARTS,
        Duration::from_secs(15),
    )
    .await;

    assert_eq!(out.restarts.len(), RESTARTS);
    for (i, r) in out.restarts.iter().enumerate() {
        eprintln!(
            "restart {i:2} ({:6}, mid-replacement {}): recovered in {:?}",
            r.when, r.mid_replacement, r.recovery
        );
    }
    assert!(
        out.restarts
            .iter()
            .any(|r| r.when == "during" && r.mid_replacement),
        "no kill landed in the middle of a replacement; the `during` rounds proved nothing"
    );

    for (i, r) in out.restarts.iter().enumerate() {
        // The second touched binding had its verified pod deleted while no operator ran:
        // after the start, its status says so before it is Ready again.
        let (name, before) = &r.touched[1];
        let seen = out.seen.get(name).cloned().unwrap_or_default();
        let after: Vec<_> = seen.iter().filter(|s| s.at >= r.started).collect();
        let first_ready = after
            .iter()
            .position(|s| s.ready && s.generation > *before)
            .unwrap_or_else(|| panic!("restart {i}: {name} never seen Ready again: {seen:?}"));
        let told = after[..first_ready].iter().any(|s| {
            !s.ready
                && s.generation > *before
                && matches!(s.replaced.as_deref(), Some("WorkerPodLost" | "SandboxLost"))
        });
        assert!(
            told,
            "restart {i}: {name} went from generation {before} to Ready without saying \
             Ready=False (WorkerPodLost) while its verified pod was gone: {:?}",
            &after[..=first_ready]
        );
    }
    for (name, seen) in &out.seen {
        assert!(
            seen.windows(2).all(|w| w[0].generation <= w[1].generation),
            "the lease generation of {name} went back: {seen:?}"
        );
    }

    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    let lost = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("WorkerPodLost") && e.type_.as_deref() == Some("Warning")
        })
        .count();
    assert!(lost > 0, "no WorkerPodLost Warning Event was published");
    assert!(!out.log.is_empty());
    common::operator::drop_finalizers(&ns.name);
}
