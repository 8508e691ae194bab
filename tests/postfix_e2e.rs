//! The two Postfix deployments of the mail filter (deploy/postfix/README.md), through a real
//! private Postfix (scripts/postfix.sh) and the real aqgate binary:
//!
//! - B, aqgate as Postfix's before-queue content filter: swaks → Postfix → aqgate (verify,
//!   spool, hand the rest back) → Postfix → virtual(8) into Maildirs; with slapd as the
//!   directory and PostgreSQL as the store. Forgeries are refused at SMTP time (the client
//!   sees aqgate's 5.7.1 through Postfix) and nothing bounces.
//! - A, aqgate as the MX: swaks → aqgate; the replies go out through Postfix (`--mail-relay`)
//!   into the sender's Maildir.
//!
//! Signed mail is made with `openssl smime -sign`, as a client would.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const POSTFIX_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postfix.sh");

/// A private Postfix (scripts/postfix.sh), stopped when dropped — also when a test fails.
struct Postfix {
    dir: PathBuf,
    smtp_port: u16,
    reinject_port: u16,
}

impl Postfix {
    fn start(dir: &Path, args: &[&str]) -> Self {
        let out = Command::new("bash").arg(POSTFIX_SH).arg("start").arg(dir).args(args).output().expect("postfix.sh");
        // Stops whatever half-started if this fails.
        let mut guard = Postfix { dir: dir.to_path_buf(), smtp_port: 0, reinject_port: 0 };
        assert!(
            out.status.success(),
            "scripts/postfix.sh start failed (Postfix is required for this test):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = |f: &str| -> u16 {
            std::fs::read_to_string(dir.join(f)).expect("port file").trim().parse().expect("a port number")
        };
        guard.smtp_port = port("smtp_port");
        guard.reinject_port = port("reinject_port");
        guard
    }

    /// The files in `<localpart>`'s Maildir (new/), as text.
    fn maildir(&self, localpart: &str) -> Vec<String> {
        read_dir_texts(&self.dir.join("maildir").join(localpart).join("new"))
    }

    /// Every delivered mail, in every Maildir.
    fn all_delivered(&self) -> usize {
        std::fs::read_dir(self.dir.join("maildir"))
            .map(|d| d.flatten().map(|e| read_dir_texts(&e.path().join("new")).len()).sum())
            .unwrap_or(0)
    }

    /// Mail Postfix still holds (queued, deferred, bouncing).
    fn queued(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for q in ["incoming", "active", "deferred", "hold", "maildrop", "bounce", "defer"] {
            walk(&self.dir.join("queue").join(q), &mut files);
        }
        files
    }

    /// Waits (bounded) for a mail in `localpart`'s Maildir that contains `needle`.
    async fn wait_for(&self, localpart: &str, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Replies are S/MIME-signed: their XML is searched decoded.
            if let Some(m) = self.maildir(localpart).into_iter().find(|m| readable(m).contains(needle)) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "no mail with {needle:?} in {localpart}'s Maildir; Postfix log:\n{}",
                std::fs::read_to_string(self.dir.join("postfix.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(POSTFIX_SH).arg("stop").arg(&self.dir).output();
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { walk(&p, out) } else { out.push(p) }
    }
}

fn read_dir_texts(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect())
        .unwrap_or_default()
}

/// `aqgate ARGS` with `env`, its output in `log`; killed when the test ends.
fn spawn(args: &[&str], env: &[(&str, &str)], log: &Path) -> Proc {
    Proc::spawn_logged(&format!("aqgate {}", args[0]), aqgate(args).envs(env.iter().copied()), log)
}

/// `aqgate serve` without SMTP on 127.0.0.1:`hp`, a fresh SQLite file, notifications
/// mailed from aq@aq.example.com through `postfix`; waited for.
fn notifying_server(work: &Path, hp: u16, postfix: &Postfix) -> Proc {
    let db = fresh_sqlite_url();
    let relay = format!("smtp://127.0.0.1:{}", postfix.smtp_port);
    let listen = format!("127.0.0.1:{hp}");
    let args = [
        "serve",
        "--no-smtp",
        "--listen",
        &listen,
        "--database",
        &db,
        "--notify-from",
        "aq@aq.example.com",
        "--mail-relay",
        &relay,
        // The directory's mailboxes, and a domain Postfix refuses to relay to.
        "--notify-mail-allow",
        "directory,elsewhere.test",
    ];
    let serve = spawn(&args, &[], &work.join("aqgate.log"));
    wait_port(hp);
    serve
}

/// An AQXmlRegister of `url` on `queue`, committed.
fn register(queue: &str, url: &str) -> String {
    format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{queue}</destination><notify_url>{url}</notify_url></register_options><AQXmlCommit/></AQXmlRegister></Body></Envelope>"#
    )
}

/// A fresh scratch directory.
fn scratch(name: &str) -> PathBuf {
    let work = std::env::temp_dir().join(format!("aqgate-{name}-{}", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::create_dir_all(&work).expect("mkdir");
    work
}

/// `idap` signed as scott by `openssl smime -sign` (multipart/signed, the XML as a text/xml
/// part), with a Message-ID of its own.
fn openssl_sign(dir: &Path, name: &str, idap: &str, to: &str) -> PathBuf {
    let entity = dir.join(format!("{name}.entity"));
    std::fs::write(&entity, format!("Content-Type: text/xml; charset=utf-8\r\n\r\n{idap}")).expect("write entity");
    let out = Command::new("openssl")
        .args(["smime", "-sign", "-in"])
        .arg(&entity)
        .args(["-signer", &format!("{ROOT}/certs/scott.pem"), "-inkey", &format!("{ROOT}/certs/scott.key.pem")])
        .args(["-from", "scott@example.com", "-to", to, "-subject", "new order"])
        .output()
        .expect("openssl (scripts/ensure-tools.sh installs it)");
    assert!(out.status.success(), "openssl smime -sign: {}", String::from_utf8_lossy(&out.stderr));
    let mut mail =
        format!("Message-ID: <{name}-{}@example.com>\n", aqgate_core::engine::session::random_id()).into_bytes();
    mail.extend_from_slice(&out.stdout);
    let eml = dir.join(format!("{name}.eml"));
    std::fs::write(&eml, mail).expect("write mail");
    eml
}

/// swaks' exit status and transcript.
fn swaks(port: u16, from: &str, to: &str, mail: &Path) -> (bool, String) {
    let out = Command::new("swaks")
        .args(["--server", &format!("127.0.0.1:{port}"), "--from", from, "--to", to, "--helo", "client.test"])
        .arg("--data")
        .arg(format!("@{}", mail.display()))
        .stdin(Stdio::null())
        .output()
        .expect("swaks (scripts/ensure-tools.sh installs it)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}

fn send_and_commit() -> String {
    example("01").replace("</message_set>", "</message_set><AQXmlCommit/>")
}

fn is_no_message(r: &Response) -> bool {
    matches!(r, Response::Fault(f) if f.code == aqgate_core::error::code::NO_MESSAGE)
}

fn is_order_4471(r: &Response) -> bool {
    matches!(r, Response::Receive(_, Some(x)) if x.messages.len() == 1
        && x.messages[0].header.correlation.as_deref() == Some("HLB-4471"))
}

/// Deployment B: Postfix in front, aqgate as its before-queue content filter
/// (smtpd_proxy_filter), handing mail for others back to Postfix's reinjection smtpd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_b_aqgate_as_a_before_queue_content_filter_of_postfix() {
    let work = scratch("pfx-b");
    let (hp, sp) = (free_port(), free_port());
    let slapd = Slapd::start();
    let postfix = Postfix::start(&work.join("postfix"), &["--filter", &format!("127.0.0.1:{sp}")]);
    let db = fresh_pg_url().await;
    let reinject = format!("smtp://127.0.0.1:{}", postfix.reinject_port);
    let _serve = spawn(
        &[
            "serve",
            "--listen",
            &format!("127.0.0.1:{hp}"),
            "--smtp-listen",
            &format!("127.0.0.1:{sp}"),
            "--database",
            &db,
            "--smtp-hostname",
            "aq.example.com",
            "--gateway-address",
            "aq@aq.example.com",
            "--smtp-reinject",
            &reinject,
            // Every proxied session comes from Postfix (deploy/postfix/README.md).
            "--smtp-per-client-exempt",
            "127.0.0.1",
            "--mail-relay",
            &reinject,
            "--ldap-url",
            &slapd.url,
            "--ldap-bind-dn",
            &slapd.bind_dn(),
            "--ldap-password-file",
            slapd.bind_password_file().to_str().expect("utf-8 path"),
            "--smime-ca",
            &format!("{ROOT}/certs/ca.pem"),
            "--smime-crl",
            &format!("{ROOT}/certs/ca.crl"),
        ],
        &[],
        &work.join("aqgate.log"),
    );
    wait_port(hp);
    wait_port(sp);

    // A signed send (example 01, committed) to the gateway and to john: Postfix passes the
    // mail through aqgate while the client waits; aqgate verifies and spools the request and
    // hands the mail back to Postfix for john.
    let good = openssl_sign(&work, "good", &send_and_commit(), "aq@aq.example.com");
    let (ok, transcript) = swaks(postfix.smtp_port, "scott@example.com", "aq@aq.example.com,john@example.com", &good);
    assert!(ok, "{transcript}");
    assert!(
        transcript.contains("250 2.0.0 verified for agent SCOTT"),
        "aqgate's answer, through Postfix:\n{transcript}"
    );
    let reply = readable(&postfix.wait_for("scott", "AQXmlSendResponse").await);
    assert!(reply.contains("QS.NEW_ORDERS_QUE") && reply.contains("Subject: Re: new order"), "{reply}");
    assert!(reply.contains("From: aq@aq.example.com") && reply.contains("Return-Path: <aq@aq.example.com>"), "{reply}");
    let johns = postfix.wait_for("john", "Subject: new order").await;
    assert!(
        johns.contains("Return-Path: <scott@example.com>") && johns.contains("<correlation>HLB-4471</correlation>")
    );
    assert!(johns.contains("pkcs7-signature"), "handed on with its signature: {johns}");
    let sent = std::fs::read_to_string(&good).expect("mail").replace("\r\n", "\n");
    let body_at = |m: &str| m.find("\n\n").map(|i| m[i..].to_string()).expect("a body");
    // (swaks ends the data with a blank line of its own.)
    assert_eq!(body_at(&johns).trim_end(), body_at(&sent).trim_end(), "the body is handed on unchanged");
    assert!(!johns.contains("\nDate:"), "Postfix added no header to the reinjected mail: {johns}");
    // The message is there for an HTTP receive (example 07 receives and commits).
    let r = http(hp, &example("07")).await;
    assert!(is_order_4471(&r), "{r:?}");

    // A receive by mail: send over HTTP, receive with a signed example 07 through Postfix;
    // the reply in the Maildir carries the message, and it is gone for HTTP.
    let r = http(hp, &send_and_commit()).await;
    assert!(matches!(r, Response::Send(_, Some(_))), "{r:?}");
    let recv = openssl_sign(&work, "recv", &example("07"), "aq@aq.example.com");
    let (ok, transcript) = swaks(postfix.smtp_port, "scott@example.com", "aq@aq.example.com", &recv);
    assert!(ok && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{transcript}");
    let reply = readable(&postfix.wait_for("scott", "AQXmlReceiveResponse").await);
    assert!(
        reply.contains("<correlation>HLB-4471</correlation>") && reply.contains("<CITY>PORTLAND</CITY>"),
        "{reply}"
    );
    assert!(is_no_message(&http(hp, &example("07")).await), "received by mail");

    // Forgeries: refused at SMTP time with aqgate's 5.7.1, passed through by Postfix to the
    // client; nothing enqueued, nothing queued in Postfix, no bounce anywhere.
    let delivered = postfix.all_delivered();
    let text = std::fs::read_to_string(&good).expect("mail");
    let tampered = work.join("tampered.eml");
    assert!(text.contains("HLB-4471"));
    std::fs::write(&tampered, text.replace("HLB-4471", "HLB-4479")).expect("write");
    let unsigned = work.join("unsigned.eml");
    std::fs::write(
        &unsigned,
        format!(
            "From: scott@example.com\r\nTo: aq@aq.example.com\r\nSubject: x\r\nContent-Type: text/xml\r\n\r\n{}",
            send_and_commit()
        ),
    )
    .expect("write");
    for (what, mail) in [("tampered", &tampered), ("unsigned", &unsigned)] {
        let (ok, transcript) = swaks(postfix.smtp_port, "scott@example.com", "aq@aq.example.com", mail);
        assert!(!ok, "{what} was accepted:\n{transcript}");
        assert!(transcript.contains("<** 550 5.7.1"), "{what}: aqgate's refusal at the end of DATA:\n{transcript}");
    }
    // Even with a deliverable second recipient the whole mail is refused.
    let (ok, transcript) =
        swaks(postfix.smtp_port, "scott@example.com", "aq@aq.example.com,bob@example.com", &tampered);
    assert!(!ok && transcript.contains("<** 550 5.7.1"), "{transcript}");
    // Postfix's own relay control: no other gateway address, no other domain.
    for rcpt in ["other@aq.example.com", "someone@elsewhere.test"] {
        let (ok, transcript) = swaks(postfix.smtp_port, "scott@example.com", rcpt, &unsigned);
        assert!(!ok && transcript.contains("<** 5"), "{rcpt}:\n{transcript}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(is_no_message(&http(hp, &example("07")).await), "nothing was enqueued by refused mail");
    assert_eq!(postfix.all_delivered(), delivered, "no bounce, no reply for refused mail (no backscatter)");
    assert!(postfix.queued().is_empty(), "Postfix holds nothing: {:?}", postfix.queued());

    // Plain mail for a local mailbox goes through aqgate and back, unchanged: envelope
    // sender (the null sender too), headers, body, a line that starts with a dot.
    let plain = work.join("plain.eml");
    std::fs::write(
        &plain,
        "From: alice@elsewhere.test\r\nTo: bob@example.com\r\nSubject: plain\r\nX-Marker: plain-1\r\n\r\nhello bob\r\n.a line with a leading dot\r\nbye\r\n",
    )
    .expect("write");
    let (ok, transcript) = swaks(postfix.smtp_port, "alice@elsewhere.test", "bob@example.com", &plain);
    assert!(ok, "{transcript}");
    let m = postfix.wait_for("bob", "X-Marker: plain-1").await;
    assert!(m.contains("Return-Path: <alice@elsewhere.test>"), "{m}");
    assert!(m.contains("\nhello bob\n.a line with a leading dot\nbye\n"), "body unchanged: {m:?}");
    let bounce = std::fs::read_to_string(&plain).expect("mail").replace("plain-1", "plain-2");
    std::fs::write(&plain, bounce).expect("write");
    let (ok, transcript) = swaks(postfix.smtp_port, "<>", "bob@example.com", &plain);
    assert!(ok && transcript.contains("MAIL FROM:<>"), "{transcript}");
    let m = postfix.wait_for("bob", "X-Marker: plain-2").await;
    assert!(m.contains("Return-Path: <>"), "the null sender is kept: {m}");

    // Stop everything before its directory goes (the scripts find their servers there).
    drop(_serve);
    drop(postfix);
    drop(slapd);
    let _ = std::fs::remove_dir_all(&work);
}

/// Deployment A: aqgate is the MX; Postfix only delivers its replies (`--mail-relay`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_a_aqgate_as_the_mx_replies_through_postfix() {
    let work = scratch("pfx-a");
    let (hp, sp) = (free_port(), free_port());
    let postfix = Postfix::start(&work.join("postfix"), &[]);
    let db = fresh_sqlite_url();
    let _serve = spawn(
        &[
            "serve",
            "--listen",
            &format!("127.0.0.1:{hp}"),
            "--smtp-listen",
            &format!("127.0.0.1:{sp}"),
            "--database",
            &db,
            "--gateway-address",
            "aq@aq.example.com",
            "--mail-relay",
            &format!("smtp://127.0.0.1:{}", postfix.smtp_port),
        ],
        &[],
        &work.join("aqgate.log"),
    );
    wait_port(hp);
    wait_port(sp);
    let good = openssl_sign(&work, "good", &send_and_commit(), "aq@aq.example.com");
    let (ok, transcript) = swaks(sp, "scott@example.com", "aq@aq.example.com", &good);
    assert!(ok && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{transcript}");
    let reply = readable(&postfix.wait_for("scott", "AQXmlSendResponse").await);
    assert!(reply.contains("QS.NEW_ORDERS_QUE") && reply.contains("Return-Path: <aq@aq.example.com>"), "{reply}");
    let r = http(hp, &example("07")).await;
    assert!(is_order_4471(&r), "{r:?}");
    // Without --smtp-reinject aqgate takes mail for its own addresses only.
    let (ok, transcript) = swaks(sp, "scott@example.com", "bob@example.com", &good);
    assert!(!ok && transcript.contains("<** 550 5.1.1"), "{transcript}");
    // Postfix here is no open relay either.
    let (ok, transcript) = swaks(postfix.smtp_port, "scott@example.com", "someone@elsewhere.test", &good);
    assert!(!ok && transcript.contains("Relay access denied"), "{transcript}");
    drop(_serve);
    drop(postfix);
    let _ = std::fs::remove_dir_all(&work);
}

/// Notifications to `mailto:` targets go out through Postfix into the registrant's Maildir:
/// an address, and a directory notification alias (ORDERS_DESK → scott@example.com).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mailto_notifications_reach_a_maildir_through_postfix() {
    let work = scratch("pfx-notify");
    let hp = free_port();
    let postfix = Postfix::start(&work.join("postfix"), &[]);
    let _serve = notifying_server(&work, hp, &postfix);
    let as_john = |body: String| async move { http_as(hp, ("john", "welcome"), &mut None, &body).await.1 };
    // scott registers the alias ORDERS_DESK (his own mailbox) on the orders queue; john his
    // address on the RAW queue.
    let r = http(hp, &register("QS.NEW_ORDERS_QUE", "mailto:ORDERS_DESK")).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let body = as_john(register("AQUSER.RAW_QUE", "mailto:john@example.com")).await;
    assert!(body.contains("AQXmlRegisterResponse"), "{body}");
    let order = match http(hp, &send_and_commit()).await {
        Response::Send(_, Some(res)) => res.message_ids[0].clone(),
        other => panic!("not a send result: {other:?}"),
    };
    let raw = r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.RAW_QUE</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_payload><raw>CAFE</raw></message_payload></message></message_set><AQXmlCommit/></AQXmlSend></Body></Envelope>"#.to_string();
    let body = as_john(raw).await;
    let start = body.find("<message_id>").expect("a message id") + "<message_id>".len();
    let raw_id = body[start..start + 32].to_string();
    for (mailbox, id, queue) in [("scott", &order, "QS.NEW_ORDERS_QUE"), ("john", &raw_id, "AQUSER.RAW_QUE")] {
        let mail = postfix.wait_for(mailbox, id).await;
        assert!(mail.contains("AQXmlNotification") && mail.contains(queue), "{mail}");
        assert!(mail.contains("Content-Type: text/xml"), "{mail}");
        assert!(mail.contains("X-AQ-Notification-Id: "), "{mail}");
        assert!(mail.contains("Return-Path: <aq@aq.example.com>"), "{mail}");
    }
    // Each mailbox got only its own registration's notification.
    assert!(postfix.maildir("scott").iter().all(|m| !m.contains(&raw_id)));
    assert!(postfix.maildir("john").iter().all(|m| !m.contains(&order)));
    drop(_serve);
    drop(postfix);
    let _ = std::fs::remove_dir_all(&work);
}

/// A relay's permanent refusal of a `mailto:` notification (Postfix here is no open relay:
/// 554 for another domain) parks it at once, after one attempt: retrying would only be
/// refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_the_relay_refuses_for_good_is_parked_at_once() {
    let work = scratch("pfx-refused");
    let hp = free_port();
    let postfix = Postfix::start(&work.join("postfix"), &[]);
    let _serve = notifying_server(&work, hp, &postfix);
    let r = http(hp, &register("QS.NEW_ORDERS_QUE", "mailto:someone@elsewhere.test")).await;
    assert!(matches!(r, Response::Register(_)), "{r:?}");
    let r = http(hp, &send_and_commit()).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(hp, "aqgate_notifications_parked_total") != 1 {
        assert!(Instant::now() < deadline, "the refused notification was not parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(hp, "aqgate_notification_failures_total"), 1, "one attempt, then parked");
    assert_eq!(metric(hp, "aqgate_notifications_delivered_total"), 0);
    assert_eq!(metric(hp, "aqgate_notify_outbox_parked"), 1);
    drop(_serve);
    drop(postfix);
    let _ = std::fs::remove_dir_all(&work);
}
