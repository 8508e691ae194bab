//! Inbound gateway jobs and message sizes, through a real `aqgate serve` and the real
//! brokers on this machine (Mosquitto 1883, RabbitMQ 5672, NATS 4222): on each broker a
//! body over the link's `max_message_bytes` and one that does not convert go to the
//! exception queue with their reasons, and the messages behind them arrive, in order; on
//! MQTT a message over rumqttc's own 10 KiB default arrives (it used to break the
//! connection at every delivery, for good), one over the Maximum Packet Size the job
//! announced is dropped by the broker without stalling the job, and a broker that sends
//! one all the same (a fake one here) makes the job FAILED with the reason.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::gateway::*;
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

/// The link's `max_message_bytes` in these tests.
const LIMIT: usize = 32 * 1024;

/// What each broker is fed, in order: (a name for its id, the body). `n-0`, a body over
/// the limit, one that is not UTF-8 text, then `n-1` to `n-5`.
fn feed() -> Vec<(String, Vec<u8>)> {
    let mut f = vec![("n0".to_string(), b"n-0".to_vec())];
    f.push(("big".into(), vec![b'x'; LIMIT + 8 * 1024]));
    f.push(("bad".into(), vec![0xff, 0xfe, 0x00]));
    f.extend((1..=5).map(|i| (format!("n{i}"), format!("n-{i}").into_bytes())));
    f
}

/// A topology with link `link_lines` of `kind`, foreign queue `fq_lines` on it, and job
/// `job` from it to AQUSER.JMS_TEXTQ, its exception queue AQUSER.RAW_REJECTS; `extra` more.
fn topology(file: &str, kind: &str, link_lines: &str, fq_lines: &str, job: &str, extra: &str) -> std::path::PathBuf {
    demo_topology_with(
        file,
        &format!(
            r#"
[[gateway.links]]
name = "link"
kind = "{kind}"
{link_lines}

[[gateway.foreign_queues]]
name = "src"
link = "link"
{fq_lines}

[[gateway.jobs]]
name = "{job}"
source = "src@link"
destination = "AQUSER.JMS_TEXTQ"
exception_queue = "AQUSER.RAW_REJECTS"
batch_size = 20
{extra}
"#
        ),
    )
}

/// `aqgate serve` as [`serve`] does, with `env` set too.
fn serve_env(what: &str, db: &str, port: u16, topology: &Path, env: &[(&str, &str)]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db]);
    cmd.args(["--topology", topology.to_str().expect("utf-8")]).env("AQGT_RABBIT_PASSWORD", "guest");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut p = Proc::spawn(&format!("aqgate serve ({what})"), &mut cmd);
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// Every message of `queue`, received and committed as scott: (payload element, correlation).
async fn drain(port: u16, queue: &str) -> Vec<(aqgate_proto::idap::XmlNode, Option<String>)> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        match &r {
            aqgate_proto::idap::Response::Receive(_, Some(_)) => {
                out.extend(received(&r).into_iter().map(|m| (m.payload, m.header.correlation)));
            }
            aqgate_proto::idap::Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

/// What [`feed`] must have left behind for job `job`: the texts in AQUSER.JMS_TEXTQ in
/// order, the body over the limit and the one that is not text in AQUSER.RAW_REJECTS with
/// their reasons (their ids naming them), the counters, and the job RUNNING.
async fn assert_outcome(db: &str, port: u16, job_name: &str, id_of: impl Fn(&str) -> String) {
    wait_depth(db, "AQUSER.RAW_REJECTS", 2, Duration::from_secs(60));
    wait_depth(db, "AQUSER.JMS_TEXTQ", 6, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let texts: Vec<String> = drain(port, "AQUSER.JMS_TEXTQ")
        .await
        .into_iter()
        .map(|(p, _)| p.child("text_data").map(aqgate_proto::idap::XmlNode::text).unwrap_or_default())
        .collect();
    assert_eq!(texts, (0..=5).map(|i| format!("n-{i}")).collect::<Vec<_>>(), "the good ones, in order");
    let rejects = drain(port, "AQUSER.RAW_REJECTS").await;
    assert_eq!(rejects.len(), 2, "{rejects:?}");
    let big = hex::encode_upper(vec![b'x'; LIMIT + 8 * 1024]);
    let why = |payload: &str| {
        rejects.iter().find(|(p, _)| p.text() == payload).and_then(|(_, c)| c.clone()).unwrap_or_default()
    };
    let (big_why, bad_why) = (why(&big), why("FFFE00"));
    assert!(
        big_why.contains(&id_of("big"))
            && big_why.contains(&format!("40960 bytes, over the link's max_message_bytes ({LIMIT})")),
        "the big one kept whole, with its reason: {big_why:?}"
    );
    assert!(bad_why.contains(&id_of("bad")) && bad_why.contains("UTF-8"), "{bad_why:?}");
    assert_eq!(metric(port, &format!("aqgate_gateway_oversize_total{{job=\"{job_name}\"}}")), 1);
    assert_eq!(metric(port, &format!("aqgate_propagation_exceptions_total{{job=\"{job_name}\"}}")), 2);
    let jobs = admin_json(db, "jobs");
    assert_eq!(job(&jobs, job_name)["state"], "RUNNING", "{jobs}");
}

/// MQTT: link `limited` (`max_message_bytes` 32 KiB, so a Maximum Packet Size of
/// 128 KiB announced) feeds AQUSER.JMS_TEXTQ; between the bad one and `n-1` comes a body of
/// 200 KiB, past the announced size: Mosquitto drops it and the rest arrive. Link `plain`
/// (the default 1 MiB) feeds AQUSER.RAW_ARCHIVE a 20 KiB body, then numbered ones: over
/// rumqttc's 10 KiB default, the job used to stall on it for good.
#[tokio::test(flavor = "multi_thread")]
async fn mqtt_big_and_bad_messages_go_to_the_exception_queue_and_the_rest_arrive_in_order() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::PublishProperties;
    use rumqttc::v5::{AsyncClient, MqttOptions};

    let t = tag();
    let (tsizes, tplain) = (format!("aqgt/{t}/sizes"), format!("aqgt/{t}/plain"));
    let topo = topology(
        "gateway-sizes-mqtt",
        "mqtt",
        &format!("url = \"mqtt://127.0.0.1:1883\"\nmax_message_bytes = {LIMIT}"),
        &format!("native_name = \"{tsizes}\""),
        &format!("sizes_{t}"),
        &format!(
            r#"
[[gateway.links]]
name = "plain"
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"

[[gateway.foreign_queues]]
name = "plain"
link = "plain"
native_name = "{tplain}"

[[gateway.jobs]]
name = "plain_{t}"
source = "plain@plain"
destination = "AQUSER.RAW_ARCHIVE"
batch_size = 20
"#
        ),
    );
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway sizes mqtt", &db, port, &topo);
    wait_until("both jobs' sessions are up", Duration::from_secs(30), || {
        let links = admin_json(&db, "gateway");
        l_connected(&links, "LINK") && l_connected(&links, "PLAIN")
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    let (publ, mut pub_loop) = AsyncClient::new(MqttOptions::new(format!("aqgt-test-pub-{t}"), "127.0.0.1", 1883), 100);
    tokio::spawn(async move { while pub_loop.poll().await.is_ok() {} });
    let props =
        |id: String| PublishProperties { user_properties: vec![("aq-message-id".into(), id)], ..Default::default() };
    for (k, (name, body)) in feed().into_iter().enumerate() {
        publ.publish_with_properties(tsizes.clone(), QoS::AtLeastOnce, false, body, props(format!("q-{t}-{name}")))
            .await
            .expect("publish");
        if k == 2 {
            publ.publish_with_properties(
                tsizes.clone(),
                QoS::AtLeastOnce,
                false,
                vec![b'y'; 200 * 1024],
                props(format!("q-{t}-huge")),
            )
            .await
            .expect("publish");
        }
    }
    publ.publish_with_properties(
        tplain.clone(),
        QoS::AtLeastOnce,
        false,
        vec![b'z'; 20 * 1024],
        props(format!("p-{t}-z")),
    )
    .await
    .expect("publish");
    for i in 0..5 {
        let (body, p) = mqtt_numbered(&t, i);
        publ.publish_with_properties(tplain.clone(), QoS::AtLeastOnce, false, body, p).await.expect("publish");
    }

    assert_outcome(&db, port, &format!("SIZES_{}", t.to_uppercase()), |n| format!("q-{t}-{n}")).await;
    wait_depth(&db, "AQUSER.RAW_ARCHIVE", 6, Duration::from_secs(60));
    let got = drain_payloads(port, "AQUSER.RAW_ARCHIVE").await;
    let mut want = vec![hex::encode_upper(vec![b'z'; 20 * 1024])];
    want.extend((0..5).map(hex));
    assert_eq!(got, want, "the 20 KiB one, then the rest, in order");
    let jobs = admin_json(&db, "jobs");
    assert_eq!(job(&jobs, &format!("PLAIN_{}", t.to_uppercase()))["state"], "RUNNING", "{jobs}");
    println!("mqtt: 40 KiB and a bad body to the exception queue, 200 KiB dropped by the broker, 20 KiB through");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}

/// RabbitMQ: the link's `max_message_bytes` is 32 KiB.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_big_and_bad_messages_go_to_the_exception_queue_and_the_rest_arrive_in_order() {
    let t = tag();
    let q = format!("aqgt.{t}.sizes");
    let topo = topology(
        "gateway-sizes-rabbit",
        "rabbitmq",
        &format!(
            "url = \"amqp://127.0.0.1:5672/%2f\"\nusername = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\nmax_message_bytes = {LIMIT}"
        ),
        &format!("native_name = \"{q}\"\ncreate = true"),
        "sizes",
        "",
    );
    let ch = rabbit().await;
    ch.queue_declare(q.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default()).await.expect("declare");
    for (name, body) in feed() {
        let props = lapin::BasicProperties::default().with_message_id(format!("r-{t}-{name}").into());
        let c = ch.basic_publish("".into(), q.as_str().into(), BasicPublishOptions::default(), &body, props).await;
        assert!(c.expect("publish").await.expect("confirm").is_ack());
    }
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway sizes rabbitmq", &db, port, &topo);
    assert_outcome(&db, port, "SIZES", |n| format!("r-{t}-{n}")).await;
    drop(s);
    let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
}

/// NATS: no `max_message_bytes` on the link; the process's default is 32 KiB
/// (`AQGATE_BROKER_MAX_MESSAGE_BYTES`).
#[tokio::test(flavor = "multi_thread")]
async fn nats_big_and_bad_messages_go_to_the_exception_queue_and_the_rest_arrive_in_order() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.sizes");
    let topo = topology(
        "gateway-sizes-nats",
        "nats",
        "url = \"nats://127.0.0.1:4222\"",
        &format!("native_name = \"{subject}\"\nstream = \"{stream}\"\ncreate = true"),
        "sizes",
        "",
    );
    let js = jetstream(4222).await;
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .expect("stream");
    for (_, body) in feed() {
        js.publish(subject.clone(), body.into()).await.expect("publish").await.expect("PubAck");
    }
    let db = fresh_sqlite_url();
    let port = free_port();
    let limit = LIMIT.to_string();
    let s = serve_env("gateway sizes nats", &db, port, &topo, &[("AQGATE_BROKER_MAX_MESSAGE_BYTES", &limit)]);
    // The stream's sequences: n-0 is 1, the big one 2, the bad one 3.
    assert_outcome(&db, port, "SIZES", |n| match n {
        "big" => format!("{stream}:2"),
        _ => format!("{stream}:3"),
    })
    .await;
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

// ---------------------------------------------------------------- a broker past the limit

/// An MQTT remaining length, as its variable byte integer.
fn varint(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return out;
        }
    }
}

/// One packet from `s`: its first byte and its body.
fn packet(s: &mut std::net::TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let mut c = [0u8; 1];
        s.read_exact(&mut c)?;
        len |= usize::from(c[0] & 0x7f) << shift;
        shift += 7;
        if c[0] & 0x80 == 0 {
            break;
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((b[0], body))
}

/// The Maximum Packet Size property (0x27) of an MQTT v5 CONNECT's body, if announced.
fn announced_max(connect: &[u8]) -> Option<u32> {
    // Protocol name (2 + 4), version, flags, keep-alive: 10 bytes; then the properties.
    let mut i = 10;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let c = *connect.get(i)?;
        i += 1;
        len |= usize::from(c & 0x7f) << shift;
        shift += 7;
        if c & 0x80 == 0 {
            break;
        }
    }
    let props = connect.get(i..i + len)?;
    let mut j = 0;
    while j < props.len() {
        let id = props[j];
        j += 1;
        let width = match id {
            0x27 | 0x11 => 4,
            0x21 | 0x22 => 2,
            0x17 | 0x19 => 1,
            _ => return None,
        };
        if id == 0x27 {
            return Some(u32::from_be_bytes(props.get(j..j + 4)?.try_into().ok()?));
        }
        j += width;
    }
    None
}

/// A broker that does not keep to the Maximum Packet Size a client announces: it accepts
/// each connection, acknowledges its CONNECT and SUBSCRIBE, and sends a PUBLISH of 100 KiB.
/// The announced sizes it saw go to `seen`.
fn rogue_broker(listener: std::net::TcpListener, seen: std::sync::mpsc::Sender<Option<u32>>) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            let seen = seen.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let (kind, connect) = packet(&mut s)?;
                assert_eq!(kind >> 4, 1, "CONNECT first");
                let _ = seen.send(announced_max(&connect));
                s.write_all(&[0x20, 0x03, 0x00, 0x00, 0x00])?;
                loop {
                    let (kind, body) = packet(&mut s)?;
                    if kind >> 4 == 8 {
                        s.write_all(&[0x90, 0x04, body[0], body[1], 0x00, 0x01])?;
                        let topic = b"aqgt/rogue";
                        let mut p = vec![0x00, topic.len() as u8];
                        p.extend_from_slice(topic);
                        p.extend_from_slice(&[0x00, 0x01, 0x00]);
                        p.extend(std::iter::repeat_n(b'r', 100 * 1024));
                        let mut out = vec![0x32];
                        out.extend(varint(p.len()));
                        out.extend(p);
                        s.write_all(&out)?;
                    }
                }
            });
        }
    });
}

/// Against a broker that sends a packet over the announced Maximum Packet Size (1 KiB
/// bodies: 66 KiB announced), the job is FAILED with the reason (not merely RETRYING on a
/// link error), reconnects with its backoff, and the server stays ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_past_the_announced_packet_size_makes_the_job_failed_with_the_reason() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let broker = listener.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    rogue_broker(listener, tx);
    let topo = topology(
        "gateway-sizes-rogue",
        "mqtt",
        &format!("url = \"mqtt://127.0.0.1:{broker}\"\nmax_message_bytes = 1024\n{QUICK_RECONNECT}"),
        "native_name = \"aqgt/rogue\"",
        "rogue",
        "",
    );
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway sizes rogue", &db, port, &topo);
    let announced = rx.recv_timeout(Duration::from_secs(30)).expect("a CONNECT");
    assert_eq!(announced, Some(2 * 1024 + 64 * 1024), "the Maximum Packet Size announced");
    let j = wait_job(&db, "ROGUE", Duration::from_secs(30), |j| j["state"] == "FAILED");
    let e = j["last_error"].as_str().unwrap_or_default();
    assert!(e.contains("over the Maximum Packet Size of 67584") && e.contains("max_message_bytes"), "{j}");
    // It goes on trying (the broker may be fixed, the limit raised), with its backoff.
    assert!(rx.recv_timeout(Duration::from_secs(30)).is_ok(), "it connects again");
    assert_eq!(http_get(port, "/readyz").map(|(c, _)| c), Some(200), "ready all the while");
    drop(s);
    let _ = std::fs::remove_file(&topo);
}
