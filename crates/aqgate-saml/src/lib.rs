//! SAML 2.0 login for aqgate's servlet: an assertion signed by the configured identity
//! provider (IdP) names an agent.
//!
//! [`Verifier::verify`] takes the bytes a client sent, either a standalone document (a
//! `saml:Assertion`, or the `samlp:Response` the IdP posted, carried base64 in an HTTP
//! header) or a whole IDAP request that carries the assertion in its SOAP `Header` as
//! WS-Security's SAML token profile has it (`wsse:Security/saml:Assertion`). It answers
//! the subject (the NameID, or a configured attribute) and how long the assertion's id must
//! be remembered so that it is used once; the caller records the id (the store's replay
//! cache) and maps the subject to an agent.
//!
//! How the checks keep the data honest:
//!
//! 1. The bytes are read strictly (no DOCTYPE, no recovery from malformed XML, a depth
//!    limit) and their shape is checked before any cryptography: exactly one assertion in
//!    the whole document, signatures only as a child of the assertion or of the response
//!    root, each with one reference that names its own parent's `ID`, no comment or
//!    processing instruction inside the SAML elements (`structure`). A signature may ask
//!    only for what an IdP needs (enveloped-signature, canonicalisation, SHA-2, RSA or
//!    ECDSA): nothing that fetches, recurses or grows faster than the document
//!    (`algorithms`).
//! 2. Every signature is verified by xmlsec (samael's `reduce_xml_to_signed`, pre-digest
//!    mode) with the IdP's certificates from its metadata only: a `KeyInfo` inside the
//!    document is never used. Verification runs over the original bytes in their context,
//!    so namespaces and whitespace are exactly what the IdP signed.
//! 3. What is read (issuer, subject, conditions, confirmations, attributes) is read only
//!    from the pre-digest output, the canonical bytes the signature's digest covers: there is
//!    no other copy of the element to be confused with (`assertion`).

mod algorithms;
mod assertion;
mod metadata;
mod nodes;
mod structure;
mod xml_errors;

use chrono::{DateTime, Utc};
use samael::crypto::CertificateDer;

pub use metadata::Idp;
pub use structure::has_security_header;

/// SAML 2.0 assertions.
pub const ASSERTION_NS: &str = "urn:oasis:names:tc:SAML:2.0:assertion";
/// SAML 2.0 protocol messages (`Response`).
pub const PROTOCOL_NS: &str = "urn:oasis:names:tc:SAML:2.0:protocol";
/// XML digital signatures.
pub const DSIG_NS: &str = "http://www.w3.org/2000/09/xmldsig#";
/// WS-Security's `Security` header.
pub const WSSE_NS: &str = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd";
/// The IDAP envelope.
pub const ENVELOPE_NS: &str = "http://ns.oracle.com/AQ/schemas/envelope";
/// The bearer subject confirmation method.
pub const BEARER: &str = "urn:oasis:names:tc:SAML:2.0:cm:bearer";

/// The largest assertion document accepted (the HTTP header form; the SOAP form is bounded
/// by the servlet's request limit).
pub const MAX_BYTES: usize = 256 * 1024;

/// Why an assertion was refused: a message for the client that says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SAML assertion refused: {0}")]
pub struct SamlError(pub String);

pub(crate) fn refuse<T>(msg: impl Into<String>) -> Result<T, SamlError> {
    Err(SamlError(msg.into()))
}

/// Where the assertion came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A document of its own: `saml:Assertion` or `samlp:Response` as its root.
    Standalone,
    /// A whole IDAP request with `Envelope/Header/wsse:Security/saml:Assertion`.
    SoapHeader,
}

/// A verified assertion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The IdP's entityID (the assertion's Issuer).
    pub issuer: String,
    /// The assertion's `ID`, to be used once.
    pub assertion_id: String,
    /// The NameID's whole text, or the configured attribute's value, exactly as signed:
    /// printable ASCII with no surrounding space.
    pub subject: String,
    /// Until when the id must be remembered: as long as the assertion could be accepted, so
    /// the latest `NotOnOrAfter` of its bearer confirmations (not beyond the Conditions'
    /// `NotOnOrAfter`), plus the skew.
    pub remember_until: DateTime<Utc>,
}

/// What aqgate accepts: the IdP, its own entityID (the audience), the clock skew and
/// where the agent's name is.
#[derive(Debug, Clone)]
pub struct Verifier {
    idp: Idp,
    audience: String,
    skew: chrono::Duration,
    agent_attribute: Option<String>,
}

impl Verifier {
    pub fn new(
        idp: Idp,
        audience: impl Into<String>,
        skew: std::time::Duration,
        agent_attribute: Option<String>,
    ) -> Self {
        let skew = chrono::Duration::from_std(skew).unwrap_or(chrono::Duration::MAX);
        Self { idp, audience: audience.into(), skew, agent_attribute }
    }

    pub fn idp(&self) -> &Idp {
        &self.idp
    }

    /// Verifies the assertion in `xml` (see [`Form`]) at time `now`.
    pub fn verify(&self, xml: &[u8], form: Form, now: DateTime<Utc>) -> Result<Verified, SamlError> {
        if form == Form::Standalone && xml.len() > MAX_BYTES {
            return refuse(format!("the assertion is larger than {MAX_BYTES} bytes"));
        }
        let text = std::str::from_utf8(xml).map_err(|_| SamlError("the assertion is not UTF-8".into()))?;
        let doc = structure::parse_strict(text)?;
        let located = structure::locate(&doc, form)?;
        // Every signature in the document must verify with the IdP's certificates; the
        // answer is the pre-digest bytes of the signed element (the Response's, when the
        // Response is signed, else the assertion's).
        let predigest =
            <samael::crypto::Crypto as samael::crypto::CryptoProvider>::reduce_xml_to_signed_with_allowed_algorithms(
                text,
                self.idp.certs(),
                samael::crypto::ReduceMode::PreDigest,
                Some(ALLOWED_ALGORITHMS),
            );
        xml_errors::route_xmlsec();
        let predigest =
            predigest.map_err(|_| SamlError("the signature is not valid for the IdP's certificate".into()))?;
        drop(doc);
        let signed = structure::parse_strict(&predigest)?;
        let node = structure::signed_assertion(&signed, &located, &self.idp.entity_id)?;
        assertion::check(&node, self, now)
    }
}

/// RSA and ECDSA with SHA-2: no SHA-1.
const ALLOWED_ALGORITHMS: &[samael::crypto::AllowedSignatureAlgorithm] = {
    use samael::crypto::AllowedSignatureAlgorithm::*;
    &[RsaSha256, RsaSha384, RsaSha512, EcdsaSha256, EcdsaSha384, EcdsaSha512]
};

pub(crate) fn certs_from_base64(b64: &[String]) -> Result<Vec<CertificateDer>, String> {
    use base64::Engine as _;
    b64.iter()
        .map(|c| {
            let clean: String = c.chars().filter(|c| !c.is_whitespace()).collect();
            base64::engine::general_purpose::STANDARD
                .decode(clean)
                .map(CertificateDer::from)
                .map_err(|e| format!("a signing certificate is not base64: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
