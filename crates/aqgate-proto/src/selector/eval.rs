//! Evaluation over a [`ConditionContext`]: Oracle-flavoured, three-valued.

use std::cmp::Ordering;

use super::*;
use crate::value::Value;

/// Oracle: the empty string is NULL.
pub(super) fn norm(v: Value) -> Value {
    match v {
        Value::Text(s) if s.is_empty() => Value::Null,
        Value::Number(n) if n.is_nan() => Value::Null,
        v => v,
    }
}

pub(super) fn truth(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

pub(super) fn tri(b: Option<bool>) -> Value {
    b.map_or(Value::Null, Value::Bool)
}

/// Strict numeric syntax (Oracle TO_NUMBER-like): `[+-]digits[.digits][e[+-]digits]`,
/// surrounding blanks allowed. No `inf`/`NaN`/hex.
pub(super) fn parse_number(s: &str) -> Option<f64> {
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

pub(super) fn to_num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) if n.is_finite() => Some(*n),
        Value::Text(s) => parse_number(s),
        _ => None,
    }
}

pub(super) fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { format!("{n}") }
}

pub(super) fn to_text(v: &Value) -> Option<String> {
    match v {
        Value::Text(s) => Some(s.clone()),
        Value::Number(n) if n.is_finite() => Some(fmt_num(*n)),
        _ => None,
    }
}

pub(super) fn text_value(s: String) -> Value {
    norm(Value::Text(s))
}

pub(super) fn num_value(n: f64) -> Value {
    if n.is_finite() { Value::Number(n) } else { Value::Null }
}

pub(super) fn text_to_bool(s: &str) -> Option<bool> {
    if s.trim().eq_ignore_ascii_case("true") {
        Some(true)
    } else if s.trim().eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// SQL comparison; `None` = UNKNOWN.
pub(super) fn compare(op: CmpOp, a: &Value, b: &Value) -> Option<bool> {
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

pub(super) fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// Why an evaluation ended without a value: a strict evaluation's error, or the budget.
#[derive(Debug)]
pub(super) enum Fail {
    Error(String),
    Over(OverBudget),
}

impl From<String> for Fail {
    fn from(s: String) -> Self {
        Fail::Error(s)
    }
}

impl From<OverBudget> for Fail {
    fn from(o: OverBudget) -> Self {
        Fail::Over(o)
    }
}

/// What touching a value costs: its bytes (a text is read or copied whole), or one step.
pub(super) fn cost(v: &Value) -> u64 {
    match v {
        Value::Text(s) => s.len() as u64 + 1,
        _ => 1,
    }
}

/// A value read from the message: charged, and refused when its text is over the limit.
fn seen(v: Value, what: &dyn Fn() -> String, b: &mut Budget) -> Result<Value, Fail> {
    b.charge(cost(&v))?;
    if let Value::Text(s) = &v {
        b.text(s.len(), &what())?;
    }
    Ok(norm(v))
}

/// A payload attribute (`tab.user_data...` or `source...`), refused over the text limit
/// before it is built where the context can tell.
fn user_data(path: &[String], source: bool, ctx: &dyn ConditionContext, b: &mut Budget) -> Result<Value, Fail> {
    let what = || {
        let head = if source { "source" } else { "tab.user_data" };
        if path.is_empty() { head.to_string() } else { format!("{head}.{}", path.join(".")) }
    };
    match ctx.user_data_within(path, b.max_text()) {
        Ok(v) => seen(v, &what, b),
        Err(len) => Err(OverBudget::Text { what: what(), len, limit: b.max_text() }.into()),
    }
}

/// Evaluates `node`, every step charged to `b`. Lenient (`strict` false, conditions): a
/// failure — a text that is no number in arithmetic, division by zero, a truth value used
/// as a number — is NULL where it happens, so the condition is UNKNOWN. Strict
/// (transformation expressions): it is an error that says what failed, since a value
/// computed from it would be wrong, not absent. Over the budget is an error either way.
pub(super) fn eval(node: &Node, ctx: &dyn ConditionContext, strict: bool, b: &mut Budget) -> Result<Value, Fail> {
    b.charge(1)?;
    Ok(match node {
        Node::Lit(v) => {
            b.charge(cost(v))?;
            v.clone()
        }
        Node::Name { prop, original } => match ctx.property(prop) {
            Some(v) => seen(v, &|| prop.clone(), b)?,
            None => seen(ctx.user_property(original), &|| original.clone(), b)?,
        },
        Node::Prop(p) => seen(ctx.property(p).unwrap_or(Value::Null), &|| format!("tab.{p}"), b)?,
        Node::UserProp(p) => seen(ctx.user_property(p), &|| format!("\"{p}\""), b)?,
        Node::UserData(path) => user_data(path, false, ctx, b)?,
        Node::Source(path) => user_data(path, true, ctx, b)?,
        Node::Not(e) => tri(truth(&eval(e, ctx, strict, b)?).map(|b| !b)),
        Node::And(items) => junction(items, false, ctx, strict, b)?,
        Node::Or(items) => junction(items, true, ctx, strict, b)?,
        Node::Cmp(op, x, y) => {
            let (x, y) = (eval(x, ctx, strict, b)?, eval(y, ctx, strict, b)?);
            b.charge(cost(&x).min(cost(&y)))?;
            tri(compare(*op, &x, &y))
        }
        Node::IsNull { expr, negated } => {
            let is_null = matches!(eval(expr, ctx, strict, b)?, Value::Null);
            Value::Bool(is_null != *negated)
        }
        Node::Between { expr, low, high, negated } => {
            let x = eval(expr, ctx, strict, b)?;
            let (lo, hi) = (eval(low, ctx, strict, b)?, eval(high, ctx, strict, b)?);
            b.charge(cost(&x).min(cost(&lo)) + cost(&x).min(cost(&hi)))?;
            let r = and3(compare(CmpOp::Ge, &x, &lo), compare(CmpOp::Le, &x, &hi));
            tri(if *negated { r.map(|b| !b) } else { r })
        }
        Node::In { expr, list, negated } => {
            let x = eval(expr, ctx, strict, b)?;
            let r = in_list(&x, list, b)?;
            tri(if *negated { r.map(|b| !b) } else { r })
        }
        Node::Like { expr, pattern, negated } => {
            let x = eval(expr, ctx, strict, b)?;
            match like(&x, pattern, ctx, strict, b)? {
                Some(matched) => Value::Bool(matched != *negated),
                None => Value::Null,
            }
        }
        Node::Arith(op, x, y) => {
            let (x, y) = (eval(x, ctx, strict, b)?, eval(y, ctx, strict, b)?);
            arith(*op, &x, &y, strict, b)?
        }
        Node::Neg(e) => match eval(e, ctx, strict, b)? {
            Value::Null => Value::Null,
            v => {
                b.charge(cost(&v))?;
                number(&v, strict)?.map_or(Value::Null, |n| num_value(-n))
            }
        },
        Node::Concat(x, y) => {
            let (x, y) = (eval(x, ctx, strict, b)?, eval(y, ctx, strict, b)?);
            concat(&x, &y, strict, b)?
        }
        Node::Call(func, args) => {
            let mut vals = Vec::with_capacity(args.len());
            for a in args {
                vals.push(eval(a, ctx, strict, b)?);
            }
            b.charge(vals.iter().map(cost).sum::<u64>())?;
            let out = call(*func, &vals, strict, b)?;
            if let Value::Text(s) = &out {
                b.text(s.len(), &format!("the result of {}", func.name()))?;
                b.charge(cost(&out))?;
            }
            out
        }
        Node::Case { operand, whens, otherwise } => {
            case(operand.as_deref(), whens, otherwise.as_deref(), ctx, strict, b)?
        }
    })
}

/// `AND` (`stop_at` false) or `OR` (true) of `items`, in three-valued logic: the first
/// item that is `stop_at` decides (the rest are not evaluated), else UNKNOWN if any is.
fn junction(
    items: &[Node],
    stop_at: bool,
    ctx: &dyn ConditionContext,
    strict: bool,
    b: &mut Budget,
) -> Result<Value, Fail> {
    let mut unknown = false;
    for i in items {
        match truth(&eval(i, ctx, strict, b)?) {
            Some(t) if t == stop_at => return Ok(Value::Bool(stop_at)),
            Some(_) => {}
            None => unknown = true,
        }
    }
    Ok(if unknown { Value::Null } else { Value::Bool(!stop_at) })
}

/// Whether `x` is among `list`: true at the first equal value, else UNKNOWN if a
/// comparison was, else false.
fn in_list(x: &Value, list: &[Value], b: &mut Budget) -> Result<Option<bool>, Fail> {
    let mut r = Some(false);
    for v in list {
        b.charge(cost(x).min(cost(v)))?;
        match compare(CmpOp::Eq, x, v) {
            Some(true) => return Ok(Some(true)),
            Some(false) => {}
            None => r = None,
        }
    }
    Ok(r)
}

/// Whether `x` matches the `LIKE` pattern; `None` (UNKNOWN) when either is no text or a
/// computed pattern is invalid.
fn like(
    x: &Value,
    pattern: &LikePattern,
    ctx: &dyn ConditionContext,
    strict: bool,
    b: &mut Budget,
) -> Result<Option<bool>, Fail> {
    b.charge(2 * cost(x))?;
    let Some(text) = to_text(x) else { return Ok(None) };
    let chars: Vec<char> = text.chars().collect();
    Ok(Some(match pattern {
        LikePattern::Static(toks) => like_match(&chars, toks, b)?,
        LikePattern::Dynamic { pattern, escape } => {
            let p = eval(pattern, ctx, strict, b)?;
            b.charge(2 * cost(&p))?;
            let Some(p) = to_text(&p) else { return Ok(None) };
            match compile_like(&p, *escape) {
                Ok(toks) => like_match(&chars, &toks, b)?,
                Err(_) => return Ok(None),
            }
        }
    }))
}

/// `x op y`: NULL when either is; division by zero and overflow fail (NULL when lenient).
fn arith(op: ArithOp, x: &Value, y: &Value, strict: bool, b: &mut Budget) -> Result<Value, Fail> {
    let fail = |why: String| if strict { Err(Fail::Error(why)) } else { Ok(Value::Null) };
    if matches!(x, Value::Null) || matches!(y, Value::Null) {
        return Ok(Value::Null);
    }
    b.charge(cost(x) + cost(y))?;
    let (Some(x), Some(y)) = (number(x, strict)?, number(y, strict)?) else { return Ok(Value::Null) };
    let n = match op {
        ArithOp::Add => x + y,
        ArithOp::Sub => x - y,
        ArithOp::Mul => x * y,
        ArithOp::Div if y == 0.0 => return fail("division by zero".into()),
        ArithOp::Div => x / y,
    };
    if !n.is_finite() {
        return fail("numeric overflow".into());
    }
    Ok(Value::Number(n))
}

/// `CASE [x] WHEN … THEN … [ELSE …] END`: the result of the first `WHEN` equal to the
/// operand (or true, without one), else the `ELSE`'s, else NULL.
fn case(
    operand: Option<&Node>,
    whens: &[(Node, Node)],
    otherwise: Option<&Node>,
    ctx: &dyn ConditionContext,
    strict: bool,
    b: &mut Budget,
) -> Result<Value, Fail> {
    let subject = match operand {
        Some(o) => Some(eval(o, ctx, strict, b)?),
        None => None,
    };
    for (when, then) in whens {
        let w = eval(when, ctx, strict, b)?;
        let hit = match &subject {
            Some(s) => {
                b.charge(cost(s).min(cost(&w)))?;
                compare(CmpOp::Eq, s, &w) == Some(true)
            }
            None => truth(&w) == Some(true),
        };
        if hit {
            return eval(then, ctx, strict, b);
        }
    }
    match otherwise {
        Some(o) => eval(o, ctx, strict, b),
        None => Ok(Value::Null),
    }
}

/// A non-NULL operand of arithmetic as a number: `None` (lenient) or an error (strict)
/// when it is none.
fn number(v: &Value, strict: bool) -> Result<Option<f64>, String> {
    match to_num(v) {
        Some(n) => Ok(Some(n)),
        None if !strict => Ok(None),
        None => Err(match v {
            Value::Text(s) => format!("invalid number {}", quoted(s)),
            Value::Bool(_) => "a condition (true/false) is not a number".into(),
            _ => "not a number".into(),
        }),
    }
}

/// `a || b`: NULL is the empty string (Oracle). The result's length is checked before it
/// is made.
fn concat(a: &Value, b: &Value, strict: bool, budget: &mut Budget) -> Result<Value, Fail> {
    let piece = |v: &Value| match v {
        Value::Null => Ok(Some(String::new())),
        Value::Bool(_) if strict => Err("a condition (true/false) is not a text".to_string()),
        v => Ok(to_text(v)),
    };
    Ok(match (piece(a)?, piece(b)?) {
        (Some(x), Some(y)) => {
            budget.text(x.len() + y.len(), "a concatenation")?;
            budget.charge((x.len() + y.len()) as u64 + 1)?;
            text_value(x + &y)
        }
        _ => Value::Null,
    })
}

/// A value quoted for an error message, shortened if long.
fn quoted(s: &str) -> String {
    format!("'{}'", truncate(s, 40))
}

/// Oracle-style integer argument (truncated toward zero).
pub(super) fn int_arg(v: Option<&Value>) -> Option<i64> {
    let n = to_num(v?)?.trunc();
    // `as` saturates; the clamp keeps later arithmetic far from overflow.
    Some((n as i64).clamp(-(1 << 40), 1 << 40))
}

pub(super) fn call(func: Func, args: &[Value], strict: bool, budget: &mut Budget) -> Result<Value, Fail> {
    let text0 = || args.first().and_then(to_text);
    Ok(match func {
        Func::Upper => text0().map_or(Value::Null, |s| text_value(s.to_uppercase())),
        Func::Lower => text0().map_or(Value::Null, |s| text_value(s.to_lowercase())),
        Func::Length => text0().map_or(Value::Null, |s| Value::Number(s.chars().count() as f64)),
        Func::Substr => {
            let (Some(s), Some(pos)) = (text0(), int_arg(args.get(1))) else { return Ok(Value::Null) };
            let len = match args.get(2) {
                None => None,
                Some(v) => match int_arg(Some(v)) {
                    Some(l) if l >= 1 => Some(l),
                    _ => return Ok(Value::Null),
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
                return Ok(Value::Null);
            }
            let end = len.map_or(n, |l| (start + l).min(n));
            let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
                return Ok(Value::Null);
            };
            chars.get(start..end).map_or(Value::Null, |c| text_value(c.iter().collect()))
        }
        Func::Trim(side) => {
            let Some(s) = text0() else { return Ok(Value::Null) };
            let ch = match args.get(1) {
                None => ' ',
                Some(v) => {
                    let Some(t) = to_text(v) else { return Ok(Value::Null) };
                    let mut it = t.chars();
                    match (it.next(), it.next()) {
                        (Some(c), None) => c,
                        _ => return Ok(Value::Null),
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
        Func::Coalesce => args.iter().find(|v| !matches!(v, Value::Null)).cloned().unwrap_or(Value::Null),
        Func::Abs => args.first().and_then(to_num).map_or(Value::Null, |n| num_value(n.abs())),
        Func::Round => {
            let Some(n) = args.first().and_then(to_num) else { return Ok(Value::Null) };
            let places = match args.get(1) {
                None => 0,
                Some(v) => match int_arg(Some(v)) {
                    Some(p) => p.clamp(-400, 400),
                    None => return Ok(Value::Null),
                },
            };
            num_value(round_half_away(n, places))
        }
        Func::ToChar => match args.first() {
            None | Some(Value::Null) => Value::Null,
            Some(v @ (Value::Number(_) | Value::Text(_))) => to_text(v).map_or(Value::Null, text_value),
            Some(Value::Bool(_)) if strict => return Err(Fail::Error("TO_CHAR of a condition (true/false)".into())),
            Some(Value::Bool(_)) => Value::Null,
        },
        Func::ToNumber => match args.first() {
            None | Some(Value::Null) => Value::Null,
            Some(v) => match number(v, strict)? {
                Some(n) => Value::Number(n),
                None => Value::Null,
            },
        },
        Func::Concat => match (args.first(), args.get(1)) {
            (Some(a), Some(b)) => concat(a, b, strict, budget)?,
            _ => Value::Null,
        },
    })
}

/// Oracle ROUND(n, d): half away from zero at `d` decimal places (d may be < 0).
pub(super) fn round_half_away(n: f64, places: i64) -> f64 {
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
