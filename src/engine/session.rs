//! Sessions: one per HTTP client (or per mail). A session carries one open AQ transaction
//! at a time and the navigation position per (queue, consumer). Sessions live in memory;
//! their uncommitted work lives in the store, tagged with the transaction id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use rand::RngCore;
use tokio::sync::Mutex;

use crate::clock::Micros;
use crate::store::{Position, QueueId};

/// 128 random bits, hex: unguessable, issued by the server only.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

#[derive(Debug)]
pub struct Session {
    pub id: String,
    /// The effective agent (upper-case name).
    pub agent: String,
    /// The open transaction's id: tags uncommitted rows in the store.
    pub txn: String,
    /// Whether the transaction has uncommitted work.
    pub pending: bool,
    /// Whether that work may include removes or locks (ON_COMMIT dequeues): a commit of
    /// enqueues alone skips looking for them.
    pub dequeued: bool,
    /// How many messages the transaction enqueued so far (its commit must publish as
    /// many: see `Store::begin_provisional`).
    pub enqueued: u64,
    pub positions: HashMap<(QueueId, String), Position>,
    pub last_used: Micros,
    /// Set when the session timed out and was rolled back: a request that was already on
    /// its way must not use it.
    pub closed: bool,
    /// `IDAP:Header` entries of the request being performed.
    pub headers: Vec<crate::idap::model::XmlNode>,
    /// The connection the request being performed came on (0: unknown): the store's
    /// group commit waits a moment for a connection it has just answered (see
    /// `store::regulars`).
    pub origin: u64,
    /// The request being performed, abandoned by its client (see [`Abandon`]).
    pub abandon: Option<Arc<Abandon>>,
}

impl Session {
    pub fn new(agent: &str, now: Micros) -> Self {
        Self {
            id: random_id(),
            agent: agent.to_string(),
            txn: random_id(),
            pending: false,
            dequeued: false,
            enqueued: 0,
            positions: HashMap::new(),
            last_used: now,
            closed: false,
            headers: Vec::new(),
            origin: 0,
            abandon: None,
        }
    }

    /// Starts a fresh transaction after commit or rollback. Navigation starts over too:
    /// after a transaction boundary, NEXT_MESSAGE sees the queue from its head again, so a
    /// consumer never misses a message that sorts before its old position.
    pub fn end_transaction(&mut self) {
        self.txn = random_id();
        self.pending = false;
        self.dequeued = false;
        self.enqueued = 0;
        self.positions.clear();
    }
}

pub type SessionRef = Arc<Mutex<Session>>;

/// Raised when the client of the request being performed has gone away (its HTTP
/// connection closed): a long poll then stops waiting instead of taking a message that
/// nobody would receive.
#[derive(Debug, Default)]
pub struct Abandon {
    flag: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Abandon {
    pub fn abandon(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_abandoned(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once [`Abandon::abandon`] was called.
    pub async fn abandoned(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_abandoned() {
                return;
            }
            n.await;
        }
    }
}

/// Where an expired session's id goes, so its client is told its work was rolled back.
const TOMBSTONE_LIMIT: usize = 100_000;

#[derive(Default)]
pub struct Sessions {
    inner: StdMutex<SessionsInner>,
}

#[derive(Default)]
struct SessionsInner {
    live: HashMap<String, (SessionRef, String)>,
    /// Expired sessions that had uncommitted work (id → agent).
    tombstones: HashMap<String, String>,
}

pub enum Lookup {
    Live(SessionRef),
    /// The session timed out with uncommitted work, which was rolled back.
    Expired,
    Unknown,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, SessionsInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn create(&self, agent: &str, now: Micros) -> (String, SessionRef) {
        let s = Session::new(agent, now);
        let id = s.id.clone();
        let r = Arc::new(Mutex::new(s));
        self.lock().live.insert(id.clone(), (r.clone(), agent.to_string()));
        (id, r)
    }

    /// The session `id` of `agent` (canonical name). A cookie is bound to its agent: for
    /// another agent it is unknown, and an expired session's tombstone is used up only by
    /// its own agent.
    pub fn get(&self, id: &str, agent: &str) -> Lookup {
        let mut g = self.lock();
        if let Some((s, owner)) = g.live.get(id) {
            return if owner == agent { Lookup::Live(s.clone()) } else { Lookup::Unknown };
        }
        if g.tombstones.get(id).is_some_and(|owner| owner == agent) {
            g.tombstones.remove(id);
            return Lookup::Expired;
        }
        Lookup::Unknown
    }

    /// The agent a live or expired session `id` belongs to.
    pub fn owner(&self, id: &str) -> Option<String> {
        let g = self.lock();
        g.live.get(id).map(|(_, agent)| agent.clone()).or_else(|| g.tombstones.get(id).cloned())
    }

    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn all(&self) -> Vec<SessionRef> {
        self.lock().live.values().map(|(s, _)| s.clone()).collect()
    }

    /// Forgets a session; `had_work` leaves a tombstone for its client.
    pub fn remove(&self, id: &str, had_work: bool) {
        let mut g = self.lock();
        if let Some((_, agent)) = g.live.remove(id)
            && had_work
        {
            if g.tombstones.len() >= TOMBSTONE_LIMIT {
                g.tombstones.clear();
            }
            g.tombstones.insert(id.to_string(), agent);
        }
    }
}
