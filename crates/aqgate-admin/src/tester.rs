//! `aqgate admin test-condition QUEUE CONDITION`: which of a queue's first messages a
//! selector condition or subscriber rule matches, and why, evaluated by the engine's own
//! evaluator — the read model of the console's condition tester.
//!
//! The condition is parsed and its names checked as a dequeue checks them
//! (`aqgate_core::engine::check_condition_names`); the messages are browsed (no lock, no
//! retry count, the transaction rolled back), each seen as a dequeue sees it
//! (`MessageContext::for_stored`); each evaluation is within the per-evaluation budget
//! and all of them within the per-request budget (`ConditionLimits`: the server's
//! `--condition-max-steps`, `--condition-max-text-bytes`, `--condition-request-steps`).
//! Nothing is written.

use std::io::Write;

use aqgate_core::engine::ConditionLimits;
use aqgate_core::engine::Resolved;
use aqgate_core::engine::context::MessageContext;
use aqgate_core::error::AqError;
use aqgate_core::selector::{Budget, Condition, MAX_CONDITION_CHARS};
use aqgate_core::store::{CandidateQuery, Store, Stored, StoredMessage};
use aqgate_core::topology::{QueueInfo, canon};

/// The messages a test looks at when not told, and the most.
pub const DEFAULT_TESTED: i64 = 200;
pub const MAX_TESTED: i64 = 1_000;
/// The longest consumer name taken.
const CONSUMER_MAX: usize = 128;

/// What the condition made of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Match,
    NoMatch,
    /// The evaluation failed (a dequeue with the condition would be refused).
    Error,
    /// The request's budget was spent before it.
    NotEvaluated,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Match => "match",
            Outcome::NoMatch => "no match",
            Outcome::Error => "error",
            Outcome::NotEvaluated => "not evaluated",
        }
    }
}

/// One message's verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    pub msg_id: String,
    pub consumer: String,
    pub priority: i64,
    pub correlation: Option<String>,
    pub outcome: Outcome,
    pub why: String,
}

/// A test's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub queue: String,
    /// The consumer the messages were browsed as (empty for a single-consumer queue).
    pub consumer: String,
    pub condition: String,
    pub tested: usize,
    pub matched: usize,
    pub verdicts: Vec<Verdict>,
}

/// What to test.
#[derive(Debug, Clone)]
pub struct Test<'a> {
    pub queue: &'a str,
    pub condition: &'a str,
    /// A multi-consumer queue's consumer (its first subscriber when `None`); ignored for a
    /// single-consumer queue.
    pub consumer: Option<&'a str>,
    /// Messages looked at (1 to [`MAX_TESTED`]).
    pub limit: i64,
    pub limits: ConditionLimits,
}

impl<'a> Test<'a> {
    /// A test within the default budgets of `serve`.
    pub fn with_default_budgets(queue: &'a str, condition: &'a str, consumer: Option<&'a str>, limit: i64) -> Self {
        Self { queue, condition, consumer, limit, limits: ConditionLimits::default() }
    }
}

/// The queue a test names, and the consumer it browses as.
pub fn queue_and_consumer<'r>(
    resolved: &'r Resolved,
    queue: &str,
    consumer: Option<&str>,
) -> Result<(&'r QueueInfo, String), AqError> {
    let name = canon(queue);
    let Some(q) = resolved.catalog.queues.get(&name) else {
        return Err(AqError::invalid(format!("no queue {name} (aqgate admin queues lists them)")));
    };
    let consumer = match consumer.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) if s.len() > CONSUMER_MAX => {
            return Err(AqError::invalid(format!("consumer: at most {CONSUMER_MAX} bytes")));
        }
        Some(s) => canon(s),
        None => q.subscribers.first().map(|s| s.name.clone()).unwrap_or_default(),
    };
    Ok((q, if q.multi_consumer { consumer } else { String::new() }))
}

/// Parses `condition` and checks its names against `q` as a dequeue would.
pub fn parse(condition: &str, q: &QueueInfo, resolved: &Resolved) -> Result<Condition, AqError> {
    if condition.trim().is_empty() {
        return Err(AqError::invalid("the condition is empty"));
    }
    if condition.chars().count() > MAX_CONDITION_CHARS {
        return Err(AqError::invalid(format!("the condition is longer than {MAX_CONDITION_CHARS} characters")));
    }
    let cond = Condition::parse(condition).map_err(|e| AqError::invalid(format!("invalid condition: {e}")))?;
    aqgate_core::engine::check_condition_names(&cond, q, &resolved.catalog.types)?;
    Ok(cond)
}

/// Runs `t` over the stored topology.
pub async fn test(store: &dyn Store, t: &Test<'_>, now: aqgate_core::clock::Micros) -> Result<Report, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    test_in(store, &resolved, t, now).await
}

/// [`test`] over the topology `resolved` (a running server's, current), not read again.
pub async fn test_in(
    store: &dyn Store,
    resolved: &Resolved,
    t: &Test<'_>,
    now: aqgate_core::clock::Micros,
) -> Result<Report, AqError> {
    if !(1..=MAX_TESTED).contains(&t.limit) {
        return Err(AqError::invalid(format!("limit {}: from 1 to {MAX_TESTED}", t.limit)));
    }
    let (q, consumer) = queue_and_consumer(resolved, t.queue, t.consumer)?;
    let cond = parse(t.condition, q, resolved)?;
    let Some(qid) = resolved.ids.get(&q.name).copied() else {
        return Err(AqError::invalid(format!("no queue {} in the store", q.name)));
    };
    let look = CandidateQuery {
        include_locked: true,
        include_waiting: true,
        limit: t.limit,
        stored: Stored::Either,
        ..CandidateQuery::head(qid, consumer.as_str(), "", now)
    };
    let mut tx = store.begin().await?;
    let found = tx.candidates(&look).await;
    tx.rollback().await?;
    let found = found?;
    let mut left = t.limits.request_steps;
    let verdicts: Vec<Verdict> =
        found.iter().map(|m| judge(&cond, m, q, &resolved.catalog.types, t.limits, &mut left)).collect();
    Ok(Report {
        queue: q.name.clone(),
        consumer,
        condition: t.condition.to_string(),
        tested: verdicts.len(),
        matched: verdicts.iter().filter(|v| v.outcome == Outcome::Match).count(),
        verdicts,
    })
}

/// One message's verdict, charged to `left` (the steps left of the request's budget).
fn judge(
    cond: &Condition,
    m: &StoredMessage,
    q: &QueueInfo,
    types: &aqgate_core::payload::TypeRegistry,
    limits: ConditionLimits,
    left: &mut u64,
) -> Verdict {
    let mut v = Verdict {
        msg_id: hex::encode_upper(m.msgid),
        consumer: m.consumer.clone(),
        priority: m.priority,
        correlation: m.corrid.clone(),
        outcome: Outcome::NotEvaluated,
        why: String::new(),
    };
    if *left == 0 {
        v.why = "the test's budget (--condition-request-steps) is spent".into();
        return v;
    }
    let ctx = MessageContext::for_stored(m, &q.name, &q.payload, types);
    let mut budget = Budget::new(limits.limits.max_steps.min(*left), limits.limits.max_text_bytes);
    let r = cond.eval_within(&ctx, &mut budget);
    let mut used = budget.used();
    if cond.references_user_data() {
        used = used.saturating_add(m.payload.len() as u64);
    }
    *left = left.saturating_sub(used);
    match r {
        Ok(true) => {
            v.outcome = Outcome::Match;
            v.why = format!("TRUE in {} steps", budget.used());
        }
        Ok(false) => {
            v.outcome = Outcome::NoMatch;
            v.why = format!("FALSE or UNKNOWN in {} steps", budget.used());
        }
        Err(e) => {
            v.outcome = Outcome::Error;
            v.why = format!("{e} (a dequeue would be refused with 2393)");
        }
    }
    v
}

/// `admin test-condition`: runs `t` over the stored topology, now, and prints its report.
pub async fn print_test(store: &dyn Store, t: &Test<'_>, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
    print_report(&test(store, t, now).await?, json, w)
}

/// Prints a report: a line per message, then the count; or the report as JSON.
pub fn print_report(r: &Report, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    if json {
        out!(w, "{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    out!(w, "{:<32} {:<13} {:>8} {:<20} WHY", "MSG_ID", "OUTCOME", "PRIORITY", "CORRELATION");
    for v in &r.verdicts {
        row!(
            w,
            "{:<32} {:<13} {:>8} {:<20} {}",
            v.msg_id,
            v.outcome.as_str(),
            v.priority,
            v.correlation.as_deref().unwrap_or("-");
            v.why
        );
    }
    let as_whom = if r.consumer.is_empty() { String::new() } else { format!(" as consumer {}", r.consumer) };
    let total = format!("{} of {} messages of {}{as_whom} match", r.matched, r.tested, r.queue);
    out!(w, "{}", crate::Cell::last(&total));
    Ok(())
}
