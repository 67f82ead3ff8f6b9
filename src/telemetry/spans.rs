//! Span names of the contract topology (spec 000 "Required span topology") and the
//! only constructors that create them, so every span carries the same declared fields
//! and nothing else.
//!
//! Data plane (one `harness.request` per HTTP request; the caller's `harness.run`, when
//! it sends `traceparent`, is its parent):
//! ```text
//! harness.request
//! ├── authn
//! ├── authz.agent
//! ├── session.binding            (bind)
//! ├── thread_state.load          (head, bodies, objects, streams, interrupts: reads)
//! ├── thread_state.write         (pending state, objects, streams, uncertain, resume)
//! ├── thread_state.commit
//! └── memory.read / memory.write (memory routes)
//! ```
//! Reconciles (the operator): one anchor per unit of work, retries as siblings under it:
//! ```text
//! harness.reconcile              (ReconcileAnchors: kept across requeues)
//! ├── sandbox.claim_or_reuse     (attempt 1)
//! │   └── sandbox.worker.bind
//! └── sandbox.claim_or_reuse     (attempt 2, a sibling, same trace)
//!     └── sandbox.worker.bind
//! ```
//! Values go in with [`record`] under the keys of [`keys`]; the export path drops any
//! key or value the allowlist (`super::allowlist`) does not name.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use tracing::{Span, field::Empty};

pub const HARNESS_REQUEST: &str = "harness.request";
pub const AUTHN: &str = "authn";
pub const AUTHZ_AGENT: &str = "authz.agent";
pub const SESSION_BINDING: &str = "session.binding";
pub const SANDBOX_CLAIM_OR_REUSE: &str = "sandbox.claim_or_reuse";
pub const SANDBOX_WORKER_BIND: &str = "sandbox.worker.bind";
pub const HARNESS_RUN: &str = "harness.run";
pub const THREAD_STATE_LOAD: &str = "thread_state.load";
pub const THREAD_STATE_WRITE: &str = "thread_state.write";
pub const THREAD_STATE_COMMIT: &str = "thread_state.commit";
pub const MEMORY_READ: &str = "memory.read";
pub const MEMORY_WRITE: &str = "memory.write";
pub const HARNESS_RECONCILE: &str = "harness.reconcile";
// Worker-side steps of the contract topology: emitted by the harness in the sandbox
// (under its `harness.run`), not by this process; named here so the whole topology is in
// one place.
pub const PROVIDER_INVOKE: &str = "provider.invoke";
pub const TOOL_INVOKE: &str = "tool.invoke";
pub const SUBAGENT_RUN: &str = "subagent.run";
pub const STREAM_VALIDATE_AND_ENCODE: &str = "stream.validate_and_encode";

/// Every span name this process may export.
pub const ALL: &[&str] = &[
    HARNESS_REQUEST,
    AUTHN,
    AUTHZ_AGENT,
    SESSION_BINDING,
    SANDBOX_CLAIM_OR_REUSE,
    SANDBOX_WORKER_BIND,
    HARNESS_RUN,
    THREAD_STATE_LOAD,
    THREAD_STATE_WRITE,
    THREAD_STATE_COMMIT,
    MEMORY_READ,
    MEMORY_WRITE,
    HARNESS_RECONCILE,
    PROVIDER_INVOKE,
    TOOL_INVOKE,
    SUBAGENT_RUN,
    STREAM_VALIDATE_AND_ENCODE,
];

/// The `tracing` target of every span here; the OpenTelemetry layer exports only this
/// target, so spans of libraries (hyper, h2, the Mongo driver) never leave the process.
pub const TARGET: &str = "harness_engine::telemetry";

/// Attribute keys (each is in the allowlist table).
pub mod keys {
    pub const OUTCOME: &str = "harness.outcome";
    pub const ERROR_TYPE: &str = "error.type";
    pub const OPERATION: &str = "harness.operation";
    pub const CALLER_KIND: &str = "harness.caller.kind";
    pub const BINDING_ID: &str = "harness.binding.id";
    pub const KIND: &str = "harness.kind";
    pub const HARNESS: &str = "harness.harness";
    pub const EPOCH: &str = "harness.epoch";
    pub const LEASE_GENERATION: &str = "harness.lease.generation";
    pub const REVISION: &str = "harness.revision";
    pub const RETRY_COUNT: &str = "harness.retry.count";
    pub const ATTEMPT: &str = "harness.attempt";
    pub const SIZE_BYTES: &str = "harness.size_bytes";
    pub const COUNT: &str = "harness.count";
    pub const DURATION_MS: &str = "harness.duration_ms";
    pub const CREATED: &str = "harness.created";
    pub const HTTP_METHOD: &str = "http.request.method";
    pub const HTTP_ROUTE: &str = "http.route";
    pub const HTTP_STATUS: &str = "http.response.status_code";
    pub const TRACE_INGRESS: &str = "harness.trace_ingress";

    /// Every key above.
    pub const ALL: &[&str] = &[
        OUTCOME,
        ERROR_TYPE,
        OPERATION,
        CALLER_KIND,
        BINDING_ID,
        KIND,
        HARNESS,
        EPOCH,
        LEASE_GENERATION,
        REVISION,
        RETRY_COUNT,
        ATTEMPT,
        SIZE_BYTES,
        COUNT,
        DURATION_MS,
        CREATED,
        HTTP_METHOD,
        HTTP_ROUTE,
        HTTP_STATUS,
        TRACE_INGRESS,
    ];
}

/// One step of the topology below `harness.request` or an anchor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Authn,
    AuthzAgent,
    SessionBinding,
    ThreadStateLoad,
    ThreadStateWrite,
    ThreadStateCommit,
    MemoryRead,
    MemoryWrite,
    SandboxClaimOrReuse,
    SandboxWorkerBind,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Authn => AUTHN,
            Step::AuthzAgent => AUTHZ_AGENT,
            Step::SessionBinding => SESSION_BINDING,
            Step::ThreadStateLoad => THREAD_STATE_LOAD,
            Step::ThreadStateWrite => THREAD_STATE_WRITE,
            Step::ThreadStateCommit => THREAD_STATE_COMMIT,
            Step::MemoryRead => MEMORY_READ,
            Step::MemoryWrite => MEMORY_WRITE,
            Step::SandboxClaimOrReuse => SANDBOX_CLAIM_OR_REUSE,
            Step::SandboxWorkerBind => SANDBOX_WORKER_BIND,
        }
    }
}

// `tracing` needs a span's name and fields at compile time, one callsite per name: the
// macro declares the same field set at each.
macro_rules! step_span {
    (parent: $parent:expr, $name:expr) => {
        tracing::info_span!(target: TARGET, parent: $parent, $name,
            harness.outcome = Empty, error.type = Empty, harness.operation = Empty,
            harness.caller.kind = Empty, harness.binding.id = Empty, harness.kind = Empty,
            harness.harness = Empty, harness.epoch = Empty, harness.lease.generation = Empty,
            harness.revision = Empty, harness.retry.count = Empty, harness.attempt = Empty,
            harness.size_bytes = Empty, harness.count = Empty, harness.duration_ms = Empty,
            harness.created = Empty, otel.status_code = Empty)
    };
}

fn step_with_parent(step: Step, parent: Option<&Span>) -> Span {
    // `parent: None` would make a root; the current span is the default parent.
    let current = Span::current();
    let parent = parent.unwrap_or(&current);
    match step {
        Step::Authn => step_span!(parent: parent, AUTHN),
        Step::AuthzAgent => step_span!(parent: parent, AUTHZ_AGENT),
        Step::SessionBinding => step_span!(parent: parent, SESSION_BINDING),
        Step::ThreadStateLoad => step_span!(parent: parent, THREAD_STATE_LOAD),
        Step::ThreadStateWrite => step_span!(parent: parent, THREAD_STATE_WRITE),
        Step::ThreadStateCommit => step_span!(parent: parent, THREAD_STATE_COMMIT),
        Step::MemoryRead => step_span!(parent: parent, MEMORY_READ),
        Step::MemoryWrite => step_span!(parent: parent, MEMORY_WRITE),
        Step::SandboxClaimOrReuse => step_span!(parent: parent, SANDBOX_CLAIM_OR_REUSE),
        Step::SandboxWorkerBind => step_span!(parent: parent, SANDBOX_WORKER_BIND),
    }
}

/// A step under the current span (the request span inside a handler).
pub fn step(step: Step) -> Span {
    step_with_parent(step, None)
}

/// A step under `parent` (a reconcile anchor, or a `sandbox.claim_or_reuse` attempt).
pub fn step_in(parent: &Span, step: Step) -> Span {
    step_with_parent(step, Some(parent))
}

/// A step with its operation recorded.
pub fn operation(kind: Step, operation: &'static str) -> Span {
    let span = step(kind);
    span.record(keys::OPERATION, operation);
    span
}

/// The server span of one data-plane request. `route` is the matched route template.
pub fn request(method: &str, route: &str) -> Span {
    let method = match method {
        "GET" | "POST" | "PUT" | "DELETE" | "PATCH" | "HEAD" | "OPTIONS" => method,
        _ => "other",
    };
    // A root by construction; its parent comes from the ingress policy (`set_parent`).
    tracing::info_span!(target: TARGET, parent: None, HARNESS_REQUEST,
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
        harness.outcome = Empty,
        error.type = Empty,
        harness.trace_ingress = Empty,
        otel.status_code = Empty)
}

/// A new root for one reconcile pass that has no anchor (a profile or policy
/// reconcile). `kind` is one of `harness_binding`, `sandbox_profile`, `memory_policy`.
pub fn reconcile_root(kind: &'static str) -> Span {
    tracing::info_span!(target: TARGET, parent: None, HARNESS_RECONCILE,
        harness.kind = kind,
        harness.binding.id = Empty,
        harness.lease.generation = Empty,
        harness.epoch = Empty,
        harness.attempt = Empty,
        harness.outcome = Empty,
        error.type = Empty,
        otel.status_code = Empty)
}

/// Records a value under an allowlisted key (see [`keys`]). A key the span did not
/// declare is ignored by `tracing`; a value the allowlist rejects is dropped at export.
pub fn record<V: tracing::Value>(span: &Span, key: &'static str, value: V) {
    span.record(key, value);
}

/// Records a count, size, duration or generation. `tracing-opentelemetry` exports
/// `u64` fields as text, which the allowlist's numeric rule rejects: numbers go in as
/// `i64` (saturating).
pub fn record_count(span: &Span, key: &'static str, value: u64) {
    span.record(key, i64::try_from(value).unwrap_or(i64::MAX));
}

/// Marks a span successful.
pub fn record_ok(span: &Span) {
    span.record(keys::OUTCOME, "ok");
}

/// Marks a span failed with a stable error category (an API error code).
pub fn record_error(span: &Span, category: &'static str) {
    span.record(keys::OUTCOME, "error");
    span.record(keys::ERROR_TYPE, category);
    span.record("otel.status_code", "error");
}

struct Anchor {
    span: Span,
    attempts: u64,
    last_used: Instant,
}

/// Anchors of reconcile work that may take several passes (a lease transition retried
/// after a conflict, a claim that is not ready yet). Every attempt is a sibling span
/// under the one anchor, in the anchor's trace, instead of a new trace per requeue.
///
/// Usage in a reconciler:
/// ```ignore
/// let (anchor, attempt) = anchors.attempt(&format!("{binding_id}/{generation}"), "harness_binding");
/// let claim = spans::step_in(&anchor, Step::SandboxClaimOrReuse);
/// spans::record_count(&claim, keys::ATTEMPT, attempt);
/// async { /* claim; then under it: */ let bind = spans::step_in(&claim, Step::SandboxWorkerBind); }
///     .instrument(claim.clone()).await;
/// anchors.finish(&key, "ok"); // when the transition is done (ready), ends the anchor
/// ```
/// The map is bounded: past `max` entries (or `idle` without an attempt) the oldest
/// anchors are ended, as `requeued`.
pub struct ReconcileAnchors {
    anchors: Mutex<Anchors>,
    max: usize,
    idle: Duration,
}

#[derive(Default)]
struct Anchors {
    open: HashMap<String, Anchor>,
    /// When idle anchors were last looked for (a sweep walks every anchor, so it runs
    /// at most once a second, not on every attempt).
    swept: Option<Instant>,
}

/// How often [`ReconcileAnchors::attempt`] looks for idle anchors.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl ReconcileAnchors {
    pub fn new(max: usize, idle: Duration) -> Self {
        ReconcileAnchors {
            anchors: Mutex::new(Anchors::default()),
            max: max.max(1),
            idle,
        }
    }

    /// The anchor for `key` (created as a new root on first use) and this attempt's
    /// number, starting at 1.
    pub fn attempt(&self, key: &str, kind: &'static str) -> (Span, u64) {
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if anchors
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
        {
            anchors.swept = Some(now);
            let idle = self.idle;
            anchors.open.retain(|_, a| {
                let keep = now.saturating_duration_since(a.last_used) < idle;
                if !keep {
                    a.span.record(keys::OUTCOME, "requeued");
                }
                keep
            });
        }
        if !anchors.open.contains_key(key) && anchors.open.len() >= self.max {
            // Full: end the least recently used eighth at once, so a burst of new keys
            // costs one pass over the map per `max / 8` of them, not one each.
            let mut by_age: Vec<(Instant, String)> = anchors
                .open
                .iter()
                .map(|(k, a)| (a.last_used, k.clone()))
                .collect();
            let evict = (self.max / 8).max(1).min(by_age.len());
            by_age.select_nth_unstable_by_key(evict - 1, |(t, _)| *t);
            for (_, oldest) in by_age.into_iter().take(evict) {
                if let Some(a) = anchors.open.remove(&oldest) {
                    a.span.record(keys::OUTCOME, "requeued");
                }
            }
        }
        let anchor = anchors
            .open
            .entry(key.to_owned())
            .or_insert_with(|| Anchor {
                span: reconcile_root(kind),
                attempts: 0,
                last_used: now,
            });
        anchor.attempts += 1;
        anchor.last_used = now;
        record_count(&anchor.span, keys::ATTEMPT, anchor.attempts);
        (anchor.span.clone(), anchor.attempts)
    }

    /// Ends the anchor of `key` with `outcome` (its span is exported once every attempt
    /// under it has ended too).
    pub fn finish(&self, key: &str, outcome: &'static str) {
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = anchors.open.remove(key) {
            a.span.record(keys::OUTCOME, outcome);
        }
    }

    /// Anchors currently open.
    pub fn len(&self) -> usize {
        self.anchors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::allowlist;
    use super::*;

    #[test]
    fn every_key_and_name_is_allowlisted() {
        for key in keys::ALL {
            assert!(
                allowlist::lookup(key).is_some(),
                "{key} not in the allowlist"
            );
        }
        for name in ALL {
            assert!(allowlist::SPAN_NAMES.contains(name));
        }
    }

    /// Collects finished spans in memory: the SDK pipeline and the tracing layer are the
    /// real ones, only the wire is left out (tests/telemetry.rs covers OTLP).
    #[derive(Clone, Debug, Default)]
    struct Collect(std::sync::Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

    impl opentelemetry_sdk::trace::SpanExporter for Collect {
        async fn export(
            &self,
            batch: Vec<opentelemetry_sdk::trace::SpanData>,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(batch);
            Ok(())
        }
    }

    #[test]
    fn reconcile_retries_are_siblings_under_one_anchor() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;

        let collect = Collect::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(collect.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let anchors = ReconcileAnchors::new(8, Duration::from_secs(60));
            let key = "hb_0123456789abcdef0123456789abcdef/2";
            for _ in 0..2 {
                let (anchor, attempt) = anchors.attempt(key, "harness_binding");
                let claim = step_in(&anchor, Step::SandboxClaimOrReuse);
                record_count(&claim, keys::ATTEMPT, attempt);
                let bind = step_in(&claim, Step::SandboxWorkerBind);
                record_ok(&bind);
                drop(bind);
                record_error(&claim, "conflict");
            }
            anchors.finish(key, "ok");
        });
        let spans = collect.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                SANDBOX_WORKER_BIND,
                SANDBOX_CLAIM_OR_REUSE,
                SANDBOX_WORKER_BIND,
                SANDBOX_CLAIM_OR_REUSE,
                HARNESS_RECONCILE
            ]
        );
        let anchor = &spans[4];
        assert_eq!(anchor.parent_span_id, opentelemetry::trace::SpanId::INVALID);
        for s in &spans {
            assert_eq!(
                s.span_context.trace_id(),
                anchor.span_context.trace_id(),
                "one trace"
            );
        }
        assert_eq!(spans[1].parent_span_id, anchor.span_context.span_id());
        assert_eq!(spans[3].parent_span_id, anchor.span_context.span_id());
        assert_ne!(
            spans[1].span_context.span_id(),
            spans[3].span_context.span_id()
        );
        assert_eq!(spans[0].parent_span_id, spans[1].span_context.span_id());
        assert_eq!(spans[2].parent_span_id, spans[3].span_context.span_id());
        let attempt = |s: &opentelemetry_sdk::trace::SpanData| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == keys::ATTEMPT)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(attempt(&spans[1]), Some(opentelemetry::Value::I64(1)));
        assert_eq!(attempt(&spans[3]), Some(opentelemetry::Value::I64(2)));
        let _ = provider.shutdown();
    }

    #[test]
    fn anchors_are_bounded() {
        let anchors = ReconcileAnchors::new(2, Duration::from_secs(60));
        assert_eq!(anchors.attempt("a", "harness_binding").1, 1);
        assert_eq!(anchors.attempt("a", "harness_binding").1, 2);
        anchors.attempt("b", "harness_binding");
        anchors.attempt("c", "harness_binding");
        assert_eq!(anchors.len(), 2);
        // The least recently used went: b keeps counting.
        assert_eq!(anchors.attempt("b", "harness_binding").1, 2);
        anchors.finish("c", "ok");
        assert_eq!(anchors.len(), 1);
    }

    #[test]
    fn a_full_map_ends_its_oldest_eighth_at_once() {
        let anchors = ReconcileAnchors::new(16, Duration::from_secs(60));
        for i in 0..16 {
            anchors.attempt(&format!("k{i}"), "harness_binding");
            std::thread::sleep(Duration::from_millis(1));
        }
        anchors.attempt("new", "harness_binding");
        assert_eq!(anchors.len(), 15);
        // k0 and k1 (the oldest) start over; k2 is still the same anchor.
        assert_eq!(anchors.attempt("k2", "harness_binding").1, 2);
        assert_eq!(anchors.attempt("k0", "harness_binding").1, 1);
    }
}
