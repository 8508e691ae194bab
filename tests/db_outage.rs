//! A database outage through the real binary on PostgreSQL: the database made to refuse
//! writes as a standby does during a failover (`default_transaction_read_only` and its
//! connections ended), and the connection to it cut by a proxy. `/readyz` turns 503 within
//! seconds, saying why, and answers every time within 500 ms however many ask (one check
//! runs at a time); a send is refused with fault 1034 and HTTP 503 (never the generic 600);
//! the log says once that the database went away and once that it came back, with how
//! long it was away; `/metrics` counts one outage; and once the database is back, sends
//! succeed without a restart. A job's batch whose end the outage cut (neither its commit nor
//! its rollback reached the database) moves again as soon as the database is back, not when
//! its session times out.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::cutproxy::CutProxy;
use common::*;
use sqlx::Connection;

fn serve(db: &str, port: u16) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (database outage)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db]).env("RUST_LOG", "info"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// `/readyz`, timed: status, body, how long it took.
async fn readyz(port: u16) -> (u16, String, Duration) {
    let t = Instant::now();
    let (st, body) =
        tokio::task::spawn_blocking(move || http_get(port, "/readyz")).await.expect("readyz").expect("an answer");
    (st, body, t.elapsed())
}

/// Polls `/readyz` until it answers `status` (every answer within 500 ms); its body.
async fn readyz_until(port: u16, status: u16, within: Duration) -> String {
    readyz_until_says(port, status, "", within).await
}

/// [`readyz_until`] an answer whose body says `says` too: the first failure /readyz sees may
/// be the connections ending, before the new ones find out why.
async fn readyz_until_says(port: u16, status: u16, says: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (st, body, took) = readyz(port).await;
        assert!(took < Duration::from_millis(500), "/readyz took {took:?} ({st} {body})");
        if st == status && body.contains(says) {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz not {status} saying {says:?} within {within:?}: {st} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One committed send of a RAW message to AQUSER.RAW_QUE: HTTP status, Retry-After, answer.
async fn send(port: u16, hex: &str) -> (u16, Option<String>, Response) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let r = idap_request(&client, &aqserv(port), SCOTT, raw_send("AQUSER.RAW_QUE", &[("", hex)], COMMIT))
        .send()
        .await
        .expect("an answer");
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
    let body = r.bytes().await.expect("body");
    (status, retry_after, parse_idap(&body))
}

/// Runs `sql` on the server's administrative database.
async fn admin_sql(sql: &str) {
    let mut c = sqlx::PgConnection::connect(&pg_admin_url()).await.expect("admin connection");
    sqlx::query(sql).execute(&mut c).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Ends every connection to database `name` (aqgate's pool among them).
async fn end_connections(name: &str) {
    admin_sql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    ))
    .await;
}

/// How many readiness checks the database `url` has committed.
async fn checks_committed(url: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT n FROM store_probe WHERE id = 1").fetch_one(&mut c).await.expect("store_probe")
}

/// The value of an unlabelled gauge or counter in `/metrics`, as text.
fn metric_text(port: u16, name: &str) -> String {
    let (status, text) = http_get(port, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "/metrics answers during an outage too: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn lines_with(log: &str, needle: &str) -> Vec<String> {
    log.lines().filter(|l| l.contains(needle)).map(String::from).collect()
}

/// The outage's lines in the log are one each way, no request logged a store failure, and
/// aqgate's own warnings are a handful (the connections lost), not one per second or request.
fn assert_logged_once(p: &Proc, back: bool) {
    let log = p.log();
    let down = lines_with(&log, "database unavailable:");
    assert_eq!(down.len(), 1, "one line when the database went away: {down:#?}\n{}", p.log_tail(40));
    assert!(down[0].contains("ERROR"), "{}", down[0]);
    let up = lines_with(&log, "database available again after");
    assert_eq!(up.len(), usize::from(back), "{up:#?}\n{}", p.log_tail(40));
    if back {
        assert!(up[0].contains("INFO") && up[0].contains(" s"), "{}", up[0]);
    }
    // No storm: the duties wait for the database, the requests log at debug.
    let warnings = lines_with(&log, " WARN aqgate");
    assert!(warnings.len() <= 6, "warnings during the outage: {warnings:#?}");
    let failures = lines_with(&log, "store failure");
    assert!(failures.is_empty(), "requests refused for the outage log no store failure: {failures:#?}");
}

/// A send during the outage: 503 with Retry-After and fault 1034 that says to retry.
async fn assert_refused_for_the_outage(port: u16) {
    let (status, retry_after, answer) = send(port, "0BAD").await;
    match answer {
        Response::Fault(f) => {
            assert_eq!(f.code, code::STORE_UNAVAILABLE, "{f:?}");
            assert_ne!(f.code, code::INTERNAL);
            assert!(f.message.contains("unavailable") && f.message.contains("retry"), "{}", f.message);
            assert!(f.message.contains("Idempotency-Key"), "{}", f.message);
        }
        other => panic!("a send while the database refuses writes: {other:?}"),
    }
    assert_eq!(status, 503);
    assert!(retry_after.is_some(), "Retry-After");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_that_refuses_writes_is_not_ready_and_its_outage_is_logged_once_each_way() {
    let db = fresh_pg_url().await;
    let name = db.rsplit_once('/').map(|(_, n)| n.to_string()).expect("a database name");
    let port = free_port();
    let p = serve(&db, port);

    // Ready; a send succeeds; many /readyz at once cost at most a check or two.
    assert_eq!(readyz(port).await.0, 200);
    assert!(matches!(send(port, "0001").await.2, Response::Send(..)));
    let before = checks_committed(&db).await;
    let many: Vec<_> = (0..64).map(|_| tokio::spawn(readyz(port))).collect();
    for r in many {
        let (st, body, took) = r.await.expect("readyz");
        assert_eq!(st, 200, "{body}");
        assert!(took < Duration::from_millis(500), "/readyz took {took:?}");
    }
    let checks = checks_committed(&db).await - before;
    assert!(checks <= 3, "64 concurrent /readyz made {checks} checks");
    assert_eq!(metric(port, "aqgate_database_available"), 1);
    assert_eq!(metric(port, "aqgate_database_outages_total"), 0);

    // The database refuses writes, as a standby does while a failover promotes another;
    // aqgate's connections end and come back read-only.
    admin_sql(&format!("ALTER DATABASE {name} SET default_transaction_read_only = on")).await;
    end_connections(&name).await;
    let body = readyz_until_says(port, 503, "refuses writes", Duration::from_secs(10)).await;
    assert!(body.contains("database unavailable"), "/readyz says why: {body}");
    for _ in 0..3 {
        assert_refused_for_the_outage(port).await;
    }
    // Still not ready, each answer quick.
    for _ in 0..10 {
        let (st, body, took) = readyz(port).await;
        assert_eq!(st, 503, "{body}");
        assert!(took < Duration::from_millis(500), "/readyz took {took:?}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(metric(port, "aqgate_database_available"), 0);
    assert_eq!(metric(port, "aqgate_database_outages_total"), 1);
    let seconds: f64 = metric_text(port, "aqgate_database_outage_seconds").parse().expect("seconds");
    assert!(seconds > 1.0, "the outage's seconds so far: {seconds}");
    assert_logged_once(&p, false);

    // Writable again (the new primary): connections end and come back writable.
    admin_sql(&format!("ALTER DATABASE {name} RESET default_transaction_read_only")).await;
    end_connections(&name).await;
    readyz_until(port, 200, Duration::from_secs(15)).await;
    let answer = send(port, "0002").await;
    assert!(matches!(answer.2, Response::Send(..)), "a send once the database is back: {answer:?}");
    assert_eq!(answer.0, 200);
    assert_eq!(metric(port, "aqgate_database_available"), 1);
    assert_eq!(metric(port, "aqgate_database_outages_total"), 1);
    assert_logged_once(&p, true);
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 2, "the two sends that succeeded, and no other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_connection_is_an_outage_too() {
    let db = fresh_pg_url().await;
    let proxy = CutProxy::start(5432);
    let through = db.replacen("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port), 1);
    assert_ne!(through, db, "the URL names 127.0.0.1:5432: {db}");
    let port = free_port();
    let p = serve(&through, port);
    assert!(matches!(send(port, "0001").await.2, Response::Send(..)));

    // Every connection cut, new ones refused.
    proxy.refuse(true);
    proxy.cut();
    let body = readyz_until(port, 503, Duration::from_secs(10)).await;
    assert!(body.contains("database unavailable") || body.contains("database state unknown"), "{body}");
    assert_refused_for_the_outage(port).await;
    assert_eq!(metric(port, "aqgate_database_available"), 0);
    assert_logged_once(&p, false);

    proxy.refuse(false);
    readyz_until(port, 200, Duration::from_secs(15)).await;
    assert!(matches!(send(port, "0002").await.2, Response::Send(..)));
    assert_eq!(metric(port, "aqgate_database_outages_total"), 1);
    assert_logged_once(&p, true);
}

/// The database's port closed for good (the proxy gone: connections refused, which the
/// pool would try again for its whole acquire timeout): not ready within seconds, and a
/// send is refused with the outage's fault within seconds too, not after half a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_connection_is_refused_at_once() {
    let db = fresh_pg_url().await;
    let proxy = CutProxy::start(5432);
    let through = db.replacen("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port), 1);
    let port = free_port();
    let p = serve(&through, port);
    assert!(matches!(send(port, "0001").await.2, Response::Send(..)));

    drop(proxy);
    let body = readyz_until(port, 503, Duration::from_secs(10)).await;
    assert!(body.contains("database unavailable") || body.contains("database state unknown"), "{body}");
    for _ in 0..3 {
        let t = Instant::now();
        assert_refused_for_the_outage(port).await;
        assert!(t.elapsed() < Duration::from_secs(5), "refused after {:?}", t.elapsed());
    }
    assert_logged_once(&p, false);
}

/// A forwarding job's batch whose end an outage cut: the service took the message, then
/// the database went away, so the job's commit failed and so did its rollback. Once the
/// database is back, the job rolls the batch back before its next one, and the message goes
/// to the service again within seconds, with the default session timeout (300 s) that
/// would otherwise hold it locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_rollback_an_outage_cut_moves_again_once_the_database_is_back() {
    let db = fresh_pg_url().await;
    let proxy = Arc::new(CutProxy::start(5432));
    let through = db.replacen("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port), 1);
    // The service: each request's message id; the first request cuts the database (every
    // connection, new ones refused) before it answers 200.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s, cutter) = (seen.clone(), proxy.clone());
    let app = axum::Router::new().route(
        "/take",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let (s, cutter) = (s.clone(), cutter.clone());
            async move {
                let id = headers.get("aq-message-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let mut g = s.lock().expect("requests");
                if g.is_empty() {
                    cutter.refuse(true);
                    cutter.cut();
                }
                g.push(id);
                "<ack/>"
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let service = l.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(l, app).await });
    let topology = std::env::temp_dir()
        .join(format!("aqgate-test-db-outage-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    let job = format!(
        r#"
[[queues]]
name = "AQUSER.RAW_INBOX"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "take"
source = "AQUSER.RAW_INBOX"
forward = {{ url = "http://127.0.0.1:{service}/take" }}
"#
    );
    std::fs::write(&topology, format!("{}\n{job}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (a job's batch cut by an outage)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &through])
            .args(["--topology", topology.to_str().expect("utf-8"), "--notify-allow", "127.0.0.1"])
            .env("RUST_LOG", "info"),
    );
    p.wait_ready(port, Duration::from_secs(60));

    let send = raw_send("AQUSER.RAW_INBOX", &[("", "0A0B")], COMMIT);
    assert!(matches!(http(port, &send).await, Response::Send(..)));
    let requests = || seen.lock().expect("requests").len();
    wait_until("the service's first request", Duration::from_secs(30), || requests() >= 1);
    wait_until("the batch's failed rollback in the log", Duration::from_secs(30), || {
        p.log().contains("propagation batch rollback failed")
    });
    assert_eq!(requests(), 1, "nothing moves while the database is away");

    proxy.refuse(false);
    readyz_until(port, 200, Duration::from_secs(15)).await;
    wait_until("the message at the service again", Duration::from_secs(30), || requests() >= 2);
    wait_until("the source empty", Duration::from_secs(30), || depth(&db, "AQUSER.RAW_INBOX") == 0);
    let ids = seen.lock().expect("requests").clone();
    assert_eq!(ids.len(), 2, "once cut, once again: {ids:?}");
    assert!(!ids[0].is_empty() && ids[0] == ids[1], "the same message: {ids:?}");
    let _ = std::fs::remove_file(&topology);
}
