//! Whom a group-commit writer should wait for before it writes.
//!
//! A writer that starts its statement as soon as one request is queued splits a steady
//! group of producers in two: the first to come back after a commit is written alone
//! while the others queue behind it. Each statement costs about as much for one row as
//! for four (a round trip, executor start-up and a WAL flush), so half-empty statements
//! halve throughput. PostgreSQL's own `commit_delay` answers this by sleeping when other
//! transactions are active; this answers it with what the writer knows better: which
//! producers it has just answered and how fast each one came back before.
//!
//! A *regular* is a source (one client connection) that came back within [`MAX_RETURN`]
//! of its last answer. While a regular that was answered recently is not yet queued, the writer waits
//! for it until it is late: its last return time and half again, plus [`SLACK`]. Nobody
//! else makes the writer wait: a producer seen once, or one that comes back slowly, is
//! written at once. The wait never exceeds [`MAX_WAIT`] after the batch's first request
//! (plus up to one tick of the runtime's timer, which counts in milliseconds).
//!
//! Pure bookkeeping: the caller passes the times, the tests drive it with made-up ones.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A source that takes longer than this to come back is not waited for.
pub const MAX_RETURN: Duration = Duration::from_millis(1);
/// Margin on a regular's expected return (scheduling jitter).
pub const SLACK: Duration = Duration::from_micros(50);
/// The longest a batch waits for regulars, from its first request.
pub const MAX_WAIT: Duration = Duration::from_millis(1);
/// Sources not answered for this long are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Seen {
    /// When its last request was answered, while it has not come back since.
    answered: Option<Instant>,
    /// How long it took to come back last time.
    back_after: Option<Duration>,
}

/// Return times of the sources seen lately, and the regulars expected back now with the
/// time each becomes late. Only the second is read per batch: it holds the regulars
/// answered within about the last millisecond, however many sources there are.
#[derive(Default)]
pub struct Regulars {
    seen: HashMap<u64, Seen>,
    expected: HashMap<u64, Instant>,
    last_pruned: Option<Instant>,
}

impl Regulars {
    /// A request of `source`, submitted at `at`, is in the writer's hands.
    pub fn arrived(&mut self, source: u64, at: Instant) {
        self.expected.remove(&source);
        let s = self.seen.entry(source).or_default();
        if let Some(a) = s.answered.take() {
            s.back_after = Some(at.saturating_duration_since(a));
        }
    }

    /// `source`'s request was answered at `now`.
    pub fn answered(&mut self, source: u64, now: Instant) {
        let s = self.seen.entry(source).or_default();
        s.answered = Some(now);
        match s.back_after {
            Some(back) if back <= MAX_RETURN => {
                self.expected.insert(source, now + back + back / 2 + SLACK);
            }
            _ => {
                self.expected.remove(&source);
            }
        }
        if self.last_pruned.is_none_or(|p| now.saturating_duration_since(p) > FORGET_AFTER) {
            self.seen.retain(|_, s| s.answered.is_none_or(|a| now.saturating_duration_since(a) < FORGET_AFTER));
            self.last_pruned = Some(now);
        }
    }

    /// The writer answered all of `sources` (0: unknown, not tracked) at `now`.
    pub fn answered_all(&mut self, sources: impl IntoIterator<Item = u64>, now: Instant) {
        for s in sources.into_iter().filter(|s| *s != 0) {
            self.answered(s, now);
        }
    }

    /// Until when the batch that began at `started` should wait for regulars that have not
    /// come back yet, or `None` when nobody is expected any more at `now` (late regulars
    /// are dropped from the expected ones).
    pub fn wait_until(&mut self, started: Instant, now: Instant) -> Option<Instant> {
        self.expected.retain(|_, due| *due > now);
        let due = *self.expected.values().max()?;
        Some(due.min(started + MAX_WAIT)).filter(|until| *until > now)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Answered at t0, back at t0 + back: a regular with that return time.
    fn regular(r: &mut Regulars, source: u64, t0: Instant, back: Duration) {
        r.answered(source, t0);
        r.arrived(source, t0 + back);
    }

    #[test]
    fn a_regular_answered_just_now_is_waited_for_until_it_is_late() {
        let t = Instant::now();
        let mut r = Regulars::default();
        regular(&mut r, 1, t, us(200));
        regular(&mut r, 2, t, us(200));
        let t1 = t + us(1_000);
        r.answered(1, t1);
        r.answered(2, t1);
        // 1 is back and in the batch; 2 is expected until 200 + 100 + 50 µs after t1.
        r.arrived(1, t1 + us(150));
        let until = r.wait_until(t1 + us(150), t1 + us(150));
        assert_eq!(until, Some(t1 + us(350)));
        // Past that it is late: no more waiting.
        assert_eq!(r.wait_until(t1 + us(150), t1 + us(351)), None);
        // Once it is in the batch, nobody is missing.
        r.arrived(2, t1 + us(210));
        assert_eq!(r.wait_until(t1 + us(150), t1 + us(210)), None);
    }

    #[test]
    fn strangers_and_slow_sources_are_not_waited_for() {
        let t = Instant::now();
        let mut r = Regulars::default();
        // Seen once: never came back, so no return time.
        r.answered(7, t);
        // Came back, but slower than MAX_RETURN.
        regular(&mut r, 8, t, MAX_RETURN + us(1));
        r.answered(8, t + us(5_000));
        assert_eq!(r.wait_until(t + us(5_010), t + us(5_010)), None);
    }

    #[test]
    fn the_wait_is_capped_from_the_first_request_of_the_batch() {
        let t = Instant::now();
        let mut r = Regulars::default();
        regular(&mut r, 1, t, us(900));
        let t1 = t + us(2_000);
        r.answered(1, t1);
        // Expected until 900 + 450 + 50 µs after t1, but the batch began at t1 + 100 µs.
        let until = r.wait_until(t1 + us(100), t1 + us(100));
        assert_eq!(until, Some(t1 + us(100) + MAX_WAIT));
    }

    #[test]
    fn the_latest_expected_regular_sets_the_wait() {
        let t = Instant::now();
        let mut r = Regulars::default();
        regular(&mut r, 1, t, us(100));
        regular(&mut r, 2, t, us(400));
        let t1 = t + us(3_000);
        r.answered(1, t1);
        r.answered(2, t1);
        assert_eq!(r.wait_until(t1, t1), Some(t1 + us(650)));
        // 2 is back: only 1 is awaited, until 100 + 50 + 50 µs.
        r.arrived(2, t1 + us(10));
        assert_eq!(r.wait_until(t1, t1 + us(10)), Some(t1 + us(200)));
    }

    #[test]
    fn sources_gone_for_a_while_are_forgotten() {
        let t = Instant::now();
        let mut r = Regulars::default();
        for s in 0..100 {
            regular(&mut r, s, t, us(100));
            r.answered(s, t + us(200));
        }
        assert_eq!(r.len(), 100);
        r.answered(1_000, t + FORGET_AFTER + us(300));
        assert_eq!(r.len(), 1);
    }
}
