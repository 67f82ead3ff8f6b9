//! Harness Engine: a Kubernetes operator that keeps the state of AI-agent harnesses
//! (thread-state heads, native state bodies, long-term memory, run ledgers, traces)
//! independent of the disposable sandbox pods they run in.
//!
//! Module map (dependencies point downwards only):
//! - [`api`]: the custom resource types and condition helpers. No IO.
//! - [`domain`]: pure rules (identities, scopes, fencing, limits, error codes). No IO.
//! - [`store`]: the state store traits and their SQLite and MongoDB backends.
//! - [`server`]: the data-plane HTTP API over the store traits.
//! - [`webhook`]: the validating admission webhook (validators, AdmissionReview router,
//!   TLS serving with certificate reload).
//! - [`telemetry`]: tracing and OpenTelemetry: span names, the attribute allowlist,
//!   trace-context ingress, the bounded scrubbing export path.

pub mod api;
pub mod domain;
pub mod mcp;
pub mod operator;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod webhook;
