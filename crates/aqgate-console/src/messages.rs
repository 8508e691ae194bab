//! A queue's messages (reader, on a queue the caller may dequeue from), non-destructive by
//! construction: the listing is the one `aqgate admin messages` prints (the queue's `AQ$`
//! view, read-only SQL), a payload is read as a BROWSE reads it
//! (`aqgate_admin::messages::payload`: no lock, no retry count, no redelivery).
//!
//! - `GET /console/queues/{queue}/messages?state=&limit=&after=&…`: a page of rows in the
//!   listing's order after the cursor `after`, narrowed by the filters (`crate::filter`),
//!   and the next page's link.
//! - `GET …/messages/{msg_id}?consumer=`: one message's header fields (each consumer's
//!   row, looked up by its id) and its payload as text.
//! - `GET …/messages/{msg_id}/payload?consumer=`: the stored payload as an attachment.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use aqgate_admin::messages::STATES;
use aqgate_core::store::{Expiry, PAYLOAD_SEARCH_BYTES, PAYLOAD_SEARCH_ROWS, ViewCursor, ViewFilter};
use aqgate_core::topology::ConsoleRole;

use crate::Console;
use crate::answer::{bad_request, forbidden, html, not_found_because, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, enqueuable, params, readable};

/// Rows listed when not told, and the most.
const LIMIT: i64 = 50;
const LIMIT_MAX: i64 = 1_000;

/// The refusal (403) unless the caller has the reader role and the dequeue privilege on
/// `queue`.
pub(crate) fn may_not_read(c: &Console, who: &Caller, queue: &str) -> Option<Response> {
    who.below(ConsoleRole::Reader)
        .or_else(|| (!readable(c, &who.agent, queue)).then(|| forbidden("You may not dequeue from this queue.")))
}

pub(crate) fn col(row: &[(&'static str, Option<String>)], name: &str) -> String {
    row.iter().find(|(c, _)| *c == name).and_then(|(_, v)| v.clone()).unwrap_or_default()
}

pub(crate) fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

struct Line {
    msg_id: String,
    state: String,
    priority: String,
    enqueued: String,
    enq_user: String,
    sender: String,
    retries: String,
    consumer: String,
    correlation: String,
    reason: String,
    href: String,
}

#[derive(Template)]
#[template(path = "messages.html")]
struct Messages {
    nav: Nav,
    queue: String,
    /// Each state and whether it is the one chosen.
    states: Vec<(&'static str, bool)>,
    /// Each exception reason and whether it is the one chosen.
    reasons: Vec<(&'static str, bool)>,
    limit: i64,
    f: crate::filter::Shown,
    lines: Vec<Line>,
    next: Option<String>,
    scan_bound: bool,
    search_kib: i64,
    search_rows: usize,
    tester: String,
    publish: Option<String>,
    /// The replay form, on an exception queue to an operator.
    replay: Option<String>,
}

/// `GET /console/queues/{queue}/messages?state=&limit=&after=&…filters`: a page of the
/// queue's view in the listing's order after the cursor `after`, narrowed by the filters
/// (`crate::filter`), in the store's SQL.
pub(crate) async fn list(State(c): State<Console>, who: Caller, Path(queue): Path<String>, uri: Uri) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let p = params(&uri);
    let (filter, shown) = match crate::filter::parse(&p) {
        Ok(f) => f,
        Err(e) => return bad_request(&e),
    };
    let limit = p.get("limit").and_then(|l| l.trim().parse().ok()).unwrap_or(LIMIT).clamp(1, LIMIT_MAX);
    let after = match p.get("after").map(|a| a.trim()).filter(|a| !a.is_empty()) {
        None => None,
        Some(a) => match ViewCursor::parse(a) {
            Some(c) => Some(c),
            None => return bad_request("after: not a cursor of this listing (follow a Next page link)"),
        },
    };
    let (rows, next, scan_bound) = match aqgate_admin::messages::page_in(
        c.http.engine.store().as_ref(),
        &c.http.engine.resolved(),
        &queue,
        &filter,
        after,
        limit,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let base = format!("/console/queues/{}/messages", enc(&queue));
    let lines = rows
        .iter()
        .map(|r| {
            let (id, consumer) = (col(r, "msg_id"), col(r, "consumer_name"));
            Line {
                href: format!("{base}/{}?consumer={}", enc(&id), enc(&consumer)),
                msg_id: id,
                state: col(r, "msg_state"),
                priority: col(r, "msg_priority"),
                enqueued: col(r, "enq_timestamp"),
                enq_user: col(r, "enq_user_id"),
                sender: col(r, "sender_name"),
                retries: col(r, "retry_count"),
                consumer,
                correlation: col(r, "corr_id"),
                reason: col(r, "expiration_reason"),
            }
        })
        .collect();
    let next = next.map(|n| {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in &p {
            if k != "after" {
                q.append_pair(k, v);
            }
        }
        q.append_pair("after", &n.to_text());
        format!("{base}?{}", q.finish())
    });
    let publish = (who.role >= ConsoleRole::Operator && enqueuable(&c, &who.agent, &queue))
        .then(|| format!("/console/queues/{}/publish", enc(&queue)));
    let tester = format!("/console/queues/{}/tester", enc(&queue));
    let queue = aqgate_core::topology::canon(&queue);
    let states = STATES.iter().map(|s| (*s, filter.state.as_deref() == Some(*s))).collect();
    let reasons = Expiry::ALL.iter().map(|e| (e.oracle_name(), filter.reason == Some(e.code()))).collect();
    let exception = c.http.engine.resolved().catalog.queue(&queue).is_some_and(|q| q.is_exception_queue);
    let replay =
        (exception && who.role >= ConsoleRole::Operator).then(|| format!("/console/queues/{}/replay", enc(&queue)));
    let page = Messages {
        nav: Nav::of(&who),
        queue,
        states,
        reasons,
        limit,
        f: shown,
        lines,
        next,
        scan_bound,
        search_kib: PAYLOAD_SEARCH_BYTES / 1024,
        search_rows: PAYLOAD_SEARCH_ROWS,
        tester,
        publish,
        replay,
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "message.html")]
struct Message {
    nav: Nav,
    queue: String,
    msg_id: String,
    rows: Vec<Vec<(&'static str, String)>>,
    payload: Option<(&'static str, String)>,
    download: String,
    timeline: String,
}

/// The `consumer` parameter of a message's page and download (a multi-consumer queue's).
fn consumer_param(uri: &Uri) -> Option<String> {
    params(uri).get("consumer").filter(|s| !s.is_empty()).cloned()
}

pub(crate) async fn one(
    State(c): State<Console>,
    who: Caller,
    Path((queue, msg_id)): Path<(String, String)>,
    uri: Uri,
) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let consumer = consumer_param(&uri);
    let store = c.http.engine.store().as_ref();
    let resolved = c.http.engine.resolved();
    let Some(id) = hex::decode(msg_id.trim()).ok().and_then(|b| <[u8; 16]>::try_from(b).ok()) else {
        return not_found_because("No such message: a message id is 32 hexadecimal digits.");
    };
    let filter = ViewFilter { msgid: Some(id), ..ViewFilter::default() };
    let (rows, _, _) = match aqgate_admin::messages::page_in(store, &resolved, &queue, &filter, None, LIMIT_MAX).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let rows: Vec<Vec<(&'static str, String)>> =
        rows.into_iter().map(|r| r.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect()).collect();
    if rows.is_empty() {
        return not_found_because("The queue's view has no such message.");
    }
    let payload = match aqgate_admin::messages::payload_in(store, &resolved, &queue, &msg_id, consumer.as_deref()).await
    {
        Ok(p) => p,
        Err(e) => return unavailable(&e),
    };
    let kind = resolved.catalog.queue(&queue).map(|q| q.payload.clone());
    let payload = payload.zip(kind).map(|(bytes, kind)| crate::payload::show(&kind, &bytes));
    let download = format!(
        "/console/queues/{}/messages/{}/payload?consumer={}",
        enc(&queue),
        enc(&msg_id),
        enc(consumer.as_deref().unwrap_or(""))
    );
    let timeline = format!("/console/queues/{}/messages/{}/timeline", enc(&queue), enc(&msg_id));
    let queue = aqgate_core::topology::canon(&queue);
    html(StatusCode::OK, &Message { nav: Nav::of(&who), queue, msg_id, rows, payload, download, timeline })
}

pub(crate) async fn download(
    State(c): State<Console>,
    who: Caller,
    Path((queue, msg_id)): Path<(String, String)>,
    uri: Uri,
) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let consumer = consumer_param(&uri);
    let store = c.http.engine.store().as_ref();
    match aqgate_admin::messages::payload_in(store, &c.http.engine.resolved(), &queue, &msg_id, consumer.as_deref())
        .await
    {
        Ok(Some(bytes)) => {
            // The name is the message id, hex digits only (the lookup found it by them).
            let name: String = msg_id.chars().filter(char::is_ascii_hexdigit).collect();
            (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}.bin\"")),
                ],
                bytes,
            )
                .into_response()
        }
        Ok(None) => not_found_because("The queue holds no such message now."),
        Err(e) => unavailable(&e),
    }
}
