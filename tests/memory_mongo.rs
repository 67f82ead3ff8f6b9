//! The memory conformance suite against the MongoDB backend, on the FerretDB of the
//! local control plane (`make test` starts it and sets `HARNESS_E2E_MONGODB_URI`), one
//! fresh database per case. FerretDB v1 is slow per query (it scans a collection for
//! anything but a point read by `_id`, and a loaded machine makes even those tens of
//! milliseconds), so the isolation case loads all 3,000 records of 1,000 subjects but
//! reads every 10th subject's records by key and searches every 200th subject's
//! namespaces; SQLite reads and searches them all.

mod memory_conformance;

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use harness_engine::{domain::limits::Limits, store::mongo::MongoStore};
use mongodb::Client;

fn mongo_uri() -> String {
    if let Ok(uri) = std::env::var("HARNESS_E2E_MONGODB_URI")
        && !uri.is_empty()
    {
        return uri;
    }
    if let Ok(env_file) = std::env::var("HARNESS_E2E_ENV") {
        let text = std::fs::read_to_string(&env_file)
            .unwrap_or_else(|e| panic!("reading {env_file}: {e}"));
        let uri = text
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
            .find(|(k, _)| k.trim() == "HARNESS_E2E_MONGODB_URI")
            .map(|(_, v)| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned());
        return uri.unwrap_or_else(|| panic!("{env_file} has no HARNESS_E2E_MONGODB_URI"));
    }
    panic!(
        "these tests need a MongoDB endpoint: run them through `make test`, or \
         `e2e/scripts/with-control-plane.sh cargo test --test memory_mongo`"
    )
}

fn database_name(case: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = format!(
        "mm_{}_{nanos:x}_{}_{case}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    name.truncate(63);
    name
}

/// Drops the test database when the test ends, also when it panics.
struct Scratch {
    uri: String,
    database: String,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let (uri, database) = (self.uri.clone(), self.database.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let client = Client::with_uri_str(&uri)
                    .await
                    .map_err(|e| e.to_string())?;
                client
                    .database(&database)
                    .drop()
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) && !std::thread::panicking() {
            panic!("dropping test database {}: {dropped:?}", self.database);
        }
    }
}

async fn open(case: &str) -> (MongoStore, Scratch) {
    let scratch = Scratch {
        uri: mongo_uri(),
        database: database_name(case),
    };
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
