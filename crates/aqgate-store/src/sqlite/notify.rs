//! Registrations and the notification outbox on SQLite: the claim in two statements, lists
//! of ids and URLs bound one by one; the rest is `notify_store!`'s.

use super::*;

/// A failed attempt: try again at `?3`, or park (`?3` NULL).
pub(super) const NOTIFY_FAILED: &str = "UPDATE notify_outbox SET last_error = ?2,
        state = CASE WHEN ?3 IS NULL THEN 'parked' ELSE state END,
        next_attempt_at = COALESCE(?3, next_attempt_at)
 WHERE id = ?1";

/// (pending, parked) committed notifications.
pub(super) const NOTIFY_COUNTS: &str =
    "SELECT COALESCE(SUM(state = 'new'), 0) AS pending, COALESCE(SUM(state = 'parked'), 0) AS parked
     FROM notify_outbox WHERE txn IS NULL";

pub(super) const OUTBOX_SELECT: &str =
    "SELECT o.id, o.queue_id, o.consumer, o.agent, o.notify_url, r.secret, o.msgid, o.corrid,
        o.priority, o.enq_time, o.delay_until, o.expire_at, o.sender, o.exception_queue, o.state, o.attempts,
        o.next_attempt_at, o.last_error
     FROM notify_outbox o
     LEFT JOIN registrations r ON r.queue_id = o.queue_id AND r.consumer = o.consumer AND r.agent = o.agent";

/// ` AND notify_url NOT IN (…)` for the URLs a claim skips (nothing when there are none).
fn push_skip<'a>(b: &mut QueryBuilder<'a, Sqlite>, skip: &'a [String]) {
    if skip.is_empty() {
        return;
    }
    b.push(" AND notify_url NOT IN (");
    let mut sep = b.separated(", ");
    for u in skip {
        sep.push_bind(u.as_str());
    }
    b.push(")");
}

notify_store!(SqliteStore, SqliteRow, {
    async fn notify_claim(
        &self,
        now: Micros,
        lease_until: Micros,
        limit: i64,
        shape: &ClaimShape,
    ) -> Result<Vec<OutboxEntry>> {
        let mut tx = self.pool.begin().await.db()?;
        // Due, not to a skipped URL, at most `per_url` of one URL, oldest first.
        let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE notify_outbox SET next_attempt_at = ");
        b.push_bind(lease_until);
        b.push(
            ", attempts = attempts + 1
             WHERE id IN (SELECT id FROM (
                            SELECT id, next_attempt_at AS due,
                                   ROW_NUMBER() OVER (PARTITION BY notify_url ORDER BY next_attempt_at, id) AS rn
                            FROM notify_outbox
                            WHERE state = 'new' AND txn IS NULL AND next_attempt_at <= ",
        );
        b.push_bind(now);
        push_skip(&mut b, &shape.skip_urls);
        b.push(") WHERE rn <= ");
        b.push_bind(shape.per_url.unwrap_or(i64::MAX));
        b.push(" ORDER BY due, id LIMIT ");
        b.push_bind(limit);
        b.push(") RETURNING id");
        let ids: Vec<i64> = b.build_query_scalar().fetch_all(&mut *tx).await.db()?;
        let mut out = Vec::with_capacity(ids.len());
        for part in ids.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(OUTBOX_SELECT);
            b.push(" WHERE o.id IN (");
            let mut sep = b.separated(", ");
            for id in part {
                sep.push_bind(*id);
            }
            b.push(") ORDER BY o.next_attempt_at, o.id");
            for r in b.build().fetch_all(&mut *tx).await.db()? {
                out.push(outbox_from_row(&r)?);
            }
        }
        tx.commit().await.db()?;
        out.sort_by_key(|e| e.id);
        Ok(out)
    }

    async fn notify_delivered(&self, ids: &[i64]) -> Result<()> {
        for part in ids.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("DELETE FROM notify_outbox WHERE id IN (");
            let mut sep = b.separated(", ");
            for id in part {
                sep.push_bind(*id);
            }
            b.push(")");
            b.build().execute(&self.pool).await.db()?;
        }
        Ok(())
    }

    async fn notify_release(&self, ids: &[i64], at: Micros) -> Result<()> {
        for part in ids.chunks(500) {
            let mut b: QueryBuilder<Sqlite> =
                QueryBuilder::new("UPDATE notify_outbox SET attempts = MAX(attempts - 1, 0), next_attempt_at = ");
            b.push_bind(at);
            b.push(" WHERE state = 'new' AND id IN (");
            let mut sep = b.separated(", ");
            for id in part {
                sep.push_bind(*id);
            }
            b.push(")");
            b.build().execute(&self.pool).await.db()?;
        }
        Ok(())
    }

    async fn notify_defer(&self, urls: &[String], until: Micros) -> Result<u64> {
        let mut n = 0;
        for part in urls.chunks(500) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE notify_outbox SET next_attempt_at = ");
            b.push_bind(until);
            b.push(" WHERE state = 'new' AND txn IS NULL AND next_attempt_at < ");
            b.push_bind(until);
            b.push(" AND notify_url IN (");
            let mut sep = b.separated(", ");
            for u in part {
                sep.push_bind(u.as_str());
            }
            b.push(")");
            n += b.build().execute(&self.pool).await.db()?.rows_affected();
        }
        Ok(n)
    }

    async fn notify_next_due(&self, skip_urls: &[String]) -> Result<Option<Micros>> {
        if skip_urls.is_empty() {
            return sqlx::query_scalar(sql::NOTIFY_NEXT_DUE).fetch_one(&self.pool).await.db();
        }
        let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(sql::NOTIFY_NEXT_DUE);
        push_skip(&mut b, skip_urls);
        Ok(b.build_query_scalar().fetch_one(&self.pool).await.db()?)
    }

    async fn notify_pending(&self, limit: i64) -> Result<Vec<OutboxEntry>> {
        let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(OUTBOX_SELECT);
        b.push(" WHERE o.txn IS NULL ORDER BY o.id LIMIT ").push_bind(limit);
        b.build().fetch_all(&self.pool).await.db()?.iter().map(outbox_from_row).collect()
    }
});
