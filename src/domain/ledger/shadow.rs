//! `memory_utility_shadow` (`spec/003_bab976795353d872.txt` "Receipt-Bound Memory
//! Attribution"): review evidence about each memory, rebuilt from the ledger on every
//! read and never stored, never read by recall ranking, authority, promotion or policy
//! (its score is zero by construction: nothing consumes it but a person).
//!
//! Only source links that cite a feedback (`feedback_seq`) count, and only while that
//! feedback is still the effective head for its exposure and the link's run has a
//! current outcome head. Manual references (always review-required) never count.
//! - `supporting_run_count`: distinct runs with `helpful` feedback and a strong verified
//!   success (a governed-v2 `verified_success` bound to a current server-minted
//!   verification receipt; a version-1 `verified_success` reads as `legacy_declared` and
//!   never counts).
//! - `contradicting_run_count`: distinct runs with `misleading` or `outdated` feedback
//!   and a `failed`, `user_corrected` or `regression` outcome.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use super::{EventType, LedgerEvent, LedgerState, OutcomeStrength, RunOutcomeKind};

/// The shadow counters of one memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryUtility {
    pub supporting_run_count: u64,
    pub contradicting_run_count: u64,
    /// Links that met every condition (either way), for a reviewer.
    pub counted_links: u64,
}

/// Whether an outcome head is strong verification.
fn strong(strength: OutcomeStrength) -> bool {
    match strength {
        OutcomeStrength::Verified => true,
        OutcomeStrength::Declared | OutcomeStrength::LegacyDeclared => false,
    }
}

/// Folds the counters from the epoch's events (in order) and the head read with them.
pub fn memory_utility_shadow<'a>(
    events: impl IntoIterator<Item = &'a LedgerEvent>,
    head: &LedgerState,
) -> BTreeMap<String, MemoryUtility> {
    let mut supporting: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut contradicting: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for event in events {
        if !matches!(
            event.event_type,
            EventType::MemoryApplied | EventType::MemoryRejected
        ) {
            continue;
        }
        let a = &event.payload["memory_attribution"];
        let text = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or_default();
        if text("relation") != "source" || a["review_required"] == Value::Bool(true) {
            continue;
        }
        let Some(feedback_seq) = a.get("feedback_seq").and_then(Value::as_u64) else {
            continue;
        };
        let memory = text("memory_id");
        let key = format!("{memory}|{}", text("receipt_hash"));
        let Some(feedback) = head
            .memory_feedback
            .get(&key)
            .filter(|f| f.seq == feedback_seq)
        else {
            continue; // superseded feedback earns nothing
        };
        let Some(outcome) = head
            .runs
            .get(&event.run_id)
            .and_then(|r| r.episode.outcome_head.as_ref())
        else {
            continue; // no current outcome yet
        };
        let helpful = feedback.signal == "helpful";
        let against = matches!(feedback.signal.as_str(), "misleading" | "outdated");
        let success =
            outcome.outcome == RunOutcomeKind::VerifiedSuccess && strong(outcome.strength);
        let failure = matches!(
            outcome.outcome,
            RunOutcomeKind::Failed | RunOutcomeKind::UserCorrected | RunOutcomeKind::Regression
        );
        *counted.entry(memory.to_owned()).or_default() += 1;
        if helpful && success {
            supporting
                .entry(memory.to_owned())
                .or_default()
                .insert(event.run_id.clone());
        }
        if against && failure {
            contradicting
                .entry(memory.to_owned())
                .or_default()
                .insert(event.run_id.clone());
        }
    }
    counted
        .into_iter()
        .map(|(memory, links)| {
            let n = |m: &BTreeMap<String, BTreeSet<String>>| {
                m.get(&memory).map_or(0, |runs| runs.len() as u64)
            };
            let utility = MemoryUtility {
                supporting_run_count: n(&supporting),
                contradicting_run_count: n(&contradicting),
                counted_links: links,
            };
            (memory, utility)
        })
        .collect()
}
