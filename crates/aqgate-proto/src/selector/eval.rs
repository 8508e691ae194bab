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

pub(super) fn eval(node: &Node, ctx: &dyn ConditionContext) -> Value {
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
pub(super) fn int_arg(v: Option<&Value>) -> Option<i64> {
    let n = to_num(v?)?.trunc();
    // `as` saturates; the clamp keeps later arithmetic far from overflow.
    Some((n as i64).clamp(-(1 << 40), 1 << 40))
}

pub(super) fn call(func: Func, args: &[Value]) -> Value {
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
