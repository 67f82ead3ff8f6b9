//! Label and annotation keys that more than one component reads or writes: the
//! contract between the binding controller, the data plane and users. No IO.

/// Label on a HarnessBinding naming its store binding id (`hb_` and 32 hex digits, a
/// keyed digest of subject reference, agent and conversation). The binding controller
/// sets it; a data-plane bind sets it on the bindings it creates; the worker
/// authenticator and the bind find a conversation's binding through it.
pub const BINDING_ID_LABEL: &str = "harness-engine.dev/binding-id";

/// Annotation a client sets (any RFC 3339 time after the hibernation) to resume a
/// hibernated binding; a data-plane bind of a hibernated conversation does the same.
pub const RESUME_ANNOTATION: &str = "harness-engine.dev/resume-requested-at";
