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

    /// The value for one message (`ctx.user_data` answers `source...`) within the default
    /// [`Limits`]; an error says what failed (division by zero, a text that is no number,
    /// ...).
    pub fn eval(&self, ctx: &dyn ConditionContext) -> Result<Value, String> {
        self.eval_within(ctx, &mut Budget::of(Limits::default()))
    }

    /// [`Expression::eval`], every step charged to `budget`; over it, an error that says so.
    pub fn eval_within(&self, ctx: &dyn ConditionContext, budget: &mut Budget) -> Result<Value, String> {
        match eval(&self.root, ctx, true, budget) {
            Ok(Value::Bool(_)) => Err("the expression gives a condition (true/false), not a value".into()),
            Ok(v) => Ok(v),
            Err(Fail::Error(e)) => Err(e),
            Err(Fail::Over(o)) => Err(format!("{}: {o}", OVER_BUDGET)),
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// `source.<path>` values by dotted path.
    struct Src(HashMap<&'static str, Value>);

    impl ConditionContext for Src {
        fn property(&self, _: &str) -> Option<Value> {
            None
        }
        fn user_data(&self, path: &[String]) -> Value {
            self.0.get(path.join(".").as_str()).cloned().unwrap_or(Value::Null)
        }
        fn user_property(&self, _: &str) -> Value {
            Value::Null
        }
    }

    fn src() -> Src {
        Src(HashMap::from([
            ("orderno", Value::Number(7.0)),
            ("customer.name", Value::Text("  Jane Smith ".into())),
            ("zip", Value::Text("94065".into())),
            ("code", Value::Text("X1".into())),
            ("zero", Value::Number(0.0)),
            ("huge", Value::Number(1e308)),
        ]))
    }

    fn eval(text: &str) -> Result<Value, String> {
        Expression::parse(text).unwrap_or_else(|e| panic!("{text}: {e}")).eval(&src())
    }

    fn text(s: &str) -> Result<Value, String> {
        Ok(Value::Text(s.into()))
    }

    #[test]
    fn paths_literals_operators_and_functions() {
        assert_eq!(eval("source.ORDERNO + 1000"), Ok(Value::Number(1007.0)));
        assert_eq!(eval("source.orderno * 2 - 4 / 2"), Ok(Value::Number(12.0)));
        assert_eq!(eval("-source.orderno"), Ok(Value::Number(-7.0)));
        assert_eq!(eval("UPPER(SUBSTR(TRIM(source.customer.name), 1, 6))"), text("JANE S"));
        assert_eq!(eval("LOWER('AbC') || '-' || LENGTH('four')"), text("abc-4"));
        assert_eq!(eval("CONCAT(TO_CHAR(source.orderno), 'x')"), text("7x"));
        assert_eq!(eval("TO_NUMBER(source.zip) / 100"), Ok(Value::Number(940.65)));
        assert_eq!(eval("source.zip + 1"), Ok(Value::Number(94066.0)), "implicit conversion");
        assert_eq!(eval("NVL(source.missing, 'none')"), text("none"));
        assert_eq!(eval("COALESCE(source.missing, NULL, 3, 4)"), Ok(Value::Number(3.0)));
        assert_eq!(eval("NULL"), Ok(Value::Null));
        assert_eq!(eval("source.missing + 1"), Ok(Value::Null), "NULL in arithmetic is NULL");
        assert_eq!(eval("source.missing || 'a'"), text("a"), "|| treats NULL as ''");
    }

    #[test]
    fn case_in_both_forms() {
        assert_eq!(
            eval("CASE WHEN source.orderno > 5 AND NOT source.code IS NULL THEN 'big' ELSE 'small' END"),
            text("big")
        );
        assert_eq!(eval("CASE source.code WHEN 'X0' THEN 0 WHEN 'X1' THEN 1 END"), Ok(Value::Number(1.0)));
        assert_eq!(eval("CASE source.code WHEN 'none' THEN 0 END"), Ok(Value::Null));
        assert_eq!(eval("CASE WHEN source.code LIKE 'X%' THEN 'x' END"), text("x"));
    }

    #[test]
    fn failures_are_errors_not_nulls() {
        assert_eq!(eval("source.orderno / source.zero"), Err("division by zero".into()));
        assert_eq!(eval("TO_NUMBER(source.code)"), Err("invalid number 'X1'".into()));
        assert_eq!(eval("source.code * 2"), Err("invalid number 'X1'".into()));
        assert_eq!(eval("source.huge * 10"), Err("numeric overflow".into()));
        // The same in a condition is UNKNOWN, as before.
        let c = Condition::parse("tab.user_data.orderno / 0 = 1").expect("condition");
        assert!(!c.eval(&src()));
    }

    #[test]
    fn refused_at_parse() {
        for (text, why) in [
            ("source.a = 1", "not a condition"),
            ("orderno + 1", "source.<attribute>"),
            ("tab.user_data.orderno", "source.<attribute>"),
            ("DBMS_LOCK.SLEEP(10)", "function call"),
            ("SELECT 1", "subquery"),
            ("source.a; DROP TABLE x", "`;`"),
        ] {
            let e = Expression::parse(text).expect_err(text).to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        // Conditions keep their language: no CASE, no transformation-only functions, no source.
        for text in ["CASE WHEN priority = 1 THEN 1 END = 1", "TO_CHAR(priority) = '1'", "source.a = 1"] {
            assert!(Condition::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn static_types() {
        let types = |p: &[String]| match p.join(".").as_str() {
            "orderno" => Some(ValueType::Number),
            "name" => Some(ValueType::Text),
            "customer" => {
                Some(ValueType::Composite { path: "source.customer".into(), type_name: "CUSTOMER_TYP".into() })
            }
            _ => None,
        };
        let ty = |text: &str| Expression::parse(text).expect(text).value_type(&types);
        assert_eq!(ty("source.orderno + 1"), Ok(ValueType::Number));
        assert_eq!(ty("source.name || 'x'"), Ok(ValueType::Text));
        assert_eq!(ty("NVL(NULL, source.orderno)"), Ok(ValueType::Number));
        assert_eq!(ty("CASE WHEN source.orderno > 1 THEN 'a' END"), Ok(ValueType::Text));
        assert!(matches!(ty("source.customer"), Ok(ValueType::Composite { .. })), "copied whole");
        assert_eq!(ty("source.nope"), Err("source.nope names nothing in the source type".into()));
        assert_eq!(
            ty("UPPER(source.customer)"),
            Err("source.customer is of object type CUSTOMER_TYP: name one of its attributes".into())
        );
        assert_eq!(ty("source.orderno + 'x'"), Err("'x' is not a number".into()));
    }
}
