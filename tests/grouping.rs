//! Message grouping (`message_grouping = "transactional"`) in a real `aqgate serve`, over
//! HTTP IDAP, on SQLite and PostgreSQL: a group per enqueue transaction (visible at its
//! commit), NEXT_MESSAGE within a group and 25235 at its end, NEXT_TRANSACTION and
//! FIRST_MESSAGE, BROWSE, one consumer session per group at a time (and a rollback giving
//! it up), consumers racing for groups through two processes on one PostgreSQL database;
//! the refusals: NEXT_TRANSACTION on a queue without grouping, buffered messages on a
//! grouped queue, `admin apply` changing the grouping of a queue that holds messages.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

const GROUPED: &str = r#"
[[queue_tables]]
name = "AQUSER.GRP_TAB"
payload_type = "RAW"
message_grouping = "transactional"

[[queues]]
name = "AQUSER.GRP_QUE"
queue_table = "AQUSER.GRP_TAB"
"#;

const QUEUE: &str = "AQUSER.GRP_QUE";

/// Fault 25235: fetched all messages in current transaction (the group's end).
const FETCHED_ALL: i32 = 25235;

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (grouping)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")]),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// A send of RAW `payloads` (hex) to `queue`, with `producer_extra` in its
/// producer_options and `tail` (a commit) after the message set.
fn send(queue: &str, producer_extra: &str, payloads: &[&str], tail: &str) -> String {
    let mut set = format!("<message_count>{}</message_count>", payloads.len());
    for (i, p) in payloads.iter().enumerate() {
        set.push_str(&format!(
            "<message><message_number>{}</message_number><message_payload><raw>{p}</raw></message_payload></message>",
            i + 1
        ));
    }
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{queue}</destination>{producer_extra}</producer_options><message_set>{set}</message_set>{tail}</AQXmlSend>"#
    ))
}

/// A session's cookie, or none yet.
type Cookie = Option<String>;

/// The request's answer: OK, or the Fault's code and text.
async fn call(port: u16, cookie: &mut Cookie, body: &str) -> Result<Response, (i32, String)> {
    match idap_in(port, SCOTT, cookie, body).await {
        Response::Fault(f) => Err((f.code, f.message)),
        r => Ok(r),
    }
}

/// A receive in the session (`opts` in its consumer_options, no wait): the payload, or
/// the Fault's code.
async fn recv(port: u16, cookie: &mut Cookie, opts: &str) -> Result<String, i32> {
    let body = receive(QUEUE, &format!("<wait_time>0</wait_time>{opts}"), "");
    match call(port, cookie, &body).await {
        Ok(r) => {
            let ms = received(&r);
            assert_eq!(ms.len(), 1, "{r:?}");
            Ok(raw_of(&ms[0]))
        }
        Err((code, _)) => Err(code),
    }
}

async fn ok(port: u16, cookie: &mut Cookie, body: &str) {
    if let Err(e) = call(port, cookie, body).await {
        panic!("refused: {e:?}");
    }
}

const NEXT: &str = "";
const NEXT_TX: &str = "<navigation_mode>NEXT_TRANSACTION</navigation_mode>";
const FIRST: &str = "<navigation_mode>FIRST_MESSAGE</navigation_mode>";
const BROWSE: &str = "<dequeue_mode>BROWSE</dequeue_mode>";

/// Group 1 (A1, A2 in one request and A3 in the next, then a commit), group 2 (B1, then
/// B2 with the commit), and C1 sent IMMEDIATE (a transaction of its own).
async fn enqueue_three_groups(port: u16) {
    let (mut a, mut b, mut other) = (None, None, None);
    ok(port, &mut a, &send(QUEUE, "", &["A1", "A2"], "")).await;
    ok(port, &mut b, &send(QUEUE, "", &["B1"], "")).await;
    ok(port, &mut a, &send(QUEUE, "", &["A3"], "")).await;
    // Nothing of an uncommitted group is visible to others.
    assert_eq!(recv(port, &mut other, BROWSE).await, Err(code::NO_MESSAGE));
    ok(port, &mut a, &envelope(COMMIT)).await;
    ok(port, &mut b, &send(QUEUE, "", &["B2"], COMMIT)).await;
    ok(port, &mut None, &send(QUEUE, "<visibility>IMMEDIATE</visibility>", &["C1"], "")).await;
}

async fn navigation_and_exclusivity(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topology = demo_topology_with("grouping", GROUPED);
    let server = serve(&db, port, &topology);
    enqueue_three_groups(port).await;

    // BROWSE: group 1 in order, its end, the next group, and FIRST_MESSAGE from the start.
    let mut look = None;
    assert_eq!(recv(port, &mut look, BROWSE).await, Ok("A1".into()));
    assert_eq!(recv(port, &mut look, BROWSE).await, Ok("A2".into()));
    assert_eq!(recv(port, &mut look, BROWSE).await, Ok("A3".into()));
    assert_eq!(recv(port, &mut look, BROWSE).await, Err(FETCHED_ALL));
    assert_eq!(recv(port, &mut look, &format!("{BROWSE}{NEXT_TX}")).await, Ok("B1".into()));
    assert_eq!(recv(port, &mut look, &format!("{BROWSE}{FIRST}")).await, Ok("A1".into()));

    // REMOVE (ON_COMMIT): group 1, 25235 at its end (again on asking again), group 2 by
    // NEXT_TRANSACTION, then C1's group.
    let mut c1 = None;
    for want in ["A1", "A2", "A3"] {
        assert_eq!(recv(port, &mut c1, NEXT).await, Ok(want.into()));
    }
    assert_eq!(recv(port, &mut c1, NEXT).await, Err(FETCHED_ALL));
    assert_eq!(recv(port, &mut c1, NEXT).await, Err(FETCHED_ALL));
    assert_eq!(recv(port, &mut c1, NEXT_TX).await, Ok("B1".into()));
    assert_eq!(recv(port, &mut c1, NEXT).await, Ok("B2".into()));
    assert_eq!(recv(port, &mut c1, NEXT).await, Err(FETCHED_ALL));
    assert_eq!(recv(port, &mut c1, NEXT_TX).await, Ok("C1".into()));
    assert_eq!(recv(port, &mut c1, NEXT_TX).await, Err(code::NO_MESSAGE));
    // FIRST_MESSAGE starts from the first group again: all of them are this client's.
    assert_eq!(recv(port, &mut c1, FIRST).await, Err(code::NO_MESSAGE));
    ok(port, &mut c1, &envelope(ROLLBACK)).await;

    // One session per group: c1 holds group 1 with its first message, so c2 gets group 2
    // (and continues in it), c3 C1's group; c4 finds every group held.
    let (mut c1, mut c2, mut c3, mut c4) = (None, None, None, None);
    assert_eq!(recv(port, &mut c1, NEXT).await, Ok("A1".into()));
    assert_eq!(recv(port, &mut c2, NEXT).await, Ok("B1".into()));
    assert_eq!(recv(port, &mut c3, FIRST).await, Ok("C1".into()));
    assert_eq!(recv(port, &mut c4, NEXT).await, Err(code::NO_MESSAGE));
    assert_eq!(recv(port, &mut c2, NEXT).await, Ok("B2".into()));
    // A browse is not held off.
    assert_eq!(recv(port, &mut None, BROWSE).await, Ok("A1".into()));
    // c1's rollback gives group 1 up, whole: c4 takes it from its first message.
    ok(port, &mut c1, &envelope(ROLLBACK)).await;
    assert_eq!(recv(port, &mut c4, NEXT).await, Ok("A1".into()));
    assert_eq!(recv(port, &mut c4, NEXT).await, Ok("A2".into()));
    // A LOCKED dequeue holds its group too.
    ok(port, &mut c3, &envelope(ROLLBACK)).await;
    let mut locker = None;
    assert_eq!(recv(port, &mut locker, "<dequeue_mode>LOCKED</dequeue_mode>").await, Ok("C1".into()));
    assert_eq!(recv(port, &mut c3, NEXT).await, Err(code::NO_MESSAGE));
    ok(port, &mut locker, &envelope(ROLLBACK)).await;
    for c in [&mut c2, &mut c4] {
        ok(port, c, &envelope(COMMIT)).await;
    }
    // What is left: A3 (c4 committed A1, A2) and C1.
    let mut rest = Vec::new();
    while let Ok(p) = recv(port, &mut None, &format!("<visibility>IMMEDIATE</visibility>{FIRST}")).await {
        rest.push(p);
    }
    assert_eq!(rest, ["A3", "C1"]);

    // NEXT_TRANSACTION is refused on a queue without grouping; buffered messages on a
    // grouped one.
    let e = call(port, &mut None, &receive("AQUSER.RAW_QUE", &format!("<wait_time>0</wait_time>{NEXT_TX}"), ""))
        .await
        .expect_err("NEXT_TRANSACTION without grouping");
    assert_eq!(e.0, code::INVALID_VALUE, "{e:?}");
    assert!(e.1.contains("message grouping"), "{e:?}");
    let buffered = r#"<visibility>IMMEDIATE</visibility><aqgate:delivery_mode xmlns:aqgate="urn:aqgate:idap">BUFFERED</aqgate:delivery_mode>"#;
    let e = call(port, &mut None, &send(QUEUE, buffered, &["D1"], "")).await.expect_err("buffered send");
    assert_eq!(e.0, code::INVALID_VALUE, "{e:?}");
    assert!(e.1.contains("grouping"), "{e:?}");
    let e = call(port, &mut None, &receive(QUEUE, &format!("<wait_time>0</wait_time>{buffered}"), ""))
        .await
        .expect_err("buffered receive");
    assert!(e.0 == code::INVALID_VALUE && e.1.contains("grouping"), "{e:?}");

    // `admin apply` does not change the grouping of a queue that holds messages.
    ok(port, &mut None, &send(QUEUE, "", &["E1"], COMMIT)).await;
    drop(server);
    let ungrouped = demo_topology_with("grouping-off", &GROUPED.replace("transactional", "none"));
    let apply = |t: &std::path::Path| {
        Command::new(BIN)
            .args(["admin", "apply", t.to_str().expect("utf-8"), "--database", &db])
            .output()
            .expect("admin apply")
    };
    let out = apply(&ungrouped);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("message_grouping"), "{err}");
    assert!(err.contains("AQUSER.GRP_QUE holds 1 message(s)"), "{err}");
    // The same table grouped as it was: nothing to refuse.
    let out = apply(&topology);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_groups_are_navigated_and_held_by_one_session() {
    navigation_and_exclusivity(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_groups_are_navigated_and_held_by_one_session() {
    navigation_and_exclusivity(Backend::Postgres).await;
}

/// Consumers race for groups, each taking a whole group (NEXT_MESSAGE until 25235) and
/// committing: every group is taken once, whole, in order, by one consumer.
async fn race(ports: &[u16], groups: usize, per: usize) {
    for g in 0..groups {
        let payloads: Vec<String> = (0..per).map(|i| format!("{g:02X}{i:02X}")).collect();
        let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
        ok(ports[g % ports.len()], &mut None, &send(QUEUE, "", &refs, COMMIT)).await;
    }
    let mut tasks = Vec::new();
    for c in 0..6 {
        let port = ports[c % ports.len()];
        tasks.push(tokio::spawn(async move {
            let mut taken: Vec<Vec<String>> = Vec::new();
            let mut idle = 0;
            while idle < 3 {
                let mut cookie = None;
                let mut group = Vec::new();
                loop {
                    match recv(port, &mut cookie, NEXT).await {
                        Ok(p) => group.push(p),
                        Err(FETCHED_ALL) => break,
                        Err(code::NO_MESSAGE) if group.is_empty() => break,
                        Err(e) => panic!("consumer {c}: fault {e}"),
                    }
                }
                if group.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                ok(port, &mut cookie, &envelope(COMMIT)).await;
                taken.push(group);
            }
            taken
        }));
    }
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in tasks {
        for group in t.await.expect("consumer") {
            let id = group[0][..2].to_string();
            assert!(group.iter().all(|p| p.starts_with(&id)), "one take mixed groups: {group:?}");
            assert!(seen.insert(id, group.clone()).is_none(), "a group was taken twice: {group:?}");
        }
    }
    assert_eq!(seen.len(), groups, "{seen:?}");
    for (id, group) in &seen {
        let want: Vec<String> = (0..per).map(|i| format!("{id}{i:02X}")).collect();
        assert_eq!(group, &want, "group {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_consumers_each_take_whole_groups() {
    let db = fresh_url(Backend::Sqlite).await;
    let port = free_port();
    let _server = serve(&db, port, &demo_topology_with("grouping-race", GROUPED));
    race(&[port], 12, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_consumers_of_two_processes_each_take_whole_groups() {
    let db = fresh_url(Backend::Postgres).await;
    let topology = demo_topology_with("grouping-race", GROUPED);
    let (p1, p2) = (free_port(), free_port());
    let _one = serve(&db, p1, &topology);
    let _two = serve(&db, p2, &topology);
    race(&[p1, p2], 16, 3).await;
}
