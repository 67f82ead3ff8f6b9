use serde_json::{Value, json};

use super::*;

fn new(t: EventType, run: &str, turn: &str, payload: Value) -> NewEvent {
    NewEvent {
        event_type: t,
        run_id: run.into(),
        turn_id: turn.into(),
        agent_id: "refunds.v3".into(),
        lamport: None,
        versions: Versions {
            model: "scripted".into(),
            ..Versions::default()
        },
        payload,
    }
}

/// Appends through the planner, as a store does; panics on refusal.
fn push(state: &mut LedgerState, event: NewEvent) -> LedgerEvent {
    try_push(state, event, Budgets::default()).expect("append")
}

fn try_push(
    state: &mut LedgerState,
    event: NewEvent,
    budgets: Budgets,
) -> Result<LedgerEvent, Rejection> {
    let request = AppendRequest {
        event,
        budgets,
        ..AppendRequest::default()
    };
    let id = event_id(1_000 + i64::try_from(state.last_seq).unwrap_or(0), 7);
    let plan = plan_append(state, &request, "b1", 0, id, 1_000)?;
    *state = plan.state;
    Ok(plan.event)
}

fn attempt(key: &str) -> Value {
    json!({"tool": "issue_refund", "idempotency_key": key, "args": {"order": "A-1", "amount": 20}, "irreversible": true})
}

fn outcome(key: &str, outcome: &str, via: &str) -> Value {
    json!({"idempotency_key": key, "outcome": outcome, "via": via, "result": {"refund_id": "r-1"}})
}

fn started() -> LedgerState {
    let mut s = LedgerState::default();
    push(&mut s, new(EventType::RunStarted, "run-1", "t1", json!({})));
    s
}

#[test]
fn envelope_fields_are_minted_by_the_server() {
    let mut s = LedgerState::default();
    let mut e = new(
        EventType::RunStarted,
        "run-1",
        "t1",
        json!({"goal_digest": "sha256:ab"}),
    );
    e.lamport = Some(40);
    let first = push(&mut s, e);
    assert_eq!(first.seq, 1);
    assert_eq!(first.lamport, 41, "max(seen 0, client 40) + 1");
    assert_eq!(first.versions.reducer, REDUCER_VERSION);
    assert_eq!(first.versions.schema, "RunStarted/1");
    assert_eq!(first.versions.model, "scripted");
    assert!(first.intent_hash.starts_with("sha256:"));
    let mut e = new(EventType::ContextAssembled, "run-1", "t1", json!({}));
    e.lamport = Some(3);
    let second = push(&mut s, e);
    assert_eq!(
        (second.seq, second.lamport),
        (2, 42),
        "the server's counter wins"
    );
    assert_eq!(second.event_id.len(), 26);
}

#[test]
fn event_ids_sort_by_time() {
    let a = event_id(1_700_000_000_000, u128::MAX);
    let b = event_id(1_700_000_000_001, 0);
    assert!(a < b, "{a} < {b}");
    assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
}

#[test]
fn intent_hash_ignores_key_order_but_not_values() {
    let a = intent_hash(
        EventType::EffectAttempted,
        &json!({"a": 1, "b": {"x": 1, "y": 2}}),
    );
    let b = intent_hash(
        EventType::EffectAttempted,
        &json!({"b": {"y": 2, "x": 1}, "a": 1}),
    );
    let c = intent_hash(
        EventType::EffectAttempted,
        &json!({"a": 2, "b": {"x": 1, "y": 2}}),
    );
    let d = intent_hash(
        EventType::GuardrailEvaluated,
        &json!({"a": 1, "b": {"x": 1, "y": 2}}),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d, "the type is part of the hash");
}

#[test]
fn hidden_reasoning_and_transcripts_are_refused_at_any_depth() {
    for name in [
        "Thought-Process",
        "ANALYSIS",
        "chain_of_thought",
        "reasoning",
        "transcript",
        "raw_transcript",
        "scratch_pad",
        "why",
    ] {
        let payload = json!({"outer": [{"inner": {name: "..."}}]});
        let err = validate_payload(EventType::ContextAssembled, &payload).expect_err(name);
        assert_eq!(err.code(), "invalid", "{name}");
        assert!(
            err.to_string().contains(&format!("outer.0.inner.{name}")),
            "{err}"
        );
    }
    for name in [
        "analysis_digest",
        "transcript_sha256",
        "rationale",
        "reasoning_hash",
        "analyst",
    ] {
        validate_payload(EventType::ContextAssembled, &json!({"x": {name: "v"}}))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn payloads_are_bounded_and_typed() {
    let big = json!({"blob": "x".repeat(MAX_PAYLOAD_BYTES)});
    let err = validate_payload(EventType::ContextAssembled, &big).expect_err("too large");
    assert_eq!(err.code(), "too_large");
    assert_eq!(
        validate_payload(EventType::EffectAttempted, &json!({"tool": "t"}))
            .expect_err("key")
            .code(),
        "invalid"
    );
    let err = validate_payload(
        EventType::EffectOutcomeObserved,
        &json!({"idempotency_key": "k", "outcome": "success"}),
    )
    .expect_err("outcome");
    assert!(
        err.to_string().contains("confirmed, refused, unknown"),
        "{err}"
    );
    assert!(validate_payload(EventType::RunStarted, &json!([1])).is_err());
    assert!(
        validate_payload(
            EventType::GuardrailEvaluated,
            &json!({"guardrail": "pii", "result": "skip"})
        )
        .is_ok()
    );
}

#[test]
fn the_vocabulary_has_no_tool_executed() {
    assert!(EventType::parse("ToolExecuted").is_none());
    assert!(serde_json::from_value::<EventType>(json!("ToolExecuted")).is_err());
    for t in EventType::ALL {
        assert_eq!(EventType::parse(t.as_str()), Some(t));
    }
}

#[test]
fn a_confirmed_effect_is_never_attempted_again() {
    let mut s = started();
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    // In flight: no second attempt without an outcome in between.
    let err = try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
        Budgets::default(),
    )
    .expect_err("in flight");
    assert_eq!(err.code(), "effect_unresolved");
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "confirmed", "direct"),
        ),
    );
    let err = try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-2", "t1", attempt("k1")),
        Budgets::default(),
    )
    .expect_err("confirmed");
    assert!(matches!(
        err,
        Rejection::Conflict { .. } | Rejection::EffectConfirmed { .. }
    ));
    let err = try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t2", attempt("k1")),
        Budgets::default(),
    )
    .expect_err("confirmed");
    assert_eq!(err.code(), "effect_confirmed");
    assert_eq!(s.effects["k1"].result, Some(json!({"refund_id": "r-1"})));
}

#[test]
fn a_refused_effect_may_be_attempted_again() {
    let mut s = started();
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "refused", "direct"),
        ),
    );
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    assert_eq!(s.effects["k1"].attempts, 2);
    assert_eq!(s.effects["k1"].status, EffectStatus::Attempted);
}

#[test]
fn an_unknown_outcome_needs_reconciliation_or_a_person() {
    let mut s = started();
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "unknown", "direct"),
        ),
    );
    assert_eq!(
        try_push(
            &mut s,
            new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
            Budgets::default()
        )
        .expect_err("unknown")
        .code(),
        "effect_unresolved"
    );
    assert_eq!(
        try_push(
            &mut s,
            new(
                EventType::EffectOutcomeObserved,
                "run-1",
                "t1",
                outcome("k1", "confirmed", "direct")
            ),
            Budgets::default()
        )
        .expect_err("direct")
        .code(),
        "conflict"
    );
    let err = try_push(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "resolved"}),
        ),
        Budgets::default(),
    )
    .expect_err("resolved with an unknown effect");
    assert_eq!(err.code(), "effect_unresolved");
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "confirmed", "reconciliation"),
        ),
    );
    assert_eq!(s.effects["k1"].status, EffectStatus::Confirmed);
    assert_eq!(s.effects["k1"].via, Some(Via::Reconciliation));
    push(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "resolved"}),
        ),
    );
}

#[test]
fn human_review_decides_an_unreconcilable_effect() {
    let mut s = started();
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "unknown", "direct"),
        ),
    );
    push(
        &mut s,
        new(
            EventType::HumanReviewRequested,
            "run-1",
            "t1",
            json!({"idempotency_key": "k1", "reason": "provider cannot be queried"}),
        ),
    );
    assert_eq!(s.effects["k1"].status, EffectStatus::AwaitingHuman);
    assert_eq!(
        try_push(
            &mut s,
            new(
                EventType::EffectOutcomeObserved,
                "run-1",
                "t1",
                outcome("k1", "confirmed", "reconciliation")
            ),
            Budgets::default()
        )
        .expect_err("awaiting a person")
        .code(),
        "conflict"
    );
    push(
        &mut s,
        new(
            EventType::HumanReviewResolved,
            "run-1",
            "t1",
            json!({"idempotency_key": "k1", "decision": "refused"}),
        ),
    );
    assert_eq!(s.effects["k1"].status, EffectStatus::Refused);
    assert_eq!(s.effects["k1"].via, Some(Via::Human));
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t2", attempt("k1")),
    );
}

/// Appends an event whose tool needs approval (`defence: none` in the profile).
fn try_gated(state: &mut LedgerState, event: NewEvent) -> Result<LedgerEvent, Rejection> {
    let request = AppendRequest {
        event,
        approval_required: true,
        ..AppendRequest::default()
    };
    let id = event_id(1_000 + i64::try_from(state.last_seq).unwrap_or(0), 7);
    let plan = plan_append(state, &request, "b1", 0, id, 1_000)?;
    *state = plan.state;
    Ok(plan.event)
}

#[test]
fn a_tool_without_defence_is_attempted_only_after_each_approval() {
    let mut s = started();
    let review = |approval: bool| json!({"idempotency_key": "k1", "reason": "no defence", "approval": approval, "tool": "issue_refund"});
    let decide = |d: &str| json!({"idempotency_key": "k1", "decision": d});
    let attempt_k1 = || new(EventType::EffectAttempted, "run-1", "t1", attempt("k1"));
    let code = |r: Result<LedgerEvent, Rejection>| r.err().map(|e| e.code());

    // No approval yet: refused, nothing appended.
    let before = s.last_seq;
    assert_eq!(
        code(try_gated(&mut s, attempt_k1())),
        Some("approval_required")
    );
    assert_eq!(s.last_seq, before);
    // Asked: the effect waits, and cannot be attempted or asked again meanwhile.
    try_gated(
        &mut s,
        new(EventType::HumanReviewRequested, "run-1", "t1", review(true)),
    )
    .expect("ask");
    assert_eq!(s.effects["k1"].status, EffectStatus::AwaitingApproval);
    assert_eq!(s.effects["k1"].attempts, 0);
    assert_eq!(
        code(try_gated(&mut s, attempt_k1())),
        Some("effect_unresolved")
    );
    assert_eq!(
        code(try_gated(
            &mut s,
            new(EventType::HumanReviewRequested, "run-1", "t1", review(true))
        )),
        Some("conflict")
    );
    // An outcome decision is not an approval.
    assert_eq!(
        code(try_gated(
            &mut s,
            new(
                EventType::HumanReviewResolved,
                "run-1",
                "t1",
                decide("confirmed")
            )
        )),
        Some("conflict")
    );
    // A run cannot claim success past an approval nobody gave.
    assert_eq!(
        code(try_gated(
            &mut s,
            new(
                EventType::RunCompleted,
                "run-1",
                "t1",
                json!({"outcome": "resolved"})
            )
        )),
        Some("effect_unresolved")
    );
    // Rejected: refused by a person; asking again is allowed.
    try_gated(
        &mut s,
        new(
            EventType::HumanReviewResolved,
            "run-1",
            "t1",
            decide("rejected"),
        ),
    )
    .expect("reject");
    assert_eq!(s.effects["k1"].status, EffectStatus::Refused);
    assert_eq!(
        code(try_gated(&mut s, attempt_k1())),
        Some("approval_required")
    );
    try_gated(
        &mut s,
        new(EventType::HumanReviewRequested, "run-1", "t1", review(true)),
    )
    .expect("ask again");
    try_gated(
        &mut s,
        new(
            EventType::HumanReviewResolved,
            "run-1",
            "t1",
            decide("approved"),
        ),
    )
    .expect("approve");
    assert_eq!(s.effects["k1"].status, EffectStatus::Approved);
    assert_eq!(s.effects["k1"].via, Some(Via::Human));
    // The approval admits one attempt, and the attempt consumes it.
    try_gated(&mut s, attempt_k1()).expect("approved attempt");
    assert_eq!(s.effects["k1"].status, EffectStatus::Attempted);
    assert_eq!(s.effects["k1"].attempts, 1);
    try_gated(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "refused", "direct"),
        ),
    )
    .expect("refused by the provider");
    assert_eq!(
        code(try_gated(&mut s, attempt_k1())),
        Some("approval_required")
    );
    // A tool with a defence is never gated, and an approval request needs its tool.
    push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k2")),
    );
    assert_eq!(
        code(try_gated(
            &mut s,
            new(
                EventType::HumanReviewRequested,
                "run-1",
                "t1",
                json!({"idempotency_key": "k3", "reason": "r", "approval": true})
            )
        )),
        Some("invalid")
    );
}

#[test]
fn budgets_trip_with_a_specific_code() {
    let mut s = started();
    let budgets = Budgets {
        per_turn: Budget {
            irreversible: Some(1),
            ..Budget::default()
        },
        per_run: Budget {
            tokens: Some(100),
            ..Budget::default()
        },
    };
    try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
        budgets,
    )
    .expect("first");
    let err = try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k2")),
        budgets,
    )
    .expect_err("second irreversible in one turn");
    assert_eq!(err.code(), "budget_exceeded");
    assert!(
        err.to_string().contains("per-turn irreversible effects"),
        "{err}"
    );
    try_push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t2", attempt("k2")),
        budgets,
    )
    .expect("next turn");
    try_push(
        &mut s,
        new(
            EventType::ContextAssembled,
            "run-1",
            "t2",
            json!({"usage": {"tokens": 90}}),
        ),
        budgets,
    )
    .expect("90 tokens");
    let err = try_push(
        &mut s,
        new(
            EventType::ContextAssembled,
            "run-1",
            "t3",
            json!({"usage": {"tokens": 11}}),
        ),
        budgets,
    )
    .expect_err("101 tokens");
    assert!(err.to_string().contains("per-run tokens"), "{err}");
    assert_eq!(s.last_seq, 4, "refusals appended nothing");
}

#[test]
fn runs_start_once_and_close_once() {
    let mut s = started();
    assert_eq!(
        try_push(
            &mut s,
            new(EventType::RunStarted, "run-1", "t1", json!({})),
            Budgets::default()
        )
        .expect_err("again")
        .code(),
        "conflict"
    );
    assert!(
        try_push(
            &mut s,
            new(EventType::ContextAssembled, "run-9", "t1", json!({})),
            Budgets::default()
        )
        .is_err()
    );
    push(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "handed_to_human"}),
        ),
    );
    assert_eq!(s.runs["run-1"].outcome, Some(RunOutcomeKind::HandedToHuman));
    assert!(
        try_push(
            &mut s,
            new(EventType::ContextAssembled, "run-1", "t2", json!({})),
            Budgets::default()
        )
        .is_err()
    );
}

#[test]
fn three_identical_intents_in_a_row_are_a_loop() {
    let mut s = started();
    for i in 0..3 {
        push(
            &mut s,
            new(EventType::EffectAttempted, "run-1", "t1", attempt("same")),
        );
        push(
            &mut s,
            new(
                EventType::EffectOutcomeObserved,
                "run-1",
                "t1",
                outcome("same", "refused", "direct"),
            ),
        );
        let run = &s.runs["run-1"];
        assert_eq!(run.loops_detected, u64::from(i == 2));
    }
    let run = &s.runs["run-1"];
    assert_eq!((run.actions, run.repeated_actions), (3, 2));
}

#[test]
fn expected_last_sequence_is_a_precondition() {
    let s = started();
    let request = AppendRequest {
        event: new(EventType::ContextAssembled, "run-1", "t1", json!({})),
        expected_last_seq: Some(0),
        ..AppendRequest::default()
    };
    let err = plan_append(&s, &request, "b1", 0, event_id(1, 1), 1).expect_err("stale");
    assert_eq!(err.code(), "sequence_conflict");
    let request = AppendRequest {
        expected_last_seq: Some(1),
        ..request
    };
    assert_eq!(
        plan_append(&s, &request, "b1", 0, event_id(1, 1), 1)
            .expect("ok")
            .event
            .seq,
        2
    );
}

#[test]
fn replay_folds_to_the_state_the_appends_built() {
    let mut s = LedgerState::default();
    let mut events = vec![push(
        &mut s,
        new(EventType::RunStarted, "run-1", "t1", json!({})),
    )];
    events.push(push(
        &mut s,
        new(
            EventType::GuardrailEvaluated,
            "run-1",
            "t1",
            json!({"guardrail": "pii", "result": "skip"}),
        ),
    ));
    events.push(push(
        &mut s,
        new(
            EventType::ContextAssembled,
            "run-1",
            "t1",
            json!({"budget": {"used_tokens": 800, "limit_tokens": 1000}}),
        ),
    ));
    events.push(push(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k")),
    ));
    events.push(push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k", "confirmed", "direct"),
        ),
    ));
    assert_eq!(LedgerState::replay(&events), s);
    // A snapshot at an offset plus the tail folds to the same state.
    let mut from_snapshot = LedgerState::replay(&events[..2]);
    for e in &events[2..] {
        from_snapshot.apply(e);
    }
    assert_eq!(from_snapshot, s);
    let run = &s.runs["run-1"];
    assert_eq!(run.guardrails_skipped, 1);
    assert_eq!(run.context_utilisation, [0, 0, 0, 1, 0, 0]);
}

#[test]
fn idempotent_retries_compare_the_whole_request() {
    let mut s = started();
    let e = new(EventType::ContextAssembled, "run-1", "t1", json!({"a": 1}));
    let original = push(&mut s, e.clone());
    let mut retried = e.clone();
    retried.lamport = Some(99);
    assert_eq!(
        replay_or_mismatch(original.clone(), &retried).expect("same"),
        original
    );
    let other = new(EventType::ContextAssembled, "run-1", "t1", json!({"a": 2}));
    assert_eq!(
        replay_or_mismatch(original, &other)
            .expect_err("other")
            .code(),
        "idempotency_mismatch"
    );
}

/// Appends and returns the plan's signals.
fn push_signals(state: &mut LedgerState, event: NewEvent) -> AppendSignals {
    let request = AppendRequest {
        event,
        ..AppendRequest::default()
    };
    let id = event_id(2_000, 9);
    let plan = plan_append(state, &request, "b1", 0, id, 2_000).expect("append");
    *state = plan.state;
    plan.signals
}

#[test]
fn signals_report_loops_and_effects_waiting() {
    let mut s = started();
    let first = push_signals(
        &mut s,
        new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
    );
    assert_eq!(first.effect_before, None);
    assert_eq!(
        first.effect.as_ref().map(|e| e.status),
        Some(EffectStatus::Attempted)
    );
    assert_eq!(first.waiting_delta(), 0, "in flight is not waiting");
    let unknown = push_signals(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "unknown", "direct"),
        ),
    );
    assert_eq!(unknown.waiting_delta(), 1);
    let settled = push_signals(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "refused", "reconciliation"),
        ),
    );
    assert_eq!(settled.waiting_delta(), -1);
    // Refused allows new attempts; the third identical attempt in a row is a loop.
    let mut loops = Vec::new();
    for _ in 0..2 {
        loops.push(
            push_signals(
                &mut s,
                new(EventType::EffectAttempted, "run-1", "t1", attempt("k1")),
            )
            .loop_detected,
        );
        push(
            &mut s,
            new(
                EventType::EffectOutcomeObserved,
                "run-1",
                "t1",
                outcome("k1", "refused", "direct"),
            ),
        );
    }
    assert_eq!(loops, [false, true]);
}

#[test]
fn derived_metrics_follow_the_runs() {
    let mut s = started();
    for result in ["pass", "block", "skip", "pass"] {
        push(
            &mut s,
            new(
                EventType::GuardrailEvaluated,
                "run-1",
                "t1",
                json!({"guardrail": "refund_limit", "result": result}),
            ),
        );
    }
    push(
        &mut s,
        new(
            EventType::EffectAttempted,
            "run-1",
            "t1",
            json!({"tool": "issue_refund", "idempotency_key": "k1", "usage": {"cost_units": 6}}),
        ),
    );
    push(
        &mut s,
        new(
            EventType::EffectOutcomeObserved,
            "run-1",
            "t1",
            outcome("k1", "unknown", "direct"),
        ),
    );
    let run = run_metrics(&s.runs["run-1"]);
    assert_eq!(run.guardrail_evaluations, 4);
    assert_eq!(run.guardrail_coverage, Some(0.75));
    assert_eq!(run.repeated_action_ratio, Some(0.0));
    assert_eq!(run.cost_per_attempted_effect, Some(6.0));
    assert_eq!(run.outcome, None);
    let binding = binding_metrics(&s);
    assert_eq!(binding.unknown_effects_waiting, 1);
    assert_eq!(binding.resolution_rate, None, "no completed run yet");
    push(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "handed_to_human"}),
        ),
    );
    push(&mut s, new(EventType::RunStarted, "run-2", "t1", json!({})));
    push(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-2",
            "t1",
            json!({"outcome": "resolved", "usage": {"cost_units": 2}}),
        ),
    );
    let binding = binding_metrics(&s);
    assert_eq!(
        (binding.runs, binding.resolved, binding.handed_to_human),
        (2, 1, 1)
    );
    assert_eq!(binding.resolution_rate, Some(0.5));
    assert_eq!(binding.cost_per_resolved_outcome, Some(8.0));
    assert_eq!(binding.cost_per_attempted_outcome, Some(4.0));
}

// ---------------------------------------------------------------------------------------
// The episode contract (spec/003): work items, artifacts, outcome head and corrections.

fn begun() -> LedgerState {
    let mut s = LedgerState::default();
    push(
        &mut s,
        new(
            EventType::RunStarted,
            "run-1",
            "t1",
            json!({"root_work_item_id": "wi_root"}),
        ),
    );
    s
}

fn item(t: EventType, id: &str) -> NewEvent {
    new(t, "run-1", "t1", json!({"work_item_id": id}))
}

fn status_of(s: &LedgerState, id: &str) -> WorkItemStatus {
    s.runs["run-1"].episode.work_items[id].status
}

#[test]
fn work_items_move_only_along_the_state_machine() {
    let mut s = begun();
    assert_eq!(status_of(&s, "wi_root"), WorkItemStatus::Pending);
    // pending -> completed skips the start: refused, nothing appended.
    let before = s.clone();
    let err = try_push(
        &mut s,
        item(EventType::WorkItemCompleted, "wi_root"),
        Budgets::default(),
    )
    .expect_err("pending cannot complete");
    assert_eq!(err.code(), "conflict");
    assert_eq!(s, before, "a refusal changes nothing");
    push(&mut s, item(EventType::WorkItemStarted, "wi_root"));
    push(&mut s, item(EventType::WorkItemBlocked, "wi_root"));
    // blocked -> blocked is not a move.
    let err = try_push(
        &mut s,
        item(EventType::WorkItemBlocked, "wi_root"),
        Budgets::default(),
    )
    .expect_err("blocked twice");
    assert!(err.to_string().contains("blocked"), "{err}");
    // A second start is the resume path.
    push(&mut s, item(EventType::WorkItemStarted, "wi_root"));
    push(&mut s, item(EventType::WorkItemStarted, "wi_root"));
    push(&mut s, item(EventType::WorkItemCompleted, "wi_root"));
    for t in [
        EventType::WorkItemStarted,
        EventType::WorkItemBlocked,
        EventType::WorkItemFailed,
        EventType::WorkItemAbandoned,
    ] {
        let err = try_push(&mut s, item(t, "wi_root"), Budgets::default())
            .expect_err("a terminal item never reopens");
        assert!(err.to_string().contains("never reopened"), "{err}");
    }
    let err = try_push(
        &mut s,
        item(EventType::WorkItemStarted, "wi_nope"),
        Budgets::default(),
    )
    .expect_err("unknown item");
    assert_eq!(err.code(), "not_found");
}

#[test]
fn a_child_needs_an_active_parent_and_the_run_needs_every_item_terminal() {
    let mut s = begun();
    let child = |id: &str, parent: &str| {
        new(
            EventType::WorkItemCreated,
            "run-1",
            "t1",
            json!({"work_item_id": id, "parent_work_item_id": parent}),
        )
    };
    let err = try_push(&mut s, child("wi_c1", "wi_root"), Budgets::default())
        .expect_err("the root is pending");
    assert!(err.to_string().contains("active parent"), "{err}");
    push(&mut s, item(EventType::WorkItemStarted, "wi_root"));
    push(&mut s, child("wi_c1", "wi_root"));
    assert_eq!(
        s.runs["run-1"].episode.work_items["wi_c1"]
            .parent
            .as_deref(),
        Some("wi_root")
    );
    let err =
        try_push(&mut s, child("wi_c1", "wi_root"), Budgets::default()).expect_err("same id twice");
    assert_eq!(err.code(), "conflict");
    push(&mut s, item(EventType::WorkItemCompleted, "wi_root"));
    let done = new(
        EventType::RunCompleted,
        "run-1",
        "t1",
        json!({"outcome": "resolved"}),
    );
    let err =
        try_push(&mut s, done.clone(), Budgets::default()).expect_err("the child is still pending");
    assert!(err.to_string().contains("wi_c1"), "{err}");
    // A pending child that never started is abandoned explicitly.
    push(&mut s, item(EventType::WorkItemAbandoned, "wi_c1"));
    push(&mut s, done);
    assert_eq!(s.runs["run-1"].status, RunStatus::Completed);
}

#[test]
fn a_correction_moves_the_outcome_head_but_never_terminal_at() {
    let mut s = begun();
    push(&mut s, item(EventType::WorkItemAbandoned, "wi_root"));
    let correct = |outcome: Value| new(EventType::RunOutcomeCorrected, "run-1", "t1", outcome);
    let err = try_push(
        &mut s,
        correct(json!({"outcome": "failed"})),
        Budgets::default(),
    )
    .expect_err("nothing to correct yet");
    assert!(err.to_string().contains("no outcome"), "{err}");
    let plan_at = |state: &mut LedgerState, event: NewEvent, now: i64| {
        let request = AppendRequest {
            event,
            ..AppendRequest::default()
        };
        let id = event_id(now, 1);
        let plan = plan_append(state, &request, "b1", 0, id, now).expect("append");
        *state = plan.state;
    };
    plan_at(
        &mut s,
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "verified_success"}),
        ),
        5_000,
    );
    let ep = &s.runs["run-1"].episode;
    assert_eq!(ep.terminal_at_ms, Some(5_000));
    let head = ep.outcome_head.clone().expect("head");
    assert_eq!(
        (head.outcome, head.strength),
        (
            RunOutcomeKind::VerifiedSuccess,
            OutcomeStrength::LegacyDeclared
        ),
        "a v1 verified_success reads as legacy_declared"
    );
    // Anything but a correction is refused on a completed run.
    let err = try_push(
        &mut s,
        new(EventType::ContextAssembled, "run-1", "t1", json!({})),
        Budgets::default(),
    )
    .expect_err("completed");
    assert!(err.to_string().contains("completed"), "{err}");
    // regression_of_run_id if and only if the outcome is a regression.
    for (bad, needle) in [
        (json!({"outcome": "regression"}), "names the run"),
        (
            json!({"outcome": "failed", "regression_of_run_id": "run-0"}),
            "only with the outcome `regression`",
        ),
        (
            json!({"outcome": "regression", "regression_of_run_id": "run-1"}),
            "itself",
        ),
    ] {
        let err = try_push(&mut s, correct(bad), Budgets::default()).expect_err("refused");
        assert!(err.to_string().contains(needle), "{err}");
    }
    plan_at(
        &mut s,
        correct(json!({"outcome": "regression", "regression_of_run_id": "run-0"})),
        9_000,
    );
    let run = &s.runs["run-1"];
    let head = run.episode.outcome_head.clone().expect("head");
    assert_eq!(
        (
            run.episode.terminal_at_ms,
            run.episode.current_outcome_updated_at_ms
        ),
        (Some(5_000), Some(9_000)),
        "terminal_at stays, the head's time moves"
    );
    assert_eq!(
        (
            head.outcome,
            head.corrections,
            head.regression_of_run_id.as_deref()
        ),
        (RunOutcomeKind::Regression, 1, Some("run-0"))
    );
    assert_eq!(run.outcome, Some(RunOutcomeKind::Regression));
}

#[test]
fn governed_v2_events_need_preconditions_that_hold() {
    let mut s = begun();
    let governed = |t: EventType| {
        let mut e = item(t, "wi_root");
        e.versions.schema = format!("{}/2", t.as_str());
        e
    };
    let with = |e: NewEvent, pre: Option<(u64, &str)>| AppendRequest {
        event: e,
        preconditions: pre.map(|(seq, status)| RunPreconditions {
            run_last_seq: seq,
            status: status.into(),
        }),
        ..AppendRequest::default()
    };
    let plan = |s: &LedgerState, r: &AppendRequest| {
        plan_append(s, r, "b1", 0, event_id(1, 1), 1).map(|p| p.state)
    };
    let err =
        plan(&s, &with(governed(EventType::WorkItemStarted), None)).expect_err("no preconditions");
    assert!(err.to_string().contains("preconditions"), "{err}");
    let err = plan(
        &s,
        &with(governed(EventType::WorkItemStarted), Some((0, "pending"))),
    )
    .expect_err("stale sequence");
    assert_eq!(err.code(), "sequence_conflict");
    let err = plan(
        &s,
        &with(governed(EventType::WorkItemStarted), Some((1, "active"))),
    )
    .expect_err("stale status");
    assert!(err.to_string().contains("precondition failed"), "{err}");
    s = plan(
        &s,
        &with(governed(EventType::WorkItemStarted), Some((1, "pending"))),
    )
    .expect("holds");
    assert_eq!(status_of(&s, "wi_root"), WorkItemStatus::Active);
    s = plan(
        &s,
        &with(governed(EventType::WorkItemCompleted), Some((2, "active"))),
    )
    .expect("holds");
    let mut done = new(
        EventType::RunCompleted,
        "run-1",
        "t1",
        json!({"outcome": "verified_success"}),
    );
    done.versions.schema = "RunCompleted/2".into();
    let err = plan(&s, &with(done, Some((3, "running")))).expect_err("no receipt");
    assert!(err.to_string().contains("receipt"), "{err}");
}

#[test]
fn artifacts_are_references_never_bodies() {
    let mut s = begun();
    let art = |artifact: Value| {
        new(
            EventType::ArtifactCreated,
            "run-1",
            "t1",
            json!({"artifact_id": "art_1", "artifact": artifact}),
        )
    };
    let digest = "a".repeat(64);
    for (bad, needle) in [
        (
            json!({"sha256": "A".repeat(64), "mime_type": "text/plain", "uri": "s3://b/k"}),
            "lowercase hex",
        ),
        (
            json!({"sha256": digest, "mime_type": "text", "uri": "s3://b/k"}),
            "MIME type",
        ),
        (
            json!({"sha256": digest, "mime_type": "text/plain", "uri": "no scheme"}),
            "URI",
        ),
        (
            json!({"sha256": digest, "mime_type": "text/plain", "uri": "s3://b/k", "metadata": {"pages": 3, "x": {"file_body": "..."}}}),
            "artifact.metadata.x.file_body",
        ),
        (
            json!({"sha256": digest, "mime_type": "text/plain", "uri": "s3://b/k", "metadata": {"fileBody": "..."}}),
            "fileBody",
        ),
        (
            json!({"sha256": digest, "mime_type": "text/plain", "uri": "s3://b/k", "body": "inline"}),
            "not a field",
        ),
    ] {
        let err = try_push(&mut s, art(bad), Budgets::default()).expect_err("refused");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
    push(
        &mut s,
        art(
            json!({"sha256": digest, "mime_type": "text/markdown; charset=utf-8", "uri": "s3://reports/r-1.md", "metadata": {"pages": 3}}),
        ),
    );
    let a = &s.runs["run-1"].episode.artifacts["art_1"];
    assert_eq!((a.uri.as_str(), a.seq), ("s3://reports/r-1.md", 2));
    let err = try_push(
        &mut s,
        art(json!({"sha256": digest, "mime_type": "text/plain", "uri": "s3://b/k"})),
        Budgets::default(),
    )
    .expect_err("same id twice");
    assert_eq!(err.code(), "conflict");
}

#[test]
fn episode_state_replays_from_the_events() {
    let mut s = begun();
    let mut events = vec![];
    for e in [
        item(EventType::WorkItemStarted, "wi_root"),
        new(
            EventType::WorkItemCreated,
            "run-1",
            "t1",
            json!({"work_item_id": "wi_c", "parent_work_item_id": "wi_root"}),
        ),
        item(EventType::WorkItemAbandoned, "wi_c"),
        item(EventType::WorkItemCompleted, "wi_root"),
        new(
            EventType::RunCompleted,
            "run-1",
            "t1",
            json!({"outcome": "resolved"}),
        ),
    ] {
        events.push(push(&mut s, e));
    }
    let mut replayed = begun();
    for e in &events {
        replayed.apply(e);
    }
    assert_eq!(replayed, s);
}

// ---------------------------------------------------------------------------------------
// Signals: at most one holder, fencing tokens that only move up, leases that expire.

fn sig(t: EventType, payload: Value) -> NewEvent {
    new(t, signal::SIGNAL_RUN, "s", payload)
}

fn at(state: &mut LedgerState, event: NewEvent, now: i64) -> Result<LedgerEvent, Rejection> {
    let request = AppendRequest {
        event,
        ..AppendRequest::default()
    };
    let plan = plan_append(state, &request, "b1", 0, event_id(now, 3), now)?;
    *state = plan.state;
    Ok(plan.event)
}

#[test]
fn a_signal_has_one_holder_and_tokens_only_move_up() {
    let mut s = LedgerState::default();
    let claim = |holder: &str| {
        sig(
            EventType::SignalClaimed,
            json!({"signal_id": "deploy", "holder": holder, "lease_ms": 5_000}),
        )
    };
    at(&mut s, claim("agent-a"), 1_000).expect("free");
    assert_eq!(s.signals["deploy"].fencing_token, 1);
    assert_eq!(s.signals["deploy"].lease_expires_at_ms, 6_000);
    let err = at(&mut s, claim("agent-b"), 2_000).expect_err("held");
    assert!(err.to_string().contains("held by agent-a"), "{err}");
    // The holder extends with its token; a wrong token is refused.
    let extend = |token: u64| {
        sig(
            EventType::SignalLeaseExtended,
            json!({"signal_id": "deploy", "fencing_token": token, "lease_ms": 5_000}),
        )
    };
    at(&mut s, extend(1), 4_000).expect("extend");
    assert_eq!(s.signals["deploy"].lease_expires_at_ms, 9_000);
    assert!(at(&mut s, extend(2), 4_500).is_err());
    // Expired: taken over with a higher token; the old holder's token is dead.
    at(&mut s, claim("agent-b"), 9_001).expect("takeover");
    assert_eq!(
        (
            s.signals["deploy"].holder.as_str(),
            s.signals["deploy"].fencing_token
        ),
        ("agent-b", 2)
    );
    let ack = |token: u64| {
        sig(
            EventType::SignalAcked,
            json!({"signal_id": "deploy", "fencing_token": token}),
        )
    };
    let err = at(&mut s, ack(1), 9_500).expect_err("stale token");
    assert!(err.to_string().contains("another holder"), "{err}");
    at(&mut s, ack(2), 9_600).expect("ack");
    assert_eq!(s.signals["deploy"].state, signal::SignalState::Acked);
    // An acknowledged signal can be claimed again, with the next token.
    at(&mut s, claim("agent-c"), 9_700).expect("reclaim");
    assert_eq!(s.signals["deploy"].fencing_token, 3);
    // An expired lease cannot be extended even before anyone takes it over.
    let err = at(&mut s, extend(3), 20_000).expect_err("expired");
    assert!(err.to_string().contains("expired"), "{err}");
    // Signal events live under the reserved run only; no other event may use it.
    let err = at(
        &mut s,
        new(EventType::RunStarted, signal::SIGNAL_RUN, "t", json!({})),
        21_000,
    )
    .expect_err("reserved");
    assert_eq!(err.code(), "invalid");
    let err = at(
        &mut s,
        sig(
            EventType::SignalClaimed,
            json!({"signal_id": "x", "holder": "a", "lease_ms": 10}),
        ),
        21_000,
    )
    .expect_err("lease bound");
    assert!(err.to_string().contains("lease_ms"), "{err}");
}

#[test]
fn a_head_folded_by_another_reducer_fails_writes_closed_until_replayed() {
    let mut s = started();
    push(
        &mut s,
        new(
            EventType::GuardrailEvaluated,
            "run-1",
            "t2",
            json!({"guardrail": "pii", "result": "pass"}),
        ),
    );
    assert_eq!(s.reducer.0, REDUCER_VERSION, "a new head is this server's");
    assert!(!s.projection_health(Some(s.last_seq)).degraded());
    // A head as another release stored it.
    let mut other = s.clone();
    other.reducer = Reducer("ledger-reducer/0".into());
    let health = other.projection_health(Some(other.last_seq));
    assert!(health.degraded());
    assert_eq!(health.reducer, "ledger-reducer/0");
    let before = other.clone();
    let err = try_push(
        &mut other,
        new(
            EventType::GuardrailEvaluated,
            "run-1",
            "t3",
            json!({"guardrail": "pii", "result": "pass"}),
        ),
        Budgets::default(),
    )
    .expect_err("fails closed");
    assert_eq!(err.code(), "projection_degraded");
    assert_eq!(other, before, "nothing folded");
    // A head whose own event is missing is degraded too.
    assert!(s.projection_health(None).degraded());
    // A head stored before heads carried a label was folded by the first reducer.
    let mut legacy = serde_json::to_value(&s).expect("encode");
    legacy.as_object_mut().expect("object").remove("reducer");
    let decoded: LedgerState = serde_json::from_value(legacy).expect("decode");
    assert_eq!(decoded.reducer.0, "ledger-reducer/1");
}
