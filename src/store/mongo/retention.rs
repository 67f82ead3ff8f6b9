//! Retention: the application sweeper (no TTL indexes) and its audit trail.
//!
//! A sweep deletes, per a deployment-owned policy:
//! - states still pending (registered in their binding's `pending` registry) after the
//!   pending TTL. A state is first unregistered, with a conditional update of the
//!   binding document, and only then deleted; a commit's compare-and-set requires the
//!   registration, so exactly one of "committed" and "swept" happens, and a head never
//!   names a deleted state. Candidates come from the sparse `pending_since` index; a
//!   committed candidate just leaves it (its `pending_since` is removed), so each state
//!   is examined by at most one sweep after its commit.
//! - bindings without write activity for the conversation TTL, with all their state. A
//!   binding is first marked `retiring` with a conditional update (only if still
//!   inactive), which removes it from every caller's view and fails every fence check;
//!   then its state documents are deleted, then the binding document. A sweep that
//!   dies in between leaves a retiring binding that the next sweep (it is still
//!   inactive) or an `ensure_binding` of the same conversation finishes.

use std::collections::HashMap;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::{
    MongoContext, MongoStore, corrupt,
    layout::{AuditView, SessionView, decode, dt},
};
use crate::{
    domain::{ids::BindingId, state::Rejection},
    store::{AuditRecord, Result, RetentionPolicy, SweepReport, now_ms},
};

/// Documents a sweep examines per round trip.
const SWEEP_BATCH: i64 = 500;

/// A state document the pending sweep examines.
struct Candidate {
    id: String,
    epoch: i64,
    state_id: String,
}

impl MongoStore {
    pub(super) async fn write_audit(
        &self,
        action: &str,
        binding: Option<&BindingId>,
        detail: &serde_json::Value,
    ) -> Result<()> {
        let detail_json = serde_json::to_string(detail).map_err(|e| corrupt("audit detail", e))?;
        self.audit
            .insert_one(doc! {
                "at": dt(now_ms()),
                "action": action,
                "binding_id": binding.map_or(Bson::Null, |b| Bson::String(b.as_str().to_owned())),
                "detail_json": detail_json,
            })
            .await
            .ctx("writing an audit record")?;
        Ok(())
    }

    pub(super) async fn audit_records_impl(&self, limit: usize) -> Result<Vec<AuditRecord>> {
        let found: Vec<Document> = self
            .audit
            .find(doc! {})
            .sort(doc! { "at": -1, "_id": -1 })
            .limit(self.page(limit))
            .await
            .ctx("reading audit records")?
            .try_collect()
            .await
            .ctx("reading audit records")?;
        found
            .into_iter()
            .map(|d| {
                let view: AuditView = decode("audit record", d)?;
                let binding_id = match view.binding_id {
                    Some(id) => Some(
                        BindingId::parse(&id).ok_or_else(|| corrupt("audit binding id", &id))?,
                    ),
                    None => None,
                };
                Ok(AuditRecord {
                    at_ms: view.at.timestamp_millis(),
                    action: view.action,
                    binding_id,
                    detail: serde_json::from_str(&view.detail_json)
                        .map_err(|e| corrupt("audit detail", e))?,
                })
            })
            .collect()
    }

    pub(super) async fn sweep_impl(
        &self,
        policy: &RetentionPolicy,
        now: i64,
    ) -> Result<SweepReport> {
        if policy.pending_ttl_ms < 0 || policy.conversation_ttl_ms.is_some_and(|t| t < 0) {
            return Err(Rejection::Invalid(format!(
                "retention policy {} has a negative TTL",
                policy.id
            ))
            .into());
        }
        let mut report = SweepReport {
            policy_id: policy.id.clone(),
            swept_at_ms: now,
            ..SweepReport::default()
        };
        report.pending_states_deleted = self
            .sweep_pending(now.saturating_sub(policy.pending_ttl_ms))
            .await?;
        if let Some(ttl) = policy.conversation_ttl_ms {
            self.sweep_conversations(now.saturating_sub(ttl), &mut report)
                .await?;
        }
        let detail = serde_json::to_value(&report).map_err(|e| corrupt("sweep report", e))?;
        self.write_audit("retention.sweep", None, &detail).await?;
        Ok(report)
    }

    /// Deletes states that were still pending when `cutoff` passed; settles the others.
    async fn sweep_pending(&self, cutoff: i64) -> Result<u64> {
        let old = doc! { "pending_since": { "$lt": dt(cutoff) } };
        let mut deleted = 0;
        loop {
            let candidates: Vec<Document> = self
                .state
                .find(old.clone())
                .limit(SWEEP_BATCH)
                .projection(doc! { "_id": 1, "binding_id": 1, "epoch": 1, "key": 1 })
                .await
                .ctx("finding old pending states")?
                .try_collect()
                .await
                .ctx("finding old pending states")?;
            if candidates.is_empty() {
                return Ok(deleted);
            }
            let mut groups: HashMap<String, Vec<Candidate>> = HashMap::new();
            for candidate in &candidates {
                let (Ok(id), Ok(binding), Ok(epoch), Ok(state_id)) = (
                    candidate.get_str("_id"),
                    candidate.get_str("binding_id"),
                    candidate.get_i64("epoch"),
                    candidate.get_str("key"),
                ) else {
                    return Err(corrupt("native state", format!("{candidate:?}")));
                };
                groups
                    .entry(binding.to_owned())
                    .or_default()
                    .push(Candidate {
                        id: id.to_owned(),
                        epoch,
                        state_id: state_id.to_owned(),
                    });
            }
            let bindings: Vec<&String> = groups.keys().collect();
            let sessions = self
                .find_by_ids(
                    &self.sessions,
                    &bindings,
                    doc! { "_id": 1, "epoch": 1, "lease_generation": 1, "retiring": 1, "pending": 1 },
                )
                .await?;
            let mut doomed = Vec::new();
            let mut settled = Vec::new();
            for (binding, group) in &groups {
                let parsed = BindingId::parse(binding);
                let _serial = match &parsed {
                    Some(id) => self.exclusive(id).await,
                    None => None,
                };
                let session = match sessions.get(binding) {
                    Some(found) => Some(decode::<SessionView>("binding", found.clone())?),
                    None => None,
                };
                for candidate in group {
                    let live = session
                        .as_ref()
                        .filter(|s| !s.is_retiring() && s.epoch == candidate.epoch);
                    match (live, &parsed) {
                        (Some(session), Some(id))
                            if session.pending.contains_key(&candidate.state_id) =>
                        {
                            // Unregistered first: from then on no commit can name it.
                            if self
                                .unregister_pending(id, candidate.epoch, &candidate.state_id)
                                .await?
                            {
                                doomed.push(candidate.id.clone());
                            } else {
                                settled.push(candidate.id.clone()); // committed meanwhile
                            }
                        }
                        // Committed: it stays; it only leaves the pending index.
                        (Some(_), Some(_)) => settled.push(candidate.id.clone()),
                        // Its binding or epoch is gone: nothing can name it.
                        _ => doomed.push(candidate.id.clone()),
                    }
                }
            }
            if !doomed.is_empty() {
                let gone = self
                    .state
                    .delete_many(doc! { "_id": { "$in": &doomed } })
                    .await
                    .ctx("deleting old pending states")?;
                deleted += gone.deleted_count;
            }
            if !settled.is_empty() {
                self.state
                    .update_many(
                        doc! { "_id": { "$in": &settled } },
                        doc! { "$unset": { "pending_since": "" } },
                    )
                    .await
                    .ctx("settling committed states")?;
            }
            // Every candidate was deleted or left the index: the next listing is new.
            if i64::try_from(candidates.len()).unwrap_or(i64::MAX) < SWEEP_BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Deletes bindings inactive since before `cutoff`, with all their state.
    async fn sweep_conversations(&self, cutoff: i64, report: &mut SweepReport) -> Result<()> {
        let inactive = doc! { "last_activity_at": { "$lt": dt(cutoff) } };
        // Paged by id, so a binding skipped below is not listed again.
        let mut after = String::new();
        loop {
            let mut page = inactive.clone();
            page.insert("_id", doc! { "$gt": &after });
            let found: Vec<Document> = self
                .sessions
                .find(page)
                .sort(doc! { "_id": 1 })
                .limit(SWEEP_BATCH)
                .projection(doc! { "_id": 1 })
                .await
                .ctx("finding inactive bindings")?
                .try_collect()
                .await
                .ctx("finding inactive bindings")?;
            let batch = found.len();
            for binding in found {
                let Ok(raw_id) = binding.get_str("_id") else {
                    continue;
                };
                after = raw_id.to_owned();
                let Some(id) = BindingId::parse(raw_id) else {
                    continue;
                };
                let _serial = self.exclusive(&id).await;
                // Only if still inactive: a write since the listing keeps the binding.
                let mut filter = inactive.clone();
                filter.insert("_id", id.as_str());
                let marked = self
                    .update_if(
                        &self.sessions,
                        filter,
                        doc! { "$set": { "retiring": true, "updated_at": dt(now_ms()) } },
                        Self::matched_only(),
                        "retiring a binding",
                    )
                    .await?;
                if marked.is_none() {
                    continue;
                }
                let (purged, deleted) = self.finish_retirement(&id).await?;
                report.states_deleted += purged.states;
                report.objects_deleted += purged.objects;
                report.stream_entries_deleted += purged.entries;
                report.bindings_deleted += u64::from(deleted);
            }
            if i64::try_from(batch).unwrap_or(i64::MAX) < SWEEP_BATCH {
                return Ok(());
            }
        }
    }
}
