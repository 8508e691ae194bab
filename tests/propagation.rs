//! Propagation jobs in a real `aqgate serve`, on SQLite and PostgreSQL: queue to queue, a
//! multi-consumer source (the job sees only later messages), the selection rule, the
//! exception queue for messages the destination refuses, `/metrics`, kill -9 in the
//! middle of propagation (every message arrives exactly once), and a backlog moved in the
//! source's order.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use aqgate_proto::idap::Response;
use common::*;

/// Beside `RAW_QUEUES`.
const EXTRA: &str = r#"
[[queue_tables]]
name = "AQUSER.RAW_TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.RAW_TOPIC"
queue_table = "AQUSER.RAW_TOPIC_TAB"

[[subscribers]]
queue = "AQUSER.RAW_TOPIC"
name = "AUDIT"

[[queues]]
name = "AQUSER.RAW_FANOUT"
queue_table = "AQUSER.RAW_TOPIC_TAB"

[[subscribers]]
queue = "AQUSER.RAW_FANOUT"
name = "LOW"
rule = "priority < 5"

[[propagations]]
name = "archive"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
preserve_message_id = true
batch_size = 50

[[propagations]]
name = "fanout"
source = "AQUSER.RAW_INBOX"
destination = "AQUSER.RAW_FANOUT"
exception_queue = "AQUSER.RAW_REJECTS"
"#;

const TOPIC_JOB: &str = r#"
[[propagations]]
name = "topic_low"
source = "AQUSER.RAW_TOPIC"
destination = "AQUSER.RAW_ARCHIVE"
rule = "priority < 5"
"#;

fn topology_file(extra: &str) -> std::path::PathBuf {
    demo_topology_with("propagation", &format!("{EXTRA}\n{extra}"))
}

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (propagation)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")]),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// `aqgate admin messages QUEUE --json`: the rows of its `AQ$` view.
fn admin_messages(db: &str, queue: &str) -> Vec<serde_json::Value> {
    let out = aqgate(&["admin", "messages", queue, "--database", db, "--json"]).output().expect("admin messages");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("json")
}

/// Receives (and commits) everything in `queue` as scott: (correlation, payload, sender).
async fn drain(port: u16, queue: &str, consumer: Option<&str>) -> Vec<(Option<String>, String, Option<String>)> {
    let opts = consumer.map(|c| format!("<consumer_name>{c}</consumer_name>")).unwrap_or_default();
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, &format!("{opts}<wait_time>0</wait_time>"), COMMIT)).await;
        match &r {
            Response::Receive(_, Some(_)) => {
                for m in received(&r) {
                    let sender = m.header.sender_id.as_ref().and_then(|s| s.name.clone());
                    out.push((m.header.correlation.clone(), raw_of(&m), sender));
                }
            }
            Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

async fn queue_to_queue_and_the_exception_queue(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = topology_file("");
    let s = serve(&db, port, &topo);
    let ids = send_numbered(port, "AQUSER.RAW_QUE", 0, 120, 40, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 120, Duration::from_secs(30));
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 0, "moved, not copied");
    // Each copy names the message it copies and where that was (ORIGINAL_MSGID, here also
    // its correlation, and ORIGINAL_QUEUE_NAME).
    let listed = admin_messages(&db, "AQUSER.RAW_ARCHIVE");
    assert_eq!(listed.len(), 120);
    for r in &listed {
        assert_eq!((&r["ORIGINAL_MSGID"], r["ORIGINAL_QUEUE_NAME"].as_str()), (&r["CORR_ID"], Some("AQUSER.RAW_QUE")));
        assert!(r["EXPIRATION_REASON"].is_null(), "{r}");
    }
    let got = drain(port, "AQUSER.RAW_ARCHIVE", None).await;
    // preserve_message_id: the source message id is the correlation; payloads and the
    // original sender are kept.
    let corr: BTreeSet<String> = got.iter().filter_map(|(c, _, _)| c.clone()).collect();
    assert_eq!(corr, ids.iter().cloned().collect::<BTreeSet<_>>());
    let payloads: BTreeSet<String> = got.iter().map(|(_, p, _)| p.clone()).collect();
    assert_eq!(payloads, (0..120).map(hex).collect::<BTreeSet<_>>());
    assert!(got.iter().all(|(_, _, s)| s.as_deref() == Some("SCOTT")), "{:?}", &got[..3]);

    // The destination is multi-consumer with one subscriber for priority < 5: a message of
    // priority 9 has no recipient there, and goes to the exception queue; the job goes on.
    // Its exception copy is there to be looked at now: no delay, no expiry.
    send_numbered(port, "AQUSER.RAW_INBOX", 1000, 1, 1, "<priority>1</priority>").await;
    send_numbered(
        port,
        "AQUSER.RAW_INBOX",
        2000,
        1,
        1,
        "<priority>9</priority><delay>3600</delay><expiration>5</expiration>",
    )
    .await;
    send_numbered(port, "AQUSER.RAW_INBOX", 3000, 1, 1, "<priority>2</priority>").await;
    wait_depth(&db, "AQUSER.RAW_REJECTS", 1, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.RAW_FANOUT", 2, Duration::from_secs(30));
    assert_eq!(depth(&db, "AQUSER.RAW_INBOX"), 0);
    let listed = admin_messages(&db, "AQUSER.RAW_REJECTS");
    let why: Vec<(&str, &str, bool)> = listed
        .iter()
        .map(|r| {
            let s = |c: &str| r[c].as_str().unwrap_or("");
            (s("EXPIRATION_REASON"), s("ORIGINAL_QUEUE_NAME"), s("ORIGINAL_MSGID").len() == 32)
        })
        .collect();
    assert_eq!(why, [("PROPAGATION_FAILURE", "AQUSER.RAW_INBOX", true)]);
    let rejected = drain(port, "AQUSER.RAW_REJECTS", None).await;
    assert_eq!(rejected.iter().map(|(_, p, _)| p.as_str()).collect::<Vec<_>>(), [hex(2000)]);
    let low = drain(port, "AQUSER.RAW_FANOUT", Some("LOW")).await;
    assert_eq!(low.iter().map(|(_, p, _)| p.clone()).collect::<BTreeSet<_>>(), [hex(1000), hex(3000)].into());
    let (_, text) = http_get(port, "/metrics").expect("metrics");
    assert!(text.contains("aqgate_propagation_messages_total{job=\"ARCHIVE\"} 120"), "{text}");
    assert!(text.contains("aqgate_propagation_exceptions_total{job=\"FANOUT\"} 1"), "{text}");
    assert!(text.contains("aqgate_propagation_messages_total{job=\"FANOUT\"} 2"), "{text}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_to_queue_and_the_exception_queue_on_sqlite() {
    queue_to_queue_and_the_exception_queue(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_to_queue_and_the_exception_queue_on_postgres() {
    queue_to_queue_and_the_exception_queue(Backend::Postgres).await;
}

fn publish(queue: &str, hex: &str, priority: i64) -> String {
    raw_send(queue, &[(&format!("<priority>{priority}</priority>"), hex)], COMMIT).replace("AQXmlSend", "AQXmlPublish")
}

/// A job on a multi-consumer source is a subscriber: it moves only messages published
/// after it exists, and only those its rule selects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_topic_sees_only_later_messages_that_its_rule_selects() {
    let db = fresh_url(Backend::Sqlite).await;
    let port = free_port();
    let without = topology_file("");
    let s = serve(&db, port, &without);
    assert!(matches!(http(port, &publish("AQUSER.RAW_TOPIC", "0A", 1)).await, Response::Publish(..)));
    drop(s);
    let with = topology_file(TOPIC_JOB);
    let s = serve(&db, port, &with);
    for (h, p) in [("0B", 1), ("0C", 9), ("0D", 4)] {
        assert!(matches!(http(port, &publish("AQUSER.RAW_TOPIC", h, p)).await, Response::Publish(..)));
    }
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let got: BTreeSet<String> = drain(port, "AQUSER.RAW_ARCHIVE", None).await.into_iter().map(|(_, p, _)| p).collect();
    assert_eq!(got, ["0B".to_string(), "0D".to_string()].into(), "0A came before the job, 0C fails its rule");
    // The other subscriber still gets all four.
    assert_eq!(drain(port, "AQUSER.RAW_TOPIC", Some("AUDIT")).await.len(), 4);
    drop(s);
    let _ = std::fs::remove_file(&without);
    let _ = std::fs::remove_file(&with);
}

/// kill -9 while the job moves a stream of messages, then a restart: every message is in
/// the destination exactly once, and the job's PROPAGATED count says so.
async fn kill_nine_during_propagation(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = topology_file("");
    let total = 1500;
    let mut s = serve(&db, port, &topo);
    let mut sent = 0;
    for round in 0..3 {
        sent += send_numbered(port, "AQUSER.RAW_QUE", sent, total / 3, 100, "").await.len();
        // Kill while the job is busy with this round's messages.
        std::thread::sleep(Duration::from_millis(30 + 40 * round));
        s.kill9();
        s = serve(&db, port, &topo);
    }
    wait_depth(&db, "AQUSER.RAW_QUE", 0, Duration::from_secs(60));
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", i64::try_from(total).expect("count"), Duration::from_secs(30));
    let got = drain(port, "AQUSER.RAW_ARCHIVE", None).await;
    let payloads: Vec<String> = got.iter().map(|(_, p, _)| p.clone()).collect();
    let distinct: BTreeSet<String> = payloads.iter().cloned().collect();
    assert_eq!(payloads.len(), total, "no message duplicated");
    assert_eq!(distinct, (0..total).map(hex).collect::<BTreeSet<_>>(), "no message lost");
    // Each batch counted by its own commit: the count is what moved, kills or not.
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(10), |j| j["propagated"].as_u64().is_some());
    assert_eq!(j["propagated"], total, "{j}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_during_propagation_loses_and_duplicates_nothing_on_sqlite() {
    kill_nine_during_propagation(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_during_propagation_loses_and_duplicates_nothing_on_postgres() {
    kill_nine_during_propagation(Backend::Postgres).await;
}

fn admin_jobs(db: &str, extra: &[&str]) -> (bool, String) {
    let out = Command::new(BIN).args(["admin", "jobs", "--database", db]).args(extra).output().expect("admin jobs");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// `admin jobs` lists the jobs; `--disable` stops one (after SIGHUP) and its messages wait
/// in the source, `--enable` starts it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_jobs_lists_disables_and_enables_jobs() {
    let db = fresh_url(Backend::Sqlite).await;
    let port = free_port();
    let topo = topology_file("");
    let s = serve(&db, port, &topo);
    let (ok, listing) = admin_jobs(&db, &[]);
    assert!(ok, "{listing}");
    let archive = listing.lines().find(|l| l.starts_with("ARCHIVE ")).unwrap_or_else(|| panic!("{listing}"));
    let cols: Vec<&str> = archive.split_whitespace().collect();
    assert_eq!(cols[2..5], ["local", "AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE"], "{listing}");
    assert!(["RUNNING", "ENABLED"].contains(&cols[1]) && cols[9] == "0", "{listing}");
    let (ok, said) = admin_jobs(&db, &["--disable", "archive"]);
    assert!(ok && said.contains("job archive disabled"), "{said}");
    s.signal("-HUP");
    std::thread::sleep(Duration::from_millis(1500));
    send_numbered(port, "AQUSER.RAW_QUE", 0, 5, 5, "").await;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        (depth(&db, "AQUSER.RAW_QUE"), depth(&db, "AQUSER.RAW_ARCHIVE")),
        (5, 0),
        "a disabled job moves nothing"
    );
    let (_, listing) = admin_jobs(&db, &[]);
    let archive: Vec<&str> =
        listing.lines().find(|l| l.starts_with("ARCHIVE ")).map(|l| l.split_whitespace().collect()).unwrap_or_default();
    assert_eq!(
        (archive.get(1), archive.get(5), archive.get(9)),
        (Some(&"DISABLED"), Some(&"-"), Some(&"5")),
        "{listing}"
    );
    assert!(admin_jobs(&db, &["--enable", "archive"]).0);
    s.signal("-HUP");
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 5, Duration::from_secs(30));
    let (ok, said) = admin_jobs(&db, &["--disable", "nosuch"]);
    assert!(!ok && said.contains("no propagation job nosuch"), "{said}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

const HELD_JOB: &str = r#"
[[queues]]
name = "AQUSER.RAW_HELD"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "held"
source = "AQUSER.RAW_HELD"
destination = "AQUSER.RAW_ARCHIVE"
enabled = false
"#;

/// A copy keeps its times: a message in its delay moves at once and waits at the
/// destination until the same moment; the copy's `enq_time` is the original enqueue time.
async fn copies_keep_their_times(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = topology_file(HELD_JOB);
    let s = serve(&db, port, &topo);
    let sent = std::time::Instant::now();
    send_numbered(port, "AQUSER.RAW_QUE", 0, 1, 1, "<delay>10</delay><expiration>600</expiration>").await;
    send_numbered(port, "AQUSER.RAW_QUE", 1, 1, 1, "").await;
    // Both leave the source at once, the delayed one too...
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 2, Duration::from_secs(30));
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 0);
    assert!(sent.elapsed() < Duration::from_secs(10), "the delayed message waited in the source");
    // ...and at the destination only the other one is ready.
    let now = drain(port, "AQUSER.RAW_ARCHIVE", None).await;
    assert!(sent.elapsed() < Duration::from_secs(10), "too slow to tell: {:?}", sent.elapsed());
    assert_eq!(now.iter().map(|(_, p, _)| p.clone()).collect::<Vec<_>>(), [hex(1)]);
    let r = http(port, &receive("AQUSER.RAW_ARCHIVE", "<wait_time>30</wait_time>", COMMIT)).await;
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), [hex(0)]);
    assert!(sent.elapsed() >= Duration::from_secs(10), "ready at the destination before its delay ended");

    // The held job is enabled two seconds after its message was enqueued: the copy's
    // enq_time is still the original one, before the job moved it.
    send_numbered(port, "AQUSER.RAW_HELD", 7, 1, 1, "").await;
    std::thread::sleep(Duration::from_millis(2100));
    let before_move = aqgate_core::engine::context::format_timestamp(aqgate_core::clock::Clock::now(
        &aqgate_core::clock::SystemClock,
    ));
    assert!(admin_jobs(&db, &["--enable", "held"]).0);
    s.signal("-HUP");
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    let cond =
        format!("<wait_time>0</wait_time><selector><condition>enq_time &lt; '{before_move}'</condition></selector>");
    let r = http(port, &receive("AQUSER.RAW_ARCHIVE", &cond, COMMIT)).await;
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), [hex(7)], "enq_time < {before_move}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_keep_their_times_on_sqlite() {
    copies_keep_their_times(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_keep_their_times_on_postgres() {
    copies_keep_their_times(Backend::Postgres).await;
}

const PARALLEL_JOB: &str = r#"
[[queues]]
name = "AQUSER.RAW_WIDE"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "wide"
source = "AQUSER.RAW_WIDE"
destination = "AQUSER.RAW_HELD_OUT"
batch_size = 25
concurrency = 4

[[queues]]
name = "AQUSER.RAW_HELD_OUT"
queue_table = "AQUSER.RAW_TAB"
"#;

/// A local job with several workers moves batches side by side: every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_job_with_four_workers_moves_every_message_once() {
    let db = fresh_url(Backend::Postgres).await;
    let port = free_port();
    let topo = topology_file(PARALLEL_JOB);
    let s = serve(&db, port, &topo);
    send_numbered(port, "AQUSER.RAW_WIDE", 0, 1000, 100, "").await;
    wait_depth(&db, "AQUSER.RAW_HELD_OUT", 1000, Duration::from_secs(60));
    assert_eq!(depth(&db, "AQUSER.RAW_WIDE"), 0);
    let got = drain(port, "AQUSER.RAW_HELD_OUT", None).await;
    let payloads: BTreeSet<String> = got.iter().map(|(_, p, _)| p.clone()).collect();
    assert_eq!((got.len(), payloads), (1000, (0..1000).map(hex).collect::<BTreeSet<_>>()));
    let (_, text) = http_get(port, "/metrics").expect("metrics");
    assert!(text.contains("aqgate_propagation_messages_total{job=\"WIDE\"} 1000"), "{text}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

const BACKLOG_JOB: &str = r#"
[[queues]]
name = "AQUSER.RAW_BACKLOG"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_IN_ORDER"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "in_order"
source = "AQUSER.RAW_BACKLOG"
destination = "AQUSER.RAW_IN_ORDER"
enabled = false
"#;

/// A backlog of many batches, moved by a job at the defaults (batch size 30, one worker:
/// on PostgreSQL a batch's commit overlaps the next batch). Every look at the destination
/// while it moves finds the backlog's first messages, each once, and none after a gap: the
/// batches commit in the source's order. Then it holds the backlog in that order, and the
/// job's count is the backlog.
async fn a_backlog_arrives_in_the_source_order(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = topology_file(BACKLOG_JOB);
    let s = serve(&db, port, &topo);
    let total = 900;
    for from in (0..total).step_by(100) {
        // Each message's number is its correlation too, which the `AQ$` view shows.
        let payloads: Vec<String> = (from..from + 100).map(hex).collect();
        let headers: Vec<String> = payloads.iter().map(|p| format!("<correlation>{p}</correlation>")).collect();
        let msgs: Vec<(&str, &str)> =
            headers.iter().map(String::as_str).zip(payloads.iter().map(String::as_str)).collect();
        let r = http(port, &raw_send("AQUSER.RAW_BACKLOG", &msgs, COMMIT)).await;
        assert!(matches!(r, Response::Send(..)), "{r:?}");
    }
    let store = aqgate_store::open(&db).await.expect("store");
    let corr = aqgate_store::views::listed_columns().position(|c| c == "corr_id").expect("corr_id");
    assert!(admin_jobs(&db, &["--enable", "in_order"]).0);
    s.signal("-HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let rows = store.view_rows("AQUSER.RAW_TAB", "AQUSER.RAW_IN_ORDER", None, 10_000).await.expect("view");
        let mut seen: Vec<usize> = rows
            .iter()
            .map(|r| usize::from_str_radix(r[corr].as_deref().unwrap_or_default(), 16).expect("a numbered message"))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..seen.len()).collect::<Vec<_>>(), "the first messages, each once");
        if seen.len() == total {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{} of {total} arrived", seen.len());
        // Looks often enough to fall between two commits, not so often as to hold the job up.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(depth(&db, "AQUSER.RAW_BACKLOG"), 0);
    let got: Vec<String> = drain(port, "AQUSER.RAW_IN_ORDER", None).await.into_iter().map(|(_, p, _)| p).collect();
    assert_eq!(got, (0..total).map(hex).collect::<Vec<_>>(), "in the source's order, each once");
    let j = wait_job(&db, "IN_ORDER", Duration::from_secs(10), |j| j["propagated"] == total);
    assert_eq!(j["propagated"], total, "{j}");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_arrives_in_the_source_order_on_sqlite() {
    a_backlog_arrives_in_the_source_order(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_arrives_in_the_source_order_on_postgres() {
    a_backlog_arrives_in_the_source_order(Backend::Postgres).await;
}
