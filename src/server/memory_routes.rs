//! `/v1/memory`: long-term memory (`spec/000_fa938a4e6ac75730.txt` "MemoryBroker").
//!
//! Every call is made in the context of one binding: a worker's own (from its
//! credentials), or the one a control-plane caller names in `Harness-Binding` and may
//! use (the same checks as `/v1/bindings/...`, [`authz::binding`]). The namespace comes
//! from that binding's owner and agent and the deployment's organization
//! ([`Namespace::derive`]); nothing in a request names a subject, an organization or a
//! namespace. Each handler is: resolve the context, run one domain step, call one store
//! operation, shape the answer, so tracing spans (`memory.read`, `memory.write`) can
//! wrap the handler functions as they are.

use std::collections::BTreeMap;

use axum::{
    Json,
    extract::{FromRequestParts, Path, State},
    http::{StatusCode, request::Parts},
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    AppState,
    auth::{BindingVerb, Caller},
    authz,
    error::{ApiError, ErrorCode},
    extract::{
        ApiJson, ApiQuery, Authenticated, EPOCH, IdempotencyKey, LEASE_GENERATION, SubjectHeader,
        parse_u64_header,
    },
    middleware::traced,
};
use crate::telemetry::spans::{self, Step, keys};
use crate::{
    domain::{
        ids::BindingId,
        memory::{
            ApprovalRecord, ApprovalStatus, Classification, MemoryContext, MemoryKind,
            MemoryRecord, MemoryScope, MemoryWriteOutcome, Namespace, Provenance, WriteOutcomeKind,
            pipeline::{self, Proposal, WriteContext},
            policy::{EffectivePolicy, MemoryPolicySet, Writer, authorize_decision},
            rank::{self, Weights},
            receipt,
        },
        state::{BindingRecord, StateScope},
    },
    store::{
        memory::{CandidateQuery, MemoryDecision, MemoryPut},
        now_ms,
    },
};

pub const BINDING: &str = "harness-binding";

/// Most candidates one scope contributes to ranking.
const MAX_CANDIDATES: usize = 400;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_memory, put_memory, delete_memory))
        .routes(routes!(search_memory))
        .routes(routes!(list_memory))
        .routes(routes!(memory_stats))
        .routes(routes!(promote_memory))
        .routes(routes!(approve_memory))
        .routes(routes!(reject_memory))
}

// ---------------------------------------------------------------------------------------
// Wire types

/// Memory scope (`spec/000` "Memory scopes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScopeName {
    /// environment + subject + agent.
    User,
    /// environment + agent (shared learning).
    Agent,
    /// environment + organization + agent.
    Organization,
}

impl From<ScopeName> for MemoryScope {
    fn from(s: ScopeName) -> Self {
        match s {
            ScopeName::User => MemoryScope::User,
            ScopeName::Agent => MemoryScope::Agent,
            ScopeName::Organization => MemoryScope::Organization,
        }
    }
}
impl From<MemoryScope> for ScopeName {
    fn from(s: MemoryScope) -> Self {
        match s {
            MemoryScope::User => ScopeName::User,
            MemoryScope::Agent => ScopeName::Agent,
            MemoryScope::Organization => ScopeName::Organization,
        }
    }
}

/// Memory kind (`spec/000` "Memory kinds").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KindName {
    Semantic,
    EpisodicReference,
    Procedural,
}

impl From<KindName> for MemoryKind {
    fn from(k: KindName) -> Self {
        match k {
            KindName::Semantic => MemoryKind::Semantic,
            KindName::EpisodicReference => MemoryKind::EpisodicReference,
            KindName::Procedural => MemoryKind::Procedural,
        }
    }
}
impl From<MemoryKind> for KindName {
    fn from(k: MemoryKind) -> Self {
        match k {
            MemoryKind::Semantic => KindName::Semantic,
            MemoryKind::EpisodicReference => KindName::EpisodicReference,
            MemoryKind::Procedural => KindName::Procedural,
        }
    }
}

/// A proposed memory write. Content is treated as untrusted model output: it is
/// scanned, secrets are redacted, and content that tries to grant authority is refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryPutRequest {
    /// Logical key within the namespace: 1 to 256 bytes, `/`-separated segments.
    pub key: String,
    pub kind: KindName,
    /// `text/plain` (default), `text/markdown` or `application/json`.
    #[serde(default)]
    pub media_type: Option<String>,
    /// The memory text (inline; bounded by the deployment, 16 KiB by default).
    pub content: String,
    /// 0 to 1 (default 0.5): one term of ranking.
    #[serde(default)]
    pub importance: Option<f32>,
    /// Optional embedding of the content, for cosine ranking against query embeddings.
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
    /// A configured retention policy id (application writers only; default: the
    /// agent's `MemoryPolicy`).
    #[serde(default)]
    pub retention_policy: Option<String>,
    /// The run that produced this memory (provenance).
    #[serde(default)]
    pub run_id: Option<String>,
    /// Model version that produced it (provenance).
    #[serde(default)]
    pub model_version: Option<String>,
    /// Absent or 0: create only. N: replace revision N (else `revision_conflict`, or a
    /// consolidation when the agent's policy says `merge`).
    #[serde(default)]
    pub expected_revision: Option<u64>,
}

/// Who wrote a memory and from where.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvenanceView {
    /// `agent_write`, `application_write` or `consolidation`.
    pub source: String,
    pub writer: String,
    pub source_binding_id: Option<String>,
    pub source_run_id: Option<String>,
    pub harness: Option<String>,
    pub model_version: Option<String>,
}

impl From<Provenance> for ProvenanceView {
    fn from(p: Provenance) -> Self {
        ProvenanceView {
            source: p.source,
            writer: p.writer,
            source_binding_id: p.source_binding_id,
            source_run_id: p.source_run_id,
            harness: p.harness,
            model_version: p.model_version,
        }
    }
}

/// An approval decision.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalView {
    pub decided_by: Option<String>,
    pub decided_at_ms: Option<i64>,
    pub reason: Option<String>,
}

impl From<ApprovalRecord> for ApprovalView {
    fn from(a: ApprovalRecord) -> Self {
        ApprovalView {
            decided_by: a.decided_by,
            decided_at_ms: a.decided_at_ms,
            reason: a.reason,
        }
    }
}

/// What scanning found.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClassificationView {
    pub labels: Vec<String>,
    pub redactions: u32,
    pub sensitive: bool,
}

impl From<Classification> for ClassificationView {
    fn from(c: Classification) -> Self {
        ClassificationView {
            labels: c.labels,
            redactions: c.redactions,
            sensitive: c.sensitive,
        }
    }
}

/// A stored memory record.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryRecordView {
    /// `hm_` and 32 hex digits.
    pub id: String,
    pub scope: ScopeName,
    pub key: String,
    pub kind: KindName,
    pub media_type: String,
    /// The stored content (after redaction).
    pub content: String,
    /// `sha256:` of `content`.
    pub content_hash: String,
    pub revision: u64,
    /// Revisions this one derives from (all of them, for a consolidation).
    pub source_revisions: Vec<u64>,
    #[schema(value_type = String, example = "approved")]
    pub approval_status: ApprovalStatus,
    pub approval: ApprovalView,
    pub classification: ClassificationView,
    pub importance: f32,
    pub has_embedding: bool,
    pub provenance: ProvenanceView,
    pub retention_policy: String,
    /// Its source thread was revoked; an approver must review it.
    pub review_required: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub expires_at_ms: Option<i64>,
}

impl From<MemoryRecord> for MemoryRecordView {
    fn from(r: MemoryRecord) -> Self {
        MemoryRecordView {
            id: r.id,
            scope: r.namespace.scope.into(),
            key: r.memory_key,
            kind: r.kind.into(),
            media_type: r.media_type,
            content: r.body,
            content_hash: r.content_hash,
            revision: r.revision,
            source_revisions: r.source_revisions,
            approval_status: r.approval_status,
            approval: r.approval.into(),
            classification: r.classification.into(),
            importance: r.importance,
            has_embedding: r.embedding.is_some(),
            provenance: r.provenance.into(),
            retention_policy: r.retention_policy,
            review_required: r.review_required,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            expires_at_ms: r.expires_at_ms,
        }
    }
}

/// The outcome of a write, delete or decision, and the record it concerns.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryWriteResponse {
    #[schema(value_type = String, example = "created")]
    pub outcome: WriteOutcomeKind,
    pub record: MemoryRecordView,
    /// An identical retry (same `Idempotency-Key`, same request) of a write whose
    /// revision is still current: nothing was written; `outcome` and `record` are that
    /// write's.
    pub replayed: bool,
}

impl From<MemoryWriteOutcome> for MemoryWriteResponse {
    fn from(o: MemoryWriteOutcome) -> Self {
        MemoryWriteResponse {
            outcome: o.outcome,
            record: o.record.into(),
            replayed: o.replayed,
        }
    }
}

/// What a keyed write leaves on its revision: the key's keyed digest (bound to the
/// binding and the operation; the key itself is never stored) and the digest of the
/// request, so a retry can be told from a reuse.
fn write_key(
    state: &AppState,
    call: &MemoryCall,
    operation: &str,
    key: &str,
    request: &serde_json::Value,
) -> crate::domain::memory::WriteKey {
    crate::domain::memory::WriteKey {
        key: state
            .keyring()
            .idempotency_digest(&call.binding.binding_id, operation, key)
            .as_str()
            .to_owned(),
        request: crate::domain::ids::content_digest(request.to_string().as_bytes()),
        outcome: WriteOutcomeKind::Created,
    }
}

/// A search. Authorization and the namespace filter apply first; ranking second.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySearchRequest {
    /// Free text; its words are matched lexically (BM25).
    #[serde(default)]
    pub query: String,
    /// Scopes to search (default: those the agent's policy reads).
    #[serde(default)]
    pub scopes: Option<Vec<ScopeName>>,
    /// Only these kinds (default: all).
    #[serde(default)]
    pub kinds: Option<Vec<KindName>>,
    /// Most results (default and cap: the agent's policy `maxResults`).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Optional query embedding for cosine ranking.
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
    /// Budgeted mode: choose by value per token within this many tokens.
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

/// One ranked result and why it ranked.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryHit {
    pub record: MemoryRecordView,
    pub score: f64,
    /// Lexical relevance, normalized to the best match (0 to 1).
    pub lexical: f64,
    /// Cosine similarity to the query embedding, when both have one.
    pub vector: Option<f64>,
    pub recency: f64,
    /// Estimated tokens of the content.
    pub tokens: u64,
}

/// What the budgeted mode used.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetReport {
    pub budget_tokens: u64,
    pub used_tokens: u64,
    pub considered: usize,
    /// used / budget.
    pub utilisation: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MemorySearchResponse {
    pub results: Vec<MemoryHit>,
    /// Present in budgeted mode.
    pub budget: Option<BudgetReport>,
    /// The signed recall receipt (`hrr1.`...): the workspace, its epoch, the namespaces
    /// searched and every result's memory id, rank and exact content version. A run event
    /// that attributes its work to these memories cites it (docs/mcp.md "Receipts");
    /// only its SHA-256 is ever stored.
    pub receipt: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KeyQuery {
    /// The memory key.
    pub key: String,
    /// Also return a record awaiting or refused approval (approvers only).
    #[serde(default)]
    pub include_pending: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// The memory key.
    pub key: String,
    /// The current revision (required: deletes are compare-and-set).
    pub expected_revision: u64,
}

/// An approval decision.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryDecisionRequest {
    pub key: String,
    pub expected_revision: u64,
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct MemoryHeaders {
    /// The binding whose context the call is made in (default for a worker: its own;
    /// required for other callers).
    #[param(
        rename = "Harness-Binding",
        pattern = "^hb_[0-9a-f]{32}$",
        nullable = false
    )]
    binding: Option<String>,
    /// End-user subject the caller acts for (as on `/v1/bindings`).
    #[param(
        rename = "Harness-Subject",
        min_length = 1,
        max_length = 256,
        nullable = false
    )]
    subject: Option<String>,
    /// A worker's epoch (required for worker writes).
    #[param(rename = "Harness-Epoch", minimum = 0, nullable = false)]
    epoch: Option<u64>,
    /// A worker's lease generation (required for worker writes).
    #[param(rename = "Harness-Lease-Generation", minimum = 0, nullable = false)]
    lease_generation: Option<u64>,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct IdempotencyParam {
    /// Client-chosen key, 1 to 255 visible ASCII characters. Memory writes are
    /// compare-and-set on the revision, so a retried write can never apply twice: a retry
    /// of a write that landed gets `revision_conflict` with the current revision in
    /// `details.actual`, whose `content_hash` the client can compare.
    #[param(rename = "Idempotency-Key", pattern = "^[!-~]{1,255}$")]
    key: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct ScopeParam {
    /// `user`, `agent` or `organization`.
    #[param(inline)]
    scope: ScopeName,
}

/// The `Harness-Binding`, `Harness-Epoch` and `Harness-Lease-Generation` headers.
pub struct MemoryCallHeaders {
    binding: Option<BindingId>,
    epoch: Option<u64>,
    lease_generation: Option<u64>,
}

impl<S: Send + Sync> FromRequestParts<S> for MemoryCallHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let binding = super::extract::single_header(&parts.headers, BINDING)?
            .map(|v| {
                v.to_str().ok().and_then(BindingId::parse).ok_or_else(|| {
                    ApiError::invalid("Harness-Binding must be hb_ and 32 hex digits")
                })
            })
            .transpose()?;
        Ok(MemoryCallHeaders {
            binding,
            epoch: parse_u64_header(&parts.headers, EPOCH, "Harness-Epoch")?,
            lease_generation: parse_u64_header(
                &parts.headers,
                LEASE_GENERATION,
                "Harness-Lease-Generation",
            )?,
        })
    }
}

/// The `{scope}` path segment.
pub struct ScopePath(MemoryScope);

impl<S: Send + Sync> FromRequestParts<S> for ScopePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found("memory scope"))?;
        let raw = params
            .iter()
            .find(|(k, _)| k == "scope")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        crate::domain::memory::parse_scope(raw)
            .map(ScopePath)
            .ok_or_else(|| ApiError::invalid("scope must be user, agent or organization"))
    }
}

// ---------------------------------------------------------------------------------------
// Context

/// Everything a memory call derives from the caller and its binding.
struct MemoryCall {
    caller: Caller,
    binding: BindingRecord,
    ctx: MemoryContext,
    policies: std::sync::Arc<MemoryPolicySet>,
    policy: EffectivePolicy,
    writer: Writer,
}

impl MemoryCall {
    fn namespace(&self, state: &AppState, scope: MemoryScope) -> Result<Namespace, ApiError> {
        Ok(Namespace::derive(state.keyring(), &self.ctx, scope)?)
    }
    fn is_worker(&self) -> bool {
        matches!(self.caller, Caller::Worker(_))
    }
}

/// Resolves the binding the call is made in and the memory context it gives. A write by
/// a worker must present the epoch and lease generation its sandbox holds.
async fn resolve(
    state: &AppState,
    caller: Caller,
    headers: &MemoryCallHeaders,
    named: Option<String>,
    verb: BindingVerb,
) -> Result<MemoryCall, ApiError> {
    let id = match (&caller, &headers.binding) {
        (_, Some(id)) => id.clone(),
        (Caller::Worker(w), None) => w.binding_id.clone(),
        (_, None) => {
            return Err(ApiError::invalid(
                "name the binding whose memory context to use in the Harness-Binding header",
            ));
        }
    };
    let binding = authz::binding(state, &caller, &id, verb, named).await?;
    if matches!(caller, Caller::Worker(_)) && verb == BindingVerb::Update {
        let (Some(epoch), Some(generation)) = (headers.epoch, headers.lease_generation) else {
            return Err(ApiError::invalid(
                "worker writes carry Harness-Epoch and Harness-Lease-Generation",
            ));
        };
        authz::check_worker_fence(&caller, epoch, generation)?;
    }
    let policies = state.memory_policies().snapshot();
    let policy = match state.binding_scopes() {
        None => policies.effective(&binding.agent_id),
        // Kubernetes: the policies of the binding's own namespace, or its memoryPolicyRef.
        Some(scopes) => match scopes.get(binding.binding_id.as_str()) {
            Some(scope) => policies.effective_in(&binding.agent_id, &scope),
            None => {
                return Err(ApiError::new(
                    ErrorCode::Unavailable,
                    "this replica has not seen the binding's HarnessBinding yet, so it cannot choose its memory policy; retry",
                ));
            }
        },
    };
    let writer = Writer::of(
        &policies.deployment,
        caller.principal(),
        matches!(caller, Caller::Worker(_)),
    );
    let ctx = MemoryContext {
        subject: binding.owner.clone(),
        agent_id: binding.agent_id.clone(),
        organization: policies.deployment.organization.clone(),
    };
    Ok(MemoryCall {
        caller,
        binding,
        ctx,
        policies,
        policy,
        writer,
    })
}

/// A worker's write is fenced by the lease it holds (checked in `resolve` against its
/// credentials, and by the store against the binding's fence); other callers' are not.
fn worker_fence(
    state: &AppState,
    call: &MemoryCall,
    headers: &MemoryCallHeaders,
) -> Option<StateScope> {
    match (&call.caller, headers.epoch, headers.lease_generation) {
        (Caller::Worker(_), Some(epoch), Some(lease_generation)) => Some(StateScope {
            binding_id: call.binding.binding_id.clone(),
            environment: state.keyring().environment().to_owned(),
            harness: call.binding.harness.clone(),
            epoch,
            codec: "memory".into(),
            lease_generation,
        }),
        _ => None,
    }
}

/// A `memory.read` / `memory.write` span under `harness.request` (spec 000 topology):
/// the operation and the binding id (a keyed digest), never a key, namespace or body.
fn memory_span(step: Step, operation: &'static str, call: &MemoryCall) -> tracing::Span {
    let span = spans::operation(step, operation);
    spans::record(&span, keys::BINDING_ID, call.binding.binding_id.as_str());
    span
}

/// May this caller see records that are not admitted (pending, rejected, revoked)?
fn check_reviewer(call: &MemoryCall) -> Result<(), ApiError> {
    if call.is_worker()
        || !call
            .policies
            .deployment
            .approvers
            .iter()
            .any(|a| a == call.caller.principal())
    {
        return Err(ApiError::forbidden(format!(
            "{} is not a memory approver, so it cannot read unapproved memory",
            call.caller.principal()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Handlers

/// Get one memory by key in a scope of the caller's memory context.
#[utoipa::path(get, path = "/v1/memory/{scope}/records", tag = "memory",
    params(ScopeParam, KeyQuery, MemoryHeaders),
    responses((status = 200, description = "The record", body = MemoryRecordView)))]
async fn get_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiQuery(q): ApiQuery<KeyQuery>,
) -> Result<Json<MemoryRecordView>, ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Get).await?;
    crate::domain::memory::policy::authorize_read(&call.policy, &call.writer, scope)?;
    let include = q.include_pending.unwrap_or(false);
    if include {
        check_reviewer(&call)?;
    }
    pipeline::check_memory_key(&q.key)?;
    let ns = call.namespace(&state, scope)?;
    let span = memory_span(Step::MemoryRead, "memory.get", &call);
    let record = traced(span, async {
        state
            .store()
            .get_memory(&ns, &q.key, include, now_ms())
            .await?
            .ok_or_else(|| ApiError::not_found("memory"))
    })
    .await?;
    Ok(Json(record.into()))
}

/// A page of one scope's memories in key order.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Start after this key (the previous page's `next_after_key`).
    #[serde(default)]
    #[param(max_length = 256, nullable = false)]
    pub after_key: Option<String>,
    /// Most records (default 100, at most 500).
    #[serde(default)]
    #[param(minimum = 1, maximum = 500, nullable = false)]
    pub limit: Option<u32>,
    /// Also list records awaiting or refused approval (approvers only).
    #[serde(default)]
    #[param(nullable = false)]
    pub include_unadmitted: Option<bool>,
}

/// A page of memories.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryPage {
    pub records: Vec<MemoryRecordView>,
    /// Set when the page is full: pass it as `after_key` for the next one.
    pub next_after_key: Option<String>,
}

/// Counts by approval status, per scope.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryStats {
    /// Scope -> approval status (`not_required`, `pending`, `approved`, `rejected`,
    /// `revoked`) -> unexpired records. Only the scopes the caller may read.
    pub scopes: BTreeMap<String, BTreeMap<String, u64>>,
}

/// List one scope's memories in key order (browse, export). The scope must be one the
/// agent's policy lets the caller read; unadmitted records only for approvers.
#[utoipa::path(get, path = "/v1/memory/{scope}/records/list", tag = "memory",
    params(ScopeParam, ListQuery, MemoryHeaders),
    responses((status = 200, description = "A page of records", body = MemoryPage)))]
async fn list_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<MemoryPage>, ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Get).await?;
    crate::domain::memory::policy::authorize_read(&call.policy, &call.writer, scope)?;
    let include = q.include_unadmitted.unwrap_or(false);
    if include {
        check_reviewer(&call)?;
    }
    if let Some(after) = &q.after_key
        && after.len() > 256
    {
        return Err(ApiError::invalid("after_key must be at most 256 bytes"));
    }
    let limit = match q.limit {
        Some(0) => return Err(ApiError::invalid("limit must be at least 1")),
        Some(n) => (n as usize).min(crate::store::memory::MAX_LIST),
        None => 100,
    };
    let ns = call.namespace(&state, scope)?;
    let span = memory_span(Step::MemoryRead, "memory.list", &call);
    let records = traced(span.clone(), async {
        Ok::<_, ApiError>(
            state
                .store()
                .list_memories(&ns, q.after_key.as_deref(), limit, include, now_ms())
                .await?,
        )
    })
    .await?;
    spans::record_count(&span, keys::COUNT, records.len() as u64);
    let next_after_key = (records.len() >= limit)
        .then(|| records.last().map(|r| r.memory_key.clone()))
        .flatten();
    Ok(Json(MemoryPage {
        records: records.into_iter().map(Into::into).collect(),
        next_after_key,
    }))
}

/// Count the memories of every scope the caller may read, by approval status.
#[utoipa::path(get, path = "/v1/memory/stats", tag = "memory",
    params(MemoryHeaders),
    responses((status = 200, description = "Counts", body = MemoryStats)))]
async fn memory_stats(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
) -> Result<Json<MemoryStats>, ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Get).await?;
    let span = memory_span(Step::MemoryRead, "memory.stats", &call);
    let scopes = traced(span, async {
        let mut scopes = BTreeMap::new();
        for scope in [
            MemoryScope::User,
            MemoryScope::Agent,
            MemoryScope::Organization,
        ] {
            if crate::domain::memory::policy::authorize_read(&call.policy, &call.writer, scope)
                .is_err()
            {
                continue;
            }
            let Ok(ns) = call.namespace(&state, scope) else {
                continue;
            };
            let counts = state.store().count_memories(&ns, now_ms()).await?;
            scopes.insert(crate::domain::memory::scope_str(scope).to_owned(), counts);
        }
        Ok::<_, ApiError>(scopes)
    })
    .await?;
    Ok(Json(MemoryStats { scopes }))
}

/// Write one memory through the governed pipeline: authorize, validate, scan, redact,
/// refuse authority, approval, compare the expected revision (or consolidate), persist
/// with provenance and an audit record.
#[utoipa::path(put, path = "/v1/memory/{scope}/records", tag = "memory",
    params(ScopeParam, IdempotencyParam, MemoryHeaders),
    request_body = MemoryPutRequest,
    responses(
        (status = 201, description = "Created", body = MemoryWriteResponse),
        (status = 200, description = "Updated or consolidated", body = MemoryWriteResponse),
    ))]
async fn put_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    IdempotencyKey(key): IdempotencyKey,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<MemoryPutRequest>,
) -> Result<(StatusCode, Json<MemoryWriteResponse>), ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Update).await?;
    let ns = call.namespace(&state, scope)?;
    let write_key = write_key(
        &state,
        &call,
        "memory.put",
        &key,
        &serde_json::json!({
            "scope": crate::domain::memory::scope_str(scope), "key": &req.key,
            "kind": crate::domain::memory::kind_str(req.kind.into()),
            "media_type": &req.media_type, "content": &req.content,
            "importance": req.importance, "embedding": &req.embedding,
            "retention_policy": &req.retention_policy, "run_id": &req.run_id,
            "model_version": &req.model_version, "expected_revision": req.expected_revision,
        }),
    );
    if req
        .content
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .any(|w| w.starts_with(receipt::PREFIX))
    {
        // A signed recall receipt lists what a user was shown: it is cited, never stored.
        return Err(ApiError::invalid(
            "memory content holds a recall receipt; receipts are never stored (cite them in memory_recalled)",
        ));
    }
    let size = req.content.len() as u64;
    // memory.write covers the whole pipeline (validate, scan, redact, policy) and the
    // persist; pipeline refusals are recorded on it too.
    let span = memory_span(Step::MemoryWrite, "memory.put", &call);
    spans::record_count(&span, keys::SIZE_BYTES, size);
    let outcome = traced(span.clone(), async {
        let record = pipeline::prepare(
            Proposal {
                memory_key: req.key,
                kind: req.kind.into(),
                media_type: req.media_type.unwrap_or_else(|| "text/plain".into()),
                body: req.content,
                importance: req.importance,
                embedding: req.embedding,
                retention_policy: req.retention_policy,
                source_run_id: req.run_id,
                model_version: req.model_version,
            },
            &WriteContext {
                namespace: &ns,
                writer: &call.writer,
                policy: &call.policy,
                deployment: &call.policies.deployment,
                source_binding_id: Some(call.binding.binding_id.as_str().to_owned()),
                harness: Some(call.binding.harness.clone()),
                now_ms: now_ms(),
            },
        )?;
        let mut record = record;
        record.provenance.write_key = Some(write_key);
        let fence = worker_fence(&state, &call, &headers);
        let outcome = state
            .store()
            .put_memory(&MemoryPut {
                record,
                expected_revision: req.expected_revision,
                consolidation: call.policy.consolidation,
                fence,
            })
            .await?;
        Ok::<_, ApiError>(outcome)
    })
    .await?;
    spans::record(
        &span,
        keys::CREATED,
        outcome.outcome == WriteOutcomeKind::Created,
    );
    let status = if outcome.outcome == WriteOutcomeKind::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(outcome.into())))
}

/// A promotion proposal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryPromoteRequest {
    /// The key of the admitted record in the path's scope.
    pub key: String,
    /// The wider scope to copy it to (user -> agent or organization, agent ->
    /// organization).
    pub to_scope: ScopeName,
}

/// Propose copying an admitted memory to a wider scope. Never automatic: the copy goes
/// through the write pipeline into the wider scope's namespace (create only; an existing
/// key there is `revision_conflict`) and is `pending` whoever proposed it, until an
/// approver approves or rejects it. Its provenance `source` is `promotion` and
/// `source_run_id` names the promoted record and revision (`hm_...@N`).
#[utoipa::path(post, path = "/v1/memory/{scope}/records/promote", tag = "memory",
    params(ScopeParam, IdempotencyParam, MemoryHeaders),
    request_body = MemoryPromoteRequest,
    responses((status = 201, description = "Proposed (pending)", body = MemoryWriteResponse)))]
async fn promote_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    IdempotencyKey(key): IdempotencyKey,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<MemoryPromoteRequest>,
) -> Result<(StatusCode, Json<MemoryWriteResponse>), ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Update).await?;
    let write_key = write_key(
        &state,
        &call,
        "memory.promote",
        &key,
        &serde_json::json!({
            "scope": crate::domain::memory::scope_str(scope), "key": &req.key,
            "to_scope": crate::domain::memory::scope_str(req.to_scope.into()),
        }),
    );
    crate::domain::memory::policy::authorize_read(&call.policy, &call.writer, scope)?;
    pipeline::check_memory_key(&req.key)?;
    let to: MemoryScope = req.to_scope.into();
    if !pipeline::widens(scope, to) {
        return Err(ApiError::invalid(format!(
            "a promotion goes to a wider scope (user -> agent or organization, agent -> organization), not {} -> {}",
            crate::domain::memory::scope_str(scope),
            crate::domain::memory::scope_str(to)
        )));
    }
    let from_ns = call.namespace(&state, scope)?;
    let to_ns = call.namespace(&state, to)?;
    let span = memory_span(Step::MemoryWrite, "memory.promote", &call);
    let outcome = traced(span, async {
        let source = state
            .store()
            .get_memory(&from_ns, &req.key, false, now_ms())
            .await?
            .ok_or_else(|| ApiError::not_found("memory"))?;
        // A promotion is a proposal: the wider scope's write authorization is replaced
        // by the approval every promotion waits for (`as_promotion`); scanning,
        // redaction and the authority refusal still run on the copy.
        let proposer = Writer {
            is_application_writer: true,
            ..call.writer.clone()
        };
        let prepared = pipeline::prepare(
            Proposal {
                memory_key: source.memory_key.clone(),
                kind: source.kind,
                media_type: source.media_type.clone(),
                body: source.body.clone(),
                importance: Some(source.importance),
                embedding: source.embedding.clone(),
                retention_policy: None,
                source_run_id: None,
                model_version: source.provenance.model_version.clone(),
            },
            &WriteContext {
                namespace: &to_ns,
                writer: &proposer,
                policy: &call.policy,
                deployment: &call.policies.deployment,
                source_binding_id: Some(call.binding.binding_id.as_str().to_owned()),
                harness: Some(call.binding.harness.clone()),
                now_ms: now_ms(),
            },
        )?;
        let mut record = pipeline::as_promotion(prepared, &source);
        record.provenance.write_key = Some(write_key);
        let fence = worker_fence(&state, &call, &headers);
        Ok::<_, ApiError>(
            state
                .store()
                .put_memory(&MemoryPut {
                    record,
                    expected_revision: None,
                    consolidation: crate::domain::memory::Consolidation::Disabled,
                    fence,
                })
                .await?,
        )
    })
    .await?;
    Ok((StatusCode::CREATED, Json(outcome.into())))
}

/// Delete one memory at its current revision. Separate from a conversation clear, which
/// never deletes memory.
#[utoipa::path(delete, path = "/v1/memory/{scope}/records", tag = "memory",
    params(ScopeParam, IdempotencyParam, DeleteQuery, MemoryHeaders),
    responses((status = 200, description = "Deleted; the record as it was", body = MemoryWriteResponse)))]
async fn delete_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    _key: IdempotencyKey,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> Result<Json<MemoryWriteResponse>, ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Update).await?;
    pipeline::check_memory_key(&q.key)?;
    let ns = call.namespace(&state, scope)?;
    let span = memory_span(Step::MemoryRead, "memory.get", &call);
    let current = traced(span, async {
        state
            .store()
            .get_memory(&ns, &q.key, true, now_ms())
            .await?
            .ok_or_else(|| ApiError::not_found("memory"))
    })
    .await?;
    crate::domain::memory::policy::authorize_write(
        &call.policy,
        &call.writer,
        scope,
        current.kind,
    )?;
    let span = memory_span(Step::MemoryWrite, "memory.delete", &call);
    let outcome = traced(
        span,
        state
            .store()
            .delete_memory(&ns, &q.key, q.expected_revision, call.caller.principal()),
    )
    .await?;
    Ok(Json(outcome.into()))
}

/// Search memory: authorization and the namespace filter first, ranking (BM25, optional
/// embeddings, recency, importance) second. With `budget_tokens`, the greedy
/// value-per-token selection within the budget and its utilisation.
#[utoipa::path(post, path = "/v1/memory/search", tag = "memory",
    params(MemoryHeaders),
    request_body = MemorySearchRequest,
    responses((status = 200, description = "Ranked results", body = MemorySearchResponse)))]
async fn search_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<MemorySearchRequest>,
) -> Result<Json<MemorySearchResponse>, ApiError> {
    let call = resolve(&state, caller, &headers, named, BindingVerb::Get).await?;
    let asked: Vec<MemoryScope> = match &req.scopes {
        Some(s) => s.iter().map(|s| (*s).into()).collect(),
        None => call.policy.read_scopes.clone(),
    };
    // No policy applies to this agent (none selects it, or its memoryPolicyRef names
    // none): refused, not an empty answer that reads like "nothing remembered".
    if call.policy.policy.is_none()
        && !call.writer.is_application_writer
        && let Some(why) = &call.policy.restriction
    {
        return Err(ApiError::forbidden(why.clone()));
    }
    // 1. authorization, before any store call.
    let scopes = pipeline::searchable_scopes(&call.policy, &call.writer, &asked)?;
    if req.query.len() > 4096 {
        return Err(ApiError::invalid("query must be at most 4096 bytes"));
    }
    if let Some(e) = &req.embedding
        && (e.is_empty()
            || e.len() > call.policies.deployment.max_embedding_dims
            || e.iter().any(|x| !x.is_finite()))
    {
        return Err(ApiError::invalid(format!(
            "embedding must have 1 to {} finite values",
            call.policies.deployment.max_embedding_dims
        )));
    }
    let cap = call.policy.max_results.max(1) as usize;
    let limit = match req.limit {
        Some(0) => return Err(ApiError::invalid("limit must be at least 1")),
        Some(n) => (n as usize).min(cap),
        None => cap,
    };
    let query = CandidateQuery {
        terms: rank::query_terms(&req.query),
        kinds: req.kinds.iter().flatten().map(|k| (*k).into()).collect(),
        lexical_limit: (limit * 4).clamp(64, MAX_CANDIDATES),
        embedding: req.embedding.clone(),
        vector_limit: (limit * 4).clamp(64, MAX_CANDIDATES),
        now_ms: now_ms(),
    };
    if query.terms.is_empty() && query.embedding.is_none() {
        return Err(ApiError::invalid(
            "a search needs query words or an embedding",
        ));
    }
    // 2. namespace filter: each scope's candidates come from its own namespace only.
    let span = memory_span(Step::MemoryRead, "memory.search", &call);
    let mut searched = Vec::new();
    let candidates = traced(span.clone(), async {
        let mut candidates = Vec::new();
        for scope in scopes {
            let ns = call.namespace(&state, scope)?;
            candidates.extend(state.store().memory_candidates(&ns, &query).await?);
            searched.push(ns.key);
        }
        Ok::<_, ApiError>(candidates)
    })
    .await?;
    spans::record_count(&span, keys::COUNT, candidates.len() as u64);
    // 3. ranking.
    let ranked = rank::rank(
        candidates,
        req.embedding.as_deref(),
        query.now_ms,
        Weights::default(),
    );
    let (hits, budget) = match req.budget_tokens {
        Some(budget) => {
            let sel = rank::select_within_budget(ranked, budget, limit);
            let report = BudgetReport {
                budget_tokens: sel.budget_tokens,
                used_tokens: sel.used_tokens,
                considered: sel.considered,
                utilisation: sel.utilisation,
            };
            (sel.selected, Some(report))
        }
        None => (ranked.into_iter().take(limit).collect(), None),
    };
    let items = hits
        .iter()
        .enumerate()
        .map(|(i, s)| receipt::ReceiptItem {
            memory_id: s.record.id.clone(),
            rank: u32::try_from(i + 1).unwrap_or(u32::MAX),
            content_hash: s.record.content_hash.clone(),
            namespace: s.record.namespace.key.clone(),
            memory_key: s.record.memory_key.clone(),
        })
        .collect();
    let signed = receipt::encode(
        state.keyring(),
        &receipt::RecallReceipt {
            binding_id: call.binding.binding_id.as_str().to_owned(),
            epoch: call.binding.epoch,
            namespaces: searched,
            items,
            issued_at_ms: query.now_ms,
        },
    );
    let results = hits
        .into_iter()
        .map(|s| MemoryHit {
            record: s.record.into(),
            score: s.score,
            lexical: s.lexical,
            vector: s.vector,
            recency: s.recency,
            tokens: s.tokens,
        })
        .collect();
    Ok(Json(MemorySearchResponse {
        results,
        budget,
        receipt: signed,
    }))
}

async fn decide(
    state: &AppState,
    caller: Caller,
    scope: MemoryScope,
    headers: &MemoryCallHeaders,
    named: Option<String>,
    req: MemoryDecisionRequest,
    approve: bool,
) -> Result<Json<MemoryWriteResponse>, ApiError> {
    let call = resolve(state, caller, headers, named, BindingVerb::Update).await?;
    pipeline::check_memory_key(&req.key)?;
    if let Some(r) = &req.reason
        && (r.len() > 1024 || r.chars().any(|c| c.is_control() && c != '\n'))
    {
        return Err(ApiError::invalid(
            "reason must be at most 1024 printable bytes",
        ));
    }
    let ns = call.namespace(state, scope)?;
    let span = memory_span(Step::MemoryRead, "memory.get", &call);
    let current = traced(span, async {
        state
            .store()
            .get_memory(&ns, &req.key, true, now_ms())
            .await?
            .ok_or_else(|| ApiError::not_found("memory"))
    })
    .await?;
    authorize_decision(
        &call.policies.deployment,
        call.caller.principal(),
        call.is_worker(),
        &current.provenance.writer,
    )?;
    let operation = if approve {
        "memory.approve"
    } else {
        "memory.reject"
    };
    let span = memory_span(Step::MemoryWrite, operation, &call);
    let outcome = traced(
        span,
        state.store().decide_memory(
            &ns,
            &req.key,
            &MemoryDecision {
                approve,
                expected_revision: req.expected_revision,
                decided_by: call.caller.principal().to_owned(),
                reason: req.reason,
                at_ms: now_ms(),
            },
        ),
    )
    .await?;
    Ok(Json(outcome.into()))
}

/// Approve a pending (or revoked, under review) memory. Approvers only, never its writer.
#[utoipa::path(post, path = "/v1/memory/{scope}/records/approve", tag = "memory",
    params(ScopeParam, IdempotencyParam, MemoryHeaders),
    request_body = MemoryDecisionRequest,
    responses((status = 200, description = "Approved: now searchable", body = MemoryWriteResponse)))]
async fn approve_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    _key: IdempotencyKey,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<MemoryDecisionRequest>,
) -> Result<Json<MemoryWriteResponse>, ApiError> {
    decide(&state, caller, scope, &headers, named, req, true).await
}

/// Reject a pending (or revoked) memory: it stays stored for audit, never searchable.
#[utoipa::path(post, path = "/v1/memory/{scope}/records/reject", tag = "memory",
    params(ScopeParam, IdempotencyParam, MemoryHeaders),
    request_body = MemoryDecisionRequest,
    responses((status = 200, description = "Rejected", body = MemoryWriteResponse)))]
async fn reject_memory(
    State(state): State<AppState>,
    Authenticated(caller): Authenticated,
    ScopePath(scope): ScopePath,
    _key: IdempotencyKey,
    headers: MemoryCallHeaders,
    SubjectHeader(named): SubjectHeader,
    ApiJson(req): ApiJson<MemoryDecisionRequest>,
) -> Result<Json<MemoryWriteResponse>, ApiError> {
    decide(&state, caller, scope, &headers, named, req, false).await
}
