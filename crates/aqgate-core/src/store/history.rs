//! Removed messages as Oracle keeps them: the dequeue history (who took a message, when, in
//! which transaction) and the PROCESSED messages of queues with a retention time.

use super::QueueId;
use crate::clock::Micros;

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

/// A queue table's `AQ$` view (see [`super::StoreTx::define_views`]): its queues, and
/// whether its payload is RAW (shown in hexadecimal; any other is XML text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTableView {
    pub queue_table: String,
    pub queues: Vec<QueueId>,
    pub raw: bool,
}

/// A queue whose removed messages stay PROCESSED (see [`super::StoreTx::define_views`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retained {
    pub queue: QueueId,
    /// How long, in microseconds from the removal; `None`: forever.
    pub for_micros: Option<Micros>,
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
