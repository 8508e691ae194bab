//! XML character rules and escaping, shared by the IDAP codec ([`crate::idap`]) and the
//! payloads' stored form ([`crate::payload`]): which characters XML 1.0 allows, which
//! names can be written, and how text and attribute values are escaped.

/// XML 1.0's `Char`: what a document may contain, written or by character reference.
pub(crate) fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The first character of `text` that XML does not allow (C0 controls other than tab,
/// line feed and carriage return; U+FFFE, U+FFFF; UTF-8 excludes surrogates), with its
/// byte offset.
pub(crate) fn first_invalid_char(text: &str) -> Option<(usize, char)> {
    let bytes = text.as_bytes();
    // Branch-free per block, so that the common case (nothing found) is a fast scan.
    let control = |b: u8| b < 0x20 && b != b'\t' && b != b'\n' && b != b'\r';
    let suspect = bytes.chunks(64).any(|c| c.iter().fold(false, |acc, &b| acc | control(b)))
        || memchr::memmem::find(bytes, "\u{FFFE}".as_bytes()).is_some()
        || memchr::memmem::find(bytes, "\u{FFFF}".as_bytes()).is_some();
    if !suspect {
        return None;
    }
    text.char_indices().find(|(_, c)| !is_xml_char(*c))
}

/// Whether `n` can be written as an element or attribute name (letters, digits and
/// `_ : - . ·`, not starting with a digit or punctuation other than `_` and `:`).
pub(crate) fn is_xml_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.' | '\u{B7}'))
}

/// Escapes character data. `>` is escaped so that `]]>` cannot occur; `\r` as a character
/// reference so that a conforming parser's line-end normalisation keeps it.
pub(crate) fn escape_text(out: &mut String, s: &str) {
    escape_with(out, s, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'\r' => Some("&#13;"),
        _ => None,
    });
}

/// Escapes an attribute value for double quotes; whitespace other than the space is written
/// as character references so that attribute-value normalisation keeps it.
pub(crate) fn escape_attr(out: &mut String, s: &str) {
    escape_with(out, s, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' => Some("&quot;"),
        b'\t' => Some("&#9;"),
        b'\n' => Some("&#10;"),
        b'\r' => Some("&#13;"),
        _ => None,
    });
}

/// Writes `s`, replacing the ASCII bytes `escape` names; the runs between them (payload
/// hex, mostly) are copied whole.
fn escape_with(out: &mut String, s: &str, escape: impl Fn(u8) -> Option<&'static str>) {
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if let Some(replacement) = escape(b) {
            // `i` is at an ASCII byte, so both slices fall on character boundaries.
            out.push_str(s.get(start..i).unwrap_or_default());
            out.push_str(replacement);
            start = i + 1;
        }
    }
    out.push_str(s.get(start..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters() {
        for c in ['\t', '\n', '\r', ' ', 'é', '\u{D7FF}', '\u{E000}', '\u{FFFD}', '\u{10000}', '\u{10FFFF}'] {
            assert!(is_xml_char(c), "{c:?}");
        }
        for c in ['\0', '\u{1}', '\u{B}', '\u{1F}', '\u{FFFE}', '\u{FFFF}'] {
            assert!(!is_xml_char(c), "{c:?}");
        }
        assert_eq!(first_invalid_char("plain text, é, 中"), None);
        assert_eq!(first_invalid_char("ab\u{1}c"), Some((2, '\u{1}')));
        assert_eq!(first_invalid_char("é\u{FFFF}"), Some((2, '\u{FFFF}')));
    }

    #[test]
    fn names_and_escapes() {
        assert!(is_xml_name("p:ORDER_TYP") && is_xml_name("_a-b.c") && !is_xml_name("1a") && !is_xml_name(""));
        let mut out = String::new();
        escape_text(&mut out, "a<b>&\"c\"\r\n\t");
        assert_eq!(out, "a&lt;b&gt;&amp;\"c\"&#13;\n\t");
        out.clear();
        escape_attr(&mut out, "a<b>&\"c\"\r\n\t");
        assert_eq!(out, "a&lt;b&gt;&amp;&quot;c&quot;&#13;&#10;&#9;");
    }
}
