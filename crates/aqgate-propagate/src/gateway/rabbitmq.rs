//! RabbitMQ links (lapin, AMQP 0-9-1).
//!
//! - **Outbound, at least once.** A channel in confirm mode; every message is published
//!   `mandatory` and persistent (delivery mode 2; 1 for a job whose `delivery_mode` is
//!   `non_persistent`, which RabbitMQ confirms without writing it to disk) with `message_id` = its AQ message id, the
//!   batch's confirms are awaited, and only then does the job commit its dequeue. A message
//!   the broker returns (no queue is bound for it) is refused for good: the job's exception
//!   queue, or FAILED. A message sent before and perhaps received (the process died between
//!   the publish and the commit) goes again with the header `x-aqgate-redelivered: true`,
//!   and is counted: the one case a consumer can see it twice.
//! - **Back-pressure.** While the broker blocks the connection (`connection.blocked`, a
//!   memory or disk alarm) the job does not publish; after 30 s it backs off and retries.
//! - **Inbound.** `basic.consume` with a prefetch of the link's window, manual acks after
//!   the local commit; the broker's `message_id` (with the queue) is the dedup mark, so a
//!   redelivered message already enqueued is acked and not enqueued again. A message
//!   without a `message_id` cannot be told from its redelivery: at least once.
//! - **JMS properties** travel as typed AMQP headers (an `int` a 32-bit signed integer, a
//!   `double` a double, …), the JMS header fields in AMQP's `type`, `app_id`, `reply_to`
//!   where they fit, else as `JMS*` headers (`convert::props`). Coming in, a header of a
//!   type JMS has not (a table, an array, bytes, a decimal) is not carried.

use std::time::Duration;

use aqgate_core::topology::gateway::{Domain, ForeignQueueDef, LinkDef};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

use super::convert::props::{self, JmsProps, JmsValue};
use super::convert::{Incoming, Outgoing};
use super::pool::{Pool, Shared};
use super::{Confirming, Published, Sink, Source, credentials};

/// A share of one of the link's connections (`max_connections`): the job's channel is its own.
async fn shared(pool: &Pool<Connection>, link: &LinkDef) -> Result<Shared<Connection>, String> {
    pool.take(&link.name, link.shared().unwrap_or(1), || connect(link)).await
}

async fn connect(link: &LinkDef) -> Result<Connection, String> {
    let mut uri: lapin::uri::AMQPUri = link.url.parse().map_err(|e| format!("{}: {e}", link.url))?;
    if let Some((user, password)) = credentials(link)? {
        uri.authority.userinfo = lapin::uri::AMQPUserInfo { username: user, password };
    }
    uri.query.heartbeat = Some(link.heartbeat_secs);
    uri.query.connection_timeout = Some(10_000);
    let props = ConnectionProperties::default().with_connection_name(format!("aqgate {}", link.name).into());
    let tls = lapin::tcp::OwnedTLSConfig {
        identity: match (&link.cert_file, &link.key_file) {
            (Some(c), Some(k)) => Some(lapin::tcp::OwnedIdentity::PKCS8 {
                pem: std::fs::read(c).map_err(|e| format!("{c}: {e}"))?,
                key: std::fs::read(k).map_err(|e| format!("{k}: {e}"))?,
            }),
            _ => None,
        },
        cert_chain: match &link.ca_file {
            Some(f) => Some(std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?),
            None => None,
        },
    };
    let runtime = lapin::runtime::default_runtime().map_err(|e| format!("runtime: {e}"))?;
    Connection::connect_uri_with_config(uri, props, tls, runtime).await.map_err(|e| format!("{}: {e}", link.url))
}

/// Ends what an inbound job on a topic (an exchange) declared for itself: its queue
/// `aqgate.<job>` and with it the queue's binding (the messages in it were copies for the job).
/// `Ok(Some(what))` names what went; `Ok(None)`: there was none.
pub async fn remove(link: &LinkDef, job: &str) -> Result<Option<String>, String> {
    let conn = connect(link).await?;
    let ch = conn.create_channel().await.map_err(|e| format!("channel: {e}"))?;
    let q = format!("aqgate.{job}");
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    if let Err(e) = bounded("queue.declare", ch.queue_declare(q.as_str().into(), passive, FieldTable::default())).await
    {
        let _ = conn.close(200, "".into()).await;
        // A passive declaration of a queue that is not there closes the channel with 404.
        return if e.contains("NOT_FOUND") || e.contains("404") { Ok(None) } else { Err(e) };
    }
    let ch = conn.create_channel().await.map_err(|e| format!("channel: {e}"))?;
    bounded("queue.delete", ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())).await?;
    let _ = conn.close(200, "".into()).await;
    Ok(Some(format!("queue {q} and its binding at {}", link.url)))
}

/// How long the job waits for a broker's confirm, or for lapin to send a publish, an ack or
/// a nack. lapin leaves such a promise unresolved when the connection fails under it (a
/// reset while the frame waits to go out): a job's wait ends at once when its connection
/// goes ([`super::pool::Watch::bounded`]), and in any case at this bound, past which the
/// link counts as failed.
const PROMISE_WAIT: Duration = Duration::from_secs(30);

/// A wait on `remove`'s own connection (no job shares it), within `PROMISE_WAIT`.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = lapin::Result<T>>) -> Result<T, String> {
    match tokio::time::timeout(PROMISE_WAIT, f).await {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {} s", PROMISE_WAIT.as_secs())),
    }
}

/// Where a foreign queue's messages are published: (exchange, routing key).
fn target(fq: &ForeignQueueDef) -> (String, String) {
    match fq.domain {
        Domain::Queue => (String::new(), fq.native_name.clone()),
        Domain::Topic => (fq.native_name.clone(), fq.routing_key.clone().unwrap_or_default()),
    }
}

async fn declare(ch: &lapin::Channel, fq: &ForeignQueueDef) -> Result<(), String> {
    if !fq.create {
        return Ok(());
    }
    match fq.domain {
        Domain::Queue => ch
            .queue_declare(fq.native_name.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
            .await
            .map(|_| ())
            .map_err(|e| format!("declaring queue {}: {e}", fq.native_name)),
        Domain::Topic => ch
            .exchange_declare(
                fq.native_name.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions { durable: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("declaring exchange {}: {e}", fq.native_name)),
    }
}

pub struct RabbitSink {
    conn: Shared<Connection>,
    ch: lapin::Channel,
    exchange: String,
    routing_key: String,
}

pub async fn sink(pool: &Pool<Connection>, link: &LinkDef, fq: &ForeignQueueDef) -> Result<RabbitSink, String> {
    let conn = shared(pool, link).await?;
    let ch = set_up(&conn, async {
        let ch = conn.create_channel().await.map_err(|e| format!("channel: {e}"))?;
        ch.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| format!("confirm.select: {e}"))?;
        declare(&ch, fq).await?;
        Ok(ch)
    })
    .await?;
    let (exchange, routing_key) = target(fq);
    Ok(RabbitSink { conn, ch, exchange, routing_key })
}

/// How long a job may take to set its channel up on a shared connection.
const SETUP_WAIT: Duration = Duration::from_secs(10);

/// A job's channel set up on a shared connection within `SETUP_WAIT`, given up at once when
/// the connection goes (lapin may leave a promise unresolved when the connection fails under
/// it); failing, the connection is told (dropped for every job on it if it is down).
async fn set_up<T>(
    conn: &Shared<Connection>,
    f: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let r = conn.watch().bounded("setting up the channel", SETUP_WAIT, f).await;
    if r.is_err() {
        conn.failed();
    }
    r
}

/// AQ's priority (smaller is more urgent, 1 by default) as AMQP's (0–9, larger is more
/// urgent): 0 and below → 9, 1 → 8, …, 9 and above → 0. The exact value travels as
/// `AQ-Priority`.
fn amqp_priority(aq: i64) -> u8 {
    u8::try_from((9 - aq.clamp(0, 9)).clamp(0, 9)).unwrap_or(0)
}

#[async_trait::async_trait]
impl Sink for RabbitSink {
    fn stale(&self) -> bool {
        self.conn.stale()
    }

    fn failed(&self) {
        self.conn.failed();
    }

    async fn publish(&mut self, batch: &[Outgoing]) -> Result<Confirming, String> {
        let mut waited = 0;
        while self.conn.status().blocked() {
            if waited == 0 {
                tracing::warn!(exchange = %self.exchange, "the broker blocks publishing (connection.blocked); waiting");
            }
            if waited >= 300 {
                return Err("the broker has blocked the connection for 30 s (connection.blocked)".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += 1;
        }
        let watch = self.conn.watch();
        let mut confirms = Vec::with_capacity(batch.len());
        for m in batch {
            let mut headers = FieldTable::default();
            for (k, v) in m.headers() {
                headers.insert(ShortString::from(k), AMQPValue::LongString(LongString::from(v)));
            }
            let props = BasicProperties::default()
                // 2: persistent, 1: not (the job's delivery_mode NON_PERSISTENT).
                .with_delivery_mode(if m.mode.persistent { 2 } else { 1 })
                .with_content_type(m.content_type.into())
                .with_priority(amqp_priority(m.priority));
            let mut props = jms_properties(&m.props, props, &mut headers).with_headers(headers);
            // AMQP's short strings hold 255 bytes: a longer id or correlation travels in its
            // AQ-* header only.
            if let Ok(id) = ShortString::try_new(m.id.as_str()) {
                props = props.with_message_id(id);
            }
            if let Some(c) = m.correlation.as_deref().and_then(|c| ShortString::try_new(c).ok()) {
                props = props.with_correlation_id(c);
            }
            if let Some(ms) = m.expiration_ms {
                props = props.with_expiration(ms.max(1).to_string().into());
            }
            let c = watch
                .bounded(
                    "publish",
                    PROMISE_WAIT,
                    self.ch.basic_publish(
                        self.exchange.as_str().into(),
                        self.routing_key.as_str().into(),
                        BasicPublishOptions { mandatory: true, ..Default::default() },
                        &m.body,
                        props,
                    ),
                )
                .await?;
            confirms.push(c);
        }
        let (exchange, routing_key) = (self.exchange.clone(), self.routing_key.clone());
        Ok(Box::pin(async move {
            let mut out = Vec::with_capacity(confirms.len());
            for c in confirms {
                match watch.bounded("confirm", PROMISE_WAIT, c).await? {
                    Confirmation::Ack(None) | Confirmation::NotRequested => out.push(Published::Confirmed),
                    Confirmation::Ack(Some(returned)) => out.push(Published::Refused(format!(
                        "the broker returned it: {} {} (exchange '{exchange}', routing key '{routing_key}')",
                        returned.reply_code, returned.reply_text
                    ))),
                    Confirmation::Nack(_) => return Err("the broker nacked a publish".into()),
                }
            }
            Ok(out)
        }))
    }
}

pub struct RabbitSource {
    conn: Shared<Connection>,
    consumer: lapin::Consumer,
    queue: String,
    held: std::collections::HashMap<u64, lapin::message::Delivery>,
    next: u64,
}

pub async fn source(
    pool: &Pool<Connection>,
    link: &LinkDef,
    fq: &ForeignQueueDef,
    job: &str,
) -> Result<RabbitSource, String> {
    let conn = shared(pool, link).await?;
    let (queue, consumer) = set_up(&conn, async {
        let ch = conn.create_channel().await.map_err(|e| format!("channel: {e}"))?;
        ch.basic_qos(u16::try_from(link.window).unwrap_or(u16::MAX), BasicQosOptions::default())
            .await
            .map_err(|e| format!("basic.qos: {e}"))?;
        declare(&ch, fq).await?;
        let queue = match fq.domain {
            Domain::Queue => fq.native_name.clone(),
            Domain::Topic => {
                // The job's own durable queue, bound to the exchange: later messages only.
                let q = format!("aqgate.{job}");
                ch.queue_declare(q.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default())
                    .await
                    .map_err(|e| format!("declaring queue {q}: {e}"))?;
                ch.queue_bind(
                    q.as_str().into(),
                    fq.native_name.as_str().into(),
                    fq.routing_key.clone().unwrap_or_else(|| "#".into()).as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("binding {q}: {e}"))?;
                q
            }
        };
        let consumer = ch
            .basic_consume(
                queue.as_str().into(),
                format!("aqgate-{job}").into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("basic.consume {queue}: {e}"))?;
        Ok((queue, consumer))
    })
    .await?;
    Ok(RabbitSource { conn, consumer, queue, held: Default::default(), next: 0 })
}

/// A JMS property's value as an AMQP field value of its type.
fn amqp_value(v: &JmsValue) -> AMQPValue {
    match v {
        JmsValue::Boolean(b) => AMQPValue::Boolean(*b),
        JmsValue::Byte(n) => AMQPValue::ShortShortInt(*n),
        JmsValue::Short(n) => AMQPValue::ShortInt(*n),
        JmsValue::Int(n) => AMQPValue::LongInt(*n),
        JmsValue::Long(n) => AMQPValue::LongLongInt(*n),
        JmsValue::Float(f) => AMQPValue::Float(*f),
        JmsValue::Double(f) => AMQPValue::Double(*f),
        JmsValue::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
    }
}

/// An AMQP field value as a JMS one: integers by their width (an unsigned one in the next
/// wider type), a timestamp as a `long`; `None` for those JMS has no type for (tables,
/// arrays, byte arrays, decimals, void), which are not carried.
fn jms_value(v: &AMQPValue) -> Option<JmsValue> {
    Some(match v {
        AMQPValue::Boolean(b) => JmsValue::Boolean(*b),
        AMQPValue::ShortShortInt(n) => JmsValue::Byte(*n),
        AMQPValue::ShortShortUInt(n) => JmsValue::Short(i16::from(*n)),
        AMQPValue::ShortInt(n) => JmsValue::Short(*n),
        AMQPValue::ShortUInt(n) => JmsValue::Int(i32::from(*n)),
        AMQPValue::LongInt(n) => JmsValue::Int(*n),
        AMQPValue::LongUInt(n) => JmsValue::Long(i64::from(*n)),
        AMQPValue::LongLongInt(n) => JmsValue::Long(*n),
        AMQPValue::Timestamp(n) => JmsValue::Long(i64::try_from(*n).ok()?),
        AMQPValue::Float(f) => JmsValue::Float(*f),
        AMQPValue::Double(f) => JmsValue::Double(*f),
        AMQPValue::ShortString(s) => JmsValue::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => JmsValue::String(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => return None,
    })
}

/// A JMS message's header fields and user properties on an AMQP message: `type`, `app_id`
/// and `reply_to` (the reply agent's address) in their properties when they fit a short
/// string, else as headers; the others, and the user properties with their AMQP types, as
/// headers.
fn jms_properties(p: &JmsProps, mut props: BasicProperties, headers: &mut FieldTable) -> BasicProperties {
    let f = &p.fields;
    let mut header = |k: &str, v: AMQPValue| {
        headers.insert(ShortString::from(k), v);
    };
    let short = |s: &Option<String>| s.as_deref().and_then(|s| ShortString::try_new(s).ok());
    for (slot, value, name) in [
        (0, &f.jms_type, props::JMS_TYPE),
        (1, &f.appid, props::JMS_APPID),
        (2, &f.reply_to_address, props::JMS_REPLY_TO),
    ] {
        match (short(value), value) {
            (Some(s), _) => {
                props = match slot {
                    0 => props.with_type(s),
                    1 => props.with_app_id(s),
                    _ => props.with_reply_to(s),
                }
            }
            (None, Some(v)) => header(name, AMQPValue::LongString(LongString::from(v.as_str()))),
            (None, None) => {}
        }
    }
    let string = |s: &str| AMQPValue::LongString(LongString::from(s));
    if let Some(v) = &f.groupid {
        header(props::JMS_GROUPID, string(v));
    }
    if let Some(n) = f.group_sequence {
        header(props::JMS_GROUPSEQ, AMQPValue::LongInt(n));
    }
    if let Some(v) = &f.reply_to_name {
        header(props::JMS_REPLY_TO_NAME, string(v));
    }
    if let Some(n) = f.reply_to_protocol {
        header(props::JMS_REPLY_TO_PROTOCOL, AMQPValue::LongInt(n));
    }
    if let Some(v) = &f.userid {
        // Not AMQP's user_id: RabbitMQ refuses a user_id other than the connection's user.
        header(props::JMS_USERID, string(v));
    }
    if let Some(ms) = f.timestamp {
        header(props::JMS_TIMESTAMP, AMQPValue::LongLongInt(ms));
        if let Ok(secs) = u64::try_from(ms / 1000) {
            props = props.with_timestamp(secs);
        }
    }
    for (name, v) in &p.user {
        header(name, amqp_value(v));
    }
    if let Some(t) = p.map_types_header() {
        header(props::MAP_TYPES, string(&t));
    }
    props
}

#[async_trait::async_trait]
impl Source for RabbitSource {
    fn stale(&self) -> bool {
        self.conn.stale()
    }

    fn failed(&self) {
        self.conn.failed();
    }

    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Incoming>, String> {
        let mut out = Vec::new();
        let mut next = match tokio::time::timeout(wait, self.consumer.next()).await {
            Err(_) => return Ok(out),
            Ok(None) => return Err(format!("the consumer of {} was cancelled", self.queue)),
            Ok(Some(d)) => Some(d),
        };
        while let Some(d) = next.take() {
            let d = d.map_err(|e| format!("consume: {e}"))?;
            let p = &d.properties;
            let message_id = p.message_id().as_ref().map(|s| s.as_str().to_string());
            let mut inc = Incoming {
                broker_id: message_id.as_ref().map(|id| format!("{}:{id}", self.queue)),
                redelivered: d.redelivered,
                body: d.data.clone(),
                message_id,
                correlation: p.correlation_id().as_ref().map(|s| s.as_str().to_string()),
                ..Incoming::default()
            };
            let short = |s: &Option<ShortString>| s.as_ref().map(|s| JmsValue::String(s.as_str().to_string()));
            for (name, v) in [
                (props::JMS_TYPE, short(p.kind())),
                (props::JMS_APPID, short(p.app_id())),
                (props::JMS_REPLY_TO, short(p.reply_to())),
            ] {
                if let Some(v) = v {
                    inc.typed_header(name, v);
                }
            }
            if let Some(h) = p.headers() {
                for (k, v) in h {
                    if let Some(v) = jms_value(v) {
                        inc.typed_header(k.as_str(), v);
                    }
                }
            }
            self.next += 1;
            inc.tag = self.next;
            self.held.insert(self.next, d);
            out.push(inc);
            if out.len() >= max {
                break;
            }
            if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(1), self.consumer.next()).await {
                next = Some(d);
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            if let Some(d) = self.held.remove(t) {
                self.conn.watch().bounded("ack", PROMISE_WAIT, d.ack(BasicAckOptions::default())).await?;
            }
        }
        Ok(())
    }

    async fn requeue(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            if let Some(d) = self.held.remove(t) {
                let nack = d.nack(BasicNackOptions { requeue: true, ..Default::default() });
                self.conn.watch().bounded("nack", PROMISE_WAIT, nack).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aq_priorities_map_onto_amqps_range() {
        assert_eq!([-5, 0, 1, 2, 9, 100].map(amqp_priority), [9, 9, 8, 7, 0, 0]);
    }
}
