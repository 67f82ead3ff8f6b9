//! Payload rules: the 32 KiB bound, the refusal of raw transcripts and hidden reasoning
//! (`spec/003_bab976795353d872.txt` "Event And Outcome Authority"), `rationale` rather
//! than `why` (`spec/002_6a0ddaf11b83bfe4.txt` §3.2), and the fields each event type
//! must carry.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::EventType;
use crate::domain::state::Rejection;

/// Bound of an event's canonical payload.
pub const MAX_PAYLOAD_BYTES: usize = 32 << 10;

/// Normalized field names (lower case, letters and digits only) that hold a raw
/// transcript or hidden reasoning.
const FORBIDDEN: &[&str] = &[
    "transcript",
    "rawtranscript",
    "fulltranscript",
    "rawmessages",
    "reasoning",
    "hiddenreasoning",
    "reasoningtrace",
    "reasoningcontent",
    "thinking",
    "thought",
    "thoughts",
    "thoughtprocess",
    "chainofthought",
    "cot",
    "analysis",
    "scratchpad",
    "innermonologue",
    "rawcompletion",
    "rawprompt",
];

/// Stems refused anywhere in a normalized name (`reasoning_text`, `my_transcript`).
const FORBIDDEN_STEMS: &[&str] = &[
    "transcript",
    "reasoning",
    "chainofthought",
    "thoughtprocess",
    "scratchpad",
    "innermonologue",
];

fn normalize(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Why a field name is refused, or `None` when it may be stored. Digest and hash fields
/// (`analysis_digest`, `transcript_sha256`) pass: they state a fact, not the content.
pub fn forbidden_field(name: &str) -> Option<&'static str> {
    let n = normalize(name);
    if n.ends_with("digest") || n.ends_with("hash") || n.ends_with("sha256") {
        return None;
    }
    if n == "why" {
        return Some("a stated rationale is stored as `rationale`, never `why`");
    }
    if FORBIDDEN.contains(&n.as_str()) || FORBIDDEN_STEMS.iter().any(|s| n.contains(s)) {
        return Some("raw transcripts and hidden reasoning are not stored; record a digest");
    }
    None
}

fn refuse_fields(value: &Value, path: &mut Vec<String>) -> Result<(), Rejection> {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let Some(why) = forbidden_field(k) {
                    path.push(k.clone());
                    return Err(Rejection::Invalid(format!(
                        "payload field `{}` is refused: {why}",
                        path.join(".")
                    )));
                }
                path.push(k.clone());
                refuse_fields(v, path)?;
                path.pop();
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                refuse_fields(v, path)?;
                path.pop();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An effect's observed outcome (§5.1): unknown is a state, never success or failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Confirmed,
    Refused,
    Unknown,
}

impl Outcome {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "confirmed" => Some(Outcome::Confirmed),
            "refused" => Some(Outcome::Refused),
            "unknown" => Some(Outcome::Unknown),
            _ => None,
        }
    }
}

/// Who observed an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    Direct,
    Reconciliation,
    Human,
}

impl Via {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "direct" => Some(Via::Direct),
            "reconciliation" => Some(Via::Reconciliation),
            "human" => Some(Via::Human),
            _ => None,
        }
    }
}

/// How a closed run ended: the §8.3 taxonomy, and the episode contract's outcomes
/// (`spec/003_bab976795353d872.txt` "complete_run": `verified_success`,
/// `user_corrected`, `regression`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcomeKind {
    Resolved,
    PartiallyResolved,
    HandedToHuman,
    Abandoned,
    Failed,
    /// Read as `legacy_declared` unless bound to a server-minted verification receipt.
    VerifiedSuccess,
    /// A person corrected the result.
    UserCorrected,
    /// The run undid what an earlier run achieved (`regression_of_run_id` names it).
    Regression,
}

/// Every outcome, for error messages and schemas.
pub const RUN_OUTCOMES: &str = "resolved, partially_resolved, handed_to_human, abandoned, failed, verified_success, user_corrected, regression";

impl RunOutcomeKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "resolved" => Some(Self::Resolved),
            "partially_resolved" => Some(Self::PartiallyResolved),
            "handed_to_human" => Some(Self::HandedToHuman),
            "abandoned" => Some(Self::Abandoned),
            "failed" => Some(Self::Failed),
            "verified_success" => Some(Self::VerifiedSuccess),
            "user_corrected" => Some(Self::UserCorrected),
            "regression" => Some(Self::Regression),
            _ => None,
        }
    }
}

fn field<'a>(
    map: &'a Map<String, Value>,
    t: EventType,
    name: &str,
) -> Result<&'a Value, Rejection> {
    map.get(name)
        .ok_or_else(|| Rejection::Invalid(format!("{} payload needs `{name}`", t.as_str())))
}

fn string_field<'a>(
    map: &'a Map<String, Value>,
    t: EventType,
    name: &str,
) -> Result<&'a str, Rejection> {
    match field(map, t, name)? {
        Value::String(s) if !s.is_empty() => Ok(s),
        _ => Err(Rejection::Invalid(format!(
            "{} payload field `{name}` must be a non-empty string",
            t.as_str()
        ))),
    }
}

fn one_of<T>(
    map: &Map<String, Value>,
    t: EventType,
    name: &str,
    parse: fn(&str) -> Option<T>,
    allowed: &str,
) -> Result<T, Rejection> {
    let s = string_field(map, t, name)?;
    parse(s).ok_or_else(|| {
        Rejection::Invalid(format!(
            "{} payload field `{name}` is `{s}`; expected one of {allowed}",
            t.as_str()
        ))
    })
}

fn optional_u64(map: &Map<String, Value>, t: EventType, name: &str) -> Result<(), Rejection> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_u64().is_some() => Ok(()),
        Some(_) => Err(Rejection::Invalid(format!(
            "{} payload field `{name}` must be a non-negative integer",
            t.as_str()
        ))),
    }
}

fn optional_string(
    map: &Map<String, Value>,
    t: EventType,
    name: &str,
    max: usize,
) -> Result<(), Rejection> {
    match map.get(name) {
        None => Ok(()),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= max => Ok(()),
        Some(_) => Err(Rejection::Invalid(format!(
            "{} payload field `{name}` must be a string of 1 to {max} bytes",
            t.as_str()
        ))),
    }
}

/// Largest artifact `metadata` object, as canonical JSON.
pub const MAX_ARTIFACT_METADATA_BYTES: usize = 4 << 10;

/// Metadata keys that would carry an artifact's body inline (refused at any depth,
/// whatever their case or punctuation): an artifact is a reference, never content.
const INLINE_BODY_KEYS: &[&str] = &[
    "body", "filebody", "content", "contents", "binary", "bytes", "data", "base64",
];

fn refuse_inline_bodies(value: &Value, path: &mut Vec<String>) -> Result<(), Rejection> {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                path.push(k.clone());
                if INLINE_BODY_KEYS.contains(&normalize(k).as_str()) {
                    return Err(Rejection::Invalid(format!(
                        "artifact metadata field `{}` is refused: an artifact is stored by reference (sha256, mime_type, uri), never inline",
                        path.join(".")
                    )));
                }
                refuse_inline_bodies(v, path)?;
                path.pop();
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|v| refuse_inline_bodies(v, path)),
        _ => Ok(()),
    }
}

/// `artifact_created`'s `artifact`: a lowercase SHA-256 of the content, a MIME type, a
/// URI with a scheme, and optional bounded metadata without inline bodies.
fn validate_artifact(artifact: &Value) -> Result<(), Rejection> {
    let bad = |why: &str| Err(Rejection::Invalid(format!("artifact_created: {why}")));
    let Value::Object(a) = artifact else {
        return bad("`artifact` must be an object with sha256, mime_type and uri");
    };
    if let Some(unknown) = a
        .keys()
        .find(|k| !matches!(k.as_str(), "sha256" | "mime_type" | "uri" | "metadata"))
    {
        return bad(&format!(
            "`artifact.{unknown}` is not a field (sha256, mime_type, uri, metadata)"
        ));
    }
    let digest = a.get("sha256").and_then(Value::as_str).unwrap_or_default();
    if digest.len() != 64
        || !digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return bad("`artifact.sha256` must be 64 lowercase hex digits");
    }
    let mime = a
        .get("mime_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    let essence = mime.split(';').next().unwrap_or_default().trim();
    match essence.split_once('/') {
        Some((ty, sub)) if mime.len() <= 255 && token(ty) && token(sub) => {}
        _ => return bad("`artifact.mime_type` must be a MIME type such as text/markdown"),
    }
    let uri = a.get("uri").and_then(Value::as_str).unwrap_or_default();
    let scheme_ok = uri.split_once(':').is_some_and(|(scheme, rest)| {
        !rest.is_empty()
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if !scheme_ok || uri.len() > 2048 || uri.chars().any(|c| c.is_control() || c == ' ') {
        return bad(
            "`artifact.uri` must be a URI with a scheme, at most 2048 bytes, without spaces or control characters",
        );
    }
    if let Some(metadata) = a.get("metadata") {
        if !metadata.is_object() {
            return bad("`artifact.metadata` must be an object");
        }
        if super::canonical_json(metadata).len() > MAX_ARTIFACT_METADATA_BYTES {
            return Err(Rejection::TooLarge {
                what: "artifact metadata",
                size: super::canonical_json(metadata).len() as u64,
                limit: MAX_ARTIFACT_METADATA_BYTES as u64,
            });
        }
        refuse_inline_bodies(metadata, &mut vec!["artifact".into(), "metadata".into()])?;
    }
    Ok(())
}

/// Most acceptance criteria one preflight approves.
pub const MAX_CRITERIA: usize = 32;

/// Most memories one `memory_recalled` selects.
pub const MAX_ATTRIBUTED: usize = 32;

fn is_sha256(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The stored form of a memory attribution, as the server writes it after checking the
/// receipt (docs/mcp.md "Receipts"): `memory_recalled` has `receipt_hash` and 0 to 32
/// `links` of `{memory_id, rank, content_hash}`; `memory_applied` and `memory_rejected`
/// have `relation` `source` (with the recall's `receipt_hash`, `recalled_seq` and
/// `rank`) or `manual` (with `review_required: true`), and `memory_id`, `content_hash`.
fn validate_attribution(t: EventType, a: &Value) -> Result<(), Rejection> {
    let bad = |why: &str| {
        Err(Rejection::Invalid(format!(
            "{} memory_attribution: {why}",
            t.as_str()
        )))
    };
    let Value::Object(a) = a else {
        return bad("must be an object");
    };
    let text = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or_default();
    if t == EventType::MemoryRecalled {
        if !is_sha256(text("receipt_hash")) {
            return bad("receipt_hash must be sha256: and 64 hex digits");
        }
        let Some(Value::Array(links)) = a.get("links") else {
            return bad("links must be a list");
        };
        if links.len() > MAX_ATTRIBUTED {
            return bad(&format!("at most {MAX_ATTRIBUTED} memories per recall"));
        }
        for l in links {
            let ok = l.get("memory_id").and_then(Value::as_str).is_some()
                && l.get("rank")
                    .and_then(Value::as_u64)
                    .is_some_and(|r| r >= 1)
                && l.get("content_hash")
                    .and_then(Value::as_str)
                    .is_some_and(is_sha256);
            if !ok {
                return bad("each link has memory_id, rank >= 1 and content_hash");
            }
        }
        return Ok(());
    }
    if text("memory_id").is_empty() || !is_sha256(text("content_hash")) {
        return bad("memory_id and content_hash (sha256:) are required");
    }
    match text("relation") {
        "source" => {
            if !is_sha256(text("receipt_hash"))
                || a.get("rank").and_then(Value::as_u64).is_none()
                || a.get("recalled_seq").and_then(Value::as_u64).is_none()
            {
                return bad("a source link has receipt_hash, rank and recalled_seq");
            }
            Ok(())
        }
        "manual" => {
            if a.get("review_required") != Some(&Value::Bool(true)) {
                return bad("a manual reference is always review_required");
            }
            Ok(())
        }
        _ => bad("relation is source or manual"),
    }
}

/// The whole payload check: an object, within the bound, no forbidden field at any
/// depth, and the fields its type needs.
pub fn validate_payload(t: EventType, payload: &Value) -> Result<(), Rejection> {
    let Value::Object(map) = payload else {
        return Err(Rejection::Invalid(format!(
            "{} payload must be a JSON object",
            t.as_str()
        )));
    };
    let size = super::canonical_json(payload).len();
    if size > MAX_PAYLOAD_BYTES {
        return Err(Rejection::TooLarge {
            what: "event payload",
            size: size as u64,
            limit: MAX_PAYLOAD_BYTES as u64,
        });
    }
    refuse_fields(payload, &mut Vec::new())?;
    if !t.attributes_memory() && map.contains_key("memory_attribution") {
        return Err(Rejection::Invalid(format!(
            "{} does not carry a memory_attribution (only memory_recalled, memory_applied and memory_rejected do)",
            t.as_str()
        )));
    }
    if let Some(usage) = map.get("usage") {
        let Value::Object(usage) = usage else {
            return Err(Rejection::Invalid(format!(
                "{} payload field `usage` must be an object",
                t.as_str()
            )));
        };
        optional_u64(usage, t, "tokens")?;
        optional_u64(usage, t, "cost_units")?;
    }
    match t {
        EventType::RunStarted | EventType::ContextAssembled => Ok(()),
        EventType::RunCompleted | EventType::RunOutcomeCorrected => {
            one_of(map, t, "outcome", RunOutcomeKind::parse, RUN_OUTCOMES)?;
            optional_string(map, t, "regression_of_run_id", 256)?;
            optional_string(map, t, "reason", 4096)
        }
        EventType::VerificationPreflightApproved => {
            let Some(Value::Array(criteria)) = map.get("criteria") else {
                return Err(Rejection::Invalid(
                    "verification_preflight_approved payload field `criteria` must be a list of 1 to 32 acceptance criteria".into(),
                ));
            };
            if criteria.is_empty()
                || criteria.len() > MAX_CRITERIA
                || !criteria.iter().all(|c| {
                    c.as_str()
                        .is_some_and(|c| !c.trim().is_empty() && c.len() <= 1024)
                })
            {
                return Err(Rejection::Invalid(format!(
                    "verification_preflight_approved payload field `criteria` must be a list of 1 to {MAX_CRITERIA} non-empty strings of at most 1024 bytes"
                )));
            }
            optional_string(map, t, "evaluator", 256)?;
            string_field(map, t, "evaluator")?;
            string_field(map, t, "approved_by")?;
            for k in ["run_configuration_digest", "criteria_digest"] {
                if !map.get(k).and_then(Value::as_str).is_some_and(is_sha256) {
                    return Err(Rejection::Invalid(format!(
                        "verification_preflight_approved payload field `{k}` must be sha256: and 64 hex digits"
                    )));
                }
            }
            Ok(())
        }
        EventType::VerificationEvaluated => {
            if map
                .get("preflight_seq")
                .and_then(Value::as_u64)
                .is_none_or(|s| s == 0)
            {
                return Err(Rejection::Invalid(
                    "verification_evaluated payload field `preflight_seq` must be the sequence of the run's verification_preflight_approved".into(),
                ));
            }
            optional_string(map, t, "evaluator", 256)?;
            string_field(map, t, "evaluator")?;
            optional_string(map, t, "notes", 4096)?;
            one_of(
                map,
                t,
                "verdict",
                |s| matches!(s, "pass" | "fail").then_some(()),
                "pass, fail",
            )
        }
        EventType::WorkItemCreated => {
            string_field(map, t, "work_item_id")?;
            string_field(map, t, "parent_work_item_id")?;
            optional_string(map, t, "title", 1024)
        }
        EventType::WorkItemStarted
        | EventType::WorkItemBlocked
        | EventType::WorkItemCompleted
        | EventType::WorkItemFailed
        | EventType::WorkItemAbandoned => {
            string_field(map, t, "work_item_id")?;
            optional_string(map, t, "reason", 4096)
        }
        EventType::ArtifactCreated => {
            string_field(map, t, "artifact_id")?;
            validate_artifact(field(map, t, "artifact")?)
        }
        EventType::MemoryRecalled | EventType::MemoryApplied | EventType::MemoryRejected => {
            validate_attribution(t, field(map, t, "memory_attribution")?)
        }
        EventType::MemoryAnnotated => {
            string_field(map, t, "memory_id")?;
            string_field(map, t, "scope")?;
            string_field(map, t, "memory_key")?;
            if !map
                .get("content_hash")
                .and_then(Value::as_str)
                .is_some_and(is_sha256)
            {
                return Err(Rejection::Invalid(
                    "memory_annotated payload field `content_hash` must be sha256: and 64 hex digits (the server sets it)".into(),
                ));
            }
            optional_string(map, t, "note", 2048)?;
            string_field(map, t, "note").map(|_| ())
        }
        EventType::MemoryFeedback => {
            string_field(map, t, "memory_id")?;
            for k in ["receipt_hash", "content_hash"] {
                if !map.get(k).and_then(Value::as_str).is_some_and(is_sha256) {
                    return Err(Rejection::Invalid(format!(
                        "memory_feedback payload field `{k}` must be sha256: and 64 hex digits (the server sets it from the receipt)"
                    )));
                }
            }
            if map
                .get("rank")
                .and_then(Value::as_u64)
                .is_none_or(|r| r == 0)
            {
                return Err(Rejection::Invalid(
                    "memory_feedback payload field `rank` must be an integer >= 1".into(),
                ));
            }
            one_of(
                map,
                t,
                "signal",
                |s| matches!(s, "helpful" | "misleading" | "outdated").then_some(()),
                "helpful, misleading, outdated",
            )
        }
        EventType::SignalClaimed | EventType::SignalLeaseExtended | EventType::SignalAcked => {
            let id = string_field(map, t, "signal_id")?;
            if id.len() > 256 {
                return Err(Rejection::Invalid(format!(
                    "{} payload field `signal_id` is longer than 256 bytes",
                    t.as_str()
                )));
            }
            if t == EventType::SignalClaimed {
                optional_string(map, t, "holder", 256)?;
                string_field(map, t, "holder")?;
            } else {
                match map.get("fencing_token").and_then(Value::as_u64) {
                    Some(n) if n >= 1 => {}
                    _ => {
                        return Err(Rejection::Invalid(format!(
                            "{} payload field `fencing_token` must be an integer >= 1",
                            t.as_str()
                        )));
                    }
                }
            }
            if t != EventType::SignalAcked {
                let (min, max) = (super::signal::MIN_LEASE_MS, super::signal::MAX_LEASE_MS);
                match map.get("lease_ms").and_then(Value::as_u64) {
                    Some(ms) if (min..=max).contains(&ms) => {}
                    _ => {
                        return Err(Rejection::Invalid(format!(
                            "{} payload field `lease_ms` must be {min} to {max} (1 s to 1 h)",
                            t.as_str()
                        )));
                    }
                }
            }
            Ok(())
        }
        EventType::GuardrailEvaluated => {
            string_field(map, t, "guardrail")?;
            one_of(
                map,
                t,
                "result",
                |s| matches!(s, "pass" | "block" | "skip").then_some(()),
                "pass, block, skip",
            )
        }
        EventType::EffectAttempted => {
            string_field(map, t, "tool")?;
            string_field(map, t, "idempotency_key")?;
            match map.get("irreversible") {
                None | Some(Value::Bool(_)) => Ok(()),
                Some(_) => Err(Rejection::Invalid(
                    "EffectAttempted payload field `irreversible` must be a boolean".into(),
                )),
            }
        }
        EventType::EffectOutcomeObserved => {
            string_field(map, t, "idempotency_key")?;
            one_of(
                map,
                t,
                "outcome",
                Outcome::parse,
                "confirmed, refused, unknown",
            )?;
            if map.contains_key("via") {
                one_of(map, t, "via", Via::parse, "direct, reconciliation, human")?;
            }
            Ok(())
        }
        EventType::HumanReviewRequested => {
            string_field(map, t, "reason")?;
            match map.get("approval") {
                None | Some(Value::Bool(false)) => Ok(()),
                Some(Value::Bool(true)) => {
                    // Asking approval for an attempt: of which effect, of which tool.
                    string_field(map, t, "idempotency_key")?;
                    string_field(map, t, "tool")?;
                    Ok(())
                }
                Some(_) => Err(Rejection::Invalid(
                    "HumanReviewRequested payload field `approval` must be a boolean".into(),
                )),
            }
        }
        EventType::HumanReviewResolved => {
            string_field(map, t, "decision")?;
            if map.contains_key("idempotency_key") {
                string_field(map, t, "idempotency_key")?;
                one_of(
                    map,
                    t,
                    "decision",
                    |s| {
                        (matches!(s, "approved" | "rejected")
                            || Outcome::parse(s).is_some_and(|o| o != Outcome::Unknown))
                        .then_some(())
                    },
                    "confirmed, refused (an outcome), approved, rejected (an approval)",
                )?;
            }
            Ok(())
        }
    }
}

/// The `via` of an outcome payload (`direct` when absent).
pub(super) fn via_of(payload: &Value) -> Via {
    payload
        .get("via")
        .and_then(Value::as_str)
        .and_then(Via::parse)
        .unwrap_or(Via::Direct)
}
