//! `aqgate admin gateway`: the Messaging Gateway's links from the topology, with each
//! process's view of each (state, since when, last error), as a table or as JSON. A row
//! not refreshed for a minute is from a process that stopped or no longer uses the link:
//! shown as DISCONNECTED.

use std::io::Write;

use aqgate_core::clock::{Clock, Micros, SystemClock};
use aqgate_core::store::Store;

/// A row older than this is no process's current view.
const STALE: Micros = 60_000_000;

#[derive(Debug, serde::Serialize)]
pub struct LinkRow {
    pub name: String,
    pub kind: &'static str,
    pub url: String,
    /// The process (`host:pid:random`); `None` when no process has used the link.
    pub owner: Option<String>,
    pub state: String,
    pub since: Option<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
}

/// Every link of the stored topology, one row per process that reported on it.
pub async fn links(store: &dyn Store) -> anyhow::Result<Vec<LinkRow>> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let seen = store.gateway_links().await?;
    let now = SystemClock.now();
    let mut out = Vec::new();
    for (name, l) in &resolved.catalog.gateway_links {
        let rows: Vec<_> = seen.iter().filter(|s| &s.name == name).collect();
        if rows.is_empty() {
            out.push(LinkRow {
                name: name.clone(),
                kind: l.kind.name(),
                url: l.url.clone(),
                owner: None,
                state: "DISCONNECTED".into(),
                since: None,
                last_error: None,
                last_error_at: None,
            });
        }
        for s in rows {
            let stale = now - s.updated_at > STALE;
            out.push(LinkRow {
                name: name.clone(),
                kind: l.kind.name(),
                url: l.url.clone(),
                owner: Some(s.owner.clone()),
                state: if stale { "DISCONNECTED".into() } else { s.state.clone() },
                since: Some(time(s.since)),
                last_error: s.last_error.clone(),
                last_error_at: s.last_error_at.map(time),
            });
        }
    }
    Ok(out)
}

pub async fn print_gateway(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = links(store).await?;
    if json {
        out!(w, "{}", serde_json::to_value(&rows)?);
        return Ok(());
    }
    out!(w, "{:<16} {:<9} {:<32} {:<28} {:<13} {:<20} LAST_ERROR", "LINK", "KIND", "URL", "OWNER", "STATE", "SINCE");
    for r in rows {
        let error = match (&r.last_error, &r.last_error_at) {
            (Some(e), Some(t)) => format!("{t} {}", e.replace(['\r', '\n'], " ")),
            _ => "-".into(),
        };
        row!(
            w,
            "{:<16} {:<9} {:<32} {:<28} {:<13} {:<20} {}",
            r.name,
            r.kind,
            r.url,
            r.owner.as_deref().unwrap_or("-"),
            r.state,
            r.since.as_deref().unwrap_or("-");
            error
        );
    }
    Ok(())
}

fn time(t: Micros) -> String {
    chrono::DateTime::from_timestamp_micros(t)
        .map_or_else(|| t.to_string(), |d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}
