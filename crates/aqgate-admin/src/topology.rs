//! `aqgate admin queues` and `aqgate admin agents`: the topology in the store, as tables.

use std::collections::BTreeMap;
use std::io::Write;

use aqgate_core::error::AqError;
use aqgate_core::store::Store;

/// One row of `admin queues`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRow {
    pub name: String,
    pub kind: &'static str,
    /// The payload type as the topology file spells it: `RAW`, `ORDER_TYP`,
    /// `SYS.AQ$_JMS_TEXT_MESSAGE`, `SYS.XMLTYPE`.
    pub payload: String,
    pub depth: i64,
}

/// A queue's kind as `admin queues` and the console show it: `exception`,
/// `multi-consumer` or `single-consumer`.
pub fn kind(q: &aqgate_core::topology::QueueInfo) -> &'static str {
    if q.is_exception_queue {
        "exception"
    } else if q.multi_consumer {
        "multi-consumer"
    } else {
        "single-consumer"
    }
}

pub async fn queues(store: &dyn Store) -> Result<Vec<QueueRow>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let depths: BTreeMap<i64, i64> = store.queue_depths().await?.into_iter().collect();
    Ok(resolved
        .catalog
        .queues
        .values()
        .map(|q| {
            let id = resolved.ids.get(&q.name).copied();
            QueueRow {
                name: q.name.clone(),
                kind: kind(q),
                payload: q.payload.to_string(),
                depth: id.and_then(|i| depths.get(&i).copied()).unwrap_or(0),
            }
        })
        .collect())
}

/// `aqgate admin queues`: queues with their kind, payload type and depth.
pub async fn print_queues(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = queues(store).await?;
    out!(w, "{:<32} {:<16} {:<28} {:>8}", "QUEUE", "KIND", "PAYLOAD", "DEPTH");
    for q in rows {
        row!(w, "{:<32} {:<16} {:<28} {:>8}", q.name, q.kind, q.payload, q.depth);
    }
    Ok(())
}

/// One row of `admin agents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub name: String,
    pub protocols: String,
    pub db_users: String,
    pub gateway: bool,
    pub certificate_location: Option<String>,
}

pub async fn agents(store: &dyn Store) -> Result<Vec<AgentRow>, AqError> {
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    Ok(agents_of(&resolved))
}

/// [`agents`] of the topology `resolved` (a running server's, current), not read again.
pub fn agents_of(resolved: &aqgate_core::engine::Resolved) -> Vec<AgentRow> {
    resolved
        .catalog
        .agents
        .values()
        .map(|a| {
            let mut protocols = Vec::new();
            if a.http {
                protocols.push("http");
            }
            if a.smtp {
                protocols.push("smtp");
            }
            AgentRow {
                name: a.name.clone(),
                protocols: protocols.join(","),
                db_users: a.db_users.join(","),
                gateway: a.gateway,
                certificate_location: a.certificate_location.clone(),
            }
        })
        .collect()
}

/// `aqgate admin agents`: agents, their protocols, database users, gateway flag and
/// certificate location.
pub async fn print_agents(store: &dyn Store, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = agents(store).await?;
    out!(w, "{:<16} {:<10} {:<20} {:<8} CERTIFICATE_LOCATION", "AGENT", "PROTOCOLS", "DB_USERS", "GATEWAY");
    for a in rows {
        row!(
            w,
            "{:<16} {:<10} {:<20} {:<8} {}",
            a.name,
            a.protocols,
            a.db_users,
            if a.gateway { "yes" } else { "no" };
            a.certificate_location.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
