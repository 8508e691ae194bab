//! The operator's pages on what the server does besides queues: the open IDAP sessions
//! (admin; `aqgate admin sessions`) with an abort, the mail spool (operator;
//! `aqgate admin spool`) and the notifications (operator; `aqgate admin notifications` and
//! `registrations`). Every list bounded.
//!
//! - `GET /console/sessions?limit=`: the open sessions, longest idle first.
//! - `POST /console/sessions/{id}/abort`: `aqgate admin sessions --abort ID`: the session
//!   ends, its transaction rolled back.
//! - `GET /console/spool?limit=`: the unfinished mails, newest first.
//! - `GET /console/notifications?limit=`: undelivered notifications (pending, parked, their
//!   failures) and registrations, of the caller's queues; targets redacted.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;

use aqgate_admin::timeline::time_text;
use aqgate_core::topology::ConsoleRole;
use aqgate_proto::idap::model::FaultKind;

use crate::Console;
use crate::answer::{bad_request, html, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, params, visible};

/// Rows listed when not told, and the most.
const LIMIT: i64 = 200;
const LIMIT_MAX: i64 = 1000;

fn limit(uri: &Uri) -> i64 {
    params(uri).get("limit").and_then(|l| l.trim().parse().ok()).unwrap_or(LIMIT).clamp(1, LIMIT_MAX)
}

struct SessionLine {
    id: String,
    agent: String,
    last_used: String,
    idle_seconds: i64,
    pending: bool,
    locked: i64,
    enqueued: i64,
    txn: String,
    cli: String,
}

#[derive(Template)]
#[template(path = "sessions.html")]
struct Sessions {
    nav: Nav,
    limit: i64,
    rows: Vec<SessionLine>,
    more: bool,
}

/// `GET /console/sessions` (admin).
pub(crate) async fn sessions(State(c): State<Console>, who: Caller, uri: Uri) -> Response {
    if let Some(r) = who.below(ConsoleRole::Admin) {
        return r;
    }
    let limit = limit(&uri);
    let mut all = match aqgate_admin::sessions::sessions(c.http.engine.store().as_ref()).await {
        Ok(s) => s,
        Err(e) => return unavailable(&e),
    };
    let more = all.len() as i64 > limit;
    all.truncate(limit as usize);
    let rows = all
        .into_iter()
        .map(|s| SessionLine {
            cli: crate::cli::admin(&["sessions", "--abort", &s.id]),
            last_used: time_text(s.last_used),
            id: s.id,
            agent: s.agent,
            idle_seconds: s.idle_seconds,
            pending: s.pending,
            locked: s.locked,
            enqueued: s.enqueued,
            txn: s.txn,
        })
        .collect();
    html(StatusCode::OK, &Sessions { nav: Nav::of(&who), limit, rows, more })
}

#[derive(Template)]
#[template(path = "aborted.html")]
struct Aborted {
    nav: Nav,
    id: String,
    agent: String,
    had_work: bool,
    released: String,
}

/// `POST /console/sessions/{id}/abort` (admin).
pub(crate) async fn abort(State(c): State<Console>, who: Caller, Path(id): Path<String>) -> Response {
    if let Some(r) = who.below(ConsoleRole::Admin) {
        return r;
    }
    match aqgate_admin::sessions::abort(c.http.engine.store().as_ref(), &id).await {
        Ok(a) => {
            tracing::info!(agent = %who.agent.name, session = %a.id, of = %a.agent, "console: IDAP session aborted");
            let mut released = a.released_queues.clone();
            released.sort();
            released.dedup();
            let page = Aborted {
                nav: Nav::of(&who),
                id: a.id,
                agent: a.agent,
                had_work: a.had_work,
                released: released.join(", "),
            };
            html(StatusCode::OK, &page)
        }
        Err(e) if e.kind == FaultKind::Client => bad_request(&e.message),
        Err(e) => unavailable(&e),
    }
}

struct MailLine {
    id: i64,
    received: String,
    from: String,
    message_id: String,
    subject: String,
    agent: String,
    encrypted: bool,
    state: String,
    attempts: i64,
    performed: bool,
    replies: String,
    resend: String,
    last_error: String,
}

#[derive(Template)]
#[template(path = "spool.html")]
struct Spool {
    nav: Nav,
    limit: i64,
    rows: Vec<MailLine>,
}

/// `GET /console/spool` (operator).
pub(crate) async fn spool(State(c): State<Console>, who: Caller, uri: Uri) -> Response {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return r;
    }
    let limit = limit(&uri);
    let rows = match aqgate_admin::spool::spool(c.http.engine.store().as_ref(), limit).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let rows = rows
        .into_iter()
        .map(|m| MailLine {
            id: m.id,
            received: time_text(m.received_at),
            from: m.from,
            message_id: m.message_id,
            subject: m.subject.unwrap_or_default(),
            agent: m.agent,
            encrypted: m.encrypted,
            state: m.state,
            attempts: m.attempts,
            performed: m.performed,
            replies: format!("{} of {}", m.replies_sent, m.replies_wanted),
            resend: m.resend_message_id.unwrap_or_default(),
            last_error: m.last_error.unwrap_or_default(),
        })
        .collect();
    html(StatusCode::OK, &Spool { nav: Nav::of(&who), limit, rows })
}

struct DeliveryLine {
    id: String,
    state: String,
    attempts: i64,
    queue: String,
    consumer: String,
    agent: String,
    target: String,
    next: String,
    last_error: String,
}

struct RegistrationLine {
    queue: String,
    consumer: String,
    agent: String,
    target: String,
}

#[derive(Template)]
#[template(path = "notifications.html")]
struct Notifications {
    nav: Nav,
    limit: i64,
    pending: i64,
    parked: i64,
    deliveries: Vec<DeliveryLine>,
    registrations: Vec<RegistrationLine>,
    more: bool,
}

/// `GET /console/notifications` (operator).
pub(crate) async fn notifications(State(c): State<Console>, who: Caller, uri: Uri) -> Response {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return r;
    }
    let limit = limit(&uri);
    let store = c.http.engine.store().as_ref();
    let ((pending, parked), deliveries) = match aqgate_admin::notifications::deliveries(store, limit).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let (registrations, more) = match aqgate_admin::notifications::registrations(store, limit).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    let deliveries = deliveries
        .into_iter()
        .filter(|d| visible(&c, &who.agent, &d.queue))
        .map(|d| DeliveryLine {
            id: d.notification_id,
            state: d.state,
            attempts: d.attempts,
            queue: d.queue,
            consumer: dash(d.consumer),
            agent: d.agent,
            target: d.target,
            next: time_text(d.next_attempt_at),
            last_error: d.last_error.unwrap_or_default(),
        })
        .collect();
    let registrations = registrations
        .into_iter()
        .filter(|r| visible(&c, &who.agent, &r.queue))
        .map(|r| RegistrationLine { queue: r.queue, consumer: dash(r.consumer), agent: r.agent, target: r.target })
        .collect();
    let page = Notifications { nav: Nav::of(&who), limit, pending, parked, deliveries, registrations, more };
    html(StatusCode::OK, &page)
}
