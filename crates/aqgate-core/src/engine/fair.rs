//! Fair shares between agents: the sessions one agent may hold open (beside the store-wide
//! cap), and the idempotency records (and their bytes) kept for it. `seal` asks here before
//! it writes a new session row or a record, inside the request's transaction, so that a
//! refusal leaves nothing of the request behind; a request that leaves no session open
//! never asks, and so never fails for want of one.

use super::*;
use crate::metrics::{Counter, Metrics};

/// The per-agent limits (and the store-wide session cap), each with its flag.
#[derive(Debug, Clone)]
pub struct Shares {
    /// Sessions the store may hold open, all agents together (`--max-sessions`): an
    /// approximate cap (this process's count at its last look, plus what it opened since).
    pub max_sessions: usize,
    /// Sessions one agent may hold open (`--max-sessions-per-agent`), counted in the store.
    pub max_sessions_per_agent: usize,
    /// The largest response an idempotency record keeps whole
    /// (`--idempotency-max-response-bytes`); a larger one is kept as a digest.
    pub idempotency_max_response_bytes: usize,
    /// Idempotency records one agent may have kept (`--idempotency-max-records-per-agent`);
    /// beyond, requests with a new key are refused until old records age out.
    pub idempotency_max_records_per_agent: u64,
    /// Bytes of idempotency records (keys and responses) one agent may have kept
    /// (`--idempotency-max-bytes-per-agent`); beyond, new records keep a digest only.
    pub idempotency_max_bytes_per_agent: u64,
}

impl Default for Shares {
    fn default() -> Self {
        Self {
            max_sessions: 100_000,
            max_sessions_per_agent: 1_000,
            idempotency_max_response_bytes: 256 << 10,
            idempotency_max_records_per_agent: 10_000_000,
            idempotency_max_bytes_per_agent: 4 << 30,
        }
    }
}

/// How often (at most) a process counts an agent's idempotency records in the store again;
/// in between it adds what it records itself.
const RECOUNT_EVERY: Micros = 60 * crate::clock::MICROS_PER_SEC;

/// How long an agent found at `--max-sessions-per-agent` is taken to be there still: its
/// requests that would open a session meanwhile are refused before any of their work, in
/// this process (a flood of them would otherwise each do its work and count the agent's
/// sessions in the request's transaction, on SQLite in the one write lane everyone shares).
/// A session this process ends forgets every such finding at once.
const AT_CAP_FOR: Micros = crate::clock::MICROS_PER_SEC;

/// An agent's idempotency records as last counted in the store, plus this process's since.
#[derive(Debug, Clone, Copy)]
struct Usage {
    records: i64,
    bytes: i64,
    counted_at: Micros,
}

/// The engine's part of the shares: the records' usage per agent, and the counters.
pub(super) struct Fair {
    usage: StdMutex<HashMap<String, Usage>>,
    /// Agents found at their session cap, and when (see [`AT_CAP_FOR`]).
    at_cap: StdMutex<HashMap<String, Micros>>,
    sessions_refused_store: Counter,
    sessions_refused_agent: Counter,
    records_refused: Counter,
    responses_digested: Counter,
    reads_unrecorded: Counter,
}

impl Fair {
    pub(super) fn new(metrics: &Metrics) -> Self {
        const REFUSED: &str = "aqgate_sessions_refused_total";
        const REFUSED_HELP: &str = "Requests refused because they would leave a session open past a limit \
                                    (limit=\"store\": --max-sessions, limit=\"agent\": --max-sessions-per-agent).";
        Self {
            usage: StdMutex::new(HashMap::new()),
            at_cap: StdMutex::new(HashMap::new()),
            sessions_refused_store: metrics.labelled(REFUSED, REFUSED_HELP, "limit", "store"),
            sessions_refused_agent: metrics.labelled(REFUSED, REFUSED_HELP, "limit", "agent"),
            records_refused: metrics.counter(
                "aqgate_idempotency_refused_total",
                "Requests with a new Idempotency-Key refused: the agent has --idempotency-max-records-per-agent records.",
            ),
            responses_digested: metrics.counter(
                "aqgate_idempotency_digested_total",
                "Idempotency records that keep a digest instead of the response (over \
                 --idempotency-max-response-bytes, or the agent over --idempotency-max-bytes-per-agent).",
            ),
            reads_unrecorded: metrics.counter(
                "aqgate_idempotency_unrecorded_total",
                "Requests with an Idempotency-Key not recorded: reads that change nothing (BROWSE).",
            ),
        }
    }
}

impl Engine {
    /// Before the request's transaction `tx` writes the first row of `session`: refused
    /// (18, nothing of the request performed) when the store holds `--max-sessions`, or the
    /// agent `--max-sessions-per-agent`. A propagation job's batch is the service's own and
    /// is not counted against its agent.
    pub(super) async fn may_open_session(&self, tx: &mut dyn StoreTx, session: &Session) -> Result<(), AqError> {
        if session.propagates {
            return Ok(());
        }
        let shares = &self.config.shares;
        let store_cap = i64::try_from(shares.max_sessions).unwrap_or(i64::MAX);
        if self.stored_sessions() >= store_cap {
            self.fair.sessions_refused_store.inc();
            return Err(too_many_sessions(format!(
                "the store holds {} open sessions, the limit of all agents together (--max-sessions)",
                shares.max_sessions
            )));
        }
        let cap = i64::try_from(shares.max_sessions_per_agent).unwrap_or(i64::MAX);
        if tx.sessions_of(&session.agent, cap).await? >= cap {
            let mut at_cap = self.fair.at_cap.lock().unwrap_or_else(|p| p.into_inner());
            if at_cap.len() >= 4096 {
                let now = self.now();
                at_cap.retain(|_, at| now - *at < AT_CAP_FOR);
            }
            at_cap.insert(session.agent.clone(), self.now());
            drop(at_cap);
            return Err(self.agent_at_cap(&session.agent));
        }
        Ok(())
    }

    /// Before any work of a request that would leave a new session open: refused at once
    /// (18) if its agent was found at `--max-sessions-per-agent` within [`AT_CAP_FOR`].
    pub(super) fn refuse_known_at_cap(&self, session: &Session) -> Result<(), AqError> {
        if session.propagates || session.stored.is_some() {
            return Ok(());
        }
        let now = self.now();
        let known = self
            .fair
            .at_cap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&session.agent)
            .is_some_and(|at| (0..AT_CAP_FOR).contains(&(now - *at)));
        if known { Err(self.agent_at_cap(&session.agent)) } else { Ok(()) }
    }

    /// Sessions ended in this process: an agent found at its cap may have room again.
    pub(super) fn sessions_ended(&self) {
        self.fair.at_cap.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn agent_at_cap(&self, agent: &str) -> AqError {
        self.fair.sessions_refused_agent.inc();
        too_many_sessions(format!(
            "agent {agent} holds {} open sessions, its limit (--max-sessions-per-agent)",
            self.config.shares.max_sessions_per_agent
        ))
    }

    /// Counts `agent`'s idempotency records in the store again if the last count is older
    /// than a minute (before the request's transaction begins: on SQLite it holds the one
    /// connection). A failed count keeps the old figure.
    pub(super) async fn count_records(&self, agent: &str) {
        let now = self.now();
        let fresh = |u: &HashMap<String, Usage>| u.get(agent).is_some_and(|u| now - u.counted_at < RECOUNT_EVERY);
        if fresh(&self.fair.usage.lock().unwrap_or_else(|p| p.into_inner())) {
            return;
        }
        match self.store.idempotency_usage(agent).await {
            Ok((records, bytes)) => {
                let usage = Usage { records, bytes, counted_at: now };
                self.fair.usage.lock().unwrap_or_else(|p| p.into_inner()).insert(agent.to_string(), usage);
            }
            Err(e) => tracing::warn!(error = %e, agent, "counting an agent's idempotency records"),
        }
    }

    /// What the idempotency record of `agent`'s request under `key` keeps of its `response`
    /// (as answered): the response itself, or — past `--idempotency-max-response-bytes`, or
    /// with the agent's records at `--idempotency-max-bytes-per-agent` — a fault that says
    /// the request was performed and names the response by size and SHA-256, which a retry
    /// is answered instead. Refused (24061, nothing performed) when the agent has
    /// `--idempotency-max-records-per-agent` records.
    pub(super) fn record_of(&self, agent: &str, key: &str, response: Vec<u8>) -> Result<Vec<u8>, AqError> {
        let shares = &self.config.shares;
        let mut all = self.fair.usage.lock().unwrap_or_else(|p| p.into_inner());
        let usage = all.entry(agent.to_string()).or_insert(Usage { records: 0, bytes: 0, counted_at: i64::MIN });
        if u64::try_from(usage.records).unwrap_or(0) >= shares.idempotency_max_records_per_agent {
            self.fair.records_refused.inc();
            return Err(AqError::server(
                code::IDEMPOTENCY_LIMIT,
                format!(
                    "agent {agent} has {} requests recorded under Idempotency-Keys, its limit \
                     (--idempotency-max-records-per-agent); nothing of this request was performed. Records are \
                     forgotten after --idempotency-window; send it again later, or without an Idempotency-Key",
                    shares.idempotency_max_records_per_agent
                ),
            ));
        }
        let whole = key.len() + response.len();
        let over_budget = |n: usize| {
            u64::try_from(usage.bytes).unwrap_or(0).saturating_add(n as u64) > shares.idempotency_max_bytes_per_agent
        };
        let why = if response.len() > shares.idempotency_max_response_bytes {
            Some(format!("it is over --idempotency-max-response-bytes ({})", shares.idempotency_max_response_bytes))
        } else if over_budget(whole) {
            Some(format!(
                "agent {agent}'s records hold --idempotency-max-bytes-per-agent ({} bytes)",
                shares.idempotency_max_bytes_per_agent
            ))
        } else {
            None
        };
        let kept = match why {
            None => response,
            Some(why) => {
                self.fair.responses_digested.inc();
                let digest = ring::digest::digest(&ring::digest::SHA256, &response);
                let e = AqError::client(
                    code::IDEMPOTENCY_NOT_KEPT,
                    format!(
                        "the request with this Idempotency-Key was performed, and is not performed again; its \
                         response ({} bytes, SHA-256 {}) was not kept to be answered again: {why}",
                        response.len(),
                        crate::payload::hex_upper(digest.as_ref())
                    ),
                );
                crate::idap::write_response(&Envelope { headers: Vec::new(), body: Response::Fault(e.to_fault()) })
                    .into_bytes()
            }
        };
        usage.records += 1;
        usage.bytes = usage.bytes.saturating_add(i64::try_from(key.len() + kept.len()).unwrap_or(i64::MAX));
        Ok(kept)
    }

    /// A request with an Idempotency-Key that is not recorded (a read that changes nothing).
    pub(super) fn unrecorded(&self) {
        self.fair.reads_unrecorded.inc();
    }
}

/// 18 (ORA-00018, maximum number of sessions exceeded) for a request that would leave a
/// session open past `which` limit.
fn too_many_sessions(which: String) -> AqError {
    AqError::server(
        code::SESSION_LIMIT,
        format!(
            "maximum number of sessions exceeded: {which}; nothing of this request was performed. A request that \
             ends its transaction (with AQXmlCommit or AQXmlRollback) opens no session and is still served; end \
             or let time out an open session, then send this one again"
        ),
    )
}
