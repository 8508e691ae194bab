//! Bounds on password checks. An argon2 verification costs its memory (19 MiB) and tens of
//! milliseconds of a core, so a flood of wrong passwords must not run them without end:
//!
//! - at most `--password-checks` run at once; a request waits at most
//!   `--password-check-wait` for its turn, then gets 503 with Retry-After;
//! - a client address (an IPv6 /64) and an agent that fail `--auth-failures-before-backoff`
//!   times in a row are barred for a while: 1 s after that many failures, doubling with
//!   each further one up to `--auth-backoff-max`. While barred, their password requests are
//!   answered 429 with Retry-After without any check, after a pause (a quarter of the
//!   bar left, at most 250 ms), so that a client ignoring Retry-After cannot spend the
//!   runtime's time on 429s. A success resets both. A failure is
//!   forgotten 10 minutes after it (a bar lasts its time).
//!
//! Credentials in the verified-credentials cache, session cookies and client certificates
//! need no check, so honest clients that already logged in are neither queued nor barred.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aqgate_core::metrics::{Counter, Metrics};

/// The settings (see the module's documentation).
#[derive(Debug, Clone)]
pub struct PasswordLimits {
    pub concurrent: usize,
    pub wait: Duration,
    pub failures_before_backoff: u32,
    pub backoff_max: Duration,
}

impl Default for PasswordLimits {
    fn default() -> Self {
        Self {
            concurrent: 2,
            wait: Duration::from_secs(5),
            failures_before_backoff: 5,
            backoff_max: Duration::from_secs(60),
        }
    }
}

/// The longest a barred request waits before its 429 (see `login`).
pub const BARRED_PAUSE: Duration = Duration::from_millis(250);

/// Failures are forgotten this long after the last one.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Entries of each table beyond which the forgotten ones are dropped (and, if that is not
/// enough, all but the barred ones).
const TABLE_LIMIT: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    barred_until: Option<Instant>,
}

/// Who a password check is about.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub ip: Option<IpAddr>,
    pub agent: Option<&'a str>,
}

/// Why a check did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client or the agent is barred for this long still.
    Barred(Duration),
    /// No turn within the wait.
    Busy,
}

pub struct PasswordGate {
    pub limits: PasswordLimits,
    turns: tokio::sync::Semaphore,
    by_ip: Mutex<HashMap<IpAddr, Failures>>,
    by_agent: Mutex<HashMap<String, Failures>>,
    refused_barred: Counter,
    refused_busy: Counter,
    failed: Counter,
    checked: Counter,
}

/// One turn to run a check; given back when dropped.
pub struct Turn<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl PasswordGate {
    pub fn new(limits: PasswordLimits, metrics: &Metrics) -> Self {
        const REFUSED: &str = "aqgate_password_checks_refused_total";
        const HELP: &str = "Password requests answered without a check: the client or agent barred after \
                            repeated failures (429), or no turn among --password-checks in time (503).";
        Self {
            turns: tokio::sync::Semaphore::new(limits.concurrent.max(1)),
            limits,
            by_ip: Mutex::new(HashMap::new()),
            by_agent: Mutex::new(HashMap::new()),
            refused_barred: metrics.labelled(REFUSED, HELP, "reason", "backoff"),
            refused_busy: metrics.labelled(REFUSED, HELP, "reason", "busy"),
            failed: metrics.counter("aqgate_password_failures_total", "Password checks that failed."),
            checked: metrics.counter(
                "aqgate_password_checks_total",
                "Password checks run (argon2); credentials verified recently are not checked again.",
            ),
        }
    }

    /// A password check ran.
    pub fn checked(&self) {
        self.checked.inc();
    }

    /// `Err` when `caller` may not have a check now; else waits for a turn.
    pub async fn turn(&self, caller: Caller<'_>) -> Result<Turn<'_>, Refusal> {
        let now = Instant::now();
        let barred =
            |until: Option<Instant>| until.and_then(|u| u.checked_duration_since(now)).filter(|d| !d.is_zero());
        let ip_bar =
            caller.ip.map(client_key).and_then(|ip| barred(lock(&self.by_ip).get(&ip).and_then(|f| f.barred_until)));
        let agent_bar = caller.agent.and_then(|a| barred(lock(&self.by_agent).get(a).and_then(|f| f.barred_until)));
        if let Some(d) = ip_bar.into_iter().chain(agent_bar).max() {
            self.refused_barred.inc();
            return Err(Refusal::Barred(d));
        }
        match tokio::time::timeout(self.limits.wait, self.turns.acquire()).await {
            Ok(Ok(p)) => Ok(Turn { _permit: p }),
            _ => {
                self.refused_busy.inc();
                Err(Refusal::Busy)
            }
        }
    }

    /// A check failed (or named no agent that has a password).
    pub fn failed(&self, caller: Caller<'_>) {
        self.failed.inc();
        let now = Instant::now();
        if let Some(ip) = caller.ip {
            self.count_failure(&mut lock(&self.by_ip), client_key(ip), now);
        }
        if let Some(a) = caller.agent {
            self.count_failure(&mut lock(&self.by_agent), a.to_string(), now);
        }
    }

    /// A check passed: the client's and the agent's failures are forgotten.
    pub fn succeeded(&self, caller: Caller<'_>) {
        if let Some(ip) = caller.ip {
            lock(&self.by_ip).remove(&client_key(ip));
        }
        if let Some(a) = caller.agent {
            lock(&self.by_agent).remove(a);
        }
    }

    fn count_failure<K: std::hash::Hash + Eq>(&self, table: &mut HashMap<K, Failures>, key: K, now: Instant) {
        if table.len() >= TABLE_LIMIT {
            table.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if table.len() >= TABLE_LIMIT {
                table.retain(|_, f| f.barred_until.is_some_and(|u| u > now));
            }
        }
        let f = table.entry(key).or_insert(Failures { count: 0, last: now, barred_until: None });
        if now.duration_since(f.last) >= FORGET_AFTER {
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
        let free = self.limits.failures_before_backoff;
        if f.count >= free {
            let doublings = (f.count - free).min(30);
            let delay = Duration::from_secs(1).saturating_mul(1u32 << doublings).min(self.limits.backoff_max);
            f.barred_until = Some(now + delay);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An IPv4 address by itself, an IPv6 one by its /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(free: u32) -> PasswordGate {
        let limits = PasswordLimits {
            concurrent: 1,
            wait: Duration::from_millis(50),
            failures_before_backoff: free,
            backoff_max: Duration::from_secs(4),
        };
        PasswordGate::new(limits, &Metrics::new())
    }

    #[tokio::test]
    async fn failures_bar_the_client_and_the_agent_with_a_growing_delay() {
        let g = gate(2);
        let ip: IpAddr = "192.0.2.7".parse().expect("ip");
        let me = Caller { ip: Some(ip), agent: Some("SCOTT") };
        assert!(g.turn(me).await.is_ok());
        g.failed(me);
        assert!(g.turn(me).await.is_ok(), "one failure is free");
        g.failed(me);
        let Err(Refusal::Barred(d)) = g.turn(me).await else { panic!("barred") };
        assert!(d <= Duration::from_secs(1));
        // The agent is barred for another client too, and the client for another agent.
        assert!(matches!(g.turn(Caller { ip: None, agent: Some("SCOTT") }).await, Err(Refusal::Barred(_))));
        assert!(matches!(g.turn(Caller { ip: Some(ip), agent: Some("JOHN") }).await, Err(Refusal::Barred(_))));
        assert!(g.turn(Caller { ip: Some("192.0.2.8".parse().expect("ip")), agent: Some("JOHN") }).await.is_ok());
        for _ in 0..5 {
            g.failed(me);
        }
        let Err(Refusal::Barred(d)) = g.turn(me).await else { panic!("barred") };
        assert!(d > Duration::from_secs(3) && d <= Duration::from_secs(4), "doubling, capped: {d:?}");
        g.succeeded(me);
        assert!(g.turn(me).await.is_ok(), "a success resets");
    }

    #[tokio::test]
    async fn turns_are_bounded_and_waiting_too() {
        let g = gate(100);
        let me = Caller { ip: None, agent: None };
        let t = g.turn(me).await.expect("a turn");
        assert_eq!(g.turn(me).await.err(), Some(Refusal::Busy));
        drop(t);
        assert!(g.turn(me).await.is_ok());
    }
}
