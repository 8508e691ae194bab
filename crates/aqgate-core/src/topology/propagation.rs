//! Propagation jobs as the topology declares them (`[[propagations]]`): what a job moves,
//! where to, and under which identity.
//!
//! A job moves messages from a source queue to a destination queue (Messaging Gateway's
//! propagation job, AQ's queue-to-queue propagation). Each job acts as an agent of its own,
//! `PROP$<NAME>`, that no client can log in as (no password, no protocol); its database users
//! are the schemas of its queues, so it may dequeue the source and enqueue the destination
//! and the exception queue, and nothing else.
//!
//! - A single-consumer source: the job takes every message (that matches `rule`, which is
//!   then its dequeue condition).
//! - A multi-consumer source: the job is the subscriber `PROP$<NAME>` of the source (with
//!   `rule` as its rule), so it moves only messages published after the job exists.
//! - The payload types of source and destination must be the same, or a local job's
//!   `transformation` makes the destination's type from the source's (applied to each message
//!   moved; a message it fails on is refused for good); the exception queue (for messages the
//!   destination refuses for good) must have the source's payload type.
//! - An optional schedule (`schedule`, see [`super::schedule`]): the windows in which the
//!   job propagates, and its latency.

use serde::{Deserialize, Serialize};

use super::schedule::{Schedule, ScheduleDef};
use super::{AgentInfo, QueueInfo, Subscriber, canon};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PropagationDef {
    pub name: String,
    /// `SCHEMA.QUEUE` the messages come from.
    pub source: String,
    /// `SCHEMA.QUEUE` the messages go to: in this store, or with `remote` in another aqgate.
    /// Empty for a forwarder (`forward`).
    #[serde(default)]
    pub destination: String,
    /// The destination queue is in another aqgate, reached over IDAP.
    #[serde(default)]
    pub remote: Option<RemoteDef>,
    /// Instead of a queue, POST each message to an HTTP service (Tuxedo's TMQFORWARD).
    #[serde(default)]
    pub forward: Option<ForwardDef>,
    /// Messages in flight at once to a remote destination or service (one request each), or
    /// batches at once of a local job (1, the default, keeps the source's order).
    #[serde(default = "one")]
    pub concurrency: u32,
    /// The first wait after a failed attempt, in milliseconds; it doubles up to 60 s.
    #[serde(default = "default_backoff")]
    pub retry_backoff_ms: u64,
    /// A condition (the dequeue condition language) a message must meet to be moved.
    #[serde(default)]
    pub rule: Option<String>,
    /// Messages moved per transaction (Messaging Gateway's `MsgBatchSize`).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Keep the source message id as the destination message's correlation
    /// (Messaging Gateway's `PreserveMessageID`); otherwise the correlation is carried.
    #[serde(default)]
    pub preserve_message_id: bool,
    /// Where a message the destination refuses for good goes (a queue of the source's
    /// payload type); without one, such a message stays in the source and the job is FAILED.
    #[serde(default)]
    pub exception_queue: Option<String>,
    /// When the job propagates, and how promptly (DBMS_AQADM.SCHEDULE_PROPAGATION); none:
    /// always, event-driven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleDef>,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A transformation applied to each message moved (a local destination only): from the
    /// source's payload type to the destination's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformation: Option<String>,
}

/// Another aqgate's servlet, and the agent a job logs in as there. The password is never in
/// the topology: it is read from the environment variable or the file named here.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemoteDef {
    /// `https://host:port/aqserv` (or `http://` on a trusted network).
    pub url: String,
    pub agent: String,
    #[serde(default)]
    pub password_env: Option<String>,
    #[serde(default)]
    pub password_file: Option<String>,
    /// PEM CA certificates the remote's certificate is verified against (besides the
    /// system's roots).
    #[serde(default)]
    pub ca_file: Option<String>,
}

/// A forwarder's HTTP service. The HMAC secret, if any, is read from the environment.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ForwardDef {
    pub url: String,
    /// `xml` (the payload element, `application/xml`) or `json`.
    #[serde(default = "xml")]
    pub format: String,
    /// A RAW queue the service's 2xx response body is enqueued to, with the source's
    /// correlation.
    #[serde(default)]
    pub reply_queue: Option<String>,
    /// A RAW queue the service's answer to a failed attempt is enqueued to.
    #[serde(default)]
    pub failure_queue: Option<String>,
    /// The environment variable holding the HMAC-SHA256 key of the `AQ-Signature` header.
    #[serde(default)]
    pub secret_env: Option<String>,
}

fn xml() -> String {
    "xml".into()
}

fn default_backoff() -> u64 {
    1000
}

fn one() -> u32 {
    1
}

fn default_batch_size() -> u32 {
    30
}

fn yes() -> bool {
    true
}

/// A resolved job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropagationInfo {
    pub name: String,
    pub source: String,
    pub destination: String,
    /// The agent and, on a multi-consumer source, the subscriber name.
    pub agent: String,
    pub consumer: Option<String>,
    /// The condition, for a single-consumer source (a multi-consumer source has it as the
    /// subscriber's rule).
    pub condition: Option<String>,
    pub batch_size: u32,
    pub preserve_message_id: bool,
    pub exception_queue: Option<String>,
    pub enabled: bool,
    pub remote: Option<RemoteDef>,
    pub forward: Option<ForwardDef>,
    pub concurrency: u32,
    pub retry_backoff_ms: u64,
    /// The remote queue space whose queue this implicit job drains (`None`: a job of
    /// `[[propagations]]`).
    pub space: Option<String>,
    /// Its windows and latency (the default: always, event-driven).
    pub schedule: Schedule,
    /// The transformation each message moved goes through (upper-case name).
    pub transformation: Option<String>,
    /// A Messaging Gateway job's link and foreign queue (see `super::gateway`).
    pub gateway: Option<Box<super::foreign::GatewayRoute>>,
}

/// The agent (and subscriber) name of job `name`.
pub fn job_agent(name: &str) -> String {
    format!("PROP${}", canon(name))
}

/// Whether `agent` is a job's (a name only jobs may have: the topology refuses it to others),
/// whether or not the job is still in the topology.
pub fn is_job_agent(agent: &str) -> bool {
    agent.starts_with("PROP$")
}

/// Checks the jobs against the queues, adds their subscribers and agents; every problem is
/// pushed to `errors` with its key path.
pub fn resolve(
    defs: &[PropagationDef],
    transformations: &super::transformation::Transformations,
    queues: &mut BTreeMap<String, QueueInfo>,
    agents: &mut BTreeMap<String, AgentInfo>,
    errors: &mut Vec<String>,
) -> BTreeMap<String, PropagationInfo> {
    let mut jobs = BTreeMap::new();
    for (i, d) in defs.iter().enumerate() {
        let key = format!("propagations[{i}] ({})", d.name);
        let name = canon(&d.name);
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            errors.push(format!("{key}.name: letters, digits and _ only"));
            continue;
        }
        if !(1..=1000).contains(&d.batch_size) {
            errors.push(format!("{key}.batch_size: 1 to 1000"));
        }
        let rule = match d.rule.as_deref().map(crate::selector::Condition::parse) {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => {
                errors.push(format!("{key}.rule: {e}"));
                None
            }
        };
        if !(1..=64).contains(&d.concurrency) {
            errors.push(format!("{key}.concurrency: 1 to 64"));
        }
        let (source, destination) = (canon(&d.source), canon(&d.destination));
        let Some(src) = queues.get(&source) else {
            errors.push(format!("{key}.source: unknown queue {source}"));
            continue;
        };
        if let Some(f) = &d.forward {
            if d.remote.is_some() || !d.destination.is_empty() {
                errors.push(format!("{key}: a forwarder has no destination or remote"));
            }
            if let Err(e) = crate::notify_policy::http_target_host(&f.url) {
                errors.push(format!("{key}.forward.url: {e}"));
            }
            if f.format != "xml" && f.format != "json" {
                errors.push(format!("{key}.forward.format: xml or json"));
            }
            for (what, q) in [("reply_queue", &f.reply_queue), ("failure_queue", &f.failure_queue)] {
                let Some(q) = q else { continue };
                match queues.get(&canon(q)) {
                    Some(info) if info.payload == crate::payload::PayloadKind::Raw && !info.is_exception_queue => {}
                    Some(_) => errors.push(format!("{key}.forward.{what}: {q} must be a RAW queue open for enqueue")),
                    None => errors.push(format!("{key}.forward.{what}: unknown queue {q}")),
                }
            }
        }
        let mut transformation = None;
        if let Some(t) = &d.transformation
            && (d.remote.is_some() || d.forward.is_some())
        {
            errors.push(format!("{key}.transformation: {t} applies to a local destination only"));
        }
        match &d.remote {
            _ if d.forward.is_some() => {}
            // The remote checks its queue and payload type; a refusal sends the message
            // to the exception queue.
            Some(r) => {
                if !(r.url.starts_with("https://") || r.url.starts_with("http://")) {
                    errors.push(format!("{key}.remote.url: an http:// or https:// URL"));
                }
                if r.agent.trim().is_empty() {
                    errors.push(format!("{key}.remote.agent: empty"));
                }
                if r.password_env.is_some() == r.password_file.is_some() {
                    errors.push(format!("{key}.remote: give password_env or password_file (one of them)"));
                }
                if !is_queue_name(&destination) {
                    errors.push(format!("{key}.destination: expected SCHEMA.QUEUE"));
                }
            }
            None => {
                let Some(dst) = queues.get(&destination) else {
                    errors.push(format!("{key}.destination: unknown queue {destination}"));
                    continue;
                };
                if source == destination {
                    errors.push(format!("{key}.destination: the source itself"));
                }
                if let Some(t) = &d.transformation {
                    let key = format!("{key}.transformation");
                    match super::transformation::check_use(transformations, t, &src.payload, Some(&dst.payload), &key) {
                        Ok(n) => transformation = Some(n),
                        Err(e) => errors.push(e),
                    }
                } else if !payload_can_move(&src.payload, &dst.payload) {
                    errors.push(format!(
                        "{key}.destination: payload type {} differs from the source's {}",
                        dst.payload, src.payload
                    ));
                }
                if dst.is_exception_queue {
                    errors.push(format!("{key}.destination: {destination} is an exception queue (closed for enqueue)"));
                }
            }
        }
        let schedule = d.schedule.as_ref().map(|s| super::schedule::resolve(s, &format!("{key}.schedule"), errors));
        let exception_queue = d.exception_queue.as_deref().map(canon);
        let mut schemas = vec![schema(&source)];
        if d.remote.is_none() && d.forward.is_none() {
            schemas.push(schema(&destination));
        }
        if let Some(f) = &d.forward {
            schemas.extend(f.reply_queue.iter().chain(f.failure_queue.iter()).map(|q| schema(&canon(q))));
        }
        if let Some(eq) = &exception_queue
            && exception_queue_usable(queues, eq, &src.payload, &key, errors)
        {
            schemas.push(schema(eq));
        }
        let agent = job_agent(&name);
        let multi = src.multi_consumer;
        if multi && let Some(q) = queues.get_mut(&source) {
            q.subscribers.push(Subscriber { name: agent.clone(), rule, transformation: None });
        }
        schemas.sort();
        schemas.dedup();
        agents.insert(agent.clone(), job_agent_info(&agent, schemas));
        let info = PropagationInfo {
            name: name.clone(),
            source,
            destination,
            consumer: multi.then(|| agent.clone()),
            agent,
            condition: if multi { None } else { d.rule.clone() },
            batch_size: d.batch_size,
            preserve_message_id: d.preserve_message_id,
            exception_queue,
            enabled: d.enabled,
            remote: d.remote.clone(),
            forward: d.forward.clone(),
            concurrency: d.concurrency,
            retry_backoff_ms: d.retry_backoff_ms.clamp(10, 60_000),
            space: None,
            schedule: schedule.unwrap_or_default(),
            transformation,
            gateway: None,
        };
        if jobs.insert(name, info).is_some() {
            errors.push(format!("{key}: defined twice"));
        }
    }
    jobs
}

fn is_queue_name(q: &str) -> bool {
    matches!(q.split_once('.'), Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.'))
}

pub(super) fn schema(queue: &str) -> String {
    queue.split_once('.').map_or(queue, |(s, _)| s).to_string()
}

/// The agent job agent `agent` is: no password, no protocol, `db_users` as given.
pub(super) fn job_agent_info(agent: &str, db_users: Vec<String>) -> AgentInfo {
    AgentInfo {
        name: agent.to_string(),
        password_hash: None,
        http: false,
        smtp: false,
        gateway: false,
        db_users,
        certificate_location: None,
        console: None,
    }
}

/// Whether a job may move messages of `src`'s payload type into a queue of `dst`'s without
/// a transformation: the same type, anything into SYS.ANYDATA (the type travels with the
/// message), and SYS.ANYDATA into a typed queue (each message checked at its enqueue: one
/// of another type is refused there as any mismatched payload is).
pub(crate) fn payload_can_move(src: &crate::payload::PayloadKind, dst: &crate::payload::PayloadKind) -> bool {
    use crate::payload::PayloadKind::AnyData;
    src == dst || *dst == AnyData || *src == AnyData
}

/// Whether `eq` can be the exception queue of a job whose messages are of `payload`: a
/// known, ordinary single-consumer queue of that type. Otherwise the reason goes to
/// `errors` (at `key`).
pub(super) fn exception_queue_usable(
    queues: &BTreeMap<String, QueueInfo>,
    eq: &str,
    payload: &crate::payload::PayloadKind,
    key: &str,
    errors: &mut Vec<String>,
) -> bool {
    let problem = match queues.get(eq) {
        None => format!("{key}.exception_queue: unknown queue {eq}"),
        Some(q) if q.payload != *payload => {
            format!("{key}.exception_queue: payload type {} differs from the source's {payload}", q.payload)
        }
        Some(q) if q.is_exception_queue || q.multi_consumer => {
            format!("{key}.exception_queue: {eq} must be an ordinary single-consumer queue (open for enqueue)")
        }
        Some(_) => return true,
    };
    errors.push(problem);
    false
}
