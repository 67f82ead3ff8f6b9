//! Reconcile failures users can see (issue 14, "failures users can see").
//!
//! Every reconcile error falls in a [`Category`], which decides the retry and names the
//! reason users read: a Warning Event on the object, a kstatus condition in its status
//! (`Stalled=True` when only a change to the object can help, `Reconciling=True` while a
//! transient failure is retried), and one log line with the object's namespace and
//! name. An invalid spec is not retried until the object changes (its watch brings the
//! next generation); a transient failure is retried with a per-object exponential
//! backoff with jitter (1 s doubling to 5 min). The first successful reconcile after a
//! failure clears the condition.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    NamespaceResourceScope,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{
        controller::Action,
        events::{Event, EventType},
    },
};

use super::{Context, Error};
use crate::api::{
    HarnessBinding, MemoryPolicy, SandboxProfile,
    conditions::{self, Desired, FALSE, TRUE},
};

/// kstatus: the object cannot progress without a change to it (or to what it names).
pub const STALLED: &str = "Stalled";
/// kstatus: the controller is still working on the object (here: retrying a failure).
pub const RECONCILING: &str = "Reconciling";

/// What kind of failure a reconcile error is; decides the retry and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// The object's spec cannot be acted on as written (refused by us or by the API
    /// server as invalid): waits for the next generation.
    InvalidSpec,
    /// Something the object names does not exist (yet): retried with backoff.
    MissingReference,
    /// The API server refused us (RBAC): retried with backoff; fixing RBAC heals it.
    Forbidden,
    /// The Kubernetes API failed or timed out: retried with backoff.
    KubernetesUnavailable,
    /// The durable store failed: retried with backoff.
    StoreUnavailable,
    /// Someone else wrote first: retried soon.
    Conflict,
    /// Any other failure: retried with backoff.
    Internal,
}

impl Category {
    /// The condition and Event reason (CamelCase, stable).
    pub fn reason(self) -> &'static str {
        match self {
            Category::InvalidSpec => "InvalidSpec",
            Category::MissingReference => "MissingReference",
            Category::Forbidden => "Forbidden",
            Category::KubernetesUnavailable => "KubernetesUnavailable",
            Category::StoreUnavailable => "StoreUnavailable",
            Category::Conflict => "Conflict",
            Category::Internal => "InternalError",
        }
    }

    /// Whether `reason` on a `Stalled` or `Reconciling` condition was set by the error
    /// policy (a controller's own verdicts use other reasons and are left alone).
    pub fn is_failure_reason(reason: &str) -> bool {
        [
            Category::InvalidSpec,
            Category::MissingReference,
            Category::Forbidden,
            Category::KubernetesUnavailable,
            Category::StoreUnavailable,
            Category::Conflict,
            Category::Internal,
        ]
        .iter()
        .any(|c| c.reason() == reason)
    }

    /// Whether retrying without a change to the object is pointless.
    pub fn permanent(self) -> bool {
        matches!(self, Category::InvalidSpec)
    }
}

impl Error {
    /// The category of this error.
    pub fn category(&self) -> Category {
        match self {
            Error::Invalid(_) => Category::InvalidSpec,
            Error::Store(_) => Category::StoreUnavailable,
            Error::Json(_) | Error::Finalizer(_) | Error::Internal(_) => Category::Internal,
            Error::Kube(kube::Error::Api(s)) => match s.code {
                400 | 422 => Category::InvalidSpec,
                403 | 401 => Category::Forbidden,
                404 | 410 => Category::MissingReference,
                409 => Category::Conflict,
                _ => Category::KubernetesUnavailable,
            },
            Error::Kube(_) | Error::Timeout(_) => Category::KubernetesUnavailable,
        }
    }
}

/// Consecutive failures per object (kind/namespace/name), for the backoff.
#[derive(Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
        format!(
            "{}/{}/{}",
            K::kind(&()),
            obj.meta().namespace.as_deref().unwrap_or_default(),
            obj.meta().name.as_deref().unwrap_or_default()
        )
    }

    /// Counts one more failure of `obj`; returns the count.
    fn failed<K: Resource<DynamicType = ()>>(&self, obj: &K) -> u32 {
        let Ok(mut m) = self.counts.lock() else {
            return 1;
        };
        let n = m.entry(Self::key(obj)).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets the failures of `obj`; whether it had any.
    fn succeeded<K: Resource<DynamicType = ()>>(&self, obj: &K) -> bool {
        self.counts
            .lock()
            .is_ok_and(|mut m| m.remove(&Self::key(obj)).is_some())
    }
}

/// The delay before retry `n` (1-based) of `key`: 1 s doubling to 5 min, spread by
/// ±25 % derived from the key and the attempt (so objects failing together do not retry
/// together, and a test can know the bounds).
pub fn backoff(key: &str, n: u32) -> Duration {
    let base = Duration::from_secs(1)
        .saturating_mul(1u32 << n.saturating_sub(1).min(9))
        .min(Duration::from_secs(300));
    let mut h = DefaultHasher::new();
    (key, n).hash(&mut h);
    // 0.75 ..= 1.25
    let factor = 0.75 + (h.finish() % 501) as f64 / 1000.0;
    base.mul_f64(factor)
}

/// What to do after a failure: `None` waits for the object to change.
pub fn retry_after(category: Category, key: &str, n: u32) -> Option<Duration> {
    match category {
        _ if category.permanent() => None,
        Category::Conflict => Some(Duration::from_millis(200)),
        _ => Some(backoff(key, n)),
    }
}

/// Objects whose status carries conditions.
pub trait HasConditions {
    fn conditions(&self) -> &[Condition];
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

macro_rules! has_conditions {
    ($($t:ty),*) => {$(
        impl HasConditions for $t {
            fn conditions(&self) -> &[Condition] {
                self.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default()
            }
            fn conditions_mut(&mut self) -> &mut Vec<Condition> {
                &mut self.status.get_or_insert_with(Default::default).conditions
            }
        }
    )*};
}
has_conditions!(HarnessBinding, SandboxProfile, MemoryPolicy);

/// The controllers' error policy: log, count, tell the object (Event and condition),
/// and pick the retry by category.
pub fn error_policy<K>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + HasConditions
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let category = error.category();
    let n = ctx.failures.failed(&*obj);
    let key = Failures::key(&*obj);
    let retry = retry_after(category, &key, n);
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let kind = K::kind(&());
    match retry {
        Some(after) => tracing::warn!(
            kind = %kind, namespace = %namespace, name = %name,
            reason = category.reason(), attempt = n, retry_in_ms = after.as_millis() as u64,
            "reconcile failed: {error}"
        ),
        None => tracing::warn!(
            kind = %kind, namespace = %namespace, name = %name,
            reason = category.reason(), attempt = n,
            "reconcile failed, not retried until the object changes: {error}"
        ),
    }
    // A conflict is routine (someone else moved first): no Event, no condition.
    if category != Category::Conflict {
        let message = error.to_string();
        ctx.publish_later(
            &obj.object_ref(&()),
            Event {
                type_: EventType::Warning,
                reason: category.reason().into(),
                note: Some(truncate(&message, 1024)),
                action: "Reconcile".into(),
                secondary: None,
            },
        );
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let desired = if category.permanent() {
                (STALLED, category.reason(), message)
            } else {
                (
                    RECONCILING,
                    category.reason(),
                    format!("retrying: {message}"),
                )
            };
            if let Err(e) = write_failure(&ctx, &*obj, Some(desired)).await {
                tracing::debug!(namespace = %namespace, name = %name, "failure condition not written: {e}");
            }
        });
    }
    match retry {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }
}

/// After a successful reconcile: forgets the object's failures and, when its status
/// still shows one, clears it.
pub async fn succeeded<K>(obj: &K, ctx: &Context)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + HasConditions
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let had = ctx.failures.succeeded(obj);
    let shows = [STALLED, RECONCILING].iter().any(|t| {
        conditions::get(obj.conditions(), t)
            .is_some_and(|c| c.status == TRUE && Category::is_failure_reason(&c.reason))
    });
    if (had || shows)
        && let Err(e) = write_failure(ctx, obj, None).await
    {
        tracing::debug!(
            namespace = %obj.namespace().unwrap_or_default(),
            name = %obj.name_any(),
            "failure condition not cleared: {e}"
        );
    }
}

/// Sets `failure` (type, reason, message) on the object's conditions, the other kstatus
/// condition False; `None` sets both False (only where present). A fresh read and a
/// compare-and-set: a conflict gives up (the next reconcile's outcome writes again).
async fn write_failure<K>(
    ctx: &Context,
    obj: &K,
    failure: Option<(&'static str, &'static str, String)>,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + HasConditions
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let Some(mut fresh) = api.get_opt(&obj.name_any()).await? else {
        return Ok(());
    };
    let generation = fresh.meta().generation;
    let now = Time(Timestamp::now());
    let mut changed = false;
    for type_ in [STALLED, RECONCILING] {
        let desired = match &failure {
            Some((t, reason, message)) if *t == type_ => Desired {
                type_,
                status: TRUE,
                reason,
                message: truncate(message, 1024),
            },
            // Only what the error policy set is cleared: a controller's own verdict
            // (a refused profile's `Stalled`) stays.
            _ if !conditions::get(fresh.conditions(), type_)
                .is_some_and(|c| Category::is_failure_reason(&c.reason)) =>
            {
                continue;
            }
            _ => Desired {
                type_,
                status: FALSE,
                reason: "Succeeded",
                message: "the last reconcile succeeded".into(),
            },
        };
        let before = conditions::get(fresh.conditions(), type_).cloned();
        conditions::set(fresh.conditions_mut(), desired, generation, &now);
        let after = conditions::get(fresh.conditions(), type_).cloned();
        // The observed generation alone moving is not worth a write.
        changed |= before.map(|c| (c.status, c.reason, c.message))
            != after.map(|c| (c.status, c.reason, c.message));
    }
    if changed {
        super::replace_status(ctx, &fresh).await?;
    }
    Ok(())
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        })))
    }

    #[test]
    fn an_invalid_spec_waits_for_a_change_and_transient_failures_back_off() {
        let cases = [
            (
                Error::Invalid("spec.subjectRef".into()),
                "InvalidSpec",
                None,
            ),
            (api_error(422), "InvalidSpec", None),
            (api_error(403), "Forbidden", Some(())),
            (api_error(404), "MissingReference", Some(())),
            (api_error(503), "KubernetesUnavailable", Some(())),
            (Error::Store("down".into()), "StoreUnavailable", Some(())),
            (api_error(409), "Conflict", Some(())),
        ];
        for (error, reason, retried) in cases {
            let c = error.category();
            assert_eq!(c.reason(), reason, "{error}");
            assert_eq!(
                retry_after(c, "k", 1).map(|_| ()),
                retried,
                "{error}: retried?"
            );
        }
    }

    #[test]
    fn the_backoff_doubles_with_jitter_up_to_five_minutes() {
        for n in 1..=12u32 {
            let base = (1u64 << (n - 1).min(9)).min(300) as f64;
            for key in ["a", "b", "c"] {
                let d = backoff(key, n).as_secs_f64();
                assert!(
                    d >= base * 0.75 - 1e-9 && d <= base * 1.25 + 1e-9,
                    "attempt {n}: {d}s outside {base}s ±25%"
                );
            }
        }
        // Objects failing together do not all retry at the same moment.
        let spread: std::collections::BTreeSet<_> = (0..20)
            .map(|i| backoff(&format!("obj-{i}"), 3).as_millis())
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
    }

    #[test]
    fn the_failure_counts_reset_on_success() {
        let f = Failures::default();
        let mut p = k8s_openapi::api::core::v1::ConfigMap::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("team-a".into());
        assert_eq!(f.failed(&p), 1);
        assert_eq!(f.failed(&p), 2);
        assert!(f.succeeded(&p));
        assert!(!f.succeeded(&p));
        assert_eq!(f.failed(&p), 1);
    }
}
