//! The declarative topology file (TOML): object types, queue tables, queues, subscribers,
//! agents and privileges — the equivalents of DBMS_AQADM's CREATE_QUEUE_TABLE,
//! CREATE_QUEUE, ADD_SUBSCRIBER, CREATE_AQ_AGENT, ENABLE_DB_ACCESS and
//! GRANT_QUEUE_PRIVILEGE.
//!
//! Parsing validates the file as a whole and reports every problem with its key path.
//! [`Topology::resolve`] turns it into the runtime [`Catalog`] the engine uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::payload::{PayloadKind, TypeDef, TypeRegistry};
use crate::selector::Condition;
pub use retention::Retention;

pub mod foreign;
pub mod gateway;
mod loops;
pub mod propagation;
pub mod remote_space;
pub mod retention;
pub mod schedule;
pub mod transformation;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    #[serde(default)]
    pub types: Vec<TypeDef>,
    #[serde(default)]
    pub queue_tables: Vec<QueueTableDef>,
    #[serde(default)]
    pub queues: Vec<QueueDef>,
    #[serde(default)]
    pub subscribers: Vec<SubscriberDef>,
    #[serde(default)]
    pub agents: Vec<AgentDef>,
    #[serde(default)]
    pub grants: Vec<GrantDef>,
    #[serde(default)]
    pub propagations: Vec<propagation::PropagationDef>,
    #[serde(default)]
    pub remote_queue_spaces: Vec<remote_space::RemoteSpaceDef>,
    #[serde(default)]
    pub transformations: Vec<transformation::TransformationDef>,
    /// The Messaging Gateway: links to other brokers, their queues, and jobs.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gateway: gateway::GatewayDef,
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueTableDef {
    /// `SCHEMA.NAME`.
    pub name: String,
    /// `RAW`, `SYS.AQ$_JMS_TEXT_MESSAGE`, ..., `XMLTYPE`, or an object type name.
    pub payload_type: String,
    #[serde(default)]
    pub multiple_consumers: bool,
    /// `enq_time` (default) or `priority,enq_time`.
    #[serde(default)]
    pub sort_list: Option<String>,
    /// A secure queue table (CREATE_QUEUE_TABLE's `secure`): a message's `sender_id` must
    /// name an agent enabled for the database user the request enqueues as (see
    /// [`Catalog::enqueue_users`]). On other queue tables `sender_id` is the application's
    /// and kept as given.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure: bool,
    /// CREATE_QUEUE_TABLE's `message_grouping`: `none` (the default) or `transactional`,
    /// where the messages one transaction enqueued to a queue of the table form a group,
    /// dequeued together by one consumer (see `engine::grouping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_grouping: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueDef {
    /// `SCHEMA.NAME`.
    pub name: String,
    pub queue_table: String,
    /// Started for enqueue (default true).
    #[serde(default = "yes")]
    pub enqueue: bool,
    /// Started for dequeue (default true).
    #[serde(default = "yes")]
    pub dequeue: bool,
    /// Failed (rolled back) dequeues before a message moves to the exception queue.
    #[serde(default = "default_max_retries")]
    pub max_retries: i64,
    /// Seconds a message waits (state WAIT) after a rolled-back dequeue before it is ready
    /// again (CREATE_QUEUE's `retry_delay`; default 0: at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_delay: i64,
    /// How long a removed message stays in the queue as PROCESSED: seconds, or
    /// `"FOREVER"` (CREATE_QUEUE's `retention_time`; default 0: it goes at once).
    #[serde(default, skip_serializing_if = "Retention::is_none")]
    pub retention_time: Retention,
    /// An exception queue (`DBMS_AQADM.EXCEPTION_QUEUE`): messages of its queue table that
    /// name it as their `exception_queue` move here; nobody enqueues to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exception: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubscriberDef {
    pub queue: String,
    pub name: String,
    /// Optional rule condition (same language as dequeue conditions).
    #[serde(default)]
    pub rule: Option<String>,
    /// A transformation applied when this subscriber dequeues without naming one (its
    /// `from_type` is the queue's payload type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformation: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    pub name: String,
    /// A clear-text password: for demos only; stored as an argon2 hash.
    #[serde(default)]
    pub password: Option<String>,
    /// An argon2 PHC string (`aqgate admin hash-password` makes one).
    #[serde(default)]
    pub password_hash: Option<String>,
    /// `http`, `smtp` (default: both).
    #[serde(default = "default_protocols")]
    pub protocols: Vec<String>,
    /// Database users this agent maps to (ENABLE_DB_ACCESS).
    #[serde(default)]
    pub db_users: Vec<String>,
    /// May act on behalf of other agents (the SMTP gateway).
    #[serde(default)]
    pub gateway: bool,
    /// DN of the directory entry holding the agent's certificate.
    #[serde(default)]
    pub certificate_location: Option<String>,
    /// The agent's role in the web console (`viewer`, `reader`, `operator`, `admin`);
    /// none: no console access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GrantDef {
    pub user: String,
    pub queue: String,
    /// `enqueue`, `dequeue` or `all`.
    pub privilege: String,
}

fn yes() -> bool {
    true
}
fn is_zero(n: &i64) -> bool {
    *n == 0
}
fn default_max_retries() -> i64 {
    5
}
fn default_protocols() -> Vec<String> {
    vec!["http".into(), "smtp".into()]
}

/// Upper-cases an identifier the way Oracle does for unquoted names.
pub fn canon(name: &str) -> String {
    name.trim().to_ascii_uppercase()
}

/// The name of a queue table's default exception queue (`SCHEMA.AQ$_TABLE_E`).
pub fn exception_queue_name(queue_table: &str) -> String {
    let t = canon(queue_table);
    match t.split_once('.') {
        Some((schema, table)) => format!("{schema}.AQ$_{table}_E"),
        None => format!("AQ$_{t}_E"),
    }
}

/// A queue table's `sort_list`: the dequeue order of its messages (CREATE_QUEUE_TABLE's
/// `sort_list`), kept per message as its `prio_key` (then its sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    /// `enq_time` (the default): first in, first out.
    EnqTime,
    /// `priority,enq_time` (and `priority` alone): by priority, the lowest number first;
    /// first in, first out within a priority.
    PriorityEnqTime,
    /// `enq_time,priority`: first in, first out; messages enqueued at the same time (one
    /// request's) by priority.
    EnqTimePriority,
}

/// A queue as the engine sees it.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    pub name: String,
    pub queue_table: String,
    pub payload: PayloadKind,
    pub multi_consumer: bool,
    pub sort: SortOrder,
    pub enqueue_enabled: bool,
    pub dequeue_enabled: bool,
    pub max_retries: i64,
    /// Seconds a rolled-back message waits before it is ready again.
    pub retry_delay: i64,
    /// How long a removed message stays PROCESSED.
    pub retention: Retention,
    pub is_exception_queue: bool,
    /// Its queue table is secure: `sender_id` is checked against the database users (see
    /// [`QueueTableDef::secure`]).
    pub secure: bool,
    /// Its queue table has `message_grouping = "transactional"` (see
    /// [`QueueTableDef::message_grouping`]).
    pub grouped: bool,
    /// Name of the queue table's default exception queue.
    pub exception_queue: String,
    pub subscribers: Vec<Subscriber>,
    /// A queue of a remote queue space: messages sent to it are forwarded to this queue of
    /// another aqgate, and nobody but the forwarding job dequeues it.
    pub remote: Option<remote_space::RemoteTarget>,
}

impl QueueInfo {
    /// Whether a REMOVE dequeue records who took the message (the dequeue history): on
    /// multi-consumer queues, as Oracle does, and on queues that keep removed messages.
    pub fn keeps_history(&self) -> bool {
        self.multi_consumer || !self.retention.is_none()
    }
}

#[derive(Debug, Clone)]
pub struct Subscriber {
    pub name: String,
    pub rule: Option<Condition>,
    /// The transformation its dequeues apply when they name none (upper-case name).
    pub transformation: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Enqueue,
    Dequeue,
}

#[derive(Debug, Clone)]
pub struct AgentInfo {
    pub name: String,
    pub password_hash: Option<String>,
    pub http: bool,
    pub smtp: bool,
    pub gateway: bool,
    pub db_users: Vec<String>,
    pub certificate_location: Option<String>,
    /// The agent's role in the web console; `None`: no console access.
    pub console: Option<ConsoleRole>,
}

/// What an agent may do in the web console, each role with what the one before it may:
/// `Viewer` the figures (depths, jobs, links), `Reader` also messages and their payloads,
/// `Operator` also actions (a job's enable and disable), `Admin` also the topology's
/// agents. Every role sees only the queues the agent's database users own or hold a
/// grant on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConsoleRole {
    Viewer,
    Reader,
    Operator,
    Admin,
}

impl ConsoleRole {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "viewer" => Some(Self::Viewer),
            "reader" => Some(Self::Reader),
            "operator" => Some(Self::Operator),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Reader => "reader",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }
}

/// The resolved topology: what the engine consults on every request.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub types: TypeRegistry,
    pub queues: BTreeMap<String, QueueInfo>,
    pub agents: BTreeMap<String, AgentInfo>,
    /// (db user, queue) → (enqueue, dequeue).
    pub grants: BTreeMap<(String, String), (bool, bool)>,
    /// Propagation jobs by name (with the implicit jobs of remote queue spaces).
    pub propagations: BTreeMap<String, propagation::PropagationInfo>,
    /// Remote queue spaces by name.
    pub remote_spaces: BTreeMap<String, remote_space::RemoteSpaceInfo>,
    /// Transformations by name.
    pub transformations: transformation::Transformations,
    /// The Messaging Gateway's links by name.
    pub gateway_links: gateway::Links,
    /// The Messaging Gateway's foreign queues by `NAME@LINK`.
    pub gateway_foreign: gateway::ForeignQueues,
}

impl Catalog {
    pub fn queue(&self, name: &str) -> Option<&QueueInfo> {
        self.queues.get(&canon(name))
    }

    /// Agent names are case-insensitive, as Oracle's unquoted identifiers.
    pub fn agent(&self, name: &str) -> Option<&AgentInfo> {
        self.agents.get(&canon(name))
    }

    /// Transformation names are case-insensitive, as queue names.
    pub fn transformation(&self, name: &str) -> Option<&std::sync::Arc<crate::payload::Transformation>> {
        self.transformations.get(&canon(name))
    }

    /// Whether `agent` may perform `what` on `queue`: one of its database users owns the
    /// queue's schema or holds a grant for it.
    pub fn permits(&self, agent: &AgentInfo, queue: &QueueInfo, what: Privilege) -> bool {
        agent.db_users.iter().any(|u| self.user_holds(u, queue, what))
    }

    /// The database users of `agent` through which it may enqueue to `queue` (the owner
    /// schema, or a user with a grant): the users a request of that agent enqueues as, in
    /// the agent's order. Empty when [`Catalog::permits`] says no.
    pub fn enqueue_users<'a>(&self, agent: &'a AgentInfo, queue: &QueueInfo) -> Vec<&'a str> {
        agent.db_users.iter().filter(|u| self.user_holds(u, queue, Privilege::Enqueue)).map(String::as_str).collect()
    }

    /// Whether database user `user` owns `queue`'s schema or holds a grant of `what` on it.
    fn user_holds(&self, user: &str, queue: &QueueInfo, what: Privilege) -> bool {
        let schema = queue.name.split_once('.').map(|(s, _)| s).unwrap_or("");
        let u = canon(user);
        if u == schema {
            return true;
        }
        match self.grants.get(&(u, queue.name.clone())) {
            Some((enq, deq)) => match what {
                Privilege::Enqueue => *enq,
                Privilege::Dequeue => *deq,
            },
            None => false,
        }
    }
}

/// The longest queue table name (`SCHEMA.NAME`, in bytes): its `AQ$` view's name, 3 bytes
/// longer, is a PostgreSQL identifier.
pub const MAX_QUEUE_TABLE_NAME: usize = 60;

impl Topology {
    pub fn from_toml(text: &str) -> Result<Self, Vec<String>> {
        toml::from_str(text).map_err(|e| vec![e.to_string()])
    }

    /// Checks the file as a whole (every error with its key path) and builds the catalog.
    /// `hash` turns clear-text demo passwords into stored hashes; it is called only for
    /// agents that give `password`.
    pub fn resolve(&self, hash: &dyn Fn(&str) -> Result<String, String>) -> Result<Catalog, Vec<String>> {
        let mut errors = Vec::new();
        let types = match TypeRegistry::new(self.types.clone()) {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("types: {e}"));
                TypeRegistry::default()
            }
        };
        let tables = self.queue_tables(&types, &mut errors);
        let mut queues = exception_queues(&tables);
        self.declared_queues(&tables, &mut queues, &mut errors);

        let transformations = transformation::resolve(&self.transformations, &types, &mut errors);

        // Remote queue spaces add their queues before anything refers to queues.
        let schemas: std::collections::BTreeSet<String> =
            tables.keys().chain(queues.keys()).filter_map(|n| n.split_once('.').map(|(s, _)| s.to_string())).collect();
        let (remote_spaces, mapped) =
            remote_space::queues(&self.remote_queue_spaces, &types, &schemas, &mut queues, &mut errors);
        self.subscribers_of_queues(&transformations, &mut queues, &mut errors);

        let mut agents = self.agents(hash, &mut errors);
        let mut propagations =
            propagation::resolve(&self.propagations, &transformations, &mut queues, &mut agents, &mut errors);
        remote_space::jobs(&self.remote_queue_spaces, mapped, &queues, &mut agents, &mut propagations, &mut errors);
        errors.extend(loops::errors(&propagations));
        let (gateway_links, gateway_foreign) =
            gateway::resolve(&self.gateway, &transformations, &mut queues, &mut agents, &mut propagations, &mut errors);
        let grants = self.grants(&queues, &mut errors);

        if errors.is_empty() {
            Ok(Catalog {
                types,
                queues,
                agents,
                grants,
                propagations,
                remote_spaces,
                transformations,
                gateway_links,
                gateway_foreign,
            })
        } else {
            Err(errors)
        }
    }

    /// `[[queue_tables]]` checked, by canonical name: each one's payload type, sort order
    /// and grouping. A table whose payload type is wrong is left out (its error said so).
    fn queue_tables(&self, types: &TypeRegistry, errors: &mut Vec<String>) -> BTreeMap<String, Table<'_>> {
        let mut tables = BTreeMap::new();
        for (i, t) in self.queue_tables.iter().enumerate() {
            let key = format!("queue_tables[{i}] ({})", t.name);
            if !is_qualified(&t.name) {
                errors.push(format!("{key}.name: expected SCHEMA.NAME"));
            }
            // Its view `SCHEMA.AQ$NAME` is one database identifier: PostgreSQL's hold 63
            // bytes (and cut longer ones, so two long names could collide).
            if canon(&t.name).len() > MAX_QUEUE_TABLE_NAME {
                errors.push(format!(
                    "{key}.name: at most {MAX_QUEUE_TABLE_NAME} bytes (its view \"SCHEMA.AQ$NAME\" is a database \
                     identifier, at most 63 bytes on PostgreSQL)"
                ));
            }
            let payload = match PayloadKind::parse(&t.payload_type) {
                Ok(PayloadKind::Object(n)) if !types.contains(&n) => {
                    errors.push(format!("{key}.payload_type: unknown type {n}"));
                    continue;
                }
                Ok(p) => p,
                Err(e) => {
                    errors.push(format!("{key}.payload_type: {e}"));
                    continue;
                }
            };
            let sort = match t.sort_list.as_deref().map(|s| s.replace(' ', "").to_ascii_lowercase()) {
                None => SortOrder::EnqTime,
                Some(s) if s == "enq_time" => SortOrder::EnqTime,
                Some(s) if s == "priority,enq_time" || s == "priority" => SortOrder::PriorityEnqTime,
                Some(s) if s == "enq_time,priority" => SortOrder::EnqTimePriority,
                Some(s) => {
                    errors.push(format!(
                        "{key}.sort_list: unsupported '{s}' (enq_time, priority, priority,enq_time or enq_time,priority)"
                    ));
                    SortOrder::EnqTime
                }
            };
            let grouped = match t.message_grouping.as_deref().map(|g| g.trim().to_ascii_lowercase()) {
                None => false,
                Some(g) if g == "none" => false,
                Some(g) if g == "transactional" => true,
                Some(g) => {
                    errors.push(format!("{key}.message_grouping: unsupported '{g}' (none or transactional)"));
                    false
                }
            };
            if tables.insert(canon(&t.name), Table { def: t, payload, sort, grouped }).is_some() {
                errors.push(format!("{key}: defined twice"));
            }
        }
        tables
    }

    /// `[[queues]]` checked and added to `queues`, each in its queue table. Exception
    /// queues are single-consumer and closed for enqueue, like the default one.
    fn declared_queues(
        &self,
        tables: &BTreeMap<String, Table<'_>>,
        queues: &mut BTreeMap<String, QueueInfo>,
        errors: &mut Vec<String>,
    ) {
        for (i, q) in self.queues.iter().enumerate() {
            let key = format!("queues[{i}] ({})", q.name);
            if !is_qualified(&q.name) {
                errors.push(format!("{key}.name: expected SCHEMA.NAME"));
            }
            let Some(Table { def: t, payload, sort, grouped }) = tables.get(&canon(&q.queue_table)) else {
                errors.push(format!("{key}.queue_table: unknown queue table {}", q.queue_table));
                continue;
            };
            if q.max_retries < 0 {
                errors.push(format!("{key}.max_retries: must be >= 0"));
            }
            if q.retry_delay < 0 {
                errors.push(format!("{key}.retry_delay: must be >= 0 (seconds)"));
            }
            let name = canon(&q.name);
            let info = QueueInfo {
                name: name.clone(),
                queue_table: canon(&t.name),
                payload: payload.clone(),
                multi_consumer: t.multiple_consumers && !q.exception,
                sort: *sort,
                enqueue_enabled: q.enqueue && !q.exception,
                dequeue_enabled: q.dequeue,
                max_retries: if q.exception { 0 } else { q.max_retries },
                retry_delay: q.retry_delay,
                retention: q.retention_time,
                is_exception_queue: q.exception,
                secure: t.secure,
                grouped: *grouped,
                exception_queue: exception_queue_name(&t.name),
                subscribers: Vec::new(),
                remote: None,
            };
            if queues.insert(name, info).is_some() {
                errors.push(format!("{key}: defined twice"));
            }
        }
    }

    /// `[[subscribers]]` checked (rule, transformation) and added to their multi-consumer
    /// queues.
    fn subscribers_of_queues(
        &self,
        transformations: &transformation::Transformations,
        queues: &mut BTreeMap<String, QueueInfo>,
        errors: &mut Vec<String>,
    ) {
        for (i, s) in self.subscribers.iter().enumerate() {
            let key = format!("subscribers[{i}] ({} on {})", s.name, s.queue);
            let rule = match s.rule.as_deref().map(Condition::parse) {
                None => None,
                Some(Ok(c)) => Some(c),
                Some(Err(e)) => {
                    errors.push(format!("{key}.rule: {e}"));
                    None
                }
            };
            match queues.get_mut(&canon(&s.queue)) {
                None => errors.push(format!("{key}.queue: unknown queue")),
                Some(q) if !q.multi_consumer => errors.push(format!("{key}.queue: not a multi-consumer queue")),
                Some(q) => {
                    let name = canon(&s.name);
                    if q.payload == PayloadKind::AnyData
                        && rule.as_ref().is_some_and(|r| {
                            r.names().iter().any(|n| matches!(n, crate::selector::NameRef::UserData(_)))
                        })
                    {
                        errors.push(format!(
                            "{key}.rule: tab.user_data cannot be looked into on a SYS.ANYDATA queue (rules may use message properties)"
                        ));
                    }
                    if q.subscribers.iter().any(|x| x.name == name) {
                        errors.push(format!("{key}: defined twice"));
                    }
                    let transformation = s.transformation.as_deref().and_then(|t| {
                        let key = format!("{key}.transformation");
                        transformation::check_use(transformations, t, &q.payload, None, &key)
                            .map_err(|e| errors.push(e))
                            .ok()
                    });
                    q.subscribers.push(Subscriber { name, rule, transformation });
                }
            }
        }
    }

    /// `[[agents]]` checked, by canonical name: credentials (`hash` for a clear-text
    /// password), protocols, database users. Names beginning `PROP$` are refused: they
    /// belong to propagation jobs.
    fn agents(
        &self,
        hash: &dyn Fn(&str) -> Result<String, String>,
        errors: &mut Vec<String>,
    ) -> BTreeMap<String, AgentInfo> {
        let mut agents = BTreeMap::new();
        for (i, a) in self.agents.iter().enumerate() {
            let key = format!("agents[{i}] ({})", a.name);
            let password_hash = match (&a.password, &a.password_hash) {
                (Some(_), Some(_)) => {
                    errors.push(format!("{key}: give password or password_hash, not both"));
                    None
                }
                (Some(p), None) => match hash(p) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        errors.push(format!("{key}.password: {e}"));
                        None
                    }
                },
                (None, Some(h)) => Some(h.clone()),
                (None, None) => None,
            };
            let mut http = false;
            let mut smtp = false;
            for p in &a.protocols {
                match p.to_ascii_lowercase().as_str() {
                    "http" => http = true,
                    "smtp" => smtp = true,
                    other => errors.push(format!("{key}.protocols: unknown protocol '{other}'")),
                }
            }
            let info = AgentInfo {
                name: canon(&a.name),
                password_hash,
                http,
                smtp,
                gateway: a.gateway,
                db_users: a.db_users.iter().map(|u| canon(u)).collect(),
                certificate_location: a.certificate_location.clone(),
                console: a.console.as_deref().and_then(|r| {
                    let role = ConsoleRole::parse(r);
                    if role.is_none() {
                        errors.push(format!("{key}.console: '{r}': one of viewer, reader, operator, admin"));
                    }
                    role
                }),
            };
            if agents.insert(canon(&a.name), info).is_some() {
                errors.push(format!("{key}: defined twice"));
            }
        }
        for a in agents.keys() {
            if propagation::is_job_agent(a) {
                errors.push(format!("agents ({a}): names beginning PROP$ belong to propagation jobs"));
            }
        }
        agents
    }

    /// `[[grants]]` checked, by (canonical user, queue): the enqueue and dequeue
    /// privileges, those of several grants of one pair together.
    fn grants(
        &self,
        queues: &BTreeMap<String, QueueInfo>,
        errors: &mut Vec<String>,
    ) -> BTreeMap<(String, String), (bool, bool)> {
        let mut grants = BTreeMap::new();
        for (i, g) in self.grants.iter().enumerate() {
            let key = format!("grants[{i}] ({} on {})", g.user, g.queue);
            let q = canon(&g.queue);
            if !queues.contains_key(&q) {
                errors.push(format!("{key}.queue: unknown queue"));
            }
            let (enq, deq) = match g.privilege.to_ascii_lowercase().as_str() {
                "enqueue" => (true, false),
                "dequeue" => (false, true),
                "all" => (true, true),
                other => {
                    errors.push(format!("{key}.privilege: '{other}' (enqueue, dequeue or all)"));
                    continue;
                }
            };
            let e = grants.entry((canon(&g.user), q)).or_insert((false, false));
            e.0 |= enq;
            e.1 |= deq;
        }
        grants
    }
}

/// A queue table as resolved: its declaration, payload type, sort order and grouping.
struct Table<'a> {
    def: &'a QueueTableDef,
    payload: PayloadKind,
    sort: SortOrder,
    grouped: bool,
}

/// Each queue table's default exception queue, `SCHEMA.AQ$_TABLE_E`: single-consumer,
/// closed for enqueue.
fn exception_queues(tables: &BTreeMap<String, Table<'_>>) -> BTreeMap<String, QueueInfo> {
    let mut queues = BTreeMap::new();
    for (table_name, Table { def: t, payload, sort, grouped }) in tables {
        let eq = exception_queue_name(table_name);
        queues.insert(
            eq.clone(),
            QueueInfo {
                name: eq.clone(),
                queue_table: table_name.clone(),
                payload: payload.clone(),
                multi_consumer: false,
                sort: *sort,
                enqueue_enabled: false,
                dequeue_enabled: true,
                max_retries: 0,
                retry_delay: 0,
                retention: Retention::None,
                is_exception_queue: true,
                secure: t.secure,
                grouped: *grouped,
                exception_queue: eq.clone(),
                subscribers: Vec::new(),
                remote: None,
            },
        );
    }
    queues
}

fn is_qualified(name: &str) -> bool {
    let mut parts = name.split('.');
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty())
}
