//! Sessions: one per HTTP client (or per mail). A session carries one open AQ transaction
//! at a time and the navigation position per (queue, consumer).
//!
//! A session that holds anything (open work, a navigation position) is a row in the store
//! (`sessions`, keyed by the SHA-256 of its id; the id itself is never stored), written in
//! the same database transaction as the effects of the request that changed it. Every
//! request works on the session as the store has it, so any process on the same store
//! continues any session, and a restart loses none. A version number guards the row: a
//! write that finds another version (another node changed the session meanwhile, or
//! expired it) rolls its whole request back. In memory there is a lock per session id
//! while requests of it run in this process ([`Sessions`]), so that they take turns, and a
//! copy of the row as this process last wrote it: a request starts from that copy without
//! reading the row, and if another process has written it since, the request's write finds
//! another version, nothing of it happened, and it runs again from the row (see
//! `servlet`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use rand::RngCore;

use crate::clock::{MICROS_PER_SEC, Micros};
use crate::store::{Position, QueueId, SessionRow, StoreTx};

/// 128 random bits, hex: unguessable, issued by the server only.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// What the store keeps of a session id: its SHA-256 (a leaked table is no session token).
pub fn id_hash(id: &str) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, id.as_bytes()).as_ref().to_vec()
}

/// The part of a session that lives in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionState {
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
    /// On queues with message grouping: the group the navigation is in, per (queue,
    /// consumer), beside its position.
    pub groups: HashMap<(QueueId, String), GroupAt>,
}

/// The message group a consumer's navigation is in (queues with message grouping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupAt {
    pub group: i64,
    /// The sort key of the group's first message when the navigation entered it: where
    /// NEXT_TRANSACTION looks for the next group.
    pub start: Position,
}

/// A stored position: `[queue, consumer, prio_key, seq]`, and in a group
/// `[queue, consumer, prio_key, seq, group, start prio_key, start seq]`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum StoredPosition {
    Plain(QueueId, String, i64, i64),
    Grouped(QueueId, String, i64, i64, i64, i64, i64),
}

impl SessionState {
    fn fresh() -> Self {
        Self {
            txn: random_id(),
            pending: false,
            dequeued: false,
            enqueued: 0,
            positions: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    /// Starts a fresh transaction after commit or rollback. Navigation starts over too:
    /// after a transaction boundary, NEXT_MESSAGE sees the queue from its head again, so a
    /// consumer never misses a message that sorts before its old position.
    pub fn end_transaction(&mut self) {
        *self = Self::fresh();
    }

    /// Whether there is anything to keep between requests.
    pub fn holds_anything(&self) -> bool {
        self.pending || !self.positions.is_empty()
    }

    /// Positions as stored: `[[queue, consumer, prio_key, seq], ...]` (with the group, see
    /// [`GroupAt`], three more numbers), sorted.
    pub fn positions_json(&self) -> String {
        let mut v: Vec<_> = self
            .positions
            .iter()
            .map(|((q, c), p)| {
                let mut e = vec![serde_json::json!(q), serde_json::json!(c), p.prio_key.into(), p.seq.into()];
                if let Some(g) = self.groups.get(&(*q, c.clone())) {
                    e.extend([g.group.into(), g.start.prio_key.into(), g.start.seq.into()]);
                }
                ((*q, c.clone(), p.prio_key, p.seq), e)
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let v: Vec<_> = v.into_iter().map(|(_, e)| e).collect();
        serde_json::to_string(&v).unwrap_or_else(|_| "[]".into())
    }

    /// The state a store row holds; `None` if its positions are not readable.
    pub fn from_row(row: &SessionRow) -> Option<Self> {
        let v: Vec<StoredPosition> = serde_json::from_str(&row.positions).ok()?;
        let mut positions = HashMap::new();
        let mut groups = HashMap::new();
        for p in v {
            match p {
                StoredPosition::Plain(q, c, prio_key, seq) => {
                    positions.insert((q, c), Position { prio_key, seq });
                }
                StoredPosition::Grouped(q, c, prio_key, seq, group, sp, ss) => {
                    positions.insert((q, c.clone()), Position { prio_key, seq });
                    groups.insert((q, c), GroupAt { group, start: Position { prio_key: sp, seq: ss } });
                }
            }
        }
        Some(Self {
            txn: row.txn.clone(),
            pending: row.pending,
            dequeued: row.dequeued,
            enqueued: u64::try_from(row.enqueued).unwrap_or(0),
            positions,
            groups,
        })
    }
}

/// A request's claim on an idempotency key: the response is recorded with the request's
/// effects, in its transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyClaim {
    pub key: String,
    /// SHA-256 of the request body: a retry must be the same request.
    pub request_hash: Vec<u8>,
}

/// A message's times and enqueuing agent, as a propagation job carries them from source to
/// destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// When the message was first enqueued.
    pub enq_time: Micros,
    /// The end of its delay, if it has one (past or future).
    pub delay_until: Option<Micros>,
    /// When it expires, if ever.
    pub expire_at: Option<Micros>,
    /// The agent that enqueued it to the source (its ENQ_USER_ID): a local copy keeps it,
    /// since the job only moves what that agent sent.
    pub enq_user_id: Option<String>,
    /// The message it copies (and, for a copy in an exception queue, why it is there).
    pub origin: Option<crate::store::Origin>,
}

impl Carried {
    /// The remaining delay and expiration at `now`, in whole seconds as IDAP counts them
    /// (the expiration counted from the end of the delay, rounded up so that a message
    /// never expires early): for a destination that takes only IDAP.
    pub fn remaining_secs(&self, now: Micros) -> (Option<i64>, Option<i64>) {
        let ceil = |us: i64| (us + MICROS_PER_SEC - 1) / MICROS_PER_SEC;
        let delay_end = self.delay_until.filter(|t| *t > now);
        let delay = delay_end.map(|t| ceil(t - now));
        let from = delay_end.map_or(now, |_| now + delay.unwrap_or(0) * MICROS_PER_SEC);
        let expiration = self.expire_at.map(|t| ceil(t - from).max(1));
        (delay, expiration)
    }
}

#[derive(Debug)]
pub struct Session {
    pub id: String,
    /// The effective agent (upper-case name).
    pub agent: String,
    pub txn: String,
    pub pending: bool,
    pub dequeued: bool,
    pub enqueued: u64,
    pub positions: HashMap<(QueueId, String), Position>,
    /// See [`SessionState::groups`].
    pub groups: HashMap<(QueueId, String), GroupAt>,
    pub last_used: Micros,
    /// The version of the session's row in the store; `None` while it has none (a session
    /// that never held anything costs no row).
    pub stored: Option<i64>,
    /// False when writes of the open transaction may have been lost by the database (see
    /// `SessionRow::intact`): its commit is refused.
    pub intact: bool,
    /// `IDAP:Header` entries of the request being performed.
    pub headers: Vec<crate::idap::model::XmlNode>,
    /// The connection the request being performed came on (0: unknown): the store's
    /// group commit waits a moment for a connection it has just answered (see
    /// `store::regulars`).
    pub origin: u64,
    /// The request being performed, abandoned by its client (see [`Abandon`]).
    pub abandon: Option<Arc<Abandon>>,
    /// The idempotency key of the request being performed.
    pub idempotency: Option<IdempotencyClaim>,
    /// The session is one batch of a propagation job, moving other agents' messages. Never
    /// set for a client.
    /// - Its receives take messages still in their delay too, and record each message's
    ///   times in `received`;
    /// - its sends keep a `sender_id` as given (instead of the session's agent) and give
    ///   the messages the times and enqueuing agent in `carry` (the original enqueue time,
    ///   the same delay end and expiry, the source's ENQ_USER_ID) instead of counting them
    ///   from now and recording the job's agent;
    /// - its rollbacks do not count against the messages (the destination failed);
    /// - its row goes when its transaction ends (`seal`).
    pub propagates: bool,
    /// A propagation session whose receives take only messages whose delay is over (a
    /// gateway job's: a broker has no delay to carry it on).
    pub ready_only: bool,
    /// The times of the messages the last receive returned, in their order (a propagation
    /// job's session only).
    pub received: Vec<Carried>,
    /// The times the next send gives its messages, in their order (a propagation job's
    /// session only; a message beyond the list is timed as a client's is).
    pub carry: Vec<Carried>,
    /// How many messages one AQXmlReceive may take here (all in one database
    /// transaction): 1 for a client, a job's batch size for a propagation job.
    pub max_messages: u32,
    /// The `AQ-Schedule` (and `AQ-Client-Timezone`) headers of the request being
    /// performed: when its messages to a remote queue space may be dequeued there.
    pub schedule: Option<super::schedule::ClientSchedule>,
    /// The broker message ids an inbound gateway job's next request enqueues: recorded in
    /// the request's transaction (`StoreTx::gateway_seen_put`, under the session's agent),
    /// so a redelivered one is known to be here. Never set for a client.
    pub seen: Vec<String>,
    /// The AQ message ids an outbound gateway job had in doubt whose dequeue the next
    /// request commits: their doubt goes in the same transaction
    /// (`StoreTx::gateway_doubt_clear`). Never set for a client.
    pub settled: Vec<String>,
    /// What the commit of the open transaction adds to its propagation job's counts,
    /// in that commit's database transaction (`StoreTx::job_tally`). Never set for a client.
    pub tally: Option<JobTally>,
    /// A propagation job's batch whose receive and send may share one database
    /// transaction (see [`HeldTx`]). Never set for a client.
    pub one_transaction: bool,
    /// The database transaction a `one_transaction` batch's receive left open for its send.
    pub held: HeldTx,
}

/// A propagation job's batch, as its job's counts see it (see [`Session::tally`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTally {
    pub job: String,
    pub propagated: i64,
    pub exceptions: i64,
}

impl JobTally {
    /// `n` messages to the destination.
    pub fn moved(job: &str, n: usize) -> Self {
        Self { job: job.to_string(), propagated: i64::try_from(n).unwrap_or(i64::MAX), exceptions: 0 }
    }

    /// `n` messages to the job's exception queue.
    pub fn excepted(job: &str, n: usize) -> Self {
        Self { job: job.to_string(), propagated: 0, exceptions: i64::try_from(n).unwrap_or(i64::MAX) }
    }
}

/// The database transaction a propagation batch's receive holds open for the send that
/// ends the batch (`Store::holds_transactions`): the messages are removed from the source
/// in it and their copies written in it, and one commit makes both durable — no session row,
/// no second commit; a crash or a rollback puts everything back as it was. The send commits
/// it, or (without commit) leaves it held for a later commit, so that the job can take its
/// next batch while this one's commit is under way. Active from the
/// receive until the commit or rollback that ends the AQ transaction; a request that fails
/// after it took the transaction loses it (dropped, so rolled back), and the session's
/// later requests then fail until it rolls back. (A mutex only so that a `Session` stays
/// `Sync`; it is reached through `&mut Session`, never locked while contended.)
#[derive(Default)]
pub struct HeldTx {
    tx: StdMutex<Option<Box<dyn StoreTx>>>,
    queue: Option<QueueId>,
    /// The queues a send that did not commit wrote to: woken by the commit.
    sent: Vec<QueueId>,
    active: bool,
}

impl std::fmt::Debug for HeldTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldTx").field("queue", &self.queue).field("active", &self.active).finish()
    }
}

impl HeldTx {
    /// Holds `tx`, which removed messages of `queue`.
    pub(super) fn hold(&mut self, tx: Box<dyn StoreTx>, queue: QueueId) {
        *self.tx.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        self.queue = Some(queue);
        self.active = true;
    }

    /// Whether the session's AQ transaction lives in a held database transaction (which
    /// may be lost: see [`HeldTx::take`]).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The held transaction, for the request that continues it; `None` once a failed
    /// request lost it. The session stays active until [`HeldTx::end`].
    pub(super) fn take(&mut self) -> Option<Box<dyn StoreTx>> {
        self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Holds `tx` again after a send into `queue` (none: it sent nothing) that did not
    /// commit it.
    pub(super) fn keep(&mut self, tx: Box<dyn StoreTx>, queue: Option<QueueId>) {
        *self.tx.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        if let Some(q) = queue.filter(|q| !self.sent.contains(q)) {
            self.sent.push(q);
        }
    }

    /// The queues the held transaction's sends wrote to (see [`HeldTx::keep`]).
    pub(super) fn sent(&mut self) -> Vec<QueueId> {
        std::mem::take(&mut self.sent)
    }

    /// Ends the hold: what is still held (to be rolled back), and the queue whose messages
    /// it removed.
    pub(super) fn end(&mut self) -> (Option<Box<dyn StoreTx>>, Option<QueueId>) {
        self.active = false;
        self.sent.clear();
        (self.take(), self.queue.take())
    }
}

impl Session {
    pub fn new(agent: &str, now: Micros) -> Self {
        let s = SessionState::fresh();
        Self {
            id: random_id(),
            agent: agent.to_string(),
            txn: s.txn,
            pending: false,
            dequeued: false,
            enqueued: 0,
            positions: HashMap::new(),
            groups: HashMap::new(),
            last_used: now,
            stored: None,
            intact: true,
            headers: Vec::new(),
            origin: 0,
            abandon: None,
            idempotency: None,
            propagates: false,
            ready_only: false,
            received: Vec::new(),
            carry: Vec::new(),
            max_messages: 1,
            schedule: None,
            seen: Vec::new(),
            settled: Vec::new(),
            tally: None,
            one_transaction: false,
            held: HeldTx::default(),
        }
    }

    /// The session `id` as its store row has it.
    pub fn from_row(id: &str, row: &SessionRow) -> Option<Self> {
        let st = SessionState::from_row(row)?;
        let mut s = Self::new(&row.agent, row.last_used);
        s.id = id.to_string();
        s.stored = Some(row.version);
        s.intact = row.intact;
        s.set_state(st);
        Some(s)
    }

    pub fn state(&self) -> SessionState {
        SessionState {
            txn: self.txn.clone(),
            pending: self.pending,
            dequeued: self.dequeued,
            enqueued: self.enqueued,
            positions: self.positions.clone(),
            groups: self.groups.clone(),
        }
    }

    pub fn set_state(&mut self, s: SessionState) {
        self.txn = s.txn;
        self.pending = s.pending;
        self.dequeued = s.dequeued;
        self.enqueued = s.enqueued;
        self.positions = s.positions;
        self.groups = s.groups;
    }

    /// See [`SessionState::end_transaction`].
    pub fn end_transaction(&mut self) {
        self.set_state(SessionState::fresh());
        self.intact = true;
    }

    pub fn id_hash(&self) -> Vec<u8> {
        id_hash(&self.id)
    }

    /// The session's row as it was last written (`None` if it has none).
    pub fn to_row(&self) -> Option<SessionRow> {
        let st = self.state();
        Some(SessionRow {
            id_hash: self.id_hash(),
            agent: self.agent.clone(),
            txn: st.txn.clone(),
            pending: st.pending,
            dequeued: st.dequeued,
            enqueued: i64::try_from(st.enqueued).unwrap_or(i64::MAX),
            positions: st.positions_json(),
            last_used: self.last_used,
            version: self.stored?,
            intact: self.intact,
        })
    }
}

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

type Turn = Arc<tokio::sync::Mutex<()>>;

/// The sessions this process is performing requests of, by id hash: requests of one
/// session take turns here (across processes the row's version keeps them apart). An
/// entry lives only while a request holds or waits for it.
#[derive(Default)]
pub struct Sessions {
    inner: StdMutex<HashMap<Vec<u8>, (Turn, usize)>>,
    /// Rows as this process last wrote them (see the module's doc).
    written: StdMutex<HashMap<Vec<u8>, SessionRow>>,
}

/// Copies of rows beyond this are not kept (requests then read the row).
const WRITTEN_LIMIT: usize = 100_000;

/// A session's turn in this process (see [`Sessions::turn`]); released when dropped.
pub struct SessionTurn<'a> {
    sessions: &'a Sessions,
    key: Vec<u8>,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for SessionTurn<'_> {
    fn drop(&mut self) {
        let mut g = self.sessions.lock();
        if let Some(e) = g.get_mut(&self.key) {
            e.1 -= 1;
            if e.1 == 0 {
                g.remove(&self.key);
            }
        }
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, (Turn, usize)>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no other request of the session `hash` runs in this process.
    pub async fn turn(&self, hash: &[u8]) -> SessionTurn<'_> {
        let m = {
            let mut g = self.lock();
            let e = g.entry(hash.to_vec()).or_insert_with(|| (Arc::default(), 0));
            e.1 += 1;
            e.0.clone()
        };
        let guard = m.lock_owned().await;
        SessionTurn { sessions: self, key: hash.to_vec(), _guard: guard }
    }

    /// The turn of session `hash` if no request of it runs in this process now.
    pub fn try_turn(&self, hash: &[u8]) -> Option<SessionTurn<'_>> {
        let m = {
            let mut g = self.lock();
            let e = g.entry(hash.to_vec()).or_insert_with(|| (Arc::default(), 0));
            e.1 += 1;
            e.0.clone()
        };
        match m.try_lock_owned() {
            Ok(guard) => Some(SessionTurn { sessions: self, key: hash.to_vec(), _guard: guard }),
            Err(_) => {
                let mut g = self.lock();
                if let Some(e) = g.get_mut(hash) {
                    e.1 -= 1;
                    if e.1 == 0 {
                        g.remove(hash);
                    }
                }
                None
            }
        }
    }

    /// Sessions with requests running or waiting in this process.
    pub fn busy(&self) -> usize {
        self.lock().len()
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, SessionRow>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The row of session `hash` as this process last wrote it.
    pub fn last_written(&self, hash: &[u8]) -> Option<SessionRow> {
        self.written().get(hash).cloned()
    }

    /// Remembers what a request of `session` left (or forgets it, if it has no row).
    pub fn wrote(&self, session: &Session) {
        let hash = session.id_hash();
        let mut g = self.written();
        match session.to_row() {
            Some(row) if g.len() < WRITTEN_LIMIT || g.contains_key(&hash) => {
                g.insert(hash, row);
            }
            _ => {
                g.remove(&hash);
            }
        }
    }

    pub fn forget(&self, hash: &[u8]) {
        self.written().remove(hash);
    }

    /// Forgets copies of rows last used before `before` (their sessions time out).
    pub fn forget_idle(&self, before: Micros) {
        self.written().retain(|_, r| r.last_used >= before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_survive_the_store() {
        let mut s = SessionState::fresh();
        s.positions.insert((3, "APP1".into()), Position { prio_key: 2, seq: 99 });
        s.positions.insert((1, String::new()), Position { prio_key: 0, seq: 7 });
        s.positions.insert((5, String::new()), Position { prio_key: 1, seq: 12 });
        s.groups.insert((5, String::new()), GroupAt { group: 77, start: Position { prio_key: 1, seq: 10 } });
        s.pending = true;
        s.enqueued = 4;
        let row = SessionRow {
            id_hash: id_hash("x"),
            agent: "SCOTT".into(),
            txn: s.txn.clone(),
            pending: s.pending,
            dequeued: s.dequeued,
            enqueued: 4,
            positions: s.positions_json(),
            last_used: 5,
            version: 2,
            intact: true,
        };
        assert_eq!(SessionState::from_row(&row), Some(s));
        assert_eq!(SessionState::from_row(&SessionRow { positions: "{".into(), ..row }), None);
    }

    #[test]
    fn the_store_never_sees_the_id() {
        let id = random_id();
        let h = id_hash(&id);
        assert_eq!(h.len(), 32);
        assert!(!hex::encode(&h).contains(&id));
        assert_eq!(h, id_hash(&id));
    }

    #[tokio::test]
    async fn requests_of_one_session_take_turns() {
        let s = Sessions::default();
        let a = s.turn(b"a").await;
        assert!(s.try_turn(b"a").is_none(), "busy");
        assert!(s.try_turn(b"b").is_some(), "another session");
        assert_eq!(s.busy(), 1);
        drop(a);
        assert_eq!(s.busy(), 0, "entries go with their last request");
        assert!(s.try_turn(b"a").is_some());
    }

    #[test]
    fn remaining_times_are_whole_seconds_rounded_up() {
        let s = MICROS_PER_SEC;
        let t =
            |delay_until, expire_at| Carried { enq_time: 0, delay_until, expire_at, enq_user_id: None, origin: None };
        // Nothing to carry.
        assert_eq!(t(None, None).remaining_secs(100 * s), (None, None));
        // In its delay: 2.5 s left become 3; the expiry 10 s after the delay end stays
        // 10 s after the later, rounded end (never earlier than it was).
        assert_eq!(t(Some(102 * s + s / 2), Some(112 * s + s / 2)).remaining_secs(100 * s), (Some(3), Some(10)));
        // Its delay is over: the expiration counts from now, rounded up, at least 1.
        assert_eq!(t(Some(90 * s), Some(104 * s + 1)).remaining_secs(100 * s), (None, Some(5)));
        assert_eq!(t(None, Some(100 * s + 1)).remaining_secs(100 * s), (None, Some(1)));
    }
}
