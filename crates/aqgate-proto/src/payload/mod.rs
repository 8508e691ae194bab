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
//! * `SYS.ANYDATA`: any one of the above (or `<VARCHAR2>` / `<NUMBER>`), its type stored
//!   with it and returned as `aqgate:type_name` on the payload element ([`anydata`]).
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
//! name; they come back as `<ATTR_ITEM>` (as in Oracle's documented examples), at most `max` of them.
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
use std::fmt;

use crate::idap::model::{XmlChild, XmlNode};

mod anydata;
mod jms;
mod object;
mod stored;
mod transform;
mod types;
mod view;

pub use self::anydata::{AnyType, TYPE_NAME_ATTR, type_name_attr, type_of_returned, without_type_name};
use self::jms::*;
pub use self::jms::{set_jms_timestamp, set_jms_userid};
use self::object::*;
use self::stored::*;
pub use self::transform::*;
pub use self::types::*;
pub use self::view::*;

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
    /// `SYS.ANYDATA`: each message of its own type, stored with it.
    AnyData,
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
            "ANYDATA" if schema.is_none() || schema == Some("SYS") => PayloadKind::AnyData,
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
            PayloadKind::AnyData => f.write_str("SYS.ANYDATA"),
        }
    }
}

// ---- encode / decode ----------------------------------------------------------------------

/// Validates the `<message_payload>` element against the queue's payload kind and returns the
/// stored form. A payload marked with `aqgate:type_name` (one that came from an ANYDATA
/// queue) goes into a typed queue only if the type it names is the queue's, and is stored
/// without the mark.
pub fn encode(kind: &PayloadKind, reg: &TypeRegistry, node: &XmlNode) -> Result<Vec<u8>, PayloadError> {
    if *kind == PayloadKind::AnyData {
        return anydata::encode_any(reg, node);
    }
    anydata::check_marked(kind, node)?;
    let node = &*without_type_name(node);
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
    if *kind == PayloadKind::AnyData {
        return anydata::decode_any(stored);
    }
    let text = std::str::from_utf8(stored).map_err(|e| PayloadError::Corrupt(format!("not UTF-8: {e}")))?;
    let node = parse_xml(text).map_err(PayloadError::Corrupt)?;
    let expected = match kind {
        PayloadKind::Object(t) => Some(t.as_str()),
        PayloadKind::Xml | PayloadKind::Raw | PayloadKind::AnyData => None,
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
        PayloadKind::AnyData => {
            let stored = anydata::encode_any(reg, node)?;
            Ok(anydata::split_stored(&stored)?.1)
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
