//! Crash tests for both backends: a child process committing turns is SIGKILLed right
//! after a pending write, and at arbitrary moments (which land inside commits); after each
//! kill the store must hold every acknowledged commit, an exact head, and the intact
//! acknowledged pending entry. See `store_conformance/crash.rs`.

mod common;
mod store_conformance;

use std::{path::PathBuf, process::Command};

use harness_engine::store::{mongo::MongoStore, sqlite::SqliteStore};
use store_conformance::{
    crash::{self, CHILD_ENV, Observed},
    ledger_crash::{self, Acked},
};

const LOCATION_ENV: &str = "HARNESS_CRASH_LOCATION";

fn child_command(test: &str, mode: &str, location: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env(LOCATION_ENV, location);
    cmd
}

/// Kill points: once paused right after a pending write, then after a number of
/// acknowledged commits (the child is mid-write or mid-commit when the signal lands),
/// then right after a pending write was acknowledged (the commit is in flight).
type KillPoint = Box<dyn Fn(&Observed, u64) -> bool>;

fn scenarios() -> Vec<(&'static str, KillPoint)> {
    vec![
        (
            "pause-after-pending",
            Box::new(|o: &Observed, base: u64| {
                o.last_pending.as_ref().is_some_and(|(n, _)| *n == base + 3)
            }),
        ),
        (
            "run",
            Box::new(|o: &Observed, base: u64| o.last_ack >= base + 7),
        ),
        (
            "run",
            Box::new(|o: &Observed, base: u64| {
                o.last_pending
                    .as_ref()
                    .is_some_and(|(n, _)| *n >= base + 19)
            }),
        ),
        (
            "run",
            Box::new(|o: &Observed, base: u64| o.last_ack >= base + 41),
        ),
        (
            "run",
            Box::new(|o: &Observed, base: u64| {
                o.last_pending
                    .as_ref()
                    .is_some_and(|(n, _)| *n >= base + 60)
            }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill_between_write_and_commit_and_during_commit() {
    const NAME: &str = "sqlite_survives_sigkill_between_write_and_commit_and_during_commit";
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        let path = PathBuf::from(std::env::var(LOCATION_ENV).expect("location"));
        let store = SqliteStore::open(&path, store_conformance::limits())
            .await
            .expect("open");
        crash::child(&store, &mode).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("state.db");
    let mut revision = 0;
    for (mode, stop) in scenarios() {
        let base = revision;
        let observed: Observed =
            crash::run_child_until(child_command(NAME, mode, &db.to_string_lossy()), |o| {
                stop(o, base)
            });
        assert!(
            observed.last_pending.is_some(),
            "the child made progress before the kill ({mode})"
        );
        let store = SqliteStore::open(&db, store_conformance::limits())
            .await
            .expect("reopen after crash");
        revision = crash::verify(&store, &observed, mode == "pause-after-pending").await;
    }
    assert!(
        revision >= 60,
        "five crashes, every acknowledged commit kept, and work continued: revision {revision}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_survives_sigkill_between_write_and_commit_and_during_commit() {
    const NAME: &str = "mongo_survives_sigkill_between_write_and_commit_and_during_commit";
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        let db = std::env::var(LOCATION_ENV).expect("location");
        let store = MongoStore::connect(&mongo_uri(), &db, store_conformance::limits())
            .await
            .expect("connect");
        crash::child(&store, &mode).await;
    }
    let db = format!("crash_{}", std::process::id());
    let mut revision = 0;
    for (mode, stop) in scenarios() {
        let base = revision;
        let observed: Observed =
            crash::run_child_until(child_command(NAME, mode, &db), |o| stop(o, base));
        assert!(
            observed.last_pending.is_some(),
            "the child made progress before the kill ({mode})"
        );
        let store = MongoStore::connect(&mongo_uri(), &db, store_conformance::limits())
            .await
            .expect("reconnect after crash");
        revision = crash::verify(&store, &observed, mode == "pause-after-pending").await;
    }
    assert!(
        revision >= 60,
        "five crashes, every acknowledged commit kept, and work continued: revision {revision}"
    );
    let client = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .expect("client");
    client
        .database(&db)
        .drop()
        .await
        .expect("drop test database");
}

/// Ledger kill points: paused right after an attempt was acknowledged (its outcome
/// never recorded), then after a number of acknowledged appends (the child is inside an
/// append when the signal lands; the counts are odd so that they fall on every step of
/// the attempt / outcome / guardrail cycle).
type LedgerKillPoint = Box<dyn Fn(&Acked, usize) -> bool>;

fn ledger_scenarios() -> Vec<(&'static str, LedgerKillPoint)> {
    let after = |n: usize| -> LedgerKillPoint {
        Box::new(move |a: &Acked, base| a.events.len() >= base + n)
    };
    // A paused child stops on its own (`Acked::paused`), after its attempt.
    let never = || -> LedgerKillPoint { Box::new(|_: &Acked, _| false) };
    vec![
        ("pause-after-attempt", never()),
        ("run", after(7)),
        ("run", after(20)),
        ("pause-after-attempt", never()),
        ("run", after(41)),
        ("run", after(65)),
    ]
}

/// Runs the ledger scenarios against a store `open` reopens after each kill.
async fn ledger_crashes<S, F, Fut>(name: &str, location: &str, open: F)
where
    S: harness_engine::store::Store,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = S>,
{
    let mut held = 0u64;
    for (mode, stop) in ledger_scenarios() {
        let base = usize::try_from(held).expect("count");
        let paused = mode == "pause-after-attempt";
        let acked: Acked =
            crash::run_child_until(child_command(name, mode, location), |a: &Acked| {
                a.paused || stop(a, base)
            });
        assert!(
            !acked.events.is_empty(),
            "the child made progress before the kill ({mode})"
        );
        let store = open().await;
        held = ledger_crash::verify(&store, &acked, paused).await;
    }
    assert!(
        held >= 100,
        "six crashes, no acknowledged event lost, and work went on: {held} events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ledger_survives_sigkill_between_attempt_and_outcome_and_inside_appends() {
    const NAME: &str =
        "sqlite_ledger_survives_sigkill_between_attempt_and_outcome_and_inside_appends";
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        let path = PathBuf::from(std::env::var(LOCATION_ENV).expect("location"));
        let store = SqliteStore::open(&path, store_conformance::limits())
            .await
            .expect("open");
        ledger_crash::child(&store, &mode).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("state.db");
    ledger_crashes(NAME, &db.to_string_lossy(), || async {
        SqliteStore::open(&db, store_conformance::limits())
            .await
            .expect("reopen after crash")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_ledger_survives_sigkill_between_attempt_and_outcome_and_inside_appends() {
    const NAME: &str =
        "mongo_ledger_survives_sigkill_between_attempt_and_outcome_and_inside_appends";
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        let db = std::env::var(LOCATION_ENV).expect("location");
        let store = MongoStore::connect(&mongo_uri(), &db, store_conformance::limits())
            .await
            .expect("connect");
        ledger_crash::child(&store, &mode).await;
    }
    let db = format!("ledger_crash_{}", std::process::id());
    ledger_crashes(NAME, &db, || async {
        MongoStore::connect(&mongo_uri(), &db, store_conformance::limits())
            .await
            .expect("reconnect after crash")
    })
    .await;
    let client = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .expect("client");
    client
        .database(&db)
        .drop()
        .await
        .expect("drop test database");
}

/// The FerretDB of the local control plane (`make test` starts it).
fn mongo_uri() -> String {
    common::control_plane().mongodb_uri.clone()
}
