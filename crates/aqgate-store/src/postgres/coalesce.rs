//! Group commit for PostgreSQL: the insert and receive writers that combine concurrent
//! requests into one statement each, and the connection each writer keeps.

use super::*;

/// One request's remove-the-head receive.
pub(super) struct TakeJob {
    pub(super) q: CandidateQuery,
    pub(super) sent: Sent,
    pub(super) done: tokio::sync::oneshot::Sender<Result<Option<StoredMessage>>>,
}

/// What the group-commit writers did (registered in the process's metrics).
#[derive(Clone)]
pub(super) struct GroupCounters {
    insert_statements: Counter,
    insert_requests: Counter,
    take_statements: Counter,
    take_requests: Counter,
    /// Batches that waited for a regular (see [`Regulars`]).
    waits: Counter,
}

impl GroupCounters {
    pub(super) fn register(m: &Metrics) -> Self {
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
pub(super) struct Sent {
    pub(super) source: u64,
    pub(super) at: std::time::Instant,
}

impl Sent {
    pub(super) fn now(source: u64) -> Self {
        Self { source, at: std::time::Instant::now() }
    }
}

/// A request waiting for a group-commit writer.
pub(super) trait Job {
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
pub(super) struct InsertJob {
    pub(super) msgs: Vec<NewMessage>,
    pub(super) sent: Sent,
    pub(super) done: tokio::sync::oneshot::Sender<Result<()>>,
}

/// Group commit for PostgreSQL: concurrent `insert_committed` calls are written by one
/// statement (one transaction, one WAL flush) instead of one each; concurrent `take_head`
/// calls on the same queue and consumer take their heads with one statement too. A writer
/// drains its queue, so an idle server adds no wait and a busy one batches what arrived
/// meanwhile. A batch is atomic; if it fails, its requests are written one by one,
/// so one request's failure never fails another's. Nobody is answered before the
/// statement that holds its messages has committed.
pub(super) struct Coalescer;

/// Rows per combined statement (the arrays stay well under the protocol's limits).
pub(super) const COALESCE_MAX_ROWS: usize = 2_000;

/// Statements in flight at once.
pub(super) const COALESCE_WRITERS: usize = 1;

/// An enqueue of this many messages is written on its own, beside the writer.
pub(super) const COALESCE_ALONE_ROWS: usize = 32;

impl Coalescer {
    pub(super) fn start(pool: PgPool, counters: GroupCounters) -> tokio::sync::mpsc::UnboundedSender<InsertJob> {
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
    pub(super) async fn collect<J: Job>(
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

    pub(super) fn start_takes(pool: PgPool, counters: GroupCounters) -> tokio::sync::mpsc::UnboundedSender<TakeJob> {
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
                    let shareable =
                        job.q.corrid.is_none() && job.q.msgid.is_none() && job.q.stored == Stored::Persistent;
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
    pub(super) async fn take(pool: &PgPool, conn: &mut OwnConn, group: Vec<TakeJob>) {
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

    pub(super) async fn write(pool: &PgPool, conn: &mut OwnConn, batch: Vec<InsertJob>) {
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
pub(super) fn fail_all<T>(
    waiting: impl Iterator<Item = tokio::sync::oneshot::Sender<Result<T>>>,
    e: StoreError,
    what: &str,
) {
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
pub(super) struct OwnConn(Option<(sqlx::pool::PoolConnection<Postgres>, std::time::Instant)>);

impl OwnConn {
    pub(super) async fn get(&mut self, pool: &PgPool) -> Result<&mut sqlx::PgConnection> {
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
            None => self.0.insert((crate::health::bounded(pool.acquire()).await?, std::time::Instant::now())),
        };
        *used = std::time::Instant::now();
        Ok(&mut **conn)
    }

    pub(super) fn check<T>(&mut self, r: sqlx::Result<T>) -> Result<T> {
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
    pub(super) async fn insert(&mut self, pool: &PgPool, msgs: &[&NewMessage]) -> Result<()> {
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

    pub(super) async fn take(&mut self, pool: &PgPool, q: &CandidateQuery, n: i64) -> Result<Vec<PgRow>> {
        let r = take_heads(q, n).build().fetch_all(self.get(pool).await?).await;
        self.check(r)
    }
}
