//! `aqgate admin gateway`: the Messaging Gateway's agents — every process that runs
//! propagation jobs, with its status (NOT_STARTED, STARTING, RUNNING, SHUTTING_DOWN,
//! BROKEN), instance (host, pid, start time) and last error — then its links from the
//! topology, with each process's view of each (state, since when, last error). A link row
//! of a process that is not running (its agent's heartbeat ended, or it shut down), or not
//! refreshed for a minute, is STALE.
//! `--json` prints the links (`--agents --json`: the agents); `--ping` asks the running
//! agents to answer (AGENT_PING), within a bound. `--foreign-queues` lists the foreign
//! queues (Messaging Gateway's MGW_FOREIGN_QUEUES): link, the broker's name, domain,
//! options, and the jobs that use each, which way.

use std::io::Write;
use std::time::Duration;

use aqgate_core::clock::{Clock, Micros, SystemClock};
use aqgate_core::store::Store;

use crate::status::{agent_status, link_stale};

/// One agent as `admin gateway` shows it.
#[derive(Debug, serde::Serialize)]
pub struct AgentRow {
    /// The process (`host:pid:random`), as in the owners of jobs and links.
    pub instance: String,
    pub host: String,
    pub pid: i64,
    pub started_at: String,
    /// NOT_STARTED, STARTING, RUNNING, SHUTTING_DOWN or BROKEN.
    pub status: String,
    /// When it last wrote its row.
    pub updated_at: String,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
}

/// Every agent the store knows of (gone for a day: forgotten), oldest first.
pub async fn agents(store: &dyn Store) -> anyhow::Result<Vec<AgentRow>> {
    let now = SystemClock.now();
    Ok(store
        .agents()
        .await?
        .iter()
        .map(|a| AgentRow {
            instance: a.owner.clone(),
            host: a.host.clone(),
            pid: a.pid,
            started_at: time(a.started_at),
            status: agent_status(a, now).to_string(),
            updated_at: time(a.updated_at),
            last_error: a.last_error.clone(),
            last_error_at: a.last_error_at.map(time),
        })
        .collect())
}

/// AGENT_PING: asks every running agent to answer, and waits up to `within` for the first
/// answers (then a little longer for the others). The instances that answered; none is
/// UNREACHABLE.
pub async fn ping(store: &dyn Store, within: Duration) -> anyhow::Result<Vec<String>> {
    let n = store.control_ping().await?;
    let start = std::time::Instant::now();
    let mut first: Option<std::time::Instant> = None;
    loop {
        let answered: Vec<String> =
            store.agents().await?.into_iter().filter(|a| a.pong >= n).map(|a| a.owner).collect();
        let now = std::time::Instant::now();
        if !answered.is_empty() && first.is_none() {
            first = Some(now);
        }
        // The others (each reads every few hundred milliseconds) get a second more.
        let settled = first.is_some_and(|t| now - t >= Duration::from_secs(1));
        if settled || now - start >= within {
            return Ok(answered);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `aqgate admin gateway --ping`: `Err` (a non-zero exit) when no agent answered.
pub async fn print_ping(store: &dyn Store, within: Duration, w: &mut dyn Write) -> anyhow::Result<()> {
    let answered = ping(store, within).await?;
    anyhow::ensure!(!answered.is_empty(), "UNREACHABLE: no agent answered within {} ms", within.as_millis());
    for a in answered {
        row!(w, "REACHABLE {}", a);
    }
    Ok(())
}

/// `aqgate admin gateway --agents`.
pub async fn print_agents(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = agents(store).await?;
    if json {
        out!(w, "{}", serde_json::to_value(&rows)?);
        return Ok(());
    }
    out!(w, "{:<40} {:<14} {:<20} {:<20} LAST_ERROR", "AGENT_INSTANCE", "AGENT_STATUS", "STARTED", "UPDATED");
    if rows.is_empty() {
        out!(w, "{:<40} {:<14} {:<20} {:<20} -", "-", "NOT_STARTED", "-", "-");
    }
    for r in rows {
        let error = match (&r.last_error, &r.last_error_at) {
            (Some(e), Some(t)) => format!("{t} {}", e.replace(['\r', '\n'], " ")),
            _ => "-".into(),
        };
        row!(w, "{:<40} {:<14} {:<20} {:<20} {}", r.instance, r.status, r.started_at, r.updated_at; error);
    }
    Ok(())
}

#[derive(Debug, serde::Serialize)]
pub struct LinkRow {
    pub name: String,
    pub kind: &'static str,
    pub url: String,
    /// The process (`host:pid:random`); `None` when no process has used the link.
    pub owner: Option<String>,
    pub state: String,
    /// The connections the process has open to the broker (0 for a stale row).
    pub connections: i64,
    /// How many the link's jobs share at most (`None`: one per job, MQTT).
    pub max_connections: Option<u32>,
    pub since: Option<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
}

/// Every link of the stored topology, one row per process that reported on it.
pub async fn links(store: &dyn Store) -> anyhow::Result<Vec<LinkRow>> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    links_in(store, &resolved).await
}

/// [`links`] over the topology `resolved` (a running server's, current), not read again.
pub async fn links_in(store: &dyn Store, resolved: &aqgate_core::engine::Resolved) -> anyhow::Result<Vec<LinkRow>> {
    let seen = store.gateway_links().await?;
    let agents = store.agents().await?;
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
                connections: 0,
                max_connections: l.shared(),
                since: None,
                last_error: None,
                last_error_at: None,
            });
        }
        for s in rows {
            let stale = link_stale(s, &agents, now);
            out.push(LinkRow {
                name: name.clone(),
                kind: l.kind.name(),
                url: l.url.clone(),
                owner: Some(s.owner.clone()),
                state: if stale { "STALE".into() } else { s.state.clone() },
                connections: if stale { 0 } else { s.connections },
                max_connections: l.shared(),
                since: Some(time(s.since)),
                last_error: s.last_error.clone(),
                last_error_at: s.last_error_at.map(time),
            });
        }
    }
    Ok(out)
}

/// `aqgate admin gateway`: the agents, then the links (`json`: the links only).
pub async fn print_gateway(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = links(store).await?;
    if json {
        out!(w, "{}", serde_json::to_value(&rows)?);
        return Ok(());
    }
    print_agents(store, false, w).await?;
    out!(w, "");
    out!(
        w,
        "{:<16} {:<9} {:<32} {:<28} {:<13} {:<11} {:<20} LAST_ERROR",
        "LINK",
        "KIND",
        "URL",
        "OWNER",
        "STATE",
        "CONNECTIONS",
        "SINCE"
    );
    for r in rows {
        let error = match (&r.last_error, &r.last_error_at) {
            (Some(e), Some(t)) => format!("{t} {}", e.replace(['\r', '\n'], " ")),
            _ => "-".into(),
        };
        // Open of at most `max_connections`; MQTT: one per job, no maximum.
        let connections = match r.max_connections {
            Some(max) => format!("{}/{max}", r.connections),
            None => r.connections.to_string(),
        };
        row!(
            w,
            "{:<16} {:<9} {:<32} {:<28} {:<13} {:<11} {:<20} {}",
            r.name,
            r.kind,
            r.url,
            r.owner.as_deref().unwrap_or("-"),
            r.state,
            connections,
            r.since.as_deref().unwrap_or("-");
            error
        );
    }
    Ok(())
}

/// A foreign queue as `admin gateway --foreign-queues` shows it.
#[derive(Debug, serde::Serialize)]
pub struct ForeignQueueRow {
    pub name: String,
    pub link: String,
    pub kind: &'static str,
    /// The broker's name (PROVIDER_QUEUE): the queue, exchange, subject or topic.
    pub native_name: String,
    /// `QUEUE` or `TOPIC`.
    pub domain: &'static str,
    /// `OUTBOUND` (jobs publish to it), `INBOUND` (jobs take from it), `BOTH`, or `-`
    /// (no job uses it).
    pub direction: &'static str,
    /// The foreign queue's options (`stream`, `routing_key`, `qos`, `create`), as given.
    pub options: serde_json::Map<String, serde_json::Value>,
    pub jobs: Vec<ForeignJobRow>,
}

/// A job that uses a foreign queue.
#[derive(Debug, serde::Serialize)]
pub struct ForeignJobRow {
    pub name: String,
    /// `OUTBOUND` or `INBOUND`: the job's direction.
    pub direction: &'static str,
    /// `destination`, `source` or `exception_queue`.
    pub role: &'static str,
    pub options: aqgate_core::topology::gateway::JobOptions,
}

/// Every foreign queue of the stored topology, by `NAME@LINK`.
pub async fn foreign_queues(store: &dyn Store) -> anyhow::Result<Vec<ForeignQueueRow>> {
    use aqgate_core::topology::gateway::{Direction, Domain, LinkKind};
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let catalog = &resolved.catalog;
    let mut out = Vec::new();
    for (key, f) in &catalog.gateway_foreign {
        let kind = catalog.gateway_links.get(&f.link).map(|l| l.kind);
        let mut jobs = Vec::new();
        for j in catalog.propagations.values() {
            let Some(g) = j.gateway.as_ref().filter(|g| g.link.name == f.link) else { continue };
            let role = if g.foreign.name == f.name {
                if g.direction == Direction::Outbound { "destination" } else { "source" }
            } else if g.foreign_exception.as_ref().is_some_and(|e| e.name == f.name) {
                "exception_queue"
            } else {
                continue;
            };
            let direction = if g.direction == Direction::Outbound { "OUTBOUND" } else { "INBOUND" };
            jobs.push(ForeignJobRow { name: j.name.clone(), direction, role, options: g.options });
        }
        let publishes = jobs.iter().any(|j| j.role != "source");
        let takes = jobs.iter().any(|j| j.role == "source");
        let mut options = serde_json::Map::new();
        if let Some(s) = &f.stream {
            options.insert("stream".into(), s.clone().into());
        }
        if let Some(r) = &f.routing_key {
            options.insert("routing_key".into(), r.clone().into());
        }
        if kind == Some(LinkKind::Mqtt) {
            options.insert("qos".into(), f.qos.into());
        }
        options.insert("create".into(), f.create.into());
        out.push(ForeignQueueRow {
            name: key.clone(),
            link: f.link.clone(),
            kind: kind.map_or("-", LinkKind::name),
            native_name: f.native_name.clone(),
            domain: if f.domain == Domain::Topic { "TOPIC" } else { "QUEUE" },
            direction: match (publishes, takes) {
                (true, true) => "BOTH",
                (true, false) => "OUTBOUND",
                (false, true) => "INBOUND",
                (false, false) => "-",
            },
            options,
            jobs,
        });
    }
    Ok(out)
}

/// `aqgate admin gateway --foreign-queues`.
pub async fn print_foreign_queues(store: &dyn Store, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = foreign_queues(store).await?;
    if json {
        out!(w, "{}", serde_json::to_value(&rows)?);
        return Ok(());
    }
    out!(
        w,
        "{:<24} {:<9} {:<32} {:<6} {:<9} {:<40} JOBS",
        "NAME",
        "KIND",
        "PROVIDER_QUEUE",
        "DOMAIN",
        "DIRECTION",
        "OPTIONS"
    );
    for r in rows {
        let options: Vec<String> =
            r.options.iter().map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"'))).collect();
        let jobs: Vec<String> = r.jobs.iter().map(|j| format!("{} ({} {})", j.name, j.direction, j.role)).collect();
        let jobs = if jobs.is_empty() { "-".to_string() } else { jobs.join(", ") };
        row!(w, "{:<24} {:<9} {:<32} {:<6} {:<9} {:<40} {}", r.name, r.kind, r.native_name, r.domain, r.direction, options.join(","); jobs);
    }
    Ok(())
}

fn time(t: Micros) -> String {
    chrono::DateTime::from_timestamp_micros(t)
        .map_or_else(|| t.to_string(), |d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}
