//! The MCP server: one [`HarnessMcp`] handler behind both transports (Streamable HTTP
//! at `/mcp` on the data plane, and stdio for a local agent).
//!
//! A tool call is translated into the `/v1` request that does the same thing and sent
//! through the data plane's own router in process ([`V1`]), with the caller's
//! credentials. So a tool goes through exactly the authentication, authorization,
//! fencing, validation, write pipeline, audit, spans and metrics of `/v1`: there is one
//! implementation of each rule, and MCP is a second way in. The answer comes back as the
//! tool's structured result, a refusal as a tool error carrying the same
//! `{code, message, details}`.

use std::{borrow::Cow, sync::Arc};

use axum::{
    Router,
    body::{Body, to_bytes},
    http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header},
};
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, DiscoverResult,
        Implementation, InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams,
        ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
};
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use super::catalog;
use crate::server::extract::{EPOCH, LEASE_GENERATION, SUBJECT};

/// Largest `/v1` answer a tool relays (the largest page of run events fits).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// How long a client may cache `server/discover` (`spec/003` "Compatibility").
const DISCOVER_TTL_MS: u64 = 300_000;

/// The data plane's `/v1` router, called in process.
#[derive(Clone)]
pub struct V1 {
    router: Router,
}

impl V1 {
    pub fn new(router: Router) -> Self {
        V1 { router }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &HeaderMap,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), McpError> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(h) = request.headers_mut() {
            h.extend(headers.clone());
            if body.is_some() {
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
            }
        }
        let body = match body {
            Some(v) => Body::from(serde_json::to_vec(v).unwrap_or_default()),
            None => Body::empty(),
        };
        let request = request
            .body(body)
            .map_err(|e| McpError::internal_error(format!("building {path}: {e}"), None))?;
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| McpError::internal_error(format!("{path}: {e}"), None))?;
        let status = response.status();
        let bytes = to_bytes(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| McpError::internal_error(format!("reading {path}: {e}"), None))?;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(
                |_| json!({"code": "internal", "message": String::from_utf8_lossy(&bytes)}),
            )
        };
        Ok((status, value))
    }
}

/// Where a call's credentials come from.
#[derive(Clone)]
enum Credentials {
    /// Streamable HTTP: the MCP request's own headers (`Authorization`, the fence,
    /// `Harness-Subject`, `traceparent`), forwarded as they came.
    FromRequest,
    /// stdio: the local agent's token (the embedded store's own principal).
    Local(HeaderValue),
}

/// The MCP handler: the catalogue and a way into `/v1`.
#[derive(Clone)]
pub struct HarnessMcp {
    v1: V1,
    credentials: Credentials,
    tools: Arc<Vec<Tool>>,
    named: Option<NamedWorkspaces>,
}

/// stdio: a workspace key that is not a binding id names a conversation of the local
/// principal, bound (create or get) with this agent and harness on first use.
#[derive(Clone, Debug)]
pub struct NamedWorkspaces {
    pub agent_id: String,
    pub harness: String,
}

/// Request headers a tool call forwards to `/v1`.
const FORWARDED: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static(SUBJECT),
    HeaderName::from_static("traceparent"),
];

fn tools() -> Vec<Tool> {
    catalog::document()["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| serde_json::from_value::<Tool>(t.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The preconditions of a governed-v2 event (`schema_version` 2) into the `/v1` body;
/// returns the fence they name (epoch, generation), which the call then carries.
fn governed(
    args: &Args<'_>,
    tool: &str,
    version: u64,
    body: &mut Value,
) -> Result<Option<(u64, u64)>, Refused> {
    match args.opt("preconditions") {
        None if version == 2 => Err(invalid(format!(
            "{tool}: a governed-v2 event (schema_version 2) carries preconditions: epoch, generation, run_last_seq and status"
        ))),
        None => Ok(None),
        Some(Value::Object(pre)) => {
            let get = |k: &str| pre.get(k).and_then(Value::as_u64);
            let (Some(epoch), Some(generation), Some(seq), Some(status)) = (
                get("epoch"),
                get("generation"),
                get("run_last_seq"),
                pre.get("status").and_then(Value::as_str),
            ) else {
                return Err(invalid(format!(
                    "{tool}: preconditions need epoch, generation, run_last_seq (integers) and status"
                )));
            };
            body["preconditions"] = json!({"run_last_seq": seq, "status": status});
            Ok(Some((epoch, generation)))
        }
        Some(_) => Err(invalid(format!(
            "{tool}: `preconditions` must be an object"
        ))),
    }
}

/// A tool's answer: the `/v1` body as structured content.
fn answer(status: StatusCode, body: Value) -> CallToolResult {
    if status.is_success() {
        CallToolResult::structured(body)
    } else {
        refusal(body).into()
    }
}

/// A refusal in the API's error shape (`{code, message, details}`); it reaches the
/// caller as a tool error it can read.
struct Refused(Value);

impl From<Refused> for CallToolResult {
    fn from(r: Refused) -> Self {
        CallToolResult::structured_error(json!({ "error": r.0 }))
    }
}

fn refusal(body: Value) -> Refused {
    if body.get("code").is_some() {
        Refused(body)
    } else {
        Refused(
            json!({"code": "internal", "message": "the data plane answered without an error body", "details": {}}),
        )
    }
}

fn invalid(message: impl Into<String>) -> Refused {
    refusal(json!({"code": "invalid", "message": message.into(), "details": {}}))
}

/// The arguments of one call, with typed accessors that refuse with the tool's name.
struct Args<'a> {
    tool: &'a str,
    map: &'a JsonObject,
}

impl<'a> Args<'a> {
    fn str(&self, name: &str) -> Result<&'a str, Refused> {
        match self.map.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s),
            Some(_) => Err(invalid(format!(
                "{}: `{name}` must be a non-empty string",
                self.tool
            ))),
            None => Err(invalid(format!("{}: `{name}` is required", self.tool))),
        }
    }
    fn opt(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }
    fn opt_str(&self, name: &str) -> Result<Option<&'a str>, Refused> {
        match self.opt(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(format!("{}: `{name}` must be a string", self.tool))),
        }
    }
    fn u64(&self, name: &str) -> Result<Option<u64>, Refused> {
        match self.opt(name) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                invalid(format!(
                    "{}: `{name}` must be a non-negative integer",
                    self.tool
                ))
            }),
        }
    }
    /// Refuses arguments the tool's schema does not name (the schemas say
    /// `additionalProperties: false`; a typo must not be dropped silently).
    fn check_known(&self, schema: &JsonObject) -> Result<(), Refused> {
        let known = schema.get("properties").and_then(Value::as_object);
        match self
            .map
            .keys()
            .find(|k| !known.is_some_and(|p| p.contains_key(k.as_str())))
        {
            Some(unknown) => Err(invalid(format!(
                "{}: `{unknown}` is not an argument of this tool",
                self.tool
            ))),
            None => Ok(()),
        }
    }
}

fn percent(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The run-tool labels: provenance stored in the payload, never identity.
fn labels(args: &Args<'_>) -> Result<Option<Value>, Refused> {
    match args.opt("labels") {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(Value::Object(m.clone()))),
        Some(_) => Err(invalid(format!(
            "{}: `labels` must be an object",
            args.tool
        ))),
    }
}

fn agent_of(labels: Option<&Value>) -> String {
    labels
        .and_then(|l| l.get("agent"))
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .unwrap_or("mcp")
        .to_owned()
}

impl HarnessMcp {
    /// The handler for Streamable HTTP: every call carries the HTTP request's headers.
    pub fn over_http(v1: V1) -> Self {
        HarnessMcp {
            v1,
            credentials: Credentials::FromRequest,
            tools: Arc::new(tools()),
            named: None,
        }
    }

    /// The handler for stdio: every call carries the local token.
    pub fn local(v1: V1, token: &str, named: NamedWorkspaces) -> Result<Self, McpError> {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| McpError::internal_error("the local token is not a header value", None))?;
        Ok(HarnessMcp {
            v1,
            credentials: Credentials::Local(value),
            tools: Arc::new(tools()),
            named: Some(named),
        })
    }

    /// The headers every `/v1` call of this tool call carries: credentials, and the fence
    /// when the caller sent one.
    fn base_headers(&self, ctx: &RequestContext<RoleServer>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        match &self.credentials {
            Credentials::Local(token) => {
                headers.insert(header::AUTHORIZATION, token.clone());
            }
            Credentials::FromRequest => {
                if let Some(parts) = ctx.extensions.get::<axum::http::request::Parts>() {
                    for name in FORWARDED.iter().chain([
                        &HeaderName::from_static(EPOCH),
                        &HeaderName::from_static(LEASE_GENERATION),
                    ]) {
                        for v in parts.headers.get_all(name) {
                            headers.append(name.clone(), v.clone());
                        }
                    }
                }
            }
        }
        headers
    }

    /// Headers for a call that acts in the workspace's binding: the fence the caller sent,
    /// or else the binding's current one (read through `/v1` with the caller's
    /// credentials; a sandbox worker is still held to its own pod's fence by `/v1`).
    async fn fenced(
        &self,
        base: &HeaderMap,
        workspace: &str,
        fence: Option<(u64, u64)>,
    ) -> Result<HeaderMap, Refused> {
        let mut headers = base.clone();
        let (epoch, generation) = match fence {
            Some(f) => f,
            None if headers.contains_key(EPOCH) && headers.contains_key(LEASE_GENERATION) => {
                return Ok(headers);
            }
            None => {
                let (status, binding) = self
                    .v1
                    .call(
                        Method::GET,
                        &format!("/v1/bindings/{}", percent(workspace)),
                        base,
                        None,
                    )
                    .await
                    .map_err(|e| {
                        refusal(json!({"code": "internal", "message": e.message, "details": {}}))
                    })?;
                if !status.is_success() {
                    return Err(refusal(binding));
                }
                (
                    binding["epoch"].as_u64().unwrap_or(0),
                    binding["lease_generation"].as_u64().unwrap_or(0),
                )
            }
        };
        for (name, value) in [(EPOCH, epoch), (LEASE_GENERATION, generation)] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
        Ok(headers)
    }

    /// The binding a workspace key names: a binding id as it is, or (stdio) the local
    /// principal's conversation of that name, bound on first use.
    async fn resolve_workspace(&self, base: &HeaderMap, key: &str) -> Result<String, Refused> {
        if crate::domain::ids::BindingId::parse(key).is_some() {
            return Ok(key.to_owned());
        }
        let Some(named) = &self.named else {
            return Err(invalid(
                "`workspace_key` must be a binding id (hb_ and 32 hex digits) the caller may use; bind a conversation with POST /v1/bindings first",
            ));
        };
        // A bind is create-or-get; its idempotency key is the workspace's name.
        let mut headers = base.clone();
        let bind_key = HeaderValue::from_str(&format!("mcp-workspace:{key}"))
            .map_err(|_| invalid("`workspace_key` must be printable ASCII"))?;
        headers.insert(HeaderName::from_static("idempotency-key"), bind_key);
        let (status, bound) = self
            .v1
            .call(
                Method::POST,
                "/v1/bindings",
                &headers,
                Some(&json!({"agent_id": named.agent_id, "conversation_id": key, "harness": named.harness})),
            )
            .await
            .map_err(|e| refusal(json!({"code": "internal", "message": e.message, "details": {}})))?;
        if !status.is_success() {
            return Err(refusal(bound));
        }
        bound["binding_id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| refusal(json!({"code": "internal", "message": "the bind answered without a binding id", "details": {}})))
    }

    /// Appends one event through `/v1` and answers with `shape` of the recorded event (a
    /// refusal as the API's error).
    async fn append_event(
        &self,
        ws: &str,
        headers: &HeaderMap,
        body: Value,
        shape: fn(&Value) -> Value,
    ) -> Result<CallToolResult, McpError> {
        let path = format!("/v1/bindings/{ws}/runs/events");
        match self
            .v1
            .call(Method::POST, &path, headers, Some(&body))
            .await?
        {
            (status, answered) if status.is_success() => {
                Ok(CallToolResult::structured(shape(&answered)))
            }
            (status, answered) => Ok(answer(status, answered)),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: String,
        headers: &HeaderMap,
        body: Option<Value>,
    ) -> Result<CallToolResult, McpError> {
        let (status, value) = self.v1.call(method, &path, headers, body.as_ref()).await?;
        Ok(answer(status, value))
    }

    async fn dispatch(
        &self,
        name: &str,
        arguments: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let Some(tool) = self.tools.iter().find(|t| t.name == name) else {
            return Err(McpError::invalid_params(
                format!("unknown tool `{name}`"),
                None,
            ));
        };
        let args = Args {
            tool: name,
            map: arguments,
        };
        if let Err(refused) = args.check_known(&tool.input_schema) {
            return Ok(refused.into());
        }
        match self.route(name, &args, ctx).await {
            Ok(result) => result,
            Err(refused) => Ok(refused.into()),
        }
    }

    /// One tool, translated. `Err` is a refusal decided before `/v1` was asked.
    async fn route(
        &self,
        name: &str,
        args: &Args<'_>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Result<CallToolResult, McpError>, Refused> {
        let base = self.base_headers(ctx);
        let workspace = self
            .resolve_workspace(&base, args.str("workspace_key")?)
            .await?;
        let workspace = workspace.as_str();
        let ws = percent(workspace);
        let keyed = |headers: &HeaderMap| -> Result<HeaderMap, Refused> {
            let key = args.str("idempotency_key")?;
            let mut h = headers.clone();
            h.insert(
                HeaderName::from_static("idempotency-key"),
                HeaderValue::from_str(key).map_err(|_| {
                    invalid(format!(
                        "{name}: `idempotency_key` must be visible ASCII characters"
                    ))
                })?,
            );
            Ok(h)
        };
        let memory = |headers: &HeaderMap| -> Result<HeaderMap, Refused> {
            let mut h = headers.clone();
            h.insert(
                HeaderName::from_static("harness-binding"),
                HeaderValue::from_str(workspace).map_err(|_| {
                    invalid(format!("{name}: `workspace_key` must be a binding id"))
                })?,
            );
            Ok(h)
        };
        Ok(match name {
            "store" | "revise" => {
                let scope = args.str("scope")?;
                let mut body = Map::new();
                body.insert("key".into(), json!(args.str("key")?));
                body.insert("content".into(), json!(args.str("content")?));
                body.insert(
                    "kind".into(),
                    json!(args.opt_str("kind")?.unwrap_or("semantic")),
                );
                for field in ["media_type", "importance", "embedding", "run_id"] {
                    if let Some(v) = args.opt(field) {
                        body.insert(field.into(), v.clone());
                    }
                }
                if name == "revise" {
                    let expected = args
                        .u64("expected_revision")?
                        .ok_or_else(|| invalid("revise: `expected_revision` is required"))?;
                    body.insert("expected_revision".into(), json!(expected));
                }
                let headers = keyed(&memory(&self.fenced(&base, workspace, None).await?)?)?;
                self.send(
                    Method::PUT,
                    format!("/v1/memory/{}/records", percent(scope)),
                    &headers,
                    Some(Value::Object(body)),
                )
                .await
            }
            "recall" => {
                let mut body = Map::new();
                for field in [
                    "query",
                    "scopes",
                    "kinds",
                    "limit",
                    "embedding",
                    "budget_tokens",
                ] {
                    if let Some(v) = args.opt(field) {
                        body.insert(field.into(), v.clone());
                    }
                }
                let headers = memory(&base)?;
                self.send(
                    Method::POST,
                    "/v1/memory/search".into(),
                    &headers,
                    Some(Value::Object(body)),
                )
                .await
            }
            "browse" | "export" => {
                let scope = args.str("scope")?;
                let mut path = format!("/v1/memory/{}/records/list?", percent(scope));
                if let Some(after) = args.opt_str("after_key")? {
                    path.push_str(&format!("after_key={}&", percent(after)));
                }
                if let Some(limit) = args.u64("limit")? {
                    path.push_str(&format!("limit={limit}"));
                }
                let headers = memory(&base)?;
                match self.v1.call(Method::GET, &path, &headers, None).await {
                    Ok((status, mut page)) if status.is_success() && name == "browse" => {
                        // Browse is an index: keys and versions, not contents.
                        if let Some(records) = page["records"].as_array_mut() {
                            for r in records.iter_mut() {
                                *r = json!({
                                    "key": r["key"], "id": r["id"], "kind": r["kind"],
                                    "revision": r["revision"], "content_hash": r["content_hash"],
                                    "approval_status": r["approval_status"],
                                    "updated_at_ms": r["updated_at_ms"],
                                });
                            }
                        }
                        Ok(CallToolResult::structured(page))
                    }
                    Ok((status, page)) => Ok(answer(status, page)),
                    Err(e) => Err(e),
                }
            }
            "promote" => {
                let scope = args.str("scope")?;
                let headers = keyed(&memory(&self.fenced(&base, workspace, None).await?)?)?;
                self.send(
                    Method::POST,
                    format!("/v1/memory/{}/records/promote", percent(scope)),
                    &headers,
                    Some(json!({"key": args.str("key")?, "to_scope": args.str("to_scope")?})),
                )
                .await
            }
            "stats" => {
                let headers = memory(&base)?;
                let (status, mut stats) = match self
                    .v1
                    .call(Method::GET, "/v1/memory/stats", &headers, None)
                    .await
                {
                    Ok(answered) => answered,
                    Err(e) => return Ok(Err(e)),
                };
                if !status.is_success() {
                    return Ok(Ok(answer(status, stats)));
                }
                // Review evidence from the workspace's ledger, beside the counts.
                let fenced = self.fenced(&base, workspace, None).await?;
                let path = format!("/v1/bindings/{ws}/runs/memory-utility");
                match self.v1.call(Method::GET, &path, &fenced, None).await {
                    Ok((status, shadow)) if status.is_success() => {
                        stats["memory_utility_shadow"] = shadow;
                        Ok(CallToolResult::structured(stats))
                    }
                    Ok((status, refused)) => Ok(answer(status, refused)),
                    Err(e) => Err(e),
                }
            }
            "forget" => {
                let scope = args.str("scope")?;
                let key = args.str("key")?;
                let expected = args
                    .u64("expected_revision")?
                    .ok_or_else(|| invalid("forget: `expected_revision` is required"))?;
                let headers = keyed(&memory(&self.fenced(&base, workspace, None).await?)?)?;
                self.send(
                    Method::DELETE,
                    format!(
                        "/v1/memory/{}/records?key={}&expected_revision={expected}",
                        percent(scope),
                        percent(key)
                    ),
                    &headers,
                    None,
                )
                .await
            }
            "begin_run" => {
                let labels = labels(args)?;
                let mut payload = Map::new();
                if let Some(goal) = args.opt_str("goal_digest")? {
                    payload.insert("goal_digest".into(), json!(goal));
                }
                if let Some(l) = &labels {
                    payload.insert("labels".into(), l.clone());
                }
                let headers = keyed(&self.fenced(&base, workspace, None).await?)?;
                self.send(
                    Method::POST,
                    format!("/v1/bindings/{ws}/runs"),
                    &headers,
                    Some(json!({"agent_id": agent_of(labels.as_ref()), "payload": payload})),
                )
                .await
            }
            "record_run_event" => {
                let run = args.str("run_id")?;
                let event_type = args.str("type")?;
                let Some(Value::Object(payload)) = args.opt("payload") else {
                    return Err(invalid("record_run_event: `payload` must be an object"));
                };
                let version = args.u64("schema_version")?.unwrap_or(1);
                if !matches!(version, 1 | 2) {
                    return Err(invalid("record_run_event: `schema_version` is 1 or 2"));
                }
                let labels = labels(args)?;
                let mut body = json!({
                    "type": event_type,
                    "run_id": run,
                    "turn_id": args.opt_str("turn_id")?
                        .or_else(|| payload.get("work_item_id").and_then(Value::as_str))
                        .or_else(|| payload.get("parent_work_item_id").and_then(Value::as_str))
                        .unwrap_or(run),
                    "agent_id": agent_of(labels.as_ref()),
                    "versions": {"schema": format!("{event_type}/{version}")},
                    "payload": payload,
                });
                let fence = governed(args, name, version, &mut body)?;
                let headers = keyed(&self.fenced(&base, workspace, fence).await?)?;
                self.send(
                    Method::POST,
                    format!("/v1/bindings/{ws}/runs/events"),
                    &headers,
                    Some(body),
                )
                .await
            }
            "get_run" => {
                let run = args.str("run_id")?;
                let since = args.u64("since_sequence")?.unwrap_or(0);
                let mut path = format!(
                    "/v1/bindings/{ws}/runs/item?run_id={}&after_seq={since}",
                    percent(run)
                );
                if let Some(limit) = args.u64("limit")? {
                    path.push_str(&format!("&limit={limit}"));
                }
                let headers = self.fenced(&base, workspace, None).await?;
                let epoch = headers
                    .get(EPOCH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                match self.v1.call(Method::GET, &path, &headers, None).await {
                    Ok((status, mut read)) if status.is_success() => {
                        read["snapshot_epoch"] = json!(epoch);
                        read["snapshot_last_sequence"] = read["last_seq"].clone();
                        Ok(CallToolResult::structured(read))
                    }
                    Ok((status, read)) => Ok(answer(status, read)),
                    Err(e) => Err(e),
                }
            }
            "complete_run" => {
                let run = args.str("run_id")?;
                let outcome = args.str("outcome")?;
                let correction = args
                    .opt("correction")
                    .map(|v| {
                        v.as_bool()
                            .ok_or_else(|| invalid("complete_run: `correction` must be a boolean"))
                    })
                    .transpose()?
                    .unwrap_or(false);
                let labels = labels(args)?;
                let mut payload = Map::new();
                payload.insert("outcome".into(), json!(outcome));
                for field in ["regression_of_run_id", "reason", "verification_receipt"] {
                    if let Some(v) = args.opt_str(field)? {
                        payload.insert(field.into(), json!(v));
                    }
                }
                let event_type = if correction {
                    "RunOutcomeCorrected"
                } else {
                    "RunCompleted"
                };
                let version = args.u64("schema_version")?.unwrap_or(1);
                if !matches!(version, 1 | 2) {
                    return Err(invalid("complete_run: `schema_version` is 1 or 2"));
                }
                let mut body = json!({
                    "type": event_type,
                    "run_id": run,
                    "turn_id": run,
                    "agent_id": agent_of(labels.as_ref()),
                    "versions": {"schema": format!("{event_type}/{version}")},
                    "payload": payload,
                });
                let fence = governed(args, name, version, &mut body)?;
                let headers = keyed(&self.fenced(&base, workspace, fence).await?)?;
                self.send(
                    Method::POST,
                    format!("/v1/bindings/{ws}/runs/events"),
                    &headers,
                    Some(body),
                )
                .await
            }
            "annotate" => {
                let headers = keyed(&self.fenced(&base, workspace, None).await?)?;
                let body = json!({
                    "type": "memory_annotated",
                    "run_id": crate::domain::ledger::FEEDBACK_RUN,
                    "turn_id": args.str("key")?,
                    "agent_id": "mcp",
                    "payload": {
                        "scope": args.str("scope")?,
                        "key": args.str("key")?,
                        "note": args.str("note")?,
                    },
                });
                self.append_event(&ws, &headers, body, |a| {
                    json!({"annotation": a["event"]["payload"], "replayed": a["replayed"], "seq": a["event"]["seq"]})
                })
                .await
            }
            "feedback" => {
                let headers = keyed(&self.fenced(&base, workspace, None).await?)?;
                let body = json!({
                    "type": "memory_feedback",
                    "run_id": crate::domain::ledger::FEEDBACK_RUN,
                    "turn_id": args.str("memory_id")?,
                    "agent_id": "mcp",
                    "payload": {
                        "receipt": args.str("receipt")?,
                        "memory_id": args.str("memory_id")?,
                        "rank": args.u64("rank")?.ok_or_else(|| invalid("feedback: `rank` is required"))?,
                        "signal": args.str("signal")?,
                    },
                });
                self.append_event(&ws, &headers, body, |a| {
                    json!({"feedback": a["event"]["payload"], "replayed": a["replayed"], "seq": a["event"]["seq"]})
                })
                .await
            }
            "claim_signal" | "extend_signal_lease" | "ack_signal" => {
                let signal_id = args.str("signal_id")?;
                let mut payload = Map::new();
                payload.insert("signal_id".into(), json!(signal_id));
                let event_type = match name {
                    "claim_signal" => {
                        payload.insert("holder".into(), json!(args.str("holder")?));
                        "signal_claimed"
                    }
                    "extend_signal_lease" => "signal_lease_extended",
                    _ => "signal_acked",
                };
                if name != "claim_signal" {
                    let token = args.u64("fencing_token")?.ok_or_else(|| {
                        invalid(format!("{name}: `fencing_token` is required"))
                    })?;
                    payload.insert("fencing_token".into(), json!(token));
                }
                if name != "ack_signal" {
                    let seconds = args.u64("lease_seconds")?.ok_or_else(|| {
                        invalid(format!("{name}: `lease_seconds` is required"))
                    })?;
                    payload.insert("lease_ms".into(), json!(seconds.saturating_mul(1000)));
                }
                let headers = keyed(&self.fenced(&base, workspace, None).await?)?;
                let body = json!({
                    "type": event_type,
                    "run_id": crate::domain::ledger::signal::SIGNAL_RUN,
                    "turn_id": signal_id,
                    "agent_id": "mcp",
                    "payload": payload,
                });
                self.append_event(&ws, &headers, body, |a| {
                    json!({"signal": a["signal"], "replayed": a["replayed"], "seq": a["event"]["seq"]})
                })
                .await
            }
            other => Ok(refusal(json!({
                "code": "unavailable",
                "message": format!("the tool `{other}` is listed but not served by this version yet (docs/mcp.md \"Status\")"),
                "details": {"tool": other},
            }))
            .into()),
        })
    }
}

impl ServerHandler for HarnessMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(
                "Harness Engine: durable runs and governed long-term memory. Every call names its workspace (a binding id). begin_run returns a run_id and a root work_item_id; pass them on every later call (the server keeps no current run).",
            );
        info.server_info = Implementation::new("harness-engine", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let mut result = DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        );
        result.ttl_ms = DISCOVER_TTL_MS;
        result.cache_scope = CacheScope::Public;
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = ListToolsResult::with_all_items((*self.tools).clone());
        result.ttl_ms = Some(0);
        result.cache_scope = Some(CacheScope::Private);
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let empty = JsonObject::new();
        let arguments = request.arguments.as_ref().unwrap_or(&empty);
        let name: Cow<'_, str> = request.name.clone();
        self.dispatch(&name, arguments, &context)
            .await
            .map(Into::into)
    }
}
