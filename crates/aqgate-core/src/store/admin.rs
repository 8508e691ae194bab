//! What administration reads and writes beyond the engine's own paths: the messages of an
//! exception queue with where they came from (a replay's candidates), the audit log of
//! what operators did, what the store knows of one message (its timeline), and the open
//! sessions with the messages each holds. Read-only SQL but for the audit row, which a
//! replay writes in its own transaction ([`super::StoreTx::audit_put`]).

use async_trait::async_trait;

use super::{QueueId, Result};
use crate::clock::Micros;

/// A message of an exception queue as a replay sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionMessage {
    pub seq: i64,
    pub msgid: [u8; 16],
    pub corrid: Option<String>,
    pub enq_time: Micros,
    /// The queue it left (`None` on rows moved before it was recorded).
    pub orig_queue: Option<QueueId>,
    /// Oracle's EXPIRATION_REASON code (see [`super::Expiry::code`]).
    pub reason: Option<i64>,
    /// Whether a session holds it now (a dequeue under way).
    pub locked: bool,
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    /// Assigned by the store (0 when writing).
    pub id: i64,
    pub at: Micros,
    /// Who did it, as they named themselves (`--as`).
    pub actor: String,
    /// `replay`.
    pub action: String,
    /// The queue acted on (a replay's exception queue).
    pub queue: String,
    /// Where messages went (a replay's original queues, comma-separated).
    pub target: Option<String>,
    pub count: i64,
    /// The filter as given, as text.
    pub filter: String,
    /// One command's rows share this.
    pub run: String,
    /// The message ids moved (hex), at most [`AUDIT_IDS`] of them.
    pub msgids: Vec<String>,
    /// How many more were moved than `msgids` lists.
    pub ids_more: i64,
}

/// The most message ids an audit row lists.
pub const AUDIT_IDS: usize = 100;

/// Where a message is, as the store knows it: live in a queue, or kept (PROCESSED).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFacts {
    pub seq: i64,
    pub msgid: [u8; 16],
    pub queue: String,
    pub kept: bool,
    pub corrid: Option<String>,
    pub priority: i64,
    pub enq_time: Micros,
    pub enq_user_id: Option<String>,
    /// The IDAP transaction that enqueued it (ENQ_TXN_ID).
    pub enq_txn_id: Option<String>,
    /// Still uncommitted in the IDAP transaction it belongs to.
    pub pending_txn: Option<String>,
    pub delay_until: Option<Micros>,
    pub expire_at: Option<Micros>,
    pub state: i64,
    /// Failed dequeues so far (single-consumer; the most of its consumers otherwise).
    pub retry_count: i64,
    pub orig_msgid: Option<[u8; 16]>,
    pub orig_queue: Option<String>,
    pub exc_reason: Option<i64>,
    pub exc_retries: Option<i64>,
    /// When it was removed (a kept message).
    pub deq_time: Option<Micros>,
}

/// A recorded dequeue of a message (its dequeue history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DequeueFact {
    pub consumer: String,
    pub deq_time: Micros,
    pub deq_user_id: Option<String>,
    pub txn: Option<String>,
    pub retry_count: i64,
}

/// A message whose ORIGINAL_MSGID is another's: a propagated copy or a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFact {
    pub msgid: [u8; 16],
    pub queue: String,
    pub enq_time: Micros,
    pub enq_user_id: Option<String>,
    pub exc_reason: Option<i64>,
    pub kept: bool,
}

/// A gateway job's record of a message: a doubt (outbound, published, not yet confirmed)
/// or a mark (inbound: the broker's message id it came as).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayFact {
    pub job: String,
    pub kind: &'static str,
    pub remote_id: String,
    pub at: Option<Micros>,
}

/// An open session and the messages its transaction holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSession {
    pub row: super::SessionRow,
    /// Deliveries it has locked (REMOVE or LOCKED dequeues not yet committed).
    pub locked: i64,
    /// Messages it enqueued, not yet committed.
    pub enqueued: i64,
}

/// Administration's reads and its one write outside a transaction.
#[async_trait]
pub trait AdminStore: Send + Sync {
    /// The messages of exception queue `queue` after `after_seq`, in order, at most `limit`.
    async fn exception_page(&self, queue: QueueId, after_seq: i64, limit: i64) -> Result<Vec<ExceptionMessage>>;

    /// The audit log, newest first, at most `limit` rows.
    async fn audit_list(&self, limit: i64) -> Result<Vec<AuditRecord>>;

    /// The message `msgid`, live or kept.
    async fn message_facts(&self, msgid: &[u8; 16]) -> Result<Option<MessageFacts>>;

    /// The dequeue history of message `seq`.
    async fn message_dequeues(&self, seq: i64) -> Result<Vec<DequeueFact>>;

    /// The messages (live or kept) whose ORIGINAL_MSGID is `msgid`.
    async fn message_copies(&self, msgid: &[u8; 16]) -> Result<Vec<CopyFact>>;

    /// The gateway's doubts and marks that name message `msgid` (hex, as they keep it).
    async fn message_gateway(&self, msgid_hex: &str) -> Result<Vec<GatewayFact>>;

    /// The audit rows that list `msgid_hex`, oldest first.
    async fn audit_of(&self, msgid_hex: &str) -> Result<Vec<AuditRecord>>;

    /// Every open session, oldest use first, at most `limit`, with what it holds.
    async fn open_sessions(&self, limit: i64) -> Result<Vec<OpenSession>>;
}
