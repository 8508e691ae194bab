//! The condition tester (reader, on a queue the caller may dequeue from):
//! `GET /console/queues/{queue}/tester?condition=&consumer=` evaluates a selector
//! condition or subscriber rule against the queue's first messages through the read model
//! `aqgate admin test-condition` uses (`aqgate_admin::tester`: browsed, no lock, no retry
//! count, nothing written; the engine's own evaluator within the running server's budgets,
//! `--condition-max-steps`, `--condition-max-text-bytes`, `--condition-request-steps`),
//! and shows the command line of the same test.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;

use aqgate_admin::tester::{DEFAULT_TESTED, Test};
use aqgate_core::idap::model::FaultKind;
use aqgate_core::selector::MAX_CONDITION_CHARS;

use crate::Console;
use crate::answer::{bad_request, html, unavailable};
use crate::caller::Caller;
use crate::messages::{enc, may_not_read};
use crate::pages::{Nav, params};

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
    /// The `aqgate admin test-condition` command line of the same test.
    cli: String,
}

pub(crate) async fn tester(State(c): State<Console>, who: Caller, Path(queue): Path<String>, uri: Uri) -> Response {
    if let Some(r) = may_not_read(&c, &who, &queue) {
        return r;
    }
    let resolved = c.http.engine.resolved();
    let p = params(&uri);
    let condition = p.get("condition").map(|s| s.trim().to_string()).unwrap_or_default();
    let asked = p.get("consumer").map(String::as_str);
    let (q, consumer) = match aqgate_admin::tester::queue_and_consumer(&resolved, &queue, asked) {
        Ok(qc) => qc,
        Err(e) => return bad_request(&e.message),
    };
    let mut cli = vec!["test-condition", q.name.as_str(), condition.as_str()];
    if !consumer.is_empty() {
        cli.extend(["--consumer", consumer.as_str()]);
    }
    let mut page = Tester {
        nav: Nav::of(&who),
        queue: q.name.clone(),
        condition: condition.clone(),
        consumer: consumer.clone(),
        multi: q.multi_consumer,
        error: None,
        verdicts: Vec::new(),
        matched: 0,
        tested: DEFAULT_TESTED,
        max_chars: MAX_CONDITION_CHARS,
        messages: format!("/console/queues/{}/messages", enc(&q.name)),
        cli: crate::cli::admin(&cli),
    };
    if condition.is_empty() {
        return html(StatusCode::OK, &page);
    }
    let test = Test {
        queue: &q.name,
        condition: &condition,
        consumer: Some(&consumer),
        limit: DEFAULT_TESTED,
        limits: c.http.engine.config().conditions,
    };
    let report = match aqgate_admin::tester::test_in(
        c.http.engine.store().as_ref(),
        &resolved,
        &test,
        c.http.engine.now(),
    )
    .await
    {
        Ok(r) => r,
        Err(e) if e.kind == FaultKind::Client => {
            page.error = Some(e.message);
            return html(StatusCode::BAD_REQUEST, &page);
        }
        Err(e) => return unavailable(&e),
    };
    page.matched = report.matched;
    page.verdicts = report
        .verdicts
        .into_iter()
        .map(|v| Verdict {
            href: format!("{}/{}?consumer={}", page.messages, v.msg_id, enc(&v.consumer)),
            msg_id: v.msg_id,
            priority: v.priority,
            correlation: v.correlation.unwrap_or_default(),
            outcome: v.outcome.as_str(),
            why: v.why,
        })
        .collect();
    html(StatusCode::OK, &page)
}
