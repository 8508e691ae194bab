//! Propagation jobs' leases and status rows on SQLite (one process per file; the lease still says
//! which process runs a job, for `admin jobs`).

use super::*;

/// The gateway's statements on a batch of ids (see `jobs.rs` in the crate root): the ids
/// as one JSON array, unpacked by `json_each`.
pub(super) const GW_DOUBT_PUT: &str = "INSERT INTO gateway_doubt (job, message_id, since) \
     SELECT $1, value, $3 FROM json_each($2) WHERE true ON CONFLICT (job, message_id) DO NOTHING";
pub(super) const GW_DOUBT_CLEAR: &str =
    "DELETE FROM gateway_doubt WHERE job = $1 AND message_id IN (SELECT value FROM json_each($2))";
pub(super) const GW_SEEN: &str =
    "SELECT broker_id FROM gateway_seen WHERE job = $1 AND broker_id IN (SELECT value FROM json_each($2))";
pub(super) const GW_SEEN_PUT: &str = "INSERT INTO gateway_seen (job, broker_id, at) \
     SELECT $1, value, $3 FROM json_each($2) WHERE true ON CONFLICT (job, broker_id) DO NOTHING";

/// Doubts whose message no longer waits for the consumer ($3, "" on a single-consumer
/// queue) in the source ($2): every message has its `deliveries` rows here. An id that is
/// not the hex of a message id names no message.
pub(super) const GW_DOUBT_PURGE: &str = "DELETE FROM gateway_doubt WHERE job = $1 AND NOT EXISTS ( \
     SELECT 1 FROM messages m JOIN deliveries d ON d.msg_seq = m.seq \
     WHERE length(gateway_doubt.message_id) = 32 AND m.msgid = unhex(gateway_doubt.message_id) \
       AND d.queue_id = $2 AND d.consumer = $3 AND NOT d.gave_up)";

pub(super) fn gw_ids(ids: &[String]) -> String {
    serde_json::Value::from(ids.to_vec()).to_string()
}

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
             WHERE d.queue_id = $1 AND d.consumer = $3 AND NOT d.gave_up AND m.enq_txn IS NULL",
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
