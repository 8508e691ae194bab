//! Transformations (DBMS_TRANSFORM) in a real `aqgate serve`, over HTTP, on SQLite and
//! PostgreSQL: at enqueue (`producer_options/transformation`), at dequeue
//! (`consumer_options/transformation`), a subscriber's, a local propagation job's; and each
//! failure — a Fault 25229 naming transformation and attribute, with nothing stored,
//! removed or lost; for the job, the message in its exception queue, nothing duplicated.

mod common;

use std::time::Duration;

use aqgate_proto::idap::{Message, Response};
use common::*;

/// Beside the demo topology (which has AQUSER.ORDER_TO_EMP).
const EXTRA: &str = r#"
[[types]]
name = "EMP_CARD_TYP"
kind = "object"
attributes = [
  { name = "ID", type = "NUMBER(6)" },
  { name = "LABEL", type = "VARCHAR2(12)" },
  { name = "PAY", type = "NUMBER" },
]

[[transformations]]
name = "AQUSER.EMP_TO_CARD"
from_type = "AQUSER.EMP_TYP"
to_type = "AQUSER.EMP_CARD_TYP"
required = ["ID"]
attributes = { ID = "source.EMPNO", LABEL = "source.ENAME || '/' || LOWER(source.JOB)", PAY = "source.SAL / source.COMM" }

[[transformations]]
name = "AQUSER.EMP_TO_TAG"
from_type = "AQUSER.EMP_TYP"
to_type = "AQUSER.EMP_CARD_TYP"
attributes = { ID = "source.EMPNO", LABEL = "'TAG'" }

[[queue_tables]]
name = "AQUSER.EMP_TAB"
payload_type = "AQUSER.EMP_TYP"

[[queues]]
name = "AQUSER.EMP_QUE"
queue_table = "AQUSER.EMP_TAB"

[[queues]]
name = "AQUSER.EMP_OUTBOX"
queue_table = "AQUSER.EMP_TAB"

[[queues]]
name = "AQUSER.EMP_REJECTS"
queue_table = "AQUSER.EMP_TAB"

[[queue_tables]]
name = "AQUSER.CARD_TAB"
payload_type = "AQUSER.EMP_CARD_TYP"

[[queues]]
name = "AQUSER.CARD_QUE"
queue_table = "AQUSER.CARD_TAB"

[[subscribers]]
queue = "AQUSER.EMP_TOPIC"
name = "CARDS"
transformation = "AQUSER.EMP_TO_CARD"

[[propagations]]
name = "cards"
source = "AQUSER.EMP_OUTBOX"
destination = "AQUSER.CARD_QUE"
transformation = "aquser.emp_to_card"
exception_queue = "AQUSER.EMP_REJECTS"
"#;

fn serve(db: &str, port: u16, topology: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (transformations)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")]),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// An AQXmlSend (or, with `publish`, AQXmlPublish) of `payloads` with commit.
fn send(queue: &str, producer_extra: &str, payloads: &[String], publish: bool) -> String {
    let mut set = format!("<message_count>{}</message_count>", payloads.len());
    for (i, p) in payloads.iter().enumerate() {
        set.push_str(&format!(
            "<message><message_number>{}</message_number><message_header><correlation>M{}</correlation></message_header><message_payload>{p}</message_payload></message>",
            i + 1,
            i + 1
        ));
    }
    let op = if publish { "AQXmlPublish" } else { "AQXmlSend" };
    envelope(&format!(
        r#"<{op} xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{queue}</destination>{producer_extra}</producer_options><message_set>{set}</message_set>{COMMIT}</{op}>"#
    ))
}

fn order(no: i64, name: &str, ordertype: &str, country: &str) -> String {
    format!(
        "<ORDER_TYP><ORDERNO>{no}</ORDERNO><ORDERTYPE>{ordertype}</ORDERTYPE><CUSTOMER><NAME>{name}</NAME><ZIP>94065</ZIP><COUNTRY>{country}</COUNTRY></CUSTOMER><ORDER_DATE>2024-05-01</ORDER_DATE></ORDER_TYP>"
    )
}

fn emp(empno: Option<i64>, ename: &str, job: &str, sal: &str, comm: &str) -> String {
    let no = empno.map(|n| format!("<EMPNO>{n}</EMPNO>")).unwrap_or_default();
    format!("<EMP_TYP>{no}<ENAME>{ename}</ENAME><JOB>{job}</JOB><SAL>{sal}</SAL><COMM>{comm}</COMM></EMP_TYP>")
}

/// The payload's attributes as (name, text), in order.
fn attrs(m: &Message) -> Vec<(String, String)> {
    m.payload.elements().map(|e| (e.name.clone(), e.text())).collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

async fn receive_one(port: u16, queue: &str, opts: &str) -> Response {
    http(port, &receive(queue, &format!("{opts}<wait_time>0</wait_time>"), COMMIT)).await
}

fn fault(r: &Response) -> (i32, String) {
    match r {
        Response::Fault(f) => (f.code, f.message.clone()),
        other => panic!("expected a Fault, got {other:?}"),
    }
}

async fn transformations_through_http(b: Backend) {
    let db = fresh_url(b).await;
    let port = free_port();
    let topo = demo_topology_with("transformations", EXTRA);
    let s = serve(&db, port, &topo);

    // 1. Enqueue: an ORDER_TYP sent through the demo's AQUSER.ORDER_TO_EMP is stored as EMP_TYP.
    let xf = "<transformation>AQUSER.ORDER_TO_EMP</transformation>";
    let r = http(port, &send("AQUSER.EMP_QUE", xf, &[order(7, "  Jane Customer-Smith ", "RUSH", "USA")], false)).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let r = receive_one(port, "AQUSER.EMP_QUE", "").await;
    let m = &received(&r)[0];
    assert_eq!(m.payload.name, "EMP_TYP");
    assert_eq!(
        attrs(m),
        pairs(&[
            ("EMPNO", "1007"),
            ("ENAME", "JANE CUSTO"),
            ("JOB", "EXPEDITER"),
            ("HIREDATE", "2024-05-01 00:00:00"),
            ("SAL", "940.65"),
            ("DEPTNO", "10"),
        ])
    );

    // A message the transformation fails on fails the whole request: nothing is stored.
    let two = [order(8, "Ann", "STD", "UK"), order(9500, "Bob", "STD", "UK")];
    let (code, text) = fault(&http(port, &send("AQUSER.EMP_QUE", xf, &two, false)).await);
    assert_eq!(code, 25229, "{text}");
    assert!(
        text.contains(
            "message 2: error on transformation of message: transformation AQUSER.ORDER_TO_EMP, attribute EMPNO:"
        ) && text.contains("too large for NUMBER(4)"),
        "{text}"
    );
    assert_eq!(depth(&db, "AQUSER.EMP_QUE"), 0, "all or nothing");

    // A transformation that does not exist, one that makes another type than the queue's,
    // a payload that is not of the transformation's from type.
    let (code, text) =
        fault(&http(port, &send("AQUSER.EMP_QUE", "<transformation>AQUSER.NOPE</transformation>", &two, false)).await);
    assert_eq!((code, text.contains("transformation AQUSER.NOPE does not exist")), (24031, true), "{text}");
    let card = "<transformation>AQUSER.EMP_TO_CARD</transformation>";
    let (code, text) =
        fault(&http(port, &send("AQUSER.EMP_QUE", card, &[emp(Some(1), "A", "B", "1", "1")], false)).await);
    assert_eq!(code, 25215, "{text}");
    assert!(text.contains("makes EMP_CARD_TYP payloads, and queue AQUSER.EMP_QUE takes EMP_TYP"), "{text}");
    let (code, text) =
        fault(&http(port, &send("AQUSER.EMP_QUE", xf, &[emp(Some(1), "A", "B", "1", "1")], false)).await);
    assert_eq!(code, 25215, "{text}");
    assert!(text.contains("from type ORDER_TYP of transformation AQUSER.ORDER_TO_EMP"), "{text}");
    assert_eq!(depth(&db, "AQUSER.EMP_QUE"), 0);

    // 2. Dequeue: the stored EMP_TYP comes back as EMP_CARD_TYP; failures name the attribute
    // and leave the message where it was.
    let emps = [
        emp(Some(7712), "Okafor", "CLERK", "4350", "312.5"),
        emp(Some(7713), "Ng", "CLERK", "100", "0"),
        emp(None, "Nobody", "CLERK", "1", "1"),
        emp(Some(7714), "Abernathy", "ANALYST", "1", "1"),
    ];
    assert!(matches!(http(port, &send("AQUSER.EMP_QUE", "", &emps, false)).await, Response::Send(..)));
    let r = receive_one(port, "AQUSER.EMP_QUE", card).await;
    let m = &received(&r)[0];
    assert_eq!(m.payload.name, "EMP_CARD_TYP");
    assert_eq!(attrs(m), pairs(&[("ID", "7712"), ("LABEL", "Okafor/clerk"), ("PAY", "13.92")]));
    for (why, attribute) in [
        ("division by zero", "PAY"),
        ("the expression gives NULL, and the attribute is required", "ID"),
        ("value of 17 characters is too long for VARCHAR2(12)", "LABEL"),
    ] {
        let (code, text) = fault(&receive_one(port, "AQUSER.EMP_QUE", card).await);
        assert_eq!(code, 25229, "{text}");
        assert!(text.contains(&format!("transformation AQUSER.EMP_TO_CARD, attribute {attribute}: {why}")), "{text}");
        // Not removed: received as it is, without the transformation.
        let r = receive_one(port, "AQUSER.EMP_QUE", "").await;
        assert_eq!(received(&r)[0].payload.name, "EMP_TYP");
    }
    assert_eq!(depth(&db, "AQUSER.EMP_QUE"), 0);
    let (code, text) = fault(&receive_one(port, "AQUSER.EMP_QUE", xf).await);
    assert_eq!(code, 25215, "{text}");
    assert!(text.contains("transforms ORDER_TYP payloads, and queue AQUSER.EMP_QUE holds EMP_TYP"), "{text}");

    // 3. A subscriber's transformation: CARDS gets cards, APP1 the record as published; a
    // transformation the dequeue names wins over the subscriber's.
    let hires = [emp(Some(1), "Ito", "CLERK", "10", "4"), emp(Some(2), "Roe", "CLERK", "10", "5")];
    assert!(matches!(http(port, &send("AQUSER.EMP_TOPIC", "", &hires, true)).await, Response::Publish(..)));
    let r = receive_one(port, "AQUSER.EMP_TOPIC", "<consumer_name>CARDS</consumer_name>").await;
    assert_eq!(attrs(&received(&r)[0]), pairs(&[("ID", "1"), ("LABEL", "Ito/clerk"), ("PAY", "2.5")]));
    let tag = "<consumer_name>CARDS</consumer_name><transformation>AQUSER.EMP_TO_TAG</transformation>";
    let r = receive_one(port, "AQUSER.EMP_TOPIC", tag).await;
    assert_eq!(attrs(&received(&r)[0]), pairs(&[("ID", "2"), ("LABEL", "TAG")]));
    for no in ["1", "2"] {
        let r = receive_one(port, "AQUSER.EMP_TOPIC", "<consumer_name>APP1</consumer_name>").await;
        let m = &received(&r)[0];
        assert_eq!((m.payload.name.as_str(), m.payload.child("EMPNO").map(|e| e.text())), ("EMP_TYP", Some(no.into())));
    }

    // 4. The propagation job transforms what it moves; the one message its transformation
    // fails on goes to the exception queue as it was. Nothing lost, nothing twice.
    let outbox = [
        emp(Some(11), "Lee", "CLERK", "30", "10"),
        emp(Some(12), "Kim", "CLERK", "30", "0"),
        emp(Some(13), "Sol", "CLERK", "30", "3"),
    ];
    assert!(matches!(http(port, &send("AQUSER.EMP_OUTBOX", "", &outbox, false)).await, Response::Send(..)));
    wait_depth(&db, "AQUSER.EMP_REJECTS", 1, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.CARD_QUE", 2, Duration::from_secs(30));
    assert_eq!(depth(&db, "AQUSER.EMP_OUTBOX"), 0);
    let mut cards = Vec::new();
    for _ in 0..2 {
        let r = receive_one(port, "AQUSER.CARD_QUE", "").await;
        cards.push(attrs(&received(&r)[0]));
    }
    cards.sort();
    assert_eq!(
        cards,
        [
            pairs(&[("ID", "11"), ("LABEL", "Lee/clerk"), ("PAY", "3")]),
            pairs(&[("ID", "13"), ("LABEL", "Sol/clerk"), ("PAY", "10")]),
        ]
    );
    let r = receive_one(port, "AQUSER.EMP_REJECTS", "").await;
    let m = &received(&r)[0];
    assert_eq!((m.payload.name.as_str(), m.payload.child("EMPNO").map(|e| e.text())), ("EMP_TYP", Some("12".into())));
    assert_eq!(m.header.correlation.as_deref(), Some("M2"));
    let (_, text) = http_get(port, "/metrics").expect("metrics");
    assert!(text.contains("aqgate_propagation_exceptions_total{job=\"CARDS\"} 1"), "{text}");
    assert!(text.contains("aqgate_propagation_messages_total{job=\"CARDS\"} 2"), "{text}");
    for q in ["AQUSER.EMP_REJECTS", "AQUSER.CARD_QUE", "AQUSER.EMP_OUTBOX"] {
        assert_eq!(depth(&db, q), 0, "{q}");
    }
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformations_through_http_on_sqlite() {
    transformations_through_http(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformations_through_http_on_postgres() {
    transformations_through_http(Backend::Postgres).await;
}

/// A topology whose transformations do not fit is refused at load, every problem with its
/// key path.
#[test]
fn a_topology_with_bad_transformations_is_refused_with_key_paths() {
    let bad = r#"
[[transformations]]
name = "AQUSER.BAD"
from_type = "AQUSER.EMP_TYP"
to_type = "AQUSER.ORDER_TYP"
required = ["STATUS"]
attributes = { ORDERNO = "source.EMPNO + 'x'", NOPE = "1", CUSTOMER = "source.ENAME", ORDER_DATE = "source.SAL", CCNUMBER = "source.MISSING" }

[[transformations]]
name = "AQUSER.TO_RAW"
from_type = "AQUSER.EMP_TYP"
to_type = "RAW"
attributes = { X = "1" }

[[subscribers]]
queue = "AQUSER.EMP_TOPIC"
name = "X"
transformation = "AQUSER.ORDER_TO_EMP"
"#;
    let text = format!("{}\n{bad}", std::fs::read_to_string("config/topology.toml").expect("demo topology"));
    let errors = aqgate_core::topology::Topology::from_toml(&text)
        .expect("toml")
        .resolve(&|p| Ok(p.to_string()))
        .expect_err("refused");
    let all = errors.join("\n");
    for want in [
        "transformations[1] (AQUSER.BAD).attributes.ORDERNO: 'x' is not a number",
        "transformations[1] (AQUSER.BAD).attributes.NOPE: ORDER_TYP has no attribute NOPE",
        "transformations[1] (AQUSER.BAD).attributes.CUSTOMER: the attribute is of object type CUSTOMER_TYP",
        "transformations[1] (AQUSER.BAD).attributes.ORDER_DATE: a NUMBER cannot be a DATE",
        "transformations[1] (AQUSER.BAD).attributes.CCNUMBER: source.missing names nothing in the source type",
        "transformations[1] (AQUSER.BAD).required: STATUS has no expression in attributes",
        "transformations[2] (AQUSER.TO_RAW).to_type: RAW has no attributes to compute",
        "subscribers[1] (X on AQUSER.EMP_TOPIC).transformation: AQUSER.ORDER_TO_EMP transforms ORDER_TYP, not EMP_TYP",
    ] {
        assert!(all.contains(want), "missing {want:?} in:\n{all}");
    }
}
