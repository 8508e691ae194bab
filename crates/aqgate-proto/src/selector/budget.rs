//! The work budget of one evaluation of a condition, rule or transformation expression:
//! steps (nodes visited, characters compared, copied or scanned) and the longest text a
//! value may be (a payload attribute, a JMS property, a concatenation, a function's
//! result). An evaluation over either stops where it is and says which.

/// The default of [`Limits::max_steps`]: about a millisecond of work in a release build.
pub const DEFAULT_MAX_STEPS: u64 = 1_000_000;
/// The default of [`Limits::max_text_bytes`]: 64 KiB (a RAW payload's hex of 32 KiB).
pub const DEFAULT_MAX_TEXT_BYTES: usize = 64 * 1024;

/// How the error of an expression over its budget begins ([`crate::selector::Expression::eval_within`]).
pub const OVER_BUDGET: &str = "over its work budget";

/// What one evaluation may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Steps one evaluation may take.
    pub max_steps: u64,
    /// Bytes (UTF-8) the longest text value of an evaluation may have.
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_steps: DEFAULT_MAX_STEPS, max_text_bytes: DEFAULT_MAX_TEXT_BYTES }
    }
}

/// The work left to an evaluation, and what it has used.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    used: u64,
    max_text: usize,
}

impl Budget {
    /// `steps` to spend; text values of at most `max_text_bytes`.
    pub fn new(steps: u64, max_text_bytes: usize) -> Self {
        Self { left: steps, used: 0, max_text: max_text_bytes }
    }

    /// A budget of `limits`.
    pub fn of(limits: Limits) -> Self {
        Self::new(limits.max_steps, limits.max_text_bytes)
    }

    /// Steps used so far (those of a refused charge included).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The longest text a value may be, in bytes.
    pub fn max_text(&self) -> usize {
        self.max_text
    }

    /// Spends `n` steps; over what is left, nothing more may be done.
    pub fn charge(&mut self, n: u64) -> Result<(), OverBudget> {
        self.used = self.used.saturating_add(n);
        if n > self.left {
            self.left = 0;
            return Err(OverBudget::Steps);
        }
        self.left -= n;
        Ok(())
    }

    /// A text of `len` bytes made or read as `what`: refused over the limit.
    pub fn text(&self, len: usize, what: &str) -> Result<(), OverBudget> {
        if len > self.max_text {
            return Err(OverBudget::Text { what: what.to_string(), len, limit: self.max_text });
        }
        Ok(())
    }
}

/// Why an evaluation stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    /// It needed more steps than it had.
    #[error("it needs more work than its budget allows")]
    Steps,
    /// A text value would be longer than allowed.
    #[error("{what} is {len} bytes of text, more than an evaluation may hold ({limit} bytes)")]
    Text { what: String, len: usize, limit: usize },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{Condition, ConditionContext, Expression};
    use crate::value::Value;

    /// A message whose payload is `data` (as `tab.user_data` / `source`) and whose
    /// correlation is `corrid`; it counts how often the payload was built.
    struct Ctx {
        data: String,
        built: std::cell::Cell<usize>,
    }

    impl ConditionContext for Ctx {
        fn property(&self, name: &str) -> Option<Value> {
            (name == "corrid").then(|| Value::Text("ORD-1".into()))
        }
        fn user_data(&self, _path: &[String]) -> Value {
            self.built.set(self.built.get() + 1);
            Value::Text(self.data.clone())
        }
        fn user_property(&self, _name: &str) -> Value {
            Value::Null
        }
    }

    fn ctx(len: usize) -> Ctx {
        Ctx { data: "0".repeat(len), built: Default::default() }
    }

    fn run(cond: &str, ctx: &Ctx, limits: Limits) -> (Result<bool, OverBudget>, u64) {
        let c = Condition::parse(cond).expect(cond);
        let mut b = Budget::of(limits);
        let r = c.eval_within(ctx, &mut b);
        (r, b.used())
    }

    #[test]
    fn charges_until_the_budget_is_spent() {
        let mut b = Budget::new(10, 4);
        assert_eq!(b.charge(6), Ok(()));
        assert_eq!(b.charge(4), Ok(()));
        assert_eq!(b.charge(1), Err(OverBudget::Steps));
        assert_eq!(b.used(), 11);
        assert_eq!(b.charge(0), Ok(()));
        assert_eq!(b.text(4, "x"), Ok(()));
        assert!(matches!(b.text(5, "x"), Err(OverBudget::Text { len: 5, limit: 4, .. })));
    }

    /// The attacks on a condition end with the budget, in a bounded number of steps.
    #[test]
    fn a_payload_over_the_text_limit_is_refused_before_anything_else() {
        let big = ctx(3_800_000);
        let like = format!("tab.user_data LIKE '%{}1'", "0".repeat(3_900));
        let (r, used) = run(&like, &big, Limits::default());
        assert!(
            matches!(&r, Err(OverBudget::Text { what, len: 3_800_000, limit: DEFAULT_MAX_TEXT_BYTES }) if what == "tab.user_data"),
            "{r:?}"
        );
        assert!(used < 100, "{used}");
        // The 63-term chain builds nothing: the first term is refused.
        let chain = vec!["tab.user_data"; 63].join(" || ");
        let (r, _) = run(&format!("{chain} = 'x'"), &big, Limits::default());
        assert!(matches!(r, Err(OverBudget::Text { .. })), "{r:?}");
        assert_eq!(big.built.get(), 2, "one payload per evaluation, each dropped at once");
    }

    #[test]
    fn concatenations_are_capped() {
        let small = ctx(4_000);
        let chain = vec!["tab.user_data"; 63].join(" || ");
        let (r, used) = run(&format!("{chain} = 'x'"), &small, Limits::default());
        assert!(matches!(&r, Err(OverBudget::Text { what, .. }) if what == "a concatenation"), "{r:?}");
        assert!(used < DEFAULT_MAX_STEPS, "the text limit comes first: {used}");
        // Within the cap it works as before.
        let (r, _) = run("tab.user_data || corrid LIKE '%0ORD-1'", &small, Limits::default());
        assert_eq!(r, Ok(true));
        // UPPER cannot grow a text past the cap either.
        let limits = Limits { max_text_bytes: 3_999, ..Limits::default() };
        let (r, _) = run("UPPER(SUBSTR(tab.user_data, 1, 3999)) = 'x'", &ctx(3_999), limits);
        assert_eq!(r, Ok(false));
        let (r, _) = run("tab.user_data = 'x'", &ctx(4_000), limits);
        assert!(matches!(r, Err(OverBudget::Text { len: 4_000, limit: 3_999, .. })), "{r:?}");
    }

    #[test]
    fn work_stops_at_the_step_budget() {
        let data = ctx(60_000);
        // A '_' piece of 3,950 characters: 62 words per character of text.
        let cond = format!("tab.user_data LIKE '%{}_1%'", "0".repeat(3_948));
        let (r, used) = run(&cond, &data, Limits::default());
        assert_eq!(r, Err(OverBudget::Steps));
        assert!(used <= DEFAULT_MAX_STEPS + 4_096, "stopped at the budget: {used}");
        // A dynamic pattern as long as the text: linear, within the budget.
        let cond = "tab.user_data LIKE '%' || SUBSTR(tab.user_data, 1, 200000) || '1'";
        let (r, used) = run(cond, &data, Limits::default());
        assert_eq!(r, Ok(false));
        assert!(used < 12 * 60_000, "linear: {used}");
        // Every condition costs something, and a tiny budget stops even a cheap one.
        let (r, used) = run("corrid = 'ORD-1'", &data, Limits::default());
        assert_eq!(r, Ok(true));
        assert!(used > 0 && used < 50, "{used}");
        let (r, _) = run("corrid = 'ORD-1'", &data, Limits { max_steps: 3, ..Limits::default() });
        assert_eq!(r, Err(OverBudget::Steps));
    }

    #[test]
    fn transformation_expressions_have_the_budget_too() {
        let e = Expression::parse("source || source || source").expect("parses");
        let mut b = Budget::new(DEFAULT_MAX_STEPS, 10_000);
        let err = e.eval_within(&ctx(4_000), &mut b).expect_err("over");
        assert!(err.contains("over its work budget") && err.contains("a concatenation"), "{err}");
        let mut b = Budget::new(DEFAULT_MAX_STEPS, 20_000);
        assert!(matches!(e.eval_within(&ctx(4_000), &mut b), Ok(Value::Text(s)) if s.len() == 12_000));
        let err = e.eval_within(&ctx(4_000), &mut Budget::new(5, 20_000)).expect_err("over");
        assert!(err.contains("more work than its budget"), "{err}");
    }
}
