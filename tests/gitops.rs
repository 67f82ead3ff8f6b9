//! GitOps health (issue 13, item 6): what Argo CD, kstatus and Flux say about our three
//! kinds, checked on real objects.
//!
//! The real operator runs against the local control plane (real API server, the real
//! Agent Sandbox controller, kwok running the pods) and drives HarnessBindings,
//! SandboxProfiles and MemoryPolicies into each state users meet: Ready, progressing
//! (a claim not Ready yet; a generation the operator has not observed), failed (a
//! refused profile, an invalid policy, a binding whose profile is missing), recovered
//! (the invalid policy fixed), suspended (a hibernated binding, a disabled profile) and
//! deleting (the finalizer holding the object). Each object is fetched with kubectl exactly as the tools see it and given to
//! `gitops-check` (`e2e/gitops`), which runs the Argo CD health Lua of
//! `deploy/gitops/argocd/health/` with gopher-lua, `status.Compute` of kstatus
//! (sigs.k8s.io/cli-utils) and the `healthCheckExprs` of
//! `deploy/gitops/flux/kustomization.yaml` with cel-go. Nothing is mocked. Two more
//! tests need no control plane: the `argocd-cm` snippet (file and docs) is the Lua, and
//! the example manifests decode into Flux's API types and name paths that exist.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use common::{
    eventually, kubectl,
    operator::{Operator, OperatorOptions, apply_samples, drop_finalizers},
    repo_path,
};
use harness_engine::api::{HarnessBinding, Lifecycle, MemoryPolicy, SandboxProfile, conditions};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

/// Which typed API a condition wait reads.
#[derive(Clone, Copy)]
enum ApiOf {
    Profile,
    Policy,
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Builds (or finds in its cache) gitops-check; prints progress to the test's stderr.
fn gitops_check() -> PathBuf {
    let script = repo_path("e2e/gitops/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed", script.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// What the three tools say about one object.
#[derive(Debug, PartialEq, Eq)]
struct Health {
    argocd: String,
    kstatus: String,
    flux: String,
}

fn expect(argocd: &str, kstatus: &str, flux: &str) -> Health {
    Health {
        argocd: argocd.into(),
        kstatus: kstatus.into(),
        flux: flux.into(),
    }
}

/// Runs gitops-check on `objects`; returns its report for each, in order.
fn evaluate(check: &Path, objects: &[Value]) -> Vec<Value> {
    let mut child = Command::new(check)
        .arg("eval")
        .arg("--argocd")
        .arg(repo_path("deploy/gitops/argocd/health"))
        .arg("--flux")
        .arg(repo_path("deploy/gitops/flux/kustomization.yaml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gitops-check starts");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(&serde_json::to_vec(objects).expect("objects as JSON"))
            .expect("objects written");
    }
    let out = child.wait_with_output().expect("gitops-check runs");
    assert!(
        out.status.success(),
        "gitops-check: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("gitops-check prints JSON")
}

/// The object as `kubectl get -o json` shows it (status included): what Argo CD, Flux
/// and kstatus read.
fn fetch(ns: &str, resource: &str, name: &str) -> Value {
    let (ok, out, err) = kubectl(&["get", resource, name, "-n", ns, "-o", "json"]);
    assert!(ok, "kubectl get {resource} {name}: {err}");
    serde_json::from_str(&out).expect("kubectl prints JSON")
}

/// Fetches each `(resource, name, expected)`, evaluates them together and asserts the
/// three verdicts of each; the failure message shows every report and the objects.
fn assert_health(check: &Path, ns: &str, state: &str, cases: &[(&str, &str, Health)]) {
    let objects: Vec<Value> = cases.iter().map(|(r, n, _)| fetch(ns, r, n)).collect();
    let reports = evaluate(check, &objects);
    assert_eq!(reports.len(), cases.len());
    let mut wrong = Vec::new();
    for ((resource, name, want), report) in cases.iter().zip(&reports) {
        let got = Health {
            argocd: report["argocd"]["status"].as_str().unwrap_or("").into(),
            kstatus: report["kstatus"]["status"].as_str().unwrap_or("").into(),
            flux: report["flux"]["status"].as_str().unwrap_or("").into(),
        };
        if &got != want {
            wrong.push(format!("{resource}/{name}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{state}:\n{}\nreports: {}\nobjects: {}",
        wrong.join("\n"),
        serde_json::to_string_pretty(&reports).unwrap_or_default(),
        serde_json::to_string_pretty(&objects).unwrap_or_default()
    );
}

/// The objects the samples do not cover, one per state (applied as a user would).
fn extra_objects() -> String {
    let digest = "sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e";
    let subject = "hmac-sha256:5f0c6c8f3f5b0e1c2a9d4b7e8f6a1c3d2e4b5a6978c0d1e2f3a4b5c6d7e8f901";
    let template = std::fs::read_to_string(repo_path("config/samples/sandbox_template.yaml"))
        .expect("sample template")
        .replace("name: python-worker", "name: unschedulable")
        // The worker pod can run on no node: its claim never becomes Ready.
        .replace(
            "      serviceAccountName: harness-worker",
            "      nodeSelector:\n        harness-engine.dev/no-such-node: \"true\"\n      serviceAccountName: harness-worker",
        );
    format!(
        r#"{template}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: unschedulable
spec:
  replicas: 1
  sandboxTemplateRef:
    name: unschedulable
---
apiVersion: harness-engine.dev/v1alpha1
kind: SandboxProfile
metadata:
  name: unschedulable
spec:
  warmPoolRef: {{name: unschedulable}}
  allowedHarnessIds: [deepagents]
  allowedWorkerImageDigests: ["{digest}"]
  adapterVersion: "1.0.0"
  workerProtocolVersions: [1]
  egressPolicyClass: data-plane-only
  timeouts: {{claimReadinessDeadline: 30m, idleTTL: 30m, maxLifetime: 12h}}
---
apiVersion: harness-engine.dev/v1alpha1
kind: SandboxProfile
metadata:
  name: unlisted-image
spec:
  warmPoolRef: {{name: python-worker}}
  allowedHarnessIds: [deepagents]
  allowedWorkerImageDigests: ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]
  adapterVersion: "1.0.0"
  workerProtocolVersions: [1]
  egressPolicyClass: data-plane-only
---
apiVersion: harness-engine.dev/v1alpha1
kind: MemoryPolicy
metadata:
  name: unreadable-writes
spec:
  agentSelector: {{agentIds: [another-agent]}}
  readScopes: [user]
  writeScope: agent
  writePolicy: automatic_scoped
  kinds: [semantic]
---
apiVersion: harness-engine.dev/v1alpha1
kind: HarnessBinding
metadata:
  name: claiming
spec:
  agentId: research-assistant
  conversationId: conv-claiming
  subjectRef: {subject}
  harness: {{id: deepagents, contractVersion: 1}}
  sandboxProfileRef: {{name: unschedulable}}
  epoch: 0
---
apiVersion: harness-engine.dev/v1alpha1
kind: HarnessBinding
metadata:
  name: orphan
spec:
  agentId: research-assistant
  conversationId: conv-orphan
  subjectRef: {subject}
  harness: {{id: deepagents, contractVersion: 1}}
  sandboxProfileRef: {{name: no-such-profile}}
  epoch: 0
"#
    )
}

/// The Argo CD snippet users paste is generated from the Lua files, and the docs show
/// exactly that snippet.
#[test]
fn the_argocd_snippet_is_generated_from_the_lua_and_shown_in_the_docs() {
    let check = gitops_check();
    let out = Command::new(&check)
        .arg("argocd-cm")
        .arg("--argocd")
        .arg(repo_path("deploy/gitops/argocd/health"))
        .output()
        .expect("gitops-check runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8_lossy(&out.stdout).into_owned();
    let committed = std::fs::read_to_string(repo_path("deploy/gitops/argocd/argocd-cm.yaml"))
        .expect("argocd-cm.yaml");
    assert_eq!(
        committed, generated,
        "deploy/gitops/argocd/argocd-cm.yaml drifted from the Lua files: regenerate it with \
         `$(e2e/gitops/build.sh) argocd-cm --argocd deploy/gitops/argocd/health > deploy/gitops/argocd/argocd-cm.yaml` \
         and copy it into docs/install.md"
    );
    let docs = std::fs::read_to_string(repo_path("docs/install.md")).expect("docs/install.md");
    assert!(
        docs.contains(&format!("```yaml\n{committed}```")),
        "docs/install.md does not show deploy/gitops/argocd/argocd-cm.yaml verbatim"
    );
}

/// The example Flux objects decode strictly into Flux's own API types (a misspelt field
/// fails), the Applications carry what Argo CD requires, and every chart and kustomize
/// path they name exists here.
#[test]
fn the_example_manifests_are_valid_and_point_at_real_paths() {
    let out = Command::new(gitops_check())
        .arg("validate")
        .arg("--repo")
        .arg(repo_path(""))
        .output()
        .expect("gitops-check runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_reads_the_same_in_argocd_kstatus_and_flux() {
    let check = gitops_check();
    let client = common::client().await;
    common::install_our_crds(&client).await;
    let ns = common::TestNamespace::new(&client, "gitops").await;
    let nsn = ns.name.clone();
    let nsn = nsn.as_str();
    let dir = tempfile::tempdir().expect("tempdir");
    apply_samples(nsn);
    let extra = dir.path().join("extra.yaml");
    std::fs::write(&extra, extra_objects()).expect("extra objects");
    let (ok, out, err) = kubectl(&["apply", "-n", nsn, "-f", path_str(&extra)]);
    assert!(ok, "applying the extra objects: {out}{err}");

    let start = || {
        Operator::start(OperatorOptions {
            namespace: nsn,
            data_dir: &dir.path().join("data"),
            leader_lease_seconds: None,
            extra: vec![],
        })
    };
    let mut op = start();
    let bindings: Api<HarnessBinding> = Api::namespaced(client.clone(), nsn);
    let profiles: Api<SandboxProfile> = Api::namespaced(client.clone(), nsn);
    let policies: Api<MemoryPolicy> = Api::namespaced(client.clone(), nsn);

    // Each object reaches the state under test (read with the typed API first, so the
    // verdicts below are about a settled state, not a race).
    let lifecycle = |name: &'static str, want: Lifecycle| {
        let bindings = bindings.clone();
        async move {
            eventually(
                Duration::from_secs(120),
                &format!("binding {name} {want:?}"),
                || async {
                    let b = bindings.get_opt(name).await.ok()??;
                    let s = b.status.as_ref()?;
                    let settled = s.observed_generation == b.metadata.generation;
                    (settled && s.lifecycle == Some(want)).then_some(b)
                },
            )
            .await
        }
    };
    let ready = lifecycle("conversation-sample", Lifecycle::Ready).await;
    assert!(
        conditions::is_true(
            &ready.status.clone().unwrap_or_default().conditions,
            "Ready"
        ),
        "{ready:?}"
    );
    let claiming = lifecycle("claiming", Lifecycle::Claiming).await;
    assert!(
        claiming
            .status
            .as_ref()
            .and_then(|s| s.lease.as_ref())
            .is_some(),
        "the claiming binding holds a lease whose claim is not Ready: {claiming:?}"
    );
    lifecycle("orphan", Lifecycle::Failed).await;
    let condition_is = |api: ApiOf,
                        name: &'static str,
                        type_: &'static str,
                        reason: &'static str| {
        let (profiles, policies) = (profiles.clone(), policies.clone());
        async move {
            eventually(
                Duration::from_secs(60),
                &format!("{name}: {type_}=True ({reason})"),
                || async {
                    let conds = match api {
                        ApiOf::Profile => profiles.get_opt(name).await.ok()??.status?.conditions,
                        ApiOf::Policy => policies.get_opt(name).await.ok()??.status?.conditions,
                    };
                    let c = conditions::get(&conds, type_)?;
                    (c.status == "True" && c.reason == reason).then_some(())
                },
            )
            .await
        }
    };
    condition_is(ApiOf::Profile, "python-worker", "Ready", "Ready").await;
    condition_is(ApiOf::Profile, "unschedulable", "Ready", "Ready").await;
    condition_is(
        ApiOf::Profile,
        "unlisted-image",
        "Stalled",
        "ImageNotAllowed",
    )
    .await;
    condition_is(ApiOf::Policy, "research-assistant", "Ready", "Valid").await;
    condition_is(
        ApiOf::Policy,
        "unreadable-writes",
        "Stalled",
        "WriteScopeNotReadable",
    )
    .await;

    let (healthy, progressing, degraded) = (
        expect("Healthy", "Current", "Current"),
        expect("Progressing", "InProgress", "InProgress"),
        expect("Degraded", "Failed", "Failed"),
    );
    assert_health(
        &check,
        nsn,
        "ready, progressing and failed",
        &[
            ("harnessbinding", "conversation-sample", healthy),
            (
                "sandboxprofile",
                "python-worker",
                expect("Healthy", "Current", "Current"),
            ),
            (
                "memorypolicy",
                "research-assistant",
                expect("Healthy", "Current", "Current"),
            ),
            ("harnessbinding", "claiming", progressing),
            ("sandboxprofile", "unlisted-image", degraded),
            (
                "memorypolicy",
                "unreadable-writes",
                expect("Degraded", "Failed", "Failed"),
            ),
            // A missing profile is Stalled=True (ProfileNotFound): kstatus reads Failed.
            (
                "harnessbinding",
                "orphan",
                expect("Degraded", "Failed", "Failed"),
            ),
        ],
    );

    // Fixing the policy clears Stalled: it reads healthy again everywhere.
    policies
        .patch(
            "unreadable-writes",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"writeScope": "user"}})),
        )
        .await
        .expect("fix the policy");
    eventually(
        Duration::from_secs(60),
        "the fixed policy valid",
        || async {
            let p = policies.get_opt("unreadable-writes").await.ok()??;
            let s = p.status?;
            let stalled = conditions::get(&s.conditions, "Stalled")?;
            (s.observed_generation == p.metadata.generation
                && conditions::is_true(&s.conditions, "Ready")
                && stalled.status == "False")
                .then_some(())
        },
    )
    .await;
    assert_health(
        &check,
        nsn,
        "a fixed policy",
        &[(
            "memorypolicy",
            "unreadable-writes",
            expect("Healthy", "Current", "Current"),
        )],
    );

    // Suspended on purpose: a hibernated binding, a disabled profile. kstatus has no
    // such state and reads their Ready=False as InProgress; Flux's expressions count
    // them as current so a Kustomization does not wait for them.
    let idle_ttl = |ttl: &str| Patch::Merge(json!({"spec": {"timeouts": {"idleTTL": ttl}}}));
    profiles
        .patch("python-worker", &PatchParams::default(), &idle_ttl("2s"))
        .await
        .expect("short idle TTL");
    lifecycle("conversation-sample", Lifecycle::Hibernated).await;
    profiles
        .patch("python-worker", &PatchParams::default(), &idle_ttl("30m"))
        .await
        .expect("idle TTL back");
    profiles
        .patch(
            "unschedulable",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"enabled": false}})),
        )
        .await
        .expect("disable profile");
    eventually(Duration::from_secs(60), "profile disabled", || async {
        let p = profiles.get_opt("unschedulable").await.ok()??;
        let s = p.status?;
        let c = conditions::get(&s.conditions, "Ready")?;
        (s.observed_generation == p.metadata.generation && c.reason == "Disabled").then_some(())
    })
    .await;
    condition_is(ApiOf::Profile, "python-worker", "Ready", "Ready").await;
    assert_health(
        &check,
        nsn,
        "suspended",
        &[
            (
                "harnessbinding",
                "conversation-sample",
                expect("Suspended", "InProgress", "Current"),
            ),
            (
                "sandboxprofile",
                "unschedulable",
                expect("Suspended", "InProgress", "Current"),
            ),
        ],
    );

    // A generation the operator has not observed (it is stopped: the state a user sees
    // between a Git push and the next reconcile): progressing everywhere.
    op.stop();
    let merge = |v: Value| Patch::Merge(v);
    bindings
        .patch(
            "conversation-sample",
            &PatchParams::default(),
            &merge(json!({"spec": {"harness": {"options": {"recursionLimit": 51}}}})),
        )
        .await
        .expect("binding spec change");
    profiles
        .patch(
            "python-worker",
            &PatchParams::default(),
            &merge(json!({"spec": {"workloadClass": "standard"}})),
        )
        .await
        .expect("profile spec change");
    policies
        .patch(
            "research-assistant",
            &PatchParams::default(),
            &merge(json!({"spec": {"maxResults": 9}})),
        )
        .await
        .expect("policy spec change");
    assert_health(
        &check,
        nsn,
        "generation not observed",
        &[
            (
                "harnessbinding",
                "conversation-sample",
                expect("Progressing", "InProgress", "InProgress"),
            ),
            (
                "sandboxprofile",
                "python-worker",
                expect("Progressing", "InProgress", "InProgress"),
            ),
            (
                "memorypolicy",
                "research-assistant",
                expect("Progressing", "InProgress", "InProgress"),
            ),
        ],
    );

    // Deleting: the finalizer holds the binding until the operator releases its claim.
    let (ok, out, err) = kubectl(&[
        "delete",
        "harnessbinding",
        "conversation-sample",
        "-n",
        nsn,
        "--wait=false",
    ]);
    assert!(ok, "kubectl delete: {out}{err}");
    let held = bindings
        .get("conversation-sample")
        .await
        .expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some(), "{held:?}");
    assert_health(
        &check,
        nsn,
        "deleting",
        &[(
            "harnessbinding",
            "conversation-sample",
            expect("Progressing", "Terminating", "InProgress"),
        )],
    );

    // The operator back: the finalizer releases the claim and the binding goes.
    op = start();
    eventually(
        Duration::from_secs(90),
        "the deleted binding gone",
        || async {
            bindings
                .get_opt("conversation-sample")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    op.stop();
    drop_finalizers(nsn);
}
