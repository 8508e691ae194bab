//! S/MIME verification of IDAP mail (the SMTP ingestion filter's check) and `aqgate mail sign`.
//!
//! Pure: no network, no directory, no clock. The caller looks the sender up in the directory
//! (step 1, [`sender_address`]), then hands [`verify`] the sender's certificates from the
//! directory and the arrival time `now`. Outcomes are values ([`Verdict`]): the SMTP layer maps
//! `TempError` to 4.x.x and `Fail`/`PermError` to 5.7.x with the reason.
//!
//! Policy, in the order it is checked:
//! - exactly one `From:` header line holding exactly one mailbox;
//! - the whole body is S/MIME signed: top-level `multipart/signed` (protocol
//!   `application/(x-)pkcs7-signature`) or `application/(x-)pkcs7-mime` signed-data. A signed
//!   part inside e.g. `multipart/mixed` next to unsigned content is refused;
//! - exactly one SignerInfo; its certificate must be one of the directory's certificates for the
//!   sender. Certificates and CRLs carried inside the mail are never used (`NOINTERN`, and the
//!   chain is built from the [`TrustStore`] only);
//! - the signature verifies over the signed content;
//! - the signer certificate has an extendedKeyUsage containing emailProtection (a certificate
//!   without the extension is refused too), chains to a trusted CA, and is valid at `now`
//!   (OpenSSL purpose `smimesign`, verification time `now`);
//! - it is not revoked by a CRL of its issuing CA in the trust store. A CA without a configured
//!   CRL is not revocation-checked; a configured CRL that is not current at `now` gives
//!   `TempError` (status unknown until the operator refreshes it);
//! - the From address equals one of the certificate's e-mail addresses (rfc822Name SANs and
//!   subject emailAddress), compared ASCII case-insensitively as a whole: directories match
//!   `mail` case-insensitively, and no real mail system distinguishes local parts by case;
//! - the signed content holds exactly one IDAP document ([`super::extract`]).
//!
//! The IDAP document is taken only from the bytes the signature was verified over (split
//! from the mail as OpenSSL's `SMIME_read` splits it, or carried inside the PKCS#7), never
//! from a second parse of the unsigned envelope.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use mail_parser::{Address, MessageParser, MimeHeaders, PartType};
use openssl::asn1::Asn1Time;
use openssl::nid::Nid;
use openssl::pkcs7::{Pkcs7, Pkcs7Flags};
use openssl::pkey::PKey;
use openssl::stack::Stack;
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::verify::X509VerifyParam;
use openssl::x509::{CrlStatus, X509, X509Crl, X509ExtendedKeyUsage, X509NameRef, X509PurposeId, X509StoreContext};

use crate::extract;

mod der;
mod sign;
#[cfg(test)]
mod tests;
mod trust;

use {der::*, trust::*};

pub use der::{signature_der, signer_info_count, without_certificates};
pub use sign::{sign, sign_at};
pub use trust::TrustStore;

/// What verification concluded; the SMTP layer maps TempError → 4xx, Fail/PermError → 5.7.x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass(Verified),
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
/// one of them), at time `now` (unix seconds).
pub fn verify(raw: &[u8], agent_certs: &[Vec<u8>], trust: &TrustStore, now: i64) -> Verdict {
    // The openssl crate (0.10.82, the newest) panics while collecting OpenSSL's error stack
    // when an error's data string is not UTF-8 (`str::from_utf8(..).unwrap()` in
    // `Error::get`), which hostile DER can cause. Hostile input must get a rejection, never
    // take the process down: the panic is contained here and reported as a failed check.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| verify_inner(raw, agent_certs, trust, now)));
    match result {
        Ok(Ok(verified)) => Verdict::Pass(verified),
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

/// How the top level of the message is signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Detached,
    Opaque,
}

fn verify_inner(raw: &[u8], agent_certs: &[Vec<u8>], trust: &TrustStore, now: i64) -> Result<Verified, Verdict> {
    let from = sender_address(raw).map_err(fail)?;
    let content_types = header_lines(raw).filter(|line| header_name_is(line, "content-type")).count();
    if content_types > 1 {
        return Err(perm(format!("the message has {content_types} Content-Type headers")));
    }
    let message = MessageParser::default().parse(raw).ok_or_else(|| perm("unparsable message"))?;
    let shape = signed_shape(&message)?;

    let root = message.root_part();
    let (signature, detached) = match shape {
        Shape::Detached => {
            let boundary = root
                .content_type()
                .and_then(|ct| ct.attribute("boundary"))
                .ok_or_else(|| perm("multipart/signed without a boundary"))?;
            let body = raw.get(root.raw_body_offset() as usize..).unwrap_or_default();
            let (content, signature_part) = split_signed(body, boundary)?;
            (signature_der(signature_part)?, Some(content))
        }
        Shape::Opaque => (base64_or_der(root.contents()), None),
    };
    // The certificates (and CRLs) a mail carries are never used; OpenSSL 3 would still
    // decode them, ~40 % of a verification. Dropped before parsing when the DER allows.
    let signature = without_certificates(&signature).unwrap_or(signature);
    let p7 =
        Pkcs7::from_der(&signature).map_err(|e| perm(format!("unreadable S/MIME structure: {}", first_error(&e))))?;
    if p7.signed().is_none() {
        return Err(fail("not signed: the S/MIME content is not signed-data"));
    }
    let der = p7.to_der().map_err(|e| perm(format!("unreadable signature: {}", first_error(&e))))?;
    match signer_info_count(&der).map_err(|e| perm(format!("unreadable signature: {e}")))? {
        1 => {}
        n => return Err(fail(format!("the message has {n} signers; exactly one is required"))),
    }

    if agent_certs.is_empty() {
        return Err(fail(format!("the directory holds no certificate for {from}")));
    }
    let mut directory = Stack::new().map_err(|e| temp(first_error(&e)))?;
    for (i, der) in agent_certs.iter().enumerate() {
        let cert = parsed_certificate(der).map_err(|e| {
            temp(format!("directory certificate #{} for {from} is unreadable: {}", i + 1, first_error(&e)))
        })?;
        directory.push(cert).map_err(|e| temp(first_error(&e)))?;
    }
    let signers = p7.signers(&directory, Pkcs7Flags::NOINTERN).map_err(|_| {
        fail(format!(
            "signed with a certificate that is not {from}'s certificate in the directory (forged or another agent)"
        ))
    })?;
    let signer = match signers.iter().next() {
        Some(signer) if signers.len() == 1 => signer.to_owned(),
        _ => return Err(fail("the signer could not be identified")),
    };

    let store = trust.x509_store(now).map_err(|e| temp(first_error(&e)))?;
    let mut content = Vec::new();
    p7.verify(&directory, &store, detached.as_deref(), Some(&mut content), Pkcs7Flags::NOINTERN | Pkcs7Flags::NOVERIFY)
        .map_err(|e| fail(format!("the signature does not verify (content altered?): {}", first_error(&e))))?;

    match signer.extended_key_usage() {
        Some(eku) if eku.contains(X509ExtendedKeyUsage::SMIME) => {}
        Some(_) => return Err(fail("the signer certificate's extendedKeyUsage does not include emailProtection")),
        None => return Err(fail("the signer certificate has no extendedKeyUsage (emailProtection required)")),
    }
    let chain = verify_chain(trust, &store, &signer, now)?;
    check_revocation(trust, &signer, &chain, now)?;

    let emails = certificate_emails(&signer);
    if !emails.contains(&from) {
        let listed = if emails.is_empty() { "none".to_string() } else { emails.join(", ") };
        return Err(fail(format!("the From address {from} is not the signer certificate's e-mail address ({listed})")));
    }

    let idap = extract::idap_document(&content).map_err(perm)?;
    Ok(Verified {
        from,
        idap,
        message_id: message.message_id().map(str::to_string),
        reply_to: message.reply_to().and_then(|a| a.first()).and_then(|a| a.address()).map(str::to_string),
        subject: message.subject().map(str::to_string),
    })
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

/// Whether the whole body is S/MIME signed, and how; otherwise why not.
fn signed_shape(message: &mail_parser::Message<'_>) -> Result<Shape, Verdict> {
    let root = message.root_part();
    let (ctype, subtype) = media_type(root);
    match (ctype.as_str(), subtype.as_str()) {
        ("multipart", "signed") => {
            let protocol = root
                .content_type()
                .and_then(|ct| ct.attribute("protocol"))
                .map(str::to_ascii_lowercase)
                .unwrap_or_default();
            if protocol == "application/pkcs7-signature" || protocol == "application/x-pkcs7-signature" {
                Ok(Shape::Detached)
            } else {
                Err(fail(format!("not signed with S/MIME: multipart/signed with protocol \"{protocol}\"")))
            }
        }
        ("application", "pkcs7-mime" | "x-pkcs7-mime") => {
            let smime_type = root.content_type().and_then(|ct| ct.attribute("smime-type")).map(str::to_ascii_lowercase);
            match smime_type.as_deref() {
                None | Some("signed-data") => Ok(Shape::Opaque),
                Some(other) => Err(fail(format!("not signed: S/MIME {other}; only signed-data is accepted"))),
            }
        }
        _ => {
            let wrapped = message.parts.iter().skip(1).any(|part| {
                let (c, s) = media_type(part);
                c == "multipart" && s == "signed"
                    || c == "application" && matches!(s.as_str(), "pkcs7-mime" | "x-pkcs7-mime")
            });
            if wrapped {
                Err(fail(format!(
                    "the signature does not cover the whole message: a signed part inside {ctype}/{subtype} \
                     next to unsigned content"
                )))
            } else {
                Err(fail(format!("not signed: the message is {ctype}/{subtype}, not S/MIME signed")))
            }
        }
    }
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
