//! Binding documents: creation, the fence, per-epoch counters, and clearing an epoch.
//!
//! # The fence and writes to other documents
//!
//! Changes to the binding document itself (head commit, pending-state registration,
//! interrupt consumption, uncertain runs, raising the fence, clearing) carry the fence
//! in their own filter: they are exact, like a row lock. State bodies, objects and
//! stream entries live in other documents, and without multi-document transactions a
//! write there cannot be atomic with a read of the fence. Those writes therefore:
//!
//! 1. check the fence before writing ([`MongoStore::admit_write`], or the registration
//!    or counter reservation, which is itself a conditional update of the binding
//!    document);
//! 2. write, tagging the document with the epoch (part of its id: another epoch never
//!    sees it), the writer's lease generation and a fresh `write_id`;
//! 3. re-read the fence ([`MongoStore::confirm`]); if it moved, undo their own write
//!    (only if it is still theirs: the filter carries their `write_id`) and return the
//!    stale rejection, exactly as if the check in step 1 had failed.
//!
//! The window that remains: a write whose step 1 passed just before the fence was raised
//! lands just after. Until its step 3 undoes it (one round trip later) another reader
//! may see it, and if the writer dies between steps 2 and 3 it stays. Such a write is
//! indistinguishable from one that landed just before the raise, which was legitimate:
//! the old worker held the lease until then, and its successor is started only after
//! `raise_fence` returned (a sandbox is claimed and becomes ready, which takes far
//! longer than a round trip), so the successor's first read already sees the settled
//! outcome in all but the crash case.
//!
//! What the window can never do is move the head: the head changes only by
//! `commit_head`, a single-document compare-and-set whose filter checks epoch and
//! generation atomically and requires the state to be registered as pending in that
//! epoch. A state body a stale writer stored becomes the head only if a worker holding
//! the current fence commits its id, which it learns only by writing under the same
//! idempotency key, i.e. the same payload. Such bodies are therefore not undone: undoing
//! one (unregister, then delete, as the retention sweep does) would make a successor
//! that already received its reference fail its commit, while keeping it is harmless (it
//! is invisible to other epochs, and the sweep removes it once the pending TTL passed).

use std::future::IntoFuture;

use futures::future::try_join4;
use mongodb::bson::{Bson, Document, doc};
use serde_json::json;

use super::{
    CAS_ATTEMPTS, MongoContext, MongoStore, backend, int, is_duplicate_key,
    layout::{
        FenceView, KIND_ENTRY, KIND_OBJECT, KIND_STATE, KIND_STREAM, SCHEMA_VERSION, SessionView,
        decode, dt, fence_projection,
    },
    not_found_binding, uint,
};
use crate::{
    domain::{
        ids::{BindingId, SubjectRef},
        state::{BindingRecord, Fence, Rejection, StateScope, check_key},
    },
    store::{ClearReport, Result, StoreError, now_ms},
};

// `last_activity_at` is refreshed by writes that do not already update the binding
// document only when it is older than `ACTIVITY_GRANULARITY_MS`.
use crate::store::ACTIVITY_GRANULARITY_MS;

/// Per-epoch counters of objects and streams in the binding document (`counts.*`).
/// Each is reserved with one conditional `$inc` before the document it counts is created
/// (the reservation is also the write's fence check), and released when the creation
/// turns out not to happen. A crash between reservation and release leaves the counter
/// too high, never too low; a counter at its limit is recounted exactly before anything
/// is refused, so drift heals itself and costs a count only at the limit. (Pending
/// states are counted exactly instead, see `state`: `counts.pending` moves with the
/// `pending` registry in the same updates.)
#[derive(Clone, Copy, Debug)]
pub(super) enum Counter {
    Objects,
    Streams,
}

impl Counter {
    fn field(self) -> &'static str {
        match self {
            Counter::Objects => "counts.objects",
            Counter::Streams => "counts.streams",
        }
    }
    pub(super) fn what(self) -> &'static str {
        match self {
            Counter::Objects => "objects",
            Counter::Streams => "streams",
        }
    }
}

/// What a purge of a binding's state documents removed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Purged {
    pub states: u64,
    pub objects: u64,
    pub entries: u64,
}

impl Purged {
    pub(super) fn any(&self) -> bool {
        self.states + self.objects + self.entries > 0
    }
}

/// The fields a new epoch starts with: no head, no interrupt, no uncertain runs, zero
/// counters. Shared by creation and clear.
fn fresh_epoch_fields(epoch: i64) -> Document {
    doc! {
        "epoch": epoch,
        "state_ref": { "durable_revision": 0_i64, "durable_head": Bson::Null },
        "terminal": Bson::Null,
        "pending_interrupt": Bson::Null,
        "uncertain_runs": {},
        "uncertain_count": 0_i64,
        "recent_resumes": [],
        "pending": {},
        "counts": { "pending": 0_i64, "objects": 0_i64, "streams": 0_i64 },
    }
}

pub(super) fn fence_of(view: &FenceView) -> Result<Fence> {
    stored_fence(view.epoch, view.lease_generation)
}

/// The fence as stored (BSON integers) in domain form.
pub(super) fn stored_fence(epoch: i64, lease_generation: i64) -> Result<Fence> {
    Ok(Fence {
        epoch: uint("epoch", epoch)?,
        lease_generation: uint("lease generation", lease_generation)?,
    })
}

/// The filter that matches the binding only while the scope holds its fence.
pub(super) fn fence_filter(scope: &StateScope) -> Result<Document> {
    Ok(doc! {
        "_id": scope.binding_id.as_str(),
        "epoch": int("epoch", scope.epoch)?,
        "lease_generation": int("lease generation", scope.lease_generation)?,
        "retiring": { "$exists": false },
    })
}

fn record_of(view: SessionView) -> Result<BindingRecord> {
    Ok(BindingRecord {
        binding_id: BindingId::parse(&view.id)
            .ok_or_else(|| super::corrupt("binding id", &view.id))?,
        owner: SubjectRef::parse(&view.owner_subject)
            .ok_or_else(|| super::corrupt("owner subject ref", &view.owner_subject))?,
        environment: view.environment_id,
        agent_id: view.agent_id,
        conversation_id: view.conversation_id,
        harness: view.harness_id,
        epoch: uint("epoch", view.epoch)?,
        lease_generation: uint("lease generation", view.lease_generation)?,
        created_at_ms: view.created_at.map_or(0, |t| t.timestamp_millis()),
    })
}

impl MongoStore {
    /// The fence view of a binding; `None` when it does not exist or is being deleted by
    /// retention (a retiring binding is gone for every caller).
    pub(super) async fn fence(&self, id: &BindingId) -> Result<Option<FenceView>> {
        let found = self
            .sessions
            .find_one(doc! { "_id": id.as_str() })
            .projection(fence_projection())
            .await
            .ctx("reading the fence")?;
        let Some(found) = found else { return Ok(None) };
        let view: FenceView = decode("binding fence", found)?;
        Ok((!view.retiring.unwrap_or(false)).then_some(view))
    }

    /// Checks a scope against its binding's fence: epoch first, then generation.
    pub(super) async fn admit(&self, scope: &StateScope) -> Result<FenceView> {
        let view = self
            .fence(&scope.binding_id)
            .await?
            .ok_or_else(|| not_found_binding(&scope.binding_id))?;
        fence_of(&view)?.admit(scope.epoch, scope.lease_generation)?;
        Ok(view)
    }

    /// The pre-write check of a write that reserves nothing; refreshes the binding's
    /// activity when it is stale (what conversation retention measures).
    pub(super) async fn admit_write(&self, scope: &StateScope, now: i64) -> Result<FenceView> {
        let view = self.admit(scope).await?;
        let last = view
            .last_activity_at
            .map_or(i64::MIN, |t| t.timestamp_millis());
        if last < now.saturating_sub(ACTIVITY_GRANULARITY_MS) {
            let touched = self
                .update_if(
                    &self.sessions,
                    fence_filter(scope)?,
                    doc! { "$max": { "last_activity_at": dt(now) } },
                    self.hinted(),
                    "recording activity",
                )
                .await?;
            if touched.is_none() {
                // The fence moved since the read: report how.
                return self.admit(scope).await;
            }
        }
        Ok(view)
    }

    /// The post-write check: the fence must still admit the scope (see the module
    /// documentation for what a miss means and what the caller undoes).
    pub(super) async fn confirm(&self, scope: &StateScope) -> Result<()> {
        self.admit(scope).await.map(drop)
    }

    /// Reserves `n` units of a counter of the scope's epoch, atomically with a fence
    /// check; refuses with `too_large` when the limit would be passed.
    pub(super) async fn reserve(
        &self,
        scope: &StateScope,
        counter: Counter,
        n: u64,
        limit: u64,
        now: i64,
    ) -> Result<()> {
        let too_many = || -> StoreError {
            Rejection::TooMany {
                what: counter.what(),
                limit,
            }
            .into()
        };
        let Some(room) = limit.checked_sub(n) else {
            return Err(too_many());
        };
        let room = int("limit", room)?;
        let n = int("count", n)?;
        let mut recounted = false;
        for _ in 0..CAS_ATTEMPTS {
            let mut filter = fence_filter(scope)?;
            filter.insert(counter.field(), doc! { "$lte": room });
            let update =
                doc! { "$inc": { counter.field(): n }, "$max": { "last_activity_at": dt(now) } };
            let reserved = self
                .update_if(
                    &self.sessions,
                    filter,
                    update,
                    self.hinted(),
                    "reserving a counter",
                )
                .await?;
            if reserved.is_some() {
                return Ok(());
            }
            self.admit(scope).await?;
            if recounted {
                return Err(too_many());
            }
            let exact = self.recount(scope, counter).await?;
            recounted = true;
            // Concurrent reservations between the count and this set are overwritten:
            // the counter can end a few units low, and only while writers race at the
            // limit. Bounded by the number of concurrent writers of one binding.
            self.update_if(
                &self.sessions,
                doc! { "_id": scope.binding_id.as_str(), "epoch": int("epoch", scope.epoch)? },
                doc! { "$set": { counter.field(): exact } },
                self.hinted(),
                "repairing a counter",
            )
            .await?;
            if exact > room {
                return Err(too_many());
            }
        }
        Err(too_many())
    }

    /// Gives back a reservation that did not create anything. Best effort: a lost
    /// release leaves the counter high, which the next recount at the limit repairs.
    pub(super) async fn release(&self, scope: &StateScope, counter: Counter, n: u64) {
        let (Ok(epoch), Ok(n)) = (int("epoch", scope.epoch), int("count", n)) else {
            return;
        };
        if n == 0 {
            return;
        }
        let _ = self
            .update_if(
                &self.sessions,
                doc! { "_id": scope.binding_id.as_str(), "epoch": epoch },
                doc! { "$inc": { counter.field(): -n } },
                self.hinted(),
                "releasing a counter",
            )
            .await;
    }

    async fn recount(&self, scope: &StateScope, counter: Counter) -> Result<i64> {
        let binding = &scope.binding_id;
        let epoch = int("epoch", scope.epoch)?;
        let kind = match counter {
            Counter::Objects => KIND_OBJECT,
            Counter::Streams => KIND_STREAM,
        };
        let filter = doc! { "binding_id": binding.as_str(), "epoch": epoch, "kind": kind };
        let n = self
            .state
            .count_documents(filter)
            .await
            .ctx("counting for a limit")?;
        i64::try_from(n).map_err(|_| super::corrupt("count", n))
    }

    pub(super) async fn ensure_binding_impl(
        &self,
        record: &BindingRecord,
    ) -> Result<(BindingRecord, bool)> {
        let max = self.limits.max_key_bytes;
        check_key("environment", &record.environment, max)?;
        check_key("agent id", &record.agent_id, max)?;
        check_key("conversation id", &record.conversation_id, max)?;
        check_key("harness", &record.harness, max)?;
        let id = &record.binding_id;
        let _serial = self.exclusive(id).await;
        let now = now_ms();
        let mut new_doc = doc! {
            "_id": id.as_str(),
            "schema_version": SCHEMA_VERSION,
            "environment_id": &record.environment,
            "owner_subject": record.owner.as_str(),
            "agent_id": &record.agent_id,
            "conversation_id": &record.conversation_id,
            "harness_id": &record.harness,
            "lease_generation": int("lease generation", record.lease_generation)?,
            "created_at": dt(record.created_at_ms),
            "updated_at": dt(now),
            "last_activity_at": dt(now),
        };
        new_doc.extend(fresh_epoch_fields(int("epoch", record.epoch)?));
        for attempt in 0..CAS_ATTEMPTS {
            match self.sessions.insert_one(&new_doc).await {
                Ok(_) => return Ok((record.clone(), true)),
                Err(e) if is_duplicate_key(&e) => {}
                Err(e) => return Err(backend("creating a binding", &e)),
            }
            let existing = self
                .sessions
                .find_one(doc! { "_id": id.as_str() })
                .await
                .ctx("reading a binding")?;
            let Some(existing) = existing else {
                // The id is free but the identity index is not (another key derived
                // another id for this conversation), unless a sweep deleted the binding
                // in between: one more attempt tells them apart.
                if attempt > 0 {
                    return Err(Rejection::Conflict {
                        what: format!("another binding already holds the identity of {id}"),
                    }
                    .into());
                }
                continue;
            };
            let view: SessionView = decode("binding", existing)?;
            if view.is_retiring() {
                // A sweep is deleting this binding: finish its work, then create afresh.
                self.finish_retirement(id).await?;
                continue;
            }
            let existing = record_of(view)?;
            let same_identity = existing.environment == record.environment
                && existing.owner == record.owner
                && existing.agent_id == record.agent_id
                && existing.conversation_id == record.conversation_id;
            if !same_identity {
                return Err(Rejection::Conflict {
                    what: format!("binding {id} already exists for another identity"),
                }
                .into());
            }
            return Ok((existing, false));
        }
        Err(StoreError::backend(
            super::BACKEND,
            format!("binding {id} kept changing while it was being created; retry"),
        ))
    }

    pub(super) async fn get_binding_impl(&self, id: &BindingId) -> Result<Option<BindingRecord>> {
        let found = self
            .sessions
            .find_one(doc! { "_id": id.as_str() })
            .await
            .ctx("reading a binding")?;
        let Some(found) = found else { return Ok(None) };
        let view: SessionView = decode("binding", found)?;
        if view.is_retiring() {
            return Ok(None);
        }
        record_of(view).map(Some)
    }

    pub(super) async fn last_activity_impl(&self, id: &BindingId) -> Result<Option<i64>> {
        let found = self
            .sessions
            .find_one(doc! { "_id": id.as_str() })
            .projection(doc! { "updated_at": 1, "last_activity_at": 1, "created_at": 1 })
            .await
            .ctx("reading a binding's activity")?;
        let Some(found) = found else { return Ok(None) };
        let at = |name: &str| found.get_datetime(name).ok().map(|t| t.timestamp_millis());
        Ok(["updated_at", "last_activity_at", "created_at"]
            .into_iter()
            .filter_map(at)
            .max())
    }

    pub(super) async fn raise_fence_impl(
        &self,
        id: &BindingId,
        epoch: u64,
        lease_generation: u64,
    ) -> Result<Fence> {
        let stored_epoch = int("epoch", epoch)?;
        let generation = int("lease generation", lease_generation)?;
        let _serial = self.exclusive(id).await;
        for _ in 0..CAS_ATTEMPTS {
            // Monotonic by construction: the filter only matches a lower generation.
            let raised = self
                .update_if(
                    &self.sessions,
                    doc! {
                        "_id": id.as_str(),
                        "epoch": stored_epoch,
                        "lease_generation": { "$lt": generation },
                        "retiring": { "$exists": false },
                    },
                    doc! { "$set": { "lease_generation": generation, "updated_at": dt(now_ms()) } },
                    Self::matched_only(),
                    "raising the fence",
                )
                .await?;
            if raised.is_some() {
                return Ok(Fence {
                    epoch,
                    lease_generation,
                });
            }
            let fence = fence_of(&self.fence(id).await?.ok_or_else(|| not_found_binding(id))?)?;
            if epoch < fence.epoch {
                return Err(Rejection::StaleEpoch {
                    presented: epoch,
                    current: fence.epoch,
                }
                .into());
            }
            if epoch > fence.epoch {
                return Err(Rejection::Invalid(format!(
                    "epoch {epoch} is ahead of the binding's epoch {}; use clear to move the epoch",
                    fence.epoch
                ))
                .into());
            }
            if lease_generation < fence.lease_generation {
                return Err(Rejection::StaleLease {
                    presented: lease_generation,
                    current: fence.lease_generation,
                }
                .into());
            }
            if lease_generation == fence.lease_generation {
                return Ok(fence);
            }
            // The generation is below ours again: the binding was re-created in between.
        }
        Err(StoreError::backend(
            super::BACKEND,
            format!("the fence of binding {id} kept changing; retry"),
        ))
    }

    pub(super) async fn clear_impl(&self, id: &BindingId, new_epoch: u64) -> Result<ClearReport> {
        let target = int("epoch", new_epoch)?;
        let _serial = self.exclusive(id).await;
        let mut from_epoch = None;
        let mut settled = false;
        for _ in 0..CAS_ATTEMPTS {
            let fence = fence_of(&self.fence(id).await?.ok_or_else(|| not_found_binding(id))?)?;
            if new_epoch == fence.epoch {
                settled = true;
                break;
            }
            if new_epoch < fence.epoch {
                return Err(Rejection::StaleEpoch {
                    presented: new_epoch,
                    current: fence.epoch,
                }
                .into());
            }
            if Some(new_epoch) != fence.epoch.checked_add(1) {
                return Err(Rejection::Invalid(format!(
                    "clear moves the epoch by one: from {} to {}, not {new_epoch}",
                    fence.epoch,
                    fence.epoch.saturating_add(1)
                ))
                .into());
            }
            // One atomic step moves the epoch and resets the head, the interrupt and the
            // uncertain runs: from here on nothing of the old epoch is readable or
            // committable (every query and document id carries the epoch). The lease
            // generation stays: the current worker keeps its fence.
            let mut set = fresh_epoch_fields(target);
            set.insert("updated_at", dt(now_ms()));
            let moved = self
                .update_if(
                    &self.sessions,
                    doc! { "_id": id.as_str(), "epoch": int("epoch", fence.epoch)?, "retiring": { "$exists": false } },
                    doc! { "$set": set },
                    Self::matched_only(),
                    "moving the epoch",
                )
                .await?;
            if moved.is_some() {
                from_epoch = Some(fence.epoch);
                settled = true;
                break;
            }
        }
        if !settled {
            return Err(StoreError::backend(
                super::BACKEND,
                format!("the epoch of binding {id} kept changing; retry"),
            ));
        }
        // Deleting the old epochs' documents is idempotent: a clear interrupted here is
        // finished by calling it again with the current epoch.
        let purged = self.purge(id, Some(target)).await?;
        // A clear that moved nothing and found nothing (a plain retry) is not worth a record.
        if from_epoch.is_some() || purged.any() {
            let detail = json!({
                "from_epoch": from_epoch,
                "epoch": new_epoch,
                "states_deleted": purged.states,
                "objects_deleted": purged.objects,
                "stream_entries_deleted": purged.entries,
            });
            self.write_audit("binding.clear", Some(id), &detail).await?;
        }
        Ok(ClearReport {
            epoch: new_epoch,
            states_deleted: purged.states,
            objects_deleted: purged.objects,
            stream_entries_deleted: purged.entries,
        })
    }

    /// Deletes the binding's state documents of epochs below `below_epoch` (all epochs
    /// when `None`), one `deleteMany` per kind so the report can count each.
    pub(super) async fn purge(&self, id: &BindingId, below_epoch: Option<i64>) -> Result<Purged> {
        let filter = |kind: &str| {
            let mut f = doc! { "binding_id": id.as_str(), "kind": kind };
            if let Some(epoch) = below_epoch {
                f.insert("epoch", doc! { "$lt": epoch });
            }
            f
        };
        let (states, objects, entries, _) = try_join4(
            self.state.delete_many(filter(KIND_STATE)).into_future(),
            self.state.delete_many(filter(KIND_OBJECT)).into_future(),
            self.state.delete_many(filter(KIND_ENTRY)).into_future(),
            // Stream heads in parallel with their entries: nothing reads a purged
            // epoch any more, so the order of the deletions is unobservable.
            self.state.delete_many(filter(KIND_STREAM)).into_future(),
        )
        .await
        .ctx("deleting an epoch's state")?;
        Ok(Purged {
            states: states.deleted_count,
            objects: objects.deleted_count,
            entries: entries.deleted_count,
        })
    }

    /// Completes the deletion of a binding a retention sweep marked as retiring: its
    /// state documents, then the binding document itself.
    pub(super) async fn finish_retirement(&self, id: &BindingId) -> Result<(Purged, bool)> {
        let purged = self.purge(id, None).await?;
        let deleted = self
            .delete_if(
                &self.sessions,
                doc! { "_id": id.as_str(), "retiring": true },
                "deleting a retired binding",
            )
            .await?;
        Ok((purged, deleted))
    }
}
