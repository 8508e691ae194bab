//! Registrations for notifications, the transactional outbox's rows, and the store's part
//! that keeps them ([`NotifyStore`]): claims with a lease, shaped so one busy or failing
//! target never fills a claim ([`ClaimShape`]), and the outcomes the dispatcher records.

use async_trait::async_trait;

use super::{QueueId, Result};
use crate::clock::Micros;

/// A registration for notifications (AQXmlRegister): one per (queue, consumer, agent);
/// registering again replaces the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub queue: QueueId,
    pub consumer: String,
    pub notify_url: String,
    pub agent: String,
}

/// A notification in the transactional outbox: one per (message, registration), with the
/// message's properties as they were at enqueue.
#[derive(Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    pub id: i64,
    pub queue: QueueId,
    pub consumer: String,
    pub agent: String,
    pub notify_url: String,
    /// The registration's HMAC secret (HTTP targets), if one is set.
    pub secret: Option<String>,
    pub msgid: [u8; 16],
    pub corrid: Option<String>,
    pub priority: i64,
    pub enq_time: Micros,
    pub delay_until: Option<Micros>,
    pub expire_at: Option<Micros>,
    pub sender: Option<String>,
    pub exception_queue: Option<String>,
    /// `new` (to deliver) or `parked` (gave up; waits for `admin notifications --retry`).
    pub state: String,
    /// Delivery attempts started (counted when claimed).
    pub attempts: i64,
    pub next_attempt_at: Micros,
    pub last_error: Option<String>,
}

impl OutboxEntry {
    /// The notification's stable id (the same on every retry): receivers drop duplicates by it.
    pub fn notification_id(&self) -> String {
        format!("{}-{}", hex::encode_upper(self.msgid), self.id)
    }
}

impl std::fmt::Debug for OutboxEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxEntry")
            .field("id", &self.id)
            .field("queue", &self.queue)
            .field("consumer", &self.consumer)
            .field("agent", &self.agent)
            .field("notify_url", &self.notify_url)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("msgid", &hex::encode_upper(self.msgid))
            .field("state", &self.state)
            .field("attempts", &self.attempts)
            .field("next_attempt_at", &self.next_attempt_at)
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

/// Which due notifications a claim may take, so that one target's backlog never fills a
/// claim (and with it the dispatcher's slots).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimShape {
    /// At most this many rows to one `notify_url` (`None`: no cap).
    pub per_url: Option<i64>,
    /// No rows to these `notify_url`s (their target is busy, or its circuit is open).
    pub skip_urls: Vec<String>,
}

/// Registrations for notifications, and the outbox of notifications to deliver.
#[async_trait]
pub trait NotifyStore: Send + Sync {
    /// Registrations on a queue.
    async fn registrations(&self, queue: QueueId) -> Result<Vec<Registration>>;

    /// Every registration (for `admin registrations`).
    async fn all_registrations(&self) -> Result<Vec<Registration>>;

    /// Sets (or clears) the HMAC secret of a registration. False if there is none.
    async fn set_registration_secret(
        &self,
        queue: QueueId,
        consumer: &str,
        agent: &str,
        secret: Option<&str>,
    ) -> Result<bool>;

    /// Claims up to `limit` notifications due at `now`, oldest due first within what
    /// `shape` allows: their next attempt moves to `lease_until` (so no one else takes them
    /// meanwhile; a crashed dispatcher's claims come due again then) and their attempt count
    /// goes up.
    async fn notify_claim(
        &self,
        now: Micros,
        lease_until: Micros,
        limit: i64,
        shape: &ClaimShape,
    ) -> Result<Vec<OutboxEntry>>;

    /// Gives claimed notifications back unattempted: the claim's attempt is taken back and
    /// they are due at `at`.
    async fn notify_release(&self, ids: &[i64], at: Micros) -> Result<()>;

    /// Moves the next attempt of the pending notifications to these `urls` to `until`
    /// where it is earlier (a target whose circuit is open). Returns how many moved.
    async fn notify_defer(&self, urls: &[String], until: Micros) -> Result<u64>;

    /// Removes delivered notifications.
    async fn notify_delivered(&self, ids: &[i64]) -> Result<()>;

    /// Records a failed attempt: try again at `next_attempt_at`, or park (`None`).
    async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()>;

    /// When the next committed, unparked notification is due, leaving out those to `skip_urls`.
    async fn notify_next_due(&self, skip_urls: &[String]) -> Result<Option<Micros>>;

    /// Notifications not yet delivered (pending and parked), oldest first.
    async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>>;

    /// Counts of (pending, parked) committed notifications.
    async fn notify_counts(&self) -> Result<(i64, i64)>;

    /// Puts parked notifications back in line (due at `now`, attempts reset). Returns how many.
    async fn notify_unpark(&self, now: Micros) -> Result<u64>;
}
