//! Parsing IDAP documents (requests, responses, faults, notifications) into the typed
//! model of [`super::model`].
//!
//! Parsing runs in two steps:
//!
//! 1. `build_tree` reads the bytes with quick-xml's namespace-aware `NsReader` into a small
//!    tree that borrows names and text from the document (a copy only where a reference was
//!    expanded). This is where the hostile-input guards live: a byte limit checked before
//!    anything else, UTF-8 only, no DOCTYPE (so no DTD and no custom entities: only the five
//!    predefined entities and character references are expanded), and a depth limit that is
//!    enforced while reading, so nesting can never exhaust the stack later on.
//! 2. The `parse_*` walkers check that tree against the IDAP and AQ XML schemas (Tables 9-1
//!    to 9-7 of the reference) and build the model values. Errors name the element path,
//!    e.g. `/Envelope/Body/AQXmlSend/producer_options/foo`, which is written out only for
//!    an error (see `Path`).
//!
//! # Namespaces
//!
//! `Envelope`, `Header`, `Body` and `Fault` (and the fault's `faultcode`, `faultstring`,
//! `detail`) must be in [`ENVELOPE_NS`] or in no namespace; the method element and every AQ
//! element below it must be in [`ACCESS_NS`] or in no namespace ("the receiver processes IDAP
//! messages without namespaces as though they had the correct namespaces"). Namespaces are
//! resolved per the XML rules, so a default `xmlns` is inherited and prefixed names such as
//! `<IDAP:Envelope xmlns:IDAP="...">` work. Any other namespace on one of these structural
//! elements is a [`CodecError::WrongNamespace`]. Note that this makes an AQ method element
//! that *inherits* the envelope namespace (no `xmlns` of its own under a defaulted envelope)
//! a namespace error, as the reference requires.
//!
//! Payload elements and header entries are free content and may use any namespace.
//!
//! # Attributes
//!
//! Namespace declarations and namespace-qualified attributes (`xml:lang`,
//! `IDAP:encodingStyle`, `xsi:type`, ...) are ignored on every structural element. An
//! unqualified attribute must be one the schema defines (only `lookup_type`, on `destination`
//! and `recipient_list`); anything else is [`CodecError::Invalid`].
//!
//! # Leniency, and what is accepted
//!
//! * Children of a structural element may come in any order; each may appear at most once
//!   (except repeated ones such as `message`, `message_id`, `recipient`).
//! * Scalar values are trimmed of surrounding whitespace; payload text is kept exactly.
//! * Enumerated values (`lookup_type`, `visibility`, `dequeue_mode`, `navigation_mode`) are
//!   matched ASCII case-insensitively. Element names are case-sensitive, as in XML.
//! * `wait_time`: a non-negative number of seconds; `NO_WAIT` means 0; `FOREVER` (or `-1`,
//!   DBMS_AQ's value for it) means `None`, the server's default: an HTTP request cannot hold
//!   a connection forever, so the server's own (maximum) wait applies.
//! * `message_id` (in headers, selectors and results) must be non-empty, even-length hex
//!   (it is a RAW in Oracle).
//! * `recipient_list` accepts wrapped agents, `<recipient>` (what the writer emits) or
//!   `<agent>`, each holding `agent_name`/`address`/`protocol`/`agent_alias`; or, as a
//!   shorthand, those fields as direct children, where a field already set for the current
//!   recipient starts the next one (`<agent_name>a</agent_name><agent_name>b</agent_name>`
//!   is two recipients). The two forms cannot be mixed. `lookup_type="LDAP"` on the list is
//!   [`CodecError::Unsupported`] (the model has no way to carry it).
//! * A trailing `<AQXmlCommit/>` must be the last child of the method element.
//! * Comments and processing instructions are skipped everywhere (also inside payloads).
//! * In payloads, whitespace-only text between child elements is dropped; the text of leaf
//!   elements and non-blank mixed content are kept verbatim (unescaped). Element and attribute
//!   names are kept as written, namespace declarations included; a namespace prefix that the
//!   payload uses but that is declared *outside* it (e.g. `xmlns:xsi` on the envelope) is
//!   re-declared on the payload root, so the payload stays well-formed when written elsewhere.
//! * Notification messages carry no payload; a `message_payload` there is ignored.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use quick_xml::NsReader;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;

use super::model::*;

/// Bounds on what a single document may cost to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum document size in bytes, checked before any parsing.
    pub max_bytes: usize,
    /// Maximum element nesting depth, counting `Envelope` as 1 (payloads included).
    pub max_depth: usize,
    /// Maximum number of `message` elements in one `message_set`.
    pub max_messages: usize,
}

/// Attributes (namespace declarations included) allowed on one element. quick-xml's
/// duplicate-attribute check is quadratic in this number, so it must stay small.
pub const MAX_ATTRIBUTES: usize = 256;

/// Namespace declarations allowed in scope at once. Resolving every element and prefixed
/// attribute scans the declarations in scope, so this bounds the cost of a hostile document.
pub const MAX_NAMESPACES_IN_SCOPE: usize = 128;

impl Default for Limits {
    fn default() -> Self {
        Self { max_bytes: 4 * 1024 * 1024, max_depth: 64, max_messages: 10_000 }
    }
}

/// Why a document was rejected. Every variant is the client's fault.
///
/// Each kind has an Oracle-style error number ([`CodecError::error_code`]), from a block
/// that aqgate keeps for the codec and that no AQ condition in `crate::code` uses:
///
/// | variant          | code  | meaning                                                    |
/// |------------------|-------|------------------------------------------------------------|
/// | `Malformed`      | 25441 | not well-formed XML, invalid UTF-8, unknown entity/prefix  |
/// | `Doctype`        | 25442 | a `<!DOCTYPE>` (DTDs and custom entities are refused)      |
/// | `TooLarge`       | 25443 | over `max_bytes`, or a `message_set` over `max_messages`   |
/// | `TooDeep`        | 25444 | elements nested deeper than `max_depth`                    |
/// | `WrongNamespace` | 25445 | a structural element, or `IDAPMethodName`, in a wrong namespace |
/// | `Invalid`        | 25446 | well-formed but not a valid IDAP document (unknown, missing or duplicate element, bad number or enum value, `message_count` mismatch, duplicate `message_number`, bad hex) |
/// | `Unsupported`    | 25447 | valid IDAP that aqgate does not implement (e.g. a non-UTF-8 encoding) |
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("malformed XML: {0}")]
    Malformed(String),
    #[error("DOCTYPE declarations are not allowed")]
    Doctype,
    #[error("document too large: {0}")]
    TooLarge(String),
    #[error("document too deeply nested: more than {0} levels of elements")]
    TooDeep(usize),
    #[error("wrong namespace: {0}")]
    WrongNamespace(String),
    #[error("invalid IDAP document: {0}")]
    Invalid(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl CodecError {
    pub const MALFORMED: i32 = 25441;
    pub const DOCTYPE: i32 = 25442;
    pub const TOO_LARGE: i32 = 25443;
    pub const TOO_DEEP: i32 = 25444;
    pub const WRONG_NAMESPACE: i32 = 25445;
    pub const INVALID: i32 = 25446;
    pub const UNSUPPORTED: i32 = 25447;

    /// The Oracle-style error number for this kind of error (see the table on the type).
    pub fn error_code(&self) -> i32 {
        match self {
            CodecError::Malformed(_) => Self::MALFORMED,
            CodecError::Doctype => Self::DOCTYPE,
            CodecError::TooLarge(_) => Self::TOO_LARGE,
            CodecError::TooDeep(_) => Self::TOO_DEEP,
            CodecError::WrongNamespace(_) => Self::WRONG_NAMESPACE,
            CodecError::Invalid(_) => Self::INVALID,
            CodecError::Unsupported(_) => Self::UNSUPPORTED,
        }
    }

    /// The client fault to answer with.
    pub fn to_fault(&self) -> Fault {
        Fault { kind: FaultKind::Client, code: self.error_code(), message: self.to_string() }
    }
}

type Result<T, E = CodecError> = std::result::Result<T, E>;

/// Parses a client request: `AQXmlSend`, `AQXmlPublish`, `AQXmlReceive`, `AQXmlRegister`,
/// `AQXmlCommit` or `AQXmlRollback`.
pub fn parse_request(bytes: &[u8], limits: &Limits) -> Result<Envelope<Request>> {
    parse_envelope(bytes, limits, parse_request_method)
}

/// Parses a server response, including `Fault` and `AQXmlNotification`.
pub fn parse_response(bytes: &[u8], limits: &Limits) -> Result<Envelope<Response>> {
    parse_envelope(bytes, limits, parse_response_method)
}

/// Checks the HTTP `IDAPMethodName` header (`URI#method`) against the parsed body: the URI
/// must be [`ACCESS_NS`] and the method the body's method element. Surrounding whitespace
/// and double quotes (as in SOAPAction-style headers) are tolerated.
pub fn check_method_header(value: &str, req: &Request) -> Result<()> {
    let value = value.trim();
    let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
    // The method name cannot contain '#', so the last '#' separates it from the URI.
    let Some((uri, method)) = value.rsplit_once('#') else {
        return Err(CodecError::Invalid(format!("IDAPMethodName '{}' is not of the form URI#method", snip(value))));
    };
    if uri != ACCESS_NS {
        return Err(CodecError::WrongNamespace(format!(
            "IDAPMethodName namespace '{}' is not '{ACCESS_NS}'",
            snip(uri)
        )));
    }
    if method != req.method_name() {
        return Err(CodecError::Invalid(format!(
            "IDAPMethodName names method '{}' but the body holds '{}'",
            snip(method),
            req.method_name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Step 1: bytes -> checked tree
// ---------------------------------------------------------------------------------------

/// An element as read, with its namespace resolved. Names, attribute values and text
/// borrow from the document where they are written as they are (no entity or character
/// reference to expand), so a request's payload bytes are copied once, into the model.
#[derive(Debug)]
struct Elem<'a> {
    /// Resolved namespace URI; `None` when the name is in no namespace.
    ns: Option<Cow<'a, str>>,
    /// The name as written, prefix included.
    qname: Cow<'a, str>,
    local: Cow<'a, str>,
    attrs: Vec<Attr<'a>>,
    children: Vec<Node<'a>>,
    /// For children of `message_payload` and `Header` only: the prefixed namespace bindings
    /// in scope from the ancestors, used to keep an extracted payload self-contained.
    outer_ns: Vec<(String, String)>,
}

#[derive(Debug)]
struct Attr<'a> {
    qname: Cow<'a, str>,
    /// Resolved namespace of a prefixed attribute (unprefixed attributes have none).
    ns: Option<Cow<'a, str>>,
    value: Cow<'a, str>,
    /// `xmlns` or `xmlns:p`.
    is_decl: bool,
}

#[derive(Debug)]
enum Node<'a> {
    Elem(Elem<'a>),
    Text(Cow<'a, str>),
}

impl<'a> Elem<'a> {
    fn elements(&self) -> impl Iterator<Item = &Elem<'a>> {
        self.children.iter().filter_map(|c| match c {
            Node::Elem(e) => Some(e),
            Node::Text(_) => None,
        })
    }

    fn push_text(&mut self, text: Cow<'a, str>) {
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
const KNOWN_NAMESPACES: [&str; 2] = [ENVELOPE_NS, ACCESS_NS];

fn ns_string(res: ResolveResult<'_>) -> Result<Option<Cow<'static, str>>> {
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

fn utf8(bytes: &[u8]) -> String {
    // The input was checked to be UTF-8 and quick-xml splits it at ASCII delimiters only,
    // so the lossy path (several times slower) is never taken in practice.
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `part` as a slice of `text` when it is one (quick-xml hands out slices of the document
/// it reads from a `&str`), else a copy of it.
fn borrow_from<'a>(text: &'a str, part: &[u8]) -> Cow<'a, str> {
    let start = part.as_ptr().addr().wrapping_sub(text.as_ptr().addr());
    match start.checked_add(part.len()).and_then(|end| text.get(start..end)) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(utf8(part)),
    }
}

/// XML 1.0's `Char`: what a document may contain, written or by character reference.
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Refuses a document holding a character XML does not allow (C0 controls other than tab,
/// line feed and carriage return; U+FFFE, U+FFFF): it is not well-formed, and echoed back
/// in a response it would make that response unreadable. UTF-8 excludes surrogates.
fn check_xml_chars(text: &str) -> Result<()> {
    let bytes = text.as_bytes();
    // Branch-free per block, so that the common case (nothing found) is a fast scan.
    let control = |b: u8| b < 0x20 && b != b'\t' && b != b'\n' && b != b'\r';
    let suspect = bytes.chunks(64).any(|c| c.iter().fold(false, |acc, &b| acc | control(b)))
        || memchr::memmem::find(bytes, "\u{FFFE}".as_bytes()).is_some()
        || memchr::memmem::find(bytes, "\u{FFFF}".as_bytes()).is_some();
    if !suspect {
        return Ok(());
    }
    match text.char_indices().find(|(_, c)| !is_xml_char(*c)) {
        Some((at, c)) => {
            Err(CodecError::Malformed(format!("character U+{:04X} at byte {at} is not allowed in XML", u32::from(c))))
        }
        None => Ok(()),
    }
}

/// The same for what character references produced (text written as it is was checked
/// with the document; a borrowed value is such text).
#[expect(clippy::ptr_arg, reason = "whether the value is owned (expanded) is the point")]
fn check_referenced_chars(value: &Cow<'_, str>) -> Result<()> {
    let Cow::Owned(s) = value else { return Ok(()) };
    if let Some(c) = s.chars().find(|c| !is_xml_char(*c)) {
        return Err(CodecError::Malformed(format!(
            "a character reference to U+{:04X} is not allowed in XML",
            u32::from(c)
        )));
    }
    Ok(())
}

/// [`borrow_from`] for a value quick-xml may have unescaped into a new string.
fn rebase<'a>(text: &'a str, value: Cow<'_, str>) -> Cow<'a, str> {
    match value {
        Cow::Borrowed(s) => borrow_from(text, s.as_bytes()),
        Cow::Owned(s) => Cow::Owned(s),
    }
}

/// Reads the whole document into an [`Elem`] tree, enforcing the limits and XML rules.
fn build_tree<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Elem<'a>> {
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
fn open_elem<'a>(
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
    let qname = borrow_from(text, start.name().as_ref());
    let local = borrow_from(text, start.local_name().as_ref());
    let mut attrs = Vec::new();
    let mut own = Vec::new();
    for attr in start.attributes() {
        if attrs.len() >= MAX_ATTRIBUTES {
            return Err(CodecError::TooLarge(format!("<{}> has more than {MAX_ATTRIBUTES} attributes", snip(&qname))));
        }
        let attr = attr.map_err(|e| CodecError::Malformed(format!("bad attribute in <{}>: {e}", snip(&qname))))?;
        let name = borrow_from(text, attr.key.as_ref());
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

fn close_elem<'a>(elem: Elem<'a>, stack: &mut [Elem<'a>], root: &mut Option<Elem<'a>>) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(Node::Elem(elem)),
        None => *root = Some(elem),
    }
}

// ---------------------------------------------------------------------------------------
// Step 2: tree -> model
// ---------------------------------------------------------------------------------------

fn invalid(msg: impl Into<String>) -> CodecError {
    CodecError::Invalid(msg.into())
}

/// Where an element is, for error messages (`/Envelope/Body/AQXmlSend/message_set`): a
/// chain built on the stack as the walk descends and written out only for an error.
#[derive(Clone, Copy)]
struct Path<'p> {
    parent: Option<&'p Path<'p>>,
    name: &'p str,
}

impl<'p> Path<'p> {
    fn root(name: &'p str) -> Self {
        Path { parent: None, name }
    }

    fn child(&'p self, name: &'p str) -> Self {
        Path { parent: Some(self), name }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        write!(f, "/{}", snip(self.name))
    }
}

fn child_path<'p>(path: &'p Path<'p>, e: &'p Elem<'_>) -> Path<'p> {
    path.child(&e.local)
}

/// Input quoted in an error message, cut to a readable length.
fn snip(s: &str) -> Cow<'_, str> {
    const MAX_CHARS: usize = 64;
    match s.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => Cow::Owned(format!("{}...", s.get(..end).unwrap_or_default())),
        None => Cow::Borrowed(s),
    }
}

/// `e` (at `path`) must be in `ns` or in no namespace.
fn expect_ns(e: &Elem, ns: &str, path: &Path<'_>) -> Result<()> {
    match &e.ns {
        None => Ok(()),
        Some(n) if n == ns => Ok(()),
        Some(n) => Err(CodecError::WrongNamespace(format!(
            "{path}: <{}> is in namespace '{n}', expected '{ns}' or none",
            snip(&e.qname)
        ))),
    }
}

fn unknown(e: &Elem, path: &Path<'_>) -> CodecError {
    invalid(format!("{path}: unexpected element <{}>", snip(&e.qname)))
}

/// Only schema-defined unqualified attributes are allowed; qualified ones are ignored.
fn check_attrs(e: &Elem, allowed: &[&str], path: &Path<'_>) -> Result<()> {
    for a in &e.attrs {
        if a.is_decl || a.ns.is_some() || allowed.contains(&&*a.qname) {
            continue;
        }
        return Err(invalid(format!("{path}: unexpected attribute '{}'", a.qname)));
    }
    Ok(())
}

fn attr<'a>(e: &'a Elem, name: &str) -> Option<&'a str> {
    e.attrs.iter().find(|a| !a.is_decl && a.ns.is_none() && a.qname == name).map(|a| &*a.value)
}

/// The child elements of a structural element, which may hold no text but whitespace.
fn struct_children<'a, 'd>(e: &'a Elem<'d>, path: &Path<'_>) -> Result<Vec<&'a Elem<'d>>> {
    for c in &e.children {
        if let Node::Text(t) = c
            && !t.trim().is_empty()
        {
            return Err(invalid(format!("{path}: unexpected text '{}'", snip(t.trim()))));
        }
    }
    Ok(e.elements().collect())
}

/// A text-only element without attributes; the value is trimmed.
fn leaf(e: &Elem, path: &Path<'_>) -> Result<String> {
    check_attrs(e, &[], path)?;
    leaf_text(e, path)
}

fn leaf_text(e: &Elem, path: &Path<'_>) -> Result<String> {
    if let Some(c) = e.elements().next() {
        return Err(invalid(format!("{path}: expected text only, found element <{}>", snip(&c.qname))));
    }
    // Text is one node (see `push_text`) unless comments or CDATA sections split it.
    match e.children.as_slice() {
        [] => Ok(String::new()),
        [Node::Text(t)] => Ok(t.trim().to_owned()),
        children => {
            let mut s = String::new();
            for c in children {
                if let Node::Text(t) = c {
                    s.push_str(t);
                }
            }
            Ok(s.trim().to_owned())
        }
    }
}

fn non_empty(e: &Elem, path: &Path<'_>) -> Result<String> {
    let s = leaf(e, path)?;
    if s.is_empty() {
        return Err(invalid(format!("{path} is empty")));
    }
    Ok(s)
}

fn number<T: FromStr>(e: &Elem, path: &Path<'_>) -> Result<T> {
    let s = leaf(e, path)?;
    s.parse().map_err(|_| invalid(format!("{path}: '{}' is not a valid number", snip(&s))))
}

fn hex_id(e: &Elem, path: &Path<'_>) -> Result<String> {
    let s = leaf(e, path)?;
    if s.is_empty() || hex::decode(&s).is_err() {
        return Err(invalid(format!("{path}: '{}' is not a hexadecimal message id", snip(&s))));
    }
    Ok(s)
}

/// An empty element such as `<AQXmlCommit/>`.
fn empty(e: &Elem, path: &Path<'_>) -> Result<()> {
    check_attrs(e, &[], path)?;
    if let Some(c) = struct_children(e, path)?.first() {
        return Err(unknown(c, path));
    }
    Ok(())
}

fn set_once<T>(slot: &mut Option<T>, value: T, path: &Path<'_>) -> Result<()> {
    if slot.is_some() {
        return Err(invalid(format!("{path}: duplicate element")));
    }
    *slot = Some(value);
    Ok(())
}

fn required<T>(slot: Option<T>, name: &str, path: &impl fmt::Display) -> Result<T> {
    slot.ok_or_else(|| invalid(format!("{path}: missing <{name}>")))
}

/// Matches `s` against `(keyword, value)` pairs, ASCII case-insensitively.
fn keyword<T: Copy>(s: &str, table: &[(&str, T)], path: &Path<'_>) -> Result<T> {
    table.iter().find(|(k, _)| k.eq_ignore_ascii_case(s)).map(|(_, v)| *v).ok_or_else(|| {
        let names: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
        invalid(format!("{path}: '{}' is not one of {}", snip(s), names.join(", ")))
    })
}

fn parse_envelope<T>(
    bytes: &[u8],
    limits: &Limits,
    method: fn(&Elem<'_>, &Path<'_>, &Limits) -> Result<T>,
) -> Result<Envelope<T>> {
    let root = build_tree(bytes, limits)?;
    let path = Path::root(&root.local);
    expect_ns(&root, ENVELOPE_NS, &path)?;
    if root.local != "Envelope" {
        return Err(invalid(format!("the root element must be <Envelope>, found <{}>", snip(&root.qname))));
    }
    check_attrs(&root, &[], &path)?;

    let mut headers: Option<Vec<XmlNode>> = None;
    let mut body: Option<T> = None;
    for c in struct_children(&root, &path)? {
        let p = child_path(&path, c);
        if body.is_some() {
            // "Additional namespace-qualified subelements can follow the body."
            match &c.ns {
                Some(ns) if ns != ENVELOPE_NS => continue,
                _ => {
                    return Err(invalid(format!("{path}: unexpected <{}> after Body", snip(&c.qname))));
                }
            }
        }
        expect_ns(c, ENVELOPE_NS, &p)?;
        match &*c.local {
            "Header" if headers.is_none() => {
                check_attrs(c, &[], &p)?;
                headers = Some(struct_children(c, &p)?.into_iter().map(to_xml_node).collect());
            }
            "Body" => {
                check_attrs(c, &[], &p)?;
                let children = struct_children(c, &p)?;
                let Some(first) = children.first() else {
                    return Err(invalid(format!("{p} is empty")));
                };
                if let Some(extra) = children.get(1) {
                    return Err(invalid(format!("{p}: unexpected <{}> after the method element", snip(&extra.qname))));
                }
                body = Some(method(first, &child_path(&p, first), limits)?);
            }
            _ => return Err(unknown(c, &path)),
        }
    }
    let body = required(body, "Body", &path)?;
    Ok(Envelope { headers: headers.unwrap_or_default(), body })
}

// --- requests -----------------------------------------------------------------------------

fn parse_request_method(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Request> {
    expect_ns(e, ACCESS_NS, path)?;
    check_attrs(e, &[], path)?;
    Ok(match &*e.local {
        "AQXmlSend" => Request::Send(parse_enqueue(e, path, limits)?),
        "AQXmlPublish" => Request::Publish(parse_enqueue(e, path, limits)?),
        "AQXmlReceive" => Request::Receive(parse_receive(e, path)?),
        "AQXmlRegister" => Request::Register(parse_register(e, path)?),
        "AQXmlCommit" => {
            empty(e, path)?;
            Request::Commit
        }
        "AQXmlRollback" => {
            empty(e, path)?;
            Request::Rollback
        }
        _ => return Err(invalid(format!("{path}: unknown method <{}>", snip(&e.qname)))),
    })
}

/// Handles a trailing `<AQXmlCommit/>` child at `index` of `count` children.
fn commit_flag(c: &Elem<'_>, p: &Path<'_>, commit: &mut bool, index: usize, count: usize) -> Result<()> {
    empty(c, p)?;
    if *commit {
        return Err(invalid(format!("{p}: duplicate element")));
    }
    if index + 1 != count {
        return Err(invalid(format!("{p} must be the last element")));
    }
    *commit = true;
    Ok(())
}

fn parse_enqueue(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<EnqueueRequest> {
    let mut producer = None;
    let mut messages = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "producer_options" => set_once(&mut producer, parse_producer(c, &p)?, &p)?,
            "message_set" => {
                let set = parse_message_set(c, &p, limits, 1)?;
                let set = set.into_iter().map(|m| m.with_payload(&p)).collect::<Result<Vec<_>>>()?;
                set_once(&mut messages, set, &p)?;
            }
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(EnqueueRequest {
        producer: required(producer, "producer_options", path)?,
        messages: required(messages, "message_set", path)?,
        commit,
    })
}

fn parse_destination(e: &Elem, path: &Path<'_>) -> Result<Destination> {
    check_attrs(e, &["lookup_type"], path)?;
    let lookup = match attr(e, "lookup_type") {
        None => LookupType::Database,
        Some(v) => keyword(
            v.trim(),
            &[("DATABASE", LookupType::Database), ("LDAP", LookupType::Ldap)],
            &path.child("@lookup_type"),
        )?,
    };
    let name = leaf_text(e, path)?;
    if name.is_empty() {
        return Err(invalid(format!("{path} is empty")));
    }
    Ok(Destination { name, lookup })
}

fn parse_visibility(e: &Elem, path: &Path<'_>) -> Result<Visibility> {
    let s = leaf(e, path)?;
    keyword(&s, &[("ON_COMMIT", Visibility::OnCommit), ("IMMEDIATE", Visibility::Immediate)], path)
}

fn parse_producer(e: &Elem, path: &Path<'_>) -> Result<ProducerOptions> {
    check_attrs(e, &[], path)?;
    let (mut destination, mut visibility, mut transformation) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "visibility" => set_once(&mut visibility, parse_visibility(c, &p)?, &p)?,
            "transformation" => set_once(&mut transformation, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(ProducerOptions {
        destination: required(destination, "destination", path)?,
        visibility: visibility.unwrap_or_default(),
        transformation,
    })
}

/// A `message` before the caller decides what its payload must be.
struct RawMessage {
    number: Option<u32>,
    header: MessageHeader,
    payload: Option<XmlNode>,
}

impl RawMessage {
    fn with_payload(self, set_path: &impl fmt::Display) -> Result<Message> {
        let Some(payload) = self.payload else {
            let n = self.number.map(|n| format!(" {n}")).unwrap_or_default();
            return Err(invalid(format!("{set_path}: message{n} has no <message_payload>")));
        };
        Ok(Message { number: self.number, header: self.header, payload })
    }
}

fn parse_message_set(e: &Elem, path: &Path<'_>, limits: &Limits, min_messages: usize) -> Result<Vec<RawMessage>> {
    check_attrs(e, &[], path)?;
    let mut count: Option<usize> = None;
    let mut messages = Vec::new();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_count" => set_once(&mut count, number(c, &p)?, &p)?,
            "message" => {
                if messages.len() >= limits.max_messages {
                    return Err(CodecError::TooLarge(format!(
                        "{path} holds more than {} messages",
                        limits.max_messages
                    )));
                }
                messages.push(parse_message(c, &p)?);
            }
            _ => return Err(unknown(c, path)),
        }
    }
    if let Some(n) = count
        && n != messages.len()
    {
        return Err(invalid(format!("{path}: message_count is {n} but {} messages are given", messages.len())));
    }
    if messages.len() < min_messages {
        return Err(invalid(format!("{path} contains no message")));
    }
    // message_number names a message (responses and faults refer to it): once each.
    let mut seen = std::collections::HashSet::with_capacity(messages.len());
    if let Some(n) = messages.iter().filter_map(|m| m.number).find(|n| !seen.insert(*n)) {
        return Err(invalid(format!("{path}: message_number {n} is given twice")));
    }
    Ok(messages)
}

fn parse_message(e: &Elem, path: &Path<'_>) -> Result<RawMessage> {
    check_attrs(e, &[], path)?;
    let (mut number_, mut header, mut payload) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_number" => set_once(&mut number_, number(c, &p)?, &p)?,
            "message_header" => set_once(&mut header, parse_header(c, &p)?, &p)?,
            "message_payload" => set_once(&mut payload, parse_payload(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(RawMessage { number: number_, header: header.unwrap_or_default(), payload })
}

fn parse_payload(e: &Elem, path: &Path<'_>) -> Result<XmlNode> {
    check_attrs(e, &[], path)?;
    let children = struct_children(e, path)?;
    match children.as_slice() {
        [one] => Ok(to_xml_node(one)),
        [] => Err(invalid(format!("{path} must contain one element, found none"))),
        [_, extra, ..] => {
            Err(invalid(format!("{path} must contain one element, found another <{}>", snip(&extra.qname))))
        }
    }
}

fn parse_header(e: &Elem, path: &Path<'_>) -> Result<MessageHeader> {
    check_attrs(e, &[], path)?;
    let mut h = MessageHeader::default();
    let mut recipients = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_id" => set_once(&mut h.message_id, hex_id(c, &p)?, &p)?,
            "correlation" => set_once(&mut h.correlation, leaf(c, &p)?, &p)?,
            "expiration" => set_once(&mut h.expiration, number(c, &p)?, &p)?,
            "delay" => set_once(&mut h.delay, number(c, &p)?, &p)?,
            "priority" => set_once(&mut h.priority, number(c, &p)?, &p)?,
            "delivery_count" => set_once(&mut h.delivery_count, number(c, &p)?, &p)?,
            "sender_id" => set_once(&mut h.sender_id, parse_agent(c, &p)?, &p)?,
            "recipient_list" => set_once(&mut recipients, parse_recipients(c, &p)?, &p)?,
            "message_state" => set_once(&mut h.message_state, number(c, &p)?, &p)?,
            "exception_queue" => set_once(&mut h.exception_queue, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    h.recipient_list = recipients.unwrap_or_default();
    Ok(h)
}

/// Sets one agent field from `c`; `Ok(false)` if `c` is not an agent field, and an error
/// naming `c` if the field is already set.
fn agent_field(agent: &mut AgentRef, c: &Elem<'_>, p: &Path<'_>) -> Result<bool> {
    match &*c.local {
        "agent_name" => set_once(&mut agent.name, leaf(c, p)?, p)?,
        "address" => set_once(&mut agent.address, leaf(c, p)?, p)?,
        "protocol" => set_once(&mut agent.protocol, number(c, p)?, p)?,
        "agent_alias" => set_once(&mut agent.alias, leaf(c, p)?, p)?,
        _ => return Ok(false),
    }
    Ok(true)
}

fn agent_field_set(agent: &AgentRef, local: &str) -> bool {
    match local {
        "agent_name" => agent.name.is_some(),
        "address" => agent.address.is_some(),
        "protocol" => agent.protocol.is_some(),
        "agent_alias" => agent.alias.is_some(),
        _ => false,
    }
}

fn parse_agent(e: &Elem, path: &Path<'_>) -> Result<AgentRef> {
    check_attrs(e, &[], path)?;
    let mut agent = AgentRef::default();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        if !agent_field(&mut agent, c, &p)? {
            return Err(unknown(c, path));
        }
    }
    Ok(agent)
}

fn parse_recipients(e: &Elem, path: &Path<'_>) -> Result<Vec<AgentRef>> {
    check_attrs(e, &["lookup_type"], path)?;
    if let Some(v) = attr(e, "lookup_type") {
        let lookup = keyword(
            v.trim(),
            &[("DATABASE", LookupType::Database), ("LDAP", LookupType::Ldap)],
            &path.child("@lookup_type"),
        )?;
        if lookup == LookupType::Ldap {
            return Err(CodecError::Unsupported(format!(
                "{path}: lookup_type LDAP for a recipient list (use agent_alias)"
            )));
        }
    }
    let mut wrapped: Vec<AgentRef> = Vec::new();
    let mut direct: Vec<AgentRef> = Vec::new();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "recipient" | "agent" => wrapped.push(parse_agent(c, &p)?),
            local => {
                // Shorthand form: a field already set starts the next recipient.
                if direct.last().is_none_or(|a| agent_field_set(a, local)) {
                    direct.push(AgentRef::default());
                }
                let Some(current) = direct.last_mut() else {
                    return Err(unknown(c, path));
                };
                if !agent_field(current, c, &p)? {
                    return Err(unknown(c, path));
                }
            }
        }
    }
    match (wrapped.is_empty(), direct.is_empty()) {
        (_, true) => Ok(wrapped),
        (true, false) => Ok(direct),
        (false, false) => Err(invalid(format!("{path}: mixes <recipient> elements with bare agent fields"))),
    }
}

fn parse_receive(e: &Elem, path: &Path<'_>) -> Result<ReceiveRequest> {
    let mut consumer = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "consumer_options" => set_once(&mut consumer, parse_consumer(c, &p)?, &p)?,
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(ReceiveRequest { consumer: required(consumer, "consumer_options", path)?, commit })
}

fn parse_wait_time(e: &Elem, path: &Path<'_>) -> Result<Option<u64>> {
    let s = leaf(e, path)?;
    if s.eq_ignore_ascii_case("FOREVER") || s == "-1" {
        return Ok(None);
    }
    if s.eq_ignore_ascii_case("NO_WAIT") {
        return Ok(Some(0));
    }
    s.parse()
        .map(Some)
        .map_err(|_| invalid(format!("{path}: '{}' is not a number of seconds (or FOREVER, NO_WAIT)", snip(&s))))
}

fn parse_selector(e: &Elem, path: &Path<'_>) -> Result<Selector> {
    check_attrs(e, &[], path)?;
    let mut selector: Option<(Selector, &str)> = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        let s = match &*c.local {
            "correlation" => Selector::Correlation(leaf(c, &p)?),
            "message_id" => Selector::MessageId(hex_id(c, &p)?),
            "condition" => Selector::Condition(leaf(c, &p)?),
            _ => return Err(unknown(c, path)),
        };
        if let Some((_, first)) = &selector {
            return Err(invalid(format!(
                "{path} must hold exactly one of correlation, message_id, condition; found <{first}> and <{}>",
                c.local
            )));
        }
        selector = Some((s, &c.local));
    }
    selector
        .map(|(s, _)| s)
        .ok_or_else(|| invalid(format!("{path} must hold one of correlation, message_id, condition")))
}

fn parse_consumer(e: &Elem, path: &Path<'_>) -> Result<ConsumerOptions> {
    check_attrs(e, &[], path)?;
    let mut destination = None;
    let mut consumer_name = None;
    let mut wait_time = None;
    let mut selector = None;
    let mut visibility = None;
    let mut dequeue_mode = None;
    let mut navigation = None;
    let mut transformation = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "consumer_name" => set_once(&mut consumer_name, leaf(c, &p)?, &p)?,
            "wait_time" => set_once(&mut wait_time, parse_wait_time(c, &p)?, &p)?,
            "selector" => set_once(&mut selector, parse_selector(c, &p)?, &p)?,
            "visibility" => set_once(&mut visibility, parse_visibility(c, &p)?, &p)?,
            "dequeue_mode" => {
                let s = leaf(c, &p)?;
                let mode = keyword(
                    &s,
                    &[
                        ("REMOVE", DequeueMode::Remove),
                        ("BROWSE", DequeueMode::Browse),
                        ("LOCKED", DequeueMode::Locked),
                    ],
                    &p,
                )?;
                set_once(&mut dequeue_mode, mode, &p)?;
            }
            "navigation_mode" => {
                let s = leaf(c, &p)?;
                let mode = keyword(
                    &s,
                    &[
                        ("FIRST_MESSAGE", NavigationMode::FirstMessage),
                        ("NEXT_MESSAGE", NavigationMode::NextMessage),
                        ("NEXT_TRANSACTION", NavigationMode::NextTransaction),
                    ],
                    &p,
                )?;
                set_once(&mut navigation, mode, &p)?;
            }
            "transformation" => set_once(&mut transformation, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(ConsumerOptions {
        destination: required(destination, "destination", path)?,
        consumer_name,
        wait_time: wait_time.flatten(),
        selector,
        visibility: visibility.unwrap_or_default(),
        dequeue_mode: dequeue_mode.unwrap_or_default(),
        navigation: navigation.unwrap_or_default(),
        transformation,
    })
}

fn parse_register(e: &Elem, path: &Path<'_>) -> Result<RegisterRequest> {
    let mut options = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "register_options" => set_once(&mut options, parse_register_options(c, &p)?, &p)?,
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    let (destination, consumer_name, notify_url) = required(options, "register_options", path)?;
    Ok(RegisterRequest { destination, consumer_name, notify_url, commit })
}

fn parse_register_options(e: &Elem, path: &Path<'_>) -> Result<(Destination, Option<String>, String)> {
    check_attrs(e, &[], path)?;
    let (mut destination, mut consumer_name, mut notify_url) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "consumer_name" => set_once(&mut consumer_name, leaf(c, &p)?, &p)?,
            // Empty means "unregister" (aqgate's documented form).
            "notify_url" => set_once(&mut notify_url, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok((required(destination, "destination", path)?, consumer_name, required(notify_url, "notify_url", path)?))
}

// --- responses ----------------------------------------------------------------------------

fn parse_response_method(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Response> {
    if e.local == "Fault" && e.ns.as_deref().is_none_or(|ns| ns == ENVELOPE_NS) {
        return Ok(Response::Fault(parse_fault(e, path)?));
    }
    expect_ns(e, ACCESS_NS, path)?;
    check_attrs(e, &[], path)?;
    Ok(match &*e.local {
        "AQXmlSendResponse" => {
            let (status, result) = parse_status_and_result(e, path, "send_result", limits)?;
            Response::Send(status, result.map(|r| r.into_enqueue()).transpose()?)
        }
        "AQXmlPublishResponse" => {
            let (status, result) = parse_status_and_result(e, path, "publish_result", limits)?;
            Response::Publish(status, result.map(|r| r.into_enqueue()).transpose()?)
        }
        "AQXmlReceiveResponse" => {
            let (status, result) = parse_status_and_result(e, path, "receive_result", limits)?;
            Response::Receive(status, result.map(|r| r.into_receive()).transpose()?)
        }
        "AQXmlRegisterResponse" => Response::Register(parse_status_only(e, path)?),
        "AQXmlCommitResponse" => Response::Commit(parse_status_only(e, path)?),
        "AQXmlRollbackResponse" => Response::Rollback(parse_status_only(e, path)?),
        "AQXmlNotification" => Response::Notification(parse_notification(e, path, limits)?),
        _ => return Err(invalid(format!("{path}: unknown response <{}>", snip(&e.qname)))),
    })
}

fn parse_status(e: &Elem, path: &Path<'_>) -> Result<StatusResponse> {
    check_attrs(e, &[], path)?;
    let (mut status_code, mut error_code, mut error_message) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_code" => set_once(&mut status_code, number(c, &p)?, &p)?,
            "error_code" => set_once(&mut error_code, number(c, &p)?, &p)?,
            "error_message" => set_once(&mut error_message, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(StatusResponse { status_code: required(status_code, "status_code", path)?, error_code, error_message })
}

fn parse_status_only(e: &Elem, path: &Path<'_>) -> Result<StatusResponse> {
    let mut status = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_response" => set_once(&mut status, parse_status(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    required(status, "status_response", path)
}

/// The content of `send_result`, `publish_result` or `receive_result`.
struct RawResult {
    path: String,
    destination: Option<String>,
    message_ids: Vec<String>,
    messages: Option<Vec<RawMessage>>,
}

impl RawResult {
    fn into_enqueue(self) -> Result<EnqueueResult> {
        if self.messages.is_some() {
            return Err(invalid(format!("{}: unexpected <message_set>", self.path)));
        }
        Ok(EnqueueResult {
            destination: required(self.destination, "destination", &self.path)?,
            message_ids: self.message_ids,
        })
    }

    fn into_receive(self) -> Result<ReceiveResult> {
        if !self.message_ids.is_empty() {
            return Err(invalid(format!("{}: unexpected <message_id>", self.path)));
        }
        let set_path = format!("{}/message_set", self.path);
        let messages = self
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.with_payload(&set_path))
            .collect::<Result<Vec<_>>>()?;
        Ok(ReceiveResult { destination: required(self.destination, "destination", &self.path)?, messages })
    }
}

fn parse_status_and_result(
    e: &Elem,
    path: &Path<'_>,
    result_name: &str,
    limits: &Limits,
) -> Result<(StatusResponse, Option<RawResult>)> {
    let (mut status, mut result) = (None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_response" => set_once(&mut status, parse_status(c, &p)?, &p)?,
            name if name == result_name => set_once(&mut result, parse_result(c, &p, limits)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok((required(status, "status_response", path)?, result))
}

fn parse_result(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<RawResult> {
    check_attrs(e, &[], path)?;
    let mut r = RawResult { path: path.to_string(), destination: None, message_ids: Vec::new(), messages: None };
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut r.destination, non_empty(c, &p)?, &p)?,
            "message_id" => r.message_ids.push(hex_id(c, &p)?),
            "message_set" => set_once(&mut r.messages, parse_message_set(c, &p, limits, 0)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(r)
}

fn parse_notification(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Notification> {
    let (mut options, mut messages) = (None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "notification_options" => {
                check_attrs(c, &[], &p)?;
                let (mut destination, mut consumer_name) = (None, None);
                for o in struct_children(c, &p)? {
                    let op = child_path(&p, o);
                    expect_ns(o, ACCESS_NS, &op)?;
                    match &*o.local {
                        "destination" => set_once(&mut destination, non_empty(o, &op)?, &op)?,
                        "consumer_name" => set_once(&mut consumer_name, leaf(o, &op)?, &op)?,
                        _ => return Err(unknown(o, &p)),
                    }
                }
                let destination = required(destination, "destination", &p)?;
                set_once(&mut options, (destination, consumer_name), &p)?;
            }
            "message_set" => {
                let set = parse_message_set(c, &p, limits, 0)?;
                // Notifications carry properties only; a stray payload is ignored.
                set_once(&mut messages, set.into_iter().map(|m| m.header).collect(), &p)?;
            }
            _ => return Err(unknown(c, path)),
        }
    }
    let (destination, consumer_name) = required(options, "notification_options", path)?;
    Ok(Notification { destination, consumer_name, messages: messages.unwrap_or_default() })
}

fn parse_fault(e: &Elem, path: &Path<'_>) -> Result<Fault> {
    check_attrs(e, &[], path)?;
    let (mut faultcode, mut faultstring, mut detail) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ENVELOPE_NS, &p)?;
        match &*c.local {
            "faultcode" => set_once(&mut faultcode, leaf(c, &p)?, &p)?,
            "faultstring" => set_once(&mut faultstring, leaf(c, &p)?, &p)?,
            "detail" => {
                check_attrs(c, &[], &p)?;
                let mut status = None;
                for d in struct_children(c, &p)? {
                    let dp = child_path(&p, d);
                    expect_ns(d, ACCESS_NS, &dp)?;
                    match &*d.local {
                        "status_response" => set_once(&mut status, parse_status(d, &dp)?, &dp)?,
                        _ => return Err(unknown(d, &p)),
                    }
                }
                set_once(&mut detail, status, &p)?;
            }
            _ => return Err(unknown(c, path)),
        }
    }
    let faultcode = required(faultcode, "faultcode", path)?;
    let faultstring = faultstring.unwrap_or_default();
    let status = detail.flatten();

    // The numeric faultcode is aqgate's (and the servlet's); a SOAP-style symbolic one
    // ("Client") falls back on the detail's error_code.
    let code = match faultcode.parse::<i32>() {
        Ok(code) => code,
        Err(_) => status
            .as_ref()
            .and_then(|s| s.error_code)
            .ok_or_else(|| invalid(format!("{path}/faultcode: '{}' is not an error number", snip(&faultcode))))?,
    };
    let server = |s: &str| s.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("server"));
    let kind = if server(&faultstring) || server(&faultcode) { FaultKind::Server } else { FaultKind::Client };
    let message = match status.and_then(|s| s.error_message) {
        Some(m) => m,
        None => ["Client error:", "Server error:"]
            .iter()
            .find_map(|p| faultstring.strip_prefix(p))
            .map(|m| m.trim().to_owned())
            .unwrap_or(faultstring),
    };
    Ok(Fault { kind, code, message })
}

// --- payloads -----------------------------------------------------------------------------

/// Converts a payload root or header entry, re-declaring outer prefixes it uses.
fn to_xml_node(e: &Elem) -> XmlNode {
    let mut node = convert(e);
    let mut used = BTreeSet::new();
    used_prefixes(e, &mut used);
    for (prefix, uri) in &e.outer_ns {
        let decl = format!("xmlns:{prefix}");
        if used.contains(prefix.as_str()) && !node.attrs.iter().any(|(k, _)| *k == decl) {
            node.attrs.push((decl, uri.clone()));
        }
    }
    node
}

/// Recursion depth is bounded by `Limits::max_depth`, enforced while reading.
fn convert(e: &Elem) -> XmlNode {
    let has_elements = e.elements().next().is_some();
    let children = e
        .children
        .iter()
        .filter_map(|c| match c {
            Node::Elem(child) => Some(XmlChild::Element(convert(child))),
            // Whitespace between elements is layout; leaf text is data and kept exactly.
            Node::Text(t) if has_elements && t.trim().is_empty() => None,
            Node::Text(t) => Some(XmlChild::Text(t.to_string())),
        })
        .collect();
    XmlNode {
        name: e.qname.to_string(),
        attrs: e.attrs.iter().map(|a| (a.qname.to_string(), a.value.to_string())).collect(),
        children,
    }
}

fn used_prefixes<'a>(e: &'a Elem, used: &mut BTreeSet<&'a str>) {
    let names = std::iter::once(&e.qname).chain(e.attrs.iter().filter(|a| !a.is_decl).map(|a| &a.qname));
    for name in names {
        if let Some((prefix, _)) = name.split_once(':') {
            used.insert(prefix);
        }
    }
    for c in e.elements() {
        used_prefixes(c, used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EX01: &str = include_str!("../../../../examples/01-send-adt-single-consumer.xml");
    const EX02: &str = include_str!("../../../../examples/02-publish-adt-multi-consumer.xml");
    const EX03: &str = include_str!("../../../../examples/03-send-jms-text.xml");
    const EX04: &str = include_str!("../../../../examples/04-publish-and-commit.xml");
    const EX05: &str = include_str!("../../../../examples/05-receive-single-consumer.xml");
    const EX06: &str = include_str!("../../../../examples/06-receive-condition-multi-consumer.xml");
    const EX07: &str = include_str!("../../../../examples/07-receive-and-commit.xml");
    const EX08: &str = include_str!("../../../../examples/08-receive-browse.xml");
    const EX09: &str = include_str!("../../../../examples/09-register-mailto.xml");
    const EX10: &str = include_str!("../../../../examples/10-commit.xml");
    const EX11: &str = include_str!("../../../../examples/11-rollback.xml");
    const EX12: &str = include_str!("../../../../examples/12-response-send.xml");
    const EX13: &str = include_str!("../../../../examples/13-response-publish.xml");
    const EX14: &str = include_str!("../../../../examples/14-response-receive-adt.xml");
    const EX15: &str = include_str!("../../../../examples/15-response-commit.xml");
    const EX16: &str = include_str!("../../../../examples/16-servlet-send-oe-order.xml");
    const EX17: &str = include_str!("../../../../examples/17-servlet-response-send.xml");

    fn req(xml: &str) -> Request {
        match parse_request(xml.as_bytes(), &Limits::default()) {
            Ok(env) => env.body,
            Err(e) => panic!("parse failed: {e}\n{xml}"),
        }
    }

    fn resp(xml: &str) -> Response {
        match parse_response(xml.as_bytes(), &Limits::default()) {
            Ok(env) => env.body,
            Err(e) => panic!("parse failed: {e}\n{xml}"),
        }
    }

    fn req_err(xml: &str) -> CodecError {
        req_err_with(xml.as_bytes(), &Limits::default())
    }

    fn req_err_with(bytes: &[u8], limits: &Limits) -> CodecError {
        match parse_request(bytes, limits) {
            Ok(env) => panic!("expected an error, parsed {env:?}"),
            Err(e) => e,
        }
    }

    fn enqueue(r: Request) -> EnqueueRequest {
        match r {
            Request::Send(e) | Request::Publish(e) => e,
            other => panic!("not an enqueue: {other:?}"),
        }
    }

    fn receive(r: Request) -> ConsumerOptions {
        match r {
            Request::Receive(r) => r.consumer,
            other => panic!("not a receive: {other:?}"),
        }
    }

    /// Follows a path of child names from `node`.
    fn at<'a>(node: &'a XmlNode, path: &[&str]) -> &'a XmlNode {
        path.iter().fold(node, |n, name| match n.child(name) {
            Some(c) => c,
            None => panic!("no <{name}> in <{}>", n.name),
        })
    }

    #[test]
    fn example_01_send_adt() {
        let r = req(EX01);
        assert!(matches!(r, Request::Send(_)));
        let e = enqueue(r);
        assert_eq!(e.producer.destination, Destination::database("QS.NEW_ORDERS_QUE"));
        assert_eq!(e.producer.visibility, Visibility::OnCommit);
        assert!(!e.commit);
        assert_eq!(e.messages.len(), 1);
        let m = &e.messages[0];
        assert_eq!(m.number, Some(1));
        assert_eq!(m.header.correlation.as_deref(), Some("HLB-4471"));
        let sender = m.header.sender_id.as_ref().map(|s| s.name.as_deref());
        assert_eq!(sender, Some(Some("scott")));
        assert_eq!(m.payload.name, "ORDER_TYP");
        assert_eq!(at(&m.payload, &["CUSTOMER", "CITY"]).text(), "PORTLAND");
        assert_eq!(at(&m.payload, &["ORDER_DATE"]).text(), "2024-03-05 9:30:0");
        assert_eq!(m.payload.elements().filter(|e| e.name == "ITEMS").count(), 1);
        assert_eq!(at(&m.payload, &["ITEMS"]).elements().count(), 3);
        // Layout whitespace between elements is not kept.
        assert!(m.payload.children.iter().all(|c| matches!(c, XmlChild::Element(_))));
    }

    #[test]
    fn example_02_publish_adt() {
        let r = req(EX02);
        assert!(matches!(r, Request::Publish(_)));
        let e = enqueue(r);
        assert_eq!(e.producer.destination.name, "AQUSER.EMP_TOPIC");
        assert_eq!(e.messages[0].header.correlation.as_deref(), Some("HIRE-7712"));
        assert_eq!(e.messages[0].payload.name, "EMP_TYP");
        assert_eq!(at(&e.messages[0].payload, &["COMM"]).text(), "312.75");
        assert!(!e.commit);
    }

    #[test]
    fn example_03_send_jms_text() {
        let e = enqueue(req(EX03));
        assert_eq!(e.producer.destination.name, "AQUSER.JMS_TEXTQ");
        let m = &e.messages[0];
        assert_eq!(m.header.correlation.as_deref(), Some("dock-note-17"));
        assert_eq!(m.payload.name, "jms_text_message");
        assert_eq!(at(&m.payload, &["oracle_jms_properties", "appid"]).text(), "aqgate-demo");
        assert_eq!(at(&m.payload, &["user_properties"]).elements().count(), 2);
        assert_eq!(at(&m.payload, &["text_data"]).text(), "Pallet 17 leaves dock 3 at 06:40.");
    }

    #[test]
    fn example_04_publish_and_commit() {
        let r = req(EX04);
        assert!(matches!(r, Request::Publish(_)));
        assert!(enqueue(r).commit);
    }

    #[test]
    fn example_05_receive() {
        let c = receive(req(EX05));
        assert_eq!(c.destination.name, "QS.NEW_ORDERS_QUE");
        assert_eq!(c.wait_time, Some(0));
        assert_eq!(c.consumer_name, None);
        assert_eq!(c.selector, None);
        assert_eq!(c.dequeue_mode, DequeueMode::Remove);
        assert_eq!(c.navigation, NavigationMode::NextMessage);
    }

    #[test]
    fn example_06_receive_condition() {
        let c = receive(req(EX06));
        assert_eq!(c.destination.name, "AQUSER.EMP_TOPIC");
        assert_eq!(c.consumer_name.as_deref(), Some("APP1"));
        assert_eq!(
            c.selector,
            Some(Selector::Condition("tab.user_data.deptno = 40 AND tab.user_data.sal > 3000".into()))
        );
    }

    #[test]
    fn example_07_receive_commit() {
        match req(EX07) {
            Request::Receive(r) => {
                assert!(r.commit);
                assert_eq!(r.consumer.destination.name, "QS.NEW_ORDERS_QUE");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn example_08_receive_browse() {
        let c = receive(req(EX08));
        assert_eq!(c.dequeue_mode, DequeueMode::Browse);
        assert_eq!(c.navigation, NavigationMode::FirstMessage);
    }

    #[test]
    fn example_09_register() {
        match req(EX09) {
            Request::Register(r) => {
                assert_eq!(r.destination.name, "AQUSER.EMP_TOPIC");
                assert_eq!(r.consumer_name.as_deref(), Some("APP1"));
                assert_eq!(r.notify_url, "mailto:hr-events@example.com");
                assert!(r.commit);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn examples_10_11_commit_rollback() {
        assert_eq!(req(EX10), Request::Commit);
        assert_eq!(req(EX11), Request::Rollback);
    }

    #[test]
    fn example_16_servlet_send() {
        let e = enqueue(req(EX16));
        assert_eq!(e.producer.destination.name, "OE.OE_NEW_ORDERS_QUE");
        let m = &e.messages[0];
        assert_eq!(m.header.correlation.as_deref(), Some("WEB-CART-5520"));
        assert_eq!(at(&m.payload, &["CUSTOMER", "CUSTID"]).text(), "W-88213");
    }

    #[test]
    fn example_12_13_17_enqueue_responses() {
        let ok = StatusResponse::ok();
        assert_eq!(
            resp(EX12),
            Response::Send(
                ok.clone(),
                Some(EnqueueResult {
                    destination: "QS.NEW_ORDERS_QUE".into(),
                    message_ids: vec!["01A231B16E8076E6B4744EC4749B4E12".into()],
                })
            )
        );
        assert_eq!(
            resp(EX13),
            Response::Publish(
                ok.clone(),
                Some(EnqueueResult {
                    destination: "AQUSER.EMP_TOPIC".into(),
                    message_ids: vec!["01A231B16E9771A18F1E4289EDCC9993".into()],
                })
            )
        );
        assert_eq!(
            resp(EX17),
            Response::Send(
                ok,
                Some(EnqueueResult {
                    destination: "OE.OE_NEW_ORDERS_QUE".into(),
                    message_ids: vec!["01A231B16F4B747FB96FCB9321E809AD".into()],
                })
            )
        );
    }

    #[test]
    fn example_14_receive_response() {
        let Response::Receive(status, Some(result)) = resp(EX14) else {
            panic!("not a receive response with a result");
        };
        assert_eq!(status, StatusResponse::ok());
        assert_eq!(result.destination, "AQUSER.EMP_TOPIC");
        assert_eq!(result.messages.len(), 1);
        let m = &result.messages[0];
        assert_eq!(m.number, Some(1));
        let h = &m.header;
        assert_eq!(h.message_id.as_deref(), Some("01A231B16E9771A18F1E4289EDCC9993"));
        assert_eq!(h.correlation.as_deref(), Some("HIRE-7712"));
        assert_eq!(h.priority, Some(1));
        assert_eq!(h.delivery_count, Some(0));
        assert_eq!(h.message_state, Some(0));
        assert_eq!(h.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("scott"));
        assert_eq!(at(&m.payload, &["DEPTNO"]).text(), "40");
    }

    #[test]
    fn example_15_commit_response() {
        assert_eq!(resp(EX15), Response::Commit(StatusResponse::ok()));
    }

    #[test]
    fn requests_are_not_responses() {
        assert!(matches!(parse_response(EX01.as_bytes(), &Limits::default()), Err(CodecError::Invalid(_))));
        assert!(matches!(parse_request(EX12.as_bytes(), &Limits::default()), Err(CodecError::Invalid(_))));
    }

    #[test]
    fn prefixed_and_unqualified_namespaces() {
        let prefixed = r#"<?xml version="1.0" encoding="UTF-8"?>
            <IDAP:Envelope xmlns:IDAP="http://ns.oracle.com/AQ/schemas/envelope"
                           xmlns:aq="http://ns.oracle.com/AQ/schemas/access"
                           IDAP:encodingStyle="x" xml:lang="en">
              <IDAP:Header><tx:id xmlns:tx="urn:tx">42</tx:id></IDAP:Header>
              <IDAP:Body><aq:AQXmlCommit/></IDAP:Body>
              <ext:trailer xmlns:ext="urn:ext"/>
            </IDAP:Envelope>"#;
        let env = match parse_request(prefixed.as_bytes(), &Limits::default()) {
            Ok(env) => env,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(env.body, Request::Commit);
        assert_eq!(env.headers.len(), 1);
        assert_eq!(env.headers[0].name, "tx:id");
        assert_eq!(env.headers[0].text(), "42");

        let bare = "<Envelope><Body><AQXmlRollback/></Body></Envelope>";
        assert_eq!(req(bare), Request::Rollback);
    }

    #[test]
    fn payload_keeps_names_attrs_text_and_outer_prefixes() {
        let xml = r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"
                xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
          <Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access">
            <producer_options><destination lookup_type="ldap">cn=q</destination>
              <visibility>immediate</visibility></producer_options>
            <message_set><message>
              <message_header>
                <message_id>0A1b</message_id>
                <recipient_list><recipient><agent_name>a</agent_name><protocol>0</protocol></recipient>
                  <agent><agent_alias>b</agent_alias></agent></recipient_list>
              </message_header>
              <message_payload>
                <p:doc xmlns:p="urn:p" a="1 &amp; 2"><raw xsi:nil="true"/><t>  two  spaces &lt;x&gt; </t><m>mixed <b>bold</b> text<![CDATA[ <cdata> ]]></m></p:doc>
              </message_payload>
            </message></message_set>
          </AQXmlSend></Body></Envelope>"#;
        let e = enqueue(req(xml));
        assert_eq!(e.producer.destination.lookup, LookupType::Ldap);
        assert_eq!(e.producer.visibility, Visibility::Immediate);
        let m = &e.messages[0];
        assert_eq!(m.number, None);
        assert_eq!(m.header.message_id.as_deref(), Some("0A1b"));
        assert_eq!(m.header.recipient_list.len(), 2);
        assert_eq!(m.header.recipient_list[0].protocol, Some(0));
        assert_eq!(m.header.recipient_list[1].alias.as_deref(), Some("b"));
        let p = &m.payload;
        assert_eq!(p.name, "p:doc");
        assert_eq!(
            p.attrs,
            vec![
                ("xmlns:p".to_string(), "urn:p".to_string()),
                ("a".to_string(), "1 & 2".to_string()),
                ("xmlns:xsi".to_string(), "http://www.w3.org/2001/XMLSchema-instance".to_string()),
            ]
        );
        assert_eq!(at(p, &["t"]).text(), "  two  spaces <x> ");
        let mixed = at(p, &["m"]);
        assert_eq!(mixed.children.len(), 3);
        assert_eq!(mixed.children[2], XmlChild::Text(" text <cdata> ".into()));
    }

    #[test]
    fn recipient_shorthand_groups_fields() {
        let xml = r#"<Envelope><Body><AQXmlPublish><producer_options><destination>Q</destination>
            </producer_options><message_set><message><message_header><recipient_list>
            <agent_name>a</agent_name><address>x</address><agent_name>b</agent_name>
            </recipient_list></message_header><message_payload><raw>00</raw></message_payload>
            </message></message_set></AQXmlPublish></Body></Envelope>"#;
        let r = &enqueue(req(xml)).messages[0].header.recipient_list;
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].name.as_deref(), Some("a"));
        assert_eq!(r[0].address.as_deref(), Some("x"));
        assert_eq!(r[1].name.as_deref(), Some("b"));
    }

    #[test]
    fn receive_options() {
        let xml = |body: &str| {
            format!(
                "<Envelope><Body><AQXmlReceive><consumer_options><destination>Q</destination>\
                 {body}</consumer_options></AQXmlReceive></Body></Envelope>"
            )
        };
        let c =
            receive(req(&xml("<wait_time> FOREVER </wait_time><selector><message_id>ABCD</message_id></selector>\
             <navigation_mode>first_message</navigation_mode><dequeue_mode>LOCKED</dequeue_mode>\
             <visibility>IMMEDIATE</visibility><transformation>T.X</transformation>")));
        assert_eq!(c.wait_time, None);
        assert_eq!(c.selector, Some(Selector::MessageId("ABCD".into())));
        assert_eq!(c.navigation, NavigationMode::FirstMessage);
        assert_eq!(c.dequeue_mode, DequeueMode::Locked);
        assert_eq!(c.visibility, Visibility::Immediate);
        assert_eq!(c.transformation.as_deref(), Some("T.X"));
        assert_eq!(receive(req(&xml("<wait_time>NO_WAIT</wait_time>"))).wait_time, Some(0));
        assert_eq!(receive(req(&xml("<wait_time>30</wait_time>"))).wait_time, Some(30));
        assert!(matches!(req_err(&xml("<wait_time>-5</wait_time>")), CodecError::Invalid(_)));
        assert!(matches!(req_err(&xml("<dequeue_mode>EAT</dequeue_mode>")), CodecError::Invalid(_)));
        assert!(matches!(req_err(&xml("<selector/>")), CodecError::Invalid(_)));
    }

    #[test]
    fn method_header() {
        let r = Request::Send(enqueue(req(EX01)));
        assert_eq!(check_method_header("http://ns.oracle.com/AQ/schemas/access#AQXmlSend", &r), Ok(()));
        assert_eq!(check_method_header(" \"http://ns.oracle.com/AQ/schemas/access#AQXmlSend\" ", &r), Ok(()));
        assert!(matches!(
            check_method_header("http://ns.oracle.com/AQ/schemas/envelope#AQXmlSend", &r),
            Err(CodecError::WrongNamespace(_))
        ));
        assert!(matches!(
            check_method_header("http://ns.oracle.com/AQ/schemas/access#AQXmlPublish", &r),
            Err(CodecError::Invalid(_))
        ));
        assert!(matches!(check_method_header("AQXmlSend", &r), Err(CodecError::Invalid(_))));
    }

    #[test]
    fn faults_and_notifications_parse() {
        let fault = r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body>
            <Fault><faultcode>24010</faultcode><faultstring>Client error: queue Q does not exist</faultstring>
            </Fault></Body></Envelope>"#;
        assert_eq!(
            resp(fault),
            Response::Fault(Fault { kind: FaultKind::Client, code: 24010, message: "queue Q does not exist".into() })
        );
        let soap = r#"<Envelope><Body><Fault><faultcode>Server</faultcode><faultstring>x</faultstring>
            <detail><status_response xmlns="http://ns.oracle.com/AQ/schemas/access">
            <status_code>-1</status_code><error_code>600</error_code><error_message>boom</error_message>
            </status_response></detail></Fault></Body></Envelope>"#;
        assert_eq!(resp(soap), Response::Fault(Fault { kind: FaultKind::Server, code: 600, message: "boom".into() }));
        let note = r#"<Envelope><Body><AQXmlNotification xmlns="http://ns.oracle.com/AQ/schemas/access">
            <notification_options><destination>AQUSER.EMP_TOPIC</destination><consumer_name>APP1</consumer_name></notification_options>
            <message_set><message_count>1</message_count><message><message_number>1</message_number>
            <message_header><message_id>ABCD</message_id><priority>-3</priority></message_header></message></message_set>
            </AQXmlNotification></Body></Envelope>"#;
        let Response::Notification(n) = resp(note) else { panic!("not a notification") };
        assert_eq!(n.destination, "AQUSER.EMP_TOPIC");
        assert_eq!(n.consumer_name.as_deref(), Some("APP1"));
        assert_eq!(n.messages.len(), 1);
        assert_eq!(n.messages[0].priority, Some(-3));
    }

    #[test]
    fn bad_inputs_are_rejected_with_the_right_kind() {
        use CodecError as E;
        let send = |producer: &str, set: &str| {
            format!(
                "<Envelope xmlns=\"{ENVELOPE_NS}\"><Body><AQXmlSend xmlns=\"{ACCESS_NS}\">\
                 <producer_options>{producer}</producer_options><message_set>{set}</message_set>\
                 </AQXmlSend></Body></Envelope>"
            )
        };
        let msg = "<message><message_payload><raw>00</raw></message_payload></message>";
        let dest = "<destination>Q</destination>";
        let deep = format!(
            "<Envelope><Body><AQXmlSend><producer_options>{dest}</producer_options><message_set>\
             <message><message_payload>{}{}</message_payload></message></message_set>\
             </AQXmlSend></Body></Envelope>",
            "<a>".repeat(10_000),
            "</a>".repeat(10_000)
        );
        let bomb = r#"<?xml version="1.0"?>
            <!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
            <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
            <Envelope><Body><AQXmlCommit>&lol3;</AQXmlCommit></Body></Envelope>"#;
        let two_selectors = "<Envelope><Body><AQXmlReceive><consumer_options><destination>Q</destination>\
             <selector><correlation>a</correlation><condition>b</condition></selector>\
             </consumer_options></AQXmlReceive></Body></Envelope>";

        type Check = fn(&CodecError) -> bool;
        let cases: Vec<(&str, Vec<u8>, Check)> = vec![
            ("unclosed tag", b"<Envelope><Body>".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("mismatched end", b"<Envelope><Body></Envelope>".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("not xml", b"hello".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("empty", b"".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("two roots", b"<Envelope/><Envelope/>".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("undeclared prefix", b"<x:Envelope/>".to_vec(), |e| matches!(e, E::Malformed(_))),
            ("unknown entity", b"<Envelope><Body>&lol;</Body></Envelope>".to_vec(), |e| matches!(e, E::Malformed(_))),
            (
                "wrong envelope namespace",
                b"<Envelope xmlns=\"urn:soap\"><Body><AQXmlCommit/></Body></Envelope>".to_vec(),
                |e| matches!(e, E::WrongNamespace(_)),
            ),
            (
                "wrong method namespace",
                format!("<Envelope xmlns=\"{ENVELOPE_NS}\"><Body><AQXmlCommit xmlns=\"urn:x\"/></Body></Envelope>")
                    .into_bytes(),
                |e| matches!(e, E::WrongNamespace(_)),
            ),
            (
                "method inheriting the envelope namespace",
                format!("<Envelope xmlns=\"{ENVELOPE_NS}\"><Body><AQXmlCommit/></Body></Envelope>").into_bytes(),
                |e| matches!(e, E::WrongNamespace(_)),
            ),
            ("doctype", b"<!DOCTYPE Envelope><Envelope/>".to_vec(), |e| matches!(e, E::Doctype)),
            ("billion laughs", bomb.as_bytes().to_vec(), |e| matches!(e, E::Doctype)),
            ("deep nesting", deep.into_bytes(), |e| matches!(e, E::TooDeep(64))),
            (
                "message_number twice",
                send(dest, &format!("<message_count>2</message_count>{msg}{msg}"))
                    .replace("<message>", "<message><message_number>3</message_number>")
                    .into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("message_number 3 is given twice")),
            ),
            (
                "message_count mismatch",
                send(dest, &format!("<message_count>2</message_count>{msg}")).into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("message_count")),
            ),
            (
                "invalid hex message_id",
                send(
                    dest,
                    "<message><message_header><message_id>XYZ1</message_id></message_header>\
                     <message_payload><raw>00</raw></message_payload></message>",
                )
                .into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("message_id")),
            ),
            ("invalid utf-8", b"<Envelope>\xff\xfe</Envelope>".to_vec(), |e| matches!(e, E::Malformed(_))),
            (
                "a control character, written",
                send(dest, &msg.replace("<raw>", "<raw>\u{1}")).into_bytes(),
                |e| matches!(e, E::Malformed(m) if m.contains("U+0001")),
            ),
            (
                "a control character, by reference",
                send(
                    dest,
                    &msg.replace(
                        "<message_payload>",
                        "<message_header><correlation>a&#x1;b</correlation></message_header><message_payload>",
                    ),
                )
                .into_bytes(),
                |e| matches!(e, E::Malformed(m) if m.contains("U+0001")),
            ),
            (
                "a control character by reference in an attribute",
                send(&dest.replace("<destination>", "<destination lookup_type=\"&#x1F;\">"), msg).into_bytes(),
                |e| matches!(e, E::Malformed(m) if m.contains("U+001F")),
            ),
            (
                "U+FFFF, written",
                send(dest, &msg.replace("<raw>", "<raw>\u{FFFF}")).into_bytes(),
                |e| matches!(e, E::Malformed(m) if m.contains("U+FFFF")),
            ),
            (
                "unknown element in producer_options",
                send(&format!("{dest}<priority>1</priority>"), msg).into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("producer_options") && m.contains("priority")),
            ),
            (
                "empty message_set",
                send(dest, "").into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("no message")),
            ),
            (
                "missing destination",
                send("", msg).into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("destination")),
            ),
            (
                "duplicate destination",
                send(&format!("{dest}{dest}"), msg).into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("duplicate")),
            ),
            ("bad lookup_type", send("<destination lookup_type=\"DNS\">Q</destination>", msg).into_bytes(), |e| {
                matches!(e, E::Invalid(_))
            }),
            (
                "unknown attribute",
                send("<destination kind=\"x\">Q</destination>", msg).into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("kind")),
            ),
            (
                "two payload elements",
                send(dest, "<message><message_payload><a/><b/></message_payload></message>").into_bytes(),
                |e| matches!(e, E::Invalid(_)),
            ),
            ("missing payload", send(dest, "<message/>").into_bytes(), |e| matches!(e, E::Invalid(_))),
            (
                "two selectors",
                two_selectors.as_bytes().to_vec(),
                |e| matches!(e, E::Invalid(m) if m.contains("exactly one")),
            ),
            ("text in structure", b"<Envelope><Body><AQXmlCommit>now</AQXmlCommit></Body></Envelope>".to_vec(), |e| {
                matches!(e, E::Invalid(_))
            }),
            (
                "element after method",
                b"<Envelope><Body><AQXmlCommit/><AQXmlRollback/></Body></Envelope>".to_vec(),
                |e| matches!(e, E::Invalid(_)),
            ),
            (
                "commit not last",
                b"<Envelope><Body><AQXmlReceive><AQXmlCommit/><consumer_options><destination>Q\
                  </destination></consumer_options></AQXmlReceive></Body></Envelope>"
                    .to_vec(),
                |e| matches!(e, E::Invalid(_)),
            ),
            (
                "unknown method",
                b"<Envelope><Body><AQXmlDance/></Body></Envelope>".to_vec(),
                |e| matches!(e, E::Invalid(m) if m.contains("AQXmlDance")),
            ),
            ("wrong root", b"<Body/>".to_vec(), |e| matches!(e, E::Invalid(_))),
            ("no body", b"<Envelope><Header/></Envelope>".to_vec(), |e| matches!(e, E::Invalid(_))),
            ("non-utf8 encoding", b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><Envelope/>".to_vec(), |e| {
                matches!(e, E::Unsupported(_))
            }),
            (
                "bad number",
                send(dest, "<message_count>one</message_count>").into_bytes(),
                |e| matches!(e, E::Invalid(m) if m.contains("not a valid number")),
            ),
        ];
        for (name, bytes, check) in cases {
            let err = req_err_with(&bytes, &Limits::default());
            assert!(check(&err), "{name}: unexpected error {err:?}");
            assert!((25441..=25447).contains(&err.error_code()), "{name}");
        }
    }

    #[test]
    fn limits_are_enforced() {
        let small = Limits { max_bytes: 100, ..Limits::default() };
        assert!(matches!(req_err_with(EX01.as_bytes(), &small), CodecError::TooLarge(_)));
        let few = Limits { max_messages: 1, ..Limits::default() };
        let two = EX01
            .replace("<message_count>1</message_count>", "")
            .replace("</message>", "</message><message><message_payload><raw>00</raw></message_payload></message>");
        assert!(matches!(req_err_with(two.as_bytes(), &few), CodecError::TooLarge(_)));
        assert_eq!(parse_request(two.as_bytes(), &Limits::default()).map(|_| ()), Ok(()));
        let shallow = Limits { max_depth: 8, ..Limits::default() };
        assert!(matches!(req_err_with(EX01.as_bytes(), &shallow), CodecError::TooDeep(8)));
    }

    #[test]
    fn attribute_and_namespace_floods_are_refused() {
        let attrs: String = (0..1000).map(|i| format!(" a{i}=\"\"")).collect();
        let xml = format!("<Envelope{attrs}><Body><AQXmlCommit/></Body></Envelope>");
        assert!(matches!(req_err(&xml), CodecError::TooLarge(m) if m.contains("attributes")));
        let decls: String = (0..100).map(|i| format!(" xmlns:p{i}=\"urn:{i}\"")).collect();
        let xml = format!("<Envelope{decls}><Body{decls}><AQXmlCommit/></Body></Envelope>");
        assert!(matches!(req_err(&xml), CodecError::TooLarge(m) if m.contains("namespace")));
        let long = "x".repeat(100_000);
        let CodecError::Invalid(m) = req_err(&format!("<Envelope><{long}/></Envelope>")) else {
            panic!("expected Invalid");
        };
        assert!(m.len() < 300, "error messages quote input briefly: {m}");
    }

    #[test]
    fn the_tree_borrows_from_the_document_unless_a_reference_was_expanded() {
        let doc =
            r#"<a xmlns="http://ns.oracle.com/AQ/schemas/access" k="v" e="&lt;"><b>plain</b><c>x &amp; y</c></a>"#;
        let root = build_tree(doc.as_bytes(), &Limits::default()).expect("well-formed");
        assert!(matches!(root.qname, Cow::Borrowed("a")));
        assert!(matches!(root.ns, Some(Cow::Borrowed(ACCESS_NS))));
        let value = |name: &str| &root.attrs.iter().find(|a| a.qname == name).expect("attribute").value;
        assert!(matches!(value("k"), Cow::Borrowed("v")));
        assert!(matches!(value("e"), Cow::Owned(v) if v == "<"));
        let text: Vec<&Cow<'_, str>> = root
            .elements()
            .map(|e| match e.children.as_slice() {
                [Node::Text(t)] => t,
                other => panic!("one text node expected: {other:?}"),
            })
            .collect();
        assert!(matches!(text[0], Cow::Borrowed("plain")));
        assert!(matches!(text[1], Cow::Owned(t) if t == "x & y"));
        // A slice from elsewhere is copied, not mistaken for part of the document.
        assert!(matches!(borrow_from("abc", b"bc"), Cow::Owned(s) if s == "bc"));
        assert!(matches!(borrow_from(&doc[1..], &doc.as_bytes()[1..2]), Cow::Borrowed("a")));
    }

    #[test]
    fn paths_are_written_only_as_deep_as_the_element() {
        let root = Path::root("Envelope");
        let body = root.child("Body");
        let long = "x".repeat(100);
        let method = body.child(&long);
        assert_eq!(body.to_string(), "/Envelope/Body");
        assert_eq!(method.to_string(), format!("/Envelope/Body/{}...", "x".repeat(64)));
    }

    #[test]
    fn fault_from_codec_error() {
        let f = CodecError::Doctype.to_fault();
        assert_eq!(f.kind, FaultKind::Client);
        assert_eq!(f.code, CodecError::DOCTYPE);
    }

    #[test]
    fn truncations_and_garbage_never_panic() {
        // Every prefix of every example must yield Ok or an error, never a panic.
        for ex in [EX01, EX03, EX06, EX09, EX14] {
            for cut in (0..ex.len()).step_by(7) {
                let Some(s) = ex.get(..cut) else { continue };
                let _ = parse_request(s.as_bytes(), &Limits::default());
                let _ = parse_response(s.as_bytes(), &Limits::default());
            }
        }
    }

    mod mutations {
        use super::super::super::write::{write_request, write_response};
        use super::*;
        use proptest::prelude::*;

        const EXAMPLES: [&str; 17] =
            [EX01, EX02, EX03, EX04, EX05, EX06, EX07, EX08, EX09, EX10, EX11, EX12, EX13, EX14, EX15, EX16, EX17];

        /// Bytes that matter to XML more often than chance would pick them.
        fn byte() -> impl Strategy<Value = u8> {
            prop_oneof![prop::sample::select(b"<>&;#/=\"' :x\n\xc3\x80\x00".to_vec()), any::<u8>()]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            /// Every example with a few bytes inserted, removed or replaced parses or is
            /// refused, never panics; and what is accepted survives writing and reading back.
            #[test]
            fn mutated_examples_are_refused_or_survive_a_round_trip(
                which in 0..EXAMPLES.len(),
                edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, byte()), 1..6),
            ) {
                let mut doc = EXAMPLES[which].as_bytes().to_vec();
                for (at, kind, b) in edits {
                    let i = at.index(doc.len() + 1);
                    match kind {
                        0 => doc.insert(i, b),
                        1 if i < doc.len() => {
                            doc.remove(i);
                        }
                        _ if i < doc.len() => doc[i] = b,
                        _ => {}
                    }
                }
                let limits = Limits::default();
                if let Ok(env) = parse_request(&doc, &limits) {
                    let xml = write_request(&env);
                    prop_assert_eq!(parse_request(xml.as_bytes(), &limits), Ok(env), "{}", xml);
                }
                if let Ok(env) = parse_response(&doc, &limits) {
                    let xml = write_response(&env);
                    prop_assert_eq!(parse_response(xml.as_bytes(), &limits), Ok(env), "{}", xml);
                }
            }
        }
    }
}
