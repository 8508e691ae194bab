//! A queue's messages (reader, on a queue the caller may dequeue from), non-destructive by
//! construction: the listing is the one `aqgate admin messages` prints (the queue's `AQ$`
//! view, read-only SQL), a payload is read as a BROWSE reads it
//! (`aqgate_admin::messages::payload`: no lock, no retry count, no redelivery).
//!
//! - `GET /console/queues/{queue}/messages?state=&limit=`: the first `limit` rows in
//!   dequeue order (in `state` only, when given), and whether there are more.
//! - `GET …/messages/{msg_id}?consumer=&state=`: one message's header fields (each
//!   consumer's row) and its payload as text.
//! - `GET …/messages/{msg_id}/payload?consumer=`: the stored payload as an attachment.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use aqgate_admin::messages::{STATES, messages};
use aqgate_core::topology::ConsoleRole;

use crate::Console;
use crate::answer::{forbidden, html, not_found_because, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, params, readable};

/// Rows listed when not told, and the most.
const LIMIT: i64 = 50;
const LIMIT_MAX: i64 = 1_000;
/// Rows of the view a message's page looks through for it.
const LOOKUP: i64 = 10_000;

/// The refusal (403) unless the caller has the reader role and the dequeue privilege on
/// `queue`.
fn may_not_read(c: &Console, who: &Caller, queue: &str) -> Option<Response> {
    who.below(ConsoleRole::Reader)
        .or_else(|| (!readable(c, &who.agent, queue)).then(|| forbidden("You may not dequeue from this queue.")))
}

fn col(row: &[(&'static str, Option<String>)], name: &str) -> String {
    row.iter().find(|(c, _)| *c == name).and_then(|(_, v)| v.clone()).unwrap_or_default()
}

fn enc(s: &str) -> String {
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
    limit: i64,
    lines: Vec<Line>,
    more: bool,
    /// The replay form, on an exception queue to an operator.
    replay: Option<String>,
}

/// The `state` parameter, when one of the view's states.
fn state_param(p: &std::collections::HashMap<String, String>) -> Option<String> {
    p.get("state").map(|s| s.trim().to_ascii_uppercase()).filter(|s| STATES.contains(&s.as_str()))
}

pub(crate) async fn list(State(c): State<Console>, who: Caller, Path(queue): Path<String>, uri: Uri) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let p = params(&uri);
    let state = state_param(&p);
    let limit = p.get("limit").and_then(|l| l.parse().ok()).unwrap_or(LIMIT).clamp(1, LIMIT_MAX);
    let (rows, more) = match messages(c.http.engine.store().as_ref(), &queue, state.as_deref(), limit).await {
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
    let queue = aqgate_core::topology::canon(&queue);
    let states = STATES.iter().map(|s| (*s, state.as_deref() == Some(*s))).collect();
    let exception = c.http.engine.resolved().catalog.queue(&queue).is_some_and(|q| q.is_exception_queue);
    let replay =
        (exception && who.role >= ConsoleRole::Operator).then(|| format!("/console/queues/{}/replay", enc(&queue)));
    let page = Messages { nav: Nav::of(&who), queue, states, limit, lines, more, replay };
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

pub(crate) async fn one(
    State(c): State<Console>,
    who: Caller,
    Path((queue, msg_id)): Path<(String, String)>,
    uri: Uri,
) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let p = params(&uri);
    let consumer = p.get("consumer").filter(|s| !s.is_empty()).cloned();
    let store = c.http.engine.store().as_ref();
    let (rows, _) = match messages(store, &queue, state_param(&p).as_deref(), LOOKUP).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let rows: Vec<Vec<(&'static str, String)>> = rows
        .into_iter()
        .filter(|r| col(r, "msg_id").eq_ignore_ascii_case(&msg_id))
        .map(|r| r.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect())
        .collect();
    if rows.is_empty() {
        return not_found_because("No such message among the queue's first 10,000 rows (narrow by state).");
    }
    let payload = match aqgate_admin::messages::payload(store, &queue, &msg_id, consumer.as_deref()).await {
        Ok(p) => p,
        Err(e) => return unavailable(&e),
    };
    let kind = c.http.engine.resolved().catalog.queue(&queue).map(|q| q.payload.clone());
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
    let p = params(&uri);
    let consumer = p.get("consumer").filter(|s| !s.is_empty()).cloned();
    let store = c.http.engine.store().as_ref();
    match aqgate_admin::messages::payload(store, &queue, &msg_id, consumer.as_deref()).await {
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
