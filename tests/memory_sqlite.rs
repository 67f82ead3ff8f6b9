//! The memory conformance suite against the embedded SQLite backend, one fresh database
//! per case.

mod memory_conformance;

use harness_engine::{domain::limits::Limits, store::sqlite::SqliteStore};
use tempfile::TempDir;

async fn open(case: &str) -> (SqliteStore, TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("harness-memory-{case}-"))
        .tempdir()
        .expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("state.db"), Limits::default())
        .await
        .expect("open the sqlite store");
    (store, dir)
}

async fn close(store: SqliteStore, dir: TempDir) {
    drop(store);
    drop(dir);
}

crate::memory_conformance_tests!(open, close; subjects = 1000, read_every = 1, search_every = 1);
