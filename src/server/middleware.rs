//! Request-wide layers: the deadline, metrics, `traceparent` validation, and the safety
//! net that turns any non-JSON error response into the one error shape.

use std::time::Instant;

use axum::{
    body::Body,
    extract::{MatchedPath, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::{
    AppState,
    error::{ApiError, ErrorCode, ErrorMark},
};

/// Cuts a request off at the configured deadline with `504 timeout`. The store call it
/// interrupted may still complete: the caller retries with the same Idempotency-Key.
pub async fn deadline(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limit = state.config().request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            ErrorCode::Timeout,
            format!(
                "the request did not finish within {} ms; retry with the same Idempotency-Key",
                limit.as_millis()
            ),
        )
        .into_response(),
    }
}

/// Request count and latency by route template, method and status class.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(req).await;
    let mark = response.extensions().get::<ErrorMark>().copied();
    state
        .metrics()
        .observe_request(route, method, response.status(), started.elapsed(), mark);
    response
}

/// W3C `traceparent`: kept when well-formed, dropped when not (DESIGN §8: "replace a
/// malformed one"). Trace context is correlation only: nothing reads it for a decision,
/// and nothing from it is stored. OpenTelemetry plugs in here.
pub async fn trace_context(mut req: Request, next: Next) -> Response {
    let valid = req
        .headers()
        .get("traceparent")
        .map(|v| v.to_str().map(valid_traceparent).unwrap_or(false));
    if valid == Some(false) {
        req.headers_mut().remove("traceparent");
    }
    next.run(req).await
}

/// `version-traceid-parentid-flags`, lowercase hex; ids not all zero; version `ff` invalid.
pub fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, parent, flags, rest @ ..] => {
            hex(version, 2)
                && *version != "ff"
                // Version 00 has exactly four fields; later versions may append more.
                && (rest.is_empty() || *version != "00")
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2)
        }
        _ => false,
    }
}

/// Any error response that is not already our JSON shape (router 404/405, a rejection
/// that escaped an extractor) becomes one, keeping its status and headers such as `Allow`.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let code = ErrorCode::from_status(status);
    let message = match code {
        ErrorCode::NotFound => "no such route; see /openapi.json".to_owned(),
        ErrorCode::MethodNotAllowed => {
            "this path does not take that method; see the Allow header".to_owned()
        }
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let (parts, _) = response.into_parts();
    let mut rebuilt = ApiError::new(code, message).into_response();
    *rebuilt.status_mut() = if code.status() == status {
        status
    } else {
        code.status()
    };
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rebuilt.headers_mut().insert(name.clone(), value.clone());
        }
    }
    rebuilt
}

/// The response for a caught panic: a defect, reported without its message.
pub fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    eprintln!("harness-engine: a request handler panicked; answered 500");
    let mut response = ApiError::new(ErrorCode::Internal, "internal error").into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// 404 for paths no route matches.
pub async fn no_route() -> Response {
    let mut response =
        ApiError::new(ErrorCode::NotFound, "no such route; see /openapi.json").into_response();
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_syntax() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        assert!(
            valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"),
            "future versions may add fields"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(!valid_traceparent(bad), "{bad:?}");
        }
    }
}
