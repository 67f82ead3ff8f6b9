//! AdmissionReview decoding and the webhook's validators: any bytes as an
//! AdmissionReview, and as the specs of the two kinds the webhook judges.
#![no_main]

use harness_engine::{
    api::{memory_policy::MemoryPolicySpec, profile::SandboxProfileSpec},
    domain::memory::policy::DeploymentMemoryConfig,
    webhook,
};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionReview},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(data) {
        let _: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    }
    if let Ok(spec) = serde_json::from_slice::<SandboxProfileSpec>(data) {
        let _ = webhook::profile::validate("fuzz", &spec);
    }
    if let Ok(spec) = serde_json::from_slice::<MemoryPolicySpec>(data) {
        let _ = webhook::memory::validate(&spec, &DeploymentMemoryConfig::default());
    }
});
