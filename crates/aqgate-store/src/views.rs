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

use aqgate_core::store::{Expiry, QueueTableView, Retained};

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

/// The views' columns, in Oracle's order and with its names.
pub const COLUMNS: [&str; 31] = [
    "queue",
    "msg_id",
    "corr_id",
    "msg_priority",
    "msg_state",
    "delay",
    "delay_timestamp",
    "expiration",
    "enq_time",
    "enq_timestamp",
    "enq_user_id",
    "enq_txn_id",
    "deq_time",
    "deq_timestamp",
    "deq_user_id",
    "deq_txn_id",
    "retry_count",
    "exception_queue_owner",
    "exception_queue",
    "user_data",
    "propagated_msgid",
    "sender_name",
    "sender_address",
    "sender_protocol",
    "original_msgid",
    "original_queue_name",
    "original_queue_owner",
    "expiration_reason",
    "consumer_name",
    "address",
    "protocol",
];

/// The columns `admin messages` reads: all but the payload (`user_data`).
pub fn listed_columns() -> impl Iterator<Item = &'static str> {
    COLUMNS.into_iter().filter(|c| *c != "user_data")
}

/// The rows of `queue_table`'s view for the queue `$1`, every column but `user_data` as
/// text ([`listed_columns`]): with `by_state`, those whose `msg_state` is `$2` and at most
/// `$3`, else at most `$2`.
pub fn select_sql(queue_table: &str, by_state: bool) -> String {
    let cols: Vec<String> = listed_columns().map(|c| format!("CAST({c} AS TEXT) AS {c}")).collect();
    let (state, limit) = if by_state { (" AND msg_state = $2", "$3") } else { ("", "$2") };
    format!(
        "SELECT {} FROM {} WHERE queue = $1{state} ORDER BY enq_timestamp, msg_id, consumer_name LIMIT {limit}",
        cols.join(", "),
        quoted(&view_name(queue_table))
    )
}

/// What differs between the sources of a view's rows: the state, the consumer's retry
/// count and name, and the dequeue's time, agent and transaction.
struct Source<'a> {
    state: &'a str,
    retry: &'a str,
    consumer: &'a str,
    deq_time: Option<&'a str>,
    deq_user: &'a str,
    deq_txn: &'a str,
    /// Whether the row is a message still in its queue (one that has expired there, not yet
    /// moved, shows TIME_EXPIRATION).
    live: bool,
}

/// `CREATE VIEW` of the queue table `view.queue_table` over its queues.
pub(crate) fn create_sql(d: Dialect, view: &QueueTableView) -> String {
    let queues = &view.queues;
    let ids = if queues.is_empty() {
        "NULL".to_string()
    } else {
        queues.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ")
    };
    let hex = |col: &str| match d {
        Dialect::Sqlite => format!("hex({col})"),
        Dialect::Postgres => format!("upper(encode({col}, 'hex'))"),
    };
    let (now, null_ts, null_text) = match d {
        Dialect::Sqlite => ("CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)", "NULL", "NULL"),
        Dialect::Postgres => {
            ("(extract(epoch FROM clock_timestamp()) * 1000000)::int8", "NULL::timestamptz", "NULL::text")
        }
    };
    // Oracle's TIMESTAMP columns (microseconds), and its DATE ones (whole seconds).
    let ts = |col: &str| match d {
        Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', {col} / 1000000.0, 'unixepoch')"),
        Dialect::Postgres => format!("to_timestamp({col} / 1000000.0)"),
    };
    let date = |col: &str| match d {
        Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%S', {col} / 1000000.0, 'unixepoch')"),
        Dialect::Postgres => format!("date_trunc('second', to_timestamp({col} / 1000000.0))"),
    };
    // The schema of a `SCHEMA.NAME` (Oracle's *_OWNER columns).
    let owner = |col: &str| match d {
        Dialect::Sqlite => format!("CASE WHEN instr({col}, '.') > 0 THEN substr({col}, 1, instr({col}, '.') - 1) END"),
        Dialect::Postgres => format!("CASE WHEN strpos({col}, '.') > 0 THEN split_part({col}, '.', 1) END"),
    };
    let sender = |field: &str| match d {
        Dialect::Sqlite => format!("json_extract(m.sender, '$.{field}')"),
        Dialect::Postgres if field == "protocol" => format!("(m.sender::jsonb ->> '{field}')::int"),
        Dialect::Postgres => format!("(m.sender::jsonb ->> '{field}')"),
    };
    // A queue table holds one payload type: RAW in hexadecimal, every other as its XML.
    // (A buffered message's copy may hold none: NULL.)
    let user_data = match (d, view.raw) {
        (Dialect::Sqlite, true) => "CASE WHEN m.payload IS NOT NULL THEN hex(m.payload) END".to_string(),
        (Dialect::Postgres, true) => hex("m.payload"),
        (Dialect::Sqlite, false) => "CAST(m.payload AS TEXT)".to_string(),
        (Dialect::Postgres, false) => "convert_from(m.payload, 'UTF8')".to_string(),
    };
    let reasons: String =
        Expiry::ALL.iter().map(|e| format!(" WHEN {} THEN '{}'", e.code(), e.oracle_name())).collect();
    let expired = format!("m.expire_at <= {now}");
    let state = format!(
        "CASE WHEN m.state = 3 OR {expired} THEN 'EXPIRED' WHEN m.delay_until > {now} THEN 'WAIT' ELSE 'READY' END"
    );
    let processed = "'PROCESSED'";
    let columns = |s: Source| {
        let reason = if s.live {
            format!(
                "CASE WHEN m.exc_reason IS NULL AND m.state <> 3 AND {expired} THEN '{}' ELSE CASE m.exc_reason{reasons} END END",
                Expiry::Time.oracle_name()
            )
        } else {
            format!("CASE m.exc_reason{reasons} END")
        };
        format!(
            "SELECT q.name AS queue, {msg_id} AS msg_id, m.corrid AS corr_id, m.priority AS msg_priority,
                    {state} AS msg_state,
                    {delay} AS delay, {delay_ts} AS delay_timestamp,
                    CASE WHEN m.expire_at IS NULL THEN NULL
                         ELSE (m.expire_at - COALESCE(m.delay_until, m.enq_time)) / 1000000 END AS expiration,
                    {enq_time} AS enq_time, {enq_ts} AS enq_timestamp,
                    m.enq_user_id AS enq_user_id, m.enq_txn_id AS enq_txn_id,
                    {deq_time} AS deq_time, {deq_ts} AS deq_timestamp,
                    {deq_user} AS deq_user_id, {deq_txn} AS deq_txn_id,
                    {retry} + COALESCE(m.exc_retries, 0) AS retry_count,
                    {eq_owner} AS exception_queue_owner, m.exception_queue AS exception_queue,
                    {user_data} AS user_data, {null_text} AS propagated_msgid,
                    {name} AS sender_name, {address} AS sender_address, {protocol} AS sender_protocol,
                    {orig_id} AS original_msgid, oq.name AS original_queue_name, {oq_owner} AS original_queue_owner,
                    {reason} AS expiration_reason,
                    {consumer} AS consumer_name, {null_text} AS address, {null_int} AS protocol",
            msg_id = hex("m.msgid"),
            state = s.state,
            delay = date("m.delay_until"),
            delay_ts = ts("m.delay_until"),
            enq_time = date("m.enq_time"),
            enq_ts = ts("m.enq_time"),
            deq_time = s.deq_time.map_or(null_ts.to_string(), date),
            deq_ts = s.deq_time.map_or(null_ts.to_string(), ts),
            deq_user = s.deq_user,
            deq_txn = s.deq_txn,
            retry = s.retry,
            eq_owner = owner("m.exception_queue"),
            name = sender("name"),
            address = sender("address"),
            protocol = sender("protocol"),
            orig_id = hex("m.orig_msgid"),
            oq_owner = owner("oq.name"),
            consumer = s.consumer,
            null_int = if d == Dialect::Postgres { "NULL::int" } else { "NULL" },
        )
    };
    let live = |retry: &'static str, consumer: &'static str, state: &str| {
        columns(Source { state, retry, consumer, deq_time: None, deq_user: null_text, deq_txn: null_text, live: true })
    };
    // A consumer that gave up on a message (too many failed dequeues) still has its row,
    // UNDELIVERABLE, until the message moves to its exception queue.
    let delivery_state = format!("CASE WHEN d.gave_up THEN 'UNDELIVERABLE' ELSE {state} END");
    // Consumers of a message still in the queue that have taken it (their delivery is gone;
    // a pending remove keeps it), and messages kept after their removal, with who took them.
    let dequeued = columns(Source {
        state: processed,
        retry: "h.retry_count",
        consumer: "NULLIF(h.consumer, '')",
        deq_time: Some("h.deq_time"),
        deq_user: "h.deq_user_id",
        deq_txn: "h.txn",
        live: false,
    });
    let kept = columns(Source {
        state: processed,
        retry: "COALESCE(h.retry_count, m.retry_count)",
        consumer: "NULLIF(h.consumer, '')",
        deq_time: Some("COALESCE(h.deq_time, m.deq_time)"),
        deq_user: "h.deq_user_id",
        deq_txn: "h.txn",
        live: false,
    });
    // The queue a message came from (an exception queue's message, a propagated copy).
    let queues = "JOIN queues q ON q.id = m.queue_id LEFT JOIN queues oq ON oq.id = m.orig_queue_id";
    let taken = |which: &str| {
        format!(
            "{dequeued} FROM dequeue_history h JOIN messages m ON m.seq = h.msg_seq {queues}
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
         {kept} FROM processed_messages m {queues}
                LEFT JOIN dequeue_history h ON h.msg_seq = m.seq
          WHERE m.queue_id IN ({ids})"
    );
    // Buffered messages in the memory of a live process (`Store::show_buffered`).
    let buffered = format!(
        "{} FROM buffered_messages m {queues}
          WHERE m.queue_id IN ({ids}) AND m.seen_at > {now} - {shown_for}",
        live("m.retry_count", "NULLIF(m.consumer, '')", &state),
        shown_for = aqgate_core::engine::SHOWN_FOR,
    );
    let history = format!("{history} UNION ALL {buffered}");
    let body = match d {
        // Every message has its deliveries (a single consumer's is named '').
        Dialect::Sqlite => format!(
            "{} FROM deliveries d JOIN messages m ON m.seq = d.msg_seq {queues}
              WHERE d.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {history}",
            live("d.retry_count", "NULLIF(d.consumer, '')", &delivery_state)
        ),
        // A single-consumer message carries its own delivery. The queue is the message's
        // (a delivery's is the same): its deliveries are then found by their primary key.
        // Filtered by the delivery's, the planner could look each message's up in
        // deliveries_order by its leading column alone (a scan of the whole queue per
        // message) when it has no statistics to tell that the filter keeps every row.
        Dialect::Postgres => format!(
            "{} FROM messages m {queues}
              WHERE m.single AND m.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {} FROM messages m {queues} JOIN deliveries d ON d.msg_seq = m.seq
              WHERE NOT m.single AND m.queue_id IN ({ids}) AND m.enq_txn IS NULL
             UNION ALL
             {history}",
            live("m.retry_count", "NULL::text", &state),
            live("d.retry_count", "d.consumer", &delivery_state)
        ),
    };
    format!("CREATE VIEW {} AS {body}", quoted(&view_name(&view.queue_table)))
}

/// The columns `aqgate_retain` copies from a deleted message row.
const KEPT_COLUMNS: &str = "seq, msgid, queue_id, corrid, priority, enq_time, delay_until, expire_at, sender, \
                            enq_user_id, exception_queue, payload, enq_txn_id, orig_msgid, orig_queue_id, exc_reason, \
                            exc_retries";

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
        let view = |queues: Vec<i64>| QueueTableView { queue_table: "QS.T".into(), queues, raw: false };
        assert!(create_sql(Dialect::Sqlite, &view(vec![1, 2])).starts_with("CREATE VIEW \"QS.AQ$T\" AS SELECT"));
        assert!(create_sql(Dialect::Postgres, &view(vec![])).contains("IN (NULL)"));
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
