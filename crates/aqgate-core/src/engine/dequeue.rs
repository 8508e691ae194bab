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

mod look;

/// What each look of a receive works with: the request and what it was resolved to.
pub(super) struct Dequeue<'a> {
    pub(super) resolved: &'a Resolved,
    pub(super) queue: &'a QueueInfo,
    pub(super) qid: QueueId,
    pub(super) consumer: &'a str,
    pub(super) req: &'a ReceiveRequest,
    pub(super) filter: &'a Filter,
}

impl Dequeue<'_> {
    /// The receive's consumer options.
    pub(super) fn options(&self) -> &ConsumerOptions {
        &self.req.consumer
    }
}

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
        let d = Dequeue { resolved, queue, qid, consumer: &consumer, req: &req, filter: &filter };
        loop {
            // This look sees whatever was told before it.
            slot.take();
            if abandon.as_ref().is_some_and(|a| a.is_abandoned()) {
                // Nobody is there to receive: take nothing.
                return Err(AqError::client(code::NO_MESSAGE, "the client went away during the dequeue wait"));
            }
            filter.work.renew();
            let messages = self.try_receive_any(&d, session).await?;
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
pub fn check_condition_names(
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
