//! The reader pool: a few read-only connections used from blocking threads. Reads never
//! queue behind the writer; in WAL mode they see the last committed snapshot.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::{SqlContext, SqliteError};
use crate::store::Result;

/// Read-only connections kept open.
pub(super) const READERS: usize = 4;

pub(super) struct ReaderPool {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
}

impl ReaderPool {
    pub(super) fn new(connections: Vec<Connection>) -> Arc<Self> {
        Arc::new(ReaderPool {
            idle: Mutex::new(connections),
            returned: Condvar::new(),
        })
    }

    /// Runs `read` in one read transaction on a pooled connection, on a blocking thread.
    /// Everything `read` queries comes from one snapshot, so a fence check and the data
    /// it guards can never disagree.
    pub(super) async fn read<T, F>(self: &Arc<Self>, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut lease = pool.checkout();
            let conn = lease.conn()?;
            if !conn.is_autocommit() {
                // A read that failed half-way left its transaction open; close it, or
                // this connection could never start another.
                conn.execute_batch("ROLLBACK").ctx("resetting a reader")?;
            }
            // DEFERRED: the snapshot starts at the first read and holds to the end.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .ctx("starting a read")?;
            let out = read(&tx)?;
            // Ending a read-only transaction releases its snapshot (lets checkpoints
            // progress); its outcome carries no data.
            tx.rollback().ctx("ending a read")?;
            Ok(out)
        })
        .await
        .map_err(|e| SqliteError::Task(format!("read task failed: {e}")))?
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Connection>> {
        // The lock is never held while user code runs, so poisoning carries no torn state.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for an idle connection (blocking thread only).
    fn checkout(self: &Arc<Self>) -> Lease {
        let mut idle = self.lock();
        loop {
            if let Some(conn) = idle.pop() {
                return Lease {
                    pool: self.clone(),
                    conn: Some(conn),
                };
            }
            idle = self
                .returned
                .wait(idle)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A checked-out connection; returns to the pool on drop (also when the read panics).
struct Lease {
    pool: Arc<ReaderPool>,
    conn: Option<Connection>,
}

impl Lease {
    fn conn(&mut self) -> Result<&mut Connection> {
        // `conn` is only taken in `drop`.
        self.conn
            .as_mut()
            .ok_or_else(|| SqliteError::Internal("a reader lease lost its connection").into())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.lock().push(conn);
            self.pool.returned.notify_one();
        }
    }
}
