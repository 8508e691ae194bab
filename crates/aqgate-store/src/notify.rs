//! Registrations and the notification outbox in the store ([`NotifyStore`]), written once for
//! both backends by `notify_store!`: registrations, failed attempts, counts and unparking,
//! and the row readers. Each backend gives its claim (PostgreSQL: one statement, `FOR UPDATE
//! SKIP LOCKED` among processes; SQLite: an `UPDATE … RETURNING id`, then the rows), its
//! statements on lists of ids and URLs (arrays; SQLite: bound one by one, in chunks), and
//! the SQL text of `NOTIFY_FAILED` and `NOTIFY_COUNTS`.

/// `impl NotifyStore for $store` (rows `$row`), with the backend's own methods, and the
/// registration and outbox row readers.
macro_rules! notify_store {
    ($store:ty, $row:ty, { $($own:tt)* }) => {
        #[async_trait]
        impl NotifyStore for $store {
            async fn registrations(&self, queue: QueueId) -> Result<Vec<Registration>> {
                let rows = sqlx::query(sql::REGISTRATIONS_OF_QUEUE).bind(queue).fetch_all(&self.pool).await.db()?;
                rows.iter().map(registration_from_row).collect()
            }

            async fn all_registrations(&self) -> Result<Vec<Registration>> {
                let rows = sqlx::query(sql::REGISTRATIONS_ALL).fetch_all(&self.pool).await.db()?;
                rows.iter().map(registration_from_row).collect()
            }

            async fn set_registration_secret(
                &self,
                queue: QueueId,
                consumer: &str,
                agent: &str,
                secret: Option<&str>,
            ) -> Result<bool> {
                let r = sqlx::query(sql::REGISTRATION_SET_SECRET)
                    .bind(queue)
                    .bind(consumer)
                    .bind(agent)
                    .bind(secret)
                    .execute(&self.pool)
                    .await
                    .db()?;
                Ok(r.rows_affected() == 1)
            }

            async fn notify_unpark(&self, now: Micros) -> Result<u64> {
                let r = sqlx::query(sql::NOTIFY_UNPARK).bind(now).execute(&self.pool).await.db()?;
                Ok(r.rows_affected())
            }
            async fn notify_failed(&self, id: i64, error: &str, next_attempt_at: Option<Micros>) -> Result<()> {
                sqlx::query(NOTIFY_FAILED).bind(id).bind(error).bind(next_attempt_at).execute(&self.pool).await.db()?;
                Ok(())
            }

            async fn notify_counts(&self) -> Result<(i64, i64)> {
                let r = sqlx::query(NOTIFY_COUNTS).fetch_one(&self.pool).await.db()?;
                Ok((r.try_get("pending").db()?, r.try_get("parked").db()?))
            }

            $($own)*
        }

        pub(super) fn registration_from_row(r: &$row) -> Result<Registration> {
            Ok(Registration {
                queue: r.try_get("queue_id").db()?,
                consumer: r.try_get("consumer").db()?,
                notify_url: r.try_get("notify_url").db()?,
                agent: r.try_get("agent").db()?,
            })
        }

        pub(super) fn outbox_from_row(r: &$row) -> Result<OutboxEntry> {
            Ok(OutboxEntry {
                id: r.try_get("id").db()?,
                queue: r.try_get("queue_id").db()?,
                consumer: r.try_get("consumer").db()?,
                agent: r.try_get("agent").db()?,
                notify_url: r.try_get("notify_url").db()?,
                secret: r.try_get("secret").db()?,
                msgid: msgid_from(r.try_get("msgid").db()?)?,
                corrid: r.try_get("corrid").db()?,
                priority: r.try_get("priority").db()?,
                enq_time: r.try_get("enq_time").db()?,
                delay_until: r.try_get("delay_until").db()?,
                expire_at: r.try_get("expire_at").db()?,
                sender: r.try_get("sender").db()?,
                exception_queue: r.try_get("exception_queue").db()?,
                state: r.try_get("state").db()?,
                attempts: r.try_get("attempts").db()?,
                next_attempt_at: r.try_get("next_attempt_at").db()?,
                last_error: r.try_get("last_error").db()?,
            })
        }
    };
}
