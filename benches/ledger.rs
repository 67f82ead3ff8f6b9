//! `make bench-ledger`: the run ledger on the embedded SQLite store.
//!
//! - appends: 64 bindings append concurrently (each one event at a time, as a worker
//!   does), a mix of guardrail evaluations, context reports and effect attempts with
//!   their outcomes, every append durable before acknowledged; events per second and
//!   append latency p50/p99. Targets: at least 5,000/s, p99 at most 20 ms.
//! - run read: one run of 10,000 events; a read is the folded state, the effects, the
//!   derived metrics and the first page (1,000 events), as `GET .../runs/item` does;
//!   p50/p99. Target: p99 at most 20 ms. Reading all ten pages is reported beside it.
//!
//! `cargo bench --bench ledger` runs the full measurement; without `--bench` (as
//! `cargo test` runs it) it is a short smoke run. Prints a table and writes the figures to
//! `target/bench/ledger.json`. The per-binding write-rate limit is raised for the run: it
//! bounds one conversation in production and would otherwise measure itself here.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use harness_engine::{
    domain::{
        ids::Keyring,
        ledger::{AppendRequest, Budgets, EventType, NewEvent, Versions},
        limits::Limits,
        state::{BindingRecord, StateScope},
    },
    store::{BindingStore, LedgerStore, now_ms, sqlite::SqliteStore},
};
use serde_json::{Value, json};

struct Settings {
    duration: Duration,
    run_events: u64,
    reads: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            duration: Duration::from_secs(8),
            run_events: 10_000,
            reads: 300,
        }
    } else {
        Settings {
            duration: Duration::from_millis(300),
            run_events: 1_200,
            reads: 10,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio: {e}")));
    let scratch = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temp dir: {e}")));
    let limits = Limits {
        writes_per_second: 1_000_000,
        write_burst: 1_000_000,
        ..Limits::default()
    };
    let keyring = Keyring::new(b"bench-key-0123456789abcdef0123456789".to_vec(), "bench")
        .unwrap_or_else(|e| fail(&e.to_string()));

    let (appends, reads) = runtime.block_on(async {
        let store = SqliteStore::open(&scratch.path().join("ledger.db"), limits)
            .await
            .unwrap_or_else(|e| fail(&format!("sqlite: {e}")));
        let store = Arc::new(store);
        let appends = measure_appends(store.clone(), &keyring, 64, settings.duration).await;
        let reads =
            measure_run_read(store.clone(), &keyring, settings.run_events, settings.reads).await;
        (appends, reads)
    });

    let mode = if full { "full" } else { "smoke" };
    println!();
    println!("ledger bench ({mode}), SQLite, every append durable before acknowledged");
    println!(
        "{:<44} {:>10} {:>12} {:>9} {:>9} {:>10}",
        "measurement", "count", "per second", "p50 ms", "p99 ms", "target"
    );
    println!(
        "{:<44} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>10}",
        "appends, 64 bindings",
        appends.count,
        appends.per_second,
        appends.p50_ms,
        appends.p99_ms,
        ">=5000/s"
    );
    println!(
        "{:<44} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>10}",
        format!(
            "run read, {} events (state + 1st page)",
            settings.run_events
        ),
        reads.first_page.count,
        reads.first_page.per_second,
        reads.first_page.p50_ms,
        reads.first_page.p99_ms,
        "p99<=20ms"
    );
    println!(
        "{:<44} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>10}",
        format!("run read, all {} events (every page)", settings.run_events),
        reads.all_pages.count,
        reads.all_pages.per_second,
        reads.all_pages.p50_ms,
        reads.all_pages.p99_ms,
        "-"
    );
    println!(
        "head (folded state) of the {}-event run: {} bytes of JSON",
        settings.run_events, reads.head_bytes
    );

    let json = json!({
        "mode": mode,
        "append_bindings": 64,
        "appends": appends.count,
        "appends_per_s": appends.per_second,
        "append_p50_ms": appends.p50_ms,
        "append_p99_ms": appends.p99_ms,
        "run_events": settings.run_events,
        "run_read_p50_ms": reads.first_page.p50_ms,
        "run_read_p99_ms": reads.first_page.p99_ms,
        "run_read_all_pages_p50_ms": reads.all_pages.p50_ms,
        "run_read_all_pages_p99_ms": reads.all_pages.p99_ms,
        "head_bytes": reads.head_bytes,
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let path = out.join("ledger.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => fail(&format!("writing {}: {e}", path.display())),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-ledger: {msg}");
    std::process::exit(1)
}

#[derive(Default)]
struct Figures {
    count: u64,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn figures(mut lat: Vec<f64>, seconds: f64) -> Figures {
    lat.sort_by(f64::total_cmp);
    let pick = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    Figures {
        count: lat.len() as u64,
        per_second: lat.len() as f64 / seconds.max(1e-9),
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
    }
}

async fn binding(store: &SqliteStore, keyring: &Keyring, conversation: &str) -> StateScope {
    let record = BindingRecord {
        binding_id: keyring.binding_id("user:bench", "agent-bench", conversation),
        environment: "bench".into(),
        owner: keyring.subject_ref("user:bench"),
        agent_id: "agent-bench".into(),
        conversation_id: conversation.to_owned(),
        harness: "strands".into(),
        epoch: 0,
        lease_generation: 1,
        created_at_ms: now_ms(),
    };
    store
        .ensure_binding(&record)
        .await
        .unwrap_or_else(|e| fail(&format!("ensure_binding: {e}")));
    StateScope {
        binding_id: record.binding_id,
        environment: "bench".into(),
        harness: "strands".into(),
        epoch: 0,
        codec: "bench-v1".into(),
        lease_generation: 1,
    }
}

/// The `n`th event of a run after its `RunStarted`: in turns of 20 events, each turn a
/// context report, guardrails, and an effect attempt with its outcome.
fn nth_event(n: u64) -> (EventType, Value) {
    let turn_step = n % 20;
    let key = format!("tool:{}", n / 20);
    match turn_step {
        0 => (
            EventType::ContextAssembled,
            json!({"budget": {"used_tokens": 700 + n % 300, "limit_tokens": 1000}}),
        ),
        9 => (
            EventType::EffectAttempted,
            json!({"tool": "lookup_order", "idempotency_key": key,
                   "args": {"order": format!("A-{n}")}, "usage": {"tokens": 120, "cost_units": 1}}),
        ),
        10 => (
            EventType::EffectOutcomeObserved,
            json!({"idempotency_key": key, "outcome": "confirmed", "result": {"status": "shipped"}}),
        ),
        _ => (
            EventType::GuardrailEvaluated,
            json!({"guardrail": format!("policy-{turn_step}"), "result": "pass",
                   "usage": {"tokens": 40}}),
        ),
    }
}

fn request(run: &str, n: u64, event_type: EventType, payload: Value, key: String) -> AppendRequest {
    AppendRequest {
        event: NewEvent {
            event_type,
            run_id: run.to_owned(),
            turn_id: format!("turn-{}", n / 20),
            agent_id: "agent-bench".into(),
            lamport: None,
            versions: Versions {
                model: "bench-model".into(),
                ..Versions::default()
            },
            payload,
        },
        idempotency: Some(key),
        expected_last_seq: None,
        budgets: Budgets::default(),
        approval_required: false,
        preconditions: None,
    }
}

async fn append(store: &SqliteStore, scope: &StateScope, run: &str, n: u64) {
    let (event_type, payload) = if n == 0 {
        (EventType::RunStarted, json!({}))
    } else {
        nth_event(n)
    };
    let digest = format!("sha256:{run}:{n}");
    store
        .append_event(scope, &request(run, n, event_type, payload, digest))
        .await
        .unwrap_or_else(|e| fail(&format!("append {run} #{n}: {e}")));
}

async fn measure_appends(
    store: Arc<SqliteStore>,
    keyring: &Keyring,
    bindings: usize,
    duration: Duration,
) -> Figures {
    let tag = now_ms();
    let mut scopes = Vec::new();
    for i in 0..bindings {
        scopes.push(binding(&store, keyring, &format!("append-{tag}-{i}")).await);
    }
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = scopes
        .into_iter()
        .map(|scope| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    append(&store, &scope, "run-1", n).await;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for task in tasks {
        lat.extend(task.await.unwrap_or_else(|e| fail(&format!("task: {e}"))));
    }
    figures(lat, started.elapsed().as_secs_f64())
}

struct Reads {
    first_page: Figures,
    all_pages: Figures,
    head_bytes: usize,
}

async fn measure_run_read(
    store: Arc<SqliteStore>,
    keyring: &Keyring,
    events: u64,
    reads: usize,
) -> Reads {
    let scope = binding(&store, keyring, &format!("read-{}", now_ms())).await;
    // Filled by 8 concurrent writers on 8 runs would interleave runs; one run is the
    // case measured, so it is filled in order (the writer groups nothing here).
    for n in 0..events {
        append(&store, &scope, "run-big", n).await;
    }
    let head_bytes = store
        .ledger_state(&scope)
        .await
        .map(|s| serde_json::to_string(&s).map_or(0, |j| j.len()))
        .unwrap_or_else(|e| fail(&format!("state: {e}")));
    let mut first = Vec::with_capacity(reads);
    let mut all = Vec::with_capacity(reads / 10 + 1);
    let started = Instant::now();
    for i in 0..reads {
        let t = Instant::now();
        let state = store
            .ledger_state(&scope)
            .await
            .unwrap_or_else(|e| fail(&format!("state: {e}")));
        let run = state
            .runs
            .get("run-big")
            .unwrap_or_else(|| fail("the run is missing"));
        let metrics = harness_engine::domain::ledger::run_metrics(run);
        let binding = harness_engine::domain::ledger::binding_metrics(&state);
        let page = store
            .ledger_events(&scope, Some("run-big"), 0, 1_000)
            .await
            .unwrap_or_else(|e| fail(&format!("events: {e}")));
        std::hint::black_box((&metrics, &binding, &page));
        // What the handler sends: the page as JSON.
        let body = serde_json::to_vec(&page).map_or(0, |b| b.len());
        std::hint::black_box(body);
        first.push(t.elapsed().as_secs_f64() * 1e3);
        if i % 10 == 0 {
            let t = Instant::now();
            let mut after = 0;
            loop {
                let page = store
                    .ledger_events(&scope, Some("run-big"), after, 1_000)
                    .await
                    .unwrap_or_else(|e| fail(&format!("events: {e}")));
                match page.last() {
                    Some(last) => after = last.seq,
                    None => break,
                }
            }
            all.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Reads {
        first_page: figures(first, seconds),
        all_pages: figures(all, seconds),
        head_bytes,
    }
}
