//! What a gateway job leaves behind: the ending of an inbound job's state at its broker
//! (`job::BrokerState`; `propagate::removals` drives it), and an outbound job's doubts about
//! messages that left its source another way.

use aqgate_core::engine::Engine;
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::topology::gateway::LinkKind;

use super::super::job::BrokerState;
#[cfg(feature = "mqtt")]
use super::mqtt;
#[cfg(feature = "nats")]
use super::nats;
#[cfg(feature = "rabbitmq")]
use super::rabbitmq;

/// Ends what a removed inbound job owns at its broker (see [`BrokerState`]): `Ok(Some(what))`
/// names what went, `Ok(None)`: it was not there.
pub(crate) async fn end(state: &BrokerState, job: &str) -> Result<Option<String>, String> {
    match state.link.kind {
        #[cfg(feature = "nats")]
        LinkKind::Nats => nats::remove(&state.link, &state.foreign, job).await,
        #[cfg(feature = "mqtt")]
        LinkKind::Mqtt => mqtt::remove(&state.link, job).await,
        #[cfg(feature = "rabbitmq")]
        LinkKind::Rabbitmq => rabbitmq::remove(&state.link, job).await,
        #[allow(unreachable_patterns)]
        kind => Err(super::not_built(&state.link.name, kind)),
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
