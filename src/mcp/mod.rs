//! Harness Engine over the Model Context Protocol (`spec/003_bab976795353d872.txt`):
//! the same memory and run ledger as `/v1`, as 17 tools any MCP client can call
//! (docs/mcp.md).
//!
//! - [`catalog`]: the tools, their schemas and their canonical order (what `tools/list`
//!   answers, committed as `docs/mcp-tools.json`).
//! - [`server`]: the handler; each tool is the `/v1` request that does the same thing,
//!   sent through the data plane's router in process with the caller's credentials.
//!
//! Transports: Streamable HTTP at `/mcp` on the data-plane port ([`with_mcp`]), stateless
//! (no MCP session to pin a client to one replica; the run handles carry the state), and
//! stdio (`harness-engine mcp --stdio`, [`serve_stdio`]) for a local agent on the
//! embedded store.

pub mod catalog;
pub mod server;

use std::sync::Arc;

use axum::{Router, extract::Request, middleware::Next, response::Response};
use rmcp::{
    ServiceExt,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};

use crate::server::{AppState, extract::Authenticated};
pub use server::{HarnessMcp, NamedWorkspaces, V1};

/// The path of the Streamable HTTP endpoint.
pub const PATH: &str = "/mcp";

/// Largest MCP request body (a tool call's arguments; the largest `/v1` body fits).
const MAX_MCP_BODY_BYTES: usize = 8 << 20;

/// `app` (the data plane's `/v1` router) with `/mcp` beside it. Every `/mcp` request is
/// authenticated first, with the same bearer tokens as `/v1` (an unauthenticated one
/// gets the API's `401` error body and never reaches the MCP layer); every tool call is
/// then authorized by `/v1` itself.
pub fn with_mcp(state: AppState, app: Router) -> Router {
    let v1 = V1::new(app.clone());
    let mut config = StreamableHttpServerConfig::default();
    // Stateless: any replica serves any request, and a reconnect needs nothing but the
    // workspace and run handles.
    config.legacy_session_mode = false;
    config.json_response = true;
    config.sse_keep_alive = None;
    config.max_request_body_bytes = MAX_MCP_BODY_BYTES;
    // Host checks defend unauthenticated local servers from DNS rebinding; every request
    // here carries a bearer token a browser page cannot attach, and in a cluster the
    // Host is whatever Service or Ingress name the platform chose.
    let config = config.disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(HarnessMcp::over_http(v1.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let guarded = Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticated,
        ))
        .with_state(state);
    app.merge(guarded)
}

async fn authenticated(_caller: Authenticated, request: Request, next: Next) -> Response {
    next.run(request).await
}

/// Serves MCP over stdin and stdout until the client closes them: the local agent's
/// calls carry `token` (the embedded store's own principal).
pub async fn serve_stdio(app: Router, token: &str, named: NamedWorkspaces) -> anyhow::Result<()> {
    let handler = HarnessMcp::local(V1::new(app), token, named)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let running = handler
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("MCP over stdio: {e}"))?;
    running.waiting().await?;
    Ok(())
}
