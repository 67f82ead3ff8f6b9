//! The server's part of strong verification (docs/ledger.md "Verified success"): who may
//! approve a preflight and record a verdict, the fields only the server sets, receipts
//! turned into what an outcome records, and receipts minted for passing verdicts.

use serde_json::{Value, json};

use super::{AppState, auth::Caller, error::ApiError};
use crate::domain::{
    ids::content_digest,
    ledger::{EventType, LedgerState, canonical_json, verification},
    state::StateScope,
};

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid(message.into())
}

/// Checks and rewrites a payload before it is appended: a preflight gets its approver and
/// criteria digest; an outcome's `verification_receipt` becomes its `verification`.
pub fn resolve(
    state: &AppState,
    caller: &Caller,
    scope: &StateScope,
    event_type: EventType,
    run_id: &str,
    payload: &mut Value,
) -> Result<(), ApiError> {
    rewrite(state, caller, scope, event_type, run_id, payload)?;
    // A verification receipt is presented once, as `verification_receipt` on an outcome;
    // anywhere else it would be stored. Refused, and never echoed.
    if let Some(path) = receipt_path(payload, &mut Vec::new()) {
        return Err(invalid(format!(
            "payload field `{path}` holds a verification receipt; present it as `verification_receipt` on a governed-v2 verified_success, it is never stored"
        )));
    }
    Ok(())
}

fn receipt_path(value: &Value, path: &mut Vec<String>) -> Option<String> {
    match value {
        Value::String(s) if s.trim_start().starts_with(verification::PREFIX) => {
            Some(path.join("."))
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| {
            path.push(i.to_string());
            let found = receipt_path(v, path);
            path.pop();
            found
        }),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            path.push(k.clone());
            let found = receipt_path(v, path);
            path.pop();
            found
        }),
        _ => None,
    }
}

fn rewrite(
    state: &AppState,
    caller: &Caller,
    scope: &StateScope,
    event_type: EventType,
    run_id: &str,
    payload: &mut Value,
) -> Result<(), ApiError> {
    let Some(map) = payload.as_object_mut() else {
        return Ok(()); // the payload rules refuse a non-object
    };
    match event_type {
        EventType::VerificationPreflightApproved | EventType::VerificationEvaluated => {
            if matches!(caller, Caller::Worker(_)) {
                return Err(ApiError::forbidden(format!(
                    "a sandbox worker cannot record {}: the criteria and the verdict on a run come from a control-plane caller, never from the run's own worker",
                    event_type.as_str()
                )));
            }
            if event_type == EventType::VerificationPreflightApproved {
                for server_set in ["approved_by", "criteria_digest"] {
                    if map.contains_key(server_set) {
                        return Err(invalid(format!(
                            "verification_preflight_approved payload field `{server_set}` is set by the server"
                        )));
                    }
                }
                if let Some(criteria) = map.get("criteria") {
                    let digest = content_digest(canonical_json(criteria).as_bytes());
                    map.insert("criteria_digest".into(), json!(digest));
                }
                map.insert("approved_by".into(), json!(caller.principal()));
            }
            Ok(())
        }
        EventType::RunCompleted | EventType::RunOutcomeCorrected => {
            if map.contains_key("verification") {
                return Err(invalid(
                    "payload field `verification` is set by the server; present `verification_receipt`",
                ));
            }
            let Some(given) = map.remove("verification_receipt") else {
                return Ok(());
            };
            let Some(text) = given.as_str() else {
                return Err(invalid(
                    "payload field `verification_receipt` must be a string",
                ));
            };
            let receipt = verification::decode(state.keyring(), text)?;
            if receipt.binding_id != scope.binding_id.as_str()
                || receipt.epoch != scope.epoch
                || receipt.run_id != run_id
            {
                return Err(invalid(
                    "the verification receipt was issued for another run, workspace or epoch",
                ));
            }
            let recorded = verification::recorded(text, receipt);
            map.insert(
                "verification".into(),
                serde_json::to_value(recorded).unwrap_or(Value::Null),
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The receipt for a `verification_evaluated` the ledger now holds, if it passed and is
/// still the run's current evaluation.
pub fn mint(
    state: &AppState,
    scope: &StateScope,
    run_id: &str,
    evaluated_seq: u64,
    head: &LedgerState,
) -> Option<String> {
    let ep = &head.runs.get(run_id)?.episode;
    let (pre, eval) = (ep.preflight.as_ref()?, ep.evaluation.as_ref()?);
    if eval.seq != evaluated_seq || eval.verdict != "pass" || eval.preflight_seq != pre.seq {
        return None;
    }
    Some(verification::encode(
        state.keyring(),
        &verification::VerificationReceipt {
            binding_id: scope.binding_id.as_str().to_owned(),
            epoch: scope.epoch,
            run_id: run_id.to_owned(),
            evaluated_seq,
            preflight_seq: pre.seq,
            criteria_digest: pre.criteria_digest.clone(),
            artifacts_digest: eval.artifacts_digest.clone(),
            run_configuration_digest: pre.run_configuration_digest.clone(),
            evaluator: pre.evaluator.clone(),
        },
    ))
}
