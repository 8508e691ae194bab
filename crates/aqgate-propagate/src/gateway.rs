//! The Messaging Gateway at work: jobs between AQ queues and other brokers' queues (see
//! `aqgate_core::topology::gateway` for what the topology declares). A gateway job is a
//! propagation job: it runs under the job's lease, reports through its heartbeat, and shows
//! in `admin jobs` and `/metrics`; this module is its worker.
//!
//! **Outbound** (AQ → broker), batch by batch:
//! 1. receive up to `batch_size` messages (REMOVE, in one engine session of the job's agent,
//!    uncommitted; messages still in their delay wait here, as a broker has no delay);
//! 2. convert each (`convert`); one that does not convert goes to the exception queue;
//! 3. record the batch's ids as *in doubt* (`gateway_doubt`, committed on its own);
//! 4. publish and wait for the broker's confirmation of every message;
//! 5. commit the dequeue, then forget the doubt.
//!
//! Over a backlog, up to the job's `batches_in_flight` batches overlap (`outbound::window`):
//! while the oldest waits for its confirmations and commits (4–5), the ones behind it are
//! received, recorded in doubt and published (1–4), each in its own session; the commits
//! keep the batches' order. With `batches_in_flight = 1`, where the store cannot hold two
//! transactions (SQLite), with a schedule's latency, and one by one after a refused batch,
//! a batch lands before the next is received. A batch that fails takes every batch
//! published behind it back too.
//!
//! A crash anywhere before 5 leaves the messages in the source (the batch's transaction
//! rolls back), so nothing is lost; what a crash between 4 and 5 can leave is a message the
//! broker has and the source still holds. The doubt row says so: NATS drops the second copy
//! by its `Nats-Msg-Id` (and past the stream's duplicate window the job looks for the id in
//! the stream first), RabbitMQ and MQTT get it marked `x-aqgate-redelivered` and counted.
//!
//! **Inbound** (broker → AQ, `inbound`): fetch up to `batch_size` messages, drop the
//! redeliveries of messages already enqueued (`gateway_seen`), convert, enqueue them with
//! their marks in one transaction (`Session::seen`), and ack them only after that commit. A
//! crash before the ack makes the broker deliver them again; their marks make the job ack
//! them without a second enqueue. A message over the link's `max_message_bytes`, or one
//! that does not convert, goes to the exception queue and is acked after that commit.
//!
//! A link that fails (refused, dropped, a timeout) is reconnected with the link's backoff;
//! meanwhile its state is RECONNECTING and the job RETRYING, and `/readyz` stays ready.

// A build that leaves a broker's client out (its cargo feature) leaves unused what only that
// client uses: its conversions, the connection pool, the arguments of its calls.
#![cfg_attr(
    not(all(feature = "rabbitmq", feature = "nats", feature = "mqtt")),
    allow(dead_code, unused_imports, unused_variables)
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aqgate_core::clock::Micros;
use aqgate_core::engine::Engine;
use aqgate_core::error::{AqError, code};
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::store::LinkStatus;
use aqgate_core::topology::Catalog;
use aqgate_core::topology::gateway::{Direction, ForeignQueueDef, GatewayRoute, LinkDef, LinkKind};

mod convert;
mod inbound;
#[cfg(feature = "mqtt")]
pub(crate) mod mqtt;
#[cfg(feature = "nats")]
pub(crate) mod nats;
mod outbound;
mod pool;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;
mod removal;

pub(crate) use removal::end;
use removal::purge_doubts;

use convert::{Incoming, Outgoing};

use super::Stats;
use super::job::Doing;

/// How one message fared at the broker.
pub(crate) enum Published {
    Confirmed,
    /// Refused for good (returned as unroutable): the exception queue, or FAILED.
    Refused(String),
}

/// The broker's word on each message of a batch published, in the batch's order, once it
/// has come; `Err`: the link failed, and any of them may or may not be there.
pub(crate) type Confirming =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<Published>, String>> + Send>>;

/// A link's outbound side, for one job.
#[async_trait::async_trait]
pub(crate) trait Sink: Send {
    /// Publishes `batch`, handing back the wait for the broker's word on each, which does
    /// not hold the sink: the next batch may be published meanwhile. `Err`: the link
    /// failed, and any of them may or may not be there.
    async fn publish(&mut self, batch: &[Outgoing]) -> Result<Confirming, String>;

    /// Whether the message with AQ id `id`, in doubt since `since`, is at the broker:
    /// `None` when publishing it again is safe or it cannot be told.
    async fn at_broker(&mut self, _id: &str, _since: Micros, _now: Micros) -> Result<Option<bool>, String> {
        Ok(None)
    }

    /// Whether the shared connection under it went (another job found it down): the job
    /// lets go and connects again, with the others on it.
    fn stale(&self) -> bool {
        false
    }

    /// The link failed under this job: a shared connection found down is dropped for every
    /// job on it (see `pool`).
    fn failed(&self) {}
}

/// A link's inbound side, for one job.
#[async_trait::async_trait]
pub(crate) trait Source: Send {
    /// Up to `max` messages, waiting up to `wait` for the first.
    async fn fetch(&mut self, max: usize, wait: Duration) -> Result<Vec<Incoming>, String>;
    /// Done with these (their enqueue committed).
    async fn ack(&mut self, tags: &[u64]) -> Result<(), String>;
    /// Not taken: the broker delivers them again.
    async fn requeue(&mut self, tags: &[u64]) -> Result<(), String>;
    /// Whether the connection must be made again before the next fetch (MQTT gives
    /// messages back by reconnecting).
    fn spent(&self) -> bool {
        false
    }
    /// After a failed fetch: why, when the broker sent what the client cannot read at all
    /// (an MQTT packet over the limit the job announced). The job is then FAILED with it
    /// (and reconnects with the link's backoff), not merely RETRYING.
    fn unreadable(&self) -> Option<String> {
        None
    }
    /// As [`Sink::stale`].
    fn stale(&self) -> bool {
        false
    }
    /// As [`Sink::failed`].
    fn failed(&self) {}
}

/// The link's user and password, the password read now from the environment or the file.
pub(crate) fn credentials(link: &LinkDef) -> Result<Option<(String, String)>, String> {
    let password = super::secret(link.password_env.as_deref(), link.password_file.as_deref())?;
    Ok(link.username.clone().map(|u| (u, password.unwrap_or_default())))
}

/// The cargo feature of this crate that builds the client of `kind`'s brokers.
pub fn feature_of(kind: LinkKind) -> &'static str {
    match kind {
        LinkKind::Rabbitmq => "rabbitmq",
        LinkKind::Nats => "nats",
        LinkKind::Mqtt => "mqtt",
    }
}

/// Whether this build has the client of `kind`'s brokers.
pub fn built(kind: LinkKind) -> bool {
    match kind {
        LinkKind::Rabbitmq => cfg!(feature = "rabbitmq"),
        LinkKind::Nats => cfg!(feature = "nats"),
        LinkKind::Mqtt => cfg!(feature = "mqtt"),
    }
}

/// Why a link of `kind` cannot be used by this build (see [`built`]).
pub fn not_built(link: &str, kind: LinkKind) -> String {
    let feature = feature_of(kind);
    format!(
        "gateway.links ({link}): a {feature} link, and this aqgate was built without the cargo feature `{feature}` \
         (of aqgate-propagate, on by default): build it with that feature, or leave the link out"
    )
}

/// The links of `catalog` whose broker's client this build lacks, each as an error that
/// names the link and the cargo feature: a topology with one is refused (by `admin apply`
/// and at `serve`'s start), since its jobs could never connect.
pub fn unbuilt_links(catalog: &Catalog) -> Vec<String> {
    catalog.gateway_links.iter().filter(|(_, l)| !built(l.kind)).map(|(name, l)| not_built(name, l.kind)).collect()
}

/// The outbound side of `link` for job `job`.
async fn sink(board: &Board, link: &LinkDef, fq: &ForeignQueueDef, job: &str) -> Result<Box<dyn Sink>, String> {
    match link.kind {
        #[cfg(feature = "nats")]
        LinkKind::Nats => Ok(Box::new(nats::sink(&board.nats, link, fq).await?)),
        #[cfg(feature = "rabbitmq")]
        LinkKind::Rabbitmq => Ok(Box::new(rabbitmq::sink(&board.rabbitmq, link, fq).await?)),
        #[cfg(feature = "mqtt")]
        LinkKind::Mqtt => Ok(Box::new(mqtt::sink(link, fq, job).await?)),
        #[allow(unreachable_patterns)]
        kind => Err(not_built(&link.name, kind)),
    }
}

/// The inbound side of `link` for job `job`, taking bodies of up to the link's largest
/// (`Board::max_body`: MQTT announces its packet limit from it; the others' clients read
/// what their broker sends).
async fn source(board: &Board, link: &LinkDef, fq: &ForeignQueueDef, job: &str) -> Result<Box<dyn Source>, String> {
    let max_body = board.max_body(link);
    match link.kind {
        #[cfg(feature = "nats")]
        LinkKind::Nats => Ok(Box::new(nats::source(&board.nats, link, fq, job).await?)),
        #[cfg(feature = "rabbitmq")]
        LinkKind::Rabbitmq => Ok(Box::new(rabbitmq::source(&board.rabbitmq, link, fq, job).await?)),
        #[cfg(feature = "mqtt")]
        LinkKind::Mqtt => Ok(Box::new(mqtt::source(link, fq, job, max_body).await?)),
        #[allow(unreachable_patterns)]
        kind => Err(not_built(&link.name, kind)),
    }
}

/// This process's links: the connections their jobs share (`pool`), and its view of them
/// (`admin gateway`): each job's connection reports to it, and it writes the link's row
/// whenever the state or the number of connections changes (and every `REFRESH`).
#[derive(Debug)]
pub struct Board {
    owner: String,
    links: Mutex<BTreeMap<String, Seen>>,
    /// Inbound: the largest body a job takes, on links without `max_message_bytes`.
    max_message_bytes: u64,
    #[cfg(feature = "rabbitmq")]
    rabbitmq: pool::Pool<lapin::Connection>,
    #[cfg(feature = "nats")]
    nats: pool::Pool<async_nats::Client>,
}

#[derive(Debug, Clone)]
struct Seen {
    status: LinkStatus,
    /// The jobs connected over it now, and those reconnecting.
    connected: std::collections::BTreeSet<String>,
    failing: std::collections::BTreeSet<String>,
    written: Micros,
}

const REFRESH: Micros = 10_000_000;

impl Board {
    pub fn new(owner: &str) -> Self {
        Self {
            owner: owner.to_string(),
            links: Mutex::new(BTreeMap::new()),
            max_message_bytes: 1 << 20,
            #[cfg(feature = "rabbitmq")]
            rabbitmq: pool::Pool::default(),
            #[cfg(feature = "nats")]
            nats: pool::Pool::default(),
        }
    }

    /// The connections open to `link` now: the shared ones, or (MQTT) one per job connected.
    fn connections(&self, link: &str, jobs: usize) -> i64 {
        let open = self.shared(link).unwrap_or(jobs);
        i64::try_from(open).unwrap_or(i64::MAX)
    }

    /// The connections open to `link` when its jobs share them (RabbitMQ, NATS).
    fn shared(&self, link: &str) -> Option<usize> {
        #[cfg(feature = "rabbitmq")]
        if let Some(n) = self.rabbitmq.open(link) {
            return Some(n);
        }
        #[cfg(feature = "nats")]
        if let Some(n) = self.nats.open(link) {
            return Some(n);
        }
        None
    }

    /// With `n` bytes the largest inbound body on links that set none.
    #[must_use]
    pub fn max_message_bytes(self, n: u64) -> Self {
        Self { max_message_bytes: n, ..self }
    }

    /// The largest inbound body `link` takes.
    fn max_body(&self, link: &LinkDef) -> u64 {
        link.max_message_bytes.unwrap_or(self.max_message_bytes)
    }

    /// Job `job`'s connection over `link` is up (`Ok(true)`), closed in good order
    /// (`Ok(false)`) or failed (`Err`, reconnecting); writes the row when it changed.
    async fn report(&self, engine: &Engine, link: &str, job: &str, up: Result<bool, &str>) {
        let now = engine.now();
        let write = {
            let mut links = self.links.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let s = links.entry(link.to_string()).or_insert_with(|| Seen {
                status: LinkStatus {
                    name: link.to_string(),
                    owner: self.owner.clone(),
                    state: "DISCONNECTED".into(),
                    last_error: None,
                    last_error_at: None,
                    since: now,
                    updated_at: 0,
                    connections: 0,
                },
                connected: std::collections::BTreeSet::new(),
                failing: std::collections::BTreeSet::new(),
                written: 0,
            });
            match up {
                Ok(true) => {
                    s.connected.insert(job.to_string());
                    s.failing.remove(job);
                }
                Ok(false) => {
                    s.connected.remove(job);
                    s.failing.remove(job);
                }
                Err(e) => {
                    s.connected.remove(job);
                    s.failing.insert(job.to_string());
                    s.status.last_error = Some(e.chars().take(500).collect());
                    s.status.last_error_at = Some(now);
                }
            }
            let state = if !s.connected.is_empty() {
                "CONNECTED"
            } else if !s.failing.is_empty() {
                "RECONNECTING"
            } else {
                "DISCONNECTED"
            };
            let connections = self.connections(link, s.connected.len());
            let changed = s.status.state != state || up.is_err() || s.status.connections != connections;
            s.status.connections = connections;
            if s.status.state != state {
                s.status.state = state.into();
                s.status.since = now;
            }
            if changed || now - s.written >= REFRESH {
                s.written = now;
                s.status.updated_at = now;
                Some(s.status.clone())
            } else {
                None
            }
        };
        if let Some(row) = write
            && let Err(e) = engine.store().gateway_link_put(&row).await
        {
            crate::job::store_failed(&e, &format!("link {link}: recording the link's state failed"));
        }
    }

    /// Job `job` stopped using `link` (its connection closed in good order).
    async fn closed(&self, engine: &Engine, link: &str, job: &str) {
        self.report(engine, link, job, Ok(false)).await;
    }

    /// Called after every step of a job on `link`: rewrites the link's row when it is due
    /// (every `REFRESH`, or the number of connections changed), so that `admin gateway`
    /// tells a live view from a dead process's.
    async fn alive(&self, engine: &Engine, link: &str) {
        let now = engine.now();
        let row = {
            let mut links = self.links.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match links.get_mut(link) {
                Some(s)
                    if now - s.written >= REFRESH
                        || s.status.connections != self.connections(link, s.connected.len()) =>
                {
                    s.written = now;
                    s.status.connections = self.connections(link, s.connected.len());
                    s.status.updated_at = now;
                    Some(s.status.clone())
                }
                _ => None,
            }
        };
        if let Some(row) = row
            && let Err(e) = engine.store().gateway_link_put(&row).await
        {
            crate::job::store_failed(&e, &format!("link {link}: recording the link's state failed"));
        }
    }
}

/// A gateway job's worker, while this process holds its lease: until `stats.stop`.
pub(crate) async fn work(
    engine: Arc<Engine>,
    job: PropagationInfo,
    route: GatewayRoute,
    stats: Stats,
    board: Arc<Board>,
) {
    match route.direction {
        Direction::Outbound => outbound::outbound(&engine, &job, &route, &stats, &board).await,
        Direction::Inbound => inbound::inbound(&engine, &job, &route, &stats, &board).await,
    }
}

/// Why a step failed.
enum Fail {
    /// The link: reconnect before the next try.
    Link(String),
    /// The broker sent what the client cannot read (`Source::unreadable`): reconnect, and
    /// the job is FAILED with the reason until a fetch succeeds.
    Unreadable(String),
    /// Anything else (the store, the destination): retry with backoff.
    Aq(AqError),
}

/// The retry loop both directions share: `connect` when there is no connection, `step` with
/// it; the backoff doubles from the job's `retry_backoff_ms` (a link failure from the link's
/// `reconnect_backoff_ms`) up to its maximum.
struct Pacing {
    doing: Doing,
    backoff: Duration,
    /// Steps still to take one message at a time, after a refused batch: the batch's
    /// size, so that the messages around the refused one go alone too, once each.
    one_by_one: u32,
}

impl Pacing {
    fn new(job: &PropagationInfo) -> Self {
        Self { doing: Doing::Running, backoff: Duration::from_millis(job.retry_backoff_ms), one_by_one: 0 }
    }

    fn done(&mut self, job: &PropagationInfo, stats: &Stats) {
        stats.report.shift(self.doing, Doing::Running);
        self.doing = Doing::Running;
        self.backoff = Duration::from_millis(job.retry_backoff_ms);
        self.one_by_one = self.one_by_one.saturating_sub(1);
    }

    fn alone(&self) -> bool {
        self.one_by_one > 0
    }

    /// With the schedule's latency, after a step that moved `n` messages, less than a full
    /// batch (one by one: none): waits the latency (until stopped), holding no receive or
    /// fetch open, so messages gather into fuller batches.
    async fn latency(&self, job: &PropagationInfo, n: usize, stop: &tokio::sync::watch::Receiver<bool>) {
        let full = if self.alone() { 1 } else { job.batch_size };
        if job.schedule.latency == 0 || u32::try_from(n).unwrap_or(u32::MAX) >= full {
            return;
        }
        let mut stop = stop.clone();
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(job.schedule.latency)) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }

    fn refused(&mut self, job: &PropagationInfo) {
        self.one_by_one = job.batch_size;
    }

    async fn failed(
        &mut self,
        engine: &Engine,
        job: &PropagationInfo,
        (link, board): (&LinkDef, &Board),
        stats: &Stats,
        e: &Fail,
    ) {
        let (err, max) = match e {
            Fail::Link(why) => (
                AqError::server(code::INTERNAL, format!("link {}: {why}", link.name)),
                Duration::from_millis(link.reconnect_max_ms),
            ),
            Fail::Unreadable(why) => (
                AqError::client(code::NOT_PERMITTED, format!("link {}: {why}", link.name)),
                Duration::from_millis(link.reconnect_max_ms),
            ),
            Fail::Aq(e) => (e.clone(), super::MAX_BACKOFF),
        };
        if matches!(e, Fail::Link(_) | Fail::Unreadable(_)) && self.doing == Doing::Running {
            self.backoff = Duration::from_millis(link.reconnect_backoff_ms);
        }
        let next = stats.failed(&err, engine.now());
        stats.report.shift(self.doing, next);
        self.doing = next;
        let mut stop = stats.stop.clone();
        if super::job::waited_for_database(engine.store().as_ref(), &err, &job.name, super::MAX_BACKOFF, &mut stop)
            .await
        {
            return;
        }
        tracing::warn!(job = %job.name, error = %err.message, retry_in = ?self.backoff, "gateway job step failed");
        // In slices, keeping the link's row fresh meanwhile (`admin gateway`).
        let until = tokio::time::Instant::now() + self.backoff;
        while tokio::time::Instant::now() < until && !*stop.borrow() {
            let slice = until.min(tokio::time::Instant::now() + Duration::from_secs(5));
            tokio::select! {
                () = tokio::time::sleep_until(slice) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            board.alive(engine, &link.name).await;
        }
        self.backoff = (self.backoff * 2).min(max);
    }

    fn end(&self, stats: &Stats) {
        stats.report.shift(self.doing, Doing::Running);
    }
}

/// The connection a job just made, reported to the board; a failure is reported, and
/// waited out with the link's backoff (`None`: try again).
async fn connected<T>(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    stats: &Stats,
    board: &Board,
    pacing: &mut Pacing,
    made: Result<T, String>,
) -> Option<T> {
    match made {
        Ok(c) => {
            board.report(engine, &route.link.name, &job.name, Ok(true)).await;
            Some(c)
        }
        Err(e) => {
            board.report(engine, &route.link.name, &job.name, Err(&e)).await;
            pacing.failed(engine, job, (&route.link, board), stats, &Fail::Link(e)).await;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topology with a link of each kind is refused by a build without one kind's client,
    /// with an error naming the link and the cargo feature; with every client, it passes.
    #[test]
    fn a_link_whose_client_is_not_built_is_refused_naming_its_feature() {
        let topology = aqgate_core::topology::Topology::from_toml(
            r#"
[[gateway.links]]
name = "rabbit"
kind = "rabbitmq"
url = "amqp://127.0.0.1:5672/%2f"

[[gateway.links]]
name = "jet"
kind = "nats"
url = "nats://127.0.0.1:4222"

[[gateway.links]]
name = "mosquitto"
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"
"#,
        )
        .expect("parses");
        let catalog = topology.resolve(&|_| Err("no passwords here".into())).expect("resolves");
        let errors = unbuilt_links(&catalog);
        let mut expected = Vec::new();
        for (name, kind, feature, on) in [
            ("JET", LinkKind::Nats, "nats", cfg!(feature = "nats")),
            ("MOSQUITTO", LinkKind::Mqtt, "mqtt", cfg!(feature = "mqtt")),
            ("RABBIT", LinkKind::Rabbitmq, "rabbitmq", cfg!(feature = "rabbitmq")),
        ] {
            assert_eq!(built(kind), on, "{feature}");
            assert_eq!(feature_of(kind), feature);
            if !on {
                expected.push(name);
            }
        }
        assert_eq!(errors.len(), expected.len(), "{errors:?}");
        for (e, name) in errors.iter().zip(&expected) {
            let feature = feature_of(catalog.gateway_links[*name].kind);
            assert!(
                e.starts_with(&format!("gateway.links ({name}): "))
                    && e.contains(&format!("cargo feature `{feature}`")),
                "{e}"
            );
        }
    }
}
