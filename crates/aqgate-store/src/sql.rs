//! The SQL statements both stores run as they are (SQLite and PostgreSQL read `$N` parameters
//! alike). Statements written for one dialect stay in its backend.

use aqgate_core::store::{SPILLED, Stored};

pub(crate) const RECOVER_UNLOCK_ORPHANED: &str = "UPDATE deliveries SET lock_txn = NULL, lock_kind = NULL
              WHERE lock_txn IS NOT NULL AND lock_txn NOT IN (SELECT txn FROM sessions)";
pub(crate) const RECOVER_DROP_ORPHANED_NOTIFICATIONS: &str =
    "DELETE FROM notify_outbox WHERE txn IS NOT NULL AND txn NOT IN (SELECT txn FROM sessions)";
pub(crate) const SESSION_COUNT: &str = "SELECT count(*) FROM sessions";
pub(crate) const PURGE_TOMBSTONES: &str = "DELETE FROM session_tombstones WHERE until <= $1";
pub(crate) const PURGE_SAML_REPLAY: &str = "DELETE FROM saml_replay WHERE until <= $1";
pub(crate) const SAML_ASSERTION_ONCE: &str =
    "INSERT INTO saml_replay (issuer, assertion_id, until) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
pub(crate) const PURGE_IDEMPOTENCY: &str = "DELETE FROM idempotency WHERE created_at < $1";
pub(crate) const IDEMPOTENCY_USAGE: &str =
    "SELECT count(*), coalesce(sum(length(key) + length(response)), 0) FROM idempotency WHERE agent = $1";
pub(crate) const SESSIONS_OF: &str = "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE agent = $1 LIMIT $2) s";
pub(crate) const IDEMPOTENCY_GET: &str = "SELECT * FROM idempotency WHERE agent = $1 AND key = $2";
pub(crate) const TOPOLOGY_LOAD: &str = "SELECT kind, name, spec FROM topology ORDER BY kind, name";
pub(crate) const QUEUE_IDS: &str = "SELECT name, id FROM queues";
pub(crate) const QUEUE_DEPTHS: &str =
    "SELECT queue_id, COUNT(*) AS n FROM messages WHERE enq_txn IS NULL GROUP BY queue_id";
/// Per queue: READY, WAIT and EXPIRED as the `AQ$` views tell them at `$1`, the oldest
/// READY enqueue time, the highest seq and the messages above seq `$2`.
pub(crate) const QUEUE_FIGURES: &str = "SELECT queue_id,
        SUM(CASE WHEN state = 3 OR expire_at <= $1 THEN 0 WHEN delay_until > $1 THEN 0 ELSE 1 END) AS ready,
        SUM(CASE WHEN state = 3 OR expire_at <= $1 THEN 0 WHEN delay_until > $1 THEN 1 ELSE 0 END) AS waiting,
        SUM(CASE WHEN state = 3 OR expire_at <= $1 THEN 1 ELSE 0 END) AS expired,
        MIN(CASE WHEN state = 3 OR expire_at <= $1 THEN NULL WHEN delay_until > $1 THEN NULL ELSE enq_time END)
            AS oldest_ready,
        MAX(seq) AS last_seq,
        SUM(CASE WHEN seq > $2 THEN 1 ELSE 0 END) AS newer
     FROM messages WHERE enq_txn IS NULL GROUP BY queue_id";
pub(crate) const SPOOL_BACKLOG: &str =
    "SELECT COUNT(*) AS n FROM mail_spool WHERE state <> 'done' OR replies_sent < replies_wanted";
pub(crate) const NEXT_DELAY_END: &str =
    "SELECT MIN(delay_until) AS t FROM messages WHERE queue_id = $1 AND delay_until > $2";
pub(crate) const REGISTRATIONS_OF_QUEUE: &str =
    "SELECT queue_id, consumer, notify_url, agent FROM registrations WHERE queue_id = $1 ORDER BY consumer, agent";
pub(crate) const REGISTRATIONS_ALL: &str =
    "SELECT queue_id, consumer, notify_url, agent FROM registrations ORDER BY queue_id, consumer, agent";
pub(crate) const REGISTRATION_SET_SECRET: &str =
    "UPDATE registrations SET secret = $4 WHERE queue_id = $1 AND consumer = $2 AND agent = $3";
pub(crate) const NOTIFY_NEXT_DUE: &str =
    "SELECT MIN(next_attempt_at) FROM notify_outbox WHERE state = 'new' AND txn IS NULL";
pub(crate) const NOTIFY_UNPARK: &str =
    "UPDATE notify_outbox SET state = 'new', attempts = 0, next_attempt_at = $1 WHERE state = 'parked'";
pub(crate) const SPOOL_DUE: &str = "SELECT * FROM mail_spool WHERE (state = 'new' OR replies_sent < replies_wanted)
               AND next_attempt_at <= $1 ORDER BY next_attempt_at, id LIMIT $2";
pub(crate) const SPOOL_PURGE: &str =
    "DELETE FROM mail_spool WHERE received_at < $1 AND state <> 'new' AND replies_sent >= replies_wanted";
pub(crate) const SPOOL_PENDING: &str =
    "SELECT * FROM mail_spool WHERE state <> 'done' OR replies_sent < replies_wanted ORDER BY id LIMIT $1";
pub(crate) const SPOOL_GET: &str = "SELECT * FROM mail_spool WHERE id = $1";
pub(crate) const IDEMPOTENCY_PUT: &str = "INSERT INTO idempotency (agent, key, request_hash, response, created_at)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (agent, key) DO NOTHING";
pub(crate) const DELIVERY_LOCK: &str = "UPDATE deliveries SET lock_txn = $1, lock_kind = $2
             WHERE msg_seq = $3 AND consumer = $4 AND NOT gave_up AND (lock_txn IS NULL OR (lock_txn = $1 AND lock_kind = 2))";
pub(crate) const DELIVERIES_UNLOCK_TXN: &str =
    "UPDATE deliveries SET lock_txn = NULL, lock_kind = NULL WHERE lock_txn = $1";
pub(crate) const NOTIFY_DROP_TXN: &str = "DELETE FROM notify_outbox WHERE txn = $1";
pub(crate) const MESSAGE_DELAY: &str =
    "UPDATE messages SET delay_until = CASE WHEN delay_until > $2 THEN delay_until ELSE $2 END WHERE seq = $1";
pub(crate) const DELIVERIES_DROP_MESSAGE: &str = "DELETE FROM deliveries WHERE msg_seq = $1";
pub(crate) const REGISTRATION_UPSERT: &str =
    "INSERT INTO registrations (queue_id, consumer, notify_url, agent) VALUES ($1, $2, $3, $4)
             ON CONFLICT (queue_id, consumer, agent) DO UPDATE SET notify_url = excluded.notify_url";
pub(crate) const REGISTRATION_DELETE: &str =
    "DELETE FROM registrations WHERE queue_id = $1 AND consumer = $2 AND agent = $3";
pub(crate) const NOTIFY_DROP_REGISTRATION: &str =
    "DELETE FROM notify_outbox WHERE queue_id = $1 AND consumer = $2 AND agent = $3";
pub(crate) const TOPOLOGY_PUT: &str = "INSERT INTO topology (kind, name, spec) VALUES ($1, $2, $3) ON CONFLICT (kind, name) DO UPDATE SET spec = excluded.spec";
pub(crate) const TOPOLOGY_DELETE: &str = "DELETE FROM topology WHERE kind = $1 AND name = $2";
pub(crate) const QUEUE_ENSURE: &str = "INSERT INTO queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING";
pub(crate) const QUEUE_ID: &str = "SELECT id FROM queues WHERE name = $1";
pub(crate) const SPOOL_PUT: &str = "INSERT INTO mail_spool (received_at, agent, message_id, reply_to, subject, idap, next_attempt_at, dedupe_key, state, replies_wanted, encrypt_to)
             VALUES ($1, $2, $3, $4, $5, $6, $1, $7, CASE WHEN $8 THEN 'held' ELSE 'new' END, CASE WHEN $8 THEN 0 ELSE 1 END, $9)
             ON CONFLICT (agent, dedupe_key) DO NOTHING RETURNING id";
pub(crate) const SPOOL_FIND: &str = "SELECT id, state FROM mail_spool WHERE agent = $1 AND dedupe_key = $2";
/// A re-sent copy (before it is released): its reply answers it; once a copy came
/// encrypted, replies are encrypted.
pub(crate) const SPOOL_RESENT: &str =
    "UPDATE mail_spool SET resend_message_id = CASE WHEN state = 'held' THEN resend_message_id ELSE $2 END,
                encrypt_to = COALESCE($3, encrypt_to)
         WHERE id = $1";
pub(crate) const SPOOL_WANT_REPLY: &str =
    "UPDATE mail_spool SET replies_wanted = replies_wanted + 1, next_attempt_at = $2,
                state = CASE WHEN state = 'held' THEN 'new' ELSE state END
         WHERE id = $1";
pub(crate) const SPOOL_ATTEMPTED: &str =
    "UPDATE mail_spool SET state = $2, attempts = attempts + 1, response = COALESCE($3, response),
               last_error = $4, next_attempt_at = COALESCE($5, next_attempt_at), claimed_by = NULL WHERE id = $1";
/// Takes the lease of a job that nobody holds (or whose lease ended), or renews one's own.
pub(crate) const JOB_LEASE: &str =
    "INSERT INTO propagation_jobs (name, owner, lease_until, state, updated_at) VALUES ($1, $2, $4, 'RUNNING', $3)
     ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until,
            updated_at = excluded.updated_at,
            state = CASE WHEN propagation_jobs.owner = excluded.owner THEN propagation_jobs.state ELSE 'RUNNING' END
     WHERE propagation_jobs.owner = excluded.owner OR propagation_jobs.owner IS NULL
        OR propagation_jobs.lease_until IS NULL OR propagation_jobs.lease_until <= $3";
/// Counts always add up (the work was done); the state and the lease only the holder
/// changes. The right-hand sides read the row as it was, so `owner = $2` is the old owner.
pub(crate) const JOB_REPORT: &str = "UPDATE propagation_jobs SET
        propagated = propagated + $5, failed = failed + $6, exceptions = exceptions + $7,
        last_error = COALESCE($8, last_error), last_error_at = COALESCE($9, last_error_at),
        last_success_at = COALESCE($10, last_success_at),
        state = CASE WHEN owner = $2 THEN $4 ELSE state END,
        lease_until = CASE WHEN owner = $2 THEN $11 ELSE lease_until END,
        owner = CASE WHEN owner = $2 AND $11 IS NULL THEN NULL ELSE owner END,
        updated_at = $3
     WHERE name = $1 RETURNING owner";
/// A committed batch's counts, in its transaction (the last statement before the commit:
/// the row's lock is held the shortest).
pub(crate) const JOB_TALLY: &str =
    "UPDATE propagation_jobs SET propagated = propagated + $2, exceptions = exceptions + $3 WHERE name = $1";
pub(crate) const JOB_FORGET: &str = "DELETE FROM propagation_jobs
     WHERE name = $1 AND (owner = $2 OR owner IS NULL OR lease_until IS NULL OR lease_until <= $3)";
pub(crate) const JOB_EXISTS: &str = "SELECT COUNT(*) FROM propagation_jobs WHERE name = $1";
pub(crate) const JOB_RESET: &str =
    "UPDATE propagation_jobs SET failed = 0, owner = NULL, lease_until = NULL WHERE name = $1";
pub(crate) const JOB_LEASES_CLEAR: &str = "UPDATE propagation_jobs SET owner = NULL, lease_until = NULL WHERE owner IS NOT NULL AND ($1 IS NULL OR owner = $1)";
pub(crate) const JOB_STATUSES: &str = "SELECT * FROM propagation_jobs ORDER BY name";
pub(crate) const GATEWAY_DOUBTS: &str =
    "SELECT message_id, since FROM gateway_doubt WHERE job = $1 ORDER BY since, message_id";
pub(crate) const GATEWAY_SEEN_PURGE: &str = "DELETE FROM gateway_seen WHERE at < $1";
pub(crate) const GATEWAY_DOUBT_DROP: &str = "DELETE FROM gateway_doubt WHERE job = $1";
pub(crate) const GATEWAY_SEEN_DROP: &str = "DELETE FROM gateway_seen WHERE job = $1";
pub(crate) const GATEWAY_LINK_PUT: &str = "INSERT INTO gateway_links \
     (name, owner, state, last_error, last_error_at, since, updated_at, connections) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (name, owner) DO UPDATE SET state = excluded.state, \
     last_error = excluded.last_error, last_error_at = excluded.last_error_at, since = excluded.since, \
     updated_at = excluded.updated_at, connections = excluded.connections";
pub(crate) const GATEWAY_LINKS: &str = "SELECT * FROM gateway_links ORDER BY name, owner";
pub(crate) const CONTROL_COUNTERS: &str = "SELECT topology, ping FROM control_plane WHERE id = 1";
pub(crate) const CONTROL_PING: &str = "UPDATE control_plane SET ping = ping + 1 WHERE id = 1 RETURNING ping";
pub(crate) const AGENT_PUT: &str = "INSERT INTO gateway_agents \
     (owner, host, pid, started_at, status, last_error, last_error_at, updated_at, alive_until) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (owner) DO UPDATE SET status = excluded.status, \
     last_error = excluded.last_error, last_error_at = excluded.last_error_at, updated_at = excluded.updated_at, \
     alive_until = excluded.alive_until";
pub(crate) const AGENT_PONG: &str = "UPDATE gateway_agents SET pong = $2 WHERE owner = $1 AND pong < $2";
pub(crate) const AGENTS: &str = "SELECT * FROM gateway_agents ORDER BY started_at, owner";
pub(crate) const AGENTS_PURGE_LINKS: &str =
    "DELETE FROM gateway_links WHERE owner IN (SELECT owner FROM gateway_agents WHERE updated_at < $1)";
pub(crate) const AGENTS_PURGE: &str = "DELETE FROM gateway_agents WHERE updated_at < $1";

/// The condition on `m.state` that keeps a dequeue to the stored messages it may take:
/// persistent ones, spilled buffered ones ([`SPILLED`]), or both.
pub(crate) fn push_stored<DB: sqlx::Database>(b: &mut sqlx::QueryBuilder<'_, DB>, stored: Stored) {
    match stored {
        Stored::Persistent => b.push(format!(" AND m.state <> {SPILLED}")),
        Stored::Spilled => b.push(format!(" AND m.state = {SPILLED}")),
        Stored::Either => b,
    };
}

pub(crate) const HISTORY_FORGET_TXN: &str = "DELETE FROM dequeue_history WHERE txn = $1";
pub(crate) const PROCESSED_PURGE: &str = "DELETE FROM processed_messages WHERE seq IN
        (SELECT seq FROM processed_messages WHERE retain_until <= $1 ORDER BY retain_until LIMIT $2)";
/// The dequeue history of messages that are neither in a queue nor kept any more.
pub(crate) const HISTORY_PURGE_ORPHANS: &str = "DELETE FROM dequeue_history WHERE msg_seq IN
        (SELECT h.msg_seq FROM dequeue_history h
          WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.seq = h.msg_seq)
            AND NOT EXISTS (SELECT 1 FROM processed_messages p WHERE p.seq = h.msg_seq)
          LIMIT $1)";

/// One statement recording `rows` in the dequeue history, each replacing an earlier row of
/// its message and consumer.
pub(crate) fn record_dequeues<DB: sqlx::Database>(
    rows: &[aqgate_core::store::DequeueRecord],
) -> sqlx::QueryBuilder<'_, DB>
where
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let mut b = sqlx::QueryBuilder::new(
        "INSERT INTO dequeue_history (msg_seq, consumer, deq_time, deq_user_id, txn, retry_count) ",
    );
    b.push_values(rows, |mut v, r| {
        v.push_bind(r.seq)
            .push_bind(r.consumer.clone())
            .push_bind(r.deq_time)
            .push_bind(r.deq_user_id.clone())
            .push_bind(r.txn.clone())
            .push_bind(r.retry_count);
    });
    b.push(
        " ON CONFLICT (msg_seq, consumer) DO UPDATE SET deq_time = excluded.deq_time,
            deq_user_id = excluded.deq_user_id, txn = excluded.txn, retry_count = excluded.retry_count",
    );
    b
}

/// Rows of buffered messages in one statement each (the views' copy, see
/// `Store::show_buffered`): one row per consumer, at most `ROWS_PER_STATEMENT` a statement,
/// marked with the database's time `now` (SQL).
pub(crate) fn show_buffered<'a, DB: sqlx::Database>(
    node: &'a str,
    rows: &'a [aqgate_core::store::NewMessage],
    now: &'static str,
) -> Vec<sqlx::QueryBuilder<'a, DB>>
where
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<Vec<u8>>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// 18 parameters a row: within SQLite's bound-parameter limit.
    const ROWS_PER_STATEMENT: usize = 500;
    let all: Vec<(&aqgate_core::store::NewMessage, &String)> =
        rows.iter().flat_map(|m| m.consumers.iter().map(move |c| (m, c))).collect();
    all.chunks(ROWS_PER_STATEMENT)
        .map(|part| {
            let mut b = sqlx::QueryBuilder::new(
                "INSERT INTO buffered_messages (node, queue_id, msgid, consumer, corrid, priority, enq_time, \
                 delay_until, expire_at, sender, enq_user_id, exception_queue, payload, enq_txn_id, orig_msgid, \
                 orig_queue_id, exc_reason, seen_at) ",
            );
            b.push_values(part.iter().copied(), |mut v, (m, c)| {
                v.push_bind(node.to_string())
                    .push_bind(m.queue)
                    .push_bind(m.msgid.to_vec())
                    .push_bind(c.clone())
                    .push_bind(m.corrid.clone())
                    .push_bind(m.priority)
                    .push_bind(m.enq_time)
                    .push_bind(m.delay_until)
                    .push_bind(m.expire_at)
                    .push_bind(m.sender.clone())
                    .push_bind(m.enq_user_id.clone())
                    .push_bind(m.exception_queue.clone())
                    .push_bind((!m.payload.is_empty()).then(|| m.payload.clone()))
                    .push_bind(m.enq_txn_id.clone())
                    .push_bind(m.origin.map(|o| o.msgid.to_vec()))
                    .push_bind(m.origin.map(|o| o.queue))
                    .push_bind(m.origin.and_then(|o| o.why).map(|w| w.code()))
                    .push(now);
            });
            b
        })
        .collect()
}
