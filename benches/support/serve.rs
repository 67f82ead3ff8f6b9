//! A `harness-engine serve` for the HTTP benches: started on free ports in a data
//! directory of the bench's own, ready before use, killed when dropped; and the
//! measurements they share (percentiles, CPU time and resident memory from `/proc`).

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

fn fail(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(1)
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// CPU time (user + system) a process has used, in seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Field 14 is index 11 after the name (state is field 3, index 0); USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident set size of a process, from `/proc/<pid>/status` (Linux).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

pub struct Server {
    pub child: Child,
    pub api: String,
    pub token: String,
}

impl Server {
    /// `extra`: more `serve` flags (the write-rate limit is always raised: it bounds one
    /// conversation in production and would otherwise measure itself).
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let bin = env!("CARGO_BIN_EXE_harness-engine");
        let mut child = Command::new(bin)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--writes-per-second",
                "1000000",
                "--write-burst",
                "1000000",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("starting {bin}: {e}")));
        let stdout = child.stdout.take().unwrap_or_else(|| fail("no stdout"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut api, mut admin, mut token) = (String::new(), String::new(), String::new());
        let until = Instant::now() + Duration::from_secs(30);
        while admin.is_empty() {
            let line = rx
                .recv_timeout(until.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| fail("serve printed no addresses within 30 s"));
            let first = |rest: &str| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            };
            if let Some(rest) = line.strip_prefix("api: ") {
                api = first(rest);
            } else if let Some(rest) = line.strip_prefix("admin: ") {
                admin = first(rest);
            } else if let Some(rest) = line.strip_prefix("token: ") {
                token = rest.trim().to_owned();
            }
        }
        let server = Server { child, api, token };
        let ready = format!("{admin}/ready");
        while !probe(&ready) {
            if Instant::now() > until {
                fail("serve not ready within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn probe(url: &str) -> bool {
    use std::io::{Read, Write};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}
