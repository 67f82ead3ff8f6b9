//! The lease rules, as pure functions: `(binding, snapshot, now) -> Decision`.
//!
//! Nothing here does IO. A [`Decision`] is either a [`Plan`] for the executor (`act.rs`)
//! or a [`Need`]: one more thing to read before deciding (a live read that confirms
//! what a cache says, the store's fence, the durable head). The reconcile observes it
//! and asks again, so every read that depends on a rule is decided here too.
//!
//! The safety rules (DESIGN §3, `spec/001_78d7ff78f70a2a2a.txt` §3) are the order of the
//! plans: a new generation is written to the status (compare-and-set) before anything
//! else happens for it; the store fence is raised before older claims are released;
//! older claims are deleted before this generation's claim is created; a worker is
//! verified against the profile before the lease is Ready.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Resource, ResourceExt};

use super::{
    EFFECTS_SETTLED, EGRESS_CLASS_LABEL, HIBERNATED, PROFILE_ACCEPTED, PROFILE_LABEL, READY,
    REPLACED, RESUME_ANNOTATION, SANDBOX_READY, STATE_DURABLE, WORKER_VERIFIED,
    WORKLOAD_CLASS_LABEL,
    observe::{HeadRead, Snapshot, TurnSeen},
    reason::Reason,
};
use crate::{
    api::{
        HarnessBinding, HarnessBindingStatus, Lease, Lifecycle, SandboxProfile, StateProjection,
        binding::DurabilityStatus,
        conditions::{self, Desired, FALSE, TRUE},
        profile::HibernationPolicy,
        sandbox::{self, Sandbox, SandboxClaim},
    },
    domain::{duration, state::Durability},
    operator::{
        Error,
        failure::{Category, STALLED},
    },
    store::ClearReport,
};

/// How long a Ready claim's Sandbox or pod may look unready before the binding says so
/// in its status. Within it, the gap is almost always one watch arriving after another
/// (the claim turns Ready only once its Sandbox is), which the next watch event ends: a
/// status write for it would only queue ahead of other bindings' real transitions.
pub const SETTLE: Duration = Duration::from_secs(3);

/// What a profile allows, resolved for one binding.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub profile: SandboxProfile,
    pub claim_deadline: Duration,
    pub idle_ttl: Duration,
    pub max_lifetime: Duration,
}

/// An Event to publish once the status it tells of is written.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedEvent {
    pub warning: bool,
    pub reason: Reason,
    pub note: String,
}

/// What the raise of a fence does when the store refuses it as stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStale {
    /// Report it back (the store is ahead, e.g. a restore): the next decision moves the
    /// generation past it (`FenceAhead`).
    Report,
    /// Fail the reconcile (retried).
    Fail,
}

/// One action at the edges, in plan order.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Raise the store fence to `(epoch, generation)`.
    RaiseFence {
        epoch: u64,
        generation: u64,
        on_stale: OnStale,
    },
    /// Delete every claim of the binding but `keep` (a `ClaimReleased` Event each).
    ReleaseClaims {
        keep: Option<String>,
        generation: i64,
    },
    /// Create the claim of a lease generation on the warm pool, with the profile's
    /// labels ([`claim_labels`]).
    CreateClaim {
        name: String,
        pool: String,
        generation: i64,
        labels: BTreeMap<String, String>,
    },
    /// Set the Sandbox's `spec.operatingMode` (`Suspended` or `Running`).
    SetOperatingMode { sandbox: String, mode: &'static str },
    /// Clear the conversation into `epoch` in the store.
    ClearStore { epoch: u64 },
    /// On delete: raise the fence past the last generation, if the store has the binding.
    Revoke { epoch: u64, generation: u64 },
}

/// What follows the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Requeue(Duration),
    AwaitChange,
    /// Decide again in this reconcile, on what the plan wrote and did.
    Continue,
    /// After a release: look again shortly while claims remain, else forget the binding.
    UntilReleased,
}

/// A counter to move once the plan is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// The reconcile ended waiting for this.
    Waited(Reason),
    /// A worker replacement (a generation after the first).
    Replacement,
    /// A worker was bound (the lease is Ready).
    Bound,
}

/// What to apply: effects, then the status (compare-and-set), then `after`, then Events.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub effects: Vec<Effect>,
    /// The status to write when it differs from the one read; `None` writes nothing.
    pub status: Option<HarnessBindingStatus>,
    pub after: Vec<Effect>,
    /// Every Event of this reconcile so far (earlier rounds' included).
    pub events: Vec<PlannedEvent>,
    /// Carry the Events into the next round instead of publishing them now (the claim a
    /// new generation creates is told in the same Event).
    pub hold_events: bool,
    /// Event actions without the lease generation (a deleted binding).
    pub plain_event_actions: bool,
    pub next: Next,
    pub tally: Vec<Tally>,
}

/// One more read the decision needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The generation the store fences (a new lease never goes below it).
    StoreGeneration,
    /// The lease's claim, Sandbox and pod, read live: the caches say the worker is gone,
    /// and a cache can lag the API server, never lead it.
    LiveLeaseObjects,
    /// The Sandbox, read live (the claim says it is Ready, the cache does not yet).
    LiveSandbox,
    /// The worker pod, read live (the cache shows no image digests yet).
    LivePod,
    /// The durable head, for `status.state` (`force`: not rate-limited).
    Head { force: bool },
    /// When the store last saw any write to the binding.
    LastActivity,
    /// How many live claims other bindings hold with this profile
    /// (`limits.maxActiveLeases`).
    ProfileClaims,
}

/// One decision lives at a time, on the stack of one reconcile: boxing the plan would
/// buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Decision {
    Observe(Need),
    Act(Plan),
}

use Decision::{Act, Observe};

/// A working copy of the status and the Events.
pub struct Draft<'a> {
    binding: &'a HarnessBinding,
    pub status: HarnessBindingStatus,
    pub events: Vec<PlannedEvent>,
    now: &'a Time,
}

impl<'a> Draft<'a> {
    pub fn new(binding: &'a HarnessBinding, carried: &[PlannedEvent], now: &'a Time) -> Self {
        Draft {
            binding,
            status: binding.status.clone().unwrap_or_default(),
            events: carried.to_vec(),
            now,
        }
    }

    fn condition(&mut self, type_: &'static str, ok: bool, reason: Reason, message: String) {
        conditions::set(
            &mut self.status.conditions,
            Desired {
                type_,
                status: if ok { TRUE } else { FALSE },
                reason: reason.as_str(),
                message,
            },
            self.binding.metadata.generation,
            self.now,
        );
    }

    fn event(&mut self, warning: bool, reason: Reason, note: String) {
        self.events.push(PlannedEvent {
            warning,
            reason,
            note,
        });
    }

    fn lifecycle(&mut self, lifecycle: Lifecycle) {
        self.status.lifecycle = Some(lifecycle);
    }

    /// Write the status, publish the Events, then `next`.
    fn write(self, next: Next) -> Plan {
        Plan {
            effects: Vec::new(),
            status: Some(self.status),
            after: Vec::new(),
            events: self.events,
            hold_events: false,
            plain_event_actions: false,
            next,
            tally: Vec::new(),
        }
    }

    /// Apply `effects` without a status write, then decide again; the Events wait.
    fn then_continue(self, effects: Vec<Effect>) -> Plan {
        Plan {
            effects,
            status: None,
            hold_events: true,
            next: Next::Continue,
            ..self.write(Next::Continue)
        }
    }

    /// No write at all (the Events are empty on every path that takes this).
    fn wait(self, next: Next, waited: Reason) -> Plan {
        Plan {
            status: None,
            tally: vec![Tally::Waited(waited)],
            ..self.write(next)
        }
    }
}

/// Time helpers, all relative to the `now` a decision is made at.
pub fn time_plus(t: &Time, d: Duration) -> Time {
    let span = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    Time(t.0.checked_add(span).unwrap_or(Timestamp::MAX))
}

/// From `now` until `t` (zero when past).
pub fn until(t: &Time, now: &Time) -> Duration {
    if t.0 <= now.0 {
        Duration::ZERO
    } else {
        Duration::try_from(t.0.duration_since(now.0)).unwrap_or(Duration::ZERO)
    }
}

/// From `t` until `now` (zero when `t` is later).
pub fn since(t: &Time, now: &Time) -> Duration {
    until(now, t)
}

/// Whether the watch follows the objects the lease names (a bound or hibernated lease)
/// rather than the objects its claim leads to (a lease being claimed).
pub fn follows_lease(status: Option<&HarnessBindingStatus>) -> bool {
    status.is_some_and(|s| {
        s.lease.is_some()
            && matches!(
                s.lifecycle,
                Some(Lifecycle::Ready | Lifecycle::Busy | Lifecycle::Hibernated)
            )
    })
}

/// The pod a Sandbox runs: its pod-name annotation, else the Sandbox's own name.
pub fn pod_name_of(sb: &Sandbox, sandbox_name: &str) -> String {
    sb.annotations()
        .get(sandbox::POD_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| sandbox_name.to_owned())
}

pub fn sandbox_ready(sb: &Sandbox) -> bool {
    sb.status
        .as_ref()
        .is_some_and(|s| sandbox::is_ready(&s.conditions))
}

pub fn claim_ready(claim: &SandboxClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| sandbox::is_ready(&s.conditions))
}

/// A pod whose every container reports an image: the cache copy is good enough to verify.
pub fn pod_reports_images(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| !c.image_id.is_empty()))
}

pub fn controlled_by_uid(refs: Option<&[OwnerReference]>, uid: Option<&str>) -> bool {
    let Some(uid) = uid else { return false };
    refs.unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

fn owned_by(refs: Option<&[OwnerReference]>, binding: &HarnessBinding) -> bool {
    let uid = binding.uid();
    refs.unwrap_or_default()
        .iter()
        .any(|r| r.kind == "HarnessBinding" && Some(&r.uid) == uid.as_ref())
}

fn resume_requested_at(binding: &HarnessBinding) -> Option<Time> {
    binding
        .annotations()
        .get(RESUME_ANNOTATION)
        .and_then(|v| v.parse::<Timestamp>().ok())
        .map(Time)
}

/// The decision for a binding that is not being deleted.
pub fn decide(binding: &HarnessBinding, snap: &Snapshot, now: &Time) -> Result<Decision, Error> {
    let mut d = Draft::new(binding, &snap.carry.events, now);
    let Some(resolved) = accept_profile(binding, snap.profile.as_ref(), &mut d)? else {
        // The binding cannot progress until the profile is fixed; a profile change
        // requeues it (the profile watch in `operator::run_controllers`).
        if d.status.lease.is_none() {
            d.lifecycle(Lifecycle::Failed);
        }
        d.condition(
            READY,
            false,
            Reason::ProfileNotAccepted,
            "the SandboxProfile does not accept this binding (see ProfileAccepted)".into(),
        );
        return Ok(Act(d.write(Next::Requeue(Duration::from_secs(60)))));
    };
    let lease = d.status.lease.clone();
    match lease {
        Some(lease) if lease.epoch.unwrap_or(0) < binding.spec.epoch => {
            clearing(d, snap, &resolved, &lease)
        }
        None => new_generation(
            d,
            snap,
            &resolved,
            Reason::Initial,
            "first lease of this binding".into(),
        ),
        Some(lease) => match d.status.lifecycle {
            Some(Lifecycle::Ready | Lifecycle::Busy) => check_ready(d, snap, &resolved, &lease),
            Some(Lifecycle::Hibernated) => maybe_resume(d, snap, &resolved, &lease),
            _ => progress(d, snap, &resolved, &lease),
        },
    }
}

/// The labels every claim of `profile` carries: the profile's name (counted by
/// `limits.maxActiveLeases`), its workload class and its egress policy class.
pub fn claim_labels(profile: &SandboxProfile) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            PROFILE_LABEL.to_owned(),
            super::truncate_label(&profile.name_any()),
        ),
        (
            EGRESS_CLASS_LABEL.to_owned(),
            profile.spec.egress_policy_class.clone(),
        ),
    ]);
    if let Some(class) = profile
        .spec
        .workload_class
        .as_deref()
        .map(super::truncate_label)
        .filter(|c| !c.is_empty())
    {
        labels.insert(WORKLOAD_CLASS_LABEL.to_owned(), class);
    }
    labels
}

/// `limits.maxActiveLeases`: a claim is created only while other bindings hold fewer
/// claims of the profile. `Ok(Some((max, held)))` when the limit is reached.
fn slot_taken(snap: &Snapshot, resolved: &Resolved) -> Result<Option<(i32, usize)>, Need> {
    let Some(max) = resolved
        .profile
        .spec
        .limits
        .as_ref()
        .and_then(|l| l.max_active_leases)
    else {
        return Ok(None);
    };
    let held = snap.profile_claims.ok_or(Need::ProfileClaims)?;
    Ok((held >= usize::try_from(max).unwrap_or(0)).then_some((max, held)))
}

/// The claim waits for a slot: `Ready=False` (a Warning Event the first time), again in 15 s.
fn wait_for_slot(mut d: Draft<'_>, resolved: &Resolved, max: i32, held: usize) -> Plan {
    let message = format!(
        "SandboxProfile {} allows {max} active leases (limits.maxActiveLeases) and {held} are held: waiting for one to end",
        resolved.profile.name_any()
    );
    let told = conditions::get(&d.status.conditions, READY)
        .is_some_and(|c| c.reason == Reason::MaxActiveLeasesReached.as_str());
    if !told {
        d.event(true, Reason::MaxActiveLeasesReached, message.clone());
    }
    d.condition(READY, false, Reason::MaxActiveLeasesReached, message);
    let mut plan = d.write(Next::Requeue(Duration::from_secs(15)));
    plan.tally
        .push(Tally::Waited(Reason::MaxActiveLeasesReached));
    plan
}

/// Checks the profile and sets `ProfileAccepted`; `None` when it does not accept.
fn accept_profile(
    binding: &HarnessBinding,
    profile: Option<&SandboxProfile>,
    d: &mut Draft<'_>,
) -> Result<Option<Resolved>, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = &binding.spec.sandbox_profile_ref.name;
    let harness = binding.spec.harness.id;
    let refusal = match profile {
        None => Some((
            Reason::ProfileNotFound,
            format!("SandboxProfile {ns}/{name} does not exist"),
        )),
        Some(p) if !p.spec.enabled => Some((
            Reason::ProfileDisabled,
            format!("SandboxProfile {name} is disabled"),
        )),
        Some(p) if !p.spec.allowed_harness_ids.contains(&harness) => Some((
            Reason::HarnessNotAllowed,
            format!(
                "SandboxProfile {name} does not allow harness {}",
                harness.as_str()
            ),
        )),
        Some(_) => None,
    };
    if let Some((reason, message)) = refusal {
        d.condition(PROFILE_ACCEPTED, false, reason, message.clone());
        // kstatus: only a change to the profile (or to the binding's reference) cures
        // this, so the binding is Stalled, not InProgress.
        d.condition(STALLED, true, reason, message.clone());
        d.event(true, reason, message);
        return Ok(None);
    }
    let Some(profile) = profile else {
        return Ok(None);
    };
    let ready = profile
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, READY));
    if ready.is_none_or(|c| c.status != TRUE) {
        let why = ready
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "not reconciled yet".into());
        d.condition(
            PROFILE_ACCEPTED,
            false,
            Reason::ProfileNotReady,
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
        profile: profile.clone(),
    };
    // Only the profile verdict's own `Stalled` is cleared here; one the error policy set
    // (`failure.rs`, e.g. `InvalidSpec`) is its to clear after a successful reconcile.
    let policy_stalled = conditions::get(&d.status.conditions, STALLED)
        .is_some_and(|c| c.status == TRUE && Category::is_failure_reason(&c.reason));
    if !policy_stalled {
        d.condition(
            STALLED,
            false,
            Reason::Accepted,
            format!("SandboxProfile {name} accepts this binding"),
        );
    }
    d.condition(
        PROFILE_ACCEPTED,
        true,
        Reason::ProfileAccepted,
        format!(
            "SandboxProfile {name} allows harness {} (warm pool {})",
            harness.as_str(),
            profile.spec.warm_pool_ref.name
        ),
    );
    Ok(Some(resolved))
}

/// Epoch clear: say so (one write), clear the store, then a fresh lease for the epoch.
fn clearing(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Decision, Error> {
    let epoch = d.binding.spec.epoch;
    if d.status.lifecycle != Some(Lifecycle::Clearing) {
        d.lifecycle(Lifecycle::Clearing);
        d.condition(
            READY,
            false,
            Reason::Clearing,
            format!(
                "clearing the conversation into epoch {epoch}: the old epoch's state is being deleted"
            ),
        );
        d.event(
            false,
            Reason::ClearStarted,
            format!("epoch {} -> {epoch}", lease.epoch.unwrap_or(0)),
        );
        return Ok(Act(d.write(Next::Requeue(Duration::ZERO))));
    }
    let Some(report) = &snap.carry.cleared else {
        let epoch = u64::try_from(epoch).unwrap_or(0);
        return Ok(Act(d.then_continue(vec![Effect::ClearStore { epoch }])));
    };
    d.event(false, Reason::ConversationCleared, cleared_note(report));
    new_generation(
        d,
        snap,
        resolved,
        Reason::EpochCleared,
        format!("the conversation was cleared into epoch {epoch}"),
    )
}

fn cleared_note(report: &ClearReport) -> String {
    format!(
        "epoch {}: deleted {} states, {} objects, {} stream entries of the old epoch; memory untouched",
        report.epoch, report.states_deleted, report.objects_deleted, report.stream_entries_deleted
    )
}

/// Step 1 of a lease: a new generation in the status (compare-and-set), then the claim
/// in the same reconcile. Never below what the store already fences.
fn new_generation(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    reason: Reason,
    message: String,
) -> Result<Decision, Error> {
    let Some(fenced) = snap.store.fenced_generation else {
        return Ok(Observe(Need::StoreGeneration));
    };
    let old = d.status.lease.as_ref().map(|l| l.generation).unwrap_or(0);
    let generation = old.max(fenced.saturating_sub(1)) + 1;
    let name = super::claim_name(&snap.id, generation);
    d.status.lease = Some(Lease {
        generation,
        epoch: Some(d.binding.spec.epoch),
        claim_name: Some(name.clone()),
        claimed_at: Some(d.now.clone()),
        expires_at: Some(time_plus(d.now, resolved.max_lifetime)),
        ..Default::default()
    });
    let first = old == 0;
    d.lifecycle(if first {
        Lifecycle::Claiming
    } else {
        Lifecycle::Replacing
    });
    if first {
        let message = format!("claiming a sandbox for lease generation {generation}");
        d.condition(READY, false, Reason::Claiming, message);
    } else {
        let message = format!("replacing the worker at lease generation {generation}: {message}");
        d.condition(READY, false, Reason::Replacing, message);
    }
    // Worded as `progress` will find it right after creating the claim, so the wait
    // costs no second status write.
    d.condition(
        SANDBOX_READY,
        false,
        Reason::ClaimNotReady,
        format!("waiting for SandboxClaim {name} to be Ready"),
    );
    d.condition(
        WORKER_VERIFIED,
        false,
        Reason::Claiming,
        "no worker is bound to this generation yet".into(),
    );
    let note = format!("lease generation {old} -> {generation} ({reason}): {message}");
    if !first {
        d.condition(REPLACED, true, reason, note.clone());
    }
    if conditions::get(&d.status.conditions, HIBERNATED).is_some() {
        let message = "the lease is not hibernated".into();
        d.condition(HIBERNATED, false, Reason::NotHibernated, message);
    }
    let routine = matches!(
        reason,
        Reason::EpochCleared | Reason::MaxLifetimeReached | Reason::Resumed
    );
    let event = if first {
        Reason::LeaseStarted
    } else {
        Reason::Replacing
    };
    d.event(!(first || routine), event, note);
    let mut plan = d.write(Next::Continue);
    plan.hold_events = true;
    if !first {
        plan.tally.push(Tally::Replacement);
    }
    Ok(Act(plan))
}

/// After this generation's claim was created: the Event of the new lease names it, or a
/// `Claimed` Event does when no lease Event is pending.
pub fn note_claim_created(events: &mut Vec<PlannedEvent>, name: &str, pool: &str, generation: i64) {
    let lease_event = events
        .iter_mut()
        .find(|e| matches!(e.reason, Reason::LeaseStarted | Reason::Replacing));
    match lease_event {
        Some(e) => e.note.push_str(&format!(
            "; created SandboxClaim {name} on warm pool {pool}"
        )),
        None => events.push(PlannedEvent {
            warning: false,
            reason: Reason::Claimed,
            note: format!(
                "created SandboxClaim {name} on warm pool {pool} for lease generation {generation}"
            ),
        }),
    }
}

/// The Event of a deleted claim.
pub fn released_event(name: &str) -> PlannedEvent {
    PlannedEvent {
        warning: false,
        reason: Reason::ClaimReleased,
        note: format!("deleted SandboxClaim {name} of an older lease generation"),
    }
}

/// Steps 2–4 of a lease, one plan each: the fence, the older claims, the claim; then
/// the worker ([`bind_worker`]).
fn progress(
    d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Decision, Error> {
    let epoch = u64::try_from(d.binding.spec.epoch).unwrap_or(0);
    let generation = u64::try_from(lease.generation).unwrap_or(0);
    if snap.carry.fence_ahead == Some(lease.generation) {
        let message = "the store fence was ahead of the lease generation".into();
        return new_generation(d, snap, resolved, Reason::FenceAhead, message);
    }
    if !snap.store.fence_raised {
        return Ok(Act(d.then_continue(vec![Effect::RaiseFence {
            epoch,
            generation,
            on_stale: OnStale::Report,
        }])));
    }
    let Some(name) = lease.claim_name.clone() else {
        let message = "the lease names no claim".into();
        return new_generation(d, snap, resolved, Reason::ClaimMissing, message);
    };
    // Older claims go before a new one exists: never two live claims. (Generation 1 of
    // a binding has no older claims: its UID is new.)
    if lease.generation > 1 && snap.carry.released != Some(lease.generation) {
        return Ok(Act(d.then_continue(vec![Effect::ReleaseClaims {
            keep: Some(name),
            generation: lease.generation,
        }])));
    }
    let Some(claim) = &snap.cached.claim else {
        // Absent from the cache: not created yet, or so recently the watch has not
        // brought it; the create's 409 says which.
        match slot_taken(snap, resolved) {
            Err(need) => return Ok(Observe(need)),
            Ok(Some((max, held))) => return Ok(Act(wait_for_slot(d, resolved, max, held))),
            Ok(None) => {}
        }
        return Ok(Act(d.then_continue(vec![Effect::CreateClaim {
            name,
            pool: resolved.profile.spec.warm_pool_ref.name.clone(),
            generation: lease.generation,
            labels: claim_labels(&resolved.profile),
        }])));
    };
    if !owned_by(claim.meta().owner_references.as_deref(), d.binding) {
        return Ok(Act(claim_conflict(d, &name)));
    }
    bind_worker(d, snap, resolved, lease, claim, &name)
}

fn claim_conflict(mut d: Draft<'_>, name: &str) -> Plan {
    let message = format!("SandboxClaim {name} exists and is not owned by this binding");
    d.lifecycle(Lifecycle::Failed);
    d.condition(SANDBOX_READY, false, Reason::ClaimConflict, message.clone());
    d.condition(READY, false, Reason::ClaimConflict, message);
    d.write(Next::Requeue(Duration::from_secs(60)))
}

/// Step 5: the claim's Sandbox and pod (ownership by UID, not by name), the worker
/// verified against the profile, and only then the lease Ready.
fn bind_worker(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
    claim: &SandboxClaim,
    name: &str,
) -> Result<Decision, Error> {
    // The readiness deadline runs from the claim (or resume) time.
    let deadline = lease
        .claimed_at
        .as_ref()
        .map(|t| time_plus(t, resolved.claim_deadline));
    let past_deadline = deadline.as_ref().is_some_and(|t| until(t, d.now).is_zero());
    let late = |d, message| {
        let reason = Reason::ClaimReadinessDeadlineExceeded;
        new_generation(d, snap, resolved, reason, message)
    };
    let sandbox_name = match claim_verdict(snap, claim, name) {
        Ok(sandbox_name) => sandbox_name,
        Err(_) if past_deadline => {
            let message = format!(
                "SandboxClaim {name} was not Ready within {}",
                resolved.profile.spec.timeouts.claim_readiness_deadline
            );
            return late(d, message);
        }
        Err((reason, message)) => {
            d.condition(SANDBOX_READY, false, reason, message);
            let wait = deadline
                .as_ref()
                .map(|t| until(t, d.now))
                .unwrap_or(Duration::from_secs(30));
            let mut plan = d.write(Next::Requeue(wait.max(Duration::from_millis(100))));
            plan.tally.push(Tally::Waited(reason));
            return Ok(Act(plan));
        }
    };
    let (sb, pod) = match worker_objects(snap, claim, name, &sandbox_name) {
        Err(need) => return Ok(Observe(need)),
        Ok(Err(message)) if past_deadline => return late(d, message),
        Ok(Err(message)) => return Ok(Act(settle_or_wait(d, claim, message))),
        Ok(Ok(found)) => found,
    };
    match verify_worker(pod, &resolved.profile) {
        // A pod that reports no image yet is still starting, not refused.
        Err((Reason::WorkerImageUnknown, message)) if !past_deadline => {
            Ok(Act(settle_or_wait(d, claim, message)))
        }
        Err((reason, message)) => Ok(Act(worker_rejected(
            d,
            lease,
            &sandbox_name,
            reason,
            message,
        ))),
        Ok((digest, protocol)) => {
            let HeadRead::NotRead = snap.store.head else {
                let worker = Worker {
                    claim,
                    sandbox: sb,
                    sandbox_name: &sandbox_name,
                    pod,
                    digest: &digest,
                    protocol,
                };
                return Ok(Act(lease_ready(d, snap, resolved, lease, worker)));
            };
            Ok(Observe(Need::Head { force: true }))
        }
    }
}

/// The claim of this generation, as far as it alone tells: the Sandbox it controls, or
/// why it is not there yet. The lease does not wait for the claim's own Ready condition
/// when the Sandbox it controls is already Ready: the claim reports the same fact one
/// Agent Sandbox round trip later, and everything the lease relies on (the Sandbox
/// controlled by this claim, Ready, and its pod verified) is checked here.
fn claim_verdict(
    snap: &Snapshot,
    claim: &SandboxClaim,
    name: &str,
) -> Result<String, (Reason, String)> {
    if claim.meta().deletion_timestamp.is_some() {
        let message = format!("SandboxClaim {name} is being deleted");
        return Err((Reason::ClaimDeleting, message));
    }
    let owned_sandbox_ready = snap.caches
        && snap.cached.sandbox.as_ref().is_some_and(|sb| {
            controlled_by_uid(
                sb.meta().owner_references.as_deref(),
                claim.uid().as_deref(),
            ) && sandbox_ready(sb)
        });
    match &snap.sandbox_name {
        Some(sb) if claim_ready(claim) || owned_sandbox_ready => Ok(sb.clone()),
        // The claim's own reason is in its status; repeating each of its changes here
        // would cost a status write per change and tell nothing new.
        _ => Err((
            Reason::ClaimNotReady,
            format!("waiting for SandboxClaim {name} to be Ready"),
        )),
    }
}

/// The Sandbox and pod the claim leads to, from the caches while they are good enough
/// (`Err(need)`: one live read first), or why they are not usable.
fn worker_objects<'s>(
    snap: &'s Snapshot,
    claim: &SandboxClaim,
    name: &str,
    sandbox_name: &str,
) -> Result<Result<(&'s Sandbox, &'s Pod), String>, Need> {
    // The claim (or the Sandbox) already says the next object is Ready: when the cache
    // does not show it so yet, its watch is behind, and one live read beats waiting.
    let sandbox = match &snap.live_sandbox {
        Some(live) => live.as_ref(),
        None => {
            let cached = snap.cached.sandbox.as_ref();
            if cached.is_some_and(sandbox_ready) || (snap.caches && !claim_ready(claim)) {
                cached
            } else {
                return Err(Need::LiveSandbox);
            }
        }
    };
    let Some(sb) = sandbox else {
        return Ok(Err(format!("Sandbox {sandbox_name} not found")));
    };
    if !controlled_by_uid(
        sb.meta().owner_references.as_deref(),
        claim.uid().as_deref(),
    ) {
        return Ok(Err(format!(
            "Sandbox {sandbox_name} is not controlled by SandboxClaim {name}"
        )));
    }
    if !sandbox_ready(sb) {
        return Ok(Err(format!("Sandbox {sandbox_name} is not Ready")));
    }
    let pod_name = pod_name_of(sb, sandbox_name);
    let pod = match &snap.live_pod {
        Some(live) => live.as_ref(),
        None if snap.cached.pod.as_ref().is_some_and(pod_reports_images) => {
            snap.cached.pod.as_ref()
        }
        None => return Err(Need::LivePod),
    };
    let Some(pod) = pod else {
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

/// The claim is Ready but its Sandbox or worker pod is not (yet) seen Ready: wait for
/// the watch without a write while that is fresh, then say so in `SandboxReady`.
fn settle_or_wait(mut d: Draft<'_>, claim: &SandboxClaim, message: String) -> Plan {
    // How long the claim has been Ready (`None`: not Ready).
    let ready_for = claim
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == READY && c.status == TRUE)
        })
        .map(|c| since(&c.last_transition_time, d.now));
    if d.events.is_empty() {
        match ready_for {
            // Seen ahead of the claim: the claim's own progress is what to wait for, and
            // `SandboxReady` already says so.
            None => return d.wait(Next::Requeue(SETTLE), Reason::ClaimNotReady),
            Some(t) if t < SETTLE => return d.wait(Next::Requeue(SETTLE), Reason::SandboxSettling),
            Some(_) => {}
        }
    }
    d.condition(SANDBOX_READY, false, Reason::SandboxNotReady, message);
    let mut plan = d.write(Next::Requeue(Duration::from_secs(1)));
    plan.tally.push(Tally::Waited(Reason::SandboxNotReady));
    plan
}

fn worker_rejected(
    mut d: Draft<'_>,
    lease: &Lease,
    sandbox_name: &str,
    reason: Reason,
    message: String,
) -> Plan {
    let was_failed = d.binding.status.as_ref().and_then(|s| s.lifecycle) == Some(Lifecycle::Failed);
    d.lifecycle(Lifecycle::Failed);
    d.condition(WORKER_VERIFIED, false, reason, message.clone());
    d.condition(
        SANDBOX_READY,
        true,
        Reason::SandboxReady,
        format!("Sandbox {sandbox_name} is Ready"),
    );
    d.condition(
        READY,
        false,
        Reason::WorkerRejected,
        format!(
            "the worker of lease generation {} was rejected: {message}",
            lease.generation
        ),
    );
    if !was_failed {
        d.event(true, reason, message);
    }
    d.write(Next::Requeue(Duration::from_secs(60)))
}

/// What a verified worker is.
struct Worker<'a> {
    claim: &'a SandboxClaim,
    sandbox: &'a Sandbox,
    sandbox_name: &'a str,
    pod: &'a Pod,
    digest: &'a str,
    protocol: i32,
}

fn lease_ready(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
    w: Worker<'_>,
) -> Plan {
    let pod_name = w.pod.metadata.name.clone().unwrap_or_default();
    let sandbox_name = w.sandbox_name;
    let (digest, protocol, generation) = (w.digest, w.protocol, lease.generation);
    let mut next = lease.clone();
    next.claim_uid = w.claim.uid();
    next.sandbox_name = Some(sandbox_name.to_owned());
    next.sandbox_uid = w.sandbox.uid();
    next.worker_pod_name = Some(pod_name.clone());
    next.worker_pod_uid = w.pod.metadata.uid.clone();
    next.worker_image_digest = Some(digest.to_owned());
    next.protocol_version = Some(protocol);
    next.ready_at = Some(d.now.clone());
    next.last_seen_at = Some(d.now.clone());
    d.status.lease = Some(next);
    d.lifecycle(Lifecycle::Ready);
    d.condition(
        SANDBOX_READY,
        true,
        Reason::SandboxReady,
        format!("Sandbox {sandbox_name} (pod {pod_name}) is Ready"),
    );
    d.condition(
        WORKER_VERIFIED,
        true,
        Reason::WorkerVerified,
        format!("image {digest}, protocol version {protocol}"),
    );
    d.condition(
        READY,
        true,
        Reason::LeaseReady,
        format!("worker verified and bound at lease generation {generation}"),
    );
    d.event(
        false,
        Reason::LeaseReady,
        format!(
            "lease generation {generation} bound to Sandbox {sandbox_name}, pod {pod_name} (image {digest}, protocol {protocol})"
        ),
    );
    project_head(&mut d, &snap.store.head);
    project_turn(&mut d, snap.store.turn.as_ref());
    let wait = next_check(lease, resolved, snap.projection_interval, d.now);
    let mut plan = d.write(Next::Requeue(wait));
    plan.tally.push(Tally::Bound);
    plan
}

/// The worker's image digest and protocol version, or why they are refused.
pub fn verify_worker(
    pod: &Pod,
    profile: &SandboxProfile,
) -> Result<(String, i32), (Reason, String)> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    if statuses.is_empty() {
        return Err((
            Reason::WorkerImageUnknown,
            format!("pod {pod_name} reports no container status yet"),
        ));
    }
    let mut first = None;
    for status in &statuses {
        let Some(digest) = sandbox::image_digest(&status.image_id) else {
            return Err((
                Reason::WorkerImageUnknown,
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
                Reason::ImageDigestNotAllowed,
                format!(
                    "container {} of pod {pod_name} runs {digest}, which SandboxProfile {} does not allow",
                    status.name,
                    profile.name_any()
                ),
            ));
        }
        first.get_or_insert_with(|| digest.to_owned());
    }
    let protocol = verify_protocol(pod, &pod_name, profile)?;
    Ok((first.unwrap_or_default(), protocol))
}

fn verify_protocol(
    pod: &Pod,
    pod_name: &str,
    profile: &SandboxProfile,
) -> Result<i32, (Reason, String)> {
    let annotation = sandbox::PROTOCOL_VERSION_ANNOTATION;
    let Some(declared) = pod.annotations().get(annotation) else {
        return Err((
            Reason::ProtocolVersionMissing,
            format!("pod {pod_name} has no {annotation} annotation"),
        ));
    };
    let protocol: i32 = declared.trim().parse().map_err(|_| {
        (
            Reason::ProtocolVersionInvalid,
            format!("pod {pod_name} declares protocol version {declared:?}, not a number"),
        )
    })?;
    if !profile.spec.worker_protocol_versions.contains(&protocol) {
        return Err((
            Reason::ProtocolVersionNotAllowed,
            format!(
                "pod {pod_name} speaks protocol version {protocol}; SandboxProfile {} allows {:?}",
                profile.name_any(),
                profile.spec.worker_protocol_versions
            ),
        ));
    }
    Ok(protocol)
}

/// When to look again at a Ready lease: its expiry or idle deadline, the next state
/// projection, at most a minute.
pub fn next_check(
    lease: &Lease,
    resolved: &Resolved,
    projection: Duration,
    now: &Time,
) -> Duration {
    let mut wait = Duration::from_secs(60).min(projection);
    if let Some(expires) = &lease.expires_at {
        wait = wait.min(until(expires, now));
    }
    if resolved.profile.spec.hibernation != HibernationPolicy::Never {
        wait = wait.min(resolved.idle_ttl);
    }
    wait.max(Duration::from_millis(100))
}

/// A Ready lease: is its worker still the one verified, within its lifetime, active?
fn check_ready(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Decision, Error> {
    // The caches first; a failure they show is confirmed with live reads before a
    // worker is replaced on their word (a cache can lag, never lead, the API server).
    let failure = match &snap.live_lease {
        Some(live) => lease_failure(
            live.claim.as_ref(),
            live.sandbox.as_ref(),
            live.pod.as_ref(),
            lease,
        ),
        None => {
            let c = &snap.cached;
            let cached = lease_failure(c.claim.as_ref(), c.sandbox.as_ref(), c.pod.as_ref(), lease);
            if !snap.caches || cached.is_some() {
                return Ok(Observe(Need::LiveLeaseObjects));
            }
            None
        }
    };
    if let Some((reason, message)) = failure {
        // `Replaced` carries the cause; `SandboxReady` is the new claim's
        // (`ClaimNotReady`), set by `new_generation`.
        d.event(true, reason, message.clone());
        return new_generation(d, snap, resolved, reason, message);
    }
    if lease
        .expires_at
        .as_ref()
        .is_some_and(|t| until(t, d.now).is_zero())
    {
        let message = format!(
            "the lease reached the profile's maximum lifetime ({})",
            resolved.profile.spec.timeouts.max_lifetime
        );
        return new_generation(d, snap, resolved, Reason::MaxLifetimeReached, message);
    }
    if snap.store.head == HeadRead::NotRead {
        return Ok(Observe(Need::Head { force: false }));
    }
    // Activity: the last durable commit, the lease start, or a resume request; when
    // idle by those alone, the store's last write of any kind (a harness that keeps its
    // state in objects and streams commits no head).
    let head_at = project_head(&mut d, &snap.store.head);
    // `busy` while a run is in flight (the run ledger); the mirror stays when not read.
    let busy = project_turn(&mut d, snap.store.turn.as_ref())
        .unwrap_or(d.status.lifecycle == Some(Lifecycle::Busy));
    d.lifecycle(if busy {
        Lifecycle::Busy
    } else {
        Lifecycle::Ready
    });
    let mut last_active = lease.ready_at.clone().unwrap_or_else(|| d.now.clone());
    for t in [head_at, resume_requested_at(d.binding)]
        .into_iter()
        .flatten()
    {
        if t.0 > last_active.0 {
            last_active = t;
        }
    }
    // `never`: no idle rule at all, the lease lives until its maximum lifetime.
    let policy = resolved.profile.spec.hibernation;
    let hibernates = policy != HibernationPolicy::Never && !busy;
    if hibernates && since(&last_active, d.now) >= resolved.idle_ttl {
        match &snap.store.last_activity {
            None => return Ok(Observe(Need::LastActivity)),
            Some(Some(t)) if t.0 > last_active.0 => last_active = t.clone(),
            Some(_) => {}
        }
    }
    if hibernates && since(&last_active, d.now) >= resolved.idle_ttl {
        return Ok(Act(if policy == HibernationPolicy::Release {
            release_idle(d, resolved, lease, &last_active)
        } else {
            hibernate(d, resolved, lease, &last_active)
        }));
    }
    // Only a change a reader would notice is written (last_seen moves with commits).
    if lease.last_seen_at.as_ref() != Some(&last_active) {
        let mut next = lease.clone();
        next.last_seen_at = Some(last_active);
        d.status.lease = Some(next);
    }
    let wait = next_check(lease, resolved, snap.projection_interval, d.now);
    Ok(Act(d.write(Next::Requeue(wait))))
}

fn hibernate(mut d: Draft<'_>, resolved: &Resolved, lease: &Lease, last_active: &Time) -> Plan {
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    d.lifecycle(Lifecycle::Hibernated);
    let message = format!(
        "idle for {} (idle TTL {}): Sandbox {sb_name} suspended; the next bind resumes it",
        duration::display(since(last_active, d.now)),
        resolved.profile.spec.timeouts.idle_ttl
    );
    d.condition(HIBERNATED, true, Reason::IdleTTLReached, message.clone());
    d.condition(READY, false, Reason::Hibernated, message.clone());
    d.condition(SANDBOX_READY, false, Reason::Suspended, message.clone());
    d.event(false, Reason::Hibernated, message);
    Plan {
        effects: vec![Effect::SetOperatingMode {
            sandbox: sb_name,
            mode: "Suspended",
        }],
        ..d.write(Next::Requeue(Duration::from_secs(60)))
    }
}

/// Hibernation `release`: the status says so first (compare-and-set), then the lease's
/// claim is deleted (its Sandbox and pod with it). The next bind claims a new sandbox at
/// a new generation ([`maybe_resume`]).
fn release_idle(mut d: Draft<'_>, resolved: &Resolved, lease: &Lease, last_active: &Time) -> Plan {
    let claim = lease.claim_name.clone().unwrap_or_default();
    d.lifecycle(Lifecycle::Hibernated);
    let message = format!(
        "idle for {} (idle TTL {}): SandboxClaim {claim} released (hibernation: release); the next bind claims a new sandbox",
        duration::display(since(last_active, d.now)),
        resolved.profile.spec.timeouts.idle_ttl
    );
    d.condition(HIBERNATED, true, Reason::IdleTTLReached, message.clone());
    d.condition(READY, false, Reason::Hibernated, message.clone());
    d.condition(SANDBOX_READY, false, Reason::Released, message.clone());
    d.event(false, Reason::Hibernated, message);
    Plan {
        after: vec![Effect::ReleaseClaims {
            keep: None,
            generation: lease.generation,
        }],
        ..d.write(Next::Requeue(Duration::from_secs(60)))
    }
}

/// Why a Ready lease's worker is gone, from what was read of its claim, Sandbox and pod
/// (`None` where absent). `None` when the worker is still the one that was verified.
pub fn lease_failure(
    claim: Option<&SandboxClaim>,
    sandbox: Option<&Sandbox>,
    pod: Option<&Pod>,
    lease: &Lease,
) -> Option<(Reason, String)> {
    let claim_name = lease.claim_name.clone().unwrap_or_default();
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    let pod_name = lease.worker_pod_name.clone().unwrap_or_default();
    let lost = |reason, message: String| Some((reason, message));
    let Some(claim) = claim else {
        return lost(
            Reason::ClaimLost,
            format!("SandboxClaim {claim_name} no longer exists"),
        );
    };
    if claim.uid() != lease.claim_uid || claim.meta().deletion_timestamp.is_some() {
        let message = format!("SandboxClaim {claim_name} was deleted or recreated");
        return lost(Reason::ClaimLost, message);
    }
    let Some(sb) = sandbox else {
        return lost(
            Reason::SandboxLost,
            format!("Sandbox {sb_name} no longer exists"),
        );
    };
    if sb.uid() != lease.sandbox_uid {
        let message = format!("Sandbox {sb_name} was recreated with another UID");
        return lost(Reason::SandboxLost, message);
    }
    let Some(pod) = pod else {
        return lost(
            Reason::WorkerPodLost,
            format!("worker pod {pod_name} was deleted"),
        );
    };
    if pod.metadata.uid != lease.worker_pod_uid {
        let message = format!(
            "worker pod {pod_name} was deleted and recreated: a new process is a new worker"
        );
        return lost(Reason::WorkerPodLost, message);
    }
    if pod.metadata.deletion_timestamp.is_some() {
        let message = format!("worker pod {pod_name} is being deleted");
        return lost(Reason::WorkerPodLost, message);
    }
    if !sandbox_ready(sb) {
        let message = format!("Sandbox {sb_name} is no longer Ready");
        return lost(Reason::SandboxFailed, message);
    }
    None
}

/// A hibernated lease resumes when a bind asks after the hibernation. The resumed
/// Sandbox runs a new pod: a new worker, so a new generation (same claim).
fn maybe_resume(
    mut d: Draft<'_>,
    snap: &Snapshot,
    resolved: &Resolved,
    lease: &Lease,
) -> Result<Decision, Error> {
    let hibernated_at = conditions::get(&d.status.conditions, HIBERNATED)
        .filter(|c| c.status == TRUE)
        .map(|c| c.last_transition_time.clone());
    let wants = match (resume_requested_at(d.binding), &hibernated_at) {
        (Some(r), Some(h)) => r.0 > h.0,
        (Some(_), None) => true,
        _ => false,
    };
    let released = resolved.profile.spec.hibernation == HibernationPolicy::Release;
    if !wants && released && snap.cached.claim.is_some() && snap.carry.released.is_none() {
        // A release whose delete did not happen (or not yet): delete again.
        return Ok(Act(d.then_continue(vec![Effect::ReleaseClaims {
            keep: None,
            generation: lease.generation,
        }])));
    }
    if !wants {
        if snap.store.head == HeadRead::NotRead {
            return Ok(Observe(Need::Head { force: false }));
        }
        project_head(&mut d, &snap.store.head);
        project_turn(&mut d, snap.store.turn.as_ref());
        return Ok(Act(d.write(Next::Requeue(Duration::from_secs(300)))));
    }
    if released {
        let message = "a bind after the idle release: claiming a new sandbox".into();
        return new_generation(d, snap, resolved, Reason::Resumed, message);
    }
    let sb_name = lease.sandbox_name.clone().unwrap_or_default();
    let Some(live) = &snap.live_sandbox else {
        return Ok(Observe(Need::LiveSandbox));
    };
    let lost = match live {
        None => Some(format!(
            "Sandbox {sb_name} of the hibernated lease no longer exists"
        )),
        Some(sb) if sb.uid() != lease.sandbox_uid => {
            Some(format!("Sandbox {sb_name} was recreated while hibernated"))
        }
        Some(_) => None,
    };
    if let Some(message) = lost {
        return new_generation(d, snap, resolved, Reason::SandboxLost, message);
    }
    Ok(Act(resume(d, resolved, lease, &sb_name)))
}

/// New generation, same claim and Sandbox: the status first (compare-and-set), then the
/// fence, then the Sandbox runs again; the new pod is bound as any worker is.
fn resume(mut d: Draft<'_>, resolved: &Resolved, lease: &Lease, sb_name: &str) -> Plan {
    let generation = lease.generation + 1;
    let mut next = lease.clone();
    next.generation = generation;
    next.claimed_at = Some(d.now.clone());
    next.worker_pod_name = None;
    next.worker_pod_uid = None;
    next.ready_at = None;
    next.expires_at = Some(time_plus(d.now, resolved.max_lifetime));
    d.status.lease = Some(next);
    d.lifecycle(Lifecycle::Claiming);
    let message =
        format!("resuming Sandbox {sb_name} at lease generation {generation} (bind requested)");
    d.condition(HIBERNATED, false, Reason::Resumed, message.clone());
    d.condition(READY, false, Reason::Resuming, message.clone());
    d.condition(SANDBOX_READY, false, Reason::Resuming, message.clone());
    d.event(false, Reason::Resuming, message);
    let epoch = u64::try_from(d.binding.spec.epoch).unwrap_or(0);
    Plan {
        after: vec![
            Effect::RaiseFence {
                epoch,
                generation: u64::try_from(generation).unwrap_or(0),
                on_stale: OnStale::Fail,
            },
            Effect::SetOperatingMode {
                sandbox: sb_name.to_owned(),
                mode: "Running",
            },
        ],
        ..d.write(Next::Continue)
    }
}

/// Mirrors the store's pending interrupt into `status.pendingInterrupt`; returns
/// whether a run is in flight (`None`: not read this time, the mirror stays).
fn project_turn(d: &mut Draft<'_>, turn: Option<&TurnSeen>) -> Option<bool> {
    let turn = turn?;
    d.status.pending_interrupt = turn.interrupt.clone();
    project_effects(d, &turn.unknown_effects);
    Some(turn.running)
}

/// `EffectsSettled`: False with every unknown effect named (the first five) while any
/// waits for a person; a Warning Event when one first appears.
fn project_effects(d: &mut Draft<'_>, unknown: &[String]) {
    if unknown.is_empty() {
        let message = "no effect waits with an unknown outcome".to_owned();
        d.condition(EFFECTS_SETTLED, true, Reason::EffectsSettled, message);
        return;
    }
    let shown: Vec<&str> = unknown.iter().take(5).map(String::as_str).collect();
    let more = unknown.len().saturating_sub(shown.len());
    let message = format!(
        "{} effect(s) with an unknown outcome wait for a person: {}{}; record each outcome (confirmed or refused) before anything retries it",
        unknown.len(),
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    );
    let was = conditions::get(&d.status.conditions, EFFECTS_SETTLED).map(|c| c.reason.clone());
    if was.as_deref() != Some(Reason::EffectOutcomeUnknown.as_str()) {
        d.event(true, Reason::EffectOutcomeUnknown, message.clone());
    }
    d.condition(
        EFFECTS_SETTLED,
        false,
        Reason::EffectOutcomeUnknown,
        message,
    );
}

/// Projects the durable head into `status.state`. Returns the head's commit time (for
/// idleness): the projected one, or the last projection's when none was due.
fn project_head(d: &mut Draft<'_>, head: &HeadRead) -> Option<Time> {
    match head {
        HeadRead::NotRead | HeadRead::NotDue => {
            d.status.state.as_ref().and_then(|s| s.committed_at.clone())
        }
        HeadRead::Unavailable => None,
        HeadRead::Absent => {
            d.status.state = None;
            let message = "nothing committed in this epoch yet".into();
            d.condition(STATE_DURABLE, true, Reason::NoTurnYet, message);
            None
        }
        HeadRead::Present(head) => {
            let committed_at = Timestamp::from_millisecond(head.committed_at_ms)
                .ok()
                .map(Time);
            let uncertain = head.uncertain_runs > 0;
            let durability_status = match head.durability {
                _ if uncertain => DurabilityStatus::Uncertain,
                Durability::Committed => DurabilityStatus::Committed,
                Durability::Uncertain => DurabilityStatus::Uncertain,
            };
            d.status.state = Some(StateProjection {
                durable_revision: i64::try_from(head.revision).unwrap_or(i64::MAX),
                durability_status,
                committed_at: committed_at.clone(),
            });
            if uncertain {
                let message = format!(
                    "{} run(s) marked uncertain after revision {}: reconcile them (POST /v1/bindings/{{id}}/state/uncertain/reconcile) before the next turn",
                    head.uncertain_runs, head.revision
                );
                d.condition(STATE_DURABLE, false, Reason::RunUncertain, message);
            } else {
                let message = format!("durable head at revision {}", head.revision);
                d.condition(STATE_DURABLE, true, Reason::HeadCommitted, message);
            }
            committed_at
        }
    }
}

/// The binding is being deleted: say so (one write), then revoke its last worker in the
/// store and delete its claims until none is left. State stays under its retention.
pub fn release(binding: &HarnessBinding, now: &Time) -> Plan {
    let mut d = Draft::new(binding, &[], now);
    let generation = d.status.lease.as_ref().map(|l| l.generation).unwrap_or(0);
    if d.status.lifecycle != Some(Lifecycle::Releasing) {
        d.lifecycle(Lifecycle::Releasing);
        d.condition(
            READY,
            false,
            Reason::Releasing,
            "the binding is being deleted: releasing its sandbox".into(),
        );
        d.event(
            false,
            Reason::Releasing,
            format!("releasing the lease of generation {generation}"),
        );
        return d.write(Next::Requeue(Duration::ZERO));
    }
    let epoch = u64::try_from(binding.spec.epoch).unwrap_or(0);
    Plan {
        effects: vec![
            Effect::Revoke {
                epoch,
                generation: u64::try_from(generation + 1).unwrap_or(0),
            },
            Effect::ReleaseClaims {
                keep: None,
                generation,
            },
        ],
        // The status of a deleting object is not worth a write.
        status: None,
        plain_event_actions: true,
        ..d.write(Next::UntilReleased)
    }
}
