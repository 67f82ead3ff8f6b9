//! The data plane against a hostile client, on a real `harness-engine serve` process:
//! repeated headers, bodies built to be expensive to parse, query strings that are not
//! UTF-8, bodies the OpenAPI document forbids, and requests refused at the HTTP layer.
//! Every refusal must come back in the documented `{code, message, details}` shape and
//! change nothing.

mod api_support;

use api_support::{Api, send, serve};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn a_header_that_must_appear_once_is_refused_when_repeated() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-repeat").await;

    // A valid token first, a bogus one second: a proxy reading the last one and the
    // server reading the first would disagree about who is calling.
    let two_tokens = send(
        api.req(Method::GET, &format!("/v1/bindings/{binding}/state/head"))
            .header("Authorization", "Bearer someone-else-entirely-0123456789")
            .header("Harness-Epoch", e)
            .header("Harness-Lease-Generation", g),
    )
    .await;
    assert_eq!(
        (two_tokens.status, two_tokens.code().as_str()),
        (401, "unauthenticated"),
        "{}",
        String::from_utf8_lossy(&two_tokens.body)
    );

    let cases: [(&str, &str, &str); 4] = [
        ("Harness-Epoch", "Harness-Epoch", "invalid"),
        (
            "Harness-Lease-Generation",
            "Harness-Lease-Generation",
            "invalid",
        ),
        ("Harness-Subject", "Harness-Subject", "invalid"),
        ("Harness-Codec", "Harness-Codec", "invalid"),
    ];
    for (name, _, code) in cases {
        let value = match name {
            "Harness-Epoch" => e.to_string(),
            "Harness-Lease-Generation" => g.to_string(),
            "Harness-Subject" => "user-1".to_owned(),
            _ => "raw-v1".to_owned(),
        };
        let mut req = api.worker(
            Method::GET,
            &format!("/v1/bindings/{binding}/state/head"),
            e,
            g,
        );
        if !matches!(name, "Harness-Epoch" | "Harness-Lease-Generation") {
            req = req.header(name, value.clone());
        }
        let r = send(req.header(name, value)).await;
        assert_eq!(
            (r.status, r.code()),
            (422, code.to_owned()),
            "{name} twice: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["details"]["header"], json!(name.to_lowercase()));
    }

    // Idempotency-Key twice on a write: refused, and nothing is written.
    let r = send(
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/pending"),
            e,
            g,
        )
        .header("Idempotency-Key", "k1")
        .header("Idempotency-Key", "k2")
        .header("Content-Type", "application/octet-stream")
        .body(b"state".to_vec()),
    )
    .await;
    assert_eq!((r.status, r.code().as_str()), (422, "invalid"));

    // Content-Type twice: the body's media type is ambiguous.
    let r = send(
        api.req(Method::POST, "/v1/bindings")
            .header("Idempotency-Key", "bind-ct")
            .header("Content-Type", "application/json")
            .header("Content-Type", "application/octet-stream")
            .body(r#"{"agent_id":"agent-1","conversation_id":"conv-ct"}"#),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (415, "unsupported_media_type"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );

    // Memory calls read their own headers: Harness-Binding twice is refused too.
    let r = send(
        api.req(Method::GET, "/v1/memory/agent/records?key=a")
            .header("Harness-Binding", binding.clone())
            .header("Harness-Binding", binding.clone()),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (422, "invalid"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(
        api.revision(&binding, (e, g)).await,
        0,
        "nothing was written"
    );
}

/// A commit body whose terminal metadata is `count` tiny values, in `depth` nested
/// arrays.
fn many_values_body(state_id: &str, count: usize) -> String {
    let mut zeros = String::with_capacity(count * 2);
    for i in 0..count {
        if i > 0 {
            zeros.push(',');
        }
        zeros.push('0');
    }
    format!(
        r#"{{"state_id":"{state_id}","expected_revision":0,"run_id":"run-x","terminal":{{"outcome":"completed","metadata":{{"v":[{zeros}]}}}}}}"#
    )
}

#[tokio::test]
async fn a_body_of_millions_of_tiny_values_is_refused_before_it_is_parsed() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-values").await;
    let pending = api.write_pending(&binding, (e, g), "w1", b"s").await;
    let state_id = pending.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let commit = |body: String| {
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/commit"),
            e,
            g,
        )
        .header("Idempotency-Key", "c-values")
        .header("Content-Type", "application/json")
        .body(body)
    };
    // 1.5 million values in 3 MiB: within the body limit.
    let r = send(commit(many_values_body(&state_id, 1_500_000))).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (413, "too_large"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["details"]["what"], json!("JSON values"));

    // Nesting deeper than the bound is refused the same way.
    let deep = format!(
        r#"{{"state_id":"{state_id}","expected_revision":0,"run_id":"run-x","terminal":{{"outcome":"completed","metadata":{{"v":{}{}}}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let r = send(commit(deep)).await;
    assert_eq!((r.status, r.code().as_str()), (413, "too_large"));
    assert_eq!(r.json()["details"]["what"], json!("JSON nesting depth"));

    // A modest body still commits.
    let ok = send(commit(many_values_body(&state_id, 1000))).await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
}

#[tokio::test]
async fn query_parameters_must_be_valid_utf8() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-utf8").await;
    let put = |key: &str| {
        api.worker(
            Method::PUT,
            &format!("/v1/bindings/{binding}/objects/item?key={key}"),
            e,
            g,
        )
        .header("Idempotency-Key", format!("put-{key}"))
        .header("Content-Type", "application/octet-stream")
        .body(b"v".to_vec())
    };
    // `%FF` and `%FE` would both decode to U+FFFD and name the same object.
    for key in ["a%FF", "a%FE", "%C3", "%ZZ"] {
        let r = send(put(key)).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (422, "invalid"),
            "key={key}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let get = send(api.worker(
        Method::GET,
        &format!("/v1/bindings/{binding}/objects/item?key=a%EF%BF%BD"),
        e,
        g,
    ))
    .await;
    assert_eq!(get.status, 404, "nothing was stored under U+FFFD");
    // Valid percent-encoded UTF-8 still works.
    let r = send(put("caf%C3%A9")).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[tokio::test]
async fn fields_the_schema_publishes_as_objects_refuse_other_values() {
    let server = serve(&[]);
    let api = Api::new(&server.api, &server.token);
    let (binding, e, g) = api.bound("agent-1", "conv-schema").await;
    let pending = api.write_pending(&binding, (e, g), "w1", b"s").await;
    let state_id = pending.json()["state_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let commit = |body: serde_json::Value| {
        api.worker(
            Method::POST,
            &format!("/v1/bindings/{binding}/state/commit"),
            e,
            g,
        )
        .header("Idempotency-Key", "c-schema")
        .json(&body)
    };
    for metadata in [json!("text"), json!([1, 2]), json!(3), json!(null)] {
        let r = send(commit(
            json!({"state_id": state_id, "expected_revision": 0, "run_id": "r1",
            "terminal": {"outcome": "completed", "metadata": metadata}}),
        ))
        .await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (422, "invalid"),
            "metadata {metadata}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let r = send(commit(json!({"state_id": state_id, "expected_revision": 0, "run_id": "r1",
        "terminal": {"outcome": "interrupted"},
        "interrupt": {"interrupt_id": "i1", "type": "form_input", "allowed_decisions": ["respond"], "body": ["not", "an", "object"]}})))
    .await;
    assert_eq!((r.status, r.code().as_str()), (422, "invalid"));
    assert_eq!(api.revision(&binding, (e, g)).await, 0, "nothing committed");

    // The interrupt is committed properly; a resume whose `response` is not an object
    // is refused and leaves the interrupt pending.
    let ok = send(commit(json!({"state_id": state_id, "expected_revision": 0, "run_id": "r1",
        "terminal": {"outcome": "interrupted"},
        "interrupt": {"interrupt_id": "i1", "type": "form_input", "allowed_decisions": ["respond"], "body": {"q": "?"}}})))
    .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let r = send(
        api.req(
            Method::POST,
            &format!("/v1/bindings/{binding}/interrupt/resume"),
        )
        .header("Idempotency-Key", "res-1")
        .json(
            &json!({"interrupt_id": "i1", "revision": 1, "decision": "respond", "response": "yes"}),
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (422, "invalid"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let still = send(api.req(Method::GET, &format!("/v1/bindings/{binding}/interrupt")))
        .await
        .json();
    assert_eq!(still["interrupt"]["interrupt_id"], json!("i1"));
}

/// Sends `request` as raw bytes on a fresh connection and reads the answer to the end
/// (the server closes after a refusal): (status, content type, body).
fn raw_exchange(api: &str, request: &[u8]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let addr = api
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    stream.write_all(request).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

#[tokio::test]
async fn requests_the_http_parser_refuses_get_the_error_shape() {
    let server = serve(&[]);
    let long_uri = format!("/v1/{}", "a".repeat(70_000));
    let huge_header = "x".repeat(600_000);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "a control byte in a header value",
            b"GET /v1/bindings HTTP/1.1\r\nHost: x\r\nHarness-Subject: a\x01b\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a bare carriage return in a header value",
            b"GET /v1/bindings HTTP/1.1\r\nHost: x\r\nX-Note: a\rb\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a header name with a space",
            b"GET /v1/bindings HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a malformed request line",
            b"GET\x00/v1/bindings HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            400,
        ),
        (
            "an unknown HTTP version",
            b"GET /v1/bindings HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a Content-Length that is not a number",
            b"POST /v1/bindings HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n{}".to_vec(),
            400,
        ),
        (
            "two different Content-Lengths",
            b"POST /v1/bindings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            400,
        ),
        (
            "a URI past the parser's limit",
            format!("GET {long_uri} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(),
            414,
        ),
        (
            "headers past the parser's limit",
            format!("GET /v1/bindings HTTP/1.1\r\nHost: x\r\nX-Big: {huge_header}\r\n\r\n")
                .into_bytes(),
            431,
        ),
    ];
    for (what, request, status) in cases {
        let api = server.api.clone();
        let (got, content_type, body) =
            tokio::task::spawn_blocking(move || raw_exchange(&api, &request))
                .await
                .expect("exchange");
        assert_eq!(got, status, "{what}: {body:?}");
        assert!(
            content_type.starts_with("application/json"),
            "{what}: content type {content_type:?}, body {body:?}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body:?}"));
        let code = if status == 431 || status == 414 || status == 400 {
            "invalid"
        } else {
            "internal"
        };
        assert_eq!(v["code"], code, "{what}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()) && v["details"].is_object(),
            "{what}: {v}"
        );
    }

    // Refusals by the router keep their shape, and a well-formed request on the same
    // server still works.
    let api = Api::new(&server.api, &server.token);
    let r = send(api.req(Method::PATCH, "/v1/bindings")).await;
    assert_eq!(r.status, 405, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.code(), "method_not_allowed");
    let (binding, _, _) = api.bound("agent-1", "conv-parser").await;
    assert!(binding.starts_with("hb_"), "{binding}");
}
