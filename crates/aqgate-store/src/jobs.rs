//! The propagation jobs' part of the store ([`JobStore`]): the same statements (`sql.rs`) on
//! both backends, written once here; each backend gives its own backlog query, the one
//! place where their schemas differ (PostgreSQL keeps a single-consumer message's delivery
//! in the message row), and the gateway's statements on a batch of ids, one statement per
//! batch (`GW_*`, with the ids as one parameter made by `gw_ids`: an array on PostgreSQL,
//! a JSON array on SQLite).

/// The gateway's statements in a request's transaction (`StoreTx::gateway_seen_put` and
/// `gateway_doubt_clear`), the same on both backends: `$tx` is the transaction.
macro_rules! gateway_tx {
    (seen_put, $tx:expr, $job:expr, $ids:expr, $now:expr) => {{
        // Every mark new, or the batch is (partly) enqueued already.
        let ids: &[String] = $ids;
        let done = sqlx::query(super::jobs::GW_SEEN_PUT)
            .bind($job)
            .bind(super::jobs::gw_ids(ids))
            .bind($now)
            .execute($tx)
            .await
            .db()?;
        Ok(usize::try_from(done.rows_affected()).is_ok_and(|n| n == ids.len()))
    }};
    (doubt_clear, $tx:expr, $job:expr, $ids:expr) => {{
        sqlx::query(super::jobs::GW_DOUBT_CLEAR).bind($job).bind(super::jobs::gw_ids($ids)).execute($tx).await.db()?;
        Ok(())
    }};
}

/// `impl JobStore for $store` (rows of type `$row`), with the backend's `job_backlog`.
macro_rules! job_store {
    ($store:ty, $row:ty, { $($backlog:tt)* }) => {
        #[async_trait]
        impl JobStore for $store {
            async fn job_lease(&self, name: &str, owner: &str, now: Micros, until: Micros) -> Result<bool> {
                let r =
                    sqlx::query(sql::JOB_LEASE).bind(name).bind(owner).bind(now).bind(until).execute(&self.pool).await.db()?;
                Ok(r.rows_affected() == 1)
            }

            async fn job_report(
                &self,
                name: &str,
                owner: &str,
                now: Micros,
                until: Option<Micros>,
                report: &JobReport,
            ) -> Result<Option<String>> {
                let (error, error_at) = report.error.clone().unzip();
                let row = sqlx::query(sql::JOB_REPORT)
                    .bind(name)
                    .bind(owner)
                    .bind(now)
                    .bind(&report.state)
                    .bind(report.propagated)
                    .bind(report.failed)
                    .bind(report.exceptions)
                    .bind(error)
                    .bind(error_at)
                    .bind(report.success_at)
                    .bind(until)
                    .fetch_optional(&self.pool)
                    .await
                    .db()?;
                match row {
                    Some(r) => Ok(r.try_get("owner").db()?),
                    None => Ok(None),
                }
            }

            async fn job_forget(&self, name: &str, owner: &str, now: Micros) -> Result<bool> {
                let r = sqlx::query(sql::JOB_FORGET).bind(name).bind(owner).bind(now).execute(&self.pool).await.db()?;
                if r.rows_affected() == 1 {
                    return Ok(true);
                }
                let left: i64 = sqlx::query_scalar(sql::JOB_EXISTS).bind(name).fetch_one(&self.pool).await.db()?;
                Ok(left == 0)
            }

            async fn job_reset(&self, name: &str) -> Result<bool> {
                Ok(sqlx::query(sql::JOB_RESET).bind(name).execute(&self.pool).await.db()?.rows_affected() == 1)
            }

            async fn job_leases_clear(&self, owner: Option<&str>) -> Result<u64> {
                Ok(sqlx::query(sql::JOB_LEASES_CLEAR).bind(owner).execute(&self.pool).await.db()?.rows_affected())
            }

            async fn job_statuses(&self) -> Result<Vec<JobStatus>> {
                let rows = sqlx::query(sql::JOB_STATUSES).fetch_all(&self.pool).await.db()?;
                rows.iter().map(job_from_row).collect()
            }

            async fn gateway_doubt_put(&self, job: &str, ids: &[String], now: Micros) -> Result<()> {
                sqlx::query(GW_DOUBT_PUT).bind(job).bind(gw_ids(ids)).bind(now).execute(&self.pool).await.db()?;
                Ok(())
            }

            async fn gateway_doubts(&self, job: &str) -> Result<Vec<(String, Micros)>> {
                let rows = sqlx::query(sql::GATEWAY_DOUBTS).bind(job).fetch_all(&self.pool).await.db()?;
                rows.iter().map(|r| Ok((r.try_get("message_id").db()?, r.try_get("since").db()?))).collect()
            }

            async fn gateway_seen(&self, job: &str, ids: &[String]) -> Result<Vec<String>> {
                sqlx::query_scalar(GW_SEEN).bind(job).bind(gw_ids(ids)).fetch_all(&self.pool).await.db()
            }

            async fn gateway_seen_purge(&self, before: Micros) -> Result<u64> {
                Ok(sqlx::query(sql::GATEWAY_SEEN_PURGE).bind(before).execute(&self.pool).await.db()?.rows_affected())
            }

            async fn gateway_doubt_purge(&self, job: &str, queue: QueueId, consumer: &str) -> Result<u64> {
                let r = sqlx::query(GW_DOUBT_PURGE).bind(job).bind(queue).bind(consumer).execute(&self.pool).await.db()?;
                Ok(r.rows_affected())
            }

            async fn gateway_job_drop(&self, job: &str) -> Result<u64> {
                let mut tx = self.pool.begin().await.db()?;
                let mut n = 0;
                for q in [sql::GATEWAY_DOUBT_DROP, sql::GATEWAY_SEEN_DROP] {
                    n += sqlx::query(q).bind(job).execute(&mut *tx).await.db()?.rows_affected();
                }
                tx.commit().await.db()?;
                Ok(n)
            }

            async fn gateway_link_put(&self, l: &LinkStatus) -> Result<()> {
                sqlx::query(sql::GATEWAY_LINK_PUT)
                    .bind(&l.name)
                    .bind(&l.owner)
                    .bind(&l.state)
                    .bind(&l.last_error)
                    .bind(l.last_error_at)
                    .bind(l.since)
                    .bind(l.updated_at)
                    .bind(l.connections)
                    .execute(&self.pool)
                    .await
                    .db()?;
                Ok(())
            }

            async fn gateway_links(&self) -> Result<Vec<LinkStatus>> {
                let rows = sqlx::query(sql::GATEWAY_LINKS).fetch_all(&self.pool).await.db()?;
                rows.iter()
                    .map(|r| {
                        Ok(LinkStatus {
                            name: r.try_get("name").db()?,
                            owner: r.try_get("owner").db()?,
                            state: r.try_get("state").db()?,
                            last_error: r.try_get("last_error").db()?,
                            last_error_at: r.try_get("last_error_at").db()?,
                            since: r.try_get("since").db()?,
                            updated_at: r.try_get("updated_at").db()?,
                            connections: r.try_get("connections").db()?,
                        })
                    })
                    .collect()
            }

            async fn control_counters(&self) -> Result<(i64, i64)> {
                let r = sqlx::query(sql::CONTROL_COUNTERS).fetch_one(&self.pool).await.db()?;
                Ok((r.try_get("topology").db()?, r.try_get("ping").db()?))
            }

            async fn control_ping(&self) -> Result<i64> {
                sqlx::query_scalar(sql::CONTROL_PING).fetch_one(&self.pool).await.db()
            }

            async fn agent_put(&self, a: &AgentStatus) -> Result<()> {
                sqlx::query(sql::AGENT_PUT)
                    .bind(&a.owner)
                    .bind(&a.host)
                    .bind(a.pid)
                    .bind(a.started_at)
                    .bind(&a.status)
                    .bind(&a.last_error)
                    .bind(a.last_error_at)
                    .bind(a.updated_at)
                    .bind(a.alive_until)
                    .execute(&self.pool)
                    .await
                    .db()?;
                Ok(())
            }

            async fn agent_pong(&self, owner: &str, ping: i64) -> Result<()> {
                sqlx::query(sql::AGENT_PONG).bind(owner).bind(ping).execute(&self.pool).await.db()?;
                Ok(())
            }

            async fn agents(&self) -> Result<Vec<AgentStatus>> {
                let rows = sqlx::query(sql::AGENTS).fetch_all(&self.pool).await.db()?;
                rows.iter()
                    .map(|r| {
                        Ok(AgentStatus {
                            owner: r.try_get("owner").db()?,
                            host: r.try_get("host").db()?,
                            pid: r.try_get("pid").db()?,
                            started_at: r.try_get("started_at").db()?,
                            status: r.try_get("status").db()?,
                            last_error: r.try_get("last_error").db()?,
                            last_error_at: r.try_get("last_error_at").db()?,
                            updated_at: r.try_get("updated_at").db()?,
                            alive_until: r.try_get("alive_until").db()?,
                            pong: r.try_get("pong").db()?,
                        })
                    })
                    .collect()
            }

            async fn agents_purge(&self, before: Micros) -> Result<u64> {
                let mut tx = self.pool.begin().await.db()?;
                sqlx::query(sql::AGENTS_PURGE_LINKS).bind(before).execute(&mut *tx).await.db()?;
                let n = sqlx::query(sql::AGENTS_PURGE).bind(before).execute(&mut *tx).await.db()?.rows_affected();
                tx.commit().await.db()?;
                Ok(n)
            }

            $($backlog)*
        }

        fn job_from_row(r: &$row) -> Result<JobStatus> {
            Ok(JobStatus {
                name: r.try_get("name").db()?,
                owner: r.try_get("owner").db()?,
                lease_until: r.try_get("lease_until").db()?,
                state: r.try_get("state").db()?,
                propagated: r.try_get("propagated").db()?,
                failed: r.try_get("failed").db()?,
                exceptions: r.try_get("exceptions").db()?,
                last_error: r.try_get("last_error").db()?,
                last_error_at: r.try_get("last_error_at").db()?,
                last_success_at: r.try_get("last_success_at").db()?,
                updated_at: r.try_get("updated_at").db()?,
            })
        }
    };
}
