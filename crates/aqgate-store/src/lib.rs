//! aqgate's stores: SQLite (the default: a file, WAL) and PostgreSQL, behind the core's
//! [`aqgate_core::store::Store`] interface, with group commit, cross-process interest and
//! the migrations of both.

// First: their macros write each part of the store once, for both backends below.
#[macro_use]
mod admin;
#[macro_use]
mod jobs;
#[macro_use]
mod messages;
#[macro_use]
mod notify;
#[macro_use]
mod sessions;
#[macro_use]
mod spool;
#[macro_use]
mod tx;
pub mod full;
pub mod health;
mod listing;
mod narrowing;
pub mod postgres;
mod sql;
pub mod sqlite;
pub mod views;

use aqgate_core::clock::Micros;
pub(crate) use aqgate_core::store::*;

/// A pooled database connection idle this long is pinged before it is used again.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The store's error for a database failure: full when it refused a write for want of space
/// (see [`full`]), unavailable when the database is away — the connection is gone (and
/// then remembered, see [`connection_lost`]), none is to be had, or writes are refused as
/// on a standby (see [`health::outage_reason`]; the outage recorded in [`health`]) —, else
/// failed.
pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    if full::is_full(&e) {
        full::refused(&e.to_string());
        if full::ended_the_server(&e) {
            connection_lost();
            health::outage("the server ended (PANIC)", &e);
            return StoreError::unavailable(e);
        }
        return StoreError::full(e);
    }
    if let Some(why) = health::outage_reason(&e) {
        if connection_broken(&e) {
            connection_lost();
        }
        health::outage(why, &e);
        return StoreError::unavailable(e);
    }
    StoreError::failed(e)
}

/// `?` on a database result: `.db()?`.
pub(crate) trait Db<T> {
    fn db(self) -> Result<T>;
}

impl<T> Db<T> for std::result::Result<T, sqlx::Error> {
    fn db(self) -> Result<T> {
        self.map_err(db_error)
    }
}

impl<T> Db<T> for std::result::Result<T, sqlx::migrate::MigrateError> {
    fn db(self) -> Result<T> {
        self.map_err(StoreError::failed)
    }
}

/// Whether `e` means the connection is gone (I/O, protocol, TLS failure; PostgreSQL's
/// `08` connection exceptions and `57P` shutdowns, e.g. `pg_terminate_backend` or a
/// restart), as opposed to a statement failing on a healthy connection.
pub(crate) fn connection_broken(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// When a connection was last seen lost (I/O or protocol failure), in microseconds since
/// [`EPOCH`] plus one; 0 if never. A server restart breaks every pooled connection at once,
/// so after one is seen broken, the others that have been idle since are pinged before use
/// (see `postgres::ping_if_stale`) instead of each failing one request.
static LAST_LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The monotonic origin of [`LAST_LOST`] (wall-clock steps must not matter).
static EPOCH: std::sync::LazyLock<std::time::Instant> = std::sync::LazyLock::new(std::time::Instant::now);

fn since_epoch(t: std::time::Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(*EPOCH).as_micros()).unwrap_or(u64::MAX).saturating_add(1)
}

pub(crate) fn connection_lost() {
    LAST_LOST.store(since_epoch(std::time::Instant::now()), std::sync::atomic::Ordering::Relaxed);
}

/// Whether a connection idle for `idle_for` went idle before a connection was last seen
/// lost, or has been idle for [`STALE_AFTER`]: such a connection is pinged before use.
pub(crate) fn idle_connection_suspect(idle_for: std::time::Duration) -> bool {
    if idle_for >= STALE_AFTER {
        return true;
    }
    let lost = LAST_LOST.load(std::sync::atomic::Ordering::Relaxed);
    let now = std::time::Instant::now();
    lost != 0 && since_epoch(now.checked_sub(idle_for).unwrap_or(*EPOCH)) <= lost
}

/// A spooled mail's state after a forwarding attempt: `done` with a response, `new` again
/// with a retry time, else `failed`.
pub(crate) fn spool_state_after(response: Option<&[u8]>, next_attempt_at: Option<Micros>) -> &'static str {
    match (response, next_attempt_at) {
        (Some(_), _) => "done",
        (None, Some(_)) => "new",
        (None, None) => "failed",
    }
}

/// How long the first connection to a database may take: opening a store connects once,
/// at once, so that a database that cannot be reached is reported as such, with what was
/// tried and why, instead of as a pool that timed out later.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `url` with its password, if any, shown as `***` (in the user part, or a `password=` or
/// `sslpassword=` parameter): a database URL as it may be printed.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    // The last `@` before the query ends the user part (a raw `/` or `@` in a password
    // stays inside it).
    let mut out = format!("{scheme}://");
    match before_query.rfind('@') {
        Some(at) => {
            let (userinfo, host_and_path) = (&before_query[..at], &before_query[at..]);
            match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:***{host_and_path}")),
                None => out.push_str(before_query),
            }
        }
        None => out.push_str(before_query),
    }
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("sslpassword") => {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// The store's error for a first connection that failed: `cannot connect to URL: why`
/// (`verb` "open" for a file), the URL without its password.
pub(crate) fn cannot_connect(verb: &str, url: &str, e: &sqlx::Error) -> StoreError {
    let why = match e {
        // "Connection refused (os error 111)" → "connection refused".
        sqlx::Error::Io(io) => {
            let text = io.to_string();
            let text = match text.rfind(" (os error ") {
                Some(i) if text.ends_with(')') => text[..i].to_string(),
                _ => text,
            };
            let mut chars = text.chars();
            chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
        }
        sqlx::Error::Database(d) => d.message().to_string(),
        sqlx::Error::Tls(t) => format!("TLS: {t}"),
        sqlx::Error::Configuration(c) => format!("invalid database URL: {c}"),
        sqlx::Error::PoolTimedOut => "no connection to be had".to_string(),
        other => other.to_string(),
    };
    StoreError::unavailable(format!("cannot {verb} {}: {why}", redact_url(url)))
}

/// The first connection took longer than [`CONNECT_TIMEOUT`].
pub(crate) fn no_answer(url: &str) -> StoreError {
    StoreError::unavailable(format!(
        "cannot connect to {}: no answer within {} s",
        redact_url(url),
        CONNECT_TIMEOUT.as_secs()
    ))
}

/// Opens the store named by `url`: `sqlite://path` (created if missing), `sqlite::memory:`,
/// or `postgres://…`. It connects once, at once (within [`CONNECT_TIMEOUT`]): a database
/// that cannot be reached is an unavailable [`StoreError`] saying
/// `cannot connect to URL: why` (the URL without its password).
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_with(url, &aqgate_core::metrics::Metrics::default()).await
}

/// [`open`], with the store's counters registered in `metrics`.
pub async fn open_with(url: &str, metrics: &aqgate_core::metrics::Metrics) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(std::sync::Arc::new(postgres::PgStore::open_with(url, metrics).await?))
    } else {
        let sqlite: std::sync::Arc<dyn Store> = std::sync::Arc::new(sqlite::SqliteStore::open(url).await?);
        // One writer, one disk sync per commit: concurrent requests share commits.
        Ok(std::sync::Arc::new(sqlite::group::GroupCommitStore::new(sqlite, 256)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn connections_idle_since_a_loss_are_suspect() {
        assert!(idle_connection_suspect(STALE_AFTER), "idle for the stale time");
        connection_lost();
        std::thread::sleep(Duration::from_millis(20));
        assert!(idle_connection_suspect(Duration::from_millis(200)), "idle since before the loss");
        assert!(!idle_connection_suspect(Duration::from_millis(5)), "went idle after the loss");
        assert!(!idle_connection_suspect(Duration::ZERO));
    }

    #[test]
    fn which_errors_mean_a_lost_connection() {
        assert!(connection_broken(&sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))));
        assert!(connection_broken(&sqlx::Error::Protocol("unexpected message".into())));
        assert!(!connection_broken(&sqlx::Error::RowNotFound));
        assert!(!connection_broken(&sqlx::Error::PoolTimedOut));
        assert!(db_error(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(db_error(sqlx::Error::Protocol("eof".into())).is_unavailable());
        assert!(!db_error(sqlx::Error::RowNotFound).is_unavailable());
        assert!(!StoreError::corrupt("x").is_unavailable());
    }

    #[test]
    fn a_url_is_shown_without_its_password() {
        for (url, shown) in [
            ("postgres://postgres@127.0.0.1:1/x", "postgres://postgres@127.0.0.1:1/x"),
            ("postgres://aq:hunter2@db:5432/aq", "postgres://aq:***@db:5432/aq"),
            ("postgres://aq:hun/t@r2@db/aq?sslmode=require", "postgres://aq:***@db/aq?sslmode=require"),
            ("postgres://db/aq?user=aq&password=hunter2", "postgres://db/aq?user=aq&password=***"),
            ("sqlite://aqgate.db", "sqlite://aqgate.db"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn a_failed_first_connection_says_what_was_tried_and_why() {
        let refused = sqlx::Error::Io(std::io::Error::from_raw_os_error(111));
        let e = cannot_connect("connect to", "postgres://aq:hunter2@127.0.0.1:1/x", &refused);
        assert_eq!(e.to_string(), "database: cannot connect to postgres://aq:***@127.0.0.1:1/x: connection refused");
        assert!(e.is_unavailable());
    }
}
