//! The Kubernetes side of a bind in operator mode: the conversation's `HarnessBinding`.
//!
//! A control-plane service binds a conversation through the data plane (authorized as
//! every bind is: SubjectAccessReview on `harnessbindings` in its namespace, impersonation
//! of the end user, [`crate::server::authz::bind_subject`]). In operator mode the bind
//! then creates or returns the conversation's `HarnessBinding`, so the operator claims a
//! sandbox for it, and asks a hibernated one to resume (DESIGN §3, "the next bind
//! resumes").
//!
//! - The binding lives in the caller's ServiceAccount namespace, where its access was
//!   reviewed. A new one needs `sandbox_profile` in the request (and takes an optional
//!   `memory_policy`); both are checked with the admission webhook's own rules
//!   ([`crate::webhook::binding::check_profile`], `check_memory_policy`) before anything
//!   is created, so a bad reference is a 422 and leaves nothing behind.
//! - Its name is derived from the binding id ([`object_name`]; a keyed digest, so no user
//!   data is in a name) and it carries the binding-id label: retries and two replicas
//!   racing create one object: the loser's 409 AlreadyExists reads the winner's and
//!   checks that it is the same conversation.
//! - An existing binding is found by its label, whatever its name (one a user applied
//!   as YAML included, once the operator has labelled it), and returned as it is.
//!
//! IO goes through [`BindingObjects`], a narrow interface (find, get, create, request a
//! resume, and the webhook's [`ObjectLookup`] for references); [`KubeBindingObjects`] is
//! the API server with the operator's own ServiceAccount, whose RBAC adds `create` on
//! `harnessbindings` for exactly this. The decisions are pure functions below.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{
    auth::Caller,
    dto::{BindRequest, Binding, Harness, HarnessBindingRef},
    error::{ApiError, ErrorCode},
};
use crate::{
    api::{
        BINDING_ID_LABEL, HarnessBinding, HarnessBindingSpec, HarnessId, HarnessSpec, Lifecycle,
        MemoryPolicy, RESUME_ANNOTATION, SandboxProfile, binding::LocalObjectReference,
    },
    domain::{
        ids::{BindingId, SubjectRef},
        state::BindingRecord,
    },
    webhook::{
        LookupError, ObjectLookup,
        binding::{check_memory_policy, check_profile},
    },
};

/// Field manager of the objects a bind creates or patches.
pub const FIELD_MANAGER: &str = "harness-engine-data-plane";

/// Why an object operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// Create: an object of that name exists already.
    #[error("already exists")]
    AlreadyExists,
    /// The API server (CEL, admission) refused the object; the message says why.
    #[error("{0}")]
    Refused(String),
    /// The operator's own ServiceAccount may not do this: its RBAC is not the chart's.
    #[error("{0}")]
    NotPermitted(String),
    /// The API server could not answer.
    #[error("{0}")]
    Unavailable(String),
}

/// The HarnessBinding operations a bind needs, and nothing more.
#[async_trait]
pub trait BindingObjects: ObjectLookup {
    /// The only namespace the operator reconciles, when it is confined to one.
    fn watched_namespace(&self) -> Option<&str>;
    /// HarnessBindings in `namespace` labelled with binding id `id`.
    async fn find(
        &self,
        namespace: &str,
        id: &BindingId,
    ) -> Result<Vec<HarnessBinding>, ObjectError>;
    async fn get(&self, namespace: &str, name: &str)
    -> Result<Option<HarnessBinding>, ObjectError>;
    async fn create(
        &self,
        namespace: &str,
        binding: &HarnessBinding,
    ) -> Result<HarnessBinding, ObjectError>;
    /// Sets the resume annotation to `at` (RFC 3339): the operator resumes a hibernated
    /// binding whose request is newer than its hibernation.
    async fn request_resume(
        &self,
        namespace: &str,
        name: &str,
        at: &str,
    ) -> Result<(), ObjectError>;
}

/// The `HarnessBinding` name of binding `id`: `hb-` and the id's 32 hex digits.
pub fn object_name(id: &BindingId) -> String {
    format!("hb-{}", id.as_str().trim_start_matches("hb_"))
}

/// A Kubernetes object name as `LocalObjectReference` accepts it (DNS subdomain).
pub fn valid_object_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Refuses a malformed `sandbox_profile` or `memory_policy` (in every mode, so that a
/// client learns of it before it meets an operator).
pub fn check_references(req: &BindRequest) -> Result<(), ApiError> {
    for (field, value) in [
        ("sandbox_profile", &req.sandbox_profile),
        ("memory_policy", &req.memory_policy),
    ] {
        if let Some(name) = value
            && !valid_object_name(name)
        {
            return Err(ApiError::invalid(format!(
                "{field} must be a Kubernetes object name: 1 to 253 of [a-z0-9.-], starting and ending alphanumeric"
            ))
            .with_details(json!({"field": field})));
        }
    }
    Ok(())
}

/// What a bind asks for: the conversation and, for a new binding, its configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    pub namespace: String,
    pub id: BindingId,
    pub subject_ref: SubjectRef,
    pub agent_id: String,
    pub conversation_id: String,
    pub harness: HarnessId,
    pub sandbox_profile: Option<String>,
    pub memory_policy: Option<String>,
    /// The store's epoch when the conversation already has a record (a binding deleted
    /// and bound again continues its epoch), else 0.
    pub epoch: u64,
}

fn harness_id(h: Harness) -> HarnessId {
    match h {
        Harness::Deepagents => HarnessId::DeepAgents,
        Harness::ClaudeAgentSdk => HarnessId::ClaudeAgentSdk,
        Harness::Strands => HarnessId::Strands,
        Harness::Agentcore => HarnessId::AgentCore,
    }
}

/// The object a bind creates for `want` with profile `profile`.
pub fn desired(want: &Wanted, profile: &str) -> HarnessBinding {
    HarnessBinding {
        metadata: ObjectMeta {
            name: Some(object_name(&want.id)),
            namespace: Some(want.namespace.clone()),
            labels: Some(BTreeMap::from([(
                BINDING_ID_LABEL.to_owned(),
                want.id.as_str().to_owned(),
            )])),
            ..Default::default()
        },
        spec: HarnessBindingSpec {
            agent_id: want.agent_id.clone(),
            conversation_id: want.conversation_id.clone(),
            subject_ref: want.subject_ref.as_str().to_owned(),
            harness: HarnessSpec {
                id: want.harness,
                contract_version: 1,
                conversation_policy: Default::default(),
                options: None,
            },
            sandbox_profile_ref: LocalObjectReference {
                name: profile.to_owned(),
            },
            memory_policy_ref: want
                .memory_policy
                .clone()
                .map(|name| LocalObjectReference { name }),
            epoch: i64::try_from(want.epoch).unwrap_or(i64::MAX),
        },
        status: None,
    }
}

/// Is `found` the binding of the conversation `want` names (and usable)?
pub fn check_same(found: HarnessBinding, want: &Wanted) -> Result<HarnessBinding, ApiError> {
    let name = found.name_any();
    let spec = &found.spec;
    if spec.agent_id != want.agent_id
        || spec.conversation_id != want.conversation_id
        || spec.subject_ref != want.subject_ref.as_str()
    {
        // Only a hand-made object can get here (the name and label are keyed digests of
        // the identity); say nothing about whose conversation it is.
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "HarnessBinding {}/{name} holds another conversation: rename or delete it",
                want.namespace
            ),
        ));
    }
    if found.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "HarnessBinding {}/{name} is being deleted (its lease is being released): bind again once it is gone",
                want.namespace
            ),
        )
        .with_details(json!({"name": name, "namespace": want.namespace})));
    }
    Ok(found)
}

/// Of the objects labelled with the binding id, the one a bind answers with: ours by
/// name if it is there, else the first by name.
pub fn pick(mut found: Vec<HarnessBinding>, id: &BindingId) -> Option<HarnessBinding> {
    let ours = object_name(id);
    found.sort_by_key(|b| (b.name_any() != ours, b.name_any()));
    found.into_iter().next()
}

/// A hibernated binding is resumed by the next bind.
pub fn needs_resume(binding: &HarnessBinding) -> bool {
    binding
        .status
        .as_ref()
        .is_some_and(|s| s.lifecycle == Some(Lifecycle::Hibernated))
}

/// The request field a webhook violation is about.
fn request_field(spec_field: &str) -> &'static str {
    match spec_field {
        "spec.harness.id" => "harness",
        "spec.memoryPolicyRef.name" => "memory_policy",
        _ => "sandbox_profile",
    }
}

fn lookup_failed(e: LookupError) -> ApiError {
    tracing::warn!(error = %e, "bind: reading a referenced object failed");
    let mut err = ApiError::new(
        ErrorCode::Unavailable,
        "the Kubernetes API server could not be read; retry",
    );
    err.retry_after_s = Some(1);
    err
}

fn object_failed(e: ObjectError) -> ApiError {
    match e {
        ObjectError::Refused(message) => ApiError::invalid(format!(
            "the Kubernetes API server refused the HarnessBinding: {message}"
        )),
        // Not the caller's doing and not transient: the deployment needs fixing.
        ObjectError::NotPermitted(message) => {
            tracing::error!(error = %message, "bind: the operator's ServiceAccount may not manage HarnessBindings; its ClusterRole needs the chart's rules");
            ApiError::new(
                ErrorCode::Internal,
                "the operator is not permitted to manage HarnessBindings here: its ClusterRole needs create on harnessbindings (the chart's RBAC)",
            )
        }
        other => {
            tracing::warn!(error = %other, "bind: a HarnessBinding operation failed");
            let mut err = ApiError::new(
                ErrorCode::Unavailable,
                "the Kubernetes API server did not answer; retry",
            );
            err.retry_after_s = Some(1);
            err
        }
    }
}

/// The references of a new binding, checked by the webhook's rules: a 422 naming the
/// request field, or nothing.
async fn check_new(
    objects: &dyn BindingObjects,
    want: &Wanted,
    desired: &HarnessBinding,
) -> Result<(), ApiError> {
    let ns = &want.namespace;
    let profile: Option<SandboxProfile> = objects
        .sandbox_profile(ns, &desired.spec.sandbox_profile_ref.name)
        .await
        .map_err(lookup_failed)?;
    let mut violations = check_profile(ns, &desired.spec, profile.as_ref());
    if let Some(policy) = &desired.spec.memory_policy_ref {
        let found: Option<MemoryPolicy> = objects
            .memory_policy(ns, &policy.name)
            .await
            .map_err(lookup_failed)?;
        violations.extend(check_memory_policy(ns, &desired.spec, found.as_ref()));
    }
    if violations.is_empty() {
        return Ok(());
    }
    let message = violations
        .iter()
        .map(|v| v.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let details: Vec<_> = violations
        .iter()
        .map(|v| json!({"field": request_field(&v.field), "message": v.message}))
        .collect();
    Err(ApiError::invalid(message).with_details(json!({"violations": details})))
}

/// Creates or returns the conversation's binding; `true` when this call created it.
pub async fn ensure_object(
    objects: &dyn BindingObjects,
    want: &Wanted,
) -> Result<(HarnessBinding, bool), ApiError> {
    let ns = &want.namespace;
    let found = objects.find(ns, &want.id).await.map_err(object_failed)?;
    if let Some(found) = pick(found, &want.id) {
        return check_same(found, want).map(|b| (b, false));
    }
    let Some(profile) = &want.sandbox_profile else {
        return Err(ApiError::invalid(format!(
            "this conversation has no HarnessBinding in namespace {ns} yet: name the SandboxProfile to create it with in sandbox_profile"
        ))
        .with_details(json!({"field": "sandbox_profile", "namespace": ns})));
    };
    let desired = desired(want, profile);
    check_new(objects, want, &desired).await?;
    match objects.create(ns, &desired).await {
        Ok(created) => Ok((created, true)),
        // Another bind (a retry, another replica) created it first: it is the same
        // conversation unless someone made an object by that name by hand.
        Err(ObjectError::AlreadyExists) => {
            let name = object_name(&want.id);
            match objects.get(ns, &name).await.map_err(object_failed)? {
                Some(existing) => check_same(existing, want).map(|b| (b, false)),
                None => Err(object_failed(ObjectError::Unavailable(format!(
                    "HarnessBinding {ns}/{name} was deleted while being created"
                )))),
            }
        }
        Err(e) => Err(object_failed(e)),
    }
}

/// An operator-mode bind for `subject`, already authorized: the object, the store
/// record, the answer. `(created, body)`.
pub async fn bind(
    state: &super::AppState,
    objects: &dyn BindingObjects,
    caller: &Caller,
    subject: &str,
    req: BindRequest,
) -> Result<(bool, Binding), ApiError> {
    let Caller::Service(identity) = caller else {
        return Err(ApiError::forbidden(
            "only a control-plane ServiceAccount can bind conversations",
        ));
    };
    let ns = identity.namespace.clone();
    if let Some(watched) = objects.watched_namespace()
        && watched != ns
    {
        return Err(ApiError::invalid(format!(
            "bindings are created in the caller's namespace {ns}, but the operator reconciles only namespace {watched}: call with a ServiceAccount of {watched}"
        ))
        .with_details(json!({"namespace": ns, "watched_namespace": watched})));
    }
    let keyring = state.keyring();
    let id = keyring.binding_id(subject, &req.agent_id, &req.conversation_id);
    let stored = state.store().get_binding(&id).await?;
    let want = Wanted {
        namespace: ns.clone(),
        id: id.clone(),
        subject_ref: keyring.subject_ref(subject),
        agent_id: req.agent_id,
        conversation_id: req.conversation_id,
        harness: harness_id(req.harness),
        sandbox_profile: req.sandbox_profile,
        memory_policy: req.memory_policy,
        epoch: stored.map_or(0, |r| r.epoch),
    };
    let (object, created) = ensure_object(objects, &want).await?;
    let name = object.name_any();
    if !created && needs_resume(&object) {
        let at = k8s_openapi::jiff::Timestamp::now().to_string();
        // Best effort: the bind answers either way, and the next bind asks again.
        if let Err(e) = objects.request_resume(&ns, &name, &at).await {
            tracing::warn!(namespace = %ns, name = %name, error = %e, "bind: requesting the resume of a hibernated HarnessBinding failed");
        }
    }
    // The store's record, as the binding controller writes it (the controller raises
    // the lease generation when it claims the first sandbox).
    let record = BindingRecord {
        binding_id: id,
        environment: keyring.environment().to_owned(),
        owner: want.subject_ref.clone(),
        agent_id: want.agent_id.clone(),
        conversation_id: want.conversation_id.clone(),
        harness: object.spec.harness.id.as_str().to_owned(),
        epoch: u64::try_from(object.spec.epoch).unwrap_or(0),
        lease_generation: 0,
        created_at_ms: crate::store::now_ms(),
    };
    let span = crate::telemetry::spans::operation(
        crate::telemetry::spans::Step::SessionBinding,
        "binding.create",
    );
    crate::telemetry::spans::record(
        &span,
        crate::telemetry::spans::keys::BINDING_ID,
        record.binding_id.as_str(),
    );
    crate::telemetry::spans::record(&span, crate::telemetry::spans::keys::CREATED, created);
    let (stored, _) =
        super::middleware::traced(span, state.store().ensure_binding(&record)).await?;
    let mut body = Binding::from(stored);
    body.harness_binding = Some(HarnessBindingRef {
        namespace: ns,
        name,
        uid: object.uid().unwrap_or_default(),
    });
    Ok((created, body))
}

/// [`BindingObjects`] against the API server, with the operator's client.
pub struct KubeBindingObjects {
    client: Client,
    watched: Option<String>,
    lookup: crate::webhook::KubeLookup,
}

impl KubeBindingObjects {
    pub fn new(client: Client, watched_namespace: Option<String>) -> Self {
        KubeBindingObjects {
            lookup: crate::webhook::KubeLookup::new(client.clone()),
            client,
            watched: watched_namespace,
        }
    }

    fn api(&self, namespace: &str) -> Api<HarnessBinding> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

fn kube_error(e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
            ObjectError::AlreadyExists
        }
        // RBAC refusing the operator itself (an admission webhook's 403 says so).
        kube::Error::Api(s) if s.code == 403 && !s.message.contains("admission webhook") => {
            ObjectError::NotPermitted(s.message)
        }
        // Invalid (CEL, schema), BadRequest, or a refusal by an admission webhook.
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => ObjectError::Refused(s.message),
        other => ObjectError::Unavailable(other.to_string()),
    }
}

#[async_trait]
impl ObjectLookup for KubeBindingObjects {
    async fn sandbox_profile(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SandboxProfile>, LookupError> {
        self.lookup.sandbox_profile(namespace, name).await
    }

    async fn memory_policy(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<MemoryPolicy>, LookupError> {
        self.lookup.memory_policy(namespace, name).await
    }
}

#[async_trait]
impl BindingObjects for KubeBindingObjects {
    fn watched_namespace(&self) -> Option<&str> {
        self.watched.as_deref()
    }

    async fn find(
        &self,
        namespace: &str,
        id: &BindingId,
    ) -> Result<Vec<HarnessBinding>, ObjectError> {
        let selector = format!("{BINDING_ID_LABEL}={}", id.as_str());
        self.api(namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .map_err(kube_error)
    }

    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<HarnessBinding>, ObjectError> {
        self.api(namespace).get_opt(name).await.map_err(kube_error)
    }

    async fn create(
        &self,
        namespace: &str,
        binding: &HarnessBinding,
    ) -> Result<HarnessBinding, ObjectError> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.api(namespace)
            .create(&params, binding)
            .await
            .map_err(kube_error)
    }

    async fn request_resume(
        &self,
        namespace: &str,
        name: &str,
        at: &str,
    ) -> Result<(), ObjectError> {
        let patch = json!({"metadata": {"annotations": {RESUME_ANNOTATION: at}}});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.api(namespace)
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(kube_error)
    }
}

#[cfg(test)]
mod tests;
