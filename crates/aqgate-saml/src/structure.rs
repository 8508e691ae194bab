//! The shape of a document before its signatures are verified, and finding the signed
//! assertion in the pre-digest output after.
//!
//! The shape rules leave no room for signature wrapping: exactly one `saml:Assertion` in the
//! whole document, a `ds:Signature` only as a direct child of that assertion or of a
//! `samlp:Response` root, at most one per parent, each with exactly one `Reference` whose
//! URI is `#` + its parent's `ID`. The element read afterwards must be the one the
//! signature's reference covers, found again by its `ID` in the signed bytes.

use libxml::parser::{Parser, ParserOptions};
use libxml::tree::{Document, Node, NodeType};

use crate::nodes::{child_elements, is};
use crate::{ASSERTION_NS, DSIG_NS, ENVELOPE_NS, Form, PROTOCOL_NS, SamlError, WSSE_NS, refuse};

/// Deeper documents are refused.
const MAX_DEPTH: usize = 64;

/// What a signed element may hold: canonicalisation's cost grows with its elements times
/// the namespaces in scope (more than linearly in xmlsec), and the digest is computed
/// before the signature value is checked, so an unsigned forgery could make the server
/// spend minutes on a few dozen kilobytes. An IdP's assertion has a few dozen elements and
/// a handful of namespaces.
const MAX_SIGNED_ELEMENTS: usize = 1_000;
const MAX_NAMESPACE_DECLARATIONS: usize = 32;

/// Parses `text` strictly: no DOCTYPE, no recovery, no network. libxml2's reason for a
/// refusal is the client's to read (cleaned, see `xml_errors`), never the log's alone.
pub(crate) fn parse_strict(text: &str) -> Result<Document, SamlError> {
    if text.contains("<!DOCTYPE") || text.contains("<!ENTITY") {
        return refuse("the document has a DOCTYPE (DTDs and entities are not accepted)");
    }
    crate::xml_errors::install();
    crate::xml_errors::clear();
    let options =
        ParserOptions { recover: false, no_net: true, no_def_dtd: true, no_error: false, ..ParserOptions::default() };
    let parsed = Parser::default().parse_string_with_options(text, options);
    let why = crate::xml_errors::take_first();
    let Ok(doc) = parsed else {
        return match why {
            // libxml2's own limit (256), met before ours is checked.
            Some(w) if w.contains("Excessive depth") => {
                refuse(format!("the document is nested deeper than {MAX_DEPTH} elements"))
            }
            Some(w) => refuse(format!("the document is not well-formed XML: {w}")),
            None => refuse("the document is not well-formed XML"),
        };
    };
    if doc.get_root_element().is_none() {
        return refuse("the document has no root element");
    }
    Ok(doc)
}

/// What the shape says about the document.
#[derive(Debug)]
pub(crate) struct Located {
    /// The assertion's `ID`.
    pub assertion_id: String,
    /// Set when the Response's signature (not the assertion's) covers the assertion: the
    /// Response's `ID`.
    pub response_id: Option<String>,
}

fn in_no_ns_or(node: &Node, ns: &str, local: &str) -> bool {
    node.get_name() == local && node.get_namespace().is_none_or(|n| n.get_href() == ns)
}

/// Checks the shape of `doc` (see the module's rules) and says which element is signed.
pub(crate) fn locate(doc: &Document, form: Form) -> Result<Located, SamlError> {
    let Some(root) = doc.get_root_element() else { return refuse("the document has no root element") };
    let mut counts = Counts::default();
    walk(&root, 0, false, &mut counts)?;
    if counts.encrypted > 0 {
        return refuse("encrypted assertions are not accepted");
    }
    if counts.assertions != 1 {
        return refuse(format!("the document holds {} assertions; exactly one is accepted", counts.assertions));
    }
    let (assertion, response) = match form {
        Form::Standalone if is(&root, ASSERTION_NS, "Assertion") => (root.clone(), None),
        Form::Standalone if is(&root, PROTOCOL_NS, "Response") => {
            let mut a = child_elements(&root, ASSERTION_NS, "Assertion");
            match (a.next(), a.next()) {
                (Some(x), None) => (x, Some(root.clone())),
                _ => return refuse("the Response's assertion must be a child of the Response"),
            }
        }
        Form::Standalone => return refuse("the root element must be saml:Assertion or samlp:Response"),
        Form::SoapHeader => (soap_assertion(&root)?, None),
    };
    for sig in &counts.signatures {
        let parent = sig.get_parent().filter(Node::is_element_node);
        let ok = parent.as_ref().is_some_and(|p| p == &assertion || response.as_ref() == Some(p));
        if !ok {
            return refuse("a Signature is somewhere other than in the assertion or the Response");
        }
    }
    let signature_of = |parent: &Node| -> Result<Option<String>, SamlError> {
        let sigs: Vec<Node> = child_elements(parent, DSIG_NS, "Signature").collect();
        let Some(sig) = sigs.first() else { return Ok(None) };
        if sigs.len() > 1 {
            return refuse(format!("<{}> has more than one Signature", parent.get_name()));
        }
        let id = parent.get_attribute("ID").filter(|i| !i.is_empty());
        let Some(id) = id else { return refuse(format!("the signed <{}> has no ID", parent.get_name())) };
        let refs: Vec<Node> = child_elements(sig, DSIG_NS, "SignedInfo")
            .flat_map(|si| child_elements(&si, DSIG_NS, "Reference").collect::<Vec<_>>())
            .collect();
        if refs.len() != 1 {
            return refuse("a Signature must have exactly one Reference");
        }
        if refs[0].get_attribute("URI").as_deref() != Some(&format!("#{id}")) {
            return refuse(format!("the Signature's Reference does not cover its own <{}>", parent.get_name()));
        }
        crate::algorithms::check_signature(sig, &refs[0])?;
        Ok(Some(id))
    };
    let assertion_id = assertion.get_attribute("ID").filter(|i| !i.is_empty());
    let Some(assertion_id) = assertion_id else { return refuse("the assertion has no ID") };
    let assertion_signed = signature_of(&assertion)?.is_some();
    let response_id = match &response {
        Some(r) => signature_of(r)?,
        None => None,
    };
    if !assertion_signed && response_id.is_none() {
        return refuse("the assertion is not signed");
    }
    let signed = if response_id.is_some() { response.as_ref().unwrap_or(&assertion) } else { &assertion };
    bounded(signed)?;
    Ok(Located { assertion_id, response_id })
}

/// Refuses a signed element whose canonical form would be costly to compute: more than
/// [`MAX_SIGNED_ELEMENTS`] elements in it, or more than [`MAX_NAMESPACE_DECLARATIONS`]
/// namespace declarations in it and on its ancestors (all of them are in scope).
fn bounded(signed: &Node) -> Result<(), SamlError> {
    fn count(n: &Node, elements: &mut usize, namespaces: &mut usize) {
        *elements += 1;
        *namespaces += n.get_namespace_declarations().len();
        if *elements <= MAX_SIGNED_ELEMENTS && *namespaces <= MAX_NAMESPACE_DECLARATIONS {
            for c in n.get_child_elements() {
                count(&c, elements, namespaces);
            }
        }
    }
    let (mut elements, mut namespaces) = (0, 0);
    let mut up = signed.get_parent();
    while let Some(a) = up.filter(Node::is_element_node) {
        namespaces += a.get_namespace_declarations().len();
        up = a.get_parent();
    }
    count(signed, &mut elements, &mut namespaces);
    if elements > MAX_SIGNED_ELEMENTS {
        return refuse(format!("the signed <{}> has more than {MAX_SIGNED_ELEMENTS} elements", signed.get_name()));
    }
    if namespaces > MAX_NAMESPACE_DECLARATIONS {
        return refuse(format!(
            "the signed <{}> has more than {MAX_NAMESPACE_DECLARATIONS} namespace declarations in scope",
            signed.get_name()
        ));
    }
    Ok(())
}

/// `Envelope/Header/wsse:Security/saml:Assertion`.
fn soap_assertion(root: &Node) -> Result<Node, SamlError> {
    if !in_no_ns_or(root, ENVELOPE_NS, "Envelope") {
        return refuse("the request's root is not the IDAP Envelope");
    }
    let headers: Vec<Node> =
        root.get_child_elements().into_iter().filter(|c| in_no_ns_or(c, ENVELOPE_NS, "Header")).collect();
    let [header] = headers.as_slice() else { return refuse("the request must have one Header") };
    let security: Vec<Node> = child_elements(header, WSSE_NS, "Security").collect();
    let [security] = security.as_slice() else { return refuse("the Header must have one wsse:Security") };
    let tokens: Vec<Node> = security.get_child_elements();
    match tokens.as_slice() {
        [a] if is(a, ASSERTION_NS, "Assertion") => Ok(a.clone()),
        _ => refuse("wsse:Security must hold exactly one saml:Assertion and nothing else"),
    }
}

/// Whether an IDAP request carries a `wsse:Security` header entry (so it logs in with
/// SAML). Only a request that names WS-Security's namespace is parsed; one that does and
/// that the strict parser refuses (a DOCTYPE, too deep, not well-formed) is refused with the
/// parser's reason: it may well carry a token, and a token is never ignored.
pub fn has_security_header(body: &[u8]) -> Result<bool, SamlError> {
    if memchr::memmem::find(body, WSSE_NS.as_bytes()).is_none() {
        return Ok(false);
    }
    let text = std::str::from_utf8(body).map_err(|_| SamlError("the request is not UTF-8".into()))?;
    let doc = parse_strict(text)?;
    let Some(root) = doc.get_root_element() else { return Ok(false) };
    let mut found = false;
    for h in root.get_child_elements().iter().filter(|c| in_no_ns_or(c, ENVELOPE_NS, "Header")) {
        for entry in h.get_child_elements() {
            if is(&entry, WSSE_NS, "Security") {
                found = true;
            } else if nested_security(&entry) {
                // Below an entry it is no header entry, and no token: but it would be
                // one a reader could take for the request's identity.
                return refuse("a wsse:Security element must be an entry of the Header, not inside one");
            }
        }
    }
    Ok(found)
}

fn nested_security(node: &Node) -> bool {
    node.get_child_elements().iter().any(|c| is(c, WSSE_NS, "Security") || nested_security(c))
}

#[derive(Default)]
struct Counts {
    assertions: usize,
    encrypted: usize,
    signatures: Vec<Node>,
}

/// Counts assertions and signatures everywhere; inside SAML elements (`saml`: below an
/// assertion or a Response) refuses comments, processing instructions and entity
/// references, whose text a reader could take apart from the text around it.
fn walk(node: &Node, depth: usize, saml: bool, counts: &mut Counts) -> Result<(), SamlError> {
    if depth > MAX_DEPTH {
        return refuse(format!("the document is nested deeper than {MAX_DEPTH} elements"));
    }
    let saml = saml
        || is(node, ASSERTION_NS, "Assertion")
        || is(node, PROTOCOL_NS, "Response")
        || is(node, ASSERTION_NS, "EncryptedAssertion");
    if node.get_name().contains(':') {
        // libxml keeps an element whose prefix is not declared under its whole name, in no
        // namespace: such a document is not namespace-well-formed.
        return refuse(format!("<{}> uses an undeclared namespace prefix", node.get_name()));
    }
    if is(node, ASSERTION_NS, "Assertion") {
        counts.assertions += 1;
    }
    if is(node, ASSERTION_NS, "EncryptedAssertion") {
        counts.encrypted += 1;
    }
    if is(node, DSIG_NS, "Signature") {
        counts.signatures.push(node.clone());
    }
    for c in node.get_child_nodes() {
        match c.get_type() {
            Some(NodeType::ElementNode) => walk(&c, depth + 1, saml, counts)?,
            Some(NodeType::TextNode | NodeType::CDataSectionNode) => {}
            Some(NodeType::CommentNode) if saml => {
                return refuse("the assertion contains an XML comment (text split by a comment is not accepted)");
            }
            Some(NodeType::CommentNode) => {}
            Some(NodeType::PiNode) if saml => return refuse("the assertion contains a processing instruction"),
            Some(NodeType::PiNode) => {}
            _ => return refuse("the document contains an entity reference or another unexpected node"),
        }
    }
    Ok(())
}

/// The assertion in the signed (pre-digest) bytes: the signed element itself, or the one
/// assertion child of the signed Response, with the `ID` the original document had.
pub(crate) fn signed_assertion(signed: &Document, located: &Located, idp: &str) -> Result<Node, SamlError> {
    let Some(root) = signed.get_root_element() else { return refuse("the signed content is empty") };
    let mut counts = Counts::default();
    walk(&root, 0, true, &mut counts)?;
    let assertion = match &located.response_id {
        Some(rid) => {
            if !is(&root, PROTOCOL_NS, "Response") || root.get_attribute("ID").as_deref() != Some(rid) {
                return refuse("the signature does not cover the Response");
            }
            if let Some(issuer) = child_elements(&root, ASSERTION_NS, "Issuer").next()
                && issuer.get_content().trim() != idp
            {
                return refuse(format!("the Response was issued by {:?}, not by the IdP", issuer.get_content().trim()));
            }
            let status = child_elements(&root, PROTOCOL_NS, "Status")
                .flat_map(|s| child_elements(&s, PROTOCOL_NS, "StatusCode").collect::<Vec<_>>())
                .next()
                .and_then(|c| c.get_attribute("Value"));
            if status.as_deref() != Some("urn:oasis:names:tc:SAML:2.0:status:Success") {
                return refuse("the Response's status is not Success");
            }
            let mut a = child_elements(&root, ASSERTION_NS, "Assertion");
            match (a.next(), a.next()) {
                (Some(x), None) => x,
                _ => return refuse("the signed Response does not hold exactly one assertion"),
            }
        }
        None => root,
    };
    if !is(&assertion, ASSERTION_NS, "Assertion")
        || assertion.get_attribute("ID").as_deref() != Some(located.assertion_id.as_str())
    {
        return refuse("the signature does not cover the assertion");
    }
    Ok(assertion)
}
