//! What an open transaction has enqueued, as this process saw it: the messages its commit
//! makes visible, kept (within bounds) so that the commit wakes only the long polls they
//! can serve ([`Change::Arrived`]) instead of every waiter of their queues
//! ([`Change::Unknown`], each looking in the store again).
//!
//! Messages are kept only for queues with receives waiting when they are enqueued.
//!
//! Only ever a shortcut: a transaction this process has not seen whole (one that another
//! process also enqueued in, one over the bounds, one resumed after a restart) has no
//! entry, or one whose count is not the session's, and its commit wakes every waiter as
//! before. A commit that also ends dequeues wakes every waiter too (it may release locked
//! messages).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use super::wake::Change;
use crate::clock::Micros;
use crate::store::{NewMessage, QueueId};

/// Bytes of messages kept for one transaction; past it, its commit wakes every waiter.
const PER_TRANSACTION_BYTES: usize = 256 << 10;
/// Bytes kept for all open transactions of this process together.
const TOTAL_BYTES: usize = 16 << 20;
/// Open transactions kept at once.
const MAX_TRANSACTIONS: usize = 4096;

struct Entry {
    /// Messages the transaction enqueued, all of them seen here.
    count: u64,
    bytes: usize,
    by_queue: Vec<(QueueId, Vec<NewMessage>)>,
    last: Micros,
}

#[derive(Default)]
struct Inner {
    txns: HashMap<String, Entry>,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, txn: &str) -> Option<Entry> {
        let e = self.txns.remove(txn)?;
        self.bytes -= e.bytes;
        Some(e)
    }
}

/// The messages of open transactions (see the module's documentation).
#[derive(Default)]
pub(super) struct Staged(StdMutex<Inner>);

/// What a message costs to keep, roughly.
fn size(m: &NewMessage) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    std::mem::size_of::<NewMessage>()
        + m.payload.len()
        + text(&m.corrid)
        + text(&m.sender)
        + text(&m.enq_user_id)
        + text(&m.exception_queue)
        + text(&m.enq_txn)
        + m.consumers.iter().map(|c| c.len() + std::mem::size_of::<String>()).sum::<usize>()
}

/// What a commit makes visible, per queue: the messages, or `Unknown`.
pub(super) type Visible = Vec<(QueueId, Change)>;

impl Staged {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of transaction `txn`, which had enqueued `before` messages, enqueued
    /// `rows` on `queue` (performed: its database transaction committed).
    pub(super) fn add(&self, txn: &str, before: u64, queue: QueueId, rows: &[NewMessage], now: Micros) {
        let mut g = self.inner();
        let known = g.txns.get(txn).map_or(before == 0, |e| e.count == before);
        let add: usize = rows.iter().map(size).sum();
        let (held, fresh) = g.txns.get(txn).map_or((0, true), |e| (e.bytes, false));
        if !known
            || held + add > PER_TRANSACTION_BYTES
            || g.bytes + add > TOTAL_BYTES
            || (fresh && g.txns.len() >= MAX_TRANSACTIONS)
        {
            g.remove(txn);
            return;
        }
        g.bytes += add;
        let e = g.txns.entry(txn.to_string()).or_insert_with(|| Entry {
            count: 0,
            bytes: 0,
            by_queue: Vec::new(),
            last: now,
        });
        e.count += rows.len() as u64;
        e.bytes += add;
        e.last = now;
        match e.by_queue.iter_mut().find(|(q, _)| *q == queue) {
            Some((_, v)) => v.extend(rows.iter().cloned()),
            None => e.by_queue.push((queue, rows.to_vec())),
        }
    }

    /// The commit of `txn`, which enqueued `count` messages and made `woken` queues change
    /// (with `extra`, messages of the committing request itself): what each queue's long
    /// polls are told. Forgets `txn`.
    pub(super) fn commit(
        &self,
        txn: &str,
        count: u64,
        dequeued: bool,
        woken: &[QueueId],
        extra: Option<(QueueId, Vec<NewMessage>)>,
    ) -> Visible {
        let entry = self.inner().remove(txn).filter(|e| e.count == count && !dequeued);
        let mut queues: Vec<QueueId> = Vec::with_capacity(woken.len());
        for q in woken {
            if !queues.contains(q) {
                queues.push(*q);
            }
        }
        let Some(mut entry) = entry else {
            return queues.into_iter().map(|q| (q, Change::Unknown)).collect();
        };
        if let Some((q, rows)) = extra {
            match entry.by_queue.iter_mut().find(|(x, _)| *x == q) {
                Some((_, v)) => v.extend(rows),
                None => entry.by_queue.push((q, rows)),
            }
        }
        queues
            .into_iter()
            .map(|q| match entry.by_queue.iter().position(|(x, _)| *x == q) {
                Some(i) => (q, Change::Arrived(Arc::from(std::mem::take(&mut entry.by_queue[i].1)))),
                None => (q, Change::Unknown),
            })
            .collect()
    }

    /// `txn` ended without a commit (rolled back, expired).
    pub(super) fn forget(&self, txn: &str) {
        self.inner().remove(txn);
    }

    /// Forgets transactions last added to before `before` (their sessions time out, maybe
    /// in another process).
    pub(super) fn forget_older(&self, before: Micros) {
        let mut g = self.inner();
        let old: Vec<String> = g.txns.iter().filter(|(_, e)| e.last < before).map(|(t, _)| t.clone()).collect();
        for t in old {
            g.remove(&t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(queue: QueueId, n: u8, payload: usize) -> NewMessage {
        NewMessage { payload: vec![0; payload], ..NewMessage::for_test([n; 16], queue) }
    }

    fn arrived(v: &Visible) -> Vec<(QueueId, Option<usize>)> {
        v.iter()
            .map(|(q, c)| {
                (
                    *q,
                    match c {
                        Change::Arrived(m) => Some(m.len()),
                        Change::Unknown => None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_transaction_seen_whole_commits_its_messages() {
        let s = Staged::default();
        s.add("t", 0, 1, &[msg(1, 1, 10), msg(1, 2, 10)], 5);
        s.add("t", 2, 2, &[msg(2, 3, 10)], 6);
        let v = s.commit("t", 3, false, &[1, 2, 3], Some((1, vec![msg(1, 4, 1)])));
        assert_eq!(arrived(&v), vec![(1, Some(3)), (2, Some(1)), (3, None)]);
        assert_eq!(s.inner().bytes, 0);
        // Forgotten: a second commit of the same id knows nothing.
        assert_eq!(arrived(&s.commit("t", 3, false, &[1], None)), vec![(1, None)]);
    }

    #[test]
    fn anything_not_seen_here_is_unknown() {
        let s = Staged::default();
        // Another process enqueued first.
        s.add("a", 4, 1, &[msg(1, 1, 1)], 0);
        assert_eq!(arrived(&s.commit("a", 5, false, &[1], None)), vec![(1, None)]);
        // Another process enqueued in between.
        s.add("b", 0, 1, &[msg(1, 1, 1)], 0);
        assert_eq!(arrived(&s.commit("b", 2, false, &[1], None)), vec![(1, None)]);
        s.add("b2", 0, 1, &[msg(1, 1, 1)], 0);
        s.add("b2", 3, 1, &[msg(1, 2, 1)], 0);
        assert_eq!(arrived(&s.commit("b2", 4, false, &[1], None)), vec![(1, None)]);
        // With dequeues.
        s.add("c", 0, 1, &[msg(1, 1, 1)], 0);
        assert_eq!(arrived(&s.commit("c", 1, true, &[1], None)), vec![(1, None)]);
        // Over the per-transaction bound.
        s.add("d", 0, 1, &[msg(1, 1, PER_TRANSACTION_BYTES)], 0);
        assert_eq!(arrived(&s.commit("d", 1, false, &[1], None)), vec![(1, None)]);
        // Rolled back, or old.
        s.add("e", 0, 1, &[msg(1, 1, 1)], 0);
        s.forget("e");
        assert_eq!(arrived(&s.commit("e", 1, false, &[1], None)), vec![(1, None)]);
        s.add("f", 0, 1, &[msg(1, 1, 1)], 10);
        s.forget_older(11);
        assert_eq!(arrived(&s.commit("f", 1, false, &[1], None)), vec![(1, None)]);
        assert_eq!(s.inner().bytes, 0);
        assert!(s.inner().txns.is_empty());
    }

    #[test]
    fn all_transactions_together_are_bounded() {
        let s = Staged::default();
        let big = PER_TRANSACTION_BYTES / 2;
        let mut kept = 0;
        for i in 0..200 {
            s.add(&format!("t{i}"), 0, 1, &[msg(1, 1, big)], 0);
            kept = s.inner().txns.len();
        }
        assert!(s.inner().bytes <= TOTAL_BYTES);
        assert!(kept < 200 && kept >= TOTAL_BYTES / (big + 1024), "{kept}");
    }
}
