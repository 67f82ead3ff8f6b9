//! Request extractors whose every rejection is an [`ApiError`], so no plain-text axum
//! rejection ever reaches a client. Header rules live here: `Authorization`,
//! `Idempotency-Key`, `Harness-Epoch`, `Harness-Lease-Generation`, `Harness-Codec`,
//! `Harness-Subject`, `If-Match` / `If-None-Match`.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Path, Query, Request},
    http::{HeaderMap, header, request::Parts},
};
use serde::de::DeserializeOwned;

use super::middleware::traced;
use super::{
    AppState,
    auth::{AuthError, Caller, valid_subject},
    error::{ApiError, ErrorCode},
};
use crate::{
    domain::ids::BindingId,
    store::PutMode,
    telemetry::spans::{self, Step},
};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const EPOCH: &str = "harness-epoch";
pub const LEASE_GENERATION: &str = "harness-lease-generation";
pub const CODEC: &str = "harness-codec";
pub const SUBJECT: &str = "harness-subject";

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(m) => ApiError::unauthenticated(m),
            AuthError::StaleLease(m) => ApiError::new(ErrorCode::StaleLease, m),
            AuthError::Forbidden(m) => ApiError::forbidden(m),
            AuthError::LeaseNotReady(m) => ApiError::new(ErrorCode::Conflict, m),
            AuthError::Unavailable(m) => {
                tracing::warn!(message = %m, "authentication backend unavailable; answered unavailable");
                let mut err = ApiError::new(
                    ErrorCode::Unavailable,
                    "authentication is unavailable; retry",
                );
                err.retry_after_s = Some(1);
                err
            }
        }
    }
}

/// The one value of a header that must appear at most once. A repeated header is
/// refused, never resolved to its first or last value: a proxy in front may read the
/// other one, and then the two disagree about the request (who is calling, which fence).
pub fn single_header<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a axum::http::HeaderValue>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(repeated_header(name));
    }
    Ok(first)
}

fn repeated_header(name: &str) -> ApiError {
    ApiError::invalid(format!("header {name} must appear at most once"))
        .with_details(serde_json::json!({"header": name}))
}

pub fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match single_header(headers, name)? {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid(format!("header {name} must be visible ASCII"))),
    }
}

/// The authenticated caller (from `Authorization: Bearer <token>`).
pub struct Authenticated(pub Caller);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // spec 000 topology: `authn` under `harness.request`; only the caller's kind is
        // recorded, never the token or the principal's name.
        let span = spans::step(Step::Authn);
        let caller = traced(span.clone(), authenticate(parts, state)).await?;
        let kind = match &caller {
            Caller::Principal { .. } => "principal",
            Caller::Service(_) => "service",
            Caller::Worker(_) => "worker",
        };
        spans::record(&span, spans::keys::CALLER_KIND, kind);
        Ok(Authenticated(caller))
    }
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Caller, ApiError> {
    {
        if parts
            .headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(ApiError::unauthenticated(
                "the Authorization header must appear once",
            ));
        }
        let value = header_str(&parts.headers, header::AUTHORIZATION.as_str())
            .map_err(|_| ApiError::unauthenticated("the Authorization header is malformed"))?
            .ok_or_else(|| {
                ApiError::unauthenticated("an Authorization: Bearer <token> header is required")
            })?;
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => {
                return Err(ApiError::unauthenticated(
                    "the Authorization header must use the Bearer scheme",
                ));
            }
        };
        Ok(state.auth().authenticate(token).await?)
    }
}

/// A validated `Idempotency-Key`: 1 to 255 visible ASCII characters. Only its keyed
/// digest goes further; the raw key is never stored or logged.
pub struct IdempotencyKey(pub String);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let key = header_str(&parts.headers, IDEMPOTENCY_KEY)?.ok_or_else(|| {
            ApiError::invalid("the Idempotency-Key header is required on every mutating call")
        })?;
        if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ApiError::invalid(
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            ));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }
}

pub(super) fn parse_u64_header(
    headers: &HeaderMap,
    name: &str,
    display: &str,
) -> Result<Option<u64>, ApiError> {
    match header_str(headers, name)? {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::invalid(format!("{display} must be a non-negative integer"))),
    }
}

/// The fence a worker call presents: `Harness-Epoch` and `Harness-Lease-Generation`,
/// both required.
pub struct WorkerFence {
    pub epoch: u64,
    pub lease_generation: u64,
}

impl<S: Send + Sync> FromRequestParts<S> for WorkerFence {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let epoch = parse_u64_header(&parts.headers, EPOCH, "Harness-Epoch")?.ok_or_else(|| {
            ApiError::invalid("the Harness-Epoch header is required on worker calls")
        })?;
        let lease_generation =
            parse_u64_header(&parts.headers, LEASE_GENERATION, "Harness-Lease-Generation")?
                .ok_or_else(|| {
                    ApiError::invalid(
                        "the Harness-Lease-Generation header is required on worker calls",
                    )
                })?;
        Ok(WorkerFence {
            epoch,
            lease_generation,
        })
    }
}

/// An optional `Harness-Epoch` (control-plane calls on interrupts).
pub struct OptionalEpoch(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for OptionalEpoch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(OptionalEpoch(parse_u64_header(
            &parts.headers,
            EPOCH,
            "Harness-Epoch",
        )?))
    }
}

/// `Harness-Codec`: the adapter codec and major version, e.g. `langgraph-checkpoint-v1`.
pub struct Codec(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Codec {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match header_str(&parts.headers, CODEC)? {
            None => Ok(Codec(None)),
            Some(c) if valid_codec(c) => Ok(Codec(Some(c.to_owned()))),
            Some(_) => Err(ApiError::invalid(
                "Harness-Codec must be 1 to 64 of [a-z0-9._-]",
            )),
        }
    }
}

pub fn valid_codec(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 64
        && c.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// `Harness-Subject`: the end-user subject a control-plane caller acts for.
pub struct SubjectHeader(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for SubjectHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match header_str(&parts.headers, SUBJECT)? {
            None => Ok(SubjectHeader(None)),
            Some(s) if valid_subject(s) => Ok(SubjectHeader(Some(s.to_owned()))),
            Some(_) => Err(ApiError::invalid(
                "Harness-Subject must be 1 to 256 printable characters",
            )),
        }
    }
}

/// `If-None-Match: *` creates, `If-Match: "<version>"` replaces, neither upserts.
pub struct PutPrecondition(pub PutMode);

impl<S: Send + Sync> FromRequestParts<S> for PutPrecondition {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let if_none = header_str(&parts.headers, header::IF_NONE_MATCH.as_str())?;
        let if_match = header_str(&parts.headers, header::IF_MATCH.as_str())?;
        match (if_none, if_match) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "send either If-None-Match or If-Match, not both",
            )),
            (Some(v), None) if v.trim() == "*" => Ok(PutPrecondition(PutMode::Create)),
            (Some(_), None) => Err(ApiError::invalid("If-None-Match supports only *")),
            (None, Some(v)) => {
                let v = v.trim();
                let v = v.strip_prefix("W/").unwrap_or(v);
                let version = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| {
                        ApiError::invalid("If-Match must be a quoted object version, e.g. \"3\"")
                    })?;
                Ok(PutPrecondition(PutMode::Replace {
                    expected_version: version,
                }))
            }
            (None, None) => Ok(PutPrecondition(PutMode::Upsert)),
        }
    }
}

/// The `{binding_id}` path segment. A malformed id names nothing, so it is `not_found`.
pub struct BindingPath(pub BindingId);

impl<S: Send + Sync> FromRequestParts<S> for BindingPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found("binding"))?;
        let raw = params
            .iter()
            .find(|(k, _)| k == "binding_id")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        BindingId::parse(raw)
            .map(BindingPath)
            .ok_or_else(|| ApiError::not_found("binding"))
    }
}

/// The `{state_id}` path segment.
pub struct StateIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for StateIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found("state"))?;
        let raw = params
            .into_iter()
            .find(|(k, _)| k == "state_id")
            .map(|(_, v)| v)
            .unwrap_or_default();
        if raw.is_empty()
            || raw.len() > 128
            || !raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(ApiError::not_found("state"));
        }
        Ok(StateIdPath(raw))
    }
}

/// A query string, with rejections as `invalid`.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        strict_utf8_query(parts.uri.query().unwrap_or(""))?;
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e| ApiError::invalid(format!("bad query string: {}", e.body_text())))
    }
}

/// Every name and value of a query string must percent-decode to valid UTF-8. The
/// default decoding replaces bad bytes with U+FFFD, so `%FF` and `%FE` would name the
/// same key; here they are refused instead.
pub fn strict_utf8_query(query: &str) -> Result<(), ApiError> {
    for pair in query.split('&') {
        for part in pair.splitn(2, '=') {
            let decoded = percent_decode(part.as_bytes())
                .ok_or_else(|| ApiError::invalid("bad query string: a malformed percent escape"))?;
            if std::str::from_utf8(&decoded).is_err() {
                return Err(ApiError::invalid(
                    "bad query string: names and values must be valid UTF-8 once percent-decoded",
                ));
            }
        }
    }
    Ok(())
}

fn percent_decode(input: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'%' => {
                let hi = input.get(i + 1).copied().and_then(hex)?;
                let lo = input.get(i + 2).copied().and_then(hex)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

fn content_type(req: &Request) -> Result<Option<String>, ApiError> {
    Ok(header_str(req.headers(), header::CONTENT_TYPE.as_str())
        .map_err(|e| ApiError::new(ErrorCode::UnsupportedMediaType, e.message))?
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        }))
}

async fn read_body(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let limit = state.config().max_body_bytes;
    axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::TooLarge,
                format!("the request body exceeds {limit} bytes (or could not be read)"),
            )
            .with_details(serde_json::json!({"what": "request body", "limit": limit}))
        })
}

/// Deepest nesting of arrays and objects a JSON body may have.
pub const MAX_JSON_DEPTH: usize = 32;
/// Most values (scalars, arrays, objects) a JSON body may hold. The largest legitimate
/// bodies are an embedding (a few thousand numbers) and a 64 KiB metadata object; a
/// body within the byte limit could otherwise hold millions of tiny values, each one a
/// tree node in memory before any field limit is checked.
pub const MAX_JSON_VALUES: usize = 32 << 10;

/// Checks the structure of a JSON text in one pass over its bytes, allocating nothing:
/// nesting depth and value count are bounded before a tree is built. Syntax errors are
/// left to the parser, which runs next.
pub fn json_shape(bytes: &[u8], max_depth: usize, max_values: usize) -> Result<(), ApiError> {
    let mut depth = 0usize;
    let mut values = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // A value starts at a scalar's first byte or an opening bracket; count those only
    // outside strings: after `[`, `,` or `:`, or at the start.
    let mut expect_value = true;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => continue,
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Err(too_complex("nesting depth", max_depth));
                }
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                expect_value = false;
                continue;
            }
            b',' | b':' => {
                expect_value = true;
                continue;
            }
            _ => {}
        }
        if expect_value {
            values += 1;
            if values > max_values {
                return Err(too_complex("values", max_values));
            }
        }
        if b == b'"' {
            in_string = true;
        }
        expect_value = matches!(b, b'[' | b'{');
    }
    Ok(())
}

fn too_complex(what: &str, limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::TooLarge,
        format!("the JSON body exceeds {limit} {what}"),
    )
    .with_details(serde_json::json!({"what": format!("JSON {what}"), "limit": limit}))
}

/// A JSON body (`application/json`), bounded by the server's body limit.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        match content_type(&req)?.as_deref() {
            Some("application/json") => {}
            Some(ct) if ct.starts_with("application/") && ct.ends_with("+json") => {}
            _ => {
                return Err(ApiError::new(
                    ErrorCode::UnsupportedMediaType,
                    "the request body must be application/json",
                ));
            }
        }
        let bytes = read_body(req, state).await?;
        json_shape(&bytes, MAX_JSON_DEPTH, MAX_JSON_VALUES)?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
    }
}

/// An opaque body (`application/octet-stream`), bounded by the server's body limit;
/// the store enforces the exact per-kind limits.
pub struct OpaqueBody(pub Bytes);

impl FromRequest<AppState> for OpaqueBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if content_type(&req)?.as_deref() != Some("application/octet-stream") {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the request body must be application/octet-stream",
            ));
        }
        read_body(req, state).await.map(OpaqueBody)
    }
}
