//! AdmissionReview v1 (`admission.k8s.io/v1`, kube's [`kube::core::admission`] types) in
//! and out, and the axum router that serves one path per webhook.
//!
//! Every refusal carries `allowed: false` and a `status` with `code` 422 (`Invalid`) or
//! 403 (`Forbidden`), a `message` that names each field and rule, and one `details.causes`
//! entry per violation. The API server shows the message to the client as
//! `admission webhook "<name>" denied the request: <message>`.

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, State},
    routing::post,
};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    response::{StatusCause, StatusDetails, StatusSummary},
};
use serde::de::DeserializeOwned;

use super::{
    DEFAULT_OPERATOR_IDENTITY, ObjectLookup, PATH_HARNESS_BINDINGS, PATH_HARNESS_BINDINGS_STATUS,
    PATH_MEMORY_POLICIES, PATH_SANDBOX_PROFILES, Violation, ViolationKind, binding, memory,
    overall_kind, profile, summarize,
};
use crate::{
    api::{HarnessBinding, MemoryPolicy, SandboxProfile},
    domain::memory::policy::SharedMemoryPolicies,
};

/// What the operator configures.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Users (`userInfo.username`, for a ServiceAccount
    /// `system:serviceaccount:<namespace>:<name>`) that may change `status.lease`.
    pub operator_identities: Vec<String>,
    /// What a `MemoryPolicy` may at most allow: the deployment memory configuration,
    /// shared with the data plane (a reload reaches both).
    pub memory: SharedMemoryPolicies,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            operator_identities: vec![DEFAULT_OPERATOR_IDENTITY.to_owned()],
            memory: SharedMemoryPolicies::default(),
        }
    }
}

/// The validators with their configuration and the way they read referenced objects.
pub struct Webhook {
    config: WebhookConfig,
    lookup: Arc<dyn ObjectLookup>,
}

type Request = AdmissionRequest<DynamicObject>;

/// Largest AdmissionReview body the router reads.
const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

impl Webhook {
    pub fn new(config: WebhookConfig, lookup: Arc<dyn ObjectLookup>) -> Self {
        Webhook { config, lookup }
    }

    pub fn config(&self) -> &WebhookConfig {
        &self.config
    }

    /// `HarnessBinding` create and update (spec rules and references).
    pub async fn review_harness_binding(&self, req: &Request) -> AdmissionResponse {
        let (new, old) = match objects::<HarnessBinding>(req, "HarnessBinding") {
            Ok(Some(pair)) => pair,
            Ok(None) => return AdmissionResponse::from(req),
            Err(response) => return *response,
        };
        let namespace = namespace_of(req, &new.metadata.namespace);
        match binding::validate(self.lookup.as_ref(), &namespace, &new, old.as_ref()).await {
            Ok(violations) => respond(req, &violations),
            Err(e) => {
                let mut response = AdmissionResponse::from(req).deny(format!(
                    "the HarnessBinding could not be validated because a referenced object could not be read ({e}); try again"
                ));
                response.result.code = 503;
                response.result.reason = "ServiceUnavailable".into();
                response.result.status = Some(StatusSummary::Failure);
                response
            }
        }
    }

    /// `HarnessBinding` status subresource updates (the lease rule).
    pub fn review_harness_binding_status(&self, req: &Request) -> AdmissionResponse {
        let (new, old) = match objects::<HarnessBinding>(req, "HarnessBinding") {
            Ok(Some(pair)) => pair,
            Ok(None) => return AdmissionResponse::from(req),
            Err(response) => return *response,
        };
        let username = req.user_info.username.as_deref().unwrap_or("");
        let violations = binding::validate_status(
            new.status.as_ref(),
            old.as_ref().and_then(|o| o.status.as_ref()),
            username,
            &self.config.operator_identities,
        );
        respond(req, &violations)
    }

    /// `SandboxProfile` create and update.
    pub fn review_sandbox_profile(&self, req: &Request) -> AdmissionResponse {
        let (new, _old) = match objects::<SandboxProfile>(req, "SandboxProfile") {
            Ok(Some(pair)) => pair,
            Ok(None) => return AdmissionResponse::from(req),
            Err(response) => return *response,
        };
        let namespace = namespace_of(req, &new.metadata.namespace);
        respond(req, &profile::validate(&namespace, &new.spec))
    }

    /// `MemoryPolicy` create and update.
    pub fn review_memory_policy(&self, req: &Request) -> AdmissionResponse {
        let (new, _old) = match objects::<MemoryPolicy>(req, "MemoryPolicy") {
            Ok(Some(pair)) => pair,
            Ok(None) => return AdmissionResponse::from(req),
            Err(response) => return *response,
        };
        let policies = self.config.memory.snapshot();
        respond(req, &memory::validate(&new.spec, &policies.deployment))
    }
}

/// The new and old object of a create or update, typed. `Ok(None)`: nothing to check
/// (delete, connect). `Err`: the response that refuses an unreadable request.
fn objects<K: DeserializeOwned>(
    req: &Request,
    kind: &str,
) -> Result<Option<(K, Option<K>)>, Box<AdmissionResponse>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(None);
    }
    if req.kind.kind != kind {
        return Err(Box::new(refuse(
            req,
            ViolationKind::Invalid,
            format!(
                "this endpoint validates {kind}, not {}: check the webhook configuration's rules",
                req.kind.kind
            ),
        )));
    }
    let Some(object) = &req.object else {
        return Err(Box::new(refuse(
            req,
            ViolationKind::Invalid,
            "the admission request has no object".into(),
        )));
    };
    let new =
        typed::<K>(object, kind).map_err(|m| Box::new(refuse(req, ViolationKind::Invalid, m)))?;
    let old = match (&req.operation, &req.old_object) {
        (Operation::Update, Some(old)) => Some(
            typed::<K>(old, kind).map_err(|m| Box::new(refuse(req, ViolationKind::Invalid, m)))?,
        ),
        _ => None,
    };
    Ok(Some((new, old)))
}

fn typed<K: DeserializeOwned>(object: &DynamicObject, kind: &str) -> Result<K, String> {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("the object cannot be read as a {kind}: {e}"))
}

fn namespace_of(req: &Request, from_object: &Option<String>) -> String {
    req.namespace
        .clone()
        .or_else(|| from_object.clone())
        .unwrap_or_default()
}

fn refuse(req: &Request, kind: ViolationKind, message: String) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req).deny(message);
    response.result.code = kind.http_code();
    response.result.reason = kind.reason().into();
    response.result.status = Some(StatusSummary::Failure);
    response
}

/// Allows when there is no violation, otherwise refuses with every violation.
fn respond(req: &Request, violations: &[Violation]) -> AdmissionResponse {
    if violations.is_empty() {
        return AdmissionResponse::from(req);
    }
    let kind = overall_kind(violations);
    let mut response = refuse(req, kind, summarize(violations));
    response.result.details = Some(StatusDetails {
        name: req.name.clone(),
        group: req.kind.group.clone(),
        kind: req.kind.kind.clone(),
        uid: String::new(),
        causes: violations
            .iter()
            .map(|v| StatusCause {
                reason: match v.kind {
                    ViolationKind::Invalid => "FieldValueInvalid",
                    ViolationKind::Forbidden => "FieldValueForbidden",
                }
                .into(),
                message: v.message.clone(),
                field: v.field.clone(),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    response
}

type Review = AdmissionReview<DynamicObject>;

fn request_of(review: Review) -> Result<Request, Box<Review>> {
    review.try_into().map_err(|_| {
        Box::new(AdmissionResponse::invalid("the AdmissionReview carries no request").into_review())
    })
}

async fn harness_bindings(
    State(webhook): State<Arc<Webhook>>,
    Json(review): Json<Review>,
) -> Json<Review> {
    Json(match request_of(review) {
        Ok(req) => webhook.review_harness_binding(&req).await.into_review(),
        Err(refusal) => *refusal,
    })
}

async fn harness_bindings_status(
    State(webhook): State<Arc<Webhook>>,
    Json(review): Json<Review>,
) -> Json<Review> {
    Json(match request_of(review) {
        Ok(req) => webhook.review_harness_binding_status(&req).into_review(),
        Err(refusal) => *refusal,
    })
}

async fn sandbox_profiles(
    State(webhook): State<Arc<Webhook>>,
    Json(review): Json<Review>,
) -> Json<Review> {
    Json(match request_of(review) {
        Ok(req) => webhook.review_sandbox_profile(&req).into_review(),
        Err(refusal) => *refusal,
    })
}

async fn memory_policies(
    State(webhook): State<Arc<Webhook>>,
    Json(review): Json<Review>,
) -> Json<Review> {
    Json(match request_of(review) {
        Ok(req) => webhook.review_memory_policy(&req).into_review(),
        Err(refusal) => *refusal,
    })
}

/// The four webhook paths ([`PATH_HARNESS_BINDINGS`], [`PATH_HARNESS_BINDINGS_STATUS`],
/// [`PATH_SANDBOX_PROFILES`], [`PATH_MEMORY_POLICIES`]), POST only.
pub fn router(webhook: Arc<Webhook>) -> Router {
    Router::new()
        .route(PATH_HARNESS_BINDINGS, post(harness_bindings))
        .route(PATH_HARNESS_BINDINGS_STATUS, post(harness_bindings_status))
        .route(PATH_SANDBOX_PROFILES, post(sandbox_profiles))
        .route(PATH_MEMORY_POLICIES, post(memory_policies))
        // A review carries the object and the old object, each up to etcd's 1.5 MiB.
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(webhook)
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use serde_json::{Value, json};

    use super::*;
    use crate::webhook::LookupError;
    use kube::core::Status;

    struct Nothing;

    #[async_trait]
    impl ObjectLookup for Nothing {
        async fn sandbox_profile(
            &self,
            _: &str,
            _: &str,
        ) -> Result<Option<SandboxProfile>, LookupError> {
            Ok(None)
        }
        async fn memory_policy(
            &self,
            _: &str,
            _: &str,
        ) -> Result<Option<MemoryPolicy>, LookupError> {
            Ok(None)
        }
    }

    fn review(kind: &str, operation: &str, user: &str, object: Value, old: Value) -> Request {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7b8c-uid",
                "kind": {"group": "harness-engine.dev", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "harness-engine.dev", "version": "v1alpha1", "resource": "x"},
                "name": "obj",
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": user},
                "object": object,
                "oldObject": old,
                "dryRun": false,
            }
        });
        let review: Review = serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"));
        review.try_into().unwrap_or_else(|_| panic!("request"))
    }

    fn webhook() -> Webhook {
        Webhook::new(WebhookConfig::default(), Arc::new(Nothing))
    }

    fn profile_object(pool_namespace: &str) -> Value {
        json!({
            "apiVersion": "harness-engine.dev/v1alpha1",
            "kind": "SandboxProfile",
            "metadata": {"name": "obj", "namespace": "team-a"},
            "spec": {
                "warmPoolRef": {"name": "pool", "namespace": pool_namespace},
                "allowedHarnessIds": ["deepagents"],
                "allowedWorkerImageDigests": [format!("sha256:{}", "a".repeat(64))],
                "adapterVersion": "1.0.0",
                "workerProtocolVersions": [1],
                "egressPolicyClass": "data-plane-only",
            }
        })
    }

    #[test]
    fn refusal_carries_code_reason_message_and_causes() {
        let req = review(
            "SandboxProfile",
            "CREATE",
            "alice",
            profile_object("team-b"),
            Value::Null,
        );
        let out = webhook().review_sandbox_profile(&req);
        assert!(!out.allowed);
        assert_eq!(out.uid, "7b8c-uid");
        assert_eq!(out.result.code, 403);
        assert_eq!(out.result.reason, "Forbidden");
        assert!(
            out.result
                .message
                .starts_with("spec.warmPoolRef.namespace: \"team-b\"")
        );
        let details = out
            .result
            .details
            .clone()
            .unwrap_or_else(|| panic!("details"));
        assert_eq!(details.causes[0].field, "spec.warmPoolRef.namespace");
        let wire = serde_json::to_value(out.into_review()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(wire["kind"], "AdmissionReview");
        assert_eq!(wire["response"]["allowed"], false);
        assert_eq!(wire["response"]["status"]["code"], 403);

        let ok = review(
            "SandboxProfile",
            "CREATE",
            "alice",
            profile_object("team-a"),
            Value::Null,
        );
        let out = webhook().review_sandbox_profile(&ok);
        assert!(out.allowed);
        assert_eq!(out.result, Status::default());
    }

    #[test]
    fn unreadable_or_misrouted_objects_are_refused_with_a_reason() {
        let req = review(
            "MemoryPolicy",
            "CREATE",
            "alice",
            profile_object("team-a"),
            Value::Null,
        );
        let out = webhook().review_sandbox_profile(&req);
        assert!(!out.allowed);
        assert!(
            out.result
                .message
                .contains("validates SandboxProfile, not MemoryPolicy")
        );

        let broken = json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "MemoryPolicy",
            "metadata": {"name": "obj"}, "spec": {"agentSelector": "everyone"}});
        let req = review("MemoryPolicy", "CREATE", "alice", broken, Value::Null);
        let out = webhook().review_memory_policy(&req);
        assert!(!out.allowed);
        assert_eq!(out.result.code, 422);
        assert!(
            out.result
                .message
                .contains("cannot be read as a MemoryPolicy")
        );
    }

    #[test]
    fn deletes_pass_through() {
        let req = review(
            "SandboxProfile",
            "DELETE",
            "alice",
            Value::Null,
            profile_object("team-b"),
        );
        assert!(webhook().review_sandbox_profile(&req).allowed);
    }

    #[test]
    fn memory_policy_review_uses_the_configured_deployment_policy() {
        let object = json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "MemoryPolicy",
            "metadata": {"name": "obj", "namespace": "team-a"},
            "spec": {"agentSelector": {"allAgents": true}, "writePolicy": "automatic_scoped"}});
        let req = review("MemoryPolicy", "CREATE", "alice", object, Value::Null);
        assert!(webhook().review_memory_policy(&req).allowed);
        let config = WebhookConfig::default();
        let strict = Webhook::new(config.clone(), Arc::new(Nothing));
        config.memory.set_deployment(
            crate::domain::memory::policy::DeploymentMemoryConfig::from_yaml_str(
                "maxWritePolicy: approval_for_sensitive\n",
            )
            .unwrap_or_else(|e| panic!("{e}")),
        );
        let out = strict.review_memory_policy(&req);
        assert!(!out.allowed);
        assert!(
            out.result
                .message
                .starts_with("spec.writePolicy: automatic_scoped is looser")
        );
    }

    #[tokio::test]
    async fn status_review_checks_the_requesting_user() {
        let binding = |generation: i64| {
            json!({"apiVersion": "harness-engine.dev/v1alpha1", "kind": "HarnessBinding",
                "metadata": {"name": "obj", "namespace": "team-a"},
                "spec": {"agentId": "a", "conversationId": "c",
                    "subjectRef": format!("hmac-sha256:{}", "0".repeat(64)),
                    "harness": {"id": "deepagents"}, "sandboxProfileRef": {"name": "p"}},
                "status": {"lease": {"generation": generation}}})
        };
        let req = review(
            "HarnessBinding",
            "UPDATE",
            "mallory",
            binding(2),
            binding(1),
        );
        let out = webhook().review_harness_binding_status(&req);
        assert!(!out.allowed);
        assert!(
            out.result
                .message
                .contains("\"mallory\" is not one of them")
        );
        let req = review(
            "HarnessBinding",
            "UPDATE",
            DEFAULT_OPERATOR_IDENTITY,
            binding(2),
            binding(1),
        );
        assert!(webhook().review_harness_binding_status(&req).allowed);

        // The spec path reads the profile: with none there, creation is refused.
        let req = review("HarnessBinding", "CREATE", "alice", binding(0), Value::Null);
        let out = webhook().review_harness_binding(&req).await;
        assert!(!out.allowed);
        assert!(
            out.result
                .message
                .contains("SandboxProfile \"p\" does not exist in namespace \"team-a\"")
        );
    }
}
