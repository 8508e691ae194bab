//! What a gateway job leaves behind: an inbound job's state at its broker (what it is,
//! named by a forced removal, and its ending, which `propagate::removals` drives), and an
//! outbound job's doubts about messages that left its source another way.

use aqgate_core::engine::Engine;
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::topology::gateway::{Direction, Domain, ForeignQueueDef, LinkDef, LinkKind};

use super::{mqtt, nats, rabbitmq};

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

    /// Ends it: `Ok(Some(what))` names what went, `Ok(None)`: it was not there.
    pub(crate) async fn end(&self, job: &str) -> Result<Option<String>, String> {
        match self.link.kind {
            LinkKind::Nats => nats::remove(&self.link, &self.foreign, job).await,
            LinkKind::Mqtt => mqtt::remove(&self.link, job).await,
            LinkKind::Rabbitmq => rabbitmq::remove(&self.link, job).await,
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

/// Forgets the doubts about messages that left the source otherwise than through the job
/// (expired into the exception queue, purged, taken by another consumer): they are never
/// published again, and would otherwise count as in doubt for ever. Between batches, so
/// none of the job's own is in flight.
pub(super) async fn purge_doubts(engine: &Engine, job: &PropagationInfo) {
    let Some(&queue) = engine.resolved().ids.get(&job.source) else { return };
    match engine.store().gateway_doubt_purge(&job.agent, queue, job.consumer.as_deref().unwrap_or("")).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(job = %job.name, doubts = n, "forgot doubts about messages gone from the source"),
        Err(e) => tracing::warn!(job = %job.name, error = %e, "forgetting stale doubts failed"),
    }
}
