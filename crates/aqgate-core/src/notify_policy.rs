//! Which HTTP targets notifications may go to (no SSRF through registrations).
//!
//! A registration names a URL; aqgate then makes requests to it from inside the network.
//! By default only globally routable addresses are allowed: loopback, private, link-local
//! (cloud metadata at 169.254.169.254), carrier-grade NAT, unique-local, multicast,
//! documentation and reserved ranges are refused, also when reached through an
//! IPv4-mapped or NAT64 IPv6 address. The operator widens (or narrows) that with an
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
                Rule::Cidr(ip, len)
            } else if let Ok(ip) = r.parse::<IpAddr>() {
                Rule::Cidr(ip, if ip.is_ipv4() { 32 } else { 128 })
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
            Rule::Cidr(net, len) => in_cidr(ip, canonical(*net), *len),
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

fn valid_host(h: &str, rule: &str) -> Result<String, String> {
    let h = h.trim_end_matches('.').to_ascii_lowercase();
    if h.is_empty() || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
        return Err(format!("notify allow rule {rule:?}: not a host name, CIDR block or 'public'"));
    }
    Ok(h)
}

/// IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`) addresses reach the
/// embedded IPv4 address: judge them as that.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::from([o[12], o[13], o[14], o[15]]);
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
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
