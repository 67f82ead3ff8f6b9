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

use axum::{
    Router,
    extract::Request,
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use rmcp::{
    ServiceExt,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};

use crate::server::{AppState, error::ApiError, extract::Authenticated};
pub use server::{HarnessMcp, NamedWorkspaces, V1};

/// The path of the Streamable HTTP endpoint.
pub const PATH: &str = "/mcp";

/// Largest MCP request body (a tool call's arguments; the largest `/v1` body fits).
const MAX_MCP_BODY_BYTES: usize = 8 << 20;

/// Which `Host` and `Origin` values `/mcp` answers (DNS-rebinding protection).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// Host names (without port) accepted in `Host` and in a browser's `Origin`; empty:
    /// any (a cluster Service answers under whatever name the platform gives it).
    pub allowed_hosts: Vec<String>,
}

impl HostPolicy {
    /// The loopback names: what a server bound to a loopback address answers, so a web
    /// page that rebinds its own domain to 127.0.0.1 cannot reach it.
    pub fn loopback() -> Self {
        HostPolicy {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
        }
    }

    /// `serve`: loopback names when it listens on a loopback address, else any; `names`
    /// (`--mcp-allowed-host`) replace that, and `*` means any.
    pub fn for_listener(listen: std::net::SocketAddr, names: &[String]) -> Self {
        if names.iter().any(|n| n == "*") {
            return HostPolicy::default();
        }
        if !names.is_empty() {
            return HostPolicy {
                allowed_hosts: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            };
        }
        if listen.ip().is_loopback() {
            HostPolicy::loopback()
        } else {
            HostPolicy::default()
        }
    }

    fn allows(&self, host: &str) -> bool {
        self.allowed_hosts.is_empty()
            || self
                .allowed_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(host))
    }
}

/// The host name of a `Host` value or of an `Origin` URL, without port or brackets.
fn host_name(value: &str) -> Option<String> {
    let authority = match value.split_once("://") {
        Some((_, rest)) => rest.split('/').next().unwrap_or_default(),
        None => value,
    };
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                authority
            }
        })
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// `app` (the data plane's `/v1` router) with `/mcp` beside it. A `/mcp` request must
/// name an allowed `Host` (and `Origin`, when a browser sends one), then authenticate
/// with the same bearer tokens as `/v1`; a refusal is the API's error body and never
/// reaches the MCP layer. Every tool call is then authorized by `/v1` itself.
pub fn with_mcp(state: AppState, app: Router, hosts: HostPolicy) -> Router {
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
    let hosts = Arc::new(hosts);
    let guarded = Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticated,
        ))
        .layer(axum::middleware::from_fn(
            move |request: Request, next: Next| {
                let hosts = hosts.clone();
                async move { allowed_host(&hosts, request, next).await }
            },
        ))
        .with_state(state);
    app.merge(guarded)
}

async fn allowed_host(hosts: &HostPolicy, request: Request, next: Next) -> Response {
    let (host, origin) = {
        let header = |name: header::HeaderName| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (
            header(header::HOST).or_else(|| request.uri().host().map(str::to_owned)),
            header(header::ORIGIN),
        )
    };
    let refused = |what: &str, value: Option<String>| {
        ApiError::forbidden(format!(
            "{what} {} is not served here (DNS-rebinding protection; allowed hosts: {}; serve --mcp-allowed-host)",
            value.unwrap_or_else(|| "(none)".into()),
            hosts.allowed_hosts.join(", ")
        ))
        .into_response()
    };
    if !hosts.allowed_hosts.is_empty() {
        if !host
            .as_deref()
            .and_then(host_name)
            .is_some_and(|h| hosts.allows(&h))
        {
            return refused("Host", host);
        }
        if let Some(o) = &origin
            && !host_name(o).is_some_and(|h| hosts.allows(&h))
        {
            return refused("Origin", origin);
        }
    }
    next.run(request).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_drop_ports_schemes_and_brackets() {
        assert_eq!(host_name("localhost:8080").as_deref(), Some("localhost"));
        assert_eq!(host_name("[::1]:80").as_deref(), Some("::1"));
        assert_eq!(
            host_name("http://Evil.Example:3000").as_deref(),
            Some("evil.example")
        );
        assert_eq!(host_name("https://127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_name(""), None);
        let loopback = HostPolicy::for_listener("127.0.0.1:0".parse().expect("addr"), &[]);
        assert!(loopback.allows("localhost") && !loopback.allows("evil.example"));
        let any = HostPolicy::for_listener("0.0.0.0:8080".parse().expect("addr"), &[]);
        assert!(any.allows("harness-engine.ns.svc"));
        let star = HostPolicy::for_listener("127.0.0.1:0".parse().expect("addr"), &["*".into()]);
        assert!(star.allows("anything"));
    }
}
