//! The directory: queue names, agent aliases, notification aliases, mail addresses and
//! certificates, resolved through LDAP (a real server) or an embedded LDIF file.
//!
//! # Design
//!
//! - [`Directory`] is the one interface the engine and the mail path see. [`open`] picks the
//!   backend: [`LdapDirectory`] when a URL is configured, else [`LdifDirectory`] on
//!   `ldif_path` or, by default, on `ldap-fixtures/directory.ldif` compiled into the binary.
//! - Both backends implement one private primitive, [`Backend::search`] (an equality search
//!   with an optional objectClass, base or subtree scope). Every operation (`resolve_queue`,
//!   …) is written once, over that primitive, in this file: the LDIF backend cannot drift
//!   from the LDAP one. Results a server returns are checked again here with aqgate's own
//!   matching rule, so a lenient server match (whitespace folding, a future schema change)
//!   never widens what a name resolves to.
//! - Names are matched by value, never by pattern: filter values are escaped with
//!   [`escape_filter_value`] (RFC 4515) and DN values with [`escape_dn_value`] (RFC 4514), so
//!   `*`, `(`, `)`, `\`, NUL, `,`, `=` and non-ASCII only ever match themselves.
//! - Name matching: queue names, agent aliases, agent names (`uid`) and mail addresses are
//!   case-insensitive (Oracle identifiers are upper-case; `mail` is `caseIgnoreIA5Match`);
//!   notification aliases and everything else match exactly. "Case-insensitive" means Unicode
//!   lower-casing of both sides ([`dn::fold`]); no whitespace folding.
//! - Failures are values a caller can act on ([`DirectoryError`]): `NotFound` (permanent,
//!   names what), `Unavailable` (temporary: unreachable, too slow, server busy — retry later),
//!   `Malformed` (the directory holds something unusable, e.g. a `userCertificate` that is
//!   not a DER X.509 certificate — never reported as "no certificate"), `Config`.
//! - LDAP: one multiplexed connection, opened lazily and re-opened after any failure (so the
//!   service recovers when the server comes back, without restart). Every operation —
//!   connect, TLS, bind, search, one retry on a stale connection — runs under one deadline,
//!   `timeout`: a dead or silent server gives `Unavailable` after at most `timeout`, never a
//!   hang. Plain `ldap://` is allowed to loopback hosts only; elsewhere use `ldaps://` or
//!   StartTLS (`ldap://host/????!StartTLS`). The bind password is never logged (the
//!   config's `Debug` redacts it). Successful search results are cached for `cache_ttl`
//!   (negative answers too); [`Directory::invalidate`] drops the cache.
//!
//! # DIT (see `ldap-fixtures/README.md`)
//!
//! Subtree searches from `base_dn`: queues `(&(objectClass=aqgateQueue)(cn=NAME))` →
//! `aqgateDatabaseQueueName`; agent aliases `(&(objectClass=aqgateAgentAlias)(cn=ALIAS))` →
//! `aqgateAgentName`, `aqgateAgentAddress`, `aqgateAgentProtocol`; notification aliases
//! `(&(objectClass=aqgateNotificationAlias)(cn=ALIAS))` → `aqgateNotificationTarget`;
//! people `(&(objectClass=inetOrgPerson)(uid=AGENT))` → `mail`; certificates are
//! `userCertificate;binary` of the entry named by DN (base search) or of the entries with
//! `(mail=ADDRESS)`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub mod dn;
mod ldap;
pub mod ldif;
#[cfg(test)]
mod tests;

pub use dn::escape_dn_value;
pub use ldap::LdapDirectory;
pub use ldif::LdifDirectory;

/// The directory compiled into the binary: the demo data of `ldap-fixtures/`.
pub const EMBEDDED_LDIF: &str = include_str!("../../../ldap-fixtures/directory.ldif");

/// The base DN of the embedded directory.
pub const DEFAULT_BASE_DN: &str = "dc=aqgate,dc=example";

pub use aqgate_core::directory::{AgentEntry, CertificateLocation, Directory, DirectoryError};

/// How to reach the directory.
#[derive(Clone)]
pub struct DirectoryConfig {
    /// `ldaps://host[:port]`, `ldap://host[:port]/????!StartTLS`, or plain `ldap://` to a
    /// loopback host. `None`: the embedded LDIF backend.
    pub url: Option<String>,
    /// Where subtree searches start.
    pub base_dn: String,
    /// Simple bind DN; `None` binds anonymously.
    pub bind_dn: Option<String>,
    /// Simple bind password (the caller reads it from the environment or a file). Never logged.
    pub bind_password: Option<String>,
    /// The LDIF file of the embedded backend (default: the compiled-in `directory.ldif`).
    pub ldif_path: Option<PathBuf>,
    /// Upper bound for one whole operation (connect, TLS, bind, search, retry).
    pub timeout: Duration,
    /// How long search results are reused; zero disables the cache.
    pub cache_ttl: Duration,
    /// PEM file of the CA certificates trusted for the server (default: the system's).
    pub ca_file: Option<PathBuf>,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            url: None,
            base_dn: DEFAULT_BASE_DN.to_string(),
            bind_dn: None,
            bind_password: None,
            ldif_path: None,
            timeout: Duration::from_secs(5),
            cache_ttl: Duration::from_secs(60),
            ca_file: None,
        }
    }
}

impl std::fmt::Debug for DirectoryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryConfig")
            .field("url", &self.url)
            .field("base_dn", &self.base_dn)
            .field("bind_dn", &self.bind_dn)
            .field("bind_password", &self.bind_password.as_ref().map(|_| "<redacted>"))
            .field("ldif_path", &self.ldif_path)
            .field("timeout", &self.timeout)
            .field("cache_ttl", &self.cache_ttl)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Opens the configured directory: LDAP if `url` is set (connecting lazily, so a directory
/// that is down at start gives `Unavailable` later, not a failed start), else the LDIF file
/// (`ldif_path`, or the embedded demo directory). Configuration errors are reported here.
pub async fn open(cfg: &DirectoryConfig) -> Result<Arc<dyn Directory>, DirectoryError> {
    if cfg.url.is_some() {
        return Ok(Arc::new(LdapDirectory::new(cfg)?));
    }
    let dir = match &cfg.ldif_path {
        Some(path) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .map_err(|e| DirectoryError::Config(format!("cannot read {}: {e}", path.display())))?;
            LdifDirectory::from_ldif(&text, &cfg.base_dn)?
        }
        None => LdifDirectory::from_ldif(EMBEDDED_LDIF, &cfg.base_dn)?,
    };
    Ok(Arc::new(dir))
}

/// Escapes a value for an LDAP filter (RFC 4515 section 3): `*`, `(`, `)`, `\`, NUL, every
/// other control character and every non-ASCII byte become `\XX`, so the value can only
/// ever be an equality assertion on itself.
pub fn escape_filter_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        match b {
            b'*' | b'(' | b')' | b'\\' | 0..=0x1f | 0x7f..=0xff => out.push_str(&format!("\\{b:02x}")),
            _ => out.push(char::from(b)),
        }
    }
    out
}

// ---- the shared implementation ---------------------------------------------------------------

/// One entry as both backends return it: attribute descriptions lower-cased (options kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub dn: String,
    pub attrs: HashMap<String, Vec<Vec<u8>>>,
}

impl Entry {
    /// Values of an attribute, with any options (`;binary`); `name` lower-case.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Vec<u8>> + 'a {
        self.attrs.iter().filter(move |(k, _)| k.split(';').next() == Some(name)).flat_map(|(_, v)| v.iter())
    }

    /// The first value of an attribute as text.
    fn text(&self, name: &str) -> Result<Option<String>, DirectoryError> {
        match self.values(name).next() {
            None => Ok(None),
            Some(v) => String::from_utf8(v.clone())
                .map(Some)
                .map_err(|_| DirectoryError::Malformed(format!("{name} of {:?} is not UTF-8", self.dn))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    Base,
    Subtree,
}

/// An equality search: `(&(objectClass=OC)(ATTR=VALUE))`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Query {
    pub base: String,
    pub scope: Scope,
    pub object_class: Option<&'static str>,
    /// attribute (lower-case) and the value it must equal
    pub equals: Option<(&'static str, String)>,
    pub attrs: &'static [&'static str],
}

impl Query {
    /// The RFC 4515 filter string of the query.
    pub fn filter(&self) -> String {
        let oc = self.object_class.map(|oc| format!("(objectClass={})", escape_filter_value(oc)));
        let eq = self.equals.as_ref().map(|(a, v)| format!("({a}={})", escape_filter_value(v)));
        match (oc, eq) {
            (Some(oc), Some(eq)) => format!("(&{oc}{eq})"),
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => "(objectClass=*)".to_string(),
        }
    }
}

/// What a backend provides; the operations are written once, over it.
#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync {
    /// Entries matching `q` (an empty list if none, or if the base does not exist).
    async fn search(&self, q: &Query) -> Result<Vec<Entry>, DirectoryError>;
    fn invalidate(&self);
    fn base_dn(&self) -> String;
}

#[derive(Clone, Copy)]
enum Matching {
    CaseIgnore,
    Exact,
}

fn value_matches(v: &[u8], wanted: &str, m: Matching) -> bool {
    match (std::str::from_utf8(v), m) {
        (Ok(v), Matching::Exact) => v == wanted,
        (Ok(v), Matching::CaseIgnore) => dn::fold(v) == dn::fold(wanted),
        (Err(_), _) => false,
    }
}

/// Subtree search for `(&(objectClass=oc)(attr=value))`, narrowed to entries whose `attr`
/// really matches `value` under `m`.
async fn lookup<B: Backend + ?Sized>(
    b: &B,
    oc: &'static str,
    attr: &'static str,
    value: &str,
    m: Matching,
    attrs: &'static [&'static str],
) -> Result<Vec<Entry>, DirectoryError> {
    let q = Query {
        base: b.base_dn(),
        scope: Scope::Subtree,
        object_class: Some(oc),
        equals: Some((attr, value.to_string())),
        attrs,
    };
    let mut found = b.search(&q).await?;
    found.retain(|e| e.values(attr).any(|v| value_matches(v, value, m)));
    Ok(found)
}

/// Exactly one entry, or NotFound / Malformed (ambiguous).
fn one(mut found: Vec<Entry>, what: &str) -> Result<Entry, DirectoryError> {
    match found.len() {
        0 => Err(DirectoryError::NotFound(what.to_string())),
        1 => Ok(found.remove(0)),
        n => Err(DirectoryError::Malformed(format!("{n} directory entries for {what}"))),
    }
}

fn required(e: &Entry, attr: &str) -> Result<String, DirectoryError> {
    e.text(attr)?.ok_or_else(|| DirectoryError::Malformed(format!("{:?} has no {attr}", e.dn)))
}

async fn resolve_queue<B: Backend + ?Sized>(b: &B, name: &str) -> Result<String, DirectoryError> {
    let found = lookup(b, "aqgateQueue", "cn", name, Matching::CaseIgnore, &["cn", "aqgateDatabaseQueueName"]).await?;
    let e = one(found, &format!("queue {name:?}"))?;
    let db = required(&e, "aqgatedatabasequeuename")?;
    if db.is_empty() || db.chars().any(char::is_control) {
        return Err(DirectoryError::Malformed(format!("{:?}: bad aqgateDatabaseQueueName {db:?}", e.dn)));
    }
    Ok(db)
}

async fn resolve_agent_alias<B: Backend + ?Sized>(b: &B, alias: &str) -> Result<AgentEntry, DirectoryError> {
    const ATTRS: &[&str] = &["cn", "aqgateAgentName", "aqgateAgentAddress", "aqgateAgentProtocol"];
    let found = lookup(b, "aqgateAgentAlias", "cn", alias, Matching::CaseIgnore, ATTRS).await?;
    let e = one(found, &format!("agent alias {alias:?}"))?;
    let name = required(&e, "aqgateagentname")?;
    let address = e.text("aqgateagentaddress")?;
    let protocol = match e.text("aqgateagentprotocol")? {
        None => None,
        Some(p) => Some(p.trim().parse::<i32>().map_err(|_| {
            DirectoryError::Malformed(format!("{:?}: aqgateAgentProtocol {p:?} is not an integer", e.dn))
        })?),
    };
    Ok(AgentEntry { name, address, protocol })
}

/// Checks that `der` is exactly one DER X.509 certificate.
pub fn check_certificate(der: &[u8]) -> Result<(), String> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], _)) => Ok(()),
        Ok((rest, _)) => Err(format!("{} bytes after the certificate", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

fn entry_certificates(e: &Entry, out: &mut Vec<Vec<u8>>) -> Result<(), DirectoryError> {
    for der in e.values("usercertificate") {
        check_certificate(der).map_err(|why| {
            DirectoryError::Malformed(format!("userCertificate of {:?} is not a DER X.509 certificate: {why}", e.dn))
        })?;
        out.push(der.clone());
    }
    Ok(())
}

async fn certificates<B: Backend + ?Sized>(b: &B, at: &CertificateLocation) -> Result<Vec<Vec<u8>>, DirectoryError> {
    const ATTRS: &[&str] = &["userCertificate;binary"];
    let mut certs = Vec::new();
    match at {
        CertificateLocation::Dn(dn) => {
            if let Err(why) = dn::parse_dn(dn) {
                return Err(DirectoryError::NotFound(format!("certificate location: not a DN: {why}")));
            }
            let q = Query { base: dn.clone(), scope: Scope::Base, object_class: None, equals: None, attrs: ATTRS };
            let e = one(b.search(&q).await?, &format!("certificate location {dn:?}"))?;
            entry_certificates(&e, &mut certs)?;
            if certs.is_empty() {
                return Err(DirectoryError::NotFound(format!("no userCertificate at {dn:?}")));
            }
        }
        CertificateLocation::Mail(addr) => {
            const MAIL_ATTRS: &[&str] = &["mail", "userCertificate;binary"];
            let found = lookup(b, "inetOrgPerson", "mail", addr, Matching::CaseIgnore, MAIL_ATTRS).await?;
            if found.is_empty() {
                return Err(DirectoryError::NotFound(format!("no entry with mail {addr:?}")));
            }
            for e in &found {
                entry_certificates(e, &mut certs)?;
            }
            if certs.is_empty() {
                return Err(DirectoryError::NotFound(format!("no userCertificate for mail {addr:?}")));
            }
        }
    }
    Ok(certs)
}

async fn mail_address<B: Backend + ?Sized>(b: &B, agent: &str) -> Result<Option<String>, DirectoryError> {
    let found = lookup(b, "inetOrgPerson", "uid", agent, Matching::CaseIgnore, &["uid", "mail"]).await?;
    let e = one(found, &format!("agent {agent:?}"))?;
    e.text("mail")
}

async fn agents_with_mail<B: Backend + ?Sized>(b: &B, addr: &str) -> Result<Vec<String>, DirectoryError> {
    let found = lookup(b, "inetOrgPerson", "mail", addr, Matching::CaseIgnore, &["uid", "mail"]).await?;
    let mut uids = Vec::new();
    for e in &found {
        for uid in e.values("uid") {
            let uid = String::from_utf8(uid.clone())
                .map_err(|_| DirectoryError::Malformed(format!("uid of {:?} is not UTF-8", e.dn)))?;
            uids.push(uid);
        }
    }
    Ok(uids)
}

async fn resolve_notification_alias<B: Backend + ?Sized>(b: &B, alias: &str) -> Result<String, DirectoryError> {
    const ATTRS: &[&str] = &["cn", "aqgateNotificationTarget"];
    let found = lookup(b, "aqgateNotificationAlias", "cn", alias, Matching::Exact, ATTRS).await?;
    let e = one(found, &format!("notification alias {alias:?}"))?;
    let target = required(&e, "aqgatenotificationtarget")?;
    let is_mailto = target.get(..7).is_some_and(|p| p.eq_ignore_ascii_case("mailto:"));
    if !is_mailto || target.len() == 7 || target.chars().any(char::is_control) {
        return Err(DirectoryError::Malformed(format!(
            "{:?}: notification target {target:?} is not a mailto: URL",
            e.dn
        )));
    }
    Ok(target)
}

macro_rules! directory_impl {
    ($ty:ty) => {
        #[async_trait::async_trait]
        impl Directory for $ty {
            async fn resolve_queue(&self, name: &str) -> Result<String, DirectoryError> {
                resolve_queue(self, name).await
            }
            async fn resolve_agent_alias(&self, alias: &str) -> Result<AgentEntry, DirectoryError> {
                resolve_agent_alias(self, alias).await
            }
            async fn certificates(&self, at: &CertificateLocation) -> Result<Vec<Vec<u8>>, DirectoryError> {
                certificates(self, at).await
            }
            async fn mail_address(&self, agent: &str) -> Result<Option<String>, DirectoryError> {
                mail_address(self, agent).await
            }
            async fn agents_with_mail(&self, addr: &str) -> Result<Vec<String>, DirectoryError> {
                agents_with_mail(self, addr).await
            }
            async fn resolve_notification_alias(&self, alias: &str) -> Result<String, DirectoryError> {
                resolve_notification_alias(self, alias).await
            }
            fn invalidate(&self) {
                Backend::invalidate(self)
            }
        }
    };
}

directory_impl!(LdifDirectory);
directory_impl!(LdapDirectory);
