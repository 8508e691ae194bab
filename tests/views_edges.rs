//! The edges of the AQ$ views, `admin messages` paging, the views' copy of buffered
//! messages, LISTEN and ANYDATA type names, on both backends: pages that agree with the
//! view at every limit and state, NULLs that stay NULL, retry counts that belong to their
//! row, copies of processes whose clocks disagree, transaction ids of IMMEDIATE work, names
//! the database could not hold.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aqgate_core::clock::{Clock, Micros, SystemClock};
use aqgate_core::engine::{Engine, EngineConfig, Session};
use aqgate_core::error::code;
use aqgate_proto::idap::{self, Limits, ListenResult, Response};
use common::*;

const EXTRA: &str = r#"
[[queue_tables]]
name = "AQUSER.T3_TAB"
payload_type = "RAW"
multiple_consumers = true
sort_list = "priority,enq_time"

[[queues]]
name = "AQUSER.T3"
queue_table = "AQUSER.T3_TAB"
max_retries = 0

[[subscribers]]
queue = "AQUSER.T3"
name = "A"

[[subscribers]]
queue = "AQUSER.T3"
name = "B"

[[subscribers]]
queue = "AQUSER.T3"
name = "C"

[[queue_tables]]
name = "AQUSER.RETRY_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.RETRY"
queue_table = "AQUSER.RETRY_TAB"
max_retries = 1

[[queues]]
name = "AQUSER.KEPT"
queue_table = "AQUSER.RETRY_TAB"
retention_time = 3600

[[queue_tables]]
name = "AQUSER.BUF_TAB"
payload_type = "RAW"

[[queues]]
name = "AQUSER.BUF"
queue_table = "AQUSER.BUF_TAB"
"#;

/// A clock `offset` microseconds off the wall clock (another node's clock).
struct Skewed(Micros);

impl Clock for Skewed {
    fn now(&self) -> Micros {
        SystemClock.now() + self.0
    }
}

struct T {
    engine: Arc<Engine>,
    url: String,
}

impl T {
    async fn new(b: Backend) -> T {
        let url = fresh_url(b).await;
        drop(store_with_topology(&url, &format!("{}\n{EXTRA}", aqgate_admin::DEFAULT_TOPOLOGY)).await);
        T::on(url, 0).await
    }

    /// Another engine (process) on `url`, its clock `skew` µs off.
    async fn on(url: String, skew: Micros) -> T {
        let store = aqgate_store::open(&url).await.expect("store");
        let config = EngineConfig { max_wait: Duration::from_secs(10), ..EngineConfig::default() };
        let engine = Engine::start(store, Arc::new(Skewed(skew)), config).await.expect("engine");
        T { engine, url }
    }

    fn session(&self, agent: &str) -> Session {
        Session::new(&agent.to_ascii_uppercase(), SystemClock.now())
    }

    async fn run(&self, s: &mut Session, xml: &str) -> Result<Response, (i32, String)> {
        let req = idap::parse_request(xml.as_bytes(), &Limits::default()).expect("request parses").body;
        self.engine.execute(s, req).await.map_err(|e| (e.code, e.message))
    }

    async fn ok(&self, s: &mut Session, xml: &str) -> Response {
        self.run(s, xml).await.unwrap_or_else(|e| panic!("{e:?}: {xml}"))
    }

    /// `admin messages` rows as (corr, consumer, state, retry, queue), and "more".
    async fn listing(&self, queue: &str, state: Option<&str>, limit: i64) -> (Vec<Row>, bool) {
        let (rows, more) = aqgate_admin::messages::messages(self.engine.store().as_ref(), queue, state, limit)
            .await
            .unwrap_or_else(|e| panic!("listing {queue} {state:?} {limit}: {e:?}"));
        let rows = rows
            .into_iter()
            .map(|r| {
                let v = |c: &str| r.iter().find(|(n, _)| *n == c).and_then(|(_, v)| v.clone()).unwrap_or_default();
                Row {
                    corr: v("corr_id"),
                    consumer: v("consumer_name"),
                    state: v("msg_state"),
                    retry: v("retry_count"),
                    queue: v("queue"),
                    msg_id: v("msg_id"),
                }
            })
            .collect();
        (rows, more)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Row {
    corr: String,
    consumer: String,
    state: String,
    retry: String,
    queue: String,
    msg_id: String,
}

impl Row {
    fn short(&self) -> String {
        format!("{}|{}|{}|{}|{}", self.queue, self.corr, self.consumer, self.state, self.retry)
    }
}

fn publish(dest: &str, msgs: &[(&str, &str)]) -> String {
    raw_send(dest, msgs, COMMIT).replace("AQXmlSend", "AQXmlPublish")
}

fn take(dest: &str, consumer: Option<&str>, corr: &str, commit: bool) -> String {
    let c = consumer.map(|c| format!("<consumer_name>{c}</consumer_name>")).unwrap_or_default();
    receive(
        dest,
        &format!("{c}<wait_time>0</wait_time><selector><correlation>{corr}</correlation></selector>"),
        if commit { COMMIT } else { "" },
    )
}

/// Runs `sql` with the database's own client: the rows, `|`-separated.
fn sql_client(url: &str, sql: &str) -> Vec<String> {
    let out = match url.strip_prefix("sqlite://") {
        Some(path) => std::process::Command::new("sqlite3").arg(path).arg(sql).output(),
        None => std::process::Command::new("psql").args([url, "-X", "-q", "-A", "-t", "-c", sql]).output(),
    }
    .expect("sqlite3 / psql");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// A priority-sorted topic with three subscribers: PROCESSED, UNDELIVERABLE, WAIT, EXPIRED
/// and READY rows; `admin messages` at every limit and every state is a prefix of the full
/// listing (filtered), with "more" exactly when rows were left out, no row twice, and the
/// same rows as the view. Returns the full listing for the comparison between backends.
async fn listing_pages(b: Backend) -> Vec<String> {
    let t = T::new(b).await;
    let q = "AQUSER.T3";
    let mut s = t.session("SCOTT");
    let msgs: Vec<(String, &str)> = [5, 1, 3, 1, 5, 2]
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("<correlation>M{i}</correlation><priority>{p}</priority>"), "01"))
        .collect();
    let msgs: Vec<(&str, &str)> = msgs.iter().map(|(h, p)| (h.as_str(), *p)).collect();
    t.ok(&mut s, &publish(q, &msgs)).await;
    t.ok(&mut s, &publish(q, &[("<correlation>W</correlation><priority>0</priority><delay>3600</delay>", "02")])).await;
    t.ok(
        &mut s,
        &publish(q, &[("<correlation>E</correlation><priority>0</priority><expiration>1</expiration>", "03")]),
    )
    .await;
    // A takes M1 and M3; B gives up on M1 (max_retries 0: one rollback).
    for corr in ["M1", "M3"] {
        let r = t.ok(&mut s, &take(q, Some("A"), corr, true)).await;
        assert_eq!(received(&r).len(), 1, "{corr}");
    }
    let r = t.ok(&mut s, &take(q, Some("B"), "M1", false)).await;
    assert_eq!(received(&r).len(), 1);
    t.ok(&mut s, &envelope(ROLLBACK)).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let (full, more) = t.listing(q, None, 100_000).await;
    assert!(!more);
    let shorts: Vec<String> = full.iter().map(Row::short).collect();
    // No (message, consumer) twice.
    let keys: HashSet<(String, String)> = full.iter().map(|r| (r.msg_id.clone(), r.consumer.clone())).collect();
    assert_eq!(keys.len(), full.len(), "a row twice: {shorts:#?}");
    // The same rows as the view.
    let view = sql_client(
        &t.url,
        r#"SELECT corr_id, COALESCE(consumer_name, ''), msg_state FROM "AQUSER.AQ$T3_TAB" WHERE queue = 'AQUSER.T3'"#,
    );
    let mut view: Vec<String> = view;
    view.sort();
    let mut listed: Vec<String> = full.iter().map(|r| format!("{}|{}|{}", r.corr, r.consumer, r.state)).collect();
    listed.sort();
    assert_eq!(listed, view, "the listing and the view differ");
    // Each message's consumers together, by name.
    let mut seen_done: HashSet<String> = HashSet::new();
    for w in full.windows(2) {
        if w[0].msg_id != w[1].msg_id {
            assert!(seen_done.insert(w[0].msg_id.clone()), "a message's rows apart: {shorts:#?}");
        } else {
            assert!(w[0].consumer < w[1].consumer, "consumers by name: {shorts:#?}");
        }
    }
    // Dequeue order of the ready ones: M1 M3 (1), M5 (2), M2 (3), M0 M4 (5).
    let mut order: Vec<&str> = Vec::new();
    for r in &full {
        if r.corr.starts_with('M') && order.last() != Some(&r.corr.as_str()) {
            order.push(&r.corr);
        }
    }
    assert_eq!(order, ["M1", "M3", "M5", "M2", "M0", "M4"], "{shorts:#?}");

    for state in [None, Some("READY"), Some("WAIT"), Some("EXPIRED"), Some("PROCESSED"), Some("UNDELIVERABLE")] {
        let want: Vec<Row> = full.iter().filter(|r| state.is_none_or(|s| r.state == s)).cloned().collect();
        assert!(state.is_none() || !want.is_empty(), "{state:?}: no such rows in {shorts:#?}");
        let (all, more) = t.listing(q, state, 100_000).await;
        assert_eq!(all, want, "{state:?}");
        assert!(!more);
        for limit in 1..=want.len() as i64 + 1 {
            let (rows, more) = t.listing(q, state, limit).await;
            let n = want.len().min(limit as usize);
            assert_eq!(rows, want[..n], "{state:?} --limit {limit}");
            assert_eq!(more, (limit as usize) < want.len(), "{state:?} --limit {limit}: more");
        }
    }
    shorts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_agree_with_the_view_on_both_backends() {
    let lite = listing_pages(Backend::Sqlite).await;
    let pg = listing_pages(Backend::Postgres).await;
    assert_eq!(lite, pg, "the backends list differently");
}

/// A message rolled back past max_retries moves to the exception queue; there it is
/// dequeued and rolled back once, then taken. Both backends show the same at each step.
async fn exception_queue_path(b: Backend) -> Vec<Vec<String>> {
    let t = T::new(b).await;
    let mut s = t.session("SCOTT");
    let q = "AQUSER.RETRY";
    let eq = "AQUSER.AQ$_RETRY_TAB_E";
    t.ok(&mut s, &raw_send(q, &[("<correlation>R1</correlation>", "0A")], COMMIT)).await;
    for _ in 0..2 {
        let r = t.ok(&mut s, &take(q, None, "R1", false)).await;
        assert_eq!(received(&r).len(), 1);
        t.ok(&mut s, &envelope(ROLLBACK)).await;
    }
    let view = |t: &T| {
        sql_client(
            &t.url,
            r#"SELECT queue, corr_id, msg_state, retry_count, expiration_reason, original_queue_name,
                      original_msgid IS NULL, consumer_name IS NULL
                 FROM "AQUSER.AQ$RETRY_TAB" ORDER BY queue, corr_id"#,
        )
    };
    let mut steps = vec![view(&t)];
    // In the exception queue: dequeued and rolled back.
    let r = t.ok(&mut s, &take(eq, None, "R1", false)).await;
    assert_eq!(received(&r).len(), 1);
    t.ok(&mut s, &envelope(ROLLBACK)).await;
    steps.push(view(&t));
    let listed: Vec<String> = t.listing(eq, None, 10).await.0.iter().map(Row::short).collect();
    steps.push(listed);
    // The listing by each state finds it as the view shows it.
    let (exp, _) = t.listing(eq, Some("EXPIRED"), 10).await;
    assert_eq!(exp.len(), 1, "EXPIRED in the exception queue");
    let r = t.ok(&mut s, &take(eq, None, "R1", true)).await;
    assert_eq!(received(&r).len(), 1);
    steps.push(view(&t));
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exception_queue_path_shows_the_same_on_both_backends() {
    // (Booleans as the clients print them: SQLite 1/0, psql t/f.)
    let norm = |v: Vec<Vec<String>>| -> Vec<Vec<String>> {
        v.into_iter().map(|r| r.into_iter().map(|s| s.replace("|t", "|1").replace("|f", "|0")).collect()).collect()
    };
    let lite = norm(exception_queue_path(Backend::Sqlite).await);
    let pg = norm(exception_queue_path(Backend::Postgres).await);
    // Moved after two failed dequeues, never propagated: no ORIGINAL_MSGID (NULL).
    assert_eq!(pg[0], ["AQUSER.AQ$_RETRY_TAB_E|R1|EXPIRED|2|MAX_RETRY_EXCEEDED|AQUSER.RETRY|1|1"], "{pg:?}");
    assert_eq!(lite, pg, "SQLite's hex(NULL) is '', not NULL");
}

/// A message that no propagation copied has no ORIGINAL_MSGID: NULL in the view and in
/// `admin messages --json`, on both backends.
async fn original_msgid_of_a_plain_message(b: Backend) {
    let t = T::new(b).await;
    let mut s = t.session("SCOTT");
    t.ok(&mut s, &raw_send("AQUSER.RAW_QUE", &[("<correlation>P</correlation>", "01")], COMMIT)).await;
    let rows =
        sql_client(&t.url, r#"SELECT COALESCE(original_msgid, '<null>') FROM "AQUSER.AQ$RAW_TAB" WHERE corr_id = 'P'"#);
    assert_eq!(rows, ["<null>"], "{b:?}: the view");
    let (rows, _) =
        aqgate_admin::messages::messages(t.engine.store().as_ref(), "AQUSER.RAW_QUE", None, 10).await.expect("list");
    let orig = rows[0].iter().find(|(c, _)| *c == "original_msgid").map(|(_, v)| v.clone());
    assert_eq!(orig, Some(None), "{b:?}: admin messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_msgid_of_a_plain_message_is_null_on_sqlite() {
    original_msgid_of_a_plain_message(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_msgid_of_a_plain_message_is_null_on_postgres() {
    original_msgid_of_a_plain_message(Backend::Postgres).await;
}

/// A multi-consumer message that one consumer took and the others gave up on moves to the
/// exception queue; the view and the listing show it the same way on both backends.
async fn stranded_message(b: Backend) -> Vec<Vec<String>> {
    let t = T::new(b).await;
    let mut s = t.session("SCOTT");
    let q = "AQUSER.T3";
    t.ok(&mut s, &publish(q, &[("<correlation>S1</correlation>", "01")])).await;
    t.ok(&mut s, &take(q, Some("A"), "S1", true)).await;
    for c in ["B", "C"] {
        let r = t.ok(&mut s, &take(q, Some(c), "S1", false)).await;
        assert_eq!(received(&r).len(), 1, "{c}");
        t.ok(&mut s, &envelope(ROLLBACK)).await;
    }
    let view = sql_client(
        &t.url,
        r#"SELECT queue, corr_id, COALESCE(consumer_name, '-'), msg_state, retry_count, COALESCE(expiration_reason, '-'),
                  COALESCE(original_queue_name, '-')
             FROM "AQUSER.AQ$T3_TAB" ORDER BY queue, COALESCE(consumer_name, '-')"#,
    );

    let eq = "AQUSER.AQ$_T3_TAB_E";
    let mut out = vec![view];
    for state in [None, Some("EXPIRED"), Some("PROCESSED")] {
        out.push(t.listing(eq, state, 10).await.0.iter().map(Row::short).collect());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranded_message_shows_the_same_on_both_backends() {
    let lite = stranded_message(Backend::Sqlite).await;
    let pg = stranded_message(Backend::Postgres).await;
    assert_eq!(lite, pg);
    // A took it at its first attempt: its row's RETRY_COUNT is 0 (B's and C's failures
    // are theirs), as it was before the move.
    let a_row: Vec<&String> = pg[0].iter().filter(|r| r.contains("|A|")).collect();
    assert_eq!(a_row.len(), 1, "{pg:?}");
    assert!(a_row[0].contains("|A|PROCESSED|0|"), "A's retry count took the others' failures: {pg:?}");
}

fn buffered_send(dest: &str, corr: &str) -> String {
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination><visibility>IMMEDIATE</visibility><aqgate:delivery_mode xmlns:aqgate="urn:aqgate:idap">BUFFERED</aqgate:delivery_mode></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>{corr}</correlation></message_header><message_payload><raw>01</raw></message_payload></message></message_set></AQXmlSend>"#
    ))
}

/// Two processes on one PostgreSQL database, each holding a buffered message: the views
/// show both while both processes live, whatever each one's clock says (within seconds
/// of the database's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_copies_of_two_processes_with_clocks_seconds_apart_on_postgres() {
    let a = T::new(Backend::Postgres).await;
    // B's clock is 6 s ahead of A's (and of the database's).
    let b = T::on(a.url.clone(), 6_000_000).await;
    let (mut sa, mut sb) = (a.session("SCOTT"), b.session("SCOTT"));
    a.ok(&mut sa, &buffered_send("AQUSER.BUF", "FROM_A")).await;
    b.ok(&mut sb, &buffered_send("AQUSER.BUF", "FROM_B")).await;
    a.engine.time_manager_round(false).await;
    let shown = || async {
        let mut v: Vec<String> = a.listing("AQUSER.BUF", None, 10).await.0.iter().map(|r| r.corr.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(shown().await, ["FROM_A"]);
    b.engine.time_manager_round(false).await;
    assert_eq!(shown().await, ["FROM_A", "FROM_B"], "B's copy removed A's (A is alive)");
}

/// A process whose clock is 6 s behind the database's: its buffered message never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_copy_of_a_process_whose_clock_is_behind_on_postgres() {
    let a = T::new(Backend::Postgres).await;
    let b = T::on(a.url.clone(), -6_000_000).await;
    let mut sb = b.session("SCOTT");
    b.ok(&mut sb, &buffered_send("AQUSER.BUF", "FROM_B")).await;
    b.engine.time_manager_round(false).await;
    let (rows, _) = a.listing("AQUSER.BUF", None, 10).await;
    assert_eq!(rows.len(), 1, "the live process's buffered message is not shown");
}

fn listen(agents: &[&str], wait: u64) -> String {
    let agents: String =
        agents.iter().map(|q| format!("<l:agent><l:destination>{q}</l:destination></l:agent>")).collect();
    envelope(&format!(
        r#"<AQXmlReceive xmlns="http://ns.oracle.com/AQ/schemas/access"><l:listen xmlns:l="urn:aqgate:idap">{agents}<l:wait_time>{wait}</l:wait_time></l:listen></AQXmlReceive>"#
    ))
}

/// LISTEN over a queue whose only message another transaction holds: no answer until that
/// transaction rolls back, then at once.
async fn listen_over_a_locked_message(b: Backend) {
    let t = Arc::new(T::new(b).await);
    let q = "AQUSER.RAW_QUE";
    let mut holder = t.session("SCOTT");
    t.ok(&mut holder, &raw_send(q, &[("<correlation>L1</correlation>", "01")], COMMIT)).await;
    let r = t.ok(&mut holder, &take(q, None, "L1", false)).await;
    assert_eq!(received(&r).len(), 1);
    let mut other = t.session("SCOTT");
    assert_eq!(t.run(&mut other, &listen(&[q, q], 0)).await.err().map(|e| e.0), Some(code::NO_MESSAGE), "locked");
    let t2 = t.clone();
    let waiter = tokio::spawn(async move {
        let mut s = t2.session("SCOTT");
        let started = Instant::now();
        (t2.run(&mut s, &listen(&[q], 8)).await, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.ok(&mut holder, &envelope(ROLLBACK)).await;
    let (r, waited) = waiter.await.expect("waiter");
    assert!(matches!(&r, Ok(Response::Listen(_, Some(ListenResult { destination, .. }))) if destination == q), "{r:?}");
    assert!(waited < Duration::from_secs(4), "woken by the rollback: {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_over_a_locked_message_on_sqlite() {
    listen_over_a_locked_message(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_over_a_locked_message_on_postgres() {
    listen_over_a_locked_message(Backend::Postgres).await;
}

/// A retained queue with messages in it, buffered ones and kept ones: every limit and state
/// gives a prefix of the full listing (live, then buffered, then kept), "more" exactly when
/// rows were left out.
async fn listing_of_live_buffered_and_kept(b: Backend) -> Vec<String> {
    let t = T::new(b).await;
    let q = "AQUSER.KEPT";
    let mut s = t.session("SCOTT");
    for i in 0..5 {
        t.ok(&mut s, &raw_send(q, &[(&format!("<correlation>L{i}</correlation>"), "01")], COMMIT)).await;
    }
    for i in [1, 3] {
        let r = t.ok(&mut s, &take(q, None, &format!("L{i}"), true)).await;
        assert_eq!(received(&r).len(), 1);
    }
    for i in 0..3 {
        t.ok(&mut s, &buffered_send(q, &format!("B{i}"))).await;
    }
    t.engine.time_manager_round(false).await;
    let (full, _) = t.listing(q, None, 1000).await;
    let shorts: Vec<String> = full.iter().map(Row::short).collect();
    let corrs: Vec<&str> = full.iter().map(|r| r.corr.as_str()).collect();
    assert_eq!(corrs, ["L0", "L2", "L4", "B0", "B1", "B2", "L1", "L3"], "{shorts:#?}");
    for state in [None, Some("READY"), Some("PROCESSED")] {
        let want: Vec<Row> = full.iter().filter(|r| state.is_none_or(|s| r.state == s)).cloned().collect();
        for limit in 1..=want.len() as i64 + 1 {
            let (rows, more) = t.listing(q, state, limit).await;
            let n = want.len().min(limit as usize);
            assert_eq!(rows, want[..n], "{state:?} --limit {limit}");
            assert_eq!(more, (limit as usize) < want.len(), "{state:?} --limit {limit}: more");
        }
    }
    shorts.into_iter().map(|s| s.split('|').skip(1).collect::<Vec<_>>().join("|")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_of_live_buffered_and_kept_messages_on_both_backends() {
    let lite = listing_of_live_buffered_and_kept(Backend::Sqlite).await;
    let pg = listing_of_live_buffered_and_kept(Backend::Postgres).await;
    assert_eq!(lite, pg);
}

/// A queue table name longer than its view's name can be (`SCHEMA.AQ$TABLE`, at most 63
/// bytes as a PostgreSQL identifier, which would cut it and let two such names collide) is
/// refused by the topology, naming the limit, on either backend; one at the limit applies.
async fn long_queue_table_names(b: Backend) {
    let table = |len: usize| format!("AQUSER.{}", "T".repeat(len - "AQUSER.".len()));
    let topology = |name: &str| {
        format!(
            "{}\n[[queue_tables]]\nname = \"{name}\"\npayload_type = \"RAW\"\n\n\
             [[queues]]\nname = \"AQUSER.LONG_Q\"\nqueue_table = \"{name}\"\n",
            aqgate_admin::DEFAULT_TOPOLOGY
        )
    };
    let url = fresh_url(b).await;
    let store = aqgate_store::open(&url).await.expect("store");
    let too_long = aqgate_core::topology::Topology::from_toml(&topology(&table(61))).expect("parses");
    let e = aqgate_admin::apply(store.as_ref(), &too_long, false).await.expect_err("refused");
    assert!(e.to_string().contains("at most 60 bytes"), "{b:?}: {e}");
    let longest = table(60);
    let t = aqgate_core::topology::Topology::from_toml(&topology(&longest)).expect("parses");
    aqgate_admin::apply(store.as_ref(), &t, false).await.unwrap_or_else(|e| panic!("{b:?}: {e}"));
    let view = longest.replacen('.', ".AQ$", 1);
    let rows = sql_client(&url, &format!(r#"SELECT count(*) FROM "{view}""#));
    assert_eq!(rows, ["0"], "{b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_queue_table_names_are_refused_by_name_on_sqlite() {
    long_queue_table_names(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_queue_table_names_are_refused_by_name_on_postgres() {
    long_queue_table_names(Backend::Postgres).await;
}

/// An IMMEDIATE enqueue inside an open transaction is committed on its own, not by that
/// transaction: its ENQ_TXN_ID is not the open transaction's (as DEQ_TXN_ID of an
/// IMMEDIATE dequeue is not).
async fn immediate_enqueue_txn_id(b: Backend) {
    let t = T::new(b).await;
    let q = "AQUSER.RAW_QUE";
    let mut s = t.session("SCOTT");
    t.ok(&mut s, &raw_send(q, &[("<correlation>OPEN</correlation>", "01")], "")).await;
    let open_txn = s.txn.clone();
    let immediate = raw_send(q, &[("<correlation>IMM</correlation>", "02")], "")
        .replace("</destination>", "</destination><visibility>IMMEDIATE</visibility>");
    t.ok(&mut s, &immediate).await;
    t.ok(&mut s, &envelope(ROLLBACK)).await;
    let rows = sql_client(&t.url, r#"SELECT corr_id, enq_txn_id FROM "AQUSER.AQ$RAW_TAB""#);
    assert_eq!(rows.len(), 1, "only the IMMEDIATE one stays: {rows:?}");
    let imm_txn = rows[0].split('|').nth(1).unwrap_or_default().to_string();
    assert!(
        !imm_txn.is_empty() && imm_txn != open_txn,
        "{b:?}: the IMMEDIATE message names the open transaction {open_txn} (rolled back) as its ENQ_TXN_ID"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_enqueue_has_its_own_enq_txn_id_on_sqlite() {
    immediate_enqueue_txn_id(Backend::Sqlite).await;
}

/// LISTEN over a queue whose only message waits out its delay: answered when the delay
/// ends, not at the end of the wait.
async fn listen_until_a_delay_ends(b: Backend) {
    let t = T::new(b).await;
    let q = "AQUSER.RAW_QUE";
    let mut s = t.session("SCOTT");
    t.ok(&mut s, &raw_send(q, &[("<correlation>D</correlation><delay>2</delay>", "01")], COMMIT)).await;
    let started = Instant::now();
    let r = t.run(&mut s, &listen(&[q], 9)).await;
    let waited = started.elapsed();
    assert!(matches!(&r, Ok(Response::Listen(_, Some(_)))), "{r:?}");
    assert!(waited >= Duration::from_millis(1_500) && waited < Duration::from_secs(5), "{b:?}: {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_answers_when_a_delay_ends_on_sqlite() {
    listen_until_a_delay_ends(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_answers_when_a_delay_ends_on_postgres() {
    listen_until_a_delay_ends(Backend::Postgres).await;
}

/// Object types whose names ANYDATA gives to its built-ins (NUMBER, RAW, XMLTYPE,
/// JMS_TEXT_MESSAGE): the topology refuses them, or an ANYDATA queue carries their values
/// as that type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_types_named_like_anydatas_built_ins_on_sqlite() {
    let mut problems = Vec::new();
    for name in ["NUMBER", "RAW", "XMLTYPE", "VARCHAR2", "JMS_TEXT_MESSAGE"] {
        let topo = format!(
            "{}\n[[types]]\nname = \"{name}\"\nkind = \"object\"\nattributes = [ {{ name = \"X\", type = \"NUMBER\" }} ]\n\n\
             [[queue_tables]]\nname = \"AQUSER.ANY_TAB\"\npayload_type = \"SYS.ANYDATA\"\n\n\
             [[queues]]\nname = \"AQUSER.ANY_Q\"\nqueue_table = \"AQUSER.ANY_TAB\"\n",
            aqgate_admin::DEFAULT_TOPOLOGY
        );
        let Ok(parsed) = aqgate_core::topology::Topology::from_toml(&topo) else { continue };
        let url = fresh_url(Backend::Sqlite).await;
        let store = aqgate_store::open(&url).await.expect("store");
        if aqgate_admin::apply(store.as_ref(), &parsed, false).await.is_err() {
            continue;
        }
        drop(store);
        let t = T::on(url, 0).await;
        let mut s = t.session("SCOTT");
        let payload = format!("<{name}><X>1</X></{name}>");
        let send = envelope(&format!(
            r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.ANY_Q</destination></producer_options><message_set><message><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
        ));
        match t.run(&mut s, &send).await {
            Ok(_) => {
                let r = t.run(&mut s, &receive("AQUSER.ANY_Q", "<wait_time>0</wait_time>", COMMIT)).await;
                let got = match &r {
                    Ok(r) => received(r).first().map(|m| {
                        (aqgate_proto::payload::type_name_attr(&m.payload).map(str::to_string), m.payload.name.clone())
                    }),
                    Err(e) => panic!("{name}: stored, then unreadable: {e:?}"),
                };
                if got.as_ref().and_then(|g| g.0.as_deref()) != Some(name) {
                    problems.push(format!("type {name} accepted; its value comes back as {got:?}"));
                }
            }
            Err((c, m)) => problems.push(format!("type {name} accepted by the topology; its value refused: {c} {m}")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
