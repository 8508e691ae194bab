//! Sessions and their transactions: writing the session row in the request's own
//! transaction (seal), commit, rollback, and the faults of a session that changed or ended.

use super::*;
use crate::error::{AqError, code};
use crate::idap::model::*;
use crate::store::*;

impl Engine {
    /// A stored session's request failed: if another request (another process) changed
    /// or ended the session meanwhile, this one ran on a stale copy, and says so instead;
    /// else its use is recorded (it counts as activity for the idle timeout).
    pub(super) async fn after_failure(&self, session: &Session, version: i64, e: AqError) -> AqError {
        if e.code == code::SESSION_EXPIRED {
            return e;
        }
        if e.code == code::SESSION_BUSY {
            // The request's transaction is gone by now (on SQLite it holds the one
            // connection): look whether the session still lives.
            return self.session_conflict(session).await;
        }
        let hash = session.id_hash();
        match self.store.session_get(&hash).await {
            Ok(SessionLookup::Live(row)) if row.version == version => {
                if let Err(e) = self.store.session_touch(&hash, session.last_used).await {
                    tracing::warn!(error = %e, "recording a session's use");
                }
                e
            }
            Ok(_) => self.session_conflict(session).await,
            Err(_) => e,
        }
    }

    /// Whether the request being performed must write down what it leaves (the session's
    /// row, its idempotency record) in its own transaction: one-statement fast paths are
    /// only for requests with neither.
    pub(super) fn sealed(&self, session: &Session) -> bool {
        session.stored.is_some()
            || session.idempotency.is_some()
            || !session.seen.is_empty()
            || !session.settled.is_empty()
            || session.tally.is_some()
    }

    /// Writes a propagation batch's counts (`Session::tally`) in `tx`, the transaction that
    /// commits the batch: called just before that commit.
    pub(super) async fn tally(&self, tx: &mut dyn StoreTx, session: &mut Session) -> Result<(), AqError> {
        if let Some(t) = session.tally.take() {
            tx.job_tally(&t.job, t.propagated, t.exceptions).await?;
        }
        Ok(())
    }

    /// Writes, inside the request's transaction `tx`, what the request leaves: the session
    /// row (once the session holds anything, for as long as it lives; a new one only within
    /// the session limits, see `fair`) and, under an idempotency key, the response (`None`:
    /// a read that changes nothing, not recorded). Returns the row's new version, if it wrote one. A
    /// session changed or ended meanwhile by another request (another process) fails the
    /// request, so that `tx` is rolled back and nothing of it happened.
    pub(super) async fn seal(
        &self,
        tx: &mut dyn StoreTx,
        session: &Session,
        next: &SessionState,
        response: Option<&Response>,
    ) -> Result<Option<i64>, AqError> {
        let mut version = None;
        // A propagation job's session is one batch: its row is what a crash would leave to
        // roll back, and goes once the batch is over (positions are no use to the next
        // batch, which is a session of its own). Otherwise each batch would leave a row
        // until the session timeout, and a busy job would fill the sessions' cap.
        if session.propagates
            && !next.pending
            && let Some(v) = session.stored
        {
            if !tx.session_end(&session.id_hash(), v, None, None).await? {
                return Err(session_busy_error());
            }
        } else if session.stored.is_some() || next.holds_anything() {
            if session.stored.is_none() {
                self.may_open_session(tx, session).await?;
            }
            let v = session.stored.map_or(1, |v| v + 1);
            let row = SessionRow {
                id_hash: session.id_hash(),
                agent: session.agent.clone(),
                txn: next.txn.clone(),
                pending: next.pending,
                dequeued: next.dequeued,
                enqueued: i64::try_from(next.enqueued).unwrap_or(i64::MAX),
                positions: next.positions_json(),
                last_used: session.last_used,
                version: v,
                intact: true,
            };
            if !tx.session_put(&row).await? {
                // Told apart (busy or expired) once `tx` is gone: see `after_failure`.
                return Err(session_busy_error());
            }
            version = Some(v);
        }
        if !session.seen.is_empty() && !tx.gateway_seen_put(&session.agent, &session.seen, self.now()).await? {
            return Err(AqError::client(
                code::IDEMPOTENCY_IN_PROGRESS,
                "a broker message of this request was enqueued already",
            ));
        }
        if !session.settled.is_empty() {
            tx.gateway_doubt_clear(&session.agent, &session.settled).await?;
        }
        if let Some(claim) = &session.idempotency {
            // No response: a read that changes nothing (a browse), which a retry may simply
            // perform again (docs/idap.md, "Sessions, restarts and retries").
            let Some(response) = response else {
                self.unrecorded();
                return Ok(version);
            };
            let answered =
                crate::idap::write_response(&Envelope { headers: Vec::new(), body: response.clone() }).into_bytes();
            let rec = IdempotencyRecord {
                agent: session.agent.clone(),
                key: claim.key.clone(),
                request_hash: claim.request_hash.clone(),
                response: self.record_of(&session.agent, &claim.key, answered)?,
                created_at: self.now(),
            };
            if !tx.idempotency_put(&rec).await? {
                return Err(AqError::client(
                    code::IDEMPOTENCY_IN_PROGRESS,
                    "a request with this Idempotency-Key was performed meanwhile; send it again for its response",
                ));
            }
        }
        Ok(version)
    }

    /// Commits a request's transaction; a session write the backend made with a later
    /// statement that found another version fails it here (see `StoreTx::session_put`).
    pub(super) async fn commit_tx(&self, tx: Box<dyn StoreTx>) -> Result<(), AqError> {
        match tx.commit().await {
            Ok(()) => Ok(()),
            Err(e) if e.is_session_conflict() => Err(session_busy_error()),
            // The database answered the COMMIT with "no space": it did not commit (SQLite
            // leaves the transaction uncommitted, PostgreSQL rolls it back).
            Err(e) if e.is_full() => Err(e.into()),
            Err(e) => {
                tracing::error!(error = %e, "store failure at commit");
                Err(AqError::server(
                    code::INTERNAL,
                    "the database did not confirm the commit: the request may or may not have been performed \
                     (with an Idempotency-Key, send it again to learn which)",
                ))
            }
        }
    }

    /// The fault for a session whose row another request changed or ended (called with
    /// no transaction of the request open).
    pub(super) async fn session_conflict(&self, session: &Session) -> AqError {
        match self.store.session_get(&session.id_hash()).await {
            // Older than what this process wrote: the database lost writes (a crash of
            // PostgreSQL after provisional ones), not a concurrent request.
            Ok(SessionLookup::Live(row)) if session.stored.is_some_and(|v| row.version < v) => {
                tracing::warn!(agent = %row.agent, "a session's row is older than its last write: the database lost writes");
                transaction_lost_error()
            }
            Ok(SessionLookup::Live(_)) => session_busy_error(),
            Ok(_) if session.stored.is_some() => session_expired_error(),
            // A new session's id taken meanwhile (128 random bits: not in practice).
            _ => AqError::server(code::INTERNAL, "the session could not be stored; the request was not performed"),
        }
    }

    /// Takes on what a performed request left of the session.
    pub(super) fn settle(&self, session: &mut Session, next: SessionState, version: Option<i64>) {
        if next.txn != session.txn {
            // Committed (told already, see `commit`) or rolled back: its staged messages go.
            self.staged.forget(&session.txn);
        }
        if session.propagates && !next.pending && session.stored.is_some() {
            // `seal` ended the job batch's row.
            session.stored = None;
            self.stored_sessions.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        let ended = next.txn != session.txn;
        session.set_state(next);
        if ended {
            session.intact = true;
        }
        if version.is_some() {
            if session.stored.is_none() {
                self.stored_sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            session.stored = version;
        }
    }

    /// Writes a change of the session that came with no other effect (a browse that
    /// reached the end of the queue), in a transaction of its own.
    pub(super) async fn seal_alone(&self, session: &mut Session, next: SessionState) -> Result<(), AqError> {
        if session.stored.is_none() && !next.holds_anything() {
            session.set_state(next);
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        let v = self.seal(&mut *tx, session, &next, None).await?;
        self.commit_tx(tx).await?;
        self.settle(session, next, v);
        Ok(())
    }

    /// The database transaction a request that writes works in: the one its session holds
    /// (a propagation batch's, see `HeldTx`; then `true` beside it), else a new one.
    pub(super) async fn held_or_begin(
        &self,
        session: &mut Session,
        provisional: bool,
    ) -> Result<(Box<dyn StoreTx>, bool), AqError> {
        if session.held.is_active() {
            return session.held.take().map(|tx| (tx, true)).ok_or_else(held_lost_error);
        }
        let tx = if provisional { self.store.begin_provisional().await? } else { self.store.begin().await? };
        Ok((tx, false))
    }

    /// Commits the session's transaction.
    pub async fn commit(&self, session: &mut Session) -> Result<(), AqError> {
        if session.held.is_active() {
            let Some(mut tx) = session.held.take() else { return Err(held_lost_error()) };
            self.tally(&mut *tx, session).await?;
            self.commit_tx(tx).await?;
            // What the batch's send left uncommitted is visible now.
            let sent = session.held.sent();
            session.held.end();
            session.end_transaction();
            for q in sent {
                self.wake(q);
            }
            return Ok(());
        }
        let mut next = session.state();
        next.end_transaction();
        if !session.pending && !self.sealed(session) {
            session.end_transaction();
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        let version = self.seal(&mut *tx, session, &next, Some(&Response::Commit(StatusResponse::ok()))).await?;
        let woken = if session.pending {
            publish(&mut *tx, &self.resolved(), session, session.dequeued).await?
        } else {
            Vec::new()
        };
        self.tally(&mut *tx, session).await?;
        self.commit_tx(tx).await?;
        let visible = self.staged.commit(&session.txn, session.enqueued, session.dequeued, &woken, None);
        self.settle(session, next, version);
        self.wake_visible(visible);
        Ok(())
    }

    /// Rolls back the session's transaction. Dequeues that fail too often move their
    /// message to the exception queue (on a multi-consumer queue, once no consumer can
    /// take it any more).
    pub async fn rollback(&self, resolved: &Resolved, session: &mut Session) -> Result<(), AqError> {
        session.tally = None;
        if session.held.is_active() {
            // Nothing of a held transaction is in the database until it commits.
            let (tx, queue) = session.held.end();
            session.end_transaction();
            if let Some(tx) = tx
                && let Err(e) = tx.rollback().await
            {
                // The connection goes, and its transaction with it.
                tracing::warn!(error = %e, "rolling back a propagation batch's transaction");
            }
            if let Some(q) = queue {
                self.wake(q);
            }
            return Ok(());
        }
        let mut next = session.state();
        next.end_transaction();
        if !session.pending && !self.sealed(session) {
            session.end_transaction();
            return Ok(());
        }
        let mut tx = self.store.begin().await?;
        // A propagation job rolls back when its destination failed, not the message: that
        // does not count against the message (it stays in the source until it moves).
        let counts = !session.propagates;
        let woken = if session.pending {
            rollback_work(&mut *tx, resolved, &session.txn, counts, self.now()).await?
        } else {
            Vec::new()
        };
        let version = self.seal(&mut *tx, session, &next, Some(&Response::Rollback(StatusResponse::ok()))).await?;
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(())
    }
}

/// Discards the transaction `txn`'s work inside `tx`: its enqueues go, its dequeues are
/// released (with `counts`, their retry count goes up, and a queue's `retry_delay` makes
/// the message wait that long, from `now`); messages rolled back too often move to their
/// exception queue. Returns the queues whose messages came back.
pub(super) async fn rollback_work(
    tx: &mut dyn StoreTx,
    resolved: &Resolved,
    txn: &str,
    counts: bool,
    now: Micros,
) -> Result<Vec<QueueId>, AqError> {
    let released = tx.rollback_session(txn, counts).await?;
    let queue_of = |id: &QueueId| resolved.names.get(id).and_then(|n| resolved.catalog.queues.get(n));
    if released.iter().any(|r| queue_of(&r.queue).is_some_and(|q| q.keeps_history())) {
        // The removes did not happen: neither did the dequeues the history recorded.
        tx.forget_dequeues(txn).await?;
    }
    let mut woken = Vec::new();
    for r in released {
        woken.push(r.queue);
        let Some(q) = resolved.names.get(&r.queue).and_then(|n| resolved.catalog.queues.get(n)) else {
            continue;
        };
        if q.is_exception_queue {
            continue;
        }
        if r.retry_count <= q.max_retries {
            if counts && q.retry_delay > 0 {
                let until = now.saturating_add(q.retry_delay.saturating_mul(crate::clock::MICROS_PER_SEC));
                tx.delay_message(r.seq, until).await?;
            }
            continue;
        }
        let Some((eq, forget)) = exception_target(resolved, q, r.exception_queue.as_deref(), r.seq) else {
            continue;
        };
        // A multi-consumer message moves once none of its consumers can take it any more
        // (as Oracle does); a consumer that gave up no longer sees it, and if others still
        // can, the remove of the last of them moves it (`move_stranded`).
        if !q.multi_consumer || tx.give_up(r.seq, &r.consumer).await? == 0 {
            tx.move_to_exception(r.seq, eq, forget, Expiry::MaxRetries).await?;
            woken.push(eq);
        }
    }
    Ok(woken)
}

/// Moves messages that a remove of this transaction left to consumers that gave up on them
/// only ([`Stranded`]) to their exception queue, inside `tx`. Returns the exception queues.
pub(super) async fn move_stranded(
    tx: &mut dyn StoreTx,
    resolved: &Resolved,
    stranded: &[Stranded],
) -> Result<Vec<QueueId>, AqError> {
    let mut moved = Vec::new();
    for s in stranded {
        let q = resolved.names.get(&s.queue).and_then(|n| resolved.catalog.queues.get(n));
        let Some((eq, forget)) = q.and_then(|q| exception_target(resolved, q, s.exception_queue.as_deref(), s.seq))
        else {
            // Its queue left the topology: it stays, as that queue's other messages do.
            tracing::warn!(seq = s.seq, "a message no consumer can take has no exception queue; left in place");
            continue;
        };
        tx.move_to_exception(s.seq, eq, forget, Expiry::MaxRetries).await?;
        moved.push(eq);
    }
    Ok(moved)
}

/// The fault for a request that found its session changed by another request meanwhile.
pub(super) fn session_busy_error() -> AqError {
    AqError::client(
        code::SESSION_BUSY,
        "another request with the same session cookie ran at the same time; nothing of this one was performed, send it again",
    )
}

/// The fault for a request of a session that timed out (its work was rolled back).
pub fn session_expired_error() -> AqError {
    AqError::client(
        code::SESSION_EXPIRED,
        "the session timed out and its uncommitted work was rolled back; start the transaction again without the session cookie",
    )
}

/// 25402 for a session whose open transaction may have lost writes.
pub(super) fn transaction_lost_error() -> AqError {
    AqError::server(
        code::TRANSACTION_LOST,
        "transaction must roll back: the database restarted since this transaction's work was written, \
         and some of it may be lost; nothing was committed",
    )
}

/// 25402 for a request of a propagation batch whose held database transaction a failed
/// request already rolled back (see `HeldTx`).
fn held_lost_error() -> AqError {
    AqError::server(
        code::TRANSACTION_LOST,
        "transaction must roll back: a request of it failed after writing, and its database transaction \
         was rolled back; nothing was committed",
    )
}

/// Publishes the session's transaction inside `tx` (`StoreTx::commit_session`); returns
/// the queues that got new visible messages. Refuses, leaving `tx` to be rolled back, if
/// the store does not hold exactly the messages the transaction enqueued: provisional
/// writes lost with a database crash (`Store::begin_provisional`), or a send whose
/// commit failed with an unknown outcome. As in Oracle (ORA-25402), the client then has
/// to roll the transaction back.
pub(super) async fn publish(
    tx: &mut dyn StoreTx,
    resolved: &Resolved,
    session: &Session,
    dequeues: bool,
) -> Result<Vec<QueueId>, AqError> {
    if !session.intact {
        tracing::warn!("the database restarted since a write of a session's transaction; its commit is refused");
        return Err(transaction_lost_error());
    }
    let outcome = tx.commit_session(&session.txn, dequeues).await?;
    if outcome.published != session.enqueued {
        tracing::warn!(
            enqueued = session.enqueued,
            found = outcome.published,
            "a session's uncommitted messages were lost by the store; its commit is refused"
        );
        return Err(AqError::server(
            code::TRANSACTION_LOST,
            format!(
                "transaction must roll back: the store holds {} of the {} message(s) it enqueued \
                 (the database restarted since, or a write's outcome was unknown); nothing was committed",
                outcome.published, session.enqueued
            ),
        ));
    }
    let mut woken = outcome.enqueued_queues;
    woken.extend(move_stranded(tx, resolved, &outcome.stranded).await?);
    Ok(woken)
}
