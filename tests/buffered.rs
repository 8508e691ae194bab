//! Buffered messages over HTTP, on SQLite and PostgreSQL: enqueue and dequeue BUFFERED, the
//! IMMEDIATE rule, waiters woken by a buffered enqueue, multi-consumer queues, flow control
//! and its recovery, spilling by threshold and by age, a restart losing what was not
//! spilled, and PERSISTENT_OR_BUFFERED seeing both kinds.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{BufferConfig, Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{Limits, Response};
use common::*;

const RAW: &str = "AQUSER.RAW_QUE";
const TOPIC: &str = "AQUSER.BUF_TOPIC";

/// The demo topology plus a RAW multi-consumer queue with subscribers APP1 and APP2.
fn topology() -> String {
    format!(
        "{}\n{}",
        aqgate_admin::DEFAULT_TOPOLOGY,
        r#"
[[queue_tables]]
name = "AQUSER.BUF_TOPIC_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.BUF_TOPIC"
queue_table = "AQUSER.BUF_TOPIC_TAB"

[[subscribers]]
queue = "AQUSER.BUF_TOPIC"
name = "APP1"

[[subscribers]]
queue = "AQUSER.BUF_TOPIC"
name = "APP2"
"#
    )
}

struct Server {
    addr: SocketAddr,
    engine: Arc<Engine>,
    url: String,
    stop: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(b: Backend, buffered: BufferConfig) -> Self {
        let url = fresh_url(b).await;
        drop(store_with_topology(&url, &topology()).await);
        Self::on(url, buffered).await
    }

    /// A server (a new engine: a new process as far as buffered messages go) on `url`.
    async fn on(url: String, buffered: BufferConfig) -> Self {
        let store = aqgate_store::open(&url).await.expect("store");
        let config = EngineConfig { buffered, max_wait: Duration::from_secs(10), ..EngineConfig::default() };
        let engine = Engine::start(store, Arc::new(SystemClock), config).await.expect("engine");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = app(AppState::new(engine.clone(), Limits::default()));
        let stop = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self { addr, engine, url, stop }
    }

    /// Ends this server (its buffered messages with it) and starts another on its store.
    async fn restart(self) -> Self {
        self.stop.abort();
        let _ = self.stop.await;
        let (url, config) = (self.url.clone(), self.engine.config().buffered.clone());
        drop(self.engine);
        Self::on(url, config).await
    }

    async fn metrics(&self) -> String {
        let r = reqwest::get(format!("http://{}/metrics", self.addr)).await.expect("metrics");
        r.text().await.expect("metrics body")
    }

    async fn post(&self, body: &str) -> Response {
        let (_, text) = http_as(self.addr.port(), SCOTT, &mut None, body).await;
        parse_idap(text.as_bytes())
    }

    async fn ok(&self, body: &str) -> Response {
        match self.post(body).await {
            Response::Fault(f) => panic!("fault {}: {}", f.code, f.message),
            r => r,
        }
    }

    async fn fault(&self, body: &str) -> (i32, String) {
        match self.post(body).await {
            Response::Fault(f) => (f.code, f.message),
            r => panic!("not a fault: {r:?}"),
        }
    }

    /// Buffered sends of `hexes` to `dest`, one request each.
    async fn send_buffered(&self, dest: &str, hexes: &[&str]) {
        for h in hexes {
            self.ok(&send(dest, h, "BUFFERED", "IMMEDIATE", "")).await;
        }
    }

    /// Payloads a buffered (or `mode`) dequeue of `dest` gets, until it finds none.
    async fn drain(&self, dest: &str, mode: &str, consumer: &str) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match self.post(&recv(dest, mode, consumer, 0)).await {
                Response::Fault(f) if f.code == code::NO_MESSAGE => return out,
                r => out.extend(received(&r).iter().map(raw_of)),
            }
        }
    }
}

fn mode_element(mode: &str) -> String {
    format!(r#"<aqgate:delivery_mode xmlns:aqgate="urn:aqgate:idap">{mode}</aqgate:delivery_mode>"#)
}

/// An AQXmlSend of one RAW payload in `mode` with `visibility`; `header`: message_header XML.
fn send(dest: &str, hex: &str, mode: &str, visibility: &str, header: &str) -> String {
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination><visibility>{visibility}</visibility>{}</producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header>{header}</message_header><message_payload><raw>{hex}</raw></message_payload></message></message_set></AQXmlSend>"#,
        mode_element(mode)
    ))
}

fn recv(dest: &str, mode: &str, consumer: &str, wait: u64) -> String {
    let consumer =
        if consumer.is_empty() { String::new() } else { format!("<consumer_name>{consumer}</consumer_name>") };
    receive(
        dest,
        &format!("{consumer}<wait_time>{wait}</wait_time><visibility>IMMEDIATE</visibility>{}", mode_element(mode)),
        "",
    )
}

fn config(max_messages: usize, spill_bytes: usize, spill_after: Duration) -> BufferConfig {
    BufferConfig { max_messages, spill_bytes, spill_after, ..BufferConfig::default() }
}

async fn buffered_messages_go_and_come_back_by_their_own_kind(b: Backend) {
    let s = Server::start(b, BufferConfig::default()).await;
    s.send_buffered(RAW, &["B1", "B2"]).await;
    s.ok(&raw_send(RAW, &[("", "A1")], COMMIT)).await;
    assert_eq!(s.engine.buffered_len(RAW), 2);
    assert_eq!(depth(&s).await, 1, "nothing buffered is in the store");
    // A persistent dequeue sees only the persistent message, a buffered one only the buffered.
    assert_eq!(s.drain(RAW, "PERSISTENT", "").await, ["A1"]);
    assert_eq!(s.drain(RAW, "BUFFERED", "").await, ["B1", "B2"]);
    // PERSISTENT_OR_BUFFERED takes both kinds.
    s.send_buffered(RAW, &["B3"]).await;
    s.ok(&raw_send(RAW, &[("", "A2")], COMMIT)).await;
    let mut both = s.drain(RAW, "PERSISTENT_OR_BUFFERED", "").await;
    both.sort();
    assert_eq!(both, ["A2", "B3"]);
    // Correlation selects among buffered messages too.
    s.ok(&send(RAW, "C1", "BUFFERED", "IMMEDIATE", "<correlation>x</correlation>")).await;
    s.ok(&send(RAW, "C2", "BUFFERED", "IMMEDIATE", "<correlation>y</correlation>")).await;
    let by_corr = receive(
        RAW,
        &format!(
            "<wait_time>0</wait_time><selector><correlation>y</correlation></selector><visibility>IMMEDIATE</visibility>{}",
            mode_element("BUFFERED")
        ),
        "",
    );
    assert_eq!(received(&s.ok(&by_corr).await).iter().map(raw_of).collect::<Vec<_>>(), ["C2"]);
    assert_eq!(s.drain(RAW, "BUFFERED", "").await, ["C1"]);
}

#[tokio::test]
async fn buffered_messages_go_and_come_back_by_their_own_kind_sqlite() {
    buffered_messages_go_and_come_back_by_their_own_kind(Backend::Sqlite).await;
}

#[tokio::test]
async fn buffered_messages_go_and_come_back_by_their_own_kind_postgres() {
    buffered_messages_go_and_come_back_by_their_own_kind(Backend::Postgres).await;
}

async fn depth(s: &Server) -> i64 {
    aqgate_admin::queues(s.engine.store().as_ref()).await.expect("queues").iter().map(|q| q.depth).sum()
}

#[tokio::test]
async fn buffered_operations_are_immediate_and_refuse_what_they_cannot_keep() {
    let s = Server::start(Backend::Sqlite, BufferConfig::default()).await;
    let (c, m) = s.fault(&send(RAW, "01", "BUFFERED", "ON_COMMIT", "")).await;
    assert_eq!(c, code::BUFFERED_VISIBILITY, "{m}");
    assert!(m.contains("only immediate visibility mode supported for buffered message enqueue"), "{m}");
    let on_commit = receive(RAW, &format!("<wait_time>0</wait_time>{}", mode_element("BUFFERED")), "");
    assert_eq!(s.fault(&on_commit).await.0, code::BUFFERED_VISIBILITY);
    let (c, m) = s.fault(&send(RAW, "01", "BUFFERED", "IMMEDIATE", "<delay>5</delay>")).await;
    assert_eq!(c, code::BUFFERED_ENQUEUE, "{m}");
    assert!(m.contains("with delay"), "{m}");
    let browse = receive(
        RAW,
        &format!(
            "<wait_time>0</wait_time><visibility>IMMEDIATE</visibility><dequeue_mode>BROWSE</dequeue_mode>{}",
            mode_element("BUFFERED")
        ),
        "",
    );
    assert!(s.fault(&browse).await.1.contains("REMOVE only"));
    assert_eq!(s.engine.buffered_len(RAW), 0, "nothing refused was kept");
    // A buffered dequeue in a session with an open transaction takes the message at once:
    // the session's rollback does not bring it back.
    s.send_buffered(RAW, &["0A"]).await;
    let mut cookie = None;
    let port = s.addr.port();
    idap_in(port, SCOTT, &mut cookie, &raw_send(RAW, &[("", "0B")], "")).await;
    let got = idap_in(port, SCOTT, &mut cookie, &recv(RAW, "BUFFERED", "", 0)).await;
    assert_eq!(received(&got).iter().map(raw_of).collect::<Vec<_>>(), ["0A"]);
    idap_in(port, SCOTT, &mut cookie, &envelope(ROLLBACK)).await;
    assert_eq!(s.engine.buffered_len(RAW), 0);
    assert_eq!(depth(&s).await, 0, "the persistent send was rolled back");
}

async fn a_waiter_wakes_on_a_buffered_enqueue(b: Backend) {
    let s = Arc::new(Server::start(b, BufferConfig::default()).await);
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let r = s.ok(&recv(RAW, "BUFFERED", "", 8)).await;
            (received(&r).iter().map(raw_of).collect::<Vec<_>>(), t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.send_buffered(RAW, &["AB"]).await;
    let (got, took) = waiter.await.expect("waiter");
    assert_eq!(got, ["AB"]);
    assert!(took < Duration::from_secs(4), "woken by the enqueue, not by its wait time: {took:?}");
}

#[tokio::test]
async fn a_waiter_wakes_on_a_buffered_enqueue_sqlite() {
    a_waiter_wakes_on_a_buffered_enqueue(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_waiter_wakes_on_a_buffered_enqueue_postgres() {
    a_waiter_wakes_on_a_buffered_enqueue(Backend::Postgres).await;
}

async fn each_subscriber_gets_a_buffered_message_once(b: Backend) {
    let s = Server::start(b, BufferConfig::default()).await;
    s.send_buffered(TOPIC, &["01", "02"]).await;
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP1").await, ["01", "02"]);
    assert_eq!(s.engine.buffered_len(TOPIC), 2, "APP2 has not had them yet");
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP2").await, ["01", "02"]);
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP1").await, Vec::<String>::new());
    assert_eq!(s.engine.buffered_len(TOPIC), 0);
    // A recipient list names who gets it.
    let to_app2 = "<recipient_list><recipient><agent_name>APP2</agent_name></recipient></recipient_list>";
    s.ok(&send(TOPIC, "03", "BUFFERED", "IMMEDIATE", to_app2)).await;
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP1").await, Vec::<String>::new());
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP2").await, ["03"]);
}

#[tokio::test]
async fn each_subscriber_gets_a_buffered_message_once_sqlite() {
    each_subscriber_gets_a_buffered_message_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn each_subscriber_gets_a_buffered_message_once_postgres() {
    each_subscriber_gets_a_buffered_message_once(Backend::Postgres).await;
}

/// Oracle's views report buffered messages too: a message in this process's memory shows
/// in the `AQ$` view (one row per consumer still to take it) from the time manager's next
/// round, and leaves it once taken; a copy its process stopped rewriting (that process
/// ended) shows no more.
async fn the_views_show_buffered_messages_in_memory(b: Backend) {
    let s = Server::start(b, BufferConfig::default()).await;
    let store = s.engine.store();
    let shown = async || {
        let rows = store.view_rows("AQUSER.BUF_TOPIC_TAB", TOPIC, None, 100).await.expect("view");
        let at = |c: &str| aqgate_store::views::listed_columns().position(|x| x == c).expect("column");
        let mut out: Vec<String> = rows
            .iter()
            .map(|r| {
                let v = |c: &str| r[at(c)].clone().unwrap_or_default();
                format!(
                    "{}|{}|{}|{}|{}",
                    v("corr_id"),
                    v("consumer_name"),
                    v("msg_state"),
                    v("msg_priority"),
                    v("enq_user_id")
                )
            })
            .collect();
        out.sort();
        out
    };
    s.ok(&send(TOPIC, "01", "BUFFERED", "IMMEDIATE", "<correlation>B1</correlation>")).await;
    s.ok(&send(TOPIC, "02", "BUFFERED", "IMMEDIATE", "<correlation>B2</correlation><priority>5</priority>")).await;
    assert!(shown().await.is_empty(), "not before the time manager's round");
    s.engine.time_manager_round(false).await;
    assert_eq!(
        shown().await,
        ["B1|APP1|READY|1|SCOTT", "B1|APP2|READY|1|SCOTT", "B2|APP1|READY|5|SCOTT", "B2|APP2|READY|5|SCOTT"]
    );
    let one = recv(TOPIC, "BUFFERED", "APP1", 0)
        .replace("<wait_time>", "<selector><correlation>B1</correlation></selector><wait_time>");
    assert_eq!(received(&s.ok(&one).await).iter().map(raw_of).collect::<Vec<_>>(), ["01"]);
    s.engine.time_manager_round(false).await;
    assert_eq!(shown().await, ["B1|APP2|READY|1|SCOTT", "B2|APP1|READY|5|SCOTT", "B2|APP2|READY|5|SCOTT"]);
    // Another process's copy: shown while that process keeps it current; not once it has
    // not for six seconds (that process ended), and dropped by the next write of any.
    let gone = aqgate_core::store::NewMessage {
        consumers: vec!["APP1".into()],
        corrid: Some("GONE".into()),
        ..stored_row(s.engine.store().as_ref(), TOPIC).await
    };
    store.show_buffered("ended-process", Some(&[gone])).await.expect("write");
    assert!(shown().await.iter().any(|r| r.starts_with("GONE")), "{:?}", shown().await);
    backdate_copies(&s.url, "ended-process", 6_000_000).await;
    assert!(!shown().await.iter().any(|r| r.starts_with("GONE")), "{:?}", shown().await);
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP2").await, ["01", "02"]);
    s.engine.time_manager_round(false).await;
    assert_eq!(copies_of(&s.url, "ended-process").await, 0, "dropped");
    assert_eq!(shown().await, ["B2|APP1|READY|5|SCOTT"], "APP2 has taken both");
}

/// Makes the copy of buffered messages of process `node` look `by` microseconds older.
async fn backdate_copies(url: &str, node: &str, by: i64) {
    use sqlx::Connection;
    let sql = "UPDATE buffered_messages SET seen_at = seen_at - $1 WHERE node = $2";
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query(sql).bind(by).bind(node).execute(&mut c).await.expect("backdate");
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query(sql).bind(by).bind(node).execute(&mut c).await.expect("backdate");
    }
}

/// The rows of process `node`'s copy of buffered messages.
async fn copies_of(url: &str, node: &str) -> i64 {
    use sqlx::Connection;
    let sql = "SELECT count(*) FROM buffered_messages WHERE node = $1";
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).bind(node).fetch_one(&mut c).await.expect("count")
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).bind(node).fetch_one(&mut c).await.expect("count")
    }
}

/// A message row for `queue`, as a buffered enqueue would hold it.
async fn stored_row(store: &dyn aqgate_core::store::Store, queue: &str) -> aqgate_core::store::NewMessage {
    let ids: std::collections::HashMap<String, i64> = store.queue_ids().await.expect("ids").into_iter().collect();
    aqgate_core::store::NewMessage {
        msgid: *uuid::Uuid::now_v7().as_bytes(),
        queue: ids[queue],
        corrid: None,
        priority: 1,
        enq_time: aqgate_core::clock::Clock::now(&SystemClock),
        delay_until: None,
        expire_at: None,
        sender: None,
        enq_user_id: Some("SCOTT".into()),
        exception_queue: None,
        payload: vec![1],
        enq_txn: None,
        consumers: Vec::new(),
        prio_key: 0,
        spilled: false,
        group: None,
        enq_txn_id: None,
        origin: None,
    }
}

#[tokio::test]
async fn the_views_show_buffered_messages_in_memory_sqlite() {
    the_views_show_buffered_messages_in_memory(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_views_show_buffered_messages_in_memory_postgres() {
    the_views_show_buffered_messages_in_memory(Backend::Postgres).await;
}

async fn flow_control_refuses_and_recovers(b: Backend) {
    let s = Server::start(b, config(3, 1 << 20, Duration::from_secs(600))).await;
    s.send_buffered(RAW, &["01", "02", "03"]).await;
    let (c, m) = s.fault(&send(RAW, "04", "BUFFERED", "IMMEDIATE", "")).await;
    assert_eq!(c, code::FLOW_CONTROL, "{m}");
    assert!(m.contains("enqueue rate too high, flow control enabled"), "{m}");
    // Persistent sends are not held back.
    s.ok(&raw_send(RAW, &[("", "AA")], COMMIT)).await;
    let one = s.ok(&recv(RAW, "BUFFERED", "", 0)).await;
    assert_eq!(received(&one).iter().map(raw_of).collect::<Vec<_>>(), ["01"]);
    s.send_buffered(RAW, &["04"]).await;
    assert_eq!(s.drain(RAW, "BUFFERED", "").await, ["02", "03", "04"]);
    let m = s.metrics().await;
    assert!(m.contains("aqgate_buffered_flow_control_total 1"), "{m}");
    assert!(m.contains("aqgate_buffered_enqueued_total 4"), "{m}");
}

#[tokio::test]
async fn flow_control_refuses_and_recovers_sqlite() {
    flow_control_refuses_and_recovers(Backend::Sqlite).await;
}

#[tokio::test]
async fn flow_control_refuses_and_recovers_postgres() {
    flow_control_refuses_and_recovers(Backend::Postgres).await;
}

/// What one buffered message of `hex` to `dest` (by scott, with `header`) holds in memory,
/// measured on a throwaway server.
async fn message_bytes(b: Backend, dest: &str, hex: &str, header: &str) -> usize {
    let s = Server::start(b, BufferConfig::default()).await;
    s.ok(&send(dest, hex, "BUFFERED", "IMMEDIATE", header)).await;
    s.engine.buffered_bytes()
}

/// Spilled by threshold (two and a half messages' bytes: past them, the oldest go), then a
/// restart: what was spilled is there, what was in memory is gone.
async fn spilled_messages_survive_a_restart_and_the_rest_is_lost(b: Backend) {
    let size = message_bytes(b, RAW, "AA00", "").await;
    let s = Server::start(b, config(100, size * 5 / 2, Duration::from_secs(600))).await;
    s.send_buffered(RAW, &["AA01", "AA02", "AA03", "AA04", "AA05"]).await;
    assert_eq!(s.engine.buffered_len(RAW), 2, "two messages' bytes stay in memory");
    assert_eq!(s.engine.buffered_bytes(), 2 * size);
    assert_eq!(depth(&s).await, 3, "the three oldest were spilled to the store");
    // A persistent dequeue does not take spilled messages.
    assert_eq!(s.drain(RAW, "PERSISTENT", "").await, Vec::<String>::new());
    let first = s.ok(&recv(RAW, "BUFFERED", "", 0)).await;
    assert_eq!(received(&first).iter().map(raw_of).collect::<Vec<_>>(), ["AA01"], "spilled ones come first");
    let s = s.restart().await;
    assert_eq!(s.engine.buffered_len(RAW), 0);
    assert_eq!(s.drain(RAW, "BUFFERED", "").await, ["AA02", "AA03"], "AA04 and AA05 were lost with the process");
}

#[tokio::test]
async fn spilled_messages_survive_a_restart_and_the_rest_is_lost_sqlite() {
    spilled_messages_survive_a_restart_and_the_rest_is_lost(Backend::Sqlite).await;
}

#[tokio::test]
async fn spilled_messages_survive_a_restart_and_the_rest_is_lost_postgres() {
    spilled_messages_survive_a_restart_and_the_rest_is_lost(Backend::Postgres).await;
}

async fn old_buffered_messages_are_spilled(b: Backend) {
    let s = Server::start(b, config(100, 1 << 20, Duration::from_millis(300))).await;
    s.send_buffered(TOPIC, &["01"]).await;
    s.engine.time_manager_round(false).await;
    assert_eq!(s.engine.buffered_len(TOPIC), 1, "not old enough yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    s.send_buffered(TOPIC, &["02"]).await;
    s.engine.time_manager_round(false).await;
    assert_eq!(s.engine.buffered_len(TOPIC), 1, "the first went to the store, the second is young");
    assert_eq!(depth(&s).await, 1);
    // Each subscriber takes the spilled one first, then the one in memory.
    assert_eq!(s.drain(TOPIC, "BUFFERED", "APP1").await, ["01", "02"]);
    let s = s.restart().await;
    assert_eq!(s.drain(TOPIC, "PERSISTENT_OR_BUFFERED", "APP2").await, ["01"]);
    let m = s.metrics().await;
    assert!(m.contains("aqgate_buffered_spilled_total 0"), "a new process counts anew: {m}");
}

#[tokio::test]
async fn old_buffered_messages_are_spilled_sqlite() {
    old_buffered_messages_are_spilled(Backend::Sqlite).await;
}

#[tokio::test]
async fn old_buffered_messages_are_spilled_postgres() {
    old_buffered_messages_are_spilled(Backend::Postgres).await;
}

/// A recipient list of `n` names of `len` characters (`R…` numbered), as message_header XML.
fn recipients(n: usize, len: usize) -> String {
    let names: String = (0..n).map(|i| format!("<agent_name>R{i:0>w$}</agent_name>", w = len - 1)).collect();
    format!("<recipient_list>{names}</recipient_list>")
}

/// Messages of a one-byte payload and a long recipient list count whole against the
/// process's budget (`max_bytes`): past it the oldest are spilled, the bytes held stay
/// within it, and every message is still taken once, in order.
async fn the_process_budget_counts_whole_messages_and_spills_the_oldest(b: Backend) {
    let header = recipients(1000, 200);
    let size = message_bytes(b, TOPIC, "01", &header).await;
    assert!(size > 1000 * 200, "the recipients count: {size}");
    let budget = size * 4 + size / 2;
    let s = Server::start(b, BufferConfig { max_bytes: budget, ..BufferConfig::default() }).await;
    let hexes: Vec<String> = (1..=10).map(|i| format!("{i:02X}")).collect();
    for h in &hexes {
        s.ok(&send(TOPIC, h, "BUFFERED", "IMMEDIATE", &header)).await;
        assert!(s.engine.buffered_bytes() <= budget, "{} > {budget}", s.engine.buffered_bytes());
    }
    assert!(s.engine.buffered_len(TOPIC) <= 4, "{}", s.engine.buffered_len(TOPIC));
    let spilled = 10 - s.engine.buffered_len(TOPIC);
    assert_eq!(depth(&s).await, spilled as i64, "the rest were spilled to the store");
    let m = s.metrics().await;
    assert!(m.contains(&format!("aqgate_buffered_budget_spilled_total {spilled}")), "{m}");
    assert!(m.contains(&format!("aqgate_buffered_bytes {}", s.engine.buffered_bytes())), "{m}");
    assert!(m.contains("aqgate_buffered_budget_refused_total 0"), "{m}");
    // One recipient takes all ten, spilled ones first, in order; another still has them.
    assert_eq!(s.drain(TOPIC, "BUFFERED", "R0000000000").await.len(), 0, "no such recipient");
    let first = format!("R{:0>199}", 0);
    assert_eq!(s.drain(TOPIC, "BUFFERED", &first).await, hexes);
    let last = format!("R{:0>199}", 999);
    assert_eq!(s.drain(TOPIC, "BUFFERED", &last).await, hexes);
}

#[tokio::test]
async fn the_process_budget_counts_whole_messages_and_spills_the_oldest_sqlite() {
    the_process_budget_counts_whole_messages_and_spills_the_oldest(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_process_budget_counts_whole_messages_and_spills_the_oldest_postgres() {
    the_process_budget_counts_whole_messages_and_spills_the_oldest(Backend::Postgres).await;
}

/// Makes every insert into `messages` fail (`on`), or lets them through again.
async fn refuse_inserts(url: &str, on: bool) {
    use sqlx::Connection;
    let sql: &[&str] = match (url.starts_with("sqlite:"), on) {
        (true, true) => &["CREATE TRIGGER no_room BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'no room'); END"],
        (true, false) => &["DROP TRIGGER no_room"],
        (false, true) => &[
            "CREATE FUNCTION no_room() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no room'; END $$",
            "CREATE TRIGGER no_room BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION no_room()",
        ],
        (false, false) => &["DROP TRIGGER no_room ON messages", "DROP FUNCTION no_room()"],
    };
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("open sqlite");
        for s in sql {
            sqlx::query(s).execute(&mut c).await.expect("trigger");
        }
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect postgres");
        for s in sql {
            sqlx::query(s).execute(&mut c).await.expect("trigger");
        }
    }
}

/// With the budget spent and the store refusing the spill, a buffered enqueue is refused
/// with flow control (25307), the messages meant to be spilled stay in memory, and once the
/// store writes again the same enqueue goes through.
async fn a_spent_budget_that_cannot_spill_refuses_with_flow_control(b: Backend) {
    let size = message_bytes(b, RAW, "AA00", "").await;
    let s = Server::start(b, BufferConfig { max_bytes: size * 3 + size / 2, ..BufferConfig::default() }).await;
    s.send_buffered(RAW, &["AA01", "AA02", "AA03"]).await;
    refuse_inserts(&s.url, true).await;
    let (c, m) = s.fault(&send(RAW, "AA04", "BUFFERED", "IMMEDIATE", "")).await;
    assert_eq!(c, code::FLOW_CONTROL, "{m}");
    assert!(m.contains("--buffered-max-bytes") && m.contains("spilling 1 of them to the store failed"), "{m}");
    assert_eq!(s.engine.buffered_len(RAW), 3, "the one meant to be spilled is back in memory");
    assert_eq!(s.engine.buffered_bytes(), 3 * size);
    let m = s.metrics().await;
    assert!(m.contains("aqgate_buffered_budget_refused_total 1"), "{m}");
    assert!(m.contains("aqgate_buffered_flow_control_total 1"), "{m}");
    refuse_inserts(&s.url, false).await;
    s.send_buffered(RAW, &["AA04"]).await;
    assert_eq!(depth(&s).await, 1, "the oldest was spilled");
    assert_eq!(s.drain(RAW, "BUFFERED", "").await, ["AA01", "AA02", "AA03", "AA04"]);
}

#[tokio::test]
async fn a_spent_budget_that_cannot_spill_refuses_with_flow_control_sqlite() {
    a_spent_budget_that_cannot_spill_refuses_with_flow_control(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_spent_budget_that_cannot_spill_refuses_with_flow_control_postgres() {
    a_spent_budget_that_cannot_spill_refuses_with_flow_control(Backend::Postgres).await;
}
