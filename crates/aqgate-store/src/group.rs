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

#[async_trait]
impl Store for GroupCommitStore {
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

    async fn recover(&self) -> Result<u64> {
        self.inner.recover().await
    }

    async fn probe_write(&self) -> Result<()> {
        self.inner.probe_write().await
    }

    fn writes_refused(&self) -> bool {
        self.inner.writes_refused()
    }

    fn full_refusals(&self) -> u64 {
        self.inner.full_refusals()
    }

    async fn load_topology(&self) -> Result<Vec<(String, String, String)>> {
        self.inner.load_topology().await
    }

    async fn queue_ids(&self) -> Result<Vec<(String, QueueId)>> {
        self.inner.queue_ids().await
    }

    async fn queue_depths(&self) -> Result<Vec<(QueueId, i64)>> {
        self.inner.queue_depths().await
    }

    async fn show_buffered(&self, node: &str, rows: Option<&[NewMessage]>) -> Result<()> {
        self.inner.show_buffered(node, rows).await
    }

    async fn view_rows(
        &self,
        queue_table: &str,
        queue: &str,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Vec<Option<String>>>> {
        self.inner.view_rows(queue_table, queue, state, limit).await
    }

    async fn due_expirations(&self, now: Micros, limit: i64) -> Result<Vec<ExpiredMessage>> {
        self.inner.due_expirations(now, limit).await
    }

    async fn purge_processed(&self, now: Micros, limit: i64) -> Result<u64> {
        self.inner.purge_processed(now, limit).await
    }

    async fn purge_history(&self, limit: i64) -> Result<u64> {
        self.inner.purge_history(limit).await
    }

    async fn next_delay_end(&self, queue: QueueId, now: Micros) -> Result<Option<Micros>> {
        self.inner.next_delay_end(queue, now).await
    }

    async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>> {
        self.inner.listen().await
    }

    fn control_signals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.control_signals()
    }

    async fn interest(&self, queue: QueueId) -> Result<Interest> {
        self.inner.interest(queue).await
    }
}

#[async_trait]
impl SessionStore for GroupCommitStore {
    async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup> {
        self.inner.session_get(id_hash).await
    }

    async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()> {
        self.inner.session_touch(id_hash, until).await
    }

    async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>> {
        self.inner.sessions_idle(before, limit).await
    }

    async fn session_count(&self) -> Result<i64> {
        self.inner.session_count().await
    }

    async fn sessions_purge(&self, now: Micros, records_before: Micros) -> Result<u64> {
        self.inner.sessions_purge(now, records_before).await
    }

    async fn idempotency_get(&self, agent: &str, key: &str) -> Result<Option<IdempotencyRecord>> {
        self.inner.idempotency_get(agent, key).await
    }

    async fn idempotency_usage(&self, agent: &str) -> Result<(i64, i64)> {
        self.inner.idempotency_usage(agent).await
    }

    async fn saml_assertion_once(&self, issuer: &str, id: &str, until: Micros) -> Result<bool> {
        self.inner.saml_assertion_once(issuer, id, until).await
    }
}

#[async_trait]
impl SpoolStore for GroupCommitStore {
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

    async fn spool_release(&self, id: i64, now: Micros) -> Result<()> {
        self.inner.spool_release(id, now).await
    }

    async fn spool_due(&self, now: Micros, limit: i64) -> Result<Vec<SpooledMail>> {
        self.inner.spool_due(now, limit).await
    }

    async fn spool_claim(&self, id: i64, now: Micros, owner: &str) -> Result<bool> {
        self.inner.spool_claim(id, now, owner).await
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

    async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()> {
        self.inner.spool_replied(sent).await
    }

    async fn spool_purge(&self, before: Micros) -> Result<u64> {
        self.inner.spool_purge(before).await
    }

    async fn spool_get(&self, id: i64) -> Result<Option<SpooledMail>> {
        self.inner.spool_get(id).await
    }

    async fn spool_pending(&self, limit: i64) -> Result<Vec<SpooledMail>> {
        self.inner.spool_pending(limit).await
    }
}

#[async_trait]
impl NotifyStore for GroupCommitStore {
    async fn registrations(&self, queue: QueueId) -> Result<Vec<Registration>> {
        self.inner.registrations(queue).await
    }

    async fn all_registrations(&self) -> Result<Vec<Registration>> {
        self.inner.all_registrations().await
    }

    async fn set_registration_secret(
        &self,
        queue: QueueId,
        consumer: &str,
        agent: &str,
        secret: Option<&str>,
    ) -> Result<bool> {
        self.inner.set_registration_secret(queue, consumer, agent, secret).await
    }

    async fn notify_claim(
        &self,
        now: Micros,
        lease_until: Micros,
        limit: i64,
        shape: &ClaimShape,
    ) -> Result<Vec<OutboxEntry>> {
        self.inner.notify_claim(now, lease_until, limit, shape).await
    }

    async fn notify_release(&self, ids: &[i64], at: Micros) -> Result<()> {
        self.inner.notify_release(ids, at).await
    }

    async fn notify_defer(&self, urls: &[String], until: Micros) -> Result<u64> {
        self.inner.notify_defer(urls, until).await
    }

    async fn notify_delivered(&self, ids: &[i64]) -> Result<()> {
        self.inner.notify_delivered(ids).await
    }

    async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()> {
        self.inner.notify_failed(id, error, next_attempt_at).await
    }

    async fn notify_next_due(&self, skip_urls: &[String]) -> Result<Option<Micros>> {
        self.inner.notify_next_due(skip_urls).await
    }

    async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>> {
        self.inner.notify_pending(limit).await
    }

    async fn notify_counts(&self) -> Result<(i64, i64)> {
        self.inner.notify_counts().await
    }

    async fn notify_unpark(&self, now: Micros) -> Result<u64> {
        self.inner.notify_unpark(now).await
    }
}

#[async_trait]
impl JobStore for GroupCommitStore {
    async fn control_counters(&self) -> Result<(i64, i64)> {
        self.inner.control_counters().await
    }

    async fn control_ping(&self) -> Result<i64> {
        self.inner.control_ping().await
    }

    async fn agent_put(&self, agent: &AgentStatus) -> Result<()> {
        self.inner.agent_put(agent).await
    }

    async fn agent_pong(&self, owner: &str, ping: i64) -> Result<()> {
        self.inner.agent_pong(owner, ping).await
    }

    async fn agents(&self) -> Result<Vec<AgentStatus>> {
        self.inner.agents().await
    }

    async fn agents_purge(&self, before: Micros) -> Result<u64> {
        self.inner.agents_purge(before).await
    }

    async fn job_lease(&self, name: &str, owner: &str, now: Micros, until: Micros) -> Result<bool> {
        self.inner.job_lease(name, owner, now, until).await
    }

    async fn job_report(
        &self,
        name: &str,
        owner: &str,
        now: Micros,
        until: Option<Micros>,
        report: &JobReport,
    ) -> Result<Option<String>> {
        self.inner.job_report(name, owner, now, until, report).await
    }

    async fn job_forget(&self, name: &str, owner: &str, now: Micros) -> Result<bool> {
        self.inner.job_forget(name, owner, now).await
    }

    async fn job_reset(&self, name: &str) -> Result<bool> {
        self.inner.job_reset(name).await
    }

    async fn job_leases_clear(&self, owner: Option<&str>) -> Result<u64> {
        self.inner.job_leases_clear(owner).await
    }

    async fn job_statuses(&self) -> Result<Vec<JobStatus>> {
        self.inner.job_statuses().await
    }

    async fn gateway_doubt_put(&self, job: &str, ids: &[String], now: Micros) -> Result<()> {
        self.inner.gateway_doubt_put(job, ids, now).await
    }

    async fn gateway_doubts(&self, job: &str) -> Result<Vec<(String, Micros)>> {
        self.inner.gateway_doubts(job).await
    }

    async fn gateway_seen(&self, job: &str, ids: &[String]) -> Result<Vec<String>> {
        self.inner.gateway_seen(job, ids).await
    }

    async fn gateway_seen_purge(&self, before: Micros) -> Result<u64> {
        self.inner.gateway_seen_purge(before).await
    }

    async fn gateway_doubt_purge(&self, job: &str, queue: QueueId, consumer: &str) -> Result<u64> {
        self.inner.gateway_doubt_purge(job, queue, consumer).await
    }

    async fn gateway_job_drop(&self, job: &str) -> Result<u64> {
        self.inner.gateway_job_drop(job).await
    }

    async fn gateway_link_put(&self, link: &LinkStatus) -> Result<()> {
        self.inner.gateway_link_put(link).await
    }

    async fn gateway_links(&self) -> Result<Vec<LinkStatus>> {
        self.inner.gateway_links().await
    }

    async fn job_backlog(
        &self,
        queue: QueueId,
        consumer: &str,
        now: Micros,
        waiting: bool,
    ) -> Result<(i64, Option<Micros>)> {
        self.inner.job_backlog(queue, consumer, now, waiting).await
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

#[async_trait]
impl StoreTx for GroupTx {
    async fn session_put(&mut self, row: &SessionRow) -> Result<bool> {
        self.tx()?.session_put(row).await
    }
    async fn session_end(
        &mut self,
        id_hash: &[u8],
        version: i64,
        idle_before: Option<Micros>,
        tombstone: Option<(&str, bool, Micros)>,
    ) -> Result<bool> {
        self.tx()?.session_end(id_hash, version, idle_before, tombstone).await
    }
    async fn idempotency_put(&mut self, r: &IdempotencyRecord) -> Result<bool> {
        self.tx()?.idempotency_put(r).await
    }
    async fn sessions_of(&mut self, agent: &str, limit: i64) -> Result<i64> {
        self.tx()?.sessions_of(agent, limit).await
    }
    async fn gateway_seen_put(&mut self, job: &str, ids: &[String], now: Micros) -> Result<bool> {
        self.tx()?.gateway_seen_put(job, ids, now).await
    }
    async fn gateway_doubt_clear(&mut self, job: &str, ids: &[String]) -> Result<()> {
        self.tx()?.gateway_doubt_clear(job, ids).await
    }
    async fn job_tally(&mut self, job: &str, propagated: i64, exceptions: i64) -> Result<()> {
        self.tx()?.job_tally(job, propagated, exceptions).await
    }
    async fn time_manager_turn(&mut self) -> Result<bool> {
        self.tx()?.time_manager_turn().await
    }
    async fn spool_put(&mut self, m: &SpooledMail) -> Result<SpoolPut> {
        self.tx()?.spool_put(m).await
    }
    async fn spool_attempted(
        &mut self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()> {
        self.tx()?.spool_attempted(id, response, error, next_attempt_at).await
    }
    async fn insert_messages(&mut self, msgs: &[NewMessage]) -> Result<()> {
        self.tx()?.insert_messages(msgs).await
    }
    async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>> {
        self.tx()?.candidates(q).await
    }
    async fn lock(&mut self, seq: i64, consumer: &str, txn: &str, kind: LockKind) -> Result<bool> {
        self.tx()?.lock(seq, consumer, txn, kind).await
    }
    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, shared: bool) -> Result<Removal> {
        self.tx()?.remove_now(seq, consumer, txn, shared).await
    }
    async fn groups(
        &mut self,
        q: &CandidateQuery,
        after: Option<Position>,
        except: Option<i64>,
    ) -> Result<Vec<(i64, Position)>> {
        self.tx()?.groups(q, after, except).await
    }
    async fn group_candidates(&mut self, q: &CandidateQuery, group: i64) -> Result<Vec<StoredMessage>> {
        self.tx()?.group_candidates(q, group).await
    }
    async fn claim_group(&mut self, queue: QueueId, consumer: &str, group: i64, txn: &str, wait: bool) -> Result<bool> {
        self.tx()?.claim_group(queue, consumer, group, txn, wait).await
    }
    async fn commit_session(&mut self, txn: &str, dequeues: bool) -> Result<CommitOutcome> {
        self.tx()?.commit_session(txn, dequeues).await
    }
    async fn rollback_session(&mut self, txn: &str, counts: bool) -> Result<Vec<Released>> {
        self.tx()?.rollback_session(txn, counts).await
    }
    async fn give_up(&mut self, seq: i64, consumer: &str) -> Result<i64> {
        self.tx()?.give_up(seq, consumer).await
    }
    async fn define_views(&mut self, tables: &[QueueTableView], retained: &[Retained]) -> Result<()> {
        self.tx()?.define_views(tables, retained).await
    }
    async fn record_dequeues(&mut self, rows: &[DequeueRecord]) -> Result<()> {
        self.tx()?.record_dequeues(rows).await
    }
    async fn forget_dequeues(&mut self, txn: &str) -> Result<()> {
        self.tx()?.forget_dequeues(txn).await
    }
    async fn delay_message(&mut self, seq: i64, until: Micros) -> Result<()> {
        self.tx()?.delay_message(seq, until).await
    }
    async fn move_to_exception(&mut self, seq: i64, to: QueueId, forget_named: bool, why: Expiry) -> Result<()> {
        self.tx()?.move_to_exception(seq, to, forget_named, why).await
    }
    async fn upsert_registration(&mut self, r: &Registration) -> Result<()> {
        self.tx()?.upsert_registration(r).await
    }
    async fn delete_registration(&mut self, queue: QueueId, consumer: &str, agent: &str) -> Result<bool> {
        self.tx()?.delete_registration(queue, consumer, agent).await
    }
    async fn put_topology_object(&mut self, kind: &str, name: &str, spec: &str) -> Result<()> {
        self.tx()?.put_topology_object(kind, name, spec).await
    }
    async fn delete_topology_object(&mut self, kind: &str, name: &str) -> Result<()> {
        self.tx()?.delete_topology_object(kind, name).await
    }
    async fn ensure_queue(&mut self, name: &str) -> Result<QueueId> {
        self.tx()?.ensure_queue(name).await
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
