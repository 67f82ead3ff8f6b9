//! The `/v1` handlers. Each one: authenticate, authorize the binding, derive the scope,
//! call one store operation, shape the answer. No handler holds state of its own.

use axum::{
    Json,
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    AppState,
    auth::BindingVerb,
    authz::{self, WorkerAccess},
    dto::*,
    error::ApiError,
    extract::{
        ApiJson, ApiQuery, Authenticated, BindingPath, IdempotencyKey, OpaqueBody, OptionalEpoch,
        PutPrecondition, StateIdPath, SubjectHeader,
    },
    middleware::traced,
};
use crate::{
    domain::ids::BindingId,
    telemetry::spans::{self, Step, keys},
};
use crate::{
    domain::state::{CommitRequest, PendingInterrupt, ResumeRequest, RunTerminal, check_key},
    store::{NewEntry, ObjectQuery, now_ms},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(bind))
        .routes(routes!(get_binding))
        .routes(routes!(load_head))
        .routes(routes!(read_state))
        .routes(routes!(write_pending))
        .routes(routes!(commit))
        .routes(routes!(commit_inline))
        .routes(routes!(mark_uncertain))
        .routes(routes!(get_object, put_object))
        .routes(routes!(list_objects, delete_objects))
        .routes(routes!(append_entries, load_entries))
        .routes(routes!(list_streams, delete_stream))
        .routes(routes!(get_interrupt))
        .routes(routes!(resume_interrupt))
        .routes(routes!(reconcile_uncertain))
        .merge(super::memory_routes::router())
}

// ---------------------------------------------------------------------------------------
// Parameter documentation. The extractors in `extract` read these headers; the structs
// below only describe them to the OpenAPI document.

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct BindingIdParam {
    /// Binding id (`hb_` and 32 hex digits).
    #[param(pattern = "^hb_[0-9a-f]{32}$")]
    binding_id: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct IdempotencyHeader {
    /// Client-chosen key, 1 to 255 visible ASCII characters. A retry with the same key
    /// and the same request returns the first result; only a keyed digest is stored.
    #[param(rename = "Idempotency-Key", pattern = "^[!-~]{1,255}$")]
    key: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct FenceHeaders {
    /// The conversation epoch the worker runs in.
    #[param(rename = "Harness-Epoch", minimum = 0, example = 0)]
    epoch: u64,
    /// The lease generation the worker holds.
    #[param(rename = "Harness-Lease-Generation", minimum = 0, example = 1)]
    lease_generation: u64,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct CodecHeader {
    /// Adapter codec and major version (default: the binding's harness default).
    #[param(
        rename = "Harness-Codec",
        pattern = "^[a-z0-9._-]{1,64}$",
        nullable = false
    )]
    codec: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct SubjectParam {
    /// End-user subject the caller acts for. `serve`: one of the principal's subjects
    /// (default: any of them; for a bind, the only one). Kubernetes: needs `impersonate`
    /// on `users` (default: the caller's own ServiceAccount user).
    #[param(
        rename = "Harness-Subject",
        min_length = 1,
        max_length = 256,
        nullable = false
    )]
    subject: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct OptionalEpochHeader {
    /// Epoch the caller expects (default: the binding's current epoch).
    #[param(rename = "Harness-Epoch", minimum = 0, nullable = false)]
    epoch: Option<u64>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct PutPreconditionHeaders {
    /// `*`: create only (an identical body under the key is an idempotent retry).
    #[param(rename = "If-None-Match", nullable = false)]
    if_none_match: Option<String>,
    /// `"<version>"`: replace only that version.
    #[param(rename = "If-Match", nullable = false)]
    if_match: Option<String>,
}

/// Marker for opaque bodies in the document.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)]
struct OpaqueBytes(Vec<u8>);

fn octet_stream(bytes: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        bytes,
    )
        .into_response()
}

/// A step span under `harness.request`, with its operation and binding (a keyed digest).
fn step_span(step: Step, operation: &'static str, binding: &BindingId) -> tracing::Span {
    let span = spans::operation(step, operation);
    spans::record(&span, keys::BINDING_ID, binding.as_str());
    span
}

fn page_limit(state: &AppState, limit: Option<u32>) -> Result<usize, ApiError> {
    let max = state.config().limits.max_page;
    match limit {
        None => Ok(max),
        Some(0) => Err(ApiError::invalid("limit must be at least 1")),
        Some(n) => Ok((n as usize).min(max)),
    }
}

fn key_rule(state: &AppState, what: &'static str, key: &str) -> Result<(), ApiError> {
    check_key(what, key, state.config().limits.max_key_bytes).map_err(ApiError::from)
}

/// Agent and conversation ids: the HarnessBinding CRD's pattern, so every binding can be
/// mirrored into Kubernetes.
fn check_id(what: &str, id: &str, max: usize) -> Result<(), ApiError> {
    let bytes = id.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= max
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{what} must be 1 to {max} of [A-Za-z0-9._:-], starting and ending alphanumeric"
        )))
    }
}

// ---------------------------------------------------------------------------------------
// Bindings

/// Create or get the binding of (subject, agent, conversation).
///
/// Idempotent by nature: the binding id is a keyed digest of environment, subject, agent
/// and conversation, so a repeat returns the same binding (200) instead of creating one (201).
///
/// Operator mode (a control-plane ServiceAccount; docs/operator.md, "Binding through the
/// data plane"): the bind also creates or returns the conversation's `HarnessBinding` in
/// the caller's namespace (named after the binding id, so retries and replicas agree;
/// 201 when this call created it) and answers with it in `harness_binding`. A new one
/// needs `sandbox_profile`; a missing, disabled or unsuitable profile or memory policy is
/// 422 `invalid` and nothing is created. A hibernated binding is asked to resume.
#[utoipa::path(post, path = "/v1/bindings", tag = "bindings",
    params(IdempotencyHeader, SubjectParam),
    request_body = BindRequest,
    responses(
        (status = 201, description = "Created", body = Binding),
        (status = 200, description = "Already existed", body = Binding),
    ))]
async fn bind(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    _key: IdempotencyKey,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<BindRequest>,
) -> Result<(StatusCode, Json<Binding>), ApiError> {
    check_id("agent_id", &req.agent_id, 128)?;
    check_id("conversation_id", &req.conversation_id, 256)?;
    super::binding_objects::check_references(&req)?;
    let subject = authz::bind_subject(&state, &caller, named).await?;
    let status = |created: bool| {
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        }
    };
    if let Some(objects) = state.binding_objects() {
        let (created, body) =
            super::binding_objects::bind(&state, objects, &caller, &subject, req).await?;
        return Ok((status(created), Json(body)));
    }
    let keyring = state.keyring();
    let record = crate::domain::state::BindingRecord {
        binding_id: keyring.binding_id(&subject, &req.agent_id, &req.conversation_id),
        environment: keyring.environment().to_owned(),
        owner: keyring.subject_ref(&subject),
        agent_id: req.agent_id,
        conversation_id: req.conversation_id,
        harness: req.harness.as_str().to_owned(),
        epoch: 0,
        // The first lease; in `serve` mode nothing replaces workers, so it stays 1.
        lease_generation: 1,
        created_at_ms: now_ms(),
    };
    let span = step_span(Step::SessionBinding, "binding.create", &record.binding_id);
    let (stored, created) = traced(span.clone(), state.store().ensure_binding(&record)).await?;
    spans::record(&span, keys::CREATED, created);
    Ok((status(created), Json(stored.into())))
}

/// Get a binding: identity and current fence (epoch, lease generation).
#[utoipa::path(get, path = "/v1/bindings/{binding_id}", tag = "bindings",
    params(BindingIdParam, SubjectParam),
    responses((status = 200, description = "The binding", body = Binding)))]
async fn get_binding(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    BindingPath(id): BindingPath,
    SubjectHeader(named): SubjectHeader,
) -> Result<Json<Binding>, ApiError> {
    let record = authz::binding(&state, &caller, &id, BindingVerb::Get, named).await?;
    Ok(Json(record.into()))
}

// ---------------------------------------------------------------------------------------
// Thread state

/// Load the durable head of the epoch (never a pending entry).
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/state/head", tag = "state",
    params(BindingIdParam, FenceHeaders, CodecHeader, SubjectParam),
    responses((status = 200, description = "The head, or null before the first commit", body = HeadResponse)))]
async fn load_head(
    State(state): State<AppState>,
    access: WorkerAccess,
) -> Result<Json<HeadResponse>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    let span = step_span(Step::ThreadStateLoad, "state.head", &record.binding_id);
    let head = traced(span.clone(), state.store().load_head(&scope)).await?;
    if let Some(head) = &head {
        spans::record_count(&span, keys::REVISION, head.revision);
        spans::record_count(&span, keys::SIZE_BYTES, head.size);
    }
    Ok(Json(HeadResponse {
        head: head.map(Into::into),
    }))
}

/// Read a stored state body (the head's, or a pending one) of the epoch.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/state/bodies/{state_id}", tag = "state",
    params(BindingIdParam, ("state_id" = String, Path, description = "A state id from a pending write or a head", pattern = "^[A-Za-z0-9_]{1,128}$"), FenceHeaders, CodecHeader, SubjectParam),
    responses((status = 200, description = "The opaque body", content_type = "application/octet-stream", body = OpaqueBytes)))]
async fn read_state(
    State(state): State<AppState>,
    access: WorkerAccess,
    StateIdPath(state_id): StateIdPath,
) -> Result<Response, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    let span = step_span(Step::ThreadStateLoad, "state.read", &record.binding_id);
    let body = traced(span.clone(), async {
        state
            .store()
            .read_state(&scope, &state_id)
            .await?
            .ok_or_else(|| ApiError::not_found("state"))
    })
    .await?;
    spans::record_count(&span, keys::SIZE_BYTES, body.len() as u64);
    Ok(octet_stream(body))
}

/// Write native state as pending (step 3 of the turn protocol).
///
/// The same `Idempotency-Key` with the same body returns the same reference; with another
/// body it is `idempotency_mismatch`.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/state/pending", tag = "state",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, CodecHeader, SubjectParam),
    request_body(content = OpaqueBytes, content_type = "application/octet-stream", description = "The opaque native state (a checkpoint, a session snapshot)"),
    responses((status = 201, description = "Stored as pending", body = PendingState)))]
#[allow(clippy::too_many_arguments)]
async fn write_pending(
    State(state): State<AppState>,
    access: WorkerAccess,
    IdempotencyKey(key): IdempotencyKey,
    OpaqueBody(body): OpaqueBody,
) -> Result<(StatusCode, Json<PendingState>), ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    let digest = state
        .keyring()
        .idempotency_digest(&record.binding_id, "state.write", &key);
    let span = step_span(Step::ThreadStateWrite, "state.pending", &record.binding_id);
    spans::record_count(&span, keys::SIZE_BYTES, body.len() as u64);
    let pending = traced(
        span,
        state.store().write_native_state(&scope, &body, &digest),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(pending.into())))
}

/// Commit a pending state as the durable head (step 4): one compare-and-set on
/// `expected_revision`, fenced by epoch and lease generation.
///
/// Retrying a commit that already succeeded returns the head it produced.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/state/commit", tag = "state",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, CodecHeader, SubjectParam),
    request_body = CommitBody,
    responses((status = 200, description = "The new durable head", body = Head)))]
#[allow(clippy::too_many_arguments)]
async fn commit(
    State(state): State<AppState>,
    access: WorkerAccess,
    _key: IdempotencyKey,
    ApiJson(body): ApiJson<CommitBody>,
) -> Result<Json<Head>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "run_id", &body.run_id)?;
    key_rule(&state, "state_id", &body.state_id)?;
    let interrupt = match body.interrupt {
        None => None,
        Some(i) => {
            key_rule(&state, "interrupt_id", &i.interrupt_id)?;
            if i.allowed_decisions.is_empty() {
                return Err(ApiError::invalid(
                    "an interrupt needs at least one allowed decision",
                ));
            }
            for d in &i.allowed_decisions {
                key_rule(&state, "allowed decision", d)?;
            }
            if matches!(i.kind, super::dto::InterruptKind::EffectReview) {
                super::review::validate(&i.allowed_decisions, &i.body)?;
            }
            Some(PendingInterrupt {
                interrupt_id: i.interrupt_id,
                kind: i.kind.as_str().to_owned(),
                run_id: body.run_id.clone(),
                namespace: i.namespace,
                agent_id: record.agent_id.clone(),
                allowed_decisions: i.allowed_decisions,
                // Stamped by the store with the new revision and the commit time.
                revision: 0,
                created_at_ms: 0,
                body: i.body,
            })
        }
    };
    let request = CommitRequest {
        state_id: body.state_id,
        expected_revision: body.expected_revision,
        run_id: body.run_id,
        terminal: body.terminal.map(|t| RunTerminal {
            outcome: t.outcome.into(),
            metadata: t.metadata,
        }),
        interrupt,
    };
    let span = step_span(Step::ThreadStateCommit, "state.commit", &record.binding_id);
    spans::record_count(&span, keys::LEASE_GENERATION, scope.lease_generation);
    let head = traced(span.clone(), state.store().commit_head(&scope, &request)).await?;
    spans::record_count(&span, keys::REVISION, head.revision);
    Ok(Json(head.into()))
}

/// Where an inline commit lands: the revision the run started from and the run id.
#[derive(Debug, serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct InlineCommitQuery {
    /// The durable revision the run started from (0 before the first commit).
    expected_revision: u64,
    /// The committing run.
    run_id: String,
    /// Also store the body as this native object (an upsert), in the same transaction.
    index_key: Option<String>,
}

/// Write native state and commit it as the durable head in one call (steps 3 and 4).
///
/// The same as `state/pending` followed by `state/commit` without terminal metadata or
/// interrupt (and, with `index_key`, an object put of the same body), in one store
/// transaction: a refused commit stores nothing, and the turn costs one durable write. The `Idempotency-Key` and body name the pending state as in
/// `state/pending`, so a retry of a commit that succeeded returns the head it produced.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/state/commit-inline", tag = "state",
    params(BindingIdParam, InlineCommitQuery, IdempotencyHeader, FenceHeaders, CodecHeader, SubjectParam),
    request_body(content = OpaqueBytes, content_type = "application/octet-stream", description = "The opaque native state to commit"),
    responses((status = 200, description = "The new durable head", body = Head)))]
#[allow(clippy::too_many_arguments)]
async fn commit_inline(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<InlineCommitQuery>,
    IdempotencyKey(key): IdempotencyKey,
    OpaqueBody(body): OpaqueBody,
) -> Result<Json<Head>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "run_id", &q.run_id)?;
    if let Some(index) = &q.index_key {
        key_rule(&state, "index_key", index)?;
    }
    let digest = state
        .keyring()
        .idempotency_digest(&record.binding_id, "state.write", &key);
    let request = CommitRequest {
        state_id: String::new(),
        expected_revision: q.expected_revision,
        run_id: q.run_id,
        terminal: None,
        interrupt: None,
    };
    let (_, head) = state
        .store()
        .write_and_commit(&scope, &body, &digest, &request, q.index_key.as_deref())
        .await?;
    Ok(Json(head.into()))
}

/// Mark a run's durability uncertain (step 5): the previous head stays, and nothing
/// commits under that run again until it is reconciled.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/state/uncertain", tag = "state",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, CodecHeader, SubjectParam),
    request_body = UncertainBody,
    responses((status = 200, description = "Runs now marked uncertain", body = UncertainRuns)))]
#[allow(clippy::too_many_arguments)]
async fn mark_uncertain(
    State(state): State<AppState>,
    access: WorkerAccess,
    _key: IdempotencyKey,
    ApiJson(body): ApiJson<UncertainBody>,
) -> Result<Json<UncertainRuns>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "run_id", &body.run_id)?;
    if body.reason.is_empty()
        || body.reason.len() > 256
        || body.reason.chars().any(char::is_control)
    {
        return Err(ApiError::invalid(
            "reason must be 1 to 256 printable characters",
        ));
    }
    let span = step_span(
        Step::ThreadStateWrite,
        "state.uncertain",
        &record.binding_id,
    );
    let runs = traced(span, async {
        state
            .store()
            .mark_uncertain(&scope, &body.run_id, &body.reason)
            .await?;
        state.store().uncertain_runs(&scope).await
    })
    .await?;
    Ok(Json(UncertainRuns {
        uncertain_runs: runs.into_iter().map(Into::into).collect(),
    }))
}

// ---------------------------------------------------------------------------------------
// Native objects

/// Get one native object's body.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/objects/item", tag = "objects",
    params(BindingIdParam, ObjectKeyQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The body; `ETag` carries the version", content_type = "application/octet-stream", body = OpaqueBytes,
        headers(("ETag" = String, description = "Quoted object version"), ("Harness-Content-Digest" = String, description = "sha256 of the body")))))]
async fn get_object(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<ObjectKeyQuery>,
) -> Result<Response, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "object key", &q.key)?;
    let span = step_span(Step::ThreadStateLoad, "object.get", &record.binding_id);
    let object = traced(span, async {
        state
            .store()
            .get_object(&scope, &q.key)
            .await?
            .ok_or_else(|| ApiError::not_found("object"))
    })
    .await?;
    let mut response = octet_stream(object.body.unwrap_or_default());
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", object.meta.version)) {
        headers.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&object.meta.content_digest) {
        headers.insert("harness-content-digest", v);
    }
    Ok(response)
}

/// Put one native object: `If-None-Match: *` creates, `If-Match: "<version>"` replaces,
/// neither upserts.
#[utoipa::path(put, path = "/v1/bindings/{binding_id}/objects/item", tag = "objects",
    params(BindingIdParam, ObjectKeyQuery, IdempotencyHeader, FenceHeaders, PutPreconditionHeaders, SubjectParam),
    request_body(content = OpaqueBytes, content_type = "application/octet-stream"),
    responses((status = 200, description = "Stored", body = Object)))]
#[allow(clippy::too_many_arguments)]
async fn put_object(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<ObjectKeyQuery>,
    _key: IdempotencyKey,
    PutPrecondition(mode): PutPrecondition,
    OpaqueBody(body): OpaqueBody,
) -> Result<Json<Object>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "object key", &q.key)?;
    let span = step_span(Step::ThreadStateWrite, "object.put", &record.binding_id);
    spans::record_count(&span, keys::SIZE_BYTES, body.len() as u64);
    let meta = traced(span, state.store().put_object(&scope, &q.key, &body, mode)).await?;
    Ok(Json(meta.into()))
}

/// List native objects under a prefix, keys descending, paged with `before`.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/objects", tag = "objects",
    params(BindingIdParam, ObjectListQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "A page of objects", body = ObjectList)))]
async fn list_objects(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<ObjectListQuery>,
) -> Result<Json<ObjectList>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    let limit = page_limit(&state, q.limit)?;
    if !q.prefix.is_empty() {
        key_rule(&state, "prefix", &q.prefix)?;
    }
    if let Some(before) = &q.before {
        key_rule(&state, "before", before)?;
    }
    let query = ObjectQuery {
        prefix: q.prefix,
        before: q.before,
        limit,
        with_bodies: q.with_bodies,
    };
    let span = step_span(Step::ThreadStateLoad, "object.list", &record.binding_id);
    let objects = traced(span.clone(), state.store().list_objects(&scope, &query)).await?;
    spans::record_count(&span, keys::COUNT, objects.len() as u64);
    let next_before = if objects.len() == limit {
        objects.last().map(|o| o.meta.key.clone())
    } else {
        None
    };
    Ok(Json(ObjectList {
        objects: objects.into_iter().map(Into::into).collect(),
        next_before,
    }))
}

/// Delete every native object whose key starts with `prefix`.
#[utoipa::path(delete, path = "/v1/bindings/{binding_id}/objects", tag = "objects",
    params(BindingIdParam, ObjectDeleteQuery, IdempotencyHeader, FenceHeaders, SubjectParam),
    responses((status = 200, description = "How many were deleted", body = Deleted)))]
async fn delete_objects(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<ObjectDeleteQuery>,
    _key: IdempotencyKey,
) -> Result<Json<Deleted>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "prefix", &q.prefix)?;
    let span = step_span(Step::ThreadStateWrite, "object.delete", &record.binding_id);
    let deleted = traced(
        span.clone(),
        state.store().delete_objects(&scope, &q.prefix),
    )
    .await?;
    spans::record_count(&span, keys::COUNT, deleted);
    Ok(Json(Deleted { deleted }))
}

// ---------------------------------------------------------------------------------------
// Native streams

/// Append entries to a stream, in order; entries whose id the stream holds are skipped.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/streams/entries", tag = "streams",
    params(BindingIdParam, StreamQuery, IdempotencyHeader, FenceHeaders, SubjectParam),
    request_body = AppendBody,
    responses((status = 200, description = "What the append did", body = Appended)))]
#[allow(clippy::too_many_arguments)]
async fn append_entries(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<StreamQuery>,
    _key: IdempotencyKey,
    ApiJson(body): ApiJson<AppendBody>,
) -> Result<Json<Appended>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "stream name", &q.stream)?;
    let mut entries = Vec::with_capacity(body.entries.len());
    for (i, e) in body.entries.into_iter().enumerate() {
        key_rule(&state, "entry id", &e.id)?;
        let bytes = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            e.body.as_bytes(),
        )
        .map_err(|_| ApiError::invalid(format!("entries[{i}].body must be standard base64")))?;
        entries.push(NewEntry {
            id: e.id,
            body: bytes,
        });
    }
    let span = step_span(Step::ThreadStateWrite, "stream.append", &record.binding_id);
    spans::record_count(&span, keys::COUNT, entries.len() as u64);
    let outcome = traced(span, state.store().append(&scope, &q.stream, &entries)).await?;
    Ok(Json(outcome.into()))
}

/// Load a stream's entries after a sequence number, in order.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/streams/entries", tag = "streams",
    params(BindingIdParam, StreamLoadQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "A page of entries", body = StreamEntries)))]
async fn load_entries(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<StreamLoadQuery>,
) -> Result<Json<StreamEntries>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "stream name", &q.stream)?;
    let limit = page_limit(&state, q.limit)?;
    let span = step_span(Step::ThreadStateLoad, "stream.load", &record.binding_id);
    let entries = traced(
        span.clone(),
        state.store().load_stream(&scope, &q.stream, q.after, limit),
    )
    .await?;
    spans::record_count(&span, keys::COUNT, entries.len() as u64);
    Ok(Json(StreamEntries {
        entries: entries.into_iter().map(Into::into).collect(),
    }))
}

/// List streams under a prefix.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/streams", tag = "streams",
    params(BindingIdParam, StreamListQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "Streams", body = StreamList)))]
async fn list_streams(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<StreamListQuery>,
) -> Result<Json<StreamList>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    if !q.prefix.is_empty() {
        key_rule(&state, "prefix", &q.prefix)?;
    }
    let span = step_span(Step::ThreadStateLoad, "stream.list", &record.binding_id);
    let streams = traced(span.clone(), state.store().list_streams(&scope, &q.prefix)).await?;
    spans::record_count(&span, keys::COUNT, streams.len() as u64);
    Ok(Json(StreamList {
        streams: streams.into_iter().map(Into::into).collect(),
    }))
}

/// Delete a stream and its sub-streams (`stream/...`).
#[utoipa::path(delete, path = "/v1/bindings/{binding_id}/streams", tag = "streams",
    params(BindingIdParam, StreamQuery, IdempotencyHeader, FenceHeaders, SubjectParam),
    responses((status = 200, description = "Entries deleted", body = Deleted)))]
async fn delete_stream(
    State(state): State<AppState>,
    access: WorkerAccess,
    ApiQuery(q): ApiQuery<StreamQuery>,
    _key: IdempotencyKey,
) -> Result<Json<Deleted>, ApiError> {
    let WorkerAccess { record, scope, .. } = access;
    key_rule(&state, "stream name", &q.stream)?;
    let span = step_span(Step::ThreadStateWrite, "stream.delete", &record.binding_id);
    let deleted = traced(span.clone(), state.store().delete_stream(&scope, &q.stream)).await?;
    spans::record_count(&span, keys::COUNT, deleted);
    Ok(Json(Deleted { deleted }))
}

// ---------------------------------------------------------------------------------------
// Pending interrupts

/// Get the pending interrupt, if any.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/interrupt", tag = "interrupts",
    params(BindingIdParam, OptionalEpochHeader, SubjectParam),
    responses((status = 200, description = "The pending interrupt, or null", body = InterruptResponse)))]
async fn get_interrupt(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    BindingPath(id): BindingPath,
    OptionalEpoch(epoch): OptionalEpoch,
    SubjectHeader(named): SubjectHeader,
) -> Result<Json<InterruptResponse>, ApiError> {
    let record = authz::binding(&state, &caller, &id, BindingVerb::Get, named).await?;
    let scope = authz::control_scope(&state, &record, epoch);
    let span = step_span(Step::ThreadStateLoad, "interrupt.get", &record.binding_id);
    let interrupt = traced(span, state.store().pending_interrupt(&scope)).await?;
    Ok(Json(InterruptResponse {
        interrupt: interrupt.map(Into::into),
    }))
}

/// Resume the pending interrupt on the binding owner's behalf. Consumes it atomically
/// when id, revision and decision match; a retry with the same `Idempotency-Key`
/// returns the first outcome.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/interrupt/resume", tag = "interrupts",
    params(BindingIdParam, IdempotencyHeader, OptionalEpochHeader, SubjectParam),
    request_body = ResumeBody,
    responses((status = 200, description = "The recorded resume", body = Resumed)))]
async fn resume_interrupt(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    BindingPath(id): BindingPath,
    IdempotencyKey(key): IdempotencyKey,
    OptionalEpoch(epoch): OptionalEpoch,
    SubjectHeader(named): SubjectHeader,
    ApiJson(body): ApiJson<ResumeBody>,
) -> Result<Json<Resumed>, ApiError> {
    if matches!(caller, super::auth::Caller::Worker(_)) {
        // A resume is the user's answer, relayed by a control-plane service; the worker
        // that asked the question must not answer it.
        return Err(ApiError::forbidden(
            "a sandbox worker cannot resume an interrupt",
        ));
    }
    let record = authz::binding(&state, &caller, &id, BindingVerb::Update, named).await?;
    let scope = authz::control_scope(&state, &record, epoch);
    key_rule(&state, "interrupt_id", &body.interrupt_id)?;
    key_rule(&state, "decision", &body.decision)?;
    // An effect review's answer is also the person's decision in the run ledger,
    // recorded before the interrupt is consumed (src/server/review.rs).
    if let Some(pending) = state.store().pending_interrupt(&scope).await?
        && let Some(decision) = super::review::decision_of(
            &pending,
            &body.interrupt_id,
            body.revision,
            &body.decision,
            &body.response,
        )
    {
        super::review::record_decision(&state, &scope, decision, &key).await?;
    }
    let request = ResumeRequest {
        interrupt_id: body.interrupt_id,
        revision: body.revision,
        caller: record.owner.clone(),
        decision: body.decision,
        idempotency: state.keyring().idempotency_digest(
            &record.binding_id,
            "interrupt.resume",
            &key,
        ),
        response: body.response,
    };
    let span = step_span(
        Step::ThreadStateWrite,
        "interrupt.resume",
        &record.binding_id,
    );
    let outcome = traced(span, state.store().resume(&scope, &request)).await?;
    Ok(Json(outcome.into()))
}

// ---------------------------------------------------------------------------------------
// Clearing an uncertain run

/// The run whose uncertainty a control-plane service clears.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileBody {
    /// The run marked uncertain (`POST .../state/uncertain`).
    pub run_id: String,
}

/// Clear an uncertain run after someone reconciled it (checked what reached the user,
/// committed or dropped it): new commits may go ahead again. Control-plane callers only
/// (a sandbox worker gets 403: the worker that failed to commit does not decide its own
/// uncertainty is resolved). An unknown or already cleared run is 404, so a retry of a
/// clear that succeeded answers 404 too (the key is required as on every write). The binding's
/// `StateDurable` condition returns to True at the operator's next state projection.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/state/uncertain/reconcile", tag = "state",
    params(BindingIdParam, IdempotencyHeader, OptionalEpochHeader, SubjectParam),
    request_body = ReconcileBody,
    responses((status = 200, description = "The runs still uncertain", body = UncertainRuns)))]
async fn reconcile_uncertain(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    BindingPath(id): BindingPath,
    _key: IdempotencyKey,
    OptionalEpoch(epoch): OptionalEpoch,
    SubjectHeader(named): SubjectHeader,
    ApiJson(body): ApiJson<ReconcileBody>,
) -> Result<Json<UncertainRuns>, ApiError> {
    if matches!(caller, super::auth::Caller::Worker(_)) {
        return Err(ApiError::forbidden(
            "a sandbox worker cannot clear an uncertain run: a control-plane service reconciles it",
        ));
    }
    let record = authz::binding(&state, &caller, &id, BindingVerb::Update, named).await?;
    let scope = authz::control_scope(&state, &record, epoch);
    key_rule(&state, "run_id", &body.run_id)?;
    let span = step_span(
        Step::ThreadStateWrite,
        "state.reconcile",
        &record.binding_id,
    );
    let runs = traced(span, async {
        state.store().reconcile_run(&scope, &body.run_id).await?;
        state.store().uncertain_runs(&scope).await
    })
    .await?;
    Ok(Json(UncertainRuns {
        uncertain_runs: runs.into_iter().map(Into::into).collect(),
    }))
}
