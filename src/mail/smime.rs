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
//! The IDAP document is taken only from the bytes the signature covers (as OpenSSL extracted
//! them), never from a second parse of the unsigned envelope.

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
            let parsed = if is_pem(bytes) { X509::stack_from_pem(bytes) } else { X509::from_der(bytes).map(|c| vec![c]) };
            let parsed = parsed.map_err(|e| format!("trusted CA #{}: not a certificate: {}", i + 1, first_error(&e)))?;
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
                        format!("CRL #{} (issuer {}) is not signed by a trusted CA", i + 1, name_string(crl.issuer_name()))
                    })?;
                let issuer_der = issuer.to_der().map_err(|e| format!("CRL #{}: {}", i + 1, first_error(&e)))?;
                trusted_crls.push(TrustedCrl { crl, issuer_der });
            }
        }
        Ok(TrustStore { cas: ca_certs, crls: trusted_crls })
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
        Some(Address::Group(_)) => return Err("the From header is a group; exactly one mailbox is required".to_string()),
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
    match verify_inner(raw, agent_certs, trust, now) {
        Ok(verified) => Verdict::Pass(verified),
        Err(verdict) => verdict,
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

    let (p7, detached) =
        Pkcs7::from_smime(raw).map_err(|e| perm(format!("unreadable S/MIME structure: {}", first_error(&e))))?;
    if p7.signed().is_none() {
        return Err(fail("not signed: the S/MIME content is not signed-data"));
    }
    match (shape, &detached) {
        (Shape::Detached, None) => return Err(perm("multipart/signed without a signed first part")),
        (Shape::Opaque, Some(_)) => return Err(perm("application/pkcs7-mime with detached content")),
        _ => {}
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
        let cert = X509::from_der(der)
            .map_err(|e| temp(format!("directory certificate #{} for {from} is unreadable: {}", i + 1, first_error(&e))))?;
        directory.push(cert).map_err(|e| temp(first_error(&e)))?;
    }
    let signers = p7.signers(&directory, Pkcs7Flags::NOINTERN).map_err(|_| {
        fail(format!("signed with a certificate that is not {from}'s certificate in the directory (forged or another agent)"))
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
    let chain = verify_chain(&store, &signer)?;
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
            let smime_type =
                root.content_type().and_then(|ct| ct.attribute("smime-type")).map(str::to_ascii_lowercase);
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
/// (leaf first) on success.
fn verify_chain(store: &X509Store, signer: &X509) -> Result<Vec<X509>, Verdict> {
    let empty = Stack::new().map_err(|e| temp(first_error(&e)))?;
    let mut context = X509StoreContext::new().map_err(|e| temp(first_error(&e)))?;
    let (ok, error, chain) = context
        .init(store, signer, &empty, |ctx| {
            let ok = ctx.verify_cert()?;
            let chain: Vec<X509> = ctx.chain().map(|c| c.iter().map(|x| x.to_owned()).collect()).unwrap_or_default();
            Ok((ok, ctx.error(), chain))
        })
        .map_err(|e| temp(format!("certificate verification failed to run: {}", first_error(&e))))?;
    if ok {
        Ok(chain)
    } else {
        Err(fail(format!("the signer certificate is not acceptable: {}", error.error_string())))
    }
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

/// Number of SignerInfos in a DER ContentInfo(SignedData).
fn signer_info_count(der: &[u8]) -> Result<usize, String> {
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
pub fn sign(idap: &[u8], cert_pem: &[u8], key_pem: &[u8], from: &str, to: &str, subject: &str) -> Result<Vec<u8>, String> {
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

    let inner = format!("Content-Type: text/xml\r\nContent-Transfer-Encoding: base64\r\n\r\n{}", base64_lines(idap, 76));
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
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(width)
        .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
        .collect();
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
    format!(
        "{weekday}, {day} {month_name} {year} {:02}:{:02}:{:02} +0000",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
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
