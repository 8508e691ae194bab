//! The connections a link's jobs share (`max_connections`): per link, up to that many slots,
//! each holding one broker connection while a job uses it.
//!
//! - A job takes the slot with the fewest jobs on it, opening its connection if it has none;
//!   one job connects at a time per link, so jobs that (re)connect together wait for that
//!   connection rather than each opening one.
//! - A job whose link failed says so ([`Shared::failed`]): when the connection itself is
//!   down the slot is emptied and its generation moves on, so every job on it sees its
//!   handle stale, drops it and reconnects (to one new connection); a failure of the job's
//!   own channel or consumer on a healthy connection leaves the others alone.
//! - The last job to let go of a slot closes it (a job outside its schedule's window, or
//!   removed, holds nothing at the broker).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A broker connection jobs can share.
pub(crate) trait Conn: Send + Sync + 'static {
    /// Whether the connection is up (not closed, not reconnecting on its own).
    fn healthy(&self) -> bool;
}

#[cfg(feature = "rabbitmq")]
impl Conn for lapin::Connection {
    fn healthy(&self) -> bool {
        self.status().connected()
    }
}

#[cfg(feature = "nats")]
impl Conn for async_nats::Client {
    fn healthy(&self) -> bool {
        self.connection_state() == async_nats::connection::State::Connected
    }
}

struct Slot<C> {
    conn: Option<Arc<C>>,
    /// Moves on whenever the slot is emptied: handles of an older one are stale.
    generation: u64,
    users: usize,
}

struct PerLink<C> {
    slots: Mutex<Vec<Slot<C>>>,
    /// One job connects at a time.
    connecting: tokio::sync::Mutex<()>,
}

/// The shared connections of one kind of broker, by link.
pub(crate) struct Pool<C> {
    links: Mutex<HashMap<String, Arc<PerLink<C>>>>,
}

impl<C> Default for Pool<C> {
    fn default() -> Self {
        Self { links: Mutex::new(HashMap::new()) }
    }
}

impl<C> std::fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl<C: Conn> Pool<C> {
    fn per_link(&self, link: &str) -> Arc<PerLink<C>> {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links
            .entry(link.to_string())
            .or_insert_with(|| Arc::new(PerLink { slots: Mutex::new(Vec::new()), connecting: Default::default() }))
            .clone()
    }

    /// A share of one of `link`'s `max` connections, opened with `connect` when the slot
    /// chosen has none (or a dead one).
    pub(crate) async fn take<F, Fut>(&self, link: &str, max: u32, connect: F) -> Result<Shared<C>, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<C, String>>,
    {
        let per = self.per_link(link);
        let _one = per.connecting.lock().await;
        let (slot, generation) = {
            let mut slots = per.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let max = usize::try_from(max.max(1)).unwrap_or(1);
            while slots.len() < max {
                slots.push(Slot { conn: None, generation: 0, users: 0 });
            }
            // Fewest jobs first; among equals, one that is open.
            let i = (0..max).min_by_key(|&i| (slots[i].users, slots[i].conn.is_none())).unwrap_or(0);
            let s = &mut slots[i];
            if s.conn.as_ref().is_some_and(|c| !c.healthy()) {
                empty(s);
            }
            if let Some(c) = &s.conn {
                s.users += 1;
                return Ok(Shared { conn: c.clone(), per: per.clone(), slot: i, generation: s.generation });
            }
            (i, s.generation)
        };
        let conn = Arc::new(connect().await?);
        let mut slots = per.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &mut slots[slot];
        // Nobody else fills a slot while this job connects (`connecting`).
        debug_assert!(s.conn.is_none() && s.generation == generation);
        s.generation += 1;
        s.conn = Some(conn.clone());
        s.users = 1;
        Ok(Shared { conn, per: per.clone(), slot, generation: s.generation })
    }

    /// How many of `link`'s connections are open.
    pub(crate) fn open(&self, link: &str) -> Option<usize> {
        let per = self.links.lock().unwrap_or_else(PoisonError::into_inner).get(link).cloned()?;
        let slots = per.slots.lock().unwrap_or_else(PoisonError::into_inner);
        Some(slots.iter().filter(|s| s.conn.is_some()).count())
    }
}

fn empty<C>(s: &mut Slot<C>) {
    s.conn = None;
    s.users = 0;
    s.generation += 1;
}

/// A job's share of a connection; letting go of it (drop) closes the connection when no
/// other job uses it.
pub(crate) struct Shared<C: Conn> {
    conn: Arc<C>,
    per: Arc<PerLink<C>>,
    slot: usize,
    generation: u64,
}

impl<C: Conn> std::ops::Deref for Shared<C> {
    type Target = C;
    fn deref(&self) -> &C {
        &self.conn
    }
}

impl<C: Conn> Shared<C> {
    /// Whether the connection went (another job found it down, or it is): the job lets go
    /// and takes a share again.
    pub(crate) fn stale(&self) -> bool {
        self.watch().gone()
    }

    /// A handle that tells when this connection goes, for a wait on the broker that must not
    /// outlive it (it does not count as a user of the slot).
    pub(crate) fn watch(&self) -> Watch<C> {
        Watch { conn: self.conn.clone(), per: self.per.clone(), slot: self.slot, generation: self.generation }
    }

    /// The job's link failed on this connection: when the connection is down, every job on
    /// it reconnects (to a new one); else only this job's channel or consumer failed.
    pub(crate) fn failed(&self) {
        if self.conn.healthy() {
            return;
        }
        let mut slots = self.per.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.get_mut(self.slot)
            && s.generation == self.generation
        {
            empty(s);
        }
    }
}

/// How often a wait on the broker looks at its connection's health.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Tells when a job's connection goes: down, or emptied from its slot by another job. It
/// does not count as a user of the slot: a wait holding one ends before the job lets go of
/// its share (the last share's drop empties the slot, which a watch reads as gone, and a
/// confirm still awaited would count as failed: its batch sent again, marked).
pub(crate) struct Watch<C> {
    conn: Arc<C>,
    per: Arc<PerLink<C>>,
    slot: usize,
    generation: u64,
}

impl<C: Conn> Watch<C> {
    fn gone(&self) -> bool {
        let slots = self.per.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.get(self.slot).is_none_or(|s| s.generation != self.generation) || !self.conn.healthy()
    }

    /// `f` within `limit`, given up at once when the connection goes: a client may leave a
    /// promise unanswered when its connection fails under it, and the job should reconnect
    /// then, not at the end of the bound.
    pub(crate) async fn bounded<T, E: std::fmt::Display>(
        &self,
        what: &str,
        limit: std::time::Duration,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, String> {
        let gone = async {
            loop {
                if self.gone() {
                    return;
                }
                tokio::time::sleep(WATCH_EVERY).await;
            }
        };
        tokio::select! {
            biased;
            r = tokio::time::timeout(limit, f) => match r {
                Ok(r) => r.map_err(|e| format!("{what}: {e}")),
                Err(_) => Err(format!("{what}: no answer within {} s", limit.as_secs())),
            },
            () = gone => Err(format!("{what}: the connection went down while waiting")),
        }
    }
}

impl<C: Conn> Drop for Shared<C> {
    fn drop(&mut self) {
        let mut slots = self.per.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = slots.get_mut(self.slot)
            && s.generation == self.generation
        {
            s.users = s.users.saturating_sub(1);
            if s.users == 0 {
                empty(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    struct Fake(Arc<AtomicBool>);
    impl Conn for Fake {
        fn healthy(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn jobs_share_up_to_max_connections_and_reconnect_together() {
        let pool: Pool<Fake> = Pool::default();
        let made = Arc::new(AtomicUsize::new(0));
        let up = Arc::new(AtomicBool::new(true));
        let take = |max| {
            let (made, up) = (made.clone(), up.clone());
            let pool = &pool;
            async move {
                pool.take("L", max, || async move {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok(Fake(up))
                })
                .await
                .expect("connects")
            }
        };
        let mut jobs = Vec::new();
        for _ in 0..5 {
            jobs.push(take(1).await);
        }
        assert_eq!((made.load(Ordering::SeqCst), pool.open("L")), (1, Some(1)), "five jobs, one connection");
        // A failure with the connection up: only that job's own part, nothing else moves.
        jobs[0].failed();
        assert!(jobs.iter().all(|j| !j.stale()));
        // The connection goes: every job on it is stale, and they come back on one new one.
        up.store(false, Ordering::SeqCst);
        jobs[2].failed();
        assert!(jobs.iter().all(Shared::stale));
        assert_eq!(pool.open("L"), Some(0));
        up.store(true, Ordering::SeqCst);
        let again: Vec<_> = {
            let mut v = Vec::new();
            for _ in 0..5 {
                v.push(take(1).await);
            }
            v
        };
        drop(jobs);
        assert_eq!((made.load(Ordering::SeqCst), pool.open("L")), (2, Some(1)));
        assert!(again.iter().all(|j| !j.stale()));
        // The last one to let go closes it.
        drop(again);
        assert_eq!(pool.open("L"), Some(0));
        // Two connections: jobs spread over both.
        let two: Vec<_> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(take(2).await);
            }
            v
        };
        assert_eq!((made.load(Ordering::SeqCst), pool.open("L")), (4, Some(2)));
        assert_eq!(two.iter().filter(|j| j.slot == 0).count(), 2);
    }

    #[tokio::test]
    async fn a_wait_on_the_broker_ends_when_its_connection_goes() {
        let pool: Pool<Fake> = Pool::default();
        let up = Arc::new(AtomicBool::new(true));
        let (u, u2) = (up.clone(), up.clone());
        let job = pool.take("L", 1, || async move { Ok(Fake(u)) }).await.expect("connects");
        let other = pool.take("L", 1, || async move { Ok(Fake(u2)) }).await.expect("shares");
        let limit = std::time::Duration::from_secs(30);
        // Answered: the answer.
        let w = job.watch();
        assert_eq!(w.bounded("confirm", limit, async { Ok::<_, String>(7) }).await, Ok(7));
        assert_eq!(
            w.bounded("confirm", limit, async { Err::<(), _>("nacked") }).await,
            Err("confirm: nacked".to_string())
        );
        // Never answered, and the connection goes down meanwhile: given up long before the bound.
        let started = tokio::time::Instant::now();
        let down = {
            let up = up.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                up.store(false, Ordering::SeqCst);
            }
        };
        let (r, ()) = tokio::join!(w.bounded("confirm", limit, std::future::pending::<Result<(), String>>()), down);
        let e = r.expect_err("given up");
        assert!(e.contains("connection went down"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        // Another job emptied the slot (its connection found down): gone, even if up again.
        other.failed();
        up.store(true, Ordering::SeqCst);
        let e =
            job.watch().bounded("ack", limit, std::future::pending::<Result<(), String>>()).await.expect_err("gone");
        assert!(e.contains("connection went down"), "{e}");
        // A bound still holds on a healthy connection.
        let fresh = pool.take("L", 1, || async move { Ok(Fake(up)) }).await.expect("connects again");
        let e = fresh
            .watch()
            .bounded("ack", std::time::Duration::from_millis(200), std::future::pending::<Result<(), String>>())
            .await
            .expect_err("bounded");
        assert!(e.contains("no answer within"), "{e}");
    }
}
