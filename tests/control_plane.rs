//! The control plane through real `aqgate serve` processes, on SQLite and PostgreSQL, never
//! sending SIGHUP: `admin jobs --disable` stops a running job within a bound (shown as
//! REQUESTED DISABLED / ACTUAL RUNNING while its node has not seen the change: the node
//! frozen with SIGSTOP — and STOPPED once it has, after which no message moves), `--enable`
//! starts it again and `admin apply` of a new job starts that; the agent's status in
//! `admin gateway` (RUNNING with its instance, NOT_STARTED after a clean stop, BROKEN once a
//! node killed -9 has let its heartbeat lapse, with its link rows STALE then, not a minute
//! later) and `admin gateway --ping` (REACHABLE within a bound from a running node, else
//! UNREACHABLE and a non-zero exit).

mod common;

use std::time::{Duration, Instant};

use common::gateway::{l_connected, nats_topology, tag};
use common::*;

const ARCHIVE: &str = r#"
[[propagations]]
name = "archive"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_ARCHIVE"
batch_size = 5
"#;

const SECOND: &str = r#"
[[propagations]]
name = "second"
source = "AQUSER.RAW_INBOX"
destination = "AQUSER.RAW_ARCHIVE"
"#;

/// How long a change may take to reach a running node and take effect there (SQLite: a
/// 300 ms poll; PostgreSQL: a NOTIFY — its fallback poll, every 5 s, would not make it).
const BOUND: Duration = Duration::from_secs(2);

fn serve(db: &str, port: u16, topology: &std::path::Path, ttl: u64) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (control plane)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(["--propagation-lease-ttl", &ttl.to_string()]),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

fn admin(args: &[&str], db: &str) -> std::process::Output {
    let mut all = vec!["admin"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--database", db]);
    aqgate(&all).output().expect("admin")
}

fn admin_ok(args: &[&str], db: &str) -> String {
    let out = admin(args, db);
    assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The job's (requested, actual) state in `admin jobs --json`.
fn states(db: &str, name: &str) -> (String, String) {
    let j = jobs(db).remove(name).unwrap_or_else(|| panic!("job {name}"));
    (j["requested"].as_str().unwrap_or_default().to_string(), j["actual"].as_str().unwrap_or_default().to_string())
}

/// Waits until the job's (requested, actual) is `want`; how long that took.
fn wait_states(db: &str, name: &str, want: (&str, &str), within: Duration) -> Duration {
    let start = Instant::now();
    wait_until(&format!("{name} {want:?}"), within, || {
        let (r, a) = states(db, name);
        (r.as_str(), a.as_str()) == want
    });
    start.elapsed()
}

async fn changes_reach_a_running_node_without_sighup(b: Backend) {
    let db = fresh_url(b).await;
    let topo = demo_topology_with("control-plane", ARCHIVE);
    let port = free_port();
    // A long lease: a frozen node's lease still lasts while the test looks.
    let mut s = serve(&db, port, &topo, 30);
    wait_states(&db, "ARCHIVE", ("ENABLED", "RUNNING"), Duration::from_secs(30));
    send_numbered(port, "AQUSER.RAW_QUE", 0, 10, 5, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 10, Duration::from_secs(20));

    // Disabled while the node cannot see it: what the topology asks for and what the node
    // does differ, and `admin jobs` says both.
    s.signal("-STOP");
    let said = admin_ok(&["jobs", "--disable", "archive"], &db);
    assert!(said.contains("job archive disabled") && !said.contains("SIGHUP"), "{said}");
    assert_eq!(states(&db, "ARCHIVE"), ("DISABLED".into(), "RUNNING".into()));
    let table = admin_ok(&["jobs"], &db);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(&header[13..], ["REQUESTED", "ACTUAL", "LAST_ERROR"], "{table}");
    let row: Vec<&str> =
        table.lines().find(|l| l.starts_with("ARCHIVE ")).unwrap_or_default().split_whitespace().collect();
    assert_eq!((row[1], row[13], row[14]), ("DISABLED", "DISABLED", "RUNNING"), "{table}");

    // The node goes on: it sees the change by itself and stops the job within the bound.
    s.signal("-CONT");
    let took = wait_states(&db, "ARCHIVE", ("DISABLED", "STOPPED"), BOUND + Duration::from_secs(2));
    assert!(took <= BOUND, "stopped {took:?} after the node went on");
    // Nothing moves once it says STOPPED.
    send_numbered(port, "AQUSER.RAW_QUE", 10, 10, 5, "").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!((depth(&db, "AQUSER.RAW_QUE"), depth(&db, "AQUSER.RAW_ARCHIVE")), (10, 10));

    // Enabled again: it runs and moves what waited, within the bound.
    let start = Instant::now();
    admin_ok(&["jobs", "--enable", "archive"], &db);
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 20, BOUND + Duration::from_secs(2));
    assert!(start.elapsed() <= BOUND, "moved {:?} after --enable", start.elapsed());
    wait_states(&db, "ARCHIVE", ("ENABLED", "RUNNING"), BOUND);

    // A job added by `admin apply`: started, and moving messages, within the bound.
    write_demo_topology(&topo, &format!("{ARCHIVE}\n{SECOND}"));
    let start = Instant::now();
    admin_ok(&["apply", topo.to_str().expect("utf-8")], &db);
    let took = wait_states(&db, "SECOND", ("ENABLED", "RUNNING"), BOUND + Duration::from_secs(2));
    assert!(took <= BOUND, "started {:?} after admin apply", start.elapsed());
    send_numbered(port, "AQUSER.RAW_INBOX", 100, 4, 4, "").await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 24, Duration::from_secs(10));
    assert!(s.log().contains("the stored topology changed: reloading it"), "{}", s.log_tail(20));
    assert!(s.exited().is_none());
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_a_running_node_without_sighup_sqlite() {
    changes_reach_a_running_node_without_sighup(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_a_running_node_without_sighup_postgres() {
    changes_reach_a_running_node_without_sighup(Backend::Postgres).await;
}

/// The agents of `admin gateway --agents --json`.
fn agents(db: &str) -> Vec<serde_json::Value> {
    let out = admin_ok(&["gateway", "--agents", "--json"], db);
    serde_json::from_str::<serde_json::Value>(&out).expect("json").as_array().cloned().unwrap_or_default()
}

fn agent_of(db: &str, pid: u32) -> Option<serde_json::Value> {
    agents(db).into_iter().find(|a| a["pid"].as_u64() == Some(u64::from(pid)))
}

/// `admin gateway --ping`: (exit success, stdout, stderr, how long it took).
fn ping(db: &str, timeout_ms: u64) -> (bool, String, String, Duration) {
    let start = Instant::now();
    let out = admin(&["gateway", "--ping", "--timeout-ms", &timeout_ms.to_string()], db);
    let took = start.elapsed();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr), took)
}

async fn agent_status_ping_and_stale_links(b: Backend) {
    let db = fresh_url(b).await;
    let t = tag();
    let topo =
        nats_topology("control-agent", "nats://127.0.0.1:4222", "", &format!("aqgt.{t}.orders"), &format!("AQGT_{t}"));

    // No agent yet: NOT_STARTED, and nobody answers a ping.
    assert!(agents(&db).is_empty());
    assert!(admin_ok(&["gateway"], &db).lines().any(|l| l.split_whitespace().nth(1) == Some("NOT_STARTED")));
    let (ok, _, err, _) = ping(&db, 800);
    assert!(!ok && err.contains("no agent answered"), "{err}");

    // A running node: RUNNING, with its instance; it answers a ping at once.
    let port = free_port();
    let ttl = 3;
    let mut s = serve(&db, port, &topo, ttl);
    let pid = s.id();
    wait_until("the agent RUNNING", Duration::from_secs(10), || {
        agent_of(&db, pid).is_some_and(|a| a["status"] == "RUNNING")
    });
    let a = agent_of(&db, pid).expect("agent");
    let instance = a["instance"].as_str().unwrap_or_default().to_string();
    assert!(instance.contains(&format!(":{pid}:")) && a["host"].is_string() && a["started_at"].is_string(), "{a}");
    let (ok, out, err, took) = ping(&db, 5000);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("REACHABLE {instance}")), "{out}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");

    // Stopped cleanly: NOT_STARTED, and a ping goes unanswered.
    s.signal("-TERM");
    s.wait_exit(Duration::from_secs(30));
    assert_eq!(agent_of(&db, pid).expect("agent")["status"], "NOT_STARTED");
    let (ok, _, err, took) = ping(&db, 1000);
    assert!(!ok && err.contains("UNREACHABLE"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(s);

    // Killed -9 while its link is CONNECTED: once its heartbeat's time has passed (the lease
    // time) it is BROKEN and its link row STALE — not CONNECTED for a minute.
    let mut s = serve(&db, port, &topo, ttl);
    let pid = s.id();
    wait_until("the link CONNECTED", Duration::from_secs(30), || {
        l_connected(&common::gateway::admin_json(&db, "gateway"), "NATS")
    });
    wait_until("the agent RUNNING", Duration::from_secs(10), || {
        agent_of(&db, pid).is_some_and(|a| a["status"] == "RUNNING")
    });
    assert!(s.exited().is_none());
    s.kill9();
    let killed = Instant::now();
    wait_until("the agent BROKEN", Duration::from_secs(ttl + 5), || {
        agent_of(&db, pid).is_some_and(|a| a["status"] == "BROKEN")
    });
    let mine = |l: &serde_json::Value| l["owner"].as_str().is_some_and(|o| o.contains(&format!(":{pid}:")));
    let links = common::gateway::admin_json(&db, "gateway");
    let rows: Vec<&serde_json::Value> = links.as_array().expect("links").iter().filter(|l| mine(l)).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l["state"] == "STALE"), "{links}");
    assert!(killed.elapsed() < Duration::from_secs(ttl + 5), "{:?}", killed.elapsed());
    let table = admin_ok(&["gateway"], &db);
    assert!(table.lines().any(|l| l.contains(&format!(":{pid}:")) && l.contains("BROKEN")), "{table}");
    let (ok, _, err, _) = ping(&db, 800);
    assert!(!ok && err.contains("no agent answered"), "{err}");
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_status_ping_and_stale_links_sqlite() {
    agent_status_ping_and_stale_links(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_status_ping_and_stale_links_postgres() {
    agent_status_ping_and_stale_links(Backend::Postgres).await;
}
