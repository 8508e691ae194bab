//! `aqgate admin messages QUEUE`: the queue's messages as Oracle's `AQ$<QUEUE_TABLE>` view
//! shows them (the same rows: this reads the view).

use std::io::Write;

use aqgate_core::error::AqError;
use aqgate_core::store::Store;
use aqgate_core::topology::canon;
use aqgate_store::views::COLUMNS;

/// The states a message is shown in (`MSG_STATE`).
pub const STATES: [&str; 5] = ["READY", "WAIT", "PROCESSED", "EXPIRED", "UNDELIVERABLE"];

/// The rows of `queue` in its queue table's view (in `state` only, when given), each as
/// (column, value) pairs in the view's order.
pub async fn messages(
    store: &dyn Store,
    queue: &str,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<Vec<(&'static str, Option<String>)>>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let name = canon(queue);
    let Some(q) = resolved.catalog.queues.get(&name).filter(|q| q.remote.is_none()) else {
        return Err(AqError::invalid(format!("no queue {name} (aqgate admin queues lists them)")));
    };
    let state = state.map(|s| s.trim().to_ascii_uppercase());
    if let Some(s) = &state
        && !STATES.contains(&s.as_str())
    {
        return Err(AqError::invalid(format!("--state {s}: one of {}", STATES.join(", "))));
    }
    let at = COLUMNS.iter().position(|c| *c == "msg_state").unwrap_or(0);
    Ok(store
        .view_rows(&q.queue_table, &name, limit)
        .await?
        .into_iter()
        .filter(|r| state.is_none() || r.get(at).and_then(|v| v.as_deref()) == state.as_deref())
        .map(|r| COLUMNS.iter().copied().zip(r).collect())
        .collect())
}

/// Prints them: a table of the main columns, or with `json` every column of every row.
pub async fn print_messages(
    store: &dyn Store,
    queue: &str,
    state: Option<&str>,
    json: bool,
    w: &mut dyn Write,
) -> anyhow::Result<()> {
    let rows = messages(store, queue, state, 10_000).await?;
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
            get(r, "enq_time"),
            get(r, "enq_user_id"),
            get(r, "sender_name"),
            get(r, "retry_count"),
            get(r, "consumer_name");
            get(r, "corr_id")
        );
    }
    Ok(())
}
