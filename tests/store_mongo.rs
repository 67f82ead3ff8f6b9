//! The store conformance suite against the MongoDB backend, one fresh database per case,
//! on the FerretDB of the local control plane (`make test` starts it and sets
//! `HARNESS_E2E_MONGODB_URI`); plus what only this backend has: states that a crash
//! leaves between its single-document steps (a sweep that unregistered a state but did
//! not delete it, a writer that registered a state but did not store it, a half-done
//! retention delete, a drifted counter), recreated here by editing documents directly.

mod mongo_scratch;
mod store_conformance;

use harness_engine::store::{
    BindingStore, NativeStore, PutMode, RetentionPolicy, RetentionStore, ThreadStateStore,
    mongo::MongoStore,
};
use mongo_scratch::{Scratch, scratch};
use mongodb::{
    Client,
    bson::{DateTime, Document, doc},
};

/// The MongoDB URI: `HARNESS_E2E_MONGODB_URI`, or the one in the env file that
/// `e2e/scripts/up.sh` writes (named by `HARNESS_E2E_ENV`).
async fn open(case: &str) -> (MongoStore, Scratch) {
    let scratch = scratch("hm", case);
    let store = MongoStore::connect(&scratch.uri, &scratch.database, store_conformance::limits())
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", scratch.uri));
    (store, scratch)
}

async fn close(store: MongoStore, scratch: Scratch) {
    drop(store);
    drop(scratch);
}

crate::conformance_tests!(open, close);

/// Direct access to the test database, to put documents in the states a crash leaves.
async fn raw(scratch: &Scratch) -> mongodb::Database {
    Client::with_uri_str(&scratch.uri)
        .await
        .expect("client")
        .database(&scratch.database)
}

/// The retention sweep unregisters a pending state before deleting it, and a commit
/// requires the registration: a state caught between the two (a sweep in flight, or one
/// that died halfway) can never become the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_being_swept_never_becomes_the_head() {
    let (store, scratch) = open("swept").await;
    let (record, scope) = store_conformance::new_binding(&store, "swept").await;
    let pending = store
        .write_native_state(&scope, b"doomed", &store_conformance::key(&scope, "doomed"))
        .await
        .expect("write");
    let unregistered = raw(&scratch)
        .await
        .collection::<Document>("harness_sessions")
        .update_one(
            doc! { "_id": record.binding_id.as_str() },
            doc! { "$unset": { format!("pending.{}", pending.state_id): "" }, "$inc": { "counts.pending": -1_i64 } },
        )
        .await
        .expect("unregister like a sweep");
    assert_eq!(unregistered.modified_count, 1);
    let refused = store
        .commit_head(
            &scope,
            &store_conformance::commit(&pending.state_id, 0, "run-1"),
        )
        .await;
    assert_eq!(store_conformance::code(refused), "not_found");
    assert!(
        store.load_head(&scope).await.expect("load").is_none(),
        "the head did not move"
    );
    close(store, scratch).await;
}

/// A committed state is never swept, however old, and leaves the sweep's index once a
/// sweep has seen it; an uncommitted one past the TTL goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_keep_committed_states_and_settle_them() {
    let (store, scratch) = open("settle").await;
    let (_, scope) = store_conformance::new_binding(&store, "settle").await;
    store_conformance::turn(&store, &scope, b"first", 0, "run-1").await;
    store_conformance::turn(&store, &scope, b"second", 1, "run-2").await;
    let orphan = store
        .write_native_state(&scope, b"orphan", &store_conformance::key(&scope, "orphan"))
        .await
        .expect("write");
    let policy = RetentionPolicy {
        id: "short".into(),
        pending_ttl_ms: 1,
        conversation_ttl_ms: None,
    };
    let report = store
        .sweep(&policy, harness_engine::store::now_ms() + 1_000)
        .await
        .expect("sweep");
    assert_eq!(report.pending_states_deleted, 1, "{report:?}");
    assert_eq!(
        store
            .read_state(&scope, &orphan.state_id)
            .await
            .expect("read"),
        None
    );
    let states = raw(&scratch)
        .await
        .collection::<Document>("harness_session_state");
    let kept = states
        .count_documents(doc! { "kind": "state" })
        .await
        .expect("count");
    assert_eq!(kept, 2, "the head and the superseded committed state stay");
    let unsettled = states
        .count_documents(doc! { "pending_since": { "$exists": true } })
        .await
        .expect("count");
    assert_eq!(unsettled, 0, "committed states left the sweep's index");
    let head = store.load_head(&scope).await.expect("load").expect("head");
    assert_eq!(
        store
            .read_state(&scope, &head.state_id)
            .await
            .expect("read"),
        Some(b"second".to_vec())
    );
    close(store, scratch).await;
}

/// A writer that died between registering a pending state and storing it leaves a
/// registration without a state; at the pending bound such registrations are dropped
/// (once older than a grace period) instead of refusing writes forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_without_a_state_heal_at_the_bound() {
    let (store, scratch) = open("registrations").await;
    let (record, scope) = store_conformance::new_binding(&store, "registrations").await;
    let max = store_conformance::limits().max_pending_entries;
    let long_ago = DateTime::from_millis(harness_engine::store::now_ms() - 3_600_000);
    let mut pending = Document::new();
    for i in 0..max {
        pending.insert(format!("ps_lost{i:027}"), long_ago);
    }
    raw(&scratch)
        .await
        .collection::<Document>("harness_sessions")
        .update_one(
            doc! { "_id": record.binding_id.as_str() },
            doc! { "$set": { "pending": pending, "counts.pending": i64::try_from(max).expect("limit") } },
        )
        .await
        .expect("fill the registry");
    store
        .write_native_state(&scope, b"fresh", &store_conformance::key(&scope, "fresh"))
        .await
        .expect("lost registrations are dropped at the bound");
    close(store, scratch).await;
}

/// A sweep that died after marking a binding retiring: the binding is gone for every
/// caller, and creating the conversation again finishes the deletion and starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_retention_delete_is_finished_by_the_next_creation() {
    let (store, scratch) = open("retiring").await;
    let (record, scope) = store_conformance::new_binding(&store, "retiring").await;
    store_conformance::turn(&store, &scope, b"old-life", 0, "run-1").await;
    store
        .put_object(&scope, "k", b"v", PutMode::Create)
        .await
        .expect("object");

    let db = raw(&scratch).await;
    db.collection::<Document>("harness_sessions")
        .update_one(
            doc! { "_id": record.binding_id.as_str() },
            doc! { "$set": { "retiring": true } },
        )
        .await
        .expect("mark retiring");
    assert!(
        store
            .get_binding(&record.binding_id)
            .await
            .expect("get")
            .is_none(),
        "a retiring binding is gone"
    );
    assert_eq!(
        store_conformance::code(store.load_head(&scope).await),
        "not_found"
    );
    assert_eq!(
        store_conformance::code(store.put_object(&scope, "k2", b"v", PutMode::Create).await),
        "not_found"
    );

    let (again, created) = store.ensure_binding(&record).await.expect("ensure");
    assert!(created, "the conversation starts afresh");
    assert_eq!(again, record);
    assert!(
        store.load_head(&scope).await.expect("load").is_none(),
        "no head survives from the old life"
    );
    assert!(
        store.get_object(&scope, "k").await.expect("get").is_none(),
        "no object survives from the old life"
    );
    let left = db
        .collection::<Document>("harness_session_state")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(left, 0, "every state document of the old life is gone");
    close(store, scratch).await;
}

/// Counters that a crash left too high (a reservation never released) are recounted at
/// the limit instead of refusing writes forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_counters_heal_at_the_limit() {
    let (store, scratch) = open("drift").await;
    let (record, scope) = store_conformance::new_binding(&store, "drift").await;
    let limits = store_conformance::limits();
    let max_objects = i64::try_from(limits.max_objects).expect("limit");
    let max_pending = i64::try_from(limits.max_pending_entries).expect("limit");
    raw(&scratch)
        .await
        .collection::<Document>("harness_sessions")
        .update_one(
            doc! { "_id": record.binding_id.as_str() },
            doc! { "$set": { "counts.objects": max_objects, "counts.pending": max_pending } },
        )
        .await
        .expect("inflate the counters");
    store
        .put_object(&scope, "k", b"v", PutMode::Create)
        .await
        .expect("a drifted object counter is recounted");
    store
        .write_native_state(&scope, b"s", &store_conformance::key(&scope, "s"))
        .await
        .expect("a drifted pending counter is repaired from the registry");
    close(store, scratch).await;
}

/// Connecting again (another replica of the engine) finds its indexes in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_twice_keeps_the_named_indexes() {
    let (store, scratch) = open("indexes").await;
    let again = MongoStore::connect(&scratch.uri, &scratch.database, store_conformance::limits())
        .await
        .expect("second connect");
    let db = raw(&scratch).await;
    let mut names = db
        .collection::<Document>("harness_session_state")
        .list_index_names()
        .await
        .expect("list");
    names.sort();
    assert_eq!(
        names,
        [
            "_id_",
            "binding_epoch_kind_name_key",
            "binding_epoch_kind_name_seq",
            "pending_since"
        ]
    );
    let sessions = db
        .collection::<Document>("harness_sessions")
        .list_index_names()
        .await
        .expect("list");
    assert!(
        sessions
            .iter()
            .any(|n| n == "environment_owner_agent_conversation_epoch_unique"),
        "{sessions:?}"
    );
    drop(again);
    close(store, scratch).await;
}
