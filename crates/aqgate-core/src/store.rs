//! Persistence behind one interface, two native backends: SQLite (the default: a file,
//! WAL) and PostgreSQL. Each backend owns its SQL and its migrations; one conformance
//! suite (`tests/store_conformance.rs`) runs against both.
//!
//! The store knows rows, not AQ rules: the engine decides what to enqueue for whom, which
//! candidate matches a selector, and what a commit means; the store makes each of those
//! steps atomic and durable.
//!
//! Transactions of a *session* are not database transactions (10,000 open sessions must
//! not hold 10,000 connections): uncommitted work is written at once, tagged with the
//! session's transaction id (`enq_txn` on messages, `lock_txn` on deliveries — on
//! PostgreSQL a single-consumer message is its own delivery), and is
//! invisible to others until [`StoreTx::commit_session`] clears the tags. A restart runs
//! [`Store::recover`], which rolls back every tagged row.

use async_trait::async_trait;

use crate::clock::Micros;

pub use aqgate_proto::payload;

pub type QueueId = i64;

mod admin;
mod error;
mod health;
mod jobs;
mod messages;
mod notify;
mod sessions;
mod spool;
mod views;
pub use {admin::*, error::*, health::*, jobs::*, messages::*, notify::*, sessions::*, spool::*, views::*};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The store: queues, messages and the topology, with its parts [`SessionStore`],
/// [`SpoolStore`], [`NotifyStore`], [`JobStore`] and [`AdminStore`].
#[async_trait]
pub trait Store: SessionStore + SpoolStore + NotifyStore + JobStore + AdminStore + Send + Sync + 'static {
    /// Starts a database transaction: one request is all-or-nothing.
    async fn begin(&self) -> Result<Box<dyn StoreTx>>;

    /// A transaction for work that a later commit of the session publishes (rows tagged
    /// with the session's transaction): its commit need not wait until it is durable,
    /// because the publishing commit is durable and makes everything before it durable
    /// too. If the database loses such work in a crash, that commit finds fewer messages
    /// than the session enqueued ([`CommitOutcome::published`]) and the engine refuses it.
    /// The default is [`Store::begin`].
    async fn begin_provisional(&self) -> Result<Box<dyn StoreTx>> {
        self.begin().await
    }

    /// A transaction a propagation batch holds open from its receive to its send (see
    /// [`Store::holds_transactions`]): the database ends it by itself if its holder goes
    /// silent without closing the connection (a host lost, not a process killed), so that
    /// the rows it took come back. The default is [`Store::begin`].
    async fn begin_held(&self) -> Result<Box<dyn StoreTx>> {
        self.begin().await
    }

    /// Whether a write would succeed now (readiness): the database is reachable, and a
    /// small write commits (a disk that is full refuses it with [`StoreError::is_full`]).
    /// The default begins and commits an empty transaction.
    async fn probe_write(&self) -> Result<()> {
        self.begin().await?.commit().await
    }

    /// Whether the database has been refusing writes for want of space since a write was
    /// last refused (until [`Store::probe_write`] commits one again).
    fn writes_refused(&self) -> bool {
        false
    }

    /// Writes the database refused for want of space since the process started.
    fn full_refusals(&self) -> u64 {
        0
    }

    /// The database's health as last seen, without a round trip.
    fn health(&self) -> Health {
        Health::default()
    }

    /// The database's health, checked again first (one small write, as
    /// [`Store::probe_write`]) when the last check is older than a second: one check at a
    /// time, however many callers ask; a caller waits for it at most `within`, then has
    /// the last state (or [`Readiness::Unknown`] when that is stale too).
    async fn check_health(&self, within: std::time::Duration) -> Health {
        let _ = within;
        self.health()
    }

    /// Returns once the database is available again (a check committed a write), or after
    /// `at_most`: what a background duty waits on after a failure that means the database
    /// is away, instead of failing again at once. The default returns at once.
    async fn until_available(&self, at_most: std::time::Duration) {
        let _ = at_most;
    }

    /// Vacuums the store's own tables whose dead rows (left by deletes and updates) number
    /// at least `min_dead` and `fraction` of their live rows, and analyzes those whose
    /// statistics are due (rows changed since they were gathered: 10,000 and a tenth of the
    /// live rows, as autovacuum's analyze; gathered a minute ago or more), one process at a
    /// time however many share the database (another's turn is not waited for: nothing is
    /// done); what it vacuumed or analyzed. For a database whose own vacuuming is off or behind: a queue's head read
    /// steps over every dead row before it, and a table filled since its statistics were
    /// gathered is planned as the small one it was. The default (SQLite, which reuses the
    /// pages of deleted rows by itself) does nothing.
    async fn vacuum(&self, min_dead: i64, fraction: f64) -> Result<Vec<Vacuumed>> {
        let _ = (min_dead, fraction);
        Ok(Vec::new())
    }

    /// Rolls back the uncommitted work that no stored session owns (left by a process
    /// that ended without writing a session row for it, e.g. an older version). Work of
    /// stored sessions stays: their clients continue them.
    async fn recover(&self) -> Result<u64>;

    /// Topology objects: (kind, name) → JSON spec.
    async fn load_topology(&self) -> Result<Vec<(String, String, String)>>;

    /// Queue ids by name.
    async fn queue_ids(&self) -> Result<Vec<(String, QueueId)>>;

    /// Committed messages per queue id.
    async fn queue_depths(&self) -> Result<Vec<(QueueId, i64)>>;

    /// Every queue's committed messages by state at `now`, with the oldest READY one's
    /// enqueue time and how many have a `seq` above `after_seq` (one grouped read: the
    /// console's sampler and `/metrics`). Queues without messages are left out.
    async fn queue_figures(&self, now: Micros, after_seq: i64) -> Result<Vec<QueueFigures>>;

    /// The mail spool's backlog: accepted mail not yet forwarded or still owed replies
    /// (what `admin spool` lists), counted.
    async fn spool_backlog(&self) -> Result<i64>;

    /// The rows of queue table `queue_table`'s `AQ$` view for `queue` (those in the
    /// `MSG_STATE` `state` only, when given; at most `limit`, in enqueue order), every
    /// column as text (`None`: NULL), in the order of the view's columns.
    async fn view_rows(
        &self,
        queue_table: &str,
        queue: &str,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Vec<Option<String>>>> {
        let filter = ViewFilter { state: state.map(str::to_string), ..ViewFilter::default() };
        let mut page = self.view_page(queue_table, queue, &filter, None, limit).await?;
        page.rows.truncate(usize::try_from(limit).unwrap_or(0));
        Ok(page.rows)
    }

    /// A page of the rows of `queue`'s `AQ$` view (queue table `queue_table`) in the
    /// listing's order after `after` (from the start when `None`): those `filter` takes,
    /// whole messages until at least `limit` rows (one message's rows may pass it), and
    /// where the next page starts. With `filter.msgid`, that message's rows alone, looked
    /// up by its id.
    async fn view_page(
        &self,
        queue_table: &str,
        queue: &str,
        filter: &ViewFilter,
        after: Option<ViewCursor>,
        limit: i64,
    ) -> Result<ViewPage>;

    /// Replaces the copy of the in-memory buffered messages of the process `node` that the
    /// `AQ$` views show with `rows` (one row per consumer of each), or with `None` only
    /// marks it current; and drops every process's copy not marked for `SHOWN_FOR` (its
    /// process ended). Its times are the database's, as the views' are.
    async fn show_buffered(&self, node: &str, rows: Option<&[NewMessage]>) -> Result<()>;

    /// Messages whose expiration has passed and are not locked: candidates for the time
    /// manager.
    async fn due_expirations(&self, now: Micros, limit: i64) -> Result<Vec<ExpiredMessage>>;

    /// Deletes the PROCESSED messages whose retention ended at `now` (at most `limit`).
    /// Returns how many went.
    async fn purge_processed(&self, now: Micros, limit: i64) -> Result<u64>;

    /// Deletes the dequeue history of messages no longer held (at most `limit` rows).
    async fn purge_history(&self, limit: i64) -> Result<u64>;

    /// Earliest future delay end on a queue (to wake long-polls when a delay ends).
    async fn next_delay_end(&self, queue: QueueId, now: Micros) -> Result<Option<Micros>>;

    /// Waits for enqueue signals from other processes (PostgreSQL LISTEN); `None` where the
    /// backend has no such channel (SQLite: one process owns the file).
    async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>>;

    /// Signals of changes to the control plane's counters (`JobStore::control_counters`)
    /// made by any process: the value goes up with each (and when the channel was lost, so
    /// that signals may have been missed), once [`Store::listen`] is listening. `None`
    /// where the backend has no such channel (SQLite: the counters are polled).
    fn control_signals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Whether a propagation job's batch may keep one database transaction open from its
    /// receive to its send (the removes and the copies committed together, once): true
    /// where writers do not wait for each other meanwhile (PostgreSQL, row locks); SQLite
    /// has one writer, which the batch would hold while it converts its messages.
    fn holds_transactions(&self) -> bool {
        false
    }

    /// Declares that this process waits for enqueue signals on `queue` (a long-poll about
    /// to wait, a notification dispatcher with registrations on it) until the returned
    /// guard is dropped. On PostgreSQL, commits in other processes signal only queues that
    /// somebody holds interest in (see `aqgate-store`'s `postgres/interest.rs`); once this
    /// returns, whatever was committed without a signal is visible to the caller's next
    /// read, so a waiter takes interest and then looks once more before it waits. SQLite,
    /// one process per file, needs none: [`Interest::is_held`] is false.
    async fn interest(&self, _queue: QueueId) -> Result<Interest> {
        Ok(Interest::none())
    }

    /// Inserts committed messages as one atomic step (no session work involved).
    /// `source` names the producer (its client connection, `Session::origin`; 0 for none):
    /// a backend that writes concurrent requests together may wait a moment for a producer
    /// it has just answered and that came back quickly before (see [`regulars`]).
    async fn insert_committed(&self, msgs: &[NewMessage], source: u64) -> Result<()> {
        let _ = source;
        let mut tx = self.begin().await?;
        tx.insert_messages(msgs).await?;
        tx.commit().await
    }

    /// Takes the first committed, unlocked delivery matching `q` and removes it, as one
    /// atomic step: a single-consumer REMOVE that commits at once. `source` as for
    /// [`Store::insert_committed`].
    async fn take_head(&self, q: &CandidateQuery, source: u64) -> Result<Option<StoredMessage>> {
        let _ = source;
        let mut tx = self.begin().await?;
        let mut q = q.clone();
        q.limit = 1;
        loop {
            let Some(m) = tx.candidates(&q).await?.into_iter().next() else {
                tx.rollback().await?;
                return Ok(None);
            };
            if tx.remove_now(m.seq, &q.consumer, &q.txn, false).await?.removed() {
                tx.commit().await?;
                return Ok(Some(m));
            }
            q.after = Some(Position { prio_key: m.prio_key, seq: m.seq });
        }
    }
}

#[async_trait]
pub trait StoreTx: Send {
    /// Writes a session row: inserted when `row.version` is 1, else updated from version
    /// `row.version - 1`. False, with nothing written, if the row is not at that version
    /// (another request changed or ended the session). A backend may instead write it with
    /// a later statement of the transaction (PostgreSQL folds it into the next enqueue or
    /// session commit, one round trip fewer): then a row at another version makes
    /// [`StoreTx::commit`] roll back and fail with [`StoreError::SessionConflict`].
    async fn session_put(&mut self, row: &SessionRow) -> Result<bool>;

    /// Ends a session: deletes its row if it is still at `version` (and, with
    /// `idle_before`, still last used before then), leaving a tombstone until `until` that
    /// says whether it had work. False, with nothing changed, otherwise.
    async fn session_end(
        &mut self,
        id_hash: &[u8],
        version: i64,
        idle_before: Option<Micros>,
        tombstone: Option<(&str, bool, Micros)>,
    ) -> Result<bool>;

    /// Records a request performed under an idempotency key. False if the key is taken
    /// (a concurrent request with it committed first): then this transaction must roll back.
    async fn idempotency_put(&mut self, r: &IdempotencyRecord) -> Result<bool>;

    /// How many sessions of `agent` the store holds, as this transaction sees them, counted
    /// up to `limit` (a figure of `limit` means "at least that many").
    async fn sessions_of(&mut self, agent: &str, limit: i64) -> Result<i64>;

    /// Records that inbound gateway job `job` enqueued broker messages `ids`, in this
    /// transaction: false (the caller fails the request) if one is recorded already.
    async fn gateway_seen_put(&mut self, job: &str, ids: &[String], now: Micros) -> Result<bool>;

    /// Forgets that outbound gateway job `job` had `ids` in doubt: their dequeue commits in
    /// this transaction.
    async fn gateway_doubt_clear(&mut self, job: &str, ids: &[String]) -> Result<()>;

    /// Adds a propagation job's batch to its counts (`propagated`, `exceptions`), in the
    /// batch's own transaction: a batch counts exactly when it commits, whatever happens to
    /// the process after.
    async fn job_tally(&mut self, job: &str, propagated: i64, exceptions: i64) -> Result<()>;

    /// Takes the time manager's turn for this transaction: false if another process has
    /// it now (PostgreSQL advisory lock; SQLite has one process).
    async fn time_manager_turn(&mut self) -> Result<bool> {
        Ok(true)
    }

    /// Inserts messages with their deliveries, and — in the same transaction — one outbox
    /// notification per delivery whose (queue, consumer) has registrations.
    async fn insert_messages(&mut self, msgs: &[NewMessage]) -> Result<()>;
    /// [`Store::spool_put`] inside this transaction.
    async fn spool_put(&mut self, m: &SpooledMail) -> Result<SpoolPut>;
    /// [`Store::spool_attempted`] inside this transaction.
    async fn spool_attempted(
        &mut self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()>;

    /// Deliveries matching `q`, in queue order, starting after `q.after`.
    async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>>;

    /// Takes a delivery for `txn` (pending REMOVE or LOCKED). False if another session got
    /// there first.
    async fn lock(&mut self, seq: i64, consumer: &str, txn: &str, kind: LockKind) -> Result<bool>;

    /// [`StoreTx::lock`] for several deliveries of `consumer` at once (a propagation job's
    /// batch): the seqs taken, in no particular order.
    async fn lock_many(&mut self, seqs: &[i64], consumer: &str, txn: &str, kind: LockKind) -> Result<Vec<i64>> {
        let mut taken = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            if self.lock(seq, consumer, txn, kind).await? {
                taken.push(seq);
            }
        }
        Ok(taken)
    }

    /// Removes a delivery now (IMMEDIATE REMOVE); the message goes when no delivery is
    /// left, and is [`Stranded`] when only given-up ones are. `shared`: the message may
    /// have other consumers' deliveries (multi-consumer queue).
    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, shared: bool) -> Result<Removal>;

    /// [`StoreTx::remove_now`] for several messages of single-consumer queues at once (a
    /// propagation job's batch taken in the transaction that also writes its copies, see
    /// [`Store::holds_transactions`]): the seqs removed, in no particular order.
    async fn remove_singles(&mut self, seqs: &[i64], txn: &str) -> Result<Vec<i64>> {
        let mut removed = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            if self.remove_now(seq, "", txn, false).await?.removed() {
                removed.push(seq);
            }
        }
        Ok(removed)
    }

    /// Publishes `txn`'s enqueues, performs its removes (a message goes with its last
    /// delivery; one left with given-up deliveries only is reported [`Stranded`]),
    /// releases its locks. `dequeues`:
    /// whether `txn` may hold removes or locks; false when it only enqueued, and then the
    /// backend skips looking for them (four statements on PostgreSQL).
    async fn commit_session(&mut self, txn: &str, dequeues: bool) -> Result<CommitOutcome>;

    /// Discards `txn`'s enqueues and releases its dequeues (with `counts`, their retry
    /// count goes up). Returns the released removes, each with its new retry count.
    async fn rollback_session(&mut self, txn: &str, counts: bool) -> Result<Vec<Released>>;

    /// A consumer of a multi-consumer message gives up on it (too many failed dequeues):
    /// its delivery stays, marked, and no dequeue of it sees the message any more; the
    /// removes of the other consumers leave the message [`Stranded`] instead of deleting
    /// it. Returns how many deliveries the message has left that a consumer can still
    /// take; consumers of one message serialise here (and with removes of it), so exactly
    /// one of them sees 0 or is told it is stranded.
    async fn give_up(&mut self, seq: i64, consumer: &str) -> Result<i64>;

    /// Records REMOVE dequeues in the dequeue history (replacing an earlier row of the same
    /// message and consumer). A row whose delivery still exists (its remove is pending)
    /// is not shown as a dequeue.
    async fn record_dequeues(&mut self, rows: &[DequeueRecord]) -> Result<()>;

    /// Forgets the dequeue history rows of `txn`'s removes (rolled back).
    async fn forget_dequeues(&mut self, txn: &str) -> Result<()>;

    /// Makes message `seq` wait until `until` (state WAIT; a later end it has is kept): a
    /// queue's `retry_delay` after a rolled-back dequeue.
    async fn delay_message(&mut self, seq: i64, until: Micros) -> Result<()>;

    /// Moves a message to `to` (an exception queue) in state 3 with one delivery, keeping
    /// the queue it leaves, `why`, and the failed dequeues it had (its consumers' most);
    /// `forget_named`: the exception queue it named does not exist, and it names none now.
    async fn move_to_exception(&mut self, seq: i64, to: QueueId, forget_named: bool, why: Expiry) -> Result<()>;

    /// Writes a row of the audit log (its `id` is assigned) in this transaction.
    async fn audit_put(&mut self, r: &AuditRecord) -> Result<()>;

    /// Creates or replaces the registration of (queue, consumer, agent).
    async fn upsert_registration(&mut self, r: &Registration) -> Result<()>;

    /// Removes the registration of (queue, consumer, agent) and its undelivered
    /// notifications. False if there was none.
    async fn delete_registration(&mut self, queue: QueueId, consumer: &str, agent: &str) -> Result<bool>;

    /// Topology: replace the stored object set; queue ids are created for new queue names.
    async fn put_topology_object(&mut self, kind: &str, name: &str, spec: &str) -> Result<()>;
    async fn delete_topology_object(&mut self, kind: &str, name: &str) -> Result<()>;
    async fn ensure_queue(&mut self, name: &str) -> Result<QueueId>;
    /// Redefines Oracle's `AQ$<QUEUE_TABLE>` views: one per queue table of `tables`, and
    /// no other; and which queues keep their removed messages as PROCESSED, and for how
    /// long (`retained`; the others delete them).
    async fn define_views(&mut self, tables: &[QueueTableView], retained: &[Retained]) -> Result<()>;

    /// Message grouping: the groups of `q.queue` with a delivery of `q.consumer` that
    /// matches `q` (`q.after` ignored), each with the sort key of its first such delivery,
    /// in that order, those starting after `after` only, `except` left out, at most
    /// `q.limit`. Without `q.include_locked`, a group another transaction holds a delivery
    /// of (a lock of `q.consumer`'s) is left out too. A message without a group is the group
    /// `-seq`.
    async fn groups(
        &mut self,
        q: &CandidateQuery,
        after: Option<Position>,
        except: Option<i64>,
    ) -> Result<Vec<(i64, Position)>>;

    /// [`StoreTx::candidates`] of one group (see [`StoreTx::groups`]), without claiming
    /// rows: [`StoreTx::claim_group`] serialises a group's consumers.
    async fn group_candidates(&mut self, q: &CandidateQuery, group: i64) -> Result<Vec<StoredMessage>>;

    /// Claims `group` of `queue` for `consumer`'s transaction `txn` until this database
    /// transaction ends: false if another transaction holds a delivery of it for
    /// `consumer`, or (unless `wait`: then this waits for it) is claiming it now. Whoever
    /// locks or removes deliveries of a grouped queue claims their group first, in the
    /// same database transaction. A session continuing in its group waits: another
    /// consumer only looking at the group must not end it.
    async fn claim_group(&mut self, queue: QueueId, consumer: &str, group: i64, txn: &str, wait: bool) -> Result<bool>;

    /// Savepoints, for group commit: one request's work inside a shared transaction.
    async fn savepoint(&mut self) -> Result<()>;
    async fn release_savepoint(&mut self) -> Result<()>;
    async fn rollback_to_savepoint(&mut self) -> Result<()>;

    async fn commit(self: Box<Self>) -> Result<()>;

    /// Ends the transaction without keeping anything. Dropping it would too, but only
    /// when its connection is next used — until then its row locks (e.g. from
    /// `FOR UPDATE`) would hide rows from other consumers.
    async fn rollback(self: Box<Self>) -> Result<()>;
}
