//! The HarnessBinding controller: one sandbox lease per conversation, fenced by a lease
//! generation (DESIGN §3, `spec/001_78d7ff78f70a2a2a.txt` §3).
//!
//! A reconcile is a few rounds of observe, decide, act:
//! - [`observe`] gathers what a decision reads into one [`observe::Snapshot`]: the watch
//!   caches, and a live or store read only where the decision asks for one (before a
//!   worker is replaced on what a cache says, the live objects confirm it);
//! - [`decide`] is pure: `(binding, snapshot, now) -> Plan` (status and conditions,
//!   Events, effects on claims, the Sandbox and the store fence, the requeue), or one
//!   more read it needs; its table tests are in `tests.rs`;
//! - [`act`] applies the plan at the edges, in the plan's order, and reports what the
//!   effects found back to the next round.
//!
//! Every step is idempotent, so a crash between any two of them converges on restart:
//! 1. a new lease generation is first written to the binding status (CAS; a 409 means
//!    someone else moved, and the reconcile starts over);
//! 2. the store fence is raised to `(epoch, generation)`, so every write carrying an
//!    older generation is refused from here on;
//! 3. claims of older generations are deleted *before* the new claim is created, so a
//!    binding never has two live claims;
//! 4. the new `SandboxClaim` (named from the binding id and the generation, owned by the
//!    binding) is created, and its sandbox awaited;
//! 5. the worker pod's image digest and protocol version are checked against the
//!    `SandboxProfile`, and only then is the lease `ready` (CAS again).
//!
//! Every condition and Event reason is a [`reason::Reason`].

pub mod act;
pub mod decide;
pub mod observe;
pub mod reason;

use std::{sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        finalizer::{Event as FinalizerEvent, finalizer},
        reflector::ObjectRef,
    },
};
use serde_json::json;
use tracing::Instrument;

use super::{Context, Error, admission::Entry};
use crate::telemetry::spans::{self, Step as SpanStep, keys};
use crate::{
    api::{BINDING_ID_LABEL, HarnessBinding},
    domain::{ids::BindingId, state::BindingRecord},
};

/// Moved to [`crate::api::labels`]; kept here for existing imports.
pub use crate::api::RESUME_ANNOTATION;

pub use reason::Reason;

/// Finalizer that releases the claim before the binding goes away.
pub const FINALIZER: &str = "harness-engine.dev/release-lease";
/// Label on every claim we create: the owning binding's UID.
pub const BINDING_UID_LABEL: &str = "harness-engine.dev/binding-uid";
/// Label on every claim we create: the owning binding's name.
pub const BINDING_NAME_LABEL: &str = "harness-engine.dev/binding";
/// Label on every claim we create: the lease generation it was made for.
pub const GENERATION_LABEL: &str = "harness-engine.dev/lease-generation";
/// Label on every claim we create: the SandboxProfile's name (at most 63 characters).
/// `limits.maxActiveLeases` counts the claims that carry it.
pub const PROFILE_LABEL: &str = "harness-engine.dev/sandbox-profile";
/// Label on every claim we create: the profile's `workloadClass`, when set.
pub const WORKLOAD_CLASS_LABEL: &str = "harness-engine.dev/workload-class";
/// Label on every claim we create: the profile's `egressPolicyClass`.
pub const EGRESS_CLASS_LABEL: &str = "harness-engine.dev/egress-policy-class";

/// A label value from `v`: at most 63 characters, ending in an alphanumeric.
pub fn truncate_label(v: &str) -> String {
    v.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['-', '.', '_'])
        .to_owned()
}

// Condition types.
pub const READY: &str = "Ready";
pub const SANDBOX_READY: &str = "SandboxReady";
pub const WORKER_VERIFIED: &str = "WorkerVerified";
pub const PROFILE_ACCEPTED: &str = "ProfileAccepted";
pub const STATE_DURABLE: &str = "StateDurable";
/// False while an effect of the run ledger waits with an unknown outcome for a person.
pub const EFFECTS_SETTLED: &str = "EffectsSettled";
pub const HIBERNATED: &str = "Hibernated";
/// True once the current lease replaced an earlier one; the reason says why.
pub const REPLACED: &str = "Replaced";

/// Longest a binding reconcile may take (it normally takes milliseconds: a few writes).
pub const RECONCILE_DEADLINE: Duration = Duration::from_secs(30);

/// Entry point from the controller runtime.
pub async fn reconcile(binding: Arc<HarnessBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(action) = ctx.not_leading() {
        return Ok(action);
    }
    // A binding without a lease starts only when a claiming slot is free; until then it
    // waits in the admission queue, which wakes it when a slot is handed to it (no API
    // call, no span, no timer but a slow safety net).
    let starting = binding.meta().deletion_timestamp.is_none()
        && binding
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .is_none();
    let _slot = match ctx.admission() {
        Some(queue) => {
            let key = ObjectRef::from_obj(&*binding);
            let entry = if starting {
                Some(queue.enter(&key))
            } else {
                queue.leave(&key);
                None
            };
            let waiting = i64::try_from(queue.waiting()).unwrap_or(i64::MAX);
            ctx.metrics.bindings_waiting_to_start.set(waiting);
            match entry {
                Some(Entry::Admitted(slot)) => Some(slot),
                Some(Entry::Waiting { position, newly }) => {
                    if newly {
                        ctx.metrics.waited("ClaimingSlot");
                    }
                    tracing::trace!(position, "waiting for a claiming slot");
                    return Ok(Action::requeue(ADMISSION_RECHECK));
                }
                None => None,
            }
        }
        None => None,
    };

    let started = std::time::Instant::now();
    let ns = binding.namespace().unwrap_or_default();
    let api: Api<HarnessBinding> = Api::namespaced(ctx.client.clone(), &ns);
    // One trace per convergence: every attempt until the binding is Ready is a sibling
    // `sandbox.claim_or_reuse` span under one anchor (spec 000, "Distributed tracing").
    let anchor_key = binding.uid().unwrap_or_default();
    let (anchor, attempt) = ctx.anchors.attempt(&anchor_key, "harness_binding");
    let span = spans::step_in(&anchor, SpanStep::SandboxClaimOrReuse);
    spans::record(&span, keys::OPERATION, "reconcile.binding");
    spans::record_count(&span, keys::ATTEMPT, attempt);
    if let Some(id) = binding.labels().get(BINDING_ID_LABEL) {
        spans::record(&span, keys::BINDING_ID, id.as_str());
    }
    if let Some(lease) = binding.status.as_ref().and_then(|s| s.lease.as_ref()) {
        spans::record_count(
            &span,
            keys::LEASE_GENERATION,
            u64::try_from(lease.generation).unwrap_or(0),
        );
    }
    let work = async {
        if let Some(caches) = ctx.caches() {
            caches.ready().await?;
        }

        let mut binding = binding;
        match prepare_metadata(&api, &binding, &ctx).await? {
            Prepared::Done => {}
            // Go on with the object the patch returned: waiting for the watch to bring
            // it back would cost a second pass through the queue.
            Prepared::Patched(patched) => binding = Arc::new(*patched),
            Prepared::Stop(action) => return Ok(action),
        }
        // A status write that lost its compare-and-set most often read a binding the
        // watch had not refreshed yet (our own previous write): read it live and go
        // again once, instead of waiting for a requeue.
        for attempt in 0..2 {
            let action = finalize(&api, binding.clone(), &ctx).await?;
            if action != conflict_retry() || attempt == 1 {
                return Ok(action);
            }
            match api.get_opt(&binding.name_any()).await? {
                Some(fresh) => binding = Arc::new(fresh),
                None => return Ok(Action::await_change()),
            }
        }
        Ok(conflict_retry())
    }
    .instrument(span.clone());
    // The Kubernetes client has no read timeout of its own: a request the API server
    // accepted and never answered (seen while it restarts) would hold this binding's
    // reconciles for minutes. Bounded, it fails and is retried with backoff.
    let result = match tokio::time::timeout(RECONCILE_DEADLINE, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "the reconcile did not finish within {} s (a Kubernetes or store call never answered)",
            RECONCILE_DEADLINE.as_secs()
        ))),
    };
    match &result {
        Ok(_) => spans::record_ok(&span),
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 => {
            spans::record_error(&span, "conflict")
        }
        Err(_) => spans::record_error(&span, "unavailable"),
    }
    ctx.metrics
        .observe_reconcile("harnessbinding", &result, started.elapsed());
    result
}

async fn finalize(
    api: &Api<HarnessBinding>,
    binding: Arc<HarnessBinding>,
    ctx: &Context,
) -> Result<Action, Error> {
    finalizer(api, FINALIZER, binding, |event| async {
        match event {
            FinalizerEvent::Apply(b) => apply(&b, ctx).await,
            FinalizerEvent::Cleanup(b) => cleanup(&b, ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

/// What [`prepare_metadata`] did.
enum Prepared {
    /// Nothing to do: the binding carries both.
    Done,
    /// Patched: the binding as the API server now has it.
    Patched(Box<HarnessBinding>),
    /// Stop here and come back (someone else moved first).
    Stop(Action),
}

/// A new binding needs our finalizer and the binding-id label (the worker
/// authenticator finds the store binding through it): both in one patch, guarded by
/// the `resourceVersion` it was read at.
async fn prepare_metadata(
    api: &Api<HarnessBinding>,
    binding: &HarnessBinding,
    ctx: &Context,
) -> Result<Prepared, Error> {
    if binding.meta().deletion_timestamp.is_some() {
        return Ok(Prepared::Done);
    }
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);
    let labelled = binding.labels().get(BINDING_ID_LABEL).map(String::as_str) == Some(id.as_str());
    let finalizers = binding.finalizers();
    let finalized = finalizers.iter().any(|f| f == FINALIZER);
    if labelled && finalized {
        return Ok(Prepared::Done);
    }
    let mut all: Vec<String> = finalizers.to_vec();
    if !finalized {
        all.push(FINALIZER.to_owned());
    }
    let patch = json!({"metadata": {
        "resourceVersion": binding.resource_version(),
        "labels": {BINDING_ID_LABEL: id.as_str()},
        "finalizers": all,
    }});
    match api
        .patch(
            &binding.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(patched) => Ok(Prepared::Patched(Box::new(patched))),
        // Someone moved first (perhaps only its status, which triggers nothing): look
        // again shortly.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Prepared::Stop(conflict_retry())),
        Err(e) => Err(e.into()),
    }
}

/// A binding waiting in the admission queue is woken when a slot is handed to it; this
/// is only the safety net should a wake be lost.
const ADMISSION_RECHECK: Duration = Duration::from_secs(60);

/// Requeue soon after a conflict: someone else moved the object.
fn conflict_retry() -> Action {
    Action::requeue(Duration::from_millis(200))
}

/// The `SandboxClaim` name of a generation: from the binding id (a keyed digest, so no
/// user data leaks into names) and the generation.
pub fn claim_name(id: &BindingId, generation: i64) -> String {
    let hex = id.as_str().trim_start_matches("hb_");
    format!("hb-{hex}-g{generation}")
}

/// Rounds of observe / decide / act in one reconcile: at most a clear, a new
/// generation, the fence, the older claims, the claim and the worker, with room for a
/// fence found ahead.
const MAX_ROUNDS: usize = 12;
/// Reads one decision may ask for, at most (each [`decide::Need`] once).
const MAX_NEEDS: usize = 8;

async fn apply(binding: &HarnessBinding, ctx: &Context) -> Result<Action, Error> {
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);

    // The worker authenticator finds the store binding through this label
    // (`prepare_metadata` sets it before the first apply).
    if binding.labels().get(BINDING_ID_LABEL).map(String::as_str) != Some(id.as_str()) {
        let api: Api<HarnessBinding> =
            Api::namespaced(ctx.client.clone(), &binding.namespace().unwrap_or_default());
        // The watch brings the labelled binding back as a new trigger.
        return Ok(match prepare_metadata(&api, binding, ctx).await? {
            Prepared::Stop(action) => action,
            Prepared::Done | Prepared::Patched(_) => Action::await_change(),
        });
    }
    ensure_store_binding(binding, ctx, &id).await?;

    let mut binding = binding.clone();
    let mut carry = observe::Carry::default();
    for _ in 0..MAX_ROUNDS {
        let plan = plan_round(&binding, ctx, &id, carry.clone()).await?;
        match act::execute(plan, &binding, ctx, &id, carry).await? {
            act::Outcome::Done(action) => return Ok(action),
            act::Outcome::Continue(next, next_carry) => {
                binding = *next;
                carry = next_carry;
            }
        }
    }
    Err(Error::Internal(format!(
        "no decision settled within {MAX_ROUNDS} rounds"
    )))
}

/// Observe, then decide, reading more while the decision asks for it.
async fn plan_round(
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
    carry: observe::Carry,
) -> Result<decide::Plan, Error> {
    let mut snap = observe::snapshot(binding, ctx, id, carry).await?;
    let mut asked = Vec::new();
    while asked.len() <= MAX_NEEDS {
        let now = Time(Timestamp::now());
        match decide::decide(binding, &snap, &now)? {
            decide::Decision::Act(plan) => return Ok(plan),
            decide::Decision::Observe(need) if asked.contains(&need) => {
                return Err(Error::Internal(format!("{need:?} asked for twice")));
            }
            decide::Decision::Observe(need) => {
                observe::more(&mut snap, need, binding, ctx).await?;
                asked.push(need);
            }
        }
    }
    Err(Error::Internal(
        "a decision asked for too many reads".into(),
    ))
}

/// The store's binding row (idempotent; once per process per binding).
async fn ensure_store_binding(
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
) -> Result<(), Error> {
    if ctx.ensured(id.as_str()) {
        return Ok(());
    }
    let spec = &binding.spec;
    let record = BindingRecord {
        binding_id: id.clone(),
        environment: ctx.keyring.environment().to_owned(),
        owner: crate::domain::ids::SubjectRef::parse(&spec.subject_ref)
            .ok_or_else(|| Error::Invalid("spec.subjectRef is not a keyed digest".into()))?,
        agent_id: spec.agent_id.clone(),
        conversation_id: spec.conversation_id.clone(),
        harness: spec.harness.id.as_str().to_owned(),
        epoch: u64::try_from(spec.epoch).unwrap_or(0),
        lease_generation: 0,
        created_at_ms: crate::store::now_ms(),
    };
    ctx.store
        .ensure_binding(&record)
        .await
        .map_err(observe::store_err)?;
    ctx.mark_ensured(id.as_str());
    Ok(())
}

/// The binding is being deleted: revoke, release, let it go.
async fn cleanup(binding: &HarnessBinding, ctx: &Context) -> Result<Action, Error> {
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);
    let plan = decide::release(binding, &Time(Timestamp::now()));
    match act::execute(plan, binding, ctx, &id, observe::Carry::default()).await? {
        act::Outcome::Done(action) => Ok(action),
        act::Outcome::Continue(..) => Ok(Action::requeue(Duration::ZERO)),
    }
}

#[cfg(test)]
mod tests;
