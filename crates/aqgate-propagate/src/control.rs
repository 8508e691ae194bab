//! The control plane of a process that runs propagation jobs (the Messaging Gateway's
//! agent): it follows changes written to the store by any process (`admin apply`, `admin
//! jobs --enable/--disable/--remove`) without a signal, keeps the agent's row (status,
//! instance, last error) and answers pings (`admin gateway --ping`).
//!
//! - **Changes.** The store's `control_plane` row counts the stored topology's changes (a
//!   trigger bumps it in the changing transaction). On PostgreSQL its trigger NOTIFYs
//!   `aqgate_control` at the commit, heard by the store's listener (the long polls'
//!   LISTEN connection), and the row is read then and every 5 s besides; on SQLite the row
//!   is read every `poll` (300 ms: one primary-key read). When the topology counter moved,
//!   the process reloads its topology as on SIGHUP (the caller's `reload` channel), and the
//!   supervisor, woken by [`Agent::reloaded`], stops a disabled job before its next batch.
//! - **Status.** `STARTING` until the counters could be read, `RUNNING` while following
//!   them, `SHUTTING_DOWN` once told to stop and until every job has stopped, `NOT_STARTED`
//!   once it has. The row is written at each change and with every heartbeat (`ttl / 3`),
//!   and says until when it holds (`alive_until`, `ttl` on): a reader takes a row whose
//!   time passed while it said it ran for a process that died or hung (`BROKEN`), and the
//!   link rows of that process for stale.
//! - **Pings.** A ping bumps the ping counter; each running process, seeing it move, writes
//!   the ping's number into its row (`pong`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aqgate_core::clock::{Clock, MICROS_PER_SEC, Micros, SystemClock};
use aqgate_core::engine::Engine;
use aqgate_core::store::AgentStatus;
use tokio::sync::{Notify, mpsc, watch};

/// How often the counters are read where no signal says they changed (SQLite).
pub const POLL: Duration = Duration::from_millis(300);
/// How often they are read besides the signals (PostgreSQL).
const POLL_SIGNALLED: Duration = Duration::from_secs(5);
/// Agent rows not written for this long are forgotten, with their link rows.
const FORGET_AFTER: Micros = 24 * 3600 * MICROS_PER_SEC;
/// The error texts kept are cut to this many characters.
const MAX_ERROR: usize = 500;

/// What the agent says it is doing (the Messaging Gateway's AGENT_STATUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    NotStarted = 0,
    Starting = 1,
    Running = 2,
    ShuttingDown = 3,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::NotStarted => "NOT_STARTED",
            Status::Starting => "STARTING",
            Status::Running => "RUNNING",
            Status::ShuttingDown => "SHUTTING_DOWN",
        }
    }

    fn from_u8(n: u8) -> Self {
        match n {
            1 => Status::Starting,
            2 => Status::Running,
            3 => Status::ShuttingDown,
            _ => Status::NotStarted,
        }
    }
}

/// This process as an agent: its instance, status and last error, and the signals between
/// the control plane, the reload and the supervisor.
#[derive(Debug)]
pub struct Agent {
    owner: String,
    started_at: Micros,
    status: AtomicU8,
    error: Mutex<Option<(String, Micros)>>,
    /// Bumped after each reload of the topology (SIGHUP or a stored change).
    reloads: watch::Sender<u64>,
    /// Set once the supervisor has stopped every job.
    done: watch::Sender<bool>,
    /// Wakes the writer of the row at once.
    changed: Notify,
}

impl Agent {
    pub fn new(owner: &str) -> Self {
        Self {
            owner: owner.to_string(),
            started_at: SystemClock.now(),
            status: AtomicU8::new(Status::NotStarted as u8),
            error: Mutex::new(None),
            reloads: watch::Sender::new(0),
            done: watch::Sender::new(false),
            changed: Notify::new(),
        }
    }

    pub fn status(&self) -> Status {
        Status::from_u8(self.status.load(Ordering::Relaxed))
    }

    fn set(&self, s: Status) {
        if self.status.swap(s as u8, Ordering::Relaxed) != s as u8 {
            tracing::info!(status = s.name(), "agent status");
            self.changed.notify_one();
        }
    }

    /// An error of the agent's own (not a job's): its last error.
    pub fn failed(&self, why: &str, now: Micros) {
        let text: String = why.chars().take(MAX_ERROR).collect();
        *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((text, now));
        self.changed.notify_one();
    }

    /// The topology was reloaded: the supervisor looks at once.
    pub fn reloaded(&self) {
        self.reloads.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Resolves at the next reload.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// The supervisor has stopped every job.
    pub fn finished(&self) {
        self.done.send_replace(true);
    }

    fn row(&self, now: Micros, alive: Micros) -> AgentStatus {
        let mut parts = self.owner.splitn(3, ':');
        let host = parts.next().unwrap_or_default().to_string();
        let pid = parts.next().and_then(|p| p.parse().ok()).unwrap_or_default();
        let (last_error, last_error_at) =
            self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone().unzip();
        AgentStatus {
            owner: self.owner.clone(),
            host,
            pid,
            started_at: self.started_at,
            status: self.status().name().to_string(),
            last_error,
            last_error_at,
            updated_at: now,
            alive_until: now.saturating_add(alive),
            pong: 0,
        }
    }
}

/// Writes the agent's row, holding for `alive` from now.
async fn write(engine: &Engine, agent: &Agent, alive: Micros) {
    let row = agent.row(engine.now(), alive);
    if let Err(e) = engine.store().agent_put(&row).await {
        super::job::store_failed(&e, "writing the agent's status failed");
    }
}

/// Follows the control plane until every job has stopped (`Agent::finished`) after `stop`:
/// a moved topology counter asks for a reload on `reload`; a moved ping counter is answered.
pub async fn run(
    engine: Arc<Engine>,
    agent: Arc<Agent>,
    (ttl, poll): (Duration, Duration),
    reload: mpsc::Sender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let store = engine.store().clone();
    let alive = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
    agent.set(Status::Starting);
    write(&engine, &agent, alive).await;
    match store.agents_purge(engine.now().saturating_sub(FORGET_AFTER)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(agents = n, "forgot the rows of agents gone for a day"),
        Err(e) => super::job::store_failed(&e, "forgetting old agent rows failed"),
    }
    let mut signals = store.control_signals();
    let every = if signals.is_some() { POLL_SIGNALLED.max(poll) } else { poll };
    let mut done = agent.done.subscribe();
    let mut beat = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<(i64, i64)> = None;
    let mut stopping = false;
    loop {
        // The counters now: a change asks for a reload, a ping is answered.
        match store.control_counters().await {
            Ok((topology, ping)) => {
                match seen {
                    // The topology may have changed between the engine's start and now.
                    None => _ = reload.try_send(()),
                    Some((t, _)) if t != topology => {
                        tracing::info!("the stored topology changed: reloading it");
                        let _ = reload.try_send(());
                    }
                    _ => {}
                }
                if seen.is_none_or(|(_, p)| p != ping)
                    && ping > 0
                    && let Err(e) = store.agent_pong(&agent.owner, ping).await
                {
                    super::job::store_failed(&e, "answering a ping failed");
                }
                seen = Some((topology, ping));
                if !stopping && agent.status() == Status::Starting {
                    agent.set(Status::Running);
                }
            }
            Err(e) => {
                super::job::store_failed(&e, "reading the control plane's counters failed");
                agent.failed(&format!("reading the control plane's counters: {e}"), engine.now());
            }
        }
        // What woke the loop (the select's borrows of the watches end with it).
        let (mut beat_now, mut ended) = (false, false);
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            Ok(()) = async {
                match signals.as_mut() {
                    Some(s) => s.changed().await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = beat.tick() => beat_now = true,
            () = agent.changed.notified() => beat_now = true,
            r = stop.wait_for(|s| *s), if !stopping => {
                drop(r);
                stopping = true;
                agent.set(Status::ShuttingDown);
            }
            r = done.wait_for(|d| *d), if stopping => {
                drop(r);
                ended = true;
            }
        }
        if ended {
            break;
        }
        if beat_now {
            write(&engine, &agent, alive).await;
        }
    }
    agent.set(Status::NotStarted);
    write(&engine, &agent, 0).await;
}
