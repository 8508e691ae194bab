//! Synchronous remote queue spaces through two real `aqgate serve` processes, when the
//! sender's answer was lost: what it is told when B performed the send (a retry under its key,
//! a proxy's 504 after the commit).

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
        .join(format!("aqgate-test-remote-doubt-{}.toml", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::write(&p, format!("{}\n{extra}", aqgate_admin::DEFAULT_TOPOLOGY)).expect("write topology");
    p
}

fn space(name: &str, url: &str) -> String {
    format!(
        "[[remote_queue_spaces]]\nname = \"{name}\"\nurl = \"{url}\"\nagent = \"scott\"\npassword_env = \"{PASSWORD_ENV}\"\n\
         queues = [ {{ name = \"ORDERS\", remote = \"AQUSER.RAW_QUE\" }} ]\n\
         [[grants]]\nuser = \"AQUSER\"\nqueue = \"{name}.ORDERS\"\nprivilege = \"enqueue\"\n"
    )
}

fn serve(db: &str, port: u16, topology: &std::path::Path, args: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (remote doubt)",
        aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db])
            .args(["--topology", topology.to_str().expect("utf-8")])
            .args(args)
            .env(PASSWORD_ENV, "tiger"),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// A TCP proxy to `upstream`: while `lose` is set, forwards the request and closes the
/// connection when the answer starts (B performed it, its answer lost); while `gateway`
/// is set, forwards the request, waits for B's answer and answers 504 instead (a reverse
/// proxy whose upstream timed out after it had performed the request).
async fn proxy(upstream: u16, lose: Arc<AtomicBool>, gateway: Arc<AtomicBool>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let (losing, gw) = (lose.load(Ordering::SeqCst), gateway.load(Ordering::SeqCst));
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
                } else if gw {
                    let mut first = [0u8; 1];
                    let _ = sr.read(&mut first).await;
                    let body = "<html>504 Gateway Time-out</html>";
                    let _ = cw
                        .write_all(
                            format!(
                                "HTTP/1.1 504 Gateway Time-out\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    let _ = cw.shutdown().await;
                } else {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                }
                up.abort();
            });
        }
    });
    port
}

async fn send_with(port: u16, headers: &[(&str, &str)], body: &str) -> Response {
    let mut rb = idap_request(&reqwest::Client::new(), &aqserv(port), SCOTT, body.to_string());
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.expect("post");
    parse_idap(&r.bytes().await.expect("body"))
}

fn fault_of(r: &Response) -> (i32, String) {
    match r {
        Response::Fault(f) => (f.code, f.message.clone()),
        other => panic!("not a fault: {other:?}"),
    }
}

/// B performed the send each time; A must never tell the sender "nothing was enqueued".
async fn performed_sends_are_not_reported_as_not_enqueued(a_backend: Backend, b_backend: Backend) {
    let (a_db, b_db) = (fresh_url(a_backend).await, fresh_url(b_backend).await);
    let (a_port, b_port) = (free_port(), free_port());
    let (lose, gateway) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let p = proxy(b_port, lose.clone(), Arc::new(AtomicBool::new(false))).await;
    let gw = proxy(b_port, Arc::new(AtomicBool::new(false)), gateway.clone()).await;
    let a_topo = topology_file(&format!(
        "{}\n{}",
        space("VIA", &format!("http://127.0.0.1:{p}/aqserv")),
        space("GW", &format!("http://127.0.0.1:{gw}/aqserv"))
    ));
    let b_topo = topology_file("");
    // B keeps idempotent responses up to 100 bytes whole (a big batch's answer is larger
    // than the default 256 KiB: some 6,000 message ids).
    let _b = serve(&b_db, b_port, &b_topo, &["--idempotency-max-response-bytes", "100"]);
    let _a = serve(&a_db, a_port, &a_topo, &[]);
    let mut problems = Vec::new();

    // 1. B's answer lost, then the client's retry under its key: B says it performed the
    //    first (24062). The sender must not be told that nothing was enqueued.
    lose.store(true, Ordering::SeqCst);
    let body = raw_send("VIA.ORDERS", &[("<correlation>once</correlation>", "10")], COMMIT);
    let key = [("idempotency-key", "doubt-once")];
    let (c, m) = fault_of(&send_with(a_port, &key, &body).await);
    assert_eq!(c, code::INTERNAL, "{m}");
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 1, "B performed it");
    lose.store(false, Ordering::SeqCst);
    let r = send_with(a_port, &key, &body).await;
    if let Response::Fault(f) = &r
        && (f.message.contains("nothing was enqueued") || f.code == code::REMOTE_SYSTEM)
    {
        problems.push(format!("retry after a lost answer: {} {}", f.code, f.message));
    }
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 1, "still once at B");

    // 2. A reverse proxy in front of B answers 504 after B performed the send.
    gateway.store(true, Ordering::SeqCst);
    let r = send_with(a_port, &[], &raw_send("GW.ORDERS", &[("<correlation>gw</correlation>", "11")], COMMIT)).await;
    let (c, m) = fault_of(&r);
    assert_eq!(depth(&b_db, "AQUSER.RAW_QUE"), 2, "B performed it");
    if m.contains("nothing was enqueued") || c == code::REMOTE_SYSTEM {
        problems.push(format!("504 from a proxy after B performed it: {c} {m}"));
    }
    for f in [a_topo, b_topo] {
        let _ = std::fs::remove_file(f);
    }
    assert!(problems.is_empty(), "the sender was told nothing was enqueued, B has it:\n{}", problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn performed_sends_are_not_reported_as_not_enqueued_sqlite_to_postgres() {
    performed_sends_are_not_reported_as_not_enqueued(Backend::Sqlite, Backend::Postgres).await;
}
