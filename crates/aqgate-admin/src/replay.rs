//! `aqgate admin replay EXCEPTION_QUEUE`: messages of an exception queue back to the queue
//! each left, as new messages whose ORIGINAL_MSGID is theirs (no failed dequeues, no delay,
//! no expiration), a batch per store transaction that removes them from the exception queue,
//! enqueues them on their queue and writes the batch's audit row: a kill at any moment leaves
//! each message in one of the two queues, and the audit log says exactly what moved. Also
//! `aqgate admin audit`, the audit log.

use std::io::Write;

use aqgate_core::error::AqError;
use aqgate_core::payload::hex_upper;
use aqgate_core::store::{AUDIT_IDS, AuditRecord, CandidateQuery, ExceptionMessage, Expiry, Store};
use aqgate_core::topology::canon;

/// The messages a replay moves when not told (`--max`), and the most it moves.
pub const DEFAULT_MAX: i64 = 100;
pub const MAX_MAX: i64 = 10_000;
/// Messages per transaction when not told (`--batch`).
pub const DEFAULT_BATCH: i64 = 100;

/// Which messages of the exception queue to replay.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReplayFilter {
    /// These message ids only (hex), when any.
    pub msgids: Vec<String>,
    pub correlation: Option<String>,
    /// EXPIRATION_REASON: TIME_EXPIRATION, MAX_RETRY_EXCEEDED, PROPAGATION_FAILURE,
    /// INVALID_TRANSFORMATION.
    pub reason: Option<String>,
}

/// A replay to do (or, `dry_run`, to count).
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub queue: String,
    pub filter: ReplayFilter,
    /// At most this many messages (1 to [`MAX_MAX`]).
    pub max: i64,
    pub batch: i64,
    pub dry_run: bool,
    /// Who asks (recorded in the audit log).
    pub actor: String,
}

/// One message of a replay.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayRow {
    pub msgid: String,
    /// The replayed message's id (none in a dry run, or when it was not moved).
    pub new_msgid: Option<String>,
    pub original_queue: Option<String>,
    pub reason: Option<String>,
    pub correlation: Option<String>,
    /// `would replay`, `replayed`, or why not (`locked`, `gone`, `original queue unknown`).
    pub outcome: String,
}

/// What a replay did (or would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayReport {
    pub queue: String,
    pub dry_run: bool,
    /// The run's id: its audit rows share it, and it is its messages' ENQ_TXN_ID.
    pub run: String,
    pub filter: ReplayFilter,
    /// Messages the filter took (at most `max`).
    pub matched: usize,
    pub replayed: usize,
    /// More messages matched than `max`.
    pub capped: bool,
    pub rows: Vec<ReplayRow>,
}

fn reason_code(name: &str) -> Result<i64, AqError> {
    let n = name.trim().to_ascii_uppercase();
    Expiry::ALL.iter().find(|e| e.oracle_name() == n).map(|e| e.code()).ok_or_else(|| {
        let all: Vec<&str> = Expiry::ALL.iter().map(|e| e.oracle_name()).collect();
        AqError::invalid(format!("--reason {name}: one of {}", all.join(", ")))
    })
}

fn reason_name(code: Option<i64>) -> Option<String> {
    Expiry::ALL.iter().find(|e| Some(e.code()) == code).map(|e| e.oracle_name().to_string())
}

fn parse_msgid(id: &str) -> Result<String, AqError> {
    let id = id.trim().to_ascii_uppercase();
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AqError::invalid(format!("--msgid {id}: 32 hex digits")));
    }
    Ok(id)
}

/// The messages of exception queue `qid` the filter takes, at most `max`, and whether
/// there are more.
async fn matching(
    store: &dyn Store,
    qid: i64,
    filter: &ReplayFilter,
    max: usize,
) -> Result<(Vec<ExceptionMessage>, bool), AqError> {
    let ids: Vec<String> = filter.msgids.iter().map(|i| parse_msgid(i)).collect::<Result<_, _>>()?;
    let reason = filter.reason.as_deref().map(reason_code).transpose()?;
    let takes = |m: &ExceptionMessage| {
        (ids.is_empty() || ids.contains(&hex_upper(&m.msgid)))
            && filter.correlation.as_ref().is_none_or(|c| m.corrid.as_ref() == Some(c))
            && reason.is_none_or(|r| m.reason == Some(r))
    };
    let (mut found, mut after) = (Vec::new(), 0);
    loop {
        let page = store.exception_page(qid, after, 500).await?;
        let Some(last) = page.last() else { return Ok((found, false)) };
        after = last.seq;
        for m in page.into_iter().filter(|m| takes(m)) {
            if found.len() == max {
                return Ok((found, true));
            }
            found.push(m);
        }
    }
}

/// Does (or counts) a replay; `progress` is told after each batch (moved so far, of how many).
pub async fn replay(
    store: &dyn Store,
    req: &ReplayRequest,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<ReplayReport, AqError> {
    if !(1..=MAX_MAX).contains(&req.max) {
        return Err(AqError::invalid(format!("--max {}: from 1 to {MAX_MAX}", req.max)));
    }
    if !(1..=1000).contains(&req.batch) {
        return Err(AqError::invalid(format!("--batch {}: from 1 to 1000", req.batch)));
    }
    if req.actor.trim().is_empty() {
        return Err(AqError::invalid("--as: who replays (recorded in the audit log)"));
    }
    let resolved = aqgate_core::engine::load_resolved(store).await?;
    let name = canon(&req.queue);
    let Some(q) = resolved.catalog.queues.get(&name) else {
        return Err(AqError::invalid(format!("no queue {name} (aqgate admin queues lists them)")));
    };
    if !q.is_exception_queue {
        return Err(AqError::invalid(format!(
            "queue {name} is not an exception queue: a replay takes messages from an exception queue (such as \
             {}) back to the queue they left",
            q.exception_queue
        )));
    }
    let Some(&qid) = resolved.ids.get(&name) else {
        return Err(AqError::invalid(format!("queue {name} is not in the database yet (aqgate admin apply makes it)")));
    };
    let (found, capped) = matching(store, qid, &req.filter, req.max as usize).await?;
    let run = format!("replay-{}", uuid_hex());
    let mut rows: Vec<ReplayRow> = found
        .iter()
        .map(|m| ReplayRow {
            msgid: hex_upper(&m.msgid),
            new_msgid: None,
            original_queue: m.orig_queue.and_then(|id| resolved.names.get(&id).cloned()),
            reason: reason_name(m.reason),
            correlation: m.corrid.clone(),
            outcome: if m.locked { "locked" } else { "would replay" }.to_string(),
        })
        .collect();
    for r in rows.iter_mut().filter(|r| r.original_queue.is_none()) {
        r.outcome = "original queue unknown".into();
    }
    let mut report = ReplayReport {
        queue: name.clone(),
        dry_run: req.dry_run,
        run,
        filter: req.filter.clone(),
        matched: found.len(),
        replayed: 0,
        capped,
        rows,
    };
    if req.dry_run {
        return Ok(report);
    }
    let todo: Vec<usize> = (0..found.len()).filter(|&i| report.rows[i].outcome == "would replay").collect();
    for batch in todo.chunks(req.batch as usize) {
        move_batch(store, &resolved, qid, &req.actor, batch, &mut report).await?;
        progress(report.replayed, todo.len());
    }
    Ok(report)
}

/// One transaction: each message of `batch` (indexes into `report.rows`) out of exception
/// queue `qid` and onto its queue, and the batch's audit row.
async fn move_batch(
    store: &dyn Store,
    resolved: &aqgate_core::engine::Resolved,
    qid: i64,
    actor: &str,
    batch: &[usize],
    report: &mut ReplayReport,
) -> Result<(), AqError> {
    let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
    let txn = report.run.clone();
    let mut tx = store.begin().await?;
    let (mut news, mut moved, mut targets) = (Vec::new(), Vec::new(), std::collections::BTreeSet::new());
    for &i in batch {
        let row = &report.rows[i];
        let msgid = hex::decode(&row.msgid).ok().and_then(|b| <[u8; 16]>::try_from(b).ok());
        let target = row.original_queue.clone().unwrap_or_default();
        let (Some(msgid), Some(tq), Some(&tid)) =
            (msgid, resolved.catalog.queues.get(&target), resolved.ids.get(&target))
        else {
            report.rows[i].outcome = "original queue unknown".into();
            continue;
        };
        let q = CandidateQuery {
            msgid: Some(msgid),
            include_waiting: true,
            ..CandidateQuery::head(qid, "", txn.as_str(), now)
        };
        let Some(m) = tx.candidates(&q).await?.into_iter().next() else {
            report.rows[i].outcome = "gone".into();
            continue;
        };
        if !tx.remove_now(m.seq, "", &txn, false).await?.removed() {
            report.rows[i].outcome = "locked".into();
            continue;
        }
        let new = aqgate_core::engine::admin::replayed(resolved, tq, tid, &m, qid, now, &txn)?;
        report.rows[i].new_msgid = Some(hex_upper(&new.msgid));
        report.rows[i].outcome = "replayed".into();
        moved.push(report.rows[i].msgid.clone());
        targets.insert(target);
        news.push(new);
    }
    if news.is_empty() {
        tx.rollback().await?;
        return Ok(());
    }
    tx.insert_messages(&news).await?;
    let more = moved.len().saturating_sub(AUDIT_IDS);
    moved.truncate(AUDIT_IDS);
    let count = news.len();
    tx.audit_put(&AuditRecord {
        id: 0,
        at: now,
        actor: actor.to_string(),
        action: "replay".into(),
        queue: report.queue.clone(),
        target: Some(targets.into_iter().collect::<Vec<_>>().join(",")),
        count: count as i64,
        filter: filter_text(&report.filter),
        run: txn,
        msgids: moved,
        ids_more: more as i64,
    })
    .await?;
    tx.commit().await?;
    report.replayed += count;
    Ok(())
}

/// The filter as the audit log keeps it: the flags that would give it.
fn filter_text(f: &ReplayFilter) -> String {
    let mut parts: Vec<String> = f.msgids.iter().map(|m| format!("--msgid {}", m.to_ascii_uppercase())).collect();
    if let Some(c) = &f.correlation {
        parts.push(format!("--correlation {c:?}"));
    }
    if let Some(r) = &f.reason {
        parts.push(format!("--reason {}", r.to_ascii_uppercase()));
    }
    if parts.is_empty() { "(all)".into() } else { parts.join(" ") }
}

fn uuid_hex() -> String {
    hex_upper(uuid::Uuid::now_v7().as_bytes())
}

/// Prints a replay's report: a line per message and a summary, or with `json` the report.
pub fn print_replay(report: &ReplayReport, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    if json {
        out!(w, "{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    out!(
        w,
        "{:<32} {:<32} {:<24} {:<20} {:<16} CORR_ID",
        "MSG_ID",
        "NEW_MSG_ID",
        "ORIGINAL_QUEUE",
        "REASON",
        "OUTCOME"
    );
    for r in &report.rows {
        row!(
            w,
            "{:<32} {:<32} {:<24} {:<20} {:<16} {}",
            r.msgid,
            r.new_msgid.as_deref().unwrap_or("-"),
            r.original_queue.as_deref().unwrap_or("-"),
            r.reason.as_deref().unwrap_or("-"),
            r.outcome;
            r.correlation.as_deref().unwrap_or("-")
        );
    }
    let more = if report.capped { " (more match: raise --max or narrow the filter)" } else { "" };
    if report.dry_run {
        out!(w, "dry run: {} message(s) of {} match{more}; nothing changed", report.matched, report.queue);
    } else {
        out!(
            w,
            "replayed {} of {} matching message(s) of {} (run {}){more}",
            report.replayed,
            report.matched,
            report.queue,
            report.run
        );
    }
    Ok(())
}

/// `aqgate admin audit`: the audit log, newest first.
pub async fn audit(store: &dyn Store, limit: i64) -> Result<Vec<AuditRecord>, AqError> {
    Ok(store.audit_list(limit.clamp(1, 100_000)).await?)
}

pub async fn print_audit(store: &dyn Store, limit: i64, json: bool, w: &mut dyn Write) -> anyhow::Result<()> {
    let rows = audit(store, limit).await?;
    if json {
        out!(w, "{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    out!(
        w,
        "{:>6} {:<26} {:<16} {:<8} {:<24} {:<24} {:>6} {:<40} FILTER",
        "ID",
        "AT",
        "ACTOR",
        "ACTION",
        "QUEUE",
        "TARGET",
        "COUNT",
        "RUN"
    );
    for r in &rows {
        row!(
            w,
            "{:>6} {:<26} {:<16} {:<8} {:<24} {:<24} {:>6} {:<40} {}",
            r.id,
            crate::timeline::time_text(r.at),
            r.actor,
            r.action,
            r.queue,
            r.target.as_deref().unwrap_or("-"),
            r.count,
            r.run;
            r.filter
        );
    }
    Ok(())
}
