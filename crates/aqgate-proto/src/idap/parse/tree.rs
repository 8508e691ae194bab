//! Step 1 of parsing: bytes to a checked tree of [`Elem`]s that borrows from the document,
//! with the byte, depth, attribute and namespace limits and the XML character rules enforced
//! while reading.

use std::borrow::Cow;

use quick_xml::NsReader;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;

use super::*;
use crate::xml;

/// An element as read, with its namespace resolved. Names, attribute values and text
/// borrow from the document where they are written as they are (no entity or character
/// reference to expand), so a request's payload bytes are copied once, into the model.
#[derive(Debug)]
pub(super) struct Elem<'a> {
    /// Resolved namespace URI; `None` when the name is in no namespace.
    pub(super) ns: Option<Cow<'a, str>>,
    /// The name as written, prefix included.
    pub(super) qname: Cow<'a, str>,
    pub(super) local: Cow<'a, str>,
    pub(super) attrs: Vec<Attr<'a>>,
    pub(super) children: Vec<Node<'a>>,
    /// For children of `message_payload` and `Header` only: the prefixed namespace bindings
    /// in scope from the ancestors, used to keep an extracted payload self-contained.
    pub(super) outer_ns: Vec<(String, String)>,
}

#[derive(Debug)]
pub(super) struct Attr<'a> {
    pub(super) qname: Cow<'a, str>,
    /// Resolved namespace of a prefixed attribute (unprefixed attributes have none).
    pub(super) ns: Option<Cow<'a, str>>,
    pub(super) value: Cow<'a, str>,
    /// `xmlns` or `xmlns:p`.
    pub(super) is_decl: bool,
}

#[derive(Debug)]
pub(super) enum Node<'a> {
    Elem(Elem<'a>),
    Text(Cow<'a, str>),
}

impl<'a> Elem<'a> {
    pub(super) fn elements(&self) -> impl Iterator<Item = &Elem<'a>> {
        self.children.iter().filter_map(|c| match c {
            Node::Elem(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    pub(super) fn push_text(&mut self, text: Cow<'a, str>) {
        if text.is_empty() {
            return;
        }
        // Text split by comments, CDATA sections or entity boundaries is one text node.
        if let Some(Node::Text(t)) = self.children.last_mut() {
            t.to_mut().push_str(&text);
        } else {
            self.children.push(Node::Text(text));
        }
    }
}

/// The namespaces of the protocol's own elements, shared rather than copied per element.
pub(super) const KNOWN_NAMESPACES: [&str; 2] = [ENVELOPE_NS, ACCESS_NS];

pub(super) fn ns_string(res: ResolveResult<'_>) -> Result<Option<Cow<'static, str>>> {
    match res {
        ResolveResult::Unbound => Ok(None),
        ResolveResult::Bound(ns) => Ok(Some(match KNOWN_NAMESPACES.iter().find(|k| k.as_bytes() == ns.as_ref()) {
            Some(known) => Cow::Borrowed(*known),
            None => Cow::Owned(utf8(ns.as_ref())),
        })),
        ResolveResult::Unknown(p) => {
            Err(CodecError::Malformed(format!("undeclared namespace prefix '{}'", snip(&String::from_utf8_lossy(&p)))))
        }
    }
}

pub(super) fn utf8(bytes: &[u8]) -> String {
    // The input was checked to be UTF-8 and quick-xml splits it at ASCII delimiters only,
    // so the lossy path (several times slower) is never taken in practice.
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `part` as a slice of `text` when it is one (quick-xml hands out slices of the document
/// it reads from a `&str`), else a copy of it.
pub(super) fn borrow_from<'a>(text: &'a str, part: &[u8]) -> Cow<'a, str> {
    let start = part.as_ptr().addr().wrapping_sub(text.as_ptr().addr());
    match start.checked_add(part.len()).and_then(|end| text.get(start..end)) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(utf8(part)),
    }
}

/// Refuses a document holding a character XML does not allow (C0 controls other than tab,
/// line feed and carriage return; U+FFFE, U+FFFF): it is not well-formed, and echoed back
/// in a response it would make that response unreadable. UTF-8 excludes surrogates.
pub(super) fn check_xml_chars(text: &str) -> Result<()> {
    match xml::first_invalid_char(text) {
        Some((at, c)) => {
            Err(CodecError::Malformed(format!("character U+{:04X} at byte {at} is not allowed in XML", u32::from(c))))
        }
        None => Ok(()),
    }
}

/// The same for what character references produced (text written as it is was checked
/// with the document; a borrowed value is such text).
#[expect(clippy::ptr_arg, reason = "whether the value is owned (expanded) is the point")]
pub(super) fn check_referenced_chars(value: &Cow<'_, str>) -> Result<()> {
    let Cow::Owned(s) = value else { return Ok(()) };
    if let Some(c) = s.chars().find(|c| !xml::is_xml_char(*c)) {
        return Err(CodecError::Malformed(format!(
            "a character reference to U+{:04X} is not allowed in XML",
            u32::from(c)
        )));
    }
    Ok(())
}

/// [`borrow_from`] for a value quick-xml may have unescaped into a new string.
pub(super) fn rebase<'a>(text: &'a str, value: Cow<'_, str>) -> Cow<'a, str> {
    match value {
        Cow::Borrowed(s) => borrow_from(text, s.as_bytes()),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// Reads the whole document into an [`Elem`] tree, enforcing the limits and XML rules.
pub(super) fn build_tree<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Elem<'a>> {
    if bytes.len() > limits.max_bytes {
        return Err(CodecError::TooLarge(format!("{} bytes, the limit is {}", bytes.len(), limits.max_bytes)));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| CodecError::Malformed(format!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
    check_xml_chars(text)?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);

    let mut reader = NsReader::from_str(text);
    let mut stack: Vec<Elem<'a>> = Vec::new();
    // The namespace declarations of each open element (parallel to `stack`); quick-xml
    // resolves names itself, these serve the limit and payload extraction.
    let mut decls: Vec<Vec<(String, String)>> = Vec::new();
    let mut root: Option<Elem<'a>> = None;

    loop {
        let (res, event) = match reader.read_resolved_event() {
            Ok(ok) => ok,
            Err(e) => {
                return Err(CodecError::Malformed(format!(
                    "{} (at byte {})",
                    snip(&e.to_string()),
                    reader.error_position()
                )));
            }
        };
        let ns = ns_string(res)?;
        match event {
            Event::Start(start) | Event::Empty(start) if root.is_some() => {
                return Err(CodecError::Malformed(format!(
                    "element <{}> after the end of the root element",
                    snip(&utf8(start.name().as_ref()))
                )));
            }
            Event::Start(start) => {
                let (elem, own) = open_elem(text, &reader, &start, ns, &stack, &decls, limits)?;
                stack.push(elem);
                decls.push(own);
            }
            Event::Empty(start) => {
                let (elem, _) = open_elem(text, &reader, &start, ns, &stack, &decls, limits)?;
                close_elem(elem, &mut stack, &mut root);
            }
            Event::End(_) => {
                // quick-xml has already checked that the end tag matches the open one.
                let Some(elem) = stack.pop() else {
                    return Err(CodecError::Malformed("unexpected end tag".into()));
                };
                decls.pop();
                close_elem(elem, &mut stack, &mut root);
            }
            Event::Text(t) => {
                // Text without references is the document's own (already checked) UTF-8.
                let s = if memchr::memchr(b'&', &t).is_some() {
                    let s = t.unescape().map_err(|e| {
                        CodecError::Malformed(format!(
                            "{} (near byte {})",
                            snip(&e.to_string()),
                            reader.buffer_position()
                        ))
                    })?;
                    check_referenced_chars(&s)?;
                    s
                } else {
                    borrow_from(text, &t)
                };
                match stack.last_mut() {
                    Some(parent) => parent.push_text(s),
                    None if s.trim().is_empty() => {}
                    None => {
                        return Err(CodecError::Malformed("text outside the root element".into()));
                    }
                }
            }
            Event::CData(c) => match stack.last_mut() {
                Some(parent) => parent.push_text(borrow_from(text, &c.into_inner())),
                None => return Err(CodecError::Malformed("CDATA outside the root element".into())),
            },
            Event::Decl(d) => {
                if let Some(enc) = d.encoding() {
                    let enc = enc.map_err(|e| CodecError::Malformed(e.to_string()))?;
                    let enc = utf8(&enc);
                    if !enc.eq_ignore_ascii_case("utf-8") && !enc.eq_ignore_ascii_case("us-ascii") {
                        return Err(CodecError::Unsupported(format!(
                            "encoding '{}': documents must be UTF-8",
                            snip(&enc)
                        )));
                    }
                }
            }
            Event::DocType(_) => return Err(CodecError::Doctype),
            Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
    }
    if let Some(open) = stack.last() {
        return Err(CodecError::Malformed(format!(
            "unexpected end of document: <{}> is not closed",
            snip(&open.qname)
        )));
    }
    root.ok_or_else(|| CodecError::Malformed("no root element".into()))
}

/// Builds an element from a start tag; returns it with its own namespace declarations
/// (`(prefix, uri)`, the default namespace with an empty prefix).
pub(super) fn open_elem<'a>(
    text: &'a str,
    reader: &NsReader<&[u8]>,
    start: &BytesStart<'_>,
    ns: Option<Cow<'a, str>>,
    stack: &[Elem<'a>],
    decls: &[Vec<(String, String)>],
    limits: &Limits,
) -> Result<(Elem<'a>, Vec<(String, String)>)> {
    if stack.len() >= limits.max_depth {
        return Err(CodecError::TooDeep(limits.max_depth));
    }
    let entries = limits.max_recipients.saturating_mul(RECIPIENT_ENTRIES_PER_RECIPIENT);
    if let [.., header, list] = stack
        && list.local == "recipient_list"
        && header.local == "message_header"
        && list.children.len() >= entries
        && !stack.iter().any(|e| e.local == "message_payload")
    {
        return Err(CodecError::TooManyRecipients(format!(
            "a recipient_list of over {entries} entries, and a message may name at most {} recipients \
             (--max-recipients); send to fewer recipients per message, or to subscribers",
            limits.max_recipients
        )));
    }
    let qname = borrow_from(text, start.name().as_ref());
    // quick-xml takes whatever precedes the first blank as the name, even nothing (`<\r/>`),
    // which the writer would turn into an end tag `</>`: only XML names are accepted.
    if !xml::is_xml_name(&qname) {
        return Err(CodecError::Malformed(format!("<{}> is not an element name", snip(&qname))));
    }
    let local = borrow_from(text, start.local_name().as_ref());
    let mut attrs = Vec::new();
    let mut own = Vec::new();
    for attr in start.attributes() {
        if attrs.len() >= MAX_ATTRIBUTES {
            return Err(CodecError::TooLarge(format!("<{}> has more than {MAX_ATTRIBUTES} attributes", snip(&qname))));
        }
        let attr = attr.map_err(|e| CodecError::Malformed(format!("bad attribute in <{}>: {e}", snip(&qname))))?;
        let name = borrow_from(text, attr.key.as_ref());
        if !xml::is_xml_name(&name) {
            return Err(CodecError::Malformed(format!("bad attribute name {} in <{}>", snip(&name), snip(&qname))));
        }
        let value = attr
            .unescape_value()
            .map_err(|e| CodecError::Malformed(format!("bad attribute {} in <{}>: {e}", snip(&name), snip(&qname))))?;
        check_referenced_chars(&value)?;
        let value = rebase(text, value);
        let is_decl = name == "xmlns" || name.starts_with("xmlns:");
        let ns = if !is_decl && name.contains(':') { ns_string(reader.resolve_attribute(attr.key).0)? } else { None };
        if is_decl {
            // The default namespace is recorded with an empty prefix.
            let prefix = name.strip_prefix("xmlns:").unwrap_or_default();
            own.push((prefix.to_owned(), value.to_string()));
        }
        attrs.push(Attr { qname: name, ns, value, is_decl });
    }
    if decls.iter().map(Vec::len).sum::<usize>() + own.len() > MAX_NAMESPACES_IN_SCOPE {
        return Err(CodecError::TooLarge(format!(
            "more than {MAX_NAMESPACES_IN_SCOPE} namespace declarations in scope at <{}>",
            snip(&qname)
        )));
    }
    // Only payload roots and header entries are extracted from their context.
    let outer_ns = match stack.last() {
        Some(p) if p.local == "message_payload" || p.local == "Header" => {
            let mut scope: Vec<(String, String)> = Vec::new();
            for (prefix, uri) in decls.iter().flatten().filter(|(p, _)| !p.is_empty()) {
                scope.retain(|(p, _)| p != prefix);
                scope.push((prefix.clone(), uri.clone()));
            }
            scope
        }
        _ => Vec::new(),
    };
    Ok((Elem { ns, qname, local, attrs, children: Vec::new(), outer_ns }, own))
}

pub(super) fn close_elem<'a>(elem: Elem<'a>, stack: &mut [Elem<'a>], root: &mut Option<Elem<'a>>) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(Node::Elem(elem)),
        None => *root = Some(elem),
    }
}
