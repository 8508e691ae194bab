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
pub enum Dialect {
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
    /// Which part of a listing the row is in.
    part: Part,
    /// Whether `retry` is the message's own count (not a named consumer's): the failed
    /// dequeues before a move to the exception queue are added.
    own_retries: bool,
}

/// The parts of a listing, in its order: messages in their queue (with their consumers'
/// dequeues), buffered ones in a process's memory, and those kept after their removal.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Part {
    Live,
    Buffered,
    Kept,
}

impl Part {
    pub(crate) fn from_code(c: i64) -> Part {
        match c {
            0 => Part::Live,
            1 => Part::Buffered,
            _ => Part::Kept,
        }
    }
}

/// Which messages a view's body covers.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// The view: every message of these queues (their ids: `1, 2`).
    Queues(&'a str),
    /// A listing ([`listing_sql`]): the messages in their queue whose `seq` is among
    /// parameter 1, the kept ones among parameter 2, and the buffered ones of queue `$3`
    /// when `$4` (and these conditions on `m`).
    Listing(&'a str),
}

/// `CREATE VIEW` of the queue table `view.queue_table` over its queues.
pub(crate) fn create_sql(d: Dialect, view: &QueueTableView) -> String {
    let queues = &view.queues;
    let ids = if queues.is_empty() {
        "NULL".to_string()
    } else {
        queues.iter().map(|q| q.to_string()).collect::<Vec<_>>().join(", ")
    };
    format!("CREATE VIEW {} AS {}", quoted(&view_name(&view.queue_table)), body(d, view.raw, Scope::Queues(&ids)))
}

/// `admin messages`: the listed columns ([`listed_columns`]) as text of the rows a view
/// has for the messages its parameters name (see [`Scope::Listing`]; with `by_state`, those
/// whose `msg_state` is `$5`; the buffered ones also by `buffered`, conditions on `m` whose
/// parameters follow), each with its message's `seq` (NULL for a buffered one) and its
/// [`Part`]'s number. The caller orders them.
pub fn listing_sql(d: Dialect, by_state: bool, buffered: &str) -> String {
    let cols: Vec<String> = listed_columns().map(|c| format!("CAST({c} AS TEXT) AS {c}")).collect();
    let state = if by_state { " WHERE msg_state = $5" } else { "" };
    format!(
        "SELECT {}, list_seq, CAST(list_part AS BIGINT) AS list_part FROM ({}) v{state}",
        cols.join(", "),
        body(d, false, Scope::Listing(buffered))
    )
}

/// The first `$4` messages of queue `$1` in their queue, in dequeue order after
/// (`prio_key`, `seq`) = (`$2`, `$3`), as (`seq`, `prio_key`), found through the indexes
/// of the dequeue order. With `state`, only those that may have a row in that state; only
/// those the conditions `narrow` on `m` take (their parameters from `$5`), each with `hit`
/// (an expression on `m`: whether a payload search finds it) as `hit`.
/// (PostgreSQL: of the queue's kind, `single`.)
pub fn candidates_sql(d: Dialect, state: Option<&str>, single: bool, narrow: &str, hit: &str) -> String {
    let now = now_sql(d);
    let fresh = format!("(m.expire_at IS NULL OR m.expire_at > {now})");
    let pre = match state {
        None => String::new(),
        Some("READY") => format!(" AND m.state <> 3 AND {fresh} AND (m.delay_until IS NULL OR m.delay_until <= {now})"),
        Some("WAIT") => format!(" AND m.state <> 3 AND {fresh} AND m.delay_until > {now}"),
        Some("EXPIRED") => format!(" AND (m.state = 3 OR m.expire_at <= {now})"),
        Some("UNDELIVERABLE") => {
            " AND EXISTS (SELECT 1 FROM deliveries x WHERE x.msg_seq = m.seq AND x.gave_up)".to_string()
        }
        // PROCESSED (a state no row has finds nothing either way).
        Some(_) => {
            " AND EXISTS (SELECT 1 FROM dequeue_history h WHERE h.msg_seq = m.seq AND h.consumer <> '')".to_string()
        }
    };
    match d {
        // `single`: a single-consumer queue's messages through messages_single_order, else a
        // multi-consumer queue's through messages_multi_order (a queue's are of one kind).
        Dialect::Postgres => {
            let which = if single { "" } else { "NOT " };
            format!(
                "SELECT m.seq, m.prio_key, CAST(CASE WHEN {hit} THEN 1 ELSE 0 END AS BIGINT) AS hit FROM messages m
                  WHERE {which}m.single AND m.queue_id = $1 AND (m.prio_key, m.seq) > ($2, $3)
                    AND m.enq_txn IS NULL{pre}{narrow}
                  ORDER BY m.prio_key, m.seq LIMIT $4"
            )
        }
        // A message's deliveries carry its dequeue order (each the same).
        Dialect::Sqlite => format!(
            "SELECT d.msg_seq AS seq, min(d.prio_key) AS prio_key, CAST(CASE WHEN {hit} THEN 1 ELSE 0 END AS BIGINT) AS hit
               FROM deliveries d JOIN messages m ON m.seq = d.msg_seq
              WHERE d.queue_id = $1 AND m.enq_txn IS NULL{pre}{narrow}
              GROUP BY d.msg_seq HAVING (min(d.prio_key), d.msg_seq) > ($2, $3)
              ORDER BY 2, 1 LIMIT $4"
        ),
    }
}

/// The first `$3` messages queue `$1` keeps after their removal after `seq` `$2`, oldest
/// first, those the conditions `narrow` on `m` take (their parameters from `$4`), each with
/// `hit` (as in [`candidates_sql`]).
pub(crate) fn kept_candidates_sql(narrow: &str, hit: &str) -> String {
    format!(
        "SELECT m.seq, CAST(CASE WHEN {hit} THEN 1 ELSE 0 END AS BIGINT) AS hit FROM processed_messages m
          WHERE m.queue_id = $1 AND m.seq > $2{narrow} ORDER BY m.seq LIMIT $3"
    )
}

/// The statements of `Store::show_buffered`: (1) drop the copy of process `$1` and the
/// copies not marked for `SHOWN_FOR`; (2) drop those others alone; (3) mark the copy of
/// `$1` current.
pub(crate) fn buffered_sql(d: Dialect) -> [String; 3] {
    let now = now_sql(d);
    let stale = format!("seen_at < {now} - {}", aqgate_core::engine::SHOWN_FOR);
    [
        format!("DELETE FROM buffered_messages WHERE node = $1 OR {stale}"),
        format!("DELETE FROM buffered_messages WHERE node <> $1 AND {stale}"),
        format!("UPDATE buffered_messages SET seen_at = {now} WHERE node = $1"),
    ]
}

/// The current time in microseconds, in SQL.
pub(crate) fn now_sql(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)",
        Dialect::Postgres => "(extract(epoch FROM clock_timestamp()) * 1000000)::int8",
    }
}

/// The rows of a view (`SELECT`s joined by `UNION ALL`) of the messages `scope` names;
/// `raw`: their payloads are RAW.
fn body(d: Dialect, raw: bool, scope: Scope) -> String {
    let f = Filters::of(d, scope);
    let c = Columns::new(d, raw, matches!(scope, Scope::Listing(_)));
    // The queue a message came from (an exception queue's message, a propagated copy).
    let queues = "JOIN queues q ON q.id = m.queue_id LEFT JOIN queues oq ON oq.id = m.orig_queue_id";
    let rest = format!(
        "{taken}
         UNION ALL
         {kept} FROM processed_messages m {queues}
                LEFT JOIN dequeue_history h ON h.msg_seq = m.seq
          WHERE {kept_f}
         UNION ALL
         {buffered}",
        taken = c.taken(d, scope, &f.live, queues),
        kept = c.kept(),
        kept_f = f.kept,
        buffered = c.buffered(&f.buffered, queues),
    );
    // A consumer that gave up on a message (too many failed dequeues) still has its row,
    // UNDELIVERABLE, until the message moves to its exception queue.
    let delivery_state = format!("CASE WHEN d.gave_up THEN 'UNDELIVERABLE' ELSE {} END", c.state);
    match d {
        // Every message has its deliveries (a single consumer's is named '').
        Dialect::Sqlite => format!(
            "{} FROM deliveries d JOIN messages m ON m.seq = d.msg_seq {queues}
              WHERE {deliv_f} AND m.enq_txn IS NULL
             UNION ALL
             {rest}",
            c.live("d.retry_count", "NULLIF(d.consumer, '')", &delivery_state, Part::Live),
            deliv_f = f.deliveries,
        ),
        // A single-consumer message carries its own delivery. The queue is the message's
        // (a delivery's is the same): its deliveries are then found by their primary key.
        // Filtered by the delivery's, the planner could look each message's up in
        // deliveries_order by its leading column alone (a scan of the whole queue per
        // message) when it has no statistics to tell that the filter keeps every row.
        Dialect::Postgres => format!(
            "{} FROM messages m {queues}
              WHERE m.single AND {live_f} AND m.enq_txn IS NULL
             UNION ALL
             {} FROM messages m {queues} JOIN deliveries d ON d.msg_seq = m.seq
              WHERE NOT m.single AND {live_f} AND m.enq_txn IS NULL
             UNION ALL
             {rest}",
            c.live("m.retry_count", "NULL::text", &c.state, Part::Live),
            c.live("d.retry_count", "d.consumer", &delivery_state, Part::Live),
            live_f = f.live,
        ),
    }
}

/// Which rows a view's body takes: of messages in their queue (`live`; on SQLite reached
/// through their deliveries, `deliveries`), kept ones, buffered ones.
struct Filters {
    live: String,
    deliveries: String,
    kept: String,
    buffered: String,
}

impl Filters {
    /// The filters of `scope`'s messages in dialect `d`.
    fn of(d: Dialect, scope: Scope) -> Filters {
        let s = |x: &str| x.to_string();
        match (scope, d) {
            (Scope::Queues(ids), _) => Filters {
                live: format!("m.queue_id IN ({ids})"),
                deliveries: format!("d.queue_id IN ({ids})"),
                kept: format!("m.queue_id IN ({ids})"),
                buffered: format!("m.queue_id IN ({ids})"),
            },
            (Scope::Listing(narrow), Dialect::Postgres) => Filters {
                live: s("m.seq = ANY($1::int8[])"),
                deliveries: String::new(),
                kept: s("m.seq = ANY($2::int8[])"),
                buffered: format!("m.queue_id = $3 AND $4{narrow}"),
            },
            (Scope::Listing(narrow), Dialect::Sqlite) => Filters {
                live: s("m.seq IN (SELECT value FROM json_each($1))"),
                deliveries: s("d.msg_seq IN (SELECT value FROM json_each($1))"),
                kept: s("m.seq IN (SELECT value FROM json_each($2))"),
                buffered: format!("m.queue_id = $3 AND $4{narrow}"),
            },
        }
    }
}

/// A view's columns in one dialect: the expressions of Oracle's columns over a row of
/// `messages`, `processed_messages` or `buffered_messages` (`m`), and the `SELECT` of
/// each source of rows.
struct Columns {
    d: Dialect,
    /// Whether the payloads are RAW.
    raw: bool,
    /// Whether the rows are a listing's (with their `list_seq` and `list_part`).
    listing: bool,
    now: &'static str,
    /// A message's state in its queue: EXPIRED, WAIT or READY.
    state: String,
    /// Oracle's expiration reasons by their codes (`WHEN … THEN …`).
    reasons: String,
    /// Whether a message is past its expiration.
    expired: String,
}

impl Columns {
    fn new(d: Dialect, raw: bool, listing: bool) -> Columns {
        let now = now_sql(d);
        let expired = format!("m.expire_at <= {now}");
        let state = format!(
            "CASE WHEN m.state = 3 OR {expired} THEN 'EXPIRED' WHEN m.delay_until > {now} THEN 'WAIT' ELSE 'READY' END"
        );
        let reasons = Expiry::ALL.iter().map(|e| format!(" WHEN {} THEN '{}'", e.code(), e.oracle_name())).collect();
        Columns { d, raw, listing, now, state, reasons, expired }
    }

    /// The typed NULLs: (timestamp, text, int, int8).
    fn nulls(&self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self.d {
            Dialect::Sqlite => ("NULL", "NULL", "NULL", "NULL"),
            Dialect::Postgres => ("NULL::timestamptz", "NULL::text", "NULL::int", "NULL::int8"),
        }
    }

    /// A bytes column in upper-case hexadecimal. (SQLite's hex(NULL) is '': NULL stays NULL.)
    fn hex(&self, col: &str) -> String {
        match self.d {
            Dialect::Sqlite => format!("CASE WHEN {col} IS NOT NULL THEN hex({col}) END"),
            Dialect::Postgres => format!("upper(encode({col}, 'hex'))"),
        }
    }

    /// Oracle's TIMESTAMP columns (microseconds).
    fn ts(&self, col: &str) -> String {
        match self.d {
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%f', {col} / 1000000.0, 'unixepoch')"),
            Dialect::Postgres => format!("to_timestamp({col} / 1000000.0)"),
        }
    }

    /// Oracle's DATE columns (whole seconds).
    fn date(&self, col: &str) -> String {
        match self.d {
            Dialect::Sqlite => format!("strftime('%Y-%m-%d %H:%M:%S', {col} / 1000000.0, 'unixepoch')"),
            Dialect::Postgres => format!("date_trunc('second', to_timestamp({col} / 1000000.0))"),
        }
    }

    /// The schema of a `SCHEMA.NAME` (Oracle's *_OWNER columns).
    fn owner(&self, col: &str) -> String {
        match self.d {
            Dialect::Sqlite => {
                format!("CASE WHEN instr({col}, '.') > 0 THEN substr({col}, 1, instr({col}, '.') - 1) END")
            }
            Dialect::Postgres => format!("CASE WHEN strpos({col}, '.') > 0 THEN split_part({col}, '.', 1) END"),
        }
    }

    /// A field of the sender, stored as JSON.
    fn sender(&self, field: &str) -> String {
        match self.d {
            Dialect::Sqlite => format!("json_extract(m.sender, '$.{field}')"),
            Dialect::Postgres if field == "protocol" => format!("(m.sender::jsonb ->> '{field}')::int"),
            Dialect::Postgres => format!("(m.sender::jsonb ->> '{field}')"),
        }
    }

    /// A queue table holds one payload type: RAW in hexadecimal, every other as its XML.
    /// (A buffered message's copy may hold none: NULL.)
    fn user_data(&self) -> String {
        match (self.d, self.raw) {
            (_, true) => self.hex("m.payload"),
            (Dialect::Sqlite, false) => "CAST(m.payload AS TEXT)".to_string(),
            (Dialect::Postgres, false) => "convert_from(m.payload, 'UTF8')".to_string(),
        }
    }

    /// The expiration reason: a message still in its queue that has expired there, not yet
    /// moved, shows TIME_EXPIRATION.
    fn reason(&self, live: bool) -> String {
        let reasons = &self.reasons;
        if live {
            format!(
                "CASE WHEN m.exc_reason IS NULL AND m.state <> 3 AND {} THEN '{}' ELSE CASE m.exc_reason{reasons} END END",
                self.expired,
                Expiry::Time.oracle_name()
            )
        } else {
            format!("CASE m.exc_reason{reasons} END")
        }
    }

    /// The `SELECT` list of the rows of source `s`, with Oracle's columns in their order.
    fn select(&self, s: Source) -> String {
        let (null_ts, null_text, null_int, null_int8) = self.nulls();
        let listed = match (self.listing, s.part) {
            (false, _) => String::new(),
            (true, Part::Buffered) => format!(", {null_int8} AS list_seq, {} AS list_part", s.part as i64),
            (true, _) => format!(", m.seq AS list_seq, {} AS list_part", s.part as i64),
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
                    {retry} AS retry_count,
                    {eq_owner} AS exception_queue_owner, m.exception_queue AS exception_queue,
                    {user_data} AS user_data, {null_text} AS propagated_msgid,
                    {name} AS sender_name, {address} AS sender_address, {protocol} AS sender_protocol,
                    {orig_id} AS original_msgid, oq.name AS original_queue_name, {oq_owner} AS original_queue_owner,
                    {reason} AS expiration_reason,
                    {consumer} AS consumer_name, {null_text} AS address, {null_int} AS protocol{listed}",
            msg_id = self.hex("m.msgid"),
            state = s.state,
            delay = self.date("m.delay_until"),
            delay_ts = self.ts("m.delay_until"),
            enq_time = self.date("m.enq_time"),
            enq_ts = self.ts("m.enq_time"),
            deq_time = s.deq_time.map_or(null_ts.to_string(), |c| self.date(c)),
            deq_ts = s.deq_time.map_or(null_ts.to_string(), |c| self.ts(c)),
            deq_user = s.deq_user,
            deq_txn = s.deq_txn,
            // The failed dequeues before a move to the exception queue count for the
            // message's own row there, not for a row of a consumer that took it before.
            retry = match s.own_retries {
                true => format!("{} + COALESCE(m.exc_retries, 0)", s.retry),
                false => s.retry.to_string(),
            },
            eq_owner = self.owner("m.exception_queue"),
            user_data = self.user_data(),
            name = self.sender("name"),
            address = self.sender("address"),
            protocol = self.sender("protocol"),
            orig_id = self.hex("m.orig_msgid"),
            oq_owner = self.owner("oq.name"),
            reason = self.reason(s.live),
            consumer = s.consumer,
        )
    }

    /// The `SELECT` list of a message still in its queue (or in a process's memory), for
    /// one consumer's delivery (or the message's own).
    fn live(&self, retry: &str, consumer: &str, state: &str, part: Part) -> String {
        let null_text = self.nulls().1;
        self.select(Source {
            state,
            retry,
            consumer,
            deq_time: None,
            deq_user: null_text,
            deq_txn: null_text,
            live: true,
            part,
            own_retries: true,
        })
    }

    /// The `SELECT` list of a message kept after its removal, with who took it.
    fn kept(&self) -> String {
        self.select(Source {
            state: "'PROCESSED'",
            retry: "COALESCE(h.retry_count, m.retry_count) + CASE WHEN COALESCE(h.consumer, '') = '' \
                    THEN COALESCE(m.exc_retries, 0) ELSE 0 END",
            consumer: "NULLIF(h.consumer, '')",
            deq_time: Some("COALESCE(h.deq_time, m.deq_time)"),
            deq_user: "h.deq_user_id",
            deq_txn: "h.txn",
            live: false,
            part: Part::Kept,
            own_retries: false,
        })
    }

    /// The rows of the consumers of a message still in the queue that have taken it (their
    /// delivery is gone; a pending remove keeps it). PostgreSQL finds a queue's messages
    /// through two partial indexes, one for either kind of message (a message in an
    /// exception queue keeps the history of its consumers).
    fn taken(&self, d: Dialect, scope: Scope, live_f: &str, queues: &str) -> String {
        let dequeued = self.select(Source {
            state: "'PROCESSED'",
            retry: "h.retry_count",
            consumer: "NULLIF(h.consumer, '')",
            deq_time: Some("h.deq_time"),
            deq_user: "h.deq_user_id",
            deq_txn: "h.txn",
            live: false,
            part: Part::Live,
            own_retries: false,
        });
        let taken = |which: &str| {
            format!(
                "{dequeued} FROM dequeue_history h JOIN messages m ON m.seq = h.msg_seq {queues}
              WHERE {which}{live_f} AND m.enq_txn IS NULL AND h.consumer <> ''
                AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_seq = h.msg_seq AND d.consumer = h.consumer)"
            )
        };
        match (d, scope) {
            (Dialect::Postgres, Scope::Queues(_)) => {
                format!("{} UNION ALL {}", taken("m.single AND "), taken("NOT m.single AND "))
            }
            _ => taken(""),
        }
    }

    /// The rows of buffered messages in the memory of a live process (`Store::show_buffered`).
    fn buffered(&self, buffered_f: &str, queues: &str) -> String {
        format!(
            "{} FROM buffered_messages m {queues}
          WHERE {buffered_f} AND m.seen_at > {now} - {shown_for}",
            self.live("m.retry_count", "NULLIF(m.consumer, '')", &self.state, Part::Buffered),
            now = self.now,
            shown_for = aqgate_core::engine::SHOWN_FOR,
        )
    }
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
