//! Loading memory policy for `serve`: the deployment configuration
//! (`--memory-config FILE`, a [`DeploymentMemoryConfig`] in YAML or JSON) and
//! `MemoryPolicy` objects (`--memory-policy FILE`, repeatable, each file one or more
//! YAML documents in the same shape `kubectl apply` takes). In Kubernetes mode the
//! operator feeds the same [`crate::domain::memory::policy::SharedMemoryPolicies`]
//! from its watch instead.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    api::memory_policy::MemoryPolicy,
    domain::memory::policy::{DeploymentMemoryConfig, MemoryPolicySet, SharedMemoryPolicies},
};

#[derive(Debug, thiserror::Error)]
pub enum MemoryConfigError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

fn read(path: &Path) -> Result<String, MemoryConfigError> {
    std::fs::read_to_string(path).map_err(|source| MemoryConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The deployment memory configuration in `path`; the error names the file.
pub fn load_deployment(path: &Path) -> Result<DeploymentMemoryConfig, MemoryConfigError> {
    DeploymentMemoryConfig::from_yaml_str(&read(path)?).map_err(|message| {
        MemoryConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        }
    })
}

/// Builds the policy set from the files; every error names its file.
pub fn load(
    config: Option<&Path>,
    policies: &[PathBuf],
) -> Result<MemoryPolicySet, MemoryConfigError> {
    let deployment = match config {
        None => DeploymentMemoryConfig::default(),
        Some(path) => load_deployment(path)?,
    };
    let mut set = MemoryPolicySet {
        deployment,
        ..Default::default()
    };
    for path in policies {
        let objects: Vec<MemoryPolicy> =
            serde_saphyr::from_multiple(&read(path)?).map_err(|e| MemoryConfigError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
        for object in objects {
            let name = match (&object.metadata.namespace, &object.metadata.name) {
                (_, None) => {
                    return Err(MemoryConfigError::Invalid {
                        path: path.clone(),
                        message: "a MemoryPolicy needs metadata.name".into(),
                    });
                }
                (Some(ns), Some(name)) => format!("{ns}/{name}"),
                (None, Some(name)) => name.clone(),
            };
            if set.policies.insert(name.clone(), object.spec).is_some() {
                return Err(MemoryConfigError::Invalid {
                    path: path.clone(),
                    message: format!("MemoryPolicy {name} is defined twice"),
                });
            }
        }
    }
    Ok(set)
}

/// Re-reads the deployment memory configuration every `every` and swaps it in when its
/// text changed (a mounted ConfigMap changes under a running pod). An invalid file is
/// logged as an error naming it and changes nothing: the last valid configuration
/// stays in force. Runs until the process stops.
pub async fn watch_deployment(path: PathBuf, shared: SharedMemoryPolicies, every: Duration) {
    let mut last: Option<Vec<u8>> = None;
    loop {
        tokio::time::sleep(every).await;
        let now = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "reading the deployment memory configuration");
                continue;
            }
        };
        if last.as_ref() == Some(&now) {
            continue;
        }
        last = Some(now);
        match load_deployment(&path) {
            Ok(deployment) if deployment == shared.snapshot().deployment => {}
            Ok(deployment) => {
                shared.set_deployment(deployment);
                tracing::info!(path = %path.display(), "deployment memory configuration reloaded");
            }
            Err(error) => tracing::error!(
                %error,
                "the changed deployment memory configuration is invalid; the previous one stays in force"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_deployment_and_policies_and_names_bad_files() {
        let dir = tempfile_dir();
        let config = dir.join("memory.yaml");
        std::fs::write(
            &config,
            "organization: acme\napprovers: [reviewer]\nmaxWritePolicy: approval_for_sensitive\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let policy = dir.join("policies.yaml");
        std::fs::write(
            &policy,
            "apiVersion: harness-engine.dev/v1alpha1\nkind: MemoryPolicy\nmetadata: {name: support, namespace: agents}\nspec:\n  agentSelector: {agentIds: [support-bot]}\n  writePolicy: automatic_scoped\n---\napiVersion: harness-engine.dev/v1alpha1\nkind: MemoryPolicy\nmetadata: {name: rest}\nspec:\n  agentSelector: {allAgents: true}\n  enabled: false\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let set =
            load(Some(&config), std::slice::from_ref(&policy)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(set.deployment.organization.as_deref(), Some("acme"));
        let e = set.effective("support-bot");
        assert_eq!(e.policy.as_deref(), Some("agents/support"));
        assert_eq!(
            e.write_policy,
            crate::domain::memory::WritePolicy::ApprovalForSensitive,
            "the deployment ceiling wins"
        );
        assert!(!set.effective("other").enabled);

        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "organization: [\n").unwrap_or_else(|e| panic!("{e}"));
        let err = load(Some(&bad), &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("bad.yaml"), "{err}");
        std::fs::write(&bad, "retention: []\n").unwrap_or_else(|e| panic!("{e}"));
        let err = load(Some(&bad), &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("retention"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A changed file reaches the shared snapshot (the data plane and the webhook read
    /// the same one); an invalid change is ignored and the last valid one stays.
    #[tokio::test]
    async fn a_changed_configuration_is_reloaded_and_an_invalid_one_ignored() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("memory.yaml");
        std::fs::write(&path, "organization: acme\n").unwrap_or_else(|e| panic!("{e}"));
        let shared = SharedMemoryPolicies::default();
        shared.set_deployment(load_deployment(&path).unwrap_or_else(|e| panic!("{e}")));
        let task = tokio::spawn(watch_deployment(
            path.clone(),
            shared.clone(),
            Duration::from_millis(20),
        ));
        let settle = || tokio::time::sleep(Duration::from_millis(200));
        std::fs::write(&path, "organization: acme\napprovers: [reviewer]\n")
            .unwrap_or_else(|e| panic!("{e}"));
        settle().await;
        assert_eq!(shared.snapshot().deployment.approvers, ["reviewer"]);
        std::fs::write(&path, "approvers: reviewer: [\n").unwrap_or_else(|e| panic!("{e}"));
        settle().await;
        assert_eq!(
            shared.snapshot().deployment.approvers,
            ["reviewer"],
            "an invalid file changes nothing"
        );
        std::fs::write(&path, "").unwrap_or_else(|e| panic!("{e}"));
        settle().await;
        assert_eq!(
            shared.snapshot().deployment,
            DeploymentMemoryConfig::default(),
            "an emptied file is the defaults"
        );
        task.abort();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "he-memcfg-{}-{}",
            std::process::id(),
            crate::store::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    }
}
