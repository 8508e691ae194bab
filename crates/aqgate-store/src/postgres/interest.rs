//! Interest in enqueue signals (PostgreSQL): a commit NOTIFYs only where somebody listens.
//!
//! PostgreSQL serializes the commits of all transactions that NOTIFY, cluster-wide (a lock
//! taken when the notification is queued and held until the commit, WAL flush included,
//! has ended), and each NOTIFY wakes every listening backend and its client. With nobody
//! long-polling that is pure cost: four concurrent committers of a one-row insert did
//! ~6.2k commits/s without NOTIFY and ~3.1k with it (pgbench, this project's machine).
//!
//! So a commit that makes messages visible on a queue signals it only if some process has
//! declared interest in it: a long-poll about to wait on it, or a notification dispatcher
//! with registrations on it. Interest is a *shared* advisory lock `(CLASS, queue)` held on
//! a connection of the process's own (not the pool's). The committing statement takes the
//! same key with `pg_try_advisory_xact_lock` (exclusive, never waits; see [`uninterested`])
//! and notifies only where that fails. The handshake leaves no gap:
//! - the try fails while an interest is held, or is being waited for → NOTIFY at commit;
//! - the try succeeded → the committer holds the key until its commit has ended, so an
//!   interest asked for meanwhile is granted only after it, and the waiter's read after
//!   [`Interests::acquire`] returned sees those messages.
//!
//! A spurious failure (two committers on one queue at once, or two queues sharing a key)
//! costs one NOTIFY, nothing else. If the interest connection is lost its locks go with
//! it: the task notices within [`PING`], connects again, takes every lock again and then
//! wakes this process's waiters on those queues, so that they look again for what was
//! committed meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::{Db, Interest, QueueId, Result};

/// The advisory lock class of interests ("aqga").
pub(super) const CLASS: i32 = 0x6171_6761;

/// True where no process holds interest in queue `q` (and then, until the transaction
/// ends, none can take it): the condition of every NOTIFY of ours. A macro, so that SQL
/// text can include it with `concat!`; the number is [`CLASS`].
macro_rules! uninterested {
    () => {
        "pg_try_advisory_xact_lock(1634821985, (q % 2147483648)::int4)"
    };
}
pub(super) use uninterested;

/// An interest nobody holds any more is given up after this long: a client that
/// long-polls in a loop keeps it.
const LINGER: Duration = Duration::from_secs(5);
/// While interests are held, the connection is checked this often (a lost connection has
/// lost its locks).
const PING: Duration = Duration::from_secs(1);
/// An interest waits this long at most for a committer holding the key (a statement and
/// its commit).
const LOCK_TIMEOUT: &str = "10s";

/// The lock key of a queue (queue ids are a sequence: they do not reach 2^31 in practice,
/// and if they did, two queues sharing a key would only cost spurious NOTIFYs).
pub(super) fn key(q: QueueId) -> i32 {
    i32::try_from(q.rem_euclid(1 << 31)).unwrap_or(0)
}

enum Cmd {
    Acquire(QueueId, oneshot::Sender<Result<()>>),
    Release(QueueId),
    /// Wake this process's waiters on every queue it holds interest in.
    WakeAll,
}

/// This process's interests, held by one task on one connection.
pub(super) struct Interests {
    cmd: mpsc::UnboundedSender<Cmd>,
    /// Where to wake this process's waiters after the connection was lost (the sender of
    /// the store's listen channel, once it is listening).
    wake: Arc<StdMutex<Option<mpsc::Sender<QueueId>>>>,
}

impl Interests {
    pub(super) fn start(opts: PgConnectOptions) -> Self {
        let (cmd, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(StdMutex::new(None));
        let opts = opts.application_name("aqgate interest").options([("lock_timeout", LOCK_TIMEOUT)]);
        let task = Task { opts, conn: None, held: HashMap::new() };
        tokio::spawn(task.run(rx, wake.clone()));
        Self { cmd, wake }
    }

    /// Where this process's waiters are woken (see the module comment).
    pub(super) fn wake_through(&self, tx: mpsc::Sender<QueueId>) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// A handle that wakes this process's waiters on every queue it holds interest in: for
    /// the listener, after its connection was lost (the NOTIFYs sent meanwhile are gone,
    /// and every waiter holds interest in the queue it waits on).
    pub(super) fn waker(&self) -> WakeAll {
        WakeAll(self.cmd.clone())
    }

    /// Holds interest in `queue` until the returned guard is dropped; returns once it is
    /// in force.
    pub(super) async fn acquire(&self, queue: QueueId) -> Result<Interest> {
        // The guard exists before the request is sent, so that a caller that gives up
        // waiting still gives its count back (the task sees the two in order).
        let cmd = self.cmd.clone();
        let guard = Interest::held(move || {
            let _ = cmd.send(Cmd::Release(queue));
        });
        let (tx, rx) = oneshot::channel();
        self.cmd.send(Cmd::Acquire(queue, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())??;
        Ok(guard)
    }
}

/// See [`Interests::waker`].
pub(super) struct WakeAll(mpsc::UnboundedSender<Cmd>);

impl WakeAll {
    pub(super) fn wake_all(&self) {
        let _ = self.0.send(Cmd::WakeAll);
    }
}

fn gone() -> super::StoreError {
    crate::db_error(sqlx::Error::PoolClosed)
}

/// One queue's lock: how many guards hold it, and since when nobody does.
#[derive(Default)]
struct Held {
    holders: usize,
    locked: bool,
    idle_since: Option<Instant>,
}

struct Task {
    opts: PgConnectOptions,
    conn: Option<PgConnection>,
    held: HashMap<QueueId, Held>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>, wake: Arc<StdMutex<Option<mpsc::Sender<QueueId>>>>) {
        let mut next_ping = Instant::now() + PING;
        loop {
            let mut deadline =
                if self.held.is_empty() { Instant::now() + Duration::from_secs(3600) } else { next_ping };
            if let Some(r) = self.held.values().filter_map(|h| h.idle_since).min() {
                deadline = deadline.min(r + LINGER);
            }
            let cmd = tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => Some(c),
                    None => return,
                },
                () = tokio::time::sleep_until(deadline) => None,
            };
            match cmd {
                Some(Cmd::Acquire(q, reply)) => {
                    let h = self.held.entry(q).or_default();
                    h.holders += 1;
                    h.idle_since = None;
                    let r = if h.locked { Ok(()) } else { self.lock(q).await };
                    let _ = reply.send(r);
                }
                Some(Cmd::WakeAll) => {
                    let tx = wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    if let Some(tx) = tx {
                        for q in self.held.keys() {
                            let _ = tx.try_send(*q);
                        }
                    }
                }
                Some(Cmd::Release(q)) => {
                    if let Some(h) = self.held.get_mut(&q) {
                        h.holders = h.holders.saturating_sub(1);
                        if h.holders == 0 {
                            h.idle_since = Some(Instant::now());
                        }
                    }
                }
                None => {
                    self.release_idle().await;
                    if Instant::now() >= next_ping {
                        next_ping = Instant::now() + PING;
                        if !self.held.is_empty() {
                            self.check(&wake).await;
                        }
                    }
                }
            }
        }
    }

    async fn connection(&mut self) -> Result<&mut PgConnection> {
        if self.conn.is_none() {
            self.conn = Some(PgConnection::connect_with(&self.opts).await.db()?);
        }
        self.conn.as_mut().ok_or_else(gone)
    }

    /// Takes `q`'s lock (waiting for a committer that holds the key).
    async fn lock(&mut self, q: QueueId) -> Result<()> {
        let conn = self.connection().await?;
        let r = sqlx::query("SELECT pg_advisory_lock_shared($1, $2)").bind(CLASS).bind(key(q)).execute(conn).await;
        match r {
            Ok(_) => {
                if let Some(h) = self.held.get_mut(&q) {
                    h.locked = true;
                }
                Ok(())
            }
            Err(e) => {
                if crate::connection_broken(&e) {
                    self.lost();
                }
                Err(crate::db_error(e))
            }
        }
    }

    /// Gives up the locks nobody has held for [`LINGER`].
    async fn release_idle(&mut self) {
        let now = Instant::now();
        let idle: Vec<QueueId> = self
            .held
            .iter()
            .filter(|(_, h)| h.idle_since.is_some_and(|t| now >= t + LINGER))
            .map(|(q, _)| *q)
            .collect();
        for q in idle {
            let Some(h) = self.held.remove(&q) else { continue };
            if !h.locked {
                continue;
            }
            let Some(conn) = self.conn.as_mut() else { continue };
            let r =
                sqlx::query("SELECT pg_advisory_unlock_shared($1, $2)").bind(CLASS).bind(key(q)).execute(conn).await;
            if let Err(e) = r {
                tracing::warn!(error = %e, queue = q, "giving up an interest");
                if crate::connection_broken(&e) {
                    self.lost();
                }
            }
        }
    }

    /// The connection's locks are gone with it: none is held until taken again.
    fn lost(&mut self) {
        self.conn = None;
        for h in self.held.values_mut() {
            h.locked = false;
        }
    }

    /// Checks the connection; after a loss, takes every lock again and wakes this
    /// process's waiters on those queues.
    async fn check(&mut self, wake: &StdMutex<Option<mpsc::Sender<QueueId>>>) {
        if let Some(conn) = self.conn.as_mut()
            && let Err(e) = conn.ping().await
        {
            tracing::warn!(error = %e, "the interest connection was lost; taking the interests again");
            self.lost();
        }
        let again: Vec<QueueId> = self.held.iter().filter(|(_, h)| !h.locked).map(|(q, _)| *q).collect();
        let mut woken = Vec::new();
        for q in again {
            match self.lock(q).await {
                Ok(()) => woken.push(q),
                Err(e) => {
                    tracing::warn!(error = %e, queue = q, "taking an interest again");
                    break;
                }
            }
        }
        let tx = wake.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(tx) = tx {
            for q in woken {
                let _ = tx.try_send(q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fit_the_lock_and_follow_the_sql() {
        assert_eq!(key(7), 7);
        assert_eq!(key((1 << 31) + 5), 5);
        assert_eq!(key(-1), i32::MAX);
        assert!(uninterested!().contains(&format!("({CLASS},")), "the SQL names the same class");
    }
}
