//! Native objects and streams (`DESIGN.md` §4): the binding-scoped primitives the
//! harness adapters build on. Writes follow the side-document fence protocol described
//! in [`super::bindings`]: check, write tagged with a `write_id`, re-check, undo.

use std::collections::{HashMap, HashSet};

use futures::{
    TryStreamExt,
    future::{join, join_all, try_join, try_join3},
};
use mongodb::bson::{Binary, Bson, Document, doc, oid::ObjectId, spec::BinarySubtype};

use super::{
    CAS_ATTEMPTS, MongoContext, MongoStore,
    atomic::UpdateIf,
    backend,
    bindings::Counter,
    count, duplicate_indexes, int, is_duplicate_key,
    layout::{
        EntryView, KIND_ENTRY, KIND_OBJECT, KIND_STREAM, ObjectView, StreamView, decode, dt,
        entry_doc_id, object_doc_id, object_meta_projection, prefix_successor, state_doc_id,
        stream_doc_id,
    },
    uint,
};
use crate::{
    domain::{
        ids::content_digest,
        state::{PendingStateRef, Rejection, StateScope, check_key},
    },
    store::{
        AppendOutcome, NewEntry, ObjectMeta, ObjectQuery, PutMode, Result, StoreError, StoredEntry,
        StoredObject, StreamMeta, now_ms,
    },
};

fn meta_of(view: &ObjectView) -> Result<ObjectMeta> {
    Ok(ObjectMeta {
        key: view.key.clone(),
        version: uint("object version", view.version)?,
        size: uint("object size", view.size)?,
        content_digest: view.content_digest.clone(),
        updated_at_ms: view.updated_at.timestamp_millis(),
    })
}

/// `$gte`/`$lt` bounds selecting the strings that start with `prefix` and sort below
/// `before` (exclusive) when given.
fn prefix_range(prefix: &str, before: Option<&str>) -> Document {
    let mut range = doc! { "$gte": prefix };
    let upper = match (prefix_successor(prefix), before) {
        (Some(successor), Some(before)) => Some(if before < successor.as_str() {
            before.to_owned()
        } else {
            successor
        }),
        (successor, before) => successor.or_else(|| before.map(str::to_owned)),
    };
    if let Some(upper) = upper {
        range.insert("$lt", upper);
    }
    range
}

/// A stream and its sub-streams (`stream/...`): the name itself, or the names in
/// `[stream + "/", stream + "0")` (`'0'` is the byte after `'/'`).
fn stream_and_children(stream: &str) -> Document {
    doc! { "$or": [ { "name": stream }, { "name": { "$gte": format!("{stream}/"), "$lt": format!("{stream}0") } } ] }
}

fn body_bson(bytes: &[u8]) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.to_vec(),
    }
}

/// An object write, prepared once for whichever mode runs it.
struct ObjectWrite<'a> {
    scope: &'a StateScope,
    doc_id: String,
    key: &'a str,
    /// Empty when the body is the state document `body_state`.
    body: &'a [u8],
    /// The `_id` of the state document holding the body (an indexed commit, which
    /// stores a checkpoint body once), or `None` for a body of the object's own.
    body_state: Option<String>,
    size: u64,
    digest: String,
    now: i64,
    write_id: ObjectId,
}

impl ObjectWrite<'_> {
    /// The `$set` of a replacement (the version is `$inc`ed next to it).
    fn replacement(&self) -> Result<Document> {
        Ok(doc! {
            "body": body_bson(self.body),
            "body_state": self.body_state.as_deref(),
            "size": int("size", self.size)?,
            "content_digest": &self.digest,
            "updated_at": dt(self.now),
            "lease_generation": int("lease generation", self.scope.lease_generation)?,
            "write_id": self.write_id,
        })
    }

    fn new_document(&self) -> Result<Document> {
        let mut document = doc! {
            "_id": &self.doc_id,
            "binding_id": self.scope.binding_id.as_str(),
            "epoch": int("epoch", self.scope.epoch)?,
            "kind": KIND_OBJECT,
            "name": "",
            "key": self.key,
            "version": 1_i64,
            "created_at": dt(self.now),
        };
        document.extend(self.replacement()?);
        Ok(document)
    }

    fn meta(&self, version: u64) -> ObjectMeta {
        ObjectMeta {
            key: self.key.to_owned(),
            version,
            size: self.size,
            content_digest: self.digest.clone(),
            updated_at_ms: self.now,
        }
    }
}

impl MongoStore {
    pub(super) async fn put_object_impl(
        &self,
        scope: &StateScope,
        key: &str,
        body: &[u8],
        mode: PutMode,
    ) -> Result<ObjectMeta> {
        crate::store::checks::object(&self.limits, key, body)?;
        if let PutMode::Replace { expected_version } = mode {
            int("expected version", expected_version)?;
        }
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let write = ObjectWrite {
            scope,
            doc_id: object_doc_id(&scope.binding_id, int("epoch", scope.epoch)?, key),
            key,
            body,
            body_state: None,
            size: count(body.len()),
            digest: content_digest(body),
            now: now_ms(),
            write_id: ObjectId::new(),
        };
        match mode {
            PutMode::Create => self.create_object(&write, true).await,
            PutMode::Replace {
                expected_version: 0,
            } => self.create_object(&write, false).await,
            PutMode::Replace { expected_version } => {
                self.replace_object(&write, expected_version).await
            }
            PutMode::Upsert => self.upsert_object(&write).await,
        }
    }

    /// The object put of an indexed commit (`write_and_commit` with an index key): an
    /// upsert whose body is the committed state document's, referred to rather than
    /// copied. State documents of an epoch outlive its objects (they are deleted only
    /// with the epoch or the binding, and a committed one is never purged).
    pub(super) async fn index_state_impl(
        &self,
        scope: &StateScope,
        key: &str,
        state: &PendingStateRef,
    ) -> Result<ObjectMeta> {
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let epoch = int("epoch", scope.epoch)?;
        let write = ObjectWrite {
            scope,
            doc_id: object_doc_id(&scope.binding_id, epoch, key),
            key,
            body: &[],
            body_state: Some(state_doc_id(&scope.binding_id, epoch, &state.state_id)),
            size: state.size,
            digest: state.content_digest.clone(),
            now: now_ms(),
            write_id: ObjectId::new(),
        };
        self.upsert_object(&write).await
    }

    /// Objects with their bodies, the bodies of objects that refer to a state document
    /// read from it (by id, together: see `find_by_ids`).
    async fn with_bodies(&self, views: Vec<ObjectView>) -> Result<Vec<StoredObject>> {
        let refs: Vec<&str> = views
            .iter()
            .filter_map(|v| v.body_state.as_deref())
            .collect();
        let mut states: HashMap<String, Vec<u8>> = HashMap::new();
        if !refs.is_empty() {
            let found = self
                .find_by_ids(&self.state, &refs, doc! { "body": 1 })
                .await?;
            for (id, mut d) in found {
                match d.remove("body") {
                    Some(Bson::Binary(body)) => {
                        states.insert(id, body.bytes);
                    }
                    other => return Err(super::corrupt("state body", format!("{other:?}"))),
                }
            }
        }
        views
            .into_iter()
            .map(|view| {
                let meta = meta_of(&view)?;
                let body = match &view.body_state {
                    None => view.body.map(|b| b.bytes),
                    Some(state) => Some(states.get(state).cloned().ok_or_else(|| {
                        super::corrupt(
                            "object body",
                            format!("object {} refers to a missing state", view.key),
                        )
                    })?),
                };
                Ok(StoredObject { meta, body })
            })
            .collect()
    }

    /// `Create`, and `Replace` of version 0 ("must be absent"). An identical body at
    /// version 1 is an idempotent retry and returns the existing object.
    async fn create_object(&self, write: &ObjectWrite<'_>, create: bool) -> Result<ObjectMeta> {
        let scope = write.scope;
        let settle = |found: Document| -> Result<ObjectMeta> {
            let view: ObjectView = decode("object", found)?;
            if view.content_digest == write.digest && (create || view.version == 1) {
                return meta_of(&view);
            }
            let what = if create {
                format!("object {} already exists with other content", write.key)
            } else {
                format!("object {} is at version {}, not 0", write.key, view.version)
            };
            Err(Rejection::Conflict { what }.into())
        };
        let lookup = async {
            self.state
                .find_one(doc! { "_id": &write.doc_id })
                .projection(object_meta_projection())
                .await
                .ctx("reading an object")
        };
        let reserve = self.reserve(
            scope,
            Counter::Objects,
            1,
            self.limits.max_objects,
            write.now,
        );
        let (existing, reserved) = join(lookup, reserve).await;
        match (existing?, reserved) {
            (_, Err(e)) if !matches!(e.rejection(), Some(Rejection::TooMany { .. })) => {
                return Err(e);
            }
            (Some(found), reserved) => {
                if reserved.is_ok() {
                    self.release(scope, Counter::Objects, 1).await;
                }
                return settle(found);
            }
            (None, Err(too_many)) => return Err(too_many),
            (None, Ok(())) => {}
        }
        match self.state.insert_one(write.new_document()?).await {
            Ok(_) => {}
            Err(e) if is_duplicate_key(&e) => {
                self.release(scope, Counter::Objects, 1).await;
                let found = self
                    .state
                    .find_one(doc! { "_id": &write.doc_id })
                    .projection(object_meta_projection())
                    .await
                    .ctx("reading a concurrently created object")?
                    .ok_or_else(|| {
                        StoreError::backend(
                            super::BACKEND,
                            "a concurrently created object vanished; retry",
                        )
                    })?;
                return settle(found);
            }
            Err(e) => return Err(backend("creating an object", &e)),
        }
        if let Err(stale) = self.confirm(scope).await {
            self.undo_insert(write).await;
            return Err(stale);
        }
        Ok(write.meta(1))
    }

    /// `Replace { expected_version }` with a version above 0: a compare-and-set on the
    /// object's version. The previous image comes back with it, for the undo.
    async fn replace_object(
        &self,
        write: &ObjectWrite<'_>,
        expected_version: u64,
    ) -> Result<ObjectMeta> {
        let scope = write.scope;
        self.admit_write(scope, write.now).await?;
        let expected = int("expected version", expected_version)?;
        let before = self
            .update_if(
                &self.state,
                doc! { "_id": &write.doc_id, "version": expected },
                doc! { "$set": write.replacement()?, "$inc": { "version": 1_i64 } },
                UpdateIf::default(),
                "replacing an object",
            )
            .await?;
        let Some(before) = before else {
            let found = self
                .state
                .find_one(doc! { "_id": &write.doc_id })
                .projection(object_meta_projection())
                .await
                .ctx("reading an object")?;
            let actual = match found {
                Some(found) => {
                    let view: ObjectView = decode("object", found)?;
                    if view.content_digest == write.digest
                        && view.version == expected.saturating_add(1)
                    {
                        // This replacement already happened: a retry.
                        return meta_of(&view);
                    }
                    view.version
                }
                None => 0,
            };
            return Err(Rejection::Conflict {
                what: format!(
                    "object {} is at version {actual}, not {expected_version}",
                    write.key
                ),
            }
            .into());
        };
        if let Err(stale) = self.confirm(scope).await {
            self.undo_update(write, before).await;
            return Err(stale);
        }
        Ok(write.meta(expected_version.saturating_add(1)))
    }

    /// `Upsert`: replaces the object unless it already holds this body (an idempotent
    /// retry changes nothing, not even the version), creates it when absent.
    async fn upsert_object(&self, write: &ObjectWrite<'_>) -> Result<ObjectMeta> {
        let scope = write.scope;
        // Reserved up front (it is also the fence check): most upserts of adapters
        // create. A replacement hands the reservation back.
        let reserved = self
            .reserve(
                scope,
                Counter::Objects,
                1,
                self.limits.max_objects,
                write.now,
            )
            .await;
        if let Err(e) = &reserved
            && !matches!(e.rejection(), Some(Rejection::TooMany { .. }))
        {
            return reserved.map(|()| write.meta(0));
        }
        let holds = reserved.is_ok();
        for _ in 0..CAS_ATTEMPTS {
            let before = self
                .update_if(
                    &self.state,
                    doc! { "_id": &write.doc_id, "content_digest": { "$ne": &write.digest } },
                    doc! { "$set": write.replacement()?, "$inc": { "version": 1_i64 } },
                    UpdateIf::default(),
                    "replacing an object",
                )
                .await?;
            if let Some(before) = before {
                if holds {
                    self.release(scope, Counter::Objects, 1).await;
                }
                let version = before
                    .get_i64("version")
                    .map_err(|e| super::corrupt("object version", e))?;
                if let Err(stale) = self.confirm(scope).await {
                    self.undo_update(write, before).await;
                    return Err(stale);
                }
                return Ok(write.meta(uint("object version", version)?.saturating_add(1)));
            }
            let found = self
                .state
                .find_one(doc! { "_id": &write.doc_id })
                .projection(object_meta_projection())
                .await
                .ctx("reading an object")?;
            if let Some(found) = found {
                let view: ObjectView = decode("object", found)?;
                if view.content_digest != write.digest {
                    continue; // replaced concurrently in between: try again
                }
                if holds {
                    self.release(scope, Counter::Objects, 1).await;
                }
                return meta_of(&view);
            }
            if !holds {
                return Err(Rejection::TooMany {
                    what: Counter::Objects.what(),
                    limit: self.limits.max_objects,
                }
                .into());
            }
            match self.state.insert_one(write.new_document()?).await {
                Ok(_) => {
                    if let Err(stale) = self.confirm(scope).await {
                        self.undo_insert(write).await;
                        return Err(stale);
                    }
                    return Ok(write.meta(1));
                }
                Err(e) if is_duplicate_key(&e) => continue, // created concurrently: update it
                Err(e) => return Err(backend("creating an object", &e)),
            }
        }
        if holds {
            self.release(scope, Counter::Objects, 1).await;
        }
        Err(StoreError::backend(
            super::BACKEND,
            format!("object {} kept changing; retry", write.key),
        ))
    }

    /// Undoes an object this write created, if it is still this write's.
    async fn undo_insert(&self, write: &ObjectWrite<'_>) {
        let deleted = self
            .delete_if(
                &self.state,
                doc! { "_id": &write.doc_id, "write_id": write.write_id },
                "undoing an object",
            )
            .await;
        if matches!(deleted, Ok(true)) {
            self.release(write.scope, Counter::Objects, 1).await;
        }
    }

    /// Restores the image an update replaced, if the object is still this write's.
    async fn undo_update(&self, write: &ObjectWrite<'_>, before: Document) {
        let _ = self
            .replace_if(
                &self.state,
                doc! { "_id": &write.doc_id, "write_id": write.write_id },
                before,
                "undoing an object",
            )
            .await;
    }

    pub(super) async fn get_object_impl(
        &self,
        scope: &StateScope,
        key: &str,
    ) -> Result<Option<StoredObject>> {
        check_key("object key", key, self.limits.max_key_bytes)?;
        let id = object_doc_id(&scope.binding_id, int("epoch", scope.epoch)?, key);
        let read = async {
            self.state
                .find_one(doc! { "_id": id })
                .await
                .ctx("reading an object")
        };
        let (_, found) = try_join(self.admit(scope), read).await?;
        let Some(found) = found else { return Ok(None) };
        let view: ObjectView = decode("object", found)?;
        Ok(self.with_bodies(vec![view]).await?.pop())
    }

    pub(super) async fn list_objects_impl(
        &self,
        scope: &StateScope,
        query: &ObjectQuery,
    ) -> Result<Vec<StoredObject>> {
        let filter = doc! {
            "binding_id": scope.binding_id.as_str(),
            "epoch": int("epoch", scope.epoch)?,
            "kind": KIND_OBJECT,
            "name": "",
            "key": prefix_range(&query.prefix, query.before.as_deref()),
        };
        let mut projection = object_meta_projection();
        if query.with_bodies {
            projection.insert("body", 1);
            projection.insert("body_state", 1);
        }
        let list = async {
            self.state
                .find(filter)
                .sort(doc! { "key": -1 })
                .limit(self.page(query.limit))
                .projection(projection)
                .await
                .ctx("listing objects")?
                .try_collect::<Vec<Document>>()
                .await
                .ctx("listing objects")
        };
        let (_, found) = try_join(self.admit(scope), list).await?;
        let views = found
            .into_iter()
            .map(|d| decode::<ObjectView>("object", d))
            .collect::<Result<Vec<_>>>()?;
        if query.with_bodies {
            return self.with_bodies(views).await;
        }
        views
            .into_iter()
            .map(|view| {
                Ok(StoredObject {
                    meta: meta_of(&view)?,
                    body: None,
                })
            })
            .collect()
    }

    /// Deletions are not re-checked against the fence afterwards: a delete cannot be
    /// undone, and one that passed the check just before a raise is indistinguishable
    /// from one that landed just before it (see `bindings`).
    pub(super) async fn delete_objects_impl(
        &self,
        scope: &StateScope,
        prefix: &str,
    ) -> Result<u64> {
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        self.admit_write(scope, now_ms()).await?;
        let deleted = self
            .state
            .delete_many(doc! {
                "binding_id": scope.binding_id.as_str(),
                "epoch": int("epoch", scope.epoch)?,
                "kind": KIND_OBJECT,
                "name": "",
                "key": prefix_range(prefix, None),
            })
            .await
            .ctx("deleting objects")?
            .deleted_count;
        self.release(scope, Counter::Objects, deleted).await;
        Ok(deleted)
    }

    pub(super) async fn append_impl(
        &self,
        scope: &StateScope,
        stream: &str,
        entries: &[NewEntry],
    ) -> Result<AppendOutcome> {
        let limits = &self.limits;
        crate::store::checks::append(limits, stream, entries)?;
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        let binding = &scope.binding_id;
        let epoch = int("epoch", scope.epoch)?;
        let head_id = stream_doc_id(binding, epoch, stream);
        let now = now_ms();
        let write_id = ObjectId::new();

        // Within a batch the first occurrence of an id wins.
        let mut seen = HashSet::new();
        let unique: Vec<(&NewEntry, String)> = entries
            .iter()
            .filter(|e| seen.insert(e.id.as_str()))
            .map(|e| (e, entry_doc_id(binding, epoch, stream, &e.id)))
            .collect();
        let ids: Vec<&str> = unique.iter().map(|(_, id)| id.as_str()).collect();
        let (_, existing, head) = try_join3(
            self.admit_write(scope, now),
            self.existing_entries(&ids),
            async {
                self.state
                    .find_one(doc! { "_id": &head_id })
                    .projection(doc! { "last_seq": 1 })
                    .await
                    .ctx("reading a stream")
            },
        )
        .await?;
        let mut last_seq = match head {
            Some(head) => head
                .get_i64("last_seq")
                .map_err(|e| super::corrupt("stream sequence", e))?,
            None => 0,
        };
        let mut pending: Vec<(&NewEntry, String)> = unique
            .into_iter()
            .filter(|(_, id)| !existing.contains_key(id))
            .collect();

        let mut appended: Vec<String> = Vec::new();
        let mut unused_seqs: i64 = 0;
        let mut created_head = false;
        while !pending.is_empty() {
            let n = count(pending.len());
            let (first, last) = self
                .reserve_seqs(scope, &head_id, stream, n, now, write_id, &mut created_head)
                .await?;
            last_seq = last;
            let documents = pending
                .iter()
                .zip(first..)
                .map(|((entry, id), seq)| {
                    Ok(doc! {
                        "_id": id,
                        "binding_id": binding.as_str(),
                        "epoch": epoch,
                        "kind": KIND_ENTRY,
                        "name": stream,
                        "key": &entry.id,
                        "seq": seq,
                        "created_at": dt(now),
                        "lease_generation": int("lease generation", scope.lease_generation)?,
                        "write_id": write_id,
                        "body": body_bson(&entry.body),
                    })
                })
                .collect::<Result<Vec<Document>>>()?;
            // Ordered: an insert stops at the first id another append stored meanwhile
            // (a concurrent retry of the same delivery). What follows it gets fresh
            // sequence numbers in the next round, above the winner's, so the stream keeps
            // the batch's order whoever wins each id.
            let outcome = self.state.insert_many(documents).ordered(true).await;
            let stopped_at = match outcome {
                Ok(_) => None,
                Err(e) => match duplicate_indexes(&e).and_then(|d| d.into_iter().min()) {
                    Some(first_duplicate) => Some(first_duplicate),
                    // The outcome is unknown: counters stay high (safe), the caller retries.
                    None => return Err(backend("appending stream entries", &e)),
                },
            };
            let Some(stop) = stopped_at else {
                appended.extend(pending.drain(..).map(|(_, id)| id));
                break;
            };
            appended.extend(pending[..stop].iter().map(|(_, id)| id.clone()));
            let rest: Vec<(&NewEntry, String)> =
                pending.split_off(stop.saturating_add(1).min(pending.len()));
            unused_seqs = unused_seqs.saturating_add(1);
            // Of the rest, a server that kept going past the error may have stored some
            // (they carry this write's id); others were stored by the concurrent append.
            let rest_ids: Vec<&str> = rest.iter().map(|(_, id)| id.as_str()).collect();
            let stored = self.existing_entries(&rest_ids).await?;
            pending.clear();
            for (entry, id) in rest {
                match stored.get(&id) {
                    Some(Some(w)) if *w == write_id => appended.push(id),
                    Some(_) => unused_seqs = unused_seqs.saturating_add(1),
                    None => {
                        unused_seqs = unused_seqs.saturating_add(1);
                        pending.push((entry, id));
                    }
                }
            }
        }
        if unused_seqs > 0 {
            // Reserved numbers no entry took: the count drops back, the sequence keeps
            // its gap (sequence numbers order entries, they are not dense).
            let _ = self
                .state
                .update_one(
                    doc! { "_id": &head_id },
                    doc! { "$inc": { "entries": -unused_seqs } },
                )
                .write_concern(self.hint.clone())
                .await;
        }
        if !appended.is_empty()
            && let Err(stale) = self.confirm(scope).await
        {
            self.undo_append(scope, &head_id, &appended, write_id, created_head)
                .await;
            return Err(stale);
        }
        let appended = count(appended.len());
        Ok(AppendOutcome {
            appended,
            duplicates: count(entries.len()).saturating_sub(appended),
            last_seq: uint("stream sequence", last_seq)?,
        })
    }

    /// Which of these entry documents exist, with the `write_id` that stored each.
    async fn existing_entries(&self, ids: &[&str]) -> Result<HashMap<String, Option<ObjectId>>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let found = self
            .find_by_ids(&self.state, ids, doc! { "_id": 1, "write_id": 1 })
            .await?;
        Ok(found
            .into_iter()
            .map(|(id, d)| (id, d.get_object_id("write_id").ok()))
            .collect())
    }

    /// Reserves `n` sequence numbers (and entry slots) on the stream head with one
    /// atomic `$inc`, creating the head (and reserving a stream) when there is none.
    /// Returns the first and last reserved number.
    #[allow(clippy::too_many_arguments)]
    async fn reserve_seqs(
        &self,
        scope: &StateScope,
        head_id: &str,
        stream: &str,
        n: u64,
        now: i64,
        write_id: ObjectId,
        created_head: &mut bool,
    ) -> Result<(i64, i64)> {
        let limit = self.limits.max_stream_entries;
        let too_many = || -> StoreError {
            Rejection::TooMany {
                what: "stream entries",
                limit,
            }
            .into()
        };
        let room = int("limit", limit.checked_sub(n).ok_or_else(too_many)?)?;
        let n = int("count", n)?;
        for _ in 0..CAS_ATTEMPTS {
            let options = UpdateIf {
                write_concern: Some(self.hint.clone()),
                projection: Some(doc! { "last_seq": 1 }),
            };
            let head = self
                .update_if(
                    &self.state,
                    doc! { "_id": head_id, "entries": { "$lte": room } },
                    doc! { "$inc": { "last_seq": n, "entries": n }, "$set": { "updated_at": dt(now) } },
                    options,
                    "reserving stream sequence numbers",
                )
                .await?;
            if let Some(before) = head {
                // The previous image: ours are the `n` numbers after its last.
                let previous = before
                    .get_i64("last_seq")
                    .map_err(|e| super::corrupt("stream sequence", e))?;
                return Ok((previous + 1, previous + n));
            }
            let exists = self
                .state
                .find_one(doc! { "_id": head_id })
                .projection(doc! { "_id": 1 })
                .await
                .ctx("reading a stream")?;
            if exists.is_some() {
                return Err(too_many());
            }
            self.reserve(scope, Counter::Streams, 1, self.limits.max_streams, now)
                .await?;
            let created = self
                .state
                .insert_one(doc! {
                    "_id": head_id,
                    "binding_id": scope.binding_id.as_str(),
                    "epoch": int("epoch", scope.epoch)?,
                    "kind": KIND_STREAM,
                    "name": stream,
                    "key": "",
                    "last_seq": n,
                    "entries": n,
                    "created_at": dt(now),
                    "updated_at": dt(now),
                    "lease_generation": int("lease generation", scope.lease_generation)?,
                    "write_id": write_id,
                })
                .await;
            match created {
                Ok(_) => {
                    *created_head = true;
                    return Ok((1, n));
                }
                Err(e) if is_duplicate_key(&e) => self.release(scope, Counter::Streams, 1).await,
                Err(e) => return Err(backend("creating a stream", &e)),
            }
        }
        Err(StoreError::backend(
            super::BACKEND,
            format!("stream {stream} kept changing; retry"),
        ))
    }

    /// Undoes an append whose fence moved: its own entries, and the stream head if this
    /// append created it and nothing else was appended since.
    async fn undo_append(
        &self,
        scope: &StateScope,
        head_id: &str,
        appended: &[String],
        write_id: ObjectId,
        created_head: bool,
    ) {
        let undo = appended.iter().map(|id| {
            self.delete_if(
                &self.state,
                doc! { "_id": id, "write_id": write_id },
                "undoing an append",
            )
        });
        let deleted = join_all(undo)
            .await
            .into_iter()
            .filter(|d| matches!(d, Ok(true)))
            .count();
        if let Ok(deleted) = i64::try_from(deleted)
            && deleted > 0
        {
            let _ = self
                .state
                .update_one(
                    doc! { "_id": head_id },
                    doc! { "$inc": { "entries": -deleted } },
                )
                .await;
        }
        if created_head {
            let removed = self
                .delete_if(
                    &self.state,
                    doc! { "_id": head_id, "write_id": write_id, "entries": 0_i64 },
                    "undoing a stream",
                )
                .await;
            if matches!(removed, Ok(true)) {
                self.release(scope, Counter::Streams, 1).await;
            }
        }
    }

    pub(super) async fn load_stream_impl(
        &self,
        scope: &StateScope,
        stream: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>> {
        check_key("stream name", stream, self.limits.max_key_bytes)?;
        // Nothing is stored above i64::MAX, so a larger cursor simply finds nothing.
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let filter = doc! {
            "binding_id": scope.binding_id.as_str(),
            "epoch": int("epoch", scope.epoch)?,
            "kind": KIND_ENTRY,
            "name": stream,
            "seq": { "$gt": after },
        };
        let load = async {
            self.state
                .find(filter)
                .sort(doc! { "seq": 1 })
                .limit(self.page(limit))
                .projection(doc! { "key": 1, "seq": 1, "body": 1 })
                .await
                .ctx("loading a stream")?
                .try_collect::<Vec<Document>>()
                .await
                .ctx("loading a stream")
        };
        let (_, found) = try_join(self.admit(scope), load).await?;
        found
            .into_iter()
            .map(|d| {
                let view: EntryView = decode("stream entry", d)?;
                Ok(StoredEntry {
                    seq: uint("stream sequence", view.seq)?,
                    id: view.key,
                    body: view.body.bytes,
                })
            })
            .collect()
    }

    pub(super) async fn list_streams_impl(
        &self,
        scope: &StateScope,
        prefix: &str,
    ) -> Result<Vec<StreamMeta>> {
        let filter = doc! {
            "binding_id": scope.binding_id.as_str(),
            "epoch": int("epoch", scope.epoch)?,
            "kind": KIND_STREAM,
            "name": prefix_range(prefix, None),
        };
        let list = async {
            self.state
                .find(filter)
                .sort(doc! { "name": 1 })
                .projection(doc! { "name": 1, "last_seq": 1, "entries": 1, "updated_at": 1 })
                .await
                .ctx("listing streams")?
                .try_collect::<Vec<Document>>()
                .await
                .ctx("listing streams")
        };
        let (_, found) = try_join(self.admit(scope), list).await?;
        found
            .into_iter()
            .map(|d| {
                let view: StreamView = decode("stream", d)?;
                Ok(StreamMeta {
                    name: view.name,
                    entries: uint("stream entry count", view.entries)?,
                    last_seq: uint("stream sequence", view.last_seq)?,
                    updated_at_ms: view.updated_at.timestamp_millis(),
                })
            })
            .collect()
    }

    /// Not re-checked against the fence afterwards, like `delete_objects_impl`.
    pub(super) async fn delete_stream_impl(&self, scope: &StateScope, stream: &str) -> Result<u64> {
        check_key("stream name", stream, self.limits.max_key_bytes)?;
        self.rate_check(&scope.binding_id)?;
        let _serial = self.exclusive(&scope.binding_id).await;
        self.admit_write(scope, now_ms()).await?;
        let epoch = int("epoch", scope.epoch)?;
        let of_kind = |kind: &str| {
            let mut filter =
                doc! { "binding_id": scope.binding_id.as_str(), "epoch": epoch, "kind": kind };
            filter.extend(stream_and_children(stream));
            filter
        };
        // Entries first: a head without entries is an empty stream, entries without a
        // head would be unreachable.
        let entries = self
            .state
            .delete_many(of_kind(KIND_ENTRY))
            .await
            .ctx("deleting stream entries")?
            .deleted_count;
        let heads = self
            .state
            .delete_many(of_kind(KIND_STREAM))
            .await
            .ctx("deleting streams")?
            .deleted_count;
        self.release(scope, Counter::Streams, heads).await;
        Ok(entries)
    }
}
