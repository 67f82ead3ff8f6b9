//! The recorded history: every invocation and its response with timestamps, in the
//! format `e2e/checker` reads (one JSON object per line).
//!
//! An operation whose outcome is unknown (the request may have reached the server, and
//! no answer says what happened) gets as its return time the latest moment its effect
//! can have happened: the first *barrier* after its invocation. A barrier is the death
//! of the process that serves the API (for `serve`, the moment SIGKILL took it; for the
//! MongoDB node, the moment it restarts, after a pause that lets FerretDB finish what the
//! dead node had sent). The fault injector drains every request invoked before a death
//! before it starts the next process, so no request invoked before a barrier can reach
//! a process that lives after it. A control call made in this process through the store
//! API has decided its outcome when it returns, so its own return time bounds it.

use std::{
    io::Write,
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use serde::Serialize;

/// What an operation asked for (the fields a given operation uses; see `e2e/checker`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Input {
    pub epoch: u64,
    pub r#gen: u64,
    pub expect: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub key: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub val: String,
}

/// What came back.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Output {
    /// `ok`, `fail` (a definite refusal) or `unknown`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub code: String,
    pub rev: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub val: String,
    pub epoch: u64,
    pub r#gen: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl Output {
    pub fn ok() -> Self {
        Output {
            status: "ok",
            ..Output::default()
        }
    }
    pub fn fail(code: impl Into<String>) -> Self {
        Output {
            status: "fail",
            code: code.into(),
            ..Output::default()
        }
    }
    pub fn unknown(error: impl Into<String>) -> Self {
        Output {
            status: "unknown",
            error: error.into(),
            ..Output::default()
        }
    }
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

/// How an unknown outcome is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The return time is the bound (a definite answer, or a store call in this process).
    Returned,
    /// The first barrier after the invocation.
    NextBarrier,
    /// A 5xx answer: this long after the answer, or the next barrier, whichever is first.
    Linger(i64),
}

#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub id: usize,
    pub client: usize,
    pub part: String,
    pub f: &'static str,
    #[serde(rename = "in")]
    pub input: Input,
    pub out: Output,
    pub call: i64,
    pub ret: i64,
    #[serde(skip)]
    pub bound: Bound,
}

/// A fault as it happened, for the run's report.
#[derive(Clone, Debug, Serialize)]
pub struct FaultEvent {
    pub at_ms: i64,
    pub fault: String,
    pub detail: String,
}

pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<Record>>,
    barriers: Mutex<Vec<i64>>,
    faults: Mutex<Vec<FaultEvent>>,
    next_id: AtomicUsize,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
            barriers: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
        }
    }

    /// Nanoseconds since the run started (monotonic).
    pub fn now(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        client: usize,
        part: &str,
        f: &'static str,
        input: Input,
        out: Output,
        call: i64,
        ret: i64,
        bound: Bound,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rec = Record {
            id,
            client,
            part: part.to_owned(),
            f,
            input,
            out,
            call,
            ret,
            bound,
        };
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    }

    /// No request invoked before now can take effect after now.
    pub fn barrier(&self) -> i64 {
        let t = self.now();
        self.barriers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
        t
    }

    pub fn fault(&self, fault: &str, detail: impl Into<String>) {
        let at_ms = self.now() / 1_000_000;
        let detail = detail.into();
        eprintln!("chaos: {:>7.3}s {fault} {detail}", at_ms as f64 / 1000.0);
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(FaultEvent {
                at_ms,
                fault: fault.to_owned(),
                detail,
            });
    }

    pub fn faults(&self) -> Vec<FaultEvent> {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The history with every unknown outcome bounded, in invocation order.
    pub fn finish(&self) -> Vec<Record> {
        let end = self.barrier();
        let mut barriers = self
            .barriers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        barriers.sort_unstable();
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for op in &mut ops {
            if op.out.status != "unknown" {
                continue;
            }
            let next = barriers
                .iter()
                .copied()
                .find(|b| *b > op.call)
                .unwrap_or(end);
            op.ret = match op.bound {
                Bound::Returned => op.ret,
                Bound::NextBarrier => op.ret.max(next),
                Bound::Linger(ns) => op.ret.max(next.min(op.ret.saturating_add(ns))),
            };
        }
        ops.sort_by_key(|op| (op.call, op.id));
        ops
    }
}

pub fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for item in items {
        serde_json::to_writer(&mut out, item)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
