//! The episode contract on the ledger (`spec/003_bab976795353d872.txt` "Stateless Run
//! Handles", "Event And Outcome Authority"): a run's work tree (a root work item and
//! children, each moved by explicit events through a small state machine), artifact
//! references, and the outcome head with its superseding corrections.
//!
//! Pure: [`admit`] decides whether an event may be appended to a run, [`apply`] folds it.
//! Both are called by the ledger's reducer ([`super::LedgerState`]), so the work tree is
//! decided in the same atomic step as every other ledger rule and replays the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    EventType, LedgerEvent, NewEvent, RunOutcomeKind, RunPreconditions, RunState, RunStatus,
};
use crate::domain::state::Rejection;

/// Where a work item stands. Completed, failed and abandoned are terminal: nothing
/// reopens them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkItemStatus {
    Pending,
    Active,
    Blocked,
    Completed,
    Failed,
    Abandoned,
}

impl WorkItemStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkItemStatus::Pending => "pending",
            WorkItemStatus::Active => "active",
            WorkItemStatus::Blocked => "blocked",
            WorkItemStatus::Completed => "completed",
            WorkItemStatus::Failed => "failed",
            WorkItemStatus::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            WorkItemStatus::Pending,
            WorkItemStatus::Active,
            WorkItemStatus::Blocked,
            WorkItemStatus::Completed,
            WorkItemStatus::Failed,
            WorkItemStatus::Abandoned,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkItemStatus::Completed | WorkItemStatus::Failed | WorkItemStatus::Abandoned
        )
    }

    /// The state machine: the status `to` that an event asks for, from `self`.
    /// - start: pending, active (the resume path) or blocked -> active;
    /// - block: active -> blocked;
    /// - complete, fail: active or blocked -> terminal;
    /// - abandon: any non-terminal -> abandoned;
    /// - a terminal item never moves again.
    pub fn allows(self, to: WorkItemStatus) -> bool {
        use WorkItemStatus::*;
        match (self, to) {
            (from, _) if from.is_terminal() => false,
            (_, Active) => true,
            (Active, Blocked) => true,
            (Active | Blocked, Completed | Failed) => true,
            (_, Abandoned) => true,
            _ => false,
        }
    }
}

/// One work item of a run's tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub status: WorkItemStatus,
    pub created_seq: u64,
    pub updated_seq: u64,
}

/// How much a success claim is worth (`spec/003` "complete_run").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStrength {
    /// The caller says so.
    Declared,
    /// A version-1 `verified_success`: read as declared, never as strong verification.
    LegacyDeclared,
    /// A governed-v2 `verified_success` bound to a current server-minted verification
    /// receipt: strong verification.
    Verified,
}

/// The approved preflight of a run: what its success will be judged against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    pub seq: u64,
    /// `sha256:` of the canonical JSON list of the criteria.
    pub criteria_digest: String,
    pub evaluator: String,
    pub run_configuration_digest: String,
    /// The authenticated principal that approved it (set by the server).
    pub approved_by: String,
}

/// The latest evaluation of a run against its preflight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evaluation {
    pub seq: u64,
    pub preflight_seq: u64,
    /// `pass` or `fail`.
    pub verdict: String,
    /// The run's artifacts when it was evaluated ([`artifacts_digest`]).
    pub artifacts_digest: String,
}

/// The digest of a run's current artifacts (ids, digests, types and URIs, by id): a
/// receipt bound to it goes stale when an artifact is added.
pub fn artifacts_digest(ep: &Episode) -> String {
    let list: Vec<Value> = ep
        .artifacts
        .iter()
        .map(|(id, a)| serde_json::json!([id, a.sha256, a.mime_type, a.uri]))
        .collect();
    crate::domain::ids::content_digest(super::canonical_json(&Value::Array(list)).as_bytes())
}

/// What a verified outcome records (`payload.verification`, set by the server from a
/// verification receipt it minted; a caller cannot set it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    pub receipt_hash: String,
    pub evaluated_seq: u64,
    pub preflight_seq: u64,
    pub criteria_digest: String,
    pub artifacts_digest: String,
    pub run_configuration_digest: String,
    pub evaluator: String,
}

/// The run's current outcome head: the first outcome, or the latest correction of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutcomeHead {
    pub outcome: RunOutcomeKind,
    pub strength: OutcomeStrength,
    /// The event that set this head.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression_of_run_id: Option<String>,
    /// Corrections applied so far.
    pub corrections: u64,
}

/// An artifact reference recorded by `artifact_created`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub sha256: String,
    pub mime_type: String,
    pub uri: String,
    pub seq: u64,
}

/// The episode part of a run's folded state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Episode {
    /// Set when the run was begun with a root work item (`begin_run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_work_item_id: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub work_items: BTreeMap<String, WorkItem>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, ArtifactRef>,
    /// When the first outcome was recorded; a correction never moves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal_at_ms: Option<i64>,
    /// When the outcome head last moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_outcome_updated_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome_head: Option<OutcomeHead>,
    /// The approved preflight (the latest approval replaces it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Preflight>,
    /// The latest evaluation against the preflight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
}

fn str_of<'a>(payload: &'a Value, name: &str) -> Option<&'a str> {
    payload.get(name).and_then(Value::as_str)
}

fn conflict(what: String) -> Rejection {
    Rejection::Conflict { what }
}

/// Whether the event's `versions.schema` declares the governed-v2 schema (`<type>/2`).
pub fn is_governed(event: &NewEvent) -> bool {
    event.versions.schema.ends_with("/2")
}

fn outcome_of(payload: &Value) -> Option<RunOutcomeKind> {
    str_of(payload, "outcome").and_then(RunOutcomeKind::parse)
}

/// The outcome rules both a completion and a correction obey: `regression_of_run_id` if
/// and only if the outcome is a regression, and never the run itself.
fn check_outcome(run: &RunState, payload: &Value) -> Result<(), Rejection> {
    let regression = outcome_of(payload) == Some(RunOutcomeKind::Regression);
    match (regression, str_of(payload, "regression_of_run_id")) {
        (true, None) => Err(Rejection::Invalid(
            "a regression names the run it regresses in `regression_of_run_id`".into(),
        )),
        (false, Some(_)) => Err(Rejection::Invalid(
            "`regression_of_run_id` is accepted only with the outcome `regression`".into(),
        )),
        (true, Some(of)) if of == run.run_id => Err(Rejection::Invalid(
            "a run cannot be a regression of itself".into(),
        )),
        _ => Ok(()),
    }
}

/// The status a governed-v2 precondition compares: of the work item the event names,
/// else of the run (`running`, `completed`; `absent` before `RunStarted`).
pub fn current_status(run: Option<&RunState>, new: &NewEvent) -> String {
    let Some(run) = run else {
        return "absent".into();
    };
    let item = match new.event_type {
        EventType::WorkItemCreated => None,
        _ => str_of(&new.payload, "work_item_id"),
    };
    match item.and_then(|id| run.episode.work_items.get(id)) {
        Some(w) => w.status.as_str().to_owned(),
        None => match run.status {
            RunStatus::Running => "running".into(),
            RunStatus::Completed => "completed".into(),
        },
    }
}

/// A governed-v2 event (`versions.schema` `<type>/2`) must carry its preconditions, and
/// they must hold: the run's last sequence and the status of what it moves. A version-1
/// event may carry them too (then they are checked the same way).
pub fn check_governed(
    run: Option<&RunState>,
    new: &NewEvent,
    pre: Option<&RunPreconditions>,
) -> Result<(), Rejection> {
    let Some(pre) = pre else {
        if is_governed(new) {
            return Err(Rejection::Invalid(format!(
                "{} is a governed-v2 event: it carries preconditions (the run's last sequence and the expected status)",
                new.event_type.as_str()
            )));
        }
        return Ok(());
    };
    let actual = run.map_or(0, |r| r.last_seq);
    if pre.run_last_seq != actual {
        return Err(Rejection::SequenceConflict {
            expected: pre.run_last_seq,
            actual,
        });
    }
    let status = current_status(run, new);
    if pre.status != status {
        return Err(Rejection::Conflict {
            what: format!(
                "precondition failed: expected status {}, but it is {status}",
                pre.status
            ),
        });
    }
    Ok(())
}

/// The outcome rules of verification: a governed-v2 `verified_success` carries the
/// server's `verification` (from a receipt it minted), and that verification must be
/// current now, in the same atomic step as the append: the latest evaluation, a pass,
/// against the current preflight, with the run's artifacts unchanged since. A
/// `verification` on anything else is refused.
fn check_verification(run: &RunState, new: &NewEvent) -> Result<(), Rejection> {
    let verified = outcome_of(&new.payload) == Some(RunOutcomeKind::VerifiedSuccess);
    let given = new.payload.get("verification");
    if !(is_governed(new) && verified) {
        if given.is_some() {
            return Err(Rejection::Invalid(
                "a verification is recorded only on a governed-v2 verified_success".into(),
            ));
        }
        return Ok(());
    }
    let Some(given) = given else {
        return Err(Rejection::Invalid(
            "a governed-v2 verified_success needs `verification_receipt`: the receipt the server minted for a passing verification_evaluated of this run".into(),
        ));
    };
    let v: Verification = serde_json::from_value(given.clone())
        .map_err(|e| Rejection::Invalid(format!("payload field `verification`: {e}")))?;
    let ep = &run.episode;
    let stale = |why: &str| {
        Err(conflict(format!(
            "the verification receipt is no longer current: {why}; evaluate the run again"
        )))
    };
    let (Some(pre), Some(eval)) = (&ep.preflight, &ep.evaluation) else {
        return stale("the run has no approved preflight and evaluation");
    };
    if eval.seq != v.evaluated_seq || eval.preflight_seq != v.preflight_seq {
        return stale("a later evaluation replaced it");
    }
    if pre.seq != v.preflight_seq
        || pre.criteria_digest != v.criteria_digest
        || pre.run_configuration_digest != v.run_configuration_digest
        || pre.evaluator != v.evaluator
    {
        return stale("the preflight changed");
    }
    if eval.verdict != "pass" {
        return stale("the evaluation did not pass");
    }
    if artifacts_digest(ep) != v.artifacts_digest || eval.artifacts_digest != v.artifacts_digest {
        return stale("the run's artifacts changed since it was evaluated");
    }
    Ok(())
}

/// The episode rules of appending `new` to `run` (which has started and, unless `new`
/// is a correction, not completed).
pub fn admit(run: &RunState, new: &NewEvent) -> Result<(), Rejection> {
    let ep = &run.episode;
    let p = &new.payload;
    let item = |id: &str| {
        ep.work_items
            .get(id)
            .ok_or_else(|| Rejection::NotFound(format!("work item {id} in run {}", run.run_id)))
    };
    match new.event_type {
        EventType::WorkItemCreated => {
            let id = str_of(p, "work_item_id").unwrap_or_default();
            if ep.work_items.contains_key(id) {
                return Err(conflict(format!("work item {id} already exists")));
            }
            let parent_id = str_of(p, "parent_work_item_id").unwrap_or_default();
            let parent = item(parent_id)?;
            if parent.status != WorkItemStatus::Active {
                return Err(conflict(format!(
                    "work item {parent_id} is {}; a child needs an active parent",
                    parent.status.as_str()
                )));
            }
            Ok(())
        }
        t if t.work_item_transition().is_some() => {
            let to = t.work_item_transition().unwrap_or(WorkItemStatus::Active);
            let id = str_of(p, "work_item_id").unwrap_or_default();
            let current = item(id)?;
            if current.status.allows(to) {
                Ok(())
            } else if current.status.is_terminal() {
                Err(conflict(format!(
                    "work item {id} is {}: a terminal work item is never reopened",
                    current.status.as_str()
                )))
            } else {
                Err(conflict(format!(
                    "work item {id} is {}; {} cannot move it to {}",
                    current.status.as_str(),
                    t.as_str(),
                    to.as_str()
                )))
            }
        }
        EventType::VerificationEvaluated => {
            let Some(pre) = &ep.preflight else {
                return Err(conflict(format!(
                    "run {} has no approved preflight to evaluate against",
                    run.run_id
                )));
            };
            let named = p.get("preflight_seq").and_then(Value::as_u64).unwrap_or(0);
            if named != pre.seq {
                return Err(conflict(format!(
                    "preflight {named} is not the run's current preflight ({})",
                    pre.seq
                )));
            }
            if str_of(p, "evaluator") != Some(pre.evaluator.as_str()) {
                return Err(conflict(format!(
                    "the preflight names evaluator {}; another evaluator's verdict does not verify this run",
                    pre.evaluator
                )));
            }
            Ok(())
        }
        EventType::RunCompleted => {
            check_outcome(run, p)?;
            check_verification(run, new)?;
            if let Some((id, w)) = ep.work_items.iter().find(|(_, w)| !w.status.is_terminal()) {
                return Err(conflict(format!(
                    "work item {id} is {}: every work item ends with work_item_completed, work_item_failed or work_item_abandoned before the run's outcome",
                    w.status.as_str()
                )));
            }
            Ok(())
        }
        EventType::RunOutcomeCorrected => {
            check_outcome(run, p)?;
            check_verification(run, new)?;
            if run.status != RunStatus::Completed || ep.outcome_head.is_none() {
                return Err(conflict(format!(
                    "run {} has no outcome to correct; complete it first",
                    run.run_id
                )));
            }
            Ok(())
        }
        EventType::ArtifactCreated => {
            let id = str_of(p, "artifact_id").unwrap_or_default();
            if ep.artifacts.contains_key(id) {
                return Err(conflict(format!("artifact {id} already exists")));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Folds an admitted event into the run's episode.
pub fn apply(run: &mut RunState, event: &LedgerEvent) {
    let p = &event.payload;
    let ep = &mut run.episode;
    let seq = event.seq;
    match event.event_type {
        EventType::RunStarted => {
            if let Some(root) = str_of(p, "root_work_item_id") {
                ep.root_work_item_id = Some(root.to_owned());
                ep.work_items.insert(
                    root.to_owned(),
                    WorkItem {
                        parent: None,
                        status: WorkItemStatus::Pending,
                        created_seq: seq,
                        updated_seq: seq,
                    },
                );
            }
        }
        EventType::WorkItemCreated => {
            if let Some(id) = str_of(p, "work_item_id") {
                ep.work_items.insert(
                    id.to_owned(),
                    WorkItem {
                        parent: str_of(p, "parent_work_item_id").map(str::to_owned),
                        status: WorkItemStatus::Pending,
                        created_seq: seq,
                        updated_seq: seq,
                    },
                );
            }
        }
        t if t.work_item_transition().is_some() => {
            if let (Some(to), Some(w)) = (
                t.work_item_transition(),
                str_of(p, "work_item_id").and_then(|id| ep.work_items.get_mut(id)),
            ) {
                w.status = to;
                w.updated_seq = seq;
            }
        }
        EventType::ArtifactCreated => {
            let artifact = p.get("artifact");
            let field = |name: &str| {
                artifact
                    .and_then(|a| a.get(name))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            if let Some(id) = str_of(p, "artifact_id") {
                ep.artifacts.insert(
                    id.to_owned(),
                    ArtifactRef {
                        sha256: field("sha256"),
                        mime_type: field("mime_type"),
                        uri: field("uri"),
                        seq,
                    },
                );
            }
        }
        EventType::VerificationPreflightApproved => {
            let text = |k: &str| str_of(p, k).unwrap_or_default().to_owned();
            ep.preflight = Some(Preflight {
                seq,
                criteria_digest: text("criteria_digest"),
                evaluator: text("evaluator"),
                run_configuration_digest: text("run_configuration_digest"),
                approved_by: text("approved_by"),
            });
            ep.evaluation = None;
        }
        EventType::VerificationEvaluated => {
            ep.evaluation = Some(Evaluation {
                seq,
                preflight_seq: p.get("preflight_seq").and_then(Value::as_u64).unwrap_or(0),
                verdict: str_of(p, "verdict").unwrap_or_default().to_owned(),
                artifacts_digest: artifacts_digest(ep),
            });
        }
        EventType::RunCompleted | EventType::RunOutcomeCorrected => {
            let Some(outcome) = outcome_of(p) else {
                return;
            };
            let verified =
                outcome == RunOutcomeKind::VerifiedSuccess && p.get("verification").is_some();
            let legacy = outcome == RunOutcomeKind::VerifiedSuccess && !verified;
            let corrections = ep.outcome_head.as_ref().map_or(0, |h| h.corrections)
                + u64::from(event.event_type == EventType::RunOutcomeCorrected);
            ep.outcome_head = Some(OutcomeHead {
                outcome,
                strength: if verified {
                    OutcomeStrength::Verified
                } else if legacy {
                    OutcomeStrength::LegacyDeclared
                } else {
                    OutcomeStrength::Declared
                },
                seq,
                regression_of_run_id: str_of(p, "regression_of_run_id").map(str::to_owned),
                corrections,
            });
            ep.terminal_at_ms.get_or_insert(event.recorded_at_ms);
            ep.current_outcome_updated_at_ms = Some(event.recorded_at_ms);
        }
        _ => {}
    }
}
