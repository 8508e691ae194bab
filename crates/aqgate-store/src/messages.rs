//! Queues, messages and the topology in the store ([`Store`]), as far as both backends run the
//! same statements (`sql.rs`): the topology's rows, queue ids and depths, purges, the next
//! delay's end, the `AQ$` views' rows and buffered copy (`listing.rs`), readiness's write
//! probe (`full.rs`), and the message row reader. `queue_store!` writes them once; each
//! backend gives the rest: its transactions, recovery, expirations, signals and, on
//! PostgreSQL, the one-statement paths of group commit.

/// `impl Store for $store` (rows `$row`), with the backend's own methods, and the message
/// row readers (`msgid_from`, `stored_from_row`).
macro_rules! queue_store {
    ($store:ty, $row:ty, { $($own:tt)* }) => {
        #[async_trait]
        impl Store for $store {
            async fn probe_write(&self) -> Result<()> {
                crate::full::probe(&self.pool).await
            }

            fn writes_refused(&self) -> bool {
                crate::full::writes_refused()
            }

            fn full_refusals(&self) -> u64 {
                crate::full::refused_total()
            }

            fn health(&self) -> aqgate_core::store::Health {
                crate::health::health()
            }

            async fn check_health(&self, within: std::time::Duration) -> aqgate_core::store::Health {
                crate::health::check_health(within, || {
                    let pool = self.pool.clone();
                    Box::pin(async move { crate::full::probe(&pool).await })
                })
                .await
            }

            async fn until_available(&self, at_most: std::time::Duration) {
                let pool = self.pool.clone();
                crate::health::until_available(at_most, move || -> crate::health::Check {
                    let pool = pool.clone();
                    Box::pin(async move { crate::full::probe(&pool).await })
                })
                .await
            }

            async fn load_topology(&self) -> Result<Vec<(String, String, String)>> {
                let rows = sqlx::query(sql::TOPOLOGY_LOAD).fetch_all(&self.pool).await.db()?;
                rows.iter().map(|r| Ok((r.try_get("kind").db()?, r.try_get("name").db()?, r.try_get("spec").db()?))).collect()
            }

            async fn queue_ids(&self) -> Result<Vec<(String, QueueId)>> {
                let rows = sqlx::query(sql::QUEUE_IDS).fetch_all(&self.pool).await.db()?;
                rows.iter().map(|r| Ok((r.try_get("name").db()?, r.try_get("id").db()?))).collect()
            }

            async fn show_buffered(&self, node: &str, rows: Option<&[NewMessage]>) -> Result<()> {
                listing::show_buffered(&self.pool, node, rows).await
            }

            async fn view_page(
                &self,
                _queue_table: &str,
                queue: &str,
                filter: &aqgate_core::store::ViewFilter,
                after: Option<aqgate_core::store::ViewCursor>,
                limit: i64,
            ) -> Result<aqgate_core::store::ViewPage> {
                crate::listing::page(&Listing(&self.pool), queue, filter, after, limit).await
            }

            async fn queue_depths(&self) -> Result<Vec<(QueueId, i64)>> {
                let rows = sqlx::query(sql::QUEUE_DEPTHS).fetch_all(&self.pool).await.db()?;
                rows.iter().map(|r| Ok((r.try_get("queue_id").db()?, r.try_get("n").db()?))).collect()
            }

            async fn queue_figures(&self, now: Micros, after_seq: i64) -> Result<Vec<QueueFigures>> {
                let rows = sqlx::query(sql::QUEUE_FIGURES).bind(now).bind(after_seq).fetch_all(&self.pool).await.db()?;
                rows.iter()
                    .map(|r| {
                        Ok(QueueFigures {
                            queue: r.try_get("queue_id").db()?,
                            ready: r.try_get::<Option<i64>, _>("ready").db()?.unwrap_or(0),
                            waiting: r.try_get::<Option<i64>, _>("waiting").db()?.unwrap_or(0),
                            expired: r.try_get::<Option<i64>, _>("expired").db()?.unwrap_or(0),
                            oldest_ready: r.try_get("oldest_ready").db()?,
                            last_seq: r.try_get::<Option<i64>, _>("last_seq").db()?.unwrap_or(0),
                            newer: r.try_get::<Option<i64>, _>("newer").db()?.unwrap_or(0),
                        })
                    })
                    .collect()
            }

            async fn spool_backlog(&self) -> Result<i64> {
                let r = sqlx::query(sql::SPOOL_BACKLOG).fetch_one(&self.pool).await.db()?;
                r.try_get("n").db()
            }

            async fn purge_processed(&self, now: Micros, limit: i64) -> Result<u64> {
                let gone = sqlx::query(sql::PROCESSED_PURGE).bind(now).bind(limit).execute(&self.pool).await.db()?;
                Ok(gone.rows_affected())
            }

            async fn purge_history(&self, limit: i64) -> Result<u64> {
                let gone = sqlx::query(sql::HISTORY_PURGE_ORPHANS).bind(limit).execute(&self.pool).await.db()?;
                Ok(gone.rows_affected())
            }

            async fn next_delay_end(&self, queue: QueueId, now: Micros) -> Result<Option<Micros>> {
                let r = sqlx::query(sql::NEXT_DELAY_END).bind(queue).bind(now).fetch_one(&self.pool).await.db()?;
                Ok(r.try_get("t").db()?)
            }

            $($own)*
        }

        fn msgid_from(v: Vec<u8>) -> Result<[u8; 16]> {
            v.try_into().map_err(|_| StoreError::corrupt("msgid is not 16 bytes"))
        }

        fn stored_from_row(r: &$row) -> Result<StoredMessage> {
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
                enq_user_id: r.try_get("enq_user_id").db()?,
                exception_queue: r.try_get("exception_queue").db()?,
                payload: r.try_get("payload").db()?,
                retry_count: r.try_get("retry_count").db()?,
                state: i32::try_from(r.try_get::<i64, _>("state").db()?).unwrap_or(0),
            })
        }
    };
}
