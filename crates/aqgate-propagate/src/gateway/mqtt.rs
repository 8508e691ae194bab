//! MQTT v5 links (rumqttc).
//!
//! - **Outbound, at least once** (QoS 1, or 2 as the foreign queue says). Every message
//!   carries its AQ message id as the user property `aq-message-id` (and the `AQ-*` headers
//!   as user properties, the content type, the correlation as correlation data, the
//!   expiration as the message expiry interval); the batch's PUBACKs (PUBCOMPs at QoS 2)
//!   are awaited before the job commits its dequeue. rumqttc does not return the packet id
//!   a publish gets: the event loop reports each outgoing PUBLISH with its id in the order
//!   the publishes were made, so the task polling it matches them by that order (`Book`),
//!   for every batch in flight on the connection (the job publishes the next batch while
//!   the broker acknowledges the last: a broker that delays small writes, as Mosquitto
//!   does by default, sends its remaining PUBACKs once the client's next packet acks what
//!   it has, instead of at the client's delayed ACK 40 ms on). The packet state is
//!   not kept in the store, so QoS 2 here is at least once too: a message in doubt after a
//!   crash is published again, marked `x-aqgate-redelivered`.
//! - **Non-persistent.** A job whose `delivery_mode` is `non_persistent` publishes at QoS 0:
//!   nothing acknowledges it, the job waits only for the client to write it (at most once;
//!   a broker does not queue QoS 0 messages for a disconnected persistent session).
//! - **`aq_msg_properties` off:** no `aq-*` user properties; the AQ message id goes as
//!   `message-id`, which an inbound job reads as the broker's message id (its mark).
//! - **Inbound.** A persistent session (client id `aqgate-<job>`, clean start off, a
//!   session expiry of a week) subscribed to the topic filter, with manual acks and a
//!   receive maximum of the link's window: the broker keeps what arrives while aqgate is
//!   down. A message is acked after the local commit; its mark is `aq-message-id` (or the
//!   `message-id` user property), so a redelivery (DUP) already enqueued is acked without a
//!   second enqueue. Without such a property a message is at least once. MQTT has no
//!   negative ack: a batch given back is redelivered by reconnecting.
//! - **JMS properties** are user properties of strings, with `aq-property-types` naming the
//!   JMS types of those that are not strings; the reply agent's address is the response
//!   topic (`convert::props`).
//! - **Sizes, inbound.** The job announces a Maximum Packet Size (CONNECT) of twice the
//!   link's `max_message_bytes` plus 64 KiB (`packet_limit`), and its client reads packets
//!   up to that size (rumqttc's own default is 10 KiB, never announced: a bigger message
//!   broke the connection at every delivery). A broker keeping to MQTT v5 does not send a
//!   bigger one: it discards it as if delivered (Mosquitto logs it). A body over
//!   `max_message_bytes` that fits goes to the exception queue. Should a broker send a
//!   packet over the limit all the same, the client cannot read it: the job is FAILED with
//!   the reason (`Source::unreadable`) and reconnects with the link's backoff.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aqgate_core::topology::gateway::{ForeignQueueDef, LinkDef, packet_limit};
use rumqttc::Outgoing as Out;
use rumqttc::v5::mqttbytes::Error as MqttError;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PubRecReason, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};
use rustls_pki_types::pem::PemObject;
use tokio::sync::{mpsc, oneshot};

use super::convert::props;
use super::convert::{Incoming, Outgoing};
use super::{Confirming, Published, Sink, Source, credentials};

fn qos(q: u8) -> QoS {
    if q >= 2 { QoS::ExactlyOnce } else { QoS::AtLeastOnce }
}

fn options(link: &LinkDef, client_id: &str) -> Result<MqttOptions, String> {
    let (tls, rest) = match link.url.split_once("://") {
        Some(("mqtts", r)) => (true, r),
        Some((_, r)) => (false, r),
        None => (false, link.url.as_str()),
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse::<u16>().map_err(|_| format!("{}: bad port", link.url))?),
        None => (hostport.to_string(), if tls { 8883 } else { 1883 }),
    };
    let mut o = MqttOptions::new(client_id, host.trim_start_matches('[').trim_end_matches(']'), port);
    o.set_keep_alive(Duration::from_secs(u64::from(link.heartbeat_secs.max(5))));
    o.set_connection_timeout(10);
    if let Some((user, password)) = credentials(link)? {
        o.set_credentials(user, password);
    }
    if tls {
        o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(tls_config(
            link,
        )?))));
    }
    Ok(o)
}

fn tls_config(link: &LinkDef) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(f) = &link.ca_file {
        let pem = std::fs::read(f).map_err(|e| format!("{f}: {e}"))?;
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.map_err(|e| format!("{f}: {e}"))?).map_err(|e| format!("{f}: {e}"))?;
        }
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    match (&link.cert_file, &link.key_file) {
        (Some(c), Some(k)) => {
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(c)
                .map_err(|e| format!("{c}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{c}: {e}"))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(k).map_err(|e| format!("{k}: {e}"))?;
            b.with_client_auth_cert(certs, key).map_err(|e| format!("client certificate: {e}"))
        }
        _ => Ok(b.with_no_client_auth()),
    }
}

/// What ends a connection: why, and whether it is a packet over the limit the client reads.
type Ended = (String, bool);

/// Polls `el` until it fails, handing on the events the link cares about.
fn drive(mut el: EventLoop, tx: mpsc::UnboundedSender<Result<Event, Ended>>) {
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(e) => {
                    if tx.send(Ok(e)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(ended(&e)));
                    return;
                }
            }
        }
    });
}

/// Why connection error `e` ended the connection; `true` when it is a packet over the
/// client's limit (which the broker sends again at every reconnect).
fn ended(e: &ConnectionError) -> Ended {
    match e {
        ConnectionError::MqttState(StateError::Deserialization(MqttError::PayloadSizeLimitExceeded {
            pkt_size,
            max,
        })) => (
            format!(
                "the broker sent a packet of {pkt_size} bytes, over the Maximum Packet Size of {max} the job \
                 announced (from max_message_bytes): it does not keep to it, and the client cannot read the \
                 message; raise max_message_bytes or take the message off the broker"
            ),
            true,
        ),
        other => (other.to_string(), false),
    }
}

/// Waits for the CONNACK (the first event that says the session is up).
async fn connected(rx: &mut mpsc::UnboundedReceiver<Result<Event, Ended>>) -> Result<(), String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
            Err(_) => return Err("no CONNACK within 15 s".into()),
            Ok(None) => return Err("the connection ended".into()),
            Ok(Some(Err((e, _)))) => return Err(e),
            Ok(Some(Ok(Event::Incoming(Packet::ConnAck(_))))) => return Ok(()),
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// What an outbound job's connection waits for: the publishes made and not yet seen going
/// out, and the packets out awaiting their acknowledgement, by batch.
#[derive(Default)]
struct Book {
    /// (batch, index, persistent: an acknowledgement comes): each publish made, until the
    /// event loop reports it written with its packet id, in the order the publishes were made.
    order: VecDeque<(u64, usize, bool)>,
    /// Packet ids written and not yet acknowledged: (batch, index).
    ids: HashMap<u16, (u64, usize)>,
    batches: HashMap<u64, Waiting>,
    /// Why the connection ended, once it has.
    ended: Option<String>,
}

/// A batch's word from the broker so far, and who waits for all of it.
struct Waiting {
    out: Vec<Option<Published>>,
    left: usize,
    done: Option<oneshot::Sender<Result<Vec<Published>, String>>>,
}

impl Book {
    /// Message `i` of batch `b` fared as `p`.
    fn settle(&mut self, (b, i): (u64, usize), p: Published) {
        let Some(w) = self.batches.get_mut(&b) else { return };
        if w.out[i].is_none() {
            w.out[i] = Some(p);
            w.left -= 1;
        }
        if w.left == 0
            && let Some(w) = self.batches.remove(&b)
            && let Some(tx) = w.done
        {
            let _ = tx.send(Ok(w.out.into_iter().map(|p| p.unwrap_or(Published::Confirmed)).collect()));
        }
    }

    /// The batch of message `at` fails as a whole (the link's limits of the moment).
    fn fail(&mut self, at: (u64, usize), why: String) {
        if let Some(w) = self.batches.remove(&at.0)
            && let Some(tx) = w.done
        {
            let _ = tx.send(Err(why));
        }
    }

    /// The connection ended: every batch waiting fails with `why`.
    fn end(&mut self, why: String) {
        for (_, w) in self.batches.drain() {
            if let Some(tx) = w.done {
                let _ = tx.send(Err(why.clone()));
            }
        }
        self.order.clear();
        self.ids.clear();
        self.ended = Some(why);
    }
}

/// Polls an outbound job's event loop until it fails or the job lets go of the client,
/// matching each outgoing PUBLISH (reported in the order the publishes were made) to its
/// message and each acknowledgement to its packet id, in `book`. The CONNACK, or why the
/// connection ended first, goes to `up`.
fn drive_sink(mut el: EventLoop, qos: QoS, book: Arc<Mutex<Book>>, up: oneshot::Sender<Result<(), String>>) {
    tokio::spawn(async move {
        let mut up = Some(up);
        loop {
            let e = match el.poll().await {
                Ok(e) => e,
                Err(e) => {
                    let why = ended(&e).0;
                    if let Some(up) = up.take() {
                        let _ = up.send(Err(why.clone()));
                    }
                    lock(&book).end(why);
                    return;
                }
            };
            let mut book = lock(&book);
            match e {
                Event::Incoming(Packet::ConnAck(_)) => {
                    if let Some(up) = up.take() {
                        let _ = up.send(Ok(()));
                    }
                }
                Event::Outgoing(Out::Publish(pkid)) => match book.order.pop_front() {
                    // QoS 0 (NON_PERSISTENT): no acknowledgement comes; written is all.
                    Some((b, i, false)) => book.settle((b, i), Published::Confirmed),
                    Some((b, i, true)) => {
                        book.ids.insert(pkid, (b, i));
                    }
                    None => {}
                },
                Event::Incoming(Packet::PubAck(a)) if qos == QoS::AtLeastOnce => {
                    let Some(at) = book.ids.remove(&a.pkid) else { continue };
                    match a.reason {
                        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => {
                            book.settle(at, Published::Confirmed);
                        }
                        // The broker's limits of the moment: the batch is tried again later.
                        PubAckReason::QuotaExceeded | PubAckReason::UnspecifiedError => {
                            book.fail(at, format!("the broker answered {:?}", a.reason));
                        }
                        other => book.settle(at, refused(&format!("{other:?}"))),
                    }
                }
                Event::Incoming(Packet::PubRec(r)) if qos == QoS::ExactlyOnce => match r.reason {
                    PubRecReason::Success | PubRecReason::NoMatchingSubscribers => {}
                    PubRecReason::QuotaExceeded | PubRecReason::UnspecifiedError => {
                        if let Some(at) = book.ids.remove(&r.pkid) {
                            book.fail(at, format!("the broker answered {:?}", r.reason));
                        }
                    }
                    other => {
                        if let Some(at) = book.ids.remove(&r.pkid) {
                            book.settle(at, refused(&format!("{other:?}")));
                        }
                    }
                },
                Event::Incoming(Packet::PubComp(c)) if qos == QoS::ExactlyOnce => {
                    if let Some(at) = book.ids.remove(&c.pkid) {
                        book.settle(at, Published::Confirmed);
                    }
                }
                _ => {}
            }
        }
    });
}

fn refused(why: &str) -> Published {
    Published::Refused(format!("the broker refused it: {why}"))
}

fn lock(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub struct MqttSink {
    client: AsyncClient,
    book: Arc<Mutex<Book>>,
    /// Batches published so far on this connection (each one's number in `book`).
    batches: u64,
    topic: String,
    qos: QoS,
}

pub async fn sink(link: &LinkDef, fq: &ForeignQueueDef, job: &str) -> Result<MqttSink, String> {
    let id = format!("aqgate-{job}-out-{}", &aqgate_core::engine::session::random_id()[..8]);
    let mut o = options(link, &id)?;
    o.set_clean_start(true);
    o.set_outgoing_inflight_upper_limit(u16::try_from(link.window).unwrap_or(u16::MAX));
    let (client, el) = AsyncClient::new(o, 1024);
    let book = Arc::new(Mutex::new(Book::default()));
    let (up, connack) = oneshot::channel();
    drive_sink(el, qos(fq.qos), book.clone(), up);
    match tokio::time::timeout(Duration::from_secs(15), connack).await {
        Err(_) => return Err(format!("{}: no CONNACK within 15 s", link.url)),
        Ok(Err(_)) => return Err(format!("{}: the connection ended", link.url)),
        Ok(Ok(Err(e))) => return Err(format!("{}: {e}", link.url)),
        Ok(Ok(Ok(()))) => {}
    }
    Ok(MqttSink { client, book, batches: 0, topic: fq.native_name.clone(), qos: qos(fq.qos) })
}

#[async_trait::async_trait]
impl Sink for MqttSink {
    async fn publish(&mut self, batch: &[Outgoing]) -> Result<Confirming, String> {
        if batch.is_empty() {
            return Ok(Box::pin(async { Ok(Vec::new()) }));
        }
        self.batches += 1;
        let b = self.batches;
        let (done, confirmed) = oneshot::channel();
        {
            let mut book = lock(&self.book);
            if let Some(why) = &book.ended {
                return Err(why.clone());
            }
            let waiting =
                Waiting { out: (0..batch.len()).map(|_| None).collect(), left: batch.len(), done: Some(done) };
            book.batches.insert(b, waiting);
        }
        for (i, m) in batch.iter().enumerate() {
            let mut props = PublishProperties {
                content_type: Some(m.content_type.to_string()),
                correlation_data: m.correlation.clone().map(|c| bytes::Bytes::from(c.into_bytes())),
                message_expiry_interval: m.expiration_ms.map(|ms| u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX)),
                ..Default::default()
            };
            if !m.mode.aq_properties {
                // The id still identifies the message (an inbound job's mark), under
                // MQTT's neutral name, without the AQ-* headers.
                props.user_properties.push(("message-id".into(), m.id.clone()));
            }
            for (k, v) in m.headers() {
                props.user_properties.push((k.to_ascii_lowercase(), v));
            }
            // The reply agent's address is the response topic when it is a topic name.
            let reply = m.props.fields.reply_to_address.as_deref();
            if let Some(r) = reply.filter(|r| !r.contains(['+', '#', '\0'])) {
                props.response_topic = Some(r.to_string());
            }
            for (k, v) in m.props.string_headers() {
                let k = if k.starts_with("AQ-") { k.to_ascii_lowercase() } else { k };
                if !(k == props::JMS_REPLY_TO && props.response_topic.is_some()) {
                    props.user_properties.push((k, v));
                }
            }
            let qos = if m.mode.persistent { self.qos } else { QoS::AtMostOnce };
            // Booked before the request goes to the event loop, which reports it written.
            lock(&self.book).order.push_back((b, i, m.mode.persistent));
            self.client
                .publish_with_properties(self.topic.clone(), qos, false, m.body.clone(), props)
                .await
                .map_err(|e| format!("publish: {e}"))?;
        }
        Ok(Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(30), confirmed).await {
                Err(_) => Err("no acknowledgement within 30 s".into()),
                Ok(Err(_)) => Err("the connection ended".into()),
                Ok(Ok(r)) => r,
            }
        }))
    }
}

pub struct MqttSource {
    client: AsyncClient,
    events: mpsc::UnboundedReceiver<Result<Event, Ended>>,
    held: HashMap<u64, Publish>,
    next: u64,
    spent: bool,
    /// The connection ended on a packet over the client's limit: why.
    unreadable: Option<String>,
}

/// The inbound side of job `job`, for bodies of up to `max_body` bytes (its packet limit
/// announced from it).
pub async fn source(link: &LinkDef, fq: &ForeignQueueDef, job: &str, max_body: u64) -> Result<MqttSource, String> {
    let mut o = options(link, &format!("aqgate-{job}"))?;
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(7 * 24 * 3600));
    o.set_manual_acks(true);
    o.set_receive_maximum(Some(u16::try_from(link.window).unwrap_or(u16::MAX)));
    // Announced in the CONNECT, and the client's own limit on what it reads.
    o.set_max_packet_size(Some(packet_limit(max_body)));
    let (client, el) = AsyncClient::new(o, 1024);
    let (tx, mut events) = mpsc::unbounded_channel();
    drive(el, tx);
    connected(&mut events).await.map_err(|e| format!("{}: {e}", link.url))?;
    client.subscribe(fq.native_name.clone(), qos(fq.qos)).await.map_err(|e| format!("subscribe: {e}"))?;
    Ok(MqttSource { client, events, held: HashMap::new(), next: 0, spent: false, unreadable: None })
}

fn incoming(p: &Publish) -> Incoming {
    let mut inc = Incoming { redelivered: p.dup, body: p.payload.to_vec(), ..Incoming::default() };
    if let Some(props) = &p.properties {
        for (k, v) in &props.user_properties {
            if k.eq_ignore_ascii_case("message-id") {
                inc.message_id.get_or_insert_with(|| v.clone());
            } else {
                inc.header(k, v);
            }
        }
        if inc.correlation.is_none() {
            inc.correlation = props.correlation_data.as_ref().map(|c| String::from_utf8_lossy(c).into_owned());
        }
        if let Some(r) = &props.response_topic
            && inc.jms.fields.reply_to_address.is_none()
        {
            inc.header(props::JMS_REPLY_TO, r);
        }
    }
    // The mark: `message-id`, else `aq-message-id` (whatever the job's aq_msg_properties).
    inc.broker_id = inc.message_id.clone().or_else(|| inc.aq.message_id.clone());
    inc
}

#[async_trait::async_trait]
impl Source for MqttSource {
    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Incoming>, String> {
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        while out.len() < max {
            // The first waits up to `wait`; then only what has arrived already.
            let until = if out.is_empty() { deadline } else { tokio::time::Instant::now() + Duration::from_millis(1) };
            let e = match tokio::time::timeout_at(until, self.events.recv()).await {
                Err(_) => break,
                Ok(None) => return Err("the connection ended".into()),
                Ok(Some(Err((e, over)))) => {
                    if over {
                        self.unreadable = Some(e.clone());
                    }
                    return Err(e);
                }
                Ok(Some(Ok(e))) => e,
            };
            if let Event::Incoming(Packet::Publish(p)) = e {
                let mut inc = incoming(&p);
                self.next += 1;
                inc.tag = self.next;
                self.held.insert(self.next, p);
                out.push(inc);
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            if let Some(p) = self.held.remove(t) {
                self.client.ack(&p).await.map_err(|e| format!("ack: {e}"))?;
            }
        }
        Ok(())
    }

    async fn requeue(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            self.held.remove(t);
        }
        // No negative ack in MQTT: the broker sends unacknowledged messages again when
        // the session reconnects (`spent`).
        let _ = self.client.disconnect().await;
        self.spent = true;
        Ok(())
    }

    fn spent(&self) -> bool {
        self.spent
    }

    fn unreadable(&self) -> Option<String> {
        self.unreadable.clone()
    }
}

/// Ends what an inbound job keeps at the broker: its persistent session `aqgate-<job>`
/// (subscription and queued messages), by taking it up with a session expiry of nought
/// and disconnecting: the broker drops it with the connection. `Ok(Some)` when there was one.
pub async fn remove(link: &LinkDef, job: &str) -> Result<Option<String>, String> {
    let id = format!("aqgate-{job}");
    let mut o = options(link, &id)?;
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(0));
    let (client, el) = AsyncClient::new(o, 16);
    let (tx, mut events) = mpsc::unbounded_channel();
    drive(el, tx);
    let present = loop {
        match tokio::time::timeout(Duration::from_secs(15), events.recv()).await {
            Err(_) => return Err(format!("{}: no CONNACK within 15 s", link.url)),
            Ok(None) => return Err(format!("{}: the connection ended", link.url)),
            Ok(Some(Err((e, _)))) => return Err(format!("{}: {e}", link.url)),
            Ok(Some(Ok(Event::Incoming(Packet::ConnAck(a))))) => break a.session_present,
            Ok(Some(Ok(_))) => {}
        }
    };
    client.disconnect().await.map_err(|e| format!("disconnect: {e}"))?;
    // The DISCONNECT goes out before the connection closes.
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(5), events.recv()).await {}
    Ok(present.then(|| format!("session {id}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(url: &str) -> LinkDef {
        toml::from_str(&format!("name = \"m\"\nkind = \"mqtt\"\nurl = \"{url}\"")).expect("link")
    }

    #[test]
    fn urls_give_host_and_port() {
        let o = options(&link("mqtt://127.0.0.1:1884"), "c").expect("options");
        assert_eq!(o.broker_address(), ("127.0.0.1".to_string(), 1884));
        let o = options(&link("mqtt://broker.example"), "c").expect("options");
        assert_eq!(o.broker_address().1, 1883);
        assert!(options(&link("mqtt://h:x"), "c").is_err());
    }
}
