//! The condition tester (reader, on a queue the caller may dequeue from):
//! `GET /console/queues/{queue}/tester?condition=&consumer=` evaluates a selector
//! condition or subscriber rule against the queue's first messages, browsed (no lock, no
//! retry count, the transaction rolled back), by the engine's own evaluator: the
//! condition parsed and its names checked as a dequeue checks them
//! (`aqgate_core::engine::check_condition_names`), each message seen as a dequeue sees it
//! (`MessageContext::for_stored`), each evaluation within the engine's per-evaluation
//! budget and all of them within its per-request budget (`--condition-max-steps`,
//! `--condition-max-text-bytes`, `--condition-request-steps`). Nothing is written.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;

use aqgate_core::engine::context::MessageContext;
use aqgate_core::selector::{Budget, Condition, MAX_CONDITION_CHARS};
use aqgate_core::store::{CandidateQuery, Stored, StoredMessage};

use crate::Console;
use crate::answer::{bad_request, html, unavailable};
use crate::caller::Caller;
use crate::messages::{enc, may_not_read};
use crate::pages::{Nav, params};

/// The messages a test looks at.
pub(crate) const TESTED: i64 = 200;

struct Verdict {
    msg_id: String,
    href: String,
    priority: i64,
    correlation: String,
    /// `match`, `no match`, `error`, `not evaluated`.
    outcome: &'static str,
    why: String,
}

#[derive(Template)]
#[template(path = "tester.html")]
struct Tester {
    nav: Nav,
    queue: String,
    condition: String,
    consumer: String,
    multi: bool,
    error: Option<String>,
    verdicts: Vec<Verdict>,
    matched: usize,
    tested: i64,
    max_chars: usize,
    messages: String,
}

pub(crate) async fn tester(State(c): State<Console>, who: Caller, Path(queue): Path<String>, uri: Uri) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let resolved = c.http.engine.resolved();
    let Some(q) = resolved.catalog.queue(&queue) else { return bad_request("No such queue.") };
    let p = params(&uri);
    let condition = p.get("condition").map(|s| s.trim().to_string()).unwrap_or_default();
    let consumer = match p.get("consumer").map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(s) if s.len() > 128 => return bad_request("consumer: at most 128 bytes"),
        Some(s) => aqgate_core::topology::canon(s),
        None => q.subscribers.first().map(|s| s.name.clone()).unwrap_or_default(),
    };
    let consumer = if q.multi_consumer { consumer } else { String::new() };
    let mut page = Tester {
        nav: Nav::of(&who),
        queue: q.name.clone(),
        condition: condition.clone(),
        consumer: consumer.clone(),
        multi: q.multi_consumer,
        error: None,
        verdicts: Vec::new(),
        matched: 0,
        tested: TESTED,
        max_chars: MAX_CONDITION_CHARS,
        messages: format!("/console/queues/{}/messages", enc(&q.name)),
    };
    if condition.is_empty() {
        return html(StatusCode::OK, &page);
    }
    if condition.chars().count() > MAX_CONDITION_CHARS {
        page.error = Some(format!("The condition is longer than {MAX_CONDITION_CHARS} characters."));
        return html(StatusCode::BAD_REQUEST, &page);
    }
    let cond = match Condition::parse(&condition) {
        Ok(cond) => cond,
        Err(e) => {
            page.error = Some(format!("invalid condition: {e}"));
            return html(StatusCode::BAD_REQUEST, &page);
        }
    };
    if let Err(e) = aqgate_core::engine::check_condition_names(&cond, q, &resolved.catalog.types) {
        page.error = Some(e.message.clone());
        return html(StatusCode::BAD_REQUEST, &page);
    }
    let Some(qid) = resolved.ids.get(&q.name).copied() else { return bad_request("No such queue.") };
    let store = c.http.engine.store();
    let look = CandidateQuery {
        queue: qid,
        consumer,
        txn: String::new(),
        now: c.http.engine.clock().now(),
        after: None,
        corrid: None,
        msgid: None,
        include_locked: true,
        include_waiting: true,
        limit: TESTED,
        stored: Stored::Either,
    };
    let found = match store.begin().await {
        Ok(mut tx) => {
            let found = tx.candidates(&look).await;
            if let Err(e) = tx.rollback().await {
                return unavailable(&e);
            }
            found
        }
        Err(e) => return unavailable(&e),
    };
    let found = match found {
        Ok(f) => f,
        Err(e) => return unavailable(&e),
    };
    let limits = c.http.engine.config().conditions;
    let mut left = limits.request_steps;
    for m in &found {
        let v = judge(&cond, m, q, &resolved.catalog.types, limits.limits, &mut left, &page.messages);
        page.matched += usize::from(v.outcome == "match");
        page.verdicts.push(v);
    }
    html(StatusCode::OK, &page)
}

/// One message's verdict, charged to `left` (the steps left of the request's budget).
fn judge(
    cond: &Condition,
    m: &StoredMessage,
    q: &aqgate_core::topology::QueueInfo,
    types: &aqgate_core::payload::TypeRegistry,
    limits: aqgate_core::selector::Limits,
    left: &mut u64,
    messages: &str,
) -> Verdict {
    let msg_id = hex::encode_upper(m.msgid);
    let mut v = Verdict {
        href: format!("{messages}/{msg_id}?consumer={}", enc(&m.consumer)),
        msg_id,
        priority: m.priority,
        correlation: m.corrid.clone().unwrap_or_default(),
        outcome: "not evaluated",
        why: String::new(),
    };
    if *left == 0 {
        v.why = "the test's budget (--condition-request-steps) is spent".into();
        return v;
    }
    let ctx = MessageContext::for_stored(m, &q.name, &q.payload, types);
    let mut budget = Budget::new(limits.max_steps.min(*left), limits.max_text_bytes);
    let r = cond.eval_within(&ctx, &mut budget);
    let mut used = budget.used();
    if cond.references_user_data() {
        used = used.saturating_add(m.payload.len() as u64);
    }
    *left = left.saturating_sub(used);
    match r {
        Ok(true) => {
            v.outcome = "match";
            v.why = format!("TRUE in {} steps", budget.used());
        }
        Ok(false) => {
            v.outcome = "no match";
            v.why = format!("FALSE or UNKNOWN in {} steps", budget.used());
        }
        Err(e) => {
            v.outcome = "error";
            v.why = format!("{e} (a dequeue would be refused with 2393)");
        }
    }
    v
}
