//! The DER of a CMS SignedData, read and rewritten just enough: the signature part of a
//! mail, its SignerInfos, and a copy without the certificates the mail carried.

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
