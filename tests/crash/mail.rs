//! The mail side of a crash run: S/MIME-signed mails, each an AQXmlSend of one unique
//! payload with a trailing commit, submitted over SMTP by a small client while the server
//! is killed. A mail answered 250 must be performed exactly once; one that was not is
//! submitted again (the same bytes: the gateway's dedupe makes the copy the same mail).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::load::send_xml;
use super::procs::{Clock, ROOT};

pub const FROM: &str = "scott@example.com";
pub const TO: &str = "aq@localhost";

/// One SMTP transaction: the final reply's code and text, or why there was none.
pub async fn submit(port: u16, data: &[u8]) -> Result<(u16, String), String> {
    tokio::time::timeout(Duration::from_secs(20), submit_inner(port, data))
        .await
        .map_err(|_| "timed out".to_string())?
}

async fn submit_inner(port: u16, data: &[u8]) -> Result<(u16, String), String> {
    let conn = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| format!("connect: {e}"))?;
    let _ = conn.set_nodelay(true);
    let mut s = BufReader::new(conn);
    let expect = |(code, text): (u16, String), want: u16| {
        if code == want { Ok(()) } else { Err(format!("{code} {text}")) }
    };
    expect(reply(&mut s).await?, 220)?;
    for (cmd, want) in
        [("EHLO crash.test".to_string(), 250), (format!("MAIL FROM:<{FROM}>"), 250), (format!("RCPT TO:<{TO}>"), 250)]
    {
        s.get_mut().write_all(format!("{cmd}\r\n").as_bytes()).await.map_err(|e| format!("write: {e}"))?;
        expect(reply(&mut s).await?, want)?;
    }
    s.get_mut().write_all(b"DATA\r\n").await.map_err(|e| format!("write: {e}"))?;
    expect(reply(&mut s).await?, 354)?;
    s.get_mut().write_all(&dot_stuffed(data)).await.map_err(|e| format!("write: {e}"))?;
    let last = reply(&mut s).await?;
    let _ = s.get_mut().write_all(b"QUIT\r\n").await;
    Ok(last)
}

/// A reply (all its lines): the code and the text.
async fn reply(s: &mut BufReader<TcpStream>) -> Result<(u16, String), String> {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.map_err(|e| format!("read: {e}"))? == 0 {
            return Err(format!("connection closed (after {text:?})"));
        }
        text.push_str(&line);
        if line.len() < 4 || line.as_bytes()[3] != b'-' {
            let code = line.get(..3).and_then(|c| c.parse().ok()).ok_or_else(|| format!("bad reply {line:?}"))?;
            return Ok((code, text.trim_end().to_string()));
        }
    }
}

/// The DATA section: CRLF line ends, leading dots doubled, and the final dot.
fn dot_stuffed(data: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let mut out = String::with_capacity(data.len() + 64);
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with('.') {
            out.push('.');
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(".\r\n");
    out.into_bytes()
}

/// A signed mail from scott carrying `id`'s send with a trailing commit.
pub fn signed(id: &str, cert: &[u8], key: &[u8]) -> Vec<u8> {
    let idap = send_xml(&[id.to_string()], true);
    aqgate_mail::smime::sign(idap.as_bytes(), cert, key, FROM, TO, &format!("crash {id}")).expect("sign")
}

pub fn scott_keys() -> (Vec<u8>, Vec<u8>) {
    let read = |f: &str| std::fs::read(format!("{ROOT}/certs/{f}")).expect("demo certificate");
    (read("scott.pem"), read("scott.key.pem"))
}

/// One mail and what the SMTP server said to it.
pub struct Mail {
    pub id: String,
    pub bytes: Vec<u8>,
    /// Answered 250 (during the load, or after it).
    pub accepted: bool,
    pub accepted_after_load: bool,
    pub submissions: u32,
    /// 250s saying the gateway had the mail already (a copy of an earlier submission).
    pub dedupe_hits: u32,
    pub history: Vec<String>,
}

pub type Mails = Arc<Mutex<Vec<Mail>>>;

pub fn lock(m: &Mails) -> std::sync::MutexGuard<'_, Vec<Mail>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Submits `mails[i]` once; true when answered 250.
pub async fn submit_once(port: u16, mails: &Mails, i: usize, kills: u64, after_load: bool) -> bool {
    let bytes = lock(mails)[i].bytes.clone();
    let r = submit(port, &bytes).await;
    let mut all = lock(mails);
    let m = &mut all[i];
    m.submissions += 1;
    match r {
        Ok((250, text)) => {
            m.accepted = true;
            m.accepted_after_load = after_load;
            if text.contains("already have") {
                m.dedupe_hits += 1;
            }
            m.history.push(format!("[kills {kills}] 250 {}", text.lines().last().unwrap_or_default()));
            true
        }
        Ok((code, text)) => {
            m.history.push(format!("[kills {kills}] {code} {}", text.lines().last().unwrap_or_default()));
            false
        }
        Err(e) => {
            m.history.push(format!("[kills {kills}] no reply: {e}"));
            false
        }
    }
}

/// One mail submitter: a new mail (unique payload `{tag}-s{n}-{counter}`), submitted until
/// it is answered 250 or the load stops, then the next.
pub async fn submitter(port: u16, n: usize, tag: String, seed: u64, mails: Mails, clock: Arc<Clock>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (cert, key) = scott_keys();
    let (cert, key) = (Arc::new(cert), Arc::new(key));
    let mut counter = 0u64;
    while !clock.stopped() {
        counter += 1;
        let id = format!("{tag}-s{n}-{counter:06}");
        let (c, k, i2) = (cert.clone(), key.clone(), id.clone());
        let bytes = tokio::task::spawn_blocking(move || signed(&i2, &c, &k)).await.expect("sign task");
        let i = {
            let mut all = lock(&mails);
            all.push(Mail {
                id,
                bytes,
                accepted: false,
                accepted_after_load: false,
                submissions: 0,
                dedupe_hits: 0,
                history: Vec::new(),
            });
            all.len() - 1
        };
        while !clock.stopped() {
            if submit_once(port, &mails, i, clock.generation(), false).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
        }
    }
}
