//! A PostgreSQL transaction of a request ([`PgTx`]).

use super::*;

pub struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// A session row to write (see `StoreTx::session_put`): with the transaction's next
    /// enqueue or session commit, in the same statement, else just before its commit.
    staged: Option<SessionRow>,
    /// A folded session write found the row at another version.
    conflict: bool,
}

impl PgTx {
    pub(super) fn new(tx: Transaction<'static, Postgres>) -> Self {
        Self { tx, staged: None, conflict: false }
    }
}

store_tx!(PgTx, {
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

    async fn time_manager_turn(&mut self) -> Result<bool> {
        Ok(sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, 1)")
            .bind(TIME_MANAGER_LOCK)
            .fetch_one(&mut *self.tx)
            .await
            .db()?)
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
        if msgs.iter().any(|m| m.group.is_some()) {
            // Messages of grouped queues only: the default insert stays as it is.
            let (ids, groups): (Vec<&[u8]>, Vec<Option<i64>>) =
                msgs.iter().filter(|m| m.group.is_some()).map(|m| (&m.msgid[..], m.group)).unzip();
            sqlx::query(
                "UPDATE messages m SET grp = g.grp FROM UNNEST($1::bytea[], $2::int8[]) AS g(msgid, grp)
                 WHERE m.msgid = g.msgid",
            )
            .bind(ids)
            .bind(groups)
            .execute(&mut *self.tx)
            .await
            .db()?;
        }
        Ok(())
    }

    async fn candidates(&mut self, q: &CandidateQuery) -> Result<Vec<StoredMessage>> {
        // A single-consumer message carries its delivery state itself (alias `d` = `m`).
        let single = q.consumer.is_empty();
        let (d, d_seq) = if single { ("m", "m.seq") } else { ("d", "d.msg_seq") };
        let mut b: QueryBuilder<Postgres> = QueryBuilder::new(format!(
            "SELECT m.seq, m.msgid, m.queue_id, {consumer}, m.corrid, m.priority, {d}.prio_key, m.enq_time, m.delay_until,
                    m.expire_at, m.sender, m.enq_user_id, m.exception_queue, m.payload, {d}.retry_count, m.state ",
            consumer = if single { "''::text AS consumer" } else { "d.consumer" },
        ));
        if single {
            b.push("FROM messages m WHERE m.single AND m.queue_id = ").push_bind(q.queue);
        } else {
            b.push("FROM deliveries d JOIN messages m ON m.seq = d.msg_seq WHERE d.queue_id = ").push_bind(q.queue);
            b.push(" AND d.consumer = ").push_bind(q.consumer.clone()).push(" AND NOT d.gave_up");
        }
        b.push(" AND (m.enq_txn IS NULL OR m.enq_txn = ").push_bind(q.txn.clone()).push(")");
        if !q.include_waiting {
            b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
        }
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
        crate::sql::push_stored(&mut b, q.stored);
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

    async fn lock_many(&mut self, seqs: &[i64], consumer: &str, txn: &str, kind: LockKind) -> Result<Vec<i64>> {
        // One statement for the batch: the candidates' rows are this transaction's already
        // (FOR UPDATE), so this only marks them.
        let q = if consumer.is_empty() {
            sqlx::query_scalar(
                "UPDATE messages SET lock_txn = $1, lock_kind = $2
                 WHERE seq = ANY($3) AND single AND (lock_txn IS NULL OR (lock_txn = $1 AND lock_kind = 2))
                 RETURNING seq",
            )
        } else {
            sqlx::query_scalar(
                "UPDATE deliveries SET lock_txn = $1, lock_kind = $2
                 WHERE msg_seq = ANY($3) AND consumer = $4 AND NOT gave_up
                   AND (lock_txn IS NULL OR (lock_txn = $1 AND lock_kind = 2))
                 RETURNING msg_seq",
            )
        };
        let mut q = q.bind(txn).bind(kind as i64).bind(seqs);
        if !consumer.is_empty() {
            q = q.bind(consumer);
        }
        q.fetch_all(&mut *self.tx).await.db()
    }

    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, shared: bool) -> Result<Removal> {
        if consumer.is_empty() {
            let r = sqlx::query(
                "DELETE FROM messages WHERE seq = $1 AND single AND (lock_txn IS NULL OR (lock_txn = $2 AND lock_kind = 2))",
            )
            .bind(seq)
            .bind(txn)
            .execute(&mut *self.tx)
            .await.db()?;
            return Ok(if r.rows_affected() == 1 { Removal::Removed } else { Removal::Missed });
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
        // Left only to consumers that gave up on it (a given-up delivery keeps the message):
        // stranded.
        let removed: Option<PgRow> = sqlx::query(
            "WITH d AS (
                DELETE FROM deliveries WHERE msg_seq = $1 AND consumer = $2 AND NOT gave_up
                  AND (lock_txn IS NULL OR (lock_txn = $3 AND lock_kind = 2))
                RETURNING msg_seq
             ), m AS (
                DELETE FROM messages WHERE seq IN (SELECT msg_seq FROM d)
                  AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = $1 AND x.consumer <> $2)
             )
             SELECT d.msg_seq, s.queue_id, s.exception_queue
             FROM d LEFT JOIN messages s ON s.seq = d.msg_seq
                AND EXISTS (SELECT 1 FROM deliveries g WHERE g.msg_seq = $1 AND g.gave_up)
                AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = $1 AND x.consumer <> $2 AND NOT x.gave_up)",
        )
        .bind(seq)
        .bind(consumer)
        .bind(txn)
        .fetch_optional(&mut *self.tx)
        .await.db()?;
        let Some(r) = removed else { return Ok(Removal::Missed) };
        Ok(match r.try_get::<Option<i64>, _>("queue_id").db()? {
            Some(queue) => {
                Removal::Stranded(Stranded { seq, queue, exception_queue: r.try_get("exception_queue").db()? })
            }
            None => Removal::Removed,
        })
    }

    async fn remove_singles(&mut self, seqs: &[i64], txn: &str) -> Result<Vec<i64>> {
        // One statement for the batch: its rows are this transaction's already (the
        // candidates were taken FOR UPDATE).
        sqlx::query_scalar(
            "DELETE FROM messages WHERE seq = ANY($1) AND single AND (lock_txn IS NULL OR (lock_txn = $2 AND lock_kind = 2))
             RETURNING seq",
        )
        .bind(seqs)
        .bind(txn)
        .fetch_all(&mut *self.tx)
        .await
        .db()
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
        let mut stranded = Vec::new();
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
            // (The statement's own deletes are not visible to it: the deliveries it removes
            // are told apart by their lock.) A message left only to consumers that gave up
            // on it (a given-up delivery keeps it) is stranded.
            let rows = sqlx::query(
                "WITH d AS (DELETE FROM deliveries WHERE lock_txn = $1 AND lock_kind = 1 RETURNING msg_seq),
                      m AS (DELETE FROM messages WHERE seq IN (SELECT msg_seq FROM d)
                              AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = messages.seq
                                              AND NOT (x.lock_txn IS NOT NULL AND x.lock_txn = $1 AND x.lock_kind = 1)))
                 SELECT s.seq, s.queue_id, s.exception_queue FROM messages s
                 WHERE s.seq IN (SELECT msg_seq FROM d)
                   AND EXISTS (SELECT 1 FROM deliveries g WHERE g.msg_seq = s.seq AND g.gave_up)
                   AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = s.seq AND NOT x.gave_up
                                   AND NOT (x.lock_txn IS NOT NULL AND x.lock_txn = $1 AND x.lock_kind = 1))",
            )
            .bind(txn)
            .fetch_all(&mut *self.tx)
            .await
            .db()?;
            for r in &rows {
                stranded.push(Stranded {
                    seq: r.try_get("seq").db()?,
                    queue: r.try_get("queue_id").db()?,
                    exception_queue: r.try_get("exception_queue").db()?,
                });
            }
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
        Ok(CommitOutcome { enqueued_queues: queues, published, stranded })
    }

    async fn rollback_session(&mut self, txn: &str, counts: bool) -> Result<Vec<Released>> {
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
                UPDATE deliveries SET retry_count = retry_count + $2, lock_txn = NULL, lock_kind = NULL
                WHERE lock_txn = $1 AND lock_kind = 1 RETURNING msg_seq, queue_id, retry_count, consumer
             ), s AS (
                UPDATE messages SET retry_count = retry_count + $2, lock_txn = NULL, lock_kind = NULL
                WHERE lock_txn = $1 AND lock_kind = 1 RETURNING seq AS msg_seq, queue_id, retry_count, '' AS consumer
             )
             SELECT x.*, m.exception_queue
             FROM (SELECT * FROM d UNION ALL SELECT * FROM s) x JOIN messages m ON m.seq = x.msg_seq",
        )
        .bind(txn)
        .bind(i64::from(counts))
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

    async fn give_up(&mut self, seq: i64, consumer: &str) -> Result<i64> {
        // The message row first: its consumers giving up (or removing) at the same time
        // count one after the other, so exactly one of them sees no live delivery left.
        sqlx::query("SELECT 1 FROM messages WHERE seq = $1 FOR UPDATE").bind(seq).execute(&mut *self.tx).await.db()?;
        Ok(sqlx::query_scalar(
            "WITH g AS (UPDATE deliveries SET gave_up = true, lock_txn = NULL, lock_kind = NULL
                        WHERE msg_seq = $1 AND consumer = $2 RETURNING 1)
             SELECT count(*) FROM deliveries WHERE msg_seq = $1 AND consumer <> $2 AND NOT gave_up",
        )
        .bind(seq)
        .bind(consumer)
        .fetch_one(&mut *self.tx)
        .await
        .db()?)
    }

    async fn move_to_exception(&mut self, seq: i64, to: QueueId, forget_named: bool, why: Expiry) -> Result<()> {
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
        // An exception queue has one consumer: the message now carries its delivery. The
        // views show where it came from, why, and the failed dequeues it had (its own, or
        // its consumers' most).
        sqlx::query(
            "UPDATE messages SET orig_queue_id = queue_id, exc_reason = $4,
                    exc_retries = GREATEST(retry_count,
                        COALESCE((SELECT max(d.retry_count) FROM deliveries d WHERE d.msg_seq = $1), 0)),
                    queue_id = $2, state = 3, expire_at = NULL, delay_until = NULL,
                    single = true, prio_key = 0, retry_count = 0,
                    exception_queue = CASE WHEN $3 THEN NULL ELSE exception_queue END
             WHERE seq = $1",
        )
        .bind(seq)
        .bind(to)
        .bind(forget_named)
        .bind(why.code())
        .execute(&mut *self.tx)
        .await
        .db()?;
        sqlx::query(sql::DELIVERIES_DROP_MESSAGE).bind(seq).execute(&mut *self.tx).await.db()?;
        Ok(())
    }

    async fn define_views(&mut self, tables: &[QueueTableView], retained: &[Retained]) -> Result<()> {
        use crate::views::{Dialect, create_sql, list_sql, quoted, retain_sql};
        // Nodes that start at once define the same views: one after the other (the lock
        // is held until this transaction ends).
        sqlx::query("SELECT pg_advisory_xact_lock($1, 2)").bind(TIME_MANAGER_LOCK).execute(&mut *self.tx).await.db()?;
        let old: Vec<String> = sqlx::query_scalar(list_sql(Dialect::Postgres)).fetch_all(&mut *self.tx).await.db()?;
        for v in old {
            sqlx::query(&format!("DROP VIEW IF EXISTS {}", quoted(&v))).execute(&mut *self.tx).await.db()?;
        }
        for view in tables {
            sqlx::query(&create_sql(Dialect::Postgres, view)).execute(&mut *self.tx).await.db()?;
        }
        let (spec, statements) = retain_sql(Dialect::Postgres, retained);
        // Replaced only when it changes: creating a trigger waits for the writes on
        // `messages` under way, and holds up new ones until this transaction ends.
        let current: Option<Option<String>> = sqlx::query_scalar(
            "SELECT obj_description(t.oid, 'pg_trigger') FROM pg_trigger t
              WHERE t.tgname = 'aqgate_retain' AND t.tgrelid = 'messages'::regclass",
        )
        .fetch_optional(&mut *self.tx)
        .await
        .db()?;
        let unchanged = match &current {
            None => retained.is_empty(),
            Some(comment) => comment.as_deref() == Some(spec.as_str()) && !retained.is_empty(),
        };
        if !unchanged {
            for s in statements {
                sqlx::query(&s).execute(&mut *self.tx).await.db()?;
            }
        }
        Ok(())
    }

    async fn claim_group(&mut self, queue: QueueId, consumer: &str, group: i64, txn: &str, wait: bool) -> Result<bool> {
        super::grouping::claim_group(&mut self.tx, queue, consumer, group, txn, wait).await
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
});
