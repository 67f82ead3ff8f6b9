//! Which binding a request may touch, and the scope the store sees for it.
//!
//! Rules (DESIGN §6):
//! - a worker is confined to the one binding its pod holds the lease of: any other
//!   binding id is `forbidden_scope`, and its fence headers must equal the scope the
//!   server derived (else `stale_epoch` / `stale_lease`);
//! - a principal or service caller reaches bindings owned by the subjects it may act for;
//!   naming a subject it may not act for is `forbidden_scope`; a binding that is absent
//!   or owned by someone else is `not_found` either way, so ids leak nothing;
//! - the store's fence decides the final word on epoch and lease generation, atomically
//!   with the write.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::middleware::traced;
use super::{
    AppState,
    auth::{BindingVerb, Caller},
    dto::Harness,
    error::{ApiError, ErrorCode},
    extract::{Authenticated, BindingPath, Codec, SubjectHeader, WorkerFence},
};
use crate::{
    domain::{
        ids::{BindingId, SubjectRef},
        state::{BindingRecord, StateScope},
    },
    telemetry::spans::{self, Step},
};

/// The subject a bind acts for.
pub async fn bind_subject(
    state: &AppState,
    caller: &Caller,
    named: Option<String>,
) -> Result<String, ApiError> {
    traced(
        spans::step(Step::AuthzAgent),
        bind_subject_inner(state, caller, named),
    )
    .await
}

async fn bind_subject_inner(
    state: &AppState,
    caller: &Caller,
    named: Option<String>,
) -> Result<String, ApiError> {
    if matches!(caller, Caller::Worker(_)) {
        return Err(ApiError::forbidden(
            "a sandbox worker cannot create bindings",
        ));
    }
    if !state
        .auth()
        .may_use_bindings(caller, BindingVerb::Create)
        .await?
    {
        return Err(ApiError::forbidden(format!(
            "{} may not create bindings",
            caller.principal()
        )));
    }
    match (caller, named) {
        (_, Some(subject)) => {
            check_may_act_for(state, caller, &subject).await?;
            Ok(subject)
        }
        (Caller::Principal { subjects, .. }, None) => match subjects.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(ApiError::invalid(
                "this principal may act for several subjects: name one in the Harness-Subject header",
            )),
        },
        (Caller::Service(identity), None) => Ok(identity.username.clone()),
        (Caller::Worker(_), None) => Err(ApiError::forbidden(
            "a sandbox worker cannot create bindings",
        )),
    }
}

async fn check_may_act_for(
    state: &AppState,
    caller: &Caller,
    subject: &str,
) -> Result<(), ApiError> {
    let own = matches!(caller, Caller::Service(identity) if identity.username == subject);
    if own || state.auth().may_act_for(caller, subject).await? {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "{} may not act for the subject named in Harness-Subject",
            caller.principal()
        )))
    }
}

/// Binding records recently read for worker calls. A worker call uses only the parts of a
/// record that never change for a binding id (owner, agent, conversation: the id is their
/// keyed digest) and the harness, which changes only with the epoch; its epoch and lease
/// generation come from the request and are checked by the store's fence. So a short-lived
/// copy is safe there, and saves a store read on each of the two calls of every turn.
/// Reads that report the fence (`GET /v1/bindings/{id}`, interrupts) always read the store.
pub struct BindingCache {
    entries: Mutex<HashMap<BindingId, (Instant, BindingRecord)>>,
}

/// How long a cached record serves worker calls.
const BINDING_CACHE_TTL: Duration = Duration::from_secs(5);
/// Records kept at most; the map starts over when full rather than grow.
const BINDING_CACHE_MAX: usize = 10_000;

impl Default for BindingCache {
    fn default() -> Self {
        BindingCache {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl BindingCache {
    fn get(&self, id: &BindingId) -> Option<BindingRecord> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(id)
            .filter(|(at, _)| at.elapsed() < BINDING_CACHE_TTL)
            .map(|(_, r)| r.clone())
    }

    fn put(&self, record: &BindingRecord) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= BINDING_CACHE_MAX {
            entries.retain(|_, (at, _)| at.elapsed() < BINDING_CACHE_TTL);
            if entries.len() >= BINDING_CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(record.binding_id.clone(), (Instant::now(), record.clone()));
    }
}

/// How current the loaded record must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// The caller reads the record's epoch or lease generation: read the store.
    Current,
    /// A worker call: identity and harness suffice (see [`BindingCache`]).
    Identity,
}

async fn load(
    state: &AppState,
    id: &BindingId,
    freshness: Freshness,
) -> Result<Option<BindingRecord>, ApiError> {
    if freshness == Freshness::Identity
        && let Some(record) = state.bindings().get(id)
    {
        return Ok(Some(record));
    }
    let record = state.store().get_binding(id).await?;
    if let Some(record) = &record {
        state.bindings().put(record);
    }
    Ok(record)
}

/// Loads the binding `id` if `caller` may use it with `verb`.
pub async fn binding(
    state: &AppState,
    caller: &Caller,
    id: &BindingId,
    verb: BindingVerb,
    named: Option<String>,
) -> Result<BindingRecord, ApiError> {
    let span = authz_span(id);
    traced(
        span,
        binding_with(state, caller, id, verb, named, Freshness::Current),
    )
    .await
}

/// [`binding`] for a worker call (state, objects, streams).
pub async fn worker_binding(
    state: &AppState,
    caller: &Caller,
    id: &BindingId,
    verb: BindingVerb,
    named: Option<String>,
) -> Result<BindingRecord, ApiError> {
    let span = authz_span(id);
    traced(
        span,
        binding_with(state, caller, id, verb, named, Freshness::Identity),
    )
    .await
}

/// [`worker_binding`] and [`worker_scope`] in one `authz.agent` span: the binding a
/// worker call may touch and the scope the store sees for it.
#[allow(clippy::too_many_arguments)]
pub async fn worker_access(
    state: &AppState,
    caller: &Caller,
    id: &BindingId,
    verb: BindingVerb,
    named: Option<String>,
    fence: &WorkerFence,
    codec: Option<String>,
) -> Result<(BindingRecord, StateScope), ApiError> {
    let span = authz_span(id);
    spans::record_count(&span, spans::keys::EPOCH, fence.epoch);
    spans::record_count(&span, spans::keys::LEASE_GENERATION, fence.lease_generation);
    traced(span, async {
        let record = binding_with(state, caller, id, verb, named, Freshness::Identity).await?;
        let scope = worker_scope(state, caller, &record, fence, codec)?;
        Ok::<_, ApiError>((record, scope))
    })
    .await
}

/// Every worker call on `/v1/bindings/{binding_id}/...` (state, objects, streams, the
/// run ledger) starts here: the caller authenticated, confined to the binding in the
/// path (a sandbox worker to its own; a control-plane caller by RBAC and
/// `Harness-Subject`), the verb by method (`GET`: get, else update), and the fenced
/// scope from `Harness-Epoch`, `Harness-Lease-Generation` and `Harness-Codec`, checked
/// against a worker's own lease ([`check_worker_fence`]). The store's fence check then
/// decides in the same atomic step as the operation.
pub struct WorkerAccess {
    pub caller: Caller,
    pub record: BindingRecord,
    pub scope: StateScope,
}

impl WorkerAccess {
    /// The caller is the binding's sandbox worker (not a control-plane service).
    pub fn sandbox_worker(&self) -> bool {
        matches!(self.caller, Caller::Worker(_))
    }
}

impl axum::extract::FromRequestParts<AppState> for WorkerAccess {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<Self, ApiError> {
        let Authenticated(caller) = Authenticated::from_request_parts(parts, state).await?;
        let BindingPath(id) = BindingPath::from_request_parts(parts, state).await?;
        let fence = WorkerFence::from_request_parts(parts, state).await?;
        let Codec(codec) = Codec::from_request_parts(parts, state).await?;
        let SubjectHeader(named) = SubjectHeader::from_request_parts(parts, state).await?;
        let verb = if parts.method == axum::http::Method::GET {
            BindingVerb::Get
        } else {
            BindingVerb::Update
        };
        let (record, scope) =
            worker_access(state, &caller, &id, verb, named, &fence, codec).await?;
        Ok(WorkerAccess {
            caller,
            record,
            scope,
        })
    }
}

/// A sandbox worker presents exactly the epoch and lease generation its credentials
/// carry: `stale_epoch` / `stale_lease` otherwise (with the presented and current
/// values). Control-plane callers are fenced by the store alone.
pub fn check_worker_fence(
    caller: &Caller,
    epoch: u64,
    lease_generation: u64,
) -> Result<(), ApiError> {
    let Caller::Worker(worker) = caller else {
        return Ok(());
    };
    if epoch != worker.epoch {
        return Err(ApiError::new(
            ErrorCode::StaleEpoch,
            format!(
                "epoch {epoch} is not the epoch {} of this worker's lease",
                worker.epoch
            ),
        )
        .with_details(serde_json::json!({"presented": epoch, "current": worker.epoch})));
    }
    if lease_generation != worker.lease_generation {
        return Err(ApiError::new(
            ErrorCode::StaleLease,
            format!(
                "lease generation {lease_generation} is not the generation {} this worker's sandbox holds",
                worker.lease_generation
            ),
        )
        .with_details(
            serde_json::json!({"presented": lease_generation, "current": worker.lease_generation}),
        ));
    }
    Ok(())
}

/// The `authz.agent` span of a decision on binding `id` (a keyed digest: allowed).
fn authz_span(id: &BindingId) -> tracing::Span {
    let span = spans::step(Step::AuthzAgent);
    spans::record(&span, spans::keys::BINDING_ID, id.as_str());
    span
}

async fn binding_with(
    state: &AppState,
    caller: &Caller,
    id: &BindingId,
    verb: BindingVerb,
    named: Option<String>,
    freshness: Freshness,
) -> Result<BindingRecord, ApiError> {
    let not_found = || ApiError::not_found("binding");
    let owners: Vec<SubjectRef> = match caller {
        Caller::Worker(worker) => {
            if &worker.binding_id != id {
                return Err(ApiError::forbidden(
                    "this worker's credentials are scoped to another binding",
                ));
            }
            let record = load(state, id, freshness).await?.ok_or_else(not_found)?;
            if record.agent_id != worker.agent_id
                || record.conversation_id != worker.conversation_id
                || record.owner.as_str() != worker.subject_ref
            {
                return Err(ApiError::forbidden(format!(
                    "HarnessBinding {} names a binding id whose identity is not its own",
                    worker.binding_ref
                )));
            }
            return Ok(record);
        }
        Caller::Principal { subjects, .. } => {
            if !state.auth().may_use_bindings(caller, verb).await? {
                return Err(ApiError::forbidden(format!(
                    "{} may not {} bindings",
                    caller.principal(),
                    verb.as_str()
                )));
            }
            match named {
                Some(subject) => {
                    check_may_act_for(state, caller, &subject).await?;
                    vec![state.keyring().subject_ref(&subject)]
                }
                None => subjects
                    .iter()
                    .map(|s| state.keyring().subject_ref(s))
                    .collect(),
            }
        }
        Caller::Service(identity) => {
            if !state.auth().may_use_bindings(caller, verb).await? {
                return Err(ApiError::forbidden(format!(
                    "{} may not {} harnessbindings in namespace {}",
                    caller.principal(),
                    verb.as_str(),
                    identity.namespace
                )));
            }
            let subject = named.unwrap_or_else(|| identity.username.clone());
            check_may_act_for(state, caller, &subject).await?;
            vec![state.keyring().subject_ref(&subject)]
        }
    };
    let record = load(state, id, freshness).await?.ok_or_else(not_found)?;
    if owners.contains(&record.owner) {
        Ok(record)
    } else {
        Err(not_found())
    }
}

/// The scope of a worker call: the binding, the presented fence and codec. For a worker
/// caller the presented fence must be the one its pod holds.
pub fn worker_scope(
    state: &AppState,
    caller: &Caller,
    record: &BindingRecord,
    fence: &WorkerFence,
    codec: Option<String>,
) -> Result<StateScope, ApiError> {
    check_worker_fence(caller, fence.epoch, fence.lease_generation)?;
    Ok(StateScope {
        binding_id: record.binding_id.clone(),
        environment: state.keyring().environment().to_owned(),
        harness: record.harness.clone(),
        epoch: fence.epoch,
        codec: codec.unwrap_or_else(|| Harness::default_codec(&record.harness).to_owned()),
        lease_generation: fence.lease_generation,
    })
}

/// The scope of a control-plane call on interrupts: the binding's current fence, or the
/// epoch the caller names (so a resume aimed at a cleared epoch is refused).
pub fn control_scope(state: &AppState, record: &BindingRecord, epoch: Option<u64>) -> StateScope {
    StateScope {
        binding_id: record.binding_id.clone(),
        environment: state.keyring().environment().to_owned(),
        harness: record.harness.clone(),
        epoch: epoch.unwrap_or(record.epoch),
        codec: Harness::default_codec(&record.harness).to_owned(),
        lease_generation: record.lease_generation,
    }
}
