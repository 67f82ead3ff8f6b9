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
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use harness_engine::{
    domain::{
        ids::Keyring,
        limits::Limits,
        state::{BindingRecord, CommitRequest, StateScope},
    },
    store::{Store, mongo::MongoStore, now_ms, sqlite::SqliteStore},
};

struct Settings {
    duration: Duration,
    fsync_samples: usize,
}

#[derive(Default)]
struct Row {
    backend: &'static str,
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

    runtime.block_on(async {
        let sqlite = SqliteStore::open(&scratch.path().join("bench.db"), limits.clone())
            .await
            .unwrap_or_else(|e| fail(&format!("sqlite: {e}")));
        let sqlite = Arc::new(sqlite);
        for bindings in [1, 64] {
            rows.push(measure("sqlite", sqlite.clone(), bindings, settings.duration).await);
        }
    });

    let ferret = FerretDb::start(scratch.path());
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
                    mongo.clone(),
                    bindings,
                    settings.duration,
                )
                .await,
            );
        }
    });
    drop(ferret);

    println!();
    println!(
        "store bench ({}), commit round = 4 KiB pending write + head commit, every commit durable before acknowledged",
        if full { "full" } else { "smoke" }
    );
    println!("disk fsync (4 KiB write + fdatasync): p50 {fsync_p50:.2} ms, p99 {fsync_p99:.2} ms");
    println!(
        "{:<18} {:>8} {:>10} {:>12} {:>9} {:>9}",
        "backend", "bindings", "rounds", "rounds/s", "p50 ms", "p99 ms"
    );
    for r in &rows {
        println!(
            "{:<18} {:>8} {:>10} {:>12.0} {:>9.2} {:>9.2}",
            r.backend,
            r.bindings,
            r.rounds,
            r.rounds as f64 / r.seconds,
            r.p50_ms,
            r.p99_ms
        );
    }

    let mut json = serde_json::Map::new();
    json.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
    json.insert("fsync_p50_ms".into(), fsync_p50.into());
    json.insert("fsync_p99_ms".into(), fsync_p99.into());
    for r in &rows {
        let prefix = format!(
            "{}_{}",
            r.backend.split_whitespace().next().unwrap_or(r.backend),
            r.bindings
        );
        json.insert(
            format!("{prefix}_rounds_per_s"),
            (r.rounds as f64 / r.seconds).into(),
        );
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
    store: Arc<S>,
    bindings: usize,
    duration: Duration,
) -> Row {
    let keyring = Keyring::new(b"bench-key-0123456789abcdef0123456789".to_vec(), "bench")
        .unwrap_or_else(|e| fail(&e.to_string()));
    let run_tag = format!("{backend}-{bindings}-{}", now_ms());
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
                    let pending = store
                        .write_native_state(&scope, &body, &digest)
                        .await
                        .unwrap_or_else(|e| fail(&format!("write: {e}")));
                    let request = CommitRequest {
                        state_id: pending.state_id,
                        expected_revision: revision,
                        run_id: run,
                        terminal: None,
                        interrupt: None,
                    };
                    revision = store
                        .commit_head(&scope, &request)
                        .await
                        .unwrap_or_else(|e| fail(&format!("commit: {e}")))
                        .revision;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Row {
        backend,
        bindings,
        rounds: all.len() as u64,
        seconds,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
    }
}

/// A FerretDB of our own, on a free port and a scratch directory, stopped on drop.
struct FerretDb {
    child: Child,
    port: u16,
}

impl FerretDb {
    fn start(scratch: &Path) -> Self {
        let bin = ferretdb_binary();
        let port = free_port();
        let debug_port = free_port();
        let data = scratch.join("ferretdb");
        let _ = std::fs::create_dir_all(&data);
        let child = Command::new(&bin)
            .arg("--handler=sqlite")
            .arg(format!("--sqlite-url=file:{}/", data.display()))
            .arg(format!("--listen-addr=127.0.0.1:{port}"))
            .arg("--telemetry=disable")
            .arg(format!("--state-dir={}", data.display()))
            .arg(format!("--debug-addr=127.0.0.1:{debug_port}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("starting {}: {e}", bin.display())));
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                fail("FerretDB did not listen within 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        FerretDb { child, port }
    }
    fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/", self.port)
    }
}

impl Drop for FerretDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| fail(&format!("free port: {e}")))
}

/// The FerretDB built by `e2e/scripts/build.sh` (cached; builds on first use).
fn ferretdb_binary() -> PathBuf {
    if let Ok(bin) = std::env::var("HARNESS_E2E_BIN") {
        return PathBuf::from(bin).join("ferretdb");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/scripts/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", script.display())));
    if !out.status.success() {
        fail("e2e/scripts/build.sh failed");
    }
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("ferretdb")
}
