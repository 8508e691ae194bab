//! The dispatcher's fair shares between notification targets: how many notifications one
//! target (an HTTP origin — scheme, host, port — or a `mailto:` domain) may have in flight,
//! and its circuit breaker.
//!
//! - Closed: attempts go ahead up to the per-target limit; a target at its limit is left
//!   out of claims (its URLs are skipped) until one of its attempts ends.
//! - After `failures` consecutive failed attempts (timeouts, refused connections, non-2xx
//!   answers, a relay's transient refusal) the circuit **opens**: attempts in flight to the
//!   target give up at once, its pending notifications stay pending with their next attempt
//!   moved to the end of the cool-down, and none is attempted meanwhile.
//! - After the cool-down it is **half-open**: one notification goes as a probe. Delivered:
//!   closed again. Failed: open again, for twice the cool-down (up to `max_cooldown`).
//!
//! Time is the engine's clock (microseconds), the same as the outbox's due times.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use aqgate_core::clock::Micros;

/// At most this many URLs are remembered per target (the claim skips them while it is busy).
const URLS_PER_TARGET: usize = 64;
/// Beyond this many targets, idle closed ones are forgotten.
const TARGETS_KEPT: usize = 1024;
/// At most this many URLs skipped by one claim (the rest are claimed and given back).
pub(crate) const SKIP_MAX: usize = 1000;

/// The target a notify URL goes to: `scheme://host:port` for HTTP(S), `mailto:domain` for an
/// address, `mailto:ALIAS` for a directory alias (resolved at delivery).
pub(crate) fn target_of(url: &str) -> String {
    let url = url.trim();
    let lower = url.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("mailto:") {
        let rest = rest.trim_start_matches("//").trim();
        return match rest.rsplit_once('@') {
            Some((_, domain)) => format!("mailto:{}", domain.trim_end_matches('>')),
            None => format!("mailto:{rest}"),
        };
    }
    match reqwest::Url::parse(url) {
        Ok(u) => match (u.host_str(), u.port_or_known_default()) {
            (Some(h), Some(p)) => format!("{}://{}:{p}", u.scheme(), h.to_ascii_lowercase()),
            _ => lower,
        },
        Err(_) => lower,
    }
}

/// Tunables (from `--notify-per-target`, `--notify-breaker-failures`, `--notify-breaker-cooldown`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub per_target: usize,
    /// Consecutive failures that open the circuit; 0: never.
    pub failures: u32,
    pub cooldown: Micros,
    pub max_cooldown: Micros,
}

/// What an attempt's end says about its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Delivered,
    /// The target did not take it (timeout, connection, status, relay).
    Failed,
    /// Says nothing about the target (a policy refusal, the directory, given up when the
    /// circuit opened).
    Neutral,
}

/// Whether an entry may go now.
#[derive(Debug)]
pub(crate) enum Admit {
    /// Go; end it with [`Targets::finish`].
    Go(Ticket),
    /// The target has its limit in flight (or its probe): give the row back, due now.
    Busy,
    /// The circuit is open until then: give the row back, due then.
    Open(Micros),
}

/// One admitted attempt.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub key: String,
    probe: bool,
    /// Changes when the target's circuit opens: the attempt gives up.
    pub opened: tokio::sync::watch::Receiver<u64>,
}

/// What ending an attempt changed.
#[derive(Debug, Default)]
pub(crate) struct Finished {
    /// The circuit opened (or opened again) until then; these URLs' pending rows wait for it.
    pub opened: Option<(Micros, Vec<String>)>,
    /// The target had no room before and has now: claims may take its rows again.
    pub freed: bool,
    /// The circuit closed (a probe got through).
    pub closed: bool,
}

struct Target {
    in_flight: usize,
    failures: u32,
    /// Open until then; half-open after it. `None`: closed.
    open_until: Option<Micros>,
    /// Opens in a row (the cool-down doubles with each).
    opens: u32,
    probing: bool,
    urls: BTreeSet<String>,
    opened: tokio::sync::watch::Sender<u64>,
}

impl Target {
    fn new() -> Self {
        Self {
            in_flight: 0,
            failures: 0,
            open_until: None,
            opens: 0,
            probing: false,
            urls: BTreeSet::new(),
            opened: tokio::sync::watch::channel(0).0,
        }
    }

    /// No room for another attempt now.
    fn busy(&self, now: Micros, limit: usize) -> bool {
        match self.open_until {
            None => self.in_flight >= limit,
            Some(t) if now < t => true,
            Some(_) => self.probing,
        }
    }
}

/// Every target this dispatcher has seen.
pub(crate) struct Targets {
    limits: Limits,
    map: Mutex<HashMap<String, Target>>,
}

impl Targets {
    pub fn new(limits: Limits) -> Self {
        Self { limits, map: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Target>> {
        self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn admit(&self, url: &str, now: Micros) -> Admit {
        let key = target_of(url);
        let mut map = self.lock();
        if map.len() >= TARGETS_KEPT && !map.contains_key(&key) {
            map.retain(|_, t| t.in_flight > 0 || t.failures > 0 || t.open_until.is_some());
        }
        let t = map.entry(key.clone()).or_insert_with(Target::new);
        if t.urls.len() < URLS_PER_TARGET {
            t.urls.insert(url.to_string());
        }
        let probe = match t.open_until {
            Some(until) if now < until => return Admit::Open(until),
            Some(_) if t.probing => return Admit::Busy,
            Some(_) => true,
            None if t.in_flight >= self.limits.per_target => return Admit::Busy,
            None => false,
        };
        t.probing |= probe;
        t.in_flight += 1;
        Admit::Go(Ticket { key, probe, opened: t.opened.subscribe() })
    }

    pub fn finish(&self, ticket: &Ticket, outcome: Outcome, now: Micros) -> Finished {
        let mut map = self.lock();
        let Some(t) = map.get_mut(&ticket.key) else { return Finished::default() };
        let was_busy = t.busy(now, self.limits.per_target);
        t.in_flight = t.in_flight.saturating_sub(1);
        if ticket.probe {
            t.probing = false;
        }
        let mut out = Finished::default();
        match outcome {
            Outcome::Delivered => {
                t.failures = 0;
                if t.open_until.is_some() {
                    t.open_until = None;
                    t.opens = 0;
                    out.closed = true;
                }
            }
            Outcome::Failed => {
                t.failures = t.failures.saturating_add(1);
                let open = match t.open_until {
                    // A probe failed: open again.
                    Some(_) => ticket.probe,
                    None => self.limits.failures > 0 && t.failures >= self.limits.failures,
                };
                if open {
                    let exp = t.opens.min(16);
                    let cooldown =
                        self.limits.cooldown.saturating_mul(1i64 << exp).min(self.limits.max_cooldown.max(1));
                    let until = now.saturating_add(cooldown);
                    t.open_until = Some(until);
                    t.opens = t.opens.saturating_add(1);
                    t.opened.send_modify(|n| *n += 1);
                    out.opened = Some((until, t.urls.iter().cloned().collect()));
                }
            }
            Outcome::Neutral => {}
        }
        out.freed = was_busy && !t.busy(now, self.limits.per_target);
        out
    }

    /// Until when the target's circuit is open, if it is.
    pub fn open_until(&self, key: &str, now: Micros) -> Option<Micros> {
        self.lock().get(key).and_then(|t| t.open_until).filter(|u| *u > now)
    }

    /// The URLs of every target with no room now (the claim leaves them out).
    pub fn skip_urls(&self, now: Micros) -> Vec<String> {
        let map = self.lock();
        let mut out = Vec::new();
        for t in map.values().filter(|t| t.busy(now, self.limits.per_target)) {
            out.extend(t.urls.iter().take(SKIP_MAX.saturating_sub(out.len())).cloned());
            if out.len() >= SKIP_MAX {
                break;
            }
        }
        out
    }

    /// The earliest end of a cool-down after `now` (a half-open probe falls due then).
    pub fn next_half_open(&self, now: Micros) -> Option<Micros> {
        self.lock().values().filter_map(|t| t.open_until).filter(|u| *u > now).min()
    }

    /// Targets whose circuit is not closed (open, or half-open waiting for its probe).
    pub fn not_closed(&self) -> usize {
        self.lock().values().filter(|t| t.open_until.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    fn targets() -> Targets {
        Targets::new(Limits { per_target: 2, failures: 3, cooldown: 10 * S, max_cooldown: 25 * S })
    }

    fn go(t: &Targets, url: &str, now: Micros) -> Ticket {
        match t.admit(url, now) {
            Admit::Go(x) => x,
            other => panic!("{url} not admitted: {other:?}"),
        }
    }

    #[test]
    fn targets_are_origins_and_mail_domains() {
        assert_eq!(target_of("http://Hooks.Example:80/a?x=1"), "http://hooks.example:80");
        assert_eq!(target_of("http://hooks.example/b"), "http://hooks.example:80");
        assert_eq!(target_of("https://hooks.example/b"), "https://hooks.example:443");
        assert_eq!(target_of("http://127.0.0.1:9000/x"), "http://127.0.0.1:9000");
        assert_eq!(target_of("mailto:Ops@Example.COM"), "mailto:example.com");
        assert_eq!(target_of("mailto:ORDERS_DESK"), "mailto:orders_desk");
        assert_eq!(target_of("not a url"), "not a url");
    }

    #[test]
    fn a_target_has_its_limit_in_flight_and_others_are_not_held() {
        let t = targets();
        let a = go(&t, "http://slow.example/1", 0);
        let _b = go(&t, "http://slow.example/2", 0);
        assert!(matches!(t.admit("http://slow.example/1", 0), Admit::Busy));
        assert_eq!(t.skip_urls(0), vec!["http://slow.example/1".to_string(), "http://slow.example/2".to_string()]);
        let _c = go(&t, "http://quick.example/1", 0);
        let f = t.finish(&a, Outcome::Delivered, 1);
        assert!(f.freed && f.opened.is_none());
        assert!(t.skip_urls(1).is_empty());
    }

    #[test]
    fn the_circuit_opens_after_consecutive_failures_and_a_probe_closes_it() {
        let t = targets();
        let url = "http://dead.example/x";
        for i in 0..2 {
            let k = go(&t, url, i);
            assert!(t.finish(&k, Outcome::Failed, i).opened.is_none());
        }
        // A success in between resets the count.
        let k = go(&t, url, 2);
        t.finish(&k, Outcome::Delivered, 2);
        let mut in_flight = Vec::new();
        for i in 0..2 {
            in_flight.push(go(&t, url, 3 + i));
        }
        let opened = in_flight[1].opened.clone();
        assert!(t.finish(&in_flight.remove(0), Outcome::Failed, 5).opened.is_none());
        let k = go(&t, url, 6);
        t.finish(&k, Outcome::Failed, 6);
        let f = t.finish(&in_flight.remove(0), Outcome::Failed, 7);
        let (until, urls) = f.opened.expect("opened after three failures in a row");
        assert_eq!((until, urls), (7 + 10 * S, vec![url.to_string()]));
        assert!(opened.has_changed().expect("sender lives"), "attempts in flight are told");
        assert_eq!(t.not_closed(), 1);
        assert!(matches!(t.admit(url, 8), Admit::Open(u) if u == until));
        assert_eq!(t.skip_urls(8), vec![url.to_string()]);
        assert_eq!(t.next_half_open(8), Some(until));
        // Half-open: one probe; it fails: open again for twice as long.
        let probe = go(&t, url, until);
        assert!(matches!(t.admit(url, until), Admit::Busy));
        let f = t.finish(&probe, Outcome::Failed, until + 1);
        assert_eq!(f.opened.map(|o| o.0), Some(until + 1 + 20 * S));
        // Capped at max_cooldown.
        let probe = go(&t, url, until + 1 + 20 * S);
        let at = until + 2 + 20 * S;
        assert_eq!(t.finish(&probe, Outcome::Failed, at).opened.map(|o| o.0), Some(at + 25 * S));
        // A probe that gets through closes it.
        let probe = go(&t, url, at + 25 * S);
        let f = t.finish(&probe, Outcome::Delivered, at + 26 * S);
        assert!(f.closed && f.freed);
        assert_eq!(t.not_closed(), 0);
        let _a = go(&t, url, at + 26 * S);
        let _b = go(&t, url, at + 26 * S);
    }

    #[test]
    fn neutral_outcomes_never_open_it_and_zero_disables_it() {
        let t = targets();
        for i in 0..10 {
            let k = go(&t, "http://x.example/", i);
            assert!(t.finish(&k, Outcome::Neutral, i).opened.is_none());
        }
        let off = Targets::new(Limits { per_target: 1, failures: 0, cooldown: S, max_cooldown: S });
        for i in 0..10 {
            let k = go(&off, "http://x.example/", i);
            assert!(off.finish(&k, Outcome::Failed, i).opened.is_none());
        }
    }
}
