//! A scratch MongoDB database per test on the control plane's FerretDB: where to find
//! it, a unique name, and a guard that drops it when the test ends. Shared by the
//! store and memory conformance files for MongoDB.
#![allow(dead_code)]

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use mongodb::Client;

pub fn mongo_uri() -> String {
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
        "these tests need a MongoDB endpoint: run them through `make test` (which starts the local control plane \
         with FerretDB), or `make e2e-up` and then `HARNESS_E2E_ENV=target/e2e/env cargo test --test store_mongo` (or memory_mongo)"
    )
}

/// A database name unique per test and process (MongoDB allows 63 characters).
pub fn database_name(prefix: &str, case: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = format!(
        "{prefix}_{}_{nanos:x}_{}_{case}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    name.truncate(63);
    name
}

/// Drops the test database when the test ends, also when it panics (a panicking test
/// never reaches its async cleanup, and `Drop` cannot await, so it drops on a thread
/// with its own runtime).
pub struct Scratch {
    pub uri: String,
    pub database: String,
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

/// A new scratch database named from `prefix` and `case`.
pub fn scratch(prefix: &str, case: &str) -> Scratch {
    Scratch {
        uri: mongo_uri(),
        database: database_name(prefix, case),
    }
}
