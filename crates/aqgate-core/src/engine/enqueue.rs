//! Enqueue: AQXmlSend and AQXmlPublish, message construction, agent aliases.

use super::*;
use crate::clock::{MICROS_PER_SEC, Micros};
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::payload;
use crate::store::*;
use crate::topology::remote_space::RemoteTarget;
use crate::topology::{AgentInfo, Catalog, Privilege, QueueInfo, SortOrder, canon};

/// What each message of an enqueue is made with: the queue it goes to and the request's
/// time, agent and budget of subscriber rules.
pub(super) struct Enqueue<'a> {
    pub(super) resolved: &'a Resolved,
    pub(super) queue: &'a QueueInfo,
    pub(super) qid: QueueId,
    pub(super) now: Micros,
    /// The agent that enqueues (`ENQ_USER_ID`).
    pub(super) enq_user: &'a str,
    pub(super) work: &'a work::Work,
}

/// `e` with the number of the message it is about (its `number`, else its place).
fn in_message(m: &Message, i: usize, e: AqError) -> AqError {
    let n = m.number.unwrap_or(u32::try_from(i + 1).unwrap_or(u32::MAX));
    AqError { message: format!("message {n}: {}", e.message), ..e }
}

impl Engine {
    /// AQXmlSend and AQXmlPublish: the request checked, its messages made and stored (or
    /// kept in memory when buffered, or sent on to a synchronous remote queue space) with
    /// the session's next state, and the waiting receives told.
    pub(super) async fn enqueue(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: EnqueueRequest,
        wrap: fn(EnqueueResult) -> Response,
    ) -> Result<Response, AqError> {
        // The times a propagation job carries are for this send only.
        let carry = std::mem::take(&mut session.carry);
        let mut req = req;
        let (queue, qid, transformation) = self.enqueue_target(resolved, session, agent, &mut req).await?;
        let now = self.now();
        self.remote_schedule(session, queue, &mut req, now)?;
        if let Some(t) = transformation {
            // Every message is transformed before any is stored: one that fails fails the request.
            for (i, m) in req.messages.iter_mut().enumerate() {
                m.payload = transform::incoming(&resolved.catalog, t, &m.payload, &self.config.conditions)
                    .map_err(|e| in_message(m, i, e))?;
            }
        }
        if req.producer.delivery_mode != DeliveryMode::Persistent {
            let result = self.enqueue_buffered(resolved, session, queue, qid, &req, now).await?;
            return Ok(wrap(result));
        }
        let work = self.work();
        let e = Enqueue { resolved, queue, qid, now, enq_user: &agent.name, work: &work };
        let (rows, ids) = self.persistent_rows(&e, session, &req, &carry)?;
        if let Some(r) = queue.remote.as_ref().filter(|r| r.synchronous && !session.propagates) {
            let commit_now = req.producer.visibility == Visibility::Immediate || req.commit;
            synchronous::refuse_in_transaction(r, &queue.name, commit_now, session.pending)?;
            let Some(remote) = self.config.remote_spaces.clone() else {
                return Err(AqError::server(
                    code::REMOTE_UNREACHABLE,
                    format!("remote queue space {}: this process forwards to no remote queue space", r.space),
                ));
            };
            return self.send_synchronously(session, &*remote, r, queue, &req.messages, req.commit, wrap).await;
        }
        let response = wrap(EnqueueResult { destination: queue.name.clone(), message_ids: ids });
        self.store_persistent(resolved, session, &e, rows, &req, response).await
    }

    /// The queue an enqueue names, with its id and the transformation the request applies,
    /// once the request may enqueue to it: recipient lists within their cap, aliases
    /// resolved, the agent permitted, every sender allowed (secure queues), the queue
    /// enabled for enqueue, the transformation known and of the queue's type.
    async fn enqueue_target<'r>(
        &self,
        resolved: &'r Resolved,
        session: &Session,
        agent: &AgentInfo,
        req: &mut EnqueueRequest,
    ) -> Result<(&'r QueueInfo, QueueId, Option<&'r std::sync::Arc<payload::Transformation>>), AqError> {
        let dest = self.destination_name(&req.producer.destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        // Before any alias is looked up: a list over the cap costs no directory search.
        self.check_recipient_counts(&req.messages)?;
        for m in req.messages.iter_mut() {
            self.resolve_aliases(&mut m.header).await?;
        }
        if !resolved.catalog.permits(agent, queue, Privilege::Enqueue) {
            return Err(not_permitted(agent, "enqueue to", &queue.name));
        }
        if !session.propagates {
            for (i, m) in req.messages.iter_mut().enumerate() {
                check_sender(&resolved.catalog, &mut m.header, agent, queue).map_err(|e| in_message(m, i, e))?;
            }
        }
        if !queue.enqueue_enabled {
            return Err(AqError::client(
                code::ENQUEUE_DISABLED,
                format!("enqueue failed, queue {} is disabled for enqueueing", queue.name),
            ));
        }
        let transformation = match req.producer.transformation.as_deref() {
            Some(name) => Some(transform::for_enqueue(&resolved.catalog, name, queue)?),
            None => None,
        };
        Ok((queue, qid, transformation))
    }

    /// The delays of a send to a remote queue space (its `AQ-Schedule`, or each message's
    /// own); an `AQ-Schedule` to any other queue is refused.
    fn remote_schedule(
        &self,
        session: &Session,
        queue: &QueueInfo,
        req: &mut EnqueueRequest,
        now: Micros,
    ) -> Result<(), AqError> {
        match &queue.remote {
            Some(r) => {
                let scheduled = match &session.schedule {
                    Some(s) => Some(self.scheduled_delay(s, r, now)?),
                    None => None,
                };
                for (i, m) in req.messages.iter_mut().enumerate() {
                    remote_delay(r, &mut m.header, scheduled).map_err(|e| in_message(m, i, e))?;
                }
                Ok(())
            }
            None if session.schedule.is_some() => Err(AqError::invalid(format!(
                "AQ-Schedule applies to the queues of remote queue spaces, and {} is not one (give the messages a delay)",
                queue.name
            ))),
            None => Ok(()),
        }
    }

    /// The rows of a persistent enqueue and the messages' ids, in the request's order:
    /// each made (a propagation job's copy with the times it carries), in the IDAP
    /// transaction it belongs to, within a remote queue space's limits.
    fn persistent_rows(
        &self,
        e: &Enqueue<'_>,
        session: &Session,
        req: &EnqueueRequest,
        carry: &[Carried],
    ) -> Result<(Vec<NewMessage>, Vec<String>), AqError> {
        let queue = e.queue;
        let immediate = req.producer.visibility == Visibility::Immediate;
        let commit_now = immediate || req.commit;
        let mut rows = Vec::with_capacity(req.messages.len());
        let mut ids = Vec::with_capacity(req.messages.len());
        // Oracle's ENQ_TXN_ID: the session's transaction, which this request joins or
        // commits; an IMMEDIATE enqueue inside an open transaction is not that
        // transaction's (it commits alone): it has its own.
        let enq_txn_id = if !immediate || req.commit { session.txn.clone() } else { super::session::random_id() };
        // A propagation batch's held transaction hides its rows until it commits: they need
        // no tag (and its commit publishes none).
        let untagged = commit_now || session.held.is_active();
        for (i, m) in req.messages.iter().enumerate() {
            let carried = if session.propagates { carry.get(i) } else { None };
            let txn = if untagged { None } else { Some(session.txn.clone()) };
            let row = e
                .new_message(m, carried, txn)
                .map(|row| NewMessage { enq_txn_id: Some(enq_txn_id.clone()), ..row })
                .map_err(|err| match &queue.remote {
                    Some(r) if err.code == code::PAYLOAD_MISMATCH => AqError {
                        message: format!(
                            "{} of remote queue space {} takes {} payloads (payload_type): {}",
                            queue.name, r.space, queue.payload, err.message
                        ),
                        ..err
                    },
                    _ => err,
                })
                .and_then(|row| match &queue.remote {
                    Some(r) => remote_limits(r, row, carried.is_some(), e.now),
                    None => Ok(row),
                })
                .map_err(|err| in_message(m, i, err))?;
            ids.push(payload::hex_upper(&row.msgid));
            rows.push(row);
        }
        Ok((rows, ids))
    }

    /// Stores a persistent enqueue's rows (grouped on a grouped queue, in the queue's
    /// order) with the session's next state, then tells the waiting receives what became
    /// visible (or keeps the rows of an open transaction staged for its commit).
    async fn store_persistent(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        e: &Enqueue<'_>,
        mut rows: Vec<NewMessage>,
        req: &EnqueueRequest,
        response: Response,
    ) -> Result<Response, AqError> {
        let qid = e.qid;
        let immediate = req.producer.visibility == Visibility::Immediate;
        if let Some(g) = self.enqueue_group(e.queue, session, immediate) {
            for r in rows.iter_mut() {
                r.group = Some(g);
            }
        }
        if e.queue.sort == SortOrder::EnqTimePriority {
            // Messages of one enqueue time are stored (so numbered, and dequeued) by
            // priority; the response keeps the request's order.
            rows.sort_by_key(|r| (r.enq_time, r.priority));
        }
        let commit_now = immediate || req.commit;
        let commit_session = req.commit && session.pending;
        let (txn, enqueued_before, dequeued_before) = (session.txn.clone(), session.enqueued, session.dequeued);
        let mut next = session.state();
        if req.commit {
            next.end_transaction();
        } else if !immediate {
            next.pending = true;
            next.enqueued += rows.len() as u64;
        }
        let (version, published) = self.write_rows(resolved, session, &rows, &next, &response, req).await?;
        if commit_session {
            let mut woken = vec![qid];
            woken.extend(published);
            // The session's earlier work comes with them: what this process saw of it.
            let visible = self.staged.commit(&txn, enqueued_before, dequeued_before, &woken, Some((qid, rows)));
            self.settle(session, next, version);
            self.wake_visible(visible);
        } else {
            self.settle(session, next, version);
            if commit_now {
                // These rows are all the commit made visible: waiters judge them alone.
                self.wake_arrived(qid, rows);
            } else if !session.propagates && self.waiters.any(qid) {
                // Kept only while receives wait on the queue: without them, the commit's
                // wake-up has nobody to spare a look (one that starts waiting meanwhile
                // finds the transaction unknown, and looks).
                self.staged.add(&txn, enqueued_before, qid, &rows, self.now());
            }
        }
        Ok(response)
    }

    /// Writes the rows: in one atomic insert when nothing else is to commit and no session
    /// row to write, else in a transaction (a propagation batch's held one) with the
    /// session row and idempotency record, the session's earlier work published if it
    /// commits. The session row's version, and the queues the publish woke.
    async fn write_rows(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        rows: &[NewMessage],
        next: &SessionState,
        response: &Response,
        req: &EnqueueRequest,
    ) -> Result<(Option<i64>, Vec<QueueId>), AqError> {
        let commit_now = req.producer.visibility == Visibility::Immediate || req.commit;
        let commit_session = req.commit && session.pending;
        if commit_now && !commit_session && !self.sealed(session) && !session.held.is_active() {
            self.store.insert_committed(rows, session.origin).await?;
            return Ok((None, Vec::new()));
        }
        // Tagged rows, published by a later durable commit: see `begin_provisional`.
        let provisional = !commit_now;
        // A propagation batch's send continues the transaction its receive removed the
        // messages in (`HeldTx`): its commit is the batch's only one.
        let (mut tx, held) = self.held_or_begin(session, provisional).await?;
        if held && !req.commit {
            // The batch's copies, committed with its removes by a later commit (which
            // wakes the queue): the transaction stays held, and still no session row.
            tx.insert_messages(rows).await?;
            session.held.keep(tx, rows.first().map(|r| r.queue));
            return Ok((None, Vec::new()));
        }
        // Sealed first: a backend may write the session row with the insert.
        let v = self.seal(&mut *tx, session, next, Some(response)).await?;
        tx.insert_messages(rows).await?;
        // A held transaction's removes are done already, and its send commits it
        // (`execute` lets no other send into it): nothing to publish.
        let mut woken = Vec::new();
        if commit_session && !held {
            woken = publish(&mut *tx, resolved, session, session.dequeued).await?;
        }
        if req.commit {
            self.tally(&mut *tx, session).await?;
        }
        self.commit_tx(tx).await?;
        if held {
            session.held.end();
        }
        Ok((v, woken))
    }
}

impl Enqueue<'_> {
    /// One message of the request as a row to store: its header checked, its payload
    /// encoded for the queue, its times (a propagated copy's carried), its consumers.
    pub(super) fn new_message(
        &self,
        m: &Message,
        carried: Option<&Carried>,
        enq_txn: Option<String>,
    ) -> Result<NewMessage, AqError> {
        let (queue, catalog) = (self.queue, &self.resolved.catalog);
        let h = &m.header;
        let (delay, expiration, sender) = checked_header(h, catalog, queue)?;
        let priority = h.priority.unwrap_or(1);
        let payload = payload::encode(&queue.payload, &catalog.types, &m.payload)
            .map_err(|e| AqError::client(code::PAYLOAD_MISMATCH, format!("payload does not match queue type: {e}")))?;
        // UUIDv7: time-ordered, so the unique index on message ids is appended to, not
        // written at random pages; 74 random bits keep them unique across processes.
        let msgid = *uuid::Uuid::now_v7().as_bytes();
        let now = self.now;
        let (enq_time, delay_until, expire_at) = match carried {
            // A propagated message keeps its times: first enqueued then, ready and expiring
            // when it would have been in its source.
            Some(c) => (c.enq_time, c.delay_until, c.expire_at),
            None => (
                now,
                (delay > 0).then(|| now.saturating_add(delay.saturating_mul(MICROS_PER_SEC))),
                (expiration > 0)
                    .then(|| now.saturating_add(delay.saturating_add(expiration).saturating_mul(MICROS_PER_SEC))),
            ),
        };
        let mut row = NewMessage {
            msgid,
            queue: self.qid,
            corrid: h.correlation.clone(),
            priority,
            enq_time,
            delay_until,
            expire_at,
            sender,
            // The authenticated agent, apart from what sender_id says; a propagation job's
            // copy keeps the agent that enqueued the source message.
            enq_user_id: match carried {
                Some(c) => c.enq_user_id.clone(),
                None => Some(self.enq_user.to_string()),
            },
            exception_queue: h.exception_queue.as_deref().map(canon),
            payload,
            enq_txn,
            consumers: Vec::new(),
            prio_key: match queue.sort {
                SortOrder::EnqTime => 0,
                SortOrder::PriorityEnqTime => priority,
                // The enqueue time first; within one time, the insert order (see `enqueue`).
                SortOrder::EnqTimePriority => enq_time,
            },
            spilled: false,
            group: None,
            enq_txn_id: None,
            origin: carried.and_then(|c| c.origin),
        };
        row.consumers = self.consumers(h, &row)?;
        if row.consumers.is_empty() {
            return Err(AqError::client(
                code::NO_RECIPIENTS,
                format!("no recipients for message: queue {} has no matching subscriber", queue.name),
            ));
        }
        Ok(row)
    }

    /// The consumers of a new message: a single-consumer queue's one (a recipient list is
    /// refused there), else those its recipient list names, else the subscribers whose
    /// rules take it.
    fn consumers(&self, h: &MessageHeader, row: &NewMessage) -> Result<Vec<String>, AqError> {
        let queue = self.queue;
        if !queue.multi_consumer {
            if !h.recipient_list.is_empty() {
                return Err(AqError::client(
                    code::NOT_MULTI_CONSUMER,
                    format!("recipient_list given, but queue {} is not a multi-consumer queue", queue.name),
                ));
            }
            return Ok(vec![String::new()]);
        }
        if !h.recipient_list.is_empty() {
            return named_recipients(h);
        }
        let types = &self.resolved.catalog.types;
        let view = context::MessageContext::for_new(row, &queue.name, &queue.payload, types);
        let mut names = Vec::new();
        for s in &queue.subscribers {
            let takes = match &s.rule {
                None => true,
                Some(r) => self.work.eval(&|| format!("rule of subscriber {}", s.name), r, &view, row.payload.len())?,
            };
            if takes {
                names.push(s.name.clone());
            }
        }
        Ok(names)
    }
}

/// The first mention of each name of a message's recipient list, in the list's order; a
/// set makes the duplicate check linear (the list's length is capped:
/// `check_recipient_counts`).
fn named_recipients(h: &MessageHeader) -> Result<Vec<String>, AqError> {
    let mut names = Vec::with_capacity(h.recipient_list.len());
    let mut seen = std::collections::HashSet::with_capacity(h.recipient_list.len());
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
        if seen.insert(n.clone()) {
            names.push(n);
        }
    }
    Ok(names)
}

/// The checks of a new message's header that need no payload: fields the server fills in
/// left out, the correlation's length, the delay and expiration, the sender (without an
/// alias left), the exception queue (one of the queue's table). Its delay, expiration and
/// sender (as stored).
fn checked_header(
    h: &MessageHeader,
    catalog: &Catalog,
    queue: &QueueInfo,
) -> Result<(i64, i64, Option<String>), AqError> {
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
        if let Some(target) = catalog.queue(eq)
            && !exception_queue_of(target, queue)
        {
            return Err(AqError::invalid(format!(
                "exception_queue {} is not an exception queue of queue table {}",
                target.name, queue.queue_table
            )));
        }
    }
    Ok((delay, expiration, sender))
}

impl Engine {
    /// Refuses the whole request (24031) if a message's `recipient_list` names more than
    /// [`EngineConfig::max_recipients`] recipients (duplicates counted: the list as sent).
    /// A request refused before it reached the engine for a recipient list far over the
    /// cap (the parser stopped at it): counted with the engine's own refusals.
    pub fn recipient_list_refused(&self) {
        self.recipients_refused.inc();
    }

    pub(super) fn check_recipient_counts(&self, messages: &[Message]) -> Result<(), AqError> {
        let max = self.config.max_recipients;
        for (i, m) in messages.iter().enumerate() {
            let count = m.header.recipient_list.len();
            if count > max {
                self.recipients_refused.inc();
                let n = m.number.unwrap_or(u32::try_from(i + 1).unwrap_or(u32::MAX));
                return Err(AqError::invalid(format!(
                    "message {n}: recipient_list names {count} recipients, and a message may name at most {max} \
                     (--max-recipients): nothing was enqueued; send to fewer recipients per message, or to \
                     subscribers"
                )));
            }
        }
        Ok(())
    }

    /// The delay an `AQ-Schedule` gives the messages of a request to a remote queue space.
    fn scheduled_delay(&self, s: &ClientSchedule, r: &RemoteTarget, now: Micros) -> Result<i64, AqError> {
        let schedule = schedule::Schedule::parse(s).map_err(AqError::invalid)?;
        let delay = schedule.delay(now, &|t| self.clock.utc_offset(t));
        if schedule.is_relative() && delay > r.max_delay {
            return Err(too_late(&format!("AQ-Schedule {}", s.value.trim()), delay, r));
        }
        Ok(delay)
    }

    /// Replaces `agent_alias` in sender_id and recipient_list by the agent it names.
    pub(super) async fn resolve_aliases(&self, h: &mut MessageHeader) -> Result<(), AqError> {
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

/// A message's delay to a remote queue space: the request's schedule, or its own `delay`
/// (relative, so at most the space's `max_delay`); not both.
fn remote_delay(r: &RemoteTarget, h: &mut MessageHeader, scheduled: Option<i64>) -> Result<(), AqError> {
    match (scheduled, h.delay) {
        (Some(_), Some(_)) => Err(AqError::invalid("the message has a delay and the request an AQ-Schedule: give one")),
        (Some(d), None) => {
            h.delay = Some(d);
            Ok(())
        }
        (None, Some(d)) if d > r.max_delay => Err(too_late("delay", d, r)),
        (None, _) => Ok(()),
    }
}

fn too_late(what: &str, delay: i64, r: &RemoteTarget) -> AqError {
    AqError::invalid(format!(
        "{what}: a delay of {delay} s is more than remote queue space {} takes (max_delay {} s)",
        r.space, r.max_delay
    ))
}

/// The space's `max_message_size` (its payload types are the queue's, checked as any
/// queue's payload type), and for a message a local propagation job carries in with its
/// delay end, `max_delay` on what remains of that delay (the relative delay it leaves with).
fn remote_limits(r: &RemoteTarget, row: NewMessage, carried: bool, now: Micros) -> Result<NewMessage, AqError> {
    if carried && let Some(until) = row.delay_until {
        let left = until.saturating_sub(now).max(0).saturating_add(MICROS_PER_SEC - 1) / MICROS_PER_SEC;
        if left > r.max_delay {
            return Err(too_late("the delay it carries", left, r));
        }
    }
    if let Some(max) = r.max_message_size
        && row.payload.len() as u64 > max
    {
        return Err(AqError::invalid(format!(
            "the payload of {} bytes is larger than remote queue space {} takes (max_message_size {max})",
            row.payload.len(),
            r.space
        )));
    }
    Ok(row)
}

/// A message's `sender_id` is the application's, as in Oracle: kept as given (an
/// `agent_alias` resolved through the directory), and it need not name an agent of the
/// topology (`APP_X`). The agent the request is authenticated as — the Basic, certificate
/// or SAML login over HTTP, the verified signer over mail (which the mail gateway names
/// with `AQ-On-Behalf-Of`) — is recorded apart from it, as the message's ENQ_USER_ID.
///
/// A `sender_id` without a name, or none, gets the authenticated agent's name (Oracle
/// leaves it NULL): an IDAP receiver of a non-JMS message sees no ENQ_USER_ID, so this is
/// how it learns who sent a message that names nobody, the signer of a mail in particular;
/// and the name filled in is true, so it passes the check of a secure queue too. The
/// address and protocol a client gives are kept.
///
/// On a secure queue (`secure = true` on its queue table) the name must be an agent
/// enabled for a database user the request enqueues as: a user of the authenticated
/// agent's `db_users` through which it holds the enqueue privilege on the queue (owner
/// schema or grant; Oracle's session user), among the sender's own `db_users` (Oracle's
/// ENABLE_DB_ACCESS). Anything else is refused with 24093, naming agent, users and queue.
fn check_sender(catalog: &Catalog, h: &mut MessageHeader, agent: &AgentInfo, queue: &QueueInfo) -> Result<(), AqError> {
    let sender = h.sender_id.get_or_insert_with(AgentRef::default);
    let Some(name) = sender.name.as_deref().map(str::trim).filter(|n| !n.is_empty()) else {
        sender.name = Some(agent.name.clone());
        return Ok(());
    };
    if !queue.secure {
        return Ok(());
    }
    let users = catalog.enqueue_users(agent, queue);
    let named = canon(name);
    let problem = match catalog.agent(&named) {
        Some(a) if a.db_users.iter().any(|u| users.contains(&u.as_str())) => return Ok(()),
        Some(_) => format!("agent {named} is not enabled for"),
        None => format!("{named} is no agent, so it is not enabled for"),
    };
    let users = users.join(" or ");
    Err(AqError::client(
        code::AGENT_NOT_ENABLED,
        format!(
            "sender_id names {named}, but queue {} is in secure queue table {}: {problem} database user {users}, \
             as which {} enqueues to it; name an agent whose db_users include {users} (such as {}), or leave \
             sender_id out",
            queue.name, queue.queue_table, agent.name, agent.name
        ),
    ))
}

pub(super) fn agent_json(a: &AgentRef) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    /// The demo's shape: scott (QS, AQUSER) and john (OE, AQUSER); OE may enqueue to QS's
    /// queue; QS's queue table is secure, AQUSER's is not.
    fn catalog() -> Catalog {
        let t = Topology::from_toml(
            r#"
            [[queue_tables]]
            name = "QS.T"
            payload_type = "RAW"
            secure = true
            [[queues]]
            name = "QS.Q"
            queue_table = "QS.T"
            [[queue_tables]]
            name = "AQUSER.T"
            payload_type = "RAW"
            [[queues]]
            name = "AQUSER.Q"
            queue_table = "AQUSER.T"
            [[agents]]
            name = "scott"
            db_users = ["QS", "AQUSER"]
            [[agents]]
            name = "john"
            db_users = ["OE", "AQUSER"]
            [[agents]]
            name = "clerk"
            db_users = ["OE"]
            [[grants]]
            user = "OE"
            queue = "QS.Q"
            privilege = "enqueue"
            "#,
        )
        .expect("toml");
        t.resolve(&|p| Ok(p.to_string())).expect("resolves")
    }

    fn header(sender: Option<&str>) -> MessageHeader {
        MessageHeader {
            sender_id: sender.map(|n| AgentRef { name: Some(n.into()), ..AgentRef::default() }),
            ..MessageHeader::default()
        }
    }

    fn sender_after(c: &Catalog, agent: &str, queue: &str, sender: Option<&str>) -> Result<Option<String>, AqError> {
        let (agent, queue) = (c.agent(agent).expect("agent"), c.queue(queue).expect("queue"));
        let mut h = header(sender);
        check_sender(c, &mut h, agent, queue).map(|()| h.sender_id.and_then(|s| s.name))
    }

    #[test]
    fn an_ordinary_queue_keeps_sender_id_as_given() {
        let c = catalog();
        for given in ["john", "APP_X", "scott"] {
            assert_eq!(sender_after(&c, "scott", "AQUSER.Q", Some(given)), Ok(Some(given.to_string())));
        }
        // Absent (or empty): the authenticated agent.
        assert_eq!(sender_after(&c, "scott", "AQUSER.Q", None), Ok(Some("SCOTT".into())));
        assert_eq!(sender_after(&c, "john", "AQUSER.Q", Some("  ")), Ok(Some("JOHN".into())));
    }

    #[test]
    fn a_secure_queue_takes_agents_enabled_for_the_user_the_request_enqueues_as() {
        let c = catalog();
        // scott enqueues to QS.Q as QS (owner): scott is enabled for QS, john is not.
        assert_eq!(sender_after(&c, "scott", "QS.Q", Some("scott")), Ok(Some("scott".into())));
        assert_eq!(sender_after(&c, "scott", "QS.Q", None), Ok(Some("SCOTT".into())));
        let e = sender_after(&c, "scott", "QS.Q", Some("john")).expect_err("john is not enabled for QS");
        assert_eq!(e.code, code::AGENT_NOT_ENABLED);
        assert!(
            e.message.contains(
                "sender_id names JOHN, but queue QS.Q is in secure queue table QS.T: agent JOHN is not \
                 enabled for database user QS, as which SCOTT enqueues to it"
            ),
            "{}",
            e.message
        );
        let e = sender_after(&c, "scott", "QS.Q", Some("APP_X")).expect_err("no agent");
        assert_eq!(e.code, code::AGENT_NOT_ENABLED);
        assert!(e.message.contains("APP_X is no agent"), "{}", e.message);
        // john enqueues to QS.Q as OE (the grant), not as AQUSER: clerk (OE) may be named,
        // scott (QS, AQUSER) may not, although scott and john share AQUSER.
        assert_eq!(sender_after(&c, "john", "QS.Q", Some("Clerk")), Ok(Some("Clerk".into())));
        let e = sender_after(&c, "john", "QS.Q", Some("scott")).expect_err("scott is not enabled for OE");
        assert!(e.message.contains("database user OE, as which JOHN enqueues"), "{}", e.message);
        assert!(e.message.contains("(such as JOHN)"), "{}", e.message);
    }

    #[test]
    fn the_users_a_request_enqueues_as_are_those_holding_the_privilege() {
        let c = catalog();
        let q = c.queue("QS.Q").expect("queue");
        assert_eq!(c.enqueue_users(c.agent("scott").expect("scott"), q), ["QS"]);
        assert_eq!(c.enqueue_users(c.agent("john").expect("john"), q), ["OE"]);
        assert!(c.queue("QS.Q").is_some_and(|q| q.secure));
        assert!(c.queue("QS.AQ$_T_E").is_some_and(|q| q.secure), "the default exception queue is of the same table");
        assert!(c.queue("AQUSER.Q").is_some_and(|q| !q.secure));
    }
}
