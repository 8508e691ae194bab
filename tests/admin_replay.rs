//! `aqgate admin replay`, `audit`, `timeline` and `sessions` through the real binary, on
//! both backends: a dry run changes nothing; a replay moves exactly the messages its filter
//! takes, up to `--max`, each back on the queue it left as a new message linked to its id,
//! with an audit row per batch; a queue that is no exception queue is refused; a kill -9 in
//! the middle of a replay leaves every message in one of the two queues; the timeline of a
//! message shows its enqueue, failed dequeues, the move and the replay; the open sessions
//! are listed with what they hold, and one is aborted with its transaction rolled back.

mod common;

use std::io::BufRead;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_aqgate");
const Q: &str = "AQUSER.RETRY";
const EQ: &str = "AQUSER.AQ$_RETRY_TAB_E";

const EXTRA: &str = r#"
[[queue_tables]]
name = "AQUSER.RETRY_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.RETRY"
queue_table = "AQUSER.RETRY_TAB"
max_retries = 1
"#;

fn admin(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("admin")
        .args(args)
        .args(["--database", url])
        .env_remove("AQGATE_CONFIG")
        .output()
        .expect("run admin")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&ok(out)).expect("json")
}

/// A harness whose clock is the wall clock's (replays stamp the wall clock's time).
async fn harness(b: Backend) -> Harness {
    let h = Harness::with_topology(b, &format!("{}{EXTRA}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs() as i64;
    h.clock.advance_secs((now - T0 / 1_000_000).max(0));
    h
}

async fn depths(h: &Harness) -> (i64, i64) {
    let rows = aqgate_admin::queues(h.engine.store().as_ref()).await.expect("queues");
    let d = |n: &str| rows.iter().find(|r| r.name == n).map_or(0, |r| r.depth);
    (d(Q), d(EQ))
}

/// Sends `corrs` to the queue, each then dequeued and rolled back twice: past max_retries,
/// in the exception queue (MAX_RETRY_EXCEEDED). Their ids.
async fn fail(h: &Harness, corrs: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    let mut s = h.session("JOHN");
    for c in corrs {
        let r = h.run(&mut s, &raw_send(Q, &[(&format!("<correlation>{c}</correlation>"), "0A")], COMMIT)).await;
        ids.extend(sent_ids(&r.expect("send")));
        for _ in 0..2 {
            let got = h.run(&mut s, &receive(Q, "<wait_time>0</wait_time>", "")).await.expect("receive");
            assert_eq!(received(&got).len(), 1);
            h.run(&mut s, &envelope(ROLLBACK)).await.expect("rollback");
        }
    }
    ids
}

/// Sends `n` messages that expire at once and lets the time manager move them
/// (TIME_EXPIRATION).
async fn expire(h: &Harness, n: usize) {
    let mut s = h.session("JOHN");
    for start in (0..n).step_by(100) {
        let hdrs: Vec<String> = (start..n.min(start + 100))
            .map(|i| format!("<correlation>X{i}</correlation><expiration>1</expiration>"))
            .collect();
        let msgs: Vec<(&str, &str)> = hdrs.iter().map(|h| (h.as_str(), "0B")).collect();
        h.run(&mut s, &raw_send(Q, &msgs, COMMIT)).await.expect("send");
    }
    h.clock.advance_secs(5);
    while h.engine.expire_messages().await.expect("expire") > 0 {}
}

fn timeline(url: &str, id: &str) -> Value {
    json(&admin(url, &["timeline", id, "--json"]))
}

fn events(t: &Value) -> Vec<(String, String)> {
    t["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| (e["what"].as_str().unwrap_or("").to_string(), e["detail"].as_str().unwrap_or("").to_string()))
        .collect()
}

async fn replay_moves_what_the_filter_takes(b: Backend) {
    let h = harness(b).await;
    let ids = fail(&h, &["C0", "C1", "C2", "C3", "C4"]).await;
    expire(&h, 2).await;
    assert_eq!(depths(&h).await, (0, 7));

    // Before: enqueued, then moved after two failed dequeues.
    let t = timeline(&h.url, &ids[0]);
    assert_eq!(t["queue"], EQ);
    let ev = events(&t);
    assert_eq!(ev[0].0, "enqueued", "{ev:?}");
    assert!(ev[0].1.contains("agent JOHN") && ev[0].1.contains("correlation C0"), "{ev:?}");
    let moved = ev.iter().find(|e| e.0 == "exception").expect("the move");
    assert!(
        moved.1.contains(&format!("from {Q} to exception queue {EQ}: MAX_RETRY_EXCEEDED, after 2 failed")),
        "{moved:?}"
    );

    // Only exception queues.
    let out = admin(&h.url, &["replay", Q, "--as", "ops"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("is not an exception queue"), "{said}");

    // A dry run counts and lists, and changes nothing.
    let r = json(&admin(&h.url, &["replay", EQ, "--dry-run", "--json", "--as", "ops"]));
    assert_eq!((r["matched"].as_u64(), r["replayed"].as_u64(), r["capped"].as_bool()), (Some(7), Some(0), Some(false)));
    let r = json(&admin(&h.url, &["replay", EQ, "--reason", "time_expiration", "--dry-run", "--json", "--as", "ops"]));
    assert_eq!(r["matched"].as_u64(), Some(2));
    assert_eq!(depths(&h).await, (0, 7));
    assert_eq!(json(&admin(&h.url, &["audit", "--json"])), Value::Array(vec![]));

    // By reason, capped, one message per transaction: progress per batch.
    let out = admin(
        &h.url,
        &["replay", EQ, "--reason", "MAX_RETRY_EXCEEDED", "--max", "3", "--batch", "1", "--json", "--as", "ops"],
    );
    let r = json(&out);
    assert_eq!((r["matched"].as_u64(), r["replayed"].as_u64(), r["capped"].as_bool()), (Some(3), Some(3), Some(true)));
    let progress = String::from_utf8_lossy(&out.stderr);
    assert_eq!(progress.lines().filter(|l| l.starts_with("replayed ")).count(), 3, "{progress}");
    assert_eq!(depths(&h).await, (3, 4));
    let rows = r["rows"].as_array().expect("rows");
    let firsts: Vec<&str> = rows.iter().map(|r| r["msgid"].as_str().unwrap_or("")).collect();
    assert_eq!(firsts, ids[..3].iter().map(String::as_str).collect::<Vec<_>>(), "the oldest first");
    let new0 = rows[0]["new_msgid"].as_str().expect("a new id").to_string();
    let audit = json(&admin(&h.url, &["audit", "--json"]));
    let audit = audit.as_array().expect("rows");
    assert_eq!(audit.len(), 3, "a row per batch: {audit:?}");
    for a in audit {
        assert_eq!(
            (a["actor"].as_str(), a["action"].as_str(), a["queue"].as_str()),
            (Some("ops"), Some("replay"), Some(EQ))
        );
        assert_eq!((a["count"].as_i64(), a["target"].as_str()), (Some(1), Some(Q)));
        assert_eq!(a["filter"], "--reason MAX_RETRY_EXCEEDED");
        assert_eq!(a["run"], r["run"]);
    }
    assert_eq!(audit[2]["msgids"], serde_json::json!([ids[0]]), "newest first");

    // The replayed message: receivable on its queue, no failed dequeues, linked to its id.
    let view = json(&admin(&h.url, &["messages", Q, "--json"]));
    let first = &view.as_array().expect("rows")[0];
    assert_eq!(
        (first["MSG_ID"].as_str(), first["ORIGINAL_MSGID"].as_str()),
        (Some(new0.as_str()), Some(ids[0].as_str()))
    );
    assert_eq!((first["RETRY_COUNT"].as_str(), first["MSG_STATE"].as_str()), (Some("0"), Some("READY")));
    assert_eq!((first["CORR_ID"].as_str(), first["EXPIRATION"].as_str()), (Some("C0"), None));
    let mut s = h.session("SCOTT");
    let got = h.run(&mut s, &receive(Q, "<wait_time>0</wait_time>", COMMIT)).await.expect("receive");
    let got = received(&got);
    assert_eq!(got[0].header.message_id.as_deref(), Some(new0.as_str()));
    assert_eq!(got[0].header.correlation.as_deref(), Some("C0"));

    // By id: exactly that one.
    let r = json(&admin(&h.url, &["replay", EQ, "--msgid", &ids[4].to_lowercase(), "--json", "--as", "ops"]));
    assert_eq!(r["replayed"].as_u64(), Some(1));
    assert_eq!(r["rows"][0]["msgid"].as_str(), Some(ids[4].as_str()));
    assert_eq!(depths(&h).await, (3, 3));
    // By correlation.
    let r = json(&admin(&h.url, &["replay", EQ, "--correlation", "X1", "--json", "--as", "ops"]));
    assert_eq!((r["replayed"].as_u64(), r["rows"][0]["correlation"].as_str()), (Some(1), Some("X1")));
    assert_eq!(depths(&h).await, (4, 2));
    let table = ok(&admin(&h.url, &["audit"]));
    assert!(table.lines().count() == 6 && table.contains("--correlation \"X1\""), "{table}");

    // After: the original names the replay (while the copy is there) and its audit row,
    // the copy its original. The first copy was dequeued: its audit row remains.
    let ev = events(&timeline(&h.url, &ids[0]));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].0 == "audit" && ev[0].1.contains(&format!("replay by ops from {EQ} to {Q}")), "{ev:?}");
    let ev = events(&timeline(&h.url, &ids[1]));
    assert!(ev.iter().any(|e| e.0 == "audit"), "{ev:?}");
    let new1 = ev.iter().find(|e| e.0 == "replayed_to").map(|e| e.1[..32].to_string()).expect("replayed");
    assert_eq!(new1, rows[1]["new_msgid"].as_str().expect("its id"));
    let ev = events(&timeline(&h.url, &new1));
    assert!(ev.iter().any(|e| e.0 == "replayed_from" && e.1.contains(&ids[1])), "{ev:?}");
    let table = ok(&admin(&h.url, &["timeline", &ids[0]]));
    assert!(table.starts_with(&format!("message {}: no longer in the store", ids[0])), "{table}");

    // Bounds.
    for (flag, v) in [("--max", "0"), ("--max", "10001"), ("--batch", "0")] {
        let out = admin(&h.url, &["replay", EQ, flag, v, "--as", "ops"]);
        assert!(!out.status.success(), "{flag} {v}");
    }
    let out = admin(&h.url, &["replay", EQ, "--reason", "SOMETIME", "--as", "ops"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("MAX_RETRY_EXCEEDED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_moves_what_the_filter_takes_on_sqlite() {
    replay_moves_what_the_filter_takes(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_moves_what_the_filter_takes_on_postgres() {
    replay_moves_what_the_filter_takes(Backend::Postgres).await;
}

/// A replay killed (-9) between its batches: each message is in the exception queue or
/// replayed once, and the audit log counts exactly the replayed ones.
async fn a_killed_replay_loses_and_doubles_nothing(b: Backend) {
    let h = harness(b).await;
    // Enough that the replay is still going when the kill comes, however fast the machine.
    const N: i64 = 1_000;
    expire(&h, N as usize).await;
    assert_eq!(depths(&h).await, (0, N));
    let mut child = Command::new(BIN)
        .args(["admin", "replay", EQ, "--max", "10000", "--batch", "1", "--as", "ops", "--database", &h.url])
        .env_remove("AQGATE_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = 0;
    while seen < 20 {
        let line = lines.next().expect("progress").expect("a line");
        seen += usize::from(line.starts_with("replayed "));
    }
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    let (q, eq) = depths(&h).await;
    assert!((20..N).contains(&q), "killed in the middle: {q} replayed");
    assert_eq!(q + eq, N, "every message in one of the two queues");
    let audit = json(&admin(&h.url, &["audit", "--json", "--limit", "100000"]));
    let counted: i64 = audit.as_array().expect("rows").iter().map(|a| a["count"].as_i64().unwrap_or(0)).sum();
    assert_eq!(counted, q, "the audit log says exactly what moved");
    let view = json(&admin(&h.url, &["messages", Q, "--json", "--limit", "100000"]));
    let mut origins: Vec<&str> =
        view.as_array().expect("rows").iter().map(|r| r["ORIGINAL_MSGID"].as_str().unwrap_or("")).collect();
    origins.sort_unstable();
    origins.dedup();
    assert_eq!(origins.len() as i64, q, "each replayed once");
    // The rest follows.
    let r = json(&admin(&h.url, &["replay", EQ, "--max", "10000", "--json", "--as", "ops"]));
    assert_eq!(r["replayed"].as_i64(), Some(N - q));
    assert_eq!(depths(&h).await, (N, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replay_loses_and_doubles_nothing_on_sqlite() {
    a_killed_replay_loses_and_doubles_nothing(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replay_loses_and_doubles_nothing_on_postgres() {
    a_killed_replay_loses_and_doubles_nothing(Backend::Postgres).await;
}

/// `admin sessions` lists an open session with what it holds (never its id), and
/// `--abort` ends it: its locked message is released with a failed dequeue counted, its
/// uncommitted enqueue is gone, and its next request is told the session ended.
async fn sessions_are_listed_and_aborted(b: Backend) {
    let h = harness(b).await;
    let mut s = h.session("JOHN");
    h.run(&mut s, &raw_send(Q, &[("<correlation>K</correlation>", "0A")], COMMIT)).await.expect("send");
    let got = h.run(&mut s, &receive(Q, "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert_eq!(received(&got).len(), 1);
    h.run(&mut s, &raw_send(Q, &[("<correlation>U</correlation>", "0B")], "")).await.expect("open send");
    let list = json(&admin(&h.url, &["sessions", "--json"]));
    let list = list.as_array().expect("rows");
    assert_eq!(list.len(), 1, "{list:?}");
    let row = &list[0];
    assert_eq!(
        (row["agent"].as_str(), row["locked"].as_i64(), row["enqueued"].as_i64()),
        (Some("JOHN"), Some(1), Some(1))
    );
    assert_eq!(row["pending"], true);
    let id = row["id"].as_str().expect("id").to_string();
    assert_eq!(id.len(), 12, "a prefix of the hash only");
    let table = ok(&admin(&h.url, &["sessions"]));
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with(&id) && l.contains("JOHN")), "{table}");

    let out = admin(&h.url, &["sessions", "--abort", "zz"]);
    assert!(!out.status.success());
    let out = admin(&h.url, &["sessions", "--abort", "000000000000"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no open session"));
    let said = ok(&admin(&h.url, &["sessions", "--abort", &id]));
    assert!(said.contains("rolled back"), "{said}");
    assert_eq!(json(&admin(&h.url, &["sessions", "--json"])), Value::Array(vec![]));
    assert_eq!(depths(&h).await, (1, 0), "the locked message back, the open enqueue gone");
    let view = json(&admin(&h.url, &["messages", Q, "--json"]));
    assert_eq!((view[0]["CORR_ID"].as_str(), view[0]["RETRY_COUNT"].as_str()), (Some("K"), Some("1")));
    assert!(h.run(&mut s, &envelope(COMMIT)).await.is_err(), "the aborted session's commit is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_aborted_on_sqlite() {
    sessions_are_listed_and_aborted(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_aborted_on_postgres() {
    sessions_are_listed_and_aborted(Backend::Postgres).await;
}
