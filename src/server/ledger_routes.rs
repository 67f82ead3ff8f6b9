//! The run ledger over HTTP (`spec/002_6a0ddaf11b83bfe4.txt` §3, §5, §8.3, §10):
//! `/v1/bindings/{binding_id}/runs/...`. See docs/ledger.md.
//!
//! Every route is a worker call, with the access rules of the state routes: the
//! [`WorkerAccess`] extractor (shared with them) authenticates, confines the caller to its binding and
//! derives the fenced scope from `Harness-Epoch` and `Harness-Lease-Generation`; the
//! store's fence decides in the same atomic step as the append. The rules of an append
//! (vocabulary, payload bound and forbidden fields, effect rules, budgets, expected last
//! sequence) live in [`crate::domain::ledger`]; the handlers only shape requests and
//! answers, and count what happened in the ledger metrics ([`LedgerMetrics`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use axum::{Json, extract::State, http::StatusCode};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    AppState,
    authz::WorkerAccess,
    dto::json_object,
    error::{ApiError, ErrorCode},
    extract::{ApiJson, ApiQuery, IdempotencyKey},
    middleware::traced,
};
use crate::{
    api::profile::{BudgetLimits, Defence, LedgerPolicy},
    domain::{
        ids::BindingId,
        ledger::{
            self, AppendRequest, BindingMetrics, Budget, Budgets, EffectRecord, EffectStatus,
            EventType, LedgerEvent, LedgerState, NewEvent, RunMetrics, RunOutcomeKind, RunState,
            RunStatus, TurnUsage, Versions, Via,
        },
        memory::scan::redact,
        state::check_key,
    },
    store::ledger::{LedgerAppend, LedgerSnapshot},
    telemetry::spans::{self, Step, keys},
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(append_event, list_events))
        .routes(routes!(begin_run))
        .routes(routes!(read_run))
        .routes(routes!(read_effect))
        .routes(routes!(take_snapshot, read_snapshot))
        .routes(routes!(repair_ledger))
        .routes(routes!(memory_utility))
}

// ---------------------------------------------------------------------------------------
// Budgets: where an append's circuit breakers come from.

/// The ledger rules the server applies per binding: budgets (§10.1) and tool defences
/// (§5.2). The default budgets hold for every binding (`serve`: its `--budget-*` flags;
/// [`default_budgets`] otherwise); in operator mode every replica feeds in its
/// `SandboxProfile`s' `spec.ledger` ([`Self::set_profile`]) and which profile each
/// binding uses ([`Self::set_binding_profile`]), and an append is decided with the
/// binding's profile's limits over the default. Cheap to clone; every clone is the same
/// table.
#[derive(Clone, Default)]
pub struct LedgerBudgets(Arc<RwLock<BudgetTable>>);

#[derive(Default)]
struct BudgetTable {
    default: Budgets,
    /// `namespace/name` of a SandboxProfile -> its ledger rules.
    profiles: HashMap<String, LedgerPolicy>,
    /// Binding id -> `namespace/name` of its SandboxProfile.
    bindings: HashMap<String, String>,
}

/// What a binding's appends are decided with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BindingLedgerRules {
    pub budgets: Budgets,
    /// Tools whose every attempt needs a person's approval (`defence: none`).
    pub approval_tools: Vec<String>,
}

impl BindingLedgerRules {
    pub fn approval_required(&self, tool: &str) -> bool {
        self.approval_tools.iter().any(|t| t == tool)
    }
}

impl LedgerBudgets {
    pub fn new(default: Budgets) -> Self {
        LedgerBudgets(Arc::new(RwLock::new(BudgetTable {
            default,
            ..BudgetTable::default()
        })))
    }
    /// The budgets an append to `id` is decided with.
    pub fn for_binding(&self, id: &BindingId) -> Budgets {
        self.rules(id).budgets
    }
    /// Budgets and approval-gated tools of `id`: its profile's over the default.
    pub fn rules(&self, id: &BindingId) -> BindingLedgerRules {
        let table = self.0.read().unwrap_or_else(|p| p.into_inner());
        let policy = table
            .bindings
            .get(id.as_str())
            .and_then(|profile| table.profiles.get(profile));
        rules_of(table.default, policy)
    }
    pub fn default_budgets(&self) -> Budgets {
        self.0.read().unwrap_or_else(|p| p.into_inner()).default
    }
    /// A SandboxProfile's ledger rules (`None`: it sets none, or it is gone).
    pub fn set_profile(&self, key: &str, policy: Option<LedgerPolicy>) {
        let mut table = self.0.write().unwrap_or_else(|p| p.into_inner());
        match policy {
            Some(p) => table.profiles.insert(key.to_owned(), p),
            None => table.profiles.remove(key),
        };
    }
    /// Every profile at once (a watch's first list).
    pub fn replace_profiles(&self, profiles: HashMap<String, LedgerPolicy>) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).profiles = profiles;
    }
    /// Which profile (`namespace/name`) binding `id` uses (`None`: it is gone).
    pub fn set_binding_profile(&self, id: &str, profile: Option<String>) {
        let mut table = self.0.write().unwrap_or_else(|p| p.into_inner());
        match profile {
            Some(p) => table.bindings.insert(id.to_owned(), p),
            None => table.bindings.remove(id),
        };
    }
    /// Every binding at once (a watch's first list).
    pub fn replace_bindings(&self, bindings: HashMap<String, String>) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).bindings = bindings;
    }
}

/// The rules of a binding whose profile has `policy`: each limit the profile sets
/// replaces the default one, the others stay.
pub fn rules_of(default: Budgets, policy: Option<&LedgerPolicy>) -> BindingLedgerRules {
    let Some(policy) = policy else {
        return BindingLedgerRules {
            budgets: default,
            approval_tools: Vec::new(),
        };
    };
    let scope = |base: Budget, limits: Option<&BudgetLimits>| {
        let Some(l) = limits else { return base };
        let limit = |set: Option<i64>, base: Option<u64>| match set {
            Some(v) => Some(u64::try_from(v).unwrap_or(0)),
            None => base,
        };
        Budget {
            steps: limit(l.steps, base.steps),
            tokens: limit(l.tokens, base.tokens),
            cost_units: limit(l.cost_units, base.cost_units),
            irreversible: limit(l.irreversible_effects, base.irreversible),
        }
    };
    let budgets = policy.budgets.as_ref();
    BindingLedgerRules {
        budgets: Budgets {
            per_turn: scope(default.per_turn, budgets.and_then(|b| b.per_turn.as_ref())),
            per_run: scope(default.per_run, budgets.and_then(|b| b.per_run.as_ref())),
        },
        approval_tools: policy
            .tools
            .iter()
            .filter(|t| t.defence == Defence::None)
            .map(|t| t.name.clone())
            .collect(),
    }
}

/// The documented defaults (docs/ledger.md "Budgets"): a turn may append 1,000 events and
/// attempt 16 irreversible effects, a run 100,000 events and 256 irreversible effects;
/// tokens and cost units are unlimited unless configured (their units are the
/// deployment's).
pub fn default_budgets() -> Budgets {
    Budgets {
        per_turn: Budget {
            steps: Some(1_000),
            tokens: None,
            cost_units: None,
            irreversible: Some(16),
        },
        per_run: Budget {
            steps: Some(100_000),
            tokens: None,
            cost_units: None,
            irreversible: Some(256),
        },
    }
}

// ---------------------------------------------------------------------------------------
// Metrics (admin port).

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
    via: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// The ledger's counters on `/metrics` (docs/ledger.md "Metrics"). Counted by the
/// process that served the append; replays count nothing.
#[derive(Clone, Default)]
pub struct LedgerMetrics {
    events: Family<TypeLabels, Counter>,
    effect_outcomes: Family<OutcomeLabels, Counter>,
    unknown_waiting: Gauge,
    budget_refusals: Family<BudgetLabels, Counter>,
    loops: Counter,
    guardrails: Family<ResultLabels, Counter>,
}

impl LedgerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ledger_events",
            "Run ledger events appended, by type",
            self.events.clone(),
        );
        registry.register(
            "ledger_effect_outcomes",
            "Effect outcomes recorded, by outcome (confirmed, refused, unknown) and via (direct, reconciliation, human)",
            self.effect_outcomes.clone(),
        );
        registry.register(
            "ledger_unknown_effects_waiting",
            "Effects whose outcome is unknown or awaits a person, as changed by the appends this process served since it started",
            self.unknown_waiting.clone(),
        );
        registry.register(
            "ledger_budget_refusals",
            "Appends refused by a budget (circuit breaker), by budget",
            self.budget_refusals.clone(),
        );
        registry.register(
            "ledger_loops_detected",
            "Loop events: three identical effect intents in a row within a run",
            self.loops.clone(),
        );
        registry.register(
            "ledger_guardrail_evaluations",
            "Guardrail evaluations recorded, by result (pass, block, skip); coverage = (pass + block) / all",
            self.guardrails.clone(),
        );
    }

    pub(super) fn appended(&self, appended: &LedgerAppend) {
        if appended.replayed {
            return;
        }
        let event = &appended.event;
        self.events
            .get_or_create(&TypeLabels {
                r#type: event.event_type.as_str().to_owned(),
            })
            .inc();
        let p = &event.payload;
        let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default();
        let outcome = match event.event_type {
            EventType::EffectOutcomeObserved => {
                let via = if p.get("via").is_some() {
                    text("via")
                } else {
                    "direct"
                };
                Some((text("outcome"), via))
            }
            EventType::HumanReviewResolved if p.get("idempotency_key").is_some() => {
                Some((text("decision"), "human"))
            }
            _ => None,
        };
        if let Some((outcome, via)) = outcome {
            self.effect_outcomes
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_owned(),
                    via: via.to_owned(),
                })
                .inc();
        }
        if event.event_type == EventType::GuardrailEvaluated {
            self.guardrails
                .get_or_create(&ResultLabels {
                    result: text("result").to_owned(),
                })
                .inc();
        }
        if appended.signals.loop_detected {
            self.loops.inc();
        }
        self.unknown_waiting
            .inc_by(appended.signals.waiting_delta());
    }

    fn refused(&self, error: &ApiError) {
        if error.code == ErrorCode::BudgetExceeded {
            let budget = error
                .details
                .get("what")
                .and_then(Value::as_str)
                .unwrap_or_default();
            self.budget_refusals
                .get_or_create(&BudgetLabels {
                    budget: budget.to_owned(),
                })
                .inc();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Worker access.

fn span(step: Step, operation: &'static str, binding: &BindingId) -> tracing::Span {
    let span = spans::operation(step, operation);
    spans::record(&span, keys::BINDING_ID, binding.as_str());
    span
}

fn page_limit(state: &AppState, limit: Option<u32>) -> Result<usize, ApiError> {
    let max = state.config().limits.max_page;
    match limit {
        None => Ok(max),
        Some(0) => Err(ApiError::invalid("limit must be at least 1")),
        Some(n) => Ok((n as usize).min(max)),
    }
}

// ---------------------------------------------------------------------------------------
// Parameter documentation (read by the extractors).

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct BindingIdParam {
    /// Binding id (`hb_` and 32 hex digits).
    #[param(pattern = "^hb_[0-9a-f]{32}$")]
    binding_id: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct IdempotencyHeader {
    /// Client-chosen key, 1 to 255 visible ASCII characters. The same key with the same
    /// event returns the event recorded the first time; with another event it is
    /// `idempotency_mismatch`. Only a keyed digest is stored.
    #[param(rename = "Idempotency-Key", pattern = "^[!-~]{1,255}$")]
    key: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct FenceHeaders {
    /// The conversation epoch the worker runs in.
    #[param(rename = "Harness-Epoch", minimum = 0, example = 0)]
    epoch: u64,
    /// The lease generation the worker holds.
    #[param(rename = "Harness-Lease-Generation", minimum = 0, example = 1)]
    lease_generation: u64,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct SubjectParam {
    /// End-user subject the caller acts for (as on the state routes).
    #[param(
        rename = "Harness-Subject",
        min_length = 1,
        max_length = 256,
        nullable = false
    )]
    subject: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Bodies.

/// The vocabulary (§3.3, §5). There is no `ToolExecuted`: a worker records that it
/// attempted an effect and what it observed, never that the effect happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum EventKind {
    RunStarted,
    RunCompleted,
    ContextAssembled,
    GuardrailEvaluated,
    EffectAttempted,
    EffectOutcomeObserved,
    HumanReviewRequested,
    HumanReviewResolved,
    /// A superseding correction of a completed run's outcome.
    RunOutcomeCorrected,
    /// A child work item (the server mints `work_item_id`).
    #[serde(rename = "work_item_created")]
    WorkItemCreated,
    #[serde(rename = "work_item_started")]
    WorkItemStarted,
    #[serde(rename = "work_item_blocked")]
    WorkItemBlocked,
    #[serde(rename = "work_item_completed")]
    WorkItemCompleted,
    #[serde(rename = "work_item_failed")]
    WorkItemFailed,
    #[serde(rename = "work_item_abandoned")]
    WorkItemAbandoned,
    /// An artifact reference (the server mints `artifact_id`).
    #[serde(rename = "artifact_created")]
    ArtifactCreated,
    /// Memories selected from a signed recall receipt.
    #[serde(rename = "memory_recalled")]
    MemoryRecalled,
    #[serde(rename = "memory_applied")]
    MemoryApplied,
    #[serde(rename = "memory_rejected")]
    MemoryRejected,
    /// A workspace signal (run id `signals`): claim, extend the lease, acknowledge.
    #[serde(rename = "signal_claimed")]
    SignalClaimed,
    #[serde(rename = "signal_lease_extended")]
    SignalLeaseExtended,
    #[serde(rename = "signal_acked")]
    SignalAcked,
    /// Feedback on a memory of a signed recall (run id `memory`).
    #[serde(rename = "memory_feedback")]
    MemoryFeedback,
    /// A note on a memory (run id `memory`).
    #[serde(rename = "memory_annotated")]
    MemoryAnnotated,
    /// Acceptance criteria, evaluator and run configuration approved before success is
    /// judged (by a control-plane caller, not the run's sandbox worker).
    #[serde(rename = "verification_preflight_approved")]
    VerificationPreflightApproved,
    /// The preflight's evaluator's verdict; a `pass` answers with a verification receipt.
    #[serde(rename = "verification_evaluated")]
    VerificationEvaluated,
}

impl From<EventKind> for EventType {
    fn from(k: EventKind) -> Self {
        match k {
            EventKind::RunStarted => EventType::RunStarted,
            EventKind::RunCompleted => EventType::RunCompleted,
            EventKind::ContextAssembled => EventType::ContextAssembled,
            EventKind::GuardrailEvaluated => EventType::GuardrailEvaluated,
            EventKind::EffectAttempted => EventType::EffectAttempted,
            EventKind::EffectOutcomeObserved => EventType::EffectOutcomeObserved,
            EventKind::HumanReviewRequested => EventType::HumanReviewRequested,
            EventKind::HumanReviewResolved => EventType::HumanReviewResolved,
            EventKind::RunOutcomeCorrected => EventType::RunOutcomeCorrected,
            EventKind::WorkItemCreated => EventType::WorkItemCreated,
            EventKind::WorkItemStarted => EventType::WorkItemStarted,
            EventKind::WorkItemBlocked => EventType::WorkItemBlocked,
            EventKind::WorkItemCompleted => EventType::WorkItemCompleted,
            EventKind::WorkItemFailed => EventType::WorkItemFailed,
            EventKind::WorkItemAbandoned => EventType::WorkItemAbandoned,
            EventKind::ArtifactCreated => EventType::ArtifactCreated,
            EventKind::MemoryRecalled => EventType::MemoryRecalled,
            EventKind::MemoryApplied => EventType::MemoryApplied,
            EventKind::MemoryRejected => EventType::MemoryRejected,
            EventKind::SignalClaimed => EventType::SignalClaimed,
            EventKind::SignalLeaseExtended => EventType::SignalLeaseExtended,
            EventKind::SignalAcked => EventType::SignalAcked,
            EventKind::MemoryFeedback => EventType::MemoryFeedback,
            EventKind::MemoryAnnotated => EventType::MemoryAnnotated,
            EventKind::VerificationPreflightApproved => EventType::VerificationPreflightApproved,
            EventKind::VerificationEvaluated => EventType::VerificationEvaluated,
        }
    }
}

impl From<EventType> for EventKind {
    fn from(t: EventType) -> Self {
        match t {
            EventType::RunStarted => EventKind::RunStarted,
            EventType::RunCompleted => EventKind::RunCompleted,
            EventType::ContextAssembled => EventKind::ContextAssembled,
            EventType::GuardrailEvaluated => EventKind::GuardrailEvaluated,
            EventType::EffectAttempted => EventKind::EffectAttempted,
            EventType::EffectOutcomeObserved => EventKind::EffectOutcomeObserved,
            EventType::HumanReviewRequested => EventKind::HumanReviewRequested,
            EventType::HumanReviewResolved => EventKind::HumanReviewResolved,
            EventType::RunOutcomeCorrected => EventKind::RunOutcomeCorrected,
            EventType::WorkItemCreated => EventKind::WorkItemCreated,
            EventType::WorkItemStarted => EventKind::WorkItemStarted,
            EventType::WorkItemBlocked => EventKind::WorkItemBlocked,
            EventType::WorkItemCompleted => EventKind::WorkItemCompleted,
            EventType::WorkItemFailed => EventKind::WorkItemFailed,
            EventType::WorkItemAbandoned => EventKind::WorkItemAbandoned,
            EventType::ArtifactCreated => EventKind::ArtifactCreated,
            EventType::MemoryRecalled => EventKind::MemoryRecalled,
            EventType::MemoryApplied => EventKind::MemoryApplied,
            EventType::MemoryRejected => EventKind::MemoryRejected,
            EventType::SignalClaimed => EventKind::SignalClaimed,
            EventType::SignalLeaseExtended => EventKind::SignalLeaseExtended,
            EventType::SignalAcked => EventKind::SignalAcked,
            EventType::MemoryFeedback => EventKind::MemoryFeedback,
            EventType::MemoryAnnotated => EventKind::MemoryAnnotated,
            EventType::VerificationPreflightApproved => EventKind::VerificationPreflightApproved,
            EventType::VerificationEvaluated => EventKind::VerificationEvaluated,
        }
    }
}

/// The software that produced an event (§3.4); each at most 256 bytes.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VersionsBody {
    /// Payload schema, default `<type>/1`.
    #[schema(example = "EffectAttempted/1")]
    pub schema: String,
    #[schema(example = "scripted-model-1")]
    pub model: String,
    pub prompt: String,
    pub tools: String,
    pub policy: String,
}

impl From<VersionsBody> for Versions {
    /// The caller's versions; the reducer's is the server's to set.
    fn from(v: VersionsBody) -> Self {
        Versions {
            reducer: String::new(),
            schema: v.schema,
            model: v.model,
            prompt: v.prompt,
            tools: v.tools,
            policy: v.policy,
        }
    }
}

/// An event as a worker proposes it. The server mints `event_id`, `seq`, the Lamport
/// value (`max(seen, lamport) + 1`), `recorded_at_ms`, `intent_hash` and
/// `versions.reducer`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEventBody {
    #[serde(rename = "type")]
    pub event_type: EventKind,
    /// The run (1 to 256 printable bytes). `RunStarted` opens it; every other event
    /// needs it open.
    #[schema(example = "run-1", min_length = 1, max_length = 256)]
    pub run_id: String,
    #[schema(example = "turn-1", min_length = 1, max_length = 256)]
    pub turn_id: String,
    #[schema(example = "refunds.v3", min_length = 1, max_length = 256)]
    pub agent_id: String,
    /// The worker's Lamport clock, if it keeps one.
    #[serde(default)]
    #[schema(minimum = 0, nullable = false)]
    pub lamport: Option<u64>,
    #[serde(default)]
    pub versions: VersionsBody,
    /// Append only if the binding's last sequence is this one (0: the ledger is empty);
    /// otherwise `sequence_conflict` and nothing is appended.
    #[serde(default)]
    #[schema(minimum = 0, nullable = false)]
    pub expected_last_seq: Option<u64>,
    /// Compare-and-swap preconditions on the run (required for a governed-v2 event,
    /// `versions.schema` `<type>/2`): a mismatch appends nothing.
    #[serde(default)]
    #[schema(nullable = false)]
    pub preconditions: Option<PreconditionsBody>,
    /// The type's fields (docs/ledger.md "Vocabulary"), at most 32 KiB as canonical JSON.
    /// Fields holding raw transcripts or hidden reasoning are refused at any depth
    /// (`transcript`, `reasoning`, `Thought-Process`, `ANALYSIS`, `chain_of_thought`...);
    /// digests pass (`analysis_digest`); a stated rationale is `rationale`, never `why`.
    #[serde(deserialize_with = "json_object")]
    #[schema(value_type = Object)]
    pub payload: Value,
}

/// What the writer asserts about the run before its event is appended.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreconditionsBody {
    /// The sequence of the run's last event (`sequence_conflict` otherwise).
    #[schema(minimum = 0)]
    pub run_last_seq: u64,
    /// The status of the work item the event names (`pending`, `active`, `blocked`,
    /// `completed`, `failed`, `abandoned`), else of the run (`running`, `completed`);
    /// `conflict` otherwise.
    #[schema(example = "active", max_length = 32)]
    pub status: String,
}

/// Versions recorded with an event.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionsView {
    /// The reducer that folds this event (`ledger-reducer/1`).
    pub reducer: String,
    pub schema: String,
    pub model: String,
    pub prompt: String,
    pub tools: String,
    pub policy: String,
}

/// A recorded event: the envelope of §3.4 and the binding's sequence number.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    /// 1, 2, 3... per binding and epoch, without gaps.
    pub seq: u64,
    /// Server-minted, sortable by time: 26 Crockford base-32 characters.
    #[schema(example = "01JD8X4S3ZQ6G1W7KXN2Y5M0AB")]
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: EventKind,
    pub binding_id: String,
    pub epoch: u64,
    pub run_id: String,
    pub turn_id: String,
    pub agent_id: String,
    pub lamport: u64,
    pub recorded_at_ms: i64,
    /// `sha256:` over the type and the canonical payload.
    pub intent_hash: String,
    pub versions: VersionsView,
    #[schema(value_type = Object)]
    pub payload: Value,
}

impl From<LedgerEvent> for EventView {
    fn from(e: LedgerEvent) -> Self {
        EventView {
            seq: e.seq,
            event_id: e.event_id,
            event_type: e.event_type.into(),
            binding_id: e.binding_id,
            epoch: e.epoch,
            run_id: e.run_id,
            turn_id: e.turn_id,
            agent_id: e.agent_id,
            lamport: e.lamport,
            recorded_at_ms: e.recorded_at_ms,
            intent_hash: e.intent_hash,
            versions: VersionsView {
                reducer: e.versions.reducer,
                schema: e.versions.schema,
                model: e.versions.model,
                prompt: e.versions.prompt,
                tools: e.versions.tools,
                policy: e.versions.policy,
            },
            payload: e.payload,
        }
    }
}

/// Where an effect key stands.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EffectStatusView {
    /// Attempted, no outcome yet: the call may be in flight, or its worker died.
    Attempted,
    /// Landed: never attempt it again; `result` is what a replay returns.
    Confirmed,
    /// Did not land: a new attempt is allowed.
    Refused,
    /// Indeterminate: reconcile by key; neither success nor failure.
    Unknown,
    /// Reconciliation gave up: a person decides.
    AwaitingHuman,
    /// The tool has no defence against a repeat: a person approves the attempt first.
    AwaitingApproval,
    /// Approved; the next attempt may go ahead (and consumes the approval).
    Approved,
}

impl From<EffectStatus> for EffectStatusView {
    fn from(s: EffectStatus) -> Self {
        match s {
            EffectStatus::Attempted => EffectStatusView::Attempted,
            EffectStatus::Confirmed => EffectStatusView::Confirmed,
            EffectStatus::Refused => EffectStatusView::Refused,
            EffectStatus::Unknown => EffectStatusView::Unknown,
            EffectStatus::AwaitingHuman => EffectStatusView::AwaitingHuman,
            EffectStatus::AwaitingApproval => EffectStatusView::AwaitingApproval,
            EffectStatus::Approved => EffectStatusView::Approved,
        }
    }
}

/// Who observed an outcome.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ViaView {
    Direct,
    Reconciliation,
    Human,
}

impl From<Via> for ViaView {
    fn from(v: Via) -> Self {
        match v {
            Via::Direct => ViaView::Direct,
            Via::Reconciliation => ViaView::Reconciliation,
            Via::Human => ViaView::Human,
        }
    }
}

/// One effect key's record.
#[derive(Debug, Serialize, ToSchema)]
pub struct EffectView {
    pub idempotency_key: String,
    pub status: EffectStatusView,
    pub tool: String,
    /// The run and turn of the last attempt.
    pub run_id: String,
    pub turn_id: String,
    pub attempts: u64,
    pub irreversible: bool,
    pub last_attempt_seq: u64,
    /// The sequence of the last outcome or decision.
    pub outcome_seq: Option<u64>,
    pub via: Option<ViaView>,
    /// The recorded result of a confirmed outcome (the payload's `result`).
    pub result: Option<Value>,
}

fn effect_view(key: String, e: EffectRecord) -> EffectView {
    EffectView {
        idempotency_key: key,
        status: e.status.into(),
        tool: e.tool,
        run_id: e.run_id,
        turn_id: e.turn_id,
        attempts: e.attempts,
        irreversible: e.irreversible,
        last_attempt_seq: e.last_attempt_seq,
        outcome_seq: e.outcome_seq,
        via: e.via.map(Into::into),
        result: e.result,
    }
}

/// What an append did.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventAppended {
    /// The recorded event (on a replay, the one recorded the first time).
    pub event: EventView,
    /// `true`: an idempotent retry; nothing new was appended.
    pub replayed: bool,
    /// This append made three identical effect intents in a row (a loop event, §8.3).
    pub loop_detected: bool,
    /// The effect named by the payload's `idempotency_key`, after the append.
    pub effect: Option<EffectView>,
    /// The signal a signal event names, after the append (on a replay: as it stands).
    pub signal: Option<SignalView>,
    /// For a passing `verification_evaluated` that is the run's current evaluation: the
    /// server-minted receipt a governed-v2 `verified_success` presents as
    /// `verification_receipt`. Never stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification_receipt: Option<String>,
}

/// A workspace signal.
#[derive(Debug, Serialize, ToSchema)]
pub struct SignalView {
    pub signal_id: String,
    pub holder: String,
    /// Moves up by one with every claim; extend and acknowledge name it.
    pub fencing_token: u64,
    /// `held` or `acked`.
    pub state: String,
    pub lease_expires_at_ms: i64,
    pub acked_at_ms: Option<i64>,
    pub seq: u64,
}

fn signal_view(id: String, s: ledger::signal::SignalRecord) -> SignalView {
    SignalView {
        signal_id: id,
        holder: s.holder,
        fencing_token: s.fencing_token,
        state: match s.state {
            ledger::signal::SignalState::Held => "held",
            ledger::signal::SignalState::Acked => "acked",
        }
        .to_owned(),
        lease_expires_at_ms: s.lease_expires_at_ms,
        acked_at_ms: s.acked_at_ms,
        seq: s.seq,
    }
}

/// Usage counted against budgets.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageView {
    /// Events appended.
    pub steps: u64,
    pub tokens: u64,
    pub cost_units: u64,
    /// Attempts of effects marked irreversible.
    pub irreversible_effects: u64,
}

impl From<TurnUsage> for UsageView {
    fn from(u: TurnUsage) -> Self {
        UsageView {
            steps: u.steps,
            tokens: u.tokens,
            cost_units: u.cost_units,
            irreversible_effects: u.irreversible,
        }
    }
}

/// How a closed run ended (§8.3).
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcomeView {
    Resolved,
    PartiallyResolved,
    HandedToHuman,
    Abandoned,
    Failed,
    /// Without a verification receipt this reads as declared (`outcome_head.strength`
    /// `legacy_declared`).
    VerifiedSuccess,
    UserCorrected,
    Regression,
}

impl From<RunOutcomeKind> for RunOutcomeView {
    fn from(k: RunOutcomeKind) -> Self {
        match k {
            RunOutcomeKind::Resolved => RunOutcomeView::Resolved,
            RunOutcomeKind::PartiallyResolved => RunOutcomeView::PartiallyResolved,
            RunOutcomeKind::HandedToHuman => RunOutcomeView::HandedToHuman,
            RunOutcomeKind::Abandoned => RunOutcomeView::Abandoned,
            RunOutcomeKind::Failed => RunOutcomeView::Failed,
            RunOutcomeKind::VerifiedSuccess => RunOutcomeView::VerifiedSuccess,
            RunOutcomeKind::UserCorrected => RunOutcomeView::UserCorrected,
            RunOutcomeKind::Regression => RunOutcomeView::Regression,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatusView {
    Running,
    Completed,
}

/// Counts by result.
#[derive(Debug, Serialize, ToSchema)]
pub struct GuardrailCounts {
    pub passed: u64,
    pub blocked: u64,
    pub skipped: u64,
}

/// Outcome events recorded, by outcome.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeCounts {
    pub confirmed: u64,
    pub refused: u64,
    pub unknown: u64,
}

/// A run folded from its events by the recorded reducer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub status: RunStatusView,
    /// Set by `RunCompleted`.
    pub outcome: Option<RunOutcomeView>,
    pub started_seq: u64,
    pub last_seq: u64,
    pub events: u64,
    pub usage: UsageView,
    /// Usage per turn id.
    pub turns: BTreeMap<String, UsageView>,
    pub guardrails: GuardrailCounts,
    pub effects_attempted: u64,
    pub repeated_actions: u64,
    pub loops_detected: u64,
    pub outcomes: OutcomeCounts,
    pub human_reviews_requested: u64,
    /// The episode contract's part of the run (docs/mcp.md "Runs"): its work tree,
    /// artifact references and outcome head.
    pub episode: EpisodeView,
}

/// A run's work tree, artifacts and outcome head (`spec/003`).
#[derive(Debug, Serialize, ToSchema)]
pub struct EpisodeView {
    /// The run's root work item, when it was begun with one (`POST .../runs`).
    pub root_work_item_id: Option<String>,
    /// Work items by id.
    pub work_items: BTreeMap<String, WorkItemView>,
    /// Artifact references by server-minted id.
    pub artifacts: BTreeMap<String, ArtifactView>,
    /// When the first outcome was recorded (a correction never moves it).
    pub terminal_at_ms: Option<i64>,
    /// When the outcome head last moved.
    pub current_outcome_updated_at_ms: Option<i64>,
    pub outcome_head: Option<OutcomeHeadView>,
}

/// One work item.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkItemView {
    pub parent_work_item_id: Option<String>,
    /// `pending`, `active`, `blocked`, `completed`, `failed`, `abandoned`.
    pub status: String,
    pub created_seq: u64,
    pub updated_seq: u64,
}

/// An artifact reference.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactView {
    pub sha256: String,
    pub mime_type: String,
    pub uri: String,
    pub seq: u64,
}

/// The current outcome: the first one or its latest correction.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeHeadView {
    pub outcome: RunOutcomeView,
    /// `declared`, or `legacy_declared` for a `verified_success` without a receipt.
    pub strength: String,
    pub seq: u64,
    pub regression_of_run_id: Option<String>,
    pub corrections: u64,
}

impl From<ledger::Episode> for EpisodeView {
    fn from(e: ledger::Episode) -> Self {
        EpisodeView {
            root_work_item_id: e.root_work_item_id,
            work_items: e
                .work_items
                .into_iter()
                .map(|(id, w)| {
                    (
                        id,
                        WorkItemView {
                            parent_work_item_id: w.parent,
                            status: w.status.as_str().to_owned(),
                            created_seq: w.created_seq,
                            updated_seq: w.updated_seq,
                        },
                    )
                })
                .collect(),
            artifacts: e
                .artifacts
                .into_iter()
                .map(|(id, a)| {
                    (
                        id,
                        ArtifactView {
                            sha256: a.sha256,
                            mime_type: a.mime_type,
                            uri: a.uri,
                            seq: a.seq,
                        },
                    )
                })
                .collect(),
            terminal_at_ms: e.terminal_at_ms,
            current_outcome_updated_at_ms: e.current_outcome_updated_at_ms,
            outcome_head: e.outcome_head.map(|h| OutcomeHeadView {
                outcome: h.outcome.into(),
                strength: match h.strength {
                    ledger::OutcomeStrength::Declared => "declared",
                    ledger::OutcomeStrength::LegacyDeclared => "legacy_declared",
                    ledger::OutcomeStrength::Verified => "verified",
                }
                .to_owned(),
                seq: h.seq,
                regression_of_run_id: h.regression_of_run_id,
                corrections: h.corrections,
            }),
        }
    }
}

impl From<RunState> for RunView {
    fn from(r: RunState) -> Self {
        RunView {
            run_id: r.run_id,
            status: match r.status {
                RunStatus::Running => RunStatusView::Running,
                RunStatus::Completed => RunStatusView::Completed,
            },
            outcome: r.outcome.map(Into::into),
            started_seq: r.started_seq,
            last_seq: r.last_seq,
            events: r.events,
            usage: r.usage.into(),
            turns: r.turns.into_iter().map(|(k, u)| (k, u.into())).collect(),
            guardrails: GuardrailCounts {
                passed: r.guardrails_passed,
                blocked: r.guardrails_blocked,
                skipped: r.guardrails_skipped,
            },
            effects_attempted: r.actions,
            repeated_actions: r.repeated_actions,
            loops_detected: r.loops_detected,
            outcomes: OutcomeCounts {
                confirmed: r.outcomes_confirmed,
                refused: r.outcomes_refused,
                unknown: r.outcomes_unknown,
            },
            human_reviews_requested: r.human_reviews_requested,
            episode: r.episode.into(),
        }
    }
}

/// One bucket of memory budget utilisation (`ContextAssembled`'s `budget.used_tokens /
/// budget.limit_tokens`).
#[derive(Debug, Serialize, ToSchema)]
pub struct UtilisationBucket {
    /// Upper bound in per mille of the budget; `null`: over the budget.
    pub upper_permille: Option<u64>,
    pub count: u64,
}

/// A run's derived metrics (§8.3). Ratios are `null` when nothing was counted.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunMetricsView {
    pub guardrail_evaluations: u64,
    /// (passed + blocked) / (passed + blocked + skipped).
    pub guardrail_coverage: Option<f64>,
    /// Effect attempts whose intent hash was in the last 20 / all effect attempts.
    pub repeated_action_ratio: Option<f64>,
    pub loops_detected: u64,
    pub outcome: Option<RunOutcomeView>,
    pub effects_attempted: u64,
    pub tokens: u64,
    pub cost_units: u64,
    pub cost_per_attempted_effect: Option<f64>,
    pub context_utilisation: Vec<UtilisationBucket>,
}

impl From<RunMetrics> for RunMetricsView {
    fn from(m: RunMetrics) -> Self {
        RunMetricsView {
            guardrail_evaluations: m.guardrail_evaluations,
            guardrail_coverage: m.guardrail_coverage,
            repeated_action_ratio: m.repeated_action_ratio,
            loops_detected: m.loops_detected,
            outcome: m.outcome.map(Into::into),
            effects_attempted: m.effects_attempted,
            tokens: m.tokens,
            cost_units: m.cost_units,
            cost_per_attempted_effect: m.cost_per_attempted_effect,
            context_utilisation: m
                .context_utilisation
                .into_iter()
                .map(|(upper_permille, count)| UtilisationBucket {
                    upper_permille,
                    count,
                })
                .collect(),
        }
    }
}

/// The binding epoch's derived metrics over all of its runs (§8.3).
#[derive(Debug, Serialize, ToSchema)]
pub struct BindingMetricsView {
    pub runs: u64,
    pub runs_running: u64,
    pub resolved: u64,
    pub partially_resolved: u64,
    pub handed_to_human: u64,
    pub abandoned: u64,
    pub failed: u64,
    /// Resolved / completed runs.
    pub resolution_rate: Option<f64>,
    /// Cost units of completed runs / resolved runs.
    pub cost_per_resolved_outcome: Option<f64>,
    /// Cost units of completed runs / completed runs.
    pub cost_per_attempted_outcome: Option<f64>,
    /// Effects unknown or awaiting a person's decision.
    pub unknown_effects_waiting: u64,
    /// Effects attempted without an outcome yet.
    pub effects_in_flight: u64,
    /// Effects of tools without a defence waiting for a person to approve the attempt.
    pub approvals_waiting: u64,
    pub guardrail_coverage: Option<f64>,
    pub repeated_action_ratio: Option<f64>,
    pub loops_detected: u64,
}

impl From<BindingMetrics> for BindingMetricsView {
    fn from(m: BindingMetrics) -> Self {
        BindingMetricsView {
            runs: m.runs,
            runs_running: m.runs_running,
            resolved: m.resolved,
            partially_resolved: m.partially_resolved,
            handed_to_human: m.handed_to_human,
            abandoned: m.abandoned,
            failed: m.failed,
            resolution_rate: m.resolution_rate,
            cost_per_resolved_outcome: m.cost_per_resolved_outcome,
            cost_per_attempted_outcome: m.cost_per_attempted_outcome,
            unknown_effects_waiting: m.unknown_effects_waiting,
            effects_in_flight: m.effects_in_flight,
            approvals_waiting: m.approvals_waiting,
            guardrail_coverage: m.guardrail_coverage,
            repeated_action_ratio: m.repeated_action_ratio,
            loops_detected: m.loops_detected,
        }
    }
}

/// A run read (§3.5 state replay).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunRead {
    pub run_id: String,
    /// The binding's last sequence the state was folded to.
    pub last_seq: u64,
    /// The sequence the events start after (raised to the snapshot's with
    /// `from_snapshot=true`).
    pub after_seq: u64,
    /// The snapshot skipped to, if any.
    pub snapshot_seq: Option<u64>,
    /// This run's events with `after_seq < seq <= last_seq`, in order, one page.
    pub events: Vec<EventView>,
    /// Pass as `after_seq` for the next page; `null` when this page is the last.
    pub next_after_seq: Option<u64>,
    /// The run folded over all of its events.
    pub state: RunView,
    /// Effects this run attempted, by key.
    pub effects: BTreeMap<String, EffectView>,
    pub metrics: RunMetricsView,
    pub binding_metrics: BindingMetricsView,
    /// The health of the binding's ledger projections (the folded head this read was
    /// answered from).
    pub projection_health: ProjectionHealthView,
    /// `true` when the projections are degraded: run writes fail closed
    /// (`projection_degraded`) until `POST .../runs/repair`; this read still answers.
    pub degraded: bool,
}

/// A page of the binding's events.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub events: Vec<EventView>,
    /// Pass as `after_seq` for the next page; `null` when this page is the last.
    pub next_after_seq: Option<u64>,
}

/// The folded state of a binding's epoch.
#[derive(Debug, Serialize, ToSchema)]
pub struct LedgerStateView {
    pub last_seq: u64,
    pub lamport: u64,
    pub runs: BTreeMap<String, RunView>,
    pub effects: BTreeMap<String, EffectView>,
}

impl From<LedgerState> for LedgerStateView {
    fn from(s: LedgerState) -> Self {
        LedgerStateView {
            last_seq: s.last_seq,
            lamport: s.lamport,
            runs: s.runs.into_iter().map(|(k, r)| (k, r.into())).collect(),
            effects: s
                .effects
                .into_iter()
                .map(|(k, e)| (k.clone(), effect_view(k, e)))
                .collect(),
        }
    }
}

/// A stored snapshot: the folded state at `seq`. Read it, then the events after `seq`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotView {
    pub seq: u64,
    pub taken_at_ms: i64,
    pub state: LedgerStateView,
}

impl From<LedgerSnapshot> for SnapshotView {
    fn from(s: LedgerSnapshot) -> Self {
        SnapshotView {
            seq: s.seq,
            taken_at_ms: s.taken_at_ms,
            state: s.state.into(),
        }
    }
}

/// The latest snapshot, or `null` before the first.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotResponse {
    pub snapshot: Option<SnapshotView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Events with a greater sequence (default 0: from the first).
    after_seq: Option<u64>,
    /// Page size (default and maximum: the server's page bound, 1,000).
    #[param(minimum = 1)]
    limit: Option<u32>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct RunQuery {
    /// The run.
    run_id: String,
    /// This run's events with a greater sequence (default 0).
    after_seq: Option<u64>,
    /// Page size (default and maximum: 1,000).
    #[param(minimum = 1)]
    limit: Option<u32>,
    /// Start the events after the latest snapshot's sequence when that is later.
    from_snapshot: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EffectQuery {
    /// The effect's idempotency key.
    key: String,
}

// ---------------------------------------------------------------------------------------
// Handlers.

/// Redacts secrets in the string values of an attempt's `args` with the memory
/// pipeline's redactor, so the ledger never keeps a credential a tool was called with.
fn redact_args(payload: &mut Value) {
    fn walk(v: &mut Value) {
        match v {
            Value::String(s) => {
                let (clean, found) = redact(s);
                if found > 0 {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            Value::Object(map) => map.values_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(args) = payload.get_mut("args") {
        walk(args);
    }
}

/// Payload fields only the server sets, by event type: the handles it mints.
fn minted_field(event_type: EventType) -> Option<(&'static str, &'static str)> {
    match event_type {
        EventType::RunStarted => Some(("root_work_item_id", "wi_")),
        EventType::WorkItemCreated => Some(("work_item_id", "wi_")),
        EventType::ArtifactCreated => Some(("artifact_id", "art_")),
        _ => None,
    }
}

/// Refuses a caller-set handle and mints the event's own (a child work item, an
/// artifact) from the request's idempotency digest, so a retry names the same handle.
/// A root work item is minted only by `POST .../runs` (begin).
fn mint_into(
    state: &AppState,
    scope: &crate::domain::state::StateScope,
    event_type: EventType,
    idempotency: &str,
    run_id: &str,
    payload: &mut Value,
) -> Result<(), ApiError> {
    let Some((field, prefix)) = minted_field(event_type) else {
        return Ok(());
    };
    if payload.get(field).is_some() {
        return Err(ApiError::invalid(format!(
            "{} payload field `{field}` is minted by the server; leave it out",
            event_type.as_str()
        )));
    }
    if event_type == EventType::RunStarted {
        return Ok(());
    }
    let handle = state.keyring().mint_handle(
        prefix,
        &scope.binding_id,
        scope.epoch,
        &format!("{}/{run_id}", event_type.as_str()),
        idempotency,
    );
    if let Some(map) = payload.as_object_mut() {
        map.insert(field.to_owned(), Value::String(handle));
    }
    Ok(())
}

/// Append one event to the binding's ledger.
///
/// Fenced like every state write (`stale_lease`, `stale_epoch`), optionally on
/// `expected_last_seq` (`sequence_conflict`), idempotent by `Idempotency-Key`
/// (`idempotency_mismatch` for another event under the key), and decided against the
/// folded state: an attempt of a confirmed effect is `effect_confirmed` (its recorded
/// result in `details.effect.result`), of an unknown or in-flight one
/// `effect_unresolved`; an attempt of a tool whose `SandboxProfile` declares no defence
/// (`defence: none`) without an approval is `approval_required`; a circuit breaker is
/// `budget_exceeded` (`details.what`, `details.limit`, from the binding's profile over
/// the default); forbidden payload fields are `invalid`. A refusal appends nothing.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/runs/events", tag = "runs",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, SubjectParam),
    request_body = AppendEventBody,
    responses(
        (status = 201, description = "Appended", body = EventAppended),
        (status = 200, description = "An idempotent retry: the event recorded the first time", body = EventAppended),
    ))]
async fn append_event(
    State(state): State<AppState>,
    worker: WorkerAccess,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(body): ApiJson<AppendEventBody>,
) -> Result<(StatusCode, Json<EventAppended>), ApiError> {
    let sandbox_worker = worker.sandbox_worker();
    let WorkerAccess {
        record,
        scope,
        caller,
    } = worker;
    let event_type = EventType::from(body.event_type);
    if sandbox_worker && event_type == EventType::HumanReviewResolved {
        // A person's decision (an outcome or an approval) is relayed by a control-plane
        // service, as an interrupt's answer is: the worker that asked does not answer.
        return Err(ApiError::forbidden(
            "a sandbox worker cannot record a person's decision: HumanReviewResolved is appended by a control-plane service",
        ));
    }
    let mut payload = body.payload;
    if event_type == EventType::EffectAttempted {
        redact_args(&mut payload);
    }
    let idempotency = state
        .keyring()
        .idempotency_digest(&record.binding_id, "ledger.append", &key)
        .as_str()
        .to_owned();
    mint_into(
        &state,
        &scope,
        event_type,
        &idempotency,
        &body.run_id,
        &mut payload,
    )?;
    super::attribution::resolve(
        &state,
        &record,
        &scope,
        event_type,
        &body.run_id,
        &mut payload,
    )
    .await?;
    super::verification::resolve(
        &state,
        &caller,
        &scope,
        event_type,
        &body.run_id,
        &mut payload,
    )?;
    let rules = state.ledger_budgets().rules(&record.binding_id);
    let payload_tool = payload
        .get("tool")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let request = AppendRequest {
        event: NewEvent {
            event_type,
            run_id: body.run_id,
            turn_id: body.turn_id,
            agent_id: body.agent_id,
            lamport: body.lamport,
            versions: body.versions.into(),
            payload,
        },
        idempotency: Some(idempotency),
        expected_last_seq: body.expected_last_seq,
        budgets: rules.budgets,
        approval_required: event_type == EventType::EffectAttempted
            && payload_tool.is_some_and(|t| rules.approval_required(&t)),
        preconditions: body.preconditions.map(|p| ledger::RunPreconditions {
            run_last_seq: p.run_last_seq,
            status: p.status,
        }),
    };
    let (status, mut appended) = append(&state, &scope, &request).await?;
    if event_type == EventType::VerificationEvaluated {
        // A passing verdict earns a receipt (a retry gets it again while it is current).
        let head = state.store().ledger_state(&scope).await?;
        appended.verification_receipt = super::verification::mint(
            &state,
            &scope,
            &request.event.run_id,
            appended.event.seq,
            &head,
        );
    }
    Ok((status, Json(appended)))
}

/// One append through the store, counted in the ledger metrics, its answer shaped.
async fn append(
    state: &AppState,
    scope: &crate::domain::state::StateScope,
    request: &AppendRequest,
) -> Result<(StatusCode, EventAppended), ApiError> {
    let span = span(Step::ThreadStateWrite, "ledger.append", &scope.binding_id);
    let result = traced(span.clone(), state.store().append_event(scope, request)).await;
    let appended = match result {
        Ok(appended) => appended,
        Err(mut error) => {
            state.metrics().ledger().refused(&error);
            if error.code == ErrorCode::EffectConfirmed {
                // The short-circuit: hand back what the confirmed outcome recorded, so
                // the caller returns it instead of calling the tool again.
                if let Some(key) = error.details.get("idempotency_key").and_then(Value::as_str)
                    && let Ok(ledger) = state.store().ledger_state(scope).await
                    && let Some(effect) = ledger.effects.get(key)
                {
                    let view = effect_view(key.to_owned(), effect.clone());
                    error.details["effect"] = serde_json::to_value(view).unwrap_or(Value::Null);
                }
            }
            return Err(error);
        }
    };
    state.metrics().ledger().appended(&appended);
    spans::record_count(&span, keys::REVISION, appended.event.seq);
    let effect_key = appended
        .event
        .payload
        .get("idempotency_key")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let effect = match (appended.signals.effect.clone(), effect_key) {
        (Some(effect), Some(key)) => Some(effect_view(key, effect)),
        // A replay changed nothing: report the effect as it stands now.
        (None, Some(key)) => state
            .store()
            .ledger_state(scope)
            .await?
            .effects
            .remove(&key)
            .map(|e| effect_view(key, e)),
        _ => None,
    };
    let signal = match appended.signals.signal.clone() {
        Some((id, s)) => Some(signal_view(id, s)),
        None if appended.event.event_type.is_signal() => {
            let id = appended
                .event
                .payload
                .get("signal_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            state
                .store()
                .ledger_state(scope)
                .await?
                .signals
                .remove(&id)
                .map(|s| signal_view(id, s))
        }
        None => None,
    };
    let status = if appended.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        EventAppended {
            loop_detected: appended.signals.loop_detected,
            replayed: appended.replayed,
            event: appended.event.into(),
            effect,
            signal,
            verification_receipt: None,
        },
    ))
}

/// Begins a run with server-minted handles (`spec/003` "Stateless Run Handles").
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginRunBody {
    #[schema(example = "refunds.v3", min_length = 1, max_length = 256)]
    pub agent_id: String,
    /// Default: the root work item's id.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, nullable = false)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub versions: VersionsBody,
    /// Caller-declared labels and goal stored with `RunStarted` (provenance, never
    /// identity); the payload rules of every event apply.
    #[serde(default = "empty_object", deserialize_with = "json_object")]
    #[schema(value_type = Object)]
    pub payload: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// The handles of a begun run.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunBegun {
    /// `run_` and 32 hex digits, minted by the server.
    pub run_id: String,
    /// The root work item, `wi_` and 32 hex digits; it starts `pending`.
    pub work_item_id: String,
    /// The `RunStarted` event (on a replay, the one recorded the first time).
    pub event: EventView,
    pub replayed: bool,
}

/// Begin a run: mint its id and its root work item's id, and append `RunStarted`.
///
/// The handles are derived from the `Idempotency-Key` with the server's key, so a
/// retry returns the same run (`200`, `replayed: true`); the server keeps no current
/// run: every later call names the run.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/runs", tag = "runs",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, SubjectParam),
    request_body = BeginRunBody,
    responses(
        (status = 201, description = "Begun", body = RunBegun),
        (status = 200, description = "An idempotent retry: the run begun the first time", body = RunBegun),
    ))]
async fn begin_run(
    State(state): State<AppState>,
    worker: WorkerAccess,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(body): ApiJson<BeginRunBody>,
) -> Result<(StatusCode, Json<RunBegun>), ApiError> {
    let WorkerAccess { record, scope, .. } = worker;
    let idempotency = state
        .keyring()
        .idempotency_digest(&record.binding_id, "ledger.begin", &key)
        .as_str()
        .to_owned();
    let mut payload = body.payload;
    if payload.get("root_work_item_id").is_some() {
        return Err(ApiError::invalid(
            "payload field `root_work_item_id` is minted by the server; leave it out",
        ));
    }
    let mint = |prefix: &str, what: &str| {
        state
            .keyring()
            .mint_handle(prefix, &scope.binding_id, scope.epoch, what, &idempotency)
    };
    let run_id = mint("run_", "run");
    let work_item_id = mint("wi_", "root_work_item");
    if let Some(map) = payload.as_object_mut() {
        map.insert(
            "root_work_item_id".into(),
            Value::String(work_item_id.clone()),
        );
    }
    let rules = state.ledger_budgets().rules(&record.binding_id);
    let request = AppendRequest {
        event: NewEvent {
            event_type: EventType::RunStarted,
            run_id: run_id.clone(),
            turn_id: body.turn_id.unwrap_or_else(|| work_item_id.clone()),
            agent_id: body.agent_id,
            lamport: None,
            versions: body.versions.into(),
            payload,
        },
        idempotency: Some(idempotency.clone()),
        expected_last_seq: None,
        budgets: rules.budgets,
        approval_required: false,
        preconditions: None,
    };
    let (status, appended) = append(&state, &scope, &request).await?;
    Ok((
        status,
        Json(RunBegun {
            run_id,
            work_item_id,
            replayed: appended.replayed,
            event: appended.event,
        }),
    ))
}

fn next_after(events: &[LedgerEvent], limit: usize) -> Option<u64> {
    if events.len() >= limit {
        events.last().map(|e| e.seq)
    } else {
        None
    }
}

/// List the binding's events after a sequence, in order (every run of the epoch).
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/runs/events", tag = "runs",
    params(BindingIdParam, EventsQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "A page of events", body = EventPage)))]
async fn list_events(
    State(state): State<AppState>,
    worker: WorkerAccess,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let limit = page_limit(&state, q.limit)?;
    let span = span(
        Step::ThreadStateLoad,
        "ledger.events",
        &worker.record.binding_id,
    );
    let events = traced(
        span.clone(),
        state
            .store()
            .ledger_events(&worker.scope, None, q.after_seq.unwrap_or(0), limit),
    )
    .await?;
    spans::record_count(&span, keys::COUNT, events.len() as u64);
    Ok(Json(EventPage {
        next_after_seq: next_after(&events, limit),
        events: events.into_iter().map(Into::into).collect(),
    }))
}

/// Read a run: its events after `after_seq`, its state folded by the recorded reducer,
/// its effects, and the derived metrics of the run and of the binding.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/runs/item", tag = "runs",
    params(BindingIdParam, RunQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The run", body = RunRead)))]
async fn read_run(
    State(state): State<AppState>,
    worker: WorkerAccess,
    ApiQuery(q): ApiQuery<RunQuery>,
) -> Result<Json<RunRead>, ApiError> {
    let limit = page_limit(&state, q.limit)?;
    check_key("run_id", &q.run_id, 256).map_err(ApiError::from)?;
    let scope = &worker.scope;
    let span = span(
        Step::ThreadStateLoad,
        "ledger.run",
        &worker.record.binding_id,
    );
    let read = traced(span, async {
        let mut after_seq = q.after_seq.unwrap_or(0);
        let mut snapshot_seq = None;
        if q.from_snapshot == Some(true)
            && let Some(snapshot) = state.store().ledger_snapshot(scope).await?
        {
            snapshot_seq = Some(snapshot.seq);
            after_seq = after_seq.max(snapshot.seq);
        }
        // The head, the run's page and the head's own event in one consistent read.
        let read = state
            .store()
            .run_snapshot(scope, &q.run_id, after_seq, limit)
            .await?;
        let health = read.health();
        let ledger = read.state;
        let Some(run) = ledger.runs.get(&q.run_id).cloned() else {
            return Err(ApiError::not_found(&format!("run {}", q.run_id)));
        };
        let events = read.events;
        let next_after_seq = if read.full_page || events.len() >= limit {
            events.last().map(|e| e.seq)
        } else {
            None
        };
        let effects = ledger
            .effects
            .iter()
            .filter(|(_, e)| e.run_id == q.run_id)
            .map(|(k, e)| (k.clone(), effect_view(k.clone(), e.clone())))
            .collect();
        Ok::<_, ApiError>(RunRead {
            run_id: q.run_id.clone(),
            last_seq: ledger.last_seq,
            after_seq,
            snapshot_seq,
            next_after_seq,
            events: events.into_iter().map(Into::into).collect(),
            metrics: ledger::run_metrics(&run).into(),
            binding_metrics: ledger::binding_metrics(&ledger).into(),
            state: run.into(),
            effects,
            degraded: health.degraded(),
            projection_health: health.into(),
        })
    })
    .await?;
    Ok(Json(read))
}

/// The health of a ledger head's projections (spec 003 "get_run").
#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectionHealthView {
    /// `healthy` or `degraded`.
    #[schema(example = "healthy")]
    pub status: String,
    /// The reducer that folded the stored head.
    #[schema(example = "ledger-reducer/1")]
    pub reducer: String,
    /// This server's reducer.
    #[schema(example = "ledger-reducer/1")]
    pub expected_reducer: String,
    /// What is wrong, for a person; empty when healthy.
    pub problems: Vec<String>,
}

impl From<ledger::ProjectionHealth> for ProjectionHealthView {
    fn from(h: ledger::ProjectionHealth) -> Self {
        ProjectionHealthView {
            status: h.status.to_owned(),
            reducer: h.reducer,
            expected_reducer: h.expected_reducer.to_owned(),
            problems: h.problems,
        }
    }
}

/// The `memory_utility_shadow` review counters of one memory.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryUtilityView {
    /// Distinct runs with `helpful` feedback and a strong verified success (a governed-v2
    /// `verified_success` bound to a current verification receipt).
    pub supporting_run_count: u64,
    /// Distinct runs with `misleading` or `outdated` feedback and a `failed`,
    /// `user_corrected` or `regression` outcome.
    pub contradicting_run_count: u64,
    /// Source links that met every condition.
    pub counted_links: u64,
}

/// The workspace's `memory_utility_shadow`: review evidence only.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryUtilityShadow {
    /// The ledger sequence it was rebuilt at.
    pub last_seq: u64,
    /// By memory id; memories without a counted link are absent.
    pub memories: BTreeMap<String, MemoryUtilityView>,
}

/// Rebuild the workspace's `memory_utility_shadow` from its ledger (spec 003): per
/// memory, the runs that source-linked it with the current effective feedback and have
/// a current outcome. Computed on every read and never stored; nothing ranks, admits,
/// promotes or decides by it.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/runs/memory-utility", tag = "runs",
    params(BindingIdParam, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The shadow counters", body = MemoryUtilityShadow)))]
async fn memory_utility(
    State(state): State<AppState>,
    worker: WorkerAccess,
) -> Result<Json<MemoryUtilityShadow>, ApiError> {
    let scope = &worker.scope;
    let span = span(
        Step::ThreadStateLoad,
        "ledger.memory_utility",
        &worker.record.binding_id,
    );
    let shadow = traced(span, async {
        let head = state.store().ledger_state(scope).await?;
        let mut events = Vec::new();
        let mut after = 0;
        while after < head.last_seq {
            let page = state.store().ledger_events(scope, None, after, 0).await?;
            let Some(last) = page.last().map(|e| e.seq) else {
                break;
            };
            events.extend(page.into_iter().filter(|e| e.seq <= head.last_seq));
            after = last;
        }
        let memories = ledger::shadow::memory_utility_shadow(&events, &head)
            .into_iter()
            .map(|(id, u)| {
                (
                    id,
                    MemoryUtilityView {
                        supporting_run_count: u.supporting_run_count,
                        contradicting_run_count: u.contradicting_run_count,
                        counted_links: u.counted_links,
                    },
                )
            })
            .collect();
        Ok::<_, ApiError>(MemoryUtilityShadow {
            last_seq: head.last_seq,
            memories,
        })
    })
    .await?;
    Ok(Json(shadow))
}

/// What a repair did.
#[derive(Debug, Serialize, ToSchema)]
pub struct RepairView {
    /// The sequence the rebuilt head summarizes.
    pub last_seq: u64,
    pub projection_health: ProjectionHealthView,
    pub degraded: bool,
}

/// Rebuild the binding's ledger head (its projections: runs, work items, outcome heads,
/// effects, signals, feedback heads) from the events with this server's reducer. The
/// events are the authority and are not touched; run writes refused as
/// `projection_degraded` are accepted again afterwards. Safe to repeat.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/runs/repair", tag = "runs",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The rebuilt head's health", body = RepairView)))]
async fn repair_ledger(
    State(state): State<AppState>,
    worker: WorkerAccess,
    // Required like on every mutating call; a repair is idempotent by nature.
    _key: IdempotencyKey,
) -> Result<Json<RepairView>, ApiError> {
    let span = span(
        Step::ThreadStateWrite,
        "ledger.repair",
        &worker.record.binding_id,
    );
    let repaired = traced(span, state.store().repair_ledger(&worker.scope)).await?;
    tracing::info!(
        binding = %worker.record.binding_id,
        last_seq = repaired.last_seq,
        "ledger head rebuilt from its events"
    );
    let health = repaired.projection_health(Some(repaired.last_seq));
    Ok(Json(RepairView {
        last_seq: repaired.last_seq,
        degraded: health.degraded(),
        projection_health: health.into(),
    }))
}

/// Read one effect by its idempotency key: status, attempts, who observed the outcome
/// and the recorded result.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/runs/effects", tag = "runs",
    params(BindingIdParam, EffectQuery, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The effect", body = EffectView)))]
async fn read_effect(
    State(state): State<AppState>,
    worker: WorkerAccess,
    ApiQuery(q): ApiQuery<EffectQuery>,
) -> Result<Json<EffectView>, ApiError> {
    check_key("key", &q.key, 1024).map_err(ApiError::from)?;
    let span = span(
        Step::ThreadStateLoad,
        "ledger.effect",
        &worker.record.binding_id,
    );
    let mut ledger = traced(span, state.store().ledger_state(&worker.scope)).await?;
    let effect = ledger
        .effects
        .remove(&q.key)
        .ok_or_else(|| ApiError::not_found("effect"))?;
    Ok(Json(effect_view(q.key, effect)))
}

/// Store the folded state at the current last sequence as a snapshot (idempotent per
/// sequence), so a reader can start there instead of at the first event.
#[utoipa::path(post, path = "/v1/bindings/{binding_id}/runs/snapshot", tag = "runs",
    params(BindingIdParam, IdempotencyHeader, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The snapshot", body = SnapshotView)))]
async fn take_snapshot(
    State(state): State<AppState>,
    worker: WorkerAccess,
    _key: IdempotencyKey,
) -> Result<Json<SnapshotView>, ApiError> {
    let span = span(
        Step::ThreadStateWrite,
        "ledger.snapshot",
        &worker.record.binding_id,
    );
    let snapshot = traced(span, state.store().snapshot_ledger(&worker.scope)).await?;
    Ok(Json(snapshot.into()))
}

/// The latest snapshot of the epoch, or `null`.
#[utoipa::path(get, path = "/v1/bindings/{binding_id}/runs/snapshot", tag = "runs",
    params(BindingIdParam, FenceHeaders, SubjectParam),
    responses((status = 200, description = "The latest snapshot", body = SnapshotResponse)))]
async fn read_snapshot(
    State(state): State<AppState>,
    worker: WorkerAccess,
) -> Result<Json<SnapshotResponse>, ApiError> {
    let span = span(
        Step::ThreadStateLoad,
        "ledger.snapshot",
        &worker.record.binding_id,
    );
    let snapshot = traced(span, state.store().ledger_snapshot(&worker.scope)).await?;
    Ok(Json(SnapshotResponse {
        snapshot: snapshot.map(Into::into),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bindings_profile_sets_its_budgets_and_gated_tools() {
        let table = LedgerBudgets::new(default_budgets());
        let id =
            BindingId::parse("hb_0123456789abcdef0123456789abcdef").unwrap_or_else(|| panic!("id"));
        assert_eq!(table.rules(&id), rules_of(default_budgets(), None));
        let policy: LedgerPolicy = serde_json::from_value(serde_json::json!({
            "budgets": {"perTurn": {"steps": 2, "costUnits": 10}, "perRun": {"irreversibleEffects": 0}},
            "tools": [{"name": "issue_refund", "defence": "queryableByKey"},
                      {"name": "send_fax", "defence": "none"}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        table.set_profile("team/p", Some(policy));
        // The profile applies once the binding is known to use it.
        assert_eq!(table.for_binding(&id), default_budgets());
        table.set_binding_profile(id.as_str(), Some("team/p".into()));
        let rules = table.rules(&id);
        let d = default_budgets();
        assert_eq!(rules.budgets.per_turn.steps, Some(2));
        assert_eq!(rules.budgets.per_turn.cost_units, Some(10));
        assert_eq!(rules.budgets.per_turn.irreversible, d.per_turn.irreversible);
        assert_eq!(rules.budgets.per_run.irreversible, Some(0));
        assert_eq!(rules.budgets.per_run.steps, d.per_run.steps);
        assert!(rules.approval_required("send_fax"));
        assert!(!rules.approval_required("issue_refund"));
        assert!(!rules.approval_required("unlisted"));
        table.set_profile("team/p", None);
        assert_eq!(table.rules(&id), rules_of(default_budgets(), None));
    }

    #[test]
    fn attempt_arguments_are_redacted() {
        let mut payload = serde_json::json!({
            "tool": "call_api",
            "args": {"auth": "Bearer sk-live-0123456789abcdefghijklmnop", "amount": 20},
        });
        redact_args(&mut payload);
        let auth = payload["args"]["auth"].as_str().unwrap_or_default();
        assert!(!auth.contains("sk-live-0123456789"), "{auth}");
        assert_eq!(payload["args"]["amount"], 20);
    }

    #[test]
    fn outcomes_count_by_outcome_and_via() {
        let metrics = LedgerMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let event = |t: EventType, payload: Value| LedgerAppend {
            event: LedgerEvent {
                seq: 1,
                event_id: String::new(),
                event_type: t,
                binding_id: String::new(),
                epoch: 0,
                run_id: "r".into(),
                turn_id: "t".into(),
                agent_id: "a".into(),
                lamport: 1,
                recorded_at_ms: 0,
                intent_hash: String::new(),
                versions: Versions::default(),
                payload,
                request_digest: String::new(),
            },
            replayed: false,
            signals: Default::default(),
        };
        metrics.appended(&event(
            EventType::EffectOutcomeObserved,
            serde_json::json!({"idempotency_key": "k", "outcome": "confirmed", "via": "reconciliation"}),
        ));
        let mut replay = event(
            EventType::EffectOutcomeObserved,
            serde_json::json!({"idempotency_key": "k", "outcome": "confirmed"}),
        );
        replay.replayed = true;
        metrics.appended(&replay);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            text.contains(
                "ledger_effect_outcomes_total{outcome=\"confirmed\",via=\"reconciliation\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("via=\"direct\""), "a replay counts nothing");
    }
}
