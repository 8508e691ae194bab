//! [`Health`]: whether the database takes writes, as the store last saw it (readiness,
//! `/metrics`, and the background duties that pause while it is away).

/// What the last check of the database found (see [`Store::check_health`](super::Store::check_health)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// A small write committed.
    Ready,
    /// The database refused the write for want of space (fault 1653).
    Full,
    /// The database could not take the write: why (a short, classified reason, never the
    /// database's own text: it is shown to anyone who asks `/readyz`).
    Unavailable(String),
    /// No check finished recently enough to say (the store's checks are stale, or the first
    /// one is still running): why.
    Unknown(String),
}

/// The database's health as this process sees it: the last check's verdict, whether an
/// outage is going on (seen by a check or by a request that failed for it), and how many
/// there were.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub readiness: Readiness,
    /// False from the first failure that means the database is away (connection refused
    /// or lost, no connection to be had, writes refused as on a standby) until a check
    /// commits a write again.
    pub available: bool,
    /// Outages since the process started.
    pub outages: u64,
    /// Seconds of the outage going on, or else of the last one (0: none yet).
    pub outage_seconds: f64,
    /// Tables this process vacuumed ([`crate::store::Store::vacuum`]), and the dead rows
    /// they held, since it started.
    pub vacuums: u64,
    pub vacuumed_rows: u64,
    /// Tables this process analyzed alone, their statistics due but not their dead rows.
    pub analyzes: u64,
}

impl Default for Health {
    /// A store that does not check: ready and available.
    fn default() -> Self {
        Self {
            readiness: Readiness::Ready,
            available: true,
            outages: 0,
            outage_seconds: 0.0,
            vacuums: 0,
            vacuumed_rows: 0,
            analyzes: 0,
        }
    }
}

/// One table [`crate::store::Store::vacuum`] vacuumed, or analyzed only: its live and dead
/// rows and the rows changed since its statistics were gathered, as the database counted
/// them before, and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Vacuumed {
    pub table: &'static str,
    pub live: i64,
    pub dead: i64,
    pub changed: i64,
    /// Vacuumed (and analyzed); false: analyzed only, its statistics due, not its dead rows.
    pub vacuumed: bool,
    pub took: std::time::Duration,
}
