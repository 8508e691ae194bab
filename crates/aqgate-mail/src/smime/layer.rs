//! One signed layer: how an entity is S/MIME (its shape), and the verification of its
//! SignedData through OpenSSL's CMS against the directory's certificates, with the
//! algorithm, certificate, revocation, address and signingTime checks.

use super::*;

/// How an entity is S/MIME.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// `multipart/signed`: the content, then a detached signature.
    Detached,
    /// `application/pkcs7-mime` signed-data: the content inside the signature.
    Opaque,
    /// `application/pkcs7-mime` enveloped-data or authEnveloped-data.
    Enveloped,
}

/// What signed content holds besides plain MIME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Nested {
    /// The whole content is another signed layer.
    Signed(Shape),
    /// The whole content is encrypted.
    Encrypted,
    /// A signed or encrypted part (described) somewhere inside, next to other parts.
    Inside(String),
    /// Nothing S/MIME.
    Plain,
}

/// Who may have signed, and against what: shared by every layer of one mail.
pub(super) struct Context<'a> {
    pub from: &'a str,
    /// The directory's certificates for the sender (and their DER).
    pub directory: &'a [(X509, Vec<u8>)],
    pub trust: &'a TrustStore,
    pub policy: &'a Policy<'a>,
    pub now: i64,
}

/// A layer that verified: the content the signature covers, and its signer.
pub(super) struct Layer {
    pub content: Vec<u8>,
    pub signer: X509,
}

/// Whether the whole body of the mail is S/MIME, and how; otherwise why not.
pub(super) fn top_shape(message: &mail_parser::Message<'_>) -> Result<Shape, Verdict> {
    let root = message.root_part();
    if let Some(shape) = smime_shape(root)? {
        return Ok(shape);
    }
    let (ctype, subtype) = media_type(root);
    let wrapped = message.parts.iter().skip(1).any(|part| is_smime_part(part).is_some());
    if wrapped {
        Err(fail(format!(
            "the signature does not cover the whole message: a signed part inside {ctype}/{subtype} next to \
             unsigned content"
        )))
    } else {
        Err(fail(format!("not signed: the message is {ctype}/{subtype}, not S/MIME signed")))
    }
}

/// What a verified layer's content holds.
pub(super) fn nested(message: &mail_parser::Message<'_>) -> Nested {
    match smime_shape(message.root_part()) {
        Ok(Some(Shape::Enveloped)) => return Nested::Encrypted,
        Ok(Some(shape)) => return Nested::Signed(shape),
        Ok(None) => {}
        // S/MIME at the top that is neither signed nor encrypted (certs-only, compressed,
        // another protocol): not a layer, and no IDAP document either.
        Err(_) => return Nested::Inside(describe(message.root_part())),
    }
    match message.parts.iter().skip(1).find_map(is_smime_part) {
        Some(what) => Nested::Inside(what),
        None => Nested::Plain,
    }
}

fn describe(part: &mail_parser::MessagePart<'_>) -> String {
    let (c, s) = media_type(part);
    format!("an S/MIME {c}/{s} part")
}

/// A description of `part` when it is signed or encrypted S/MIME (or another signed form).
fn is_smime_part(part: &mail_parser::MessagePart<'_>) -> Option<String> {
    let (c, s) = media_type(part);
    let certs_only = part
        .content_type()
        .and_then(|ct| ct.attribute("smime-type"))
        .is_some_and(|t| t.eq_ignore_ascii_case("certs-only"));
    let smime = c == "multipart" && s == "signed"
        || c == "application" && matches!(s.as_str(), "pkcs7-mime" | "x-pkcs7-mime") && !certs_only;
    smime.then(|| format!("a {c}/{s} part"))
}

/// The S/MIME shape of an entity's root part: `None` when it is not S/MIME at all, `Err` when
/// it is S/MIME but not a form accepted here.
fn smime_shape(root: &mail_parser::MessagePart<'_>) -> Result<Option<Shape>, Verdict> {
    let (ctype, subtype) = media_type(root);
    match (ctype.as_str(), subtype.as_str()) {
        ("multipart", "signed") => {
            let protocol = root
                .content_type()
                .and_then(|ct| ct.attribute("protocol"))
                .map(str::to_ascii_lowercase)
                .unwrap_or_default();
            if protocol == "application/pkcs7-signature" || protocol == "application/x-pkcs7-signature" {
                Ok(Some(Shape::Detached))
            } else {
                Err(fail(format!("not signed with S/MIME: multipart/signed with protocol \"{protocol}\"")))
            }
        }
        ("application", "pkcs7-mime" | "x-pkcs7-mime") => {
            let smime_type = root.content_type().and_then(|ct| ct.attribute("smime-type")).map(str::to_ascii_lowercase);
            let declared = match smime_type.as_deref() {
                None => None,
                Some("signed-data") => Some(Shape::Opaque),
                Some("enveloped-data" | "authenveloped-data") => Some(Shape::Enveloped),
                Some(other) => {
                    return Err(fail(format!(
                        "not signed: S/MIME {other}; only signed-data, or enveloped-data holding signed-data, is \
                         accepted"
                    )));
                }
            };
            // The content type the structure itself says: the parameter is only a hint.
            let der = base64_or_der(root.contents());
            let actual = match content_info_type(&der) {
                Some(oid::SIGNED_DATA) => Shape::Opaque,
                Some(oid::ENVELOPED_DATA | oid::AUTH_ENVELOPED_DATA) => Shape::Enveloped,
                Some(other) => {
                    return Err(fail(format!(
                        "not signed: the S/MIME structure is of content type {}, not signed-data",
                        oid_string(other)
                    )));
                }
                None => return Err(perm("unreadable S/MIME structure: not a CMS ContentInfo")),
            };
            match declared {
                Some(d) if d != actual => Err(perm(format!(
                    "the smime-type parameter says {}, but the structure is {}",
                    shape_name(d),
                    shape_name(actual)
                ))),
                _ => Ok(Some(actual)),
            }
        }
        _ => Ok(None),
    }
}

fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::Detached | Shape::Opaque => "signed-data",
        Shape::Enveloped => "enveloped-data",
    }
}

/// Verifies one signed layer (`entity`, parsed as `message`): its single SignerInfo names a
/// directory certificate, which signed the content, is acceptable now, and has the From
/// address; its signingTime (if any) is plausible.
pub(super) fn verify_layer(
    entity: &[u8],
    message: &mail_parser::Message<'_>,
    shape: Shape,
    cx: &Context<'_>,
) -> Result<Layer, Verdict> {
    let content_types = header_lines(entity).filter(|line| header_name_is(line, "content-type")).count();
    if content_types > 1 {
        return Err(perm(format!("the message has {content_types} Content-Type headers")));
    }
    let root = message.root_part();
    let (signature, detached) = match shape {
        Shape::Detached => {
            let boundary = root
                .content_type()
                .and_then(|ct| ct.attribute("boundary"))
                .ok_or_else(|| perm("multipart/signed without a boundary"))?;
            let body = entity.get(root.raw_body_offset() as usize..).unwrap_or_default();
            let (content, signature_part) = split_signed(body, boundary)?;
            (signature_der(signature_part)?, Some(content))
        }
        Shape::Opaque => (base64_or_der(root.contents()), None),
        Shape::Enveloped => return Err(fail("not signed: the content is encrypted")),
    };
    match content_info_type(&signature) {
        Some(oid::SIGNED_DATA) => {}
        Some(other) => {
            return Err(fail(format!(
                "not signed: the S/MIME structure is of content type {}, not signed-data",
                oid_string(other)
            )));
        }
        None => return Err(perm("unreadable S/MIME structure: not a CMS ContentInfo")),
    }
    // Plain DER is read as it is; anything else (BER from some signers) as OpenSSL
    // re-encodes it, which is what it verifies.
    let reencoded;
    let (der, view) = match signed_data(&signature) {
        Ok(view) => (&signature[..], view),
        Err(_) => {
            let cms = CmsContentInfo::from_der(&signature)
                .map_err(|e| perm(format!("unreadable S/MIME structure: {}", first_error(&e))))?;
            reencoded = cms.to_der().map_err(|e| perm(format!("unreadable signature: {}", first_error(&e))))?;
            let view = signed_data(&reencoded).map_err(|e| perm(format!("unreadable signature: {e}")))?;
            (&reencoded[..], view)
        }
    };
    let signer_info = match view.signers.as_slice() {
        [one] => one,
        more => return Err(fail(format!("the message has {} signers; exactly one is required", more.len()))),
    };
    check_algorithms(signer_info)?;
    let (signer, _) = cx.directory.iter().find(|(cert, der)| names(&signer_info.sid, cert, der)).ok_or_else(|| {
        fail(format!(
            "signed with a certificate that is not {}'s certificate in the directory (forged or another agent)",
            cx.from
        ))
    })?;

    // The certificates (and CRLs) a mail carries are not used by the CMS verification;
    // OpenSSL 3 would still decode them, ~40 % of a verification. Dropped before parsing.
    let stripped = without_certificates(der);
    let mut cms = CmsContentInfo::from_der(stripped.as_deref().unwrap_or(der))
        .map_err(|e| perm(format!("unreadable S/MIME structure: {}", first_error(&e))))?;
    let mut signers = Stack::new().map_err(|e| temp(first_error(&e)))?;
    signers.push(signer.clone()).map_err(|e| temp(first_error(&e)))?;
    let mut content = Vec::new();
    // Only `signers` may have signed (NOINTERN); the chain is checked below, from the trust
    // store (NO_SIGNER_CERT_VERIFY here).
    cms.verify(
        Some(&signers),
        None,
        detached.as_deref(),
        Some(&mut content),
        CMSOptions::NOINTERN | CMSOptions::NO_SIGNER_CERT_VERIFY,
    )
    .map_err(|e| signature_error(&e))?;

    match signer.extended_key_usage() {
        Some(eku) if eku.contains(X509ExtendedKeyUsage::SMIME) => {}
        Some(_) => return Err(fail("the signer certificate's extendedKeyUsage does not include emailProtection")),
        None => return Err(fail("the signer certificate has no extendedKeyUsage (emailProtection required)")),
    }
    let store = cx.trust.x509_store(cx.now).map_err(|e| temp(first_error(&e)))?;
    let chain = verify_chain(cx.trust, &store, signer, &view.certificates, cx.now)?;
    check_revocation(cx.trust, &chain, cx.now)?;

    let emails = certificate_emails(signer);
    if !emails.iter().any(|e| e == cx.from) {
        let listed = if emails.is_empty() { "none".to_string() } else { emails.join(", ") };
        return Err(fail(format!(
            "the From address {} is not the signer certificate's e-mail address ({listed})",
            cx.from
        )));
    }
    check_signing_time(signer_info, signer, cx)?;
    Ok(Layer { content, signer: signer.clone() })
}

/// Why CMS verification failed, in words: a signature that does not match the content is
/// not an algorithm that could not be used.
fn signature_error(e: &openssl::error::ErrorStack) -> Verdict {
    let why = first_error(e);
    let mismatch = e.errors().iter().any(|x| {
        matches!(x.reason(), Some("verification failure" | "content verify error" | "digest failure" | "bad signature"))
    });
    if mismatch {
        fail(format!(
            "the signature does not verify: the signed content or the signature was changed, or it was not made \
             with the certificate's key ({why})"
        ))
    } else {
        fail(format!("the signature does not verify: it could not be checked ({why})"))
    }
}

/// Whether `sid` names `cert` (whose DER is `der`), as RFC 5652 §5.3 compares them.
pub(super) fn names(sid: &SignerId<'_>, cert: &X509, der: &[u8]) -> bool {
    match sid {
        SignerId::KeyId(id) => cert.subject_key_id().is_some_and(|k| k.as_slice() == *id),
        SignerId::IssuerSerial { issuer, serial } => {
            let Some((cert_issuer, cert_serial)) = certificate_issuer_serial(der) else { return false };
            cert_serial == *serial
                && (cert_issuer == *issuer
                    || openssl::x509::X509Name::from_der(issuer)
                        .ok()
                        .and_then(|name| name.try_cmp(cert.issuer_name()).ok())
                        .is_some_and(|o| o.is_eq()))
        }
    }
}

const ACCEPTED: &str = "RSA PKCS#1 v1.5, RSASSA-PSS or ECDSA with SHA-256, SHA-384 or SHA-512";

/// The digest and signature algorithms must be ones this gateway accepts; anything else is
/// refused by name before OpenSSL is asked.
pub(super) fn check_algorithms(si: &SignerInfoView<'_>) -> Result<(), Verdict> {
    digest_ok(si.digest, "digest algorithm")?;
    let sig = si.signature;
    let named_hash = |h: &[u8]| digest_ok(h, "signature algorithm's hash");
    if sig == oid::RSA || sig == oid::EC_PUBLIC_KEY {
        // The hash is the digest algorithm's, checked above.
        return Ok(());
    }
    for (last, hash) in [(11u8, oid::SHA256), (12, oid::SHA384), (13, oid::SHA512), (5, oid::SHA1), (14, oid::SHA224)] {
        if sig == oid::rsa_with(last) {
            return named_hash(hash);
        }
    }
    for (last, hash) in [(2u8, oid::SHA256), (3, oid::SHA384), (4, oid::SHA512), (1, oid::SHA224)] {
        if sig == oid::ecdsa_with(last) {
            return named_hash(hash);
        }
    }
    if sig == oid::ECDSA_SHA1 {
        return named_hash(oid::SHA1);
    }
    if sig == oid::RSA_PSS {
        return pss_params_ok(si.signature_params);
    }
    let name = if sig == oid::ED25519 {
        "Ed25519".to_string()
    } else if sig == oid::ED448 {
        "Ed448".to_string()
    } else {
        format!("with OID {}", oid_string(sig))
    };
    Err(fail(format!("the signature algorithm {name} is not accepted here ({ACCEPTED} are)")))
}

fn digest_ok(oid: &[u8], what: &str) -> Result<(), Verdict> {
    let name = match oid {
        oid::SHA256 | oid::SHA384 | oid::SHA512 => return Ok(()),
        oid::SHA1 => "SHA-1".to_string(),
        oid::MD5 => "MD5".to_string(),
        oid::SHA224 => "SHA-224".to_string(),
        other => format!("with OID {}", oid_string(other)),
    };
    Err(fail(format!("the {what} {name} is not accepted here ({ACCEPTED} are)")))
}

/// RSASSA-PSS parameters (RFC 4055): the hash and MGF1's hash must be accepted ones; absent
/// fields mean SHA-1, which is not.
fn pss_params_ok(params: Option<&[u8]>) -> Result<(), Verdict> {
    let malformed = || fail("the RSASSA-PSS parameters are malformed");
    let params = params.ok_or_else(|| fail("RSASSA-PSS without parameters means SHA-1, which is not accepted"))?;
    let (mut fields, _) = expect(params, 0x30, "").map_err(|_| malformed())?;
    let (mut hash, mut mgf_hash): (&[u8], &[u8]) = (oid::SHA1, oid::SHA1);
    while !fields.is_empty() {
        let (tag, value, rest) = der_tlv(fields).map_err(|_| malformed())?;
        match tag {
            0xA0 => {
                let (alg, _) = expect(value, 0x30, "").map_err(|_| malformed())?;
                hash = expect(alg, 0x06, "").map_err(|_| malformed())?.0;
            }
            0xA1 => {
                let (alg, _) = expect(value, 0x30, "").map_err(|_| malformed())?;
                let (mgf, params) = expect(alg, 0x06, "").map_err(|_| malformed())?;
                if mgf != oid::MGF1 {
                    return Err(fail(format!("the RSASSA-PSS mask generation {} is not accepted", oid_string(mgf))));
                }
                let (inner, _) = expect(params, 0x30, "").map_err(|_| malformed())?;
                mgf_hash = expect(inner, 0x06, "").map_err(|_| malformed())?.0;
            }
            _ => {}
        }
        fields = rest;
    }
    digest_ok(hash, "RSASSA-PSS hash")?;
    digest_ok(mgf_hash, "RSASSA-PSS MGF1 hash")
}

/// A signingTime, when the signer gave one: inside the certificate's validity, not in the
/// future (beyond [`MAX_CLOCK_SKEW`]), not older than the replay window.
fn check_signing_time(si: &SignerInfoView<'_>, signer: &X509, cx: &Context<'_>) -> Result<(), Verdict> {
    let at = match &si.signing_time {
        None => return Ok(()),
        Some(Err(why)) => return Err(fail(format!("bad signingTime: {why}"))),
        Some(Ok(at)) => *at,
    };
    let when = sign::rfc5322_date(at);
    if let (Some(from), Some(until)) = (asn1_unix(signer.not_before()), asn1_unix(signer.not_after()))
        && !(from..=until).contains(&at)
    {
        return Err(fail(format!(
            "bad signingTime: signed {when}, outside the signer certificate's validity ({} to {})",
            sign::rfc5322_date(from),
            sign::rfc5322_date(until)
        )));
    }
    if at > cx.now + MAX_CLOCK_SKEW {
        return Err(fail(format!(
            "bad signingTime: signed {when}, more than {} minutes after the mail arrived ({})",
            MAX_CLOCK_SKEW / 60,
            sign::rfc5322_date(cx.now)
        )));
    }
    let window = cx.policy.replay_window;
    if window > 0 && at < cx.now - window {
        return Err(fail(format!(
            "bad signingTime: signed {when}, more than {} hours before the mail arrived: older than the replay \
             window",
            window / 3600
        )));
    }
    Ok(())
}
