//! The DER of a CMS SignedData (RFC 5652 §5), read and rewritten just enough: the signature
//! part of a mail, the SignerInfos (signer identifier, algorithms, signingTime), the
//! certificates a mail carries, and a copy without them. What is read here decides nothing
//! alone: OpenSSL's CMS verification checks the signature over the same structure.

use super::*;

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
pub(super) fn base64_or_der(bytes: &[u8]) -> Vec<u8> {
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

/// Object identifiers (the DER content octets) that verification names.
pub(super) mod oid {
    pub const SIGNED_DATA: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x02];
    pub const ENVELOPED_DATA: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x03];
    pub const AUTH_ENVELOPED_DATA: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x09, 0x10, 0x01, 0x17];
    pub const SIGNING_TIME: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x09, 0x05];
    pub const SHA1: &[u8] = &[0x2B, 0x0E, 0x03, 0x02, 0x1A];
    pub const MD5: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x02, 0x05];
    pub const SHA224: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x04];
    pub const SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
    pub const SHA384: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02];
    pub const SHA512: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03];
    const PKCS1: [u8; 8] = [0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01];
    pub const RSA: &[u8] = &[PKCS1[0], PKCS1[1], PKCS1[2], PKCS1[3], PKCS1[4], PKCS1[5], PKCS1[6], PKCS1[7], 0x01];
    pub const MGF1: &[u8] = &[PKCS1[0], PKCS1[1], PKCS1[2], PKCS1[3], PKCS1[4], PKCS1[5], PKCS1[6], PKCS1[7], 0x08];
    pub const RSA_PSS: &[u8] = &[PKCS1[0], PKCS1[1], PKCS1[2], PKCS1[3], PKCS1[4], PKCS1[5], PKCS1[6], PKCS1[7], 0x0A];
    /// sha1, sha256, sha384, sha512, sha224 WithRSAEncryption: PKCS1 arc 5, 11, 12, 13, 14.
    pub const fn rsa_with(last: u8) -> [u8; 9] {
        [PKCS1[0], PKCS1[1], PKCS1[2], PKCS1[3], PKCS1[4], PKCS1[5], PKCS1[6], PKCS1[7], last]
    }
    pub const EC_PUBLIC_KEY: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01];
    pub const ECDSA_SHA1: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x04, 0x01];
    /// ecdsa-with-SHA224, 256, 384, 512: 1.2.840.10045.4.3.1 to 4.
    pub const fn ecdsa_with(last: u8) -> [u8; 8] {
        [0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x04, 0x03, last]
    }
    pub const ED25519: &[u8] = &[0x2B, 0x65, 0x70];
    pub const ED448: &[u8] = &[0x2B, 0x65, 0x71];
}

/// An object identifier in dotted form (for messages).
pub(super) fn oid_string(oid: &[u8]) -> String {
    let mut arcs: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    for &b in oid {
        value = value.saturating_mul(128) | u64::from(b & 0x7F);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (value / 40).min(2);
                arcs.push(first);
                arcs.push(value - first * 40);
            } else {
                arcs.push(value);
            }
            value = 0;
        }
    }
    arcs.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
}

/// How a SignerInfo names its certificate (RFC 5652 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignerId<'a> {
    /// `issuerAndSerialNumber`: the issuer's Name (the whole DER TLV) and the serial
    /// number's INTEGER content octets.
    IssuerSerial { issuer: &'a [u8], serial: &'a [u8] },
    /// `subjectKeyIdentifier`: the certificate's subjectKeyIdentifier extension value.
    KeyId(&'a [u8]),
}

/// One SignerInfo, as far as the policy looks at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerInfoView<'a> {
    pub sid: SignerId<'a>,
    /// The digestAlgorithm's OID.
    pub digest: &'a [u8],
    /// The signatureAlgorithm's OID and its parameters (the TLV after the OID, if any).
    pub signature: &'a [u8],
    pub signature_params: Option<&'a [u8]>,
    /// The signingTime signed attribute as unix seconds: `None` when absent, `Some(Err)`
    /// when it is there but not one well-formed time.
    pub signing_time: Option<Result<i64, String>>,
}

/// A ContentInfo(SignedData) read from plain DER. Public for the fuzz targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedDataView<'a> {
    /// The eContentType's OID (id-data for a MIME entity).
    pub content_type: &'a [u8],
    /// The X.509 certificates the mail carries (DER each), in their order; other
    /// certificate choices (attribute certificates) are skipped.
    pub certificates: Vec<&'a [u8]>,
    pub signers: Vec<SignerInfoView<'a>>,
}

/// The outer ContentInfo's content type OID, when `der` starts like a ContentInfo (BER
/// lengths too: only the first elements are read).
pub(super) fn content_info_type(der: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = der.split_first()?;
    if tag != 0x30 {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let rest = match first {
        0x80 => rest,
        n if n < 0x80 => rest,
        n => rest.get(usize::from(n & 0x7F)..)?,
    };
    match der_tlv(rest).ok()? {
        (0x06, oid, _) => Some(oid),
        _ => None,
    }
}

/// Reads a DER ContentInfo(SignedData): `Err` when it is not plain definite-length DER of
/// that shape (the caller then lets OpenSSL re-encode it and reads that). Public for the
/// fuzz targets.
pub fn signed_data(der: &[u8]) -> Result<SignedDataView<'_>, String> {
    let (content_info, _) = expect(der, 0x30, "ContentInfo is not a SEQUENCE")?;
    let (content_type, rest) = expect(content_info, 0x06, "ContentInfo has no content type")?;
    if content_type != oid::SIGNED_DATA {
        return Err(format!("the ContentInfo is {}, not signed-data", oid_string(content_type)));
    }
    let (explicit, _) = expect(rest, 0xA0, "ContentInfo has no content")?;
    let (signed, _) = expect(explicit, 0x30, "SignedData is not a SEQUENCE")?;
    let (_version, rest) = expect(signed, 0x02, "SignedData has no version")?;
    let (_digests, rest) = expect(rest, 0x31, "SignedData has no digestAlgorithms")?;
    let (encap, mut rest) = expect(rest, 0x30, "SignedData has no encapContentInfo")?;
    let (content_type, _) = expect(encap, 0x06, "encapContentInfo has no eContentType")?;
    let mut certificates = Vec::new();
    if rest.first() == Some(&0xA0) {
        let (mut set, after) = expect(rest, 0xA0, "bad certificates")?;
        while !set.is_empty() {
            let (tag, _, next) = der_tlv(set)?;
            if tag == 0x30 {
                certificates.push(&set[..set.len() - next.len()]);
            }
            set = next;
        }
        rest = after;
    }
    if rest.first() == Some(&0xA1) {
        rest = expect(rest, 0xA1, "bad crls")?.1;
    }
    let (mut infos, after) = expect(rest, 0x31, "SignedData has no signerInfos")?;
    if !after.is_empty() {
        return Err("data after the signerInfos".to_string());
    }
    let mut signers = Vec::new();
    while !infos.is_empty() {
        let (info, next) = expect(infos, 0x30, "a SignerInfo is not a SEQUENCE")?;
        signers.push(signer_info(info)?);
        infos = next;
    }
    Ok(SignedDataView { content_type, certificates, signers })
}

fn signer_info(info: &[u8]) -> Result<SignerInfoView<'_>, String> {
    let (_version, rest) = expect(info, 0x02, "SignerInfo has no version")?;
    let sid = certificate_id(rest)?;
    let (_, _, rest) = der_tlv(rest)?;
    let (digest_alg, mut rest) = expect(rest, 0x30, "SignerInfo has no digestAlgorithm")?;
    let (digest, _) = expect(digest_alg, 0x06, "digestAlgorithm has no OID")?;
    let mut signing_time = None;
    if rest.first() == Some(&0xA0) {
        let (mut attrs, after) = expect(rest, 0xA0, "bad signedAttrs")?;
        while !attrs.is_empty() {
            let (attr, next) = expect(attrs, 0x30, "a signed attribute is not a SEQUENCE")?;
            let (kind, values) = expect(attr, 0x06, "a signed attribute has no type")?;
            if kind == oid::SIGNING_TIME {
                if signing_time.is_some() {
                    signing_time = Some(Err("the signingTime attribute is given twice".to_string()));
                } else {
                    signing_time = Some(one_time(values));
                }
            }
            attrs = next;
        }
        rest = after;
    }
    let (signature_alg, _) = expect(rest, 0x30, "SignerInfo has no signatureAlgorithm")?;
    let (signature, params) = expect(signature_alg, 0x06, "signatureAlgorithm has no OID")?;
    let signature_params = (!params.is_empty()).then_some(params);
    Ok(SignerInfoView { sid, digest, signature, signature_params, signing_time })
}

/// The single value of a signingTime attribute (`SET OF Time` holding one UTCTime or
/// GeneralizedTime), as unix seconds.
fn one_time(values: &[u8]) -> Result<i64, String> {
    let (set, _) = expect(values, 0x31, "the signingTime attribute has no values")?;
    let (tag, value, rest) = der_tlv(set)?;
    if !rest.is_empty() {
        return Err("the signingTime attribute has more than one value".to_string());
    }
    let text = std::str::from_utf8(value).map_err(|_| "the signingTime is not text".to_string())?;
    let full = match (tag, text.len()) {
        // UTCTime YYMMDDHHMMSSZ: 1950..2049 (RFC 5280 §4.1.2.5.1).
        (0x17, 13) => {
            let yy: i64 = text.get(..2).and_then(|s| s.parse().ok()).ok_or_else(|| bad_time(text))?;
            format!("{}{}", if yy < 50 { 20 } else { 19 }, text)
        }
        (0x18, 15) => text.to_string(),
        _ => return Err(bad_time(text)),
    };
    parse_generalized(&full).ok_or_else(|| bad_time(text))
}

fn bad_time(text: &str) -> String {
    format!("the signingTime {:?} is not a UTC time (YYMMDDHHMMSSZ or YYYYMMDDHHMMSSZ)", text.escape_debug())
}

/// `YYYYMMDDHHMMSSZ` as unix seconds.
fn parse_generalized(text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    if digits.len() != 14 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |from: usize, len: usize| digits.get(from..from + len).and_then(|s| s.parse::<i64>().ok());
    let (year, month, day, hour, minute, second) = (n(0, 4)?, n(4, 2)?, n(6, 2)?, n(8, 2)?, n(10, 2)?, n(12, 2)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let max_day = *days_in.get(usize::try_from(month.checked_sub(1)?).ok()?)?;
    if !(1..=max_day).contains(&day) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// The certificates a DER ContentInfo(EnvelopedData or AuthEnvelopedData) is encrypted to:
/// the identifiers of its key transport and key agreement RecipientInfos (other kinds, such
/// as password or key-encryption-key recipients, name no certificate and are skipped).
pub(super) fn recipient_ids(der: &[u8]) -> Result<Vec<SignerId<'_>>, String> {
    let (content_info, _) = expect(der, 0x30, "ContentInfo is not a SEQUENCE")?;
    let (content_type, rest) = expect(content_info, 0x06, "ContentInfo has no content type")?;
    if content_type != oid::ENVELOPED_DATA && content_type != oid::AUTH_ENVELOPED_DATA {
        return Err(format!("the ContentInfo is {}, not enveloped-data", oid_string(content_type)));
    }
    let (explicit, _) = expect(rest, 0xA0, "ContentInfo has no content")?;
    let (enveloped, _) = expect(explicit, 0x30, "EnvelopedData is not a SEQUENCE")?;
    let (_version, mut rest) = expect(enveloped, 0x02, "EnvelopedData has no version")?;
    if rest.first() == Some(&0xA0) {
        rest = expect(rest, 0xA0, "bad originatorInfo")?.1;
    }
    let (mut infos, _) = expect(rest, 0x31, "EnvelopedData has no recipientInfos")?;
    let mut ids = Vec::new();
    while !infos.is_empty() {
        let (tag, info, next) = der_tlv(infos)?;
        match tag {
            0x30 => {
                let (_version, rest) = expect(info, 0x02, "KeyTransRecipientInfo has no version")?;
                ids.push(certificate_id(rest)?);
            }
            0xA1 => {
                let (_version, rest) = expect(info, 0x02, "KeyAgreeRecipientInfo has no version")?;
                let (_originator, mut rest) = expect(rest, 0xA0, "KeyAgreeRecipientInfo has no originator")?;
                if rest.first() == Some(&0xA1) {
                    rest = expect(rest, 0xA1, "bad ukm")?.1;
                }
                let (_alg, rest) = expect(rest, 0x30, "KeyAgreeRecipientInfo has no keyEncryptionAlgorithm")?;
                let (mut keys, _) = expect(rest, 0x30, "KeyAgreeRecipientInfo has no recipientEncryptedKeys")?;
                while !keys.is_empty() {
                    let (key, after) = expect(keys, 0x30, "a RecipientEncryptedKey is not a SEQUENCE")?;
                    match key.first() {
                        Some(0xA0) => {
                            let (rkey, _) = expect(key, 0xA0, "bad rKeyId")?;
                            ids.push(SignerId::KeyId(expect(rkey, 0x04, "rKeyId has no key identifier")?.0));
                        }
                        _ => ids.push(certificate_id(key)?),
                    }
                    keys = after;
                }
            }
            _ => {}
        }
        infos = next;
    }
    Ok(ids)
}

/// An issuerAndSerialNumber or `[0]` subjectKeyIdentifier at the start of `input`.
fn certificate_id(input: &[u8]) -> Result<SignerId<'_>, String> {
    let (tag, sid, _) = der_tlv(input)?;
    match tag {
        0x30 => {
            let (_, _, after) = der_tlv(sid)?;
            let issuer = &sid[..sid.len() - after.len()];
            if issuer.first() != Some(&0x30) {
                return Err("issuerAndSerialNumber has no issuer Name".to_string());
            }
            let (serial, _) = expect(after, 0x02, "issuerAndSerialNumber has no serial number")?;
            Ok(SignerId::IssuerSerial { issuer, serial })
        }
        0x80 => Ok(SignerId::KeyId(sid)),
        t => Err(format!("unknown certificate identifier (tag 0x{t:02X})")),
    }
}

/// A DER ContentInfo(SignedData) without its `certificates` and `crls` fields, or `None`
/// when it is not plain definite-length DER of that shape (BER from some signers): then the
/// caller parses it whole, with the same result, only slower. Removing them changes nothing
/// the signature covers (SignerInfos sign the content or their signed attributes) and
/// nothing verification uses: signers come from the directory (`NOINTERN`), the chain from
/// the trust store and the intermediates read before, revocation from configured CRLs.
/// Public for the fuzz targets.
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
pub(super) fn der_wrap(tag: u8, value: &[u8]) -> Vec<u8> {
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

/// Number of SignerInfos in a DER ContentInfo(SignedData). Public for the fuzz targets.
pub fn signer_info_count(der: &[u8]) -> Result<usize, String> {
    signed_data(der).map(|view| view.signers.len())
}

/// The value of the TLV at the start of `input`, which must have tag `tag`, and what follows it.
pub(super) fn expect<'a>(input: &'a [u8], tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    match der_tlv(input) {
        Ok((t, value, rest)) if t == tag => Ok((value, rest)),
        Ok(_) => Err(what.to_string()),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// One DER TLV with a single-byte tag: (tag, value, rest).
pub(super) fn der_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
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

/// The issuer Name (whole TLV) and the serial number's content octets of a DER
/// certificate, as an issuerAndSerialNumber names them.
pub(super) fn certificate_issuer_serial(cert: &[u8]) -> Option<(&[u8], &[u8])> {
    let (certificate, _) = expect(cert, 0x30, "").ok()?;
    let (tbs, _) = expect(certificate, 0x30, "").ok()?;
    let rest = match tbs.first() {
        Some(0xA0) => der_tlv(tbs).ok()?.2,
        _ => tbs,
    };
    let (serial, rest) = expect(rest, 0x02, "").ok()?;
    let (_signature, rest) = expect(rest, 0x30, "").ok()?;
    let (_, _, after) = der_tlv(rest).ok()?;
    Some((&rest[..rest.len() - after.len()], serial))
}
