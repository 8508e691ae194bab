//! SQLite backend: one file, WAL, `synchronous=FULL` (a 200 means the commit is on disk).
//!
//! SQLite has one writer at a time, so the pool holds a single connection and requests
//! queue for it in order; a long-poll never holds it while waiting.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool, Transaction};

use crate::*;
use listing::Listing;

pub mod group;
mod grouping;
mod jobs;
mod listing;
mod notify;
mod sessions;
mod spool;
mod tx;

use {spool::*, tx::*};

pub struct SqliteStore {
    pool: SqlitePool,
    /// Set when a transaction-control statement failed: the connection's state is unknown.
    poisoned: Arc<AtomicBool>,
}

/// Whether a connection coming back to the pool may serve again: not if a statement that
/// begins, ends or nests a transaction failed on it (`poisoned`), nor if sqlx still counts
/// it inside a transaction (a rollback that failed). After a failed COMMIT (a full disk,
/// an I/O error) SQLite may have rolled back or kept the transaction, and sqlx's count of
/// open transactions and savepoints may no longer match SQLite's: a "commit" on such a
/// connection could release only a nested savepoint and report success for work that is
/// never written. Such a connection is closed (which rolls back whatever it held) and the
/// pool opens a fresh one.
async fn fit_to_serve(
    conn: &mut sqlx::SqliteConnection,
    poisoned: &AtomicBool,
) -> std::result::Result<bool, sqlx::Error> {
    if poisoned.swap(false, Ordering::SeqCst) {
        replaced("a connection whose transaction state is unknown is closed and replaced");
        return Ok(false);
    }
    if !sqlx::Connection::is_in_transaction(conn) {
        return Ok(true);
    }
    // A dropped transaction queued its rollback: run it, then count again.
    sqlx::Connection::ping(conn).await?;
    if sqlx::Connection::is_in_transaction(conn) {
        replaced("a connection left inside a transaction is closed and replaced");
        return Ok(false);
    }
    Ok(true)
}

/// Logs a replaced connection: a warning, but while the disk is full (when every failed
/// write replaces one) at debug level, the full disk being logged once (`crate::full`).
fn replaced(what: &str) {
    if crate::full::writes_refused() {
        tracing::debug!("SQLite: {what}");
    } else {
        tracing::warn!("SQLite: {what}");
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:`) and runs the migrations.
    pub async fn open(url: &str) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(|e| cannot_connect("open", url, &e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let poisoned = Arc::new(AtomicBool::new(false));
        let flag = poisoned.clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(move |conn, _| {
                let flag = flag.clone();
                Box::pin(async move { fit_to_serve(conn, &flag).await })
            })
            .acquire_timeout(Duration::from_secs(60))
            // A local file does not go stale like a socket: no ping round trip through
            // sqlx's worker thread before every statement.
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .map_err(|e| cannot_connect("open", url, &e))?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await.db()?;
        Ok(Self { pool, poisoned })
    }
}

admin_store!(SqliteStore, SqliteRow,
    locked: "(SELECT count(*) FROM deliveries d WHERE d.lock_txn = s.txn)",
    msg_locked: "EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)",
    retry: "COALESCE((SELECT max(d.retry_count) FROM deliveries d WHERE d.msg_seq = m.seq), 0)");

queue_store!(SqliteStore, SqliteRow, {
    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        let tx = match self.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                // A BEGIN refused on a connection SQLite still holds in a transaction.
                self.poisoned.store(true, Ordering::SeqCst);
                return Err(db_error(e));
            }
        };
        Ok(Box::new(SqliteTx { tx, poisoned: self.poisoned.clone() }))
    }

    async fn recover(&self) -> Result<u64> {
        let mut tx = self.pool.begin().await.db()?;
        let a =
            sqlx::query("DELETE FROM messages WHERE enq_txn IS NOT NULL AND enq_txn NOT IN (SELECT txn FROM sessions)")
                .execute(&mut *tx)
                .await
                .db()?;
        let b = sqlx::query(sql::RECOVER_UNLOCK_ORPHANED).execute(&mut *tx).await.db()?;
        sqlx::query(sql::RECOVER_DROP_ORPHANED_NOTIFICATIONS).execute(&mut *tx).await.db()?;
        tx.commit().await.db()?;
        Ok(a.rows_affected() + b.rows_affected())
    }

    async fn due_expirations(&self, now: Micros, limit: i64) -> Result<Vec<ExpiredMessage>> {
        let rows = sqlx::query(
            "SELECT m.seq, m.queue_id, m.exception_queue FROM messages m
             WHERE m.expire_at IS NOT NULL AND m.expire_at <= ?1 AND m.enq_txn IS NULL
               AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)
             ORDER BY m.expire_at LIMIT ?2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter()
            .map(|r| {
                Ok(ExpiredMessage {
                    seq: r.try_get("seq").db()?,
                    queue: r.try_get("queue_id").db()?,
                    exception_queue: r.try_get("exception_queue").db()?,
                })
            })
            .collect()
    }

    async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>> {
        Ok(None)
    }
});

/// A SQLite file is one process's store (one writer; long polls and the time manager see
/// only their own process): a second `aqgate serve` on the same file is refused, by an
/// exclusive lock (flock) on the database file itself, held while the server runs and let
/// go by the OS if it dies. The file is the one SQLite opens (the URL parsed as sqlx
/// parses it), so another spelling of its path, a symbolic or a hard link, meets the same
/// lock; SQLite's own locks are of another kind and unaffected. Several nodes share a
/// PostgreSQL database instead. `None` for other databases and in-memory SQLite.
pub fn sole_server(url: &str) -> Result<Option<std::fs::File>, String> {
    use std::str::FromStr;
    if !url.starts_with("sqlite:") {
        return Ok(None);
    }
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url).map_err(|e| format!("database URL: {e}"))?;
    let path = opts.get_filename();
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" || url.contains("mode=memory") {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another aqgate serve is running on the SQLite database {}: a SQLite file serves one process; \
             run several nodes on PostgreSQL instead",
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("{}: {e}", path.display())),
    }
}
