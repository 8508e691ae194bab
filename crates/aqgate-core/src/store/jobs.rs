//! Propagation jobs' rows in the store: their leases and what they did.

use async_trait::async_trait;

use super::{QueueId, Result};
use crate::clock::Micros;

/// A propagation job's row: who runs it (its lease) and what it did, for every process
/// sharing the store (`admin jobs`, `/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub name: String,
    /// The process holding the lease (`host:pid:random`), if any.
    pub owner: Option<String>,
    /// When the lease ends unless renewed (the holder's engine clock).
    pub lease_until: Option<Micros>,
    /// What the holder last said it is doing: `RUNNING`, `RETRYING`, `FAILED`,
    /// `DELETE_PENDING` (meaningful while the lease lasts).
    pub state: String,
    /// Totals over every process that ran the job since the row was made.
    pub propagated: i64,
    pub failed: i64,
    pub exceptions: i64,
    pub last_error: Option<String>,
    pub last_error_at: Option<Micros>,
    pub last_success_at: Option<Micros>,
    /// When the row was last written.
    pub updated_at: Micros,
}

/// What a job's holder reports with a heartbeat: its state, and what it did since the last
/// report (added to the row's totals).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobReport {
    pub state: String,
    pub propagated: i64,
    pub failed: i64,
    pub exceptions: i64,
    /// The latest error since the last report, and when.
    pub error: Option<(String, Micros)>,
    /// The latest successful batch since the last report.
    pub success_at: Option<Micros>,
}

/// A Messaging Gateway link as one process sees it (`admin gateway`): each process that runs
/// a job on the link writes its own row when the state changes, and every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    pub name: String,
    /// The process (`host:pid:random`).
    pub owner: String,
    /// `CONNECTED`, `RECONNECTING` or `DISCONNECTED`.
    pub state: String,
    pub last_error: Option<String>,
    pub last_error_at: Option<Micros>,
    /// When the state last changed.
    pub since: Micros,
    /// When the row was last written.
    pub updated_at: Micros,
    /// The connections to the link's broker the process has open (shared by its jobs, see
    /// the link's `max_connections`; MQTT: one per job).
    pub connections: i64,
}

/// A process that runs propagation jobs (the Messaging Gateway's agent), as it last said
/// (`admin gateway`): written when its status changes and with its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStatus {
    /// The process (`host:pid:random`, as in leases and link rows).
    pub owner: String,
    pub host: String,
    pub pid: i64,
    pub started_at: Micros,
    /// `STARTING`, `RUNNING`, `SHUTTING_DOWN` or `NOT_STARTED` (shut down), as the process
    /// said; a reader tells a process whose `alive_until` passed as it sees fit.
    pub status: String,
    pub last_error: Option<String>,
    pub last_error_at: Option<Micros>,
    pub updated_at: Micros,
    /// When the process's word ends unless it writes again (its heartbeat).
    pub alive_until: Micros,
    /// The last ping (`JobStore::control_ping`) it answered; 0 for none.
    pub pong: i64,
}

/// Propagation jobs' leases and status: one row per job, shared by the processes of a store.
/// A process runs a job only while it holds the job's lease; times are the callers' (every
/// process's engine clock).
#[async_trait]
pub trait JobStore: Send + Sync {
    /// Takes or renews the lease of job `name` for `owner` until `until`: true if `owner`
    /// holds it now (it held it already, nobody did, or the holder's lease ended by `now`).
    /// Creates the row (state `RUNNING`, counts 0) when there is none.
    async fn job_lease(&self, name: &str, owner: &str, now: Micros, until: Micros) -> Result<bool>;

    /// Adds `report`'s counts and error to the row, and, if `owner` holds the lease, sets its
    /// state and moves the lease to `until` (`None`: gives the lease up). The row's owner
    /// afterwards (`None` also when there is no row): anything but `owner` means the lease
    /// is lost (or given up).
    async fn job_report(
        &self,
        name: &str,
        owner: &str,
        now: Micros,
        until: Option<Micros>,
        report: &JobReport,
    ) -> Result<Option<String>>;

    /// Deletes the row of job `name` if `owner` holds its lease or no lease lasts at `now`
    /// (a job gone from the topology). True if it went (or was not there).
    async fn job_forget(&self, name: &str, owner: &str, now: Micros) -> Result<bool>;

    /// RESET_JOB: the row of job `name` gets a failure count of 0 and no lease, so that its
    /// holder stops the job's workers at its next renewal and a process takes it afresh.
    /// False when there is no row.
    async fn job_reset(&self, name: &str) -> Result<bool>;

    /// Ends every lease (a process sole on its store, at start: any lease is a dead
    /// process's), or with `owner` only those it holds (a process known to be dead).
    async fn job_leases_clear(&self, owner: Option<&str>) -> Result<u64>;

    /// Every job's row, by name.
    async fn job_statuses(&self) -> Result<Vec<JobStatus>>;

    /// What waits for `consumer` (`""` on a single-consumer queue) in `queue` at `now`: the
    /// committed messages (delayed and in-flight ones too), and the earliest time at which
    /// one of those that can be taken now (not locked, not expired, and ready unless
    /// `waiting`) became ready: its enqueue, or without `waiting` the end of its delay.
    /// `waiting`: the consumer takes messages still in their delay (a propagation job that
    /// carries the delay on).
    async fn job_backlog(
        &self,
        queue: QueueId,
        consumer: &str,
        now: Micros,
        waiting: bool,
    ) -> Result<(i64, Option<Micros>)>;

    /// Records that gateway job `job` is about to publish `ids` (AQ message ids), committed
    /// before the publish: a row still there for a message still in the source says the
    /// broker may have it (in doubt).
    async fn gateway_doubt_put(&self, job: &str, ids: &[String], now: Micros) -> Result<()>;

    /// The job's in-doubt message ids, with the time each was first recorded.
    async fn gateway_doubts(&self, job: &str) -> Result<Vec<(String, Micros)>>;

    /// Which of `ids` (broker message ids) inbound job `job` has enqueued already.
    async fn gateway_seen(&self, job: &str, ids: &[String]) -> Result<Vec<String>>;

    /// Forgets the inbound marks recorded before `before`; how many went.
    async fn gateway_seen_purge(&self, before: Micros) -> Result<u64>;

    /// Forgets outbound job `job`'s doubts about messages no longer waiting for `consumer`
    /// (`""` on a single-consumer queue) in its source `queue`: expired into an exception
    /// queue, taken by another consumer, purged. Only a committed removal hides a message
    /// here (a batch in flight still shows it), and a message that went that way comes back
    /// only as a new message with a new id, so no doubt that still counts goes; how many went.
    async fn gateway_doubt_purge(&self, job: &str, queue: QueueId, consumer: &str) -> Result<u64>;

    /// Deletes what gateway job `job` (its agent) keeps in the store besides its status row:
    /// its doubts and its inbound marks (a job removed; a job of the same name later starts
    /// afresh). How many rows went.
    async fn gateway_job_drop(&self, job: &str) -> Result<u64>;

    /// Writes this process's row of a link.
    async fn gateway_link_put(&self, link: &LinkStatus) -> Result<()>;

    /// Every process's rows of every link, by name then owner.
    async fn gateway_links(&self) -> Result<Vec<LinkStatus>>;

    /// The control plane's counters: (topology, ping). The first goes up with every change
    /// of the stored topology (in the changing transaction), the second with every ping.
    async fn control_counters(&self) -> Result<(i64, i64)>;

    /// Asks the running agents to answer (`admin gateway --ping`): the ping's number.
    async fn control_ping(&self) -> Result<i64>;

    /// Writes this process's agent row (all but `pong`).
    async fn agent_put(&self, agent: &AgentStatus) -> Result<()>;

    /// Agent `owner` answers ping `ping` (never moving its answer back).
    async fn agent_pong(&self, owner: &str, ping: i64) -> Result<()>;

    /// Every agent row, by start time.
    async fn agents(&self) -> Result<Vec<AgentStatus>>;

    /// Forgets the agent rows last written before `before` (and their processes' link
    /// rows); how many agents went.
    async fn agents_purge(&self, before: Micros) -> Result<u64>;
}
