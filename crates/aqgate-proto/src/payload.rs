//! Message payloads: validation on enqueue, canonical stored form, XML on dequeue, and
//! payload attribute lookups for selector conditions (reference: "Message Payloads",
//! Table 9-2, "XMLType Queues").
//!
//! Every queue has a [`PayloadKind`] (from its queue table's `payload_type`):
//!
//! * `RAW`: `<raw>hex</raw>`; stored as the bytes themselves; returned as `<raw>UPPERHEX</raw>`.
//! * an object type (ADT) declared in `[[types]]`: `<ORDER_TYP>` with one child element per
//!   attribute; checked against the declaration and stored as canonical XML text.
//! * `SYS.AQ$_JMS_{TEXT,MAP,BYTES,OBJECT}_MESSAGE`: `<jms_text_message>` etc. with
//!   `oracle_jms_properties`, `user_properties` and `text_data` / `map_data` / `bytes_data` /
//!   `ser_object_data`; checked and stored as canonical XML text.
//! * `SYS.XMLTYPE`: any single element, stored as serialized XML and returned unchanged.
//!
//! # Declaring object types (topology TOML)
//!
//! ```toml
//! [[types]]
//! name = "EMP_TYP"                  # upper-cased; a schema prefix ("AQUSER.EMP_TYP") is dropped
//! kind = "object"                   # CREATE TYPE ... AS OBJECT
//! attributes = [ { name = "EMPNO", type = "NUMBER(4)" }, { name = "ENAME", type = "VARCHAR2(10)" },
//!                { name = "HIREDATE", type = "DATE" }, { name = "SAL", type = "NUMBER(7,2)" } ]
//!
//! [[types]]
//! name = "LINEITEMS_VARTYP"
//! kind = "varray"                   # CREATE TYPE ... AS VARRAY(max) OF element
//! element = "LINEITEM_TYP"
//! max = 250
//! ```
//!
//! Keys are exactly `name`, `kind` (`object` | `varray`), `attributes` (objects only: a list of
//! `{ name, type }`), `element` and `max` (varrays only, both required); unknown keys are
//! rejected. Attribute (and varray element) types: `NUMBER`, `NUMBER(p)`, `NUMBER(p,s)`,
//! `NUMBER(*,s)`, `INTEGER` (also `INT`, `SMALLINT`, `DECIMAL`/`NUMERIC[(p[,s])]`, `FLOAT`),
//! `VARCHAR2(n [CHAR|BYTE])` (also `VARCHAR`, `NVARCHAR2`), `CHAR[(n)]` (also `NCHAR`), `DATE`,
//! `TIMESTAMP[(f)]`, `RAW(n)`, `BLOB`, `CLOB` (also `NCLOB`), `XMLTYPE`, or the name of another
//! declared type (optionally schema-qualified). [`TypeRegistry::new`] reports every problem
//! at once: unknown referenced types, cycles, duplicate names, unparsable type strings.
//!
//! # Object payloads
//!
//! Element names match attribute names case-insensitively; the canonical form uses the declared
//! upper-case names in declared order. A missing attribute, or an empty scalar element, is
//! NULL and omitted (Oracle: `''` is NULL). A present but empty object / varray element is kept
//! (an object with NULL attributes, an empty collection). Varray items may have any element
//! name; they come back as `<ATTR_ITEM>` (as in the reference examples), at most `max` of them.
//! XML attributes on object payload elements are ignored. Values: NUMBER is decimal text
//! (optional sign, fraction, exponent); with a scale it is rounded half-up like Oracle, and a
//! value with too many integer digits is rejected; the client's text is kept unless rounding
//! changed the value. VARCHAR2/CHAR lengths count characters (bytes with `BYTE`); text is kept
//! exactly (CHAR is not blank-padded). DATE accepts `YYYY-MM-DD`, `YYYY-MM-DD H:M:S` (1-2 digit
//! time parts, as the reference's `1996-01-01 0:0:0`) and `YYYY-MM-DDTHH:MM:SS`, real calendar
//! dates only, and is kept as the client wrote it. TIMESTAMP additionally allows fractional
//! seconds (at most the declared precision, default 6). RAW/BLOB are hex (returned upper-case).
//! XMLTYPE attributes keep their child content verbatim.
//!
//! # Stored forms
//!
//! RAW: the bytes. Everything else: UTF-8 canonical XML text of the canonical element (no XML
//! declaration, no layout whitespace), written by a small escaping serializer here and read back
//! with quick-xml (DOCTYPE rejected). Decoding does not re-validate against the current type
//! declarations (they may have changed since the enqueue); it checks the root element only.
//!
//! # Selector lookups ([`PayloadView`])
//!
//! `tab.user_data.a.b`: object attributes (NUMBER → `Value::Number`, DATE/TIMESTAMP →
//! `Value::Text("YYYY-MM-DD HH:MM:SS[.f]")`, other scalars → `Value::Text`, objects, varrays and
//! absent values → `Value::Null`). For RAW queues the empty path gives the upper-case hex. For
//! JMS queues: `text_data` (or `text_vc`), `text_len`, `header.{type,appid,groupid,group_sequence}`.
//! For XMLType queues: a path of child elements (text of a leaf element).
//!
//! JMS user properties: exact name first, then case-insensitive; typed values. If there is no
//! user property of that name, the JMS header fields answer to `type`/`JMSType`,
//! `appid`/`JMSXAppID`, `groupid`/`JMSXGroupID`, `group_sequence`/`JMSXGroupSeq`.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;
use serde::{Deserialize, Serialize};

use crate::idap::model::{XmlChild, XmlNode};
use crate::value::Value;

/// Deepest element nesting written or read back by the stored-form codec.
const MAX_XML_DEPTH: usize = 256;
/// Longest `type`, `appid`, `groupid` in `oracle_jms_properties` (`aq$_jms_header`).
const JMS_HEADER_MAX: usize = 100;
/// Oracle NUMBER range: |x| < 1E126.
const NUMBER_MAX_EXP: i64 = 125;

// ---- errors -------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// A queue table's `payload_type` is not usable.
    #[error("invalid payload type '{name}': {reason}")]
    BadKind { name: String, reason: String },
    /// Problems in the `[[types]]` declarations, all of them.
    #[error("{}", .0.join("; "))]
    Definition(Vec<String>),
    /// The payload element is not the one the queue's payload type needs.
    #[error("expected <{expected}> payload for {queue}, got <{got}>")]
    WrongRoot { expected: String, queue: String, got: String },
    /// A value or element does not fit; `path` names it (`ORDER_TYP.CUSTOMER.ZIP`).
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// Stored bytes that are not a stored form of this kind.
    #[error("corrupt stored payload: {0}")]
    Corrupt(String),
}

fn invalid(path: &str, message: impl Into<String>) -> PayloadError {
    PayloadError::Invalid { path: path.to_string(), message: message.into() }
}

/// A value quoted for an error message, shortened if long.
fn quote(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        format!("'{s}'")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("'{head}...'")
    }
}

// ---- type declarations --------------------------------------------------------------------

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
enum AttrType {
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
struct Ty {
    kind: AttrType,
    decl: String,
}

#[derive(Debug, Clone)]
struct Attr {
    name: String,
    ty: Ty,
}

#[derive(Debug, Clone)]
enum Body {
    Object(Vec<Attr>),
    Varray { element: Ty, max: u32 },
}

/// The declared object and varray types, by upper-case name.
#[derive(Debug, Clone, Default)]
pub struct TypeRegistry {
    types: BTreeMap<String, Body>,
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#'))
        && s.len() <= 128
}

/// `[schema.]name` → upper-case `NAME`, or None if not a (qualified) identifier.
fn type_name(s: &str) -> Option<String> {
    let up = s.trim().to_ascii_uppercase();
    let parts: Vec<&str> = up.split('.').collect();
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| is_identifier(p)) {
        return None;
    }
    parts.last().map(|p| (*p).to_string())
}

fn parse_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_i64(s: &str) -> Option<i64> {
    let t = s.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

fn number_decl(precision: Option<u32>, scale: Option<i64>) -> String {
    match (precision, scale) {
        (None, None) => "NUMBER".into(),
        (Some(p), Some(0)) => format!("NUMBER({p})"),
        (Some(p), Some(s)) => format!("NUMBER({p},{s})"),
        (None, Some(s)) => format!("NUMBER(*,{s})"),
        (Some(p), None) => format!("NUMBER({p})"),
    }
}

/// Parses a built-in type; `Ok(None)` if the string is not a built-in type keyword.
fn parse_builtin(s: &str) -> Result<Option<Ty>, String> {
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
fn parse_attr_type(s: &str) -> Result<Ty, String> {
    if let Some(ty) = parse_builtin(s)? {
        return Ok(ty);
    }
    match type_name(s) {
        Some(n) => Ok(Ty { kind: AttrType::Named(n.clone()), decl: n }),
        None => Err(format!("invalid type '{}'", s.trim())),
    }
}

/// Names a declared type may not take.
fn is_reserved_type_name(n: &str) -> bool {
    n == "RAW" || n.starts_with("AQ$_JMS_") || matches!(parse_builtin(n), Ok(Some(_)) | Err(_))
}

impl TypeRegistry {
    /// Whether `tab.user_data.<path>` (lower-case segments) can name something in a payload
    /// of `kind`: an attribute chain of the object type (not through a VARRAY), any element
    /// path of an XMLType, a JMS message's `text_data` / `text_vc` / `text_len` /
    /// `header.<field>`; a RAW payload has only itself (the empty path).
    pub fn has_user_data_path(&self, kind: &PayloadKind, path: &[String]) -> bool {
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
fn refs(body: &Body) -> Vec<(&str, &Ty)> {
    match body {
        Body::Object(attrs) => attrs.iter().map(|a| (a.name.as_str(), &a.ty)).collect(),
        Body::Varray { element, .. } => vec![("element", element)],
    }
}

fn find_cycle(
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

// ---- payload kinds ------------------------------------------------------------------------

/// What a queue's messages hold (its queue table's `payload_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadKind {
    Raw,
    /// A declared object type, upper-case, without schema.
    Object(String),
    JmsText,
    JmsMap,
    JmsBytes,
    JmsObject,
    /// `SYS.XMLTYPE`.
    Xml,
}

impl PayloadKind {
    /// `RAW`, `SYS.AQ$_JMS_TEXT_MESSAGE` (also without `SYS.`, any case; likewise `_MAP_`,
    /// `_BYTES_`, `_OBJECT_MESSAGE`), `XMLTYPE` / `SYS.XMLTYPE`, else an object type name
    /// (`QS.ORDER_TYP` → `Object("ORDER_TYP")`). Whether the object type exists is the
    /// caller's check ([`TypeRegistry::contains`]).
    pub fn parse(s: &str) -> Result<Self, PayloadError> {
        let bad = |reason: &str| PayloadError::BadKind { name: s.to_string(), reason: reason.to_string() };
        let t = s.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        let up = t.to_ascii_uppercase();
        let parts: Vec<&str> = up.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| is_identifier(p)) {
            return Err(bad("expected RAW, SYS.AQ$_JMS_*_MESSAGE, SYS.XMLTYPE or [SCHEMA.]TYPE_NAME"));
        }
        let (schema, base) = match parts.as_slice() {
            [b] => (None, *b),
            [sch, b] => (Some(*sch), *b),
            _ => return Err(bad("not a type name")),
        };
        Ok(match base {
            "RAW" if schema.is_none() => PayloadKind::Raw,
            "AQ$_JMS_TEXT_MESSAGE" => PayloadKind::JmsText,
            "AQ$_JMS_MAP_MESSAGE" => PayloadKind::JmsMap,
            "AQ$_JMS_BYTES_MESSAGE" => PayloadKind::JmsBytes,
            "AQ$_JMS_OBJECT_MESSAGE" => PayloadKind::JmsObject,
            "XMLTYPE" if schema.is_none() || schema == Some("SYS") => PayloadKind::Xml,
            b if b.starts_with("AQ$_JMS_") => {
                return Err(bad("this JMS type is not supported through IDAP (text, map, bytes, object only)"));
            }
            b if is_reserved_type_name(b) => {
                return Err(bad("a queue payload is RAW, an object type, a JMS type or XMLTYPE"));
            }
            b => PayloadKind::Object(b.to_string()),
        })
    }

    /// Whether messages of this kind are JMS messages (with JMS properties).
    pub fn is_jms(&self) -> bool {
        self.jms_root().is_some()
    }

    /// The root element of a JMS payload.
    fn jms_root(&self) -> Option<(&'static str, &'static str)> {
        match self {
            PayloadKind::JmsText => Some(("jms_text_message", "text_data")),
            PayloadKind::JmsMap => Some(("jms_map_message", "map_data")),
            PayloadKind::JmsBytes => Some(("jms_bytes_message", "bytes_data")),
            PayloadKind::JmsObject => Some(("jms_object_message", "ser_object_data")),
            _ => None,
        }
    }
}

impl fmt::Display for PayloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadKind::Raw => f.write_str("RAW"),
            PayloadKind::Object(n) => f.write_str(n),
            PayloadKind::JmsText => f.write_str("SYS.AQ$_JMS_TEXT_MESSAGE"),
            PayloadKind::JmsMap => f.write_str("SYS.AQ$_JMS_MAP_MESSAGE"),
            PayloadKind::JmsBytes => f.write_str("SYS.AQ$_JMS_BYTES_MESSAGE"),
            PayloadKind::JmsObject => f.write_str("SYS.AQ$_JMS_OBJECT_MESSAGE"),
            PayloadKind::Xml => f.write_str("SYS.XMLTYPE"),
        }
    }
}

// ---- encode / decode ----------------------------------------------------------------------

/// Validates the `<message_payload>` element against the queue's payload kind and returns the
/// stored form.
pub fn encode(kind: &PayloadKind, reg: &TypeRegistry, node: &XmlNode) -> Result<Vec<u8>, PayloadError> {
    match kind {
        PayloadKind::Raw => {
            if !node.local_name().eq_ignore_ascii_case("raw") {
                return Err(PayloadError::WrongRoot {
                    expected: "raw".into(),
                    queue: "a RAW queue".into(),
                    got: node.name.clone(),
                });
            }
            let text = leaf_text(node, "raw")?;
            parse_hex(&text).map_err(|m| invalid("raw", m))
        }
        _ => {
            let canon = canonical(kind, reg, node)?;
            Ok(to_xml(&canon)?.into_bytes())
        }
    }
}

/// Turns a stored form back into the payload element (the canonical form of what was sent).
pub fn decode(kind: &PayloadKind, _reg: &TypeRegistry, stored: &[u8]) -> Result<XmlNode, PayloadError> {
    if *kind == PayloadKind::Raw {
        return Ok(leaf("raw", hex_upper(stored)));
    }
    let text = std::str::from_utf8(stored).map_err(|e| PayloadError::Corrupt(format!("not UTF-8: {e}")))?;
    let node = parse_xml(text).map_err(PayloadError::Corrupt)?;
    let expected = match kind {
        PayloadKind::Object(t) => Some(t.as_str()),
        PayloadKind::Xml | PayloadKind::Raw => None,
        _ => kind.jms_root().map(|(r, _)| r),
    };
    if let Some(e) = expected
        && !node.local_name().eq_ignore_ascii_case(e)
    {
        return Err(PayloadError::Corrupt(format!("stored <{}> where <{e}> belongs", node.name)));
    }
    Ok(node)
}

/// The canonical element for a non-RAW payload.
fn canonical(kind: &PayloadKind, reg: &TypeRegistry, node: &XmlNode) -> Result<XmlNode, PayloadError> {
    match kind {
        PayloadKind::Raw => {
            let bytes = encode(kind, reg, node)?;
            Ok(leaf("raw", hex_upper(&bytes)))
        }
        PayloadKind::Object(t) => {
            if !node.local_name().eq_ignore_ascii_case(t) {
                return Err(PayloadError::WrongRoot {
                    expected: t.clone(),
                    queue: format!("a queue of type {t}"),
                    got: node.name.clone(),
                });
            }
            canon_named(reg, t, node, t, t)
        }
        PayloadKind::Xml => normalize_xml(node, 0),
        _ => canon_jms(kind, node),
    }
}

/// An element holding `text` (no text child when empty, as a parser would give).
fn leaf(name: &str, text: impl Into<String>) -> XmlNode {
    let text = text.into();
    if text.is_empty() { XmlNode::new(name) } else { XmlNode::with_text(name, text) }
}

/// The text of an element that must hold text only.
fn leaf_text<'n>(node: &'n XmlNode, path: &str) -> Result<Cow<'n, str>, PayloadError> {
    match node.children.as_slice() {
        [XmlChild::Text(t)] => Ok(Cow::Borrowed(t)),
        _ => {
            if let Some(e) = node.elements().next() {
                return Err(invalid(path, format!("expected a text value, got element <{}>", e.name)));
            }
            Ok(Cow::Owned(node.text()))
        }
    }
}

/// Upper-case hex of `bytes`, as RAW values and message ids are written: SIMD (faster-hex),
/// where `hex::encode_upper` goes a character at a time.
pub fn hex_upper(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    if faster_hex::hex_encode_upper(bytes, &mut out).is_err() {
        return hex::encode_upper(bytes);
    }
    String::from_utf8(out).unwrap_or_else(|_| hex::encode_upper(bytes))
}

/// Hex with any ASCII whitespace; an error message otherwise. Payloads are mostly hex, so
/// this is a hot path: SIMD for plain hex, else a table lookup per byte.
fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    const SKIP: u8 = 0xFE;
    const BAD: u8 = 0xFF;
    const TABLE: [u8; 256] = {
        let mut t = [BAD; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t[b' ' as usize] = SKIP;
        t[b'\t' as usize] = SKIP;
        t[b'\n' as usize] = SKIP;
        t[b'\r' as usize] = SKIP;
        t
    };
    let bytes = text.as_bytes();
    // Nothing but hex digits (the usual case): checked and decoded with SIMD (faster-hex).
    // Anything else (whitespace, an error to report) goes through the byte loop.
    let mut out = vec![0u8; bytes.len() / 2];
    if bytes.len().is_multiple_of(2) && faster_hex::hex_decode(bytes, &mut out).is_ok() {
        return Ok(out);
    }
    out.clear();
    let mut high = BAD;
    for (i, &b) in bytes.iter().enumerate() {
        let n = TABLE[usize::from(b)];
        if n == SKIP {
            continue;
        }
        if n == BAD {
            let c = text.get(i..).and_then(|t| t.chars().next()).unwrap_or('?');
            return Err(format!(
                "value {} is not hexadecimal (invalid character {c:?} at position {i})",
                quote(text.trim())
            ));
        }
        if high == BAD {
            high = n;
        } else {
            out.push(high << 4 | n);
            high = BAD;
        }
    }
    if high != BAD {
        return Err(format!("value {} is not hexadecimal (odd number of digits)", quote(text.trim())));
    }
    Ok(out)
}

/// Child elements, rejecting non-whitespace text between them.
fn child_elements<'n>(node: &'n XmlNode, path: &str) -> Result<Vec<&'n XmlNode>, PayloadError> {
    let mut out = Vec::new();
    for c in &node.children {
        match c {
            XmlChild::Element(e) => out.push(e),
            XmlChild::Text(t) if t.trim().is_empty() => {}
            XmlChild::Text(t) => return Err(invalid(path, format!("unexpected text {}", quote(t.trim())))),
        }
    }
    Ok(out)
}

// ---- object types -------------------------------------------------------------------------

/// Canonical element `out_name` for a value of declared type `tname`.
fn canon_named(
    reg: &TypeRegistry,
    tname: &str,
    node: &XmlNode,
    out_name: &str,
    path: &str,
) -> Result<XmlNode, PayloadError> {
    let Some(body) = reg.types.get(tname) else {
        return Err(invalid(path, format!("type {tname} is not declared")));
    };
    let mut out = XmlNode::new(out_name);
    match body {
        Body::Object(attrs) => {
            let mut slots: Vec<Option<Option<XmlNode>>> = vec![None; attrs.len()];
            for e in child_elements(node, path)? {
                let ln = e.local_name();
                let Some(i) = attrs.iter().position(|a| a.name.eq_ignore_ascii_case(ln)) else {
                    return Err(invalid(path, format!("unknown attribute {ln}")));
                };
                let a = &attrs[i];
                let Some(slot) = slots.get_mut(i) else { continue };
                if slot.is_some() {
                    return Err(invalid(path, format!("duplicate attribute {}", a.name)));
                }
                *slot = Some(canon_value(reg, &a.ty, e, &a.name, &format!("{path}.{}", a.name))?);
            }
            for v in slots.into_iter().flatten().flatten() {
                out.push(v);
            }
        }
        Body::Varray { element, max } => {
            let item_name = format!("{out_name}_ITEM");
            for (i, e) in child_elements(node, path)?.into_iter().enumerate() {
                let n = i + 1;
                if n > *max as usize {
                    return Err(invalid(path, format!("more than {max} items (VARRAY limit of {tname})")));
                }
                let item = canon_value(reg, element, e, &item_name, &format!("{path}[{n}]"))?;
                out.push(item.unwrap_or_else(|| XmlNode::new(&item_name)));
            }
        }
    }
    Ok(out)
}

/// Canonical element for one attribute (or item) value; `None` for NULL.
fn canon_value(
    reg: &TypeRegistry,
    ty: &Ty,
    e: &XmlNode,
    out_name: &str,
    path: &str,
) -> Result<Option<XmlNode>, PayloadError> {
    match &ty.kind {
        AttrType::Named(t) => canon_named(reg, t, e, out_name, path).map(Some),
        AttrType::Xml => {
            if e.elements().next().is_none() && e.text().trim().is_empty() {
                return Ok(None);
            }
            let inner = normalize_xml(e, 0)?;
            Ok(Some(XmlNode { name: out_name.to_string(), attrs: Vec::new(), children: inner.children }))
        }
        _ => {
            let text = leaf_text(e, path)?;
            Ok(canon_scalar(ty, &text, path)?.map(|v| leaf(out_name, v)))
        }
    }
}

/// Checks a scalar value; returns its canonical text, `None` for NULL.
fn canon_scalar(ty: &Ty, text: &str, path: &str) -> Result<Option<String>, PayloadError> {
    let t = text.trim();
    match &ty.kind {
        AttrType::Number { precision, scale } => {
            if t.is_empty() {
                return Ok(None);
            }
            let Some(mut d) = Decimal::parse(t) else {
                return Err(invalid(path, format!("value {} is not a NUMBER", quote(t))));
            };
            if d.msd().is_some_and(|m| m > NUMBER_MAX_EXP) {
                return Err(invalid(path, format!("value {} is out of range for NUMBER", quote(t))));
            }
            let changed = match scale {
                Some(s) => d.round_to_scale(*s),
                None => false,
            };
            if let (Some(s), Some(m)) = (scale, d.msd()) {
                let p = i64::from(precision.unwrap_or(38));
                if m >= p - s {
                    let hint = if p - s > 0 {
                        format!("at most {} digits before the decimal point", p - s)
                    } else {
                        format!("absolute value below 1E{}", p - s)
                    };
                    return Err(invalid(path, format!("value {} is too large for {} ({hint})", quote(t), ty.decl)));
                }
            }
            Ok(Some(if changed { d.to_plain() } else { t.to_string() }))
        }
        AttrType::Text { max, bytes } => {
            if text.is_empty() {
                return Ok(None);
            }
            let (len, unit) = if *bytes { (text.len(), "bytes") } else { (text.chars().count(), "characters") };
            if len > *max {
                return Err(invalid(path, format!("value of {len} {unit} is too long for {}", ty.decl)));
            }
            Ok(Some(text.to_string()))
        }
        AttrType::Date | AttrType::Timestamp { .. } => {
            if t.is_empty() {
                return Ok(None);
            }
            let frac_max = match ty.kind {
                AttrType::Timestamp { frac } => frac,
                _ => 0,
            };
            match DateTime::parse(t) {
                Some(dt) if dt.frac.trim_end_matches('0').len() <= frac_max => Ok(Some(t.to_string())),
                Some(_) => Err(invalid(
                    path,
                    format!("value {} has more fractional-second digits than {} allows", quote(t), ty.decl),
                )),
                None => {
                    Err(invalid(path, format!("value {} is not a valid {} (YYYY-MM-DD[ HH:MI:SS])", quote(t), ty.decl)))
                }
            }
        }
        AttrType::Raw { max } => {
            let bytes = parse_hex(text).map_err(|m| invalid(path, m))?;
            if bytes.is_empty() {
                return Ok(None);
            }
            if let Some(m) = max
                && bytes.len() > *m
            {
                return Err(invalid(path, format!("value of {} bytes is too long for {}", bytes.len(), ty.decl)));
            }
            Ok(Some(hex_upper(&bytes)))
        }
        AttrType::Clob => Ok(if text.is_empty() { None } else { Some(text.to_string()) }),
        AttrType::Xml | AttrType::Named(_) => Err(invalid(path, "not a scalar type")),
    }
}

/// A decimal number: `digits × 10^exp`, no leading or trailing zero digits; zero has no digits.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decimal {
    neg: bool,
    digits: Vec<u8>,
    exp: i64,
}

impl Decimal {
    /// `[+-]digits[.digits][E[+-]digits]` (at least one mantissa digit).
    fn parse(t: &str) -> Option<Self> {
        let b = t.as_bytes();
        let mut i = 0;
        let neg = match b.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let mut digits = Vec::new();
        let mut frac_len: i64 = 0;
        let mut seen_point = false;
        while let Some(&c) = b.get(i) {
            match c {
                b'0'..=b'9' => {
                    digits.push(c - b'0');
                    if seen_point {
                        frac_len += 1;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => break,
            }
            i += 1;
        }
        if digits.is_empty() {
            return None;
        }
        let mut e: i64 = 0;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let rest = t.get(i + 1..)?;
            let body = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if body.is_empty() || body.len() > 4 || !body.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            e = rest.parse().ok()?;
            i = b.len();
        }
        if i != b.len() {
            return None;
        }
        let mut d = Decimal { neg, digits, exp: e - frac_len };
        d.normalize();
        Some(d)
    }

    fn normalize(&mut self) {
        let lead = self.digits.iter().take_while(|d| **d == 0).count();
        self.digits.drain(..lead);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exp += 1;
        }
        if self.digits.is_empty() {
            self.neg = false;
            self.exp = 0;
        }
    }

    /// Power of ten of the most significant digit; None for zero.
    fn msd(&self) -> Option<i64> {
        if self.digits.is_empty() { None } else { Some(self.digits.len() as i64 - 1 + self.exp) }
    }

    /// Rounds half away from zero to `scale` fraction digits; whether the value changed.
    fn round_to_scale(&mut self, scale: i64) -> bool {
        let min_exp = -scale;
        if self.digits.is_empty() || self.exp >= min_exp {
            return false;
        }
        let drop = usize::try_from(min_exp - self.exp).unwrap_or(usize::MAX);
        let len = self.digits.len();
        if drop > len {
            self.digits.clear();
            self.normalize();
            return true;
        }
        let round_up = self.digits.get(len - drop).is_some_and(|d| *d >= 5);
        self.digits.truncate(len - drop);
        self.exp = min_exp;
        if round_up {
            let mut carry = true;
            for d in self.digits.iter_mut().rev() {
                if *d == 9 {
                    *d = 0;
                } else {
                    *d += 1;
                    carry = false;
                    break;
                }
            }
            if carry {
                self.digits.insert(0, 1);
            }
        }
        self.normalize();
        true
    }

    /// Plain decimal text (no exponent, no trailing fraction zeros).
    fn to_plain(&self) -> String {
        if self.digits.is_empty() {
            return "0".into();
        }
        let ds: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let mut s = String::from(if self.neg { "-" } else { "" });
        if self.exp >= 0 {
            s.push_str(&ds);
            s.extend(std::iter::repeat_n('0', usize::try_from(self.exp).unwrap_or(0)));
        } else {
            let frac = usize::try_from(-self.exp).unwrap_or(0);
            if frac >= ds.len() {
                s.push_str("0.");
                s.extend(std::iter::repeat_n('0', frac - ds.len()));
                s.push_str(&ds);
            } else {
                let (int, fr) = ds.split_at(ds.len() - frac);
                s.push_str(int);
                s.push('.');
                s.push_str(fr);
            }
        }
        s
    }

    fn to_f64(&self) -> f64 {
        if self.digits.is_empty() {
            return 0.0;
        }
        let ds: String = self.digits.iter().map(|d| char::from(b'0' + d)).collect();
        let sign = if self.neg { "-" } else { "" };
        format!("{sign}{ds}e{}", self.exp).parse().unwrap_or(f64::NAN)
    }
}

/// A DATE / TIMESTAMP value, checked against the calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DateTime {
    y: u32,
    mo: u32,
    d: u32,
    h: u32,
    mi: u32,
    s: u32,
    /// Fractional-second digits as written (may be empty).
    frac: String,
}

impl DateTime {
    /// `YYYY-MM-DD`, `YYYY-MM-DD H:M:S[.f]` or `YYYY-MM-DDTH:M:S[.f]` (1-2 digit parts, 4-digit year).
    fn parse(t: &str) -> Option<Self> {
        fn num(s: &str, min_len: usize, max_len: usize) -> Option<u32> {
            (s.len() >= min_len && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        }
        let (date, time) = match t.split_once([' ', 'T']) {
            Some((d, tm)) => (d, Some(tm.trim_start())),
            None => (t, None),
        };
        let mut dp = date.split('-');
        let y = num(dp.next()?, 4, 4)?;
        let mo = num(dp.next()?, 1, 2)?;
        let d = num(dp.next()?, 1, 2)?;
        if dp.next().is_some() {
            return None;
        }
        let (mut h, mut mi, mut s, mut frac) = (0, 0, 0, String::new());
        if let Some(tm) = time {
            let mut tp = tm.split(':');
            h = num(tp.next()?, 1, 2)?;
            mi = num(tp.next()?, 1, 2)?;
            let sec = tp.next()?;
            if tp.next().is_some() {
                return None;
            }
            let (whole, f) = match sec.split_once('.') {
                Some((w, f)) => (w, Some(f)),
                None => (sec, None),
            };
            s = num(whole, 1, 2)?;
            if let Some(f) = f {
                if f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                frac = f.to_string();
            }
        }
        let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
        let days = match mo {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (y >= 1 && (1..=days).contains(&d) && h < 24 && mi < 60 && s < 60).then_some(DateTime {
            y,
            mo,
            d,
            h,
            mi,
            s,
            frac,
        })
    }

    /// `YYYY-MM-DD HH:MM:SS[.f]`, which compares correctly as text.
    fn normalized(&self) -> String {
        let DateTime { y, mo, d, h, mi, s, .. } = self;
        let f = self.frac.trim_end_matches('0');
        let dot = if f.is_empty() { "" } else { "." };
        format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{dot}{f}")
    }
}

// ---- JMS ----------------------------------------------------------------------------------

const TYPED_VALUES: [&str; 8] = [
    "int_value",
    "string_value",
    "long_value",
    "double_value",
    "boolean_value",
    "float_value",
    "short_value",
    "byte_value",
];

fn canon_jms(kind: &PayloadKind, node: &XmlNode) -> Result<XmlNode, PayloadError> {
    let Some((root, body_name)) = kind.jms_root() else {
        return Err(invalid("payload", "not a JMS payload type"));
    };
    if !node.local_name().eq_ignore_ascii_case(root) {
        return Err(PayloadError::WrongRoot {
            expected: root.into(),
            queue: format!("a {kind} queue"),
            got: node.name.clone(),
        });
    }
    let mut props: Option<XmlNode> = None;
    let mut user: Option<XmlNode> = None;
    let mut body: Option<XmlNode> = None;
    for e in child_elements(node, root)? {
        let ln = e.local_name().to_ascii_lowercase();
        let path = format!("{root}.{ln}");
        let slot = match ln.as_str() {
            "oracle_jms_properties" => &mut props,
            "user_properties" => &mut user,
            n if n == body_name => &mut body,
            "text_data" | "map_data" | "bytes_data" | "ser_object_data" => {
                return Err(invalid(root, format!("<{ln}> does not belong in a <{root}> (expected <{body_name}>)")));
            }
            _ => return Err(invalid(root, format!("unknown element <{}>", e.name))),
        };
        if slot.is_some() {
            return Err(invalid(root, format!("duplicate element <{ln}>")));
        }
        *slot = Some(match ln.as_str() {
            "oracle_jms_properties" => canon_jms_header(e, &path)?,
            "user_properties" => canon_named_values(e, "user_properties", "property", &path)?,
            "text_data" => leaf("text_data", leaf_text(e, &path)?),
            "map_data" => canon_named_values(e, "map_data", "item", &path)?,
            _ => leaf(&ln, hex_upper(&parse_hex(&leaf_text(e, &path)?).map_err(|m| invalid(&path, m))?)),
        });
    }
    let mut out = XmlNode::new(root);
    for part in [props, user].into_iter().flatten() {
        if !part.children.is_empty() {
            out.push(part);
        }
    }
    if let Some(b) = body {
        out.push(b);
    }
    Ok(out)
}

fn canon_jms_header(node: &XmlNode, path: &str) -> Result<XmlNode, PayloadError> {
    const ORDER: [&str; 5] = ["type", "reply_to", "appid", "groupid", "group_sequence"];
    // Outer Some: the element was given (to catch duplicates); inner None: it was empty.
    let mut fields: [Option<Option<XmlNode>>; 5] = Default::default();
    for e in child_elements(node, path)? {
        let ln = e.local_name().to_ascii_lowercase();
        let p = format!("{path}.{ln}");
        if matches!(ln.as_str(), "userid" | "timestamp" | "recv_timestamp") {
            return Err(invalid(&p, "is set by the server; a client cannot supply it"));
        }
        let Some(i) = ORDER.iter().position(|o| *o == ln) else {
            return Err(invalid(path, format!("unknown element <{}>", e.name)));
        };
        let Some(slot) = fields.get_mut(i) else { continue };
        if slot.is_some() {
            return Err(invalid(path, format!("duplicate element <{ln}>")));
        }
        let v = match ln.as_str() {
            "reply_to" => {
                let r = canon_reply_to(e, &p)?;
                (!r.children.is_empty()).then_some(r)
            }
            "group_sequence" => {
                let t = leaf_text(e, &p)?;
                let t = t.trim();
                if t.is_empty() {
                    None
                } else {
                    let n: i32 =
                        parse_int(t).ok_or_else(|| invalid(&p, format!("value {} is not a 32-bit int", quote(t))))?;
                    Some(leaf(&ln, n.to_string()))
                }
            }
            _ => {
                let t = leaf_text(e, &p)?;
                let t = t.trim();
                if t.chars().count() > JMS_HEADER_MAX {
                    return Err(invalid(&p, format!("longer than {JMS_HEADER_MAX} characters")));
                }
                (!t.is_empty()).then(|| leaf(&ln, t))
            }
        };
        *slot = Some(v);
    }
    let mut out = XmlNode::new("oracle_jms_properties");
    for f in fields.into_iter().flatten().flatten() {
        out.push(f);
    }
    Ok(out)
}

fn canon_reply_to(node: &XmlNode, path: &str) -> Result<XmlNode, PayloadError> {
    const ORDER: [&str; 3] = ["agent_name", "address", "protocol"];
    let mut fields: [Option<String>; 3] = Default::default();
    for e in child_elements(node, path)? {
        let ln = e.local_name().to_ascii_lowercase();
        let p = format!("{path}.{ln}");
        let Some(i) = ORDER.iter().position(|o| *o == ln) else {
            return Err(invalid(path, format!("unknown element <{}>", e.name)));
        };
        let t = leaf_text(e, &p)?;
        let t = t.trim();
        let Some(slot) = fields.get_mut(i) else { continue };
        if slot.is_some() {
            return Err(invalid(path, format!("duplicate element <{ln}>")));
        }
        let v = if ln == "protocol" && !t.is_empty() {
            let n: i32 = parse_int(t)
                .filter(|n: &i32| *n >= 0)
                .ok_or_else(|| invalid(&p, format!("value {} is not a protocol number", quote(t))))?;
            n.to_string()
        } else {
            t.to_string()
        };
        *slot = Some(v);
    }
    let mut out = XmlNode::new("reply_to");
    for (name, v) in ORDER.iter().zip(fields) {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push(leaf(name, v));
        }
    }
    Ok(out)
}

/// Integer text (optional sign) in range of `T`.
fn parse_int<T: std::str::FromStr>(t: &str) -> Option<T> {
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// `user_properties` / `map_data`: a list of `property` / `item` with a name and one typed value.
fn canon_named_values(node: &XmlNode, out_name: &str, item: &str, path: &str) -> Result<XmlNode, PayloadError> {
    let mut out = XmlNode::new(out_name);
    let mut names = BTreeSet::new();
    for (i, e) in child_elements(node, path)?.into_iter().enumerate() {
        if !e.local_name().eq_ignore_ascii_case(item) {
            return Err(invalid(path, format!("expected <{item}>, got <{}>", e.name)));
        }
        let name = match e.child("name") {
            Some(n) => leaf_text(n, &format!("{path}.{item}[{}].name", i + 1))?.trim().to_string(),
            None => String::new(),
        };
        let ip = if name.is_empty() { format!("{path}.{item}[{}]", i + 1) } else { format!("{path}.{item}[{name}]") };
        if name.is_empty() {
            return Err(invalid(&ip, "needs a non-empty <name>"));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(&ip, "name given more than once"));
        }
        let mut value: Option<XmlNode> = None;
        let mut seen_name = false;
        for c in child_elements(e, &ip)? {
            let ln = c.local_name().to_ascii_lowercase();
            if ln == "name" {
                if seen_name {
                    return Err(invalid(&ip, "duplicate element <name>"));
                }
                seen_name = true;
                continue;
            }
            if !TYPED_VALUES.contains(&ln.as_str()) {
                return Err(invalid(&ip, format!("unknown element <{}>", c.name)));
            }
            if value.is_some() {
                return Err(invalid(&ip, "needs exactly one value element, got more"));
            }
            let vp = format!("{ip}.{ln}");
            let text = canon_typed(&ln, &leaf_text(c, &vp)?, &vp)?;
            value = Some(leaf(&ln, text));
        }
        let Some(value) = value else {
            return Err(invalid(&ip, format!("needs one of {}", TYPED_VALUES.join(", "))));
        };
        let mut p = XmlNode::new(item);
        p.push(leaf("name", name));
        p.push(value);
        out.push(p);
    }
    Ok(out)
}

/// Checks a typed JMS value; returns its canonical text.
fn canon_typed(tag: &str, text: &str, path: &str) -> Result<String, PayloadError> {
    let t = text.trim();
    let bad = |what: &str| invalid(path, format!("value {} is not {what}", quote(t)));
    Ok(match tag {
        "string_value" => text.to_string(),
        "int_value" => parse_int::<i32>(t).ok_or_else(|| bad("a 32-bit int"))?.to_string(),
        "long_value" => parse_int::<i64>(t).ok_or_else(|| bad("a 64-bit long"))?.to_string(),
        "short_value" => parse_int::<i16>(t).ok_or_else(|| bad("a 16-bit short"))?.to_string(),
        "byte_value" => parse_int::<i8>(t).ok_or_else(|| bad("an 8-bit byte"))?.to_string(),
        "float_value" => {
            Decimal::parse(t).ok_or_else(|| bad("a float"))?;
            let v: f32 = t.parse().map_err(|_| bad("a float"))?;
            if !v.is_finite() {
                return Err(bad("within float range"));
            }
            t.to_string()
        }
        "double_value" => {
            Decimal::parse(t).ok_or_else(|| bad("a double"))?;
            let v: f64 = t.parse().map_err(|_| bad("a double"))?;
            if !v.is_finite() {
                return Err(bad("within double range"));
            }
            t.to_string()
        }
        "boolean_value" => {
            if t.eq_ignore_ascii_case("true") {
                "true".into()
            } else if t.eq_ignore_ascii_case("false") {
                "false".into()
            } else {
                return Err(bad("a boolean (true or false)"));
            }
        }
        _ => return Err(invalid(path, format!("unknown value element <{tag}>"))),
    })
}

/// The selector value of a stored typed JMS value element.
fn typed_value(e: &XmlNode) -> Value {
    let ln = e.local_name().to_ascii_lowercase();
    let text = e.text();
    match ln.as_str() {
        "string_value" => Value::Text(text),
        "boolean_value" => Value::Bool(text.trim().eq_ignore_ascii_case("true")),
        "int_value" | "long_value" | "short_value" | "byte_value" | "float_value" | "double_value" => {
            Decimal::parse(text.trim()).map_or(Value::Null, |d| Value::Number(d.to_f64()))
        }
        _ => Value::Null,
    }
}

// ---- XML stored form ----------------------------------------------------------------------

/// Merges adjacent text children and drops empty ones (what a parser would give back).
fn normalize_xml(node: &XmlNode, depth: usize) -> Result<XmlNode, PayloadError> {
    if depth > MAX_XML_DEPTH {
        return Err(invalid(&node.name, format!("nested deeper than {MAX_XML_DEPTH} levels")));
    }
    let mut out = XmlNode { name: node.name.clone(), attrs: node.attrs.clone(), children: Vec::new() };
    for c in &node.children {
        match c {
            XmlChild::Element(e) => out.children.push(XmlChild::Element(normalize_xml(e, depth + 1)?)),
            XmlChild::Text(t) if t.is_empty() => {}
            XmlChild::Text(t) => push_text(&mut out, t),
        }
    }
    Ok(out)
}

fn push_text(node: &mut XmlNode, t: &str) {
    if t.is_empty() {
        return;
    }
    if let Some(XmlChild::Text(last)) = node.children.last_mut() {
        last.push_str(t);
    } else {
        node.children.push(XmlChild::Text(t.to_string()));
    }
}

fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

fn is_xml_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.' | '\u{B7}'))
}

fn escape_into(out: &mut String, s: &str, attr: bool, path: &str) -> Result<(), PayloadError> {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            '"' if attr => out.push_str("&quot;"),
            '\t' if attr => out.push_str("&#9;"),
            '\n' if attr => out.push_str("&#10;"),
            c if is_xml_char(c) => out.push(c),
            c => return Err(invalid(path, format!("character U+{:04X} cannot appear in XML", u32::from(c)))),
        }
    }
    Ok(())
}

/// Serializes an element (no declaration, no added whitespace).
fn to_xml(node: &XmlNode) -> Result<String, PayloadError> {
    let mut out = String::new();
    write_elem(&mut out, node, 0)?;
    Ok(out)
}

fn write_elem(out: &mut String, n: &XmlNode, depth: usize) -> Result<(), PayloadError> {
    if depth > MAX_XML_DEPTH {
        return Err(invalid(&n.name, format!("nested deeper than {MAX_XML_DEPTH} levels")));
    }
    if !is_xml_name(&n.name) {
        return Err(invalid("payload", format!("invalid element name {}", quote(&n.name))));
    }
    out.push('<');
    out.push_str(&n.name);
    let mut seen = BTreeSet::new();
    for (k, v) in &n.attrs {
        if !is_xml_name(k) {
            return Err(invalid(&n.name, format!("invalid attribute name {}", quote(k))));
        }
        if !seen.insert(k.as_str()) {
            return Err(invalid(&n.name, format!("duplicate attribute {k}")));
        }
        out.push(' ');
        out.push_str(k);
        out.push_str("=\"");
        escape_into(out, v, true, &n.name)?;
        out.push('"');
    }
    if n.children.is_empty() {
        out.push_str("/>");
        return Ok(());
    }
    out.push('>');
    for c in &n.children {
        match c {
            XmlChild::Text(t) => escape_into(out, t, false, &n.name)?,
            XmlChild::Element(e) => write_elem(out, e, depth + 1)?,
        }
    }
    out.push_str("</");
    out.push_str(&n.name);
    out.push('>');
    Ok(())
}

fn start_node(e: &BytesStart<'_>) -> Result<XmlNode, String> {
    let name = std::str::from_utf8(e.name().as_ref()).map_err(|err| err.to_string())?.to_string();
    let mut node = XmlNode::new(name);
    for a in e.attributes() {
        let a = a.map_err(|err| err.to_string())?;
        let key = std::str::from_utf8(a.key.as_ref()).map_err(|err| err.to_string())?.to_string();
        let value = a.unescape_value().map_err(|err| err.to_string())?.into_owned();
        node.attrs.push((key, value));
    }
    Ok(node)
}

/// Parses one element (with an optional XML declaration, comments and PIs, which are dropped).
/// Text is kept exactly; DOCTYPE is rejected.
fn parse_xml(s: &str) -> Result<XmlNode, String> {
    let mut reader = Reader::from_str(s);
    let mut stack: Vec<XmlNode> = Vec::new();
    let mut root: Option<XmlNode> = None;
    fn attach(stack: &mut [XmlNode], root: &mut Option<XmlNode>, n: XmlNode) -> Result<(), String> {
        if let Some(p) = stack.last_mut() {
            p.children.push(XmlChild::Element(n));
            Ok(())
        } else if root.is_none() {
            *root = Some(n);
            Ok(())
        } else {
            Err("more than one root element".into())
        }
    }
    loop {
        match reader.read_event().map_err(|e| e.to_string())? {
            Event::Start(e) => {
                if root.is_some() {
                    return Err("more than one root element".into());
                }
                if stack.len() >= MAX_XML_DEPTH {
                    return Err(format!("nested deeper than {MAX_XML_DEPTH} levels"));
                }
                stack.push(start_node(&e)?);
            }
            Event::Empty(e) => {
                let n = start_node(&e)?;
                attach(&mut stack, &mut root, n)?;
            }
            Event::End(_) => {
                let n = stack.pop().ok_or("unbalanced end tag")?;
                attach(&mut stack, &mut root, n)?;
            }
            Event::Text(t) => {
                let text = t.unescape().map_err(|e| e.to_string())?;
                match stack.last_mut() {
                    Some(p) => push_text(p, &text),
                    None if text.trim().is_empty() => {}
                    None => return Err("text outside the root element".into()),
                }
            }
            Event::CData(c) => {
                let text = c.decode().map_err(|e| e.to_string())?;
                match stack.last_mut() {
                    Some(p) => push_text(p, &text),
                    None => return Err("CDATA outside the root element".into()),
                }
            }
            Event::DocType(_) => return Err("DOCTYPE is not allowed".into()),
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
    }
    if !stack.is_empty() {
        return Err("unclosed element".into());
    }
    root.ok_or_else(|| "no root element".into())
}

// ---- selector lookups ---------------------------------------------------------------------

/// A stored payload as seen by selector conditions; decodes lazily, at most once.
pub struct PayloadView<'a> {
    kind: &'a PayloadKind,
    reg: &'a TypeRegistry,
    stored: &'a [u8],
    tree: OnceCell<Option<XmlNode>>,
}

impl<'a> PayloadView<'a> {
    pub fn new(kind: &'a PayloadKind, reg: &'a TypeRegistry, stored: &'a [u8]) -> Self {
        Self { kind, reg, stored, tree: OnceCell::new() }
    }

    fn tree(&self) -> Option<&XmlNode> {
        self.tree
            .get_or_init(|| match self.kind {
                PayloadKind::Raw => None,
                _ => std::str::from_utf8(self.stored).ok().and_then(|s| parse_xml(s).ok()),
            })
            .as_ref()
    }

    /// `tab.user_data.<path>` (segments lower-case, matched case-insensitively).
    pub fn user_data(&self, path: &[String]) -> Value {
        match self.kind {
            PayloadKind::Raw if path.is_empty() => Value::Text(hex_upper(self.stored)),
            PayloadKind::Raw => Value::Null,
            PayloadKind::Object(t) => match self.tree() {
                Some(root) if !path.is_empty() => object_lookup(self.reg, t, root, path),
                _ => Value::Null,
            },
            PayloadKind::Xml => {
                let Some(mut cur) = self.tree() else { return Value::Null };
                if path.is_empty() {
                    return Value::Null;
                }
                for seg in path {
                    match cur.child(seg) {
                        Some(c) => cur = c,
                        None => return Value::Null,
                    }
                }
                if cur.elements().next().is_some() { Value::Null } else { Value::Text(cur.text()) }
            }
            _ => {
                let Some(root) = self.tree() else { return Value::Null };
                let segs: Vec<&str> = path.iter().map(String::as_str).collect();
                match segs.as_slice() {
                    [s] if s.eq_ignore_ascii_case("text_data") || s.eq_ignore_ascii_case("text_vc") => {
                        root.child("text_data").map_or(Value::Null, |e| Value::Text(e.text()))
                    }
                    [s] if s.eq_ignore_ascii_case("text_len") => {
                        root.child("text_data").map_or(Value::Null, |e| Value::Number(e.text().chars().count() as f64))
                    }
                    [h, f] if h.eq_ignore_ascii_case("header") => jms_header_field(root, f),
                    _ => Value::Null,
                }
            }
        }
    }

    /// A JMS user property (exact name first, then case-insensitive), else a JMS header field.
    pub fn user_property(&self, name: &str) -> Value {
        if self.kind.jms_root().is_none() {
            return Value::Null;
        }
        let Some(root) = self.tree() else { return Value::Null };
        if let Some(props) = root.child("user_properties") {
            let named = |p: &&XmlNode| p.child("name").map(|n| n.text().trim().to_string());
            let list: Vec<&XmlNode> = props.elements().collect();
            let found = list
                .iter()
                .find(|p| named(p).as_deref() == Some(name))
                .or_else(|| list.iter().find(|p| named(p).is_some_and(|n| n.eq_ignore_ascii_case(name))));
            if let Some(p) = found {
                return p
                    .elements()
                    .find(|c| !c.local_name().eq_ignore_ascii_case("name"))
                    .map_or(Value::Null, typed_value);
            }
        }
        let field = match name.to_ascii_lowercase().as_str() {
            "type" | "jmstype" => "type",
            "appid" | "jmsxappid" => "appid",
            "groupid" | "jmsxgroupid" => "groupid",
            "group_sequence" | "jmsxgroupseq" => "group_sequence",
            _ => return Value::Null,
        };
        jms_header_field(root, field)
    }
}

fn jms_header_field(root: &XmlNode, field: &str) -> Value {
    let Some(v) = root.child("oracle_jms_properties").and_then(|p| p.child(field)) else {
        return Value::Null;
    };
    let text = v.text();
    if field.eq_ignore_ascii_case("group_sequence") {
        Decimal::parse(text.trim()).map_or(Value::Null, |d| Value::Number(d.to_f64()))
    } else if v.elements().next().is_some() {
        Value::Null
    } else {
        Value::Text(text)
    }
}

/// Walks object attributes by name, typing the leaf by the declarations.
fn object_lookup(reg: &TypeRegistry, tname: &str, root: &XmlNode, path: &[String]) -> Value {
    let mut ty: Option<AttrType> = Some(AttrType::Named(tname.to_string()));
    let mut cur = root;
    for seg in path {
        let next_ty = match &ty {
            Some(AttrType::Named(t)) => match reg.types.get(t) {
                Some(Body::Object(attrs)) => match attrs.iter().find(|a| a.name.eq_ignore_ascii_case(seg)) {
                    Some(a) => Some(a.ty.kind.clone()),
                    None => return Value::Null,
                },
                Some(Body::Varray { .. }) => return Value::Null,
                None => None,
            },
            Some(_) => return Value::Null,
            None => None,
        };
        match cur.child(seg) {
            Some(c) => cur = c,
            None => return Value::Null,
        }
        ty = next_ty;
    }
    let text = cur.text();
    match ty {
        Some(AttrType::Number { .. }) => Decimal::parse(text.trim()).map_or(Value::Null, |d| Value::Number(d.to_f64())),
        Some(AttrType::Date | AttrType::Timestamp { .. }) => {
            DateTime::parse(text.trim()).map_or(Value::Text(text), |d| Value::Text(d.normalized()))
        }
        Some(AttrType::Xml) => {
            let mut s = String::new();
            for c in &cur.children {
                match c {
                    XmlChild::Text(t) => {
                        if escape_into(&mut s, t, false, "").is_err() {
                            return Value::Null;
                        }
                    }
                    XmlChild::Element(e) => {
                        if write_elem(&mut s, e, 0).is_err() {
                            return Value::Null;
                        }
                    }
                }
            }
            Value::Text(s)
        }
        Some(AttrType::Named(_)) => Value::Null,
        _ if cur.elements().next().is_some() => Value::Null,
        _ => Value::Text(text),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EX01: &str = include_str!("../../../examples/01-send-adt-single-consumer.xml");
    const EX02: &str = include_str!("../../../examples/02-publish-adt-multi-consumer.xml");
    const EX03: &str = include_str!("../../../examples/03-send-jms-text.xml");
    const EX14: &str = include_str!("../../../examples/14-response-receive-adt.xml");
    const EX16: &str = include_str!("../../../examples/16-servlet-send-oe-order.xml");
    const TOPOLOGY: &str = include_str!("../../../config/topology.toml");

    #[derive(Deserialize)]
    struct Topo {
        types: Vec<TypeDef>,
    }

    fn demo_defs() -> Vec<TypeDef> {
        toml::from_str::<Topo>(TOPOLOGY).unwrap().types
    }

    fn reg() -> TypeRegistry {
        TypeRegistry::new(demo_defs()).unwrap()
    }

    /// Drops layout whitespace the way the IDAP parser does (text beside elements).
    fn strip_layout(n: &XmlNode) -> XmlNode {
        let has_elements = n.elements().next().is_some();
        XmlNode {
            name: n.name.clone(),
            attrs: n.attrs.clone(),
            children: n
                .children
                .iter()
                .filter_map(|c| match c {
                    XmlChild::Element(e) => Some(XmlChild::Element(strip_layout(e))),
                    XmlChild::Text(t) if has_elements && t.trim().is_empty() => None,
                    XmlChild::Text(t) => Some(XmlChild::Text(t.clone())),
                })
                .collect(),
        }
    }

    fn find<'n>(n: &'n XmlNode, name: &str) -> Option<&'n XmlNode> {
        if n.local_name() == name {
            return Some(n);
        }
        n.elements().find_map(|e| find(e, name))
    }

    /// The element inside `<message_payload>` of an example document.
    fn example_payload(doc: &str) -> XmlNode {
        let root = strip_layout(&parse_xml(doc).unwrap());
        find(&root, "message_payload").unwrap().elements().next().unwrap().clone()
    }

    fn round_trip(kind: &PayloadKind, node: &XmlNode) -> XmlNode {
        let r = reg();
        let stored = encode(kind, &r, node).unwrap();
        decode(kind, &r, &stored).unwrap()
    }

    fn obj(name: &str, fields: &[(&str, &str)]) -> XmlNode {
        let mut n = XmlNode::new(name);
        for (k, v) in fields {
            n.push(XmlNode::with_text(*k, *v));
        }
        n
    }

    fn err_of(kind: &PayloadKind, node: &XmlNode) -> String {
        encode(kind, &reg(), node).unwrap_err().to_string()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn demo_topology_types_parse_and_build() {
        let defs = demo_defs();
        assert_eq!(defs.len(), 6);
        let r = TypeRegistry::new(defs.clone()).unwrap();
        for t in ["CUSTOMER_TYP", "BOOK_TYP", "LINEITEM_TYP", "LINEITEMS_VARTYP", "ORDER_TYP", "EMP_TYP"] {
            assert!(r.contains(t), "{t}");
        }
        assert!(!r.contains("NOPE_TYP"));
        // The engine stores the definitions as JSON.
        let json = serde_json::to_string(&defs).unwrap();
        let back: Vec<TypeDef> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, defs);
    }

    #[test]
    fn typedef_toml_shape() {
        let t: Topo = toml::from_str(
            r#"
            [[types]]
            name = "EMP_TYP"
            kind = "object"
            attributes = [ { name = "EMPNO", type = "NUMBER(4)" }, { name = "ENAME", type = "VARCHAR2(10)" } ]
            [[types]]
            name = "EMPS"
            kind = "varray"
            element = "EMP_TYP"
            max = 3
            "#,
        )
        .unwrap();
        assert_eq!(t.types[1].element.as_deref(), Some("EMP_TYP"));
        assert_eq!(t.types[1].max, Some(3));
        assert!(TypeRegistry::new(t.types).is_ok());
        // Unknown keys are rejected.
        assert!(toml::from_str::<Topo>("[[types]]\nname = \"A\"\nkind = \"object\"\nbogus = 1\n").is_err());
        assert!(toml::from_str::<Topo>("[[types]]\nname = \"A\"\nkind = \"table\"\n").is_err());
        assert!(
            toml::from_str::<Topo>(
                "[[types]]\nname = \"A\"\nkind = \"object\"\nattributes = [{ name = \"X\", type = \"DATE\", len = 3 }]"
            )
            .is_err()
        );
    }

    fn def(name: &str, attrs: &[(&str, &str)]) -> TypeDef {
        TypeDef {
            name: name.into(),
            kind: TypeKind::Object,
            attributes: attrs.iter().map(|(n, t)| AttributeDef { name: (*n).into(), ty: (*t).into() }).collect(),
            element: None,
            max: None,
        }
    }

    #[test]
    fn registry_rejects_bad_definitions() {
        let e = TypeRegistry::new(vec![def("A", &[("X", "B_TYP")])]).unwrap_err().to_string();
        assert!(e.contains("A.X: unknown type B_TYP"), "{e}");
        let e = TypeRegistry::new(vec![def("A", &[("X", "B")]), def("B", &[("Y", "QS.A")])]).unwrap_err().to_string();
        assert!(e.contains("type cycle: A -> B -> A"), "{e}");
        let e = TypeRegistry::new(vec![def("A", &[("X", "A")])]).unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
        let e = TypeRegistry::new(vec![def("A", &[("X", "NUMBER(0)")])]).unwrap_err().to_string();
        assert!(e.contains("A.X"), "{e}");
        for bad in
            ["VARCHAR2", "NUMBER(3,x)", "NUMBER(", "RAW", "DATE(3)", "1ABC", "VARCHAR2(10 WORDS)", "TIMESTAMP(12)"]
        {
            assert!(TypeRegistry::new(vec![def("A", &[("X", bad)])]).is_err(), "{bad}");
        }
        for good in [
            "NUMBER",
            "number(5)",
            "NUMBER(7, 2)",
            "NUMBER(*,2)",
            "NUMBER(5,-2)",
            "INTEGER",
            "VARCHAR2(10 CHAR)",
            "VARCHAR2(10 BYTE)",
            "CHAR",
            "CHAR(3)",
            "DATE",
            "TIMESTAMP",
            "TIMESTAMP(3)",
            "RAW(16)",
            "BLOB",
            "CLOB",
            "XMLTYPE",
            "SYS.XMLTYPE",
            "FLOAT",
        ] {
            assert!(TypeRegistry::new(vec![def("A", &[("X", good)])]).is_ok(), "{good}");
        }
        assert!(TypeRegistry::new(vec![def("A", &[("X", "DATE")]), def("a", &[("Y", "DATE")])]).is_err());
        assert!(TypeRegistry::new(vec![def("A", &[("X", "DATE"), ("x", "DATE")])]).is_err());
        assert!(TypeRegistry::new(vec![def("A", &[])]).is_err());
        assert!(TypeRegistry::new(vec![def("DATE", &[("X", "DATE")])]).is_err());
        let v = TypeDef {
            name: "V".into(),
            kind: TypeKind::Varray,
            attributes: vec![],
            element: Some("NUMBER".into()),
            max: None,
        };
        assert!(TypeRegistry::new(vec![v.clone()]).is_err());
        assert!(TypeRegistry::new(vec![TypeDef { max: Some(0), ..v.clone() }]).is_err());
        assert!(TypeRegistry::new(vec![TypeDef { max: Some(2), ..v }]).is_ok());
        // Schema-qualified names lose their schema.
        let r = TypeRegistry::new(vec![def("aquser.emp2", &[("x", "date")])]).unwrap();
        assert!(r.contains("EMP2"));
    }

    #[test]
    fn payload_kind_parse() {
        use PayloadKind::*;
        let cases = [
            ("RAW", Raw),
            ("raw", Raw),
            ("SYS.AQ$_JMS_TEXT_MESSAGE", JmsText),
            ("aq$_jms_text_message", JmsText),
            ("sys.aq$_jms_map_message", JmsMap),
            ("AQ$_JMS_BYTES_MESSAGE", JmsBytes),
            ("SYS.AQ$_JMS_OBJECT_MESSAGE", JmsObject),
            ("XMLTYPE", Xml),
            (" sys.XMLType ", Xml),
            ("QS.ORDER_TYP", Object("ORDER_TYP".into())),
            ("emp_typ", Object("EMP_TYP".into())),
        ];
        for (s, k) in cases {
            assert_eq!(PayloadKind::parse(s).unwrap(), k, "{s}");
        }
        for bad in [
            "",
            "  ",
            "A.B.C",
            "1TYP",
            "ORDER TYP",
            "QS.",
            "SYS.AQ$_JMS_STREAM_MESSAGE",
            "NUMBER",
            "VARCHAR2(10)",
            "A-B",
        ] {
            assert!(PayloadKind::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(JmsText.to_string(), "SYS.AQ$_JMS_TEXT_MESSAGE");
        assert_eq!(Object("ORDER_TYP".into()).to_string(), "ORDER_TYP");
    }

    #[test]
    fn example_01_and_16_orders_round_trip() {
        let kind = PayloadKind::Object("ORDER_TYP".into());
        for doc in [EX01, EX16] {
            let p = example_payload(doc);
            assert_eq!(p.name, "ORDER_TYP");
            assert_eq!(round_trip(&kind, &p), p);
        }
        let stored = encode(&kind, &reg(), &example_payload(EX01)).unwrap();
        let text = String::from_utf8(stored).unwrap();
        assert!(text.starts_with("<ORDER_TYP><ORDERNO>4471</ORDERNO>"), "{text}");
        assert!(text.contains("<ITEMS><ITEMS_ITEM><QUANTITY>3</QUANTITY>"), "{text}");
    }

    #[test]
    fn example_02_round_trips_to_example_14() {
        let kind = PayloadKind::Object("EMP_TYP".into());
        let p = example_payload(EX02);
        let back = round_trip(&kind, &p);
        assert_eq!(back, p);
        assert_eq!(back, example_payload(EX14));
        assert!(back.child("JOB").is_none());
        assert_eq!(back.child("HIREDATE").unwrap().text(), "2023-09-18");
    }

    #[test]
    fn example_03_jms_text_round_trips() {
        let p = example_payload(EX03);
        assert_eq!(round_trip(&PayloadKind::JmsText, &p), p);
    }

    #[test]
    fn object_canonicalisation() {
        let kind = PayloadKind::Object("EMP_TYP".into());
        let mut n = obj(
            "emp_typ",
            &[("deptno", "7"), ("Ename", " Mary "), ("SAL", " 100.125 "), ("COMM", "1.50"), ("JOB", "")],
        );
        n.attrs.push(("xmlns".into(), "urn:x".into()));
        n.children.insert(0, XmlChild::Text("\n  ".into()));
        let back = round_trip(&kind, &n);
        let want = obj("EMP_TYP", &[("ENAME", " Mary "), ("SAL", "100.13"), ("COMM", "1.50"), ("DEPTNO", "7")]);
        assert_eq!(back, want);
        // Rounding that carries, and negative values.
        let back = round_trip(&kind, &obj("EMP_TYP", &[("SAL", "-9999.999"), ("COMM", "+0.004")]));
        assert_eq!(back, obj("EMP_TYP", &[("SAL", "-10000"), ("COMM", "0")]));
        // Exponent notation is a NUMBER; unchanged by rounding, so kept.
        let back = round_trip(&kind, &obj("EMP_TYP", &[("EMPNO", "1E3")]));
        assert_eq!(back, obj("EMP_TYP", &[("EMPNO", "1E3")]));
    }

    #[test]
    fn varray_and_nested_objects() {
        let kind = PayloadKind::Object("ORDER_TYP".into());
        let mut items = XmlNode::new("items");
        for i in 0..3 {
            let mut it = XmlNode::new("whatever");
            it.push(XmlNode::with_text("quantity", i.to_string()));
            items.push(it);
        }
        items.push(XmlNode::new("EMPTY"));
        let mut o = XmlNode::new("ORDER_TYP");
        o.push(items);
        o.push(XmlNode::new("CUSTOMER"));
        let back = round_trip(&kind, &o);
        assert_eq!(back.child("CUSTOMER"), Some(&XmlNode::new("CUSTOMER")));
        let its: Vec<&XmlNode> = back.child("ITEMS").unwrap().elements().collect();
        assert_eq!(its.len(), 4);
        assert!(its.iter().all(|i| i.name == "ITEMS_ITEM"));
        assert_eq!(its[2].child("QUANTITY").unwrap().text(), "2");
        assert!(its[3].children.is_empty());
        // An empty collection stays an empty collection.
        let mut o = XmlNode::new("ORDER_TYP");
        o.push(XmlNode::new("ITEMS"));
        assert_eq!(round_trip(&kind, &o), o);
    }

    #[test]
    fn scalar_varray_xmltype_raw_timestamp_attributes() {
        let defs = vec![
            TypeDef {
                name: "TAGS".into(),
                kind: TypeKind::Varray,
                attributes: vec![],
                element: Some("VARCHAR2(5)".into()),
                max: Some(2),
            },
            def(
                "DOC_TYP",
                &[("ID", "INTEGER"), ("TAGS", "TAGS"), ("BODY", "XMLTYPE"), ("SIG", "RAW(2)"), ("AT", "TIMESTAMP(3)")],
            ),
        ];
        let r = TypeRegistry::new(defs).unwrap();
        let kind = PayloadKind::Object("DOC_TYP".into());
        let mut n = XmlNode::new("DOC_TYP");
        n.push(XmlNode::with_text("ID", "5"));
        let mut tags = XmlNode::new("TAGS");
        tags.push(XmlNode::with_text("t", "ab"));
        tags.push(XmlNode::new("t"));
        n.push(tags);
        let mut body = XmlNode::new("BODY");
        let mut inner = XmlNode::new("x:order");
        inner.attrs.push(("xmlns:x".into(), "urn:o".into()));
        inner.children.push(XmlChild::Text("a & b <c>\r\n".into()));
        body.push(inner.clone());
        n.push(body);
        n.push(XmlNode::with_text("SIG", " ab cd "));
        n.push(XmlNode::with_text("AT", "2024-02-29T23:59:59.123"));
        let stored = encode(&kind, &r, &n).unwrap();
        let back = decode(&kind, &r, &stored).unwrap();
        let tags: Vec<&XmlNode> = back.child("TAGS").unwrap().elements().collect();
        assert_eq!(tags[0], &XmlNode::with_text("TAGS_ITEM", "ab"));
        assert_eq!(tags[1], &XmlNode::new("TAGS_ITEM"));
        assert_eq!(back.child("BODY").unwrap().elements().next(), Some(&inner));
        assert_eq!(back.child("SIG").unwrap().text(), "ABCD");
        let v = PayloadView::new(&kind, &r, &stored);
        assert_eq!(v.user_data(&s(&["at"])), Value::Text("2024-02-29 23:59:59.123".into()));
        assert_eq!(v.user_data(&s(&["id"])), Value::Number(5.0));
        assert_eq!(v.user_data(&s(&["tags"])), Value::Null);
        assert_eq!(
            v.user_data(&s(&["body"])),
            Value::Text("<x:order xmlns:x=\"urn:o\">a &amp; b &lt;c&gt;&#13;\n</x:order>".into())
        );
        let mut bad = XmlNode::new("DOC_TYP");
        let mut tags = XmlNode::new("TAGS");
        tags.push(XmlNode::with_text("t", "toolong"));
        bad.push(tags);
        let e = encode(&kind, &r, &bad).unwrap_err().to_string();
        assert!(e.starts_with("DOC_TYP.TAGS[1]: "), "{e}");
        let e = encode(&kind, &r, &obj("DOC_TYP", &[("AT", "2024-01-01 1:2:3.1234")])).unwrap_err().to_string();
        assert!(e.contains("DOC_TYP.AT"), "{e}");
        let e = encode(&kind, &r, &obj("DOC_TYP", &[("SIG", "ABCDEF")])).unwrap_err().to_string();
        assert!(e.contains("DOC_TYP.SIG") && e.contains("RAW(2)"), "{e}");
    }

    #[test]
    fn mismatch_table() {
        let emp = PayloadKind::Object("EMP_TYP".into());
        let order = PayloadKind::Object("ORDER_TYP".into());
        let mut many = XmlNode::new("ORDER_TYP");
        let mut items = XmlNode::new("ITEMS");
        for _ in 0..251 {
            items.push(XmlNode::new("ITEMS_ITEM"));
        }
        many.push(items);
        let mut nested_bad = XmlNode::new("ORDER_TYP");
        nested_bad.push(obj("CUSTOMER", &[("ZIP", "abc")]));
        let jms = |props: &[(&str, &str)], user: Option<(&str, &str, &str)>| {
            let mut n = XmlNode::new("jms_text_message");
            n.push(obj("oracle_jms_properties", props));
            if let Some((name, tag, v)) = user {
                let mut up = XmlNode::new("user_properties");
                up.push(obj("property", &[("name", name), (tag, v)]));
                n.push(up);
            }
            n.push(XmlNode::with_text("text_data", "hi"));
            n
        };
        let cases: Vec<(PayloadKind, XmlNode, &str)> = vec![
            (
                emp.clone(),
                obj("ORDER_TYP", &[]),
                "expected <EMP_TYP> payload for a queue of type EMP_TYP, got <ORDER_TYP>",
            ),
            (PayloadKind::Raw, obj("EMP_TYP", &[]), "expected <raw> payload for a RAW queue, got <EMP_TYP>"),
            (emp.clone(), obj("EMP_TYP", &[("FOO", "1")]), "EMP_TYP: unknown attribute FOO"),
            (emp.clone(), obj("EMP_TYP", &[("EMPNO", "1"), ("empno", "2")]), "EMP_TYP: duplicate attribute EMPNO"),
            (
                emp.clone(),
                obj("EMP_TYP", &[("DEPTNO", "100")]),
                "EMP_TYP.DEPTNO: value '100' is too large for NUMBER(2)",
            ),
            (
                emp.clone(),
                obj("EMP_TYP", &[("SAL", "100000")]),
                "EMP_TYP.SAL: value '100000' is too large for NUMBER(7,2)",
            ),
            (
                emp.clone(),
                obj("EMP_TYP", &[("HIREDATE", "2000-02-30")]),
                "EMP_TYP.HIREDATE: value '2000-02-30' is not a valid DATE",
            ),
            (emp.clone(), obj("EMP_TYP", &[("HIREDATE", "1900-02-29 0:0:0")]), "EMP_TYP.HIREDATE"),
            (emp.clone(), obj("EMP_TYP", &[("HIREDATE", "2001-01-01 24:0:0")]), "EMP_TYP.HIREDATE"),
            (
                emp.clone(),
                obj("EMP_TYP", &[("ENAME", "Maximilianus")]),
                "EMP_TYP.ENAME: value of 12 characters is too long for VARCHAR2(10)",
            ),
            (emp.clone(), obj("EMP_TYP", &[("EMPNO", "12a")]), "EMP_TYP.EMPNO: value '12a' is not a NUMBER"),
            (emp.clone(), obj("EMP_TYP", &[("EMPNO", "1e999")]), "EMP_TYP.EMPNO"),
            (order.clone(), nested_bad, "ORDER_TYP.CUSTOMER.ZIP: value 'abc' is not a NUMBER"),
            (order.clone(), many, "ORDER_TYP.ITEMS: more than 250 items"),
            (order.clone(), obj("ORDER_TYP", &[("CUSTOMER", "text")]), "ORDER_TYP.CUSTOMER: unexpected text 'text'"),
            (PayloadKind::Raw, XmlNode::with_text("raw", "0g"), "raw: value '0g' is not hexadecimal"),
            (PayloadKind::Raw, XmlNode::with_text("RAW", "abc"), "raw: value 'abc' is not hexadecimal"),
            (
                PayloadKind::JmsMap,
                jms(&[], None),
                "expected <jms_map_message> payload for a SYS.AQ$_JMS_MAP_MESSAGE queue, got <jms_text_message>",
            ),
            (
                PayloadKind::JmsText,
                jms(&[], Some(("Count", "int_value", "abc"))),
                "jms_text_message.user_properties.property[Count].int_value: value 'abc' is not a 32-bit int",
            ),
            (PayloadKind::JmsText, jms(&[], Some(("Big", "int_value", "2147483648"))), "property[Big].int_value"),
            (PayloadKind::JmsText, jms(&[], Some(("B", "byte_value", "128"))), "property[B].byte_value"),
            (PayloadKind::JmsText, jms(&[], Some(("F", "float_value", "1e39"))), "property[F].float_value"),
            (PayloadKind::JmsText, jms(&[], Some(("T", "boolean_value", "yes"))), "property[T].boolean_value"),
            (
                PayloadKind::JmsText,
                jms(&[("userid", "scott")], None),
                "jms_text_message.oracle_jms_properties.userid: is set by the server",
            ),
            (PayloadKind::JmsText, jms(&[("timestamp", "1")], None), "oracle_jms_properties.timestamp"),
            (PayloadKind::JmsText, jms(&[("group_sequence", "x")], None), "oracle_jms_properties.group_sequence"),
            (PayloadKind::JmsText, jms(&[("color", "x")], None), "unknown element <color>"),
        ];
        for (kind, node, want) in cases {
            let e = err_of(&kind, &node);
            assert!(e.contains(want), "got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn jms_structure_errors_and_other_kinds() {
        let mut n = XmlNode::new("jms_text_message");
        n.push(XmlNode::with_text("map_data", "x"));
        assert!(err_of(&PayloadKind::JmsText, &n).contains("<map_data> does not belong"));
        let mut n = XmlNode::new("jms_text_message");
        let mut up = XmlNode::new("user_properties");
        up.push(obj("property", &[("name", "A"), ("int_value", "1"), ("long_value", "2")]));
        n.push(up);
        assert!(err_of(&PayloadKind::JmsText, &n).contains("exactly one value"));
        let mut n = XmlNode::new("jms_text_message");
        let mut up = XmlNode::new("user_properties");
        up.push(obj("property", &[("name", "A"), ("int_value", "1")]));
        up.push(obj("property", &[("name", "A"), ("int_value", "2")]));
        n.push(up);
        assert!(err_of(&PayloadKind::JmsText, &n).contains("more than once"));

        // Map, bytes and object messages.
        let mut m = XmlNode::new("jms_map_message");
        let mut md = XmlNode::new("map_data");
        md.push(obj("item", &[("name", "qty"), ("short_value", " +12 ")]));
        md.push(obj("item", &[("name", "ok"), ("boolean_value", "TRUE")]));
        md.push(obj("item", &[("name", "pi"), ("double_value", "3.14")]));
        md.push(obj("item", &[("name", "s"), ("string_value", "")]));
        m.push(md);
        let back = round_trip(&PayloadKind::JmsMap, &m);
        let items: Vec<&XmlNode> = back.child("map_data").unwrap().elements().collect();
        assert_eq!(items[0].child("short_value").unwrap().text(), "12");
        assert_eq!(items[1].child("boolean_value").unwrap().text(), "true");
        assert_eq!(items[3].child("string_value"), Some(&XmlNode::new("string_value")));
        let mut b = XmlNode::new("jms_bytes_message");
        b.push(XmlNode::with_text("bytes_data", "0a0B"));
        let back = round_trip(&PayloadKind::JmsBytes, &b);
        assert_eq!(back.child("bytes_data").unwrap().text(), "0A0B");
        let mut o = XmlNode::new("jms_object_message");
        let mut props = XmlNode::new("oracle_jms_properties");
        let mut reply = XmlNode::new("reply_to");
        reply.push(XmlNode::with_text("protocol", "0"));
        reply.push(XmlNode::with_text("agent_name", "bob"));
        props.push(reply);
        props.push(XmlNode::with_text("group_sequence", "007"));
        props.push(XmlNode::with_text("type", " T "));
        o.push(props);
        o.push(XmlNode::with_text("ser_object_data", "ACED"));
        let back = round_trip(&PayloadKind::JmsObject, &o);
        let p = back.child("oracle_jms_properties").unwrap();
        let names: Vec<&str> = p.elements().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["type", "reply_to", "group_sequence"]);
        let names: Vec<&str> = p.child("reply_to").unwrap().elements().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["agent_name", "protocol"]);
        assert_eq!(p.child("group_sequence").unwrap().text(), "7");
        let r = reg();
        let stored = encode(&PayloadKind::JmsObject, &r, &o).unwrap();
        let v = PayloadView::new(&PayloadKind::JmsObject, &r, &stored);
        assert_eq!(v.user_property("JMSXGroupSeq"), Value::Number(7.0));
        assert_eq!(v.user_property("type"), Value::Text("T".into()));
        assert_eq!(v.user_property("appid"), Value::Null);
    }

    #[test]
    fn user_data_lookups() {
        let r = reg();
        let emp = PayloadKind::Object("EMP_TYP".into());
        let stored = encode(&emp, &r, &example_payload(EX02)).unwrap();
        let v = PayloadView::new(&emp, &r, &stored);
        assert_eq!(v.user_data(&s(&["deptno"])), Value::Number(40.0));
        assert_eq!(v.user_data(&s(&["comm"])), Value::Number(312.75));
        assert_eq!(v.user_data(&s(&["ename"])), Value::Text("Okafor".into()));
        assert_eq!(v.user_data(&s(&["hiredate"])), Value::Text("2023-09-18 00:00:00".into()));
        assert_eq!(v.user_data(&s(&["job"])), Value::Null);
        assert_eq!(v.user_data(&s(&["nope"])), Value::Null);
        assert_eq!(v.user_data(&s(&[])), Value::Null);
        assert_eq!(v.user_data(&s(&["deptno", "x"])), Value::Null);
        assert_eq!(v.user_property("Country"), Value::Null);

        let order = PayloadKind::Object("ORDER_TYP".into());
        let stored = encode(&order, &r, &example_payload(EX01)).unwrap();
        let v = PayloadView::new(&order, &r, &stored);
        assert_eq!(v.user_data(&s(&["customer", "country"])), Value::Text("USA".into()));
        assert_eq!(v.user_data(&s(&["customer", "zip"])), Value::Number(97209.0));
        assert_eq!(v.user_data(&s(&["customer"])), Value::Null);
        assert_eq!(v.user_data(&s(&["items"])), Value::Null);
        assert_eq!(v.user_data(&s(&["items", "items_item"])), Value::Null);
        assert_eq!(v.user_data(&s(&["orderno"])), Value::Number(4471.0));

        let raw = PayloadKind::Raw;
        let v = PayloadView::new(&raw, &r, &[0xab, 1]);
        assert_eq!(v.user_data(&[]), Value::Text("AB01".into()));
        assert_eq!(v.user_data(&s(&["x"])), Value::Null);
        assert_eq!(v.user_property("x"), Value::Null);

        let xml = PayloadKind::Xml;
        let mut doc = XmlNode::new("po");
        doc.push(XmlNode::with_text("Region", "EAST"));
        let stored = encode(&xml, &r, &doc).unwrap();
        let v = PayloadView::new(&xml, &r, &stored);
        assert_eq!(v.user_data(&s(&["region"])), Value::Text("EAST".into()));
    }

    #[test]
    fn jms_user_property_lookups() {
        let r = reg();
        let kind = PayloadKind::JmsText;
        let mut p = example_payload(EX03);
        let up = p.children.iter_mut().find_map(|c| match c {
            XmlChild::Element(e) if e.name == "user_properties" => Some(e),
            _ => None,
        });
        let up = up.unwrap();
        up.push(obj("property", &[("name", "count"), ("int_value", "-3")]));
        up.push(obj("property", &[("name", "COUNT"), ("long_value", "9")]));
        up.push(obj("property", &[("name", "vip"), ("boolean_value", "false")]));
        let stored = encode(&kind, &r, &p).unwrap();
        let v = PayloadView::new(&kind, &r, &stored);
        assert_eq!(v.user_property("Warehouse"), Value::Text("PDX-2".into()));
        assert_eq!(v.user_property("warehouse"), Value::Text("PDX-2".into()));
        assert_eq!(v.user_property("Carrier"), Value::Text("Cascade Freight".into()));
        assert_eq!(v.user_property("count"), Value::Number(-3.0));
        assert_eq!(v.user_property("COUNT"), Value::Number(9.0));
        assert_eq!(v.user_property("vip"), Value::Bool(false));
        assert_eq!(v.user_property("missing"), Value::Null);
        assert_eq!(v.user_property("appid"), Value::Text("aqgate-demo".into()));
        assert_eq!(v.user_property("JMSXGroupID"), Value::Text("dock-3".into()));
        assert_eq!(v.user_data(&s(&["text_data"])), Value::Text("Pallet 17 leaves dock 3 at 06:40.".into()));
        assert_eq!(v.user_data(&s(&["text_len"])), Value::Number(33.0));
        assert_eq!(v.user_data(&s(&["header", "appid"])), Value::Text("aqgate-demo".into()));
    }

    #[test]
    fn raw_and_xml_kinds() {
        let r = reg();
        let back = round_trip(&PayloadKind::Raw, &XmlNode::with_text("raw", " 02 3f4523\n"));
        assert_eq!(back, XmlNode::with_text("raw", "023F4523"));
        assert_eq!(encode(&PayloadKind::Raw, &r, &XmlNode::new("raw")).unwrap(), Vec::<u8>::new());
        assert_eq!(round_trip(&PayloadKind::Raw, &XmlNode::new("raw")), XmlNode::new("raw"));
        let mut nested = XmlNode::new("raw");
        nested.push(XmlNode::new("x"));
        assert!(encode(&PayloadKind::Raw, &r, &nested).is_err());

        let mut doc = XmlNode::new("p:doc");
        doc.attrs.push(("xmlns:p".into(), "urn:p".into()));
        doc.attrs.push(("note".into(), "a\"b\t<c>\n".into()));
        doc.children.push(XmlChild::Text(" lead ".into()));
        doc.push(XmlNode::with_text("p:x", "]]> &amp;"));
        doc.children.push(XmlChild::Text("tail".into()));
        doc.push(XmlNode::new("empty"));
        assert_eq!(round_trip(&PayloadKind::Xml, &doc), doc);
        // Adjacent and empty text children are merged / dropped.
        let mut split = XmlNode::new("a");
        split.children = vec![XmlChild::Text("x".into()), XmlChild::Text(String::new()), XmlChild::Text("y".into())];
        assert_eq!(round_trip(&PayloadKind::Xml, &split), XmlNode::with_text("a", "xy"));
        // Unserializable content is an error, not a broken stored form.
        assert!(encode(&PayloadKind::Xml, &r, &XmlNode::new("1bad")).is_err());
        assert!(encode(&PayloadKind::Xml, &r, &XmlNode::with_text("a", "\u{1}")).is_err());
        let mut dup = XmlNode::new("a");
        dup.attrs = vec![("k".into(), "1".into()), ("k".into(), "2".into())];
        assert!(encode(&PayloadKind::Xml, &r, &dup).is_err());
    }

    #[test]
    fn decode_rejects_corrupt_stored_forms() {
        let r = reg();
        let emp = PayloadKind::Object("EMP_TYP".into());
        for bad in [
            &b"<ORDER_TYP/>"[..],
            b"<EMP_TYP>",
            b"\xff\xfe",
            b"",
            b"<!DOCTYPE x><EMP_TYP/>",
            b"<EMP_TYP/><EMP_TYP/>",
            b"x<EMP_TYP/>",
        ] {
            assert!(decode(&emp, &r, bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode(&PayloadKind::JmsText, &r, b"<jms_map_message/>").is_err());
        assert!(decode(&PayloadKind::Xml, &r, b"<a><b></a>").is_err());
        let v = PayloadView::new(&emp, &r, b"<EMP_TYP><DEPTNO>");
        assert_eq!(v.user_data(&s(&["deptno"])), Value::Null);
    }

    #[test]
    fn decimal_rounding() {
        let round = |t: &str, s: i64| {
            let mut d = Decimal::parse(t).unwrap();
            d.round_to_scale(s);
            d.to_plain()
        };
        assert_eq!(round("1.005", 2), "1.01");
        assert_eq!(round("-1.005", 2), "-1.01");
        assert_eq!(round("9.995", 2), "10");
        assert_eq!(round("0.0049", 2), "0");
        assert_eq!(round("0.5", 0), "1");
        assert_eq!(round("12345", -2), "12300");
        assert_eq!(round("12355", -1), "12360");
        assert_eq!(round("0.00001", 2), "0");
        assert_eq!(round("1.5e-3", 4), "0.0015");
        assert_eq!(round("000120.0100", 5), "120.01");
        for bad in ["", "+", ".", "1..2", "1e", "1e+", "e5", "1 2", "0x10", "1e12345", "--1"] {
            assert!(Decimal::parse(bad).is_none(), "{bad}");
        }
        assert!(Decimal::parse(".5").is_some() && Decimal::parse("5.").is_some());
    }

    #[test]
    fn dates() {
        for good in ["1996-01-01 0:0:0", "2000-02-29", "2000-08-23T10:20:30", "9999-12-31 23:59:59", "2024-2-3 1:2:3"] {
            assert!(DateTime::parse(good).is_some(), "{good}");
        }
        for bad in [
            "1900-02-29",
            "2000-02-30",
            "2000-13-01",
            "0000-01-01",
            "99-01-01",
            "2000-01-01 1:2",
            "2000-01-01 1:60:0",
            "2000-01-01x",
            "2000-04-31",
        ] {
            assert!(DateTime::parse(bad).is_none(), "{bad}");
        }
        // A DATE may carry zero fractional seconds, not others.
        let kind = PayloadKind::Object("EMP_TYP".into());
        assert!(encode(&kind, &reg(), &obj("EMP_TYP", &[("HIREDATE", "1996-01-01 00:00:00.0")])).is_ok());
        assert!(encode(&kind, &reg(), &obj("EMP_TYP", &[("HIREDATE", "1996-01-01 00:00:00.5")])).is_err());
    }

    fn emp_strategy() -> impl Strategy<Value = Vec<(&'static str, String)>> {
        let num = |max: u32| proptest::option::of((0..max).prop_map(|n| n.to_string()));
        let money = proptest::option::of((0u32..100_000, 0u32..100).prop_map(|(i, f)| format!("{i}.{f:02}")));
        let name = |n: usize| {
            proptest::option::of(
                proptest::string::string_regex(&format!("[a-zA-Z0-9 <>&\"'éß\u{1F600}]{{1,{n}}}")).unwrap(),
            )
        };
        let date = proptest::option::of(
            (1u32..=9999, 1u32..=12, 1u32..=28, 0u32..24, 0u32..60, 0u32..60)
                .prop_map(|(y, m, d, h, mi, s)| format!("{y:04}-{m:02}-{d:02} {h}:{mi}:{s}")),
        );
        (num(10_000), name(10), name(9), num(10_000), date, money.clone(), money, num(100)).prop_map(
            |(empno, ename, job, mgr, hire, sal, comm, deptno)| {
                [
                    ("EMPNO", empno),
                    ("ENAME", ename),
                    ("JOB", job),
                    ("MGR", mgr),
                    ("HIREDATE", hire),
                    ("SAL", sal),
                    ("COMM", comm),
                    ("DEPTNO", deptno),
                ]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect()
            },
        )
    }

    fn arb_xml() -> impl Strategy<Value = XmlNode> {
        let name = "[a-zA-Z_][a-zA-Z0-9_.-]{0,6}";
        let text = "[a-z <>&\"'\r\n\t]{1,8}";
        let leaf = (name, proptest::option::of(text)).prop_map(|(n, t)| match t {
            Some(t) => XmlNode::with_text(n, t),
            None => XmlNode::new(n),
        });
        leaf.prop_recursive(4, 24, 4, move |inner| {
            (
                name,
                proptest::collection::vec((inner, proptest::option::of(text)), 0..4),
                proptest::option::of(("k[0-9]", text)),
            )
                .prop_map(|(n, kids, attr)| {
                    let mut node = XmlNode::new(n);
                    if let Some((k, v)) = attr {
                        node.attrs.push((k, v));
                    }
                    for (k, t) in kids {
                        node.push(k);
                        if let Some(t) = t {
                            node.children.push(XmlChild::Text(t));
                        }
                    }
                    node
                })
        })
    }

    /// A plain byte-at-a-time decoder, to check `parse_hex`'s SIMD path and its byte loop.
    fn parse_hex_reference(text: &str) -> Result<Vec<u8>, usize> {
        let mut out = Vec::new();
        let mut high: Option<u8> = None;
        for (i, b) in text.bytes().enumerate() {
            if b" \t\r\n".contains(&b) {
                continue;
            }
            let n = (b as char).to_digit(16).ok_or(i)? as u8;
            match high.take() {
                None => high = Some(n),
                Some(h) => out.push(h << 4 | n),
            }
        }
        if high.is_some() { Err(usize::MAX) } else { Ok(out) }
    }

    proptest! {
        #[test]
        fn hex_fast_path_agrees_with_the_reference(
            digits in "[0-9a-fA-F]{0,80}",
            noise in proptest::option::of((any::<prop::sample::Index>(), prop::sample::select(vec![" ", "\n", "\t", "\r", "g", "é", "0"]))),
        ) {
            let mut text = digits.clone();
            if let Some((at, what)) = noise {
                text.insert_str(at.index(text.len() + 1), what);
            }
            let got = parse_hex(&text);
            match parse_hex_reference(&text) {
                Ok(bytes) => prop_assert_eq!(got, Ok(bytes)),
                Err(usize::MAX) => prop_assert!(got.unwrap_err().contains("odd number of digits")),
                Err(pos) => {
                    let msg = got.unwrap_err();
                    prop_assert!(msg.contains(&format!("at position {pos})")), "{}", msg);
                }
            }
        }

        #[test]
        fn raw_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..200), lower in any::<bool>()) {
            let r = TypeRegistry::default();
            let h = if lower { hex::encode(&bytes) } else { hex::encode_upper(&bytes) };
            let stored = encode(&PayloadKind::Raw, &r, &XmlNode::with_text("raw", h)).unwrap();
            prop_assert_eq!(&stored, &bytes);
            let back = decode(&PayloadKind::Raw, &r, &stored).unwrap();
            prop_assert_eq!(back.text(), hex::encode_upper(&bytes));
            prop_assert_eq!(hex_upper(&bytes), hex::encode_upper(&bytes));
            prop_assert_eq!(encode(&PayloadKind::Raw, &r, &back).unwrap(), bytes);
        }

        #[test]
        fn emp_round_trip(fields in emp_strategy(), shuffle in any::<prop::sample::Index>()) {
            let r = reg();
            let kind = PayloadKind::Object("EMP_TYP".into());
            let want = obj("EMP_TYP", &fields.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
            // Send in a rotated order with lower-case names: canonical order comes back.
            let mut sent: Vec<(String, String)> =
                fields.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
            if !sent.is_empty() {
                let n = shuffle.index(sent.len());
                sent.rotate_left(n);
            }
            let node = obj("emp_typ", &sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>());
            let stored = encode(&kind, &r, &node).unwrap();
            let back = decode(&kind, &r, &stored).unwrap();
            prop_assert_eq!(&back, &want);
            prop_assert_eq!(encode(&kind, &r, &back).unwrap(), stored.clone());
            let v = PayloadView::new(&kind, &r, &stored);
            for (k, val) in &fields {
                let got = v.user_data(&[k.to_ascii_lowercase()]);
                match *k {
                    "ENAME" | "JOB" => prop_assert_eq!(got, Value::Text(val.clone())),
                    "HIREDATE" => prop_assert!(matches!(got, Value::Text(_))),
                    _ => prop_assert_eq!(got, Value::Number(val.parse::<f64>().unwrap())),
                }
            }
        }

        #[test]
        fn xml_round_trip(node in arb_xml()) {
            let r = TypeRegistry::default();
            let canon = normalize_xml(&node, 0).unwrap();
            let stored = encode(&PayloadKind::Xml, &r, &node).unwrap();
            prop_assert_eq!(decode(&PayloadKind::Xml, &r, &stored).unwrap(), canon);
        }

        #[test]
        fn never_panics_on_stored_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            text in "[<>/a-zA-Z_ &;#=\"]{0,40}",
        ) {
            let r = reg();
            let kinds = [
                PayloadKind::Raw,
                PayloadKind::Object("EMP_TYP".into()),
                PayloadKind::JmsText,
                PayloadKind::Xml,
                PayloadKind::Object("GONE".into()),
            ];
            for k in &kinds {
                for b in [&bytes[..], text.as_bytes()] {
                    let _ = decode(k, &r, b);
                    let v = PayloadView::new(k, &r, b);
                    let _ = v.user_data(&["deptno".to_string()]);
                    let _ = v.user_property("x");
                }
            }
        }

        #[test]
        fn never_panics_on_payload_nodes(node in arb_xml(), kind_idx in 0usize..7) {
            let r = reg();
            let kinds = [
                PayloadKind::Raw,
                PayloadKind::Object("EMP_TYP".into()),
                PayloadKind::Object("ORDER_TYP".into()),
                PayloadKind::JmsText,
                PayloadKind::JmsMap,
                PayloadKind::Xml,
                PayloadKind::Object("GONE".into()),
            ];
            let _ = encode(&kinds[kind_idx], &r, &node);
        }

        #[test]
        fn numbers_fit_their_declaration(i in -99_999i64..=99_999, f in 0u32..1000) {
            let r = reg();
            let kind = PayloadKind::Object("EMP_TYP".into());
            let t = format!("{i}.{f:03}");
            match encode(&kind, &r, &obj("EMP_TYP", &[("SAL", &t)])) {
                Ok(stored) => {
                    let v = PayloadView::new(&kind, &r, &stored).user_data(&["sal".to_string()]);
                    let Value::Number(n) = v else { panic!("not a number") };
                    let want = t.parse::<f64>().unwrap();
                    prop_assert!((n - want).abs() <= 0.005 + 1e-9, "{} vs {}", n, want);
                }
                Err(e) => prop_assert!(e.to_string().contains("EMP_TYP.SAL"), "{}", e),
            }
        }
    }
}
