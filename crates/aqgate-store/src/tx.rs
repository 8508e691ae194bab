//! The transaction's part of the store ([`StoreTx`]), as far as both backends run the same
//! statements (`sql.rs`) in it: session counts and idempotency records, the gateway's marks
//! and a job's tally, the spool's writes inside a transaction (group commit), the dequeue
//! history, delays, registrations, the topology's rows, and a grouped queue's groups
//! (whose SQL each backend's `grouping.rs` builds). `store_tx!` writes them once; each
//! backend gives the rest: messages, deliveries and their locks, session rows, commits,
//! views and savepoints, where the schemas or the dialects differ.

/// `impl StoreTx for $tx` (its open transaction in `self.tx`), with the backend's own methods.
macro_rules! store_tx {
    ($tx:ty, { $($own:tt)* }) => {
        #[async_trait]
        impl StoreTx for $tx {
            async fn audit_put(&mut self, r: &AuditRecord) -> Result<()> {
                sqlx::query(crate::admin::AUDIT_PUT)
                    .bind(r.at)
                    .bind(&r.actor)
                    .bind(&r.action)
                    .bind(&r.queue)
                    .bind(&r.target)
                    .bind(r.count)
                    .bind(&r.filter)
                    .bind(&r.run)
                    .bind(r.msgids.join(" "))
                    .bind(r.ids_more)
                    .execute(&mut *self.tx)
                    .await
                    .db()?;
                Ok(())
            }

            async fn gateway_seen_put(&mut self, job: &str, ids: &[String], now: Micros) -> Result<bool> {
                gateway_tx!(seen_put, &mut *self.tx, job, ids, now)
            }

            async fn gateway_doubt_clear(&mut self, job: &str, ids: &[String]) -> Result<()> {
                gateway_tx!(doubt_clear, &mut *self.tx, job, ids)
            }

            async fn job_tally(&mut self, job: &str, propagated: i64, exceptions: i64) -> Result<()> {
                sqlx::query(sql::JOB_TALLY).bind(job).bind(propagated).bind(exceptions).execute(&mut *self.tx).await.db()?;
                Ok(())
            }

            async fn sessions_of(&mut self, agent: &str, limit: i64) -> Result<i64> {
                Ok(sqlx::query_scalar(sql::SESSIONS_OF).bind(agent).bind(limit).fetch_one(&mut *self.tx).await.db()?)
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

            async fn record_dequeues(&mut self, rows: &[DequeueRecord]) -> Result<()> {
                for chunk in rows.chunks(1000) {
                    sql::record_dequeues(chunk).build().execute(&mut *self.tx).await.db()?;
                }
                Ok(())
            }

            async fn forget_dequeues(&mut self, txn: &str) -> Result<()> {
                sqlx::query(sql::HISTORY_FORGET_TXN).bind(txn).execute(&mut *self.tx).await.db()?;
                Ok(())
            }

            async fn delay_message(&mut self, seq: i64, until: Micros) -> Result<()> {
                sqlx::query(sql::MESSAGE_DELAY).bind(seq).bind(until).execute(&mut *self.tx).await.db()?;
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

            async fn groups(
                &mut self,
                q: &CandidateQuery,
                after: Option<Position>,
                except: Option<i64>,
            ) -> Result<Vec<(i64, Position)>> {
                super::grouping::groups(&mut self.tx, q, after, except).await
            }

            async fn group_candidates(&mut self, q: &CandidateQuery, group: i64) -> Result<Vec<StoredMessage>> {
                super::grouping::group_candidates(&mut self.tx, q, group).await
            }

            $($own)*
        }
    };
}
