//! Propagation jobs' leases and status rows on PostgreSQL (shared by the nodes of a
//! database: the lease is how one of them runs a job).

use super::*;

/// The gateway's statements on a batch of ids (see `jobs.rs` in the crate root): the ids
/// as one `text[]`.
pub(super) const GW_DOUBT_PUT: &str = "INSERT INTO gateway_doubt (job, message_id, since) \
     SELECT $1, id, $3 FROM UNNEST($2::text[]) AS t(id) ON CONFLICT (job, message_id) DO NOTHING";
pub(super) const GW_DOUBT_CLEAR: &str = "DELETE FROM gateway_doubt WHERE job = $1 AND message_id = ANY($2::text[])";
pub(super) const GW_SEEN: &str = "SELECT broker_id FROM gateway_seen WHERE job = $1 AND broker_id = ANY($2::text[])";
pub(super) const GW_SEEN_PUT: &str = "INSERT INTO gateway_seen (job, broker_id, at) \
     SELECT $1, id, $3 FROM UNNEST($2::text[]) AS t(id) ON CONFLICT (job, broker_id) DO NOTHING";

/// Doubts whose message no longer waits for the consumer ($3, "" on a single-consumer
/// queue: the message row is its delivery) in the source ($2). An id that is not the hex of
/// a message id names no message.
pub(super) const GW_DOUBT_PURGE: &str = "DELETE FROM gateway_doubt g WHERE g.job = $1 AND \
     CASE WHEN g.message_id ~ '^[0-9A-Fa-f]{32}$' THEN NOT EXISTS ( \
         SELECT 1 FROM messages m WHERE m.msgid = decode(g.message_id, 'hex') \
           AND (($3 = '' AND m.single AND m.queue_id = $2) \
                OR EXISTS (SELECT 1 FROM deliveries d \
                           WHERE d.msg_seq = m.seq AND d.queue_id = $2 AND d.consumer = $3 AND NOT d.gave_up))) \
     ELSE true END";

pub(super) fn gw_ids(ids: &[String]) -> Vec<String> {
    ids.to_vec()
}

job_store!(PgStore, PgRow, {
    async fn job_backlog(
        &self,
        queue: QueueId,
        consumer: &str,
        now: Micros,
        waiting: bool,
    ) -> Result<(i64, Option<Micros>)> {
        // A single-consumer message is its own delivery (`single`); the others have one
        // `deliveries` row per consumer. GREATEST skips a NULL delay.
        let r = if consumer.is_empty() {
            sqlx::query(
                "SELECT COUNT(*) AS n,
                        MIN(CASE WHEN lock_txn IS NULL AND (expire_at IS NULL OR expire_at > $2)
                                      AND ($3 OR delay_until IS NULL OR delay_until <= $2)
                                 THEN CASE WHEN $3 THEN enq_time ELSE GREATEST(enq_time, delay_until) END
                            END) AS ready
                 FROM messages WHERE queue_id = $1 AND single AND enq_txn IS NULL",
            )
            .bind(queue)
            .bind(now)
            .bind(waiting)
            .fetch_one(&self.pool)
            .await
            .db()?
        } else {
            sqlx::query(
                "SELECT COUNT(*) AS n,
                        MIN(CASE WHEN d.lock_txn IS NULL AND (m.expire_at IS NULL OR m.expire_at > $2)
                                      AND ($4 OR m.delay_until IS NULL OR m.delay_until <= $2)
                                 THEN CASE WHEN $4 THEN m.enq_time ELSE GREATEST(m.enq_time, m.delay_until) END
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
            .db()?
        };
        Ok((r.try_get("n").db()?, r.try_get("ready").db()?))
    }
});
