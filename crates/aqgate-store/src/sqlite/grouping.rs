//! Message grouping on SQLite: the groups of a queue in order of their first message, one
//! group's candidates, and claiming a group. SQLite has one writer (the pool's one
//! connection), so a claim is a check that no other transaction holds the group.

use super::*;

/// A message's group: its `grp`, or `-seq` for a message without one.
const GROUP_OF: &str = "COALESCE(m.grp, -m.seq)";

/// The conditions of `StoreTx::candidates` (all but the position) on `d` and `m`.
fn push_filter(b: &mut QueryBuilder<'_, Sqlite>, q: &CandidateQuery) {
    b.push(" WHERE d.queue_id = ").push_bind(q.queue).push(" AND d.consumer = ").push_bind(q.consumer.clone());
    b.push(" AND NOT d.gave_up");
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
        b.push(" AND (d.lock_txn IS NULL OR d.lock_kind <> 1 OR d.lock_txn <> ").push_bind(q.txn.clone()).push(")");
    } else {
        b.push(" AND (d.lock_txn IS NULL OR (d.lock_kind = 2 AND d.lock_txn = ").push_bind(q.txn.clone()).push("))");
    }
}

/// `EXISTS` a delivery of group `g` (an SQL expression) of `queue` for `consumer` that
/// another transaction than `txn` holds.
fn push_held(b: &mut QueryBuilder<'_, Sqlite>, queue: QueueId, consumer: &str, g: &str, txn: &str) {
    b.push("EXISTS (SELECT 1 FROM deliveries h JOIN messages hm ON hm.seq = h.msg_seq WHERE h.queue_id = ")
        .push_bind(queue)
        .push(" AND h.consumer = ")
        .push_bind(consumer.to_string())
        .push(format!(" AND hm.queue_id = h.queue_id AND (hm.grp = {g} OR hm.seq = -{g})"))
        .push(" AND h.lock_txn IS NOT NULL AND h.lock_txn <> ")
        .push_bind(txn.to_string())
        .push(")");
}

pub(super) async fn groups(
    tx: &mut Transaction<'static, Sqlite>,
    q: &CandidateQuery,
    after: Option<Position>,
    except: Option<i64>,
) -> Result<Vec<(i64, Position)>> {
    let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
        "SELECT g, prio_key, seq FROM (
            SELECT {GROUP_OF} AS g, d.prio_key, d.msg_seq AS seq,
                   row_number() OVER (PARTITION BY {GROUP_OF} ORDER BY d.prio_key, d.msg_seq) AS rn
            FROM deliveries d JOIN messages m ON m.seq = d.msg_seq"
    ));
    push_filter(&mut b, q);
    b.push(") x WHERE rn = 1");
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
    tx: &mut Transaction<'static, Sqlite>,
    q: &CandidateQuery,
    group: i64,
) -> Result<Vec<StoredMessage>> {
    let mut b: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT m.seq, m.msgid, m.queue_id, d.consumer, m.corrid, m.priority, d.prio_key, m.enq_time, m.delay_until,
                m.expire_at, m.sender, m.enq_user_id, m.exception_queue, m.payload, d.retry_count, m.state
         FROM deliveries d JOIN messages m ON m.seq = d.msg_seq",
    );
    push_filter(&mut b, q);
    if group < 0 {
        b.push(" AND m.seq = ").push_bind(-group).push(" AND m.grp IS NULL");
    } else {
        b.push(" AND m.grp = ").push_bind(group);
    }
    if let Some(p) = q.after {
        b.push(" AND (d.prio_key, d.msg_seq) > (").push_bind(p.prio_key).push(", ").push_bind(p.seq).push(")");
    }
    b.push(" ORDER BY d.prio_key, d.msg_seq LIMIT ").push_bind(q.limit);
    let rows = b.build().fetch_all(&mut **tx).await.db()?;
    rows.iter().map(stored_from_row).collect()
}

pub(super) async fn claim_group(
    tx: &mut Transaction<'static, Sqlite>,
    queue: QueueId,
    consumer: &str,
    group: i64,
    txn: &str,
) -> Result<bool> {
    let held: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM deliveries h JOIN messages hm ON hm.seq = h.msg_seq
                         WHERE h.queue_id = ?1 AND h.consumer = ?2 AND hm.queue_id = h.queue_id
                           AND (hm.grp = ?3 OR hm.seq = -?3) AND h.lock_txn IS NOT NULL AND h.lock_txn <> ?4)",
    )
    .bind(queue)
    .bind(consumer)
    .bind(group)
    .bind(txn)
    .fetch_one(&mut **tx)
    .await
    .db()?;
    Ok(!held)
}
