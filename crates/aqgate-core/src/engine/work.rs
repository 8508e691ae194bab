//! The work budget of a request's condition evaluations: each evaluation of a dequeue
//! condition or subscriber rule gets at most [`ConditionLimits::limits`] (steps, the
//! longest text), and all of one scan (a dequeue's look over its candidates, an enqueue's
//! rules) at most [`ConditionLimits::request_steps`], the payload bytes a condition reads
//! counted too. Over either, the request ends with fault 2393 naming the condition, and
//! `aqgate_condition_budget_refused_total` counts it. Evaluation is CPU work on a runtime
//! worker, and on SQLite inside the group-commit lane: the budget is what bounds both.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{AqError, code};
use crate::metrics::Counter;
use crate::selector::{Budget, Condition, ConditionContext, Limits, OverBudget};

/// The default of [`ConditionLimits::request_steps`]: sixteen evaluations' worth.
pub const DEFAULT_REQUEST_STEPS: u64 = 16 * crate::selector::DEFAULT_MAX_STEPS;

/// What evaluating conditions may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionLimits {
    /// One evaluation: steps and the longest text value.
    pub limits: Limits,
    /// All evaluations of one scan together, payload bytes read included.
    pub request_steps: u64,
}

impl Default for ConditionLimits {
    fn default() -> Self {
        Self { limits: Limits::default(), request_steps: DEFAULT_REQUEST_STEPS }
    }
}

/// The budget of one scan (shared by reference: `left` is atomic so that a `&Work` can be
/// held across the scan's awaits).
#[derive(Debug)]
pub(super) struct Work {
    limits: ConditionLimits,
    left: AtomicU64,
    refused: Counter,
}

impl Work {
    pub(super) fn new(limits: ConditionLimits, refused: Counter) -> Self {
        Self { limits, left: AtomicU64::new(limits.request_steps), refused }
    }

    /// A fresh budget for the next scan.
    pub(super) fn renew(&self) {
        self.left.store(self.limits.request_steps, Ordering::Relaxed);
    }

    /// Whether `cond` may hold for a message, judged within one evaluation's budget and
    /// charged to no scan (a waiting receive's judgement of what arrived): a condition over
    /// the budget counts as holding, so the look it leads to evaluates it within the
    /// scan's budget, and refuses it there.
    pub(super) fn may_match(&self, cond: &Condition, ctx: &dyn ConditionContext) -> bool {
        let mut budget = Budget::new(self.limits.limits.max_steps, self.limits.limits.max_text_bytes);
        cond.eval_within(ctx, &mut budget).unwrap_or(true)
    }

    /// Evaluates `cond` for one message whose stored payload has `payload_bytes`; `what`
    /// names the condition in a fault ("dequeue condition", "rule of subscriber X").
    pub(super) fn eval(
        &self,
        what: &dyn Fn() -> String,
        cond: &Condition,
        ctx: &dyn ConditionContext,
        payload_bytes: usize,
    ) -> Result<bool, AqError> {
        let left = self.left.load(Ordering::Relaxed);
        let per_eval = self.limits.limits.max_steps;
        let mut budget = Budget::new(per_eval.min(left), self.limits.limits.max_text_bytes);
        let r = cond.eval_within(ctx, &mut budget);
        let mut used = budget.used();
        if cond.references_user_data() {
            used = used.saturating_add(payload_bytes as u64);
        }
        self.left.store(left.saturating_sub(used), Ordering::Relaxed);
        match r {
            Ok(matched) => Ok(matched),
            Err(over) => {
                self.refused.inc();
                let why = match over {
                    OverBudget::Steps if left < per_eval => format!(
                        "the conditions of one request may take {} steps in all (--condition-request-steps)",
                        self.limits.request_steps
                    ),
                    OverBudget::Steps => {
                        format!("one evaluation may take {per_eval} steps (--condition-max-steps)")
                    }
                    text @ OverBudget::Text { .. } => format!("{text} (--condition-max-text-bytes)"),
                };
                Err(AqError::client(
                    code::CONDITION_BUDGET,
                    format!("{} `{}` needs more work than it may have: {why}", what(), shorten(cond.text())),
                ))
            }
        }
    }
}

/// A condition's text for a fault: at most 80 characters.
fn shorten(text: &str) -> String {
    let mut out: String = text.chars().take(80).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}
