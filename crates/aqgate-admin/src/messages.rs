//! `aqgate admin messages QUEUE`: the queue's messages as Oracle's `AQ$<QUEUE_TABLE>` view
//! shows them (the same rows: this reads the view).

use std::io::Write;

use aqgate_core::error::AqError;
use aqgate_core::store::Store;
use aqgate_core::topology::canon;
use aqgate_store::views::listed_columns;

/// The states a message is shown in (`MSG_STATE`).
pub const STATES: [&str; 5] = ["READY", "WAIT", "PROCESSED", "EXPIRED", "UNDELIVERABLE"];

/// The rows `admin messages` shows when not told (`--limit`), and the most it shows.
pub const DEFAULT_LIMIT: i64 = 1_000;
pub const MAX_LIMIT: i64 = 100_000;

/// Rows of a view, each as (column, value) pairs in the view's order.
pub type Rows = Vec<Vec<(&'static str, Option<String>)>>;

/// The first `limit` rows of `queue` in its queue table's view, in enqueue order (in
/// `state` only, when given: the store filters, so that rows in other states do not use
/// up the limit), and whether there are more.
pub async fn messages(
    store: &dyn Store,
    queue: &str,
    state: Option<&str>,
    limit: i64,
) -> Result<(Rows, bool), AqError> {
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(AqError::invalid(format!("--limit {limit}: from 1 to {MAX_LIMIT}")));
    }
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let name = canon(queue);
    let Some(q) = resolved.catalog.queues.get(&name) else {
        return Err(AqError::invalid(format!("no queue {name} (aqgate admin queues lists them)")));
    };
    let state = state.map(|s| s.trim().to_ascii_uppercase());
    if let Some(s) = &state
        && !STATES.contains(&s.as_str())
    {
        return Err(AqError::invalid(format!("--state {s}: one of {}", STATES.join(", "))));
    }
    // One row more than shown tells whether there are more.
    let mut rows = store.view_rows(&q.queue_table, &name, state.as_deref(), limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    Ok((rows.into_iter().map(|r| listed_columns().zip(r).collect()).collect(), more))
}

/// A page of `queue`'s view as `filter` narrows it, after `after` (from the start when
/// `None`), at least `limit` rows (whole messages): the rows, where the next page starts,
/// and whether a payload search stopped at its bound (`Store::view_page`). With
/// `filter.msgid`, that message's rows, looked up by its id.
pub async fn page(
    store: &dyn Store,
    queue: &str,
    filter: &aqgate_core::store::ViewFilter,
    after: Option<aqgate_core::store::ViewCursor>,
    limit: i64,
) -> Result<(Rows, Option<aqgate_core::store::ViewCursor>, bool), AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    page_in(store, &resolved, queue, filter, after, limit).await
}

/// [`page`] over the topology `resolved` (a running server's, current), not read again.
pub async fn page_in(
    store: &dyn Store,
    resolved: &aqgate_core::engine::Resolved,
    queue: &str,
    filter: &aqgate_core::store::ViewFilter,
    after: Option<aqgate_core::store::ViewCursor>,
    limit: i64,
) -> Result<(Rows, Option<aqgate_core::store::ViewCursor>, bool), AqError> {
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(AqError::invalid(format!("limit {limit}: from 1 to {MAX_LIMIT}")));
    }
    if let Some(s) = &filter.state
        && !STATES.contains(&s.as_str())
    {
        return Err(AqError::invalid(format!("state {s}: one of {}", STATES.join(", "))));
    }
    let name = canon(queue);
    let Some(q) = resolved.catalog.queues.get(&name) else {
        return Err(AqError::invalid(format!("no queue {name} (aqgate admin queues lists them)")));
    };
    let p = store.view_page(&q.queue_table, &name, filter, after, limit).await?;
    let rows = p.rows.into_iter().map(|r| listed_columns().zip(r).collect()).collect();
    Ok((rows, p.next, p.scan_bound))
}

/// The stored payload of the live message `msg_id` (hex, as the view's `MSG_ID`) of
/// `queue`, as `consumer` (a multi-consumer queue's; `None` for a single-consumer queue)
/// would see it, read as a BROWSE reads it: in a transaction rolled back at once, with no
/// lock taken and no retry count or position changed. `None` when the queue holds no such
/// message for it now (removed, kept after processing, or expired).
pub async fn payload(
    store: &dyn Store,
    queue: &str,
    msg_id: &str,
    consumer: Option<&str>,
) -> Result<Option<Vec<u8>>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    payload_in(store, &resolved, queue, msg_id, consumer).await
}

/// [`payload`] over the topology `resolved` (a running server's, current), not read again.
pub async fn payload_in(
    store: &dyn Store,
    resolved: &aqgate_core::engine::Resolved,
    queue: &str,
    msg_id: &str,
    consumer: Option<&str>,
) -> Result<Option<Vec<u8>>, AqError> {
    use aqgate_core::clock::Clock;
    use aqgate_core::store::{CandidateQuery, Stored};
    let Some(id) = resolved.ids.get(&canon(queue)).copied() else { return Ok(None) };
    let Some(msgid) = hex::decode(msg_id.trim()).ok().and_then(|b| <[u8; 16]>::try_from(b).ok()) else {
        return Ok(None);
    };
    let q = CandidateQuery {
        msgid: Some(msgid),
        include_locked: true,
        include_waiting: true,
        stored: Stored::Either,
        ..CandidateQuery::head(id, consumer.unwrap_or_default(), "", aqgate_core::clock::SystemClock.now())
    };
    let mut tx = store.begin().await?;
    let found = tx.candidates(&q).await;
    tx.rollback().await?;
    Ok(found?.into_iter().next().map(|m| m.payload))
}

/// Prints them: a table of the main columns, or with `json` every column of every row (a
/// JSON array). When the queue has more rows than shown, the table says so in a last
/// line; with `json` that line goes to `note` (standard error), the array stays whole.
///
/// With a filter beyond the state or a cursor (`after`), it prints a page
/// ([`page`]): whole messages, and when there are more, the `--after` that goes on.
#[allow(clippy::too_many_arguments)]
pub async fn print_messages(
    store: &dyn Store,
    queue: &str,
    filter: &aqgate_core::store::ViewFilter,
    after: Option<&str>,
    limit: i64,
    json: bool,
    w: &mut dyn Write,
    note: &mut dyn Write,
) -> anyhow::Result<()> {
    let (rows, said) = if filter.narrows() || after.is_some() {
        let after = match after {
            None => None,
            Some(a) => Some(
                aqgate_core::store::ViewCursor::parse(a)
                    .ok_or_else(|| AqError::invalid(format!("--after {a}: not a cursor a listing printed")))?,
            ),
        };
        let mut filter = filter.clone();
        filter.state = filter.state.map(|s| s.trim().to_ascii_uppercase());
        let (rows, next, bound) = page(store, queue, &filter, after, limit).await?;
        let said = next.map(|n| {
            let why = if bound { " (the payload search's bound)" } else { "" };
            format!("… and more{why}: {} shown; the next page: --after {}", rows.len(), n.to_text())
        });
        (rows, said)
    } else {
        let (rows, more) = messages(store, queue, filter.state.as_deref(), limit).await?;
        let said = more.then(|| format!("… and more: {} shown; use --limit or --state", rows.len()));
        (rows, said)
    };
    if json {
        let v: Vec<serde_json::Map<String, serde_json::Value>> = rows
            .iter()
            .map(|r| {
                r.iter()
                    .map(|(c, v)| {
                        (c.to_uppercase(), v.clone().map_or(serde_json::Value::Null, serde_json::Value::String))
                    })
                    .collect()
            })
            .collect();
        out!(w, "{}", serde_json::to_string_pretty(&v)?);
        if let Some(said) = said {
            out!(note, "{said}");
        }
        return Ok(());
    }
    let get = |r: &[(&str, Option<String>)], c: &str| {
        r.iter().find(|(n, _)| *n == c).and_then(|(_, v)| v.clone()).unwrap_or_else(|| "-".into())
    };
    out!(
        w,
        "{:<32} {:<13} {:>4} {:<26} {:<12} {:<12} {:>5} {:<16} {}",
        "MSG_ID",
        "STATE",
        "PRIO",
        "ENQ_TIME",
        "ENQ_USER_ID",
        "SENDER",
        "RETRY",
        "CONSUMER",
        "CORR_ID"
    );
    for r in &rows {
        row!(
            w,
            "{:<32} {:<13} {:>4} {:<26} {:<12} {:<12} {:>5} {:<16} {}",
            get(r, "msg_id"),
            get(r, "msg_state"),
            get(r, "msg_priority"),
            get(r, "enq_timestamp"),
            get(r, "enq_user_id"),
            get(r, "sender_name"),
            get(r, "retry_count"),
            get(r, "consumer_name");
            get(r, "corr_id")
        );
    }
    if let Some(said) = said {
        out!(w, "{said}");
    }
    Ok(())
}
