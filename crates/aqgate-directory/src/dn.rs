//! Distinguished names (RFC 4514): escaping a value, parsing a DN string, and the normalised
//! form the LDIF backend compares DNs by.
//!
//! Every attribute aqgate's DIT names entries by (`dc`, `ou`, `cn`, `uid`) matches
//! case-insensitively, so the normalised form folds the case of values as well as types.

/// Escapes one attribute value for use in a DN string (RFC 4514 section 2.4).
///
/// `"`, `+`, `,`, `;`, `<`, `>`, `\` and `=` get a backslash; a leading `#` or space and a
/// trailing space are escaped; NUL and other control characters become `\XX`. Other
/// characters, non-ASCII included, are kept as UTF-8. The result names exactly `s`: parsing
/// `cn=<escaped>` gives back one RDN whose value is `s`.
pub fn escape_dn_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let last = s.chars().count().saturating_sub(1);
    for (i, c) in s.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' | '=' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// One attribute type and value of an RDN: the type lower-cased, the value unescaped.
pub type Ava = (String, String);

/// Parses a DN string into its RDNs (each a list of type/value pairs), leftmost first.
///
/// Accepts RFC 4514 strings plus the leniencies OpenLDAP accepts: spaces around `,`, `+` and
/// `=`, and `;` as an RDN separator. `#`-hex (BER) values are accepted when they decode to
/// UTF-8. The empty string is the empty (root) DN.
pub fn parse_dn(dn: &str) -> Result<Vec<Vec<Ava>>, String> {
    let bytes = dn.as_bytes();
    let mut rdns: Vec<Vec<Ava>> = Vec::new();
    if dn.trim().is_empty() {
        return Ok(rdns);
    }
    let mut i = 0;
    let mut rdn: Vec<Ava> = Vec::new();
    loop {
        // attribute type
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' {
            i += 1;
        }
        if i >= bytes.len() {
            return Err(format!("{dn:?}: missing '=' in RDN"));
        }
        let ty = dn[start..i].trim();
        let ty_ok = !ty.is_empty()
            && (ty.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && ty.as_bytes()[0].is_ascii_alphabetic()
                || ty.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        if !ty_ok {
            return Err(format!("{dn:?}: bad attribute type {ty:?}"));
        }
        i += 1; // '='
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        // attribute value
        let mut value: Vec<u8> = Vec::new();
        if i < bytes.len() && bytes[i] == b'#' {
            i += 1;
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
                i += 1;
            }
            let hex = &dn[start..i];
            if hex.is_empty() || !hex.len().is_multiple_of(2) {
                return Err(format!("{dn:?}: bad #hex value"));
            }
            let der: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|k| u8::from_str_radix(&hex[k..k + 2], 16))
                .collect::<Result<_, _>>()
                .map_err(|_| format!("{dn:?}: bad #hex value"))?;
            // A BER string: tag, short length, contents.
            if der.len() < 2 || usize::from(der[1]) != der.len() - 2 || der[1] >= 0x80 {
                return Err(format!("{dn:?}: unsupported #hex value"));
            }
            value.extend_from_slice(&der[2..]);
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
        } else {
            // trailing unescaped spaces are not part of the value
            let mut keep = 0usize;
            while i < bytes.len() {
                let b = bytes[i];
                match b {
                    b'\\' => {
                        let next = bytes.get(i + 1).copied().ok_or_else(|| format!("{dn:?}: dangling '\\'"))?;
                        if next.is_ascii_hexdigit() {
                            let hex = dn.get(i + 1..i + 3).ok_or_else(|| format!("{dn:?}: bad \\XX escape"))?;
                            let v = u8::from_str_radix(hex, 16).map_err(|_| format!("{dn:?}: bad \\XX escape"))?;
                            value.push(v);
                            i += 3;
                        } else if b" \"#+,;<=>\\".contains(&next) {
                            value.push(next);
                            i += 2;
                        } else {
                            return Err(format!("{dn:?}: bad escape"));
                        }
                        keep = value.len();
                    }
                    b',' | b'+' | b';' => break,
                    b'"' | b'<' | b'>' | 0 => return Err(format!("{dn:?}: unescaped special character")),
                    b' ' => {
                        value.push(b);
                        i += 1;
                    }
                    _ => {
                        value.push(b);
                        i += 1;
                        keep = value.len();
                    }
                }
            }
            value.truncate(keep);
        }
        let value = String::from_utf8(value).map_err(|_| format!("{dn:?}: value is not UTF-8"))?;
        rdn.push((ty.to_ascii_lowercase(), value));
        if i >= bytes.len() {
            rdns.push(std::mem::take(&mut rdn));
            break;
        }
        match bytes[i] {
            b'+' => {}
            _ => rdns.push(std::mem::take(&mut rdn)),
        }
        i += 1;
        if i >= bytes.len() {
            return Err(format!("{dn:?}: trailing separator"));
        }
    }
    Ok(rdns)
}

/// The normalised form of a parsed DN: types and values case-folded, multi-valued RDNs
/// sorted. Two DNs name the same entry (in aqgate's DIT) iff their normalised forms are equal.
pub fn normalize(rdns: &[Vec<Ava>]) -> Vec<String> {
    rdns.iter()
        .map(|rdn| {
            let mut avas: Vec<String> =
                rdn.iter().map(|(t, v)| format!("{}={}", t, escape_dn_value(&fold(v)))).collect();
            avas.sort();
            avas.join("+")
        })
        .collect()
}

/// Parses and normalises a DN string.
pub fn normalize_dn(dn: &str) -> Result<Vec<String>, String> {
    parse_dn(dn).map(|r| normalize(&r))
}

pub use aqgate_core::directory::fold;

/// True if normalised `dn` is `base` or below it.
pub fn is_under(dn: &[String], base: &[String]) -> bool {
    dn.len() >= base.len() && dn[dn.len() - base.len()..] == *base
}
