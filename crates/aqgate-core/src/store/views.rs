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

/// Which rows of a queue's `AQ$` view a listing takes (`Store::view_page`): every field
/// is a bound parameter of the store's SQL, never part of its text. A field left `None`
/// takes every row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewFilter {
    /// `MSG_STATE`, one of the view's states.
    pub state: Option<String>,
    /// `MSG_PRIORITY` at least / at most.
    pub min_priority: Option<i64>,
    pub max_priority: Option<i64>,
    /// `CORR_ID` equal to it, or (with `corr_prefix`) starting with it.
    pub correlation: Option<String>,
    pub corr_prefix: bool,
    /// The sender's agent name (`SENDER_NAME`) or the enqueuing agent (`ENQ_USER_ID`).
    pub sender: Option<String>,
    /// Enqueued at or after / before (microseconds).
    pub enq_from: Option<Micros>,
    pub enq_before: Option<Micros>,
    /// The exception queue's reason, as stored ([`super::Expiry::code`]).
    pub reason: Option<i64>,
    /// Bytes found in the first [`PAYLOAD_SEARCH_BYTES`] of the payload; at most
    /// [`PAYLOAD_SEARCH_ROWS`] messages are looked at per page (the page says when it
    /// stopped there).
    pub payload: Option<Vec<u8>>,
    /// One message, looked up by its id (no scan of the queue).
    pub msgid: Option<[u8; 16]>,
}

/// The bytes of each payload a payload search looks through.
pub const PAYLOAD_SEARCH_BYTES: i64 = 64 * 1024;
/// The messages a payload search looks at per page.
pub const PAYLOAD_SEARCH_ROWS: usize = 5_000;

impl ViewFilter {
    /// Whether it narrows anything but the state.
    pub fn narrows(&self) -> bool {
        let ViewFilter {
            state: _,
            min_priority,
            max_priority,
            correlation,
            corr_prefix: _,
            sender,
            enq_from,
            enq_before,
            reason,
            payload,
            msgid,
        } = self;
        min_priority.is_some()
            || max_priority.is_some()
            || correlation.is_some()
            || sender.is_some()
            || enq_from.is_some()
            || enq_before.is_some()
            || reason.is_some()
            || payload.is_some()
            || msgid.is_some()
    }
}

/// Where a listing's page ends (the keyset of the listing's order): messages in their
/// queue in dequeue order (`prio_key`, `seq`), then the buffered copies (one page), then
/// the kept ones oldest first (`seq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewCursor {
    Live { prio_key: i64, seq: i64 },
    Buffered,
    Kept { seq: i64 },
}

impl ViewCursor {
    /// As text, for a link (`L.prio_key.seq`, `B`, `K.seq`).
    pub fn to_text(self) -> String {
        match self {
            ViewCursor::Live { prio_key, seq } => format!("L.{prio_key}.{seq}"),
            ViewCursor::Buffered => "B".to_string(),
            ViewCursor::Kept { seq } => format!("K.{seq}"),
        }
    }

    /// From [`ViewCursor::to_text`]; `None` for anything else.
    pub fn parse(s: &str) -> Option<ViewCursor> {
        let mut it = s.trim().split('.');
        let c = match (it.next()?, it.next(), it.next()) {
            ("L", Some(k), Some(q)) => ViewCursor::Live { prio_key: k.parse().ok()?, seq: q.parse().ok()? },
            ("B", None, None) => ViewCursor::Buffered,
            ("K", Some(q), None) => ViewCursor::Kept { seq: q.parse().ok()? },
            _ => return None,
        };
        it.next().is_none().then_some(c)
    }
}

/// A page of a listing: its rows (whole messages: a message's consumers' rows are never
/// split between pages), where the next page starts (`None`: the listing ended), and
/// whether a payload search stopped at [`PAYLOAD_SEARCH_ROWS`] before the page filled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewPage {
    pub rows: Vec<Vec<Option<String>>>,
    pub next: Option<ViewCursor>,
    pub scan_bound: bool,
}
