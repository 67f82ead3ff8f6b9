//! `make bench-api`: turns per second over HTTP against a real `harness-engine serve`
//! (the embedded SQLite store), at 1 and 64 concurrent clients, with p50/p99 turn
//! latency, and the idle resident memory of the server.
//!
//! A turn is what a worker does per model turn, measured both ways the API offers: one
//! call, `POST .../state/commit-inline` with a 4 KiB opaque body (what the LangGraph
//! adapter does), and two calls, `POST .../state/pending` with the body then
//! `POST .../state/commit`; on keep-alive connections, each client on its own binding.
//! Every commit is durable before it is acknowledged.
//!
//! `cargo bench --bench api` runs the full measurement; run without `--bench` (as
//! `cargo test` does) it is a short smoke run. Prints a table and writes the same figures
//! as flat JSON to `target/bench/api.json`. Targets on 2 cores: >= 10,000 one-call turns/s
//! at 64 clients with p99 <= 15 ms; idle RSS <= 30 MiB. The write-rate limit is raised for the
//! run: it bounds one conversation in production and would otherwise measure itself.

#[path = "support/serve.rs"]
mod serve;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serve::{Server, cpu_seconds, percentile, rss_mib};

struct Settings {
    warmup: Duration,
    duration: Duration,
}

/// How a turn reaches the API.
#[derive(Clone, Copy, PartialEq)]
enum Turn {
    /// `state/commit-inline`.
    OneCall,
    /// `state/pending`, then `state/commit`.
    TwoCalls,
}

impl Turn {
    fn label(self) -> &'static str {
        match self {
            Turn::OneCall => "1 call",
            Turn::TwoCalls => "2 calls",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Turn::OneCall => "inline",
            Turn::TwoCalls => "pending_commit",
        }
    }
}

struct Row {
    turn: Turn,
    clients: usize,
    turns: u64,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU the server and the load generator spent per turn, microseconds: shows where a
    /// shared 2-core machine's time went.
    server_cpu_us: f64,
    client_cpu_us: f64,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(8),
        }
    } else {
        Settings {
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(300),
        }
    };
    let scratch = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temp dir: {e}")));
    let server = Server::start(&scratch.path().join("data"), &[]);

    // Idle: started, ready, nothing served yet but the readiness probe.
    std::thread::sleep(Duration::from_millis(if full { 1000 } else { 200 }));
    let idle_rss_mib = rss_mib(server.child.id());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio: {e}")));
    let mut rows = Vec::new();
    runtime.block_on(async {
        for clients in [1usize, 64] {
            for turn in [Turn::OneCall, Turn::TwoCalls] {
                rows.push(measure(&server, turn, clients, &settings).await);
            }
        }
    });
    let loaded_rss_mib = rss_mib(server.child.id());
    drop(server);

    println!();
    println!(
        "api bench ({}), turn = POST state/commit-inline (4 KiB) [1 call] or POST state/pending (4 KiB) + POST state/commit [2 calls], HTTP/1.1 keep-alive, durable before acknowledged",
        if full { "full" } else { "smoke" }
    );
    println!(
        "{:<8} {:>8} {:>10} {:>12} {:>9} {:>9} {:>14} {:>14}",
        "turn", "clients", "turns", "turns/s", "p50 ms", "p99 ms", "server cpu us", "client cpu us"
    );
    for r in &rows {
        println!(
            "{:<8} {:>8} {:>10} {:>12.0} {:>9.2} {:>9.2} {:>14.0} {:>14.0}",
            r.turn.label(),
            r.clients,
            r.turns,
            r.turns as f64 / r.seconds,
            r.p50_ms,
            r.p99_ms,
            r.server_cpu_us,
            r.client_cpu_us
        );
    }
    println!(
        "(cpu us: CPU time per turn from /proc, server and load generator; both share the machine)"
    );
    println!(
        "serve resident memory: idle {idle_rss_mib:.1} MiB, after the runs {loaded_rss_mib:.1} MiB"
    );
    if let Some(r) = rows
        .iter()
        .find(|r| r.clients == 64 && r.turn == Turn::OneCall)
    {
        let tps = r.turns as f64 / r.seconds;
        println!(
            "targets (2 cores): 64 clients >= 10000 one-call turns/s [{}], p99 <= 15 ms [{}], idle RSS <= 30 MiB [{}]",
            verdict(tps >= 10_000.0),
            verdict(r.p99_ms <= 15.0),
            verdict(idle_rss_mib <= 30.0)
        );
    }

    let mut json = serde_json::Map::new();
    json.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
    json.insert("idle_rss_mib".into(), idle_rss_mib.into());
    json.insert("loaded_rss_mib".into(), loaded_rss_mib.into());
    for r in &rows {
        let p = format!("{}_clients_{}", r.turn.key(), r.clients);
        json.insert(
            format!("{p}_turns_per_s"),
            (r.turns as f64 / r.seconds).into(),
        );
        json.insert(format!("{p}_p50_ms"), r.p50_ms.into());
        json.insert(format!("{p}_p99_ms"), r.p99_ms.into());
        json.insert(format!("{p}_turns"), r.turns.into());
        json.insert(
            format!("{p}_server_cpu_us_per_turn"),
            r.server_cpu_us.into(),
        );
        json.insert(
            format!("{p}_client_cpu_us_per_turn"),
            r.client_cpu_us.into(),
        );
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let path = out.join("api.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => fail(&format!("writing {}: {e}", path.display())),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("bench-api: {msg}");
    std::process::exit(1)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

async fn measure(server: &Server, turn: Turn, clients: usize, settings: &Settings) -> Row {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|e| fail(&format!("client: {e}")));
    let tag = format!("{}-{clients}-{}", turn.key(), std::process::id());
    let mut bindings = Vec::new();
    for i in 0..clients {
        let response = http
            .post(format!("{}/v1/bindings", server.api))
            .bearer_auth(&server.token)
            .header("Idempotency-Key", format!("bind-{tag}-{i}"))
            .json(&serde_json::json!({"agent_id": "agent-bench", "conversation_id": format!("bench-{tag}-{i}"), "harness": "strands"}))
            .send()
            .await
            .unwrap_or_else(|e| fail(&format!("bind: {e}")));
        let value: serde_json::Value = response
            .json()
            .await
            .unwrap_or_else(|e| fail(&format!("bind body: {e}")));
        bindings.push(
            value["binding_id"]
                .as_str()
                .unwrap_or_else(|| fail(&format!("bind: {value}")))
                .to_owned(),
        );
    }
    let body = bytes_body();
    let warm_until = Instant::now() + settings.warmup;
    let server_pid = server.child.id();
    let measure_from = tokio::spawn(async move {
        tokio::time::sleep_until(warm_until.into()).await;
        (cpu_seconds(server_pid), cpu_seconds(std::process::id()))
    });
    let deadline = warm_until + settings.duration;
    let tasks: Vec<_> = bindings
        .into_iter()
        .map(|binding| {
            let http = http.clone();
            let api = server.api.clone();
            let token = server.token.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut revision = 0u64;
                let pending_url = format!("{api}/v1/bindings/{binding}/state/pending");
                let commit_url = format!("{api}/v1/bindings/{binding}/state/commit");
                let inline_url = format!("{api}/v1/bindings/{binding}/state/commit-inline");
                loop {
                    let started = Instant::now();
                    if started >= deadline {
                        break;
                    }
                    let run = format!("run-{}", revision + 1);
                    if turn == Turn::OneCall {
                        let commit = http
                            .post(format!("{inline_url}?expected_revision={revision}&run_id={run}"))
                            .bearer_auth(&token)
                            .header("Idempotency-Key", &run)
                            .header("Harness-Epoch", "0")
                            .header("Harness-Lease-Generation", "1")
                            .header("Content-Type", "application/octet-stream")
                            .body(body.clone())
                            .send()
                            .await
                            .unwrap_or_else(|e| fail(&format!("commit-inline: {e}")));
                        if commit.status().as_u16() != 200 {
                            fail(&format!("commit-inline: {} {}", commit.status(), commit.text().await.unwrap_or_default()));
                        }
                        let head: serde_json::Value = commit.json().await.unwrap_or_else(|e| fail(&format!("commit-inline body: {e}")));
                        revision = head["revision"].as_u64().unwrap_or_else(|| fail(&format!("commit-inline: {head}")));
                        if started >= warm_until {
                            latencies.push(started.elapsed().as_secs_f64() * 1e3);
                        }
                        continue;
                    }
                    let pending = http
                        .post(&pending_url)
                        .bearer_auth(&token)
                        .header("Idempotency-Key", &run)
                        .header("Harness-Epoch", "0")
                        .header("Harness-Lease-Generation", "1")
                        .header("Content-Type", "application/octet-stream")
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap_or_else(|e| fail(&format!("pending: {e}")));
                    if pending.status().as_u16() != 201 {
                        fail(&format!("pending: {} {}", pending.status(), pending.text().await.unwrap_or_default()));
                    }
                    let pending: serde_json::Value = pending.json().await.unwrap_or_else(|e| fail(&format!("pending body: {e}")));
                    let commit = http
                        .post(&commit_url)
                        .bearer_auth(&token)
                        .header("Idempotency-Key", format!("commit-{run}"))
                        .header("Harness-Epoch", "0")
                        .header("Harness-Lease-Generation", "1")
                        .json(&serde_json::json!({"state_id": pending["state_id"], "expected_revision": revision, "run_id": run}))
                        .send()
                        .await
                        .unwrap_or_else(|e| fail(&format!("commit: {e}")));
                    if commit.status().as_u16() != 200 {
                        fail(&format!("commit: {} {}", commit.status(), commit.text().await.unwrap_or_default()));
                    }
                    let head: serde_json::Value = commit.json().await.unwrap_or_else(|e| fail(&format!("commit body: {e}")));
                    revision = head["revision"].as_u64().unwrap_or_else(|| fail(&format!("commit: {head}")));
                    if started >= warm_until {
                        latencies.push(started.elapsed().as_secs_f64() * 1e3);
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let (server_cpu, client_cpu) = (cpu_seconds(server_pid), cpu_seconds(std::process::id()));
    let (server_from, client_from) = measure_from.await.unwrap_or((server_cpu, client_cpu));
    let seconds = settings.duration.as_secs_f64();
    all.sort_by(f64::total_cmp);
    let per_turn = |cpu: f64| {
        if all.is_empty() {
            0.0
        } else {
            cpu * 1e6 / all.len() as f64
        }
    };
    Row {
        turn,
        clients,
        turns: all.len() as u64,
        seconds,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        server_cpu_us: per_turn(server_cpu - server_from),
        client_cpu_us: per_turn(client_cpu - client_from),
    }
}

fn bytes_body() -> Vec<u8> {
    // Not all one byte: a realistic checkpoint does not compress to nothing.
    (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}
