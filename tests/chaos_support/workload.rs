//! The clients: workers (load head, commit on an expected revision, object put and get
//! under the fence they believe in), one operator per binding (raise fence, clear), and
//! memory clients (compare-and-set on a record's revision, get). Each client's choices
//! come from its own generator seeded from the run's seed, so a seed fixes the schedule
//! of operations; the values (expected revisions, fences) follow what the client saw.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use harness_engine::domain::ids::BindingId;
use rand::{Rng, SeedableRng, rngs::StdRng};
use reqwest::{RequestBuilder, header::HeaderMap};
use serde_json::{Value, json};
use tokio::sync::RwLock;

use super::{
    history::{Bound, Input, Output, Recorder},
    system::Control,
};

/// How long after a 5xx answer a request's effect may still land: the server's request
/// deadline dropped the handler, but a write it had queued (SQLite's writer thread) or
/// sent (a command FerretDB holds while paused) can still complete. Longer than the
/// longest pause the injector makes plus SQLite's busy timeout.
pub const LINGER_NS: i64 = 8_000_000_000;

/// What one HTTP request came to.
pub enum Reply {
    Ok {
        headers: HeaderMap,
        body: Vec<u8>,
    },
    /// A definite refusal: a 4xx answer with the documented error shape.
    Refused {
        code: String,
        details: Value,
    },
    /// The connection was refused: the request never reached a server.
    Unreachable,
    /// A 5xx answer: the server may have done it; `LINGER_NS` bounds when.
    ServerError(String),
    /// No answer (reset, timeout): only the next barrier bounds it.
    Lost(String),
}

/// The HTTP side of every client. Each request holds a read guard of `gate` for its
/// whole life: the fault injector takes the write side after killing the server, so it
/// knows every request invoked before the death has finished before it starts the next
/// process (see `history`).
pub struct Api {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
    pub gate: Arc<RwLock<()>>,
    pub rec: Arc<Recorder>,
}

impl Api {
    pub fn client(timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(timeout)
            // A fresh connection per request: a refused connection then proves the request
            // never reached a server, and no request rides a connection to a dead process.
            .pool_max_idle_per_host(0)
            .build()
            .expect("http client")
    }

    /// Sends, timing the call: returns the reply and the invocation and response times.
    pub async fn send(&self, request: RequestBuilder) -> (Reply, i64, i64) {
        let _guard = self.gate.read().await;
        self.send_held(request).await
    }

    /// [`Api::send`] for a caller that already holds a read guard of `gate` (several
    /// requests that make up one recorded operation).
    pub async fn send_held(&self, request: RequestBuilder) -> (Reply, i64, i64) {
        let call = self.rec.now();
        let reply = classify(request.bearer_auth(&self.token).send().await).await;
        let ret = self.rec.now();
        (reply, call, ret)
    }
}

async fn classify(sent: reqwest::Result<reqwest::Response>) -> Reply {
    let response = match sent {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Reply::Unreachable,
        Err(e) => return Reply::Lost(format!("{e:?}")),
    };
    let status = response.status();
    let headers = response.headers().clone();
    let body = match response.bytes().await {
        Ok(b) => b.to_vec(),
        Err(e) => return Reply::Lost(format!("reading the body: {e}")),
    };
    let error = || {
        serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
            Some((
                v.get("code")?.as_str()?.to_owned(),
                v.get("details").cloned().unwrap_or(Value::Null),
            ))
        })
    };
    if status.is_success() {
        Reply::Ok { headers, body }
    } else if status.is_server_error() {
        let code = error().map_or_else(|| status.to_string(), |(c, _)| c);
        Reply::ServerError(format!("{} {code}", status.as_u16()))
    } else {
        let (code, details) =
            error().unwrap_or_else(|| (format!("http_{}", status.as_u16()), Value::Null));
        Reply::Refused { code, details }
    }
}

/// The output and bound of a reply that is not a success.
fn failed(reply: &Reply) -> (Output, Bound) {
    match reply {
        Reply::Ok { .. } => unreachable!("a success is not a failure"),
        Reply::Refused { code, .. } => (Output::fail(code.clone()), Bound::Returned),
        Reply::Unreachable => (Output::fail("unreachable"), Bound::Returned),
        Reply::ServerError(e) => (Output::unknown(e.clone()), Bound::Linger(LINGER_NS)),
        Reply::Lost(e) => (Output::unknown(e.clone()), Bound::NextBarrier),
    }
}

fn details_u64(reply: &Reply, field: &str) -> Option<u64> {
    match reply {
        Reply::Refused { details, .. } => details.get(field)?.as_u64(),
        _ => None,
    }
}

fn code(reply: &Reply) -> Option<&str> {
    match reply {
        Reply::Refused { code, .. } => Some(code),
        _ => None,
    }
}

/// The fence a binding's clients believe in: what the operator last had acknowledged,
/// or learned from a refusal's `details.current`.
#[derive(Clone, Copy, Debug)]
pub struct Fence {
    pub epoch: u64,
    pub generation: u64,
}

pub struct BindingState {
    pub id: BindingId,
    pub part: String,
    pub fence: Mutex<Fence>,
    /// The next generation a raise uses: every attempt a fresh one, so an attempt whose
    /// outcome is unknown never shares its value with a later one.
    pub next_generation: Mutex<u64>,
}

/// A memory record the memory clients work on.
#[derive(Clone, Debug)]
pub struct MemoryKey {
    pub part: String,
    pub key: String,
}

/// The workload moves to fresh bindings and memory records every era (5 minutes by
/// default), so each partition of the history holds at most one era: porcupine's memo
/// grows with the square of a partition's length, and a long run stays checkable.
pub struct Eras {
    pub start: std::time::Instant,
    pub length: Duration,
    /// `[era][binding]`
    pub bindings: Vec<Vec<Arc<BindingState>>>,
    /// `[era][record]`
    pub memory: Vec<Vec<MemoryKey>>,
}

impl Eras {
    pub fn current(&self) -> usize {
        let n = self.start.elapsed().as_nanos() / self.length.as_nanos().max(1);
        usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(self.bindings.len().saturating_sub(1))
    }
    pub fn all_bindings(&self) -> impl Iterator<Item = &Arc<BindingState>> {
        self.bindings.iter().flatten()
    }
    pub fn all_memory(&self) -> impl Iterator<Item = &MemoryKey> {
        self.memory.iter().flatten()
    }
}

impl BindingState {
    pub fn fence(&self) -> Fence {
        *self.fence.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn learn_epoch(&self, epoch: u64) {
        let mut f = self.fence.lock().unwrap_or_else(|e| e.into_inner());
        if epoch > f.epoch {
            f.epoch = epoch;
        }
    }
    fn learn_generation(&self, epoch: u64, generation: u64) {
        let mut f = self.fence.lock().unwrap_or_else(|e| e.into_inner());
        if epoch == f.epoch && generation > f.generation {
            f.generation = generation;
        }
    }
    fn learn_refusal(&self, fence: Fence, reply: &Reply) {
        match code(reply) {
            Some("stale_epoch") => {
                if let Some(current) = details_u64(reply, "current") {
                    self.learn_epoch(current);
                }
            }
            Some("stale_lease") => {
                if let Some(current) = details_u64(reply, "current") {
                    self.learn_generation(fence.epoch, current);
                }
            }
            _ => {}
        }
    }
}

pub fn rng_for(seed: u64, client: usize) -> StdRng {
    StdRng::seed_from_u64(seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn fence_headers(request: RequestBuilder, fence: Fence) -> RequestBuilder {
    request
        .header("Harness-Epoch", fence.epoch.to_string())
        .header("Harness-Lease-Generation", fence.generation.to_string())
}

/// Runs worker `client` on binding `b` of the current era until `stop`.
pub async fn worker(
    api: Arc<Api>,
    eras: Arc<Eras>,
    b: usize,
    client: usize,
    seed: u64,
    object_keys: usize,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut rng = rng_for(seed, client);
    // What this worker last saw: the head revision and each object's version, per epoch.
    let mut seen = (String::new(), 0);
    let mut revision = 0u64;
    let mut versions = vec![0u64; object_keys];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // Every draw is made on every turn, so the seed alone fixes each client's
        // sequence of operations, keys, modes and pauses (the values sent follow what the
        // client saw).
        let pause = rng.random_range(0..=40u64);
        let stale = rng.random_range(0..100u32);
        let roll = rng.random_range(0..100u32);
        let k = rng.random_range(0..object_keys);
        let mode_roll = rng.random_range(0..10u32);
        let two_step = rng.random_range(0..10u32) < 3;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        n += 1;
        let binding = eras.bindings[eras.current()][b].clone();
        let base = format!("{}/v1/bindings/{}", api.base, binding.id.as_str());
        let mut fence = binding.fence();
        if (binding.part.as_str(), fence.epoch) != (seen.0.as_str(), seen.1) {
            seen = (binding.part.clone(), fence.epoch);
            revision = 0;
            versions.iter_mut().for_each(|v| *v = 0);
        }
        // One turn in twenty presents an older fence on purpose: it must be refused.
        if stale < 5 {
            if fence.generation > 1 && stale < 4 {
                fence.generation -= 1;
            } else if fence.epoch > 0 {
                fence.epoch -= 1;
            }
        }
        let mut input = Input {
            epoch: fence.epoch,
            r#gen: fence.generation,
            ..Input::default()
        };
        let (f, reply, call, ret) = if roll < 25 {
            let (reply, call, ret) = api
                .send(fence_headers(
                    api.http.get(format!("{base}/state/head")),
                    fence,
                ))
                .await;
            ("head", reply, call, ret)
        } else if roll < 55 && two_step {
            // Steps 3 and 4 of the protocol as two requests: a pending write, then the
            // commit of that state. Recorded as one commit from the first request's
            // invocation to the second's response; a pending write alone changes nothing
            // the model sees, so when it fails without a definite refusal the commit was
            // never sent and nothing is recorded.
            let run = format!("r{client}-{n}");
            input.expect = revision;
            input.val = run.clone();
            let guard = api.gate.read().await;
            let pending = api
                .http
                .post(format!("{base}/state/pending"))
                .header("Idempotency-Key", format!("pending-{client}-{n}"))
                .header("Content-Type", "application/octet-stream")
                .body(run.clone().into_bytes());
            let (reply, call, ret) = api.send_held(fence_headers(pending, fence)).await;
            let state_id = match &reply {
                Reply::Ok { body, .. } => serde_json::from_slice::<Value>(body)
                    .ok()
                    .and_then(|v| Some(v.get("state_id")?.as_str()?.to_owned())),
                _ => None,
            };
            match (&reply, state_id) {
                (Reply::Ok { .. }, Some(state_id)) => {
                    let commit = api
                        .http
                        .post(format!("{base}/state/commit"))
                        .header("Idempotency-Key", format!("commit-{client}-{n}"))
                        .json(&json!({
                            "state_id": state_id,
                            "expected_revision": revision,
                            "run_id": run,
                        }));
                    let (reply, _, ret) = api.send_held(fence_headers(commit, fence)).await;
                    drop(guard);
                    ("commit", reply, call, ret)
                }
                (Reply::Refused { .. } | Reply::Unreachable, _) => {
                    drop(guard);
                    ("commit", reply, call, ret)
                }
                _ => continue,
            }
        } else if roll < 55 {
            let run = format!("r{client}-{n}");
            input.expect = revision;
            input.val = run.clone();
            let request = api
                .http
                .post(format!(
                    "{base}/state/commit-inline?expected_revision={revision}&run_id={run}"
                ))
                .header("Idempotency-Key", format!("commit-{client}-{n}"))
                .header("Content-Type", "application/octet-stream")
                .body(run.into_bytes());
            let (reply, call, ret) = api.send(fence_headers(request, fence)).await;
            ("commit", reply, call, ret)
        } else if roll < 75 {
            input.key = format!("o{k}");
            input.val = format!("v{client}-{n}");
            let mut request = api
                .http
                .put(format!("{base}/objects/item?key={}", input.key))
                .header("Idempotency-Key", format!("put-{client}-{n}"))
                .header("Content-Type", "application/octet-stream")
                .body(input.val.clone().into_bytes());
            if mode_roll < 3 {
                input.mode = "create".into();
                request = request.header("If-None-Match", "*");
            } else if mode_roll < 7 {
                input.mode = "replace".into();
                input.expect = versions[k];
                request = request.header("If-Match", format!("\"{}\"", versions[k]));
            } else {
                input.mode = "upsert".into();
            }
            let (reply, call, ret) = api.send(fence_headers(request, fence)).await;
            ("oput", reply, call, ret)
        } else {
            input.key = format!("o{k}");
            let request = api
                .http
                .get(format!("{base}/objects/item?key={}", input.key));
            let (reply, call, ret) = api.send(fence_headers(request, fence)).await;
            ("oget", reply, call, ret)
        };
        let (out, bound) = match &reply {
            Reply::Ok { headers, body } => {
                let json = || serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
                match f {
                    "head" => {
                        let head = json();
                        let head = &head["head"];
                        let rev = head["revision"].as_u64().unwrap_or(0);
                        revision = rev;
                        let val = head["run_id"].as_str().unwrap_or_default().to_owned();
                        (
                            Output {
                                rev,
                                val,
                                ..Output::ok()
                            },
                            Bound::Returned,
                        )
                    }
                    "commit" => {
                        let head = json();
                        let rev = head["revision"].as_u64().unwrap_or(0);
                        revision = rev;
                        let val = head["run_id"].as_str().unwrap_or_default().to_owned();
                        (
                            Output {
                                rev,
                                val,
                                ..Output::ok()
                            },
                            Bound::Returned,
                        )
                    }
                    "oput" => {
                        let rev = json()["version"].as_u64().unwrap_or(0);
                        if let Some(k) = index_of(&input.key) {
                            versions[k] = rev;
                        }
                        (
                            Output {
                                rev,
                                ..Output::ok()
                            },
                            Bound::Returned,
                        )
                    }
                    _ => {
                        let rev = headers
                            .get("etag")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim_matches('"').parse::<u64>().ok())
                            .unwrap_or(0);
                        if let Some(k) = index_of(&input.key) {
                            versions[k] = rev;
                        }
                        (
                            Output {
                                rev,
                                val: String::from_utf8_lossy(body).into_owned(),
                                ..Output::ok()
                            },
                            Bound::Returned,
                        )
                    }
                }
            }
            other => {
                binding.learn_refusal(fence, other);
                if code(other) == Some("revision_conflict")
                    && let Some(actual) = details_u64(other, "actual")
                {
                    revision = actual;
                }
                if f == "oget"
                    && code(other) == Some("not_found")
                    && let Some(k) = index_of(&input.key)
                {
                    versions[k] = 0;
                }
                failed(other)
            }
        };
        api.rec
            .record(client, &binding.part, f, input, out, call, ret, bound);
    }
    n
}

fn index_of(key: &str) -> Option<usize> {
    key.strip_prefix('o')?.parse().ok()
}

/// Raises the fence to a fresh generation, or clears into the next epoch; records it.
pub async fn control_step(
    api: &Api,
    control: &Control,
    binding: &BindingState,
    client: usize,
    clear: bool,
) -> Output {
    let fence = binding.fence();
    let (f, input) = if clear {
        (
            "clear",
            Input {
                epoch: fence.epoch + 1,
                ..Input::default()
            },
        )
    } else {
        let mut next = binding
            .next_generation
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *next = (*next).max(fence.generation + 1);
        let generation = *next;
        *next += 1;
        (
            "fence",
            Input {
                epoch: fence.epoch,
                r#gen: generation,
                ..Input::default()
            },
        )
    };
    let guard = api.gate.read().await;
    let call = api.rec.now();
    let (out, current, decided) = control
        .call(&binding.id, clear, input.epoch, input.r#gen)
        .await;
    let ret = api.rec.now();
    drop(guard);
    if out.is_ok() {
        if clear {
            binding.learn_epoch(out.epoch);
        } else {
            binding.learn_generation(out.epoch, out.r#gen);
        }
    }
    if let Some(current) = current {
        binding.learn_epoch(current);
    }
    let bound = if decided || out.status != "unknown" {
        Bound::Returned
    } else {
        Bound::NextBarrier
    };
    api.rec.record(
        client,
        &binding.part,
        f,
        input,
        out.clone(),
        call,
        ret,
        bound,
    );
    out
}

/// The operator of one binding: every so often a fence raise (a replacement), sometimes
/// a clear.
pub async fn operator(
    api: Arc<Api>,
    control: Control,
    eras: Arc<Eras>,
    b: usize,
    client: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut rng = rng_for(seed, client);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let wait = rng.random_range(300..1500);
        let clear = rng.random_bool(0.15);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let binding = eras.bindings[eras.current()][b].clone();
        control_step(&api, &control, &binding, client, clear).await;
        n += 1;
    }
    n
}

/// A memory client: compare-and-set writes and reads of one record.
pub async fn memory_client(
    api: Arc<Api>,
    eras: Arc<Eras>,
    k: usize,
    client: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut rng = rng_for(seed, client);
    let mut revision = 0u64;
    let mut seen = String::new();
    let mut n = 0;
    let url = format!("{}/v1/memory/user/records", api.base);
    while !stop.load(Ordering::Relaxed) {
        let pause = rng.random_range(0..=60u64);
        let put = rng.random_bool(0.5);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        n += 1;
        let era = eras.current();
        let memory = eras.memory[era][k].clone();
        if memory.part != seen {
            seen = memory.part.clone();
            revision = 0;
        }
        memory_op(
            &api,
            &eras.bindings[era][0],
            &url,
            &memory.part,
            &memory.key,
            client,
            n,
            &mut revision,
            put,
        )
        .await;
    }
    n
}

/// One memory put (with the revision last seen) or get; records it.
#[allow(clippy::too_many_arguments)]
pub async fn memory_op(
    api: &Api,
    binding: &BindingState,
    url: &str,
    part: &str,
    key: &str,
    client: usize,
    n: u64,
    revision: &mut u64,
    put: bool,
) -> Output {
    let mut input = Input {
        key: key.to_owned(),
        ..Input::default()
    };
    let request = if put {
        input.expect = *revision;
        input.val = format!("chaos note {part} v{client}-{n}");
        api.http
            .put(url)
            .header("Harness-Binding", binding.id.as_str())
            .header("Idempotency-Key", format!("mem-{client}-{n}"))
            .json(&json!({
                "key": key,
                "kind": "semantic",
                "content": input.val,
                "expected_revision": *revision,
            }))
    } else {
        api.http
            .get(format!("{url}?key={key}"))
            .header("Harness-Binding", binding.id.as_str())
    };
    let (reply, call, ret) = api.send(request).await;
    let f = if put { "mput" } else { "mget" };
    let (out, bound) = match &reply {
        Reply::Ok { body, .. } => {
            let v = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
            let record = if put { &v["record"] } else { &v };
            let rev = record["revision"].as_u64().unwrap_or(0);
            *revision = rev;
            let val = if put {
                String::new()
            } else {
                record["content"].as_str().unwrap_or_default().to_owned()
            };
            (
                Output {
                    rev,
                    val,
                    ..Output::ok()
                },
                Bound::Returned,
            )
        }
        other => {
            if code(other) == Some("revision_conflict")
                && let Some(actual) = details_u64(other, "actual")
            {
                *revision = actual;
            }
            if code(other) == Some("not_found") {
                *revision = 0;
            }
            failed(other)
        }
    };
    api.rec
        .record(client, part, f, input, out.clone(), call, ret, bound);
    out
}

/// The final reads after the run healed: a fresh fence (learning the epoch if an
/// unknown clear moved it), then the head and every object under it.
pub async fn final_reads(
    api: &Api,
    control: &Control,
    binding: &BindingState,
    client: usize,
    object_keys: usize,
) -> Result<(), String> {
    let mut raised = false;
    for _ in 0..5 {
        if control_step(api, control, binding, client, false)
            .await
            .is_ok()
        {
            raised = true;
            break;
        }
    }
    if !raised {
        return Err(format!(
            "could not raise the fence of {} after the run",
            binding.part
        ));
    }
    let fence = binding.fence();
    let base = format!("{}/v1/bindings/{}", api.base, binding.id.as_str());
    let input = Input {
        epoch: fence.epoch,
        r#gen: fence.generation,
        ..Input::default()
    };
    let (reply, call, ret) = api
        .send(fence_headers(
            api.http.get(format!("{base}/state/head")),
            fence,
        ))
        .await;
    let out = match &reply {
        Reply::Ok { body, .. } => {
            let v = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
            Output {
                rev: v["head"]["revision"].as_u64().unwrap_or(0),
                val: v["head"]["run_id"].as_str().unwrap_or_default().to_owned(),
                ..Output::ok()
            }
        }
        other => failed(other).0,
    };
    if !out.is_ok() {
        return Err(format!("final head read of {}: {out:?}", binding.part));
    }
    api.rec.record(
        client,
        &binding.part,
        "head",
        input.clone(),
        out,
        call,
        ret,
        Bound::Returned,
    );
    for k in 0..object_keys {
        let key = format!("o{k}");
        let request = api.http.get(format!("{base}/objects/item?key={key}"));
        let (reply, call, ret) = api.send(fence_headers(request, fence)).await;
        let out = match &reply {
            Reply::Ok { headers, body } => Output {
                rev: headers
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim_matches('"').parse().ok())
                    .unwrap_or(0),
                val: String::from_utf8_lossy(body).into_owned(),
                ..Output::ok()
            },
            other => failed(other).0,
        };
        if out.status == "unknown" || (out.status == "fail" && out.code != "not_found") {
            return Err(format!("final read of {} {key}: {out:?}", binding.part));
        }
        api.rec.record(
            client,
            &binding.part,
            "oget",
            Input {
                key,
                ..input.clone()
            },
            out,
            call,
            ret,
            Bound::Returned,
        );
    }
    Ok(())
}
