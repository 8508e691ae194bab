//! Sessions and idempotency records in the store ([`SessionStore`]), written once for both
//! backends by `session_store!`: counts, purges, the SAML replay cache and idempotency
//! records run `sql.rs`'s statements; each backend gives its reads of session rows (a
//! tombstone beside a live row in one statement, and PostgreSQL's check that provisional
//! writes survived: `SessionRow::intact`).

/// `impl SessionStore for $store` (rows `$row`), with the backend's own methods, and
/// `session_from_row`; `$intact` tells from a row whether its provisional writes are intact.
macro_rules! session_store {
    ($store:ty, $row:ty, intact: $intact:expr, { $($own:tt)* }) => {
        #[async_trait]
        impl SessionStore for $store {
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

            $($own)*
        }

        pub(super) fn session_from_row(r: &$row, id_hash: &[u8]) -> Result<SessionRow> {
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
                intact: ($intact)(r)?,
            })
        }
    };
}
