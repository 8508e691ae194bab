//! Removed jobs, as Messaging Gateway's DELETE_PENDING and its tombstones: a row of kind
//! `job_removal` in the stored topology per removed job (not part of any topology file, so
//! `admin apply` neither prints nor deletes it).
//!
//! - **Pending**: a removed inbound gateway job still owns state at its broker (a NATS
//!   durable consumer, an MQTT persistent session, a RabbitMQ queue it declared on a topic).
//!   The record keeps what is needed to end it (the link and the foreign queue, as they were),
//!   so that any node ends it — the one that ran the job, or one started later — whatever
//!   the topology has become. `admin jobs` shows the job DELETE_PENDING until then. The node
//!   that ends it holds the job's lease meanwhile (one at a time), and while the broker
//!   cannot be reached it reports the error and tries again. Then the job's doubts, marks and
//!   status row go.
//! - **Tombstone**: a job removed with `admin jobs --remove` (forced or not): `serve
//!   --topology FILE` does not re-create it from the file at start (it logs that it did
//!   not); `admin apply FILE` does, and the record goes.
//!
//! `sweep` deletes the status rows of removed jobs nobody finishes (not pending ones).
//!
//! A pending removal of a job removed by `admin apply` (not by the operator's `--remove`)
//! leaves no tombstone once done.

use std::sync::Arc;
use std::time::Duration;

use aqgate_core::clock::Micros;
use aqgate_core::engine::Engine;
use aqgate_core::error::{AqError, code};
use aqgate_core::store::{JobReport, Store};
use tokio::sync::watch;

use super::LeaseConfig;
pub use super::job::{BrokerState, owned};

/// An error kept in a job's status is cut to this many characters (as `lease` does).
const MAX_ERROR: usize = 500;

/// The kind of the records in the topology table.
pub const KIND: &str = "job_removal";

/// A removed job's record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Removal {
    /// The job (upper case).
    pub name: String,
    /// When it was removed (engine clock): tells one removal from a later one.
    pub at: Micros,
    /// Removed with `admin jobs --remove`: the file of `serve --topology` does not bring it back.
    pub by_operator: bool,
    /// What it owns at its broker, still to be ended (`None`: nothing left: a tombstone).
    pub pending: Option<BrokerState>,
}

/// The records among the topology's rows (a record that does not read is skipped).
pub fn of_rows(rows: &[(String, String, String)]) -> Vec<Removal> {
    rows.iter()
        .filter(|(kind, _, _)| kind == KIND)
        .filter_map(|(_, name, spec)| match serde_json::from_str(spec) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "a stored job removal does not read; ignored");
                None
            }
        })
        .collect()
}

/// Every record in the store.
pub async fn load(store: &dyn Store) -> Result<Vec<Removal>, AqError> {
    Ok(of_rows(&store.load_topology().await?))
}

/// The record as a topology row's spec.
pub fn spec(r: &Removal) -> Result<String, AqError> {
    serde_json::to_string(r).map_err(|e| AqError::server(code::INTERNAL, format!("job removal {}: {e}", r.name)))
}

/// Whether `r` is still the job's pending removal: not ended by a forced removal, nor by
/// the job's re-creation (`admin apply`).
async fn current(store: &dyn Store, r: &Removal) -> Result<bool, AqError> {
    let rows = store.load_topology().await?;
    let defined = rows.iter().any(|(k, n, _)| (k == "gateway_job" || k == "propagation") && *n == r.name);
    Ok(!defined && of_rows(&rows).iter().any(|x| x.name == r.name && x.at == r.at && x.pending.is_some()))
}

/// Ends removal `r`'s broker state in this process, holding the job's lease while it does
/// (taken when free: another process may be at it, or still finishing the job's batch), and
/// retrying while the broker cannot be reached (the error in the job's status, the backoff
/// doubling from 1 s to the heartbeat); then the job's doubts, marks and status go, and
/// the record becomes a tombstone (or goes). Until `stop` (the lease is given up then), or
/// the removal is no longer pending.
pub(crate) async fn finish(engine: Arc<Engine>, r: Removal, cfg: Arc<LeaseConfig>, mut stop: watch::Receiver<bool>) {
    let Some(state) = r.pending.clone() else { return };
    let store = engine.store().clone();
    let pending = || JobReport { state: "DELETE_PENDING".into(), ..JobReport::default() };
    let mut backoff = Duration::from_secs(1);
    let mut held = false;
    while !*stop.borrow() {
        match current(store.as_ref(), &r).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(job = %r.name, "the job's removal is no longer pending (forced, or the job re-created)");
                break;
            }
            Err(e) => tracing::warn!(job = %r.name, error = %e.message, "reading the job's removal failed"),
        }
        let now = engine.now();
        let until = now.saturating_add(cfg.ttl_micros());
        held = match store.job_lease(&r.name, &cfg.owner, now, until).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(job = %r.name, error = %e, "taking the removed job's lease failed");
                false
            }
        };
        let mut wait = cfg.heartbeat();
        let mut rep = pending();
        if held {
            match super::gateway::end(&state, &r.name).await {
                Ok(what) => {
                    if let Some(what) = what {
                        tracing::info!(job = %r.name, removed = %what, "the removed job's state at its broker is gone");
                    }
                    done(store.as_ref(), &r, &cfg, engine.now()).await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(job = %r.name, error = %e, retry_in = ?backoff, "the removed job could not clean up at its broker");
                    let text: String = format!("removing the job: {e}").chars().take(MAX_ERROR).collect();
                    rep.failed = 1;
                    rep.error = Some((text, engine.now()));
                    wait = backoff;
                    backoff = (backoff * 2).min(cfg.heartbeat());
                }
            }
            let now = engine.now();
            match store.job_report(&r.name, &cfg.owner, now, Some(now.saturating_add(cfg.ttl_micros())), &rep).await {
                Ok(Some(o)) if o == cfg.owner => {}
                Ok(_) => held = false,
                Err(e) => tracing::warn!(job = %r.name, error = %e, "reporting DELETE_PENDING failed"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
    if held {
        let now = engine.now();
        if let Err(e) = store.job_report(&r.name, &cfg.owner, now, None, &pending()).await {
            tracing::warn!(job = %r.name, error = %e, "giving up the removed job's lease failed; it ends by itself");
        }
    }
}

/// The removal's broker state is gone: the job's doubts and marks go, the record becomes
/// a tombstone (an operator's removal) or goes, then the status row.
async fn done(store: &dyn Store, r: &Removal, cfg: &LeaseConfig, now: Micros) {
    let agent = aqgate_core::topology::propagation::job_agent(&r.name);
    match store.gateway_job_drop(&agent).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(job = %r.name, rows = n, "forgot the removed job's doubts and marks"),
        Err(e) => tracing::warn!(job = %r.name, error = %e, "forgetting the removed job's doubts and marks failed"),
    }
    let ended = async {
        if !current(store, r).await? {
            return Ok::<_, AqError>(());
        }
        let mut tx = store.begin().await?;
        if r.by_operator {
            tx.put_topology_object(KIND, &r.name, &spec(&Removal { pending: None, ..r.clone() })?).await?;
        } else {
            tx.delete_topology_object(KIND, &r.name).await?;
        }
        tx.commit().await?;
        Ok(())
    };
    if let Err(e) = ended.await {
        tracing::warn!(job = %r.name, error = %e.message, "ending the job's removal record failed");
        return;
    }
    match store.job_forget(&r.name, &cfg.owner, now).await {
        Ok(_) => tracing::info!(job = %r.name, "the removed job finished; its status is gone"),
        Err(e) => tracing::warn!(job = %r.name, error = %e, "deleting the job's status failed"),
    }
}

/// Deletes the status rows of jobs gone from the stored topology (`topology`, read afresh:
/// this process may not have reloaded yet) that no process finishes (their lease has ended)
/// and whose removal is not pending (`removals`: the row carries its error until it ends):
/// `busy` are the jobs this process still runs or finishes.
pub(crate) async fn sweep(engine: &Engine, cfg: &LeaseConfig, topology: &[(String, String, String)], busy: &[&String]) {
    let store = engine.store();
    let rows = match store.job_statuses().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(error = %e, "reading the jobs' status failed");
            return;
        }
    };
    let now = engine.now();
    let pending: Vec<String> = of_rows(topology).into_iter().filter(|r| r.pending.is_some()).map(|r| r.name).collect();
    let defined =
        |name: &str| topology.iter().any(|(kind, n, _)| (kind == "propagation" || kind == "gateway_job") && n == name);
    for r in rows.iter().filter(|r| !defined(&r.name) && !busy.contains(&&r.name) && !pending.contains(&r.name)) {
        match store.job_forget(&r.name, &cfg.owner, now).await {
            Ok(true) => {
                tracing::info!(job = %r.name, "forgot the status of a removed job");
                let agent = aqgate_core::topology::propagation::job_agent(&r.name);
                if let Err(e) = store.gateway_job_drop(&agent).await {
                    tracing::debug!(job = %r.name, error = %e, "forgetting a removed job's doubts and marks failed");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(job = %r.name, error = %e, "forgetting a removed job's status failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aqgate_core::topology::gateway::{ForeignQueueDef, LinkDef};

    #[test]
    fn a_record_reads_back_and_an_unreadable_one_is_skipped() {
        let link: LinkDef = toml::from_str("name = \"nats\"\nkind = \"nats\"\nurl = \"nats://h:4222\"").expect("link");
        let foreign: ForeignQueueDef =
            toml::from_str("name = \"orders\"\nlink = \"nats\"\nnative_name = \"a.b\"\nstream = \"S\"").expect("fq");
        let pending = BrokerState { source: "ORDERS@NATS".into(), destination: "Q".into(), link, foreign };
        let r = Removal { name: "FROM_NATS".into(), at: 7, by_operator: true, pending: Some(pending) };
        let rows = vec![
            (KIND.to_string(), "FROM_NATS".to_string(), spec(&r).expect("spec")),
            (KIND.to_string(), "BAD".to_string(), "{not json".to_string()),
            ("gateway_job".to_string(), "OTHER".to_string(), "{}".to_string()),
        ];
        assert_eq!(of_rows(&rows), vec![r.clone()]);
        let what = r.pending.as_ref().expect("pending").describe(&r.name);
        assert_eq!(what, "the durable consumer aqgate_FROM_NATS on stream S at nats://h:4222");
    }
}
