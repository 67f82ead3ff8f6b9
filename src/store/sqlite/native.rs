//! Native objects and streams: the primitives harness adapters build their session stores
//! on (`spec/001_78d7ff78f70a2a2a.txt` §7, §8).

use rusqlite::{Connection, OptionalExtension, ToSql, params};

use super::{ScopeKey, SqlContext, admit, get_u64, sql_int, touch};
use crate::{
    domain::state::Rejection,
    store::{
        AppendOutcome, NewEntry, ObjectMeta, ObjectQuery, PutMode, Result, StoredEntry,
        StoredObject, StreamMeta,
    },
};

/// The least string above every string that starts with `prefix`, or `None` when there
/// is none (empty prefix, or a prefix of only U+10FFFF).
///
/// Prefix scans are key ranges, `prefix <= key < successor`, never `LIKE`: no wildcard
/// can leak, and the range is an index seek. This is exact because UTF-8 preserves code
/// point order under bytewise comparison, which is how SQLite's BINARY collation orders
/// TEXT: bumping the last code point gives a string that every extension of the prefix
/// sorts below (UTF-8 is prefix-free), and that every string outside the prefix set that
/// sorts above the prefix reaches.
pub(super) fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match u32::from(last) + 1 {
            0xD800 => Some('\u{E000}'), // surrogates are not chars
            n => char::from_u32(n),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The exclusive upper bound of a listing: the prefix's end, or `before` if lower.
fn upper_bound(prefix: &str, before: Option<&str>) -> Option<String> {
    match (prefix_successor(prefix), before) {
        (Some(end), Some(before)) => Some(if before < end.as_str() {
            before.to_owned()
        } else {
            end
        }),
        (end, before) => end.or_else(|| before.map(str::to_owned)),
    }
}

/// Where a put's body is stored.
pub(super) enum Body {
    /// In the object row.
    Inline(Vec<u8>),
    /// In the binding's state row of this id, written in the same transaction
    /// (`write_and_commit` with an index key): the object row holds the reference, so a
    /// checkpoint body is stored once. A state row outlives every object that refers to
    /// it: state of the current epoch is deleted only with its epoch or binding (which
    /// delete the epoch's objects too), and committed state is never purged.
    State { state_id: String, size: u64 },
}

impl Body {
    fn size(&self) -> u64 {
        match self {
            Self::Inline(body) => super::count(body.len()),
            Self::State { size, .. } => *size,
        }
    }

    /// The row's `body` and `body_state` columns.
    fn columns(self) -> (Vec<u8>, Option<String>) {
        match self {
            Self::Inline(body) => (body, None),
            Self::State { state_id, .. } => (Vec::new(), Some(state_id)),
        }
    }
}

/// A put, prepared outside the writer.
pub(super) struct Put {
    pub key: String,
    pub content_digest: String,
    pub body: Body,
    pub mode: PutMode,
    pub max_objects: u64,
}

/// An object's body: its own, or the state row it refers to (`Body::State`), as an SQL
/// expression over the object table aliased `o` (a macro, so that statements stay
/// `&'static str` through `concat!`).
macro_rules! object_body {
    () => {
        "CASE WHEN o.body_state IS NULL THEN o.body ELSE (SELECT s.body FROM harness_session_state AS s \
         WHERE s.binding_id = o.binding_id AND s.state_id = o.body_state) END"
    };
}

/// Reads the body column `i` of a row selected with `object_body!()`.
fn body_at(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    row.get::<_, Option<Vec<u8>>>(i)?.ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Null,
            "an object refers to a state row that is missing".into(),
        )
    })
}

fn object_meta(key: String, row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<ObjectMeta> {
    Ok(ObjectMeta {
        key,
        version: get_u64(row, first)?,
        size: get_u64(row, first + 1)?,
        content_digest: row.get(first + 2)?,
        updated_at_ms: row.get(first + 3)?,
    })
}

pub(super) fn put_object(
    conn: &Connection,
    scope: &ScopeKey,
    put: Put,
    now: i64,
) -> Result<ObjectMeta> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let current = conn
        .prepare_cached(
            "SELECT version, size, content_digest, updated_at_ms FROM harness_objects \
             WHERE binding_id = ?1 AND epoch = ?2 AND key = ?3",
        )
        .ctx("preparing the object lookup")?
        .query_row(params![id, epoch, put.key], |r| {
            object_meta(put.key.clone(), r, 0)
        })
        .optional()
        .ctx("looking up an object")?;
    match (put.mode, &current) {
        // An identical create is a retry: it returns what the first one stored.
        (PutMode::Create, Some(existing)) if existing.content_digest == put.content_digest => {
            return Ok(existing.clone());
        }
        (PutMode::Create, Some(_)) => {
            return Err(Rejection::Conflict {
                what: format!("object {} already exists with other content", put.key),
            }
            .into());
        }
        (PutMode::Replace { expected_version }, _) => {
            let actual = current.as_ref().map_or(0, |m| m.version);
            if actual != expected_version {
                // A retry of the replacement that made this version (its reply was lost)
                // returns it.
                if let Some(existing) = &current
                    && existing.content_digest == put.content_digest
                    && Some(existing.version) == expected_version.checked_add(1)
                {
                    return Ok(existing.clone());
                }
                return Err(Rejection::Conflict {
                    what: format!(
                        "object {} is at version {actual}, not the expected {expected_version}",
                        put.key
                    ),
                }
                .into());
            }
        }
        // An upsert of the body already stored is a retry: nothing changes, not even the
        // version.
        (PutMode::Upsert, Some(existing)) if existing.content_digest == put.content_digest => {
            return Ok(existing.clone());
        }
        (PutMode::Create | PutMode::Upsert, _) => {}
    }
    let size = put.body.size();
    let (body, body_state) = put.body.columns();
    let meta = match current {
        Some(existing) => {
            let version = existing.version.saturating_add(1);
            conn.prepare_cached(
                "UPDATE harness_objects SET version = ?4, size = ?5, content_digest = ?6, updated_at_ms = ?7, body = ?8, \
                 body_state = ?9 WHERE binding_id = ?1 AND epoch = ?2 AND key = ?3",
            )
            .ctx("preparing the object update")?
            .execute(params![id, epoch, put.key, sql_int("version", version)?, sql_int("size", size)?, put.content_digest, now, body, body_state])
            .ctx("replacing an object")?;
            touch(conn, id, now)?;
            ObjectMeta {
                key: put.key,
                version,
                size,
                content_digest: put.content_digest,
                updated_at_ms: now,
            }
        }
        None => {
            // The count is kept on the binding row: counting up to `max_objects` index
            // entries on every insert would make large stores slow to write.
            let objects: u64 = conn
                .prepare_cached("SELECT object_count FROM harness_sessions WHERE id = ?1")
                .ctx("preparing the object count")?
                .query_row([id], |r| get_u64(r, 0))
                .ctx("reading the object count")?;
            if objects >= put.max_objects {
                return Err(Rejection::TooMany {
                    what: "objects",
                    limit: put.max_objects,
                }
                .into());
            }
            conn.prepare_cached(
                "INSERT INTO harness_objects (binding_id, epoch, key, version, size, content_digest, updated_at_ms, body, body_state) \
                 VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, ?8)",
            )
            .ctx("preparing the object insert")?
            .execute(params![id, epoch, put.key, sql_int("size", size)?, put.content_digest, now, body, body_state])
            .ctx("creating an object")?;
            conn.prepare_cached(
                "UPDATE harness_sessions SET object_count = object_count + 1, updated_at_ms = max(updated_at_ms, ?2) WHERE id = ?1",
            )
            .ctx("preparing the object count update")?
            .execute(params![id, now])
            .ctx("counting an object")?;
            ObjectMeta {
                key: put.key,
                version: 1,
                size,
                content_digest: put.content_digest,
                updated_at_ms: now,
            }
        }
    };
    Ok(meta)
}

pub(super) fn get_object(
    conn: &Connection,
    scope: &ScopeKey,
    key: &str,
) -> Result<Option<StoredObject>> {
    let epoch = admit(conn, scope)?;
    conn.prepare_cached(concat!(
        "SELECT o.version, o.size, o.content_digest, o.updated_at_ms, ",
        object_body!(),
        " FROM harness_objects AS o WHERE o.binding_id = ?1 AND o.epoch = ?2 AND o.key = ?3",
    ))
    .ctx("preparing the object read")?
    .query_row(params![scope.id(), epoch, key], |r| {
        Ok(StoredObject {
            meta: object_meta(key.to_owned(), r, 0)?,
            body: Some(body_at(r, 4)?),
        })
    })
    .optional()
    .ctx("reading an object")
}

pub(super) fn list_objects(
    conn: &Connection,
    scope: &ScopeKey,
    query: &ObjectQuery,
    limit: i64,
) -> Result<Vec<StoredObject>> {
    let epoch = admit(conn, scope)?;
    let upper = upper_bound(&query.prefix, query.before.as_deref());
    // Four static statements rather than `?4 IS NULL OR key < ?4`, which would hide the
    // upper bound from the planner; bodies are only read (from overflow pages) when asked.
    let sql = match (upper.is_some(), query.with_bodies) {
        (true, true) => concat!(
            "SELECT o.key, o.version, o.size, o.content_digest, o.updated_at_ms, ",
            object_body!(),
            " FROM harness_objects AS o \
             WHERE o.binding_id = ?1 AND o.epoch = ?2 AND o.key >= ?3 AND o.key < ?5 ORDER BY o.key DESC LIMIT ?4"
        ),
        (true, false) => {
            "SELECT key, version, size, content_digest, updated_at_ms FROM harness_objects \
             WHERE binding_id = ?1 AND epoch = ?2 AND key >= ?3 AND key < ?5 ORDER BY key DESC LIMIT ?4"
        }
        (false, true) => concat!(
            "SELECT o.key, o.version, o.size, o.content_digest, o.updated_at_ms, ",
            object_body!(),
            " FROM harness_objects AS o \
             WHERE o.binding_id = ?1 AND o.epoch = ?2 AND o.key >= ?3 ORDER BY o.key DESC LIMIT ?4"
        ),
        (false, false) => {
            "SELECT key, version, size, content_digest, updated_at_ms FROM harness_objects \
             WHERE binding_id = ?1 AND epoch = ?2 AND key >= ?3 ORDER BY key DESC LIMIT ?4"
        }
    };
    let id = scope.id();
    let mut bound: Vec<&dyn ToSql> = vec![&id, &epoch, &query.prefix, &limit];
    if let Some(upper) = &upper {
        bound.push(upper);
    }
    let with_bodies = query.with_bodies;
    let mut stmt = conn
        .prepare_cached(sql)
        .ctx("preparing the object listing")?;
    let rows = stmt
        .query_map(bound.as_slice(), |r| {
            let meta = object_meta(r.get(0)?, r, 1)?;
            let body = if with_bodies {
                Some(body_at(r, 5)?)
            } else {
                None
            };
            Ok(StoredObject { meta, body })
        })
        .ctx("listing objects")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading the object listing")
}

pub(super) fn delete_objects(
    conn: &Connection,
    scope: &ScopeKey,
    prefix: &str,
    now: i64,
) -> Result<u64> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let deleted = match prefix_successor(prefix) {
        Some(end) => conn
            .prepare_cached("DELETE FROM harness_objects WHERE binding_id = ?1 AND epoch = ?2 AND key >= ?3 AND key < ?4")
            .ctx("preparing the object delete")?
            .execute(params![id, epoch, prefix, end]),
        None => conn
            .prepare_cached("DELETE FROM harness_objects WHERE binding_id = ?1 AND epoch = ?2 AND key >= ?3")
            .ctx("preparing the object delete")?
            .execute(params![id, epoch, prefix]),
    }
    .ctx("deleting objects")?;
    let deleted = super::count(deleted);
    conn.prepare_cached(
        "UPDATE harness_sessions SET object_count = max(object_count - ?2, 0), updated_at_ms = max(updated_at_ms, ?3) WHERE id = ?1",
    )
    .ctx("preparing the object count update")?
    .execute(params![id, sql_int("count", deleted)?, now])
    .ctx("uncounting objects")?;
    Ok(deleted)
}

/// An append, prepared outside the writer.
pub(super) struct Append {
    pub stream: String,
    pub entries: Vec<NewEntry>,
    pub max_streams: u64,
    pub max_stream_entries: u64,
}

pub(super) fn append(
    conn: &Connection,
    scope: &ScopeKey,
    append: Append,
    now: i64,
) -> Result<AppendOutcome> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let stream = append.stream.as_str();
    let existing = conn
        .prepare_cached("SELECT last_seq, entries FROM harness_streams WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3")
        .ctx("preparing the stream lookup")?
        .query_row(params![id, epoch, stream], |r| Ok((get_u64(r, 0)?, get_u64(r, 1)?)))
        .optional()
        .ctx("looking up a stream")?;
    let (mut last_seq, mut entries) = match existing {
        Some(found) => found,
        None if append.entries.is_empty() => {
            return Ok(AppendOutcome {
                appended: 0,
                duplicates: 0,
                last_seq: 0,
            });
        }
        None => {
            let streams: u64 = conn
                .prepare_cached("SELECT stream_count FROM harness_sessions WHERE id = ?1")
                .ctx("preparing the stream count")?
                .query_row([id], |r| get_u64(r, 0))
                .ctx("reading the stream count")?;
            if streams >= append.max_streams {
                return Err(Rejection::TooMany {
                    what: "streams",
                    limit: append.max_streams,
                }
                .into());
            }
            conn.prepare_cached(
                "INSERT INTO harness_streams (binding_id, epoch, stream, last_seq, entries, updated_at_ms) VALUES (?1, ?2, ?3, 0, 0, ?4)",
            )
            .ctx("preparing the stream insert")?
            .execute(params![id, epoch, stream, now])
            .ctx("creating a stream")?;
            conn.prepare_cached(
                "UPDATE harness_sessions SET stream_count = stream_count + 1 WHERE id = ?1",
            )
            .ctx("preparing the stream count update")?
            .execute([id])
            .ctx("counting a stream")?;
            (0, 0)
        }
    };
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO harness_stream_entries (binding_id, epoch, stream, seq, entry_id, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (binding_id, epoch, stream, entry_id) DO NOTHING",
        )
        .ctx("preparing the entry insert")?;
    let (mut appended, mut duplicates) = (0u64, 0u64);
    for entry in &append.entries {
        let seq = last_seq + 1;
        // The unique index de-duplicates against the stream and within the batch alike
        // (an id seen earlier in the batch is already in the table): first wins.
        let inserted = insert
            .execute(params![
                id,
                epoch,
                stream,
                sql_int("sequence number", seq)?,
                entry.id,
                entry.body
            ])
            .ctx("appending an entry")?;
        if inserted == 0 {
            duplicates += 1;
            continue;
        }
        if entries >= append.max_stream_entries {
            // The whole append is rolled back with its savepoint: all or nothing.
            return Err(Rejection::TooMany {
                what: "stream entries",
                limit: append.max_stream_entries,
            }
            .into());
        }
        entries += 1;
        appended += 1;
        last_seq = seq;
    }
    if appended > 0 {
        conn.prepare_cached(
            "UPDATE harness_streams SET last_seq = ?4, entries = ?5, updated_at_ms = ?6 WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3",
        )
        .ctx("preparing the stream update")?
        .execute(params![id, epoch, stream, sql_int("sequence number", last_seq)?, sql_int("entries", entries)?, now])
        .ctx("updating a stream")?;
        touch(conn, id, now)?;
    }
    Ok(AppendOutcome {
        appended,
        duplicates,
        last_seq,
    })
}

pub(super) fn load_stream(
    conn: &Connection,
    scope: &ScopeKey,
    stream: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<StoredEntry>> {
    let epoch = admit(conn, scope)?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, entry_id, body FROM harness_stream_entries \
             WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3 AND seq > ?4 ORDER BY seq LIMIT ?5",
        )
        .ctx("preparing the stream read")?;
    let rows = stmt
        .query_map(params![scope.id(), epoch, stream, after_seq, limit], |r| {
            Ok(StoredEntry {
                seq: get_u64(r, 0)?,
                id: r.get(1)?,
                body: r.get(2)?,
            })
        })
        .ctx("reading a stream")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading stream entries")
}

pub(super) fn list_streams(
    conn: &Connection,
    scope: &ScopeKey,
    prefix: &str,
) -> Result<Vec<StreamMeta>> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let end = prefix_successor(prefix);
    let sql = if end.is_some() {
        "SELECT stream, entries, last_seq, updated_at_ms FROM harness_streams \
         WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 AND stream < ?4 ORDER BY stream"
    } else {
        "SELECT stream, entries, last_seq, updated_at_ms FROM harness_streams \
         WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 ORDER BY stream"
    };
    let mut bound: Vec<&dyn ToSql> = vec![&id, &epoch, &prefix];
    if let Some(end) = &end {
        bound.push(end);
    }
    let mut stmt = conn
        .prepare_cached(sql)
        .ctx("preparing the stream listing")?;
    let rows = stmt
        .query_map(bound.as_slice(), |r| {
            Ok(StreamMeta {
                name: r.get(0)?,
                entries: get_u64(r, 1)?,
                last_seq: get_u64(r, 2)?,
                updated_at_ms: r.get(3)?,
            })
        })
        .ctx("listing streams")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading the stream listing")
}

/// Deletes `stream` and its sub-streams (`stream/...`, the `[stream/, stream0)` range:
/// `0` follows `/`), returning the entries deleted.
pub(super) fn delete_stream(
    conn: &Connection,
    scope: &ScopeKey,
    stream: &str,
    now: i64,
) -> Result<u64> {
    let epoch = admit(conn, scope)?;
    let id = scope.id();
    let (children_from, children_to) = (format!("{stream}/"), format!("{stream}0"));
    // Exact name and sub-stream range as separate statements: an `OR` of the two makes
    // the planner fall back to scanning every entry of the epoch. Entries go first and
    // are counted; the stream rows' cascade then finds nothing.
    let mut deleted = [0u64; 2];
    for (sql, counter) in [
        (
            "DELETE FROM harness_stream_entries WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3",
            0,
        ),
        (
            "DELETE FROM harness_stream_entries WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 AND stream < ?4",
            0,
        ),
        (
            "DELETE FROM harness_streams WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3",
            1,
        ),
        (
            "DELETE FROM harness_streams WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 AND stream < ?4",
            1,
        ),
    ] {
        let mut stmt = conn
            .prepare_cached(sql)
            .ctx("preparing the stream delete")?;
        let n = if sql.contains("?4") {
            stmt.execute(params![id, epoch, children_from, children_to])
        } else {
            stmt.execute(params![id, epoch, stream])
        }
        .ctx("deleting streams")?;
        deleted[counter] += super::count(n);
    }
    let [deleted_entries, deleted_streams] = deleted;
    conn.prepare_cached(
        "UPDATE harness_sessions SET stream_count = max(stream_count - ?2, 0), updated_at_ms = max(updated_at_ms, ?3) WHERE id = ?1",
    )
    .ctx("preparing the stream count update")?
    .execute(params![id, sql_int("count", deleted_streams)?, now])
    .ctx("uncounting streams")?;
    Ok(deleted_entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_bumps_the_last_code_point() {
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("ckpt/").as_deref(), Some("ckpt0"));
        assert_eq!(prefix_successor("a\u{7f}").as_deref(), Some("a\u{80}"));
        assert_eq!(
            prefix_successor("a\u{D7FF}").as_deref(),
            Some("a\u{E000}"),
            "surrogates are skipped"
        );
        assert_eq!(
            prefix_successor("a\u{10FFFF}").as_deref(),
            Some("b"),
            "a maximal last char carries"
        );
        assert_eq!(prefix_successor("\u{10FFFF}\u{10FFFF}"), None);
    }

    #[test]
    fn successor_range_is_exactly_the_prefix_set() {
        let samples = [
            "",
            "a",
            "ab",
            "abc",
            "ab\u{10FFFF}",
            "ab\u{10FFFF}z",
            "ac",
            "a\u{7f}",
            "a\u{80}",
            "a\u{7ff}",
            "a\u{800}",
            "a\u{FFFF}",
            "a\u{10000}",
            "a\u{10FFFF}",
            "b",
            "é",
            "éa",
            "ê",
            "ckpt/",
            "ckpt/1",
            "ckpt0",
            "ckpt%",
            "ckpt_",
            "\u{10FFFF}",
        ];
        for prefix in samples {
            let end = prefix_successor(prefix);
            for key in samples {
                let in_range = key >= prefix && end.as_deref().is_none_or(|end| key < end);
                assert_eq!(
                    in_range,
                    key.starts_with(prefix),
                    "prefix {prefix:?} key {key:?} end {end:?}"
                );
            }
        }
    }

    #[test]
    fn listing_bound_is_the_lower_of_prefix_end_and_before() {
        assert_eq!(
            upper_bound("ckpt/", Some("ckpt/0003")).as_deref(),
            Some("ckpt/0003")
        );
        assert_eq!(upper_bound("ckpt/", Some("zzz")).as_deref(), Some("ckpt0"));
        assert_eq!(upper_bound("", Some("k")).as_deref(), Some("k"));
        assert_eq!(upper_bound("", None), None);
    }
}
