//! Remote queue spaces as the topology declares them (`[[remote_queue_spaces]]`): local
//! names for the queues of another aqgate, the TEDG's `DM_REMOTE_SERVICES` QSPACE/QNAME
//! mapping.
//!
//! A space `HQ` that maps `ORDERS` to the remote `AQUSER.RAW_QUE` makes:
//! - the local queue `HQ.ORDERS` (single-consumer, of the entry's payload type): clients
//!   Send or Publish to it as to any queue, with the privileges any queue of schema `HQ`
//!   needs (a database user `HQ`, or a grant on the queue); dequeue and registration are
//!   refused (the engine sees [`QueueInfo::remote`]). By default a client's send is
//!   forwarded at once and answered with the remote's status (synchronous: nothing is
//!   stored here); with `store_and_forward` it is committed here and the job forwards it;
//! - its exception queue `HQ.ORDERS$E` (an ordinary single-consumer queue of the same
//!   payload type, unless the entry or the space names one): messages the remote refuses
//!   for good, messages that expire before they left, and messages the job retried for
//!   longer than `retry_max_age`;
//! - the implicit propagation job `HQ.ORDERS` (agent `PROP$HQ.ORDERS`, no login), a remote
//!   job to the space's aqgate that drains the local queue (one AQXmlSend per message
//!   under an idempotency key, as any remote job): every message of a store-and-forward
//!   space, and of a synchronous one what a local `[[propagations]]` job brings in.
//!
//! Names: a space is an identifier that no real queue or queue table uses as its schema; a
//! mapped queue is letters, digits and `_`, so the `$` names above never collide with one,
//! and a job name with a `.` never collides with a `[[propagations]]` job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::propagation::{PropagationInfo, RemoteDef, job_agent};
use super::{AgentInfo, QueueInfo, SortOrder, canon};
use crate::payload::{PayloadKind, TypeRegistry};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteSpaceDef {
    /// The queue space: local names are `<NAME>.<QUEUE>`.
    pub name: String,
    /// The other aqgate's servlet, `https://host:port/aqserv` (or `http://`).
    pub url: String,
    /// The agent the space's jobs log in as there.
    pub agent: String,
    #[serde(default)]
    pub password_env: Option<String>,
    #[serde(default)]
    pub password_file: Option<String>,
    /// PEM CA certificates the remote's certificate is verified against.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// The largest payload a message may have, in bytes (RAW: its bytes; other types: their
    /// XML text as stored). None: no limit of the space's own.
    #[serde(default)]
    pub max_message_size: Option<u64>,
    /// The payload types the remote takes; each mapped queue's type must be one of them.
    #[serde(default = "raw_only")]
    pub payload_types: Vec<String>,
    /// The largest relative schedule (`R:HH:MM`, an IDAP `delay`), in seconds.
    #[serde(default = "a_day")]
    pub max_delay: i64,
    /// The exception queue of the space's queues that name none of their own.
    #[serde(default)]
    pub exception_queue: Option<String>,
    /// Messages in flight at once, per mapped queue (1: they arrive in order).
    #[serde(default = "one")]
    pub concurrency: u32,
    /// The first wait after a failed attempt, in milliseconds; it doubles up to 60 s.
    #[serde(default = "default_backoff")]
    pub retry_backoff_ms: u64,
    /// Store and forward (the sender is answered once the message is committed here, and the
    /// space's job forwards it later) instead of the synchronous default (the send is
    /// forwarded at once and answered with the remote's status).
    #[serde(default)]
    pub store_and_forward: bool,
    /// How long, in seconds from its enqueue, the space's job retries a message the remote
    /// refuses for the time being or cannot be reached for; then the message goes to the
    /// exception queue with the last reason. Default a day: the remote's default
    /// `--idempotency-window`, past which a retry could no longer be recognised there.
    #[serde(default = "a_day")]
    pub retry_max_age: i64,
    pub queues: Vec<RemoteQueueDef>,
}

/// One mapped queue (the TEDG's QNAME entry).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemoteQueueDef {
    /// The local queue name within the space.
    pub name: String,
    /// `SCHEMA.QUEUE` at the remote.
    pub remote: String,
    #[serde(default = "raw")]
    pub payload_type: String,
    /// An ordinary single-consumer queue of the same payload type for what the remote
    /// refuses; default: the space's, else `<SPACE>.<NAME>$E`, which the topology creates.
    #[serde(default)]
    pub exception_queue: Option<String>,
}

fn raw() -> String {
    "RAW".into()
}

fn raw_only() -> Vec<String> {
    vec![raw()]
}

fn a_day() -> i64 {
    86_400
}

fn one() -> u32 {
    1
}

fn default_backoff() -> u64 {
    1000
}

/// What the engine knows of a mapped queue (see [`QueueInfo::remote`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTarget {
    pub space: String,
    /// The remote's URL, for messages (never with credentials: the topology has none).
    pub url: String,
    /// `SCHEMA.QUEUE` at the remote.
    pub queue: String,
    pub max_message_size: Option<u64>,
    pub max_delay: i64,
    /// The agent of the job that drains the queue: the only one that dequeues it.
    pub drain_agent: String,
    /// A send is forwarded at once and answered with the remote's status (the default);
    /// false: store and forward.
    pub synchronous: bool,
    /// Seconds from a message's enqueue after which the job stops retrying it.
    pub retry_max_age: i64,
    /// The remote aqgate and the credentials a synchronous send logs in with there.
    pub login: RemoteDef,
}

/// A resolved space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpaceInfo {
    pub name: String,
    pub url: String,
    /// Local queue name (`SPACE.QUEUE`) → remote `SCHEMA.QUEUE`.
    pub queues: BTreeMap<String, String>,
}

/// The local name of a mapped queue, and its default exception queue.
fn local_name(space: &str, queue: &str) -> String {
    format!("{space}.{queue}")
}

fn default_exception_queue(space: &str, queue: &str) -> String {
    format!("{space}.{queue}$E")
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn schema(queue: &str) -> &str {
    queue.split_once('.').map_or(queue, |(s, _)| s)
}

/// A mapped queue as [`queues`] found it, for [`jobs`].
pub struct Mapped {
    space: usize,
    local: String,
    remote: String,
    exception_queue: String,
}

/// Checks the spaces against the real queues and adds their queues (each mapped queue and
/// the exception queues the topology creates); every problem is pushed to `errors` with
/// its key path. `schemas`: the schemas of the real queue tables and queues.
pub fn queues(
    defs: &[RemoteSpaceDef],
    types: &TypeRegistry,
    schemas: &std::collections::BTreeSet<String>,
    queues: &mut BTreeMap<String, QueueInfo>,
    errors: &mut Vec<String>,
) -> (BTreeMap<String, RemoteSpaceInfo>, Vec<Mapped>) {
    let mut spaces = BTreeMap::new();
    let mut mapped = Vec::new();
    for (i, d) in defs.iter().enumerate() {
        let key = format!("remote_queue_spaces[{i}] ({})", d.name);
        let name = canon(&d.name);
        if !is_identifier(&name) {
            errors.push(format!("{key}.name: letters, digits and _ only"));
            continue;
        }
        if spaces.contains_key(&name) {
            errors.push(format!("{key}: defined twice"));
            continue;
        }
        if schemas.contains(&name) {
            errors.push(format!("{key}.name: {name} is the schema of queues or queue tables of this topology"));
            continue;
        }
        match url::Url::parse(d.url.trim()) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()) => {
                if !u.username().is_empty() || u.password().is_some() {
                    errors.push(format!("{key}.url: no credentials in the URL (agent, password_env or password_file)"));
                }
            }
            Ok(_) => errors.push(format!("{key}.url: an http:// or https:// URL with a host")),
            Err(e) => errors.push(format!("{key}.url: {e}")),
        }
        if d.agent.trim().is_empty() {
            errors.push(format!("{key}.agent: empty"));
        }
        if d.password_env.is_some() == d.password_file.is_some() {
            errors.push(format!("{key}: give password_env or password_file (one of them)"));
        }
        if d.max_message_size == Some(0) {
            errors.push(format!("{key}.max_message_size: at least 1 byte"));
        }
        if d.max_delay < 1 {
            errors.push(format!("{key}.max_delay: at least 1 second"));
        }
        if d.retry_max_age < 1 {
            errors.push(format!("{key}.retry_max_age: at least 1 second"));
        }
        if !(1..=64).contains(&d.concurrency) {
            errors.push(format!("{key}.concurrency: 1 to 64"));
        }
        if d.payload_types.is_empty() {
            errors.push(format!("{key}.payload_types: name at least one"));
        }
        let mut accepted = Vec::new();
        for (j, t) in d.payload_types.iter().enumerate() {
            match kind_of(t, types) {
                Ok(k) => accepted.push(k),
                Err(e) => errors.push(format!("{key}.payload_types[{j}]: {e}")),
            }
        }
        if d.queues.is_empty() {
            errors.push(format!("{key}.queues: maps no queue"));
        }
        let mut info = RemoteSpaceInfo { name: name.clone(), url: d.url.trim().to_string(), queues: BTreeMap::new() };
        for (j, q) in d.queues.iter().enumerate() {
            let qkey = format!("{key}.queues[{j}] ({})", q.name);
            let qname = canon(&q.name);
            if !is_identifier(&qname) {
                errors.push(format!("{qkey}.name: letters, digits and _ only"));
                continue;
            }
            let local = local_name(&name, &qname);
            if info.queues.contains_key(&local) {
                errors.push(format!("{qkey}: defined twice"));
                continue;
            }
            let remote = canon(&q.remote);
            if !matches!(remote.split_once('.'), Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.')) {
                errors.push(format!("{qkey}.remote: expected SCHEMA.QUEUE"));
            }
            let payload = match kind_of(&q.payload_type, types) {
                Ok(k) => k,
                Err(e) => {
                    errors.push(format!("{qkey}.payload_type: {e}"));
                    continue;
                }
            };
            if !accepted.is_empty() && !accepted.contains(&payload) {
                errors.push(format!(
                    "{qkey}.payload_type: {payload} is not among the space's payload_types ({})",
                    d.payload_types.join(", ")
                ));
            }
            let named = q.exception_queue.as_ref().or(d.exception_queue.as_ref());
            let exception_queue = match named {
                Some(eq) => {
                    let eq = canon(eq);
                    let what = if q.exception_queue.is_some() { qkey.clone() } else { key.clone() };
                    match queues.get(&eq) {
                        None => errors.push(format!("{what}.exception_queue: unknown queue {eq}")),
                        Some(e) if e.payload != payload => errors.push(format!(
                            "{what}.exception_queue: payload type {} differs from {local}'s {payload}",
                            e.payload
                        )),
                        Some(e) if e.is_exception_queue || e.multi_consumer || e.remote.is_some() => errors.push(
                            format!("{what}.exception_queue: {eq} must be an ordinary single-consumer queue (open for enqueue)"),
                        ),
                        Some(_) => {}
                    }
                    eq
                }
                None => {
                    let eq = default_exception_queue(&name, &qname);
                    queues.insert(eq.clone(), queue_info(&eq, &payload, &eq, None));
                    eq
                }
            };
            let target = RemoteTarget {
                space: name.clone(),
                url: info.url.clone(),
                queue: remote.clone(),
                max_message_size: d.max_message_size,
                max_delay: d.max_delay,
                drain_agent: job_agent(&local),
                synchronous: !d.store_and_forward,
                retry_max_age: d.retry_max_age,
                login: login(d),
            };
            queues.insert(local.clone(), queue_info(&local, &payload, &exception_queue, Some(target)));
            info.queues.insert(local.clone(), remote.clone());
            mapped.push(Mapped { space: i, local, remote, exception_queue });
        }
        spaces.insert(name, info);
    }
    (spaces, mapped)
}

/// How the space's sends log in at the remote.
fn login(d: &RemoteSpaceDef) -> RemoteDef {
    RemoteDef {
        url: d.url.trim().to_string(),
        agent: d.agent.clone(),
        password_env: d.password_env.clone(),
        password_file: d.password_file.clone(),
        ca_file: d.ca_file.clone(),
    }
}

fn kind_of(t: &str, types: &TypeRegistry) -> Result<PayloadKind, String> {
    match PayloadKind::parse(t) {
        Ok(PayloadKind::Object(n)) if !types.contains(&n) => Err(format!("unknown type {n}")),
        Ok(k) => Ok(k),
        Err(e) => Err(e.to_string()),
    }
}

/// A queue the topology makes for a space: a table of its own (so a message-level
/// `exception_queue` can name nothing else), never moved for retries.
fn queue_info(name: &str, payload: &PayloadKind, exception_queue: &str, remote: Option<RemoteTarget>) -> QueueInfo {
    QueueInfo {
        name: name.to_string(),
        queue_table: name.to_string(),
        payload: payload.clone(),
        multi_consumer: false,
        sort: SortOrder::EnqTime,
        enqueue_enabled: true,
        dequeue_enabled: true,
        max_retries: i64::MAX,
        retry_delay: 0,
        retention: super::Retention::None,
        is_exception_queue: false,
        // The remote aqgate checks the senders of its own secure queues.
        secure: false,
        grouped: false,
        exception_queue: exception_queue.to_string(),
        subscribers: Vec::new(),
        remote,
    }
}

/// The implicit job and agent of each mapped queue; refuses `[[propagations]]` jobs that
/// would drain a mapped queue (its own job does).
pub fn jobs(
    defs: &[RemoteSpaceDef],
    mapped: Vec<Mapped>,
    queues: &BTreeMap<String, QueueInfo>,
    agents: &mut BTreeMap<String, AgentInfo>,
    jobs: &mut BTreeMap<String, PropagationInfo>,
    errors: &mut Vec<String>,
) {
    for j in jobs.values() {
        if let Some(r) = queues.get(&j.source).and_then(|q| q.remote.as_ref()) {
            errors.push(format!(
                "propagations ({}).source: {} is a queue of remote queue space {} (its own job drains it)",
                j.name, j.source, r.space
            ));
        }
    }
    for m in mapped {
        let d = &defs[m.space];
        let agent = job_agent(&m.local);
        let mut db_users = vec![schema(&m.local).to_string(), schema(&m.exception_queue).to_string()];
        db_users.dedup();
        agents.insert(agent.clone(), super::propagation::job_agent_info(&agent, db_users));
        let info = PropagationInfo {
            name: m.local.clone(),
            source: m.local.clone(),
            destination: m.remote,
            agent,
            consumer: None,
            condition: None,
            batch_size: 1,
            preserve_message_id: false,
            exception_queue: Some(m.exception_queue),
            enabled: true,
            remote: Some(login(d)),
            forward: None,
            concurrency: d.concurrency,
            retry_backoff_ms: d.retry_backoff_ms.clamp(10, 60_000),
            space: Some(canon(&d.name)),
            schedule: Default::default(),
            transformation: None,
            gateway: None,
        };
        jobs.insert(m.local, info);
    }
}

#[cfg(test)]
mod tests {
    use crate::topology::{Catalog, Topology};

    const BASE: &str = r#"
[[queue_tables]]
name = "AQUSER.RAW_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.RAW_QUE"
queue_table = "AQUSER.RAW_TAB"

[[queue_tables]]
name = "AQUSER.JMS_TAB"
payload_type = "SYS.AQ$_JMS_TEXT_MESSAGE"

[[queues]]
name = "AQUSER.JMS_QUE"
queue_table = "AQUSER.JMS_TAB"
"#;

    const HQ: &str = r#"
[[remote_queue_spaces]]
name = "hq"
url = "https://hq.example.com:8443/aqserv"
agent = "scott"
password_env = "HQ_PASSWORD"
max_message_size = 30000
queues = [
  { name = "orders", remote = "aquser.raw_que" },
  { name = "NOTES", remote = "AQUSER.JMS_QUE", payload_type = "SYS.AQ$_JMS_TEXT_MESSAGE", exception_queue = "AQUSER.JMS_QUE" },
]
payload_types = ["RAW", "SYS.AQ$_JMS_TEXT_MESSAGE"]
"#;

    fn resolve(extra: &str) -> Result<Catalog, Vec<String>> {
        Topology::from_toml(&format!("{BASE}\n{extra}"))?.resolve(&|_| Err("no passwords".into()))
    }

    fn errors(extra: &str) -> String {
        match resolve(extra) {
            Ok(_) => panic!("resolved: {extra}"),
            Err(e) => e.join("\n"),
        }
    }

    #[test]
    fn a_space_makes_its_queues_exception_queues_jobs_and_agents() {
        let c = resolve(HQ).expect("resolves");
        let q = c.queue("hq.orders").expect("HQ.ORDERS");
        let r = q.remote.as_ref().expect("a remote queue");
        assert_eq!((r.space.as_str(), r.queue.as_str(), r.max_delay), ("HQ", "AQUSER.RAW_QUE", 86_400));
        assert_eq!(r.max_message_size, Some(30_000));
        assert_eq!(r.drain_agent, "PROP$HQ.ORDERS");
        assert!(r.synchronous, "synchronous unless store_and_forward");
        assert_eq!(r.retry_max_age, 86_400);
        let c = resolve(&HQ.replace("max_message_size = 30000", "store_and_forward = true\nretry_max_age = 60"))
            .expect("resolves");
        let r = c.queue("HQ.ORDERS").and_then(|q| q.remote.clone()).expect("a remote queue");
        assert!(!r.synchronous);
        assert_eq!(r.retry_max_age, 60);
        let c = resolve(HQ).expect("resolves");
        let q = c.queue("hq.orders").expect("HQ.ORDERS");
        assert!(!q.multi_consumer && q.enqueue_enabled);
        assert_eq!(q.max_retries, i64::MAX, "transient failures never move it");
        assert_eq!(q.exception_queue, "HQ.ORDERS$E");
        let eq = c.queue("HQ.ORDERS$E").expect("its exception queue");
        assert!(eq.remote.is_none() && !eq.is_exception_queue && eq.enqueue_enabled);
        assert_eq!(eq.payload, q.payload);
        assert_eq!(c.queue("HQ.NOTES").map(|q| q.exception_queue.as_str()), Some("AQUSER.JMS_QUE"));
        assert!(c.queue("HQ.NOTES$E").is_none(), "it names its own");

        let job = &c.propagations["HQ.ORDERS"];
        assert_eq!((job.source.as_str(), job.destination.as_str()), ("HQ.ORDERS", "AQUSER.RAW_QUE"));
        assert_eq!(job.exception_queue.as_deref(), Some("HQ.ORDERS$E"));
        assert_eq!(job.space.as_deref(), Some("HQ"));
        assert_eq!(job.remote.as_ref().map(|r| r.url.as_str()), Some("https://hq.example.com:8443/aqserv"));
        assert_eq!(c.agents["PROP$HQ.ORDERS"].db_users, ["HQ"]);
        assert_eq!(c.agents["PROP$HQ.NOTES"].db_users, ["HQ", "AQUSER"]);
        assert!(c.agents["PROP$HQ.NOTES"].password_hash.is_none() && !c.agents["PROP$HQ.NOTES"].http);
        assert_eq!(c.remote_spaces["HQ"].queues.keys().collect::<Vec<_>>(), ["HQ.NOTES", "HQ.ORDERS"]);
    }

    #[test]
    fn bad_spaces_are_refused_naming_the_key() {
        let e = errors(&HQ.replace("max_message_size", "max_size"));
        assert!(e.contains("unknown field `max_size`"), "{e}");
        for (url, want) in [
            ("ftp://hq.example.com/aqserv", "url: an http:// or https:// URL"),
            ("hq.example.com", "url: relative URL without a base"),
            ("https://scott:tiger@hq.example.com/aqserv", "url: no credentials in the URL"),
        ] {
            let e = errors(&HQ.replace("https://hq.example.com:8443/aqserv", url));
            assert!(e.contains(&format!("remote_queue_spaces[0] (hq).{want}")), "{url}: {e}");
        }
        let e =
            errors(&HQ.replace(r#"payload_types = ["RAW", "SYS.AQ$_JMS_TEXT_MESSAGE"]"#, r#"payload_types = ["RAW"]"#));
        assert!(
            e.contains("remote_queue_spaces[0] (hq).queues[1] (NOTES).payload_type: SYS.AQ$_JMS_TEXT_MESSAGE is not among the space's payload_types (RAW)"),
            "{e}"
        );
        let e = errors(&format!("{HQ}\n{}", HQ.replace("\"hq\"", "\"HQ\"")));
        assert!(e.contains("remote_queue_spaces[1] (HQ): defined twice"), "{e}");
        let e = errors(&HQ.replace("\"NOTES\"", "\"Orders\""));
        assert!(e.contains("queues[1] (Orders): defined twice"), "{e}");
        let e = errors(&HQ.replace("\"hq\"", "\"aquser\""));
        assert!(e.contains("remote_queue_spaces[0] (aquser).name: AQUSER is the schema of queues"), "{e}");
        let e = errors(&HQ.replace("aquser.raw_que", "RAW_QUE"));
        assert!(e.contains("queues[0] (orders).remote: expected SCHEMA.QUEUE"), "{e}");
        let e = errors(&HQ.replace("exception_queue = \"AQUSER.JMS_QUE\"", "exception_queue = \"AQUSER.RAW_QUE\""));
        assert!(
            e.contains("(NOTES).exception_queue: payload type RAW differs from HQ.NOTES's SYS.AQ$_JMS_TEXT_MESSAGE"),
            "{e}"
        );
        let e = errors(&HQ.replace("exception_queue = \"AQUSER.JMS_QUE\"", "exception_queue = \"AQUSER.NOPE\""));
        assert!(e.contains("(NOTES).exception_queue: unknown queue AQUSER.NOPE"), "{e}");
        let e = errors(&HQ.replace("password_env = \"HQ_PASSWORD\"", ""));
        assert!(e.contains("(hq): give password_env or password_file"), "{e}");
        let e = errors(&HQ.replace("max_message_size = 30000", "max_delay = 0"));
        assert!(e.contains("(hq).max_delay: at least 1 second"), "{e}");
        let e = errors(&HQ.replace("max_message_size = 30000", "retry_max_age = 0"));
        assert!(e.contains("(hq).retry_max_age: at least 1 second"), "{e}");
        let e = errors(&HQ.replace("{ name = \"orders\"", "{ name = \"ord.ers\""));
        assert!(e.contains("queues[0] (ord.ers).name: letters, digits and _ only"), "{e}");
        let e = errors(&HQ.replace("RAW\", \"SYS", "BLOB_TYP\", \"SYS"));
        assert!(e.contains("(hq).payload_types[0]: unknown type BLOB_TYP"), "{e}");
        let job = "[[propagations]]\nname = \"again\"\nsource = \"HQ.ORDERS\"\ndestination = \"AQUSER.RAW_QUE\"\n";
        let e = errors(&format!("{HQ}\n{job}"));
        assert!(e.contains("propagations (AGAIN).source: HQ.ORDERS is a queue of remote queue space HQ"), "{e}");
    }

    #[test]
    fn a_job_may_send_to_a_mapped_queue() {
        let job = "[[propagations]]\nname = \"up\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"HQ.ORDERS\"\n";
        let c = resolve(&format!("{HQ}\n{job}")).expect("resolves");
        assert_eq!(c.propagations["UP"].destination, "HQ.ORDERS");
    }
}
