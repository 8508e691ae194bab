//! What a `ds:Signature` may ask of the verifier, checked before xmlsec sees it.
//!
//! xmlsec runs whatever a signature names, before it knows whether the signature is good:
//! an XSLT transform (which may fetch URLs and recurse), an XPath filter (whose cost grows
//! with the document's size, faster than linearly), a `RetrievalMethod` that fetches a key.
//! An unsigned attacker could make the server do that work. So only what an IdP needs is
//! let through: the enveloped-signature transform and canonicalisation (exclusive, or
//! inclusive 1.0/1.1, without comments), SHA-2 digests and RSA/ECDSA signatures over
//! SHA-2, a same-document reference (its URI is checked by `structure`), and a `KeyInfo`
//! that names no URI (it is never used: the IdP's certificates are). With that, the work of
//! a verification is linear in the size of the assertion, which the request limit caps.

use libxml::tree::Node;

use crate::nodes::{child_elements, is};
use crate::{DSIG_NS, SamlError, refuse};

const ENVELOPED: &str = "http://www.w3.org/2000/09/xmldsig#enveloped-signature";
const EXC_C14N: &str = "http://www.w3.org/2001/10/xml-exc-c14n#";
const C14N_10: &str = "http://www.w3.org/TR/2001/REC-xml-c14n-20010315";
const C14N_11: &str = "http://www.w3.org/2006/12/xml-c14n11";

/// Canonicalisations (for `CanonicalizationMethod`, and as a reference's transform).
const CANONICALISATIONS: &[&str] = &[EXC_C14N, C14N_10, C14N_11];

/// Signature algorithms: RSA (PKCS #1 v1.5) and ECDSA, with SHA-2.
const SIGNATURE_METHODS: &[&str] = &[
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha384",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha512",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha512",
];

/// Digests: SHA-2.
const DIGEST_METHODS: &[&str] = &[
    "http://www.w3.org/2001/04/xmlenc#sha256",
    "http://www.w3.org/2001/04/xmldsig-more#sha384",
    "http://www.w3.org/2001/04/xmlenc#sha512",
];

/// Transforms a reference may have; an IdP uses two (enveloped, then a canonicalisation).
const MAX_TRANSFORMS: usize = 3;

fn one(parent: &Node, local: &str) -> Result<Node, SamlError> {
    let mut found: Vec<Node> = child_elements(parent, DSIG_NS, local).collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => refuse(format!("the Signature has no {local}")),
        _ => refuse(format!("the Signature has more than one {local}")),
    }
}

fn algorithm(node: &Node) -> Result<String, SamlError> {
    node.get_attribute("Algorithm")
        .ok_or_else(|| SamlError(format!("the Signature's {} names no Algorithm", node.get_name())))
}

/// Why an algorithm outside the lists is refused, by what it is.
fn weak(what: &str, uri: &str) -> SamlError {
    let u = uri.to_ascii_lowercase();
    let why = if u.contains("hmac") {
        "HMAC (a shared secret, not the IdP's key) is not accepted"
    } else if u.contains("md5") {
        "MD5 is broken and not accepted"
    } else if u.contains("sha1") || u.ends_with("#dsa-sha1") {
        "SHA-1 is broken and not accepted"
    } else {
        "only RSA or ECDSA with SHA-256, SHA-384 or SHA-512 are accepted"
    };
    SamlError(format!("the Signature's {what} {uri:?} is refused: {why}"))
}

/// A canonicalisation or transform element: only exclusive canonicalisation may have a
/// child, its `InclusiveNamespaces` prefix list.
fn no_content(node: &Node, uri: &str) -> Result<(), SamlError> {
    for c in node.get_child_elements() {
        let prefix_list =
            uri == EXC_C14N && is(&c, EXC_C14N, "InclusiveNamespaces") && c.get_child_elements().is_empty();
        if !prefix_list {
            return refuse(format!(
                "the Signature's {} has content <{}>, which is not accepted",
                node.get_name(),
                c.get_name()
            ));
        }
    }
    Ok(())
}

/// Checks `sig` (whose one reference, `reference`, `structure` has found).
pub(crate) fn check_signature(sig: &Node, reference: &Node) -> Result<(), SamlError> {
    for c in sig.get_child_elements() {
        let known = ["SignedInfo", "SignatureValue", "KeyInfo"].iter().any(|l| is(&c, DSIG_NS, l));
        if !known {
            return refuse(format!("the Signature holds <{}>, which is not accepted", c.get_name()));
        }
    }
    no_uri_but(sig, reference)?;
    let signed_info = one(sig, "SignedInfo")?;
    one(sig, "SignatureValue")?;

    let c14n = one(&signed_info, "CanonicalizationMethod")?;
    let uri = algorithm(&c14n)?;
    if !CANONICALISATIONS.contains(&uri.as_str()) {
        return refuse(format!(
            "the Signature's CanonicalizationMethod {uri:?} is refused: only exclusive or inclusive \
             canonicalisation without comments is accepted"
        ));
    }
    no_content(&c14n, &uri)?;
    let method = algorithm(&one(&signed_info, "SignatureMethod")?)?;
    if !SIGNATURE_METHODS.contains(&method.as_str()) {
        return Err(weak("SignatureMethod", &method));
    }

    let transforms: Vec<Node> = child_elements(reference, DSIG_NS, "Transforms")
        .flat_map(|t| child_elements(&t, DSIG_NS, "Transform").collect::<Vec<_>>())
        .collect();
    if transforms.len() > MAX_TRANSFORMS {
        return refuse(format!("the Signature's Reference has more than {MAX_TRANSFORMS} transforms"));
    }
    for t in &transforms {
        let uri = algorithm(t)?;
        if uri != ENVELOPED && !CANONICALISATIONS.contains(&uri.as_str()) {
            return refuse(format!(
                "the Signature's transform {uri:?} is refused: only the enveloped-signature \
                 transform and canonicalisation are accepted"
            ));
        }
        no_content(t, &uri)?;
    }
    for c in reference.get_child_elements() {
        let known = ["Transforms", "DigestMethod", "DigestValue"].iter().any(|l| is(&c, DSIG_NS, l));
        if !known {
            return refuse(format!("the Signature's Reference holds <{}>, which is not accepted", c.get_name()));
        }
    }
    let digest = algorithm(&one(reference, "DigestMethod")?)?;
    if !DIGEST_METHODS.contains(&digest.as_str()) {
        return Err(weak("DigestMethod", &digest));
    }
    one(reference, "DigestValue")?;
    Ok(())
}

/// No element in the signature but its reference names a URI (`RetrievalMethod`, a key
/// to fetch, a second reference hidden elsewhere).
fn no_uri_but(node: &Node, reference: &Node) -> Result<(), SamlError> {
    for c in node.get_child_elements() {
        if is(&c, DSIG_NS, "RetrievalMethod") {
            return refuse("the Signature's KeyInfo has a RetrievalMethod, which is not accepted");
        }
        if &c != reference && c.get_attribute("URI").is_some() {
            return refuse(format!("the Signature's <{}> names a URI, which is not accepted", c.get_name()));
        }
        no_uri_but(&c, reference)?;
    }
    Ok(())
}
