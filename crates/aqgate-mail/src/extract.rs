//! Finding the IDAP document inside the signed MIME entity of a verified mail. Pure: bytes in,
//! bytes out.
//!
//! The IDAP document is the one part of the entity's MIME tree that is `text/xml` or
//! `application/xml`, or that is named (Content-Disposition `filename` or Content-Type `name`)
//! with a name containing `IDAP_MESSAGE` (ASCII case-insensitive), or that is `text/plain`
//! (also by default, without a Content-Type) and holds an IDAP envelope: an XML document
//! whose root element is `Envelope` (what `openssl smime -sign -text` and mail clients that
//! send the request as the message text make). One part may match several rules. Zero matches or more than one distinct match is an error: an ambiguous request is
//! refused rather than guessed at. Parts inside an attached `message/rfc822` are not looked at.
//!
//! The body is returned with only its Content-Transfer-Encoding removed (base64,
//! quoted-printable), never charset-converted: an XML document declares its own encoding.

use mail_parser::decoders::base64::base64_decode;
use mail_parser::decoders::quoted_printable::quoted_printable_decode;
use mail_parser::{Encoding, Message, MessageParser, MessagePart, MimeHeaders, PartType};

/// The marker in an attachment's file name that makes it the IDAP document.
pub const IDAP_ATTACHMENT_MARKER: &str = "IDAP_MESSAGE";

/// The IDAP document in `entity` (a MIME entity: headers, blank line, body — the content a
/// signature covers). `Err` says why none could be chosen.
pub fn idap_document(entity: &[u8]) -> Result<Vec<u8>, String> {
    let message = MessageParser::default().parse(entity).ok_or_else(|| "the signed content is not MIME".to_string())?;
    idap_document_of(entity, &message)
}

/// [`idap_document`] of `entity` already parsed as `message`.
pub fn idap_document_of(entity: &[u8], message: &Message<'_>) -> Result<Vec<u8>, String> {
    let candidates: Vec<&MessagePart<'_>> =
        message.parts.iter().filter(|part| is_idap_part(part) || is_envelope_text(entity, part)).collect();
    match candidates.as_slice() {
        [] => Err(format!(
            "the signed content holds no IDAP document (a text/xml or application/xml part, or an attachment \
             named *{IDAP_ATTACHMENT_MARKER}*, or text/plain holding an IDAP envelope)"
        )),
        [part] => decode_body(entity, part),
        more => {
            Err(format!("the signed content holds {} candidate IDAP documents; exactly one is allowed", more.len()))
        }
    }
}

fn is_idap_part(part: &MessagePart<'_>) -> bool {
    if matches!(part.body, PartType::Multipart(_) | PartType::Message(_)) {
        return false;
    }
    let is_xml = part.content_type().is_some_and(|ct| {
        let subtype = ct.subtype().unwrap_or_default();
        (ct.ctype().eq_ignore_ascii_case("text") || ct.ctype().eq_ignore_ascii_case("application"))
            && subtype.eq_ignore_ascii_case("xml")
    });
    let is_named =
        part.attachment_name().is_some_and(|name| name.to_ascii_uppercase().contains(IDAP_ATTACHMENT_MARKER));
    is_xml || is_named
}

/// A text/plain part whose body is an IDAP envelope.
fn is_envelope_text(entity: &[u8], part: &MessagePart<'_>) -> bool {
    if matches!(part.body, PartType::Multipart(_) | PartType::Message(_)) {
        return false;
    }
    let plain = match part.content_type() {
        Some(ct) => {
            ct.ctype().eq_ignore_ascii_case("text") && ct.subtype().is_none_or(|s| s.eq_ignore_ascii_case("plain"))
        }
        None => true,
    };
    plain && decode_body(entity, part).is_ok_and(|body| is_envelope(&body))
}

/// Whether `xml` is an XML document whose root element's local name is `Envelope`: after
/// an optional byte order mark, XML declaration, comments and whitespace, the first tag.
pub fn is_envelope(xml: &[u8]) -> bool {
    let mut rest = xml.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(xml);
    loop {
        rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len())..];
        let skip_to = |rest: &[u8], open: &[u8], close: &[u8]| -> Option<usize> {
            rest.strip_prefix(open)?;
            rest.windows(close.len()).position(|w| w == close).map(|i| i + close.len())
        };
        if let Some(end) = skip_to(rest, b"<?", b"?>").or_else(|| skip_to(rest, b"<!--", b"-->")) {
            rest = &rest[end..];
            continue;
        }
        break;
    }
    let Some(tag) = rest.strip_prefix(b"<") else { return false };
    let name_len = tag.iter().position(|b| b.is_ascii_whitespace() || matches!(b, b'>' | b'/')).unwrap_or(tag.len());
    let name = &tag[..name_len];
    let local = name.rsplit(|&b| b == b':').next().unwrap_or_default();
    local == b"Envelope" && name_len < tag.len()
}

/// The part's body bytes with the transfer encoding undone (mail-parser's own decoded text would
/// be charset-converted and lossy for text/* parts).
fn decode_body(entity: &[u8], part: &MessagePart<'_>) -> Result<Vec<u8>, String> {
    if part.is_encoding_problem {
        return Err("the IDAP part has a broken Content-Transfer-Encoding".to_string());
    }
    let raw = usize::try_from(part.offset_body)
        .ok()
        .zip(usize::try_from(part.offset_end).ok())
        .and_then(|(start, end)| entity.get(start..end))
        .ok_or_else(|| "the IDAP part's body lies outside the message".to_string())?;
    let body = match part.encoding {
        Encoding::Base64 => {
            base64_decode(raw).ok_or_else(|| "the IDAP part's base64 body does not decode".to_string())?
        }
        Encoding::QuotedPrintable => quoted_printable_decode(raw)
            .ok_or_else(|| "the IDAP part's quoted-printable body does not decode".to_string())?,
        Encoding::None => raw.to_vec(),
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("the IDAP part is empty".to_string());
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = "<?xml version=\"1.0\"?>\r\n<Envelope><Body>\u{e9}</Body></Envelope>";

    fn b64(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn single_text_xml_entity() {
        let entity = format!("Content-Type: text/xml; charset=utf-8\r\n\r\n{XML}");
        assert_eq!(idap_document(entity.as_bytes()).as_deref(), Ok(XML.as_bytes()));
    }

    #[test]
    fn application_xml_base64_in_multipart_is_not_charset_converted() {
        let latin1: Vec<u8> = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><a>\xe9</a>".to_vec();
        let entity = format!(
            "Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n--b1\r\nContent-Type: text/plain\r\n\r\nhello\r\n\
             --b1\r\nContent-Type: application/xml; charset=iso-8859-1\r\nContent-Transfer-Encoding: base64\r\n\r\n{}\r\n\
             --b1--\r\n",
            b64(&latin1)
        );
        assert_eq!(idap_document(entity.as_bytes()), Ok(latin1));
    }

    #[test]
    fn quoted_printable_text_xml() {
        let entity =
            "Content-Type: text/xml\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n<a x=3D\"1\">=C3=A9</a>";
        assert_eq!(idap_document(entity.as_bytes()).as_deref(), Ok("<a x=\"1\">\u{e9}</a>".as_bytes()));
    }

    #[test]
    fn attachment_named_idap_message() {
        let entity = format!(
            "Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n--b1\r\nContent-Type: text/plain\r\n\r\nsee attachment\r\n\
             --b1\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\
             Content-Disposition: attachment; filename=\"scott_IDAP_MESSAGE.txt\"\r\n\r\n{}\r\n--b1--\r\n",
            b64(XML.as_bytes())
        );
        assert_eq!(idap_document(entity.as_bytes()).as_deref(), Ok(XML.as_bytes()));
    }

    #[test]
    fn nested_multipart_is_walked() {
        let entity = format!(
            "Content-Type: multipart/mixed; boundary=\"o\"\r\n\r\n--o\r\nContent-Type: multipart/alternative; \
             boundary=\"i\"\r\n\r\n--i\r\nContent-Type: text/plain\r\n\r\nx\r\n--i\r\nContent-Type: text/xml\r\n\r\n{XML}\r\n\
             --i--\r\n\r\n--o--\r\n"
        );
        let got = idap_document(entity.as_bytes()).unwrap_or_default();
        assert_eq!(String::from_utf8_lossy(&got).trim_end(), XML);
    }

    #[test]
    fn text_plain_envelope() {
        let soap = "<?xml version=\"1.0\"?>\r\n<!-- a request -->\r\n<SOAP-ENV:Envelope xmlns:SOAP-ENV=\"x\"><Body/></SOAP-ENV:Envelope>";
        for entity in [format!("Content-Type: text/plain\r\n\r\n{XML}"), format!("\r\n{soap}")] {
            let got = idap_document(entity.as_bytes()).unwrap_or_default();
            assert!(is_envelope(&got), "{entity}");
        }
        // Text that is not an envelope is no request, and a text/html envelope is not one.
        for entity in [
            "Content-Type: text/plain\r\n\r\nSee <Envelope> below",
            "Content-Type: text/plain\r\n\r\n<Envelopes/>",
            "Content-Type: text/html\r\n\r\n<Envelope/>",
            "Content-Type: text/plain\r\n\r\n<!DOCTYPE x><Envelope/>",
        ] {
            assert!(idap_document(entity.as_bytes()).is_err(), "{entity}");
        }
        assert!(
            is_envelope(b"\xEF\xBB\xBF<Envelope/>") && is_envelope(b"<a:Envelope\n>") && !is_envelope(b"<Envelope")
        );
        // With a text/xml part too: two candidates, refused as ambiguous.
        let both = format!(
            "Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n{XML}\r\n\
             --b\r\nContent-Type: text/xml\r\n\r\n{XML}\r\n--b--\r\n"
        );
        assert!(idap_document(both.as_bytes()).is_err_and(|e| e.contains("2 candidate")));
    }

    #[test]
    fn none_or_two_candidates_are_refused() {
        let none = "Content-Type: text/plain\r\n\r\n<a/>";
        assert!(idap_document(none.as_bytes()).is_err_and(|e| e.contains("no IDAP document")));
        let two = "Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: text/xml\r\n\r\n<a/>\r\n\
                   --b\r\nContent-Type: application/xml\r\n\r\n<b/>\r\n--b--\r\n";
        assert!(idap_document(two.as_bytes()).is_err_and(|e| e.contains("2 candidate")));
        let empty = "Content-Type: text/xml\r\n\r\n\r\n";
        assert!(idap_document(empty.as_bytes()).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = idap_document(&bytes);
        }
    }
}
