//! The one error shape of the data-plane API: `{code, message, details}`.
//!
//! Every refusal leaves the server in this shape, whether it comes from a store rule,
//! authentication, request validation, an axum extractor, the router (404, 405), the
//! request deadline or a caught panic. Callers branch on `code`; `message` is for people;
//! `details` carries the numbers a client needs to recover (current generation, actual
//! revision, retry delay) and never a secret, a body or a raw subject.

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::{domain::state::Rejection, store::StoreError};

/// Stable error codes. The string form is the contract; the HTTP status follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    StaleLease,
    StaleEpoch,
    RevisionConflict,
    IdempotencyMismatch,
    RunUncertain,
    Conflict,
    SequenceConflict,
    BudgetExceeded,
    EffectConfirmed,
    EffectUnresolved,
    ApprovalRequired,
    ProjectionDegraded,
    Invalid,
    TooLarge,
    RateLimited,
    ForbiddenScope,
    Unauthenticated,
    NotFound,
    MethodNotAllowed,
    UnsupportedMediaType,
    Unavailable,
    Timeout,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::StaleLease => "stale_lease",
            ErrorCode::StaleEpoch => "stale_epoch",
            ErrorCode::RevisionConflict => "revision_conflict",
            ErrorCode::IdempotencyMismatch => "idempotency_mismatch",
            ErrorCode::RunUncertain => "run_uncertain",
            ErrorCode::Conflict => "conflict",
            ErrorCode::SequenceConflict => "sequence_conflict",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::EffectConfirmed => "effect_confirmed",
            ErrorCode::EffectUnresolved => "effect_unresolved",
            ErrorCode::ApprovalRequired => "approval_required",
            ErrorCode::ProjectionDegraded => "projection_degraded",
            ErrorCode::Invalid => "invalid",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::ForbiddenScope => "forbidden_scope",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Internal => "internal",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::StaleLease
            | ErrorCode::StaleEpoch
            | ErrorCode::RevisionConflict
            | ErrorCode::IdempotencyMismatch
            | ErrorCode::RunUncertain
            | ErrorCode::Conflict
            | ErrorCode::SequenceConflict
            | ErrorCode::BudgetExceeded
            | ErrorCode::EffectConfirmed
            | ErrorCode::EffectUnresolved
            | ErrorCode::ApprovalRequired
            | ErrorCode::ProjectionDegraded => StatusCode::CONFLICT,
            ErrorCode::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::ForbiddenScope => StatusCode::FORBIDDEN,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code that goes with a bare status, for responses produced outside our
    /// handlers (router fallbacks, extractor rejections we did not wrap).
    pub fn from_status(status: StatusCode) -> ErrorCode {
        match status.as_u16() {
            401 => ErrorCode::Unauthenticated,
            403 => ErrorCode::ForbiddenScope,
            404 => ErrorCode::NotFound,
            405 => ErrorCode::MethodNotAllowed,
            409 => ErrorCode::Conflict,
            413 => ErrorCode::TooLarge,
            415 => ErrorCode::UnsupportedMediaType,
            429 => ErrorCode::RateLimited,
            503 => ErrorCode::Unavailable,
            504 | 408 => ErrorCode::Timeout,
            400..=499 => ErrorCode::Invalid,
            _ => ErrorCode::Internal,
        }
    }
}

/// The JSON body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable machine-readable code: `stale_lease`, `stale_epoch`, `revision_conflict`,
    /// `idempotency_mismatch`, `run_uncertain`, `conflict`, and on the run ledger
    /// `sequence_conflict`, `budget_exceeded`, `effect_confirmed`, `effect_unresolved`,
    /// `approval_required` (409); `invalid` (422);
    /// `too_large` (413); `rate_limited` (429); `forbidden_scope` (403);
    /// `unauthenticated` (401); `not_found` (404); `method_not_allowed` (405);
    /// `unsupported_media_type` (415); `unavailable` (503: the store failed, retry);
    /// `timeout` (504: the request deadline passed; a write's outcome is unknown, retry
    /// with the same `Idempotency-Key`); `internal` (500).
    #[schema(example = "stale_lease")]
    pub code: String,
    /// A sentence for people; do not parse it.
    pub message: String,
    /// Facts a client needs to recover, e.g. `{"presented": 3, "current": 4}`.
    #[schema(value_type = Object)]
    pub details: Value,
}

/// An error on its way to becoming a response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Value,
    /// Seconds for a `Retry-After` header (rate limits, unavailability).
    pub retry_after_s: Option<u64>,
    /// The store refused or failed: counted by code in the metrics.
    pub from_store: bool,
}

/// Set on error responses, so the metrics layer can count store errors by code.
#[derive(Clone, Copy, Debug)]
pub struct ErrorMark {
    pub code: ErrorCode,
    pub from_store: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: json!({}),
            retry_after_s: None,
            from_store: false,
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Invalid, message)
    }
    pub fn not_found(what: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("{what} not found"))
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::ForbiddenScope, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Unauthenticated, message)
    }
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        let message = r.to_string();
        let (code, details, retry_after_s) = match &r {
            Rejection::StaleLease { presented, current } => (
                ErrorCode::StaleLease,
                json!({"presented": presented, "current": current}),
                None,
            ),
            Rejection::StaleEpoch { presented, current } => (
                ErrorCode::StaleEpoch,
                json!({"presented": presented, "current": current}),
                None,
            ),
            Rejection::RevisionConflict { expected, actual } => (
                ErrorCode::RevisionConflict,
                json!({"expected": expected, "actual": actual}),
                None,
            ),
            Rejection::IdempotencyMismatch => (ErrorCode::IdempotencyMismatch, json!({}), None),
            Rejection::RunUncertain { run_id } => {
                (ErrorCode::RunUncertain, json!({"run_id": run_id}), None)
            }
            Rejection::Conflict { .. } => (ErrorCode::Conflict, json!({}), None),
            Rejection::TooLarge { what, size, limit } => (
                ErrorCode::TooLarge,
                json!({"what": what, "size": size, "limit": limit}),
                None,
            ),
            Rejection::TooMany { what, limit } => (
                ErrorCode::TooLarge,
                json!({"what": what, "limit": limit}),
                None,
            ),
            Rejection::RateLimited { retry_after_ms } => (
                ErrorCode::RateLimited,
                json!({"retry_after_ms": retry_after_ms}),
                Some(retry_after_ms.div_ceil(1000).max(1)),
            ),
            Rejection::Invalid(_) => (ErrorCode::Invalid, json!({}), None),
            Rejection::NotFound(_) => (ErrorCode::NotFound, json!({}), None),
            Rejection::Forbidden(_) => (ErrorCode::ForbiddenScope, json!({}), None),
            Rejection::SequenceConflict { expected, actual } => (
                ErrorCode::SequenceConflict,
                json!({"expected": expected, "actual": actual}),
                None,
            ),
            Rejection::BudgetExceeded { what, limit } => (
                ErrorCode::BudgetExceeded,
                json!({"what": what, "limit": limit}),
                None,
            ),
            Rejection::EffectConfirmed { key } => (
                ErrorCode::EffectConfirmed,
                json!({"idempotency_key": key}),
                None,
            ),
            Rejection::EffectUnresolved { key, status } => (
                ErrorCode::EffectUnresolved,
                json!({"idempotency_key": key, "status": status}),
                None,
            ),
            Rejection::ApprovalRequired { key, tool } => (
                ErrorCode::ApprovalRequired,
                json!({"idempotency_key": key, "tool": tool}),
                None,
            ),
            Rejection::ProjectionDegraded { found, expected } => (
                ErrorCode::ProjectionDegraded,
                json!({"reducer": found, "expected_reducer": expected}),
                None,
            ),
        };
        ApiError {
            code,
            message,
            details,
            retry_after_s,
            from_store: false,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let mut err = match e {
            StoreError::Rejected(r) => ApiError::from(r),
            StoreError::Backend { backend, message } => {
                // The backend's own message can name tables, files or hosts: log it for the
                // operator, give the caller only the code and a retry hint.
                tracing::error!(%backend, %message, "store failed; answered unavailable");
                let mut err = ApiError::new(
                    ErrorCode::Unavailable,
                    "the state store is unavailable; retry the request with the same Idempotency-Key",
                );
                err.retry_after_s = Some(1);
                err
            }
        };
        err.from_store = true;
        err
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mark = ErrorMark {
            code: self.code,
            from_store: self.from_store,
        };
        let body = ErrorBody {
            code: self.code.as_str().to_owned(),
            message: self.message,
            details: self.details,
        };
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.code == ErrorCode::Unauthenticated {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(mark);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_keeps_its_domain_code_and_status() {
        let cases = [
            Rejection::StaleLease {
                presented: 1,
                current: 2,
            },
            Rejection::StaleEpoch {
                presented: 1,
                current: 2,
            },
            Rejection::RevisionConflict {
                expected: 1,
                actual: 2,
            },
            Rejection::IdempotencyMismatch,
            Rejection::RunUncertain { run_id: "r".into() },
            Rejection::Conflict { what: "x".into() },
            Rejection::TooLarge {
                what: "x",
                size: 2,
                limit: 1,
            },
            Rejection::TooMany {
                what: "x",
                limit: 1,
            },
            Rejection::RateLimited {
                retry_after_ms: 1500,
            },
            Rejection::Invalid("x".into()),
            Rejection::NotFound("x".into()),
            Rejection::Forbidden("x".into()),
            Rejection::ProjectionDegraded {
                found: "ledger-reducer/0".into(),
                expected: "ledger-reducer/1".into(),
            },
        ];
        for r in cases {
            let (code, status) = (r.code(), r.http_status());
            let api = ApiError::from(r);
            assert_eq!((api.code.as_str(), api.status().as_u16()), (code, status));
        }
    }

    #[test]
    fn rate_limits_round_retry_after_up() {
        let api = ApiError::from(Rejection::RateLimited {
            retry_after_ms: 1500,
        });
        assert_eq!(api.retry_after_s, Some(2));
        assert_eq!(
            ApiError::from(Rejection::RateLimited { retry_after_ms: 3 }).retry_after_s,
            Some(1)
        );
    }

    #[test]
    fn bare_statuses_map_to_codes() {
        assert_eq!(
            ErrorCode::from_status(StatusCode::METHOD_NOT_ALLOWED),
            ErrorCode::MethodNotAllowed
        );
        assert_eq!(
            ErrorCode::from_status(StatusCode::BAD_REQUEST),
            ErrorCode::Invalid
        );
        assert_eq!(
            ErrorCode::from_status(StatusCode::PAYLOAD_TOO_LARGE),
            ErrorCode::TooLarge
        );
        assert_eq!(
            ErrorCode::from_status(StatusCode::BAD_GATEWAY),
            ErrorCode::Internal
        );
    }

    #[test]
    fn backend_failures_hide_their_detail() {
        let api = ApiError::from(StoreError::backend(
            "sqlite",
            "disk I/O error at /secret/path",
        ));
        assert_eq!(api.code, ErrorCode::Unavailable);
        assert!(!api.message.contains("/secret/path"));
    }
}
