//! `make bench-memory-scan`: the cost of scanning one memory write (steps 3 and 4 of
//! the pipeline: the secret catalog with its keyword prefilter, the normalized views,
//! decoding of embedded base64 and hex, the authority, topic and instruction patterns).
//!
//! Bodies: a 12-word note (what `make bench-memory` writes), a 1 KiB note, a 16 KiB note
//! (the default content limit), and a 16 KiB worst case dense with secrets, `.env`
//! lines, Cyrillic text and base64 and hex runs, admitted (a refusal would stop early). One thread, each body scanned
//! repeatedly; latency per scan.
//!
//! `cargo bench --bench memory_scan` runs the full measurement; without `--bench` (as
//! `cargo test --all-targets` does) it is a short smoke run. Prints a table and writes
//! the figures as flat JSON to `target/bench/memory_scan.json`.

use std::{path::Path, time::Instant};

use harness_engine::domain::memory::scan;

fn note(words: usize) -> String {
    const WORDS: [&str; 24] = [
        "prefers", "concise", "answers", "the", "team", "ships", "reports", "on", "friday", "uses",
        "rust", "and", "python", "for", "tooling", "meeting", "notes", "from", "planning",
        "review", "tea", "garden", "weekly", "summary",
    ];
    let mut out = String::new();
    for i in 0..words {
        if i > 0 {
            out.push(if i % 14 == 0 { '.' } else { ' ' });
            if i % 14 == 0 {
                out.push(' ');
            }
        }
        out.push_str(WORDS[(i * 7 + i / 3) % WORDS.len()]);
    }
    out
}

fn hostile(bytes: usize) -> String {
    // Admitted, not refused (a refusal stops early): every detector runs to the end.
    let chunk = "export DB_PASSWORD=\"hunter2hunter2\" token ghp_0123456789abcdefghijABCDEFGHIJ012345 \
                 url https://b.s3.amazonaws.com/k?X-Amz-Signature=4f1c0e3b9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f1e2d3c4b5a697887 \
                 Встреча в понедельник SGVsbG8gdGhlcmUgZnJpZW5k 3f5a9c1e8b7d6a5f4e3d2c1b0a9f8e7d sk_live_abcdefghij0123456789\n";
    let mut out = String::with_capacity(bytes + chunk.len());
    while out.len() < bytes {
        out.push_str(chunk);
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let iterations = if full { 2_000 } else { 20 };
    let cases: Vec<(&str, String)> = vec![
        ("12-word note", note(12)),
        ("1 KiB note", note(170)),
        ("16 KiB note", note(2_700)),
        ("16 KiB hostile", hostile(16 * 1024)),
    ];
    let mut json = serde_json::Map::new();
    println!();
    println!(
        "memory scan bench ({}), one thread",
        if full { "full" } else { "smoke" }
    );
    println!("| body | bytes | scans | p50 µs | p99 µs | scans/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, body) in &cases {
        // Warm the lazily built patterns and their caches.
        let _ = scan::scan(body);
        let mut lat = Vec::with_capacity(iterations);
        let started = Instant::now();
        for _ in 0..iterations {
            let t = Instant::now();
            let outcome = scan::scan(body);
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(outcome.is_ok());
        }
        let total = started.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        let per_s = iterations as f64 / total;
        println!(
            "| {name} | {} | {iterations} | {p50:.1} | {p99:.1} | {per_s:.0} |",
            body.len()
        );
        let key = name.replace([' ', '-'], "_").to_lowercase();
        json.insert(format!("{key}_p50_us"), p50.into());
        json.insert(format!("{key}_p99_us"), p99.into());
        json.insert(format!("{key}_bytes"), body.len().into());
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("memory_scan.json"),
        serde_json::Value::Object(json).to_string(),
    );
}
