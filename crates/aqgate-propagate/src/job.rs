//! What every job is, whatever it moves: what its workers say they are doing ([`Doing`]),
//! whether it owns state at a broker that outlives it ([`owned`]), and how a store failure
//! of its background work is logged ([`store_failed`]). A leaf module: the lease, the
//! supervisor, the gateway and the removals name these, and it names none of them.

use aqgate_core::propagation::PropagationInfo;
use aqgate_core::topology::gateway::{Direction, Domain, ForeignQueueDef, LinkDef, LinkKind};

/// What the job's workers say they are doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doing {
    Running = 0,
    /// Backing off after a failure the destination may get over.
    Retrying = 1,
    /// The destination refused a message for good and there is no exception queue.
    Failed = 2,
}

impl Doing {
    pub fn name(self) -> &'static str {
        match self {
            Doing::Running => "RUNNING",
            Doing::Retrying => "RETRYING",
            Doing::Failed => "FAILED",
        }
    }
}

/// What a removed inbound job owns at its broker, and what it was.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BrokerState {
    pub source: String,
    pub destination: String,
    pub link: LinkDef,
    pub foreign: ForeignQueueDef,
}

impl BrokerState {
    /// What it is, for the operator (a forced removal leaves it there).
    pub fn describe(&self, job: &str) -> String {
        match self.link.kind {
            LinkKind::Nats => format!(
                "the durable consumer aqgate_{job} on stream {} at {}",
                self.foreign.stream.as_deref().unwrap_or(""),
                self.link.url
            ),
            LinkKind::Mqtt => format!("the persistent session aqgate-{job} at {}", self.link.url),
            LinkKind::Rabbitmq => {
                format!("the queue aqgate.{job} (bound to exchange {}) at {}", self.foreign.native_name, self.link.url)
            }
        }
    }
}

/// What job `job` owns at its broker, made by aqgate for it: an inbound job's NATS durable
/// consumer, MQTT persistent session, or on a RabbitMQ topic its own queue. Outbound jobs,
/// and RabbitMQ queues (the user's, declared or not), are not the job's.
pub fn owned(job: &PropagationInfo) -> Option<BrokerState> {
    let route = job.gateway.as_deref().filter(|r| r.direction == Direction::Inbound)?;
    if route.link.kind == LinkKind::Rabbitmq && route.foreign.domain != Domain::Topic {
        return None;
    }
    Some(BrokerState {
        source: job.source.clone(),
        destination: job.destination.clone(),
        link: route.link.clone(),
        foreign: route.foreign.clone(),
    })
}

/// After a failed step of job `job`: when `e` is the database being away (fault 1034),
/// waits until it is back (at most `at_most`, or until `stop`) and says so; else `false`,
/// and the caller backs off as it does. The store logs the outage once, and its end.
pub async fn waited_for_database(
    store: &dyn aqgate_core::store::Store,
    e: &aqgate_core::error::AqError,
    job: &str,
    at_most: std::time::Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    if e.code != aqgate_core::error::code::STORE_UNAVAILABLE {
        return false;
    }
    tracing::debug!(job, error = %e.message, "the database is unavailable; waiting for it");
    tokio::select! {
        () = store.until_available(at_most) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    true
}

/// Logs a store failure of a job's background work (`what` failed): at debug while the
/// database is away (the store logs the outage once, and again when it is back), else as a
/// warning.
pub fn store_failed(e: &aqgate_core::store::StoreError, what: &str) {
    if e.is_unavailable() {
        tracing::debug!(error = %e, "{what}: the database is unavailable");
    } else {
        tracing::warn!(error = %e, "{what}");
    }
}
