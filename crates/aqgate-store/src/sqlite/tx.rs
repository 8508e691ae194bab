//! A SQLite transaction of a request ([`SqliteTx`]).

use super::*;

pub struct SqliteTx {
    pub(super) tx: Transaction<'static, Sqlite>,
    /// The store's flag: set when a statement that begins, ends or nests a transaction
    /// fails, so the pool closes the connection (see `fit_to_serve`).
    pub(super) poisoned: Arc<AtomicBool>,
}

impl SqliteTx {
    /// Runs a transaction-control statement; if it fails, the connection is not used again.
    async fn control(&mut self, sql: &'static str) -> Result<()> {
        match sqlx::query(sql).execute(&mut *self.tx).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::debug!(error = %e, sql, "SQLite: a transaction-control statement failed");
                Err(db_error(e))
            }
        }
    }
}

store_tx!(SqliteTx, {
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

    async fn insert_messages(&mut self, msgs: &[NewMessage]) -> Result<()> {
        // Multi-row inserts, in chunks that stay under SQLite's bound-parameter limit.
        for chunk in msgs.chunks(500) {
            // Messages of grouped queues carry their group (a statement of its own shape).
            let grouped = chunk.iter().any(|m| m.group.is_some());
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, payload, enq_txn, enq_user_id, state, enq_txn_id, orig_msgid, orig_queue_id, exc_reason",
            );
            b.push(if grouped { ", grp) " } else { ") " });
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
                    .push_bind(m.enq_txn.clone())
                    .push_bind(m.enq_user_id.clone())
                    .push_bind(if m.spilled { SPILLED } else { 0 })
                    .push_bind(m.enq_txn_id.clone())
                    .push_bind(m.origin.map(|o| o.msgid.to_vec()))
                    .push_bind(m.origin.map(|o| o.queue))
                    .push_bind(m.origin.and_then(|o| o.why).map(|w| w.code()));
                if grouped {
                    row.push_bind(m.group);
                }
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
                    m.expire_at, m.sender, m.enq_user_id, m.exception_queue, m.payload, d.retry_count, m.state
             FROM deliveries d JOIN messages m ON m.seq = d.msg_seq WHERE d.queue_id = ",
        );
        b.push_bind(q.queue).push(" AND d.consumer = ").push_bind(q.consumer.clone()).push(" AND NOT d.gave_up");
        b.push(" AND (m.enq_txn IS NULL OR m.enq_txn = ").push_bind(q.txn.clone()).push(")");
        if !q.include_waiting {
            b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
        }
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
        crate::sql::push_stored(&mut b, q.stored);
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

    async fn lock_many(&mut self, seqs: &[i64], consumer: &str, txn: &str, kind: LockKind) -> Result<Vec<i64>> {
        let mut taken = Vec::with_capacity(seqs.len());
        for part in seqs.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE deliveries SET lock_txn = ");
            b.push_bind(txn).push(", lock_kind = ").push_bind(kind as i64);
            b.push(" WHERE consumer = ").push_bind(consumer).push(" AND NOT gave_up AND msg_seq IN (");
            let mut list = b.separated(", ");
            for seq in part {
                list.push_bind(*seq);
            }
            b.push(") AND (lock_txn IS NULL OR (lock_txn = ")
                .push_bind(txn)
                .push(" AND lock_kind = 2)) RETURNING msg_seq");
            taken.extend(b.build_query_scalar::<i64>().fetch_all(&mut *self.tx).await.db()?);
        }
        Ok(taken)
    }

    async fn remove_now(&mut self, seq: i64, consumer: &str, txn: &str, _shared: bool) -> Result<Removal> {
        // One writer at a time: no other consumer can interleave here.
        let r = sqlx::query(
            "DELETE FROM deliveries WHERE msg_seq = ?1 AND consumer = ?2 AND NOT gave_up
               AND (lock_txn IS NULL OR (lock_txn = ?3 AND lock_kind = 2))",
        )
        .bind(seq)
        .bind(consumer)
        .bind(txn)
        .execute(&mut *self.tx)
        .await
        .db()?;
        if r.rows_affected() != 1 {
            return Ok(Removal::Missed);
        }
        if delete_if_done(&mut self.tx, seq).await? {
            return Ok(Removal::Removed);
        }
        Ok(stranded(&mut self.tx, seq).await?.map_or(Removal::Removed, Removal::Stranded))
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
        let mut stranded_msgs = Vec::new();
        if dequeues {
            let removed: Vec<i64> =
                sqlx::query_scalar("DELETE FROM deliveries WHERE lock_txn = ?1 AND lock_kind = 1 RETURNING msg_seq")
                    .bind(txn)
                    .fetch_all(&mut *self.tx)
                    .await
                    .db()?;
            let mut kept = Vec::new();
            for seq in removed {
                if !delete_if_done(&mut self.tx, seq).await? {
                    kept.push(seq);
                }
            }
            sqlx::query(sql::DELIVERIES_UNLOCK_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
            // Messages that other consumers still have, or that only consumers that gave up
            // on them have.
            for seq in kept {
                stranded_msgs.extend(stranded(&mut self.tx, seq).await?);
            }
        }
        let mut enqueued_queues = queues;
        enqueued_queues.sort_unstable();
        enqueued_queues.dedup();
        Ok(CommitOutcome { enqueued_queues, published, stranded: stranded_msgs })
    }

    async fn rollback_session(&mut self, txn: &str, counts: bool) -> Result<Vec<Released>> {
        sqlx::query(sql::NOTIFY_DROP_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        sqlx::query("DELETE FROM messages WHERE enq_txn = ?1").bind(txn).execute(&mut *self.tx).await.db()?;
        let rows = sqlx::query(
            "UPDATE deliveries SET retry_count = retry_count + ?2, lock_txn = NULL, lock_kind = NULL
             WHERE lock_txn = ?1 AND lock_kind = 1
             RETURNING msg_seq, queue_id, retry_count, consumer,
                       (SELECT exception_queue FROM messages WHERE seq = msg_seq) AS exception_queue",
        )
        .bind(txn)
        .bind(i64::from(counts))
        .fetch_all(&mut *self.tx)
        .await
        .db()?;
        sqlx::query(sql::DELIVERIES_UNLOCK_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
        rows.iter().map(released_from_row).collect()
    }

    async fn give_up(&mut self, seq: i64, consumer: &str) -> Result<i64> {
        sqlx::query(
            "UPDATE deliveries SET gave_up = 1, lock_txn = NULL, lock_kind = NULL WHERE msg_seq = ?1 AND consumer = ?2",
        )
        .bind(seq)
        .bind(consumer)
        .execute(&mut *self.tx)
        .await
        .db()?;
        Ok(sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE msg_seq = ?1 AND NOT gave_up")
            .bind(seq)
            .fetch_one(&mut *self.tx)
            .await
            .db()?)
    }

    async fn move_to_exception(&mut self, seq: i64, to: QueueId, forget_named: bool, why: Expiry) -> Result<()> {
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
        // What the views show of it in the exception queue: where from, why, and the
        // failed dequeues it had (its consumers' most).
        sqlx::query(
            "UPDATE messages SET orig_queue_id = queue_id, exc_reason = ?4,
                    exc_retries = COALESCE((SELECT max(retry_count) FROM deliveries WHERE msg_seq = ?1), 0),
                    queue_id = ?2, state = 3, expire_at = NULL, delay_until = NULL,
                    exception_queue = CASE WHEN ?3 THEN NULL ELSE exception_queue END
             WHERE seq = ?1",
        )
        .bind(seq)
        .bind(to)
        .bind(forget_named)
        .bind(why.code())
        .execute(&mut *self.tx)
        .await
        .db()?;
        sqlx::query(sql::DELIVERIES_DROP_MESSAGE).bind(seq).execute(&mut *self.tx).await.db()?;
        sqlx::query("INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key) VALUES (?1, ?2, '', 0)")
            .bind(seq)
            .bind(to)
            .execute(&mut *self.tx)
            .await
            .db()?;
        Ok(())
    }

    async fn define_views(&mut self, tables: &[QueueTableView], retained: &[Retained]) -> Result<()> {
        use crate::views::{Dialect, create_sql, list_sql, quoted, retain_sql};
        let old: Vec<String> = sqlx::query_scalar(list_sql(Dialect::Sqlite)).fetch_all(&mut *self.tx).await.db()?;
        for v in old {
            sqlx::query(&format!("DROP VIEW IF EXISTS {}", quoted(&v))).execute(&mut *self.tx).await.db()?;
        }
        for view in tables {
            sqlx::query(&create_sql(Dialect::Sqlite, view)).execute(&mut *self.tx).await.db()?;
        }
        for s in retain_sql(Dialect::Sqlite, retained).1 {
            sqlx::query(&s).execute(&mut *self.tx).await.db()?;
        }
        Ok(())
    }

    async fn claim_group(
        &mut self,
        queue: QueueId,
        consumer: &str,
        group: i64,
        txn: &str,
        _wait: bool,
    ) -> Result<bool> {
        super::grouping::claim_group(&mut self.tx, queue, consumer, group, txn).await
    }

    async fn savepoint(&mut self) -> Result<()> {
        self.control("SAVEPOINT aq_request").await
    }

    async fn release_savepoint(&mut self) -> Result<()> {
        self.control("RELEASE SAVEPOINT aq_request").await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<()> {
        self.control("ROLLBACK TO SAVEPOINT aq_request").await?;
        self.control("RELEASE SAVEPOINT aq_request").await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        let poisoned = self.poisoned.clone();
        match self.tx.commit().await {
            Ok(()) => Ok(()),
            Err(e) => {
                poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::debug!(error = %e, "SQLite: COMMIT failed");
                Err(db_error(e))
            }
        }
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        let poisoned = self.poisoned.clone();
        self.tx.rollback().await.map_err(|e| {
            poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
            db_error(e)
        })
    }
});

/// Deletes message `seq` if no delivery of it is left (given-up ones count): whether it did.
async fn delete_if_done(tx: &mut Transaction<'static, Sqlite>, seq: i64) -> Result<bool> {
    let r =
        sqlx::query("DELETE FROM messages WHERE seq = ?1 AND NOT EXISTS (SELECT 1 FROM deliveries WHERE msg_seq = ?1)")
            .bind(seq)
            .execute(&mut **tx)
            .await
            .db()?;
    Ok(r.rows_affected() == 1)
}

/// Message `seq`, if only consumers that gave up on it still have a delivery of it.
async fn stranded(tx: &mut Transaction<'static, Sqlite>, seq: i64) -> Result<Option<Stranded>> {
    let row = sqlx::query(
        "SELECT m.queue_id, m.exception_queue FROM messages m WHERE m.seq = ?1
            AND EXISTS (SELECT 1 FROM deliveries g WHERE g.msg_seq = ?1 AND g.gave_up)
            AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = ?1 AND NOT x.gave_up)",
    )
    .bind(seq)
    .fetch_optional(&mut **tx)
    .await
    .db()?;
    row.map(|r| {
        Ok(Stranded { seq, queue: r.try_get("queue_id").db()?, exception_queue: r.try_get("exception_queue").db()? })
    })
    .transpose()
}

pub(super) fn released_from_row(r: &sqlx::sqlite::SqliteRow) -> Result<Released> {
    Ok(Released {
        seq: r.try_get("msg_seq").db()?,
        queue: r.try_get("queue_id").db()?,
        retry_count: r.try_get("retry_count").db()?,
        consumer: r.try_get("consumer").db()?,
        exception_queue: r.try_get("exception_queue").db()?,
    })
}
