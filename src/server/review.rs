//! Effect reviews through the interrupt protocol (spec 002 §5.2 and §5.3).
//!
//! A worker whose effect waits for a person (an outcome reconciliation could not settle,
//! or an attempt of a tool without a defence) commits its head with an interrupt of type
//! `effect_review` whose body names the effect (`idempotency_key`). The control plane
//! answers it like any interrupt (`POST .../interrupt/resume`); for this type the answer
//! is also the person's decision in the run ledger: before the interrupt is consumed,
//! the server appends `HumanReviewResolved` with the decision (and `response.result`, the
//! result the person found, for `confirmed`). The append is idempotent by the resume's
//! own key, so a resume retried after a crash between the two writes records the decision
//! once and then consumes the interrupt.
//!
//! Which decisions an `effect_review` may offer and what a resume records are decided by
//! the pure functions here; [`record_decision`] only reads and writes.

use serde_json::{Value, json};

use super::{AppState, error::ApiError};
use crate::domain::{
    ledger::{AppendRequest, EventType, NewEvent, Versions},
    state::{PendingInterrupt, StateScope},
};

/// The interrupt type of an effect review.
pub const EFFECT_REVIEW: &str = "effect_review";

/// Decisions on an effect's outcome and on an attempt's approval.
const OUTCOME_DECISIONS: [&str; 2] = ["confirmed", "refused"];
const APPROVAL_DECISIONS: [&str; 2] = ["approved", "rejected"];

/// Checks an `effect_review` interrupt a worker commits: its body names the effect and
/// its decisions are outcome decisions or approval decisions, not a mix.
pub fn validate(allowed_decisions: &[String], body: &Value) -> Result<(), ApiError> {
    if body
        .get("idempotency_key")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            "an effect_review interrupt names its effect: body.idempotency_key is required",
        ));
    }
    let all_in = |set: &[&str]| allowed_decisions.iter().all(|d| set.contains(&d.as_str()));
    if !(all_in(&OUTCOME_DECISIONS) || all_in(&APPROVAL_DECISIONS)) {
        return Err(ApiError::invalid(format!(
            "an effect_review interrupt offers outcome decisions (confirmed, refused) or approval decisions (approved, rejected), got: {}",
            allowed_decisions.join(", ")
        )));
    }
    Ok(())
}

/// What a resume of an effect review records.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub idempotency_key: String,
    pub decision: String,
    pub result: Option<Value>,
    pub interrupt_id: String,
}

/// The ledger decision a resume carries, when `pending` is the effect review being
/// resumed (same id and revision) and the decision is one it offers; `None` otherwise
/// (the store's resume then answers as for any interrupt).
pub fn decision_of(
    pending: &PendingInterrupt,
    interrupt_id: &str,
    revision: u64,
    decision: &str,
    response: &Value,
) -> Option<Decision> {
    if pending.kind != EFFECT_REVIEW
        || pending.interrupt_id != interrupt_id
        || pending.revision != revision
        || !pending.allowed_decisions.iter().any(|d| d == decision)
    {
        return None;
    }
    let key = pending.body.get("idempotency_key")?.as_str()?.to_owned();
    Some(Decision {
        idempotency_key: key,
        decision: decision.to_owned(),
        result: (decision == "confirmed")
            .then(|| response.get("result").cloned())
            .flatten(),
        interrupt_id: interrupt_id.to_owned(),
    })
}

/// Appends the person's decision to the ledger (as the control plane, at the binding's
/// current fence), unless the effect no longer waits for one (decided already, say by a
/// retried resume whose first try got this far).
pub async fn record_decision(
    state: &AppState,
    scope: &StateScope,
    decision: Decision,
    resume_key: &str,
) -> Result<(), ApiError> {
    let ledger = state.store().ledger_state(scope).await?;
    let Some(effect) = ledger.effects.get(&decision.idempotency_key) else {
        return Err(ApiError::not_found(&format!(
            "effect {} (named by interrupt {})",
            decision.idempotency_key, decision.interrupt_id
        )));
    };
    if !effect.status.is_unresolved() {
        return Ok(());
    }
    let mut payload = json!({
        "idempotency_key": decision.idempotency_key,
        "decision": decision.decision,
        "interrupt_id": decision.interrupt_id,
    });
    if let Some(result) = decision.result {
        payload["result"] = result;
    }
    let request = AppendRequest {
        event: NewEvent {
            event_type: EventType::HumanReviewResolved,
            run_id: effect.run_id.clone(),
            turn_id: effect.turn_id.clone(),
            agent_id: "human".to_owned(),
            lamport: None,
            versions: Versions::default(),
            payload,
        },
        idempotency: Some(
            state
                .keyring()
                .idempotency_digest(&scope.binding_id, "interrupt.resume.ledger", resume_key)
                .as_str()
                .to_owned(),
        ),
        expected_last_seq: None,
        budgets: state.ledger_budgets().rules(&scope.binding_id).budgets,
        approval_required: false,
        preconditions: None,
    };
    let appended = state.store().append_event(scope, &request).await?;
    state.metrics().ledger().appended(&appended);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(kind: &str, decisions: &[&str], body: Value) -> PendingInterrupt {
        PendingInterrupt {
            interrupt_id: "int-1".into(),
            kind: kind.into(),
            run_id: "lg-run".into(),
            namespace: vec![],
            agent_id: "refunds".into(),
            allowed_decisions: decisions.iter().map(|d| (*d).to_owned()).collect(),
            revision: 7,
            created_at_ms: 0,
            body,
        }
    }

    #[test]
    fn an_effect_review_names_its_effect_and_offers_one_kind_of_decision() {
        let key = json!({"idempotency_key": "eff-1"});
        let d = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(validate(&d(&["confirmed", "refused"]), &key).is_ok());
        assert!(validate(&d(&["approved", "rejected"]), &key).is_ok());
        for (decisions, body, needle) in [
            (d(&["confirmed"]), json!({}), "idempotency_key"),
            (
                d(&["confirmed"]),
                json!({"idempotency_key": ""}),
                "idempotency_key",
            ),
            (
                d(&["confirmed", "approved"]),
                key.clone(),
                "got: confirmed, approved",
            ),
            (d(&["approve"]), key.clone(), "got: approve"),
        ] {
            let e = validate(&decisions, &body).expect_err("refused");
            assert!(e.message.contains(needle), "{}", e.message);
        }
    }

    #[test]
    fn only_a_matching_resume_of_an_effect_review_records_a_decision() {
        let review = pending(
            EFFECT_REVIEW,
            &["confirmed", "refused"],
            json!({"idempotency_key": "eff-1"}),
        );
        let found = json!({"result": {"refund_id": "rf_1"}});
        assert_eq!(
            decision_of(&review, "int-1", 7, "confirmed", &found),
            Some(Decision {
                idempotency_key: "eff-1".into(),
                decision: "confirmed".into(),
                result: Some(json!({"refund_id": "rf_1"})),
                interrupt_id: "int-1".into(),
            })
        );
        // A refusal carries no result.
        let refused = decision_of(&review, "int-1", 7, "refused", &found).expect("refused");
        assert_eq!(refused.result, None);
        // Another interrupt, another revision, a decision it does not offer, another type:
        // nothing for the ledger (the store's resume refuses or answers as usual).
        assert_eq!(decision_of(&review, "int-2", 7, "confirmed", &found), None);
        assert_eq!(decision_of(&review, "int-1", 6, "confirmed", &found), None);
        assert_eq!(decision_of(&review, "int-1", 7, "approved", &found), None);
        let form = pending(
            "form_input",
            &["confirmed"],
            json!({"idempotency_key": "eff-1"}),
        );
        assert_eq!(decision_of(&form, "int-1", 7, "confirmed", &found), None);
    }
}
