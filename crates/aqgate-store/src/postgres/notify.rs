//! Registrations and the notification outbox on PostgreSQL: claims among processes (`FOR
//! UPDATE SKIP LOCKED`), statements on arrays of ids and URLs; the rest is `notify_store!`'s.

use super::*;

/// A failed attempt: try again at `$3`, or park (`$3` NULL).
pub(super) const NOTIFY_FAILED: &str = "UPDATE notify_outbox SET last_error = $2,
        state = CASE WHEN $3::int8 IS NULL THEN 'parked' ELSE state END,
        next_attempt_at = COALESCE($3::int8, next_attempt_at)
 WHERE id = $1";

/// (pending, parked) committed notifications.
pub(super) const NOTIFY_COUNTS: &str =
    "SELECT COUNT(*) FILTER (WHERE state = 'new') AS pending, COUNT(*) FILTER (WHERE state = 'parked') AS parked
     FROM notify_outbox WHERE txn IS NULL";

notify_store!(PgStore, PgRow, {
    async fn notify_claim(
        &self,
        now: Micros,
        lease_until: Micros,
        limit: i64,
        shape: &ClaimShape,
    ) -> Result<Vec<OutboxEntry>> {
        // The candidates: due, not to a skipped URL, at most `per_url` of one URL, oldest
        // first. Concurrent dispatchers (several processes) skip each other's rows; a row
        // another one claimed meanwhile is due no more when re-checked under the lock.
        let rows = sqlx::query(
            "WITH c AS (
                UPDATE notify_outbox SET next_attempt_at = $2, attempts = attempts + 1
                WHERE id IN (
                    SELECT id FROM notify_outbox
                    WHERE id IN (SELECT id FROM (
                                   SELECT id, next_attempt_at AS due,
                                          ROW_NUMBER() OVER (PARTITION BY notify_url ORDER BY next_attempt_at, id) AS rn
                                   FROM notify_outbox
                                   WHERE state = 'new' AND txn IS NULL AND next_attempt_at <= $1
                                     AND notify_url <> ALL($5)) w
                                 WHERE rn <= $4 ORDER BY due, id LIMIT $3)
                      AND state = 'new' AND txn IS NULL AND next_attempt_at <= $1
                    FOR UPDATE SKIP LOCKED)
                RETURNING *
             )
             SELECT c.*, r.secret FROM c
             LEFT JOIN registrations r ON r.queue_id = c.queue_id AND r.consumer = c.consumer AND r.agent = c.agent",
        )
        .bind(now)
        .bind(lease_until)
        .bind(limit)
        .bind(shape.per_url.unwrap_or(i64::MAX))
        .bind(&shape.skip_urls)
        .fetch_all(&self.pool)
        .await
        .db()?;
        let mut out = rows.iter().map(outbox_from_row).collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|e| e.id);
        Ok(out)
    }

    async fn notify_release(&self, ids: &[i64], at: Micros) -> Result<()> {
        if !ids.is_empty() {
            sqlx::query(
                "UPDATE notify_outbox SET attempts = GREATEST(attempts - 1, 0), next_attempt_at = $2
                 WHERE id = ANY($1) AND state = 'new'",
            )
            .bind(ids)
            .bind(at)
            .execute(&self.pool)
            .await
            .db()?;
        }
        Ok(())
    }

    async fn notify_defer(&self, urls: &[String], until: Micros) -> Result<u64> {
        if urls.is_empty() {
            return Ok(0);
        }
        let r = sqlx::query(
            "UPDATE notify_outbox SET next_attempt_at = $2
             WHERE state = 'new' AND txn IS NULL AND next_attempt_at < $2 AND notify_url = ANY($1)",
        )
        .bind(urls)
        .bind(until)
        .execute(&self.pool)
        .await
        .db()?;
        Ok(r.rows_affected())
    }

    async fn notify_delivered(&self, ids: &[i64]) -> Result<()> {
        if !ids.is_empty() {
            sqlx::query("DELETE FROM notify_outbox WHERE id = ANY($1)").bind(ids).execute(&self.pool).await.db()?;
        }
        Ok(())
    }

    async fn notify_next_due(&self, skip_urls: &[String]) -> Result<Option<Micros>> {
        if skip_urls.is_empty() {
            return sqlx::query_scalar(sql::NOTIFY_NEXT_DUE).fetch_one(&self.pool).await.db();
        }
        let q = format!("{} AND notify_url <> ALL($1)", sql::NOTIFY_NEXT_DUE);
        Ok(sqlx::query_scalar(&q).bind(skip_urls).fetch_one(&self.pool).await.db()?)
    }

    async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>> {
        let rows = sqlx::query(
            "SELECT o.*, r.secret FROM notify_outbox o
             LEFT JOIN registrations r ON r.queue_id = o.queue_id AND r.consumer = o.consumer AND r.agent = o.agent
             WHERE o.txn IS NULL ORDER BY o.id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter().map(outbox_from_row).collect()
    }
});
