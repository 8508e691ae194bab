//! Buffered messages (Oracle 10.2's DELIVERY_MODE BUFFERED): kept per queue in the memory
//! of the process that took them, not in the store, so an enqueue and a dequeue cost no
//! database round trip. They are not transactional (enqueue and dequeue are IMMEDIATE),
//! and they are lost when the process ends, unless they were spilled: past a queue's byte
//! threshold (oldest first) or after a time in memory, they are written to the store with
//! state [`SPILLED`], where any process's buffered dequeue takes them and only a buffered
//! one does. Flow control refuses an enqueue (ORA-25307) while a queue holds
//! [`BufferConfig::max_messages`] unspilled messages, until its consumers catch up.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use super::*;
use crate::clock::{MICROS_PER_SEC, Micros};
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::metrics::{Counter, Metrics};
use crate::store::*;
use crate::topology::QueueInfo;

/// Tunables of buffered messaging, per queue.
#[derive(Debug, Clone)]
pub struct BufferConfig {
    /// Flow control: unspilled buffered messages a queue holds at most; an enqueue beyond
    /// is refused with ORA-25307 (Oracle's default is also 5,000).
    pub max_messages: usize,
    /// Payload bytes in memory past which a queue's oldest messages are spilled.
    pub spill_bytes: usize,
    /// Messages in memory longer than this are spilled (by the time manager's round).
    pub spill_after: Duration,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self { max_messages: 5000, spill_bytes: 64 << 20, spill_after: Duration::from_secs(600) }
    }
}

/// A look that found no spilled message for a consumer is trusted this long (other
/// processes spill too); a spill of this process ends it at once.
const SPILLED_RECHECK: Micros = MICROS_PER_SEC;

/// The buffered messages of this process.
pub(super) struct Buffers {
    config: BufferConfig,
    queues: StdMutex<HashMap<QueueId, QueueBuffer>>,
    /// (queue, consumer) → until when the store is taken to hold no spilled message for it.
    none_spilled: StdMutex<HashMap<(QueueId, String), Micros>>,
    enqueued: Counter,
    dequeued: Counter,
    spilled: Counter,
    refused: Counter,
    expired: Counter,
}

#[derive(Default)]
struct QueueBuffer {
    /// By dequeue order: (prio_key, local sequence).
    msgs: BTreeMap<(i64, i64), NewMessage>,
    bytes: usize,
    next_seq: i64,
}

impl QueueBuffer {
    fn remove(&mut self, key: &(i64, i64)) -> Option<NewMessage> {
        let m = self.msgs.remove(key)?;
        self.bytes = self.bytes.saturating_sub(m.payload.len());
        Some(m)
    }

    fn insert(&mut self, m: NewMessage) {
        self.next_seq += 1;
        self.bytes += m.payload.len();
        self.msgs.insert((m.prio_key, self.next_seq), m);
    }
}

impl Buffers {
    pub(super) fn new(config: BufferConfig, metrics: &Metrics) -> Self {
        Self {
            config,
            queues: StdMutex::new(HashMap::new()),
            none_spilled: StdMutex::new(HashMap::new()),
            enqueued: metrics.counter("aqgate_buffered_enqueued_total", "Buffered messages enqueued."),
            dequeued: metrics
                .counter("aqgate_buffered_dequeued_total", "Buffered messages dequeued from memory (per consumer)."),
            spilled: metrics.counter("aqgate_buffered_spilled_total", "Buffered messages spilled to the store."),
            refused: metrics.counter(
                "aqgate_buffered_flow_control_total",
                "Buffered enqueues refused by flow control (ORA-25307).",
            ),
            expired: metrics
                .counter("aqgate_buffered_expired_total", "Buffered messages dropped from memory when they expired."),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<QueueId, QueueBuffer>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unspilled buffered messages of `queue` in this process.
    pub(super) fn len(&self, queue: QueueId) -> usize {
        self.queues().get(&queue).map_or(0, |b| b.msgs.len())
    }

    /// Takes `rows` into memory, all or none (flow control). `Ok(true)`: the queue is past
    /// its spill threshold now.
    fn admit(&self, queue: &QueueInfo, qid: QueueId, rows: Vec<NewMessage>) -> Result<bool, AqError> {
        let mut queues = self.queues();
        let b = queues.entry(qid).or_default();
        if b.msgs.len() + rows.len() > self.config.max_messages {
            self.refused.inc();
            return Err(AqError::client(
                code::FLOW_CONTROL,
                format!(
                    "enqueue rate too high, flow control enabled: queue {} holds {} buffered messages its \
                     consumers have not taken (at most {}); send again once they catch up",
                    queue.name,
                    b.msgs.len(),
                    self.config.max_messages
                ),
            ));
        }
        self.enqueued.add(rows.len() as u64);
        for r in rows {
            b.insert(r);
        }
        Ok(b.bytes > self.config.spill_bytes)
    }

    /// The first message of `qid` that `consumer` has still to take and `matches` accepts,
    /// as a [`StoredMessage`] of that consumer; taken (for that consumer) unless `peek`.
    /// Expired ones are dropped on the way.
    fn take(
        &self,
        qid: QueueId,
        consumer: &str,
        now: Micros,
        matches: &dyn Fn(&StoredMessage) -> bool,
    ) -> Option<(StoredMessage, NewMessage)> {
        let mut queues = self.queues();
        let b = queues.get_mut(&qid)?;
        let mut expired = Vec::new();
        let mut found = None;
        for (key, m) in &b.msgs {
            if m.expire_at.is_some_and(|t| t <= now) {
                expired.push(*key);
                continue;
            }
            if !m.consumers.iter().any(|c| c == consumer) {
                continue;
            }
            let s = stored_view(m, key, consumer);
            if matches(&s) {
                found = Some((*key, s));
                break;
            }
        }
        for k in &expired {
            b.remove(k);
        }
        self.expired.add(expired.len() as u64);
        let (key, s) = found?;
        self.dequeued.inc();
        let m = b.msgs.get_mut(&key)?;
        m.consumers.retain(|c| c != consumer);
        let mut one = if m.consumers.is_empty() { b.remove(&key)? } else { m.clone() };
        one.consumers = vec![consumer.to_string()];
        Some((s, one))
    }

    /// Puts a message taken by [`Buffers::take`] back (it could not be returned).
    fn put_back(&self, m: NewMessage) {
        let mut queues = self.queues();
        let b = queues.entry(m.queue).or_default();
        match b.msgs.values_mut().find(|o| o.msgid == m.msgid) {
            Some(o) => o.consumers.extend(m.consumers),
            None => b.insert(m),
        }
    }

    /// Takes out of memory what is to be spilled: messages older than the age limit (all
    /// queues, when `by_age`), and the oldest of `over` until it is under its threshold.
    fn take_spill(&self, now: Micros, by_age: bool, over: Option<QueueId>) -> Vec<NewMessage> {
        let age = i64::try_from(self.config.spill_after.as_micros()).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        let mut queues = self.queues();
        for (qid, b) in queues.iter_mut() {
            let keys: Vec<(i64, i64)> = b.msgs.keys().copied().collect();
            for key in keys {
                let old = by_age && b.msgs.get(&key).is_some_and(|m| m.enq_time.saturating_add(age) <= now);
                let heavy = over == Some(*qid) && b.bytes > self.config.spill_bytes;
                if (old || heavy)
                    && let Some(mut m) = b.remove(&key)
                {
                    m.spilled = true;
                    out.push(m);
                }
            }
        }
        out
    }

    fn spilled_may_exist(&self, qid: QueueId, consumer: &str, now: Micros) -> bool {
        let none = self.none_spilled.lock().unwrap_or_else(|p| p.into_inner());
        none.get(&(qid, consumer.to_string())).is_none_or(|until| *until <= now)
    }

    fn found_none_spilled(&self, qid: QueueId, consumer: &str, now: Micros) {
        let mut none = self.none_spilled.lock().unwrap_or_else(|p| p.into_inner());
        none.insert((qid, consumer.to_string()), now.saturating_add(SPILLED_RECHECK));
    }

    fn spilled_to(&self, queues: &[QueueId]) {
        let mut none = self.none_spilled.lock().unwrap_or_else(|p| p.into_inner());
        none.retain(|(q, _), _| !queues.contains(q));
    }
}

/// A buffered message as the consumer `consumer` sees it (its local sequence as `seq`).
fn stored_view(m: &NewMessage, key: &(i64, i64), consumer: &str) -> StoredMessage {
    StoredMessage {
        seq: key.1,
        msgid: m.msgid,
        queue: m.queue,
        consumer: consumer.to_string(),
        corrid: m.corrid.clone(),
        priority: m.priority,
        prio_key: m.prio_key,
        enq_time: m.enq_time,
        delay_until: None,
        expire_at: m.expire_at,
        sender: m.sender.clone(),
        enq_user_id: m.enq_user_id.clone(),
        exception_queue: m.exception_queue.clone(),
        payload: m.payload.clone(),
        retry_count: 0,
        state: 0,
    }
}

/// ORA-25298: a buffered enqueue or dequeue is never part of a transaction.
fn immediate_only(what: &str) -> AqError {
    AqError::client(
        code::BUFFERED_VISIBILITY,
        format!(
            "only immediate visibility mode supported for buffered message {what}: give \
             <visibility>IMMEDIATE</visibility> (buffered messages are not part of the session's transaction)"
        ),
    )
}

fn no_idempotency() -> AqError {
    AqError::invalid(
        "an Idempotency-Key cannot be honoured for buffered messages (they are not stored, so neither is the \
         answer): send without the key, or use delivery_mode PERSISTENT",
    )
}

impl Engine {
    /// A BUFFERED AQXmlSend / AQXmlPublish: the messages go into this process's memory,
    /// visible at once; a trailing AQXmlCommit commits the session's other work.
    pub(super) async fn enqueue_buffered(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        queue: &QueueInfo,
        qid: QueueId,
        req: &EnqueueRequest,
        now: Micros,
    ) -> Result<EnqueueResult, AqError> {
        self.refuse_buffered_grouping(queue)?;
        if req.producer.visibility != Visibility::Immediate {
            return Err(immediate_only("enqueue"));
        }
        if session.idempotency.is_some() {
            return Err(no_idempotency());
        }
        if let Some(r) = &queue.remote {
            return Err(AqError::invalid(format!(
                "{} is a queue of remote queue space {}: buffered messages stay in this process, so they cannot \
                 be forwarded; send them PERSISTENT",
                queue.name, r.space
            )));
        }
        let mut rows = Vec::with_capacity(req.messages.len());
        let mut ids = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            let n = m.number.unwrap_or(u32::try_from(i + 1).unwrap_or(u32::MAX));
            if m.header.delay.is_some_and(|d| d != 0) {
                return Err(AqError::client(
                    code::BUFFERED_ENQUEUE,
                    format!(
                        "message {n}: enqueue of buffered message failed, attempted to enqueue buffered message \
                         with delay: buffered messages are visible at once (leave delay out, or send PERSISTENT)"
                    ),
                ));
            }
            let row = self
                .new_message(resolved, queue, qid, m, now, None, None, &session.agent)
                .map_err(|e| AqError { message: format!("message {n}: {}", e.message), ..e })?;
            ids.push(crate::payload::hex_upper(&row.msgid));
            rows.push(row);
        }
        let over = self.buffers.admit(queue, qid, rows)?;
        self.wake(qid);
        if req.commit {
            self.commit(session).await?;
        }
        if over {
            self.spill(false, Some(qid)).await;
        }
        Ok(EnqueueResult { destination: queue.name.clone(), message_ids: ids })
    }

    /// The refusals of a BUFFERED or PERSISTENT_OR_BUFFERED dequeue that the persistent
    /// kind has not.
    pub(super) fn check_buffered_receive(&self, session: &Session, o: &ConsumerOptions) -> Result<(), AqError> {
        if o.delivery_mode == DeliveryMode::Persistent {
            return Ok(());
        }
        if o.visibility != Visibility::Immediate {
            return Err(immediate_only("dequeue"));
        }
        if o.dequeue_mode != DequeueMode::Remove {
            return Err(AqError::invalid(
                "buffered messages are dequeued with REMOVE only (a BROWSE or LOCKED of them is not supported)",
            ));
        }
        if session.idempotency.is_some() {
            return Err(no_idempotency());
        }
        Ok(())
    }

    /// One look for messages of the kinds the dequeue asks for. A buffered dequeue takes
    /// spilled messages first (they are the older ones) while the store may hold some for
    /// the consumer, then this process's memory; PERSISTENT_OR_BUFFERED then looks at the
    /// store's persistent messages too.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn try_receive_any(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        queue: &QueueInfo,
        qid: QueueId,
        consumer: &str,
        req: &ReceiveRequest,
        filter: &Filter,
    ) -> Result<Vec<Message>, AqError> {
        let stored = match req.consumer.delivery_mode {
            DeliveryMode::Persistent => {
                return self
                    .try_receive(resolved, session, queue, qid, consumer, req, filter, Stored::Persistent)
                    .await;
            }
            DeliveryMode::Buffered => Stored::Spilled,
            DeliveryMode::PersistentOrBuffered => Stored::Either,
        };
        let now = self.now();
        let spilled = self.buffers.spilled_may_exist(qid, consumer, now);
        if spilled {
            let found = self.try_receive(resolved, session, queue, qid, consumer, req, filter, stored).await?;
            if !found.is_empty() {
                return Ok(found);
            }
            self.buffers.found_none_spilled(qid, consumer, now);
        }
        let matches = |m: &StoredMessage| filter.matches(m, queue, resolved);
        if let Some((m, row)) = self.buffers.take(qid, consumer, now, &matches) {
            let out = match self.message_out(resolved, queue, &m, now, true, filter.transformation.as_deref()) {
                Ok(out) => out,
                Err(e) => {
                    self.buffers.put_back(row);
                    return Err(e);
                }
            };
            if req.commit {
                self.commit(session).await?;
            }
            return Ok(vec![out]);
        }
        if stored == Stored::Either && !spilled {
            return self.try_receive(resolved, session, queue, qid, consumer, req, filter, stored).await;
        }
        Ok(Vec::new())
    }

    /// Writes buffered messages to the store as spilled ones: those in memory past the age
    /// limit (`by_age`, the time manager's round) and the oldest of queue `over` until it
    /// is under its byte threshold. What fails to be written goes back into memory.
    pub(super) async fn spill(&self, by_age: bool, over: Option<QueueId>) {
        let rows = self.buffers.take_spill(self.now(), by_age, over);
        if rows.is_empty() {
            return;
        }
        let mut queues: Vec<QueueId> = rows.iter().map(|m| m.queue).collect();
        queues.sort_unstable();
        queues.dedup();
        match self.store.insert_committed(&rows, 0).await {
            Ok(()) => {
                self.buffers.spilled.add(rows.len() as u64);
                self.buffers.spilled_to(&queues);
                tracing::debug!(messages = rows.len(), "buffered messages spilled to the store");
                for q in queues {
                    self.wake(q);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, messages = rows.len(), "spilling buffered messages failed; they stay in memory");
                for mut m in rows {
                    m.spilled = false;
                    self.buffers.put_back(m);
                }
            }
        }
    }

    /// Unspilled buffered messages of `queue` held by this process.
    pub fn buffered_len(&self, queue: &str) -> usize {
        self.resolved().ids.get(&crate::topology::canon(queue)).map_or(0, |q| self.buffers.len(*q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(queue: QueueId, prio_key: i64, consumers: &[&str], bytes: usize, enq_time: Micros) -> NewMessage {
        NewMessage {
            msgid: *uuid::Uuid::now_v7().as_bytes(),
            queue,
            corrid: None,
            priority: 1,
            enq_time,
            delay_until: None,
            expire_at: None,
            sender: None,
            enq_user_id: None,
            exception_queue: None,
            payload: vec![0; bytes],
            enq_txn: None,
            consumers: consumers.iter().map(|c| c.to_string()).collect(),
            prio_key,
            spilled: false,
            group: None,
        }
    }

    fn queue() -> QueueInfo {
        let t = crate::topology::Topology::from_toml(
            "[[queue_tables]]\nname = \"A.T\"\npayload_type = \"RAW\"\n[[queues]]\nname = \"A.Q\"\nqueue_table = \"A.T\"\n",
        )
        .expect("toml");
        t.resolve(&|p| Ok(p.to_string())).expect("resolves").queue("A.Q").expect("queue").clone()
    }

    fn buffers(max_messages: usize, spill_bytes: usize) -> Buffers {
        Buffers::new(BufferConfig { max_messages, spill_bytes, spill_after: Duration::from_secs(10) }, &Metrics::new())
    }

    #[test]
    fn each_consumer_takes_a_message_once_in_order() {
        let b = buffers(10, 1000);
        let q = queue();
        let (first, second) = (row(1, 0, &["A", "B"], 1, 0), row(1, 0, &["A"], 1, 0));
        let ids = [first.msgid, second.msgid];
        b.admit(&q, 1, vec![first, second]).expect("admitted");
        let all = |_: &StoredMessage| true;
        assert_eq!(b.take(1, "A", 0, &all).map(|(m, _)| m.msgid), Some(ids[0]));
        assert_eq!(b.take(1, "B", 0, &all).map(|(m, _)| m.msgid), Some(ids[0]));
        assert!(b.take(1, "B", 0, &all).is_none(), "B has had its one message");
        assert_eq!(b.take(1, "A", 0, &all).map(|(m, _)| m.msgid), Some(ids[1]));
        assert_eq!(b.len(1), 0);
    }

    #[test]
    fn flow_control_refuses_past_the_limit_and_admits_again_once_taken() {
        let b = buffers(2, 1000);
        let q = queue();
        b.admit(&q, 1, vec![row(1, 0, &[""], 1, 0), row(1, 0, &[""], 1, 0)]).expect("two fit");
        let e = b.admit(&q, 1, vec![row(1, 0, &[""], 1, 0)]).expect_err("a third does not");
        assert_eq!(e.code, code::FLOW_CONTROL);
        assert!(e.message.contains("flow control enabled: queue A.Q holds 2"), "{}", e.message);
        assert!(b.take(1, "", 0, &|_| true).is_some());
        b.admit(&q, 1, vec![row(1, 0, &[""], 1, 0)]).expect("room again");
    }

    #[test]
    fn spills_the_oldest_past_the_byte_threshold_and_the_old_by_age() {
        let b = buffers(10, 250);
        let q = queue();
        let rows: Vec<NewMessage> = (0..3).map(|i| row(1, 0, &[""], 100, i * MICROS_PER_SEC)).collect();
        let first = rows[0].msgid;
        assert!(b.admit(&q, 1, rows).expect("admitted"), "300 bytes are over 250");
        let out = b.take_spill(0, false, Some(1));
        assert_eq!(out.iter().map(|m| m.msgid).collect::<Vec<_>>(), [first]);
        assert!(out[0].spilled);
        // Ten seconds after the second one's enqueue, it is old enough; the third is not.
        assert_eq!(b.take_spill(11 * MICROS_PER_SEC, true, None).len(), 1);
        assert_eq!(b.len(1), 1);
    }

    #[test]
    fn expired_messages_are_dropped_not_returned() {
        let b = buffers(10, 1000);
        let mut m = row(1, 0, &[""], 1, 0);
        m.expire_at = Some(5);
        b.admit(&queue(), 1, vec![m]).expect("admitted");
        assert!(b.take(1, "", 5, &|_| true).is_none());
        assert_eq!(b.len(1), 0);
    }
}
