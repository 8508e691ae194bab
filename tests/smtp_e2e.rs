//! The mail path through the real binary: swaks delivers an S/MIME-signed IDAP request to
//! aqgate's SMTP filter; the signature is verified against the agent's certificate from the
//! directory, the request is performed, the response is mailed back (outbox .eml), and an
//! HTTP receive sees the message. Forged, unsigned and mismatched mail is refused at SMTP
//! time and changes nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn sign(dir: &Path, name: &str, idap: &str, agent: &str, from: &str) -> PathBuf {
    let req = dir.join(format!("{name}.xml"));
    std::fs::write(&req, idap).expect("write request");
    let out = Command::new(BIN)
        .args(["mail", "sign"])
        .arg(&req)
        .args(["--cert", &format!("{ROOT}/certs/{agent}.pem"), "--key", &format!("{ROOT}/certs/{agent}.key.pem")])
        .args(["--from", from, "--to", "aq@localhost", "--subject", "new order"])
        .output()
        .expect("aqgate mail sign");
    assert!(out.status.success(), "sign: {}", String::from_utf8_lossy(&out.stderr));
    let eml = dir.join(format!("{name}.eml"));
    std::fs::write(&eml, out.stdout).expect("write mail");
    eml
}

/// swaks' exit status and transcript.
fn swaks(port: u16, from: &str, mail: &Path) -> (bool, String) {
    swaks_with(port, from, mail, &[])
}

fn swaks_with(port: u16, from: &str, mail: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new("swaks")
        .args([
            "--server",
            &format!("127.0.0.1:{port}"),
            "--from",
            from,
            "--to",
            "aq@localhost",
            "--helo",
            "client.test",
        ])
        .args(extra)
        .arg("--data")
        .arg(mail)
        .stdin(Stdio::null())
        .output()
        .expect("swaks (scripts/test.sh installs it)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}

/// The first reply mail in the outbox `dir` that `matches`, waited for up to 15 s.
async fn reply_in(dir: &Path, what: &str, matches: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(r) = outbox(dir).into_iter().find(|r| matches(r)) {
            return r;
        }
        assert!(Instant::now() < deadline, "no {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn outbox(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).map(|t| readable(&t)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_mail_in_response_mailed_back_and_forgeries_refused() {
    let (work, out_dir) = scratch("smtp");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let (cert, key, out) = (
        format!("{ROOT}/certs/gateway-tls.pem"),
        format!("{ROOT}/certs/gateway-tls.key.pem"),
        out_dir.to_str().expect("utf-8 path").to_string(),
    );
    let _serve = serve_mail(hp, sp, &db, &out, &["--smtp-tls-cert", &cert, "--smtp-tls-key", &key]);

    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let good = sign(&work, "good", &send, "scott", "scott@example.com");
    // Over STARTTLS (the gateway's TEST ONLY certificate; swaks does not verify it).
    let (ok, transcript) = swaks_with(sp, "scott@example.com", &good, &["--tls"]);
    assert!(ok, "{transcript}");
    assert!(transcript.contains("STARTTLS") && transcript.contains("TLS started"), "{transcript}");
    assert!(transcript.contains("250 2.0.0 verified for agent SCOTT"), "{transcript}");

    // The response comes back by mail.
    let reply = reply_in(&out_dir, "reply mail", |_| true).await;
    assert!(reply.contains("AQXmlSendResponse") && reply.contains("QS.NEW_ORDERS_QUE"), "{reply}");
    assert!(reply.contains("To: scott@example.com") && reply.contains("Subject: Re: new order"), "{reply}");

    // Refused at SMTP time, nothing enqueued: tampered, unsigned, From mismatch.
    let text = std::fs::read_to_string(&good).expect("mail");
    let tampered = work.join("tampered.eml");
    // Flip one character of the signed part's (base64) body.
    let marker = "Content-Transfer-Encoding: base64\r\n\r\n";
    let at = text.find(marker).expect("signed part") + marker.len() + 10;
    let flipped = if &text[at..=at] == "A" { "B" } else { "A" };
    std::fs::write(&tampered, format!("{}{flipped}{}", &text[..at], &text[at + 1..])).expect("write");
    let unsigned = work.join("unsigned.eml");
    std::fs::write(
        &unsigned,
        format!("From: scott@example.com\r\nTo: aq@localhost\r\nSubject: x\r\nContent-Type: text/xml\r\n\r\n{send}"),
    )
    .expect("write");
    // john signs, and the From header claims scott.
    let johns = sign(&work, "johns", &send, "john", "john@example.com");
    let forged: String = std::fs::read_to_string(&johns)
        .expect("mail")
        .split_inclusive('\n')
        .map(|l| if l.starts_with("From:") { "From: scott@example.com\r\n".to_string() } else { l.to_string() })
        .collect();
    std::fs::write(&johns, forged).expect("write");
    for (what, mail) in [("tampered", &tampered), ("unsigned", &unsigned), ("signed by john as scott", &johns)] {
        let (ok, transcript) = swaks(sp, "scott@example.com", mail);
        assert!(!ok, "{what} was accepted:\n{transcript}");
        assert!(transcript.contains("550 5.7.1"), "{what}:\n{transcript}");
    }

    assert_eq!(outbox(&out_dir).len(), 1, "no reply mail for refused mail (no backscatter)");

    // A replay with new outer headers (Message-ID, Reply-To are not signed): recognised as
    // the same request, not performed again; the original response goes to the signer.
    let replay = work.join("replay.eml");
    let replayed: String = text
        .split_inclusive('\n')
        .map(|l| {
            if l.starts_with("Message-ID:") {
                "Message-ID: <replay-1@evil.example>\r\nReply-To: attacker@evil.example\r\n".to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&replay, replayed).expect("write");
    let (ok, transcript) = swaks(sp, "scott@example.com", &replay);
    assert!(ok && transcript.contains("already have this request"), "{transcript}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while outbox(&out_dir).len() < 2 {
        assert!(Instant::now() < deadline, "the original response was not sent again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both replies go to scott (never the unsigned Reply-To); the first answers the mail
    // that asked first, the one sent again answers the copy that asked again.
    let replies = outbox(&out_dir);
    let original = text.lines().find_map(|l| l.strip_prefix("Message-ID: ")).expect("Message-ID").trim().to_string();
    for r in &replies {
        assert!(r.contains("To: scott@example.com") && !r.contains("attacker@evil.example"), "{r}");
        assert!(r.contains("AQXmlSendResponse"), "{r}");
        assert!(r.contains("Message-ID: <aqgate.") && r.contains("Content-Type: multipart/signed"), "{r}");
    }
    let threads_to = |id: &str| replies.iter().filter(|r| r.contains(&format!("In-Reply-To: {id}"))).count();
    assert_eq!((threads_to(&original), threads_to("<replay-1@evil.example>")), (1, 1), "{replies:?}");

    // A receive by mail: the reply carries the message (exactly the one good order).
    let recv = sign(&work, "recv", &example("07"), "scott", "scott@example.com");
    let (ok, transcript) = swaks(sp, "scott@example.com", &recv);
    assert!(ok, "{transcript}");
    let reply = reply_in(&out_dir, "reply to the receive", |r| r.contains("AQXmlReceiveResponse")).await;
    assert!(
        reply.contains("<correlation>HLB-4471</correlation>") && reply.contains("<CITY>PORTLAND</CITY>"),
        "{reply}"
    );
    let r = http(hp, &example("07")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
    let _ = std::fs::remove_dir_all(&work);
}

/// A mailed send of order 4471 (example 01 + commit) was answered exactly once (a send
/// response in the outbox, and no second one a moment later) and performed exactly once
/// (example 07 over HTTP receives it, then finds nothing).
async fn answered_once_and_performed_once(out_dir: &Path, hp: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while outbox(out_dir).is_empty() {
        assert!(Instant::now() < deadline, "the spooled mail was not answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let replies = outbox(out_dir);
    assert_eq!(replies.len(), 1, "answered once: {replies:?}");
    assert!(replies[0].contains("AQXmlSendResponse"), "{}", replies[0]);
    let r = http(hp, &example("07")).await;
    assert!(
        matches!(&r, Response::Receive(_, Some(x)) if x.messages[0].header.correlation.as_deref() == Some("HLB-4471")),
        "{r:?}"
    );
    let r = http(hp, &example("07")).await;
    assert!(
        matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE),
        "performed exactly once: {r:?}"
    );
}

/// A fresh work directory and its reply outbox.
fn scratch(name: &str) -> (PathBuf, PathBuf) {
    let work = std::env::temp_dir().join(format!("aqgate-{name}-{}", aqgate_core::engine::session::random_id()));
    std::fs::create_dir_all(&work).expect("mkdir");
    let out = work.join("outbox");
    (work, out)
}

/// `aqgate ARGS`, killed when the test ends.
fn spawn(args: &[&str]) -> Proc {
    Proc::spawn(&format!("aqgate {}", args[0]), &mut aqgate(args))
}

/// `aqgate serve` with the servlet on `hp`, the mail filter on `sp`, replies into the
/// outbox `out`, and `extra` flags; once both ports answer.
fn serve_mail(hp: u16, sp: u16, db: &str, out: &str, extra: &[&str]) -> Proc {
    let (listen, smtp) = (format!("127.0.0.1:{hp}"), format!("127.0.0.1:{sp}"));
    let mut args = vec!["serve", "--listen", &listen, "--smtp-listen", &smtp, "--database", db, "--mail-outbox", out];
    args.extend_from_slice(extra);
    let p = spawn(&args);
    wait_port(hp);
    wait_port(sp);
    p
}

/// kill -9 after the 250 and before forwarding: after restart the request is performed
/// exactly once. `aqgate smtp` runs alone, posting to a servlet that is not up yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_mail_survives_kill_dash_nine_and_is_performed_exactly_once() {
    let (work, out_dir) = scratch("crash");
    let db = fresh_sqlite_url();
    let topo = format!("{ROOT}/config/topology.toml");
    let st = Command::new(BIN).args(["admin", "apply", &topo, "--database", &db]).output().expect("admin apply");
    assert!(st.status.success());
    let (hp, sp) = (free_port(), free_port());
    let servlet_url = aqserv(hp);
    let out = out_dir.to_str().expect("utf-8 path").to_string();
    let smtp_args = [
        "smtp",
        "--database",
        &db,
        "--servlet-url",
        &servlet_url,
        "--smtp-listen",
        &format!("127.0.0.1:{sp}"),
        "--mail-outbox",
        &out,
    ];

    let smtp = spawn(&smtp_args);
    wait_port(sp);
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let good = sign(&work, "good", &send, "scott", "scott@example.com");
    let (ok, transcript) = swaks(sp, "scott@example.com", &good);
    assert!(ok && transcript.contains("250 2.0.0 verified"), "{transcript}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    smtp.kill9();
    assert!(outbox(&out_dir).is_empty(), "nothing could have been answered yet");
    let spool = |db: &str| {
        let out = Command::new(BIN).args(["admin", "spool", "--database", db]).output().expect("admin spool");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let pending = spool(&db);
    assert!(
        pending.lines().any(|l| l.contains(" new ") && l.contains("SCOTT")),
        "the accepted mail is visible: {pending}"
    );

    let _serve = spawn(&["serve", "--no-smtp", "--listen", &format!("127.0.0.1:{hp}"), "--database", &db]);
    wait_port(hp);
    let _smtp2 = spawn(&smtp_args);
    answered_once_and_performed_once(&out_dir, hp).await;
    assert!(spool(&db).contains("spool empty"), "forwarded and answered");
    let _ = std::fs::remove_dir_all(&work);
}

/// The filter speaking LMTP (as behind a Postfix `lmtp:` content filter), driven by swaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmtp_delivery_is_verified_and_answered() {
    let (work, out_dir) = scratch("lmtp");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let out = out_dir.to_str().expect("utf-8 path").to_string();
    let _serve = serve_mail(hp, sp, &db, &out, &["--lmtp"]);
    let mail = sign(&work, "m", &example("04"), "scott", "scott@example.com");
    let (ok, transcript) = swaks_with(sp, "scott@example.com", &mail, &["--protocol", "LMTP"]);
    assert!(ok, "{transcript}");
    assert!(transcript.contains("LHLO") && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{transcript}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while outbox(&out_dir).is_empty() {
        assert!(Instant::now() < deadline, "no reply");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(outbox(&out_dir)[0].contains("AQXmlPublishResponse"));
    let _ = std::fs::remove_dir_all(&work);
}

/// A downstream MTA for `--smtp-reinject`: accepts every transaction and counts the
/// messages it got (enough SMTP for aqgate's reinjection client).
async fn smtp_sink(listener: tokio::net::TcpListener) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let got = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = got.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut s = BufReader::new(conn);
                let _ = s.get_mut().write_all(b"220 sink ESMTP\r\n").await;
                let mut line = String::new();
                let mut in_data = false;
                loop {
                    line.clear();
                    if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let reply: &[u8] = if in_data {
                        if line != ".\r\n" {
                            continue;
                        }
                        in_data = false;
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        b"250 2.0.0 queued\r\n"
                    } else {
                        match line.get(..4).map(str::to_ascii_uppercase).as_deref() {
                            Some("EHLO") => b"250-sink\r\n250 8BITMIME\r\n",
                            Some("DATA") => {
                                in_data = true;
                                b"354 go on\r\n"
                            }
                            Some("QUIT") => {
                                let _ = s.get_mut().write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"250 2.0.0 ok\r\n",
                        }
                    };
                    if s.get_mut().write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    got
}

/// As a before-queue filter, a mail for the gateway and for someone else: when handing it
/// on fails temporarily, the client gets a 4xx and the request is neither performed nor
/// answered; the client's next attempt is accepted, performed once and answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_refused_for_its_other_recipients_is_performed_once_when_it_comes_again() {
    let (work, out_dir) = scratch("held");
    let (hp, sp, rp) = (free_port(), free_port(), free_port());
    let db = fresh_sqlite_url();
    let out = out_dir.to_str().expect("utf-8 path").to_string();
    let reinject = format!("smtp://127.0.0.1:{rp}");
    let _serve = serve_mail(hp, sp, &db, &out, &["--smtp-reinject", &reinject]);
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let mail = sign(&work, "mixed", &send, "scott", "scott@example.com");
    let to = ["--to", "aq@localhost,bob@example.com"];

    // Nothing listens on the reinjection port yet: 451, nothing performed, nothing mailed.
    let (ok, transcript) = swaks_with(sp, "scott@example.com", &mail, &to);
    assert!(!ok && transcript.contains("<** 451 4.4.1"), "{transcript}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(outbox(&out_dir).is_empty(), "no reply for a mail that was not accepted");
    let r = http(hp, &example("07")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
    let spool = Command::new(BIN).args(["admin", "spool", "--database", &db]).output().expect("admin spool");
    let spool = String::from_utf8_lossy(&spool.stdout).to_string();
    assert!(spool.lines().any(|l| l.contains(" held ") && l.contains("SCOTT")), "held: {spool}");

    // The next MTA is back; the client tries again: accepted, performed, answered once.
    let sink = smtp_sink(tokio::net::TcpListener::bind(("127.0.0.1", rp)).await.expect("bind the sink")).await;
    let (ok, transcript) = swaks_with(sp, "scott@example.com", &mail, &to);
    assert!(ok && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{transcript}");
    assert!(transcript.contains("handed on for 1 other recipient(s)"), "{transcript}");
    assert_eq!(sink.load(std::sync::atomic::Ordering::SeqCst), 1, "bob's copy went on once");
    answered_once_and_performed_once(&out_dir, hp).await;
    let _ = std::fs::remove_dir_all(&work);
}

/// Over mail the request runs as the verified signer: john signs a request that names scott
/// as its sender on the secure order queue, as which john's OE may not enqueue, and the
/// answer mailed back is the fault; nothing is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_request_naming_another_sender_is_refused() {
    let (work, out_dir) = scratch("smtp-sender");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let out = out_dir.to_str().expect("utf-8 path").to_string();
    let _serve = serve_mail(hp, sp, &db, &out, &[]);
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let johns = sign(&work, "johns-as-scott", &send, "john", "john@example.com");
    let (ok, transcript) = swaks(sp, "john@example.com", &johns);
    assert!(ok, "{transcript}");
    assert!(transcript.contains("250 2.0.0 verified for agent JOHN"), "{transcript}");
    let reply = reply_in(&out_dir, "reply mail", |_| true).await;
    assert!(reply.contains("To: john@example.com"), "{reply}");
    assert!(reply.contains("agent SCOTT is not enabled for database user OE, as which JOHN enqueues"), "{reply}");
    let r = http(hp, &receive("QS.NEW_ORDERS_QUE", "<wait_time>0</wait_time>", COMMIT)).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
    // The signer is recorded as the enqueuing agent apart from sender_id: john signs a JMS
    // message naming APP_X (an ordinary queue keeps it), and its receiver sees userid JOHN.
    let note = example("03")
        .replace("<agent_name>john</agent_name>", "<agent_name>APP_X</agent_name>")
        .replace("</message_set>", "</message_set><AQXmlCommit/>");
    let signed = sign(&work, "johns-note", &note, "john", "john@example.com");
    let (ok, transcript) = swaks(sp, "john@example.com", &signed);
    assert!(ok && transcript.contains("250 2.0.0 verified for agent JOHN"), "{transcript}");
    reply_in(&out_dir, "the send's reply", |r| r.contains("AQXmlSendResponse")).await;
    assert_eq!(stored_senders(&db).await, [(Some("APP_X".into()), Some("JOHN".into()))]);
    let r = http(hp, &receive("AQUSER.JMS_TEXTQ", "<wait_time>0</wait_time>", COMMIT)).await;
    let got = received(&r);
    assert_eq!(got[0].header.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("APP_X"), "{r:?}");
    let userid = got[0].payload.child("oracle_jms_properties").and_then(|p| p.child("userid")).map(|u| u.text());
    assert_eq!(userid.as_deref(), Some("JOHN"), "{r:?}");
    let _ = std::fs::remove_dir_all(&work);
}

/// A mail whose claim a crashed process held (on PostgreSQL a claim is a lease of 150 s,
/// so that other nodes leave the mail alone) is forwarded at once by the process that
/// restarts on the same host, not after the lease: the claim names its process, and a
/// dead one of this host is recognised at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_takes_back_the_claims_of_its_dead_predecessor_at_once() {
    use aqgate_core::store::SpoolPut;
    let db = fresh_pg_url().await;
    let store = store_with_topology(&db, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let SpoolPut::New(id) = store.spool_put(&spooled("<order-claimed@example.com>", &send)).await.expect("spool")
    else {
        panic!("a new mail")
    };
    // A process of this host that has ended.
    let mut gone = Command::new("true").spawn().expect("spawn true");
    let dead_pid = gone.id();
    gone.wait().expect("reap");
    let dead = format!("{}:{dead_pid}:deadbeef", aqgate_mail::outbound::hostname());
    let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
    assert!(store.spool_claim(id, now, &dead).await.expect("claim"), "claimed by the dead process");
    // A live process's claim is left alone.
    let SpoolPut::New(other) = store.spool_put(&spooled("<order-live@example.com>", &send)).await.expect("spool")
    else {
        panic!("a new mail")
    };
    let alive = format!("{}:{}:cafebabe", aqgate_mail::outbound::hostname(), std::process::id());
    assert!(store.spool_claim(other, now, &alive).await.expect("claim"), "claimed by a live process");

    let (work, out_dir) = scratch("claims");
    let (hp, sp) = (free_port(), free_port());
    let _serve = serve_mail(hp, sp, &db, out_dir.to_str().expect("utf-8"), &[]);
    let started = Instant::now();
    let mut performed = false;
    while started.elapsed() < Duration::from_secs(30) {
        if store.spool_get(id).await.expect("get").expect("row").response.is_some() {
            performed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(performed, "the dead process's claim taken back and the mail forwarded within 30 s (its lease is 150 s)");
    let live = store.spool_get(other).await.expect("get").expect("row");
    assert!(live.response.is_none() && live.attempts == 0, "a live process's claim is left alone: {live:?}");
    let _ = std::fs::remove_dir_all(&work);
}

/// A verified mail that cannot be spooled because the store's disk is full is answered
/// `452 4.3.1` (insufficient system storage: the sending MTA keeps it and retries), never
/// 250; once space is freed the same mail is accepted and performed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_452_and_the_mail_is_accepted_once_space_returns() {
    let fs = common::tmpfs::Tmpfs::mount("smtp", 24);
    let db = format!("sqlite://{}", fs.dir.join("aq.db").display());
    let (work, out_dir) = scratch("full");
    let (hp, sp) = (free_port(), free_port());
    let _serve = serve_mail(hp, sp, &db, out_dir.to_str().expect("utf-8"), &[]);
    // Big requests (a 64 KB payload each), so that each needs new pages.
    let mails: Vec<PathBuf> = (0..40)
        .map(|i| {
            let payload: String = (0..32 * 1024).map(|k| format!("{:02X}", (k * 7 + i * 13) % 251)).collect();
            let send = common::raw_send("AQUSER.RAW_QUE", &[("", payload.as_str())], common::COMMIT);
            sign(&work, &format!("big-{i}"), &send, "scott", "scott@example.com")
        })
        .collect();
    let filler = common::tmpfs::fill(&fs.dir);
    let mut refused = None;
    for (i, m) in mails.iter().enumerate() {
        let (ok, transcript) = swaks(sp, "scott@example.com", m);
        if transcript.contains("452 4.3.1") {
            refused = Some(i);
            break;
        }
        assert!(ok, "before the disk refuses, mail is accepted: {transcript}");
    }
    let refused = refused.expect("a mail answered 452 4.3.1 once the disk is full");
    std::fs::remove_file(&filler).expect("remove the filler");
    let (ok, transcript) = swaks(sp, "scott@example.com", &mails[refused]);
    assert!(ok && transcript.contains("250 2.0.0"), "accepted once space is back: {transcript}");
    let _ = std::fs::remove_dir_all(&work);
}
