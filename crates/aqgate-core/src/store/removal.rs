//! What a transaction's removes and rollbacks report: the removes a rollback released
//! ([`Released`]), the messages left to consumers that gave up on them ([`Stranded`]), an
//! immediate remove's outcome ([`Removal`]) and a commit's ([`CommitOutcome`]).

use super::QueueId;

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
