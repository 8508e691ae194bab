//! PostgreSQL backend: a connection pool, read-committed transactions; dequeue claims are
//! conditional UPDATEs, so two consumers never take the same delivery. Commits that make
//! messages visible send `pg_notify('aqgate_enqueue', queue_id)`, which every aqgate
//! process LISTENs to, to wake its long-polls, for the queues some process holds interest
//! in (see [`interest`]).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, QueryBuilder, Row, Transaction};

use crate::*;
use aqgate_core::metrics::{Counter, Metrics};
use listing::Listing;
use regulars::Regulars;

mod coalesce;
mod grouping;
mod interest;
mod jobs;
mod listing;
mod notify;
pub mod regulars;
mod sessions;
mod spool;
mod statements;
#[cfg(test)]
mod tests;
mod tx;
mod vacuum;

use {coalesce::*, spool::*, statements::*, tx::*};

/// The advisory lock class of cluster-wide duties (`(class, 1)`: the time manager; `(class,
/// 2)`: defining the AQ$ views), apart
/// from the interest locks' `(0x61716761, queue)`.
const TIME_MANAGER_LOCK: i32 = 0x6171_6762;

/// How long a process's claim on a spooled mail lasts (see `spool_due`): longer than a
/// forwarding attempt may take.
const SPOOL_LEASE: Micros = 150 * aqgate_core::clock::MICROS_PER_SEC;

/// The LISTEN/NOTIFY channel for enqueue signals.
const CHANNEL: &str = "aqgate_enqueue";

/// The LISTEN/NOTIFY channel of the control plane: a change of the `control_plane` row
/// (the stored topology changed, a ping), sent by its trigger.
const CONTROL_CHANNEL: &str = "aqgate_control";

/// The setting each connection of a store carries its [`PgStore::origin`] in.
const ORIGIN_SETTING: &str = "aqgate.origin";

/// The payload of an enqueue signal for queue `q`: its id, then the origin of the
/// committing store (see [`PgStore::origin`]). A macro, so that SQL text can include it
/// with `concat!`; the setting is [`ORIGIN_SETTING`].
macro_rules! notify_payload {
    () => {
        "q::text || coalesce(' ' || current_setting('aqgate.origin', true), '')"
    };
}
use notify_payload;

pub struct PgStore {
    pool: PgPool,
    /// Group commit for enqueues that commit at once, and for receives that take the head
    /// of a queue: see [`Coalescer`].
    inserts: tokio::sync::mpsc::UnboundedSender<InsertJob>,
    takes: tokio::sync::mpsc::UnboundedSender<TakeJob>,
    interests: interest::Interests,
    /// This store's mark on the enqueue signals its commits send: its own listener skips
    /// them, since the engine that committed has woken its waiters already, and knows
    /// better what changed (see `Change::Arrived`).
    origin: String,
    /// Bumped for each control-plane signal the listener hears (and when it lost its
    /// connection): see `Store::control_signals`.
    control: tokio::sync::watch::Sender<u64>,
}

impl PgStore {
    /// Connects to `url` and runs the migrations (its counters in a registry of its own).
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, &Metrics::default()).await
    }

    /// Connects to `url` and runs the migrations; its counters go to `metrics`.
    pub async fn open_with(url: &str, metrics: &Metrics) -> Result<Self> {
        // Queue tables grow and shrink faster than autovacuum's statistics follow; with
        // stale statistics the planner sorts a whole queue to find its head instead of
        // walking the (queue, consumer, priority, seq) index. Every ordered query of ours
        // has an index that serves its order, so sorting is made a last resort.
        // With sorting priced out, a plan that must still sort costs ~1e10 and PostgreSQL
        // would JIT-compile it (hundreds of milliseconds per query): no JIT for these
        // short OLTP statements.
        let origin = uuid::Uuid::new_v4().simple().to_string();
        let opts = PgConnectOptions::from_str(url).map_err(|e| cannot_connect("connect to", url, &e))?.options([
            ("enable_sort", "off"),
            ("jit", "off"),
            (ORIGIN_SETTING, origin.as_str()),
        ]);
        // One connection first, once, at once: a server that cannot be reached is said to
        // be so, with the reason, rather than waited for until the pool times out.
        let first = tokio::time::timeout(CONNECT_TIMEOUT, sqlx::ConnectOptions::connect(&opts))
            .await
            .map_err(|_| no_answer(url))?
            .map_err(|e| cannot_connect("connect to", url, &e))?;
        let _ = sqlx::Connection::close(first).await;
        let interests = interest::Interests::start(opts.clone());
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(30))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(ping_if_stale(conn, meta)))
            .connect_with(opts)
            .await
            .map_err(|e| cannot_connect("connect to", url, &e))?;
        sqlx::migrate!("migrations/postgres").run(&pool).await.db()?;
        let counters = GroupCounters::register(metrics);
        let inserts = Coalescer::start(pool.clone(), counters.clone());
        let takes = Coalescer::start_takes(pool.clone(), counters);
        let control = tokio::sync::watch::Sender::new(0);
        Ok(Self { pool, inserts, takes, interests, origin, control })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// sqlx pings every pooled connection before handing it out by default: one more round
/// trip per statement, ~6 % of aqgate's CPU and as much again in PostgreSQL on the mail
/// path. Only a connection idle for [`STALE_AFTER`] is checked (as PgBouncer's
/// `server_check_delay`), or one idle since a connection was last seen lost (a server
/// restart); one that broke while busy fails its statement and is dropped.
async fn ping_if_stale(conn: &mut sqlx::PgConnection, meta: sqlx::pool::PoolConnectionMetadata) -> sqlx::Result<bool> {
    use sqlx::Connection;
    if idle_connection_suspect(meta.idle_for)
        && let Err(e) = conn.ping().await
    {
        connection_lost();
        return Err(e);
    }
    Ok(true)
}

admin_store!(PgStore, PgRow,
    locked: "((SELECT count(*) FROM messages m WHERE m.lock_txn = s.txn)
              + (SELECT count(*) FROM deliveries d WHERE d.lock_txn = s.txn))",
    msg_locked: "m.lock_txn IS NOT NULL
                 OR EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)",
    retry: "GREATEST(m.retry_count, COALESCE((SELECT max(d.retry_count) FROM deliveries d WHERE d.msg_seq = m.seq), 0))");

queue_store!(PgStore, PgRow, {
    fn holds_transactions(&self) -> bool {
        true
    }

    async fn vacuum(&self, min_dead: i64, fraction: f64) -> Result<Vec<aqgate_core::store::Vacuumed>> {
        vacuum::vacuum(&self.pool, min_dead, fraction).await
    }

    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        let tx = crate::health::bounded(self.pool.begin()).await?;
        Ok(Box::new(PgTx::new(tx)))
    }

    /// Commits without waiting for the WAL flush (one round trip, as `BEGIN`).
    async fn begin_provisional(&self) -> Result<Box<dyn StoreTx>> {
        let tx = crate::health::bounded(self.pool.begin_with("BEGIN; SET LOCAL synchronous_commit TO off")).await?;
        Ok(Box::new(PgTx::new(tx)))
    }

    /// Ended by the server after 10 s without a statement: a batch converts its messages
    /// between its statements in milliseconds.
    async fn begin_held(&self) -> Result<Box<dyn StoreTx>> {
        let tx = crate::health::bounded(
            self.pool.begin_with("BEGIN; SET LOCAL idle_in_transaction_session_timeout = '10s'"),
        )
        .await?;
        Ok(Box::new(PgTx::new(tx)))
    }

    async fn recover(&self) -> Result<u64> {
        let mut tx = self.pool.begin().await.db()?;
        let a: i64 = sqlx::query_scalar(
            "WITH m AS (DELETE FROM messages
                         WHERE enq_txn IS NOT NULL AND enq_txn NOT IN (SELECT txn FROM sessions) RETURNING seq),
                  d AS (DELETE FROM deliveries WHERE msg_seq IN (SELECT seq FROM m))
             SELECT count(*) FROM m",
        )
        .fetch_one(&mut *tx)
        .await
        .db()?;
        let b = sqlx::query(sql::RECOVER_UNLOCK_ORPHANED).execute(&mut *tx).await.db()?;
        let c = sqlx::query(
            "UPDATE messages SET lock_txn = NULL, lock_kind = NULL
              WHERE lock_txn IS NOT NULL AND lock_txn NOT IN (SELECT txn FROM sessions)",
        )
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query(sql::RECOVER_DROP_ORPHANED_NOTIFICATIONS).execute(&mut *tx).await.db()?;
        tx.commit().await.db()?;
        Ok(u64::try_from(a).unwrap_or(0) + b.rows_affected() + c.rows_affected())
    }

    async fn due_expirations(&self, now: Micros, limit: i64) -> Result<Vec<ExpiredMessage>> {
        let rows = sqlx::query(
            "SELECT m.seq, m.queue_id, m.exception_queue FROM messages m
             WHERE m.expire_at IS NOT NULL AND m.expire_at <= $1 AND m.enq_txn IS NULL
               AND m.lock_txn IS NULL
               AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)
             ORDER BY m.expire_at LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter()
            .map(|r| {
                Ok(ExpiredMessage {
                    seq: r.try_get("seq").db()?,
                    queue: r.try_get("queue_id").db()?,
                    exception_queue: r.try_get("exception_queue").db()?,
                })
            })
            .collect()
    }

    async fn insert_committed(&self, msgs: &[NewMessage], source: u64) -> Result<()> {
        // A single statement is atomic on its own: no BEGIN/COMMIT round trips; concurrent
        // requests share one (see Coalescer).
        if msgs.is_empty() {
            return Ok(());
        }
        if msgs.iter().any(|m| m.group.is_some()) {
            // Grouped messages take a second statement for their group (see
            // `StoreTx::insert_messages`): a transaction of their own.
            let mut tx = self.begin().await?;
            tx.insert_messages(msgs).await?;
            return tx.commit().await;
        }
        if msgs.len() >= COALESCE_ALONE_ROWS {
            // Already a batch: sharing a statement saves it nothing, and waiting behind the
            // one writer would keep PostgreSQL on one core.
            insert_query(&msgs.iter().collect::<Vec<_>>(), None).execute(&self.pool).await.db()?;
            return Ok(());
        }
        let (done, answer) = tokio::sync::oneshot::channel();
        let job = InsertJob { msgs: msgs.to_vec(), sent: Sent::now(source), done };
        if self.inserts.send(job).is_err() {
            return Err(StoreError::corrupt("the insert writer stopped"));
        }
        answer.await.map_err(|_| StoreError::corrupt("the insert writer stopped"))?
    }

    async fn take_head(&self, q: &CandidateQuery, source: u64) -> Result<Option<StoredMessage>> {
        // Claim, delete the delivery and its (single-consumer) message, and return it, in
        // one statement; concurrent receivers of one queue share one (see Coalescer).
        let (done, answer) = tokio::sync::oneshot::channel();
        if self.takes.send(TakeJob { q: q.clone(), sent: Sent::now(source), done }).is_err() {
            return Err(StoreError::corrupt("the receive writer stopped"));
        }
        answer.await.map_err(|_| StoreError::corrupt("the receive writer stopped"))?
    }

    async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>> {
        let mut listener = PgListener::connect_with(&self.pool).await.db()?;
        listener.listen_all([CHANNEL, CONTROL_CHANNEL]).await.db()?;
        let control = self.control.clone();
        // Signals sent before this listener listened are not heard: as after a loss.
        control.send_modify(|n| *n += 1);
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        self.interests.wake_through(tx.clone());
        let waker = self.interests.waker();
        let pool = self.pool.clone();
        let origin = self.origin.clone();
        tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(n)) if n.channel() == CONTROL_CHANNEL => control.send_modify(|n| *n += 1),
                    Ok(Some(n)) => {
                        if let Some(q) = signalled_queue(n.payload(), &origin)
                            && tx.send(q).await.is_err()
                        {
                            return;
                        }
                    }
                    // Lost, and already connected and listening again: what was sent
                    // meanwhile is gone, so every waiter looks again.
                    Ok(None) => {
                        tracing::warn!("LISTEN connection lost; listening again, waking the waiters");
                        waker.wake_all();
                        control.send_modify(|n| *n += 1);
                    }
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                        let Some(again) = relisten(&pool).await else { return };
                        listener = again;
                        waker.wake_all();
                        control.send_modify(|n| *n += 1);
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Some(rx))
    }

    fn control_signals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.control.subscribe())
    }

    async fn interest(&self, queue: QueueId) -> Result<Interest> {
        self.interests.acquire(queue).await
    }
});

/// The queue an enqueue signal names, unless it comes from the store of origin `own`
/// (whose engine woke its waiters itself). A signal without an origin counts.
fn signalled_queue(payload: &str, own: &str) -> Option<QueueId> {
    let (q, origin) = payload.split_once(' ').unwrap_or((payload, ""));
    if origin == own {
        return None;
    }
    q.parse().ok()
}

/// A new listener on the store's channel, once one can be had (`None`: the pool was
/// closed, the process is shutting down).
async fn relisten(pool: &PgPool) -> Option<PgListener> {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if pool.is_closed() {
            return None;
        }
        let listener = async {
            let mut l = PgListener::connect_with(pool).await?;
            l.listen_all([CHANNEL, CONTROL_CHANNEL]).await?;
            Ok::<_, sqlx::Error>(l)
        };
        match listener.await {
            Ok(l) => return Some(l),
            // Every half second while the database is away: the outage is logged once.
            Err(e) if crate::health::unavailable() => {
                tracing::debug!(error = %e, "LISTEN connection: still reconnecting");
            }
            Err(e) => tracing::warn!(error = %e, "LISTEN connection: still reconnecting"),
        }
    }
}
