//! S/MIME verification of IDAP mail (the SMTP ingestion filter's check), S/MIME mail made
//! by aqgate (`aqgate mail sign`, signed and encrypted replies), and the gateway's own
//! certificate.
//!
//! Pure: no network, no directory, no clock. The caller looks the sender up in the directory
//! (step 1, [`sender_address`]), then hands [`verify_with`] the sender's certificates from the
//! directory, the [`Policy`] and the arrival time `now`. Outcomes are values ([`Verdict`]): the
//! SMTP layer maps `TempError` to 4.x.x and `Fail`/`PermError` to 5.7.x with the reason.
//!
//! Verification is OpenSSL's CMS (RFC 5652): SignedData with either signer identifier
//! (issuerAndSerialNumber or subjectKeyIdentifier), RSA PKCS#1 v1.5, RSASSA-PSS or ECDSA with
//! SHA-256, SHA-384 or SHA-512. Policy, in the order it is checked:
//! - exactly one `From:` header line holding exactly one mailbox;
//! - the whole body is S/MIME: top-level `multipart/signed` (protocol
//!   `application/(x-)pkcs7-signature`), `application/(x-)pkcs7-mime` signed-data, or
//!   enveloped-data / authEnveloped-data encrypted to the gateway's certificate whose
//!   decrypted content is one of the two signed forms. A signed part inside e.g.
//!   `multipart/mixed` next to unsigned content is refused;
//! - exactly one SignerInfo, with an accepted digest and signature algorithm; it names one of
//!   the directory's certificates for the sender. Certificates and CRLs carried inside the
//!   mail are never trusted: the signer is looked for among the directory's certificates
//!   only (`NOINTERN`), and carried certificates serve only as intermediates while a path to
//!   a trust anchor of the [`TrustStore`] is built;
//! - the signature verifies over the signed content;
//! - the signer certificate has an extendedKeyUsage containing emailProtection (a certificate
//!   without the extension is refused too), chains to a trusted CA, and is valid at `now`
//!   (OpenSSL purpose `smimesign`, verification time `now`);
//! - no certificate of the chain is revoked by a configured CRL of its issuer (a trusted CA's,
//!   or an intermediate's). An issuer without a configured CRL is not revocation-checked; a
//!   configured CRL that is not current at `now` gives `TempError` (status unknown until the
//!   operator refreshes it);
//! - the From address equals one of the certificate's e-mail addresses (rfc822Name SANs and
//!   subject emailAddress), compared ASCII case-insensitively as a whole: directories match
//!   `mail` case-insensitively, and no real mail system distinguishes local parts by case;
//! - a signingTime attribute, when present, lies inside the signer certificate's validity,
//!   at most [`MAX_CLOCK_SKEW`] after `now`, and not before the replay window;
//! - signed content that is itself signed (layers) is verified the same way, every layer as
//!   the same agent; a signed or encrypted part anywhere else inside it is refused;
//! - the signed content holds exactly one IDAP document ([`super::extract`]).
//!
//! The IDAP document is taken only from the bytes the signature was verified over (split
//! from the mail as OpenSSL's `SMIME_read` splits it, or carried inside the CMS structure),
//! never from a second parse of the unsigned envelope.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use mail_parser::{Address, MessageParser, MimeHeaders, PartType};
use openssl::asn1::Asn1Time;
use openssl::cms::{CMSOptions, CmsContentInfo};
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::verify::X509VerifyParam;
use openssl::x509::{CrlStatus, X509, X509Crl, X509ExtendedKeyUsage, X509NameRef, X509PurposeId, X509StoreContext};

use crate::extract;

mod der;
mod envelope;
mod layer;
mod sign;
#[cfg(test)]
mod tests;
mod trust;

use {der::*, envelope::*, layer::*, trust::*};

pub use der::{
    SignedDataView, SignerId, SignerInfoView, signature_der, signed_data, signer_info_count, without_certificates,
};
pub use envelope::GatewayIdentity;
pub use sign::{ReplyHeaders, reply_mail, sign, sign_at, sign_encrypted};
pub use trust::TrustStore;

/// How far in the future (seconds) of the arrival time a signingTime may lie: clocks differ.
pub const MAX_CLOCK_SKEW: i64 = 300;

/// At most this many signed layers, one inside the other.
const MAX_LAYERS: usize = 4;

/// What verification concluded; the SMTP layer maps TempError → 4xx, Fail/PermError → 5.7.x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Boxed: a verified mail is large, the refusals are small.
    Pass(Box<Verified>),
    /// The mail is not acceptably signed by the sender (unsigned, forged, wrong certificate…).
    Fail(String),
    /// The mail is malformed (unparsable MIME or CMS, no IDAP document).
    PermError(String),
    /// Something on our side may get better later (unreadable directory certificate, stale CRL).
    TempError(String),
}

/// A mail that passed: who sent it and the IDAP document it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The single From address, lower-cased.
    pub from: String,
    /// The IDAP XML bytes (transfer encoding removed, no charset conversion).
    pub idap: Vec<u8>,
    /// Message-ID without the angle brackets.
    pub message_id: Option<String>,
    /// The first Reply-To address, as written.
    pub reply_to: Option<String>,
    /// The decoded Subject.
    pub subject: Option<String>,
    /// The mail was encrypted (to the gateway's certificate).
    pub encrypted: bool,
    /// DER of the certificate that signed the (outermost) signed layer: one of the
    /// directory's certificates for the sender.
    pub signer: Vec<u8>,
    /// What recognises a re-sent copy: [`body_digest`] of the outermost signed entity (for
    /// encrypted mail, of the decrypted one, so that a request encrypted again is the same).
    pub digest: String,
}

/// What verification allows besides the directory's certificates and the trust store.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    /// The replay window in seconds (the spool's dedupe window): a signingTime older than
    /// this is refused, so a copy replayed after the spool forgot the mail is refused too.
    /// 0: no age limit.
    pub replay_window: i64,
    /// The gateway's certificate and key: mail encrypted to it is decrypted. `None`:
    /// encrypted mail is refused.
    pub gateway: Option<&'a GatewayIdentity>,
}

impl Default for Policy<'_> {
    fn default() -> Self {
        Policy { replay_window: 168 * 3600, gateway: None }
    }
}

/// Step 1 (before the directory lookup): the From address(es) of the raw message. Err if not exactly one From header / one address.
pub fn sender_address(raw: &[u8]) -> Result<String, String> {
    let from_lines = header_lines(raw).filter(|line| header_name_is(line, "from")).count();
    match from_lines {
        0 => return Err("the message has no From header".to_string()),
        1 => {}
        n => return Err(format!("the message has {n} From headers; exactly one is required")),
    }
    let message = MessageParser::default().parse_headers(raw).ok_or_else(|| "unparsable message header".to_string())?;
    let addresses: Vec<&mail_parser::Addr<'_>> = match message.from() {
        Some(Address::List(list)) => list.iter().collect(),
        Some(Address::Group(_)) => {
            return Err("the From header is a group; exactly one mailbox is required".to_string());
        }
        None => Vec::new(),
    };
    match addresses.as_slice() {
        [addr] => match addr.address() {
            Some(address) if is_bare_address(address) => Ok(address.to_ascii_lowercase()),
            _ => Err("the From header holds no valid address".to_string()),
        },
        [] => Err("the From header holds no address".to_string()),
        more => Err(format!("the From header holds {} addresses; exactly one is required", more.len())),
    }
}

/// Step 2: verify `raw` (the whole RFC 5322 message as received) with `agent_certs` (DER
/// certificates from the directory for the sender; verification passes if the single signer is
/// one of them), at time `now` (unix seconds), with the default [`Policy`] (the default
/// replay window, no decryption).
pub fn verify(raw: &[u8], agent_certs: &[Vec<u8>], trust: &TrustStore, now: i64) -> Verdict {
    verify_with(raw, agent_certs, trust, &Policy::default(), now)
}

/// [`verify`] with a [`Policy`]: the replay window, and the gateway's key for encrypted mail.
pub fn verify_with(raw: &[u8], agent_certs: &[Vec<u8>], trust: &TrustStore, policy: &Policy<'_>, now: i64) -> Verdict {
    // The openssl crate (0.10.82, the newest) panics while collecting OpenSSL's error stack
    // when an error's data string is not UTF-8 (`str::from_utf8(..).unwrap()` in
    // `Error::get`), which hostile DER can cause. Hostile input must get a rejection, never
    // take the process down: the panic is contained here and reported as a failed check.
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| verify_inner(raw, agent_certs, trust, policy, now)));
    match result {
        Ok(Ok(verified)) => Verdict::Pass(Box::new(verified)),
        Ok(Err(verdict)) => verdict,
        Err(_) => {
            // Drain what the panic left in this thread's OpenSSL error queue (each attempt
            // pops entries; one that panics again is contained the same way).
            for _ in 0..32 {
                if std::panic::catch_unwind(openssl::error::ErrorStack::get).is_ok() {
                    break;
                }
            }
            fail("the signature could not be parsed (malformed S/MIME structure)")
        }
    }
}

fn fail(reason: impl Into<String>) -> Verdict {
    Verdict::Fail(reason.into())
}

fn perm(reason: impl Into<String>) -> Verdict {
    Verdict::PermError(reason.into())
}

fn temp(reason: impl Into<String>) -> Verdict {
    Verdict::TempError(reason.into())
}

/// A directory certificate, parsed once per process: OpenSSL 3 takes ~160 µs to decode an
/// X.509 certificate (most of it in its provider-based key decoder), a third of a whole
/// verification. Keyed by the SHA-256 of the DER, so a changed certificate is a new entry;
/// the cache is dropped when it grows past 4,096 entries.
fn parsed_certificate(der: &[u8]) -> Result<X509, openssl::error::ErrorStack> {
    type Cache = std::sync::Mutex<std::collections::HashMap<[u8; 32], X509>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let key = openssl::sha::sha256(der);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let cert = X509::from_der(der)?;
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if c.len() >= 4096 {
        c.clear();
    }
    c.insert(key, cert.clone());
    Ok(cert)
}

fn verify_inner(
    raw: &[u8],
    agent_certs: &[Vec<u8>],
    trust: &TrustStore,
    policy: &Policy<'_>,
    now: i64,
) -> Result<Verified, Verdict> {
    let from = sender_address(raw).map_err(fail)?;
    let content_types = header_lines(raw).filter(|line| header_name_is(line, "content-type")).count();
    if content_types > 1 {
        return Err(perm(format!("the message has {content_types} Content-Type headers")));
    }
    let message = MessageParser::default().parse(raw).ok_or_else(|| perm("unparsable message"))?;
    let shape = top_shape(&message)?;
    let directory = directory_certificates(agent_certs, &from)?;
    let cx = Context { from: &from, directory: &directory, trust, policy, now };
    let (idap, signer, encrypted, digest) = match shape {
        Shape::Enveloped => {
            let entity = decrypt(&message, policy.gateway)?;
            let inner = MessageParser::default()
                .parse(&entity)
                .ok_or_else(|| perm("the decrypted content is not a MIME entity"))?;
            let inner_shape = match nested(&inner) {
                Nested::Signed(shape) => shape,
                _ => {
                    let (c, s) = media_type(inner.root_part());
                    return Err(fail(format!(
                        "not signed: the encrypted mail holds {c}/{s}; the request inside must be S/MIME signed"
                    )));
                }
            };
            let (idap, signer) = verify_layers(&entity, &inner, inner_shape, &cx, 1)?;
            (idap, signer, true, body_digest(&entity))
        }
        shape => {
            let (idap, signer) = verify_layers(raw, &message, shape, &cx, 1)?;
            (idap, signer, false, body_digest(raw))
        }
    };
    Ok(Verified {
        from,
        idap,
        message_id: message.message_id().map(str::to_string),
        reply_to: message.reply_to().and_then(|a| a.first()).and_then(|a| a.address()).map(str::to_string),
        subject: message.subject().map(str::to_string),
        encrypted,
        signer: signer.to_der().map_err(|e| temp(first_error(&e)))?,
        digest,
    })
}

/// The directory's certificates for the sender, parsed (with their DER).
fn directory_certificates(agent_certs: &[Vec<u8>], from: &str) -> Result<Vec<(X509, Vec<u8>)>, Verdict> {
    if agent_certs.is_empty() {
        return Err(fail(format!("the directory holds no certificate for {from}")));
    }
    agent_certs
        .iter()
        .enumerate()
        .map(|(i, der)| {
            parsed_certificate(der).map(|cert| (cert, der.clone())).map_err(|e| {
                temp(format!("directory certificate #{} for {from} is unreadable: {}", i + 1, first_error(&e)))
            })
        })
        .collect()
}

/// Verifies the signed layer `entity` (parsed as `message`, of `shape`) and every signed
/// layer inside it; the IDAP document of the innermost content, and the outermost signer.
fn verify_layers(
    entity: &[u8],
    message: &mail_parser::Message<'_>,
    shape: Shape,
    cx: &Context<'_>,
    depth: usize,
) -> Result<(Vec<u8>, X509), Verdict> {
    let layer = verify_layer(entity, message, shape, cx)?;
    let Some(inner) = MessageParser::default().parse(&layer.content) else {
        return Err(perm("the signed content is not MIME"));
    };
    match nested(&inner) {
        Nested::Signed(_) if depth >= MAX_LAYERS => {
            Err(fail(format!("the signed content is signed more than {MAX_LAYERS} times over")))
        }
        Nested::Signed(inner_shape) => {
            let (idap, _) = verify_layers(&layer.content, &inner, inner_shape, cx, depth + 1)?;
            Ok((idap, layer.signer))
        }
        Nested::Encrypted => Err(fail(
            "the signed content is encrypted S/MIME: encrypted content inside a signature is not accepted \
             (sign the request, then encrypt the signed mail)",
        )),
        Nested::Inside(what) => Err(fail(format!(
            "the signed content holds {what} next to other parts: a request is signed once as a whole, \
             or in layers that are each the whole content"
        ))),
        Nested::Plain => {
            let idap = extract::idap_document_of(&layer.content, &inner).map_err(perm)?;
            Ok((idap, layer.signer))
        }
    }
}

/// SHA-256 (hex) of an entity's body — for S/MIME, the signed content and its signature. A
/// replay with new outer headers (Message-ID, Reply-To) has the same digest; line endings
/// (rewritten in transit) do not count.
pub fn body_digest(raw: &[u8]) -> String {
    // The body starts after the first empty line (CRLF or LF line ends).
    let mut start = 0;
    let mut pos = 0;
    for line in raw.split_inclusive(|&b| b == b'\n') {
        pos += line.len();
        if line == b"\n" || line == b"\r\n" {
            start = pos;
            break;
        }
    }
    let mut hasher = openssl::sha::Sha256::new();
    for piece in raw[start..].split(|&b| b == b'\r') {
        hasher.update(piece);
    }
    hex::encode(hasher.finish())
}

/// The two parts of a `multipart/signed` body, split as OpenSSL's `SMIME_read` splits them:
/// the first part (its headers included) with every line end made CRLF and the line end
/// before the delimiter dropped (RFC 2046: it belongs to the delimiter), which is what the
/// signature covers; and the second part's raw bytes. Public for the fuzz targets.
pub fn split_signed<'a>(body: &'a [u8], boundary: &str) -> Result<(Vec<u8>, &'a [u8]), Verdict> {
    let delimiter = format!("--{boundary}");
    let mut parts: Vec<(usize, usize)> = Vec::new();
    let mut open: Option<usize> = None;
    let mut closed = false;
    let mut pos = 0;
    for line in body.split_inclusive(|&b| b == b'\n') {
        let start = pos;
        pos += line.len();
        let Some(after) = line.strip_prefix(delimiter.as_bytes()) else { continue };
        let is_close = after.starts_with(b"--");
        let tail = if is_close { &after[2..] } else { after };
        if !tail.iter().all(u8::is_ascii_whitespace) {
            continue; // a longer boundary that merely starts with ours
        }
        if let Some(from) = open.take() {
            parts.push((from, start));
        }
        if is_close {
            closed = true;
            break;
        }
        open = Some(pos);
    }
    if let (Some(from), false) = (open, closed) {
        parts.push((from, body.len()));
    }
    let [(a, b), (c, d)] = parts[..] else {
        return Err(perm(format!("multipart/signed has {} parts; exactly two are required", parts.len())));
    };
    let mut content = Vec::with_capacity(b - a + 64);
    for (i, line) in body[a..b].split_inclusive(|&x| x == b'\n').enumerate() {
        if i > 0 {
            content.extend_from_slice(b"\r\n");
        }
        let end = line.iter().rposition(|&x| x != b'\r' && x != b'\n').map_or(0, |p| p + 1);
        content.extend_from_slice(&line[..end]);
    }
    Ok((content, &body[c..d]))
}

fn media_type(part: &mail_parser::MessagePart<'_>) -> (String, String) {
    match part.content_type() {
        Some(ct) => (ct.ctype().to_ascii_lowercase(), ct.subtype().unwrap_or_default().to_ascii_lowercase()),
        None if matches!(part.body, PartType::Multipart(_)) => ("multipart".to_string(), "mixed".to_string()),
        None => ("text".to_string(), "plain".to_string()),
    }
}

/// rfc822Name SANs and subject emailAddress values, lower-cased.
fn certificate_emails(cert: &X509) -> Vec<String> {
    let mut emails: Vec<String> = cert
        .subject_alt_names()
        .map(|names| names.iter().filter_map(|n| n.email().map(str::to_ascii_lowercase)).collect())
        .unwrap_or_default();
    for entry in cert.subject_name().entries_by_nid(Nid::PKCS9_EMAILADDRESS) {
        if let Ok(value) = entry.data().to_string() {
            emails.push(value.to_ascii_lowercase());
        }
    }
    emails.dedup();
    emails
}

/// `local@domain` with no whitespace, controls or address punctuation.
fn is_bare_address(address: &str) -> bool {
    let Some((local, domain)) = address.rsplit_once('@') else { return false };
    !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
        && address.chars().all(|c| c.is_ascii_graphic() && !"<>()[],;:\"\\".contains(c))
}

/// The header lines (unfolded starts only) of the top-level header section.
fn header_lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    raw.split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .take_while(|line| !line.is_empty())
        .filter(|line| !line.starts_with(b" ") && !line.starts_with(b"\t"))
}

/// Whether a header line has field name `name` (ASCII case-insensitive; obsolete whitespace
/// before the colon allowed).
fn header_name_is(line: &[u8], name: &str) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else { return false };
    let field = line.get(..colon).unwrap_or_default();
    let trimmed_len = field.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |p| p + 1);
    field.get(..trimmed_len).is_some_and(|f| f.eq_ignore_ascii_case(name.as_bytes()))
}

/// The most specific OpenSSL error reason, without internals such as file names and lines.
fn first_error(stack: &openssl::error::ErrorStack) -> String {
    let reasons: Vec<String> = stack
        .errors()
        .iter()
        .map(|e| match (e.reason(), e.data()) {
            (Some(reason), Some(data)) => format!("{reason} ({data})"),
            (Some(reason), None) => reason.to_string(),
            _ => "unknown OpenSSL error".to_string(),
        })
        .collect();
    if reasons.is_empty() { "unknown OpenSSL error".to_string() } else { reasons.join("; ") }
}
