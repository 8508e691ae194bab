//! LISTEN (Oracle's DBMS_AQ.LISTEN): which of several agents (queue, and consumer on a
//! multi-consumer queue) has a message, waiting for the first one up to the wait time.
//! Nothing is dequeued, locked or passed: the client dequeues from the agent it is given
//! with an ordinary AQXmlReceive. Every queue is checked as a dequeue checks it (it exists,
//! the agent may dequeue from it, it is enabled for dequeue, the consumer fits its model)
//! before anything is looked at. The wait is one long poll: a slot per agent among the
//! waiters of its queue, all sharing one `Notify`, so a commit on any of them wakes it and
//! nothing polls.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::*;
use crate::store::CandidateQuery;

impl Engine {
    pub(super) async fn listen(
        &self,
        resolved: &Resolved,
        session: &mut Session,
        agent: &AgentInfo,
        req: ListenRequest,
    ) -> Result<ListenResult, AqError> {
        if req.agents.is_empty() || req.agents.len() > MAX_LISTEN_AGENTS {
            return Err(AqError::invalid(format!("a LISTEN names 1 to {MAX_LISTEN_AGENTS} agents")));
        }
        // Every agent checked before any look: (queue name, queue id, consumer, as asked).
        let mut agents: Vec<(String, QueueId, String, Option<String>)> = Vec::with_capacity(req.agents.len());
        for a in &req.agents {
            let (queue, qid, consumer) =
                self.dequeue_target(resolved, agent, &a.destination, a.consumer_name.as_deref(), "LISTEN").await?;
            let named = (!consumer.is_empty()).then(|| consumer.clone());
            if !agents.iter().any(|(_, q, c, _)| *q == qid && *c == consumer) {
                agents.push((queue.name.clone(), qid, consumer, named));
            }
        }
        let wait = req.wait_time.map(Duration::from_secs).unwrap_or(self.config.max_wait).min(self.config.max_wait);
        let deadline = self.clock.instant() + wait;
        let abandon = session.abandon.clone();
        // Registered before the first look, all on one Notify: a change on any queue after
        // the look is not missed.
        let notify = Arc::new(Notify::new());
        let slots: Vec<_> =
            agents.iter().map(|(_, qid, c, _)| self.waiters.register_shared(*qid, c, notify.clone())).collect();
        let mut interests: Option<Vec<crate::store::Interest>> = None;
        let mut waiting: Option<LongPoll<'_>> = None;
        loop {
            for s in &slots {
                s.take();
            }
            if abandon.as_ref().is_some_and(|a| a.is_abandoned()) {
                return Err(AqError::client(code::NO_MESSAGE, "the client went away during the LISTEN wait"));
            }
            if let Some(i) = self.first_ready(session, &agents).await? {
                let (name, _, _, consumer) = &agents[i];
                return Ok(ListenResult { destination: name.clone(), consumer_name: consumer.clone() });
            }
            let now_i = self.clock.instant();
            if now_i >= deadline {
                break;
            }
            if waiting.is_none() {
                match self.long_poll(&agent.name) {
                    Some(w) => waiting = Some(w),
                    None => {
                        return Err(AqError::client(
                            code::NO_MESSAGE,
                            format!(
                                "no message for any agent of the LISTEN now, and not waiting: agent {} has {} receives waiting already (--max-long-polls-per-agent)",
                                agent.name, self.config.max_long_polls_per_agent
                            ),
                        ));
                    }
                }
            }
            // Other processes' commits are signalled only to queues somebody holds interest
            // in: take it for every queue, then look once more.
            if interests.is_none() {
                if session.stored.is_some() {
                    let until = self.now().saturating_add(i64::try_from(wait.as_micros()).unwrap_or(i64::MAX));
                    self.store.session_touch(&session.id_hash(), until).await?;
                }
                let mut held = Vec::with_capacity(agents.len());
                let mut look_again = false;
                for (_, qid, _, _) in &agents {
                    let i = self.store.interest(*qid).await?;
                    look_again |= i.is_held();
                    held.push(i);
                }
                interests = Some(held);
                if look_again {
                    continue;
                }
            }
            let mut until = deadline;
            let now = self.now();
            for (_, qid, _, _) in &agents {
                if let Some(t) = self.store.next_delay_end(*qid, now).await? {
                    let d = Duration::from_micros(u64::try_from(t.saturating_sub(now)).unwrap_or(0));
                    until = until.min(now_i + d);
                }
            }
            let gone = async {
                match &abandon {
                    Some(a) => a.abandoned().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.clock.sleep_until(until) => {}
                () = notify.notified() => {}
                () = gone => {}
            }
        }
        let names: Vec<&str> = agents.iter().map(|(n, ..)| n.as_str()).collect();
        Err(AqError::client(
            code::NO_MESSAGE,
            format!("timeout in LISTEN: no message for any of its agents on {}", names.join(", ")),
        ))
    }

    /// The first agent (in the order named) with a message it could dequeue now: ready,
    /// persistent, not locked by another transaction.
    async fn first_ready(
        &self,
        session: &Session,
        agents: &[(String, QueueId, String, Option<String>)],
    ) -> Result<Option<usize>, AqError> {
        let now = self.now();
        let mut tx = self.store.begin().await?;
        for (i, (_, qid, consumer, _)) in agents.iter().enumerate() {
            let q = CandidateQuery::head(*qid, consumer.as_str(), session.txn.as_str(), now);
            match tx.candidates(&q).await {
                Ok(found) if !found.is_empty() => {
                    tx.rollback().await?;
                    return Ok(Some(i));
                }
                Ok(_) => {}
                Err(e) => {
                    tx.rollback().await?;
                    return Err(e.into());
                }
            }
        }
        tx.rollback().await?;
        Ok(None)
    }
}
