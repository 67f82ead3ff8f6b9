//! `make bench-mcp`: MCP `tools/call` round trips against a real `harness-engine serve`
//! (the embedded SQLite store) over Streamable HTTP at `/mcp`, for `recall` and
//! `record_run_event`, at 1 and 32 concurrent sessions: calls per second and p50/p99.
//!
//! A session initializes once, then calls one tool in a loop on a keep-alive connection,
//! in its own workspace (binding): `recall` searches 64 memories stored before the run
//! (a signed receipt with every answer); `record_run_event` appends a guardrail
//! evaluation to a run begun before the run, each durable before it is acknowledged.
//! Every call goes through the same `/v1` handler a direct HTTP call would, so the
//! difference to `make bench-api` is the MCP layer's own cost.
//!
//! `cargo bench --bench mcp` runs the full measurement; without `--bench` (as
//! `cargo test` runs it) it is a short smoke run. Prints a table and writes the figures to
//! `target/bench/mcp.json`.

#[path = "support/serve.rs"]
mod serve;

use std::{
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use serve::{Server, cpu_seconds, percentile};

struct Settings {
    warmup: Duration,
    duration: Duration,
}

struct Row {
    tool: &'static str,
    sessions: usize,
    calls: u64,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    server_cpu_us: f64,
}

static IDS: AtomicU64 = AtomicU64::new(1);

fn fail(msg: &str) -> ! {
    eprintln!("bench-mcp: {msg}");
    std::process::exit(1)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(6),
        }
    } else {
        Settings {
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(300),
        }
    };
    let scratch = tempfile::tempdir().unwrap_or_else(|e| fail(&format!("temp dir: {e}")));
    let policy =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/memory_policy_all_agents.yaml");
    let policy = policy.to_string_lossy().into_owned();
    let server = Server::start(&scratch.path().join("data"), &["--memory-policy", &policy]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio: {e}")));
    let mut rows = Vec::new();
    runtime.block_on(async {
        for tool in ["recall", "record_run_event"] {
            for sessions in [1usize, 32] {
                rows.push(measure(&server, tool, sessions, &settings).await);
            }
        }
    });
    drop(server);

    println!();
    println!(
        "mcp bench ({}), tools/call over Streamable HTTP (stateless, JSON responses), HTTP/1.1 keep-alive, one workspace per session",
        if full { "full" } else { "smoke" }
    );
    println!(
        "{:>18} {:>9} {:>9} {:>10} {:>9} {:>9} {:>14}",
        "tool", "sessions", "calls", "calls/s", "p50 ms", "p99 ms", "server cpu us"
    );
    for r in &rows {
        println!(
            "{:>18} {:>9} {:>9} {:>10.0} {:>9.2} {:>9.2} {:>14.0}",
            r.tool,
            r.sessions,
            r.calls,
            r.calls as f64 / r.seconds,
            r.p50_ms,
            r.p99_ms,
            r.server_cpu_us
        );
    }
    println!(
        "(server cpu us: CPU time of serve per call, from /proc; the load generator shares the 2 cores)"
    );
    let mut out = serde_json::Map::new();
    out.insert("mode".into(), (if full { "full" } else { "smoke" }).into());
    for r in &rows {
        let k = format!("{}_{}", r.tool, r.sessions);
        out.insert(
            format!("{k}_calls_per_s"),
            (r.calls as f64 / r.seconds).into(),
        );
        out.insert(format!("{k}_p50_ms"), r.p50_ms.into());
        out.insert(format!("{k}_p99_ms"), r.p99_ms.into());
        out.insert(format!("{k}_calls"), r.calls.into());
        out.insert(
            format!("{k}_server_cpu_us_per_call"),
            r.server_cpu_us.into(),
        );
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("mcp.json");
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&out).unwrap_or_default(),
    ) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => fail(&format!("writing {}: {e}", path.display())),
    }
}

/// Where the calls go: the server's API address and token.
#[derive(Clone)]
struct Target {
    api: String,
    token: String,
}

/// One JSON-RPC request to `/mcp`; its result.
async fn rpc(http: &reqwest::Client, server: &Target, method: &str, params: Value) -> Value {
    let id = IDS.fetch_add(1, Ordering::Relaxed);
    let response = http
        .post(format!("{}/mcp", server.api))
        .bearer_auth(&server.token)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap_or_else(|e| fail(&format!("{method}: {e}")));
    let body: Value = response
        .json()
        .await
        .unwrap_or_else(|e| fail(&format!("{method} body: {e}")));
    if body.get("error").is_some() {
        fail(&format!("{method}: {body}"));
    }
    body["result"].clone()
}

async fn call(http: &reqwest::Client, server: &Target, tool: &str, arguments: Value) -> Value {
    let result = rpc(
        http,
        server,
        "tools/call",
        json!({"name": tool, "arguments": arguments}),
    )
    .await;
    if result["isError"] == json!(true) {
        fail(&format!("{tool}: {}", result["structuredContent"]));
    }
    result["structuredContent"].clone()
}

/// A session's workspace and what its loop calls.
struct Session {
    workspace: String,
    run_id: String,
}

async fn prepare(http: &reqwest::Client, server: &Target, tag: &str, i: usize) -> Session {
    let bound: Value = http
        .post(format!("{}/v1/bindings", server.api))
        .bearer_auth(&server.token)
        .header("Idempotency-Key", format!("bind-{tag}-{i}"))
        // An agent of its own per session: its memory namespace is its own too.
        .json(&json!({"agent_id": format!("agent-{}-{i}", tag.replace('_', "-")), "conversation_id": format!("mcp-{}-{i}", tag.replace('_', "-")), "harness": "claude_agent_sdk"}))
        .send()
        .await
        .unwrap_or_else(|e| fail(&format!("bind: {e}")))
        .json()
        .await
        .unwrap_or_else(|e| fail(&format!("bind body: {e}")));
    let workspace = bound["binding_id"]
        .as_str()
        .unwrap_or_else(|| fail(&format!("bind: {bound}")))
        .to_owned();
    rpc(
        http,
        server,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench-mcp", "version": "1"}}),
    )
    .await;
    for m in 0..64 {
        call(
            http,
            server,
            "store",
            json!({"workspace_key": workspace, "scope": "user", "key": format!("facts/{m}"),
                   "content": format!("Service {m} is written in Rust, deployed from region {} and owned by team {}.", m % 7, m % 5),
                   "idempotency_key": format!("store-{tag}-{i}-{m}")}),
        )
        .await;
    }
    let run = call(
        http,
        server,
        "begin_run",
        json!({"workspace_key": workspace, "idempotency_key": format!("run-{tag}-{i}")}),
    )
    .await;
    Session {
        workspace,
        run_id: run["run_id"].as_str().unwrap_or_default().to_owned(),
    }
}

async fn measure(server: &Server, tool: &'static str, sessions: usize, settings: &Settings) -> Row {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(sessions)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|e| fail(&format!("client: {e}")));
    let tag = format!("{tool}-{sessions}-{}", std::process::id());
    let target = Target {
        api: server.api.clone(),
        token: server.token.clone(),
    };
    let mut prepared = Vec::new();
    for i in 0..sessions {
        prepared.push(prepare(&http, &target, &tag, i).await);
    }
    let warm_until = Instant::now() + settings.warmup;
    let deadline = warm_until + settings.duration;
    let server_pid = server.child.id();
    let cpu_from = tokio::spawn(async move {
        tokio::time::sleep_until(warm_until.into()).await;
        cpu_seconds(server_pid)
    });
    let tasks: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(i, session)| {
            let http = http.clone();
            let server = target.clone();
            let tag = tag.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                loop {
                    let started = Instant::now();
                    if started >= deadline {
                        break;
                    }
                    let arguments = match tool {
                        "recall" => json!({"workspace_key": session.workspace, "query": format!("service rust region {}", n % 7), "limit": 8}),
                        _ => json!({"workspace_key": session.workspace, "run_id": session.run_id,
                                    "idempotency_key": format!("ev-{tag}-{i}-{n}"),
                                    "turn_id": format!("t{}", n / 500),
                                    "type": "GuardrailEvaluated",
                                    "payload": {"guardrail": "pii", "result": "pass"}}),
                    };
                    call(&http, &server, tool, arguments).await;
                    n += 1;
                    if started >= warm_until {
                        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
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
    let cpu_start = cpu_from.await.unwrap_or(0.0);
    let cpu = cpu_seconds(server_pid) - cpu_start;
    all.sort_by(|a, b| a.total_cmp(b));
    let calls = all.len() as u64;
    Row {
        tool,
        sessions,
        calls,
        seconds: settings.duration.as_secs_f64(),
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        server_cpu_us: if calls == 0 {
            0.0
        } else {
            cpu * 1e6 / calls as f64
        },
    }
}
