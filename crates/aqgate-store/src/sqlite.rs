//! SQLite backend: one file, WAL, `synchronous=FULL` (a 200 means the commit is on disk).
//!
//! SQLite has one writer at a time, so the pool holds a single connection and requests
//! queue for it in order; a long-poll never holds it while waiting.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool, Transaction};

use crate::*;

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:`) and runs the migrations.
    pub async fn open(url: &str) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str(url)
            .db()?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(60))
            // A local file does not go stale like a socket: no ping round trip through
            // sqlx's worker thread before every statement.
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .db()?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await.db()?;
        Ok(Self { pool })
    }
}

pub struct SqliteTx {
    tx: Transaction<'static, Sqlite>,
}

fn msgid_from(v: Vec<u8>) -> Result<[u8; 16]> {
    v.try_into().map_err(|_| StoreError::corrupt("msgid is not 16 bytes"))
}

const OUTBOX_SELECT: &str = "SELECT o.id, o.queue_id, o.consumer, o.agent, o.notify_url, r.secret, o.msgid, o.corrid,
        o.priority, o.enq_time, o.delay_until, o.expire_at, o.sender, o.exception_queue, o.state, o.attempts,
        o.next_attempt_at, o.last_error
     FROM notify_outbox o
     LEFT JOIN registrations r ON r.queue_id = o.queue_id AND r.consumer = o.consumer AND r.agent = o.agent";

fn registration_from_row(r: &SqliteRow) -> Result<Registration> {
    Ok(Registration {
        queue: r.try_get("queue_id").db()?,
        consumer: r.try_get("consumer").db()?,
        notify_url: r.try_get("notify_url").db()?,
        agent: r.try_get("agent").db()?,
    })
}

fn outbox_from_row(r: &SqliteRow) -> Result<OutboxEntry> {
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

fn stored_from_row(r: &SqliteRow) -> Result<StoredMessage> {
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
impl Store for SqliteStore {
    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        let tx = self.pool.begin().await.db()?;
        Ok(Box::new(SqliteTx { tx }))
    }

    async fn recover(&self) -> Result<u64> {
        let mut tx = self.pool.begin().await.db()?;
        let a =
            sqlx::query("DELETE FROM messages WHERE enq_txn IS NOT NULL AND enq_txn NOT IN (SELECT txn FROM sessions)")
                .execute(&mut *tx)
                .await
                .db()?;
        let b = sqlx::query(sql::RECOVER_UNLOCK_ORPHANED).execute(&mut *tx).await.db()?;
        sqlx::query(sql::RECOVER_DROP_ORPHANED_NOTIFICATIONS).execute(&mut *tx).await.db()?;
        tx.commit().await.db()?;
        Ok(a.rows_affected() + b.rows_affected())
    }

    async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup> {
        let row = sqlx::query(
            "SELECT 0 AS ended, agent, txn, pending, dequeued, enqueued, positions, last_used, version
               FROM sessions WHERE id_hash = ?1
             UNION ALL
             SELECT 1, agent, '', had_work, 0, 0, '', 0, 0 FROM session_tombstones WHERE id_hash = ?1",
        )
        .bind(id_hash)
        .fetch_optional(&self.pool)
        .await
        .db()?;
        let Some(r) = row else { return Ok(SessionLookup::Unknown) };
        if r.try_get::<i64, _>("ended").db()? == 1 {
            return Ok(SessionLookup::Ended { agent: r.try_get("agent").db()?, had_work: r.try_get("pending").db()? });
        }
        Ok(SessionLookup::Live(session_from_row(&r, id_hash)?))
    }

    async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()> {
        sqlx::query("UPDATE sessions SET last_used = max(last_used, ?2) WHERE id_hash = ?1")
            .bind(id_hash)
            .bind(until)
            .execute(&self.pool)
            .await
            .db()?;
        Ok(())
    }

    async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>> {
        let rows = sqlx::query(
            "SELECT id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version
               FROM sessions WHERE last_used < ?1 ORDER BY last_used LIMIT ?2",
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
             WHERE m.expire_at IS NOT NULL AND m.expire_at <= ?1 AND m.enq_txn IS NULL
               AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = m.seq AND d.lock_txn IS NOT NULL)
             ORDER BY m.expire_at LIMIT ?2",
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
        let mut tx = self.pool.begin().await.db()?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "UPDATE notify_outbox SET next_attempt_at = ?2, attempts = attempts + 1
             WHERE id IN (SELECT id FROM notify_outbox WHERE state = 'new' AND txn IS NULL AND next_attempt_at <= ?1
                          ORDER BY next_attempt_at, id LIMIT ?3)
             RETURNING id",
        )
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .db()?;
        let mut out = Vec::with_capacity(ids.len());
        for part in ids.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(OUTBOX_SELECT);
            b.push(" WHERE o.id IN (");
            let mut sep = b.separated(", ");
            for id in part {
                sep.push_bind(*id);
            }
            b.push(") ORDER BY o.next_attempt_at, o.id");
            for r in b.build().fetch_all(&mut *tx).await.db()? {
                out.push(outbox_from_row(&r)?);
            }
        }
        tx.commit().await.db()?;
        out.sort_by_key(|e| e.id);
        Ok(out)
    }

    async fn notify_delivered(&self, ids: &[i64]) -> Result<()> {
        for part in ids.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("DELETE FROM notify_outbox WHERE id IN (");
            let mut sep = b.separated(", ");
            for id in part {
                sep.push_bind(*id);
            }
            b.push(")");
            b.build().execute(&self.pool).await.db()?;
        }
        Ok(())
    }

    async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()> {
        sqlx::query(
            "UPDATE notify_outbox SET last_error = ?2,
                    state = CASE WHEN ?3 IS NULL THEN 'parked' ELSE state END,
                    next_attempt_at = COALESCE(?3, next_attempt_at)
             WHERE id = ?1",
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
        let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(OUTBOX_SELECT);
        b.push(" WHERE o.txn IS NULL ORDER BY o.id LIMIT ").push_bind(limit);
        b.build().fetch_all(&self.pool).await.db()?.iter().map(outbox_from_row).collect()
    }

    async fn notify_counts(&self) -> Result<(i64, i64)> {
        let r = sqlx::query(
            "SELECT COALESCE(SUM(state = 'new'), 0) AS pending, COALESCE(SUM(state = 'parked'), 0) AS parked
             FROM notify_outbox WHERE txn IS NULL",
        )
        .fetch_one(&self.pool)
        .await
        .db()?;
        Ok((r.try_get("pending").db()?, r.try_get("parked").db()?))
    }

    async fn notify_unpark(&self, now: Micros) -> Result<u64> {
        let r = sqlx::query(sql::NOTIFY_UNPARK).bind(now).execute(&self.pool).await.db()?;
        Ok(r.rows_affected())
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
        for part in sent.chunks(400) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE mail_spool SET replies_sent = CASE id");
            for (id, n) in part {
                b.push(" WHEN ").push_bind(*id).push(" THEN ").push_bind(*n);
            }
            b.push(" ELSE replies_sent END WHERE id IN (");
            let mut ids = b.separated(", ");
            for (id, _) in part {
                ids.push_bind(*id);
            }
            b.push(")");
            b.build().execute(&self.pool).await.db()?;
        }
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
        Ok(None)
    }
}

#[async_trait]
impl StoreTx for SqliteTx {
    async fn session_put(&mut self, row: &SessionRow) -> Result<bool> {
        let sql = if row.version == 1 {
            "INSERT INTO sessions (id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (id_hash) DO NOTHING"
        } else {
            "UPDATE sessions SET agent = ?2, txn = ?3, pending = ?4, dequeued = ?5, enqueued = ?6, positions = ?7,
                    last_used = max(last_used, ?8), version = ?9
              WHERE id_hash = ?1 AND version = ?9 - 1"
        };
        let r = sqlx::query(sql)
            .bind(&row.id_hash)
            .bind(&row.agent)
            .bind(&row.txn)
            .bind(row.pending)
            .bind(row.dequeued)
            .bind(row.enqueued)
            .bind(&row.positions)
            .bind(row.last_used)
            .bind(row.version)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn session_end(
        &mut self,
        id_hash: &[u8],
        version: i64,
        idle_before: Option<Micros>,
        tombstone: Option<(&str, bool, Micros)>,
    ) -> Result<bool> {
        let r =
            sqlx::query("DELETE FROM sessions WHERE id_hash = ?1 AND version = ?2 AND (?3 IS NULL OR last_used < ?3)")
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
                "INSERT OR REPLACE INTO session_tombstones (id_hash, agent, had_work, until) VALUES (?1, ?2, ?3, ?4)",
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
        // Multi-row inserts, in chunks that stay under SQLite's bound-parameter limit.
        for chunk in msgs.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, payload, enq_txn) ",
            );
            b.push_values(chunk, |mut row, m| {
                row.push_bind(m.msgid.to_vec())
                    .push_bind(m.queue)
                    .push_bind(m.corrid.clone())
                    .push_bind(m.priority)
                    .push_bind(m.enq_time)
                    .push_bind(m.delay_until)
                    .push_bind(m.expire_at)
                    .push_bind(m.sender.clone())
                    .push_bind(m.exception_queue.clone())
                    .push_bind(m.payload.clone())
                    .push_bind(m.enq_txn.clone());
            });
            b.push(" RETURNING seq, msgid");
            let rows = b.build().fetch_all(&mut *self.tx).await.db()?;
            let mut seqs = std::collections::HashMap::with_capacity(rows.len());
            for r in &rows {
                seqs.insert(msgid_from(r.try_get("msgid").db()?)?, r.try_get::<i64, _>("seq").db()?);
            }
            let deliveries: Vec<(i64, &NewMessage, &String)> = chunk
                .iter()
                .flat_map(|m| m.consumers.iter().map(move |c| (m, c)))
                .filter_map(|(m, c)| seqs.get(&m.msgid).map(|s| (*s, m, c)))
                .collect();
            for part in deliveries.chunks(2000) {
                let mut b: QueryBuilder<Sqlite> =
                    QueryBuilder::new("INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key) ");
                b.push_values(part, |mut row, (seq, m, c)| {
                    row.push_bind(*seq).push_bind(m.queue).push_bind((*c).clone()).push_bind(m.prio_key);
                });
                b.build().execute(&mut *self.tx).await.db()?;
            }
            // The outbox rows come with the deliveries: trigger notify_outbox_on_delivery
            // (migrations/sqlite/0005).
        }
        Ok(())
    }

    async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>> {
        let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT m.seq, m.msgid, m.queue_id, d.consumer, m.corrid, m.priority, d.prio_key, m.enq_time, m.delay_until,
                    m.expire_at, m.sender, m.exception_queue, m.payload, d.retry_count, m.state
             FROM deliveries d JOIN messages m ON m.seq = d.msg_seq WHERE d.queue_id = ",
        );
        b.push_bind(q.queue).push(" AND d.consumer = ").push_bind(q.consumer.clone());
        b.push(" AND (m.enq_txn IS NULL OR m.enq_txn = ").push_bind(q.txn.clone()).push(")");
        b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
        b.push(" AND (m.expire_at IS NULL OR m.expire_at > ").push_bind(q.now).push(")");
        if let Some(p) = q.after {
            b.push(" AND (d.prio_key, d.msg_seq) > (").push_bind(p.prio_key).push(", ").push_bind(p.seq).push(")");
        }
        if let Some(c) = &q.corrid {
            b.push(" AND m.corrid = ").push_bind(c.clone());
        }
        if let Some(id) = &q.msgid {
            b.push(" AND m.msgid = ").push_bind(id.to_vec());
        }
        if q.include_locked {
            // Everything but what this transaction has already removed (NULL-safe).
            b.push(" AND (d.lock_txn IS NULL OR d.lock_kind <> 1 OR d.lock_txn <> ").push_bind(q.txn.clone()).push(")");
        } else {
            b.push(" AND (d.lock_txn IS NULL OR (d.lock_kind = 2 AND d.lock_txn = ")
                .push_bind(q.txn.clone())
                .push("))");
        }
        b.push(" ORDER BY d.prio_key, d.msg_seq LIMIT ").push_bind(q.limit);
        let rows = b.build().fetch_all(&mut *self.tx).await.db()?;
        rows.iter().map(stored_from_row).collect()
    }

    async fn lock(&mut self, seq: i64, consumer: &str, txn: &str, kind: LockKind) -> Result<bool> {
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

    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, _shared: bool) -> Result<bool> {
        // One writer at a time: no other consumer can interleave here.
        let r = sqlx::query(
            "DELETE FROM deliveries WHERE msg_seq = ?1 AND consumer = ?2 AND (lock_txn IS NULL OR (lock_txn = ?3 AND lock_kind = 2))",
        )
        .bind(seq)
        .bind(consumer)
        .bind(txn)
        .execute(&mut *self.tx)
        .await.db()?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM messages WHERE seq = ?1 AND NOT EXISTS (SELECT 1 FROM deliveries WHERE msg_seq = ?1)")
            .bind(seq)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(true)
    }

    async fn commit_session(&mut self, txn: &str, dequeues: bool) -> Result<CommitOutcome> {
        sqlx::query("UPDATE notify_outbox SET txn = NULL WHERE txn = ?1")
            .bind(txn)
            .execute(&mut *self.tx)
            .await
            .db()?;
        let queues: Vec<i64> =
            sqlx::query_scalar("UPDATE messages SET enq_txn = NULL WHERE enq_txn = ?1 RETURNING queue_id")
                .bind(txn)
                .fetch_all(&mut *self.tx)
                .await
                .db()?;
        let published = queues.len() as u64;
        if dequeues {
            let removed: Vec<i64> =
                sqlx::query_scalar("DELETE FROM deliveries WHERE lock_txn = ?1 AND lock_kind = 1 RETURNING msg_seq")
                    .bind(txn)
                    .fetch_all(&mut *self.tx)
                    .await
                    .db()?;
            for seq in removed {
                sqlx::query(
                    "DELETE FROM messages WHERE seq = ?1 AND NOT EXISTS (SELECT 1 FROM deliveries WHERE msg_seq = ?1)",
                )
                .bind(seq)
                .execute(&mut *self.tx)
                .await
                .db()?;
            }
            sqlx::query(sql::DELIVERIES_UNLOCK_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        }
        let mut enqueued_queues = queues;
        enqueued_queues.sort_unstable();
        enqueued_queues.dedup();
        Ok(CommitOutcome { enqueued_queues, published })
    }

    async fn rollback_session(&mut self, txn: &str) -> Result<Vec<Released>> {
        sqlx::query(sql::NOTIFY_DROP_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        sqlx::query("DELETE FROM messages WHERE enq_txn = ?1").bind(txn).execute(&mut *self.tx).await.db()?;
        let rows = sqlx::query(
            "UPDATE deliveries SET retry_count = retry_count + 1, lock_txn = NULL, lock_kind = NULL
             WHERE lock_txn = ?1 AND lock_kind = 1
             RETURNING msg_seq, queue_id, retry_count, consumer,
                       (SELECT exception_queue FROM messages WHERE seq = msg_seq) AS exception_queue",
        )
        .bind(txn)
        .fetch_all(&mut *self.tx)
        .await
        .db()?;
        sqlx::query(sql::DELIVERIES_UNLOCK_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        rows.iter().map(released_from_row).collect()
    }

    async fn drop_delivery(&mut self, seq: i64, consumer: &str) -> Result<i64> {
        sqlx::query("DELETE FROM deliveries WHERE msg_seq = ?1 AND consumer = ?2")
            .bind(seq)
            .bind(consumer)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE msg_seq = ?1")
            .bind(seq)
            .fetch_one(&mut *self.tx)
            .await
            .db()?)
    }

    async fn move_to_exception(&mut self, seq: i64, to: QueueId) -> Result<()> {
        // A message a consumer has locked meanwhile stays where it is (SQLite has one
        // writer, so nothing can lock it between this check and the move).
        let locked: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM deliveries WHERE msg_seq = ?1 AND lock_txn IS NOT NULL LIMIT 1")
                .bind(seq)
                .fetch_optional(&mut *self.tx)
                .await
                .db()?;
        if locked.is_some() {
            return Ok(());
        }
        sqlx::query(sql::DELIVERIES_DROP_MESSAGE).bind(seq).execute(&mut *self.tx).await.db()?;
        sqlx::query(
            "UPDATE messages SET queue_id = ?2, state = 3, expire_at = NULL, delay_until = NULL WHERE seq = ?1",
        )
        .bind(seq)
        .bind(to)
        .execute(&mut *self.tx)
        .await
        .db()?;
        sqlx::query("INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key) VALUES (?1, ?2, '', 0)")
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

    async fn commit(self: Box<Self>) -> Result<()> {
        self.tx.commit().await.db()?;
        Ok(())
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        self.tx.rollback().await.db()?;
        Ok(())
    }
}

fn session_from_row(r: &SqliteRow, id_hash: &[u8]) -> Result<SessionRow> {
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
        intact: true,
    })
}

fn spool_from_row(r: &SqliteRow) -> Result<SpooledMail> {
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
async fn spool_put_on(conn: &mut sqlx::SqliteConnection, m: &SpooledMail) -> Result<SpoolPut> {
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
async fn spool_release_on(conn: &mut sqlx::SqliteConnection, id: i64, now: Micros) -> Result<()> {
    sqlx::query(sql::SPOOL_WANT_REPLY).bind(id).bind(now).execute(conn).await.db()?;
    Ok(())
}

/// [`Store::spool_attempted`] on a connection: autocommit, or inside a transaction (group commit).
async fn spool_attempted_on(
    conn: &mut sqlx::SqliteConnection,
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

fn released_from_row(r: &sqlx::sqlite::SqliteRow) -> Result<Released> {
    Ok(Released {
        seq: r.try_get("msg_seq").db()?,
        queue: r.try_get("queue_id").db()?,
        retry_count: r.try_get("retry_count").db()?,
        consumer: r.try_get("consumer").db()?,
        exception_queue: r.try_get("exception_queue").db()?,
    })
}
