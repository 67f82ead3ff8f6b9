//! Custom resource types of the `harness-engine.dev/v1alpha1` API, and the helpers that
//! every controller uses to keep their status conventional.
//!
//! This module performs no IO. The doc comments on the types below are user documentation:
//! they become the CRD descriptions that `kubectl explain` prints.

// kube's `printcolumn(...)` repeats `type_ = ...` once per column by design; clippy reads
// that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
pub mod binding;
pub mod conditions;
pub mod crds;
pub mod labels;
#[allow(clippy::duplicated_attributes)]
pub mod memory_policy;
#[allow(clippy::duplicated_attributes)]
pub mod profile;
pub mod sandbox;
mod schema;

pub use binding::{
    DurabilityStatus, HarnessBinding, HarnessBindingSpec, HarnessBindingStatus, HarnessId,
    HarnessSpec, Lease, Lifecycle, PendingInterruptSummary, StateProjection,
};
pub use labels::{BINDING_ID_LABEL, RESUME_ANNOTATION};
pub use memory_policy::{MemoryPolicy, MemoryPolicySpec, MemoryPolicyStatus};
pub use profile::{SandboxProfile, SandboxProfileSpec, SandboxProfileStatus};

/// API group of every kind Harness Engine owns.
pub const GROUP: &str = "harness-engine.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `kubectl get harness-engine` lists every kind we own.
pub const CATEGORY: &str = "harness-engine";
