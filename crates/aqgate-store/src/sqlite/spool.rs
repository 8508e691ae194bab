//! The mail spool on SQLite (one process: the trait's claims): `spool_replied` a `CASE` per
//! chunk of ids; the rest is `spool_store!`'s.

use super::*;

spool_store!(SqliteStore, SqliteRow, sqlx::SqliteConnection, {
    async fn spool_replied(&self, sent: &[(i64, i64)]) -> Result<()> {
        for part in sent.chunks(400) {
            let mut b: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE mail_spool SET replies_sent = CASE id");
            for (id, n) in part {
                b.push(" WHEN ").push_bind(*id).push(" THEN ").push_bind(*n);
            }
            b.push(" ELSE replies_sent END WHERE id IN (");
            let mut ids = b.separated(", ");
            for (id, _) in part {
                ids.push_bind(*id);
            }
            b.push(")");
            b.build().execute(&self.pool).await.db()?;
        }
        Ok(())
    }
});
