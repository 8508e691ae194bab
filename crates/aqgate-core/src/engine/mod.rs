//! The queue engine: AQ semantics over a [`Store`], with the clock injected.
//!
//! Enqueue (send/publish), dequeue (receive: REMOVE / BROWSE / LOCKED, FIRST / NEXT
//! navigation, selectors), registration, session commit and rollback, delay and
//! expiration. The engine decides; the store persists. One request runs in one store
//! transaction, so it is all-or-nothing.

pub mod admin;
mod buffered;
pub mod context;
mod dequeue;
mod enqueue;
mod fair;
mod grouping;
mod listen;
mod register;
pub mod schedule;
pub mod session;
mod staged;
mod synchronous;
mod time_manager;
mod transactions;
mod transform;
mod wake;
mod work;

pub use buffered::{BufferConfig, SHOWN_FOR, SHOWN_PAYLOAD_BYTES, SHOWN_ROWS};
pub use dequeue::{check_condition_names, header_of};
pub use enqueue::agent_from_json;
pub use transactions::session_expired_error;
pub use wake::Change;
use {dequeue::*, time_manager::*, transactions::*};

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::{Clock, Micros};
use crate::directory::Directory;
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::store::*;
use crate::topology::{AgentInfo, Catalog, QueueInfo, Topology};

pub use fair::Shares;
pub use schedule::ClientSchedule;
pub use session::{Abandon, Carried, HeldTx, IdempotencyClaim, JobTally, Session, SessionState, SessionTurn, Sessions};
pub use work::{ConditionLimits, DEFAULT_REQUEST_STEPS};

/// Tunables of the engine.
#[derive(Clone)]
pub struct EngineConfig {
    /// Longest a receive may wait (`wait_time` is capped to this; absent means this).
    pub max_wait: Duration,
    /// Idle sessions roll back after this long.
    pub session_timeout: Duration,
    /// Resolves `lookup_type="LDAP"` destinations and `agent_alias`es; without one they
    /// get a fault.
    pub directory: Option<Arc<dyn Directory>>,
    /// Which HTTP notification targets a registration may name.
    pub notify_policy: Arc<crate::notify_policy::Policy>,
    /// Which `mailto:` addresses a registration may name.
    pub notify_mail_policy: Arc<crate::notify_policy::MailPolicy>,
    /// The process's metrics registry (the store opened with it registers there too).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// How long an expired session's cookie is still answered "expired" (then "unknown").
    pub tombstone_ttl: Duration,
    /// How long a request performed under an idempotency key is remembered.
    pub idempotency_window: Duration,
    /// Buffered messages: flow control and spilling.
    pub buffered: BufferConfig,
    /// Recipients one message's `recipient_list` may name (Oracle's lists hold at most
    /// 1,024); a request with a longer list is refused whole (24031).
    pub max_recipients: usize,
    /// Receives one agent may have waiting at once (long polls); one more is answered at
    /// once, as a receive that does not wait.
    pub max_long_polls_per_agent: usize,
    /// What evaluating dequeue conditions, subscriber rules and transformations may cost
    /// (over it: 2393).
    pub conditions: ConditionLimits,
    /// Fair shares: open sessions and idempotency records per agent (see [`Shares`]).
    pub shares: Shares,
    /// Forwards the sends to synchronous remote queue spaces; without it, such a send gets
    /// the fault of an unreachable space.
    pub remote_spaces: Option<Arc<dyn crate::remote::RemoteSpaces>>,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("max_wait", &self.max_wait)
            .field("session_timeout", &self.session_timeout)
            .field("directory", &self.directory.is_some())
            .field("notify_policy", &self.notify_policy)
            .field("notify_mail_policy", &self.notify_mail_policy)
            .field("tombstone_ttl", &self.tombstone_ttl)
            .field("idempotency_window", &self.idempotency_window)
            .field("buffered", &self.buffered)
            .field("max_recipients", &self.max_recipients)
            .field("max_long_polls_per_agent", &self.max_long_polls_per_agent)
            .field("conditions", &self.conditions)
            .field("shares", &self.shares)
            .field("remote_spaces", &self.remote_spaces.is_some())
            .finish()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_secs(60),
            session_timeout: Duration::from_secs(300),
            directory: None,
            notify_policy: Arc::new(crate::notify_policy::Policy::default()),
            notify_mail_policy: Arc::new(crate::notify_policy::MailPolicy::default()),
            metrics: crate::metrics::Metrics::new(),
            tombstone_ttl: Duration::from_secs(24 * 3600),
            idempotency_window: Duration::from_secs(24 * 3600),
            buffered: BufferConfig::default(),
            max_recipients: DEFAULT_MAX_RECIPIENTS,
            max_long_polls_per_agent: DEFAULT_MAX_LONG_POLLS_PER_AGENT,
            conditions: ConditionLimits::default(),
            shares: Shares::default(),
            remote_spaces: None,
        }
    }
}

/// The default of [`EngineConfig::max_recipients`]: Oracle's limit.
pub const DEFAULT_MAX_RECIPIENTS: usize = 1024;

/// The default of [`EngineConfig::max_long_polls_per_agent`].
pub const DEFAULT_MAX_LONG_POLLS_PER_AGENT: usize = 100;

/// The catalog plus the store's queue ids.
#[derive(Debug, Default)]
pub struct Resolved {
    pub catalog: Catalog,
    pub ids: HashMap<String, QueueId>,
    pub names: HashMap<QueueId, String>,
}

impl Resolved {
    fn queue(&self, name: &str) -> Result<(&QueueInfo, QueueId), AqError> {
        let q = self.catalog.queue(name).ok_or_else(|| self.no_such_queue(name))?;
        let id = *self.ids.get(&q.name).ok_or_else(|| AqError::no_such_queue(name))?;
        Ok((q, id))
    }

    /// 24010, saying so when the name is in a remote queue space that does not map it (the
    /// TEDG's QMEBADQUEUE, where an unknown space is its TPENOENT).
    fn no_such_queue(&self, name: &str) -> AqError {
        let full = crate::topology::canon(name);
        let Some(space) = full.split_once('.').and_then(|(s, _)| self.catalog.remote_spaces.get(s)) else {
            return AqError::no_such_queue(name);
        };
        let mapped: Vec<&str> = space.queues.keys().map(String::as_str).collect();
        AqError::client(
            code::NO_SUCH_QUEUE,
            format!(
                "queue {full} does not exist: remote queue space {} maps no such queue (it maps {})",
                space.name,
                mapped.join(", ")
            ),
        )
    }
}

pub struct Engine {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    resolved: RwLock<Arc<Resolved>>,
    /// Receives waiting for a change on their queue (see `wake`).
    waiters: wake::Waiters,
    /// Rung on commits that make messages visible on a queue with registrations (the
    /// notification dispatcher).
    commits: Arc<Notify>,
    /// Queues with registrations, as last seen (see [`Engine::refresh_registered`]): only
    /// their commits wake the dispatcher, so queues nobody registered for cost it nothing.
    registered: RwLock<std::collections::HashSet<QueueId>>,
    /// Held while the queue has registrations, by an engine whose dispatcher refreshes them.
    registered_interest: tokio::sync::Mutex<HashMap<QueueId, crate::store::Interest>>,
    pub sessions: Sessions,
    stored_sessions: std::sync::atomic::AtomicI64,
    /// Agents that requests may still act as after they left the topology, while an
    /// [`AgentRetained`] lasts (with how many): a removed propagation job's, so that its batch
    /// in flight can commit (a non-forced removal).
    retained: StdMutex<HashMap<String, (AgentInfo, usize)>>,
    /// This process's buffered messages (lost with it, unless spilled).
    buffers: buffered::Buffers,
    /// Requests refused for a recipient list over [`EngineConfig::max_recipients`].
    recipients_refused: crate::metrics::Counter,
    /// Receives waiting now, per agent (see [`EngineConfig::max_long_polls_per_agent`]).
    long_polls: StdMutex<HashMap<String, usize>>,
    /// Receives answered without waiting because their agent had its long polls waiting.
    long_polls_refused: crate::metrics::Counter,
    /// Receives waiting now, all agents together.
    long_polls_waiting: crate::metrics::Gauge,
    /// Requests refused for a condition, rule or transformation over its budget.
    condition_refused: crate::metrics::Counter,
    /// Per-agent shares: the idempotency records' usage as last counted, the counters.
    fair: fair::Fair,
    /// Wake-ups of waiting receives settled in memory: nothing that arrived passed their
    /// selector, so they did not look in the store again.
    long_poll_wakes_judged: crate::metrics::Counter,
    /// What open transactions enqueued, for their commits' wake-ups (see `staged`).
    staged: staged::Staged,
}

/// One agent's place among the receives waiting now; given back when dropped.
pub(super) struct LongPoll<'a> {
    engine: &'a Engine,
    agent: String,
}

impl Drop for LongPoll<'_> {
    fn drop(&mut self) {
        let mut m = self.engine.long_polls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.agent) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.agent);
            }
        }
        self.engine.long_polls_waiting.set(m.values().map(|n| *n as u64).sum());
    }
}

/// Keeps an agent usable by [`Engine::execute`] after a reload removed it, until dropped
/// (see [`Engine::retain_agent`]).
pub struct AgentRetained {
    engine: Arc<Engine>,
    name: String,
}

impl Drop for AgentRetained {
    fn drop(&mut self) {
        let mut r = self.engine.retained.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = r.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                r.remove(&self.name);
            }
        }
    }
}

/// What the store knows of a session id (see [`Engine::resume`]).
#[derive(Debug)]
pub enum Resumed {
    Live(Box<Session>),
    /// Timed out; `had_work`: its uncommitted work was rolled back.
    Ended {
        agent: String,
        had_work: bool,
    },
    Unknown,
}

/// Candidates fetched per store round trip while scanning for a selector match.
const SCAN_BATCH: i64 = 64;

impl Engine {
    /// Builds the engine: rolls back what a previous process left open, loads the
    /// topology from the store.
    pub async fn start(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Arc<Self>, AqError> {
        let rolled_back = store.recover().await?;
        if rolled_back > 0 {
            tracing::info!(rows = rolled_back, "rolled back uncommitted work that no stored session owns");
        }
        Self::attach(store, clock, config).await
    }

    /// An engine for a process that shares the store with a running servlet (e.g. `aqgate
    /// smtp`): it skips recovery (which never touches stored sessions' work anyway).
    pub async fn attach(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Arc<Self>, AqError> {
        let buffers = buffered::Buffers::new(config.buffered.clone(), &config.metrics);
        let recipients_refused = config.metrics.counter(
            "aqgate_recipient_list_refused_total",
            "Enqueues refused for a recipient list longer than --max-recipients (also those the parser \
             stops at, far over it).",
        );
        let long_polls_refused = config.metrics.counter(
            "aqgate_long_polls_refused_total",
            "Receives answered without waiting because their agent had --max-long-polls-per-agent waiting.",
        );
        let condition_refused = config.metrics.counter(
            "aqgate_condition_budget_refused_total",
            "Requests refused (2393) for a condition, rule or transformation over its work budget.",
        );
        let fair = fair::Fair::new(&config.metrics);
        let long_poll_wakes_judged = config.metrics.counter(
            "aqgate_long_poll_wakes_judged_total",
            "Wake-ups of waiting receives settled without looking in the store: no message that arrived passed their selector.",
        );
        let engine = Arc::new(Self {
            fair,
            buffers,
            long_poll_wakes_judged,
            recipients_refused,
            long_polls: StdMutex::new(HashMap::new()),
            long_polls_refused,
            long_polls_waiting: config
                .metrics
                .gauge("aqgate_long_polls_waiting", "Receives waiting for a message now (long polls), all agents."),
            condition_refused,
            store,
            clock,
            config,
            resolved: RwLock::new(Arc::new(Resolved::default())),
            waiters: wake::Waiters::default(),
            staged: staged::Staged::default(),
            commits: Arc::new(Notify::new()),
            registered: RwLock::new(std::collections::HashSet::new()),
            registered_interest: tokio::sync::Mutex::new(HashMap::new()),
            sessions: Sessions::default(),
            stored_sessions: std::sync::atomic::AtomicI64::new(0),
            retained: StdMutex::new(HashMap::new()),
        });
        engine.reload().await?;
        Ok(engine)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Loads the session `id` from the store, as it is now (any process may have served
    /// it last). Take its [`Sessions::turn`] first, so that requests of this process take
    /// turns.
    pub async fn resume(&self, id: &str) -> Result<Resumed, AqError> {
        Ok(match self.store.session_get(&session::id_hash(id)).await? {
            SessionLookup::Live(row) => match Session::from_row(id, &row) {
                Some(s) => Resumed::Live(Box::new(s)),
                None => {
                    tracing::error!(agent = %row.agent, "a stored session's navigation positions are unreadable");
                    return Err(AqError::server(code::INTERNAL, "the session's stored state is unreadable"));
                }
            },
            SessionLookup::Ended { agent, had_work } => Resumed::Ended { agent, had_work },
            SessionLookup::Unknown => Resumed::Unknown,
        })
    }

    /// Sessions the store held at the last look (the background duties count them), plus
    /// those this process stored since.
    pub fn stored_sessions(&self) -> i64 {
        self.stored_sessions.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// The clock the engine takes its time from (also the servlet's, for its caches).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Reloads the topology from the store (after `admin apply`).
    pub async fn reload(&self) -> Result<(), AqError> {
        let resolved = load_resolved(self.store.as_ref()).await?;
        *self.resolved.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(resolved);
        Ok(())
    }

    pub fn resolved(&self) -> Arc<Resolved> {
        self.resolved.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn agent(&self, name: &str) -> Option<AgentInfo> {
        self.resolved().catalog.agent(name).cloned()
    }

    /// Keeps agent `name`, as the topology has it now, usable by [`Engine::execute`] until
    /// the guard is dropped, should a reload remove it meanwhile (where the topology still
    /// has it, the topology's version counts). Logins never see a retained agent. `None` if
    /// the topology has no such agent.
    pub fn retain_agent(self: &Arc<Self>, name: &str) -> Option<AgentRetained> {
        let agent = self.agent(name)?;
        let mut r = self.retained.lock().unwrap_or_else(|p| p.into_inner());
        r.entry(agent.name.clone()).or_insert_with(|| (agent.clone(), 0)).1 += 1;
        Some(AgentRetained { engine: self.clone(), name: agent.name })
    }

    fn acting_agent(&self, resolved: &Resolved, name: &str) -> Option<AgentInfo> {
        resolved.catalog.agent(name).cloned().or_else(|| {
            let r = self.retained.lock().unwrap_or_else(|p| p.into_inner());
            r.get(name).map(|(a, _)| a.clone())
        })
    }

    /// A place for one more of `agent`'s receives to wait, if it has fewer than
    /// [`EngineConfig::max_long_polls_per_agent`] waiting (else counted as refused).
    pub(super) fn long_poll(&self, agent: &str) -> Option<LongPoll<'_>> {
        let mut m = self.long_polls.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(agent.to_string()).or_insert(0);
        if *n >= self.config.max_long_polls_per_agent {
            drop(m);
            self.long_polls_refused.inc();
            return None;
        }
        *n += 1;
        self.long_polls_waiting.set(m.values().map(|n| *n as u64).sum());
        Some(LongPoll { engine: self, agent: agent.to_string() })
    }

    /// Wakes long-polls waiting on `queue` (each looks again), and the notification
    /// dispatcher.
    pub fn wake(&self, queue: QueueId) {
        self.wake_with(queue, &Change::Unknown);
    }

    /// Tells `queue`'s long polls that `messages`, just committed, are the only change: only
    /// the waiters of their consumers are woken, and those look again only if one of them
    /// passes their selector. Wakes the notification dispatcher as [`Engine::wake`] does.
    pub(super) fn wake_arrived(&self, queue: QueueId, messages: Vec<NewMessage>) {
        let change = if self.waiters.any(queue) { Change::Arrived(messages.into()) } else { Change::Unknown };
        self.wake_with(queue, &change);
    }

    /// Tells each queue's long polls what a commit made visible there (see `staged`).
    pub(super) fn wake_visible(&self, visible: staged::Visible) {
        for (q, change) in visible {
            self.wake_with(q, &change);
        }
    }

    /// Tells `queue`'s long polls what changed, and wakes the notification dispatcher.
    pub fn wake_with(&self, queue: QueueId, change: &Change) {
        self.waiters.wake(queue, change);
        if self.registered.read().unwrap_or_else(|p| p.into_inner()).contains(&queue) {
            // A stored permit: a dispatcher busy when the commit lands still sees it.
            self.commits.notify_one();
        }
    }

    /// Reloads which queues have registrations (the dispatcher does this periodically, for
    /// registrations made by other processes; this process's own registrations update it at
    /// once). A queue missing here only delays its notifications until the dispatcher's
    /// next look; the outbox row exists regardless.
    pub async fn refresh_registered(&self) -> Result<(), AqError> {
        let set: std::collections::HashSet<QueueId> =
            self.store.all_registrations().await?.into_iter().map(|r| r.queue).collect();
        // The dispatcher's interest in those queues, so that other processes' commits
        // signal them (see `Store::interest`).
        let mut interests = self.registered_interest.lock().await;
        interests.retain(|q, _| set.contains(q));
        for q in &set {
            if !interests.contains_key(q) {
                interests.insert(*q, self.store.interest(*q).await?);
            }
        }
        drop(interests);
        *self.registered.write().unwrap_or_else(|p| p.into_inner()) = set;
        Ok(())
    }

    /// Rung on every commit that makes messages visible (in this process, or in another
    /// one on PostgreSQL, through LISTEN/NOTIFY).
    pub fn commit_signal(&self) -> Arc<Notify> {
        self.commits.clone()
    }

    /// Performs one IDAP document: its header entries (e.g. a transaction id) are kept on
    /// the session for the duration of the request, then the method runs.
    pub async fn execute_envelope(
        &self,
        session: &mut Session,
        envelope: Envelope<Request>,
    ) -> Result<Response, AqError> {
        session.headers = envelope.headers;
        if !session.headers.is_empty() {
            tracing::debug!(
                headers = ?session.headers.iter().map(|h| h.local_name().to_string()).collect::<Vec<_>>(),
                "IDAP header entries"
            );
        }
        let result = self.execute(session, envelope.body).await;
        session.headers.clear();
        result
    }

    /// Performs one IDAP request in `session` for `agent`. What the request leaves of the
    /// session is written to the store in the request's own database transaction (see
    /// [`Engine::seal`]); a stored session's use is recorded even when the request fails.
    pub async fn execute(&self, session: &mut Session, request: Request) -> Result<Response, AqError> {
        session.last_used = self.now();
        if session.idempotency.is_some() {
            self.count_records(&session.agent).await;
        }
        let result = self.execute_inner(session, request).await;
        match (result, session.stored) {
            (Err(e), Some(version)) => Err(self.after_failure(session, version, e).await),
            (r, _) => r,
        }
    }

    async fn execute_inner(&self, session: &mut Session, request: Request) -> Result<Response, AqError> {
        let commits = match &request {
            Request::Send(r) | Request::Publish(r) => r.commit,
            Request::Receive(r) => r.commit,
            Request::Listen(_) => false,
            Request::Register(r) => r.commit,
            Request::Commit => true,
            Request::Rollback => false,
        };
        // A request that would leave a new session open, of an agent just found at its
        // session cap: refused before any of its work (see `fair`).
        let opens = !commits
            && match &request {
                Request::Send(_) | Request::Publish(_) => true,
                Request::Receive(r) => r.consumer.dequeue_mode != DequeueMode::Browse,
                Request::Listen(_) | Request::Register(_) | Request::Commit | Request::Rollback => false,
            };
        if opens {
            self.refuse_known_at_cap(session)?;
        }
        if commits && !session.intact {
            // Also with nothing pending: the write that made it pending may be the lost one.
            tracing::warn!("the database restarted since a write of a session's transaction; its commit is refused");
            return Err(transaction_lost_error());
        }
        if session.held.is_active() && !continues_held(&request) {
            return Err(AqError::server(
                code::INTERNAL,
                "a propagation batch's held transaction goes on with a persistent send, a commit or a rollback",
            ));
        }
        if session.schedule.is_some() && !matches!(request, Request::Send(_) | Request::Publish(_)) {
            return Err(AqError::invalid("AQ-Schedule applies to AQXmlSend and AQXmlPublish only"));
        }
        let resolved = self.resolved();
        let agent = self
            .acting_agent(&resolved, &session.agent)
            .ok_or_else(|| AqError::client(code::NOT_PERMITTED, "agent no longer exists"))?;
        match request {
            Request::Send(r) => {
                self.enqueue(&resolved, session, &agent, r, |res| Response::Send(StatusResponse::ok(), Some(res))).await
            }
            Request::Publish(r) => {
                self.enqueue(&resolved, session, &agent, r, |res| Response::Publish(StatusResponse::ok(), Some(res)))
                    .await
            }
            Request::Receive(r) => {
                let res = self.receive(&resolved, session, &agent, r).await?;
                Ok(Response::Receive(StatusResponse::ok(), Some(res)))
            }
            Request::Listen(r) => {
                let res = self.listen(&resolved, session, &agent, r).await?;
                Ok(Response::Listen(StatusResponse::ok(), Some(res)))
            }
            Request::Register(r) => {
                self.register(&resolved, session, &agent, r).await?;
                Ok(Response::Register(StatusResponse::ok()))
            }
            Request::Commit => {
                self.commit(session).await?;
                Ok(Response::Commit(StatusResponse::ok()))
            }
            Request::Rollback => {
                self.rollback(&resolved, session).await?;
                Ok(Response::Rollback(StatusResponse::ok()))
            }
        }
    }
}

/// Whether `request` may continue a session's held transaction (`HeldTx`): a persistent
/// ON_COMMIT send or publish (whose rows need no publishing: the held transaction hides
/// them until it commits), which commits it or leaves it held, a commit or a rollback.
fn continues_held(request: &Request) -> bool {
    match request {
        Request::Send(r) | Request::Publish(r) => {
            r.producer.visibility == Visibility::OnCommit && r.producer.delivery_mode == DeliveryMode::Persistent
        }
        Request::Commit | Request::Rollback => true,
        Request::Receive(_) | Request::Listen(_) | Request::Register(_) => false,
    }
}

impl Engine {
    /// The database queue name a destination stands for: as written, or resolved through
    /// the directory for `lookup_type="LDAP"`.
    async fn destination_name(&self, d: &Destination) -> Result<String, AqError> {
        let name = d.name.trim();
        if d.lookup == LookupType::Database {
            return Ok(name.to_string());
        }
        let Some(dir) = &self.config.directory else {
            return Err(AqError::client(
                code::DIRECTORY,
                format!("lookup_type=\"LDAP\" for destination '{name}' needs a directory, and none is configured"),
            ));
        };
        match dir.resolve_queue(name).await {
            Ok(q) => Ok(q),
            Err(crate::directory::DirectoryError::NotFound(_)) => {
                Err(AqError::client(code::NO_SUCH_QUEUE, format!("queue {name} not found in the directory")))
            }
            Err(e) => Err(AqError::directory(e, &format!("destination {name}"))),
        }
    }
}

/// A queue of a remote queue space is for sending only, as the TEDG offers no dequeue from
/// one: only the job that forwards its messages takes them.
fn not_remote(queue: &QueueInfo, agent: &AgentInfo, what: &str) -> Result<(), AqError> {
    match &queue.remote {
        Some(r) if agent.name != r.drain_agent => Err(AqError::client(
            code::DEQUEUE_DISABLED,
            format!(
                "{what} {} is not offered: it is a queue of remote queue space {}, forwarded to {} at {}",
                queue.name, r.space, r.queue, r.url
            ),
        )),
        _ => Ok(()),
    }
}

fn not_permitted(agent: &AgentInfo, what: &str, queue: &str) -> AqError {
    AqError::client(
        code::NOT_PERMITTED,
        format!("insufficient privileges: agent {} may not {what} {queue}", agent.name),
    )
}

/// Loads the topology rows and queue ids from the store into a [`Resolved`].
pub async fn load_resolved(store: &dyn Store) -> Result<Resolved, AqError> {
    let topo = topology_from_rows(&store.load_topology().await?)?;
    let catalog = topo
        .resolve(&|_| Err("clear-text password in stored topology".into()))
        .map_err(|e| AqError::server(code::INTERNAL, format!("stored topology is invalid: {}", e.join("; "))))?;
    let mut ids = HashMap::new();
    let mut names = HashMap::new();
    for (name, id) in store.queue_ids().await? {
        if catalog.queues.contains_key(&name) {
            names.insert(id, name.clone());
            ids.insert(name, id);
        }
    }
    Ok(Resolved { catalog, ids, names })
}

/// Rebuilds a [`Topology`] from the store's (kind, name, spec) rows.
pub fn topology_from_rows(rows: &[(String, String, String)]) -> Result<Topology, AqError> {
    let mut t = Topology::default();
    for (kind, name, spec) in rows {
        let bad = |e: serde_json::Error| {
            AqError::server(code::INTERNAL, format!("stored topology object {kind} {name}: {e}"))
        };
        match kind.as_str() {
            "type" => t.types.push(serde_json::from_str(spec).map_err(bad)?),
            "queue_table" => t.queue_tables.push(serde_json::from_str(spec).map_err(bad)?),
            "queue" => t.queues.push(serde_json::from_str(spec).map_err(bad)?),
            "subscriber" => t.subscribers.push(serde_json::from_str(spec).map_err(bad)?),
            "agent" => t.agents.push(serde_json::from_str(spec).map_err(bad)?),
            "grant" => t.grants.push(serde_json::from_str(spec).map_err(bad)?),
            "propagation" => t.propagations.push(serde_json::from_str(spec).map_err(bad)?),
            "remote_queue_space" => t.remote_queue_spaces.push(serde_json::from_str(spec).map_err(bad)?),
            "transformation" => t.transformations.push(serde_json::from_str(spec).map_err(bad)?),
            "gateway_link" => t.gateway.links.push(serde_json::from_str(spec).map_err(bad)?),
            "foreign_queue" => t.gateway.foreign_queues.push(serde_json::from_str(spec).map_err(bad)?),
            "gateway_job" => t.gateway.jobs.push(serde_json::from_str(spec).map_err(bad)?),
            _ => {}
        }
    }
    Ok(t)
}
