//! Act: applies a [`Plan`] at the edges, in its order: effects (store, claims,
//! Sandbox), the status (a compare-and-set on the `resourceVersion` read), the effects
//! that must follow the status, the Events, the metrics. Nothing here decides; what an
//! effect reports (a claim created, a fence refused) goes back to `decide` as [`Carry`].

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{
        controller::Action,
        events::{Event, EventType},
    },
};
use serde_json::json;

use super::{
    BINDING_NAME_LABEL, BINDING_UID_LABEL, GENERATION_LABEL, conflict_retry,
    decide::{self, Effect, Next, OnStale, Plan, PlannedEvent, Tally},
    observe::{Carry, store_err},
    truncate_label,
};
use crate::{
    api::{
        HarnessBinding, HarnessBindingStatus,
        sandbox::{self, Sandbox, SandboxClaim},
    },
    domain::ids::BindingId,
    operator::{Context, Error, FIELD_MANAGER},
    telemetry::spans::{self, Step as SpanStep, keys},
};

/// How a plan ended. One lives at a time, returned once per round: boxing the carry
/// would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Done(Action),
    /// Decide again, on the binding as written and what the effects reported.
    Continue(Box<HarnessBinding>, Carry),
}

/// What one effect reported.
enum Report {
    Done,
    Released(usize),
    Created(Box<SandboxClaim>),
    Cleared(crate::store::ClearReport),
    FenceAhead(i64),
}

/// Applies `plan` to `binding` (as read by this round).
pub async fn execute(
    plan: Plan,
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
    mut carry: Carry,
) -> Result<Outcome, Error> {
    let mut events = plan.events;
    let mut remaining = 0;
    for effect in &plan.effects {
        // Checked before every write: a leader paused mid-round acts no more once its
        // renew deadline has passed.
        if let Some(action) = ctx.not_leading() {
            return Ok(Outcome::Done(action));
        }
        match apply(effect, binding, ctx, id, &mut events).await? {
            Report::Done => {}
            Report::Released(n) => {
                remaining += n;
                if let Effect::ReleaseClaims { generation, .. } = effect {
                    carry.released = Some(*generation);
                }
            }
            Report::Created(claim) => carry.created = Some(*claim),
            Report::Cleared(report) => carry.cleared = Some(report),
            Report::FenceAhead(generation) => {
                carry.fence_ahead = Some(generation);
                carry.events = events;
                return Ok(Outcome::Continue(Box::new(binding.clone()), carry));
            }
        }
    }
    for tally in &plan.tally {
        match tally {
            Tally::Waited(reason) => ctx.metrics.waited(reason.as_str()),
            Tally::Replacement => {
                ctx.metrics.replacements.inc();
            }
            Tally::Bound => {}
        }
    }
    if plan.status.is_some()
        && let Some(action) = ctx.not_leading()
    {
        return Ok(Outcome::Done(action));
    }
    let written = match plan.status {
        Some(status) => match write_status(ctx, binding, status).await? {
            Some(written) => written,
            None => return Ok(Outcome::Done(conflict_retry())),
        },
        None => binding.clone(),
    };
    for effect in &plan.after {
        apply(effect, &written, ctx, id, &mut events).await?;
    }
    if plan.hold_events {
        carry.events = events;
    } else {
        publish(ctx, &written, events, plan.plain_event_actions).await;
        carry.events = Vec::new();
    }
    if plan.tally.contains(&Tally::Bound) {
        bound(ctx, &written);
    }
    Ok(match plan.next {
        Next::Continue => Outcome::Continue(Box::new(written), carry),
        Next::Requeue(after) => Outcome::Done(Action::requeue(after)),
        Next::AwaitChange => Outcome::Done(Action::await_change()),
        Next::UntilReleased if remaining > 0 => {
            Outcome::Done(Action::requeue(Duration::from_millis(500)))
        }
        Next::UntilReleased => {
            ctx.forget(&binding.uid().unwrap_or_default());
            ctx.forget_binding(id.as_str());
            Outcome::Done(Action::await_change())
        }
    })
}

async fn apply(
    effect: &Effect,
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
    events: &mut Vec<PlannedEvent>,
) -> Result<Report, Error> {
    let ns = binding.namespace().unwrap_or_default();
    match effect {
        Effect::RaiseFence {
            epoch,
            generation,
            on_stale,
        } => match ctx.store.raise_fence(id, *epoch, *generation).await {
            Ok(_) => {
                ctx.mark_fence(id.as_str(), (*epoch, *generation));
                Ok(Report::Done)
            }
            Err(e) if e.code() == "stale_lease" && *on_stale == OnStale::Report => Ok(
                Report::FenceAhead(i64::try_from(*generation).unwrap_or(i64::MAX)),
            ),
            Err(e) => Err(store_err(e)),
        },
        Effect::ReleaseClaims { keep, .. } => release_claims(binding, ctx, keep.as_deref(), events)
            .await
            .map(Report::Released),
        Effect::CreateClaim {
            name,
            pool,
            generation,
            labels,
        } => {
            let desired = desired_claim(binding, name, pool, *generation, labels);
            let claim = create_claim(ctx, &desired).await?;
            decide::note_claim_created(events, name, pool, *generation);
            Ok(Report::Created(Box::new(claim)))
        }
        Effect::SetOperatingMode { sandbox, mode } => {
            Api::<Sandbox>::namespaced(ctx.client.clone(), &ns)
                .patch(
                    sandbox,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"operatingMode": mode}})),
                )
                .await?;
            Ok(Report::Done)
        }
        Effect::ClearStore { epoch } => {
            let report = ctx.store.clear(id, *epoch).await.map_err(store_err)?;
            Ok(Report::Cleared(report))
        }
        Effect::Revoke { epoch, generation } => {
            revoke(ctx, id, *epoch, *generation).await?;
            Ok(Report::Done)
        }
    }
}

/// Fences the last worker's generation out of the store (when the store knows the
/// binding); a fence already past it is fine.
async fn revoke(ctx: &Context, id: &BindingId, epoch: u64, generation: u64) -> Result<(), Error> {
    if ctx
        .store
        .get_binding(id)
        .await
        .map_err(store_err)?
        .is_none()
    {
        return Ok(());
    }
    match ctx.store.raise_fence(id, epoch, generation).await {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.code(), "stale_lease" | "stale_epoch") => Ok(()),
        Err(e) => Err(store_err(e)),
    }
}

/// The claim of a lease generation: named from the binding id and the generation,
/// owned (controller) by the binding, labelled with its UID, name and generation.
pub fn desired_claim(
    binding: &HarnessBinding,
    name: &str,
    pool: &str,
    generation: i64,
    profile_labels: &BTreeMap<String, String>,
) -> SandboxClaim {
    let uid = binding.uid().unwrap_or_default();
    let mut claim = SandboxClaim::new(
        name,
        sandbox::SandboxClaimSpec {
            warm_pool_ref: sandbox::NameRef {
                name: pool.to_owned(),
            },
        },
    );
    claim.metadata.namespace = binding.namespace();
    let mut labels = profile_labels.clone();
    labels.extend([
        (BINDING_UID_LABEL.to_owned(), uid.clone()),
        (
            BINDING_NAME_LABEL.to_owned(),
            truncate_label(&binding.name_any()),
        ),
        (GENERATION_LABEL.to_owned(), generation.to_string()),
    ]);
    claim.metadata.labels = Some(labels);
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: HarnessBinding::api_version(&()).into_owned(),
        kind: HarnessBinding::kind(&()).into_owned(),
        name: binding.name_any(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    claim
}

/// Creates the claim; one that exists already (409) is read and returned.
async fn create_claim(ctx: &Context, desired: &SandboxClaim) -> Result<SandboxClaim, Error> {
    let claims: Api<SandboxClaim> =
        Api::namespaced(ctx.client.clone(), &desired.namespace().unwrap_or_default());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match claims.create(&params, desired).await {
        Ok(c) => Ok(c),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(claims.get(&desired.name_any()).await?),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the binding's claims other than `keep`. Returns how many are still live.
async fn release_claims(
    binding: &HarnessBinding,
    ctx: &Context,
    keep: Option<&str>,
    events: &mut Vec<PlannedEvent>,
) -> Result<usize, Error> {
    let claims: Api<SandboxClaim> =
        Api::namespaced(ctx.client.clone(), &binding.namespace().unwrap_or_default());
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
            Ok(_) => events.push(decide::released_event(&name)),
            Err(kube::Error::Api(s)) if s.code == 404 => remaining -= 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(remaining)
}

/// Compare-and-set `status` on the `resourceVersion` `binding` was read at. The binding
/// as written, or as read when nothing changed; `None` on a conflict.
async fn write_status(
    ctx: &Context,
    binding: &HarnessBinding,
    mut status: HarnessBindingStatus,
) -> Result<Option<HarnessBinding>, Error> {
    status.observed_generation = binding.metadata.generation;
    if binding.status.as_ref() == Some(&status) {
        return Ok(Some(binding.clone()));
    }
    let mut object = binding.clone();
    object.status = Some(status);
    crate::operator::replace_status(ctx, &object).await
}

/// Publishes `events` on `binding`. Events of one reason are folded into a series per
/// action; the generation in the action keeps each lease generation's events (and
/// notes) apart.
async fn publish(ctx: &Context, binding: &HarnessBinding, events: Vec<PlannedEvent>, plain: bool) {
    let reference = binding.object_ref(&());
    let generation = binding
        .status
        .as_ref()
        .and_then(|s| s.lease.as_ref())
        .map(|l| l.generation)
        .unwrap_or(0);
    for e in events {
        let reason = e.reason.as_str();
        let action = if plain {
            reason.to_owned()
        } else {
            format!("{reason}Generation{generation}")
        };
        let type_ = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(e.note),
            action,
            secondary: None,
        };
        ctx.publish(&reference, event).await;
    }
}

/// A worker was bound: the bind overhead (Ready written minus the claim first seen
/// Ready by the claim watch; 0 when the binding was Ready first), the bind span, and the
/// end of this binding's reconcile trace.
fn bound(ctx: &Context, written: &HarnessBinding) {
    let uid = written.uid().unwrap_or_default();
    let overhead = ctx
        .claim_seen_ready(&uid)
        .map(|t| t.elapsed().as_secs_f64())
        .unwrap_or(0.0);
    ctx.metrics.bind_overhead.observe(overhead);
    let generation = written
        .status
        .as_ref()
        .and_then(|s| s.lease.as_ref())
        .map(|l| u64::try_from(l.generation).unwrap_or(0))
        .unwrap_or(0);
    let span = spans::step(SpanStep::SandboxWorkerBind);
    spans::record_count(&span, keys::LEASE_GENERATION, generation);
    spans::record(&span, keys::OUTCOME, "bound");
    ctx.anchors.finish(&uid, "bound");
}
