//! Fair shares of the SMTP filter through the real binary: a client holding its share of
//! connections is refused the next one while the others keep theirs; a client that starts
//! no transaction, or trickles its DATA, is cut off with 421 4.4.2; bodies past the memory
//! share go to unnamed files on disk, so many unfinished DATAs hold little memory, and a
//! 20 MB signed mail is still accepted and performed whole.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A fresh work directory.
fn scratch(name: &str) -> PathBuf {
    let work = std::env::temp_dir().join(format!("aqgate-{name}-{}", aqgate_core::engine::session::random_id()));
    std::fs::create_dir_all(&work).expect("mkdir");
    work
}

/// `aqgate serve` with the servlet on `hp`, the mail filter on `sp`, and `extra` flags.
fn serve_mail(hp: u16, sp: u16, db: &str, out: &Path, extra: &[&str]) -> Proc {
    let (listen, smtp) = (format!("127.0.0.1:{hp}"), format!("127.0.0.1:{sp}"));
    let out = out.to_str().expect("utf-8 path");
    let mut args = vec!["serve", "--listen", &listen, "--smtp-listen", &smtp, "--database", db, "--mail-outbox", out];
    args.extend_from_slice(extra);
    let p = Proc::spawn("aqgate serve", &mut aqgate(&args));
    wait_port(hp);
    wait_port(sp);
    p
}

/// A connection to the filter from the local address `from` (any of 127.0.0.0/8).
async fn connect(sp: u16, from: [u8; 4]) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind((std::net::Ipv4Addr::from(from), 0).into()).expect("bind");
    s.connect(([127, 0, 0, 1], sp).into()).await.expect("connect")
}

/// The next reply (one read), within 20 s; empty at end of stream.
async fn reply(s: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
        .await
        .expect("a reply within 20 s")
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).to_string()
}

async fn say(s: &mut TcpStream, line: &str) -> String {
    s.write_all(line.as_bytes()).await.expect("write");
    reply(s).await
}

/// Greeting, EHLO, MAIL, RCPT, DATA: the session is in DATA.
async fn open_data(s: &mut TcpStream) {
    assert!(reply(s).await.starts_with("220"));
    assert!(say(s, "EHLO client.test\r\n").await.starts_with("250"));
    assert!(say(s, "MAIL FROM:<scott@example.com>\r\n").await.starts_with("250"));
    assert!(say(s, "RCPT TO:<aq@localhost>\r\n").await.starts_with("250"));
    assert!(say(s, "DATA\r\n").await.starts_with("354"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_share_of_connections_is_refused_and_its_held_ones_stay() {
    let work = scratch("smtp-share");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let _serve = serve_mail(
        hp,
        sp,
        &db,
        &work.join("outbox"),
        &["--smtp-max-per-client", "3", "--smtp-per-client-exempt", "127.0.0.3"],
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect(sp, [127, 0, 0, 2]).await;
        assert!(reply(&mut s).await.starts_with("220"));
        held.push(s);
    }
    let mut fourth = connect(sp, [127, 0, 0, 2]).await;
    let refused = reply(&mut fourth).await;
    assert!(refused.starts_with("421 4.7.0 too many connections from your address"), "{refused}");
    assert_eq!(reply(&mut fourth).await, "", "and hung up on");
    // Another client is not held back, nor is an exempt one however many it holds.
    let mut other = connect(sp, [127, 0, 0, 4]).await;
    assert!(reply(&mut other).await.starts_with("220"));
    let mut exempt = Vec::new();
    for _ in 0..5 {
        let mut s = connect(sp, [127, 0, 0, 3]).await;
        assert!(reply(&mut s).await.starts_with("220"), "exempt");
        exempt.push(s);
    }
    // The held connections are untouched.
    for s in &mut held {
        assert!(say(s, "EHLO client.test\r\n").await.starts_with("250"));
    }
    assert_eq!(metric(hp, "aqgate_smtp_refused_total{reason=\"per_client\"}"), 1);
    // One given back: the client may connect again.
    let mut last = held.pop().expect("held");
    assert!(say(&mut last, "QUIT\r\n").await.starts_with("221"));
    drop(last);
    let mut again = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while again.is_none() {
        let mut s = connect(sp, [127, 0, 0, 2]).await;
        if reply(&mut s).await.starts_with("220") {
            again = Some(s);
        } else {
            assert!(Instant::now() < deadline, "the slot was not given back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_and_a_trickling_data_are_cut_off_with_421() {
    let work = scratch("smtp-timeouts");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let _serve =
        serve_mail(hp, sp, &db, &work.join("outbox"), &["--smtp-mail-timeout", "2", "--smtp-data-timeout", "3"]);
    // Connected, said EHLO and NOOP, never MAIL: closed 2 s after connecting.
    let start = Instant::now();
    let mut idle = connect(sp, [127, 0, 0, 1]).await;
    assert!(reply(&mut idle).await.starts_with("220"));
    assert!(say(&mut idle, "EHLO client.test\r\n").await.starts_with("250"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(say(&mut idle, "NOOP\r\n").await.starts_with("250"));
    let bye = reply(&mut idle).await;
    let took = start.elapsed();
    assert!(bye.starts_with("421 4.4.2") && bye.contains("no mail transaction"), "{bye}");
    // (That NOOP does not extend it is timed exactly in the session's unit tests.)
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(6), "{took:?}");
    assert_eq!(reply(&mut idle).await, "", "closed");
    assert_eq!(metric(hp, "aqgate_smtp_timeouts_total{phase=\"before_mail\"}"), 1);

    // A byte of DATA every 200 ms: never idle, never done; cut off 3 s after the 354.
    let mut slow = connect(sp, [127, 0, 0, 1]).await;
    open_data(&mut slow).await;
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    let bye = loop {
        slow.write_all(b"x").await.expect("write");
        if let Ok(n) = tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await {
            break String::from_utf8_lossy(&buf[..n.expect("read")]).to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(15), "never cut off");
    };
    let took = start.elapsed();
    assert!(bye.starts_with("421 4.4.2") && bye.contains("did not arrive in time"), "{bye}");
    assert!(took >= Duration::from_millis(2900) && took < Duration::from_secs(7), "{took:?}");
    assert_eq!(metric(hp, "aqgate_smtp_timeouts_total{phase=\"data\"}"), 1);
    let _ = std::fs::remove_dir_all(&work);
}

/// `VmRSS` and `VmHWM` of process `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The process's open files that are unlinked files inside `dir`.
fn unlinked_files_in(pid: u32, dir: &Path) -> usize {
    let prefix = dir.to_string_lossy().to_string();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.to_string_lossy().to_string())
        .filter(|t| t.starts_with(&prefix) && t.ends_with("(deleted)"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_bodies_wait_on_disk_and_a_20_mb_mail_is_accepted_whole() {
    let work = scratch("smtp-spool");
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let data_dir = work.join("data");
    std::fs::create_dir_all(&data_dir).expect("mkdir");
    let out_dir = work.join("outbox");
    let serve = serve_mail(
        hp,
        sp,
        &db,
        &out_dir,
        &[
            "--smtp-max-size",
            "33554432",
            "--max-body",
            "33554432",
            "--smtp-data-dir",
            data_dir.to_str().expect("utf-8 path"),
        ],
    );
    let pid = serve.id();
    // Started and settled: the servlet has answered, the filter has served a session.
    assert_eq!(metric(hp, "aqgate_smtp_data_spooled_total"), 0);
    let mut first = connect(sp, [127, 0, 0, 1]).await;
    open_data(&mut first).await;
    assert!(say(&mut first, "Subject: x\r\n\r\nnot signed\r\n.\r\n").await.starts_with("550"));
    drop(first);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_before, _) = memory_kib(pid);

    // Eight clients each send 16 MB of a body and stop there.
    const HELD: usize = 8;
    let line = format!("{}\r\n", "z".repeat(998));
    let mb: String = line.repeat(1024 * 1024 / line.len() + 1);
    let mut held = Vec::new();
    for _ in 0..HELD {
        let mut s = connect(sp, [127, 0, 0, 1]).await;
        open_data(&mut s).await;
        held.push(s);
    }
    let writers: Vec<_> = held
        .into_iter()
        .map(|mut s| {
            let mb = mb.clone();
            tokio::spawn(async move {
                for _ in 0..16 {
                    s.write_all(mb.as_bytes()).await.expect("write");
                }
                s
            })
        })
        .collect();
    let mut held = Vec::new();
    for w in writers {
        held.push(w.await.expect("writer"));
    }
    let private: Vec<PathBuf> = std::fs::read_dir(&data_dir).expect("data dir").flatten().map(|e| e.path()).collect();
    assert_eq!(private.len(), 1, "one private directory: {private:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&private[0]).expect("dir").permissions());
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(std::fs::read_dir(&private[0]).expect("dir").count(), 0, "the bodies' files have no names");
    wait_until("every body on disk", Duration::from_secs(20), || unlinked_files_in(pid, &private[0]) == HELD);
    // Let the last bytes in flight arrive before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_held, hwm_held) = memory_kib(pid);
    eprintln!("{HELD} unfinished DATAs of 16 MB: VmRSS {rss_before} KiB -> {rss_held} KiB, VmHWM {hwm_held} KiB");
    // In memory they would hold 128 MB at least.
    assert!(
        hwm_held < rss_before + 32 * 1024,
        "{HELD} x 16 MB unfinished held in memory: VmHWM {hwm_held} KiB from VmRSS {rss_before} KiB"
    );
    assert_eq!(metric(hp, "aqgate_smtp_data_spooled_total"), HELD as i64);
    drop(held);
    wait_until("the files gone with their sessions", Duration::from_secs(20), || {
        unlinked_files_in(pid, &private[0]) == 0
    });

    // A signed request of 20 MB: over the memory share, on disk, read back, verified,
    // performed, answered; the message arrives whole.
    let text: String = (0..300_000).map(|i| format!("line {i:08} of the manifest, padded to fifty bytes\n")).collect();
    let note = example("03")
        .replace("Pallet 17 leaves dock 3 at 06:40.", &text)
        .replace("</message_set>", "</message_set><AQXmlCommit/>");
    let req = work.join("big.xml");
    std::fs::write(&req, &note).expect("write");
    let signed = Command::new(BIN)
        .args(["mail", "sign"])
        .arg(&req)
        .args(["--cert", &format!("{ROOT}/certs/john.pem"), "--key", &format!("{ROOT}/certs/john.key.pem")])
        .args(["--from", "john@example.com", "--to", "aq@localhost", "--subject", "manifest"])
        .output()
        .expect("aqgate mail sign");
    assert!(signed.status.success(), "{}", String::from_utf8_lossy(&signed.stderr));
    assert!(signed.stdout.len() > 20_000_000, "a 20 MB mail: {}", signed.stdout.len());
    let eml = work.join("big.eml");
    std::fs::write(&eml, &signed.stdout).expect("write");
    let out = Command::new("swaks")
        .args(["--server", &format!("127.0.0.1:{sp}"), "--from", "john@example.com", "--to", "aq@localhost"])
        .args(["--helo", "client.test", "--suppress-data", "--data"])
        .arg(&eml)
        .stdin(Stdio::null())
        .output()
        .expect("swaks");
    let transcript = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && transcript.contains("250 2.0.0 verified for agent JOHN"), "{transcript}");
    assert_eq!(metric(hp, "aqgate_smtp_data_spooled_total"), HELD as i64 + 1);
    wait_until("the reply mail", Duration::from_secs(60), || {
        std::fs::read_dir(&out_dir).map(|d| d.count() > 0).unwrap_or(false)
    });
    let (status, answer) =
        http_as(hp, SCOTT, &mut None, &receive("AQUSER.JMS_TEXTQ", "<wait_time>0</wait_time>", COMMIT)).await;
    assert_eq!(status, 200);
    let limits = aqgate_proto::idap::Limits { max_bytes: 64 << 20, ..Default::default() };
    let r = aqgate_proto::idap::parse_response(answer.as_bytes(), &limits).expect("an IDAP response").body;
    let got = received(&r);
    assert_eq!(got.len(), 1, "{r:?}");
    let body = got[0].payload.child("text_data").map(|t| t.text()).expect("text_data");
    assert!(body == text, "the text arrived whole ({} of {} bytes)", body.len(), text.len());
    let (rss_after, hwm_after) = memory_kib(pid);
    eprintln!("after the 20 MB mail: VmRSS {rss_after} KiB, VmHWM {hwm_after} KiB");
    let _ = std::fs::remove_dir_all(&work);
}
