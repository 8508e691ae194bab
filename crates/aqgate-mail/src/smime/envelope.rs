//! Encrypted S/MIME (RFC 8551 §3.3): the gateway's own certificate and key, decrypting a
//! request encrypted to it, and encrypting to an agent's certificate.

use super::*;

/// The gateway's S/MIME identity: replies are signed with it, and requests encrypted to its
/// certificate are decrypted with its key. Not `Clone` (share it behind an `Arc`); its
/// `Debug` shows the certificate, never the key.
pub struct GatewayIdentity {
    pub(super) cert: X509,
    pub(super) key: PKey<Private>,
    /// Further certificates of the PEM file (intermediates), sent along with signatures.
    pub(super) chain: Vec<X509>,
}

impl std::fmt::Debug for GatewayIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayIdentity")
            .field("subject", &name_string(self.cert.subject_name()))
            .field("emails", &self.emails())
            .finish_non_exhaustive()
    }
}

impl GatewayIdentity {
    /// The certificate (PEM; further certificates after it are its chain) and its private
    /// key (PEM). The key must be the certificate's, and the certificate must allow
    /// emailProtection.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, String> {
        let mut certs = X509::stack_from_pem(cert_pem).map_err(|e| format!("certificate: {}", first_error(&e)))?;
        if certs.is_empty() {
            return Err("certificate: no certificate found".to_string());
        }
        let cert = certs.remove(0);
        let key = PKey::private_key_from_pem(key_pem).map_err(|e| format!("private key: {}", first_error(&e)))?;
        let public = cert.public_key().map_err(|e| format!("certificate: {}", first_error(&e)))?;
        if !public.public_eq(&key) {
            return Err("the private key is not the certificate's".to_string());
        }
        match cert.extended_key_usage() {
            Some(eku) if eku.contains(X509ExtendedKeyUsage::SMIME) => {}
            _ => return Err("the certificate's extendedKeyUsage does not include emailProtection".to_string()),
        }
        Ok(GatewayIdentity { cert, key, chain: certs })
    }

    /// [`GatewayIdentity::from_pem`] from files.
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, String> {
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        Self::from_pem(&read(cert)?, &read(key)?)
    }

    /// The certificate's e-mail addresses, lower-cased.
    pub fn emails(&self) -> Vec<String> {
        certificate_emails(&self.cert)
    }
}

/// The MIME entity inside an encrypted mail (`message`'s root is enveloped-data or
/// authEnveloped-data), decrypted with the gateway's key.
pub(super) fn decrypt(
    message: &mail_parser::Message<'_>,
    gateway: Option<&GatewayIdentity>,
) -> Result<Vec<u8>, Verdict> {
    let Some(gateway) = gateway else {
        return Err(perm(
            "the mail is encrypted (S/MIME enveloped-data), and this gateway has no certificate to decrypt it: \
             send the request signed, not encrypted",
        ));
    };
    let der = base64_or_der(message.root_part().contents());
    let cms = CmsContentInfo::from_der(&der)
        .map_err(|e| perm(format!("unreadable encrypted S/MIME structure: {}", first_error(&e))))?;
    // Whether it is encrypted to us at all, said plainly (OpenSSL does not say).
    let reencoded;
    let ids = match recipient_ids(&der) {
        Ok(ids) => ids,
        Err(_) => {
            reencoded = cms.to_der().map_err(|e| perm(format!("unreadable encrypted S/MIME: {}", first_error(&e))))?;
            recipient_ids(&reencoded).map_err(|e| perm(format!("unreadable encrypted S/MIME structure: {e}")))?
        }
    };
    let ours = gateway.cert.to_der().map_err(|e| temp(first_error(&e)))?;
    if !ids.iter().any(|id| names(id, &gateway.cert, &ours)) {
        return Err(perm(format!(
            "the mail is not encrypted to the gateway's certificate ({})",
            name_string(gateway.cert.subject_name())
        )));
    }
    // One answer for every failure once the recipient is ours: how a decryption failed
    // must not be an oracle for the key. A damaged encrypted key does not always fail:
    // OpenSSL then decrypts with a random key (its defence against Bleichenbacher's attack),
    // and a CBC content decrypted so passes its padding check about once in 256 and comes out
    // as noise. Noise is no MIME entity, so it gets the same answer.
    let cannot = || perm("the mail cannot be decrypted with the gateway's key (damaged in transit?)");
    let entity = cms.decrypt(&gateway.key, &gateway.cert).map_err(|_| cannot())?;
    if !starts_with_header_field(&entity) {
        return Err(cannot());
    }
    Ok(entity)
}

/// Whether `entity` opens with a header section of at least one field (RFC 5322 §2.2:
/// a name of printable ASCII but ':', then ':') ended by an empty line: what every MIME
/// entity that can hold a signed request does, and what decrypted noise all but never does.
pub(super) fn starts_with_header_field(entity: &[u8]) -> bool {
    // Whole lines only: what follows the last line feed is not a line yet.
    let lines = entity.split_inclusive(|&b| b == b'\n').filter_map(|l| l.strip_suffix(b"\n"));
    // A value's bytes: no control characters but tab; UTF-8 allowed (RFC 6532).
    let value_ok = |value: &[u8]| value.iter().all(|&b| b == b'\t' || b >= b' ' && b != 0x7f);
    let mut fields = 0;
    for line in lines.map(|l| l.strip_suffix(b"\r").unwrap_or(l)) {
        if line.is_empty() {
            return fields > 0;
        }
        let folded = line.first().is_some_and(|b| *b == b' ' || *b == b'\t');
        if folded && fields > 0 {
            if !value_ok(line) {
                return false;
            }
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else { return false };
        let (name, value) = line.split_at(colon);
        // Obsolete whitespace before the colon allowed, as `header_name_is` allows it.
        let name = name.trim_ascii_end();
        let name_ok = !name.is_empty() && name.iter().all(|&b| (b'!'..=b'~').contains(&b));
        if !name_ok || !value_ok(value) {
            return false;
        }
        fields += 1;
    }
    false
}

/// `entity` (a MIME entity) as an `application/pkcs7-mime` enveloped-data entity encrypted
/// to `recipient` with AES-256-CBC (RFC 8551 §2.7), base64 in lines, CRLF.
pub(super) fn encrypt_entity(entity: &[u8], recipient: &X509) -> Result<String, String> {
    let mut recipients = Stack::new().map_err(|e| first_error(&e))?;
    recipients.push(recipient.clone()).map_err(|e| first_error(&e))?;
    let cms = CmsContentInfo::encrypt(&recipients, entity, openssl::symm::Cipher::aes_256_cbc(), CMSOptions::BINARY)
        .map_err(|e| format!("encryption failed: {}", first_error(&e)))?;
    let der = cms.to_der().map_err(|e| format!("encryption failed: {}", first_error(&e)))?;
    Ok(format!(
        "Content-Type: application/pkcs7-mime; smime-type=enveloped-data; name=\"smime.p7m\"\r\n\
         Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"smime.p7m\"\r\n\r\n{}\r\n",
        sign::base64_lines(&der, 64)
    ))
}
