//! The HTTP listeners' own bounds, before any request reaches the servlet: how many
//! connections the process holds (in all, and per client address), and how long a
//! connection may hold a slot without a request in progress (the wait for its first
//! request's head, a head that trickles in, a kept connection idle between requests).
//!
//! A connection over a cap is closed at once, before any byte is read or a TLS handshake
//! starts (an HTTP answer would need the handshake, and a 503 costs what the cap saves);
//! the refusal is counted and logged (at most once a second). The per-address cap counts
//! an IPv6 client by its /64, which one host usually has whole. Behind a proxy every
//! client has the proxy's address: raise `--http-max-connections-per-ip` there.
//!
//! [`Activity`] follows one connection: requests in progress (counted by the service),
//! the moment the last one ended, and the first byte read since ([`Watched`] wraps the
//! stream). The accept loop (`https`) asks it when the connection is due to close.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use aqgate_core::metrics::{Counter, Metrics};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The listeners' bounds.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// From the connection's start (or its TLS handshake's), or from the first byte after
    /// an idle spell, to a complete request head.
    pub header_timeout: Duration,
    /// A kept connection with no request in progress is closed after this.
    pub idle_timeout: Duration,
    /// Connections held at once, all listeners together.
    pub max_connections: usize,
    /// Connections held at once from one client address (an IPv6 /64); 0: no such cap.
    pub max_connections_per_ip: usize,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_ip: 64,
        }
    }
}

/// The connections this process holds, and their counters.
pub struct Connections {
    pub config: EdgeConfig,
    total: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    refused_total: Counter,
    refused_per_ip: Counter,
    /// Closed for want of a request head in time / for idling.
    pub header_timeouts: Counter,
    pub idle_timeouts: Counter,
    /// Request bodies not received whole in time (`--http-body-timeout`; the servlet's).
    pub body_timeouts: Counter,
    /// When a refusal was last logged (rate limit).
    last_log: Mutex<Option<Instant>>,
}

impl Connections {
    pub fn new(config: EdgeConfig, metrics: &Metrics) -> Arc<Self> {
        const REFUSED: &str = "aqgate_http_connections_refused_total";
        const REFUSED_HELP: &str = "Connections closed at once because a connection cap was reached \
                                    (--http-max-connections, --http-max-connections-per-ip).";
        const CLOSED: &str = "aqgate_http_connections_timed_out_total";
        const CLOSED_HELP: &str = "Connections closed without a request in progress: no request head in \
                                   --http-header-timeout, or idle for --http-idle-timeout.";
        Arc::new(Self {
            config,
            total: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            refused_total: metrics.labelled(REFUSED, REFUSED_HELP, "cap", "total"),
            refused_per_ip: metrics.labelled(REFUSED, REFUSED_HELP, "cap", "per_ip"),
            header_timeouts: metrics.labelled(CLOSED, CLOSED_HELP, "wait", "header"),
            idle_timeouts: metrics.labelled(CLOSED, CLOSED_HELP, "wait", "idle"),
            body_timeouts: metrics.counter(
                "aqgate_http_body_timeouts_total",
                "Requests answered 408: their body did not arrive whole within --http-body-timeout.",
            ),
            last_log: Mutex::new(None),
        })
    }

    /// Connections held now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// A slot for a new connection from `peer`, or `None` (counted and logged) when a cap
    /// is reached. The slot is given back when dropped.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let key = client_key(peer);
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if self.total.load(Ordering::Relaxed) >= self.config.max_connections {
            drop(per_ip);
            self.refused(&self.refused_total, peer, "--http-max-connections");
            return None;
        }
        let n = per_ip.entry(key).or_insert(0);
        if self.config.max_connections_per_ip > 0 && *n >= self.config.max_connections_per_ip {
            drop(per_ip);
            self.refused(&self.refused_per_ip, peer, "--http-max-connections-per-ip");
            return None;
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        Some(Slot { owner: self.clone(), key })
    }

    fn refused(&self, counter: &Counter, peer: IpAddr, cap: &str) {
        counter.inc();
        let mut last = self.last_log.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            tracing::warn!(%peer, cap, open = self.open(), "connection refused: a connection cap is reached");
        }
    }
}

/// An IPv4 address (also one mapped into IPv6) by itself, an IPv6 address by its /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// One admitted connection's place in the caps.
pub struct Slot {
    owner: Arc<Connections>,
    key: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self.owner.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per_ip.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.key);
            }
        }
        self.owner.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// No first byte since the connection went idle.
const NONE: u64 = u64::MAX;

/// What one connection is doing, for its idle and head timeouts.
pub struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    served: AtomicU64,
    /// Milliseconds from `start` to the end of the last request (0: none yet).
    idle_since: AtomicU64,
    /// Milliseconds from `start` to the first byte read while no request was in progress
    /// ([`NONE`]: none).
    head_since: AtomicU64,
}

/// Why a connection is due to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// No request head in time.
    Header,
    /// Idle between requests.
    Idle,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NONE),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// A request is in progress until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> InRequest {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.head_since.store(NONE, Ordering::SeqCst);
        InRequest(self.clone())
    }

    /// Requests in progress now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// When the connection is due to close and why, if no request starts before; `None`
    /// while a request is in progress.
    pub fn due(&self, cfg: &EdgeConfig) -> Option<(Instant, Due)> {
        if self.in_flight() > 0 {
            return None;
        }
        let head = self.head_since.load(Ordering::SeqCst);
        if head != NONE {
            return Some((self.start + Duration::from_millis(head) + cfg.header_timeout, Due::Header));
        }
        let idle = self.start + Duration::from_millis(self.idle_since.load(Ordering::SeqCst));
        if self.served.load(Ordering::SeqCst) == 0 {
            Some((idle + cfg.header_timeout, Due::Header))
        } else {
            Some((idle + cfg.idle_timeout, Due::Idle))
        }
    }

    fn read_some(&self) {
        if self.in_flight() == 0 && self.head_since.load(Ordering::Relaxed) == NONE {
            let now = self.now_ms();
            let _ = self.head_since.compare_exchange(NONE, now, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// A request in progress on its connection (see [`Activity::enter`]).
pub struct InRequest(Arc<Activity>);

impl Drop for InRequest {
    fn drop(&mut self) {
        let a = &self.0;
        a.served.fetch_add(1, Ordering::SeqCst);
        a.idle_since.store(a.now_ms(), Ordering::SeqCst);
        a.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A stream that tells its [`Activity`] when bytes arrive.
pub struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises the soft limit of open files to the hard limit and returns it (`None` where it
/// cannot be read); logs what it did.
pub fn raise_nofile() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => {
            tracing::info!(limit = n, "open files limit (RLIMIT_NOFILE) raised to the hard limit");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open files limit (RLIMIT_NOFILE)");
            rlimit::getrlimit(rlimit::Resource::NOFILE).ok().map(|(soft, _)| soft)
        }
    }
}

/// `max_connections` kept to half the open files limit `nofile` (the other half is the
/// database's, the SMTP filter's, notifications' and files'); logs when it lowers it.
pub fn fit_to_nofile(max_connections: usize, nofile: Option<u64>) -> usize {
    let Some(nofile) = nofile else { return max_connections };
    let half = usize::try_from(nofile / 2).unwrap_or(usize::MAX).max(1);
    if max_connections > half {
        tracing::warn!(
            configured = max_connections,
            nofile,
            used = half,
            "--http-max-connections lowered to half the open files limit"
        );
        half
    } else {
        max_connections
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_per_address_and_in_all() {
        let m = Metrics::new();
        let cfg = EdgeConfig { max_connections: 3, max_connections_per_ip: 2, ..EdgeConfig::default() };
        let c = Connections::new(cfg, &m);
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "::ffff:10.0.0.2".parse().expect("ip");
        let s1 = c.admit(a).expect("first");
        let _s2 = c.admit(a).expect("second");
        assert!(c.admit(a).is_none(), "a third from one address");
        let _s3 = c.admit(b).expect("another address");
        assert!(c.admit("10.0.0.3".parse().expect("ip")).is_none(), "over the total");
        drop(s1);
        assert_eq!(c.open(), 2);
        let _s4 = c.admit(a).expect("a slot given back");
        assert_eq!(c.refused_per_ip.get(), 1);
        assert_eq!(c.refused_total.get(), 1);
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().expect("ip");
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key("2001:db8:1:3::1".parse().expect("ip")));
        assert_eq!(client_key("::ffff:192.0.2.1".parse().expect("ip")), "192.0.2.1".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn a_connection_is_due_by_its_state() {
        let cfg = EdgeConfig {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..EdgeConfig::default()
        };
        let a = Activity::new();
        let (at, why) = a.due(&cfg).expect("due");
        assert_eq!(why, Due::Header);
        assert!(at <= a.start + Duration::from_secs(10));
        let r = a.enter();
        assert!(a.due(&cfg).is_none(), "not while a request is in progress");
        drop(r);
        assert_eq!(a.due(&cfg).expect("due").1, Due::Idle);
        a.read_some();
        assert_eq!(a.due(&cfg).expect("due").1, Due::Header, "a head began");
    }

    #[test]
    fn the_cap_is_half_the_open_files() {
        assert_eq!(fit_to_nofile(1024, Some(1024)), 512);
        assert_eq!(fit_to_nofile(1024, Some(1 << 20)), 1024);
        assert_eq!(fit_to_nofile(1024, None), 1024);
    }
}
