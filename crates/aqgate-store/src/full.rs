//! Whether the database refuses writes for want of space, as this process last saw it.
//!
//! A full disk makes every write fail until space is freed: the store says so once when it
//! starts (an ERROR line) and once when a write commits again (an INFO line with how long
//! it lasted), the requests in between fail at debug level with their own fault
//! (`StoreError::is_full`), `probe_write` (readiness) answers "full" without touching the
//! database for [`HOLD_DOWN`] after the last refusal, and the count of refused writes is
//! kept for `/metrics`. Process-wide, as [`crate::connection_lost`] is: one process serves
//! one database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// After a write was refused for want of space, readiness says "full" this long without
/// probing: a probe's tiny write may find room that a request's write does not.
pub const HOLD_DOWN: Duration = Duration::from_secs(5);

/// Since when writes are refused (µs since [`crate::EPOCH`] plus one); 0 if they are not.
static SINCE: AtomicU64 = AtomicU64::new(0);
/// The last refusal, in the same unit.
static LAST: AtomicU64 = AtomicU64::new(0);
/// Writes refused for want of space since the process started.
static REFUSED: AtomicU64 = AtomicU64::new(0);

fn now() -> u64 {
    crate::since_epoch(Instant::now())
}

/// Whether `e` is the database refusing a write for want of space: SQLite's `SQLITE_FULL`
/// (13), PostgreSQL's `53100 disk_full`.
pub(crate) fn is_full(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => matches!(d.code().as_deref(), Some("13" | "53100")),
        _ => false,
    }
}

/// Whether PostgreSQL said it with a PANIC (or FATAL): the server (or the backend) ended
/// with it, and whatever the connection was committing may or may not be on disk; the
/// caller reports the connection lost, not the write refused.
pub(crate) fn ended_the_server(e: &sqlx::Error) -> bool {
    use sqlx::postgres::{PgDatabaseError, PgSeverity};
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<PgDatabaseError>())
        .is_some_and(|p| matches!(p.severity(), PgSeverity::Panic | PgSeverity::Fatal))
}

/// A write was refused for want of space.
pub(crate) fn refused(why: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    let t = now();
    LAST.store(t, Ordering::Relaxed);
    if SINCE.compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        tracing::error!(
            error = %why,
            "the database cannot write: its disk is full; writes are refused (fault 1653) until space is freed"
        );
    }
}

/// A write committed: if writes were refused, they are no more.
pub(crate) fn wrote() {
    if SINCE.load(Ordering::Relaxed) == 0 {
        return;
    }
    let since = SINCE.swap(0, Ordering::Relaxed);
    if since != 0 {
        let secs = Duration::from_micros(now().saturating_sub(since)).as_secs_f64();
        tracing::info!(seconds = format!("{secs:.1}"), "the database writes again: space was freed");
    }
}

/// Whether writes are refused now (a refusal seen, no commit since).
pub fn writes_refused() -> bool {
    SINCE.load(Ordering::Relaxed) != 0
}

/// Whether a write was refused within [`HOLD_DOWN`].
pub(crate) fn refused_recently() -> bool {
    let last = LAST.load(Ordering::Relaxed);
    writes_refused() && last != 0 && Duration::from_micros(now().saturating_sub(last)) < HOLD_DOWN
}

/// Writes refused for want of space since the process started.
pub fn refused_total() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// The statement [`probe`] commits.
pub(crate) const PROBE_SQL: &str = "UPDATE store_probe SET n = n + 1 WHERE id = 1";

/// `Store::probe_write` of both backends: "full" without a round trip while writes were
/// refused within [`HOLD_DOWN`], else one small write committed.
pub(crate) async fn probe<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> aqgate_core::store::Result<()>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    use crate::Db;
    if refused_recently() {
        return Err(aqgate_core::store::StoreError::full(format!(
            "a write was refused for want of space within the last {} s",
            HOLD_DOWN.as_secs()
        )));
    }
    let mut tx = pool.begin().await.db()?;
    sqlx::query(PROBE_SQL).execute(&mut *tx).await.db()?;
    tx.commit().await.db()?;
    wrote();
    Ok(())
}
