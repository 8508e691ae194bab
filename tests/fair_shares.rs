//! Fair shares between agents, through the real binary on SQLite and PostgreSQL: one agent
//! at its session limit (`--max-sessions-per-agent`, and the store-wide `--max-sessions`)
//! shuts out nobody else, and not its own requests that leave no session open; BROWSEs
//! under fresh `Idempotency-Key`s store nothing; an agent's idempotency records are capped
//! in number, a response over `--idempotency-max-response-bytes` (or past the agent's
//! bytes) is kept as a digest that its retry is told of, and a retried request still
//! replays.

mod common;

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

const QUEUE: &str = "AQUSER.RAW_QUE";
const JOHN: (&str, &str) = ("john", "welcome");

/// `aqgate serve` on `port` over `db` with `extra` arguments; waits until it listens.
fn serve(db: &str, port: u16, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db];
    args.extend(extra);
    let mut p = Proc::spawn("aqgate serve", &mut aqgate(&args));
    p.wait_port(port);
    p
}

/// One POST as `agent` in the session `cookie` holds (updated), optionally under an
/// idempotency key: status, `Retry-After`, whether it was a replay, body.
async fn post(
    port: u16,
    agent: (&str, &str),
    cookie: &mut Option<String>,
    key: Option<&str>,
    body: &str,
) -> (u16, Option<String>, bool, String) {
    let mut rb = idap_request(&reqwest::Client::new(), &aqserv(port), agent, body.to_string());
    if let Some(c) = cookie.as_ref() {
        rb = rb.header("cookie", c.clone());
    }
    if let Some(k) = key {
        rb = rb.header("idempotency-key", k);
    }
    let r = rb.send().await.expect("post");
    if let Some(c) = set_cookie(&r) {
        *cookie = Some(c);
    }
    let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(String::from);
    let (retry, replayed) = (header("retry-after"), header("idempotent-replayed").is_some());
    (r.status().as_u16(), retry, replayed, r.text().await.expect("body"))
}

fn fault_of(body: &str) -> (i32, String) {
    match parse_idap(body.as_bytes()) {
        Response::Fault(f) => (f.code, f.message),
        other => panic!("not a fault: {other:?}"),
    }
}

fn is_send(body: &str) -> bool {
    matches!(parse_idap(body.as_bytes()), Response::Send(..))
}

/// A send of one RAW message of `hex`, left open (no commit).
fn open_send(hex: &str) -> String {
    raw_send(QUEUE, &[("", hex)], "")
}

/// A send of one RAW message of `hex`, committed in the same request.
fn send_commit(hex: &str) -> String {
    raw_send(QUEUE, &[("", hex)], COMMIT)
}

/// `(rows, bytes of key and response)` of the idempotency table, read with SQL.
async fn records(db: &str) -> (i64, i64) {
    use sqlx::Connection;
    let sql = "SELECT count(*), coalesce(sum(length(key) + length(response)), 0) FROM idempotency";
    if db.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(db).await.expect("open sqlite");
        sqlx::query_as(sql).fetch_one(&mut c).await.expect("count")
    } else {
        let mut c = sqlx::PgConnection::connect(db).await.expect("connect postgres");
        sqlx::query_as(sql).fetch_one(&mut c).await.expect("count")
    }
}

/// `--max-sessions-per-agent 3 --max-sessions 5`: john holds three open sessions; his
/// fourth open send is refused (503, Retry-After, fault 18 naming the limit) and leaves
/// nothing, and the next one is refused before any of its work, while his send with its commit, scott's send with its commit and scott's own
/// open sessions are served; at five in the store, scott's third open send is refused by
/// the store-wide limit, and still not his committed one; once the sessions time out, john
/// may open another. Each refusal is counted in `/metrics`.
async fn one_agent_at_its_session_limit_shuts_out_nobody(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let _serve = serve(&db, port, &["--max-sessions-per-agent", "3", "--max-sessions", "5", "--session-timeout", "10"]);
    let mut john: [Option<String>; 3] = Default::default();
    for (i, c) in john.iter_mut().enumerate() {
        let (status, _, _, body) = post(port, JOHN, c, None, &open_send(&format!("0{i}"))).await;
        assert!(status == 200 && is_send(&body), "john's session {i}: {body}");
        assert!(c.is_some(), "an open session gets a cookie");
    }
    let mut fourth = None;
    let (status, retry, _, body) = post(port, JOHN, &mut fourth, None, &open_send("0A")).await;
    assert_eq!((status, retry.as_deref()), (503, Some("5")), "{body}");
    let (c, m) = fault_of(&body);
    assert_eq!(c, code::SESSION_LIMIT, "{m}");
    assert!(m.contains("agent JOHN holds 3 open sessions") && m.contains("--max-sessions-per-agent"), "{m}");
    assert!(m.contains("nothing of this request was performed"), "{m}");
    assert!(fourth.is_none(), "no cookie for a refused request");
    assert_eq!(metric(port, "aqgate_sessions_refused_total{limit=\"agent\"}"), 1);
    // Found at his limit, john's next request that would open a session is refused before
    // any of its work: a send to a queue that does not exist gets 18, not "no such queue".
    let nowhere = raw_send("AQUSER.NO_SUCH_QUE", &[("", "01")], "");
    let (status, _, _, body) = post(port, JOHN, &mut None, None, &nowhere).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(fault_of(&body).0, code::SESSION_LIMIT, "{body}");
    assert_eq!(metric(port, "aqgate_sessions_refused_total{limit=\"agent\"}"), 2);
    // Requests that open no session are served, john's own among them.
    let (status, _, _, body) = post(port, JOHN, &mut None, None, &send_commit("0B")).await;
    assert!(status == 200 && is_send(&body), "john's send with its commit: {body}");
    let (status, _, _, body) = post(port, SCOTT, &mut None, None, &send_commit("0C")).await;
    assert!(status == 200 && is_send(&body), "scott's send with its commit: {body}");
    assert_eq!(depth(&db, QUEUE), 2, "the two committed sends; nothing of the refused one");
    // Scott opens sessions of his own, up to the store-wide limit.
    let mut scott: [Option<String>; 2] = Default::default();
    for c in scott.iter_mut() {
        let (status, _, _, body) = post(port, SCOTT, c, None, &open_send("0D")).await;
        assert!(status == 200 && is_send(&body), "{body}");
    }
    let (status, _, _, body) = post(port, SCOTT, &mut None, None, &open_send("0E")).await;
    assert_eq!(status, 503, "{body}");
    let (c, m) = fault_of(&body);
    assert_eq!(c, code::SESSION_LIMIT, "{m}");
    assert!(m.contains("the store holds 5 open sessions") && m.contains("--max-sessions)"), "{m}");
    assert_eq!(metric(port, "aqgate_sessions_refused_total{limit=\"store\"}"), 1);
    let (status, _, _, body) = post(port, SCOTT, &mut None, None, &send_commit("0F")).await;
    assert!(status == 200 && is_send(&body), "a committed send is served at the store-wide limit too: {body}");
    // Open sessions carry on; once they time out (rolled back), john may open one again.
    let (status, _, _, body) = post(port, JOHN, &mut john[0], None, &envelope(COMMIT)).await;
    assert!(status == 200 && matches!(parse_idap(body.as_bytes()), Response::Commit(_)), "{body}");
    assert_eq!(depth(&db, QUEUE), 4, "three committed sends and john's committed session");
    let started = std::time::Instant::now();
    loop {
        let (status, _, _, body) = post(port, JOHN, &mut None, None, &open_send("10")).await;
        if status == 200 {
            assert!(is_send(&body), "{body}");
            break;
        }
        assert_eq!(fault_of(&body).0, code::SESSION_LIMIT, "{body}");
        assert!(started.elapsed() < std::time::Duration::from_secs(40), "the sessions never timed out");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_at_its_session_limit_shuts_out_nobody_sqlite() {
    one_agent_at_its_session_limit_shuts_out_nobody(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_at_its_session_limit_shuts_out_nobody_postgres() {
    one_agent_at_its_session_limit_shuts_out_nobody(Backend::Postgres).await;
}

/// A RAW payload of `n` bytes (2n hex digits), tagged by `tag` (one byte).
fn payload(tag: u8, n: usize) -> String {
    format!("{tag:02X}").repeat(n)
}

/// A committed REMOVE of the queue's next message.
fn take() -> String {
    receive(QUEUE, "<wait_time>0</wait_time>", COMMIT)
}

/// The idempotency records of one agent, through the real binary with small limits
/// (response 8,192 bytes, 5 records, 12,000 bytes per agent):
/// - 60 BROWSEs of a 100 kB message under fresh keys store no record at all;
/// - a committed REMOVE of that message under a key keeps a digest: its retry is told the
///   request was performed (24062, the size and SHA-256, the flag), and takes nothing more;
/// - REMOVEs of 3.5 kB messages are kept whole until the agent's bytes would pass 12,000,
///   then as digests; the whole ones replay byte for byte;
/// - a send under an old key replays; a new key past 5 records is refused (503, 24061)
///   and performs nothing, while another agent's keys and scott's requests without a key
///   are served.
async fn idempotency_records_are_bounded_per_agent(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let _serve = serve(
        &db,
        port,
        &[
            "--idempotency-max-response-bytes",
            "8192",
            "--idempotency-max-records-per-agent",
            "5",
            "--idempotency-max-bytes-per-agent",
            "12000",
        ],
    );
    let big = payload(0xB1, 100_000);
    let (status, _, _, body) = post(port, SCOTT, &mut None, Some("send-big"), &send_commit(&big)).await;
    assert!(status == 200 && is_send(&body), "{body}");
    assert_eq!(records(&db).await.0, 1);
    let browse = receive(QUEUE, "<wait_time>0</wait_time><dequeue_mode>BROWSE</dequeue_mode>", "");
    for i in 0..60 {
        let (status, _, replayed, body) = post(port, SCOTT, &mut None, Some(&format!("browse-{i}")), &browse).await;
        assert_eq!(status, 200, "{body}");
        assert!(!replayed);
        assert_eq!(raw_of(&received(&parse_idap(body.as_bytes()))[0]), big);
    }
    let (rows, bytes) = records(&db).await;
    assert_eq!(rows, 1, "no record for a browse: only the send's");
    assert!(bytes < 2_000, "{bytes}");
    assert_eq!(metric(port, "aqgate_idempotency_unrecorded_total"), 60);
    // Too large to keep: a digest, and its retry says so.
    let (status, _, _, first) = post(port, SCOTT, &mut None, Some("take-big"), &take()).await;
    assert_eq!(status, 200);
    assert_eq!(raw_of(&received(&parse_idap(first.as_bytes()))[0]), big);
    let (status, _, replayed, body) = post(port, SCOTT, &mut None, Some("take-big"), &take()).await;
    assert!(status == 200 && replayed, "{body}");
    let (c, m) = fault_of(&body);
    assert_eq!(c, code::IDEMPOTENCY_NOT_KEPT, "{m}");
    assert!(m.contains("was performed, and is not performed again"), "{m}");
    assert!(m.contains(&format!("({} bytes, SHA-256 ", first.len())), "{m}");
    assert!(m.contains("--idempotency-max-response-bytes (8192)"), "{m}");
    assert_eq!(depth(&db, QUEUE), 0, "taken once");
    assert_eq!(metric(port, "aqgate_idempotency_digested_total"), 1);
    let (rows, bytes) = records(&db).await;
    assert_eq!(rows, 2);
    assert!(bytes < 4_000, "{bytes}");
    // Kept whole until the agent's bytes run out.
    let mid = |t: u8| payload(t, 3_500);
    for t in [0xC1, 0xC2] {
        let (status, _, _, body) = post(port, SCOTT, &mut None, None, &send_commit(&mid(t))).await;
        assert!(status == 200 && is_send(&body), "{body}");
    }
    let (_, _, _, whole) = post(port, SCOTT, &mut None, Some("take-c1"), &take()).await;
    assert_eq!(raw_of(&received(&parse_idap(whole.as_bytes()))[0]), mid(0xC1));
    let (_, _, _, second) = post(port, SCOTT, &mut None, Some("take-c2"), &take()).await;
    assert_eq!(raw_of(&received(&parse_idap(second.as_bytes()))[0]), mid(0xC2));
    let (status, _, replayed, body) = post(port, SCOTT, &mut None, Some("take-c1"), &take()).await;
    assert!(status == 200 && replayed);
    assert_eq!(body, whole, "kept whole, replayed byte for byte");
    let (_, _, replayed, body) = post(port, SCOTT, &mut None, Some("take-c2"), &take()).await;
    assert!(replayed);
    let (c, m) = fault_of(&body);
    assert_eq!(c, code::IDEMPOTENCY_NOT_KEPT, "{m}");
    assert!(m.contains("agent SCOTT's records hold --idempotency-max-bytes-per-agent (12000 bytes)"), "{m}");
    assert_eq!(metric(port, "aqgate_idempotency_digested_total"), 2);
    // Four records so far; one more, then new keys are refused and perform nothing.
    let (status, _, _, sent) = post(port, SCOTT, &mut None, Some("send-6"), &send_commit("06")).await;
    assert!(status == 200 && is_send(&sent), "{sent}");
    assert_eq!(records(&db).await.0, 5);
    let (status, retry, _, body) = post(port, SCOTT, &mut None, Some("send-7"), &send_commit("07")).await;
    assert_eq!((status, retry.as_deref()), (503, Some("60")), "{body}");
    let (c, m) = fault_of(&body);
    assert_eq!(c, code::IDEMPOTENCY_LIMIT, "{m}");
    assert!(m.contains("agent SCOTT has 5 requests recorded") && m.contains("--idempotency-max-records-per-agent"));
    assert_eq!(metric(port, "aqgate_idempotency_refused_total"), 1);
    assert_eq!(depth(&db, QUEUE), 1, "send-6's message only");
    // A retry of a recorded request still replays; other requests are served.
    let (status, _, replayed, body) = post(port, SCOTT, &mut None, Some("send-6"), &send_commit("06")).await;
    assert!(status == 200 && replayed && body == sent, "{body}");
    let (status, _, replayed, body) = post(port, JOHN, &mut None, Some("send-7"), &send_commit("07")).await;
    assert!(status == 200 && !replayed && is_send(&body), "another agent's keys: {body}");
    let (status, _, _, body) = post(port, SCOTT, &mut None, None, &send_commit("08")).await;
    assert!(status == 200 && is_send(&body), "scott without a key: {body}");
    assert_eq!(depth(&db, QUEUE), 3);
    assert_eq!(records(&db).await.0, 6, "five of scott's, one of john's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_are_bounded_per_agent_sqlite() {
    idempotency_records_are_bounded_per_agent(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_are_bounded_per_agent_postgres() {
    idempotency_records_are_bounded_per_agent(Backend::Postgres).await;
}
