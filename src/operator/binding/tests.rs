//! Table tests of `decide`: every row of the lease lifecycle and every failure the e2e
//! suites drive, on hand-built snapshots. The reads a decision asks for are answered
//! from a described world ([`World`]), so each row also shows which live and store reads
//! the rule needs (e.g. a live read before a worker is replaced on a cache's word).

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time},
    jiff::Timestamp,
};
use serde_json::json;

use super::{
    decide::{self, Decision, Effect, Need, Next, OnStale, Plan, Tally},
    observe::{self, Carry, HeadRead, HeadSeen, Objects, Snapshot, StoreSeen},
    reason::{self, Reason, Use},
    *,
};
use crate::{
    api::{
        HarnessBinding, HarnessBindingStatus, Lease, Lifecycle, SandboxProfile,
        conditions::{self, FALSE, TRUE},
        sandbox::{ClaimedSandbox, Sandbox, SandboxClaim, SandboxClaimStatus, SandboxStatus},
    },
    domain::state::Durability,
    store::ClearReport,
};

const DIGEST: &str = "sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e";
const OTHER_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";
const ID: &str = "hb_0123456789abcdef0123456789abcdef";
const B_UID: &str = "binding-uid";

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The moment every row decides at.
fn now() -> Time {
    at(10_000)
}

fn id() -> BindingId {
    BindingId::parse(ID).unwrap()
}

fn claim1() -> String {
    claim_name(&id(), 1)
}

fn ready_condition(ready: bool, since: Time) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: if ready { TRUE } else { FALSE }.into(),
        reason: "R".into(),
        message: String::new(),
        last_transition_time: since,
        observed_generation: None,
    }
}

fn controller(kind: &str, name: &str, uid: &str) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]
}

fn binding(status: Option<HarnessBindingStatus>) -> HarnessBinding {
    let mut b: HarnessBinding = serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1",
        "kind": "HarnessBinding",
        "metadata": {"name": "conv", "namespace": "team-a", "uid": B_UID, "generation": 1},
        "spec": {
            "agentId": "agent", "conversationId": "c1",
            "subjectRef": format!("hmac-sha256:{}", "ab".repeat(32)),
            "harness": {"id": "deepagents", "contractVersion": 1},
            "sandboxProfileRef": {"name": "python-worker"},
        }
    }))
    .unwrap();
    b.status = status;
    b
}

fn profile() -> SandboxProfile {
    let mut p: SandboxProfile = serde_json::from_value(json!({
        "apiVersion": "harness-engine.dev/v1alpha1",
        "kind": "SandboxProfile",
        "metadata": {"name": "python-worker", "namespace": "team-a"},
        "spec": {
            "warmPoolRef": {"name": "pool"},
            "allowedHarnessIds": ["deepagents"],
            "allowedWorkerImageDigests": [DIGEST],
            "adapterVersion": "1.0.0",
            "workerProtocolVersions": [1],
            "egressPolicyClass": "data-plane-only",
            "timeouts": {"claimReadinessDeadline": "2m", "idleTTL": "30m", "maxLifetime": "12h"},
            "hibernation": "suspend",
        }
    }))
    .unwrap();
    p.status = Some(Default::default());
    if let Some(s) = p.status.as_mut() {
        s.conditions.push(ready_condition(true, at(0)));
    }
    p
}

fn claim(ready: bool) -> SandboxClaim {
    let mut c = SandboxClaim::new(&claim1(), Default::default());
    c.metadata.namespace = Some("team-a".into());
    c.metadata.uid = Some("claim-uid".into());
    c.metadata.owner_references = Some(controller("HarnessBinding", "conv", B_UID));
    c.status = Some(SandboxClaimStatus {
        conditions: vec![ready_condition(ready, at(9_000))],
        sandbox: Some(ClaimedSandbox {
            name: "sb-1".into(),
        }),
    });
    c
}

fn sandbox(ready: bool) -> Sandbox {
    let mut s = Sandbox::new("sb-1", Default::default());
    s.metadata.namespace = Some("team-a".into());
    s.metadata.uid = Some("sb-uid".into());
    s.metadata.owner_references = Some(controller("SandboxClaim", &claim1(), "claim-uid"));
    s.status = Some(SandboxStatus {
        conditions: vec![ready_condition(ready, at(9_000))],
    });
    s
}

fn pod_with(uid: &str, image: &str, protocol: Option<&str>) -> Pod {
    let mut annotations = serde_json::Map::new();
    if let Some(p) = protocol {
        annotations.insert(
            crate::api::sandbox::PROTOCOL_VERSION_ANNOTATION.into(),
            p.into(),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": "sb-1", "namespace": "team-a", "uid": uid,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Sandbox", "name": "sb-1",
                "uid": "sb-uid", "controller": true}]},
        "status": {"containerStatuses": [{"name": "worker", "image": "worker", "imageID": image,
            "ready": true, "restartCount": 0}]}
    }))
    .unwrap()
}

fn pod() -> Pod {
    pod_with("pod-uid", &format!("registry/worker@{DIGEST}"), Some("1"))
}

/// A lease at `generation` in `lifecycle`, claimed at `claimed_at`.
fn lease(generation: i64, lifecycle: Lifecycle, claimed_at: Time) -> HarnessBindingStatus {
    HarnessBindingStatus {
        lifecycle: Some(lifecycle),
        lease: Some(Lease {
            generation,
            epoch: Some(0),
            claim_name: Some(claim_name(&id(), generation)),
            claimed_at: Some(claimed_at.clone()),
            expires_at: Some(decide::time_plus(
                &claimed_at,
                Duration::from_secs(12 * 3600),
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Ready lease of generation 1 on sb-1 / pod-uid, bound at `ready_at`.
fn bound(lifecycle: Lifecycle, ready_at: Time) -> HarnessBindingStatus {
    let mut s = lease(1, lifecycle, ready_at.clone());
    if let Some(l) = s.lease.as_mut() {
        l.claim_name = Some(claim1());
        l.claim_uid = Some("claim-uid".into());
        l.sandbox_name = Some("sb-1".into());
        l.sandbox_uid = Some("sb-uid".into());
        l.worker_pod_name = Some("sb-1".into());
        l.worker_pod_uid = Some("pod-uid".into());
        l.worker_image_digest = Some(DIGEST.into());
        l.protocol_version = Some(1);
        l.ready_at = Some(ready_at.clone());
        l.last_seen_at = Some(ready_at);
    }
    s
}

/// A hibernated lease (hibernated at t=5000).
fn hibernated() -> HarnessBindingStatus {
    let mut s = bound(Lifecycle::Hibernated, at(0));
    s.conditions.push(Condition {
        type_: HIBERNATED.into(),
        status: TRUE.into(),
        reason: "IdleTTLReached".into(),
        message: String::new(),
        last_transition_time: at(5_000),
        observed_generation: Some(1),
    });
    s
}

fn all_cached() -> Objects {
    Objects {
        claim: Some(claim(true)),
        sandbox: Some(sandbox(true)),
        pod: Some(pod()),
    }
}

fn snap(cached: Objects) -> Snapshot {
    Snapshot {
        id: id(),
        caches: true,
        profile: Some(profile()),
        sandbox_name: cached.sandbox.as_ref().map(|_| "sb-1".to_owned()),
        cached,
        live_lease: None,
        live_sandbox: None,
        live_pod: None,
        store: StoreSeen {
            fence_raised: true,
            fenced_generation: None,
            head: HeadRead::NotRead,
            turn: None,
            last_activity: None,
        },
        profile_claims: None,
        projection_interval: Duration::from_secs(30),
        carry: Carry::default(),
    }
}

/// What the reads a decision asks for find.
struct World {
    live: Objects,
    fenced: i64,
    head: HeadRead,
    last_activity: Option<Time>,
    /// Live claims other bindings hold with the profile.
    profile_claims: usize,
    /// The turn in flight, read with the head.
    turn: Option<observe::TurnSeen>,
}

fn world(live: Objects) -> World {
    World {
        live,
        fenced: 0,
        head: HeadRead::NotDue,
        last_activity: None,
        profile_claims: 0,
        turn: None,
    }
}

/// The labels every claim of `profile()` carries.
fn labels() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([
        (PROFILE_LABEL.to_owned(), "python-worker".to_owned()),
        (EGRESS_CLASS_LABEL.to_owned(), "data-plane-only".to_owned()),
    ])
}

/// Decides, answering each `Need` from `world` as `observe::more` would; the plan and
/// the reads asked, in order.
fn run(b: &HarnessBinding, mut s: Snapshot, w: &World) -> (Result<Plan, Error>, Vec<Need>) {
    let mut needs = Vec::new();
    loop {
        match decide::decide(b, &s, &now()) {
            Err(e) => return (Err(e), needs),
            Ok(Decision::Act(plan)) => return (Ok(plan), needs),
            Ok(Decision::Observe(need)) => {
                assert!(!needs.contains(&need), "{need:?} asked twice");
                needs.push(need);
                match need {
                    Need::StoreGeneration => s.store.fenced_generation = Some(w.fenced),
                    Need::LiveLeaseObjects => s.live_lease = Some(w.live.clone()),
                    Need::LiveSandbox => s.live_sandbox = Some(w.live.sandbox.clone()),
                    Need::LivePod => s.live_pod = Some(w.live.pod.clone()),
                    Need::Head { .. } => {
                        s.store.head = w.head.clone();
                        s.store.turn = w.turn.clone();
                    }
                    Need::LastActivity => s.store.last_activity = Some(w.last_activity.clone()),
                    Need::ProfileClaims => s.profile_claims = Some(w.profile_claims),
                }
            }
        }
    }
}

/// What a row expects; `None` fields are not checked.
#[derive(Default)]
struct Want {
    needs: Vec<Need>,
    /// The lifecycle written; `Some(None)`: no status write at all.
    lifecycle: Option<Option<Lifecycle>>,
    generation: Option<i64>,
    /// (condition type, status, reason) that must be in the written status.
    conditions: Vec<(&'static str, &'static str, Reason)>,
    /// (reason, warning) of every Event, in order.
    events: Option<Vec<(Reason, bool)>>,
    effects: Option<Vec<Effect>>,
    after: Option<Vec<Effect>>,
    next: Option<Next>,
    tally: Option<Vec<Tally>>,
    /// `Some(Some(r))`: `Stalled=True` with reason `r`; `Some(None)`: not `Stalled=True`.
    stalled: Option<Option<Reason>>,
}

struct Case {
    name: &'static str,
    binding: HarnessBinding,
    snap: Snapshot,
    world: World,
    want: Want,
}

fn check(case: Case) {
    let name = case.name;
    let (plan, needs) = run(&case.binding, case.snap, &case.world);
    let plan = plan.unwrap_or_else(|e| panic!("{name}: {e}"));
    let w = case.want;
    assert_eq!(needs, w.needs, "{name}: reads asked");
    if let Some(lifecycle) = w.lifecycle {
        match lifecycle {
            None => assert!(plan.status.is_none(), "{name}: no status write expected"),
            Some(l) => assert_eq!(
                plan.status.as_ref().and_then(|s| s.lifecycle),
                Some(l),
                "{name}: lifecycle"
            ),
        }
    }
    if let Some(g) = w.generation {
        let written = plan
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .map(|l| l.generation);
        assert_eq!(written, Some(g), "{name}: generation");
        let before = case
            .binding
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .map(|l| l.generation);
        assert!(
            before.is_none_or(|b| b <= g),
            "{name}: the generation went back"
        );
    }
    for (type_, status, reason) in &w.conditions {
        let status_written = plan
            .status
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no status"));
        let c = conditions::get(&status_written.conditions, type_)
            .unwrap_or_else(|| panic!("{name}: no {type_} condition"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (*status, reason.as_str()),
            "{name}: {type_}"
        );
    }
    if let Some(events) = w.events {
        let got: Vec<_> = plan.events.iter().map(|e| (e.reason, e.warning)).collect();
        assert_eq!(got, events, "{name}: events");
    }
    if let Some(effects) = w.effects {
        assert_eq!(plan.effects, effects, "{name}: effects");
    }
    if let Some(after) = w.after {
        assert_eq!(plan.after, after, "{name}: effects after the status");
    }
    if let Some(next) = w.next {
        assert_eq!(plan.next, next, "{name}: next");
    }
    if let Some(tally) = w.tally {
        assert_eq!(plan.tally, tally, "{name}: tally");
    }
    if let Some(stalled) = w.stalled {
        let got = plan
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, crate::operator::failure::STALLED))
            .filter(|c| c.status == TRUE)
            .map(|c| c.reason.clone());
        assert_eq!(
            got.as_deref(),
            stalled.map(Reason::as_str),
            "{name}: Stalled"
        );
    }
    declared(name, &plan);
}

/// Every condition and Event of a plan uses its reason where the reason says it may.
fn declared(name: &str, plan: &Plan) {
    for c in plan.status.iter().flat_map(|s| s.conditions.iter()) {
        let reason = Reason::ALL
            .iter()
            .find(|r| r.as_str() == c.reason)
            .unwrap_or_else(|| panic!("{name}: reason {} is not a Reason", c.reason));
        let used = match c.status.as_str() {
            TRUE => Use::True(leak(&c.type_)),
            _ => Use::False(leak(&c.type_)),
        };
        assert!(
            reason.uses().contains(&used),
            "{name}: {reason} used as {used:?}, not declared"
        );
    }
    for e in &plan.events {
        let used = if e.warning { Use::Warning } else { Use::Normal };
        assert!(
            e.reason.uses().contains(&used),
            "{name}: Event {} as {used:?}, not declared",
            e.reason
        );
    }
    for t in &plan.tally {
        if let Tally::Waited(r) = t {
            assert!(
                r.uses().contains(&Use::Wait),
                "{name}: wait {r} not declared"
            );
        }
    }
}

fn leak(type_: &str) -> &'static str {
    [
        READY,
        SANDBOX_READY,
        WORKER_VERIFIED,
        PROFILE_ACCEPTED,
        STATE_DURABLE,
        EFFECTS_SETTLED,
        REPLACED,
        HIBERNATED,
        crate::operator::failure::STALLED,
    ]
    .into_iter()
    .find(|t| *t == type_)
    .unwrap_or("unknown condition type")
}

fn with_carry(mut s: Snapshot, f: impl FnOnce(&mut Carry)) -> Snapshot {
    f(&mut s.carry);
    s
}

fn claiming_cached(claim: Option<SandboxClaim>, sb: Option<Sandbox>, pod: Option<Pod>) -> Snapshot {
    snap(Objects {
        claim,
        sandbox: sb,
        pod,
    })
}

#[test]
fn the_lease_is_claimed_fenced_and_bound_in_order() {
    let started = at(9_950);
    let claiming = || binding(Some(lease(1, Lifecycle::Claiming, started.clone())));
    let cases = vec![
        Case {
            name: "a new binding starts its first lease (generation 1), claim to follow",
            binding: binding(None),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Claiming)),
                generation: Some(1),
                conditions: vec![
                    (READY, FALSE, Reason::Claiming),
                    (SANDBOX_READY, FALSE, Reason::ClaimNotReady),
                    (WORKER_VERIFIED, FALSE, Reason::Claiming),
                    (PROFILE_ACCEPTED, TRUE, Reason::ProfileAccepted),
                    (crate::operator::failure::STALLED, FALSE, Reason::Accepted),
                ],
                stalled: Some(None),
                events: Some(vec![(Reason::LeaseStarted, false)]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "a first lease never starts below the store's fence (a data-plane bind)",
            binding: binding(None),
            snap: snap(Objects::default()),
            world: World {
                fenced: 3,
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::StoreGeneration],
                generation: Some(3),
                ..Default::default()
            },
        },
        Case {
            name: "claiming, fence not raised by this process: the fence first, nothing else",
            binding: claiming(),
            snap: {
                let mut s = snap(Objects::default());
                s.store.fence_raised = false;
                s
            },
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(None),
                effects: Some(vec![Effect::RaiseFence {
                    epoch: 0,
                    generation: 1,
                    on_stale: OnStale::Report,
                }]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "claiming, claim not in the cache: create it",
            binding: claiming(),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(None),
                effects: Some(vec![Effect::CreateClaim {
                    name: claim1(),
                    pool: "pool".into(),
                    generation: 1,
                    labels: labels(),
                }]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn the_claim_is_created_released_and_bound() {
    let started = at(9_950);
    let claiming = || binding(Some(lease(1, Lifecycle::Claiming, started.clone())));
    let cases = vec![
        Case {
            name: "replacing at generation 2: older claims are released before the claim exists",
            binding: binding(Some(lease(2, Lifecycle::Replacing, started.clone()))),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(None),
                effects: Some(vec![Effect::ReleaseClaims {
                    keep: Some(claim_name(&id(), 2)),
                    generation: 2,
                }]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "released in this reconcile already: on to the claim",
            binding: binding(Some(lease(2, Lifecycle::Replacing, started.clone()))),
            snap: with_carry(snap(Objects::default()), |c| c.released = Some(2)),
            world: world(Objects::default()),
            want: Want {
                effects: Some(vec![Effect::CreateClaim {
                    name: claim_name(&id(), 2),
                    pool: "pool".into(),
                    generation: 2,
                    labels: labels(),
                }]),
                ..Default::default()
            },
        },
        Case {
            name: "claim not Ready: SandboxReady says so, wait until the deadline",
            binding: claiming(),
            snap: claiming_cached(Some(claim(false)), None, None),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(Some(Lifecycle::Claiming)),
                conditions: vec![(SANDBOX_READY, FALSE, Reason::ClaimNotReady)],
                // Claimed 50 s ago with a 2 min deadline.
                next: Some(Next::Requeue(Duration::from_secs(70))),
                tally: Some(vec![Tally::Waited(Reason::ClaimNotReady)]),
                ..Default::default()
            },
        },
        Case {
            name: "claim Ready, Sandbox and pod Ready in the cache, worker allowed: Ready",
            binding: claiming(),
            snap: claiming_cached(Some(claim(true)), Some(sandbox(true)), Some(pod())),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: true }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                generation: Some(1),
                conditions: vec![
                    (READY, TRUE, Reason::LeaseReady),
                    (SANDBOX_READY, TRUE, Reason::SandboxReady),
                    (WORKER_VERIFIED, TRUE, Reason::WorkerVerified),
                ],
                events: Some(vec![(Reason::LeaseReady, false)]),
                tally: Some(vec![Tally::Bound]),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

/// `b` with `f` applied (annotations, epoch, ...).
fn edit(mut b: HarnessBinding, f: impl FnOnce(&mut HarnessBinding)) -> HarnessBinding {
    f(&mut b);
    b
}

fn with_profile(mut s: Snapshot, f: impl FnOnce(&mut SandboxProfile)) -> Snapshot {
    if let Some(p) = s.profile.as_mut() {
        f(p);
    }
    s
}

fn resume_at(b: &mut HarnessBinding, t: Time) {
    b.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(RESUME_ANNOTATION.into(), t.0.to_string());
}

fn objects(claim: Option<SandboxClaim>, sandbox: Option<Sandbox>, pod: Option<Pod>) -> Objects {
    Objects {
        claim,
        sandbox,
        pod,
    }
}

/// The failure of a Ready lease that replaces its worker: a live read confirms what the
/// caches say first, then a new generation above the store's fence.
fn replaced_by(name: &'static str, cached: Objects, live: Objects, why: Reason) -> Case {
    Case {
        name,
        binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
        snap: snap(cached),
        world: world(live),
        want: Want {
            needs: vec![Need::LiveLeaseObjects, Need::StoreGeneration],
            lifecycle: Some(Some(Lifecycle::Replacing)),
            generation: Some(2),
            conditions: vec![
                (READY, FALSE, Reason::Replacing),
                (SANDBOX_READY, FALSE, Reason::ClaimNotReady),
                (REPLACED, TRUE, why),
                (WORKER_VERIFIED, FALSE, Reason::Claiming),
            ],
            events: Some(vec![(why, true), (Reason::Replacing, true)]),
            next: Some(Next::Continue),
            tally: Some(vec![Tally::Replacement]),
            ..Default::default()
        },
    }
}

#[test]
fn a_ready_lease_whose_worker_is_gone_is_replaced_after_a_live_read() {
    let cases = vec![
        replaced_by(
            "worker pod deleted (cache and live agree)",
            objects(Some(claim(true)), Some(sandbox(true)), None),
            objects(Some(claim(true)), Some(sandbox(true)), None),
            Reason::WorkerPodLost,
        ),
        replaced_by(
            "worker pod recreated under the same Sandbox: a new process is a new worker",
            objects(
                Some(claim(true)),
                Some(sandbox(true)),
                Some(pod_with("pod-uid-2", &format!("w@{DIGEST}"), Some("1"))),
            ),
            objects(
                Some(claim(true)),
                Some(sandbox(true)),
                Some(pod_with("pod-uid-2", &format!("w@{DIGEST}"), Some("1"))),
            ),
            Reason::WorkerPodLost,
        ),
        replaced_by(
            "Sandbox deleted",
            objects(Some(claim(true)), None, None),
            objects(Some(claim(true)), None, None),
            Reason::SandboxLost,
        ),
        replaced_by(
            "Sandbox no longer Ready",
            objects(Some(claim(true)), Some(sandbox(false)), Some(pod())),
            objects(Some(claim(true)), Some(sandbox(false)), Some(pod())),
            Reason::SandboxFailed,
        ),
        replaced_by(
            "claim deleted",
            Objects::default(),
            Objects::default(),
            Reason::ClaimLost,
        ),
        Case {
            name: "the cache says the pod is gone, the API server says it is there: no replacement",
            binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
            snap: snap(objects(Some(claim(true)), Some(sandbox(true)), None)),
            world: world(all_cached()),
            want: Want {
                needs: vec![Need::LiveLeaseObjects, Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                generation: Some(1),
                events: Some(vec![]),
                ..Default::default()
            },
        },
        Case {
            name: "the store fences generation 4 already: the replacement moves past it",
            binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
            snap: snap(objects(Some(claim(true)), Some(sandbox(true)), None)),
            world: World {
                fenced: 4,
                ..world(objects(Some(claim(true)), Some(sandbox(true)), None))
            },
            want: Want {
                needs: vec![Need::LiveLeaseObjects, Need::StoreGeneration],
                generation: Some(4),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn a_ready_or_busy_lease_is_kept_projected_hibernated_or_renewed() {
    let head = |uncertain_runs| {
        HeadRead::Present(HeadSeen {
            revision: 7,
            committed_at_ms: at(9_500).0.as_millisecond(),
            durability: Durability::Committed,
            uncertain_runs,
        })
    };
    let cases = vec![
        Case {
            name: "ready, worker in place, head not due: nothing to write, look again in 30 s",
            binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                generation: Some(1),
                events: Some(vec![]),
                effects: Some(vec![]),
                next: Some(Next::Requeue(Duration::from_secs(30))),
                ..Default::default()
            },
        },
        Case {
            name: "busy (a turn in flight) is kept as it is",
            binding: binding(Some(bound(Lifecycle::Busy, at(9_000)))),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Busy)),
                events: Some(vec![]),
                ..Default::default()
            },
        },
        Case {
            name: "a committed head is projected into StateDurable",
            binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
            snap: snap(all_cached()),
            world: World {
                head: head(0),
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::Head { force: false }],
                conditions: vec![(STATE_DURABLE, TRUE, Reason::HeadCommitted)],
                ..Default::default()
            },
        },
        Case {
            name: "an uncertain run after the head: StateDurable=False RunUncertain",
            binding: binding(Some(bound(Lifecycle::Ready, at(9_000)))),
            snap: snap(all_cached()),
            world: World {
                head: head(2),
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::Head { force: false }],
                conditions: vec![(STATE_DURABLE, FALSE, Reason::RunUncertain)],
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn a_ready_lease_is_hibernated_or_renewed_and_its_activity_seen() {
    let expired = {
        let mut s = bound(Lifecycle::Ready, at(9_000));
        if let Some(l) = s.lease.as_mut() {
            l.expires_at = Some(at(9_999));
        }
        s
    };
    let cases = vec![
        Case {
            name: "idle past the idle TTL (no commit, no bind, no store write): hibernated",
            binding: binding(Some(bound(Lifecycle::Ready, at(0)))),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }, Need::LastActivity],
                lifecycle: Some(Some(Lifecycle::Hibernated)),
                conditions: vec![
                    (HIBERNATED, TRUE, Reason::IdleTTLReached),
                    (READY, FALSE, Reason::Hibernated),
                    (SANDBOX_READY, FALSE, Reason::Suspended),
                ],
                events: Some(vec![(Reason::Hibernated, false)]),
                effects: Some(vec![Effect::SetOperatingMode {
                    sandbox: "sb-1".into(),
                    mode: "Suspended",
                }]),
                ..Default::default()
            },
        },
        Case {
            name: "idle by the head, but the store saw a write: not hibernated, lastSeenAt moves",
            binding: binding(Some(bound(Lifecycle::Ready, at(0)))),
            snap: snap(all_cached()),
            world: World {
                last_activity: Some(at(9_500)),
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::Head { force: false }, Need::LastActivity],
                lifecycle: Some(Some(Lifecycle::Ready)),
                events: Some(vec![]),
                effects: Some(vec![]),
                ..Default::default()
            },
        },
        Case {
            name: "max lifetime reached: a routine replacement (Normal Event)",
            binding: binding(Some(expired)),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(2),
                conditions: vec![(REPLACED, TRUE, Reason::MaxLifetimeReached)],
                events: Some(vec![(Reason::Replacing, false)]),
                tally: Some(vec![Tally::Replacement]),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
    // The store write moved lastSeenAt.
    let (plan, _) = run(
        &binding(Some(bound(Lifecycle::Ready, at(0)))),
        snap(all_cached()),
        &World {
            last_activity: Some(at(9_500)),
            ..world(Objects::default())
        },
    );
    let seen = plan
        .ok()
        .and_then(|p| p.status)
        .and_then(|s| s.lease)
        .and_then(|l| l.last_seen_at);
    assert_eq!(seen, Some(at(9_500)));
}

/// A claiming lease at generation 1 whose claim, Sandbox and pod are in the cache.
fn verifying(name: &'static str, pod: Pod, why: Reason) -> Case {
    Case {
        name,
        binding: binding(Some(lease(1, Lifecycle::Claiming, at(9_950)))),
        snap: claiming_cached(Some(claim(true)), Some(sandbox(true)), Some(pod)),
        world: world(Objects::default()),
        want: Want {
            lifecycle: Some(Some(Lifecycle::Failed)),
            generation: Some(1),
            conditions: vec![
                (WORKER_VERIFIED, FALSE, why),
                (READY, FALSE, Reason::WorkerRejected),
                (SANDBOX_READY, TRUE, Reason::SandboxReady),
            ],
            events: Some(vec![(why, true)]),
            effects: Some(vec![]),
            next: Some(Next::Requeue(Duration::from_secs(60))),
            ..Default::default()
        },
    }
}

#[test]
fn a_worker_the_profile_does_not_allow_is_never_bound() {
    let image = format!("registry/worker@{DIGEST}");
    let cases = vec![
        verifying(
            "image digest not in allowedWorkerImageDigests",
            pod_with(
                "pod-uid",
                &format!("registry/worker@{OTHER_DIGEST}"),
                Some("1"),
            ),
            Reason::ImageDigestNotAllowed,
        ),
        verifying(
            "protocol version not in workerProtocolVersions",
            pod_with("pod-uid", &image, Some("2")),
            Reason::ProtocolVersionNotAllowed,
        ),
        verifying(
            "no protocol version annotation",
            pod_with("pod-uid", &image, None),
            Reason::ProtocolVersionMissing,
        ),
        verifying(
            "a protocol version that is not a number",
            pod_with("pod-uid", &image, Some("one")),
            Reason::ProtocolVersionInvalid,
        ),
        {
            let mut case = verifying(
                "already failed for the same worker: no second Warning",
                pod_with("pod-uid", &image, Some("2")),
                Reason::ProtocolVersionNotAllowed,
            );
            case.binding = binding(Some(lease(1, Lifecycle::Failed, at(9_950))));
            case.want.events = Some(vec![]);
            case
        },
        Case {
            name: "a claim of this generation's name owned by someone else: ClaimConflict",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(9_950)))),
            snap: {
                let mut c = claim(true);
                c.metadata.owner_references = Some(controller("HarnessBinding", "x", "other"));
                claiming_cached(Some(c), None, None)
            },
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(Some(Lifecycle::Failed)),
                conditions: vec![
                    (READY, FALSE, Reason::ClaimConflict),
                    (SANDBOX_READY, FALSE, Reason::ClaimConflict),
                ],
                effects: Some(vec![]),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn a_claim_or_worker_late_past_the_deadline_is_replaced() {
    let unknown = pod_with("pod-uid", "", Some("1"));
    let cases = vec![
        Case {
            name: "claim not Ready within claimReadinessDeadline: a new generation (Warning)",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(0)))),
            snap: claiming_cached(Some(claim(false)), None, None),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(2),
                conditions: vec![(REPLACED, TRUE, Reason::ClaimReadinessDeadlineExceeded)],
                events: Some(vec![(Reason::Replacing, true)]),
                ..Default::default()
            },
        },
        Case {
            name: "a pod with no image digest yet, within the deadline: still starting",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(9_950)))),
            snap: claiming_cached(
                Some(claim(true)),
                Some(sandbox(true)),
                Some(unknown.clone()),
            ),
            world: world(objects(None, None, Some(unknown.clone()))),
            want: Want {
                needs: vec![Need::LivePod],
                lifecycle: Some(Some(Lifecycle::Claiming)),
                conditions: vec![(SANDBOX_READY, FALSE, Reason::SandboxNotReady)],
                tally: Some(vec![Tally::Waited(Reason::SandboxNotReady)]),
                ..Default::default()
            },
        },
        Case {
            name: "a pod with no image digest past the deadline: rejected",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(0)))),
            snap: claiming_cached(
                Some(claim(true)),
                Some(sandbox(true)),
                Some(unknown.clone()),
            ),
            world: world(objects(None, None, Some(unknown))),
            want: Want {
                needs: vec![Need::LivePod],
                lifecycle: Some(Some(Lifecycle::Failed)),
                conditions: vec![(WORKER_VERIFIED, FALSE, Reason::WorkerImageUnknown)],
                events: Some(vec![(Reason::WorkerImageUnknown, true)]),
                ..Default::default()
            },
        },
        Case {
            name: "claim Ready, Sandbox not Ready in the cache: one live read of the Sandbox",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(9_950)))),
            snap: claiming_cached(Some(claim(true)), Some(sandbox(false)), Some(pod())),
            world: world(objects(None, Some(sandbox(true)), None)),
            want: Want {
                needs: vec![Need::LiveSandbox, Need::Head { force: true }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                ..Default::default()
            },
        },
        Case {
            name: "the store refused the fence as stale (a restored store): past it",
            binding: binding(Some(lease(1, Lifecycle::Claiming, at(9_950)))),
            snap: with_carry(snap(Objects::default()), |c| c.fence_ahead = Some(1)),
            world: World {
                fenced: 6,
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(6),
                conditions: vec![(REPLACED, TRUE, Reason::FenceAhead)],
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

/// A profile refusal: the binding fails (no lease yet), `ProfileAccepted=False`.
fn refused(name: &'static str, snap: Snapshot, why: Reason, warning: bool) -> Case {
    Case {
        name,
        binding: binding(None),
        snap,
        world: world(Objects::default()),
        want: Want {
            lifecycle: Some(Some(Lifecycle::Failed)),
            conditions: vec![
                (PROFILE_ACCEPTED, FALSE, why),
                (READY, FALSE, Reason::ProfileNotAccepted),
            ],
            stalled: Some(warning.then_some(why)),
            events: Some(if warning { vec![(why, true)] } else { vec![] }),
            effects: Some(vec![]),
            next: Some(Next::Requeue(Duration::from_secs(60))),
            ..Default::default()
        },
    }
}

#[test]
fn a_profile_that_does_not_accept_the_binding_stops_it_before_any_claim() {
    let missing = Snapshot {
        profile: None,
        ..snap(Objects::default())
    };
    let cases = vec![
        refused("profile missing", missing, Reason::ProfileNotFound, true),
        refused(
            "profile disabled",
            with_profile(snap(Objects::default()), |p| p.spec.enabled = false),
            Reason::ProfileDisabled,
            true,
        ),
        refused(
            "harness not allowed",
            with_profile(snap(Objects::default()), |p| {
                p.spec.allowed_harness_ids.clear()
            }),
            Reason::HarnessNotAllowed,
            true,
        ),
        refused(
            "profile not Ready",
            with_profile(snap(Objects::default()), |p| {
                p.status = Some(Default::default())
            }),
            Reason::ProfileNotReady,
            false,
        ),
    ];
    for case in cases {
        check(case);
    }
    // A bound lease keeps its lifecycle while its profile is refused.
    let (plan, _) = run(
        &binding(Some(bound(Lifecycle::Ready, at(9_000)))),
        with_profile(snap(all_cached()), |p| p.spec.enabled = false),
        &world(Objects::default()),
    );
    let lifecycle = plan.ok().and_then(|p| p.status).and_then(|s| s.lifecycle);
    assert_eq!(lifecycle, Some(Lifecycle::Ready));
    // A timeout the store cannot read is an invalid spec, not a plan.
    let invalid = with_profile(snap(Objects::default()), |p| {
        p.spec.timeouts.claim_readiness_deadline = "soon".into()
    });
    let (plan, _) = run(&binding(None), invalid, &world(Objects::default()));
    match plan {
        Err(Error::Invalid(message)) => assert!(message.contains("claimReadinessDeadline")),
        other => panic!("an unreadable timeout must be refused: {other:?}"),
    }
}

#[test]
fn a_hibernated_lease_resumes_only_on_a_bind_after_the_hibernation() {
    let hib = |resume: Option<Time>| {
        edit(binding(Some(hibernated())), |b| {
            if let Some(t) = resume {
                resume_at(b, t);
            }
        })
    };
    let cases = vec![
        Case {
            name: "hibernated, no bind: stays, state projected, rechecked in 5 min",
            binding: hib(None),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Hibernated)),
                effects: Some(vec![]),
                next: Some(Next::Requeue(Duration::from_secs(300))),
                ..Default::default()
            },
        },
        Case {
            name: "a resume request older than the hibernation is ignored",
            binding: hib(Some(at(4_000))),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Hibernated)),
                ..Default::default()
            },
        },
        Case {
            name: "resume: a new generation on the same claim, then the fence, then Running",
            binding: hib(Some(at(6_000))),
            snap: snap(Objects::default()),
            world: world(objects(None, Some(sandbox(true)), None)),
            want: Want {
                needs: vec![Need::LiveSandbox],
                lifecycle: Some(Some(Lifecycle::Claiming)),
                generation: Some(2),
                conditions: vec![
                    (HIBERNATED, FALSE, Reason::Resumed),
                    (READY, FALSE, Reason::Resuming),
                    (SANDBOX_READY, FALSE, Reason::Resuming),
                ],
                events: Some(vec![(Reason::Resuming, false)]),
                effects: Some(vec![]),
                after: Some(vec![
                    Effect::RaiseFence {
                        epoch: 0,
                        generation: 2,
                        on_stale: OnStale::Fail,
                    },
                    Effect::SetOperatingMode {
                        sandbox: "sb-1".into(),
                        mode: "Running",
                    },
                ]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "resume, but the Sandbox is gone: a new claim at a new generation",
            binding: hib(Some(at(6_000))),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::LiveSandbox, Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(2),
                conditions: vec![
                    (REPLACED, TRUE, Reason::SandboxLost),
                    (HIBERNATED, FALSE, Reason::NotHibernated),
                ],
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
    // The resumed lease keeps the claim of the hibernated one.
    let (plan, _) = run(
        &hib(Some(at(6_000))),
        snap(Objects::default()),
        &world(objects(None, Some(sandbox(true)), None)),
    );
    let claim = plan
        .ok()
        .and_then(|p| p.status)
        .and_then(|s| s.lease)
        .and_then(|l| l.claim_name);
    assert_eq!(claim, Some(claim1()));
}

#[test]
fn raising_the_epoch_clears_the_store_then_starts_a_fresh_lease() {
    let epoch1 = |status| edit(binding(Some(status)), |b| b.spec.epoch = 1);
    let clearing = || {
        let mut s = bound(Lifecycle::Clearing, at(9_000));
        s.lifecycle = Some(Lifecycle::Clearing);
        s
    };
    let report = ClearReport {
        epoch: 1,
        states_deleted: 3,
        objects_deleted: 1,
        stream_entries_deleted: 9,
    };
    let cases = vec![
        Case {
            name: "epoch raised on a Ready lease: say so first (one write)",
            binding: epoch1(bound(Lifecycle::Ready, at(9_000))),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(Some(Lifecycle::Clearing)),
                conditions: vec![(READY, FALSE, Reason::Clearing)],
                events: Some(vec![(Reason::ClearStarted, false)]),
                effects: Some(vec![]),
                next: Some(Next::Requeue(Duration::ZERO)),
                ..Default::default()
            },
        },
        Case {
            name: "clearing: the store clear, no status write",
            binding: epoch1(clearing()),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(None),
                effects: Some(vec![Effect::ClearStore { epoch: 1 }]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "cleared: a fresh lease for the new epoch (routine, Normal Events)",
            binding: epoch1(clearing()),
            snap: with_carry(snap(all_cached()), |c| c.cleared = Some(report)),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(2),
                conditions: vec![(REPLACED, TRUE, Reason::EpochCleared)],
                events: Some(vec![
                    (Reason::ConversationCleared, false),
                    (Reason::Replacing, false),
                ]),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn a_deleted_binding_says_so_then_revokes_and_releases() {
    let ready = binding(Some(bound(Lifecycle::Ready, at(9_000))));
    let first = decide::release(&ready, &now());
    let status = first.status.clone();
    assert_eq!(
        status.as_ref().and_then(|s| s.lifecycle),
        Some(Lifecycle::Releasing)
    );
    let ready_cond = status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, READY).cloned());
    assert_eq!(
        ready_cond.map(|c| (c.status, c.reason)),
        Some((FALSE.to_owned(), "Releasing".to_owned()))
    );
    assert!(
        first.effects.is_empty(),
        "nothing is released before it is said"
    );
    assert_eq!(first.next, Next::Requeue(Duration::ZERO));
    declared("releasing, first", &first);

    let releasing = binding(status);
    let second = decide::release(&releasing, &now());
    assert_eq!(
        second.effects,
        vec![
            Effect::Revoke {
                epoch: 0,
                generation: 2
            },
            Effect::ReleaseClaims {
                keep: None,
                generation: 1
            },
        ],
        "the last worker is fenced out before its claims go"
    );
    assert!(second.status.is_none());
    assert_eq!(second.next, Next::UntilReleased);
    assert!(second.plain_event_actions);
}

#[test]
fn every_reason_is_camel_case_and_unique() {
    let mut seen = std::collections::BTreeSet::new();
    for r in Reason::ALL {
        let s = r.as_str();
        assert!(
            s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && s.chars().all(|c| c.is_ascii_alphanumeric()),
            "{s} is not CamelCase"
        );
        assert!(seen.insert(s), "{s} twice");
        assert!(!r.uses().is_empty(), "{s} is used nowhere");
    }
}

/// The reason tables of docs/operator.md are generated from [`Reason`]. Regenerate with
/// `HARNESS_ENGINE_BLESS=1 cargo test --locked --lib operator::binding::tests::docs`.
#[test]
fn docs_reason_tables_match_the_reason_enum() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operator.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let table = reason::render_docs();
    if std::env::var_os("HARNESS_ENGINE_BLESS").is_some() {
        let updated = reason::with_generated_part(&doc, &table).unwrap_or_else(|| {
            panic!(
                "{}: no {} ... {} markers",
                path.display(),
                reason::DOCS_BEGIN,
                reason::DOCS_END
            )
        });
        std::fs::write(&path, updated).unwrap();
        return;
    }
    let found = reason::generated_part(&doc)
        .unwrap_or_else(|| panic!("{}: no generated reason tables", path.display()));
    assert_eq!(
        found,
        table.trim_matches('\n'),
        "docs/operator.md's reason tables drifted from src/operator/binding/reason.rs; regenerate: HARNESS_ENGINE_BLESS=1 cargo test --locked --lib operator::binding::tests::docs"
    );
}

#[test]
fn a_fixed_profile_clears_its_stall_and_leaves_the_error_policys_alone() {
    let stalled_with = |reason: &str| {
        let mut s = HarnessBindingStatus::default();
        s.conditions.push(Condition {
            type_: crate::operator::failure::STALLED.into(),
            status: TRUE.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: at(0),
            observed_generation: Some(1),
        });
        s
    };
    let stalled = |status| {
        let (plan, _) = run(
            &binding(Some(status)),
            snap(Objects::default()),
            &world(Objects::default()),
        );
        plan.ok()
            .and_then(|p| p.status)
            .and_then(|s| {
                conditions::get(&s.conditions, crate::operator::failure::STALLED).cloned()
            })
            .map(|c| (c.status, c.reason))
    };
    assert_eq!(
        stalled(stalled_with("ProfileNotFound")),
        Some((FALSE.to_owned(), "Accepted".to_owned())),
        "the profile now exists: no longer stalled on it"
    );
    assert_eq!(
        stalled(stalled_with("InvalidSpec")),
        Some((TRUE.to_owned(), "InvalidSpec".to_owned())),
        "the error policy clears its own Stalled after a successful reconcile"
    );
}

/// The profile's lease rules: hibernation `never` and `release`, `limits.maxActiveLeases`,
/// and the labels every claim carries (docs/crds.md, "SandboxProfile").
#[test]
fn profile_hibernation_policies_decide_what_idleness_does() {
    let policy = |p: &'static str| {
        move |pr: &mut SandboxProfile| {
            pr.spec.hibernation = serde_json::from_value(json!(p)).unwrap();
        }
    };
    let released = || {
        let mut s = hibernated();
        if let Some(c) = s.conditions.iter_mut().find(|c| c.type_ == HIBERNATED) {
            c.reason = Reason::IdleTTLReached.as_str().into();
        }
        s
    };
    let cases = vec![
        Case {
            name: "never: idle far past the idle TTL, the lease stays Ready (no activity read)",
            binding: binding(Some(bound(Lifecycle::Ready, at(0)))),
            snap: with_profile(snap(all_cached()), policy("never")),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                effects: Some(vec![]),
                after: Some(vec![]),
                events: Some(vec![]),
                next: Some(Next::Requeue(Duration::from_secs(30))),
                ..Default::default()
            },
        },
        Case {
            name: "release: idle past the idle TTL, hibernated and the claim released after the status",
            binding: binding(Some(bound(Lifecycle::Ready, at(0)))),
            snap: with_profile(snap(all_cached()), policy("release")),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }, Need::LastActivity],
                lifecycle: Some(Some(Lifecycle::Hibernated)),
                conditions: vec![
                    (HIBERNATED, TRUE, Reason::IdleTTLReached),
                    (READY, FALSE, Reason::Hibernated),
                    (SANDBOX_READY, FALSE, Reason::Released),
                ],
                events: Some(vec![(Reason::Hibernated, false)]),
                effects: Some(vec![]),
                after: Some(vec![Effect::ReleaseClaims {
                    keep: None,
                    generation: 1,
                }]),
                ..Default::default()
            },
        },
        Case {
            name: "release: hibernated but the claim is still there, no bind: delete it again",
            binding: binding(Some(released())),
            snap: with_profile(snap(all_cached()), policy("release")),
            world: world(Objects::default()),
            want: Want {
                lifecycle: Some(None),
                effects: Some(vec![Effect::ReleaseClaims {
                    keep: None,
                    generation: 1,
                }]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
        Case {
            name: "release: hibernated, claim gone, no bind: stays hibernated",
            binding: binding(Some(released())),
            snap: with_profile(snap(Objects::default()), policy("release")),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Hibernated)),
                effects: Some(vec![]),
                ..Default::default()
            },
        },
        Case {
            name: "release: a bind after the release claims a new sandbox at a new generation",
            binding: edit(binding(Some(released())), |b| resume_at(b, at(6_000))),
            snap: with_profile(snap(Objects::default()), policy("release")),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::StoreGeneration],
                lifecycle: Some(Some(Lifecycle::Replacing)),
                generation: Some(2),
                conditions: vec![
                    (REPLACED, TRUE, Reason::Resumed),
                    (HIBERNATED, FALSE, Reason::NotHibernated),
                ],
                events: Some(vec![(Reason::Replacing, false)]),
                next: Some(Next::Continue),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
}

#[test]
fn max_active_leases_holds_a_new_claim_until_one_ends() {
    let limited = |max: i32| {
        move |p: &mut SandboxProfile| {
            p.spec.limits = Some(crate::api::profile::SandboxLimits {
                max_active_leases: Some(max),
                ..Default::default()
            });
        }
    };
    let claiming = || binding(Some(lease(1, Lifecycle::Claiming, at(9_950))));
    let cases = vec![
        Case {
            name: "2 of 2 held by others: Ready=False MaxActiveLeasesReached, no claim, retried",
            binding: claiming(),
            snap: with_profile(snap(Objects::default()), limited(2)),
            world: World {
                profile_claims: 2,
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::ProfileClaims],
                lifecycle: Some(Some(Lifecycle::Claiming)),
                conditions: vec![(READY, FALSE, Reason::MaxActiveLeasesReached)],
                events: Some(vec![(Reason::MaxActiveLeasesReached, true)]),
                effects: Some(vec![]),
                tally: Some(vec![Tally::Waited(Reason::MaxActiveLeasesReached)]),
                next: Some(Next::Requeue(Duration::from_secs(15))),
                ..Default::default()
            },
        },
        Case {
            name: "1 of 2 held: the claim is created",
            binding: claiming(),
            snap: with_profile(snap(Objects::default()), limited(2)),
            world: World {
                profile_claims: 1,
                ..world(Objects::default())
            },
            want: Want {
                needs: vec![Need::ProfileClaims],
                lifecycle: Some(None),
                effects: Some(vec![Effect::CreateClaim {
                    name: claim1(),
                    pool: "pool".into(),
                    generation: 1,
                    labels: labels(),
                }]),
                ..Default::default()
            },
        },
        Case {
            name: "no limit: no count is read",
            binding: claiming(),
            snap: snap(Objects::default()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![],
                lifecycle: Some(None),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
    // Told once: a binding already waiting publishes no second Event.
    let mut waiting = lease(1, Lifecycle::Claiming, at(9_950));
    conditions::set(
        &mut waiting.conditions,
        conditions::Desired {
            type_: READY,
            status: FALSE,
            reason: Reason::MaxActiveLeasesReached.as_str(),
            message: String::new(),
        },
        Some(1),
        &at(9_960),
    );
    let (plan, _) = run(
        &binding(Some(waiting)),
        with_profile(snap(Objects::default()), limited(1)),
        &World {
            profile_claims: 1,
            ..world(Objects::default())
        },
    );
    assert_eq!(plan.map(|p| p.events.len()).ok(), Some(0));
}

#[test]
fn claims_carry_the_profile_labels_and_count_per_profile() {
    let mut p = profile();
    p.spec.workload_class = Some("untrusted-code".into());
    let got = decide::claim_labels(&p);
    assert_eq!(
        got.get(PROFILE_LABEL).map(String::as_str),
        Some("python-worker")
    );
    assert_eq!(
        got.get(WORKLOAD_CLASS_LABEL).map(String::as_str),
        Some("untrusted-code")
    );
    assert_eq!(
        got.get(EGRESS_CLASS_LABEL).map(String::as_str),
        Some("data-plane-only")
    );

    let labelled = |name: &str, ns: &str, profile: &str, uid: &str, deleting: bool| {
        let mut c = SandboxClaim::new(name, Default::default());
        c.metadata.namespace = Some(ns.into());
        c.metadata.labels = Some(
            [
                (PROFILE_LABEL.to_owned(), profile.to_owned()),
                (BINDING_UID_LABEL.to_owned(), uid.to_owned()),
            ]
            .into(),
        );
        if deleting {
            c.metadata.deletion_timestamp = Some(at(0));
        }
        c
    };
    let claims = [
        labelled("a", "team-a", "python-worker", "other-1", false),
        labelled("b", "team-a", "python-worker", "other-2", false),
        labelled("c", "team-a", "python-worker", B_UID, false),
        labelled("d", "team-a", "python-worker", "other-3", true),
        labelled("e", "team-a", "gpu", "other-4", false),
        labelled("f", "team-b", "python-worker", "other-5", false),
    ];
    let n = observe::count_profile_claims(claims.iter(), "team-a", "python-worker", B_UID);
    assert_eq!(
        n, 2,
        "other bindings' live claims of this profile in this namespace"
    );
}

/// `EffectsSettled` follows the run ledger's unknown effects: False with them named and one
/// Warning Event when they first appear, no new Event while they stay, True once settled.
#[test]
fn unknown_effects_wait_for_a_person_on_the_binding() {
    let with_effects = |unknown: Vec<String>| World {
        head: HeadRead::Absent,
        turn: Some(observe::TurnSeen {
            running: false,
            interrupt: None,
            unknown_effects: unknown,
        }),
        ..world(Objects::default())
    };
    let refund = vec!["refund.issue (key refund-42, run run-7)".to_owned()];
    let decide = |status: HarnessBindingStatus, w: &World| {
        let (plan, _) = run(&binding(Some(status)), snap(all_cached()), w);
        let plan = plan.unwrap_or_else(|e| panic!("{e:?}"));
        declared("unknown effects", &plan);
        plan
    };
    let condition = |plan: &Plan| {
        plan.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, EFFECTS_SETTLED).cloned())
            .unwrap_or_else(|| panic!("no {EFFECTS_SETTLED} condition"))
    };
    // One unknown refund: False, named, one Warning Event.
    let plan = decide(
        bound(Lifecycle::Ready, at(9_000)),
        &with_effects(refund.clone()),
    );
    let c = condition(&plan);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (FALSE, "EffectOutcomeUnknown")
    );
    assert!(c.message.contains("1 effect(s) with an unknown outcome wait for a person: refund.issue (key refund-42, run run-7)"), "{}", c.message);
    let warnings: Vec<_> = plan
        .events
        .iter()
        .filter(|e| e.reason == Reason::EffectOutcomeUnknown)
        .collect();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].warning);
    // Still unknown on the next reconcile: no second Event.
    let waiting = plan.status.clone().unwrap_or_default();
    let plan = decide(waiting.clone(), &with_effects(refund.clone()));
    assert!(
        !plan
            .events
            .iter()
            .any(|e| e.reason == Reason::EffectOutcomeUnknown)
    );
    // Many: five named, the rest counted.
    let many: Vec<String> = (0..7).map(|i| format!("tool (key k{i}, run r)")).collect();
    let c = condition(&decide(waiting.clone(), &with_effects(many)));
    assert!(
        c.message.starts_with("7 effect(s)")
            && c.message.contains("k4")
            && !c.message.contains("k5")
            && c.message.contains("and 2 more"),
        "{}",
        c.message
    );
    // Settled (confirmed or refused): True.
    let c = condition(&decide(waiting, &with_effects(Vec::new())));
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (TRUE, "EffectsSettled")
    );
}

/// `busy` while the run ledger has a run in flight, `Ready` after; `status.pendingInterrupt`
/// mirrors the store's; neither moves when the head (and with it the turn) was not read.
#[test]
fn busy_and_the_pending_interrupt_mirror_the_turn_in_flight() {
    let running = |running: bool, interrupt: Option<crate::api::PendingInterruptSummary>| World {
        head: HeadRead::Absent,
        turn: Some(observe::TurnSeen {
            running,
            interrupt,
            unknown_effects: Vec::new(),
        }),
        ..world(Objects::default())
    };
    let approval = crate::api::PendingInterruptSummary {
        interrupt_id: "int-1".into(),
        kind: crate::api::binding::InterruptType::ToolApproval,
        run_id: "run-1".into(),
        revision: 3,
        created_at: Some(at(9_990)),
    };
    let cases = vec![
        Case {
            name: "a run in flight: busy, and not hibernated though idle past the TTL",
            binding: binding(Some(bound(Lifecycle::Ready, at(0)))),
            snap: snap(all_cached()),
            world: running(true, None),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Busy)),
                effects: Some(vec![]),
                events: Some(vec![]),
                ..Default::default()
            },
        },
        Case {
            name: "the run completed: Ready again",
            binding: binding(Some(bound(Lifecycle::Busy, at(9_000)))),
            snap: snap(all_cached()),
            world: running(false, None),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Ready)),
                ..Default::default()
            },
        },
        Case {
            name: "busy, head not due: the mirror stays busy",
            binding: binding(Some(bound(Lifecycle::Busy, at(9_000)))),
            snap: snap(all_cached()),
            world: world(Objects::default()),
            want: Want {
                needs: vec![Need::Head { force: false }],
                lifecycle: Some(Some(Lifecycle::Busy)),
                ..Default::default()
            },
        },
    ];
    for case in cases {
        check(case);
    }
    let decide_with = |status: HarnessBindingStatus, w: &World| {
        let (plan, _) = run(&binding(Some(status)), snap(all_cached()), w);
        plan.ok()
            .and_then(|p| p.status)
            .and_then(|s| s.pending_interrupt)
    };
    let ready = bound(Lifecycle::Ready, at(9_000));
    assert_eq!(
        decide_with(ready.clone(), &running(false, Some(approval.clone()))),
        Some(approval.clone()),
        "the store's pending interrupt is mirrored"
    );
    let mut waiting = ready;
    waiting.pending_interrupt = Some(approval.clone());
    assert_eq!(
        decide_with(waiting.clone(), &running(false, None)),
        None,
        "a resumed interrupt leaves the status"
    );
    assert_eq!(
        decide_with(waiting, &world(Objects::default())),
        Some(approval),
        "not read: the mirror stays"
    );
    // A hibernated lease mirrors it too (a question can wait across hibernation).
    let (plan, _) = run(
        &binding(Some(hibernated())),
        snap(Objects::default()),
        &running(false, None),
    );
    assert!(plan.is_ok_and(|p| p.status.is_some_and(|s| s.pending_interrupt.is_none())));
}

#[test]
fn a_stored_interrupt_is_summarized_for_the_status() {
    let stored = crate::domain::state::PendingInterrupt {
        interrupt_id: "int-9".into(),
        kind: "form_input".into(),
        run_id: "run-9".into(),
        namespace: vec![],
        agent_id: "agent".into(),
        allowed_decisions: vec!["respond".into()],
        revision: 4,
        created_at_ms: at(100).0.as_millisecond(),
        body: json!({"prompt": "never in the status"}),
    };
    let summary = observe::interrupt_summary(&stored).unwrap();
    assert_eq!(summary.interrupt_id, "int-9");
    assert_eq!(summary.kind, crate::api::binding::InterruptType::FormInput);
    assert_eq!((summary.revision, summary.created_at), (4, Some(at(100))));
    let odd = crate::domain::state::PendingInterrupt {
        kind: "other".into(),
        ..stored
    };
    assert_eq!(observe::interrupt_summary(&odd), None);
}
