//! The memory conformance suite against the MongoDB backend, on the FerretDB of the
//! local control plane (`make test` starts it and sets `HARNESS_E2E_MONGODB_URI`), one
//! fresh database per case. FerretDB v1 is slow per query (it scans a collection for
//! anything but a point read by `_id`, and a loaded machine makes even those tens of
//! milliseconds), so the isolation case loads all 3,000 records of 1,000 subjects but
//! reads every 10th subject's records by key and searches every 200th subject's
//! namespaces; SQLite reads and searches them all.

mod memory_conformance;
mod mongo_scratch;

use harness_engine::{domain::limits::Limits, store::mongo::MongoStore};
use mongo_scratch::{Scratch, scratch};

async fn open(case: &str) -> (MongoStore, Scratch) {
    let scratch = scratch("mm", case);
    let store = MongoStore::connect(&scratch.uri, &scratch.database, Limits::default())
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", scratch.uri));
    (store, scratch)
}

async fn close(store: MongoStore, scratch: Scratch) {
    drop(store);
    drop(scratch);
}

crate::memory_conformance_tests!(open, close; subjects = 1000, read_every = 10, search_every = 200);
