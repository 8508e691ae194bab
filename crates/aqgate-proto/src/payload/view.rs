//! Selector lookups on a stored payload ([`PayloadView`]): `tab.user_data` paths and JMS
//! user properties, typed as the condition language compares them.

use std::cell::OnceCell;

use super::*;
use crate::idap::model::{XmlChild, XmlNode};
use crate::value::Value;

/// A stored payload as seen by selector conditions; decodes lazily, at most once.
pub struct PayloadView<'a> {
    pub(super) kind: &'a PayloadKind,
    pub(super) reg: &'a TypeRegistry,
    pub(super) stored: &'a [u8],
    pub(super) tree: OnceCell<Option<XmlNode>>,
}

impl<'a> PayloadView<'a> {
    pub fn new(kind: &'a PayloadKind, reg: &'a TypeRegistry, stored: &'a [u8]) -> Self {
        Self { kind, reg, stored, tree: OnceCell::new() }
    }

    pub(super) fn tree(&self) -> Option<&XmlNode> {
        self.tree
            .get_or_init(|| match self.kind {
                PayloadKind::Raw | PayloadKind::AnyData => None,
                _ => std::str::from_utf8(self.stored).ok().and_then(|s| parse_xml(s).ok()),
            })
            .as_ref()
    }

    /// `tab.user_data.<path>` (segments lower-case, matched case-insensitively).
    pub fn user_data(&self, path: &[String]) -> Value {
        match self.kind {
            PayloadKind::Raw if path.is_empty() => Value::Text(hex_upper(self.stored)),
            // Conditions do not look into ANYDATA values (refused before they run).
            PayloadKind::Raw | PayloadKind::AnyData => Value::Null,
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

    /// [`PayloadView::user_data`], or `Err(length)` when its text would be longer than
    /// `max_bytes` (a RAW payload's hex is refused before it is made).
    pub fn user_data_within(&self, path: &[String], max_bytes: usize) -> Result<Value, usize> {
        if matches!(self.kind, PayloadKind::Raw) && path.is_empty() && self.stored.len() * 2 > max_bytes {
            return Err(self.stored.len() * 2);
        }
        match self.user_data(path) {
            Value::Text(s) if s.len() > max_bytes => Err(s.len()),
            v => Ok(v),
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

pub(super) fn jms_header_field(root: &XmlNode, field: &str) -> Value {
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
pub(super) fn object_lookup(reg: &TypeRegistry, tname: &str, root: &XmlNode, path: &[String]) -> Value {
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
