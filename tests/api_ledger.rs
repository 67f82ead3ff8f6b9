//! The run ledger over HTTP against a real `harness-engine serve` process (SQLite):
//! the effect rules of `spec/002_6a0ddaf11b83bfe4.txt` §5 (a confirmed outcome
//! short-circuits with its recorded result, an unknown one forbids a new attempt until
//! reconciliation or a person settles it, a refused one allows a retry), idempotent
//! retries, fencing, the payload rules, budgets, the expected last sequence, run reads
//! with snapshots and derived metrics, and the ledger counters on `/metrics`.

mod api_support;

use api_support::{Api, Reply, send, serve};
use reqwest::Method;
use serde_json::{Value, json};

/// One binding of a fresh server, and how to talk to its ledger.
struct Ledger {
    api: Api,
    binding: String,
    fence: (u64, u64),
    admin: String,
}

impl Ledger {
    async fn new(server: &api_support::Serve, conversation: &str) -> Self {
        let api = Api::new(&server.api, &server.token);
        let (binding, epoch, generation) = api.bound("refunds.v3", conversation).await;
        Ledger {
            api,
            binding,
            fence: (epoch, generation),
            admin: server.admin.clone(),
        }
    }

    async fn append_with(&self, fence: (u64, u64), key: &str, body: Value) -> Reply {
        send(
            self.api
                .worker(
                    Method::POST,
                    &format!("/v1/bindings/{}/runs/events", self.binding),
                    fence.0,
                    fence.1,
                )
                .header("Idempotency-Key", key)
                .json(&body),
        )
        .await
    }

    async fn append(&self, key: &str, body: Value) -> Reply {
        self.append_with(self.fence, key, body).await
    }

    /// Appends and insists it was a new event.
    async fn ok(&self, key: &str, body: Value) -> Value {
        let r = self.append(key, body).await;
        assert_eq!(r.status, 201, "{key}: {}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    async fn get(&self, path_and_query: &str) -> Reply {
        send(self.api.worker(
            Method::GET,
            &format!("/v1/bindings/{}/runs/{path_and_query}", self.binding),
            self.fence.0,
            self.fence.1,
        ))
        .await
    }

    async fn run(&self, run: &str) -> Value {
        let r = self.get(&format!("item?run_id={run}")).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    async fn effect(&self, key: &str) -> Value {
        let r = self.get(&format!("effects?key={key}")).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    async fn event_count(&self) -> usize {
        let r = self.get("events").await;
        assert_eq!(r.status, 200);
        r.json()["events"].as_array().map_or(0, Vec::len)
    }

    async fn metrics(&self) -> String {
        let r = send(api_support::client().get(format!("{}/metrics", self.admin))).await;
        assert_eq!(r.status, 200);
        String::from_utf8_lossy(&r.body).into_owned()
    }
}

fn event(t: &str, run: &str, turn: &str, payload: Value) -> Value {
    json!({"type": t, "run_id": run, "turn_id": turn, "agent_id": "refunds.v3",
           "versions": {"model": "scripted-1"}, "payload": payload})
}

fn started(run: &str) -> Value {
    event("RunStarted", run, "t1", json!({}))
}

fn attempt(run: &str, key: &str) -> Value {
    event(
        "EffectAttempted",
        run,
        "t1",
        json!({"tool": "issue_refund", "idempotency_key": key,
               "args": {"order": "A-1", "amount_cents": 2000}, "irreversible": true}),
    )
}

fn outcome(run: &str, key: &str, outcome: &str, via: &str) -> Value {
    event(
        "EffectOutcomeObserved",
        run,
        "t1",
        json!({"idempotency_key": key, "outcome": outcome, "via": via,
               "result": {"refund_id": "rf_1"}}),
    )
}

#[tokio::test]
async fn a_confirmed_refund_is_never_issued_twice() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-confirmed").await;
    ledger.ok("s1", started("run-1")).await;
    let first = ledger.ok("a1", attempt("run-1", "refund:A-1")).await;
    assert_eq!(first["effect"]["status"], "attempted");
    assert_eq!(first["event"]["seq"], 2);
    assert_eq!(first["event"]["versions"]["reducer"], "ledger-reducer/1");
    assert!(
        first["event"]["intent_hash"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:"))
    );
    let confirmed = ledger
        .ok("o1", outcome("run-1", "refund:A-1", "confirmed", "direct"))
        .await;
    assert_eq!(confirmed["effect"]["status"], "confirmed");

    // The replacement worker regenerates the same intent: the ledger answers with the
    // recorded result instead of letting it call the provider again.
    let again = ledger.append("a2", attempt("run-1", "refund:A-1")).await;
    assert_eq!(
        (again.status, again.code().as_str()),
        (409, "effect_confirmed")
    );
    let details = &again.json()["details"];
    assert_eq!(details["idempotency_key"], "refund:A-1");
    assert_eq!(details["effect"]["result"], json!({"refund_id": "rf_1"}));
    assert_eq!(details["effect"]["attempts"], 1);

    let effect = ledger.effect("refund:A-1").await;
    assert_eq!(
        (effect["status"].clone(), effect["attempts"].clone()),
        (json!("confirmed"), json!(1))
    );
    assert_eq!(
        ledger.event_count().await,
        3,
        "the refusal appended nothing"
    );
    let missing = ledger.get("effects?key=refund:none").await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "not_found")
    );
}

#[tokio::test]
async fn an_unknown_outcome_waits_for_reconciliation_or_a_person() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-unknown").await;
    ledger.ok("s1", started("run-1")).await;
    ledger.ok("a1", attempt("run-1", "refund:A-1")).await;

    // In flight: no second attempt while the first has no outcome.
    let in_flight = ledger.append("a1b", attempt("run-1", "refund:A-1")).await;
    assert_eq!(
        (in_flight.status, in_flight.code().as_str()),
        (409, "effect_unresolved")
    );
    assert_eq!(in_flight.json()["details"]["status"], "attempted");

    let unknown = ledger
        .ok("o1", outcome("run-1", "refund:A-1", "unknown", "direct"))
        .await;
    assert_eq!(unknown["effect"]["status"], "unknown");
    let retry = ledger.append("a2", attempt("run-1", "refund:A-1")).await;
    assert_eq!(
        (retry.status, retry.code().as_str()),
        (409, "effect_unresolved")
    );
    assert_eq!(retry.json()["details"]["status"], "unknown");
    let guess = ledger
        .append("o2", outcome("run-1", "refund:A-1", "confirmed", "direct"))
        .await;
    assert_eq!(
        (guess.status, guess.code().as_str()),
        (409, "conflict"),
        "only reconciliation or a person may observe an unknown outcome"
    );
    let claimed = ledger
        .append(
            "done-early",
            event(
                "RunCompleted",
                "run-1",
                "t1",
                json!({"outcome": "resolved"}),
            ),
        )
        .await;
    assert_eq!(
        (claimed.status, claimed.code().as_str()),
        (409, "effect_unresolved"),
        "a run with an unknown effect cannot claim success"
    );
    let before = ledger.metrics().await;
    assert!(
        before.contains("harness_engine_ledger_unknown_effects_waiting 1"),
        "{before}"
    );

    let reconciled = ledger
        .ok(
            "o3",
            outcome("run-1", "refund:A-1", "confirmed", "reconciliation"),
        )
        .await;
    assert_eq!(reconciled["effect"]["status"], "confirmed");
    assert_eq!(reconciled["effect"]["via"], "reconciliation");

    // Reconciliation cannot tell: a person decides, and until then nothing is retried.
    ledger.ok("a3", attempt("run-1", "refund:B-2")).await;
    ledger
        .ok("o4", outcome("run-1", "refund:B-2", "unknown", "direct"))
        .await;
    ledger
        .ok(
            "r1",
            event(
                "HumanReviewRequested",
                "run-1",
                "t1",
                json!({"idempotency_key": "refund:B-2", "reason": "provider cannot be queried"}),
            ),
        )
        .await;
    let waiting = ledger.append("a4", attempt("run-1", "refund:B-2")).await;
    assert_eq!(
        (waiting.status, waiting.code().as_str()),
        (409, "effect_unresolved")
    );
    assert_eq!(waiting.json()["details"]["status"], "awaiting_human");
    let run = ledger.run("run-1").await;
    assert_eq!(run["binding_metrics"]["unknown_effects_waiting"], 1);
    let decided = ledger
        .ok(
            "h1",
            event(
                "HumanReviewResolved",
                "run-1",
                "t1",
                json!({"idempotency_key": "refund:B-2", "decision": "refused"}),
            ),
        )
        .await;
    assert_eq!(decided["effect"]["status"], "refused");
    assert_eq!(decided["effect"]["via"], "human");
    // Refused: the retry is allowed.
    let retried = ledger.ok("a5", attempt("run-1", "refund:B-2")).await;
    assert_eq!(retried["effect"]["attempts"], 2);

    let text = ledger.metrics().await;
    for line in [
        "harness_engine_ledger_effect_outcomes_total{outcome=\"confirmed\",via=\"reconciliation\"} 1",
        "harness_engine_ledger_effect_outcomes_total{outcome=\"unknown\",via=\"direct\"} 2",
        "harness_engine_ledger_effect_outcomes_total{outcome=\"refused\",via=\"human\"} 1",
        "harness_engine_ledger_unknown_effects_waiting 0",
        "harness_engine_ledger_events_total{type=\"EffectAttempted\"} 3",
    ] {
        assert!(text.contains(line), "{line} missing from {text}");
    }
    assert!(!text.contains(&ledger.binding), "no binding id in metrics");
}

#[tokio::test]
async fn a_refused_outcome_allows_a_new_attempt() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-refused").await;
    ledger.ok("s1", started("run-1")).await;
    ledger.ok("a1", attempt("run-1", "refund:A-1")).await;
    let refused = ledger
        .ok("o1", outcome("run-1", "refund:A-1", "refused", "direct"))
        .await;
    assert_eq!(refused["effect"]["status"], "refused");
    let retry = ledger.ok("a2", attempt("run-1", "refund:A-1")).await;
    assert_eq!(retry["effect"]["status"], "attempted");
    assert_eq!(retry["effect"]["attempts"], 2);
    ledger
        .ok("o2", outcome("run-1", "refund:A-1", "confirmed", "direct"))
        .await;
    let done = ledger
        .ok(
            "c1",
            event(
                "RunCompleted",
                "run-1",
                "t1",
                json!({"outcome": "resolved"}),
            ),
        )
        .await;
    assert_eq!(done["event"]["type"], "RunCompleted");
    let run = ledger.run("run-1").await;
    assert_eq!(run["state"]["status"], "completed");
    assert_eq!(run["state"]["outcome"], "resolved");
    assert_eq!(run["metrics"]["outcome"], "resolved");
    assert_eq!(run["binding_metrics"]["resolution_rate"], 1.0);
    let late = ledger.append("late", attempt("run-1", "refund:C-3")).await;
    assert_eq!(
        (late.status, late.code().as_str()),
        (409, "conflict"),
        "a completed run takes no more events"
    );
}

#[tokio::test]
async fn retries_fences_preconditions_and_payload_rules() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-rules").await;
    let first = ledger.ok("s1", started("run-1")).await;

    // Same key, same event: the original event, not a second one.
    let retry = ledger.append("s1", started("run-1")).await;
    assert_eq!(retry.status, 200);
    let retry = retry.json();
    assert_eq!(retry["replayed"], true);
    assert_eq!(retry["event"]["event_id"], first["event"]["event_id"]);
    assert_eq!(retry["event"]["seq"], 1);
    // Same key, another event.
    let other = ledger
        .append("s1", event("RunStarted", "run-2", "t1", json!({})))
        .await;
    assert_eq!(
        (other.status, other.code().as_str()),
        (409, "idempotency_mismatch")
    );

    // A replaced worker (an older lease generation) appends nothing.
    let (epoch, generation) = ledger.fence;
    let stale = ledger
        .append_with(
            (epoch, generation - 1),
            "late-1",
            attempt("run-1", "refund:A-1"),
        )
        .await;
    assert_eq!((stale.status, stale.code().as_str()), (409, "stale_lease"));
    assert_eq!(stale.json()["details"]["current"], generation);
    let cleared = ledger
        .append_with((epoch + 1, generation), "late-2", started("run-9"))
        .await;
    assert_eq!(
        (cleared.status, cleared.code().as_str()),
        (409, "stale_epoch")
    );
    let unfenced = send(
        ledger
            .api
            .req(
                Method::POST,
                &format!("/v1/bindings/{}/runs/events", ledger.binding),
            )
            .header("Idempotency-Key", "nofence")
            .json(&started("run-3")),
    )
    .await;
    assert_eq!(
        (unfenced.status, unfenced.code().as_str()),
        (422, "invalid")
    );
    let unkeyed = send(
        ledger
            .api
            .worker(
                Method::POST,
                &format!("/v1/bindings/{}/runs/events", ledger.binding),
                epoch,
                generation,
            )
            .json(&started("run-3")),
    )
    .await;
    assert_eq!((unkeyed.status, unkeyed.code().as_str()), (422, "invalid"));

    // Expected last sequence.
    let mut conditional = attempt("run-1", "refund:A-1");
    conditional["expected_last_seq"] = json!(5);
    let moved = ledger.append("c1", conditional.clone()).await;
    assert_eq!(
        (moved.status, moved.code().as_str()),
        (409, "sequence_conflict")
    );
    assert_eq!(moved.json()["details"], json!({"expected": 5, "actual": 1}));
    conditional["expected_last_seq"] = json!(1);
    let on_time = ledger.ok("c1", conditional).await;
    assert_eq!(on_time["event"]["seq"], 2);

    // Hidden reasoning and transcripts are refused at any depth, under any spelling.
    for (key, payload) in [
        (
            "f1",
            json!({"guardrail": "g", "result": "pass", "notes": {"Thought-Process": "..."}}),
        ),
        (
            "f2",
            json!({"guardrail": "g", "result": "pass", "ANALYSIS": "..."}),
        ),
        (
            "f3",
            json!({"guardrail": "g", "result": "pass", "steps": [{"chain_of_thought": "x"}]}),
        ),
        (
            "f4",
            json!({"guardrail": "g", "result": "pass", "raw_transcript": "user: ..."}),
        ),
        (
            "f5",
            json!({"guardrail": "g", "result": "pass", "why": "because"}),
        ),
    ] {
        let r = ledger
            .append(
                key,
                event("GuardrailEvaluated", "run-1", "t1", payload.clone()),
            )
            .await;
        assert_eq!((r.status, r.code().as_str()), (422, "invalid"), "{payload}");
    }
    let digest = ledger
        .ok(
            "f6",
            event(
                "GuardrailEvaluated",
                "run-1",
                "t1",
                json!({"guardrail": "g", "result": "pass", "analysis_digest": "sha256:00", "rationale": "under the limit"}),
            ),
        )
        .await;
    assert_eq!(digest["event"]["payload"]["rationale"], "under the limit");
    let tool_executed = ledger
        .append("f7", event("ToolExecuted", "run-1", "t1", json!({})))
        .await;
    assert_eq!(
        (tool_executed.status, tool_executed.code().as_str()),
        (422, "invalid"),
        "the vocabulary has no ToolExecuted"
    );
    let huge = ledger
        .append(
            "f8",
            event(
                "GuardrailEvaluated",
                "run-1",
                "t1",
                json!({"guardrail": "g", "result": "pass", "note": "x".repeat(40 << 10)}),
            ),
        )
        .await;
    assert_eq!((huge.status, huge.code().as_str()), (413, "too_large"));
    let not_started = ledger.append("f9", attempt("run-404", "k")).await;
    assert_eq!(
        (not_started.status, not_started.code().as_str()),
        (409, "conflict")
    );
    assert_eq!(
        ledger.event_count().await,
        3,
        "RunStarted, the conditional attempt and the digest guardrail: nothing refused was appended"
    );
}

#[tokio::test]
async fn budgets_trip_with_their_own_code() {
    let server = serve(&[
        "--budget-turn-steps",
        "3",
        "--budget-run-irreversible",
        "1",
        "--budget-run-cost-units",
        "10",
    ]);
    let ledger = Ledger::new(&server, "conv-budget").await;
    ledger.ok("s1", started("run-1")).await;
    let guardrail = |n: u32| {
        event(
            "GuardrailEvaluated",
            "run-1",
            "t1",
            json!({"guardrail": format!("g{n}"), "result": "pass"}),
        )
    };
    ledger.ok("g1", guardrail(1)).await;
    ledger.ok("g2", guardrail(2)).await;
    let over = ledger.append("g3", guardrail(3)).await;
    assert_eq!(
        (over.status, over.code().as_str()),
        (409, "budget_exceeded")
    );
    assert_eq!(
        over.json()["details"],
        json!({"what": "per-turn steps", "limit": 3})
    );
    // The next turn has its own step budget; the run's irreversible budget is shared.
    let in_turn = |t: &str, payload: Value| event("EffectAttempted", "run-1", t, payload);
    ledger
        .ok(
            "a1",
            in_turn(
                "t2",
                json!({"tool": "issue_refund", "idempotency_key": "k1", "irreversible": true}),
            ),
        )
        .await;
    let second = ledger
        .append(
            "a2",
            in_turn(
                "t2",
                json!({"tool": "issue_refund", "idempotency_key": "k2", "irreversible": true}),
            ),
        )
        .await;
    assert_eq!(second.code(), "budget_exceeded");
    assert_eq!(
        second.json()["details"]["what"],
        "per-run irreversible effects"
    );
    let costly = ledger
        .append(
            "a3",
            in_turn(
                "t3",
                json!({"tool": "search", "idempotency_key": "k3", "usage": {"cost_units": 11}}),
            ),
        )
        .await;
    assert_eq!(costly.json()["details"]["what"], "per-run cost_units");
    let run = ledger.run("run-1").await;
    assert_eq!(run["state"]["usage"]["steps"], 4);
    assert_eq!(run["state"]["turns"]["t1"]["steps"], 3);
    let text = ledger.metrics().await;
    assert!(
        text.contains("harness_engine_ledger_budget_refusals_total{budget=\"per-turn steps\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "harness_engine_ledger_budget_refusals_total{budget=\"per-run irreversible effects\"} 1"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_run_read_pages_skips_to_a_snapshot_and_derives_metrics() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-read").await;
    ledger.ok("s1", started("run-1")).await;
    ledger.ok("s2", started("run-2")).await;
    for (i, result) in ["pass", "block", "skip", "pass"].iter().enumerate() {
        ledger
            .ok(
                &format!("g{i}"),
                event(
                    "GuardrailEvaluated",
                    "run-1",
                    "t1",
                    json!({"guardrail": "refund_limit", "result": result}),
                ),
            )
            .await;
    }
    ledger
        .ok(
            "ctx",
            event(
                "ContextAssembled",
                "run-1",
                "t1",
                json!({"budget": {"used_tokens": 800, "limit_tokens": 1000}}),
            ),
        )
        .await;
    // The same search three times in a row is a loop; the third append says so.
    let search = || {
        event(
            "EffectAttempted",
            "run-1",
            "t1",
            json!({"tool": "search_orders", "idempotency_key": "search:A-1", "usage": {"cost_units": 2}}),
        )
    };
    let mut loops = Vec::new();
    for i in 0..3 {
        let a = ledger.ok(&format!("q{i}"), search()).await;
        loops.push(a["loop_detected"].as_bool());
        ledger
            .ok(
                &format!("r{i}"),
                outcome("run-1", "search:A-1", "refused", "direct"),
            )
            .await;
    }
    assert_eq!(loops, [Some(false), Some(false), Some(true)]);

    let run = ledger.run("run-1").await;
    assert_eq!(run["last_seq"], 13);
    let seqs: Vec<u64> = run["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert_eq!(
        seqs,
        [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
        "run-2's event is not run-1's"
    );
    let m = &run["metrics"];
    assert_eq!(m["guardrail_evaluations"], 4);
    assert_eq!(m["guardrail_coverage"], 0.75);
    assert_eq!(m["loops_detected"], 1);
    assert!((m["repeated_action_ratio"].as_f64().unwrap_or(0.0) - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(m["cost_per_attempted_effect"], 2.0);
    assert_eq!(m["outcome"], Value::Null);
    assert_eq!(
        m["context_utilisation"][3],
        json!({"upper_permille": 900, "count": 1}),
        "80 % of the memory budget"
    );
    assert_eq!(run["effects"]["search:A-1"]["attempts"], 3);
    assert_eq!(run["binding_metrics"]["runs_running"], 2);

    let page = ledger
        .get("item?run_id=run-1&after_seq=3&limit=2")
        .await
        .json();
    let seqs: Vec<u64> = page["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert_eq!(seqs, [4, 5]);
    assert_eq!(page["next_after_seq"], 5);

    assert_eq!(
        ledger.get("snapshot").await.json(),
        json!({"snapshot": null})
    );
    let snap = send(
        ledger
            .api
            .worker(
                Method::POST,
                &format!("/v1/bindings/{}/runs/snapshot", ledger.binding),
                ledger.fence.0,
                ledger.fence.1,
            )
            .header("Idempotency-Key", "snap-1"),
    )
    .await;
    assert_eq!(snap.status, 200, "{}", String::from_utf8_lossy(&snap.body));
    assert_eq!(snap.json()["seq"], 13);
    ledger
        .ok(
            "after",
            event(
                "GuardrailEvaluated",
                "run-1",
                "t2",
                json!({"guardrail": "refund_limit", "result": "pass"}),
            ),
        )
        .await;
    let skipped = ledger
        .get("item?run_id=run-1&from_snapshot=true")
        .await
        .json();
    assert_eq!(skipped["snapshot_seq"], 13);
    assert_eq!(skipped["events"].as_array().map(Vec::len), Some(1));
    assert_eq!(skipped["events"][0]["seq"], 14);
    assert_eq!(
        skipped["state"]["events"], 13,
        "the state covers every event"
    );
    let latest = ledger.get("snapshot").await.json();
    assert_eq!(
        latest["snapshot"]["state"]["runs"]["run-1"]["loops_detected"],
        1
    );
    let all = ledger.get("events?after_seq=12").await.json();
    assert_eq!(all["events"].as_array().map(Vec::len), Some(2));
    let unknown_run = ledger.get("item?run_id=run-404").await;
    assert_eq!(
        (unknown_run.status, unknown_run.code().as_str()),
        (404, "not_found")
    );
    let text = ledger.metrics().await;
    assert!(
        text.contains("harness_engine_ledger_loops_detected_total 1"),
        "{text}"
    );
    assert!(
        text.contains("harness_engine_ledger_guardrail_evaluations_total{result=\"skip\"} 1"),
        "{text}"
    );
}

/// An effect review through the interrupt protocol: the worker commits an
/// `effect_review` interrupt naming the effect; the control plane's resume records the
/// person's decision in the ledger (with the result it found) before the interrupt is
/// consumed, once, however often the resume is retried. A review that names no effect,
/// or mixes outcome and approval decisions, is refused at commit.
#[tokio::test]
async fn resuming_an_effect_review_records_the_persons_decision_once() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-review").await;
    let (api, binding, (e, g)) = (&ledger.api, ledger.binding.clone(), ledger.fence);
    ledger.ok("s1", started("run-1")).await;
    ledger.ok("a1", attempt("run-1", "refund:A-1")).await;
    ledger
        .ok("o1", outcome("run-1", "refund:A-1", "unknown", "direct"))
        .await;
    ledger
        .ok(
            "r1",
            event(
                "HumanReviewRequested",
                "run-1",
                "t1",
                json!({"idempotency_key": "refund:A-1", "reason": "provider cannot be queried"}),
            ),
        )
        .await;

    let commit = |key: &'static str, state_id: String, interrupt: Value| {
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/commit"),
            e,
            g,
        )
        .header("Idempotency-Key", key)
        .json(
            &json!({"state_id": state_id, "expected_revision": 0, "run_id": "lg-1",
                      "interrupt": interrupt}),
        )
    };
    let pending = api.write_pending(&binding, (e, g), "w1", b"review").await;
    let state_id = pending.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for (key, bad, needle) in [
        (
            "bad-1",
            json!({"interrupt_id": "int-1", "type": "effect_review", "allowed_decisions": ["confirmed"], "body": {}}),
            "idempotency_key",
        ),
        (
            "bad-2",
            json!({"interrupt_id": "int-1", "type": "effect_review", "allowed_decisions": ["confirmed", "approved"],
                   "body": {"idempotency_key": "refund:A-1"}}),
            "got: confirmed, approved",
        ),
    ] {
        let refused = send(commit(key, state_id.clone(), bad)).await;
        assert_eq!((refused.status, refused.code().as_str()), (422, "invalid"));
        assert!(
            String::from_utf8_lossy(&refused.body).contains(needle),
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
    }
    let committed = send(commit(
        "c1",
        state_id,
        json!({"interrupt_id": "int-1", "type": "effect_review", "allowed_decisions": ["confirmed", "refused"],
               "body": {"idempotency_key": "refund:A-1", "tool": "issue_refund"}}),
    ))
    .await;
    assert_eq!(
        committed.status,
        200,
        "{}",
        String::from_utf8_lossy(&committed.body)
    );
    let got = send(api.req(Method::GET, &format!("/v1/bindings/{binding}/interrupt")))
        .await
        .json();
    assert_eq!(got["interrupt"]["type"], "effect_review");
    let revision = got["interrupt"]["revision"].as_u64().unwrap_or(0);

    let events_before = ledger.event_count().await;
    let resume = || {
        api.req(
            Method::POST,
            &format!("/v1/bindings/{binding}/interrupt/resume"),
        )
        .header("Idempotency-Key", "answer-1")
        .json(
            &json!({"interrupt_id": "int-1", "revision": revision, "decision": "confirmed",
                      "response": {"result": {"refund_id": "rf_9"}}}),
        )
    };
    let first = send(resume()).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let effect = ledger.effect("refund:A-1").await;
    assert_eq!(
        (
            effect["status"].as_str(),
            effect["via"].as_str(),
            effect["result"]["refund_id"].as_str()
        ),
        (Some("confirmed"), Some("human"), Some("rf_9")),
        "{effect}"
    );
    let again = send(resume()).await;
    assert_eq!(
        (again.status, again.json()["resumed_at_ms"].clone()),
        (200, first.json()["resumed_at_ms"].clone()),
        "a retried resume returns the first outcome"
    );
    assert_eq!(
        ledger.event_count().await,
        events_before + 1,
        "one HumanReviewResolved, however often the resume is retried"
    );
    let run = ledger.run("run-1").await;
    let last = run["events"]
        .as_array()
        .and_then(|v| v.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (
            last["type"].as_str(),
            last["payload"]["decision"].as_str(),
            last["payload"]["interrupt_id"].as_str()
        ),
        (
            Some("HumanReviewResolved"),
            Some("confirmed"),
            Some("int-1")
        ),
        "{last}"
    );
}

/// The episode contract over `/v1` (`spec/003` "Stateless Run Handles", "Event And
/// Outcome Authority"): `POST .../runs` mints the run and its root work item from the
/// idempotency key (a retry names the same run), child work items and artifacts get
/// server-minted ids (a caller-set id is refused), an illegal work-item move appends
/// nothing, a governed-v2 event with a stale precondition appends nothing, and a
/// correction keeps `terminal_at_ms`.
#[tokio::test]
async fn runs_begin_with_minted_handles_and_keep_their_work_tree() {
    let server = serve(&[]);
    let ledger = Ledger::new(&server, "conv-episode").await;
    let (api, binding, (e, g)) = (&ledger.api, ledger.binding.clone(), ledger.fence);
    let begin = |key: &'static str, body: Value| {
        api.worker(Method::POST, &format!("/v1/bindings/{binding}/runs"), e, g)
            .header("Idempotency-Key", key)
            .json(&body)
    };
    let first = send(begin(
        "b1",
        json!({"agent_id": "coder", "payload": {"goal_digest": "sha256:01"}}),
    ))
    .await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let begun = first.json();
    let (run, root) = (
        begun["run_id"].as_str().unwrap_or_default().to_owned(),
        begun["work_item_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    assert!(run.starts_with("run_") && run.len() == 36, "{run}");
    assert!(root.starts_with("wi_") && root.len() == 35, "{root}");
    let again = send(begin(
        "b1",
        json!({"agent_id": "coder", "payload": {"goal_digest": "sha256:01"}}),
    ))
    .await;
    assert_eq!(
        (
            again.status,
            again.json()["run_id"].as_str(),
            again.json()["replayed"].as_bool()
        ),
        (200, Some(run.as_str()), Some(true)),
        "a retried begin names the same run"
    );
    let other = send(begin("b2", json!({"agent_id": "coder"}))).await.json();
    assert_ne!(other["run_id"], begun["run_id"], "another key, another run");
    let mismatch = send(begin("b1", json!({"agent_id": "coder"}))).await;
    assert_eq!(mismatch.code(), "idempotency_mismatch");

    let ev = |t: &str, payload: Value| event(t, &run, "t1", payload);
    // A handle the server mints cannot be chosen by the caller.
    let chosen = ledger
        .append(
            "c0",
            ev(
                "work_item_created",
                json!({"work_item_id": "wi_mine", "parent_work_item_id": root}),
            ),
        )
        .await;
    assert_eq!((chosen.status, chosen.code().as_str()), (422, "invalid"));
    // The root is pending: no child yet, and no completion before a start.
    let events_before = ledger.event_count().await;
    for (key, t) in [("x1", "work_item_completed"), ("x2", "work_item_blocked")] {
        let refused = ledger
            .append(key, ev(t, json!({"work_item_id": root})))
            .await;
        assert_eq!(
            (refused.status, refused.code().as_str()),
            (409, "conflict"),
            "{t}"
        );
    }
    assert_eq!(
        ledger.event_count().await,
        events_before,
        "refusals append nothing"
    );
    ledger
        .ok("s1", ev("work_item_started", json!({"work_item_id": root})))
        .await;
    let created = ledger
        .ok(
            "c1",
            ev(
                "work_item_created",
                json!({"parent_work_item_id": root, "title": "write the report"}),
            ),
        )
        .await;
    let child = created["event"]["payload"]["work_item_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(child.starts_with("wi_") && child != root, "{child}");
    let replay = ledger
        .append(
            "c1",
            ev(
                "work_item_created",
                json!({"parent_work_item_id": root, "title": "write the report"}),
            ),
        )
        .await;
    assert_eq!(
        (
            replay.status,
            replay.json()["event"]["payload"]["work_item_id"].as_str()
        ),
        (200, Some(child.as_str())),
        "a retried creation names the same child"
    );
    let artifact = ledger
        .ok(
            "a1",
            ev(
                "artifact_created",
                json!({"artifact": {"sha256": "b".repeat(64), "mime_type": "text/markdown", "uri": "s3://reports/r.md"}}),
            ),
        )
        .await;
    let artifact_id = artifact["event"]["payload"]["artifact_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(artifact_id.starts_with("art_"), "{artifact}");

    // Governed-v2: a stale status or sequence appends nothing; a current one appends.
    let state = ledger.run(&run).await;
    let last = state["state"]["last_seq"].as_u64().unwrap_or(0);
    let governed = |pre: Value| {
        let mut body = ev("work_item_started", json!({"work_item_id": child}));
        body["versions"]["schema"] = json!("work_item_started/2");
        body["preconditions"] = pre;
        body
    };
    let stale = ledger
        .append(
            "g1",
            governed(json!({"run_last_seq": last - 1, "status": "pending"})),
        )
        .await;
    assert_eq!(
        (stale.status, stale.code().as_str()),
        (409, "sequence_conflict")
    );
    let stale = ledger
        .append(
            "g2",
            governed(json!({"run_last_seq": last, "status": "active"})),
        )
        .await;
    assert_eq!((stale.status, stale.code().as_str()), (409, "conflict"));
    let missing = ledger
        .append("g3", {
            let mut b = governed(json!(null));
            b.as_object_mut().map(|m| m.remove("preconditions"));
            b
        })
        .await;
    assert_eq!((missing.status, missing.code().as_str()), (422, "invalid"));
    ledger
        .ok(
            "g4",
            governed(json!({"run_last_seq": last, "status": "pending"})),
        )
        .await;

    // Every item terminal before the outcome; then a correction keeps terminal_at.
    let early = ledger
        .append("d0", ev("RunCompleted", json!({"outcome": "resolved"})))
        .await;
    assert_eq!(early.code(), "conflict");
    ledger
        .ok(
            "d1",
            ev("work_item_completed", json!({"work_item_id": child})),
        )
        .await;
    ledger
        .ok(
            "d2",
            ev("work_item_completed", json!({"work_item_id": root})),
        )
        .await;
    ledger
        .ok(
            "d3",
            ev("RunCompleted", json!({"outcome": "verified_success"})),
        )
        .await;
    let done = ledger.run(&run).await;
    let episode = &done["state"]["episode"];
    assert_eq!(
        episode["outcome_head"]["strength"], "legacy_declared",
        "{episode}"
    );
    assert_eq!(
        episode["artifacts"][&artifact_id]["uri"],
        "s3://reports/r.md"
    );
    assert_eq!(
        episode["work_items"][&child]["parent_work_item_id"],
        root.as_str()
    );
    let terminal_at = episode["terminal_at_ms"].clone();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    ledger
        .ok(
            "d4",
            ev(
                "RunOutcomeCorrected",
                json!({"outcome": "user_corrected", "reason": "customer reopened"}),
            ),
        )
        .await;
    let corrected = ledger.run(&run).await;
    let episode = &corrected["state"]["episode"];
    assert_eq!(episode["terminal_at_ms"], terminal_at);
    assert!(
        episode["current_outcome_updated_at_ms"].as_i64() > terminal_at.as_i64(),
        "{episode}"
    );
    assert_eq!(
        (
            episode["outcome_head"]["outcome"].as_str(),
            episode["outcome_head"]["corrections"].as_u64()
        ),
        (Some("user_corrected"), Some(1))
    );
}
