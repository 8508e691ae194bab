//! The statements PostgreSQL transactions build: sealed inserts and publishes (the session
//! row written in the same statement), head takes, inserts.

use super::*;

/// A session commit's enqueues: clears the tags of transaction `$1` on its outbox rows and
/// messages, signals each queue that got messages on channel `$2` where somebody holds
/// interest (`interest::uninterested`; its try-locks are held until the commit that
/// follows), and returns (queue, messages) per queue, in queue order. (`s` is a plain
/// SELECT, which PostgreSQL runs only where it is referenced: hence the condition.)
pub(super) const PUBLISH_SQL: &str = concat!(
    "WITH o AS (UPDATE notify_outbox SET txn = NULL WHERE txn = $1),
          m AS (UPDATE messages SET enq_txn = NULL WHERE enq_txn = $1 RETURNING queue_id),
          c AS (SELECT queue_id AS q, count(*) AS n FROM m GROUP BY queue_id),
          s AS (SELECT pg_notify($2, ",
    notify_payload!(),
    ") FROM c WHERE NOT ",
    super::interest::uninterested!(),
    ")
     SELECT q, n FROM c WHERE (SELECT count(*) FROM s) >= 0 ORDER BY q"
);

/// The session write as CTEs `sw` (inserts a new row: `new`) and `su` (updates from the
/// previous version), one of them a no-op, parameters `$K` to `$K+8` as bound by
/// [`bind_session`]. `(SELECT count(*) FROM sw) + (SELECT count(*) FROM su)` is 1 when the
/// row was written.
///
/// `epoch` is the server run (`pg_postmaster_start_time()`) of the row's last write. A
/// provisional write can be lost only by a crash of the server, and then every write after
/// the last surviving one is lost with it: so a row whose `epoch` is not the current run
/// may have lost writes of its open transaction, and a write that finds it so sets `doubt`,
/// which stays until the transaction ends. Such a session is not `intact`: its commit is
/// refused (25402). A session merely untouched across a restart is refused the same way.
/// `last_used` never goes back (a long poll's touch may have moved it ahead).
pub(super) fn session_ctes(k: usize, new: bool) -> String {
    let p = |i: usize| format!("${}", k + i);
    let (id, agent, txn, pending, dequeued, enqueued, positions, last_used, version) =
        (p(0), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8));
    if new {
        format!(
            "sw AS (INSERT INTO sessions (id_hash, agent, txn, pending, dequeued, enqueued, positions, last_used, version, epoch, doubt)
                    VALUES ({id}::bytea, {agent}::text, {txn}::text, {pending}::boolean, {dequeued}::boolean, {enqueued}::int8,
                            {positions}::text, {last_used}::int8, {version}::int8, pg_postmaster_start_time(), false)
                    ON CONFLICT (id_hash) DO NOTHING RETURNING 1),
             su AS (SELECT 1 WHERE false)"
        )
    } else {
        format!(
            "sw AS (SELECT 1 WHERE false),
             su AS (UPDATE sessions SET agent = {agent}::text, txn = {txn}::text, pending = {pending}::boolean,
                           dequeued = {dequeued}::boolean, enqueued = {enqueued}::int8, positions = {positions}::text,
                           last_used = greatest(last_used, {last_used}::int8), version = {version}::int8,
                           epoch = pg_postmaster_start_time(),
                           doubt = CASE WHEN txn <> {txn}::text THEN false
                                        ELSE doubt OR epoch <> pg_postmaster_start_time() END
                    WHERE id_hash = {id}::bytea AND version = {version}::int8 - 1 RETURNING 1)"
        )
    }
}

/// Index of a statement variant for a session row (new row or update).
pub(super) fn variant(row: &SessionRow) -> usize {
    usize::from(row.version == 1)
}

pub(super) fn bind_session<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    row: &'q SessionRow,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    q.bind(&row.id_hash)
        .bind(&row.agent)
        .bind(&row.txn)
        .bind(row.pending)
        .bind(row.dequeued)
        .bind(row.enqueued)
        .bind(&row.positions)
        .bind(row.last_used)
        .bind(row.version)
}

/// `PUBLISH_SQL` with the session write folded in (its parameters from `$3`); one row
/// per queue as there, plus `sealed`; a single row with `q` NULL when nothing was
/// published.
pub(super) static PUBLISH_SEALED_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!(
            "WITH o AS (UPDATE notify_outbox SET txn = NULL WHERE txn = $1),
              m AS (UPDATE messages SET enq_txn = NULL WHERE enq_txn = $1 RETURNING queue_id),
              c AS (SELECT queue_id AS q, count(*) AS n FROM m GROUP BY queue_id),
              s AS (SELECT pg_notify($2, {}) FROM c WHERE NOT {}),
              {},
              w AS (SELECT (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed)
         SELECT c.q, c.n, w.sealed FROM w LEFT JOIN c ON true WHERE (SELECT count(*) FROM s) >= 0 ORDER BY c.q",
            notify_payload!(),
            super::interest::uninterested!(),
            session_ctes(3, new)
        )
    })
});

/// Takes up to `limit` heads of `q`'s queue for its consumer: claims them (rows other
/// consumers are claiming are skipped, not waited for), deletes them, and returns them —
/// one statement. Single-consumer queues only (a multi-consumer message stays until its
/// last consumer has it).
pub(super) fn take_heads(q: &CandidateQuery, limit: i64) -> QueryBuilder<'static, Postgres> {
    debug_assert!(q.consumer.is_empty(), "take_heads is for single-consumer queues");
    let mut b: QueryBuilder<Postgres> =
        QueryBuilder::new("WITH c AS (SELECT m.seq FROM messages m WHERE m.single AND m.queue_id = ");
    b.push_bind(q.queue);
    b.push(" AND m.enq_txn IS NULL AND m.lock_txn IS NULL");
    b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
    b.push(" AND (m.expire_at IS NULL OR m.expire_at > ").push_bind(q.now).push(")");
    if let Some(c) = &q.corrid {
        b.push(" AND m.corrid = ").push_bind(c.clone());
    }
    if let Some(id) = &q.msgid {
        b.push(" AND m.msgid = ").push_bind(id.to_vec());
    }
    crate::sql::push_stored(&mut b, q.stored);
    b.push(" ORDER BY m.prio_key, m.seq LIMIT ").push_bind(limit);
    b.push(
        " FOR UPDATE OF m SKIP LOCKED)
         DELETE FROM messages m USING c WHERE m.seq = c.seq
         RETURNING m.seq, m.msgid, m.queue_id, ''::text AS consumer, m.corrid, m.priority, m.prio_key, m.enq_time,
                   m.delay_until, m.expire_at, m.sender, m.enq_user_id, m.exception_queue, m.payload, m.retry_count, m.state",
    );
    b
}

/// One statement for a whole message_set: messages and (multi-consumer) their deliveries
/// from arrays, and the wake-up signal for the queues whose messages are visible at commit
/// and that some process holds interest in.
/// The arrays borrow from `msgs` (sqlx encodes them when bound): payloads are not copied
/// on their way into the statement.
/// The insert's CTEs (see `insert_query`): messages, deliveries, outbox rows.
macro_rules! insert_ctes {
    () => {
        "WITH m AS (
            INSERT INTO messages (msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, payload, enq_txn, single, prio_key, enq_user_id, state, enq_txn_id, orig_msgid, orig_queue_id, exc_reason)
            SELECT * FROM UNNEST($1::bytea[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::text[], $9::text[], $10::bytea[], $11::text[], $18::bool[], $19::int8[], $20::text[], $21::int8[], $22::text[], $23::bytea[], $24::int8[], $25::int8[])
            RETURNING seq, msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, exception_queue, enq_txn, single
         ), d AS (
            INSERT INTO deliveries (msg_seq, queue_id, consumer, prio_key)
            SELECT m.seq, c.queue_id, c.consumer, c.prio_key
            FROM m JOIN UNNEST($12::bytea[], $13::text[], $14::int8[], $15::int8[]) AS c(msgid, consumer, queue_id, prio_key) ON c.msgid = m.msgid
            RETURNING msg_seq, queue_id, consumer
         ), o AS (
            INSERT INTO notify_outbox (queue_id, consumer, agent, notify_url, msgid, corrid, priority, enq_time,
                                       delay_until, expire_at, sender, exception_queue, txn, next_attempt_at)
            SELECT m.queue_id, d.consumer, r.agent, r.notify_url, m.msgid, m.corrid, m.priority, m.enq_time,
                   m.delay_until, m.expire_at, m.sender, m.exception_queue, m.enq_txn, COALESCE(m.delay_until, m.enq_time)
            FROM (SELECT msg_seq, queue_id, consumer FROM d UNION ALL SELECT seq, queue_id, '' FROM m WHERE single) d
            JOIN m ON m.seq = d.msg_seq
            JOIN registrations r ON r.queue_id = d.queue_id AND r.consumer = d.consumer
            WHERE EXISTS (SELECT 1 FROM registrations WHERE queue_id = ANY($2::int8[]))
         )"
    };
}

/// The insert with a session row written in the same statement (parameters from `$26`):
/// one row, `sealed` 1 when the row was written.
pub(super) static INSERT_SEALED_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!(
            "{}, nt AS MATERIALIZED (SELECT pg_notify($16, {}) FROM UNNEST($17::int8[]) AS q WHERE NOT {}),
         {}
         SELECT (SELECT count(*) FROM nt) AS notified, (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed",
            insert_ctes!(),
            notify_payload!(),
            super::interest::uninterested!(),
            session_ctes(26, new)
        )
    })
});

/// A session row written alone (parameters from `$1`), before a commit.
pub(super) static SESSION_ALONE_SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    [false, true].map(|new| {
        format!("WITH {} SELECT (SELECT count(*) FROM sw) + (SELECT count(*) FROM su) AS sealed", session_ctes(1, new))
    })
});

pub(super) fn insert_query<'a>(
    msgs: &[&'a NewMessage],
    session: Option<&'a SessionRow>,
) -> sqlx::query::Query<'a, Postgres, sqlx::postgres::PgArguments> {
    let mut visible: Vec<QueueId> = msgs.iter().filter(|m| m.enq_txn.is_none()).map(|m| m.queue).collect();
    visible.sort_unstable();
    visible.dedup();
    let n = msgs.len();
    let mut ids = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut corrids = Vec::with_capacity(n);
    let mut prios = Vec::with_capacity(n);
    let mut enq = Vec::with_capacity(n);
    let mut delays = Vec::with_capacity(n);
    let mut expires = Vec::with_capacity(n);
    let mut senders = Vec::with_capacity(n);
    let mut enq_users = Vec::with_capacity(n);
    let mut excq = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut txns = Vec::with_capacity(n);
    let mut singles = Vec::with_capacity(n);
    let mut prio_keys = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    let (mut enq_txn_ids, mut orig_ids, mut orig_queues, mut reasons) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut d_ids, mut d_consumers, mut d_queues, mut d_prios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for m in msgs {
        ids.push(&m.msgid[..]);
        queues.push(m.queue);
        corrids.push(m.corrid.as_deref());
        prios.push(m.priority);
        enq.push(m.enq_time);
        delays.push(m.delay_until);
        expires.push(m.expire_at);
        senders.push(m.sender.as_deref());
        enq_users.push(m.enq_user_id.as_deref());
        excq.push(m.exception_queue.as_deref());
        payloads.push(&m.payload[..]);
        txns.push(m.enq_txn.as_deref());
        // A single-consumer message (its one consumer is "") carries its delivery itself.
        let single = m.consumers.len() == 1 && m.consumers[0].is_empty();
        singles.push(single);
        prio_keys.push(m.prio_key);
        states.push(if m.spilled { i64::from(SPILLED) } else { 0 });
        enq_txn_ids.push(m.enq_txn_id.as_deref());
        orig_ids.push(m.origin.as_ref().map(|o| &o.msgid[..]));
        orig_queues.push(m.origin.map(|o| o.queue));
        reasons.push(m.origin.and_then(|o| o.why).map(|w| w.code()));
        if single {
            continue;
        }
        for c in &m.consumers {
            d_ids.push(&m.msgid[..]);
            d_consumers.push(c.as_str());
            d_queues.push(m.queue);
            d_prios.push(m.prio_key);
        }
    }
    let sql: &'static str = match session {
        None => concat!(
            insert_ctes!(),
            "\n         SELECT pg_notify($16, ",
            notify_payload!(),
            ") FROM UNNEST($17::int8[]) AS q WHERE NOT ",
            super::interest::uninterested!()
        ),
        Some(row) => INSERT_SEALED_SQL[variant(row)].as_str(),
    };
    let q = sqlx::query(sql)
        .bind(ids)
        .bind(queues)
        .bind(corrids)
        .bind(prios)
        .bind(enq)
        .bind(delays)
        .bind(expires)
        .bind(senders)
        .bind(excq)
        .bind(payloads)
        .bind(txns)
        .bind(d_ids)
        .bind(d_consumers)
        .bind(d_queues)
        .bind(d_prios)
        .bind(CHANNEL)
        .bind(visible)
        .bind(singles)
        .bind(prio_keys)
        .bind(enq_users)
        .bind(states)
        .bind(enq_txn_ids)
        .bind(orig_ids)
        .bind(orig_queues)
        .bind(reasons);
    match session {
        None => q,
        Some(row) => bind_session(q, row),
    }
}
