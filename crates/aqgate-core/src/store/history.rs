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
    /// The session transaction that removes it at its commit; `None` for a remove that
    /// committed with the dequeue (IMMEDIATE, or a dequeue that commits).
    pub txn: Option<String>,
    /// Failed dequeues before this one.
    pub retry_count: i64,
}

/// A queue whose removed messages stay PROCESSED (see [`super::StoreTx::define_views`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retained {
    pub queue: QueueId,
    /// How long, in microseconds from the removal; `None`: forever.
    pub for_micros: Option<Micros>,
}
