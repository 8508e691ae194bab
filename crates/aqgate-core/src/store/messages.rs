//! Messages as the store keeps them: a message to insert and one as a consumer sees it,
//! what a dequeue looks for (`CandidateQuery`, `Position`, `Stored`: persistent or spilled
//! buffered ones) and takes (`LockKind`), what removes, commits and rollbacks report (among
//! them the multi-consumer messages left only to consumers that gave up on them, which the
//! engine moves to their exception queue), the dequeue history, a propagated copy's
//! `Origin`, why a message went to an exception queue (`Expiry`, Oracle's
//! EXPIRATION_REASON), the messages the time manager expires, and `Interest` in a queue's
//! enqueue signals.

use super::QueueId;
use crate::clock::Micros;

/// A message to insert, with one delivery row per consumer (`""` on single-consumer
/// queues).
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub msgid: [u8; 16],
    pub queue: QueueId,
    pub corrid: Option<String>,
    pub priority: i64,
    pub enq_time: Micros,
    pub delay_until: Option<Micros>,
    pub expire_at: Option<Micros>,
    /// JSON of the sender agent: the message's `sender_id`, as the application gave it.
    pub sender: Option<String>,
    /// Oracle's ENQ_USER_ID: the request's authenticated agent, whatever `sender` says
    /// (`None` only on rows stored before it was recorded).
    pub enq_user_id: Option<String>,
    pub exception_queue: Option<String>,
    pub payload: Vec<u8>,
    /// Session transaction id while uncommitted; `None` when committed in this request.
    pub enq_txn: Option<String>,
    pub consumers: Vec<String>,
    /// Sort key for deliveries: the priority on priority-ordered queues, else 0.
    pub prio_key: i64,
    /// A buffered message the engine spilled from memory: stored with state [`SPILLED`],
    /// so that only buffered dequeues take it.
    pub spilled: bool,
    /// Its message group, on a queue with message grouping (the same for every message of
    /// one transaction); `None` elsewhere. A stored message without one is a group alone.
    pub group: Option<i64>,
    /// Oracle's ENQ_TXN_ID: the IDAP transaction that enqueued it (`None` only on rows
    /// stored before it was recorded).
    pub enq_txn_id: Option<String>,
    /// A copy a propagation job made: the message it copies (see [`Origin`]).
    pub origin: Option<Origin>,
}

#[cfg(test)]
impl NewMessage {
    /// A committed single-consumer message of priority 1 with no payload: unit tests' fixture.
    pub(crate) fn for_test(msgid: [u8; 16], queue: QueueId) -> Self {
        Self {
            msgid,
            queue,
            corrid: None,
            priority: 1,
            enq_time: 0,
            delay_until: None,
            expire_at: None,
            sender: None,
            enq_user_id: None,
            exception_queue: None,
            payload: Vec::new(),
            enq_txn: None,
            consumers: Vec::new(),
            prio_key: 0,
            spilled: false,
            group: None,
            enq_txn_id: None,
            origin: None,
        }
    }
}

/// A message as seen by one consumer.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub seq: i64,
    pub msgid: [u8; 16],
    pub queue: QueueId,
    pub consumer: String,
    pub corrid: Option<String>,
    pub priority: i64,
    pub prio_key: i64,
    pub enq_time: Micros,
    pub delay_until: Option<Micros>,
    pub expire_at: Option<Micros>,
    pub sender: Option<String>,
    pub enq_user_id: Option<String>,
    pub exception_queue: Option<String>,
    pub payload: Vec<u8>,
    pub retry_count: i64,
    /// 0 normal, 3 expired (moved to an exception queue), [`SPILLED`].
    pub state: i32,
}

/// Where a consumer's navigation stands: the sort key of the last message it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub prio_key: i64,
    pub seq: i64,
}

/// Which deliveries a dequeue may look at.
#[derive(Debug, Clone)]
pub struct CandidateQuery {
    pub queue: QueueId,
    pub consumer: String,
    /// The session transaction; its own uncommitted enqueues and LOCKED messages count.
    pub txn: String,
    pub now: Micros,
    pub after: Option<Position>,
    pub corrid: Option<String>,
    pub msgid: Option<[u8; 16]>,
    /// BROWSE sees messages locked by others too.
    pub include_locked: bool,
    /// Messages still in their delay count too (a propagation job moves them with the
    /// remaining delay). `take_head` never takes them.
    pub include_waiting: bool,
    pub limit: i64,
    /// Persistent messages, spilled buffered ones, or both.
    pub stored: Stored,
}

impl CandidateQuery {
    /// The head of `queue` for `consumer` as transaction `txn` sees it at `now`: its first
    /// ready persistent message, not locked by another transaction. Other looks start here
    /// (`CandidateQuery { msgid: Some(id), ..CandidateQuery::head(…) }`).
    pub fn head(queue: QueueId, consumer: impl Into<String>, txn: impl Into<String>, now: Micros) -> Self {
        Self {
            queue,
            consumer: consumer.into(),
            txn: txn.into(),
            now,
            after: None,
            corrid: None,
            msgid: None,
            include_locked: false,
            include_waiting: false,
            limit: 1,
            stored: Stored::Persistent,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A pending REMOVE: deleted at commit.
    Remove = 1,
    /// A LOCKED dequeue: released at commit.
    Locked = 2,
}

/// An expired message moved by the time manager.
#[derive(Debug, Clone)]
pub struct ExpiredMessage {
    pub seq: i64,
    pub queue: QueueId,
    pub exception_queue: Option<String>,
}

/// One queue's committed messages by state as the `AQ$` views tell them (see
/// [`super::Store::queue_figures`]): EXPIRED (moved to an exception queue, or past its
/// expiration), WAIT (delayed) and READY (the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueFigures {
    pub queue: QueueId,
    pub ready: i64,
    pub waiting: i64,
    pub expired: i64,
    /// The enqueue time of the oldest READY message.
    pub oldest_ready: Option<Micros>,
    /// The highest `seq` of the queue's messages.
    pub last_seq: i64,
    /// Messages whose `seq` is above the `after_seq` asked for.
    pub newer: i64,
}

/// `messages.state` of a spilled buffered message (Oracle's SPILLED).
pub const SPILLED: i32 = 7;

/// Which stored messages a dequeue looks at (Oracle's dequeue DELIVERY_MODE, as far as
/// the store holds buffered messages: the spilled ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stored {
    /// Persistent messages only: every state but [`SPILLED`].
    #[default]
    Persistent,
    /// Spilled buffered messages only.
    Spilled,
    /// Both.
    Either,
}

/// A remove released by a rollback (see [`super::StoreTx::rollback_session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub seq: i64,
    pub queue: QueueId,
    pub retry_count: i64,
    /// `""` on a single-consumer queue.
    pub consumer: String,
    /// The message's own exception queue, if it names one.
    pub exception_queue: Option<String>,
}

/// A multi-consumer message whose last delivery that a consumer could still take has
/// just been removed, while consumers that gave up on it ([`super::StoreTx::give_up`]) keep
/// theirs: nobody can take it any more, and the caller moves it to its exception queue
/// (in the same transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    pub seq: i64,
    pub queue: QueueId,
    /// The message's own exception queue, if it names one.
    pub exception_queue: Option<String>,
}

/// What [`super::StoreTx::remove_now`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// Another session holds the delivery (or it is gone): nothing changed.
    Missed,
    /// Removed (and the message with it, if no delivery is left).
    Removed,
    /// Removed, and the message is [`Stranded`].
    Stranded(Stranded),
}

impl Removal {
    /// Whether the delivery was removed.
    pub fn removed(&self) -> bool {
        !matches!(self, Removal::Missed)
    }
}

/// What a session commit did: queues that got new visible messages (to wake waiters).
#[derive(Debug, Default, Clone)]
pub struct CommitOutcome {
    pub enqueued_queues: Vec<QueueId>,
    /// How many of the transaction's enqueued messages it made visible.
    pub published: u64,
    /// Messages its removes left to consumers that gave up on them only.
    pub stranded: Vec<Stranded>,
}

/// A REMOVE dequeue, for the dequeue history (see [`super::StoreTx::record_dequeues`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DequeueRecord {
    pub seq: i64,
    /// `""` on a single-consumer queue.
    pub consumer: String,
    pub deq_time: Micros,
    /// The agent that dequeued it.
    pub deq_user_id: String,
    /// The IDAP transaction that removes it (Oracle's DEQ_TXN_ID; a rollback of it forgets
    /// the row); `None` only on rows recorded before it was kept for every remove.
    pub txn: Option<String>,
    /// Failed dequeues before this one.
    pub retry_count: i64,
}

/// Where a propagated copy came from: Oracle's ORIGINAL_MSGID and ORIGINAL_QUEUE_NAME, and,
/// for a copy a job put in an exception queue, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub msgid: [u8; 16],
    pub queue: QueueId,
    pub why: Option<Expiry>,
}

/// Why a message went to an exception queue: Oracle's EXPIRATION_REASON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Its expiration passed (TIME_EXPIRATION).
    Time,
    /// It was rolled back more than its queue's `max_retries` times (MAX_RETRY_EXCEEDED).
    MaxRetries,
    /// A propagation job's destination refused it for good (PROPAGATION_FAILURE).
    Propagation,
    /// A propagation job's transformation failed on it (INVALID_TRANSFORMATION).
    Transformation,
}

impl Expiry {
    /// As stored (`messages.exc_reason`).
    pub fn code(self) -> i64 {
        match self {
            Expiry::Time => 1,
            Expiry::MaxRetries => 2,
            Expiry::Propagation => 3,
            Expiry::Transformation => 4,
        }
    }

    /// Oracle's name, as the `AQ$` views show it.
    pub fn oracle_name(self) -> &'static str {
        match self {
            Expiry::Time => "TIME_EXPIRATION",
            Expiry::MaxRetries => "MAX_RETRY_EXCEEDED",
            Expiry::Propagation => "PROPAGATION_FAILURE",
            Expiry::Transformation => "INVALID_TRANSFORMATION",
        }
    }

    pub const ALL: [Expiry; 4] = [Expiry::Time, Expiry::MaxRetries, Expiry::Propagation, Expiry::Transformation];
}

/// Interest in a queue's enqueue signals (see [`super::Store::interest`]), given up when dropped.
#[must_use = "the interest ends when this is dropped"]
pub struct Interest(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Interest {
    /// No interest needed (the backend signals every process there is).
    pub fn none() -> Self {
        Self(None)
    }

    /// Interest a backend holds until this is dropped, then gives up by `release`.
    pub fn held(release: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(release)))
    }

    /// Whether the backend needed it: then what was committed before it took effect must
    /// be looked for once more.
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

impl std::fmt::Debug for Interest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Interest").field(&self.is_held()).finish()
    }
}
