//! NATS JetStream links (async-nats).
//!
//! - **Outbound, exactly once.** Each message is published with `Nats-Msg-Id` = its AQ
//!   message id, the batch's PubAcks are awaited (pipelined, one round trip per batch), and
//!   only then does the job commit its dequeue. A message sent again after a crash is
//!   recognised by the stream within its duplicate window (the PubAck says `duplicate`);
//!   past the window the job looks for the id in the stream itself (from a minute before
//!   the message first went out, headers only) before it publishes again
//!   ([`Sink::at_broker`]). That look needs a stream that keeps its messages (limits
//!   retention) and lets the job create an ephemeral consumer: on a work-queue or interest
//!   stream, or one whose `max_age` has dropped the message, it cannot tell, and the
//!   message goes again (the stream's window having passed, a second copy).
//! - **Non-persistent.** A job whose `delivery_mode` is `non_persistent` publishes with core
//!   NATS (the same headers, `Nats-Msg-Id` too) and waits only for the client's flush, not
//!   for a PubAck: a stream on the subject stores what it receives, and nothing tells the
//!   job whether it did (at most once).
//! - **Inbound.** A durable pull consumer `aqgate_<job>` (explicit acks, `max_ack_pending`
//!   the link's window). A message is acked (double ack: the server confirms it) only after
//!   the transaction that enqueued it committed, together with the mark `<stream>:<sequence>`
//!   that makes a redelivery (delivered more than once) known.
//! - **JMS properties** are headers of strings: each value's text, with `AQ-Property-Types`
//!   naming the JMS types of those that are not strings (`convert::props`). A value with a
//!   line break cannot be a header: such a message is refused (the exception queue).

use std::time::Duration;

use aqgate_core::clock::Micros;
use aqgate_core::topology::gateway::{ForeignQueueDef, LinkDef};
use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;

use super::convert::props;
use super::convert::{Incoming, Outgoing};
use super::pool::{Pool, Shared};
use super::{Confirming, Published, Sink, Source, credentials};

/// A share of one of the link's clients (`max_connections`; a client multiplexes the jobs'
/// publishes and consumers).
async fn shared(pool: &Pool<async_nats::Client>, link: &LinkDef) -> Result<Shared<async_nats::Client>, String> {
    pool.take(&link.name, link.shared().unwrap_or(1), || connect(link)).await
}

async fn connect(link: &LinkDef) -> Result<async_nats::Client, String> {
    let mut o = async_nats::ConnectOptions::new()
        .name(format!("aqgate {}", link.name))
        .ping_interval(Duration::from_secs(u64::from(link.heartbeat_secs)))
        .connection_timeout(Duration::from_secs(10))
        .request_timeout(Some(Duration::from_secs(10)))
        // The job reconnects (with its own backoff, and reports the link's state).
        .max_reconnects(1);
    if let Some((user, password)) = credentials(link)? {
        o = o.user_and_password(user, password);
    }
    if let Some(ca) = &link.ca_file {
        o = o.add_root_certificates(ca.into()).require_tls(true);
    }
    if let (Some(c), Some(k)) = (&link.cert_file, &link.key_file) {
        o = o.add_client_certificate(c.into(), k.into());
    }
    if link.url.starts_with("tls://") {
        o = o.require_tls(true);
    }
    o.connect(link.url.as_str()).await.map_err(|e| format!("{}: {e}", link.url))
}

async fn stream_of(js: &jetstream::Context, fq: &ForeignQueueDef) -> Result<stream::Stream, String> {
    let name = fq.stream.clone().unwrap_or_default();
    if fq.create {
        js.get_or_create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![fq.native_name.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {name}: {e}"))
    } else {
        js.get_stream(&name).await.map_err(|e| format!("stream {name}: {e}"))
    }
}

pub struct NatsSink {
    client: Shared<async_nats::Client>,
    js: jetstream::Context,
    /// The server's largest message.
    max_payload: usize,
    stream: stream::Stream,
    subject: String,
    window: Duration,
}

pub async fn sink(pool: &Pool<async_nats::Client>, link: &LinkDef, fq: &ForeignQueueDef) -> Result<NatsSink, String> {
    let client = shared(pool, link).await?;
    let max_payload = client.server_info().max_payload;
    let js = jetstream::new((*client).clone());
    let mut stream = stream_of(&js, fq).await?;
    let window = stream.info().await.map_err(|e| format!("stream info: {e}"))?.config.duplicate_window;
    Ok(NatsSink { client, js, max_payload, stream, subject: fq.native_name.clone(), window })
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    fn stale(&self) -> bool {
        self.client.stale()
    }

    fn failed(&self) {
        self.client.failed();
    }

    async fn publish(&mut self, batch: &[Outgoing]) -> Result<Confirming, String> {
        let mut acks = Vec::with_capacity(batch.len());
        let mut out: Vec<Option<Published>> = Vec::with_capacity(batch.len());
        let mut core = false;
        for m in batch {
            // Headers count too: leave them a kilobyte.
            if self.max_payload > 0 && m.body.len() + 1024 > self.max_payload {
                out.push(Some(Published::Refused(format!(
                    "{} bytes, more than the server takes (max_payload {})",
                    m.body.len(),
                    self.max_payload
                ))));
                continue;
            }
            // A JMS property is a header here: one a NATS header cannot hold (a line break
            // in its value) would be lost, so the message does not go.
            let jms = m.props.string_headers();
            if let Some((k, _)) = jms.iter().find(|(_, v)| v.contains(['\r', '\n'])) {
                out.push(Some(Published::Refused(format!(
                    "JMS property {} holds a line break, which a NATS header cannot carry",
                    props::shown(k)
                ))));
                continue;
            }
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", m.id.as_str());
            h.insert("Content-Type", m.content_type);
            // A header line ends at CR or LF: a value holding one is not sent (it could
            // otherwise add headers of its own).
            for (k, v) in m.headers() {
                if !v.contains(['\r', '\n']) {
                    h.insert(k, v.as_str());
                }
            }
            for (k, v) in &jms {
                // Names are checked (ASCII letters, digits, `_ - . $`) and values free of
                // line breaks; the fallible forms all the same, as the others panic.
                if let (Ok(k), Ok(v)) = (k.parse::<async_nats::HeaderName>(), v.parse::<async_nats::HeaderValue>()) {
                    h.insert(k, v);
                }
            }
            let body = bytes::Bytes::from(m.body.clone());
            if !m.mode.persistent {
                // NON_PERSISTENT: core NATS, no PubAck awaited (flushed below).
                self.js
                    .client()
                    .publish_with_headers(self.subject.clone(), h, body)
                    .await
                    .map_err(|e| format!("publish to {}: {e}", self.subject))?;
                core = true;
                out.push(Some(Published::Confirmed));
                continue;
            }
            out.push(None);
            let ack = self
                .js
                .publish_with_headers(self.subject.clone(), h, body)
                .await
                .map_err(|e| format!("publish to {}: {e}", self.subject))?;
            acks.push(ack);
        }
        if core {
            // Written to the server (not confirmed by the stream).
            self.js.client().flush().await.map_err(|e| format!("flush to {}: {e}", self.subject))?;
        }
        let subject = self.subject.clone();
        Ok(Box::pin(async move {
            let mut confirmed = Vec::with_capacity(acks.len());
            for a in acks {
                // A PubAck (duplicate or not) says the stream holds the message.
                match a.await {
                    Ok(_) => confirmed.push(Published::Confirmed),
                    Err(e) => return Err(format!("PubAck from {subject}: {e}")),
                }
            }
            let mut confirmed = confirmed.into_iter();
            Ok(out.into_iter().map(|o| o.or_else(|| confirmed.next()).unwrap_or(Published::Confirmed)).collect())
        }))
    }

    async fn at_broker(&mut self, id: &str, since: Micros, now: Micros) -> Result<Option<bool>, String> {
        let window = i64::try_from(self.window.as_micros()).unwrap_or(i64::MAX);
        if now.saturating_sub(since) < window.saturating_sub(5_000_000) {
            // The stream still remembers the id: publishing again is safe.
            return Ok(None);
        }
        // From a minute before the first publish (the server's clock may differ from
        // ours), headers only.
        let start = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(since - 60_000_000) * 1000)
            .map_err(|e| format!("time: {e}"))?;
        let c = self
            .stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time: start },
                ack_policy: consumer::AckPolicy::None,
                filter_subject: self.subject.clone(),
                headers_only: true,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("looking for message {id}: {e}"))?;
        loop {
            let mut batch = c
                .fetch()
                .max_messages(500)
                .expires(Duration::from_secs(2))
                .messages()
                .await
                .map_err(|e| format!("looking for message {id}: {e}"))?;
            let mut seen = 0;
            let mut pending = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(|e| format!("looking for message {id}: {e}"))?;
                seen += 1;
                if m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).is_some_and(|v| v.as_str() == id) {
                    return Ok(Some(true));
                }
                pending = m.info().map(|i| i.pending).unwrap_or(0);
            }
            if seen == 0 || pending == 0 {
                return Ok(Some(false));
            }
        }
    }
}

pub struct NatsSource {
    client: Shared<async_nats::Client>,
    messages: consumer::pull::Stream,
    stream_name: String,
    held: std::collections::HashMap<u64, jetstream::Message>,
    next: u64,
}

pub async fn source(
    pool: &Pool<async_nats::Client>,
    link: &LinkDef,
    fq: &ForeignQueueDef,
    job: &str,
) -> Result<NatsSource, String> {
    let client = shared(pool, link).await?;
    let js = jetstream::new((*client).clone());
    let stream = stream_of(&js, fq).await?;
    let durable = format!("aqgate_{job}");
    let c: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &durable,
            consumer::pull::Config {
                durable_name: Some(durable.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(60),
                max_ack_pending: i64::from(link.window),
                filter_subject: fq.native_name.clone(),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("consumer {durable}: {e}"))?;
    let messages = c
        .stream()
        .max_messages_per_batch(link.window.min(1000) as usize)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| format!("consumer {durable}: {e}"))?;
    Ok(NatsSource {
        client,
        messages,
        stream_name: fq.stream.clone().unwrap_or_default(),
        held: Default::default(),
        next: 0,
    })
}

#[async_trait::async_trait]
impl Source for NatsSource {
    fn stale(&self) -> bool {
        self.client.stale()
    }

    fn failed(&self) {
        self.client.failed();
    }

    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Incoming>, String> {
        let mut out = Vec::new();
        let first = tokio::time::timeout(wait, self.messages.next()).await;
        let mut next = match first {
            Err(_) => return Ok(out),
            Ok(None) => return Err("the consumer's stream ended".into()),
            Ok(Some(m)) => Some(m),
        };
        while let Some(m) = next.take() {
            let m = m.map_err(|e| format!("fetch: {e}"))?;
            let info = m.info().map_err(|e| format!("message info: {e}"))?;
            let mut inc = Incoming {
                broker_id: Some(format!("{}:{}", self.stream_name, info.stream_sequence)),
                redelivered: info.delivered > 1,
                body: m.payload.to_vec(),
                ..Incoming::default()
            };
            if let Some(h) = &m.headers {
                for (k, vs) in h.iter() {
                    if let Some(v) = vs.first() {
                        inc.header(k.as_ref(), v.as_str());
                    }
                }
                inc.message_id = h.get("Nats-Msg-Id").map(|v| v.as_str().to_string());
            }
            self.next += 1;
            inc.tag = self.next;
            self.held.insert(self.next, m);
            out.push(inc);
            if out.len() >= max {
                break;
            }
            // What the consumer has buffered already, without waiting.
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(1), self.messages.next()).await {
                next = Some(m);
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            if let Some(m) = self.held.remove(t) {
                m.double_ack().await.map_err(|e| format!("ack: {e}"))?;
            }
        }
        Ok(())
    }

    async fn requeue(&mut self, tags: &[u64]) -> Result<(), String> {
        for t in tags {
            if let Some(m) = self.held.remove(t) {
                m.ack_with(jetstream::AckKind::Nak(None)).await.map_err(|e| format!("nak: {e}"))?;
            }
        }
        Ok(())
    }
}

/// Ends what an inbound job keeps at the server: its durable consumer `aqgate_<job>`
/// (with its acknowledgement state). `Ok(None)` when there was none.
pub async fn remove(link: &LinkDef, fq: &ForeignQueueDef, job: &str) -> Result<Option<String>, String> {
    let js = jetstream::new(connect(link).await?);
    let name = fq.stream.clone().unwrap_or_default();
    let stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(e) if e.to_string().contains("not found") => {
            return Ok(None);
        }
        Err(e) => return Err(format!("stream {name}: {e}")),
    };
    let durable = format!("aqgate_{job}");
    match stream.delete_consumer(&durable).await {
        Ok(_) => Ok(Some(format!("consumer {durable} on stream {name}"))),
        Err(e) if e.to_string().contains("not found") => Ok(None),
        Err(e) => Err(format!("deleting consumer {durable}: {e}")),
    }
}
