//! Fair shares of the SMTP listener: the connections one client may hold at once (as
//! Postfix's `smtpd_client_connection_count_limit`), the networks exempt from that limit
//! (an MTA in front that speaks for everyone), and the counters of what was refused or cut
//! off. A client is its IPv4 address, or its IPv6 /64 (one subscriber's usual share).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use aqgate_core::metrics::{Counter, Metrics};

/// What the listener and its sessions count (`/metrics`).
#[derive(Debug, Clone, Default)]
pub struct SmtpCounters {
    /// A client over `--smtp-max-per-client` connections was refused.
    pub refused_per_client: Counter,
    /// The listener held `--smtp-max-connections` sessions: refused.
    pub refused_full: Counter,
    /// No MAIL FROM within `--smtp-mail-timeout`.
    pub timeout_before_mail: Counter,
    /// DATA not finished within `--smtp-data-timeout`.
    pub timeout_data: Counter,
    /// A client silent for the idle timeout inside a transaction, or a session at its
    /// whole-session limit.
    pub timeout_idle: Counter,
    /// Bodies that went past `--smtp-data-memory` to a temporary file.
    pub data_spooled: Counter,
    /// Bodies refused because their temporary file could not be written (452).
    pub data_spool_failed: Counter,
}

impl SmtpCounters {
    pub fn register(m: &Metrics) -> Self {
        const REFUSED: &str = "SMTP connections refused at connect (421), by reason: per_client \
                               (--smtp-max-per-client), full (--smtp-max-connections).";
        const TIMEOUTS: &str = "SMTP sessions closed with 421 4.4.2, by phase: before_mail (--smtp-mail-timeout), \
                                data (--smtp-data-timeout), idle (silent in a transaction, or the session's \
                                whole-time limit).";
        Self {
            refused_per_client: m.labelled("aqgate_smtp_refused_total", REFUSED, "reason", "per_client"),
            refused_full: m.labelled("aqgate_smtp_refused_total", REFUSED, "reason", "full"),
            timeout_before_mail: m.labelled("aqgate_smtp_timeouts_total", TIMEOUTS, "phase", "before_mail"),
            timeout_data: m.labelled("aqgate_smtp_timeouts_total", TIMEOUTS, "phase", "data"),
            timeout_idle: m.labelled("aqgate_smtp_timeouts_total", TIMEOUTS, "phase", "idle"),
            data_spooled: m.counter(
                "aqgate_smtp_data_spooled_total",
                "Mail bodies that went past --smtp-data-memory to a temporary file.",
            ),
            data_spool_failed: m.counter(
                "aqgate_smtp_data_spool_failed_total",
                "Mail bodies refused with 452 because their temporary file could not be written.",
            ),
        }
    }
}

/// An address or a network (`10.0.0.0/8`, `::1`) exempt from the per-client limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// `ADDR` or `ADDR/PREFIX`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?} is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: bad prefix length"))?,
        };
        Ok(Self { addr: addr.to_canonical(), prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Parses the exemption list: addresses and CIDR blocks; `none` and empty entries stand for
/// nothing.
pub fn parse_exempt(list: &[String]) -> Result<Vec<Network>, String> {
    list.iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case("none"))
        .map(Network::parse)
        .collect()
}

/// Who a connection counts against: an IPv4 address, an IPv6 /64.
fn client_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & (u128::MAX << 64)).into()),
        v4 => v4,
    }
}

/// The connections each client holds.
#[derive(Debug)]
pub struct Clients {
    max: usize,
    exempt: Vec<Network>,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in its client's count, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    client: Option<IpAddr>,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(c) = self.client {
            let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = held.get_mut(&c) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&c);
                }
            }
        }
    }
}

impl Clients {
    pub fn new(max: usize, exempt: Vec<Network>) -> Self {
        Self { max: max.max(1), exempt, held: Arc::default() }
    }

    /// A slot for a new connection from `ip`, or `None` when its client holds the maximum.
    pub fn admit(&self, ip: IpAddr) -> Option<Slot> {
        if self.exempt.iter().any(|n| n.contains(ip)) {
            return Some(Slot { client: None, held: self.held.clone() });
        }
        let client = client_of(ip);
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = held.entry(client).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot { client: Some(client), held: self.held.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_client_gets_its_maximum_and_a_slot_given_back_is_free_again() {
        let c = Clients::new(2, parse_exempt(&["10.0.0.0/8, ::1".into()]).expect("exempt"));
        let a = c.admit(ip("192.0.2.1")).expect("1");
        let _b = c.admit(ip("::ffff:192.0.2.1")).expect("2: the mapped address is the same client");
        assert!(c.admit(ip("192.0.2.1")).is_none(), "over the maximum");
        assert!(c.admit(ip("192.0.2.2")).is_some(), "another client");
        drop(a);
        assert!(c.admit(ip("192.0.2.1")).is_some(), "given back");
        let _v6: Vec<_> = (0..2).map(|i| c.admit(ip(&format!("2001:db8:1:2::{i}"))).expect("v6")).collect();
        assert!(c.admit(ip("2001:db8:1:2:ffff::9")).is_none(), "one /64 is one client");
        assert!(c.admit(ip("2001:db8:1:3::1")).is_some());
        let exempt: Vec<_> = (0..10).map(|_| c.admit(ip("10.9.8.7"))).collect();
        assert!(exempt.iter().all(Option::is_some), "exempt networks are not counted");
        assert!(c.admit(ip("::1")).is_some());
    }

    #[test]
    fn exemptions_parse_addresses_and_blocks() {
        assert_eq!(parse_exempt(&["none".into()]).expect("none"), []);
        assert_eq!(parse_exempt(&["".into()]).expect("empty"), []);
        assert!(parse_exempt(&["10.0.0.0/33".into()]).is_err());
        assert!(parse_exempt(&["example.com".into()]).is_err());
        let n = Network::parse("127.0.0.0/8").expect("block");
        assert!(n.contains(ip("127.1.2.3")) && !n.contains(ip("128.0.0.1")) && !n.contains(ip("::1")));
        assert!(Network::parse("0.0.0.0/0").expect("all").contains(ip("203.0.113.9")));
    }
}
