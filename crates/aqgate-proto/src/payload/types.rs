//! Object type declarations (`[[types]]`): attribute types parsed from their SQL spelling,
//! and the registry that checks references, cycles and names once.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::*;

/// `kind` of a `[[types]]` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TypeKind {
    Object,
    Varray,
}

/// One `{ name, type }` of an object type's `attributes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttributeDef {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
}

/// A `[[types]]` entry: `CREATE TYPE name AS OBJECT (...)` or `AS VARRAY(max) OF element`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeDef {
    pub name: String,
    pub kind: TypeKind,
    /// Object types only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<AttributeDef>,
    /// Varray types only: the item type (any attribute type string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
    /// Varray types only: the most items a value may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
}

/// A parsed attribute type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AttrType {
    /// `precision` None: unconstrained (or `*`); `scale` None: unconstrained NUMBER / FLOAT.
    Number {
        precision: Option<u32>,
        scale: Option<i64>,
    },
    /// VARCHAR2 / CHAR and friends; `bytes`: the limit counts UTF-8 bytes, not characters.
    Text {
        max: usize,
        bytes: bool,
    },
    Date,
    /// Fractional-second digits allowed.
    Timestamp {
        frac: usize,
    },
    /// RAW(n) (`Some(n)`) or BLOB (`None`).
    Raw {
        max: Option<usize>,
    },
    Clob,
    Xml,
    /// Another declared object or varray type (upper-case, no schema).
    Named(String),
}

/// An attribute type with its canonical spelling, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ty {
    pub(super) kind: AttrType,
    pub(super) decl: String,
}

#[derive(Debug, Clone)]
pub(super) struct Attr {
    pub(super) name: String,
    pub(super) ty: Ty,
}

#[derive(Debug, Clone)]
pub(super) enum Body {
    Object(Vec<Attr>),
    Varray { element: Ty, max: u32 },
}

/// The declared object and varray types, by upper-case name.
#[derive(Debug, Clone, Default)]
pub struct TypeRegistry {
    pub(super) types: BTreeMap<String, Body>,
}

pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#'))
        && s.len() <= 128
}

/// `[schema.]name` → upper-case `NAME`, or None if not a (qualified) identifier.
pub(super) fn type_name(s: &str) -> Option<String> {
    let up = s.trim().to_ascii_uppercase();
    let parts: Vec<&str> = up.split('.').collect();
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| is_identifier(p)) {
        return None;
    }
    parts.last().map(|p| (*p).to_string())
}

pub(super) fn parse_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

pub(super) fn parse_i64(s: &str) -> Option<i64> {
    let t = s.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

pub(super) fn number_decl(precision: Option<u32>, scale: Option<i64>) -> String {
    match (precision, scale) {
        (None, None) => "NUMBER".into(),
        (Some(p), Some(0)) => format!("NUMBER({p})"),
        (Some(p), Some(s)) => format!("NUMBER({p},{s})"),
        (None, Some(s)) => format!("NUMBER(*,{s})"),
        (Some(p), None) => format!("NUMBER({p})"),
    }
}

/// Parses a built-in type; `Ok(None)` if the string is not a built-in type keyword.
pub(super) fn parse_builtin(s: &str) -> Result<Option<Ty>, String> {
    let up = s.trim().to_ascii_uppercase();
    let (base, args) = match up.find('(') {
        Some(i) => {
            let Some(inner) = up[i + 1..].strip_suffix(')') else {
                return Err(format!("unbalanced parentheses in type '{}'", s.trim()));
            };
            (up[..i].trim(), Some(inner.split(',').map(str::trim).collect::<Vec<_>>()))
        }
        None => (up.as_str(), None),
    };
    let bad = || format!("invalid type '{}'", s.trim());
    let args = args.as_deref();
    let ty = match base {
        "NUMBER" | "DECIMAL" | "NUMERIC" => {
            let (precision, scale) = match args {
                None if base == "NUMBER" => (None, None),
                None => (Some(38), Some(0)),
                Some([p]) => (Some(parse_u32(p).ok_or_else(bad)?), Some(0)),
                Some([p, sc]) => {
                    let p = if *p == "*" { None } else { Some(parse_u32(p).ok_or_else(bad)?) };
                    (p, Some(parse_i64(sc).ok_or_else(bad)?))
                }
                Some(_) => return Err(bad()),
            };
            if let Some(p) = precision
                && !(1..=38).contains(&p)
            {
                return Err(format!("{}: precision must be 1 to 38", s.trim()));
            }
            if let Some(sc) = scale
                && !(-84..=127).contains(&sc)
            {
                return Err(format!("{}: scale must be -84 to 127", s.trim()));
            }
            Ty { kind: AttrType::Number { precision, scale }, decl: number_decl(precision, scale) }
        }
        "INTEGER" | "INT" | "SMALLINT" if args.is_none() => {
            Ty { kind: AttrType::Number { precision: Some(38), scale: Some(0) }, decl: base.to_string() }
        }
        "FLOAT" | "BINARY_FLOAT" | "BINARY_DOUBLE" => {
            match args {
                None => {}
                Some([p]) if base == "FLOAT" && parse_u32(p).is_some_and(|p| (1..=126).contains(&p)) => {}
                Some(_) => return Err(bad()),
            }
            Ty { kind: AttrType::Number { precision: None, scale: None }, decl: base.to_string() }
        }
        "VARCHAR2" | "VARCHAR" | "NVARCHAR2" | "CHAR" | "NCHAR" => {
            let (max, bytes) = match args {
                None if base == "CHAR" || base == "NCHAR" => (1, false),
                Some([a]) => {
                    let mut words = a.split_whitespace();
                    let n = words.next().and_then(parse_u32).ok_or_else(bad)?;
                    let bytes = match words.next() {
                        None | Some("CHAR") => false,
                        Some("BYTE") if !base.starts_with('N') => true,
                        Some(_) => return Err(bad()),
                    };
                    if words.next().is_some() {
                        return Err(bad());
                    }
                    (n, bytes)
                }
                _ => return Err(format!("{}: a length is required, e.g. {base}(30)", s.trim())),
            };
            if !(1..=32767).contains(&max) {
                return Err(format!("{}: length must be 1 to 32767", s.trim()));
            }
            let unit = if bytes { " BYTE" } else { "" };
            Ty { kind: AttrType::Text { max: max as usize, bytes }, decl: format!("{base}({max}{unit})") }
        }
        "DATE" if args.is_none() => Ty { kind: AttrType::Date, decl: "DATE".into() },
        "TIMESTAMP" => {
            let frac = match args {
                None => 6,
                Some([f]) => parse_u32(f).filter(|f| *f <= 9).ok_or_else(bad)?,
                Some(_) => return Err(bad()),
            };
            let decl = if args.is_none() { "TIMESTAMP".to_string() } else { format!("TIMESTAMP({frac})") };
            Ty { kind: AttrType::Timestamp { frac: frac as usize }, decl }
        }
        "RAW" => {
            let Some([n]) = args else {
                return Err(format!("{}: a length is required, e.g. RAW(16)", s.trim()));
            };
            let n = parse_u32(n).filter(|n| (1..=32767).contains(n)).ok_or_else(bad)?;
            Ty { kind: AttrType::Raw { max: Some(n as usize) }, decl: format!("RAW({n})") }
        }
        "BLOB" if args.is_none() => Ty { kind: AttrType::Raw { max: None }, decl: "BLOB".into() },
        "CLOB" | "NCLOB" if args.is_none() => Ty { kind: AttrType::Clob, decl: base.to_string() },
        "XMLTYPE" | "SYS.XMLTYPE" if args.is_none() => Ty { kind: AttrType::Xml, decl: "XMLTYPE".into() },
        "INTEGER" | "INT" | "SMALLINT" | "DATE" | "BLOB" | "CLOB" | "NCLOB" | "XMLTYPE" | "SYS.XMLTYPE" => {
            return Err(bad());
        }
        _ => return Ok(None),
    };
    Ok(Some(ty))
}

/// Parses an attribute type string: a built-in type or a (qualified) type name.
pub(super) fn parse_attr_type(s: &str) -> Result<Ty, String> {
    if let Some(ty) = parse_builtin(s)? {
        return Ok(ty);
    }
    match type_name(s) {
        Some(n) => Ok(Ty { kind: AttrType::Named(n.clone()), decl: n }),
        None => Err(format!("invalid type '{}'", s.trim())),
    }
}

/// Names a declared type may not take: the built-in types, and the elements that name a
/// payload's type in an ANYDATA queue (`<JMS_TEXT_MESSAGE>`, …).
pub(super) fn is_reserved_type_name(n: &str) -> bool {
    n == "RAW"
        || n.starts_with("AQ$_JMS_")
        || matches!(
            n,
            "JMS_TEXT_MESSAGE" | "JMS_MAP_MESSAGE" | "JMS_BYTES_MESSAGE" | "JMS_OBJECT_MESSAGE" | "ANYDATA" | "XMLTYPE"
        )
        || matches!(parse_builtin(n), Ok(Some(_)) | Err(_))
}

impl TypeRegistry {
    /// Whether `tab.user_data.<path>` (lower-case segments) can name something in a payload
    /// of `kind`: an attribute chain of the object type (not through a VARRAY), any element
    /// path of an XMLType, a JMS message's `text_data` / `text_vc` / `text_len` /
    /// `header.<field>`; a RAW payload has only itself (the empty path); an ANYDATA payload
    /// has nothing a condition can name.
    pub fn has_user_data_path(&self, kind: &PayloadKind, path: &[String]) -> bool {
        if *kind == PayloadKind::AnyData {
            return false;
        }
        if path.is_empty() {
            return true;
        }
        match kind {
            PayloadKind::Raw => false,
            PayloadKind::Xml => true,
            PayloadKind::Object(t) => {
                let mut ty = AttrType::Named(t.clone());
                for seg in path {
                    let AttrType::Named(name) = &ty else { return false };
                    let Some(Body::Object(attrs)) = self.types.get(name) else { return false };
                    let Some(a) = attrs.iter().find(|a| a.name.eq_ignore_ascii_case(seg)) else { return false };
                    ty = a.ty.kind.clone();
                }
                true
            }
            _ => match path {
                [s] => ["text_data", "text_vc", "text_len"].iter().any(|t| s.eq_ignore_ascii_case(t)),
                [h, _] => h.eq_ignore_ascii_case("header"),
                _ => false,
            },
        }
    }

    /// Builds the registry; checks names, attribute type strings, that referenced types exist
    /// and that no type contains itself. All problems are reported in one error.
    pub fn new(defs: Vec<TypeDef>) -> Result<Self, PayloadError> {
        let mut errors = Vec::new();
        let mut types: BTreeMap<String, Body> = BTreeMap::new();
        for (i, d) in defs.iter().enumerate() {
            let Some(name) = type_name(&d.name) else {
                errors.push(format!("types[{i}]: invalid type name '{}'", d.name));
                continue;
            };
            if is_reserved_type_name(&name) {
                errors.push(format!("{name}: the name of a built-in type"));
                continue;
            }
            if types.contains_key(&name) {
                errors.push(format!("{name}: declared more than once"));
                continue;
            }
            let body = match d.kind {
                TypeKind::Object => {
                    if d.element.is_some() || d.max.is_some() {
                        errors.push(format!("{name}: `element` and `max` are for varray types"));
                    }
                    if d.attributes.is_empty() {
                        errors.push(format!("{name}: an object type needs at least one attribute"));
                    }
                    let mut attrs: Vec<Attr> = Vec::new();
                    for a in &d.attributes {
                        let an = a.name.trim().to_ascii_uppercase();
                        if !is_identifier(&an) {
                            errors.push(format!("{name}: invalid attribute name '{}'", a.name));
                            continue;
                        }
                        if attrs.iter().any(|x| x.name == an) {
                            errors.push(format!("{name}.{an}: declared more than once"));
                            continue;
                        }
                        match parse_attr_type(&a.ty) {
                            Ok(ty) => attrs.push(Attr { name: an, ty }),
                            Err(e) => errors.push(format!("{name}.{an}: {e}")),
                        }
                    }
                    Body::Object(attrs)
                }
                TypeKind::Varray => {
                    if !d.attributes.is_empty() {
                        errors.push(format!("{name}: `attributes` are for object types"));
                    }
                    let max = match d.max {
                        Some(m) if m >= 1 => m,
                        Some(_) => {
                            errors.push(format!("{name}: `max` must be at least 1"));
                            1
                        }
                        None => {
                            errors.push(format!("{name}: a varray type needs `max`"));
                            1
                        }
                    };
                    let element = match d.element.as_deref().map(parse_attr_type) {
                        Some(Ok(ty)) => ty,
                        Some(Err(e)) => {
                            errors.push(format!("{name}.element: {e}"));
                            continue;
                        }
                        None => {
                            errors.push(format!("{name}: a varray type needs `element`"));
                            continue;
                        }
                    };
                    Body::Varray { element, max }
                }
            };
            types.insert(name, body);
        }

        for (name, body) in &types {
            for (what, ty) in refs(body) {
                if let AttrType::Named(r) = &ty.kind
                    && !types.contains_key(r)
                {
                    errors.push(format!("{name}.{what}: unknown type {r}"));
                }
            }
        }
        if errors.is_empty() {
            let mut done = BTreeSet::new();
            for name in types.keys() {
                let mut stack = Vec::new();
                if let Some(cycle) = find_cycle(&types, name, &mut stack, &mut done) {
                    errors.push(format!("type cycle: {}", cycle.join(" -> ")));
                    break;
                }
            }
        }
        if errors.is_empty() { Ok(Self { types }) } else { Err(PayloadError::Definition(errors)) }
    }

    /// Whether `name` (upper-case, no schema) is a declared object or varray type.
    pub fn contains(&self, name: &str) -> bool {
        self.types.contains_key(name) || self.types.contains_key(&name.to_ascii_uppercase())
    }
}

/// The types a body refers to, with the attribute name (or `element`).
pub(super) fn refs(body: &Body) -> Vec<(&str, &Ty)> {
    match body {
        Body::Object(attrs) => attrs.iter().map(|a| (a.name.as_str(), &a.ty)).collect(),
        Body::Varray { element, .. } => vec![("element", element)],
    }
}

pub(super) fn find_cycle(
    types: &BTreeMap<String, Body>,
    name: &str,
    stack: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if done.contains(name) {
        return None;
    }
    if let Some(pos) = stack.iter().position(|s| s == name) {
        let mut cycle = stack[pos..].to_vec();
        cycle.push(name.to_string());
        return Some(cycle);
    }
    stack.push(name.to_string());
    if let Some(body) = types.get(name) {
        for (_, ty) in refs(body) {
            if let AttrType::Named(r) = &ty.kind
                && let Some(c) = find_cycle(types, r, stack, done)
            {
                return Some(c);
            }
        }
    }
    stack.pop();
    done.insert(name.to_string());
    None
}
