//! Ledger cases of the conformance suite (`spec/002_6a0ddaf11b83bfe4.txt` §3, §5, §10;
//! `spec/003_bab976795353d872.txt` "Event And Outcome Authority"), run on every backend.

use std::collections::HashSet;

use futures::future::join_all;
use harness_engine::{
    domain::{
        ledger::{
            AppendRequest, Budget, Budgets, EffectStatus, EventType, LedgerState, NewEvent,
            REDUCER_VERSION, Versions,
        },
        state::StateScope,
    },
    store::{Store, ledger::LedgerAppend},
};
use serde_json::{Value, json};

use super::{code, keyring, new_binding, scope_of};

pub fn event(t: EventType, run: &str, turn: &str, payload: Value) -> NewEvent {
    NewEvent {
        event_type: t,
        run_id: run.into(),
        turn_id: turn.into(),
        agent_id: "refunds.v3".into(),
        lamport: None,
        versions: Versions {
            model: "scripted-model".into(),
            prompt: "refunds-sys@1".into(),
            tools: "payments@1".into(),
            policy: "guardrails@1".into(),
            ..Versions::default()
        },
        payload,
    }
}

pub fn request(e: NewEvent) -> AppendRequest {
    AppendRequest {
        event: e,
        ..AppendRequest::default()
    }
}

pub fn keyed(e: NewEvent, scope: &StateScope, key: &str) -> AppendRequest {
    AppendRequest {
        event: e,
        idempotency: Some(
            keyring()
                .idempotency_digest(&scope.binding_id, "ledger.append", key)
                .as_str()
                .to_owned(),
        ),
        ..AppendRequest::default()
    }
}

pub async fn append<S: Store + ?Sized>(
    store: &S,
    scope: &StateScope,
    request: &AppendRequest,
) -> LedgerAppend {
    store
        .append_event(scope, request)
        .await
        .unwrap_or_else(|e| panic!("append {:?}: {e}", request.event.event_type))
}

pub fn attempt(key: &str) -> Value {
    json!({"tool": "issue_refund", "idempotency_key": key, "args": {"order": "A-1", "amount_cents": 2000}, "irreversible": true})
}

pub fn observed(key: &str, outcome: &str, via: &str) -> Value {
    json!({"idempotency_key": key, "outcome": outcome, "via": via, "result": {"refund_id": "re_1"}})
}

async fn started<S: Store + ?Sized>(store: &S, name: &str) -> StateScope {
    let (_, scope) = new_binding(store, name).await;
    append(
        store,
        &scope,
        &request(event(EventType::RunStarted, "run-1", "t1", json!({}))),
    )
    .await;
    scope
}

async fn last_seq<S: Store + ?Sized>(store: &S, scope: &StateScope) -> u64 {
    store.ledger_state(scope).await.expect("state").last_seq
}

/// The envelope: gapless sequence, the server's Lamport counter, sortable unique ids,
/// intent hash, recorded versions; an expected last sequence is a precondition.
pub async fn ledger_envelope_and_sequence<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-envelope").await;
    let mut e = event(
        EventType::ContextAssembled,
        "run-1",
        "t1",
        json!({"budget": {"used_tokens": 10, "limit_tokens": 100}}),
    );
    e.lamport = Some(40);
    let second = append(store, &scope, &request(e)).await.event;
    assert_eq!((second.seq, second.lamport), (2, 41));
    let third = append(
        store,
        &scope,
        &request(event(
            EventType::GuardrailEvaluated,
            "run-1",
            "t1",
            json!({"guardrail": "pii", "result": "skip"}),
        )),
    )
    .await
    .event;
    assert_eq!((third.seq, third.lamport), (3, 42));
    assert_eq!(third.versions.reducer, REDUCER_VERSION);
    assert_eq!(third.versions.model, "scripted-model");
    assert_eq!(third.versions.schema, "GuardrailEvaluated/1");
    assert_eq!(third.binding_id, scope.binding_id.as_str());
    assert!(third.intent_hash.starts_with("sha256:"));
    assert!(second.event_id != third.event_id && second.event_id.len() == 26);

    let stale = AppendRequest {
        expected_last_seq: Some(2),
        ..request(event(EventType::ContextAssembled, "run-1", "t1", json!({})))
    };
    assert_eq!(
        code(store.append_event(&scope, &stale).await),
        "sequence_conflict"
    );
    let fresh = AppendRequest {
        expected_last_seq: Some(3),
        ..stale
    };
    assert_eq!(append(store, &scope, &fresh).await.event.seq, 4);
    let events = store
        .ledger_events(&scope, None, 0, 100)
        .await
        .expect("events");
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(
        events[1], second,
        "the stored event is the acknowledged one"
    );
}

/// Appends are fenced like every state write: a replaced worker (`stale_lease`) and a
/// cleared conversation (`stale_epoch`) append nothing.
pub async fn ledger_appends_are_fenced<S: Store + ?Sized>(store: &S) {
    let (record, _) = new_binding(store, "ledger-fenced").await;
    let old = scope_of(&record, 0, 1);
    append(
        store,
        &old,
        &request(event(EventType::RunStarted, "run-1", "t1", json!({}))),
    )
    .await;
    store
        .raise_fence(&record.binding_id, 0, 2)
        .await
        .expect("raise");
    let late = request(event(
        EventType::EffectAttempted,
        "run-1",
        "t1",
        attempt("k"),
    ));
    assert_eq!(code(store.append_event(&old, &late).await), "stale_lease");
    let new = scope_of(&record, 0, 2);
    assert_eq!(
        last_seq(store, &new).await,
        1,
        "the stale append left nothing"
    );
    store.clear(&record.binding_id, 1).await.expect("clear");
    assert_eq!(code(store.append_event(&new, &late).await), "stale_epoch");
    let next = scope_of(&record, 1, 2);
    assert_eq!(
        last_seq(store, &next).await,
        0,
        "a new epoch has its own ledger"
    );
    let first = append(
        store,
        &next,
        &request(event(EventType::RunStarted, "run-1", "t1", json!({}))),
    )
    .await;
    assert_eq!(first.event.seq, 1);
}

/// Same key and payload return the original event; another payload under the key is
/// `idempotency_mismatch`; neither appends.
pub async fn ledger_appends_are_idempotent_by_key<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-idempotent").await;
    let req = keyed(
        event(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
        &scope,
        "call-1",
    );
    let first = append(store, &scope, &req).await;
    assert!(!first.replayed);
    let mut retry = req.clone();
    retry.event.lamport = Some(99);
    let again = append(store, &scope, &retry).await;
    assert!(again.replayed);
    assert_eq!(again.event, first.event);
    let mut other = req.clone();
    other.event.payload = attempt("k2");
    assert_eq!(
        code(store.append_event(&scope, &other).await),
        "idempotency_mismatch"
    );
    assert_eq!(last_seq(store, &scope).await, 2);
}

/// Refused payloads change nothing: hidden reasoning at any depth and in normalized
/// spellings, `why`, over 32 KiB, an unknown outcome value.
pub async fn ledger_refuses_bad_payloads<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-payloads").await;
    for (payload, expected) in [
        (json!({"nested": {"Thought-Process": "..."}}), "invalid"),
        (json!({"items": [{"ANALYSIS": "..."}]}), "invalid"),
        (json!({"chain_of_thought": "..."}), "invalid"),
        (json!({"why": "because"}), "invalid"),
        (json!({"blob": "x".repeat(33 << 10)}), "too_large"),
    ] {
        let req = request(event(EventType::ContextAssembled, "run-1", "t1", payload));
        assert_eq!(code(store.append_event(&scope, &req).await), expected);
    }
    let req = request(event(
        EventType::ContextAssembled,
        "run-1",
        "t1",
        json!({"analysis_digest": "sha256:00", "rationale": "the customer asked"}),
    ));
    append(store, &scope, &req).await;
    let bad = request(event(
        EventType::EffectOutcomeObserved,
        "run-1",
        "t1",
        json!({"idempotency_key": "k", "outcome": "success"}),
    ));
    assert_eq!(code(store.append_event(&scope, &bad).await), "invalid");
    assert_eq!(last_seq(store, &scope).await, 2);
}

/// §5: a confirmed effect is never attempted again, an unknown one only through
/// reconciliation or a person, a refused one may be retried; concurrent attempts under
/// one key: exactly one is recorded.
pub async fn ledger_effect_rules<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-effects").await;
    let attempts = join_all((0..6).map(|_| {
        let req = request(event(
            EventType::EffectAttempted,
            "run-1",
            "t1",
            attempt("refund-1"),
        ));
        let scope = &scope;
        async move { store.append_event(scope, &req).await }
    }))
    .await;
    let ok = attempts.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "one attempt in flight per key");
    for r in attempts.into_iter().filter(Result::is_err) {
        assert_eq!(code(r), "effect_unresolved");
    }
    let unknown = request(event(
        EventType::EffectOutcomeObserved,
        "run-1",
        "t1",
        observed("refund-1", "unknown", "direct"),
    ));
    append(store, &scope, &unknown).await;
    let retry = request(event(
        EventType::EffectAttempted,
        "run-1",
        "t2",
        attempt("refund-1"),
    ));
    assert_eq!(
        code(store.append_event(&scope, &retry).await),
        "effect_unresolved"
    );
    let reconciled = request(event(
        EventType::EffectOutcomeObserved,
        "run-1",
        "t1",
        observed("refund-1", "confirmed", "reconciliation"),
    ));
    append(store, &scope, &reconciled).await;
    assert_eq!(
        code(store.append_event(&scope, &retry).await),
        "effect_confirmed"
    );
    let state = store.ledger_state(&scope).await.expect("state");
    let effect = &state.effects["refund-1"];
    assert_eq!(
        (effect.status, effect.attempts),
        (EffectStatus::Confirmed, 1)
    );
    assert_eq!(effect.result, Some(json!({"refund_id": "re_1"})));

    append(
        store,
        &scope,
        &request(event(
            EventType::EffectAttempted,
            "run-1",
            "t2",
            attempt("refund-2"),
        )),
    )
    .await;
    append(
        store,
        &scope,
        &request(event(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t2",
            observed("refund-2", "refused", "direct"),
        )),
    )
    .await;
    append(
        store,
        &scope,
        &request(event(
            EventType::EffectAttempted,
            "run-1",
            "t3",
            attempt("refund-2"),
        )),
    )
    .await;
    assert_eq!(
        store.ledger_state(&scope).await.expect("state").effects["refund-2"].attempts,
        2
    );
}

/// Budgets are circuit breakers enforced at append time (§10.1).
pub async fn ledger_budgets_trip<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-budgets").await;
    let budgets = Budgets {
        per_turn: Budget {
            irreversible: Some(1),
            ..Budget::default()
        },
        per_run: Budget {
            steps: Some(4),
            ..Budget::default()
        },
    };
    let with = |e: NewEvent| AppendRequest {
        event: e,
        budgets,
        ..AppendRequest::default()
    };
    append(
        store,
        &scope,
        &with(event(
            EventType::EffectAttempted,
            "run-1",
            "t1",
            attempt("a"),
        )),
    )
    .await;
    let second = with(event(
        EventType::EffectAttempted,
        "run-1",
        "t1",
        attempt("b"),
    ));
    assert_eq!(
        code(store.append_event(&scope, &second).await),
        "budget_exceeded"
    );
    append(
        store,
        &scope,
        &with(event(EventType::ContextAssembled, "run-1", "t2", json!({}))),
    )
    .await;
    append(
        store,
        &scope,
        &with(event(EventType::ContextAssembled, "run-1", "t2", json!({}))),
    )
    .await;
    let fifth = with(event(EventType::ContextAssembled, "run-1", "t3", json!({})));
    assert_eq!(
        code(store.append_event(&scope, &fifth).await),
        "budget_exceeded"
    );
    assert_eq!(last_seq(store, &scope).await, 4);
}

/// A tool without a defence (§5.2): its attempt needs an approval, which a person
/// gives through `HumanReviewResolved`; the approval admits one attempt. Same refusals,
/// same codes, nothing appended by a refusal, on every backend.
pub async fn ledger_approval_gates_tools_without_defence<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-approval").await;
    let gated = |e: NewEvent| AppendRequest {
        event: e,
        approval_required: true,
        ..AppendRequest::default()
    };
    let try_ = |r: AppendRequest| {
        let scope = scope.clone();
        async move { code(store.append_event(&scope, &r).await) }
    };
    let attempt_k = || event(EventType::EffectAttempted, "run-1", "t1", attempt("fax-1"));
    let before = last_seq(store, &scope).await;
    assert_eq!(try_(gated(attempt_k())).await, "approval_required");
    assert_eq!(
        last_seq(store, &scope).await,
        before,
        "a refusal appends nothing"
    );
    append(
        store,
        &scope,
        &gated(event(
            EventType::HumanReviewRequested,
            "run-1",
            "t1",
            json!({"idempotency_key": "fax-1", "reason": "no defence", "approval": true,
                   "tool": "issue_refund"}),
        )),
    )
    .await;
    assert_eq!(try_(gated(attempt_k())).await, "effect_unresolved");
    let approved = append(
        store,
        &scope,
        &request(event(
            EventType::HumanReviewResolved,
            "run-1",
            "t1",
            json!({"idempotency_key": "fax-1", "decision": "approved"}),
        )),
    )
    .await;
    assert_eq!(
        approved.signals.effect.map(|e| e.status),
        Some(EffectStatus::Approved)
    );
    let attempted = append(store, &scope, &gated(attempt_k())).await;
    assert_eq!(
        attempted.signals.effect.map(|e| (e.status, e.attempts)),
        Some((EffectStatus::Attempted, 1))
    );
    append(
        store,
        &scope,
        &gated(event(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            observed("fax-1", "refused", "direct"),
        )),
    )
    .await;
    assert_eq!(
        try_(gated(attempt_k())).await,
        "approval_required",
        "each attempt needs its own approval"
    );
}

/// A run read returns its events after a sequence and the state folded from all of
/// them; the folded state equals a replay of the stored events, and a snapshot plus the
/// events after it folds to the same state.
pub async fn ledger_run_read_replays_and_snapshots<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-read").await;
    append(
        store,
        &scope,
        &request(event(EventType::RunStarted, "run-2", "t1", json!({}))),
    )
    .await;
    for i in 0..5 {
        let run = if i % 2 == 0 { "run-1" } else { "run-2" };
        append(
            store,
            &scope,
            &request(event(
                EventType::GuardrailEvaluated,
                run,
                "t1",
                json!({"guardrail": "pii", "result": "pass", "i": i}),
            )),
        )
        .await;
    }
    let snapshot = store.snapshot_ledger(&scope).await.expect("snapshot");
    assert_eq!(snapshot.seq, 7);
    append(
        store,
        &scope,
        &request(event(
            EventType::EffectAttempted,
            "run-1",
            "t2",
            attempt("k"),
        )),
    )
    .await;
    append(
        store,
        &scope,
        &request(event(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t2",
            observed("k", "confirmed", "direct"),
        )),
    )
    .await;
    append(
        store,
        &scope,
        &request(event(
            EventType::RunCompleted,
            "run-1",
            "t2",
            json!({"outcome": "resolved", "usage": {"cost_units": 3}}),
        )),
    )
    .await;

    let read = store.read_run(&scope, "run-1", 4, 100).await.expect("read");
    assert_eq!(
        read.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![5, 7, 8, 9, 10]
    );
    assert!(read.events.iter().all(|e| e.run_id == "run-1"));
    assert_eq!(read.last_seq, 10);
    assert_eq!(read.state.guardrails_passed, 3);
    assert_eq!(read.state.outcomes_confirmed, 1);
    assert!(read.effects.contains_key("k"));

    let all = store
        .ledger_events(&scope, None, 0, 100)
        .await
        .expect("all");
    let head = store.ledger_state(&scope).await.expect("head");
    assert_eq!(
        LedgerState::replay(&all),
        head,
        "state replay is deterministic"
    );
    let latest = store
        .ledger_snapshot(&scope)
        .await
        .expect("snapshot read")
        .expect("a snapshot");
    assert_eq!(latest, snapshot);
    let mut folded = latest.state;
    for e in all.iter().filter(|e| e.seq > latest.seq) {
        folded.apply(e);
    }
    assert_eq!(folded, head);
    assert_eq!(
        code(store.read_run(&scope, "run-9", 0, 10).await),
        "not_found"
    );
}

/// Eight writers append ten events each at once: sequence 1..=81 exactly, no gap, no
/// duplicate, every acknowledged event stored.
pub async fn ledger_concurrent_appends_have_no_gaps<S: Store + ?Sized>(store: &S) {
    let scope = started(store, "ledger-concurrent").await;
    let acked = join_all((0..8).map(|w| {
        let scope = &scope;
        async move {
            let mut seqs = Vec::new();
            for i in 0..10 {
                let req = request(event(
                    EventType::ContextAssembled,
                    "run-1",
                    &format!("w{w}"),
                    json!({"i": i}),
                ));
                seqs.push(append(store, scope, &req).await.event);
            }
            seqs
        }
    }))
    .await
    .concat();
    let stored = store
        .ledger_events(&scope, None, 0, 100)
        .await
        .expect("events");
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=81).collect::<Vec<_>>()
    );
    let ids: HashSet<&str> = stored.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), 81);
    for e in &acked {
        assert_eq!(stored.get(usize::try_from(e.seq - 1).unwrap_or(0)), Some(e));
    }
    let lamports: Vec<u64> = stored.iter().map(|e| e.lamport).collect();
    assert!(
        lamports.windows(2).all(|w| w[0] < w[1]),
        "Lamport strictly increases"
    );
}

/// The episode contract (`spec/003` "Event And Outcome Authority") on every backend:
/// the work tree, an illegal move and a stale governed-v2 precondition refused with the
/// same codes and nothing appended, a correction that keeps `terminal_at_ms`, and the
/// stored head equal to the events folded again (new fields survive the backend's
/// encoding of the head).
pub async fn ledger_episode_work_tree_and_corrections<S: Store + ?Sized>(store: &S) {
    use harness_engine::domain::ledger::{RunPreconditions, WorkItemStatus};
    let (_, scope) = new_binding(store, "ledger-episode").await;
    let ev = |t: EventType, payload: Value| event(t, "run_e", "t1", payload);
    append(
        store,
        &scope,
        &request(ev(
            EventType::RunStarted,
            json!({"root_work_item_id": "wi_root"}),
        )),
    )
    .await;
    let refused = store
        .append_event(
            &scope,
            &request(ev(
                EventType::WorkItemCompleted,
                json!({"work_item_id": "wi_root"}),
            )),
        )
        .await;
    assert_eq!(code(refused), "conflict");
    for (t, payload) in [
        (
            EventType::WorkItemStarted,
            json!({"work_item_id": "wi_root"}),
        ),
        (
            EventType::WorkItemCreated,
            json!({"work_item_id": "wi_child", "parent_work_item_id": "wi_root"}),
        ),
        (
            EventType::ArtifactCreated,
            json!({"artifact_id": "art_1", "artifact": {"sha256": "c".repeat(64), "mime_type": "application/pdf", "uri": "https://files.example/r.pdf", "metadata": {"pages": 2}}}),
        ),
    ] {
        append(store, &scope, &request(ev(t, payload))).await;
    }
    let mut governed = ev(
        EventType::WorkItemStarted,
        json!({"work_item_id": "wi_child"}),
    );
    governed.versions.schema = "work_item_started/2".into();
    let stale = AppendRequest {
        event: governed.clone(),
        preconditions: Some(RunPreconditions {
            run_last_seq: 3,
            status: "pending".into(),
        }),
        ..AppendRequest::default()
    };
    let err = store.append_event(&scope, &stale).await;
    assert_eq!(code(err), "sequence_conflict");
    assert_eq!(store.ledger_state(&scope).await.expect("state").last_seq, 4);
    append(
        store,
        &scope,
        &AppendRequest {
            event: governed,
            preconditions: Some(RunPreconditions {
                run_last_seq: 4,
                status: "pending".into(),
            }),
            ..AppendRequest::default()
        },
    )
    .await;
    for (t, payload) in [
        (
            EventType::WorkItemFailed,
            json!({"work_item_id": "wi_child"}),
        ),
        (
            EventType::WorkItemCompleted,
            json!({"work_item_id": "wi_root"}),
        ),
        (EventType::RunCompleted, json!({"outcome": "resolved"})),
    ] {
        append(store, &scope, &request(ev(t, payload))).await;
    }
    let completed = store.ledger_state(&scope).await.expect("state");
    let terminal_at = completed.runs["run_e"].episode.terminal_at_ms;
    assert!(terminal_at.is_some());
    let reopen = store
        .append_event(
            &scope,
            &request(ev(
                EventType::WorkItemStarted,
                json!({"work_item_id": "wi_child"}),
            )),
        )
        .await;
    assert_eq!(code(reopen), "conflict");
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    append(
        store,
        &scope,
        &request(ev(
            EventType::RunOutcomeCorrected,
            json!({"outcome": "regression", "regression_of_run_id": "run_0"}),
        )),
    )
    .await;
    let head = store.ledger_state(&scope).await.expect("state");
    let episode = &head.runs["run_e"].episode;
    assert_eq!(
        episode.terminal_at_ms, terminal_at,
        "a correction keeps terminal_at"
    );
    assert!(episode.current_outcome_updated_at_ms > terminal_at);
    assert_eq!(
        episode.work_items["wi_child"].status,
        WorkItemStatus::Failed
    );
    assert_eq!(episode.artifacts["art_1"].mime_type, "application/pdf");
    let events = store
        .ledger_events(&scope, None, 0, 1000)
        .await
        .expect("events");
    assert_eq!(
        LedgerState::replay(&events),
        head,
        "the stored head is the events folded again"
    );
}

/// Leased signals (spec 003 "claim_signal", "extend_signal_lease", "ack_signal"): of many
/// concurrent claims exactly one holds the signal; a held signal refuses other claims;
/// an expired lease is taken over with a higher fencing token, after which the old
/// token neither extends nor acknowledges; an acknowledged signal is claimed again with
/// the next token; refusals append nothing; the head is the events folded again.
pub async fn ledger_signals_have_one_holder_and_rising_tokens<S: Store + ?Sized>(store: &S) {
    use harness_engine::domain::ledger::signal::{SIGNAL_RUN, SignalState};
    let (_, scope) = new_binding(store, "ledger-signals").await;
    let ev = |t: EventType, payload: Value| event(t, SIGNAL_RUN, "t1", payload);
    let claim = |holder: &str, lease_ms: u64| {
        request(ev(
            EventType::SignalClaimed,
            json!({"signal_id": "deploy-lock", "holder": holder, "lease_ms": lease_ms}),
        ))
    };
    let claims: Vec<AppendRequest> = (0..8)
        .map(|i| claim(&format!("agent-{i}"), 1_000))
        .collect();
    let raced = join_all(claims.iter().map(|r| store.append_event(&scope, r))).await;
    let winners: Vec<&LedgerAppend> = raced.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one of eight concurrent claims holds"
    );
    for lost in raced.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(lost.code(), "conflict", "{lost}");
    }
    let first = store.ledger_state(&scope).await.expect("state");
    assert_eq!(first.last_seq, 1, "the refused claims appended nothing");
    let held = &first.signals["deploy-lock"];
    assert_eq!((held.fencing_token, held.state), (1, SignalState::Held));
    let first_holder = held.holder.clone();
    let err = store.append_event(&scope, &claim("late", 60_000)).await;
    assert_eq!(code(err), "conflict", "a held signal refuses another claim");

    // The one-second lease runs out by the store's clock; another agent takes over.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    append(store, &scope, &claim("agent-z", 60_000)).await;
    let taken = store.ledger_state(&scope).await.expect("state");
    let now = &taken.signals["deploy-lock"];
    assert_eq!((now.holder.as_str(), now.fencing_token), ("agent-z", 2));
    assert_ne!(first_holder, "agent-z");
    for t in [EventType::SignalLeaseExtended, EventType::SignalAcked] {
        let stale = store
            .append_event(
                &scope,
                &request(ev(
                    t,
                    json!({"signal_id": "deploy-lock", "fencing_token": 1, "lease_ms": 60_000}),
                )),
            )
            .await;
        assert_eq!(code(stale), "conflict", "{t:?} with the superseded token");
    }
    let missing = store
        .append_event(
            &scope,
            &request(ev(
                EventType::SignalAcked,
                json!({"signal_id": "nothing", "fencing_token": 1}),
            )),
        )
        .await;
    assert_eq!(code(missing), "not_found");
    assert_eq!(
        last_seq(store, &scope).await,
        2,
        "refusals appended nothing"
    );
    append(
        store,
        &scope,
        &request(ev(
            EventType::SignalLeaseExtended,
            json!({"signal_id": "deploy-lock", "fencing_token": 2, "lease_ms": 120_000}),
        )),
    )
    .await;
    append(
        store,
        &scope,
        &request(ev(
            EventType::SignalAcked,
            json!({"signal_id": "deploy-lock", "fencing_token": 2}),
        )),
    )
    .await;
    let twice = store
        .append_event(
            &scope,
            &request(ev(
                EventType::SignalAcked,
                json!({"signal_id": "deploy-lock", "fencing_token": 2}),
            )),
        )
        .await;
    assert_eq!(code(twice), "conflict", "an acknowledgement is final");
    append(store, &scope, &claim("agent-y", 60_000)).await;
    let head = store.ledger_state(&scope).await.expect("state");
    let again = &head.signals["deploy-lock"];
    assert_eq!(
        (again.holder.as_str(), again.fencing_token, again.state),
        ("agent-y", 3, SignalState::Held)
    );
    let events = store
        .ledger_events(&scope, Some(SIGNAL_RUN), 0, 100)
        .await
        .expect("events");
    assert_eq!(events.len(), 5);
    assert_eq!(
        LedgerState::replay(&events),
        head,
        "the stored head is the events folded again"
    );
}
