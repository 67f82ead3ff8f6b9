//! The commit protocol (`spec/000_fa938a4e6ac75730.txt`, "Commit protocol"): pending
//! native state, the durable head, uncertain runs, and pending interrupts
//! (`spec/001_78d7ff78f70a2a2a.txt` §4, §6).

use crate::store::commit::{CommitPlan, HeadView, next_revision, plan_commit, stamp_interrupt};
use std::collections::BTreeMap;

use futures::future::{join, try_join};
use mongodb::bson::{Binary, Bson, DateTime, Document, doc, oid::ObjectId, spec::BinarySubtype};
use serde::Deserialize;

use super::{
    CAS_ATTEMPTS, MongoContext, MongoStore,
    atomic::UpdateIf,
    backend,
    bindings::{fence_filter, stored_fence},
    corrupt, count, int, is_duplicate_key,
    layout::{
        InterruptView, KIND_STATE, SessionView, StateView, UncertainView, decode, dt, state_doc_id,
        state_meta_projection, uncertain_key,
    },
    not_found_binding, uint,
};
use crate::{
    domain::{
        ids::{BindingId, IdempotencyDigest, content_digest},
        state::{
            CommitRequest, Durability, DurableStateHead, PendingInterrupt, PendingStateRef,
            Rejection, ResumeOutcome, ResumeRequest, RunOutcome, RunTerminal, StateScope,
            UncertainRun, check_json_size, check_key, pending_state_id,
        },
    },
    store::{Result, StoreError, now_ms},
};

/// Longest reason `mark_uncertain` accepts: a short machine-readable code, never content.
const MAX_REASON_BYTES: usize = 256;

/// Most runs one binding epoch may have marked uncertain at once. Each lives in the
/// binding document, which must stay bounded; hundreds of unreconciled ambiguous runs
/// mean the binding needs an operator, not more marks.
const MAX_UNCERTAIN_RUNS: i64 = 256;

/// How old a pending registration without its state must be before a writer at the
/// pending bound may drop it (an insert follows its registration within a round trip).
const REGISTRATION_GRACE_MS: i64 = 60_000;

/// Resume outcomes kept in the binding document for duplicate detection. Interrupts
/// are resumed one at a time, so a duplicate arrives within the last few.
const MAX_RECENT_RESUMES: i32 = 16;

/// The binding fields a head needs (everything but the bulky resume log).
fn head_projection() -> Document {
    doc! {
        "epoch": 1, "lease_generation": 1, "retiring": 1, "state_ref": 1, "terminal": 1,
        "pending_interrupt": 1, "uncertain_runs": 1, "owner_subject": 1,
    }
}

/// Native payloads are opaque and versioned: a scope reads and commits only state of its
/// own adapter codec (`spec/000_fa938a4e6ac75730.txt`, "Thread-state invariants").
fn check_codec(scope: &StateScope, stored: &str) -> Result<()> {
    if stored == scope.codec || scope.codec == crate::domain::state::ANY_CODEC {
        return Ok(());
    }
    Err(Rejection::Forbidden(format!(
        "state was written with codec {stored}; this scope reads {}",
        scope.codec
    ))
    .into())
}

fn interrupt_of(view: InterruptView) -> Result<PendingInterrupt> {
    Ok(PendingInterrupt {
        interrupt_id: view.interrupt_id,
        kind: view.kind,
        run_id: view.run_id,
        namespace: view.namespace,
        agent_id: view.agent_id,
        allowed_decisions: view.allowed_decisions,
        revision: uint("interrupt revision", view.revision)?,
        created_at_ms: view.created_at.timestamp_millis(),
        body: serde_json::from_str(&view.body_json).map_err(|e| corrupt("interrupt body", e))?,
    })
}

fn interrupt_doc(interrupt: &PendingInterrupt) -> Result<Document> {
    Ok(doc! {
        "interrupt_id": &interrupt.interrupt_id,
        "type": &interrupt.kind,
        "run_id": &interrupt.run_id,
        "namespace": interrupt.namespace.clone(),
        "agent_id": &interrupt.agent_id,
        "allowed_decisions": interrupt.allowed_decisions.clone(),
        "revision": int("revision", interrupt.revision)?,
        "created_at": dt(interrupt.created_at_ms),
        "body_json": serde_json::to_string(&interrupt.body).map_err(|e| Rejection::Invalid(format!("interrupt body: {e}")))?,
    })
}

/// Whether a pending-state registration was made by this call.
enum Registration {
    New,
    /// Registered earlier (a concurrent or retried attempt under the same key).
    AlreadyPending,
}

/// The previous image a commit asks for.
#[derive(Deserialize)]
struct UncertainOnly {
    #[serde(default)]
    uncertain_runs: BTreeMap<String, UncertainView>,
}

fn uncertain_of(uncertain: &BTreeMap<String, UncertainView>) -> Vec<UncertainRun> {
    let mut runs: Vec<UncertainRun> = uncertain
        .values()
        .map(|u| UncertainRun {
            run_id: u.run_id.clone(),
            reason: u.reason.clone(),
            marked_at_ms: u.marked_at.timestamp_millis(),
        })
        .collect();
    runs.sort_by(|a, b| (a.marked_at_ms, &a.run_id).cmp(&(b.marked_at_ms, &b.run_id)));
    runs
}

/// The head a binding document holds; `None` while nothing is committed (revision 0).
fn head_of(scope: &StateScope, view: SessionView) -> Result<Option<DurableStateHead>> {
    let uncertain_runs = uncertain_of(&view.uncertain_runs);
    let Some(state_ref) = view.state_ref else {
        return Ok(None);
    };
    let revision = uint("durable revision", state_ref.durable_revision)?;
    if revision == 0 {
        return Ok(None);
    }
    let missing = move |field: &str| {
        corrupt(
            "durable head",
            format!("revision {revision} has no {field}"),
        )
    };
    let codec = state_ref.codec.ok_or_else(|| missing("codec"))?;
    check_codec(scope, &codec)?;
    let terminal = view
        .terminal
        .map(|t| -> Result<RunTerminal> {
            Ok(RunTerminal {
                outcome: RunOutcome::parse(&t.outcome)
                    .ok_or_else(|| corrupt("run outcome", &t.outcome))?,
                metadata: serde_json::from_str(&t.metadata_json)
                    .map_err(|e| corrupt("run terminal metadata", e))?,
            })
        })
        .transpose()?;
    Ok(Some(DurableStateHead {
        binding_id: scope.binding_id.clone(),
        epoch: scope.epoch,
        revision,
        state_id: state_ref.durable_head.ok_or_else(|| missing("state id"))?,
        codec,
        content_digest: state_ref
            .content_digest
            .ok_or_else(|| missing("content digest"))?,
        size: uint("head size", state_ref.size.ok_or_else(|| missing("size"))?)?,
        run_id: state_ref
            .last_committed_run_id
            .ok_or_else(|| missing("run id"))?,
        committed_at_ms: state_ref
            .committed_at
            .ok_or_else(|| missing("commit time"))?
            .timestamp_millis(),
        lease_generation: uint(
            "head lease generation",
            state_ref
                .head_lease_generation
                .ok_or_else(|| missing("lease generation"))?,
        )?,
        terminal,
        interrupt: view.pending_interrupt.map(interrupt_of).transpose()?,
        durability: if uncertain_runs.is_empty() {
            Durability::Committed
        } else {
            Durability::Uncertain
        },
        uncertain_runs,
    }))
}

impl MongoStore {
    /// The binding document with the fields a head needs; refuses a missing or retiring
    /// binding and, unless `epoch_only`, a scope the fence does not admit.
    async fn admitted_session(
        &self,
        scope: &StateScope,
        projection: Document,
        epoch_only: bool,
    ) -> Result<SessionView> {
        let found = self
            .sessions
            .find_one(doc! { "_id": scope.binding_id.as_str() })
            .projection(projection)
            .await
            .ctx("reading a binding")?;
        let view: SessionView = match found {
            Some(found) => decode("binding", found)?,
            None => return Err(not_found_binding(&scope.binding_id)),
        };
        if view.is_retiring() {
            return Err(not_found_binding(&scope.binding_id));
        }
        let fence = stored_fence(view.epoch, view.lease_generation)?;
        if epoch_only {
            if scope.epoch != fence.epoch {
                return Err(Rejection::StaleEpoch {
                    presented: scope.epoch,
                    current: fence.epoch,
                }
                .into());
            }
        } else {
            fence.admit(scope.epoch, scope.lease_generation)?;
        }
        Ok(view)
    }

    pub(super) async fn load_head_impl(
        &self,
        scope: &StateScope,
    ) -> Result<Option<DurableStateHead>> {
        let view = self
            .admitted_session(scope, head_projection(), false)
            .await?;
        head_of(scope, view)
    }

    pub(super) async fn read_state_impl(
        &self,
        scope: &StateScope,
        state_id: &str,
    ) -> Result<Option<Vec<u8>>> {
        check_key("state id", state_id, self.limits.max_key_bytes)?;
        let id = state_doc_id(&scope.binding_id, int("epoch", scope.epoch)?, state_id);
        // The fence and the body are read in parallel: a read is linearizable at either
        // point, and a scope the fence refuses gets the refusal, never the body.
        let read = async {
            self.state
                .find_one(doc! { "_id": id })
                .projection(doc! { "codec": 1, "body": 1 })
                .await
                .ctx("reading native state")
        };
        let (_, found) = try_join(self.admit(scope), read).await?;
        let Some(mut found) = found else {
            return Ok(None);
        };
        let codec = found
            .get_str("codec")
            .map_err(|e| corrupt("state codec", e))?;
        check_codec(scope, codec)?;
        match found.remove("body") {
            Some(Bson::Binary(body)) => Ok(Some(body.bytes)),
            other => Err(corrupt("state body", format!("{other:?}"))),
        }
    }

    pub(super) async fn write_native_state_impl(
        &self,
        scope: &StateScope,
        payload: &[u8],
        idempotency: &IdempotencyDigest,
    ) -> Result<PendingStateRef> {
        crate::store::checks::native_state(&self.limits, payload, idempotency)?;
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let binding = &scope.binding_id;
        let epoch = int("epoch", scope.epoch)?;
        let state_id = pending_state_id(idempotency);
        let doc_id = state_doc_id(binding, epoch, &state_id);
        let digest = content_digest(payload);
        let size = count(payload.len());
        let now = now_ms();
        let reference = PendingStateRef {
            state_id: state_id.clone(),
            epoch: scope.epoch,
            codec: scope.codec.clone(),
            size,
            content_digest: digest.clone(),
        };
        // A stored state under this key: a retry (same payload and codec), a reuse of the
        // key (another payload), or two digests sharing the prefix the id is cut from.
        let settle = |found: Document| -> Result<PendingStateRef> {
            let view: StateView = decode("native state", found)?;
            if view.idempotency != idempotency.as_str() {
                return Err(Rejection::Conflict {
                    what: format!("state id {state_id} is taken by another idempotency key"),
                }
                .into());
            }
            if view.content_digest == digest && view.codec == scope.codec {
                return Ok(reference.clone());
            }
            Err(Rejection::IdempotencyMismatch.into())
        };

        // The lookup of a previous attempt and the registration of the new entry (which
        // is also the fence check) run in parallel.
        let lookup = async {
            self.state
                .find_one(doc! { "_id": &doc_id })
                .projection(state_meta_projection())
                .await
                .ctx("looking up the idempotency key")
        };
        let (existing, registered) =
            join(lookup, self.register_pending(scope, &state_id, now)).await;
        let existing = existing?;
        match (existing, registered) {
            (_, Err(e)) if !matches!(e.rejection(), Some(Rejection::TooMany { .. })) => {
                return Err(e);
            }
            // A retry is not a new entry, so it succeeds even at the limit.
            (Some(found), registered) => {
                if matches!(registered, Ok(Registration::New)) {
                    // The state exists but was no longer pending (committed, or swept
                    // halfway): this registration must not make it pending again.
                    self.unregister_pending(binding, epoch, &state_id).await?;
                }
                return settle(found);
            }
            (None, Err(too_many)) => return Err(too_many),
            // Registered now, or by an earlier attempt that may still be inserting.
            (None, Ok(_)) => {}
        }

        let new_doc = doc! {
            "_id": &doc_id,
            "binding_id": binding.as_str(),
            "epoch": epoch,
            "kind": KIND_STATE,
            "name": "",
            "key": &state_id,
            "idempotency": idempotency.as_str(),
            "codec": &scope.codec,
            "size": int("size", size)?,
            "content_digest": &digest,
            "created_at": dt(now),
            // Sparse-indexed: where the retention sweep looks for old pending states. It
            // stays after a commit until a sweep sees the state is no longer pending.
            "pending_since": dt(now),
            "lease_generation": int("lease generation", scope.lease_generation)?,
            "write_id": ObjectId::new(),
            "body": Binary { subtype: BinarySubtype::Generic, bytes: payload.to_vec() },
        };
        match self.state.insert_one(new_doc).await {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => {
                // A concurrent attempt under the same key won the insert.
                let found = self
                    .state
                    .find_one(doc! { "_id": &doc_id })
                    .projection(state_meta_projection())
                    .await
                    .ctx("reading a concurrent write")?
                    .ok_or_else(|| {
                        StoreError::backend(
                            super::BACKEND,
                            "a concurrently written state vanished; retry",
                        )
                    })?;
                return settle(found);
            }
            // The outcome is unknown; the registration stays (one whose state never
            // arrives is dropped at the pending bound, see `heal_registrations`).
            Err(e) => return Err(backend("storing native state", &e)),
        }
        // Not undone on a moved fence: see `bindings` ("Such bodies are therefore not
        // undone").
        self.confirm(scope).await?;
        Ok(reference)
    }

    /// Registers a pending state in the binding document, atomically with the fence check
    /// and the bound on pending entries.
    async fn register_pending(
        &self,
        scope: &StateScope,
        state_id: &str,
        now: i64,
    ) -> Result<Registration> {
        let limit = self.limits.max_pending_entries;
        let too_many = || -> StoreError {
            Rejection::TooMany {
                what: "pending state entries",
                limit,
            }
            .into()
        };
        let room = int("limit", limit.checked_sub(1).ok_or_else(too_many)?)?;
        let entry = format!("pending.{state_id}");
        let mut healed = false;
        for _ in 0..CAS_ATTEMPTS {
            let mut filter = fence_filter(scope)?;
            filter.insert(&entry, doc! { "$exists": false });
            filter.insert("counts.pending", doc! { "$lte": room });
            let update = doc! {
                "$set": { &entry: dt(now) },
                "$inc": { "counts.pending": 1_i64 },
                "$max": { "last_activity_at": dt(now) },
            };
            if self
                .update_if(
                    &self.sessions,
                    filter,
                    update,
                    Self::matched_only(),
                    "registering a pending state",
                )
                .await?
                .is_some()
            {
                return Ok(Registration::New);
            }
            let projection = doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "pending": 1, "counts": 1 };
            let view = self.admitted_session(scope, projection, false).await?;
            if view.pending.contains_key(state_id) {
                return Ok(Registration::AlreadyPending);
            }
            let registered = i64::try_from(view.pending.len()).unwrap_or(i64::MAX);
            if view.counts.pending != registered {
                // The counter moves with the registry in every update; a mismatch is a
                // document from elsewhere (an older build, a manual edit): trust the registry.
                self.update_if(
                    &self.sessions,
                    doc! { "_id": scope.binding_id.as_str(), "epoch": view.epoch, "counts.pending": view.counts.pending },
                    doc! { "$set": { "counts.pending": registered } },
                    Self::matched_only(),
                    "repairing the pending counter",
                )
                .await?;
                continue;
            }
            if registered > room {
                if healed || !self.heal_registrations(scope, &view.pending, now).await? {
                    return Err(too_many());
                }
                healed = true;
            }
        }
        Err(StoreError::backend(
            super::BACKEND,
            "the binding kept changing while registering a state; retry",
        ))
    }

    /// Removes a registration (if still there): what a sweep does before deleting a
    /// state, so that no commit can name it any more.
    pub(super) async fn unregister_pending(
        &self,
        binding: &BindingId,
        epoch: i64,
        state_id: &str,
    ) -> Result<bool> {
        let entry = format!("pending.{state_id}");
        let removed = self
            .update_if(
                &self.sessions,
                doc! { "_id": binding.as_str(), "epoch": epoch, &entry: { "$exists": true } },
                doc! { "$unset": { &entry: "" }, "$inc": { "counts.pending": -1_i64 } },
                Self::matched_only(),
                "unregistering a pending state",
            )
            .await?;
        Ok(removed.is_some())
    }

    /// At the pending bound: drops registrations whose state never arrived (the writer
    /// died between registering and inserting). Only registrations older than
    /// [`REGISTRATION_GRACE_MS`] qualify, so an insert in flight keeps its own. Returns
    /// whether any was dropped.
    async fn heal_registrations(
        &self,
        scope: &StateScope,
        pending: &BTreeMap<String, DateTime>,
        now: i64,
    ) -> Result<bool> {
        let epoch = int("epoch", scope.epoch)?;
        let old: Vec<&String> = pending
            .iter()
            .filter(|(_, at)| at.timestamp_millis() < now.saturating_sub(REGISTRATION_GRACE_MS))
            .map(|(id, _)| id)
            .collect();
        if old.is_empty() {
            return Ok(false);
        }
        let ids: Vec<String> = old
            .iter()
            .map(|id| state_doc_id(&scope.binding_id, epoch, id))
            .collect();
        let present = self
            .find_by_ids(&self.state, &ids, doc! { "_id": 1 })
            .await?;
        let mut healed = false;
        for (state_id, doc_id) in old.iter().zip(&ids) {
            if !present.contains_key(doc_id) {
                healed |= self
                    .unregister_pending(&scope.binding_id, epoch, state_id)
                    .await?;
            }
        }
        Ok(healed)
    }

    pub(super) async fn commit_head_impl(
        &self,
        scope: &StateScope,
        request: &CommitRequest,
    ) -> Result<DurableStateHead> {
        let max_key = self.limits.max_key_bytes;
        let max_metadata = self.limits.max_metadata_bytes;
        check_key("state id", &request.state_id, max_key)?;
        check_key("run id", &request.run_id, max_key)?;
        let expected = int("expected revision", request.expected_revision)?;
        let next = next_revision(request.expected_revision)?;
        let next_stored = int("revision", next)?;
        let terminal = match &request.terminal {
            Some(terminal) => {
                check_json_size("run terminal metadata", &terminal.metadata, max_metadata)?;
                let metadata_json = serde_json::to_string(&terminal.metadata)
                    .map_err(|e| Rejection::Invalid(format!("run terminal metadata: {e}")))?;
                Bson::Document(
                    doc! { "outcome": terminal.outcome.as_str(), "metadata_json": metadata_json },
                )
            }
            None => Bson::Null,
        };
        if let Some(interrupt) = &request.interrupt {
            check_key("interrupt id", &interrupt.interrupt_id, max_key)?;
        }
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let now = now_ms();
        // The store stamps the interrupt: a resume must present this commit's revision.
        let interrupt = stamp_interrupt(request, next, now, max_metadata)?.map(|(i, _)| i);
        let interrupt_bson = match &interrupt {
            Some(interrupt) => Bson::Document(interrupt_doc(interrupt)?),
            None => Bson::Null,
        };
        let binding = &scope.binding_id;
        let epoch = int("epoch", scope.epoch)?;

        // 1. Only a state of this binding and epoch can become its head (a cleared
        // epoch's state never can: its id carries the old epoch).
        let found = self
            .state
            .find_one(doc! { "_id": state_doc_id(binding, epoch, &request.state_id) })
            .projection(state_meta_projection())
            .await
            .ctx("reading the state to commit")?;
        let Some(found) = found else {
            self.admit(scope).await?;
            return Err(Rejection::NotFound(format!(
                "state {} in epoch {}",
                request.state_id, scope.epoch
            ))
            .into());
        };
        let state: StateView = decode("native state", found)?;
        if state.codec != scope.codec {
            self.admit(scope).await?;
            check_codec(scope, &state.codec)?;
        }

        // 2. The compare-and-set. Its filter holds every expectation: the fence, the
        // revision, the run not being uncertain, and the state still being registered as
        // pending (the retention sweep unregisters a state before deleting it, so a
        // state being swept can never become the head). Its update moves the head, the
        // terminal metadata and the interrupt, and unregisters the state, in one write
        // of one document.
        let entry = format!("pending.{}", request.state_id);
        let mut filter = fence_filter(scope)?;
        filter.insert("state_ref.durable_revision", expected);
        filter.insert(
            format!("uncertain_runs.{}", uncertain_key(&request.run_id)),
            doc! { "$exists": false },
        );
        filter.insert(&entry, doc! { "$exists": true });
        let update = doc! {
            "$set": {
                "state_ref": {
                    "durable_revision": next_stored,
                    "durable_head": &request.state_id,
                    "codec": &state.codec,
                    "content_digest": &state.content_digest,
                    "size": state.size,
                    "last_committed_run_id": &request.run_id,
                    "committed_at": dt(now),
                    "head_lease_generation": int("lease generation", scope.lease_generation)?,
                    "durability_status": "committed",
                },
                "terminal": terminal,
                "pending_interrupt": interrupt_bson,
                "updated_at": dt(now),
                "last_activity_at": dt(now),
            },
            "$unset": { &entry: "" },
            "$inc": { "counts.pending": -1_i64 },
        };
        for _ in 0..CAS_ATTEMPTS {
            let options = UpdateIf {
                write_concern: None,
                projection: Some(doc! { "uncertain_runs": 1 }),
            };
            let before = self
                .update_if(
                    &self.sessions,
                    filter.clone(),
                    update.clone(),
                    options,
                    "committing the head",
                )
                .await?;
            if let Some(before) = before {
                let uncertain_runs =
                    uncertain_of(&decode::<UncertainOnly>("binding", before)?.uncertain_runs);
                return Ok(DurableStateHead {
                    binding_id: binding.clone(),
                    epoch: scope.epoch,
                    revision: next,
                    state_id: request.state_id.clone(),
                    codec: state.codec,
                    content_digest: state.content_digest,
                    size: uint("size", state.size)?,
                    run_id: request.run_id.clone(),
                    committed_at_ms: now,
                    lease_generation: scope.lease_generation,
                    terminal: request.terminal.clone(),
                    interrupt,
                    durability: if uncertain_runs.is_empty() {
                        Durability::Committed
                    } else {
                        Durability::Uncertain
                    },
                    uncertain_runs,
                });
            }
            // The filter missed: read the document once and say precisely why.
            let mut projection = head_projection();
            projection.insert(&entry, 1);
            let view = self.admitted_session(scope, projection, false).await?;
            let uncertain = view
                .uncertain_runs
                .contains_key(&uncertain_key(&request.run_id));
            let head = HeadView {
                revision: uint(
                    "revision",
                    view.state_ref.as_ref().map_or(0, |r| r.durable_revision),
                )?,
                state_id: view
                    .state_ref
                    .as_ref()
                    .and_then(|r| r.durable_head.as_deref()),
                run_id: view
                    .state_ref
                    .as_ref()
                    .and_then(|r| r.last_committed_run_id.as_deref()),
            };
            if plan_commit(head, request, uncertain)? == CommitPlan::Retry {
                // A retry of the commit that produced this head (its response was lost).
                return head_of(scope, view)?
                    .ok_or_else(|| corrupt("durable head", "revision above 0 without a head"));
            }
            if !view.pending.contains_key(&request.state_id) {
                // Committed before (a head of its own), or being swept by retention.
                return Err(Rejection::NotFound(format!(
                    "pending state {} in epoch {}",
                    request.state_id, scope.epoch
                ))
                .into());
            }
            // Every expectation holds again (a concurrent change came and went): retry.
        }
        Err(StoreError::backend(
            super::BACKEND,
            "the head kept changing during the commit; retry",
        ))
    }

    pub(super) async fn mark_uncertain_impl(
        &self,
        scope: &StateScope,
        run_id: &str,
        reason: &str,
    ) -> Result<()> {
        check_key("run id", run_id, self.limits.max_key_bytes)?;
        if reason.len() > MAX_REASON_BYTES {
            return Err(Rejection::Invalid(format!(
                "an uncertainty reason is at most {MAX_REASON_BYTES} bytes, got {}",
                reason.len()
            ))
            .into());
        }
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let key = format!("uncertain_runs.{}", uncertain_key(run_id));
        let now = now_ms();
        for _ in 0..CAS_ATTEMPTS {
            // Marking twice keeps the first mark: its time is when the ambiguity began.
            let mut filter = fence_filter(scope)?;
            filter.insert(&key, doc! { "$exists": false });
            filter.insert("uncertain_count", doc! { "$lt": MAX_UNCERTAIN_RUNS });
            let update = doc! {
                "$set": { &key: { "run_id": run_id, "reason": reason, "marked_at": dt(now) }, "updated_at": dt(now) },
                "$inc": { "uncertain_count": 1_i64 },
                "$max": { "last_activity_at": dt(now) },
            };
            let marked = self
                .update_if(
                    &self.sessions,
                    filter,
                    update,
                    Self::matched_only(),
                    "marking a run uncertain",
                )
                .await?;
            if marked.is_some() {
                return Ok(());
            }
            let view = self.admitted_session(scope, doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "uncertain_runs": 1, "uncertain_count": 1 }, false).await?;
            if view.uncertain_runs.contains_key(&uncertain_key(run_id)) {
                return Ok(());
            }
            if view.uncertain_count >= MAX_UNCERTAIN_RUNS {
                return Err(Rejection::TooMany {
                    what: "uncertain runs",
                    limit: MAX_UNCERTAIN_RUNS.unsigned_abs(),
                }
                .into());
            }
        }
        Err(StoreError::backend(
            super::BACKEND,
            "the binding kept changing while marking a run; retry",
        ))
    }

    pub(super) async fn reconcile_run_impl(&self, scope: &StateScope, run_id: &str) -> Result<()> {
        check_key("run id", run_id, self.limits.max_key_bytes)?;
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let key = format!("uncertain_runs.{}", uncertain_key(run_id));
        let now = now_ms();
        for _ in 0..CAS_ATTEMPTS {
            let mut filter = fence_filter(scope)?;
            filter.insert(&key, doc! { "$exists": true });
            let update = doc! {
                "$unset": { &key: "" },
                "$inc": { "uncertain_count": -1_i64 },
                "$set": { "updated_at": dt(now) },
                "$max": { "last_activity_at": dt(now) },
            };
            let reconciled = self
                .update_if(
                    &self.sessions,
                    filter,
                    update,
                    Self::matched_only(),
                    "reconciling a run",
                )
                .await?;
            if reconciled.is_some() {
                return Ok(());
            }
            let view = self
                .admitted_session(
                    scope,
                    doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "uncertain_runs": 1 },
                    false,
                )
                .await?;
            if !view.uncertain_runs.contains_key(&uncertain_key(run_id)) {
                return Err(Rejection::NotFound(format!("uncertain run {run_id}")).into());
            }
        }
        Err(StoreError::backend(
            super::BACKEND,
            "the binding kept changing while reconciling a run; retry",
        ))
    }

    pub(super) async fn uncertain_runs_impl(
        &self,
        scope: &StateScope,
    ) -> Result<Vec<UncertainRun>> {
        let view = self
            .admitted_session(
                scope,
                doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "uncertain_runs": 1 },
                false,
            )
            .await?;
        Ok(uncertain_of(&view.uncertain_runs))
    }

    pub(super) async fn pending_interrupt_impl(
        &self,
        scope: &StateScope,
    ) -> Result<Option<PendingInterrupt>> {
        let view = self
            .admitted_session(
                scope,
                doc! { "epoch": 1, "lease_generation": 1, "retiring": 1, "pending_interrupt": 1 },
                false,
            )
            .await?;
        view.pending_interrupt.map(interrupt_of).transpose()
    }

    /// Consumes the pending interrupt (`spec/001_78d7ff78f70a2a2a.txt` §6): binding,
    /// interrupt id, revision, caller and decision must all match. Consumption and the
    /// recorded outcome are one update of the binding document, so a duplicate either
    /// replays the outcome or is refused.
    pub(super) async fn resume_impl(
        &self,
        scope: &StateScope,
        request: &ResumeRequest,
    ) -> Result<ResumeOutcome> {
        let max_key = self.limits.max_key_bytes;
        check_key("interrupt id", &request.interrupt_id, max_key)?;
        check_key("decision", &request.decision, max_key)?;
        check_key("idempotency digest", request.idempotency.as_str(), max_key)?;
        check_json_size(
            "resume response",
            &request.response,
            self.limits.max_metadata_bytes,
        )?;
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let response_json = serde_json::to_string(&request.response)
            .map_err(|e| Rejection::Invalid(format!("resume response: {e}")))?;
        let projection = doc! {
            "epoch": 1, "lease_generation": 1, "retiring": 1, "owner_subject": 1, "pending_interrupt": 1, "recent_resumes": 1,
        };
        for _ in 0..CAS_ATTEMPTS {
            // Epoch only: resumes arrive from the control plane, not from the fenced worker.
            let view = self
                .admitted_session(scope, projection.clone(), true)
                .await?;
            // The owner check comes first, so a stranger learns nothing about the
            // interrupt (whether it exists, its revision, or a recorded outcome).
            if view.owner_subject != request.caller.as_str() {
                return Err(Rejection::Forbidden(
                    "only the binding's owner may resume its interrupts".into(),
                )
                .into());
            }
            let had_prior = view
                .recent_resumes
                .iter()
                .any(|r| r.interrupt_id == request.interrupt_id);
            let recorded = view.recent_resumes.iter().find(|r| {
                r.interrupt_id == request.interrupt_id
                    && r.idempotency == request.idempotency.as_str()
            });
            if let Some(recorded) = recorded {
                return Ok(ResumeOutcome {
                    interrupt_id: recorded.interrupt_id.clone(),
                    decision: recorded.decision.clone(),
                    revision: uint("interrupt revision", recorded.revision)?,
                    resumed_at_ms: recorded.resumed_at.timestamp_millis(),
                    response: serde_json::from_str(&recorded.response_json)
                        .map_err(|e| corrupt("resume response", e))?,
                });
            }
            let current = view
                .pending_interrupt
                .filter(|i| i.interrupt_id == request.interrupt_id);
            let Some(current) = current else {
                return Err(if had_prior {
                    Rejection::Conflict {
                        what: format!("interrupt {} was already resumed", request.interrupt_id),
                    }
                } else {
                    Rejection::NotFound(format!("interrupt {}", request.interrupt_id))
                }
                .into());
            };
            let current = interrupt_of(current)?;
            if current.revision != request.revision {
                return Err(Rejection::RevisionConflict {
                    expected: request.revision,
                    actual: current.revision,
                }
                .into());
            }
            if !current
                .allowed_decisions
                .iter()
                .any(|d| d == &request.decision)
            {
                return Err(Rejection::Invalid(format!(
                    "decision {:?} is not allowed for interrupt {} (allowed: {})",
                    request.decision,
                    current.interrupt_id,
                    current.allowed_decisions.join(", ")
                ))
                .into());
            }
            let now = now_ms();
            let revision = int("revision", current.revision)?;
            let consumed = self
                .update_if(
                    &self.sessions,
                    doc! {
                        "_id": scope.binding_id.as_str(),
                        "epoch": view.epoch,
                        "retiring": { "$exists": false },
                        "pending_interrupt.interrupt_id": &current.interrupt_id,
                        "pending_interrupt.revision": revision,
                    },
                    doc! {
                        "$set": { "pending_interrupt": Bson::Null, "updated_at": dt(now) },
                        "$max": { "last_activity_at": dt(now) },
                        "$push": { "recent_resumes": {
                            "$each": [{
                                "interrupt_id": &current.interrupt_id,
                                "idempotency": request.idempotency.as_str(),
                                "decision": &request.decision,
                                "revision": revision,
                                "resumed_at": dt(now),
                                "response_json": &response_json,
                            }],
                            "$slice": -MAX_RECENT_RESUMES,
                        } },
                    },
                    Self::matched_only(),
                    "consuming the interrupt",
                )
                .await?;
            if consumed.is_some() {
                return Ok(ResumeOutcome {
                    interrupt_id: current.interrupt_id,
                    decision: request.decision.clone(),
                    revision: current.revision,
                    resumed_at_ms: now,
                    response: request.response.clone(),
                });
            }
            // Another resume (or a commit) changed the interrupt: re-read and decide again;
            // a concurrent resume with this key is then replayed, another key refused.
        }
        Err(StoreError::backend(
            super::BACKEND,
            "the interrupt kept changing during the resume; retry",
        ))
    }
}
