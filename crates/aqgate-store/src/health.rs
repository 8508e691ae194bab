//! Whether the database takes writes, as this process last saw it (`Store::health`).
//!
//! Two things feed it: the checks (one small write, `full::probe`, one at a time however
//! many callers ask: [`check_health`]; `serve` runs them every second, [`prober`]), and
//! every failure `db_error` classifies as the database being away ([`outage_reason`]):
//! connection refused, reset or closed, no connection to be had from the pool, PostgreSQL's
//! class `08` and `57P01`–`57P03`, `25006` (a read-only transaction: a standby, or a
//! primary demoted during a failover), SQLite's `READONLY` and `CANTOPEN`. The first such
//! failure logs the outage once (ERROR, with why), the requests that fail meanwhile log at
//! debug, and the first check that commits a write again logs "database available again
//! after N s" (INFO) and wakes the background duties waiting in [`until_available`].
//! Process-wide, as [`crate::full`] and [`crate::connection_lost`] are: one process serves
//! one database.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::store::{Health, Readiness, Store};

/// How often [`prober`] checks.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A check that has not committed within this is an outage ("no answer").
pub const CHECK_WITHIN: Duration = Duration::from_secs(2);
/// A check younger than this is fresh: asking again does not check again.
pub const FRESH_FOR: Duration = Duration::from_millis(1000);
/// A check older than this says nothing any more: readiness is [`Readiness::Unknown`].
pub const STALE_AFTER: Duration = Duration::from_secs(5);
/// A check running longer than this (a healthy one takes milliseconds) makes the state
/// unknown until it ends.
pub const SLOW_CHECK: Duration = Duration::from_millis(1000);

/// Since when the database is away (µs since the crate's epoch, plus one); 0: available.
static DOWN_SINCE: AtomicU64 = AtomicU64::new(0);
/// Outages since the process started.
static OUTAGES: AtomicU64 = AtomicU64::new(0);
/// How long the last outage that ended lasted, in µs.
static LAST_OUTAGE: AtomicU64 = AtomicU64::new(0);
/// Tables vacuumed by [`vacuumer`], and their dead rows.
static VACUUMS: AtomicU64 = AtomicU64::new(0);
static VACUUMED_ROWS: AtomicU64 = AtomicU64::new(0);
/// Tables analyzed alone by [`vacuumer`].
static ANALYZES: AtomicU64 = AtomicU64::new(0);
/// Since when a check runs (same unit as [`DOWN_SINCE`]); 0: none.
static CHECKING_SINCE: AtomicU64 = AtomicU64::new(0);
/// Why the database is away (the latest classified reason).
static WHY: Mutex<String> = Mutex::new(String::new());
/// The last check's end and verdict.
static LAST: Mutex<Option<(Instant, Readiness)>> = Mutex::new(None);
/// Bumped at the end of every check: what callers of [`check_health`] and
/// [`until_available`] wait on.
static CHECKED: LazyLock<tokio::sync::watch::Sender<u64>> = LazyLock::new(|| tokio::sync::watch::channel(0).0);
/// Asks [`prober`] to check at once (an outage was just seen).
static CHECK_NOW: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

fn now() -> u64 {
    crate::since_epoch(Instant::now())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why `e` means the database is away, in a few words (shown by `/readyz`, so never the
/// database's own text), or `None` for a statement failing on a healthy connection.
/// Serialization failures (`40001`) and deadlocks are not outages.
pub fn outage_reason(e: &sqlx::Error) -> Option<&'static str> {
    use std::io::ErrorKind;
    match e {
        sqlx::Error::Io(io) => Some(match io.kind() {
            ErrorKind::ConnectionRefused => "connection refused",
            ErrorKind::TimedOut => "connection timed out",
            _ => "connection lost",
        }),
        sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => Some("connection lost"),
        sqlx::Error::PoolTimedOut => Some("no connection to be had within the pool's timeout"),
        sqlx::Error::PoolClosed => Some("the connection pool is closed"),
        sqlx::Error::Database(d) => {
            let code = d.code()?;
            match code.as_ref() {
                "25006" => Some("it refuses writes (a read-only transaction: a standby, or a failover under way)"),
                "57P01" => Some("the server is shutting down (administrator command)"),
                "57P02" => Some("the server is shutting down (crash of another server process)"),
                "57P03" => Some("the server cannot take connections now (starting up or shutting down)"),
                c if c.starts_with("57P") => Some("the server ended the connection"),
                c if c.starts_with("08") => Some("connection exception"),
                c => match c.parse::<i32>().map(|n| n & 0xff) {
                    // SQLITE_READONLY and its extended codes.
                    Ok(8) => Some("the database file is read-only"),
                    // SQLITE_CANTOPEN.
                    Ok(14) => Some("the database file cannot be opened"),
                    _ => None,
                },
            }
        }
        _ => None,
    }
}

/// A failure that means the database is away: the outage begins (logged once), or goes on
/// (at debug).
pub(crate) fn outage(why: &str, error: &dyn std::fmt::Display) {
    why.clone_into(&mut lock(&WHY));
    if DOWN_SINCE.compare_exchange(0, now(), Ordering::AcqRel, Ordering::Acquire).is_ok() {
        OUTAGES.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            error = %error,
            "database unavailable: {why}; requests are refused with fault 1034 and the background duties wait \
             until it is back"
        );
        CHECK_NOW.notify_one();
    } else {
        tracing::debug!(error = %error, "database unavailable: {why}");
    }
}

/// A check that began at `began` committed a write: an outage that began before it is
/// over.
fn back(began: u64) {
    let since = DOWN_SINCE.load(Ordering::Acquire);
    if since == 0 || since > began {
        // None, or one a failure began after the check did: the next check says.
        return;
    }
    if DOWN_SINCE.compare_exchange(since, 0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        let lasted = now().saturating_sub(since);
        LAST_OUTAGE.store(lasted, Ordering::Relaxed);
        let secs = Duration::from_micros(lasted).as_secs_f64();
        tracing::info!(seconds = format!("{secs:.1}"), "database available again after {secs:.1} s");
    }
}

/// Whether the database is away now (a failure that means so, no commit of a check since).
pub fn unavailable() -> bool {
    DOWN_SINCE.load(Ordering::Acquire) != 0
}

/// The health as last seen, without a round trip.
pub fn health() -> Health {
    let down = DOWN_SINCE.load(Ordering::Acquire);
    let t = now();
    let outage_seconds = match down {
        0 => Duration::from_micros(LAST_OUTAGE.load(Ordering::Relaxed)),
        since => Duration::from_micros(t.saturating_sub(since)),
    }
    .as_secs_f64();
    let checking = CHECKING_SINCE.load(Ordering::Acquire);
    let last = lock(&LAST).clone();
    let readiness = match last {
        _ if checking != 0 && Duration::from_micros(t.saturating_sub(checking)) > SLOW_CHECK => {
            Readiness::Unknown(format!("the database has not answered a check for {} ms", (t - checking) / 1000))
        }
        None => Readiness::Unknown("no check has ended yet".into()),
        Some((at, _)) if at.elapsed() > STALE_AFTER => {
            Readiness::Unknown(format!("the last check ended {} s ago", at.elapsed().as_secs()))
        }
        // A request saw the database away since the last check said ready.
        Some((_, Readiness::Ready)) if down != 0 => Readiness::Unavailable(lock(&WHY).clone()),
        Some((_, r)) => r,
    };
    Health {
        readiness,
        available: down == 0,
        outages: OUTAGES.load(Ordering::Relaxed),
        outage_seconds,
        vacuums: VACUUMS.load(Ordering::Relaxed),
        vacuumed_rows: VACUUMED_ROWS.load(Ordering::Relaxed),
        analyzes: ANALYZES.load(Ordering::Relaxed),
    }
}

/// A connection from the pool (`fut`: its `acquire` or `begin`): while the database is away,
/// waited for at most [`CHECK_WITHIN`] instead of the pool's whole acquire timeout (a
/// refused connection is tried again until then), so that requests are refused with the
/// outage's fault at once rather than after half a minute each.
pub(crate) async fn bounded<T>(fut: impl Future<Output = sqlx::Result<T>>) -> aqgate_core::store::Result<T> {
    use crate::Db;
    if !unavailable() {
        return fut.await.db();
    }
    match tokio::time::timeout(CHECK_WITHIN, fut).await {
        Ok(r) => r.db(),
        Err(_) => Err(aqgate_core::store::StoreError::unavailable(format!(
            "no connection within {} s while the database is unavailable",
            CHECK_WITHIN.as_secs()
        ))),
    }
}

/// A check: the write to commit (the backend's `full::probe` on a clone of its pool).
pub(crate) type Check = Pin<Box<dyn Future<Output = aqgate_core::store::Result<()>> + Send + 'static>>;

/// `Store::check_health`: starts `check` when the last one is not fresh and none is
/// running, waits for a check to end at most `within`, and answers the health then.
pub(crate) async fn check_health(within: Duration, check: impl FnOnce() -> Check) -> Health {
    let mut ended = CHECKED.subscribe();
    ended.mark_unchanged();
    if refresh(check) && !within.is_zero() {
        let _ = tokio::time::timeout(within, ended.changed()).await;
    }
    health()
}

/// Starts `check` unless the last one is fresh or one runs; whether a check runs now.
fn refresh(check: impl FnOnce() -> Check) -> bool {
    let fresh = lock(&LAST).as_ref().is_some_and(|(at, _)| at.elapsed() < FRESH_FOR);
    if !fresh {
        start(check);
    }
    CHECKING_SINCE.load(Ordering::Acquire) != 0
}

/// Starts `check` in a task of its own unless one runs (it outlives a caller that stops
/// waiting for it).
fn start(check: impl FnOnce() -> Check) {
    let began = now();
    if CHECKING_SINCE.compare_exchange(0, began, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    let fut = check();
    tokio::spawn(async move {
        let verdict = match tokio::time::timeout(CHECK_WITHIN, fut).await {
            Ok(Ok(())) => {
                back(began);
                Readiness::Ready
            }
            Ok(Err(e)) if e.is_full() => Readiness::Full,
            // Classified (and the outage begun) by `db_error`.
            Ok(Err(e)) if e.is_unavailable() => Readiness::Unavailable(lock(&WHY).clone()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the readiness check's write failed");
                Readiness::Unavailable("the check's write failed (see the log)".into())
            }
            Err(_) => {
                let why = format!("no answer within {} s", CHECK_WITHIN.as_secs());
                outage(&why, &"the readiness check's write did not commit in time");
                Readiness::Unavailable(why)
            }
        };
        *lock(&LAST) = Some((Instant::now(), verdict));
        CHECKING_SINCE.store(0, Ordering::Release);
        CHECKED.send_modify(|n| *n = n.wrapping_add(1));
    });
}

/// `Store::until_available`: returns once a check commits again, or after `at_most`;
/// meanwhile it checks every [`CHECK_EVERY`] itself (with `check`) when nothing else does.
pub(crate) async fn until_available(at_most: Duration, check: impl Fn() -> Check) {
    let deadline = tokio::time::Instant::now() + at_most;
    let mut ended = CHECKED.subscribe();
    while unavailable() && tokio::time::Instant::now() < deadline {
        ended.mark_unchanged();
        refresh(&check);
        let until = deadline.min(tokio::time::Instant::now() + CHECK_EVERY);
        let _ = tokio::time::timeout_at(until, ended.changed()).await;
    }
}

/// Checks `store` every [`CHECK_EVERY`] (and at once when an outage was just seen), so
/// that readiness and `/metrics` are current and an outage's end is seen even when no
/// request comes, until `stop` changes.
pub async fn prober(store: Arc<dyn Store>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        store.check_health(CHECK_WITHIN).await;
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = CHECK_NOW.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// A table is vacuumed once its dead rows number at least this many …
pub const VACUUM_MIN_DEAD: i64 = 10_000;
/// … and at least this fraction of its live rows (autovacuum's default scale factor).
pub const VACUUM_FRACTION: f64 = 0.2;

/// `serve`'s vacuuming duty: every `every`, [`Store::vacuum`] of the tables with at least
/// [`VACUUM_MIN_DEAD`] dead rows and [`VACUUM_FRACTION`] of their live rows, and an analyze
/// of those whose statistics are due (one process of those sharing the database at a
/// time). Each table vacuumed or analyzed is logged (INFO: its dead or changed and live
/// rows, how long it took) and counted (`/metrics`); a failure is logged (WARN,
/// or debug during an outage, which the health logs) and tried again at the next turn.
pub async fn vacuumer(store: Arc<dyn Store>, every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        match store.vacuum(VACUUM_MIN_DEAD, VACUUM_FRACTION).await {
            Ok(done) => {
                for v in done {
                    let ms = v.took.as_millis() as u64;
                    if v.vacuumed {
                        VACUUMS.fetch_add(1, Ordering::Relaxed);
                        VACUUMED_ROWS.fetch_add(u64::try_from(v.dead).unwrap_or(0), Ordering::Relaxed);
                        tracing::info!(table = v.table, dead_rows = v.dead, live_rows = v.live, ms, "vacuumed");
                    } else {
                        ANALYZES.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(table = v.table, changed_rows = v.changed, live_rows = v.live, ms, "analyzed");
                    }
                }
            }
            Err(e) if e.is_unavailable() => tracing::debug!(error = %e, "vacuum: the database is away"),
            Err(e) => tracing::warn!(error = %e, "vacuum failed; tried again in {} s", every.as_secs()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(code: &str) -> sqlx::Error {
        #[derive(Debug)]
        struct E(String);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error {}", self.0)
            }
        }
        impl std::error::Error for E {}
        impl sqlx::error::DatabaseError for E {
            fn message(&self) -> &str {
                "message"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.as_str().into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        sqlx::Error::Database(Box::new(E(code.into())))
    }

    #[test]
    fn which_failures_mean_the_database_is_away() {
        use std::io::{Error, ErrorKind};
        let io = |k: ErrorKind| sqlx::Error::Io(Error::from(k));
        assert_eq!(outage_reason(&io(ErrorKind::ConnectionRefused)), Some("connection refused"));
        assert_eq!(outage_reason(&io(ErrorKind::ConnectionReset)), Some("connection lost"));
        assert_eq!(outage_reason(&io(ErrorKind::UnexpectedEof)), Some("connection lost"));
        assert_eq!(outage_reason(&io(ErrorKind::BrokenPipe)), Some("connection lost"));
        assert!(outage_reason(&sqlx::Error::PoolTimedOut).is_some());
        assert!(outage_reason(&sqlx::Error::PoolClosed).is_some());
        assert!(outage_reason(&sqlx::Error::Protocol("unexpected eof".into())).is_some());
        for code in ["08000", "08003", "08006", "08001", "57P01", "57P02", "57P03", "25006", "8", "1032", "14"] {
            assert!(outage_reason(&db(code)).is_some(), "{code} is an outage");
        }
        assert!(outage_reason(&db("25006")).is_some_and(|w| w.contains("refuses writes")));
        // Statements failing on a healthy connection are not.
        for code in ["40001", "40P01", "23505", "42P01", "53100", "13", "5", "2067", "22001"] {
            assert_eq!(outage_reason(&db(code)), None, "{code} is no outage");
        }
        assert_eq!(outage_reason(&sqlx::Error::RowNotFound), None);
        assert_eq!(outage_reason(&sqlx::Error::ColumnNotFound("x".into())), None);
    }

    #[test]
    fn the_store_error_says_unavailable_for_an_outage_and_failed_otherwise() {
        assert!(crate::db_error(db("25006")).is_unavailable());
        assert!(crate::db_error(db("57P03")).is_unavailable());
        assert!(crate::db_error(db("08006")).is_unavailable());
        assert!(crate::db_error(sqlx::Error::Io(std::io::Error::from_raw_os_error(111))).is_unavailable());
        assert!(!crate::db_error(db("40001")).is_unavailable());
        assert!(!crate::db_error(db("23505")).is_unavailable());
        let e: aqgate_core::error::AqError = crate::db_error(db("25006")).into();
        assert_eq!(e.code, aqgate_core::error::code::STORE_UNAVAILABLE);
        assert!(e.message.contains("retry"), "{}", e.message);
        let e: aqgate_core::error::AqError = crate::db_error(db("23505")).into();
        assert_eq!(e.code, aqgate_core::error::code::INTERNAL);
    }
}
