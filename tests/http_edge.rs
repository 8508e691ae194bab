//! What one HTTP client may hold of the real binary: a connection that sends no request
//! head, or trickles one, or trickles its body, is cut off at its timeout while others are
//! answered; the connection caps (per address and in all) refuse the next connection at
//! once; a request that does not authenticate is answered 401 before its body is sent; a
//! flood of wrong passwords keeps memory bounded and an honest client fast; failed logins
//! bar the client and the agent for a growing delay that a success resets; the open files
//! limit is raised at start and the cap kept below it.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use common::*;

/// `aqgate serve` on a fresh SQLite database with `extra` flags, ready.
fn serve(port: u16, extra: &[&str]) -> Proc {
    let db = fresh_sqlite_url();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db];
    args.extend(extra);
    let mut p = Proc::spawn("aqgate serve", &mut aqgate(&args));
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// A connection to 127.0.0.1:`port` from the loopback address `from` (127.0.0.0/8 is all
/// ours: each address is another client).
async fn connect(port: u16, from: [u8; 4]) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(SocketAddr::new(IpAddr::from(from), 0)).expect("bind");
    s.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.expect("connect")
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// A request head for POST /aqserv with `extra` header lines and a body of `length`.
fn head(extra: &str, length: usize) -> String {
    format!("POST /aqserv HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\n{extra}Content-Length: {length}\r\n\r\n")
}

/// Everything the server sends until it closes (or `within` passes: `None`).
async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The status line's code of a whole response.
fn status(response: &str) -> u16 {
    response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// One whole request from `from` with `Connection: close`: its status, and how long it took.
async fn request(port: u16, from: [u8; 4], extra: &str, body: &str) -> (u16, Duration) {
    let t = Instant::now();
    let mut s = connect(port, from).await;
    let req = format!("{}{body}", head(&format!("{extra}Connection: close\r\n"), body.len()));
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, t.elapsed());
    }
    let r = until_closed(&mut s, Duration::from_secs(60)).await.unwrap_or_default();
    (status(&r), t.elapsed())
}

/// A publish with its commit: a request that changes something and leaves no session.
fn publish() -> String {
    example("04-publish-and-commit.xml")
}

async fn honest(port: u16, from: [u8; 4]) -> (u16, Duration) {
    request(port, from, &format!("Authorization: Basic {}\r\n", basic("scott", "tiger")), &publish()).await
}

/// The server's peak resident memory (VmHWM), in kB.
fn peak_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// A client that never finishes its request head, one that says nothing, and one that
/// trickles an authenticated body: each is cut off at its timeout, while another client's
/// requests are answered at once all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_at_their_timeouts_while_others_are_answered() {
    let port = free_port();
    let _p = serve(port, &["--http-header-timeout", "2", "--http-body-timeout", "3", "--http-idle-timeout", "2"]);
    let start = Instant::now();
    // A head trickled a line every 300 ms.
    let trickler = tokio::spawn(async move {
        let mut s = connect(port, [127, 0, 0, 1]).await;
        let _ = s.write_all(b"POST /aqserv HTTP/1.1\r\n").await;
        let t = Instant::now();
        for i in 0..100 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if s.write_all(format!("X-Slow-{i}: x\r\n").as_bytes()).await.is_err() {
                break;
            }
            // A closed connection shows as EOF once the server has gone.
            let mut b = [0u8; 1];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut b)).await {
                break;
            }
        }
        t.elapsed()
    });
    let silent = tokio::spawn(async move {
        let mut s = connect(port, [127, 0, 0, 1]).await;
        let t = Instant::now();
        let r = until_closed(&mut s, Duration::from_secs(30)).await;
        (r, t.elapsed())
    });
    let slow_body = tokio::spawn(async move {
        let mut s = connect(port, [127, 0, 0, 1]).await;
        let body = publish();
        let auth = format!("Authorization: Basic {}\r\n", basic("scott", "tiger"));
        s.write_all(head(&auth, body.len()).as_bytes()).await.expect("head");
        let t = Instant::now();
        let mut out = Vec::new();
        for b in body.as_bytes().chunks(10) {
            if s.write_all(b).await.is_err() {
                break;
            }
            let mut buf = [0u8; 4096];
            match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
        (String::from_utf8_lossy(&out).into_owned(), t.elapsed())
    });
    // Meanwhile another client is answered promptly, again and again.
    let mut slowest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(5) {
        let (st, took) = honest(port, [127, 0, 0, 2]).await;
        assert_eq!(st, 200);
        slowest = slowest.max(took);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(slowest < Duration::from_secs(1), "the honest client waited {slowest:?}");
    let trickled = trickler.await.expect("trickler");
    assert!(
        trickled >= Duration::from_secs(2) && trickled < Duration::from_secs(5),
        "a trickled head is cut off after the 2 s head timeout (and 1 s grace), not after {trickled:?}"
    );
    let (said, waited) = silent.await.expect("silent");
    assert_eq!(said.as_deref(), Some(""), "closed without a word");
    assert!(waited >= Duration::from_millis(1900) && waited < Duration::from_secs(4), "{waited:?}");
    let (answer, took) = slow_body.await.expect("slow body");
    assert_eq!(status(&answer), 408, "{answer}");
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(5), "{took:?}");
    // A kept connection idle between requests is closed after the idle timeout.
    let mut kept = connect(port, [127, 0, 0, 3]).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut buf = [0u8; 256];
    let n = kept.read(&mut buf).await.expect("answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    assert!(until_closed(&mut kept, Duration::from_secs(10)).await.is_some());
    assert!(t.elapsed() >= Duration::from_millis(1900) && t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(metric(port, "aqgate_http_connections_timed_out_total{wait=\"header\"}") >= 2);
    assert!(metric(port, "aqgate_http_connections_timed_out_total{wait=\"idle\"}") >= 1);
    assert_eq!(metric(port, "aqgate_http_body_timeouts_total"), 1);
}

/// `--http-max-connections-per-ip 4 --http-max-connections 6`: a fifth connection from one
/// address is closed at once, before it sends anything, while other addresses are served;
/// the seventh in all likewise, whatever its address; a slot given back is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_caps_refuse_the_next_connection_at_once() {
    let port = free_port();
    let _p = serve(
        port,
        &["--http-max-connections-per-ip", "4", "--http-max-connections", "6", "--http-header-timeout", "60"],
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(port, [127, 0, 0, 1]).await);
    }
    // The server has them all before the next one comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let mut fifth = connect(port, [127, 0, 0, 1]).await;
    assert_eq!(until_closed(&mut fifth, Duration::from_secs(5)).await.as_deref(), Some(""), "closed at once");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let (st, took) = honest(port, [127, 0, 0, 2]).await;
    assert_eq!(st, 200, "another address is served");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Six in all: four from .1, two from .2; a seventh from .3 is refused.
    held.push(connect(port, [127, 0, 0, 2]).await);
    held.push(connect(port, [127, 0, 0, 2]).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seventh = connect(port, [127, 0, 0, 3]).await;
    assert_eq!(until_closed(&mut seventh, Duration::from_secs(5)).await.as_deref(), Some(""));
    // A slot given back is taken again.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(honest(port, [127, 0, 0, 3]).await.0, 200);
    held.truncate(3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(port, "aqgate_http_connections_refused_total{cap=\"per_ip\"}"), 1);
    assert_eq!(metric(port, "aqgate_http_connections_refused_total{cap=\"total\"}"), 1);
    assert_eq!(metric(port, "aqgate_http_connections_open"), 4, "three held, and the one asking");
}

/// A request without credentials, with a wrong password, or with a cookie that names no
/// session gets its 401 while its 4 MB body is still unsent; so do 200 of them at once,
/// and the server's memory stays where it was. An authenticated one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_authenticate_is_refused_before_its_body_is_read() {
    let port = free_port();
    let p = serve(port, &["--auth-failures-before-backoff", "1000"]);
    const LENGTH: usize = 4_000_000;
    for extra in [
        String::new(),
        format!("Authorization: Basic {}\r\n", basic("scott", "wrong")),
        "Cookie: AQSESSIONID=no-such-session\r\n".to_string(),
    ] {
        let mut s = connect(port, [127, 0, 0, 1]).await;
        s.write_all(head(&extra, LENGTH).as_bytes()).await.expect("head");
        // Not one byte of the body is sent: the answer comes anyway.
        let r = until_closed(&mut s, Duration::from_secs(5)).await.expect("answered before the body");
        assert_eq!(status(&r), 401, "{extra}: {r}");
    }
    let before = peak_kb(p.id());
    let mut clients = Vec::new();
    for i in 0..200u8 {
        clients.push(tokio::spawn(async move {
            let mut s = connect(port, [127, 0, 1, i]).await;
            s.write_all(head("", LENGTH).as_bytes()).await.expect("head");
            // Most of the body, never the end of it.
            let chunk = vec![b'<'; 64 * 1024];
            let mut sent = 0;
            while sent < LENGTH - chunk.len() {
                match tokio::time::timeout(Duration::from_millis(500), s.write_all(&chunk)).await {
                    Ok(Ok(())) => sent += chunk.len(),
                    _ => break,
                }
            }
            (status(&until_closed(&mut s, Duration::from_secs(10)).await.unwrap_or_default()), sent)
        }));
    }
    let mut refused = 0;
    for c in clients {
        let (st, sent) = c.await.expect("client");
        assert!(st == 401 || st == 0, "{st}");
        assert!(sent < LENGTH);
        refused += usize::from(st == 401);
    }
    assert!(refused > 150, "{refused} of 200 read their 401");
    let after = peak_kb(p.id());
    assert!(after < before + 100_000, "peak memory went from {before} kB to {after} kB");
    assert_eq!(honest(port, [127, 0, 0, 2]).await.0, 200);
}

/// 200 wrong passwords at once, from 200 addresses: argon2 runs one at a time here, the
/// rest wait their turn (or get 503 past the wait); memory stays bounded, and an honest client
/// whose credentials were verified before is answered promptly throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_flood_keeps_memory_bounded_and_honest_clients_fast() {
    let port = free_port();
    let p = serve(
        port,
        &["--auth-failures-before-backoff", "1000", "--password-checks", "1", "--password-check-wait-ms", "300"],
    );
    assert_eq!(honest(port, [127, 0, 0, 2]).await.0, 200);
    // A reload that changes no password (SIGHUP here; the control plane's first look at
    // the stored topology does the same at start) keeps the honest client's credentials
    // remembered: its next request runs no password check.
    let checks = || metric(port, "aqgate_password_checks_total");
    let checked = checks();
    assert!(checked >= 1, "{checked}");
    let hup = std::process::Command::new("kill").args(["-HUP", &p.id().to_string()]).status().expect("kill");
    assert!(hup.success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(honest(port, [127, 0, 0, 2]).await.0, 200);
    assert_eq!(checks(), checked, "the reload forgot the remembered credentials");
    let before = peak_kb(p.id());
    let flood: Vec<_> = (0..200u8)
        .map(|i| {
            tokio::spawn(async move {
                let auth = format!("Authorization: Basic {}\r\n", basic("scott", &format!("guess{i}")));
                request(port, [127, 0, 2, i], &auth, &publish()).await.0
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let (st, took) = honest(port, [127, 0, 0, 2]).await;
        assert_eq!(st, 200);
        slowest = slowest.max(took);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = std::collections::BTreeMap::new();
    for f in flood {
        *statuses.entry(f.await.expect("attacker")).or_insert(0) += 1;
    }
    let after = peak_kb(p.id());
    eprintln!("flood: {statuses:?}; peak {before} kB -> {after} kB; slowest honest request {slowest:?}");
    assert!(statuses.keys().all(|s| [401, 503].contains(s)), "{statuses:?}");
    assert!(statuses.get(&503).copied().unwrap_or(0) > 0, "some waited too long: {statuses:?}");
    assert!(after < before + 150_000, "peak memory went from {before} kB to {after} kB");
    assert!(slowest < Duration::from_secs(2), "the honest client waited {slowest:?}");
    assert!(metric(port, "aqgate_password_checks_refused_total{reason=\"busy\"}") > 0);
}

/// `--auth-failures-before-backoff 3 --auth-backoff-max 2`: three failures bar the client's
/// address (for any agent) and the agent (from any address): 429 with Retry-After, after
/// a pause, even for the right password; after the bar the right password passes and resets both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_bar_the_client_and_the_agent_until_a_success() {
    let port = free_port();
    let _p = serve(port, &["--auth-failures-before-backoff", "3", "--auth-backoff-max", "2"]);
    let as_ = |user: &str, pw: &str| format!("Authorization: Basic {}\r\n", basic(user, pw));
    let body = publish();
    for _ in 0..3 {
        assert_eq!(request(port, [127, 0, 3, 1], &as_("john", "wrong"), &body).await.0, 401);
    }
    let barred = [
        ([127, 0, 3, 1], "john", "welcome"),
        ([127, 0, 3, 2], "john", "welcome"),
        ([127, 0, 3, 1], "scott", "tiger-not"),
    ];
    for (i, (from, user, pw)) in barred.into_iter().enumerate() {
        let started = Instant::now();
        let mut s = connect(port, from).await;
        s.write_all(format!("{}{body}", head(&as_(user, pw), body.len())).as_bytes()).await.expect("write");
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.expect("answer");
        let r = String::from_utf8_lossy(&buf[..n]).to_lowercase();
        assert_eq!(status(&r), 429, "{user} from {from:?}: {r}");
        assert!(r.contains("retry-after: 1"), "{r}");
        if i == 0 {
            // A quarter of the bar left (nearly 1 s): a client asking at once is slowed.
            assert!(started.elapsed() >= Duration::from_millis(150), "429 after {:?}", started.elapsed());
        }
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(request(port, [127, 0, 3, 1], &as_("john", "welcome"), &body).await.0, 200, "the bar is over");
    // The success reset both: one more failure is a plain 401 again.
    assert_eq!(request(port, [127, 0, 3, 1], &as_("john", "wrong"), &body).await.0, 401);
    assert_eq!(request(port, [127, 0, 3, 1], &as_("john", "wrong"), &body).await.0, 401);
    assert!(metric(port, "aqgate_password_checks_refused_total{reason=\"backoff\"}") >= 3);
    // Cached credentials pass while the agent is barred: an honest client stays served.
    assert_eq!(honest(port, [127, 0, 3, 9]).await.0, 200);
    for _ in 0..3 {
        request(port, [127, 0, 3, 8], &as_("scott", "wrong"), &body).await;
    }
    assert_eq!(honest(port, [127, 0, 3, 9]).await.0, 200, "scott's verified credentials pass the bar");
}

/// Started with a soft open files limit of 256 under a hard limit of 4096, the server runs
/// with 4096 and says so; under a hard limit of 512 the connection cap is lowered to 256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_files_limit_is_raised_and_the_cap_kept_below_it() {
    for (limit, lowered) in [("256:4096", false), ("512:512", true)] {
        let port = free_port();
        let db = fresh_sqlite_url();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = std::process::Command::new("prlimit");
        cmd.args([&format!("--nofile={limit}"), "--", BIN, "serve", "--no-smtp", "--no-notify"]);
        cmd.args(["--listen", &listen, "--database", &db]);
        let mut p = Proc::spawn("aqgate serve (prlimit)", &mut cmd);
        p.wait_ready(port, Duration::from_secs(60));
        let hard = limit.split(':').nth(1).expect("hard");
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.id())).expect("limits");
        let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("open files");
        let figures: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&figures[3..5], &[hard, hard], "{line}");
        let log = p.log();
        assert!(log.contains("open files limit (RLIMIT_NOFILE) raised to the hard limit"), "{log}");
        assert_eq!(log.contains("--http-max-connections lowered to half the open files limit"), lowered, "{log}");
    }
}
