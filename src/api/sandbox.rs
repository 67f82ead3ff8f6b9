//! The subset of the Kubernetes Agent Sandbox API (v1beta1) that Harness Engine reads and
//! writes. Agent Sandbox owns these kinds and their CRDs; the fields below are the ones we
//! rely on, and every other field is left alone (we never replace these objects whole).
//!
//! - `SandboxClaim` (`extensions.agents.x-k8s.io`): we create one per lease generation,
//!   pointing at the profile's warm pool, owned by the HarnessBinding.
//! - `Sandbox` (`agents.x-k8s.io`): the claim's sandbox; we read its UID, Ready condition
//!   and pod, and set `operatingMode` to hibernate and resume it.
//! - `SandboxWarmPool`, `SandboxTemplate`: read by the profile controller.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// API group of `Sandbox`.
pub const SANDBOX_GROUP: &str = "agents.x-k8s.io";
/// API group of `SandboxClaim`, `SandboxWarmPool`, `SandboxTemplate`.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// Annotation a Sandbox carries when its pod has another name than the Sandbox.
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
/// Pod annotation (set in the SandboxTemplate) declaring the worker protocol version.
pub const PROTOCOL_VERSION_ANNOTATION: &str = "harness-engine.dev/worker-protocol-version";

/// A claim on one sandbox from a warm pool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    namespaced,
    status = "SandboxClaimStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    pub warm_pool_ref: NameRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NameRef {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, rename = "sandbox")]
    pub sandbox: Option<ClaimedSandbox>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    #[serde(default)]
    pub name: String,
}

/// A sandbox: one pod (and optionally volumes and a service) with a stable identity.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    namespaced,
    status = "SandboxStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// `Running` (default) or `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A pool of pre-created sandboxes from one template.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    #[serde(default)]
    pub replicas: Option<i32>,
    pub sandbox_template_ref: NameRef,
}

/// The pod template sandboxes are made from.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    pub pod_template: PodTemplate,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    pub spec: k8s_openapi::api::core::v1::PodSpec,
}

/// The `Ready` condition of an Agent Sandbox object is True.
pub fn is_ready(conditions: &[Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The sha256 digest of an image reference or a container status `imageID`
/// (`...@sha256:<64 hex>`), if it has one.
pub fn image_digest(image: &str) -> Option<&str> {
    let (_, digest) = image.rsplit_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then_some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_taken_only_from_pinned_references() {
        let d = "sha256:d82f458899c9696cb26a7c02d5568f81c8c8223f8661bb2a7988b269c8b9051e";
        assert_eq!(image_digest(&format!("busybox@{d}")), Some(d));
        assert_eq!(
            image_digest(&format!("docker.io/library/busybox@{d}")),
            Some(d)
        );
        assert_eq!(image_digest("busybox:latest"), None);
        assert_eq!(image_digest("busybox@sha256:abc"), None);
        assert_eq!(image_digest(&format!("busybox@{}", d.to_uppercase())), None);
    }
}
