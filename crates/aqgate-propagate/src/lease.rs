//! One process at a time runs a job: the job's lease in the store (`JobStore`), and the
//! status its holder reports with each renewal.
//!
//! - The lease names its holder (`host:pid:random`, one per process) and ends at a time of
//!   the holder's engine clock, `ttl` after its last renewal; the holder renews it every
//!   `ttl / 3` (the heartbeat). Nodes sharing a database are assumed to agree on the time
//!   within a fraction of `ttl`.
//! - A process that cannot renew (the store says another holds it, or no renewal has
//!   succeeded for `ttl`) stops the job's workers: their batches in flight commit or fail
//!   on their own, since exactly-once rests on each batch's transaction; the lease only keeps
//!   the work in one place.
//! - Another process takes the lease once it has ended, its holder having died; only a
//!   process that has just taken it rolls back the job's open batches (the dead holder's).
//! - The heartbeat carries the job's [`Report`]: its state and what it did since the last
//!   one (counts are flushed then, not per message), for `admin jobs` and `/metrics` in any
//!   process.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::clock::Micros;
use aqgate_core::engine::Engine;
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::store::JobReport;
use aqgate_core::topology::schedule::Window;
use tokio::sync::watch;

use super::job::Doing;
use super::{Counters, Ending, Stats};

/// How long a lease lasts unrenewed, and who this process is.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub ttl: Duration,
    /// This process's name in leases (`host:pid:random`).
    pub owner: String,
    /// This process's gateway links, as its jobs see them.
    pub board: Arc<super::gateway::Board>,
    /// This process as the gateway's agent (`control`).
    pub agent: Arc<super::control::Agent>,
}

impl LeaseConfig {
    /// A lease of `ttl`, held under this process's name.
    pub fn new(ttl: Duration) -> Self {
        let owner = process_owner();
        Self {
            ttl,
            board: Arc::new(super::gateway::Board::new(&owner)),
            agent: Arc::new(super::control::Agent::new(&owner)),
            owner,
        }
    }

    /// Inbound gateway jobs take bodies of up to `n` bytes on links that set no
    /// `max_message_bytes` of their own.
    #[must_use]
    pub fn broker_max_message_bytes(mut self, n: u64) -> Self {
        self.board = Arc::new(super::gateway::Board::new(&self.owner).max_message_bytes(n));
        self
    }

    /// How often a held lease is renewed (and a free one looked for).
    pub fn heartbeat(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(100))
    }

    pub fn ttl_micros(&self) -> Micros {
        i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX)
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new(Duration::from_secs(15))
    }
}

/// `host:pid:random`: unique per process, and telling the operator which one it is.
pub fn process_owner() -> String {
    let host = host_name();
    let random = aqgate_core::engine::session::random_id();
    format!("{host}:{}:{}", std::process::id(), &random[..8])
}

/// This host's name, from `/etc/hostname` (`localhost` when it names none or is no plain
/// host name), read once.
fn host_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
            .unwrap_or_else(|| "localhost".to_string())
    })
    .clone()
}

/// Whether the lease holder `other` was a process of this host that no longer runs, seen
/// from process `me` (both `host:pid:random`): its pid is gone, or it is this process's
/// own pid under another random part (a container restarted, pid 1 again). A host whose
/// name is unknown (`localhost`) says nothing: machines may share that name.
pub fn dead_here(other: &str, me: &str) -> bool {
    let split = |o: &str| -> Option<(String, u32, String)> {
        let mut parts = o.splitn(3, ':');
        Some((parts.next()?.to_string(), parts.next()?.parse().ok()?, parts.next()?.to_string()))
    };
    let (Some((host, pid, random)), Some((my_host, my_pid, my_random))) = (split(other), split(me)) else {
        return false;
    };
    if host != my_host || host == "localhost" || random == my_random {
        return false;
    }
    pid == my_pid || !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Ends the leases held by dead processes of this host (see [`dead_here`]), so that a
/// process restarted after a crash takes its jobs at once instead of after the lease time.
/// A failure only means waiting for the leases to end.
pub async fn end_dead_local_leases(store: &dyn aqgate_core::store::Store, me: &str) {
    let rows = match store.job_statuses().await {
        Ok(rows) => rows,
        Err(e) => return super::job::store_failed(&e, "reading the propagation leases failed"),
    };
    let mut dead: Vec<String> = rows.into_iter().filter_map(|r| r.owner).filter(|o| dead_here(o, me)).collect();
    dead.sort();
    dead.dedup();
    for owner in dead {
        match store.job_leases_clear(Some(&owner)).await {
            Ok(n) => {
                tracing::info!(owner = %owner, jobs = n, "ended the propagation leases of a dead process of this host")
            }
            Err(e) => tracing::warn!(owner = %owner, error = %e, "ending a dead process's leases failed"),
        }
    }
}

/// Ends the claims on spooled mail held by dead processes of this host (see [`dead_here`]):
/// a mail a crashed worker had claimed is forwarded at once by the restarted process, not
/// after the claim's lease. A failure only means waiting for the claims to end.
pub async fn end_dead_local_claims(store: &dyn aqgate_core::store::Store, me: &str, now: aqgate_core::clock::Micros) {
    let owners = match store.spool_claim_owners(now).await {
        Ok(o) => o,
        Err(e) => return super::job::store_failed(&e, "reading the spool's claims failed"),
    };
    for owner in owners.into_iter().filter(|o| dead_here(o, me)) {
        match store.spool_unclaim(&owner, now).await {
            Ok(n) => {
                tracing::info!(owner = %owner, mails = n, "took back the spool claims of a dead process of this host")
            }
            Err(e) => tracing::warn!(owner = %owner, error = %e, "ending a dead process's spool claims failed"),
        }
    }
}

/// The error texts kept in the store are cut to this many characters.
const MAX_ERROR: usize = 500;

/// What a job did since the last heartbeat, bumped by its workers, and what they are doing:
/// FAILED while any worker is stuck on a message refused for good, else RETRYING while any
/// backs off, else RUNNING.
#[derive(Debug, Default)]
pub struct Report {
    propagated: AtomicI64,
    failed: AtomicI64,
    exceptions: AtomicI64,
    /// Workers retrying, and workers failed.
    retrying: AtomicI64,
    failing: AtomicI64,
    error: Mutex<Option<(String, Micros)>>,
    success_at: AtomicI64,
}

impl Report {
    /// A batch that counted itself in its own transaction (`JobTally`): only its time.
    pub fn committed(&self, now: Micros) {
        self.success_at.fetch_max(now, Ordering::Relaxed);
    }

    pub fn moved(&self, n: u64, now: Micros) {
        self.propagated.fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
        self.success_at.fetch_max(now, Ordering::Relaxed);
    }

    pub fn excepted(&self, n: u64, now: Micros) {
        self.exceptions.fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
        self.success_at.fetch_max(now, Ordering::Relaxed);
    }

    /// A failed batch, and why.
    pub fn failed(&self, why: &str, now: Micros) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let text: String = why.chars().take(MAX_ERROR).collect();
        *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((text, now));
    }

    /// A worker that was doing `from` does `to` now.
    pub fn shift(&self, from: Doing, to: Doing) {
        if from == to {
            return;
        }
        for (d, by) in [(from, -1), (to, 1)] {
            match d {
                Doing::Running => {}
                Doing::Retrying => _ = self.retrying.fetch_add(by, Ordering::Relaxed),
                Doing::Failed => _ = self.failing.fetch_add(by, Ordering::Relaxed),
            }
        }
    }

    pub fn doing(&self) -> Doing {
        if self.failing.load(Ordering::Relaxed) > 0 {
            Doing::Failed
        } else if self.retrying.load(Ordering::Relaxed) > 0 {
            Doing::Retrying
        } else {
            Doing::Running
        }
    }

    /// Takes what happened since the last call, to be reported with `state`.
    pub fn take(&self, state: &str) -> JobReport {
        let success = self.success_at.swap(0, Ordering::Relaxed);
        JobReport {
            state: state.to_string(),
            propagated: self.propagated.swap(0, Ordering::Relaxed),
            failed: self.failed.swap(0, Ordering::Relaxed),
            exceptions: self.exceptions.swap(0, Ordering::Relaxed),
            error: self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(),
            success_at: (success > 0).then_some(success),
        }
    }

    /// Puts back a report the store did not take, so that the next one carries it.
    pub fn restore(&self, r: JobReport) {
        self.propagated.fetch_add(r.propagated, Ordering::Relaxed);
        self.failed.fetch_add(r.failed, Ordering::Relaxed);
        self.exceptions.fetch_add(r.exceptions, Ordering::Relaxed);
        if let Some(t) = r.success_at {
            self.success_at.fetch_max(t, Ordering::Relaxed);
        }
        let mut e = self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if e.is_none() {
            *e = r.error;
        }
    }
}

/// Time from now (`now`) to `t`, of the engine clock.
fn until(t: Micros, now: Micros) -> Duration {
    Duration::from_micros(u64::try_from(t.saturating_sub(now)).unwrap_or(0))
}

/// Resolves when the job is told to end (at once if it was), or its sender is gone.
async fn ended(ending: &mut watch::Receiver<Option<Ending>>) {
    let _ = ending.wait_for(Option::is_some).await;
}

/// The job's `Ending`, `Stop` if the supervisor is gone.
fn ending_of(ending: &watch::Receiver<Option<Ending>>) -> Option<Ending> {
    if ending.has_changed().is_err() {
        return Some(Ending::Stop);
    }
    *ending.borrow()
}

/// One job in this process, until told to end: inside its schedule's windows it takes the
/// lease when it is free and runs the workers while it holds it.
pub(crate) async fn job(
    engine: Arc<Engine>,
    job: PropagationInfo,
    cfg: Arc<LeaseConfig>,
    mut ending: watch::Receiver<Option<Ending>>,
) {
    let counters = Counters::new(&engine, &job.name);
    let report = Arc::new(Report::default());
    let store = engine.store().clone();
    // Removed from the topology, the job finishes its batch in flight as its agent.
    let _agent = engine.retain_agent(&job.agent);
    while ending_of(&ending).is_none() {
        let now = engine.now();
        let closes = match job.schedule.window(now) {
            Window::Open { until } => until,
            Window::Closed { next } => {
                // No lease and no receive outside a window (`admin jobs` says ENABLED and
                // when the next one opens).
                tracing::info!(job = %job.name, next_window = ?next, "outside the schedule's window");
                match next {
                    Some(t) => tokio::select! {
                        () = tokio::time::sleep(until(t, now)) => {}
                        () = ended(&mut ending) => {}
                    },
                    None => ended(&mut ending).await,
                }
                continue;
            }
        };
        match store.job_lease(&job.name, &cfg.owner, now, now.saturating_add(cfg.ttl_micros())).await {
            Ok(true) => {
                tracing::info!(job = %job.name, owner = %cfg.owner, "took the job's lease");
                let held = (&counters, &report);
                match tenure(&engine, &job, &cfg, held, (now, closes), &mut ending).await {
                    Some(Ending::Removed) => return,
                    None if removed(&engine, &job).await => return,
                    _ => continue,
                }
            }
            Ok(false) => {}
            Err(e) => super::job::store_failed(&e, &format!("job {}: taking the job's lease failed", job.name)),
        }
        tokio::select! {
            () = tokio::time::sleep(cfg.heartbeat()) => {}
            () = ended(&mut ending) => {}
        }
    }
}

/// Whether `job`, whose lease was lost, is gone from the stored topology (a forced
/// removal took its row): the process's topology is reloaded then, so that the job is not
/// taken again, and the rows its last batch may have written go.
async fn removed(engine: &Engine, job: &PropagationInfo) -> bool {
    match aqgate_core::engine::load_resolved(engine.store().as_ref()).await {
        Ok(r) if r.catalog.propagations.contains_key(&job.name) => false,
        Ok(_) => {
            tracing::info!(job = %job.name, "the job is gone from the stored topology: reloading it");
            if let Err(e) = engine.reload().await {
                tracing::warn!(job = %job.name, error = %e.message, "reloading the topology failed");
            }
            // What its last batch wrote after the removal deleted the job's rows; a pending
            // removal's are deleted once its broker state has gone (`removals::finish`).
            let pending = super::removals::load(engine.store().as_ref())
                .await
                .map(|rs| rs.iter().any(|r| r.name == job.name && r.pending.is_some()))
                .unwrap_or(true);
            if pending {
                return true;
            }
            if let Err(e) = engine.store().gateway_job_drop(&job.agent).await {
                tracing::warn!(job = %job.name, error = %e, "forgetting the removed job's doubts and marks failed");
            }
            true
        }
        Err(e) => {
            tracing::warn!(job = %job.name, error = %e.message, "reading the stored topology failed");
            false
        }
    }
}

/// Runs the job's workers while the lease is held (taken at `taken`) and the window lasts
/// (until `closes`, if it closes), renewing the lease and reporting on every heartbeat;
/// returns, once the workers have stopped, why they did (`None`: the lease was lost or the
/// window closed).
async fn tenure(
    engine: &Arc<Engine>,
    job: &PropagationInfo,
    cfg: &LeaseConfig,
    (counters, report): (&Counters, &Arc<Report>),
    (taken, closes): (Micros, Option<Micros>),
    ending: &mut watch::Receiver<Option<Ending>>,
) -> Option<Ending> {
    let store = engine.store().clone();
    let (stop, stop_rx) = watch::channel(false);
    let mut rolled_back = end_earlier_batches(engine, job, taken).await;
    let stats = Stats { counters: counters.clone(), report: report.clone(), stop: stop_rx };
    let mut workers = tokio::spawn(super::work(engine.clone(), job.clone(), stats, cfg.board.clone()));
    let closing = async {
        match closes {
            Some(t) => tokio::time::sleep(until(t, engine.now())).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(closing);
    let mut why: Option<Ending> = None;
    let mut held = true;
    let mut renewed = Instant::now();
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + cfg.heartbeat(), cfg.heartbeat());
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut workers => break,
            _ = beat.tick(), if held => {
                if !rolled_back {
                    rolled_back = end_earlier_batches(engine, job, taken).await;
                }
                let state = if why == Some(Ending::Removed) { "DELETE_PENDING" } else { report.doing().name() };
                let r = report.take(state);
                let now = engine.now();
                match store.job_report(&job.name, &cfg.owner, now, Some(now.saturating_add(cfg.ttl_micros())), &r).await {
                    Ok(Some(o)) if o == cfg.owner => renewed = Instant::now(),
                    Ok(other) => {
                        tracing::warn!(job = %job.name, holder = ?other, "lost the job's lease; stopping its workers");
                        held = false;
                        let _ = stop.send(true);
                    }
                    Err(e) => {
                        report.restore(r);
                        if renewed.elapsed() >= cfg.ttl {
                            tracing::warn!(job = %job.name, error = %e, "could not renew the job's lease; stopping its workers");
                            held = false;
                            let _ = stop.send(true);
                        } else {
                            super::job::store_failed(&e, &format!("job {}: renewing the job's lease failed; trying again", job.name));
                        }
                    }
                }
            }
            () = ended(ending), if why.is_none() => {
                why = ending_of(ending);
                let _ = stop.send(true);
                if why == Some(Ending::Removed) && held {
                    // Said at once, not at the next heartbeat: the batch in flight may take a while.
                    let now = engine.now();
                    let until = Some(now.saturating_add(cfg.ttl_micros()));
                    let r = report.take("DELETE_PENDING");
                    if let Err(e) = store.job_report(&job.name, &cfg.owner, now, until, &r).await {
                        tracing::warn!(job = %job.name, error = %e, "reporting DELETE_PENDING failed");
                        report.restore(r);
                    }
                }
            }
            () = &mut closing, if !*stop.borrow() => {
                tracing::info!(job = %job.name, "the schedule's window closed");
                let _ = stop.send(true);
            }
        }
    }
    // The workers have stopped. A removed job that owns state at its broker gives its lease
    // up, DELETE_PENDING, for the removal's task (`removals::finish`, in this process or
    // another) to end that state; any other removed job's row goes now, with its doubts and
    // marks. Else the lease is given up so that another process may take the job at once;
    // what is left of the report goes with it.
    if why == Some(Ending::Removed) {
        if held && super::job::owned(job).is_some() {
            let now = engine.now();
            if let Err(e) = store.job_report(&job.name, &cfg.owner, now, None, &report.take("DELETE_PENDING")).await {
                tracing::warn!(job = %job.name, error = %e, "giving up the removed job's lease failed; it ends by itself");
            }
        } else if held {
            if let Err(e) = store.gateway_job_drop(&job.agent).await {
                tracing::warn!(job = %job.name, error = %e, "forgetting the removed job's doubts and marks failed");
            }
            match store.job_forget(&job.name, &cfg.owner, engine.now()).await {
                Ok(_) => tracing::info!(job = %job.name, "the removed job finished; its status is gone"),
                Err(e) => tracing::warn!(job = %job.name, error = %e, "deleting the job's status failed"),
            }
        }
        return why;
    }
    let now = engine.now();
    if let Err(e) = store.job_report(&job.name, &cfg.owner, now, None, &report.take(report.doing().name())).await {
        tracing::warn!(job = %job.name, error = %e, "giving up the job's lease failed; it ends by itself");
    }
    why
}

/// Rolls back the batches the job's agent left open before `taken` (when this process took
/// the lease: they are its dead holder's, killed between a batch's receives and its commit),
/// so their messages move now rather than after the session timeout. False if that failed
/// (tried again at the next heartbeat).
async fn end_earlier_batches(engine: &Engine, job: &PropagationInfo, taken: Micros) -> bool {
    match engine.end_sessions_of(&job.agent, taken).await {
        Ok(0) => true,
        Ok(n) => {
            tracing::info!(job = %job.name, sessions = n, "ended the sessions of the job's earlier holder, rolling back its open batches");
            true
        }
        Err(e) => {
            tracing::warn!(job = %job.name, error = %e.message, "rolling back earlier batches failed; trying again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_of_this_host_is_told_from_a_live_one() {
        let me = format!("box:{}:aaaa", std::process::id());
        // Same pid, other random part: this process's predecessor (a restarted container).
        assert!(dead_here(&format!("box:{}:bbbb", std::process::id()), &me));
        // A pid that no process has (beyond the kernel's pid_max).
        assert!(dead_here("box:999999999:bbbb", &me));
        // Pid 1 runs: alive. Another host, an unknown host, or this very process: not dead.
        assert!(!dead_here("box:1:bbbb", &me));
        assert!(!dead_here("other:999999999:bbbb", &me));
        assert!(!dead_here(&me, &me));
        let local = format!("localhost:{}:aaaa", std::process::id());
        assert!(!dead_here("localhost:999999999:bbbb", &local));
        assert!(!dead_here("garbage", &me));
    }

    #[test]
    fn a_report_hands_on_what_happened_once_and_takes_back_what_was_not_stored() {
        let r = Report::default();
        r.moved(3, 10);
        r.excepted(1, 12);
        r.failed("remote down", 15);
        r.shift(Doing::Running, Doing::Retrying);
        assert_eq!(r.doing(), Doing::Retrying);
        let got = r.take("RETRYING");
        assert_eq!((got.propagated, got.failed, got.exceptions, got.success_at), (3, 1, 1, Some(12)));
        assert_eq!(got.error, Some(("remote down".to_string(), 15)));
        assert_eq!(r.take("RUNNING"), JobReport { state: "RUNNING".into(), ..JobReport::default() });
        r.moved(2, 20);
        r.restore(got);
        let again = r.take("RUNNING");
        assert_eq!((again.propagated, again.failed, again.success_at), (5, 1, Some(20)));
        // Two workers: one failed, one retrying, then the failed one goes on.
        r.shift(Doing::Running, Doing::Failed);
        assert_eq!(r.doing(), Doing::Failed);
        r.shift(Doing::Failed, Doing::Running);
        assert_eq!(r.doing(), Doing::Retrying);
        r.shift(Doing::Retrying, Doing::Running);
        assert_eq!(r.doing(), Doing::Running);
        r.failed(&"x".repeat(2000), 30);
        let long = r.take("FAILED");
        assert_eq!((long.failed, long.error.map(|e| e.0.len())), (1, Some(MAX_ERROR)));
    }

    #[test]
    fn owners_differ_per_process_handle() {
        let (a, b) = (LeaseConfig::default(), LeaseConfig::default());
        assert_ne!(a.owner, b.owner);
        assert!(a.owner.contains(&format!(":{}:", std::process::id())), "{}", a.owner);
        assert_eq!(a.heartbeat(), Duration::from_secs(5));
    }
}
