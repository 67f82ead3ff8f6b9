//! The store conformance suite against the embedded SQLite backend, one fresh database
//! per case, plus what only a file-backed store can show: every acknowledged commit of a
//! concurrent load is in the file after it is closed and reopened.

mod store_conformance;

use futures::future::join_all;
use harness_engine::store::{BindingStore, ThreadStateStore, sqlite::SqliteStore};
use tempfile::TempDir;

async fn open(case: &str) -> (SqliteStore, TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("harness-sqlite-{case}-"))
        .tempdir()
        .expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("state.db"), store_conformance::limits())
        .await
        .expect("open the sqlite store");
    (store, dir)
}

async fn close(store: SqliteStore, dir: TempDir) {
    // Joins the writer thread and closes every connection before the files go.
    drop(store);
    drop(dir);
}

crate::conformance_tests!(open, close);

/// 32 bindings commit 10 turns each at once, so the writer groups commits of different
/// bindings into shared transactions; after a close and reopen every binding's head is
/// its own last turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_commits_are_all_durable_after_reopening() {
    let (store, dir) = open("grouped").await;
    let path = dir.path().join("state.db");
    let scopes = join_all((0..32).map(|i| {
        let store = &store;
        async move {
            store_conformance::new_binding(store, &format!("grouped-{i}"))
                .await
                .1
        }
    }))
    .await;
    join_all(scopes.iter().map(|scope| {
        let store = &store;
        async move {
            for turn in 0..10u64 {
                let body = format!("{}-turn-{turn}", scope.binding_id);
                let revision = store_conformance::turn(
                    store,
                    scope,
                    body.as_bytes(),
                    turn,
                    &format!("run-{turn}"),
                )
                .await;
                assert_eq!(revision, turn + 1);
            }
        }
    }))
    .await;
    drop(store);

    let store = SqliteStore::open(&path, store_conformance::limits())
        .await
        .expect("reopen");
    for scope in &scopes {
        let head = store.load_head(scope).await.expect("load").expect("head");
        assert_eq!((head.revision, head.run_id.as_str()), (10, "run-9"));
        let body = store.read_state(scope, &head.state_id).await.expect("read");
        assert_eq!(
            body,
            Some(format!("{}-turn-9", scope.binding_id).into_bytes())
        );
        assert!(
            store
                .get_binding(&scope.binding_id)
                .await
                .expect("get")
                .is_some()
        );
    }
    close(store, dir).await;
}
