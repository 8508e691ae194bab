//! Gate 3: sqlparser with a private dialect whose prefix hook owns words and parentheses, so
//! that anything outside the language fails at once.

use std::cell::RefCell;

use sqlparser::ast::{
    Expr as SqlExpr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident,
    ObjectName, TrimWhereField, UnaryOperator, Value as SqlValue,
};
use sqlparser::dialect::{Dialect, Precedence};
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Span, Token, TokenWithSpan, Word};

use super::*;

/// Words that start constructs we do not support (or Oracle pseudo-columns that
/// would otherwise silently become absent JMS properties).
pub(super) const REJECTED_WORDS: &[&str] = &[
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

pub(super) const FUNCTIONS: &[&str] = &["UPPER", "LOWER", "LENGTH", "SUBSTR", "TRIM", "NVL", "ABS", "ROUND"];
/// What transformation expressions call besides [`FUNCTIONS`].
pub(super) const EXPRESSION_FUNCTIONS: &[&str] = &["TO_CHAR", "TO_NUMBER", "COALESCE", "CONCAT"];

/// Which language a text is parsed as: a condition (a truth value over a message) or a
/// transformation expression (a value over `source`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lang {
    #[default]
    Condition,
    Expression,
}

/// Oracle-like identifier rules (`"` quotes only, no backslash escapes), plus a
/// prefix hook; records the reason when it rejects a construct.
#[derive(Debug, Default)]
pub(super) struct ConditionDialect {
    pub(super) unsupported: RefCell<Option<String>>,
    pub(super) lang: Lang,
}

impl ConditionDialect {
    pub(super) fn reject(&self, what: String) -> ParserError {
        let msg = format!("unsupported: {what}");
        *self.unsupported.borrow_mut() = Some(what);
        ParserError::ParserError(msg)
    }

    pub(super) fn parse_word(&self, parser: &mut Parser, w: Word) -> Result<SqlExpr, ParserError> {
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
                "CASE" if self.lang == Lang::Expression => {
                    parser.next_token();
                    return parser.parse_case_expr();
                }
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
                && (FUNCTIONS.contains(&upper.as_str())
                    || (self.lang == Lang::Expression && EXPRESSION_FUNCTIONS.contains(&upper.as_str())));
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

    pub(super) fn parse_call(&self, parser: &mut Parser, name: Vec<Ident>) -> Result<SqlExpr, ParserError> {
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
    pub(super) fn parse_trim(&self, parser: &mut Parser) -> Result<SqlExpr, ParserError> {
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

    pub(super) fn parse_paren(&self, parser: &mut Parser) -> Result<SqlExpr, ParserError> {
        parser.next_token();
        let inner = parser.parse_expr()?;
        parser.expect_token(&Token::RParen)?;
        Ok(SqlExpr::Nested(Box::new(inner)))
    }
}

pub(super) fn word_ident(w: Word) -> Ident {
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
pub(super) fn parse_tokens(tokens: Vec<TokenWithSpan>, lang: Lang) -> Result<(Node, Kind), ConditionError> {
    let dialect = ConditionDialect { lang, ..ConditionDialect::default() };
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
    convert(&expr, Depth { level: 0, lang })
}

pub(super) fn strip_prefix(msg: String) -> String {
    match msg.strip_prefix("sql parser error: ") {
        Some(rest) => rest.to_string(),
        None => msg,
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}
