//! Which targets notifications may go to: HTTP targets by [`Policy`] (no SSRF through
//! registrations), `mailto:` addresses by [`MailPolicy`] (no open mail relay through
//! registrations; see its docs).
//!
//! A registration names a URL; aqgate then makes requests to it from inside the network.
//! By default only globally routable addresses are allowed: loopback, private, link-local
//! (cloud metadata at 169.254.169.254), carrier-grade NAT, unique-local, multicast,
//! documentation and reserved ranges are refused, also when reached through an IPv6 form
//! that embeds an IPv4 address: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
//! (`::a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`) are
//! judged as the IPv4 address they embed, by every rule; 6to4 (`2002::/16`), Teredo and
//! local-use NAT64 (`64:ff9b:1::/48`) are never `public` (a relay's or a local network's
//! address, whatever they embed). The operator widens (or narrows) that with an
//! allowlist of rules:
//!
//! - `public` — any globally routable address (the default list is just this rule);
//! - a CIDR block (`10.1.0.0/16`, `127.0.0.1/32`, `fd00::/8`) — addresses inside it;
//! - a host name (`hooks.internal.example`) or a suffix (`*.internal.example`) — whatever
//!   that name resolves to.
//!
//! An empty list refuses every HTTP target. The rules are checked when a registration is
//! made (IP literals and names) and again on every delivery against the addresses the name
//! resolves to then (so DNS rebinding cannot turn an allowed name into a loopback target).

use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    Public,
    Cidr(IpAddr, u8),
    Host(String),
    Suffix(String),
}

/// The allowlist for HTTP notification targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Default for Policy {
    fn default() -> Self {
        Self { rules: vec![Rule::Public] }
    }
}

impl Policy {
    /// Parses rules (see the module docs). An empty slice allows nothing.
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Self, String> {
        let mut out = Vec::new();
        for r in rules {
            let r = r.as_ref().trim();
            if r.is_empty() {
                continue;
            }
            let rule = if r.eq_ignore_ascii_case("public") {
                Rule::Public
            } else if let Some((ip, len)) = r.split_once('/') {
                let ip: IpAddr = ip.parse().map_err(|_| format!("notify allow rule {r:?}: not an IP address"))?;
                let len: u8 = len.parse().map_err(|_| format!("notify allow rule {r:?}: bad prefix length"))?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                if len > max {
                    return Err(format!("notify allow rule {r:?}: prefix length over {max}"));
                }
                cidr(ip, len)
            } else if let Ok(ip) = r.parse::<IpAddr>() {
                cidr(ip, if ip.is_ipv4() { 32 } else { 128 })
            } else if let Some(s) = r.strip_prefix("*.") {
                Rule::Suffix(valid_host(s, r)?)
            } else {
                Rule::Host(valid_host(r, r)?)
            };
            out.push(rule);
        }
        Ok(Self { rules: out })
    }

    /// Whether `host` (a URL's host, a name or an IP literal) is allowed by name: a host
    /// rule covers it, so whatever it resolves to is allowed.
    pub fn host_trusted(&self, host: &str) -> bool {
        let h = host.trim_end_matches('.').to_ascii_lowercase();
        self.rules.iter().any(|r| match r {
            Rule::Host(n) => *n == h,
            Rule::Suffix(s) => {
                h.len() > s.len() + 1 && h.ends_with(s.as_str()) && h[..h.len() - s.len()].ends_with('.')
            }
            _ => false,
        })
    }

    /// Whether a connection to `ip` is allowed (for a host not trusted by name).
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.rules.iter().any(|r| match r {
            Rule::Public => is_global(ip),
            Rule::Cidr(net, len) => in_cidr(ip, *net, *len),
            _ => false,
        })
    }

    /// Checks a target before any lookup: IP literals against the address rules, names
    /// are accepted here (their addresses are checked at delivery). `localhost` is treated
    /// as the loopback address it is.
    pub fn check_host(&self, host: &str) -> Result<(), String> {
        if self.host_trusted(host) {
            return Ok(());
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let ip = match bare.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                let h = bare.trim_end_matches('.').to_ascii_lowercase();
                (h == "localhost" || h.ends_with(".localhost")).then_some(IpAddr::from([127, 0, 0, 1]))
            }
        };
        match ip {
            Some(ip) if !self.ip_allowed(ip) => Err(format!(
                "notification target {host} is not allowed (private, loopback or reserved addresses need an allow rule: --notify-allow)"
            )),
            _ => Ok(()),
        }
    }
}

/// An address rule, an IPv6 block within one of the forms that embed IPv4 addresses
/// written as the IPv4 block it covers (addresses are compared in that form).
fn cidr(ip: IpAddr, len: u8) -> Rule {
    match canonical(ip) {
        IpAddr::V4(v4) if ip.is_ipv6() && len >= 96 => Rule::Cidr(IpAddr::V4(v4), len - 96),
        _ => Rule::Cidr(ip, len),
    }
}

fn valid_host(h: &str, rule: &str) -> Result<String, String> {
    let h = h.trim_end_matches('.').to_ascii_lowercase();
    if h.is_empty() || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
        return Err(format!("notify allow rule {rule:?}: not a host name, CIDR block or 'public'"));
    }
    Ok(h)
}

/// The IPv6 forms that reach the IPv4 address in their last 32 bits, judged as that
/// address: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, deprecated but
/// still routed by some stacks; `::` and `::1` are themselves), IPv4-translated
/// (`::ffff:0:a.b.c.d`, SIIT) and well-known-prefix NAT64 (`64:ff9b::a.b.c.d`).
fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    let s = v6.segments();
    let o = v6.octets();
    let embedded = IpAddr::from([o[12], o[13], o[14], o[15]]);
    let low = u32::from_be_bytes([o[12], o[13], o[14], o[15]]);
    match s[..6] {
        [0, 0, 0, 0, 0, 0xffff] => embedded,
        [0, 0, 0, 0, 0, 0] if low > 1 => embedded,
        [0, 0, 0, 0, 0xffff, 0] => embedded,
        [0x64, 0xff9b, 0, 0, 0, 0] => embedded,
        _ => ip,
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(_), IpAddr::V4(_)) if len > 32 => false,
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            (u32::from(a) & mask) == (u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            (u128::from(a) & mask) == (u128::from(n) & mask)
        }
        _ => false,
    }
}

/// Globally routable (not loopback, private, link-local, shared, documentation, reserved…).
fn is_global(ip: IpAddr) -> bool {
    const V4_BLOCKED: &[([u8; 4], u8)] = &[
        ([0, 0, 0, 0], 8),       // "this network"
        ([10, 0, 0, 0], 8),      // private
        ([100, 64, 0, 0], 10),   // carrier-grade NAT
        ([127, 0, 0, 0], 8),     // loopback
        ([169, 254, 0, 0], 16),  // link-local, cloud metadata
        ([172, 16, 0, 0], 12),   // private
        ([192, 0, 0, 0], 24),    // IETF protocol assignments
        ([192, 0, 2, 0], 24),    // documentation
        ([192, 88, 99, 0], 24),  // 6to4 relay anycast
        ([192, 168, 0, 0], 16),  // private
        ([198, 18, 0, 0], 15),   // benchmarking
        ([198, 51, 100, 0], 24), // documentation
        ([203, 0, 113, 0], 24),  // documentation
        ([224, 0, 0, 0], 4),     // multicast
        ([240, 0, 0, 0], 4),     // reserved, broadcast
    ];
    const V6_BLOCKED: &[(u128, u8)] = &[
        (0, 127),                                        // :: and ::1
        (0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48), // local-use NAT64
        (0x0100_0000_0000_0000_0000_0000_0000_0000, 64), // discard-only
        (0x2001_0000_0000_0000_0000_0000_0000_0000, 23), // IETF protocol assignments
        (0x2001_0db8_0000_0000_0000_0000_0000_0000, 32), // documentation
        (0x2002_0000_0000_0000_0000_0000_0000_0000, 16), // 6to4 (may embed private v4)
        (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7),  // unique local
        (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10), // link-local
        (0xfec0_0000_0000_0000_0000_0000_0000_0000, 10), // site-local (deprecated)
        (0xff00_0000_0000_0000_0000_0000_0000_0000, 8),  // multicast
    ];
    match ip {
        IpAddr::V4(v4) => !V4_BLOCKED.iter().any(|(n, l)| in_cidr(ip, IpAddr::from(*n), *l)) && !v4.is_broadcast(),
        IpAddr::V6(_) => !V6_BLOCKED.iter().any(|(n, l)| in_cidr(ip, IpAddr::V6(std::net::Ipv6Addr::from(*n)), *l)),
    }
}

/// Which `mailto:` addresses notifications may go to. A registration names an address, and
/// aqgate then sends mail to it through the organisation's relay with the organisation's
/// From: without a policy any agent could make aqgate mail anyone. Rules:
///
/// - `directory` — an address that is the `mail` of an entry in the directory (an agent's
///   mailbox); the default list is just this rule;
/// - `example.com` — any address at that domain; `*.example.com` — at any of its
///   subdomains (not the domain itself);
/// - `any` — any address (no policy).
///
/// An empty list refuses every address. A notification alias (`mailto:NAME`) is the
/// directory's own target, not the client's, and is not subject to the rules. Domains are
/// compared case-insensitively in their ASCII (IDNA) form; an address literal
/// (`ops@[192.0.2.1]`) only passes `any`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailPolicy {
    rules: Vec<MailRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum MailRule {
    Any,
    Directory,
    Domain(String),
    Subdomains(String),
}

impl Default for MailPolicy {
    fn default() -> Self {
        Self { rules: vec![MailRule::Directory] }
    }
}

/// Why [`MailPolicy::check`] did not allow an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailRefusal {
    /// No rule allows it (for good).
    NotAllowed(String),
    /// The directory could not be asked (try again later).
    Directory(crate::directory::DirectoryError),
}

impl MailPolicy {
    /// Parses rules (see the type's docs). An empty slice allows nothing.
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Self, String> {
        let mut out = Vec::new();
        for r in rules {
            let r = r.as_ref().trim();
            if r.is_empty() {
                continue;
            }
            let rule = if r.eq_ignore_ascii_case("any") {
                MailRule::Any
            } else if r.eq_ignore_ascii_case("directory") {
                MailRule::Directory
            } else if let Some(d) = r.strip_prefix("*.") {
                MailRule::Subdomains(mail_domain(d).ok_or_else(|| bad_mail_rule(r))?)
            } else {
                MailRule::Domain(mail_domain(r).ok_or_else(|| bad_mail_rule(r))?)
            };
            out.push(rule);
        }
        Ok(Self { rules: out })
    }

    /// Checks a mail address (one [`is_mail_address`] accepts): allowed by a domain rule or
    /// `any` at once, else by `directory` if the directory has an entry with that `mail`.
    pub async fn check(
        &self,
        addr: &str,
        directory: Option<&dyn crate::directory::Directory>,
    ) -> Result<(), MailRefusal> {
        let domain = addr.rsplit_once('@').and_then(|(_, d)| mail_domain(d));
        let by_domain = self.rules.iter().any(|r| match (r, &domain) {
            (MailRule::Any, _) => true,
            (MailRule::Domain(d), Some(a)) => a == d,
            (MailRule::Subdomains(d), Some(a)) => {
                a.len() > d.len() + 1 && a.ends_with(d.as_str()) && a[..a.len() - d.len()].ends_with('.')
            }
            _ => false,
        });
        if by_domain {
            return Ok(());
        }
        if self.rules.contains(&MailRule::Directory)
            && let Some(dir) = directory
        {
            match dir.agents_with_mail(addr).await {
                Ok(agents) if !agents.is_empty() => return Ok(()),
                Ok(_) | Err(crate::directory::DirectoryError::NotFound(_)) => {}
                Err(e) => return Err(MailRefusal::Directory(e)),
            }
        }
        Err(MailRefusal::NotAllowed(format!(
            "notification address {addr} is not allowed: {} (--notify-mail-allow)",
            self.describe()
        )))
    }

    /// What the rules allow, in words.
    fn describe(&self) -> String {
        if self.rules.is_empty() {
            return "no mailto: address is (only the directory's notification aliases)".into();
        }
        let rules: Vec<String> = self
            .rules
            .iter()
            .map(|r| match r {
                MailRule::Any => "any address".to_string(),
                MailRule::Directory => "the directory's mail addresses".to_string(),
                MailRule::Domain(d) => format!("addresses at {d}"),
                MailRule::Subdomains(d) => format!("addresses at subdomains of {d}"),
            })
            .collect();
        format!("only {} are", rules.join(", "))
    }
}

fn bad_mail_rule(r: &str) -> String {
    format!("notify mail allow rule {r:?}: not 'directory', 'any', a domain or '*.domain'")
}

/// A mail domain in its lower-case ASCII (IDNA) form, if it is a domain name.
fn mail_domain(d: &str) -> Option<String> {
    let d = d.trim_end_matches('.');
    if d.starts_with('[') || d.parse::<IpAddr>().is_ok() {
        return None;
    }
    let ascii = idna::domain_to_ascii(d).ok()?.to_ascii_lowercase();
    (email_address::EmailAddress::is_valid_domain(&ascii) && !ascii.is_empty()).then_some(ascii)
}

/// The host of an `http(s)://` notification target, or why it is not one aqgate posts to
/// (not a URL, no host, credentials in it).
pub fn http_target_host(url: &str) -> Result<String, String> {
    let u = url::Url::parse(url).map_err(|e| format!("notify_url '{url}' is not a valid URL: {e}"))?;
    let Some(host) = u.host_str() else {
        return Err(format!("notify_url '{url}' has no host"));
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Err("notify_url must not carry credentials; set a signing secret for the registration instead".into());
    }
    Ok(host.to_string())
}

/// Whether `addr` is a mail address a relay can be given: a valid local part (RFC 5322
/// dot-atom or quoted string) `@` a domain name (IDNA), an IP address or an address
/// literal.
pub fn is_mail_address(addr: &str) -> bool {
    let Some((user, domain)) = addr.rsplit_once('@') else { return false };
    if !email_address::EmailAddress::is_valid_local_part(user) {
        return false;
    }
    let ascii_ok = |d: &str| {
        email_address::EmailAddress::is_valid_domain(d)
            || d.strip_prefix('[').and_then(|ip| ip.strip_suffix(']')).unwrap_or(d).parse::<std::net::IpAddr>().is_ok()
    };
    ascii_ok(domain) || idna::domain_to_ascii(domain).is_ok_and(|d| ascii_ok(&d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|_| panic!("bad ip {s}"))
    }

    #[test]
    fn default_allows_public_only() {
        let p = Policy::default();
        for ok in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(p.ip_allowed(ip(ok)), "{ok} should be allowed");
        }
        for bad in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.5.4",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "ff02::1",
        ] {
            assert!(!p.ip_allowed(ip(bad)), "{bad} should be refused");
        }
        assert!(p.ip_allowed(ip("172.32.0.1")), "just outside 172.16/12");
        assert!(p.ip_allowed(ip("::ffff:8.8.8.8")), "mapped public v4");
    }

    #[test]
    fn ipv6_forms_of_an_ipv4_address_are_judged_as_that_address() {
        let p = Policy::default();
        for bad in [
            "::127.0.0.1",        // IPv4-compatible loopback
            "::a9fe:a9fe",        // IPv4-compatible 169.254.169.254
            "::10.0.0.1",         // IPv4-compatible private
            "::ffff:0:127.0.0.1", // IPv4-translated
            "::ffff:0:a9fe:a9fe", // IPv4-translated metadata
            "::ffff:169.254.169.254",
            "64:ff9b::127.0.0.1", // NAT64
            "64:ff9b::192.168.0.1",
            "64:ff9b:1::a00:1",    // local-use NAT64
            "2002:7f00:1::1",      // 6to4 of 127.0.0.1
            "2002:a9fe:a9fe::1",   // 6to4 of 169.254.169.254
            "2002:808:808::1",     // 6to4 of a public address: still a relay's
            "2001:0:4136:e378::1", // Teredo
            "::2",                 // IPv4-compatible 0.0.0.2: "this network"
        ] {
            assert!(!p.ip_allowed(ip(bad)), "{bad} should be refused");
            assert!(p.check_host(&format!("[{bad}]")).is_err(), "[{bad}] should be refused at registration");
        }
        for ok in ["::8.8.8.8", "::ffff:0:8.8.8.8", "64:ff9b::8.8.8.8"] {
            assert!(p.ip_allowed(ip(ok)), "{ok} embeds a public address");
        }
        // An IPv4 rule covers every form of its addresses, and no more.
        let p = Policy::parse(&["127.0.0.1/32", "::1"]).expect("rules parse");
        for ok in ["127.0.0.1", "::127.0.0.1", "::ffff:127.0.0.1", "::ffff:0:127.0.0.1", "64:ff9b::7f00:1", "::1"] {
            assert!(p.ip_allowed(ip(ok)), "{ok}");
        }
        for bad in ["::127.0.0.2", "2002:7f00:1::1", "::"] {
            assert!(!p.ip_allowed(ip(bad)), "{bad}");
        }
        // A rule written in an embedding form is the IPv4 block it covers.
        let p = Policy::parse(&["::ffff:10.0.0.0/104", "64:ff9b::/96"]).expect("rules parse");
        assert!(p.ip_allowed(ip("10.200.0.1")) && p.ip_allowed(ip("::ffff:10.0.0.1")));
        assert!(p.ip_allowed(ip("127.0.0.1")), "64:ff9b::/96 covers every IPv4 address");
        assert!(!p.ip_allowed(ip("fd00::1")));
    }

    #[test]
    fn rules_widen_and_narrow() {
        let p = Policy::parse(&["127.0.0.1", "10.1.0.0/16", "hooks.internal.example", "*.corp.example"])
            .expect("rules parse");
        assert!(p.ip_allowed(ip("127.0.0.1")));
        assert!(!p.ip_allowed(ip("127.0.0.2")));
        assert!(p.ip_allowed(ip("10.1.200.3")));
        assert!(!p.ip_allowed(ip("10.2.0.1")));
        assert!(!p.ip_allowed(ip("8.8.8.8")), "no 'public' rule: public addresses are refused");
        assert!(p.host_trusted("hooks.internal.example"));
        assert!(p.host_trusted("HOOKS.internal.example."));
        assert!(p.host_trusted("a.b.corp.example"));
        assert!(!p.host_trusted("corp.example"), "a suffix rule needs a label before it");
        assert!(!p.host_trusted("evilcorp.example"));
        assert!(!p.host_trusted("hooks.internal.example.evil.test"));
        assert!(Policy::parse::<&str>(&[]).map(|p| !p.ip_allowed(ip("8.8.8.8"))).unwrap_or(false));
    }

    #[test]
    fn check_host_catches_literals_and_localhost() {
        let p = Policy::default();
        assert!(p.check_host("127.0.0.1").is_err());
        assert!(p.check_host("[::1]").is_err());
        assert!(p.check_host("localhost").is_err());
        assert!(p.check_host("api.localhost").is_err());
        assert!(p.check_host("example.com").is_ok(), "names are checked at delivery, against their addresses");
        assert!(p.check_host("8.8.8.8").is_ok());
        let p = Policy::parse(&["public", "127.0.0.1/32"]).expect("rules parse");
        assert!(p.check_host("127.0.0.1").is_ok());
        assert!(p.check_host("localhost").is_ok());
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in ["10.0.0.0/33", "::/129", "not a host", "1.2.3.4/x", "host_with_underscore"] {
            assert!(Policy::parse(&[bad]).is_err(), "{bad} should not parse");
        }
    }

    /// A directory whose entries have the mail addresses given.
    struct Mailboxes(&'static [&'static str], bool);

    #[async_trait::async_trait]
    impl crate::directory::Directory for Mailboxes {
        async fn resolve_queue(&self, n: &str) -> Result<String, crate::directory::DirectoryError> {
            Err(crate::directory::DirectoryError::NotFound(n.into()))
        }
        async fn resolve_agent_alias(
            &self,
            a: &str,
        ) -> Result<crate::directory::AgentEntry, crate::directory::DirectoryError> {
            Err(crate::directory::DirectoryError::NotFound(a.into()))
        }
        async fn certificates(
            &self,
            _: &crate::directory::CertificateLocation,
        ) -> Result<Vec<Vec<u8>>, crate::directory::DirectoryError> {
            Ok(Vec::new())
        }
        async fn mail_address(&self, _: &str) -> Result<Option<String>, crate::directory::DirectoryError> {
            Ok(None)
        }
        async fn agents_with_mail(&self, addr: &str) -> Result<Vec<String>, crate::directory::DirectoryError> {
            if self.1 {
                return Err(crate::directory::DirectoryError::Unavailable("down".into()));
            }
            Ok(self.0.iter().filter(|m| m.eq_ignore_ascii_case(addr)).map(|_| "AGENT".to_string()).collect())
        }
        async fn resolve_notification_alias(&self, a: &str) -> Result<String, crate::directory::DirectoryError> {
            Err(crate::directory::DirectoryError::NotFound(a.into()))
        }
        fn invalidate(&self) {}
    }

    fn allowed(p: &MailPolicy, addr: &str, dir: Option<&dyn crate::directory::Directory>) -> bool {
        futures_lite(p.check(addr, dir)).is_ok()
    }

    /// Runs a future that does not wait on anything outside it.
    fn futures_lite<F: std::future::Future>(f: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn mail_targets_are_the_directorys_mailboxes_by_default() {
        let dir = Mailboxes(&["scott@example.com"], false);
        let p = MailPolicy::default();
        assert!(allowed(&p, "scott@example.com", Some(&dir)));
        assert!(allowed(&p, "SCOTT@Example.COM", Some(&dir)));
        assert!(!allowed(&p, "stranger@example.com", Some(&dir)));
        assert!(!allowed(&p, "scott@example.com", None), "no directory, no mailbox it knows");
        let e = futures_lite(p.check("x@evil.test", Some(&dir))).expect_err("refused");
        assert!(
            matches!(&e, MailRefusal::NotAllowed(m) if m.contains("--notify-mail-allow") && m.contains("x@evil.test")),
            "{e:?}"
        );
        let down = Mailboxes(&[], true);
        assert!(matches!(futures_lite(p.check("scott@example.com", Some(&down))), Err(MailRefusal::Directory(_))));
    }

    #[test]
    fn mail_rules_name_domains_subdomains_or_anything() {
        let p = MailPolicy::parse(&["example.com", "*.corp.example", "bücher.example"]).expect("rules parse");
        for ok in [
            "a@example.com",
            "a@EXAMPLE.com.",
            "a@x.corp.example",
            "a@x.y.corp.example",
            "a@xn--bcher-kva.example",
            "a@BÜCHER.example",
        ] {
            assert!(allowed(&p, ok, None), "{ok}");
        }
        for bad in
            ["a@sub.example.com", "a@corp.example", "a@evilcorp.example", "a@example.com.evil.test", "a@[127.0.0.1]"]
        {
            assert!(!allowed(&p, bad, None), "{bad}");
        }
        let any = MailPolicy::parse(&["any"]).expect("any");
        assert!(allowed(&any, "a@[127.0.0.1]", None) && allowed(&any, "a@anywhere.test", None));
        let none = MailPolicy::parse::<&str>(&[]).expect("empty");
        assert!(!allowed(&none, "a@example.com", Some(&Mailboxes(&["a@example.com"], false))));
        for bad in ["not a domain", "*.", "[127.0.0.1]", "10.0.0.1", "a@b"] {
            assert!(MailPolicy::parse(&[bad]).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn mail_addresses_a_relay_can_be_given() {
        for ok in ["app1@example.com", "first.last+tag@sub.example.org", "ops@[192.0.2.1]", "x@bücher.example"] {
            assert!(is_mail_address(ok), "{ok}");
        }
        for bad in ["a@@b", "@example.com", "app1@", "no-at-sign", "a b@example.com", "a@exa mple.com", "a@-x.example"]
        {
            assert!(!is_mail_address(bad), "{bad}");
        }
    }

    #[test]
    fn http_targets_name_a_host_and_no_credentials() {
        assert_eq!(http_target_host("https://hooks.example/x?y=1").as_deref(), Ok("hooks.example"));
        assert!(http_target_host("https://user:pw@hooks.example/x").is_err_and(|e| e.contains("credentials")));
        assert!(http_target_host("http://").is_err());
        assert!(http_target_host("not a url").is_err());
    }
}
