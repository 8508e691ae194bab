//! The forwarding worker against a real servlet over HTTP: a spooled mail is posted once
//! on behalf of its agent, the response is mailed back (lettre file transport), a re-sent
//! copy gets the original response again, open work is rolled back and the reply says
//! so, and an unreachable servlet is retried with backoff.

mod common;

use std::path::Path;
use std::sync::Arc;

use aqgate_core::clock::{Clock, ManualClock};
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::store::{SpoolPut, Store};
use aqgate_http::servlet::{AppState, app};
use aqgate_mail::worker::{ReplyTransport, Worker, WorkerConfig};
use aqgate_proto::idap::Limits;
use common::*;

fn replies(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "eml")).collect())
        .unwrap_or_default();
    v.sort_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    v.iter().map(|e| readable(&std::fs::read_to_string(e.path()).expect("read eml"))).collect()
}

async fn depth(store: &dyn Store, q: &str) -> i64 {
    aqgate_admin::queues(store)
        .await
        .expect("queues")
        .into_iter()
        .find(|x| x.name == q)
        .map(|x| x.depth)
        .expect("queue")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_mail_is_forwarded_once_and_answered() {
    let url = fresh_sqlite_url();
    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let clock = Arc::new(ManualClock::new(T0));
    let engine =
        Engine::start(store.clone(), clock.clone() as Arc<dyn Clock>, EngineConfig::default()).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let servlet_url = format!("http://{}/aqserv", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app(AppState::new(engine, Limits::default()))).await });
    let outbox = std::env::temp_dir().join(format!("aqgate-outbox-{}", aqgate_core::engine::session::random_id()));
    let cfg = |servlet_url: &str| WorkerConfig {
        servlet_url: servlet_url.to_string(),
        gateway_agent: "aqgateway".into(),
        gateway_password: "gateway-demo".into(),
        reply_from: "aq@localhost".into(),
        transport: ReplyTransport::Files(outbox.clone()),
        max_attempts: 5,
        dedupe_window: std::time::Duration::from_secs(7 * 24 * 3600),
        identity: None,
        claim_owner: "test:1:worker".into(),
    };

    // The servlet is unreachable at first: the mail waits, with backoff.
    let dead = Arc::new(Worker::new(store.clone(), clock.clone() as Arc<dyn Clock>, cfg("http://127.0.0.1:9/aqserv")));
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let SpoolPut::New(id) = store.spool_put(&spooled("<order-1@example.com>", &send)).await.expect("spool") else {
        panic!("new mail")
    };
    assert_eq!(dead.run_once().await.expect("run"), 1);
    let m = store.spool_get(id).await.expect("get").expect("row");
    assert_eq!((m.state.as_str(), m.attempts), ("new", 1));
    assert!(m.last_error.as_deref().is_some_and(|e| e.contains("unreachable")), "{m:?}");
    assert_eq!(dead.run_once().await.expect("run"), 0, "not due before its backoff");

    // The servlet is there: forwarded on behalf of scott, answered by mail.
    let worker = Arc::new(Worker::new(store.clone(), clock.clone() as Arc<dyn Clock>, cfg(&servlet_url)));
    clock.advance_secs(2);
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 1);
    let r = replies(&outbox);
    assert_eq!(r.len(), 1);
    assert!(r[0].contains("AQXmlSendResponse") && r[0].contains("QS.NEW_ORDERS_QUE"), "{}", r[0]);
    assert!(r[0].contains("In-Reply-To: <order-1@example.com>") && r[0].contains("Subject: Re: new order"), "{}", r[0]);
    assert!(r[0].contains("To: scott@example.com") && r[0].contains("text/xml"), "{}", r[0]);

    // The same mail again: not forwarded twice, answered again with the same response.
    assert_eq!(
        store.spool_put(&spooled("<order-1@example.com>", &send)).await.expect("spool"),
        SpoolPut::Duplicate(id)
    );
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 1, "forwarded once");
    let r = replies(&outbox);
    assert_eq!(r.len(), 2);
    let id_of = |s: &str| s.split("<message_id>").nth(1).and_then(|x| x.split('<').next()).map(String::from);
    assert_eq!(id_of(&r[0]), id_of(&r[1]), "the original response again");

    // Past the dedupe window (7 days) the finished mail is forgotten; the same mail again
    // is then a new request.
    clock.advance_secs(7 * 24 * 3600 + 1);
    worker.purge().await;
    assert!(store.spool_get(id).await.expect("get").is_none(), "forgotten after the window");
    let SpoolPut::New(again) = store.spool_put(&spooled("<order-1@example.com>", &send)).await.expect("spool") else {
        panic!("a new request after the window")
    };
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 2, "performed again after the window");
    assert_eq!(store.spool_get(again).await.expect("get").map(|m| m.state), Some("done".into()));
    let r = replies(&outbox);
    assert_eq!(r.len(), 3);

    // A mail that leaves ON_COMMIT work open: rolled back, and the reply says so.
    store.spool_put(&spooled("<order-2@example.com>", &example("01"))).await.expect("spool");
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 2, "the uncommitted send was rolled back");
    let r = replies(&outbox);
    assert!(r.iter().any(|m| m.contains("rolled back")), "{r:?}");
    assert_eq!(worker.run_once().await.expect("run"), 0, "nothing left to do");
    let _ = std::fs::remove_dir_all(&outbox);
}

/// A directory that fails in a chosen way, over the embedded demo directory otherwise.
struct FailingDirectory {
    inner: Arc<dyn aqgate_directory::Directory>,
    mail: Option<aqgate_directory::DirectoryError>,
    certs: Option<aqgate_directory::DirectoryError>,
}

#[async_trait::async_trait]
impl aqgate_directory::Directory for FailingDirectory {
    async fn resolve_queue(&self, name: &str) -> Result<String, aqgate_directory::DirectoryError> {
        self.inner.resolve_queue(name).await
    }
    async fn resolve_agent_alias(
        &self,
        alias: &str,
    ) -> Result<aqgate_directory::AgentEntry, aqgate_directory::DirectoryError> {
        self.inner.resolve_agent_alias(alias).await
    }
    async fn certificates(
        &self,
        at: &aqgate_directory::CertificateLocation,
    ) -> Result<Vec<Vec<u8>>, aqgate_directory::DirectoryError> {
        match &self.certs {
            Some(e) => Err(e.clone()),
            None => self.inner.certificates(at).await,
        }
    }
    async fn mail_address(&self, agent: &str) -> Result<Option<String>, aqgate_directory::DirectoryError> {
        match &self.mail {
            Some(e) => Err(e.clone()),
            None => self.inner.mail_address(agent).await,
        }
    }
    async fn agents_with_mail(&self, addr: &str) -> Result<Vec<String>, aqgate_directory::DirectoryError> {
        match &self.mail {
            Some(e) => Err(e.clone()),
            None => self.inner.agents_with_mail(addr).await,
        }
    }
    async fn resolve_notification_alias(&self, alias: &str) -> Result<String, aqgate_directory::DirectoryError> {
        self.inner.resolve_notification_alias(alias).await
    }
    fn invalidate(&self) {}
}

/// The SMTP decision when the directory misbehaves: temporary problems are 4xx (the
/// sender retries), a sender the directory does not know is 5xx; nothing is spooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_maps_directory_failures_to_smtp_replies() {
    use aqgate_directory::DirectoryError as D;
    let url = fresh_sqlite_url();
    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let clock: Arc<dyn Clock> = Arc::new(aqgate_core::clock::SystemClock);
    let engine = Engine::start(store.clone(), clock.clone(), EngineConfig::default()).await.expect("engine");
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |f: &str| std::fs::read(format!("{root}/certs/{f}")).expect("cert file");
    let trust = aqgate_mail::smime::TrustStore::from_pem(&[&read("ca.pem")], &[&read("ca.crl")]).expect("trust");
    let send = example("04");
    let mail = aqgate_mail::smime::sign(
        send.as_bytes(),
        &read("scott.pem"),
        &read("scott.key.pem"),
        "scott@example.com",
        "aq@localhost",
        "x",
    )
    .expect("sign");
    let embedded = aqgate_directory::open(&Default::default()).await.expect("embedded directory");
    let cases: Vec<(Option<D>, Option<D>, u16, &str)> = vec![
        (Some(D::Unavailable("ldap down".into())), None, 451, "4.4.3"),
        (None, Some(D::Unavailable("ldap down".into())), 451, "4.4.3"),
        (None, Some(D::Malformed("not X.509".into())), 451, "4.7.5"),
        (None, Some(D::NotFound("uid=scott".into())), 550, "5.7.1"),
        (Some(D::NotFound("scott".into())), None, 550, "5.7.1"),
        (None, None, 250, "2.0.0"),
    ];
    for (mail_err, cert_err, code, status) in cases {
        let what = format!("{mail_err:?} / {cert_err:?}");
        let gateway = aqgate_mail::acceptor::MailAcceptor {
            engine: engine.clone(),
            directory: Arc::new(FailingDirectory { inner: embedded.clone(), mail: mail_err, certs: cert_err }),
            trust: Arc::new(
                aqgate_mail::smime::TrustStore::from_pem(&[&read("ca.pem")], &[&read("ca.crl")]).expect("trust"),
            ),
            clock: clock.clone(),
            wake: Arc::new(tokio::sync::Notify::new()),
            reinject: None,
            replay_window: std::time::Duration::from_secs(168 * 3600),
            identity: None,
        };
        let reply = gateway.verify_and_spool(&mail).await;
        assert_eq!((reply.code, reply.status), (code, status), "{what}: {}", reply.text);
        let spooled = store.spool_pending(10).await.expect("pending").len();
        assert_eq!(spooled, usize::from(code == 250), "{what}: spooled only when accepted");
    }
    drop(trust);
}

/// A stand-in for Postfix's reinjection smtpd: accepts every transaction, records what it
/// was sent (one string per connection).
async fn fake_reinjection_server() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut s = BufReader::new(sock);
                let mut transcript = String::new();
                let _ = s.get_mut().write_all(b"220 fake ESMTP\r\n").await;
                let mut in_data = false;
                loop {
                    let mut line = String::new();
                    if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break;
                    }
                    transcript.push_str(&line);
                    let reply: &[u8] = if in_data {
                        if line != ".\r\n" {
                            continue;
                        }
                        in_data = false;
                        b"250 2.0.0 Ok: queued as FAKE1\r\n"
                    } else {
                        match line.get(..4).unwrap_or("").to_ascii_uppercase().as_str() {
                            "EHLO" => b"250-fake\r\n250 8BITMIME\r\n",
                            "DATA" => {
                                in_data = true;
                                b"354 go ahead\r\n"
                            }
                            "QUIT" => b"221 2.0.0 bye\r\n",
                            _ => b"250 2.0.0 ok\r\n",
                        }
                    };
                    let _ = s.get_mut().write_all(reply).await;
                }
                log.lock().expect("lock").push(transcript);
            });
        }
    });
    (addr, seen)
}

/// Before-queue content filter (`--smtp-reinject`): which recipients are handed on, when,
/// and what the client is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_hands_other_recipients_on_after_the_request_is_spooled() {
    use aqgate_mail::reinject::Reinjector;
    use aqgate_mail::smtp::{Acceptor, MailEnvelope, Recipient};
    let url = fresh_sqlite_url();
    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let clock: Arc<dyn Clock> = Arc::new(aqgate_core::clock::SystemClock);
    let engine = Engine::start(store.clone(), clock.clone(), EngineConfig::default()).await.expect("engine");
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |f: &str| std::fs::read(format!("{root}/certs/{f}")).expect("cert file");
    let signed = |idap: &str| {
        aqgate_mail::smime::sign(
            idap.as_bytes(),
            &read("scott.pem"),
            &read("scott.key.pem"),
            "scott@example.com",
            "aq@localhost",
            "x",
        )
        .expect("sign")
    };
    let unsigned = b"From: scott@example.com\r\nSubject: x\r\n\r\nhello\r\n".to_vec();
    let (addr, seen) = fake_reinjection_server().await;
    let down = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").to_string();
    let directory = aqgate_directory::open(&Default::default()).await.expect("embedded directory");
    let gateway = |to: &str| aqgate_mail::acceptor::MailAcceptor {
        engine: engine.clone(),
        directory: directory.clone(),
        trust: Arc::new(
            aqgate_mail::smime::TrustStore::from_pem(&[&read("ca.pem")], &[&read("ca.crl")]).expect("trust"),
        ),
        clock: clock.clone(),
        wake: Arc::new(tokio::sync::Notify::new()),
        reinject: Some(Reinjector {
            addr: to.to_string(),
            helo: "aq.test".into(),
            timeout: std::time::Duration::from_secs(5),
        }),
        replay_window: std::time::Duration::from_secs(168 * 3600),
        identity: None,
    };
    let env = |lmtp: bool, rcpts: &[(&str, bool)]| MailEnvelope {
        mail_from: "scott@example.com".into(),
        rcpts: rcpts.iter().map(|(a, g)| Recipient { address: a.to_string(), gateway: *g }).collect(),
        body_8bit: false,
        lmtp,
    };
    let spooled = || async { store.spool_pending(10).await.expect("pending").len() };
    // The fake server files a conversation when the client has closed the connection,
    // which may be a moment after the client has its answer.
    let conversations = |n: usize| {
        let seen = seen.clone();
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while seen.lock().expect("lock").len() < n && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await; // and no more
            seen.lock().expect("lock").len()
        }
    };
    let up = gateway(&addr);

    // Only other recipients: handed on, the next server's reply is the answer, no request.
    let r = up.accept(&env(false, &[("Bob@example.com", false)]), &unsigned).await;
    assert_eq!((r.len(), r[0].code, r[0].text.as_str()), (1, 250, "2.0.0 Ok: queued as FAKE1"), "{r:?}");
    assert_eq!(spooled().await, 0);
    assert_eq!(conversations(1).await, 1);
    {
        let seen = seen.lock().expect("lock");
        assert!(
            seen[0].contains("MAIL FROM:<scott@example.com>\r\nRCPT TO:<Bob@example.com>\r\nDATA\r\n"),
            "{}",
            seen[0]
        );
        assert!(seen[0].contains("\r\nhello\r\n.\r\n"), "{}", seen[0]);
    }

    // A request that does not verify refuses the whole mail: nothing is handed on.
    let both = [("aq@localhost", true), ("bob@example.com", false)];
    let r = up.accept(&env(false, &both), &unsigned).await;
    assert_eq!((r.len(), r[0].code, r[0].status), (1, 550, "5.7.1"), "{r:?}");
    assert_eq!(conversations(1).await, 1, "not handed on");

    // A verified request is spooled, then the mail is handed on; one 250 for both.
    let r = up.accept(&env(false, &both), &signed(&example("04"))).await;
    assert_eq!(r[0].code, 250, "{r:?}");
    assert!(r[0].text.contains("verified for agent SCOTT") && r[0].text.contains("handed on for 1"), "{r:?}");
    assert_eq!(spooled().await, 1);
    assert_eq!(conversations(2).await, 2);

    // The next server unreachable: 451, and the request is held (not performed, no reply
    // owed); the client's retry is that same mail, accepted now: performed and answered once.
    let mail = signed(&example("01"));
    let r = gateway(&down).accept(&env(false, &both), &mail).await;
    assert_eq!((r[0].code, r[0].status), (451, "4.4.1"), "{r:?}");
    assert_eq!(spooled().await, 2);
    let held = store.spool_pending(10).await.expect("pending").into_iter().max_by_key(|m| m.id).expect("held");
    assert_eq!((held.state.as_str(), held.replies_wanted), ("held", 0));
    assert!(store.spool_due(i64::MAX, 10).await.expect("due").iter().all(|m| m.id != held.id), "not forwarded");
    let r = up.accept(&env(false, &both), &mail).await;
    assert!(r[0].code == 250 && r[0].text.contains("verified for agent SCOTT; queued as request"), "{r:?}");
    assert_eq!(spooled().await, 2, "not spooled twice");
    let m = store.spool_get(held.id).await.expect("get").expect("row");
    assert_eq!((m.state.as_str(), m.replies_wanted), ("new", 1), "released: one reply owed");

    // LMTP: one answer per recipient, the request's and the next server's.
    let r = up.accept(&env(true, &[("bob@example.com", false), ("aq@localhost", true)]), &unsigned).await;
    assert_eq!(r.iter().map(|x| x.code).collect::<Vec<_>>(), [250, 550], "{r:?}");
}

/// A forward performed whose outcome never reached the spool (the process died between
/// the servlet's commit and the spool's update): the next attempt carries the same
/// idempotency key, gets the recorded response and performs nothing. The mail is
/// performed exactly once and answered with the first response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_repeated_after_a_crash_performs_nothing() {
    use sqlx::Connection;
    let url = fresh_sqlite_url();
    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let clock = Arc::new(ManualClock::new(T0));
    let engine =
        Engine::start(store.clone(), clock.clone() as Arc<dyn Clock>, EngineConfig::default()).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let servlet_url = format!("http://{}/aqserv", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app(AppState::new(engine, Limits::default()))).await });
    let outbox = std::env::temp_dir().join(format!("aqgate-outbox-{}", aqgate_core::engine::session::random_id()));
    let cfg = WorkerConfig {
        servlet_url,
        gateway_agent: "aqgateway".into(),
        gateway_password: "gateway-demo".into(),
        reply_from: "aq@localhost".into(),
        transport: ReplyTransport::Files(outbox.clone()),
        max_attempts: 5,
        dedupe_window: std::time::Duration::from_secs(7 * 24 * 3600),
        identity: None,
        claim_owner: "test:1:worker".into(),
    };
    let worker = Arc::new(Worker::new(store.clone(), clock.clone() as Arc<dyn Clock>, cfg));
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let SpoolPut::New(id) = store.spool_put(&spooled("<order-9@example.com>", &send)).await.expect("spool") else {
        panic!("new mail")
    };
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 1);
    let first = store.spool_get(id).await.expect("get").expect("row").response.expect("response");
    // As if the spool's update had never committed.
    let mut db = sqlx::SqliteConnection::connect(&url).await.expect("open the spool");
    sqlx::query("UPDATE mail_spool SET state = 'new', response = NULL, replies_sent = 0 WHERE id = ?1")
        .bind(id)
        .execute(&mut db)
        .await
        .expect("undo");
    db.close().await.expect("close");
    assert_eq!(worker.run_once().await.expect("run"), 1);
    assert_eq!(depth(store.as_ref(), "QS.NEW_ORDERS_QUE").await, 1, "performed once");
    let again = store.spool_get(id).await.expect("get").expect("row");
    assert_eq!(again.state, "done");
    assert_eq!(again.response.as_deref(), Some(first.as_slice()), "the recorded response, byte for byte");
    let r = replies(&outbox);
    assert_eq!(r.len(), 2, "answered at least once (here: once per attempt)");
    let _ = std::fs::remove_dir_all(&outbox);
}
