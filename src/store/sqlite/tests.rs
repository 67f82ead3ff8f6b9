//! Backend-specific tests: what the shared conformance suite cannot see (schema
//! versioning, pragmas, batched purges, query plans, counters).

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU64, Ordering},
};

use super::*;
use crate::domain::{
    ids::Keyring,
    state::{RunOutcome, RunTerminal},
};

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = format!(
            "harness-sqlite-unit-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        TempDir(dir)
    }
    fn db(&self) -> PathBuf {
        self.0.join("nested").join("state.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn keyring() -> Keyring {
    Keyring::new(vec![9u8; 32], "unit").unwrap_or_else(|e| panic!("{e}"))
}

async fn store(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(&dir.db(), Limits::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn binding(store: &SqliteStore, conversation: &str) -> StateScope {
    let kr = keyring();
    let record = BindingRecord {
        binding_id: kr.binding_id("user:u", "agent", conversation),
        environment: "unit".into(),
        owner: kr.subject_ref("user:u"),
        agent_id: "agent".into(),
        conversation_id: conversation.into(),
        harness: "deepagents".into(),
        epoch: 0,
        lease_generation: 1,
        created_at_ms: 1,
    };
    store
        .ensure_binding(&record)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    StateScope {
        binding_id: record.binding_id,
        environment: "unit".into(),
        harness: "deepagents".into(),
        epoch: 0,
        codec: "langgraph-checkpoint-v1".into(),
        lease_generation: 1,
    }
}

fn digest(scope: &StateScope, key: &str) -> IdempotencyDigest {
    keyring().idempotency_digest(&scope.binding_id, "state.write", key)
}

fn commit(state_id: &str, expected: u64, run: &str) -> CommitRequest {
    CommitRequest {
        state_id: state_id.into(),
        expected_revision: expected,
        run_id: run.into(),
        terminal: Some(RunTerminal {
            outcome: RunOutcome::Completed,
            metadata: serde_json::json!({}),
        }),
        interrupt: None,
    }
}

fn ok<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn code<T: std::fmt::Debug>(r: Result<T>) -> &'static str {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_survive_reopening() {
    let dir = TempDir::new("reopen");
    let scope = {
        let store = store(&dir).await;
        let scope = binding(&store, "reopen").await;
        let p = ok(store
            .write_native_state(&scope, b"durable", &digest(&scope, "k"))
            .await);
        ok(store
            .commit_head(&scope, &commit(&p.state_id, 0, "run-1"))
            .await);
        scope
    };
    let store = store(&dir).await;
    let head = ok(store.load_head(&scope).await).unwrap_or_else(|| panic!("head lost"));
    assert_eq!((head.revision, head.run_id.as_str()), (1, "run-1"));
    assert_eq!(
        ok(store.read_state(&scope, &head.state_id).await).as_deref(),
        Some(&b"durable"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let dir = TempDir::new("newer");
    drop(store(&dir).await);
    {
        let conn = Connection::open(dir.db()).unwrap_or_else(|e| panic!("{e}"));
        conn.pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    match SqliteStore::open(&dir.db(), Limits::default()).await {
        Err(StoreError::Backend {
            backend: "sqlite",
            message,
        }) => assert!(message.contains("newer"), "{message}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// A version 3 database (as the previous release left it, with a pending entry) opens
/// at version 4: the all-rows state index is gone, the pending-only one is there, and
/// the pending entry still counts against the bound and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_database_migrates_to_the_current_schema() {
    let dir = TempDir::new("v3");
    let pending = {
        let store = store(&dir).await;
        let scope = binding(&store, "v3").await;
        let digest = keyring().idempotency_digest(&scope.binding_id, "state.write", "k1");
        let pending = ok(store.write_native_state(&scope, b"body", &digest).await);
        ok(store
            .put_object(&scope, "before", b"object body", PutMode::Create)
            .await);
        (scope, pending)
    };
    let sql = |conn: &Connection, q: &str| -> i64 {
        conn.query_row(q, [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{q}: {e}"))
    };
    let index = "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ";
    let column =
        "SELECT count(*) FROM pragma_table_info('harness_objects') WHERE name = 'body_state'";
    {
        // What version 3 had: the index over every state row, no object body reference.
        let conn = Connection::open(dir.db()).unwrap_or_else(|e| panic!("{e}"));
        conn.execute_batch(
            "DROP INDEX harness_session_state_pending;
             CREATE INDEX harness_session_state_epoch ON harness_session_state (binding_id, epoch, committed);
             CREATE UNIQUE INDEX harness_session_state_key ON harness_session_state (binding_id, idempotency_digest);
             ALTER TABLE harness_objects DROP COLUMN body_state;
             PRAGMA user_version = 3;",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sql(&conn, column), 0);
    }
    let store = store(&dir).await;
    {
        let conn = Connection::open(dir.db()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sql(&conn, "PRAGMA user_version"), schema::SCHEMA_VERSION);
        assert_eq!(
            sql(&conn, &format!("{index}'harness_session_state_epoch'")),
            0
        );
        assert_eq!(
            sql(&conn, &format!("{index}'harness_session_state_pending'")),
            1
        );
        assert_eq!(sql(&conn, column), 1);
        assert_eq!(
            sql(
                &conn,
                "SELECT count(*) FROM pragma_index_list('harness_session_state') WHERE \"unique\" = 1"
            ),
            1,
            "the primary key is the state table's only unique index"
        );
        assert_eq!(
            sql(
                &conn,
                &format!("{index}'harness_session_state_pending_age'")
            ),
            1
        );
    }
    let (scope, pending) = pending;
    let retried = ok(store
        .write_native_state(&scope, b"body", &digest(&scope, "k1"))
        .await);
    assert_eq!(
        retried.state_id, pending.state_id,
        "the key still finds its state"
    );
    let before = ok(store.get_object(&scope, "before").await);
    assert_eq!(
        before.and_then(|o| o.body).as_deref(),
        Some(&b"object body"[..])
    );
    let head = ok(store
        .commit_head(
            &scope,
            &CommitRequest {
                state_id: pending.state_id,
                expected_revision: 0,
                run_id: "run-1".into(),
                terminal: None,
                interrupt: None,
            },
        )
        .await);
    assert_eq!(head.revision, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_commit_stores_its_body_once() {
    let dir = TempDir::new("once");
    let store = store(&dir).await;
    let scope = binding(&store, "once").await;
    let body = vec![7u8; 64 << 10];
    let (pending, _) = ok(store
        .write_and_commit(
            &scope,
            &body,
            &digest(&scope, "k1"),
            &commit("", 0, "run-1"),
            Some("lg/t/n/1"),
        )
        .await);
    let conn = Connection::open(dir.db()).unwrap_or_else(|e| panic!("{e}"));
    let (object_bytes, body_state): (i64, Option<String>) = conn
        .query_row(
            "SELECT length(body), body_state FROM harness_objects WHERE key = 'lg/t/n/1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(object_bytes, 0, "the object row holds no copy of the body");
    assert_eq!(body_state.as_deref(), Some(pending.state_id.as_str()));
    let stored: i64 = conn
        .query_row(
            "SELECT (SELECT sum(length(body)) FROM harness_session_state) + \
                    (SELECT sum(length(body)) FROM harness_objects)",
            [],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stored, 64 << 10, "one copy in the whole database");
    let read = ok(store.get_object(&scope, "lg/t/n/1").await);
    assert_eq!(read.and_then(|o| o.body), Some(body));
}

#[test]
fn the_writer_connection_is_durable() {
    let dir = TempDir::new("pragmas");
    std::fs::create_dir_all(dir.0.join("nested")).unwrap_or_else(|e| panic!("{e}"));
    let conn = schema::open_writer(&dir.db()).unwrap_or_else(|e| panic!("{e}"));
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap_or_else(|e| panic!("{e}"));
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap_or_else(|e| panic!("{e}"));
    let fk: i64 = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (mode.as_str(), sync, fk),
        ("wal", 2, 1),
        "WAL, synchronous=FULL, foreign keys on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_purges_in_batches() {
    let dir = TempDir::new("clear-batches");
    let store = store(&dir).await;
    let scope = binding(&store, "clear-batches").await;
    for i in 0..7 {
        ok(store
            .write_native_state(
                &scope,
                format!("s{i}").as_bytes(),
                &digest(&scope, &format!("s{i}")),
            )
            .await);
        ok(store
            .put_object(&scope, &format!("o/{i}"), b"o", PutMode::Create)
            .await);
    }
    let entries: Vec<NewEntry> = (0..9)
        .map(|i| NewEntry {
            id: format!("e{i}"),
            body: vec![1],
        })
        .collect();
    ok(store.append(&scope, "s", &entries).await);
    ok(store.mark_uncertain(&scope, "run-x", "timeout").await);

    let id = scope.binding_id.clone();
    let mut step = ok(store
        .writer
        .run(move |conn| bindings::start_clear(conn, &id, 1, 10, 2))
        .await);
    let mut rounds = 1;
    while !step.done {
        let (id, so_far) = (scope.binding_id.clone(), step.clone());
        step = ok(store
            .writer
            .run(move |conn| bindings::continue_clear(conn, &id, so_far, 10, 2))
            .await);
        rounds += 1;
    }
    assert!(rounds >= 5, "batches of 2 over 9 entries: {rounds} rounds");
    let report = step.report();
    assert_eq!(
        (
            report.epoch,
            report.states_deleted,
            report.objects_deleted,
            report.stream_entries_deleted
        ),
        (1, 7, 7, 9)
    );
    let audits = ok(store.audit_records(10).await);
    assert_eq!(
        audits
            .iter()
            .filter(|a| a.action == "binding.clear")
            .count(),
        1,
        "one record per clear: {audits:?}"
    );
    assert_eq!(audits[0].detail["stream_entries_deleted"], 9);

    let leftovers: i64 = ok(store
        .readers
        .read(|tx| {
            tx.query_row(
                "SELECT (SELECT count(*) FROM harness_session_state) + (SELECT count(*) FROM harness_objects) \
                 + (SELECT count(*) FROM harness_stream_entries) + (SELECT count(*) FROM harness_streams) \
                 + (SELECT count(*) FROM harness_uncertain_runs)",
                [],
                |r| r.get(0),
            )
            .ctx("counting")
        })
        .await);
    assert_eq!(leftovers, 0);
    // The counters restarted with the epoch: the object bound is not eaten by old rows.
    let e1 = StateScope { epoch: 1, ..scope };
    ok(store.put_object(&e1, "fresh", b"f", PutMode::Create).await);
    let count: i64 = ok(store
        .readers
        .read(|tx| {
            tx.query_row("SELECT object_count FROM harness_sessions", [], |r| {
                r.get(0)
            })
            .ctx("count")
        })
        .await);
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_retires_bindings_in_batches() {
    let dir = TempDir::new("sweep-batches");
    let store = store(&dir).await;
    let old = binding(&store, "old").await;
    let p = ok(store
        .write_native_state(&old, b"head", &digest(&old, "h"))
        .await);
    ok(store
        .commit_head(&old, &commit(&p.state_id, 0, "run-1"))
        .await);
    for i in 0..5 {
        ok(store
            .put_object(&old, &format!("o/{i}"), b"o", PutMode::Create)
            .await);
    }
    let entries: Vec<NewEntry> = (0..5)
        .map(|i| NewEntry {
            id: format!("e{i}"),
            body: vec![1],
        })
        .collect();
    ok(store.append(&old, "s", &entries).await);
    let now = now_ms() + 10_000;
    let policy = RetentionPolicy {
        id: "p".into(),
        pending_ttl_ms: 1_000_000,
        conversation_ttl_ms: Some(5_000),
    };
    let young = binding(&store, "young").await;
    // Written "after" the cutoff: survives.
    ok(store
        .writer
        .run(move |conn| touch(conn, young.binding_id.as_str(), now))
        .await);

    let report = ok(retention::sweep(&store.writer, &store.readers, &policy, now, 2).await);
    assert_eq!(
        (
            report.bindings_deleted,
            report.states_deleted,
            report.objects_deleted,
            report.stream_entries_deleted
        ),
        (1, 1, 5, 5),
        "{report:?}"
    );
    assert!(ok(store.get_binding(&old.binding_id).await).is_none());
    assert_eq!(
        ok(store.audit_records(1).await)[0].detail["bindings_deleted"],
        1
    );
    let bindings: i64 = ok(store
        .readers
        .read(|tx| {
            tx.query_row("SELECT count(*) FROM harness_sessions", [], |r| r.get(0))
                .ctx("count")
        })
        .await);
    assert_eq!(bindings, 1, "the young binding stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_is_free_again_in_a_new_epoch() {
    let dir = TempDir::new("key-reuse");
    let store = store(&dir).await;
    let scope = binding(&store, "key-reuse").await;
    let first = ok(store
        .write_native_state(&scope, b"epoch-0", &digest(&scope, "run-1"))
        .await);
    // Move the epoch without purging, as a clear interrupted after its first transaction.
    let id = scope.binding_id.clone();
    ok(store
        .writer
        .run(move |conn| bindings::start_clear(conn, &id, 1, 1, 0))
        .await);
    let e1 = StateScope { epoch: 1, ..scope };
    let again = ok(store
        .write_native_state(&e1, b"epoch-1", &digest(&e1, "run-1"))
        .await);
    assert_eq!(
        (again.epoch, again.state_id.as_str()),
        (1, first.state_id.as_str())
    );
    assert_eq!(
        ok(store.read_state(&e1, &again.state_id).await).as_deref(),
        Some(&b"epoch-1"[..])
    );
    let head = ok(store
        .commit_head(&e1, &commit(&again.state_id, 0, "run-1"))
        .await);
    assert_eq!(head.epoch, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_codec_cannot_read_or_commit() {
    let dir = TempDir::new("codec");
    let store = store(&dir).await;
    let scope = binding(&store, "codec").await;
    let p = ok(store
        .write_native_state(&scope, b"lg", &digest(&scope, "k"))
        .await);
    let other = StateScope {
        codec: "strands-session-v1".into(),
        ..scope.clone()
    };
    assert_eq!(
        code(store.read_state(&other, &p.state_id).await),
        "forbidden_scope"
    );
    assert_eq!(
        code(
            store
                .commit_head(&other, &commit(&p.state_id, 0, "run-1"))
                .await
        ),
        "forbidden_scope"
    );
    ok(store
        .commit_head(&scope, &commit(&p.state_id, 0, "run-1"))
        .await);
    assert_eq!(code(store.load_head(&other).await), "forbidden_scope");
    assert_eq!(
        code(
            store
                .write_native_state(&other, b"lg", &digest(&scope, "k"))
                .await
        ),
        "idempotency_mismatch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_and_bounds_hold() {
    let dir = TempDir::new("bounds");
    let limits = Limits {
        max_objects: 3,
        max_streams: 2,
        max_stream_entries: 4,
        ..Limits::default()
    };
    let store = SqliteStore::open(&dir.db(), limits)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let scope = binding(&store, "bounds").await;
    for k in ["a/1", "a/2", "b"] {
        ok(store.put_object(&scope, k, b"v", PutMode::Create).await);
    }
    assert_eq!(
        code(store.put_object(&scope, "c", b"v", PutMode::Create).await),
        "too_large"
    );
    assert_eq!(
        ok(store.put_object(&scope, "b", b"w", PutMode::Upsert).await).version,
        2,
        "replacing is not a new object"
    );
    assert_eq!(ok(store.delete_objects(&scope, "a/").await), 2);
    ok(store.put_object(&scope, "c", b"v", PutMode::Create).await);
    assert_eq!(
        ok(store.delete_objects(&scope, "").await),
        2,
        "an empty prefix is every key"
    );

    let e = |id: &str| NewEntry {
        id: id.into(),
        body: vec![],
    };
    ok(store.append(&scope, "s1", &[e("1"), e("2"), e("3")]).await);
    assert_eq!(
        code(store.append(&scope, "s1", &[e("4"), e("5")]).await),
        "too_large",
        "all or nothing"
    );
    assert_eq!(
        ok(store.load_stream(&scope, "s1", 0, 0).await).len(),
        3,
        "the refused append left nothing"
    );
    assert_eq!(
        ok(store.append(&scope, "s1", &[e("1"), e("4")]).await).last_seq,
        4,
        "duplicates do not count"
    );
    ok(store.append(&scope, "s2", &[e("1")]).await);
    assert_eq!(
        code(store.append(&scope, "s3", &[e("1")]).await),
        "too_large"
    );
    assert_eq!(
        ok(store.append(&scope, "s3", &[]).await).last_seq,
        0,
        "an empty append creates nothing"
    );
    assert_eq!(ok(store.delete_stream(&scope, "s2").await), 1);
    ok(store.append(&scope, "s3", &[e("1")]).await);

    assert_eq!(
        code(store.raise_fence(&scope.binding_id, 0, u64::MAX).await),
        "invalid"
    );
    assert_eq!(
        code(store.raise_fence(&scope.binding_id, 1, 2).await),
        "invalid",
        "the epoch moves by clear only"
    );
    let long_reason = "r".repeat(MAX_REASON_BYTES + 1);
    assert_eq!(
        code(store.mark_uncertain(&scope, "run", &long_reason).await),
        "invalid"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_refuses_with_a_hint() {
    let dir = TempDir::new("rate");
    let limits = Limits {
        writes_per_second: 1,
        write_burst: 2,
        ..Limits::default()
    };
    let store = SqliteStore::open(&dir.db(), limits)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let scope = binding(&store, "rate").await;
    ok(store.put_object(&scope, "a", b"v", PutMode::Upsert).await);
    ok(store.put_object(&scope, "a", b"v", PutMode::Upsert).await);
    match store.put_object(&scope, "a", b"v", PutMode::Upsert).await {
        Err(StoreError::Rejected(Rejection::RateLimited { retry_after_ms })) => {
            assert!((1..=1000).contains(&retry_after_ms))
        }
        other => panic!("expected rate_limited, got {other:?}"),
    }
    assert!(
        ok(store.load_head(&scope).await).is_none(),
        "reads are not rate limited"
    );
}

/// The hot statements seek the index range they are written for (checked on the plan,
/// since a merely "indexed" plan can still walk a whole binding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_use_indexes() {
    let dir = TempDir::new("plans");
    let store = store(&dir).await;
    let statements = [
        (
            "SELECT key, version FROM harness_objects WHERE binding_id = ?1 AND epoch = ?2 AND key >= ?3 AND key < ?5 ORDER BY key DESC LIMIT ?4",
            "key>? AND key<?",
        ),
        (
            "SELECT seq, entry_id, body FROM harness_stream_entries WHERE binding_id = ?1 AND epoch = ?2 AND stream = ?3 AND seq > ?4 ORDER BY seq LIMIT ?5",
            "stream=? AND seq>?",
        ),
        (
            "DELETE FROM harness_stream_entries WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 AND stream < ?4",
            "stream>? AND stream<?",
        ),
        (
            "DELETE FROM harness_streams WHERE binding_id = ?1 AND epoch = ?2 AND stream >= ?3 AND stream < ?4",
            "stream>? AND stream<?",
        ),
        (
            "SELECT epoch, idempotency_digest, codec, size, content_digest FROM harness_session_state \
             WHERE binding_id = ?1 AND state_id = ?2",
            "binding_id=? AND state_id=?",
        ),
        (
            "SELECT o.version, (SELECT s.body FROM harness_session_state AS s WHERE s.binding_id = o.binding_id \
             AND s.state_id = o.body_state) FROM harness_objects AS o WHERE o.binding_id = ?1 AND o.epoch = ?2 AND o.key = ?3",
            "binding_id=? AND epoch=? AND key=?",
        ),
        (
            "SELECT count(*) FROM harness_session_state WHERE binding_id = ?1 AND epoch = ?2 AND committed = 0",
            "harness_session_state_pending (binding_id=? AND epoch=?)",
        ),
        (
            "SELECT s.rowid FROM harness_session_state AS s WHERE s.committed = 0 AND s.created_at_ms < ?1 \
             AND NOT EXISTS (SELECT 1 FROM harness_sessions AS h WHERE h.id = s.binding_id AND h.head_state_id = s.state_id) LIMIT ?2",
            "harness_session_state_pending_age",
        ),
        (
            "SELECT rowid FROM harness_stream_entries WHERE binding_id = ?1 AND epoch < ?2 LIMIT ?3",
            "epoch<?",
        ),
        (
            "SELECT id FROM harness_sessions WHERE updated_at_ms < ?1 ORDER BY updated_at_ms LIMIT ?2",
            "harness_sessions_activity",
        ),
    ];
    for (sql, expected) in statements {
        let plan: Vec<String> = ok(store
            .readers
            .read(move |tx| {
                let mut stmt = tx
                    .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .ctx("explain")?;
                // Unbound parameters are NULL, which is fine for a plan.
                let mut rows = stmt.raw_query();
                let mut plan = Vec::new();
                while let Some(row) = rows.next().ctx("explain")? {
                    plan.push(row.get::<_, String>(3).ctx("explain")?);
                }
                Ok(plan)
            })
            .await);
        assert!(
            plan.first()
                .is_some_and(|step| step.starts_with("SEARCH") && step.contains(expected)),
            "{sql}\n=> {plan:?}"
        );
        assert!(
            !plan.iter().any(|step| step.starts_with("SCAN ")),
            "{sql}\n=> {plan:?}"
        );
    }
}
