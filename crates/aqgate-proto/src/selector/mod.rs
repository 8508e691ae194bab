//! Dequeue-selector conditions and subscriber rules (Oracle AQ `deq_condition` /
//! `add_subscriber(rule => ...)`, IDAP `<selector><condition>`).
//!
//! A condition is "a Boolean expression using syntax similar to the WHERE clause of
//! a SQL query" over message properties (`priority`, `corrid`, ...), payload
//! attributes (`tab.user_data.deptno`, `tab.user_data.customer.country`) and JMS
//! user properties (`Country = 'USA'`).  It is **never pasted into SQL**.
//!
//! # Allowlist design
//!
//! The text goes through four gates; anything not explicitly allowed is rejected
//! with [`ConditionError`] naming the construct:
//!
//! 1. **Raw limits** – at most [`MAX_CONDITION_CHARS`] characters.
//! 2. **Token allowlist** – the text is tokenized (linear, non-recursive) with
//!    sqlparser's tokenizer.  Only words, numbers, `'strings'` (`''` escape),
//!    `N'strings'`, `( ) , .`, `= <> != < <= > >=`, `+ - * /` and `||` may appear.
//!    `;`, bind placeholders, `[ ]`, `::`, `%` and any other operator are refused
//!    here, as are the words `SELECT`/`WITH` (subqueries).  Parenthesis nesting
//!    deeper than [`MAX_DEPTH`] is refused before the parser ever recurses.
//! 3. **Parsing** – sqlparser 0.55 `parse_expr` with a private dialect whose
//!    prefix hook owns every word and `(`: it parses `NOT`, literals, (dotted)
//!    identifiers, parentheses and the allowlisted function calls itself and fails
//!    *immediately* on anything else (`CAST`, `CASE`, `EXISTS`, `INTERVAL`, other
//!    function calls such as `DBMS_LOCK.SLEEP(10)`, ...).  This matters for more
//!    than error messages: the stock prefix parser retries a failed keyword
//!    construct as a function call, which is exponential in the nesting depth of
//!    inputs like `NOT (NOT (... a b))`.  sqlparser recursion is bounded by its
//!    recursion limit and, since every recursive step consumes a token, by the
//!    token count.  Short conditions (≤ 16 tokens, the common case) are parsed on
//!    the caller's stack; longer ones on a short-lived thread with a large stack,
//!    because sqlparser's frames need up to ~40 KiB per level in debug builds.
//!    The whole input must be consumed.  (The helper thread is computation only;
//!    the module does no I/O.)
//! 4. **Conversion** – the sqlparser AST is converted into this module's small
//!    AST, accepting only the node kinds listed below (nesting ≤ [`MAX_DEPTH`],
//!    long `AND`/`OR` chains are flattened and do not count).  Evaluation is
//!    plain Rust over [`Value`]s supplied by a [`ConditionContext`], every step
//!    charged to a [`Budget`] (steps, and the longest text a value may be); over it,
//!    [`Condition::eval_within`] stops with [`OverBudget`]. `LIKE` is linear in the
//!    text (see `like.rs`).
//!
//! # Supported language
//!
//! * `AND`, `OR`, `NOT`, parentheses; `= <> != < <= > >=`; `IS [NOT] NULL`;
//!   `[NOT] BETWEEN`; `[NOT] IN (literal, ...)`; `[NOT] LIKE` with `%`, `_` and
//!   optional `ESCAPE 'c'`; `+ - * /`, unary `-`/`+`; `||`.
//! * Literals: numbers, `'text'`, `N'text'`, `TRUE`, `FALSE`, `NULL`.
//! * Functions: `UPPER`, `LOWER`, `LENGTH`, `SUBSTR(s, pos[, len])`,
//!   `TRIM([LEADING|TRAILING|BOTH] [c FROM] s)`, `NVL(a, b)`, `ABS`, `ROUND(n[, d])`.
//!
//! # Names
//!
//! * Unquoted identifiers are case-insensitive.  A bare identifier is first looked
//!   up as a message property by its lower-case name (aliases `correlation` →
//!   `corrid`, `msg_state` → `state`, `delivery_count` → `retry_count`); if the
//!   context does not know that property ([`ConditionContext::property`] returns
//!   `None`) it is a **JMS user property** looked up by its original spelling
//!   (`Country = 'USA'`).
//! * A double-quoted identifier (`"Country"`) keeps its case and always names a JMS
//!   user property.
//! * `tab.user_data.a.b` is a payload attribute (path `["a", "b"]`, unquoted
//!   segments lower-cased); `tab.user_data` alone is the whole payload (empty
//!   path).  `tab.<column>` is the message property `<column>`.  Other dotted names
//!   are rejected.
//! * Oracle pseudo-columns and SQL keywords used as values (`SYSDATE`, `USER`,
//!   `ROWNUM`, `CURRENT_TIMESTAMP`, ...) are rejected rather than silently being
//!   treated as (absent) JMS properties; quote them to use such a property name.
//!
//! # Semantics (Oracle-flavoured, three-valued)
//!
//! * `NULL`/missing values make comparisons UNKNOWN; `NOT UNKNOWN` is UNKNOWN;
//!   [`Condition::eval`] maps UNKNOWN to `false`.
//! * As in Oracle, the empty string is `NULL` (a payload `<corrid/>` is null).
//! * number vs number compares numerically, text vs text by code point, number vs
//!   text converts the text to a number (Oracle implicit conversion, so
//!   `tab.user_data.deptno = 60` works on XML text payloads); a failed conversion,
//!   division by zero or a type mismatch yields UNKNOWN, never an error or panic.
//!   Booleans support only `=`/`<>` (text `'true'`/`'false'` converts).
//! * `||` treats NULL as the empty string (Oracle); numbers are rendered without a
//!   trailing `.0`.

use sqlparser::tokenizer::{Token, Tokenizer};

use crate::value::Value;

mod ast;
mod budget;
mod convert;
mod eval;
mod like;
mod parser;
mod tokens;

pub use self::ast::*;
pub use self::budget::*;
use self::convert::*;
use self::eval::*;
use self::like::*;
use self::parser::*;
use self::tokens::*;

/// Maximum length of a condition, in characters (Oracle: 4000).
pub const MAX_CONDITION_CHARS: usize = 4000;
/// Maximum nesting depth: parentheses in the raw text and the depth of the
/// converted expression tree (flattened `AND`/`OR` chains count once).
pub const MAX_DEPTH: usize = 64;
/// sqlparser's own recursion budget (several units per nesting level).
const PARSER_RECURSION_LIMIT: usize = 4 * MAX_DEPTH;
/// Stack for the parser thread; generous because debug builds of sqlparser use
/// large frames.  Only touched pages are committed.
const PARSER_STACK_BYTES: usize = 32 * 1024 * 1024;
/// Conditions with at most this many tokens are parsed on the caller's stack
/// (worst case well under 1 MiB even in debug builds).
const INLINE_MAX_TOKENS: usize = 16;

/// Why a condition was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConditionError {
    /// Not a well-formed expression (syntax error, bad literal, wrong arity, ...).
    #[error("invalid condition: {0}")]
    Parse(String),
    /// Well-formed SQL, but outside the allowed language (subquery, function, ...).
    #[error("unsupported in a condition: {0}")]
    Unsupported(String),
    /// Longer than [`MAX_CONDITION_CHARS`].
    #[error("condition exceeds {MAX_CONDITION_CHARS} characters")]
    TooLong,
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("condition is nested too deeply (limit {MAX_DEPTH})")]
    TooDeep,
}

/// Where a condition gets its values from (one message).
pub trait ConditionContext {
    /// Message property by lower-case canonical name: `priority`, `corrid`,
    /// `msgid`, `enq_time`, `state`, `delay`, `expiration`, `retry_count`,
    /// `sender_name`, `sender_address`, `sender_protocol`, `exception_queue`,
    /// `consumer_name`, `q_name` (aliases are canonicalised by the parser).
    /// `None` = not a property name (the name is then tried as a JMS user
    /// property); `Some(Value::Null)` = known property without a value.
    fn property(&self, name: &str) -> Option<Value>;
    /// Payload attribute at `path` below `tab.user_data` (unquoted segments
    /// lower-cased; empty path = the payload itself). `Value::Null` if absent.
    fn user_data(&self, path: &[String]) -> Value;
    /// JMS user property; `name` keeps the spelling of the condition (implement
    /// as: exact match first, then case-insensitive). `Value::Null` if absent.
    fn user_property(&self, name: &str) -> Value;
    /// [`ConditionContext::user_data`], or `Err(length)` when its text would be longer
    /// than `max_bytes`; a context that knows the length beforehand need not build it.
    fn user_data_within(&self, path: &[String], max_bytes: usize) -> Result<Value, usize> {
        match self.user_data(path) {
            Value::Text(s) if s.len() > max_bytes => Err(s.len()),
            v => Ok(v),
        }
    }
}

/// A parsed, validated condition. Cheap to evaluate repeatedly.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    root: Node,
    text: String,
}

impl Condition {
    /// Parses and validates `text` (at most [`MAX_CONDITION_CHARS`] characters).
    pub fn parse(text: &str) -> Result<Condition, ConditionError> {
        let (root, kind) = parse_text(text, Lang::Condition)?;
        if kind == Kind::Scalar {
            return Err(ConditionError::Parse("a condition must be a boolean expression, not a value".into()));
        }
        Ok(Condition { root, text: text.to_string() })
    }

    /// The text the condition was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Evaluates the condition for one message within the default [`Limits`]. UNKNOWN
    /// (SQL NULL) is `false`, and so is an evaluation over the budget (callers that must
    /// tell use [`Condition::eval_within`]).
    pub fn eval(&self, ctx: &dyn ConditionContext) -> bool {
        self.eval_within(ctx, &mut Budget::of(Limits::default())).unwrap_or(false)
    }

    /// Evaluates the condition for one message, every step charged to `budget`. UNKNOWN
    /// (SQL NULL) is `false`; over the budget, the evaluation stops with why.
    pub fn eval_within(&self, ctx: &dyn ConditionContext, budget: &mut Budget) -> Result<bool, OverBudget> {
        match eval(&self.root, ctx, false, budget) {
            Ok(v) => Ok(matches!(v, Value::Bool(true))),
            Err(Fail::Over(o)) => Err(o),
            Err(Fail::Error(_)) => Ok(false),
        }
    }

    /// Every name the condition refers to, in order of appearance (so that a caller who
    /// knows the queue can refuse names that cannot mean anything there).
    pub fn names(&self) -> Vec<NameRef<'_>> {
        let mut out = Vec::new();
        self.root.visit(&mut |n| match n {
            Node::Name { prop, original } => out.push(NameRef::Bare { prop, original }),
            Node::Prop(p) => out.push(NameRef::Column(p)),
            Node::UserProp(p) => out.push(NameRef::UserProperty(p)),
            Node::UserData(path) => out.push(NameRef::UserData(path)),
            _ => {}
        });
        out
    }

    /// Whether evaluation may read the payload (`tab.user_data...`); when `false`
    /// the caller can skip decoding it.
    pub fn references_user_data(&self) -> bool {
        self.root.references_user_data()
    }
}

/// Gates 1 to 4 for `text` in language `lang`.
fn parse_text(text: &str, lang: Lang) -> Result<(Node, Kind), ConditionError> {
    if text.chars().count() > MAX_CONDITION_CHARS {
        return Err(ConditionError::TooLong);
    }
    let dialect = ConditionDialect { lang, ..ConditionDialect::default() };
    let tokens =
        Tokenizer::new(&dialect, text).tokenize_with_location().map_err(|e| ConditionError::Parse(e.to_string()))?;
    prescan(&tokens)?;
    let significant = tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF)).count();
    if significant == 0 {
        return Err(ConditionError::Parse("empty condition".into()));
    }
    if significant <= INLINE_MAX_TOKENS {
        return parse_tokens(tokens, lang);
    }
    // Longer input may recurse deeper than a small thread stack allows (debug
    // builds): parse on a big stack.
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("condition-parser".into())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(scope, move || parse_tokens(tokens, lang))
            .map_err(|e| ConditionError::Parse(format!("cannot start parser: {e}")))?;
        handle.join().unwrap_or_else(|_| Err(ConditionError::Parse("internal parser failure".into())))
    })
}

impl std::str::FromStr for Condition {
    type Err = ConditionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Condition::parse(s)
    }
}

pub use self::expression::*;

mod expression;
#[cfg(test)]
mod tests;
