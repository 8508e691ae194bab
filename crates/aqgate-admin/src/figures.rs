//! What `/metrics` shows of the queues and the mail spool (through `status::metrics`, the
//! servlet's `AppState::more_metrics` in the binary): every queue's committed messages by
//! state (READY, WAIT, EXPIRED, as its `AQ$` view tells them), how long its oldest READY
//! message has waited, and the spool's backlog; one grouped read of the store per scrape.

use aqgate_core::clock::{MICROS_PER_SEC, Micros};
use aqgate_core::engine::Engine;
use aqgate_core::store::QueueFigures;

/// The gauges' states, as their `state` label says them.
pub const STATES: [&str; 3] = ["ready", "waiting", "expired"];

/// The queue and spool gauges as the store has them now; an error names what could not be read.
pub async fn metrics(engine: &Engine, out: &mut String) -> Result<(), String> {
    let store = engine.store();
    let (figures, spool) = tokio::try_join!(store.queue_figures(engine.now(), i64::MAX), store.spool_backlog())
        .map_err(|e| format!("queue figures: {e}"))?;
    let resolved = engine.resolved();
    let by_id: std::collections::HashMap<i64, QueueFigures> = figures.into_iter().map(|f| (f.queue, f)).collect();
    let queues: Vec<(&str, QueueFigures)> = resolved
        .catalog
        .queues
        .keys()
        .map(|name| {
            let f = resolved.ids.get(name).and_then(|id| by_id.get(id)).copied().unwrap_or_default();
            (name.as_str(), f)
        })
        .collect();
    render(&queues, spool, engine.now(), out);
    Ok(())
}

/// Prometheus text of [`metrics`].
pub fn render(queues: &[(&str, QueueFigures)], spool: i64, now: Micros, out: &mut String) {
    let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    if !queues.is_empty() {
        out.push_str(
            "# HELP aqgate_queue_messages A queue's committed messages by state (ready, waiting: delayed, \
             expired: past expiration or moved to the exception queue).\n\
             # TYPE aqgate_queue_messages gauge\n",
        );
        for (name, f) in queues {
            for (state, v) in STATES.iter().zip([f.ready, f.waiting, f.expired]) {
                out.push_str(&format!("aqgate_queue_messages{{queue=\"{}\",state=\"{state}\"}} {v}\n", label(name)));
            }
        }
        out.push_str(
            "# HELP aqgate_queue_oldest_ready_seconds How long a queue's oldest ready message has been enqueued \
             (0: none ready).\n\
             # TYPE aqgate_queue_oldest_ready_seconds gauge\n",
        );
        for (name, f) in queues {
            out.push_str(&format!(
                "aqgate_queue_oldest_ready_seconds{{queue=\"{}\"}} {:.3}\n",
                label(name),
                age_seconds(now, f.oldest_ready)
            ));
        }
    }
    out.push_str(&format!(
        "# HELP aqgate_mail_spool_backlog Accepted mail not yet forwarded or still owed replies.\n\
         # TYPE aqgate_mail_spool_backlog gauge\naqgate_mail_spool_backlog {spool}\n"
    ));
}

/// Seconds from `since` to `now` (0 for none, or a time ahead of `now`).
#[allow(clippy::cast_precision_loss)]
pub fn age_seconds(now: Micros, since: Option<Micros>) -> f64 {
    since.map_or(0.0, |t| (now.saturating_sub(t).max(0) as f64) / (MICROS_PER_SEC as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_name_every_queue_and_state_escaped() {
        let f = QueueFigures { ready: 2, waiting: 1, expired: 3, oldest_ready: Some(0), ..Default::default() };
        let mut out = String::new();
        render(&[("A\"Q", f)], 7, 2 * MICROS_PER_SEC, &mut out);
        assert!(out.contains("aqgate_queue_messages{queue=\"A\\\"Q\",state=\"ready\"} 2\n"), "{out}");
        assert!(out.contains("aqgate_queue_messages{queue=\"A\\\"Q\",state=\"waiting\"} 1\n"), "{out}");
        assert!(out.contains("aqgate_queue_messages{queue=\"A\\\"Q\",state=\"expired\"} 3\n"), "{out}");
        assert!(out.contains("aqgate_queue_oldest_ready_seconds{queue=\"A\\\"Q\"} 2.000\n"), "{out}");
        assert!(out.contains("aqgate_mail_spool_backlog 7\n"), "{out}");
    }
}
