//! Administration's reads ([`AdminStore`]) and the audit log's row, written once for both
//! backends by `admin_store!`: the statements run unchanged on both (`$N` parameters,
//! `CAST`s where PostgreSQL would type a literal `INTEGER`); each backend gives what its
//! schema says otherwise: where a session's locks are (PostgreSQL keeps a single-consumer
//! message's delivery in its row) and a live message's retry count.

/// The audit log's columns, in the order the reader takes them.
pub(crate) const AUDIT_COLUMNS: &str = "id, at, actor, action, queue, target, count, filter, run, msgids, ids_more";

pub(crate) const AUDIT_PUT: &str = "INSERT INTO audit_log (at, actor, action, queue, target, count, filter, run, msgids, \
     ids_more) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `impl AdminStore for $store` (rows `$row`): `$locked` counts the deliveries session
/// transaction `s.txn` holds, `$msg_locked` says whether message `m` is held, and `$retry`
/// is a live message `m`'s failed dequeues (all SQL expressions).
macro_rules! admin_store {
    ($store:ty, $row:ty, locked: $locked:expr, msg_locked: $msg_locked:expr, retry: $retry:expr) => {
        fn audit_from_row(r: &$row) -> Result<AuditRecord> {
            let ids: String = r.try_get("msgids").db()?;
            Ok(AuditRecord {
                id: r.try_get("id").db()?,
                at: r.try_get("at").db()?,
                actor: r.try_get("actor").db()?,
                action: r.try_get("action").db()?,
                queue: r.try_get("queue").db()?,
                target: r.try_get("target").db()?,
                count: r.try_get("count").db()?,
                filter: r.try_get("filter").db()?,
                run: r.try_get("run").db()?,
                msgids: ids.split_whitespace().map(str::to_string).collect(),
                ids_more: r.try_get("ids_more").db()?,
            })
        }

        #[async_trait]
        impl AdminStore for $store {
            async fn exception_page(
                &self,
                queue: QueueId,
                after_seq: i64,
                limit: i64,
            ) -> Result<Vec<ExceptionMessage>> {
                let sql = format!(
                    "SELECT m.seq, m.msgid, m.corrid, m.enq_time, m.orig_queue_id, m.exc_reason,
                            CAST(CASE WHEN {} THEN 1 ELSE 0 END AS BIGINT) AS locked
                       FROM messages m
                      WHERE m.queue_id = $1 AND m.seq > $2 AND m.enq_txn IS NULL AND m.state <> 7
                      ORDER BY m.seq LIMIT $3",
                    $msg_locked
                );
                let rows =
                    sqlx::query(&sql).bind(queue).bind(after_seq).bind(limit).fetch_all(&self.pool).await.db()?;
                rows.iter()
                    .map(|r| {
                        Ok(ExceptionMessage {
                            seq: r.try_get("seq").db()?,
                            msgid: msgid_from(r.try_get("msgid").db()?)?,
                            corrid: r.try_get("corrid").db()?,
                            enq_time: r.try_get("enq_time").db()?,
                            orig_queue: r.try_get("orig_queue_id").db()?,
                            reason: r.try_get("exc_reason").db()?,
                            locked: r.try_get::<i64, _>("locked").db()? != 0,
                        })
                    })
                    .collect()
            }

            async fn audit_list(&self, limit: i64) -> Result<Vec<AuditRecord>> {
                let sql = format!("SELECT {} FROM audit_log ORDER BY id DESC LIMIT $1", crate::admin::AUDIT_COLUMNS);
                let rows = sqlx::query(&sql).bind(limit).fetch_all(&self.pool).await.db()?;
                rows.iter().map(audit_from_row).collect()
            }

            async fn audit_of(&self, msgid_hex: &str) -> Result<Vec<AuditRecord>> {
                let sql = format!(
                    "SELECT {} FROM audit_log WHERE msgids LIKE $1 ORDER BY id LIMIT 1000",
                    crate::admin::AUDIT_COLUMNS
                );
                let like = format!("%{}%", msgid_hex.to_ascii_uppercase());
                let rows = sqlx::query(&sql).bind(like).fetch_all(&self.pool).await.db()?;
                rows.iter().map(audit_from_row).collect()
            }

            async fn message_facts(&self, msgid: &[u8; 16]) -> Result<Option<MessageFacts>> {
                let sql = format!(
                    "SELECT m.seq, m.msgid, q.name AS queue, CAST(0 AS BIGINT) AS kept, m.corrid, m.priority,
                            m.enq_time, m.enq_user_id, m.enq_txn_id, m.enq_txn, m.delay_until, m.expire_at,
                            m.state, {} AS retry_count, m.orig_msgid, oq.name AS orig_queue, m.exc_reason,
                            m.exc_retries, CAST(NULL AS BIGINT) AS deq_time
                       FROM messages m JOIN queues q ON q.id = m.queue_id
                       LEFT JOIN queues oq ON oq.id = m.orig_queue_id
                      WHERE m.msgid = $1
                     UNION ALL
                     SELECT p.seq, p.msgid, q.name, CAST(1 AS BIGINT), p.corrid, p.priority, p.enq_time,
                            p.enq_user_id, p.enq_txn_id, CAST(NULL AS TEXT), p.delay_until, p.expire_at,
                            CAST(-1 AS BIGINT), p.retry_count, p.orig_msgid, oq.name, p.exc_reason,
                            p.exc_retries, p.deq_time
                       FROM processed_messages p JOIN queues q ON q.id = p.queue_id
                       LEFT JOIN queues oq ON oq.id = p.orig_queue_id
                      WHERE p.msgid = $1",
                    $retry
                );
                let row = sqlx::query(&sql).bind(msgid.to_vec()).fetch_optional(&self.pool).await.db()?;
                let Some(r) = row else { return Ok(None) };
                let orig: Option<Vec<u8>> = r.try_get("orig_msgid").db()?;
                Ok(Some(MessageFacts {
                    seq: r.try_get("seq").db()?,
                    msgid: msgid_from(r.try_get("msgid").db()?)?,
                    queue: r.try_get("queue").db()?,
                    kept: r.try_get::<i64, _>("kept").db()? != 0,
                    corrid: r.try_get("corrid").db()?,
                    priority: r.try_get("priority").db()?,
                    enq_time: r.try_get("enq_time").db()?,
                    enq_user_id: r.try_get("enq_user_id").db()?,
                    enq_txn_id: r.try_get("enq_txn_id").db()?,
                    pending_txn: r.try_get("enq_txn").db()?,
                    delay_until: r.try_get("delay_until").db()?,
                    expire_at: r.try_get("expire_at").db()?,
                    state: r.try_get("state").db()?,
                    retry_count: r.try_get("retry_count").db()?,
                    orig_msgid: orig.map(msgid_from).transpose()?,
                    orig_queue: r.try_get("orig_queue").db()?,
                    exc_reason: r.try_get("exc_reason").db()?,
                    exc_retries: r.try_get("exc_retries").db()?,
                    deq_time: r.try_get("deq_time").db()?,
                }))
            }

            async fn message_dequeues(&self, seq: i64) -> Result<Vec<DequeueFact>> {
                let rows = sqlx::query(
                    "SELECT consumer, deq_time, deq_user_id, txn, retry_count FROM dequeue_history
                      WHERE msg_seq = $1 ORDER BY deq_time, consumer",
                )
                .bind(seq)
                .fetch_all(&self.pool)
                .await
                .db()?;
                rows.iter()
                    .map(|r| {
                        Ok(DequeueFact {
                            consumer: r.try_get("consumer").db()?,
                            deq_time: r.try_get("deq_time").db()?,
                            deq_user_id: r.try_get("deq_user_id").db()?,
                            txn: r.try_get("txn").db()?,
                            retry_count: r.try_get("retry_count").db()?,
                        })
                    })
                    .collect()
            }

            async fn message_copies(&self, msgid: &[u8; 16]) -> Result<Vec<CopyFact>> {
                let rows = sqlx::query(
                    "SELECT m.msgid, q.name AS queue, m.enq_time, m.enq_user_id, m.exc_reason,
                            CAST(0 AS BIGINT) AS kept
                       FROM messages m JOIN queues q ON q.id = m.queue_id WHERE m.orig_msgid = $1
                     UNION ALL
                     SELECT p.msgid, q.name, p.enq_time, p.enq_user_id, p.exc_reason, CAST(1 AS BIGINT)
                       FROM processed_messages p JOIN queues q ON q.id = p.queue_id WHERE p.orig_msgid = $1
                      LIMIT 1000",
                )
                .bind(msgid.to_vec())
                .fetch_all(&self.pool)
                .await
                .db()?;
                let mut copies = rows
                    .iter()
                    .map(|r| {
                        Ok(CopyFact {
                            msgid: msgid_from(r.try_get("msgid").db()?)?,
                            queue: r.try_get("queue").db()?,
                            enq_time: r.try_get("enq_time").db()?,
                            enq_user_id: r.try_get("enq_user_id").db()?,
                            exc_reason: r.try_get("exc_reason").db()?,
                            kept: r.try_get::<i64, _>("kept").db()? != 0,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                copies.sort_by_key(|c| c.enq_time);
                Ok(copies)
            }

            async fn message_gateway(&self, msgid_hex: &str) -> Result<Vec<GatewayFact>> {
                let rows = sqlx::query(
                    "SELECT job, message_id, since FROM gateway_doubt WHERE upper(message_id) = $1 LIMIT 100",
                )
                .bind(msgid_hex.to_ascii_uppercase())
                .fetch_all(&self.pool)
                .await
                .db()?;
                rows.iter()
                    .map(|r| {
                        Ok(GatewayFact {
                            job: r.try_get("job").db()?,
                            kind: "doubt",
                            remote_id: r.try_get("message_id").db()?,
                            at: r.try_get("since").db()?,
                        })
                    })
                    .collect()
            }

            async fn open_sessions(&self, limit: i64) -> Result<Vec<OpenSession>> {
                let sql = format!(
                    "SELECT s.id_hash, s.agent, s.txn, s.pending, s.dequeued, s.enqueued, s.positions,
                            s.last_used, s.version, {} AS locked,
                            (SELECT count(*) FROM messages m WHERE m.enq_txn = s.txn) AS staged
                       FROM sessions s ORDER BY s.last_used, s.id_hash LIMIT $1",
                    $locked
                );
                let rows = sqlx::query(&sql).bind(limit).fetch_all(&self.pool).await.db()?;
                rows.iter()
                    .map(|r| {
                        Ok(OpenSession {
                            row: SessionRow {
                                id_hash: r.try_get("id_hash").db()?,
                                agent: r.try_get("agent").db()?,
                                txn: r.try_get("txn").db()?,
                                pending: r.try_get("pending").db()?,
                                dequeued: r.try_get("dequeued").db()?,
                                enqueued: r.try_get("enqueued").db()?,
                                positions: r.try_get("positions").db()?,
                                last_used: r.try_get("last_used").db()?,
                                version: r.try_get("version").db()?,
                                intact: true,
                            },
                            locked: r.try_get("locked").db()?,
                            enqueued: r.try_get("staged").db()?,
                        })
                    })
                    .collect()
            }
        }
    };
}
