//! Receipt-bound memory attribution on the ledger (`spec/003_bab976795353d872.txt`
//! "Receipt-Bound Memory Attribution"): before a `memory_recalled`, `memory_applied` or
//! `memory_rejected` event is appended, the caller's attribution is checked against the
//! signed recall receipt and the memories as they are now, and replaced by its stored
//! form (the receipt's hash, the memory, its rank and exact content version). The
//! receipt itself is never stored, and a receipt anywhere else in a payload is refused
//! without being echoed.

use serde_json::{Map, Value, json};

use super::{AppState, error::ApiError};
use crate::{
    domain::{
        ledger::EventType,
        memory::{MemoryContext, MemoryScope, Namespace, receipt},
        state::{BindingRecord, StateScope},
    },
    store::now_ms,
};

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid(message.into())
}

/// Refuses receipt-shaped strings anywhere in `value`, naming only the field.
fn refuse_receipts(value: &Value, event_type: EventType) -> Result<(), ApiError> {
    match receipt::find_receipt_shaped(value) {
        Some(path) => Err(invalid(format!(
            "{} payload field `{path}` holds a recall receipt: receipts are cited only as memory_attribution.receipt of memory_recalled, and never stored",
            event_type.as_str()
        ))),
        None => Ok(()),
    }
}

fn object<'a>(
    value: &'a Value,
    what: &str,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, ApiError> {
    let Value::Object(map) = value else {
        return Err(invalid(format!("{what} must be an object")));
    };
    if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(format!(
            "{what}.{k} is not accepted (expected: {}); the server sets relation, receipt hash and review state",
            allowed.join(", ")
        )));
    }
    Ok(map)
}

fn text<'a>(map: &'a Map<String, Value>, what: &str, k: &str) -> Result<&'a str, ApiError> {
    map.get(k)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(format!("{what}.{k} must be a non-empty string")))
}

fn rank(map: &Map<String, Value>, what: &str) -> Result<u64, ApiError> {
    map.get("rank")
        .and_then(Value::as_u64)
        .filter(|r| *r >= 1)
        .ok_or_else(|| invalid(format!("{what}.rank must be an integer >= 1")))
}

/// Checks and rewrites the payload of an event before it is appended.
pub async fn resolve(
    state: &AppState,
    record: &BindingRecord,
    scope: &StateScope,
    event_type: EventType,
    run_id: &str,
    payload: &mut Value,
) -> Result<(), ApiError> {
    let Some(map) = payload.as_object_mut() else {
        return Ok(()); // the payload rules refuse a non-object
    };
    if event_type == EventType::MemoryFeedback {
        return feedback(state, record, scope, payload);
    }
    if event_type == EventType::MemoryAnnotated {
        return annotation(state, record, payload).await;
    }
    if !event_type.attributes_memory() {
        return refuse_receipts(payload, event_type);
    }
    let what = "memory_attribution";
    let Some(given) = map.remove(what) else {
        return Err(invalid(format!(
            "{} needs a memory_attribution",
            event_type.as_str()
        )));
    };
    refuse_receipts(payload, event_type)?;
    let stored = match event_type {
        EventType::MemoryRecalled => recalled(state, record, scope, &given).await?,
        _ => applied(state, scope, run_id, &given).await?,
    };
    if let Some(map) = payload.as_object_mut() {
        map.insert(what.into(), stored);
    }
    Ok(())
}

/// `memory_feedback`: the caller names the receipt, the memory and its rank; the server
/// checks them against the signed receipt and stores the receipt's hash and the exact
/// content version it showed instead of the receipt.
fn feedback(
    state: &AppState,
    record: &BindingRecord,
    scope: &StateScope,
    payload: &mut Value,
) -> Result<(), ApiError> {
    let what = "memory_feedback payload";
    let given = payload.clone();
    let map = object(&given, what, &["receipt", "memory_id", "rank", "signal"])?;
    let signed = text(map, what, "receipt")?;
    let memory_id = text(map, what, "memory_id")?;
    let r = rank(map, what)?;
    let receipt = receipt::decode(state.keyring(), signed)?;
    if receipt.binding_id != record.binding_id.as_str() || receipt.epoch != scope.epoch {
        return Err(invalid(
            "the recall receipt was issued to another workspace or epoch",
        ));
    }
    let Some(item) = receipt
        .items
        .iter()
        .find(|it| it.memory_id == memory_id && u64::from(it.rank) == r)
    else {
        return Err(invalid(format!(
            "memory {memory_id} at rank {r} is not in the recall receipt"
        )));
    };
    *payload = json!({
        "receipt_hash": receipt::receipt_hash(signed),
        "memory_id": memory_id,
        "rank": r,
        "content_hash": item.content_hash,
        "signal": map.get("signal").cloned().unwrap_or(Value::Null),
    });
    Ok(())
}

/// `memory_annotated`: the caller names the memory by scope and key and writes a note;
/// the server finds the memory in the workspace's memory context, records its id and
/// exact content version, and stores the note only after the memory scanner: secrets
/// are redacted and a note that tries to grant authority is refused.
async fn annotation(
    state: &AppState,
    record: &BindingRecord,
    payload: &mut Value,
) -> Result<(), ApiError> {
    let what = "memory_annotated payload";
    refuse_receipts(payload, EventType::MemoryAnnotated)?;
    let given = payload.clone();
    let map = object(&given, what, &["scope", "key", "note"])?;
    let scope_name = text(map, what, "scope")?;
    let key = text(map, what, "key")?;
    let note = text(map, what, "note")?;
    if note.len() > 2048 {
        return Err(invalid("a note is at most 2048 bytes"));
    }
    let scope = crate::domain::memory::parse_scope(scope_name)
        .ok_or_else(|| invalid("scope must be user, agent or organization"))?;
    if let Some(a) = crate::domain::memory::scan::authority_attempt(note) {
        return Err(ApiError::forbidden(format!(
            "the note tries to grant authority ({}); memory cannot grant tools, credentials, network destinations, models, sandbox profiles or scopes",
            a.as_str()
        )));
    }
    let (note, _) = crate::domain::memory::scan::redact(note);
    let namespaces = namespaces_of(state, record);
    let Some(ns) = namespaces.iter().find(|n| n.scope == scope) else {
        return Err(invalid("this workspace has no memory in that scope"));
    };
    let current = state
        .store()
        .get_memory(ns, key, false, now_ms())
        .await?
        .ok_or_else(|| ApiError::not_found("memory"))?;
    *payload = json!({
        "memory_id": current.id,
        "scope": scope_name,
        "memory_key": key,
        "content_hash": current.content_hash,
        "note": note,
    });
    Ok(())
}

async fn recalled(
    state: &AppState,
    record: &BindingRecord,
    scope: &StateScope,
    given: &Value,
) -> Result<Value, ApiError> {
    let what = "memory_attribution";
    let a = object(given, what, &["receipt", "selected"])?;
    let signed = text(a, what, "receipt")?;
    let receipt = receipt::decode(state.keyring(), signed)?;
    if receipt.binding_id != record.binding_id.as_str() || receipt.epoch != scope.epoch {
        return Err(invalid(
            "the recall receipt was issued to another workspace or epoch",
        ));
    }
    let Some(Value::Array(selected)) = a.get("selected") else {
        return Err(invalid(
            "memory_attribution.selected must be a list of {memory_id, rank}",
        ));
    };
    match (receipt.items.is_empty(), selected.len()) {
        (true, 0) => {}
        (true, _) => {
            return Err(invalid("the recall receipt shows no results: select none"));
        }
        (false, 0) => {
            return Err(invalid(
                "select 1 to 32 memories from the receipt (zero only for a receipt with no results)",
            ));
        }
        (false, n) if n > ledger_max() => {
            return Err(invalid(format!("select at most {} memories", ledger_max())));
        }
        _ => {}
    }
    let namespaces = namespaces_of(state, record);
    let now = now_ms();
    let mut links = Vec::new();
    for (i, pick) in selected.iter().enumerate() {
        let where_ = format!("memory_attribution.selected.{i}");
        let pick = object(pick, &where_, &["memory_id", "rank"])?;
        let memory_id = text(pick, &where_, "memory_id")?;
        let r = rank(pick, &where_)?;
        let Some(item) = receipt
            .items
            .iter()
            .find(|it| it.memory_id == memory_id && u64::from(it.rank) == r)
        else {
            return Err(invalid(format!(
                "{where_}: memory {memory_id} at rank {r} is not in the recall receipt"
            )));
        };
        check_current(state, &namespaces, item, now).await?;
        links.push(json!({"memory_id": memory_id, "rank": r, "content_hash": item.content_hash}));
    }
    Ok(json!({"receipt_hash": receipt::receipt_hash(signed), "links": links}))
}

fn ledger_max() -> usize {
    crate::domain::ledger::MAX_ATTRIBUTED
}

/// The namespaces of the binding's memory context, by key.
fn namespaces_of(state: &AppState, record: &BindingRecord) -> Vec<Namespace> {
    let ctx = MemoryContext {
        subject: record.owner.clone(),
        agent_id: record.agent_id.clone(),
        organization: state
            .memory_policies()
            .snapshot()
            .deployment
            .organization
            .clone(),
    };
    [
        MemoryScope::User,
        MemoryScope::Agent,
        MemoryScope::Organization,
    ]
    .into_iter()
    .filter_map(|scope| Namespace::derive(state.keyring(), &ctx, scope).ok())
    .collect()
}

/// The selected memory still holds the exact content version the receipt showed.
async fn check_current(
    state: &AppState,
    namespaces: &[Namespace],
    item: &receipt::ReceiptItem,
    now: i64,
) -> Result<(), ApiError> {
    let Some(ns) = namespaces.iter().find(|n| n.key == item.namespace) else {
        return Err(invalid(
            "the recall receipt names a namespace outside this workspace's memory context",
        ));
    };
    let current = state
        .store()
        .get_memory(ns, &item.memory_key, false, now)
        .await?;
    match current {
        Some(r) if r.id == item.memory_id && r.content_hash == item.content_hash => Ok(()),
        Some(r) if r.id == item.memory_id => {
            Err(ApiError::from(crate::domain::state::Rejection::Conflict {
                what: format!(
                    "memory {} changed since the recall: its exact content version is no longer the one the receipt shows; recall again",
                    item.memory_id
                ),
            }))
        }
        _ => Err(ApiError::not_found(&format!("memory {}", item.memory_id))),
    }
}

async fn applied(
    state: &AppState,
    scope: &StateScope,
    run_id: &str,
    given: &Value,
) -> Result<Value, ApiError> {
    let what = "memory_attribution";
    let a = object(given, what, &["source", "manual"])?;
    match (a.get("source"), a.get("manual")) {
        (Some(source), None) => {
            let where_ = "memory_attribution.source";
            let s = object(
                source,
                where_,
                &["recalled_seq", "memory_id", "rank", "feedback_seq"],
            )?;
            let memory_id = text(s, where_, "memory_id")?;
            let r = rank(s, where_)?;
            let seq = s
                .get("recalled_seq")
                .and_then(Value::as_u64)
                .filter(|q| *q >= 1)
                .ok_or_else(|| invalid(format!("{where_}.recalled_seq must be the sequence of a memory_recalled event of this run")))?;
            let events = state
                .store()
                .ledger_events(scope, Some(run_id), seq - 1, 1)
                .await?;
            let Some(event) = events
                .into_iter()
                .find(|e| e.seq == seq && e.event_type == EventType::MemoryRecalled)
            else {
                return Err(invalid(format!(
                    "{where_}.recalled_seq {seq} is not a memory_recalled event of run {run_id}"
                )));
            };
            let stored = &event.payload["memory_attribution"];
            let link = stored["links"].as_array().and_then(|links| {
                links.iter().find(|l| {
                    l["memory_id"].as_str() == Some(memory_id) && l["rank"].as_u64() == Some(r)
                })
            });
            let Some(link) = link else {
                return Err(invalid(format!(
                    "{where_}: memory {memory_id} at rank {r} was not selected by memory_recalled {seq}"
                )));
            };
            let mut out = json!({
                "relation": "source",
                "receipt_hash": stored["receipt_hash"],
                "recalled_seq": seq,
                "memory_id": memory_id,
                "rank": r,
                "content_hash": link["content_hash"],
            });
            if let Some(given) = s.get("feedback_seq") {
                // Only the current effective feedback on this very exposure may be linked.
                let feedback_seq = given.as_u64().filter(|q| *q >= 1).ok_or_else(|| {
                    invalid(format!(
                        "{where_}.feedback_seq must be the sequence of a memory_feedback event"
                    ))
                })?;
                let receipt_hash = stored["receipt_hash"].as_str().unwrap_or_default();
                let head = state.store().ledger_state(scope).await?;
                let current = head
                    .memory_feedback
                    .get(&format!("{memory_id}|{receipt_hash}"))
                    .filter(|f| {
                        f.seq == feedback_seq
                            && f.rank == r
                            && Some(f.content_hash.as_str()) == link["content_hash"].as_str()
                    });
                let Some(feedback) = current else {
                    return Err(invalid(format!(
                        "{where_}.feedback_seq {feedback_seq} is not the current feedback on memory {memory_id} at rank {r} of that recall"
                    )));
                };
                out["feedback_seq"] = json!(feedback_seq);
                out["feedback_signal"] = json!(feedback.signal);
            }
            Ok(out)
        }
        (None, Some(manual)) => {
            let where_ = "memory_attribution.manual";
            let m = object(manual, where_, &["memory_id", "exact_content_version"])?;
            let memory_id = text(m, where_, "memory_id")?;
            let version = text(m, where_, "exact_content_version")?;
            Ok(json!({
                "relation": "manual",
                "memory_id": memory_id,
                "content_hash": version,
                "review_required": true,
            }))
        }
        _ => Err(invalid(
            "memory_attribution has exactly one of source {recalled_seq, memory_id, rank, feedback_seq?} or manual {memory_id, exact_content_version}",
        )),
    }
}
