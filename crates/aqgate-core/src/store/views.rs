//! The `AQ$` views as the store defines them: each queue table's view, and the queues whose
//! removed messages stay PROCESSED for their retention time.

use super::QueueId;
use crate::clock::Micros;

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
