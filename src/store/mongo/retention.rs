//! Retention: the application sweeper (no TTL indexes) and its audit trail.
//!
//! A sweep deletes, per a deployment-owned policy:
//! - pending states older than the pending TTL that no head names. A state is a
//!   candidate while it carries `pending_since` (cleared when it is committed) and was
//!   not touched within the TTL (every commit attempt touches its state before the head
//!   compare-and-set, so a sweep can never delete a state a commit is about to name; see
//!   `state::commit_head_impl`). A candidate that is its binding's current head (its
//!   committed flag was lost) is repaired instead of deleted.
//! - bindings without write activity for the conversation TTL, with all their state. A
//!   binding is first marked `retiring` with a conditional update (only if still
//!   inactive), which removes it from every caller's view and fails every fence check;
//!   then its state documents are deleted, then the binding document. A sweep that
//!   dies in between leaves a retiring binding that the next sweep (it is still
//!   inactive) or an `ensure_binding` of the same conversation finishes.

use std::collections::{HashMap, HashSet};

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::{
    MongoContext, MongoStore, corrupt,
    layout::{AuditView, decode, dt, state_doc_id},
};
use crate::{
    domain::{ids::BindingId, state::Rejection},
    store::{AuditRecord, Result, RetentionPolicy, SweepReport, now_ms},
};

/// Documents a sweep examines per round trip.
const SWEEP_BATCH: i64 = 500;

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

    /// Deletes uncommitted states older than `cutoff` that no head names.
    async fn sweep_pending(&self, cutoff: i64) -> Result<u64> {
        let stale =
            doc! { "pending_since": { "$lt": dt(cutoff) }, "touched_at": { "$lt": dt(cutoff) } };
        let mut deleted = 0;
        loop {
            let candidates: Vec<Document> = self
                .state
                .find(stale.clone())
                .limit(SWEEP_BATCH)
                .projection(doc! { "_id": 1, "binding_id": 1, "epoch": 1 })
                .await
                .ctx("finding stale pending states")?
                .try_collect()
                .await
                .ctx("finding stale pending states")?;
            if candidates.is_empty() {
                return Ok(deleted);
            }
            let bindings: HashSet<&str> = candidates
                .iter()
                .filter_map(|c| c.get_str("binding_id").ok())
                .collect();
            let bindings: Vec<&str> = bindings.into_iter().collect();
            // The current head of each binding: its state is never deleted, whatever its
            // flag says. Missing and retiring bindings protect nothing.
            let heads: HashMap<String, String> = self
                .sessions
                .find(doc! { "_id": { "$in": &bindings }, "retiring": { "$exists": false } })
                .projection(doc! { "epoch": 1, "state_ref.durable_head": 1 })
                .await
                .ctx("reading heads for a sweep")?
                .try_collect::<Vec<Document>>()
                .await
                .ctx("reading heads for a sweep")?
                .into_iter()
                .filter_map(|s| {
                    let id = BindingId::parse(s.get_str("_id").ok()?)?;
                    let epoch = s.get_i64("epoch").ok()?;
                    let head = s
                        .get_document("state_ref")
                        .ok()?
                        .get_str("durable_head")
                        .ok()?;
                    Some((id.as_str().to_owned(), state_doc_id(&id, epoch, head)))
                })
                .collect();
            // Grouped by binding, so that where updates are serialized in-process
            // (FerretDB) each binding's share runs under its lock.
            let mut groups: HashMap<&str, (Vec<Bson>, Vec<Bson>)> = HashMap::new();
            for candidate in &candidates {
                let Some(id) = candidate.get("_id").cloned() else {
                    continue;
                };
                let binding = candidate.get_str("binding_id").unwrap_or("");
                let is_head = heads
                    .get(binding)
                    .is_some_and(|head| Some(head.as_str()) == id.as_str());
                let (repair, doomed) = groups.entry(binding).or_default();
                if is_head {
                    repair.push(id)
                } else {
                    doomed.push(id)
                }
            }
            let mut progressed = false;
            if self.serial.is_some() {
                for (binding, (repair, doomed)) in groups {
                    let _serial = match BindingId::parse(binding) {
                        Some(id) => self.exclusive(&id).await,
                        None => None,
                    };
                    let (n, moved) = self.sweep_apply(&stale, repair, doomed).await?;
                    deleted += n;
                    progressed |= moved;
                }
            } else {
                let (repair, doomed) = groups.into_values().fold(
                    (Vec::new(), Vec::new()),
                    |(mut r, mut d), (gr, gd)| {
                        r.extend(gr);
                        d.extend(gd);
                        (r, d)
                    },
                );
                let (n, moved) = self.sweep_apply(&stale, repair, doomed).await?;
                deleted += n;
                progressed = moved;
            }
            if !progressed || i64::try_from(candidates.len()).unwrap_or(i64::MAX) < SWEEP_BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Repairs the committed flag of candidates that are heads and deletes the others
    /// (still only if stale); returns how many were deleted and whether anything moved.
    async fn sweep_apply(
        &self,
        stale: &Document,
        repair: Vec<Bson>,
        doomed: Vec<Bson>,
    ) -> Result<(u64, bool)> {
        let mut progressed = false;
        if !repair.is_empty() {
            let repaired = self
                .state
                .update_many(
                    doc! { "_id": { "$in": repair } },
                    doc! { "$unset": { "pending_of": "", "pending_since": "" } },
                )
                .await
                .ctx("repairing committed flags")?;
            progressed |= repaired.modified_count > 0;
        }
        let mut deleted = 0;
        if !doomed.is_empty() {
            // The staleness test is repeated in the delete: a commit that touched a
            // candidate since it was listed keeps it (and it drops out of the next
            // listing by itself).
            let mut filter = stale.clone();
            filter.insert("_id", doc! { "$in": doomed });
            deleted = self
                .state
                .delete_many(filter)
                .await
                .ctx("deleting stale pending states")?
                .deleted_count;
            progressed = true;
        }
        Ok((deleted, progressed))
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
