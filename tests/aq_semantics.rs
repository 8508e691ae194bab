//! Oracle AQ's queue semantics over real HTTP, on SQLite and on PostgreSQL: the default
//! exception queue `AQ$_<TABLE>_E` (listed, granted, NULL `exception_queue` after a
//! fallback), the JMS properties the server fills at dequeue (`timestamp`, `userid`), the
//! four `sort_list` orders, `retry_delay` after a rollback, `retention_time` with the
//! dequeue history (PROCESSED messages in the views), and `max_retries` on a
//! multi-consumer queue (through the real binary).

mod common;

use std::sync::Arc;
use std::time::Duration;

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{Limits, Response};
use common::*;

/// Queues of each sort order, a queue with a retry delay, and a grant on a default
/// exception queue, beside the default topology.
const EXTRA: &str = r#"
[[queue_tables]]
name = "AQUSER.BY_PRIO_TAB"
payload_type = "RAW"
sort_list = "priority"

[[queues]]
name = "AQUSER.BY_PRIO"
queue_table = "AQUSER.BY_PRIO_TAB"

[[queue_tables]]
name = "AQUSER.FIFO_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.FIFO"
queue_table = "AQUSER.FIFO_TAB"

[[queue_tables]]
name = "AQUSER.TIME_PRIO_TAB"
payload_type = "RAW"
sort_list = "enq_time,priority"

[[queues]]
name = "AQUSER.TIME_PRIO"
queue_table = "AQUSER.TIME_PRIO_TAB"

[[queue_tables]]
name = "AQUSER.RETRY_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.RETRY"
queue_table = "AQUSER.RETRY_TAB"
retry_delay = 2
max_retries = 1

[[grants]]
user = "OE"
queue = "QS.AQ$_ORDERS_SQTAB_E"
privilege = "dequeue"

[[queue_tables]]
name = "AQUSER.KEPT_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.KEPT"
queue_table = "AQUSER.KEPT_TAB"
retention_time = 2

[[queues]]
name = "AQUSER.KEPT_FOREVER"
queue_table = "AQUSER.KEPT_TAB"
retention_time = "FOREVER"

[[queue_tables]]
name = "AQUSER.KEPT_TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.KEPT_TOPIC"
queue_table = "AQUSER.KEPT_TOPIC_TAB"
retention_time = 3600

[[subscribers]]
queue = "AQUSER.KEPT_TOPIC"
name = "A"

[[subscribers]]
queue = "AQUSER.KEPT_TOPIC"
name = "B"
"#;

struct Server {
    port: u16,
    engine: Arc<Engine>,
    /// The database's URL.
    url: String,
}

async fn start(b: Backend) -> Server {
    let url = fresh_url(b).await;
    let store = store_with_topology(&url, &format!("{}\n{EXTRA}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let engine = Engine::start(store, Arc::new(SystemClock), EngineConfig::default()).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let router = app(AppState::new(engine.clone(), Limits::default()));
    tokio::spawn(async move { axum::serve(listener, router).await });
    Server { port, engine, url }
}

async fn take(port: u16, agent: (&str, &str), queue: &str) -> Result<Vec<aqgate_proto::idap::Message>, i32> {
    match idap_in(port, agent, &mut None, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await {
        Response::Fault(f) => Err(f.code),
        r => Ok(received(&r)),
    }
}

async fn drain(port: u16, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(ms) = take(port, SCOTT, queue).await {
        out.extend(ms.iter().map(raw_of));
    }
    out
}

fn prio(p: i32) -> String {
    format!("<priority>{p}</priority>")
}

async fn sort_orders(b: Backend) {
    let s = start(b).await;
    // Two requests: the first sends priorities 3, 1, 2; the second 0 and 5.
    for q in ["AQUSER.BY_PRIO", "AQUSER.FIFO", "AQUSER.TIME_PRIO", "AQUSER.RAW_QUE"] {
        let first = raw_send(q, &[(&prio(3), "A3"), (&prio(1), "A1"), (&prio(2), "A2")], COMMIT);
        let r = http(s.port, &first).await;
        assert_eq!(sent_ids(&r).len(), 3, "{q}: {r:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        http(s.port, &raw_send(q, &[(&prio(0), "B0"), (&prio(5), "B5")], COMMIT)).await;
    }
    // priority (and priority,enq_time): by priority, FIFO within one.
    assert_eq!(drain(s.port, "AQUSER.BY_PRIO").await, ["B0", "A1", "A2", "A3", "B5"]);
    assert_eq!(drain(s.port, "AQUSER.RAW_QUE").await, ["B0", "A1", "A2", "A3", "B5"], "priority,enq_time");
    // enq_time: FIFO.
    assert_eq!(drain(s.port, "AQUSER.FIFO").await, ["A3", "A1", "A2", "B0", "B5"]);
    // enq_time,priority: FIFO, one request's messages by priority.
    assert_eq!(drain(s.port, "AQUSER.TIME_PRIO").await, ["A1", "A2", "A3", "B0", "B5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_sort_orders_on_sqlite() {
    sort_orders(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_sort_orders_on_postgres() {
    sort_orders(Backend::Postgres).await;
}

/// A rolled-back dequeue makes the message wait `retry_delay` (state 1) before it is ready
/// again; past `max_retries` it moves to the default exception queue `AQ$_RETRY_TAB_E`,
/// which `admin queues` lists; a grant may name a default exception queue.
async fn retry_delay_and_exception_queues(b: Backend) {
    let s = start(b).await;
    let q = "AQUSER.RETRY";
    http(s.port, &raw_send(q, &[("", "0A")], COMMIT)).await;
    let mut c = None;
    let r = idap_in(s.port, SCOTT, &mut c, &receive(q, "<wait_time>0</wait_time>", "")).await;
    assert_eq!(raw_of(&received(&r)[0]), "0A");
    idap_in(s.port, SCOTT, &mut c, &envelope(ROLLBACK)).await;
    let rolled_back = std::time::Instant::now();
    // Waiting: not ready.
    assert_eq!(take(s.port, SCOTT, q).await.err(), Some(code::NO_MESSAGE), "it waits out its retry delay");
    // A receive that waits gets it when the delay ends, not before.
    let mut c = None;
    let r = idap_in(s.port, SCOTT, &mut c, &receive(q, "<wait_time>10</wait_time>", "")).await;
    let got = received(&r);
    assert_eq!(raw_of(&got[0]), "0A");
    assert!(rolled_back.elapsed() >= Duration::from_millis(1_900), "ready after the retry delay");
    assert_eq!(got[0].header.delivery_count, Some(1));
    // Rolled back a second time: past max_retries (1), it moves to the exception queue.
    idap_in(s.port, SCOTT, &mut c, &envelope(ROLLBACK)).await;
    let queues = aqgate_admin::queues(s.engine.store().as_ref()).await.expect("queues");
    let eq = queues.iter().find(|r| r.name == "AQUSER.AQ$_RETRY_TAB_E").expect("admin queues lists it");
    assert_eq!(eq.depth, 1);
    // The view tells it from an expired one: why, where from, after how many failed dequeues.
    let moved = sql_client(
        &s.url,
        r#"SELECT queue, msg_state, retry_count, expiration_reason, original_queue_name FROM "AQUSER.AQ$RETRY_TAB""#,
    );
    assert_eq!(moved, ["AQUSER.AQ$_RETRY_TAB_E|EXPIRED|2|MAX_RETRY_EXCEEDED|AQUSER.RETRY"]);
    // john (user OE) reads it through the grant; the message names no exception queue of
    // its own, so the one it is in (the default) reads as NULL.
    let ms = take(s.port, ("john", "welcome"), "AQUSER.AQ$_RETRY_TAB_E").await.expect("granted");
    assert_eq!(
        (raw_of(&ms[0]).as_str(), ms[0].header.message_state, ms[0].header.exception_queue.as_deref()),
        ("0A", Some(3), None)
    );
    // A grant may name a default exception queue: john (OE) reads QS's through one; scott
    // (QS, AQUSER) has none on OE's.
    assert_eq!(take(s.port, ("john", "welcome"), "QS.AQ$_ORDERS_SQTAB_E").await.err(), Some(code::NO_MESSAGE));
    assert_eq!(take(s.port, SCOTT, "OE.AQ$_OE_ORDERS_SQTAB_E").await.err(), Some(code::NOT_PERMITTED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_delay_and_the_default_exception_queue_on_sqlite() {
    retry_delay_and_exception_queues(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_delay_and_the_default_exception_queue_on_postgres() {
    retry_delay_and_exception_queues(Backend::Postgres).await;
}

/// A JMS text message round-trips every header field a client may set, and gets the two
/// the server sets: `userid` (the enqueuing agent) and `timestamp` (its enqueue time in
/// milliseconds).
async fn jms_properties(b: Backend) {
    let s = start(b).await;
    let before = chrono::Utc::now().timestamp_millis();
    let send = envelope(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.JMS_TEXTQ</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>C-1</correlation><priority>4</priority></message_header><message_payload><jms_text_message><oracle_jms_properties><type>orders</type><reply_to><agent_name>john</agent_name><address>AQUSER.JMS_TEXTQ</address><protocol>0</protocol></reply_to><appid>APP_X</appid><groupid>G1</groupid><group_sequence>7</group_sequence></oracle_jms_properties><user_properties><property><name>Country</name><string_value>USA</string_value></property></user_properties><text_data>hello</text_data></jms_text_message></message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#,
    );
    let r = http(s.port, &send).await;
    assert_eq!(sent_ids(&r).len(), 1, "{r:?}");
    let after = chrono::Utc::now().timestamp_millis();
    let ms = take(s.port, ("john", "welcome"), "AQUSER.JMS_TEXTQ").await.expect("the message");
    let p = &ms[0].payload;
    let props = p.child("oracle_jms_properties").expect("properties");
    let field = |n: &str| props.child(n).map(|c| c.text());
    assert_eq!(field("type").as_deref(), Some("orders"));
    assert_eq!(field("appid").as_deref(), Some("APP_X"));
    assert_eq!(field("groupid").as_deref(), Some("G1"));
    assert_eq!(field("group_sequence").as_deref(), Some("7"));
    let reply = props.child("reply_to").expect("reply_to");
    assert_eq!(reply.child("agent_name").map(|c| c.text()).as_deref(), Some("john"));
    assert_eq!(reply.child("address").map(|c| c.text()).as_deref(), Some("AQUSER.JMS_TEXTQ"));
    assert_eq!(field("userid").as_deref(), Some("SCOTT"));
    let ts: i64 = field("timestamp").expect("timestamp").parse().expect("milliseconds");
    assert!((before..=after).contains(&ts), "{before} <= {ts} <= {after}");
    let names: Vec<String> = props.elements().map(|c| c.local_name().to_string()).collect();
    assert_eq!(
        names,
        ["type", "reply_to", "userid", "appid", "groupid", "group_sequence", "timestamp"],
        "Oracle's order"
    );
    assert_eq!(p.child("text_data").map(|c| c.text()).as_deref(), Some("hello"));
    assert_eq!(ms[0].header.correlation.as_deref(), Some("C-1"));
    assert_eq!(ms[0].header.priority, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jms_properties_the_server_fills_on_sqlite() {
    jms_properties(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jms_properties_the_server_fills_on_postgres() {
    jms_properties(Backend::Postgres).await;
}

/// Runs SQL against the database `url` with its own command-line client (sqlite3, psql),
/// as a user would: the rows, `|`-separated.
fn sql_client(url: &str, sql: &str) -> Vec<String> {
    let out = match url.strip_prefix("sqlite://") {
        Some(path) => std::process::Command::new("sqlite3").arg(path).arg(sql).output(),
        None => std::process::Command::new("psql").args([url, "-X", "-q", "-A", "-t", "-c", sql]).output(),
    }
    .expect("sqlite3 / psql (scripts/ensure-tools.sh installs them)");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Oracle's `AQ$<QUEUE_TABLE>` views, read by the database's own client, and `aqgate
/// admin messages`, which shows the same rows: READY and WAIT messages with their
/// enqueuing agent and sender, one row per consumer of a multi-consumer message, EXPIRED
/// ones in the exception queue; uncommitted ones are not shown.
async fn views(b: Backend) {
    let Server { port, engine, url } = start(b).await;
    let sender = "<sender_id><agent_name>APP_X</agent_name></sender_id>";
    let msgs = [
        (format!("<correlation>R1</correlation><priority>2</priority>{sender}"), "01"),
        ("<correlation>W1</correlation><delay>3600</delay><expiration>60</expiration>".to_string(), "02"),
        ("<correlation>E1</correlation><expiration>1</expiration>".to_string(), "03"),
    ];
    let msgs: Vec<(&str, &str)> = msgs.iter().map(|(h, p)| (h.as_str(), *p)).collect();
    let r = idap(port, "john", "welcome", &raw_send("AQUSER.RAW_QUE", &msgs, COMMIT)).await;
    let ids = sent_ids(&r);
    // Not committed: not in the view.
    let mut open = None;
    idap_in(port, SCOTT, &mut open, &raw_send("AQUSER.RAW_QUE", &[("<correlation>U1</correlation>", "04")], "")).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Expired, not yet moved by the time manager: EXPIRED where it is.
    let e1 = r#"SELECT queue, msg_state, expiration_reason, original_queue_name, original_queue_owner, retry_count
                  FROM "AQUSER.AQ$RAW_TAB" WHERE corr_id = 'E1'"#;
    assert_eq!(sql_client(&url, e1), ["AQUSER.RAW_QUE|EXPIRED|TIME_EXPIRATION|||0"]);
    assert_eq!(engine.expire_messages().await.expect("time manager"), 1);
    assert_eq!(sql_client(&url, e1), ["AQUSER.AQ$_RAW_TAB_E|EXPIRED|TIME_EXPIRATION|AQUSER.RAW_QUE|AQUSER|0"]);
    // Oracle's 31 columns, in its order.
    let columns = match url.strip_prefix("sqlite://") {
        Some(_) => sql_client(&url, r#"SELECT name FROM pragma_table_info('AQUSER.AQ$RAW_TAB')"#),
        None => sql_client(
            &url,
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'AQUSER.AQ$RAW_TAB' ORDER BY ordinal_position",
        ),
    };
    assert_eq!(columns, aqgate_store::views::COLUMNS, "Oracle's columns in Oracle's order");
    // The payload (RAW in hexadecimal), the enqueuing transaction (one for the three),
    // the times as DATE (whole seconds) and TIMESTAMP, no consumer address on a local queue.
    let rows = sql_client(
        &url,
        r#"SELECT corr_id, user_data, enq_txn_id, length(enq_txn_id), address IS NULL AND protocol IS NULL
             FROM "AQUSER.AQ$RAW_TAB" ORDER BY corr_id"#,
    );
    let t = if url.starts_with("sqlite://") { "1" } else { "t" };
    let txn = rows[0].split('|').nth(2).expect("enq_txn_id").to_string();
    assert_eq!(
        rows,
        [format!("E1|03|{txn}|32|{t}"), format!("R1|01|{txn}|32|{t}"), format!("W1|02|{txn}|32|{t}")],
        "{rows:?}"
    );
    let times = sql_client(
        &url,
        r#"SELECT enq_time, enq_timestamp, delay, delay_timestamp FROM "AQUSER.AQ$RAW_TAB" WHERE corr_id = 'W1'"#,
    );
    let f: Vec<&str> = times[0].split('|').collect();
    // The TIMESTAMP without its fraction of a second is the DATE.
    let whole = |t: &str| match t.split_once('.') {
        Some((a, b)) => format!("{a}{}", b.trim_start_matches(|c: char| c.is_ascii_digit())),
        None => String::new(),
    };
    assert!(!f[0].contains('.') && whole(f[1]) == f[0], "DATE and TIMESTAMP: {f:?}");
    assert!(!f[2].contains('.') && whole(f[3]) == f[2], "DATE and TIMESTAMP: {f:?}");

    let rows = sql_client(
        &url,
        r#"SELECT queue, msg_id, corr_id, msg_priority, msg_state, enq_user_id, sender_name, retry_count, expiration, consumer_name
             FROM "AQUSER.AQ$RAW_TAB" ORDER BY corr_id"#,
    );
    assert_eq!(
        rows,
        [
            format!("AQUSER.AQ$_RAW_TAB_E|{}|E1|1|EXPIRED|JOHN|JOHN|0||", ids[2]),
            format!("AQUSER.RAW_QUE|{}|R1|2|READY|JOHN|APP_X|0||", ids[0]),
            format!("AQUSER.RAW_QUE|{}|W1|1|WAIT|JOHN|JOHN|0|60|", ids[1]),
        ]
    );
    let enq: Vec<String> = sql_client(&url, r#"SELECT enq_time FROM "AQUSER.AQ$RAW_TAB" WHERE corr_id = 'R1'"#);
    assert!(enq[0].starts_with(&chrono::Utc::now().format("%Y-%m-%d").to_string()), "a timestamp: {enq:?}");

    // A multi-consumer message: one row per consumer still to take it.
    let publish = envelope(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.EMP_TOPIC</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>P1</correlation><recipient_list><recipient><agent_name>APP1</agent_name></recipient><recipient><agent_name>APP2</agent_name></recipient></recipient_list></message_header><message_payload><EMP_TYP><EMPNO>1</EMPNO><ENAME>X</ENAME><JOB>Y</JOB><MGR>2</MGR><HIREDATE>2024-01-01 0:0:0</HIREDATE><SAL>1</SAL><COMM>0</COMM><DEPTNO>10</DEPTNO></EMP_TYP></message_payload></message></message_set><AQXmlCommit/></AQXmlPublish>"#,
    );
    let r = http(port, &publish).await;
    assert!(!matches!(r, Response::Fault(_)), "{r:?}");
    let rows = sql_client(
        &url,
        r#"SELECT corr_id, consumer_name, msg_state FROM "AQUSER.AQ$EMP_TOPIC_TAB" ORDER BY consumer_name"#,
    );
    assert_eq!(rows, ["P1|APP1|READY", "P1|APP2|READY"]);
    let data = sql_client(&url, r#"SELECT DISTINCT user_data FROM "AQUSER.AQ$EMP_TOPIC_TAB""#);
    assert!(data.len() == 1 && data[0].starts_with("<EMP_TYP><EMPNO>1</EMPNO>"), "an object payload as XML: {data:?}");

    // admin messages: the same rows.
    let out = aqgate(&["admin", "messages", "aquser.raw_que", "--database", &url, "--json"]).output().expect("admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = v.as_array().expect("rows");
    let states: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["CORR_ID"].as_str().unwrap_or(""), r["MSG_STATE"].as_str().unwrap_or(""))).collect();
    // In dequeue order: the queue sorts by priority (W1's 1 before R1's 2), then enqueue time.
    assert_eq!(states, [("W1", "WAIT"), ("R1", "READY")], "the queue's own rows, in dequeue order");
    assert_eq!(rows[1]["ENQ_USER_ID"], "JOHN");
    let out = aqgate(&["admin", "messages", "AQUSER.RAW_QUE", "--database", &url, "--state", "wait"])
        .output()
        .expect("admin");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().count() == 2 && text.contains("W1"), "{text}");
    let out = aqgate(&["admin", "messages", "AQUSER.NOPE", "--database", &url]).output().expect("admin");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no queue AQUSER.NOPE"));
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aq_views_on_sqlite() {
    views(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aq_views_on_postgres() {
    views(Backend::Postgres).await;
}

fn consumer(name: &str) -> String {
    format!("<consumer_name>{name}</consumer_name><wait_time>0</wait_time>")
}

/// `retention_time`: a removed message stays PROCESSED (in the view and `admin messages`,
/// with who took it, when and after how many failed attempts; never dequeued again) until
/// the time manager deletes it, or forever. A rolled-back dequeue leaves no history. On a
/// multi-consumer queue each consumer's dequeue is recorded as it happens (the dequeue
/// history), with a retention time or without.
async fn retention_and_history(b: Backend) {
    let Server { port, engine, url } = start(b).await;
    let r = idap(
        port,
        "john",
        "welcome",
        &raw_send(
            "AQUSER.KEPT",
            &[("<correlation>K1</correlation>", "01"), ("<correlation>K2</correlation>", "02")],
            COMMIT,
        ),
    )
    .await;
    let ids = sent_ids(&r);
    assert_eq!(ids.len(), 2, "{r:?}");
    http(port, &raw_send("AQUSER.KEPT_FOREVER", &[("<correlation>F1</correlation>", "03")], COMMIT)).await;
    // K1 taken and committed at once.
    assert_eq!(raw_of(&take(port, SCOTT, "AQUSER.KEPT").await.expect("K1")[0]), "01");
    // K2 taken in a transaction that rolls back: it comes back, with no history of that.
    let mut c = None;
    let r = idap_in(port, SCOTT, &mut c, &receive("AQUSER.KEPT", "<wait_time>0</wait_time>", "")).await;
    assert_eq!(raw_of(&received(&r)[0]), "02");
    idap_in(port, SCOTT, &mut c, &envelope(ROLLBACK)).await;
    let view = |sql: &str| sql_client(&url, sql);
    assert_eq!(
        view(r#"SELECT corr_id, msg_state, deq_user_id, retry_count FROM "AQUSER.AQ$KEPT_TAB" ORDER BY corr_id"#),
        ["F1|READY||0", "K1|PROCESSED|SCOTT|0", "K2|READY||1"]
    );
    // Then taken by john in a transaction that commits.
    let mut c = None;
    let r = idap_in(port, ("john", "welcome"), &mut c, &receive("AQUSER.KEPT", "<wait_time>0</wait_time>", "")).await;
    assert_eq!(raw_of(&received(&r)[0]), "02");
    idap_in(port, ("john", "welcome"), &mut c, &envelope(COMMIT)).await;
    assert_eq!(raw_of(&take(port, SCOTT, "AQUSER.KEPT_FOREVER").await.expect("F1")[0]), "03");
    // PROCESSED messages are nobody's to dequeue, and count in no queue's depth.
    assert_eq!(take(port, SCOTT, "AQUSER.KEPT").await.err(), Some(code::NO_MESSAGE));
    let by_id = receive(
        "AQUSER.KEPT",
        &format!("<wait_time>0</wait_time><selector><message_id>{}</message_id></selector>", ids[0]),
        COMMIT,
    );
    assert!(
        matches!(idap_in(port, SCOTT, &mut None, &by_id).await, Response::Fault(f) if f.code == code::NO_SUCH_MESSAGE_ID)
    );
    let queues = aqgate_admin::queues(engine.store().as_ref()).await.expect("queues");
    assert_eq!(queues.iter().find(|q| q.name == "AQUSER.KEPT").map(|q| q.depth), Some(0));
    let rows = view(
        r#"SELECT queue, msg_id, corr_id, msg_state, enq_user_id, deq_user_id, retry_count, deq_time IS NOT NULL, consumer_name IS NULL
             FROM "AQUSER.AQ$KEPT_TAB" ORDER BY corr_id"#,
    );
    let t = if url.starts_with("sqlite://") { "1" } else { "t" };
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows[0].starts_with("AQUSER.KEPT_FOREVER|") && rows[0].contains("|F1|PROCESSED|SCOTT|SCOTT|0|"),
        "{rows:?}"
    );
    assert_eq!(rows[1], format!("AQUSER.KEPT|{}|K1|PROCESSED|JOHN|SCOTT|0|{t}|{t}", ids[0]));
    assert_eq!(rows[2], format!("AQUSER.KEPT|{}|K2|PROCESSED|JOHN|JOHN|1|{t}|{t}", ids[1]));
    // Each dequeue's transaction (DEQ_TXN_ID): K1's and K2's differ, and neither enqueued.
    let txns = view(r#"SELECT deq_txn_id, enq_txn_id FROM "AQUSER.AQ$KEPT_TAB" ORDER BY corr_id"#);
    let txns: Vec<Vec<&str>> = txns.iter().map(|r| r.split('|').collect()).collect();
    assert!(txns[1][0].len() == 32 && txns[2][0].len() == 32 && txns[1][0] != txns[2][0], "{txns:?}");
    assert!(txns[1][0] != txns[1][1] && txns[1][1] == txns[2][1], "K1 and K2 were sent in one: {txns:?}");
    let out = aqgate(&["admin", "messages", "AQUSER.KEPT", "--database", &url, "--state", "processed", "--json"])
        .output()
        .expect("admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let got: Vec<(&str, &str)> = v
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["CORR_ID"].as_str().unwrap_or(""), r["DEQ_USER_ID"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(got, [("K1", "SCOTT"), ("K2", "JOHN")]);
    // Their two seconds over, the time manager deletes them; FOREVER stays.
    engine.purge_processed(false).await;
    assert_eq!(view(r#"SELECT COUNT(*) FROM "AQUSER.AQ$KEPT_TAB""#), ["3"], "not yet");
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    engine.time_manager_round(true).await;
    assert_eq!(view(r#"SELECT corr_id, msg_state FROM "AQUSER.AQ$KEPT_TAB""#), ["F1|PROCESSED"]);

    // A multi-consumer queue with a retention time: each consumer's dequeue shows at once.
    let publish = raw_send("AQUSER.KEPT_TOPIC", &[("<correlation>T1</correlation>", "04")], COMMIT)
        .replace("AQXmlSend", "AQXmlPublish");
    assert!(!matches!(http(port, &publish).await, Response::Fault(_)));
    let mut c = None;
    let r = idap_in(port, SCOTT, &mut c, &receive("AQUSER.KEPT_TOPIC", &consumer("A"), COMMIT)).await;
    assert_eq!(raw_of(&received(&r)[0]), "04");
    let topic =
        r#"SELECT consumer_name, msg_state, deq_user_id FROM "AQUSER.AQ$KEPT_TOPIC_TAB" ORDER BY consumer_name"#;
    assert_eq!(view(topic), ["A|PROCESSED|SCOTT", "B|READY|"]);
    // B's pending remove is not a dequeue yet, and its rollback none at all.
    let mut c = None;
    let r = idap_in(port, ("john", "welcome"), &mut c, &receive("AQUSER.KEPT_TOPIC", &consumer("B"), "")).await;
    assert_eq!(received(&r).len(), 1);
    assert_eq!(view(topic), ["A|PROCESSED|SCOTT", "B|READY|"]);
    idap_in(port, ("john", "welcome"), &mut c, &envelope(ROLLBACK)).await;
    assert_eq!(view(topic), ["A|PROCESSED|SCOTT", "B|READY|"]);
    let r = idap_in(port, ("john", "welcome"), &mut None, &receive("AQUSER.KEPT_TOPIC", &consumer("B"), COMMIT)).await;
    assert_eq!(received(&r).len(), 1);
    // Both consumers have it: the message is kept, with both dequeues.
    assert_eq!(view(topic), ["A|PROCESSED|SCOTT", "B|PROCESSED|JOHN"]);
    assert_eq!(view(r#"SELECT retry_count FROM "AQUSER.AQ$KEPT_TOPIC_TAB" WHERE consumer_name = 'B'"#), ["1"]);

    // Without a retention time the history shows while the message is in the queue, and
    // goes with it.
    let publish = envelope(
        r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.EMP_TOPIC</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>P1</correlation><recipient_list><recipient><agent_name>APP1</agent_name></recipient><recipient><agent_name>APP2</agent_name></recipient></recipient_list></message_header><message_payload><EMP_TYP><EMPNO>1</EMPNO><ENAME>X</ENAME><JOB>Y</JOB><MGR>2</MGR><HIREDATE>2024-01-01 0:0:0</HIREDATE><SAL>1</SAL><COMM>0</COMM><DEPTNO>10</DEPTNO></EMP_TYP></message_payload></message></message_set><AQXmlCommit/></AQXmlPublish>"#,
    );
    assert!(!matches!(http(port, &publish).await, Response::Fault(_)));
    let immediate = |c: &str| format!("{}<visibility>IMMEDIATE</visibility>", consumer(c));
    let r = idap_in(port, SCOTT, &mut None, &receive("AQUSER.EMP_TOPIC", &immediate("APP1"), "")).await;
    assert_eq!(received(&r).len(), 1);
    let emp = r#"SELECT consumer_name, msg_state, deq_user_id FROM "AQUSER.AQ$EMP_TOPIC_TAB" ORDER BY consumer_name"#;
    assert_eq!(view(emp), ["APP1|PROCESSED|SCOTT", "APP2|READY|"]);
    let r = idap_in(port, SCOTT, &mut None, &receive("AQUSER.EMP_TOPIC", &immediate("APP2"), "")).await;
    assert_eq!(received(&r).len(), 1);
    assert!(view(emp).is_empty(), "the message is gone, and its history with it");
    assert_eq!(view("SELECT COUNT(*) FROM dequeue_history"), ["5"], "F1's, T1's two, and P1's two until the purge");
    engine.time_manager_round(true).await;
    assert_eq!(view("SELECT COUNT(*) FROM dequeue_history"), ["3"], "F1's and T1's stay with the kept messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_and_the_dequeue_history_on_sqlite() {
    retention_and_history(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_and_the_dequeue_history_on_postgres() {
    retention_and_history(Backend::Postgres).await;
}

/// `admin messages QUEUE --json` of the binary: (CORR_ID, CONSUMER_NAME, MSG_STATE) of
/// every row.
fn admin_rows(url: &str, queue: &str) -> Vec<(String, String, String)> {
    let out = aqgate(&["admin", "messages", queue, "--database", url, "--json"]).output().expect("admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let field = |r: &serde_json::Value, c: &str| r[c].as_str().unwrap_or("").to_string();
    let mut rows: Vec<_> = v
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (field(r, "CORR_ID"), field(r, "CONSUMER_NAME"), field(r, "MSG_STATE")))
        .collect();
    rows.sort();
    rows
}

fn row(corr: &str, consumer: &str, state: &str) -> (String, String, String) {
    (corr.to_string(), consumer.to_string(), state.to_string())
}

/// max_retries on a multi-consumer queue through the real binary (`aqgate serve` with a
/// topology file, over HTTP; `admin messages` beside it): with max_retries = 1, APP1 rolls
/// a message back twice and no longer sees it (UNDELIVERABLE in the view); the message
/// waits for APP2, and moves to the exception queue at APP2's commit. The other order
/// (APP2 first) moves it at APP1's last rollback. It is never lost.
async fn max_retries_on_a_multi_consumer_queue_through_the_binary(b: Backend) {
    let url = fresh_url(b).await;
    let q = "name = \"AQUSER.EMP_TOPIC\"\nqueue_table = \"AQUSER.EMP_TOPIC_TAB\"\n";
    assert!(aqgate_admin::DEFAULT_TOPOLOGY.contains(q));
    let topology = aqgate_admin::DEFAULT_TOPOLOGY.replacen(q, &format!("{q}max_retries = 1\n"), 1);
    let port = free_port();
    let file = std::env::temp_dir().join(format!("aqgate-retries-{port}.toml"));
    std::fs::write(&file, topology).expect("write topology");
    let listen = format!("127.0.0.1:{port}");
    let mut server = Proc::spawn(
        "aqgate serve",
        aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", &url]).arg("--topology").arg(&file),
    );
    server.wait_ready(port, Duration::from_secs(60));
    let (topic, eq) = ("AQUSER.EMP_TOPIC", "AQUSER.AQ$_EMP_TOPIC_TAB_E");
    let publish = |corr: &str| {
        envelope(&format!(
            r#"<AQXmlPublish xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{topic}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>{corr}</correlation><recipient_list><recipient><agent_name>APP1</agent_name></recipient><recipient><agent_name>APP2</agent_name></recipient></recipient_list></message_header><message_payload><EMP_TYP><EMPNO>1</EMPNO><ENAME>X</ENAME><DEPTNO>30</DEPTNO></EMP_TYP></message_payload></message></message_set><AQXmlCommit/></AQXmlPublish>"#
        ))
    };
    let take = |name: &str, extra: &str| receive(topic, &consumer(name), extra);
    let fault = |r: Response| match r {
        Response::Fault(f) => f.code,
        r => panic!("expected a fault: {r:?}"),
    };
    let fail_twice = |corr: &'static str| async move {
        let mut c = None;
        for i in 0..2 {
            let r = idap_in(port, SCOTT, &mut c, &take("APP1", "")).await;
            assert_eq!(received(&r)[0].header.correlation.as_deref(), Some(corr), "attempt {i}: {r:?}");
            assert!(matches!(idap_in(port, SCOTT, &mut c, &envelope(ROLLBACK)).await, Response::Rollback(_)));
        }
        assert_eq!(fault(idap_in(port, SCOTT, &mut c, &take("APP1", COMMIT)).await), code::NO_MESSAGE);
    };

    // APP1 gives up first: the message waits for APP2, then moves at its commit.
    assert!(!matches!(http(port, &publish("FIRST")).await, Response::Fault(_)));
    fail_twice("FIRST").await;
    assert_eq!(admin_rows(&url, topic), [row("FIRST", "APP1", "UNDELIVERABLE"), row("FIRST", "APP2", "READY")]);
    let out =
        aqgate(&["admin", "messages", topic, "--database", &url, "--state", "undeliverable"]).output().expect("admin");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().count() == 2 && text.contains("UNDELIVERABLE"), "{text}");
    assert!(admin_rows(&url, eq).is_empty());
    let mut c = None;
    let r = idap_in(port, SCOTT, &mut c, &take("APP2", "")).await;
    assert_eq!(received(&r)[0].header.correlation.as_deref(), Some("FIRST"));
    assert!(admin_rows(&url, eq).is_empty(), "not before APP2's commit");
    assert!(matches!(idap_in(port, SCOTT, &mut c, &envelope(COMMIT)).await, Response::Commit(_)));
    assert!(admin_rows(&url, topic).is_empty());
    assert_eq!(admin_rows(&url, eq), [row("FIRST", "", "EXPIRED"), row("FIRST", "APP2", "PROCESSED")]);

    // APP2 first: the message moves at APP1's last rollback.
    assert!(!matches!(http(port, &publish("SECOND")).await, Response::Fault(_)));
    let r = http(port, &take("APP2", COMMIT)).await;
    assert_eq!(received(&r)[0].header.correlation.as_deref(), Some("SECOND"));
    fail_twice("SECOND").await;
    assert!(admin_rows(&url, topic).is_empty());

    // Both in the exception queue, in state 3 (EXPIRED), each once.
    let mut got = Vec::new();
    loop {
        match http(port, &receive(eq, "<wait_time>0</wait_time>", COMMIT)).await {
            Response::Fault(f) => {
                assert_eq!(f.code, code::NO_MESSAGE);
                break;
            }
            r => {
                let m = &received(&r)[0];
                assert_eq!(m.header.message_state, Some(3));
                got.push(m.header.correlation.clone().unwrap_or_default());
            }
        }
    }
    assert_eq!(got, ["FIRST", "SECOND"]);
    drop(server);
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_retries_on_a_multi_consumer_queue_through_the_binary_on_sqlite() {
    max_retries_on_a_multi_consumer_queue_through_the_binary(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_retries_on_a_multi_consumer_queue_through_the_binary_on_postgres() {
    max_retries_on_a_multi_consumer_queue_through_the_binary(Backend::Postgres).await;
}
