//! The LDAP backend (ldap3 over tokio, rustls with the ring provider).
//!
//! One connection, shared by all operations (LDAP multiplexes requests by message id),
//! opened on first use and dropped after any connection-level failure; the next operation
//! opens a new one. Each operation runs under one deadline (`timeout`), covering connect,
//! TLS, bind, the search, and one retry when a reused connection turns out to be dead (the
//! server restarted), so callers see `Unavailable` within `timeout`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, LdapError, ResultEntry, SearchEntry};

use super::{Backend, DirectoryConfig, DirectoryError, Entry, Query, Scope};

/// How to connect, fixed at configuration time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `ldap://host:port` or `ldaps://host:port`, as ldap3 takes it.
    pub url: String,
    pub tls: Transport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Plain,
    StartTls,
    Ldaps,
}

/// Parses and checks an LDAP URL: `ldaps://`, `ldap://…/????!StartTLS` (or the StartTLS OID
/// `1.3.6.1.4.1.1466.20037` as extension), or plain `ldap://` to a loopback host only.
pub(crate) fn parse_url(url: &str) -> Result<Endpoint, DirectoryError> {
    let bad = |why: &str| DirectoryError::Config(format!("LDAP URL {url:?}: {why}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("expected ldap:// or ldaps://"))?;
    let scheme = scheme.to_ascii_lowercase();
    let (hostport, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    if hostport.is_empty() || hostport.contains('@') || hostport.contains('?') {
        return Err(bad("expected a host"));
    }
    let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad("expected a host"));
    }
    if let Some(p) = port
        && p.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(bad("bad port"));
    }
    // dn?attributes?scope?filter?extensions: only the extensions matter here.
    let mut parts = tail.splitn(5, '?');
    let dn = parts.next().unwrap_or("");
    let exts = parts.nth(3).unwrap_or("");
    if !dn.is_empty() {
        return Err(bad("a DN in the URL is not supported (use base_dn)"));
    }
    let mut starttls = false;
    for ext in exts.split(',').filter(|e| !e.is_empty()) {
        let name = ext.trim_start_matches('!');
        if name.eq_ignore_ascii_case("StartTLS") || name == "1.3.6.1.4.1.1466.20037" {
            starttls = true;
        } else if ext.starts_with('!') {
            return Err(bad(&format!("unsupported critical extension {ext:?}")));
        }
    }
    let loopback = host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let tls = match scheme.as_str() {
        "ldaps" if starttls => return Err(bad("StartTLS on ldaps://")),
        "ldaps" => Transport::Ldaps,
        "ldap" if starttls => Transport::StartTls,
        "ldap" if loopback => Transport::Plain,
        "ldap" => {
            return Err(bad(
                "plain ldap:// is allowed to loopback hosts only; use ldaps:// or StartTLS (ldap://host/????!StartTLS)",
            ));
        }
        _ => return Err(bad("expected ldap:// or ldaps://")),
    };
    let hostport = if host.contains(':') {
        format!("[{host}]{}", port.map(|p| format!(":{p}")).unwrap_or_default())
    } else {
        hostport.to_string()
    };
    Ok(Endpoint { url: format!("{scheme}://{hostport}"), tls })
}

/// The LDAP backend. Cheap to share (`Arc`); connects lazily.
pub struct LdapDirectory {
    endpoint: Endpoint,
    tls_config: Option<Arc<rustls::ClientConfig>>,
    base_dn: String,
    bind: Option<(String, String)>,
    timeout: Duration,
    cache_ttl: Duration,
    conn: tokio::sync::Mutex<Option<(u64, Ldap)>>,
    generation: std::sync::atomic::AtomicU64,
    cache: Mutex<HashMap<Query, (Instant, Vec<Entry>)>>,
}

impl std::fmt::Debug for LdapDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LdapDirectory")
            .field("url", &self.endpoint.url)
            .field("tls", &self.endpoint.tls)
            .field("base_dn", &self.base_dn)
            .field("bind_dn", &self.bind.as_ref().map(|(dn, _)| dn))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn load_roots(path: &std::path::Path) -> Result<rustls::RootCertStore, DirectoryError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let cfg = |why: String| DirectoryError::Config(format!("CA file {}: {why}", path.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| cfg(e.to_string()))? {
        let cert = cert.map_err(|e| cfg(e.to_string()))?;
        roots.add(cert).map_err(|e| cfg(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(cfg("no certificates".to_string()));
    }
    Ok(roots)
}

impl LdapDirectory {
    /// Checks the configuration (URL, TLS, CA file, bind, base DN); connects on first use.
    pub fn new(cfg: &DirectoryConfig) -> Result<Self, DirectoryError> {
        let url = cfg.url.as_deref().ok_or_else(|| DirectoryError::Config("no LDAP URL".to_string()))?;
        let endpoint = parse_url(url)?;
        super::dn::parse_dn(&cfg.base_dn).map_err(|e| DirectoryError::Config(format!("base DN: {e}")))?;
        if cfg.timeout.is_zero() {
            return Err(DirectoryError::Config("timeout must be positive".to_string()));
        }
        let bind = match (&cfg.bind_dn, &cfg.bind_password) {
            (Some(dn), Some(pw)) if !pw.is_empty() => Some((dn.clone(), pw.clone())),
            (Some(_), _) => {
                // An empty password would be an unauthenticated bind (RFC 4513 5.1.2): refuse.
                return Err(DirectoryError::Config("bind_dn is set but the bind password is missing".to_string()));
            }
            (None, Some(_)) => return Err(DirectoryError::Config("a bind password without bind_dn".to_string())),
            (None, None) => None,
        };
        let tls_config = match (&cfg.ca_file, endpoint.tls) {
            (Some(_), Transport::Plain) => {
                return Err(DirectoryError::Config("ca_file is set but the LDAP URL does not use TLS".to_string()));
            }
            (Some(path), _) => {
                let roots = load_roots(path)?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| DirectoryError::Config(format!("TLS: {e}")))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Some(Arc::new(config))
            }
            (None, _) => None,
        };
        Ok(LdapDirectory {
            endpoint,
            tls_config,
            base_dn: cfg.base_dn.clone(),
            bind,
            timeout: cfg.timeout,
            cache_ttl: cfg.cache_ttl,
            conn: tokio::sync::Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn settings(&self, remaining: Duration) -> LdapConnSettings {
        let mut s = LdapConnSettings::new().set_conn_timeout(remaining);
        if self.endpoint.tls == Transport::StartTls {
            s = s.set_starttls(true);
        }
        if let Some(c) = &self.tls_config {
            s = s.set_config(c.clone());
        }
        s
    }

    /// The shared connection, opened (and bound) if there is none. Returns its generation
    /// and whether it was reused.
    async fn connection(&self, deadline: Instant) -> Result<(u64, Ldap, bool), DirectoryError> {
        let mut guard = self.conn.lock().await;
        if let Some((generation, ldap)) = guard.as_mut()
            && !ldap.is_closed()
        {
            return Ok((*generation, ldap.clone(), true));
        }
        *guard = None;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (conn, mut ldap) = LdapConnAsync::with_settings(self.settings(remaining), &self.endpoint.url)
            .await
            .map_err(|e| self.unavailable("connect", &e))?;
        let url = self.endpoint.url.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.drive().await {
                tracing::debug!(%url, error = %e, "LDAP connection ended");
            }
        });
        if let Some((dn, pw)) = &self.bind {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let res =
                ldap.with_timeout(remaining).simple_bind(dn, pw).await.map_err(|e| self.unavailable("bind", &e))?;
            match res.rc {
                0 => {}
                // invalidCredentials, inappropriateAuthentication, insufficientAccessRights
                48..=50 => {
                    return Err(DirectoryError::Config(format!(
                        "LDAP bind as {dn:?} refused (result code {}: {})",
                        res.rc, res.text
                    )));
                }
                rc => {
                    return Err(DirectoryError::Unavailable(format!(
                        "LDAP bind failed (result code {rc}: {})",
                        res.text
                    )));
                }
            }
        }
        let generation = self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        *guard = Some((generation, ldap.clone()));
        tracing::debug!(url = %self.endpoint.url, generation, "LDAP connection opened");
        Ok((generation, ldap, false))
    }

    /// Forgets the connection of `generation` (if it is still the current one).
    async fn drop_connection(&self, generation: u64) {
        let mut guard = self.conn.lock().await;
        if let Some((g, ldap)) = guard.as_mut()
            && *g == generation
        {
            let _ = ldap.unbind().await;
            *guard = None;
        }
    }

    fn unavailable(&self, what: &str, e: &LdapError) -> DirectoryError {
        tracing::warn!(url = %self.endpoint.url, error = %e, "LDAP {what} failed");
        DirectoryError::Unavailable(format!("LDAP {what} to {} failed: {e}", self.endpoint.url))
    }

    async fn search_once(&self, q: &Query, deadline: Instant) -> Result<Vec<Entry>, (DirectoryError, bool)> {
        let (generation, mut ldap, reused) = self.connection(deadline).await.map_err(|e| (e, false))?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let scope = match q.scope {
            Scope::Base => ldap3::Scope::Base,
            Scope::Subtree => ldap3::Scope::Subtree,
        };
        let filter = q.filter();
        let res = ldap.with_timeout(remaining).search(&q.base, scope, &filter, q.attrs.to_vec()).await;
        let res = match res {
            Ok(r) => r,
            Err(e) => {
                self.drop_connection(generation).await;
                return Err((self.unavailable("search", &e), reused));
            }
        };
        match res.1.rc {
            // success; noSuchObject; invalidDNSyntax: the base does not exist
            0 | 32 | 34 => {}
            // busy, unavailable, unwillingToPerform, other (also: connection closed while searching)
            51..=53 | 80 => {
                self.drop_connection(generation).await;
                let e = DirectoryError::Unavailable(format!("LDAP search: result code {}: {}", res.1.rc, res.1.text));
                return Err((e, reused));
            }
            // inappropriateAuthentication, invalidCredentials, insufficientAccessRights
            48..=50 => {
                let e = DirectoryError::Config(format!(
                    "LDAP search under {:?} refused (result code {}: {}); check bind_dn and the server's access rules",
                    q.base, res.1.rc, res.1.text
                ));
                return Err((e, false));
            }
            rc => {
                return Err((
                    DirectoryError::Unavailable(format!("LDAP search: result code {rc}: {}", res.1.text)),
                    false,
                ));
            }
        }
        let mut out = Vec::with_capacity(res.0.len());
        for re in res.0 {
            if re.is_ref() {
                continue;
            }
            out.push(construct(re).map_err(|e| (e, false))?);
        }
        Ok(out)
    }
}

/// Converts ldap3's entry (whose parser panics on malformed protocol data) into ours.
fn construct(re: ResultEntry) -> Result<Entry, DirectoryError> {
    let se = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| SearchEntry::construct(re)))
        .map_err(|_| DirectoryError::Unavailable("malformed LDAP search result".to_string()))?;
    let mut attrs: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    for (k, vs) in se.attrs {
        attrs.entry(k.to_ascii_lowercase()).or_default().extend(vs.into_iter().map(String::into_bytes));
    }
    for (k, vs) in se.bin_attrs {
        attrs.entry(k.to_ascii_lowercase()).or_default().extend(vs);
    }
    Ok(Entry { dn: se.dn, attrs })
}

#[async_trait::async_trait]
impl Backend for LdapDirectory {
    async fn search(&self, q: &Query) -> Result<Vec<Entry>, DirectoryError> {
        if !self.cache_ttl.is_zero()
            && let Ok(cache) = self.cache.lock()
            && let Some((at, entries)) = cache.get(q)
            && at.elapsed() < self.cache_ttl
        {
            return Ok(entries.clone());
        }
        let deadline = Instant::now() + self.timeout;
        let attempt = async {
            match self.search_once(q, deadline).await {
                Ok(found) => Ok(found),
                // A reused connection may have died since (server restarted): one fresh try.
                Err((_, true)) => self.search_once(q, deadline).await.map_err(|(e, _)| e),
                Err((e, false)) => Err(e),
            }
        };
        let found = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(r) => r?,
            Err(_) => {
                // The connection may be wedged: forget it (without waiting on it).
                if let Ok(mut guard) = self.conn.try_lock() {
                    *guard = None;
                }
                tracing::warn!(url = %self.endpoint.url, timeout_ms = self.timeout.as_millis() as u64, "LDAP timed out");
                return Err(DirectoryError::Unavailable(format!(
                    "LDAP server {} did not answer within {} ms",
                    self.endpoint.url,
                    self.timeout.as_millis()
                )));
            }
        };
        if !self.cache_ttl.is_zero()
            && let Ok(mut cache) = self.cache.lock()
        {
            cache.retain(|_, (at, _)| at.elapsed() < self.cache_ttl);
            cache.insert(q.clone(), (Instant::now(), found.clone()));
        }
        Ok(found)
    }

    fn invalidate(&self) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.clear();
        }
    }

    fn base_dn(&self) -> String {
        self.base_dn.clone()
    }
}
