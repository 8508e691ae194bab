//! Batches whose end the database does not know: a batch that failed and whose rollback
//! failed too (the database away, or the rollback's answer lost), or whose receive failed
//! at a commit that may have gone through (locking its messages under a session the batch
//! does not know it has). Left alone, their messages stay locked until the session
//! timeout (300 s by default). [`rolled_back`] keeps such a batch's session id here, and the
//! job's next batch first ends it ([`end`]): the session as the store has it now is rolled
//! back, or let go when the store no longer holds it. A rolled-back gateway batch keeps its
//! doubt records (they end only in its dequeue's commit), so what it published is marked
//! when it goes again. A leaf module: the batch code names it, and it names none of it.

use aqgate_core::clock::Micros;
use aqgate_core::engine::{Engine, Resumed, Session};
use aqgate_core::error::{AqError, code};
use aqgate_proto::idap::Request;

/// Rolls the batch back (its messages stay in the source) and hands `e` on. A batch whose
/// end is not known to the database — its rollback failed (the database away, or its answer
/// lost), or its receive failed at a commit that may have gone through, leaving messages
/// locked by a session the batch does not know it has — is kept (`UNENDED`) and ended
/// before the job's next batch (`waiting_receive`), rather than at the session timeout.
pub(crate) async fn rolled_back(engine: &Engine, session: &mut Session, e: AqError) -> AqError {
    // A gateway batch's doubts end with its dequeue only: rolled back, they stay.
    session.settled.clear();
    let unknown = if session.pending {
        match engine.execute(session, Request::Rollback).await {
            Ok(_) => false,
            Err(r) if ended_elsewhere(&r) => {
                tracing::debug!(error = %r.message, "propagation batch already ended");
                false
            }
            Err(r) => {
                tracing::warn!(error = %r.message, "propagation batch rollback failed; trying again before the next batch");
                true
            }
        }
    } else {
        // A commit whose answer was lost (`code::INTERNAL`) may have stored the session.
        e.code == code::INTERNAL && session.stored.is_none()
    };
    if unknown {
        let now = engine.now();
        let timeout = session_timeout(engine);
        let mut all = unended();
        // Those of jobs that took no batch since are the session timeout's by now.
        all.retain(|u| now.saturating_sub(u.since) <= timeout);
        all.push(Unended {
            id: session.id.clone(),
            agent: session.agent.clone(),
            propagates: session.propagates,
            since: now,
        });
    }
    e
}

/// A batch whose end is not known to the database: its session's id, and since when.
struct Unended {
    id: String,
    agent: String,
    /// As the batch's session was (see `Session::propagates`).
    propagates: bool,
    since: Micros,
}

/// The batches whose end is not known to the database, to be ended by their job's next
/// batch. Process-wide, as the store's health is: one process serves one database.
static UNENDED: std::sync::Mutex<Vec<Unended>> = std::sync::Mutex::new(Vec::new());

fn unended() -> std::sync::MutexGuard<'static, Vec<Unended>> {
    UNENDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn session_timeout(engine: &Engine) -> Micros {
    i64::try_from(engine.config().session_timeout.as_micros()).unwrap_or(i64::MAX)
}

/// Whether a rollback failed because the session is no longer there to roll back: another
/// process ended it (the session timeout, a new holder of the job's lease), or its commit
/// had gone through after all.
fn ended_elsewhere(e: &AqError) -> bool {
    e.code == code::SESSION_EXPIRED || e.code == code::SESSION_BUSY
}

/// Ends the batches of `agent` whose end is not known to the database (see
/// [`rolled_back`]): each session as the store has it now is rolled back, so that its
/// messages are free before the job takes its next batch; one the store does not hold (its
/// commit failed before it, or another process ended it) is let go. `Err` while the
/// database is still away: the batch fails with it, and the job waits for the database. A
/// batch past the session timeout is left to the timeout (which has ended it); one that
/// fails otherwise is tried again by the next batch.
pub(crate) async fn end(engine: &Engine, agent: &str) -> Result<(), AqError> {
    let mine: Vec<Unended> = {
        let mut all = unended();
        if !all.iter().any(|u| u.agent == agent) {
            return Ok(());
        }
        let (mine, others) = std::mem::take(&mut *all).into_iter().partition(|u| u.agent == agent);
        *all = others;
        mine
    };
    let timeout = session_timeout(engine);
    let mut away = None;
    let mut kept = Vec::new();
    for u in mine {
        let ended = match engine.resume(&u.id).await {
            Ok(Resumed::Live(mut s)) => {
                s.propagates = u.propagates;
                engine.execute(&mut s, Request::Rollback).await.map(|_| true)
            }
            Ok(_) => Ok(false),
            Err(e) => Err(e),
        };
        match ended {
            Ok(true) => tracing::info!(agent, "rolled back a propagation batch whose end had failed"),
            Ok(false) => tracing::debug!(agent, "a propagation batch whose end had failed is not stored"),
            Err(e) if ended_elsewhere(&e) => {
                tracing::debug!(agent, error = %e.message, "propagation batch already ended")
            }
            Err(e) if engine.now().saturating_sub(u.since) > timeout => {
                tracing::debug!(agent, error = %e.message, "propagation batch left to the session timeout");
            }
            Err(e) => {
                if e.code == code::STORE_UNAVAILABLE {
                    away.get_or_insert(e);
                } else {
                    tracing::warn!(agent, error = %e.message, "ending a propagation batch failed again");
                }
                kept.push(u);
            }
        }
    }
    unended().extend(kept);
    away.map_or(Ok(()), Err)
}
