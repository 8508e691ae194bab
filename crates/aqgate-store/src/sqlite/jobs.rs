//! Propagation jobs' leases and status rows on SQLite (one process per file; the lease still says
//! which process runs a job, for `admin jobs`).

use super::*;

job_store!(SqliteStore, SqliteRow, {
    async fn job_backlog(
        &self,
        queue: QueueId,
        consumer: &str,
        now: Micros,
        waiting: bool,
    ) -> Result<(i64, Option<Micros>)> {
        // Every message has a `deliveries` row here (consumer "" on a single-consumer queue).
        // Two-argument MAX is the larger of the two; a NULL delay is the enqueue time.
        let r = sqlx::query(
            "SELECT COUNT(*) AS n,
                    MIN(CASE WHEN d.lock_txn IS NULL AND (m.expire_at IS NULL OR m.expire_at > $2)
                                  AND ($4 OR m.delay_until IS NULL OR m.delay_until <= $2)
                             THEN CASE WHEN $4 THEN m.enq_time
                                       ELSE MAX(m.enq_time, COALESCE(m.delay_until, m.enq_time)) END
                        END) AS ready
             FROM deliveries d JOIN messages m ON m.seq = d.msg_seq
             WHERE d.queue_id = $1 AND d.consumer = $3 AND m.enq_txn IS NULL",
        )
        .bind(queue)
        .bind(now)
        .bind(consumer)
        .bind(waiting)
        .fetch_one(&self.pool)
        .await
        .db()?;
        Ok((r.try_get("n").db()?, r.try_get("ready").db()?))
    }
});
