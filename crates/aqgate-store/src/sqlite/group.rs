//! Group commit: concurrent requests share one database transaction, and so one fsync.
//!
//! SQLite has one writer and pays a disk sync per commit; with `synchronous=FULL` that
//! sync, not SQL, bounds throughput. [`GroupCommitStore`] wraps a store: each request
//! runs inside a savepoint of a shared transaction (so a failing request still undoes only
//! its own work), and the last request of a run of concurrent ones commits the transaction
//! for all of them. No request returns before the commit that makes its work durable, so
//! "200 means committed" holds; if that commit fails, every request of the batch fails.
//!
//! Requests of one batch see each other's writes before the batch commits. That is safe
//! because none of them answers before the batch is durable, and the batch commits or
//! fails as a whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

use crate::*;

/// `#[async_trait] impl $trait for $ty`: each method listed passes its call on to the same
/// method of `self.inner` (the wrapped store) or `self.tx()?` (the shared transaction),
/// then the methods written out, which group commit changes. A method of the trait that is
/// neither keeps the trait's default (which calls this store's own methods again).
macro_rules! forward {
    (impl $trait:ident for $ty:ty, to self.$inner:ident {
        $(async fn $name:ident(&self $(, $arg:ident: $argty:ty)*) -> $ret:ty;)*
        $(fn $sname:ident(&self) -> $sret:ty;)*
    } $($own:tt)*) => {
        #[async_trait]
        impl $trait for $ty {
            $(async fn $name(&self $(, $arg: $argty)*) -> $ret {
                self.$inner.$name($($arg),*).await
            })*
            $(fn $sname(&self) -> $sret {
                self.$inner.$sname()
            })*
            $($own)*
        }
    };
    (impl $trait:ident for $ty:ty, to self.tx()? {
        $(async fn $name:ident(&mut self $(, $arg:ident: $argty:ty)*) -> $ret:ty;)*
    } $($own:tt)*) => {
        #[async_trait]
        impl $trait for $ty {
            $(async fn $name(&mut self $(, $arg: $argty)*) -> $ret {
                self.tx()?.$name($($arg),*).await
            })*
            $($own)*
        }
    };
}

type Outcome = Option<std::result::Result<(), Failure>>;

/// Why a shared transaction failed, for each of its members: what kind of store error
/// (so a full disk stays a full disk for every request of the batch) and its text.
#[derive(Clone, Debug)]
struct Failure {
    full: bool,
    unavailable: bool,
    why: String,
}

impl Failure {
    fn of(e: &StoreError, context: &str) -> Self {
        Self { full: e.is_full(), unavailable: e.is_unavailable(), why: format!("{context}: {e}") }
    }

    fn to_error(&self) -> StoreError {
        if self.full {
            StoreError::full(self.why.clone())
        } else if self.unavailable {
            StoreError::unavailable(self.why.clone())
        } else {
            StoreError::corrupt(self.why.clone())
        }
    }
}

#[derive(Default)]
struct Batch {
    tx: Option<Box<dyn StoreTx>>,
    /// Requests whose work is in the open transaction, waiting for its commit.
    members: usize,
    /// A request left without releasing or rolling back its savepoint.
    dangling: bool,
    done: Option<watch::Sender<Outcome>>,
}

struct Lane {
    batch: Arc<Mutex<Batch>>,
    waiting: AtomicUsize,
    max_batch: usize,
}

pub struct GroupCommitStore {
    inner: Arc<dyn Store>,
    lane: Arc<Lane>,
}

impl GroupCommitStore {
    pub fn new(inner: Arc<dyn Store>, max_batch: usize) -> Self {
        let lane = Lane { batch: Arc::new(Mutex::new(Batch::default())), waiting: AtomicUsize::new(0), max_batch };
        Self { inner, lane: Arc::new(lane) }
    }
}

impl Lane {
    /// A member is done with the open transaction: commit it when nobody else is queued
    /// for it (or it is full), else hand it to the next member.
    async fn leave(&self, mut g: OwnedMutexGuard<Batch>) -> Option<watch::Receiver<Outcome>> {
        let rx = g.done.as_ref().map(watch::Sender::subscribe);
        if self.waiting.load(Ordering::SeqCst) == 0 || g.members >= self.max_batch {
            let tx = g.tx.take();
            let done = g.done.take();
            g.members = 0;
            g.dangling = false;
            let result = match tx {
                Some(tx) => tx.commit().await.map_err(|e| Failure::of(&e, "group commit failed")),
                None => Ok(()),
            };
            if let Some(d) = done {
                let _ = d.send(Some(result));
            }
        }
        rx
    }

    /// Gives up the open transaction: everything in it is rolled back and its members fail.
    fn abort(&self, g: &mut Batch, why: Failure) {
        g.tx = None; // dropping a sqlx transaction rolls it back
        g.members = 0;
        g.dangling = false;
        if let Some(d) = g.done.take() {
            let _ = d.send(Some(Err(why)));
        }
    }

    /// Undoes what a request left behind without committing.
    async fn settle(&self, g: &mut Batch) {
        if !g.dangling {
            return;
        }
        g.dangling = false;
        let rolled_back = match g.tx.as_mut() {
            Some(tx) => tx.rollback_to_savepoint().await,
            None => Ok(()),
        };
        if let Err(e) = rolled_back {
            self.abort(g, Failure::of(&e, "rolling back a request inside a group commit failed"));
        }
    }
}

forward! {
    impl Store for GroupCommitStore, to self.inner {
        async fn recover(&self) -> Result<u64>;
        async fn probe_write(&self) -> Result<()>;
        async fn check_health(&self, within: std::time::Duration) -> aqgate_core::store::Health;
        async fn load_topology(&self) -> Result<Vec<(String, String, String)>>;
        async fn queue_ids(&self) -> Result<Vec<(String, QueueId)>>;
        async fn queue_depths(&self) -> Result<Vec<(QueueId, i64)>>;
        async fn queue_figures(&self, now: Micros, after_seq: i64) -> Result<Vec<QueueFigures>>;
        async fn spool_backlog(&self) -> Result<i64>;
        async fn show_buffered(&self, node: &str, rows: Option<&[NewMessage]>) -> Result<()>;
        async fn view_page(
            &self,
            queue_table: &str,
            queue: &str,
            filter: &ViewFilter,
            after: Option<ViewCursor>,
            limit: i64
        ) -> Result<ViewPage>;
        async fn due_expirations(&self, now: Micros, limit: i64) -> Result<Vec<ExpiredMessage>>;
        async fn purge_processed(&self, now: Micros, limit: i64) -> Result<u64>;
        async fn purge_history(&self, limit: i64) -> Result<u64>;
        async fn next_delay_end(&self, queue: QueueId, now: Micros) -> Result<Option<Micros>>;
        async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>>;
        async fn interest(&self, queue: QueueId) -> Result<Interest>;
        fn writes_refused(&self) -> bool;
        fn full_refusals(&self) -> u64;
        fn health(&self) -> aqgate_core::store::Health;
        fn control_signals(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
    }

    async fn until_available(&self, at_most: std::time::Duration) {
        self.inner.until_available(at_most).await
    }

    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        let lane = self.lane.clone();
        let mut g = {
            // Counted while queued; a request dropped while waiting (client gone) must not
            // leave the count up, or the batch would never see "nobody waiting" again.
            let _queued = Queued::new(&lane.waiting);
            lane.batch.clone().lock_owned().await
        };
        lane.settle(&mut g).await;
        if g.tx.is_none() {
            match self.inner.begin().await {
                Ok(tx) => {
                    g.tx = Some(tx);
                    g.done = Some(watch::channel(None).0);
                }
                Err(e) => return Err(e),
            }
        }
        let sp = match g.tx.as_mut() {
            Some(tx) => tx.savepoint().await,
            None => Err(StoreError::corrupt("group commit lost its transaction")),
        };
        if let Err(e) = sp {
            lane.abort(&mut g, Failure::of(&e, "could not open a savepoint"));
            return Err(e);
        }
        g.dangling = true;
        Ok(Box::new(GroupTx { guard: Some(g), lane }))
    }
}

forward! {
    impl SessionStore for GroupCommitStore, to self.inner {
        async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup>;
        async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()>;
        async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>>;
        async fn session_count(&self) -> Result<i64>;
        async fn sessions_purge(&self, now: Micros, records_before: Micros) -> Result<u64>;
        async fn idempotency_get(&self, agent: &str, key: &str) -> Result<Option<IdempotencyRecord>>;
        async fn idempotency_usage(&self, agent: &str) -> Result<(i64, i64)>;
        async fn saml_assertion_once(&self, issuer: &str, id: &str, until: Micros) -> Result<bool>;
    }
}

forward! {
    impl SpoolStore for GroupCommitStore, to self.inner {
        async fn spool_release(&self, id: i64, now: Micros) -> Result<()>;
        async fn spool_due(&self, now: Micros, limit: i64) -> Result<Vec<SpooledMail>>;
        async fn spool_claim(&self, id: i64, now: Micros, owner: &str) -> Result<bool>;
        async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()>;
        async fn spool_purge(&self, before: Micros) -> Result<u64>;
        async fn spool_get(&self, id: i64) -> Result<Option<SpooledMail>>;
        async fn spool_pending(&self, limit: i64) -> Result<Vec<SpooledMail>>;
    }

    /// Mail accepted by concurrent SMTP sessions shares the servlet's batches: one disk
    /// sync for all of them. The 250 still waits for the commit that holds the mail.
    async fn spool_put(&self, m: &SpooledMail) -> Result<SpoolPut> {
        let mut tx = self.begin().await?;
        match tx.spool_put(m).await {
            Ok(put) => tx.commit().await.map(|()| put),
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    async fn spool_attempted(
        &self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        match tx.spool_attempted(id, response, error, next_attempt_at).await {
            Ok(()) => tx.commit().await,
            Err(e) => {
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }
}

forward! {
    impl NotifyStore for GroupCommitStore, to self.inner {
        async fn registrations(&self, queue: QueueId) -> Result<Vec<Registration>>;
        async fn all_registrations(&self) -> Result<Vec<Registration>>;
        async fn set_registration_secret(
            &self,
            queue: QueueId,
            consumer: &str,
            agent: &str,
            secret: Option<&str>
        ) -> Result<bool>;
        async fn notify_claim(
            &self,
            now: Micros,
            lease_until: Micros,
            limit: i64,
            shape: &ClaimShape
        ) -> Result<Vec<OutboxEntry>>;
        async fn notify_release(&self, ids: &[i64], at: Micros) -> Result<()>;
        async fn notify_defer(&self, urls: &[String], until: Micros) -> Result<u64>;
        async fn notify_delivered(&self, ids: &[i64]) -> Result<()>;
        async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()>;
        async fn notify_next_due(&self, skip_urls: &[String]) -> Result<Option<Micros>>;
        async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>>;
        async fn notify_counts(&self) -> Result<(i64, i64)>;
        async fn notify_unpark(&self, now: Micros) -> Result<u64>;
    }
}

forward! {
    impl JobStore for GroupCommitStore, to self.inner {
        async fn control_counters(&self) -> Result<(i64, i64)>;
        async fn control_ping(&self) -> Result<i64>;
        async fn agent_put(&self, agent: &AgentStatus) -> Result<()>;
        async fn agent_pong(&self, owner: &str, ping: i64) -> Result<()>;
        async fn agents(&self) -> Result<Vec<AgentStatus>>;
        async fn agents_purge(&self, before: Micros) -> Result<u64>;
        async fn job_lease(&self, name: &str, owner: &str, now: Micros, until: Micros) -> Result<bool>;
        async fn job_report(
            &self,
            name: &str,
            owner: &str,
            now: Micros,
            until: Option<Micros>,
            report: &JobReport
        ) -> Result<Option<String>>;
        async fn job_forget(&self, name: &str, owner: &str, now: Micros) -> Result<bool>;
        async fn job_reset(&self, name: &str) -> Result<bool>;
        async fn job_leases_clear(&self, owner: Option<&str>) -> Result<u64>;
        async fn job_statuses(&self) -> Result<Vec<JobStatus>>;
        async fn gateway_doubt_put(&self, job: &str, ids: &[String], now: Micros) -> Result<()>;
        async fn gateway_doubts(&self, job: &str) -> Result<Vec<(String, Micros)>>;
        async fn gateway_seen(&self, job: &str, ids: &[String]) -> Result<Vec<String>>;
        async fn gateway_seen_purge(&self, before: Micros) -> Result<u64>;
        async fn gateway_doubt_purge(&self, job: &str, queue: QueueId, consumer: &str) -> Result<u64>;
        async fn gateway_job_drop(&self, job: &str) -> Result<u64>;
        async fn gateway_link_put(&self, link: &LinkStatus) -> Result<()>;
        async fn gateway_links(&self) -> Result<Vec<LinkStatus>>;
        async fn job_backlog(
            &self,
            queue: QueueId,
            consumer: &str,
            now: Micros,
            waiting: bool
        ) -> Result<(i64, Option<Micros>)>;
    }
}

/// Counts a request queued for the batch, for as long as it waits.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One request's part of a shared transaction.
struct GroupTx {
    guard: Option<OwnedMutexGuard<Batch>>,
    lane: Arc<Lane>,
}

impl GroupTx {
    fn tx(&mut self) -> Result<&mut Box<dyn StoreTx>> {
        self.guard
            .as_mut()
            .and_then(|g| g.tx.as_mut())
            .ok_or_else(|| StoreError::corrupt("group commit transaction is gone"))
    }
}

impl Drop for GroupTx {
    fn drop(&mut self) {
        // Left without commit (a fault, or a read that found nothing): roll back this
        // request's savepoint and let the batch go on or commit.
        if let Some(g) = self.guard.take() {
            let lane = self.lane.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(async move {
                        let mut g = g;
                        lane.settle(&mut g).await;
                        let _ = lane.leave(g).await;
                    });
                }
                // No runtime: the next request settles the savepoint.
                Err(_) => drop(g),
            }
        }
    }
}

forward! {
    impl AdminStore for GroupCommitStore, to self.inner {
        async fn exception_page(&self, queue: QueueId, after_seq: i64, limit: i64) -> Result<Vec<ExceptionMessage>>;
        async fn audit_list(&self, limit: i64) -> Result<Vec<AuditRecord>>;
        async fn audit_of(&self, msgid_hex: &str) -> Result<Vec<AuditRecord>>;
        async fn message_facts(&self, msgid: &[u8; 16]) -> Result<Option<MessageFacts>>;
        async fn message_dequeues(&self, seq: i64) -> Result<Vec<DequeueFact>>;
        async fn message_copies(&self, msgid: &[u8; 16]) -> Result<Vec<CopyFact>>;
        async fn message_gateway(&self, msgid_hex: &str) -> Result<Vec<GatewayFact>>;
        async fn open_sessions(&self, limit: i64) -> Result<Vec<OpenSession>>;
    }
}

forward! {
    impl StoreTx for GroupTx, to self.tx()? {
        async fn audit_put(&mut self, r: &AuditRecord) -> Result<()>;
        async fn session_put(&mut self, row: &SessionRow) -> Result<bool>;
        async fn session_end(
            &mut self,
            id_hash: &[u8],
            version: i64,
            idle_before: Option<Micros>,
            tombstone: Option<(&str, bool, Micros)>
        ) -> Result<bool>;
        async fn idempotency_put(&mut self, r: &IdempotencyRecord) -> Result<bool>;
        async fn sessions_of(&mut self, agent: &str, limit: i64) -> Result<i64>;
        async fn gateway_seen_put(&mut self, job: &str, ids: &[String], now: Micros) -> Result<bool>;
        async fn gateway_doubt_clear(&mut self, job: &str, ids: &[String]) -> Result<()>;
        async fn job_tally(&mut self, job: &str, propagated: i64, exceptions: i64) -> Result<()>;
        async fn time_manager_turn(&mut self) -> Result<bool>;
        async fn spool_put(&mut self, m: &SpooledMail) -> Result<SpoolPut>;
        async fn spool_attempted(
            &mut self,
            id: i64,
            response: Option<&[u8]>,
            error: Option<&str>,
            next_attempt_at: Option<Micros>
        ) -> Result<()>;
        async fn insert_messages(&mut self, msgs: &[NewMessage]) -> Result<()>;
        async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>>;
        async fn lock(&mut self, seq: i64, consumer: &str, txn: &str, kind: LockKind) -> Result<bool>;
        async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, shared: bool) -> Result<Removal>;
        async fn groups(
            &mut self,
            q: &CandidateQuery,
            after: Option<Position>,
            except: Option<i64>
        ) -> Result<Vec<(i64, Position)>>;
        async fn group_candidates(&mut self, q: &CandidateQuery, group: i64) -> Result<Vec<StoredMessage>>;
        async fn claim_group(
            &mut self,
            queue: QueueId,
            consumer: &str,
            group: i64,
            txn: &str,
            wait: bool
        ) -> Result<bool>;
        async fn commit_session(&mut self, txn: &str, dequeues: bool) -> Result<CommitOutcome>;
        async fn rollback_session(&mut self, txn: &str, counts: bool) -> Result<Vec<Released>>;
        async fn give_up(&mut self, seq: i64, consumer: &str) -> Result<i64>;
        async fn define_views(&mut self, tables: &[QueueTableView], retained: &[Retained]) -> Result<()>;
        async fn record_dequeues(&mut self, rows: &[DequeueRecord]) -> Result<()>;
        async fn forget_dequeues(&mut self, txn: &str) -> Result<()>;
        async fn delay_message(&mut self, seq: i64, until: Micros) -> Result<()>;
        async fn move_to_exception(
            &mut self,
            seq: i64,
            to: QueueId,
            forget_named: bool,
            why: Expiry
        ) -> Result<()>;
        async fn upsert_registration(&mut self, r: &Registration) -> Result<()>;
        async fn delete_registration(&mut self, queue: QueueId, consumer: &str, agent: &str) -> Result<bool>;
        async fn put_topology_object(&mut self, kind: &str, name: &str, spec: &str) -> Result<()>;
        async fn delete_topology_object(&mut self, kind: &str, name: &str) -> Result<()>;
        async fn ensure_queue(&mut self, name: &str) -> Result<QueueId>;
    }

    async fn savepoint(&mut self) -> Result<()> {
        Err(StoreError::corrupt("nested group commit"))
    }
    async fn release_savepoint(&mut self) -> Result<()> {
        Err(StoreError::corrupt("nested group commit"))
    }
    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        Err(StoreError::corrupt("nested group commit"))
    }

    async fn rollback(mut self: Box<Self>) -> Result<()> {
        // This request's savepoint goes; the shared transaction goes on (or commits for
        // the others) right away, not from a spawned task.
        if let Some(mut g) = self.guard.take() {
            self.lane.settle(&mut g).await;
            // Nothing of this request needs the batch's commit: no need to wait for it.
            let _ = self.lane.leave(g).await;
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> Result<()> {
        let Some(mut g) = self.guard.take() else {
            return Err(StoreError::corrupt("group commit transaction is gone"));
        };
        let released = match g.tx.as_mut() {
            Some(tx) => tx.release_savepoint().await,
            None => Err(StoreError::corrupt("group commit transaction is gone")),
        };
        if let Err(e) = released {
            // The request's work cannot be told apart from the others': fail them all.
            self.lane.abort(&mut g, Failure::of(&e, "releasing a savepoint failed"));
            return Err(e);
        }
        g.dangling = false;
        g.members += 1;
        let Some(mut rx) = self.lane.leave(g).await else {
            return Err(StoreError::corrupt("group commit lost its outcome"));
        };
        let outcome = rx.wait_for(Option::is_some).await.map(|v| v.clone());
        match outcome {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(Some(Err(e))) => Err(e.to_error()),
            _ => Err(StoreError::corrupt("group commit was abandoned")),
        }
    }
}
