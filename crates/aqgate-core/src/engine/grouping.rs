//! Message grouping (a queue table's `message_grouping = "transactional"`): the messages
//! one transaction enqueued to a queue form a group, visible as a whole at its commit and
//! dequeued together.
//!
//! - Enqueue: every message of a grouped queue gets its transaction's group id
//!   ([`Engine::enqueue_group`]); a request that commits at once (IMMEDIATE) is a
//!   transaction of its own.
//! - Dequeue ([`Engine::take_grouped`]): groups in the order of their first message (the
//!   queue's sort order), the messages of a group in the queue's order. NEXT_MESSAGE after a
//!   message of a group takes the group's next message, and once there is none fails with
//!   25235; NEXT_TRANSACTION goes on to the first message of the next group; FIRST_MESSAGE
//!   starts again from the first group. BROWSE navigates the same way.
//! - One consumer holds a group at a time: a group of which another transaction holds a
//!   delivery (locked or removed, uncommitted) of the same consumer is skipped whole, and
//!   every take claims its group first in the request's database transaction
//!   ([`StoreTx::claim_group`]), so two sessions never take from one group at once.
//! - A propagation job's session moves messages as from any queue (in queue order, its
//!   batches as they come): it does not keep the groups (see docs/idap.md, "Message grouping").

use super::*;
use crate::engine::session::GroupAt;

impl Engine {
    /// The refusals of a receive that depend on the queue's grouping.
    pub(super) fn check_grouping(&self, queue: &QueueInfo, o: &ConsumerOptions) -> Result<(), AqError> {
        if o.navigation == NavigationMode::NextTransaction && !queue.grouped {
            return Err(AqError::invalid(format!(
                "NEXT_TRANSACTION needs message grouping, which queue {} does not have (its queue table {} has \
                 message_grouping none)",
                queue.name, queue.queue_table
            )));
        }
        if o.delivery_mode != DeliveryMode::Persistent {
            self.refuse_buffered_grouping(queue)?;
        }
        Ok(())
    }

    /// Buffered messages have no transactions, so no groups: refused on a grouped queue.
    pub(super) fn refuse_buffered_grouping(&self, queue: &QueueInfo) -> Result<(), AqError> {
        if queue.grouped {
            return Err(AqError::invalid(format!(
                "queue {} is in queue table {}, which has message grouping; buffered messages do not support \
                 grouping: use delivery_mode PERSISTENT",
                queue.name, queue.queue_table
            )));
        }
        Ok(())
    }

    /// The group of the messages a send enqueues to `queue`: `None` unless it is grouped;
    /// the session transaction's group, or a group of its own for an IMMEDIATE send.
    pub(super) fn enqueue_group(&self, queue: &QueueInfo, session: &Session, immediate: bool) -> Option<i64> {
        if !queue.grouped {
            return None;
        }
        let source = if immediate { session::random_id() } else { session.txn.clone() };
        let d = ring::digest::digest(&ring::digest::SHA256, source.as_bytes());
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_ref()[..8]);
        Some(i64::from_le_bytes(b) & i64::MAX)
    }

    /// The message a dequeue on a grouped queue takes (removed, locked or browsed in `tx`,
    /// as the request's consumer options say), and the group the navigation is in
    /// afterwards. `Err` 25235 when NEXT_MESSAGE finds the current group has no more.
    pub(super) async fn take_grouped(
        &self,
        tx: &mut dyn StoreTx,
        d: &Dequeue<'_>,
        session: &Session,
        stored: Stored,
        remove_now: bool,
    ) -> Result<(Vec<StoredMessage>, Option<GroupAt>), AqError> {
        let Dequeue { resolved, queue, qid, consumer, filter, .. } = *d;
        let o = d.options();
        let browse = o.dequeue_mode == DequeueMode::Browse;
        let key = (qid, consumer.to_string());
        let current = session.groups.get(&key).copied();
        let base = CandidateQuery {
            queue: qid,
            consumer: consumer.to_string(),
            txn: session.txn.clone(),
            now: self.now(),
            after: None,
            corrid: filter.corrid.clone(),
            msgid: filter.msgid,
            include_locked: browse,
            include_waiting: false,
            limit: 1,
            stored,
        };
        let take = Take { resolved, queue, o, filter, remove_now, browse };
        match (o.navigation, current) {
            (NavigationMode::NextMessage, Some(g)) => {
                let after = session.positions.get(&key).copied();
                let claimed = browse || tx.claim_group(qid, consumer, g.group, &session.txn, true).await?;
                match if claimed { take.in_group(tx, &base, g.group, after).await? } else { None } {
                    Some(m) => Ok((vec![m], Some(g))),
                    None => Err(AqError::client(
                        code::FETCHED_ALL_IN_GROUP,
                        format!(
                            "fetched all messages in current transaction from {}: NEXT_TRANSACTION goes on to the \
                             next group",
                            queue.name
                        ),
                    )),
                }
            }
            (navigation, current) => {
                let (from, except) = match (navigation, current) {
                    (NavigationMode::NextTransaction, Some(g)) => (Some(g.start), Some(g.group)),
                    _ => (None, None),
                };
                // As without groups, REMOVE and LOCKED wrap around once: a group that sorts
                // before the current one (a higher priority) is not starved.
                let passes: &[Option<Position>] = if from.is_some() && !browse { &[from, None] } else { &[from] };
                for &from in passes {
                    let mut after = from;
                    loop {
                        let q = CandidateQuery { limit: SCAN_BATCH, ..base.clone() };
                        let groups = tx.groups(&q, after, except).await?;
                        let exhausted = (groups.len() as i64) < SCAN_BATCH;
                        for (group, first) in groups {
                            after = Some(first);
                            if !browse && !tx.claim_group(qid, consumer, group, &session.txn, false).await? {
                                continue;
                            }
                            if let Some(m) = take.in_group(tx, &base, group, None).await? {
                                return Ok((vec![m], Some(GroupAt { group, start: first })));
                            }
                        }
                        if exhausted {
                            break;
                        }
                    }
                }
                Ok((Vec::new(), current))
            }
        }
    }
}

/// What a grouped dequeue takes, and how.
struct Take<'a> {
    resolved: &'a Resolved,
    queue: &'a QueueInfo,
    o: &'a ConsumerOptions,
    filter: &'a Filter,
    remove_now: bool,
    browse: bool,
}

impl Take<'_> {
    /// The first message of `group` after `after` that matches the filter, taken.
    async fn in_group(
        &self,
        tx: &mut dyn StoreTx,
        base: &CandidateQuery,
        group: i64,
        after: Option<Position>,
    ) -> Result<Option<StoredMessage>, AqError> {
        let limit = if self.filter.has_condition() { SCAN_BATCH } else { 1 };
        let mut q = CandidateQuery { after, limit, ..base.clone() };
        loop {
            let batch = tx.group_candidates(&q, group).await?;
            let exhausted = (batch.len() as i64) < limit;
            for m in batch {
                q.after = Some(Position { prio_key: m.prio_key, seq: m.seq });
                if !self.filter.matches(&m, self.queue, self.resolved)? {
                    continue;
                }
                let taken = if self.browse {
                    true
                } else if self.o.dequeue_mode == DequeueMode::Remove && self.remove_now {
                    match tx.remove_now(m.seq, &q.consumer, &q.txn, self.queue.multi_consumer).await? {
                        Removal::Missed => false,
                        Removal::Removed => true,
                        // The consumers left gave up on it: it moves now.
                        Removal::Stranded(s) => {
                            move_stranded(tx, self.resolved, &[s]).await?;
                            true
                        }
                    }
                } else {
                    let kind =
                        if self.o.dequeue_mode == DequeueMode::Locked { LockKind::Locked } else { LockKind::Remove };
                    tx.lock(m.seq, &q.consumer, &q.txn, kind).await?
                };
                if taken {
                    return Ok(Some(m));
                }
            }
            if exhausted {
                return Ok(None);
            }
        }
    }
}
