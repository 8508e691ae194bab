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

use super::extract;

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

/// The trusted CA certificates (roots and intermediates) and the CRLs checked against.
/// Not `Clone` (OpenSSL CRLs are not): share it behind an `Arc`.
pub struct TrustStore {
    cas: Vec<X509>,
    crls: Vec<TrustedCrl>,
    /// Chains already built, by SHA-256 of the signer's DER (see [`verify_chain`]).
    chains: std::sync::Mutex<std::collections::HashMap<[u8; 32], CachedChain>>,
}

/// A chain that verified, and the time window in which every certificate of it is valid:
/// inside it, OpenSSL's verdict for the same certificate and CAs cannot change (revocation
/// is checked separately, on every mail).
struct CachedChain {
    chain: Vec<X509>,
    from: i64,
    until: i64,
}

struct TrustedCrl {
    crl: X509Crl,
    /// DER of the trusted CA whose key signed this CRL.
    issuer_der: Vec<u8>,
}

impl std::fmt::Debug for TrustStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cas: Vec<String> = self.cas.iter().map(|ca| name_string(ca.subject_name())).collect();
        f.debug_struct("TrustStore").field("cas", &cas).field("crls", &self.crls.len()).finish()
    }
}

impl TrustStore {
    /// Reads CA certificate files (PEM, several per file allowed, or DER) and CRL files (PEM or DER).
    pub fn from_pem_files(cas: &[PathBuf], crls: &[PathBuf]) -> Result<Self, String> {
        let read = |path: &PathBuf| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
        let ca_bytes = cas.iter().map(read).collect::<Result<Vec<_>, _>>()?;
        let crl_bytes = crls.iter().map(read).collect::<Result<Vec<_>, _>>()?;
        let ca_refs: Vec<&[u8]> = ca_bytes.iter().map(Vec::as_slice).collect();
        let crl_refs: Vec<&[u8]> = crl_bytes.iter().map(Vec::as_slice).collect();
        Self::from_pem(&ca_refs, &crl_refs)
    }

    /// CA certificates and CRLs from memory. Every CRL must be signed by one of the CAs.
    pub fn from_pem(cas: &[&[u8]], crls: &[&[u8]]) -> Result<Self, String> {
        let mut ca_certs = Vec::new();
        for (i, bytes) in cas.iter().enumerate() {
            let parsed =
                if is_pem(bytes) { X509::stack_from_pem(bytes) } else { X509::from_der(bytes).map(|c| vec![c]) };
            let parsed =
                parsed.map_err(|e| format!("trusted CA #{}: not a certificate: {}", i + 1, first_error(&e)))?;
            if parsed.is_empty() {
                return Err(format!("trusted CA #{}: no certificate found", i + 1));
            }
            ca_certs.extend(parsed);
        }
        if ca_certs.is_empty() {
            return Err("no trusted CA certificate configured".to_string());
        }
        let mut trusted_crls = Vec::new();
        for (i, bytes) in crls.iter().enumerate() {
            for crl in parse_crls(bytes).map_err(|e| format!("CRL #{}: {e}", i + 1))? {
                let issuer = ca_certs
                    .iter()
                    .find(|ca| {
                        same_name(ca.subject_name(), crl.issuer_name())
                            && ca.public_key().and_then(|key| crl.verify(&key)).unwrap_or(false)
                    })
                    .ok_or_else(|| {
                        format!(
                            "CRL #{} (issuer {}) is not signed by a trusted CA",
                            i + 1,
                            name_string(crl.issuer_name())
                        )
                    })?;
                let issuer_der = issuer.to_der().map_err(|e| format!("CRL #{}: {}", i + 1, first_error(&e)))?;
                trusted_crls.push(TrustedCrl { crl, issuer_der });
            }
        }
        Ok(TrustStore { cas: ca_certs, crls: trusted_crls, chains: Default::default() })
    }

    /// An OpenSSL store for one verification: the CAs, the S/MIME signing purpose, time `now`.
    fn x509_store(&self, now: i64) -> Result<X509Store, openssl::error::ErrorStack> {
        let mut builder = X509StoreBuilder::new()?;
        for ca in &self.cas {
            builder.add_cert(ca.clone())?;
        }
        let mut param = X509VerifyParam::new()?;
        param.set_time(now);
        param.set_purpose(X509PurposeId::SMIME_SIGN)?;
        builder.set_param(&param)?;
        Ok(builder.build())
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

/// The DER of a `multipart/signed` mail's signature part, which must be
/// `application/(x-)pkcs7-signature`. Public for the fuzz targets.
pub fn signature_der(part: &[u8]) -> Result<Vec<u8>, Verdict> {
    let parsed = MessageParser::default().parse(part).ok_or_else(|| perm("unparsable signature part"))?;
    let root = parsed.root_part();
    match media_type(root) {
        (c, s) if c == "application" && matches!(s.as_str(), "pkcs7-signature" | "x-pkcs7-signature") => {
            Ok(base64_or_der(root.contents()))
        }
        (c, s) => Err(perm(format!("the second part of multipart/signed is {c}/{s}, not application/pkcs7-signature"))),
    }
}

/// A PKCS#7 body as mail_parser left it: already DER (decoded per its
/// Content-Transfer-Encoding), or base64 text without that header, which OpenSSL reads too.
fn base64_or_der(bytes: &[u8]) -> Vec<u8> {
    if bytes.first() == Some(&0x30) {
        return bytes.to_vec();
    }
    let text: Vec<u8> = bytes.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    lenient.decode(&text).unwrap_or_else(|_| bytes.to_vec())
}

/// A DER ContentInfo(SignedData) without its `certificates` and `crls` fields, or `None`
/// when it is not plain definite-length DER of that shape (BER from some signers): then the
/// caller parses it whole, with the same result, only slower. Removing them changes nothing
/// the signature covers (SignerInfos sign the content or their signed attributes) and
/// nothing verification uses: signers come from the directory (`NOINTERN`), the chain from
/// the trust store only, revocation from its CRLs. Public for the fuzz targets.
pub fn without_certificates(der: &[u8]) -> Option<Vec<u8>> {
    let (0x30, content_info, _) = der_tlv(der).ok()? else { return None };
    let (0x06, oid, rest) = der_tlv(content_info).ok()? else { return None };
    let (0xA0, explicit, after) = der_tlv(rest).ok()? else { return None };
    let (0x30, mut signed_data, _) = der_tlv(explicit).ok()? else { return None };
    if !after.is_empty() {
        return None;
    }
    let mut kept = Vec::with_capacity(signed_data.len());
    let mut dropped = false;
    while !signed_data.is_empty() {
        let (tag, _, rest) = der_tlv(signed_data).ok()?;
        let element = &signed_data[..signed_data.len() - rest.len()];
        if tag == 0xA0 || tag == 0xA1 {
            dropped = true;
        } else {
            kept.extend_from_slice(element);
        }
        signed_data = rest;
    }
    if !dropped {
        return None;
    }
    let signed_data = der_wrap(0x30, &kept);
    let explicit = der_wrap(0xA0, &signed_data);
    let mut body = der_wrap(0x06, oid);
    body.extend_from_slice(&explicit);
    Some(der_wrap(0x30, &body))
}

/// A DER TLV with a single-byte tag.
fn der_wrap(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
    out
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

/// Chain to a trusted CA at the store's time with the S/MIME signing purpose; the built chain
/// (leaf first) on success. A chain that verified is remembered with the window in which all
/// its certificates are valid, and reused for the same signer at a time inside it: building
/// and checking the chain (the CA's signature over the certificate) is a fifth of a
/// verification, and a sender's certificate is the same mail after mail.
fn verify_chain(trust: &TrustStore, store: &X509Store, signer: &X509, now: i64) -> Result<Vec<X509>, Verdict> {
    let key = signer.to_der().map(|der| openssl::sha::sha256(&der)).map_err(|e| temp(first_error(&e)))?;
    let cached = |chains: &std::collections::HashMap<[u8; 32], CachedChain>| {
        chains.get(&key).filter(|c| c.from <= now && now <= c.until).map(|c| c.chain.clone())
    };
    if let Some(chain) = cached(&trust.chains.lock().unwrap_or_else(|p| p.into_inner())) {
        return Ok(chain);
    }
    let empty = Stack::new().map_err(|e| temp(first_error(&e)))?;
    let mut context = X509StoreContext::new().map_err(|e| temp(first_error(&e)))?;
    let (ok, error, chain) = context
        .init(store, signer, &empty, |ctx| {
            let ok = ctx.verify_cert()?;
            let chain: Vec<X509> = ctx.chain().map(|c| c.iter().map(|x| x.to_owned()).collect()).unwrap_or_default();
            Ok((ok, ctx.error(), chain))
        })
        .map_err(|e| temp(format!("certificate verification failed to run: {}", first_error(&e))))?;
    if !ok {
        return Err(fail(format!("the signer certificate is not acceptable: {}", error.error_string())));
    }
    let from =
        chain.iter().map(|c| asn1_unix(c.not_before())).collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().max());
    let until =
        chain.iter().map(|c| asn1_unix(c.not_after())).collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().min());
    if let (Some(from), Some(until)) = (from, until) {
        let mut chains = trust.chains.lock().unwrap_or_else(|p| p.into_inner());
        if chains.len() >= 4096 {
            chains.clear();
        }
        chains.insert(key, CachedChain { chain: chain.clone(), from, until });
    }
    Ok(chain)
}

/// An ASN.1 time as unix seconds.
fn asn1_unix(t: &openssl::asn1::Asn1TimeRef) -> Option<i64> {
    let diff = Asn1Time::from_unix(0).ok()?.diff(t).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

fn check_revocation(trust: &TrustStore, signer: &X509, chain: &[X509], now: i64) -> Result<(), Verdict> {
    let Some(issuer) = chain.get(1) else { return Ok(()) };
    let issuer_der = issuer.to_der().map_err(|e| temp(first_error(&e)))?;
    let crls: Vec<&X509Crl> = trust.crls.iter().filter(|c| c.issuer_der == issuer_der).map(|c| &c.crl).collect();
    if crls.is_empty() {
        return Ok(());
    }
    let now_asn1 = Asn1Time::from_unix(now).map_err(|e| temp(first_error(&e)))?;
    let current: Vec<&&X509Crl> = crls
        .iter()
        .filter(|crl| {
            let started = crl.last_update().compare(&now_asn1).is_ok_and(|o| o.is_le());
            let fresh = crl.next_update().is_none_or(|next| next.compare(&now_asn1).is_ok_and(|o| o.is_ge()));
            started && fresh
        })
        .collect();
    if current.is_empty() {
        return Err(temp(format!(
            "revocation status unknown: no CRL of {} is current at arrival time",
            name_string(issuer.subject_name())
        )));
    }
    for crl in current {
        if let CrlStatus::Revoked(_) = crl.get_by_cert(signer) {
            let serial = signer
                .serial_number()
                .to_bn()
                .and_then(|bn| bn.to_hex_str().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(fail(format!("the signer certificate (serial {serial}) is revoked")));
        }
    }
    Ok(())
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

/// Number of SignerInfos in a DER ContentInfo(SignedData). Public for the fuzz targets.
pub fn signer_info_count(der: &[u8]) -> Result<usize, String> {
    let (tag, content_info, _) = der_tlv(der)?;
    if tag != 0x30 {
        return Err("ContentInfo is not a SEQUENCE".to_string());
    }
    let (tag, _oid, rest) = der_tlv(content_info)?;
    if tag != 0x06 {
        return Err("ContentInfo has no content type".to_string());
    }
    let (tag, explicit, _) = der_tlv(rest)?;
    if tag != 0xA0 {
        return Err("ContentInfo has no content".to_string());
    }
    let (tag, mut signed_data, _) = der_tlv(explicit)?;
    if tag != 0x30 {
        return Err("SignedData is not a SEQUENCE".to_string());
    }
    let mut last = None;
    while !signed_data.is_empty() {
        let (tag, value, rest) = der_tlv(signed_data)?;
        last = Some((tag, value));
        signed_data = rest;
    }
    let Some((0x31, mut signer_infos)) = last else { return Err("SignedData has no signerInfos".to_string()) };
    let mut count = 0;
    while !signer_infos.is_empty() {
        let (_, _, rest) = der_tlv(signer_infos)?;
        signer_infos = rest;
        count += 1;
    }
    Ok(count)
}

/// One DER TLV with a single-byte tag: (tag, value, rest).
fn der_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let truncated = || "truncated DER".to_string();
    let (&tag, rest) = input.split_first().ok_or_else(truncated)?;
    if tag & 0x1F == 0x1F {
        return Err("multi-byte DER tag".to_string());
    }
    let (&first, rest) = rest.split_first().ok_or_else(truncated)?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 {
            return Err("unsupported DER length".to_string());
        }
        let bytes = rest.get(..n).ok_or_else(truncated)?;
        let len = bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, rest.get(n..).ok_or_else(truncated)?)
    };
    let value = rest.get(..len).ok_or_else(truncated)?;
    let rest = rest.get(len..).ok_or_else(truncated)?;
    Ok((tag, value, rest))
}

/// `aqgate mail sign`: a complete RFC 5322 message (From, To, Subject, Date, Message-ID, MIME-Version) whose body is an S/MIME multipart/signed (detached) wrapping a text/xml part with the IDAP document; CRLF line endings.
///
/// The Date header is the system time: this is the CLI edge. [`sign_at`] takes the time.
pub fn sign(
    idap: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    from: &str,
    to: &str,
    subject: &str,
) -> Result<Vec<u8>, String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    sign_at(idap, cert_pem, key_pem, from, to, subject, i64::try_from(now).unwrap_or(i64::MAX))
}

/// [`sign`] with the Date header at `now` (unix seconds). Refuses a `from` that is not one of
/// the certificate's e-mail addresses: the gateway would refuse that mail. The IDAP part is
/// base64-encoded so that no mail relay can alter the signed bytes.
pub fn sign_at(
    idap: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    from: &str,
    to: &str,
    subject: &str,
    now: i64,
) -> Result<Vec<u8>, String> {
    if idap.iter().all(u8::is_ascii_whitespace) {
        return Err("the IDAP document is empty".to_string());
    }
    if !is_bare_address(from) {
        return Err(format!("from: {from:?} is not a bare e-mail address (local@domain)"));
    }
    if to.trim().is_empty() || to.chars().any(char::is_control) {
        return Err("to: must be a non-empty header value without control characters".to_string());
    }
    if subject.chars().any(char::is_control) {
        return Err("subject: must not contain control characters".to_string());
    }
    let cert = X509::from_pem(cert_pem).map_err(|e| format!("certificate: {}", first_error(&e)))?;
    let key = PKey::private_key_from_pem(key_pem).map_err(|e| format!("private key: {}", first_error(&e)))?;
    let emails = certificate_emails(&cert);
    if !emails.contains(&from.to_ascii_lowercase()) {
        return Err(format!("from: {from} is not the certificate's e-mail address ({})", emails.join(", ")));
    }

    let inner =
        format!("Content-Type: text/xml\r\nContent-Transfer-Encoding: base64\r\n\r\n{}", base64_lines(idap, 76));
    let no_extra_certs = Stack::new().map_err(|e| first_error(&e))?;
    let p7 = Pkcs7::sign(&cert, &key, &no_extra_certs, inner.as_bytes(), Pkcs7Flags::DETACHED | Pkcs7Flags::BINARY)
        .map_err(|e| format!("signing failed: {}", first_error(&e)))?;
    let signature = p7.to_der().map_err(|e| format!("signing failed: {}", first_error(&e)))?;

    let boundary = format!("----=_aqgate_{}", random_hex(12)?);
    let domain = from.rsplit_once('@').map(|(_, d)| d).unwrap_or("localhost");
    let message_id = format!("<{}@{domain}>", random_hex(16)?);
    let mut out = String::new();
    out.push_str(&format!("From: {from}\r\nTo: {to}\r\nSubject: {}\r\n", encode_subject(subject)));
    out.push_str(&format!("Date: {}\r\nMessage-ID: {message_id}\r\nMIME-Version: 1.0\r\n", rfc5322_date(now)));
    out.push_str("Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; micalg=sha-256;\r\n");
    out.push_str(&format!(" boundary=\"{boundary}\"\r\n\r\nThis is an S/MIME signed message.\r\n\r\n"));
    out.push_str(&format!("--{boundary}\r\n{inner}\r\n--{boundary}\r\n"));
    out.push_str("Content-Type: application/pkcs7-signature; name=\"smime.p7s\"\r\n");
    out.push_str("Content-Transfer-Encoding: base64\r\n");
    out.push_str("Content-Disposition: attachment; filename=\"smime.p7s\"\r\n\r\n");
    out.push_str(&base64_lines(&signature, 64));
    out.push_str(&format!("\r\n--{boundary}--\r\n"));
    Ok(out.into_bytes())
}

/// Base64 in lines of `width` characters joined by CRLF (no trailing CRLF).
fn base64_lines(bytes: &[u8], width: usize) -> String {
    let encoded = BASE64.encode(bytes);
    let lines: Vec<&str> =
        encoded.as_bytes().chunks(width).map(|chunk| std::str::from_utf8(chunk).unwrap_or_default()).collect();
    lines.join("\r\n")
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    openssl::rand::rand_bytes(&mut buf).map_err(|e| first_error(&e))?;
    Ok(hex::encode(buf))
}

/// Plain ASCII as is; anything else as RFC 2047 UTF-8 encoded words, folded.
fn encode_subject(subject: &str) -> String {
    if subject.bytes().all(|b| (0x20..0x7F).contains(&b)) && !subject.contains("=?") {
        return subject.to_string();
    }
    let mut words = Vec::new();
    let mut chunk = String::new();
    for c in subject.chars() {
        if chunk.len() + c.len_utf8() > 45 {
            words.push(format!("=?UTF-8?B?{}?=", BASE64.encode(chunk.as_bytes())));
            chunk.clear();
        }
        chunk.push(c);
    }
    if !chunk.is_empty() {
        words.push(format!("=?UTF-8?B?{}?=", BASE64.encode(chunk.as_bytes())));
    }
    words.join("\r\n ")
}

/// `Mon, 30 Nov 2026 06:00:00 +0000`.
fn rfc5322_date(now: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let days = now.div_euclid(86_400);
    let secs = now.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = DAYS.get(usize::try_from(days.rem_euclid(7)).unwrap_or(0)).copied().unwrap_or("Thu");
    let month_name = MONTHS.get(usize::try_from(month - 1).unwrap_or(0)).copied().unwrap_or("Jan");
    format!("{weekday}, {day} {month_name} {year} {:02}:{:02}:{:02} +0000", secs / 3600, (secs % 3600) / 60, secs % 60)
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

fn is_pem(bytes: &[u8]) -> bool {
    bytes.windows(11).any(|w| w == b"-----BEGIN ")
}

fn parse_crls(bytes: &[u8]) -> Result<Vec<X509Crl>, String> {
    if !is_pem(bytes) {
        return X509Crl::from_der(bytes).map(|c| vec![c]).map_err(|e| format!("not a CRL: {}", first_error(&e)));
    }
    const BEGIN: &[u8] = b"-----BEGIN X509 CRL-----";
    let mut crls = Vec::new();
    let mut rest = bytes;
    while let Some(start) = rest.windows(BEGIN.len()).position(|w| w == BEGIN) {
        let block = rest.get(start..).unwrap_or_default();
        let next = block.get(1..).and_then(|b| b.windows(BEGIN.len()).position(|w| w == BEGIN)).map(|p| p + 1);
        let this = next.and_then(|n| block.get(..n)).unwrap_or(block);
        crls.push(X509Crl::from_pem(this).map_err(|e| format!("not a CRL: {}", first_error(&e)))?);
        rest = next.and_then(|n| block.get(n..)).unwrap_or_default();
    }
    if crls.is_empty() {
        return Err("no X509 CRL block found".to_string());
    }
    Ok(crls)
}

fn same_name(a: &X509NameRef, b: &X509NameRef) -> bool {
    matches!((a.to_der(), b.to_der()), (Ok(a), Ok(b)) if a == b)
}

fn name_string(name: &X509NameRef) -> String {
    let parts: Vec<String> = name
        .entries()
        .map(|entry| {
            let key = entry.object().nid().short_name().unwrap_or("?");
            let value = entry.data().to_string().unwrap_or_default();
            format!("{key}={value}")
        })
        .collect();
    parts.join(", ")
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};

    const CA_PEM: &[u8] = include_bytes!("../../../certs/ca.pem");
    const CA_CRL: &[u8] = include_bytes!("../../../certs/ca.crl");
    const CA_KEY: &[u8] = include_bytes!("../../../certs/ca.key.pem");
    const OTHER_CA_PEM: &[u8] = include_bytes!("../../../certs/other-ca.pem");
    const OTHER_CA_KEY: &[u8] = include_bytes!("../../../certs/other-ca.key.pem");
    const SCOTT_PEM: &[u8] = include_bytes!("../../../certs/scott.pem");
    const SCOTT_KEY: &[u8] = include_bytes!("../../../certs/scott.key.pem");
    const SCOTT_DER: &[u8] = include_bytes!("../../../certs/scott.der");
    const JOHN_PEM: &[u8] = include_bytes!("../../../certs/john.pem");
    const JOHN_KEY: &[u8] = include_bytes!("../../../certs/john.key.pem");
    const JOHN_DER: &[u8] = include_bytes!("../../../certs/john.der");
    const EXPIRED_PEM: &[u8] = include_bytes!("../../../certs/expired.pem");
    const EXPIRED_KEY: &[u8] = include_bytes!("../../../certs/expired.key.pem");
    const EXPIRED_DER: &[u8] = include_bytes!("../../../certs/expired.der");
    const WRONG_EKU_PEM: &[u8] = include_bytes!("../../../certs/wrong-eku.pem");
    const WRONG_EKU_KEY: &[u8] = include_bytes!("../../../certs/wrong-eku.key.pem");
    const WRONG_EKU_DER: &[u8] = include_bytes!("../../../certs/wrong-eku.der");
    const REVOKED_PEM: &[u8] = include_bytes!("../../../certs/revoked.pem");
    const REVOKED_KEY: &[u8] = include_bytes!("../../../certs/revoked.key.pem");
    const REVOKED_DER: &[u8] = include_bytes!("../../../certs/revoked.der");
    const OTHER_SCOTT_PEM: &[u8] = include_bytes!("../../../certs/other-ca-scott.pem");
    const OTHER_SCOTT_KEY: &[u8] = include_bytes!("../../../certs/other-ca-scott.key.pem");
    const OTHER_SCOTT_DER: &[u8] = include_bytes!("../../../certs/other-ca-scott.der");
    const GATEWAY_TLS_PEM: &[u8] = include_bytes!("../../../certs/gateway-tls.pem");

    const IDAP: &str = "<?xml version=\"1.0\"?>\r\n<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\">\r\n\
                        <Body><AQXmlSend xmlns=\"http://ns.oracle.com/AQ/schemas/access\"><queue_name>scott_queue\
                        </queue_name></AQXmlSend></Body></Envelope>";
    const HEADERS: &str = "From: Scott <scott@example.com>\nTo: aq@example.com\nSubject: IDAP request\n\
                           Message-ID: <req-1@example.com>\nReply-To: replies@example.com\n";

    /// Inside every test certificate's validity and after the CRL's lastUpdate, derived from the
    /// files so that regenerating them keeps the tests valid.
    fn now() -> i64 {
        let crl = X509Crl::from_pem(CA_CRL).unwrap();
        let mut latest = unix(crl.last_update());
        for pem in [SCOTT_PEM, JOHN_PEM, WRONG_EKU_PEM, REVOKED_PEM, OTHER_SCOTT_PEM] {
            latest = latest.max(unix(X509::from_pem(pem).unwrap().not_before()));
        }
        latest + 3600
    }

    fn unix(time: &openssl::asn1::Asn1TimeRef) -> i64 {
        asn1_unix(time).unwrap()
    }

    fn trust() -> TrustStore {
        TrustStore::from_pem(&[CA_PEM], &[CA_CRL]).unwrap()
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::SeqCst);
            let dir = std::env::temp_dir().join(format!("aqgate-smime-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run(program: &str, args: &[&Path], what: &str, env: &[(&str, &Path)]) -> Vec<u8> {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let mut command = Command::new(program);
        command.args(&args).stdin(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let output = command.output().unwrap_or_else(|e| panic!("{what}: cannot run {program}: {e}"));
        assert!(output.status.success(), "{what}: {program} failed: {}", String::from_utf8_lossy(&output.stderr));
        output.stdout
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn entity() -> Vec<u8> {
        format!("Content-Type: text/xml; charset=utf-8\r\n\r\n{IDAP}").into_bytes()
    }

    /// `openssl <tool> -sign` of `entity` by `signer`; `extra` are further arguments.
    fn openssl_sign(tool: &str, signers: &[(&[u8], &[u8])], entity: &[u8], extra: &[&str]) -> Vec<u8> {
        let dir = TempDir::new();
        let input = dir.file("in.eml", entity);
        let mut args: Vec<PathBuf> = vec![tool.into(), "-sign".into(), "-in".into(), input];
        for (i, (cert, key)) in signers.iter().enumerate() {
            args.push("-signer".into());
            args.push(dir.file(&format!("signer{i}.pem"), cert));
            args.push("-inkey".into());
            args.push(dir.file(&format!("signer{i}.key.pem"), key));
        }
        args.extend(extra.iter().map(PathBuf::from));
        let args: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
        run("openssl", &args, "openssl sign", &[])
    }

    fn mail(headers: &str, smime: &[u8]) -> Vec<u8> {
        let mut out = headers.as_bytes().to_vec();
        out.extend_from_slice(smime);
        out
    }

    fn scott_detached() -> Vec<u8> {
        mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]))
    }

    fn verify_as(raw: &[u8], cert: &[u8]) -> Verdict {
        verify(raw, &[cert.to_vec()], &trust(), now())
    }

    fn assert_pass(verdict: Verdict) -> Verified {
        match verdict {
            Verdict::Pass(verified) => {
                assert_eq!(verified.from, "scott@example.com");
                assert_eq!(String::from_utf8_lossy(&verified.idap).trim_end(), IDAP);
                verified
            }
            other => panic!("expected Pass, got {other:?}"),
        }
    }

    fn assert_fail(verdict: Verdict, needle: &str) {
        match verdict {
            Verdict::Fail(reason) => assert!(reason.contains(needle), "reason {reason:?} lacks {needle:?}"),
            other => panic!("expected Fail containing {needle:?}, got {other:?}"),
        }
    }

    /// gpgsm (GnuPG's S/MIME) with a throwaway home: scott's key imported, the test CA trusted.
    /// Returns base64 (no PEM armour) of the signature of `entity`.
    /// gpgsm now and then (a freshly started agent, ~1 run in 20 in parallel tests) loses the
    /// imported key or certificate ("No secret key", "No public key"): the whole import and
    /// signing is tried again in a fresh home, up to three times.
    fn gpgsm_sign(entity: &[u8], detached: bool) -> String {
        let mut last = String::new();
        for _ in 0..3 {
            match gpgsm_sign_once(entity, detached) {
                Ok(signature) => return signature,
                Err(why) => last = why,
            }
        }
        panic!("gpgsm sign failed three times: {last}");
    }

    fn gpgsm_sign_once(entity: &[u8], detached: bool) -> Result<String, String> {
        let dir = TempDir::new();
        let home = dir.0.join("gnupg");
        std::fs::create_dir_all(&home).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        std::fs::write(home.join("gpg-agent.conf"), "allow-loopback-pinentry\n").unwrap();
        let fingerprint = X509::from_pem(CA_PEM).unwrap().digest(openssl::hash::MessageDigest::sha1()).unwrap();
        let fingerprint: Vec<String> = fingerprint.iter().map(|b| format!("{b:02X}")).collect();
        std::fs::write(home.join("trustlist.txt"), format!("{} S relax\n", fingerprint.join(":"))).unwrap();
        let cert = dir.file("scott.pem", SCOTT_PEM);
        let key = dir.file("scott.key.pem", SCOTT_KEY);
        let p12 = dir.0.join("scott.p12");
        // gpgsm 2.2 reads only the classic PKCS#12 encryption; empty password, no prompt.
        run(
            "openssl",
            &[
                p("pkcs12"),
                p("-export"),
                p("-in"),
                &cert,
                p("-inkey"),
                &key,
                p("-out"),
                &p12,
                p("-passout"),
                p("pass:"),
                p("-certpbe"),
                p("PBE-SHA1-3DES"),
                p("-keypbe"),
                p("PBE-SHA1-3DES"),
                p("-macalg"),
                p("sha1"),
            ],
            "pkcs12 export",
            &[],
        );
        let env = [("GNUPGHOME", home.as_path())];
        let ca = dir.file("ca.pem", CA_PEM);
        run("gpgsm", &[p("--batch"), p("--import"), &ca], "gpgsm import CA", &env);
        // gpgsm exits 2 after a successful PKCS#12 import (it ignores the agent's passphrase
        // inquiries), and now and then (a freshly started agent, ~1 run in 20) the secret
        // key does not arrive: import until gpgsm lists it.
        for _ in 0..5 {
            let _ = Command::new("gpgsm")
                .args([p("--batch"), p("--pinentry-mode"), p("loopback"), p("--import"), &p12])
                .env("GNUPGHOME", &home)
                .stdin(Stdio::null())
                .output()
                .expect("gpgsm must be installed (GnuPG's S/MIME implementation)");
            let secret = run("gpgsm", &[p("--batch"), p("--with-colons"), p("--list-secret-keys")], "gpgsm list", &env);
            if String::from_utf8_lossy(&secret).lines().any(|l| l.starts_with("crs:")) {
                break;
            }
        }
        let input = dir.file("in.eml", entity);
        let out = dir.0.join("sig.b64");
        let mode = if detached { "--detach-sign" } else { "--sign" };
        let signed = Command::new("gpgsm")
            .args([
                p("--batch"),
                p("--pinentry-mode"),
                p("loopback"),
                p("--disable-crl-checks"),
                p("--disable-policy-checks"),
                p("--local-user"),
                p("scott@example.com"),
                p("--base64"),
                p("--output"),
                &out,
                p(mode),
                &input,
            ])
            .env("GNUPGHOME", &home)
            .stdin(Stdio::null())
            .output()
            .expect("gpgsm must be installed (GnuPG's S/MIME implementation)");
        let _ = Command::new("gpgconf").args(["--kill", "gpg-agent"]).env("GNUPGHOME", &home).output();
        if !signed.status.success() {
            return Err(String::from_utf8_lossy(&signed.stderr).into_owned());
        }
        Ok(String::from_utf8(std::fs::read(&out).unwrap()).unwrap())
    }

    // ---- passing mail -------------------------------------------------------------------------

    #[test]
    fn openssl_detached_passes_with_headers() {
        let verified = assert_pass(verify_as(&scott_detached(), SCOTT_DER));
        assert_eq!(verified.message_id.as_deref(), Some("req-1@example.com"));
        assert_eq!(verified.reply_to.as_deref(), Some("replies@example.com"));
        assert_eq!(verified.subject.as_deref(), Some("IDAP request"));
    }

    #[test]
    fn openssl_detached_without_embedded_certificate_passes() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nocerts"]));
        assert_pass(verify_as(&raw, SCOTT_DER));
    }

    #[test]
    fn openssl_opaque_passes() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
        assert!(String::from_utf8_lossy(&raw).contains("application/x-pkcs7-mime"));
        assert_pass(verify_as(&raw, SCOTT_DER));
    }

    #[test]
    fn crlf_mail_passes() {
        let raw = String::from_utf8(scott_detached()).unwrap().replace("\r\n", "\n").replace('\n', "\r\n");
        assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
    }

    #[test]
    fn gpgsm_opaque_passes() {
        let signature = gpgsm_sign(&entity(), false);
        let raw = format!(
            "{HEADERS}MIME-Version: 1.0\nContent-Type: application/pkcs7-mime; smime-type=signed-data; \
             name=\"smime.p7m\"\nContent-Transfer-Encoding: base64\nContent-Disposition: attachment; \
             filename=\"smime.p7m\"\n\n{signature}"
        );
        assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
    }

    #[test]
    fn gpgsm_detached_passes() {
        let signature = gpgsm_sign(&entity(), true);
        let raw = format!(
            "{HEADERS}MIME-Version: 1.0\r\nContent-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; \
             micalg=sha-256; boundary=\"gpgsm-b\"\r\n\r\n--gpgsm-b\r\n{}\r\n--gpgsm-b\r\nContent-Type: \
             application/pkcs7-signature\r\nContent-Transfer-Encoding: base64\r\n\r\n{signature}\r\n--gpgsm-b--\r\n",
            String::from_utf8(entity()).unwrap()
        );
        assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
    }

    #[test]
    fn split_signed_canonicalises_like_openssl() {
        let body = b"preamble\n--b\nContent-Type: text/plain\n\nline 1\r\nline 2\r\r\n\n--bb not ours\n--b  \r\nsig\n--b--\r\nepilogue";
        let (content, signature) = split_signed(body, "b").unwrap();
        assert_eq!(content, b"Content-Type: text/plain\r\n\r\nline 1\r\nline 2\r\n\r\n--bb not ours");
        assert_eq!(signature, b"sig\n");
        // Without a close delimiter the second part runs to the end.
        assert_eq!(split_signed(b"--b\na\n--b\nsig", "b").unwrap(), (b"a".to_vec(), &b"sig"[..]));
        for (body, parts) in
            [(&b"--b\na\n--b--\n"[..], 1), (b"--b\na\n--b\nb\n--b\nc\n--b--\n", 3), (b"no delimiter", 0)]
        {
            let Err(Verdict::PermError(why)) = split_signed(body, "b") else { panic!("{body:?} split") };
            assert!(why.contains(&format!("has {parts} parts")), "{why}");
        }
    }

    #[test]
    fn embedded_certificates_are_dropped_before_parsing() {
        let raw = scott_detached();
        let message = MessageParser::default().parse(&raw).unwrap();
        let root = message.root_part();
        let body = &raw[root.raw_body_offset() as usize..];
        let (content, part) = split_signed(body, root.content_type().unwrap().attribute("boundary").unwrap()).unwrap();
        let der = signature_der(part).unwrap();
        let with = Pkcs7::from_der(&der).unwrap();
        assert!(with.signed().unwrap().certificates().is_some_and(|c| c.len() == 1));
        let stripped = without_certificates(&der).expect("openssl's DER is stripped");
        assert!(stripped.len() < der.len() - 500, "{} vs {}", stripped.len(), der.len());
        let without = Pkcs7::from_der(&stripped).unwrap();
        assert!(without.signed().unwrap().certificates().is_none());
        assert_eq!(signer_info_count(&without.to_der().unwrap()), Ok(1));
        // What remains still verifies against the directory certificate alone.
        let mut certs = Stack::new().unwrap();
        certs.push(X509::from_der(SCOTT_DER).unwrap()).unwrap();
        let store = trust().x509_store(now()).unwrap();
        let flags = Pkcs7Flags::NOINTERN | Pkcs7Flags::NOVERIFY;
        without.verify(&certs, &store, Some(&content), None, flags).unwrap();
        let mut altered = content.clone();
        altered[40] ^= 1;
        assert!(without.verify(&certs, &store, Some(&altered), None, flags).is_err());
        // Already without certificates, not DER, or something else: left to OpenSSL whole.
        assert_eq!(without_certificates(&stripped), None);
        assert_eq!(without_certificates(&[0x30, 0x80, 0x06, 0x00, 0x00, 0x00]), None);
        assert_eq!(without_certificates(b"garbage"), None);
    }

    #[test]
    fn opaque_without_transfer_encoding_header_passes() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
        let text = String::from_utf8(raw).unwrap();
        let without: String =
            text.lines().filter(|l| !l.starts_with("Content-Transfer-Encoding")).map(|l| format!("{l}\n")).collect();
        assert_ne!(without, text);
        assert_pass(verify_as(without.as_bytes(), SCOTT_DER));
    }

    #[test]
    fn second_part_must_be_a_pkcs7_signature() {
        let text = String::from_utf8(scott_detached()).unwrap();
        let raw = text.replacen("Content-Type: application/x-pkcs7-signature", "Content-Type: text/plain", 1);
        assert_ne!(raw, text);
        match verify_as(raw.as_bytes(), SCOTT_DER) {
            Verdict::PermError(why) => assert!(why.contains("text/plain, not application/pkcs7-signature"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_remembered_chain_still_expires() {
        let trust = trust();
        let scott = X509::from_pem(SCOTT_PEM).unwrap();
        let (not_before, not_after) = (unix(scott.not_before()), unix(scott.not_after()));
        let raw = scott_detached();
        let at = |t: i64| verify(&raw, &[SCOTT_DER.to_vec()], &trust, t);
        assert_pass(at(now()));
        assert_eq!(trust.chains.lock().unwrap().len(), 1, "the chain is remembered");
        assert_pass(at(now() + 60));
        assert_fail(at(not_after + 1), "expired");
        assert_fail(at(not_before - 1), "not yet valid");
        assert_pass(at(now()));
    }

    #[test]
    fn own_sign_output_passes_here_and_in_openssl_cli() {
        let raw = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "Grüße").unwrap();
        let text = String::from_utf8(raw.clone()).unwrap();
        assert!(text.replace("\r\n", "").find('\n').is_none(), "CRLF line endings only");
        for header in ["From: ", "To: ", "Subject: ", "Date: ", "Message-ID: <", "MIME-Version: 1.0"] {
            assert!(text.contains(&format!("\r\n{header}")) || text.starts_with(header), "{header} missing");
        }
        let verified = assert_pass(verify_as(&raw, SCOTT_DER));
        assert_eq!(verified.idap, IDAP.as_bytes());
        assert_eq!(verified.subject.as_deref(), Some("Grüße"));
        // A second implementation agrees.
        let dir = TempDir::new();
        let mail = dir.file("signed.eml", &raw);
        let ca = dir.file("ca.pem", CA_PEM);
        let content = run(
            "openssl",
            &[p("smime"), p("-verify"), p("-in"), &mail, p("-CAfile"), &ca, p("-purpose"), p("smimesign")],
            "openssl smime -verify of sign() output",
            &[],
        );
        assert!(String::from_utf8_lossy(&content).contains("Content-Type: text/xml"));
    }

    #[test]
    fn sign_refuses_a_from_that_is_not_the_certificates() {
        let err = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "john@example.com", "aq@example.com", "x").unwrap_err();
        assert!(err.contains("not the certificate's e-mail"), "{err}");
        assert!(sign(IDAP.as_bytes(), SCOTT_PEM, JOHN_KEY, "scott@example.com", "aq@example.com", "x").is_err());
        assert!(sign(b"", SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "x").is_err());
        assert!(sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "a\r\nBcc: x", "x").is_err());
    }

    #[test]
    fn idap_message_attachment_passes() {
        let entity = format!(
            "Content-Type: multipart/mixed; boundary=\"inner\"\r\n\r\n--inner\r\nContent-Type: text/plain\r\n\r\n\
             The request is attached.\r\n--inner\r\nContent-Type: application/octet-stream\r\n\
             Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"IDAP_MESSAGE.dat\"\r\n\r\n\
             {}\r\n--inner--\r\n",
            base64_lines(IDAP.as_bytes(), 76)
        );
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], entity.as_bytes(), &[]));
        let verified = assert_pass(verify_as(&raw, SCOTT_DER));
        assert_eq!(verified.idap, IDAP.as_bytes());
    }

    #[test]
    fn from_is_compared_case_insensitively_and_lower_cased() {
        let headers = HEADERS.replace("scott@example.com", "Scott@EXAMPLE.com");
        let raw = mail(&headers, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
        assert_pass(verify_as(&raw, SCOTT_DER));
    }

    #[test]
    fn passes_when_the_sender_has_several_directory_certificates() {
        let verdict = verify(&scott_detached(), &[JOHN_DER.to_vec(), SCOTT_DER.to_vec()], &trust(), now());
        assert_pass(verdict);
    }

    // ---- refused mail --------------------------------------------------------------------------

    #[test]
    fn tampered_detached_body_fails() {
        let raw = String::from_utf8(scott_detached()).unwrap().replace("scott_queue", "scott_queuf");
        assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "signature does not verify");
    }

    #[test]
    fn tampered_opaque_content_fails() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\n\n").unwrap();
        let mut der = BASE64.decode(body.replace(['\n', '\r'], "")).unwrap();
        let at = der.windows(11).position(|w| w == b"scott_queue").unwrap();
        der[at + 10] = b'f';
        let raw = format!("{head}\n\n{}\n", base64_lines(&der, 64));
        assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "signature does not verify");
    }

    #[test]
    fn unsigned_mail_fails() {
        let raw = format!("{HEADERS}MIME-Version: 1.0\nContent-Type: text/xml\n\n{IDAP}");
        assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "not signed");
        let raw = format!("{HEADERS}\n{IDAP}");
        assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "not signed");
    }

    #[test]
    fn encrypted_only_mail_fails() {
        let dir = TempDir::new();
        let input = dir.file("in.eml", &entity());
        let recipient = dir.file("scott.pem", SCOTT_PEM);
        let smime = run("openssl", &[p("smime"), p("-encrypt"), p("-in"), &input, &recipient], "encrypt", &[]);
        assert_fail(verify_as(&mail(HEADERS, &smime), SCOTT_DER), "not signed");
    }

    #[test]
    fn signed_by_another_agent_fails() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(JOHN_PEM, JOHN_KEY)], &entity(), &[]));
        assert_fail(verify_as(&raw, SCOTT_DER), "not scott@example.com's certificate in the directory");
    }

    #[test]
    fn from_mismatch_fails() {
        let headers = HEADERS.replace("scott@example.com", "john@example.com");
        let raw = mail(&headers, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
        assert_fail(verify_as(&raw, SCOTT_DER), "From address john@example.com is not the signer certificate's");
    }

    #[test]
    fn two_from_headers_fail() {
        let raw = mail("From: john@example.com\n", &scott_detached());
        assert_fail(verify_as(&raw, SCOTT_DER), "2 From headers");
        assert!(sender_address(&raw).is_err_and(|e| e.contains("2 From headers")));
        let obsolete = mail("FROM : john@example.com\n", &scott_detached());
        assert!(sender_address(&obsolete).is_err());
    }

    #[test]
    fn sender_address_rules() {
        assert_eq!(sender_address(&scott_detached()), Ok("scott@example.com".to_string()));
        assert!(sender_address(b"From: a@example.com, b@example.com\n\nx").is_err_and(|e| e.contains("2 addresses")));
        assert!(sender_address(b"To: a@example.com\n\nx").is_err_and(|e| e.contains("no From")));
        assert!(sender_address(b"From: undisclosed\n\nx").is_err());
        assert!(sender_address(b"From: group: a@example.com;\n\nx").is_err());
        // A From line in the body is not a header.
        assert!(sender_address(b"From: a@example.com\n\nFrom: b@example.com\n").is_ok());
    }

    #[test]
    fn expired_certificate_fails() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(EXPIRED_PEM, EXPIRED_KEY)], &entity(), &[]));
        assert_fail(verify_as(&raw, EXPIRED_DER), "certificate has expired");
    }

    #[test]
    fn validity_is_checked_at_the_injected_time() {
        let raw = scott_detached();
        // 2021-06-01: before scott's certificate was issued.
        assert_fail(verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 1_622_505_600), "not yet valid");
        // A minute after scott's certificate ends (no CRL, whose own validity would speak first).
        let after = unix(X509::from_pem(SCOTT_PEM).unwrap().not_after()) + 60;
        let no_crl = TrustStore::from_pem(&[CA_PEM], &[]).unwrap();
        assert_fail(verify(&raw, &[SCOTT_DER.to_vec()], &no_crl, after), "certificate has expired");
        assert_pass(verify(&raw, &[SCOTT_DER.to_vec()], &no_crl, now()));
    }

    #[test]
    fn revoked_certificate_fails() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(REVOKED_PEM, REVOKED_KEY)], &entity(), &[]));
        assert_fail(verify_as(&raw, REVOKED_DER), "is revoked");
    }

    #[test]
    fn stale_crl_is_a_temporary_error() {
        let ca = X509::from_pem(CA_PEM).unwrap();
        let ca_key = PKey::private_key_from_pem(CA_KEY).unwrap();
        let mut builder = openssl::x509::X509CrlBuilder::new().unwrap();
        builder.set_issuer_name(ca.subject_name()).unwrap();
        builder.set_last_update(&Asn1Time::from_unix(now() - 7200).unwrap()).unwrap();
        builder.set_next_update(&Asn1Time::from_unix(now() - 3600).unwrap()).unwrap();
        // authorityKeyIdentifier = SEQUENCE { [0] keyIdentifier } with the CA's key id.
        let key_id = ca.subject_key_id().unwrap().as_slice().to_vec();
        let mut aki = vec![0x30, u8::try_from(key_id.len() + 2).unwrap(), 0x80, u8::try_from(key_id.len()).unwrap()];
        aki.extend_from_slice(&key_id);
        let oid = openssl::asn1::Asn1Object::from_str("2.5.29.35").unwrap();
        let aki = openssl::asn1::Asn1OctetString::new_from_bytes(&aki).unwrap();
        builder.append_extension(openssl::x509::X509Extension::new_from_der(&oid, false, &aki).unwrap()).unwrap();
        let oid = openssl::asn1::Asn1Object::from_str("2.5.29.20").unwrap();
        let number = openssl::asn1::Asn1OctetString::new_from_bytes(&[0x02, 0x01, 0x01]).unwrap();
        builder.append_extension(openssl::x509::X509Extension::new_from_der(&oid, false, &number).unwrap()).unwrap();
        builder.sign(&ca_key, openssl::hash::MessageDigest::sha256()).unwrap();
        let stale = builder.build().unwrap().to_pem().unwrap();
        let trust = TrustStore::from_pem(&[CA_PEM], &[&stale]).unwrap();
        let verdict = verify(&scott_detached(), &[SCOTT_DER.to_vec()], &trust, now());
        assert!(
            matches!(&verdict, Verdict::TempError(reason) if reason.contains("revocation status unknown")),
            "{verdict:?}"
        );
    }

    #[test]
    fn wrong_eku_fails() {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(WRONG_EKU_PEM, WRONG_EKU_KEY)], &entity(), &[]));
        assert_fail(verify_as(&raw, WRONG_EKU_DER), "emailProtection");
    }

    #[test]
    fn untrusted_ca_fails_even_when_the_mail_carries_that_ca() {
        let dir = TempDir::new();
        let other_ca = dir.file("other-ca.pem", OTHER_CA_PEM);
        let other_ca = other_ca.to_str().unwrap();
        for extra in [&[][..], &["-certfile", other_ca][..]] {
            let raw = mail(HEADERS, &openssl_sign("smime", &[(OTHER_SCOTT_PEM, OTHER_SCOTT_KEY)], &entity(), extra));
            assert_fail(verify_as(&raw, OTHER_SCOTT_DER), "unable to get local issuer certificate");
        }
    }

    #[test]
    fn signed_part_wrapped_in_multipart_mixed_fails() {
        let signed = openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]);
        let raw = format!(
            "{HEADERS}MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"outer\"\n\n--outer\n\
             Content-Type: text/xml\n\n<evil/>\n--outer\n{}\n--outer--\n",
            String::from_utf8(signed).unwrap().replace("MIME-Version: 1.0\n", "")
        );
        assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "does not cover the whole message");
    }

    #[test]
    fn two_signers_fail() {
        let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY), (JOHN_PEM, JOHN_KEY)], &entity(), &[]));
        assert_fail(verify(&raw, &[SCOTT_DER.to_vec(), JOHN_DER.to_vec()], &trust(), now()), "2 signers");
    }

    #[test]
    fn directory_without_certificate_fails_and_unreadable_one_is_temporary() {
        assert_fail(verify(&scott_detached(), &[], &trust(), now()), "no certificate");
        assert!(matches!(
            verify(&scott_detached(), &[b"not DER".to_vec()], &trust(), now()),
            Verdict::TempError(reason) if reason.contains("unreadable")
        ));
    }

    #[test]
    fn no_idap_document_is_a_permanent_error() {
        let entity = b"Content-Type: text/plain\r\n\r\nhello";
        let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], entity, &[]));
        assert!(matches!(verify_as(&raw, SCOTT_DER), Verdict::PermError(reason) if reason.contains("no IDAP")));
    }

    #[test]
    fn garbage_signature_is_a_permanent_error() {
        let raw = format!(
            "{HEADERS}MIME-Version: 1.0\nContent-Type: application/pkcs7-mime; smime-type=signed-data\n\
             Content-Transfer-Encoding: base64\n\nAAAA\n"
        );
        assert!(matches!(verify_as(raw.as_bytes(), SCOTT_DER), Verdict::PermError(_)));
    }

    // ---- trust store and helpers --------------------------------------------------------------

    #[test]
    fn trust_store_rules() {
        assert!(TrustStore::from_pem(&[], &[]).is_err());
        assert!(TrustStore::from_pem(&[b"junk"], &[]).is_err());
        // The CRL must come from a trusted CA.
        assert!(
            TrustStore::from_pem(&[OTHER_CA_PEM], &[CA_CRL]).is_err_and(|e| e.contains("not signed by a trusted CA"))
        );
        assert!(TrustStore::from_pem(&[OTHER_CA_PEM, CA_PEM], &[CA_CRL]).is_ok());
        assert!(TrustStore::from_pem(&[include_bytes!("../../../certs/ca.der")], &[]).is_ok());
        assert!(TrustStore::from_pem_files(&[PathBuf::from("/nonexistent/ca.pem")], &[]).is_err());
        let dir = TempDir::new();
        let ca = dir.file("ca.pem", CA_PEM);
        let crl = dir.file("ca.crl", CA_CRL);
        assert!(TrustStore::from_pem_files(&[ca], &[crl]).is_ok());
        let _ = OTHER_CA_KEY;
    }

    #[test]
    fn trust_store_and_verdict_are_shareable_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TrustStore>();
        assert_send_sync::<Verdict>();
    }

    #[test]
    fn gateway_tls_certificate_is_for_localhost_server_auth() {
        let cert = X509::from_pem(GATEWAY_TLS_PEM).unwrap();
        assert!(cert.extended_key_usage().unwrap().contains(X509ExtendedKeyUsage::SSL_SERVER));
        let names: Vec<String> = cert
            .subject_alt_names()
            .unwrap()
            .iter()
            .filter_map(|n| n.dnsname().map(str::to_string).or_else(|| n.ipaddress().map(|ip| format!("{ip:?}"))))
            .collect();
        assert!(names.contains(&"localhost".to_string()), "{names:?}");
        assert!(names.contains(&"[127, 0, 0, 1]".to_string()), "{names:?}");
    }

    #[test]
    fn rfc5322_dates() {
        assert_eq!(rfc5322_date(0), "Thu, 1 Jan 1970 00:00:00 +0000");
        assert_eq!(rfc5322_date(1_798_761_600), "Fri, 1 Jan 2027 00:00:00 +0000");
        assert_eq!(rfc5322_date(951_827_696), "Tue, 29 Feb 2000 12:34:56 +0000");
    }

    #[test]
    fn signer_count_rejects_truncated_der() {
        assert!(signer_info_count(&[]).is_err());
        assert!(signer_info_count(&[0x30, 0x80, 0, 0]).is_err());
        assert!(signer_info_count(&[0x30, 0x05, 0x06]).is_err());
    }

    /// A mutation proptest once found: corrupted MIME headers made OpenSSL's S/MIME reader
    /// record an error whose data is not UTF-8, and the openssl crate panicked collecting it.
    /// The MIME layer is now ours (no single-byte mutation of a signed mail reaches that
    /// panic any more), and `verify` still contains one should another path reach it. Every
    /// mutation in the window that used to panic is a rejection.
    #[test]
    fn mutated_signature_headers_are_a_rejection_not_a_panic() {
        for at in 700..900 {
            let mut raw = sign_at(
                IDAP.as_bytes(),
                SCOTT_PEM,
                SCOTT_KEY,
                "scott@example.com",
                "aq@example.com",
                "x",
                1_780_000_000,
            )
            .unwrap();
            if let Some(b) = raw.get_mut(at) {
                *b = 128;
            }
            raw.truncate(3245);
            assert!(!matches!(verify(&raw, &[SCOTT_PEM.to_vec()], &trust(), 1_780_000_000), Verdict::Pass(_)));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn verify_never_panics_on_mutated_mail(at in 0usize..4000, byte in proptest::num::u8::ANY, cut in 0usize..4000) {
            let mut raw = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "x").unwrap();
            if let Some(b) = raw.get_mut(at) { *b = byte; }
            raw.truncate(cut.max(1));
            let _ = verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 1_800_000_000);
            let _ = sender_address(&raw);
        }

        #[test]
        fn verify_never_panics_on_garbage(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 0);
        }
    }
}
