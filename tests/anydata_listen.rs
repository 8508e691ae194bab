//! `SYS.ANYDATA` queues and LISTEN over real HTTP, on SQLite and on PostgreSQL: one queue
//! holding messages of several types, each returned as sent with its type
//! (`aqgate:type_name`), unknown or invalid ones refused as payload mismatches, conditions
//! that look into the payload refused, the `AQ$` view's `user_data`; LISTEN on three queues
//! answered with the one a concurrent send reaches while it waits (and the message still
//! there), its time-out, its privilege check and its bound on agents.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{Limits, ListenResult, Response};
use aqgate_proto::payload::type_name_attr;
use common::*;

const EXTRA: &str = r#"
[[queue_tables]]
name = "AQUSER.ANY_TAB"
payload_type = "SYS.ANYDATA"

[[queues]]
name = "AQUSER.ANY_Q"
queue_table = "AQUSER.ANY_TAB"

[[queue_tables]]
name = "AQUSER.ANY_TOPIC_TAB"
payload_type = "SYS.ANYDATA"
multiple_consumers = true

[[queues]]
name = "AQUSER.ANY_TOPIC"
queue_table = "AQUSER.ANY_TOPIC_TAB"

[[subscribers]]
queue = "AQUSER.ANY_TOPIC"
name = "APP1"

[[queue_tables]]
name = "AQUSER.L_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.L1"
queue_table = "AQUSER.L_TAB"

[[queues]]
name = "AQUSER.L2"
queue_table = "AQUSER.L_TAB"

[[queue_tables]]
name = "OE.L_TAB"
payload_type = "RAW"

[[queues]]
name = "OE.L_OTHER"
queue_table = "OE.L_TAB"
"#;

async fn start(b: Backend) -> (u16, String) {
    let url = fresh_url(b).await;
    let store = store_with_topology(&url, &format!("{}\n{EXTRA}", aqgate_admin::DEFAULT_TOPOLOGY)).await;
    let engine = Engine::start(store, Arc::new(SystemClock), EngineConfig::default()).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let router = app(AppState::new(engine, Limits::default()));
    tokio::spawn(async move { axum::serve(listener, router).await });
    (port, url)
}

fn send(dest: &str, payload: &str, method: &str) -> String {
    envelope(&format!(
        r#"<{method} xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set><message><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></{method}>"#
    ))
}

fn fault(r: &Response) -> Option<i32> {
    match r {
        Response::Fault(f) => Some(f.code),
        _ => None,
    }
}

/// Runs `sql` with the database's own client: the rows, `|`-separated.
fn sql_client(url: &str, sql: &str) -> Vec<String> {
    let out = match url.strip_prefix("sqlite://") {
        Some(path) => std::process::Command::new("sqlite3").arg(path).arg(sql).output(),
        None => std::process::Command::new("psql").args([url, "-X", "-q", "-A", "-t", "-c", sql]).output(),
    }
    .expect("sqlite3 / psql");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

async fn anydata(b: Backend) {
    let (port, url) = start(b).await;
    let q = "AQUSER.ANY_Q";
    let customer = "<CUSTOMER_TYP><CUSTNO>7</CUSTNO><NAME>Ann &amp; Bob</NAME></CUSTOMER_TYP>";
    let jms = "<jms_text_message><text_data>hello</text_data></jms_text_message>";
    let xml = r#"<order a:type_name="SYS.XMLTYPE" xmlns:a="urn:aqgate:idap"><line n="1">pen</line></order>"#;
    for p in [customer, "<raw>0a1B</raw>", jms, xml, "<VARCHAR2>just text</VARCHAR2>"] {
        let r = http(port, &send(q, p, "AQXmlSend")).await;
        assert_eq!(sent_ids(&r).len(), 1, "{p}: {r:?}");
    }
    // The view shows the stored form: the value tagged with its type.
    let rows = sql_client(&url, r#"SELECT user_data FROM "AQUSER.AQ$ANY_TAB" ORDER BY enq_time"#);
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(
        rows[0],
        r#"<ANYDATA type="CUSTOMER_TYP"><CUSTOMER_TYP><CUSTNO>7</CUSTNO><NAME>Ann &amp; Bob</NAME></CUSTOMER_TYP></ANYDATA>"#
    );
    assert_eq!(rows[1], r#"<ANYDATA type="SYS.RAW"><raw>0A1B</raw></ANYDATA>"#);
    // A condition cannot look into an ANYDATA payload; message properties it may use.
    let cond = receive(q, "<selector><condition>tab.user_data.custno = 7</condition></selector>", COMMIT);
    assert_eq!(fault(&http(port, &cond).await), Some(code::BAD_CONDITION));
    // Nor can a transformation apply to one, either way.
    let named = receive(q, "<wait_time>0</wait_time><transformation>AQUSER.ORDER_TO_EMP</transformation>", COMMIT);
    assert_eq!(fault(&http(port, &named).await), Some(code::PAYLOAD_MISMATCH));
    let into = send(q, customer, "AQXmlSend")
        .replace("</destination>", "</destination><transformation>AQUSER.ORDER_TO_EMP</transformation>");
    assert_eq!(fault(&http(port, &into).await), Some(code::PAYLOAD_MISMATCH));
    // Each comes back as it was sent, with its type.
    let mut got = Vec::new();
    for _ in 0..5 {
        let r = http(port, &receive(q, "<wait_time>0</wait_time>", COMMIT)).await;
        let m = received(&r).remove(0);
        got.push((type_name_attr(&m.payload).map(str::to_string), m.payload));
    }
    let types: Vec<&str> = got.iter().map(|(t, _)| t.as_deref().unwrap_or("-")).collect();
    assert_eq!(types, ["CUSTOMER_TYP", "SYS.RAW", "SYS.AQ$_JMS_TEXT_MESSAGE", "SYS.XMLTYPE", "SYS.VARCHAR2"]);
    assert_eq!(got[0].1.name, "CUSTOMER_TYP");
    assert_eq!(got[0].1.child("NAME").map(|n| n.text()).as_deref(), Some("Ann & Bob"));
    assert_eq!((got[1].1.name.as_str(), got[1].1.text().as_str()), ("raw", "0A1B"));
    let text = got[2].1.child("text_data").map(|n| n.text());
    assert_eq!(text.as_deref(), Some("hello"));
    // A JMS message in an ANYDATA queue gets the server's JMS fields as in a JMS queue.
    let userid = got[2].1.child("oracle_jms_properties").and_then(|p| p.child("userid")).map(|u| u.text());
    assert_eq!(userid.as_deref(), Some("SCOTT"));
    assert_eq!(got[3].1.name, "order");
    assert_eq!(
        got[3].1.child("line").map(|l| (l.attrs.clone(), l.text())),
        Some((vec![("n".into(), "1".into())], "pen".into()))
    );
    assert_eq!(got[4].1.text(), "just text");
    // What a dequeue gives goes in again unchanged (its mark names its type).
    let mut again = String::new();
    aqgate_proto::idap::write_node(&mut again, &got[3].1);
    assert_eq!(sent_ids(&http(port, &send(q, &again, "AQXmlSend")).await).len(), 1);
    let r = http(port, &receive(q, "<wait_time>0</wait_time>", COMMIT)).await;
    assert_eq!(received(&r)[0].payload, got[3].1);

    // Unknown types, values that do not fit their type, a mark that contradicts the
    // element: payload mismatches, nothing stored.
    for bad in [
        "<NO_SUCH_TYP><A>1</A></NO_SUCH_TYP>",
        "<CUSTOMER_TYP><CUSTNO>seven</CUSTNO></CUSTOMER_TYP>",
        "<raw>not hex</raw>",
        "<NUMBER>1e999</NUMBER>",
        r#"<raw t:type_name="CUSTOMER_TYP" xmlns:t="urn:aqgate:idap">00</raw>"#,
        "<jms_text_message><bytes_data>00</bytes_data></jms_text_message>",
    ] {
        assert_eq!(fault(&http(port, &send(q, bad, "AQXmlSend")).await), Some(code::PAYLOAD_MISMATCH), "{bad}");
    }
    let r = http(port, &receive(q, "<wait_time>0</wait_time>", COMMIT)).await;
    assert_eq!(fault(&r), Some(code::NO_MESSAGE), "nothing stored: {r:?}");
    // A typed queue takes a payload from an ANYDATA queue only of its own type.
    let marked_raw = r#"<raw t:type_name="SYS.RAW" xmlns:t="urn:aqgate:idap">0C</raw>"#;
    assert_eq!(sent_ids(&http(port, &send("AQUSER.L1", marked_raw, "AQXmlSend")).await).len(), 1);
    let marked_other = r#"<raw t:type_name="SYS.VARCHAR2" xmlns:t="urn:aqgate:idap">0C</raw>"#;
    assert_eq!(fault(&http(port, &send("AQUSER.L1", marked_other, "AQXmlSend")).await), Some(code::PAYLOAD_MISMATCH));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anydata_queues_hold_every_type_on_sqlite() {
    anydata(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anydata_queues_hold_every_type_on_postgres() {
    anydata(Backend::Postgres).await;
}

fn listen(agents: &[(&str, Option<&str>)], wait: u64) -> String {
    let agents: String = agents
        .iter()
        .map(|(q, c)| {
            let c = c.map(|c| format!("<l:consumer_name>{c}</l:consumer_name>")).unwrap_or_default();
            format!("<l:agent><l:destination>{q}</l:destination>{c}</l:agent>")
        })
        .collect();
    envelope(&format!(
        r#"<AQXmlReceive xmlns="http://ns.oracle.com/AQ/schemas/access"><l:listen xmlns:l="urn:aqgate:idap">{agents}<l:wait_time>{wait}</l:wait_time></l:listen></AQXmlReceive>"#
    ))
}

const THREE: [(&str, Option<&str>); 3] = [("AQUSER.L1", None), ("AQUSER.L2", None), ("AQUSER.ANY_TOPIC", Some("app1"))];

async fn listens(b: Backend) {
    let (port, _url) = start(b).await;
    // Nothing anywhere: the wait runs out with the no-message fault.
    let t = Instant::now();
    assert_eq!(fault(&http(port, &listen(&THREE, 1)).await), Some(code::NO_MESSAGE));
    assert!(t.elapsed() >= Duration::from_millis(900), "it waited: {:?}", t.elapsed());

    // A message sent to the second queue while the LISTEN waits: that agent is the answer.
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        http(port, &raw_send("AQUSER.L2", &[("", "2A")], COMMIT)).await
    });
    let t = Instant::now();
    let r = http(port, &listen(&THREE, 20)).await;
    let waited = t.elapsed();
    assert_eq!(sent_ids(&sender.await.expect("sender")).len(), 1);
    assert!(
        matches!(&r, Response::Listen(s, Some(ListenResult { destination, consumer_name: None }))
            if s.status_code == 0 && destination == "AQUSER.L2"),
        "{r:?}"
    );
    assert!(waited >= Duration::from_millis(600) && waited < Duration::from_secs(10), "answered when sent: {waited:?}");
    // LISTEN took nothing: the message is there for the dequeue that follows.
    let r = http(port, &receive("AQUSER.L2", "<wait_time>0</wait_time>", COMMIT)).await;
    assert_eq!(raw_of(&received(&r)[0]), "2A");

    // A multi-consumer queue's agent: the consumer is named in the answer.
    let r = http(port, &send("AQUSER.ANY_TOPIC", "<NUMBER>42</NUMBER>", "AQXmlPublish")).await;
    assert_eq!(sent_ids(&r).len(), 1);
    let r = http(port, &listen(&THREE, 5)).await;
    assert!(
        matches!(&r, Response::Listen(_, Some(ListenResult { destination, consumer_name: Some(c) }))
            if destination == "AQUSER.ANY_TOPIC" && c == "APP1"),
        "{r:?}"
    );

    // Every queue is checked as a dequeue would be: scott may not read OE's queue.
    let mut four = THREE.to_vec();
    four.push(("OE.L_OTHER", None));
    assert_eq!(fault(&http(port, &listen(&four, 0)).await), Some(code::NOT_PERMITTED));
    // A multi-consumer queue without a consumer name, an unknown queue.
    assert_eq!(fault(&http(port, &listen(&[("AQUSER.ANY_TOPIC", None)], 0)).await), Some(code::CONSUMER_REQUIRED));
    assert_eq!(fault(&http(port, &listen(&[("AQUSER.NOPE", None)], 0)).await), Some(code::NO_SUCH_QUEUE));

    // At most 32 agents.
    let names: Vec<String> = (0..33).map(|i| format!("AQUSER.L{}", 1 + i % 2)).collect();
    let many: Vec<(&str, Option<&str>)> = names.iter().map(|n| (n.as_str(), None)).collect();
    let (status, text) = http_as(port, SCOTT, &mut None, &listen(&many, 0)).await;
    assert_eq!(status, 200, "{text}");
    let r = parse_idap(text.as_bytes());
    assert_eq!(fault(&r), Some(aqgate_proto::idap::CodecError::TOO_LARGE), "{r:?}");
    assert!(text.contains("more than 32 agents"), "{text}");
    let r = http(port, &listen(&many[..32], 0)).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == code::NO_MESSAGE), "32 are fine: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_answers_the_agent_with_a_message_on_sqlite() {
    listens(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_answers_the_agent_with_a_message_on_postgres() {
    listens(Backend::Postgres).await;
}

/// Jobs into and out of ANYDATA queues (with `RAW_QUEUES` beside the demo topology).
const JOBS: &str = r#"
[[queue_tables]]
name = "AQUSER.ANY_TAB"
payload_type = "SYS.ANYDATA"

[[queues]]
name = "AQUSER.ANY_IN"
queue_table = "AQUSER.ANY_TAB"

[[queues]]
name = "AQUSER.ANY_OUT"
queue_table = "AQUSER.ANY_TAB"

[[queues]]
name = "AQUSER.ANY_MIXED"
queue_table = "AQUSER.ANY_TAB"

[[queues]]
name = "AQUSER.ANY_REJECTS"
queue_table = "AQUSER.ANY_TAB"

[[propagations]]
name = "raw_to_any"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.ANY_IN"

[[propagations]]
name = "jms_to_any"
source = "AQUSER.JMS_TEXTQ"
destination = "AQUSER.ANY_IN"

[[propagations]]
name = "any_to_any"
source = "AQUSER.ANY_IN"
destination = "AQUSER.ANY_OUT"

[[propagations]]
name = "any_to_raw"
source = "AQUSER.ANY_MIXED"
destination = "AQUSER.RAW_ARCHIVE"
exception_queue = "AQUSER.ANY_REJECTS"
"#;

/// Every message of `queue` as scott, committed: (type name, payload text).
async fn drain_typed(port: u16, queue: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        if fault(&r) == Some(code::NO_MESSAGE) {
            return out;
        }
        for m in received(&r) {
            let text = m.payload.child("text_data").map_or_else(|| m.payload.text(), |t| t.text());
            out.push((type_name_attr(&m.payload).unwrap_or("-").to_string(), text));
        }
    }
}

/// The type travels with a propagated message: typed queues into an ANYDATA queue, ANYDATA
/// to ANYDATA, and ANYDATA into a typed queue for the messages of its type only (the others
/// go to the job's exception queue, refused as payload mismatches).
async fn propagation(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = demo_topology_with("anydata", JOBS);
    let listen = format!("127.0.0.1:{port}");
    let mut s = Proc::spawn(
        "aqgate serve (anydata)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db])
            .args(["--topology", topo.to_str().expect("utf-8")]),
    );
    s.wait_ready(port, Duration::from_secs(60));
    assert_eq!(sent_ids(&http(port, &raw_send("AQUSER.RAW_QUE", &[("", "0A")], COMMIT)).await).len(), 1);
    let jms = "<jms_text_message><text_data>moved</text_data></jms_text_message>";
    assert_eq!(sent_ids(&http(port, &send("AQUSER.JMS_TEXTQ", jms, "AQXmlSend")).await).len(), 1);
    for p in ["<raw>0B</raw>", "<VARCHAR2>not raw</VARCHAR2>"] {
        assert_eq!(sent_ids(&http(port, &send("AQUSER.ANY_MIXED", p, "AQXmlSend")).await).len(), 1);
    }
    wait_depth(&db, "AQUSER.ANY_OUT", 2, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.ANY_REJECTS", 1, Duration::from_secs(30));
    let mut out = drain_typed(port, "AQUSER.ANY_OUT").await;
    out.sort();
    assert_eq!(
        out,
        [("SYS.AQ$_JMS_TEXT_MESSAGE".to_string(), "moved".to_string()), ("SYS.RAW".to_string(), "0A".to_string())]
    );
    assert_eq!(drain_typed(port, "AQUSER.RAW_ARCHIVE").await, [("-".to_string(), "0B".to_string())]);
    assert_eq!(drain_typed(port, "AQUSER.ANY_REJECTS").await, [("SYS.VARCHAR2".to_string(), "not raw".to_string())]);
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_type_travels_with_propagated_messages_on_sqlite() {
    propagation(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_type_travels_with_propagated_messages_on_postgres() {
    propagation(Backend::Postgres).await;
}

/// What the topology refuses around ANYDATA: a transformation from or to it, a subscriber
/// rule that looks into its payload. A job from a typed queue into it needs none.
#[test]
fn the_topology_refuses_what_cannot_work_on_anydata() {
    let with = |extra: &str| {
        aqgate_core::topology::Topology::from_toml(&format!("{}\n{EXTRA}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY))
            .expect("parses")
            .resolve(&|_| Ok(String::new()))
            .map(|_| ())
            .map_err(|e| e.join("; "))
    };
    assert_eq!(with(""), Ok(()));
    let t = r#"
[[transformations]]
name = "AQUSER.FROM_ANY"
from_type = "SYS.ANYDATA"
to_type = "CUSTOMER_TYP"

[transformations.attributes]
CUSTNO = "1"
"#;
    let e = with(t).expect_err("refused");
    assert!(e.contains("SYS.ANYDATA cannot be transformed"), "{e}");
    let rule = r#"
[[subscribers]]
queue = "AQUSER.ANY_TOPIC"
name = "APP2"
rule = "tab.user_data.custno = 1"
"#;
    let e = with(rule).expect_err("refused");
    assert!(e.contains("tab.user_data cannot be looked into"), "{e}");
    let ok_rule = r#"
[[subscribers]]
queue = "AQUSER.ANY_TOPIC"
name = "APP2"
rule = "priority < 5"
"#;
    assert_eq!(with(ok_rule), Ok(()));
}
