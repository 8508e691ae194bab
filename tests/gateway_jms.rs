//! JMS properties through the Messaging Gateway and the real brokers on this machine
//! (RabbitMQ 5672, NATS 4222 with JetStream, Mosquitto 1883), through a real `aqgate serve`:
//! a JMS text message sent over IDAP with typed user properties and header fields reaches
//! the broker's own client with them, typed (RabbitMQ's AMQP field types; NATS and MQTT
//! strings typed by `AQ-Property-Types`); a broker message with headers comes in and an
//! IDAP receive shows them as typed user properties and header fields; AQ → broker → AQ
//! gives back what was sent, map items with their types too; a message with more user
//! properties than the gateway carries goes to the job's exception queue with the reason.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use aqgate_proto::idap::{Response, XmlNode};
use common::gateway::*;
use common::*;
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// The user properties the test sends: (name, IDAP element, text).
const USER: [(&str, &str, &str); 8] = [
    ("Warehouse", "string_value", "PDX-2"),
    ("Count", "int_value", "5"),
    ("Big", "long_value", "5000000000"),
    ("Ratio", "double_value", "0.25"),
    ("Rush", "boolean_value", "true"),
    ("F", "float_value", "1.5"),
    ("S", "short_value", "-3"),
    ("B", "byte_value", "7"),
];

/// The map items the test sends.
const ITEMS: [(&str, &str, &str); 4] = [
    ("qty", "int_value", "5"),
    ("big", "long_value", "5"),
    ("f", "float_value", "2.5"),
    ("name", "string_value", "five"),
];

/// What the broker's client sends in: user properties (name, IDAP element, text).
const FROM_BROKER: [(&str, &str, &str); 4] = [
    ("Warehouse", "string_value", "PDX-9"),
    ("Count", "int_value", "7"),
    ("Ratio", "double_value", "0.5"),
    ("Rush", "boolean_value", "false"),
];

fn property(name: &str, el: &str, v: &str, item: &str) -> String {
    format!("<{item}><name>{name}</name><{el}>{v}</{el}></{item}>")
}

fn send(queue: &str, payload: &str) -> String {
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{queue}</destination></producer_options><message_set><message><message_header/><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
    ))
}

/// Sends over IDAP: a text message with [`USER`] and all the header fields, a map of
/// [`ITEMS`], and a text message with one user property more than the gateway carries.
async fn send_all(port: u16) {
    let user: String = USER.iter().map(|(n, e, v)| property(n, e, v, "property")).collect();
    let text = format!(
        "<jms_text_message><oracle_jms_properties><type>order</type><reply_to><agent_name>scott</agent_name>\
         <address>AQUSER.REPLYQ</address><protocol>0</protocol></reply_to><appid>shop</appid>\
         <groupid>g-1</groupid><group_sequence>3</group_sequence></oracle_jms_properties>\
         <user_properties>{user}</user_properties><text_data>to the broker</text_data></jms_text_message>"
    );
    let items: String = ITEMS.iter().map(|(n, e, v)| property(n, e, v, "item")).collect();
    let map = format!("<jms_map_message><map_data>{items}</map_data></jms_map_message>");
    let many: String = (0..65).map(|i| property(&format!("p{i}"), "int_value", "1", "property")).collect();
    let over = format!(
        "<jms_text_message><user_properties>{many}</user_properties><text_data>too many</text_data></jms_text_message>"
    );
    for (q, p) in [("AQUSER.JMS_TEXTQ", text), ("AQUSER.JMS_MAPQ", map), ("AQUSER.JMS_TEXTQ", over)] {
        let r = http(port, &send(q, &p)).await;
        assert!(matches!(r, Response::Send(_, Some(_))), "send to {q}: {r:?}");
    }
}

/// `(name, element, text)` of the `what` (`user_properties` or `map_data`) of payload `p`.
fn typed(p: &XmlNode, what: &str) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = p
        .child(what)
        .map(|u| {
            u.elements()
                .map(|e| {
                    let v = e.elements().find(|c| c.local_name() != "name").expect("a value");
                    (e.child("name").map(XmlNode::text).unwrap_or_default(), v.local_name().to_string(), v.text())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn owned(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> =
        list.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
    v.sort();
    v
}

/// A header field of payload `p` (`reply_to/address` for a reply agent's part).
fn field(p: &XmlNode, path: &str) -> Option<String> {
    let mut n = p.child("oracle_jms_properties")?;
    for seg in path.split('/') {
        n = n.child(seg)?;
    }
    Some(n.text())
}

/// Every message of `queue`, received and committed as scott.
async fn take_all(port: u16, queue: &str) -> Vec<XmlNode> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        match &r {
            Response::Receive(_, Some(_)) => out.extend(received(&r).into_iter().map(|m| m.payload)),
            Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

/// The AQ side once the broker's client has seen the outbound messages and sent its own:
/// AQUSER.JMS_TEXT_IN holds the round trip (as sent) and the broker's message (typed, with
/// its header fields: `reply` the reply address it gave), AQUSER.JMS_MAP_IN the map with
/// its types, AQUSER.JMS_TEXT_REJECTS the message over the bound, counted.
async fn assert_aq_side(db: &str, port: u16, out_job: &str, reply: &str) {
    wait_depth(db, "AQUSER.JMS_TEXT_IN", 2, Duration::from_secs(60));
    wait_depth(db, "AQUSER.JMS_MAP_IN", 1, Duration::from_secs(60));
    wait_depth(db, "AQUSER.JMS_TEXT_REJECTS", 1, Duration::from_secs(60));
    let texts = take_all(port, "AQUSER.JMS_TEXT_IN").await;
    let by_text = |t: &str| {
        texts
            .iter()
            .find(|p| p.child("text_data").map(XmlNode::text).as_deref() == Some(t))
            .unwrap_or_else(|| panic!("no {t:?} in {texts:?}"))
    };
    let back = by_text("to the broker");
    assert_eq!(typed(back, "user_properties"), owned(&USER), "the round trip keeps the types");
    for (path, want) in [
        ("type", "order"),
        ("appid", "shop"),
        ("groupid", "g-1"),
        ("group_sequence", "3"),
        ("reply_to/agent_name", "scott"),
        ("reply_to/address", "AQUSER.REPLYQ"),
        ("reply_to/protocol", "0"),
    ] {
        assert_eq!(field(back, path).as_deref(), Some(want), "{path} in {back:?}");
    }
    let from = by_text("from the broker");
    assert_eq!(typed(from, "user_properties"), owned(&FROM_BROKER), "{from:?}");
    for (path, want) in [("type", "restock"), ("appid", "erp"), ("groupid", "g-9"), ("group_sequence", "2")] {
        assert_eq!(field(from, path).as_deref(), Some(want), "{path} in {from:?}");
    }
    assert_eq!(field(from, "reply_to/address").as_deref(), Some(reply));
    // AQ sets the user id (the job's agent) and the time itself.
    assert!(field(from, "userid").is_some_and(|u| u != "mallory"), "{from:?}");
    let maps = take_all(port, "AQUSER.JMS_MAP_IN").await;
    assert_eq!(maps.len(), 1);
    assert_eq!(typed(&maps[0], "map_data"), owned(&ITEMS), "map items keep their types");
    let rejects = take_all(port, "AQUSER.JMS_TEXT_REJECTS").await;
    assert_eq!(
        rejects.iter().filter_map(|p| p.child("text_data")).map(XmlNode::text).collect::<Vec<_>>(),
        ["too many"]
    );
    assert_eq!(metric(port, &format!("aqgate_propagation_exceptions_total{{job=\"{out_job}\"}}")), 1);
}

/// The topology: link `link_lines` of `kind`; foreign queues `out` (`out_lines`), `mout`
/// (`mout_lines`) and `in` (`in_lines`); jobs JMS_TEXTQ → out, out → JMS_TEXT_IN (the round
/// trip), JMS_MAPQ → mout, mout → JMS_MAP_IN, in → JMS_TEXT_IN; the names end in tag `t`.
fn topology(kind: &str, link_lines: &str, (out_lines, mout_lines, in_lines): (&str, &str, &str), t: &str) -> PathBuf {
    let mut toml = format!(
        "\n[[queues]]\nname = \"AQUSER.JMS_TEXT_IN\"\nqueue_table = \"AQUSER.JMS_TEXT_TAB\"\n\
         \n[[queues]]\nname = \"AQUSER.JMS_TEXT_REJECTS\"\nqueue_table = \"AQUSER.JMS_TEXT_TAB\"\n\
         \n[[queues]]\nname = \"AQUSER.JMS_MAP_IN\"\nqueue_table = \"AQUSER.JMS_MAP_TAB\"\n\
         \n[[gateway.links]]\nname = \"link\"\nkind = \"{kind}\"\n{link_lines}\n"
    );
    for (name, lines) in [("out", out_lines), ("mout", mout_lines), ("in", in_lines)] {
        toml.push_str(&format!("\n[[gateway.foreign_queues]]\nname = \"{name}\"\nlink = \"link\"\n{lines}\n"));
    }
    for (name, source, destination) in [
        ("text_out", "AQUSER.JMS_TEXTQ", "out@link"),
        ("text_back", "out@link", "AQUSER.JMS_TEXT_IN"),
        ("map_out", "AQUSER.JMS_MAPQ", "mout@link"),
        ("map_back", "mout@link", "AQUSER.JMS_MAP_IN"),
        ("from_broker", "in@link", "AQUSER.JMS_TEXT_IN"),
    ] {
        let exceptions = if name == "text_out" { "exception_queue = \"AQUSER.JMS_TEXT_REJECTS\"\n" } else { "" };
        toml.push_str(&format!(
            "\n[[gateway.jobs]]\nname = \"{name}_{t}\"\nsource = \"{source}\"\ndestination = \"{destination}\"\n{exceptions}"
        ));
    }
    demo_topology_with(&format!("gateway-jms-{kind}"), &toml)
}

/// Waits until every job of the topology runs.
fn all_running(db: &str, t: &str) {
    for j in ["TEXT_OUT", "TEXT_BACK", "MAP_OUT", "MAP_BACK", "FROM_BROKER"] {
        wait_job(db, &format!("{j}_{}", t.to_uppercase()), Duration::from_secs(60), |j| j["state"] == "RUNNING");
    }
}

// ---------------------------------------------------------------- RabbitMQ

fn header<'a>(h: &'a FieldTable, k: &str) -> Option<&'a AMQPValue> {
    h.inner().iter().find(|(n, _)| n.as_str() == k).map(|(_, v)| v)
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// RabbitMQ: out and mout are one topic exchange (routing keys `jms` and `map`), each back
/// job with its own queue on it, and the test's queue bound to it with `#`; in is a queue.
/// On PostgreSQL.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_carries_typed_jms_properties_both_ways() {
    let t = tag();
    let (exchange, qin, mine) = (format!("aqgt.{t}.jms"), format!("aqgt.{t}.jin"), format!("aqgt.{t}.mine"));
    let topic =
        |key: &str| format!("native_name = \"{exchange}\"\ndomain = \"topic\"\nrouting_key = \"{key}\"\ncreate = true");
    let topo = topology(
        "rabbitmq",
        "url = \"amqp://127.0.0.1:5672/%2f\"\nusername = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"",
        (&topic("jms"), &topic("map"), &format!("native_name = \"{qin}\"\ncreate = true")),
        &t,
    );
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway jms rabbitmq", &db, port, &topo);
    all_running(&db, &t);
    let ch = rabbit().await;
    ch.queue_declare(mine.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.expect("queue");
    ch.queue_bind(
        mine.as_str().into(),
        exchange.as_str().into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
    send_all(port).await;

    // What a RabbitMQ client sees: typed headers, the fields in AMQP's properties.
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the broker's client got {} of 2", got.len());
        match ch.basic_get(mine.as_str().into(), BasicGetOptions { no_ack: true }).await.expect("basic.get") {
            Some(m) => got.push(m.delivery),
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let text = got.iter().find(|d| d.data == b"to the broker").expect("the text message");
    let p = &text.properties;
    let h = p.headers().clone().expect("headers");
    let want = [
        ("Warehouse", long_string("PDX-2")),
        ("Count", AMQPValue::LongInt(5)),
        ("Big", AMQPValue::LongLongInt(5_000_000_000)),
        ("Ratio", AMQPValue::Double(0.25)),
        ("Rush", AMQPValue::Boolean(true)),
        ("F", AMQPValue::Float(1.5)),
        ("S", AMQPValue::ShortInt(-3)),
        ("B", AMQPValue::ShortShortInt(7)),
        ("JMSXGroupID", long_string("g-1")),
        ("JMSXGroupSeq", AMQPValue::LongInt(3)),
        ("JMSReplyToName", long_string("scott")),
    ];
    for (k, v) in &want {
        assert_eq!(header(&h, k), Some(v), "header {k} in {h:?}");
    }
    assert!(header(&h, "AQ-Property-Types").is_none(), "AMQP types its headers itself");
    assert_eq!(p.kind().as_ref().map(ShortString::as_str), Some("order"));
    assert_eq!(p.app_id().as_ref().map(ShortString::as_str), Some("shop"));
    assert_eq!(p.reply_to().as_ref().map(ShortString::as_str), Some("AQUSER.REPLYQ"));
    let map = got.iter().find(|d| d.data != b"to the broker").expect("the map");
    let json: serde_json::Value = serde_json::from_slice(&map.data).expect("json");
    assert_eq!(json, serde_json::json!({"qty": 5, "big": 5, "f": 2.5, "name": "five"}));

    // A message of the broker's client's own, with typed headers and AMQP properties.
    let mut h = FieldTable::default();
    for (k, v) in [
        ("Warehouse", long_string("PDX-9")),
        ("Count", AMQPValue::LongInt(7)),
        ("Ratio", AMQPValue::Double(0.5)),
        ("Rush", AMQPValue::Boolean(false)),
        ("JMSXGroupID", long_string("g-9")),
        ("JMSXGroupSeq", AMQPValue::ShortInt(2)),
        ("JMSXUserID", long_string("mallory")),
        ("x-death", AMQPValue::FieldArray(Default::default())),
    ] {
        h.insert(k.into(), v);
    }
    let props = lapin::BasicProperties::default()
        .with_message_id(format!("jms-{t}").into())
        .with_type("restock".into())
        .with_app_id("erp".into())
        .with_reply_to("replies".into())
        .with_headers(h);
    let c = ch.basic_publish("".into(), qin.as_str().into(), BasicPublishOptions::default(), b"from the broker", props);
    assert!(c.await.expect("publish").await.expect("confirm").is_ack());
    assert_aq_side(&db, port, &format!("TEXT_OUT_{}", t.to_uppercase()), "replies").await;
    drop(s);
    for q in
        [mine, qin, format!("aqgate.TEXT_BACK_{}", t.to_uppercase()), format!("aqgate.MAP_BACK_{}", t.to_uppercase())]
    {
        let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    }
    let _ = ch.exchange_delete(exchange.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
}

// ---------------------------------------------------------------- NATS

/// NATS: out, mout and in are subjects of their own streams; the test reads out's and mout's
/// streams directly. On SQLite.
#[tokio::test(flavor = "multi_thread")]
async fn nats_carries_jms_properties_typed_by_aq_property_types() {
    let t = tag();
    let up = t.to_uppercase();
    let fq =
        |s: &str| format!("native_name = \"aqgt.{t}.{s}\"\nstream = \"AQGT_{up}_{}\"\ncreate = true", s.to_uppercase());
    let topo = topology("nats", "url = \"nats://127.0.0.1:4222\"", (&fq("jms"), &fq("map"), &fq("in")), &t);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway jms nats", &db, port, &topo);
    all_running(&db, &t);
    send_all(port).await;
    let js = jetstream(4222).await;
    let first = |stream: String| {
        let js = js.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(st) = js.get_stream(&stream).await
                    && let Ok(m) = st.get_raw_message(1).await
                {
                    return m;
                }
                assert!(std::time::Instant::now() < deadline, "nothing in {stream}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let m = first(format!("AQGT_{up}_JMS")).await;
    let get = |k: &str| m.headers.get(k).map(|v| v.as_str().to_string());
    for (k, v) in [
        ("Warehouse", "PDX-2"),
        ("Count", "5"),
        ("Big", "5000000000"),
        ("Ratio", "0.25"),
        ("Rush", "true"),
        ("JMSType", "order"),
        ("JMSXAppID", "shop"),
        ("JMSXGroupID", "g-1"),
        ("JMSXGroupSeq", "3"),
        ("JMSReplyTo", "AQUSER.REPLYQ"),
        ("JMSReplyToName", "scott"),
    ] {
        assert_eq!(get(k).as_deref(), Some(v), "header {k}: {:?}", m.headers);
    }
    let types: serde_json::Value = serde_json::from_str(&get("AQ-Property-Types").expect("types")).expect("json");
    assert_eq!(
        types,
        serde_json::json!({"Count": "int", "Big": "long", "Ratio": "double", "Rush": "boolean", "F": "float", "S": "short", "B": "byte"})
    );
    let map = first(format!("AQGT_{up}_MAP")).await;
    assert_eq!(
        map.headers.get("AQ-Map-Types").map(|v| v.as_str().to_string()).as_deref(),
        Some(r#"{"big":"long","f":"float"}"#)
    );

    let mut h = async_nats::HeaderMap::new();
    for (k, v) in [
        ("Warehouse", "PDX-9"),
        ("Count", "7"),
        ("Ratio", "0.5"),
        ("Rush", "false"),
        ("AQ-Property-Types", r#"{"Count":"int","Ratio":"double","Rush":"boolean"}"#),
        ("JMSType", "restock"),
        ("JMSXAppID", "erp"),
        ("JMSXGroupID", "g-9"),
        ("JMSXGroupSeq", "2"),
        ("JMSReplyTo", "replies"),
    ] {
        h.insert(k, v);
    }
    js.publish_with_headers(format!("aqgt.{t}.in"), h, "from the broker".into())
        .await
        .expect("publish")
        .await
        .expect("PubAck");
    assert_aq_side(&db, port, &format!("TEXT_OUT_{up}"), "replies").await;
    drop(s);
    for st in ["JMS", "MAP", "IN"] {
        let _ = js.delete_stream(format!("AQGT_{up}_{st}")).await;
    }
    let _ = std::fs::remove_file(&topo);
}

// ---------------------------------------------------------------- MQTT

/// MQTT v5: out, mout and in are topics; the test's client subscribes to out's and mout's,
/// and sends in with user properties and a response topic. On SQLite.
#[tokio::test(flavor = "multi_thread")]
async fn mqtt_carries_jms_properties_as_typed_user_properties() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let t = tag();
    let fq = |s: &str| format!("native_name = \"aqgt/{t}/{s}\"\nqos = 1");
    let topo = topology("mqtt", "url = \"mqtt://127.0.0.1:1883\"", (&fq("jms"), &fq("map"), &fq("in")), &t);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway jms mqtt", &db, port, &topo);
    all_running(&db, &t);
    let (client, mut el) = AsyncClient::new(MqttOptions::new(format!("aqgt-test-jms-{t}"), "127.0.0.1", 1883), 100);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (subacked_tx, mut subacked) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = subacked_tx.send(());
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    client.subscribe(format!("aqgt/{t}/jms"), QoS::AtLeastOnce).await.expect("subscribe");
    client.subscribe(format!("aqgt/{t}/map"), QoS::AtLeastOnce).await.expect("subscribe");
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(30), subacked.recv()).await.expect("SUBACK");
    }
    // The back jobs subscribe as they start, without waiting for their SUBACK: a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    send_all(port).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("a message").expect("open"));
    }
    let text = got.iter().find(|p| p.payload.as_ref() == b"to the broker").expect("the text message");
    let props = text.properties.clone().expect("properties");
    let get = |k: &str| props.user_properties.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    for (k, v) in [("Warehouse", "PDX-2"), ("Count", "5"), ("F", "1.5"), ("JMSType", "order"), ("JMSXGroupSeq", "3")] {
        assert_eq!(get(k).as_deref(), Some(v), "user property {k}: {:?}", props.user_properties);
    }
    let types: serde_json::Value = serde_json::from_str(&get("aq-property-types").expect("types")).expect("json");
    assert_eq!(types["Count"], "int");
    assert_eq!(types["F"], "float");
    assert_eq!(props.response_topic.as_deref(), Some("AQUSER.REPLYQ"), "the reply address is the response topic");
    assert!(get("JMSReplyTo").is_none(), "not twice");

    let props = PublishProperties {
        response_topic: Some("replies".into()),
        user_properties: [
            ("Warehouse", "PDX-9"),
            ("Count", "7"),
            ("Ratio", "0.5"),
            ("Rush", "false"),
            ("aq-property-types", r#"{"Count":"int","Ratio":"double","Rush":"boolean"}"#),
            ("aq-message-id", &format!("jms-{t}")),
            ("JMSType", "restock"),
            ("JMSXAppID", "erp"),
            ("JMSXGroupID", "g-9"),
            ("JMSXGroupSeq", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    client
        .publish_with_properties(format!("aqgt/{t}/in"), QoS::AtLeastOnce, false, "from the broker", props)
        .await
        .expect("publish");
    assert_aq_side(&db, port, &format!("TEXT_OUT_{}", t.to_uppercase()), "replies").await;
    drop(s);
    let _ = client.disconnect().await;
    let _ = std::fs::remove_file(&topo);
}
