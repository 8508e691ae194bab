//! Propagation jobs at work: each enabled job of the topology moves messages from its
//! source queue to its destination queue — in this store (batches, here), in another aqgate
//! (`remote`) — or to an HTTP service (`forward`), through the engine like any client (see
//! `aqgate_core::propagation` for what a job is).
//!
//! **Exactly once.** A batch is one engine session of the job's agent: one receive (REMOVE)
//! of up to `batch_size` messages, then one AQXmlSend to the destination with a trailing
//! commit. The dequeues and the enqueue are committed in one database transaction, so a
//! message is in the source or in the destination, never both and never neither, whatever
//! moment the process is killed at (an uncommitted batch is rolled back by the store, and
//! its messages are moved again by the next batch). On PostgreSQL, from a single-consumer
//! source without history, the receive is part of that transaction too (`HeldTx`: the
//! messages removed rather than locked, no session row), so a batch costs one commit;
//! otherwise the receive locks the messages and writes the session's row in a commit of its
//! own. There, a job of one worker sends a batch without commit and commits it while it
//! takes the next batch, which commits only after it (`local`): the source's order kept,
//! the wait for each commit's flush no longer between batches. A batch that fails is rolled back; when that rollback fails too (the database away),
//! or the receive's own commit failed without an answer (it may have locked the messages),
//! the batch is ended before the job's next batch (`unended`: its session as the store has
//! it, rolled back), so its messages move once the database is back rather
//! than when the session times out.
//!
//! Event-driven: the first receive of a batch waits (a long poll, woken by the commit that
//! makes a message visible); the rest take what is there. With a schedule's latency the job
//! looks instead, and waits the latency after a look that found less than a full batch (see
//! `aqgate_core::topology::schedule`). A refused batch is rolled back and
//! its messages are moved one by one: one the destination refuses for good (no recipient on a
//! multi-consumer destination, not permitted, a payload the destination does not take, a
//! message the job's transformation fails on) goes
//! to the job's exception queue with the reason logged, and the job goes on; without an
//! exception queue, or on a transient failure, the message stays in the source and the job
//! retries with backoff (1 s doubling to 60 s).
//!
//! A job's receives take messages still in their delay too, and the copies keep their
//! times (`Session::carry`): a delayed message waits at the destination, not here.
//!
//! **One process at a time** runs a job: the one holding the job's lease in the store
//! (`lease`). A process that has just taken the lease rolls back the batches the job's agent
//! left open (its dead holder's: killed between a batch's receives and its commit), so their
//! messages move at once; a held batch (one transaction, see above) has no session to end:
//! the database rolls it back when its holder's connection closes, or after 10 s without a
//! statement (`Store::begin_held`). Outside its schedule's windows a job holds no lease and
//! no receive.
//!
//! Jobs follow the topology: a job added or changed by `admin apply` or `admin jobs` starts,
//! a disabled one finishes its batch and stops (before another), a removed one is
//! DELETE_PENDING until its batch in flight is done and then its status row goes — or, for
//! a gateway job that owns state at its broker, until `removals` has ended that state. A
//! change written to the store reaches every running process by itself (`control`: LISTEN on
//! PostgreSQL, a counter polled on SQLite; SIGHUP still works): it reloads the topology, and
//! the supervisor looks at once. The supervisor also reads the stored topology every lease
//! time, and reloads when a job it runs is gone from it. `status` makes the figures of
//! `admin jobs` and `/metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aqgate_core::clock::Micros;
use aqgate_core::engine::{Engine, JobTally, Session};
use aqgate_core::error::{AqError, code};
use aqgate_core::metrics::Counter;
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::store::{Expiry, Origin};
use aqgate_proto::idap::{
    AgentRef, ConsumerOptions, DeliveryMode, DequeueMode, Destination, EnqueueRequest, Message, MessageHeader,
    NavigationMode, ProducerOptions, ReceiveRequest, Request, Response, Selector, Visibility,
};
use tokio::sync::watch;

pub mod control;
mod forward;
pub mod gateway;
pub mod job;
pub mod lease;
mod local;
mod remote;
pub mod removals;
mod unended;

pub use lease::LeaseConfig;
pub use remote::Spaces as RemoteSpaceClients;
pub(crate) use unended::rolled_back;

/// How long the first receive of a batch waits for a message.
pub(crate) const WAIT: u64 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A job's counters in the metrics registry (`job` label): what this process did.
#[derive(Clone)]
pub(crate) struct Counters {
    propagated: Counter,
    exceptions: Counter,
    failures: Counter,
    /// Gateway jobs: messages published again after a doubt (a consumer may see them twice).
    in_doubt: Counter,
    /// Inbound gateway jobs: broker messages over the link's `max_message_bytes`, moved to
    /// the exception queue.
    oversize: Counter,
    /// Remote queue spaces' jobs: messages retried for longer than the space's
    /// `retry_max_age`, moved to the exception queue.
    gave_up: Counter,
}

impl Counters {
    fn new(engine: &Engine, job: &str) -> Self {
        let m = &engine.config().metrics;
        Self {
            propagated: m.labelled(
                "aqgate_propagation_messages_total",
                "Messages a propagation job moved to its destination.",
                "job",
                job,
            ),
            exceptions: m.labelled(
                "aqgate_propagation_exceptions_total",
                "Messages a propagation job moved to its exception queue.",
                "job",
                job,
            ),
            failures: m.labelled(
                "aqgate_propagation_failures_total",
                "Batches of a propagation job that failed and are retried.",
                "job",
                job,
            ),
            in_doubt: m.labelled(
                "aqgate_gateway_redelivered_total",
                "Messages a gateway job published again after a doubt, marked x-aqgate-redelivered.",
                "job",
                job,
            ),
            oversize: m.labelled(
                "aqgate_gateway_oversize_total",
                "Broker messages an inbound gateway job refused as over its link's max_message_bytes (moved to the exception queue).",
                "job",
                job,
            ),
            gave_up: m.labelled(
                "aqgate_propagation_gave_up_total",
                "Messages a remote queue space's job retried for longer than its retry_max_age (moved to the exception queue).",
                "job",
                job,
            ),
        }
    }
}

/// What a job's workers count (in the metrics registry and in the report its lease's
/// heartbeat stores), and their stop signal.
#[derive(Clone)]
pub(crate) struct Stats {
    counters: Counters,
    report: Arc<lease::Report>,
    stop: watch::Receiver<bool>,
}

impl Stats {
    /// `n` messages went to the destination, counted in the job's row by the batch's own
    /// commit (`JobTally`, set on the session before it).
    pub(crate) fn moved(&self, n: usize, now: Micros) {
        self.counters.propagated.add(n as u64);
        self.report.committed(now);
    }

    /// `n` messages went to the job's exception queue, counted as [`Stats::moved`] are.
    pub(crate) fn excepted(&self, n: usize, now: Micros) {
        self.counters.exceptions.add(n as u64);
        self.report.committed(now);
    }

    /// `n` messages went to a foreign exception queue (no transaction of ours): counted by
    /// the job's next report.
    pub(crate) fn excepted_abroad(&self, n: usize, now: Micros) {
        self.counters.exceptions.add(n as u64);
        self.report.excepted(n as u64, now);
    }

    /// A batch failed: the worker is RETRYING, or FAILED when the destination refused it for
    /// good (what it does now).
    pub(crate) fn failed(&self, e: &AqError, now: Micros) -> job::Doing {
        self.counters.failures.inc();
        self.report.failed(&e.message, now);
        if permanent(e) { job::Doing::Failed } else { job::Doing::Retrying }
    }
}

/// Why a job's task is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Disabled, changed (a new task follows), or the process stops: the lease is given up
    /// after the batch in flight.
    Stop,
    /// Gone from the topology: DELETE_PENDING until its batch in flight is done, then its
    /// status row goes.
    Removed,
}

/// Runs the topology's jobs until `stop` changes; looks for changed jobs every `every`. A
/// job runs here only while this process holds its lease (see `lease`).
pub async fn run(engine: Arc<Engine>, every: Duration, lease: LeaseConfig, mut stop: watch::Receiver<bool>) {
    type Task = (PropagationInfo, watch::Sender<Option<Ending>>, tokio::task::JoinHandle<()>);
    let lease = Arc::new(lease);
    let mut running: BTreeMap<String, Task> = BTreeMap::new();
    // Jobs told to stop, finishing their batch in flight; a job is not started again
    // before its earlier task has ended.
    // Kept with its sender: a removed job cleaning up is told when the process stops.
    let mut stopping: Vec<(String, watch::Sender<Option<Ending>>, tokio::task::JoinHandle<()>)> = Vec::new();
    let mut seen: Option<Arc<aqgate_core::engine::Resolved>> = None;
    let mut swept = std::time::Instant::now();
    // Pending removals this process is ending (`removals::finish`), with their stop signal.
    let mut finishing: BTreeMap<String, (watch::Sender<bool>, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    // A reload (SIGHUP, or a change in the store seen by `control`) is looked at at once.
    let mut reloads = lease.agent.reloads();
    loop {
        let resolved = engine.resolved();
        let wanted = resolved.catalog.propagations.clone();
        let before = stopping.len();
        stopping.retain(|(name, _, task)| {
            if task.is_finished() {
                tracing::info!(job = %name, "propagation job stopped");
            }
            !task.is_finished()
        });
        let gone: Vec<String> = running
            .iter()
            .filter(|(name, (info, _, _))| wanted.get(*name).is_none_or(|w| w != info || !w.enabled))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some((_, tx, task)) = running.remove(&name) {
                let why = if wanted.contains_key(&name) { Ending::Stop } else { Ending::Removed };
                let _ = tx.send(Some(why));
                stopping.push((name, tx, task));
            }
        }
        for (name, info) in wanted.iter().filter(|(_, i)| i.enabled) {
            if running.contains_key(name) || stopping.iter().any(|(n, _, _)| n == name) {
                continue;
            }
            let (tx, rx) = watch::channel(None);
            let task = tokio::spawn(lease::job(engine.clone(), info.clone(), lease.clone(), rx));
            tracing::info!(job = %name, source = %info.source, destination = %info.destination, "propagation job started");
            running.insert(name.clone(), (info.clone(), tx, task));
        }
        finishing.retain(|_, (_, task)| !task.is_finished());
        // Every ttl (and after a reload): the stored topology, read afresh. A job this
        // process runs that is gone from it was removed with no SIGHUP here: the topology is
        // reloaded, so that the job stops (at the next turn). Pending removals of jobs no
        // longer run here are ended (`removals`); status rows of jobs gone from the topology
        // that no process finishes any more (their holder died before it could delete the
        // row) go.
        let ended = stopping.len() < before;
        if ended || seen.as_ref().is_none_or(|s| !Arc::ptr_eq(s, &resolved)) || swept.elapsed() >= lease.ttl {
            match engine.store().load_topology().await {
                Ok(topology) => {
                    let defined = |name: &str| {
                        topology.iter().any(|(k, n, _)| (k == "propagation" || k == "gateway_job") && n == name)
                    };
                    let stale = running.iter().any(|(name, (info, _, _))| info.space.is_none() && !defined(name));
                    if stale {
                        tracing::info!("a running job is gone from the stored topology: reloading it");
                        if let Err(e) = engine.reload().await {
                            tracing::warn!(error = %e.message, "reloading the topology failed");
                        }
                    }
                    for r in removals::of_rows(&topology).into_iter().filter(|r| r.pending.is_some()) {
                        let name = r.name.clone();
                        let here = running.contains_key(&name) || stopping.iter().any(|(n, _, _)| *n == name);
                        if here || finishing.contains_key(&name) || defined(&name) {
                            continue;
                        }
                        let (tx, rx) = watch::channel(false);
                        let task = tokio::spawn(removals::finish(engine.clone(), r, lease.clone(), rx));
                        finishing.insert(name, (tx, task));
                    }
                    let busy: Vec<&String> =
                        running.keys().chain(stopping.iter().map(|(n, _, _)| n)).chain(finishing.keys()).collect();
                    removals::sweep(&engine, &lease, &topology, &busy).await;
                }
                Err(e) => tracing::debug!(error = %e, "reading the stored topology failed"),
            }
            seen = Some(resolved);
            swept = std::time::Instant::now();
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = reloads.changed() => {}
            _ = stop.changed() => break,
        }
    }
    for (name, (_, tx, task)) in running {
        stopping.push((name, tx, task));
    }
    for (_, tx, _) in &stopping {
        let _ = tx.send(Some(Ending::Stop));
    }
    for (tx, _) in finishing.values() {
        let _ = tx.send(true);
    }
    for (_, task) in stopping.into_iter().map(|(n, _, t)| (n, t)).chain(finishing.into_iter().map(|(n, (_, t))| (n, t)))
    {
        let _ = task.await;
    }
    lease.agent.finished();
}

/// A job's workers, while this process holds its lease: until `stats.stop`.
pub(crate) async fn work(engine: Arc<Engine>, job: PropagationInfo, stats: Stats, board: Arc<gateway::Board>) {
    let stop = stats.stop.clone();
    if let Some(route) = job.gateway.clone() {
        return gateway::work(engine, job, *route, stats, board).await;
    }
    match (&job.remote, &job.forward) {
        (_, Some(def)) => {
            let made = usable(&engine, &job, &stats, "forwarding target", || forward::Forwarder::new(&engine, def));
            let Some(f) = made.await.map(Arc::new) else { return };
            let workers: Vec<_> = (0..job.concurrency)
                .map(|_| {
                    let (engine, job, stats, f, mut stop) =
                        (engine.clone(), job.clone(), stats.clone(), f.clone(), stop.clone());
                    tokio::spawn(async move {
                        retrying(&engine, &job, &stats, &mut stop, 1, |_| forward::move_one(&engine, &job, &f, &stats))
                            .await;
                    })
                })
                .collect();
            for w in workers {
                let _ = w.await;
            }
        }
        (None, None) => {
            // Several batches at once only when asked: one worker keeps the source's order.
            let workers: Vec<_> = (0..job.concurrency)
                .map(|_| {
                    let (engine, job, stats, mut stop) = (engine.clone(), job.clone(), stats.clone(), stop.clone());
                    tokio::spawn(async move { local::local_loop(&engine, &job, &stats, &mut stop).await })
                })
                .collect();
            for w in workers {
                let _ = w.await;
            }
        }
        (Some(def), None) => {
            let made = usable(&engine, &job, &stats, "remote destination", || remote::Remote::new(def));
            let Some(remote) = made.await.map(Arc::new) else { return };
            let workers: Vec<_> = (0..job.concurrency)
                .map(|_| {
                    let (engine, job, stats, remote, mut stop) =
                        (engine.clone(), job.clone(), stats.clone(), remote.clone(), stop.clone());
                    tokio::spawn(async move {
                        retrying(&engine, &job, &stats, &mut stop, 1, |_| move_remote(&engine, &job, &remote, &stats))
                            .await;
                    })
                })
                .collect();
            for w in workers {
                let _ = w.await;
            }
        }
    }
}

/// A password the topology names by place only: the environment variable `env`, else the
/// file `file` (without its trailing line end); `None` when it names neither.
pub(crate) fn secret(env: Option<&str>, file: Option<&str>) -> Result<Option<String>, String> {
    match (env, file) {
        (Some(var), _) => {
            std::env::var(var).map(Some).map_err(|_| format!("the environment variable {var} is not set"))
        }
        (None, Some(f)) => std::fs::read_to_string(f)
            .map(|p| Some(p.trim_end_matches(['\r', '\n']).to_string()))
            .map_err(|e| format!("{f}: {e}")),
        (None, None) => Ok(None),
    }
}

/// What `make` makes, tried every 10 s (the job RETRYING meanwhile); `None` if stopped first.
async fn usable<T>(
    engine: &Engine,
    job: &PropagationInfo,
    stats: &Stats,
    what: &str,
    make: impl Fn() -> Result<T, String>,
) -> Option<T> {
    let mut stop = stats.stop.clone();
    let mut doing = job::Doing::Running;
    let made = loop {
        match make() {
            Ok(t) => break Some(t),
            Err(e) => {
                stats.failed(&AqError::server(code::INTERNAL, format!("{what}: {e}")), engine.now());
                stats.report.shift(doing, job::Doing::Retrying);
                doing = job::Doing::Retrying;
                tracing::warn!(job = %job.name, error = %e, "{what} not usable; retrying in 10 s");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = stop.wait_for(|s| *s) => break None,
                }
            }
        }
    };
    stats.report.shift(doing, job::Doing::Running);
    made
}

/// Runs `step` until stopped: `step(true)` after a refused batch, with backoff after a
/// failure. With a schedule's latency, a step that moved less than `full` messages (one by
/// one: less than one) is followed by a wait of the latency, holding no receive open.
async fn retrying<F, Fut>(
    engine: &Engine,
    job: &PropagationInfo,
    stats: &Stats,
    stop: &mut watch::Receiver<bool>,
    full: u32,
    mut step: F,
) where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<Moved, AqError>>,
{
    let first = Duration::from_millis(job.retry_backoff_ms);
    let mut backoff = first;
    let mut one_by_one = false;
    // What this worker does, in the job's report.
    let mut doing = job::Doing::Running;
    while !*stop.borrow() {
        match step(one_by_one).await {
            Ok(Moved::Done(n)) => {
                if n > 0 {
                    tracing::debug!(job = %job.name, messages = n, "propagated");
                }
                stats.report.shift(doing, job::Doing::Running);
                doing = job::Doing::Running;
                let want = if one_by_one { 1 } else { full };
                backoff = first;
                one_by_one = false;
                if job.schedule.latency > 0 && u32::try_from(n).unwrap_or(u32::MAX) < want {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(job.schedule.latency)) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }
            }
            Ok(Moved::Refused) => one_by_one = true,
            Err(e) => {
                let next = stats.failed(&e, engine.now());
                stats.report.shift(doing, next);
                doing = next;
                if job::waited_for_database(engine.store().as_ref(), &e, &job.name, MAX_BACKOFF, stop).await {
                    continue;
                }
                tracing::warn!(job = %job.name, error = %e.message, retry_in = ?backoff, "propagation batch failed");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    stats.report.shift(doing, job::Doing::Running);
}

pub(crate) enum Moved {
    /// Messages moved (to the destination or the exception queue), perhaps none.
    Done(usize),
    /// The destination refused the batch; it is rolled back, to be moved one by one.
    Refused,
}

/// What taking a batch came to where a job's batches overlap (`local`, `gateway::outbound`):
/// a batch under way (`F`: sent or published, its commit still to come), or finished already.
pub(crate) enum Prepared<F> {
    /// Under way, to land.
    Flight(Box<F>),
    /// Finished: moved, perhaps none, or refused.
    Moved(Moved),
}

/// Whether the destination refuses a message for good (another try gets the same answer).
fn permanent(e: &AqError) -> bool {
    [code::NO_RECIPIENTS, code::PAYLOAD_MISMATCH, code::NOT_PERMITTED, code::INVALID_VALUE, code::TRANSFORMATION]
        .contains(&e.code)
}

/// One message to the remote destination (see `remote`): received, sent under its key,
/// then the receive committed.
async fn move_remote(
    engine: &Engine,
    job: &PropagationInfo,
    remote: &remote::Remote,
    stats: &Stats,
) -> Result<Moved, AqError> {
    let mut session = Session::new(&job.agent, engine.now());
    session.propagates = true;
    let m = match waiting_receive(engine, &mut session, job, stats).await {
        Ok(Response::Receive(_, Some(r))) => r.messages.into_iter().next(),
        Ok(_) => None,
        Err(e) if e.code == code::NO_MESSAGE => None,
        Err(e) => return Err(rolled_back(engine, &mut session, e).await),
    };
    let Some(m) = m else { return Ok(Moved::Done(0)) };
    let id = m.header.message_id.clone().unwrap_or_default();
    let out = forward(job, &m, 0);
    let times = session.received.first().cloned();
    // The remote records the agent the job logs in as there as the sender and the
    // enqueuing agent (what it can verify): the local sender stays here, since it may name
    // no agent there, or one a secure queue there refuses. It takes the remaining delay
    // and expiration in seconds, counted from its own clock.
    let (delay, expiration) = times.as_ref().map_or((None, None), |t| t.remaining_secs(engine.now()));
    let there =
        Message { header: MessageHeader { sender_id: None, delay, expiration, ..out.header.clone() }, ..out.clone() };
    match remote.send(&job.name, &id, &job.destination, there).await {
        remote::Sent::Done => {
            session.tally = Some(JobTally::moved(&job.name, 1));
            if let Err(e) = engine.execute(&mut session, Request::Commit).await {
                return Err(rolled_back(engine, &mut session, e).await);
            }
            stats.moved(1, engine.now());
            Ok(Moved::Done(1))
        }
        remote::Sent::Permanent(why) => {
            except_remote(
                engine,
                job,
                &mut session,
                stats,
                &m,
                out,
                times,
                &why,
                "the remote refused a message for good",
            )
            .await
        }
        remote::Sent::Transient(why) => match retried_too_long(engine, job, times.as_ref()) {
            Some(max_age) => {
                let why = format!("not delivered within retry_max_age {max_age} s: {why}");
                let moved = except_remote(
                    engine,
                    job,
                    &mut session,
                    stats,
                    &m,
                    out,
                    times,
                    &why,
                    "the remote did not take a message within the space's retry_max_age",
                )
                .await;
                if moved.is_ok() {
                    stats.counters.gave_up.inc();
                }
                moved
            }
            None => Err(rolled_back(engine, &mut session, AqError::server(code::INTERNAL, why)).await),
        },
    }
}

/// For a remote queue space's job: the space's `retry_max_age` when the message was first
/// enqueued longer ago than that (the job stops retrying it).
fn retried_too_long(
    engine: &Engine,
    job: &PropagationInfo,
    times: Option<&aqgate_core::engine::Carried>,
) -> Option<i64> {
    job.space.as_ref()?;
    let resolved = engine.resolved();
    let max_age = resolved.catalog.queues.get(&job.source)?.remote.as_ref()?.retry_max_age;
    let enqueued = times?.enq_time;
    let age = engine.now().saturating_sub(enqueued) / aqgate_core::clock::MICROS_PER_SEC;
    (age >= max_age).then_some(max_age)
}

/// Moves the message the job received in `session` to its exception queue with `why` (a
/// job without one fails with it instead).
#[allow(clippy::too_many_arguments)]
async fn except_remote(
    engine: &Engine,
    job: &PropagationInfo,
    session: &mut Session,
    stats: &Stats,
    m: &Message,
    out: Message,
    times: Option<aqgate_core::engine::Carried>,
    why: &str,
    what: &str,
) -> Result<Moved, AqError> {
    let Some(eq) = job.exception_queue.clone() else {
        return Err(rolled_back(engine, session, AqError::client(code::NOT_PERMITTED, why)).await);
    };
    let id = m.header.message_id.clone().unwrap_or_default();
    session.tally = Some(JobTally::excepted(&job.name, 1));
    let sent = carried_send(
        engine,
        session,
        &eq,
        None,
        vec![rejected(job, out, why)],
        excepted(times.into_iter().collect(), Expiry::Propagation),
    );
    match sent.await {
        Ok(_) => {
            stats.excepted(1, engine.now());
            tracing::warn!(job = %job.name, message = %id, correlation = ?m.header.correlation,
                exception_queue = %eq, reason = %why, "{what}; moved to the exception queue");
            Ok(Moved::Done(1))
        }
        Err(e) => Err(rolled_back(engine, session, e).await),
    }
}

/// The times of exception copies: the original enqueue time only. A message moved to an
/// exception queue is there to be looked at now, and stays until it is (as the engine's own
/// moves to an exception queue clear its delay and expiry). The copies say `why` (their
/// EXPIRATION_REASON).
fn excepted(times: Vec<aqgate_core::engine::Carried>, why: Expiry) -> Vec<aqgate_core::engine::Carried> {
    times
        .into_iter()
        .map(|t| aqgate_core::engine::Carried {
            delay_until: None,
            expire_at: None,
            origin: t.origin.map(|o| Origin { why: Some(why), ..o }),
            ..t
        })
        .collect()
}

/// The EXPIRATION_REASON of a message the destination refused for good with `e`.
fn refusal(e: &AqError) -> Expiry {
    if e.code == code::TRANSFORMATION { Expiry::Transformation } else { Expiry::Propagation }
}

/// Sends `messages` with commit, giving them `times` (see `Session::carry`), through
/// `transformation` if there is one.
async fn carried_send(
    engine: &Engine,
    session: &mut Session,
    queue: &str,
    transformation: Option<String>,
    messages: Vec<Message>,
    times: Vec<aqgate_core::engine::Carried>,
) -> Result<Response, AqError> {
    carried(engine, session, (queue, transformation), messages, times, true).await
}

/// As [`carried_send`], committing the session's transaction only with `commit` (else it
/// stays open for a later commit).
async fn carried(
    engine: &Engine,
    session: &mut Session,
    (queue, transformation): (&str, Option<String>),
    messages: Vec<Message>,
    times: Vec<aqgate_core::engine::Carried>,
    commit: bool,
) -> Result<Response, AqError> {
    session.carry = times;
    let mut request = send(queue, messages);
    if let Request::Send(r) = &mut request {
        r.producer.transformation = transformation;
        r.commit = commit;
    }
    engine.execute(session, request).await
}

/// The exception queue's copy of a message the remote refused: for a remote queue space's
/// job, whose clients cannot see the job's log, the reason (the remote's code and text) is
/// its correlation, at most 128 characters; the original correlation is in the log.
fn rejected(job: &PropagationInfo, mut out: Message, why: &str) -> Message {
    if job.space.is_some() {
        out.header.correlation = Some(why.chars().take(128).collect());
    }
    out
}

/// A batch's messages, received in `session`: waiting for the first (`waiting_receive`)
/// with `wait`, else taking only what is there; none when there are none. A receive that
/// fails is rolled back, and its error returned.
pub(crate) async fn received_batch(
    engine: &Engine,
    session: &mut Session,
    job: &PropagationInfo,
    wait: bool,
    stats: &Stats,
) -> Result<Vec<Message>, AqError> {
    let received = if wait {
        waiting_receive(engine, session, job, stats).await
    } else {
        engine.execute(session, receive(job, 0)).await
    };
    match received {
        Ok(Response::Receive(_, Some(r))) => Ok(r.messages),
        Ok(_) => Ok(Vec::new()),
        Err(e) if e.code == code::NO_MESSAGE => Ok(Vec::new()),
        Err(e) => Err(rolled_back(engine, session, e).await),
    }
}

/// The batch's first receive, which waits for a message: given up (taking nothing) when the
/// job is stopped, so a disabled or removed job stops at once instead of after the wait.
/// First, the job's batches whose end failed are ended (see [`unended::end`]).
pub(crate) async fn waiting_receive(
    engine: &Engine,
    session: &mut Session,
    job: &PropagationInfo,
    stats: &Stats,
) -> Result<Response, AqError> {
    unended::end(engine, &job.agent).await?;
    let abandon = Arc::new(aqgate_core::engine::Abandon::default());
    session.abandon = Some(abandon.clone());
    let mut stop = stats.stop.clone();
    let r = {
        // With a latency the job looks and moves on (it waits between looks instead).
        let wait = if job.schedule.latency > 0 { 0 } else { WAIT };
        let received = engine.execute(session, receive(job, wait));
        tokio::pin!(received);
        tokio::select! {
            r = &mut received => r,
            () = async {
                let _ = stop.wait_for(|s| *s).await;
            } => {
                abandon.abandon();
                received.await
            }
        }
    };
    session.abandon = None;
    r
}

pub(crate) fn receive(job: &PropagationInfo, wait: u64) -> Request {
    Request::Receive(ReceiveRequest {
        consumer: ConsumerOptions {
            destination: Destination::database(job.source.clone()),
            consumer_name: job.consumer.clone(),
            wait_time: Some(wait),
            selector: job.condition.clone().map(Selector::Condition),
            visibility: Visibility::OnCommit,
            dequeue_mode: DequeueMode::Remove,
            navigation: NavigationMode::NextMessage,
            transformation: None,
            // Buffered messages stay where they are: a job moves persistent ones only.
            delivery_mode: DeliveryMode::Persistent,
        },
        commit: false,
    })
}

pub(crate) fn send(queue: &str, messages: Vec<Message>) -> Request {
    Request::Send(EnqueueRequest {
        producer: ProducerOptions {
            destination: Destination::database(queue.to_string()),
            visibility: Visibility::OnCommit,
            transformation: None,
            delivery_mode: DeliveryMode::Persistent,
        },
        messages,
        commit: true,
    })
}

/// The destination's copy of a received message: payload, priority, sender, and the
/// correlation (or, with `preserve_message_id`, the source message id as the correlation).
fn forward(job: &PropagationInfo, m: &Message, i: usize) -> Message {
    let h = &m.header;
    let correlation = if job.preserve_message_id { h.message_id.clone() } else { h.correlation.clone() };
    Message {
        number: Some(u32::try_from(i + 1).unwrap_or(u32::MAX)),
        header: MessageHeader {
            correlation,
            priority: h.priority,
            sender_id: h
                .sender_id
                .clone()
                .or_else(|| Some(AgentRef { name: Some(job.agent.clone()), ..AgentRef::default() })),
            ..MessageHeader::default()
        },
        payload: m.payload.clone(),
    }
}
