//! Traces of a real `serve` process, received by a real OTLP receiver running inside the
//! test: a tonic gRPC `TraceService` and an HTTP/protobuf `/v1/traces` endpoint, both
//! decoding with the `opentelemetry-proto` types what the server's exporter sends. The
//! receivers keep every raw request body, so the canary checks look at the exact bytes
//! that crossed the wire.
//!
//! Spec 000 "Distributed tracing": one causal trace per request graph, the contract span
//! topology, nothing sensitive exported, ingress policy for `traceparent`, and a collector
//! outage that drops telemetry without changing any outcome.

mod api_support;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use api_support::{Api, Serve, send, serve_with_principals_env};
use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::post,
};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, any_value},
};
use prost::Message;
use reqwest::Method;

// ---------------------------------------------------------------------------------------
// The receiver

#[derive(Clone, Default)]
struct Captured {
    raw: Arc<Mutex<Vec<Vec<u8>>>>,
    requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

struct Receiver {
    endpoint: String,
    captured: Captured,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct GrpcTraces(Captured);

#[async_trait::async_trait]
impl TraceService for GrpcTraces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        lock(&self.0.requests).push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps the raw request body, then hands it on unchanged.
async fn capture_raw(State(c): State<Captured>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    lock(&c.raw).push(bytes.to_vec());
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn http_traces(State(c): State<Captured>, body: Bytes) -> Response {
    match ExportTraceServiceRequest::decode(body.as_ref()) {
        Ok(request) => {
            lock(&c.requests).push(request);
            (
                [("content-type", "application/x-protobuf")],
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
                .into_response()
        }
        Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

impl Receiver {
    /// OTLP/gRPC on `listener` (HTTP/2 without TLS, as an in-cluster collector listens).
    fn grpc(listener: tokio::net::TcpListener) -> Self {
        let captured = Captured::default();
        let addr = listener.local_addr().expect("addr");
        let router =
            tonic::service::Routes::new(TraceServiceServer::new(GrpcTraces(captured.clone())))
                .into_axum_router()
                .layer(axum::middleware::from_fn_with_state(
                    captured.clone(),
                    capture_raw,
                ));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Receiver {
            endpoint: format!("http://{addr}"),
            captured,
            task,
        }
    }

    /// OTLP/HTTP with protobuf bodies at `/v1/traces`.
    fn http(listener: tokio::net::TcpListener) -> Self {
        let captured = Captured::default();
        let addr = listener.local_addr().expect("addr");
        let router = Router::new()
            .route("/v1/traces", post(http_traces))
            .layer(axum::middleware::from_fn_with_state(
                captured.clone(),
                capture_raw,
            ))
            .with_state(captured.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Receiver {
            endpoint: format!("http://{addr}"),
            captured,
            task,
        }
    }

    fn spans(&self) -> Vec<Got> {
        let requests = lock(&self.captured.requests);
        let mut out = Vec::new();
        for request in requests.iter() {
            for rs in &request.resource_spans {
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        out.push(Got {
                            name: s.name.clone(),
                            trace: hex::encode(&s.trace_id),
                            id: hex::encode(&s.span_id),
                            parent: hex::encode(&s.parent_span_id),
                            kind: s.kind,
                            start: s.start_time_unix_nano,
                            end: s.end_time_unix_nano,
                            attrs: s
                                .attributes
                                .iter()
                                .map(|kv| (kv.key.clone(), value_text(kv.value.as_ref())))
                                .collect(),
                            events: s.events.iter().map(|e| e.name.clone()).collect(),
                            links: s.links.iter().map(|l| hex::encode(&l.trace_id)).collect(),
                            trace_state: s.trace_state.clone(),
                        });
                    }
                }
            }
        }
        out.sort_by_key(|s| s.start);
        out
    }

    fn raw_bytes(&self) -> Vec<Vec<u8>> {
        lock(&self.captured.raw).clone()
    }

    fn resource_keys(&self) -> Vec<String> {
        let requests = lock(&self.captured.requests);
        let mut keys: Vec<String> = requests
            .iter()
            .flat_map(|r| r.resource_spans.iter())
            .flat_map(|rs| rs.resource.iter())
            .flat_map(|res| res.attributes.iter().map(|kv| kv.key.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Waits until `pred` holds of the spans received (or panics after 30 s).
    async fn wait_for(&self, what: &str, pred: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; got {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn value_text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// One received span, flattened.
#[derive(Clone, Debug)]
struct Got {
    name: String,
    trace: String,
    id: String,
    parent: String,
    kind: i32,
    start: u64,
    end: u64,
    attrs: BTreeMap<String, String>,
    events: Vec<String>,
    links: Vec<String>,
    trace_state: String,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

/// The spans under `parent`, in start order.
fn children<'a>(spans: &'a [Got], parent: &str) -> Vec<&'a Got> {
    spans.iter().filter(|s| s.parent == parent).collect()
}

fn names(spans: &[&Got]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

/// A readable tree of the spans under `root_parent` (used for docs/telemetry.md).
fn tree(spans: &[Got], root_parent: &str) -> String {
    fn walk(spans: &[Got], parent: &str, prefix: &str, out: &mut String) {
        let kids = children(spans, parent);
        for (i, s) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let attrs: Vec<String> = s
                .attrs
                .iter()
                .filter(|(k, _)| k.as_str() != "busy_ns")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.push_str(&format!(
                "{prefix}{}{} ({} us) {}\n",
                if last { "└── " } else { "├── " },
                s.name,
                s.end.saturating_sub(s.start) / 1000,
                attrs.join(" ")
            ));
            let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
            walk(spans, &s.id, &deeper, out);
        }
    }
    let mut out = String::new();
    walk(spans, root_parent, "", &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// The server under test

const CANARY_SUBJECT: &str = "user:canary-subject-5b1e@example.com";
const CANARY_TOKEN: &str = "canary-token-91c4d0e2a7";
const CANARY_PRINCIPAL: &str = "canary-principal";

/// Every canary contains this; no exported byte may.
const CANARY: &[u8] = b"canary";

async fn free_listener() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port")
}

fn otel_env(endpoint: &str, protocol: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("OTEL_SERVICE_NAME", "harness-engine-test".to_owned()),
    ]
}

fn start(args: &[&str], envs: &[(&'static str, String)]) -> (Serve, Api) {
    // Every agent gets long-term memory (the canary turn writes and searches it).
    let policy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/memory_policy_all_agents.yaml"
    );
    let mut args = args.to_vec();
    args.extend_from_slice(&["--memory-policy", policy]);
    let server = serve_with_principals_env(
        &[(CANARY_PRINCIPAL, CANARY_TOKEN, &[CANARY_SUBJECT])],
        &args,
        envs,
    );
    let api = Api::new(&server.api, &server.token);
    (server, api)
}

fn traceparent(trace: &str, parent: &str) -> String {
    format!("00-{trace}-{parent}-01")
}

/// Every header a client could use to smuggle data into telemetry, with canaries.
fn with_context(req: reqwest::RequestBuilder, tp: &str) -> reqwest::RequestBuilder {
    req.header("traceparent", tp)
        .header("tracestate", "canary=canarytracestate,vendor=ok")
        .header(
            "baggage",
            "canary.user=canary-baggage-value,enduser.id=canary-user",
        )
        .header("Harness-Subject", CANARY_SUBJECT)
}

struct Turn {
    binding: String,
    state_id: String,
}

/// bind, load head, pending write (and its retry), commit, every request carrying `tp`.
async fn one_turn(api: &Api, tp: &str) -> Turn {
    let bind = send(with_context(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "canary-idem-bind")
            .json(&serde_json::json!({
                "agent_id": "canary-agent",
                "conversation_id": "canary-conversation-8d2f",
                "harness": "deepagents"
            })),
        tp,
    ))
    .await;
    assert_eq!(bind.status, 201, "{}", String::from_utf8_lossy(&bind.body));
    let binding = bind.json()["binding_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let worker = |m: Method, path: String| {
        with_context(
            api.req(m, &path)
                .header("Harness-Epoch", 0)
                .header("Harness-Lease-Generation", 1),
            tp,
        )
    };
    let head = send(worker(
        Method::GET,
        format!("/v1/bindings/{binding}/state/head"),
    ))
    .await;
    assert_eq!(head.status, 200);
    let checkpoint =
        b"canary-checkpoint: user prompt 'canary-prompt tell me the launch code'".to_vec();
    let pending = || {
        worker(
            Method::POST,
            format!("/v1/bindings/{binding}/state/pending"),
        )
        .header("Idempotency-Key", "canary-idem-pending-1")
        .header("Content-Type", "application/octet-stream")
        .body(checkpoint.clone())
    };
    let first = send(pending()).await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    // A client retry with the same key: a sibling request in the same trace.
    let retry = send(pending()).await;
    assert_eq!(retry.status, 201);
    let state_id = first.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let commit = send(
        worker(Method::POST, format!("/v1/bindings/{binding}/state/commit"))
            .header("Idempotency-Key", "canary-idem-commit-1")
            .json(&serde_json::json!({
                "state_id": state_id,
                "expected_revision": 0,
                "run_id": "canary-run-3c9e",
                "terminal": {"outcome": "completed", "metadata": {"summary": "canary-metadata"}}
            })),
    )
    .await;
    assert_eq!(
        commit.status,
        200,
        "{}",
        String::from_utf8_lossy(&commit.body)
    );
    // Long-term memory in the same turn: write one, then search.
    let memory = |m: Method, path: &str| {
        with_context(api.req(m, path).header("Harness-Binding", &binding), tp)
    };
    let put = send(
        memory(Method::PUT, "/v1/memory/user/records")
            .header("Idempotency-Key", "canary-idem-memory-1")
            .json(&serde_json::json!({
                "key": "prefs/canary-key",
                "kind": "semantic",
                "content": "canary-memory-body: the user drinks oolong tea",
                "run_id": "canary-run-3c9e",
            })),
    )
    .await;
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let found = send(
        memory(Method::POST, "/v1/memory/search")
            .json(&serde_json::json!({"query": "oolong tea canary-query"})),
    )
    .await;
    assert_eq!(
        found.status,
        200,
        "{}",
        String::from_utf8_lossy(&found.body)
    );
    assert_eq!(
        found.json()["results"][0]["record"]["key"],
        "prefs/canary-key",
        "the search finds the memory"
    );
    Turn { binding, state_id }
}

/// The children each request of [`one_turn`] must have, in order.
fn expected_turn() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "/v1/bindings",
            vec!["authn", "authz.agent", "session.binding"],
        ),
        (
            "/v1/bindings/{binding_id}/state/head",
            vec!["authn", "authz.agent", "thread_state.load"],
        ),
        (
            "/v1/bindings/{binding_id}/state/pending",
            vec!["authn", "authz.agent", "thread_state.write"],
        ),
        (
            "/v1/bindings/{binding_id}/state/pending",
            vec!["authn", "authz.agent", "thread_state.write"],
        ),
        (
            "/v1/bindings/{binding_id}/state/commit",
            vec!["authn", "authz.agent", "thread_state.commit"],
        ),
        (
            "/v1/memory/{scope}/records",
            vec!["authn", "authz.agent", "memory.write"],
        ),
        (
            "/v1/memory/search",
            vec!["authn", "authz.agent", "memory.read"],
        ),
    ]
}

fn assert_no_canary(receiver: &Receiver) {
    let raw = receiver.raw_bytes();
    assert!(!raw.is_empty(), "the receiver got no export request");
    for (i, body) in raw.iter().enumerate() {
        if let Some(at) = body.windows(CANARY.len()).position(|w| w == CANARY) {
            let from = at.saturating_sub(40);
            let to = (at + 60).min(body.len());
            panic!(
                "export request {i} carries a canary: {:?}",
                String::from_utf8_lossy(&body[from..to])
            );
        }
    }
}

async fn metrics(server: &Serve) -> String {
    let r = send(api_support::client().get(format!("{}/metrics", server.admin))).await;
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

// ---------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_is_one_trace_with_the_contract_shape_over_grpc() {
    let receiver = Receiver::grpc(free_listener().await);
    let (server, api) = start(&[], &otel_env(&receiver.endpoint, "grpc"));
    assert!(
        server
            .banner
            .lines
            .iter()
            .any(|l| l.starts_with("telemetry: exporting traces to") && l.contains("grpc")),
        "{:?}",
        server.banner.lines
    );

    // The caller's run span: every request of the turn is its child.
    let trace = "5c1f7e0a9b3d4c2e8f6a1b0c9d8e7f60";
    let run_span = "a1b2c3d4e5f60718";
    let turn = one_turn(&api, &traceparent(trace, run_span)).await;

    let expected = expected_turn();
    let want_spans: usize = expected.iter().map(|(_, kids)| 1 + kids.len()).sum();
    let spans = receiver
        .wait_for("the whole turn", |s| {
            s.iter().filter(|s| s.trace == trace).count() >= want_spans
        })
        .await;

    let in_trace: Vec<Got> = spans.iter().filter(|s| s.trace == trace).cloned().collect();
    assert_eq!(
        in_trace.len(),
        want_spans,
        "exactly the turn's spans: {in_trace:#?}"
    );
    // Requests: children of the caller's span, in order, each with its exact children.
    let requests = children(&in_trace, run_span);
    assert_eq!(
        requests
            .iter()
            .map(|r| r.attr("http.route").unwrap_or_default().to_owned())
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(route, _)| (*route).to_owned())
            .collect::<Vec<_>>()
    );
    for (request, (route, kids)) in requests.iter().zip(&expected) {
        assert_eq!(request.name, "harness.request");
        assert_eq!(request.kind, 2, "SPAN_KIND_SERVER");
        assert_eq!(request.attr("harness.trace_ingress"), Some("continued"));
        assert_eq!(request.attr("harness.outcome"), Some("ok"), "{route}");
        assert_eq!(
            names(&children(&in_trace, &request.id)),
            kids.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>(),
            "children of {route}"
        );
        for child in children(&in_trace, &request.id) {
            assert!(
                children(&in_trace, &child.id).is_empty(),
                "{} has children",
                child.name
            );
            assert_eq!(child.attr("harness.outcome"), Some("ok"), "{}", child.name);
            assert!(child.start >= request.start && child.end <= request.end);
        }
        assert!(request.trace_state.is_empty(), "tracestate is not exported");
    }
    // The step spans carry the keyed binding id, sizes and revisions: what an operator
    // needs, and nothing of the request.
    let step = |name: &str| {
        in_trace
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    let commit = &step("thread_state.commit")[0];
    assert_eq!(
        commit.attr("harness.binding.id"),
        Some(turn.binding.as_str())
    );
    assert_eq!(commit.attr("harness.revision"), Some("1"));
    assert_eq!(commit.attr("harness.lease.generation"), Some("1"));
    assert_eq!(commit.attr("harness.operation"), Some("state.commit"));
    let write = &step("thread_state.write")[0];
    assert!(write.attr("harness.size_bytes").is_some());
    assert_eq!(
        step("authn")[0].attr("harness.caller.kind"),
        Some("principal")
    );
    let memory_write = &step("memory.write")[0];
    assert_eq!(memory_write.attr("harness.operation"), Some("memory.put"));
    assert_eq!(memory_write.attr("harness.created"), Some("true"));
    assert_eq!(
        memory_write.attr("harness.binding.id"),
        Some(turn.binding.as_str())
    );
    let memory_read = &step("memory.read")[0];
    assert_eq!(memory_read.attr("harness.operation"), Some("memory.search"));
    assert_eq!(memory_read.attr("harness.count"), Some("1"));
    assert_eq!(
        step("session.binding")[0].attr("harness.created"),
        Some("true")
    );
    assert!(!turn.state_id.is_empty());

    // A refused commit: the stable code on the step and on the request, nothing else.
    let conflict_trace = "6d2e8f1b0c4a5d3f9e7b2c1d0a9f8e71";
    let conflict = send(
        with_context(
            api.req(
                Method::POST,
                &format!("/v1/bindings/{}/state/commit", turn.binding),
            )
            .header("Harness-Epoch", 0)
            .header("Harness-Lease-Generation", 1),
            &traceparent(conflict_trace, run_span),
        )
        .header("Idempotency-Key", "canary-idem-commit-stale")
        .json(&serde_json::json!({
            "state_id": turn.state_id,
            "expected_revision": 0,
            "run_id": "canary-run-stale",
        })),
    )
    .await;
    assert_eq!(
        (conflict.status, conflict.code().as_str()),
        (409, "revision_conflict")
    );
    let spans = receiver
        .wait_for("the refused commit", |s| {
            s.iter().filter(|s| s.trace == conflict_trace).count() >= 4
        })
        .await;
    let refused: Vec<&Got> = spans.iter().filter(|s| s.trace == conflict_trace).collect();
    let request = refused
        .iter()
        .find(|s| s.name == "harness.request")
        .expect("request span");
    assert_eq!(request.attr("error.type"), Some("revision_conflict"));
    assert_eq!(request.attr("http.response.status_code"), Some("409"));
    let commit = refused
        .iter()
        .find(|s| s.name == "thread_state.commit")
        .expect("commit span");
    assert_eq!(
        (commit.attr("harness.outcome"), commit.attr("error.type")),
        (Some("error"), Some("revision_conflict"))
    );

    // Only allowlisted keys reached the receiver.
    let allowed: Vec<&str> = harness_engine::telemetry::allowlist::ATTRIBUTES
        .iter()
        .map(|a| a.key)
        .collect();
    for s in &spans {
        for key in s.attrs.keys() {
            assert!(
                allowed.contains(&key.as_str()),
                "{key} exported on {}",
                s.name
            );
        }
    }
    for key in receiver.resource_keys() {
        assert!(allowed.contains(&key.as_str()), "resource {key} exported");
    }
    assert_no_canary(&receiver);

    println!(
        "trace {trace}, parent (the caller's harness.run) {run_span}:\n{}",
        tree(&in_trace, run_span)
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_trace_context_is_replaced_and_a_valid_one_continued_over_http() {
    let receiver = Receiver::http(free_listener().await);
    let (server, api) = start(&[], &otel_env(&receiver.endpoint, "http/protobuf"));
    let good_trace = "0af7651916cd43dd8448eb211c80319c";
    let good = traceparent(good_trace, "b7ad6b7169203331");
    let malformed = [
        "canary-not-a-traceparent",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-canary",
    ];
    for tp in malformed.iter().copied().chain([good.as_str()]) {
        let r = send(
            api.req(
                Method::GET,
                "/v1/bindings/hb_00000000000000000000000000000000",
            )
            .header("traceparent", tp)
            .header("Harness-Subject", CANARY_SUBJECT),
        )
        .await;
        assert_eq!(r.status, 404, "trace context changes no outcome ({tp})");
    }
    // Trace context never authorizes: a valid one without credentials is still 401.
    let r = send(
        api_support::client()
            .get(format!(
                "{}/v1/bindings/hb_00000000000000000000000000000000",
                server.api
            ))
            .header("traceparent", &good),
    )
    .await;
    assert_eq!(r.status, 401);

    let spans = receiver
        .wait_for("8 request spans", |s| {
            s.iter().filter(|s| s.name == "harness.request").count() >= 8
        })
        .await;
    let requests: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "harness.request")
        .collect();
    assert_eq!(requests.len(), 8);
    for (i, r) in requests.iter().take(malformed.len()).enumerate() {
        assert_eq!(r.parent, "", "malformed #{i} starts a new root");
        assert_ne!(r.trace, good_trace);
        assert_eq!(r.attr("harness.trace_ingress"), Some("replaced"));
        assert_eq!(r.events, vec!["harness.trace_context_replaced".to_owned()]);
        assert_eq!(r.attr("error.type"), Some("not_found"));
    }
    let distinct: std::collections::BTreeSet<&str> = requests[..malformed.len()]
        .iter()
        .map(|r| r.trace.as_str())
        .collect();
    assert_eq!(
        distinct.len(),
        malformed.len(),
        "each replacement is a new trace"
    );
    let continued = requests[malformed.len()];
    assert_eq!(
        (continued.trace.as_str(), continued.parent.as_str()),
        (good_trace, "b7ad6b7169203331")
    );
    assert_eq!(continued.attr("harness.trace_ingress"), Some("continued"));
    let unauthenticated = requests[malformed.len() + 1];
    assert_eq!(unauthenticated.trace, good_trace);
    assert_eq!(unauthenticated.attr("error.type"), Some("unauthenticated"));
    assert_eq!(
        names(&children(&spans, &unauthenticated.id)),
        vec!["authn".to_owned()]
    );
    assert_no_canary(&receiver);

    let text = metrics(&server).await;
    assert_eq!(
        sample(
            &text,
            "harness_engine_trace_context_ingress_total{result=\"replaced\"}"
        ),
        Some(malformed.len() as f64),
        "{text}"
    );
    drop(server);

    // Policy `restart`: a valid context is not continued, only linked.
    let receiver = Receiver::http(free_listener().await);
    let (server, api) = start(
        &["--trace-ingress", "restart"],
        &otel_env(&receiver.endpoint, "http/protobuf"),
    );
    let r = send(
        api.req(
            Method::GET,
            "/v1/bindings/hb_00000000000000000000000000000000",
        )
        .header("traceparent", &good),
    )
    .await;
    assert_eq!(r.status, 404);
    let spans = receiver
        .wait_for("the restarted request", |s| {
            s.iter().any(|s| s.name == "harness.request")
        })
        .await;
    let request = spans
        .iter()
        .find(|s| s.name == "harness.request")
        .expect("request span");
    assert_eq!(request.parent, "");
    assert_ne!(request.trace, good_trace);
    assert_eq!(request.links, vec![good_trace.to_owned()]);
    assert_eq!(request.attr("harness.trace_ingress"), Some("restarted"));
    drop(server);
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_outage_drops_spans_and_changes_no_outcome() {
    // A port nobody listens on, for the whole run.
    let dead = free_listener().await;
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let queue = 64usize;
    let mut env = otel_env(&format!("http://{dead_addr}"), "grpc");
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", queue.to_string()));
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "20".to_owned()));
    env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "500".to_owned()));
    let (server, api) = start(&[], &env);
    let pid = server.pid();

    let (binding, epoch, generation) = api.bound("agent-outage", "conv-outage").await;
    let fence = (epoch, generation);
    let turns = 400u64;
    let mut max_queue = 0f64;
    let mut rss_after_warmup = 0;
    for n in 0..turns {
        let revision = api
            .turn(
                &binding,
                fence,
                format!("body {n}").as_bytes(),
                n,
                &format!("run-{n}"),
            )
            .await;
        assert_eq!(revision, n + 1, "every turn commits");
        if n % 50 == 0 {
            let text = metrics(&server).await;
            if let Some(q) = sample(&text, "harness_engine_telemetry_queue_spans") {
                max_queue = max_queue.max(q);
            }
        }
        if n == 50 {
            rss_after_warmup = rss_kib(pid);
        }
    }
    let rss_end = rss_kib(pid);
    let text = metrics(&server).await;
    let dropped_failed = sample(
        &text,
        "harness_engine_telemetry_spans_dropped_total{reason=\"export_failed\"}",
    )
    .unwrap_or(0.0);
    let dropped_full = sample(
        &text,
        "harness_engine_telemetry_spans_dropped_total{reason=\"queue_full\"}",
    )
    .unwrap_or(0.0);
    println!(
        "outage: {turns} turns; spans dropped: {dropped_failed} export_failed, {dropped_full} queue_full; \
         max queue seen {max_queue} (bound {queue}); RSS {rss_after_warmup} KiB after 50 turns, {rss_end} KiB after {turns}"
    );
    assert!(dropped_failed + dropped_full > 0.0, "{text}");
    assert!(
        max_queue <= queue as f64,
        "queue above its bound: {max_queue}"
    );
    assert_eq!(
        sample(&text, "harness_engine_telemetry_exporter_healthy"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "harness_engine_telemetry_spans_exported_total"),
        Some(0.0)
    );
    // Bounded queue: memory does not grow with the spans produced (here ~5,000). The
    // margin is generous: it catches an unbounded queue (tens of MiB), not allocator noise.
    assert!(
        rss_end < rss_after_warmup + 32 * 1024,
        "RSS grew from {rss_after_warmup} KiB to {rss_end} KiB"
    );
    let ready = send(api_support::client().get(format!("{}/ready", server.admin))).await;
    assert_eq!(
        ready.status, 200,
        "an outage never makes the server unready"
    );
    assert_eq!(ready.json()["telemetry"], "degraded");

    // The collector comes back on the same address: exports resume, health recovers.
    let listener = tokio::net::TcpListener::bind(dead_addr)
        .await
        .expect("rebind the collector address");
    let receiver = Receiver::grpc(listener);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for n in 0.. {
        let expected = api.revision(&binding, fence).await;
        api.turn(
            &binding,
            fence,
            b"after",
            expected,
            &format!("run-after-{n}"),
        )
        .await;
        let text = metrics(&server).await;
        if sample(&text, "harness_engine_telemetry_exporter_healthy") == Some(1.0)
            && !receiver.spans().is_empty()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "exports never resumed: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = send(api_support::client().get(format!("{}/ready", server.admin))).await;
    assert_eq!(ready.json()["telemetry"], "ok");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_no_exporter_is_built() {
    let (server, api) = start(&[], &[]);
    assert!(
        server
            .banner
            .lines
            .iter()
            .any(|l| l.starts_with("telemetry: off")),
        "{:?}",
        server.banner.lines
    );
    let (binding, e, g) = api.bound("agent-off", "conv-off").await;
    api.turn(&binding, (e, g), b"body", 0, "run-off").await;
    let text = metrics(&server).await;
    assert_eq!(sample(&text, "harness_engine_telemetry_enabled"), Some(0.0));
    let ready = send(api_support::client().get(format!("{}/ready", server.admin))).await;
    assert_eq!(ready.json()["telemetry"], "disabled");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_flushes_queued_spans() {
    let receiver = Receiver::http(free_listener().await);
    let mut env = otel_env(&receiver.endpoint, "http/protobuf");
    // Batches would wait a minute: only the stop can deliver them in time.
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "60000".to_owned()));
    let (server, api) = start(&[], &env);
    let (binding, e, g) = api.bound("agent-stop", "conv-stop").await;
    api.turn(&binding, (e, g), b"body", 0, "run-stop").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.spans().is_empty(),
        "nothing exported before the stop"
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let spans = receiver
        .wait_for("the flushed spans", |s| {
            s.iter().filter(|s| s.name == "harness.request").count() >= 3
        })
        .await;
    assert!(spans.iter().any(|s| s.name == "thread_state.commit"));
    drop(server);
}
