//! Opening connections and the schema (`spec/001_78d7ff78f70a2a2a.txt` §2, §4, §6, §7,
//! "Indexes"). The schema version lives in `PRAGMA user_version`; a database written by a
//! newer build is refused rather than guessed at.

use std::{path::Path, time::Duration};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::{SqlContext, SqliteError};
use crate::store::StoreError;

/// The schema this build reads and writes.
pub(super) const SCHEMA_VERSION: i64 = 6;

/// Version 6: the state table without its unique index on `(binding_id,
/// idempotency_digest)`. The state id is cut from that digest, so the primary key
/// already finds the row a key made; the second index cost one more page write per
/// binding in every group commit (its entries are scattered by binding). SQLite cannot
/// drop a table constraint, so the table is rebuilt (rows copied in one statement,
/// inside the migration's transaction) and its two partial indexes made again.
const SCHEMA_V6: &str = r"
CREATE TABLE harness_session_state_v6 (
    binding_id         TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch              INTEGER NOT NULL,
    state_id           TEXT    NOT NULL,
    idempotency_digest TEXT    NOT NULL,
    codec              TEXT    NOT NULL,
    size               INTEGER NOT NULL,
    content_digest     TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    committed          INTEGER NOT NULL DEFAULT 0 CHECK (committed IN (0, 1)),
    body               BLOB    NOT NULL,
    PRIMARY KEY (binding_id, state_id)
) STRICT;
INSERT INTO harness_session_state_v6 (binding_id, epoch, state_id, idempotency_digest, codec, size,
                                      content_digest, created_at_ms, committed, body)
    SELECT binding_id, epoch, state_id, idempotency_digest, codec, size, content_digest,
           created_at_ms, committed, body
    FROM harness_session_state ORDER BY rowid;
DROP TABLE harness_session_state;
ALTER TABLE harness_session_state_v6 RENAME TO harness_session_state;
CREATE INDEX harness_session_state_pending
    ON harness_session_state (binding_id, epoch) WHERE committed = 0;
CREATE INDEX harness_session_state_pending_age
    ON harness_session_state (created_at_ms) WHERE committed = 0;
";

/// Version 5: an object can refer to a state row of its binding for its body
/// (`body_state`; its own `body` is then empty). `write_and_commit` with an index key
/// (the LangGraph checkpoint: committed state and indexed object of one body) stores
/// the body once instead of twice.
const SCHEMA_V5: &str = r"
ALTER TABLE harness_objects ADD COLUMN body_state TEXT;
";

/// Version 4: the pending-entry bound reads a partial index of pending entries only,
/// instead of an index over every state row. That index took one more page write per
/// binding in every group commit (its entries are scattered by binding, and a commit
/// rewrote the entry's `committed` key), about a quarter of the commit round's cost in
/// `make bench-store`; epoch purges use the primary key's `binding_id` prefix instead.
const SCHEMA_V4: &str = r"
DROP INDEX IF EXISTS harness_session_state_epoch;
CREATE INDEX IF NOT EXISTS harness_session_state_pending
    ON harness_session_state (binding_id, epoch) WHERE committed = 0;
";

/// How long a connection waits for a lock held by another connection (another process
/// opening the same file, or a checkpoint) before failing with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Cap on the WAL file kept after a checkpoint: it is truncated to this size instead of
/// staying at its high-water mark.
const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

/// Prepared statements kept per connection. The store uses a few dozen distinct
/// statements; the default cache (16) would re-prepare them on every call.
const WRITER_STATEMENT_CACHE: usize = 128;
const READER_STATEMENT_CACHE: usize = 64;

/// Version 1. Conventions:
/// - `STRICT` tables: a value of the wrong type is an error, not a silent coercion.
/// - Blob columns come last: SQLite walks a record's overflow chain to reach a column
///   stored after a large blob, so small columns are placed before it.
/// - Tables holding bodies keep their rowid (rows larger than a fraction of a page are
///   a poor fit for `WITHOUT ROWID`); small, key-addressed tables are `WITHOUT ROWID`.
/// - Every child table's key starts with `binding_id`, so the `ON DELETE CASCADE` of a
///   binding and per-binding range scans are index lookups.
/// - Idempotency keys are stored only as their keyed digests.
const SCHEMA_V1: &str = r"
CREATE TABLE harness_sessions (
    id                    TEXT    NOT NULL PRIMARY KEY,
    environment           TEXT    NOT NULL,
    owner_subject_ref     TEXT    NOT NULL,
    agent_id              TEXT    NOT NULL,
    conversation_id       TEXT    NOT NULL,
    harness               TEXT    NOT NULL,
    epoch                 INTEGER NOT NULL CHECK (epoch >= 0),
    lease_generation      INTEGER NOT NULL CHECK (lease_generation >= 0),
    durable_revision      INTEGER NOT NULL DEFAULT 0 CHECK (durable_revision >= 0),
    head_state_id         TEXT,
    head_codec            TEXT,
    head_digest           TEXT,
    head_size             INTEGER,
    head_run_id           TEXT,
    committed_at_ms       INTEGER,
    head_lease_generation INTEGER,
    durability            TEXT,
    object_count          INTEGER NOT NULL DEFAULT 0,
    stream_count          INTEGER NOT NULL DEFAULT 0,
    created_at_ms         INTEGER NOT NULL,
    updated_at_ms         INTEGER NOT NULL,
    terminal_json         TEXT,
    interrupt_json        TEXT
) STRICT;
-- One binding per identity (the id is a keyed digest of it, so this only trips when
-- two keys disagree about one conversation).
CREATE UNIQUE INDEX harness_sessions_identity
    ON harness_sessions (environment, owner_subject_ref, agent_id, conversation_id);
-- Retention: bindings by last write activity.
CREATE INDEX harness_sessions_activity ON harness_sessions (updated_at_ms);

CREATE TABLE harness_session_state (
    binding_id         TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch              INTEGER NOT NULL,
    state_id           TEXT    NOT NULL,
    idempotency_digest TEXT    NOT NULL,
    codec              TEXT    NOT NULL,
    size               INTEGER NOT NULL,
    content_digest     TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    committed          INTEGER NOT NULL DEFAULT 0 CHECK (committed IN (0, 1)),
    body               BLOB    NOT NULL,
    PRIMARY KEY (binding_id, state_id),
    UNIQUE (binding_id, idempotency_digest)
) STRICT;
-- Pending-entry bound and epoch purges.
CREATE INDEX harness_session_state_epoch ON harness_session_state (binding_id, epoch, committed);
-- Retention of never-committed entries.
CREATE INDEX harness_session_state_pending_age
    ON harness_session_state (created_at_ms) WHERE committed = 0;

CREATE TABLE harness_objects (
    binding_id     TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch          INTEGER NOT NULL,
    key            TEXT    NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 1),
    size           INTEGER NOT NULL,
    content_digest TEXT    NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    body           BLOB    NOT NULL,
    PRIMARY KEY (binding_id, epoch, key)
) STRICT;

CREATE TABLE harness_streams (
    binding_id    TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch         INTEGER NOT NULL,
    stream        TEXT    NOT NULL,
    last_seq      INTEGER NOT NULL,
    entries       INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (binding_id, epoch, stream)
) STRICT, WITHOUT ROWID;

CREATE TABLE harness_stream_entries (
    binding_id TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    stream     TEXT    NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    entry_id   TEXT    NOT NULL,
    body       BLOB    NOT NULL,
    PRIMARY KEY (binding_id, epoch, stream, seq),
    UNIQUE (binding_id, epoch, stream, entry_id),
    FOREIGN KEY (binding_id, epoch, stream)
        REFERENCES harness_streams (binding_id, epoch, stream) ON DELETE CASCADE
) STRICT;

CREATE TABLE harness_uncertain_runs (
    binding_id   TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch        INTEGER NOT NULL,
    run_id       TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    marked_at_ms INTEGER NOT NULL,
    PRIMARY KEY (binding_id, epoch, run_id)
) STRICT, WITHOUT ROWID;

-- One row per consumed interrupt (an interrupt id may be raised again at a later
-- revision, hence the revision in the key).
CREATE TABLE harness_interrupt_resumes (
    binding_id         TEXT    NOT NULL REFERENCES harness_sessions (id) ON DELETE CASCADE,
    epoch              INTEGER NOT NULL,
    interrupt_id       TEXT    NOT NULL,
    revision           INTEGER NOT NULL,
    idempotency_digest TEXT    NOT NULL,
    resumed_at_ms      INTEGER NOT NULL,
    outcome_json       TEXT    NOT NULL,
    PRIMARY KEY (binding_id, epoch, interrupt_id, revision)
) STRICT;

-- No foreign key: the audit trail outlives the bindings it talks about.
CREATE TABLE harness_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    action      TEXT    NOT NULL,
    binding_id  TEXT,
    detail_json TEXT    NOT NULL
) STRICT;
";

/// Opens the one read-write connection, with the durability settings the store promises.
pub(super) fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).ctx("opening the database")?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .ctx("setting busy_timeout")?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .ctx("setting journal_mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteError::NoWal(mode).into());
    }
    // FULL: in WAL mode the WAL is fsynced on every COMMIT, so an acknowledged commit
    // survives power loss. NORMAL would only survive a process crash. This is the
    // durability promise of the store; do not weaken it.
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("setting synchronous")?;
    // A no-op on Linux; on macOS plain fsync does not reach stable storage.
    conn.pragma_update(None, "fullfsync", true)
        .ctx("setting fullfsync")?;
    conn.pragma_update(None, "foreign_keys", true)
        .ctx("setting foreign_keys")?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)
        .ctx("setting journal_size_limit")?;
    // Pragmas that silently do nothing (e.g. inside a transaction) are checked.
    let synchronous: i64 = conn
        .pragma_query_value(None, "synchronous", |row| row.get(0))
        .ctx("reading synchronous")?;
    let foreign_keys: i64 = conn
        .pragma_query_value(None, "foreign_keys", |row| row.get(0))
        .ctx("reading foreign_keys")?;
    if synchronous < 2 || foreign_keys != 1 {
        return Err(SqliteError::Pragma(format!(
            "synchronous={synchronous} foreign_keys={foreign_keys}"
        ))
        .into());
    }
    conn.set_prepared_statement_cache_capacity(WRITER_STATEMENT_CACHE);
    Ok(conn)
}

/// Opens a read-only connection: a bug that tried to write through a reader fails
/// instead of bypassing the single writer.
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).ctx("opening a reader connection")?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .ctx("setting busy_timeout on a reader")?;
    conn.set_prepared_statement_cache_capacity(READER_STATEMENT_CACHE);
    Ok(conn)
}

/// Brings the schema to [`SCHEMA_VERSION`], or refuses a database from a newer build.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    // IMMEDIATE takes the write lock before reading the version, so two processes
    // opening a fresh file at once cannot both try to create the schema.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("starting the migration")?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .ctx("reading user_version")?;
    match found {
        SCHEMA_VERSION => return Ok(()),
        0..=5 => {
            if found == 0 {
                tx.execute_batch(SCHEMA_V1)
                    .ctx("creating schema version 1")?;
            }
            if found <= 1 {
                // Version 2 adds long-term memory (`harness_memories`).
                tx.execute_batch(super::memory::SCHEMA_V2)
                    .ctx("creating schema version 2")?;
            }
            if found <= 2 {
                // Version 3 adds the run ledger (`harness_ledger_*`).
                tx.execute_batch(super::ledger::SCHEMA_V3)
                    .ctx("creating schema version 3")?;
            }
            if found <= 3 {
                tx.execute_batch(SCHEMA_V4)
                    .ctx("migrating to schema version 4")?;
            }
            if found <= 4 {
                tx.execute_batch(SCHEMA_V5)
                    .ctx("migrating to schema version 5")?;
            }
            tx.execute_batch(SCHEMA_V6)
                .ctx("migrating to schema version 6")?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .ctx("writing user_version")?;
        }
        v if v > SCHEMA_VERSION => {
            return Err(SqliteError::NewerSchema {
                found: v,
                supported: SCHEMA_VERSION,
            }
            .into());
        }
        v => {
            return Err(SqliteError::Corrupt {
                what: "schema version",
                detail: v.to_string(),
            }
            .into());
        }
    }
    tx.commit().ctx("committing the migration")
}
