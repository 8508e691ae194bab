//! What an outbound gateway job leaves behind: its doubts about messages that left its
//! source another way (an inbound job's state at its broker is `propagate::removals`').

use aqgate_core::engine::Engine;
use aqgate_core::propagation::PropagationInfo;

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
