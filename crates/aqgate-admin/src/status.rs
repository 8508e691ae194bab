//! The figures of every job, as `admin jobs` prints them and `/metrics` shows them, from the
//! topology and the jobs' status rows (written by whichever process holds each lease), so
//! that any process sees the same.
//!
//! - **State**: `DISABLED` (the topology says so); `RUNNING`, `RETRYING`, `FAILED` or
//!   `DELETE_PENDING` as the holder last reported, while its lease lasts; `ENABLED` when no
//!   process holds a lease on it (none running, or outside its schedule's window, with the
//!   next window's opening in `next_window`). A row of a job gone from the topology whose
//!   lease still lasts is `DELETE_PENDING` (its holder finishes its batch, then deletes it),
//!   and so is a removed job whose state at its broker is still to be ended (`removals`),
//!   with or without a process at it.
//! - **Requested and actual state**: what the stored topology asks for (`ENABLED`,
//!   `DISABLED`, `REMOVED`) and what the job does, as its holder reports it with its
//!   heartbeat (`RUNNING`, `RETRYING`, `FAILED`, `DELETE_PENDING` while its lease lasts;
//!   `STOPPED` when no process runs it). They differ while a change is on its way: a job
//!   just disabled is `DISABLED` / `RUNNING` until its holder has seen the change and
//!   stopped (its batch in flight finished), then `DISABLED` / `STOPPED`.
//! - **Counts**: totals of every process that ran the job since it first took its lease,
//!   as of the holder's last heartbeat.
//! - **Backlog**: the committed messages waiting for the job in its source (for a
//!   multi-consumer source, the job subscriber's deliveries), delayed and in-flight ones
//!   included.
//! - **Lag**: how long the oldest message the job could take now (committed, not locked by
//!   a batch, not expired) has been waiting for it: now minus its enqueue time. A local or
//!   remote job takes a message still in its delay (the copy keeps the delay), a forwarder
//!   only once the delay is over, so for a forwarder a delayed message waits from the end of
//!   its delay. 0 when none is waiting. On a single-consumer source with a `rule`, backlog and
//!   lag count every message of the source (the rule is evaluated by the dequeue, not here).

use std::collections::BTreeMap;

use aqgate_core::clock::{MICROS_PER_SEC, Micros};
use aqgate_core::engine::{Engine, Resolved};
use aqgate_core::error::AqError;
use aqgate_core::store::{AgentStatus, JobStatus, LinkStatus, Store};
use aqgate_core::topology::gateway::Direction;
use aqgate_core::topology::schedule::Window;

/// The states a job can be in, in the order `/metrics` lists them.
pub const STATES: &[&str] = &["ENABLED", "DISABLED", "RUNNING", "RETRYING", "FAILED", "DELETE_PENDING"];

/// The actual state of a job no process runs.
pub const STOPPED: &str = "STOPPED";

/// One job's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobFigures {
    pub name: String,
    pub state: String,
    /// What the stored topology asks for: `ENABLED`, `DISABLED`, `REMOVED`.
    pub requested: &'static str,
    /// What the job does, as its holder last reported (see the module's doc).
    pub actual: String,
    /// `local`, `remote`, `forward`, or `space` (the implicit job of a remote queue space's
    /// queue); `-` for a removed job.
    pub kind: &'static str,
    pub source: String,
    /// The destination queue, `URL QUEUE` for a remote, the URL of a forwarder.
    pub destination: String,
    /// The process holding the lease (`host:pid:random`), while it lasts.
    pub owner: Option<String>,
    pub propagated: i64,
    pub failed: i64,
    pub exceptions: i64,
    pub backlog: i64,
    /// Seconds.
    pub lag: f64,
    /// When the next window of the job's schedule opens, if it is outside one.
    pub next_window: Option<Micros>,
    pub last_error: Option<String>,
    pub last_error_at: Option<Micros>,
    pub last_success_at: Option<Micros>,
    /// A gateway job's promise per message (`admin jobs` says it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<&'static str>,
    /// A gateway job's options (delivery mode, AQ message properties, no-local).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<aqgate_core::topology::gateway::JobOptions>,
    /// An outbound gateway job's `batches_in_flight`: batches published and not yet
    /// committed at once, at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches_in_flight: Option<u32>,
    /// An outbound gateway job's messages in doubt: published (perhaps) and still in the
    /// source, because the process died between the publish and the commit.
    pub in_doubt: i64,
}

/// Every job of the topology (and every removed one still finishing) at `now`.
pub async fn figures(store: &dyn Store, resolved: &Resolved, now: Micros) -> Result<Vec<JobFigures>, AqError> {
    let mut rows: BTreeMap<String, JobStatus> =
        store.job_statuses().await?.into_iter().map(|r| (r.name.clone(), r)).collect();
    let mut out = Vec::new();
    for j in resolved.catalog.propagations.values() {
        let row = rows.remove(&j.name);
        let live = row.as_ref().filter(|r| r.owner.is_some() && r.lease_until.is_some_and(|t| t > now));
        let owner = live.and_then(|r| r.owner.clone());
        let actual = live.map_or_else(|| STOPPED.to_string(), |r| r.state.clone());
        let state = match (j.enabled, live) {
            (false, _) => "DISABLED".to_string(),
            (true, Some(r)) => r.state.clone(),
            (true, None) => "ENABLED".to_string(),
        };
        let next_window = match j.schedule.window(now) {
            Window::Closed { next } if j.enabled => next,
            _ => None,
        };
        let (kind, destination) = match (&j.remote, &j.forward) {
            _ if j.gateway.as_ref().is_some_and(|g| g.direction == Direction::Outbound) => {
                ("gateway-out", j.destination.clone())
            }
            _ if j.gateway.is_some() => ("gateway-in", j.destination.clone()),
            (_, Some(f)) => ("forward", f.url.clone()),
            (Some(r), None) if j.space.is_some() => ("space", format!("{} {}", r.url, j.destination)),
            (Some(r), None) => ("remote", format!("{} {}", r.url, j.destination)),
            (None, None) => ("local", j.destination.clone()),
        };
        let (backlog, ready) = match resolved.ids.get(&j.source) {
            // Local and remote jobs take messages still in their delay (they carry it on);
            // a forwarder waits for the delay's end.
            Some(q) => store.job_backlog(*q, j.consumer.as_deref().unwrap_or(""), now, j.forward.is_none()).await?,
            None => (0, None),
        };
        let r = row.unwrap_or_else(|| empty(&j.name));
        let in_doubt = match &j.gateway {
            Some(g) if g.direction == Direction::Outbound => {
                i64::try_from(store.gateway_doubts(&j.agent).await?.len()).unwrap_or(i64::MAX)
            }
            _ => 0,
        };
        out.push(JobFigures {
            guarantee: j.gateway.as_ref().map(|g| g.guarantee()),
            options: j.gateway.as_ref().map(|g| g.options),
            batches_in_flight: j
                .gateway
                .as_ref()
                .filter(|g| g.direction == Direction::Outbound)
                .map(|g| g.batches_in_flight),
            in_doubt,
            name: j.name.clone(),
            state,
            requested: if j.enabled { "ENABLED" } else { "DISABLED" },
            actual,
            kind,
            source: j.source.clone(),
            destination,
            owner,
            propagated: r.propagated,
            failed: r.failed,
            exceptions: r.exceptions,
            backlog,
            lag: ready.map_or(0.0, |t| lag_seconds(now, t)),
            next_window,
            last_error: r.last_error,
            last_error_at: r.last_error_at,
            last_success_at: r.last_success_at,
        });
    }
    // Removed jobs whose state at the broker is still to be ended, whether or not a process
    // is at it (the row, if any, carries the last error).
    let pending = aqgate_propagate::removals::load(store).await?.into_iter().filter_map(|r| Some((r.name, r.pending?)));
    for (name, b) in pending.filter(|(n, _)| !resolved.catalog.propagations.contains_key(n)) {
        let r = rows.remove(&name).unwrap_or_else(|| empty(&name));
        let live = r.owner.is_some() && r.lease_until.is_some_and(|t| t > now);
        let owner = if live { r.owner.clone() } else { None };
        out.push(delete_pending(name, "gateway-in", b.source, b.destination, owner, r));
    }
    for r in rows.into_values().filter(|r| r.owner.is_some() && r.lease_until.is_some_and(|t| t > now)) {
        let (name, owner) = (r.name.clone(), r.owner.clone());
        out.push(delete_pending(name, "-", "-".into(), "-".into(), owner, r));
    }
    Ok(out)
}

/// The figures of a removed job still being ended (its row's counts and last error).
fn delete_pending(
    name: String,
    kind: &'static str,
    source: String,
    destination: String,
    owner: Option<String>,
    r: JobStatus,
) -> JobFigures {
    let actual = if owner.is_some() { r.state.clone() } else { STOPPED.to_string() };
    JobFigures {
        name,
        state: "DELETE_PENDING".into(),
        requested: "REMOVED",
        actual,
        kind,
        source,
        destination,
        owner,
        propagated: r.propagated,
        failed: r.failed,
        exceptions: r.exceptions,
        backlog: 0,
        lag: 0.0,
        next_window: None,
        last_error: r.last_error,
        last_error_at: r.last_error_at,
        last_success_at: r.last_success_at,
        guarantee: None,
        options: None,
        batches_in_flight: None,
        in_doubt: 0,
    }
}

fn empty(name: &str) -> JobStatus {
    JobStatus {
        name: name.to_string(),
        owner: None,
        lease_until: None,
        state: String::new(),
        propagated: 0,
        failed: 0,
        exceptions: 0,
        last_error: None,
        last_error_at: None,
        last_success_at: None,
        updated_at: 0,
    }
}

#[allow(clippy::cast_precision_loss)]
fn lag_seconds(now: Micros, ready: Micros) -> f64 {
    (now.saturating_sub(ready).max(0) as f64) / (MICROS_PER_SEC as f64)
}

/// What `/metrics` shows of propagation (the servlet's `AppState::more_metrics` in the
/// binary): every job's gauges ([`render`]), the gateway links' ([`render_links`]) and the
/// queues' and the spool's ([`crate::figures`]), as the store has them now; an error names what could not be read.
pub async fn metrics(engine: &Engine) -> Result<String, String> {
    let mut out = String::new();
    let resolved = engine.resolved();
    let store = engine.store();
    match figures(store.as_ref(), &resolved, engine.now()).await {
        Ok(jobs) => render(&jobs, &mut out),
        Err(e) => return Err(format!("propagation jobs: {}", e.message)),
    }
    match tokio::try_join!(store.gateway_links(), store.agents()) {
        Ok((links, agents)) => render_links(&links, &agents, engine.now(), &mut out),
        Err(e) => return Err(format!("gateway links: {e}")),
    }
    crate::figures::metrics(engine, &mut out).await?;
    Ok(out)
}

/// The jobs' gauges in Prometheus text: state (1 for the job's state, 0 for the others),
/// backlog and lag.
pub fn render(jobs: &[JobFigures], out: &mut String) {
    if jobs.is_empty() {
        return;
    }
    let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    out.push_str(
        "# HELP aqgate_propagation_state A propagation job's state (1: the state it is in).\n\
         # TYPE aqgate_propagation_state gauge\n",
    );
    for j in jobs {
        for s in STATES {
            let v = u8::from(j.state == *s);
            out.push_str(&format!("aqgate_propagation_state{{job=\"{}\",state=\"{s}\"}} {v}\n", label(&j.name)));
        }
    }
    out.push_str(
        "# HELP aqgate_propagation_backlog Committed messages waiting for a propagation job in its source.\n\
         # TYPE aqgate_propagation_backlog gauge\n",
    );
    for j in jobs {
        out.push_str(&format!("aqgate_propagation_backlog{{job=\"{}\"}} {}\n", label(&j.name), j.backlog));
    }
    out.push_str(
        "# HELP aqgate_propagation_lag_seconds How long the oldest message a propagation job could take has been ready.\n\
         # TYPE aqgate_propagation_lag_seconds gauge\n",
    );
    for j in jobs {
        out.push_str(&format!("aqgate_propagation_lag_seconds{{job=\"{}\"}} {:.3}\n", label(&j.name), j.lag));
    }
    let gateway: Vec<&JobFigures> = jobs.iter().filter(|j| j.guarantee.is_some()).collect();
    if !gateway.is_empty() {
        out.push_str(
            "# HELP aqgate_gateway_in_doubt Messages an outbound gateway job published (perhaps) and still holds.\n\
             # TYPE aqgate_gateway_in_doubt gauge\n",
        );
        for j in gateway {
            out.push_str(&format!("aqgate_gateway_in_doubt{{job=\"{}\"}} {}\n", label(&j.name), j.in_doubt));
        }
    }
}

/// A link row not refreshed for this long is stale.
const LINK_STALE: Micros = 60 * MICROS_PER_SEC;

/// The agent's status as `admin gateway` says it: what the process last said, or `BROKEN`
/// when it said it ran and its word has ended (`alive_until` passed: killed, hung, or cut
/// off from the store).
pub fn agent_status(a: &AgentStatus, now: Micros) -> &str {
    if a.status != "NOT_STARTED" && a.alive_until <= now { "BROKEN" } else { &a.status }
}

/// Whether a link row is no live process's current view: its process is not running (its
/// agent row's time passed — at once when its heartbeat ended, not a minute later — or it
/// shut down), or the row was not refreshed for a minute (its process no longer uses the
/// link; a process in use refreshes it every 10 s).
pub fn link_stale(l: &LinkStatus, agents: &[AgentStatus], now: Micros) -> bool {
    let gone =
        agents.iter().find(|a| a.owner == l.owner).is_some_and(|a| a.status == "NOT_STARTED" || a.alive_until <= now);
    gone || now - l.updated_at > LINK_STALE
}

/// The gateway's links in Prometheus text: 1 for each process's link that is CONNECTED,
/// 0 otherwise (a stale row, see [`link_stale`]: 0).
pub fn render_links(links: &[LinkStatus], agents: &[AgentStatus], now: Micros, out: &mut String) {
    if links.is_empty() {
        return;
    }
    let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    out.push_str(
        "# HELP aqgate_gateway_link_connected A gateway link as a process sees it (1: CONNECTED).\n\
         # TYPE aqgate_gateway_link_connected gauge\n",
    );
    for l in links {
        let up = u8::from(l.state == "CONNECTED" && !link_stale(l, agents, now));
        out.push_str(&format!(
            "aqgate_gateway_link_connected{{link=\"{}\",owner=\"{}\"}} {up}\n",
            label(&l.name),
            label(&l.owner)
        ));
    }
}
