//! The export path: a bounded queue in front of the SDK's batch processor, and an
//! exporter wrapper that scrubs every span through the allowlist, runs the OTLP export
//! on a runtime of its own with a deadline, and reports health.
//!
//! Failure behaviour (spec 000 "Export and failure behavior"): a full queue drops the
//! span and counts it (`queue_full`); a failed or timed-out export drops the batch and
//! counts it (`export_failed`) and marks the exporter degraded until an export succeeds.
//! Neither ever blocks, delays or fails a request.

use std::{
    fmt,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicI64, AtomicU8, Ordering},
    },
    time::Duration,
};

use opentelemetry::Context;
use opentelemetry_sdk::{
    Resource,
    error::{OTelSdkError, OTelSdkResult},
    trace::{Span, SpanData, SpanExporter, SpanProcessor},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::allowlist;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IngressLabels {
    result: String,
}

/// What the telemetry pipeline is doing, for `/ready` and `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// No endpoint configured: nothing is exported.
    Disabled,
    /// Exporting (or nothing exported yet).
    Ok,
    /// The last export failed: spans are being dropped until the collector answers.
    Degraded,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Disabled => "disabled",
            Health::Ok => "ok",
            Health::Degraded => "degraded",
        }
    }
}

const DISABLED: u8 = 0;
const OK: u8 = 1;
const DEGRADED: u8 = 2;

/// Process-wide telemetry counters (one tracer provider per process).
pub struct TelemetryStats {
    health: AtomicU8,
    queued: AtomicI64,
    queue_gauge: Gauge,
    healthy_gauge: Gauge,
    enabled_gauge: Gauge,
    exported: Counter,
    export_failures: Counter,
    dropped: Family<ReasonLabels, Counter>,
    ingress: Family<IngressLabels, Counter>,
    baggage_dropped: Counter,
}

static STATS: LazyLock<TelemetryStats> = LazyLock::new(|| {
    let stats = TelemetryStats {
        health: AtomicU8::new(DISABLED),
        queued: AtomicI64::new(0),
        queue_gauge: Gauge::default(),
        healthy_gauge: Gauge::default(),
        enabled_gauge: Gauge::default(),
        exported: Counter::default(),
        export_failures: Counter::default(),
        dropped: Family::default(),
        ingress: Family::default(),
        baggage_dropped: Counter::default(),
    };
    stats.set_health(Health::Disabled);
    stats
});

/// The process's telemetry counters.
pub fn stats() -> &'static TelemetryStats {
    &STATS
}

impl TelemetryStats {
    /// Adds the telemetry metrics to a registry (the admin port's `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "telemetry_enabled",
            "1 when an OTLP endpoint is configured and spans are exported",
            self.enabled_gauge.clone(),
        );
        registry.register(
            "telemetry_exporter_healthy",
            "0 while the collector is unreachable or refusing exports (spans are dropped), else 1",
            self.healthy_gauge.clone(),
        );
        registry.register(
            "telemetry_queue_spans",
            "Finished spans waiting for export (bounded by OTEL_BSP_MAX_QUEUE_SIZE)",
            self.queue_gauge.clone(),
        );
        registry.register(
            "telemetry_spans_exported",
            "Spans the collector accepted",
            self.exported.clone(),
        );
        registry.register(
            "telemetry_export_failures",
            "Export calls that failed or timed out",
            self.export_failures.clone(),
        );
        registry.register(
            "telemetry_spans_dropped",
            "Spans dropped: queue_full (queue at its bound) or export_failed (collector outage)",
            self.dropped.clone(),
        );
        registry.register(
            "trace_context_ingress",
            "Incoming trace context by what the ingress policy did: continued, restarted, replaced (malformed), absent",
            self.ingress.clone(),
        );
        registry.register(
            "trace_baggage_dropped",
            "Incoming baggage members dropped (not declared in the baggage schema)",
            self.baggage_dropped.clone(),
        );
    }

    pub fn health(&self) -> Health {
        match self.health.load(Ordering::Relaxed) {
            OK => Health::Ok,
            DEGRADED => Health::Degraded,
            _ => Health::Disabled,
        }
    }

    fn set_health(&self, health: Health) {
        let (code, healthy) = match health {
            Health::Disabled => (DISABLED, 1),
            Health::Ok => (OK, 1),
            Health::Degraded => (DEGRADED, 0),
        };
        self.health.store(code, Ordering::Relaxed);
        self.healthy_gauge.set(healthy);
        self.enabled_gauge
            .set(i64::from(health != Health::Disabled));
    }

    pub(crate) fn enable(&self) {
        self.set_health(Health::Ok);
    }

    /// Spans waiting for export right now.
    pub fn queued(&self) -> i64 {
        self.queued.load(Ordering::Relaxed)
    }

    fn add_queued(&self, n: i64) {
        let now = self.queued.fetch_add(n, Ordering::Relaxed) + n;
        self.queue_gauge.set(now);
    }

    fn drop_spans(&self, reason: &str, n: u64) {
        self.dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc_by(n);
    }

    /// Spans dropped so far for `reason`.
    pub fn dropped(&self, reason: &str) -> u64 {
        self.dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .get()
    }

    pub(crate) fn count_ingress(&self, result: &'static str) {
        self.ingress
            .get_or_create(&IngressLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub(crate) fn count_baggage_dropped(&self, n: u64) {
        if n > 0 {
            self.baggage_dropped.inc_by(n);
        }
    }
}

/// Bounds the spans waiting for export: past `capacity` a finished span is dropped and
/// counted instead of queued. The bound equals the batch processor's own queue size, so
/// the processor never drops silently.
#[derive(Debug)]
pub struct BoundedProcessor<P> {
    inner: P,
    capacity: i64,
}

impl<P> BoundedProcessor<P> {
    pub fn new(inner: P, capacity: usize) -> Self {
        BoundedProcessor {
            inner,
            capacity: i64::try_from(capacity).unwrap_or(i64::MAX),
        }
    }
}

impl<P: SpanProcessor> SpanProcessor for BoundedProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let stats = stats();
        if stats.queued() >= self.capacity {
            stats.drop_spans("queue_full", 1);
            return;
        }
        stats.add_queued(1);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Scrubs, then exports on `runtime` within `timeout`.
pub struct ScrubbingExporter<E> {
    inner: Arc<E>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl<E> fmt::Debug for ScrubbingExporter<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScrubbingExporter")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<E: SpanExporter + 'static> ScrubbingExporter<E> {
    pub fn new(inner: E, runtime: tokio::runtime::Handle, timeout: Duration) -> Self {
        ScrubbingExporter {
            inner: Arc::new(inner),
            runtime,
            timeout,
        }
    }
}

impl<E: SpanExporter + 'static> SpanExporter for ScrubbingExporter<E> {
    async fn export(&self, mut batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let stats = stats();
        stats.add_queued(-i64::try_from(n).unwrap_or(0));
        for span in &mut batch {
            allowlist::scrub_span(span);
        }
        let inner = Arc::clone(&self.inner);
        let timeout = self.timeout;
        // The SDK drives this future from its own thread, outside any Tokio runtime; the
        // OTLP transports need one, so the export runs on ours.
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, inner.export(batch)).await });
        let result = match task.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(OTelSdkError::Timeout(timeout)),
            Err(e) => Err(OTelSdkError::InternalFailure(format!(
                "export task failed: {e}"
            ))),
        };
        match &result {
            Ok(()) => {
                stats.exported.inc_by(n as u64);
                stats.set_health(Health::Ok);
            }
            Err(_) => {
                stats.export_failures.inc();
                stats.drop_spans("export_failed", n as u64);
                stats.set_health(Health::Degraded);
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Resource attributes pass the same allowlist as span attributes.
        let kept: Vec<_> = resource
            .iter()
            .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone()))
            .filter(allowlist::attribute_allowed)
            .collect();
        let scrubbed = Resource::builder_empty().with_attributes(kept).build();
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(&scrubbed);
        }
    }
}
