//! The overview's live figures: one sampler per console (so one per process, for every
//! viewer), started by the first page, fragment or stream that needs it. Every
//! `sample_every` (clamped to 1–10 s; longer after a slow sample, see `pause`) it makes one grouped read of the store
//! (`Store::queue_figures`: each queue's READY, WAIT and EXPIRED messages, its oldest READY
//! one, the messages new since the last sample) and two counts (`Store::spool_backlog`,
//! `NotifyStore::notify_counts`), and keeps, per queue, the last figures and an hour of
//! enqueue and dequeue counts in a ring of minute buckets. At most [`MAX_TRACKED`] queues
//! are tracked; a queue that has been empty for an hour is dropped.
//!
//! Enqueues are the messages with a `seq` above the last sample's (committed since), and at
//! least the depth's rise; dequeues are what the enqueues and the depth's change leave.
//! A message that came and went between two samples is not seen.
//!
//! Each sample that changes a figure raises the generation the event streams wait on, and
//! marks which queues (and whether the backlog) changed with it.
//!
//! Nobody looking, nothing sampled: with no event stream open and no page or fragment
//! asked for in [`IDLE`], the task ends (the figures stay); the next request starts it
//! again, and what came and went meanwhile counts in that minute.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use aqgate_core::clock::Micros;
use aqgate_core::engine::Engine;
use aqgate_core::store::{QueueFigures, QueueId};

/// Queues tracked at most (the rest are left out of the overview's figures).
pub(crate) const MAX_TRACKED: usize = 10_000;
/// A bucket's length, and how many are kept: an hour.
pub(crate) const BUCKET: Duration = Duration::from_secs(60);
pub(crate) const BUCKETS: usize = 60;

/// The sampling interval's bounds.
pub(crate) const EVERY_MIN: Duration = Duration::from_secs(1);
pub(crate) const EVERY_MAX: Duration = Duration::from_secs(10);
/// The longest pause between two samples, however slow they are.
const SLOWEST: Duration = Duration::from_secs(60);
/// The sampling ends after this long with no stream open and no page asked for.
pub(crate) const IDLE: Duration = Duration::from_secs(60);

/// One minute's counts of a queue.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bucket {
    /// Minutes since the sampler started.
    pub minute: u64,
    pub enqueued: i64,
    pub dequeued: i64,
}

/// What the sampler knows of one queue.
#[derive(Debug, Clone, Default)]
pub(crate) struct Track {
    pub now: QueueFigures,
    /// The generation of the sample that last changed it.
    pub changed: u64,
    pub buckets: VecDeque<Bucket>,
}

impl Track {
    /// The last hour's counts, oldest first, one per bucket (empty minutes as zeros), up to `minute`.
    pub(crate) fn hour(&self, minute: u64) -> Vec<Bucket> {
        (0..BUCKETS as u64)
            .rev()
            .map(|back| {
                let m = minute.checked_sub(back);
                m.and_then(|m| self.buckets.iter().find(|b| b.minute == m).copied()).unwrap_or_default()
            })
            .collect()
    }

    fn add(&mut self, minute: u64, enqueued: i64, dequeued: i64) {
        if enqueued == 0 && dequeued == 0 {
            return;
        }
        match self.buckets.back_mut() {
            Some(b) if b.minute == minute => {
                b.enqueued += enqueued;
                b.dequeued += dequeued;
            }
            _ => self.buckets.push_back(Bucket { minute, enqueued, dequeued }),
        }
        while self.buckets.len() > BUCKETS {
            self.buckets.pop_front();
        }
    }
}

/// The sampler's figures, as of its last sample: a snapshot no sample changes (the next
/// one is a new snapshot sharing the tracks that did not change).
#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    /// Raised by every sample that changed something.
    pub generation: u64,
    /// Whether a sample was made (else the figures are not known yet).
    pub sampled: bool,
    /// Whether the last sample's read failed (the figures are the one before).
    pub failed: bool,
    /// The engine's time of the last sample, and the sampler's minute.
    pub at: Micros,
    pub minute: u64,
    pub queues: HashMap<QueueId, Arc<Track>>,
    last_seq: i64,
    /// Spool backlog, notifications pending and parked, and the generation that changed them.
    pub spool: i64,
    pub notify_pending: i64,
    pub notify_parked: i64,
    pub backlog_changed: u64,
    /// The jobs' figures (the topology graph's), by job name, and the generation that last
    /// changed one.
    pub jobs: HashMap<String, JobTrack>,
    pub jobs_changed: u64,
}

/// What the sampler knows of one propagation or gateway job.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JobTrack {
    pub propagated: i64,
    /// Messages moved per second between its last two samples.
    pub rate: f64,
    /// The engine's time of its last sample.
    pub at: Micros,
    /// What the graph shows of it besides: state, requested state, backlog, failures.
    pub shown: (String, &'static str, i64, i64),
}

impl JobTrack {
    /// The job's track after a sample of `j` at `at`, from `last` (its track before).
    pub(crate) fn next(last: Option<&JobTrack>, j: &aqgate_admin::jobs::JobFigures, at: Micros) -> JobTrack {
        let rate = match last {
            #[allow(clippy::cast_precision_loss)]
            Some(l) if at > l.at && j.propagated >= l.propagated => {
                (j.propagated - l.propagated) as f64 * 1e6 / (at - l.at) as f64
            }
            _ => 0.0,
        };
        JobTrack { propagated: j.propagated, rate, at, shown: (j.state.clone(), j.requested, j.backlog, j.failed) }
    }

    /// Whether the graph would show it otherwise than `last`.
    fn differs(&self, last: Option<&JobTrack>) -> bool {
        last.is_none_or(|l| {
            l.shown != self.shown || l.propagated != self.propagated || (l.rate > 0.0) != (self.rate > 0.0)
        })
    }
}

/// The console's sampler (see the module's documentation), and the count of open streams.
pub(crate) struct Sampler {
    every: Duration,
    max_streams: usize,
    streams: AtomicUsize,
    started: AtomicBool,
    start: Instant,
    /// When a page or a fragment last asked (seconds since `start`).
    wanted: std::sync::atomic::AtomicU64,
    /// The last sample's snapshot: a reader holds the lock only to clone the `Arc`, so no
    /// render, however slow, holds up a sample or another reader.
    figures: RwLock<Arc<Figures>>,
    /// One sample at a time (the task's and a first page's).
    turn: tokio::sync::Mutex<()>,
    generation: watch::Sender<u64>,
}

impl Sampler {
    pub(crate) fn new(every: Duration, max_streams: usize) -> Arc<Self> {
        Arc::new(Self {
            every: every.clamp(EVERY_MIN, EVERY_MAX),
            max_streams,
            streams: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            start: Instant::now(),
            wanted: std::sync::atomic::AtomicU64::new(0),
            figures: RwLock::new(Arc::default()),
            turn: tokio::sync::Mutex::new(()),
            generation: watch::channel(0).0,
        })
    }

    /// The figures as of the last sample (a poisoned lock is taken over: they are plain data).
    pub(crate) fn figures(&self) -> Arc<Figures> {
        self.figures.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn publish(&self, f: Figures) {
        *self.figures.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(f);
    }

    /// The generations of the samples to come.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Starts the sampling task if it does not run yet, and makes the first sample if none
    /// was made. The task ends once the sampler is no console's.
    pub(crate) async fn ensure(self: &Arc<Self>, engine: &Arc<Engine>) {
        self.wanted.store(self.start.elapsed().as_secs(), Ordering::SeqCst);
        if !self.started.swap(true, Ordering::SeqCst) {
            let weak = Arc::downgrade(self);
            let engine = engine.clone();
            let every = self.every;
            tokio::spawn(async move {
                loop {
                    let Some(s) = weak.upgrade() else { return };
                    let took = s.sample(&engine).await;
                    if s.unwatched() {
                        // Ends, unless a request came in between (then it goes on).
                        s.started.store(false, Ordering::SeqCst);
                        if s.unwatched() || s.started.swap(true, Ordering::SeqCst) {
                            return;
                        }
                    }
                    drop(s);
                    tokio::time::sleep(pause(every, took)).await;
                }
            });
        }
        if !self.figures().sampled {
            self.sample(engine).await;
        }
    }

    /// One sample (see the module's documentation); how long its reads of the store took
    /// (what the pause before the next is measured by: not the wait for its turn).
    async fn sample(&self, engine: &Engine) -> Duration {
        let _turn = self.turn.lock().await;
        let store = engine.store();
        let now = engine.now();
        let after = self.figures().last_seq;
        let began = Instant::now();
        let read = tokio::try_join!(store.queue_figures(now, after), store.spool_backlog(), store.notify_counts());
        // The jobs' figures, over the running topology (a failure keeps the last ones).
        let jobs = aqgate_admin::jobs::jobs_in(store.as_ref(), &engine.resolved()).await;
        let took = began.elapsed();
        let (rows, spool, (pending, parked)) = match read {
            Ok(r) => r,
            Err(e) => {
                // An outage is logged once, by the store's health; a sample it fails is not news.
                if e.is_unavailable() {
                    tracing::debug!(error = %e, "console: the sampler's read failed");
                } else {
                    tracing::warn!(error = %e, "console: the sampler's read failed");
                }
                let last = self.figures();
                if !last.failed {
                    let mut f = Figures::clone(&last);
                    f.failed = true;
                    self.publish(f);
                }
                return took;
            }
        };
        let minute = self.start.elapsed().as_secs() / BUCKET.as_secs();
        let changed = {
            let mut f = Figures::clone(&self.figures());
            let first = !f.sampled;
            f.sampled = true;
            f.failed = false;
            f.at = now;
            f.minute = minute;
            let generation = f.generation + 1;
            let mut changed = first;
            if (f.spool, f.notify_pending, f.notify_parked) != (spool, pending, parked) {
                (f.spool, f.notify_pending, f.notify_parked) = (spool, pending, parked);
                f.backlog_changed = generation;
                changed = true;
            }
            match jobs {
                Ok(jobs) => {
                    let next: HashMap<String, JobTrack> =
                        jobs.iter().map(|j| (j.name.clone(), JobTrack::next(f.jobs.get(&j.name), j, now))).collect();
                    let moved = next.len() != f.jobs.len() || next.iter().any(|(n, t)| t.differs(f.jobs.get(n)));
                    if moved {
                        f.jobs_changed = generation;
                        changed = true;
                    }
                    f.jobs = next;
                }
                Err(e) => tracing::debug!(error = %e, "console: the sampler's read of the jobs failed"),
            }
            let mut seen: HashMap<QueueId, QueueFigures> = rows.iter().map(|r| (r.queue, *r)).collect();
            if let Some(top) = rows.iter().map(|r| r.last_seq).max() {
                f.last_seq = f.last_seq.max(top);
            }
            for (id, t) in &mut f.queues {
                let new = seen.remove(id).unwrap_or(QueueFigures { queue: *id, ..Default::default() });
                changed |= update(t, new, first, minute, generation);
            }
            for (id, new) in seen {
                if f.queues.len() >= MAX_TRACKED {
                    break;
                }
                let mut t =
                    Arc::new(Track { now: QueueFigures { queue: id, ..Default::default() }, ..Default::default() });
                update(&mut t, new, first, minute, generation);
                Arc::make_mut(&mut t).changed = generation;
                changed = true;
                f.queues.insert(id, t);
            }
            // Bounded: a queue empty and quiet for an hour is no longer tracked.
            f.queues.retain(|_, t| {
                depth(&t.now) > 0 || t.buckets.back().is_some_and(|b| b.minute + BUCKETS as u64 > minute)
            });
            if changed {
                f.generation = generation;
            }
            self.publish(f);
            changed.then_some(generation)
        };
        if let Some(g) = changed {
            self.generation.send_replace(g);
        }
        took
    }

    /// Whether nobody looks: no stream open, no page or fragment asked for in [`IDLE`].
    fn unwatched(&self) -> bool {
        self.unwatched_at(self.start.elapsed().as_secs())
    }

    /// [`Self::unwatched`] at `now` seconds since `start`.
    fn unwatched_at(&self, now: u64) -> bool {
        let since = now.saturating_sub(self.wanted.load(Ordering::SeqCst));
        self.streams.load(Ordering::SeqCst) == 0 && since >= IDLE.as_secs()
    }

    /// A slot for one more event stream, unless the cap is reached.
    pub(crate) fn open_stream(self: &Arc<Self>) -> Option<StreamSlot> {
        self.streams
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.max_streams).then_some(n + 1))
            .ok()
            .map(|_| StreamSlot(self.clone()))
    }
}

/// The pause after a sample that took `took`: the interval, or ten times as long as the
/// sample took when that is more (at most [`SLOWEST`]), so that sampling a large store
/// keeps the database busy a tenth of the time at most.
fn pause(every: Duration, took: Duration) -> Duration {
    every.max(took.saturating_mul(10)).min(SLOWEST)
}

/// A queue's committed messages.
pub(crate) fn depth(f: &QueueFigures) -> i64 {
    f.ready + f.waiting + f.expired
}

/// Takes a sample of one queue into its track (copied only when it changes: the last
/// snapshot shares it); whether anything shown changed.
fn update(t: &mut Arc<Track>, new: QueueFigures, first: bool, minute: u64, generation: u64) -> bool {
    let old = t.now;
    let rise = depth(&new) - depth(&old);
    let enqueued = if first { 0 } else { new.newer.max(rise).max(0) };
    let dequeued = enqueued - rise;
    let shown = |f: &QueueFigures| (f.ready, f.waiting, f.expired, f.oldest_ready);
    let changed = shown(&old) != shown(&new) || enqueued > 0 || dequeued > 0;
    if changed {
        let t = Arc::make_mut(t);
        t.add(minute, enqueued, dequeued.max(0));
        t.now = new;
        t.changed = generation;
    }
    changed
}

/// One open event stream, counted while it lives.
pub(crate) struct StreamSlot(Arc<Sampler>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enqueues_and_dequeues_come_from_new_messages_and_the_depth() {
        let mut t = Arc::new(Track::default());
        let q = |ready, newer| QueueFigures { ready, newer, ..Default::default() };
        assert!(update(&mut t, q(3, 3), false, 0, 1));
        assert!(update(&mut t, q(1, 0), false, 0, 2), "two dequeued");
        assert!(update(&mut t, q(2, 4), false, 1, 3), "four came, three went");
        assert!(!update(&mut t, q(2, 0), false, 1, 4), "nothing moved");
        let hour = t.hour(1);
        assert_eq!(hour.len(), BUCKETS);
        let (a, b) = (hour[BUCKETS - 2], hour[BUCKETS - 1]);
        assert_eq!((a.enqueued, a.dequeued, b.enqueued, b.dequeued), (3, 2, 4, 3));
        let shared = t.clone();
        assert!(update(&mut t, q(3, 1), false, 1, 5));
        assert_eq!(shared.now.ready, 2, "the snapshot's track is not changed");
        assert!(!update(&mut t, q(3, 0), false, 1, 6));
        let t = Arc::make_mut(&mut t);
        for m in 2..200 {
            t.add(m, 1, 0);
        }
        assert_eq!(t.buckets.len(), BUCKETS, "bounded");
    }

    #[test]
    fn a_jobs_rate_is_what_it_moved_between_two_samples() {
        let j = |propagated| aqgate_admin::jobs::JobFigures {
            name: "J".into(),
            state: "RUNNING".into(),
            requested: "ENABLED",
            actual: "RUNNING".into(),
            kind: "local",
            source: "A.Q".into(),
            destination: "A.R".into(),
            owner: None,
            propagated,
            failed: 0,
            exceptions: 0,
            backlog: 0,
            lag: 0.0,
            next_window: None,
            last_error: None,
            last_error_at: None,
            last_success_at: None,
            guarantee: None,
            options: None,
            batches_in_flight: None,
            in_doubt: 0,
        };
        let first = JobTrack::next(None, &j(10), 1_000_000);
        assert_eq!(first.rate, 0.0, "one sample: no rate");
        assert!(first.differs(None));
        let second = JobTrack::next(Some(&first), &j(40), 3_000_000);
        assert_eq!(second.rate, 15.0, "30 in 2 s");
        assert!(second.differs(Some(&first)));
        let third = JobTrack::next(Some(&second), &j(40), 5_000_000);
        assert_eq!(third.rate, 0.0);
        assert!(third.differs(Some(&second)), "it stopped moving");
        let fourth = JobTrack::next(Some(&third), &j(40), 7_000_000);
        assert!(!fourth.differs(Some(&third)), "nothing changed");
    }

    #[test]
    fn a_slow_sample_spaces_the_next_out() {
        let every = Duration::from_secs(2);
        assert_eq!(pause(every, Duration::from_millis(20)), every);
        assert_eq!(pause(every, Duration::from_millis(500)), Duration::from_secs(5));
        assert_eq!(pause(every, Duration::from_secs(30)), SLOWEST);
    }

    #[test]
    fn nobody_looking_is_a_minute_without_a_request_or_a_stream() {
        let s = Sampler::new(Duration::from_secs(2), 10);
        let idle = IDLE.as_secs();
        assert!(!s.unwatched_at(0), "just asked for");
        assert!(!s.unwatched_at(idle - 1));
        assert!(s.unwatched_at(idle));
        let slot = s.open_stream().expect("a stream");
        assert!(!s.unwatched_at(idle * 5), "a stream is open");
        drop(slot);
        assert!(s.unwatched_at(idle * 5), "the stream closed");
        s.wanted.store(idle * 5, Ordering::SeqCst);
        assert!(!s.unwatched_at(idle * 5 + 1), "a page asked");
    }
}
