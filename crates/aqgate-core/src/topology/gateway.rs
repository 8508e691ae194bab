//! The Messaging Gateway as the topology declares it (`[gateway]`): links to other brokers
//! (`[[gateway.links]]`: RabbitMQ, NATS JetStream, MQTT), the queues and topics there that
//! jobs use (`[[gateway.foreign_queues]]`, named `NAME@LINK` in a job), and the jobs
//! (`[[gateway.jobs]]`) that move messages between an AQ queue and a foreign queue.
//!
//! A job is outbound when its destination is a foreign queue (AQ → broker) and inbound
//! when its source is one (broker → AQ). Gateway jobs are propagation jobs
//! ([`super::propagation::PropagationInfo`] with a [`GatewayRoute`]): they run under a
//! lease, show in `admin jobs` and in `/metrics` like the others, and act as their own agent
//! `PROP$<NAME>` (whose database users are the schemas of the AQ queues they use).
//!
//! - Outbound from a multi-consumer queue: the job is a subscriber (`rule` its rule), so it
//!   moves messages published after it exists; from a single-consumer queue it takes every
//!   message (matching `rule`). Its exception queue is an AQ queue of the source's type.
//! - Inbound: the destination is an AQ queue; the exception queue is a local RAW queue (the
//!   broker's bytes kept as they came) or a foreign queue on the same link (`NAME@LINK`).
//! - Credentials are never in the topology: `password_env` or `password_file`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::foreign::*;
use super::propagation::schema;
use super::{AgentInfo, QueueInfo, Subscriber, canon};
use crate::payload::PayloadKind;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayDef {
    #[serde(default)]
    pub links: Vec<LinkDef>,
    #[serde(default)]
    pub foreign_queues: Vec<ForeignQueueDef>,
    #[serde(default)]
    pub jobs: Vec<GatewayJobDef>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayJobDef {
    pub name: String,
    /// An AQ queue `SCHEMA.QUEUE`, or a foreign queue `NAME@LINK` (inbound).
    pub source: String,
    /// A foreign queue `NAME@LINK` (outbound), or an AQ queue.
    pub destination: String,
    /// Outbound: a condition a message must meet (on a multi-consumer source, the job's
    /// subscriber rule).
    #[serde(default)]
    pub rule: Option<String>,
    /// Outbound: a transformation applied at the dequeue (to an object type whose XML is
    /// sent); inbound: applied at the enqueue, from the type the body is read as.
    #[serde(default)]
    pub transformation: Option<String>,
    /// Messages per local transaction (MsgBatchSize).
    #[serde(default = "default_batch")]
    pub batch_size: u32,
    /// Outbound: batches published ahead of their commit, landing in order (see
    /// [`BATCHES_IN_FLIGHT_RANGE`]); 1 is one batch at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_in_flight: Option<u32>,
    /// Outbound: the AQ message id is the broker message's id (always sent as a header
    /// too); inbound: the broker's message id becomes the AQ message's correlation.
    #[serde(default)]
    pub preserve_message_id: bool,
    /// Where a message that cannot be converted (or that the destination refuses for good)
    /// goes, with the reason: outbound an AQ queue of the source's type, inbound a local RAW
    /// queue or a foreign queue `NAME@LINK` on the same link. Without one, the job is
    /// FAILED on that message and says which.
    #[serde(default)]
    pub exception_queue: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_backoff")]
    pub retry_backoff_ms: u64,
    /// Outbound (JMS_DeliveryMode): `persistent`, `non_persistent` or `preserve_msg` (the
    /// default: persistent, the only kind a job moves). See [`DeliveryMode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_mode: Option<String>,
    /// AQ_MsgProperties: the `AQ-*` headers written (outbound) and read (inbound).
    #[serde(default = "yes")]
    pub aq_msg_properties: bool,
    /// Inbound (JMS_NoLocal): leave the messages the gateway's outbound jobs published over
    /// the same link.
    #[serde(default)]
    pub no_local: bool,
    /// The windows in which the job runs and its latency, as a propagation job's
    /// (`schedule = { start, duration, next, latency }`, see [`super::schedule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<super::schedule::ScheduleDef>,
}

fn default_batch() -> u32 {
    30
}
fn default_backoff() -> u64 {
    1000
}
fn yes() -> bool {
    true
}

/// The links by name, for `admin gateway`.
pub type Links = BTreeMap<String, LinkDef>;

/// The foreign queues by `NAME@LINK`, for `admin gateway --foreign-queues`.
pub type ForeignQueues = BTreeMap<String, ForeignQueueDef>;

/// Checks the links and foreign queues, resolves the jobs into `jobs` (with their agents and
/// subscribers); every problem goes to `errors` with its key path.
pub fn resolve(
    def: &GatewayDef,
    transformations: &super::transformation::Transformations,
    queues: &mut BTreeMap<String, QueueInfo>,
    agents: &mut BTreeMap<String, AgentInfo>,
    jobs: &mut BTreeMap<String, super::propagation::PropagationInfo>,
    errors: &mut Vec<String>,
) -> (Links, ForeignQueues) {
    let mut links = Links::new();
    for (i, l) in def.links.iter().enumerate() {
        let key = format!("gateway.links[{i}] ({})", l.name);
        let name = canon(&l.name);
        if !is_name(&name) {
            errors.push(format!("{key}.name: letters, digits and _ only"));
            continue;
        }
        let schemes: &[&str] = match l.kind {
            LinkKind::Rabbitmq => &["amqp://", "amqps://"],
            LinkKind::Nats => &["nats://", "tls://"],
            LinkKind::Mqtt => &["mqtt://", "mqtts://"],
        };
        if !schemes.iter().any(|s| l.url.starts_with(s)) {
            errors.push(format!("{key}.url: a {} URL", schemes.join(" or ")));
        } else if url_has_credentials(&l.url) {
            errors.push(format!("{key}.url: no credentials in the URL (username, password_env, password_file)"));
        }
        if l.password_env.is_some() && l.password_file.is_some() {
            errors.push(format!("{key}: give password_env or password_file, not both"));
        }
        if (l.password_env.is_some() || l.password_file.is_some()) && l.username.is_none() {
            errors.push(format!("{key}.username: needed with a password"));
        }
        if l.cert_file.is_some() != l.key_file.is_some() {
            errors.push(format!("{key}: cert_file and key_file go together"));
        }
        if l.heartbeat_secs == 0 {
            errors.push(format!("{key}.heartbeat_secs: at least 1"));
        }
        if !(1..=65_535).contains(&l.window) {
            errors.push(format!("{key}.window: 1 to 65535"));
        }
        if l.max_message_bytes.is_some_and(|m| !MAX_MESSAGE_BYTES_RANGE.contains(&m)) {
            errors.push(format!("{key}.max_message_bytes: 1024 to 134217728 (1 KiB to 128 MiB)"));
        }
        match (l.kind, l.max_connections) {
            (LinkKind::Mqtt, Some(_)) => errors.push(format!(
                "{key}.max_connections: not for MQTT links (a connection is one client id and its session: each job keeps its own)"
            )),
            (_, Some(n)) if !MAX_CONNECTIONS_RANGE.contains(&n) => errors.push(format!(
                "{key}.max_connections: {} to {}",
                MAX_CONNECTIONS_RANGE.start(),
                MAX_CONNECTIONS_RANGE.end()
            )),
            _ => {}
        }
        let mut l = l.clone();
        l.name = name.clone();
        l.reconnect_backoff_ms = l.reconnect_backoff_ms.clamp(10, 60_000);
        l.reconnect_max_ms = l.reconnect_max_ms.clamp(l.reconnect_backoff_ms, 600_000);
        if links.insert(name, l).is_some() {
            errors.push(format!("{key}: defined twice"));
        }
    }
    let mut foreign = ForeignQueues::new();
    for (i, f) in def.foreign_queues.iter().enumerate() {
        let key = format!("gateway.foreign_queues[{i}] ({})", f.name);
        let (name, link) = (canon(&f.name), canon(&f.link));
        if !is_name(&name) {
            errors.push(format!("{key}.name: letters, digits and _ only"));
            continue;
        }
        let Some(l) = links.get(&link) else {
            errors.push(format!("{key}.link: unknown link {link}"));
            continue;
        };
        if f.native_name.trim().is_empty() || f.native_name.len() > 255 {
            errors.push(format!("{key}.native_name: 1 to 255 characters"));
        }
        match l.kind {
            LinkKind::Rabbitmq => {
                if f.domain == Domain::Queue && f.routing_key.is_some() {
                    errors.push(format!("{key}.routing_key: a RabbitMQ queue takes none (domain topic: an exchange)"));
                }
                if f.stream.is_some() {
                    errors.push(format!("{key}.stream: NATS only"));
                }
            }
            LinkKind::Nats => {
                if f.stream.as_deref().is_none_or(|s| s.is_empty() || !s.chars().all(is_stream_char)) {
                    errors.push(format!("{key}.stream: the JetStream stream (letters, digits, - and _)"));
                }
                if f.routing_key.is_some() {
                    errors.push(format!("{key}.routing_key: RabbitMQ only"));
                }
                if f.native_name.contains(char::is_whitespace) {
                    errors.push(format!("{key}.native_name: a subject has no spaces"));
                }
            }
            LinkKind::Mqtt => {
                if !(1..=2).contains(&f.qos) {
                    errors.push(format!("{key}.qos: 1 or 2"));
                }
                if f.stream.is_some() || f.routing_key.is_some() {
                    errors.push(format!("{key}: stream and routing_key are not MQTT's"));
                }
            }
        }
        let mut f = f.clone();
        f.name = name.clone();
        f.link = link.clone();
        if foreign.insert(format!("{name}@{link}"), f).is_some() {
            errors.push(format!("{key}: defined twice"));
        }
    }
    for (i, d) in def.jobs.iter().enumerate() {
        let key = format!("gateway.jobs[{i}] ({})", d.name);
        if let Some(info) = job(d, &key, (&links, &foreign, transformations), queues, agents, errors)
            && jobs.insert(info.name.clone(), info).is_some()
        {
            errors.push(format!("{key}: a propagation or gateway job of that name is defined twice"));
        }
    }
    (links, foreign)
}

/// The job's options, checked against its direction and foreign queue.
fn options(
    d: &GatewayJobDef,
    key: &str,
    (direction, fq, link): (Direction, &ForeignQueueDef, &LinkDef),
    errors: &mut Vec<String>,
) -> JobOptions {
    let delivery_mode = match d.delivery_mode.as_deref() {
        None => DeliveryMode::default(),
        Some(_) if direction == Direction::Inbound => {
            errors.push(format!(
                "{key}.delivery_mode: an outbound job's option (how the broker keeps what it publishes); an inbound \
                 job enqueues persistent AQ messages"
            ));
            DeliveryMode::default()
        }
        Some(v) => DeliveryMode::parse(v).unwrap_or_else(|| {
            errors.push(format!("{key}.delivery_mode: persistent, non_persistent or preserve_msg, not {v:?}"));
            DeliveryMode::default()
        }),
    };
    if d.no_local && direction == Direction::Outbound {
        errors.push(format!("{key}.no_local: an inbound job's option (the messages it takes from its source)"));
    } else if d.no_local && link.kind == LinkKind::Rabbitmq && fq.domain == Domain::Queue {
        errors.push(format!(
            "{key}.no_local: {}@{} is a RabbitMQ queue, whose messages go to one consumer: leaving one would \
             take it from every consumer; no_local needs domain = \"topic\" (the job's own queue on the exchange)",
            fq.name, fq.link
        ));
    }
    JobOptions { delivery_mode, aq_msg_properties: d.aq_msg_properties, no_local: d.no_local }
}

/// A gateway job as a propagation job carrying its route: its direction (which of source
/// and destination is the foreign queue), queues, exception queue, rule, transformation
/// and options checked; its agent added to `agents` (and, outbound from a multi-consumer
/// queue, a subscriber of it). `None` when it cannot be resolved (its errors said why).
fn job(
    d: &GatewayJobDef,
    key: &str,
    (links, foreign, transformations): (
        &Links,
        &BTreeMap<String, ForeignQueueDef>,
        &super::transformation::Transformations,
    ),
    queues: &mut BTreeMap<String, QueueInfo>,
    agents: &mut BTreeMap<String, AgentInfo>,
    errors: &mut Vec<String>,
) -> Option<super::propagation::PropagationInfo> {
    let name = canon(&d.name);
    if !is_name(&name) {
        errors.push(format!("{key}.name: letters, digits and _ only"));
        return None;
    }
    if !(1..=1000).contains(&d.batch_size) {
        errors.push(format!("{key}.batch_size: 1 to 1000"));
    }
    let (source, destination) = (canon(&d.source), canon(&d.destination));
    let (direction, fq_name, local) = match (source.contains('@'), destination.contains('@')) {
        (false, true) => (Direction::Outbound, destination.clone(), source.clone()),
        (true, false) => (Direction::Inbound, source.clone(), destination.clone()),
        _ => {
            errors.push(format!(
                "{key}: one of source and destination is a foreign queue NAME@LINK, the other an AQ queue"
            ));
            return None;
        }
    };
    let Some(fq) = foreign.get(&fq_name) else {
        errors.push(format!("{key}: unknown foreign queue {fq_name}"));
        return None;
    };
    let link = links.get(&fq.link)?.clone();
    let Some(q) = queues.get(&local) else {
        errors.push(format!("{key}: unknown queue {local}"));
        return None;
    };
    let payload = q.payload.clone();
    let multi = q.multi_consumer;
    let mut schemas = vec![schema(&local)];
    let rule = match d.rule.as_deref().map(crate::selector::Condition::parse) {
        None => None,
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            errors.push(format!("{key}.rule: {e}"));
            None
        }
    };
    let mut exception_queue = None;
    let mut foreign_exception = None;
    match direction {
        Direction::Outbound => {
            if q.remote.is_some() {
                errors.push(format!("{key}.source: a remote queue space's queue is drained by its own job"));
            }
            if let Some(eq) = d.exception_queue.as_deref().map(canon)
                && super::propagation::exception_queue_usable(queues, &eq, &payload, key, errors)
            {
                schemas.push(schema(&eq));
                exception_queue = Some(eq);
            }
        }
        Direction::Inbound => {
            if d.rule.is_some() {
                errors.push(format!("{key}.rule: an inbound job takes every message of its foreign queue"));
            }
            if q.is_exception_queue || q.remote.is_some() {
                errors.push(format!("{key}.destination: {local} is closed for enqueue by clients"));
            }
            if let Some(eq) = d.exception_queue.as_deref().map(canon) {
                (exception_queue, foreign_exception) = inbound_exception(eq, key, &fq.link, foreign, queues, errors);
                schemas.extend(exception_queue.as_deref().map(schema));
            }
        }
    }
    let options = options(d, key, (direction, fq, &link), errors);
    let agent = super::propagation::job_agent(&name);
    if direction == Direction::Outbound
        && multi
        && let Some(q) = queues.get_mut(&local)
    {
        q.subscribers.push(Subscriber { name: agent.clone(), rule, transformation: None });
    }
    schemas.sort();
    schemas.dedup();
    agents.insert(agent.clone(), super::propagation::job_agent_info(&agent, schemas));
    let transformation = job_transformation(d, key, direction, &payload, transformations, errors);
    let outbound = direction == Direction::Outbound;
    let body_type = match transformation.as_deref().and_then(|t| transformations.get(t)) {
        Some(t) if outbound => t.to.clone(),
        Some(t) => t.from.clone(),
        None => payload,
    };
    Some(super::propagation::PropagationInfo {
        name,
        source,
        destination,
        consumer: (outbound && multi).then(|| agent.clone()),
        agent,
        condition: if outbound && !multi { d.rule.clone() } else { None },
        batch_size: d.batch_size,
        preserve_message_id: d.preserve_message_id,
        exception_queue,
        enabled: d.enabled,
        remote: None,
        forward: None,
        concurrency: 1,
        retry_backoff_ms: d.retry_backoff_ms.clamp(10, 60_000),
        space: None,
        schedule: schedule_of(d, key, errors),
        transformation: if outbound { transformation.clone() } else { None },
        gateway: Some(Box::new(GatewayRoute {
            direction,
            link,
            foreign: fq.clone(),
            payload: body_type,
            foreign_exception,
            inbound_transformation: if outbound { None } else { transformation },
            options,
            batches_in_flight: batches_in_flight(d.batches_in_flight, direction, key, errors),
        })),
    })
}

/// An inbound job's exception queue `eq`, for the bodies it cannot enqueue: a foreign
/// queue on the job's link (`link`), or an AQ queue that is single-consumer and RAW (the
/// bytes as they came).
fn inbound_exception(
    eq: String,
    key: &str,
    link: &str,
    foreign: &BTreeMap<String, ForeignQueueDef>,
    queues: &BTreeMap<String, QueueInfo>,
    errors: &mut Vec<String>,
) -> (Option<String>, Option<ForeignQueueDef>) {
    if eq.contains('@') {
        match foreign.get(&eq) {
            Some(f) if f.link == link => return (None, Some(f.clone())),
            Some(_) => errors.push(format!("{key}.exception_queue: {eq} is on another link")),
            None => errors.push(format!("{key}.exception_queue: unknown foreign queue {eq}")),
        }
        return (None, None);
    }
    match queues.get(&eq) {
        Some(e) if e.payload == PayloadKind::Raw && !e.is_exception_queue && !e.multi_consumer => {
            return (Some(eq), None);
        }
        Some(_) => errors
            .push(format!("{key}.exception_queue: {eq} must be a single-consumer RAW queue (the bytes as they came)")),
        None => errors.push(format!("{key}.exception_queue: unknown queue {eq}")),
    }
    (None, None)
}

/// The job's transformation, checked against the AQ side's type `payload`. Outbound:
/// from the source's type (the dequeue applies it, and the object's XML is sent);
/// inbound: to the destination's (the body is read as the transformation's source type).
fn job_transformation(
    d: &GatewayJobDef,
    key: &str,
    direction: Direction,
    payload: &PayloadKind,
    transformations: &super::transformation::Transformations,
    errors: &mut Vec<String>,
) -> Option<String> {
    let tkey = format!("{key}.transformation");
    d.transformation.as_deref().and_then(|t| {
        let checked = match direction {
            Direction::Outbound => super::transformation::check_use(transformations, t, payload, None, &tkey),
            Direction::Inbound => match transformations.get(&canon(t)) {
                Some(x) => super::transformation::check_use(transformations, t, &x.from, Some(payload), &tkey),
                None => super::transformation::check_use(transformations, t, payload, None, &tkey),
            },
        };
        checked.map_err(|e| errors.push(e)).ok()
    })
}

/// The job's schedule (none: at all times), checked under `key`.
fn schedule_of(d: &GatewayJobDef, key: &str, errors: &mut Vec<String>) -> super::schedule::Schedule {
    d.schedule.as_ref().map(|s| super::schedule::resolve(s, &format!("{key}.schedule"), errors)).unwrap_or_default()
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_stream_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

fn url_has_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.contains('@')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    const BASE: &str = r#"
[[queue_tables]]
name = "A.RAW_TAB"
payload_type = "RAW"

[[queue_tables]]
name = "A.TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queue_tables]]
name = "A.TEXT_TAB"
payload_type = "SYS.AQ$_JMS_TEXT_MESSAGE"

[[queues]]
name = "A.OUT"
queue_table = "A.RAW_TAB"

[[queues]]
name = "A.REJECTS"
queue_table = "A.RAW_TAB"

[[queues]]
name = "A.TOPIC"
queue_table = "A.TOPIC_TAB"

[[queues]]
name = "A.TEXT"
queue_table = "A.TEXT_TAB"

[[gateway.links]]
name = "rabbit"
kind = "rabbitmq"
url = "amqp://127.0.0.1:5672/%2f"
username = "guest"
password_env = "P"

[[gateway.links]]
name = "nats"
kind = "nats"
url = "nats://127.0.0.1:4222"

[[gateway.foreign_queues]]
name = "orders"
link = "rabbit"
native_name = "orders"

[[gateway.foreign_queues]]
name = "events"
link = "nats"
native_name = "shop.events"
stream = "SHOP"
"#;

    fn resolved(extra: &str) -> Result<crate::topology::Catalog, Vec<String>> {
        Topology::from_toml(&format!("{BASE}\n{extra}"))?.resolve(&|p| Ok(p.to_string()))
    }

    #[test]
    fn jobs_resolve_into_propagation_jobs_with_their_route() {
        let c = resolved(
            r#"
[[gateway.jobs]]
name = "out"
source = "A.TOPIC"
destination = "orders@rabbit"
rule = "priority < 5"
exception_queue = "A.REJECTS"

[[gateway.jobs]]
name = "in"
source = "events@NATS"
destination = "A.TEXT"
exception_queue = "A.REJECTS"
"#,
        )
        .expect("resolves");
        let out = &c.propagations["OUT"];
        let route = out.gateway.as_ref().expect("a gateway job");
        assert_eq!(
            (route.direction, route.link.kind, out.consumer.as_deref()),
            (Direction::Outbound, LinkKind::Rabbitmq, Some("PROP$OUT"))
        );
        assert!(c.queues["A.TOPIC"].subscribers.iter().any(|s| s.name == "PROP$OUT"), "the job subscribes to a topic");
        let inb = &c.propagations["IN"];
        let route = inb.gateway.as_ref().expect("a gateway job");
        assert_eq!((route.direction, &route.payload), (Direction::Inbound, &PayloadKind::JmsText));
        assert_eq!(inb.exception_queue.as_deref(), Some("A.REJECTS"));
        assert!(route.guarantee().starts_with("exactly once"));
        assert_eq!(c.agents["PROP$IN"].db_users, vec!["A".to_string()]);
        assert_eq!(c.gateway_links.len(), 2);
    }

    #[test]
    fn every_mistake_is_named_with_its_key() {
        let errors = resolved(
            r#"
[[gateway.links]]
name = "leaky"
kind = "rabbitmq"
url = "amqp://guest:guest@127.0.0.1/%2f"

[[gateway.links]]
name = "wrong"
kind = "mqtt"
url = "nats://127.0.0.1:4222"

[[gateway.links]]
name = "tiny"
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"
max_message_bytes = 100

[[gateway.foreign_queues]]
name = "nostream"
link = "nats"
native_name = "x"

[[gateway.foreign_queues]]
name = "ghost"
link = "nolink"
native_name = "x"

[[gateway.jobs]]
name = "both"
source = "orders@rabbit"
destination = "events@nats"

[[gateway.jobs]]
name = "text_rejects"
source = "events@nats"
destination = "A.OUT"
exception_queue = "A.TEXT"

[[gateway.jobs]]
name = "unknown"
source = "A.OUT"
destination = "nothere@rabbit"
"#,
        )
        .expect_err("refused");
        let all = errors.join("\n");
        for want in [
            "gateway.links[2] (leaky).url: no credentials in the URL",
            "gateway.links[3] (wrong).url: a mqtt:// or mqtts:// URL",
            "gateway.links[4] (tiny).max_message_bytes: 1024 to 134217728",
            "gateway.foreign_queues[2] (nostream).stream",
            "gateway.foreign_queues[3] (ghost).link: unknown link NOLINK",
            "gateway.jobs[0] (both): one of source and destination is a foreign queue",
            "gateway.jobs[1] (text_rejects).exception_queue: A.TEXT must be a single-consumer RAW queue",
            "gateway.jobs[2] (unknown): unknown foreign queue NOTHERE@RABBIT",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
    }

    #[test]
    fn job_options_are_resolved_and_bad_ones_named() {
        let c = resolved(
            r#"
[[gateway.foreign_queues]]
name = "fanout"
link = "rabbit"
native_name = "fan"
domain = "topic"

[[gateway.jobs]]
name = "quick"
source = "A.OUT"
destination = "orders@rabbit"
delivery_mode = "NON_PERSISTENT"
aq_msg_properties = false
batches_in_flight = 8

[[gateway.jobs]]
name = "back"
source = "fanout@rabbit"
destination = "A.REJECTS"
no_local = true
"#,
        )
        .expect("resolves");
        let quick = c.propagations["QUICK"].gateway.as_ref().expect("route");
        assert_eq!(
            quick.options,
            JobOptions { delivery_mode: DeliveryMode::NonPersistent, aq_msg_properties: false, no_local: false }
        );
        assert!(quick.guarantee().starts_with("none: NON_PERSISTENT"), "{}", quick.guarantee());
        let back = c.propagations["BACK"].gateway.as_ref().expect("route");
        assert!(back.options.no_local && back.options.aq_msg_properties);
        assert_eq!((quick.batches_in_flight, back.batches_in_flight), (8, 1));
        assert_eq!(c.gateway_foreign.keys().collect::<Vec<_>>(), ["EVENTS@NATS", "FANOUT@RABBIT", "ORDERS@RABBIT"]);
        let errors = resolved(
            r#"
[[gateway.jobs]]
name = "sometimes"
source = "A.OUT"
destination = "orders@rabbit"
delivery_mode = "sometimes"

[[gateway.jobs]]
name = "in_mode"
source = "events@nats"
destination = "A.REJECTS"
delivery_mode = "persistent"
batches_in_flight = 2

[[gateway.jobs]]
name = "out_local"
source = "A.OUT"
destination = "events@nats"
no_local = true
batches_in_flight = 17

[[gateway.jobs]]
name = "queue_local"
source = "orders@rabbit"
destination = "A.REJECTS"
no_local = true
"#,
        )
        .expect_err("refused");
        let all = errors.join("\n");
        for want in [
            r#"gateway.jobs[0] (sometimes).delivery_mode: persistent, non_persistent or preserve_msg, not "sometimes""#,
            "gateway.jobs[1] (in_mode).delivery_mode: an outbound job's option",
            "gateway.jobs[1] (in_mode).batches_in_flight: an outbound job's option",
            "gateway.jobs[2] (out_local).batches_in_flight: 1 to 16",
            "gateway.jobs[2] (out_local).no_local: an inbound job's option",
            "gateway.jobs[3] (queue_local).no_local: ORDERS@RABBIT is a RabbitMQ queue",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
    }

    #[test]
    fn the_mqtt_packet_limit_leaves_room_for_oversized_messages_within_mqtts_own() {
        assert_eq!(packet_limit(1 << 20), (2 << 20) + (64 << 10));
        assert_eq!(packet_limit(*MAX_MESSAGE_BYTES_RANGE.end()), 268_435_455);
        let c = resolved(
            "[[gateway.links]]\nname = \"m\"\nkind = \"mqtt\"\nurl = \"mqtt://h\"\nmax_message_bytes = 2048\n",
        )
        .expect("resolves");
        assert_eq!(c.gateway_links["M"].max_message_bytes, Some(2048));
        assert_eq!(c.gateway_links["RABBIT"].max_message_bytes, None);
    }

    #[test]
    fn links_share_connections_and_jobs_take_a_schedule() {
        let c = resolved(
            r#"
[[gateway.links]]
name = "pooled"
kind = "nats"
url = "nats://127.0.0.1:4222"
max_connections = 3

[[gateway.links]]
name = "m"
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"

[[gateway.jobs]]
name = "nightly"
source = "A.OUT"
destination = "orders@rabbit"
schedule = { start = "2026-05-28T20:26:40Z", duration = 60, next = 3600, latency = 5 }
"#,
        )
        .expect("resolves");
        let links = &c.gateway_links;
        assert_eq!((links["POOLED"].shared(), links["RABBIT"].shared(), links["M"].shared()), (Some(3), Some(1), None));
        let s = c.propagations["NIGHTLY"].schedule;
        assert_eq!((s.start.is_some(), s.duration, s.latency), (true, Some(60_000_000), 5));
        let errors = resolved(
            r#"
[[gateway.links]]
name = "none"
kind = "rabbitmq"
url = "amqp://127.0.0.1:5672/%2f"
max_connections = 0

[[gateway.links]]
name = "m"
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"
max_connections = 1

[[gateway.jobs]]
name = "bad"
source = "A.OUT"
destination = "orders@rabbit"
schedule = { duration = 60 }
"#,
        )
        .expect_err("refused");
        let all = errors.join("\n");
        for want in [
            "gateway.links[2] (none).max_connections: 1 to 64",
            "gateway.links[3] (m).max_connections: not for MQTT links",
            "gateway.jobs[0] (bad).schedule.start: needed with duration or next",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
    }

    #[test]
    fn credentials_in_a_url_are_found() {
        assert!(url_has_credentials("amqp://guest:guest@localhost:5672/%2f"));
        assert!(!url_has_credentials("amqp://localhost:5672/%2f"));
        assert!(!url_has_credentials("nats://127.0.0.1:4222"));
    }
}
