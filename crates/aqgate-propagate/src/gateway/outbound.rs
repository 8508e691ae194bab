//! An outbound gateway job (AQ → broker) at work: batches received, recorded in doubt,
//! published, confirmed and committed, up to the job's `batches_in_flight` of them
//! overlapping where the store allows it (see the parent module for the whole of it,
//! `step` and `window`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aqgate_core::clock::Micros;
use aqgate_core::engine::{Engine, JobTally, Session};
use aqgate_core::error::{AqError, code};
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::store::Expiry;
use aqgate_core::topology::gateway::GatewayRoute;
use aqgate_proto::idap::{Message, Request};
use tokio::sync::Notify;

use super::convert::{self, Outgoing};
use super::{Board, Confirming, Fail, Pacing, Published, Sink, connected, purge_doubts, sink};
use crate::{Moved, Stats, carried_send, excepted, received_batch, rolled_back};

/// An outbound job's worker, while this process holds its lease: until `stats.stop`.
pub(super) async fn outbound(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    stats: &Stats,
    board: &Board,
) {
    let mut pacing = Pacing::new(job);
    let mut conn: Option<Box<dyn Sink>> = None;
    let mut purged: Option<std::time::Instant> = None;
    while !*stats.stop.borrow() {
        if purged.is_none_or(|t| t.elapsed() >= PURGE_EVERY) {
            purge_doubts(engine, job).await;
            purged = Some(std::time::Instant::now());
        }
        if conn.as_ref().is_some_and(|c| c.stale()) {
            // Another job found the shared connection down: connect again with them (a step
            // has landed or failed every batch it published on it).
            conn = None;
            board.report(engine, &route.link.name, &job.name, Err("the shared connection went")).await;
        }
        if conn.is_none() {
            conn = connected(
                engine,
                job,
                route,
                stats,
                board,
                &mut pacing,
                sink(board, &route.link, &route.foreign, &job.name).await,
            )
            .await;
        }
        let Some(s) = conn.as_mut() else { continue };
        board.alive(engine, &route.link.name).await;
        match step(engine, job, route, s.as_mut(), pacing.alone(), stats).await {
            Ok(Moved::Done(n)) => {
                pacing.done(job, stats);
                pacing.latency(job, n, &stats.stop).await;
            }
            Ok(Moved::Refused) => pacing.refused(job),
            Err(e) => {
                if let Fail::Link(why) = &e {
                    if let Some(c) = conn.take() {
                        c.failed();
                    }
                    board.report(engine, &route.link.name, &job.name, Err(why)).await;
                }
                pacing.failed(engine, job, (&route.link, board), stats, &e).await;
            }
        }
    }
    // Let go of the connection first: the link's row counts what stays open.
    if conn.take().is_some() {
        board.closed(engine, &route.link.name, &job.name).await;
    }
    pacing.end(stats);
}

/// How often an outbound job forgets its stale doubts (besides when it starts).
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// A batch received, recorded in doubt and published: its confirmations and its commit
/// are still to come (`land`).
struct Flight {
    session: Session,
    messages: Vec<Message>,
    times: Vec<aqgate_core::engine::Carried>,
    /// The ids of the messages published, each with whether it went again after a doubt
    /// (those in doubt that were found at the broker are not published again).
    published: Vec<(String, bool)>,
    /// In doubt and found at the broker.
    there: usize,
    alone: bool,
    confirming: Confirming,
}

/// What receiving a batch came to: published, to land; or nothing to publish (`Done(0)`),
/// or finished already: its messages to the exception queue, or refused (rolled back, to go
/// one by one).
type Prepared = crate::Prepared<Flight>;

/// One step of an outbound job: a batch received (waiting for one), recorded in doubt and
/// published; then, where batches overlap (`overlaps`, and not one by one), the window
/// (`window`) lands it while the batches behind it go, else it is landed (its
/// confirmations awaited, its dequeue committed).
async fn step(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    sink: &mut dyn Sink,
    alone: bool,
    stats: &Stats,
) -> Result<Moved, Fail> {
    let depth = if alone || !overlaps(engine, job) { 1 } else { route.batches_in_flight.max(1) as usize };
    match prepare(engine, job, route, sink, alone, true, stats).await? {
        Prepared::Flight(f) if depth > 1 => window(engine, job, route, sink, f, depth, stats).await,
        Prepared::Flight(f) => land(engine, job, f, stats).await,
        Prepared::Moved(m) => Ok(m),
    }
}

/// How long a window goes on before the job's loop looks around (the link's row, a stale
/// connection, the stale doubts, the pacing): every batch it published has landed by then.
const WINDOW_TURN: Duration = Duration::from_secs(2);

/// The batches of a backlog, `first` (published) ahead, with up to `depth` batches taken
/// and not yet landed at once. `fill` receives the next batch whenever the window has room,
/// taking only what is there (an empty receive ends it: the next step waits for messages),
/// and records in doubt and publishes each batch while it receives the one after; `drain`
/// lands the batches one after the other in the order they were received, so each commits
/// only after its own confirmations and after the batch before it, while the broker
/// confirms the later ones and the database receives and records them. A batch that fails
/// to land (or is refused) takes every batch published behind it back: rolled back, their
/// messages stay in doubt and go again marked. It ends with every batch landed or rolled
/// back: when the source has no more, the job stops, the connection goes stale, a step
/// fails, or after `WINDOW_TURN`. At most `depth` batches are held, so `depth` ×
/// `batch_size` messages.
async fn window(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    sink: &mut dyn Sink,
    first: Box<Flight>,
    depth: usize,
    stats: &Stats,
) -> Result<Moved, Fail> {
    // Both halves run in this task (`join!`); the queue's lock is never held across an await.
    let queue = Mutex::new(VecDeque::from([first]));
    let lock = || queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let landing = AtomicBool::new(false);
    // A batch did not land: nothing more is published.
    let broken = AtomicBool::new(false);
    let filling = AtomicBool::new(true);
    let (pushed, room) = (Notify::new(), Notify::new());
    let turn = std::time::Instant::now() + WINDOW_TURN;
    let fill = async {
        // A batch received and not yet published: published while the next is received.
        let mut taken: Option<Box<Batch>> = None;
        let held = |own: usize| lock().len() + usize::from(landing.load(Ordering::SeqCst)) + own;
        let mut out = Ok(Moved::Done(0));
        while !broken.load(Ordering::SeqCst) && !*stats.stop.borrow() && !sink.stale() {
            let more = std::time::Instant::now() < turn;
            let Some(t) = taken.take() else {
                if !more {
                    break;
                }
                if held(0) >= depth {
                    room.notified().await;
                    continue;
                }
                match take(engine, job, route, false, false, stats).await {
                    Ok(Taken::Batch(t)) => taken = Some(t),
                    Ok(Taken::Moved(m)) => out = Ok(m),
                    Err(e) => out = Err(e),
                }
                if taken.is_none() {
                    break;
                }
                continue;
            };
            let more = more && held(1) < depth;
            let (sent, next) = tokio::join!(send(engine, job, sink, t), async {
                if more { Some(take(engine, job, route, false, false, stats).await) } else { None }
            });
            let sent = sent.map(|f| {
                lock().push_back(f);
                pushed.notify_one();
            });
            match (sent, next) {
                (Ok(()), None) => {}
                (Ok(()), Some(Ok(Taken::Batch(t)))) => taken = Some(t),
                (Ok(()), Some(Ok(Taken::Moved(m)))) => {
                    out = Ok(m);
                    break;
                }
                (Ok(()), Some(Err(e))) => {
                    out = Err(e);
                    break;
                }
                (Err(e), next) => {
                    if let Some(Ok(Taken::Batch(t))) = next {
                        taken = Some(t);
                    }
                    out = Err(e);
                    break;
                }
            }
        }
        if let Some(mut t) = taken {
            // Received and not published (nothing of it recorded in doubt): it goes back.
            let why = AqError::server(code::INTERNAL, "the window ended before it was published".to_string());
            let _ = rolled_back(engine, &mut t.session, why).await;
        }
        filling.store(false, Ordering::SeqCst);
        pushed.notify_one();
        out
    };
    let drain = async {
        let mut n = 0;
        loop {
            let next = lock().pop_front();
            let Some(f) = next else {
                if !filling.load(Ordering::SeqCst) {
                    return Ok(Moved::Done(n));
                }
                pushed.notified().await;
                continue;
            };
            landing.store(true, Ordering::SeqCst);
            let landed = land(engine, job, f, stats).await;
            landing.store(false, Ordering::SeqCst);
            match landed {
                Ok(Moved::Done(m)) => n += m,
                other => {
                    broken.store(true, Ordering::SeqCst);
                    room.notify_one();
                    return other;
                }
            }
            room.notify_one();
        }
    };
    let (filled, drained) = tokio::join!(fill, drain);
    let behind = std::mem::take(&mut *lock());
    for mut f in behind {
        // Published behind a batch that did not land.
        let why = AqError::server(code::INTERNAL, "a batch before it did not land".to_string());
        let _ = rolled_back(engine, &mut f.session, why).await;
    }
    match (drained, filled) {
        (Ok(Moved::Done(n)), Ok(Moved::Done(m))) => Ok(Moved::Done(n + m)),
        // Every batch published landed; the one after them was refused or failed.
        (Ok(Moved::Done(_)), filled) => filled,
        (failed, _) => failed,
    }
}

/// Whether the job's batches overlap (see `step`): where the store lets several transactions
/// of the job be open at once (`Store::holds_transactions`) and the job has no schedule
/// latency (with one, it waits between looks, and batches stay one at a time).
fn overlaps(engine: &Engine, job: &PropagationInfo) -> bool {
    job.schedule.latency == 0 && engine.store().holds_transactions()
}

/// Receives a batch (one message with `alone`; waiting for the first with `wait`, else
/// taking only what is there), records it in doubt and publishes it.
async fn prepare(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    sink: &mut dyn Sink,
    alone: bool,
    wait: bool,
    stats: &Stats,
) -> Result<Prepared, Fail> {
    match take(engine, job, route, alone, wait, stats).await? {
        Taken::Batch(t) => send(engine, job, sink, t).await.map(Prepared::Flight),
        Taken::Moved(m) => Ok(Prepared::Moved(m)),
    }
}

/// A batch received and converted, its messages in doubt read: to record in doubt and
/// publish (`send`).
struct Batch {
    session: Session,
    messages: Vec<Message>,
    times: Vec<aqgate_core::engine::Carried>,
    out: Vec<Outgoing>,
    doubts: HashMap<String, Micros>,
    alone: bool,
    now: Micros,
}

/// What receiving a batch came to, before its publish.
enum Taken {
    Batch(Box<Batch>),
    Moved(Moved),
}

/// Receives a batch (see `prepare`), converts its messages and reads the job's messages
/// in doubt; a message that does not convert refuses the batch (`refuse`).
async fn take(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    alone: bool,
    wait: bool,
    stats: &Stats,
) -> Result<Taken, Fail> {
    let mut session = Session::new(&job.agent, engine.now());
    session.propagates = true;
    session.ready_only = true;
    session.max_messages = if alone { 1 } else { job.batch_size };
    let messages = received_batch(engine, &mut session, job, wait, stats).await.map_err(Fail::Aq)?;
    if messages.is_empty() {
        return Ok(Taken::Moved(Moved::Done(0)));
    }
    // The job's messages in doubt, read for each batch: a holder that lost its lease may
    // have recorded some while this one took over.
    let doubts: HashMap<String, Micros> = match engine.store().gateway_doubts(&job.agent).await {
        Ok(rows) => rows.into_iter().collect(),
        Err(e) => return Err(Fail::Aq(rolled_back(engine, &mut session, e.into()).await)),
    };
    let now = engine.now();
    let times = std::mem::take(&mut session.received);
    let transformation = match &job.transformation {
        Some(name) => engine.resolved().catalog.transformation(name).cloned(),
        None => None,
    };
    let mut out = Vec::with_capacity(messages.len());
    let mode = convert::Mode::of(&route.options, &route.link.name);
    let mut refused: Vec<(usize, String)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let id = m.header.message_id.clone().unwrap_or_default();
        // The job's transformation, applied here (a failure sends the original to the
        // exception queue, as any message that cannot go).
        let body = match &transformation {
            Some(t) => transform(engine, t, m)
                .and_then(|payload| convert::body_of(&route.payload, &Message { payload, ..m.clone() })),
            None => convert::body_of(&route.payload, m),
        };
        match body {
            Ok((body, content_type, props)) => out.push(Outgoing {
                redelivered: doubts.contains_key(&id),
                id,
                body,
                content_type,
                correlation: m.header.correlation.clone(),
                priority: m.header.priority.unwrap_or(1),
                expiration_ms: times
                    .get(i)
                    .and_then(|t| t.expire_at)
                    .map(|t| u64::try_from((t - now).max(1) / 1000).unwrap_or(1).max(1)),
                queue: job.source.clone(),
                props,
                mode: mode.clone(),
            }),
            Err(why) => refused.push((i, format!("message {id} does not convert: {why}"))),
        }
    }
    if !refused.is_empty() {
        return refuse(engine, job, &mut session, &messages, times, alone, refused, stats).await.map(Taken::Moved);
    }
    Ok(Taken::Batch(Box::new(Batch { session, messages, times, out, doubts, alone, now })))
}

/// Records a batch taken in doubt (those not in doubt already) and publishes it; a message
/// in doubt that the broker is found to hold is not published again.
async fn send(
    engine: &Engine,
    job: &PropagationInfo,
    sink: &mut dyn Sink,
    batch: Box<Batch>,
) -> Result<Box<Flight>, Fail> {
    let Batch { mut session, messages, times, out, doubts, alone, now } = *batch;
    // In doubt since an earlier attempt: past NATS's duplicate window, ask the stream.
    let mut publish = Vec::with_capacity(out.len());
    let mut there = 0;
    for o in out {
        if let Some(&since) = doubts.get(&o.id) {
            match sink.at_broker(&o.id, since, engine.now()).await {
                Ok(Some(true)) => {
                    tracing::info!(job = %job.name, message = %o.id, "in doubt, found at the broker: not published again");
                    there += 1;
                    continue;
                }
                Ok(_) => {}
                Err(e) => return Err(Fail::Link(rolled_back_text(engine, &mut session, e).await)),
            }
        }
        publish.push(o);
    }
    let fresh: Vec<String> = publish.iter().filter(|o| !o.redelivered).map(|o| o.id.clone()).collect();
    if let Err(e) = engine.store().gateway_doubt_put(&job.agent, &fresh, now).await {
        return Err(Fail::Aq(rolled_back(engine, &mut session, e.into()).await));
    }
    let confirming = match sink.publish(&publish).await {
        Ok(c) => c,
        Err(e) => return Err(Fail::Link(rolled_back_text(engine, &mut session, e).await)),
    };
    let published = publish.into_iter().map(|o| (o.id, o.redelivered)).collect();
    Ok(Box::new(Flight { session, messages, times, published, there, alone, confirming }))
}

/// Lands a batch published: awaits its confirmations and commits its dequeue, the doubt
/// cleared in the same transaction (a message refused: the batch rolled back to go one by
/// one, or alone to the exception queue).
async fn land(engine: &Engine, job: &PropagationInfo, f: Box<Flight>, stats: &Stats) -> Result<Moved, Fail> {
    let Flight { mut session, messages, times, published, there, alone, confirming } = *f;
    let results = match confirming.await {
        Ok(r) => r,
        Err(e) => return Err(Fail::Link(rolled_back_text(engine, &mut session, e).await)),
    };
    let mut bad = Vec::new();
    for ((id, _), r) in published.iter().zip(&results) {
        if let Published::Refused(why) = r {
            let i = messages.iter().position(|m| m.header.message_id.as_deref() == Some(id)).unwrap_or(0);
            bad.push((i, format!("message {id}: {why}")));
        }
    }
    let redelivered = published.iter().filter(|(_, again)| *again).count();
    if !bad.is_empty() {
        return refuse(engine, job, &mut session, &messages, times, alone, bad, stats).await;
    }
    // The doubt goes with the dequeue, in its transaction.
    let ids: Vec<String> = messages.iter().filter_map(|m| m.header.message_id.clone()).collect();
    session.settled = ids.clone();
    session.tally = Some(JobTally::moved(&job.name, messages.len()));
    let committed = engine.execute(&mut session, Request::Commit).await;
    session.settled.clear();
    if let Err(e) = committed {
        return Err(Fail::Aq(rolled_back(engine, &mut session, e).await));
    }
    let n = messages.len();
    stats.moved(n, engine.now());
    if redelivered > 0 {
        stats.counters.in_doubt.add(redelivered as u64);
        tracing::warn!(job = %job.name, messages = redelivered, "published again after a doubt (marked x-aqgate-redelivered)");
    }
    if there > 0 {
        tracing::debug!(job = %job.name, messages = there, "in doubt and found at the broker");
    }
    Ok(Moved::Done(n))
}

/// Message `m` (as a client receives it) through transformation `t`.
fn transform(
    engine: &Engine,
    t: &aqgate_core::payload::Transformation,
    m: &Message,
) -> Result<aqgate_proto::idap::XmlNode, String> {
    let resolved = engine.resolved();
    let types = &resolved.catalog.types;
    let stored = aqgate_core::payload::encode(&t.from, types, &m.payload).map_err(|e| e.to_string())?;
    t.apply(types, &stored).map_err(|e| e.to_string())
}

async fn rolled_back_text(engine: &Engine, session: &mut Session, why: String) -> String {
    let e = rolled_back(engine, session, AqError::server(code::INTERNAL, why)).await;
    e.message
}

/// Messages of the batch that cannot go (`bad`: index and reason): in a batch, roll back and
/// go one by one; alone, to the exception queue, or FAILED naming the message.
#[allow(clippy::too_many_arguments)]
async fn refuse(
    engine: &Engine,
    job: &PropagationInfo,
    session: &mut Session,
    messages: &[Message],
    times: Vec<aqgate_core::engine::Carried>,
    alone: bool,
    bad: Vec<(usize, String)>,
    stats: &Stats,
) -> Result<Moved, Fail> {
    let why = bad.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>().join("; ");
    if !alone {
        let _ = rolled_back(engine, session, AqError::server(code::INTERNAL, why)).await;
        return Ok(Moved::Refused);
    }
    let Some(eq) = job.exception_queue.clone() else {
        let e = AqError::client(code::NOT_PERMITTED, format!("{why} (the job has no exception queue)"));
        return Err(Fail::Aq(rolled_back(engine, session, e).await));
    };
    let copies: Vec<Message> = messages.iter().map(|m| crate::forward(job, m, 0)).collect();
    session.settled = messages.iter().filter_map(|m| m.header.message_id.clone()).collect();
    session.tally = Some(JobTally::excepted(&job.name, messages.len()));
    let sent = carried_send(engine, session, &eq, None, copies, excepted(times, Expiry::Propagation)).await;
    session.settled.clear();
    match sent {
        Ok(_) => {
            stats.excepted(messages.len(), engine.now());
            tracing::warn!(job = %job.name, exception_queue = %eq, reason = %why, "moved to the exception queue");
            Ok(Moved::Done(messages.len()))
        }
        Err(e) => Err(Fail::Aq(rolled_back(engine, session, e).await)),
    }
}
