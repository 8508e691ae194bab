//! What a gateway job leaves behind, and its going: an inbound job's state at its broker
//! (ended by a non-forced removal, named by a forced one), and an outbound job's doubts
//! about messages that left its source another way.

use aqgate_core::engine::Engine;
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::topology::gateway::{Direction, LinkKind};

use super::{mqtt, nats};

/// A removed job's state at its broker, ended (`lease::clean_up`): an inbound job's NATS
/// durable consumer or MQTT persistent session; `Ok(Some(what))` names what went. Outbound
/// jobs and RabbitMQ (whose queues are the user's, declared or not) keep nothing.
pub(crate) async fn clean_up(job: &PropagationInfo) -> Result<Option<String>, String> {
    let Some(route) = job.gateway.as_deref().filter(|r| r.direction == Direction::Inbound) else { return Ok(None) };
    match route.link.kind {
        LinkKind::Nats => nats::remove(&route.link, &route.foreign, &job.name).await,
        LinkKind::Mqtt => mqtt::remove(&route.link, &job.name).await,
        LinkKind::Rabbitmq => Ok(None),
    }
}

/// What a forced removal of `job` leaves at its broker, for the operator to remove there.
pub(crate) fn left_at_broker(job: &PropagationInfo) -> Option<String> {
    let route = job.gateway.as_deref().filter(|r| r.direction == Direction::Inbound)?;
    match route.link.kind {
        LinkKind::Nats => Some(format!(
            "the durable consumer aqgate_{} on stream {} at {}",
            job.name,
            route.foreign.stream.as_deref().unwrap_or(""),
            route.link.url
        )),
        LinkKind::Mqtt => Some(format!("the persistent session aqgate-{} at {}", job.name, route.link.url)),
        LinkKind::Rabbitmq => None,
    }
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
