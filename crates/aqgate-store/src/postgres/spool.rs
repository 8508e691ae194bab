//! The mail spool on PostgreSQL (with leases, so that the workers of several processes
//! share it): the claims and `spool_replied` over arrays; the rest is `spool_store!`'s.

use super::*;

spool_store!(PgStore, PgRow, sqlx::PgConnection, {
    async fn spool_claim(&self, id: i64, now: Micros, owner: &str) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE mail_spool SET next_attempt_at = $3, claimed_by = $4
              WHERE id = $1 AND next_attempt_at <= $2 AND (state = 'new' OR replies_sent < replies_wanted)",
        )
        .bind(id)
        .bind(now)
        .bind(now.saturating_add(SPOOL_LEASE))
        .bind(owner)
        .execute(&self.pool)
        .await
        .db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn spool_claim_owners(&self, now: Micros) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT DISTINCT claimed_by FROM mail_spool
              WHERE claimed_by IS NOT NULL AND next_attempt_at > $1 AND (state = 'new' OR replies_sent < replies_wanted)",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .db()
    }

    async fn spool_unclaim(&self, owner: &str, now: Micros) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE mail_spool SET next_attempt_at = $2, claimed_by = NULL
              WHERE claimed_by = $1 AND next_attempt_at > $2 AND (state = 'new' OR replies_sent < replies_wanted)",
        )
        .bind(owner)
        .bind(now)
        .execute(&self.pool)
        .await
        .db()?;
        Ok(r.rows_affected())
    }

    async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()> {
        if sent.is_empty() {
            return Ok(());
        }
        let (ids, counts): (Vec<i64>, Vec<i64>) = sent.iter().copied().unzip();
        sqlx::query(
            "UPDATE mail_spool m SET replies_sent = u.n FROM UNNEST($1::int8[], $2::int8[]) AS u(id, n) WHERE m.id = u.id",
        )
        .bind(ids)
        .bind(counts)
        .execute(&self.pool)
        .await.db()?;
        Ok(())
    }
});
