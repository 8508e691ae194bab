//! Waking long polls: a change on a queue wakes only the receives it can serve.
//!
//! Every waiting receive has a [`Slot`] of its own, registered under its queue with its
//! consumer. A change on the queue is one of two kinds ([`Change`]):
//! - [`Change::Arrived`]: a commit made exactly these new messages visible, and nothing
//!   else. Only the waiters of a consumer among the messages' deliveries are woken, each
//!   with the messages; a waiter then judges them in memory against its selector
//!   ([`super::dequeue::Filter::matches_new`]) and looks in the store again only if one
//!   passes. Everything older it has judged already, and none of it changed.
//! - [`Change::Unknown`]: older messages may have become visible (a rollback releasing
//!   locks, an expiry, a spill, another process's signal whose content is unknown):
//!   every waiter of the queue looks again.
//!
//! A slot keeps what happened since its waiter last looked ([`Pending`]); its `Notify`
//! stores a permit, so a change between a look and the wait after it is not lost. A LISTEN
//! registers one slot per agent it names, all sharing one `Notify`
//! ([`Waiters::register_shared`]), so it waits on all its queues at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::Notify;

use crate::store::{NewMessage, QueueId};

/// Message sets a waiter keeps unjudged at most; past it, it simply looks again.
const MAX_PENDING_SETS: usize = 32;

/// What changed on a queue (see the module comment).
#[derive(Clone)]
pub enum Change {
    Unknown,
    /// The only change: these messages became visible (as committed).
    Arrived(Arc<[NewMessage]>),
}

/// What happened on a waiter's queue since it last looked.
#[derive(Default)]
pub(super) struct Pending {
    /// Something it cannot judge without looking.
    pub(super) rescan: bool,
    /// New messages with a delivery to its consumer.
    pub(super) arrived: Vec<Arc<[NewMessage]>>,
}

struct Slot {
    consumer: String,
    notify: Arc<Notify>,
    pending: StdMutex<Pending>,
}

/// The waiting receives of this process, per queue.
#[derive(Default)]
pub(super) struct Waiters {
    next: std::sync::atomic::AtomicU64,
    queues: StdMutex<HashMap<QueueId, HashMap<u64, Arc<Slot>>>>,
}

/// One receive's place among the waiters of its queue; leaves when dropped.
pub(super) struct Waiting<'a> {
    waiters: &'a Waiters,
    queue: QueueId,
    id: u64,
    slot: Arc<Slot>,
}

impl Waiters {
    /// Registers a waiter of `consumer` on `queue` (before its first look, so that no
    /// change after the look goes unseen).
    pub(super) fn register(&self, queue: QueueId, consumer: &str) -> Waiting<'_> {
        self.register_shared(queue, consumer, Arc::new(Notify::new()))
    }

    /// [`Waiters::register`] with a `Notify` the caller shares between several slots (a
    /// LISTEN on several queues waits for any of them).
    pub(super) fn register_shared(&self, queue: QueueId, consumer: &str, notify: Arc<Notify>) -> Waiting<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slot =
            Arc::new(Slot { consumer: consumer.to_string(), notify, pending: StdMutex::new(Pending::default()) });
        self.lock().entry(queue).or_default().insert(id, slot.clone());
        Waiting { waiters: self, queue, id, slot }
    }

    /// Whether any receive waits on `queue` now.
    pub(super) fn any(&self, queue: QueueId) -> bool {
        self.lock().get(&queue).is_some_and(|s| !s.is_empty())
    }

    /// Tells the waiters of `queue` that it changed; returns how many were woken.
    pub(super) fn wake(&self, queue: QueueId, change: &Change) -> usize {
        let slots: Vec<Arc<Slot>> = match self.lock().get(&queue) {
            Some(s) => s.values().cloned().collect(),
            None => return 0,
        };
        let mut woken = 0;
        for slot in slots {
            {
                let mut p = slot.pending.lock().unwrap_or_else(|e| e.into_inner());
                match change {
                    Change::Unknown => {
                        p.rescan = true;
                        p.arrived.clear();
                    }
                    Change::Arrived(messages) => {
                        if !messages.iter().any(|m| m.consumers.contains(&slot.consumer)) {
                            continue;
                        }
                        if !p.rescan {
                            if p.arrived.len() >= MAX_PENDING_SETS {
                                p.rescan = true;
                                p.arrived.clear();
                            } else {
                                p.arrived.push(messages.clone());
                            }
                        }
                    }
                }
            }
            woken += 1;
            slot.notify.notify_one();
        }
        woken
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueId, HashMap<u64, Arc<Slot>>>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Waiting<'_> {
    /// What happened since the last call (and forgets it).
    pub(super) fn take(&self) -> Pending {
        std::mem::take(&mut *self.slot.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Completes once a change was told to this waiter since it last waited (or was
    /// registered).
    pub(super) async fn notified(&self) {
        self.slot.notify.notified().await;
    }

    /// The consumer this waiter receives as.
    pub(super) fn consumer(&self) -> &str {
        &self.slot.consumer
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut q = self.waiters.lock();
        if let Some(s) = q.get_mut(&self.queue) {
            s.remove(&self.id);
            if s.is_empty() {
                q.remove(&self.queue);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(consumers: &[&str]) -> NewMessage {
        NewMessage { consumers: consumers.iter().map(|c| c.to_string()).collect(), ..NewMessage::for_test([0; 16], 1) }
    }

    #[test]
    fn arrivals_wake_the_consumers_they_are_for_only() {
        let w = Waiters::default();
        let a = w.register(1, "A");
        let b = w.register(1, "B");
        let other = w.register(2, "A");
        let msgs: Arc<[NewMessage]> = vec![message(&["B"])].into();
        assert_eq!(w.wake(1, &Change::Arrived(msgs)), 1);
        assert!(a.take().arrived.is_empty());
        assert_eq!(b.take().arrived.len(), 1);
        assert_eq!(w.wake(1, &Change::Unknown), 2);
        assert!(a.take().rescan && b.take().rescan && !other.take().rescan);
        drop((a, b));
        assert!(!w.any(1) && w.any(2));
    }

    #[tokio::test]
    async fn slots_sharing_a_notify_are_woken_by_any_of_their_queues() {
        let w = Waiters::default();
        let notify = Arc::new(Notify::new());
        let a = w.register_shared(1, "", notify.clone());
        let b = w.register_shared(2, "APP1", notify.clone());
        assert_eq!(w.wake(2, &Change::Arrived(vec![message(&["OTHER"])].into())), 0, "not for APP1");
        assert_eq!(w.wake(2, &Change::Arrived(vec![message(&["APP1"])].into())), 1);
        // The permit was stored: the wait after the wake returns at once.
        notify.notified().await;
        assert!(a.take().arrived.is_empty() && b.take().arrived.len() == 1);
        drop((a, b));
        assert!(!w.any(1) && !w.any(2));
    }

    #[test]
    fn too_many_unjudged_sets_become_a_rescan() {
        let w = Waiters::default();
        let a = w.register(1, "");
        for _ in 0..=MAX_PENDING_SETS {
            w.wake(1, &Change::Arrived(vec![message(&[""])].into()));
        }
        let p = a.take();
        assert!(p.rescan && p.arrived.is_empty());
    }
}
