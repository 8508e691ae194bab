//! A local job's batches (queue → queue in this store). A batch is one receive of up to
//! `batch_size` messages and one send of their copies, committed together (see the parent
//! module). One worker moves its batches one after the other, in the source's order; on
//! PostgreSQL, where a batch is one held database transaction, it overlaps them: one
//! batch's commit goes on while the next is received and sent, which commits only after it
//! (`step`).

use std::sync::Mutex;

use aqgate_core::engine::{Engine, JobTally, Session};
use aqgate_core::error::{AqError, code};
use aqgate_core::propagation::PropagationInfo;
use aqgate_proto::idap::{Message, Request};
use tokio::sync::watch;

use crate::{Moved, Stats, carried_send, excepted, forward, permanent, received_batch, refusal, retrying, rolled_back};

/// A local job's worker, until `stop` (see `step`); a batch still in flight then is landed
/// (committed, or rolled back).
pub(crate) async fn local_loop(
    engine: &Engine,
    job: &PropagationInfo,
    stats: &Stats,
    stop: &mut watch::Receiver<bool>,
) {
    // The batch sent whose commit is still to come. A mutex only so that the worker stays
    // `Send`: each step takes it out and puts the next one back, never holding the lock.
    let flight: Mutex<Option<Box<Flight>>> = Mutex::new(None);
    retrying(engine, job, stats, stop, job.batch_size, |one_by_one| step(engine, job, &flight, one_by_one, stats))
        .await;
    if let Some(f) = taken(&flight) {
        let _ = land(engine, job, f, stats).await;
    }
}

fn taken(flight: &Mutex<Option<Box<Flight>>>) -> Option<Box<Flight>> {
    flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
}

fn put(flight: &Mutex<Option<Box<Flight>>>, f: Box<Flight>) {
    *flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(f);
}

/// A batch received and its copies sent in its held transaction, not committed yet.
struct Flight {
    session: Session,
    n: usize,
}

/// What receiving and sending a batch came to: sent, to land; or nothing to move
/// (`Done(0)`), or refused (rolled back, to go one by one).
type Prepared = crate::Prepared<Flight>;

/// One step of a local job. Where batches overlap (`overlaps`), with no batch in flight: a
/// batch received (waiting for one) and sent without commit, left in flight. With a batch in
/// flight: its commit executed while the next batch is received (taking only what is there:
/// the rows the batch in flight removed are locked by its transaction until it ends, so the
/// receive skips them and takes the messages after them) and sent, which is then the one in
/// flight. A batch commits only after the one before it has, so the destination keeps the
/// source's order; when a commit fails, the batch after it is rolled back (its messages go
/// again, after the failed batch's). One by one (after a refusal), with a schedule's latency,
/// on SQLite, or when stopping, batches go one at a time as `move_batch` moves them, the
/// batch in flight landed first.
async fn step(
    engine: &Engine,
    job: &PropagationInfo,
    flight: &Mutex<Option<Box<Flight>>>,
    alone: bool,
    stats: &Stats,
) -> Result<Moved, AqError> {
    let overlap = !alone && overlaps(engine, job) && !*stats.stop.borrow();
    let Some(current) = taken(flight) else {
        if !overlap {
            let batch = if alone { 1 } else { job.batch_size };
            return move_batch(engine, job, batch, alone, stats).await;
        }
        return match prepare(engine, job, true, stats).await? {
            Prepared::Flight(f) => {
                put(flight, f);
                Ok(Moved::Done(0))
            }
            Prepared::Moved(m) => Ok(m),
        };
    };
    if !overlap {
        return land(engine, job, current, stats).await.map(Moved::Done);
    }
    let (landed, next) = tokio::join!(land(engine, job, current, stats), prepare(engine, job, false, stats));
    match (landed, next) {
        (Ok(n), Ok(Prepared::Flight(f))) => {
            put(flight, f);
            Ok(Moved::Done(n))
        }
        (Ok(n), Ok(Prepared::Moved(Moved::Done(m)))) => Ok(Moved::Done(n + m)),
        (Ok(_), Ok(Prepared::Moved(Moved::Refused))) => Ok(Moved::Refused),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), next) => {
            // The batch before it did not commit: this one is rolled back too (its messages
            // go again after the failed batch's), so the order holds.
            if let Ok(Prepared::Flight(mut f)) = next {
                let why = AqError::server(code::INTERNAL, "the batch before it did not commit".to_string());
                let _ = rolled_back(engine, &mut f.session, why).await;
            }
            Err(e)
        }
    }
}

/// Whether the job's batches overlap (see `step`): where a batch is one held database
/// transaction (`Store::holds_transactions`), for a job of one worker (several workers
/// overlap their batches already) without a schedule's latency (with one, it waits between
/// looks, and batches stay one at a time).
fn overlaps(engine: &Engine, job: &PropagationInfo) -> bool {
    job.schedule.latency == 0 && job.concurrency == 1 && engine.store().holds_transactions()
}

/// Receives a batch (waiting for its first message with `wait`, else taking only what is
/// there, after a batch in flight) and sends its copies without commit. A batch first in
/// line whose receive is not held (a source whose batches are not one transaction: its
/// messages locked and the locks committed) gains nothing in flight: it is sent with
/// commit. A refused send is rolled back (`Refused`).
async fn prepare(engine: &Engine, job: &PropagationInfo, wait: bool, stats: &Stats) -> Result<Prepared, AqError> {
    let mut session = batch_session(engine, job, job.batch_size);
    let messages = received_batch(engine, &mut session, job, wait, stats).await?;
    if messages.is_empty() {
        return Ok(Prepared::Moved(Moved::Done(0)));
    }
    let n = messages.len();
    let out: Vec<Message> = messages.iter().enumerate().map(|(i, m)| forward(job, m, i)).collect();
    let commit = wait && !session.held.is_active();
    if commit {
        session.tally = Some(JobTally::moved(&job.name, n));
    }
    // The copies keep their times: original enqueue time, delay end, expiry.
    let times = std::mem::take(&mut session.received);
    let to = (job.destination.as_str(), job.transformation.clone());
    match crate::carried(engine, &mut session, to, out, times, commit).await {
        Ok(_) if commit => {
            stats.moved(n, engine.now());
            Ok(Prepared::Moved(Moved::Done(n)))
        }
        Ok(_) => Ok(Prepared::Flight(Box::new(Flight { session, n }))),
        Err(e) if permanent(&e) => {
            let _ = rolled_back(engine, &mut session, e).await;
            Ok(Prepared::Moved(Moved::Refused))
        }
        Err(e) => Err(rolled_back(engine, &mut session, e).await),
    }
}

/// Commits a batch in flight, its job's counts in the same commit; a failed commit is
/// rolled back. The messages moved.
async fn land(engine: &Engine, job: &PropagationInfo, f: Box<Flight>, stats: &Stats) -> Result<usize, AqError> {
    let Flight { mut session, n } = *f;
    session.tally = Some(JobTally::moved(&job.name, n));
    if let Err(e) = engine.execute(&mut session, Request::Commit).await {
        return Err(rolled_back(engine, &mut session, e).await);
    }
    stats.moved(n, engine.now());
    Ok(n)
}

/// A batch's session: the job's agent, taking up to `batch` messages in one receive, the
/// receive and the send one database transaction where the store can (PostgreSQL) and the
/// source allows (single consumer, no history).
fn batch_session(engine: &Engine, job: &PropagationInfo, batch: u32) -> Session {
    let mut session = Session::new(&job.agent, engine.now());
    session.propagates = true;
    session.max_messages = batch;
    session.one_transaction = true;
    session
}

/// One batch, on its own: received (waiting for the first message), sent with commit. A
/// refused batch is rolled back to go one by one; a refused message alone goes to the job's
/// exception queue, if it has one.
pub(crate) async fn move_batch(
    engine: &Engine,
    job: &PropagationInfo,
    batch: u32,
    alone: bool,
    stats: &Stats,
) -> Result<Moved, AqError> {
    let mut session = batch_session(engine, job, batch);
    let messages = received_batch(engine, &mut session, job, true, stats).await?;
    if messages.is_empty() {
        return Ok(Moved::Done(0));
    }
    let n = messages.len();
    let out: Vec<Message> = messages.iter().enumerate().map(|(i, m)| forward(job, m, i)).collect();
    // The copies keep their times: original enqueue time, delay end, expiry.
    let times = std::mem::take(&mut session.received);
    session.tally = Some(JobTally::moved(&job.name, n));
    let sent =
        carried_send(engine, &mut session, &job.destination, job.transformation.clone(), out.clone(), times.clone());
    match sent.await {
        Ok(_) => {
            stats.moved(n, engine.now());
            Ok(Moved::Done(n))
        }
        Err(e) if permanent(&e) && !alone => {
            let _ = rolled_back(engine, &mut session, e).await;
            Ok(Moved::Refused)
        }
        Err(e) if permanent(&e) && job.exception_queue.is_some() => {
            let eq = job.exception_queue.clone().unwrap_or_default();
            let ids: Vec<String> = messages.iter().filter_map(|m| m.header.message_id.clone()).collect();
            // The exception queue has the source's type: the message as it was, untransformed.
            session.tally = Some(JobTally::excepted(&job.name, n));
            match carried_send(engine, &mut session, &eq, None, out, excepted(times, refusal(&e))).await {
                Ok(_) => {
                    stats.excepted(n, engine.now());
                    tracing::warn!(job = %job.name, messages = ?ids, exception_queue = %eq, reason = %e.message,
                        "the destination refused a message for good; moved to the exception queue");
                    Ok(Moved::Done(n))
                }
                Err(e2) => Err(rolled_back(engine, &mut session, e2).await),
            }
        }
        Err(e) => Err(rolled_back(engine, &mut session, e).await),
    }
}
