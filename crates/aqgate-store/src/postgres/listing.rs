//! `admin messages` on PostgreSQL (see `crate::listing`): candidates and rows by arrays.

use async_trait::async_trait;
use sqlx::{PgPool, Row};

use crate::listing::{Listed, Lister};
use crate::views::{Dialect, KEPT_CANDIDATES, Part, candidates_sql, listed_columns, listing_sql};
use crate::*;

pub(super) struct Listing<'a>(pub &'a PgPool);

#[async_trait]
impl Lister for Listing<'_> {
    async fn queue_id(&self, queue: &str) -> Result<Option<QueueId>> {
        sqlx::query_scalar("SELECT id FROM queues WHERE name = $1").bind(queue).fetch_optional(self.0).await.db()
    }

    async fn candidates(
        &self,
        queue: QueueId,
        state: Option<&str>,
        after: (i64, i64),
        n: i64,
    ) -> Result<Vec<(i64, i64)>> {
        // A queue's messages are all of one kind: the single-consumer index first, then the
        // other (each an ordered range of its index, no sort).
        for single in [true, false] {
            let rows = sqlx::query(&candidates_sql(Dialect::Postgres, state, single))
                .bind(queue)
                .bind(after.0)
                .bind(after.1)
                .bind(n)
                .fetch_all(self.0)
                .await
                .db()?;
            if !rows.is_empty() {
                return rows.iter().map(|r| Ok((r.try_get("seq").db()?, r.try_get("prio_key").db()?))).collect();
            }
        }
        Ok(Vec::new())
    }

    async fn kept(&self, queue: QueueId, n: i64) -> Result<Vec<i64>> {
        sqlx::query_scalar(KEPT_CANDIDATES).bind(queue).bind(n).fetch_all(self.0).await.db()
    }

    async fn rows(
        &self,
        queue: QueueId,
        live: &[i64],
        kept: &[i64],
        buffered: bool,
        state: Option<&str>,
    ) -> Result<Vec<Listed>> {
        let sql = listing_sql(Dialect::Postgres, state.is_some());
        let mut q = sqlx::query(&sql).bind(live).bind(kept).bind(queue).bind(buffered);
        if let Some(s) = state {
            q = q.bind(s);
        }
        let n = listed_columns().count();
        q.fetch_all(self.0)
            .await
            .db()?
            .iter()
            .map(|r| {
                Ok(Listed {
                    columns: (0..n).map(|i| r.try_get::<Option<String>, _>(i).db()).collect::<Result<_>>()?,
                    seq: r.try_get("list_seq").db()?,
                    part: Part::from_code(r.try_get::<i32, _>("list_part").db()?.into()),
                })
            })
            .collect()
    }
}
