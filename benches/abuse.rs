//! `make bench-abuse`: the resident memory of a real `harness-engine serve` while 64
//! clients, each with a valid token and its own binding, send the worst bodies the API
//! accepts or refuses, over and over, all at once:
//!
//! - `values`: a commit whose JSON is ~4 MiB of tiny values (two million zeros), just
//!   under the body bound: refused `413 too_large` ("JSON values") without building a tree;
//! - `nesting`: ~4 MiB of `[`: refused `413 too_large` ("JSON nesting depth");
//! - `oversize`: a body one byte over the bound: refused before it is read in full;
//! - `state`: a pending state write of 4 MiB, the largest accepted: stored;
//! - `object`: an object put of 4 MiB: stored.
//!
//! The server's RSS is sampled every 20 ms; the peak is the figure (target: at most
//! 150 MiB with 64 concurrent worst-case bodies, issue "Faults and abuse"). Every answer's
//! status is counted per kind, and a kind that gets an answer other than the documented one
//! fails the run. `cargo bench --bench abuse` runs 64 clients for 10 s; without `--bench`
//! (as `cargo test --all-targets` runs it) 4 clients for a moment. Prints a table and
//! writes `target/bench/abuse.json`.

#[path = "../tests/api_support/mod.rs"]
mod api_support;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use api_support::{Api, serve};
use axum::body::Bytes;
use reqwest::Method;

const MIB: usize = 1024 * 1024;
/// The default body bound: the largest payload (4 MiB) plus 64 KiB (docs/api.md).
const BODY_BOUND: usize = 4 * MIB + 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Values,
    Nesting,
    Oversize,
    State,
    Object,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Values,
        Kind::Nesting,
        Kind::Oversize,
        Kind::State,
        Kind::Object,
    ];
    fn name(self) -> &'static str {
        match self {
            Kind::Values => "values",
            Kind::Nesting => "nesting",
            Kind::Oversize => "oversize",
            Kind::State => "state",
            Kind::Object => "object",
        }
    }
    /// The answers the API documents for this body.
    fn expected(self, status: u16) -> bool {
        match self {
            Kind::Values | Kind::Nesting | Kind::Oversize => status == 413,
            Kind::State | Kind::Object => (200..300).contains(&status),
        }
    }
}

struct Bodies {
    values: Bytes,
    nesting: Bytes,
    oversize: Bytes,
    blob: Bytes,
}

impl Bodies {
    fn new() -> Self {
        // {"state_id":"...","expected_revision":0,...,"metadata":{"v":[0,0,...]}}: the
        // state id is replaced per client; the values fill the body to just under the bound.
        let count = (BODY_BOUND - 512) / 2;
        let mut zeros = String::with_capacity(count * 2);
        for i in 0..count {
            if i > 0 {
                zeros.push(',');
            }
            zeros.push('0');
        }
        let values = format!(
            r#"{{"state_id":"STATE","expected_revision":0,"run_id":"run-x","terminal":{{"outcome":"completed","metadata":{{"v":[{zeros}]}}}}}}"#
        );
        let depth = BODY_BOUND - 512;
        let nesting = format!(
            r#"{{"state_id":"STATE","expected_revision":0,"run_id":"run-x","terminal":{{"outcome":"completed","metadata":{{"v":{}}}}}}}"#,
            "[".repeat(depth)
        );
        Bodies {
            values: Bytes::from(values),
            nesting: Bytes::from(nesting),
            oversize: Bytes::from(vec![b'x'; BODY_BOUND + 1]),
            blob: Bytes::from(vec![7u8; 4 * MIB]),
        }
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (clients, duration) = if full {
        (64, Duration::from_secs(10))
    } else {
        (4, Duration::from_millis(500))
    };
    let server = serve(&["--writes-per-second", "1000000", "--write-burst", "1000000"]);
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_mib(server.pid());
    let bodies = Arc::new(Bodies::new());

    // The sampler: the peak RSS while the clients run.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(Mutex::new(idle));
    let sampler = {
        let (stop, peak, pid) = (stop.clone(), peak.clone(), server.pid());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let now = rss_mib(pid);
                if let Ok(mut p) = peak.lock()
                    && now > *p
                {
                    *p = now;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let counts: BTreeMap<(Kind, u16), u64> = runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let api = Api::new(&server.api, &server.token);
            let bodies = bodies.clone();
            tasks.push(tokio::spawn(async move {
                let (binding, e, g) = api.bound("abuse-agent", &format!("conv-{c}")).await;
                let pending = api.write_pending(&binding, (e, g), "w0", b"s").await;
                let state_id = pending.json()["state_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let with_state = |b: &Bytes| {
                    Bytes::from(String::from_utf8_lossy(b).replacen("STATE", &state_id, 1))
                };
                let (values, nesting) = (with_state(&bodies.values), with_state(&bodies.nesting));
                let mut counts: BTreeMap<(Kind, u16), u64> = BTreeMap::new();
                let until = Instant::now() + duration;
                let mut i = c;
                while Instant::now() < until {
                    let kind = Kind::ALL[i % Kind::ALL.len()];
                    i += 1;
                    let fenced = |method: Method, path: String| {
                        api.worker(method, &path, e, g)
                            .header("Idempotency-Key", format!("abuse-{c}-{i}"))
                    };
                    let commit = format!("/v1/bindings/{binding}/state/commit");
                    let req = match kind {
                        Kind::Values => fenced(Method::POST, commit)
                            .header("Content-Type", "application/json")
                            .body(values.clone()),
                        Kind::Nesting => fenced(Method::POST, commit)
                            .header("Content-Type", "application/json")
                            .body(nesting.clone()),
                        Kind::Oversize => fenced(Method::POST, commit)
                            .header("Content-Type", "application/json")
                            .body(bodies.oversize.clone()),
                        Kind::State => fenced(
                            Method::POST,
                            format!("/v1/bindings/{binding}/state/pending"),
                        )
                        .header("Content-Type", "application/octet-stream")
                        .body(bodies.blob.clone()),
                        Kind::Object => fenced(
                            Method::PUT,
                            format!("/v1/bindings/{binding}/objects/item?key=big-{}", i % 4),
                        )
                        .header("Content-Type", "application/octet-stream")
                        .body(bodies.blob.clone()),
                    };
                    // A refusal before the body is read may close the connection while
                    // the client still sends: that is an answer too (status 0 = reset).
                    let status = match req.send().await {
                        Ok(r) => {
                            let s = r.status().as_u16();
                            let _ = r.bytes().await;
                            s
                        }
                        Err(_) => 0,
                    };
                    *counts.entry((kind, status)).or_default() += 1;
                }
                counts
            }));
        }
        let mut all = BTreeMap::new();
        for t in tasks {
            for (k, v) in t.await.expect("client task") {
                *all.entry(k).or_default() += v;
            }
        }
        all
    });
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let peak = peak.lock().map(|p| *p).unwrap_or(f64::NAN);
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_mib(server.pid());

    println!(
        "bench-abuse: {clients} clients, {:.0} s, serve resident memory (MiB)",
        duration.as_secs_f64()
    );
    println!("  idle {idle:.1}   peak {peak:.1}   after {after:.1}");
    println!("  {:<10} {:>8}  answers", "kind", "requests");
    let mut wrong = Vec::new();
    let mut json_kinds = serde_json::Map::new();
    for kind in Kind::ALL {
        let answers: Vec<(u16, u64)> = counts
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, s), n)| (*s, *n))
            .collect();
        let total: u64 = answers.iter().map(|(_, n)| n).sum();
        let shown: Vec<String> = answers.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        println!("  {:<10} {:>8}  {}", kind.name(), total, shown.join(", "));
        for (s, n) in &answers {
            // A reset (0) is acceptable only for the body refused before it is read.
            let ok = kind.expected(*s) || (*s == 0 && kind == Kind::Oversize);
            if !ok {
                wrong.push(format!("{} answered {s} x{n}", kind.name()));
            }
        }
        json_kinds.insert(
            kind.name().into(),
            serde_json::json!({"requests": total, "answers": answers.iter().map(|(s, n)| (s.to_string(), *n)).collect::<BTreeMap<_,_>>()}),
        );
    }
    let met = peak <= 150.0;
    println!(
        "  peak RSS <= 150 MiB with {clients} concurrent worst-case bodies: {}",
        if met { "met" } else { "MISSED" }
    );
    let out = serde_json::json!({
        "clients": clients,
        "seconds": duration.as_secs_f64(),
        "idle_rss_mib": idle,
        "peak_rss_mib": peak,
        "after_rss_mib": after,
        "target_peak_rss_mib": 150.0,
        "kinds": json_kinds,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("abuse.json");
    if let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(&out).unwrap_or_default()) {
        eprintln!("bench-abuse: writing {}: {e}", path.display());
    }
    if !wrong.is_empty() {
        eprintln!("bench-abuse: undocumented answers: {}", wrong.join("; "));
        std::process::exit(1);
    }
}
