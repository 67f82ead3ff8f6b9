//! Conditional single-document writes: the store's compare-and-set primitive.
//!
//! On MongoDB each is one atomic command (`findAndModify`, `deleteOne`, `replaceOne`)
//! with the expectations in its filter. FerretDB v1 needs two accommodations, applied
//! when the store runs in FerretDB compatibility mode ([`super::MongoOptions::ferretdb`]):
//! - it evaluates filters and updates in the proxy and writes the result back by `_id`,
//!   so a conditional update is not atomic against a concurrent one. The store then
//!   holds a per-binding lock for every mutating call ([`MongoStore::exclusive`]), which
//!   makes the read-check-write below exact within one engine process;
//! - it pushes only a filter that is exactly `{_id: <string>}` down to SQLite; anything
//!   else scans the whole collection. So the document is read by `_id`, the filter is
//!   evaluated here ([`matches`]), and the write names only the `_id`.

use std::{cmp::Ordering, collections::HashMap, future::IntoFuture};

use futures::{TryStreamExt, future::try_join_all};

use mongodb::{
    Collection,
    bson::{Bson, Document, doc},
    options::{ReturnDocument, WriteConcern},
};

use super::{MongoContext, MongoStore, corrupt};
use crate::store::{Result, StoreError};

/// How a conditional update is issued.
#[derive(Default)]
pub(super) struct UpdateIf {
    /// Write concern when not the collection's.
    pub write_concern: Option<WriteConcern>,
    /// Fields of the previous image the caller needs (MongoDB only; FerretDB returns
    /// the whole document). `None`: the whole document.
    pub projection: Option<Document>,
}

fn id_of(filter: &Document) -> Result<Bson> {
    match filter.get("_id") {
        Some(id @ (Bson::String(_) | Bson::ObjectId(_))) => Ok(id.clone()),
        other => Err(StoreError::backend(
            super::BACKEND,
            format!("internal: a conditional write needs an _id, got {other:?}"),
        )),
    }
}

impl MongoStore {
    /// Options of a bookkeeping update whose result only says whether it matched.
    pub(super) fn hinted(&self) -> UpdateIf {
        UpdateIf {
            write_concern: Some(self.hint.clone()),
            projection: Some(doc! { "_id": 1 }),
        }
    }

    /// Options of a protocol update whose result only says whether it matched.
    pub(super) fn matched_only() -> UpdateIf {
        UpdateIf {
            write_concern: None,
            projection: Some(doc! { "_id": 1 }),
        }
    }

    /// Applies `update` to the document `filter` selects (by `_id`) if it matches the
    /// whole filter; returns the document as it was before, or `None` when nothing
    /// matched.
    pub(super) async fn update_if(
        &self,
        collection: &Collection<Document>,
        filter: Document,
        update: Document,
        options: UpdateIf,
        context: &'static str,
    ) -> Result<Option<Document>> {
        if self.ferretdb {
            let id = doc! { "_id": id_of(&filter)? };
            let Some(before) = collection.find_one(id.clone()).await.ctx(context)? else {
                return Ok(None);
            };
            if !matches(&before, &filter)? {
                return Ok(None);
            }
            let mut write = collection.update_one(id, update);
            if let Some(wc) = options.write_concern {
                write = write.write_concern(wc);
            }
            let written = write.await.ctx(context)?;
            return Ok((written.matched_count == 1).then_some(before));
        }
        let mut write = collection
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::Before);
        if let Some(wc) = options.write_concern {
            write = write.write_concern(wc);
        }
        if let Some(projection) = options.projection {
            write = write.projection(projection);
        }
        write.await.ctx(context)
    }

    /// The documents with these string ids that exist, by id. One `$in` query on
    /// MongoDB; on FerretDB, which serves only an exact `_id` filter from its index and
    /// scans the collection for an `$in`, one point read per id.
    pub(super) async fn find_by_ids(
        &self,
        collection: &Collection<Document>,
        ids: &[impl AsRef<str>],
        projection: Document,
    ) -> Result<HashMap<String, Document>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let found: Vec<Document> = if self.ferretdb {
            let reads = ids.iter().map(|id| {
                collection
                    .find_one(doc! { "_id": id.as_ref() })
                    .projection(projection.clone())
                    .into_future()
            });
            try_join_all(reads)
                .await
                .ctx("reading documents by id")?
                .into_iter()
                .flatten()
                .collect()
        } else {
            let ids: Vec<&str> = ids.iter().map(AsRef::as_ref).collect();
            collection
                .find(doc! { "_id": { "$in": ids } })
                .projection(projection)
                .await
                .ctx("reading documents by id")?
                .try_collect()
                .await
                .ctx("reading documents by id")?
        };
        Ok(found
            .into_iter()
            .filter_map(|d| Some((d.get_str("_id").ok()?.to_owned(), d)))
            .collect())
    }

    /// Deletes the document `filter` selects (by `_id`) if it matches the whole filter.
    pub(super) async fn delete_if(
        &self,
        collection: &Collection<Document>,
        filter: Document,
        context: &'static str,
    ) -> Result<bool> {
        if self.ferretdb {
            let id = doc! { "_id": id_of(&filter)? };
            let Some(current) = collection.find_one(id.clone()).await.ctx(context)? else {
                return Ok(false);
            };
            if !matches(&current, &filter)? {
                return Ok(false);
            }
            return Ok(collection.delete_one(id).await.ctx(context)?.deleted_count == 1);
        }
        Ok(collection
            .delete_one(filter)
            .await
            .ctx(context)?
            .deleted_count
            == 1)
    }

    /// Replaces the document `filter` selects (by `_id`) if it matches the whole filter.
    pub(super) async fn replace_if(
        &self,
        collection: &Collection<Document>,
        filter: Document,
        replacement: Document,
        context: &'static str,
    ) -> Result<bool> {
        if self.ferretdb {
            let id = doc! { "_id": id_of(&filter)? };
            let Some(current) = collection.find_one(id.clone()).await.ctx(context)? else {
                return Ok(false);
            };
            if !matches(&current, &filter)? {
                return Ok(false);
            }
            return Ok(collection
                .replace_one(id, replacement)
                .await
                .ctx(context)?
                .matched_count
                == 1);
        }
        Ok(collection
            .replace_one(filter, replacement)
            .await
            .ctx(context)?
            .matched_count
            == 1)
    }
}

/// Evaluates a filter against a document, for the subset of the query language this
/// store writes: field paths through embedded documents (never arrays), equality, and
/// `$exists`, `$eq`, `$ne`, `$lt`, `$lte`, `$gt`, `$gte`. Anything else is an internal
/// error, never a silent mismatch.
pub(super) fn matches(document: &Document, filter: &Document) -> Result<bool> {
    for (path, condition) in filter {
        if path.starts_with('$') {
            return Err(unsupported(path));
        }
        let value = lookup(document, path);
        let holds = match condition {
            Bson::Document(ops) if ops.keys().next().is_some_and(|k| k.starts_with('$')) => {
                let mut all = true;
                for (op, operand) in ops {
                    all &= match op.as_str() {
                        "$exists" => {
                            value.is_some()
                                == operand
                                    .as_bool()
                                    .ok_or_else(|| unsupported("$exists with a non-boolean"))?
                        }
                        "$eq" => value.is_some_and(|v| equal(v, operand)),
                        "$ne" => !value.is_some_and(|v| equal(v, operand)),
                        "$lt" => compare(value, operand) == Some(Ordering::Less),
                        "$lte" => matches!(
                            compare(value, operand),
                            Some(Ordering::Less | Ordering::Equal)
                        ),
                        "$gt" => compare(value, operand) == Some(Ordering::Greater),
                        "$gte" => matches!(
                            compare(value, operand),
                            Some(Ordering::Greater | Ordering::Equal)
                        ),
                        other => return Err(unsupported(other)),
                    };
                }
                all
            }
            // Equality with null also matches a missing field, as in MongoDB.
            Bson::Null => value.is_none_or(|v| matches!(v, Bson::Null)),
            expected => value.is_some_and(|v| equal(v, expected)),
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

fn unsupported(what: &str) -> StoreError {
    corrupt(
        "filter",
        format!("internal: {what} is not supported by the conditional-write evaluator"),
    )
}

/// The value at a dotted path through embedded documents.
fn lookup<'a>(document: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut current = document.get(parts.next()?)?;
    for part in parts {
        current = match current {
            Bson::Document(inner) => inner.get(part)?,
            _ => return None,
        };
    }
    Some(current)
}

enum Number {
    Int(i64),
    Float(f64),
}

fn number(value: &Bson) -> Option<Number> {
    match value {
        Bson::Int32(n) => Some(Number::Int(i64::from(*n))),
        Bson::Int64(n) => Some(Number::Int(*n)),
        Bson::Double(f) => Some(Number::Float(*f)),
        _ => None,
    }
}

/// Orders two values of one comparable type (numbers across BSON's numeric types);
/// `None` for a missing value or different types, which MongoDB's range operators
/// never match either.
fn compare(value: Option<&Bson>, operand: &Bson) -> Option<Ordering> {
    let value = value?;
    match (number(value), number(operand)) {
        (Some(Number::Int(a)), Some(Number::Int(b))) => return Some(a.cmp(&b)),
        (Some(a), Some(b)) => {
            let float = |n: Number| match n {
                Number::Int(i) => i as f64,
                Number::Float(f) => f,
            };
            return float(a).partial_cmp(&float(b));
        }
        _ => {}
    }
    match (value, operand) {
        (Bson::String(a), Bson::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (Bson::DateTime(a), Bson::DateTime(b)) => Some(a.cmp(b)),
        (Bson::ObjectId(a), Bson::ObjectId(b)) => Some(a.cmp(b)),
        (Bson::Boolean(a), Bson::Boolean(b)) => Some(a.cmp(b)),
        _ => None,
    }
}

fn equal(value: &Bson, expected: &Bson) -> bool {
    if number(value).is_some() && number(expected).is_some() {
        return compare(Some(value), expected) == Some(Ordering::Equal);
    }
    value == expected
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{DateTime, oid::ObjectId};

    use super::*;

    fn check(document: &Document, filter: Document) -> bool {
        matches(document, &filter).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn evaluates_the_filters_the_store_writes() {
        let oid = ObjectId::new();
        let d = doc! {
            "_id": "b", "epoch": 2_i64, "lease_generation": 5_i32,
            "state_ref": { "durable_revision": 7_i64, "durable_head": "ps_1" },
            "uncertain_runs": { "rA": { "run_id": "a" } },
            "counts": { "objects": 3_i64 }, "write_id": oid, "at": DateTime::from_millis(10),
        };
        assert!(check(
            &d,
            doc! { "_id": "b", "epoch": 2_i64, "lease_generation": 5_i64, "retiring": { "$exists": false } }
        ));
        assert!(
            !check(&d, doc! { "_id": "b", "epoch": 3_i64 }),
            "epoch mismatch"
        );
        assert!(!check(&d, doc! { "_id": "c" }), "another id");
        assert!(check(
            &d,
            doc! { "state_ref.durable_revision": 7_i64, "uncertain_runs.rB": { "$exists": false } }
        ));
        assert!(
            !check(&d, doc! { "uncertain_runs.rA": { "$exists": false } }),
            "the run is marked"
        );
        assert!(check(&d, doc! { "uncertain_runs.rA": { "$exists": true } }));
        assert!(check(&d, doc! { "counts.objects": { "$lte": 3_i64 } }));
        assert!(!check(&d, doc! { "counts.objects": { "$lte": 2_i64 } }));
        assert!(
            !check(&d, doc! { "counts.pending": { "$lte": 9_i64 } }),
            "a missing counter never compares"
        );
        assert!(check(&d, doc! { "lease_generation": { "$lt": 6_i64 } }));
        assert!(check(
            &d,
            doc! { "state_ref.durable_head": { "$ne": "ps_2" } }
        ));
        assert!(!check(
            &d,
            doc! { "state_ref.durable_head": { "$ne": "ps_1" } }
        ));
        assert!(
            check(&d, doc! { "missing": { "$ne": "x" } }),
            "$ne matches a missing field"
        );
        assert!(check(
            &d,
            doc! { "write_id": oid, "at": { "$lt": DateTime::from_millis(11) } }
        ));
        assert!(
            !check(&d, doc! { "epoch.x": 1_i64 }),
            "no path through a scalar"
        );
        assert!(
            check(&d, doc! { "retiring": Bson::Null }),
            "null matches missing"
        );
        assert!(
            matches(&d, &doc! { "$or": [] }).is_err(),
            "unsupported syntax is an error"
        );
        assert!(matches(&d, &doc! { "epoch": { "$in": [2_i64] } }).is_err());
    }
}
