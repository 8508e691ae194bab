//! `admin messages` on a large queue: the rows of its `AQ$` view, a page of messages at a
//! time, found through the indexes of the dequeue order instead of sorting the view. The
//! first messages in their queue (in dequeue order; with a state, only those that may have
//! a row in it) are picked first ([`views::candidates_sql`]), then the view's rows of those
//! messages alone are built ([`views::listing_sql`]), with the consumers' rows of each
//! message together; then the buffered ones, then those kept after their removal (oldest
//! first). So a listing costs its page, not the queue: the same at 1,000 messages as at
//! 1,000,000. [`views_backend!`] writes each backend's side once: its [`Lister`] and the
//! copy of buffered messages the views show (`Store::show_buffered`).

use async_trait::async_trait;

use crate::views::{self, Part};
use aqgate_core::store::{QueueId, Result};

/// A row as the listing reads it: the listed columns as text, its message's `seq`, its part.
pub(crate) struct Listed {
    pub columns: Vec<Option<String>>,
    pub seq: Option<i64>,
    pub part: Part,
}

/// What a backend runs for a listing.
#[async_trait]
pub(crate) trait Lister: Send + Sync {
    /// The queue's id, if it has one.
    async fn queue_id(&self, queue: &str) -> Result<Option<QueueId>>;
    /// [`views::candidates_sql`]: (`seq`, `prio_key`) of the next `n` messages after `after`.
    async fn candidates(
        &self,
        queue: QueueId,
        state: Option<&str>,
        after: (i64, i64),
        n: i64,
    ) -> Result<Vec<(i64, i64)>>;
    /// [`views::KEPT_CANDIDATES`].
    async fn kept(&self, queue: QueueId, n: i64) -> Result<Vec<i64>>;
    /// [`views::listing_sql`] for the messages `live` and `kept`, and the buffered ones of
    /// `queue` when `buffered`.
    async fn rows(
        &self,
        queue: QueueId,
        live: &[i64],
        kept: &[i64],
        buffered: bool,
        state: Option<&str>,
    ) -> Result<Vec<Listed>>;
}

/// The first `limit` rows of `queue`'s view in the listing's order (in `state` only, when
/// given).
pub(crate) async fn list(
    l: &dyn Lister,
    queue: &str,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<Vec<Option<String>>>> {
    let Some(qid) = l.queue_id(queue).await? else { return Ok(Vec::new()) };
    let want = usize::try_from(limit).unwrap_or(0);
    let mut out: Vec<Vec<Option<String>>> = Vec::new();
    let mut after = (i64::MIN, i64::MIN);
    while out.len() < want {
        let page = l.candidates(qid, state, after, limit).await?;
        let Some(&(last_seq, last_key)) = page.last() else { break };
        after = (last_key, last_seq);
        let seqs: Vec<i64> = page.iter().map(|(s, _)| *s).collect();
        let at: std::collections::HashMap<i64, usize> = seqs.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        let mut rows = l.rows(qid, &seqs, &[], false, state).await?;
        // In dequeue order, each message's consumers by name.
        rows.sort_by(|a, b| {
            let pos = |r: &Listed| r.seq.and_then(|s| at.get(&s).copied()).unwrap_or(usize::MAX);
            (pos(a), consumer(a)).cmp(&(pos(b), consumer(b)))
        });
        out.extend(rows.into_iter().map(|r| r.columns));
        if page.len() < want {
            break;
        }
    }
    if out.len() < want {
        let mut rows = l.rows(qid, &[], &[], true, state).await?;
        rows.sort_by(|a, b| (enq(a), consumer(a)).cmp(&(enq(b), consumer(b))));
        out.extend(rows.into_iter().map(|r| r.columns));
    }
    if out.len() < want && matches!(state, None | Some("PROCESSED")) {
        let kept = l.kept(qid, i64::try_from(want - out.len()).unwrap_or(i64::MAX)).await?;
        if !kept.is_empty() {
            let mut rows = l.rows(qid, &[], &kept, false, state).await?;
            rows.retain(|r| r.part == Part::Kept);
            rows.sort_by(|a, b| (a.seq, consumer(a)).cmp(&(b.seq, consumer(b))));
            out.extend(rows.into_iter().map(|r| r.columns));
        }
    }
    out.truncate(want);
    Ok(out)
}

fn column<'a>(r: &'a Listed, name: &str) -> Option<&'a str> {
    let i = views::listed_columns().position(|c| c == name)?;
    r.columns.get(i)?.as_deref()
}

fn consumer(r: &Listed) -> Option<&str> {
    column(r, "consumer_name")
}

fn enq(r: &Listed) -> Option<&str> {
    column(r, "enq_timestamp")
}

/// A backend's listing ([`Lister`] for `Listing`) and its `show_buffered`, written once:
/// `$pool` its pool, `$dialect` its SQL, `$seqs` how it binds a list of `seq`s, `$kinds` the
/// kinds of message its candidates are looked for in, in turn (`single`: PostgreSQL keeps
/// single- and multi-consumer messages in two indexes; SQLite looks once).
macro_rules! views_backend {
    ($pool:ty, $dialect:expr, $seqs:expr, $kinds:expr) => {
        pub(super) struct Listing<'a>(pub &'a $pool);

        #[async_trait::async_trait]
        impl $crate::listing::Lister for Listing<'_> {
            async fn queue_id(&self, queue: &str) -> Result<Option<QueueId>> {
                sqlx::query_scalar("SELECT id FROM queues WHERE name = $1")
                    .bind(queue)
                    .fetch_optional(self.0)
                    .await
                    .db()
            }

            async fn candidates(
                &self,
                queue: QueueId,
                state: Option<&str>,
                after: (i64, i64),
                n: i64,
            ) -> Result<Vec<(i64, i64)>> {
                use sqlx::Row;
                // A queue's messages are all of one kind: each kind's index in turn, an
                // ordered range of it (no sort).
                for single in $kinds {
                    let rows = sqlx::query(&$crate::views::candidates_sql($dialect, state, single))
                        .bind(queue)
                        .bind(after.0)
                        .bind(after.1)
                        .bind(n)
                        .fetch_all(self.0)
                        .await
                        .db()?;
                    if !rows.is_empty() {
                        return rows
                            .iter()
                            .map(|r| Ok((r.try_get("seq").db()?, r.try_get("prio_key").db()?)))
                            .collect();
                    }
                }
                Ok(Vec::new())
            }

            async fn kept(&self, queue: QueueId, n: i64) -> Result<Vec<i64>> {
                sqlx::query_scalar($crate::views::KEPT_CANDIDATES).bind(queue).bind(n).fetch_all(self.0).await.db()
            }

            async fn rows(
                &self,
                queue: QueueId,
                live: &[i64],
                kept: &[i64],
                buffered: bool,
                state: Option<&str>,
            ) -> Result<Vec<$crate::listing::Listed>> {
                use sqlx::Row;
                let sql = $crate::views::listing_sql($dialect, state.is_some());
                let mut q = sqlx::query(&sql).bind(($seqs)(live)).bind(($seqs)(kept)).bind(queue).bind(buffered);
                if let Some(s) = state {
                    q = q.bind(s);
                }
                let n = $crate::views::listed_columns().count();
                q.fetch_all(self.0)
                    .await
                    .db()?
                    .iter()
                    .map(|r| {
                        Ok($crate::listing::Listed {
                            columns: (0..n).map(|i| r.try_get::<Option<String>, _>(i).db()).collect::<Result<_>>()?,
                            seq: r.try_get("list_seq").db()?,
                            part: $crate::views::Part::from_code(r.try_get("list_part").db()?),
                        })
                    })
                    .collect()
            }
        }

        /// `Store::show_buffered` (the statements of `views::buffered_sql`).
        pub(super) async fn show_buffered(pool: &$pool, node: &str, rows: Option<&[NewMessage]>) -> Result<()> {
            let [drop_all, drop_stale, mark] = $crate::views::buffered_sql($dialect);
            let mut tx = pool.begin().await.db()?;
            match rows {
                Some(rows) => {
                    sqlx::query(&drop_all).bind(node).execute(&mut *tx).await.db()?;
                    for mut b in $crate::sql::show_buffered(node, rows, $crate::views::now_sql($dialect)) {
                        b.build().execute(&mut *tx).await.db()?;
                    }
                }
                None => {
                    sqlx::query(&drop_stale).bind(node).execute(&mut *tx).await.db()?;
                    sqlx::query(&mark).bind(node).execute(&mut *tx).await.db()?;
                }
            }
            tx.commit().await.db()?;
            Ok(())
        }
    };
}
pub(crate) use views_backend;
