//! Notifications through the real binary: `aqgate serve` delivers AQXmlNotification to a
//! real HTTP receiver (one that answers at once, one that fails first and succeeds later),
//! signs with the registration's secret, notifies nobody for a rolled-back enqueue, keeps
//! the allowlist at delivery time (parking what it refuses), survives kill -9 between commit
//! and dispatch, runs alone as `aqgate notify` on PostgreSQL (LISTEN/NOTIFY), and mails
//! `mailto:` aliases resolved through the directory.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_proto::idap::{self, Limits, Response};
use axum::http::{HeaderMap, StatusCode};
use common::*;

const RAWQ: &str = "AQUSER.RAW_QUE";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aqgate-notify-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `aqgate serve --no-smtp` on `port` with extra arguments; waits until it listens.
fn serve(db: &str, port: u16, extra: &[&str]) -> Proc {
    let mut args = vec!["serve", "--no-smtp", "--listen"];
    let listen = format!("127.0.0.1:{port}");
    args.push(&listen);
    args.extend(["--database", db]);
    args.extend(extra);
    let mut p = Proc::spawn("aqgate serve", aqgate(&args).env("AQGATE_LOG", "info"));
    p.wait_port(port);
    p
}

fn admin(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(BIN).arg("admin").args(args).envs(env.iter().copied()).output().expect("run admin");
    assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn register(dest: &str, url: &str) -> String {
    envelope(&format!(
        r#"<AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{dest}</destination><notify_url>{url}</notify_url></register_options><AQXmlCommit/></AQXmlRegister>"#
    ))
}

#[derive(Clone, Debug)]
struct Hit {
    path: String,
    headers: HashMap<String, String>,
    body: String,
    status: u16,
}

/// A real HTTP receiver: `/ok` answers 200; `/flaky` answers 503 to its first two
/// requests, then 200. Every request is recorded.
#[derive(Clone, Default)]
struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Receiver {
    async fn start() -> (Self, u16) {
        let me = Self::default();
        let app = axum::Router::new().route(
            "/{*path}",
            axum::routing::post({
                let me = me.clone();
                move |axum::extract::Path(path): axum::extract::Path<String>, headers: HeaderMap, body: String| {
                    let me = me.clone();
                    async move {
                        let mut hits = me.hits.lock().unwrap_or_else(|p| p.into_inner());
                        let earlier = hits.iter().filter(|h| h.path == path).count();
                        let status = if path == "flaky" && earlier < 2 { 503 } else { 200 };
                        hits.push(Hit {
                            path,
                            headers: headers
                                .iter()
                                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                                .collect(),
                            body,
                            status,
                        });
                        StatusCode::from_u16(status).unwrap_or(StatusCode::OK)
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

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (bounded) until a 2xx-answered request carries `msgid`; returns all requests
    /// for it.
    async fn wait_for(&self, msgid: &str, within: Duration) -> Vec<Hit> {
        let deadline = Instant::now() + within;
        loop {
            let hits: Vec<Hit> = self.hits().into_iter().filter(|h| h.body.contains(msgid)).collect();
            if hits.iter().any(|h| h.status == 200) {
                return hits;
            }
            assert!(Instant::now() < deadline, "no notification for {msgid} within {within:?}; got {:?}", self.hits());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn msgid(r: &Response) -> String {
    sent_ids(r).into_iter().next().expect("one message id")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_notifications_are_delivered_signed_retried_and_transactional() {
    let (rx, rport) = Receiver::start().await;
    let db = fresh_sqlite_url();
    let port = free_port();
    let _s = serve(&db, port, &["--notify-allow", "public,127.0.0.1"]);
    // The default allowlist refuses loopback targets other than those configured.
    let r = idap(port, "scott", "tiger", &register(RAWQ, "http://127.0.0.2:9/x")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NOT_PERMITTED), "{r:?}");
    // scott's registration answers at once, john's fails twice first.
    let r = idap(port, "scott", "tiger", &register(RAWQ, &format!("http://127.0.0.1:{rport}/ok"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let r = idap(port, "john", "welcome", &register(RAWQ, &format!("http://127.0.0.1:{rport}/flaky"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let out = admin(
        &["registrations", "--database", &db, "--set-secret", RAWQ, "-", "scott"],
        &[("AQGATE_NOTIFY_SECRET", "s3cret")],
    );
    assert!(out.contains("secret set"), "{out}");

    // A rolled-back enqueue notifies nobody; the committed one after it is notified.
    let mut c = None;
    let rolled =
        msgid(&idap_in(port, SCOTT, &mut c, &raw_send(RAWQ, &[("<correlation>ROLLED</correlation>", "0A")], "")).await);
    assert!(matches!(idap_in(port, SCOTT, &mut c, &envelope(ROLLBACK)).await, Response::Rollback(_)));
    let sent = Instant::now();
    let id = msgid(
        &idap_in(port, SCOTT, &mut c, &raw_send(RAWQ, &[("<correlation>ORDER1</correlation>", "0B")], COMMIT)).await,
    );
    let ok = rx.wait_for(&id, Duration::from_secs(10)).await;
    let first = sent.elapsed();
    let ok: Vec<Hit> = ok.into_iter().filter(|h| h.path == "ok").collect();
    assert_eq!(ok.len(), 1, "{ok:?}");
    let h = &ok[0];
    // The body: AQXmlNotification with the destination and the message's properties.
    let doc = idap::parse_response(h.body.as_bytes(), &Limits::default()).expect("notification parses").body;
    match doc {
        Response::Notification(n) => {
            assert_eq!(n.destination, RAWQ);
            assert_eq!(n.consumer_name, None);
            assert_eq!(n.messages.len(), 1);
            assert_eq!(n.messages[0].message_id.as_deref(), Some(id.as_str()));
            assert_eq!(n.messages[0].correlation.as_deref(), Some("ORDER1"));
        }
        other => panic!("not a notification: {other:?}"),
    }
    assert!(h.headers["content-type"].starts_with("text/xml"));
    let nid = &h.headers["aq-notification-id"];
    assert!(nid.starts_with(&id), "stable id names the message: {nid}");
    let sig = &h.headers["aq-signature"];
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs() as i64;
    assert!(aqgate_notify::verify_signature("s3cret", sig, nid, h.body.as_bytes(), now, 300), "{sig}");
    assert!(!aqgate_notify::verify_signature("wrong", sig, nid, h.body.as_bytes(), now, 300));
    assert!(first < Duration::from_secs(2), "event-driven delivery took {first:?}");

    // john's receiver failed twice (503) and got it on the third attempt, same id.
    let flaky: Vec<Hit> =
        rx.wait_for(&id, Duration::from_secs(20)).await.into_iter().filter(|h| h.path == "flaky").collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut flaky = flaky;
    while !flaky.iter().any(|h| h.status == 200) {
        assert!(Instant::now() < deadline, "flaky receiver never got it: {flaky:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        flaky = rx.hits().into_iter().filter(|h| h.path == "flaky" && h.body.contains(&id)).collect();
    }
    assert_eq!(flaky.iter().map(|h| h.status).collect::<Vec<_>>(), [503, 503, 200]);
    assert!(flaky.iter().all(|h| h.headers["aq-notification-id"] != *nid), "john's notification has its own id");
    let ids: std::collections::HashSet<_> = flaky.iter().map(|h| h.headers["aq-notification-id"].clone()).collect();
    assert_eq!(ids.len(), 1, "retries carry the same id");
    assert_eq!(flaky.iter().map(|h| h.headers["aq-notification-attempt"].clone()).collect::<Vec<_>>(), ["1", "2", "3"]);
    assert!(!flaky[0].headers.contains_key("aq-signature"), "no secret, no signature");
    assert!(rx.hits().iter().all(|h| !h.body.contains(&rolled)), "the rolled-back message was notified");

    // Metrics and the admin listing agree: nothing pending. The dispatcher counts a delivery
    // when it records the outcome, a moment after the receiver answered.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        if m.contains("aqgate_notifications_delivered_total 2") || Instant::now() >= deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(m.contains("aqgate_notifications_delivered_total 2"), "{m}");
    assert!(m.contains("aqgate_notification_failures_total 2"), "{m}");
    assert!(m.contains("aqgate_notify_outbox_pending 0"), "{m}");
    let out = admin(&["notifications", "--database", &db], &[]);
    assert!(out.starts_with("0 pending, 0 parked"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_targets_are_parked_visibly_and_commits_survive_kill_dash_nine() {
    let (rx, rport) = Receiver::start().await;
    let db = fresh_sqlite_url();
    let port = free_port();
    // Without the dispatcher: notifications wait in the outbox.
    let s = serve(&db, port, &["--notify-allow", "127.0.0.1", "--no-notify"]);
    let r = idap(port, "scott", "tiger", &register(RAWQ, &format!("http://127.0.0.1:{rport}/ok"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let id = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", "0C")], COMMIT)).await);
    assert!(admin(&["notifications", "--database", &db], &[]).starts_with("1 pending, 0 parked"));
    // Crash between commit and dispatch.
    s.kill9();
    // Restarted with a policy that no longer allows the target: checked again at delivery,
    // parked at once (not retried), visible.
    let s = serve(&db, port, &["--notify-allow", "public"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = admin(&["notifications", "--database", &db], &[]);
        if out.starts_with("0 pending, 1 parked") {
            assert!(out.contains("not allowed"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "not parked: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(m.contains("aqgate_notify_outbox_parked 1"), "{m}");
    assert!(rx.hits().is_empty(), "a refused target got a request: {:?}", rx.hits());
    drop(s);
    // The operator allows it and puts it back in line: delivered, exactly the committed one.
    let out = admin(&["notifications", "--database", &db, "--retry-parked"], &[]);
    assert!(out.contains("1 parked notification(s) put back"), "{out}");
    let _s = serve(&db, port, &["--notify-allow", "127.0.0.1"]);
    let hits = rx.wait_for(&id, Duration::from_secs(10)).await;
    assert_eq!(hits.len(), 1, "{hits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_dispatcher_on_postgres_is_woken_by_listen_notify() {
    let (rx, rport) = Receiver::start().await;
    let db = fresh_pg_url().await;
    let port = free_port();
    let _s = serve(&db, port, &["--notify-allow", "127.0.0.1", "--no-notify"]);
    let _n = Proc::spawn("aqgate notify", &mut aqgate(&["notify", "--database", &db, "--notify-allow", "127.0.0.1"]));
    let r = idap(port, "scott", "tiger", &register(RAWQ, &format!("http://127.0.0.1:{rport}/ok"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    // Give the dispatcher time to start and to see the registration (it reloads which
    // queues have registrations every 2 s); then each commit must wake it at once. Left to
    // its 2-second timer a notification would wait 0-2 s, so eight in a row at uneven
    // spacing all within 1 s would be chance once in 256 runs; woken by LISTEN/NOTIFY they
    // take milliseconds (the bound leaves room for a loaded CI machine running debug builds).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut took = Vec::new();
    for i in 0..8u64 {
        let t = Instant::now();
        let id = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", &format!("D{i}"))], COMMIT)).await);
        let hits = rx.wait_for(&id, Duration::from_secs(10)).await;
        assert_eq!(hits.len(), 1);
        took.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(150 + 170 * (i % 3))).await;
    }
    assert!(took.iter().all(|t| *t < Duration::from_secs(1)), "woken by LISTEN/NOTIFY? took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mailto_alias_notifications_are_mailed() {
    let dir = scratch("mailto");
    let outbox = dir.join("outbox");
    let db = fresh_sqlite_url();
    let port = free_port();
    let _s = serve(
        &db,
        port,
        &["--mail-outbox", outbox.to_str().expect("utf-8 path"), "--notify-from", "aq@aqgate.example"],
    );
    // ORDERS_DESK is a notification alias in the (embedded) directory: mailto:scott@example.com.
    let r = idap(port, "scott", "tiger", &register(RAWQ, "mailto:ORDERS_DESK")).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let id = msgid(
        &idap(port, "scott", "tiger", &raw_send(RAWQ, &[("<correlation>MAILED</correlation>", "0E")], COMMIT)).await,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mail = loop {
        let found = std::fs::read_dir(&outbox)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .find(|m| m.contains(&id));
        if let Some(m) = found {
            break m;
        }
        assert!(Instant::now() < deadline, "no notification mail in {}", outbox.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(mail.contains("To: scott@example.com"), "{mail}");
    assert!(mail.contains("From: aq@aqgate.example"), "{mail}");
    assert!(mail.contains("Content-Type: text/xml"), "{mail}");
    assert!(mail.contains(&format!("X-AQ-Notification-Id: {id}-")), "{mail}");
    assert!(mail.contains("AQXmlNotification") && mail.contains("MAILED"), "{mail}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mail files in `outbox` (not its `tmp/`).
fn mails(outbox: &std::path::Path) -> Vec<String> {
    let files = std::fs::read_dir(outbox).into_iter().flatten().flatten().filter(|e| e.path().is_file());
    files.map(|e| std::fs::read_to_string(e.path()).unwrap_or_default()).collect()
}

/// Both notification policies through the binary: IPv6 forms of loopback and metadata
/// addresses are refused at registration (1031), and so are mail addresses outside
/// `--notify-mail-allow` (by default the directory's mailboxes); an address allowed when it
/// was registered and not by the policy at delivery is parked there, never mailed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_targets_are_held_to_both_policies() {
    let dir = scratch("policies");
    let outbox = dir.join("outbox");
    let db = fresh_sqlite_url();
    let port = free_port();
    let refused = |r: Response| match r {
        Response::Fault(f) if f.code == 1031 => f.message,
        other => panic!("not refused with 1031: {other:?}"),
    };
    let s = serve(&db, port, &["--no-notify", "--notify-mail-allow", "any"]);
    for v6 in ["[::127.0.0.1]", "[::a9fe:a9fe]", "[::ffff:0:127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::1]"] {
        let m = refused(idap(port, "scott", "tiger", &register(RAWQ, &format!("http://{v6}:9/x"))).await);
        assert!(m.contains("not allowed"), "{v6}: {m}");
    }
    let r = idap(port, "scott", "tiger", &register(RAWQ, "mailto:stranger@elsewhere.test")).await;
    assert!(matches!(r, Response::Register(_)), "`any` allows it: {r:?}");
    let first = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", "0F")], COMMIT)).await);
    drop(s);
    let outbox_arg = outbox.to_str().expect("utf-8 path");
    let _s = serve(&db, port, &["--mail-outbox", outbox_arg, "--notify-from", "aq@aqgate.example"]);
    let m = refused(idap(port, "john", "welcome", &register(RAWQ, "mailto:other@elsewhere.test")).await);
    assert!(m.contains("other@elsewhere.test") && m.contains("--notify-mail-allow"), "{m}");
    let r = idap(port, "john", "welcome", &register(RAWQ, "mailto:john@example.com")).await;
    assert!(matches!(r, Response::Register(_)), "john's mailbox in the directory: {r:?}");
    let second = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", "10")], COMMIT)).await);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = admin(&["notifications", "--database", &db], &[]);
        let mailed = mails(&outbox).iter().any(|m| m.contains(&second) && m.contains("To: john@example.com"));
        if out.starts_with("0 pending, 2 parked") && mailed {
            assert!(out.contains("stranger@elsewhere.test is not allowed"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "not parked and mailed: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = mails(&outbox);
    assert_eq!(all.len(), 1, "only john's notification was mailed");
    assert!(all.iter().all(|m| !m.contains("stranger@") && !m.contains(&first)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An HTTPS receiver with the TEST ONLY gateway certificate (localhost, 127.0.0.1; signed by
/// certs/ca.pem): answers every request 200 and records the bodies.
async fn tls_receiver() -> (Arc<Mutex<Vec<String>>>, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/certs");
    let cert = std::fs::read(format!("{dir}/gateway-tls.pem")).expect("cert");
    let key = std::fs::read(format!("{dir}/gateway-tls.key.pem")).expect("key");
    let acceptor = aqgate_mail::acceptor::tls_acceptor(&cert, &key).expect("tls acceptor");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let b = bodies.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (acceptor, b) = (acceptor.clone(), b.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then Content-Length bytes of body.
                let body = loop {
                    let Ok(n) = tls.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                        }
                    }
                };
                b.lock().unwrap_or_else(|p| p.into_inner()).push(body);
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (bodies, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_are_verified_against_the_configured_ca() {
    let (bodies, rport) = tls_receiver().await;
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/certs/ca.pem");
    // Trusting the TEST ONLY CA: delivered over TLS.
    let db = fresh_sqlite_url();
    let port = free_port();
    let s = serve(&db, port, &["--notify-allow", "127.0.0.1", "--notify-ca-file", ca, "--notify-timeout", "2"]);
    let r = idap(port, "scott", "tiger", &register(RAWQ, &format!("https://127.0.0.1:{rport}/tls"))).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let id = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", "0F")], COMMIT)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !bodies.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|b| b.contains(&id)) {
        assert!(Instant::now() < deadline, "no notification over https");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Recorded as delivered before the server stops (else the next one owes it again).
    while !admin(&["notifications", "--database", &db], &[]).starts_with("0 pending") {
        assert!(Instant::now() < deadline, "the delivery is not recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(s);
    // Without that CA the certificate is not trusted: nothing is delivered, the attempt fails
    // and is retried (it stays pending, with the TLS error).
    let _s = serve(&db, port, &["--notify-allow", "127.0.0.1", "--notify-timeout", "2"]);
    let id2 = msgid(&idap(port, "scott", "tiger", &raw_send(RAWQ, &[("", "10")], COMMIT)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = admin(&["notifications", "--database", &db], &[]);
        if out.starts_with("1 pending") && out.lines().any(|l| l.contains(&id2) && !l.ends_with(" -")) {
            break;
        }
        assert!(Instant::now() < deadline, "the untrusted target's failure is not recorded: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(bodies.lock().unwrap_or_else(|p| p.into_inner()).iter().all(|b| !b.contains(&id2)));
}
