//! The MongoDB node: what `harness-engine serve` runs (the same data plane, built by the
//! same library calls: `local::prepare`, `AppState::new`, `server::serve`), on the
//! MongoDB store instead of SQLite (`serve` has only the embedded store; the operator
//! runs this data plane on MongoDB), plus a control port with the operator's two store
//! calls, fence raise and clear. It runs as a child process (this test binary started
//! again with `CHAOS_NODE` set) so the fault injector can SIGKILL and SIGSTOP it.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use axum::{Json, Router, extract::State, routing::post};
use harness_engine::{
    domain::{ids::BindingId, limits::Limits, state::Rejection},
    server::{self, AppState, ServerConfig, local},
    store::{Store, StoreError, mongo::MongoStore},
};
use serde::{Deserialize, Serialize};

use super::system::{ControlRequest, ControlResponse};

pub const NODE_ENV: &str = "CHAOS_NODE";

#[derive(Debug, Serialize, Deserialize)]
pub struct NodeConfig {
    pub mongo_uri: String,
    pub database: String,
    pub data_dir: PathBuf,
    pub tokens_file: PathBuf,
    pub api: SocketAddr,
    pub admin: SocketAddr,
    pub control: SocketAddr,
    pub request_timeout_ms: u64,
}

/// When this process was started as a node, runs it and exits; otherwise returns.
pub fn serve_if_child() {
    let Ok(config) = std::env::var(NODE_ENV) else {
        return;
    };
    let config: NodeConfig = serde_json::from_str(&config).expect("CHAOS_NODE config");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(run(config));
    if let Err(e) = result {
        eprintln!("chaos node: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

async fn connect(config: &NodeConfig) -> MongoStore {
    // FerretDB may be down (the fault injector restarts the node at any time): retry.
    loop {
        match MongoStore::connect(&config.mongo_uri, &config.database, Limits::default()).await {
            Ok(store) => return store,
            Err(e) => {
                eprintln!(
                    "chaos node: connecting to {}: {e}; retrying",
                    config.mongo_uri
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn run(config: NodeConfig) -> anyhow::Result<()> {
    let setup = local::prepare(
        Some(config.data_dir.clone()),
        Some(config.tokens_file.clone()),
        None,
        "chaos",
    )?;
    let store: Arc<dyn Store> = Arc::new(connect(&config).await);
    let mut server_config = ServerConfig::new(Limits::default());
    server_config.request_timeout = Duration::from_millis(config.request_timeout_ms);
    let state = AppState::new(
        store.clone(),
        setup.keyring,
        Arc::new(setup.tokens),
        server_config,
    );
    // Every agent gets long-term memory, as `serve --memory-policy` with the fixture.
    state.memory_policies().replace(
        harness_engine::server::memory_config::load(
            None,
            &[std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/memory_policy_all_agents.yaml")],
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let api = tokio::net::TcpListener::bind(config.api).await?;
    let admin = tokio::net::TcpListener::bind(config.admin).await?;
    let control = tokio::net::TcpListener::bind(config.control).await?;
    let control_app = Router::new()
        .route("/chaos/fence", post(fence))
        .route("/chaos/clear", post(clear))
        .with_state(store);
    tokio::spawn(async move {
        let _ = axum::serve(control, control_app).await;
    });
    eprintln!("chaos node: serving on {}", config.api);
    server::serve(state, api, admin, terminated()).await?;
    Ok(())
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

fn answer(result: Result<(u64, u64), StoreError>) -> Json<ControlResponse> {
    Json(match result {
        Ok((epoch, generation)) => ControlResponse {
            epoch,
            generation,
            ..ControlResponse::default()
        },
        Err(StoreError::Rejected(r)) => ControlResponse {
            code: Some(r.code().to_owned()),
            current_epoch: match r {
                Rejection::StaleEpoch { current, .. } => Some(current),
                _ => None,
            },
            ..ControlResponse::default()
        },
        Err(e) => ControlResponse {
            error: Some(e.to_string()),
            ..ControlResponse::default()
        },
    })
}

fn binding(req: &ControlRequest) -> Result<BindingId, StoreError> {
    BindingId::parse(&req.binding_id)
        .ok_or_else(|| Rejection::Invalid(format!("binding id {}", req.binding_id)).into())
}

async fn fence(
    State(store): State<Arc<dyn Store>>,
    Json(req): Json<ControlRequest>,
) -> Json<ControlResponse> {
    let result = match binding(&req) {
        Ok(id) => store
            .raise_fence(&id, req.epoch, req.generation)
            .await
            .map(|f| (f.epoch, f.lease_generation)),
        Err(e) => Err(e),
    };
    answer(result)
}

async fn clear(
    State(store): State<Arc<dyn Store>>,
    Json(req): Json<ControlRequest>,
) -> Json<ControlResponse> {
    let result = match binding(&req) {
        Ok(id) => store
            .clear(&id, req.epoch)
            .await
            .map(|r| (r.epoch, req.generation)),
        Err(e) => Err(e),
    };
    answer(result)
}
