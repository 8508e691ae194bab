//! Gateway job options through a real `aqgate serve` and the real brokers on this machine
//! (RabbitMQ 5672, NATS 4222 with JetStream, Mosquitto 1883): a NON_PERSISTENT RabbitMQ job
//! publishes with delivery mode 1 (a persistent one with 2) as lapin sees it; with
//! `aq_msg_properties = false` no `AQ-*` header arrives at RabbitMQ or NATS and an inbound
//! job ignores them (a message's AQ-Delay, AQ-Priority, AQ-Correlation); a NON_PERSISTENT
//! NATS job publishes with core NATS and an MQTT one at QoS 0; an inbound MQTT job with
//! `no_local` leaves what the gateway's own outbound job published over its link and takes
//! the rest; `admin jobs` shows options and guarantee; `admin gateway --foreign-queues`
//! lists the foreign queues with their jobs; bad option values are refused by `admin
//! apply` naming the key.

mod common;

use std::time::Duration;

use aqgate_proto::idap::Response;
use common::gateway::*;
use common::*;
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};

/// Takes one message from RabbitMQ queue `q`, waiting up to 30 s.
async fn rabbit_take(ch: &lapin::Channel, q: &str) -> lapin::message::Delivery {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(m) = ch.basic_get(q.into(), BasicGetOptions { no_ack: true }).await.expect("basic.get") {
            return m.delivery;
        }
        assert!(std::time::Instant::now() < deadline, "nothing in {q}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn header_names(h: &Option<FieldTable>) -> Vec<String> {
    h.as_ref().map(|h| h.inner().keys().map(|k| k.as_str().to_string()).collect()).unwrap_or_default()
}

/// The one message in `queue`, received as scott: (priority, correlation).
async fn take_one(port: u16, queue: &str) -> (Option<i64>, Option<String>) {
    let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
    assert!(matches!(r, Response::Receive(_, Some(_))), "receive from {queue}: {r:?}");
    let m = received(&r).into_iter().next().expect("a message");
    (m.header.priority, m.header.correlation)
}

/// RabbitMQ, on PostgreSQL: RAW_QUE → `fast` (NON_PERSISTENT, no AQ properties) and
/// RAW_INBOX → `slow` (the defaults); `plain` (no AQ properties) → RAW_ARCHIVE and `full`
/// → RAW_REJECTS, each fed a message with AQ-* headers by the test.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_delivery_mode_and_aq_properties() {
    let t = tag();
    let q = |s: &str| format!("aqgt.{t}.{s}");
    let mut toml = String::from(
        "\n[[gateway.links]]\nname = \"rabbit\"\nkind = \"rabbitmq\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n\
         username = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n",
    );
    for name in ["fast", "slow", "plain", "full"] {
        toml.push_str(&format!(
            "\n[[gateway.foreign_queues]]\nname = \"{name}\"\nlink = \"rabbit\"\nnative_name = \"{}\"\ncreate = true\n",
            q(name)
        ));
    }
    for (name, source, destination, options) in [
        (
            "to_fast",
            "AQUSER.RAW_QUE",
            "fast@rabbit",
            "delivery_mode = \"non_persistent\"\naq_msg_properties = false\nbatches_in_flight = 2",
        ),
        ("to_slow", "AQUSER.RAW_INBOX", "slow@rabbit", ""),
        ("from_plain", "plain@rabbit", "AQUSER.RAW_ARCHIVE", "aq_msg_properties = false"),
        ("from_full", "full@rabbit", "AQUSER.RAW_REJECTS", ""),
    ] {
        toml.push_str(&format!(
            "\n[[gateway.jobs]]\nname = \"{name}\"\nsource = \"{source}\"\ndestination = \"{destination}\"\n{options}\n"
        ));
    }
    let topo = demo_topology_with("gateway-options-rabbit", &toml);
    let db = fresh_pg_url().await;
    let port = free_port();
    let s = serve("gateway options rabbitmq", &db, port, &topo);
    for j in ["TO_FAST", "TO_SLOW", "FROM_PLAIN", "FROM_FULL"] {
        wait_job(&db, j, Duration::from_secs(60), |j| j["state"] == "RUNNING");
    }
    let hdr = "<correlation>corr-1</correlation><priority>3</priority>";
    send_numbered(port, "AQUSER.RAW_QUE", 1, 1, 1, hdr).await;
    send_numbered(port, "AQUSER.RAW_INBOX", 2, 1, 1, hdr).await;
    let ch = rabbit().await;

    let fast = rabbit_take(&ch, &q("fast")).await;
    assert_eq!(fast.data, 1u32.to_be_bytes());
    assert_eq!(*fast.properties.delivery_mode(), Some(1), "NON_PERSISTENT: delivery mode 1");
    let names = header_names(fast.properties.headers());
    assert!(!names.iter().any(|n| n.starts_with("AQ-")), "no AQ-* header: {names:?}");
    assert!(names.iter().any(|n| n == "x-aqgate-link"), "the link's mark: {names:?}");
    assert!(fast.properties.message_id().is_some(), "RabbitMQ's own message_id is filled all the same");
    let slow = rabbit_take(&ch, &q("slow")).await;
    assert_eq!(*slow.properties.delivery_mode(), Some(2), "persistent: delivery mode 2");
    let names = header_names(slow.properties.headers());
    for h in ["AQ-Message-Id", "AQ-Priority", "AQ-Correlation", "AQ-Queue"] {
        assert!(names.iter().any(|n| n == h), "{h} in {names:?}");
    }

    // Inbound: AQ-* headers a broker message carries, ignored or taken (the delay only for
    // the job that ignores it: it would hold the message back).
    for name in ["plain", "full"] {
        let mut h = FieldTable::default();
        let delay = if name == "plain" { "3600" } else { "0" };
        for (k, v) in [("AQ-Priority", "7"), ("AQ-Correlation", "from-header"), ("AQ-Delay", delay)] {
            h.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
        }
        let props = lapin::BasicProperties::default().with_message_id(format!("m-{t}-{name}").into()).with_headers(h);
        let c = ch.basic_publish("".into(), q(name).as_str().into(), BasicPublishOptions::default(), b"in", props);
        assert!(c.await.expect("publish").await.expect("confirm").is_ack());
    }
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.RAW_REJECTS", 1, Duration::from_secs(30));
    // AQ-Delay ignored (ready at once), and no priority or correlation from the headers.
    let (priority, correlation) = take_one(port, "AQUSER.RAW_ARCHIVE").await;
    assert_ne!(priority, Some(7), "AQ-Priority ignored");
    assert_eq!(correlation, None, "AQ-Correlation ignored");
    let (priority, correlation) = take_one(port, "AQUSER.RAW_REJECTS").await;
    assert_eq!((priority, correlation.as_deref()), (Some(7), Some("from-header")), "taken with the option on");

    let jobs = admin_json(&db, "jobs");
    let fast = job(&jobs, "TO_FAST");
    assert_eq!(fast["options"]["delivery_mode"], "NON_PERSISTENT", "{fast}");
    assert_eq!(fast["options"]["aq_msg_properties"], false, "{fast}");
    assert!(fast["guarantee"].as_str().is_some_and(|g| g.starts_with("none: NON_PERSISTENT")), "{fast}");
    let slow = job(&jobs, "TO_SLOW");
    assert_eq!(slow["options"]["delivery_mode"], "PRESERVE_MSG", "{slow}");
    assert!(slow["guarantee"].as_str().is_some_and(|g| g.starts_with("at least once")), "{slow}");
    // The window of batches in flight: as given, the default, and none for an inbound job.
    assert_eq!((&fast["batches_in_flight"], &slow["batches_in_flight"]), (&2.into(), &4.into()), "{jobs}");
    assert!(job(&jobs, "FROM_PLAIN").get("batches_in_flight").is_none(), "{jobs}");
    let table = aqgate(&["admin", "jobs", "--database", &db]).output().expect("admin jobs");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("options: delivery_mode=NON_PERSISTENT aq_msg_properties=FALSE batches_in_flight=2"),
        "{text}"
    );
    assert!(text.contains("options: delivery_mode=PRESERVE_MSG aq_msg_properties=TRUE batches_in_flight=4"), "{text}");

    // The foreign queues, with the jobs that use them.
    let out = aqgate(&["admin", "gateway", "--foreign-queues", "--json", "--database", &db]).output().expect("admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let row = |n: &str| {
        rows.as_array().and_then(|a| a.iter().find(|r| r["name"] == n)).unwrap_or_else(|| panic!("{n}: {rows}")).clone()
    };
    let fastq = row("FAST@RABBIT");
    assert_eq!(
        (&fastq["link"], &fastq["kind"], &fastq["native_name"], &fastq["domain"], &fastq["direction"]),
        (&"RABBIT".into(), &"rabbitmq".into(), &q("fast").into(), &"QUEUE".into(), &"OUTBOUND".into()),
        "{fastq}"
    );
    assert_eq!(fastq["jobs"][0]["name"], "TO_FAST");
    assert_eq!(fastq["jobs"][0]["role"], "destination");
    assert_eq!(fastq["jobs"][0]["options"]["delivery_mode"], "NON_PERSISTENT");
    assert_eq!(fastq["options"]["create"], true);
    assert_eq!(row("PLAIN@RABBIT")["direction"], "INBOUND");
    let table = aqgate(&["admin", "gateway", "--foreign-queues", "--database", &db]).output().expect("admin");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.lines().next().is_some_and(|l| l.starts_with("NAME") && l.contains("PROVIDER_QUEUE")), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("FULL@RABBIT") && l.contains("INBOUND") && l.contains("FROM_FULL")),
        "{text}"
    );
    drop(s);
    for name in ["fast", "slow", "plain", "full"] {
        let _ = ch.queue_delete(q(name).as_str().into(), Default::default()).await;
    }
    let _ = std::fs::remove_file(&topo);
}

/// NATS, on SQLite: a NON_PERSISTENT job without AQ properties publishes with core NATS (the
/// stream on the subject keeps it), with `Nats-Msg-Id` and no `AQ-*` header.
#[tokio::test(flavor = "multi_thread")]
async fn nats_non_persistent_publishes_without_aq_headers() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let toml = format!(
        "\n[[gateway.links]]\nname = \"nats\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n\
         \n[[gateway.foreign_queues]]\nname = \"out\"\nlink = \"nats\"\nnative_name = \"aqgt.{t}.out\"\n\
         stream = \"{stream}\"\ncreate = true\n\
         \n[[gateway.jobs]]\nname = \"to_nats\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"out@nats\"\n\
         delivery_mode = \"NON_PERSISTENT\"\naq_msg_properties = false\n"
    );
    let topo = demo_topology_with("gateway-options-nats", &toml);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway options nats", &db, port, &topo);
    let j = wait_job(&db, "TO_NATS", Duration::from_secs(60), |j| j["state"] == "RUNNING");
    assert!(j["guarantee"].as_str().is_some_and(|g| g.contains("core NATS publish")), "{j}");
    let ids = send_numbered(port, "AQUSER.RAW_QUE", 5, 1, 1, "<priority>2</priority>").await;
    wait_depth(&db, "AQUSER.RAW_QUE", 0, Duration::from_secs(30));
    let js = jetstream(4222).await;
    let st = js.get_stream(&stream).await.expect("stream");
    let m = st.get_raw_message(1).await.expect("the message, kept by the stream");
    assert_eq!(m.payload.as_ref(), 5u32.to_be_bytes());
    let names: Vec<String> = m.headers.iter().map(|(k, _)| k.to_string()).collect();
    assert!(!names.iter().any(|n| n.to_ascii_uppercase().starts_with("AQ-")), "no AQ-* header: {names:?}");
    assert_eq!(m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string()).as_ref(), ids.first());
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

/// MQTT, on SQLite: RAW_QUE → topic `t` (the outbound twin), `t` → RAW_ARCHIVE with
/// `no_local`, `t` → RAW_INBOX without; the test's client publishes one message to `t`
/// too. RAW_ARCHIVE gets only the client's, RAW_INBOX both. RAW_REJECTS → topic `q0`,
/// NON_PERSISTENT: the test's subscriber gets it at QoS 0.
#[tokio::test(flavor = "multi_thread")]
async fn mqtt_no_local_and_qos_0() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let t = tag();
    let mut toml = format!(
        "\n[[gateway.links]]\nname = \"mqtt\"\nkind = \"mqtt\"\nurl = \"mqtt://127.0.0.1:1883\"\n\
         \n[[gateway.foreign_queues]]\nname = \"t\"\nlink = \"mqtt\"\nnative_name = \"aqgt/{t}/t\"\n\
         \n[[gateway.foreign_queues]]\nname = \"q0\"\nlink = \"mqtt\"\nnative_name = \"aqgt/{t}/q0\"\n"
    );
    for (name, source, destination, options) in [
        ("twin", "AQUSER.RAW_QUE", "t@mqtt", ""),
        ("local", "t@mqtt", "AQUSER.RAW_ARCHIVE", "no_local = true"),
        ("all", "t@mqtt", "AQUSER.RAW_INBOX", ""),
        ("zero", "AQUSER.RAW_REJECTS", "q0@mqtt", "delivery_mode = \"non_persistent\""),
    ] {
        toml.push_str(&format!(
            "\n[[gateway.jobs]]\nname = \"{name}_{t}\"\nsource = \"{source}\"\ndestination = \"{destination}\"\n{options}\n"
        ));
    }
    let topo = demo_topology_with("gateway-options-mqtt", &toml);
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway options mqtt", &db, port, &topo);
    let up = t.to_uppercase();
    for j in ["TWIN", "LOCAL", "ALL", "ZERO"] {
        wait_job(&db, &format!("{j}_{up}"), Duration::from_secs(60), |j| j["state"] == "RUNNING");
    }
    let (client, mut el) = AsyncClient::new(MqttOptions::new(format!("aqgt-test-opt-{t}"), "127.0.0.1", 1883), 100);
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
    client.subscribe(format!("aqgt/{t}/q0"), QoS::AtLeastOnce).await.expect("subscribe");
    tokio::time::timeout(Duration::from_secs(30), subacked.recv()).await.expect("SUBACK");
    // The inbound jobs subscribe as they start, without waiting for their SUBACK: a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;

    send_numbered(port, "AQUSER.RAW_QUE", 1, 1, 1, "").await;
    let (body, props) = mqtt_numbered(&t, 2);
    client.publish_with_properties(format!("aqgt/{t}/t"), QoS::AtLeastOnce, false, body, props).await.expect("publish");
    wait_depth(&db, "AQUSER.RAW_INBOX", 2, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 1, Duration::from_secs(30));
    // Both taken by `all` are there, and nothing more comes to `local`.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drain_payloads(port, "AQUSER.RAW_ARCHIVE").await, [hex(2)], "no_local leaves the twin's message");
    let mut inbox = drain_payloads(port, "AQUSER.RAW_INBOX").await;
    inbox.sort();
    assert_eq!(inbox, [hex(1), hex(2)]);
    let local = job(&admin_json(&db, "jobs"), &format!("LOCAL_{up}")).clone();
    assert_eq!(local["options"]["no_local"], true, "{local}");

    send_numbered(port, "AQUSER.RAW_REJECTS", 3, 1, 1, "").await;
    let p = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("a message").expect("open");
    assert_eq!(p.payload.as_ref(), 3u32.to_be_bytes());
    assert_eq!(p.qos, QoS::AtMostOnce, "NON_PERSISTENT: QoS 0");
    wait_depth(&db, "AQUSER.RAW_REJECTS", 0, Duration::from_secs(30));
    drop(s);
    let _ = client.disconnect().await;
    let _ = std::fs::remove_file(&topo);
}

/// `admin apply` refuses bad option values, naming each job and key.
#[test]
fn bad_options_are_refused_at_apply() {
    let toml = "\n[[gateway.links]]\nname = \"nats\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n\
         \n[[gateway.foreign_queues]]\nname = \"out\"\nlink = \"nats\"\nnative_name = \"x.out\"\nstream = \"X\"\n\
         \n[[gateway.jobs]]\nname = \"often\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"out@nats\"\n\
         delivery_mode = \"sometimes\"\nno_local = true\n\
         \n[[gateway.jobs]]\nname = \"back\"\nsource = \"out@nats\"\ndestination = \"AQUSER.RAW_ARCHIVE\"\n\
         delivery_mode = \"persistent\"\n";
    let topo = demo_topology_with("gateway-options-bad", toml);
    let db = fresh_sqlite_url();
    let out = aqgate(&["admin", "apply", topo.to_str().expect("utf-8"), "--database", &db]).output().expect("apply");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {err}");
    for want in [
        r#"gateway.jobs[0] (often).delivery_mode: persistent, non_persistent or preserve_msg, not "sometimes""#,
        "gateway.jobs[0] (often).no_local: an inbound job's option",
        "gateway.jobs[1] (back).delivery_mode: an outbound job's option",
    ] {
        assert!(err.contains(want), "{want:?} in: {err}");
    }
    // A value of the wrong type: the file's own error, with the key.
    std::fs::write(
        &topo,
        std::fs::read_to_string(&topo).expect("read").replace("no_local = true", "no_local = \"yes\""),
    )
    .expect("write");
    let out = aqgate(&["admin", "apply", topo.to_str().expect("utf-8"), "--database", &db]).output().expect("apply");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no_local"), "{err}");
    let _ = std::fs::remove_file(&topo);
}
