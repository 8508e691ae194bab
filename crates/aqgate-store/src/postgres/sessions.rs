//! Session rows and idempotency records on PostgreSQL: the reads of session rows (their
//! `intact` from the epoch and doubt columns); the rest is `session_store!`'s.

use super::*;

session_store!(PgStore, PgRow, intact: |r: &PgRow| r.try_get::<bool, _>("intact").db(), {
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
});
