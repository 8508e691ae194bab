//! A payload shown as text: RAW as hex (the first 64 KiB; the download has it whole),
//! every other kind as its stored XML, pretty-printed when it parses (up to 1 MiB), else
//! as it is. The template escapes whatever this returns.

use aqgate_proto::payload::PayloadKind;

/// RAW bytes shown as hex at most.
const HEX_SHOWN: usize = 64 * 1024;
/// XML pretty-printed up to this size; larger, shown as stored.
const PRETTY_MAX: usize = 1 << 20;

/// (what the text is, the text).
pub(crate) fn show(kind: &PayloadKind, bytes: &[u8]) -> (&'static str, String) {
    if *kind == PayloadKind::Raw {
        let shown = &bytes[..bytes.len().min(HEX_SHOWN)];
        let mut hex = String::with_capacity(shown.len() * 3);
        for (i, line) in shown.chunks(32).enumerate() {
            if i > 0 {
                hex.push('\n');
            }
            hex.push_str(&hex::encode_upper(line));
        }
        let what = if bytes.len() > HEX_SHOWN { "RAW (hex, the first 64 KiB)" } else { "RAW (hex)" };
        return (what, hex);
    }
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= PRETTY_MAX
        && let Some(p) = pretty(&text)
    {
        return ("XML", p);
    }
    ("XML (as stored)", text.into_owned())
}

/// `text` re-indented, or `None` when it does not parse.
fn pretty(text: &str) -> Option<String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(text);
    reader.config_mut().trim_text(true);
    let mut writer = quick_xml::Writer::new_with_indent(Vec::new(), b' ', 2);
    loop {
        match reader.read_event().ok()? {
            Event::Eof => break,
            Event::DocType(_) => return None,
            e => writer.write_event(e).ok()?,
        }
    }
    String::from_utf8(writer.into_inner()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_as_hex_and_xml_pretty() {
        assert_eq!(show(&PayloadKind::Raw, b"<a>"), ("RAW (hex)", "3C613E".to_string()));
        let (what, text) = show(&PayloadKind::Xml, b"<a><b>x &lt;y</b></a>");
        assert_eq!(what, "XML");
        assert_eq!(text, "<a>\n  <b>x &lt;y</b>\n</a>");
        assert_eq!(show(&PayloadKind::Xml, b"<a><b></a>").0, "XML (as stored)");
    }
}
