//! `make bench-store`: commit rounds (a 4 KiB pending write + the head commit) against
//! each backend, at 1 and 64 concurrent bindings, next to the disk's own fsync latency so
//! the report shows how close the store gets to the disk.
//!
//! `cargo bench --bench store` runs the full measurement; run without `--bench` (as
//! `cargo test` does) it is a short smoke run. Prints a table and writes the same figures
//! as flat JSON to `target/bench/store.json`.
//!
//! The write-rate limit is raised for the run: it bounds one conversation's writes in
//! production and would otherwise measure itself here.

use std::{
    io::Write,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

#[path = "support/ferret.rs"]
mod ferret;
use ferret::FerretDb;

use harness_engine::{
    domain::{
        ids::Keyring,
        limits::Limits,
        state::{BindingRecord, CommitRequest, StateScope},
    },
    store::{
        Store,
        mongo::MongoStore,
        now_ms,
        sqlite::{SqliteStore, baseline::Baseline},
    },
};

struct Settings {
    duration: Duration,
    fsync_samples: usize,
}

/// How a commit round reaches the store.
#[derive(Clone, Copy, PartialEq)]
enum Round {
    /// `write_native_state`, then `commit_head`: two calls, two durable writes (the
    /// SDK adapters' pending + commit).
    TwoCalls,
    /// `write_and_commit`: one call, one durable write (`state/commit-inline`).
    OneCall,
}

impl Round {
    fn label(self) -> &'static str {
        match self {
            Round::TwoCalls => "2 calls",
            Round::OneCall => "1 call",
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Round::TwoCalls => "",
            Round::OneCall => "_inline",
        }
    }
}

struct Row {
    backend: &'static str,
    round: Round,
    bindings: usize,
    rounds: u64,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            duration: Duration::from_secs(6),
            fsync_samples: 500,
        }
    } else {
        Settings {
            duration: Duration::from_millis(300),
            fsync_samples: 20,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio: {e}")));
    let scratch = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temp dir: {e}")));

    let (fsync_p50, fsync_p99) = fsync_latency(scratch.path(), settings.fsync_samples);
    let mut rows = Vec::new();
    let limits = Limits {
        writes_per_second: 1_000_000,
        write_burst: 1_000_000,
        ..Limits::default()
    };

    let with_mongo = std::env::var("HARNESS_BENCH_STORE_MONGO").as_deref() != Ok("0");
    runtime.block_on(async {
        let sqlite = SqliteStore::open(&scratch.path().join("bench.db"), limits.clone())
            .await
            .unwrap_or_else(|e| fail(&format!("sqlite: {e}")));
        let sqlite = Arc::new(sqlite);
        let baseline = Baseline::open(&scratch.path().join("baseline.db"))
            .await
            .unwrap_or_else(|e| fail(&format!("baseline: {e}")));
        let baseline = Arc::new(baseline);
        // Side by side: each store row right after the baseline row it is compared with.
        for bindings in [1, 64] {
            rows.push(measure_baseline(baseline.clone(), bindings, settings.duration).await);
            rows.push(
                measure(
                    "sqlite",
                    Round::TwoCalls,
                    sqlite.clone(),
                    bindings,
                    settings.duration,
                )
                .await,
            );
            rows.push(
                measure(
                    "sqlite",
                    Round::OneCall,
                    sqlite.clone(),
                    bindings,
                    settings.duration,
                )
                .await,
            );
        }
    });

    let ferret = with_mongo.then(|| FerretDb::start(scratch.path()));
    if let Some(ferret) = &ferret {
        runtime.block_on(async {
            let uri = ferret.uri();
            let mongo = MongoStore::connect(
                &uri,
                &format!("bench_{}", std::process::id()),
                limits.clone(),
            )
            .await
            .unwrap_or_else(|e| fail(&format!("mongo: {e}")));
            let mongo = Arc::new(mongo);
            for bindings in [1, 64] {
                rows.push(
                    measure(
                        "mongo (FerretDB)",
                        Round::TwoCalls,
                        mongo.clone(),
                        bindings,
                        settings.duration,
                    )
                    .await,
                );
            }
        });
    }
    drop(ferret);

    println!();
    println!(
        "store bench ({}), commit round = 4 KiB pending write + head commit, every commit durable before acknowledged",
        if full { "full" } else { "smoke" }
    );
    println!("disk fsync (4 KiB write + fdatasync): p50 {fsync_p50:.2} ms, p99 {fsync_p99:.2} ms");
    println!(
        "{:<18} {:<9} {:>8} {:>10} {:>12} {:>9} {:>9} {:>11}",
        "backend", "round", "bindings", "rounds", "rounds/s", "p50 ms", "p99 ms", "x baseline"
    );
    for r in &rows {
        let ratio = baseline_ratio(&rows, r);
        println!(
            "{:<18} {:<9} {:>8} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>11}",
            r.backend,
            r.round.label(),
            r.bindings,
            r.rounds,
            r.rate(),
            r.p50_ms,
            r.p99_ms,
            ratio.map_or_else(String::new, |x| format!("{x:.2}"))
        );
    }

    let mut json = serde_json::Map::new();
    json.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
    json.insert("fsync_p50_ms".into(), fsync_p50.into());
    json.insert("fsync_p99_ms".into(), fsync_p99.into());
    for r in &rows {
        let prefix = format!(
            "{}{}_{}",
            r.backend.split_whitespace().next().unwrap_or(r.backend),
            r.round.suffix(),
            r.bindings
        );
        json.insert(format!("{prefix}_rounds_per_s"), r.rate().into());
        if let Some(x) = baseline_ratio(&rows, r) {
            json.insert(format!("{prefix}_of_baseline"), x.into());
        }
        json.insert(format!("{prefix}_p50_ms"), r.p50_ms.into());
        json.insert(format!("{prefix}_p99_ms"), r.p99_ms.into());
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let path = out.join("store.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => fail(&format!("writing {}: {e}", path.display())),
    }
}

impl Row {
    fn rate(&self) -> f64 {
        self.rounds as f64 / self.seconds
    }
}

/// The store row's rate as a fraction of the baseline's at the same bindings (the
/// baseline does two durable writes per round, as the two-call round does).
fn baseline_ratio(rows: &[Row], r: &Row) -> Option<f64> {
    if r.backend == BASELINE || !r.backend.starts_with("sqlite") {
        return None;
    }
    rows.iter()
        .find(|b| b.backend == BASELINE && b.bindings == r.bindings)
        .map(|b| r.rate() / b.rate())
}

const BASELINE: &str = "baseline (SQLite)";

/// The same two durable writes per round (a 4 KiB body row, a head row) through the
/// same writer and group commit, without the protocol.
async fn measure_baseline(baseline: Arc<Baseline>, bindings: usize, duration: Duration) -> Row {
    let body = vec![0xabu8; 4096];
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..bindings)
        .map(|i| {
            let baseline = baseline.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let binding = format!("binding-{bindings}-{i}");
                let mut lat = Vec::new();
                let mut revision = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let id = baseline
                        .write(&binding, &body)
                        .await
                        .unwrap_or_else(|e| fail(&format!("baseline write: {e}")));
                    revision += 1;
                    baseline
                        .commit(&binding, revision, id)
                        .await
                        .unwrap_or_else(|e| fail(&format!("baseline commit: {e}")));
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                lat
            })
        })
        .collect();
    finish(BASELINE, Round::TwoCalls, bindings, started, tasks).await
}

async fn finish(
    backend: &'static str,
    round: Round,
    bindings: usize,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>,
) -> Row {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Row {
        backend,
        round,
        bindings,
        rounds: all.len() as u64,
        seconds,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-store: {msg}");
    std::process::exit(1)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn fsync_latency(dir: &Path, samples: usize) -> (f64, f64) {
    let path = dir.join("fsync.probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| fail(&format!("fsync probe: {e}")));
    let block = vec![0x5au8; 4096];
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        file.write_all(&block)
            .unwrap_or_else(|e| fail(&format!("fsync probe write: {e}")));
        file.sync_data()
            .unwrap_or_else(|e| fail(&format!("fsync probe sync: {e}")));
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(f64::total_cmp);
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

async fn measure<S: Store + 'static>(
    backend: &'static str,
    round: Round,
    store: Arc<S>,
    bindings: usize,
    duration: Duration,
) -> Row {
    let keyring = Keyring::new(b"bench-key-0123456789abcdef0123456789".to_vec(), "bench")
        .unwrap_or_else(|e| fail(&e.to_string()));
    let run_tag = format!("{backend}-{}-{bindings}-{}", round.label(), now_ms());
    let mut scopes = Vec::new();
    for i in 0..bindings {
        let conversation = format!("{run_tag}-{i}");
        let record = BindingRecord {
            binding_id: keyring.binding_id("user:bench", "agent-bench", &conversation),
            environment: "bench".into(),
            owner: keyring.subject_ref("user:bench"),
            agent_id: "agent-bench".into(),
            conversation_id: conversation,
            harness: "strands".into(),
            epoch: 0,
            lease_generation: 1,
            created_at_ms: now_ms(),
        };
        store
            .ensure_binding(&record)
            .await
            .unwrap_or_else(|e| fail(&format!("{backend}: ensure_binding: {e}")));
        scopes.push(StateScope {
            binding_id: record.binding_id,
            environment: "bench".into(),
            harness: "strands".into(),
            epoch: 0,
            codec: "bench-v1".into(),
            lease_generation: 1,
        });
    }
    let body = vec![0xabu8; 4096];
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = scopes
        .into_iter()
        .map(|scope| {
            let store = store.clone();
            let body = body.clone();
            let keyring = keyring.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut revision = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let run = format!("run-{}", revision + 1);
                    let digest = keyring.idempotency_digest(&scope.binding_id, "state.write", &run);
                    let mut request = CommitRequest {
                        state_id: String::new(),
                        expected_revision: revision,
                        run_id: run,
                        terminal: None,
                        interrupt: None,
                    };
                    let head = match round {
                        Round::TwoCalls => {
                            let pending = store
                                .write_native_state(&scope, &body, &digest)
                                .await
                                .unwrap_or_else(|e| fail(&format!("write: {e}")));
                            request.state_id = pending.state_id;
                            store.commit_head(&scope, &request).await
                        }
                        Round::OneCall => store
                            .write_and_commit(&scope, &body, &digest, &request, None)
                            .await
                            .map(|(_, head)| head),
                    };
                    revision = head
                        .unwrap_or_else(|e| fail(&format!("commit: {e}")))
                        .revision;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                lat
            })
        })
        .collect();
    finish(backend, round, bindings, started, tasks).await
}
