//! Gate 4: the sqlparser AST converted into ours, node kind by node kind (an allowlist).

use sqlparser::ast::{
    BinaryOperator, CaseWhen, Expr as SqlExpr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, Ident,
    TrimWhereField, UnaryOperator, Value as SqlValue, ValueWithSpan,
};

use super::*;
use crate::value::Value;

/// Static kind, used to reject `1 AND 2` or `(a = 1) + 1` at parse time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// A truth value (comparison, logic, predicate).
    Bool,
    /// A number/text value (arithmetic, literals, most functions).
    Scalar,
    /// Could be either (names, NULL, TRUE/FALSE, NVL).
    Any,
}

pub(super) type Conv = Result<(Node, Kind), ConditionError>;

/// How deep the conversion is (gate 4's nesting limit), and in which language.
#[derive(Debug, Clone, Copy)]
pub(super) struct Depth {
    pub(super) level: usize,
    pub(super) lang: Lang,
}

impl Depth {
    fn deeper(self) -> Depth {
        Depth { level: self.level + 1, ..self }
    }
}

pub(super) fn unsupported<T>(what: &str, e: &SqlExpr) -> Result<T, ConditionError> {
    Err(ConditionError::Unsupported(format!("{what} (`{}`)", truncate(&e.to_string(), 60))))
}

pub(super) fn boolean(e: &SqlExpr, depth: Depth) -> Result<Node, ConditionError> {
    let (n, k) = convert(e, depth)?;
    if k == Kind::Scalar {
        return Err(ConditionError::Parse(format!(
            "expected a condition, found a value: `{}`",
            truncate(&e.to_string(), 60)
        )));
    }
    Ok(n)
}

pub(super) fn scalar(e: &SqlExpr, depth: Depth) -> Result<Box<Node>, ConditionError> {
    let (n, k) = convert(e, depth)?;
    if k == Kind::Bool {
        return Err(ConditionError::Unsupported(format!(
            "a condition used as a value: `{}`",
            truncate(&e.to_string(), 60)
        )));
    }
    Ok(Box::new(n))
}

/// An sqlparser expression as our node and its static kind, node kind by node kind: what
/// is not on the allowlist is refused, as is nesting deeper than `MAX_DEPTH`.
pub(super) fn convert(e: &SqlExpr, depth: Depth) -> Conv {
    if depth.level > MAX_DEPTH {
        return Err(ConditionError::TooDeep);
    }
    let d = depth.deeper();
    Ok(match e {
        SqlExpr::Nested(inner) => convert(inner, d)?,
        SqlExpr::Value(v) => {
            let lit = literal(&v.value, e)?;
            let kind = if matches!(lit, Value::Number(_) | Value::Text(_)) { Kind::Scalar } else { Kind::Any };
            (Node::Lit(lit), kind)
        }
        SqlExpr::Identifier(id) if depth.lang == Lang::Expression => {
            (source_node(std::slice::from_ref(id), e)?, Kind::Any)
        }
        SqlExpr::CompoundIdentifier(parts) if depth.lang == Lang::Expression => (source_node(parts, e)?, Kind::Any),
        SqlExpr::Identifier(id) => (name_node(id), Kind::Any),
        SqlExpr::CompoundIdentifier(parts) => (compound_node(parts, e)?, Kind::Any),
        SqlExpr::Case { operand, conditions, else_result } if depth.lang == Lang::Expression => {
            case(operand.as_deref(), conditions, else_result.as_deref(), d)?
        }
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
        SqlExpr::BinaryOp { op: op @ (BinaryOperator::And | BinaryOperator::Or), .. } => logical_chain(e, op, d)?,
        SqlExpr::BinaryOp { left, op, right } => binary(left, op, right, e, d)?,
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
            like(expr, pattern, escape_char.as_deref(), *negated, d)?
        }
        SqlExpr::Function(f) => convert_function(f, e, d)?,
        SqlExpr::Trim { expr, trim_where, trim_what, trim_characters } => {
            if trim_characters.is_some() {
                return unsupported("TRIM with a character list", e);
            }
            trim(expr, trim_where.as_ref(), trim_what.as_deref(), d)?
        }
        other => return unsupported(describe(other), e),
    })
}

/// `CASE [x] WHEN … THEN … [ELSE …] END` (expressions only): with an operand, each `WHEN`
/// is a value compared with it; without, a condition.
fn case(operand: Option<&SqlExpr>, conditions: &[CaseWhen], else_result: Option<&SqlExpr>, d: Depth) -> Conv {
    let operand = match operand {
        Some(o) => Some(scalar(o, d)?),
        None => None,
    };
    let mut whens = Vec::with_capacity(conditions.len());
    for w in conditions {
        // `CASE x WHEN v`: v is a value compared with x; `CASE WHEN c`: c is a condition.
        let when = if operand.is_some() { *scalar(&w.condition, d)? } else { boolean(&w.condition, d)? };
        whens.push((when, *scalar(&w.result, d)?));
    }
    let otherwise = match else_result {
        Some(x) => Some(scalar(x, d)?),
        None => None,
    };
    Ok((Node::Case { operand, whens, otherwise }, Kind::Scalar))
}

/// A chain of `AND`s (or of `OR`s), `e`, as one node: left-deep chains are flattened
/// iteratively, so that `a OR b OR c ...` of any length counts as one nesting level.
fn logical_chain(e: &SqlExpr, op: &BinaryOperator, d: Depth) -> Conv {
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
    Ok((node, Kind::Bool))
}

/// A comparison, an arithmetic operation or `||` (any other binary operator of `e` is
/// refused).
fn binary(left: &SqlExpr, op: &BinaryOperator, right: &SqlExpr, e: &SqlExpr, d: Depth) -> Conv {
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
        Ok((Node::Cmp(c, scalar(left, d)?, scalar(right, d)?), Kind::Bool))
    } else if let Some(a) = arith {
        Ok((Node::Arith(a, scalar(left, d)?, scalar(right, d)?), Kind::Scalar))
    } else if *op == BinaryOperator::StringConcat {
        Ok((Node::Concat(scalar(left, d)?, scalar(right, d)?), Kind::Scalar))
    } else {
        unsupported(&format!("operator `{op}`"), e)
    }
}

/// `expr [NOT] LIKE pattern [ESCAPE c]`: a literal pattern compiled once here, any other
/// at each evaluation.
fn like(expr: &SqlExpr, pattern: &SqlExpr, escape_char: Option<&str>, negated: bool, d: Depth) -> Conv {
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
        Node::Lit(Value::Text(p)) => LikePattern::Static(compile_like(&p, escape).map_err(ConditionError::Parse)?),
        Node::Lit(Value::Number(n)) => {
            LikePattern::Static(compile_like(&fmt_num(n), escape).map_err(ConditionError::Parse)?)
        }
        other => LikePattern::Dynamic { pattern: Box::new(other), escape },
    };
    Ok((Node::Like { expr: scalar(expr, d)?, pattern, negated }, Kind::Bool))
}

/// `TRIM([BOTH | LEADING | TRAILING] [c FROM] expr)`, `c` a single character.
fn trim(expr: &SqlExpr, trim_where: Option<&TrimWhereField>, trim_what: Option<&SqlExpr>, d: Depth) -> Conv {
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
    Ok((Node::Call(Func::Trim(side), args), Kind::Scalar))
}

pub(super) fn describe(e: &SqlExpr) -> &'static str {
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

pub(super) fn literal(v: &SqlValue, e: &SqlExpr) -> Result<Value, ConditionError> {
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

pub(super) fn in_list_literal(item: &SqlExpr) -> Result<Value, ConditionError> {
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

pub(super) const PROPERTY_ALIASES: &[(&str, &str)] =
    &[("correlation", "corrid"), ("msg_state", "state"), ("delivery_count", "retry_count")];

pub(super) fn canonical_property(lower: String) -> String {
    for (alias, canon) in PROPERTY_ALIASES {
        if lower == *alias {
            return (*canon).to_string();
        }
    }
    lower
}

pub(super) fn name_node(id: &Ident) -> Node {
    if id.quote_style.is_some() {
        Node::UserProp(id.value.clone())
    } else {
        Node::Name { prop: canonical_property(id.value.to_lowercase()), original: id.value.clone() }
    }
}

pub(super) fn path_segment(id: &Ident) -> String {
    if id.quote_style.is_some() { id.value.clone() } else { id.value.to_lowercase() }
}

pub(super) fn compound_node(parts: &[Ident], e: &SqlExpr) -> Result<Node, ConditionError> {
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

/// A name in a transformation expression: `source` (the whole payload) or
/// `source.<path>` (a payload attribute; unquoted segments lower-cased).
pub(super) fn source_node(parts: &[Ident], e: &SqlExpr) -> Result<Node, ConditionError> {
    match parts {
        [src, path @ ..] if src.quote_style.is_none() && src.value.eq_ignore_ascii_case("source") => {
            Ok(Node::Source(path.iter().map(path_segment).collect()))
        }
        _ => unsupported("name (attributes of the message are source.<attribute>)", e),
    }
}

pub(super) fn convert_function(f: &Function, e: &SqlExpr, d: Depth) -> Conv {
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
        "TO_CHAR" if d.lang == Lang::Expression => (Func::ToChar, 1, 1, Kind::Scalar),
        "TO_NUMBER" if d.lang == Lang::Expression => (Func::ToNumber, 1, 1, Kind::Scalar),
        "COALESCE" if d.lang == Lang::Expression => (Func::Coalesce, 1, 64, Kind::Any),
        "CONCAT" if d.lang == Lang::Expression => (Func::Concat, 2, 2, Kind::Scalar),
        _ => return unsupported("function", e),
    };
    if args.len() < min || args.len() > max {
        let expected = if min == max { format!("{min}") } else { format!("{min} to {max}") };
        return Err(ConditionError::Parse(format!("{name} expects {expected} argument(s), got {}", args.len())));
    }
    Ok((Node::Call(func, args), kind))
}
