//! Buffered messages (Oracle 10.2's DELIVERY_MODE BUFFERED): kept per queue in the memory
//! of the process that took them, not in the store, so an enqueue and a dequeue cost no
//! database round trip. They are not transactional (enqueue and dequeue are IMMEDIATE),
//! and they are lost when the process ends, unless they were spilled: past a queue's byte
//! threshold (oldest first), past the process's byte budget (the oldest of any queue) or
//! after a time in memory, they are written to the store with state [`SPILLED`], where any
//! process's buffered dequeue takes them and only a buffered one does. A message's bytes
//! are all it holds in memory ([`held_bytes`]: payload, recipients, header fields, its
//! entry), not its payload alone. Flow control refuses an enqueue (ORA-25307) while a queue
//! holds [`BufferConfig::max_messages`] unspilled messages, until its consumers catch up,
//! and while the process's budget is spent and spilling to the store fails.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use super::enqueue::Enqueue;
use super::*;
use crate::clock::{MICROS_PER_SEC, Micros};
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::metrics::{Counter, Metrics};
use crate::store::*;
use crate::topology::QueueInfo;

mod shown;
pub use shown::{SHOWN_FOR, SHOWN_PAYLOAD_BYTES, SHOWN_ROWS};

/// Tunables of buffered messaging.
#[derive(Debug, Clone)]
pub struct BufferConfig {
    /// Flow control: unspilled buffered messages a queue holds at most; an enqueue beyond
    /// is refused with ORA-25307 (Oracle's default is also 5,000).
    pub max_messages: usize,
    /// Bytes in memory ([`held_bytes`]) past which a queue's oldest messages are spilled.
    pub spill_bytes: usize,
    /// Bytes in memory of all queues together past which the oldest messages (of any
    /// queue) are spilled; an enqueue that would go past them while spilling fails is
    /// refused with ORA-25307.
    pub max_bytes: usize,
    /// Messages in memory longer than this are spilled (by the time manager's round).
    pub spill_after: Duration,
}

impl Default for BufferConfig {
    fn default() -> Self {
        Self { max_messages: 5000, spill_bytes: 64 << 20, max_bytes: 256 << 20, spill_after: Duration::from_secs(600) }
    }
}

/// A look that found no spilled message for a consumer is trusted this long (other
/// processes spill too); a spill of this process ends it at once.
const SPILLED_RECHECK: Micros = MICROS_PER_SEC;

/// What a buffered message holds in memory: its map entry and every allocation it owns
/// (by capacity), each with the allocator's bookkeeping. An estimate, erring high.
pub(super) fn held_bytes(m: &NewMessage) -> usize {
    /// An allocator's header and rounding per allocation, about.
    const PER_ALLOCATION: usize = 16;
    /// A `BTreeMap` entry's share of its node beyond its key and value.
    const ENTRY: usize = 32;
    let text = |s: &Option<String>| s.as_ref().map_or(0, |s| s.capacity() + PER_ALLOCATION);
    let consumers = m.consumers.capacity() * std::mem::size_of::<String>()
        + PER_ALLOCATION
        + m.consumers.iter().map(|c| c.capacity() + PER_ALLOCATION).sum::<usize>();
    std::mem::size_of::<NewMessage>()
        + std::mem::size_of::<(i64, i64)>()
        + ENTRY
        + m.payload.capacity()
        + PER_ALLOCATION
        + text(&m.corrid)
        + text(&m.sender)
        + text(&m.enq_user_id)
        + text(&m.exception_queue)
        + text(&m.enq_txn)
        + text(&m.enq_txn_id)
        + consumers
}

/// The buffered messages of this process.
pub(super) struct Buffers {
    config: BufferConfig,
    held: StdMutex<Held>,
    /// (queue, consumer) → until when the store is taken to hold no spilled message for it.
    none_spilled: StdMutex<HashMap<(QueueId, String), Micros>>,
    /// What the views were last shown ([`shown`]).
    shown: StdMutex<shown::Shown>,
    enqueued: Counter,
    dequeued: Counter,
    spilled: Counter,
    refused: Counter,
    expired: Counter,
    /// Messages spilled to keep the process within [`BufferConfig::max_bytes`].
    budget_spilled: Counter,
    /// Enqueues refused because the process's budget was spent and spilling failed.
    budget_refused: Counter,
}

/// Every queue's buffer, and their bytes together.
#[derive(Default)]
struct Held {
    queues: HashMap<QueueId, QueueBuffer>,
    bytes: usize,
    /// Changes so far (any insert, remove or change): whether the views' copy is current.
    changes: u64,
}

impl Held {
    fn insert(&mut self, m: NewMessage) {
        self.changes += 1;
        let b = self.queues.entry(m.queue).or_default();
        self.bytes += b.insert(m);
    }

    fn remove(&mut self, qid: QueueId, key: &(i64, i64)) -> Option<NewMessage> {
        let (m, size) = self.queues.get_mut(&qid)?.remove(key)?;
        self.changes += 1;
        self.bytes = self.bytes.saturating_sub(size);
        Some(m)
    }

    /// Changes a held message through `f`, its size counted again.
    fn change(&mut self, qid: QueueId, key: &(i64, i64), f: impl FnOnce(&mut NewMessage)) {
        let Some(b) = self.queues.get_mut(&qid) else { return };
        let Some(m) = b.msgs.get_mut(key) else { return };
        self.changes += 1;
        let before = held_bytes(m);
        f(m);
        let after = held_bytes(m);
        b.bytes = (b.bytes + after).saturating_sub(before);
        self.bytes = (self.bytes + after).saturating_sub(before);
    }

    /// Takes out the oldest messages of any queue (by enqueue time) until the bytes held
    /// are at most `target`.
    fn take_oldest(&mut self, target: usize) -> Vec<NewMessage> {
        if self.bytes <= target {
            return Vec::new();
        }
        let mut all: Vec<(Micros, QueueId, (i64, i64))> =
            self.queues.iter().flat_map(|(q, b)| b.msgs.iter().map(move |(k, m)| (m.enq_time, *q, *k))).collect();
        all.sort_unstable_by_key(|(t, q, k)| (*t, k.1, *q));
        let mut out = Vec::new();
        for (_, q, k) in all {
            if self.bytes <= target {
                break;
            }
            if let Some(m) = self.remove(q, &k) {
                out.push(m);
            }
        }
        out
    }
}

#[derive(Default)]
struct QueueBuffer {
    /// By dequeue order: (prio_key, local sequence).
    msgs: BTreeMap<(i64, i64), NewMessage>,
    /// [`held_bytes`] of `msgs`, together.
    bytes: usize,
    next_seq: i64,
}

impl QueueBuffer {
    /// The message and its size.
    fn remove(&mut self, key: &(i64, i64)) -> Option<(NewMessage, usize)> {
        let m = self.msgs.remove(key)?;
        let size = held_bytes(&m);
        self.bytes = self.bytes.saturating_sub(size);
        Some((m, size))
    }

    /// Its size.
    fn insert(&mut self, m: NewMessage) -> usize {
        self.next_seq += 1;
        let size = held_bytes(&m);
        self.bytes += size;
        self.msgs.insert((m.prio_key, self.next_seq), m);
        size
    }
}

/// What [`Buffers::admit`] made of an enqueue.
pub(super) enum Admitted {
    /// In memory; `true`: its queue is past its spill threshold now.
    Yes(bool),
    /// Not taken: the process's budget has no room for it. These oldest messages were taken
    /// out of memory to make room; once they are written to the store, try again.
    Room(Vec<NewMessage>, Vec<NewMessage>),
}

impl Buffers {
    pub(super) fn new(config: BufferConfig, metrics: &Metrics) -> Self {
        Self {
            config,
            held: StdMutex::new(Held::default()),
            none_spilled: StdMutex::new(HashMap::new()),
            shown: StdMutex::new(shown::Shown::new()),
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
            budget_spilled: metrics.counter(
                "aqgate_buffered_budget_spilled_total",
                "Buffered messages spilled to keep the process within --buffered-max-bytes.",
            ),
            budget_refused: metrics.counter(
                "aqgate_buffered_budget_refused_total",
                "Buffered enqueues refused (ORA-25307) because --buffered-max-bytes was spent and spilling failed.",
            ),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unspilled buffered messages of `queue` in this process.
    pub(super) fn len(&self, queue: QueueId) -> usize {
        self.held().queues.get(&queue).map_or(0, |b| b.msgs.len())
    }

    /// Bytes ([`held_bytes`]) of this process's unspilled buffered messages, all queues.
    pub(super) fn bytes(&self) -> usize {
        self.held().bytes
    }

    /// Takes `rows` into memory, all or none: refused by flow control (ORA-25307) when the
    /// queue holds its most messages, or when they are larger than the process's whole
    /// budget; when the budget has no room for them now, the oldest messages are taken out
    /// to be spilled first ([`Admitted::Room`]).
    pub(super) fn admit(&self, queue: &QueueInfo, qid: QueueId, rows: Vec<NewMessage>) -> Result<Admitted, AqError> {
        let incoming: usize = rows.iter().map(held_bytes).sum();
        let mut held = self.held();
        let count = held.queues.get(&qid).map_or(0, |b| b.msgs.len());
        if count + rows.len() > self.config.max_messages {
            self.refused.inc();
            return Err(AqError::client(
                code::FLOW_CONTROL,
                format!(
                    "enqueue rate too high, flow control enabled: queue {} holds {count} buffered messages its \
                     consumers have not taken (at most {}); send again once they catch up",
                    queue.name, self.config.max_messages
                ),
            ));
        }
        if incoming > self.config.max_bytes {
            self.refused.inc();
            self.budget_refused.inc();
            return Err(AqError::client(
                code::FLOW_CONTROL,
                format!(
                    "enqueue rate too high, flow control enabled: these buffered messages take {incoming} bytes \
                     in memory, more than this process keeps of all queues together ({} bytes, \
                     --buffered-max-bytes); send them PERSISTENT, or fewer at a time",
                    self.config.max_bytes
                ),
            ));
        }
        if held.bytes + incoming > self.config.max_bytes {
            // Room for these and an eighth of the budget more, so that the next enqueues
            // do not each spill again.
            let target = self.config.max_bytes.saturating_sub(incoming + self.config.max_bytes / 8);
            let out = held.take_oldest(target);
            if out.is_empty() {
                // Nothing left to spill: what holds the budget is on its way to the store.
                drop(held);
                return Err(self.budget_spent(0));
            }
            return Ok(Admitted::Room(rows, out));
        }
        self.enqueued.add(rows.len() as u64);
        for r in rows {
            held.insert(r);
        }
        Ok(Admitted::Yes(held.queues.get(&qid).is_some_and(|b| b.bytes > self.config.spill_bytes)))
    }

    /// ORA-25307 for an enqueue the process's budget has no room for.
    fn budget_spent(&self, tried: usize) -> AqError {
        self.refused.inc();
        self.budget_refused.inc();
        let why = if tried > 0 { format!(" and spilling {tried} of them to the store failed") } else { String::new() };
        AqError::client(
            code::FLOW_CONTROL,
            format!(
                "enqueue rate too high, flow control enabled: buffered messages hold {} bytes of this process's \
                 memory (at most {}, --buffered-max-bytes){why}; send again shortly",
                self.bytes(),
                self.config.max_bytes
            ),
        )
    }

    /// The first message of `qid` that `consumer` has still to take and `matches` accepts,
    /// as a [`StoredMessage`] of that consumer; taken (for that consumer) unless `peek`.
    /// Expired ones are dropped on the way.
    fn take(
        &self,
        qid: QueueId,
        consumer: &str,
        now: Micros,
        matches: &dyn Fn(&StoredMessage) -> Result<bool, AqError>,
    ) -> Result<Option<(StoredMessage, NewMessage)>, AqError> {
        let mut held = self.held();
        let Some(b) = held.queues.get(&qid) else { return Ok(None) };
        let mut expired = Vec::new();
        let mut found = None;
        let mut refused = None;
        for (key, m) in &b.msgs {
            if m.expire_at.is_some_and(|t| t <= now) {
                expired.push(*key);
                continue;
            }
            if !m.consumers.iter().any(|c| c == consumer) {
                continue;
            }
            let s = stored_view(m, key, consumer);
            match matches(&s) {
                Ok(true) => {
                    found = Some((*key, s));
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        for k in &expired {
            held.remove(qid, k);
        }
        self.expired.add(expired.len() as u64);
        if let Some(e) = refused {
            return Err(e);
        }
        let Some((key, s)) = found else { return Ok(None) };
        self.dequeued.inc();
        held.change(qid, &key, |m| m.consumers.retain(|c| c != consumer));
        let Some(m) = held.queues.get(&qid).and_then(|b| b.msgs.get(&key)) else { return Ok(None) };
        let one = if m.consumers.is_empty() { held.remove(qid, &key) } else { Some(m.clone()) };
        Ok(one.map(|mut one| {
            one.consumers = vec![consumer.to_string()];
            (s, one)
        }))
    }

    /// Puts a message taken by [`Buffers::take`] (or out to be spilled) back.
    fn put_back(&self, m: NewMessage) {
        let mut held = self.held();
        let found =
            held.queues.get(&m.queue).and_then(|b| b.msgs.iter().find(|(_, o)| o.msgid == m.msgid).map(|(k, _)| *k));
        match found {
            Some(k) => held.change(m.queue, &k, |o| o.consumers.extend(m.consumers)),
            None => held.insert(m),
        }
    }

    /// Takes out of memory what is to be spilled: messages older than the age limit (all
    /// queues, when `by_age`), and the oldest of `over` until it is under its threshold.
    fn take_spill(&self, now: Micros, by_age: bool, over: Option<QueueId>) -> Vec<NewMessage> {
        let age = i64::try_from(self.config.spill_after.as_micros()).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        let mut held = self.held();
        let queues: Vec<QueueId> = held.queues.keys().copied().collect();
        for qid in queues {
            let keys: Vec<(i64, i64)> =
                held.queues.get(&qid).map(|b| b.msgs.keys().copied().collect()).unwrap_or_default();
            for key in keys {
                let Some(b) = held.queues.get(&qid) else { break };
                let old = by_age && b.msgs.get(&key).is_some_and(|m| m.enq_time.saturating_add(age) <= now);
                let heavy = over == Some(qid) && b.bytes > self.config.spill_bytes;
                if (old || heavy)
                    && let Some(mut m) = held.remove(qid, &key)
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
        let work = self.work();
        let e = Enqueue { resolved, queue, qid, now, enq_user: &session.agent, work: &work };
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
            let row = e
                .new_message(m, None, None)
                .map_err(|e| AqError { message: format!("message {n}: {}", e.message), ..e })?;
            ids.push(crate::payload::hex_upper(&row.msgid));
            rows.push(row);
        }
        let over = self.admit_buffered(queue, qid, rows).await?;
        self.wake(qid);
        if req.commit {
            self.commit(session).await?;
        }
        if over {
            self.spill(false, Some(qid)).await;
        }
        Ok(EnqueueResult { destination: queue.name.clone(), message_ids: ids })
    }

    /// Takes `rows` into memory (see [`Buffers::admit`]), spilling the oldest messages first
    /// when the process's budget has no room for them. `Ok(true)`: their queue is past its
    /// spill threshold now.
    async fn admit_buffered(&self, queue: &QueueInfo, qid: QueueId, rows: Vec<NewMessage>) -> Result<bool, AqError> {
        let mut rows = rows;
        // Other enqueues may take the room made before this one is admitted: a few tries.
        for _ in 0..3 {
            match self.buffers.admit(queue, qid, rows)? {
                buffered::Admitted::Yes(over) => return Ok(over),
                buffered::Admitted::Room(back, out) => {
                    rows = back;
                    let n = out.len();
                    let out: Vec<NewMessage> = out.into_iter().map(|m| NewMessage { spilled: true, ..m }).collect();
                    if !self.write_spilled(out).await {
                        return Err(self.buffers.budget_spent(n));
                    }
                    self.buffers.budget_spilled.add(n as u64);
                }
            }
        }
        Err(self.buffers.budget_spent(0))
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
    pub(super) async fn try_receive_any(
        &self,
        d: &Dequeue<'_>,
        session: &mut Session,
    ) -> Result<Vec<Message>, AqError> {
        let Dequeue { resolved, queue, qid, consumer, req, filter } = *d;
        let stored = match req.consumer.delivery_mode {
            DeliveryMode::Persistent => {
                return self.try_receive(d, session, Stored::Persistent).await;
            }
            DeliveryMode::Buffered => Stored::Spilled,
            DeliveryMode::PersistentOrBuffered => Stored::Either,
        };
        let now = self.now();
        let spilled = self.buffers.spilled_may_exist(qid, consumer, now);
        if spilled {
            let found = self.try_receive(d, session, stored).await?;
            if !found.is_empty() {
                return Ok(found);
            }
            self.buffers.found_none_spilled(qid, consumer, now);
        }
        let matches = |m: &StoredMessage| filter.matches(m, queue, resolved);
        if let Some((m, row)) = self.buffers.take(qid, consumer, now, &matches)? {
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
            return self.try_receive(d, session, stored).await;
        }
        Ok(Vec::new())
    }

    /// Writes buffered messages to the store as spilled ones: those in memory past the age
    /// limit (`by_age`, the time manager's round) and the oldest of queue `over` until it
    /// is under its byte threshold. What fails to be written goes back into memory.
    pub(super) async fn spill(&self, by_age: bool, over: Option<QueueId>) {
        let rows = self.buffers.take_spill(self.now(), by_age, over);
        self.write_spilled(rows).await;
    }

    /// Writes messages taken out of memory to the store as spilled ones; if that fails,
    /// they go back into memory (`false`).
    async fn write_spilled(&self, rows: Vec<NewMessage>) -> bool {
        if rows.is_empty() {
            return true;
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
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, messages = rows.len(), "spilling buffered messages failed; they stay in memory");
                for mut m in rows {
                    m.spilled = false;
                    self.buffers.put_back(m);
                }
                false
            }
        }
    }

    /// Bytes of memory this process's unspilled buffered messages hold (all queues; see
    /// [`BufferConfig::max_bytes`]).
    pub fn buffered_bytes(&self) -> usize {
        self.buffers.bytes()
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
            enq_time,
            payload: vec![0; bytes],
            consumers: consumers.iter().map(|c| c.to_string()).collect(),
            prio_key,
            ..NewMessage::for_test(*uuid::Uuid::now_v7().as_bytes(), queue)
        }
    }

    fn queue() -> QueueInfo {
        let t = crate::topology::Topology::from_toml(
            "[[queue_tables]]\nname = \"A.T\"\npayload_type = \"RAW\"\n[[queues]]\nname = \"A.Q\"\nqueue_table = \"A.T\"\n",
        )
        .expect("toml");
        t.resolve(&|p| Ok(p.to_string())).expect("resolves").queue("A.Q").expect("queue").clone()
    }

    fn buffers(max_messages: usize, spill_bytes: usize, max_bytes: usize) -> Buffers {
        let config = BufferConfig { max_messages, spill_bytes, max_bytes, spill_after: Duration::from_secs(10) };
        Buffers::new(config, &Metrics::new())
    }

    /// `admit`, expected to take the rows: whether their queue is past its threshold.
    fn admitted(b: &Buffers, q: &QueueInfo, qid: QueueId, rows: Vec<NewMessage>) -> bool {
        match b.admit(q, qid, rows) {
            Ok(Admitted::Yes(over)) => over,
            Ok(Admitted::Room(..)) => panic!("no room"),
            Err(e) => panic!("refused: {}", e.message),
        }
    }

    /// The bytes held, counted afresh from the messages.
    fn recount(b: &Buffers) -> usize {
        b.held().queues.values().flat_map(|q| q.msgs.values()).map(held_bytes).sum()
    }

    #[test]
    fn each_consumer_takes_a_message_once_in_order() {
        let b = buffers(10, 1 << 20, 1 << 20);
        let q = queue();
        let (first, second) = (row(1, 0, &["A", "B"], 1, 0), row(1, 0, &["A"], 1, 0));
        let ids = [first.msgid, second.msgid];
        admitted(&b, &q, 1, vec![first, second]);
        let all = |_: &StoredMessage| Ok(true);
        assert_eq!(b.take(1, "A", 0, &all).expect("matches").map(|(m, _)| m.msgid), Some(ids[0]));
        assert_eq!(b.bytes(), recount(&b), "a consumer gone counts");
        assert_eq!(b.take(1, "B", 0, &all).expect("matches").map(|(m, _)| m.msgid), Some(ids[0]));
        assert!(b.take(1, "B", 0, &all).expect("matches").is_none(), "B has had its one message");
        assert_eq!(b.take(1, "A", 0, &all).expect("matches").map(|(m, _)| m.msgid), Some(ids[1]));
        assert_eq!(b.len(1), 0);
        assert_eq!(b.bytes(), 0);
    }

    #[test]
    fn flow_control_refuses_past_the_limit_and_admits_again_once_taken() {
        let b = buffers(2, 1 << 20, 1 << 20);
        let q = queue();
        admitted(&b, &q, 1, vec![row(1, 0, &[""], 1, 0), row(1, 0, &[""], 1, 0)]);
        let e = b.admit(&q, 1, vec![row(1, 0, &[""], 1, 0)]).err().expect("a third does not fit");
        assert_eq!(e.code, code::FLOW_CONTROL);
        assert!(e.message.contains("flow control enabled: queue A.Q holds 2"), "{}", e.message);
        assert!(b.take(1, "", 0, &|_| Ok(true)).expect("matches").is_some());
        admitted(&b, &q, 1, vec![row(1, 0, &[""], 1, 0)]);
    }

    #[test]
    fn spills_the_oldest_past_the_byte_threshold_and_the_old_by_age() {
        let size = held_bytes(&row(1, 0, &[""], 100, 0));
        let b = buffers(10, size * 5 / 2, 1 << 20);
        let q = queue();
        let rows: Vec<NewMessage> = (0..3).map(|i| row(1, 0, &[""], 100, i * MICROS_PER_SEC)).collect();
        let first = rows[0].msgid;
        assert!(admitted(&b, &q, 1, rows), "three messages are over two and a half");
        let out = b.take_spill(0, false, Some(1));
        assert_eq!(out.iter().map(|m| m.msgid).collect::<Vec<_>>(), [first]);
        assert!(out[0].spilled);
        assert_eq!(b.bytes(), 2 * size);
        // Ten seconds after the second one's enqueue, it is old enough; the third is not.
        assert_eq!(b.take_spill(11 * MICROS_PER_SEC, true, None).len(), 1);
        assert_eq!(b.len(1), 1);
        assert_eq!(b.bytes(), size);
    }

    #[test]
    fn a_message_counts_every_byte_it_holds_not_its_payload_alone() {
        let small = held_bytes(&row(1, 0, &[""], 1, 0));
        assert!(small > std::mem::size_of::<NewMessage>(), "{small}");
        let long: Vec<String> = (0..3900).map(|i| format!("{i:0>1000}")).collect();
        let names: Vec<&str> = long.iter().map(String::as_str).collect();
        let mut m = row(1, 0, &names, 1, 0);
        assert!(held_bytes(&m) > 3900 * 1000, "the recipients count: {}", held_bytes(&m));
        let before = held_bytes(&m);
        m.corrid = Some("C".repeat(128));
        m.sender = Some("S".repeat(500));
        assert!(held_bytes(&m) >= before + 628, "header fields count");
    }

    #[test]
    fn the_process_budget_spills_the_oldest_of_any_queue_first() {
        let size = held_bytes(&row(1, 0, &[""], 100, 0));
        let b = buffers(100, 1 << 20, size * 4);
        let q = queue();
        let a1 = row(1, 0, &[""], 100, 10);
        let b1 = row(2, 0, &[""], 100, 5);
        let (a1_id, b1_id) = (a1.msgid, b1.msgid);
        admitted(&b, &q, 1, vec![a1]);
        admitted(&b, &q, 2, vec![b1]);
        admitted(&b, &q, 1, vec![row(1, 0, &[""], 100, 20), row(1, 0, &[""], 100, 30)]);
        assert_eq!(b.bytes(), 4 * size);
        // A fifth has no room: the oldest (queue 2's, then queue 1's first) are taken out,
        // leaving room for it and an eighth of the budget.
        let fifth = row(1, 0, &[""], 100, 40);
        let Ok(Admitted::Room(back, out)) = b.admit(&q, 1, vec![fifth]) else { panic!("expected Room") };
        assert_eq!(out.iter().map(|m| m.msgid).collect::<Vec<_>>(), [b1_id, a1_id]);
        assert_eq!(b.bytes(), 2 * size);
        assert_eq!(b.bytes(), recount(&b));
        admitted(&b, &q, 1, back);
        assert_eq!(b.bytes(), 3 * size);
        // Put back (their spill failed), they count again, and nothing is taken anew.
        for m in out {
            b.put_back(m);
        }
        assert_eq!(b.bytes(), 5 * size);
        assert_eq!(b.bytes(), recount(&b));
        // More than the whole budget at once is refused outright.
        let big: Vec<NewMessage> = (0..5).map(|_| row(1, 0, &[""], 100, 50)).collect();
        let e = b.admit(&q, 1, big).err().expect("refused");
        assert_eq!(e.code, code::FLOW_CONTROL);
        assert!(e.message.contains("--buffered-max-bytes"), "{}", e.message);
        assert_eq!(b.budget_refused.get(), 1);
    }

    #[test]
    fn expired_messages_are_dropped_not_returned() {
        let b = buffers(10, 1 << 20, 1 << 20);
        let mut m = row(1, 0, &[""], 1, 0);
        m.expire_at = Some(5);
        admitted(&b, &queue(), 1, vec![m]);
        assert!(b.take(1, "", 5, &|_| Ok(true)).expect("matches").is_none());
        assert_eq!(b.len(1), 0);
        assert_eq!(b.bytes(), 0);
    }
}
