//! What the `AQ$` views show of the buffered messages in this process's memory (Oracle's
//! views report buffered messages too): after each time manager round in which they
//! changed, and every [`REFRESH`] while there are any, the process writes a bounded copy of
//! them to the store ([`Store::show_buffered`]), replacing its last one. A copy not
//! rewritten for [`SHOWN_FOR`] is its ended process's, and no view shows it.

use super::*;

/// Rows (a message for one consumer each) one process shows at most.
pub const SHOWN_ROWS: usize = 1_000;
/// Payload bytes one process shows at most; a payload past them shows as NULL.
pub const SHOWN_PAYLOAD_BYTES: usize = 1 << 20;
/// A copy counts this long after it was written.
pub const SHOWN_FOR: Micros = 5 * MICROS_PER_SEC;
/// A copy with messages is written again after this long, changed or not.
const REFRESH: Micros = 2 * MICROS_PER_SEC;

/// The last copy written: this process's name for it, after how many changes, when, and
/// whether it held any message.
pub(in crate::engine) struct Shown {
    node: String,
    changes: u64,
    at: Micros,
    any: bool,
}

impl Shown {
    pub(super) fn new() -> Self {
        Self { node: crate::engine::session::random_id(), changes: 0, at: Micros::MIN, any: false }
    }
}

/// A copy to write: the messages (each with its consumers; `None`: the last copy is still
/// current, only marked so), and the changes it reflects.
pub(in crate::engine) struct Copy {
    pub node: String,
    pub rows: Option<Vec<NewMessage>>,
    changes: u64,
}

impl Buffers {
    /// The copy to write at `now`, if the last one is out of date: the first messages of
    /// each queue in dequeue order, [`SHOWN_ROWS`] consumers' rows and [`SHOWN_PAYLOAD_BYTES`]
    /// of payload at most; or, when it is current but not marked so for [`REFRESH`] (or
    /// `always`), a mark. (Each write also drops the copies of ended processes.)
    pub(in crate::engine) fn copy_to_show(&self, now: Micros, always: bool) -> Option<Copy> {
        let held = self.held();
        let (node, changed, mark) = {
            let shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
            let empty = held.queues.values().all(|b| b.msgs.is_empty());
            let changed = held.changes != shown.changes && (shown.any || !empty);
            let mark = always || (!empty && now.saturating_sub(shown.at) >= REFRESH);
            (shown.node.clone(), changed, mark)
        };
        if !changed {
            return mark.then_some(Copy { node, rows: None, changes: held.changes });
        }
        let (mut rows, mut count, mut bytes) = (Vec::new(), 0, 0);
        let mut queues: Vec<_> = held.queues.iter().collect();
        queues.sort_unstable_by_key(|(q, _)| **q);
        'all: for (_, b) in queues {
            for m in b.msgs.values() {
                let consumers = m.consumers.len().max(1);
                if count + consumers > SHOWN_ROWS {
                    break 'all;
                }
                count += consumers;
                let payload = if bytes + m.payload.len() <= SHOWN_PAYLOAD_BYTES {
                    bytes += m.payload.len();
                    m.payload.clone()
                } else {
                    Vec::new()
                };
                rows.push(NewMessage {
                    msgid: m.msgid,
                    queue: m.queue,
                    corrid: m.corrid.clone(),
                    priority: m.priority,
                    enq_time: m.enq_time,
                    delay_until: m.delay_until,
                    expire_at: m.expire_at,
                    sender: m.sender.clone(),
                    enq_user_id: m.enq_user_id.clone(),
                    exception_queue: m.exception_queue.clone(),
                    payload,
                    enq_txn: None,
                    consumers: if m.consumers.is_empty() { vec![String::new()] } else { m.consumers.clone() },
                    prio_key: m.prio_key,
                    spilled: false,
                    group: m.group,
                    enq_txn_id: m.enq_txn_id.clone(),
                    origin: m.origin,
                });
            }
        }
        Some(Copy { node, rows: Some(rows), changes: held.changes })
    }

    /// `copy` was written at `now`.
    pub(in crate::engine) fn shown(&self, copy: &Copy, now: Micros) {
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        let any = copy.rows.as_ref().map_or(shown.any, |r| !r.is_empty());
        let changes = if copy.rows.is_some() { copy.changes } else { shown.changes };
        *shown = Shown { node: std::mem::take(&mut shown.node), changes, at: now, any };
    }
}
