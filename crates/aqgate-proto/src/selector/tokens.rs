//! Gate 2: the token allowlist, checked on the tokenizer's output before anything parses.

use sqlparser::tokenizer::{Token, TokenWithSpan};

use super::*;

pub(super) fn prescan(tokens: &[TokenWithSpan]) -> Result<(), ConditionError> {
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
