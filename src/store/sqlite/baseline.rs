//! The disk's limit for the commit protocol's writes, for `make bench-store`: the same
//! durable writes (a 4 KiB body row, then a head row update) through the same single
//! writer with the same group commit and the same pragmas, with none of the protocol
//! (no fence, idempotency key, pending bound, revision check or audit columns). The
//! store's figures are read as a fraction of this one.

use std::path::Path;

use rusqlite::params;

use super::{SqlContext, SqliteError, schema, writer::Writer};
use crate::store::Result;

/// A scratch database holding only bodies and heads.
pub struct Baseline {
    writer: Writer,
}

impl Baseline {
    /// Creates the two tables in a new database at `path` (WAL, `synchronous=FULL`).
    pub async fn open(path: &Path) -> Result<Self> {
        let path = path.to_path_buf();
        let conn = tokio::task::spawn_blocking(move || -> Result<_> {
            let conn = schema::open_writer(&path)?;
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, binding TEXT NOT NULL, body BLOB NOT NULL);
                 CREATE TABLE IF NOT EXISTS heads (binding TEXT PRIMARY KEY, revision INTEGER NOT NULL, body_id INTEGER NOT NULL);",
            )
            .ctx("creating the baseline tables")?;
            Ok(conn)
        })
        .await
        .map_err(|e| SqliteError::Task(format!("opening the baseline: {e}")))??;
        Ok(Baseline {
            writer: Writer::start(conn, None)?,
        })
    }

    /// One durable body insert; returns its row id.
    pub async fn write(&self, binding: &str, body: &[u8]) -> Result<i64> {
        let (binding, body) = (binding.to_owned(), body.to_vec());
        self.writer
            .run(move |conn| {
                conn.prepare_cached("INSERT INTO bodies (binding, body) VALUES (?1, ?2)")
                    .ctx("preparing the body insert")?
                    .execute(params![binding, body])
                    .ctx("inserting a body")?;
                Ok(conn.last_insert_rowid())
            })
            .await
    }

    /// One durable head update pointing at `body_id`.
    pub async fn commit(&self, binding: &str, revision: u64, body_id: i64) -> Result<()> {
        let binding = binding.to_owned();
        let revision = i64::try_from(revision).unwrap_or(i64::MAX);
        self.writer
            .run(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO heads (binding, revision, body_id) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (binding) DO UPDATE SET revision = excluded.revision, body_id = excluded.body_id",
                )
                .ctx("preparing the head update")?
                .execute(params![binding, revision, body_id])
                .ctx("updating a head")?;
                Ok(())
            })
            .await
    }
}
