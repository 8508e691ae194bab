//! Bare broker clients, the peers the Messaging Gateway's jobs are measured against (see
//! `scripts/bench-gateway.sh`): the same crate the gateway uses for each broker, doing the
//! same confirmed work — publishing `--count` messages in batches of `--batch`, each batch's
//! confirmations awaited before the next (`broker-publish`), or consuming `--count` messages
//! and acking each (`broker-consume`). Each prints its rate, and the times (Unix seconds) its
//! first and last messages were published or consumed, which the script uses to time a job.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;

#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum Broker {
    Nats,
    Rabbitmq,
    Mqtt,
}

pub struct Target<'a> {
    pub broker: Broker,
    pub url: &'a str,
    /// NATS subject, RabbitMQ queue, MQTT topic.
    pub name: &'a str,
    pub stream: &'a str,
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn report(what: &str, n: usize, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    let last = now_secs();
    println!(
        "scenario={what} messages={n} seconds={secs:.3} msgs/s={:.0} first_at={:.3} last_at={last:.3}",
        n as f64 / secs,
        last - secs
    );
}

pub async fn publish(t: &Target<'_>, count: usize, batch: usize, payload: usize) -> anyhow::Result<()> {
    let body = vec![0x5a_u8; payload];
    let batch = batch.max(1);
    match t.broker {
        Broker::Nats => {
            let js = async_nats::jetstream::new(async_nats::connect(t.url).await?);
            js.get_or_create_stream(async_nats::jetstream::stream::Config {
                name: t.stream.to_string(),
                subjects: vec![t.name.to_string()],
                ..Default::default()
            })
            .await?;
            let start = Instant::now();
            let mut i = 0;
            while i < count {
                let mut acks = Vec::new();
                for _ in 0..batch.min(count - i) {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", format!("bench-{}-{i}", std::process::id()).as_str());
                    acks.push(js.publish_with_headers(t.name.to_string(), h, body.clone().into()).await?);
                    i += 1;
                }
                for a in acks {
                    a.await?;
                }
            }
            report("broker-publish", count, start);
        }
        Broker::Rabbitmq => {
            let conn = lapin::Connection::connect(t.url, lapin::ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            ch.confirm_select(Default::default()).await?;
            ch.queue_declare(t.name.into(), lapin::options::QueueDeclareOptions::durable(), Default::default()).await?;
            let start = Instant::now();
            let mut i = 0;
            while i < count {
                let mut confirms = Vec::new();
                for _ in 0..batch.min(count - i) {
                    let props = lapin::BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(format!("bench-{}-{i}", std::process::id()).into());
                    let opts = lapin::options::BasicPublishOptions { mandatory: true, ..Default::default() };
                    confirms.push(ch.basic_publish("".into(), t.name.into(), opts, &body, props).await?);
                    i += 1;
                }
                for c in confirms {
                    anyhow::ensure!(c.await?.is_ack(), "nacked");
                }
            }
            report("broker-publish", count, start);
        }
        Broker::Mqtt => {
            use rumqttc::v5::mqttbytes::QoS;
            use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
            let (host, port) = mqtt_addr(t.url)?;
            let mut o = rumqttc::v5::MqttOptions::new(format!("bench-pub-{}", std::process::id()), host, port);
            o.set_outgoing_inflight_upper_limit(u16::try_from(batch).unwrap_or(u16::MAX));
            let (client, mut el) = rumqttc::v5::AsyncClient::new(o, batch * 2);
            let (tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                while let Ok(e) = el.poll().await {
                    if let rumqttc::v5::Event::Incoming(Packet::PubAck(_)) = e {
                        let _ = tx.send(());
                    }
                }
            });
            let start = Instant::now();
            let mut i = 0;
            while i < count {
                let n = batch.min(count - i);
                for _ in 0..n {
                    let props = PublishProperties {
                        user_properties: vec![("aq-message-id".into(), format!("bench-{}-{i}", std::process::id()))],
                        ..Default::default()
                    };
                    client.publish_with_properties(t.name, QoS::AtLeastOnce, false, body.clone(), props).await?;
                    i += 1;
                }
                for _ in 0..n {
                    tokio::time::timeout(Duration::from_secs(30), acks.recv())
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("connection lost"))?;
                }
            }
            report("broker-publish", count, start);
        }
    }
    Ok(())
}

pub async fn consume(t: &Target<'_>, count: usize, window: usize) -> anyhow::Result<()> {
    let mut n = 0;
    let mut start = None;
    match t.broker {
        Broker::Nats => {
            let js = async_nats::jetstream::new(async_nats::connect(t.url).await?);
            // Created here if the job has not yet (the same configuration as the job's).
            let stream = js
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: t.stream.to_string(),
                    subjects: vec![t.name.to_string()],
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await?;
            let c: async_nats::jetstream::consumer::PullConsumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                    max_ack_pending: i64::try_from(window).unwrap_or(i64::MAX),
                    filter_subject: t.name.to_string(),
                    ..Default::default()
                })
                .await?;
            let mut msgs = c.messages().await?;
            while n < count {
                let Some(m) = msgs.next().await else { break };
                let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
                start.get_or_insert_with(Instant::now);
                m.double_ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
                n += 1;
            }
        }
        Broker::Rabbitmq => {
            let conn = lapin::Connection::connect(t.url, lapin::ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            ch.basic_qos(u16::try_from(window).unwrap_or(u16::MAX), Default::default()).await?;
            ch.queue_declare(t.name.into(), lapin::options::QueueDeclareOptions::durable(), Default::default()).await?;
            let mut c = ch.basic_consume(t.name.into(), "bench".into(), Default::default(), Default::default()).await?;
            while n < count {
                let Some(d) = c.next().await else { break };
                let d = d?;
                start.get_or_insert_with(Instant::now);
                d.ack(Default::default()).await?;
                n += 1;
            }
        }
        Broker::Mqtt => {
            use rumqttc::v5::mqttbytes::QoS;
            use rumqttc::v5::mqttbytes::v5::Packet;
            let (host, port) = mqtt_addr(t.url)?;
            let mut o = rumqttc::v5::MqttOptions::new(format!("bench-sub-{}", std::process::id()), host, port);
            o.set_manual_acks(true);
            o.set_clean_start(false);
            o.set_session_expiry_interval(Some(600));
            o.set_receive_maximum(Some(u16::try_from(window).unwrap_or(u16::MAX)));
            let (client, mut el) = rumqttc::v5::AsyncClient::new(o, window * 2);
            client.subscribe(t.name, QoS::AtLeastOnce).await?;
            while n < count {
                if let rumqttc::v5::Event::Incoming(Packet::Publish(p)) = el.poll().await? {
                    start.get_or_insert_with(Instant::now);
                    client.ack(&p).await?;
                    n += 1;
                }
            }
        }
    }
    report("broker-consume", n, start.unwrap_or_else(Instant::now));
    Ok(())
}

fn mqtt_addr(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (h, p) = rest.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("{url}: host:port"))?;
    Ok((h.to_string(), p.trim_end_matches('/').parse()?))
}
