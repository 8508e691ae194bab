//! Signed mail under faults, as the kill -9 checker (`tests/crash.rs`) and the PostgreSQL
//! failover (`tests/failover.rs`) send it: S/MIME-signed mails from scott, each an IDAP
//! request with a trailing commit, submitted over SMTP by a small client while the server
//! or its database goes away. Each mail is submitted until it is answered 250, always the
//! same bytes: a copy of a mail the gateway spooled already (its 4xx or its reply lost)
//! is the same request, told by the signed content's digest (outer headers such as the
//! Message-ID are not signed and do not count) and answered "already have this request",
//! so a mail answered 250 must be performed exactly once however often it was submitted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub const FROM: &str = "scott@example.com";
pub const TO: &str = "aq@localhost";

/// The run the submitters are part of: whether the load has stopped, and how many faults
/// (kills, failovers) it has seen so far (noted in each mail's history).
pub trait Run: Send + Sync + 'static {
    fn stopped(&self) -> bool;
    fn generation(&self) -> u64;
}

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

/// A mail from scott carrying the IDAP document `idap`, signed with `cert` and `key`.
pub fn signed(idap: &str, subject: &str, cert: &[u8], key: &[u8]) -> Vec<u8> {
    aqgate_mail::smime::sign(idap.as_bytes(), cert, key, FROM, TO, subject).expect("sign")
}

/// Scott's demo certificate and key (certs/).
pub fn scott_keys() -> (Vec<u8>, Vec<u8>) {
    let read = |f: &str| std::fs::read(format!("{}/certs/{f}", env!("CARGO_MANIFEST_DIR"))).expect("demo certificate");
    (read("scott.pem"), read("scott.key.pem"))
}

/// One mail and what the SMTP server said to it.
pub struct Mail {
    /// What its request puts in the queue (the payload's text), so what a drain finds.
    pub id: String,
    pub bytes: Vec<u8>,
    /// Answered 250 (during the load, or after it).
    pub accepted: bool,
    pub accepted_after_load: bool,
    pub submissions: u32,
    /// Submissions answered otherwise than 250 (a 4xx, or no reply).
    pub refusals: u32,
    /// 250s saying the gateway had the mail already (a copy of an earlier submission).
    pub dedupe_hits: u32,
    pub history: Vec<String>,
}

pub type Mails = Arc<Mutex<Vec<Mail>>>;

pub fn lock(m: &Mails) -> std::sync::MutexGuard<'_, Vec<Mail>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Submits `mails[i]` once; true when answered 250.
pub async fn submit_once(port: u16, mails: &Mails, i: usize, generation: u64, after_load: bool) -> bool {
    let bytes = lock(mails)[i].bytes.clone();
    let r = submit(port, &bytes).await;
    let mut all = lock(mails);
    let m = &mut all[i];
    m.submissions += 1;
    let last = |text: &str| text.lines().last().unwrap_or_default().to_string();
    match r {
        Ok((250, text)) => {
            m.accepted = true;
            m.accepted_after_load = after_load;
            if text.contains("already have") {
                m.dedupe_hits += 1;
            }
            m.history.push(format!("[faults {generation}] 250 {}", last(&text)));
            true
        }
        Ok((code, text)) => {
            m.refusals += 1;
            m.history.push(format!("[faults {generation}] {code} {}", last(&text)));
            false
        }
        Err(e) => {
            m.refusals += 1;
            m.history.push(format!("[faults {generation}] no reply: {e}"));
            false
        }
    }
}

/// One mail submitter: mail after mail (`request(n)`: the n-th mail's id and IDAP document),
/// each submitted until it is answered 250 or the load stops. A mail not answered 250 by
/// then is left for [`resubmit_pending`].
pub async fn submitter<R: Run>(
    port: u16,
    seed: u64,
    request: impl Fn(u64) -> (String, String),
    mails: Mails,
    run: Arc<R>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (cert, key) = scott_keys();
    let (cert, key) = (Arc::new(cert), Arc::new(key));
    let mut n = 0u64;
    while !run.stopped() {
        n += 1;
        let (id, idap) = request(n);
        let (c, k, subject) = (cert.clone(), key.clone(), format!("aq {id}"));
        let bytes = tokio::task::spawn_blocking(move || signed(&idap, &subject, &c, &k)).await.expect("sign task");
        let i = {
            let mut all = lock(&mails);
            all.push(Mail {
                id,
                bytes,
                accepted: false,
                accepted_after_load: false,
                submissions: 0,
                refusals: 0,
                dedupe_hits: 0,
                history: Vec::new(),
            });
            all.len() - 1
        };
        while !run.stopped() {
            if submit_once(port, &mails, i, run.generation(), false).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..300))).await;
        }
    }
}

/// After the load: every mail not answered 250 yet, submitted again (the same bytes) until
/// it is, for at most `within`.
pub async fn resubmit_pending(port: u16, mails: &Mails, generation: u64, within: Duration) {
    let pending: Vec<usize> = lock(mails).iter().enumerate().filter(|(_, m)| !m.accepted).map(|(i, _)| i).collect();
    let deadline = tokio::time::Instant::now() + within;
    for i in pending {
        while !submit_once(port, mails, i, generation, true).await {
            assert!(tokio::time::Instant::now() < deadline, "a mail was never answered 250 after the load");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// What became of the mails, given how often each id was performed (found in its queue).
pub struct MailFigures {
    pub mails: usize,
    pub accepted_during_load: usize,
    pub accepted_after_load: usize,
    /// Distinct ids performed.
    pub performed: usize,
    /// Mails performed more than once.
    pub twice: usize,
    /// Mails answered 250 and never performed.
    pub lost: usize,
    /// Performed ids no mail carried.
    pub unexpected: usize,
    pub never_accepted: usize,
    pub submissions: u64,
    /// Mails answered a 4xx (or nothing) at least once, then submitted again.
    pub retried: usize,
    pub dedupe_hits: u64,
    /// The histories of the mails lost or performed twice (at most ten).
    pub stories: Vec<String>,
}

impl MailFigures {
    pub fn of(mails: &Mails, performed: &std::collections::HashMap<String, u32>) -> Self {
        let all = lock(mails);
        let times = |id: &str| performed.get(id).copied().unwrap_or(0);
        let ids: std::collections::HashSet<&str> = all.iter().map(|m| m.id.as_str()).collect();
        let twice: Vec<&Mail> = all.iter().filter(|m| times(&m.id) > 1).collect();
        let lost: Vec<&Mail> = all.iter().filter(|m| m.accepted && times(&m.id) == 0).collect();
        let stories = twice
            .iter()
            .chain(lost.iter())
            .take(10)
            .map(|m| format!("{} performed {} times: {}", m.id, times(&m.id), m.history.join("; ")))
            .collect();
        Self {
            mails: all.len(),
            accepted_during_load: all.iter().filter(|m| m.accepted && !m.accepted_after_load).count(),
            accepted_after_load: all.iter().filter(|m| m.accepted_after_load).count(),
            performed: performed.len(),
            twice: twice.len(),
            lost: lost.len(),
            unexpected: performed.keys().filter(|id| !ids.contains(id.as_str())).count(),
            never_accepted: all.iter().filter(|m| !m.accepted).count(),
            submissions: all.iter().map(|m| u64::from(m.submissions)).sum(),
            retried: all.iter().filter(|m| m.refusals > 0).count(),
            dedupe_hits: all.iter().map(|m| u64::from(m.dedupe_hits)).sum(),
            stories,
        }
    }
}

/// The spool as `aqgate admin spool` lists it.
pub struct Spool {
    /// Mails not forwarded yet (state `new` or `held`).
    pub unforwarded: usize,
    /// Mails forwarded whose reply is still owed (it goes out when the mail's claim ends).
    pub replies_owed: usize,
    pub listing: String,
}

impl Spool {
    pub fn empty(&self) -> bool {
        self.unforwarded == 0 && self.replies_owed == 0
    }
}

/// `aqgate admin spool` on `db` until no mail waits to be forwarded (with `replies`: and no
/// reply is owed either), for at most `within`; the last listing.
pub async fn wait_spool(db: &str, within: Duration, replies: bool) -> Spool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let out = super::aqgate(&["admin", "spool", "--database", db]).output().expect("aqgate admin spool");
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let rows: Vec<Vec<&str>> = listing
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.len() >= 5 && w[0].parse::<i64>().is_ok())
            .collect();
        let owed = |r: &Vec<&str>| r[4].split_once('/').is_some_and(|(sent, wanted)| sent < wanted);
        let s = Spool {
            unforwarded: rows.iter().filter(|r| r[1] == "new" || r[1] == "held").count(),
            replies_owed: rows.iter().filter(|r| r[1] != "new" && r[1] != "held" && owed(r)).count(),
            listing,
        };
        let done = if replies { s.empty() } else { s.unforwarded == 0 };
        if done || tokio::time::Instant::now() >= deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
