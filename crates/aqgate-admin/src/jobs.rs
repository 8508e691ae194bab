//! `aqgate admin jobs`: the topology's propagation jobs with their state (requested by the
//! stored topology, and actual as the running node reports it), owner, counts, backlog,
//! lag and last error (see `super::status` for what each figure means), as a
//! table or as JSON; and `--enable` / `--disable NAME`, which change the stored job
//! (running servers follow by themselves, `propagate::control`; the next `admin apply` of a
//! file sets what the file says); `--remove NAME [--force]`, which takes the job out of the
//! stored topology; and `--reset NAME` (RESET_JOB), which makes it try again now.
//!
//! A non-forced removal of a job that owns state at its broker leaves a pending removal
//! record (`propagate::removals`): DELETE_PENDING until a running node (the one running the
//! job, as soon as it sees the change; or any node, now or at its next start) has ended
//! that state, retrying while the broker is down; then its status row goes. A forced one
//! deletes the status row and the job's doubts and marks at once: whatever runs it stops at
//! its next heartbeat, and what it kept at the broker is left there (named in the answer).
//! Both leave the job's tombstone, so that `serve --topology` does not bring it back.

use std::io::Write;

use aqgate_core::clock::{Clock, Micros, SystemClock};
use aqgate_core::error::AqError;
use aqgate_core::propagation::PropagationDef;
use aqgate_core::store::Store;
use aqgate_core::topology::canon;
use aqgate_core::topology::gateway::Direction;

use aqgate_propagate::removals;

pub use crate::status::JobFigures;

/// Every job's figures now.
pub async fn jobs(store: &dyn Store) -> Result<Vec<JobFigures>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    jobs_in(store, &resolved).await
}

/// [`jobs`] over the topology `resolved` (a running server's, current), not read again.
pub async fn jobs_in(store: &dyn Store, resolved: &aqgate_core::engine::Resolved) -> Result<Vec<JobFigures>, AqError> {
    crate::status::figures(store, resolved, SystemClock.now()).await
}

/// Sets the stored job `name` enabled or disabled; `false` if there is no such job.
pub async fn set_enabled(store: &dyn Store, name: &str, enabled: bool) -> Result<bool, AqError> {
    let name = canon(name);
    let rows = store.load_topology().await?;
    if let Some((_, _, spec)) = rows.iter().find(|(k, n, _)| k == "gateway_job" && *n == name) {
        let mut def: aqgate_core::topology::gateway::GatewayJobDef = serde_json::from_str(spec)
            .map_err(|e| AqError::server(aqgate_core::error::code::INTERNAL, format!("stored job {name}: {e}")))?;
        def.enabled = enabled;
        let spec = serde_json::to_string(&def)
            .map_err(|e| AqError::server(aqgate_core::error::code::INTERNAL, format!("job {name}: {e}")))?;
        let mut tx = store.begin().await?;
        tx.put_topology_object("gateway_job", &name, &spec).await?;
        tx.commit().await?;
        return Ok(true);
    }
    let Some((_, _, spec)) = rows.iter().find(|(k, n, _)| k == "propagation" && *n == name) else {
        let resolved = aqgate_core::engine::load_resolved(store).await?;
        if let Some(space) = resolved.catalog.propagations.get(&name).and_then(|j| j.space.clone()) {
            return Err(AqError::invalid(format!(
                "job {name} drains a queue of remote queue space {space}: it follows the space, and is not \
                 enabled or disabled alone (change the space in the topology)"
            )));
        }
        return Ok(false);
    };
    let mut def: PropagationDef = serde_json::from_str(spec)
        .map_err(|e| AqError::server(aqgate_core::error::code::INTERNAL, format!("stored job {name}: {e}")))?;
    def.enabled = enabled;
    let spec = serde_json::to_string(&def)
        .map_err(|e| AqError::server(aqgate_core::error::code::INTERNAL, format!("job {name}: {e}")))?;
    let mut tx = store.begin().await?;
    tx.put_topology_object("propagation", &name, &spec).await?;
    tx.commit().await?;
    Ok(true)
}

/// What `remove` did.
#[derive(Debug, Default)]
pub struct Removed {
    /// The job was in the stored topology (and is not any more).
    pub defined: bool,
    /// Not forced, and the job owns state at its broker: DELETE_PENDING until a running node
    /// has ended it.
    pub pending: bool,
    /// Forced: the status row was deleted.
    pub status: bool,
    /// Forced: doubts and marks deleted.
    pub rows: u64,
    /// Forced: what the job keeps at its broker, left there.
    pub left: Option<String>,
}

/// Removes job `name` from the stored topology (Messaging Gateway's REMOVE_JOB), leaving
/// its tombstone (`serve --topology` does not re-create it). Not forced, a job that owns
/// state at its broker is DELETE_PENDING until a running node has ended that state (now or
/// at its next start). With `force` its status row and its gateway rows go at once (also
/// when only its DELETE_PENDING record is left), and its state at the broker stays. An
/// error when there was nothing to remove.
pub async fn remove(store: &dyn Store, name: &str, force: bool) -> Result<Removed, AqError> {
    let name = canon(name);
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let info = resolved.catalog.propagations.get(&name);
    if let Some(space) = info.and_then(|j| j.space.clone()) {
        return Err(AqError::invalid(format!(
            "job {name} drains a queue of remote queue space {space}: it follows the space, and is not \
             removed alone (change the space in the topology)"
        )));
    }
    let rows = store.load_topology().await?;
    let earlier = removals::of_rows(&rows).into_iter().find(|r| r.name == name);
    let mut out = Removed::default();
    let owned = info.and_then(removals::owned);
    let tombstone =
        |pending| removals::Removal { name: name.clone(), at: SystemClock.now(), by_operator: true, pending };
    if let Some((kind, _, _)) = rows.iter().find(|(k, n, _)| (k == "gateway_job" || k == "propagation") && *n == name) {
        let record = tombstone(if force { None } else { owned.clone() });
        let mut tx = store.begin().await?;
        tx.delete_topology_object(kind, &name).await?;
        tx.put_topology_object(removals::KIND, &name, &removals::spec(&record)?).await?;
        tx.commit().await?;
        out.defined = true;
        out.pending = record.pending.is_some();
        if force {
            out.left = owned.map(|b| b.describe(&name));
        }
    } else if let Some(pending) = earlier.and_then(|r| r.pending) {
        if !force {
            return Err(AqError::invalid(format!(
                "job {name} is DELETE_PENDING already: a running node ends its state at the broker ({}); \
                 --force removes what is left of it now and leaves that there",
                pending.describe(&name)
            )));
        }
        let mut tx = store.begin().await?;
        tx.put_topology_object(removals::KIND, &name, &removals::spec(&tombstone(None))?).await?;
        tx.commit().await?;
        out.left = Some(pending.describe(&name));
    }
    if force {
        let exists = store.job_statuses().await?.iter().any(|j| j.name == name);
        if exists {
            out.status = store.job_forget(&name, "", Micros::MAX).await?;
        }
        out.rows = store.gateway_job_drop(&aqgate_core::topology::propagation::job_agent(&name)).await?;
    }
    if !out.defined && !out.status && out.rows == 0 && out.left.is_none() {
        return Err(AqError::invalid(format!(
            "no propagation job {name} in the stored topology{}",
            if force { ", nor a status or gateway rows of one" } else { " (--force removes what is left of one)" }
        )));
    }
    Ok(out)
}

/// Messaging Gateway's RESET_JOB: job `name` (in the topology, or DELETE_PENDING) tries
/// again now. Its failure count goes to 0 and its lease ends: the process holding it stops
/// its workers at its next heartbeat (their back-off with them) and takes the job again at
/// once, with fresh workers (or another process does). False when the job has no status
/// yet (it never ran: nothing to reset).
pub async fn reset(store: &dyn Store, name: &str) -> Result<bool, AqError> {
    let name = canon(name);
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let pending = removals::load(store).await?.into_iter().any(|r| r.name == name && r.pending.is_some());
    if !resolved.catalog.propagations.contains_key(&name) && !pending {
        return Err(AqError::invalid(format!("no propagation job {name} in the stored topology")));
    }
    Ok(store.job_reset(&name).await?)
}

/// `aqgate admin jobs` (`json`: one JSON array, times as RFC 3339).
pub async fn print_jobs(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = jobs(store).await?;
    if json {
        let list: Vec<serde_json::Value> = rows.iter().map(json_row).collect();
        out!(w, "{}", serde_json::Value::Array(list));
        return Ok(());
    }
    out!(
        w,
        "{:<20} {:<14} {:<11} {:<24} {:<32} {:<28} {:>10} {:>6} {:>10} {:>7} {:>8} {:<20} {:>8} {:<9} {:<14} LAST_ERROR",
        "JOB",
        "STATE",
        "KIND",
        "SOURCE",
        "DESTINATION",
        "OWNER",
        "PROPAGATED",
        "FAILED",
        "EXCEPTIONS",
        "BACKLOG",
        "LAG",
        "NEXT_WINDOW",
        "IN_DOUBT",
        "REQUESTED",
        "ACTUAL"
    );
    for j in rows {
        let error = match (&j.last_error, j.last_error_at) {
            (Some(e), Some(t)) => format!("{} {}", time(t), e.replace(['\r', '\n'], " ")),
            (Some(e), None) => e.replace(['\r', '\n'], " "),
            (None, _) => "-".into(),
        };
        row!(
            w,
            "{:<20} {:<14} {:<11} {:<24} {:<32} {:<28} {:>10} {:>6} {:>10} {:>7} {:>8} {:<20} {:>8} {:<9} {:<14} {}",
            j.name,
            j.state,
            j.kind,
            j.source,
            j.destination,
            j.owner.as_deref().unwrap_or("-"),
            j.propagated,
            j.failed,
            j.exceptions,
            j.backlog,
            format!("{:.1}s", j.lag),
            j.next_window.map_or_else(|| "-".to_string(), time),
            j.in_doubt,
            j.requested,
            j.actual;
            error
        );
        if let Some(g) = j.guarantee {
            row!(w, "{:<20} guarantee: {}", ""; g);
        }
        if let Some(o) = &j.options {
            let direction = if j.kind == "gateway-out" { Direction::Outbound } else { Direction::Inbound };
            let window = j.batches_in_flight.map(|n| format!(" batches_in_flight={n}")).unwrap_or_default();
            row!(w, "{:<20} options: {}", ""; format!("{}{window}", o.describe(direction)));
        }
    }
    Ok(())
}

/// `2026-05-01T22:00:00Z`.
fn time(t: Micros) -> String {
    chrono::DateTime::from_timestamp_micros(t)
        .map_or_else(|| t.to_string(), |d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn json_row(j: &JobFigures) -> serde_json::Value {
    let mut v = serde_json::to_value(j).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        for (k, t) in
            [("next_window", j.next_window), ("last_error_at", j.last_error_at), ("last_success_at", j.last_success_at)]
        {
            o.insert(k.into(), t.map(time).into());
        }
    }
    v
}
