//! What the Messaging Gateway's tests (`tests/gateway.rs`, `tests/gateway_brokers.rs`)
//! share: random tags for the names at a broker, `aqgate serve` with a gateway topology and
//! `admin --json` on its database, the topologies of one link both ways (NATS, RabbitMQ,
//! MQTT), the test's own broker clients (a RabbitMQ channel with confirms and a draining
//! `basic.get`, a bare MQTT subscriber with a persistent session, JetStream), numbered
//! messages to publish inbound, and the ledger of the copies a broker delivered
//! (how many, how many marked x-aqgate-redelivered).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, ConfirmSelectOptions};

use super::{Proc, aqgate, assert_exactly, demo_topology_with, depth, depths, drain_payloads};

/// A random tag for the names at a shared broker, so that runs do not meet.
pub fn tag() -> String {
    aqgate_core::engine::session::random_id()[..10].to_lowercase()
}

/// `aqgate serve` on 127.0.0.1:`port` with database `db` and topology file `topology`
/// (`AQGT_RABBIT_PASSWORD` set for a RabbitMQ link), ready; `what` names it in its log.
pub fn serve(what: &str, db: &str, port: u16, topology: &Path) -> Proc {
    serve_with(what, db, port, topology, &["--no-smtp"])
}

/// [`serve`] with `extra` flags instead of `--no-smtp`.
pub fn serve_with(what: &str, db: &str, port: u16, topology: &Path, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        &format!("aqgate serve ({what})"),
        aqgate(&["serve", "--no-notify", "--listen", &listen, "--database", db])
            .args(extra)
            .args(["--topology", topology.to_str().expect("utf-8")])
            .env("AQGT_RABBIT_PASSWORD", "guest"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// `aqgate admin WHAT --json` on database `db`.
pub fn admin_json(db: &str, what: &str) -> serde_json::Value {
    let out = aqgate(&["admin", what, "--database", db, "--json"]).output().expect("admin");
    assert!(out.status.success(), "admin {what}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Job `name` in `admin jobs`.
pub fn job<'a>(jobs: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    jobs.as_array().and_then(|a| a.iter().find(|j| j["name"] == name)).unwrap_or_else(|| panic!("job {name}: {jobs}"))
}

/// Link `name` is CONNECTED in `admin gateway`.
pub fn l_connected(links: &serde_json::Value, name: &str) -> bool {
    links.as_array().is_some_and(|l| l.iter().any(|r| r["name"] == name && r["state"] == "CONNECTED"))
}

/// The state of link `name` in `admin gateway` on database `db`.
pub fn link_state(db: &str, name: &str) -> Option<String> {
    let links = admin_json(db, "gateway");
    links.as_array()?.iter().find(|r| r["name"] == name).and_then(|r| r["state"].as_str().map(str::to_string))
}

// ---------------------------------------------------------------- topologies

/// Options of a link that fails under the test: heartbeats, and quick reconnects.
pub const QUICK_RECONNECT: &str = "heartbeat_secs = 5\nreconnect_backoff_ms = 200\nreconnect_max_ms = 2000";

/// A topology file `file` (the demo's, see [`demo_topology_with`]) with gateway link
/// `link` of `kind` (`link_lines`: its url, credentials and options), the foreign queues
/// `queues` on it (a name, then its further lines), and two jobs of batch size 20: `to.0`
/// from AQUSER.RAW_QUE to foreign queue `to.1`, `from.0` from foreign queue `from.1` to
/// AQUSER.RAW_ARCHIVE.
fn both_ways(
    file: &str,
    (link, kind, link_lines): (&str, &str, String),
    queues: &[(&str, String)],
    to: (&str, &str),
    from: (&str, &str),
) -> PathBuf {
    let mut toml = format!("\n[[gateway.links]]\nname = \"{link}\"\nkind = \"{kind}\"\n{link_lines}\n");
    for (name, lines) in queues {
        toml.push_str(&format!("\n[[gateway.foreign_queues]]\nname = \"{name}\"\nlink = \"{link}\"\n{lines}\n"));
    }
    let jobs = [
        (to.0, "AQUSER.RAW_QUE".to_string(), format!("{}@{link}", to.1)),
        (from.0, format!("{}@{link}", from.1), "AQUSER.RAW_ARCHIVE".to_string()),
    ];
    for (name, source, destination) in jobs {
        toml.push_str(&format!(
            "\n[[gateway.jobs]]\nname = \"{name}\"\nsource = \"{source}\"\ndestination = \"{destination}\"\nbatch_size = 20\n"
        ));
    }
    demo_topology_with(file, &toml)
}

/// NATS at `url` (and `options`): foreign queue `orders`, `subject` in `stream` (created),
/// with jobs `to_nats` (RAW_QUE → orders) and `from_nats` (orders → RAW_ARCHIVE).
pub fn nats_topology(file: &str, url: &str, options: &str, subject: &str, stream: &str) -> PathBuf {
    let orders = format!("native_name = \"{subject}\"\nstream = \"{stream}\"\ncreate = true");
    both_ways(
        file,
        ("nats", "nats", format!("url = \"{url}\"\n{options}")),
        &[("orders", orders)],
        ("to_nats", "orders"),
        ("from_nats", "orders"),
    )
}

/// RabbitMQ at `url` (as guest, the password from `AQGT_RABBIT_PASSWORD`, and `options`):
/// foreign queues `out` and `in`, the durable queues `qout` and `qin` (created), with jobs
/// `to_rabbit` (RAW_QUE → out) and `from_rabbit` (in → RAW_ARCHIVE).
pub fn rabbit_topology(file: &str, url: &str, options: &str, qout: &str, qin: &str) -> PathBuf {
    let link = format!("url = \"{url}\"\nusername = \"guest\"\npassword_env = \"AQGT_RABBIT_PASSWORD\"\n{options}");
    both_ways(
        file,
        ("rabbit", "rabbitmq", link),
        &[
            ("out", format!("native_name = \"{qout}\"\ncreate = true")),
            ("in", format!("native_name = \"{qin}\"\ncreate = true")),
        ],
        ("to_rabbit", "out"),
        ("from_rabbit", "in"),
    )
}

/// MQTT at `url` (and `options`): foreign queues `out` and `in`, the topics `tout` and
/// `tin`, with jobs `to_mqtt_T` (RAW_QUE → out) and `from_mqtt_T` (in → RAW_ARCHIVE), `T`
/// the tag `t` (a job's name is its session's client id at the broker).
pub fn mqtt_topology(file: &str, url: &str, options: &str, tout: &str, tin: &str, t: &str) -> PathBuf {
    both_ways(
        file,
        ("mqtt", "mqtt", format!("url = \"{url}\"\n{options}")),
        &[("out", format!("native_name = \"{tout}\"")), ("in", format!("native_name = \"{tin}\""))],
        (&format!("to_mqtt_{t}"), "out"),
        (&format!("from_mqtt_{t}"), "in"),
    )
}

// ---------------------------------------------------------------- the test's own clients

/// A channel with publisher confirms to RabbitMQ on 127.0.0.1:`amqp_port` as guest, and its
/// connection.
pub async fn rabbit_channel(amqp_port: u16) -> Result<(lapin::Connection, lapin::Channel), lapin::Error> {
    let url = format!("amqp://guest:guest@127.0.0.1:{amqp_port}/%2f");
    let c = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await?;
    let ch = c.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok((c, ch))
}

/// A channel with publisher confirms to the shared RabbitMQ on 5672.
pub async fn rabbit() -> lapin::Channel {
    let (c, ch) = rabbit_channel(5672).await.expect("RabbitMQ on 5672 (scripts/ensure-brokers.sh)");
    // The connection lives as long as the channel's users need it.
    std::mem::forget(c);
    ch
}

/// Every message in RabbitMQ queue `q`, taken: (payload as numbered hex, marked
/// x-aqgate-redelivered).
pub async fn rabbit_drain(ch: &lapin::Channel, q: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    while let Some(m) = ch.basic_get(q.into(), BasicGetOptions { no_ack: true }).await.expect("basic.get") {
        let d = m.delivery;
        let marked = d.properties.headers().as_ref().is_some_and(|h| {
            h.inner().iter().any(|(k, v)| {
                k.as_str() == "x-aqgate-redelivered"
                    && matches!(v, lapin::types::AMQPValue::LongString(s) if s.as_bytes() == b"true")
            })
        });
        out.push((hex::encode_upper(&d.data), marked));
    }
    out
}

/// Numbered message `i` to publish to RabbitMQ: its body (what [`super::hex`]`(i)` reads
/// back) and its properties (persistent, message id `m-T-i`, `T` the tag `t`).
pub fn amqp_numbered(t: &str, i: usize) -> ([u8; 4], lapin::BasicProperties) {
    let body = u32::try_from(i).expect("small").to_be_bytes();
    let props = lapin::BasicProperties::default().with_message_id(format!("m-{t}-{i}").into()).with_delivery_mode(2);
    (body, props)
}

/// Numbered message `i` to publish over MQTT: its body and its properties (user property
/// `aq-message-id` = `q-T-i`, `T` the tag `t`).
pub fn mqtt_numbered(t: &str, i: usize) -> (Vec<u8>, rumqttc::v5::mqttbytes::v5::PublishProperties) {
    let body = u32::try_from(i).expect("small").to_be_bytes().to_vec();
    let props = rumqttc::v5::mqttbytes::v5::PublishProperties {
        user_properties: vec![("aq-message-id".into(), format!("q-{t}-{i}"))],
        ..Default::default()
    };
    (body, props)
}

/// What a bare MQTT subscriber receives: (payload as numbered hex, marked
/// x-aqgate-redelivered, DUP set by the broker).
pub type MqttSeen = tokio::sync::mpsc::UnboundedReceiver<(String, bool, bool)>;

/// A bare subscriber (client id `aqgt-test-sub-T`, `T` the tag `t`) to `topic` on the MQTT
/// broker on 127.0.0.1:`port`, QoS 1, with a persistent session, polling on (and so
/// reconnecting) through failures; returned once the broker has acknowledged the
/// subscription. Keep the client: what it receives stops with it.
pub async fn mqtt_subscriber(t: &str, port: u16, topic: &str) -> (rumqttc::v5::AsyncClient, MqttSeen) {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let mut o = MqttOptions::new(format!("aqgt-test-sub-{t}"), "127.0.0.1", port);
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(600));
    let (sub, mut sub_loop) = AsyncClient::new(o, 1000);
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let (subacked_tx, subacked) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut subacked_tx = Some(subacked_tx);
        loop {
            match sub_loop.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let marked = p.properties.as_ref().is_some_and(|pr| {
                        pr.user_properties.iter().any(|(k, v)| k == "x-aqgate-redelivered" && v == "true")
                    });
                    if seen_tx.send((hex::encode_upper(&p.payload), marked, p.dup)).is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(tx) = subacked_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    sub.subscribe(topic, QoS::AtLeastOnce).await.expect("subscribe");
    tokio::time::timeout(Duration::from_secs(30), subacked).await.expect("SUBACK").expect("SUBACK");
    (sub, seen_rx)
}

/// JetStream on the NATS server on 127.0.0.1:`port`.
pub async fn jetstream(port: u16) -> async_nats::jetstream::Context {
    let client = async_nats::connect(format!("127.0.0.1:{port}")).await.expect("NATS");
    async_nats::jetstream::new(client)
}

/// How many messages JetStream stream `stream` holds.
pub async fn stream_messages(js: &async_nats::jetstream::Context, stream: &str) -> u64 {
    let mut st = js.get_stream(stream).await.expect("stream");
    st.info().await.expect("stream info").state.messages
}

// ---------------------------------------------------------------- the ledger

/// Waits (at most `within`, `what` naming the wait) until AQUSER.RAW_ARCHIVE holds `total`
/// messages and AQUSER.RAW_QUE none; then a moment more, so that what arrived is all there
/// is; then takes RAW_ARCHIVE through the server on `port` and asserts it holds each of
/// the numbered messages `0..total` once. How long the first wait took.
pub async fn all_arrived(db: &str, port: u16, total: usize, what: &str, within: Duration) -> Duration {
    let began = Instant::now();
    loop {
        let (archived, left) = (depth(db, "AQUSER.RAW_ARCHIVE"), depth(db, "AQUSER.RAW_QUE"));
        if archived == total as i64 && left == 0 {
            break;
        }
        // More than were sent is a duplicate at once; too few after `within`, a loss or a
        // stuck job: either way, say what the queues hold.
        assert!(
            archived <= total as i64 && began.elapsed() < within,
            "{what} not within {within:?}: RAW_ARCHIVE holds {archived} of {total}, RAW_QUE {left}; {:?}",
            depths(db)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = began.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = drain_payloads(port, "AQUSER.RAW_ARCHIVE").await;
    assert_exactly(&got, 0..total);
    waited
}

/// Copies per payload: (how many, how many marked x-aqgate-redelivered).
pub type Copies = BTreeMap<String, (usize, usize)>;

/// Counts a copy of payload `p` in `copies`.
pub fn count_copy(copies: &mut Copies, p: String, marked: bool) {
    let e = copies.entry(p).or_default();
    e.0 += 1;
    e.1 += usize::from(marked);
}

/// The copies of what a broker delivered: (payload, marked).
pub fn copies_of(seen: impl IntoIterator<Item = (String, bool)>) -> Copies {
    let mut copies = Copies::new();
    for (p, marked) in seen {
        count_copy(&mut copies, p, marked);
    }
    copies
}

/// The numbered payloads of `0..total` without a copy.
pub fn lost(copies: &Copies, total: usize) -> Vec<String> {
    (0..total).map(super::hex).filter(|p| !copies.contains_key(p)).collect()
}

/// The duplicates: the copies of a payload beyond its first.
pub fn duplicates(copies: &Copies) -> usize {
    copies.values().map(|(n, _)| n - 1).sum()
}
