//! Dequeue: AQXmlReceive (REMOVE / BROWSE / LOCKED, FIRST / NEXT navigation, selectors,
//! long polls).

use std::time::Duration;

use super::*;
use crate::clock::Micros;
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::payload;
use crate::selector::Condition;
use crate::store::*;
use crate::topology::{AgentInfo, Privilege, QueueInfo, canon};

impl Engine {
    /// The queue a dequeue (or a LISTEN: `what`) names, checked as a dequeue is: it exists,
    /// is not a remote space's, the agent may dequeue from it, it is enabled for dequeue,
    /// and the consumer fits its model. With its id and the consumer.
    pub(super) async fn dequeue_target<'r>(
        &self,
        resolved: &'r Resolved,
        agent: &AgentInfo,
        destination: &Destination,
        consumer_name: Option<&str>,
        what: &str,
    ) -> Result<(&'r QueueInfo, QueueId, String), AqError> {
        let dest = self.destination_name(destination).await?;
        let (queue, qid) = resolved.queue(&dest)?;
        not_remote(queue, agent, "dequeue from")?;
        if !resolved.catalog.permits(agent, queue, Privilege::Dequeue) {
            return Err(not_permitted(agent, "dequeue from", &queue.name));
        }
        if !queue.dequeue_enabled {
            return Err(AqError::client(
                code::DEQUEUE_DISABLED,
                format!("{what} failed, queue {} is not enabled for dequeue", queue.name),
            ));
        }
        Ok((queue, qid, consumer_for(queue, consumer_name)?))
    }

    pub(super) async fn receive(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: ReceiveRequest,
    ) -> Result<ReceiveResult, AqError> {
        let o = &req.consumer;
        let (queue, qid, consumer) =
            self.dequeue_target(resolved, agent, &o.destination, o.consumer_name.as_deref(), "dequeue").await?;
        self.check_buffered_receive(session, o)?;
        let transformation = transform::for_dequeue(&resolved.catalog, o.transformation.as_deref(), queue, &consumer)?;
        self.check_grouping(queue, o)?;
        if o.dequeue_mode == DequeueMode::Locked && o.visibility == Visibility::Immediate {
            return Err(AqError::invalid("a LOCKED dequeue holds its lock until commit: use ON_COMMIT visibility"));
        }
        let work = self.work();
        let mut filter = Filter { corrid: None, msgid: None, condition: None, transformation, work };
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
        let deadline = self.clock.instant() + wait;
        let mut interest: Option<crate::store::Interest> = None;
        let mut waiting: Option<LongPoll<'_>> = None;
        let mut over_cap = false;
        let abandon = session.abandon.clone();
        // Registered before the first look: a change after it is not missed.
        let slot = self.waiters.register(qid, &consumer);
        loop {
            // This look sees whatever was told before it.
            slot.take();
            if abandon.as_ref().is_some_and(|a| a.is_abandoned()) {
                // Nobody is there to receive: take nothing.
                return Err(AqError::client(code::NO_MESSAGE, "the client went away during the dequeue wait"));
            }
            filter.work.renew();
            let messages = self.try_receive_any(resolved, session, queue, qid, &consumer, &req, &filter).await?;
            if !messages.is_empty() {
                return Ok(ReceiveResult { destination: queue.name.clone(), messages });
            }
            let now_i = self.clock.instant();
            if now_i >= deadline {
                break;
            }
            // One agent's long polls are capped: one more is a receive that does not wait.
            if waiting.is_none() {
                match self.long_poll(&agent.name) {
                    Some(w) => waiting = Some(w),
                    None => {
                        over_cap = true;
                        break;
                    }
                }
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
            // Wait for a change this receive may find something in: new messages are judged
            // here, against the selector, and only one that passes sends it to look again.
            loop {
                let gone = async {
                    match &abandon {
                        Some(a) => a.abandoned().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.clock.sleep_until(until) => break,
                    () = slot.notified() => {}
                    () = gone => break,
                }
                let p = slot.take();
                if p.rescan || queue.grouped {
                    break;
                }
                let serves = |m: &NewMessage| {
                    // A delayed one may pass once its delay ends (its state changes): the
                    // wait is cut to that, by looking again.
                    m.consumers.iter().any(|c| c == slot.consumer())
                        && (m.delay_until.is_some() || filter.matches_new(m, slot.consumer(), queue, resolved))
                };
                if p.arrived.iter().any(|set| set.iter().any(serves)) {
                    break;
                }
                self.long_poll_wakes_judged.inc();
            }
        }
        if filter.msgid.is_some() {
            return Err(AqError::client(
                code::NO_SUCH_MESSAGE_ID,
                format!("no message in queue {} with the given message ID", queue.name),
            ));
        }
        if over_cap {
            return Err(AqError::client(
                code::NO_MESSAGE,
                format!(
                    "no message in {} now, and not waiting: agent {} has {} receives waiting already (--max-long-polls-per-agent)",
                    queue.name, agent.name, self.config.max_long_polls_per_agent
                ),
            ));
        }
        Err(AqError::client(
            code::NO_MESSAGE,
            format!("timeout or end-of-fetch during message dequeue from {}", queue.name),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn try_receive(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        queue: &QueueInfo,
        qid: QueueId,
        consumer: &str,
        req: &ReceiveRequest,
        filter: &Filter,
        stored: Stored,
    ) -> Result<Vec<Message>, AqError> {
        let o = &req.consumer;
        let now = self.now();
        session.received.clear();
        // More than one only for a session that asks (a propagation job), and never for a
        // browse (its position is one message).
        let want = if o.dequeue_mode == DequeueMode::Browse { 1 } else { session.max_messages.clamp(1, 1000) as usize };
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
            && queue.retention.is_none()
            && want == 1
            && filter.transformation.is_none()
            && !queue.grouped
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
                include_waiting: false,
                limit: 1,
                stored,
            };
            let Some(m) = self.store.take_head(&q, session.origin).await? else { return Ok(Vec::new()) };
            let out = match self.message_out(resolved, queue, &m, now, !session.propagates, None) {
                Ok(out) => out,
                Err(e) => {
                    // Removed already, but not returnable: put it back (at the end of its
                    // priority), so that the Fault loses nothing.
                    self.put_back(&m, stored == Stored::Spilled).await?;
                    return Err(e);
                }
            };
            // A session without a row that ends its transaction: nothing to keep.
            session.end_transaction();
            return Ok(vec![out]);
        }
        // A propagation batch from a single-consumer queue without history takes its
        // messages in a transaction its send continues (`HeldTx`): removed at once, not
        // locked, since nothing of it is visible until the send's commit. Not with a
        // condition (the rows it passes over would stay locked for the whole batch) nor on
        // a grouped queue (whose groups are claimed by committed locks).
        let holds = session.one_transaction
            && session.propagates
            && !session.pending
            && self.store.holds_transactions()
            && o.dequeue_mode == DequeueMode::Remove
            && !remove_now
            && !queue.multi_consumer
            && !queue.keeps_history()
            && !queue.grouped
            && filter.condition.is_none()
            && session.idempotency.is_none();
        let mut tx = if holds { self.store.begin_held().await? } else { self.store.begin().await? };
        let mut found = Vec::new();
        // Exception queues that got a message this request's removes left to consumers
        // that gave up on it.
        let mut moved = Vec::new();
        // A grouped queue navigates by groups (a propagation job's session moves messages
        // as from any queue: see `grouping`).
        let grouped = queue.grouped && !session.propagates;
        let mut group_at = None;
        if grouped {
            let taken = self
                .take_grouped(&mut *tx, resolved, session, queue, qid, consumer, o, filter, stored, remove_now)
                .await;
            match taken {
                Ok((f, g)) => (found, group_at) = (f, g),
                Err(e) => {
                    tx.rollback().await?;
                    return Err(e);
                }
            }
        }
        // Scan from the position; REMOVE and LOCKED wrap around once so that a consumer
        // never starves on messages sorted before its position (e.g. higher priority).
        let passes: &[Option<Position>] = if grouped {
            &[]
        } else if start.is_some() && !browse {
            &[start, None]
        } else {
            &[start]
        };
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
                include_waiting: session.propagates && !session.ready_only && !browse,
                // Without a condition the first candidate is normally the answer: fetch one
                // payload, not a page of them.
                limit: if filter.condition.is_some() {
                    SCAN_BATCH.max(want as i64)
                } else {
                    i64::try_from(want).unwrap_or(1)
                },
                stored,
            };
            loop {
                let batch = tx.candidates(&q).await?;
                let mut exhausted = (batch.len() as i64) < q.limit;
                // The candidates that meet the condition, as many as are still wanted; then
                // taken together (one statement for a job's batch).
                let mut picked = Vec::new();
                for m in batch {
                    if found.len() + picked.len() >= want {
                        // Not looked at: the next query starts from here.
                        exhausted = false;
                        break;
                    }
                    q.after = Some(Position { prio_key: m.prio_key, seq: m.seq });
                    match filter.matches_condition(&m, queue, resolved) {
                        Ok(true) => picked.push(m),
                        Ok(false) => {}
                        Err(e) => {
                            // Over its budget: the locks this scan took go with the Fault.
                            tx.rollback().await?;
                            return Err(e);
                        }
                    }
                }
                match o.dequeue_mode {
                    DequeueMode::Browse => found.extend(picked),
                    DequeueMode::Remove if holds => {
                        let seqs: Vec<i64> = picked.iter().map(|m| m.seq).collect();
                        let removed: std::collections::HashSet<i64> =
                            tx.remove_singles(&seqs, &session.txn).await?.into_iter().collect();
                        found.extend(picked.into_iter().filter(|m| removed.contains(&m.seq)));
                    }
                    DequeueMode::Remove if remove_now => {
                        for m in picked {
                            match tx.remove_now(m.seq, consumer, &session.txn, queue.multi_consumer).await? {
                                Removal::Missed => continue,
                                Removal::Removed => {}
                                // The consumers left gave up on it: it moves now.
                                Removal::Stranded(s) => moved.extend(move_stranded(&mut *tx, resolved, &[s]).await?),
                            }
                            found.push(m);
                        }
                    }
                    DequeueMode::Locked | DequeueMode::Remove => {
                        let kind =
                            if o.dequeue_mode == DequeueMode::Locked { LockKind::Locked } else { LockKind::Remove };
                        let taken: std::collections::HashSet<i64> = match picked.as_slice() {
                            [] => Default::default(),
                            [m] => {
                                if tx.lock(m.seq, consumer, &session.txn, kind).await? {
                                    [m.seq].into()
                                } else {
                                    Default::default()
                                }
                            }
                            _ => {
                                let seqs: Vec<i64> = picked.iter().map(|m| m.seq).collect();
                                tx.lock_many(&seqs, consumer, &session.txn, kind).await?.into_iter().collect()
                            }
                        };
                        found.extend(picked.into_iter().filter(|m| taken.contains(&m.seq)));
                    }
                }
                if found.len() >= want {
                    break 'passes;
                }
                if exhausted {
                    break;
                }
            }
        }
        if found.is_empty() {
            tx.rollback().await?;
            if browse && o.navigation == NavigationMode::NextMessage && session.positions.contains_key(&key) {
                // End of fetch: the next browse starts from the beginning again.
                let mut next = session.state();
                next.positions.remove(&key);
                next.groups.remove(&key);
                self.seal_alone(session, next).await?;
            }
            return Ok(Vec::new());
        }
        // Decoded before anything commits: a message that cannot be returned is neither
        // removed nor locked nor passed by the browse position (a Fault changes nothing).
        let outs = match found
            .iter()
            .map(|m| self.message_out(resolved, queue, m, now, !session.propagates, filter.transformation.as_deref()))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(outs) => outs,
            Err(e) => {
                // Rolled back now, not when the pool gets to the dropped transaction: the
                // locks it took must be gone when the Fault is answered.
                tx.rollback().await?;
                return Err(e);
            }
        };
        if session.propagates {
            session.received = found
                .iter()
                .map(|m| Carried {
                    enq_time: m.enq_time,
                    delay_until: m.delay_until,
                    expire_at: m.expire_at,
                    enq_user_id: m.enq_user_id.clone(),
                    origin: Some(Origin { msgid: m.msgid, queue: m.queue, why: None }),
                })
                .collect();
        }
        let takes_lock = !browse && !remove_now;
        if o.dequeue_mode == DequeueMode::Remove && queue.keeps_history() {
            // Who took them, in the same transaction as the removes, and in which IDAP
            // transaction (Oracle's DEQ_TXN_ID): a rollback of a pending remove takes its
            // row back with it. An IMMEDIATE remove inside an open transaction is not that
            // transaction's: it has its own.
            let txn = if o.visibility != Visibility::Immediate || req.commit {
                session.txn.clone()
            } else {
                super::session::random_id()
            };
            let txn = Some(txn);
            let rows: Vec<DequeueRecord> = found
                .iter()
                .filter(|m| m.state != SPILLED)
                .map(|m| DequeueRecord {
                    seq: m.seq,
                    consumer: consumer.to_string(),
                    deq_time: now,
                    deq_user_id: session.agent.clone(),
                    txn: txn.clone(),
                    retry_count: m.retry_count,
                })
                .collect();
            if !rows.is_empty() {
                tx.record_dequeues(&rows).await?;
            }
        }
        let mut next = session.state();
        if let Some(g) = group_at {
            next.groups.insert(key.clone(), g);
        }
        if let Some(m) = found.last() {
            next.positions.insert(key, Position { prio_key: m.prio_key, seq: m.seq });
        }
        if req.commit {
            next.end_transaction();
        } else if takes_lock {
            next.pending = true;
            next.dequeued = true;
        }
        if holds {
            // No session row: a crash ends the transaction, and the messages are back.
            self.settle(session, next, None);
            session.held.hold(tx, qid);
            return Ok(outs);
        }
        // A browse takes, locks and removes nothing: under an idempotency key it is not
        // recorded (a retry browses again), unless it commits the session's earlier work.
        let changes = !browse || (req.commit && session.pending);
        let response = (session.idempotency.is_some() && changes).then(|| {
            Response::Receive(
                StatusResponse::ok(),
                Some(ReceiveResult { destination: queue.name.clone(), messages: outs.clone() }),
            )
        });
        let version = self.seal(&mut *tx, session, &next, response.as_ref()).await?;
        let mut woken = moved;
        if req.commit && (session.pending || takes_lock) {
            woken.extend(publish(&mut *tx, resolved, session, session.dequeued || takes_lock).await?);
        }
        if req.commit {
            self.tally(&mut *tx, session).await?;
        }
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(outs)
    }

    /// A fresh budget for the conditions of one scan.
    pub(super) fn work(&self) -> work::Work {
        work::Work::new(self.config.conditions, self.condition_refused.clone())
    }

    /// Enqueues a single-consumer message taken by `take_head` again, as it was.
    pub(super) async fn put_back(&self, m: &StoredMessage, spilled: bool) -> Result<(), AqError> {
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
            enq_user_id: m.enq_user_id.clone(),
            exception_queue: m.exception_queue.clone(),
            payload: m.payload.clone(),
            enq_txn: None,
            // The single consumer's delivery (take_head serves single-consumer queues).
            consumers: vec![String::new()],
            prio_key: m.prio_key,
            spilled: spilled || m.state == SPILLED,
            group: None,
            // What the take returned: these two are not among it.
            enq_txn_id: None,
            origin: None,
        };
        self.store.insert_committed(std::slice::from_ref(&row), 0).await?;
        Ok(())
    }

    /// A stored message as a receiver gets it. `jms_server_fields`: a JMS message shows the
    /// agent that enqueued it as `oracle_jms_properties/userid` (JMSXUserID) and its enqueue
    /// time in milliseconds as `timestamp` (JMSTimestamp). A propagation job asks without:
    /// it sends the payload on, where both are the server's to set, and carries the
    /// enqueuing agent and the times itself (`Session::received`). With `transformation` the
    /// receiver gets the payload it makes (an object type, without JMS properties).
    pub(super) fn message_out(
        &self,
        resolved: &Resolved,
        queue: &QueueInfo,
        m: &StoredMessage,
        now: Micros,
        jms_server_fields: bool,
        transformation: Option<&payload::Transformation>,
    ) -> Result<Message, AqError> {
        let mut payload = match transformation {
            Some(t) => transform::outgoing(&resolved.catalog, t, &m.payload, &self.config.conditions)?,
            None => payload::decode(&queue.payload, &resolved.catalog.types, &m.payload)
                .map_err(|e| AqError::server(code::INTERNAL, format!("stored payload cannot be decoded: {e}")))?,
        };
        let jms = queue.payload.is_jms()
            || (queue.payload == payload::PayloadKind::AnyData
                && payload::type_of_returned(&payload)
                    .is_some_and(|t| matches!(t, payload::AnyType::Kind(k) if k.is_jms())));
        if jms_server_fields && transformation.is_none() && jms {
            if let Some(u) = &m.enq_user_id {
                payload::set_jms_userid(&mut payload, u);
            }
            payload::set_jms_timestamp(&mut payload, m.enq_time.div_euclid(1000));
        }
        Ok(Message { number: Some(1), header: header_of(m, queue, now), payload })
    }
}

pub(super) struct Filter {
    pub(super) corrid: Option<String>,
    pub(super) msgid: Option<[u8; 16]>,
    condition: Option<Condition>,
    /// Applied to each message returned; a failure returns none of them (nothing is
    /// removed, locked or passed).
    pub(super) transformation: Option<std::sync::Arc<payload::Transformation>>,
    /// The budget of the condition's evaluations in one scan.
    pub(super) work: work::Work,
}

impl Filter {
    /// Whether a condition is to be evaluated (a scan fetches a page of candidates then).
    pub(super) fn has_condition(&self) -> bool {
        self.condition.is_some()
    }

    /// Whether the new message `m` passes the selector of a receive as `consumer` (what
    /// the store's query checks of correlation and message id, and the condition): a
    /// waiting receive's judgement of what arrived (see `wake`). A condition over one
    /// evaluation's budget counts as passing: the look that follows refuses it.
    pub(super) fn matches_new(&self, m: &NewMessage, consumer: &str, queue: &QueueInfo, resolved: &Resolved) -> bool {
        if self.corrid.as_ref().is_some_and(|c| m.corrid.as_ref() != Some(c)) {
            return false;
        }
        if self.msgid.is_some_and(|id| id != m.msgid) {
            return false;
        }
        self.condition.as_ref().is_none_or(|c| {
            self.work.may_match(
                c,
                &context::MessageContext::for_new(m, &queue.name, &queue.payload, &resolved.catalog.types)
                    .as_consumer(consumer),
            )
        })
    }

    /// Whether `m` passes the selector (what the store's query checks of correlation and
    /// message id, and the condition), for messages the store does not hold. A condition
    /// over its budget is a Fault (2393).
    pub(super) fn matches(&self, m: &StoredMessage, queue: &QueueInfo, resolved: &Resolved) -> Result<bool, AqError> {
        if self.corrid.as_ref().is_some_and(|c| m.corrid.as_ref() != Some(c)) {
            return Ok(false);
        }
        if self.msgid.is_some_and(|id| id != m.msgid) {
            return Ok(false);
        }
        self.matches_condition(m, queue, resolved)
    }

    /// Whether `m` meets the condition (true without one), within the scan's budget.
    pub(super) fn matches_condition(
        &self,
        m: &StoredMessage,
        queue: &QueueInfo,
        resolved: &Resolved,
    ) -> Result<bool, AqError> {
        let Some(c) = &self.condition else { return Ok(true) };
        let ctx = context::MessageContext::for_stored(m, &queue.name, &queue.payload, &resolved.catalog.types);
        self.work.eval(&|| "dequeue condition".to_string(), c, &ctx, m.payload.len())
    }
}

pub(super) fn consumer_for(queue: &QueueInfo, name: Option<&str>) -> Result<String, AqError> {
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

pub(super) fn parse_msgid(id: &str) -> Result<[u8; 16], AqError> {
    let bytes = hex::decode(id.trim()).map_err(|_| AqError::invalid("message_id is not hexadecimal"))?;
    bytes.try_into().map_err(|_| AqError::invalid("message_id must be 32 hex digits (16 bytes)"))
}

/// Refuses a condition naming something no message of `queue` can have: it would
/// silently match nothing (and a long poll would wait its whole time for nothing).
pub(super) fn check_condition_names(
    cond: &Condition,
    queue: &QueueInfo,
    types: &payload::TypeRegistry,
) -> Result<(), AqError> {
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
            NameRef::UserData(_) if queue.payload == payload::PayloadKind::AnyData => Some(format!(
                "queue {} holds SYS.ANYDATA payloads: tab.user_data cannot be looked into (use message properties)",
                queue.name
            )),
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
