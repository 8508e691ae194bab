//! Sessions and idempotency records as the store keeps them: the rows, and `SessionStore`,
//! what a request reads of them outside its transaction (the SAML replay cache beside).

use async_trait::async_trait;

use super::Result;
use crate::clock::Micros;

/// A session as the store keeps it (see `engine::session`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// SHA-256 of the session id.
    pub id_hash: Vec<u8>,
    pub agent: String,
    pub txn: String,
    pub pending: bool,
    pub dequeued: bool,
    pub enqueued: i64,
    /// Navigation positions, JSON.
    pub positions: String,
    pub last_used: Micros,
    /// 1 for a new row; every write adds one.
    pub version: i64,
    /// Read only: false when provisional writes of the open transaction may have been
    /// lost since (PostgreSQL restarted after one of them; see [`super::Store::begin_provisional`]).
    pub intact: bool,
}

/// What the store knows of a session id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionLookup {
    Live(SessionRow),
    /// Timed out (rolled back if `had_work`); remembered until its tombstone's time is up.
    Ended {
        agent: String,
        had_work: bool,
    },
    Unknown,
}

/// A request performed under an idempotency key, with its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub agent: String,
    pub key: String,
    /// SHA-256 of the request.
    pub request_hash: Vec<u8>,
    /// The response exactly as it was answered.
    pub response: Vec<u8>,
    pub created_at: Micros,
}

/// Sessions and idempotency records: what a request reads of them outside its transaction.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// The session whose id hashes to `id_hash`.
    async fn session_get(&self, id_hash: &[u8]) -> Result<SessionLookup>;

    /// Marks a session as in use until `until` (a long poll about to wait), so that no
    /// process takes it for idle meanwhile. Does not change its version.
    async fn session_touch(&self, id_hash: &[u8], until: Micros) -> Result<()>;

    /// Sessions last used before `before`, oldest first.
    async fn sessions_idle(&self, before: Micros, limit: i64) -> Result<Vec<SessionRow>>;

    /// How many sessions the store holds.
    async fn session_count(&self) -> Result<i64>;

    /// Forgets tombstones and used SAML assertion ids whose time is up at `now`, and
    /// idempotency records created before `records_before`. Returns how many rows went.
    async fn sessions_purge(&self, now: Micros, records_before: Micros) -> Result<u64>;

    /// The request recorded under (`agent`, `key`).
    async fn idempotency_get(&self, agent: &str, key: &str) -> Result<Option<IdempotencyRecord>>;

    /// The idempotency records the store keeps for `agent`: how many, and their bytes (key
    /// and response).
    async fn idempotency_usage(&self, agent: &str) -> Result<(i64, i64)>;

    /// Records that the SAML assertion `id` of `issuer` was used, remembered until `until`
    /// (its end of validity plus the clock skew; [`SessionStore::sessions_purge`] forgets it
    /// then). `true` the first time, `false` when it was recorded before (a replay), by any
    /// process sharing the store.
    async fn saml_assertion_once(&self, issuer: &str, id: &str, until: Micros) -> Result<bool>;
}
