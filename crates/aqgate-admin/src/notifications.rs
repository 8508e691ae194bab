//! `aqgate admin notifications` (notifications not yet delivered, or parked ones put back
//! in line) and `aqgate admin registrations` (the registrations, or one's HMAC secret set);
//! [`deliveries`] and [`registrations`], the rows as the web console lists them.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use aqgate_core::store::Store;
use aqgate_core::topology::canon;

/// At most this many rows are listed.
pub const LIMIT: i64 = 1000;

/// A notification not yet delivered, as the web console shows it (its target redacted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Delivery {
    pub notification_id: String,
    /// `new` (pending) or `parked` (given up).
    pub state: String,
    pub attempts: i64,
    /// The queue's name (`?` when the store knows it no longer).
    pub queue: String,
    pub consumer: String,
    pub agent: String,
    /// Without user info and query ([`aqgate_notify::redact_url`]).
    pub target: String,
    pub next_attempt_at: aqgate_core::clock::Micros,
    pub last_error: Option<String>,
}

/// A registration, as the web console shows it (its target redacted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegistrationLine {
    pub queue: String,
    pub consumer: String,
    pub agent: String,
    pub target: String,
}

async fn queue_names(store: &dyn Store) -> Result<HashMap<i64, String>, aqgate_core::error::AqError> {
    Ok(store.queue_ids().await?.into_iter().map(|(n, id)| (id, n)).collect())
}

/// (pending, parked) and the notifications not yet delivered, oldest first, at most
/// `limit` (1 to [`LIMIT`]).
pub async fn deliveries(
    store: &dyn Store,
    limit: i64,
) -> Result<((i64, i64), Vec<Delivery>), aqgate_core::error::AqError> {
    let names = queue_names(store).await?;
    let counts = store.notify_counts().await?;
    let rows = store.notify_pending(limit.clamp(1, LIMIT)).await?;
    let rows = rows
        .into_iter()
        .map(|e| Delivery {
            notification_id: e.notification_id(),
            queue: names.get(&e.queue).cloned().unwrap_or_else(|| "?".into()),
            target: aqgate_notify::redact_url(&e.notify_url),
            state: e.state,
            attempts: e.attempts,
            consumer: e.consumer,
            agent: e.agent,
            next_attempt_at: e.next_attempt_at,
            last_error: e.last_error,
        })
        .collect();
    Ok((counts, rows))
}

/// The registrations, at most `limit` (1 to [`LIMIT`]), and whether there are more.
pub async fn registrations(
    store: &dyn Store,
    limit: i64,
) -> Result<(Vec<RegistrationLine>, bool), aqgate_core::error::AqError> {
    let names = queue_names(store).await?;
    let mut all = store.all_registrations().await?;
    let limit = usize::try_from(limit.clamp(1, LIMIT)).unwrap_or(1);
    let more = all.len() > limit;
    all.truncate(limit);
    let rows = all
        .into_iter()
        .map(|r| RegistrationLine {
            queue: names.get(&r.queue).cloned().unwrap_or_else(|| "?".into()),
            target: aqgate_notify::redact_url(&r.notify_url),
            consumer: r.consumer,
            agent: r.agent,
        })
        .collect();
    Ok((rows, more))
}

/// `aqgate admin notifications`: counts, then every pending and parked notification.
pub async fn print_notifications(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let ((pending, parked), rows) = deliveries(store, LIMIT).await?;
    out!(w, "{pending} pending, {parked} parked");
    out!(
        w,
        "{:<44} {:<7} {:>8} {:<24} {:<12} {:<40} LAST_ERROR",
        "NOTIFICATION_ID",
        "STATE",
        "ATTEMPTS",
        "QUEUE",
        "CONSUMER",
        "TARGET"
    );
    for e in rows {
        row!(
            w,
            "{:<44} {:<7} {:>8} {:<24} {:<12} {:<40} {}",
            e.notification_id,
            e.state,
            e.attempts,
            e.queue,
            if e.consumer.is_empty() { "-" } else { &e.consumer },
            e.target;
            e.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

/// `aqgate admin notifications --retry-parked`: every parked notification due now, its
/// attempts reset.
pub async fn retry_parked(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let n = store.notify_unpark(aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock)).await?;
    out!(w, "{n} parked notification(s) put back in line");
    Ok(())
}

/// `aqgate admin registrations`: queue, consumer, agent and (redacted) target of each.
pub async fn print_registrations(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let names: HashMap<_, _> = store.queue_ids().await?.into_iter().map(|(n, id)| (id, n)).collect();
    out!(w, "{:<28} {:<16} {:<16} NOTIFY_URL", "QUEUE", "CONSUMER", "AGENT");
    for r in store.all_registrations().await? {
        row!(
            w,
            "{:<28} {:<16} {:<16} {}",
            names.get(&r.queue).map_or("?", String::as_str),
            if r.consumer.is_empty() { "-" } else { &r.consumer },
            r.agent;
            aqgate_notify::redact_url(&r.notify_url)
        );
    }
    Ok(())
}

/// The secret for `--set-secret`: `AQGATE_NOTIFY_SECRET`, else the first line of `input`.
fn read_secret(input: &mut dyn BufRead) -> std::io::Result<String> {
    match std::env::var("AQGATE_NOTIFY_SECRET") {
        Ok(s) => Ok(s),
        Err(_) => {
            let mut line = String::new();
            input.read_line(&mut line)?;
            Ok(line.trim_end_matches(['\r', '\n']).to_string())
        }
    }
}

/// `aqgate admin registrations --set-secret QUEUE CONSUMER AGENT`: sets the HMAC secret of
/// that registration (CONSUMER `-` on a single-consumer queue) to the secret of
/// [`read_secret`] (read once the queue is known); an empty one removes it.
pub async fn set_secret(
    store: &dyn Store,
    [queue, consumer, agent]: [&str; 3],
    input: &mut dyn BufRead,
    w: &mut dyn Write,
) -> anyhow::Result<()> {
    let ids: HashMap<_, _> = store.queue_ids().await?.into_iter().collect();
    let queue = canon(queue);
    let qid = *ids.get(&queue).ok_or_else(|| anyhow::anyhow!("no queue {queue}"))?;
    let consumer = if consumer == "-" { String::new() } else { canon(consumer) };
    let secret = read_secret(input)?;
    let secret = (!secret.is_empty()).then_some(secret.as_str());
    let agent = canon(agent);
    if !store.set_registration_secret(qid, &consumer, &agent, secret).await? {
        anyhow::bail!("no registration of agent {agent} for {queue} consumer {consumer:?}");
    }
    out!(w, "secret {} for {queue} {consumer:?} {agent}", if secret.is_some() { "set" } else { "removed" });
    Ok(())
}
