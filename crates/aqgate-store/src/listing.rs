//! `admin messages` on a large queue: the rows of its `AQ$` view, a page of messages at a
//! time, found through the indexes of the dequeue order instead of sorting the view. The
//! first messages in their queue (in dequeue order; with a state, only those that may have
//! a row in it) are picked first ([`views::candidates_sql`]), then the view's rows of those
//! messages alone are built ([`views::listing_sql`]), with the consumers' rows of each
//! message together; then the buffered ones, then those kept after their removal (oldest
//! first). So a listing costs its page, not the queue: the same at 1,000 messages as at
//! 1,000,000.

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
