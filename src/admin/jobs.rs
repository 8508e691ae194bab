//! `aqgate admin jobs`: the topology's propagation jobs with their state and backlog, and
//! `--enable` / `--disable NAME`, which change the stored job (running servers follow on
//! SIGHUP; the next `admin apply` of a file sets what the file says).

use std::collections::BTreeMap;
use std::io::Write;

use aqgate_core::error::AqError;
use aqgate_core::propagation::PropagationDef;
use aqgate_core::store::Store;
use aqgate_core::topology::canon;

/// One row of `admin jobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    pub name: String,
    /// `ENABLED` or `DISABLED`.
    pub state: &'static str,
    /// `local`, `remote`, `forward`, or `space` (the implicit job of a remote queue space's
    /// queue).
    pub kind: &'static str,
    pub source: String,
    /// The destination queue, `URL QUEUE` for a remote, the URL of a forwarder.
    pub destination: String,
    /// Messages in the source queue (all consumers, on a multi-consumer source).
    pub backlog: i64,
}

pub async fn jobs(store: &dyn Store) -> Result<Vec<JobRow>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let depths: BTreeMap<i64, i64> = store.queue_depths().await?.into_iter().collect();
    Ok(resolved
        .catalog
        .propagations
        .values()
        .map(|j| {
            let (kind, destination) = match (&j.remote, &j.forward) {
                (_, Some(f)) => ("forward", f.url.clone()),
                (Some(r), None) if j.space.is_some() => ("space", format!("{} {}", r.url, j.destination)),
                (Some(r), None) => ("remote", format!("{} {}", r.url, j.destination)),
                (None, None) => ("local", j.destination.clone()),
            };
            JobRow {
                name: j.name.clone(),
                state: if j.enabled { "ENABLED" } else { "DISABLED" },
                kind,
                source: j.source.clone(),
                destination,
                backlog: resolved.ids.get(&j.source).and_then(|i| depths.get(i).copied()).unwrap_or(0),
            }
        })
        .collect())
}

/// Sets the stored job `name` enabled or disabled; `false` if there is no such job.
pub async fn set_enabled(store: &dyn Store, name: &str, enabled: bool) -> Result<bool, AqError> {
    let name = canon(name);
    let rows = store.load_topology().await?;
    let Some((_, _, spec)) = rows.iter().find(|(k, n, _)| k == "propagation" && *n == name) else {
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

/// `aqgate admin jobs`.
pub async fn print_jobs(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = jobs(store).await?;
    out!(w, "{:<20} {:<9} {:<8} {:<28} {:<40} {:>8}", "JOB", "STATE", "KIND", "SOURCE", "DESTINATION", "BACKLOG");
    for j in rows {
        out!(w, "{:<20} {:<9} {:<8} {:<28} {:<40} {:>8}", j.name, j.state, j.kind, j.source, j.destination, j.backlog);
    }
    Ok(())
}
