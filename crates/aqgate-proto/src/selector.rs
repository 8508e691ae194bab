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
//!    plain Rust over [`Value`]s supplied by a [`ConditionContext`].
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

use std::cell::RefCell;
use std::cmp::Ordering;

use sqlparser::ast::{
    BinaryOperator, Expr as SqlExpr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments,
    Ident, ObjectName, TrimWhereField, UnaryOperator, Value as SqlValue, ValueWithSpan,
};
use sqlparser::dialect::{Dialect, Precedence};
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Span, Token, TokenWithSpan, Tokenizer, Word};

use crate::value::Value;

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
}

/// A parsed, validated condition. Cheap to evaluate repeatedly.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    root: Node,
}

impl Condition {
    /// Parses and validates `text` (at most [`MAX_CONDITION_CHARS`] characters).
    pub fn parse(text: &str) -> Result<Condition, ConditionError> {
        if text.chars().count() > MAX_CONDITION_CHARS {
            return Err(ConditionError::TooLong);
        }
        let dialect = ConditionDialect::default();
        let tokens = Tokenizer::new(&dialect, text)
            .tokenize_with_location()
            .map_err(|e| ConditionError::Parse(e.to_string()))?;
        prescan(&tokens)?;
        let significant = tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF)).count();
        if significant == 0 {
            return Err(ConditionError::Parse("empty condition".into()));
        }
        if significant <= INLINE_MAX_TOKENS {
            return parse_tokens(tokens);
        }
        // Longer input may recurse deeper than a small thread stack allows (debug
        // builds): parse on a big stack.
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("condition-parser".into())
                .stack_size(PARSER_STACK_BYTES)
                .spawn_scoped(scope, move || parse_tokens(tokens))
                .map_err(|e| ConditionError::Parse(format!("cannot start parser: {e}")))?;
            handle.join().unwrap_or_else(|_| Err(ConditionError::Parse("internal parser failure".into())))
        })
    }

    /// Evaluates the condition for one message. UNKNOWN (SQL NULL) is `false`.
    pub fn eval(&self, ctx: &dyn ConditionContext) -> bool {
        matches!(eval(&self.root, ctx), Value::Bool(true))
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

impl std::str::FromStr for Condition {
    type Err = ConditionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Condition::parse(s)
    }
}

// ---------------------------------------------------------------------------
// Our AST
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Lit(Value),
    /// Bare identifier: property `prop` (canonical lower-case), else JMS user
    /// property `original`.
    Name {
        prop: String,
        original: String,
    },
    /// `tab.<column>`: message property only.
    Prop(String),
    /// Quoted identifier: JMS user property, exact spelling.
    UserProp(String),
    /// `tab.user_data.<path>`.
    UserData(Vec<String>),
    Not(Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    Cmp(CmpOp, Box<Node>, Box<Node>),
    IsNull {
        expr: Box<Node>,
        negated: bool,
    },
    Between {
        expr: Box<Node>,
        low: Box<Node>,
        high: Box<Node>,
        negated: bool,
    },
    In {
        expr: Box<Node>,
        list: Vec<Value>,
        negated: bool,
    },
    Like {
        expr: Box<Node>,
        pattern: LikePattern,
        negated: bool,
    },
    Arith(ArithOp, Box<Node>, Box<Node>),
    Neg(Box<Node>),
    Concat(Box<Node>, Box<Node>),
    Call(Func, Vec<Node>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum TrimSide {
    Both,
    Leading,
    Trailing,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Func {
    Upper,
    Lower,
    Length,
    Substr,
    /// args: `[string]` or `[string, trim_char]`
    Trim(TrimSide),
    Nvl,
    Abs,
    Round,
}

#[derive(Debug, Clone, PartialEq)]
enum LikePattern {
    /// Literal pattern, compiled (and validated) at parse time.
    Static(Vec<LikeTok>),
    /// Pattern computed per message; an invalid pattern yields UNKNOWN.
    Dynamic { pattern: Box<Node>, escape: Option<char> },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum LikeTok {
    Many,
    One,
    Lit(char),
}

impl Node {
    /// Calls `f` on this node and every node below it.
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Node)) {
        f(self);
        match self {
            Node::Lit(_) | Node::Name { .. } | Node::Prop(_) | Node::UserProp(_) | Node::UserData(_) => {}
            Node::Not(e) | Node::Neg(e) | Node::IsNull { expr: e, .. } | Node::In { expr: e, .. } => e.visit(f),
            Node::And(v) | Node::Or(v) | Node::Call(_, v) => v.iter().for_each(|n| n.visit(f)),
            Node::Cmp(_, a, b) | Node::Arith(_, a, b) | Node::Concat(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Node::Between { expr, low, high, .. } => {
                expr.visit(f);
                low.visit(f);
                high.visit(f);
            }
            Node::Like { expr, pattern, .. } => {
                expr.visit(f);
                if let LikePattern::Dynamic { pattern, .. } = pattern {
                    pattern.visit(f);
                }
            }
        }
    }

    fn references_user_data(&self) -> bool {
        let mut found = false;
        self.visit(&mut |n| found |= matches!(n, Node::UserData(_)));
        found
    }
}

/// A name a condition refers to (see [`Condition::names`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRef<'a> {
    /// A bare identifier: the message property `prop` (lower-case) if there is one, else
    /// the JMS user property `original`.
    Bare { prop: &'a str, original: &'a str },
    /// `tab.<column>`: a message property.
    Column(&'a str),
    /// A quoted identifier: a JMS user property.
    UserProperty(&'a str),
    /// `tab.user_data.<path>`.
    UserData(&'a [String]),
}

// ---------------------------------------------------------------------------
// Gate 2: token allowlist
// ---------------------------------------------------------------------------

fn prescan(tokens: &[TokenWithSpan]) -> Result<(), ConditionError> {
    let mut depth = 0usize;
    for t in tokens {
        match &t.token {
            Token::LParen => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(ConditionError::TooDeep);
                }
            }
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Word(w) if w.quote_style.is_none() => {
                let upper = w.value.to_ascii_uppercase();
                if upper == "SELECT" || upper == "WITH" {
                    return Err(ConditionError::Unsupported(format!("subquery (`{}`)", w.value)));
                }
            }
            Token::Whitespace(_)
            | Token::Word(_)
            | Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::Comma
            | Token::Period
            | Token::Eq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::StringConcat
            | Token::EOF => {}
            Token::SemiColon => {
                return Err(ConditionError::Unsupported("`;` (statement separator)".into()));
            }
            Token::Placeholder(p) => {
                return Err(ConditionError::Unsupported(format!("bind placeholder `{p}`")));
            }
            other => {
                return Err(ConditionError::Unsupported(format!("token `{}`", truncate(&other.to_string(), 40))));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Gate 3: sqlparser with a prefix hook that owns words and parentheses
// ---------------------------------------------------------------------------

/// Words that start constructs we do not support (or Oracle pseudo-columns that
/// would otherwise silently become absent JMS properties).
const REJECTED_WORDS: &[&str] = &[
    "ALL",
    "AND",
    "ANY",
    "ARRAY",
    "BETWEEN",
    "CASE",
    "CAST",
    "COLLATE",
    "CONNECT_BY_ROOT",
    "CONVERT",
    "CURRENT_CATALOG",
    "CURRENT_DATE",
    "CURRENT_TIME",
    "CURRENT_TIMESTAMP",
    "CURRENT_USER",
    "DATE",
    "DEFAULT",
    "DISTINCT",
    "ESCAPE",
    "EXCEPT",
    "EXISTS",
    "EXTRACT",
    "FLOOR",
    "CEIL",
    "FROM",
    "IN",
    "INTERSECT",
    "INTERVAL",
    "IS",
    "LEVEL",
    "LIKE",
    "LOCALTIME",
    "LOCALTIMESTAMP",
    "MAP",
    "MINUS",
    "OR",
    "OVERLAY",
    "POSITION",
    "PRIOR",
    "ROW",
    "ROWID",
    "ROWNUM",
    "SAFE_CAST",
    "SESSION_USER",
    "SOME",
    "STRUCT",
    "SUBSTRING",
    "SYSDATE",
    "SYSTIMESTAMP",
    "TIME",
    "TIMESTAMP",
    "TRY_CAST",
    "TRY_CONVERT",
    "UID",
    "UNION",
    "UNIQUE",
    "USER",
    "VALUES",
    "WHERE",
];

const FUNCTIONS: &[&str] = &["UPPER", "LOWER", "LENGTH", "SUBSTR", "TRIM", "NVL", "ABS", "ROUND"];

/// Oracle-like identifier rules (`"` quotes only, no backslash escapes), plus a
/// prefix hook; records the reason when it rejects a construct.
#[derive(Debug, Default)]
struct ConditionDialect {
    unsupported: RefCell<Option<String>>,
}

impl ConditionDialect {
    fn reject(&self, what: String) -> ParserError {
        let msg = format!("unsupported: {what}");
        *self.unsupported.borrow_mut() = Some(what);
        ParserError::ParserError(msg)
    }

    fn parse_word(&self, parser: &mut Parser, w: Word) -> Result<SqlExpr, ParserError> {
        let upper = w.value.to_ascii_uppercase();
        let followed_by_paren = matches!(parser.peek_tokens::<2>(), [_, Token::LParen]);
        if w.quote_style.is_none() {
            match upper.as_str() {
                "NOT" => {
                    parser.next_token();
                    if parser.peek_keyword(Keyword::EXISTS) {
                        return Err(self.reject("EXISTS subquery".into()));
                    }
                    let expr = parser.parse_subexpr(self.prec_value(Precedence::UnaryNot))?;
                    return Ok(SqlExpr::UnaryOp { op: UnaryOperator::Not, expr: Box::new(expr) });
                }
                "TRUE" | "FALSE" | "NULL" => {
                    parser.next_token();
                    let v = match upper.as_str() {
                        "TRUE" => SqlValue::Boolean(true),
                        "FALSE" => SqlValue::Boolean(false),
                        _ => SqlValue::Null,
                    };
                    return Ok(SqlExpr::Value(v.with_empty_span()));
                }
                "TRIM" if followed_by_paren => return self.parse_trim(parser),
                _ if REJECTED_WORDS.contains(&upper.as_str()) => {
                    return Err(self.reject(format!("`{}`", w.value)));
                }
                _ => {}
            }
        }
        // (dotted) identifier
        parser.next_token();
        let mut parts = vec![word_ident(w)];
        while let [Token::Period, Token::Word(next)] = parser.peek_tokens::<2>() {
            parser.next_token();
            parser.next_token();
            parts.push(word_ident(next));
        }
        if parser.peek_token().token == Token::LParen {
            let is_allowed = parts.len() == 1
                && parts.iter().all(|p| p.quote_style.is_none())
                && FUNCTIONS.contains(&upper.as_str());
            if !is_allowed {
                let name: Vec<&str> = parts.iter().map(|p| p.value.as_str()).collect();
                return Err(self.reject(format!("function call `{}(...)`", name.join("."))));
            }
            return self.parse_call(parser, parts);
        }
        Ok(match parts.len() {
            1 => match parts.pop() {
                Some(ident) => SqlExpr::Identifier(ident),
                None => return Err(ParserError::ParserError("empty identifier".into())),
            },
            _ => SqlExpr::CompoundIdentifier(parts),
        })
    }

    fn parse_call(&self, parser: &mut Parser, name: Vec<Ident>) -> Result<SqlExpr, ParserError> {
        parser.expect_token(&Token::LParen)?;
        let mut args = Vec::new();
        if !parser.consume_token(&Token::RParen) {
            loop {
                let e = parser.parse_expr()?;
                args.push(FunctionArg::Unnamed(FunctionArgExpr::Expr(e)));
                if !parser.consume_token(&Token::Comma) {
                    parser.expect_token(&Token::RParen)?;
                    break;
                }
            }
        }
        Ok(SqlExpr::Function(Function {
            name: ObjectName::from(name),
            uses_odbc_syntax: false,
            parameters: FunctionArguments::None,
            args: FunctionArguments::List(FunctionArgumentList { duplicate_treatment: None, args, clauses: vec![] }),
            filter: None,
            null_treatment: None,
            over: None,
            within_group: vec![],
        }))
    }

    /// `TRIM([LEADING|TRAILING|BOTH] [c FROM] s)` / `TRIM([LEADING|...] FROM s)`.
    fn parse_trim(&self, parser: &mut Parser) -> Result<SqlExpr, ParserError> {
        parser.next_token(); // TRIM
        parser.expect_token(&Token::LParen)?;
        let trim_where = if parser.parse_keyword(Keyword::LEADING) {
            Some(TrimWhereField::Leading)
        } else if parser.parse_keyword(Keyword::TRAILING) {
            Some(TrimWhereField::Trailing)
        } else if parser.parse_keyword(Keyword::BOTH) {
            Some(TrimWhereField::Both)
        } else {
            None
        };
        let (trim_what, expr) = if trim_where.is_some() && parser.parse_keyword(Keyword::FROM) {
            (None, parser.parse_expr()?)
        } else {
            let first = parser.parse_expr()?;
            if parser.parse_keyword(Keyword::FROM) {
                (Some(Box::new(first)), parser.parse_expr()?)
            } else if trim_where.is_some() {
                return Err(ParserError::ParserError("TRIM(LEADING|TRAILING|BOTH ...) requires FROM".into()));
            } else {
                (None, first)
            }
        };
        parser.expect_token(&Token::RParen)?;
        Ok(SqlExpr::Trim { expr: Box::new(expr), trim_where, trim_what, trim_characters: None })
    }

    fn parse_paren(&self, parser: &mut Parser) -> Result<SqlExpr, ParserError> {
        parser.next_token();
        let inner = parser.parse_expr()?;
        parser.expect_token(&Token::RParen)?;
        Ok(SqlExpr::Nested(Box::new(inner)))
    }
}

fn word_ident(w: Word) -> Ident {
    Ident { value: w.value, quote_style: w.quote_style, span: Span::empty() }
}

impl Dialect for ConditionDialect {
    fn is_identifier_start(&self, ch: char) -> bool {
        ch.is_alphabetic() || ch == '_'
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        ch.is_alphanumeric() || ch == '_' || ch == '$' || ch == '#'
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        ch == '"'
    }

    fn parse_prefix(&self, parser: &mut Parser) -> Option<Result<SqlExpr, ParserError>> {
        match parser.peek_token().token {
            Token::Word(w) => Some(self.parse_word(parser, w)),
            Token::LParen => Some(self.parse_paren(parser)),
            // numbers, strings, unary +/-, and syntax errors: stock parser (no
            // backtracking on these paths)
            _ => None,
        }
    }
}

/// Runs on the parser thread: sqlparser parse + conversion (both recursive).
fn parse_tokens(tokens: Vec<TokenWithSpan>) -> Result<Condition, ConditionError> {
    let dialect = ConditionDialect::default();
    let mut parser =
        Parser::new(&dialect).with_recursion_limit(PARSER_RECURSION_LIMIT).with_tokens_with_locations(tokens);
    let parsed = parser.parse_expr();
    if let Some(what) = dialect.unsupported.borrow_mut().take() {
        return Err(ConditionError::Unsupported(what));
    }
    let expr = match parsed {
        Ok(e) => e,
        Err(ParserError::RecursionLimitExceeded) => return Err(ConditionError::TooDeep),
        Err(e) => return Err(ConditionError::Parse(strip_prefix(e.to_string()))),
    };
    let next = parser.peek_token();
    if next.token != Token::EOF {
        return Err(ConditionError::Parse(format!(
            "unexpected `{}` after the end of the expression{}",
            truncate(&next.token.to_string(), 40),
            next.span.start
        )));
    }
    let (root, kind) = convert(&expr, 0)?;
    if kind == Kind::Scalar {
        return Err(ConditionError::Parse("a condition must be a boolean expression, not a value".into()));
    }
    Ok(Condition { root })
}

fn strip_prefix(msg: String) -> String {
    match msg.strip_prefix("sql parser error: ") {
        Some(rest) => rest.to_string(),
        None => msg,
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

// ---------------------------------------------------------------------------
// Gate 4: sqlparser AST -> our AST (allowlist)
// ---------------------------------------------------------------------------

/// Static kind, used to reject `1 AND 2` or `(a = 1) + 1` at parse time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A truth value (comparison, logic, predicate).
    Bool,
    /// A number/text value (arithmetic, literals, most functions).
    Scalar,
    /// Could be either (names, NULL, TRUE/FALSE, NVL).
    Any,
}

type Conv = Result<(Node, Kind), ConditionError>;

fn unsupported<T>(what: &str, e: &SqlExpr) -> Result<T, ConditionError> {
    Err(ConditionError::Unsupported(format!("{what} (`{}`)", truncate(&e.to_string(), 60))))
}

fn boolean(e: &SqlExpr, depth: usize) -> Result<Node, ConditionError> {
    let (n, k) = convert(e, depth)?;
    if k == Kind::Scalar {
        return Err(ConditionError::Parse(format!(
            "expected a condition, found a value: `{}`",
            truncate(&e.to_string(), 60)
        )));
    }
    Ok(n)
}

fn scalar(e: &SqlExpr, depth: usize) -> Result<Box<Node>, ConditionError> {
    let (n, k) = convert(e, depth)?;
    if k == Kind::Bool {
        return Err(ConditionError::Unsupported(format!(
            "a condition used as a value: `{}`",
            truncate(&e.to_string(), 60)
        )));
    }
    Ok(Box::new(n))
}

fn convert(e: &SqlExpr, depth: usize) -> Conv {
    if depth > MAX_DEPTH {
        return Err(ConditionError::TooDeep);
    }
    let d = depth + 1;
    Ok(match e {
        SqlExpr::Nested(inner) => convert(inner, d)?,
        SqlExpr::Value(v) => {
            let lit = literal(&v.value, e)?;
            let kind = if matches!(lit, Value::Number(_) | Value::Text(_)) { Kind::Scalar } else { Kind::Any };
            (Node::Lit(lit), kind)
        }
        SqlExpr::Identifier(id) => (name_node(id), Kind::Any),
        SqlExpr::CompoundIdentifier(parts) => (compound_node(parts, e)?, Kind::Any),
        SqlExpr::UnaryOp { op, expr } => match op {
            UnaryOperator::Not => (Node::Not(Box::new(boolean(expr, d)?)), Kind::Bool),
            UnaryOperator::Minus => match *scalar(expr, d)? {
                Node::Lit(Value::Number(x)) => (Node::Lit(Value::Number(-x)), Kind::Scalar),
                other => (Node::Neg(Box::new(other)), Kind::Scalar),
            },
            UnaryOperator::Plus => {
                let n = scalar(expr, d)?;
                (Node::Arith(ArithOp::Add, Box::new(Node::Lit(Value::Number(0.0))), n), Kind::Scalar)
            }
            _ => return unsupported(&format!("operator `{op}`"), e),
        },
        SqlExpr::BinaryOp { op: op @ (BinaryOperator::And | BinaryOperator::Or), .. } => {
            // Flatten left-deep chains iteratively: `a OR b OR c ...` of any
            // length counts as one nesting level.
            let mut rights = Vec::new();
            let mut cur = e;
            while let SqlExpr::BinaryOp { left, op: o, right } = cur {
                if o != op {
                    break;
                }
                rights.push(right.as_ref());
                cur = left.as_ref();
            }
            let mut items = Vec::with_capacity(rights.len() + 1);
            items.push(boolean(cur, d)?);
            for r in rights.into_iter().rev() {
                items.push(boolean(r, d)?);
            }
            let node = if *op == BinaryOperator::And { Node::And(items) } else { Node::Or(items) };
            (node, Kind::Bool)
        }
        SqlExpr::BinaryOp { left, op, right } => {
            let cmp = match op {
                BinaryOperator::Eq => Some(CmpOp::Eq),
                BinaryOperator::NotEq => Some(CmpOp::Ne),
                BinaryOperator::Lt => Some(CmpOp::Lt),
                BinaryOperator::LtEq => Some(CmpOp::Le),
                BinaryOperator::Gt => Some(CmpOp::Gt),
                BinaryOperator::GtEq => Some(CmpOp::Ge),
                _ => None,
            };
            let arith = match op {
                BinaryOperator::Plus => Some(ArithOp::Add),
                BinaryOperator::Minus => Some(ArithOp::Sub),
                BinaryOperator::Multiply => Some(ArithOp::Mul),
                BinaryOperator::Divide => Some(ArithOp::Div),
                _ => None,
            };
            if let Some(c) = cmp {
                (Node::Cmp(c, scalar(left, d)?, scalar(right, d)?), Kind::Bool)
            } else if let Some(a) = arith {
                (Node::Arith(a, scalar(left, d)?, scalar(right, d)?), Kind::Scalar)
            } else if *op == BinaryOperator::StringConcat {
                (Node::Concat(scalar(left, d)?, scalar(right, d)?), Kind::Scalar)
            } else {
                return unsupported(&format!("operator `{op}`"), e);
            }
        }
        SqlExpr::IsNull(x) => (Node::IsNull { expr: scalar(x, d)?, negated: false }, Kind::Bool),
        SqlExpr::IsNotNull(x) => (Node::IsNull { expr: scalar(x, d)?, negated: true }, Kind::Bool),
        SqlExpr::Between { expr, negated, low, high } => (
            Node::Between { expr: scalar(expr, d)?, low: scalar(low, d)?, high: scalar(high, d)?, negated: *negated },
            Kind::Bool,
        ),
        SqlExpr::InList { expr, list, negated } => {
            let mut values = Vec::with_capacity(list.len());
            for item in list {
                values.push(in_list_literal(item)?);
            }
            (Node::In { expr: scalar(expr, d)?, list: values, negated: *negated }, Kind::Bool)
        }
        SqlExpr::Like { negated, any, expr, pattern, escape_char } => {
            if *any {
                return unsupported("LIKE ANY", e);
            }
            let escape = match escape_char {
                None => None,
                Some(s) => {
                    let mut chars = s.chars();
                    match (chars.next(), chars.next()) {
                        (Some(c), None) => Some(c),
                        _ => {
                            return Err(ConditionError::Parse(format!("ESCAPE must be a single character, got '{s}'")));
                        }
                    }
                }
            };
            let pattern_node = scalar(pattern, d)?;
            let pattern = match *pattern_node {
                Node::Lit(Value::Text(p)) => {
                    LikePattern::Static(compile_like(&p, escape).map_err(ConditionError::Parse)?)
                }
                Node::Lit(Value::Number(n)) => {
                    LikePattern::Static(compile_like(&fmt_num(n), escape).map_err(ConditionError::Parse)?)
                }
                other => LikePattern::Dynamic { pattern: Box::new(other), escape },
            };
            (Node::Like { expr: scalar(expr, d)?, pattern, negated: *negated }, Kind::Bool)
        }
        SqlExpr::Function(f) => convert_function(f, e, d)?,
        SqlExpr::Trim { expr, trim_where, trim_what, trim_characters } => {
            if trim_characters.is_some() {
                return unsupported("TRIM with a character list", e);
            }
            let side = match trim_where {
                None | Some(TrimWhereField::Both) => TrimSide::Both,
                Some(TrimWhereField::Leading) => TrimSide::Leading,
                Some(TrimWhereField::Trailing) => TrimSide::Trailing,
            };
            let mut args = vec![*scalar(expr, d)?];
            if let Some(what) = trim_what {
                let w = scalar(what, d)?;
                if let Node::Lit(Value::Text(t)) = w.as_ref()
                    && t.chars().count() != 1
                {
                    return Err(ConditionError::Parse("TRIM character must be a single character".into()));
                }
                args.push(*w);
            }
            (Node::Call(Func::Trim(side), args), Kind::Scalar)
        }
        other => return unsupported(describe(other), e),
    })
}

fn describe(e: &SqlExpr) -> &'static str {
    match e {
        SqlExpr::Subquery(_) | SqlExpr::InSubquery { .. } => "subquery",
        SqlExpr::Exists { .. } => "EXISTS",
        SqlExpr::Case { .. } => "CASE expression",
        SqlExpr::Cast { .. } | SqlExpr::Convert { .. } => "type conversion",
        SqlExpr::ILike { .. } => "ILIKE",
        SqlExpr::SimilarTo { .. } => "SIMILAR TO",
        SqlExpr::RLike { .. } => "REGEXP/RLIKE",
        SqlExpr::AnyOp { .. } | SqlExpr::AllOp { .. } => "ANY/ALL comparison",
        SqlExpr::IsTrue(_)
        | SqlExpr::IsNotTrue(_)
        | SqlExpr::IsFalse(_)
        | SqlExpr::IsNotFalse(_)
        | SqlExpr::IsUnknown(_)
        | SqlExpr::IsNotUnknown(_) => "IS [NOT] TRUE/FALSE/UNKNOWN",
        SqlExpr::IsDistinctFrom(..) | SqlExpr::IsNotDistinctFrom(..) => "IS [NOT] DISTINCT FROM",
        SqlExpr::Collate { .. } => "COLLATE",
        SqlExpr::AtTimeZone { .. } => "AT TIME ZONE",
        SqlExpr::Interval(_) => "INTERVAL",
        SqlExpr::TypedString { .. } | SqlExpr::IntroducedString { .. } => "typed literal",
        SqlExpr::Tuple(_) => "tuple",
        SqlExpr::CompoundFieldAccess { .. } | SqlExpr::JsonAccess { .. } => "field or element access",
        SqlExpr::Substring { .. } => "SUBSTRING (use SUBSTR)",
        _ => "expression",
    }
}

fn literal(v: &SqlValue, e: &SqlExpr) -> Result<Value, ConditionError> {
    Ok(match v {
        SqlValue::Number(s, false) => match parse_number(s) {
            Some(n) => Value::Number(n),
            None => return Err(ConditionError::Parse(format!("invalid number literal `{s}`"))),
        },
        SqlValue::SingleQuotedString(s) | SqlValue::NationalStringLiteral(s) => norm(Value::Text(s.clone())),
        SqlValue::Boolean(b) => Value::Bool(*b),
        SqlValue::Null => Value::Null,
        SqlValue::Placeholder(_) => return unsupported("bind placeholder", e),
        _ => return unsupported("literal kind", e),
    })
}

fn in_list_literal(item: &SqlExpr) -> Result<Value, ConditionError> {
    match item {
        SqlExpr::Value(ValueWithSpan { value, .. }) => literal(value, item),
        SqlExpr::Nested(inner) => in_list_literal(inner),
        SqlExpr::UnaryOp { op: op @ (UnaryOperator::Minus | UnaryOperator::Plus), expr } => match expr.as_ref() {
            SqlExpr::Value(ValueWithSpan { value: v @ SqlValue::Number(..), .. }) => match literal(v, item)? {
                Value::Number(n) if *op == UnaryOperator::Minus => Ok(Value::Number(-n)),
                other => Ok(other),
            },
            _ => unsupported("IN list element that is not a literal", item),
        },
        _ => unsupported("IN list element that is not a literal", item),
    }
}

const PROPERTY_ALIASES: &[(&str, &str)] =
    &[("correlation", "corrid"), ("msg_state", "state"), ("delivery_count", "retry_count")];

fn canonical_property(lower: String) -> String {
    for (alias, canon) in PROPERTY_ALIASES {
        if lower == *alias {
            return (*canon).to_string();
        }
    }
    lower
}

fn name_node(id: &Ident) -> Node {
    if id.quote_style.is_some() {
        Node::UserProp(id.value.clone())
    } else {
        Node::Name { prop: canonical_property(id.value.to_lowercase()), original: id.value.clone() }
    }
}

fn path_segment(id: &Ident) -> String {
    if id.quote_style.is_some() { id.value.clone() } else { id.value.to_lowercase() }
}

fn compound_node(parts: &[Ident], e: &SqlExpr) -> Result<Node, ConditionError> {
    match parts {
        [tab, rest @ ..] if tab.value.eq_ignore_ascii_case("tab") => match rest {
            [ud, path @ ..] if ud.value.eq_ignore_ascii_case("user_data") => {
                Ok(Node::UserData(path.iter().map(path_segment).collect()))
            }
            [column] => Ok(Node::Prop(canonical_property(column.value.to_lowercase()))),
            _ => unsupported("qualified name (only tab.user_data.<attribute> and tab.<column>)", e),
        },
        _ => unsupported("qualified name (only tab.user_data.<attribute> and tab.<column>)", e),
    }
}

fn convert_function(f: &Function, e: &SqlExpr, d: usize) -> Conv {
    let name = match f.name.0.as_slice() {
        [part] => match part.as_ident() {
            Some(id) if id.quote_style.is_none() => id.value.to_ascii_uppercase(),
            _ => return unsupported("function call", e),
        },
        _ => return unsupported("function call", e),
    };
    let list = match &f.args {
        FunctionArguments::List(list)
            if list.duplicate_treatment.is_none()
                && list.clauses.is_empty()
                && matches!(f.parameters, FunctionArguments::None)
                && f.filter.is_none()
                && f.null_treatment.is_none()
                && f.over.is_none()
                && f.within_group.is_empty()
                && !f.uses_odbc_syntax =>
        {
            list
        }
        _ => return unsupported("function call form", e),
    };
    let mut args = Vec::with_capacity(list.args.len());
    for a in &list.args {
        match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => args.push(*scalar(x, d)?),
            _ => return unsupported("function argument form", e),
        }
    }
    let (func, min, max, kind) = match name.as_str() {
        "UPPER" => (Func::Upper, 1, 1, Kind::Scalar),
        "LOWER" => (Func::Lower, 1, 1, Kind::Scalar),
        "LENGTH" => (Func::Length, 1, 1, Kind::Scalar),
        "SUBSTR" => (Func::Substr, 2, 3, Kind::Scalar),
        "TRIM" => (Func::Trim(TrimSide::Both), 1, 1, Kind::Scalar),
        "NVL" => (Func::Nvl, 2, 2, Kind::Any),
        "ABS" => (Func::Abs, 1, 1, Kind::Scalar),
        "ROUND" => (Func::Round, 1, 2, Kind::Scalar),
        _ => return unsupported("function", e),
    };
    if args.len() < min || args.len() > max {
        let expected = if min == max { format!("{min}") } else { format!("{min} to {max}") };
        return Err(ConditionError::Parse(format!("{name} expects {expected} argument(s), got {}", args.len())));
    }
    Ok((Node::Call(func, args), kind))
}

// ---------------------------------------------------------------------------
// LIKE
// ---------------------------------------------------------------------------

fn compile_like(pattern: &str, escape: Option<char>) -> Result<Vec<LikeTok>, String> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if Some(c) == escape {
            match chars.next() {
                Some(n) if n == '%' || n == '_' || Some(n) == escape => out.push(LikeTok::Lit(n)),
                Some(n) => {
                    return Err(format!("invalid escape sequence `{c}{n}` in LIKE pattern"));
                }
                None => return Err("LIKE pattern ends with the escape character".into()),
            }
        } else {
            out.push(match c {
                '%' => LikeTok::Many,
                '_' => LikeTok::One,
                c => LikeTok::Lit(c),
            });
        }
    }
    Ok(out)
}

/// Classic wildcard matching with single backtrack point: O(text × pattern)
/// worst case, no recursion.
fn like_match(text: &[char], pat: &[LikeTok]) -> bool {
    let (mut t, mut p) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while let Some(&tc) = text.get(t) {
        match pat.get(p) {
            Some(LikeTok::Many) => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(LikeTok::One) => {
                t += 1;
                p += 1;
                continue;
            }
            Some(LikeTok::Lit(c)) if *c == tc => {
                t += 1;
                p += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while pat.get(p) == Some(&LikeTok::Many) {
        p += 1;
    }
    p == pat.len()
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

/// Oracle: the empty string is NULL.
fn norm(v: Value) -> Value {
    match v {
        Value::Text(s) if s.is_empty() => Value::Null,
        Value::Number(n) if n.is_nan() => Value::Null,
        v => v,
    }
}

fn truth(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

fn tri(b: Option<bool>) -> Value {
    b.map_or(Value::Null, Value::Bool)
}

/// Strict numeric syntax (Oracle TO_NUMBER-like): `[+-]digits[.digits][e[+-]digits]`,
/// surrounding blanks allowed. No `inf`/`NaN`/hex.
fn parse_number(s: &str) -> Option<f64> {
    let s = s.trim();
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let int_start = i;
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    let mut digits = i - int_start;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let frac_start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        digits += i - frac_start;
    }
    if digits == 0 {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp_start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == exp_start {
            return None;
        }
    }
    if i != b.len() {
        return None;
    }
    s.parse::<f64>().ok().filter(|n| n.is_finite())
}

fn to_num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) if n.is_finite() => Some(*n),
        Value::Text(s) => parse_number(s),
        _ => None,
    }
}

fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { format!("{n}") }
}

fn to_text(v: &Value) -> Option<String> {
    match v {
        Value::Text(s) => Some(s.clone()),
        Value::Number(n) if n.is_finite() => Some(fmt_num(*n)),
        _ => None,
    }
}

fn text_value(s: String) -> Value {
    norm(Value::Text(s))
}

fn num_value(n: f64) -> Value {
    if n.is_finite() { Value::Number(n) } else { Value::Null }
}

fn text_to_bool(s: &str) -> Option<bool> {
    if s.trim().eq_ignore_ascii_case("true") {
        Some(true)
    } else if s.trim().eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// SQL comparison; `None` = UNKNOWN.
fn compare(op: CmpOp, a: &Value, b: &Value) -> Option<bool> {
    let ord = match (a, b) {
        (Value::Null, _) | (_, Value::Null) => return None,
        (Value::Number(x), Value::Number(y)) => x.partial_cmp(y)?,
        (Value::Text(x), Value::Text(y)) => x.cmp(y),
        (Value::Number(x), Value::Text(y)) => x.partial_cmp(&parse_number(y)?)?,
        (Value::Text(x), Value::Number(y)) => parse_number(x)?.partial_cmp(y)?,
        (Value::Bool(_), _) | (_, Value::Bool(_)) => {
            let x = match a {
                Value::Bool(x) => *x,
                Value::Text(s) => text_to_bool(s)?,
                _ => return None,
            };
            let y = match b {
                Value::Bool(y) => *y,
                Value::Text(s) => text_to_bool(s)?,
                _ => return None,
            };
            return match op {
                CmpOp::Eq => Some(x == y),
                CmpOp::Ne => Some(x != y),
                _ => None,
            };
        }
    };
    Some(match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Le => ord != Ordering::Greater,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Ge => ord != Ordering::Less,
    })
}

fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn eval(node: &Node, ctx: &dyn ConditionContext) -> Value {
    match node {
        Node::Lit(v) => v.clone(),
        Node::Name { prop, original } => match ctx.property(prop) {
            Some(v) => norm(v),
            None => norm(ctx.user_property(original)),
        },
        Node::Prop(p) => norm(ctx.property(p).unwrap_or(Value::Null)),
        Node::UserProp(p) => norm(ctx.user_property(p)),
        Node::UserData(path) => norm(ctx.user_data(path)),
        Node::Not(e) => tri(truth(&eval(e, ctx)).map(|b| !b)),
        Node::And(items) => {
            let mut unknown = false;
            for i in items {
                match truth(&eval(i, ctx)) {
                    Some(false) => return Value::Bool(false),
                    Some(true) => {}
                    None => unknown = true,
                }
            }
            if unknown { Value::Null } else { Value::Bool(true) }
        }
        Node::Or(items) => {
            let mut unknown = false;
            for i in items {
                match truth(&eval(i, ctx)) {
                    Some(true) => return Value::Bool(true),
                    Some(false) => {}
                    None => unknown = true,
                }
            }
            if unknown { Value::Null } else { Value::Bool(false) }
        }
        Node::Cmp(op, a, b) => tri(compare(*op, &eval(a, ctx), &eval(b, ctx))),
        Node::IsNull { expr, negated } => {
            let is_null = matches!(eval(expr, ctx), Value::Null);
            Value::Bool(is_null != *negated)
        }
        Node::Between { expr, low, high, negated } => {
            let x = eval(expr, ctx);
            let r = and3(compare(CmpOp::Ge, &x, &eval(low, ctx)), compare(CmpOp::Le, &x, &eval(high, ctx)));
            tri(if *negated { r.map(|b| !b) } else { r })
        }
        Node::In { expr, list, negated } => {
            let x = eval(expr, ctx);
            let mut r = Some(false);
            for v in list {
                match compare(CmpOp::Eq, &x, v) {
                    Some(true) => {
                        r = Some(true);
                        break;
                    }
                    Some(false) => {}
                    None => r = None,
                }
            }
            tri(if *negated { r.map(|b| !b) } else { r })
        }
        Node::Like { expr, pattern, negated } => {
            let Some(text) = to_text(&eval(expr, ctx)) else { return Value::Null };
            let chars: Vec<char> = text.chars().collect();
            let matched = match pattern {
                LikePattern::Static(toks) => like_match(&chars, toks),
                LikePattern::Dynamic { pattern, escape } => {
                    let Some(p) = to_text(&eval(pattern, ctx)) else { return Value::Null };
                    match compile_like(&p, *escape) {
                        Ok(toks) => like_match(&chars, &toks),
                        Err(_) => return Value::Null,
                    }
                }
            };
            Value::Bool(matched != *negated)
        }
        Node::Arith(op, a, b) => {
            let (Some(x), Some(y)) = (to_num(&eval(a, ctx)), to_num(&eval(b, ctx))) else {
                return Value::Null;
            };
            match op {
                ArithOp::Add => num_value(x + y),
                ArithOp::Sub => num_value(x - y),
                ArithOp::Mul => num_value(x * y),
                ArithOp::Div if y == 0.0 => Value::Null,
                ArithOp::Div => num_value(x / y),
            }
        }
        Node::Neg(e) => to_num(&eval(e, ctx)).map_or(Value::Null, |n| num_value(-n)),
        Node::Concat(a, b) => {
            let piece = |v: Value| match v {
                Value::Null => Some(String::new()),
                v => to_text(&v),
            };
            match (piece(eval(a, ctx)), piece(eval(b, ctx))) {
                (Some(x), Some(y)) => text_value(x + &y),
                _ => Value::Null,
            }
        }
        Node::Call(func, args) => {
            let vals: Vec<Value> = args.iter().map(|a| eval(a, ctx)).collect();
            call(*func, &vals)
        }
    }
}

/// Oracle-style integer argument (truncated toward zero).
fn int_arg(v: Option<&Value>) -> Option<i64> {
    let n = to_num(v?)?.trunc();
    // `as` saturates; the clamp keeps later arithmetic far from overflow.
    Some((n as i64).clamp(-(1 << 40), 1 << 40))
}

fn call(func: Func, args: &[Value]) -> Value {
    let text0 = || args.first().and_then(to_text);
    match func {
        Func::Upper => text0().map_or(Value::Null, |s| text_value(s.to_uppercase())),
        Func::Lower => text0().map_or(Value::Null, |s| text_value(s.to_lowercase())),
        Func::Length => text0().map_or(Value::Null, |s| Value::Number(s.chars().count() as f64)),
        Func::Substr => {
            let (Some(s), Some(pos)) = (text0(), int_arg(args.get(1))) else { return Value::Null };
            let len = match args.get(2) {
                None => None,
                Some(v) => match int_arg(Some(v)) {
                    Some(l) if l >= 1 => Some(l),
                    _ => return Value::Null,
                },
            };
            let chars: Vec<char> = s.chars().collect();
            let n = chars.len() as i64;
            let start = match pos {
                0 => 0,
                p if p > 0 => p - 1,
                p => n + p,
            };
            if start < 0 || start >= n {
                return Value::Null;
            }
            let end = len.map_or(n, |l| (start + l).min(n));
            let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
                return Value::Null;
            };
            chars.get(start..end).map_or(Value::Null, |c| text_value(c.iter().collect()))
        }
        Func::Trim(side) => {
            let Some(s) = text0() else { return Value::Null };
            let ch = match args.get(1) {
                None => ' ',
                Some(v) => {
                    let Some(t) = to_text(v) else { return Value::Null };
                    let mut it = t.chars();
                    match (it.next(), it.next()) {
                        (Some(c), None) => c,
                        _ => return Value::Null,
                    }
                }
            };
            let out = match side {
                TrimSide::Both => s.trim_matches(ch),
                TrimSide::Leading => s.trim_start_matches(ch),
                TrimSide::Trailing => s.trim_end_matches(ch),
            };
            text_value(out.to_string())
        }
        Func::Nvl => match args.first() {
            Some(Value::Null) | None => args.get(1).cloned().unwrap_or(Value::Null),
            Some(v) => v.clone(),
        },
        Func::Abs => args.first().and_then(to_num).map_or(Value::Null, |n| num_value(n.abs())),
        Func::Round => {
            let Some(n) = args.first().and_then(to_num) else { return Value::Null };
            let places = match args.get(1) {
                None => 0,
                Some(v) => match int_arg(Some(v)) {
                    Some(p) => p.clamp(-400, 400),
                    None => return Value::Null,
                },
            };
            num_value(round_half_away(n, places))
        }
    }
}

/// Oracle ROUND(n, d): half away from zero at `d` decimal places (d may be < 0).
fn round_half_away(n: f64, places: i64) -> f64 {
    if places == 0 {
        return n.round();
    }
    let Ok(p) = i32::try_from(places) else { return n };
    let factor = 10f64.powi(p.abs());
    if !factor.is_finite() {
        return if places > 0 { n } else { 0.0 };
    }
    if places > 0 {
        let r = (n * factor).round() / factor;
        if r.is_finite() { r } else { n }
    } else {
        (n / factor).round() * factor
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    const KNOWN: &[&str] = &[
        "priority",
        "corrid",
        "msgid",
        "enq_time",
        "state",
        "delay",
        "expiration",
        "retry_count",
        "sender_name",
        "sender_address",
        "sender_protocol",
        "exception_queue",
        "consumer_name",
        "q_name",
    ];

    #[derive(Default)]
    struct Ctx {
        props: HashMap<String, Value>,
        data: HashMap<String, Value>,
        user: HashMap<String, Value>,
    }

    impl Ctx {
        fn prop(mut self, k: &str, v: Value) -> Self {
            self.props.insert(k.into(), v);
            self
        }
        fn data(mut self, path: &str, v: Value) -> Self {
            self.data.insert(path.into(), v);
            self
        }
        fn user(mut self, k: &str, v: Value) -> Self {
            self.user.insert(k.into(), v);
            self
        }
    }

    impl ConditionContext for Ctx {
        fn property(&self, name: &str) -> Option<Value> {
            if KNOWN.contains(&name) { Some(self.props.get(name).cloned().unwrap_or(Value::Null)) } else { None }
        }
        fn user_data(&self, path: &[String]) -> Value {
            self.data.get(&path.join(".")).cloned().unwrap_or(Value::Null)
        }
        fn user_property(&self, name: &str) -> Value {
            if let Some(v) = self.user.get(name) {
                return v.clone();
            }
            self.user.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map_or(Value::Null, |(_, v)| v.clone())
        }
    }

    fn t(s: &str) -> Value {
        Value::Text(s.into())
    }
    fn n(x: f64) -> Value {
        Value::Number(x)
    }

    fn std_ctx() -> Ctx {
        Ctx::default()
            .prop("priority", n(3.0))
            .prop("corrid", t("ORD-1001"))
            .prop("msgid", t("4AF3"))
            .prop("state", n(0.0))
            .prop("retry_count", n(2.0))
            .prop("sender_name", t("app1"))
            .prop("q_name", t("NEW_ORDERS_QUE"))
            .prop("enq_time", t("2024-05-01T10:00:00Z"))
            // delay, expiration: known but null
            .data("deptno", t("60"))
            .data("sal", n(1500.5))
            .data("ename", t("  Smith  "))
            .data("orderregion", t("INTERNATIONAL"))
            .data("customer.country", t("USA"))
            .data("customer.address.city", t("Boston"))
            .data("note", t("100% pure_cotton"))
            .data("empty", t(""))
            .data("notnum", t("6O"))
            .data("flag", Value::Bool(true))
            .user("Country", t("USA"))
            .user("Rank", n(7.0))
            .user("vip", Value::Bool(true))
            .user("VipText", t("TRUE"))
            .user("priority", n(99.0)) // shadowed by the message property
    }

    fn check(cond: &str, ctx: &dyn ConditionContext) -> bool {
        match Condition::parse(cond) {
            Ok(c) => c.eval(ctx),
            Err(e) => panic!("{cond:?} failed to parse: {e}"),
        }
    }

    #[test]
    fn table_driven_against_standard_context() {
        let ctx = std_ctx();
        let cases: &[(&str, bool)] = &[
            // reference examples
            ("tab.user_data.deptno=60", true),
            ("tab.user_data.deptno = 61", false),
            ("tab.user_data.orderregion = 'INTERNATIONAL'", true),
            ("TAB.USER_DATA.ORDERREGION = 'INTERNATIONAL'", true),
            ("priority < 5 AND corrid LIKE 'ORD%'", true),
            ("priority < 3 AND corrid LIKE 'ORD%'", false),
            ("tab.user_data.customer.country = 'USA'", true),
            ("tab.user_data.customer.address.city = 'Boston'", true),
            ("tab.user_data.customer.address.zip IS NULL", true),
            ("Country = 'USA'", true),
            ("country = 'USA'", true), // case-insensitive fallback of the context
            ("\"Country\" = 'USA'", true),
            ("\"Country\" = 'usa'", false),
            // property names, aliases, tab.<column>
            ("correlation = 'ORD-1001'", true),
            ("CORRID = 'ORD-1001'", true),
            ("tab.corrid = 'ORD-1001'", true),
            ("tab.priority = 3", true),
            ("msg_state = 0", true),
            ("delivery_count = 2", true),
            ("retry_count >= 2", true),
            ("sender_name = 'app1' AND q_name = 'NEW_ORDERS_QUE'", true),
            ("enq_time > '2024-01-01' AND enq_time < '2025-01-01'", true),
            ("priority = 3", true),      // message property wins over user property
            ("\"priority\" = 99", true), // quoted: always the JMS property
            ("Rank > 5", true),
            ("nosuch IS NULL", true),
            ("delay IS NULL AND expiration IS NULL", true),
            ("delay IS NOT NULL", false),
            // comparisons
            ("priority = 3", true),
            ("priority <> 3", false),
            ("priority != 4", true),
            ("priority < 3", false),
            ("priority <= 3", true),
            ("priority > 2", true),
            ("priority >= 4", false),
            ("'abc' < 'abd'", true),
            ("'B' > 'A'", true),
            ("'a' = 'A'", false),
            ("tab.user_data.deptno = '60'", true),
            ("tab.user_data.deptno > 9", true), // numeric, not text order
            ("tab.user_data.deptno = 60.0", true),
            ("tab.user_data.sal = 1500.5", true),
            ("tab.user_data.sal = '1500.5'", true),
            ("tab.user_data.sal > '2e2'", true),
            ("tab.user_data.notnum = 60", false),
            ("NOT (tab.user_data.notnum = 60)", false), // unknown, not false
            ("tab.user_data.flag = TRUE", true),
            ("vip = TRUE AND vip <> FALSE", true),
            ("VipText = TRUE", true),
            ("vip > FALSE", false), // booleans: only = and <>
            ("TRUE", true),
            ("FALSE", false),
            ("vip", true),
            ("NOT vip", false),
            // AND / OR / NOT / parens
            ("priority = 3 AND corrid = 'ORD-1001'", true),
            ("priority = 3 AND corrid = 'x'", false),
            ("priority = 4 OR corrid = 'ORD-1001'", true),
            ("priority = 4 OR corrid = 'x'", false),
            ("NOT priority = 4", true),
            ("NOT (priority = 3 OR priority = 4)", false),
            ("(priority = 4 OR priority = 3) AND (state = 0)", true),
            ("priority = 4 OR priority = 3 AND state = 1", false), // AND binds tighter
            ("(priority = 4 OR priority = 3) AND state = 1", false),
            ("((((priority = 3))))", true),
            // IS NULL / Oracle empty string
            ("tab.user_data.empty IS NULL", true),
            ("tab.user_data.empty = ''", false),
            ("'' IS NULL", true),
            ("NULL IS NULL", true),
            ("corrid IS NOT NULL", true),
            // BETWEEN
            ("priority BETWEEN 1 AND 5", true),
            ("priority BETWEEN 4 AND 5", false),
            ("priority NOT BETWEEN 4 AND 5", true),
            ("tab.user_data.deptno BETWEEN 50 AND 70", true),
            ("corrid BETWEEN 'ORD' AND 'ORE'", true),
            ("priority BETWEEN 1 AND 5 AND state = 0", true),
            // IN
            ("priority IN (1, 2, 3)", true),
            ("priority IN (1, 2)", false),
            ("priority NOT IN (1, 2)", true),
            ("priority IN (-3, +3)", true),
            ("corrid IN ('a', 'ORD-1001')", true),
            ("tab.user_data.deptno IN (10, 60)", true),
            ("priority IN (1, NULL)", false),
            ("priority IN (3, NULL)", true),
            // LIKE
            ("corrid LIKE 'ORD-____'", true),
            ("corrid LIKE 'ORD-___'", false),
            ("corrid LIKE '%1001'", true),
            ("corrid LIKE '%10%'", true),
            ("corrid LIKE 'ord%'", false),
            ("corrid NOT LIKE 'X%'", true),
            ("corrid LIKE '%'", true),
            ("tab.user_data.note LIKE '100\\% pure\\_%' ESCAPE '\\'", true),
            ("tab.user_data.note LIKE '100!%%' ESCAPE '!'", true),
            ("tab.user_data.note LIKE '100!% pure!_cotton' ESCAPE '!'", true),
            ("tab.user_data.note LIKE '100!%x%' ESCAPE '!'", false),
            ("tab.user_data.note LIKE '%!_%' ESCAPE '!'", true),
            ("'a!b' LIKE 'a!!b' ESCAPE '!'", true),
            ("'aXb' LIKE 'a_b'", true),
            ("'ab' LIKE 'a_b'", false),
            ("'mississippi' LIKE '%iss%ppi'", true),
            ("'mississippi' LIKE 'm%s_s%i'", true),
            ("tab.user_data.deptno LIKE '6%'", true),
            ("priority LIKE '3'", true),
            ("corrid LIKE UPPER('ord') || '%'", true),
            ("corrid LIKE corrid", true),
            // arithmetic
            ("priority + 1 = 4", true),
            ("priority - 1 = 2", true),
            ("priority * 2 = 6", true),
            ("priority / 2 = 1.5", true),
            ("-priority = -3", true),
            ("- -priority = 3", true),
            ("+priority = 3", true),
            ("1 + 2 * 3 = 7", true),
            ("(1 + 2) * 3 = 9", true),
            ("tab.user_data.deptno + 1 = 61", true),
            ("priority / 0 = 1", false),
            ("NOT (priority / 0 = 1)", false),
            ("tab.user_data.notnum + 1 IS NULL", true),
            ("1e2 = 100", true),
            (".5 = 0.5", true),
            // concatenation
            ("corrid || 'x' = 'ORD-1001x'", true),
            ("'a' || NULL = 'a'", true),
            ("'a' || priority = 'a3'", true),
            ("'x' || tab.user_data.sal = 'x1500.5'", true),
            ("NULL || NULL IS NULL", true),
            // functions
            ("UPPER('abc') = 'ABC'", true),
            ("lower(corrid) = 'ord-1001'", true),
            ("LENGTH(corrid) = 8", true),
            ("LENGTH('') IS NULL", true),
            ("SUBSTR(corrid, 1, 3) = 'ORD'", true),
            ("SUBSTR(corrid, 5) = '1001'", true),
            ("SUBSTR(corrid, -4) = '1001'", true),
            ("SUBSTR(corrid, -4, 2) = '10'", true),
            ("SUBSTR(corrid, 0, 3) = 'ORD'", true),
            ("SUBSTR(corrid, 100) IS NULL", true),
            ("SUBSTR(corrid, 1, 0) IS NULL", true),
            ("SUBSTR(corrid, 1.9, 3.9) = 'ORD'", true),
            ("SUBSTR(corrid, 1, 1000000000000) = corrid", true),
            ("TRIM(tab.user_data.ename) = 'Smith'", true),
            ("TRIM(LEADING FROM tab.user_data.ename) = 'Smith  '", true),
            ("TRIM(TRAILING FROM tab.user_data.ename) = '  Smith'", true),
            ("TRIM(BOTH 'x' FROM 'xxaxx') = 'a'", true),
            ("TRIM(LEADING 'x' FROM 'xxaxx') = 'axx'", true),
            ("TRIM('x' FROM 'xxaxx') = 'a'", true),
            ("TRIM('   ') IS NULL", true),
            ("NVL(delay, 0) = 0", true),
            ("NVL(priority, 0) = 3", true),
            ("NVL(nosuch, 'd') = 'd'", true),
            ("NVL(vip, FALSE)", true),
            ("ABS(-5) = 5", true),
            ("ABS('-2.5') = 2.5", true),
            ("ROUND(2.5) = 3", true),
            ("ROUND(-2.5) = -3", true),
            ("ROUND(1.2345, 2) = 1.23", true),
            ("ROUND(1234, -2) = 1200", true),
            ("ROUND(1.5, 1000) = 1.5", true),
            ("ROUND(1.5, -1000) = 0", true),
            ("UPPER(NULL) IS NULL", true),
            ("ABS('x') IS NULL", true),
            // comments and whitespace
            ("priority = 3 -- trailing comment", true),
            ("priority /* inline */ = 3", true),
            ("\n\tpriority\n=\n3\n", true),
            // string literal escape
            ("'it''s' = 'it' || '''s'", true),
            ("N'USA' = Country", true),
            // long flattened chains are fine
            ("priority = 0 OR priority = 1 OR priority = 2 OR priority = 3", true),
        ];
        let mut failures = Vec::new();
        for (cond, expected) in cases {
            let got = check(cond, &ctx);
            if got != *expected {
                failures.push(format!("{cond:?}: expected {expected}, got {got}"));
            }
        }
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn deptno_example_with_text_and_number_payloads() {
        let cond = Condition::parse("tab.user_data.deptno=60").expect("parses");
        assert!(cond.references_user_data());
        for v in [t("60"), n(60.0), t(" 60 "), t("60.0"), t("6e1")] {
            assert!(cond.eval(&Ctx::default().data("deptno", v.clone())), "{v:?}");
        }
        for v in [t("61"), n(61.0), t("sixty"), t(""), Value::Null, Value::Bool(true), t("NaN"), t("inf")] {
            assert!(!cond.eval(&Ctx::default().data("deptno", v.clone())), "{v:?}");
        }
        // absent payload attribute
        assert!(!cond.eval(&Ctx::default()));
    }

    #[test]
    fn three_valued_logic() {
        let ctx = std_ctx(); // delay is a known property with a NULL value
        let unknown = [
            "delay = 1",
            "NOT delay = 1",
            "NOT (delay = 1)",
            "NOT NOT (delay = 1)",
            "delay <> 1",
            "delay = NULL",
            "NULL = NULL",
            "delay = 1 AND priority = 3",
            "delay = 1 OR priority = 4",
            "delay BETWEEN 0 AND 10",
            "delay NOT BETWEEN 0 AND 10",
            "delay IN (1, 2)",
            "delay NOT IN (1, 2)",
            "priority NOT IN (1, NULL)",
            "delay LIKE '%'",
            "delay NOT LIKE '%'",
            "priority BETWEEN NULL AND 5",
            "NULL",
            "nosuch",
        ];
        for cond in unknown {
            assert!(!check(cond, &ctx), "{cond} should be UNKNOWN (false)");
        }
        // UNKNOWN absorbed by FALSE in AND and TRUE in OR
        assert!(!check("delay = 1 AND priority = 4", &ctx));
        assert!(check("delay = 1 OR priority = 3", &ctx));
        assert!(check("NOT (delay = 1 AND priority = 4)", &ctx));
        assert!(check("priority NOT BETWEEN 5 AND NULL", &ctx)); // 3 < 5 decides
        assert!(check("delay IS NULL", &ctx));
    }

    #[test]
    fn references_user_data_detection() {
        let yes = [
            "tab.user_data.deptno = 60",
            "priority = 1 OR tab.user_data.x IS NULL",
            "UPPER(tab.user_data.a) = 'A'",
            "corrid LIKE tab.user_data.p",
            "priority IN (1) AND NOT tab.user_data IS NULL",
            "priority BETWEEN 1 AND tab.user_data.max",
        ];
        let no = ["priority = 1", "Country = 'USA' AND corrid LIKE 'A%'", "tab.corrid = 'x'"];
        for c in yes {
            assert!(Condition::parse(c).expect("parses").references_user_data(), "{c}");
        }
        for c in no {
            assert!(!Condition::parse(c).expect("parses").references_user_data(), "{c}");
        }
    }

    #[test]
    fn payload_path_segments() {
        struct PathCtx;
        impl ConditionContext for PathCtx {
            fn property(&self, _: &str) -> Option<Value> {
                None
            }
            fn user_data(&self, path: &[String]) -> Value {
                Value::Text(path.join("/"))
            }
            fn user_property(&self, _: &str) -> Value {
                Value::Null
            }
        }
        assert!(check("tab.user_data.Customer.COUNTRY = 'customer/country'", &PathCtx));
        assert!(check("tab.user_data.\"MixedCase\".x = 'MixedCase/x'", &PathCtx));
        assert!(check("tab.user_data.header.properties.p = 'header/properties/p'", &PathCtx));
        assert!(check("tab.user_data.date = 'date'", &PathCtx)); // keywords fine after `.`
        assert!(check("tab.user_data.\"select\" = 'select'", &PathCtx));
        assert!(Condition::parse("tab.user_data.select = 'select'").is_err()); // SELECT is refused unquoted
        assert!(check("tab.user_data IS NULL", &PathCtx)); // empty path -> "" -> NULL
    }

    fn expect_err(cond: &str) -> ConditionError {
        match Condition::parse(cond) {
            Ok(c) => panic!("{cond:?} unexpectedly parsed: {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn injection_and_unsupported_inputs_are_rejected() {
        use ConditionError::*;
        type IsExpected = fn(&ConditionError) -> bool;
        let cases: &[(&str, IsExpected, &str)] = &[
            ("1=1; DROP TABLE x", |e| matches!(e, Unsupported(_)), "`;`"),
            ("priority = 1;", |e| matches!(e, Unsupported(_)), "`;`"),
            ("(SELECT 1)", |e| matches!(e, Unsupported(_)), "subquery"),
            ("priority IN (SELECT priority FROM t)", |e| matches!(e, Unsupported(_)), "subquery"),
            ("EXISTS (SELECT 1)", |e| matches!(e, Unsupported(_)), "subquery"),
            ("NOT EXISTS (x)", |e| matches!(e, Unsupported(_)), "EXISTS"),
            ("deptno = 60 UNION SELECT", |e| matches!(e, Unsupported(_)), "subquery"),
            ("deptno = 60 UNION ALL", |e| matches!(e, Parse(_)), "after the end"),
            ("DBMS_LOCK.SLEEP(10)", |e| matches!(e, Unsupported(_)), "DBMS_LOCK.SLEEP"),
            ("DBMS_LOCK.SLEEP(10) = 1", |e| matches!(e, Unsupported(_)), "DBMS_LOCK.SLEEP"),
            ("priority = SLEEP(10)", |e| matches!(e, Unsupported(_)), "SLEEP"),
            ("utl_http.request('http://evil') IS NULL", |e| matches!(e, Unsupported(_)), "utl_http.request"),
            (
                "tab.user_data.xdata.extract('/ORDER_TYP/CUSTOMER/COUNTRY/text()').getStringVal()='CANADA'",
                |e| matches!(e, Unsupported(_)),
                "function call",
            ),
            ("\"UPPER\"(corrid) = 'A'", |e| matches!(e, Unsupported(_)), "function call"),
            ("CAST(priority AS VARCHAR(10)) = '1'", |e| matches!(e, Unsupported(_)), "CAST"),
            ("CASE WHEN priority = 1 THEN 1 END = 1", |e| matches!(e, Unsupported(_)), "CASE"),
            ("enq_time > SYSDATE - 1", |e| matches!(e, Unsupported(_)), "SYSDATE"),
            ("enq_time > CURRENT_TIMESTAMP", |e| matches!(e, Unsupported(_)), "CURRENT_TIMESTAMP"),
            ("USER = 'SYS'", |e| matches!(e, Unsupported(_)), "USER"),
            ("priority = :1", |e| matches!(e, Unsupported(_)), "`:`"),
            ("priority = ?", |e| matches!(e, Unsupported(_)), "placeholder"),
            ("priority = $1", |e| matches!(e, Unsupported(_)), "placeholder"),
            ("priority % 2 = 0", |e| matches!(e, Unsupported(_)), "%"),
            ("priority::text = '1'", |e| matches!(e, Unsupported(_)), "::"),
            ("tab.user_data.items[1] = 2", |e| matches!(e, Unsupported(_)), "["),
            ("corrid ILIKE 'a%'", |e| matches!(e, Unsupported(_)), "ILIKE"),
            ("corrid SIMILAR TO 'a%'", |e| matches!(e, Unsupported(_)), "SIMILAR"),
            ("corrid REGEXP 'a'", |e| matches!(e, Unsupported(_)), "REGEXP"),
            ("priority IS TRUE", |e| matches!(e, Unsupported(_)), "IS"),
            ("priority IS DISTINCT FROM 1", |e| matches!(e, Unsupported(_)), "DISTINCT"),
            ("priority IN (1, priority)", |e| matches!(e, Unsupported(_)), "literal"),
            ("priority IN (1 + 1)", |e| matches!(e, Unsupported(_)), "literal"),
            ("priority = ANY (1, 2)", |e| matches!(e, Unsupported(_) | Parse(_)), ""),
            ("x.y = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
            ("user_data.deptno = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
            ("tab.a.b = 1", |e| matches!(e, Unsupported(_)), "qualified name"),
            ("(priority, corrid) = (1, 'a')", |e| matches!(e, Parse(_) | Unsupported(_)), ""),
            ("INTERVAL '1' DAY", |e| matches!(e, Unsupported(_)), "INTERVAL"),
            ("X'41' = 'A'", |e| matches!(e, Unsupported(_)), ""),
            ("priority & 1 = 1", |e| matches!(e, Unsupported(_)), "&"),
            ("`priority` = 1", |e| matches!(e, Parse(_) | Unsupported(_)), ""),
            ("SUBSTRING(corrid FROM 1 FOR 2) = 'OR'", |e| matches!(e, Unsupported(_)), "SUBSTRING"),
            // syntax / arity / kind errors
            ("", |e| matches!(e, Parse(_)), "empty"),
            ("   -- only a comment", |e| matches!(e, Parse(_)), "empty"),
            ("priority =", |e| matches!(e, Parse(_)), ""),
            ("priority = 1 AND", |e| matches!(e, Parse(_)), ""),
            ("(priority = 1", |e| matches!(e, Parse(_)), ""),
            ("priority = 1)", |e| matches!(e, Parse(_)), ""),
            ("'unterminated", |e| matches!(e, Parse(_)), ""),
            ("priority = 1 priority = 2", |e| matches!(e, Parse(_)), "after the end"),
            ("60", |e| matches!(e, Parse(_)), "boolean"),
            ("priority + 1", |e| matches!(e, Parse(_)), "boolean"),
            ("1 AND 2", |e| matches!(e, Parse(_)), "value"),
            ("NOT 'x'", |e| matches!(e, Parse(_)), "value"),
            ("(priority = 1) + 1 = 2", |e| matches!(e, Unsupported(_)), "condition used as a value"),
            ("(priority = 1) = TRUE", |e| matches!(e, Unsupported(_)), "condition used as a value"),
            ("UPPER() = 'a'", |e| matches!(e, Parse(_)), "expects"),
            ("UPPER(corrid, 1) = 'a'", |e| matches!(e, Parse(_)), "expects"),
            ("SUBSTR(corrid) = 'a'", |e| matches!(e, Parse(_)), "expects"),
            ("NVL(corrid) = 'a'", |e| matches!(e, Parse(_)), "expects"),
            ("TRIM('xy' FROM corrid) = 'a'", |e| matches!(e, Parse(_)), "single character"),
            ("TRIM(LEADING corrid) = 'a'", |e| matches!(e, Parse(_)), "FROM"),
            ("corrid LIKE 'a' ESCAPE 'xy'", |e| matches!(e, Parse(_)), "ESCAPE"),
            ("corrid LIKE 'a!b' ESCAPE '!'", |e| matches!(e, Parse(_)), "escape"),
            ("corrid LIKE 'ab!' ESCAPE '!'", |e| matches!(e, Parse(_)), "escape"),
            ("priority = 1e999", |e| matches!(e, Parse(_)), "number"),
        ];
        let mut failures = Vec::new();
        for (cond, ok, needle) in cases {
            let e = expect_err(cond);
            let msg = e.to_string();
            if !ok(&e) || !msg.to_lowercase().contains(&needle.to_lowercase()) {
                failures.push(format!("{cond:?}: got {e:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // A classic tautology is just a (true) condition: harmless, never SQL.
        assert!(check("deptno = 60 OR 1=1 --", &std_ctx()));
    }

    #[test]
    fn length_and_depth_limits() {
        assert_eq!(expect_err(&"(".repeat(10_000)), ConditionError::TooLong);
        assert_eq!(
            expect_err(&format!("{}priority = 1{}", "(".repeat(10_000), ")".repeat(10_000))),
            ConditionError::TooLong
        );
        assert_eq!(expect_err(&"(".repeat(3_000)), ConditionError::TooDeep);
        let over = MAX_DEPTH + 1;
        assert_eq!(
            expect_err(&format!("{}priority = 3{}", "(".repeat(over), ")".repeat(over))),
            ConditionError::TooDeep
        );
        // exactly at the limit parses (parser thread has a big stack even in debug)
        let at = MAX_DEPTH - 2;
        assert!(check(&format!("{}priority = 3{}", "(".repeat(at), ")".repeat(at)), &std_ctx()));
        // deep chains without parentheses
        assert_eq!(expect_err(&format!("{}priority = 3", "NOT ".repeat(990))), ConditionError::TooDeep);
        assert_eq!(expect_err(&format!("priority = {}3", "- ".repeat(1_990))), ConditionError::TooDeep);
        assert_eq!(expect_err(&format!("priority = {}3", "+-".repeat(1_950))), ConditionError::TooDeep);
        assert!(check(&format!("{}priority = 3", "NOT NOT ".repeat(10)), &std_ctx()));
        // left-deep arithmetic counts, flattened OR/AND chains do not
        assert_eq!(expect_err(&format!("priority{} = 3", " + 0".repeat(500))), ConditionError::TooDeep);
        let ors = vec!["priority=9"; 250].join(" OR ") + " OR priority=3";
        assert!(check(&ors, &std_ctx()));
        // exactly 4000 characters is allowed, 4001 is not
        let pad = |len: usize| format!("priority = 3{}", " ".repeat(len - 12));
        assert!(Condition::parse(&pad(4000)).is_ok());
        assert_eq!(expect_err(&pad(4001)), ConditionError::TooLong);
        // characters, not bytes
        let multibyte = format!("corrid = '{}'", "é".repeat(3_900));
        assert!(Condition::parse(&multibyte).is_ok());
    }

    /// Short conditions are parsed on the caller's stack: the worst cases at the
    /// inline token limit must fit a small thread stack (measured: < 600 KiB in
    /// debug, < 128 KiB in release). Longer input goes to the big-stack thread.
    #[test]
    fn parsing_fits_small_caller_stacks() {
        let inline = [
            format!("{}vip", "NOT ".repeat(INLINE_MAX_TOKENS - 1)),
            format!("x = {}1", "- ".repeat(INLINE_MAX_TOKENS - 3)),
            format!("{}vip{}", "(".repeat(7), ")".repeat(7)),
            format!("x = {}1{}", "UPPER(".repeat(6), ")".repeat(6)),
            "a BETWEEN 1 + 1 AND - - 2 OR NOT x LIKE 'a'".to_string(),
        ];
        let deep = [
            format!("{}vip", "NOT ".repeat(MAX_DEPTH - 4)),
            format!("{}vip{}", "(".repeat(MAX_DEPTH - 2), ")".repeat(MAX_DEPTH - 2)),
            format!("{}vip", "NOT ".repeat(990)),
        ];
        for (input, stack) in inline.iter().map(|s| (s, 1024 * 1024)).chain(deep.iter().map(|s| (s, 256 * 1024))) {
            let s = input.clone();
            let handle = std::thread::Builder::new()
                .stack_size(stack)
                .spawn(move || Condition::parse(&s).map(|_| ()))
                .expect("spawn test thread");
            let result = handle.join().expect("no panic");
            assert!(result.is_ok() || result == Err(ConditionError::TooDeep), "{input:?}: {result:?}");
        }
    }

    /// The stock sqlparser prefix parser backtracks exponentially on failing
    /// nested keyword constructs; the dialect hook must keep these linear.
    #[test]
    fn pathological_nesting_is_fast() {
        let prefixes = [
            "NOT (",
            "NOT(",
            "CAST(",
            "CAST(CAST(",
            "POSITION(",
            "CEIL(",
            "SUBSTRING(",
            "CASE (",
            "UPPER(",
            "TRIM(",
            "NVL(a, ",
            "(",
            "- (",
            "x IN (",
            "CURRENT_DATE(",
            "(NOT (",
        ];
        for p in prefixes {
            let opens = p.matches('(').count();
            let levels = (MAX_DEPTH / opens).min(60);
            for inner in ["a b", "a = 1 +", ")", "a = 1", ""] {
                let cond = format!("{}{}{}", p.repeat(levels), inner, ")".repeat(levels * opens));
                let start = Instant::now();
                let _ = Condition::parse(&cond);
                assert!(start.elapsed() < Duration::from_secs(2), "{cond:?} took {:?}", start.elapsed());
            }
        }
    }

    #[test]
    fn like_matcher() {
        let m = |text: &str, pat: &str, esc: Option<char>| {
            let toks = compile_like(pat, esc).expect("valid pattern");
            like_match(&text.chars().collect::<Vec<_>>(), &toks)
        };
        assert!(m("", "", None));
        assert!(m("", "%", None));
        assert!(m("", "%%", None));
        assert!(!m("", "_", None));
        assert!(m("abc", "abc", None));
        assert!(m("abc", "a%c", None));
        assert!(m("abc", "%b%", None));
        assert!(m("abc", "___", None));
        assert!(!m("abc", "____", None));
        assert!(m("aaa", "%a", None));
        assert!(m("ab_c", "ab\\_c", Some('\\')));
        assert!(!m("abXc", "ab\\_c", Some('\\')));
        assert!(m("ünïcødé", "_n%d_", None));
        assert!(!m("abc", "ABC", None));
        // worst-case-ish input finishes quickly
        let text: Vec<char> = "a".repeat(20_000).chars().collect();
        let toks = compile_like(&format!("{}b", "%a".repeat(1_000)), None).expect("valid");
        let start = Instant::now();
        assert!(!like_match(&text, &toks));
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(compile_like("a!", Some('!')).is_err());
        assert!(compile_like("a!x", Some('!')).is_err());
    }

    #[test]
    fn dynamic_like_pattern_errors_are_unknown() {
        let ctx = std_ctx().user("pat", t("ORD!x")).user("good", t("ORD-!%%"));
        assert!(!check("corrid LIKE pat ESCAPE '!'", &ctx));
        assert!(!check("NOT (corrid LIKE pat ESCAPE '!')", &ctx));
        assert!(!check("corrid LIKE good ESCAPE '!'", &ctx)); // needs a literal '%'
        let ctx = ctx.user("pct", t("100%")).user("good2", t("100!%"));
        assert!(check("pct LIKE good2 ESCAPE '!'", &ctx));
        assert!(!check("pct LIKE good", &ctx));
    }

    #[test]
    fn number_parsing_and_formatting() {
        assert_eq!(parse_number("60"), Some(60.0));
        assert_eq!(parse_number(" -1.5e3 "), Some(-1500.0));
        assert_eq!(parse_number(".5"), Some(0.5));
        assert_eq!(parse_number("5."), Some(5.0));
        for bad in ["", ".", "e5", "1e", "inf", "NaN", "0x10", "1,5", "--1", "1e400", "6O"] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
        assert_eq!(fmt_num(60.0), "60");
        assert_eq!(fmt_num(-0.0), "0");
        assert_eq!(fmt_num(1500.5), "1500.5");
        assert_eq!(round_half_away(0.125, 2), 0.13);
        assert_eq!(round_half_away(-15.0, -1), -20.0);
    }

    #[test]
    fn errors_display_clearly() {
        let e = expect_err("DBMS_LOCK.SLEEP(10)");
        assert_eq!(e.to_string(), "unsupported in a condition: function call `DBMS_LOCK.SLEEP(...)`");
        assert_eq!(ConditionError::TooLong.to_string(), "condition exceeds 4000 characters");
        let parsed: Result<Condition, _> = "priority = 1".parse();
        assert!(parsed.is_ok());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        const ATOMS: &[&str] = &[
            "(",
            ")",
            "NOT",
            "AND",
            "OR",
            "=",
            "<>",
            "<",
            ">=",
            "+",
            "-",
            "*",
            "/",
            "||",
            ",",
            "IS",
            "NULL",
            "IN",
            "BETWEEN",
            "LIKE",
            "ESCAPE",
            "'%a_'",
            "'!'",
            "1",
            "2.5",
            "priority",
            "corrid",
            "tab.user_data.deptno",
            "tab.user_data",
            "Country",
            "\"q\"",
            "UPPER",
            "SUBSTR",
            "TRIM",
            "FROM",
            "LEADING",
            "NVL",
            "ROUND",
            "ABS",
            "LENGTH",
            "TRUE",
            "FALSE",
            "SELECT",
            "CAST",
            ";",
            "'",
            "\"",
            ".",
            "CASE",
            "EXISTS",
            "DBMS_LOCK.SLEEP",
        ];

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn random_text_never_panics(s in "\\PC{0,300}") {
                let _ = Condition::parse(&s);
            }

            #[test]
            fn random_token_soup_never_panics(
                atoms in proptest::collection::vec(proptest::sample::select(ATOMS), 0..80)
            ) {
                let s = atoms.join(" ");
                if let Ok(c) = Condition::parse(&s) {
                    let _ = c.eval(&std_ctx());
                    let _ = c.eval(&Ctx::default());
                    let _ = c.references_user_data();
                }
            }

            #[test]
            fn comparison_with_numeric_text_matches_number(x in -1.0e9f64..1.0e9, y in -1.0e9f64..1.0e9) {
                let ctx = Ctx::default().data("a", Value::Text(format!("{x}")));
                let cond = Condition::parse(&format!("tab.user_data.a < {y}")).expect("parses");
                prop_assert_eq!(cond.eval(&ctx), x < y);
            }
        }
    }
}
