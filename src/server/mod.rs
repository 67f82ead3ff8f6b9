//! The data-plane HTTP API (axum), DESIGN §6.
//!
//! - [`routes`]: the `/v1` handlers; [`dto`]: their bodies; [`openapi`]: the document;
//!   [`ledger_routes`]: the run ledger (`/v1/bindings/{id}/runs/...`).
//! - [`auth`]: who is calling (static tokens, Kubernetes); [`authz`]: which binding and
//!   scope that caller may touch; [`binding_objects`]: a bind's HarnessBinding in
//!   operator mode.
//! - [`error`]: the one error shape; [`extract`]: extractors that only fail with it;
//!   [`conn`]: the API port's connection loop (parser refusals in that shape too);
//!   [`middleware`]: deadline, metrics, trace context and the request span, JSON
//!   safety net.
//! - [`admin`]: `/live`, `/ready`, `/metrics` on their own port.
//! - [`local`]: `serve` mode's data directory, identity key and token file.
//!
//! The server holds the store only as `Arc<dyn Store>` and never reaches past its
//! traits: the store's fence, not the server, has the last word on epoch and lease.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::Duration,
};

use axum::{
    Router,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;

use crate::{
    domain::{
        ids::Keyring,
        limits::Limits,
        memory::policy::{BindingScopes, SharedMemoryPolicies},
    },
    store::Store,
    telemetry::IngressPolicy,
};

pub mod admin;
pub mod attribution;
pub mod auth;
pub mod authz;
pub mod binding_objects;
pub mod conn;
pub mod dto;
pub mod error;
pub mod extract;
pub mod ledger_routes;
pub mod local;
pub mod memory_config;
pub mod memory_routes;
pub mod middleware;
pub mod openapi;
pub mod review;
pub mod routes;
pub mod verification;

/// Request bodies may exceed the largest payload by this much (headers of a multipart
/// future, JSON framing of a commit): small, so a body limit still means what it says.
pub const BODY_SLACK_BYTES: usize = 64 << 10;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub limits: Limits,
    /// Deadline of one request, end to end (504 `timeout` when passed).
    pub request_timeout: Duration,
    /// Largest request body accepted (413 `too_large` above).
    pub max_body_bytes: usize,
    /// What to do with a well-formed incoming `traceparent` (spec 000 "Propagation").
    pub trace_ingress: IngressPolicy,
    /// The run ledger's budgets for bindings without their own (docs/ledger.md).
    pub ledger_budgets: crate::domain::ledger::Budgets,
    /// Request bodies held in memory at once, across all requests (at least one
    /// largest body): a request reserves its `Content-Length` (the body limit when it has
    /// none) before its body is read and keeps it until it is answered; the rest wait,
    /// within their deadline. Bounds the server's memory under many large bodies.
    pub body_budget_bytes: usize,
}

/// Default [`ServerConfig::body_budget_bytes`]: 16 MiB (four 4 MiB writes at once; a
/// body costs the server about four times its size while it is read and stored).
pub const BODY_BUDGET_BYTES: usize = 16 << 20;
/// The unit bodies are reserved in.
pub const BODY_BUDGET_UNIT: usize = 4 << 10;

impl ServerConfig {
    pub fn new(limits: Limits) -> Self {
        let max_body_bytes = limits.max_state_bytes.max(limits.max_object_bytes) + BODY_SLACK_BYTES;
        ServerConfig {
            limits,
            request_timeout: Duration::from_secs(10),
            max_body_bytes,
            trace_ingress: IngressPolicy::default(),
            ledger_budgets: ledger_routes::default_budgets(),
            body_budget_bytes: BODY_BUDGET_BYTES,
        }
    }
}

struct Inner {
    store: Arc<dyn Store>,
    keyring: Keyring,
    auth: Arc<dyn auth::Authenticator>,
    config: ServerConfig,
    metrics: admin::Metrics,
    bindings: authz::BindingCache,
    memory_policies: SharedMemoryPolicies,
    ledger_budgets: ledger_routes::LedgerBudgets,
    openapi_json: String,
    binding_objects: OnceLock<Arc<dyn binding_objects::BindingObjects>>,
    binding_scopes: OnceLock<BindingScopes>,
    /// Units of [`BODY_BUDGET_UNIT`] of request body that may be in memory at once.
    body_budget: tokio::sync::Semaphore,
    body_budget_units: u32,
}

/// What every handler reads: the store, the keyring, the authenticator, the settings.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl AppState {
    pub fn new(
        store: Arc<dyn Store>,
        keyring: Keyring,
        auth: Arc<dyn auth::Authenticator>,
        config: ServerConfig,
    ) -> Self {
        Self::with_metrics(store, keyring, auth, config, admin::Metrics::default())
    }
    /// [`AppState::new`] with a metrics registry that carries more (the operator's).
    pub fn with_metrics(
        store: Arc<dyn Store>,
        keyring: Keyring,
        auth: Arc<dyn auth::Authenticator>,
        config: ServerConfig,
        metrics: admin::Metrics,
    ) -> Self {
        let openapi_json = openapi::to_json(&openapi::document());
        let ledger_budgets = ledger_routes::LedgerBudgets::new(config.ledger_budgets);
        let body_budget_units = u32::try_from(
            config
                .body_budget_bytes
                .max(config.max_body_bytes)
                .div_ceil(BODY_BUDGET_UNIT),
        )
        .unwrap_or(u32::MAX >> 4);
        AppState(Arc::new(Inner {
            body_budget: tokio::sync::Semaphore::new(body_budget_units as usize),
            body_budget_units,
            store,
            keyring,
            auth,
            config,
            metrics,
            bindings: authz::BindingCache::default(),
            memory_policies: SharedMemoryPolicies::default(),
            ledger_budgets,
            openapi_json,
            binding_objects: OnceLock::new(),
            binding_scopes: OnceLock::new(),
        }))
    }
    pub fn store(&self) -> &dyn Store {
        self.0.store.as_ref()
    }
    pub fn keyring(&self) -> &Keyring {
        &self.0.keyring
    }
    pub fn auth(&self) -> &dyn auth::Authenticator {
        self.0.auth.as_ref()
    }
    pub fn config(&self) -> &ServerConfig {
        &self.0.config
    }
    pub fn metrics(&self) -> &admin::Metrics {
        &self.0.metrics
    }
    /// The request-body budget ([`ServerConfig::body_budget_bytes`]) and its size in units.
    pub fn body_budget(&self) -> (&tokio::sync::Semaphore, u32) {
        (&self.0.body_budget, self.0.body_budget_units)
    }
    pub fn bindings(&self) -> &authz::BindingCache {
        &self.0.bindings
    }
    /// The memory policy snapshot every `/v1/memory` call reads. Replace it (or upsert
    /// one `MemoryPolicy`) through this handle: `serve` loads it from files at start; the
    /// operator's `MemoryPolicy` watch keeps it current (docs/memory.md).
    pub fn memory_policies(&self) -> &SharedMemoryPolicies {
        &self.0.memory_policies
    }
    /// The run ledger's budgets: the configured default, and per-binding limits from a
    /// binding's `SandboxProfile` where the operator sets them.
    pub fn ledger_budgets(&self) -> &ledger_routes::LedgerBudgets {
        &self.0.ledger_budgets
    }
    /// Operator mode: binds create or return the conversation's HarnessBinding through
    /// `objects` ([`binding_objects`]). Set once, before serving; `false` if already set.
    pub fn use_binding_objects(&self, objects: Arc<dyn binding_objects::BindingObjects>) -> bool {
        self.0.binding_objects.set(objects).is_ok()
    }
    /// Operator mode: memory policies are chosen per binding namespace and
    /// `memoryPolicyRef` from `scopes` (kept by the HarnessBinding watch). Set once.
    pub fn use_binding_scopes(&self, scopes: BindingScopes) -> bool {
        self.0.binding_scopes.set(scopes).is_ok()
    }
    /// Where each binding's HarnessBinding lives, in operator mode; `None` in `serve`.
    pub fn binding_scopes(&self) -> Option<&BindingScopes> {
        self.0.binding_scopes.get()
    }
    /// The HarnessBinding side of a bind, in operator mode; `None` in `serve` mode.
    pub fn binding_objects(&self) -> Option<&dyn binding_objects::BindingObjects> {
        self.0.binding_objects.get().map(|o| o.as_ref())
    }
}

/// Every `/v1` route with its OpenAPI annotations: [`routes`] (state, objects, streams,
/// interrupts, memory) and [`ledger_routes`].
pub fn api_routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    routes::router().merge(ledger_routes::router())
}

/// The API router: `/v1/...` and `/openapi.json`, with every request-wide layer.
pub fn app(state: AppState) -> Router {
    let (router, _) = api_routes().split_for_parts();
    router
        .route("/openapi.json", get(serve_openapi))
        .fallback(middleware::no_route)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::body_budget,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::deadline,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::track,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::trace_context,
        ))
        .layer(axum::middleware::from_fn(middleware::json_errors))
        .layer(CatchPanicLayer::custom(middleware::panic_response))
        .with_state(state)
}

async fn serve_openapi(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let mut response = state.0.openapi_json.clone().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves the API on `api` and the admin endpoints on `admin` until `shutdown`
/// resolves, then drains in-flight requests.
pub async fn serve(
    state: AppState,
    api: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = app(state.clone());
    serve_app(state, router, api, admin, shutdown).await
}

/// [`serve`] with the API port's router given (the binary adds `/mcp` to [`app`]).
pub async fn serve_app(
    state: AppState,
    router: Router,
    api: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // A closed channel also means stop.
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // Our own connection loop, so the HTTP parser's refusals carry the error body too.
    let api_server = conn::serve_api(api, router, wait(stop_rx.clone()));
    let admin_server =
        axum::serve(admin, admin::router(state)).with_graceful_shutdown(wait(stop_rx));
    let trigger = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let (api_result, admin_result, ()) =
        tokio::join!(api_server, admin_server.into_future(), trigger);
    api_result.and(admin_result)
}
