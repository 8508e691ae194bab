//! Synchronous remote queue spaces (the default) through two real `aqgate serve`
//! processes, each backend on each side: A maps spaces to B (and to ports where nothing
//! listens, a host that does not resolve, a path of B that is no servlet, and a proxy that
//! loses B's answers). A send is answered with B's message ids or with B's refusal mapped
//! to a fault, and nothing of a refused or unreachable send is kept anywhere; a scheduled
//! send waits at B until its time; a send inside an open transaction is refused; a retry
//! under the same Idempotency-Key after a lost answer enqueues nothing twice at B. A
//! store-and-forward space keeps the old behaviour and stops retrying after its
//! `retry_max_age`, counted.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

const PASSWORD_ENV: &str = "AQGATE_TEST_REMOTE_PASSWORD";

fn topology_file(extra: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir()
        .join(format!("aqgate-test-remote-sync-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::write(&p, format!("{}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    p
}

/// A space named `name` at `url` mapping `queues` (name, remote), with `more` keys, and the
/// grants scott needs to send to them and read their exception queues.
fn space(name: &str, url: &str, more: &str, queues: &[(&str, &str)]) -> String {
    let mut s = format!(
        "[[remote_queue_spaces]]\nname = \"{name}\"\nurl = \"{url}\"\nagent = \"scott\"\npassword_env = \"{PASSWORD_ENV}\"\n{more}\nqueues = [\n"
    );
    for (q, remote) in queues {
        s.push_str(&format!("  {{ name = \"{q}\", remote = \"{remote}\" }},\n"));
    }
    s.push_str("]\n");
    for (q, _) in queues {
        for (queue, privilege) in [(format!("{name}.{q}"), "enqueue"), (format!("{name}.{q}$E"), "dequeue")] {
            s.push_str(&format!("[[grants]]\nuser = \"AQUSER\"\nqueue = \"{queue}\"\nprivilege = \"{privilege}\"\n"));
        }
    }
    s
}

/// B's extra queue: multi-consumer, whose only subscriber takes priorities below 5.
const PICKY: &str = r#"
[[queue_tables]]
name = "AQUSER.PICKY_TAB"
payload_type = "RAW"
multiple_consumers = true

[[queues]]
name = "AQUSER.PICKY"
queue_table = "AQUSER.PICKY_TAB"

[[subscribers]]
queue = "AQUSER.PICKY"
name = "LOW"
rule = "priority < 5"
"#;

fn serve(db: &str, port: u16, topology: &std::path::Path, args: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (remote sync)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(args)
            .env(PASSWORD_ENV, "tiger"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// A TCP proxy to 127.0.0.1:`upstream` that, while `lose` is set when a connection comes,
/// forwards the request and closes the connection as soon as the answer starts: the remote
/// performed the request and its answer was lost on the way.
async fn lossy_proxy(upstream: u16, lose: Arc<AtomicBool>) -> u16 {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let losing = lose.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                if losing {
                    let mut first = [0u8; 1];
                    let _ = sr.read(&mut first).await;
                } else {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                }
                up.abort();
            });
        }
    });
    port
}

/// One IDAP request as scott with extra HTTP headers: the response and whether it was
/// replayed.
async fn send_with(port: u16, headers: &[(&str, &str)], body: &str) -> (Response, bool) {
    let mut rb = idap_request(&reqwest::Client::new(), &aqserv(port), SCOTT, body.to_string());
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.expect("post");
    assert_eq!(r.status(), 200);
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (parse_idap(&r.bytes().await.expect("body")), replayed)
}

fn fault_of(r: &Response) -> (i32, String) {
    match r {
        Response::Fault(f) => (f.code, f.message.clone()),
        other => panic!("not a fault: {other:?}"),
    }
}

/// Every (message id, correlation, payload) in `queue` (received and committed as scott).
async fn drain(port: u16, queue: &str) -> Vec<(String, Option<String>, String)> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(queue, "<wait_time>0</wait_time>", COMMIT)).await;
        match &r {
            Response::Receive(_, Some(_)) => {
                out.extend(received(&r).iter().map(|m| {
                    (m.header.message_id.clone().unwrap_or_default(), m.header.correlation.clone(), raw_of(m))
                }))
            }
            Response::Fault(f) if f.code == code::NO_MESSAGE => return out,
            other => panic!("receive from {queue}: {other:?}"),
        }
    }
}

/// The depths of every queue of A's spaces and of their exception queues.
fn space_depths(db: &str) -> Vec<(String, i64)> {
    depths(db).into_iter().filter(|(q, d)| !q.starts_with("AQUSER.") && q.contains('.') && *d != 0).collect()
}

async fn synchronous_sends_answer_the_remotes_status(a_backend: Backend, b_backend: Backend) {
    let (a_db, b_db) = (fresh_url(a_backend).await, fresh_url(b_backend).await);
    let (a_port, b_port, down) = (free_port(), free_port(), free_port());
    let lose = Arc::new(AtomicBool::new(true));
    let proxy = lossy_proxy(b_port, lose.clone()).await;
    let b_url = format!("http://127.0.0.1:{b_port}/aqserv");
    let spaces = [
        space(
            "HQ",
            &b_url,
            "",
            &[
                ("ORDERS", "AQUSER.RAW_QUE"),
                ("MISSING", "AQUSER.NO_SUCH_QUEUE"),
                ("LOCKED", "OE.OE_NEW_ORDERS_QUE"),
                ("TEXTS", "AQUSER.JMS_TEXTQ"),
                ("PICKY", "AQUSER.PICKY"),
            ],
        ),
        space("FLAKY", &format!("http://127.0.0.1:{proxy}/aqserv"), "", &[("ORDERS", "AQUSER.RAW_QUE")]),
        space("BROKEN", &format!("http://127.0.0.1:{b_port}/nowhere"), "", &[("ORDERS", "AQUSER.RAW_QUE")]),
        space("DOWN", &format!("http://127.0.0.1:{down}/aqserv"), "", &[("ORDERS", "AQUSER.RAW_QUE")]),
        space("NOHOST", "http://aqgate-test.invalid/aqserv", "", &[("ORDERS", "AQUSER.RAW_QUE")]),
    ];
    let (a_topo, b_topo) = (topology_file(&spaces.join("\n")), topology_file(PICKY));
    let _b = serve(&b_db, b_port, &b_topo, &["--max-body", "4096"]);
    let a = serve(&a_db, a_port, &a_topo, &[]);

    // Two messages: answered with B's ids, at B at once, nothing kept here.
    let (r, _) =
        send_with(a_port, &[], &raw_send("HQ.ORDERS", &[("<correlation>one</correlation>", "01"), ("", "02")], COMMIT))
            .await;
    let ids = sent_ids(&r);
    assert_eq!(ids.len(), 2, "{r:?}");
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 2, "committed at B before the answer");
    assert_eq!(space_depths(&a_db), [], "nothing stored here");
    let got = drain(b_port, "AQUSER.RAW_QUE").await;
    let at_b: Vec<(String, String)> = got.iter().map(|(id, _, p)| (id.clone(), p.clone())).collect();
    assert_eq!(at_b, [(ids[0].clone(), "01".to_string()), (ids[1].clone(), "02".to_string())]);
    assert_eq!(got[0].1.as_deref(), Some("one"));

    // A scheduled send waits at B until its time.
    let at = (chrono::Utc::now() + chrono::Duration::seconds(4)).to_rfc3339();
    let (r, _) = send_with(a_port, &[("aq-schedule", &at)], &raw_send("HQ.ORDERS", &[("", "03")], COMMIT)).await;
    assert_eq!(sent_ids(&r).len(), 1, "{r:?}");
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 1);
    assert_eq!(drain(b_port, "AQUSER.RAW_QUE").await, [], "not before its time");
    wait_depth(&b_db, "AQUSER.RAW_QUE", 1, Duration::from_secs(1));
    std::thread::sleep(Duration::from_secs(5));
    let got = drain(b_port, "AQUSER.RAW_QUE").await;
    assert_eq!(got.iter().map(|(_, _, p)| p.as_str()).collect::<Vec<_>>(), ["03"], "at its time");

    // Each refusal, mapped; nothing of it anywhere.
    let big = "AB".repeat(3000);
    let refusals: Vec<(String, i32, &str)> = vec![
        (
            raw_send("HQ.MISSING", &[("", "04")], COMMIT),
            code::NO_SUCH_QUEUE,
            "queue HQ.MISSING does not exist at remote queue space HQ (AQUSER.NO_SUCH_QUEUE at",
        ),
        (raw_send("HQ.LOCKED", &[("", "05")], COMMIT), code::INVALID_VALUE, "refused the send: remote fault 1031"),
        (raw_send("HQ.TEXTS", &[("", "06")], COMMIT), code::INVALID_VALUE, "refused the send: remote fault 25215"),
        (
            raw_send("HQ.PICKY", &[("<priority>1</priority>", "07"), ("<priority>9</priority>", "08")], COMMIT),
            code::INVALID_VALUE,
            "refused the send: remote fault 24033",
        ),
        (raw_send("HQ.ORDERS", &[("", "09"), ("", &big)], COMMIT), code::REMOTE_NO_SPACE, "HTTP 413"),
        (raw_send("BROKEN.ORDERS", &[("", "0A")], COMMIT), code::REMOTE_SYSTEM, "failed the send: HTTP 404"),
        (raw_send("DOWN.ORDERS", &[("", "0B")], COMMIT), code::REMOTE_UNREACHABLE, "the send was not performed"),
        (raw_send("NOHOST.ORDERS", &[("", "0C")], COMMIT), code::REMOTE_UNREACHABLE, "is unreachable"),
        (
            raw_send("HQ.ORDERS", &[("", "0D")], ""),
            code::INVALID_VALUE,
            "is a queue of synchronous remote queue space HQ: a send to it is forwarded at once and must be its whole transaction",
        ),
    ];
    for (body, want, text) in &refusals {
        let (c, m) = fault_of(&send_with(a_port, &[], body).await.0);
        assert_eq!(c, *want, "{m}");
        assert!(m.contains(text), "{text}: {m}");
        assert!(m.contains("nothing was enqueued") || m.contains("not performed") || c == code::INVALID_VALUE, "{m}");
    }
    // Inside a transaction another send opened: refused, and the transaction is the client's.
    let mut cookie = None;
    let r = idap_in(a_port, SCOTT, &mut cookie, &raw_send("AQUSER.RAW_QUE", &[("", "0E")], "")).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let r = idap_in(a_port, SCOTT, &mut cookie, &raw_send("HQ.ORDERS", &[("", "0F")], COMMIT)).await;
    let (c, m) = fault_of(&r);
    assert_eq!(c, code::INVALID_VALUE, "{m}");
    assert!(m.contains("in no open transaction"), "{m}");
    let r = idap_in(a_port, SCOTT, &mut cookie, &envelope(ROLLBACK)).await;
    assert!(matches!(r, Response::Rollback(..)), "{r:?}");
    for q in ["AQUSER.RAW_QUE", "AQUSER.PICKY", "AQUSER.JMS_TEXTQ", "OE.OE_NEW_ORDERS_QUE"] {
        assert_eq!(depth(&b_db, q), 0, "{q} at B");
    }
    assert_eq!(space_depths(&a_db), [], "nothing stored here, no exception");
    assert_eq!(depth(&a_db, "AQUSER.RAW_QUE"), 0);
    assert!(a.log().contains("a synchronous send to a remote queue space was not answered"), "logged");

    // B's answer lost: may or may not; B has it. The retry under the same key is B's
    // replay, then this process's; B holds one message.
    let body = raw_send("FLAKY.ORDERS", &[("<correlation>once</correlation>", "10")], COMMIT);
    let key = [("idempotency-key", "remote-sync-once")];
    let (r, _) = send_with(a_port, &key, &body).await;
    let (c, m) = fault_of(&r);
    assert_eq!(c, code::INTERNAL, "{m}");
    assert!(m.contains("may or may not have been performed"), "{m}");
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 1, "B performed it");
    lose.store(false, Ordering::SeqCst);
    let (r, replayed) = send_with(a_port, &key, &body).await;
    let ids = sent_ids(&r);
    assert!(!replayed, "not performed here before");
    let (r2, replayed) = send_with(a_port, &key, &body).await;
    assert!(replayed, "recorded here now");
    assert_eq!(sent_ids(&r2), ids);
    let got = drain(b_port, "AQUSER.RAW_QUE").await;
    assert_eq!(got, [(ids[0].clone(), Some("once".into()), "10".into())], "once at B, the id answered");
    assert_eq!(space_depths(&a_db), []);
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_sends_answer_the_remotes_status_sqlite_to_postgres() {
    synchronous_sends_answer_the_remotes_status(Backend::Sqlite, Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_sends_answer_the_remotes_status_postgres_to_sqlite() {
    synchronous_sends_answer_the_remotes_status(Backend::Postgres, Backend::Sqlite).await;
}

/// Store and forward to a remote that never answers: the send is answered at once and
/// kept here (its `AQ$` view shows it); past `retry_max_age` it is in the exception queue
/// with the reason, counted.
async fn store_and_forward_gives_up_after_retry_max_age(backend: Backend) {
    let a_db = fresh_url(backend).await;
    let (a_port, down) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{down}/aqserv");
    let spaces = [
        space(
            "SAF",
            &url,
            "store_and_forward = true\nretry_max_age = 3\nretry_backoff_ms = 200",
            &[("ORDERS", "AQUSER.RAW_QUE")],
        ),
        space("HELD", &url, "store_and_forward = true\nretry_backoff_ms = 200", &[("ORDERS", "AQUSER.RAW_QUE")]),
    ];
    let a_topo = topology_file(&spaces.join("\n"));
    let a = serve(&a_db, a_port, &a_topo, &[]);
    for q in ["SAF.ORDERS", "HELD.ORDERS"] {
        let (r, _) = send_with(a_port, &[], &raw_send(q, &[("<correlation>kept</correlation>", "AB")], COMMIT)).await;
        assert_eq!(sent_ids(&r).len(), 1, "{q}: {r:?}");
    }
    wait_depth(&a_db, "SAF.ORDERS$E", 1, Duration::from_secs(30));
    assert_eq!(depth(&a_db, "SAF.ORDERS"), 0);
    let got = drain(a_port, "SAF.ORDERS$E").await;
    assert_eq!(got.len(), 1, "{got:?}");
    let reason = got[0].1.clone().unwrap_or_default();
    assert!(reason.starts_with("not delivered within retry_max_age 3 s: http://127.0.0.1:"), "{reason}");
    assert_eq!(got[0].2, "AB");
    assert_eq!(metric(a_port, "aqgate_propagation_gave_up_total{job=\"SAF.ORDERS\"}"), 1);
    assert_eq!(metric(a_port, "aqgate_propagation_exceptions_total{job=\"SAF.ORDERS\"}"), 1);
    assert!(a.log().contains("the remote did not take a message within the space's retry_max_age"), "logged");

    // The other keeps its message (a day's retries) and its view shows it.
    assert_eq!(depth(&a_db, "HELD.ORDERS"), 1);
    assert_eq!(depth(&a_db, "HELD.ORDERS$E"), 0);
    let out = std::process::Command::new(BIN)
        .args(["admin", "messages", "HELD.ORDERS", "--database", &a_db, "--json"])
        .env_remove("AQGATE_CONFIG")
        .output()
        .expect("admin messages");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["CORR_ID"], "kept", "{rows:?}");
    let _ = std::fs::remove_file(a_topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_forward_gives_up_after_retry_max_age_sqlite() {
    store_and_forward_gives_up_after_retry_max_age(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_forward_gives_up_after_retry_max_age_postgres() {
    store_and_forward_gives_up_after_retry_max_age(Backend::Postgres).await;
}
