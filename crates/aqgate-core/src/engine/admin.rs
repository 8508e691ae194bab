//! What administration does by the engine's rules, without an engine of its own: the
//! message a replay puts back on its original queue (consumers by the queue's subscribers
//! and their rules, as an enqueue finds them), and ending a session with its transaction
//! rolled back, which the time manager does to idle sessions and `admin sessions --abort`
//! to one an operator names.

use super::*;
use crate::store::{NewMessage, Origin, SessionRow, StoredMessage};
use crate::topology::SortOrder;

/// The message a replay enqueues on `target` (id `qid`) for `m`, taken from exception
/// queue `from`: a new message id; ORIGINAL_MSGID `m`'s and ORIGINAL_QUEUE_NAME the
/// exception queue; the payload, priority, correlation, sender, enqueuing agent and
/// exception queue `m` had; enqueued `now`, ready at once, no expiration, no failed
/// dequeues; `txn_id` as its ENQ_TXN_ID. Committed when its transaction commits.
pub fn replayed(
    resolved: &Resolved,
    target: &QueueInfo,
    qid: QueueId,
    m: &StoredMessage,
    from: QueueId,
    now: Micros,
    txn_id: &str,
) -> Result<NewMessage, AqError> {
    let mut row = NewMessage {
        msgid: *uuid::Uuid::now_v7().as_bytes(),
        queue: qid,
        corrid: m.corrid.clone(),
        priority: m.priority,
        enq_time: now,
        delay_until: None,
        expire_at: None,
        sender: m.sender.clone(),
        enq_user_id: m.enq_user_id.clone(),
        exception_queue: m.exception_queue.clone(),
        payload: m.payload.clone(),
        enq_txn: None,
        consumers: Vec::new(),
        prio_key: match target.sort {
            SortOrder::EnqTime => 0,
            SortOrder::PriorityEnqTime => m.priority,
            SortOrder::EnqTimePriority => now,
        },
        spilled: false,
        group: None,
        enq_txn_id: Some(txn_id.to_string()),
        origin: Some(Origin { msgid: m.msgid, queue: from, why: None }),
    };
    row.consumers = if target.multi_consumer {
        let work = work::Work::new(work::ConditionLimits::default(), crate::metrics::Counter::default());
        let types = &resolved.catalog.types;
        let view = context::MessageContext::for_new(&row, &target.name, &target.payload, types);
        let mut names = Vec::new();
        for s in &target.subscribers {
            let takes = match &s.rule {
                None => true,
                Some(r) => work.eval(&|| format!("rule of subscriber {}", s.name), r, &view, row.payload.len())?,
            };
            if takes {
                names.push(s.name.clone());
            }
        }
        names
    } else {
        vec![String::new()]
    };
    if row.consumers.is_empty() {
        return Err(AqError::client(
            code::NO_RECIPIENTS,
            format!("no recipients: no subscriber of queue {} takes the message", target.name),
        ));
    }
    Ok(row)
}

/// Ends session `row` if it is still at its version (and, with `idle_before`, still last
/// used before then): its row goes, a tombstone until `until` says whether it had work,
/// and its transaction is rolled back (a failed dequeue counted unless it is a propagation
/// job's), all in one store transaction. `None` when the session changed or ended
/// meanwhile; else the queues whose messages it released.
pub async fn end_session(
    store: &dyn Store,
    resolved: &Resolved,
    row: &SessionRow,
    idle_before: Option<Micros>,
    until: Micros,
    now: Micros,
) -> Result<Option<Vec<QueueId>>, AqError> {
    let mut tx = store.begin().await?;
    // First, so that of several processes exactly one goes on (the others wait for its
    // row lock and then find the row gone).
    if !tx.session_end(&row.id_hash, row.version, idle_before, Some((&row.agent, row.pending, until))).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    // A propagation job's batch is not the message's failure (see `Engine::rollback`):
    // a job that restarts, or a batch that outlived the session timeout, leaves its
    // messages' retry counts as they were.
    let counts = !crate::topology::propagation::is_job_agent(&row.agent);
    let woken = if row.pending { rollback_work(&mut *tx, resolved, &row.txn, counts, now).await? } else { Vec::new() };
    tx.commit().await?;
    Ok(Some(woken))
}
