//! The Messaging Gateway through a real `aqgate serve` and the real brokers on this machine
//! (NATS with JetStream on 4222, RabbitMQ on 5672; `scripts/ensure-brokers.sh` starts them):
//! outbound and inbound jobs with a ledger of what was lost or duplicated while aqgate is
//! killed -9 again and again, unroutable publishes, conversion failures and a job without an
//! exception queue stuck on one (FAILED, naming it), and the links' states in
//! `admin gateway`. Every name at a broker carries a random tag, so runs do not meet.

mod common;

use std::time::Duration;

use common::gateway::*;
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

/// Random moments in a send-and-propagate round: 0 to 700 ms.
fn jitter(i: usize) -> Duration {
    Duration::from_millis(((i * 7919) % 701) as u64)
}

/// NATS both ways through 20 kills of aqgate: client sends → RAW_QUE → (job to_nats) →
/// the stream → (job from_nats, durable consumer) → RAW_ARCHIVE. The stream must hold each
/// message once (outbound exactly once) and RAW_ARCHIVE too (inbound exactly once), and
/// each job's PROPAGATED count is the number of messages.
#[tokio::test(flavor = "multi_thread")]
async fn nats_both_ways_exactly_once_through_kill_nine() {
    let t = tag();
    let stream = format!("AQGT_{}", t.to_uppercase());
    let subject = format!("aqgt.{t}.orders");
    let topo = nats_topology("gateway-nats", "nats://127.0.0.1:4222", "", &subject, &stream);
    let db = fresh_pg_url().await;
    let port = free_port();
    let mut s = serve("gateway", &db, port, &topo);
    let (rounds, per) = (20, 25);
    for r in 0..rounds {
        send_numbered(port, "AQUSER.RAW_QUE", r * per, per, 5, "").await;
        tokio::time::sleep(jitter(r)).await;
        s.kill9();
        s = serve("gateway", &db, port, &topo);
    }
    let total = rounds * per;
    all_arrived(&db, port, total, "every message through NATS and back", Duration::from_secs(90)).await;

    let js = jetstream(4222).await;
    assert_eq!(stream_messages(&js, &stream).await, total as u64, "the stream holds each message once");

    let jobs = admin_json(&db, "jobs");
    for (name, kind) in [("TO_NATS", "gateway-out"), ("FROM_NATS", "gateway-in")] {
        let j = job(&jobs, name);
        assert_eq!(j["kind"], kind, "{j}");
        assert!(j["guarantee"].as_str().is_some_and(|g| g.starts_with("exactly once")), "{j}");
        assert_eq!(j["in_doubt"], 0, "{j}");
        // Each batch counted by its own commit: every message once, however many kills.
        assert_eq!(j["propagated"], total, "{j}");
    }
    wait_until("admin gateway shows the link CONNECTED", Duration::from_secs(30), || {
        l_connected(&admin_json(&db, "gateway"), "NATS")
    });
    println!("nats: {total} messages, 20 kills: 0 lost, 0 duplicated (stream and AQ)");
    drop(s);
    let _ = js.delete_stream(&stream).await;
    let _ = std::fs::remove_file(&topo);
}

/// RabbitMQ through 20 kills of aqgate. Outbound (RAW_QUE → a durable queue): nothing lost,
/// and a message there twice only when a copy is marked x-aqgate-redelivered. Inbound (a
/// bare publisher with confirms and message ids → RAW_ARCHIVE): exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_outbound_marked_and_inbound_exactly_once_through_kill_nine() {
    let t = tag();
    let (qout, qin) = (format!("aqgt.{t}.out"), format!("aqgt.{t}.in"));
    let topo = rabbit_topology("gateway-rabbit", "amqp://127.0.0.1:5672/%2f", "", &qout, &qin);
    let db = fresh_pg_url().await;
    let port = free_port();
    let ch = rabbit().await;
    ch.queue_declare(qin.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
        .await
        .expect("declare the inbound queue");
    let mut s = serve("gateway", &db, port, &topo);
    let (rounds, per) = (20, 25);
    for r in 0..rounds {
        send_numbered(port, "AQUSER.RAW_QUE", r * per, per, 5, "").await;
        for i in r * per..(r + 1) * per {
            let (body, props) = amqp_numbered(&t, i);
            let c = ch
                .basic_publish("".into(), qin.as_str().into(), BasicPublishOptions::default(), &body, props)
                .await
                .expect("publish");
            assert!(c.await.expect("confirm").is_ack());
        }
        tokio::time::sleep(jitter(r)).await;
        s.kill9();
        s = serve("gateway", &db, port, &topo);
    }
    let total = rounds * per;
    all_arrived(&db, port, total, "every message through RabbitMQ", Duration::from_secs(90)).await;

    let copies = copies_of(rabbit_drain(&ch, &qout).await);
    let lost = lost(&copies, total);
    assert!(lost.is_empty(), "lost at RabbitMQ: {lost:?}");
    let unmarked: Vec<_> = copies.iter().filter(|(_, (n, marked))| *n > 1 && *marked == 0).collect();
    assert!(unmarked.is_empty(), "duplicated without the mark: {unmarked:?}");
    let dups = duplicates(&copies);
    assert_eq!(copies.len(), total, "only the numbered messages: {:?}", copies.keys().take(3).collect::<Vec<_>>());
    let jobs = admin_json(&db, "jobs");
    assert_eq!(job(&jobs, "TO_RABBIT")["in_doubt"], 0, "{jobs}");
    println!(
        "rabbitmq: {total} messages each way, 20 kills: 0 lost; outbound {dups} duplicates, all marked; inbound 0 duplicated"
    );
    drop(s);
    let _ = ch.queue_delete(qout.as_str().into(), Default::default()).await;
    let _ = ch.queue_delete(qin.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
}

/// What cannot go: an unroutable publish goes to the exception queue; a job without one is
/// FAILED naming the message (which stays, the next ones behind it); an inbound body the
/// destination's type cannot take goes to a RAW exception queue with the reason, while
/// good ones arrive; a link to a closed port is RECONNECTING with its error, and the server
/// stays ready.
#[tokio::test(flavor = "multi_thread")]
async fn unroutable_poison_conversion_and_a_dead_link() {
    let t = tag();
    let qconv = format!("aqgt.{t}.conv");
    let topo = demo_topology_with(
        "gateway-failures",
        &format!(
            r#"
[[gateway.links]]
name = "rabbit"
kind = "rabbitmq"
url = "amqp://127.0.0.1:5672/%2f"
username = "guest"
password_env = "AQGT_RABBIT_PASSWORD"

[[gateway.links]]
name = "dead"
kind = "nats"
url = "nats://127.0.0.1:1"
reconnect_backoff_ms = 100
reconnect_max_ms = 500

[[gateway.foreign_queues]]
name = "nowhere"
link = "rabbit"
domain = "topic"
native_name = "amq.direct"
routing_key = "aqgt.{t}.nobody"

[[gateway.foreign_queues]]
name = "conv"
link = "rabbit"
native_name = "{qconv}"
create = true

[[gateway.foreign_queues]]
name = "void"
link = "dead"
native_name = "aqgt.{t}.void"
stream = "AQGT_VOID"

[[gateway.jobs]]
name = "unroutable"
source = "AQUSER.RAW_INBOX"
destination = "nowhere@rabbit"
exception_queue = "AQUSER.RAW_REJECTS"

[[gateway.jobs]]
name = "stuck"
source = "AQUSER.RAW_QUE"
destination = "nowhere@rabbit"

[[gateway.jobs]]
name = "from_conv"
source = "conv@rabbit"
destination = "AQUSER.JMS_TEXTQ"
exception_queue = "AQUSER.RAW_REJECTS"

[[gateway.jobs]]
name = "to_void"
source = "AQUSER.RAW_ARCHIVE"
destination = "void@dead"
"#
        ),
    );
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve("gateway failures", &db, port, &topo);

    send_numbered(port, "AQUSER.RAW_INBOX", 0, 3, 3, "").await;
    let stuck = send_numbered(port, "AQUSER.RAW_QUE", 100, 2, 1, "").await;
    let ch = rabbit().await;
    ch.queue_declare(qconv.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
        .await
        .expect("declare");
    for (i, body) in [&b"hello"[..], &[0xff, 0xfe, 0x00][..], &b"world"[..]].into_iter().enumerate() {
        let props = lapin::BasicProperties::default().with_message_id(format!("c-{t}-{i}").into());
        let c = ch.basic_publish("".into(), qconv.as_str().into(), BasicPublishOptions::default(), body, props).await;
        assert!(c.expect("publish").await.expect("confirm").is_ack());
    }
    wait_depth(&db, "AQUSER.RAW_REJECTS", 4, Duration::from_secs(30));
    wait_depth(&db, "AQUSER.JMS_TEXTQ", 2, Duration::from_secs(30));
    assert_eq!(depth(&db, "AQUSER.RAW_INBOX"), 0, "the unroutable ones went to the exception queue");

    wait_until("the stuck job FAILED on its first message", Duration::from_secs(30), || {
        let jobs = admin_json(&db, "jobs");
        let j = job(&jobs, "STUCK");
        j["state"] == "FAILED"
            && j["last_error"].as_str().is_some_and(|e| e.contains(&stuck[0]) && e.contains("NO_ROUTE"))
    });
    assert_eq!(depth(&db, "AQUSER.RAW_QUE"), 2, "the message it is stuck on, and the one behind it, stay");

    // The exception copies: the unroutable RAW messages as they were, and the body that is
    // not UTF-8 text with the reason as its correlation.
    let mut reasons = Vec::new();
    let mut payloads = Vec::new();
    loop {
        let r = http(port, &receive("AQUSER.RAW_REJECTS", "<wait_time>0</wait_time>", COMMIT)).await;
        if matches!(&r, aqgate_proto::idap::Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE) {
            break;
        }
        for m in received(&r) {
            payloads.push(raw_of(&m));
            reasons.extend(m.header.correlation.clone());
        }
    }
    payloads.sort();
    assert_eq!(payloads, vec![hex(0), hex(1), hex(2), "FFFE00".to_string()], "{reasons:?}");
    assert!(reasons.iter().any(|c| c.contains(&format!("c-{t}-1")) && c.contains("UTF-8")), "{reasons:?}");

    wait_until("the dead link is RECONNECTING with its error", Duration::from_secs(30), || {
        let links = admin_json(&db, "gateway");
        links.as_array().is_some_and(|l| {
            l.iter().any(|r| r["name"] == "DEAD" && r["state"] == "RECONNECTING" && r["last_error"].is_string())
        }) && l_connected(&links, "RABBIT")
    });
    assert_eq!(http_get(port, "/readyz").map(|(c, _)| c), Some(200), "ready while a broker is down");
    let (_, metrics) = http_get(port, "/metrics").expect("metrics");
    let gauge = |link: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("aqgate_gateway_link_connected{{link=\"{link}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!((gauge("RABBIT").as_deref(), gauge("DEAD").as_deref()), (Some("1"), Some("0")), "{metrics}");
    assert!(metrics.contains("aqgate_propagation_exceptions_total{job=\"FROM_CONV\"} 1"), "{metrics}");
    let jobs = admin_json(&db, "jobs");
    assert_eq!(job(&jobs, "TO_VOID")["state"], "RETRYING", "{jobs}");
    drop(s);
    let _ = ch.queue_delete(qconv.as_str().into(), Default::default()).await;
    let _ = std::fs::remove_file(&topo);
}

/// MQTT (Mosquitto, QoS 1) through 20 kills of aqgate. Outbound (RAW_QUE → a topic a bare
/// subscriber with a persistent session reads): nothing lost, a message twice only with a
/// copy marked. Inbound (a bare publisher with `aq-message-id` → RAW_ARCHIVE, through the
/// job's persistent session, which the broker keeps while aqgate is down): exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn mqtt_outbound_marked_and_inbound_exactly_once_through_kill_nine() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, MqttOptions};

    let t = tag();
    let (tout, tin) = (format!("aqgt/{t}/out"), format!("aqgt/{t}/in"));
    let topo = mqtt_topology("gateway-mqtt", "mqtt://127.0.0.1:1883", "", &tout, &tin, &t);
    // The bare subscriber: a persistent session of its own, counting what arrives.
    let (_sub, mut seen_rx) = mqtt_subscriber(&t, 1883, &tout).await;
    let (publ, mut pub_loop) =
        AsyncClient::new(MqttOptions::new(format!("aqgt-test-pub-{t}"), "127.0.0.1", 1883), 1000);
    tokio::spawn(async move { while pub_loop.poll().await.is_ok() {} });

    let db = fresh_pg_url().await;
    let port = free_port();
    let mut s = serve("gateway", &db, port, &topo);
    wait_until("the inbound job's session is up", Duration::from_secs(30), || {
        l_connected(&admin_json(&db, "gateway"), "MQTT")
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rounds, per) = (20, 25);
    for r in 0..rounds {
        send_numbered(port, "AQUSER.RAW_QUE", r * per, per, 5, "").await;
        for i in r * per..(r + 1) * per {
            let (body, props) = mqtt_numbered(&t, i);
            publ.publish_with_properties(tin.clone(), QoS::AtLeastOnce, false, body, props).await.expect("publish");
        }
        tokio::time::sleep(jitter(r)).await;
        s.kill9();
        s = serve("gateway", &db, port, &topo);
    }
    let total = rounds * per;
    all_arrived(&db, port, total, "every message through MQTT", Duration::from_secs(90)).await;
    let mut copies = Copies::new();
    while let Ok(Some((p, marked, _))) = tokio::time::timeout(Duration::from_secs(2), seen_rx.recv()).await {
        count_copy(&mut copies, p, marked);
    }
    let lost = lost(&copies, total);
    assert!(lost.is_empty(), "lost at the broker: {lost:?}");
    let unmarked: Vec<_> = copies.iter().filter(|(_, (n, marked))| *n > 1 && *marked == 0).collect();
    assert!(unmarked.is_empty(), "duplicated without the mark: {unmarked:?}");
    let dups = duplicates(&copies);
    println!(
        "mqtt: {total} messages each way, 20 kills: 0 lost; outbound {dups} duplicates, all marked; inbound 0 duplicated"
    );
    drop(s);
    let _ = std::fs::remove_file(&topo);
}
