//! Kubernetes authentication and authorization (DESIGN §6, "Authentication, in
//! Kubernetes mode").
//!
//! - Identity: a TokenReview of the bearer token with audience `harness-engine`. Only
//!   ServiceAccount tokens are accepted. Results are cached briefly, keyed by the token's
//!   SHA-256 (never the token).
//! - Workers: a token bound to a pod (`authentication.kubernetes.io/pod-name` and
//!   `pod-uid` extras) whose pod is controlled by an Agent Sandbox `Sandbox` (controller
//!   owner reference; the Sandbox names the pod as its own) is a worker. Its scope is the
//!   HarnessBinding whose `status.lease.sandboxName`/`sandboxUid` hold that Sandbox: the
//!   binding id from the binding's `harness-engine.dev/binding-id` label, the epoch from
//!   `spec.epoch`, the lease generation from `status.lease.generation`. A Sandbox that a
//!   binding's claim still owns but whose lease moved on is a replaced worker:
//!   `stale_lease`.
//! - Service callers (every other ServiceAccount): SubjectAccessReview on
//!   `harnessbindings.harness-engine.dev` in their own namespace; acting for an end-user
//!   subject needs `impersonate` on `users` with that name, as the API server's own
//!   impersonation does.
//!
//! The server's ServiceAccount needs: `create` tokenreviews and subjectaccessreviews;
//! `get` pods, `sandboxes.agents.x-k8s.io`, `sandboxclaims.extensions.agents.x-k8s.io`;
//! `get`/`list` harnessbindings. What a bind does to HarnessBinding objects (create,
//! resume) is not authentication: [`crate::server::binding_objects`].

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        authentication::v1::{TokenReview, TokenReviewSpec},
        authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams},
};
use sha2::{Digest, Sha256};

use super::{
    AuthError, Authenticator, BindingVerb, Caller, MAX_TOKEN_BYTES, ServiceIdentity, WorkerScope,
};
use crate::{
    api::{HarnessBinding, Lifecycle},
    domain::ids::BindingId,
};

/// Audience every token must carry.
pub const AUDIENCE: &str = "harness-engine";
/// Moved to [`crate::api::labels`]; kept here for existing imports.
pub use crate::api::BINDING_ID_LABEL;
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// Agent Sandbox: a Sandbox that adopted a warm-pool pod names it here; otherwise the pod
/// has the Sandbox's name.
pub const SANDBOX_POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
const SANDBOX_GROUP: &str = "agents.x-k8s.io";
const CLAIM_GROUP: &str = "extensions.agents.x-k8s.io";
const SA_PREFIX: &str = "system:serviceaccount:";

/// Settings of the Kubernetes authenticator.
#[derive(Clone, Debug)]
pub struct KubernetesAuthConfig {
    pub audience: String,
    /// How long an admitted identity, a worker scope or a review answer is reused.
    pub cache_ttl: Duration,
    /// How long a refusal is reused (bounds the API server load a bad token can cause).
    pub negative_cache_ttl: Duration,
    pub max_cache_entries: usize,
}

impl Default for KubernetesAuthConfig {
    fn default() -> Self {
        KubernetesAuthConfig {
            audience: AUDIENCE.into(),
            cache_ttl: Duration::from_secs(10),
            negative_cache_ttl: Duration::from_secs(2),
            max_cache_entries: 10_000,
        }
    }
}

/// A small bounded cache with per-entry expiry.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    max: usize,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new(max: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.max {
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= self.max {
                // Still full of live entries: start over rather than grow without bound.
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

/// TokenReview + SubjectAccessReview authenticator.
pub struct KubernetesAuthenticator {
    client: Client,
    config: KubernetesAuthConfig,
    callers: TtlCache<[u8; 32], Result<Caller, AuthError>>,
    reviews: TtlCache<(String, String), bool>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> AuthError {
    AuthError::Unavailable(format!("{what}: {e}"))
}

impl KubernetesAuthenticator {
    pub fn new(client: Client, config: KubernetesAuthConfig) -> Self {
        let max = config.max_cache_entries;
        KubernetesAuthenticator {
            client,
            config,
            callers: TtlCache::new(max),
            reviews: TtlCache::new(max),
        }
    }

    async fn review_token(&self, token: &str) -> Result<Caller, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.config.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("TokenReview", e))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            // The API server's reason (expired, invalid signature, wrong audience) helps
            // whoever holds the token and tells nobody else anything.
            let reason = status
                .error
                .unwrap_or_else(|| "the token was not accepted".into());
            return Err(AuthError::Unauthenticated(format!(
                "token review: {reason}"
            )));
        }
        let audiences = status.audiences.unwrap_or_default();
        if !audiences.iter().any(|a| a == &self.config.audience) {
            return Err(AuthError::Unauthenticated(format!(
                "the token is not issued for audience {}",
                self.config.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let namespace = username
            .strip_prefix(SA_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .map(|(ns, _)| ns.to_owned())
            .filter(|ns| !ns.is_empty())
            .ok_or_else(|| {
                AuthError::Unauthenticated("only ServiceAccount tokens are accepted".into())
            })?;
        let extra = user.extra.unwrap_or_default();
        let identity = ServiceIdentity {
            username,
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra,
            namespace,
        };
        let one = |key: &str| identity.extra.get(key).and_then(|v| v.first()).cloned();
        match (one(POD_NAME_EXTRA), one(POD_UID_EXTRA)) {
            (Some(pod), Some(pod_uid)) => self.resolve_pod(identity, &pod, &pod_uid).await,
            _ => Ok(Caller::Service(identity)),
        }
    }

    /// A pod-bound token: a worker if the pod is its Sandbox's pod, a service otherwise.
    async fn resolve_pod(
        &self,
        identity: ServiceIdentity,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<Caller, AuthError> {
        let ns = identity.namespace.clone();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let pod = pods
            .get_opt(pod_name)
            .await
            .map_err(|e| unavailable("reading the token's pod", e))?;
        let pod = pod
            .filter(|p| p.metadata.uid.as_deref() == Some(pod_uid))
            .ok_or_else(|| AuthError::Unauthenticated("the token's pod no longer exists".into()))?;
        let Some(owner) = controller_of_kind(
            pod.metadata.owner_references.as_deref(),
            SANDBOX_GROUP,
            "Sandbox",
        ) else {
            return Ok(Caller::Service(identity));
        };
        let sandboxes = dynamic_api(
            &self.client,
            &ns,
            &owner.api_version,
            "Sandbox",
            "sandboxes",
        );
        let sandbox = sandboxes
            .get_opt(&owner.name)
            .await
            .map_err(|e| unavailable("reading the pod's Sandbox", e))?;
        let sandbox = sandbox
            .filter(|s| s.metadata.uid.as_deref() == Some(owner.uid.as_str()))
            .ok_or_else(|| AuthError::Forbidden("the pod's Sandbox no longer exists".into()))?;
        let sandbox_pod = sandbox
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SANDBOX_POD_NAME_ANNOTATION))
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| owner.name.clone());
        if sandbox_pod != pod_name {
            // Owner references can be written by whoever creates pods; the Sandbox's own
            // record of its pod cannot.
            return Err(AuthError::Forbidden(format!(
                "pod {pod_name} claims Sandbox {} but is not its pod",
                owner.name
            )));
        }

        let bindings: Api<HarnessBinding> = Api::namespaced(self.client.clone(), &ns);
        let list = bindings
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing HarnessBindings", e))?;
        let holding: Vec<&HarnessBinding> = list
            .items
            .iter()
            .filter(|b| {
                b.status
                    .as_ref()
                    .and_then(|s| s.lease.as_ref())
                    .is_some_and(|lease| {
                        lease.sandbox_uid.as_deref() == Some(owner.uid.as_str())
                            && lease
                                .sandbox_name
                                .as_deref()
                                .is_none_or(|n| n == owner.name)
                    })
            })
            .collect();
        match holding.as_slice() {
            [binding] => {
                // The lease names the pod the operator verified; a newer pod under the
                // same Sandbox is a new worker, not admitted until the operator binds it
                // at a new generation.
                let verified = binding
                    .status
                    .as_ref()
                    .and_then(|s| s.lease.as_ref())
                    .and_then(|l| l.worker_pod_uid.as_deref());
                if verified.is_some_and(|uid| uid != pod_uid) {
                    return Err(AuthError::LeaseNotReady(format!(
                        "pod {pod_name} is not the verified worker of its Sandbox's lease yet"
                    )));
                }
                worker_scope(identity.username, &ns, binding)
            }
            [] => Err(self.replaced_or_foreign(&ns, &sandbox, &list.items).await),
            _ => Err(AuthError::Forbidden(format!(
                "several HarnessBindings claim Sandbox {}",
                owner.name
            ))),
        }
    }

    /// No binding's lease holds this Sandbox: if a binding still owns it (directly, or
    /// through its SandboxClaim), the worker was replaced; otherwise it is no worker of ours.
    async fn replaced_or_foreign(
        &self,
        ns: &str,
        sandbox: &DynamicObject,
        bindings: &[HarnessBinding],
    ) -> AuthError {
        let owned_by_binding = |refs: Option<&[OwnerReference]>| -> Option<String> {
            let owner = refs?.iter().find(|r| {
                r.kind == "HarnessBinding" && api_group(&r.api_version) == crate::api::GROUP
            })?;
            bindings
                .iter()
                .find(|b| b.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                .map(|b| format!("{ns}/{}", b.metadata.name.clone().unwrap_or_default()))
        };
        let mut owner = owned_by_binding(sandbox.metadata.owner_references.as_deref());
        if owner.is_none()
            && let Some(claim_ref) = controller_of_kind(
                sandbox.metadata.owner_references.as_deref(),
                CLAIM_GROUP,
                "SandboxClaim",
            )
        {
            let claims = dynamic_api(
                &self.client,
                ns,
                &claim_ref.api_version,
                "SandboxClaim",
                "sandboxclaims",
            );
            if let Ok(Some(claim)) = claims.get_opt(&claim_ref.name).await
                && claim.metadata.uid.as_deref() == Some(claim_ref.uid.as_str())
            {
                owner = owned_by_binding(claim.metadata.owner_references.as_deref());
            }
        }
        match owner {
            Some(binding) => AuthError::StaleLease(format!(
                "this worker's sandbox no longer holds the lease of HarnessBinding {binding}: it was replaced"
            )),
            None => {
                AuthError::Forbidden("the pod's Sandbox is not bound to any HarnessBinding".into())
            }
        }
    }

    async fn review_access(
        &self,
        identity: &ServiceIdentity,
        attributes: ResourceAttributes,
    ) -> Result<bool, AuthError> {
        let cache_key = (
            identity.username.clone(),
            format!(
                "{}|{}|{}|{}|{}",
                attributes.verb.as_deref().unwrap_or(""),
                attributes.group.as_deref().unwrap_or(""),
                attributes.resource.as_deref().unwrap_or(""),
                attributes.namespace.as_deref().unwrap_or(""),
                attributes.name.as_deref().unwrap_or("")
            ),
        );
        if let Some(allowed) = self.reviews.get(&cache_key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(identity.username.clone()),
                uid: Some(identity.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(identity.groups.clone()),
                extra: Some(identity.extra.clone()),
                resource_attributes: Some(attributes),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("SubjectAccessReview", e))?;
        let allowed = answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true));
        let ttl = if allowed {
            self.config.cache_ttl
        } else {
            self.config.negative_cache_ttl
        };
        self.reviews.put(cache_key, allowed, ttl);
        Ok(allowed)
    }
}

fn api_group(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

fn controller_of_kind<'a>(
    refs: Option<&'a [OwnerReference]>,
    group: &str,
    kind: &str,
) -> Option<&'a OwnerReference> {
    refs?.iter().find(|r| {
        r.controller == Some(true) && r.kind == kind && api_group(&r.api_version) == group
    })
}

fn dynamic_api(
    client: &Client,
    ns: &str,
    api_version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// The scope of a worker whose Sandbox `binding`'s current lease holds.
fn worker_scope(username: String, ns: &str, binding: &HarnessBinding) -> Result<Caller, AuthError> {
    let name = binding.metadata.name.clone().unwrap_or_default();
    let binding_ref = format!("{ns}/{name}");
    let status = binding.status.clone().unwrap_or_default();
    match status.lifecycle {
        Some(Lifecycle::Ready | Lifecycle::Busy) => {}
        Some(
            Lifecycle::Replacing | Lifecycle::Releasing | Lifecycle::Clearing | Lifecycle::Failed,
        ) => {
            return Err(AuthError::StaleLease(format!(
                "HarnessBinding {binding_ref} is replacing or releasing this worker's lease"
            )));
        }
        _ => {
            return Err(AuthError::LeaseNotReady(format!(
                "HarnessBinding {binding_ref}'s lease is not ready yet"
            )));
        }
    }
    let lease_generation = status
        .lease
        .map(|l| l.generation)
        .and_then(|g| u64::try_from(g).ok());
    let epoch = u64::try_from(binding.spec.epoch).ok();
    let binding_id = binding
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(BINDING_ID_LABEL))
        .and_then(|v| BindingId::parse(v));
    match (binding_id, epoch, lease_generation) {
        (Some(binding_id), Some(epoch), Some(lease_generation)) => {
            Ok(Caller::Worker(WorkerScope {
                username,
                binding_id,
                epoch,
                lease_generation,
                binding_ref,
                agent_id: binding.spec.agent_id.clone(),
                conversation_id: binding.spec.conversation_id.clone(),
                subject_ref: binding.spec.subject_ref.clone(),
            }))
        }
        (None, _, _) => Err(AuthError::Forbidden(format!(
            "HarnessBinding {binding_ref} has no valid {BINDING_ID_LABEL} label"
        ))),
        _ => Err(AuthError::Forbidden(format!(
            "HarnessBinding {binding_ref} has a negative epoch or lease generation"
        ))),
    }
}

#[async_trait]
impl Authenticator for KubernetesAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Unauthenticated(
                "the bearer token is empty or too long".into(),
            ));
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(cached) = self.callers.get(&digest) {
            return cached;
        }
        let result = self.review_token(token).await;
        match &result {
            Ok(_) => self
                .callers
                .put(digest, result.clone(), self.config.cache_ttl),
            // An outage is not an answer: never cache it.
            Err(AuthError::Unavailable(_)) => {}
            Err(_) => self
                .callers
                .put(digest, result.clone(), self.config.negative_cache_ttl),
        }
        result
    }

    async fn may_use_bindings(
        &self,
        caller: &Caller,
        verb: BindingVerb,
    ) -> Result<bool, AuthError> {
        match caller {
            Caller::Service(identity) => {
                let attributes = ResourceAttributes {
                    namespace: Some(identity.namespace.clone()),
                    verb: Some(verb.as_str().into()),
                    group: Some(crate::api::GROUP.into()),
                    resource: Some("harnessbindings".into()),
                    ..Default::default()
                };
                self.review_access(identity, attributes).await
            }
            // Workers are confined to their own binding by the router's authorization.
            Caller::Worker(_) => Ok(true),
            Caller::Principal { .. } => Ok(false),
        }
    }

    async fn may_act_for(&self, caller: &Caller, subject: &str) -> Result<bool, AuthError> {
        match caller {
            Caller::Service(identity) => {
                let attributes = ResourceAttributes {
                    verb: Some("impersonate".into()),
                    resource: Some("users".into()),
                    name: Some(subject.to_owned()),
                    ..Default::default()
                };
                self.review_access(identity, attributes).await
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entries_expire_and_the_cache_stays_bounded() {
        let cache: TtlCache<u32, &str> = TtlCache::new(2);
        cache.put(1, "a", Duration::from_secs(60));
        cache.put(2, "b", Duration::ZERO);
        assert_eq!(cache.get(&1), Some("a"));
        assert_eq!(cache.get(&2), None, "expired");
        cache.put(3, "c", Duration::from_secs(60));
        cache.put(4, "d", Duration::from_secs(60));
        let len = cache.entries.lock().map(|e| e.len()).unwrap_or(usize::MAX);
        assert!(len <= 2, "{len}");
    }

    #[test]
    fn owner_references_are_matched_by_group_kind_and_controller() {
        let r = |api_version: &str, kind: &str, controller: Option<bool>| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "n".into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        };
        let refs = vec![
            r("apps/v1", "ReplicaSet", Some(true)),
            r("agents.x-k8s.io/v1beta1", "Sandbox", None),
        ];
        assert!(
            controller_of_kind(Some(&refs), SANDBOX_GROUP, "Sandbox").is_none(),
            "not the controller"
        );
        let refs = vec![r("agents.x-k8s.io/v1beta1", "Sandbox", Some(true))];
        assert!(controller_of_kind(Some(&refs), SANDBOX_GROUP, "Sandbox").is_some());
        assert!(
            controller_of_kind(Some(&refs), CLAIM_GROUP, "Sandbox").is_none(),
            "group must match"
        );
    }
}
