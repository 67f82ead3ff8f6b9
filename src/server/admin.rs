//! The admin port: `/live`, `/ready`, `/metrics` (OpenMetrics text, including the
//! telemetry pipeline's counters from [`crate::telemetry::stats`]). Separate from the
//! API port so probes and scrapes need no credentials and never compete with, or expose,
//! the data plane.

use std::time::Duration;

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::{
    AppState,
    error::{ApiError, ErrorCode, ErrorMark},
    middleware,
};
use crate::domain::ids::BindingId;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

/// The server's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
    store_errors: Family<CodeLabels, Counter>,
    ledger: super::ledger_routes::LedgerMetrics,
}

fn latency_histogram() -> Histogram {
    // 0.25 ms to ~8 s: a turn's two calls sit in the low milliseconds; the top buckets
    // show requests approaching the deadline.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::with_extra(|_| {})
    }
}

impl Metrics {
    /// The server's metrics plus whatever `extra` registers (the operator's).
    pub fn with_extra(extra: impl FnOnce(&mut Registry)) -> Self {
        let mut registry = Registry::with_prefix("harness_engine");
        extra(&mut registry);
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let store_errors = Family::<CodeLabels, Counter>::default();
        registry.register(
            "http_requests",
            "Data-plane HTTP requests by route template, method and status class",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Data-plane HTTP request latency by route template, method and status class",
            latency.clone(),
        );
        registry.register(
            "store_errors",
            "Store refusals and failures by stable error code",
            store_errors.clone(),
        );
        let ledger = super::ledger_routes::LedgerMetrics::default();
        ledger.register(&mut registry);
        crate::telemetry::stats().register(&mut registry);
        Metrics {
            registry,
            requests,
            latency,
            store_errors,
            ledger,
        }
    }

    pub fn observe_request(
        &self,
        route: String,
        method: String,
        status: StatusCode,
        elapsed: Duration,
        mark: Option<ErrorMark>,
    ) {
        let labels = RequestLabels {
            route,
            method,
            status_class: format!("{}xx", status.as_u16() / 100),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(mark) = mark.filter(|m| m.from_store) {
            self.store_errors
                .get_or_create(&CodeLabels {
                    code: mark.code.as_str().to_owned(),
                })
                .inc();
        }
    }

    /// The run ledger's counters.
    pub fn ledger(&self) -> &super::ledger_routes::LedgerMetrics {
        &self.ledger
    }

    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/live", get(live))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(middleware::no_route)
        .layer(axum::middleware::from_fn(middleware::json_errors))
        .with_state(state)
}

async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "live"}))
}

/// Ready when the store answers a read within a second. The body also reports the
/// telemetry exporter (`ok`, `degraded`, `disabled`): a collector outage is visible here
/// and in `/metrics` but never makes the server unready (spec 000: it changes no outcome).
async fn ready(State(state): State<AppState>) -> Response {
    let probe = BindingId::parse("hb_00000000000000000000000000000000");
    let Some(probe) = probe else {
        return ApiError::new(ErrorCode::Internal, "readiness probe id is malformed")
            .into_response();
    };
    match tokio::time::timeout(Duration::from_secs(1), state.store().get_binding(&probe)).await {
        Ok(Ok(_)) => Json(serde_json::json!({
            "status": "ready",
            "telemetry": crate::telemetry::stats().health().as_str(),
        }))
        .into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(_) => ApiError::new(
            ErrorCode::Unavailable,
            "the store did not answer within 1 s",
        )
        .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut response = state.metrics().render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
