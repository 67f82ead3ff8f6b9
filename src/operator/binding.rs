//! The HarnessBinding controller: one sandbox lease per conversation, fenced by a lease
//! generation (DESIGN §3, `spec/001_78d7ff78f70a2a2a.txt` §3).
//!
//! Every reconcile reads the binding, decides the next step from its status and the
//! Agent Sandbox objects it holds, takes that step, and writes the outcome back with a
//! compare-and-set on `resourceVersion`. Each step is idempotent, so a crash between any
//! two of them converges on restart:
//!
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

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{
        controller::Action,
        events::{Event, EventType},
        finalizer::{Event as FinalizerEvent, finalizer},
    },
};
use serde_json::json;

use tracing::Instrument;

use super::{Context, Error};
use crate::telemetry::spans::{self, Step as SpanStep, keys};
use crate::{
    api::{
        HarnessBinding, HarnessBindingStatus, Lease, Lifecycle, SandboxProfile, StateProjection,
        binding::DurabilityStatus,
        conditions::{self, Desired, FALSE, TRUE},
        profile::HibernationPolicy,
        sandbox::{self, Sandbox, SandboxClaim},
    },
    domain::{
        duration,
        ids::BindingId,
        state::{BindingRecord, Durability, StateScope},
    },
    server::auth::kubernetes::BINDING_ID_LABEL,
    store::StoreError,
};

/// Finalizer that releases the claim before the binding goes away.
pub const FINALIZER: &str = "harness-engine.dev/release-lease";
/// Label on every claim we create: the owning binding's UID.
pub const BINDING_UID_LABEL: &str = "harness-engine.dev/binding-uid";
/// Label on every claim we create: the owning binding's name.
pub const BINDING_NAME_LABEL: &str = "harness-engine.dev/binding";
/// Label on every claim we create: the lease generation it was made for.
pub const GENERATION_LABEL: &str = "harness-engine.dev/lease-generation";
/// Annotation a client sets (any RFC 3339 time after the hibernation) to resume a
/// hibernated binding; the data plane's bind does the same.
pub const RESUME_ANNOTATION: &str = "harness-engine.dev/resume-requested-at";

// Condition types.
pub const READY: &str = "Ready";
pub const SANDBOX_READY: &str = "SandboxReady";
pub const WORKER_VERIFIED: &str = "WorkerVerified";
pub const PROFILE_ACCEPTED: &str = "ProfileAccepted";
pub const STATE_DURABLE: &str = "StateDurable";
pub const HIBERNATED: &str = "Hibernated";
/// True once the current lease replaced an earlier one; the reason says why.
pub const REPLACED: &str = "Replaced";

/// Entry point from the controller runtime.
pub async fn reconcile(binding: Arc<HarnessBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A binding without a lease starts only when a claiming permit is free; until then
    // it yields its slot (a short, spread requeue, no API call, no span) to bindings
    // further along.
    let starting = binding.meta().deletion_timestamp.is_none()
        && binding
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .is_none();
    let _permit = if starting && ctx.claims_limited() {
        match ctx.claim_permit() {
            Some(p) => Some(p),
            None => {
                ctx.metrics.waited("ClaimingSlot");
                return Ok(Action::requeue(spread(
                    binding.meta().uid.as_deref().unwrap_or_default(),
                )));
            }
        }
    } else {
        None
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
    let result = async {
        if let Some(caches) = ctx.caches() {
            caches.ready().await?;
        }

        if let Some(action) = prepare_metadata(&api, &binding, &ctx).await? {
            return Ok(action);
        }
        let mut binding = binding;
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
    .instrument(span.clone())
    .await;
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

/// A new binding needs our finalizer and the binding-id label (the worker
/// authenticator finds the store binding through it): both in one patch, guarded by
/// the `resourceVersion` it was read at. `Some(next)` when it had something to do.
async fn prepare_metadata(
    api: &Api<HarnessBinding>,
    binding: &HarnessBinding,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    if binding.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);
    let labelled = binding.labels().get(BINDING_ID_LABEL).map(String::as_str) == Some(id.as_str());
    let finalizers = binding.finalizers();
    let finalized = finalizers.iter().any(|f| f == FINALIZER);
    if labelled && finalized {
        return Ok(None);
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
        // The watch brings the labelled, finalized binding back as a new trigger.
        Ok(_) => Ok(Some(Action::await_change())),
        // Someone moved first (perhaps only its status, which triggers nothing): look
        // again shortly.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(conflict_retry())),
        Err(e) => Err(e.into()),
    }
}

/// 250 to 500 ms, spread by `key` so that waiting bindings do not all come back at once.
fn spread(key: &str) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    Duration::from_millis(250 + h.finish() % 250)
}

/// Requeue soon after a conflict: someone else moved the object.
fn conflict_retry() -> Action {
    Action::requeue(Duration::from_millis(200))
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn time_plus(t: &Time, d: Duration) -> Time {
    Time(t.0.checked_add(jiff_span(d)).unwrap_or(Timestamp::MAX))
}

fn jiff_span(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// Time from now until `t` (zero when past).
fn until(t: &Time) -> Duration {
    let now = Timestamp::now();
    if t.0 <= now {
        Duration::ZERO
    } else {
        Duration::try_from(t.0.duration_since(now)).unwrap_or(Duration::ZERO)
    }
}

fn since(t: &Time) -> Duration {
    let now = Timestamp::now();
    if t.0 >= now {
        Duration::ZERO
    } else {
        Duration::try_from(now.duration_since(t.0)).unwrap_or(Duration::ZERO)
    }
}

/// The `SandboxClaim` name of a generation: from the binding id (a keyed digest, so no
/// user data leaks into names) and the generation.
pub fn claim_name(id: &BindingId, generation: i64) -> String {
    let hex = id.as_str().trim_start_matches("hb_");
    format!("hb-{hex}-g{generation}")
}

/// What a profile allows, resolved for one binding.
struct Resolved {
    profile: SandboxProfile,
    claim_deadline: Duration,
    idle_ttl: Duration,
    max_lifetime: Duration,
}

/// A working copy of the status and the events to publish once it is written.
struct Step<'a> {
    binding: &'a HarnessBinding,
    status: HarnessBindingStatus,
    events: Vec<(EventType, &'static str, String)>,
    now: Time,
}

impl<'a> Step<'a> {
    fn new(binding: &'a HarnessBinding) -> Self {
        Step {
            binding,
            status: binding.status.clone().unwrap_or_default(),
            events: Vec::new(),
            now: now(),
        }
    }

    fn condition(&mut self, type_: &'static str, ok: bool, reason: &'static str, message: String) {
        let generation = self.binding.metadata.generation;
        conditions::set(
            &mut self.status.conditions,
            Desired {
                type_,
                status: if ok { TRUE } else { FALSE },
                reason,
                message,
            },
            generation,
            &self.now,
        );
    }

    fn event(&mut self, type_: EventType, reason: &'static str, note: String) {
        self.events.push((type_, reason, note));
    }

    fn lifecycle(&mut self, lifecycle: Lifecycle) {
        self.status.lifecycle = Some(lifecycle);
    }

    fn changed(&self) -> bool {
        self.binding.status.as_ref() != Some(&self.status)
    }

    /// Compare-and-set the status on the `resourceVersion` this reconcile read, then
    /// publish the events. `Ok(None)` means a conflict: requeue and start over.
    async fn commit(mut self, ctx: &Context) -> Result<Option<HarnessBinding>, Error> {
        self.status.observed_generation = self.binding.metadata.generation;
        if !self.changed() && self.events.is_empty() {
            return Ok(Some(self.binding.clone()));
        }
        let written = if self.changed() {
            let mut object = self.binding.clone();
            object.status = Some(self.status.clone());
            match super::replace_status(ctx, &object).await? {
                Some(written) => written,
                None => return Ok(None),
            }
        } else {
            self.binding.clone()
        };
        let reference = self.binding.object_ref(&());
        // Events of one reason are folded into a series per action; the generation in
        // the action keeps each lease generation's events (and notes) apart.
        let generation = self
            .status
            .lease
            .as_ref()
            .map(|l| l.generation)
            .unwrap_or(0);
        for (type_, reason, note) in self.events {
            ctx.publish(
                &reference,
                Event {
                    type_,
                    reason: reason.into(),
                    note: Some(note),
                    action: format!("{reason}Generation{generation}"),
                    secondary: None,
                },
            )
            .await;
        }
        Ok(Some(written))
    }
}

async fn apply(binding: &HarnessBinding, ctx: &Context) -> Result<Action, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);

    // The worker authenticator finds the store binding through this label
    // (`prepare_metadata` sets it before the first apply).
    if binding.labels().get(BINDING_ID_LABEL).map(String::as_str) != Some(id.as_str()) {
        let api: Api<HarnessBinding> = Api::namespaced(ctx.client.clone(), &ns);
        return Ok(prepare_metadata(&api, binding, ctx)
            .await?
            .unwrap_or_else(Action::await_change));
    }

    let epoch = u64::try_from(spec.epoch).unwrap_or(0);
    let record = BindingRecord {
        binding_id: id.clone(),
        environment: ctx.keyring.environment().to_owned(),
        owner: crate::domain::ids::SubjectRef::parse(&spec.subject_ref)
            .ok_or_else(|| Error::Invalid("spec.subjectRef is not a keyed digest".into()))?,
        agent_id: spec.agent_id.clone(),
        conversation_id: spec.conversation_id.clone(),
        harness: spec.harness.id.as_str().to_owned(),
        epoch,
        lease_generation: 0,
        created_at_ms: crate::store::now_ms(),
    };
    if !ctx.ensured(id.as_str()) {
        ctx.store.ensure_binding(&record).await.map_err(store_err)?;
        ctx.mark_ensured(id.as_str());
    }

    let mut step = Step::new(binding);
    let resolved = match resolve_profile(binding, ctx, &mut step).await? {
        Some(r) => r,
        None => {
            // The binding cannot progress until the profile is fixed; a profile change
            // requeues it (see the profile watch in `operator::run_controllers`).
            if step.status.lease.is_none() {
                step.lifecycle(Lifecycle::Failed);
            }
            step.condition(
                READY,
                false,
                "ProfileNotAccepted",
                "the SandboxProfile does not accept this binding (see ProfileAccepted)".into(),
            );
            return Ok(match step.commit(ctx).await? {
                Some(_) => Action::requeue(Duration::from_secs(60)),
                None => conflict_retry(),
            });
        }
    };

    let lease = step.status.lease.clone();
    let lifecycle = step.status.lifecycle;

    // Epoch clear: the old epoch's state goes, a fresh lease serves the new epoch.
    if let Some(lease) = &lease
        && lease.epoch.unwrap_or(0) < spec.epoch
    {
        if lifecycle != Some(Lifecycle::Clearing) {
            step.lifecycle(Lifecycle::Clearing);
            step.condition(
                READY,
                false,
                "Clearing",
                format!(
                    "clearing the conversation into epoch {}: the old epoch's state is being deleted",
                    spec.epoch
                ),
            );
            step.event(
                EventType::Normal,
                "ClearStarted",
                format!("epoch {} -> {}", lease.epoch.unwrap_or(0), spec.epoch),
            );
            return Ok(match step.commit(ctx).await? {
                Some(_) => Action::requeue(Duration::ZERO),
                None => conflict_retry(),
            });
        }
        let report = ctx.store.clear(&id, epoch).await.map_err(store_err)?;
        step.event(
            EventType::Normal,
            "ConversationCleared",
            format!(
                "epoch {}: deleted {} states, {} objects, {} stream entries of the old epoch; memory untouched",
                report.epoch,
                report.states_deleted,
                report.objects_deleted,
                report.stream_entries_deleted
            ),
        );
        return new_generation(
            step,
            ctx,
            &id,
            &resolved,
            "EpochCleared",
            format!("the conversation was cleared into epoch {}", spec.epoch),
        )
        .await;
    }

    match (lease, lifecycle) {
        (None, _) => {
            new_generation(
                step,
                ctx,
                &id,
                &resolved,
                "Initial",
                "first lease of this binding".into(),
            )
            .await
        }
        (Some(lease), Some(Lifecycle::Ready | Lifecycle::Busy)) => {
            check_ready(step, ctx, &id, &resolved, &lease).await
        }
        (Some(lease), Some(Lifecycle::Hibernated)) => {
            maybe_resume(step, ctx, &id, &resolved, &lease).await
        }
        (Some(lease), _) => progress_claim(step, ctx, &id, &resolved, &lease).await,
    }
}

fn store_err(e: StoreError) -> Error {
    Error::Store(e.to_string())
}

/// Loads and checks the profile; sets `ProfileAccepted`. `None` when it does not accept.
async fn resolve_profile(
    binding: &HarnessBinding,
    ctx: &Context,
    step: &mut Step<'_>,
) -> Result<Option<Resolved>, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = &binding.spec.sandbox_profile_ref.name;
    let profiles: Api<SandboxProfile> = Api::namespaced(ctx.client.clone(), &ns);
    let refuse = |step: &mut Step<'_>, reason: &'static str, message: String| {
        step.condition(PROFILE_ACCEPTED, false, reason, message.clone());
        step.event(EventType::Warning, reason, message);
        Ok(None)
    };
    let cached = ctx
        .caches()
        .and_then(|c| super::Caches::get(&c.profiles, &ns, name))
        .map(|p| (*p).clone());
    let profile = match cached {
        Some(p) => Some(p),
        None => profiles.get_opt(name).await?,
    };
    let Some(profile) = profile else {
        return refuse(
            step,
            "ProfileNotFound",
            format!("SandboxProfile {ns}/{name} does not exist"),
        );
    };
    if !profile.spec.enabled {
        return refuse(
            step,
            "ProfileDisabled",
            format!("SandboxProfile {name} is disabled"),
        );
    }
    let harness = binding.spec.harness.id;
    if !profile.spec.allowed_harness_ids.contains(&harness) {
        return refuse(
            step,
            "HarnessNotAllowed",
            format!(
                "SandboxProfile {name} does not allow harness {}",
                harness.as_str()
            ),
        );
    }
    let profile_ready = profile
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, READY));
    if !profile_ready {
        let why = profile
            .status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, READY))
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "not reconciled yet".into());
        step.condition(
            PROFILE_ACCEPTED,
            false,
            "ProfileNotReady",
            format!("SandboxProfile {name} is not Ready ({why})"),
        );
        return Ok(None);
    }
    let t = &profile.spec.timeouts;
    let parse = |field: &str, v: &str| {
        duration::parse(v).map_err(|e| Error::Invalid(format!("profile {name} {field}: {e}")))
    };
    let resolved = Resolved {
        claim_deadline: parse("claimReadinessDeadline", &t.claim_readiness_deadline)?,
        idle_ttl: parse("idleTTL", &t.idle_ttl)?,
        max_lifetime: parse("maxLifetime", &t.max_lifetime)?,
        profile,
    };
    step.condition(
        PROFILE_ACCEPTED,
        true,
        "ProfileAccepted",
        format!(
            "SandboxProfile {name} allows harness {} (warm pool {})",
            harness.as_str(),
            resolved.profile.spec.warm_pool_ref.name
        ),
    );
    Ok(Some(resolved))
}

/// Step 1 of a replacement: raise the generation in the status (CAS), then carry on
/// with the claim in the same reconcile.
async fn new_generation(
    mut step: Step<'_>,
    ctx: &Context,
    id: &BindingId,
    resolved: &Resolved,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let old = step
        .status
        .lease
        .as_ref()
        .map(|l| l.generation)
        .unwrap_or(0);
    // Never below what the store already fences (a data-plane bind starts at 1).
    let fenced = ctx
        .store
        .get_binding(id)
        .await
        .map_err(store_err)?
        .map(|r| i64::try_from(r.lease_generation).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let generation = old.max(fenced.saturating_sub(1)) + 1;
    let name = claim_name(id, generation);
    step.status.lease = Some(Lease {
        generation,
        epoch: Some(step.binding.spec.epoch),
        claim_name: Some(name.clone()),
        claimed_at: Some(step.now.clone()),
        expires_at: Some(time_plus(&step.now, resolved.max_lifetime)),
        ..Default::default()
    });
    let first = old == 0;
    step.lifecycle(if first {
        Lifecycle::Claiming
    } else {
        Lifecycle::Replacing
    });
    step.condition(
        READY,
        false,
        if first { "Claiming" } else { "Replacing" },
        if first {
            format!("claiming a sandbox for lease generation {generation}")
        } else {
            format!("replacing the worker at lease generation {generation}: {message}")
        },
    );
    // Worded as `progress_claim` will find it right after creating the claim, so the
    // wait costs no second status write.
    step.condition(
        SANDBOX_READY,
        false,
        "ClaimNotReady",
        format!("waiting for SandboxClaim {name} to be Ready"),
    );
    step.condition(
        WORKER_VERIFIED,
        false,
        "Claiming",
        "no worker is bound to this generation yet".into(),
    );
    if !first {
        step.condition(
            REPLACED,
            true,
            reason,
            format!("lease generation {old} -> {generation}: {message}"),
        );
    }
    if conditions::get(&step.status.conditions, HIBERNATED).is_some() {
        step.condition(
            HIBERNATED,
            false,
            "NotHibernated",
            "the lease is not hibernated".into(),
        );
    }
    step.event(
        if first || reason == "EpochCleared" || reason == "MaxLifetimeReached" {
            EventType::Normal
        } else {
            EventType::Warning
        },
        if first { "LeaseStarted" } else { "Replacing" },
        format!("lease generation {old} -> {generation} ({reason}): {message}"),
    );
    if !first {
        ctx.metrics.replacements.inc();
    }
    // The events go out with the claim step that follows in this reconcile, so the
    // claim it creates is told in the same event (one Event write, not two).
    let carried = std::mem::take(&mut step.events);
    let Some(written) = step.commit(ctx).await? else {
        return Ok(conflict_retry());
    };
    let lease = written
        .status
        .as_ref()
        .and_then(|s| s.lease.clone())
        .unwrap_or_default();
    let mut next = Step::new(&written);
    next.events = carried;
    Box::pin(progress_claim(next, ctx, id, resolved, &lease)).await
}

/// Steps 2–5: fence, release older claims, claim, verify, mark ready.
async fn progress_claim(
    mut step: Step<'_>,
    ctx: &Context,
    id: &BindingId,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Action, Error> {
    let binding = step.binding;
    let ns = binding.namespace().unwrap_or_default();
    let epoch = u64::try_from(binding.spec.epoch).unwrap_or(0);
    let generation = u64::try_from(lease.generation).unwrap_or(0);

    // 2. The fence: from here on, older generations are refused by the store.
    let raised = if ctx.fence_raised(id.as_str(), (epoch, generation)) {
        Ok(())
    } else {
        ctx.store
            .raise_fence(id, epoch, generation)
            .await
            .map(|_| ctx.mark_fence(id.as_str(), (epoch, generation)))
    };
    match raised {
        Ok(()) => {}
        Err(e) if e.code() == "stale_lease" => {
            // The store is ahead of Kubernetes (e.g. a restore): move past it.
            return new_generation(
                step,
                ctx,
                id,
                resolved,
                "FenceAhead",
                "the store fence was ahead of the lease generation".into(),
            )
            .await;
        }
        Err(e) => return Err(store_err(e)),
    }

    let Some(name) = lease.claim_name.clone() else {
        return new_generation(
            step,
            ctx,
            id,
            resolved,
            "ClaimMissing",
            "the lease names no claim".into(),
        )
        .await;
    };

    // 3. Older claims go before a new one exists: never two live claims. (Generation 1
    // of a binding has no older claims: its UID is new.)
    let claims: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if lease.generation > 1 {
        release_claims(&claims, binding, Some(&name), &mut step).await?;
    }

    // 4. The claim of this generation. Absent from the cache means not created yet,
    // or created so recently the watch has not brought it: create, and a 409 says which.
    let caches = ctx.caches();
    let cached = match &caches {
        Some(c) => super::Caches::get(&c.claims, &ns, &name).map(|c| (*c).clone()),
        None => claims.get_opt(&name).await?,
    };
    let claim = match cached {
        Some(claim) => claim,
        None => {
            let uid = binding.uid().unwrap_or_default();
            let mut claim = SandboxClaim::new(
                &name,
                sandbox::SandboxClaimSpec {
                    warm_pool_ref: sandbox::NameRef {
                        name: resolved.profile.spec.warm_pool_ref.name.clone(),
                    },
                },
            );
            claim.metadata.namespace = Some(ns.clone());
            claim.metadata.labels = Some(BTreeMap::from([
                (BINDING_UID_LABEL.to_owned(), uid.clone()),
                (
                    BINDING_NAME_LABEL.to_owned(),
                    truncate_label(&binding.name_any()),
                ),
                (GENERATION_LABEL.to_owned(), lease.generation.to_string()),
            ]));
            claim.metadata.owner_references = Some(vec![OwnerReference {
                api_version: HarnessBinding::api_version(&()).into_owned(),
                kind: HarnessBinding::kind(&()).into_owned(),
                name: binding.name_any(),
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
            let created = match claims
                .create(
                    &PostParams {
                        field_manager: Some(super::FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &claim,
                )
                .await
            {
                Ok(c) => c,
                Err(kube::Error::Api(s)) if s.code == 409 => claims.get(&name).await?,
                Err(e) => return Err(e.into()),
            };
            let pool = &resolved.profile.spec.warm_pool_ref.name;
            match step
                .events
                .iter_mut()
                .find(|(_, reason, _)| matches!(*reason, "LeaseStarted" | "Replacing"))
            {
                Some((_, _, note)) => note.push_str(&format!(
                    "; created SandboxClaim {name} on warm pool {pool}"
                )),
                None => step.event(
                    EventType::Normal,
                    "Claimed",
                    format!(
                        "created SandboxClaim {name} on warm pool {pool} for lease generation {}",
                        lease.generation
                    ),
                ),
            }
            created
        }
    };
    if !owned_by(claim.meta().owner_references.as_deref(), binding) {
        step.lifecycle(Lifecycle::Failed);
        step.condition(
            SANDBOX_READY,
            false,
            "ClaimConflict",
            format!("SandboxClaim {name} exists and is not owned by this binding"),
        );
        step.condition(
            READY,
            false,
            "ClaimConflict",
            format!("SandboxClaim {name} exists and is not owned by this binding"),
        );
        return Ok(match step.commit(ctx).await? {
            Some(_) => Action::requeue(Duration::from_secs(60)),
            None => conflict_retry(),
        });
    }

    // The readiness deadline runs from the claim (or resume) time.
    let deadline = lease
        .claimed_at
        .as_ref()
        .map(|t| time_plus(t, resolved.claim_deadline));
    let past_deadline = deadline.as_ref().is_some_and(|d| until(d).is_zero());

    let waiting = |step: &mut Step<'_>, reason: &'static str, message: String| {
        step.condition(SANDBOX_READY, false, reason, message);
    };

    let claim_ready = claim
        .status
        .as_ref()
        .is_some_and(|s| sandbox::is_ready(&s.conditions));
    // The Sandbox this generation's claim controls: named in the claim's status, or
    // found by ownership in the cache. The lease does not wait for the claim's own Ready
    // condition when that Sandbox is already Ready: the claim reports the same fact one
    // Agent Sandbox round trip later, and everything the lease relies on (the Sandbox
    // controlled by this claim, Ready, and its pod verified below) is checked here.
    let sandbox_name = claim
        .status
        .as_ref()
        .and_then(|s| s.sandbox.as_ref())
        .map(|s| s.name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            let uid = claim.uid()?;
            caches
                .as_ref()?
                .sandboxes
                .find(|sb| {
                    sb.namespace().as_deref() == Some(ns.as_str())
                        && controlled_by_uid(sb.meta().owner_references.as_deref(), Some(&uid))
                })
                .map(|sb| sb.name_any())
        });
    let owned_sandbox_ready = sandbox_name.as_deref().is_some_and(|sb| {
        caches
            .as_ref()
            .and_then(|c| super::Caches::get(&c.sandboxes, &ns, sb))
            .is_some_and(|o| {
                controlled_by_uid(o.meta().owner_references.as_deref(), claim.uid().as_deref())
                    && sandbox_ready(&o)
            })
    });
    let verdict = if claim.meta().deletion_timestamp.is_some() {
        Err((
            "ClaimDeleting",
            format!("SandboxClaim {name} is being deleted"),
        ))
    } else if !(claim_ready || owned_sandbox_ready) || sandbox_name.is_none() {
        // The claim's own reason is in its status; repeating each of its changes here
        // would cost a status write per change and tell nothing new.
        Err((
            "ClaimNotReady",
            format!("waiting for SandboxClaim {name} to be Ready"),
        ))
    } else {
        Ok(sandbox_name.unwrap_or_default())
    };
    let sandbox_name = match verdict {
        Ok(n) => n,
        Err((reason, message)) => {
            if past_deadline {
                return new_generation(
                    step,
                    ctx,
                    id,
                    resolved,
                    "ClaimReadinessDeadlineExceeded",
                    format!(
                        "SandboxClaim {name} was not Ready within {}",
                        resolved.profile.spec.timeouts.claim_readiness_deadline
                    ),
                )
                .await;
            }
            ctx.metrics.waited(reason);
            waiting(&mut step, reason, message);
            let wait = deadline
                .as_ref()
                .map(until)
                .unwrap_or(Duration::from_secs(30));
            return Ok(match step.commit(ctx).await? {
                Some(_) => Action::requeue(wait.max(Duration::from_millis(100))),
                None => conflict_retry(),
            });
        }
    };

    // The sandbox and its pod: ownership checked by UID, not by name. From the caches
    // when the controllers run (a miss waits: their watch triggers this binding).
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    // The claim (or the Sandbox) already says the next object is Ready: when the cache
    // does not show it so yet, its watch is behind, and one live read beats waiting.
    let get_sandbox = async |name: &str| -> Result<Option<Sandbox>, Error> {
        let cached = caches
            .as_ref()
            .and_then(|c| super::Caches::get(&c.sandboxes, &ns, name))
            .map(|o| (*o).clone());
        let usable = cached.as_ref().is_some_and(sandbox_ready);
        Ok(if usable || (caches.is_some() && !claim_ready) {
            cached
        } else {
            sandboxes.get_opt(name).await?
        })
    };
    let get_pod = async |name: &str| -> Result<Option<Pod>, Error> {
        let cached = caches
            .as_ref()
            .and_then(|c| super::Caches::get(&c.pods, &ns, name))
            .map(|o| (*o).clone());
        let usable = cached.as_ref().is_some_and(|pod| {
            pod.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| !c.image_id.is_empty()))
        });
        Ok(if usable {
            cached
        } else {
            pods.get_opt(name).await?
        })
    };
    let found = async {
        let Some(sb) = get_sandbox(&sandbox_name).await? else {
            return Ok::<_, Error>(Err(format!("Sandbox {sandbox_name} not found")));
        };
        if !controlled_by_uid(
            sb.meta().owner_references.as_deref(),
            claim.uid().as_deref(),
        ) {
            return Ok(Err(format!(
                "Sandbox {sandbox_name} is not controlled by SandboxClaim {name}"
            )));
        }
        if !sandbox_ready(&sb) {
            return Ok(Err(format!("Sandbox {sandbox_name} is not Ready")));
        }
        let pod_name = sb
            .annotations()
            .get(sandbox::POD_NAME_ANNOTATION)
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| sandbox_name.clone());
        let Some(pod) = get_pod(&pod_name).await? else {
            return Ok(Err(format!(
                "pod {pod_name} of Sandbox {sandbox_name} not found"
            )));
        };
        if !controlled_by_uid(
            pod.metadata.owner_references.as_deref(),
            sb.uid().as_deref(),
        ) || pod.metadata.deletion_timestamp.is_some()
        {
            return Ok(Err(format!(
                "pod {pod_name} is not a live pod of Sandbox {sandbox_name}"
            )));
        }
        Ok(Ok((sb, pod)))
    }
    .await?;
    let (sb, pod) = match found {
        Ok(v) => v,
        Err(message) => {
            if past_deadline {
                return new_generation(
                    step,
                    ctx,
                    id,
                    resolved,
                    "ClaimReadinessDeadlineExceeded",
                    message,
                )
                .await;
            }
            return settle_or_wait(step, ctx, &claim, message).await;
        }
    };

    // 5. Verify the worker against the profile before it may take a turn.
    let bind_span = spans::step(SpanStep::SandboxWorkerBind);
    spans::record_count(
        &bind_span,
        keys::LEASE_GENERATION,
        u64::try_from(lease.generation).unwrap_or(0),
    );
    match verify_worker(&pod, &resolved.profile) {
        // A pod that reports no image yet is still starting, not refused.
        Err(("WorkerImageUnknown", message)) if !past_deadline => {
            settle_or_wait(step, ctx, &claim, message).await
        }
        Err((reason, message)) => {
            step.lifecycle(Lifecycle::Failed);
            step.condition(WORKER_VERIFIED, false, reason, message.clone());
            step.condition(
                SANDBOX_READY,
                true,
                "SandboxReady",
                format!("Sandbox {sandbox_name} is Ready"),
            );
            step.condition(
                READY,
                false,
                "WorkerRejected",
                format!(
                    "the worker of lease generation {} was rejected: {message}",
                    lease.generation
                ),
            );
            if step.binding.status.as_ref().and_then(|s| s.lifecycle) != Some(Lifecycle::Failed) {
                step.event(EventType::Warning, reason, message);
            }
            Ok(match step.commit(ctx).await? {
                Some(_) => Action::requeue(Duration::from_secs(60)),
                None => conflict_retry(),
            })
        }
        Ok((digest, protocol)) => {
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let mut next = lease.clone();
            next.claim_uid = claim.uid();
            next.sandbox_name = Some(sandbox_name.clone());
            next.sandbox_uid = sb.uid();
            next.worker_pod_name = Some(pod_name.clone());
            next.worker_pod_uid = pod.metadata.uid.clone();
            next.worker_image_digest = Some(digest.clone());
            next.protocol_version = Some(protocol);
            next.ready_at = Some(step.now.clone());
            next.last_seen_at = Some(step.now.clone());
            step.status.lease = Some(next);
            step.lifecycle(Lifecycle::Ready);
            step.condition(
                SANDBOX_READY,
                true,
                "SandboxReady",
                format!("Sandbox {sandbox_name} (pod {pod_name}) is Ready"),
            );
            step.condition(
                WORKER_VERIFIED,
                true,
                "WorkerVerified",
                format!("image {digest}, protocol version {protocol}"),
            );
            step.condition(
                READY,
                true,
                "LeaseReady",
                format!(
                    "worker verified and bound at lease generation {}",
                    lease.generation
                ),
            );
            step.event(
                EventType::Normal,
                "LeaseReady",
                format!(
                    "lease generation {} bound to Sandbox {sandbox_name}, pod {pod_name} (image {digest}, protocol {protocol})",
                    lease.generation
                ),
            );
            project_state(&mut step, ctx, id, true).await;
            let Some(_) = step.commit(ctx).await? else {
                return Ok(conflict_retry());
            };
            // Ready before the claim watch showed the claim Ready counts as no overhead.
            let overhead = ctx
                .claim_seen_ready(&binding.uid().unwrap_or_default())
                .map(|t| t.elapsed().as_secs_f64())
                .unwrap_or(0.0);
            ctx.metrics.bind_overhead.observe(overhead);
            spans::record(&bind_span, keys::OUTCOME, "bound");
            ctx.anchors
                .finish(&binding.uid().unwrap_or_default(), "bound");
            Ok(Action::requeue(next_check(lease, resolved, ctx)))
        }
    }
}

/// How long a Ready claim's Sandbox or pod may look unready before the binding says so
/// in its status. Within it, the gap is almost always one watch arriving after another
/// (the claim turns Ready only once its Sandbox is), which the next watch event ends:
/// a status write for it would only queue ahead of other bindings' real transitions.
const SETTLE: Duration = Duration::from_secs(3);

/// The claim is Ready but its Sandbox or worker pod is not (yet) seen Ready: wait for
/// the watch without a write while that is fresh, then say so in `SandboxReady`.
async fn settle_or_wait(
    mut step: Step<'_>,
    ctx: &Context,
    claim: &SandboxClaim,
    message: String,
) -> Result<Action, Error> {
    // How long the claim has been Ready (`None`: not Ready).
    let ready_for = claim
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == TRUE)
        })
        .map(|c| since(&c.last_transition_time));
    if ready_for.is_none() && step.events.is_empty() {
        // Seen ahead of the claim: the claim's own progress is what to wait for, and
        // `SandboxReady` already says so.
        ctx.metrics.waited("ClaimNotReady");
        return Ok(Action::requeue(SETTLE));
    }
    if ready_for.is_some_and(|d| d < SETTLE) && step.events.is_empty() {
        ctx.metrics.waited("SandboxSettling");
        return Ok(Action::requeue(SETTLE));
    }
    ctx.metrics.waited("SandboxNotReady");
    step.condition(SANDBOX_READY, false, "SandboxNotReady", message);
    Ok(match step.commit(ctx).await? {
        Some(_) => Action::requeue(Duration::from_secs(1)),
        None => conflict_retry(),
    })
}

/// The worker's image digests and protocol version, or why they are refused.
fn verify_worker(
    pod: &Pod,
    profile: &SandboxProfile,
) -> Result<(String, i32), (&'static str, String)> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    if statuses.is_empty() {
        return Err((
            "WorkerImageUnknown",
            format!("pod {pod_name} reports no container status yet"),
        ));
    }
    let mut first = None;
    for status in &statuses {
        let Some(digest) = sandbox::image_digest(&status.image_id) else {
            return Err((
                "WorkerImageUnknown",
                format!(
                    "container {} of pod {pod_name} reports no image digest ({:?})",
                    status.name, status.image_id
                ),
            ));
        };
        if !profile
            .spec
            .allowed_worker_image_digests
            .iter()
            .any(|d| d == digest)
        {
            return Err((
                "ImageDigestNotAllowed",
                format!(
                    "container {} of pod {pod_name} runs {digest}, which SandboxProfile {} does not allow",
                    status.name,
                    profile.name_any()
                ),
            ));
        }
        first.get_or_insert_with(|| digest.to_owned());
    }
    let declared = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(sandbox::PROTOCOL_VERSION_ANNOTATION))
        .cloned();
    let Some(declared) = declared else {
        return Err((
            "ProtocolVersionMissing",
            format!(
                "pod {pod_name} has no {} annotation",
                sandbox::PROTOCOL_VERSION_ANNOTATION
            ),
        ));
    };
    let protocol: i32 = declared.trim().parse().map_err(|_| {
        (
            "ProtocolVersionInvalid",
            format!("pod {pod_name} declares protocol version {declared:?}, not a number"),
        )
    })?;
    if !profile.spec.worker_protocol_versions.contains(&protocol) {
        return Err((
            "ProtocolVersionNotAllowed",
            format!(
                "pod {pod_name} speaks protocol version {protocol}; SandboxProfile {} allows {:?}",
                profile.name_any(),
                profile.spec.worker_protocol_versions
            ),
        ));
    }
    Ok((first.unwrap_or_default(), protocol))
}

/// When to look again at a Ready lease: its expiry or idle deadline, the next state
/// projection, at most a minute.
fn next_check(lease: &Lease, resolved: &Resolved, ctx: &Context) -> Duration {
    let mut wait = Duration::from_secs(60).min(ctx.projection_interval());
    if let Some(expires) = &lease.expires_at {
        wait = wait.min(until(expires));
    }
    if resolved.profile.spec.hibernation == HibernationPolicy::Suspend {
        wait = wait.min(resolved.idle_ttl);
    }
    wait.max(Duration::from_millis(100))
}

/// A Ready lease: is its worker still the one we verified, within its lifetime, active?
async fn check_ready(
    mut step: Step<'_>,
    ctx: &Context,
    id: &BindingId,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Action, Error> {
    let binding = step.binding;
    let ns = binding.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let claim_name = lease.claim_name.clone().unwrap_or_default();
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    let pod_name = lease.worker_pod_name.clone().unwrap_or_default();

    // The caches first; a failure they show is confirmed with live reads before a
    // worker is replaced on their word (a cache can lag, never lead, the API server).
    let mut failure = match ctx.caches() {
        Some(c) => lease_failure(
            super::Caches::get(&c.claims, &ns, &claim_name).as_deref(),
            super::Caches::get(&c.sandboxes, &ns, &sb_name).as_deref(),
            super::Caches::get(&c.pods, &ns, &pod_name).as_deref(),
            lease,
        ),
        None => Some(("Unverified", String::new())),
    };
    if failure.is_some() {
        let claims: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let claim = claims.get_opt(&claim_name).await?;
        let sandbox = match &claim {
            Some(_) => sandboxes.get_opt(&sb_name).await?,
            None => None,
        };
        let pod = match &sandbox {
            Some(_) => pods.get_opt(&pod_name).await?,
            None => None,
        };
        failure = lease_failure(claim.as_ref(), sandbox.as_ref(), pod.as_ref(), lease);
    }
    if let Some((reason, message)) = failure {
        step.condition(SANDBOX_READY, false, reason, message.clone());
        step.event(EventType::Warning, reason, message.clone());
        return new_generation(step, ctx, id, resolved, reason, message).await;
    }
    if lease
        .expires_at
        .as_ref()
        .is_some_and(|t| until(t).is_zero())
    {
        return new_generation(
            step,
            ctx,
            id,
            resolved,
            "MaxLifetimeReached",
            format!(
                "the lease reached the profile's maximum lifetime ({})",
                resolved.profile.spec.timeouts.max_lifetime
            ),
        )
        .await;
    }

    // Activity: the last durable commit, the lease start, or a resume request.
    let head_at = project_state(&mut step, ctx, id, false).await;
    let mut last_active = lease.ready_at.clone().unwrap_or_else(|| step.now.clone());
    if let Some(t) = head_at.filter(|t| t.0 > last_active.0) {
        last_active = t;
    }
    if let Some(t) = resume_requested_at(binding).filter(|t| t.0 > last_active.0) {
        last_active = t;
    }
    // Idle by the head and the lease alone: ask the store when the binding last saw any
    // write (a harness that keeps its state in objects and streams commits no head).
    if resolved.profile.spec.hibernation == HibernationPolicy::Suspend
        && since(&last_active) >= resolved.idle_ttl
        && let Some(t) = ctx
            .store
            .last_activity_ms(id)
            .await
            .map_err(store_err)?
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(Time)
            .filter(|t| t.0 > last_active.0)
    {
        last_active = t;
    }
    if resolved.profile.spec.hibernation == HibernationPolicy::Suspend
        && since(&last_active) >= resolved.idle_ttl
    {
        sandboxes
            .patch(
                &sb_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"operatingMode": "Suspended"}})),
            )
            .await?;
        step.lifecycle(Lifecycle::Hibernated);
        let message = format!(
            "idle for {} (idle TTL {}): Sandbox {sb_name} suspended; the next bind resumes it",
            duration::display(since(&last_active)),
            resolved.profile.spec.timeouts.idle_ttl
        );
        step.condition(HIBERNATED, true, "IdleTTLReached", message.clone());
        step.condition(READY, false, "Hibernated", message.clone());
        step.condition(SANDBOX_READY, false, "Suspended", message.clone());
        step.event(EventType::Normal, "Hibernated", message);
        return Ok(match step.commit(ctx).await? {
            Some(_) => Action::requeue(Duration::from_secs(60)),
            None => conflict_retry(),
        });
    }

    let mut next = lease.clone();
    next.last_seen_at = Some(last_active);
    // Only a change a reader would notice is written (last_seen moves with commits).
    if step
        .status
        .lease
        .as_ref()
        .and_then(|l| l.last_seen_at.clone())
        != next.last_seen_at
    {
        step.status.lease = Some(next);
    }
    Ok(match step.commit(ctx).await? {
        Some(_) => Action::requeue(next_check(lease, resolved, ctx)),
        None => conflict_retry(),
    })
}

/// Why a Ready lease's worker is gone, from what was read of its claim, sandbox and pod
/// (`None` where absent). `None` when the worker is still the one that was verified.
fn lease_failure(
    claim: Option<&SandboxClaim>,
    sandbox: Option<&Sandbox>,
    pod: Option<&Pod>,
    lease: &Lease,
) -> Option<(&'static str, String)> {
    let claim_name = lease.claim_name.clone().unwrap_or_default();
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    let pod_name = lease.worker_pod_name.clone().unwrap_or_default();
    let Some(claim) = claim else {
        return Some((
            "ClaimLost",
            format!("SandboxClaim {claim_name} no longer exists"),
        ));
    };
    if claim.uid() != lease.claim_uid || claim.meta().deletion_timestamp.is_some() {
        return Some((
            "ClaimLost",
            format!("SandboxClaim {claim_name} was deleted or recreated"),
        ));
    }
    let Some(sb) = sandbox else {
        return Some(("SandboxLost", format!("Sandbox {sb_name} no longer exists")));
    };
    if sb.uid() != lease.sandbox_uid {
        return Some((
            "SandboxLost",
            format!("Sandbox {sb_name} was recreated with another UID"),
        ));
    }
    let Some(pod) = pod else {
        return Some((
            "WorkerPodLost",
            format!("worker pod {pod_name} was deleted"),
        ));
    };
    if pod.metadata.uid != lease.worker_pod_uid {
        return Some((
            "WorkerPodLost",
            format!(
                "worker pod {pod_name} was deleted and recreated: a new process is a new worker"
            ),
        ));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some((
            "WorkerPodLost",
            format!("worker pod {pod_name} is being deleted"),
        ));
    }
    if !sandbox_ready(sb) {
        return Some((
            "SandboxFailed",
            format!("Sandbox {sb_name} is no longer Ready"),
        ));
    }
    None
}

fn sandbox_ready(sb: &Sandbox) -> bool {
    sb.status
        .as_ref()
        .is_some_and(|s| sandbox::is_ready(&s.conditions))
}

fn resume_requested_at(binding: &HarnessBinding) -> Option<Time> {
    binding
        .annotations()
        .get(RESUME_ANNOTATION)
        .and_then(|v| v.parse::<Timestamp>().ok())
        .map(Time)
}

/// A hibernated lease resumes when a bind asks after the hibernation. The resumed
/// sandbox runs a new pod: a new worker, so a new generation (same claim).
async fn maybe_resume(
    mut step: Step<'_>,
    ctx: &Context,
    id: &BindingId,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Action, Error> {
    let binding = step.binding;
    let hibernated_at = conditions::get(&step.status.conditions, HIBERNATED)
        .filter(|c| c.status == TRUE)
        .map(|c| c.last_transition_time.clone());
    let requested = resume_requested_at(binding);
    let wants = match (&requested, &hibernated_at) {
        (Some(r), Some(h)) => r.0 > h.0,
        (Some(_), None) => true,
        _ => false,
    };
    if !wants {
        project_state(&mut step, ctx, id, false).await;
        return Ok(match step.commit(ctx).await? {
            Some(_) => Action::requeue(Duration::from_secs(300)),
            None => conflict_retry(),
        });
    }
    let ns = binding.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    let Some(sb) = sandboxes.get_opt(&sb_name).await? else {
        return new_generation(
            step,
            ctx,
            id,
            resolved,
            "SandboxLost",
            format!("Sandbox {sb_name} of the hibernated lease no longer exists"),
        )
        .await;
    };
    if sb.uid() != lease.sandbox_uid {
        return new_generation(
            step,
            ctx,
            id,
            resolved,
            "SandboxLost",
            format!("Sandbox {sb_name} was recreated while hibernated"),
        )
        .await;
    }
    // New generation, same claim and sandbox: CAS first, then fence, then resume.
    let generation = lease.generation + 1;
    let mut next = lease.clone();
    next.generation = generation;
    next.claimed_at = Some(step.now.clone());
    next.worker_pod_name = None;
    next.worker_pod_uid = None;
    next.ready_at = None;
    next.expires_at = Some(time_plus(&step.now, resolved.max_lifetime));
    step.status.lease = Some(next.clone());
    step.lifecycle(Lifecycle::Claiming);
    let message =
        format!("resuming Sandbox {sb_name} at lease generation {generation} (bind requested)");
    step.condition(HIBERNATED, false, "Resumed", message.clone());
    step.condition(READY, false, "Resuming", message.clone());
    step.condition(SANDBOX_READY, false, "Resuming", message.clone());
    step.event(EventType::Normal, "Resuming", message);
    let Some(written) = step.commit(ctx).await? else {
        return Ok(conflict_retry());
    };
    let epoch = u64::try_from(binding.spec.epoch).unwrap_or(0);
    let fence = (epoch, u64::try_from(generation).unwrap_or(0));
    ctx.store
        .raise_fence(id, fence.0, fence.1)
        .await
        .map_err(store_err)?;
    ctx.mark_fence(id.as_str(), fence);
    sandboxes
        .patch(
            &sb_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"operatingMode": "Running"}})),
        )
        .await?;
    Box::pin(progress_claim(
        Step::new(&written),
        ctx,
        id,
        resolved,
        &next,
    ))
    .await
}

/// Projects the durable head into `status.state` (rate-limited per binding unless
/// `force`). Returns the head's commit time, for idleness.
async fn project_state(
    step: &mut Step<'_>,
    ctx: &Context,
    id: &BindingId,
    force: bool,
) -> Option<Time> {
    let uid = step.binding.uid().unwrap_or_default();
    if !force && !ctx.projection_due(&uid) {
        return step
            .status
            .state
            .as_ref()
            .and_then(|s| s.committed_at.clone());
    }
    let scope = StateScope {
        binding_id: id.clone(),
        environment: ctx.keyring.environment().to_owned(),
        harness: step.binding.spec.harness.id.as_str().to_owned(),
        epoch: u64::try_from(step.binding.spec.epoch).unwrap_or(0),
        codec: crate::domain::state::ANY_CODEC.into(),
        lease_generation: step
            .status
            .lease
            .as_ref()
            .map(|l| u64::try_from(l.generation).unwrap_or(0))
            .unwrap_or(0),
    };
    let head = match ctx.store.load_head(&scope).await {
        Ok(head) => head,
        Err(e) => {
            tracing_warn(&format!("projecting state of {}: {e}", id.as_str()));
            return None;
        }
    };
    match head {
        Some(head) => {
            let committed_at = Timestamp::from_millisecond(head.committed_at_ms)
                .ok()
                .map(Time);
            let status = match head.durability {
                Durability::Committed => DurabilityStatus::Committed,
                Durability::Uncertain => DurabilityStatus::Uncertain,
            };
            let uncertain = !head.uncertain_runs.is_empty();
            step.status.state = Some(StateProjection {
                durable_revision: i64::try_from(head.revision).unwrap_or(i64::MAX),
                durability_status: if uncertain {
                    DurabilityStatus::Uncertain
                } else {
                    status
                },
                committed_at: committed_at.clone(),
            });
            if uncertain {
                step.condition(
                    STATE_DURABLE,
                    false,
                    "RunUncertain",
                    format!(
                        "{} run(s) marked uncertain after revision {}: reconcile before the next turn",
                        head.uncertain_runs.len(),
                        head.revision
                    ),
                );
            } else {
                step.condition(
                    STATE_DURABLE,
                    true,
                    "HeadCommitted",
                    format!("durable head at revision {}", head.revision),
                );
            }
            committed_at
        }
        None => {
            step.status.state = None;
            step.condition(
                STATE_DURABLE,
                true,
                "NoTurnYet",
                "nothing committed in this epoch yet".into(),
            );
            None
        }
    }
}

fn tracing_warn(message: &str) {
    tracing::warn!("{message}");
}

/// Deletes this binding's claims other than `keep`. Returns how many are still live.
async fn release_claims(
    claims: &Api<SandboxClaim>,
    binding: &HarnessBinding,
    keep: Option<&str>,
    step: &mut Step<'_>,
) -> Result<usize, Error> {
    let uid = binding.uid().unwrap_or_default();
    let list = claims
        .list(&ListParams::default().labels(&format!("{BINDING_UID_LABEL}={uid}")))
        .await?;
    let mut remaining = 0;
    for claim in list.items {
        let name = claim.name_any();
        if Some(name.as_str()) == keep {
            continue;
        }
        remaining += 1;
        if claim.meta().deletion_timestamp.is_some() {
            continue;
        }
        match claims.delete(&name, &DeleteParams::background()).await {
            Ok(_) => step.event(
                EventType::Normal,
                "ClaimReleased",
                format!("deleted SandboxClaim {name} of an older lease generation"),
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => remaining -= 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(remaining)
}

/// The binding is being deleted: revoke, release, let it go.
async fn cleanup(binding: &HarnessBinding, ctx: &Context) -> Result<Action, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let spec = &binding.spec;
    let id =
        ctx.keyring
            .binding_id_for_ref(&spec.subject_ref, &spec.agent_id, &spec.conversation_id);
    let mut step = Step::new(binding);
    let generation = step
        .status
        .lease
        .as_ref()
        .map(|l| l.generation)
        .unwrap_or(0);
    if step.status.lifecycle != Some(Lifecycle::Releasing) {
        step.lifecycle(Lifecycle::Releasing);
        step.condition(
            READY,
            false,
            "Releasing",
            "the binding is being deleted: releasing its sandbox".into(),
        );
        step.event(
            EventType::Normal,
            "Releasing",
            format!("releasing the lease of generation {generation}"),
        );
        return Ok(match step.commit(ctx).await? {
            Some(_) => Action::requeue(Duration::ZERO),
            None => conflict_retry(),
        });
    }
    // Revoke: the last worker's generation is fenced out of the store.
    if ctx
        .store
        .get_binding(&id)
        .await
        .map_err(store_err)?
        .is_some()
    {
        let epoch = u64::try_from(spec.epoch).unwrap_or(0);
        match ctx
            .store
            .raise_fence(&id, epoch, u64::try_from(generation + 1).unwrap_or(0))
            .await
        {
            Ok(_) => {}
            Err(e) if matches!(e.code(), "stale_lease" | "stale_epoch") => {}
            Err(e) => return Err(store_err(e)),
        }
    }
    let claims: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let remaining = release_claims(&claims, binding, None, &mut step).await?;
    // Events only: the status of a deleting object is not worth a write.
    let reference = binding.object_ref(&());
    for (type_, reason, note) in std::mem::take(&mut step.events) {
        ctx.publish(
            &reference,
            Event {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: reason.into(),
                secondary: None,
            },
        )
        .await;
    }
    if remaining > 0 {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    ctx.forget(&binding.uid().unwrap_or_default());
    ctx.forget_binding(id.as_str());
    Ok(Action::await_change())
}

fn owned_by(refs: Option<&[OwnerReference]>, binding: &HarnessBinding) -> bool {
    let uid = binding.uid();
    refs.unwrap_or_default()
        .iter()
        .any(|r| r.kind == "HarnessBinding" && Some(&r.uid) == uid.as_ref())
}

fn controlled_by_uid(refs: Option<&[OwnerReference]>, uid: Option<&str>) -> bool {
    let Some(uid) = uid else { return false };
    refs.unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

fn truncate_label(v: &str) -> String {
    v.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['-', '.', '_'])
        .to_owned()
}

#[allow(dead_code)]
fn _assert_send(_: SystemTime) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_valid_and_differ_by_generation() {
        let id = BindingId::parse("hb_0123456789abcdef0123456789abcdef").unwrap();
        let one = claim_name(&id, 1);
        let two = claim_name(&id, 2);
        assert_eq!(one, "hb-0123456789abcdef0123456789abcdef-g1");
        assert_ne!(one, two);
        assert!(one.len() <= 63);
    }
}
