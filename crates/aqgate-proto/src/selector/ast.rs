//! The condition AST: what gates 3 and 4 produce and evaluation walks, and the names a
//! condition refers to.

use crate::value::Value;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
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
    /// `source.<path>` of a transformation expression (evaluated as a payload attribute).
    Source(Vec<String>),
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
    /// `CASE [operand] WHEN .. THEN .. [ELSE ..] END` (transformation expressions only).
    Case {
        operand: Option<Box<Node>>,
        whens: Vec<(Node, Node)>,
        otherwise: Option<Box<Node>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum TrimSide {
    Both,
    Leading,
    Trailing,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Func {
    Upper,
    Lower,
    Length,
    Substr,
    /// args: `[string]` or `[string, trim_char]`
    Trim(TrimSide),
    Nvl,
    Abs,
    Round,
    // Transformation expressions only:
    ToChar,
    ToNumber,
    Coalesce,
    Concat,
}

impl Func {
    /// The function's name as a condition writes it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Func::Upper => "UPPER",
            Func::Lower => "LOWER",
            Func::Length => "LENGTH",
            Func::Substr => "SUBSTR",
            Func::Trim(_) => "TRIM",
            Func::Nvl => "NVL",
            Func::Abs => "ABS",
            Func::Round => "ROUND",
            Func::ToChar => "TO_CHAR",
            Func::ToNumber => "TO_NUMBER",
            Func::Coalesce => "COALESCE",
            Func::Concat => "CONCAT",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum LikePattern {
    /// Literal pattern, compiled (and validated) at parse time.
    Static(Vec<LikeTok>),
    /// Pattern computed per message; an invalid pattern yields UNKNOWN.
    Dynamic { pattern: Box<Node>, escape: Option<char> },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum LikeTok {
    Many,
    One,
    Lit(char),
}

impl Node {
    /// Calls `f` on this node and every node below it.
    pub(super) fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Node)) {
        f(self);
        match self {
            Node::Lit(_)
            | Node::Name { .. }
            | Node::Prop(_)
            | Node::UserProp(_)
            | Node::UserData(_)
            | Node::Source(_) => {}
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
            Node::Case { operand, whens, otherwise } => {
                if let Some(o) = operand {
                    o.visit(f);
                }
                for (w, t) in whens {
                    w.visit(f);
                    t.visit(f);
                }
                if let Some(o) = otherwise {
                    o.visit(f);
                }
            }
            Node::Like { expr, pattern, .. } => {
                expr.visit(f);
                if let LikePattern::Dynamic { pattern, .. } = pattern {
                    pattern.visit(f);
                }
            }
        }
    }

    pub(super) fn references_user_data(&self) -> bool {
        let mut found = false;
        self.visit(&mut |n| found |= matches!(n, Node::UserData(_) | Node::Source(_)));
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
