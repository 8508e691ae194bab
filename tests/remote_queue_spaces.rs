//! Remote queue spaces through two real `aqgate serve` processes: A (SQLite) maps the space
//! `HQ` to queues of B (PostgreSQL). A client sends to `HQ.ORDERS` on A; with
//! `store_and_forward` the message is committed there with the client's transaction and
//! arrives once at B's `AQUSER.RAW_QUE`; each schedule form of a synchronous send gives its
//! delay at B; each limit is refused whole at A; dequeue and
//! registration are refused; B's refusal lands in the space's exception queue with B's
//! code; B down, then up: the message arrives once.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

/// A store-and-forward space's key.
const SAF: &str = "store_and_forward = true";

const PASSWORD_ENV: &str = "AQGATE_TEST_REMOTE_PASSWORD";

/// A's server time zone (POSIX: three hours east of UTC), for `HH:MM` schedules.
const SERVER_TZ: &str = "XYZ-3";
const SERVER_OFFSET: i64 = 3 * 3600;

/// The demo topology and the space `HQ` on B at `port`.
/// `mode`: extra keys of the space (`store_and_forward = true`, or "" for a synchronous one).
fn space_topology(port: u16, backoff_ms: u64, mode: &str) -> std::path::PathBuf {
    let space = format!(
        r#"
[[remote_queue_spaces]]
name = "HQ"
url = "http://127.0.0.1:{port}/aqserv"
agent = "scott"
password_env = "{PASSWORD_ENV}"
max_message_size = 16
payload_types = ["RAW"]
retry_backoff_ms = {backoff_ms}
{mode}
queues = [
  {{ name = "ORDERS", remote = "AQUSER.RAW_QUE" }},
  {{ name = "MISSING", remote = "AQUSER.NO_SUCH_QUEUE" }},
]

[[grants]]
user = "AQUSER"
queue = "HQ.ORDERS"
privilege = "enqueue"

[[grants]]
user = "AQUSER"
queue = "HQ.MISSING"
privilege = "enqueue"

[[grants]]
user = "AQUSER"
queue = "HQ.MISSING$E"
privilege = "dequeue"
"#
    );
    topology_file(&space)
}

fn topology_file(extra: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir()
        .join(format!("aqgate-test-remote-space-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::write(&p, format!("{}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    p
}

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (remote queue space)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .env(PASSWORD_ENV, "tiger")
            .env("TZ", SERVER_TZ),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// A (SQLite, the space) and B (PostgreSQL, the remote), with their databases.
struct Pair {
    a: Proc,
    _b: Proc,
    a_db: String,
    b_db: String,
    a_port: u16,
    b_port: u16,
    files: Vec<std::path::PathBuf>,
}

impl Pair {
    async fn start(mode: &str) -> Self {
        let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Postgres).await);
        let (a_port, b_port) = (free_port(), free_port());
        let (a_topo, b_topo) = (space_topology(b_port, 1000, mode), topology_file(""));
        let b = serve(&b_db, b_port, &b_topo);
        let a = serve(&a_db, a_port, &a_topo);
        Self { a, _b: b, a_db, b_db, a_port, b_port, files: vec![a_topo, b_topo] }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// One IDAP request as scott with extra HTTP headers (no session kept).
async fn send_with(port: u16, headers: &[(&str, &str)], body: &str) -> Response {
    let mut rb = idap_request(&reqwest::Client::new(), &aqserv(port), SCOTT, body.to_string());
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.expect("post");
    assert_eq!(r.status(), 200);
    parse_idap(&r.bytes().await.expect("body"))
}

fn fault_of(r: &Response) -> (i32, String) {
    match r {
        Response::Fault(f) => (f.code, f.message.clone()),
        other => panic!("not a fault: {other:?}"),
    }
}

/// Every (correlation, payload) in `queue` (received and committed as scott).
async fn drain(port: u16, queue: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        match &r {
            Response::Receive(_, Some(_)) => {
                out.extend(received(&r).iter().map(|m| (m.header.correlation.clone(), raw_of(m))))
            }
            Response::Fault(f) if f.code == code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

fn payloads(got: &[(Option<String>, String)]) -> BTreeSet<String> {
    let set: BTreeSet<String> = got.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(set.len(), got.len(), "no message twice: {got:?}");
    set
}

/// HTTP headers, the request, the fault's code and what its text says.
type Refusal = (Vec<(&'static str, &'static str)>, String, i32, String);

/// A message's name (its correlation), the schedule headers, its IDAP `delay` element, and
/// when it may be dequeued at the remote.
type ScheduleCase = (&'static str, Vec<(&'static str, String)>, &'static str, chrono::DateTime<chrono::Utc>);

/// A metric with its job label.
fn job_metric(port: u16, name: &str, job: &str) -> i64 {
    metric(port, &format!("{name}{{job=\"{job}\"}}"))
}

/// Waits until `f` holds, at most `within`.
fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_name_forwards_committed_messages_once_and_refuses_what_the_space_does_not_take() {
    let p = Pair::start(SAF).await;
    let (a, b) = (p.a_port, p.b_port);

    // Store and forward, with the client's transaction: an uncommitted send stays here
    // while a committed one after it goes.
    let mut cookie = None;
    let r =
        idap_in(a, SCOTT, &mut cookie, &raw_send("HQ.ORDERS", &[("<correlation>later</correlation>", "01")], "")).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    assert!(cookie.is_some(), "an open transaction");
    let r = http(a, &raw_send("HQ.ORDERS", &[("<correlation>first</correlation>", "02")], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&p.b_db, "AQUSER.RAW_QUE", 1, Duration::from_secs(30));
    let r = idap_in(a, SCOTT, &mut cookie, &envelope(COMMIT)).await;
    assert!(matches!(r, Response::Commit(..)), "{r:?}");
    let ten: Vec<String> = (0..10).map(|i| format!("{:04X}", 0x1000 + i)).collect();
    let msgs: Vec<(&str, &str)> = ten.iter().map(|x| ("", x.as_str())).collect();
    let r = send_with(a, &[], &raw_send("HQ.ORDERS", &msgs, COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 10);
    wait_depth(&p.b_db, "AQUSER.RAW_QUE", 12, Duration::from_secs(30));
    wait_depth(&p.a_db, "HQ.ORDERS", 0, Duration::from_secs(10));
    let got = drain(b, "AQUSER.RAW_QUE").await;
    let mut want: BTreeSet<String> = ten.iter().cloned().collect();
    want.extend(["01".to_string(), "02".to_string()]);
    assert_eq!(payloads(&got), want, "each message once");
    assert_eq!(got[0], (Some("first".into()), "02".into()), "the committed one first: {got:?}");
    assert_eq!(job_metric(a, "aqgate_propagation_messages_total", "HQ.ORDERS"), 12);

    // `admin jobs` shows the implicit jobs.
    let out = std::process::Command::new(BIN).args(["admin", "jobs", "--database", &p.a_db]).output().expect("jobs");
    let listing = String::from_utf8_lossy(&out.stdout);
    let row: Vec<&str> =
        listing.lines().find(|l| l.starts_with("HQ.ORDERS ")).expect(&listing).split_whitespace().collect();
    let remote_url = format!("http://127.0.0.1:{b}/aqserv");
    // The destination `URL QUEUE` is one field, its space escaped.
    let destination = format!("{remote_url}\\x20AQUSER.RAW_QUE");
    assert_eq!(row[..5], ["HQ.ORDERS", "RUNNING", "space", "HQ.ORDERS", &destination], "{listing}");
    assert_eq!(row[9], "0", "the backlog: {listing}");
    assert!(listing.lines().any(|l| l.starts_with("HQ.MISSING ")), "{listing}");
    // They follow their space: `--disable` names them, and says why it does not apply.
    let out = std::process::Command::new(BIN)
        .args(["admin", "jobs", "--database", &p.a_db, "--disable", "hq.orders"])
        .output()
        .expect("jobs --disable");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("drains a queue of remote queue space HQ: it follows the space"),
        "{said}"
    );

    // Limits and faults: the whole request is refused, with a valid message in it too.
    let ok = ("", "0A0B");
    let refused: Vec<Refusal> = vec![
        (
            vec![],
            raw_send("HQ.ORDERS", &[ok, ("", "000102030405060708090A0B0C0D0E0F10")], COMMIT),
            code::INVALID_VALUE,
            "message 2: the payload of 17 bytes is larger than remote queue space HQ takes (max_message_size 16)"
                .into(),
        ),
        (
            vec![],
            jms_send("HQ.ORDERS"),
            code::PAYLOAD_MISMATCH,
            "HQ.ORDERS of remote queue space HQ takes RAW payloads (payload_type)".into(),
        ),
        (
            vec![],
            raw_send("HQ.ORDERS", &[ok, ("<delay>86401</delay>", "0C")], COMMIT),
            code::INVALID_VALUE,
            "message 2: delay: a delay of 86401 s is more than remote queue space HQ takes (max_delay 86400 s)".into(),
        ),
        (
            vec![("aq-schedule", "R:24:01")],
            raw_send("HQ.ORDERS", &[ok], COMMIT),
            code::INVALID_VALUE,
            "AQ-Schedule R:24:01: a delay of 86460 s is more than remote queue space HQ takes (max_delay 86400 s)"
                .into(),
        ),
        (
            vec![("aq-schedule", "R:01:00")],
            raw_send("HQ.ORDERS", &[ok, ("<delay>5</delay>", "0C")], COMMIT),
            code::INVALID_VALUE,
            "message 2: the message has a delay and the request an AQ-Schedule".into(),
        ),
        (
            vec![("aq-schedule", "25:00")],
            raw_send("HQ.ORDERS", &[ok], COMMIT),
            code::INVALID_VALUE,
            "AQ-Schedule 25:00: expected HH:MM, R:HH:MM, L:HH:MM or an RFC 3339 timestamp".into(),
        ),
        (
            vec![("aq-schedule", "L:10:00")],
            raw_send("HQ.ORDERS", &[ok], COMMIT),
            code::INVALID_VALUE,
            "an L: schedule needs the AQ-Client-Timezone header".into(),
        ),
        (
            vec![("aq-schedule", "L:10:00"), ("aq-client-timezone", "CET")],
            raw_send("HQ.ORDERS", &[ok], COMMIT),
            code::INVALID_VALUE,
            "AQ-Client-Timezone CET: expected a UTC offset".into(),
        ),
        (
            vec![("aq-schedule", "R:00:10")],
            raw_send("AQUSER.RAW_QUE", &[ok], COMMIT),
            code::INVALID_VALUE,
            "AQ-Schedule applies to the queues of remote queue spaces, and AQUSER.RAW_QUE is not one".into(),
        ),
        (
            vec![],
            raw_send("HQ.NOPE", &[ok], COMMIT),
            code::NO_SUCH_QUEUE,
            "queue HQ.NOPE does not exist: remote queue space HQ maps no such queue (it maps HQ.MISSING, HQ.ORDERS)"
                .into(),
        ),
        (vec![], raw_send("XX.ORDERS", &[ok], COMMIT), code::NO_SUCH_QUEUE, "queue XX.ORDERS does not exist".into()),
        (
            vec![],
            receive("HQ.ORDERS", "<wait_time>0</wait_time>", COMMIT),
            code::DEQUEUE_DISABLED,
            format!(
                "dequeue from HQ.ORDERS is not offered: it is a queue of remote queue space HQ, forwarded to AQUSER.RAW_QUE at {remote_url}"
            ),
        ),
        (
            vec![],
            register("HQ.ORDERS"),
            code::DEQUEUE_DISABLED,
            "registering for notifications on HQ.ORDERS is not offered".into(),
        ),
        (
            vec![("aq-schedule", "R:00:10")],
            receive("HQ.MISSING$E", "<wait_time>0</wait_time>", COMMIT),
            code::INVALID_VALUE,
            "AQ-Schedule applies to AQXmlSend and AQXmlPublish only".into(),
        ),
    ];
    for (headers, body, want_code, want_text) in &refused {
        let (c, text) = fault_of(&send_with(a, headers, body).await);
        assert_eq!(c, *want_code, "{headers:?} {text}");
        assert!(text.contains(want_text.as_str()), "{headers:?}: {text}");
    }
    // Nothing of them was enqueued: a message after them is the only one that arrives.
    let r = http(a, &raw_send("HQ.ORDERS", &[("<correlation>marker</correlation>", "0D")], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&p.b_db, "AQUSER.RAW_QUE", 1, Duration::from_secs(30));
    assert_eq!(drain(b, "AQUSER.RAW_QUE").await, [(Some("marker".into()), "0D".into())]);
    assert_eq!(depth(&p.a_db, "HQ.ORDERS"), 0);

    // The remote refuses for good (no such queue there): the message goes to the space's
    // exception queue with the remote's code and text as its correlation; the job goes on.
    let r = http(a, &raw_send("HQ.MISSING", &[("<correlation>lost</correlation>", "0E")], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&p.a_db, "HQ.MISSING$E", 1, Duration::from_secs(30));
    let rejected = drain(a, "HQ.MISSING$E").await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let reason = rejected[0].0.clone().unwrap_or_default();
    assert!(reason.starts_with("remote fault 24010: queue AQUSER.NO_SUCH_QUEUE does not exist"), "{reason}");
    assert_eq!(rejected[0].1, "0E");
    assert_eq!(job_metric(a, "aqgate_propagation_exceptions_total", "HQ.MISSING"), 1);
    assert!(p.a.log().contains("the remote refused a message for good"), "logged");
    let r = http(a, &raw_send("HQ.ORDERS", &[("", "0F")], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&p.b_db, "AQUSER.RAW_QUE", 1, Duration::from_secs(30));
    drop(p);
}

fn jms_send(dest: &str) -> String {
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header/><message_payload><jms_text_message><text_data>hi</text_data></jms_text_message></message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
    ))
}

fn register(dest: &str) -> String {
    envelope(&format!(
        r#"<AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{dest}</destination><consumer_name>APP</consumer_name><notify_url>http://127.0.0.1:9/hook</notify_url></register_options><AQXmlCommit/></AQXmlRegister>"#
    ))
}

/// (correlation, delay_until in µs) of the messages in `queue` of the PostgreSQL `db`.
async fn stored_delays(db: &str, queue: &str) -> Vec<(Option<String>, Option<i64>)> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db).await.expect("connect");
    sqlx::query_as(
        "SELECT m.corrid, m.delay_until FROM messages m JOIN queues q ON q.id = m.queue_id WHERE q.name = $1",
    )
    .bind(queue)
    .fetch_all(&mut c)
    .await
    .expect("messages")
}

/// Each schedule form leaves at once and waits at the remote until its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_schedule_form_gives_its_delay_at_the_remote() {
    use chrono::{DateTime, Duration as D, FixedOffset, Timelike, Utc};
    let p = Pair::start("").await;
    let now = Utc::now();
    let minute = |t: DateTime<Utc>| t.with_second(0).and_then(|t| t.with_nanosecond(0)).expect("a minute");
    let server = FixedOffset::east_opt(i32::try_from(SERVER_OFFSET).expect("offset")).expect("zone");
    let client = FixedOffset::west_opt(5 * 3600).expect("zone");
    let hhmm = |t: DateTime<Utc>, z: FixedOffset| t.with_timezone(&z).format("%H:%M").to_string();
    let in_two_hours = minute(now + D::hours(2));
    let an_hour_ago = minute(now - D::hours(1));
    let in_three_hours = minute(now + D::hours(3));
    let iso = (now + D::hours(4)).with_timezone(&FixedOffset::east_opt(7200).expect("zone"));
    let cases: Vec<ScheduleCase> = vec![
        ("hhmm", vec![("aq-schedule", hhmm(in_two_hours, server))], "", in_two_hours),
        ("passed", vec![("aq-schedule", hhmm(an_hour_ago, server))], "", an_hour_ago + D::days(1)),
        (
            "local",
            vec![
                ("aq-schedule", format!("L:{}", hhmm(in_three_hours, client))),
                ("aq-client-timezone", "-05:00".into()),
            ],
            "",
            in_three_hours,
        ),
        ("relative", vec![("aq-schedule", "R:01:30".into())], "", now + D::seconds(5400)),
        ("iso", vec![("aq-schedule", iso.to_rfc3339())], "", iso.with_timezone(&Utc)),
        ("delay", vec![], "<delay>600</delay>", now + D::seconds(600)),
    ];
    for (name, headers, delay, _) in &cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let header = format!("<correlation>{name}</correlation>{delay}");
        let r = send_with(p.a_port, &headers, &raw_send("HQ.ORDERS", &[(&header, "AB")], COMMIT)).await;
        assert_eq!(sent_ids(&r).len(), 1, "{name}: {r:?}");
    }
    // They leave at once and wait there (WAITING: no receive takes them yet).
    wait_depth(&p.b_db, "AQUSER.RAW_QUE", cases.len() as i64, Duration::from_secs(30));
    let (c, _) = fault_of(&http(p.b_port, &receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT)).await);
    assert_eq!(c, code::NO_MESSAGE, "all of them are waiting");
    let stored = stored_delays(&p.b_db, "AQUSER.RAW_QUE").await;
    for (name, _, _, at) in &cases {
        let until = stored
            .iter()
            .find(|(c, _)| c.as_deref() == Some(name))
            .and_then(|(_, d)| *d)
            .unwrap_or_else(|| panic!("{name} has no delay at the remote: {stored:?}"));
        let off = (until - at.timestamp_micros()) as f64 / 1e6;
        assert!((-2.0..=10.0).contains(&off), "{name}: ready at the remote {off} s from its schedule");
    }

    // Under an Idempotency-Key the schedule is part of the request.
    let body = raw_send("HQ.ORDERS", &[("", "CD")], COMMIT);
    let keyed = |schedule: &'static str| {
        idap_request(&reqwest::Client::new(), &aqserv(p.a_port), SCOTT, body.clone())
            .header("idempotency-key", "rqs-schedule-1")
            .header("aq-schedule", schedule)
            .send()
    };
    let first = keyed("R:00:01").await.expect("post");
    assert!(first.headers().get("idempotent-replayed").is_none());
    let again = keyed("R:00:01").await.expect("post");
    assert_eq!(again.headers().get("idempotent-replayed").map(|v| v.as_bytes()), Some(&b"true"[..]));
    assert_eq!(keyed("R:00:02").await.expect("post").status(), 422, "another schedule is another request");
    drop(p);
}

/// B down: the messages wait in A while the job retries; B up: each arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_down_then_up_gets_each_message_once() {
    let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Postgres).await);
    let (a_port, b_port) = (free_port(), free_port());
    let (a_topo, b_topo) = (space_topology(b_port, 200, SAF), topology_file(""));
    let a = serve(&a_db, a_port, &a_topo);
    let five: Vec<String> = (0..5).map(|i| format!("{:02X}", 0x50 + i)).collect();
    let msgs: Vec<(&str, &str)> = five.iter().map(|x| ("", x.as_str())).collect();
    assert_eq!(sent_ids(&http(a_port, &raw_send("HQ.ORDERS", &msgs, COMMIT)).await).len(), 5);
    wait_until("the job failed and retries", Duration::from_secs(30), || {
        job_metric(a_port, "aqgate_propagation_failures_total", "HQ.ORDERS") >= 3
    });
    assert_eq!(depth(&a_db, "HQ.ORDERS"), 5, "they wait here");
    assert_eq!(depth(&a_db, "HQ.ORDERS$E"), 0, "a transient failure is no refusal");
    let b = serve(&b_db, b_port, &b_topo);
    wait_depth(&b_db, "AQUSER.RAW_QUE", 5, Duration::from_secs(60));
    wait_depth(&a_db, "HQ.ORDERS", 0, Duration::from_secs(10));
    let got = drain(b_port, "AQUSER.RAW_QUE").await;
    assert_eq!(payloads(&got), five.into_iter().collect::<BTreeSet<_>>());
    drop((a, b));
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
}

/// A local propagation job into a mapped queue carries each message's delay end: what
/// remains of it is the relative delay the message leaves with, so the space's `max_delay`
/// refuses more (the job's exception queue takes the message), as it refuses a client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_job_into_a_mapped_queue_cannot_carry_more_than_max_delay() {
    let a_db = fresh_url(Backend::Sqlite).await;
    let a_port = free_port();
    let a_topo = space_topology(free_port(), 1000, "");
    let spec = std::fs::read_to_string(&a_topo).expect("topology");
    let job = r#"
[[queues]]
name = "AQUSER.RAW_REJECTS"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "up"
source = "AQUSER.RAW_QUE"
destination = "HQ.ORDERS"
exception_queue = "AQUSER.RAW_REJECTS"
"#;
    std::fs::write(&a_topo, format!("{spec}\n{job}")).expect("write");
    let a = serve(&a_db, a_port, &a_topo);
    // max_delay is a day: 30 days are refused; an hour is taken.
    let msgs = [("<delay>2592000</delay><correlation>MONTH</correlation>", "01"), ("<delay>3600</delay>", "02")];
    let r = http(a_port, &raw_send("AQUSER.RAW_QUE", &msgs[..1], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&a_db, "AQUSER.RAW_REJECTS", 1, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "HQ.ORDERS"), 0, "{}", a.log_tail(20));
    assert!(a.log().contains("max_delay 86400 s"), "{}", a.log_tail(20));
    let r = http(a_port, &raw_send("AQUSER.RAW_QUE", &msgs[1..], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1);
    wait_depth(&a_db, "HQ.ORDERS", 1, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "AQUSER.RAW_QUE"), 0);
    assert_eq!(depth(&a_db, "AQUSER.RAW_REJECTS"), 1);
    drop(a);
    let _ = std::fs::remove_file(a_topo);
}
