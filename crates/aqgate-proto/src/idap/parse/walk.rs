//! Step 2 of parsing, the common part: element paths for errors, namespace and attribute
//! checks, scalar leaves, the envelope, and payloads converted into [`XmlNode`]s.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use super::*;

pub(super) fn invalid(msg: impl Into<String>) -> CodecError {
    CodecError::Invalid(msg.into())
}

/// Where an element is, for error messages (`/Envelope/Body/AQXmlSend/message_set`): a
/// chain built on the stack as the walk descends and written out only for an error.
#[derive(Clone, Copy)]
pub(super) struct Path<'p> {
    pub(super) parent: Option<&'p Path<'p>>,
    pub(super) name: &'p str,
}

impl<'p> Path<'p> {
    pub(super) fn root(name: &'p str) -> Self {
        Path { parent: None, name }
    }

    pub(super) fn child(&'p self, name: &'p str) -> Self {
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

pub(super) fn child_path<'p>(path: &'p Path<'p>, e: &'p Elem<'_>) -> Path<'p> {
    path.child(&e.local)
}

/// Input quoted in an error message, cut to a readable length.
pub(super) fn snip(s: &str) -> Cow<'_, str> {
    const MAX_CHARS: usize = 64;
    match s.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => Cow::Owned(format!("{}...", s.get(..end).unwrap_or_default())),
        None => Cow::Borrowed(s),
    }
}

/// `e` (at `path`) must be in `ns` or in no namespace.
pub(super) fn expect_ns(e: &Elem, ns: &str, path: &Path<'_>) -> Result<()> {
    match &e.ns {
        None => Ok(()),
        Some(n) if n == ns => Ok(()),
        Some(n) => Err(CodecError::WrongNamespace(format!(
            "{path}: <{}> is in namespace '{n}', expected '{ns}' or none",
            snip(&e.qname)
        ))),
    }
}

pub(super) fn unknown(e: &Elem, path: &Path<'_>) -> CodecError {
    invalid(format!("{path}: unexpected element <{}>", snip(&e.qname)))
}

/// Only schema-defined unqualified attributes are allowed; qualified ones are ignored.
pub(super) fn check_attrs(e: &Elem, allowed: &[&str], path: &Path<'_>) -> Result<()> {
    for a in &e.attrs {
        if a.is_decl || a.ns.is_some() || allowed.contains(&&*a.qname) {
            continue;
        }
        return Err(invalid(format!("{path}: unexpected attribute '{}'", a.qname)));
    }
    Ok(())
}

pub(super) fn attr<'a>(e: &'a Elem, name: &str) -> Option<&'a str> {
    e.attrs.iter().find(|a| !a.is_decl && a.ns.is_none() && a.qname == name).map(|a| &*a.value)
}

/// The child elements of a structural element, which may hold no text but whitespace.
pub(super) fn struct_children<'a, 'd>(e: &'a Elem<'d>, path: &Path<'_>) -> Result<Vec<&'a Elem<'d>>> {
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
pub(super) fn leaf(e: &Elem, path: &Path<'_>) -> Result<String> {
    check_attrs(e, &[], path)?;
    leaf_text(e, path)
}

pub(super) fn leaf_text(e: &Elem, path: &Path<'_>) -> Result<String> {
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

pub(super) fn non_empty(e: &Elem, path: &Path<'_>) -> Result<String> {
    let s = leaf(e, path)?;
    if s.is_empty() {
        return Err(invalid(format!("{path} is empty")));
    }
    Ok(s)
}

pub(super) fn number<T: FromStr>(e: &Elem, path: &Path<'_>) -> Result<T> {
    let s = leaf(e, path)?;
    s.parse().map_err(|_| invalid(format!("{path}: '{}' is not a valid number", snip(&s))))
}

pub(super) fn hex_id(e: &Elem, path: &Path<'_>) -> Result<String> {
    let s = leaf(e, path)?;
    if s.is_empty() || hex::decode(&s).is_err() {
        return Err(invalid(format!("{path}: '{}' is not a hexadecimal message id", snip(&s))));
    }
    Ok(s)
}

/// An empty element such as `<AQXmlCommit/>`.
pub(super) fn empty(e: &Elem, path: &Path<'_>) -> Result<()> {
    check_attrs(e, &[], path)?;
    if let Some(c) = struct_children(e, path)?.first() {
        return Err(unknown(c, path));
    }
    Ok(())
}

pub(super) fn set_once<T>(slot: &mut Option<T>, value: T, path: &Path<'_>) -> Result<()> {
    if slot.is_some() {
        return Err(invalid(format!("{path}: duplicate element")));
    }
    *slot = Some(value);
    Ok(())
}

pub(super) fn required<T>(slot: Option<T>, name: &str, path: &impl fmt::Display) -> Result<T> {
    slot.ok_or_else(|| invalid(format!("{path}: missing <{name}>")))
}

/// Matches `s` against `(keyword, value)` pairs, ASCII case-insensitively.
pub(super) fn keyword<T: Copy>(s: &str, table: &[(&str, T)], path: &Path<'_>) -> Result<T> {
    table.iter().find(|(k, _)| k.eq_ignore_ascii_case(s)).map(|(_, v)| *v).ok_or_else(|| {
        let names: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
        invalid(format!("{path}: '{}' is not one of {}", snip(s), names.join(", ")))
    })
}

pub(super) fn parse_envelope<T>(
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

/// Converts a payload root or header entry, re-declaring outer prefixes it uses.
pub(super) fn to_xml_node(e: &Elem) -> XmlNode {
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
pub(super) fn convert(e: &Elem) -> XmlNode {
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

pub(super) fn used_prefixes<'a>(e: &'a Elem, used: &mut BTreeSet<&'a str>) {
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
