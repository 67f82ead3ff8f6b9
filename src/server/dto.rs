//! Request and response bodies of the data-plane API, and their OpenAPI schemas.
//!
//! The domain types stay free of HTTP and OpenAPI concerns; these mirror them, field for
//! field where a client needs the value, and convert with `From`. Byte bodies inside JSON
//! travel as standard base64 with padding.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::{
    domain::state::{
        BindingRecord, Durability, DurableStateHead, PendingInterrupt, PendingStateRef,
        ResumeOutcome, RunOutcome, RunTerminal, UncertainRun,
    },
    store::{AppendOutcome, ObjectMeta, StoredEntry, StoredObject, StreamMeta},
};

/// A field the OpenAPI document publishes as an object: any other JSON value (an array,
/// a string, a number, `null`) is refused when present. Absent stays `null`.
pub fn json_object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(serde::de::Error::custom("expected a JSON object"))
    }
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Registered harness ids (the static harness registry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Harness {
    Deepagents,
    ClaudeAgentSdk,
    Strands,
    Agentcore,
}

impl Harness {
    pub fn as_str(self) -> &'static str {
        match self {
            Harness::Deepagents => "deepagents",
            Harness::ClaudeAgentSdk => "claude_agent_sdk",
            Harness::Strands => "strands",
            Harness::Agentcore => "agentcore",
        }
    }

    /// The codec a harness's adapter writes unless the request names another.
    pub fn default_codec(harness: &str) -> &'static str {
        match harness {
            "deepagents" => "langgraph-checkpoint-v1",
            "claude_agent_sdk" => "claude-session-v1",
            "strands" => "strands-session-v1",
            "agentcore" => "agentcore-session-v1",
            _ => "opaque-v1",
        }
    }
}

/// Create-or-get a binding for (authenticated subject, agent, conversation).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BindRequest {
    /// An existing agent id: 1 to 128 of `[A-Za-z0-9._:-]`, starting and ending alphanumeric.
    #[schema(example = "agent-support", min_length = 1, max_length = 128)]
    pub agent_id: String,
    /// An existing conversation id: 1 to 256 of `[A-Za-z0-9._:-]`, starting and ending alphanumeric.
    #[schema(example = "conv-2024-05-01-0001", min_length = 1, max_length = 256)]
    pub conversation_id: String,
    /// The harness that runs the conversation. Fixed when the binding is created.
    pub harness: Harness,
    /// Operator mode: the `SandboxProfile` (in the caller's namespace) the
    /// conversation's new `HarnessBinding` uses. Required when the conversation has no
    /// HarnessBinding yet; an existing one is returned as it is. `serve` checks the name
    /// and ignores it.
    #[serde(default)]
    #[schema(
        example = "python-worker",
        min_length = 1,
        max_length = 253,
        pattern = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        nullable = false
    )]
    pub sandbox_profile: Option<String>,
    /// Operator mode: the `MemoryPolicy` (in the caller's namespace) of a new
    /// HarnessBinding; without one the conversation gets no long-term memory. `serve`
    /// checks the name and ignores it.
    #[serde(default)]
    #[schema(
        example = "research-assistant",
        min_length = 1,
        max_length = 253,
        pattern = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        nullable = false
    )]
    pub memory_policy: Option<String>,
}

/// Operator mode: the conversation's `HarnessBinding` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct HarnessBindingRef {
    /// The caller's namespace.
    pub namespace: String,
    /// `hb-` and the binding id's 32 hex digits for bindings a bind created; a binding
    /// applied as YAML keeps its own name.
    #[schema(example = "hb-0123456789abcdef0123456789abcdef")]
    pub name: String,
    /// The object's `metadata.uid`.
    pub uid: String,
}

/// A binding: a conversation's identity and its current fence.
#[derive(Debug, Serialize, ToSchema)]
pub struct Binding {
    /// Opaque id, `hb_` and 32 hex digits: a keyed digest of environment, subject, agent and conversation.
    #[schema(example = "hb_0123456789abcdef0123456789abcdef")]
    pub binding_id: String,
    pub environment: String,
    pub agent_id: String,
    pub conversation_id: String,
    pub harness: String,
    /// Conversation epoch: send it as `Harness-Epoch`.
    pub epoch: u64,
    /// Current lease generation: send it as `Harness-Lease-Generation`.
    pub lease_generation: u64,
    pub created_at_ms: i64,
    /// Operator mode, on a bind: the conversation's HarnessBinding (`kubectl get hb
    /// <name>` shows its lease). Absent in `serve` mode and on reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub harness_binding: Option<HarnessBindingRef>,
}

impl From<BindingRecord> for Binding {
    fn from(r: BindingRecord) -> Self {
        Binding {
            binding_id: r.binding_id.to_string(),
            environment: r.environment,
            agent_id: r.agent_id,
            conversation_id: r.conversation_id,
            harness: r.harness,
            epoch: r.epoch,
            lease_generation: r.lease_generation,
            created_at_ms: r.created_at_ms,
            harness_binding: None,
        }
    }
}

/// A stored pending state payload.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingState {
    /// Pass it to `commit` as `state_id`.
    pub state_id: String,
    pub epoch: u64,
    pub codec: String,
    pub size: u64,
    /// `sha256:` and 64 hex digits of the body.
    pub content_digest: String,
}

impl From<PendingStateRef> for PendingState {
    fn from(p: PendingStateRef) -> Self {
        PendingState {
            state_id: p.state_id,
            epoch: p.epoch,
            codec: p.codec,
            size: p.size,
            content_digest: p.content_digest,
        }
    }
}

/// How the committing run ended.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Interrupted,
    Failed,
    Cancelled,
}

impl From<Outcome> for RunOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Completed => RunOutcome::Completed,
            Outcome::Interrupted => RunOutcome::Interrupted,
            Outcome::Failed => RunOutcome::Failed,
            Outcome::Cancelled => RunOutcome::Cancelled,
        }
    }
}

impl From<RunOutcome> for Outcome {
    fn from(o: RunOutcome) -> Self {
        match o {
            RunOutcome::Completed => Outcome::Completed,
            RunOutcome::Interrupted => Outcome::Interrupted,
            RunOutcome::Failed => Outcome::Failed,
            RunOutcome::Cancelled => Outcome::Cancelled,
        }
    }
}

/// Terminal metadata of a run: its outcome and a small opaque JSON object.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Terminal {
    pub outcome: Outcome,
    /// Bounded (64 KiB by default); never prompts or tool content.
    #[serde(default, deserialize_with = "json_object")]
    #[schema(value_type = Object)]
    pub metadata: Value,
}

impl From<RunTerminal> for Terminal {
    fn from(t: RunTerminal) -> Self {
        Terminal {
            outcome: t.outcome.into(),
            metadata: t.metadata,
        }
    }
}

/// Kind of a pending interrupt.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InterruptKind {
    FormInput,
    ToolApproval,
    /// A person decides an effect's outcome or approves its attempt (docs/ledger.md);
    /// the body names the effect (`idempotency_key`).
    EffectReview,
}

impl InterruptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InterruptKind::FormInput => "form_input",
            InterruptKind::ToolApproval => "tool_approval",
            InterruptKind::EffectReview => super::review::EFFECT_REVIEW,
        }
    }
}

/// The interrupt a run leaves waiting, committed with the head.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewInterrupt {
    /// Stable, opaque, unique within the binding epoch.
    pub interrupt_id: String,
    #[serde(rename = "type")]
    pub kind: InterruptKind,
    /// Parent/subagent path.
    #[serde(default)]
    pub namespace: Vec<String>,
    /// Decisions a resume may take, e.g. `approve`, `reject`, `edit`, `respond`.
    pub allowed_decisions: Vec<String>,
    /// Canonical prompt, fields or tool approvals, already redacted.
    #[serde(default, deserialize_with = "json_object")]
    #[schema(value_type = Object)]
    pub body: Value,
}

/// Commit a pending state as the new durable head.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitBody {
    /// From the pending write.
    pub state_id: String,
    /// The durable revision the run started from (0 before the first commit).
    pub expected_revision: u64,
    pub run_id: String,
    #[serde(default)]
    pub terminal: Option<Terminal>,
    /// The interrupt the run left waiting; absent clears any previous one.
    #[serde(default)]
    pub interrupt: Option<NewInterrupt>,
}

/// A pending interrupt.
#[derive(Debug, Serialize, ToSchema)]
pub struct Interrupt {
    pub interrupt_id: String,
    /// `form_input` or `tool_approval`.
    #[serde(rename = "type")]
    pub kind: String,
    pub run_id: String,
    pub namespace: Vec<String>,
    pub agent_id: String,
    pub allowed_decisions: Vec<String>,
    /// A resume must present this revision.
    pub revision: u64,
    pub created_at_ms: i64,
    #[schema(value_type = Object)]
    pub body: Value,
}

impl From<PendingInterrupt> for Interrupt {
    fn from(i: PendingInterrupt) -> Self {
        Interrupt {
            interrupt_id: i.interrupt_id,
            kind: i.kind,
            run_id: i.run_id,
            namespace: i.namespace,
            agent_id: i.agent_id,
            allowed_decisions: i.allowed_decisions,
            revision: i.revision,
            created_at_ms: i.created_at_ms,
            body: i.body,
        }
    }
}

/// A run whose durability is ambiguous; nothing commits under it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Uncertain {
    pub run_id: String,
    pub reason: String,
    pub marked_at_ms: i64,
}

impl From<UncertainRun> for Uncertain {
    fn from(u: UncertainRun) -> Self {
        Uncertain {
            run_id: u.run_id,
            reason: u.reason,
            marked_at_ms: u.marked_at_ms,
        }
    }
}

/// The durable head of a binding epoch.
#[derive(Debug, Serialize, ToSchema)]
pub struct Head {
    pub binding_id: String,
    pub epoch: u64,
    /// Monotonic, starting at 1; send it as `expected_revision` for the next commit.
    pub revision: u64,
    /// Fetch the body with `GET .../state/bodies/{state_id}`.
    pub state_id: String,
    pub codec: String,
    pub content_digest: String,
    pub size: u64,
    pub run_id: String,
    pub committed_at_ms: i64,
    pub lease_generation: u64,
    pub terminal: Option<Terminal>,
    pub interrupt: Option<Interrupt>,
    /// `committed` or `uncertain`.
    pub durability: String,
    pub uncertain_runs: Vec<Uncertain>,
}

impl From<DurableStateHead> for Head {
    fn from(h: DurableStateHead) -> Self {
        Head {
            binding_id: h.binding_id.to_string(),
            epoch: h.epoch,
            revision: h.revision,
            state_id: h.state_id,
            codec: h.codec,
            content_digest: h.content_digest,
            size: h.size,
            run_id: h.run_id,
            committed_at_ms: h.committed_at_ms,
            lease_generation: h.lease_generation,
            terminal: h.terminal.map(Into::into),
            interrupt: h.interrupt.map(Into::into),
            durability: match h.durability {
                Durability::Committed => "committed",
                Durability::Uncertain => "uncertain",
            }
            .to_owned(),
            uncertain_runs: h.uncertain_runs.into_iter().map(Into::into).collect(),
        }
    }
}

/// The head, or `null` before the first commit of the epoch.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeadResponse {
    pub head: Option<Head>,
}

/// Mark a run's durability uncertain (its output may have reached a user, its commit failed).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UncertainBody {
    pub run_id: String,
    /// Short machine-readable reason, e.g. `commit_timeout`; never model or tool content.
    #[schema(max_length = 256)]
    pub reason: String,
}

/// Runs currently marked uncertain.
#[derive(Debug, Serialize, ToSchema)]
pub struct UncertainRuns {
    pub uncertain_runs: Vec<Uncertain>,
}

/// Native object metadata.
#[derive(Debug, Serialize, ToSchema)]
pub struct Object {
    pub key: String,
    /// Starts at 1; +1 on every replace. Send it as `If-Match: "<version>"` to replace.
    pub version: u64,
    pub size: u64,
    pub content_digest: String,
    pub updated_at_ms: i64,
    /// Base64 body, when the listing asked for bodies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl From<ObjectMeta> for Object {
    fn from(m: ObjectMeta) -> Self {
        Object {
            key: m.key,
            version: m.version,
            size: m.size,
            content_digest: m.content_digest,
            updated_at_ms: m.updated_at_ms,
            body: None,
        }
    }
}

impl From<StoredObject> for Object {
    fn from(o: StoredObject) -> Self {
        let body = o.body.as_deref().map(b64);
        Object {
            body,
            ..o.meta.into()
        }
    }
}

/// A page of objects, keys in descending order.
#[derive(Debug, Serialize, ToSchema)]
pub struct ObjectList {
    pub objects: Vec<Object>,
    /// Pass as `before` to get the next page; absent on the last page.
    pub next_before: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: u64,
}

/// Names one object.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ObjectKeyQuery {
    /// Object key (may contain `/`).
    pub key: String,
}

/// Lists objects.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ObjectListQuery {
    /// Only keys starting with this (default: all).
    #[serde(default)]
    pub prefix: String,
    /// Only keys strictly below this one (the previous page's `next_before`).
    #[param(nullable = false)]
    pub before: Option<String>,
    /// Page size (default and maximum: the server's page limit).
    #[param(nullable = false, minimum = 1)]
    pub limit: Option<u32>,
    /// Include base64 bodies.
    #[serde(default)]
    pub with_bodies: bool,
}

/// Deletes objects by prefix.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ObjectDeleteQuery {
    /// Every object whose key starts with this is deleted. Must not be empty.
    pub prefix: String,
}

/// Names one stream.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Stream name (may contain `/`; `a/b` is a sub-stream of `a`).
    pub stream: String,
}

/// Reads a stream.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamLoadQuery {
    pub stream: String,
    /// Only entries with `seq` greater than this (default 0: from the start).
    #[serde(default)]
    pub after: u64,
    /// Page size (default and maximum: the server's page limit).
    #[param(nullable = false, minimum = 1)]
    pub limit: Option<u32>,
}

/// Lists streams.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamListQuery {
    /// Only streams whose name starts with this (default: all).
    #[serde(default)]
    pub prefix: String,
}

/// An entry to append.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewStreamEntry {
    /// Caller-chosen id (e.g. the SDK's entry uuid); an id the stream holds is skipped.
    pub id: String,
    /// Base64 body.
    pub body: String,
}

/// Entries to append, in order.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendBody {
    pub entries: Vec<NewStreamEntry>,
}

/// What an append did.
#[derive(Debug, Serialize, ToSchema)]
pub struct Appended {
    pub appended: u64,
    pub duplicates: u64,
    /// Highest sequence number in the stream after the append (0: empty).
    pub last_seq: u64,
}

impl From<AppendOutcome> for Appended {
    fn from(a: AppendOutcome) -> Self {
        Appended {
            appended: a.appended,
            duplicates: a.duplicates,
            last_seq: a.last_seq,
        }
    }
}

/// A stored entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEntry {
    pub seq: u64,
    pub id: String,
    /// Base64 body.
    pub body: String,
}

impl From<StoredEntry> for StreamEntry {
    fn from(e: StoredEntry) -> Self {
        StreamEntry {
            seq: e.seq,
            id: e.id,
            body: b64(&e.body),
        }
    }
}

/// A page of entries in `seq` order.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEntries {
    pub entries: Vec<StreamEntry>,
}

/// A stream in a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct Stream {
    pub name: String,
    pub entries: u64,
    pub last_seq: u64,
    pub updated_at_ms: i64,
}

impl From<StreamMeta> for Stream {
    fn from(s: StreamMeta) -> Self {
        Stream {
            name: s.name,
            entries: s.entries,
            last_seq: s.last_seq,
            updated_at_ms: s.updated_at_ms,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StreamList {
    pub streams: Vec<Stream>,
}

/// The pending interrupt, or `null`.
#[derive(Debug, Serialize, ToSchema)]
pub struct InterruptResponse {
    pub interrupt: Option<Interrupt>,
}

/// Answer a pending interrupt on the binding owner's behalf.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    pub interrupt_id: String,
    /// The interrupt's `revision`: a second resume of the same interrupt is refused.
    pub revision: u64,
    /// One of the interrupt's `allowed_decisions`.
    pub decision: String,
    /// Form values or edited arguments (bounded).
    #[serde(default, deserialize_with = "json_object")]
    #[schema(value_type = Object)]
    pub response: Value,
}

/// The recorded resume; a retry with the same `Idempotency-Key` returns it unchanged.
#[derive(Debug, Serialize, ToSchema)]
pub struct Resumed {
    pub interrupt_id: String,
    pub decision: String,
    pub revision: u64,
    pub resumed_at_ms: i64,
    #[schema(value_type = Object)]
    pub response: Value,
}

impl From<ResumeOutcome> for Resumed {
    fn from(r: ResumeOutcome) -> Self {
        Resumed {
            interrupt_id: r.interrupt_id,
            decision: r.decision,
            revision: r.revision,
            resumed_at_ms: r.resumed_at_ms,
            response: r.response,
        }
    }
}
