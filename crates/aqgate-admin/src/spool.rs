//! `aqgate admin spool`: mail the SMTP filter accepted and has not finished (to forward,
//! replies owed, held, or failed for good).

use std::io::Write;

use aqgate_core::store::Store;

/// At most this many rows are listed.
const LIMIT: i64 = 1000;

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
