//! Fair shares between notification targets, through the real binary on both backends:
//! one agent's receiver accepts connections and never answers while it floods its queue;
//! another agent's notifications still arrive within moments of its commits, the dead
//! target never has more than its per-target limit in flight, its circuit opens (metrics),
//! and once it answers again everything owed to it is delivered.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use axum::http::StatusCode;
use common::*;

const FLOODED: &str = "AQUSER.RAW_QUE";
const QUIET: &str = "AQUSER.RAW_SIDE";

/// A real HTTP receiver. While `dead`, it accepts each request and never answers it;
/// otherwise it answers 200 at once and records the body.
#[derive(Clone, Default)]
struct Receiver {
    dead: Arc<AtomicBool>,
    delivered: Arc<Mutex<Vec<(Instant, String)>>>,
    /// Requests it holds open now, and the most it ever held at once.
    open: Arc<AtomicUsize>,
    most_open: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start(dead: bool) -> (Self, u16) {
        let me = Self::default();
        me.dead.store(dead, Ordering::SeqCst);
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post({
                let me = me.clone();
                move |body: String| {
                    let me = me.clone();
                    async move {
                        me.requests.fetch_add(1, Ordering::SeqCst);
                        if me.dead.load(Ordering::SeqCst) {
                            let now = me.open.fetch_add(1, Ordering::SeqCst) + 1;
                            me.most_open.fetch_max(now, Ordering::SeqCst);
                            // Counted down when aqgate gives up (the future is dropped).
                            let _guard = Guard(me.open.clone());
                            std::future::pending::<()>().await;
                        }
                        me.delivered.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), body));
                        StatusCode::OK
                    }
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        (me, port)
    }

    /// When the notification of `msgid` arrived, if it has.
    fn arrived(&self, msgid: &str) -> Option<Instant> {
        self.delivered.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(_, b)| b.contains(msgid)).map(|x| x.0)
    }

    fn delivered_ids(&self, among: &[String]) -> BTreeSet<String> {
        let d = self.delivered.lock().unwrap_or_else(|p| p.into_inner());
        among.iter().filter(|id| d.iter().any(|(_, b)| b.contains(id.as_str()))).cloned().collect()
    }
}

struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn register(dest: &str, url: &str) -> String {
    envelope(&format!(
        r#"<AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{dest}</destination><notify_url>{url}</notify_url></register_options><AQXmlCommit/></AQXmlRegister>"#
    ))
}

async fn metric(port: u16, name: &str) -> u64 {
    let m =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.expect("metrics").text().await.expect("text");
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in\n{m}"))
}

async fn a_dead_target_delays_no_one_else(db: String) {
    let (dead, dead_port) = Receiver::start(true).await;
    let (live, live_port) = Receiver::start(false).await;
    let topology = demo_topology_with(
        "notify-fair",
        &format!("\n[[queues]]\nname = \"{QUIET}\"\nqueue_table = \"AQUSER.RAW_TAB\"\n"),
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = Proc::spawn(
        "aqgate serve",
        aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", &db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(["--notify-allow", "public,127.0.0.1", "--notify-timeout", "2"])
            .args(["--notify-breaker-failures", "4", "--notify-breaker-cooldown", "2"])
            .env("AQGATE_LOG", "info"),
    );
    server.wait_ready(port, Duration::from_secs(60));
    let r = idap(port, "john", "welcome", &register(FLOODED, &format!("http://127.0.0.1:{dead_port}/hook"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let r = idap(port, "scott", "tiger", &register(QUIET, &format!("http://127.0.0.1:{live_port}/hook"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");

    // john floods his queue: 300 notifications owed to a receiver that never answers.
    let mut flood = Vec::new();
    for batch in 0..3 {
        let msgs: Vec<String> = (0..100).map(|i| format!("{:04X}", batch * 100 + i)).collect();
        let set: Vec<(&str, &str)> = msgs.iter().map(|m| ("", m.as_str())).collect();
        let r = idap(port, "john", "welcome", &raw_send(FLOODED, &set, COMMIT)).await;
        flood.extend(sent_ids(&r));
    }
    // scott's notifications arrive promptly all the same, while the dead target is first
    // being tried, when its circuit opens, and while it is open or probed.
    let mut worst = Duration::ZERO;
    for i in 0..12 {
        let r = idap(port, "scott", "tiger", &raw_send(QUIET, &[("", &format!("{i:02X}"))], COMMIT)).await;
        let committed = Instant::now();
        let id = sent_ids(&r).remove(0);
        let deadline = committed + Duration::from_secs(10);
        let at = loop {
            if let Some(at) = live.arrived(&id) {
                break at;
            }
            assert!(Instant::now() < deadline, "scott's notification {i} never came");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        worst = worst.max(at.saturating_duration_since(committed));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("scott's slowest notification: {worst:?}");
    assert!(worst < Duration::from_secs(2), "a dead target delayed another agent's notification by {worst:?}");

    // The dead target never had more than its limit (4) in flight, and its circuit opened:
    // 300 notifications cost it a handful of attempts, not 300.
    let most = dead.most_open.load(Ordering::SeqCst);
    assert!((1..=4).contains(&most), "{most} requests held open at once");
    assert!(metric(port, "aqgate_notify_breaker_opens_total").await >= 1);
    assert_eq!(metric(port, "aqgate_notify_breakers_open").await, 1);
    let tried = dead.requests.load(Ordering::SeqCst);
    assert!(tried < 40, "{tried} attempts at a target whose circuit is open");
    assert!(dead.delivered_ids(&flood).is_empty());

    // It answers again: a probe gets through, the circuit closes, and everything owed to it
    // is delivered.
    dead.dead.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead.delivered_ids(&flood).len() < flood.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} delivered after the target recovered",
            dead.delivered_ids(&flood).len(),
            flood.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(port, "aqgate_notify_outbox_pending").await > 0
        || metric(port, "aqgate_notify_breakers_open").await > 0
    {
        assert!(Instant::now() < deadline, "the outbox never drained, or the circuit stayed open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(port, "aqgate_notify_outbox_parked").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_delays_no_one_else_on_sqlite() {
    a_dead_target_delays_no_one_else(fresh_sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_delays_no_one_else_on_postgres() {
    a_dead_target_delays_no_one_else(fresh_pg_url().await).await;
}
