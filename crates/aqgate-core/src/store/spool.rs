//! The mail spool in the store: signed mails accepted by the SMTP filter, kept until
//! forwarded and answered ([`SpoolStore`]), with leases on PostgreSQL so that the workers of
//! several processes share it.

use async_trait::async_trait;

use super::Result;
use crate::clock::Micros;

/// A mail accepted by the SMTP filter: stored (committed) before the 250, then forwarded
/// to the servlet and answered by the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledMail {
    pub id: i64,
    pub received_at: Micros,
    /// The verified agent the mail was signed by.
    pub agent: String,
    pub message_id: String,
    /// Recognises a re-sent copy of the same signed mail (with the agent).
    pub dedupe_key: String,
    pub reply_to: String,
    pub subject: Option<String>,
    pub idap: Vec<u8>,
    /// `new` (to forward), `done` (forwarded; `response` set), `failed` (given up), or
    /// `held`: stored, but not to be performed until [`Store::spool_release`] (the SMTP
    /// answer for the whole mail is not known yet). Given as `held` to `spool_put` to store
    /// a mail held; anything else stores it `new`.
    pub state: String,
    pub attempts: i64,
    pub response: Option<Vec<u8>>,
    pub last_error: Option<String>,
    /// Replies owed: 1, plus one for every re-sent copy of the same mail.
    pub replies_wanted: i64,
    pub replies_sent: i64,
    /// The Message-ID of the latest re-sent copy (set by `spool_put` of a duplicate): the
    /// replies after the first answer it.
    pub resend_message_id: Option<String>,
    /// DER of the certificate replies are encrypted to (the agent's, when a copy came
    /// encrypted); `None`: replies are not encrypted. A duplicate's value, if set, is kept.
    pub encrypt_to: Option<Vec<u8>>,
}

/// What storing a mail did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpoolPut {
    /// Stored now, or stored held before and this is that mail's first accepted copy.
    New(i64),
    /// The same signer sent the same signed mail before: not forwarded again; one more
    /// reply with the original response is owed.
    Duplicate(i64),
}

/// The mail spool: signed mails accepted by the SMTP filter, until forwarded and answered.
#[async_trait]
pub trait SpoolStore: Send + Sync {
    /// Stores an accepted mail (committed when this returns), or counts a duplicate. A mail
    /// put `held` owes no reply yet and is not forwarded; a duplicate put `held` changes
    /// nothing (see [`Store::spool_release`]); a duplicate put otherwise of a held mail
    /// releases it.
    async fn spool_put(&self, m: &SpooledMail) -> Result<SpoolPut>;

    /// The mail put `held` was accepted after all: a held mail becomes `new` (it will be
    /// forwarded); one reply more is owed either way.
    async fn spool_release(&self, id: i64, now: Micros) -> Result<()>;

    /// Mails to forward or answer now.
    async fn spool_due(&self, now: Micros, limit: i64) -> Result<Vec<SpooledMail>>;

    /// Claims a due mail for this process's worker: its next attempt moves to the end of a
    /// lease, so that the workers of other processes leave it alone meanwhile (a crashed
    /// process's claim comes due again then). False if it is not due any more (another
    /// process claimed it). SQLite has one process: always true.
    async fn spool_claim(&self, id: i64, now: Micros, owner: &str) -> Result<bool> {
        let _ = (id, now, owner);
        Ok(true)
    }

    /// The processes (`host:pid:random`) that hold claims on spooled mail not yet due.
    async fn spool_claim_owners(&self, now: Micros) -> Result<Vec<String>> {
        let _ = now;
        Ok(Vec::new())
    }

    /// Ends the claims `owner` holds (a dead process's): its mails are due at `now`.
    async fn spool_unclaim(&self, owner: &str, now: Micros) -> Result<u64> {
        let _ = (owner, now);
        Ok(0)
    }

    /// Records the outcome of a forwarding attempt: `response` when forwarded, else the
    /// error and when to try again (`next_attempt_at = None`: give up, state `failed`).
    async fn spool_attempted(
        &self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()>;

    /// Records, for each (mail id, replies sent), how many replies have gone out — one
    /// statement for a whole batch of mails.
    async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()>;

    /// Forgets finished mails (forwarded or failed, every reply sent) received before
    /// `before`: the dedupe window is over, a re-sent copy is a new request. Returns how many.
    async fn spool_purge(&self, before: Micros) -> Result<u64>;

    async fn spool_get(&self, id: i64) -> Result<Option<SpooledMail>>;

    /// Mails that are not finished (to forward, replies owed, or failed), oldest first.
    async fn spool_pending(&self, limit: i64) -> Result<Vec<SpooledMail>>;
}
