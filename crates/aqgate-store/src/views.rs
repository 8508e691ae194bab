//! Oracle's `AQ$<QUEUE_TABLE>` views: one per queue table, over the messages of its queues
//! as the store keeps them, with Oracle's column names (lower-case, so that unquoted names
//! in any case find them). `admin apply` (and `serve` at start) redefines them all with the
//! topology (`StoreTx::define_views`): a queue table that leaves the topology loses its view.
//!
//! A view is named `"SCHEMA.AQ$TABLE"`, one quoted identifier (SQLite has no schemas, and
//! aqgate's PostgreSQL tables live in one schema): `SELECT msg_state FROM "QS.AQ$ORDERS_SQTAB"`.
//! Only committed messages are shown. A message is READY, WAIT (its delay or retry delay has
//! not ended) or EXPIRED (in an exception queue); times are timestamps (UTC), `expiration`
//! seconds from the end of the delay. A multi-consumer message has one row per consumer
//! that has still to take it (`consumer_name`); a single-consumer one a row with
//! `consumer_name` NULL.

use aqgate_core::store::QueueId;

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

/// The rows of `queue_table`'s view for the queue `$1`, every column as text, at most `$2`.
pub(crate) fn select_sql(queue_table: &str) -> String {
    let cols: Vec<String> = COLUMNS.iter().map(|c| format!("CAST({c} AS TEXT) AS {c}")).collect();
    format!(
        "SELECT {} FROM {} WHERE queue = $1 ORDER BY enq_time, msg_id, consumer_name LIMIT $2",
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
    let columns = |retry: &str, consumer: &str| {
        format!(
            "SELECT q.name AS queue, {hex} AS msg_id, m.corrid AS corr_id, m.priority AS msg_priority,
                    CASE WHEN m.state = 3 THEN 'EXPIRED' WHEN m.delay_until > {now} THEN 'WAIT' ELSE 'READY' END
                        AS msg_state,
                    {delay} AS delay,
                    CASE WHEN m.expire_at IS NULL THEN NULL
                         ELSE (m.expire_at - COALESCE(m.delay_until, m.enq_time)) / 1000000 END AS expiration,
                    {enq_time} AS enq_time, m.enq_user_id AS enq_user_id,
                    {null_ts} AS deq_time, {null_text} AS deq_user_id,
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
    let body = match d {
        // Every message has its deliveries (a single consumer's is named '').
        Dialect::Sqlite => format!(
            "{} FROM deliveries d JOIN messages m ON m.seq = d.msg_seq JOIN queues q ON q.id = m.queue_id
              WHERE d.queue_id IN ({ids}) AND m.enq_txn IS NULL",
            columns("d.retry_count", "NULLIF(d.consumer, '')")
        ),
        // A single-consumer message carries its own delivery.
        Dialect::Postgres => format!(
            "{} FROM messages m JOIN queues q ON q.id = m.queue_id
              WHERE m.single AND m.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {} FROM deliveries d JOIN messages m ON m.seq = d.msg_seq JOIN queues q ON q.id = m.queue_id
              WHERE NOT m.single AND d.queue_id IN ({ids}) AND m.enq_txn IS NULL",
            columns("m.retry_count", "NULL::text"),
            columns("d.retry_count", "d.consumer")
        ),
    };
    format!("CREATE VIEW {} AS {body}", quoted(&view_name(queue_table)))
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
}
