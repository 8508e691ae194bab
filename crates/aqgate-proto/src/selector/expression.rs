//! Transformation expressions (DBMS_TRANSFORM's attribute transformations): one value
//! computed from a message, in the condition language's syntax, through the same four gates.
//!
//! The differences from a condition:
//!
//! * Names are `source` (the whole payload: the hex of a RAW payload) and
//!   `source.<attribute>[.<attribute>...]` (payload attributes, as `tab.user_data...` in a
//!   condition); anything else is refused.
//! * The result is a value, not a truth value; comparisons, `AND`/`OR`/`NOT`, `LIKE` etc.
//!   appear inside `CASE WHEN ... THEN ... [ELSE ...] END` (also `CASE x WHEN v THEN ...`).
//! * More functions: `TO_CHAR(x)`, `TO_NUMBER(x)`, `COALESCE(a, b, ...)`, `CONCAT(a, b)`.
//! * Evaluation is strict: what a condition takes as UNKNOWN — a text that is no number in
//!   arithmetic or `TO_NUMBER`, division by zero, overflow — is an error naming the cause,
//!   because a wrong value must not be stored as if it were NULL.

use super::*;

/// A parsed transformation expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Expression {
    root: Node,
}

/// What a value is known to be before any message is seen (type checking at topology load).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueType {
    Number,
    /// Text, dates (`YYYY-MM-DD HH:MM:SS`) included.
    Text,
    /// NULL, or a payload value whose type is not declared (XMLType elements).
    Unknown,
    /// An object or varray attribute: only copied whole, never computed with.
    Composite {
        path: String,
        type_name: String,
    },
}

impl Expression {
    /// Parses and checks `text` (at most [`MAX_CONDITION_CHARS`] characters).
    pub fn parse(text: &str) -> Result<Expression, ConditionError> {
        let (root, kind) = parse_text(text, Lang::Expression)?;
        if kind == Kind::Bool {
            return Err(ConditionError::Parse(
                "an expression gives a value, not a condition (use CASE WHEN ... THEN ... END)".into(),
            ));
        }
        Ok(Expression { root })
    }

    /// The value for one message (`ctx.user_data` answers `source...`); an error says what
    /// failed (division by zero, a text that is no number, ...).
    pub fn eval(&self, ctx: &dyn ConditionContext) -> Result<Value, String> {
        match eval(&self.root, ctx, true)? {
            Value::Bool(_) => Err("the expression gives a condition (true/false), not a value".into()),
            v => Ok(v),
        }
    }

    /// When the expression is just `source.<path>`: the path (an attribute copied as it is).
    pub fn as_path(&self) -> Option<&[String]> {
        match &self.root {
            Node::Source(p) => Some(p),
            _ => None,
        }
    }

    /// When the expression is a literal: its value (checked against the target at load).
    pub fn literal(&self) -> Option<&Value> {
        match &self.root {
            Node::Lit(v) => Some(v),
            _ => None,
        }
    }

    /// The static type of the value, given the type of each `source` path (`None`: it names
    /// nothing in the source type). Errors: an unknown path, an object used in a computation,
    /// a literal that is no number where a number is needed.
    pub fn value_type(&self, source: &dyn Fn(&[String]) -> Option<ValueType>) -> Result<ValueType, String> {
        infer(&self.root, source)
    }
}

impl std::str::FromStr for Expression {
    type Err = ConditionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Expression::parse(s)
    }
}

fn path_text(path: &[String]) -> String {
    if path.is_empty() { "source".into() } else { format!("source.{}", path.join(".")) }
}

/// The type of a value position; a composite is refused here (only a whole expression may be one).
fn scalar_type(node: &Node, source: &dyn Fn(&[String]) -> Option<ValueType>) -> Result<ValueType, String> {
    match infer(node, source)? {
        ValueType::Composite { path, type_name } => {
            Err(format!("{path} is of object type {type_name}: name one of its attributes"))
        }
        t => Ok(t),
    }
}

/// A value position where a number is needed: a text literal must be one.
fn numeric(node: &Node, source: &dyn Fn(&[String]) -> Option<ValueType>) -> Result<(), String> {
    if let Node::Lit(Value::Text(s)) = node
        && parse_number(s).is_none()
    {
        return Err(format!("'{}' is not a number", truncate(s, 40)));
    }
    scalar_type(node, source).map(|_| ())
}

fn infer(node: &Node, source: &dyn Fn(&[String]) -> Option<ValueType>) -> Result<ValueType, String> {
    let all = |nodes: &mut dyn Iterator<Item = &Node>| -> Result<Vec<ValueType>, String> {
        nodes.map(|n| scalar_type(n, source)).collect()
    };
    Ok(match node {
        Node::Lit(Value::Number(_)) => ValueType::Number,
        Node::Lit(Value::Text(_)) => ValueType::Text,
        Node::Lit(_) => ValueType::Unknown,
        Node::Source(path) => match source(path) {
            Some(t) => t,
            None => return Err(format!("{} names nothing in the source type", path_text(path))),
        },
        Node::Name { original, .. } => return Err(format!("{original}: not a source attribute")),
        Node::Prop(p) | Node::UserProp(p) => return Err(format!("{p}: not a source attribute")),
        Node::UserData(_) => return Err("tab.user_data: write source.<attribute>".into()),
        Node::Not(e) | Node::IsNull { expr: e, .. } | Node::In { expr: e, .. } => {
            scalar_type(e, source)?;
            ValueType::Unknown
        }
        Node::And(v) | Node::Or(v) => {
            all(&mut v.iter())?;
            ValueType::Unknown
        }
        Node::Cmp(_, a, b) => {
            all(&mut [a.as_ref(), b.as_ref()].into_iter())?;
            ValueType::Unknown
        }
        Node::Between { expr, low, high, .. } => {
            all(&mut [expr.as_ref(), low.as_ref(), high.as_ref()].into_iter())?;
            ValueType::Unknown
        }
        Node::Like { expr, pattern, .. } => {
            scalar_type(expr, source)?;
            if let LikePattern::Dynamic { pattern, .. } = pattern {
                scalar_type(pattern, source)?;
            }
            ValueType::Unknown
        }
        Node::Arith(_, a, b) => {
            numeric(a, source)?;
            numeric(b, source)?;
            ValueType::Number
        }
        Node::Neg(e) => {
            numeric(e, source)?;
            ValueType::Number
        }
        Node::Concat(a, b) => {
            all(&mut [a.as_ref(), b.as_ref()].into_iter())?;
            ValueType::Text
        }
        Node::Call(func, args) => {
            let types = all(&mut args.iter())?;
            match func {
                Func::Length | Func::Abs | Func::Round => ValueType::Number,
                Func::ToNumber => {
                    if let Some(a) = args.first() {
                        numeric(a, source)?;
                    }
                    ValueType::Number
                }
                Func::Nvl | Func::Coalesce => first_known(types),
                _ => ValueType::Text,
            }
        }
        Node::Case { operand, whens, otherwise } => {
            if let Some(o) = operand {
                scalar_type(o, source)?;
            }
            let mut results = Vec::with_capacity(whens.len() + 1);
            for (w, t) in whens {
                if operand.is_some() {
                    scalar_type(w, source)?;
                } else {
                    infer(w, source)?;
                }
                results.push(scalar_type(t, source)?);
            }
            if let Some(o) = otherwise {
                results.push(scalar_type(o, source)?);
            }
            first_known(results)
        }
    })
}

/// The type of NVL / COALESCE / CASE: that of the first branch whose type is known (Oracle
/// converts the others to it).
fn first_known(types: Vec<ValueType>) -> ValueType {
    types.into_iter().find(|t| *t != ValueType::Unknown).unwrap_or(ValueType::Unknown)
}
