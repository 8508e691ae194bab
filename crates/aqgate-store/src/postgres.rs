//! PostgreSQL backend: a connection pool, read-committed transactions; dequeue claims are
//! conditional UPDATEs, so two consumers never take the same delivery. Commits that make
//! messages visible send `pg_notify('aqgate_enqueue', queue_id)`, which every aqgate
//! process LISTENs to, to wake its long-polls, for the queues some process holds interest
//! in (see [`super::interest`]).

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, QueryBuilder, Row, Transaction};

use crate::regulars::Regulars;
use crate::*;
use aqgate_core::metrics::{Counter, Metrics};

/// The advisory lock class of cluster-wide duties (`(class, 1)`: the time manager), apart
/// from the interest locks' `(0x61716761, queue)`.
const TIME_MANAGER_LOCK: i32 = 0x6171_6762;

/// How long a process's claim on a spooled mail lasts (see `spool_due`): longer than a
/// forwarding attempt may take.
const SPOOL_LEASE: Micros = 150 * aqgate_core::clock::MICROS_PER_SEC;

/// The LISTEN/NOTIFY channel for enqueue signals.
const CHANNEL: &str = "aqgate_enqueue";

/// A session commit's enqueues: clears the tags of transaction `$1` on its outbox rows and
/// messages, signals each queue that got messages on channel `$2` where somebody holds
/// interest (`interest::uninterested`; its try-locks are held until the commit that
/// follows), and returns (queue, messages) per queue, in queue order. (`s` is a plain
/// SELECT, which PostgreSQL runs only where it is referenced: hence the condition.)
const PUBLISH_SQL: &str = concat!(
    "WITH o AS (UPDATE notify_outbox SET txn = NULL WHERE txn = $1),
          m AS (UPDATE messages SET enq_txn = NULL WHERE enq_txn = $1 RETURNING queue_id),
          c AS (SELECT queue_id AS q, count(*) AS n FROM m GROUP BY queue_id),
          s AS (SELECT pg_notify($2, q::text) FROM c WHERE NOT ",
    crate::interest::uninterested!(),
    ")
     SELECT q, n FROM c WHERE (SELECT count(*) FROM s) >= 0 ORDER BY q"
);

pub struct PgStore {
    pool: PgPool,
    /// Group commit for enqueues that commit at once, and for receives that take the head
    /// of a queue: see [`Coalescer`].
    inserts: tokio::sync::mpsc::UnboundedSender<InsertJob>,
    takes: tokio::sync::mpsc::UnboundedSender<TakeJob>,
    interests: crate::interest::Interests,
}

/// One request's remove-the-head receive.
struct TakeJob {
    q: CandidateQuery,
    sent: Sent,
    done: tokio::sync::oneshot::Sender<Result<Option<StoredMessage>>>,
}

/// What the group-commit writers did (registered in the process's metrics).
#[derive(Clone)]
struct GroupCounters {
    insert_statements: Counter,
    insert_requests: Counter,
    take_statements: Counter,
    take_requests: Counter,
    /// Batches that waited for a regular (see [`Regulars`]).
    waits: Counter,
}

impl GroupCounters {
    fn register(m: &Metrics) -> Self {
        Self {
            insert_statements: m.counter(
                "aqgate_pg_insert_statements_total",
                "Statements of the PostgreSQL insert writer (group commit).",
            ),
            insert_requests: m
                .counter("aqgate_pg_insert_requests_total", "Committed enqueues the insert writer wrote in them."),
            take_statements: m
                .counter("aqgate_pg_take_statements_total", "Statements of the PostgreSQL receive writer."),
            take_requests: m
                .counter("aqgate_pg_take_requests_total", "Receives the receive writer answered with them."),
            waits: m
                .counter("aqgate_pg_group_waits_total", "Writer batches that waited for a regular client connection."),
        }
    }
}

/// Who sent a job (the `source` of [`Store::insert_committed`] / [`Store::take_head`];
/// 0: unknown) and when.
struct Sent {
    source: u64,
    at: std::time::Instant,
}

impl Sent {
    fn now(source: u64) -> Self {
        Self { source, at: std::time::Instant::now() }
    }
}

/// A request waiting for a group-commit writer.
trait Job {
    fn sent(&self) -> &Sent;
    /// Rows it adds to the writer's statement.
    fn rows(&self) -> usize;
    fn source(&self) -> u64 {
        self.sent().source
    }
}

impl Job for InsertJob {
    fn sent(&self) -> &Sent {
        &self.sent
    }
    fn rows(&self) -> usize {
        self.msgs.len()
    }
}

impl Job for TakeJob {
    fn sent(&self) -> &Sent {
        &self.sent
    }
    fn rows(&self) -> usize {
        1
    }
}

/// One request's committed enqueue, waiting to be written.
struct InsertJob {
    msgs: Vec<NewMessage>,
    sent: Sent,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// Group commit for PostgreSQL: concurrent `insert_committed` calls are written by one
/// statement (one transaction, one WAL flush) instead of one each; concurrent `take_head`
/// calls on the same queue and consumer take their heads with one statement too. A writer
/// drains its queue, so an idle server adds no wait and a busy one batches what arrived
/// meanwhile. A batch is atomic; if it fails, its requests are written one by one,
/// so one request's failure never fails another's. Nobody is answered before the
/// statement that holds its messages has committed.
struct Coalescer;

/// Rows per combined statement (the arrays stay well under the protocol's limits).
const COALESCE_MAX_ROWS: usize = 2_000;
/// Statements in flight at once.
const COALESCE_WRITERS: usize = 1;
/// An enqueue of this many messages is written on its own, beside the writer.
const COALESCE_ALONE_ROWS: usize = 32;

impl Coalescer {
    fn start(pool: PgPool, counters: GroupCounters) -> tokio::sync::mpsc::UnboundedSender<InsertJob> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<InsertJob>();
        let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..COALESCE_WRITERS {
            let (pool, rx, counters) = (pool.clone(), rx.clone(), counters.clone());
            tokio::spawn(async move {
                let mut conn = OwnConn::default();
                let mut regulars = Regulars::default();
                loop {
                    let batch = {
                        let mut rx = rx.lock().await;
                        let Some(first) = rx.recv().await else { return };
                        Self::collect(&mut rx, first, &mut regulars, COALESCE_MAX_ROWS, &counters).await
                    };
                    let sources: Vec<u64> = batch.iter().map(Job::source).collect();
                    counters.insert_statements.inc();
                    counters.insert_requests.add(sources.len() as u64);
                    Self::write(&pool, &mut conn, batch).await;
                    regulars.answered_all(sources, std::time::Instant::now());
                }
            });
        }
        tx
    }

    /// The batch that begins with `first`: everything queued meanwhile, and then whatever
    /// arrives while [`Regulars`] expects a producer it has just answered to come back.
    async fn collect<J: Job>(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<J>,
        first: J,
        regulars: &mut Regulars,
        max_rows: usize,
        counters: &GroupCounters,
    ) -> Vec<J> {
        let started = std::time::Instant::now();
        let mut rows = 0;
        let mut batch = Vec::new();
        let mut next = Some(first);
        let mut waited = false;
        while let Some(job) = next.take() {
            if job.source() != 0 {
                regulars.arrived(job.source(), job.sent().at);
            }
            rows += job.rows();
            batch.push(job);
            if rows >= max_rows {
                break;
            }
            next = match rx.try_recv() {
                Ok(job) => Some(job),
                Err(_) => {
                    let until = regulars.wait_until(started, std::time::Instant::now());
                    match until {
                        Some(until) => {
                            waited = true;
                            tokio::time::timeout_at(until.into(), rx.recv()).await.ok().flatten()
                        }
                        None => None,
                    }
                }
            };
        }
        if waited {
            counters.waits.inc();
        }
        batch
    }

    fn start_takes(pool: PgPool, counters: GroupCounters) -> tokio::sync::mpsc::UnboundedSender<TakeJob> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TakeJob>();
        tokio::spawn(async move {
            let mut conn = OwnConn::default();
            let mut regulars = Regulars::default();
            while let Some(first) = rx.recv().await {
                let jobs = Self::collect(&mut rx, first, &mut regulars, 256, &counters).await;
                let sources: Vec<u64> = jobs.iter().map(Job::source).collect();
                // Receivers of one queue and consumer without a filter share a statement;
                // filtered ones go alone. Groups run concurrently.
                let mut groups: Vec<Vec<TakeJob>> = Vec::new();
                for job in jobs {
                    let shareable = job.q.corrid.is_none() && job.q.msgid.is_none();
                    match groups.iter_mut().find(|g| {
                        shareable
                            && g[0].q.corrid.is_none()
                            && g[0].q.msgid.is_none()
                            && g[0].q.queue == job.q.queue
                            && g[0].q.consumer == job.q.consumer
                    }) {
                        Some(g) => g.push(job),
                        None => groups.push(vec![job]),
                    }
                }
                counters.take_statements.add(groups.len() as u64);
                counters.take_requests.add(sources.len() as u64);
                // The first group on this task's own connection, others beside it from the pool.
                let mut running = tokio::task::JoinSet::new();
                let mut groups = groups.into_iter();
                let first = groups.next();
                for g in groups {
                    let pool = pool.clone();
                    running.spawn(async move { Self::take(&pool, &mut OwnConn::default(), g).await });
                }
                if let Some(g) = first {
                    Self::take(&pool, &mut conn, g).await;
                }
                while running.join_next().await.is_some() {}
                regulars.answered_all(sources, std::time::Instant::now());
            }
        });
        tx
    }

    /// Takes one head per job, handed out in queue order to the jobs in arrival order.
    async fn take(pool: &PgPool, conn: &mut OwnConn, group: Vec<TakeJob>) {
        let n = i64::try_from(group.len()).unwrap_or(1);
        let rows = conn.take(pool, &group[0].q, n).await;
        match rows.and_then(|r| r.iter().map(stored_from_row).collect::<Result<Vec<_>>>()) {
            Ok(mut msgs) => {
                msgs.sort_by_key(|m| (m.prio_key, m.seq));
                let mut msgs = msgs.into_iter();
                for job in group {
                    let _ = job.done.send(Ok(msgs.next()));
                }
            }
            Err(e) => fail_all(group.into_iter().map(|j| j.done), e, "receive"),
        }
    }

    async fn write(pool: &PgPool, conn: &mut OwnConn, batch: Vec<InsertJob>) {
        if batch.len() == 1 {
            let job = batch.into_iter().next().expect("one job");
            let r = conn.insert(pool, &job.msgs.iter().collect::<Vec<_>>()).await;
            let _ = job.done.send(r);
            return;
        }
        let all: Vec<&NewMessage> = batch.iter().flat_map(|j| j.msgs.iter()).collect();
        match conn.insert(pool, &all).await {
            Ok(()) => {
                for job in batch {
                    let _ = job.done.send(Ok(()));
                }
            }
            // Nobody's statement was at fault: all get the error now rather than each
            // waiting for a connection again.
            Err(e) if e.is_unavailable() => fail_all(batch.into_iter().map(|j| j.done), e, "insert"),
            Err(e) => {
                tracing::debug!(error = %e, jobs = batch.len(), "combined insert failed; writing one by one");
                for job in batch {
                    let r = conn.insert(pool, &job.msgs.iter().collect::<Vec<_>>()).await;
                    let _ = job.done.send(r);
                }
            }
        }
    }
}

/// Answers every request of a shared statement that failed: the first with the error
/// itself, the others with its text (the error is not `Clone`).
fn fail_all<T>(waiting: impl Iterator<Item = tokio::sync::oneshot::Sender<Result<T>>>, e: StoreError, what: &str) {
    let why = e.to_string();
    let mut e = Some(e);
    for done in waiting {
        let err = e.take().unwrap_or_else(|| StoreError::corrupt(format!("{what} failed: {why}")));
        let _ = done.send(Err(err));
    }
}

/// A group-commit writer's own connection, kept across statements: a statement on a
/// connection taken from the pool and given back costs an acquire and, on release, the
/// pool's ping round trip. As with pooled connections, one idle for [`STALE_AFTER`] is
/// pinged before use (a server restart meanwhile costs no request). A connection that
/// is lost (see [`connection_broken`]) is given back (the pool's ping closes it if it
/// is broken) and another is taken next time.
#[derive(Default)]
struct OwnConn(Option<(sqlx::pool::PoolConnection<Postgres>, std::time::Instant)>);

impl OwnConn {
    async fn get(&mut self, pool: &PgPool) -> Result<&mut sqlx::PgConnection> {
        use sqlx::Connection;
        if let Some((conn, used)) = &mut self.0
            && idle_connection_suspect(used.elapsed())
            && conn.ping().await.is_err()
        {
            connection_lost();
            self.0 = None;
        }
        let (conn, used) = match self.0.take() {
            Some(c) => self.0.insert(c),
            None => self.0.insert((pool.acquire().await.db()?, std::time::Instant::now())),
        };
        *used = std::time::Instant::now();
        Ok(&mut **conn)
    }

    fn check<T>(&mut self, r: sqlx::Result<T>) -> Result<T> {
        if let Err(e) = &r
            && connection_broken(e)
        {
            self.0 = None;
        }
        r.db()
    }

    /// Writes `msgs` in one statement. If the connection is lost meanwhile, the statement
    /// is sent once more on a fresh one: the message ids are ours, so if the first one had
    /// committed, the second fails on their unique index, and that answers the question.
    async fn insert(&mut self, pool: &PgPool, msgs: &[&NewMessage]) -> Result<()> {
        let r = insert_query(msgs, None).execute(self.get(pool).await?).await;
        match r {
            Err(e) if connection_broken(&e) => {
                connection_lost();
                tracing::warn!(error = %e, "the insert writer's connection failed; sending the statement again");
                self.0 = None;
                let again = insert_query(msgs, None).execute(self.get(pool).await?).await;
                match again {
                    Err(sqlx::Error::Database(d)) if d.constraint() == Some("messages_msgid_key") => Ok(()),
                    again => self.check(again).map(|_| ()),
                }
            }
            r => self.check(r).map(|_| ()),
        }
    }

    async fn take(&mut self, pool: &PgPool, q: &CandidateQuery, n: i64) -> Result<Vec<PgRow>> {
        let r = take_heads(q, n).build().fetch_all(self.get(pool).await?).await;
        self.check(r)
    }
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
        let opts = PgConnectOptions::from_str(url).db()?.options([("enable_sort", "off"), ("jit", "off")]);
        let interests = crate::interest::Interests::start(opts.clone());
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(30))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(ping_if_stale(conn, meta)))
            .connect_with(opts)
            .await
            .db()?;
        sqlx::migrate!("migrations/postgres").run(&pool).await.db()?;
        let counters = GroupCounters::register(metrics);
        let inserts = Coalescer::start(pool.clone(), counters.clone());
        let takes = Coalescer::start_takes(pool.clone(), counters);
        Ok(Self { pool, inserts, takes, interests })
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

pub struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// A session row to write (see `StoreTx::session_put`): with the transaction's next
    /// enqueue or session commit, in the same statement, else just before its commit.
    staged: Option<SessionRow>,
    /// A folded session write found the row at another version.
    conflict: bool,
}

impl PgTx {
    fn new(tx: Transaction<'static, Postgres>) -> Self {
        Self { tx, staged: None, conflict: false }
    }
}

/// The session write as CTEs `sw` (inserts a new row: `new`) and `su` (updates from the
/// previous version), one of them a no-op, parameters `$K` to `$K+8` as bound by
/// [`bind_session`]. `(SELECT count(*) FROM sw) + (SELECT count(*) FROM su)` is 1 when the
/// row was written.
///
/// `epoch` is the server run (`pg_postmaster_start_time()`) of the row's last write. A
/// provisional write can be lost only by a crash of the server, and then every write after
/// the last surviving one is lost with it: so a row whose `epoch` is not the current run
/// may have lost writes of its open transaction, and a write that finds it so sets `doubt`,
/// which stays until the transaction ends. Such a session is not `intact`: its commit is
/// refused (25402). A session merely untouched across a restart is refused the same way.
/// `last_used` never goes back (a long poll's touch may have moved it ahead).
fn session_ctes(k: usize, new: bool) -> String {
    let p = |i: usize| format!("${}", k + i);
    let (id, agent, txn, pending, dequeued, enqueued, positions, last_used, version) =
        (p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8));
    if new {
        format!(
            "sw AS (INSERT INTO sessions (id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version, epoch, doubt)
                    VALUES ({id}::bytea, {agent}::text, {txn}::text, {pending}::boolean, {dequeued}::boolean, {enqueued}::int8,
                            {positions}::text, {last_used}::int8, {version}::int8, pg_postmaster_start_time(), false)
                    ON CONFLICT (id_hash) DO NOTHING RETURNING 1),
             su AS (SELECT 1 WHERE false)"
        )
    } else {
        format!(
            "sw AS (SELECT 1 WHERE false),
             su AS (UPDATE sessions SET agent = {agent}::text, txn = {txn}::text, pending = {pending}::boolean,
                           dequeued = {dequeued}::boolean, enqueued = {enqueued}::int8, positions = {positions}::text,
                           last_used = greatest(last_used, {last_used}::int8), version = {version}::int8,
                           epoch = pg_postmaster_start_time(),
                           doubt = CASE WHEN txn <> {txn}::text THEN false
                                        ELSE doubt OR epoch <> pg_postmaster_start_time() END
                    WHERE id_hash = {id}::bytea AND version = {version}::int8 - 1 RETURNING 1)"
        )
    }
}

/// Index of a statement variant for a session row (new row or update).
fn variant(row: &SessionRow) -> usize {
    usize::from(row.version == 1)
}

fn bind_session<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    row: &'q SessionRow,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    q.bind(&row.id_hash)
        .bind(&row.agent)
        .bind(&row.txn)
        .bind(row.pending)
        .bind(row.dequeued)
        .bind(row.enqueued)
        .bind(&row.positions)
        .bind(row.last_used)
        .bind(row.version)
}

/// `PUBLISH_SQL` with the session write folded in (its parameters from `$3`); one row
/// per queue as there, plus `sealed`; a single row with `q` NULL when nothing was
/// published.
static PUBLISH_SEALED_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!(
            "WITH o AS (UPDATE notify_outbox SET txn = NULL WHERE txn = $1),
              m AS (UPDATE messages SET enq_txn = NULL WHERE enq_txn = $1 RETURNING queue_id),
              c AS (SELECT queue_id AS q, count(*) AS n FROM m GROUP BY queue_id),
              s AS (SELECT pg_notify($2, q::text) FROM c WHERE NOT {}),
              {},
              w AS (SELECT (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed)
         SELECT c.q, c.n, w.sealed FROM w LEFT JOIN c ON true WHERE (SELECT count(*) FROM s) >= 0 ORDER BY c.q",
            crate::interest::uninterested!(),
            session_ctes(3, new)
        )
    })
});

fn msgid_from(v: Vec<u8>) -> Result<[u8; 16]> {
    v.try_into().map_err(|_| StoreError::corrupt("msgid is not 16 bytes"))
}

fn stored_from_row(r: &PgRow) -> Result<StoredMessage> {
    Ok(StoredMessage {
        seq: r.try_get("seq").db()?,
        msgid: msgid_from(r.try_get("msgid").db()?)?,
        queue: r.try_get("queue_id").db()?,
        consumer: r.try_get("consumer").db()?,
        corrid: r.try_get("corrid").db()?,
        priority: r.try_get("priority").db()?,
        prio_key: r.try_get("prio_key").db()?,
        enq_time: r.try_get("enq_time").db()?,
        delay_until: r.try_get("delay_until").db()?,
        expire_at: r.try_get("expire_at").db()?,
        sender: r.try_get("sender").db()?,
        exception_queue: r.try_get("exception_queue").db()?,
        payload: r.try_get("payload").db()?,
        retry_count: r.try_get("retry_count").db()?,
        state: i32::try_from(r.try_get::<i64, _>("state").db()?).unwrap_or(0),
    })
}

#[async_trait]
impl Store for PgStore {
    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        let tx = self.pool.begin().await.db()?;
        Ok(Box::new(PgTx::new(tx)))
    }

    /// Commits without waiting for the WAL flush (one round trip, as `BEGIN`).
    async fn begin_provisional(&self) -> Result<Box<dyn StoreTx>> {
        let tx = self.pool.begin_with("BEGIN; SET LOCAL synchronous_commit TO off").await.db()?;
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

    async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup> {
        let row = sqlx::query(
            "SELECT false AS ended, agent, txn, pending, dequeued, enqueued, positions, last_used, version,
                    (NOT doubt AND epoch = pg_postmaster_start_time()) AS intact
               FROM sessions WHERE id_hash = $1
             UNION ALL
             SELECT true, agent, '', had_work, false, 0, '', 0, 0, true FROM session_tombstones WHERE id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&self.pool)
        .await
        .db()?;
        let Some(r) = row else { return Ok(SessionLookup::Unknown) };
        if r.try_get::<bool, _>("ended").db()? {
            return Ok(SessionLookup::Ended { agent: r.try_get("agent").db()?, had_work: r.try_get("pending").db()? });
        }
        Ok(SessionLookup::Live(session_from_row(&r, id_hash)?))
    }

    async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()> {
        sqlx::query("UPDATE sessions SET last_used = greatest(last_used, $2) WHERE id_hash = $1")
            .bind(id_hash)
            .bind(until)
            .execute(&self.pool)
            .await
            .db()?;
        Ok(())
    }

    async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>> {
        let rows = sqlx::query(
            "SELECT id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version,
                    (NOT doubt AND epoch = pg_postmaster_start_time()) AS intact
               FROM sessions WHERE last_used < $1 ORDER BY last_used LIMIT $2",
        )
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter().map(|r| session_from_row(r, &r.try_get::<Vec<u8>, _>("id_hash").db()?)).collect()
    }

    async fn session_count(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(sql::SESSION_COUNT).fetch_one(&self.pool).await.db()?)
    }

    async fn sessions_purge(&self, now: Micros, records_before: Micros) -> Result<u64> {
        let a = sqlx::query(sql::PURGE_TOMBSTONES).bind(now).execute(&self.pool).await.db()?;
        let b = sqlx::query(sql::PURGE_IDEMPOTENCY).bind(records_before).execute(&self.pool).await.db()?;
        Ok(a.rows_affected() + b.rows_affected())
    }

    async fn idempotency_get(&self, agent: &str, key: &str) -> Result<Option<IdempotencyRecord>> {
        let row = sqlx::query(sql::IDEMPOTENCY_GET).bind(agent).bind(key).fetch_optional(&self.pool).await.db()?;
        row.map(|r| {
            Ok(IdempotencyRecord {
                agent: r.try_get("agent").db()?,
                key: r.try_get("key").db()?,
                request_hash: r.try_get("request_hash").db()?,
                response: r.try_get("response").db()?,
                created_at: r.try_get("created_at").db()?,
            })
        })
        .transpose()
    }

    async fn load_topology(&self) -> Result<Vec<(String, String, String)>> {
        let rows = sqlx::query(sql::TOPOLOGY_LOAD).fetch_all(&self.pool).await.db()?;
        rows.iter().map(|r| Ok((r.try_get("kind").db()?, r.try_get("name").db()?, r.try_get("spec").db()?))).collect()
    }

    async fn queue_ids(&self) -> Result<Vec<(String, QueueId)>> {
        let rows = sqlx::query(sql::QUEUE_IDS).fetch_all(&self.pool).await.db()?;
        rows.iter().map(|r| Ok((r.try_get("name").db()?, r.try_get("id").db()?))).collect()
    }

    async fn queue_depths(&self) -> Result<Vec<(QueueId, i64)>> {
        let rows = sqlx::query(sql::QUEUE_DEPTHS).fetch_all(&self.pool).await.db()?;
        rows.iter().map(|r| Ok((r.try_get("queue_id").db()?, r.try_get("n").db()?))).collect()
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

    async fn next_delay_end(&self, queue: QueueId, now: Micros) -> Result<Option<Micros>> {
        let r = sqlx::query(sql::NEXT_DELAY_END).bind(queue).bind(now).fetch_one(&self.pool).await.db()?;
        Ok(r.try_get("t").db()?)
    }

    async fn registrations(&self, queue: QueueId) -> Result<Vec<Registration>> {
        let rows = sqlx::query(sql::REGISTRATIONS_OF_QUEUE).bind(queue).fetch_all(&self.pool).await.db()?;
        rows.iter().map(registration_from_row).collect()
    }

    async fn all_registrations(&self) -> Result<Vec<Registration>> {
        let rows = sqlx::query(sql::REGISTRATIONS_ALL).fetch_all(&self.pool).await.db()?;
        rows.iter().map(registration_from_row).collect()
    }

    async fn set_registration_secret(
        &self,
        queue: QueueId,
        consumer: &str,
        agent: &str,
        secret: Option<&str>,
    ) -> Result<bool> {
        let r = sqlx::query(sql::REGISTRATION_SET_SECRET)
            .bind(queue)
            .bind(consumer)
            .bind(agent)
            .bind(secret)
            .execute(&self.pool)
            .await
            .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn notify_claim(&self, now: Micros, lease_until: Micros, limit: i64) -> Result<Vec<OutboxEntry>> {
        // Concurrent dispatchers (several processes) skip each other's rows.
        let rows = sqlx::query(
            "WITH c AS (
                UPDATE notify_outbox SET next_attempt_at = $2, attempts = attempts + 1
                WHERE id IN (SELECT id FROM notify_outbox WHERE state = 'new' AND txn IS NULL AND next_attempt_at <= $1
                             ORDER BY next_attempt_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)
                RETURNING *
             )
             SELECT c.*, r.secret FROM c
             LEFT JOIN registrations r ON r.queue_id = c.queue_id AND r.consumer = c.consumer AND r.agent = c.agent",
        )
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        let mut out = rows.iter().map(outbox_from_row).collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|e| e.id);
        Ok(out)
    }

    async fn notify_delivered(&self, ids: &[i64]) -> Result<()> {
        if !ids.is_empty() {
            sqlx::query("DELETE FROM notify_outbox WHERE id = ANY($1)").bind(ids).execute(&self.pool).await.db()?;
        }
        Ok(())
    }

    async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()> {
        sqlx::query(
            "UPDATE notify_outbox SET last_error = $2,
                    state = CASE WHEN $3::int8 IS NULL THEN 'parked' ELSE state END,
                    next_attempt_at = COALESCE($3::int8, next_attempt_at)
             WHERE id = $1",
        )
        .bind(id)
        .bind(error)
        .bind(next_attempt_at)
        .execute(&self.pool)
        .await
        .db()?;
        Ok(())
    }

    async fn notify_next_due(&self) -> Result<Option<Micros>> {
        Ok(sqlx::query_scalar(sql::NOTIFY_NEXT_DUE).fetch_one(&self.pool).await.db()?)
    }

    async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>> {
        let rows = sqlx::query(
            "SELECT o.*, r.secret FROM notify_outbox o
             LEFT JOIN registrations r ON r.queue_id = o.queue_id AND r.consumer = o.consumer AND r.agent = o.agent
             WHERE o.txn IS NULL ORDER BY o.id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter().map(outbox_from_row).collect()
    }

    async fn notify_counts(&self) -> Result<(i64, i64)> {
        let r = sqlx::query(
            "SELECT COUNT(*) FILTER (WHERE state = 'new') AS pending, COUNT(*) FILTER (WHERE state = 'parked') AS parked
             FROM notify_outbox WHERE txn IS NULL",
        )
        .fetch_one(&self.pool)
        .await.db()?;
        Ok((r.try_get("pending").db()?, r.try_get("parked").db()?))
    }

    async fn notify_unpark(&self, now: Micros) -> Result<u64> {
        let r = sqlx::query(sql::NOTIFY_UNPARK).bind(now).execute(&self.pool).await.db()?;
        Ok(r.rows_affected())
    }

    async fn insert_committed(&self, msgs: &[NewMessage], source: u64) -> Result<()> {
        // A single statement is atomic on its own: no BEGIN/COMMIT round trips; concurrent
        // requests share one (see Coalescer).
        if msgs.is_empty() {
            return Ok(());
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

    async fn spool_put(&self, m: &SpooledMail) -> Result<SpoolPut> {
        let mut conn = self.pool.acquire().await.db()?;
        spool_put_on(&mut conn, m).await
    }

    async fn spool_release(&self, id: i64, now: Micros) -> Result<()> {
        spool_release_on(&mut *self.pool.acquire().await.db()?, id, now).await
    }

    async fn spool_due(&self, now: Micros, limit: i64) -> Result<Vec<SpooledMail>> {
        let rows = sqlx::query(
            // The predicate is the partial index's, word for word (so the planner uses it).
            sql::SPOOL_DUE,
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter().map(spool_from_row).collect()
    }

    async fn spool_claim(&self, id: i64, now: Micros) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE mail_spool SET next_attempt_at = $3
              WHERE id = $1 AND next_attempt_at <= $2 AND (state = 'new' OR replies_sent < replies_wanted)",
        )
        .bind(id)
        .bind(now)
        .bind(now.saturating_add(SPOOL_LEASE))
        .execute(&self.pool)
        .await
        .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn spool_attempted(
        &self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()> {
        let mut conn = self.pool.acquire().await.db()?;
        spool_attempted_on(&mut conn, id, response, error, next_attempt_at).await
    }

    async fn spool_purge(&self, before: Micros) -> Result<u64> {
        let r = sqlx::query(sql::SPOOL_PURGE).bind(before).execute(&self.pool).await.db()?;
        Ok(r.rows_affected())
    }

    async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()> {
        if sent.is_empty() {
            return Ok(());
        }
        let (ids, counts): (Vec<i64>, Vec<i64>) = sent.iter().copied().unzip();
        sqlx::query(
            "UPDATE mail_spool m SET replies_sent = u.n FROM UNNEST($1::int8[], $2::int8[]) AS u(id, n) WHERE m.id = u.id",
        )
        .bind(ids)
        .bind(counts)
        .execute(&self.pool)
        .await.db()?;
        Ok(())
    }

    async fn spool_pending(&self, limit: i64) -> Result<Vec<SpooledMail>> {
        let rows = sqlx::query(sql::SPOOL_PENDING).bind(limit).fetch_all(&self.pool).await.db()?;
        rows.iter().map(spool_from_row).collect()
    }

    async fn spool_get(&self, id: i64) -> Result<Option<SpooledMail>> {
        let row = sqlx::query(sql::SPOOL_GET).bind(id).fetch_optional(&self.pool).await.db()?;
        row.as_ref().map(spool_from_row).transpose()
    }

    async fn listen(&self) -> Result<Option<tokio::sync::mpsc::Receiver<QueueId>>> {
        let mut listener = PgListener::connect_with(&self.pool).await.db()?;
        listener.listen(CHANNEL).await.db()?;
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        self.interests.wake_through(tx.clone());
        let waker = self.interests.waker();
        let pool = self.pool.clone();
        tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(n)) => {
                        if let Ok(q) = n.payload().parse::<QueueId>()
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
                    }
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                        let Some(again) = relisten(&pool).await else { return };
                        listener = again;
                        waker.wake_all();
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Some(rx))
    }

    async fn interest(&self, queue: QueueId) -> Result<Interest> {
        self.interests.acquire(queue).await
    }
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
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        };
        match listener.await {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(error = %e, "LISTEN connection: still reconnecting"),
        }
    }
}

#[async_trait]
impl StoreTx for PgTx {
    async fn session_put(&mut self, row: &SessionRow) -> Result<bool> {
        // Written by the next enqueue or session commit of this transaction, or before its
        // commit; see `session_ctes` for `epoch` and `doubt`.
        self.staged = Some(row.clone());
        Ok(true)
    }

    async fn session_end(
        &mut self,
        id_hash: &[u8],
        version: i64,
        idle_before: Option<Micros>,
        tombstone: Option<(&str, bool, Micros)>,
    ) -> Result<bool> {
        let r = sqlx::query(
            "DELETE FROM sessions WHERE id_hash = $1 AND version = $2 AND ($3::bigint IS NULL OR last_used < $3)",
        )
        .bind(id_hash)
        .bind(version)
        .bind(idle_before)
        .execute(&mut *self.tx)
        .await
        .db()?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some((agent, had_work, until)) = tombstone {
            sqlx::query(
                "INSERT INTO session_tombstones (id_hash, agent, had_work, until) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (id_hash) DO UPDATE SET agent = $2, had_work = $3, until = $4",
            )
            .bind(id_hash)
            .bind(agent)
            .bind(had_work)
            .bind(until)
            .execute(&mut *self.tx)
            .await
            .db()?;
        }
        Ok(true)
    }

    async fn idempotency_put(&mut self, r: &IdempotencyRecord) -> Result<bool> {
        let done = sqlx::query(sql::IDEMPOTENCY_PUT)
            .bind(&r.agent)
            .bind(&r.key)
            .bind(&r.request_hash)
            .bind(&r.response)
            .bind(r.created_at)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(done.rows_affected() == 1)
    }

    async fn time_manager_turn(&mut self) -> Result<bool> {
        Ok(sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, 1)")
            .bind(TIME_MANAGER_LOCK)
            .fetch_one(&mut *self.tx)
            .await
            .db()?)
    }

    async fn spool_put(&mut self, m: &SpooledMail) -> Result<SpoolPut> {
        spool_put_on(&mut self.tx, m).await
    }
    async fn spool_attempted(
        &mut self,
        id: i64,
        response: Option<&[u8]>,
        error: Option<&str>,
        next_attempt_at: Option<Micros>,
    ) -> Result<()> {
        spool_attempted_on(&mut self.tx, id, response, error, next_attempt_at).await
    }
    async fn insert_messages(&mut self, msgs: &[NewMessage]) -> Result<()> {
        if msgs.is_empty() {
            return Ok(());
        }
        let msgs = msgs.iter().collect::<Vec<_>>();
        match self.staged.take() {
            None => {
                insert_query(&msgs, None).execute(&mut *self.tx).await.db()?;
            }
            Some(row) => {
                let sealed: i64 =
                    insert_query(&msgs, Some(&row)).fetch_one(&mut *self.tx).await.db()?.try_get("sealed").db()?;
                self.conflict |= sealed != 1;
            }
        }
        Ok(())
    }

    async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>> {
        // A single-consumer message carries its delivery state itself (alias `d` = `m`).
        let single = q.consumer.is_empty();
        let (d, d_seq) = if single { ("m", "m.seq") } else { ("d", "d.msg_seq") };
        let mut b: QueryBuilder<Postgres> = QueryBuilder::new(format!(
            "SELECT m.seq, m.msgid, m.queue_id, {consumer}, m.corrid, m.priority, {d}.prio_key, m.enq_time, m.delay_until,
                    m.expire_at, m.sender, m.exception_queue, m.payload, {d}.retry_count, m.state ",
            consumer = if single { "''::text AS consumer" } else { "d.consumer" },
        ));
        if single {
            b.push("FROM messages m WHERE m.single AND m.queue_id = ").push_bind(q.queue);
        } else {
            b.push("FROM deliveries d JOIN messages m ON m.seq = d.msg_seq WHERE d.queue_id = ").push_bind(q.queue);
            b.push(" AND d.consumer = ").push_bind(q.consumer.clone());
        }
        b.push(" AND (m.enq_txn IS NULL OR m.enq_txn = ").push_bind(q.txn.clone()).push(")");
        b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
        b.push(" AND (m.expire_at IS NULL OR m.expire_at > ").push_bind(q.now).push(")");
        if let Some(p) = q.after {
            b.push(format!(" AND ({d}.prio_key, {d_seq}) > ("))
                .push_bind(p.prio_key)
                .push(", ")
                .push_bind(p.seq)
                .push(")");
        }
        if let Some(c) = &q.corrid {
            b.push(" AND m.corrid = ").push_bind(c.clone());
        }
        if let Some(id) = &q.msgid {
            b.push(" AND m.msgid = ").push_bind(id.to_vec());
        }
        if q.include_locked {
            // Everything but what this transaction has already removed (NULL-safe).
            b.push(format!(" AND ({d}.lock_txn IS NULL OR {d}.lock_kind <> 1 OR {d}.lock_txn <> "))
                .push_bind(q.txn.clone())
                .push(")");
        } else {
            b.push(format!(" AND ({d}.lock_txn IS NULL OR ({d}.lock_kind = 2 AND {d}.lock_txn = "))
                .push_bind(q.txn.clone())
                .push("))");
        }
        b.push(format!(" ORDER BY {d}.prio_key, {d_seq} LIMIT ")).push_bind(q.limit);
        if !q.include_locked {
            // Rows another transaction is claiming right now are skipped, not waited for.
            b.push(format!(" FOR UPDATE OF {d} SKIP LOCKED"));
        }
        let rows = b.build().fetch_all(&mut *self.tx).await.db()?;
        rows.iter().map(stored_from_row).collect()
    }

    async fn lock(&mut self, seq: i64, consumer: &str, txn: &str, kind: LockKind) -> Result<bool> {
        if consumer.is_empty() {
            let r = sqlx::query(
                "UPDATE messages SET lock_txn = $1, lock_kind = $2
                 WHERE seq = $3 AND single AND (lock_txn IS NULL OR (lock_txn = $1 AND lock_kind = 2))",
            )
            .bind(txn)
            .bind(kind as i64)
            .bind(seq)
            .execute(&mut *self.tx)
            .await
            .db()?;
            return Ok(r.rows_affected() == 1);
        }
        let r = sqlx::query(sql::DELIVERY_LOCK)
            .bind(txn)
            .bind(kind as i64)
            .bind(seq)
            .bind(consumer)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, shared: bool) -> Result<bool> {
        if consumer.is_empty() {
            let r = sqlx::query(
                "DELETE FROM messages WHERE seq = $1 AND single AND (lock_txn IS NULL OR (lock_txn = $2 AND lock_kind = 2))",
            )
            .bind(seq)
            .bind(txn)
            .execute(&mut *self.tx)
            .await.db()?;
            return Ok(r.rows_affected() == 1);
        }
        if shared {
            // Consumers of one message serialise on its row, so the last one out sees that
            // no delivery is left and deletes the message.
            sqlx::query("SELECT seq FROM messages WHERE seq = $1 FOR UPDATE")
                .bind(seq)
                .execute(&mut *self.tx)
                .await
                .db()?;
        }
        let removed: Option<i64> = sqlx::query_scalar(
            "WITH d AS (
                DELETE FROM deliveries WHERE msg_seq = $1 AND consumer = $2 AND (lock_txn IS NULL OR (lock_txn = $3 AND lock_kind = 2))
                RETURNING msg_seq
             ), m AS (
                DELETE FROM messages WHERE seq IN (SELECT msg_seq FROM d)
                  AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = $1 AND x.consumer <> $2)
             )
             SELECT msg_seq FROM d",
        )
        .bind(seq)
        .bind(consumer)
        .bind(txn)
        .fetch_optional(&mut *self.tx)
        .await.db()?;
        Ok(removed.is_some())
    }

    async fn commit_session(&mut self, txn: &str, dequeues: bool) -> Result<CommitOutcome> {
        // The enqueues are published and signalled in one statement (one round trip), with
        // the session's row when one is staged.
        let published: Vec<(i64, i64)> = match self.staged.take() {
            None => sqlx::query_as(PUBLISH_SQL).bind(txn).bind(CHANNEL).fetch_all(&mut *self.tx).await.db()?,
            Some(row) => {
                let rows = bind_session(sqlx::query(&PUBLISH_SEALED_SQL[variant(&row)]).bind(txn).bind(CHANNEL), &row)
                    .fetch_all(&mut *self.tx)
                    .await
                    .db()?;
                let mut out = Vec::with_capacity(rows.len());
                for r in &rows {
                    self.conflict |= r.try_get::<i64, _>("sealed").db()? != 1;
                    if let Some(q) = r.try_get::<Option<i64>, _>("q").db()? {
                        out.push((q, r.try_get::<i64, _>("n").db()?));
                    }
                }
                out
            }
        };
        let queues: Vec<i64> = published.iter().map(|(q, _)| *q).collect();
        let published = published.iter().map(|(_, n)| u64::try_from(*n).unwrap_or(0)).sum();
        if dequeues {
            // Lock the messages whose deliveries this transaction removes (in one order, so
            // concurrent commits cannot deadlock); then a message whose last delivery goes is
            // deleted exactly once, even when its consumers commit at the same time.
            sqlx::query(
                "SELECT m.seq FROM messages m JOIN deliveries d ON d.msg_seq = m.seq
                 WHERE d.lock_txn = $1 AND d.lock_kind = 1 ORDER BY m.seq FOR UPDATE OF m",
            )
            .bind(txn)
            .execute(&mut *self.tx)
            .await
            .db()?;
            sqlx::query(
                "WITH d AS (DELETE FROM deliveries WHERE lock_txn = $1 AND lock_kind = 1 RETURNING msg_seq)
                 DELETE FROM messages WHERE seq IN (SELECT msg_seq FROM d)
                   AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = messages.seq
                                   AND NOT (x.lock_txn IS NOT NULL AND x.lock_txn = $1 AND x.lock_kind = 1))",
            )
            .bind(txn)
            .execute(&mut *self.tx)
            .await
            .db()?;
            sqlx::query(sql::DELIVERIES_UNLOCK_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
            // Single-consumer messages: removed ones go, locked ones are released (disjoint
            // rows, so one statement).
            sqlx::query(
                "WITH gone AS (DELETE FROM messages WHERE lock_txn = $1 AND lock_kind = 1)
                 UPDATE messages SET lock_txn = NULL, lock_kind = NULL WHERE lock_txn = $1 AND lock_kind <> 1",
            )
            .bind(txn)
            .execute(&mut *self.tx)
            .await
            .db()?;
        }
        Ok(CommitOutcome { enqueued_queues: queues, published })
    }

    async fn rollback_session(&mut self, txn: &str) -> Result<Vec<Released>> {
        sqlx::query(sql::NOTIFY_DROP_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        sqlx::query(
            "WITH m AS (DELETE FROM messages WHERE enq_txn = $1 RETURNING seq)
             DELETE FROM deliveries WHERE msg_seq IN (SELECT seq FROM m)",
        )
        .bind(txn)
        .execute(&mut *self.tx)
        .await
        .db()?;
        let rows = sqlx::query(
            "WITH d AS (
                UPDATE deliveries SET retry_count = retry_count + 1, lock_txn = NULL, lock_kind = NULL
                WHERE lock_txn = $1 AND lock_kind = 1 RETURNING msg_seq, queue_id, retry_count, consumer
             ), s AS (
                UPDATE messages SET retry_count = retry_count + 1, lock_txn = NULL, lock_kind = NULL
                WHERE lock_txn = $1 AND lock_kind = 1 RETURNING seq AS msg_seq, queue_id, retry_count, '' AS consumer
             )
             SELECT x.*, m.exception_queue
             FROM (SELECT * FROM d UNION ALL SELECT * FROM s) x JOIN messages m ON m.seq = x.msg_seq",
        )
        .bind(txn)
        .fetch_all(&mut *self.tx)
        .await
        .db()?;
        sqlx::query(
            "WITH d AS (UPDATE deliveries SET lock_txn = NULL, lock_kind = NULL WHERE lock_txn = $1)
             UPDATE messages SET lock_txn = NULL, lock_kind = NULL WHERE lock_txn = $1",
        )
        .bind(txn)
        .execute(&mut *self.tx)
        .await
        .db()?;
        rows.iter()
            .map(|r| {
                Ok(Released {
                    seq: r.try_get("msg_seq").db()?,
                    queue: r.try_get("queue_id").db()?,
                    retry_count: r.try_get("retry_count").db()?,
                    consumer: r.try_get("consumer").db()?,
                    exception_queue: r.try_get("exception_queue").db()?,
                })
            })
            .collect()
    }

    async fn drop_delivery(&mut self, seq: i64, consumer: &str) -> Result<i64> {
        // The message row first: its consumers giving up (or removing) at the same time
        // count one after the other, so exactly one of them sees no delivery left.
        sqlx::query("SELECT 1 FROM messages WHERE seq = $1 FOR UPDATE").bind(seq).execute(&mut *self.tx).await.db()?;
        Ok(sqlx::query_scalar(
            "WITH gone AS (DELETE FROM deliveries WHERE msg_seq = $1 AND consumer = $2 RETURNING 1)
             SELECT count(*) FROM deliveries WHERE msg_seq = $1 AND consumer <> $2",
        )
        .bind(seq)
        .bind(consumer)
        .fetch_one(&mut *self.tx)
        .await
        .db()?)
    }

    async fn move_to_exception(&mut self, seq: i64, to: QueueId) -> Result<()> {
        // A message a consumer has locked meanwhile (between `due_expirations` and here)
        // stays where it is; the lock holder decides. The message row is locked first, so
        // a single-consumer lock cannot slip in between.
        let locked: Option<bool> = sqlx::query_scalar(
            "SELECT m.lock_txn IS NOT NULL
                    OR EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)
             FROM messages m WHERE m.seq = $1 FOR UPDATE OF m",
        )
        .bind(seq)
        .fetch_optional(&mut *self.tx)
        .await
        .db()?;
        if locked != Some(false) {
            return Ok(());
        }
        sqlx::query(sql::DELIVERIES_DROP_MESSAGE).bind(seq).execute(&mut *self.tx).await.db()?;
        // An exception queue has one consumer: the message now carries its delivery.
        sqlx::query(
            "UPDATE messages SET queue_id = $2, state = 3, expire_at = NULL, delay_until = NULL,
                    single = true, prio_key = 0, retry_count = 0
             WHERE seq = $1",
        )
        .bind(seq)
        .bind(to)
        .execute(&mut *self.tx)
        .await
        .db()?;
        Ok(())
    }

    async fn upsert_registration(&mut self, r: &Registration) -> Result<()> {
        sqlx::query(sql::REGISTRATION_UPSERT)
            .bind(r.queue)
            .bind(&r.consumer)
            .bind(&r.notify_url)
            .bind(&r.agent)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(())
    }

    async fn delete_registration(&mut self, queue: QueueId, consumer: &str, agent: &str) -> Result<bool> {
        let r = sqlx::query(sql::REGISTRATION_DELETE)
            .bind(queue)
            .bind(consumer)
            .bind(agent)
            .execute(&mut *self.tx)
            .await
            .db()?;
        sqlx::query(sql::NOTIFY_DROP_REGISTRATION)
            .bind(queue)
            .bind(consumer)
            .bind(agent)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn put_topology_object(&mut self, kind: &str, name: &str, spec: &str) -> Result<()> {
        sqlx::query(sql::TOPOLOGY_PUT).bind(kind).bind(name).bind(spec).execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn delete_topology_object(&mut self, kind: &str, name: &str) -> Result<()> {
        sqlx::query(sql::TOPOLOGY_DELETE).bind(kind).bind(name).execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn ensure_queue(&mut self, name: &str) -> Result<QueueId> {
        sqlx::query(sql::QUEUE_ENSURE).bind(name).execute(&mut *self.tx).await.db()?;
        Ok(sqlx::query_scalar(sql::QUEUE_ID).bind(name).fetch_one(&mut *self.tx).await.db()?)
    }

    async fn savepoint(&mut self) -> Result<()> {
        sqlx::query("SAVEPOINT aq_request").execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<()> {
        sqlx::query("RELEASE SAVEPOINT aq_request").execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        sqlx::query("ROLLBACK TO SAVEPOINT aq_request").execute(&mut *self.tx).await.db()?;
        sqlx::query("RELEASE SAVEPOINT aq_request").execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> Result<()> {
        if let Some(row) = self.staged.take() {
            let sealed: i64 = bind_session(sqlx::query(&SESSION_ALONE_SQL[variant(&row)]), &row)
                .fetch_one(&mut *self.tx)
                .await
                .db()?
                .try_get("sealed")
                .db()?;
            self.conflict |= sealed != 1;
        }
        if self.conflict {
            self.tx.rollback().await.db()?;
            return Err(StoreError::session_conflict());
        }
        self.tx.commit().await.db()?;
        Ok(())
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        self.tx.rollback().await.db()?;
        Ok(())
    }
}

/// Takes up to `limit` heads of `q`'s queue for its consumer: claims them (rows other
/// consumers are claiming are skipped, not waited for), deletes them, and returns them —
/// one statement. Single-consumer queues only (a multi-consumer message stays until its
/// last consumer has it).
fn take_heads(q: &CandidateQuery, limit: i64) -> QueryBuilder<'static, Postgres> {
    debug_assert!(q.consumer.is_empty(), "take_heads is for single-consumer queues");
    let mut b: QueryBuilder<Postgres> =
        QueryBuilder::new("WITH c AS (SELECT m.seq FROM messages m WHERE m.single AND m.queue_id = ");
    b.push_bind(q.queue);
    b.push(" AND m.enq_txn IS NULL AND m.lock_txn IS NULL");
    b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
    b.push(" AND (m.expire_at IS NULL OR m.expire_at > ").push_bind(q.now).push(")");
    if let Some(c) = &q.corrid {
        b.push(" AND m.corrid = ").push_bind(c.clone());
    }
    if let Some(id) = &q.msgid {
        b.push(" AND m.msgid = ").push_bind(id.to_vec());
    }
    b.push(" ORDER BY m.prio_key, m.seq LIMIT ").push_bind(limit);
    b.push(
        " FOR UPDATE OF m SKIP LOCKED)
         DELETE FROM messages m USING c WHERE m.seq = c.seq
         RETURNING m.seq, m.msgid, m.queue_id, ''::text AS consumer, m.corrid, m.priority, m.prio_key, m.enq_time,
                   m.delay_until, m.expire_at, m.sender, m.exception_queue, m.payload, m.retry_count, m.state",
    );
    b
}

/// One statement for a whole message_set: messages and (multi-consumer) their deliveries
/// from arrays, and the wake-up signal for the queues whose messages are visible at commit
/// and that some process holds interest in.
/// The arrays borrow from `msgs` (sqlx encodes them when bound): payloads are not copied
/// on their way into the statement.
/// The insert's CTEs (see `insert_query`): messages, deliveries, outbox rows.
macro_rules! insert_ctes {
    () => {
        "WITH m AS (
            INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, payload, enq_txn, single, prio_key)
            SELECT * FROM UNNEST($1::bytea[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::text[], $9::text[], $10::bytea[], $11::text[], $18::bool[], $19::int8[])
            RETURNING seq, msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, enq_txn, single
         ), d AS (
            INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key)
            SELECT m.seq, c.queue_id, c.consumer, c.prio_key
            FROM m JOIN UNNEST($12::bytea[], $13::text[], $14::int8[], $15::int8[]) AS c(msgid, consumer, queue_id, prio_key) ON c.msgid = m.msgid
            RETURNING msg_seq, queue_id, consumer
         ), o AS (
            INSERT INTO notify_outbox (queue_id, consumer, agent, notify_url, msgid, corrid, priority, enq_time,
                                       delay_until, expire_at, sender, exception_queue, txn, next_attempt_at)
            SELECT m.queue_id, d.consumer, r.agent, r.notify_url, m.msgid, m.corrid, m.priority, m.enq_time,
                   m.delay_until, m.expire_at, m.sender, m.exception_queue, m.enq_txn, COALESCE(m.delay_until, m.enq_time)
            FROM (SELECT msg_seq, queue_id, consumer FROM d UNION ALL SELECT seq, queue_id, '' FROM m WHERE single) d
            JOIN m ON m.seq = d.msg_seq
            JOIN registrations r ON r.queue_id = d.queue_id AND r.consumer = d.consumer
            WHERE EXISTS (SELECT 1 FROM registrations WHERE queue_id = ANY($2::int8[]))
         )"
    };
}

/// The insert with a session row written in the same statement (parameters from `$20`):
/// one row, `sealed` 1 when the row was written.
static INSERT_SEALED_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!(
            "{}, nt AS MATERIALIZED (SELECT pg_notify($16, q::text) FROM UNNEST($17::int8[]) AS q WHERE NOT {}),
         {}
         SELECT (SELECT count(*) FROM nt) AS notified, (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed",
            insert_ctes!(),
            crate::interest::uninterested!(),
            session_ctes(20, new)
        )
    })
});

/// A session row written alone (parameters from `$1`), before a commit.
static SESSION_ALONE_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!("WITH {} SELECT (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed", session_ctes(1, new))
    })
});

fn insert_query<'a>(
    msgs: &[&'a NewMessage],
    session: Option<&'a SessionRow>,
) -> sqlx::query::Query<'a, Postgres, sqlx::postgres::PgArguments> {
    let mut visible: Vec<QueueId> = msgs.iter().filter(|m| m.enq_txn.is_none()).map(|m| m.queue).collect();
    visible.sort_unstable();
    visible.dedup();
    let n = msgs.len();
    let mut ids = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut corrids = Vec::with_capacity(n);
    let mut prios = Vec::with_capacity(n);
    let mut enq = Vec::with_capacity(n);
    let mut delays = Vec::with_capacity(n);
    let mut expires = Vec::with_capacity(n);
    let mut senders = Vec::with_capacity(n);
    let mut excq = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut txns = Vec::with_capacity(n);
    let mut singles = Vec::with_capacity(n);
    let mut prio_keys = Vec::with_capacity(n);
    let (mut d_ids, mut d_consumers, mut d_queues, mut d_prios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for m in msgs {
        ids.push(&m.msgid[..]);
        queues.push(m.queue);
        corrids.push(m.corrid.as_deref());
        prios.push(m.priority);
        enq.push(m.enq_time);
        delays.push(m.delay_until);
        expires.push(m.expire_at);
        senders.push(m.sender.as_deref());
        excq.push(m.exception_queue.as_deref());
        payloads.push(&m.payload[..]);
        txns.push(m.enq_txn.as_deref());
        // A single-consumer message (its one consumer is "") carries its delivery itself.
        let single = m.consumers.len() == 1 && m.consumers[0].is_empty();
        singles.push(single);
        prio_keys.push(m.prio_key);
        if single {
            continue;
        }
        for c in &m.consumers {
            d_ids.push(&m.msgid[..]);
            d_consumers.push(c.as_str());
            d_queues.push(m.queue);
            d_prios.push(m.prio_key);
        }
    }
    let sql: &'static str = match session {
        None => concat!(
            insert_ctes!(),
            "\n         SELECT pg_notify($16, q::text) FROM UNNEST($17::int8[]) AS q WHERE NOT ",
            crate::interest::uninterested!()
        ),
        Some(row) => INSERT_SEALED_SQL[variant(row)].as_str(),
    };
    let q = sqlx::query(sql)
        .bind(ids)
        .bind(queues)
        .bind(corrids)
        .bind(prios)
        .bind(enq)
        .bind(delays)
        .bind(expires)
        .bind(senders)
        .bind(excq)
        .bind(payloads)
        .bind(txns)
        .bind(d_ids)
        .bind(d_consumers)
        .bind(d_queues)
        .bind(d_prios)
        .bind(CHANNEL)
        .bind(visible)
        .bind(singles)
        .bind(prio_keys);
    match session {
        None => q,
        Some(row) => bind_session(q, row),
    }
}

fn registration_from_row(r: &PgRow) -> Result<Registration> {
    Ok(Registration {
        queue: r.try_get("queue_id").db()?,
        consumer: r.try_get("consumer").db()?,
        notify_url: r.try_get("notify_url").db()?,
        agent: r.try_get("agent").db()?,
    })
}

fn outbox_from_row(r: &PgRow) -> Result<OutboxEntry> {
    Ok(OutboxEntry {
        id: r.try_get("id").db()?,
        queue: r.try_get("queue_id").db()?,
        consumer: r.try_get("consumer").db()?,
        agent: r.try_get("agent").db()?,
        notify_url: r.try_get("notify_url").db()?,
        secret: r.try_get("secret").db()?,
        msgid: msgid_from(r.try_get("msgid").db()?)?,
        corrid: r.try_get("corrid").db()?,
        priority: r.try_get("priority").db()?,
        enq_time: r.try_get("enq_time").db()?,
        delay_until: r.try_get("delay_until").db()?,
        expire_at: r.try_get("expire_at").db()?,
        sender: r.try_get("sender").db()?,
        exception_queue: r.try_get("exception_queue").db()?,
        state: r.try_get("state").db()?,
        attempts: r.try_get("attempts").db()?,
        next_attempt_at: r.try_get("next_attempt_at").db()?,
        last_error: r.try_get("last_error").db()?,
    })
}

fn session_from_row(r: &PgRow, id_hash: &[u8]) -> Result<SessionRow> {
    Ok(SessionRow {
        id_hash: id_hash.to_vec(),
        agent: r.try_get("agent").db()?,
        txn: r.try_get("txn").db()?,
        pending: r.try_get("pending").db()?,
        dequeued: r.try_get("dequeued").db()?,
        enqueued: r.try_get("enqueued").db()?,
        positions: r.try_get("positions").db()?,
        last_used: r.try_get("last_used").db()?,
        version: r.try_get("version").db()?,
        intact: r.try_get("intact").db()?,
    })
}

fn spool_from_row(r: &PgRow) -> Result<SpooledMail> {
    Ok(SpooledMail {
        id: r.try_get("id").db()?,
        received_at: r.try_get("received_at").db()?,
        agent: r.try_get("agent").db()?,
        message_id: r.try_get("message_id").db()?,
        dedupe_key: r.try_get("dedupe_key").db()?,
        reply_to: r.try_get("reply_to").db()?,
        subject: r.try_get("subject").db()?,
        idap: r.try_get("idap").db()?,
        state: r.try_get("state").db()?,
        attempts: r.try_get("attempts").db()?,
        response: r.try_get("response").db()?,
        last_error: r.try_get("last_error").db()?,
        replies_wanted: r.try_get("replies_wanted").db()?,
        replies_sent: r.try_get("replies_sent").db()?,
    })
}

/// [`Store::spool_put`] on a connection: autocommit, or inside a transaction (group commit).
async fn spool_put_on(conn: &mut sqlx::PgConnection, m: &SpooledMail) -> Result<SpoolPut> {
    let held = m.state == "held";
    let id: Option<i64> = sqlx::query_scalar(sql::SPOOL_PUT)
        .bind(m.received_at)
        .bind(&m.agent)
        .bind(&m.message_id)
        .bind(&m.reply_to)
        .bind(&m.subject)
        .bind(&m.idap)
        .bind(&m.dedupe_key)
        .bind(held)
        .fetch_optional(&mut *conn)
        .await
        .db()?;
    if let Some(id) = id {
        return Ok(SpoolPut::New(id));
    }
    // A copy of a mail still held (its earlier SMTP transaction ended in a 4xx, or never
    // ended) is that mail's first accepted copy, not a re-send.
    let (id, state): (i64, String) =
        sqlx::query_as(sql::SPOOL_FIND).bind(&m.agent).bind(&m.dedupe_key).fetch_one(&mut *conn).await.db()?;
    if !held {
        spool_release_on(conn, id, m.received_at).await?;
    }
    Ok(if state == "held" { SpoolPut::New(id) } else { SpoolPut::Duplicate(id) })
}

/// [`Store::spool_release`] on a connection; also what a (not held) re-sent copy does.
async fn spool_release_on(conn: &mut sqlx::PgConnection, id: i64, now: Micros) -> Result<()> {
    sqlx::query(sql::SPOOL_WANT_REPLY).bind(id).bind(now).execute(conn).await.db()?;
    Ok(())
}

/// [`Store::spool_attempted`] on a connection: autocommit, or inside a transaction (group commit).
async fn spool_attempted_on(
    conn: &mut sqlx::PgConnection,
    id: i64,
    response: Option<&[u8]>,
    error: Option<&str>,
    next_attempt_at: Option<Micros>,
) -> Result<()> {
    let state = spool_state_after(response, next_attempt_at);
    sqlx::query(sql::SPOOL_ATTEMPTED)
        .bind(id)
        .bind(state)
        .bind(response)
        .bind(error)
        .bind(next_attempt_at)
        .execute(&mut *conn)
        .await
        .db()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(source: u64) -> (InsertJob, tokio::sync::oneshot::Receiver<Result<()>>) {
        let msg = NewMessage {
            msgid: [0; 16],
            queue: 1,
            corrid: None,
            priority: 1,
            enq_time: 0,
            delay_until: None,
            expire_at: None,
            sender: None,
            exception_queue: None,
            payload: Vec::new(),
            enq_txn: None,
            consumers: vec![String::new()],
            prio_key: 0,
        };
        let (done, answer) = tokio::sync::oneshot::channel();
        (InsertJob { msgs: vec![msg], sent: Sent::now(source), done }, answer)
    }

    /// Sources 1..=4 came back 200 µs after their answers before, and were answered now.
    fn four_regulars() -> Regulars {
        let mut r = Regulars::default();
        let t = std::time::Instant::now();
        for s in 1..=4 {
            r.answered(s, t - Duration::from_micros(400));
            r.arrived(s, t - Duration::from_micros(200));
            r.answered(s, t);
        }
        r
    }

    // On the test's single-threaded runtime the spawned producers run only when the writer
    // waits: without waiting for regulars the batch would be the first request alone.
    #[tokio::test]
    async fn the_writer_waits_for_the_regulars_it_has_just_answered() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut regulars = four_regulars();
        let (first, _a) = job(1);
        let others: Vec<_> = (2..=4).map(job).collect();
        let (jobs, _answers): (Vec<_>, Vec<_>) = others.into_iter().unzip();
        let sender = tx.clone();
        tokio::spawn(async move {
            for j in jobs {
                let _ = sender.send(j);
            }
        });
        let batch = Coalescer::collect(
            &mut rx,
            first,
            &mut regulars,
            COALESCE_MAX_ROWS,
            &GroupCounters::register(&Metrics::default()),
        )
        .await;
        let mut sources: Vec<u64> = batch.iter().map(Job::source).collect();
        sources.sort_unstable();
        assert_eq!(sources, vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_stranger_is_written_at_once() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut regulars = four_regulars();
        // Everyone expected is in the batch already, and 9 has never been seen.
        let (first, _a) = job(9);
        let mut answers = Vec::new();
        for s in 1..=4 {
            let (j, a) = job(s);
            tx.send(j).expect("open");
            answers.push(a);
        }
        let (late, _b) = job(5);
        tokio::spawn(async move {
            let _ = tx.send(late);
        });
        let batch = Coalescer::collect(
            &mut rx,
            first,
            &mut regulars,
            COALESCE_MAX_ROWS,
            &GroupCounters::register(&Metrics::default()),
        )
        .await;
        let sources: Vec<u64> = batch.iter().map(Job::source).collect();
        assert_eq!(sources, vec![9, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_regular_that_does_not_come_back_delays_the_batch_at_most_max_wait() {
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut regulars = four_regulars();
        let (first, _a) = job(1);
        let started = std::time::Instant::now();
        let batch = Coalescer::collect(
            &mut rx,
            first,
            &mut regulars,
            COALESCE_MAX_ROWS,
            &GroupCounters::register(&Metrics::default()),
        )
        .await;
        assert_eq!(batch.len(), 1);
        // The timer wheel has millisecond ticks, so the wait ends at the tick after the cap;
        // the margin is for a loaded test machine, not for the writer.
        assert!(started.elapsed() < crate::regulars::MAX_WAIT + Duration::from_millis(500));
    }
}
