//! The store conformance suite: written once, run against every backend
//! (`tests/store_sqlite.rs`, `tests/store_mongo.rs`). It covers, at the store level,
//! items 1–4 of the contract's "Conformance" list (`spec/000_fa938a4e6ac75730.txt`):
//! exact durable-head selection, rejection of pending and stale state, idempotent
//! duplicate writes, explicit ambiguous-crash behaviour, and zero cross-binding, epoch or
//! lease-generation access; plus interrupts, native objects and streams, bounds and
//! retention. Each case takes a fresh store built with [`limits`].
#![allow(dead_code)]

pub mod crash;
pub mod ledger;
pub mod ledger_crash;
pub mod model;

#[allow(unused_imports)] // used by the conformance_tests! macro of the store suites
pub use model::random_operation_sequences_match_the_model;

use std::collections::HashSet;

use futures::{StreamExt, future::join_all, stream};
use harness_engine::{
    domain::{
        ids::{IdempotencyDigest, Keyring, SubjectRef},
        limits::Limits,
        state::{
            BindingRecord, CommitRequest, PendingInterrupt, ResumeRequest, RunOutcome, RunTerminal,
            StateScope,
        },
    },
    store::{NewEntry, ObjectQuery, PutMode, RetentionPolicy, Store, StoreError, now_ms},
};
use serde_json::json;

/// Limits every backend is built with for the suite: small enough to reach in a test.
pub fn limits() -> Limits {
    Limits {
        max_state_bytes: 256 << 10,
        max_pending_entries: 64,
        max_object_bytes: 64 << 10,
        max_objects: 64,
        max_entry_bytes: 64 << 10,
        max_entries_per_append: 100,
        max_stream_entries: 500,
        max_streams: 16,
        max_key_bytes: 256,
        max_metadata_bytes: 4 << 10,
        writes_per_second: 2_000,
        write_burst: 400,
        max_page: 100,
    }
}

pub fn keyring() -> Keyring {
    match Keyring::new(
        b"conformance-suite-key-0123456789abcdef".to_vec(),
        "conformance",
    ) {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    }
}

/// A fresh binding at epoch 0, lease generation 1, and its scope.
pub async fn new_binding<S: Store + ?Sized>(
    store: &S,
    conversation: &str,
) -> (BindingRecord, StateScope) {
    let kr = keyring();
    let subject = format!("user:{conversation}@example.com");
    let record = BindingRecord {
        binding_id: kr.binding_id(&subject, "agent-1", conversation),
        environment: kr.environment().to_owned(),
        owner: kr.subject_ref(&subject),
        agent_id: "agent-1".into(),
        conversation_id: conversation.into(),
        harness: "strands".into(),
        epoch: 0,
        lease_generation: 1,
        created_at_ms: now_ms(),
    };
    let (stored, created) = store.ensure_binding(&record).await.expect("ensure_binding");
    assert!(created, "a new conversation creates a binding");
    assert_eq!(stored, record);
    let scope = scope_of(&record, 0, 1);
    (record, scope)
}

pub fn scope_of(record: &BindingRecord, epoch: u64, lease_generation: u64) -> StateScope {
    StateScope {
        binding_id: record.binding_id.clone(),
        environment: record.environment.clone(),
        harness: record.harness.clone(),
        epoch,
        codec: "strands-session-v1".into(),
        lease_generation,
    }
}

pub fn key(scope: &StateScope, k: &str) -> IdempotencyDigest {
    keyring().idempotency_digest(&scope.binding_id, "state.write", k)
}

pub fn commit(state_id: &str, expected: u64, run: &str) -> CommitRequest {
    CommitRequest {
        state_id: state_id.into(),
        expected_revision: expected,
        run_id: run.into(),
        terminal: Some(RunTerminal {
            outcome: RunOutcome::Completed,
            metadata: json!({"tokens": 12}),
        }),
        interrupt: None,
    }
}

/// The stable code of a failed call, or a panic if it succeeded.
pub fn code<T: std::fmt::Debug>(result: Result<T, StoreError>) -> &'static str {
    match result {
        Ok(v) => panic!("expected a rejection, got Ok({v:?})"),
        Err(e) => e.code(),
    }
}

/// One committed turn; returns the new revision.
pub async fn turn<S: Store + ?Sized>(
    store: &S,
    scope: &StateScope,
    body: &[u8],
    expected: u64,
    run: &str,
) -> u64 {
    let pending = store
        .write_native_state(scope, body, &key(scope, run))
        .await
        .expect("write pending");
    let head = store
        .commit_head(scope, &commit(&pending.state_id, expected, run))
        .await
        .expect("commit");
    head.revision
}

// ---------------------------------------------------------------------------------------
// Contract item 2: the exact durable head is selected; pending entries never are.

pub async fn head_is_the_last_commit_never_a_pending_entry<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "head-selection").await;
    assert!(
        store.load_head(&scope).await.expect("load").is_none(),
        "no head before the first commit"
    );

    let a = store
        .write_native_state(&scope, b"state-A", &key(&scope, "a"))
        .await
        .expect("write A");
    assert_eq!(a.epoch, 0);
    assert_eq!(a.size, 7);
    assert!(
        store.load_head(&scope).await.expect("load").is_none(),
        "a pending entry is never a head"
    );

    let head = store
        .commit_head(&scope, &commit(&a.state_id, 0, "run-1"))
        .await
        .expect("commit A");
    assert_eq!(
        (head.revision, head.state_id.as_str(), head.run_id.as_str()),
        (1, a.state_id.as_str(), "run-1")
    );
    assert_eq!(
        head.terminal.as_ref().map(|t| t.outcome),
        Some(RunOutcome::Completed),
        "terminal metadata committed with the head"
    );

    let b = store
        .write_native_state(&scope, b"state-B", &key(&scope, "b"))
        .await
        .expect("write B");
    let loaded = store.load_head(&scope).await.expect("load").expect("head");
    assert_eq!(
        (loaded.revision, loaded.state_id.clone()),
        (1, a.state_id.clone()),
        "the newer pending B is not selected"
    );
    assert_eq!(loaded.content_digest, a.content_digest);
    assert_eq!(
        store
            .read_state(&scope, &loaded.state_id)
            .await
            .expect("read"),
        Some(b"state-A".to_vec())
    );
    assert_eq!(
        store.read_state(&scope, &b.state_id).await.expect("read"),
        Some(b"state-B".to_vec()),
        "pending bodies stay readable"
    );
    assert_eq!(
        store
            .read_state(&scope, "ps_doesnotexist")
            .await
            .expect("read"),
        None
    );

    let head = store
        .commit_head(&scope, &commit(&b.state_id, 1, "run-2"))
        .await
        .expect("commit B");
    assert_eq!(head.revision, 2);
    assert_eq!(
        store
            .load_head(&scope)
            .await
            .expect("load")
            .map(|h| h.state_id),
        Some(b.state_id)
    );
}

pub async fn stale_revision_is_refused<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "stale-revision").await;
    turn(store, &scope, b"one", 0, "run-1").await;
    let p = store
        .write_native_state(&scope, b"two", &key(&scope, "two"))
        .await
        .expect("write");
    let err = store
        .commit_head(&scope, &commit(&p.state_id, 0, "run-2"))
        .await;
    match err {
        Err(StoreError::Rejected(r)) => {
            assert_eq!(r.code(), "revision_conflict");
            assert!(
                r.to_string().contains("expected revision 0") && r.to_string().contains("is 1"),
                "{r}"
            );
        }
        other => panic!("expected revision_conflict, got {other:?}"),
    }
    assert_eq!(
        code(
            store
                .commit_head(&scope, &commit(&p.state_id, 5, "run-2"))
                .await
        ),
        "revision_conflict",
        "a future revision is refused too"
    );
    assert_eq!(
        store
            .load_head(&scope)
            .await
            .expect("load")
            .map(|h| h.revision),
        Some(1)
    );
}

// Contract item 4: zero access across lease generations and epochs.

pub async fn stale_lease_is_refused_even_when_the_revision_matches<S: Store + ?Sized>(store: &S) {
    let (record, old) = new_binding(store, "stale-lease").await;
    turn(store, &old, b"gen1-turn", 0, "run-1").await;
    let pending_old = store
        .write_native_state(&old, b"written-by-gen1", &key(&old, "late"))
        .await
        .expect("write");

    // The operator replaces the worker: generation 2.
    let fence = store
        .raise_fence(&record.binding_id, 0, 2)
        .await
        .expect("raise");
    assert_eq!((fence.epoch, fence.lease_generation), (0, 2));
    assert_eq!(
        store
            .raise_fence(&record.binding_id, 0, 2)
            .await
            .expect("idempotent")
            .lease_generation,
        2,
        "raising to the same generation is a no-op"
    );
    assert_eq!(
        code(store.raise_fence(&record.binding_id, 0, 1).await),
        "stale_lease",
        "the fence never moves down"
    );

    // The old worker's commit carries the right revision and is still refused.
    assert_eq!(
        code(
            store
                .commit_head(&old, &commit(&pending_old.state_id, 1, "run-late"))
                .await
        ),
        "stale_lease"
    );
    assert_eq!(
        code(store.write_native_state(&old, b"x", &key(&old, "x")).await),
        "stale_lease"
    );
    assert_eq!(
        code(store.load_head(&old).await),
        "stale_lease",
        "an old worker cannot even read"
    );
    assert_eq!(
        code(store.put_object(&old, "k", b"v", PutMode::Upsert).await),
        "stale_lease"
    );
    assert_eq!(
        code(
            store
                .append(
                    &old,
                    "s",
                    &[NewEntry {
                        id: "e".into(),
                        body: b"b".to_vec()
                    }]
                )
                .await
        ),
        "stale_lease"
    );

    let new = scope_of(&record, 0, 2);
    assert_eq!(
        code(
            store
                .commit_head(
                    &scope_of(&record, 0, 3),
                    &commit(&pending_old.state_id, 1, "run-x")
                )
                .await
        ),
        "stale_lease",
        "a generation ahead of the fence is refused too"
    );
    assert_eq!(turn(store, &new, b"gen2-turn", 1, "run-2").await, 2);
    let head = store.load_head(&new).await.expect("load").expect("head");
    assert_eq!(head.lease_generation, 2);
    assert_eq!(
        store.read_state(&new, &head.state_id).await.expect("read"),
        Some(b"gen2-turn".to_vec())
    );
}

pub async fn stale_epoch_is_refused<S: Store + ?Sized>(store: &S) {
    let (record, e0) = new_binding(store, "stale-epoch").await;
    turn(store, &e0, b"epoch0", 0, "run-1").await;
    let report = store.clear(&record.binding_id, 1).await.expect("clear");
    assert_eq!(report.epoch, 1);
    assert_eq!(code(store.load_head(&e0).await), "stale_epoch");
    assert_eq!(
        code(store.write_native_state(&e0, b"x", &key(&e0, "x")).await),
        "stale_epoch"
    );
    assert_eq!(
        code(store.raise_fence(&record.binding_id, 0, 5).await),
        "stale_epoch"
    );
    assert_eq!(
        code(store.load_head(&scope_of(&record, 2, 1)).await),
        "stale_epoch",
        "a future epoch is refused"
    );
    let e1 = scope_of(&record, 1, 1);
    assert!(
        store.load_head(&e1).await.expect("load").is_none(),
        "a new epoch starts without a head"
    );
}

// Contract item 3: idempotent duplicate writes.

pub async fn duplicate_writes_return_one_reference<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "idempotency").await;
    let first = store
        .write_native_state(&scope, b"payload", &key(&scope, "k1"))
        .await
        .expect("write");
    let again = store
        .write_native_state(&scope, b"payload", &key(&scope, "k1"))
        .await
        .expect("retry");
    assert_eq!(
        first, again,
        "the same key and payload return the same reference"
    );
    let k1 = key(&scope, "k1");
    let concurrent =
        join_all((0..8).map(|_| store.write_native_state(&scope, b"payload", &k1))).await;
    for r in concurrent {
        assert_eq!(r.expect("concurrent retry"), first);
    }
    assert_eq!(
        code(
            store
                .write_native_state(&scope, b"other", &key(&scope, "k1"))
                .await
        ),
        "idempotency_mismatch"
    );

    let head = store
        .commit_head(&scope, &commit(&first.state_id, 0, "run-1"))
        .await
        .expect("commit");
    let retried = store
        .commit_head(&scope, &commit(&first.state_id, 0, "run-1"))
        .await
        .expect("a retried commit returns its head");
    assert_eq!(retried.revision, head.revision);
    assert_eq!(retried.state_id, head.state_id);
    assert_eq!(
        store
            .load_head(&scope)
            .await
            .expect("load")
            .map(|h| h.revision),
        Some(1),
        "the retry committed nothing new"
    );
    assert_eq!(
        code(
            store
                .commit_head(&scope, &commit(&first.state_id, 0, "run-other"))
                .await
        ),
        "revision_conflict",
        "another run is not a retry"
    );
}

pub async fn clear_starts_a_new_epoch<S: Store + ?Sized>(store: &S) {
    let (record, e0) = new_binding(store, "clear").await;
    turn(store, &e0, b"old-head", 0, "run-1").await;
    let old_pending = store
        .write_native_state(&e0, b"old-pending", &key(&e0, "p"))
        .await
        .expect("write");
    let mut with_interrupt = commit(&old_pending.state_id, 1, "run-2");
    with_interrupt.interrupt = Some(interrupt("int-1", &["approve"]));
    store
        .commit_head(&e0, &with_interrupt)
        .await
        .expect("commit with interrupt");
    store
        .put_object(&e0, "checkpoints/1", b"obj", PutMode::Create)
        .await
        .expect("object");
    store
        .append(
            &e0,
            "session",
            &[NewEntry {
                id: "u1".into(),
                body: b"m".to_vec(),
            }],
        )
        .await
        .expect("append");
    let dangling = store
        .write_native_state(&e0, b"never-committed", &key(&e0, "d"))
        .await
        .expect("write");

    let report = store.clear(&record.binding_id, 1).await.expect("clear");
    assert_eq!(report.epoch, 1);
    assert_eq!(
        report.states_deleted, 3,
        "head, superseded and pending states of epoch 0: {report:?}"
    );
    assert_eq!(
        (report.objects_deleted, report.stream_entries_deleted),
        (1, 1),
        "{report:?}"
    );

    let e1 = scope_of(&record, 1, 1);
    assert!(store.load_head(&e1).await.expect("load").is_none());
    assert!(
        store
            .pending_interrupt(&e1)
            .await
            .expect("interrupt")
            .is_none(),
        "interrupts do not survive a clear"
    );
    assert_eq!(
        code(
            store
                .commit_head(&e1, &commit(&dangling.state_id, 0, "run-3"))
                .await
        ),
        "not_found",
        "old pending state can never become the new epoch's head"
    );
    assert_eq!(
        store
            .read_state(&e1, &dangling.state_id)
            .await
            .expect("read"),
        None
    );
    assert!(
        store
            .get_object(&e1, "checkpoints/1")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .load_stream(&e1, "session", 0, 10)
            .await
            .expect("load")
            .is_empty()
    );
    // A retried clear finishes (nothing left) and a skip is refused.
    let again = store
        .clear(&record.binding_id, 1)
        .await
        .expect("idempotent clear");
    assert_eq!((again.states_deleted, again.objects_deleted), (0, 0));
    assert!(matches!(
        code(store.clear(&record.binding_id, 3).await),
        "invalid" | "stale_epoch"
    ));
    assert_eq!(
        code(store.clear(&record.binding_id, 0).await),
        "stale_epoch"
    );
    assert_eq!(
        turn(store, &e1, b"fresh", 0, "run-4").await,
        1,
        "the new epoch commits from revision 0"
    );
    assert_eq!(
        store
            .get_binding(&record.binding_id)
            .await
            .expect("get")
            .map(|b| b.epoch),
        Some(1)
    );
    assert!(
        store
            .audit_records(10)
            .await
            .expect("audit")
            .iter()
            .any(|a| a.action == "binding.clear"),
        "a clear leaves an audit record"
    );
}

pub fn interrupt(id: &str, decisions: &[&str]) -> PendingInterrupt {
    PendingInterrupt {
        interrupt_id: id.into(),
        kind: "tool_approval".into(),
        run_id: "run-2".into(),
        namespace: vec![],
        agent_id: "agent-1".into(),
        allowed_decisions: decisions.iter().map(|d| (*d).to_owned()).collect(),
        revision: 0,
        created_at_ms: 0,
        body: json!({"tool_approvals": [{"tool_name": "deploy", "tool_call_id": "c1", "allowed_decisions": decisions}]}),
    }
}

// Bounds (spec 000: "State size, entry count, and write rate are bounded").

pub async fn bounds_give_clear_errors<S: Store + ?Sized>(store: &S) {
    let limits = limits();
    let (_, scope) = new_binding(store, "bounds").await;
    let big = vec![0u8; limits.max_state_bytes + 1];
    match store
        .write_native_state(&scope, &big, &key(&scope, "big"))
        .await
    {
        Err(StoreError::Rejected(r)) => {
            assert_eq!((r.code(), r.http_status()), ("too_large", 413));
            assert!(
                r.to_string().contains(&limits.max_state_bytes.to_string()),
                "the message names the limit: {r}"
            );
        }
        other => panic!("expected too_large, got {other:?}"),
    }
    for i in 0..limits.max_pending_entries {
        store
            .write_native_state(
                &scope,
                format!("p{i}").as_bytes(),
                &key(&scope, &format!("p{i}")),
            )
            .await
            .expect("within the entry bound");
    }
    assert_eq!(
        code(
            store
                .write_native_state(&scope, b"one-too-many", &key(&scope, "over"))
                .await
        ),
        "too_large",
        "pending entry count is bounded"
    );
    assert_eq!(
        code(
            store
                .put_object(
                    &scope,
                    "k",
                    &vec![1u8; limits.max_object_bytes + 1],
                    PutMode::Upsert
                )
                .await
        ),
        "too_large"
    );
    assert_eq!(
        code(
            store
                .put_object(
                    &scope,
                    &"k".repeat(limits.max_key_bytes + 1),
                    b"v",
                    PutMode::Upsert
                )
                .await
        ),
        "too_large"
    );
    assert_eq!(
        code(store.put_object(&scope, "", b"v", PutMode::Upsert).await),
        "invalid"
    );
    let mut oversized = commit("ps_x", 0, "run");
    oversized.terminal = Some(RunTerminal {
        outcome: RunOutcome::Completed,
        metadata: json!({"blob": "x".repeat(limits.max_metadata_bytes)}),
    });
    let p = store
        .write_native_state(&scope, b"p0", &key(&scope, "p0"))
        .await
        .expect("idempotent retry is not a new entry");
    oversized.state_id = p.state_id;
    assert_eq!(
        code(store.commit_head(&scope, &oversized).await),
        "too_large",
        "terminal metadata is bounded"
    );
    let too_many: Vec<NewEntry> = (0..=limits.max_entries_per_append)
        .map(|i| NewEntry {
            id: format!("e{i}"),
            body: vec![],
        })
        .collect();
    assert_eq!(
        code(store.append(&scope, "s", &too_many).await),
        "too_large"
    );

    // The write rate: a burst far above the bucket is partly refused, with a retry hint.
    let (_, hot) = new_binding(store, "bounds-rate").await;
    let results = join_all((0..(limits.write_burst as usize * 2)).map(|i| {
        let hot = hot.clone();
        async move {
            store
                .put_object(&hot, &format!("r/{i}"), b"v", PutMode::Upsert)
                .await
        }
    }))
    .await;
    let limited = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.code() == "rate_limited"))
        .count();
    assert!(
        limited > 0,
        "a burst of {} writes must hit the rate limit",
        limits.write_burst * 2
    );
    assert!(
        results.iter().all(|r| r.is_ok()
            || matches!(r, Err(e) if matches!(e.code(), "rate_limited" | "too_large"))),
        "only rate or count limits refuse"
    );
}

// Concurrency: exactly one committer wins per revision.

pub async fn concurrent_committers_exactly_one_wins_per_revision<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "race").await;
    let committers = 12;
    for round in 0..4u64 {
        let attempts = join_all((0..committers).map(|w| {
            let scope = scope.clone();
            async move {
                let run = format!("run-{round}-{w}");
                let p = store
                    .write_native_state(&scope, run.as_bytes(), &key(&scope, &run))
                    .await?;
                store
                    .commit_head(&scope, &commit(&p.state_id, round, &run))
                    .await
            }
        }))
        .await;
        let winners: Vec<_> = attempts.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: exactly one winner, got {attempts:?}"
        );
        for loser in attempts.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(loser.code(), "revision_conflict", "round {round}");
        }
        let head = store.load_head(&scope).await.expect("load").expect("head");
        assert_eq!(head.revision, round + 1);
        assert_eq!(head.run_id, winners[0].run_id, "the head is the winner's");
        assert_eq!(
            store
                .read_state(&scope, &head.state_id)
                .await
                .expect("read"),
            Some(head.run_id.clone().into_bytes())
        );
    }
    // Clean pending losers so the entry bound is not the limit of this case.
}

// Contract item 4: 1,000 bindings, zero cross-binding reads.

pub async fn a_thousand_bindings_never_read_each_other<S: Store + ?Sized>(store: &S) {
    bindings_never_read_each_other(store, 1000).await;
}

/// The isolation case with `n` bindings (every backend runs it with 1,000).
pub async fn bindings_never_read_each_other<S: Store + ?Sized>(store: &S, n: usize) {
    let bindings: Vec<(BindingRecord, StateScope, String)> = stream::iter(0..n)
        .map(|i| async move {
            let (record, scope) = new_binding(store, &format!("iso-{i}")).await;
            let p = store
                .write_native_state(&scope, format!("body-of-{i}").as_bytes(), &key(&scope, "k"))
                .await
                .expect("write");
            store
                .commit_head(&scope, &commit(&p.state_id, 0, "run-1"))
                .await
                .expect("commit");
            store
                .put_object(
                    &scope,
                    "obj",
                    format!("obj-of-{i}").as_bytes(),
                    PutMode::Create,
                )
                .await
                .expect("object");
            (record, scope, p.state_id)
        })
        // `buffered` keeps creation order, so position i holds conversation iso-{i}.
        .buffered(32)
        .collect()
        .await;
    let ids: HashSet<_> = bindings
        .iter()
        .map(|(r, _, _)| r.binding_id.clone())
        .collect();
    assert_eq!(ids.len(), n, "binding ids never collide");

    let bindings = &bindings;
    let cross_reads = stream::iter(bindings.iter().enumerate())
        .map(|(i, (_, scope, _))| {
            let (_, _, neighbour_state) = &bindings[(i + 1) % n];
            async move {
                let mut leaks = 0;
                let head = store.load_head(scope).await.expect("load").expect("head");
                let own = store.read_state(scope, &head.state_id).await.expect("read");
                if own.as_deref()
                    != Some(format!("body-of-{}", scope_index(scope, bindings)).as_bytes())
                {
                    leaks += 1;
                }
                if store
                    .read_state(scope, neighbour_state)
                    .await
                    .expect("read")
                    .is_some()
                {
                    leaks += 1;
                }
                let obj = store
                    .get_object(scope, "obj")
                    .await
                    .expect("get")
                    .and_then(|o| o.body);
                if obj.as_deref()
                    != Some(format!("obj-of-{}", scope_index(scope, bindings)).as_bytes())
                {
                    leaks += 1;
                }
                leaks
            }
        })
        .buffer_unordered(32)
        .fold(0, |acc, x| async move { acc + x })
        .await;
    assert_eq!(cross_reads, 0, "no binding ever sees another's state");
}

fn scope_index(scope: &StateScope, bindings: &[(BindingRecord, StateScope, String)]) -> usize {
    bindings
        .iter()
        .position(|(r, _, _)| r.binding_id == scope.binding_id)
        .unwrap_or(usize::MAX)
}

// Contract item 3: explicit ambiguous-crash behaviour.

pub async fn mark_uncertain_fences_the_run_until_reconciled<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "uncertain").await;
    turn(store, &scope, b"good", 0, "run-1").await;
    let p = store
        .write_native_state(&scope, b"ambiguous", &key(&scope, "run-2"))
        .await
        .expect("write");
    store
        .mark_uncertain(&scope, "run-2", "commit_timeout")
        .await
        .expect("mark");
    store
        .mark_uncertain(&scope, "run-2", "commit_timeout")
        .await
        .expect("marking twice is idempotent");

    let head = store.load_head(&scope).await.expect("load").expect("head");
    assert_eq!(head.revision, 1, "the previous head is kept");
    assert_eq!(
        head.durability,
        harness_engine::domain::state::Durability::Uncertain
    );
    let runs = store.uncertain_runs(&scope).await.expect("runs");
    assert_eq!(
        runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        ["run-2"]
    );
    assert_eq!(runs[0].reason, "commit_timeout");

    assert_eq!(
        code(
            store
                .commit_head(&scope, &commit(&p.state_id, 1, "run-2"))
                .await
        ),
        "run_uncertain",
        "nothing commits under an uncertain run"
    );
    assert_eq!(
        code(
            store
                .mark_uncertain(&scope, "run-3", &"r".repeat(1000))
                .await
        ),
        "invalid",
        "reasons are bounded"
    );

    store
        .reconcile_run(&scope, "run-2")
        .await
        .expect("reconcile");
    assert_eq!(
        code(store.reconcile_run(&scope, "run-2").await),
        "not_found"
    );
    let head = store
        .commit_head(&scope, &commit(&p.state_id, 1, "run-2"))
        .await
        .expect("commits after reconciliation");
    assert_eq!(head.revision, 2);
    assert_eq!(
        head.durability,
        harness_engine::domain::state::Durability::Committed
    );
}

// Pending interrupts (spec 001 §6).

pub async fn interrupts_resume_exactly_once<S: Store + ?Sized>(store: &S) {
    let (record, scope) = new_binding(store, "interrupts").await;
    let p = store
        .write_native_state(&scope, b"paused", &key(&scope, "p"))
        .await
        .expect("write");
    let mut req = commit(&p.state_id, 0, "run-1");
    req.terminal = Some(RunTerminal {
        outcome: RunOutcome::Interrupted,
        metadata: json!({}),
    });
    req.interrupt = Some(interrupt("int-1", &["approve", "reject"]));
    let head = store.commit_head(&scope, &req).await.expect("commit");
    let pending = store
        .pending_interrupt(&scope)
        .await
        .expect("get")
        .expect("pending interrupt");
    assert_eq!(
        pending.revision, head.revision,
        "the store stamps the interrupt with the commit's revision"
    );
    assert!(pending.created_at_ms > 0);
    assert_eq!(
        head.interrupt.as_ref().map(|i| i.interrupt_id.as_str()),
        Some("int-1")
    );

    let kr = keyring();
    let resume =
        |id: &str, revision: u64, caller: SubjectRef, decision: &str, idem: &str| ResumeRequest {
            interrupt_id: id.into(),
            revision,
            caller,
            decision: decision.into(),
            idempotency: kr.idempotency_digest(&record.binding_id, "interrupt.resume", idem),
            response: json!({"note": "ok"}),
        };
    let owner = record.owner.clone();
    let stranger = kr.subject_ref("user:mallory@example.com");
    assert_eq!(
        code(
            store
                .resume(
                    &scope,
                    &resume("int-1", head.revision + 1, owner.clone(), "approve", "r1")
                )
                .await
        ),
        "revision_conflict"
    );
    assert_eq!(
        code(
            store
                .resume(
                    &scope,
                    &resume("int-1", head.revision, stranger, "approve", "r1")
                )
                .await
        ),
        "forbidden_scope"
    );
    assert_eq!(
        code(
            store
                .resume(
                    &scope,
                    &resume("int-1", head.revision, owner.clone(), "delete-prod", "r1")
                )
                .await
        ),
        "invalid"
    );
    assert_eq!(
        code(
            store
                .resume(
                    &scope,
                    &resume("int-9", head.revision, owner.clone(), "approve", "r1")
                )
                .await
        ),
        "not_found"
    );
    assert!(
        store
            .pending_interrupt(&scope)
            .await
            .expect("get")
            .is_some(),
        "refused resumes consume nothing"
    );

    let outcome = store
        .resume(
            &scope,
            &resume("int-1", head.revision, owner.clone(), "approve", "r1"),
        )
        .await
        .expect("resume");
    assert_eq!(
        (outcome.interrupt_id.as_str(), outcome.decision.as_str()),
        ("int-1", "approve")
    );
    assert!(
        store
            .pending_interrupt(&scope)
            .await
            .expect("get")
            .is_none(),
        "a resume consumes the interrupt"
    );
    let duplicate = store
        .resume(
            &scope,
            &resume("int-1", head.revision, owner.clone(), "approve", "r1"),
        )
        .await
        .expect("duplicate");
    assert_eq!(
        duplicate, outcome,
        "the same idempotency key returns the prior result"
    );
    assert_eq!(
        code(
            store
                .resume(
                    &scope,
                    &resume("int-1", head.revision, owner.clone(), "reject", "r2")
                )
                .await
        ),
        "conflict",
        "a conflicting duplicate is refused"
    );

    // Concurrent resumes with different keys: exactly one wins.
    let p2 = store
        .write_native_state(&scope, b"paused-2", &key(&scope, "p2"))
        .await
        .expect("write");
    let mut req = commit(&p2.state_id, head.revision, "run-2");
    req.interrupt = Some(interrupt("int-2", &["approve"]));
    let head = store.commit_head(&scope, &req).await.expect("commit");
    let requests: Vec<_> = (0..8)
        .map(|i| {
            resume(
                "int-2",
                head.revision,
                owner.clone(),
                "approve",
                &format!("k{i}"),
            )
        })
        .collect();
    let results = join_all(requests.iter().map(|r| store.resume(&scope, r))).await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
}

// Native objects and streams: the adapters' primitives.

pub async fn native_objects_put_get_list_delete<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "objects").await;
    let m1 = store
        .put_object(&scope, "ckpt/0001", b"one", PutMode::Create)
        .await
        .expect("create");
    assert_eq!(m1.version, 1);
    assert_eq!(
        store
            .put_object(&scope, "ckpt/0001", b"one", PutMode::Create)
            .await
            .expect("idempotent create"),
        m1
    );
    assert_eq!(
        code(
            store
                .put_object(&scope, "ckpt/0001", b"uno", PutMode::Create)
                .await
        ),
        "conflict"
    );
    for k in [
        "ckpt/0002",
        "ckpt/0003",
        "ckpt/0010",
        "ckpt0/x",
        "other/1",
        "ckpt%/y",
        "ckpt_/z",
    ] {
        store
            .put_object(&scope, k, k.as_bytes(), PutMode::Create)
            .await
            .expect("create");
    }
    let keys = |objs: Vec<harness_engine::store::StoredObject>| {
        objs.into_iter().map(|o| o.meta.key).collect::<Vec<_>>()
    };
    let all = store
        .list_objects(
            &scope,
            &ObjectQuery {
                prefix: "ckpt/".into(),
                before: None,
                limit: 10,
                with_bodies: false,
            },
        )
        .await
        .expect("list");
    assert!(
        all.iter().all(|o| o.body.is_none()),
        "bodies only when asked"
    );
    assert_eq!(
        keys(all),
        ["ckpt/0010", "ckpt/0003", "ckpt/0002", "ckpt/0001"],
        "prefix match, newest key first, no wildcard leaks"
    );
    let page = store
        .list_objects(
            &scope,
            &ObjectQuery {
                prefix: "ckpt/".into(),
                before: Some("ckpt/0003".into()),
                limit: 1,
                with_bodies: true,
            },
        )
        .await
        .expect("list");
    assert_eq!(page.len(), 1);
    assert_eq!(
        (page[0].meta.key.as_str(), page[0].body.as_deref()),
        ("ckpt/0002", Some(&b"ckpt/0002"[..]))
    );
    let literal = store
        .list_objects(
            &scope,
            &ObjectQuery {
                prefix: "ckpt%".into(),
                before: None,
                limit: 10,
                with_bodies: false,
            },
        )
        .await
        .expect("list");
    assert_eq!(
        keys(literal),
        ["ckpt%/y"],
        "prefixes are literal, not patterns"
    );

    assert_eq!(
        code(
            store
                .put_object(
                    &scope,
                    "ckpt/0001",
                    b"two",
                    PutMode::Replace {
                        expected_version: 2
                    }
                )
                .await
        ),
        "conflict"
    );
    let m2 = store
        .put_object(
            &scope,
            "ckpt/0001",
            b"two",
            PutMode::Replace {
                expected_version: 1,
            },
        )
        .await
        .expect("replace");
    assert_eq!(m2.version, 2);
    assert_eq!(
        store
            .put_object(
                &scope,
                "fresh",
                b"f",
                PutMode::Replace {
                    expected_version: 0
                }
            )
            .await
            .expect("replace absent")
            .version,
        1
    );
    assert_eq!(
        store
            .put_object(&scope, "fresh", b"g", PutMode::Upsert)
            .await
            .expect("upsert")
            .version,
        2
    );
    let got = store
        .get_object(&scope, "ckpt/0001")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        (got.body.as_deref(), got.meta.version),
        (Some(&b"two"[..]), 2)
    );

    assert_eq!(
        store.delete_objects(&scope, "ckpt/").await.expect("delete"),
        4
    );
    assert!(
        store
            .get_object(&scope, "ckpt/0002")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .get_object(&scope, "ckpt0/x")
            .await
            .expect("get")
            .is_some(),
        "delete is by prefix, not by pattern"
    );
}

pub async fn native_streams_dedupe_order_and_cascade<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "streams").await;
    let e = |id: &str| NewEntry {
        id: id.into(),
        body: format!("body-{id}").into_bytes(),
    };
    let first = store
        .append(&scope, "proj/sess", &[e("u1"), e("u2"), e("u1")])
        .await
        .expect("append");
    assert_eq!(
        (first.appended, first.duplicates, first.last_seq),
        (2, 1, 2),
        "de-duplicated within a batch"
    );
    let second = store
        .append(&scope, "proj/sess", &[e("u2"), e("u3")])
        .await
        .expect("append");
    assert_eq!(
        (second.appended, second.duplicates, second.last_seq),
        (1, 1, 3),
        "de-duplicated against the stream"
    );
    store
        .append(&scope, "proj/sess/subagents/a1", &[e("s1")])
        .await
        .expect("append");
    store
        .append(&scope, "proj/sess2", &[e("x1")])
        .await
        .expect("append");

    let loaded = store
        .load_stream(&scope, "proj/sess", 0, 100)
        .await
        .expect("load");
    assert_eq!(
        loaded
            .iter()
            .map(|x| (x.seq, x.id.as_str()))
            .collect::<Vec<_>>(),
        [(1, "u1"), (2, "u2"), (3, "u3")]
    );
    assert_eq!(loaded[2].body, b"body-u3");
    assert_eq!(
        store
            .load_stream(&scope, "proj/sess", 1, 1)
            .await
            .expect("load")
            .iter()
            .map(|x| x.seq)
            .collect::<Vec<_>>(),
        [2]
    );

    // Retried deliveries racing each other still store each id once.
    let batch = [e("u4"), e("u5")];
    let racing = join_all((0..6).map(|_| store.append(&scope, "proj/sess", &batch))).await;
    assert_eq!(
        racing
            .iter()
            .map(|r| r.as_ref().map(|o| o.appended).unwrap_or(0))
            .sum::<u64>(),
        2,
        "{racing:?}"
    );
    assert_eq!(
        store
            .load_stream(&scope, "proj/sess", 0, 100)
            .await
            .expect("load")
            .len(),
        5
    );

    let mut names: Vec<_> = store
        .list_streams(&scope, "proj/")
        .await
        .expect("list")
        .into_iter()
        .map(|s| (s.name, s.entries))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("proj/sess".to_owned(), 5),
            ("proj/sess/subagents/a1".to_owned(), 1),
            ("proj/sess2".to_owned(), 1)
        ]
    );

    assert_eq!(
        store
            .delete_stream(&scope, "proj/sess")
            .await
            .expect("delete"),
        6,
        "cascades to sub-streams"
    );
    assert!(
        store
            .load_stream(&scope, "proj/sess/subagents/a1", 0, 10)
            .await
            .expect("load")
            .is_empty()
    );
    assert_eq!(
        store
            .load_stream(&scope, "proj/sess2", 0, 10)
            .await
            .expect("load")
            .len(),
        1,
        "a sibling with a longer name survives"
    );
}

// Retention.

pub async fn retention_sweeps_delete_by_policy_and_audit<S: Store + ?Sized>(store: &S) {
    let (record, scope) = new_binding(store, "retention").await;
    turn(store, &scope, b"kept-head", 0, "run-1").await;
    let orphan = store
        .write_native_state(&scope, b"orphan", &key(&scope, "orphan"))
        .await
        .expect("write");
    let now = now_ms();

    let keep_all = RetentionPolicy {
        id: "standard".into(),
        pending_ttl_ms: 3_600_000,
        conversation_ttl_ms: None,
    };
    let report = store.sweep(&keep_all, now).await.expect("sweep");
    assert_eq!(
        report.pending_states_deleted, 0,
        "young pending state is kept"
    );

    let short = RetentionPolicy {
        id: "short-pending".into(),
        pending_ttl_ms: 1,
        conversation_ttl_ms: None,
    };
    let report = store.sweep(&short, now + 10_000).await.expect("sweep");
    assert!(report.pending_states_deleted >= 1, "{report:?}");
    assert_eq!(
        store
            .read_state(&scope, &orphan.state_id)
            .await
            .expect("read"),
        None,
        "the orphan is gone"
    );
    let head = store
        .load_head(&scope)
        .await
        .expect("load")
        .expect("the head survives retention");
    assert_eq!(
        store
            .read_state(&scope, &head.state_id)
            .await
            .expect("read"),
        Some(b"kept-head".to_vec())
    );

    let gone = RetentionPolicy {
        id: "ephemeral".into(),
        pending_ttl_ms: 1,
        conversation_ttl_ms: Some(60_000),
    };
    let report = store.sweep(&gone, now + 3_600_000).await.expect("sweep");
    assert!(report.bindings_deleted >= 1, "{report:?}");
    assert!(
        store
            .get_binding(&record.binding_id)
            .await
            .expect("get")
            .is_none()
    );
    let audit = store.audit_records(20).await.expect("audit");
    let sweeps: Vec<_> = audit
        .iter()
        .filter(|a| a.action == "retention.sweep")
        .collect();
    assert!(
        sweeps.len() >= 3,
        "every sweep leaves an audit record: {audit:?}"
    );
    assert_eq!(
        sweeps[0].detail["policy_id"], "ephemeral",
        "newest first, naming the policy: {:?}",
        sweeps[0]
    );
}

pub async fn binding_identity_is_create_or_get<S: Store + ?Sized>(store: &S) {
    let (record, _) = new_binding(store, "identity").await;
    let (again, created) = store.ensure_binding(&record).await.expect("ensure");
    assert!(!created);
    assert_eq!(again, record);
    let mut other = record.clone();
    other.owner = keyring().subject_ref("user:someone-else");
    assert_eq!(
        code(store.ensure_binding(&other).await),
        "conflict",
        "one id never serves two identities"
    );
    assert!(
        store
            .get_binding(&keyring().binding_id("nobody", "none", "none"))
            .await
            .expect("get")
            .is_none()
    );
    assert_eq!(
        code(
            store
                .raise_fence(&keyring().binding_id("nobody", "none", "none"), 0, 2)
                .await
        ),
        "not_found"
    );
}

// ---------------------------------------------------------------------------------------
// Steps 3 and 4 in one call (`write_and_commit`, the API's `state/commit-inline`).

pub async fn write_and_commit_is_a_turn_in_one_call<S: Store + ?Sized>(store: &S) {
    let (_, scope) = new_binding(store, "write-and-commit").await;
    let (pending, head) = store
        .write_and_commit(
            &scope,
            b"one",
            &key(&scope, "one"),
            &commit("", 0, "run-1"),
            Some("idx/one"),
        )
        .await
        .expect("write and commit");
    assert_eq!(head.revision, 1);
    assert_eq!(
        head.state_id, pending.state_id,
        "the head is the state just written"
    );
    assert_eq!(
        store
            .read_state(&scope, &pending.state_id)
            .await
            .expect("read"),
        Some(b"one".to_vec())
    );
    let (_, retried) = store
        .write_and_commit(
            &scope,
            b"one",
            &key(&scope, "one"),
            &commit("", 0, "run-1"),
            Some("idx/one"),
        )
        .await
        .expect("retry");
    assert_eq!(retried.revision, 1, "a retry returns the head it made");
    assert_eq!(
        store
            .get_object(&scope, "idx/one")
            .await
            .expect("get")
            .and_then(|o| o.body),
        Some(b"one".to_vec()),
        "the index object holds the committed body"
    );
    // The body is stored once: the index object refers to the committed state. Every
    // read path resolves it, the metadata is the body's, and a later put of the
    // object's own replaces the reference (and a later indexed commit replaces that).
    let listed = store
        .list_objects(
            &scope,
            &ObjectQuery {
                prefix: "idx/".into(),
                before: None,
                limit: 10,
                with_bodies: true,
            },
        )
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].body.as_deref(), Some(&b"one"[..]));
    assert_eq!(listed[0].meta.size, 3);
    assert_eq!(listed[0].meta.version, 1);
    let own = store
        .put_object(&scope, "idx/one", b"replaced", PutMode::Upsert)
        .await
        .expect("put over an index object");
    assert_eq!(own.version, 2);
    assert_eq!(
        store
            .get_object(&scope, "idx/one")
            .await
            .expect("get")
            .and_then(|o| o.body),
        Some(b"replaced".to_vec())
    );
    assert_eq!(
        store
            .read_state(&scope, &pending.state_id)
            .await
            .expect("read"),
        Some(b"one".to_vec()),
        "the committed state keeps its body"
    );
    let (_, second) = store
        .write_and_commit(
            &scope,
            b"second body",
            &key(&scope, "second"),
            &commit("", 1, "run-1b"),
            Some("idx/one"),
        )
        .await
        .expect("a second indexed commit");
    assert_eq!(second.revision, 2);
    let again = store
        .get_object(&scope, "idx/one")
        .await
        .expect("get")
        .expect("the index object");
    assert_eq!(again.body.as_deref(), Some(&b"second body"[..]));
    assert_eq!((again.meta.version, again.meta.size), (3, 11));
    assert_eq!(
        code(
            store
                .write_and_commit(
                    &scope,
                    b"two",
                    &key(&scope, "two"),
                    &commit("", 0, "run-2"),
                    Some("idx/two")
                )
                .await
        ),
        "revision_conflict"
    );
    let stale = StateScope {
        lease_generation: scope.lease_generation + 1,
        ..scope.clone()
    };
    assert_eq!(
        code(
            store
                .write_and_commit(
                    &stale,
                    b"three",
                    &key(&scope, "three"),
                    &commit("", 1, "run-3"),
                    None
                )
                .await
        ),
        "stale_lease"
    );
    assert_eq!(
        store
            .load_head(&scope)
            .await
            .expect("load")
            .map(|h| h.revision),
        Some(2),
        "refused calls leave the head alone"
    );
    assert!(
        store
            .get_object(&scope, "idx/two")
            .await
            .expect("get")
            .is_none(),
        "a refused commit indexes nothing"
    );
}

/// A binding's activity time (what idle hibernation measures) is known from its
/// creation, never goes back with writes, and stays within the clock; an unknown binding
/// has none.
pub async fn activity_follows_writes<S: Store + ?Sized>(store: &S) {
    let (record, scope) = new_binding(store, "activity").await;
    let created = store
        .last_activity_ms(&record.binding_id)
        .await
        .expect("activity")
        .expect("a new binding has an activity time");
    assert!(
        created >= record.created_at_ms - 1_000 && created <= now_ms(),
        "activity {created} is the creation time {}",
        record.created_at_ms
    );
    store
        .append(
            &scope,
            "activity/messages",
            &[NewEntry {
                id: "m1".into(),
                body: b"hello".to_vec(),
            }],
        )
        .await
        .expect("append");
    let after = store
        .last_activity_ms(&record.binding_id)
        .await
        .expect("activity")
        .expect("still known");
    assert!(
        after >= created && after <= now_ms(),
        "activity after a write: {after}, before: {created}"
    );
    let unknown = keyring().binding_id("user:nobody@example.com", "agent-1", "none");
    assert_eq!(
        store.last_activity_ms(&unknown).await.expect("activity"),
        None
    );
}

/// Every case, by name, so each backend's test file can check it wires them all.
pub const CASES: &[&str] = &[
    "head_is_the_last_commit_never_a_pending_entry",
    "stale_revision_is_refused",
    "stale_lease_is_refused_even_when_the_revision_matches",
    "stale_epoch_is_refused",
    "duplicate_writes_return_one_reference",
    "clear_starts_a_new_epoch",
    "bounds_give_clear_errors",
    "concurrent_committers_exactly_one_wins_per_revision",
    "a_thousand_bindings_never_read_each_other",
    "mark_uncertain_fences_the_run_until_reconciled",
    "interrupts_resume_exactly_once",
    "native_objects_put_get_list_delete",
    "native_streams_dedupe_order_and_cascade",
    "retention_sweeps_delete_by_policy_and_audit",
    "binding_identity_is_create_or_get",
    "write_and_commit_is_a_turn_in_one_call",
    "activity_follows_writes",
    "ledger_envelope_and_sequence",
    "ledger_appends_are_fenced",
    "ledger_appends_are_idempotent_by_key",
    "ledger_refuses_bad_payloads",
    "ledger_effect_rules",
    "ledger_budgets_trip",
    "ledger_approval_gates_tools_without_defence",
    "ledger_run_read_replays_and_snapshots",
    "ledger_concurrent_appends_have_no_gaps",
    "ledger_episode_work_tree_and_corrections",
    "ledger_signals_have_one_holder_and_rising_tokens",
    "random_operation_sequences_match_the_model",
];

/// Declares one `#[tokio::test]` per case for a backend. `$open` is an async expression
/// building a fresh store; `$close` receives it for cleanup.
#[macro_export]
macro_rules! conformance_tests {
    ($open:expr, $close:expr) => {
        $crate::conformance_tests!($open, $close; isolation_bindings = 1000);
    };
    ($open:expr, $close:expr; isolation_bindings = $n:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bindings_never_read_each_other() {
            let (store, guard) = $open("bindings_never_read_each_other").await;
            store_conformance::bindings_never_read_each_other(&store, $n).await;
            $close(store, guard).await;
        }
        $crate::conformance_tests!(@cases $open, $close;
            head_is_the_last_commit_never_a_pending_entry,
            stale_revision_is_refused,
            stale_lease_is_refused_even_when_the_revision_matches,
            stale_epoch_is_refused,
            duplicate_writes_return_one_reference,
            clear_starts_a_new_epoch,
            bounds_give_clear_errors,
            concurrent_committers_exactly_one_wins_per_revision,
            mark_uncertain_fences_the_run_until_reconciled,
            interrupts_resume_exactly_once,
            native_objects_put_get_list_delete,
            native_streams_dedupe_order_and_cascade,
            retention_sweeps_delete_by_policy_and_audit,
            binding_identity_is_create_or_get,
            write_and_commit_is_a_turn_in_one_call,
            activity_follows_writes,
            random_operation_sequences_match_the_model
        );
        $crate::conformance_tests!(@ledger $open, $close;
            ledger_envelope_and_sequence,
            ledger_appends_are_fenced,
            ledger_appends_are_idempotent_by_key,
            ledger_refuses_bad_payloads,
            ledger_effect_rules,
            ledger_budgets_trip,
            ledger_approval_gates_tools_without_defence,
            ledger_run_read_replays_and_snapshots,
            ledger_concurrent_appends_have_no_gaps,
            ledger_episode_work_tree_and_corrections,
            ledger_signals_have_one_holder_and_rising_tokens
        );
        #[test]
        fn every_conformance_case_is_wired() {
            assert_eq!(store_conformance::CASES.len(), 29, "add new cases to conformance_tests!");
        }
    };
    (@ledger $open:expr, $close:expr; $($case:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (store, guard) = $open(stringify!($case)).await;
                store_conformance::ledger::$case(&store).await;
                $close(store, guard).await;
            }
        )+
    };
    (@cases $open:expr, $close:expr; $($case:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (store, guard) = $open(stringify!($case)).await;
                store_conformance::$case(&store).await;
                $close(store, guard).await;
            }
        )+
    };
}
