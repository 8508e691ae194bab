//! The forwarding worker: takes verified mails from the spool, posts each IDAP request to
//! the servlet over HTTP as the gateway agent on behalf of the verified agent, and mails
//! the response (or Fault) back. Retries with backoff while the servlet is unreachable;
//! a mail is forwarded once (its spool row records the response), and a re-sent copy gets
//! the original response again.
//!
//! Each mail is its own session: what it commits stays committed; open ON_COMMIT work it
//! leaves is rolled back right after, and the reply says so.
//!
//! Every forward carries an idempotency key made of the spool row's identity, which the
//! servlet records with the response in the request's own transaction. A forward repeated
//! after a crash (before the response reached the spool), or after an answer lost on the
//! way, gets the recorded response and performs nothing: a mail answered 250 is performed
//! exactly once.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::{AsyncFileTransport, AsyncTransport, Message, Tokio1Executor};
use tokio::sync::Notify;

use aqgate_core::clock::{Clock, MICROS_PER_SEC};
use aqgate_core::store::{SpooledMail, Store};
use aqgate_proto::names::{IDEMPOTENCY_HEADER, ON_BEHALF_HEADER, SESSION_COOKIE};

/// Where replies go.
#[derive(Clone)]
pub enum ReplyTransport {
    /// `.eml` files in a directory (the default: nothing leaves the machine).
    Files(std::path::PathBuf),
    /// An SMTP relay (`smtp://host:port`, plain, for a local MTA such as Postfix).
    Relay(String),
}

#[derive(Clone)]
pub struct WorkerConfig {
    /// The servlet's IDAP endpoint, e.g. `http://127.0.0.1:8470/aqserv`.
    pub servlet_url: String,
    pub gateway_agent: String,
    pub gateway_password: String,
    /// The From address of replies.
    pub reply_from: String,
    pub transport: ReplyTransport,
    /// Give up forwarding after this many failed attempts (the mail is then `failed`,
    /// visible in the spool, and its sender gets a Fault reply).
    pub max_attempts: i64,
    /// How long a finished mail is remembered: within it, a re-sent copy gets the original
    /// response again; after it, the copy is a new request.
    pub dedupe_window: Duration,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("servlet_url", &self.servlet_url)
            .field("gateway_agent", &self.gateway_agent)
            .field("reply_from", &self.reply_from)
            .finish_non_exhaustive()
    }
}

pub struct Worker {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    cfg: WorkerConfig,
    http: reqwest::Client,
    /// Rung when a mail is spooled.
    pub wake: Arc<Notify>,
}

/// Outcome of one forwarding attempt.
enum Forwarded {
    /// The servlet answered (IDAP response or Fault); `rolled_back`: open work undone.
    Answer { body: Vec<u8>, rolled_back: bool },
    /// Try again later.
    Retry(String),
    /// Will never work (e.g. the gateway's credentials are refused).
    Permanent(String),
}

const ROLLBACK: &str = r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlRollback xmlns="http://ns.oracle.com/AQ/schemas/access"/></Body></Envelope>"#;

impl Worker {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, cfg: WorkerConfig) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap_or_default();
        Self { store, clock, cfg, http, wake: Arc::new(Notify::new()) }
    }

    /// Works the spool until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut purged: Option<tokio::time::Instant> = None;
        loop {
            if purged.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                self.purge().await;
                purged = Some(tokio::time::Instant::now());
            }
            let worked = match self.run_once().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "mail worker");
                    0
                }
            };
            if worked > 0 {
                continue;
            }
            let notified = self.wake.notified();
            tokio::select! {
                _ = notified => {}
                // Retries come due without a wake-up.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Forgets finished mails older than the dedupe window.
    pub async fn purge(&self) {
        let window = i64::try_from(self.cfg.dedupe_window.as_micros()).unwrap_or(i64::MAX);
        match self.store.spool_purge(self.clock.now().saturating_sub(window)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(mails = n, "spool: finished mails past the dedupe window forgotten"),
            Err(e) => tracing::warn!(error = %e, "spool purge"),
        }
    }

    /// Forwards and answers what is due now, up to 8 mails at a time (each is its own
    /// session); returns how many mails it handled.
    pub async fn run_once(self: &Arc<Self>) -> Result<usize, aqgate_core::store::StoreError> {
        let due = self.store.spool_due(self.clock.now(), 32).await?;
        let n = due.len();
        let mut set = tokio::task::JoinSet::new();
        // Replies sent, recorded for the whole batch in one statement at its end. A crash
        // before that re-sends those replies (at least once), never re-forwards a mail:
        // the response itself is recorded before any reply goes out.
        let mut replied = Vec::new();
        let mut outcome = Ok(());
        for m in due {
            if set.len() >= 8
                && let Some(r) = set.join_next().await
            {
                collect(r, &mut replied, &mut outcome);
            }
            let me = self.clone();
            set.spawn(async move { me.handle(&m).await });
        }
        while let Some(r) = set.join_next().await {
            collect(r, &mut replied, &mut outcome);
        }
        self.store.spool_replied(&replied).await?;
        outcome.map(|()| n)
    }

    /// Forwards (if not done yet) and replies; returns (id, replies sent) when replies went out.
    async fn handle(&self, m: &SpooledMail) -> Result<Option<(i64, i64)>, aqgate_core::store::StoreError> {
        if !self.store.spool_claim(m.id, self.clock.now()).await? {
            // Another process's worker has it.
            return Ok(None);
        }
        let mut m = m.clone();
        if m.state == "new" {
            match self.forward(&m).await {
                Forwarded::Answer { body, rolled_back } => {
                    let body = if rolled_back { annotate_rollback(&body) } else { body };
                    self.store.spool_attempted(m.id, Some(&body), None, None).await?;
                    m.response = Some(body);
                }
                Forwarded::Retry(why) if m.attempts + 1 < self.cfg.max_attempts => {
                    let backoff = 2_i64.saturating_pow(u32::try_from(m.attempts.clamp(0, 8)).unwrap_or(8)).min(300);
                    tracing::info!(mail = m.id, attempt = m.attempts + 1, error = %why, "servlet unreachable; will retry");
                    let at = self.clock.now() + backoff * MICROS_PER_SEC;
                    return self.store.spool_attempted(m.id, None, Some(&why), Some(at)).await.map(|()| None);
                }
                Forwarded::Retry(why) | Forwarded::Permanent(why) => {
                    tracing::warn!(mail = m.id, error = %why, "forwarding failed for good");
                    let fault = fault_xml(&why);
                    self.store.spool_attempted(m.id, Some(fault.as_bytes()), Some(&why), None).await?;
                    m.response = Some(fault.into_bytes());
                }
            }
        }
        let Some(response) = m.response.clone() else { return Ok(None) };
        let mut sent = m.replies_sent;
        while sent < m.replies_wanted {
            if let Err(e) = self.reply(&m, &response).await {
                // The reply stays owed; the spool row is retried.
                tracing::warn!(mail = m.id, error = %e, "reply not sent; will retry");
                let at = self.clock.now() + 30 * MICROS_PER_SEC;
                self.store.spool_attempted(m.id, None, Some(&e), Some(at)).await?;
                break;
            }
            sent += 1;
        }
        Ok((sent > m.replies_sent).then_some((m.id, sent)))
    }

    async fn forward(&self, m: &SpooledMail) -> Forwarded {
        let post = |body: Vec<u8>, cookie: Option<&str>, key: Option<String>| {
            let mut rb = self
                .http
                .post(&self.cfg.servlet_url)
                .basic_auth(&self.cfg.gateway_agent, Some(&self.cfg.gateway_password))
                .header("content-type", "text/xml")
                .header(ON_BEHALF_HEADER, m.agent.clone())
                .body(body);
            if let Some(c) = cookie {
                rb = rb.header("cookie", c.to_string());
            }
            if let Some(k) = key {
                rb = rb.header(IDEMPOTENCY_HEADER, k);
            }
            rb.send()
        };
        let resp = match post(m.idap.clone(), None, Some(idempotency_key(m))).await {
            Ok(r) => r,
            // Not performed, or performed and recorded under the mail's key: either way the
            // next attempt (with the same key) answers it exactly once.
            Err(e) => return Forwarded::Retry(format!("servlet unreachable or its answer lost: {e}")),
        };
        let status = resp.status();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .filter(|c| c.starts_with(SESSION_COOKIE))
            .map(String::from);
        let body = match resp.bytes().await {
            Ok(b) => b.to_vec(),
            Err(e) => return Forwarded::Retry(format!("the servlet's answer was lost: {e}")),
        };
        if status.is_server_error() || status == reqwest::StatusCode::CONFLICT {
            // Not performed (refused before anything was done, e.g. too many sessions), or
            // performed under the mail's key (the next attempt gets the recorded answer),
            // or being performed by another attempt right now: safe to retry.
            return Forwarded::Retry(format!("servlet answered HTTP {status}"));
        }
        if !status.is_success() {
            return Forwarded::Permanent(format!("servlet refused the gateway: HTTP {status}"));
        }
        // A kept session means open work (or a browse position): this mail's session ends
        // here, so roll it back.
        let rolled_back = match cookie {
            Some(c) => post(ROLLBACK.as_bytes().to_vec(), Some(&c), None).await.is_ok(),
            None => false,
        };
        Forwarded::Answer { body, rolled_back }
    }

    async fn reply(&self, m: &SpooledMail, response: &[u8]) -> Result<(), String> {
        let subject = match m.subject.as_deref() {
            Some(s) if s.to_ascii_lowercase().starts_with("re:") => s.to_string(),
            Some(s) => format!("Re: {s}"),
            None => "Re: AQ request".to_string(),
        };
        let from = self.cfg.reply_from.parse().map_err(|e| format!("reply_from: {e}"))?;
        let to = m.reply_to.parse().map_err(|e| format!("reply address {}: {e}", m.reply_to))?;
        let mut b = Message::builder().from(from).to(to).subject(subject);
        if !m.message_id.is_empty() {
            let id = m.message_id.trim_start_matches('<').trim_end_matches('>');
            b = b.in_reply_to(format!("<{id}>")).references(format!("<{id}>"));
        }
        let msg = b
            .header(ContentType::parse("text/xml; charset=utf-8").map_err(|e| e.to_string())?)
            .body(String::from_utf8_lossy(response).to_string())
            .map_err(|e| format!("reply: {e}"))?;
        let mut msg = msg;
        msg.headers_mut()
            .insert_raw(HeaderValue::new(HeaderName::new_from_ascii_str("X-AQ-Request-Id"), format!("{}", m.id)));
        send_mail(&self.cfg.transport, msg).await
    }
}

/// The idempotency key of a spooled mail's forward: its spool row (id and body digest, so
/// that a row id used again by a rebuilt spool is another key).
fn idempotency_key(m: &SpooledMail) -> String {
    let digest: String = m.dedupe_key.chars().filter(char::is_ascii_alphanumeric).take(32).collect();
    format!("mail-{}-{digest}", m.id)
}

/// Gathers one handled mail's outcome: replies sent, or the first error.
fn collect(
    r: Result<Result<Option<(i64, i64)>, aqgate_core::store::StoreError>, tokio::task::JoinError>,
    replied: &mut Vec<(i64, i64)>,
    outcome: &mut Result<(), aqgate_core::store::StoreError>,
) {
    match r {
        Ok(Ok(Some(x))) => replied.push(x),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            if outcome.is_ok() {
                *outcome = Err(e);
            }
        }
        Err(e) => {
            if outcome.is_ok() {
                *outcome = Err(aqgate_core::store::StoreError::corrupt(format!("mail worker task: {e}")));
            }
        }
    }
}

/// Sends one message through `transport` (also used for `mailto:` notifications).
pub async fn send_mail(transport: &ReplyTransport, msg: Message) -> Result<(), String> {
    match transport {
        ReplyTransport::Files(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("outbox {}: {e}", dir.display()))?;
            AsyncFileTransport::<Tokio1Executor>::new(dir).send(msg).await.map(|_| ()).map_err(|e| e.to_string())
        }
        ReplyTransport::Relay(url) => relay_send(url, &msg).await,
    }
}

/// Sends through a plain SMTP relay (`smtp://HOST:PORT`, a local MTA) with lettre's SMTP
/// client on a socket of our own: lettre's transport leaves Nagle's algorithm on, and its
/// small final write (`.` after the body) then waits for the relay's delayed ACK — 40 ms
/// per mail. With TCP_NODELAY a mail costs one transaction on a connection that is kept
/// for the next mail (see [`RelayPool`]).
async fn relay_send(url: &str, msg: &Message) -> Result<(), String> {
    let addr = crate::reinject::parse_target(url)?;
    let (envelope, body) = (msg.envelope(), msg.formatted());
    if let Some(mut conn) = RelayPool::take(&addr) {
        match tokio::time::timeout(Duration::from_secs(60), conn.send(envelope, &body)).await {
            Ok(Ok(_)) => {
                RelayPool::put(&addr, conn);
                return Ok(());
            }
            // The relay answered with a code: that is its verdict, not a broken connection.
            Ok(Err(e)) if e.status().is_some() => return Err(format!("relay {addr}: {e}")),
            Err(_) => return Err(format!("relay {addr}: timed out")),
            // The relay closed the idle connection meanwhile: try once more on a new one.
            Ok(Err(e)) => tracing::debug!(error = %e, "pooled relay connection broken; reconnecting"),
        }
    }
    let fresh = async {
        use lettre::transport::smtp::client::AsyncSmtpConnection;
        use lettre::transport::smtp::extension::ClientId;
        let tcp = tokio::net::TcpStream::connect(&addr).await.map_err(|e| format!("relay {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let hello = ClientId::Domain(hostname());
        let mut conn = AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello)
            .await
            .map_err(|e| format!("relay {addr}: {e}"))?;
        match conn.send(envelope, &body).await {
            Ok(_) => {
                RelayPool::put(&addr, conn);
                Ok(())
            }
            Err(e) => {
                let _ = conn.quit().await;
                Err(format!("relay {addr}: {e}"))
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), fresh).await.map_err(|_| format!("relay {addr}: timed out"))?
}

/// Idle connections to relays, reused for the next mail as Postfix's connection cache does:
/// a reply then costs MAIL, RCPT and DATA instead of a connection, banner, EHLO and QUIT.
/// A connection idle for [`RELAY_IDLE`] is closed (relays time idle clients out, Postfix
/// after 300 s); at most [`RELAY_POOLED`] are kept per process.
struct RelayPool;

type Pooled = (String, lettre::transport::smtp::client::AsyncSmtpConnection, std::time::Instant);

const RELAY_IDLE: Duration = Duration::from_secs(10);
const RELAY_POOLED: usize = 16;

impl RelayPool {
    fn slots() -> std::sync::MutexGuard<'static, Vec<Pooled>> {
        static POOL: std::sync::OnceLock<std::sync::Mutex<Vec<Pooled>>> = std::sync::OnceLock::new();
        POOL.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(addr: &str) -> Option<lettre::transport::smtp::client::AsyncSmtpConnection> {
        let mut slots = Self::slots();
        slots.retain(|(_, _, idle_since)| idle_since.elapsed() < RELAY_IDLE);
        let i = slots.iter().rposition(|(a, _, _)| a == addr)?;
        Some(slots.swap_remove(i).1)
    }

    fn put(addr: &str, conn: lettre::transport::smtp::client::AsyncSmtpConnection) {
        if conn.has_broken() {
            return;
        }
        let mut slots = Self::slots();
        if slots.len() < RELAY_POOLED {
            slots.push((addr.to_string(), conn, std::time::Instant::now()));
        }
    }
}

/// The name said in EHLO to the relay.
fn hostname() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
            .unwrap_or_else(|| "localhost".to_string())
    })
    .clone()
}

/// Marks a response whose mail left ON_COMMIT work open: that work was rolled back.
fn annotate_rollback(body: &[u8]) -> Vec<u8> {
    let note = b"<!-- aqgate: this request left uncommitted work; it was rolled back when the mail's session ended. Add <AQXmlCommit/> to commit it. -->\n";
    let text = String::from_utf8_lossy(body);
    // After the XML declaration, if any, so the document stays well-formed.
    match text.strip_prefix("<?xml").and_then(|rest| rest.find("?>").map(|i| i + 7)) {
        Some(end) => {
            let mut out = body[..end].to_vec();
            out.push(b'\n');
            out.extend_from_slice(note);
            out.extend_from_slice(&body[end..]);
            out
        }
        None => [note.as_slice(), body].concat(),
    }
}

fn fault_xml(why: &str) -> String {
    use aqgate_proto::idap::{Envelope, Fault, FaultKind, Response, write_response};
    write_response(&Envelope {
        headers: Vec::new(),
        body: Response::Fault(Fault {
            kind: FaultKind::Server,
            code: aqgate_proto::code::INTERNAL,
            message: why.to_string(),
        }),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// What the fake relay does.
    #[derive(Clone, Copy)]
    enum Relay {
        /// Keeps connections open for further transactions.
        Keep,
        /// Closes every connection after its first message (an idle timeout, early).
        CloseAfterMessage,
        /// Takes one message per connection, then refuses recipients with 550.
        RefuseAfterFirst,
    }

    struct Counts {
        connections: AtomicUsize,
        messages: AtomicUsize,
    }

    async fn fake_relay(mode: Relay) -> (String, Arc<Counts>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("fake relay");
        let url = format!("smtp://{}", listener.local_addr().expect("fake relay"));
        let counts = Arc::new(Counts { connections: AtomicUsize::new(0), messages: AtomicUsize::new(0) });
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                c.connections.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut lines = BufReader::new(read).lines();
                    write.write_all(b"220 fake relay\r\n").await.expect("fake relay");
                    let mut in_data = false;
                    let mut taken = 0;
                    while let Ok(Some(line)) = lines.next_line().await {
                        if in_data {
                            if line == "." {
                                in_data = false;
                                c.messages.fetch_add(1, Ordering::SeqCst);
                                taken += 1;
                                write.write_all(b"250 2.0.0 queued\r\n").await.expect("fake relay");
                                if matches!(mode, Relay::CloseAfterMessage) {
                                    return;
                                }
                            }
                            continue;
                        }
                        let verb = line.get(..4).unwrap_or_default().to_ascii_uppercase();
                        let reply: &[u8] = match verb.as_str() {
                            "EHLO" | "HELO" => b"250 fake relay\r\n",
                            "RCPT" if matches!(mode, Relay::RefuseAfterFirst) && taken > 0 => {
                                b"550 5.1.1 no such user\r\n"
                            }
                            "DATA" => {
                                in_data = true;
                                b"354 go ahead\r\n"
                            }
                            "QUIT" => {
                                let _ = write.write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"250 ok\r\n",
                        };
                        write.write_all(reply).await.expect("fake relay");
                    }
                });
            }
        });
        (url, counts)
    }

    fn message(n: usize) -> Message {
        Message::builder()
            .from("aq@example.com".parse().expect("fake relay"))
            .to("scott@example.com".parse().expect("fake relay"))
            .subject(format!("Re: request {n}"))
            .body(format!("<reply n=\"{n}\"/>"))
            .expect("fake relay")
    }

    #[tokio::test]
    async fn relay_connections_are_reused() {
        let (url, counts) = fake_relay(Relay::Keep).await;
        let transport = ReplyTransport::Relay(url);
        for n in 0..3 {
            send_mail(&transport, message(n)).await.unwrap();
        }
        assert_eq!(counts.messages.load(Ordering::SeqCst), 3);
        assert_eq!(counts.connections.load(Ordering::SeqCst), 1, "one connection for three mails");
    }

    #[tokio::test]
    async fn a_connection_the_relay_closed_is_replaced() {
        let (url, counts) = fake_relay(Relay::CloseAfterMessage).await;
        let transport = ReplyTransport::Relay(url);
        for n in 0..3 {
            send_mail(&transport, message(n)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await; // let the close arrive
        }
        assert_eq!(counts.messages.load(Ordering::SeqCst), 3, "every mail delivered once");
        assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refusal_on_a_pooled_connection_is_the_answer() {
        let (url, counts) = fake_relay(Relay::RefuseAfterFirst).await;
        let transport = ReplyTransport::Relay(url);
        send_mail(&transport, message(0)).await.unwrap();
        let err = send_mail(&transport, message(1)).await.unwrap_err();
        assert!(err.contains("no such user"), "{err}");
        // Refused on the kept connection, and not tried again on a new one.
        assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
        assert_eq!(counts.messages.load(Ordering::SeqCst), 1);
    }
}
