//! Observe: everything a decision about one binding reads, gathered into a [`Snapshot`].
//!
//! The watch caches first (the same watches trigger the reconciles, so waiting costs no
//! API calls); a live read or a store read only when `decide` asks for it with a
//! [`Need`] (a cache can lag the API server, never lead it). What earlier rounds of the
//! same reconcile did (a claim created, a fence refused, a clear's report) comes in as
//! [`Carry`].

use std::time::Duration;

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{Api, Resource, ResourceExt};

use super::decide::{self, Need, PlannedEvent};
use crate::{
    api::{
        HarnessBinding, PendingInterruptSummary, SandboxProfile,
        sandbox::{Sandbox, SandboxClaim},
    },
    domain::{
        ids::BindingId,
        state::{Durability, PendingInterrupt, StateScope},
    },
    operator::{Caches, Context, Error},
    store::ClearReport,
};

/// What earlier rounds of this reconcile did, for the next decision.
#[derive(Clone, Debug, Default)]
pub struct Carry {
    /// Events not published yet.
    pub events: Vec<PlannedEvent>,
    /// The generation whose fence the store refused as stale (the store is ahead).
    pub fence_ahead: Option<i64>,
    /// The generation whose older claims were released in this reconcile.
    pub released: Option<i64>,
    /// The claim this reconcile created (the watch has not brought it yet).
    pub created: Option<SandboxClaim>,
    /// What the clear of this reconcile removed.
    pub cleared: Option<ClearReport>,
}

/// The claim, Sandbox and pod a decision looks at.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub claim: Option<SandboxClaim>,
    pub sandbox: Option<Sandbox>,
    pub pod: Option<Pod>,
}

/// What a durable head read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadSeen {
    pub revision: u64,
    pub committed_at_ms: i64,
    pub durability: Durability,
    pub uncertain_runs: usize,
}

/// The durable head, as far as this reconcile read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadRead {
    /// Not read (yet).
    NotRead,
    /// Not read: the last projection is recent (`--state-projection-seconds`).
    NotDue,
    /// The store failed; the projection stays as it was (logged).
    Unavailable,
    /// Nothing committed in this epoch.
    Absent,
    Present(HeadSeen),
}

/// What the store says of the turn in flight, read together with the head.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnSeen {
    /// A run of the epoch's run ledger has started and not completed (the `busy` signal).
    pub running: bool,
    /// The epoch's pending interrupt, summarized for `status.pendingInterrupt`.
    pub interrupt: Option<PendingInterruptSummary>,
    /// Effects whose outcome is unknown or awaits a person, as `tool (key K, run R)`, in
    /// key order.
    pub unknown_effects: Vec<String>,
}

/// The store, as far as this reconcile read it.
#[derive(Clone, Debug)]
pub struct StoreSeen {
    /// Whether this process already raised the fence to the lease's `(epoch, generation)`.
    pub fence_raised: bool,
    /// The generation the store fences (0 without a record); `None`: not read.
    pub fenced_generation: Option<i64>,
    pub head: HeadRead,
    /// Read with the head when it was due; `None`: not read (the status keeps its mirror).
    pub turn: Option<TurnSeen>,
    /// When the store last saw any write to the binding; `None`: not read.
    pub last_activity: Option<Option<Time>>,
}

/// Everything one decision reads.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub id: BindingId,
    /// Whether the watch caches are there (they are while the controllers run); without
    /// them every object is read live.
    pub caches: bool,
    /// The binding's profile (`None`: it does not exist).
    pub profile: Option<SandboxProfile>,
    /// From the caches: the lease's claim, and the Sandbox and pod it follows (see
    /// [`decide::follows_lease`]). Without caches, the claim is read live.
    pub cached: Objects,
    /// The Sandbox the decision follows: the lease's, or the one the claim controls.
    pub sandbox_name: Option<String>,
    /// The lease's claim, Sandbox and pod read live ([`Need::LiveLeaseObjects`]).
    pub live_lease: Option<Objects>,
    /// The Sandbox read live ([`Need::LiveSandbox`]); `Some(None)`: it does not exist.
    pub live_sandbox: Option<Option<Sandbox>>,
    /// The worker pod read live ([`Need::LivePod`]).
    pub live_pod: Option<Option<Pod>>,
    pub store: StoreSeen,
    /// Live claims other bindings hold with this profile ([`Need::ProfileClaims`]).
    pub profile_claims: Option<usize>,
    /// How often a Ready binding's state projection is refreshed.
    pub projection_interval: Duration,
    pub carry: Carry,
}

/// The first observation of a round: caches, the profile, this process's fence memo.
pub async fn snapshot(
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
    carry: Carry,
) -> Result<Snapshot, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let caches = ctx.caches();
    let profile = read_profile(binding, ctx, caches.as_ref()).await?;
    let lease = binding.status.as_ref().and_then(|s| s.lease.as_ref());
    let claim_name = lease.and_then(|l| l.claim_name.clone());
    let claim = match (&claim_name, &caches) {
        (None, _) => None,
        (Some(name), _)
            if carry
                .created
                .as_ref()
                .is_some_and(|c| c.name_any() == *name) =>
        {
            carry.created.clone()
        }
        (Some(name), Some(c)) => Caches::get(&c.claims, &ns, name).map(|c| (*c).clone()),
        (Some(name), None) => {
            Api::<SandboxClaim>::namespaced(ctx.client.clone(), &ns)
                .get_opt(name)
                .await?
        }
    };
    let follows_lease = decide::follows_lease(binding.status.as_ref());
    let sandbox_name = if follows_lease {
        lease.and_then(|l| l.sandbox_name.clone())
    } else {
        claim
            .as_ref()
            .and_then(|c| sandbox_of_claim(c, caches.as_ref(), &ns))
    };
    let sandbox = cached(
        caches.as_ref().map(|c| &c.sandboxes),
        &ns,
        sandbox_name.as_deref(),
    );
    let pod_name = match (follows_lease, &sandbox, &sandbox_name) {
        (true, _, _) => lease.and_then(|l| l.worker_pod_name.clone()),
        (false, Some(sb), Some(name)) => Some(decide::pod_name_of(sb, name)),
        _ => None,
    };
    let pod = cached(caches.as_ref().map(|c| &c.pods), &ns, pod_name.as_deref());
    let fence = lease.map(|l| {
        let epoch = u64::try_from(binding.spec.epoch).unwrap_or(0);
        (epoch, u64::try_from(l.generation).unwrap_or(0))
    });
    Ok(Snapshot {
        id: id.clone(),
        caches: caches.is_some(),
        profile,
        cached: Objects {
            claim,
            sandbox,
            pod,
        },
        sandbox_name,
        live_lease: None,
        live_sandbox: None,
        live_pod: None,
        store: StoreSeen {
            fence_raised: fence.is_some_and(|f| ctx.fence_raised(id.as_str(), f)),
            fenced_generation: None,
            head: HeadRead::NotRead,
            turn: None,
            last_activity: None,
        },
        profile_claims: None,
        projection_interval: ctx.projection_interval(),
        carry,
    })
}

async fn read_profile(
    binding: &HarnessBinding,
    ctx: &Context,
    caches: Option<&Caches>,
) -> Result<Option<SandboxProfile>, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let name = &binding.spec.sandbox_profile_ref.name;
    if let Some(p) = caches.and_then(|c| Caches::get(&c.profiles, &ns, name)) {
        return Ok(Some((*p).clone()));
    }
    Ok(Api::<SandboxProfile>::namespaced(ctx.client.clone(), &ns)
        .get_opt(name)
        .await?)
}

fn cached<K>(
    cache: Option<&kube::runtime::reflector::Store<K>>,
    ns: &str,
    name: Option<&str>,
) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    Caches::get(cache?, ns, name?).map(|o| (*o).clone())
}

/// The Sandbox a claim controls: named in its status, or found by ownership in the cache.
fn sandbox_of_claim(claim: &SandboxClaim, caches: Option<&Caches>, ns: &str) -> Option<String> {
    let named = claim
        .status
        .as_ref()
        .and_then(|s| s.sandbox.as_ref())
        .map(|s| s.name.clone())
        .filter(|n| !n.is_empty());
    named.or_else(|| {
        let uid = claim.uid()?;
        caches?
            .sandboxes
            .find(|sb| {
                sb.namespace().as_deref() == Some(ns)
                    && decide::controlled_by_uid(sb.meta().owner_references.as_deref(), Some(&uid))
            })
            .map(|sb| sb.name_any())
    })
}

/// Reads what `need` names into `snap`.
pub async fn more(
    snap: &mut Snapshot,
    need: Need,
    binding: &HarnessBinding,
    ctx: &Context,
) -> Result<(), Error> {
    let ns = binding.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match need {
        Need::StoreGeneration => {
            let record = ctx.store.get_binding(&snap.id).await.map_err(store_err)?;
            snap.store.fenced_generation = Some(
                record
                    .map(|r| i64::try_from(r.lease_generation).unwrap_or(i64::MAX))
                    .unwrap_or(0),
            );
        }
        Need::LiveLeaseObjects => snap.live_lease = Some(live_lease(binding, ctx).await?),
        Need::LiveSandbox => {
            let name = snap.sandbox_name.clone().unwrap_or_default();
            let live = sandboxes.get_opt(&name).await?;
            // The pod the live Sandbox names, from the cache.
            let pod_name = live.as_ref().map(|sb| decide::pod_name_of(sb, &name));
            let caches = ctx.caches();
            snap.cached.pod = cached(caches.as_ref().map(|c| &c.pods), &ns, pod_name.as_deref());
            snap.live_sandbox = Some(live);
        }
        Need::LivePod => {
            let name = snap.sandbox_name.clone().unwrap_or_default();
            let sandbox = match &snap.live_sandbox {
                Some(live) => live.as_ref(),
                None => snap.cached.sandbox.as_ref(),
            };
            let pod_name = sandbox
                .map(|sb| decide::pod_name_of(sb, &name))
                .unwrap_or(name);
            snap.live_pod = Some(pods.get_opt(&pod_name).await?);
        }
        Need::Head { force } => {
            (snap.store.head, snap.store.turn) = read_head(binding, ctx, &snap.id, force).await;
        }
        Need::LastActivity => {
            let ms = ctx
                .store
                .last_activity_ms(&snap.id)
                .await
                .map_err(store_err)?;
            snap.store.last_activity = Some(
                ms.and_then(|ms| Timestamp::from_millisecond(ms).ok())
                    .map(Time),
            );
        }
        Need::ProfileClaims => {
            snap.profile_claims = Some(profile_claims(binding, ctx).await?);
        }
    }
    Ok(())
}

/// Live claims of the binding's profile held by other bindings: from the claim cache, or
/// listed by label without one.
async fn profile_claims(binding: &HarnessBinding, ctx: &Context) -> Result<usize, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let profile = super::truncate_label(&binding.spec.sandbox_profile_ref.name);
    let uid = binding.uid().unwrap_or_default();
    if let Some(caches) = ctx.caches() {
        let claims = caches.claims.state();
        return Ok(count_profile_claims(
            claims.iter().map(AsRef::as_ref),
            &ns,
            &profile,
            &uid,
        ));
    }
    let selector = format!("{}={profile}", super::PROFILE_LABEL);
    let list = Api::<SandboxClaim>::namespaced(ctx.client.clone(), &ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(count_profile_claims(list.items.iter(), &ns, &profile, &uid))
}

/// Claims in `ns` labelled with `profile`, not being deleted, of another binding than
/// `uid`.
pub fn count_profile_claims<'a>(
    claims: impl Iterator<Item = &'a SandboxClaim>,
    ns: &str,
    profile: &str,
    uid: &str,
) -> usize {
    claims
        .filter(|c| c.namespace().as_deref() == Some(ns))
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .filter(|c| {
            let labels = c.labels();
            labels.get(super::PROFILE_LABEL).map(String::as_str) == Some(profile)
                && labels.get(super::BINDING_UID_LABEL).map(String::as_str) != Some(uid)
        })
        .count()
}

/// The lease's claim, then its Sandbox (if the claim exists), then its pod (if the
/// Sandbox exists), read live.
async fn live_lease(binding: &HarnessBinding, ctx: &Context) -> Result<Objects, Error> {
    let ns = binding.namespace().unwrap_or_default();
    let lease = binding
        .status
        .as_ref()
        .and_then(|s| s.lease.clone())
        .unwrap_or_default();
    let name = |n: &Option<String>| n.clone().unwrap_or_default();
    let claim = Api::<SandboxClaim>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&name(&lease.claim_name))
        .await?;
    let sandbox = match &claim {
        Some(_) => {
            Api::<Sandbox>::namespaced(ctx.client.clone(), &ns)
                .get_opt(&name(&lease.sandbox_name))
                .await?
        }
        None => None,
    };
    let pod = match &sandbox {
        Some(_) => {
            Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .get_opt(&name(&lease.worker_pod_name))
                .await?
        }
        None => None,
    };
    Ok(Objects {
        claim,
        sandbox,
        pod,
    })
}

/// The durable head and the turn in flight (rate-limited per binding unless `force`).
/// A store failure is logged and leaves the projection as it was: it is a mirror, the
/// store the truth.
async fn read_head(
    binding: &HarnessBinding,
    ctx: &Context,
    id: &BindingId,
    force: bool,
) -> (HeadRead, Option<TurnSeen>) {
    if !force && !ctx.projection_due(&binding.uid().unwrap_or_default()) {
        return (HeadRead::NotDue, None);
    }
    let lease = binding.status.as_ref().and_then(|s| s.lease.as_ref());
    let scope = StateScope {
        binding_id: id.clone(),
        environment: ctx.keyring.environment().to_owned(),
        harness: binding.spec.harness.id.as_str().to_owned(),
        epoch: u64::try_from(binding.spec.epoch).unwrap_or(0),
        codec: crate::domain::state::ANY_CODEC.into(),
        lease_generation: lease
            .map(|l| u64::try_from(l.generation).unwrap_or(0))
            .unwrap_or(0),
    };
    let head = match ctx.store.load_head(&scope).await {
        Ok(None) => HeadRead::Absent,
        Ok(Some(head)) => HeadRead::Present(HeadSeen {
            revision: head.revision,
            committed_at_ms: head.committed_at_ms,
            durability: head.durability,
            uncertain_runs: head.uncertain_runs.len(),
        }),
        Err(e) => {
            tracing::warn!(binding_id = id.as_str(), "projecting state: {e}");
            return (HeadRead::Unavailable, None);
        }
    };
    (head, read_turn(ctx, id, &scope).await)
}

/// The run ledger's open runs and the pending interrupt of the scope's epoch.
async fn read_turn(ctx: &Context, id: &BindingId, scope: &StateScope) -> Option<TurnSeen> {
    let interrupt = match ctx.store.pending_interrupt(scope).await {
        Ok(i) => i.and_then(|i| interrupt_summary(&i)),
        Err(e) => {
            tracing::warn!(
                binding_id = id.as_str(),
                "projecting the pending interrupt: {e}"
            );
            return None;
        }
    };
    let state = match ctx.store.ledger_state(scope).await {
        Ok(state) => state,
        Err(e) => {
            tracing::warn!(binding_id = id.as_str(), "reading the run ledger: {e}");
            return None;
        }
    };
    let running = state
        .runs
        .values()
        .any(|r| r.status == crate::domain::ledger::RunStatus::Running);
    Some(TurnSeen {
        running,
        interrupt,
        unknown_effects: unknown_effects(&state),
    })
}

/// The effects a person must settle: outcome unknown, or reconciliation gave up.
pub fn unknown_effects(state: &crate::domain::ledger::LedgerState) -> Vec<String> {
    use crate::domain::ledger::EffectStatus;
    state
        .effects
        .iter()
        .filter(|(_, e)| {
            matches!(
                e.status,
                EffectStatus::Unknown | EffectStatus::AwaitingHuman
            )
        })
        .map(|(key, e)| format!("{} (key {key}, run {})", e.tool, e.run_id))
        .collect()
}

/// The status summary of a stored interrupt (`None` for a type the CRD does not list).
pub fn interrupt_summary(i: &PendingInterrupt) -> Option<PendingInterruptSummary> {
    Some(PendingInterruptSummary {
        interrupt_id: i.interrupt_id.clone(),
        kind: serde_json::from_value(serde_json::Value::String(i.kind.clone())).ok()?,
        run_id: i.run_id.clone(),
        revision: i64::try_from(i.revision).unwrap_or(i64::MAX),
        created_at: Timestamp::from_millisecond(i.created_at_ms).ok().map(Time),
    })
}

pub fn store_err(e: crate::store::StoreError) -> Error {
    Error::Store(e.to_string())
}
