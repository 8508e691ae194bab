//! Propagation between two aqgate processes over HTTP — one on SQLite, one on PostgreSQL,
//! each propagating to the other — and kill -9 of the destination and of the source in the
//! middle of a stream: every message arrives exactly once (the idempotency key per source
//! message makes a re-sent one a replay).

mod common;

use std::time::Duration;

use aqgate_proto::idap::Response;
use common::*;

const PASSWORD_ENV: &str = "AQGATE_TEST_REMOTE_PASSWORD";

/// The demo topology, `RAW_QUEUES`, and a job from `source` to the aqgate on `port`.
fn topology(source: &str, destination: &str, port: u16) -> std::path::PathBuf {
    let job = format!(
        r#"
[[propagations]]
name = "out"
source = "{source}"
destination = "{destination}"
exception_queue = "AQUSER.RAW_REJECTS"
concurrency = 4
remote = {{ url = "http://127.0.0.1:{port}/aqserv", agent = "scott", password_env = "{PASSWORD_ENV}" }}
"#
    );
    demo_topology_with("propagation-remote", &job)
}

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (remote propagation)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .env(PASSWORD_ENV, "tiger"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_aqgates_propagate_both_ways_exactly_once_through_kill_nine() {
    let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Postgres).await);
    let (a_port, b_port) = (free_port(), free_port());
    // A (SQLite) sends RAW_QUE to B's archive; B (PostgreSQL) sends its RAW_INBOX to A's.
    let a_topo = topology("AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE", b_port);
    let b_topo = topology("AQUSER.RAW_INBOX", "AQUSER.RAW_ARCHIVE", a_port);
    let mut a = serve(&a_db, a_port, &a_topo);
    let mut b = serve(&b_db, b_port, &b_topo);

    send_numbered(a_port, "AQUSER.RAW_QUE", 0, 200, 50, "").await;
    send_numbered(b_port, "AQUSER.RAW_INBOX", 10_000, 200, 50, "").await;
    wait_depth(&b_db, "AQUSER.RAW_ARCHIVE", 200, Duration::from_secs(60));
    wait_depth(&a_db, "AQUSER.RAW_ARCHIVE", 200, Duration::from_secs(60));
    assert_eq!((depth(&a_db, "AQUSER.RAW_QUE"), depth(&b_db, "AQUSER.RAW_INBOX")), (0, 0));
    assert_exactly(&drain_payloads(b_port, "AQUSER.RAW_ARCHIVE").await, 0..200);
    assert_exactly(&drain_payloads(a_port, "AQUSER.RAW_ARCHIVE").await, 10_000..10_200);

    // A stream from A to B; the destination is killed in the middle, then the source.
    send_numbered(a_port, "AQUSER.RAW_QUE", 200, 400, 100, "").await;
    std::thread::sleep(Duration::from_millis(150));
    b.kill9();
    std::thread::sleep(Duration::from_millis(500));
    b = serve(&b_db, b_port, &b_topo);
    send_numbered(a_port, "AQUSER.RAW_QUE", 600, 400, 100, "").await;
    std::thread::sleep(Duration::from_millis(150));
    a.kill9();
    a = serve(&a_db, a_port, &a_topo);
    wait_depth(&a_db, "AQUSER.RAW_QUE", 0, Duration::from_secs(120));
    wait_depth(&b_db, "AQUSER.RAW_ARCHIVE", 800, Duration::from_secs(30));
    assert_exactly(&drain_payloads(b_port, "AQUSER.RAW_ARCHIVE").await, 200..1000);
    assert_eq!(depth(&a_db, "AQUSER.RAW_REJECTS"), 0);

    // A queue the remote does not have: each message is refused for good there and goes to
    // the exception queue; the job goes on.
    drop(a);
    let bad = topology("AQUSER.RAW_QUE", "AQUSER.NO_SUCH_QUEUE", b_port);
    let a = serve(&a_db, a_port, &bad);
    send_numbered(a_port, "AQUSER.RAW_QUE", 5000, 3, 3, "").await;
    wait_depth(&a_db, "AQUSER.RAW_REJECTS", 3, Duration::from_secs(30));
    assert_exactly(&drain_payloads(a_port, "AQUSER.RAW_REJECTS").await, 5000..5003);
    let (_, text) = http_get(a_port, "/metrics").expect("metrics");
    assert!(text.contains("aqgate_propagation_exceptions_total{job=\"OUT\"} 3"), "{text}");

    // A remote queue of another payload type: a RAW message cannot be converted to a JMS
    // text message; refused for good, with the remote's reason in the log.
    drop(a);
    let jms = topology("AQUSER.RAW_QUE", "AQUSER.JMS_TEXTQ", b_port);
    let a = serve(&a_db, a_port, &jms);
    send_numbered(a_port, "AQUSER.RAW_QUE", 6000, 2, 2, "").await;
    wait_depth(&a_db, "AQUSER.RAW_REJECTS", 2, Duration::from_secs(30));
    assert_exactly(&drain_payloads(a_port, "AQUSER.RAW_REJECTS").await, 6000..6002);
    assert_eq!(depth(&b_db, "AQUSER.JMS_TEXTQ"), 0);
    assert!(a.log().contains("payload does not match queue type"), "{}", a.log_tail(20));
    drop((a, b));
    for f in [a_topo, b_topo, bad, jms] {
        let _ = std::fs::remove_file(f);
    }
}

/// The remote records the agent the job logs in as there (scott) as the sender: a message
/// that john sent to the source arrives, rather than being refused there as a message
/// naming another sender (and going to the exception queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_another_sender_arrives_with_the_remote_agent_as_sender() {
    let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Sqlite).await);
    let (a_port, b_port) = (free_port(), free_port());
    let a_topo = topology("AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE", b_port);
    let b_topo = topology("AQUSER.RAW_INBOX", "AQUSER.RAW_ARCHIVE", a_port);
    let a = serve(&a_db, a_port, &a_topo);
    let b = serve(&b_db, b_port, &b_topo);
    let r = idap(a_port, "john", "welcome", &raw_send("AQUSER.RAW_QUE", &[("", "0A0B")], COMMIT)).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    wait_depth(&b_db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "AQUSER.RAW_REJECTS"), 0, "not refused by the remote");
    let r = http(b_port, &receive("AQUSER.RAW_ARCHIVE", "<wait_time>0</wait_time>", COMMIT)).await;
    let got = received(&r);
    assert_eq!(got.len(), 1, "{r:?}");
    assert_eq!(raw_of(&got[0]), "0A0B");
    assert_eq!(got[0].header.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("SCOTT"));
    drop((a, b));
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
}

/// A message in its delay leaves at once and waits at the remote for the rest of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_waits_at_the_remote() {
    let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Postgres).await);
    let (a_port, b_port) = (free_port(), free_port());
    let a_topo = topology("AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE", b_port);
    let b_topo = topology("AQUSER.RAW_INBOX", "AQUSER.RAW_ARCHIVE", a_port);
    let a = serve(&a_db, a_port, &a_topo);
    let b = serve(&b_db, b_port, &b_topo);
    let sent = std::time::Instant::now();
    let r =
        http(a_port, &raw_send("AQUSER.RAW_QUE", &[("<delay>10</delay><expiration>600</expiration>", "0C0D")], COMMIT))
            .await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    wait_depth(&b_db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "AQUSER.RAW_QUE"), 0);
    let r = http(b_port, &receive("AQUSER.RAW_ARCHIVE", "<wait_time>0</wait_time>", COMMIT)).await;
    assert!(sent.elapsed() < Duration::from_secs(10), "too slow to tell: {:?}", sent.elapsed());
    assert!(matches!(&r, Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE), "ready early: {r:?}");
    let r = http(b_port, &receive("AQUSER.RAW_ARCHIVE", "<wait_time>30</wait_time>", COMMIT)).await;
    assert_eq!(received(&r).iter().map(raw_of).collect::<Vec<_>>(), ["0C0D"]);
    assert!(sent.elapsed() >= Duration::from_secs(10), "ready at the remote before its delay ended");
    drop((a, b));
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
}

/// A remote that is down is the destination's failure, not the message's: however often the
/// job's batches roll back, the message stays in the source (no retry count, no exception
/// queue) and arrives once the remote is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_down_for_long_keeps_the_message_in_the_source() {
    let (a_db, b_db) = (fresh_url(Backend::Postgres).await, fresh_url(Backend::Sqlite).await);
    let (a_port, b_port) = (free_port(), free_port());
    let a_topo = topology("AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE", b_port);
    let spec = std::fs::read_to_string(&a_topo).expect("topology");
    std::fs::write(&a_topo, spec.replace("concurrency = 4", "concurrency = 1\nretry_backoff_ms = 20")).expect("write");
    let b_topo = topology("AQUSER.RAW_INBOX", "AQUSER.RAW_ARCHIVE", a_port);
    let a = serve(&a_db, a_port, &a_topo);
    send_numbered(a_port, "AQUSER.RAW_QUE", 0, 2, 2, "").await;
    // Backoff 20 ms doubling: seven failed attempts in under 3 s, more than max_retries (5).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while metric(a_port, "aqgate_propagation_failures_total{job=\"OUT\"}") < 7 {
        assert!(std::time::Instant::now() < deadline, "the job does not retry: {}", a.log_tail(20));
        std::thread::sleep(Duration::from_millis(200));
    }
    let d = depths(&a_db);
    assert_eq!(d.get("AQUSER.RAW_QUE"), Some(&2), "{d:?}");
    assert_eq!(d.values().sum::<i64>(), 2, "nothing moved to an exception queue: {d:?}");
    let b = serve(&b_db, b_port, &b_topo);
    wait_depth(&b_db, "AQUSER.RAW_ARCHIVE", 2, Duration::from_secs(90));
    assert_exactly(&drain_payloads(b_port, "AQUSER.RAW_ARCHIVE").await, 0..2);
    assert_eq!(depth(&a_db, "AQUSER.RAW_QUE"), 0);
    drop((a, b));
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
}

/// A message whose send was performed at the remote but whose answer never came back (the
/// source crashed, the answer was lost) is sent again with what then remains of its
/// expiration: another body under the same key, which the remote answers 24051 (HTTP 422).
/// That answer means the key's first send was performed (faults are not recorded), so the
/// message has arrived and leaves the source, instead of being retried for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_with_less_expiration_left_is_the_send_performed_before() {
    let (a_db, b_db) = (fresh_url(Backend::Sqlite).await, fresh_url(Backend::Sqlite).await);
    let (a_port, b_port) = (free_port(), free_port());
    let a_topo = topology("AQUSER.RAW_QUE", "AQUSER.RAW_ARCHIVE", b_port);
    let spec = std::fs::read_to_string(&a_topo).expect("topology");
    let quick = spec.replace("concurrency = 4", "concurrency = 1\nretry_backoff_ms = 20");
    let stopped = a_topo.with_extension("stopped.toml");
    std::fs::write(&stopped, quick.replace("concurrency = 1", "concurrency = 1\nenabled = false")).expect("write");
    std::fs::write(&a_topo, quick).expect("write");
    let b_topo = topology("AQUSER.RAW_INBOX", "AQUSER.RAW_ARCHIVE", a_port);
    let b = serve(&b_db, b_port, &b_topo);
    let a = serve(&a_db, a_port, &stopped);
    let r = http(a_port, &raw_send("AQUSER.RAW_QUE", &[("<expiration>600</expiration>", "0E0F")], COMMIT)).await;
    let id = sent_ids(&r).remove(0);
    // The job's earlier attempt, performed at the remote with 601 s of expiration left.
    let earlier = raw_send("AQUSER.RAW_ARCHIVE", &[("<expiration>601</expiration>", "0E0F")], COMMIT);
    let r = idap_request(&reqwest::Client::new(), &aqserv(b_port), SCOTT, earlier)
        .header("idempotency-key", format!("prop-OUT-{id}"))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    drop(a);
    let a = serve(&a_db, a_port, &a_topo);
    wait_depth(&a_db, "AQUSER.RAW_QUE", 0, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "AQUSER.RAW_REJECTS"), 0, "not refused: it arrived");
    assert_eq!(drain_payloads(b_port, "AQUSER.RAW_ARCHIVE").await, ["0E0F"], "once");
    assert_eq!(metric(a_port, "aqgate_propagation_exceptions_total{job=\"OUT\"}"), 0);
    drop((a, b));
    for f in [a_topo, b_topo, stopped] {
        let _ = std::fs::remove_file(f);
    }
}
