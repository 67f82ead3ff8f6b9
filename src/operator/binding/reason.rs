//! Every condition and Event reason the HarnessBinding controller uses, in one enum.
//!
//! A reason is CamelCase and stable: it is the `reason` of a condition, the reason of an
//! Event, and the label of the `binding_waits` metric (Kubernetes API conventions; DESIGN
//! §3 for the lease). Each variant declares where it may appear ([`Use`]); the table
//! tests of `decide` check every plan against that declaration, and the reason tables of
//! `docs/operator.md` are rendered from it ([`render_docs`], drift-tested in `tests.rs`).
//! The error policy's categories (`InvalidSpec`, ...) live in `failure.rs`.

use super::{
    super::failure::STALLED, EFFECTS_SETTLED, HIBERNATED, PROFILE_ACCEPTED, READY, REPLACED,
    SANDBOX_READY, STATE_DURABLE, WORKER_VERIFIED,
};

/// Where a reason appears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// The reason of the condition type when it is `True`.
    True(&'static str),
    /// The reason of the condition type when it is `False`.
    False(&'static str),
    /// A Normal Event.
    Normal,
    /// A Warning Event.
    Warning,
    /// A wait counted by `harness_engine_operator_binding_waits_total`.
    Wait,
    /// Only named in an Event's message (the cause of a first lease).
    Message,
}

macro_rules! reasons {
    ($($variant:ident => [$($use:expr),* $(,)?], $meaning:literal;)*) => {
        /// A condition or Event reason of the binding controller.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $(#[doc = $meaning] $variant,)*
        }

        impl Reason {
            /// Every reason, in the order of the documentation table.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The CamelCase string users read.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => stringify!($variant),)*
                }
            }

            /// Where this reason may appear.
            pub fn uses(self) -> &'static [Use] {
                match self {
                    $(Reason::$variant => &[$($use),*],)*
                }
            }

            /// One sentence for the documentation.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Reason::$variant => $meaning,)*
                }
            }
        }
    };
}

use Use::{False, Message, Normal, True, Wait, Warning};

reasons! {
    LeaseReady => [True(READY), Normal],
        "the worker is verified and bound at the current lease generation";
    Claiming => [False(READY), False(WORKER_VERIFIED)],
        "a first lease: a sandbox is being claimed, no worker is bound yet";
    Replacing => [False(READY), Normal, Warning],
        "the lease generation was raised and a new worker is being bound; the Event names the cause (Warning unless the cause is routine: epoch clear, maximum lifetime)";
    Clearing => [False(READY)],
        "`spec.epoch` was raised: the old epoch's state is being deleted";
    Hibernated => [False(READY), Normal],
        "the lease hibernated after its idle TTL: its Sandbox is suspended (hibernation `suspend`) or its claim released (`release`); the next bind resumes it";
    MaxActiveLeasesReached => [False(READY), Warning, Wait],
        "the profile's `limits.maxActiveLeases` claims are held by other bindings: this generation's claim waits for one to end";
    Resuming => [False(READY), False(SANDBOX_READY), Normal],
        "a bind asked to resume a hibernated lease: the Sandbox runs again and a new worker is bound at a new generation";
    Releasing => [False(READY), Normal],
        "the binding is being deleted: its fence is raised past the last generation and its claims deleted";
    WorkerRejected => [False(READY)],
        "the worker of this generation failed verification (see `WorkerVerified`)";
    ProfileNotAccepted => [False(READY)],
        "the SandboxProfile does not accept this binding (see `ProfileAccepted`)";
    ClaimConflict => [False(READY), False(SANDBOX_READY)],
        "a SandboxClaim of this generation's name exists and is not owned by this binding";
    SandboxReady => [True(SANDBOX_READY)],
        "the lease's Sandbox and worker pod are Ready";
    ClaimNotReady => [False(SANDBOX_READY), Wait],
        "waiting for this generation's SandboxClaim (or the Sandbox it controls) to be Ready";
    ClaimDeleting => [False(SANDBOX_READY), Wait],
        "this generation's SandboxClaim is being deleted";
    SandboxNotReady => [False(SANDBOX_READY), Wait],
        "the claim is Ready but its Sandbox or worker pod is not (seen) Ready after the settle time";
    SandboxSettling => [Wait],
        "the claim turned Ready moments ago and its Sandbox or pod has not been seen Ready yet: waited for without a status write";
    ClaimingSlot => [Wait],
        "a binding without a lease was queued for a claiming slot (at most half of `--concurrency` start at once; woken in arrival order)";
    Suspended => [False(SANDBOX_READY)],
        "the Sandbox is suspended (hibernation)";
    Released => [False(SANDBOX_READY)],
        "the lease's claim was released after its idle TTL (hibernation `release`)";
    WorkerPodLost => [True(REPLACED), Warning],
        "the worker pod the lease verified was deleted or recreated: a new process is a new worker";
    SandboxLost => [True(REPLACED), Warning],
        "the lease's Sandbox is gone or was recreated with another UID";
    SandboxFailed => [True(REPLACED), Warning],
        "the lease's Sandbox is no longer Ready";
    ClaimLost => [True(REPLACED), Warning],
        "the lease's SandboxClaim is gone, being deleted, or was recreated";
    WorkerVerified => [True(WORKER_VERIFIED)],
        "every container's image digest and the protocol version are allowed by the profile";
    ImageDigestNotAllowed => [False(WORKER_VERIFIED), Warning],
        "a container runs an image digest the profile's `allowedWorkerImageDigests` does not list";
    WorkerImageUnknown => [False(WORKER_VERIFIED), Warning],
        "the pod reports no image digest by the claim readiness deadline";
    ProtocolVersionMissing => [False(WORKER_VERIFIED), Warning],
        "the pod has no `harness-engine.dev/worker-protocol-version` annotation";
    ProtocolVersionInvalid => [False(WORKER_VERIFIED), Warning],
        "the pod's protocol version annotation is not a number";
    ProtocolVersionNotAllowed => [False(WORKER_VERIFIED), Warning],
        "the pod speaks a protocol version the profile's `workerProtocolVersions` does not list";
    ProfileAccepted => [True(PROFILE_ACCEPTED)],
        "the profile exists, is enabled, Ready, and allows the binding's harness";
    ProfileNotFound => [False(PROFILE_ACCEPTED), True(STALLED), Warning],
        "`spec.sandboxProfileRef` names no SandboxProfile in the binding's namespace";
    ProfileDisabled => [False(PROFILE_ACCEPTED), True(STALLED), Warning],
        "the SandboxProfile is disabled";
    HarnessNotAllowed => [False(PROFILE_ACCEPTED), True(STALLED), Warning],
        "the SandboxProfile does not allow the binding's harness";
    ProfileNotReady => [False(PROFILE_ACCEPTED)],
        "the SandboxProfile is not Ready (its own `Ready` condition says why)";
    Accepted => [False(STALLED)],
        "the SandboxProfile accepts the binding, so it is not stalled on its profile (kstatus)";
    HeadCommitted => [True(STATE_DURABLE)],
        "the store's durable head is committed";
    NoTurnYet => [True(STATE_DURABLE)],
        "nothing is committed in this epoch yet";
    RunUncertain => [False(STATE_DURABLE)],
        "a run was marked uncertain after the durable head: it must be reconciled before the next turn";
    EffectsSettled => [True(EFFECTS_SETTLED)],
        "no effect of the epoch's run ledger waits with an unknown outcome";
    EffectOutcomeUnknown => [False(EFFECTS_SETTLED), Warning],
        "an effect's outcome is unknown, or reconciliation gave up on it: a person decides before anything retries it (docs/ledger.md)";
    IdleTTLReached => [True(HIBERNATED)],
        "the lease was idle for the profile's `idleTTL`";
    Resumed => [False(HIBERNATED), True(REPLACED)],
        "a hibernated lease was resumed by a bind (after a `release`, at a new generation on a new claim)";
    NotHibernated => [False(HIBERNATED)],
        "a new lease generation that is not hibernated";
    Initial => [Message],
        "the cause named in `LeaseStarted`: the binding's first lease";
    EpochCleared => [True(REPLACED)],
        "a fresh lease after the conversation was cleared into a new epoch";
    FenceAhead => [True(REPLACED)],
        "the store's fence was ahead of the lease generation (a restored store): the generation moved past it";
    ClaimMissing => [True(REPLACED)],
        "the lease named no claim";
    ClaimReadinessDeadlineExceeded => [True(REPLACED)],
        "the claim (or its worker) was not Ready within the profile's `claimReadinessDeadline`";
    MaxLifetimeReached => [True(REPLACED)],
        "the lease reached the profile's `maxLifetime`";
    LeaseStarted => [Normal],
        "the first lease generation of a binding (also names the claim it created)";
    Claimed => [Normal],
        "a SandboxClaim was created for the lease generation (when no lease Event told it)";
    ClaimReleased => [Normal],
        "a SandboxClaim of an older lease generation (or of a deleted binding) was deleted";
    ClearStarted => [Normal],
        "a clear into a new epoch started";
    ConversationCleared => [Normal],
        "the old epoch's state, heads, interrupts, objects and streams were deleted (memory untouched)";
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The condition types of a binding, with what `True` means, in documentation order.
const CONDITION_TYPES: &[(&str, &str)] = &[
    (READY, "the binding can take a turn"),
    (SANDBOX_READY, "the lease's Sandbox and pod are Ready"),
    (
        WORKER_VERIFIED,
        "image digest and protocol version accepted",
    ),
    (
        PROFILE_ACCEPTED,
        "the profile exists, is enabled, Ready and allows the harness",
    ),
    (STATE_DURABLE, "the latest turn is committed"),
    (
        EFFECTS_SETTLED,
        "no effect waits with an unknown outcome (the run ledger)",
    ),
    (
        REPLACED,
        "the current lease replaced an earlier one; the reason says why",
    ),
    (
        HIBERNATED,
        "the lease hibernated after its idle TTL (Sandbox suspended or claim released)",
    ),
    (
        STALLED,
        "kstatus: only a change to the profile or the binding cures it (the error policy's `InvalidSpec` too, see Failures)",
    ),
];

/// Where the generated tables go in `docs/operator.md`.
pub const DOCS_BEGIN: &str = "<!-- binding-reasons:begin (generated from src/operator/binding/reason.rs; regenerate: HARNESS_ENGINE_BLESS=1 cargo test --lib operator::binding::tests::docs) -->";
/// The end of the generated part.
pub const DOCS_END: &str = "<!-- binding-reasons:end -->";

fn list(reasons: impl Iterator<Item = Reason>) -> String {
    let all: Vec<String> = reasons.map(|r| format!("`{r}`")).collect();
    if all.is_empty() {
        "—".into()
    } else {
        all.join(", ")
    }
}

fn used_as(reason: Reason) -> String {
    let parts: Vec<String> = reason
        .uses()
        .iter()
        .map(|u| match u {
            True(t) => format!("`{t}=True`"),
            False(t) => format!("`{t}=False`"),
            Normal => "Event (Normal)".into(),
            Warning => "Event (Warning)".into(),
            Wait => "wait (metric)".into(),
            Message => "Event message".into(),
        })
        .collect();
    parts.join(", ")
}

/// The markdown between [`DOCS_BEGIN`] and [`DOCS_END`]: the conditions, then every
/// reason with where it appears and what it means.
pub fn render_docs() -> String {
    let mut out = String::new();
    out.push_str("| condition | True means | True reasons | False reasons |\n|---|---|---|---|\n");
    for &(type_, means) in CONDITION_TYPES {
        let with = |wanted: Use| {
            list(
                Reason::ALL
                    .iter()
                    .copied()
                    .filter(|r| r.uses().contains(&wanted)),
            )
        };
        let trues = with(True(type_));
        let falses = with(False(type_));
        out.push_str(&format!("| `{type_}` | {means} | {trues} | {falses} |\n"));
    }
    out.push_str("\n| reason | used as | meaning |\n|---|---|---|\n");
    for r in Reason::ALL {
        out.push_str(&format!("| `{r}` | {} | {} |\n", used_as(*r), r.meaning()));
    }
    out
}

/// The generated part of `doc` (between the markers), if it has one.
pub fn generated_part(doc: &str) -> Option<&str> {
    let start = doc.find(DOCS_BEGIN)? + DOCS_BEGIN.len();
    let end = doc[start..].find(DOCS_END)? + start;
    Some(doc[start..end].trim_matches('\n'))
}

/// `doc` with its generated part replaced by `table`.
pub fn with_generated_part(doc: &str, table: &str) -> Option<String> {
    let start = doc.find(DOCS_BEGIN)? + DOCS_BEGIN.len();
    let end = doc[start..].find(DOCS_END)? + start;
    Some(format!(
        "{}\n{}\n{}",
        &doc[..start],
        table.trim_end(),
        &doc[end..]
    ))
}
