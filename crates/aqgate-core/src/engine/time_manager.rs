//! The time manager: idle sessions, message expiration, and the purge of ended sessions.

use super::*;
use crate::clock::Micros;
use crate::error::AqError;
use crate::store::*;
use crate::topology::QueueInfo;

impl Engine {
    /// Rolls back and ends sessions idle for longer than the timeout, whichever process
    /// finds them: ending one is conditional on its row's version and idleness, in the
    /// transaction that rolls its work back, so each is rolled back exactly once (and a
    /// request that ran meanwhile wins). An ended session leaves a tombstone, so its
    /// cookie is answered "expired". Sessions with a request running in this process are
    /// not idle. Returns how many ended.
    pub async fn expire_sessions(&self) -> usize {
        let now = self.now();
        let limit = i64::try_from(self.config.session_timeout.as_micros()).unwrap_or(i64::MAX);
        let ttl = i64::try_from(self.config.tombstone_ttl.as_micros()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(limit);
        let idle = match self.store.sessions_idle(before, 200).await {
            Ok(rows) => rows,
            Err(e) => {
                round_failed(e.is_unavailable(), &e, "looking for idle sessions");
                return 0;
            }
        };
        if let Ok(c) = self.store.session_count().await {
            self.stored_sessions.store(c, std::sync::atomic::Ordering::Relaxed);
        }
        self.sessions.forget_idle(before);
        self.staged.forget_older(before);
        let resolved = self.resolved();
        let mut n = 0;
        for row in idle {
            let Some(_turn) = self.sessions.try_turn(&row.id_hash) else { continue };
            match self.end_idle(&resolved, &row, before, now.saturating_add(ttl)).await {
                Ok(true) => {
                    self.sessions.forget(&row.id_hash);
                    n += 1;
                }
                Ok(false) => {}
                Err(e) => round_failed(
                    e.code == code::STORE_UNAVAILABLE,
                    &e,
                    "rolling back an idle session failed; will retry",
                ),
            }
        }
        n
    }

    /// Rolls back and ends the sessions of `agent` last used before `before`, whatever the
    /// timeout: for an agent that only this service's own jobs use (a propagation job's),
    /// whose sessions from before a restart hold messages that nobody will commit. Each is
    /// ended exactly once, as in [`Engine::expire_sessions`]; a batch of another process
    /// that was ended under it fails its commit and is moved again. Returns how many ended.
    pub async fn end_sessions_of(&self, agent: &str, before: Micros) -> Result<usize, AqError> {
        let ttl = i64::try_from(self.config.tombstone_ttl.as_micros()).unwrap_or(i64::MAX);
        let rows = self.store.sessions_idle(before, 100_000).await?;
        let resolved = self.resolved();
        let mut n = 0;
        for row in rows.iter().filter(|r| r.agent == agent) {
            let Some(_turn) = self.sessions.try_turn(&row.id_hash) else { continue };
            if self.end_idle(&resolved, row, before, self.now().saturating_add(ttl)).await? {
                self.sessions.forget(&row.id_hash);
                n += 1;
            }
        }
        Ok(n)
    }

    pub(super) async fn end_idle(
        &self,
        resolved: &Resolved,
        row: &SessionRow,
        before: Micros,
        until: Micros,
    ) -> Result<bool, AqError> {
        let now = self.now();
        let Some(woken) = admin::end_session(self.store.as_ref(), resolved, row, Some(before), until, now).await?
        else {
            return Ok(false);
        };
        self.staged.forget(&row.txn);
        self.sessions_ended();
        if row.pending {
            tracing::info!(agent = %row.agent, "an idle session's transaction was rolled back");
        }
        for q in woken {
            self.wake(q);
        }
        Ok(true)
    }

    /// Forgets tombstones past their time and idempotency records past the window.
    pub async fn purge_sessions(&self) {
        let now = self.now();
        let window = i64::try_from(self.config.idempotency_window.as_micros()).unwrap_or(i64::MAX);
        match self.store.sessions_purge(now, now.saturating_sub(window)).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "session tombstones and idempotency records forgotten"),
            Err(e) => round_failed(e.is_unavailable(), &e, "purging session tombstones and idempotency records"),
        }
        // Inbound gateway jobs' marks of the broker messages they enqueued: a message
        // unacked when its job died comes again when the job is back, which may be days
        // later (an MQTT session of the job lasts a week): kept for eight days at least.
        let marks = window.max(8 * 24 * 3600 * 1_000_000);
        match self.store.gateway_seen_purge(now.saturating_sub(marks)).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(rows = n, "inbound gateway marks forgotten"),
            Err(e) => round_failed(e.is_unavailable(), &e, "purging inbound gateway marks"),
        }
    }

    /// Moves expired messages to their exception queue (state 3). Returns how many.
    pub async fn expire_messages(&self) -> Result<usize, AqError> {
        let now = self.now();
        let resolved = self.resolved();
        let due = self.store.due_expirations(now, 500).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let mut tx = self.store.begin().await?;
        if !tx.time_manager_turn().await? {
            // Another process is at it now.
            tx.rollback().await?;
            return Ok(0);
        }
        for m in &due {
            let own = resolved.names.get(&m.queue).and_then(|n| resolved.catalog.queues.get(n));
            let target = own.and_then(|q| exception_target(&resolved, q, m.exception_queue.as_deref(), m.seq));
            match target {
                Some((t, forget)) => tx.move_to_exception(m.seq, t, forget, Expiry::Time).await?,
                None => tracing::warn!(seq = m.seq, "expired message has no exception queue; left in place"),
            }
        }
        tx.commit().await?;
        Ok(due.len())
    }

    /// Deletes PROCESSED messages whose retention is over (every round: their index makes
    /// it one look when there are none) and, when `purge`, the dequeue history of messages
    /// that are gone.
    pub async fn purge_processed(&self, purge: bool) {
        match self.store.purge_processed(self.now(), 1000).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(messages = n, "processed messages past their retention deleted"),
            Err(e) => round_failed(e.is_unavailable(), &e, "deleting processed messages past their retention"),
        }
        if purge && let Err(e) = self.store.purge_history(10_000).await {
            round_failed(e.is_unavailable(), &e, "deleting the dequeue history of messages that are gone");
        }
    }

    /// One round of the time manager: expired messages to their exception queues, buffered
    /// messages in memory past their time spilled to the store, processed messages past
    /// their retention deleted, idle sessions rolled back, and (when `purge`) ended sessions' tombstones and old
    /// idempotency records dropped. The process schedules the rounds (the binary's `server.rs`).
    /// Writes this process's copy of its in-memory buffered messages for the `AQ$` views,
    /// when it is out of date, or marks it current (see `buffered::shown`); `always`: at
    /// least the mark, which also drops the copies of processes that ended.
    pub async fn show_buffered(&self, always: bool) {
        let now = self.now();
        let Some(copy) = self.buffers.copy_to_show(now, always) else { return };
        match self.store.show_buffered(&copy.node, copy.rows.as_deref()).await {
            Ok(()) => self.buffers.shown(&copy, now),
            Err(e) => round_failed(e.is_unavailable(), &e, "could not write the buffered messages the AQ$ views show"),
        }
    }

    pub async fn time_manager_round(&self, purge: bool) {
        if let Err(e) = self.expire_messages().await {
            round_failed(e.code == code::STORE_UNAVAILABLE, &e, "time manager");
        }
        self.spill(true, None).await;
        self.show_buffered(purge).await;
        self.purge_processed(purge).await;
        self.expire_sessions().await;
        if purge {
            self.purge_sessions().await;
        }
    }
}

/// Where a failed (expired, or too often rolled back) message `seq` of `queue` goes: the
/// exception queue it names, else its queue table's default. A named one that does not
/// exist (or, after a topology change, is no exception queue of the table) falls back to
/// the default, as Oracle AQ specifies, with a warning; the message then no longer names it
/// (its `exception_queue` reads NULL at dequeue, as in Oracle), which the second value says.
pub(super) fn exception_target(
    resolved: &Resolved,
    queue: &QueueInfo,
    named: Option<&str>,
    seq: i64,
) -> Option<(QueueId, bool)> {
    let mut forget = false;
    let named = named.and_then(|n| {
        let found = resolved.catalog.queue(n).filter(|t| exception_queue_of(t, queue));
        if found.is_none() {
            tracing::warn!(seq, exception_queue = n, "no such exception queue; using the default");
            forget = true;
        }
        found
    });
    let name = named.map_or(&queue.exception_queue, |t| &t.name);
    resolved.ids.get(name).map(|id| (*id, forget))
}

/// Whether `target` may receive `queue`'s failed messages: an exception queue of the same
/// queue table (so of the same payload type and consumers).
pub(super) fn exception_queue_of(target: &QueueInfo, queue: &QueueInfo) -> bool {
    target.is_exception_queue && target.queue_table == queue.queue_table
}

/// A failure of a time manager's step: at debug while the database is away (`outage`; the
/// store logs the outage once, and its end), else a warning.
fn round_failed(outage: bool, e: &dyn std::fmt::Display, what: &str) {
    if outage {
        tracing::debug!(error = %e, "{what}: the database is unavailable");
    } else {
        tracing::warn!(error = %e, "{what}");
    }
}
