//! Oracle's `AQ$<QUEUE_TABLE>` views: one per queue table, over the messages of its queues
//! as the store keeps them, with Oracle's column names (lower-case, so that unquoted names
//! in any case find them). `admin apply` (and `serve` at start) redefines them all with the
//! topology (`StoreTx::define_views`): a queue table that leaves the topology loses its view.
//!
//! A view is named `"SCHEMA.AQ$TABLE"`, one quoted identifier (SQLite has no schemas, and
//! aqgate's PostgreSQL tables live in one schema): `SELECT msg_state FROM "QS.AQ$ORDERS_SQTAB"`.
//! Only committed messages are shown. A message is READY, WAIT (its delay or retry delay has
//! not ended), EXPIRED (in an exception queue) or PROCESSED (removed, and kept for its
//! queue's `retention_time`); times are timestamps (UTC), `expiration` seconds from the end
//! of the delay. A multi-consumer message has one row per consumer (`consumer_name`): those
//! that have still to take it, those that gave up on it (UNDELIVERABLE: rolled back more
//! than `max_retries` times; the message waits for the others, then moves to its exception
//! queue), and, from the dequeue history, those that took it (PROCESSED, with `deq_time`
//! and `deq_user_id`). A single-consumer one has a row with `consumer_name` NULL.
//!
//! The trigger `aqgate_retain` (also redefined here) copies a message deleted from a queue
//! with a retention time to `processed_messages`: whichever statement removes it, a
//! removal keeps it. Its condition lists the queues by id, so that the deletes of other
//! queues do not call it; without such queues there is no trigger.

use aqgate_core::store::{QueueId, Retained};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// `SCHEMA.AQ$TABLE` for the queue table `SCHEMA.TABLE`.
pub(crate) fn view_name(queue_table: &str) -> String {
    match queue_table.split_once('.') {
        Some((schema, table)) => format!("{schema}.AQ${table}"),
        None => format!("AQ${queue_table}"),
    }
}

/// `name` as an SQL identifier.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Lists the views this module made (their names hold `.AQ$`), to drop them.
pub(crate) fn list_sql(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'view' AND name LIKE '%.AQ$%'",
        Dialect::Postgres => {
            "SELECT viewname::text FROM pg_views WHERE schemaname = current_schema() AND viewname LIKE '%.AQ$%'"
        }
    }
}

/// The views' columns, in order.
pub const COLUMNS: [&str; 19] = [
    "queue",
    "msg_id",
    "corr_id",
    "msg_priority",
    "msg_state",
    "delay",
    "expiration",
    "enq_time",
    "enq_user_id",
    "deq_time",
    "deq_user_id",
    "retry_count",
    "exception_queue",
    "sender_name",
    "sender_address",
    "sender_protocol",
    "consumer_name",
    "original_msgid",
    "propagated_msgid",
];

/// The rows of `queue_table`'s view for the queue `$1`, every column as text: with
/// `by_state`, those whose `msg_state` is `$2` and at most `$3`, else at most `$2`.
pub fn select_sql(queue_table: &str, by_state: bool) -> String {
    let cols: Vec<String> = COLUMNS.iter().map(|c| format!("CAST({c} AS TEXT) AS {c}")).collect();
    let (state, limit) = if by_state { (" AND msg_state = $2", "$3") } else { ("", "$2") };
    format!(
        "SELECT {} FROM {} WHERE queue = $1{state} ORDER BY enq_time, msg_id, consumer_name LIMIT {limit}",
        cols.join(", "),
        quoted(&view_name(queue_table))
    )
}

/// `CREATE VIEW` of the queue table `queue_table` over its queues `queues`.
pub(crate) fn create_sql(d: Dialect, queue_table: &str, queues: &[QueueId]) -> String {
    let ids = if queues.is_empty() {
        "NULL".to_string()
    } else {
        queues.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ")
    };
    let (hex, now, null_ts, null_text) = match d {
        Dialect::Sqlite => {
            ("hex(m.msgid)", "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)", "NULL", "NULL")
        }
        Dialect::Postgres => (
            "upper(encode(m.msgid, 'hex'))",
            "(extract(epoch FROM clock_timestamp()) * 1000000)::int8",
            "NULL::timestamptz",
            "NULL::text",
        ),
    };
    let ts = |col: &str| match d {
        Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', {col} / 1000000.0, 'unixepoch')"),
        Dialect::Postgres => format!("to_timestamp({col} / 1000000.0)"),
    };
    let sender = |field: &str| match d {
        Dialect::Sqlite => format!("json_extract(m.sender, '$.{field}')"),
        Dialect::Postgres if field == "protocol" => format!("(m.sender::jsonb ->> '{field}')::int"),
        Dialect::Postgres => format!("(m.sender::jsonb ->> '{field}')"),
    };
    let state = format!("CASE WHEN m.state = 3 THEN 'EXPIRED' WHEN m.delay_until > {now} THEN 'WAIT' ELSE 'READY' END");
    let processed = "'PROCESSED'";
    let columns = |state: &str, retry: &str, consumer: &str, deq_time: &str, deq_user: &str| {
        format!(
            "SELECT q.name AS queue, {hex} AS msg_id, m.corrid AS corr_id, m.priority AS msg_priority,
                    {state} AS msg_state,
                    {delay} AS delay,
                    CASE WHEN m.expire_at IS NULL THEN NULL
                         ELSE (m.expire_at - COALESCE(m.delay_until, m.enq_time)) / 1000000 END AS expiration,
                    {enq_time} AS enq_time, m.enq_user_id AS enq_user_id,
                    {deq_time} AS deq_time, {deq_user} AS deq_user_id,
                    {retry} AS retry_count, m.exception_queue AS exception_queue,
                    {name} AS sender_name, {address} AS sender_address, {protocol} AS sender_protocol,
                    {consumer} AS consumer_name,
                    {null_text} AS original_msgid, {null_text} AS propagated_msgid",
            delay = ts("m.delay_until"),
            enq_time = ts("m.enq_time"),
            name = sender("name"),
            address = sender("address"),
            protocol = sender("protocol"),
        )
    };
    let live = |retry: &str, consumer: &str| columns(&state, retry, consumer, null_ts, null_text);
    // A consumer that gave up on a message (too many failed dequeues) still has its row,
    // UNDELIVERABLE, until the message moves to its exception queue.
    let delivery_state = format!("CASE WHEN d.gave_up THEN 'UNDELIVERABLE' ELSE {state} END");
    let delivery = |retry: &str, consumer: &str| columns(&delivery_state, retry, consumer, null_ts, null_text);
    // Consumers of a message still in the queue that have taken it (their delivery is gone;
    // a pending remove keeps it), and messages kept after their removal, with who took them.
    let dequeued = columns(processed, "h.retry_count", "NULLIF(h.consumer, '')", &ts("h.deq_time"), "h.deq_user_id");
    let kept = columns(
        processed,
        "COALESCE(h.retry_count, m.retry_count)",
        "NULLIF(h.consumer, '')",
        &ts("COALESCE(h.deq_time, m.deq_time)"),
        "h.deq_user_id",
    );
    let taken = |which: &str| {
        format!(
            "{dequeued} FROM dequeue_history h JOIN messages m ON m.seq = h.msg_seq JOIN queues q ON q.id = m.queue_id
              WHERE {which}m.queue_id IN ({ids}) AND m.enq_txn IS NULL AND h.consumer <> ''
                AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = h.msg_seq AND d.consumer = h.consumer)"
        )
    };
    // PostgreSQL finds a queue's messages through two partial indexes, one for either kind
    // of message (a message in an exception queue keeps the history of its consumers).
    let taken = match d {
        Dialect::Sqlite => taken(""),
        Dialect::Postgres => format!("{} UNION ALL {}", taken("m.single AND "), taken("NOT m.single AND ")),
    };
    let history = format!(
        "{taken}
         UNION ALL
         {kept} FROM processed_messages m JOIN queues q ON q.id = m.queue_id
                LEFT JOIN dequeue_history h ON h.msg_seq = m.seq
          WHERE m.queue_id IN ({ids})"
    );
    let body = match d {
        // Every message has its deliveries (a single consumer's is named '').
        Dialect::Sqlite => format!(
            "{} FROM deliveries d JOIN messages m ON m.seq = d.msg_seq JOIN queues q ON q.id = m.queue_id
              WHERE d.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {history}",
            delivery("d.retry_count", "NULLIF(d.consumer, '')")
        ),
        // A single-consumer message carries its own delivery. The queue is the message's
        // (a delivery's is the same): its deliveries are then found by their primary key.
        // Filtered by the delivery's, the planner could look each message's up in
        // deliveries_order by its leading column alone (a scan of the whole queue per
        // message) when it has no statistics to tell that the filter keeps every row.
        Dialect::Postgres => format!(
            "{} FROM messages m JOIN queues q ON q.id = m.queue_id
              WHERE m.single AND m.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {} FROM messages m JOIN queues q ON q.id = m.queue_id JOIN deliveries d ON d.msg_seq = m.seq
              WHERE NOT m.single AND m.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {history}",
            live("m.retry_count", "NULL::text"),
            delivery("d.retry_count", "d.consumer")
        ),
    };
    format!("CREATE VIEW {} AS {body}", quoted(&view_name(queue_table)))
}

/// The columns `aqgate_retain` copies from a deleted message row.
const KEPT_COLUMNS: &str = "seq, msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, \
                            enq_user_id, exception_queue, payload";

/// The statements that make the retention trigger what `retained` asks (the first drops
/// it), and a text that identifies that definition (PostgreSQL keeps it as the trigger's
/// comment, so that a start with the same topology changes nothing).
pub(crate) fn retain_sql(d: Dialect, retained: &[Retained]) -> (String, Vec<String>) {
    let mut retained = retained.to_vec();
    retained.sort_by_key(|r| r.queue);
    retained.dedup_by_key(|r| r.queue);
    let spec = retained
        .iter()
        .map(|r| format!("{}:{}", r.queue, r.for_micros.map_or("forever".to_string(), |m| m.to_string())))
        .collect::<Vec<_>>()
        .join(",");
    let drop = match d {
        Dialect::Sqlite => "DROP TRIGGER IF EXISTS aqgate_retain",
        Dialect::Postgres => "DROP TRIGGER IF EXISTS aqgate_retain ON messages",
    };
    let mut out = vec![drop.to_string()];
    if retained.is_empty() {
        return (spec, out);
    }
    let ids = retained.iter().map(|r| r.queue.to_string()).collect::<Vec<_>>().join(", ");
    let now = match d {
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)",
        Dialect::Postgres => "now_us",
    };
    // Integers only (queue ids and durations the topology gave): nothing a client wrote.
    let until = retained
        .iter()
        .filter_map(|r| r.for_micros.map(|m| format!(" WHEN {} THEN {now} + {m}", r.queue)))
        .collect::<String>();
    let until = if until.is_empty() { "NULL".to_string() } else { format!("CASE OLD.queue_id{until} END") };
    let values = KEPT_COLUMNS.split(", ").map(|c| format!("OLD.{}", c.trim())).collect::<Vec<_>>().join(", ");
    let when = format!("OLD.queue_id IN ({ids}) AND OLD.enq_txn IS NULL AND OLD.state <> 7");
    match d {
        Dialect::Sqlite => out.push(format!(
            "CREATE TRIGGER aqgate_retain AFTER DELETE ON messages FOR EACH ROW WHEN {when}
             BEGIN
               INSERT OR IGNORE INTO processed_messages ({KEPT_COLUMNS}, retry_count, deq_time, retain_until)
               VALUES ({values}, 0, {now}, {until});
             END"
        )),
        Dialect::Postgres => {
            out.push(format!(
                "CREATE OR REPLACE FUNCTION aqgate_retain() RETURNS trigger LANGUAGE plpgsql AS $f$
                 DECLARE now_us int8 := (extract(epoch FROM clock_timestamp()) * 1000000)::int8;
                 BEGIN
                   INSERT INTO processed_messages ({KEPT_COLUMNS}, retry_count, deq_time, retain_until)
                   VALUES ({values}, OLD.retry_count, now_us, {until})
                   ON CONFLICT (seq) DO NOTHING;
                   RETURN NULL;
                 END $f$"
            ));
            out.push(format!(
                "CREATE TRIGGER aqgate_retain AFTER DELETE ON messages FOR EACH ROW WHEN ({when})
                 EXECUTE FUNCTION aqgate_retain()"
            ));
            out.push(format!("COMMENT ON TRIGGER aqgate_retain ON messages IS '{spec}'"));
        }
    }
    (spec, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_oracles_and_quoted() {
        assert_eq!(view_name("QS.ORDERS_SQTAB"), "QS.AQ$ORDERS_SQTAB");
        assert_eq!(quoted("a\"b"), "\"a\"\"b\"");
        assert!(create_sql(Dialect::Sqlite, "QS.T", &[1, 2]).starts_with("CREATE VIEW \"QS.AQ$T\" AS SELECT"));
        assert!(create_sql(Dialect::Postgres, "QS.T", &[]).contains("IN (NULL)"));
    }

    #[test]
    fn the_retention_trigger_lists_its_queues() {
        let (spec, stmts) = retain_sql(Dialect::Postgres, &[]);
        assert_eq!((spec.as_str(), stmts.len()), ("", 1));
        let r = [Retained { queue: 9, for_micros: None }, Retained { queue: 5, for_micros: Some(3_000_000) }];
        let (spec, stmts) = retain_sql(Dialect::Postgres, &r);
        assert_eq!(spec, "5:3000000,9:forever");
        assert!(stmts[1].contains("CASE OLD.queue_id WHEN 5 THEN now_us + 3000000 END"), "{}", stmts[1]);
        assert!(stmts[2].contains("OLD.queue_id IN (5, 9) AND OLD.enq_txn IS NULL"), "{}", stmts[2]);
        let (_, stmts) = retain_sql(Dialect::Sqlite, &r[..1]);
        assert!(stmts[1].contains("VALUES (OLD.seq, OLD.msgid,") && stmts[1].contains(" NULL);"), "{}", stmts[1]);
    }
}
