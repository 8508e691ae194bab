//! Forwarder jobs (TMQFORWARD) in a real `aqgate serve` against a real HTTP receiver in the
//! test: a receiver that fails twice and then takes the message (the failure answers go to
//! the failure queue, the reply to the reply queue, the body is signed), one that always
//! fails (the message ends in the exception queue after max_retries), the JSON rendering,
//! and the allowlist refusing a loopback target.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use common::*;

const SECRET_ENV: &str = "AQGATE_TEST_FORWARD_SECRET";
const SECRET: &str = "forward-test-secret";

/// One request the receiver got: its path, headers and body.
type Request = (String, HeaderMap, Vec<u8>);

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Request>>>);

impl Seen {
    fn all(&self) -> std::sync::MutexGuard<'_, Vec<Request>> {
        self.0.lock().expect("receiver log")
    }
}

/// A receiver: `/flaky` answers 503 twice, then 200 `<ack/>`; `/down` always 500.
async fn receiver() -> (u16, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/{path}",
        axum::routing::post(
            move |axum::extract::Path(path): axum::extract::Path<String>,
                  headers: HeaderMap,
                  body: axum::body::Bytes| {
                let s = s.clone();
                async move {
                    let mut g = s.all();
                    g.push((path.clone(), headers, body.to_vec()));
                    let tries = g.iter().filter(|(p, _, _)| *p == path).count();
                    match path.as_str() {
                        "flaky" if tries <= 2 => (StatusCode::SERVICE_UNAVAILABLE, "busy".to_string()),
                        "flaky" => (StatusCode::OK, "<ack/>".to_string()),
                        _ => (StatusCode::INTERNAL_SERVER_ERROR, "down".to_string()),
                    }
                }
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(l, app).await });
    (port, seen)
}

fn topology(receiver: u16) -> std::path::PathBuf {
    let extra = format!(
        r#"
[[queues]]
name = "AQUSER.RAW_INBOX"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_DEAD"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_REPLIES"
queue_table = "AQUSER.RAW_TAB"

[[queues]]
name = "AQUSER.RAW_FAILURES"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "flaky"
source = "AQUSER.RAW_INBOX"
retry_backoff_ms = 50
forward = {{ url = "http://127.0.0.1:{receiver}/flaky", reply_queue = "AQUSER.RAW_REPLIES", failure_queue = "AQUSER.RAW_FAILURES", secret_env = "{SECRET_ENV}" }}

[[propagations]]
name = "dead"
source = "AQUSER.RAW_DEAD"
retry_backoff_ms = 20
forward = {{ url = "http://127.0.0.1:{receiver}/down", format = "json" }}
"#
    );
    let p = std::env::temp_dir()
        .join(format!("aqgate-test-forwarding-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::write(&p, format!("{}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    p
}

fn serve(db: &str, port: u16, topology: &std::path::Path, allow: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (forwarding)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(allow)
            .env(SECRET_ENV, SECRET),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarder_retries_a_failing_service_and_gives_up_after_max_retries() {
    let (rport, seen) = receiver().await;
    let db = fresh_url(Backend::Sqlite).await;
    let port = free_port();
    let topo = topology(rport);
    let s = serve(&db, port, &topo, &["--notify-allow", "127.0.0.1"]);
    let send =
        raw_send("AQUSER.RAW_INBOX", &[("<correlation>C-1</correlation><priority>3</priority>", "0A0B")], COMMIT);
    assert!(matches!(http(port, &send).await, aqgate_proto::idap::Response::Send(..)));
    wait_until("the reply", Duration::from_secs(30), || depth(&db, "AQUSER.RAW_REPLIES") == 1);
    assert_eq!(depth(&db, "AQUSER.RAW_INBOX"), 0, "taken once the service answered 2xx");
    let flaky: Vec<(HeaderMap, Vec<u8>)> =
        seen.all().iter().filter(|(p, _, _)| p == "flaky").map(|(_, h, b)| (h.clone(), b.clone())).collect();
    assert_eq!(flaky.len(), 3, "two failures, then success");
    for (i, (h, body)) in flaky.iter().enumerate() {
        assert_eq!(body, b"<raw>0A0B</raw>");
        let hv = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert_eq!(hv("content-type"), "application/xml");
        assert_eq!(
            (hv("aq-correlation"), hv("aq-priority"), hv("aq-queue")),
            ("C-1".into(), "3".into(), "AQUSER.RAW_INBOX".into())
        );
        assert_eq!(hv("aq-delivery-count"), i.to_string(), "each failure counts as a retry");
        let now =
            i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs())
                .expect("secs");
        assert!(aqgate_notify::verify_signature(SECRET, &hv("aq-signature"), &hv("aq-message-id"), body, now, 300));
        assert!(!aqgate_notify::verify_signature("other", &hv("aq-signature"), &hv("aq-message-id"), body, now, 300));
    }
    // The reply (RAW: the bytes of the answer) keeps the correlation; the two failure
    // answers are in the failure queue.
    let r = http(port, &receive("AQUSER.RAW_REPLIES", "<wait_time>0</wait_time>", COMMIT)).await;
    let m = &received(&r)[0];
    assert_eq!(raw_of(m), hex::encode_upper(b"<ack/>"));
    assert_eq!(m.header.correlation.as_deref(), Some("C-1"));
    assert_eq!(depth(&db, "AQUSER.RAW_FAILURES"), 2);

    // A service that always fails: after the queue's max_retries (5) the message is in the
    // queue table's exception queue, and the service saw 6 attempts, in JSON.
    let send = raw_send("AQUSER.RAW_DEAD", &[("", "0C")], COMMIT);
    assert!(matches!(http(port, &send).await, aqgate_proto::idap::Response::Send(..)));
    wait_until("the exception queue", Duration::from_secs(30), || depth(&db, "AQUSER.AQ$_RAW_TAB_E") == 1);
    let down: Vec<Vec<u8>> = seen.all().iter().filter(|(p, _, _)| p == "down").map(|(_, _, b)| b.clone()).collect();
    assert_eq!(down.len(), 6, "the first attempt and five retries");
    let v: serde_json::Value = serde_json::from_slice(&down[0]).expect("JSON body");
    assert_eq!(
        (v["queue"].as_str(), v["payload"].as_str(), v["delivery_count"].as_i64()),
        (Some("AQUSER.RAW_DEAD"), Some("0C"), Some(0))
    );
    assert_eq!(depth(&db, "AQUSER.RAW_DEAD"), 0);
    drop(s);

    // Without an allow rule a loopback target is refused: nothing is sent, the message stays.
    let db2 = fresh_url(Backend::Sqlite).await;
    let port2 = free_port();
    let s2 = serve(&db2, port2, &topo, &[]);
    let before = seen.all().len();
    assert!(matches!(
        http(port2, &raw_send("AQUSER.RAW_INBOX", &[("", "0D")], COMMIT)).await,
        aqgate_proto::idap::Response::Send(..)
    ));
    wait_until("the refusal in the log", Duration::from_secs(10), || s2.log().contains("forwarding target not usable"));
    assert!(s2.log().contains("is not allowed"), "{}", s2.log_tail(10));
    assert_eq!(seen.all().len(), before);
    assert_eq!(depth(&db2, "AQUSER.RAW_INBOX"), 1);
    let _ = std::fs::remove_file(&topo);
}
