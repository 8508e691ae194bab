//! `admin messages` on a large queue: the rows of its `AQ$` view, a page of messages at a
//! time, found through the indexes of the dequeue order instead of sorting the view. The
//! first messages in their queue (in dequeue order; with a state, only those that may have
//! a row in it) are picked first ([`views::candidates_sql`]), then the view's rows of those
//! messages alone are built ([`views::listing_sql`]), with the consumers' rows of each
//! message together; then the buffered ones, then those kept after their removal (oldest
//! first). So a listing costs its page, not the queue: the same at 1,000 messages as at
//! 1,000,000. [`views_backend!`] writes each backend's side once: its [`Lister`] and the
//! copy of buffered messages the views show (`Store::show_buffered`).

use std::collections::HashMap;

use async_trait::async_trait;

use crate::views::{self, Part};
use aqgate_core::store::{PAYLOAD_SEARCH_ROWS, QueueId, Result, ViewCursor, ViewFilter, ViewPage};

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
    /// [`views::candidates_sql`]: (`seq`, `prio_key`, whether the payload search finds it)
    /// of the next `n` messages after `after` that `f` takes.
    async fn candidates(
        &self,
        queue: QueueId,
        f: &ViewFilter,
        after: (i64, i64),
        n: i64,
    ) -> Result<Vec<(i64, i64, bool)>>;
    /// [`views::kept_candidates_sql`]: (`seq`, whether the payload search finds it).
    async fn kept(&self, queue: QueueId, f: &ViewFilter, after: i64, n: i64) -> Result<Vec<(i64, bool)>>;
    /// The `seq`s of the message `msgid` of `queue`: in its queue, and kept.
    async fn find(&self, queue: QueueId, msgid: [u8; 16]) -> Result<(Vec<i64>, Vec<i64>)>;
    /// [`views::listing_sql`] for the messages `live` and `kept`, and the buffered ones of
    /// `queue` that `f` takes when `buffered`.
    async fn rows(
        &self,
        queue: QueueId,
        live: &[i64],
        kept: &[i64],
        buffered: bool,
        f: &ViewFilter,
    ) -> Result<Vec<Listed>>;
}

/// A page of `queue`'s view in the listing's order after `after` (`Store::view_page`).
pub(crate) async fn page(
    l: &dyn Lister,
    queue: &str,
    f: &ViewFilter,
    after: Option<ViewCursor>,
    limit: i64,
) -> Result<ViewPage> {
    let Some(qid) = l.queue_id(queue).await? else { return Ok(ViewPage::default()) };
    if let Some(id) = f.msgid {
        let (live, kept) = l.find(qid, id).await?;
        let mut rows = l.rows(qid, &live, &kept, true, f).await?;
        rows.sort_by(|a, b| (a.part, a.seq, consumer(a)).cmp(&(b.part, b.seq, consumer(b))));
        return Ok(ViewPage { rows: rows.into_iter().map(|r| r.columns).collect(), next: None, scan_bound: false });
    }
    let want = usize::try_from(limit.max(1)).unwrap_or(1);
    let mut p = ViewPage::default();
    let mut scanned = 0usize;
    let mut at = after.unwrap_or(ViewCursor::Live { prio_key: i64::MIN, seq: i64::MIN });
    if let ViewCursor::Live { prio_key, seq } = at {
        let mut key = (prio_key, seq);
        loop {
            let n = next_n(f, want, scanned);
            if n == 0 {
                p.next = Some(ViewCursor::Live { prio_key: key.0, seq: key.1 });
                p.scan_bound = true;
                return Ok(p);
            }
            let page = l.candidates(qid, f, key, n).await?;
            scanned += page.len();
            let hits: Vec<i64> = page.iter().filter(|c| c.2).map(|c| c.0).collect();
            let mut rows =
                by_message(if hits.is_empty() { Vec::new() } else { l.rows(qid, &hits, &[], false, f).await? });
            for &(s, k, _) in &page {
                key = (k, s);
                p.rows.extend(rows.remove(&s).unwrap_or_default());
                if p.rows.len() >= want {
                    p.next = Some(ViewCursor::Live { prio_key: k, seq: s });
                    return Ok(p);
                }
            }
            if (page.len() as i64) < n {
                break;
            }
        }
        at = ViewCursor::Buffered;
    }
    if at == ViewCursor::Buffered {
        let mut rows = l.rows(qid, &[], &[], true, f).await?;
        rows.retain(|r| r.part == Part::Buffered);
        rows.sort_by(|a, b| (enq(a), consumer(a)).cmp(&(enq(b), consumer(b))));
        p.rows.extend(rows.into_iter().map(|r| r.columns));
        at = ViewCursor::Kept { seq: i64::MIN };
        if p.rows.len() >= want {
            p.next = Some(at);
            return Ok(p);
        }
    }
    let ViewCursor::Kept { seq } = at else { return Ok(p) };
    if !matches!(f.state.as_deref(), None | Some("PROCESSED")) {
        return Ok(p);
    }
    let mut key = seq;
    loop {
        let n = next_n(f, want, scanned);
        if n == 0 {
            p.next = Some(ViewCursor::Kept { seq: key });
            p.scan_bound = true;
            return Ok(p);
        }
        let page = l.kept(qid, f, key, n).await?;
        scanned += page.len();
        let hits: Vec<i64> = page.iter().filter(|c| c.1).map(|c| c.0).collect();
        let mut rows = Vec::new();
        if !hits.is_empty() {
            rows = l.rows(qid, &[], &hits, false, f).await?;
            rows.retain(|r| r.part == Part::Kept);
        }
        let mut rows = by_message(rows);
        for &(s, _) in &page {
            key = s;
            p.rows.extend(rows.remove(&s).unwrap_or_default());
            if p.rows.len() >= want {
                p.next = Some(ViewCursor::Kept { seq: s });
                return Ok(p);
            }
        }
        if (page.len() as i64) < n {
            return Ok(p);
        }
    }
}

/// The messages to look at next: one more than the page needs, and with a payload search
/// no more than the scan has left.
fn next_n(f: &ViewFilter, want: usize, scanned: usize) -> i64 {
    let n = if f.payload.is_some() { (want + 1).min(PAYLOAD_SEARCH_ROWS.saturating_sub(scanned)) } else { want + 1 };
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Rows by their message's `seq`, each message's consumers by name.
fn by_message(rows: Vec<Listed>) -> HashMap<i64, Vec<Vec<Option<String>>>> {
    let mut rows = rows;
    rows.sort_by(|a, b| consumer(a).cmp(&consumer(b)));
    let mut out: HashMap<i64, Vec<Vec<Option<String>>>> = HashMap::new();
    for r in rows {
        if let Some(s) = r.seq {
            out.entry(s).or_default().push(r.columns);
        }
    }
    out
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
                f: &aqgate_core::store::ViewFilter,
                after: (i64, i64),
                n: i64,
            ) -> Result<Vec<(i64, i64, bool)>> {
                use sqlx::Row;
                let w = $crate::narrowing::Narrowing::of($dialect, f, 5);
                // A queue's messages are all of one kind: each kind's index in turn, an
                // ordered range of it (no sort).
                for single in $kinds {
                    let sql = $crate::views::candidates_sql($dialect, f.state.as_deref(), single, &w.narrow, &w.hit);
                    let q = sqlx::query(&sql).bind(queue).bind(after.0).bind(after.1).bind(n);
                    let rows = $crate::narrowing::bind_all!(q, &w.binds).fetch_all(self.0).await.db()?;
                    if !rows.is_empty() {
                        return rows
                            .iter()
                            .map(|r| {
                                let hit: i64 = r.try_get("hit").db()?;
                                Ok((r.try_get("seq").db()?, r.try_get("prio_key").db()?, hit != 0))
                            })
                            .collect();
                    }
                }
                Ok(Vec::new())
            }

            async fn kept(
                &self,
                queue: QueueId,
                f: &aqgate_core::store::ViewFilter,
                after: i64,
                n: i64,
            ) -> Result<Vec<(i64, bool)>> {
                use sqlx::Row;
                let w = $crate::narrowing::Narrowing::of($dialect, f, 4);
                let sql = $crate::views::kept_candidates_sql(&w.narrow, &w.hit);
                let q = sqlx::query(&sql).bind(queue).bind(after).bind(n);
                $crate::narrowing::bind_all!(q, &w.binds)
                    .fetch_all(self.0)
                    .await
                    .db()?
                    .iter()
                    .map(|r| Ok((r.try_get("seq").db()?, r.try_get::<i64, _>("hit").db()? != 0)))
                    .collect()
            }

            async fn find(&self, queue: QueueId, msgid: [u8; 16]) -> Result<(Vec<i64>, Vec<i64>)> {
                let id = msgid.to_vec();
                let live = sqlx::query_scalar(
                    "SELECT seq FROM messages WHERE msgid = $1 AND queue_id = $2 AND enq_txn IS NULL",
                )
                .bind(id.clone())
                .bind(queue)
                .fetch_all(self.0)
                .await
                .db()?;
                let kept = sqlx::query_scalar("SELECT seq FROM processed_messages WHERE queue_id = $1 AND msgid = $2")
                    .bind(queue)
                    .bind(id)
                    .fetch_all(self.0)
                    .await
                    .db()?;
                Ok((live, kept))
            }

            async fn rows(
                &self,
                queue: QueueId,
                live: &[i64],
                kept: &[i64],
                buffered: bool,
                f: &aqgate_core::store::ViewFilter,
            ) -> Result<Vec<$crate::listing::Listed>> {
                use sqlx::Row;
                let state = f.state.as_deref();
                let w = $crate::narrowing::Narrowing::of($dialect, f, if state.is_some() { 6 } else { 5 });
                let sql = $crate::views::listing_sql($dialect, state.is_some(), &w.all());
                let mut q = sqlx::query(&sql).bind(($seqs)(live)).bind(($seqs)(kept)).bind(queue).bind(buffered);
                if let Some(s) = state {
                    q = q.bind(s);
                }
                let q = $crate::narrowing::bind_all!(q, &w.binds);
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
