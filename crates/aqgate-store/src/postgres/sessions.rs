//! Session rows and idempotency records on PostgreSQL.

use super::*;

#[async_trait]
impl SessionStore for PgStore {
    async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup> {
        let row = sqlx::query(
            "SELECT false AS ended, agent, txn, pending, dequeued, enqueued, positions, last_used, version,
                    (NOT doubt AND epoch = pg_postmaster_start_time()) AS intact
               FROM sessions WHERE id_hash = $1
             UNION ALL
             SELECT true, agent, '', had_work, false, 0, '', 0, 0, true FROM session_tombstones WHERE id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&self.pool)
        .await
        .db()?;
        let Some(r) = row else { return Ok(SessionLookup::Unknown) };
        if r.try_get::<bool, _>("ended").db()? {
            return Ok(SessionLookup::Ended { agent: r.try_get("agent").db()?, had_work: r.try_get("pending").db()? });
        }
        Ok(SessionLookup::Live(session_from_row(&r, id_hash)?))
    }

    async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()> {
        sqlx::query("UPDATE sessions SET last_used = greatest(last_used, $2) WHERE id_hash = $1")
            .bind(id_hash)
            .bind(until)
            .execute(&self.pool)
            .await
            .db()?;
        Ok(())
    }

    async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>> {
        let rows = sqlx::query(
            "SELECT id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version,
                    (NOT doubt AND epoch = pg_postmaster_start_time()) AS intact
               FROM sessions WHERE last_used < $1 ORDER BY last_used LIMIT $2",
        )
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .db()?;
        rows.iter().map(|r| session_from_row(r, &r.try_get::<Vec<u8>, _>("id_hash").db()?)).collect()
    }

    async fn session_count(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(sql::SESSION_COUNT).fetch_one(&self.pool).await.db()?)
    }

    async fn sessions_purge(&self, now: Micros, records_before: Micros) -> Result<u64> {
        let a = sqlx::query(sql::PURGE_TOMBSTONES).bind(now).execute(&self.pool).await.db()?;
        let b = sqlx::query(sql::PURGE_IDEMPOTENCY).bind(records_before).execute(&self.pool).await.db()?;
        let c = sqlx::query(sql::PURGE_SAML_REPLAY).bind(now).execute(&self.pool).await.db()?;
        Ok(a.rows_affected() + b.rows_affected() + c.rows_affected())
    }

    async fn saml_assertion_once(&self, issuer: &str, id: &str, until: Micros) -> Result<bool> {
        let r =
            sqlx::query(sql::SAML_ASSERTION_ONCE).bind(issuer).bind(id).bind(until).execute(&self.pool).await.db()?;
        Ok(r.rows_affected() == 1)
    }

    async fn idempotency_usage(&self, agent: &str) -> Result<(i64, i64)> {
        Ok(sqlx::query_as(sql::IDEMPOTENCY_USAGE).bind(agent).fetch_one(&self.pool).await.db()?)
    }

    async fn idempotency_get(&self, agent: &str, key: &str) -> Result<Option<IdempotencyRecord>> {
        let row = sqlx::query(sql::IDEMPOTENCY_GET).bind(agent).bind(key).fetch_optional(&self.pool).await.db()?;
        row.map(|r| {
            Ok(IdempotencyRecord {
                agent: r.try_get("agent").db()?,
                key: r.try_get("key").db()?,
                request_hash: r.try_get("request_hash").db()?,
                response: r.try_get("response").db()?,
                created_at: r.try_get("created_at").db()?,
            })
        })
        .transpose()
    }
}

pub(super) fn session_from_row(r: &PgRow, id_hash: &[u8]) -> Result<SessionRow> {
    Ok(SessionRow {
        id_hash: id_hash.to_vec(),
        agent: r.try_get("agent").db()?,
        txn: r.try_get("txn").db()?,
        pending: r.try_get("pending").db()?,
        dequeued: r.try_get("dequeued").db()?,
        enqueued: r.try_get("enqueued").db()?,
        positions: r.try_get("positions").db()?,
        last_used: r.try_get("last_used").db()?,
        version: r.try_get("version").db()?,
        intact: r.try_get("intact").db()?,
    })
}
