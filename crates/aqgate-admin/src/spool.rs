//! `aqgate admin spool`: mail the SMTP filter accepted and has not finished (to forward,
//! replies owed, held, or failed for good); [`spool`], the same mails as the web console
//! lists them.

use std::io::Write;

use aqgate_core::clock::Micros;
use aqgate_core::error::AqError;
use aqgate_core::store::Store;

/// At most this many rows are listed.
pub const LIMIT: i64 = 1000;

/// A mail of the spool as the web console shows it (its request and response bytes left
/// out). Every mail in the spool passed the S/MIME check: a mail whose signature failed was
/// refused at SMTP time and never stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpoolLine {
    pub id: i64,
    pub received_at: Micros,
    /// The verified From (where replies go).
    pub from: String,
    pub message_id: String,
    pub subject: Option<String>,
    /// The agent whose certificate signed it.
    pub agent: String,
    /// It came encrypted (its replies are encrypted to the signer).
    pub encrypted: bool,
    /// `new`, `held`, `done` or `failed`.
    pub state: String,
    /// Forwarding attempts made.
    pub attempts: i64,
    /// Its requests were performed (a response is stored).
    pub performed: bool,
    pub replies_wanted: i64,
    pub replies_sent: i64,
    /// The Message-ID of the latest re-sent copy, if one came.
    pub resend_message_id: Option<String>,
    pub last_error: Option<String>,
}

/// The unfinished mails of the spool, newest first, at most `limit` (1 to [`LIMIT`]) of
/// the [`LIMIT`] oldest.
pub async fn spool(store: &dyn Store, limit: i64) -> Result<Vec<SpoolLine>, AqError> {
    let mut rows = store.spool_pending(LIMIT).await?;
    rows.reverse();
    rows.truncate(usize::try_from(limit.clamp(1, LIMIT)).unwrap_or(1));
    Ok(rows
        .into_iter()
        .map(|m| SpoolLine {
            id: m.id,
            received_at: m.received_at,
            from: m.reply_to,
            message_id: m.message_id,
            subject: m.subject,
            agent: m.agent,
            encrypted: m.encrypt_to.is_some(),
            state: m.state,
            attempts: m.attempts,
            performed: m.response.is_some(),
            replies_wanted: m.replies_wanted,
            replies_sent: m.replies_sent,
            resend_message_id: m.resend_message_id,
            last_error: m.last_error,
        })
        .collect())
}

pub async fn print_spool(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = store.spool_pending(LIMIT).await?;
    if rows.is_empty() {
        out!(w, "spool empty: every accepted mail was forwarded and answered");
    }
    out!(
        w,
        "{:>6} {:<8} {:<10} {:>8} {:>7}  {:<40} LAST_ERROR",
        "ID",
        "STATE",
        "AGENT",
        "ATTEMPTS",
        "REPLIES",
        "MESSAGE_ID"
    );
    for m in rows {
        row!(
            w,
            "{:>6} {:<8} {:<10} {:>8} {:>3}/{:<3}  {:<40} {}",
            m.id,
            m.state,
            m.agent,
            m.attempts,
            m.replies_sent,
            m.replies_wanted,
            m.message_id;
            m.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
