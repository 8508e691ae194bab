//! LDIF content records (RFC 2849) and the embedded directory backend built on them.
//!
//! The parser accepts what `slapadd` accepts from `ldap-fixtures/`: an optional
//! `version: 1` record, `#` comments (a folded comment stays a comment), line folding (a line
//! starting with one space continues the previous one), `attr: value`, `attr:: base64` (the
//! DN too), attribute options (`userCertificate;binary`), LF or CRLF line ends. Change
//! records (`changetype:`), controls and `attr:< URL` values are refused: the file is data,
//! and must never make aqgate read other files.

use std::collections::HashMap;

use base64::Engine as _;

use super::dn::{fold, is_under, normalize_dn};
use super::{Backend, DirectoryError, Entry, Query, Scope};

/// One LDIF content record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdifRecord {
    /// The DN as written (base64 decoded).
    pub dn: String,
    /// Attribute descriptions (lower-cased, options kept: `usercertificate;binary`) and values, in file order.
    pub attrs: Vec<(String, Vec<u8>)>,
}

/// Parses LDIF content records. Errors name the (1-based) line.
pub fn parse_ldif(text: &str) -> Result<Vec<LdifRecord>, String> {
    // 1. Unfold into logical lines, each with the number of its first physical line;
    //    `None` marks a record separator (an empty line).
    let mut logical: Vec<Option<(usize, String)>> = Vec::new();
    for (n, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let lineno = n + 1;
        if let Some(cont) = line.strip_prefix(' ') {
            match logical.last_mut() {
                Some(Some((_, prev))) => prev.push_str(cont),
                _ => {
                    if cont.trim().is_empty() {
                        // a line of spaces between records: treat as a separator
                        logical.push(None);
                    } else {
                        return Err(format!("line {lineno}: continuation line without a line to continue"));
                    }
                }
            }
        } else if line.is_empty() {
            logical.push(None);
        } else {
            logical.push(Some((lineno, line.to_string())));
        }
    }
    // 2. Drop comments, group into records.
    let mut records: Vec<Vec<(usize, String)>> = Vec::new();
    let mut current: Vec<(usize, String)> = Vec::new();
    for item in logical {
        match item {
            None => {
                if !current.is_empty() {
                    records.push(std::mem::take(&mut current));
                }
            }
            Some((_, l)) if l.starts_with('#') => {}
            Some(l) => current.push(l),
        }
    }
    if !current.is_empty() {
        records.push(current);
    }
    // 3. Parse each record.
    let mut out = Vec::new();
    for (idx, rec) in records.into_iter().enumerate() {
        let mut lines = rec.into_iter().peekable();
        if idx == 0
            && let Some((lineno, first)) = lines.peek()
            && first.to_ascii_lowercase().starts_with("version:")
        {
            let v = first["version:".len()..].trim();
            if v != "1" {
                return Err(format!("line {lineno}: unsupported LDIF version {v:?}"));
            }
            lines.next();
            if lines.peek().is_none() {
                continue;
            }
        }
        let Some((lineno, first)) = lines.next() else { continue };
        let (name, value) = parse_line(lineno, &first)?;
        if name != "dn" {
            return Err(format!("line {lineno}: a record must start with \"dn:\""));
        }
        let dn = String::from_utf8(value).map_err(|_| format!("line {lineno}: the DN is not UTF-8"))?;
        let mut attrs = Vec::new();
        for (lineno, line) in lines {
            let (name, value) = parse_line(lineno, &line)?;
            match name.as_str() {
                "changetype" | "control" => {
                    return Err(format!("line {lineno}: change records are not supported (content LDIF only)"));
                }
                "dn" => return Err(format!("line {lineno}: a second \"dn:\" in one record (missing empty line?)")),
                _ => attrs.push((name, value)),
            }
        }
        out.push(LdifRecord { dn, attrs });
    }
    Ok(out)
}

/// Parses one unfolded `attr: value` / `attr:: base64` line; returns the lower-cased attribute description.
fn parse_line(lineno: usize, line: &str) -> Result<(String, Vec<u8>), String> {
    let Some(colon) = line.find(':') else {
        return Err(format!("line {lineno}: expected \"attribute: value\""));
    };
    let name = &line[..colon];
    let valid_name = !name.is_empty()
        && name
            .split(';')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if !valid_name {
        return Err(format!("line {lineno}: bad attribute description {name:?}"));
    }
    let rest = &line[colon + 1..];
    let value = if let Some(b64) = rest.strip_prefix(':') {
        let cleaned: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(cleaned.as_bytes())
            .map_err(|e| format!("line {lineno}: bad base64 value of {name:?}: {e}"))?
    } else if rest.starts_with('<') {
        return Err(format!("line {lineno}: URL values (\"{name}:<\") are not supported"));
    } else {
        rest.trim_start_matches(' ').as_bytes().to_vec()
    };
    Ok((name.to_ascii_lowercase(), value))
}

/// The embedded directory: the entries of an LDIF file, searched in memory with the same
/// matching rules the LDAP schema declares (case-insensitive `cn`, `uid`, `mail`, DNs).
pub struct LdifDirectory {
    base: Vec<String>,
    entries: Vec<IndexedEntry>,
    by_dn: HashMap<Vec<String>, usize>,
}

struct IndexedEntry {
    norm_dn: Vec<String>,
    entry: Entry,
}

impl LdifDirectory {
    /// Builds the directory from LDIF text; `base_dn` limits subtree searches ("" = everything).
    pub fn from_ldif(text: &str, base_dn: &str) -> Result<Self, DirectoryError> {
        let base = normalize_dn(base_dn).map_err(|e| DirectoryError::Config(format!("base DN: {e}")))?;
        let records = parse_ldif(text).map_err(|e| DirectoryError::Config(format!("directory LDIF: {e}")))?;
        let mut entries = Vec::with_capacity(records.len());
        let mut by_dn = HashMap::new();
        for rec in records {
            let norm_dn =
                normalize_dn(&rec.dn).map_err(|e| DirectoryError::Config(format!("directory LDIF: DN {e}")))?;
            if by_dn.insert(norm_dn.clone(), entries.len()).is_some() {
                return Err(DirectoryError::Config(format!("directory LDIF: duplicate entry {:?}", rec.dn)));
            }
            let mut attrs: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
            for (name, value) in rec.attrs {
                attrs.entry(name).or_default().push(value);
            }
            entries.push(IndexedEntry { norm_dn, entry: Entry { dn: rec.dn, attrs } });
        }
        Ok(LdifDirectory { base, entries, by_dn })
    }

    /// Number of entries loaded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if the file held no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The server-side half of an equality match: `caseIgnoreMatch`-like for every attribute
/// (a superset of what each lookup accepts; the shared lookup code narrows it, exactly as it
/// narrows what an LDAP server returns).
fn matches(entry: &Entry, q: &Query) -> bool {
    if let Some(oc) = q.object_class
        && !entry.values("objectclass").any(|v| std::str::from_utf8(v).is_ok_and(|v| v.eq_ignore_ascii_case(oc)))
    {
        return false;
    }
    match &q.equals {
        None => true,
        Some((attr, wanted)) => {
            let wanted = fold(wanted);
            entry.values(attr).any(|v| std::str::from_utf8(v).is_ok_and(|v| fold(v) == wanted))
        }
    }
}

#[async_trait::async_trait]
impl Backend for LdifDirectory {
    async fn search(&self, q: &Query) -> Result<Vec<Entry>, DirectoryError> {
        let Ok(base) = normalize_dn(&q.base) else { return Ok(Vec::new()) };
        let found = match q.scope {
            Scope::Base => {
                self.by_dn.get(&base).map(|&i| &self.entries[i]).into_iter().filter(|e| matches(&e.entry, q)).collect()
            }
            Scope::Subtree => self
                .entries
                .iter()
                .filter(|e| is_under(&e.norm_dn, &base) && is_under(&e.norm_dn, &self.base) && matches(&e.entry, q))
                .collect::<Vec<_>>(),
        };
        Ok(found.into_iter().map(|e| e.entry.clone()).collect())
    }

    fn invalidate(&self) {}

    fn base_dn(&self) -> String {
        self.base.join(",")
    }
}
