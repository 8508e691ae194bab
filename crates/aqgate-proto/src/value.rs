//! Scalar values seen by selector conditions and subscriber rules.

/// A value a condition can compare: message properties, payload attributes, JMS
/// properties. SQL semantics: `Null` compares as unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Number(f64),
    Text(String),
    Bool(bool),
}
