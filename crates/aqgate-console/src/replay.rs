//! Replays from exception queues and the audit log (operator): what `aqgate admin replay`
//! and `aqgate admin audit` do (`aqgate_admin::replay`), with the same filters.
//!
//! - `GET /console/queues/{queue}/replay` (an exception queue): the form (message ids,
//!   correlation, reason, the cap `max`, `batch`).
//! - `POST` the same: without `confirm`, a dry run: what would move, where to, and the
//!   confirmation form; with `confirm=yes`, the replay, its report (moved, batches) and
//!   the audit rows it wrote. Either takes only an exception queue the caller may dequeue
//!   from, and only when the caller may enqueue to every queue its messages can go back
//!   to: each queue of its queue table, and each original queue the dry run finds.
//! - `GET /console/audit?limit=`: the audit log, newest first, the rows of the caller's
//!   queues.

use askama::Template;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use aqgate_admin::replay::{DEFAULT_BATCH, DEFAULT_MAX, MAX_MAX, ReplayFilter, ReplayReport, ReplayRequest, replay};
use aqgate_admin::timeline::time_text;
use aqgate_core::error::AqError;
use aqgate_core::store::Expiry;
use aqgate_core::topology::{ConsoleRole, Privilege, canon};
use aqgate_proto::idap::model::FaultKind;

use crate::Console;
use crate::answer::{bad_request, forbidden, html, not_found_because, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, params, readable, visible};

/// The most a replay form's body may be (a list of message ids).
const FORM_MAX: usize = 512 * 1024;
/// The most batches a replay may take (`batch` from 1 to this).
const BATCH_MAX: i64 = 1000;
/// Audit rows listed when not told, and the most.
const AUDIT_LIMIT: i64 = 100;
const AUDIT_LIMIT_MAX: i64 = 1000;

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn timeline_href(queue: &str, msgid: &str) -> String {
    format!("/console/queues/{}/messages/{}/timeline", enc(queue), enc(msgid))
}

/// What the form chose.
#[derive(Debug, Clone)]
struct Choice {
    msgids: Vec<String>,
    correlation: Option<String>,
    reason: Option<String>,
    max: i64,
    batch: i64,
}

impl Default for Choice {
    fn default() -> Self {
        Self { msgids: Vec::new(), correlation: None, reason: None, max: DEFAULT_MAX, batch: DEFAULT_BATCH }
    }
}

impl Choice {
    /// The form's fields; a value out of its bounds is clamped, a malformed one refused.
    fn parse(fields: &[(String, String)]) -> Result<Self, String> {
        let mut c = Self::default();
        for (k, v) in fields {
            match k.as_str() {
                "msgids" => {
                    for id in v.split(|ch: char| ch.is_whitespace() || ch == ',').filter(|s| !s.is_empty()) {
                        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                            return Err(format!("{id}: a message id is 32 hex digits"));
                        }
                        c.msgids.push(id.to_ascii_uppercase());
                    }
                }
                "correlation" => c.correlation = (!v.is_empty()).then(|| v.clone()),
                "reason" if v.is_empty() => c.reason = None,
                "reason" => match Expiry::ALL.iter().find(|e| e.oracle_name().eq_ignore_ascii_case(v.trim())) {
                    Some(e) => c.reason = Some(e.oracle_name().to_string()),
                    None => return Err(format!("{v}: not an expiration reason")),
                },
                "max" => c.max = number(v, "max")?.clamp(1, MAX_MAX),
                "batch" => c.batch = number(v, "batch")?.clamp(1, BATCH_MAX),
                _ => {}
            }
        }
        if c.msgids.len() > MAX_MAX as usize {
            return Err(format!("at most {MAX_MAX} message ids"));
        }
        c.msgids.dedup();
        Ok(c)
    }

    fn filter(&self) -> ReplayFilter {
        ReplayFilter { msgids: self.msgids.clone(), correlation: self.correlation.clone(), reason: self.reason.clone() }
    }

    /// The `aqgate admin replay` command line of this choice.
    fn cli(&self, queue: &str, actor: &str, dry_run: bool) -> String {
        let mut args: Vec<String> = vec!["replay".into(), queue.into()];
        for id in &self.msgids {
            args.extend(["--msgid".into(), id.clone()]);
        }
        if let Some(c) = &self.correlation {
            args.extend(["--correlation".into(), c.clone()]);
        }
        if let Some(r) = &self.reason {
            args.extend(["--reason".into(), r.clone()]);
        }
        args.extend(["--max".into(), self.max.to_string(), "--batch".into(), self.batch.to_string()]);
        if dry_run {
            args.push("--dry-run".into());
        }
        args.extend(["--as".into(), actor.into()]);
        crate::cli::admin(&args)
    }
}

fn number(v: &str, what: &str) -> Result<i64, String> {
    v.trim().parse().map_err(|_| format!("{what}: {v:?} is not a number"))
}

/// The exception queue `queue`'s name when the caller may replay from it, else the refusal.
fn may_replay(c: &Console, who: &Caller, queue: &str) -> Result<String, Box<Response>> {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return Err(Box::new(r));
    }
    let r = c.http.engine.resolved();
    let Some(q) = r.catalog.queue(queue) else { return Err(Box::new(not_found_because("No such queue."))) };
    if !q.is_exception_queue {
        let why =
            "Not an exception queue: a replay takes messages from an exception queue back to the queue they left.";
        return Err(Box::new(not_found_because(why)));
    }
    if !readable(c, &who.agent, &q.name) {
        return Err(Box::new(forbidden("You may not dequeue from this exception queue.")));
    }
    let origins = r.catalog.queues.values().filter(|o| o.queue_table == q.queue_table && !o.is_exception_queue);
    for o in origins {
        if !r.catalog.permits(&who.agent, o, Privilege::Enqueue) {
            let why = format!("You may not enqueue to {}, where this exception queue's messages go back.", o.name);
            return Err(Box::new(forbidden(&why)));
        }
    }
    Ok(q.name.clone())
}

/// The refusal when the report sends a message to a queue the caller may not enqueue to.
fn may_send_back(c: &Console, who: &Caller, report: &ReplayReport) -> Option<Response> {
    let r = c.http.engine.resolved();
    report.rows.iter().filter_map(|row| row.original_queue.as_deref()).find_map(|name| {
        let permitted = r.catalog.queue(name).is_some_and(|q| r.catalog.permits(&who.agent, q, Privilege::Enqueue));
        (!permitted).then(|| forbidden(&format!("You may not enqueue to {name}, where messages would go back.")))
    })
}

struct Line {
    msgid: String,
    msgid_href: String,
    new_msgid: Option<(String, String)>,
    original_queue: String,
    reason: String,
    correlation: String,
    outcome: String,
}

/// What a replay did or would do.
struct Outcome {
    matched: usize,
    replayed: usize,
    capped: bool,
    run: String,
    /// The original queues, comma-separated.
    targets: String,
    lines: Vec<Line>,
    /// (batches, audit rows of the run) of a replay done.
    batches: usize,
    audit_rows: usize,
}

#[derive(Template)]
#[template(path = "replay.html")]
struct ReplayPage {
    nav: Nav,
    queue: String,
    /// The form's values.
    msgids: String,
    correlation: String,
    reasons: Vec<(&'static str, bool)>,
    max: i64,
    batch: i64,
    max_max: i64,
    /// The dry run's outcome (then the confirmation form), or the replay's.
    dry: Option<Outcome>,
    done: Option<Outcome>,
    /// The command lines: the dry run's and the replay's.
    cli_dry: String,
    cli_real: String,
    question: String,
}

fn page(who: &Caller, queue: &str, choice: &Choice, dry: Option<Outcome>, done: Option<Outcome>) -> ReplayPage {
    let question = dry.as_ref().map_or_else(String::new, |d| {
        format!(
            "Replay {} message(s) of {queue} to {}?",
            d.matched,
            if d.targets.is_empty() { "-" } else { &d.targets }
        )
    });
    ReplayPage {
        nav: Nav::of(who),
        queue: queue.to_string(),
        msgids: choice.msgids.join(" "),
        correlation: choice.correlation.clone().unwrap_or_default(),
        reasons: Expiry::ALL
            .iter()
            .map(|e| (e.oracle_name(), choice.reason.as_deref() == Some(e.oracle_name())))
            .collect(),
        max: choice.max,
        batch: choice.batch,
        max_max: MAX_MAX,
        dry,
        done,
        cli_dry: choice.cli(queue, &who.agent.name, true),
        cli_real: choice.cli(queue, &who.agent.name, false),
        question,
    }
}

fn outcome(queue: &str, report: &ReplayReport, batches: usize, audit_rows: usize) -> Outcome {
    let mut targets: Vec<&str> = report.rows.iter().filter_map(|r| r.original_queue.as_deref()).collect();
    targets.sort_unstable();
    targets.dedup();
    let lines = report
        .rows
        .iter()
        .map(|r| Line {
            msgid_href: timeline_href(queue, &r.msgid),
            msgid: r.msgid.clone(),
            new_msgid: r
                .new_msgid
                .as_ref()
                .map(|n| (n.clone(), timeline_href(r.original_queue.as_deref().unwrap_or(queue), n))),
            original_queue: r.original_queue.clone().unwrap_or_else(|| "-".into()),
            reason: r.reason.clone().unwrap_or_else(|| "-".into()),
            correlation: r.correlation.clone().unwrap_or_default(),
            outcome: r.outcome.clone(),
        })
        .collect();
    Outcome {
        matched: report.matched,
        replayed: report.replayed,
        capped: report.capped,
        run: report.run.clone(),
        targets: targets.join(", "),
        lines,
        batches,
        audit_rows,
    }
}

/// A read model's error: a bad value (400, its text shown), else the store's (503).
fn failed(e: &AqError) -> Response {
    if e.kind == FaultKind::Client { bad_request(&e.message) } else { unavailable(e) }
}

/// `GET /console/queues/{queue}/replay`.
pub(crate) async fn form(State(c): State<Console>, who: Caller, Path(queue): Path<String>) -> Response {
    let queue = match may_replay(&c, &who, &queue) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    html(StatusCode::OK, &page(&who, &queue, &Choice::default(), None, None))
}

/// `POST /console/queues/{queue}/replay`: the dry run, or with `confirm=yes` the replay.
pub(crate) async fn run(State(c): State<Console>, who: Caller, Path(queue): Path<String>, req: Request) -> Response {
    let queue = match may_replay(&c, &who, &queue) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    let Ok(body) = axum::body::to_bytes(req.into_body(), FORM_MAX).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large\n").into_response();
    };
    let fields: Vec<(String, String)> = url::form_urlencoded::parse(&body).into_owned().collect();
    let choice = match Choice::parse(&fields) {
        Ok(c) => c,
        Err(why) => return bad_request(&why),
    };
    let confirmed = fields.iter().any(|(k, v)| k == "confirm" && v == "yes");
    let store = c.http.engine.store().as_ref();
    let mut req = ReplayRequest {
        queue: queue.clone(),
        filter: choice.filter(),
        max: choice.max,
        batch: choice.batch,
        dry_run: true,
        actor: who.agent.name.clone(),
    };
    let dry = match replay(store, &req, &mut |_, _| {}).await {
        Ok(r) => r,
        Err(e) => return failed(&e),
    };
    if let Some(r) = may_send_back(&c, &who, &dry) {
        return r;
    }
    if !confirmed {
        let o = outcome(&queue, &dry, 0, 0);
        return html(StatusCode::OK, &page(&who, &queue, &choice, Some(o), None));
    }
    req.dry_run = false;
    let mut batches = 0;
    let report = match replay(store, &req, &mut |_, _| batches += 1).await {
        Ok(r) => r,
        Err(e) => return failed(&e),
    };
    tracing::info!(agent = %who.agent.name, queue = %queue, replayed = report.replayed, run = %report.run, "console: replay");
    let rows = match aqgate_admin::replay::audit(store, (batches as i64).saturating_add(100)).await {
        Ok(rows) => rows.iter().filter(|a| a.run == report.run).count(),
        Err(e) => return unavailable(&e),
    };
    let o = outcome(&queue, &report, batches, rows);
    html(StatusCode::OK, &page(&who, &queue, &choice, None, Some(o)))
}

struct AuditLine {
    id: i64,
    at: String,
    actor: String,
    action: String,
    queue: String,
    target: String,
    count: i64,
    filter: String,
    run: String,
    /// Each message id with its timeline.
    msgids: Vec<(String, String)>,
    ids_more: i64,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct Audit {
    nav: Nav,
    limit: i64,
    rows: Vec<AuditLine>,
}

/// `GET /console/audit?limit=` (operator).
pub(crate) async fn audit(State(c): State<Console>, who: Caller, uri: Uri) -> Response {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return r;
    }
    let limit =
        params(&uri).get("limit").and_then(|l| l.trim().parse().ok()).unwrap_or(AUDIT_LIMIT).clamp(1, AUDIT_LIMIT_MAX);
    let rows = match aqgate_admin::replay::audit(c.http.engine.store().as_ref(), limit).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    let rows = rows
        .into_iter()
        .filter(|a| visible(&c, &who.agent, &a.queue))
        .map(|a| AuditLine {
            msgids: a.msgids.iter().map(|m| (m.clone(), timeline_href(&a.queue, m))).collect(),
            id: a.id,
            at: time_text(a.at),
            actor: a.actor,
            action: a.action,
            queue: canon(&a.queue),
            target: a.target.unwrap_or_else(|| "-".into()),
            count: a.count,
            filter: a.filter,
            run: a.run,
            ids_more: a.ids_more,
        })
        .collect();
    html(StatusCode::OK, &Audit { nav: Nav::of(&who), limit, rows })
}
