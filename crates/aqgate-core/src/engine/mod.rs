//! The queue engine: AQ semantics over a [`Store`], with the clock injected.
//!
//! Enqueue (send/publish), dequeue (receive: REMOVE / BROWSE / LOCKED, FIRST / NEXT
//! navigation, selectors), registration, session commit and rollback, delay and
//! expiration. The engine decides; the store persists. One request runs in one store
//! transaction, so it is all-or-nothing.

pub mod context;
pub mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::{Clock, MICROS_PER_SEC, Micros};
use crate::directory::Directory;
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::payload;
use crate::selector::Condition;
use crate::store::*;
use crate::topology::{AgentInfo, Catalog, Privilege, QueueInfo, SortOrder, Topology, canon};

pub use session::{Abandon, IdempotencyClaim, Session, SessionState, SessionTurn, Sessions};

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
    /// How long an expired session's cookie is still answered "expired" (then "unknown").
    pub tombstone_ttl: Duration,
    /// How long a request performed under an idempotency key is remembered.
    pub idempotency_window: Duration,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("max_wait", &self.max_wait)
            .field("session_timeout", &self.session_timeout)
            .field("directory", &self.directory.is_some())
            .field("notify_policy", &self.notify_policy)
            .field("tombstone_ttl", &self.tombstone_ttl)
            .field("idempotency_window", &self.idempotency_window)
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
            tombstone_ttl: Duration::from_secs(24 * 3600),
            idempotency_window: Duration::from_secs(24 * 3600),
        }
    }
}

/// The catalog plus the store's queue ids.
#[derive(Debug, Default)]
pub struct Resolved {
    pub catalog: Catalog,
    pub ids: HashMap<String, QueueId>,
    pub names: HashMap<QueueId, String>,
}

impl Resolved {
    fn queue(&self, name: &str) -> Result<(&QueueInfo, QueueId), AqError> {
        let q = self.catalog.queue(name).ok_or_else(|| AqError::no_such_queue(name))?;
        let id = *self.ids.get(&q.name).ok_or_else(|| AqError::no_such_queue(name))?;
        Ok((q, id))
    }
}

pub struct Engine {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: EngineConfig,
    resolved: RwLock<Arc<Resolved>>,
    wakers: StdMutex<HashMap<QueueId, Arc<Notify>>>,
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
        let engine = Arc::new(Self {
            store,
            clock,
            config,
            resolved: RwLock::new(Arc::new(Resolved::default())),
            wakers: StdMutex::new(HashMap::new()),
            commits: Arc::new(Notify::new()),
            registered: RwLock::new(std::collections::HashSet::new()),
            registered_interest: tokio::sync::Mutex::new(HashMap::new()),
            sessions: Sessions::default(),
            stored_sessions: std::sync::atomic::AtomicI64::new(0),
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

    fn waker(&self, queue: QueueId) -> Arc<Notify> {
        let mut w = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        w.entry(queue).or_insert_with(|| Arc::new(Notify::new())).clone()
    }

    /// Wakes long-polls waiting on `queue`, and the notification dispatcher.
    pub fn wake(&self, queue: QueueId) {
        self.waker(queue).notify_waiters();
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
        let result = self.execute_inner(session, request).await;
        match (result, session.stored) {
            (Err(e), Some(version)) => Err(self.after_failure(session, version, e).await),
            (r, _) => r,
        }
    }

    /// A stored session's request failed: if another request (another process) changed
    /// or ended the session meanwhile, this one ran on a stale copy, and says so instead;
    /// else its use is recorded (it counts as activity for the idle timeout).
    async fn after_failure(&self, session: &Session, version: i64, e: AqError) -> AqError {
        if e.code == code::SESSION_EXPIRED {
            return e;
        }
        if e.code == code::SESSION_BUSY {
            // The request's transaction is gone by now (on SQLite it holds the one
            // connection): look whether the session still lives.
            return self.session_conflict(session).await;
        }
        let hash = session.id_hash();
        match self.store.session_get(&hash).await {
            Ok(SessionLookup::Live(row)) if row.version == version => {
                if let Err(e) = self.store.session_touch(&hash, session.last_used).await {
                    tracing::warn!(error = %e, "recording a session's use");
                }
                e
            }
            Ok(_) => self.session_conflict(session).await,
            Err(_) => e,
        }
    }

    /// Whether the request being performed must write down what it leaves (the session's
    /// row, its idempotency record) in its own transaction: one-statement fast paths are
    /// only for requests with neither.
    fn sealed(&self, session: &Session) -> bool {
        session.stored.is_some() || session.idempotency.is_some()
    }

    /// Writes, inside the request's transaction `tx`, what the request leaves: the session
    /// row (once the session holds anything, for as long as it lives) and, under an
    /// idempotency key, the response. Returns the row's new version, if it wrote one. A
    /// session changed or ended meanwhile by another request (another process) fails the
    /// request, so that `tx` is rolled back and nothing of it happened.
    async fn seal(
        &self,
        tx: &mut dyn StoreTx,
        session: &Session,
        next: &SessionState,
        response: Option<&Response>,
    ) -> Result<Option<i64>, AqError> {
        let mut version = None;
        if session.stored.is_some() || next.holds_anything() {
            let v = session.stored.map_or(1, |v| v + 1);
            let row = SessionRow {
                id_hash: session.id_hash(),
                agent: session.agent.clone(),
                txn: next.txn.clone(),
                pending: next.pending,
                dequeued: next.dequeued,
                enqueued: i64::try_from(next.enqueued).unwrap_or(i64::MAX),
                positions: next.positions_json(),
                last_used: session.last_used,
                version: v,
                intact: true,
            };
            if !tx.session_put(&row).await? {
                // Told apart (busy or expired) once `tx` is gone: see `after_failure`.
                return Err(session_busy_error());
            }
            version = Some(v);
        }
        if let Some(claim) = &session.idempotency {
            let Some(response) = response else {
                return Err(AqError::server(code::INTERNAL, "no response to record for the idempotency key"));
            };
            let rec = IdempotencyRecord {
                agent: session.agent.clone(),
                key: claim.key.clone(),
                request_hash: claim.request_hash.clone(),
                response: crate::idap::write_response(&Envelope { headers: Vec::new(), body: response.clone() })
                    .into_bytes(),
                created_at: self.now(),
            };
            if !tx.idempotency_put(&rec).await? {
                return Err(AqError::client(
                    code::IDEMPOTENCY_IN_PROGRESS,
                    "a request with this Idempotency-Key was performed meanwhile; send it again for its response",
                ));
            }
        }
        Ok(version)
    }

    /// Commits a request's transaction; a session write the backend made with a later
    /// statement that found another version fails it here (see `StoreTx::session_put`).
    async fn commit_tx(&self, tx: Box<dyn StoreTx>) -> Result<(), AqError> {
        match tx.commit().await {
            Ok(()) => Ok(()),
            Err(e) if e.is_session_conflict() => Err(session_busy_error()),
            Err(e) => {
                tracing::error!(error = %e, "store failure at commit");
                Err(AqError::server(
                    code::INTERNAL,
                    "the database did not confirm the commit: the request may or may not have been performed \
                     (with an Idempotency-Key, send it again to learn which)",
                ))
            }
        }
    }

    /// The fault for a session whose row another request changed or ended (called with
    /// no transaction of the request open).
    async fn session_conflict(&self, session: &Session) -> AqError {
        match self.store.session_get(&session.id_hash()).await {
            // Older than what this process wrote: the database lost writes (a crash of
            // PostgreSQL after provisional ones), not a concurrent request.
            Ok(SessionLookup::Live(row)) if session.stored.is_some_and(|v| row.version < v) => {
                tracing::warn!(agent = %row.agent, "a session's row is older than its last write: the database lost writes");
                transaction_lost_error()
            }
            Ok(SessionLookup::Live(_)) => session_busy_error(),
            Ok(_) if session.stored.is_some() => session_expired_error(),
            // A new session's id taken meanwhile (128 random bits: not in practice).
            _ => AqError::server(code::INTERNAL, "the session could not be stored; the request was not performed"),
        }
    }

    /// Takes on what a performed request left of the session.
    fn settle(&self, session: &mut Session, next: SessionState, version: Option<i64>) {
        let ended = next.txn != session.txn;
        session.set_state(next);
        if ended {
            session.intact = true;
        }
        if version.is_some() {
            if session.stored.is_none() {
                self.stored_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            session.stored = version;
        }
    }

    /// Writes a change of the session that came with no other effect (a browse that
    /// reached the end of the queue), in a transaction of its own.
    async fn seal_alone(&self, session: &mut Session, next: SessionState) -> Result<(), AqError> {
        if session.stored.is_none() && !next.holds_anything() {
            session.set_state(next);
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        let v = self.seal(&mut *tx, session, &next, None).await?;
        self.commit_tx(tx).await?;
        self.settle(session, next, v);
        Ok(())
    }

    async fn execute_inner(&self, session: &mut Session, request: Request) -> Result<Response, AqError> {
        let commits = match &request {
            Request::Send(r) | Request::Publish(r) => r.commit,
            Request::Receive(r) => r.commit,
            Request::Register(r) => r.commit,
            Request::Commit => true,
            Request::Rollback => false,
        };
        if commits && !session.intact {
            // Also with nothing pending: the write that made it pending may be the lost one.
            tracing::warn!("the database restarted since a write of a session's transaction; its commit is refused");
            return Err(transaction_lost_error());
        }
        let resolved = self.resolved();
        let agent = resolved
            .catalog
            .agent(&session.agent)
            .cloned()
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

    async fn enqueue(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: EnqueueRequest,
        wrap: fn(EnqueueResult) -> Response,
    ) -> Result<Response, AqError> {
        let dest = self.destination_name(&req.producer.destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        let mut req = req;
        for m in &mut req.messages {
            self.resolve_aliases(&mut m.header).await?;
        }
        if !resolved.catalog.permits(agent, queue, Privilege::Enqueue) {
            return Err(not_permitted(agent, "enqueue to", &queue.name));
        }
        if !queue.enqueue_enabled {
            return Err(AqError::client(
                code::ENQUEUE_DISABLED,
                format!("enqueue failed, queue {} is disabled for enqueueing", queue.name),
            ));
        }
        if req.producer.transformation.is_some() {
            return Err(AqError::invalid("transformations are not supported"));
        }
        let now = self.now();
        let immediate = req.producer.visibility == Visibility::Immediate;
        let commit_now = immediate || req.commit;
        let mut rows = Vec::with_capacity(req.messages.len());
        let mut ids = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            let n = m.number.unwrap_or(u32::try_from(i + 1).unwrap_or(u32::MAX));
            let row = self
                .new_message(resolved, queue, qid, m, now, if commit_now { None } else { Some(session.txn.clone()) })
                .map_err(|e| AqError { message: format!("message {n}: {}", e.message), ..e })?;
            ids.push(payload::hex_upper(&row.msgid));
            rows.push(row);
        }
        let mut woken = vec![qid];
        let commit_session = req.commit && session.pending;
        let mut next = session.state();
        if req.commit {
            next.end_transaction();
        } else if !immediate {
            next.pending = true;
            next.enqueued += rows.len() as u64;
        }
        let response = wrap(EnqueueResult { destination: queue.name.clone(), message_ids: ids });
        let version = if commit_now && !commit_session && !self.sealed(session) {
            // Nothing else to commit and no session row to write: one atomic write where
            // the backend can.
            self.store.insert_committed(&rows, session.origin).await?;
            None
        } else {
            // Tagged rows, published by a later durable commit: see `begin_provisional`.
            let provisional = !commit_now;
            let mut tx = if provisional { self.store.begin_provisional().await? } else { self.store.begin().await? };
            // Sealed first: a backend may write the session row with the insert.
            let v = self.seal(&mut *tx, session, &next, Some(&response)).await?;
            tx.insert_messages(&rows).await?;
            if commit_session {
                woken.extend(publish(&mut *tx, session, session.dequeued).await?);
            }
            self.commit_tx(tx).await?;
            v
        };
        self.settle(session, next, version);
        if commit_now {
            for q in woken {
                self.wake(q);
            }
        }
        Ok(response)
    }

    fn new_message(
        &self,
        resolved: &Resolved,
        queue: &QueueInfo,
        qid: QueueId,
        m: &Message,
        now: Micros,
        enq_txn: Option<String>,
    ) -> Result<NewMessage, AqError> {
        let h = &m.header;
        if h.message_id.is_some() {
            return Err(AqError::invalid("message_id is assigned by the server; do not send it"));
        }
        if h.message_state.is_some() || h.delivery_count.is_some() {
            return Err(AqError::invalid("message_state and delivery_count are filled in at dequeue"));
        }
        if let Some(c) = &h.correlation
            && c.chars().count() > 128
        {
            return Err(AqError::invalid("correlation is longer than 128 characters"));
        }
        let delay = h.delay.unwrap_or(0);
        if delay < 0 {
            return Err(AqError::invalid("delay must not be negative"));
        }
        let expiration = h.expiration.unwrap_or(-1);
        if expiration < -1 || expiration == 0 {
            return Err(AqError::invalid("expiration must be a positive number of seconds, or -1 (never)"));
        }
        let priority = h.priority.unwrap_or(1);
        let sender = match &h.sender_id {
            Some(a) => {
                if a.alias.is_some() {
                    return Err(AqError::client(
                        code::DIRECTORY,
                        "sender_id agent_alias needs the directory, which is not configured",
                    ));
                }
                Some(agent_json(a))
            }
            None => None,
        };
        if let Some(eq) = &h.exception_queue {
            if eq.trim().is_empty() {
                return Err(AqError::invalid("exception_queue is empty"));
            }
            // A message can only be moved within its queue table, to a queue made for
            // failed messages (a name that does not exist yet is resolved at the move).
            if let Some(target) = resolved.catalog.queue(eq)
                && !exception_queue_of(target, queue)
            {
                return Err(AqError::invalid(format!(
                    "exception_queue {} is not an exception queue of queue table {}",
                    target.name, queue.queue_table
                )));
            }
        }
        let payload = payload::encode(&queue.payload, &resolved.catalog.types, &m.payload)
            .map_err(|e| AqError::client(code::PAYLOAD_MISMATCH, format!("payload does not match queue type: {e}")))?;
        // UUIDv7: time-ordered, so the unique index on message ids is appended to, not
        // written at random pages; 74 random bits keep them unique across processes.
        let msgid = *uuid::Uuid::now_v7().as_bytes();
        let delay_until = (delay > 0).then(|| now.saturating_add(delay.saturating_mul(MICROS_PER_SEC)));
        let expire_at = (expiration > 0)
            .then(|| now.saturating_add(delay.saturating_add(expiration).saturating_mul(MICROS_PER_SEC)));
        let mut row = NewMessage {
            msgid,
            queue: qid,
            corrid: h.correlation.clone(),
            priority,
            enq_time: now,
            delay_until,
            expire_at,
            sender,
            exception_queue: h.exception_queue.as_deref().map(canon),
            payload,
            enq_txn,
            consumers: Vec::new(),
            prio_key: if queue.sort == SortOrder::PriorityEnqTime { priority } else { 0 },
        };
        row.consumers = if queue.multi_consumer {
            if !h.recipient_list.is_empty() {
                let mut names = Vec::new();
                for r in &h.recipient_list {
                    if r.alias.is_some() {
                        return Err(AqError::client(
                            code::DIRECTORY,
                            "recipient agent_alias needs the directory, which is not configured",
                        ));
                    }
                    let Some(n) = r.name.as_deref().filter(|n| !n.trim().is_empty()) else {
                        return Err(AqError::invalid("recipient without agent_name"));
                    };
                    let n = canon(n);
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
                names
            } else {
                let view = context::MessageContext::for_new(&row, &queue.name, &queue.payload, &resolved.catalog.types);
                queue
                    .subscribers
                    .iter()
                    .filter(|s| s.rule.as_ref().is_none_or(|r| r.eval(&view)))
                    .map(|s| s.name.clone())
                    .collect()
            }
        } else {
            if !h.recipient_list.is_empty() {
                return Err(AqError::client(
                    code::NOT_MULTI_CONSUMER,
                    format!("recipient_list given, but queue {} is not a multi-consumer queue", queue.name),
                ));
            }
            vec![String::new()]
        };
        if row.consumers.is_empty() {
            return Err(AqError::client(
                code::NO_RECIPIENTS,
                format!("no recipients for message: queue {} has no matching subscriber", queue.name),
            ));
        }
        Ok(row)
    }

    async fn receive(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: ReceiveRequest,
    ) -> Result<ReceiveResult, AqError> {
        let o = &req.consumer;
        let dest = self.destination_name(&o.destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        if !resolved.catalog.permits(agent, queue, Privilege::Dequeue) {
            return Err(not_permitted(agent, "dequeue from", &queue.name));
        }
        if !queue.dequeue_enabled {
            return Err(AqError::client(
                code::DEQUEUE_DISABLED,
                format!("dequeue failed, queue {} is not enabled for dequeue", queue.name),
            ));
        }
        let consumer = consumer_for(queue, o.consumer_name.as_deref())?;
        if o.transformation.is_some() {
            return Err(AqError::invalid("transformations are not supported"));
        }
        if o.navigation == NavigationMode::NextTransaction {
            return Err(AqError::invalid("NEXT_TRANSACTION needs message grouping, which this queue does not have"));
        }
        if o.dequeue_mode == DequeueMode::Locked && o.visibility == Visibility::Immediate {
            return Err(AqError::invalid("a LOCKED dequeue holds its lock until commit: use ON_COMMIT visibility"));
        }
        let mut filter = Filter { corrid: None, msgid: None, condition: None };
        match &o.selector {
            None => {}
            Some(Selector::Correlation(c)) => filter.corrid = Some(c.clone()),
            Some(Selector::MessageId(id)) => filter.msgid = Some(parse_msgid(id)?),
            Some(Selector::Condition(c)) => {
                let cond = Condition::parse(c)
                    .map_err(|e| AqError::client(code::BAD_CONDITION, format!("invalid dequeue condition: {e}")))?;
                check_condition_names(&cond, queue, &resolved.catalog.types)?;
                filter.condition = Some(cond);
            }
        }
        let wait = o.wait_time.map(Duration::from_secs).unwrap_or(self.config.max_wait).min(self.config.max_wait);
        let deadline = tokio::time::Instant::now() + wait;
        let mut interest: Option<crate::store::Interest> = None;
        let abandon = session.abandon.clone();
        loop {
            let waker = self.waker(qid);
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            if abandon.as_ref().is_some_and(|a| a.is_abandoned()) {
                // Nobody is there to receive: take nothing.
                return Err(AqError::client(code::NO_MESSAGE, "the client went away during the dequeue wait"));
            }
            if let Some(m) = self.try_receive(resolved, session, queue, qid, &consumer, &req, &filter).await? {
                return Ok(ReceiveResult { destination: queue.name.clone(), messages: vec![m] });
            }
            let now_i = tokio::time::Instant::now();
            if now_i >= deadline {
                break;
            }
            // Other processes signal a queue only while somebody holds interest in it:
            // take it before the first wait, then look once more for what was committed
            // before it took effect.
            if interest.is_none() {
                if session.stored.is_some() {
                    // No process may take the session for idle while it waits here.
                    let until = self.now().saturating_add(i64::try_from(wait.as_micros()).unwrap_or(i64::MAX));
                    self.store.session_touch(&session.id_hash(), until).await?;
                }
                let i = self.store.interest(qid).await?;
                let look_again = i.is_held();
                interest = Some(i);
                if look_again {
                    continue;
                }
            }
            // Wake on an enqueue signal, at the deadline, or when a delayed message's delay ends.
            let mut until = deadline;
            let now = self.now();
            if let Some(t) = self.store.next_delay_end(qid, now).await? {
                let d = Duration::from_micros(u64::try_from(t.saturating_sub(now)).unwrap_or(0));
                until = until.min(now_i + d);
            }
            let gone = async {
                match &abandon {
                    Some(a) => a.abandoned().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::timeout_at(until, notified) => {}
                () = gone => {}
            }
        }
        if filter.msgid.is_some() {
            return Err(AqError::client(
                code::NO_SUCH_MESSAGE_ID,
                format!("no message in queue {} with the given message ID", queue.name),
            ));
        }
        Err(AqError::client(
            code::NO_MESSAGE,
            format!("timeout or end-of-fetch during message dequeue from {}", queue.name),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    async fn try_receive(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        queue: &QueueInfo,
        qid: QueueId,
        consumer: &str,
        req: &ReceiveRequest,
        filter: &Filter,
    ) -> Result<Option<Message>, AqError> {
        let o = &req.consumer;
        let now = self.now();
        let key = (qid, consumer.to_string());
        let start = match o.navigation {
            NavigationMode::FirstMessage => None,
            _ => session.positions.get(&key).copied(),
        };
        let browse = o.dequeue_mode == DequeueMode::Browse;
        // A REMOVE that commits at once (IMMEDIATE, or a trailing AQXmlCommit with nothing
        // else pending) deletes the delivery directly instead of locking it first.
        let remove_now = o.visibility == Visibility::Immediate || (req.commit && !session.pending);
        if o.dequeue_mode == DequeueMode::Remove
            && remove_now
            && req.commit
            && !self.sealed(session)
            && !session.pending
            && start.is_none()
            && filter.condition.is_none()
            && !queue.multi_consumer
        {
            // The common consumer loop — take the head, commit — in one atomic step.
            let q = CandidateQuery {
                queue: qid,
                consumer: consumer.to_string(),
                txn: session.txn.clone(),
                now,
                after: None,
                corrid: filter.corrid.clone(),
                msgid: filter.msgid,
                include_locked: false,
                limit: 1,
            };
            let Some(m) = self.store.take_head(&q, session.origin).await? else { return Ok(None) };
            let out = match self.message_out(resolved, queue, &m, now) {
                Ok(out) => out,
                Err(e) => {
                    // Removed already, but not returnable: put it back (at the end of its
                    // priority), so that the Fault loses nothing.
                    self.put_back(&m).await?;
                    return Err(e);
                }
            };
            // A session without a row that ends its transaction: nothing to keep.
            session.end_transaction();
            return Ok(Some(out));
        }
        let mut tx = self.store.begin().await?;
        // Scan from the position; REMOVE and LOCKED wrap around once so that a consumer
        // never starves on messages sorted before its position (e.g. higher priority).
        let passes: &[Option<Position>] = if start.is_some() && !browse { &[start, None] } else { &[start] };
        let mut found = None;
        'passes: for &from in passes.iter() {
            let mut q = CandidateQuery {
                queue: qid,
                consumer: consumer.to_string(),
                txn: session.txn.clone(),
                now,
                after: from,
                corrid: filter.corrid.clone(),
                msgid: filter.msgid,
                include_locked: browse,
                // Without a condition the first candidate is normally the answer: fetch one
                // payload, not a page of them.
                limit: if filter.condition.is_some() { SCAN_BATCH } else { 1 },
            };
            loop {
                let batch = tx.candidates(&q).await?;
                let exhausted = (batch.len() as i64) < q.limit;
                for m in batch {
                    q.after = Some(Position { prio_key: m.prio_key, seq: m.seq });
                    if let Some(c) = &filter.condition {
                        let ctx = context::MessageContext::for_stored(
                            &m,
                            &queue.name,
                            &queue.payload,
                            &resolved.catalog.types,
                        );
                        if !c.eval(&ctx) {
                            continue;
                        }
                    }
                    let taken = match o.dequeue_mode {
                        DequeueMode::Browse => true,
                        DequeueMode::Locked => tx.lock(m.seq, consumer, &session.txn, LockKind::Locked).await?,
                        DequeueMode::Remove if remove_now => {
                            tx.remove_now(m.seq, consumer, &session.txn, queue.multi_consumer).await?
                        }
                        DequeueMode::Remove => tx.lock(m.seq, consumer, &session.txn, LockKind::Remove).await?,
                    };
                    if taken {
                        found = Some(m);
                        break 'passes;
                    }
                }
                if exhausted {
                    break;
                }
            }
        }
        let Some(m) = found else {
            tx.rollback().await?;
            if browse && o.navigation == NavigationMode::NextMessage && session.positions.contains_key(&key) {
                // End of fetch: the next browse starts from the beginning again.
                let mut next = session.state();
                next.positions.remove(&key);
                self.seal_alone(session, next).await?;
            }
            return Ok(None);
        };
        // Decoded before anything commits: a message that cannot be returned is neither
        // removed nor locked nor passed by the browse position (a Fault changes nothing).
        let out = self.message_out(resolved, queue, &m, now)?;
        let takes_lock = !browse && !remove_now;
        let mut next = session.state();
        next.positions.insert(key, Position { prio_key: m.prio_key, seq: m.seq });
        if req.commit {
            next.end_transaction();
        } else if takes_lock {
            next.pending = true;
            next.dequeued = true;
        }
        let response = session.idempotency.is_some().then(|| {
            Response::Receive(
                StatusResponse::ok(),
                Some(ReceiveResult { destination: queue.name.clone(), messages: vec![out.clone()] }),
            )
        });
        let version = self.seal(&mut *tx, session, &next, response.as_ref()).await?;
        let mut woken = Vec::new();
        if req.commit && (session.pending || takes_lock) {
            woken = publish(&mut *tx, session, session.dequeued || takes_lock).await?;
        }
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(Some(out))
    }

    /// Enqueues a single-consumer message taken by `take_head` again, as it was.
    async fn put_back(&self, m: &StoredMessage) -> Result<(), AqError> {
        tracing::error!(queue = m.queue, msgid = %payload::hex_upper(&m.msgid), "a stored message could not be returned; it is put back");
        let row = NewMessage {
            msgid: m.msgid,
            queue: m.queue,
            corrid: m.corrid.clone(),
            priority: m.priority,
            enq_time: m.enq_time,
            delay_until: m.delay_until,
            expire_at: m.expire_at,
            sender: m.sender.clone(),
            exception_queue: m.exception_queue.clone(),
            payload: m.payload.clone(),
            enq_txn: None,
            // The single consumer's delivery (take_head serves single-consumer queues).
            consumers: vec![String::new()],
            prio_key: m.prio_key,
        };
        self.store.insert_committed(std::slice::from_ref(&row), 0).await?;
        Ok(())
    }

    fn message_out(
        &self,
        resolved: &Resolved,
        queue: &QueueInfo,
        m: &StoredMessage,
        now: Micros,
    ) -> Result<Message, AqError> {
        let payload = payload::decode(&queue.payload, &resolved.catalog.types, &m.payload)
            .map_err(|e| AqError::server(code::INTERNAL, format!("stored payload cannot be decoded: {e}")))?;
        Ok(Message { number: Some(1), header: header_of(m, queue, now), payload })
    }

    async fn register(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: RegisterRequest,
    ) -> Result<(), AqError> {
        let dest = self.destination_name(&req.destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        if !resolved.catalog.permits(agent, queue, Privilege::Dequeue) {
            return Err(not_permitted(agent, "register for notifications on", &queue.name));
        }
        let consumer = consumer_for(queue, req.consumer_name.as_deref())?;
        let url = req.notify_url.trim();
        if !url.is_empty() {
            self.check_notify_url(url).await?;
        }
        let mut tx = self.store.begin().await?;
        if url.is_empty() {
            // `<notify_url/>` (empty): unregister. Undelivered notifications go with it.
            // (The queue stays in `registered` until the next refresh: a spurious wake-up
            // at worst.)
            tx.delete_registration(qid, &consumer, &agent.name).await?;
        } else {
            self.registered.write().unwrap_or_else(|p| p.into_inner()).insert(qid);
            tx.upsert_registration(&Registration {
                queue: qid,
                consumer,
                notify_url: url.to_string(),
                agent: agent.name.clone(),
            })
            .await?;
        }
        let mut next = session.state();
        if req.commit {
            next.end_transaction();
        }
        let response = Response::Register(StatusResponse::ok());
        let version = self.seal(&mut *tx, session, &next, Some(&response)).await?;
        let mut woken = Vec::new();
        if req.commit && session.pending {
            woken = publish(&mut *tx, session, session.dequeued).await?;
        }
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(())
    }

    /// Commits the session's transaction.
    pub async fn commit(&self, session: &mut Session) -> Result<(), AqError> {
        let mut next = session.state();
        next.end_transaction();
        if !session.pending && !self.sealed(session) {
            session.end_transaction();
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        let version = self.seal(&mut *tx, session, &next, Some(&Response::Commit(StatusResponse::ok()))).await?;
        let woken = if session.pending { publish(&mut *tx, session, session.dequeued).await? } else { Vec::new() };
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(())
    }

    /// Rolls back the session's transaction. Dequeues that fail too often move their
    /// message to the exception queue (single-consumer queues).
    pub async fn rollback(&self, resolved: &Resolved, session: &mut Session) -> Result<(), AqError> {
        let mut next = session.state();
        next.end_transaction();
        if !session.pending && !self.sealed(session) {
            session.end_transaction();
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        let woken = if session.pending { rollback_work(&mut *tx, resolved, &session.txn).await? } else { Vec::new() };
        let version = self.seal(&mut *tx, session, &next, Some(&Response::Rollback(StatusResponse::ok()))).await?;
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(())
    }

    /// Rolls back and ends sessions idle for longer than the timeout, whichever process
    /// finds them: ending one is conditional on its row's version and idleness, in the
    /// transaction that rolls its work back, so each is rolled back exactly once (and a
    /// request that ran meanwhile wins). An ended session leaves a tombstone, so its
    /// cookie is answered "expired". Sessions with a request running in this process are
    /// not idle. Returns how many ended.
    pub async fn expire_sessions(&self) -> usize {
        let now = self.now();
        let limit = i64::try_from(self.config.session_timeout.as_micros()).unwrap_or(i64::MAX);
        let ttl = i64::try_from(self.config.tombstone_ttl.as_micros()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(limit);
        let idle = match self.store.sessions_idle(before, 200).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "looking for idle sessions");
                return 0;
            }
        };
        if let Ok(c) = self.store.session_count().await {
            self.stored_sessions.store(c, std::sync::atomic::Ordering::Relaxed);
        }
        self.sessions.forget_idle(before);
        let resolved = self.resolved();
        let mut n = 0;
        for row in idle {
            let Some(_turn) = self.sessions.try_turn(&row.id_hash) else { continue };
            match self.end_idle(&resolved, &row, before, now.saturating_add(ttl)).await {
                Ok(true) => {
                    self.sessions.forget(&row.id_hash);
                    n += 1;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "rolling back an idle session failed; will retry"),
            }
        }
        n
    }

    async fn end_idle(
        &self,
        resolved: &Resolved,
        row: &SessionRow,
        before: Micros,
        until: Micros,
    ) -> Result<bool, AqError> {
        let mut tx = self.store.begin().await?;
        // First, so that of several processes exactly one goes on (the others wait for its
        // row lock and then find the row gone).
        if !tx.session_end(&row.id_hash, row.version, Some(before), Some((&row.agent, row.pending, until))).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        let woken = if row.pending { rollback_work(&mut *tx, resolved, &row.txn).await? } else { Vec::new() };
        tx.commit().await?;
        if row.pending {
            tracing::info!(agent = %row.agent, "an idle session's transaction was rolled back");
        }
        for q in woken {
            self.wake(q);
        }
        Ok(true)
    }

    /// Forgets tombstones past their time and idempotency records past the window.
    pub async fn purge_sessions(&self) {
        let now = self.now();
        let window = i64::try_from(self.config.idempotency_window.as_micros()).unwrap_or(i64::MAX);
        match self.store.sessions_purge(now, now.saturating_sub(window)).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "session tombstones and idempotency records forgotten"),
            Err(e) => tracing::warn!(error = %e, "purging session tombstones and idempotency records"),
        }
    }

    /// Moves expired messages to their exception queue (state 3). Returns how many.
    pub async fn expire_messages(&self) -> Result<usize, AqError> {
        let now = self.now();
        let resolved = self.resolved();
        let due = self.store.due_expirations(now, 500).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let mut tx = self.store.begin().await?;
        if !tx.time_manager_turn().await? {
            // Another process is at it now.
            tx.rollback().await?;
            return Ok(0);
        }
        for m in &due {
            let own = resolved.names.get(&m.queue).and_then(|n| resolved.catalog.queues.get(n));
            let target = own.and_then(|q| exception_target(&resolved, q, m.exception_queue.as_deref(), m.seq));
            match target {
                Some(t) => tx.move_to_exception(m.seq, t).await?,
                None => tracing::warn!(seq = m.seq, "expired message has no exception queue; left in place"),
            }
        }
        tx.commit().await?;
        Ok(due.len())
    }

    /// Background duties: session timeouts, expirations, cross-process wake-ups. Runs
    /// until `shutdown` resolves.
    pub async fn run_background(self: Arc<Self>, tick: Duration, shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut shutdown = shutdown;
        if let Ok(Some(mut rx)) = self.store.listen().await {
            let me = self.clone();
            tokio::spawn(async move {
                while let Some(q) = rx.recv().await {
                    me.wake(q);
                }
            });
        }
        let mut interval = tokio::time::interval(tick);
        let mut purged = None;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.changed() => return,
            }
            if let Err(e) = self.expire_messages().await {
                tracing::warn!(error = %e, "time manager");
            }
            self.expire_sessions().await;
            if purged.is_none_or(|t: tokio::time::Instant| t.elapsed() >= Duration::from_secs(60)) {
                self.purge_sessions().await;
                purged = Some(tokio::time::Instant::now());
            }
        }
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

    /// Checks a registration's notify_url: `http(s)://` allowed by the notification policy,
    /// or `mailto:` with an address or a directory notification alias.
    async fn check_notify_url(&self, url: &str) -> Result<(), AqError> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("plsql://") {
            return Err(AqError::invalid("plsql:// notifications are not supported: use http(s):// or mailto:"));
        }
        if url.len() > 2048 {
            return Err(AqError::invalid("notify_url is longer than 2048 characters"));
        }
        if lower.starts_with("http://") || lower.starts_with("https://") {
            let u = reqwest::Url::parse(url)
                .map_err(|e| AqError::invalid(format!("notify_url '{url}' is not a valid URL: {e}")))?;
            let Some(host) = u.host_str() else {
                return Err(AqError::invalid(format!("notify_url '{url}' has no host")));
            };
            if !u.username().is_empty() || u.password().is_some() {
                return Err(AqError::invalid(
                    "notify_url must not carry credentials; set a signing secret for the registration instead",
                ));
            }
            return self.config.notify_policy.check_host(host).map_err(|e| AqError::client(code::NOT_PERMITTED, e));
        }
        let Some(addr) = lower.strip_prefix("mailto:").map(|a| a.trim_start_matches("//").trim()) else {
            return Err(AqError::invalid(format!("notify_url '{url}' is not an http(s):// URL or a mailto: address")));
        };
        if addr.contains('@') {
            if addr.starts_with('@') || addr.ends_with('@') || addr.parse::<lettre::Address>().is_err() {
                return Err(AqError::invalid(format!("notify_url '{url}' is not a valid mailto: address")));
            }
            return Ok(());
        }
        // No '@': a notification alias the directory resolves (again at each delivery).
        let alias = url["mailto:".len()..].trim_start_matches("//").trim();
        if alias.is_empty() || !alias.chars().all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-')) {
            return Err(AqError::invalid(format!(
                "notify_url '{url}' is neither a mailto: address nor a notification alias (letters, digits, . _ -)"
            )));
        }
        let Some(dir) = &self.config.directory else {
            return Err(AqError::client(
                code::DIRECTORY,
                format!("mailto:{alias} is a notification alias, and no directory is configured"),
            ));
        };
        match dir.resolve_notification_alias(alias).await {
            Ok(_) => Ok(()),
            Err(crate::directory::DirectoryError::NotFound(_)) => {
                Err(AqError::client(code::DIRECTORY, format!("notification alias {alias} not found in the directory")))
            }
            Err(e) => Err(AqError::directory(e, &format!("notification alias {alias}"))),
        }
    }

    /// Replaces `agent_alias` in sender_id and recipient_list by the agent it names.
    async fn resolve_aliases(&self, h: &mut MessageHeader) -> Result<(), AqError> {
        let agents = h.sender_id.iter_mut().chain(h.recipient_list.iter_mut());
        for a in agents {
            let Some(alias) = a.alias.take() else { continue };
            let Some(dir) = &self.config.directory else {
                return Err(AqError::client(
                    code::DIRECTORY,
                    format!("agent_alias '{alias}' needs a directory, and none is configured"),
                ));
            };
            let e = dir
                .resolve_agent_alias(alias.trim())
                .await
                .map_err(|e| AqError::directory(e, &format!("agent_alias {alias}")))?;
            a.name = Some(e.name);
            a.address = e.address;
            a.protocol = e.protocol;
        }
        Ok(())
    }
}

struct Filter {
    corrid: Option<String>,
    msgid: Option<[u8; 16]>,
    condition: Option<Condition>,
}

fn consumer_for(queue: &QueueInfo, name: Option<&str>) -> Result<String, AqError> {
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    match (queue.multi_consumer, name) {
        (true, None) => Err(AqError::client(
            code::CONSUMER_REQUIRED,
            format!("cannot dequeue because CONSUMER_NAME not specified: {} is a multi-consumer queue", queue.name),
        )),
        (true, Some(n)) => Ok(canon(n)),
        (false, Some(_)) => Err(AqError::client(
            code::NOT_MULTI_CONSUMER,
            format!("consumer_name given, but queue {} is not a multi-consumer queue", queue.name),
        )),
        (false, None) => Ok(String::new()),
    }
}

fn not_permitted(agent: &AgentInfo, what: &str, queue: &str) -> AqError {
    AqError::client(
        code::NOT_PERMITTED,
        format!("insufficient privileges: agent {} may not {what} {queue}", agent.name),
    )
}

fn parse_msgid(id: &str) -> Result<[u8; 16], AqError> {
    let bytes = hex::decode(id.trim()).map_err(|_| AqError::invalid("message_id is not hexadecimal"))?;
    bytes.try_into().map_err(|_| AqError::invalid("message_id must be 32 hex digits (16 bytes)"))
}

fn agent_json(a: &AgentRef) -> String {
    serde_json::json!({ "name": a.name, "address": a.address, "protocol": a.protocol }).to_string()
}

pub fn agent_from_json(s: &str) -> Option<AgentRef> {
    let v: serde_json::Value = serde_json::from_str(s).ok()?;
    Some(AgentRef {
        name: v.get("name").and_then(|x| x.as_str()).map(String::from),
        address: v.get("address").and_then(|x| x.as_str()).map(String::from),
        protocol: v.get("protocol").and_then(|x| x.as_i64()).and_then(|p| i32::try_from(p).ok()),
        alias: None,
    })
}

/// Refuses a condition naming something no message of `queue` can have: it would
/// silently match nothing (and a long poll would wait its whole time for nothing).
fn check_condition_names(cond: &Condition, queue: &QueueInfo, types: &payload::TypeRegistry) -> Result<(), AqError> {
    use crate::selector::NameRef;
    let property = |p: &str| context::MESSAGE_PROPERTIES.contains(&p);
    let jms = queue.payload.is_jms();
    let no_jms = || format!("queue {} holds no JMS messages, so it has no JMS properties", queue.name);
    for name in cond.names() {
        let problem = match name {
            NameRef::Bare { prop, original } if !property(prop) && !jms => {
                Some(format!("{original} is not a message property, and {}", no_jms()))
            }
            NameRef::Column(c) if !property(c) => Some(format!("tab.{c} is not a message property")),
            NameRef::UserProperty(p) if !jms => Some(format!("\"{p}\": {}", no_jms())),
            NameRef::UserData(path) if !types.has_user_data_path(&queue.payload, path) => {
                Some(format!("tab.user_data.{} names nothing in the payload of queue {}", path.join("."), queue.name))
            }
            _ => None,
        };
        if let Some(p) = problem {
            return Err(AqError::client(code::BAD_CONDITION, format!("invalid dequeue condition: {p}")));
        }
    }
    Ok(())
}

/// Where a failed (expired, or too often rolled back) message `seq` of `queue` goes: the
/// exception queue it names, else its queue table's default. A named one that does not
/// exist (or, after a topology change, is no exception queue of the table) falls back to
/// the default, as the reference says.
fn exception_target(resolved: &Resolved, queue: &QueueInfo, named: Option<&str>, seq: i64) -> Option<QueueId> {
    let named = named.and_then(|n| {
        let found = resolved.catalog.queue(n).filter(|t| exception_queue_of(t, queue));
        if found.is_none() {
            tracing::warn!(seq, exception_queue = n, "no such exception queue; using the default");
        }
        found
    });
    let name = named.map_or(&queue.exception_queue, |t| &t.name);
    resolved.ids.get(name).copied()
}

/// Whether `target` may receive `queue`'s failed messages: an exception queue of the same
/// queue table (so of the same payload type and consumers).
fn exception_queue_of(target: &QueueInfo, queue: &QueueInfo) -> bool {
    target.is_exception_queue && target.queue_table == queue.queue_table
}

/// Discards the transaction `txn`'s work inside `tx`: its enqueues go, its dequeues are
/// released (their retry count goes up); messages rolled back too often move to their
/// exception queue. Returns the queues whose messages came back.
async fn rollback_work(tx: &mut dyn StoreTx, resolved: &Resolved, txn: &str) -> Result<Vec<QueueId>, AqError> {
    let released = tx.rollback_session(txn).await?;
    let mut woken = Vec::new();
    for r in released {
        woken.push(r.queue);
        let Some(q) = resolved.names.get(&r.queue).and_then(|n| resolved.catalog.queues.get(n)) else {
            continue;
        };
        if q.is_exception_queue || r.retry_count <= q.max_retries {
            continue;
        }
        let Some(eq) = exception_target(resolved, q, r.exception_queue.as_deref(), r.seq) else { continue };
        // A multi-consumer message moves once none of its consumers can take it any more
        // (as Oracle does); a consumer that gave up no longer sees it.
        if !q.multi_consumer || tx.drop_delivery(r.seq, &r.consumer).await? == 0 {
            tx.move_to_exception(r.seq, eq).await?;
        }
    }
    Ok(woken)
}

/// The fault for a request that found its session changed by another request meanwhile.
fn session_busy_error() -> AqError {
    AqError::client(
        code::SESSION_BUSY,
        "another request with the same session cookie ran at the same time; nothing of this one was performed, send it again",
    )
}

/// The fault for a request of a session that timed out (its work was rolled back).
pub fn session_expired_error() -> AqError {
    AqError::client(
        code::SESSION_EXPIRED,
        "the session timed out and its uncommitted work was rolled back; start the transaction again without the session cookie",
    )
}

/// Publishes the session's transaction inside `tx` (`StoreTx::commit_session`); returns
/// the queues that got new visible messages. Refuses, leaving `tx` to be rolled back, if
/// the store does not hold exactly the messages the transaction enqueued: provisional
/// writes lost with a database crash (`Store::begin_provisional`), or a send whose
/// commit failed with an unknown outcome. As in Oracle (ORA-25402), the client then has
/// to roll the transaction back.
/// 25402 for a session whose open transaction may have lost writes.
fn transaction_lost_error() -> AqError {
    AqError::server(
        code::TRANSACTION_LOST,
        "transaction must roll back: the database restarted since this transaction's work was written, \
         and some of it may be lost; nothing was committed",
    )
}

async fn publish(tx: &mut dyn StoreTx, session: &Session, dequeues: bool) -> Result<Vec<QueueId>, AqError> {
    if !session.intact {
        tracing::warn!("the database restarted since a write of a session's transaction; its commit is refused");
        return Err(transaction_lost_error());
    }
    let outcome = tx.commit_session(&session.txn, dequeues).await?;
    if outcome.published != session.enqueued {
        tracing::warn!(
            enqueued = session.enqueued,
            found = outcome.published,
            "a session's uncommitted messages were lost by the store; its commit is refused"
        );
        return Err(AqError::server(
            code::TRANSACTION_LOST,
            format!(
                "transaction must roll back: the store holds {} of the {} message(s) it enqueued \
                 (the database restarted since, or a write's outcome was unknown); nothing was committed",
                outcome.published, session.enqueued
            ),
        ));
    }
    Ok(outcome.enqueued_queues)
}

/// The message properties returned with a dequeued message.
pub fn header_of(m: &StoredMessage, queue: &QueueInfo, now: Micros) -> MessageHeader {
    let state = if m.state == 3 {
        3
    } else if m.delay_until.is_some_and(|t| t > now) {
        1
    } else {
        0
    };
    MessageHeader {
        message_id: Some(payload::hex_upper(&m.msgid)),
        correlation: m.corrid.clone(),
        expiration: None,
        delay: None,
        priority: Some(m.priority),
        delivery_count: Some(m.retry_count),
        sender_id: m.sender.as_deref().and_then(agent_from_json),
        recipient_list: Vec::new(),
        message_state: Some(state),
        // The default exception queue is reported as absent, as Oracle does.
        exception_queue: m.exception_queue.clone().filter(|e| *e != queue.exception_queue),
    }
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
            _ => {}
        }
    }
    Ok(t)
}
