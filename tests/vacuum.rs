//! aqgate's own vacuuming on PostgreSQL (`Store::vacuum`, `serve --vacuum-every`), on a
//! server whose autovacuum is off as this machine's is (the test's tables have it off
//! in any case): messages sent and gone leave dead rows; the table is vacuumed once
//! they are due, by one process at a time, never when they are not due; a table filled
//! since its statistics were gathered is analyzed; `aqgate serve` does it by itself, logs
//! it and counts it in `/metrics`.

mod common;

use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use common::{Backend, COMMIT, fresh_url, raw_send};

const QUEUE: &str = "AQUSER.RAW_QUE";
const SENT: usize = 12_000;

/// `n` RAW messages sent to QUEUE, 1,000 a request.
async fn sent(port: u16, n: usize) {
    let msgs: Vec<(&str, &str)> = vec![("", "0102"); 1_000];
    for _ in 0..n / 1_000 {
        let r = common::http(port, &raw_send(QUEUE, &msgs, COMMIT)).await;
        assert!(matches!(r, Response::Send(..)), "{r:?}");
    }
}

/// `n` RAW messages sent to QUEUE, then deleted as consumers' dequeues delete them (in one
/// statement here): their rows dead.
async fn sent_and_gone(port: u16, url: &str, n: usize) {
    sent(port, n).await;
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let gone = sqlx::query("DELETE FROM messages").execute(&pool).await.expect("delete").rows_affected();
    assert_eq!(gone, n as u64);
}

/// The dead rows PostgreSQL counts in `messages`, once its statistics show at least `want`
/// (they are flushed by each backend within a second or so of its transactions).
async fn dead_rows(url: &str, want: i64) -> i64 {
    counted(url, "n_dead_tup", want).await
}

/// `column` of `messages`' row in `pg_stat_user_tables`, once it reaches `want` (or after 30 s).
async fn counted(url: &str, column: &'static str, want: i64) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let deadline = Instant::now() + Duration::from_secs(30);
    let query = format!("SELECT coalesce(max({column}), 0) FROM pg_stat_user_tables WHERE relname = 'messages'");
    loop {
        let n: i64 = sqlx::query_scalar(&query).fetch_one(&pool).await.expect("pg_stat_user_tables");
        if n >= want || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn serve(url: &str, port: u16, vacuum_every: &str) -> common::Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = common::Proc::spawn(
        "aqgate serve",
        &mut common::aqgate(&[
            "serve",
            "--no-smtp",
            "--no-notify",
            "--listen",
            &listen,
            "--database",
            url,
            "--vacuum-every",
            vacuum_every,
        ]),
    );
    // The port opens before the store is migrated: ready means migrated.
    p.wait_ready(port, Duration::from_secs(30));
    p
}

/// When `messages` was last vacuumed and last analyzed, if ever.
async fn last_vacuum_and_analyze(admin: &sqlx::PgPool) -> (Option<String>, Option<String>) {
    sqlx::query_as("SELECT last_vacuum::text, last_analyze::text FROM pg_stat_user_tables WHERE relname = 'messages'")
        .fetch_one(admin)
        .await
        .expect("pg_stat_user_tables")
}

/// A fresh PostgreSQL database served by `aqgate serve --vacuum-every vacuum_every`, with
/// autovacuum off on `messages`: (its URL, the port, the server, a pool on it).
async fn served(vacuum_every: &str) -> (String, u16, common::Proc, sqlx::PgPool) {
    let url = fresh_url(Backend::Postgres).await;
    let port = common::free_port();
    let serve = serve(&url, port, vacuum_every);
    let admin = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query("ALTER TABLE messages SET (autovacuum_enabled = off)").execute(&admin).await.expect("autovacuum off");
    (url, port, serve, admin)
}

/// The store's vacuum takes the tables whose dead rows are due and no other; while
/// another process holds the turn, it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_is_vacuumed_once_its_dead_rows_are_due() {
    let (url, port, server, admin) = served("0").await;
    sent_and_gone(port, &url, SENT).await;
    drop(server);
    let dead = dead_rows(&url, SENT as i64).await;
    assert!(dead >= SENT as i64, "the deleted rows are dead: {dead}");

    let store = aqgate_store::open(&url).await.expect("store");
    // Not due at a threshold above what there is (its statistics are, and are gathered).
    let none = store.vacuum(dead + 1, 0.0).await.expect("vacuum");
    assert!(none.iter().all(|v| v.table != "messages" || !v.vacuumed), "{none:?}");
    // Another process's turn: nothing done, nothing waited for.
    let mut other = admin.acquire().await.expect("connection");
    let key: i64 = 0x6171_6761_7465_7663;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(key).execute(&mut *other).await.expect("lock");
    assert_eq!(store.vacuum(10_000, 0.2).await.expect("vacuum"), Vec::new(), "another holds the turn");
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(key).execute(&mut *other).await.expect("unlock");
    drop(other);

    let (_, analyzed_before) = last_vacuum_and_analyze(&admin).await;
    let done = store.vacuum(10_000, 0.2).await.expect("vacuum");
    let m = done.iter().find(|v| v.table == "messages").unwrap_or_else(|| panic!("messages vacuumed: {done:?}"));
    assert!(m.dead >= SENT as i64 && m.vacuumed, "{m:?}");
    let (vacuumed, analyzed) = last_vacuum_and_analyze(&admin).await;
    assert!(
        vacuumed.is_some() && analyzed.is_some() && analyzed != analyzed_before,
        "VACUUM (ANALYZE) ran: {vacuumed:?} {analyzed:?} (analyzed before: {analyzed_before:?})"
    );
    // The dead rows are gone: not due any more.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dead: i64 = sqlx::query_scalar("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages'")
            .fetch_one(&admin)
            .await
            .expect("dead rows");
        if dead < 1_000 {
            break;
        }
        assert!(Instant::now() < deadline, "dead rows after VACUUM: {dead}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let again = store.vacuum(10_000, 0.2).await.expect("vacuum");
    assert!(again.iter().all(|v| v.table != "messages"), "{again:?}");
}

/// A table filled by inserts has no dead rows, but its statistics still say it is as small
/// as it was: it is analyzed, not vacuumed; changed as much again at once, it is not
/// analyzed again within the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_filled_since_its_statistics_is_analyzed() {
    let (url, port, server, admin) = served("0").await;
    sent(port, SENT).await;
    drop(server);
    let changed = counted(&url, "n_mod_since_analyze", SENT as i64).await;
    assert!(changed >= SENT as i64, "the inserted rows count as changed: {changed}");
    let planned = || async {
        sqlx::query_scalar::<_, f32>("SELECT reltuples FROM pg_class WHERE relname = 'messages'")
            .fetch_one(&admin)
            .await
            .expect("reltuples")
    };
    assert!(planned().await < SENT as f32 / 2.0, "the planner's statistics predate the rows");

    let store = aqgate_store::open(&url).await.expect("store");
    // Its dead rows are not due; its statistics are.
    let done = store.vacuum(10_000, 0.2).await.expect("vacuum");
    let m = done.iter().find(|v| v.table == "messages").unwrap_or_else(|| panic!("messages analyzed: {done:?}"));
    assert!(!m.vacuumed && m.changed >= SENT as i64 && m.dead < 10_000, "{m:?}");
    let (vacuumed, analyzed) = last_vacuum_and_analyze(&admin).await;
    assert!(vacuumed.is_none() && analyzed.is_some(), "ANALYZE alone ran: {vacuumed:?} {analyzed:?}");
    let rows = planned().await;
    assert!(rows >= SENT as f32 * 0.9, "the planner now counts the rows: {rows}");
    // Changed as much again at once: not analyzed again so soon.
    let again_served = serve(&url, port, "0");
    sent(port, SENT).await;
    drop(again_served);
    let changed = counted(&url, "n_mod_since_analyze", SENT as i64).await;
    assert!(changed >= SENT as i64, "changed again: {changed}");
    let again = store.vacuum(10_000, 0.2).await.expect("vacuum");
    assert!(again.iter().all(|v| v.table != "messages"), "{again:?}");
}

/// `aqgate serve --vacuum-every 1` vacuums by itself: logged, counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_vacuums_its_tables_by_itself() {
    let (url, port, server, _admin) = served("1").await;
    sent_and_gone(port, &url, SENT).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = |metrics: &str, name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in /metrics: {metrics}"))
    };
    loop {
        let (status, metrics) = common::http_get(port, "/metrics").expect("/metrics");
        assert_eq!(status, 200, "{metrics}");
        if count(&metrics, "aqgate_database_vacuums_total ") >= 1 {
            assert!(count(&metrics, "aqgate_database_vacuumed_rows_total ") >= SENT as u64, "{metrics}");
            break;
        }
        assert!(Instant::now() < deadline, "no vacuum within 60 s: {}", server.log_tail(20));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = server.log();
    assert!(
        log.contains("vacuumed") && (log.contains("table=\"messages\"") || log.contains("table=messages")),
        "{log}"
    );
}
