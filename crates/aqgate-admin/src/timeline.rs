//! `aqgate admin timeline MSGID`: what the store knows of one message, in time order: its
//! enqueue (agent, IDAP transaction), delay and expiration, the dequeues its history
//! recorded, its failed dequeues, the move to an exception queue with the reason, where a
//! copy came from (ORIGINAL_MSGID), the copies and replays made of it, the gateway's doubt
//! while a publish is unconfirmed, and the audit rows that name it.

use std::io::Write;

use aqgate_core::clock::Micros;
use aqgate_core::error::AqError;
use aqgate_core::payload::hex_upper;
use aqgate_core::store::{Expiry, Store};

/// One event of a message's life.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    /// When (microseconds since the epoch); `None` when the store keeps no time for it.
    pub at: Option<Micros>,
    /// `enqueued`, `delay`, `expires`, `dequeued`, `failed_dequeues`, `exception`,
    /// `copy_of`, `copied_to`, `replayed_to`, `replayed_from`, `gateway_doubt`, `audit`,
    /// `now`.
    pub what: String,
    /// The event's facts, as text.
    pub detail: String,
}

/// A message's timeline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Timeline {
    pub msgid: String,
    /// Where it is now (`None`: no longer in the store; its copies and audit rows remain).
    pub queue: Option<String>,
    pub state: Option<String>,
    pub events: Vec<Event>,
}

/// An RFC 3339 time (UTC, microseconds) of the store's microseconds.
pub fn time_text(at: Micros) -> String {
    chrono::DateTime::from_timestamp_micros(at)
        .map_or_else(|| at.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
}

fn reason_text(code: Option<i64>) -> String {
    Expiry::ALL.iter().find(|e| Some(e.code()) == code).map_or_else(|| "-".into(), |e| e.oracle_name().to_string())
}

fn state_text(state: i64, kept: bool) -> &'static str {
    match state {
        _ if kept => "PROCESSED",
        3 => "EXPIRED (in an exception queue)",
        7 => "SPILLED",
        _ => "READY or WAIT",
    }
}

/// The timeline of message `msgid` (32 hex digits).
pub async fn timeline(store: &dyn Store, msgid: &str) -> Result<Timeline, AqError> {
    let hexid = msgid.trim().to_ascii_uppercase();
    let id: [u8; 16] = hex::decode(&hexid)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| AqError::invalid(format!("{msgid}: a message id is 32 hex digits")))?;
    let facts = store.message_facts(&id).await?;
    let mut events = Vec::new();
    let ev = |at: Option<Micros>, what: &str, detail: String| Event { at, what: what.into(), detail };
    if let Some(f) = &facts {
        let copy = f.orig_msgid.map(|o| hex_upper(&o));
        let replay = f.enq_txn_id.as_deref().is_some_and(|t| t.starts_with("replay-"));
        let mut detail = format!(
            "queue {} (at first: {}), agent {}, transaction {}, priority {}, correlation {}",
            f.queue,
            if f.exc_reason.is_some() { f.orig_queue.as_deref().unwrap_or("-") } else { &f.queue },
            f.enq_user_id.as_deref().unwrap_or("-"),
            f.enq_txn_id.as_deref().unwrap_or("-"),
            f.priority,
            f.corrid.as_deref().unwrap_or("-"),
        );
        if let Some(t) = &f.pending_txn {
            detail.push_str(&format!("; not committed yet (session transaction {t})"));
        }
        events.push(ev(Some(f.enq_time), "enqueued", detail));
        if let (Some(o), None) = (&copy, f.exc_reason) {
            let what = if replay { "replayed_from" } else { "copy_of" };
            events.push(ev(Some(f.enq_time), what, format!("{o} of queue {}", f.orig_queue.as_deref().unwrap_or("-"))));
        }
        if let Some(d) = f.delay_until {
            events.push(ev(Some(d), "delay", "ready from then".into()));
        }
        if let Some(x) = f.expire_at {
            events.push(ev(Some(x), "expires", "moves to its exception queue then, unless dequeued".into()));
        }
        for d in store.message_dequeues(f.seq).await? {
            let detail = format!(
                "consumer {}, agent {}, transaction {}, after {} failed dequeue(s)",
                if d.consumer.is_empty() { "-" } else { &d.consumer },
                d.deq_user_id.as_deref().unwrap_or("-"),
                d.txn.as_deref().unwrap_or("-"),
                d.retry_count
            );
            events.push(ev(Some(d.deq_time), "dequeued", detail));
        }
        if f.exc_reason.is_some() {
            let detail = format!(
                "moved from {} to exception queue {}: {}, after {} failed dequeue(s){}",
                f.orig_queue.as_deref().unwrap_or("-"),
                f.queue,
                reason_text(f.exc_reason),
                f.exc_retries.unwrap_or(0),
                copy.as_ref().map_or(String::new(), |o| format!(" (a copy of {o})")),
            );
            events.push(ev(None, "exception", detail));
        } else if f.retry_count > 0 {
            events.push(ev(None, "failed_dequeues", format!("{} dequeue(s) rolled back so far", f.retry_count)));
        }
        if let Some(t) = f.deq_time {
            events.push(ev(Some(t), "processed", "removed; kept for its queue's retention time".into()));
        }
    }
    for c in store.message_copies(&id).await? {
        let replay = c.exc_reason.is_none() && is_replay(store, &c.msgid).await?;
        let what = if replay { "replayed_to" } else { "copied_to" };
        let detail = format!(
            "{} in queue {}{}",
            hex_upper(&c.msgid),
            c.queue,
            if c.exc_reason.is_some() { format!(" ({})", reason_text(c.exc_reason)) } else { String::new() }
        );
        events.push(ev(Some(c.enq_time), what, detail));
    }
    for g in store.message_gateway(&hexid).await? {
        events.push(ev(
            g.at,
            "gateway_doubt",
            format!("job {}: published as {}, not yet confirmed", g.job, g.remote_id),
        ));
    }
    for a in store.audit_of(&hexid).await? {
        let detail = format!(
            "{} by {} from {} to {} (run {})",
            a.action,
            a.actor,
            a.queue,
            a.target.as_deref().unwrap_or("-"),
            a.run
        );
        events.push(ev(Some(a.at), "audit", detail));
    }
    if facts.is_none() && events.is_empty() {
        return Err(AqError::invalid(format!("no message {hexid} in the store, and nothing names it")));
    }
    // Timeless events keep their place after the timed ones before them.
    events.sort_by_key(|e| e.at.unwrap_or(Micros::MAX));
    Ok(Timeline {
        msgid: hexid,
        queue: facts.as_ref().map(|f| f.queue.clone()),
        state: facts.as_ref().map(|f| state_text(f.state, f.kept).to_string()),
        events,
    })
}

async fn is_replay(store: &dyn Store, msgid: &[u8; 16]) -> Result<bool, AqError> {
    Ok(store.message_facts(msgid).await?.and_then(|f| f.enq_txn_id).is_some_and(|t| t.starts_with("replay-")))
}

/// Prints a timeline: a line per event, or with `json` the timeline.
pub async fn print_timeline(store: &dyn Store, msgid: &str, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let t = timeline(store, msgid).await?;
    if json {
        out!(w, "{}", serde_json::to_string_pretty(&t)?);
        return Ok(());
    }
    out!(
        w,
        "message {}: {}",
        t.msgid,
        match (&t.queue, &t.state) {
            (Some(q), Some(s)) => format!("in {q}, {s}"),
            _ => "no longer in the store".into(),
        }
    );
    for e in &t.events {
        row!(w, "{:<27} {:<16} {}", e.at.map_or_else(|| "-".into(), time_text), e.what; e.detail);
    }
    Ok(())
}
