//! Propagation jobs' leases, status and schedules through real `aqgate serve` processes:
//! two nodes on one PostgreSQL database run a job on one of them only, and the other takes
//! it over within the lease time when the first is killed (every message arrives exactly
//! once); `admin jobs` and `/metrics` show RUNNING with counts and the last error, RETRYING
//! for a remote that is down, FAILED for a message refused without an exception queue, and
//! DELETE_PENDING while a removed job finishes its batch; a schedule's windows hold messages
//! back until they open, and again once they close.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

/// Beside `RAW_QUEUES`.
const QUEUES: &str = r#"
[[queues]]
name = "AQUSER.RAW_REFUSED"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_HOOK"
queue_table = "AQUSER.RAW_TAB"

[[queue_tables]]
name = "AQUSER.RAW_TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.RAW_FANOUT"
queue_table = "AQUSER.RAW_TOPIC_TAB"

[[subscribers]]
queue = "AQUSER.RAW_FANOUT"
name = "LOW"
rule = "priority < 5"
"#;

const ARCHIVE: &str = r#"
[[propagations]]
name = "archive"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
batch_size = 20
"#;

const PASSWORD_ENV: &str = "AQGATE_TEST_JOBS_PASSWORD";

/// The lease time the nodes here run with (seconds): a takeover within a few seconds.
const TTL: u64 = 3;

fn topology_file(jobs: &str) -> std::path::PathBuf {
    demo_topology_with("propagation-jobs", &format!("{QUEUES}\n{jobs}"))
}

fn write_topology(p: &std::path::Path, jobs: &str) {
    write_demo_topology(p, &format!("{QUEUES}\n{jobs}"));
}

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    serve_with_ttl(db, port, topology, TTL)
}

fn serve_with_ttl(db: &str, port: u16, topology: &std::path::Path, ttl: u64) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (propagation jobs)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(["--propagation-lease-ttl", &ttl.to_string(), "--notify-allow", "127.0.0.1"])
            .env(PASSWORD_ENV, "tiger"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// `admin apply` of `topology` to `db`, then SIGHUP to the servers.
fn apply(db: &str, topology: &std::path::Path, servers: &[&Proc]) {
    let out = Command::new(BIN)
        .args(["admin", "apply", topology.to_str().expect("utf-8"), "--database", db])
        .output()
        .expect("admin apply");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for s in servers {
        s.signal("-HUP");
    }
}

/// This many messages of a job in `port`'s `/metrics` (moved by that process).
fn moved_by(port: u16, job: &str) -> i64 {
    metric(port, &format!("aqgate_propagation_messages_total{{job=\"{job}\"}}"))
}

fn owner_pid(j: &serde_json::Value) -> Option<u32> {
    j["owner"].as_str()?.split(':').nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_run_a_job_on_one_and_the_other_takes_it_over_after_kill_nine() {
    let db = fresh_url(Backend::Postgres).await;
    let topo = topology_file(ARCHIVE);
    let (pa, pb) = (free_port(), free_port());
    let a = serve(&db, pa, &topo);
    let b = serve(&db, pb, &topo);
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    let pid = owner_pid(&j).unwrap_or_else(|| panic!("an owner: {j}"));
    assert!([a.id(), b.id()].contains(&pid), "{j}");
    let ((owner, owner_port), (other, other_port)) =
        if pid == a.id() { ((a, pa), (b, pb)) } else { ((b, pb), (a, pa)) };

    // Exactly one of them moves messages.
    send_numbered(other_port, "AQUSER.RAW_QUE", 0, 300, 50, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 300, Duration::from_secs(60));
    assert_eq!((moved_by(owner_port, "ARCHIVE"), moved_by(other_port, "ARCHIVE")), (300, 0));
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(10), |j| j["propagated"] == 300);
    assert_eq!(owner_pid(&j), Some(owner.id()), "{j}");

    // kill -9 the owner in the middle of a stream: the other takes the job over once the
    // lease has ended, rolls back what the dead one left open, and every message arrives
    // exactly once.
    send_numbered(other_port, "AQUSER.RAW_QUE", 300, 600, 100, "").await;
    owner.kill9();
    let killed = Instant::now();
    send_numbered(other_port, "AQUSER.RAW_QUE", 900, 600, 100, "").await;
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(30), |j| owner_pid(j) == Some(other.id()));
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(TTL + 5), "taken over after {took:?}: {j}");
    wait_depth(&db, "AQUSER.RAW_QUE", 0, Duration::from_secs(60));
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 1500, Duration::from_secs(30));
    let got = drain_payloads(other_port, "AQUSER.RAW_ARCHIVE").await;
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(got.len(), distinct.len(), "no message duplicated");
    assert_eq!(distinct.into_iter().cloned().collect::<Vec<_>>(), (0..1500).map(hex).collect::<Vec<_>>(), "none lost");
    assert!(moved_by(other_port, "ARCHIVE") > 0);
    drop(other);
    let _ = std::fs::remove_file(&topo);
}

/// A node killed and started again on its host takes its jobs back at once: the lease of
/// its dead predecessor (this host, a pid that is gone) is ended at start rather than
/// waited out (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_takes_its_jobs_back_without_waiting_out_the_lease() {
    let db = fresh_url(Backend::Postgres).await;
    let topo = topology_file(ARCHIVE);
    let port = free_port();
    let first = serve_with_ttl(&db, port, &topo, 60);
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(30), |j| j["state"] == "RUNNING");
    assert_eq!(owner_pid(&j), Some(first.id()), "{j}");
    first.kill9();
    let again = serve_with_ttl(&db, port, &topo, 60);
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(30), |j| owner_pid(j) == Some(again.id()));
    assert_eq!(j["state"], "RUNNING", "{j}");
    send_numbered(port, "AQUSER.RAW_QUE", 0, 40, 20, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 40, Duration::from_secs(20));
    assert!(
        again.log().contains("ended the propagation leases of a dead process of this host"),
        "{}",
        again.log_tail(20)
    );
    drop(again);
    let _ = std::fs::remove_file(&topo);
}

/// A receiver for a forwarder that takes `hold` to answer each POST with 200; the count of
/// requests it has begun.
async fn slow_receiver(hold: Duration) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let begun = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let b = begun.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let b = b.clone();
            async move {
                b.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                "ok"
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(l, app).await });
    (port, begun)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_jobs_shows_running_retrying_failed_and_delete_pending() {
    let db = fresh_url(Backend::Sqlite).await;
    let (port, remote_port) = (free_port(), free_port());
    let (hook_port, begun) = slow_receiver(Duration::from_secs(4)).await;
    let jobs_but_hook = format!(
        r#"{ARCHIVE}
[[propagations]]
name = "down"
source = "AQUSER.RAW_INBOX"
destination = "AQUSER.RAW_ARCHIVE"
retry_backoff_ms = 300
remote = {{ url = "http://127.0.0.1:{remote_port}/aqserv", agent = "scott", password_env = "{PASSWORD_ENV}" }}

[[propagations]]
name = "refused"
source = "AQUSER.RAW_REFUSED"
destination = "AQUSER.RAW_FANOUT"
retry_backoff_ms = 5000
"#
    );
    let hook = format!(
        r#"
[[propagations]]
name = "hook"
source = "AQUSER.RAW_HOOK"
forward = {{ url = "http://127.0.0.1:{hook_port}/hook" }}
"#
    );
    let topo = topology_file(&format!("{jobs_but_hook}{hook}"));
    let s = serve(&db, port, &topo);
    let running = |j: &serde_json::Value| j["state"] == "RUNNING";
    for name in ["ARCHIVE", "DOWN", "REFUSED", "HOOK"] {
        let j = wait_job(&db, name, Duration::from_secs(30), running);
        assert_eq!(owner_pid(&j), Some(s.id()), "{j}");
    }

    // RUNNING, with its counts (written by each batch's commit) and the time of its last
    // success (flushed with the lease's heartbeat).
    send_numbered(port, "AQUSER.RAW_QUE", 0, 25, 5, "").await;
    let j = wait_job(&db, "ARCHIVE", Duration::from_secs(30), |j| {
        j["propagated"] == 25 && j["last_success_at"].is_string()
    });
    assert_eq!(
        (j["state"].as_str(), j["kind"].as_str(), j["backlog"].as_i64()),
        (Some("RUNNING"), Some("local"), Some(0))
    );
    assert_eq!((j["failed"].as_i64(), j["exceptions"].as_i64(), j["lag"].as_f64()), (Some(0), Some(0), Some(0.0)));
    assert!(j["last_success_at"].is_string() && j["last_error"].is_null(), "{j}");

    // RETRYING: the remote is down (nothing listens on its port); the message waits in the
    // source, which the backlog and the lag say.
    send_numbered(port, "AQUSER.RAW_INBOX", 100, 1, 1, "").await;
    let j = wait_job(&db, "DOWN", Duration::from_secs(30), |j| j["state"] == "RETRYING");
    assert!(j["failed"].as_i64() >= Some(1), "{j}");
    let error = j["last_error"].as_str().unwrap_or_default().to_string();
    assert!(error.contains(&format!("127.0.0.1:{remote_port}")), "{j}");
    assert!(j["last_error_at"].is_string(), "{j}");
    assert_eq!(j["backlog"].as_i64(), Some(1));
    let j = wait_job(&db, "DOWN", Duration::from_secs(10), |j| j["lag"].as_f64() > Some(0.5));
    assert_eq!(j["state"], "RETRYING");
    let (_, text) = http_get(port, "/metrics").expect("metrics");
    for line in [
        "aqgate_propagation_state{job=\"DOWN\",state=\"RETRYING\"} 1",
        "aqgate_propagation_state{job=\"DOWN\",state=\"RUNNING\"} 0",
        "aqgate_propagation_state{job=\"ARCHIVE\",state=\"RUNNING\"} 1",
        "aqgate_propagation_backlog{job=\"DOWN\"} 1",
        "aqgate_propagation_messages_total{job=\"ARCHIVE\"} 25",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    assert!(text.contains("aqgate_propagation_lag_seconds{job=\"DOWN\"} "), "{text}");

    // The remote comes up: the job moves the message, RUNNING again, the last error kept.
    let remote_db = fresh_url(Backend::Sqlite).await;
    let remote_topo = topology_file("");
    let remote = serve(&remote_db, remote_port, &remote_topo);
    let j = wait_job(&db, "DOWN", Duration::from_secs(60), |j| j["propagated"] == 1 && j["state"] == "RUNNING");
    assert_eq!(j["last_error"].as_str(), Some(error.as_str()), "{j}");
    assert_eq!(depth(&remote_db, "AQUSER.RAW_ARCHIVE"), 1);
    drop(remote);

    // FAILED: the destination has no recipient for a message of priority 9 (for good) and the
    // job has no exception queue.
    send_numbered(port, "AQUSER.RAW_REFUSED", 200, 1, 1, "<priority>9</priority>").await;
    let j = wait_job(&db, "REFUSED", Duration::from_secs(30), |j| j["state"] == "FAILED");
    assert!(j["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{j}");
    assert_eq!(depth(&db, "AQUSER.RAW_REFUSED"), 1, "the message stays in the source");

    // DELETE_PENDING: the forwarder's job is removed while its request is in flight; it
    // finishes that message, and then its row goes.
    send_numbered(port, "AQUSER.RAW_HOOK", 300, 1, 1, "").await;
    wait_until("the forwarded request", Duration::from_secs(30), || {
        begun.load(std::sync::atomic::Ordering::SeqCst) == 1
    });
    write_topology(&topo, &jobs_but_hook);
    apply(&db, &topo, &[&s]);
    let j = wait_job(&db, "HOOK", Duration::from_secs(10), |j| j["state"] == "DELETE_PENDING");
    assert_eq!(owner_pid(&j), Some(s.id()), "{j}");
    wait_until("the removed job's row to go", Duration::from_secs(30), || !jobs(&db).contains_key("HOOK"));
    assert_eq!(depth(&db, "AQUSER.RAW_HOOK"), 0, "its batch in flight was finished, and committed");
    assert_eq!(begun.load(std::sync::atomic::Ordering::SeqCst), 1, "and not sent again");
    let listing = Command::new(BIN).args(["admin", "jobs", "--database", &db]).output().expect("admin jobs");
    let listing = String::from_utf8_lossy(&listing.stdout).to_string();
    let header: Vec<&str> = listing.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "JOB",
            "STATE",
            "KIND",
            "SOURCE",
            "DESTINATION",
            "OWNER",
            "PROPAGATED",
            "FAILED",
            "EXCEPTIONS",
            "BACKLOG",
            "LAG",
            "NEXT_WINDOW",
            "IN_DOUBT",
            "REQUESTED",
            "ACTUAL",
            "LAST_ERROR"
        ]
    );
    let down = listing.lines().find(|l| l.starts_with("DOWN ")).unwrap_or_else(|| panic!("{listing}"));
    // A remote's destination is `URL QUEUE`, one field (its space escaped, as every field's
    // whitespace is but the last column's).
    let cols: Vec<&str> = down.split_whitespace().collect();
    assert_eq!((cols[1], cols[2], cols[6]), ("RUNNING", "remote", "1"), "{listing}");
    assert_eq!((cols[13], cols[14]), ("ENABLED", "RUNNING"), "requested and actual: {listing}");
    assert!(cols[4].ends_with("/aqserv\\x20AQUSER.RAW_ARCHIVE"), "{listing}");
    assert!(cols[5].contains(&format!(":{}:", s.id())), "{listing}");
    assert!(down.contains(&error), "{listing}");
    assert!(!listing.contains("HOOK "), "{listing}");
    drop(s);
    for f in [topo, remote_topo] {
        let _ = std::fs::remove_file(f);
    }
}

fn unix_now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()).expect("seconds")
}

fn rfc3339(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0).expect("time").to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Sleeps until the Unix time `t` (seconds).
fn until(t: i64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let wait = t as f64 - now;
    if wait > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_moves_messages_only_inside_its_windows() {
    let db = fresh_url(Backend::Sqlite).await;
    let port = free_port();
    let topo = topology_file("");
    let s = serve(&db, port, &topo);
    // Windows of 4 s every 10 s, the first opening 6 s from now.
    let start = unix_now() + 6;
    let job = format!(
        r#"
[[propagations]]
name = "windowed"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
schedule = {{ start = "{}", duration = 4, next = 10, latency = 1 }}
"#,
        rfc3339(start)
    );
    write_topology(&topo, &job);
    apply(&db, &topo, &[&s]);
    send_numbered(port, "AQUSER.RAW_QUE", 0, 3, 1, "").await;
    let j = wait_job(&db, "WINDOWED", Duration::from_secs(5), |j| j["next_window"].is_string());
    assert_eq!(
        (j["state"].as_str(), j["next_window"].as_str()),
        (Some("ENABLED"), Some(rfc3339(start).as_str())),
        "{j}"
    );
    assert!(j["owner"].is_null(), "no lease outside the window: {j}");
    // Sent before the window: they wait until it opens, then move inside it.
    until(start - 1);
    assert_eq!((depth(&db, "AQUSER.RAW_QUE"), depth(&db, "AQUSER.RAW_ARCHIVE")), (3, 0), "the window is not open yet");
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 3, Duration::from_secs(4));
    assert!(unix_now() >= start);
    let j = wait_job(&db, "WINDOWED", Duration::from_secs(4), |j| j["propagated"] == 3);
    assert!(j["state"] == "RUNNING" && j["next_window"].is_null(), "{j}");
    // Sent after the window closed: they wait for the next one.
    until(start + 5);
    send_numbered(port, "AQUSER.RAW_QUE", 3, 2, 1, "").await;
    let j = wait_job(&db, "WINDOWED", Duration::from_secs(3), |j| j["state"] == "ENABLED");
    assert_eq!(j["next_window"].as_str(), Some(rfc3339(start + 10).as_str()), "{j}");
    assert_eq!(j["backlog"].as_i64(), Some(2));
    until(start + 9);
    assert_eq!((depth(&db, "AQUSER.RAW_QUE"), depth(&db, "AQUSER.RAW_ARCHIVE")), (2, 3), "between the windows");
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 5, Duration::from_secs(6));
    assert!(unix_now() >= start + 10);
    let got: BTreeSet<String> = drain_payloads(port, "AQUSER.RAW_ARCHIVE").await.into_iter().collect();
    assert_eq!(got, (0..5).map(hex).collect::<BTreeSet<_>>());
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[test]
fn a_bad_schedule_is_a_config_error_naming_the_key() {
    let topo = topology_file(
        r#"
[[propagations]]
name = "windowed"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
schedule = { start = "tomorrow", next = 60, latency = 5 }
"#,
    );
    let db = fresh_sqlite_url();
    let out = Command::new(BIN)
        .args(["admin", "apply", topo.to_str().expect("utf-8"), "--database", &db])
        .output()
        .expect("admin apply");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("propagations[0] (windowed).schedule.start: \"tomorrow\" is not an RFC 3339 timestamp"),
        "{said}"
    );
    assert!(said.contains("propagations[0] (windowed).schedule.next: needs duration"), "{said}");
    let _ = std::fs::remove_file(&topo);
}
