//! The operator: HarnessBinding, SandboxProfile and MemoryPolicy controllers, leader
//! election, events and metrics. `harness-engine operator` runs them together with the
//! admission webhook and the data plane in one process (see `main.rs`).
//!
//! Only the leader reconciles; every replica serves the data plane. The controllers
//! keep no state that matters across restarts: everything they decide is written to
//! the objects' status (compare-and-set) or the store (fenced), so a new leader picks
//! up where the last one stopped.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex, RwLock, atomic::AtomicU64},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{ObjectReference, Pod},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        events::{Event, Recorder, Reporter},
        reflector::{self, ObjectRef, Store as Cache},
        watcher,
    },
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::{
    api::{
        HarnessBinding, MemoryPolicy, SandboxProfile,
        sandbox::{Sandbox, SandboxClaim},
    },
    domain::ids::Keyring,
    store::Store,
};

pub mod admission;
pub mod binding;
pub mod failure;
pub mod leader;
pub mod logging;
pub mod memory_policy;
pub mod profile;
pub mod retention;
pub mod webhook_certs;

/// The label Agent Sandbox sets on every pod it creates for a Sandbox (its value a hash
/// of the Sandbox name); the pod watch selects on its presence.
pub const SANDBOX_POD_LABEL: &str = "agents.x-k8s.io/sandbox-name-hash";

/// Field manager and event reporter name.
pub const FIELD_MANAGER: &str = "harness-engine";

/// Reconcile failures. Each is retried with backoff; none loses data, since every step
/// is idempotent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("store: {0}")]
    Store(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("internal: {0}")]
    Internal(String),
    /// A reconcile ran past its deadline (an API request that never answered).
    #[error("timed out: {0}")]
    Timeout(String),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: String,
    result: String,
}

/// Operator metrics, registered under `harness_engine_operator_*`.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_seconds: Family<ReconcileLabels, Histogram>,
    /// Worker replacements (lease generation raised past 1).
    pub replacements: Counter,
    /// Status compare-and-set conflicts (someone else moved first).
    pub status_conflicts: Counter,
    /// Our own overhead: the binding's Ready status written minus its claim first seen
    /// Ready by this process's watch, seconds.
    pub bind_overhead: Histogram,
    /// Latency of status compare-and-set writes, seconds.
    pub status_write_seconds: Histogram,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// Requests this process sent to the Kubernetes API.
    pub api_requests: Counter<u64, AtomicU64>,
    /// Events not published because the publish queue was full (events are best effort).
    pub events_dropped: Counter,
    /// Binding reconciles that ended waiting for Agent Sandbox, by what they waited for.
    pub binding_waits: Family<WaitLabels, Counter>,
    /// Bindings without a lease waiting for a claiming slot (see `admission`).
    pub bindings_waiting_to_start: Gauge,
    /// Webhook certificates the operator manages: seconds until they expire.
    pub webhook_certs: webhook_certs::CertMetrics,
    /// Retention sweeps the leader runs (`harness_engine_retention_*`).
    pub retention: retention::RetentionMetrics,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        OperatorMetrics {
            reconciles: Family::default(),
            reconcile_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
            }),
            replacements: Counter::default(),
            status_conflicts: Counter::default(),
            bind_overhead: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            status_write_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            leader: Gauge::default(),
            api_requests: Counter::default(),
            events_dropped: Counter::default(),
            binding_waits: Family::default(),
            bindings_waiting_to_start: Gauge::default(),
            webhook_certs: webhook_certs::CertMetrics::default(),
            retention: retention::RetentionMetrics::default(),
        }
    }
}

impl OperatorMetrics {
    /// Registers every metric in `registry` (the admin port's `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        self.retention.register(registry);
        let r = registry.sub_registry_with_prefix("operator");
        r.register(
            "reconciles",
            "Reconciles by kind and result",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Reconcile latency by kind and result",
            self.reconcile_seconds.clone(),
        );
        r.register(
            "replacements",
            "Worker replacements (lease generation raised after the first)",
            self.replacements.clone(),
        );
        r.register(
            "status_conflicts",
            "Status compare-and-set conflicts",
            self.status_conflicts.clone(),
        );
        r.register(
            "bind_overhead_seconds",
            "Binding Ready written minus its SandboxClaim first seen Ready by the claim watch",
            self.bind_overhead.clone(),
        );
        r.register(
            "status_write_seconds",
            "Latency of status compare-and-set writes",
            self.status_write_seconds.clone(),
        );
        r.register(
            "kubernetes_requests",
            "Requests this process sent to the Kubernetes API",
            self.api_requests.clone(),
        );
        r.register(
            "binding_waits",
            "Binding reconciles that ended waiting for Agent Sandbox, by reason",
            self.binding_waits.clone(),
        );
        r.register(
            "bindings_waiting_to_start",
            "Bindings without a lease queued for a claiming slot (at most half of --concurrency start at once)",
            self.bindings_waiting_to_start.clone(),
        );
        r.register(
            "events_dropped",
            "Events not published because the publish queue was full",
            self.events_dropped.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        r.register(
            "webhook_serving_cert_expiry_seconds",
            "Seconds until the webhook serving certificate the operator manages expires",
            self.webhook_certs.serving_expiry.clone(),
        );
        r.register(
            "webhook_ca_expiry_seconds",
            "Seconds until the CA signing the webhook certificate the operator manages expires",
            self.webhook_certs.ca_expiry.clone(),
        );
    }

    /// Counts a binding reconcile that ended waiting for `reason`.
    pub fn waited(&self, reason: &str) {
        self.binding_waits
            .get_or_create(&WaitLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn observe_reconcile<T>(&self, kind: &str, result: &Result<T, Error>, took: Duration) {
        let labels = ReconcileLabels {
            kind: kind.into(),
            result: if result.is_ok() { "ok" } else { "error" }.into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}

/// Reflector caches of what the binding controller reads: the same watches that
/// trigger its reconciles keep them current, so the happy path costs no GETs. A cached
/// object may lag the API server by a watch delay; the controller therefore only
/// *waits* on what the caches say, and confirms with a live read before it replaces a
/// worker on their word (see `binding::check_ready`).
#[derive(Clone)]
pub struct Caches {
    pub claims: Cache<SandboxClaim>,
    pub sandboxes: Cache<Sandbox>,
    pub pods: Cache<Pod>,
    pub profiles: Cache<SandboxProfile>,
    pub gate: CacheGate,
}

/// How long a reconcile waits for the caches' first list before it fails (and is
/// retried): far longer than a list takes, short enough to say so when a watch cannot
/// list at all (RBAC, a missing CRD).
const CACHE_WAIT: Duration = Duration::from_secs(60);

impl Caches {
    /// Waits until every cache has its initial list (right after a start or a leader
    /// change), so that an absent object means absent, not "not listed yet".
    ///
    /// This is our own gate, not the reflector's `Store::wait_until_ready`: that one is
    /// a oneshot which keeps only the waker of the task that polled it last, so when
    /// several reconciles wait at once only one is woken by the first list and the
    /// others sleep until a timeout or a requeue (issue 19: a minute after every
    /// restart). A `watch` channel wakes every waiter.
    pub async fn ready(&self) -> Result<(), Error> {
        self.gate.wait(CACHE_WAIT).await.map_err(|pending| {
            Error::Invalid(format!(
                "the watch caches {} did not finish their initial list within {}s",
                pending.join(", "),
                CACHE_WAIT.as_secs()
            ))
        })
    }

    pub fn get<K>(cache: &Cache<K>, ns: &str, name: &str) -> Option<Arc<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        cache.get(&ObjectRef::new(name).within(ns))
    }
}

/// Opens once every watch it names has delivered its first complete list (the
/// watcher's `InitDone`, seen after the reflector applied it, so the cache holds the
/// list). Later re-lists do not close it again: the caches keep their last list until
/// the new one replaces it.
#[derive(Clone)]
pub struct CacheGate {
    tx: Arc<tokio::sync::watch::Sender<Vec<&'static str>>>,
}

impl CacheGate {
    /// A closed gate waiting for the watches named `pending`.
    pub fn new(pending: &[&'static str]) -> Self {
        CacheGate {
            tx: Arc::new(tokio::sync::watch::Sender::new(pending.to_vec())),
        }
    }

    /// The watch `name` has listed everything once.
    pub fn listed(&self, name: &str) {
        self.tx.send_if_modified(|pending| {
            let before = pending.len();
            pending.retain(|p| *p != name);
            pending.len() != before
        });
    }

    pub fn is_open(&self) -> bool {
        self.tx.borrow().is_empty()
    }

    /// Waits (at most `timeout`) until the gate opens; on timeout, the watches still
    /// listing.
    pub async fn wait(&self, timeout: Duration) -> Result<(), Vec<&'static str>> {
        let mut rx = self.tx.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(Vec::is_empty)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(vec!["(all: the watches stopped)"]),
            Err(_) => Err(self.tx.borrow().clone()),
        }
    }

    /// A stream that yields once, when the gate opens (for `reconcile_all_on`).
    fn opened(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        futures::stream::once(async move { rx.wait_for(Vec::is_empty).await.is_ok() })
            .filter_map(|open| futures::future::ready(open.then_some(())))
    }

    /// For a watch stream after its reflector: opens this watch's part of the gate on
    /// its first `InitDone`.
    fn on_init_done<K>(
        &self,
        name: &'static str,
    ) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
        let gate = self.clone();
        move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                gate.listed(name);
            }
        }
    }
}

/// The binding whose lease holds `claim`: its controller owner of kind HarnessBinding.
fn binding_of_claim(claim: &SandboxClaim) -> Option<ObjectRef<HarnessBinding>> {
    let ns = claim.namespace()?;
    claim
        .owner_references()
        .iter()
        .find(|r| r.kind == "HarnessBinding" && r.controller == Some(true))
        .map(|r| ObjectRef::new(&r.name).within(&ns))
}

/// Sandbox -> its controlling claim (from the cache) -> that claim's binding.
fn binding_of_sandbox(
    claims: &Cache<SandboxClaim>,
    sandbox: &Sandbox,
) -> Option<ObjectRef<HarnessBinding>> {
    let ns = sandbox.namespace()?;
    let owner = sandbox
        .owner_references()
        .iter()
        .find(|r| r.kind == "SandboxClaim" && r.controller == Some(true))?;
    let claim = Caches::get(claims, &ns, &owner.name)?;
    (claim.uid().as_deref() == Some(owner.uid.as_str()))
        .then(|| binding_of_claim(&claim))
        .flatten()
}

/// Pod -> its controlling Sandbox (from the cache) -> claim -> binding.
fn binding_of_pod(
    sandboxes: &Cache<Sandbox>,
    claims: &Cache<SandboxClaim>,
    pod: &Pod,
) -> Option<ObjectRef<HarnessBinding>> {
    let ns = pod.namespace()?;
    let owner = pod
        .owner_references()
        .iter()
        .find(|r| r.kind == "Sandbox" && r.controller == Some(true))?;
    let sandbox = Caches::get(sandboxes, &ns, &owner.name)?;
    binding_of_sandbox(claims, &sandbox)
}

/// The bindings whose lease names `sandbox` or `pod` in namespace `ns`: the second way
/// from a Sandbox or pod event to its binding, through the bindings' own cache. The
/// ownership chain finds nothing while the Sandbox and claim caches lag (a restart, a
/// pod recreated before its Sandbox event arrives); the lease still names what it
/// verified.
fn bindings_naming(
    bindings: &Cache<HarnessBinding>,
    ns: &str,
    sandbox: Option<&str>,
    pod: Option<&str>,
) -> Vec<ObjectRef<HarnessBinding>> {
    if sandbox.is_none() && pod.is_none() {
        return Vec::new();
    }
    // One pass under the cache's read lock, cloning only the matches.
    bindings
        .state_filter(|b| {
            b.metadata.namespace.as_deref() == Some(ns)
                && b.status
                    .as_ref()
                    .and_then(|s| s.lease.as_ref())
                    .is_some_and(|l| {
                        (sandbox.is_some() && l.sandbox_name.as_deref() == sandbox)
                            || (pod.is_some() && l.worker_pod_name.as_deref() == pod)
                    })
        })
        .into_iter()
        .map(|b| ObjectRef::from_obj(&*b))
        .collect()
}

/// Every binding a pod event bears on: by ownership, and by the leases naming it.
fn bindings_of_pod(
    bindings: &Cache<HarnessBinding>,
    sandboxes: &Cache<Sandbox>,
    claims: &Cache<SandboxClaim>,
    pod: &Pod,
) -> Vec<ObjectRef<HarnessBinding>> {
    let Some(ns) = pod.namespace() else {
        return Vec::new();
    };
    let sandbox = pod
        .owner_references()
        .iter()
        .find(|r| r.kind == "Sandbox" && r.controller == Some(true))
        .map(|r| r.name.clone());
    // Pods no Sandbox controls are none of our business.
    let Some(sandbox) = sandbox else {
        return Vec::new();
    };
    let mut found = bindings_naming(bindings, &ns, Some(&sandbox), Some(&pod.name_any()));
    if let Some(b) = binding_of_pod(sandboxes, claims, pod)
        && !found.contains(&b)
    {
        found.push(b);
    }
    found
}

/// Every binding a Sandbox event bears on: by ownership, and by the leases naming it.
fn bindings_of_sandbox(
    bindings: &Cache<HarnessBinding>,
    claims: &Cache<SandboxClaim>,
    sandbox: &Sandbox,
) -> Vec<ObjectRef<HarnessBinding>> {
    let Some(ns) = sandbox.namespace() else {
        return Vec::new();
    };
    let mut found = bindings_naming(bindings, &ns, Some(&sandbox.name_any()), None);
    if let Some(b) = binding_of_sandbox(claims, sandbox)
        && !found.contains(&b)
    {
        found.push(b);
    }
    found
}

/// Events are published off the reconcile path, by a few workers; all events of one
/// object go to the same worker, so `kubectl describe` shows them in order.
const EVENT_WORKERS: usize = 4;
const EVENT_QUEUE: usize = 4096;

type EventJob = (ObjectReference, Event);

/// What every reconcile reads.
pub struct Context {
    pub client: Client,
    pub store: Arc<dyn Store>,
    pub keyring: Keyring,
    pub metrics: OperatorMetrics,
    recorder: Recorder,
    /// Set while the controllers run (they own the watches that fill it).
    caches: RwLock<Option<Caches>>,
    events: Vec<mpsc::Sender<EventJob>>,
    event_workers: Mutex<Option<Vec<mpsc::Receiver<EventJob>>>>,
    /// The queue of bindings that hold no lease yet (set while the controllers run): a
    /// burst of new bindings may take only part of the controller's slots, so a claim
    /// turning Ready is never queued behind all of them.
    admission: RwLock<Option<Arc<admission::Admission>>>,
    /// Binding UID -> when the claim watch first showed its current claim Ready.
    claims_ready: Mutex<HashMap<String, Instant>>,
    /// Binding UID -> when its state was last projected.
    projections: Mutex<HashMap<String, Instant>>,
    /// Store binding ids this process has ensured, with the fence it last raised: both
    /// calls are idempotent, so repeating them only costs a durable write; a new leader
    /// starts empty and repeats them once.
    fences: Mutex<HashMap<String, Option<(u64, u64)>>>,
    projection_interval: Duration,
    /// Reconcile trace anchors: one per binding until it converges.
    pub anchors: crate::telemetry::spans::ReconcileAnchors,
    /// Consecutive reconcile failures per object (the backoff, see `failure`).
    failures: failure::Failures,
    /// The deployment memory configuration the data plane uses (MemoryPolicy checks).
    pub memory: crate::domain::memory::policy::SharedMemoryPolicies,
    /// Whether this replica may act now (leader election's renew deadline).
    leadership: leader::Leadership,
}

impl Context {
    pub fn new(
        client: Client,
        store: Arc<dyn Store>,
        keyring: Keyring,
        metrics: OperatorMetrics,
        identity: &str,
        projection_interval: Duration,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity.to_owned()),
            },
        );
        let (events, receivers): (Vec<_>, Vec<_>) = (0..EVENT_WORKERS)
            .map(|_| mpsc::channel(EVENT_QUEUE / EVENT_WORKERS))
            .unzip();
        Context {
            client,
            store,
            keyring,
            metrics,
            recorder,
            caches: RwLock::default(),
            events,
            event_workers: Mutex::new(Some(receivers)),
            admission: RwLock::default(),
            claims_ready: Mutex::default(),
            projections: Mutex::default(),
            fences: Mutex::default(),
            projection_interval,
            anchors: crate::telemetry::spans::ReconcileAnchors::new(4096, Duration::from_secs(600)),
            failures: failure::Failures::default(),
            memory: Default::default(),
            leadership: leader::Leadership::unconditional(),
        }
    }

    /// Acts only while `leadership` holds (the elected replica's renew deadline).
    pub fn with_leadership(mut self, leadership: leader::Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    /// False once this replica may no longer act as the leader: a reconcile then does
    /// nothing (no API or store write) and the process is about to exit.
    pub fn leading(&self) -> bool {
        self.leadership.is_current()
    }

    /// What a reconcile returns instead of acting once this replica is past its renew
    /// deadline (docs/operator.md "Leader election"): a short requeue, no write, not even
    /// a condition. `None` while leading.
    pub fn not_leading(&self) -> Option<Action> {
        (!self.leading()).then(|| Action::requeue(Duration::from_secs(1)))
    }

    /// Shares the data plane's memory configuration (reloads reach the controllers).
    pub fn with_memory(
        mut self,
        memory: crate::domain::memory::policy::SharedMemoryPolicies,
    ) -> Self {
        self.memory = memory;
        self
    }

    /// Notes when a claim is first seen Ready (for the bind-overhead metric).
    fn note_claim(&self, claim: &SandboxClaim) {
        let ready = claim
            .status
            .as_ref()
            .is_some_and(|s| crate::api::sandbox::is_ready(&s.conditions));
        let Some(uid) = claim.labels().get(binding::BINDING_UID_LABEL) else {
            return;
        };
        if let Ok(mut m) = self.claims_ready.lock() {
            if ready {
                m.entry(uid.clone()).or_insert_with(Instant::now);
            } else {
                m.remove(uid);
            }
        }
    }

    /// When the claim of binding `uid` was first seen Ready, forgetting it.
    pub(crate) fn claim_seen_ready(&self, uid: &str) -> Option<Instant> {
        self.claims_ready.lock().ok()?.remove(uid)
    }

    /// The admission queue of bindings starting their first lease; `None` outside the
    /// controllers (tests): no limit.
    pub(crate) fn admission(&self) -> Option<Arc<admission::Admission>> {
        self.admission.read().ok().and_then(|a| a.clone())
    }

    /// The watch caches, while the controllers run.
    pub fn caches(&self) -> Option<Caches> {
        self.caches.read().ok().and_then(|c| c.clone())
    }

    fn set_caches(&self, caches: Option<Caches>) {
        if let Ok(mut c) = self.caches.write() {
            *c = caches;
        }
    }

    /// Starts the event publishers (once per process; they outlive leadership changes).
    fn start_event_workers(self: &Arc<Self>) {
        let Some(receivers) = self.event_workers.lock().ok().and_then(|mut r| r.take()) else {
            return;
        };
        for mut rx in receivers {
            let ctx = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some((reference, event)) = rx.recv().await {
                    let Some(ctx) = ctx.upgrade() else { return };
                    ctx.publish_now(&reference, event).await;
                }
            });
        }
    }

    /// Queues an event for publishing; never blocks a reconcile. A full queue drops
    /// the event (counted): events are best effort, status is the record.
    pub fn publish_later(&self, reference: &ObjectReference, event: Event) {
        let mut h = DefaultHasher::new();
        reference.uid.hash(&mut h);
        reference.name.hash(&mut h);
        let worker = usize::try_from(h.finish() % EVENT_WORKERS as u64).unwrap_or(0);
        if self.events[worker]
            .try_send((reference.clone(), event))
            .is_err()
        {
            self.metrics.events_dropped.inc();
        }
    }

    /// Publishes an event now; a failure is logged, never fatal (events are best effort).
    pub async fn publish(&self, reference: &ObjectReference, event: Event) {
        if self.event_workers.lock().is_ok_and(|w| w.is_none()) {
            self.publish_later(reference, event);
        } else {
            // No workers yet (a caller outside the controllers): publish inline.
            self.publish_now(reference, event).await;
        }
    }

    async fn publish_now(&self, reference: &ObjectReference, event: Event) {
        if let Err(e) = self.recorder.publish(&event, reference).await {
            tracing::warn!(
                namespace = reference.namespace.as_deref().unwrap_or_default(),
                name = reference.name.as_deref().unwrap_or_default(),
                reason = %event.reason,
                "event not published: {e}"
            );
        }
    }

    /// Whether the state projection of `uid` is due (and marks it done).
    fn projection_due(&self, uid: &str) -> bool {
        let Ok(mut map) = self.projections.lock() else {
            return true;
        };
        let now = Instant::now();
        match map.get(uid) {
            Some(at) if now.duration_since(*at) < self.projection_interval => false,
            _ => {
                map.insert(uid.to_owned(), now);
                true
            }
        }
    }

    fn ensured(&self, id: &str) -> bool {
        self.fences.lock().is_ok_and(|m| m.contains_key(id))
    }

    fn mark_ensured(&self, id: &str) {
        if let Ok(mut m) = self.fences.lock() {
            m.entry(id.to_owned()).or_insert(None);
        }
    }

    fn fence_raised(&self, id: &str, fence: (u64, u64)) -> bool {
        self.fences
            .lock()
            .is_ok_and(|m| m.get(id).copied().flatten() == Some(fence))
    }

    fn mark_fence(&self, id: &str, fence: (u64, u64)) {
        if let Ok(mut m) = self.fences.lock() {
            m.insert(id.to_owned(), Some(fence));
        }
    }

    fn forget_binding(&self, id: &str) {
        if let Ok(mut m) = self.fences.lock() {
            m.remove(id);
        }
    }

    /// How often a Ready binding's state projection is refreshed.
    pub fn projection_interval(&self) -> Duration {
        self.projection_interval
    }

    fn forget(&self, uid: &str) {
        if let Ok(mut map) = self.projections.lock() {
            map.remove(uid);
        }
        if let Ok(mut map) = self.claims_ready.lock() {
            map.remove(uid);
        }
    }
}

/// Where the operator looks and how it elects a leader.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Watch one namespace; `None` watches all.
    pub namespace: Option<String>,
    pub leader: leader::LeaderConfig,
    /// Reconciles running at once per controller.
    pub concurrency: u16,
    /// How long start-up waits for our CRDs to be established.
    pub crd_wait: Duration,
}

/// CRDs we own, which must be established before we start.
pub const OUR_CRDS: [&str; 3] = [
    "harnessbindings.harness-engine.dev",
    "sandboxprofiles.harness-engine.dev",
    "memorypolicies.harness-engine.dev",
];

/// Agent Sandbox CRDs we use; without them nothing can be claimed.
pub const AGENT_SANDBOX_CRDS: [&str; 4] = [
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
];

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Start-up checks: the Agent Sandbox CRDs exist (fail fast with a hint) and ours are
/// established (wait up to `wait`).
pub async fn check_crds(client: &Client, wait: Duration) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    for name in AGENT_SANDBOX_CRDS {
        if crds.get_opt(name).await?.is_none() {
            missing.push(name);
        }
    }
    if !missing.is_empty() {
        anyhow::bail!(
            "the Agent Sandbox CRDs {} are not installed. Install Agent Sandbox (v1beta1 API, \
             with its extensions: SandboxClaim, SandboxWarmPool, SandboxTemplate) and its controller \
             first, then start the operator again",
            missing.join(", ")
        );
    }
    let deadline = Instant::now() + wait;
    loop {
        let mut pending = Vec::new();
        for name in OUR_CRDS {
            match crds.get_opt(name).await? {
                Some(crd) if established(&crd) => {}
                Some(_) => pending.push(format!("{name} (not established yet)")),
                None => pending.push(format!("{name} (not installed)")),
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "CRDs not ready after {:?}: {}. Install them with `kubectl apply -k config/crd` \
                 (or `kubectl apply -f crds/`)",
                wait,
                pending.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs `reconcile`; after a success, clears what an earlier failure left on the object
/// (see `failure`).
async fn observed<K, Fut>(obj: Arc<K>, ctx: Arc<Context>, reconcile: Fut) -> Result<Action, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + failure::HasConditions
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    Fut: std::future::Future<Output = Result<Action, Error>>,
{
    let span = tracing::info_span!(
        "reconcile",
        kind = %K::kind(&()),
        namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
        name = obj.meta().name.as_deref().unwrap_or_default(),
    );
    async move {
        let result = reconcile.await;
        // A failure is logged by the error policy, with its category and retry.
        if let Ok(action) = &result {
            tracing::debug!(?action, "reconciled");
            failure::succeeded(&*obj, &ctx).await;
        }
        result
    }
    .instrument(span)
    .await
}

/// Writes `object` (carrying its new status) through the status subresource: a
/// compare-and-set on the `resourceVersion` it was read at. `Ok(None)` is a conflict
/// (counted): someone else moved first, and the caller starts over.
pub(crate) async fn replace_status<K>(ctx: &Context, object: &K) -> Result<Option<K>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
    let mut object = object.clone();
    object.meta_mut().managed_fields = None;
    let params = kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let started = Instant::now();
    let written = api
        .replace_status(&object.name_any(), &params, &object)
        .await;
    ctx.metrics
        .status_write_seconds
        .observe(started.elapsed().as_secs_f64());
    match written {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            ctx.metrics.status_conflicts.inc();
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

impl Context {
    /// The event of a validation verdict (profiles, memory policies): Normal when Ready.
    pub(crate) async fn publish_verdict(
        &self,
        reference: &ObjectReference,
        ok: bool,
        reason: &str,
        message: String,
    ) {
        let type_ = if ok {
            kube::runtime::events::EventType::Normal
        } else {
            kube::runtime::events::EventType::Warning
        };
        self.publish(
            reference,
            Event {
                type_,
                reason: reason.into(),
                note: Some(message),
                action: "Validate".into(),
                secondary: None,
            },
        )
        .await;
    }
}

/// What a binding reconcile reacts to on the binding itself: everything but status.
fn binding_trigger(b: &HarnessBinding) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let m = &b.metadata;
    m.generation.hash(&mut h);
    m.labels.hash(&mut h);
    m.annotations.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    // A status nobody wrote yet (or one wiped by a restore) needs a reconcile too.
    b.status.is_none().hash(&mut h);
    Some(h.finish())
}

/// Runs the three controllers until `shutdown` resolves. Call only while leading.
pub async fn run_controllers<F>(ctx: Arc<Context>, config: &OperatorConfig, shutdown: F)
where
    F: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    // One shutdown signal, fanned out to the three controllers.
    let shared = futures::FutureExt::shared(shutdown);
    let shutdown = move || shared.clone();
    let client = ctx.client.clone();
    let ns = config.namespace.as_deref();
    let cc = controller::Config::default().concurrency(config.concurrency);

    ctx.start_event_workers();
    // Half the slots at most for bindings starting their first lease; the others wait
    // in a queue that wakes them (see `admission`).
    let (queue, woken) = admission::Admission::new(usize::from(config.concurrency / 2));
    if let Ok(mut a) = ctx.admission.write() {
        *a = Some(queue);
    }

    let bindings = binding_controller(&ctx, ns, cc.clone())
        .reconcile_on(tokio_stream_of(woken))
        .graceful_shutdown_on(shutdown())
        .run(
            |b, ctx| observed(b.clone(), ctx.clone(), binding::reconcile(b, ctx)),
            failure::error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let profiles = Controller::new(
        api::<SandboxProfile>(&client, ns),
        watcher::Config::default(),
    )
    .with_config(cc.clone())
    .graceful_shutdown_on(shutdown())
    .run(
        |p, ctx| observed(p.clone(), ctx.clone(), profile::reconcile(p, ctx)),
        failure::error_policy,
        ctx.clone(),
    )
    .for_each(|_| futures::future::ready(()));

    let policies = Controller::new(api::<MemoryPolicy>(&client, ns), watcher::Config::default())
        .with_config(cc)
        .graceful_shutdown_on(shutdown())
        .run(
            |p, ctx| observed(p.clone(), ctx.clone(), memory_policy::reconcile(p, ctx)),
            failure::error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    tokio::join!(bindings, profiles, policies);
    ctx.set_caches(None);
    if let Ok(mut a) = ctx.admission.write() {
        *a = None;
    }
}

/// The receiving end of a channel as a stream.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Reconnect delays of the binding controller's watches: 250 ms doubling to 5 s with
/// ±25 % jitter, from the start again after a minute without errors. The library's
/// default grows to 30 s, which after an API-server restart left bindings waiting up to
/// that long for their watches (docs/reliability.md, control-plane chaos); five
/// watches retrying every 5 s are still gentle on a struggling API server.
struct WatchBackoff {
    attempt: u32,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> kube::runtime::utils::ResetTimerBackoff<WatchBackoff> {
        kube::runtime::utils::ResetTimerBackoff::new(
            WatchBackoff { attempt: 0 },
            Duration::from_secs(60),
        )
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = Self::FIRST
            .saturating_mul(1u32 << self.attempt.min(10))
            .min(Self::MAX);
        self.attempt = self.attempt.saturating_add(1);
        Some(base.mul_f64(rand::random_range(0.75..=1.25)))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A watch that fills a cache of `K`, each object as `slim` leaves it (at least its
/// managed fields stripped), and opens its part of `gate` on its first complete list;
/// the stream yields every object it touched.
fn cached_watch<K>(
    client: &Client,
    ns: Option<&str>,
    config: watcher::Config,
    gate: &CacheGate,
    kind: &'static str,
    slim: fn(&mut K),
) -> (
    Cache<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (cache, writer) = reflector::store::<K>();
    let events = watcher(api::<K>(client, ns), config)
        .backoff(WatchBackoff::new())
        .modify(slim)
        .reflect(writer)
        .inspect(gate.on_init_done(kind))
        .touched_objects();
    (cache, events)
}

/// The HarnessBinding controller and the watches it reads (not yet running).
///
/// Our own status writes must not re-trigger reconciles (each would cost reads and
/// nothing else): a binding is reconciled when what a user or the API server changes
/// moves (generation, labels, annotations, finalizers, deletion), when its children
/// move, or when it asked to be requeued. Reconciles wait for the gate (see
/// `Caches::ready`); it opens when all five watches have listed once.
fn binding_controller(
    ctx: &Arc<Context>,
    ns: Option<&str>,
    cc: controller::Config,
) -> Controller<HarnessBinding> {
    let client = &ctx.client;
    let gate = CacheGate::new(&[
        "harnessbindings",
        "sandboxclaims",
        "sandboxes",
        "pods",
        "sandboxprofiles",
    ]);
    let (reader, writer) = reflector::store();
    let trigger = watcher(
        api::<HarnessBinding>(client, ns),
        watcher::Config::default(),
    )
    .backoff(WatchBackoff::new())
    .modify(strip_managed_fields)
    .reflect(writer)
    .inspect(gate.on_init_done("harnessbindings"))
    // A binding deleted while it waits to start (never admitted, so no finalizer and no
    // reconcile of its deletion) leaves the start queue here.
    .inspect({
        let ctx = Arc::downgrade(ctx);
        move |event| {
            if let (Ok(watcher::Event::Delete(b)), Some(ctx)) = (event, ctx.upgrade())
                && let Some(queue) = ctx.admission()
            {
                queue.leave(&ObjectRef::from_obj(b));
            }
        }
    })
    .applied_objects()
    .predicate_filter(
        binding_trigger,
        kube::runtime::utils::PredicateConfig::default(),
    );

    // One watch per kind the binding controller reads: it fills the cache and
    // triggers the bindings it concerns. Sandboxes and pods carry no label of ours, so
    // they map to their binding through the ownership chain in the caches
    // (pod -> Sandbox -> SandboxClaim -> HarnessBinding); whichever of the three moves
    // last finds the chain complete.
    let claims_config = watcher::Config::default().labels(binding::BINDING_UID_LABEL);
    let (claims, claim_events) = cached_watch(
        client,
        ns,
        claims_config,
        &gate,
        "sandboxclaims",
        strip_managed_fields,
    );
    let claim_events = claim_events.map({
        let ctx = ctx.clone();
        move |claim| {
            if let Ok(c) = &claim {
                ctx.note_claim(c);
            }
            claim
        }
    });
    let (sandboxes, sandbox_events) = cached_watch::<Sandbox>(
        client,
        ns,
        watcher::Config::default(),
        &gate,
        "sandboxes",
        strip_managed_fields,
    );
    // Only pods Agent Sandbox made (it labels each with its Sandbox's name hash): the
    // cache holds none of the cluster's other pods.
    let pods_config = watcher::Config::default().labels(SANDBOX_POD_LABEL);
    let (pods, pod_events) = cached_watch(client, ns, pods_config, &gate, "pods", slim_pod);
    let (profiles, profile_events) = cached_watch::<SandboxProfile>(
        client,
        ns,
        watcher::Config::default(),
        &gate,
        "sandboxprofiles",
        strip_managed_fields,
    );
    ctx.set_caches(Some(Caches {
        claims: claims.clone(),
        sandboxes: sandboxes.clone(),
        pods,
        profiles,
        gate: gate.clone(),
    }));

    let bindings = Controller::for_stream(trigger, reader).with_config(cc);
    let (by_profile, by_sandbox, by_pod) = (bindings.store(), bindings.store(), bindings.store());
    let claims_for_sandboxes = claims.clone();
    bindings
        .owns_stream(claim_events)
        .watches_stream(sandbox_events, move |sb: Sandbox| {
            bindings_of_sandbox(&by_sandbox, &claims_for_sandboxes, &sb)
        })
        .watches_stream(pod_events, move |pod: Pod| {
            bindings_of_pod(&by_pod, &sandboxes, &claims, &pod)
        })
        // Events that arrived while the caches were still filling mapped to nothing
        // (the chain pod -> Sandbox -> claim -> binding was not listed yet): once every
        // cache holds its list, every binding is looked at once more.
        .reconcile_all_on(gate.opened())
        .watches_stream(profile_events, move |profile: SandboxProfile| {
            let pns = profile.namespace();
            let name = profile.name_any();
            by_profile
                .state_filter(|b| {
                    b.metadata.namespace == pns && b.spec.sandbox_profile_ref.name == name
                })
                .into_iter()
                .map(|b| ObjectRef::from_obj(&*b))
        })
}

/// Caches keep what the controllers read; the field-manager bookkeeping is not that.
fn strip_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// What the binding controller reads of a worker pod: its metadata (name, uid, owner,
/// labels, the protocol annotation, deletion) and its containers' names and image ids.
/// The spec (containers, volumes, env) and the rest of the status are most of a pod's
/// size, and the cache holds one pod per binding. A decision that needs more reads the
/// pod live.
fn slim_pod(pod: &mut Pod) {
    strip_managed_fields(pod);
    pod.spec = None;
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            container_statuses: status.container_statuses.map(|cs| {
                cs.into_iter()
                    .map(|c| k8s_openapi::api::core::v1::ContainerStatus {
                        name: c.name,
                        image_id: c.image_id,
                        image: c.image,
                        ready: c.ready,
                        ..Default::default()
                    })
                    .collect()
            }),
            phase: status.phase,
            ..Default::default()
        });
    }
}

/// A Kubernetes client that counts the requests it sends (for metrics and the
/// benchmark's "API requests per binding").
pub async fn counting_client(counter: Counter<u64, AtomicU64>) -> anyhow::Result<Client> {
    let config = kube::Config::infer().await?;
    let layer = tower::layer::layer_fn(move |inner| CountRequests {
        inner,
        counter: counter.clone(),
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build())
}

#[derive(Clone)]
struct CountRequests<S> {
    inner: S,
    counter: Counter<u64, AtomicU64>,
}

impl<S, B> tower::Service<axum::http::Request<B>> for CountRequests<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        self.counter.inc();
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_reconnect_within_five_seconds_and_start_over_after_reset() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff { attempt: 0 };
        let delays: Vec<Duration> = b.by_ref().take(12).collect();
        let first = delays.first().copied().unwrap_or_default();
        assert!(first >= Duration::from_millis(187) && first <= Duration::from_millis(313));
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(6250)),
            "{delays:?}"
        );
        assert!(
            delays
                .last()
                .is_some_and(|d| *d >= Duration::from_millis(3750))
        );
        b.reset();
        assert!(b.next().is_some_and(|d| d <= Duration::from_millis(313)));
    }

    /// Every waiter is woken when the last watch lists, however many wait at once
    /// (the reflector's own readiness signal woke only the last one to poll it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cache_gate_wakes_every_waiter() {
        let gate = CacheGate::new(&["a", "b"]);
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.wait(Duration::from_secs(30)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!gate.is_open());
        gate.listed("a");
        gate.listed("a");
        assert!(!gate.is_open(), "one watch of two listed");
        gate.listed("b");
        for w in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(
                matches!(woke, Ok(Ok(Ok(())))),
                "a waiter was not woken: {woke:?}"
            );
        }
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn a_gate_that_never_opens_names_the_watches_still_listing() {
        let gate = CacheGate::new(&["pods", "sandboxes"]);
        gate.listed("pods");
        assert_eq!(
            gate.wait(Duration::from_millis(20)).await,
            Err(vec!["sandboxes"])
        );
    }

    /// The cause of issue 19, kept as a measurement: the reflector's readiness signal,
    /// awaited by several tasks at once, wakes fewer of them than wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "documents kube-runtime's behaviour; run with --ignored"]
    async fn the_reflector_readiness_signal_wakes_only_some_waiters() {
        let (store, mut writer) = reflector::store::<Pod>();
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { store.wait_until_ready().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut woken = 0;
        for w in waiters {
            if tokio::time::timeout(Duration::from_millis(500), w)
                .await
                .is_ok()
            {
                woken += 1;
            }
        }
        println!("woken: {woken} of 16");
        assert!(woken < 16);
    }
}
