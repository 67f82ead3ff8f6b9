//! The bind's decisions against an in-memory [`BindingObjects`]: the API server's
//! behaviour is reproduced only where a unit test cannot reach it (a create that loses a
//! race, a hand-made object under our name). The real API server is exercised by
//! `tests/operator_bind.rs`.

use std::sync::Mutex;

use serde_json::json;

use super::*;
use crate::domain::ids::Keyring;

#[derive(Default)]
struct Fake {
    objects: Mutex<BTreeMap<(String, String), HarnessBinding>>,
    profiles: Vec<SandboxProfile>,
    /// `find` sees nothing and `create` answers AlreadyExists: another replica won.
    lose_race_to: Option<HarnessBinding>,
    creates: Mutex<usize>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait]
impl ObjectLookup for Fake {
    async fn sandbox_profile(
        &self,
        _namespace: &str,
        name: &str,
    ) -> Result<Option<SandboxProfile>, LookupError> {
        Ok(self.profiles.iter().find(|p| p.name_any() == name).cloned())
    }
    async fn memory_policy(
        &self,
        _namespace: &str,
        _name: &str,
    ) -> Result<Option<MemoryPolicy>, LookupError> {
        Ok(None)
    }
}

#[async_trait]
impl BindingObjects for Fake {
    fn watched_namespace(&self) -> Option<&str> {
        None
    }
    async fn find(
        &self,
        namespace: &str,
        id: &BindingId,
    ) -> Result<Vec<HarnessBinding>, ObjectError> {
        Ok(lock(&self.objects)
            .iter()
            .filter(|((ns, _), b)| {
                ns == namespace
                    && b.labels().get(BINDING_ID_LABEL).map(String::as_str) == Some(id.as_str())
            })
            .map(|(_, b)| b.clone())
            .collect())
    }
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<HarnessBinding>, ObjectError> {
        if let Some(winner) = &self.lose_race_to {
            return Ok(Some(winner.clone()));
        }
        Ok(lock(&self.objects)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }
    async fn create(
        &self,
        namespace: &str,
        binding: &HarnessBinding,
    ) -> Result<HarnessBinding, ObjectError> {
        if self.lose_race_to.is_some() {
            return Err(ObjectError::AlreadyExists);
        }
        let key = (namespace.to_owned(), binding.name_any());
        let mut objects = lock(&self.objects);
        if objects.contains_key(&key) {
            return Err(ObjectError::AlreadyExists);
        }
        *lock(&self.creates) += 1;
        let mut created = binding.clone();
        created.metadata.uid = Some(format!("uid-{}", objects.len() + 1));
        objects.insert(key, created.clone());
        Ok(created)
    }
    async fn request_resume(&self, _: &str, _: &str, _: &str) -> Result<(), ObjectError> {
        Ok(())
    }
}

fn profile(name: &str, harnesses: &[&str]) -> SandboxProfile {
    let mut spec = crate::webhook::profile::tests::profile_spec();
    spec.allowed_harness_ids = harnesses
        .iter()
        .map(|h| serde_json::from_value(json!(h)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    SandboxProfile::new(name, spec)
}

fn wanted(subject: &str, profile: Option<&str>) -> Wanted {
    let keyring = Keyring::new(b"binding-objects-test-key-0123456789".to_vec(), "test")
        .unwrap_or_else(|e| panic!("{e}"));
    Wanted {
        namespace: "team-a".into(),
        id: keyring.binding_id(subject, "agent-1", "conv-1"),
        subject_ref: keyring.subject_ref(subject),
        agent_id: "agent-1".into(),
        conversation_id: "conv-1".into(),
        harness: HarnessId::DeepAgents,
        sandbox_profile: profile.map(str::to_owned),
        memory_policy: None,
        epoch: 0,
    }
}

fn fake() -> Fake {
    Fake {
        profiles: vec![profile("python-worker", &["deepagents"])],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_bind_creates_one_labelled_binding_named_after_its_id_and_a_repeat_returns_it() {
    let objects = fake();
    let want = wanted("user:alice", Some("python-worker"));
    let (first, created) = ensure_object(&objects, &want)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(created);
    assert_eq!(first.name_any(), object_name(&want.id));
    assert!(first.name_any().starts_with("hb-") && first.name_any().len() == 35);
    assert_eq!(
        first.labels().get(BINDING_ID_LABEL).map(String::as_str),
        Some(want.id.as_str())
    );
    assert_eq!(first.spec.subject_ref, want.subject_ref.as_str());
    assert_eq!(first.spec.sandbox_profile_ref.name, "python-worker");
    assert_eq!(first.spec.harness.id, HarnessId::DeepAgents);

    // A repeat, even without a profile, returns the same object and creates nothing.
    let (again, created) = ensure_object(&objects, &wanted("user:alice", None))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(!created);
    assert_eq!(again.uid(), first.uid());
    assert_eq!(*lock(&objects.creates), 1);
}

#[tokio::test]
async fn a_new_conversation_without_a_usable_profile_is_refused_and_nothing_is_created() {
    let objects = fake();
    let missing_field = ensure_object(&objects, &wanted("user:alice", None))
        .await
        .expect_err("no profile named");
    assert_eq!(missing_field.code, ErrorCode::Invalid);
    assert_eq!(missing_field.details["field"], "sandbox_profile");
    assert!(
        missing_field.message.contains("sandbox_profile"),
        "{}",
        missing_field.message
    );

    let absent = ensure_object(&objects, &wanted("user:alice", Some("no-such-profile")))
        .await
        .expect_err("profile does not exist");
    assert_eq!(absent.code, ErrorCode::Invalid);
    assert!(
        absent
            .message
            .contains("\"no-such-profile\" does not exist in namespace \"team-a\""),
        "{}",
        absent.message
    );
    assert_eq!(absent.details["violations"][0]["field"], "sandbox_profile");

    let mut strands = wanted("user:alice", Some("python-worker"));
    strands.harness = HarnessId::Strands;
    let refused = ensure_object(&objects, &strands)
        .await
        .expect_err("harness not allowed");
    assert_eq!(refused.details["violations"][0]["field"], "harness");
    assert!(
        refused
            .message
            .contains("does not allow harness \"strands\""),
        "{}",
        refused.message
    );
    assert!(lock(&objects.objects).is_empty());
}

#[tokio::test]
async fn losing_a_create_race_returns_the_winners_binding_of_the_same_conversation() {
    let want = wanted("user:alice", Some("python-worker"));
    let mut winner = desired(&want, "python-worker");
    winner.metadata.uid = Some("winner".into());
    let objects = Fake {
        lose_race_to: Some(winner),
        ..fake()
    };
    let (got, created) = ensure_object(&objects, &want)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(!created, "the other replica created it");
    assert_eq!(got.uid().as_deref(), Some("winner"));

    // A hand-made object under our name that holds someone else's conversation.
    let mut foreign = desired(&wanted("user:bob", Some("python-worker")), "python-worker");
    foreign.metadata.name = Some(object_name(&want.id));
    let objects = Fake {
        lose_race_to: Some(foreign),
        ..fake()
    };
    let err = ensure_object(&objects, &want)
        .await
        .expect_err("another conversation");
    assert_eq!(err.code, ErrorCode::Conflict);
    assert!(!err.message.contains("user:bob"), "{}", err.message);
}

#[tokio::test]
async fn a_binding_being_deleted_is_a_conflict_to_retry() {
    let objects = fake();
    let want = wanted("user:alice", Some("python-worker"));
    let mut deleting = desired(&want, "python-worker");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    lock(&objects.objects).insert(("team-a".into(), object_name(&want.id)), deleting);
    let err = ensure_object(&objects, &want).await.expect_err("deleting");
    assert_eq!(err.code, ErrorCode::Conflict);
    assert!(err.message.contains("being deleted"), "{}", err.message);
}

#[test]
fn a_yaml_binding_is_found_by_its_label_and_ours_is_preferred() {
    let want = wanted("user:alice", Some("python-worker"));
    let mut yaml = desired(&want, "python-worker");
    yaml.metadata.name = Some("conversation-sample".into());
    assert_eq!(
        pick(vec![yaml.clone()], &want.id)
            .map(|b| b.name_any())
            .as_deref(),
        Some("conversation-sample")
    );
    let ours = desired(&want, "python-worker");
    assert_eq!(
        pick(vec![yaml, ours], &want.id).map(|b| b.name_any()),
        Some(object_name(&want.id))
    );
}

#[test]
fn only_a_hibernated_binding_is_asked_to_resume() {
    let want = wanted("user:alice", Some("python-worker"));
    let mut b = desired(&want, "python-worker");
    assert!(!needs_resume(&b));
    for (lifecycle, resume) in [
        (Lifecycle::Hibernated, true),
        (Lifecycle::Ready, false),
        (Lifecycle::Claiming, false),
    ] {
        b.status = Some(crate::api::HarnessBindingStatus {
            lifecycle: Some(lifecycle),
            ..Default::default()
        });
        assert_eq!(needs_resume(&b), resume, "{lifecycle:?}");
    }
}

#[test]
fn reference_names_are_kubernetes_object_names() {
    for ok in ["python-worker", "a", "p.1"] {
        assert!(valid_object_name(ok), "{ok}");
    }
    for bad in ["", "Python", "-a", "a-", "a_b", &"a".repeat(254)] {
        assert!(!valid_object_name(bad), "{bad}");
    }
}

#[test]
fn api_server_answers_map_to_what_the_caller_can_do_about_them() {
    let status = |code: u16, reason: &str, message: &str| {
        kube::Error::Api(
            kube::core::Status {
                code,
                reason: reason.into(),
                message: message.into(),
                ..Default::default()
            }
            .boxed(),
        )
    };
    assert_eq!(
        kube_error(status(
            409,
            "AlreadyExists",
            "harnessbindings \"hb-1\" already exists"
        )),
        ObjectError::AlreadyExists
    );
    // The operator's own RBAC: a deployment fault, a 500 that says what to fix.
    let rbac = kube_error(status(
        403,
        "Forbidden",
        "harnessbindings is forbidden: User \"system:serviceaccount:x:harness-engine\" cannot create resource",
    ));
    assert!(matches!(rbac, ObjectError::NotPermitted(_)), "{rbac:?}");
    let err = object_failed(rbac);
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(
        err.message.contains("create on harnessbindings"),
        "{}",
        err.message
    );
    // An admission webhook's or CEL's refusal: the request's fault, 422.
    for (code, message) in [
        (
            403,
            "admission webhook \"bindings.harness-engine.dev\" denied the request: SandboxProfile \"p\" is disabled",
        ),
        (
            422,
            "HarnessBinding.harness-engine.dev \"hb-1\" is invalid: spec.epoch: Invalid value",
        ),
    ] {
        let err = object_failed(kube_error(status(code, "Invalid", message)));
        assert_eq!(err.code, ErrorCode::Invalid, "{message}");
        assert!(err.message.contains(message), "{}", err.message);
    }
    let err = object_failed(kube_error(status(500, "InternalError", "etcd timeout")));
    assert_eq!(err.code, ErrorCode::Unavailable);
    assert_eq!(err.retry_after_s, Some(1));
}
