//! `aqgate admin sessions`: the open IDAP sessions as the store keeps them (every process
//! sharing the database writes its sessions there, in each request's transaction): a prefix
//! of the id's hash (the store never holds the id itself), the agent, age of its last use,
//! its open transaction's locked and enqueued messages; and `--abort PREFIX`, which ends
//! one as the time manager ends an idle one: its transaction rolled back (each locked
//! message's failed dequeues counted, as a rollback counts them), its row gone, its cookie
//! answered "session expired" until the tombstone's time is up.

use std::io::Write;

use aqgate_core::clock::{Clock, Micros, SystemClock};
use aqgate_core::error::AqError;
use aqgate_core::store::Store;

/// The most sessions listed.
pub const LIMIT: i64 = 10_000;
/// Hex digits of the id hash shown.
pub const PREFIX: usize = 12;
/// How long an aborted session's cookie is answered "expired" (the server's default
/// `--session-tombstone-ttl`).
const TOMBSTONE: Micros = 24 * 3600 * 1_000_000;

/// One open session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SessionInfo {
    /// The first [`PREFIX`] hex digits of the SHA-256 of its id (never the id).
    pub id: String,
    pub agent: String,
    /// Since its last request (or until the end of a long poll under way: negative).
    pub idle_seconds: i64,
    pub last_used: Micros,
    /// Its transaction holds uncommitted work.
    pub pending: bool,
    /// Deliveries its transaction has locked (REMOVE or LOCKED dequeues).
    pub locked: i64,
    /// Messages its transaction enqueued, not yet committed.
    pub enqueued: i64,
    /// Its IDAP transaction (ENQ_TXN_ID / DEQ_TXN_ID of its work).
    pub txn: String,
}

/// The open sessions, longest idle first.
pub async fn sessions(store: &dyn Store) -> Result<Vec<SessionInfo>, AqError> {
    let now = SystemClock.now();
    Ok(store
        .open_sessions(LIMIT)
        .await?
        .into_iter()
        .map(|s| SessionInfo {
            id: hex::encode(&s.row.id_hash).chars().take(PREFIX).collect(),
            agent: s.row.agent,
            idle_seconds: now.saturating_sub(s.row.last_used) / 1_000_000,
            last_used: s.row.last_used,
            pending: s.row.pending,
            locked: s.locked,
            enqueued: s.enqueued,
            txn: s.row.txn,
        })
        .collect())
}

/// What `--abort` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Aborted {
    pub id: String,
    pub agent: String,
    /// Messages its rollback released, of which queues (several times for several).
    pub released_queues: Vec<String>,
    pub had_work: bool,
}

/// Ends the one session whose id hash starts with `prefix` (at least 6 hex digits), its
/// transaction rolled back.
pub async fn abort(store: &dyn Store, prefix: &str) -> Result<Aborted, AqError> {
    let prefix = prefix.trim().to_ascii_lowercase();
    if prefix.len() < 6 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AqError::invalid(format!("--abort {prefix}: the ID column's hex digits (6 at least)")));
    }
    let open = store.open_sessions(LIMIT).await?;
    let mut found = open.iter().filter(|s| hex::encode(&s.row.id_hash).starts_with(&prefix));
    let (Some(s), None) = (found.next(), found.next()) else {
        let n = open.iter().filter(|s| hex::encode(&s.row.id_hash).starts_with(&prefix)).count();
        return Err(AqError::invalid(if n == 0 {
            format!("no open session {prefix} (aqgate admin sessions lists them)")
        } else {
            format!("{n} sessions start with {prefix}: give more digits")
        }));
    };
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let now = SystemClock.now();
    let ended =
        aqgate_core::engine::admin::end_session(store, &resolved, &s.row, None, now.saturating_add(TOMBSTONE), now)
            .await?;
    let Some(woken) = ended else {
        return Err(AqError::invalid(format!(
            "session {prefix} changed or ended meanwhile (a request of it ran): look again and retry"
        )));
    };
    Ok(Aborted {
        id: hex::encode(&s.row.id_hash).chars().take(PREFIX).collect(),
        agent: s.row.agent.clone(),
        released_queues: woken.iter().filter_map(|q| resolved.names.get(q).cloned()).collect(),
        had_work: s.row.pending,
    })
}

pub async fn print_sessions(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = sessions(store).await?;
    if json {
        out!(w, "{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    out!(w, "{:<12} {:<16} {:>8} {:<7} {:>6} {:>8} TXN", "ID", "AGENT", "IDLE_S", "PENDING", "LOCKED", "ENQUEUED");
    for s in &rows {
        row!(
            w,
            "{:<12} {:<16} {:>8} {:<7} {:>6} {:>8} {}",
            s.id,
            s.agent,
            s.idle_seconds,
            if s.pending { "yes" } else { "no" },
            s.locked,
            s.enqueued;
            s.txn
        );
    }
    Ok(())
}

pub async fn print_abort(store: &dyn Store, prefix: &str, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let a = abort(store, prefix).await?;
    if json {
        out!(w, "{}", serde_json::to_string_pretty(&a)?);
        return Ok(());
    }
    let work = if a.had_work { "its transaction rolled back" } else { "it had no open work" };
    out!(w, "session {} of agent {} ended: {work}; its cookie is answered \"session expired\"", a.id, a.agent);
    Ok(())
}
