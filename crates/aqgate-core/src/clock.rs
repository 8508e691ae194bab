//! The clock, injected so that delay, expiration and session timeouts are testable
//! without sleeping. It is also what the engine waits with (a long poll's deadline): the
//! engine takes no time and no timer from anywhere else.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Micros = i64;

pub const MICROS_PER_SEC: i64 = 1_000_000;

pub trait Clock: Send + Sync + 'static {
    /// AQ's time: enqueue times, delays, expirations, session idleness.
    fn now(&self) -> Micros;

    /// The monotonic time waits are measured in (a long poll's deadline). Real time for
    /// both clocks here: a [`ManualClock`] moves AQ's time, not how long a wait lasts.
    fn instant(&self) -> std::time::Instant {
        std::time::Instant::now()
    }

    /// The server's time zone: its offset from UTC at `at`, in seconds east (what a
    /// remote queue space's `HH:MM` schedule means). UTC unless the clock knows better.
    fn utc_offset(&self, _at: Micros) -> i64 {
        0
    }

    /// Resolves at `deadline` (of [`Clock::instant`]).
    fn sleep_until(&self, deadline: std::time::Instant) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    /// The process's local time zone (`TZ`, else the system's).
    fn utc_offset(&self, at: Micros) -> i64 {
        use chrono::{Local, Offset, TimeZone};
        chrono::DateTime::from_timestamp_micros(at)
            .map_or(0, |t| i64::from(Local.offset_from_utc_datetime(&t.naive_utc()).fix().local_minus_utc()))
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start: Micros) -> Self {
        Self(AtomicI64::new(start))
    }
    pub fn advance_secs(&self, secs: i64) {
        self.0.fetch_add(secs * MICROS_PER_SEC, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}
