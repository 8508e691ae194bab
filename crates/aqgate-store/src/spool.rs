//! The mail spool's part of the store ([`SpoolStore`]), written once for both backends by
//! `spool_store!`: the statements of `sql.rs`, the row reader, and the `*_on` functions that
//! run on any connection (a transaction of group commit's, or autocommit). Each backend gives
//! what only it has: PostgreSQL the claims that let the workers of several processes share
//! the spool (SQLite, one process per file, keeps the trait's defaults), and its
//! `spool_replied` (one statement over arrays; SQLite a `CASE` per chunk of ids).

/// `impl SpoolStore for $store` (rows `$row`, connections `$conn`), with the backend's own
/// methods, and the spool's row reader and `*_on` functions.
macro_rules! spool_store {
    ($store:ty, $row:ty, $conn:ty, { $($own:tt)* }) => {
        #[async_trait]
        impl SpoolStore for $store {
            async fn spool_put(&self, m: &SpooledMail) -> Result<SpoolPut> {
                let mut conn = self.pool.acquire().await.db()?;
                spool_put_on(&mut conn, m).await
            }

            async fn spool_release(&self, id: i64, now: Micros) -> Result<()> {
                spool_release_on(&mut *self.pool.acquire().await.db()?, id, now).await
            }

            async fn spool_due(&self, now: Micros, limit: i64) -> Result<Vec<SpooledMail>> {
                let rows = sqlx::query(
                    // The predicate is the partial index's, word for word (so the planner uses it).
                    sql::SPOOL_DUE,
                )
                .bind(now)
                .bind(limit)
                .fetch_all(&self.pool)
                .await
                .db()?;
                rows.iter().map(spool_from_row).collect()
            }

            async fn spool_attempted(
                &self,
                id: i64,
                response: Option<&[u8]>,
                error: Option<&str>,
                next_attempt_at: Option<Micros>,
            ) -> Result<()> {
                let mut conn = self.pool.acquire().await.db()?;
                spool_attempted_on(&mut conn, id, response, error, next_attempt_at).await
            }

            async fn spool_purge(&self, before: Micros) -> Result<u64> {
                let r = sqlx::query(sql::SPOOL_PURGE).bind(before).execute(&self.pool).await.db()?;
                Ok(r.rows_affected())
            }

            async fn spool_get(&self, id: i64) -> Result<Option<SpooledMail>> {
                let row = sqlx::query(sql::SPOOL_GET).bind(id).fetch_optional(&self.pool).await.db()?;
                row.as_ref().map(spool_from_row).transpose()
            }

            async fn spool_pending(&self, limit: i64) -> Result<Vec<SpooledMail>> {
                let rows = sqlx::query(sql::SPOOL_PENDING).bind(limit).fetch_all(&self.pool).await.db()?;
                rows.iter().map(spool_from_row).collect()
            }

            $($own)*
        }

        pub(super) fn spool_from_row(r: &$row) -> Result<SpooledMail> {
            Ok(SpooledMail {
                id: r.try_get("id").db()?,
                received_at: r.try_get("received_at").db()?,
                agent: r.try_get("agent").db()?,
                message_id: r.try_get("message_id").db()?,
                dedupe_key: r.try_get("dedupe_key").db()?,
                reply_to: r.try_get("reply_to").db()?,
                subject: r.try_get("subject").db()?,
                idap: r.try_get("idap").db()?,
                state: r.try_get("state").db()?,
                attempts: r.try_get("attempts").db()?,
                response: r.try_get("response").db()?,
                last_error: r.try_get("last_error").db()?,
                replies_wanted: r.try_get("replies_wanted").db()?,
                replies_sent: r.try_get("replies_sent").db()?,
                resend_message_id: r.try_get("resend_message_id").db()?,
                encrypt_to: r.try_get("encrypt_to").db()?,
            })
        }

        /// [`Store::spool_put`] on a connection: autocommit, or inside a transaction (group commit).
        pub(super) async fn spool_put_on(conn: &mut $conn, m: &SpooledMail) -> Result<SpoolPut> {
            let held = m.state == "held";
            let id: Option<i64> = sqlx::query_scalar(sql::SPOOL_PUT)
                .bind(m.received_at)
                .bind(&m.agent)
                .bind(&m.message_id)
                .bind(&m.reply_to)
                .bind(&m.subject)
                .bind(&m.idap)
                .bind(&m.dedupe_key)
                .bind(held)
                .bind(&m.encrypt_to)
                .fetch_optional(&mut *conn)
                .await
                .db()?;
            if let Some(id) = id {
                return Ok(SpoolPut::New(id));
            }
            // A copy of a mail still held (its earlier SMTP transaction ended in a 4xx, or never
            // ended) is that mail's first accepted copy, not a re-send.
            let (id, state): (i64, String) =
                sqlx::query_as(sql::SPOOL_FIND).bind(&m.agent).bind(&m.dedupe_key).fetch_one(&mut *conn).await.db()?;
            // A re-sent copy's replies answer it (a copy of a still held mail is that mail).
            sqlx::query(sql::SPOOL_RESENT).bind(id).bind(&m.message_id).bind(&m.encrypt_to).execute(&mut *conn).await.db()?;
            if !held {
                spool_release_on(conn, id, m.received_at).await?;
            }
            Ok(if state == "held" { SpoolPut::New(id) } else { SpoolPut::Duplicate(id) })
        }

        /// [`Store::spool_release`] on a connection; also what a (not held) re-sent copy does.
        pub(super) async fn spool_release_on(conn: &mut $conn, id: i64, now: Micros) -> Result<()> {
            sqlx::query(sql::SPOOL_WANT_REPLY).bind(id).bind(now).execute(conn).await.db()?;
            Ok(())
        }

        /// [`Store::spool_attempted`] on a connection: autocommit, or inside a transaction (group commit).
        pub(super) async fn spool_attempted_on(
            conn: &mut $conn,
            id: i64,
            response: Option<&[u8]>,
            error: Option<&str>,
            next_attempt_at: Option<Micros>,
        ) -> Result<()> {
            let state = spool_state_after(response, next_attempt_at);
            sqlx::query(sql::SPOOL_ATTEMPTED)
                .bind(id)
                .bind(state)
                .bind(response)
                .bind(error)
                .bind(next_attempt_at)
                .execute(&mut *conn)
                .await
                .db()?;
            Ok(())
        }
    };
}
