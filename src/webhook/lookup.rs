//! How the webhook reads the objects a `HarnessBinding` references. In production that is
//! the API server through a [`kube::Client`] ([`KubeLookup`]); unit tests pass fixtures.

use async_trait::async_trait;
use kube::{Api, Client};
use thiserror::Error;

use crate::api::{MemoryPolicy, SandboxProfile};

/// Reading a referenced object failed (not "it does not exist": that is `Ok(None)`).
#[derive(Debug, Error)]
#[error("reading {kind} {namespace}/{name}: {message}")]
pub struct LookupError {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// Reads the objects a binding references, in the binding's namespace.
#[async_trait]
pub trait ObjectLookup: Send + Sync + 'static {
    async fn sandbox_profile(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SandboxProfile>, LookupError>;

    async fn memory_policy(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<MemoryPolicy>, LookupError>;
}

/// [`ObjectLookup`] against the API server. Needs `get` on `sandboxprofiles` and
/// `memorypolicies` in the namespaces it validates.
#[derive(Clone)]
pub struct KubeLookup {
    client: Client,
}

impl KubeLookup {
    pub fn new(client: Client) -> Self {
        KubeLookup { client }
    }
}

#[async_trait]
impl ObjectLookup for KubeLookup {
    async fn sandbox_profile(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SandboxProfile>, LookupError> {
        let api: Api<SandboxProfile> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| LookupError {
            kind: "SandboxProfile",
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: e.to_string(),
        })
    }

    async fn memory_policy(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<MemoryPolicy>, LookupError> {
        let api: Api<MemoryPolicy> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| LookupError {
            kind: "MemoryPolicy",
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: e.to_string(),
        })
    }
}
