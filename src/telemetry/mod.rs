//! Tracing and OpenTelemetry (DESIGN §8, spec 000 "Distributed tracing").
//!
//! - [`spans`]: the span names of the contract topology and the only constructors of
//!   those spans; [`spans::ReconcileAnchors`] for retries as siblings under one anchor.
//! - [`allowlist`]: the one table of exportable attribute keys, and the scrubbing step
//!   every span passes right before export.
//! - [`propagation`]: `traceparent` / `tracestate` / baggage on ingress and egress.
//! - [`export`]: the bounded queue, the scrubbing exporter, health and metrics.
//!
//! [`init`] is the single call a binary makes. It reads the standard `OTEL_*`
//! environment variables; with no endpoint set it builds no exporter, installs no
//! subscriber, and every span is a no-op.

use std::{sync::OnceLock, time::Duration};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider},
};
use tracing_subscriber::{Layer as _, filter::Targets, layer::SubscriberExt as _};

pub mod allowlist;
pub mod export;
pub mod propagation;
pub mod spans;

pub use export::{Health, stats};
pub use propagation::IngressPolicy;

/// Default bound of the export queue (spans), as `OTEL_BSP_MAX_QUEUE_SIZE`'s default.
pub const DEFAULT_QUEUE_SPANS: usize = 2048;
/// Largest queue accepted: a span is a few KiB at most, so this bounds telemetry memory
/// to tens of MiB whatever the environment says.
pub const MAX_QUEUE_SPANS: usize = 65_536;
/// Default per-export deadline, as `OTEL_EXPORTER_OTLP_TIMEOUT`'s default.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{var}={value:?}: {reason}")]
    InvalidSetting {
        var: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("building the OTLP exporter: {0}")]
    Exporter(String),
    #[error("starting the telemetry export thread: {0}")]
    Runtime(std::io::Error),
    #[error("a tracing subscriber is already installed in this process")]
    AlreadyInstalled,
}

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// What the environment asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSettings {
    /// The traces endpoint as configured (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: String,
    pub protocol: Protocol,
    pub queue_spans: usize,
    pub export_timeout: Duration,
}

/// Reads the `OTEL_*` settings through `var` (the process environment in [`init`]).
/// `Ok(None)`: telemetry is off (no endpoint, `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none`).
pub fn settings_from(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<ExportSettings>, TelemetryError> {
    let get = |k: &str| {
        var(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match get("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(TelemetryError::InvalidSetting {
                var: "OTEL_TRACES_EXPORTER",
                value: other.to_owned(),
                reason: "only `otlp` and `none` are supported",
            });
        }
    }
    let Some(endpoint) =
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    if endpoint.starts_with("https://") {
        // Neither transport is built with TLS: fail at start, not at every export.
        return Err(TelemetryError::InvalidSetting {
            var: "OTEL_EXPORTER_OTLP_ENDPOINT",
            value: endpoint,
            reason: "TLS to the collector is not built in; export to an in-cluster collector over http://",
        });
    }
    if !endpoint.starts_with("http://") {
        return Err(TelemetryError::InvalidSetting {
            var: "OTEL_EXPORTER_OTLP_ENDPOINT",
            value: endpoint,
            reason: "must be an http:// URL",
        });
    }
    let (protocol_var, protocol) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
        Some(p) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(p)),
        None => (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            get("OTEL_EXPORTER_OTLP_PROTOCOL"),
        ),
    };
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => Protocol::HttpProtobuf,
        Some("grpc") => Protocol::Grpc,
        Some(other) => {
            return Err(TelemetryError::InvalidSetting {
                var: protocol_var,
                value: other.to_owned(),
                reason: "supported protocols are `grpc` and `http/protobuf`",
            });
        }
    };
    let queue_spans = match get("OTEL_BSP_MAX_QUEUE_SIZE") {
        None => DEFAULT_QUEUE_SPANS,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_QUEUE_SPANS).contains(&n) => n,
            _ => {
                return Err(TelemetryError::InvalidSetting {
                    var: "OTEL_BSP_MAX_QUEUE_SIZE",
                    value: v,
                    reason: "must be an integer from 1 to 65536",
                });
            }
        },
    };
    let timeout_var = if get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
    } else {
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    };
    let export_timeout = match get(timeout_var) {
        None => DEFAULT_EXPORT_TIMEOUT,
        Some(v) => match v.parse::<u64>() {
            Ok(ms) if (1..=600_000).contains(&ms) => Duration::from_millis(ms),
            _ => {
                return Err(TelemetryError::InvalidSetting {
                    var: timeout_var,
                    value: v,
                    reason: "must be milliseconds from 1 to 600000",
                });
            }
        },
    };
    Ok(Some(ExportSettings {
        endpoint,
        protocol,
        queue_spans,
        export_timeout,
    }))
}

/// The running pipeline; dropping it flushes what is queued (within the export
/// deadline) and stops exporting.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    settings: Option<ExportSettings>,
}

impl Telemetry {
    /// A pipeline that exports nothing.
    pub fn disabled() -> Self {
        Telemetry {
            provider: None,
            settings: None,
        }
    }

    /// What is being exported where, or `None` when off.
    pub fn settings(&self) -> Option<&ExportSettings> {
        self.settings.as_ref()
    }

    /// One line for a start-up banner.
    pub fn describe(&self) -> String {
        match &self.settings {
            None => "off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces)".to_owned(),
            Some(s) => format!(
                "exporting traces to {} over OTLP {} (queue {} spans)",
                s.endpoint,
                s.protocol.as_str(),
                s.queue_spans
            ),
        }
    }

    /// Flushes and stops. Call outside any async context (it blocks until the last
    /// export returns or times out).
    pub fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// The runtime exports run on: one worker thread, alive for the whole process (the SDK
/// exports from a thread of its own, where the OTLP transports would find no runtime).
fn export_runtime() -> Result<&'static tokio::runtime::Runtime, TelemetryError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otel-export")
        .enable_all()
        .build()
        .map_err(TelemetryError::Runtime)?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Starts telemetry from the process environment (`OTEL_*`). The single call a binary
/// makes at start-up; keep the returned value alive until exit.
pub fn init() -> Result<Telemetry, TelemetryError> {
    init_with_logs(None)
}

/// [`init`], with a log layer (the operator's `tracing` log) in the same subscriber.
pub fn init_with_logs(
    logs: Option<Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>>,
) -> Result<Telemetry, TelemetryError> {
    let Some(settings) = settings_from(|k| std::env::var(k).ok())? else {
        if let Some(logs) = logs {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(logs))
                .map_err(|_| TelemetryError::AlreadyInstalled)?;
        }
        return Ok(Telemetry::disabled());
    };
    let runtime = export_runtime()?;
    let exporter = {
        // The gRPC channel is created lazily but needs a runtime to exist in.
        let _enter = runtime.enter();
        let builder = opentelemetry_otlp::SpanExporter::builder();
        match settings.protocol {
            Protocol::Grpc => builder
                .with_tonic()
                .with_timeout(settings.export_timeout)
                .build(),
            Protocol::HttpProtobuf => builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(settings.export_timeout)
                .build(),
        }
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?
    };
    let exporter =
        export::ScrubbingExporter::new(exporter, runtime.handle().clone(), settings.export_timeout);
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(settings.queue_spans)
                .build(),
        )
        .build();
    let resource = {
        let builder = Resource::builder();
        let builder = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
            builder
        } else {
            builder.with_service_name("harness-engine")
        };
        builder
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build()
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(export::BoundedProcessor::new(batch, settings.queue_spans))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("harness-engine");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(spans::TARGET, tracing::Level::INFO));
    let subscriber = tracing_subscriber::registry().with(logs).with(layer);
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    stats().enable();
    Ok(Telemetry {
        provider: Some(provider),
        settings: Some(settings),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<ExportSettings>, TelemetryError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        settings_from(|k| map.get(k).cloned())
    }

    #[test]
    fn no_endpoint_means_off() {
        assert_eq!(settings(&[]).ok().flatten(), None);
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ])
            .ok()
            .flatten(),
            None
        );
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .ok()
            .flatten(),
            None
        );
    }

    #[test]
    fn endpoint_protocol_and_bounds() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
        ])
        .ok()
        .flatten()
        .expect("on");
        assert_eq!(s.protocol, Protocol::Grpc);
        assert_eq!(s.queue_spans, 64);
        assert_eq!(s.export_timeout, Duration::from_millis(500));
        let s = settings(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        )])
        .ok()
        .flatten()
        .expect("on");
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.queue_spans, DEFAULT_QUEUE_SPANS);
    }

    #[test]
    fn bad_settings_are_named() {
        for (k, v) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "10000000"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
        ] {
            let err =
                settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), (k, v)]).expect_err(k);
            assert!(err.to_string().contains(k), "{err}");
        }
        let err = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")]).expect_err("url");
        assert!(err.to_string().contains("http://"), "{err}");
        let err = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]).expect_err("tls");
        assert!(err.to_string().contains("TLS"), "{err}");
    }
}
