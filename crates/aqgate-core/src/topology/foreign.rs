//! The Messaging Gateway's links and foreign queues as the topology declares them, and the
//! route a gateway job carries (see `super::gateway` for the jobs and their resolution):
//! what both the jobs' resolution and the propagation jobs that carry a route name.

use serde::{Deserialize, Serialize};

use crate::payload::PayloadKind;

/// Which broker a link reaches, and through which client.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// AMQP 0-9-1 (lapin): publisher confirms, mandatory, persistent.
    Rabbitmq,
    /// NATS JetStream (async-nats).
    Nats,
    /// MQTT v5 (rumqttc).
    Mqtt,
}

impl LinkKind {
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Rabbitmq => "rabbitmq",
            LinkKind::Nats => "nats",
            LinkKind::Mqtt => "mqtt",
        }
    }
}

/// A connection to a broker (Messaging Gateway's messaging system link).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkDef {
    pub name: String,
    pub kind: LinkKind,
    /// `amqp://host:5672/%2f` (`amqps://` for TLS), `nats://host:4222` (`tls://`),
    /// `mqtt://host:1883` (`mqtts://`). No credentials in the URL.
    pub url: String,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    #[serde(default)]
    pub password_file: Option<String>,
    /// PEM CA certificates the broker's certificate is verified against.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// A PEM client certificate and its key, for brokers that ask for one.
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
    /// Seconds between heartbeats (AMQP heartbeat, NATS ping, MQTT keep-alive).
    #[serde(default = "default_heartbeat")]
    pub heartbeat_secs: u16,
    /// The first wait before reconnecting, in milliseconds; it doubles up to
    /// `reconnect_max_ms`.
    #[serde(default = "default_reconnect")]
    pub reconnect_backoff_ms: u64,
    #[serde(default = "default_reconnect_max")]
    pub reconnect_max_ms: u64,
    /// Messages published and not yet confirmed at once, per job (the in-flight window);
    /// inbound, the broker's prefetch (RabbitMQ), max_ack_pending (JetStream), receive
    /// maximum (MQTT).
    #[serde(default = "default_window")]
    pub window: u32,
    /// Inbound: the largest message body a job takes into its destination, in bytes; a
    /// larger one goes to the job's exception queue. `None`: the process's default
    /// (`--broker-max-message-bytes`). MQTT announces twice this (and 64 KiB for the topic
    /// and properties) as its Maximum Packet Size: see [`packet_limit`].
    #[serde(default)]
    pub max_message_bytes: Option<u64>,
    /// How many connections to the broker the link's jobs share (Messaging Gateway's
    /// `max_connections`; 1 by default): RabbitMQ jobs each take a channel of one, NATS jobs
    /// share its client (which multiplexes). Not for MQTT links, where a connection is a
    /// client id and its session: each MQTT job keeps its own. See [`LinkDef::shared`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

/// The accepted range of `max_connections`.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<u32> = 1..=64;

impl LinkDef {
    /// How many connections the link's jobs share (`None`: each job has its own, MQTT).
    pub fn shared(&self) -> Option<u32> {
        match self.kind {
            LinkKind::Mqtt => None,
            LinkKind::Rabbitmq | LinkKind::Nats => Some(self.max_connections.unwrap_or(1)),
        }
    }
}

/// The accepted range of `max_message_bytes`: 1 KiB to 128 MiB.
pub const MAX_MESSAGE_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=(128 << 20);

/// The largest packet an inbound MQTT job announces (Maximum Packet Size) and its client
/// reads, for bodies of up to `max_message_bytes`: twice that, and 64 KiB for the topic and
/// properties, at most MQTT's own limit. What is bigger the broker does not send (MQTT v5
/// discards it); what is over `max_message_bytes` but fits goes to the exception queue.
pub fn packet_limit(max_message_bytes: u64) -> u32 {
    const MQTT_MAX: u64 = 268_435_455;
    u32::try_from(max_message_bytes.saturating_mul(2).saturating_add(64 << 10).min(MQTT_MAX)).unwrap_or(u32::MAX)
}

fn default_heartbeat() -> u16 {
    30
}
fn default_reconnect() -> u64 {
    1000
}
fn default_reconnect_max() -> u64 {
    30_000
}
fn default_window() -> u32 {
    256
}

/// Queue or topic (Messaging Gateway's domain).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    #[default]
    Queue,
    Topic,
}

/// A queue or topic of a link's broker.
///
/// - RabbitMQ: domain `queue`: `native_name` is the queue (published through the default
///   exchange); domain `topic`: `native_name` is the exchange and `routing_key` the key
///   (an inbound job binds a queue of its own, `aqgate.<job>`, to it).
/// - NATS: `native_name` is the subject and `stream` the JetStream stream holding it
///   (an inbound job uses a durable consumer `aqgate_<job>`).
/// - MQTT: `native_name` is the topic (a filter, inbound) and `qos` 1 or 2.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ForeignQueueDef {
    pub name: String,
    pub link: String,
    pub native_name: String,
    #[serde(default)]
    pub domain: Domain,
    #[serde(default)]
    pub routing_key: Option<String>,
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// Declare the native object (queue, exchange, stream) when the job starts; otherwise
    /// it must exist.
    #[serde(default)]
    pub create: bool,
}

fn default_qos() -> u8 {
    1
}

/// Which way a job moves messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Direction {
    Outbound,
    Inbound,
}

/// What a gateway job needs beyond a propagation job: its link and foreign queue, and (for
/// an inbound job) a foreign exception queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayRoute {
    pub direction: Direction,
    pub link: LinkDef,
    pub foreign: ForeignQueueDef,
    /// The type broker bodies are converted from and to: the AQ queue's payload type, or
    /// with a transformation its target (outbound: the dequeue applies it) or its source
    /// (inbound: the enqueue applies it).
    pub payload: PayloadKind,
    /// Inbound: a foreign queue of the same link for messages that cannot be converted.
    pub foreign_exception: Option<ForeignQueueDef>,
    /// Inbound: the transformation applied at the enqueue.
    pub inbound_transformation: Option<String>,
    /// The job's options (Messaging Gateway's job options).
    pub options: JobOptions,
    /// Outbound: how many batches may be published and not yet committed at once (1: one
    /// batch at a time); inbound: 1.
    pub batches_in_flight: u32,
}

/// An outbound job's `batches_in_flight`: each batch holds up to `batch_size` messages in
/// memory until it commits, so the bound is small.
pub const BATCHES_IN_FLIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=16;

/// An outbound job's `batches_in_flight` when the topology gives none.
pub const DEFAULT_BATCHES_IN_FLIGHT: u32 = 4;

/// A job's `batches_in_flight` as given (`None`: the default), checked against its
/// direction and [`BATCHES_IN_FLIGHT_RANGE`]; a problem goes to `errors` under `key`.
pub(super) fn batches_in_flight(given: Option<u32>, direction: Direction, key: &str, errors: &mut Vec<String>) -> u32 {
    match given {
        _ if direction == Direction::Inbound => {
            if given.is_some() {
                errors.push(format!("{key}.batches_in_flight: an outbound job's option (batches published ahead)"));
            }
            1
        }
        None => DEFAULT_BATCHES_IN_FLIGHT,
        Some(n) if BATCHES_IN_FLIGHT_RANGE.contains(&n) => n,
        Some(_) => {
            errors.push(format!(
                "{key}.batches_in_flight: {} to {}",
                BATCHES_IN_FLIGHT_RANGE.start(),
                BATCHES_IN_FLIGHT_RANGE.end()
            ));
            DEFAULT_BATCHES_IN_FLIGHT
        }
    }
}

/// JMS_DeliveryMode: how an outbound job's messages are published.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliveryMode {
    /// The source message's own mode: a job moves persistent AQ messages only (buffered
    /// ones stay in memory), so this is `Persistent`.
    #[default]
    PreserveMsg,
    /// Kept by the broker across its restart, and confirmed: RabbitMQ delivery mode 2,
    /// NATS JetStream with its PubAck, MQTT at the foreign queue's QoS (1 or 2).
    Persistent,
    /// Not kept, nor confirmed as kept: RabbitMQ delivery mode 1, a core NATS publish
    /// without a PubAck, MQTT QoS 0. The job gives up its no-loss guarantee.
    NonPersistent,
}

impl DeliveryMode {
    /// The mode a `delivery_mode` value names (any case, `-` or `_`), if any.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_uppercase().replace('-', "_").as_str() {
            "PRESERVE_MSG" => Some(Self::PreserveMsg),
            "PERSISTENT" => Some(Self::Persistent),
            "NON_PERSISTENT" => Some(Self::NonPersistent),
            _ => None,
        }
    }

    /// Whether messages go persistent.
    pub fn persistent(self) -> bool {
        self != Self::NonPersistent
    }
}

/// A gateway job's options, as the topology sets them (`admin jobs --json` shows them).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct JobOptions {
    /// Outbound: JMS_DeliveryMode.
    pub delivery_mode: DeliveryMode,
    /// AQ_MsgProperties: outbound, whether the `AQ-*` headers (message id, priority,
    /// correlation, expiration, queue) are written; inbound, whether they are read into the
    /// AQ message's properties.
    pub aq_msg_properties: bool,
    /// Inbound, JMS_NoLocal: messages the gateway's own outbound jobs published over the
    /// same link (marked `x-aqgate-link`) are not taken.
    pub no_local: bool,
}

impl JobOptions {
    /// As `admin` prints them: `delivery_mode=PERSISTENT aq_msg_properties=TRUE ...`
    /// (outbound: no no_local; inbound: no delivery_mode).
    pub fn describe(&self, direction: Direction) -> String {
        let flag = |b: bool| if b { "TRUE" } else { "FALSE" };
        let mode = match self.delivery_mode {
            DeliveryMode::PreserveMsg => "PRESERVE_MSG",
            DeliveryMode::Persistent => "PERSISTENT",
            DeliveryMode::NonPersistent => "NON_PERSISTENT",
        };
        match direction {
            Direction::Outbound => format!("delivery_mode={mode} aq_msg_properties={}", flag(self.aq_msg_properties)),
            Direction::Inbound => {
                format!("aq_msg_properties={} no_local={}", flag(self.aq_msg_properties), flag(self.no_local))
            }
        }
    }
}

impl Default for JobOptions {
    fn default() -> Self {
        Self { delivery_mode: DeliveryMode::default(), aq_msg_properties: true, no_local: false }
    }
}

impl GatewayRoute {
    /// What the job promises per message, as `admin jobs` states it.
    pub fn guarantee(&self) -> &'static str {
        if self.direction == Direction::Outbound && !self.options.delivery_mode.persistent() {
            return match self.link.kind {
                LinkKind::Rabbitmq => "none: NON_PERSISTENT (delivery mode 1, confirmed, lost if RabbitMQ restarts)",
                LinkKind::Nats => "none: NON_PERSISTENT (core NATS publish, no PubAck: at most once)",
                LinkKind::Mqtt => "none: NON_PERSISTENT (QoS 0: at most once)",
            };
        }
        match (self.direction, self.link.kind, self.foreign.qos) {
            (Direction::Outbound, LinkKind::Nats, _) => "exactly once (Nats-Msg-Id, PubAck before commit)",
            (Direction::Outbound, LinkKind::Rabbitmq, _) => "at least once (confirms; in-doubt duplicates marked)",
            (Direction::Outbound, LinkKind::Mqtt, 2) => "at least once (QoS 2; in-doubt duplicates marked)",
            (Direction::Outbound, LinkKind::Mqtt, _) => "at least once (QoS 1; in-doubt duplicates marked)",
            (Direction::Inbound, LinkKind::Nats, _) => "exactly once (ack after commit, stream sequence dedup)",
            (Direction::Inbound, LinkKind::Rabbitmq, _) => "exactly once with message_id (ack after commit, dedup)",
            (Direction::Inbound, LinkKind::Mqtt, _) => "exactly once with aq-message-id (ack after commit, dedup)",
        }
    }
}
