//! The single writer: one thread owns the read-write connection and applies write
//! commands with group commit.
//!
//! The thread blocks for one command, drains whatever else is already queued (up to
//! [`MAX_GROUP`]), and runs them all inside ONE `BEGIN IMMEDIATE` transaction, each in its
//! own savepoint. A command that fails is rolled back to its savepoint alone; the others
//! keep their effects. One `COMMIT` (one WAL fsync with `synchronous=FULL`) then makes the
//! whole group durable, and only after it succeeds does any caller hear its result: a
//! command is never acknowledged before its effects are on stable storage, and a
//! rejection is never reported on the strength of an uncommitted neighbour that was then
//! lost. If the transaction is lost, every command that ran in it gets a backend error
//! (`unavailable`): when SQLite aborted it mid-group (I/O error, full disk) nothing was
//! applied; when COMMIT itself failed the outcome is unknown (a failed fsync may still
//! leave the commit on disk), which the message says, so a caller can treat it as the
//! ambiguous case it is (`mark_uncertain`) rather than as a clean refusal.

use std::{
    collections::VecDeque,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc,
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    thread::JoinHandle,
};

use futures::channel::oneshot;
use rusqlite::Connection;

use super::SqliteError;
use crate::store::{Result, StoreError};

/// Most commands in one transaction. Bounds the latency a command can add to its group
/// and the work lost to one failed COMMIT.
pub(super) const MAX_GROUP: usize = 256;

/// Commands that may wait for the writer. A full queue makes callers wait (off the async
/// runtime) instead of growing memory without bound.
const QUEUE_CAPACITY: usize = 1024;

/// State kept beside the database that must follow its transactions: told where each
/// command starts, which commands were rolled back, and whether the group committed. All
/// calls come from the writer thread.
pub(super) trait GroupHook: Send + Sync {
    /// Before a command runs: a mark to roll back to.
    fn mark(&self) -> usize;
    /// The command since `mark` was rolled back to its savepoint.
    fn rollback_to(&self, mark: usize);
    /// The group is durable (called before any caller hears its result).
    fn committed(&self);
    /// The group's transaction was lost or rolled back.
    fn lost(&self);
}

/// A type-erased write command: runs inside its savepoint, then learns whether its group
/// committed.
trait Job: Send {
    /// Runs the command. `false`: it failed and must be rolled back to its savepoint.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Delivers the outcome: the command's own result if its group committed, else the
    /// group's failure.
    fn complete(self: Box<Self>, group_failure: Option<&str>);
}

struct TypedJob<T, F> {
    work: Option<F>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            self.result = Some(Err(
                SqliteError::Internal("a write command ran twice").into()
            ));
            return false;
        };
        // A panicking command must not take the writer (and every later caller) down
        // with it; it is treated as a failed command and rolled back alone.
        let result = catch_unwind(AssertUnwindSafe(|| work(conn)))
            .unwrap_or_else(|_| Err(SqliteError::Internal("a write command panicked").into()));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn complete(self: Box<Self>, group_failure: Option<&str>) {
        let result = match (group_failure, self.result) {
            (None, Some(result)) => result,
            (None, None) => Err(SqliteError::Internal("a write command was never run").into()),
            (Some(failure), _) => Err(SqliteError::GroupFailed(failure.to_owned()).into()),
        };
        // The caller may have stopped waiting (its future was dropped); the write itself
        // stands, which is the documented "outcome unknown" case for a cancelled call.
        let _ = self.reply.send(result);
    }
}

/// Handle to the writer thread. Dropping it closes the queue; the thread finishes the
/// commands already queued, closes the connection (checkpointing the WAL) and exits, and
/// the drop waits for that.
pub(super) struct Writer {
    sender: Option<SyncSender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn start(conn: Connection, hook: Option<Arc<dyn GroupHook>>) -> Result<Self> {
        let (sender, receiver) = mpsc::sync_channel::<Box<dyn Job>>(QUEUE_CAPACITY);
        let thread = std::thread::Builder::new()
            .name("harness-sqlite-writer".into())
            .spawn(move || writer_loop(&conn, &receiver, hook.as_deref()))
            .map_err(SqliteError::Thread)?;
        Ok(Writer {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Runs `work` in the writer's transaction and returns its result once the group it
    /// ran in is durable.
    pub(super) async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let sender = self.sender.as_ref().ok_or(SqliteError::WriterGone)?;
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(TypedJob {
            work: Some(work),
            result: None,
            reply,
        });
        match sender.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) => {
                // Back-pressure: wait for room on a blocking thread, never on the runtime.
                let sender = sender.clone();
                tokio::task::spawn_blocking(move || {
                    sender.send(job).map_err(|_| SqliteError::WriterGone)
                })
                .await
                .map_err(|e| SqliteError::Task(format!("queueing a write: {e}")))??;
            }
            Err(TrySendError::Disconnected(_)) => return Err(SqliteError::WriterGone.into()),
        }
        answer
            .await
            .map_err(|_| StoreError::from(SqliteError::WriterGone))?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            // The loop only ends once the queue is closed and drained; a panic in it has
            // already been reported to the callers as a dropped reply.
            let _ = thread.join();
        }
    }
}

fn writer_loop(conn: &Connection, receiver: &Receiver<Box<dyn Job>>, hook: Option<&dyn GroupHook>) {
    let mut queue: VecDeque<Box<dyn Job>> = VecDeque::with_capacity(MAX_GROUP);
    let mut ran: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_GROUP);
    loop {
        if queue.is_empty() {
            match receiver.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return, // every sender is gone: the store was dropped
            }
        }
        while queue.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => break,
            }
        }
        run_group(conn, &mut queue, &mut ran, hook);
    }
}

/// Runs the queued commands in one transaction. Every call completes at least one
/// command, so a persistently failing database cannot spin the loop; commands not reached
/// because the transaction was lost stay queued for the next group.
fn run_group(
    conn: &Connection,
    queue: &mut VecDeque<Box<dyn Job>>,
    ran: &mut Vec<Box<dyn Job>>,
    hook: Option<&dyn GroupHook>,
) {
    ran.clear();
    if let Err(e) = begin(conn) {
        let failure = format!("not applied: BEGIN failed: {e}");
        for job in queue.drain(..) {
            job.complete(Some(&failure));
        }
        return;
    }
    let mut failure: Option<String> = None;
    while let Some(mut job) = queue.pop_front() {
        if let Err(e) = exec(conn, "SAVEPOINT harness_cmd") {
            failure = Some(format!("rolled back: opening a savepoint failed: {e}"));
            ran.push(job);
            break;
        }
        let mark = hook.map(GroupHook::mark);
        let ok = job.run(conn);
        ran.push(job);
        if !ok && let (Some(hook), Some(mark)) = (hook, mark) {
            hook.rollback_to(mark);
        }
        let closed = if ok {
            exec(conn, "RELEASE harness_cmd")
        } else if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (I/O error, disk full, ...): the
            // commands before this one lost their effects too.
            failure = Some("rolled back: SQLite aborted the transaction".to_owned());
            break;
        } else {
            exec(conn, "ROLLBACK TO harness_cmd").and_then(|()| exec(conn, "RELEASE harness_cmd"))
        };
        if let Err(e) = closed {
            failure = Some(format!("rolled back: closing a savepoint failed: {e}"));
            break;
        }
    }
    if failure.is_none()
        && let Err(e) = exec(conn, "COMMIT")
    {
        failure = Some(format!("outcome unknown: COMMIT failed: {e}"));
    }
    if failure.is_some() {
        rollback_if_open(conn);
    }
    if let Some(hook) = hook {
        if failure.is_none() {
            hook.committed();
        } else {
            hook.lost();
        }
    }
    for job in ran.drain(..) {
        job.complete(failure.as_deref());
    }
}

fn begin(conn: &Connection) -> rusqlite::Result<()> {
    // A transaction left open by an earlier failure would make BEGIN fail forever.
    rollback_if_open(conn);
    exec(conn, "BEGIN IMMEDIATE")
}

fn rollback_if_open(conn: &Connection) {
    if !conn.is_autocommit() {
        // If even ROLLBACK fails the connection is unusable; the next BEGIN reports it.
        let _ = exec(conn, "ROLLBACK");
    }
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;
    use crate::domain::state::Rejection;

    fn memory_writer() -> Writer {
        let conn = Connection::open_in_memory().unwrap_or_else(|e| panic!("{e}"));
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            .unwrap_or_else(|e| panic!("{e}"));
        Writer::start(conn, None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn insert(k: &'static str, v: i64) -> impl FnOnce(&Connection) -> Result<()> + Send + 'static {
        move |conn| {
            conn.execute(
                "INSERT INTO t (k, v) VALUES (?1, ?2)",
                rusqlite::params![k, v],
            )
            .map_err(|e| StoreError::backend("sqlite", e))?;
            Ok(())
        }
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap_or(-1)
    }

    /// Parks the writer inside one command for a moment, so every command sent
    /// meanwhile queues up and runs in the next group, together.
    async fn park(writer: &Arc<Writer>) -> tokio::task::JoinHandle<Result<()>> {
        let barrier = Arc::new(Barrier::new(2));
        let inside = barrier.clone();
        let held = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .run(move |_: &Connection| {
                        inside.wait();
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        Ok(())
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || barrier.wait())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        held
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_command_is_rolled_back_alone() {
        let writer = Arc::new(memory_writer());
        let held = park(&writer).await;
        let a = writer.run(insert("a", 1));
        // Inserts one row, then fails: its row must not survive.
        let bad = writer.run(|conn: &Connection| -> Result<()> {
            conn.execute("INSERT INTO t (k, v) VALUES ('half', 0)", [])
                .map_err(|e| StoreError::backend("sqlite", e))?;
            Err(Rejection::Conflict {
                what: "refused".into(),
            }
            .into())
        });
        let dup = writer.run(insert("a", 2)); // primary-key violation
        let b = writer.run(insert("b", 3));
        let boom = writer.run(|_: &Connection| -> Result<()> { panic!("command bug") });
        let c = writer.run(insert("c", 4));
        let (a, bad, dup, b, boom, c) = futures::join!(a, bad, dup, b, boom, c);
        assert!(held.await.is_ok_and(|r| r.is_ok()));
        assert!(a.is_ok() && b.is_ok() && c.is_ok(), "{a:?} {b:?} {c:?}");
        assert_eq!(
            bad.err().map(|e| e.code()),
            Some("conflict"),
            "a rejection reaches its own caller"
        );
        assert_eq!(dup.err().map(|e| e.code()), Some("unavailable"));
        assert_eq!(boom.err().map(|e| e.code()), Some("unavailable"));
        let rows = writer
            .run(|conn: &Connection| Ok(count(conn)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            rows, 3,
            "a, b and c committed; the failed commands left nothing"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_transaction_fails_the_whole_group() {
        let writer = Arc::new(memory_writer());
        let held = park(&writer).await;
        let a = writer.run(insert("a", 1));
        // Ends the group's transaction behind the writer's back, as SQLite does after an
        // I/O error: the earlier insert is gone, so its caller must not hear "ok".
        let abort = writer.run(|conn: &Connection| -> Result<()> {
            conn.execute_batch("ROLLBACK")
                .map_err(|e| StoreError::backend("sqlite", e))?;
            Err(StoreError::backend("sqlite", "simulated abort"))
        });
        let b = writer.run(insert("b", 2));
        let (a, abort, b) = futures::join!(a, abort, b);
        assert!(held.await.is_ok_and(|r| r.is_ok()));
        assert_eq!(
            a.err().map(|e| e.code()),
            Some("unavailable"),
            "its group was rolled back"
        );
        assert_eq!(abort.err().map(|e| e.code()), Some("unavailable"));
        assert!(
            b.is_ok(),
            "a command not reached runs in the next group: {b:?}"
        );
        let rows = writer
            .run(|conn: &Connection| Ok(count(conn)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rows, 1, "only b");
    }

    /// Records what the writer tells its hook: a command's own staged items, dropped
    /// when it is rolled back alone, the group's, dropped when the group is lost.
    #[derive(Default)]
    struct Recorder {
        staged: std::sync::Mutex<Vec<&'static str>>,
        published: std::sync::Mutex<Vec<&'static str>>,
    }

    impl GroupHook for Recorder {
        fn mark(&self) -> usize {
            self.staged.lock().map_or(0, |s| s.len())
        }
        fn rollback_to(&self, mark: usize) {
            if let Ok(mut s) = self.staged.lock() {
                s.truncate(mark);
            }
        }
        fn committed(&self) {
            let staged = self.staged.lock().map(|mut s| std::mem::take(&mut *s));
            if let (Ok(staged), Ok(mut published)) = (staged, self.published.lock()) {
                published.extend(staged);
            }
        }
        fn lost(&self) {
            if let Ok(mut s) = self.staged.lock() {
                s.clear();
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hook_publishes_only_what_committed() {
        let conn = Connection::open_in_memory().unwrap_or_else(|e| panic!("{e}"));
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            .unwrap_or_else(|e| panic!("{e}"));
        let recorder = Arc::new(Recorder::default());
        let writer =
            Arc::new(Writer::start(conn, Some(recorder.clone())).unwrap_or_else(|e| panic!("{e}")));
        let stage = |item: &'static str, recorder: &Arc<Recorder>| {
            if let Ok(mut s) = recorder.staged.lock() {
                s.push(item);
            }
        };
        // One group: a command that commits, one rolled back alone, one that commits.
        let held = park(&writer).await;
        let (r1, r2, r3) = (recorder.clone(), recorder.clone(), recorder.clone());
        let a = writer.run(move |conn: &Connection| {
            stage("a", &r1);
            insert("a", 1)(conn)
        });
        let bad = writer.run(move |_: &Connection| -> Result<()> {
            stage("bad", &r2);
            Err(Rejection::Conflict {
                what: "refused".into(),
            }
            .into())
        });
        let b = writer.run(move |conn: &Connection| {
            stage("b", &r3);
            insert("b", 2)(conn)
        });
        let (a, bad, b) = futures::join!(a, bad, b);
        assert!(held.await.is_ok_and(|r| r.is_ok()));
        assert!(a.is_ok() && bad.is_err() && b.is_ok());
        assert_eq!(
            recorder
                .published
                .lock()
                .map(|p| p.clone())
                .unwrap_or_default(),
            ["a", "b"]
        );
        // A lost group publishes nothing of its own.
        let held = park(&writer).await;
        let r4 = recorder.clone();
        let c = writer.run(move |conn: &Connection| {
            stage("c", &r4);
            insert("c", 3)(conn)
        });
        let abort = writer.run(|conn: &Connection| -> Result<()> {
            conn.execute_batch("ROLLBACK")
                .map_err(|e| StoreError::backend("sqlite", e))?;
            Err(StoreError::backend("sqlite", "simulated abort"))
        });
        let (c, abort) = futures::join!(c, abort);
        assert!(held.await.is_ok_and(|r| r.is_ok()));
        assert!(c.is_err() && abort.is_err());
        assert_eq!(
            recorder
                .published
                .lock()
                .map(|p| p.clone())
                .unwrap_or_default(),
            ["a", "b"],
            "c's group was lost"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_writer_ends_its_thread() {
        let writer = memory_writer();
        assert!(writer.run(insert("a", 1)).await.is_ok());
        drop(writer); // joins the thread; hangs here if the loop never ends
    }
}
