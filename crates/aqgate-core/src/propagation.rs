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
//! - The payload types of source and destination must be the same; the exception queue
//!   (for messages the destination refuses for good) must have the source's payload type.

use serde::{Deserialize, Serialize};

use crate::topology::{AgentInfo, QueueInfo, Subscriber, canon};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PropagationDef {
    pub name: String,
    /// `SCHEMA.QUEUE` the messages come from.
    pub source: String,
    /// `SCHEMA.QUEUE` in this store the messages go to.
    pub destination: String,
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
    #[serde(default = "yes")]
    pub enabled: bool,
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
}

/// The agent (and subscriber) name of job `name`.
pub fn job_agent(name: &str) -> String {
    format!("PROP${}", canon(name))
}

/// Checks the jobs against the queues, adds their subscribers and agents; every problem is
/// pushed to `errors` with its key path.
pub fn resolve(
    defs: &[PropagationDef],
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
        let (source, destination) = (canon(&d.source), canon(&d.destination));
        let (Some(src), Some(dst)) = (queues.get(&source), queues.get(&destination)) else {
            for (what, q) in [("source", &source), ("destination", &destination)] {
                if !queues.contains_key(q) {
                    errors.push(format!("{key}.{what}: unknown queue {q}"));
                }
            }
            continue;
        };
        if source == destination {
            errors.push(format!("{key}.destination: the source itself"));
        }
        if src.payload != dst.payload {
            errors.push(format!(
                "{key}.destination: payload type {} differs from the source's {}",
                dst.payload, src.payload
            ));
        }
        if dst.is_exception_queue {
            errors.push(format!("{key}.destination: {destination} is an exception queue (closed for enqueue)"));
        }
        let exception_queue = d.exception_queue.as_deref().map(canon);
        let mut schemas = vec![schema(&source), schema(&destination)];
        if let Some(eq) = &exception_queue {
            match queues.get(eq) {
                None => errors.push(format!("{key}.exception_queue: unknown queue {eq}")),
                Some(q) if q.payload != src.payload => errors.push(format!(
                    "{key}.exception_queue: payload type {} differs from the source's {}",
                    q.payload, src.payload
                )),
                Some(q) if q.is_exception_queue || q.multi_consumer => errors.push(format!(
                    "{key}.exception_queue: {eq} must be an ordinary single-consumer queue (open for enqueue)"
                )),
                Some(_) => schemas.push(schema(eq)),
            }
        }
        let agent = job_agent(&name);
        let multi = src.multi_consumer;
        if multi && let Some(q) = queues.get_mut(&source) {
            q.subscribers.push(Subscriber { name: agent.clone(), rule });
        }
        schemas.sort();
        schemas.dedup();
        agents.insert(
            agent.clone(),
            AgentInfo {
                name: agent.clone(),
                password_hash: None,
                http: false,
                smtp: false,
                gateway: false,
                db_users: schemas,
                certificate_location: None,
            },
        );
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
        };
        if jobs.insert(name, info).is_some() {
            errors.push(format!("{key}: defined twice"));
        }
    }
    jobs
}

fn schema(queue: &str) -> String {
    queue.split_once('.').map_or(queue, |(s, _)| s).to_string()
}
