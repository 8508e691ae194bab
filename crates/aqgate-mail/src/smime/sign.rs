//! S/MIME mail that aqgate makes: a request signed as an agent signs it (`aqgate mail sign`,
//! tests, the benchmark, users' clients), optionally encrypted to the gateway, and the
//! gateway's replies, signed with its certificate and optionally encrypted to the agent.

use super::*;

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
    sign_at(idap, cert_pem, key_pem, from, to, subject, system_now())
}

/// [`sign`], then encrypted (enveloped-data, AES-256-CBC) to the certificate in
/// `recipient_pem` (the gateway's): `aqgate mail sign --encrypt-to`.
pub fn sign_encrypted(
    idap: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    from: &str,
    to: &str,
    subject: &str,
    recipient_pem: &[u8],
) -> Result<Vec<u8>, String> {
    let recipient =
        X509::from_pem(recipient_pem).map_err(|e| format!("encrypt-to certificate: {}", first_error(&e)))?;
    compose_request(idap, cert_pem, key_pem, from, to, subject, Some(&recipient), system_now())
}

fn system_now() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// [`sign`] with the Date header at `now` (unix seconds). Refuses a `from` that is not one of
/// the certificate's e-mail addresses: the gateway would refuse that mail. The IDAP part is
/// base64-encoded so that no mail relay can alter the signed bytes. Certificates after the
/// first in `cert_pem` (intermediates) travel in the signature.
pub fn sign_at(
    idap: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    from: &str,
    to: &str,
    subject: &str,
    now: i64,
) -> Result<Vec<u8>, String> {
    compose_request(idap, cert_pem, key_pem, from, to, subject, None, now)
}

#[allow(clippy::too_many_arguments)]
fn compose_request(
    idap: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    from: &str,
    to: &str,
    subject: &str,
    encrypt_to: Option<&X509>,
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
    let mut certs = X509::stack_from_pem(cert_pem).map_err(|e| format!("certificate: {}", first_error(&e)))?;
    if certs.is_empty() {
        return Err("certificate: no certificate found".to_string());
    }
    let cert = certs.remove(0);
    let key = PKey::private_key_from_pem(key_pem).map_err(|e| format!("private key: {}", first_error(&e)))?;
    let emails = certificate_emails(&cert);
    if !emails.contains(&from.to_ascii_lowercase()) {
        return Err(format!("from: {from} is not the certificate's e-mail address ({})", emails.join(", ")));
    }
    let inner = xml_entity(idap, "text/xml");
    let mut body = signed_entity(&inner, &cert, &key, &certs)?;
    if let Some(recipient) = encrypt_to {
        body = encrypt_entity(body.as_bytes(), recipient)?;
    }
    let domain = from.rsplit_once('@').map(|(_, d)| d).unwrap_or("localhost");
    let message_id = format!("{}@{domain}", random_hex(16)?);
    let mut out = String::new();
    out.push_str(&format!("From: {from}\r\nTo: {to}\r\nSubject: {}\r\n", encode_subject(subject)));
    out.push_str(&format!("Date: {}\r\nMessage-ID: <{message_id}>\r\nMIME-Version: 1.0\r\n", rfc5322_date(now)));
    out.push_str(&body);
    Ok(out.into_bytes())
}

/// A MIME entity of `media_type` (charset UTF-8 for replies) holding `bytes` in base64: no
/// relay can change a base64 body, so a signature over it survives transport.
fn xml_entity(bytes: &[u8], media_type: &str) -> String {
    format!("Content-Type: {media_type}\r\nContent-Transfer-Encoding: base64\r\n\r\n{}", base64_lines(bytes, 76))
}

/// `inner` (a MIME entity, CRLF, no final line end) as a `multipart/signed` entity with a
/// detached CMS signature by `cert` (SHA-256; the certificate and `chain` carried), CRLF.
fn signed_entity(inner: &str, cert: &X509, key: &PKey<Private>, chain: &[X509]) -> Result<String, String> {
    let mut extra = Stack::new().map_err(|e| first_error(&e))?;
    for c in chain {
        extra.push(c.clone()).map_err(|e| first_error(&e))?;
    }
    let cms = CmsContentInfo::sign(
        Some(cert),
        Some(key),
        Some(&extra),
        Some(inner.as_bytes()),
        CMSOptions::DETACHED | CMSOptions::BINARY,
    )
    .map_err(|e| format!("signing failed: {}", first_error(&e)))?;
    let signature = cms.to_der().map_err(|e| format!("signing failed: {}", first_error(&e)))?;
    let boundary = format!("----=_aqgate_{}", random_hex(12)?);
    let mut out = String::new();
    out.push_str("Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; micalg=sha-256;\r\n");
    out.push_str(&format!(" boundary=\"{boundary}\"\r\n\r\nThis is an S/MIME signed message.\r\n\r\n"));
    out.push_str(&format!("--{boundary}\r\n{inner}\r\n--{boundary}\r\n"));
    out.push_str("Content-Type: application/pkcs7-signature; name=\"smime.p7s\"\r\n");
    out.push_str("Content-Transfer-Encoding: base64\r\n");
    out.push_str("Content-Disposition: attachment; filename=\"smime.p7s\"\r\n\r\n");
    out.push_str(&base64_lines(&signature, 64));
    out.push_str(&format!("\r\n--{boundary}--\r\n"));
    Ok(out)
}

/// The header fields of a reply mail.
#[derive(Debug, Clone)]
pub struct ReplyHeaders<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
    /// The reply's own Message-ID, without angle brackets.
    pub message_id: &'a str,
    /// The Message-ID (without brackets) of the mail answered: In-Reply-To and References.
    pub in_reply_to: Option<&'a str>,
    /// Further header fields (name, value).
    pub extra: &'a [(&'a str, String)],
}

/// A reply mail: `xml` as a text/xml body; signed by `identity` (multipart/signed) when one
/// is given; then encrypted to the certificate `encrypt_to` (DER) when given (RFC 8551
/// §3.7: signed, then enveloped). CRLF line endings; the Date header at `now`.
pub fn reply_mail(
    headers: &ReplyHeaders<'_>,
    xml: &[u8],
    identity: Option<&GatewayIdentity>,
    encrypt_to: Option<&[u8]>,
    now: i64,
) -> Result<Vec<u8>, String> {
    let clean = |v: &str| -> String { v.chars().map(|c| if c.is_control() { ' ' } else { c }).collect() };
    for (what, value) in [("from", headers.from), ("to", headers.to)] {
        if !is_bare_address(value) {
            return Err(format!("reply {what}: {value:?} is not a bare e-mail address"));
        }
    }
    let inner = xml_entity(xml, "text/xml; charset=utf-8");
    let mut body = match identity {
        Some(id) => signed_entity(&inner, &id.cert, &id.key, &id.chain)?,
        None => format!("{inner}\r\n"),
    };
    if let Some(der) = encrypt_to {
        let recipient = X509::from_der(der).map_err(|e| format!("the agent's certificate: {}", first_error(&e)))?;
        body = encrypt_entity(body.as_bytes(), &recipient)?;
    }
    let mut out = String::new();
    out.push_str(&format!("From: {}\r\nTo: {}\r\n", headers.from, headers.to));
    out.push_str(&format!("Subject: {}\r\nDate: {}\r\n", encode_subject(&clean(headers.subject)), rfc5322_date(now)));
    out.push_str(&format!("Message-ID: <{}>\r\n", clean(headers.message_id)));
    if let Some(id) = headers.in_reply_to {
        let id = clean(id);
        out.push_str(&format!("In-Reply-To: <{id}>\r\nReferences: <{id}>\r\n"));
    }
    for (name, value) in headers.extra {
        out.push_str(&format!("{name}: {}\r\n", clean(value)));
    }
    out.push_str("MIME-Version: 1.0\r\n");
    out.push_str(&body);
    Ok(out.into_bytes())
}

/// Base64 in lines of `width` characters joined by CRLF (no trailing CRLF).
pub(super) fn base64_lines(bytes: &[u8], width: usize) -> String {
    let encoded = BASE64.encode(bytes);
    let lines: Vec<&str> =
        encoded.as_bytes().chunks(width).map(|chunk| std::str::from_utf8(chunk).unwrap_or_default()).collect();
    lines.join("\r\n")
}

pub(super) fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    openssl::rand::rand_bytes(&mut buf).map_err(|e| first_error(&e))?;
    Ok(hex::encode(buf))
}

/// Plain ASCII as is; anything else as RFC 2047 UTF-8 encoded words, folded.
pub(super) fn encode_subject(subject: &str) -> String {
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
pub(super) fn rfc5322_date(now: i64) -> String {
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
