//! Administration: the read models and the `aqgate admin …` commands. Applying a topology
//! file (idempotent, prints what changed) here; the tables, one module each: queues and
//! agents ([`topology`]), a queue's messages ([`messages`]), the mail spool ([`spool`]),
//! notifications and registrations ([`notifications`]), propagation jobs ([`jobs`]) and the
//! Messaging Gateway ([`gateway`]), the figures `admin jobs` and `/metrics` share
//! ([`status`]; the queues' and the spool's gauges, [`figures`]), replays from exception queues and the audit log ([`replay`]), a message's
//! timeline ([`timeline`]), the open sessions ([`sessions`]) and the condition tester ([`tester`]). The command line of `aqgate admin` is [`cli`]. Each command writes to the
//! output it is given (standard output in the binary); a write that fails is an
//! [`OutputError`].

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use aqgate_core::auth;
use aqgate_core::engine::topology_from_rows;
use aqgate_core::error::AqError;
use aqgate_core::store::{QueueTableView, Store};
use aqgate_core::topology::{Catalog, Topology, canon};

/// `writeln!` to a command's output, a failure as [`OutputError`] (with `?`).
macro_rules! out {
    ($w:expr, $($arg:tt)*) => {
        writeln!($w, $($arg)*).map_err($crate::OutputError)?
    };
}

/// [`out!`] for a row of a table: each field shown through [`Cell`] (escaped, then padded
/// by the format's width), the one after `;` as the free-text last column (spaces kept).
macro_rules! row {
    ($w:expr, $fmt:literal, $($cell:expr),+ ; $last:expr) => {
        out!($w, $fmt, $($crate::Cell::field(&$cell)),+, $crate::Cell::last(&$last))
    };
    ($w:expr, $fmt:literal, $($cell:expr),+ $(,)?) => {
        out!($w, $fmt, $($crate::Cell::field(&$cell)),+)
    };
}

pub mod cli;
pub mod figures;
pub mod gateway;
pub mod jobs;
pub mod messages;
pub mod notifications;
pub mod replay;
pub mod sessions;
pub mod spool;
pub mod status;
pub mod tester;
pub mod timeline;
pub mod topology;

pub use topology::{AgentRow, QueueRow, agents, agents_of, queues};

/// The topology the repository ships: the types, queues, subscribers and agents the
/// examples in `examples/` use (demo passwords, marked as such in the file).
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../../config/topology.toml");

/// One field of an admin table as printed. What the store holds came from clients (a
/// correlation, a consumer, a mail's Message-ID, a broker's error), so nothing of it may
/// reach the terminal as anything but text on its own line and in its own column: control
/// characters (C0, DEL, C1: a newline would forge a row, a CR or an escape sequence rewrite
/// the screen), Unicode's invisible format characters (bidi overrides and isolates, zero
/// widths, line and paragraph separators) and the backslash are escaped (`\n`, `\x1b`,
/// `\u{202e}`, `\\`), and so is whitespace in any column but the last, which would shift
/// the columns after it (`\x20`). The format's width and alignment apply to the escaped
/// text.
pub struct Cell<'a> {
    value: &'a dyn std::fmt::Display,
    last: bool,
}

impl<'a> Cell<'a> {
    pub fn field(value: &'a dyn std::fmt::Display) -> Self {
        Self { value, last: false }
    }

    /// The last column: free text, its spaces kept.
    pub fn last(value: &'a dyn std::fmt::Display) -> Self {
        Self { value, last: true }
    }
}

impl std::fmt::Display for Cell<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&escape_field(&self.value.to_string(), self.last))
    }
}

/// See [`Cell`].
pub fn escape_field(text: &str, last: bool) -> String {
    use std::fmt::Write as _;
    let invisible = |c: char| {
        matches!(c,
            '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}')
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || invisible(c) || (c.is_whitespace() && !last) => {
                let n = u32::from(c);
                let _ = if n < 0x100 { write!(out, "\\x{n:02x}") } else { write!(out, "\\u{{{n:04x}}}") };
            }
            c => out.push(c),
        }
    }
    out
}

/// Writing a command's output failed.
#[derive(Debug, thiserror::Error)]
#[error("writing the output: {0}")]
pub struct OutputError(pub std::io::Error);

impl OutputError {
    /// The reader went away (`aqgate admin … | head`): the end, quietly, as SIGPIPE would be.
    pub fn reader_gone(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// One line of `admin apply` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added(String),
    Changed(String),
    Removed(String),
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Added(s) => write!(f, "+ {s}"),
            Change::Changed(s) => write!(f, "~ {s}"),
            Change::Removed(s) => write!(f, "- {s}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid topology:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
    #[error(transparent)]
    Aq(#[from] AqError),
}

impl From<aqgate_core::store::StoreError> for ApplyError {
    fn from(e: aqgate_core::store::StoreError) -> Self {
        ApplyError::Aq(e.into())
    }
}

/// The topology as (kind, key) → JSON spec rows, clear-text passwords replaced by hashes.
fn rows_of(t: &Topology) -> Result<BTreeMap<(String, String), String>, ApplyError> {
    let mut rows = BTreeMap::new();
    let mut put = |kind: &str, key: String, spec: Result<String, serde_json::Error>| -> Result<(), ApplyError> {
        let spec = spec.map_err(|e| ApplyError::Invalid(vec![format!("{kind} {key}: {e}")]))?;
        if rows.insert((kind.to_string(), key.clone()), spec).is_some() {
            return Err(ApplyError::Invalid(vec![format!("{kind} {key}: defined twice")]));
        }
        Ok(())
    };
    for x in &t.types {
        put("type", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.queue_tables {
        put("queue_table", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.queues {
        put("queue", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.subscribers {
        put("subscriber", format!("{}:{}", canon(&x.queue), canon(&x.name)), serde_json::to_string(x))?;
    }
    for x in &t.agents {
        put("agent", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.propagations {
        put("propagation", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.remote_queue_spaces {
        put("remote_queue_space", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.transformations {
        put("transformation", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.gateway.links {
        put("gateway_link", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.gateway.foreign_queues {
        put("foreign_queue", format!("{}@{}", canon(&x.name), canon(&x.link)), serde_json::to_string(x))?;
    }
    for x in &t.gateway.jobs {
        put("gateway_job", canon(&x.name), serde_json::to_string(x))?;
    }
    for x in &t.grants {
        let key = format!("{}:{}:{}", canon(&x.user), canon(&x.queue), x.privilege.to_ascii_lowercase());
        put("grant", key, serde_json::to_string(x))?;
    }
    Ok(rows)
}

/// Makes the store's topology equal to `wanted`. Messages are never deleted: a queue that
/// leaves the topology keeps its messages, and they are back if the queue returns.
pub async fn apply(store: &dyn Store, wanted: &Topology, dry_run: bool) -> Result<Vec<Change>, ApplyError> {
    let current_rows = store.load_topology().await?;
    let current = topology_from_rows(&current_rows)?;

    // Clear-text (demo) passwords become hashes; an unchanged password keeps its hash so
    // that applying the same file twice changes nothing.
    let mut wanted = wanted.clone();
    for a in &mut wanted.agents {
        if let Some(p) = a.password.take() {
            let old =
                current.agents.iter().find(|o| canon(&o.name) == canon(&a.name)).and_then(|o| o.password_hash.clone());
            a.password_hash = Some(match old {
                Some(h) if auth::verify_password(&p, &h) => h,
                _ => auth::hash_password(&p)
                    .map_err(|e| ApplyError::Invalid(vec![format!("agents ({}): {e}", a.name)]))?,
            });
        }
    }
    let catalog: Catalog =
        wanted.resolve(&|_| Err("unreachable: passwords are hashed".into())).map_err(ApplyError::Invalid)?;
    // A link whose broker's client this build lacks could never connect.
    let unbuilt = aqgate_propagate::gateway::unbuilt_links(&catalog);
    if !unbuilt.is_empty() {
        return Err(ApplyError::Invalid(unbuilt));
    }

    refuse_reshaping_queues_with_messages(store, &current, &catalog).await?;

    let new_rows = rows_of(&wanted)?;
    // Removed jobs' records are no part of a file (`propagate::removals`).
    let records = aqgate_propagate::removals::of_rows(&current_rows);
    let old_rows: BTreeMap<(String, String), String> = current_rows
        .into_iter()
        .filter(|(k, _, _)| k != aqgate_propagate::removals::KIND)
        .map(|(k, n, s)| ((k, n), s))
        .collect();
    let mut changes = Vec::new();
    for ((kind, name), spec) in &new_rows {
        match old_rows.get(&(kind.clone(), name.clone())) {
            None => changes.push(Change::Added(format!("{kind} {name}"))),
            Some(old) if old != spec => changes.push(Change::Changed(format!("{kind} {name}"))),
            Some(_) => {}
        }
    }
    for (kind, name) in old_rows.keys() {
        if !new_rows.contains_key(&(kind.clone(), name.clone())) {
            changes.push(Change::Removed(format!("{kind} {name}")));
        }
    }
    if dry_run {
        return Ok(changes);
    }
    let mut tx = store.begin().await?;
    for ((kind, name), spec) in &new_rows {
        if old_rows.get(&(kind.clone(), name.clone())) != Some(spec) {
            tx.put_topology_object(kind, name, spec).await?;
        }
    }
    for (kind, name) in old_rows.keys() {
        if !new_rows.contains_key(&(kind.clone(), name.clone())) {
            tx.delete_topology_object(kind, name).await?;
        }
    }
    removal_records(tx.as_mut(), &current, &new_rows, &records).await?;
    // Oracle's AQ$<QUEUE_TABLE> views, over the queues of each table (a remote queue
    // space's queue is a table of its own: `HQ.AQ$ORDERS` for `HQ.ORDERS`),
    // and the queues that keep their removed messages.
    let mut tables: BTreeMap<String, QueueTableView> = BTreeMap::new();
    let mut retained = Vec::new();
    for (name, q) in &catalog.queues {
        let id = tx.ensure_queue(name).await?;
        let raw = q.payload == aqgate_core::payload::PayloadKind::Raw;
        tables
            .entry(q.queue_table.clone())
            .or_insert_with(|| QueueTableView { queue_table: q.queue_table.clone(), queues: Vec::new(), raw })
            .queues
            .push(id);
        if let Some(for_micros) = q.retention.micros() {
            retained.push(aqgate_core::store::Retained { queue: id, for_micros });
        }
    }
    tx.define_views(&tables.into_values().collect::<Vec<_>>(), &retained).await?;
    tx.commit().await?;
    Ok(changes)
}

/// The removed jobs' records (`propagate::removals`) after an apply: a job the file
/// removes that owns state at its broker is DELETE_PENDING until a running node has ended
/// it; a job the file defines loses its record (its pending removal is called off, its
/// tombstone goes: the file re-creates it).
async fn removal_records(
    tx: &mut dyn aqgate_core::store::StoreTx,
    current: &Topology,
    new_rows: &BTreeMap<(String, String), String>,
    records: &[aqgate_propagate::removals::Removal],
) -> Result<(), ApplyError> {
    use aqgate_propagate::removals::{self, KIND};
    let job = |name: &str| {
        ["gateway_job", "propagation"].iter().any(|k| new_rows.contains_key(&((*k).to_string(), name.to_string())))
    };
    for r in records.iter().filter(|r| job(&r.name)) {
        tx.delete_topology_object(KIND, &r.name).await?;
    }
    let Ok(before) = current.resolve(&|_| Err("unreachable: stored passwords are hashes".into())) else {
        // What is stored did not resolve: its jobs' links are unknown, nothing to end.
        return Ok(());
    };
    let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
    for (name, info) in before.propagations.iter().filter(|(n, i)| i.space.is_none() && !job(n)) {
        let Some(pending) = removals::owned(info) else { continue };
        let by_operator = records.iter().any(|r| r.name == *name && r.by_operator);
        let r = removals::Removal { name: name.clone(), at: now, by_operator, pending: Some(pending) };
        tx.put_topology_object(KIND, name, &removals::spec(&r)?).await?;
    }
    Ok(())
}

/// What `serve --topology FILE` applies at start: the file without the jobs an operator
/// removed with `admin jobs --remove` (their tombstones; `admin apply FILE` re-creates
/// them), and the names of those left out.
pub async fn apply_at_start(store: &dyn Store, file: &Topology) -> Result<(Vec<Change>, Vec<String>), ApplyError> {
    let removed: Vec<String> =
        aqgate_propagate::removals::load(store).await?.into_iter().filter(|r| r.by_operator).map(|r| r.name).collect();
    let mut wanted = file.clone();
    let mut left_out = Vec::new();
    let mut keep = |name: &str| {
        let gone = removed.contains(&canon(name));
        if gone {
            left_out.push(canon(name));
        }
        !gone
    };
    wanted.propagations.retain(|p| keep(&p.name));
    wanted.gateway.jobs.retain(|j| keep(&j.name));
    Ok((apply(store, &wanted, false).await?, left_out))
}

/// A queue's stored messages must stay readable: while it holds messages its payload
/// type and its consumer model (single or multiple) cannot change.
async fn refuse_reshaping_queues_with_messages(
    store: &dyn Store,
    current: &Topology,
    wanted: &Catalog,
) -> Result<(), ApplyError> {
    let Ok(before) = current.resolve(&|_| Err("unreachable: stored passwords are hashes".into())) else {
        // What is stored did not resolve (an older or hand-edited topology): nothing to compare.
        return Ok(());
    };
    let ids: BTreeMap<String, i64> = store.queue_ids().await?.into_iter().collect();
    let depths: BTreeMap<i64, i64> = store.queue_depths().await?.into_iter().collect();
    let mut refused = Vec::new();
    for (name, old) in &before.queues {
        let Some(new) = wanted.queues.get(name) else { continue };
        let regrouped = old.grouped != new.grouped;
        if old.payload == new.payload && old.multi_consumer == new.multi_consumer && old.sort == new.sort && !regrouped
        {
            continue;
        }
        let depth = ids.get(name).and_then(|id| depths.get(id)).copied().unwrap_or(0);
        if depth > 0 && regrouped {
            // A message enqueued without a group, or grouped messages left without their
            // grouping, would be dequeued out of turn.
            refused.push(format!(
                "queue {name} holds {depth} message(s): message_grouping of its queue table {} cannot change \
                 until it is empty",
                new.queue_table
            ));
        } else if depth > 0 {
            refused.push(format!(
                "queue {name} holds {depth} message(s): its payload type, consumer model and sort_list cannot \
                 change until it is empty"
            ));
        }
    }
    if refused.is_empty() { Ok(()) } else { Err(ApplyError::Invalid(refused)) }
}

/// `aqgate admin apply`: applies `wanted` (or only says what would change) and prints the
/// changes, `+ ~ -` lines.
pub async fn print_apply(store: &dyn Store, wanted: &Topology, dry_run: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let changes = apply(store, wanted, dry_run).await?;
    if changes.is_empty() {
        out!(w, "no changes");
    }
    for c in changes {
        out!(w, "{c}");
    }
    Ok(())
}

/// `aqgate admin hash-password`: an argon2 hash of the password on the first line of `input`.
pub fn print_password_hash(input: &mut dyn BufRead, w: &mut dyn Write) -> anyhow::Result<()> {
    let mut line = String::new();
    input.read_line(&mut line)?;
    let h = auth::hash_password(line.trim_end_matches(['\r', '\n'])).map_err(|e| anyhow::anyhow!(e))?;
    out!(w, "{h}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cannot_forge_rows_columns_or_terminal_output() {
        let forged = "X\nMSGID READY 1 2026 SCOTT";
        assert_eq!(escape_field(forged, true), "X\\nMSGID READY 1 2026 SCOTT");
        assert_eq!(escape_field(forged, false), "X\\nMSGID\\x20READY\\x201\\x202026\\x20SCOTT");
        assert_eq!(escape_field("a\rb\u{1b}[2Jc\u{7f}\u{85}", true), "a\\rb\\x1b[2Jc\\x7f\\x85");
        assert_eq!(escape_field("evil\u{202e}txt.exe\u{2066}\u{200b}", true), "evil\\u{202e}txt.exe\\u{2066}\\u{200b}");
        assert_eq!(escape_field("line\u{2028}sep\tend", true), "line\\u{2028}sep\\tend");
        assert_eq!(escape_field("a\u{a0}b\u{3000}c", false), "a\\xa0b\\u{3000}c");
        assert_eq!(escape_field("a\u{a0}b", true), "a\u{a0}b", "the last column keeps its spaces");
        assert_eq!(escape_field("C:\\x20", false), "C:\\\\x20", "an escape in the text stays apart from ours");
        assert_eq!(escape_field("ÄQ-ORDER ✓", true), "ÄQ-ORDER ✓");
    }

    #[test]
    fn rows_pad_the_escaped_fields() -> anyhow::Result<()> {
        let mut out = Vec::new();
        let w: &mut dyn Write = &mut out;
        row!(w, "{:<6}|{:>4}|{} {}", "a b", 7, "x"; "free text\nnext");
        row!(w, "{:<6}|{:>4}", "\u{202e}", "");
        assert_eq!(String::from_utf8(out)?, "a\\x20b|   7|x free text\\nnext\n\\u{202e}|    \n");
        Ok(())
    }
}
