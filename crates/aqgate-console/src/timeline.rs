//! A message's timeline (reader, on a queue the caller may dequeue from): what
//! `aqgate admin timeline MSGID` prints (`aqgate_admin::timeline::timeline`), an event a
//! row with its time: the enqueue (agent, IDAP transaction), delay and expiration, each
//! dequeue and the failed ones, the move to an exception queue with its reason, copies
//! and replays with their ids, the gateway's doubts with the remote id, the audit rows.
//!
//! - `GET /console/queues/{queue}/messages/{msg_id}/timeline`: only for a message of
//!   `queue`, or, for one no longer in the store, one an audit row of `queue` names (a
//!   replayed message, or the queue it was replayed to).

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use aqgate_admin::timeline::{time_text, timeline};
use aqgate_core::topology::{ConsoleRole, canon};
use aqgate_proto::idap::model::FaultKind;

use crate::Console;
use crate::answer::{forbidden, html, not_found_because, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, readable};

struct Row {
    at: String,
    what: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "timeline.html")]
struct Timeline {
    nav: Nav,
    queue: String,
    msg_id: String,
    /// Where it is now, or that it is gone.
    now: String,
    message: Option<String>,
    /// The queue's messages.
    list: String,
    rows: Vec<Row>,
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub(crate) async fn page(
    State(c): State<Console>,
    who: Caller,
    Path((queue, msg_id)): Path<(String, String)>,
) -> Response {
    if let Some(r) = who.below(ConsoleRole::Reader) {
        return r;
    }
    if !readable(&c, &who.agent, &queue) {
        return forbidden("You may not dequeue from this queue.");
    }
    let store = c.http.engine.store().as_ref();
    let t = match timeline(store, &msg_id).await {
        Ok(t) => t,
        Err(e) if e.kind == FaultKind::Client => return not_found_because("No such message in the store."),
        Err(e) => return unavailable(&e),
    };
    let queue = canon(&queue);
    let ours = match &t.queue {
        Some(q) => *q == queue,
        None => match store.audit_of(&t.msgid).await {
            Ok(rows) => rows
                .iter()
                .any(|a| a.queue == queue || a.target.as_deref().is_some_and(|t| t.split(',').any(|q| q == queue))),
            Err(e) => return unavailable(&e),
        },
    };
    if !ours {
        return not_found_because("No such message in this queue.");
    }
    let now = match (&t.queue, &t.state) {
        (Some(q), Some(s)) => format!("In {q}, {s}."),
        _ => "No longer in the store: its copies and audit rows remain.".into(),
    };
    let message = t.queue.as_ref().map(|q| format!("/console/queues/{}/messages/{}", enc(q), enc(&t.msgid)));
    let rows = t
        .events
        .into_iter()
        .map(|e| Row { at: e.at.map_or_else(|| "-".into(), time_text), what: e.what, detail: e.detail })
        .collect();
    let list = format!("/console/queues/{}/messages", enc(&queue));
    html(StatusCode::OK, &Timeline { nav: Nav::of(&who), queue, msg_id: t.msgid, now, message, list, rows })
}
