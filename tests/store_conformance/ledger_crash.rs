//! Ledger crash tests (`spec/002_6a0ddaf11b83bfe4.txt` §3, §5.3): a child process
//! runs effects through the run ledger in a loop (attempt, then outcome, then a plain
//! event) and is SIGKILLed at chosen points: right after an attempt was acknowledged
//! (the call is "in flight" and its outcome never recorded), and at arbitrary moments,
//! which land inside appends. After each kill the parent reopens the store and checks:
//! - no acknowledged event is lost (each is there, with the id it was acknowledged with);
//! - the sequence has no gap and the stored head is the fold of the stored events (an
//!   append wrote its event and the head together, or neither);
//! - no key was attempted twice without an outcome in between, and an attempt without
//!   an outcome stays unresolved: a new attempt under its key is refused
//!   (`effect_unresolved`) until reconciliation records the outcome;
//! - an acknowledged append retried with its key returns the original event.
//!
//! The child is this same test binary, re-executed with `HARNESS_CRASH_CHILD` set, as in
//! `crash.rs`, so the real backend runs with nothing mocked.

use std::{collections::BTreeMap, time::Duration};

use harness_engine::{
    domain::{
        ledger::{EffectStatus, EventType, LedgerState},
        state::{BindingRecord, StateScope},
    },
    store::{Store, now_ms},
};
use serde_json::json;

use super::{
    keyring,
    ledger::{attempt, event, keyed, observed},
    scope_of,
};

/// The child pauses (until killed) after this many attempts in `pause-after-attempt`.
const PAUSE_AFTER: u64 = 3;

fn record() -> BindingRecord {
    let kr = keyring();
    BindingRecord {
        binding_id: kr.binding_id("user:crash", "agent-1", "ledger-crash"),
        environment: kr.environment().to_owned(),
        owner: kr.subject_ref("user:crash"),
        agent_id: "agent-1".into(),
        conversation_id: "ledger-crash".into(),
        harness: "strands".into(),
        epoch: 0,
        lease_generation: 1,
        created_at_ms: now_ms(),
    }
}

fn scope() -> StateScope {
    scope_of(&record(), 0, 1)
}

fn effect_key(n: u64) -> String {
    format!("eff-{n:06}")
}

/// The child's loop: effect `n` is attempted, observed confirmed, then a guardrail event
/// follows; each acknowledged append prints `ACK <seq> <event id> <idempotency key>`.
/// Before its loop, a child finishes what the previous one left in flight: an attempt
/// without an outcome is reconciled (the provider, asked by key, says confirmed), never
/// attempted again. Never returns: the parent kills it.
pub async fn child<S: Store + ?Sized>(store: &S, mode: &str) -> ! {
    let record = record();
    store.ensure_binding(&record).await.expect("ensure binding");
    let scope = scope();
    let state = store.ledger_state(&scope).await.expect("state");
    if !state.runs.contains_key("run-1") {
        ack(
            store,
            &scope,
            "start",
            event(EventType::RunStarted, "run-1", "t1", json!({})),
        )
        .await;
    }
    let state = store.ledger_state(&scope).await.expect("state");
    for (key, e) in &state.effects {
        if e.status == EffectStatus::Attempted {
            ack(
                store,
                &scope,
                &format!("reconciled-{key}"),
                event(
                    EventType::EffectOutcomeObserved,
                    "run-1",
                    &e.turn_id,
                    observed(key, "confirmed", "reconciliation"),
                ),
            )
            .await;
        }
    }
    let mut n = u64::try_from(state.effects.len()).expect("count") + 1;
    let first = n;
    loop {
        let key = effect_key(n);
        let turn = format!("t{n}");
        ack(
            store,
            &scope,
            &format!("attempt-{key}"),
            event(EventType::EffectAttempted, "run-1", &turn, attempt(&key)),
        )
        .await;
        println!("ATTEMPTED {n}");
        if mode == "pause-after-attempt" && n == first + PAUSE_AFTER {
            println!("PAUSED {n}");
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        ack(
            store,
            &scope,
            &format!("outcome-{key}"),
            event(
                EventType::EffectOutcomeObserved,
                "run-1",
                &turn,
                observed(&key, "confirmed", "direct"),
            ),
        )
        .await;
        ack(
            store,
            &scope,
            &format!("guard-{key}"),
            event(
                EventType::GuardrailEvaluated,
                "run-1",
                &turn,
                json!({"guardrail": "pii", "result": "pass"}),
            ),
        )
        .await;
        n += 1;
    }
}

async fn ack<S: Store + ?Sized>(
    store: &S,
    scope: &StateScope,
    key: &str,
    e: harness_engine::domain::ledger::NewEvent,
) {
    let appended = store
        .append_event(scope, &keyed(e, scope, key))
        .await
        .unwrap_or_else(|err| panic!("append {key}: {err}"));
    println!(
        "ACK {} {} {key}",
        appended.event.seq, appended.event.event_id
    );
}

/// What the parent saw the child acknowledge before the kill.
#[derive(Debug, Default)]
pub struct Acked {
    /// seq -> (event id, idempotency key).
    pub events: BTreeMap<u64, (String, String)>,
    pub last_attempted: u64,
    /// The child paused after an acknowledged attempt (and will be killed there).
    pub paused: bool,
}

impl Acked {
    /// Notes one line of the child's output; `false` when it is not one of ours.
    pub fn note(&mut self, line: &str) -> bool {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["ACK", seq, id, key] => {
                if let Ok(seq) = seq.parse() {
                    self.events
                        .insert(seq, ((*id).to_owned(), (*key).to_owned()));
                }
                true
            }
            ["ATTEMPTED", n] => {
                self.last_attempted = n.parse().unwrap_or(self.last_attempted);
                true
            }
            ["PAUSED", _] => {
                self.paused = true;
                true
            }
            _ => false,
        }
    }
}

/// Checks the store after a kill; returns the number of events it holds.
pub async fn verify<S: Store + ?Sized>(store: &S, acked: &Acked, paused: bool) -> u64 {
    let scope = scope();
    let head = store.ledger_state(&scope).await.expect("state after crash");
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .ledger_events(&scope, None, after, 500)
            .await
            .expect("events after crash");
        let Some(last) = page.last() else { break };
        after = last.seq;
        events.extend(page);
    }
    // Gapless, and the head is exactly the fold of the events.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "a gap in the sequence at {i}");
    }
    assert_eq!(
        head.last_seq,
        events.len() as u64,
        "the head and the events disagree"
    );
    assert_eq!(
        LedgerState::replay(&events),
        head,
        "the stored head is not the fold of the stored events: an append was torn"
    );
    // No acknowledged event lost, each with the id it was acknowledged with.
    for (seq, (id, key)) in &acked.events {
        let stored = events
            .get(usize::try_from(*seq).expect("seq") - 1)
            .unwrap_or_else(|| panic!("acknowledged event {seq} ({key}) lost"));
        assert_eq!(
            &stored.event_id, id,
            "event {seq} ({key}) changed after the crash"
        );
    }
    // Never two attempts of a key without an outcome in between.
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    for e in &events {
        let key = e.payload["idempotency_key"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match e.event_type {
            EventType::EffectAttempted => {
                if let Some(prev) = open.insert(key.clone(), e.seq) {
                    panic!(
                        "effect {key} attempted at {prev} and again at {} with no outcome between",
                        e.seq
                    );
                }
            }
            EventType::EffectOutcomeObserved => {
                open.remove(&key);
            }
            _ => {}
        }
    }
    // What is in flight stays unresolved: attempting it again is refused.
    for key in open.keys() {
        let again = store
            .append_event(
                &scope,
                &super::ledger::request(event(
                    EventType::EffectAttempted,
                    "run-1",
                    "t-retry",
                    attempt(key),
                )),
            )
            .await;
        assert_eq!(
            again.err().map(|e| e.code()),
            Some("effect_unresolved"),
            "effect {key} has no outcome: a new attempt must wait for reconciliation"
        );
    }
    if paused {
        let key = effect_key(acked.last_attempted);
        assert_eq!(
            head.effects.get(&key).map(|e| e.status),
            Some(EffectStatus::Attempted),
            "killed between attempt and outcome: {key} is attempted, outcome unknown"
        );
    }
    // An acknowledged append retried with its key is the original event.
    if let Some((seq, (id, key))) = acked.events.iter().next_back() {
        let original = &events[usize::try_from(*seq).expect("seq") - 1];
        let retried = store
            .append_event(
                &scope,
                &keyed(
                    harness_engine::domain::ledger::NewEvent {
                        event_type: original.event_type,
                        run_id: original.run_id.clone(),
                        turn_id: original.turn_id.clone(),
                        agent_id: original.agent_id.clone(),
                        lamport: None,
                        versions: super::ledger::event(original.event_type, "", "", json!({}))
                            .versions,
                        payload: original.payload.clone(),
                    },
                    &scope,
                    key,
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("retry of {key}: {e}"));
        assert!(retried.replayed, "a retry of {key} appended a second event");
        assert_eq!(&retried.event.event_id, id);
    }
    events.len() as u64
}
