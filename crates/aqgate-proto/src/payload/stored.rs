//! The stored form: canonical XML text, checked against the XML rules ([`crate::xml`]) and
//! written as the IDAP writer writes payloads; read back with quick-xml (DOCTYPE refused).

use std::collections::BTreeSet;

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

use super::*;
use crate::idap::model::{XmlChild, XmlNode};
use crate::idap::write_node;
use crate::xml;

/// Merges adjacent text children and drops empty ones (what a parser would give back).
pub(super) fn normalize_xml(node: &XmlNode, depth: usize) -> Result<XmlNode, PayloadError> {
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

pub(super) fn push_text(node: &mut XmlNode, t: &str) {
    if t.is_empty() {
        return;
    }
    if let Some(XmlChild::Text(last)) = node.children.last_mut() {
        last.push_str(t);
    } else {
        node.children.push(XmlChild::Text(t.to_string()));
    }
}

/// Escapes `s` (an attribute value if `attr`) into `out`; a character XML does not allow
/// is an error.
pub(super) fn escape_into(out: &mut String, s: &str, attr: bool, path: &str) -> Result<(), PayloadError> {
    check_chars(s, path)?;
    if attr {
        xml::escape_attr(out, s)
    } else {
        xml::escape_text(out, s)
    }
    Ok(())
}

pub(super) fn check_chars(s: &str, path: &str) -> Result<(), PayloadError> {
    match xml::first_invalid_char(s) {
        Some((_, c)) => Err(invalid(path, format!("character U+{:04X} cannot appear in XML", u32::from(c)))),
        None => Ok(()),
    }
}

/// Serializes an element (no declaration, no added whitespace).
pub(super) fn to_xml(node: &XmlNode) -> Result<String, PayloadError> {
    let mut out = String::new();
    write_elem(&mut out, node, 0)?;
    Ok(out)
}

/// Writes `n` (at nesting `depth`) after checking that it can be written as XML: names,
/// unique attributes, characters, depth.
pub(super) fn write_elem(out: &mut String, n: &XmlNode, depth: usize) -> Result<(), PayloadError> {
    check_elem(n, depth)?;
    write_node(out, n);
    Ok(())
}

/// The checks of [`write_elem`], in document order (so the first problem is reported).
pub(super) fn check_elem(n: &XmlNode, depth: usize) -> Result<(), PayloadError> {
    if depth > MAX_XML_DEPTH {
        return Err(invalid(&n.name, format!("nested deeper than {MAX_XML_DEPTH} levels")));
    }
    if !xml::is_xml_name(&n.name) {
        return Err(invalid("payload", format!("invalid element name {}", quote(&n.name))));
    }
    let mut seen = BTreeSet::new();
    for (k, v) in &n.attrs {
        if !xml::is_xml_name(k) {
            return Err(invalid(&n.name, format!("invalid attribute name {}", quote(k))));
        }
        if !seen.insert(k.as_str()) {
            return Err(invalid(&n.name, format!("duplicate attribute {k}")));
        }
        check_chars(v, &n.name)?;
    }
    for c in &n.children {
        match c {
            XmlChild::Text(t) => check_chars(t, &n.name)?,
            XmlChild::Element(e) => check_elem(e, depth + 1)?,
        }
    }
    Ok(())
}

pub(super) fn start_node(e: &BytesStart<'_>) -> Result<XmlNode, String> {
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
pub(super) fn parse_xml(s: &str) -> Result<XmlNode, String> {
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
