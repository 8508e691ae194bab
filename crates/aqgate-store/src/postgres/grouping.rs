//! Message grouping on PostgreSQL: the groups of a queue in order of their first message,
//! one group's candidates, and claiming a group.
//!
//! Processes claim a group (queue, consumer, group) with a transaction-level advisory lock
//! (the one-`bigint` key space, apart from the two-`int4` keys of the time manager and of
//! interest) and only then check, in a statement of its own (a snapshot taken after the
//! lock), that no other transaction holds a delivery of it. Every lock or remove of a
//! grouped delivery happens under its group's claim, and a claimer's locks are committed
//! before its advisory lock is released, so two consumers never both take one group.

use super::*;

/// A message's group: its `grp`, or `-seq` for a message without one.
const GROUP_OF: &str = "COALESCE(m.grp, -m.seq)";

/// The delivery state's alias (`m` itself for a single-consumer message), and the FROM
/// clause and conditions of `StoreTx::candidates` (all but the position).
fn push_from_filter(b: &mut QueryBuilder<'_, Postgres>, q: &CandidateQuery) {
    let single = q.consumer.is_empty();
    let d = if single { "m" } else { "d" };
    if single {
        b.push(" FROM messages m WHERE m.single AND m.queue_id = ").push_bind(q.queue);
    } else {
        b.push(" FROM deliveries d JOIN messages m ON m.seq = d.msg_seq WHERE d.queue_id = ").push_bind(q.queue);
        b.push(" AND d.consumer = ").push_bind(q.consumer.clone()).push(" AND NOT d.gave_up");
    }
    b.push(" AND (m.enq_txn IS NULL OR m.enq_txn = ").push_bind(q.txn.clone()).push(")");
    if !q.include_waiting {
        b.push(" AND (m.delay_until IS NULL OR m.delay_until <= ").push_bind(q.now).push(")");
    }
    b.push(" AND (m.expire_at IS NULL OR m.expire_at > ").push_bind(q.now).push(")");
    if let Some(c) = &q.corrid {
        b.push(" AND m.corrid = ").push_bind(c.clone());
    }
    if let Some(id) = &q.msgid {
        b.push(" AND m.msgid = ").push_bind(id.to_vec());
    }
    crate::sql::push_stored(b, q.stored);
    if q.include_locked {
        b.push(format!(" AND ({d}.lock_txn IS NULL OR {d}.lock_kind <> 1 OR {d}.lock_txn <> "))
            .push_bind(q.txn.clone())
            .push(")");
    } else {
        b.push(format!(" AND ({d}.lock_txn IS NULL OR ({d}.lock_kind = 2 AND {d}.lock_txn = "))
            .push_bind(q.txn.clone())
            .push("))");
    }
}

/// `EXISTS` a delivery of group `g` (an SQL expression) of `queue` for `consumer` that
/// another transaction than `txn` holds.
fn push_held(b: &mut QueryBuilder<'_, Postgres>, queue: QueueId, consumer: &str, g: &str, txn: &str) {
    if consumer.is_empty() {
        b.push("EXISTS (SELECT 1 FROM messages h WHERE h.single AND h.queue_id = ").push_bind(queue);
    } else {
        b.push("EXISTS (SELECT 1 FROM deliveries h JOIN messages hm ON hm.seq = h.msg_seq WHERE h.queue_id = ")
            .push_bind(queue)
            .push(" AND hm.queue_id = h.queue_id AND h.consumer = ")
            .push_bind(consumer.to_string());
    }
    let m = if consumer.is_empty() { "h" } else { "hm" };
    b.push(format!(" AND ({m}.grp = {g} OR {m}.seq = -{g})"))
        .push(" AND h.lock_txn IS NOT NULL AND h.lock_txn <> ")
        .push_bind(txn.to_string())
        .push(")");
}

pub(super) async fn groups(
    tx: &mut Transaction<'static, Postgres>,
    q: &CandidateQuery,
    after: Option<Position>,
    except: Option<i64>,
) -> Result<Vec<(i64, Position)>> {
    let mut b: QueryBuilder<Postgres> = QueryBuilder::new("SELECT g, prio_key, seq FROM (SELECT DISTINCT ON (g) ");
    let d = if q.consumer.is_empty() { "m" } else { "d" };
    let seq = if d == "m" { "m.seq" } else { "d.msg_seq" };
    b.push(format!("{GROUP_OF} AS g, {d}.prio_key, {seq} AS seq"));
    push_from_filter(&mut b, q);
    b.push(format!(" ORDER BY g, {d}.prio_key, {seq}) x WHERE true"));
    if let Some(p) = after {
        b.push(" AND (prio_key, seq) > (").push_bind(p.prio_key).push(", ").push_bind(p.seq).push(")");
    }
    if let Some(g) = except {
        b.push(" AND g <> ").push_bind(g);
    }
    if !q.include_locked {
        b.push(" AND NOT ");
        push_held(&mut b, q.queue, &q.consumer, "x.g", &q.txn);
    }
    b.push(" ORDER BY prio_key, seq LIMIT ").push_bind(q.limit);
    let rows = b.build().fetch_all(&mut **tx).await.db()?;
    rows.iter()
        .map(|r| {
            let p = Position { prio_key: r.try_get("prio_key").db()?, seq: r.try_get("seq").db()? };
            Ok((r.try_get("g").db()?, p))
        })
        .collect()
}

pub(super) async fn group_candidates(
    tx: &mut Transaction<'static, Postgres>,
    q: &CandidateQuery,
    group: i64,
) -> Result<Vec<StoredMessage>> {
    let single = q.consumer.is_empty();
    let (d, d_seq) = if single { ("m", "m.seq") } else { ("d", "d.msg_seq") };
    let mut b: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT m.seq, m.msgid, m.queue_id, {consumer}, m.corrid, m.priority, {d}.prio_key, m.enq_time, m.delay_until,
                m.expire_at, m.sender, m.enq_user_id, m.exception_queue, m.payload, {d}.retry_count, m.state",
        consumer = if single { "''::text AS consumer" } else { "d.consumer" },
    ));
    push_from_filter(&mut b, q);
    if group < 0 {
        b.push(" AND m.seq = ").push_bind(-group).push(" AND m.grp IS NULL");
    } else {
        b.push(" AND m.grp = ").push_bind(group);
    }
    if let Some(p) = q.after {
        b.push(format!(" AND ({d}.prio_key, {d_seq}) > (")).push_bind(p.prio_key).push(", ").push_bind(p.seq).push(")");
    }
    b.push(format!(" ORDER BY {d}.prio_key, {d_seq} LIMIT ")).push_bind(q.limit);
    let rows = b.build().fetch_all(&mut **tx).await.db()?;
    rows.iter().map(stored_from_row).collect()
}

/// The advisory lock key of (queue, consumer, group): FNV-1a, 64 bits. Two groups that
/// share a key only wait for each other's claims (one is skipped for the moment).
fn claim_key(queue: QueueId, consumer: &str, group: i64) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = b"aqgate-group"
        .iter()
        .copied()
        .chain(queue.to_le_bytes())
        .chain(consumer.bytes())
        .chain([0u8])
        .chain(group.to_le_bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

pub(super) async fn claim_group(
    tx: &mut Transaction<'static, Postgres>,
    queue: QueueId,
    consumer: &str,
    group: i64,
    txn: &str,
    wait: bool,
) -> Result<bool> {
    let key = claim_key(queue, consumer, group);
    if wait {
        // Only another session looking at the group holds it now (its holder is this
        // session): wait for that look to end.
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(key).execute(&mut **tx).await.db()?;
    } else {
        let got: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)").bind(key).fetch_one(&mut **tx).await.db()?;
        if !got {
            return Ok(false);
        }
    }
    // A statement of its own: its snapshot is taken after the lock, so it sees the locks
    // of every claimer before (committed when their advisory locks went).
    let held: bool = if consumer.is_empty() {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages h WHERE h.single AND h.queue_id = $1
                             AND (h.grp = $3 OR h.seq = -$3) AND h.lock_txn IS NOT NULL AND h.lock_txn <> $2)",
        )
        .bind(queue)
        .bind(txn)
        .bind(group)
        .fetch_one(&mut **tx)
        .await
        .db()?
    } else {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM deliveries h JOIN messages hm ON hm.seq = h.msg_seq
                             WHERE h.queue_id = $1 AND hm.queue_id = h.queue_id AND h.consumer = $4
                               AND (hm.grp = $3 OR hm.seq = -$3) AND h.lock_txn IS NOT NULL AND h.lock_txn <> $2)",
        )
        .bind(queue)
        .bind(txn)
        .bind(group)
        .bind(consumer)
        .fetch_one(&mut **tx)
        .await
        .db()?
    };
    Ok(!held)
}
