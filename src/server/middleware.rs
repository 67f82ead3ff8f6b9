//! Request-wide layers: the deadline, metrics, trace context and the request span, and
//! the safety net that turns any non-JSON error response into the one error shape.

use std::{future::Future, time::Instant};

use axum::{
    body::Body,
    extract::{MatchedPath, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use tracing::Instrument as _;

use super::{
    AppState,
    error::{ApiError, ErrorCode, ErrorMark},
};
use crate::telemetry::{propagation, spans};

/// Reserves the request's body in the server-wide body budget before the body is read,
/// and holds it until the request is answered (`ServerConfig::body_budget_bytes`). A
/// request without a body reserves nothing; one without a `Content-Length` reserves the
/// body limit. Inside the deadline: a request that waits too long answers `504 timeout`.
pub async fn body_budget(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(bytes) = body_reservation(&req, state.config().max_body_bytes) else {
        return next.run(req).await;
    };
    let (budget, units) = state.body_budget();
    let want = u32::try_from(bytes.div_ceil(super::BODY_BUDGET_UNIT))
        .unwrap_or(u32::MAX)
        .clamp(1, units);
    // The semaphore is never closed, so acquiring fails only if it were.
    let _held = budget.acquire_many(want).await.ok();
    next.run(req).await
}

/// How many body bytes a request may bring: its `Content-Length` (bounded by the limit;
/// a larger one is refused when read), the limit for a streamed body, `None` for none.
fn body_reservation(req: &Request, limit: usize) -> Option<usize> {
    let headers = req.headers();
    if let Some(len) = headers.get(axum::http::header::CONTENT_LENGTH) {
        let len: usize = len.to_str().ok()?.trim().parse().ok()?;
        return (len > 0).then_some(len.min(limit));
    }
    headers
        .contains_key(axum::http::header::TRANSFER_ENCODING)
        .then_some(limit)
}

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

/// Trace context and the request span (spec 000 "Propagation"): the caller's
/// `traceparent` is validated and continued, linked or replaced per the configured
/// ingress policy ([`crate::telemetry::propagation`]); then `traceparent`, `tracestate`
/// and `baggage` are removed from the request, so no handler can read them: trace
/// context is correlation only, never input to a decision, and nothing from it is stored.
/// Every request runs inside one `harness.request` span that records the route
/// template, the status and the stable error code, and nothing of the request itself.
pub async fn trace_context(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let headers = req.headers();
    let ingress = propagation::extract(
        |name| headers.get(name).and_then(|v| v.to_str().ok()),
        state.config().trace_ingress,
    );
    for name in ["traceparent", "tracestate", "baggage"] {
        req.headers_mut().remove(name);
    }
    let span = spans::request(req.method().as_str(), &route);
    propagation::apply(&span, &ingress);
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    spans::record_count(&span, spans::keys::HTTP_STATUS, u64::from(status.as_u16()));
    match response.extensions().get::<ErrorMark>() {
        Some(mark) => spans::record_error(&span, mark.code.as_str()),
        None if status.is_client_error() || status.is_server_error() => {
            spans::record_error(&span, ErrorCode::from_status(status).as_str())
        }
        None => spans::record_ok(&span),
    }
    response
}

/// Runs one step of a request inside its span and records the outcome: `ok`, or the
/// stable error code of the [`ApiError`] (never its message).
pub async fn traced<T, E>(
    span: tracing::Span,
    step: impl Future<Output = Result<T, E>>,
) -> Result<T, ApiError>
where
    ApiError: From<E>,
{
    let result = step.instrument(span.clone()).await.map_err(ApiError::from);
    match &result {
        Ok(_) => spans::record_ok(&span),
        Err(e) => spans::record_error(&span, e.code.as_str()),
    }
    result
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
    tracing::error!("a request handler panicked; answered 500 (a defect: please report it)");
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

    fn request(headers: &[(&str, &str)]) -> Request {
        let mut b = axum::http::Request::builder().method("PUT").uri("/v1/x");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap_or_default()
    }

    #[test]
    fn a_body_reserves_its_length_within_the_limit() {
        let limit = 4 << 20;
        assert_eq!(body_reservation(&request(&[]), limit), None, "no body");
        assert_eq!(
            body_reservation(&request(&[("content-length", "0")]), limit),
            None
        );
        assert_eq!(
            body_reservation(&request(&[("content-length", "4096")]), limit),
            Some(4096)
        );
        assert_eq!(
            body_reservation(&request(&[("content-length", "999999999")]), limit),
            Some(limit),
            "a body over the limit is refused when read; it reserves no more than the limit"
        );
        assert_eq!(
            body_reservation(&request(&[("transfer-encoding", "chunked")]), limit),
            Some(limit),
            "a streamed body may bring the whole limit"
        );
    }
}
