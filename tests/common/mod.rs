//! Shared plumbing for the tests that run against the local control plane started by
//! `e2e/scripts/with-control-plane.sh` (which `make test` uses). Each test works in a
//! throw-away namespace and deletes it when done, so tests can run twice and in parallel.
#![allow(dead_code)]

pub mod components;
pub mod lease_watch;
pub mod operator;
pub mod restarts;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::Namespace,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{conditions, wait::await_condition},
};

/// Values written by `e2e/scripts/up.sh` into its env file.
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub mongodb_uri: String,
    pub bin: PathBuf,
}

pub fn control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        let env_file = std::env::var("HARNESS_E2E_ENV").unwrap_or_else(|_| {
            panic!(
                "this test needs the local control plane: run it through `make test`, or `make e2e-up` \
                 and then `HARNESS_E2E_ENV=target/e2e/env cargo test`"
            )
        });
        let text = std::fs::read_to_string(&env_file).unwrap_or_else(|e| panic!("reading {env_file}: {e}"));
        let vars = parse_env(&text);
        let get = |k: &str| vars.get(k).cloned().unwrap_or_else(|| panic!("{env_file} has no {k}"));
        ControlPlane {
            kubeconfig: PathBuf::from(get("KUBECONFIG")),
            mongodb_uri: get("HARNESS_E2E_MONGODB_URI"),
            bin: PathBuf::from(get("HARNESS_E2E_BIN")),
        }
    })
}

/// Parses `export KEY=VALUE` / `KEY=VALUE` lines, with optional quotes.
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_owned(),
                v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned(),
            )
        })
        .collect()
}

pub async fn client() -> Client {
    let cp = control_plane();
    let kubeconfig = Kubeconfig::read_from(&cp.kubeconfig).expect("kubeconfig readable");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig valid");
    Client::try_from(config).expect("client")
}

/// Runs the control plane's own kubectl; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str]) -> (bool, String, String) {
    let cp = control_plane();
    let out = Command::new(cp.bin.join("kubectl"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Installs the committed CRDs (what a user installs) and waits until they are served.
pub async fn install_our_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = repo_path("crds");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("crds/")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("crd file");
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect("crd yaml");
        let name = crd.metadata.name.clone().expect("crd name");
        api.patch(
            &name,
            &PatchParams::apply("harness-engine-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("{name} not established within 30s"))
        .expect("watch");
    }
}

/// A namespace that is deleted when the test ends (pass or fail).
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    pub async fn new(client: &Client, prefix: &str) -> Self {
        let name = format!("{prefix}-{:08x}", rand_u32());
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": {"harness-engine.dev/test": "true"}}}))
            .expect("namespace");
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        TestNamespace { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup_blocking("test namespace", move |client| async move {
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// A ValidatingWebhookConfiguration the test registered: deleted when the test ends,
/// pass or fail (cluster-scoped, it outlives the test namespace).
pub struct WebhookRegistration {
    pub name: String,
}

impl Drop for WebhookRegistration {
    fn drop(&mut self) {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        let name = self.name.clone();
        cleanup_blocking("webhook configuration", move |client| async move {
            let _ = Api::<ValidatingWebhookConfiguration>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// Runs `cleanup` from a `Drop` (which cannot be async) and waits for it, at most 30 s.
///
/// It gets a client and a runtime of its own on a helper thread. Driving the test's
/// runtime from inside that runtime's own drop deadlocks: its client's connection tasks
/// only run when the blocked thread polls them, so a delete through the test's client
/// never completes (a test hung this way until CI's time limit).
pub fn cleanup_blocking<F, Fut>(what: &str, cleanup: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let what = what.to_owned();
    let joined = std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => return eprintln!("cleanup of {what}: no runtime: {e}"),
        };
        runtime.block_on(async move {
            let work = async move { cleanup(client().await).await };
            if tokio::time::timeout(Duration::from_secs(30), work)
                .await
                .is_err()
            {
                eprintln!("cleanup of {what} did not finish within 30 s; left behind");
            }
        });
    })
    .join();
    if joined.is_err() {
        eprintln!("cleanup thread panicked");
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u32
}

/// Polls `f` until it returns Some, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A ClusterRole and ClusterRoleBinding letting ServiceAccounts of `ns` (`backend`, or
/// those named) impersonate `user:alice` only; deleted on drop (cluster-scoped objects
/// outlive the test namespace).
pub struct Impersonation {
    name: String,
}

impl Impersonation {
    pub async fn create(client: &Client, name: &str, ns: &str) -> Self {
        Self::create_for(client, name, ns, &["backend"]).await
    }

    pub async fn create_for(client: &Client, name: &str, ns: &str, accounts: &[&str]) -> Self {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
            serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
        }
        let roles: Api<ClusterRole> = Api::all(client.clone());
        roles
            .create(&PostParams::default(), &from_json(serde_json::json!({"metadata": {"name": name}, "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["user:alice"]}]})))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let subjects: Vec<serde_json::Value> = accounts
            .iter()
            .map(|a| serde_json::json!({"kind": "ServiceAccount", "name": a, "namespace": ns}))
            .collect();
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        bindings
            .create(&PostParams::default(), &from_json(serde_json::json!({"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}, "subjects": subjects})))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Impersonation {
            name: name.to_owned(),
        }
    }
}

impl Drop for Impersonation {
    fn drop(&mut self) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let name = self.name.clone();
        cleanup_blocking("impersonation", move |client| async move {
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&name, &DeleteParams::default())
                .await;
            let _ = Api::<ClusterRole>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}
