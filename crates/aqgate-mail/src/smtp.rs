//! The SMTP receiving side: a session loop generic over its stream, with smtp-proto parsing
//! the commands. The session knows SMTP; what happens to a complete message (verify, spool)
//! is the [`Acceptor`]'s business, and its answer is sent at the end of DATA.
//!
//! Time is bounded in every phase, so that no client holds a connection slot for long
//! without sending mail: outside a transaction MAIL FROM must come within
//! `mail_timeout` of the connection or of the previous message (NOOP and RSET do not
//! extend it); DATA must end within `data_timeout` of its 354; inside a transaction a
//! client may be silent for `idle_timeout`; the whole session lasts `max_session` at most.
//! Each ends with `421 4.4.2` and is counted. The body goes to disk past the spool's
//! memory share ([`crate::data`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use smtp_proto::request::receiver::{DataReceiver, RequestReceiver};
use smtp_proto::{Error as ProtoError, Request};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::data::{Body, DataSpool, Refused};
use crate::limits::{Network, SmtpCounters};

/// An SMTP reply: code, enhanced status, text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    /// Enhanced status code (RFC 3463), or empty.
    pub status: &'static str,
    pub text: String,
    /// Further lines of a multi-line reply (EHLO's keywords).
    pub more: Vec<String>,
}

impl Reply {
    pub fn new(code: u16, status: &'static str, text: impl Into<String>) -> Self {
        Self { code, status, text: text.into(), more: Vec::new() }
    }

    fn render(&self) -> String {
        // Control characters in a reason must not inject further replies.
        let clean = |t: &str| -> String { t.chars().map(|c| if c.is_control() { ' ' } else { c }).collect() };
        let mut lines = vec![match self.status {
            "" => clean(&self.text),
            st => format!("{st} {}", clean(&self.text)),
        }];
        lines.extend(self.more.iter().map(|l| clean(l)));
        let last = lines.len() - 1;
        let mut out = String::new();
        for (i, l) in lines.iter().enumerate() {
            let sep = if i == last { ' ' } else { '-' };
            out.push_str(&format!("{}{sep}{l}\r\n", self.code));
        }
        out
    }
}

/// One accepted recipient of a mail transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// The address as the client gave it (case kept: a local part may be case-sensitive).
    pub address: String,
    /// One of the gateway's own addresses (the mail is an AQ request for it).
    pub gateway: bool,
}

/// The envelope of a complete message: what MAIL FROM and RCPT TO said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailEnvelope {
    /// The envelope sender; empty for the null sender `<>` (bounces, notifications).
    pub mail_from: String,
    /// The accepted recipients, in RCPT order.
    pub rcpts: Vec<Recipient>,
    /// The client declared `BODY=8BITMIME`.
    pub body_8bit: bool,
    /// The session speaks LMTP: the answer is one reply per recipient.
    pub lmtp: bool,
}

/// Decides about a complete message at the end of DATA.
#[async_trait]
pub trait Acceptor: Send + Sync {
    /// The answer to the message: in SMTP the first reply is the answer (one answer for the
    /// whole mail); in LMTP one reply per recipient in RCPT order, or a single reply that
    /// then holds for every recipient.
    async fn accept(&self, envelope: &MailEnvelope, raw: &[u8]) -> Vec<Reply>;
}

/// How a session ended.
pub enum Ended<S> {
    Closed,
    /// The client asked for STARTTLS and was told to go ahead: the caller performs the TLS
    /// handshake on this stream and runs a new session on it (RFC 3207: everything said
    /// before, EHLO included, is forgotten, and bytes pipelined after STARTTLS were dropped).
    StartTls(S),
}

#[derive(Debug, Clone)]
pub struct SmtpConfig {
    pub hostname: String,
    /// Addresses this gateway takes mail for (lower-case); others get 550 unless
    /// `reinject` is set.
    pub gateway_addresses: Vec<String>,
    /// `HOST:PORT` of the SMTP server that mail for other recipients is handed on to
    /// (Postfix's after-filter smtpd, when aqgate is a before-queue content filter). When
    /// set, every recipient is accepted: the MTA in front did the relay control.
    pub reinject: Option<String>,
    /// Largest message accepted (bytes); larger gets 552.
    pub max_message_size: usize,
    /// A client silent for this long inside a transaction is disconnected (421).
    pub idle_timeout: Duration,
    /// Outside a transaction, MAIL FROM must come within this of the connection (or of the
    /// previous message's reply); else 421.
    pub mail_timeout: Duration,
    /// DATA must end within this of its 354; else 421.
    pub data_timeout: Duration,
    /// Where bodies past the memory share go, and how many large ones are decided at once.
    pub spool: Arc<DataSpool>,
    /// Sessions the listener holds at once; more are refused with 421.
    pub max_connections: usize,
    /// Sessions one client (an IPv4 address, an IPv6 /64) holds at once; more are refused
    /// with 421 4.7.0.
    pub max_per_client: usize,
    /// Clients the per-client limit does not apply to (an MTA in front).
    pub per_client_exempt: Vec<Network>,
    pub counters: SmtpCounters,
    /// Whether STARTTLS is offered (the caller holds a TLS configuration).
    pub starttls: bool,
    /// Longest a whole session may last (421 after it).
    pub max_session: Duration,
    /// Speak LMTP (RFC 2033: LHLO, one reply per recipient after DATA) instead of SMTP,
    /// e.g. behind a Postfix `lmtp:` content filter.
    pub lmtp: bool,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            hostname: "localhost".into(),
            gateway_addresses: vec!["aq@localhost".into()],
            reinject: None,
            max_message_size: 10 * 1024 * 1024,
            idle_timeout: Duration::from_secs(300),
            mail_timeout: Duration::from_secs(30),
            data_timeout: Duration::from_secs(300),
            spool: DataSpool::new(std::env::temp_dir(), 1 << 20, 4),
            max_connections: 256,
            max_per_client: 16,
            per_client_exempt: Vec::new(),
            counters: SmtpCounters::default(),
            starttls: false,
            max_session: Duration::from_secs(1800),
            lmtp: false,
        }
    }
}

#[derive(Default)]
struct Envelope {
    helo: bool,
    /// The client said LHLO: LMTP replies after DATA.
    lmtp: bool,
    mail_from: Option<String>,
    body_8bit: bool,
    rcpts: Vec<Recipient>,
}

enum Mode {
    Command,
    /// Receiving the body, which must end by `until`.
    Data {
        body: Body,
        receiver: DataReceiver,
        until: Instant,
    },
}

/// The limit a read waits against: the nearest one says what a timeout means.
#[derive(Clone, Copy)]
enum Phase {
    BeforeMail,
    Data,
    Idle,
}

/// Writes and flushes `bytes`, within `limit`: a client that does not read its replies
/// cannot hold the session.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8], limit: Duration) -> std::io::Result<()> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    match tokio::time::timeout(limit, write).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read its replies")),
    }
}

/// Runs one SMTP session until QUIT, disconnect, a time limit or STARTTLS. `tls`: the
/// stream is already encrypted (no greeting is sent again, STARTTLS is not offered).
pub async fn run_session<S>(
    mut stream: S,
    cfg: &SmtpConfig,
    acceptor: &dyn Acceptor,
    tls: bool,
) -> std::io::Result<Ended<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if !tls {
        send(&mut stream, format!("220 {} ESMTP aqgate\r\n", cfg.hostname).as_bytes(), cfg.idle_timeout).await?;
    }
    let offer_tls = cfg.starttls && !tls;
    // Besides the limits of each phase, a whole session is bounded: a client trickling a
    // byte now and then cannot hold a connection slot for ever.
    let deadline = Instant::now() + cfg.max_session;
    // Outside a transaction, MAIL FROM must come by then (set again after each message).
    let mut mail_by = Instant::now() + cfg.mail_timeout;
    let mut env = Envelope::default();
    let mut receiver = RequestReceiver::default();
    let mut mode = Mode::Command;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let idle = (Instant::now() + cfg.idle_timeout, Phase::Idle);
        let phase = match &mode {
            Mode::Data { until, .. } => (*until, Phase::Data),
            Mode::Command if env.mail_from.is_none() => (mail_by, Phase::BeforeMail),
            Mode::Command => idle,
        };
        let nearest = [phase, idle, (deadline, Phase::Idle)].into_iter().min_by_key(|(at, _)| *at).unwrap_or(idle);
        let n = match tokio::time::timeout_at(nearest.0, stream.read(&mut chunk)).await {
            Ok(Ok(0)) => return Ok(Ended::Closed),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                let (counter, why) = match nearest.1 {
                    Phase::BeforeMail => (&cfg.counters.timeout_before_mail, "no mail transaction in time"),
                    Phase::Data => (&cfg.counters.timeout_data, "the message did not arrive in time"),
                    Phase::Idle => (&cfg.counters.timeout_idle, "timeout"),
                };
                counter.inc();
                let bye = format!("421 4.4.2 {} {why}, closing\r\n", cfg.hostname);
                send(&mut stream, bye.as_bytes(), cfg.idle_timeout).await?;
                return Ok(Ended::Closed);
            }
        };
        let mut bytes = chunk[..n].iter();
        let mut out = String::new();
        loop {
            match &mut mode {
                Mode::Data { body, receiver: data, .. } => {
                    let done = data.ingest(&mut bytes, &mut body.buf);
                    let was_spooled = body.spooled();
                    if let Some(e) = body.settle(cfg.max_message_size, &cfg.spool).await {
                        cfg.counters.data_spool_failed.inc();
                        tracing::warn!(error = %e, "SMTP: writing a mail body to disk failed");
                    }
                    if body.spooled() && !was_spooled {
                        cfg.counters.data_spooled.inc();
                    }
                    if !done {
                        break;
                    }
                    let Mode::Data { body, .. } = std::mem::replace(&mut mode, Mode::Command) else {
                        unreachable!("matched above")
                    };
                    let replies = decide(body, &env, cfg, acceptor).await;
                    let fallback = Reply::new(451, "4.3.0", "no decision about the message; try again later");
                    let first = replies.first().unwrap_or(&fallback);
                    if env.lmtp {
                        // LMTP answers once per accepted recipient (RFC 2033).
                        for i in 0..env.rcpts.len().max(1) {
                            let r = if replies.len() == env.rcpts.len() { &replies[i] } else { first };
                            out.push_str(&r.render());
                        }
                    } else {
                        out.push_str(&first.render());
                    }
                    env.mail_from = None;
                    env.body_8bit = false;
                    env.rcpts.clear();
                    mail_by = Instant::now() + cfg.mail_timeout;
                }
                Mode::Command => {
                    if bytes.as_slice().is_empty() {
                        break;
                    }
                    let (reply, next) = match receiver.ingest(&mut bytes) {
                        Ok(req) => command(req, &mut env, cfg, offer_tls),
                        Err(ProtoError::NeedsMoreData { .. }) => break,
                        Err(ProtoError::ResponseTooLong) => (Reply::new(500, "5.5.2", "line too long"), Next::Stay),
                        Err(ProtoError::UnknownCommand) => {
                            (Reply::new(502, "5.5.1", "command not implemented"), Next::Stay)
                        }
                        Err(e) => (Reply::new(501, "5.5.4", format!("syntax error: {e:?}")), Next::Stay),
                    };
                    out.push_str(&reply.render());
                    match next {
                        Next::Stay => {}
                        Next::Data => {
                            let until = Instant::now() + cfg.data_timeout;
                            mode = Mode::Data { body: Body::new(), receiver: DataReceiver::new(), until }
                        }
                        Next::Quit => {
                            send(&mut stream, out.as_bytes(), cfg.idle_timeout).await?;
                            return Ok(Ended::Closed);
                        }
                        Next::StartTls => {
                            // Whatever the client pipelined after STARTTLS is discarded: it
                            // was sent in the clear and must not be taken as if encrypted.
                            send(&mut stream, out.as_bytes(), cfg.idle_timeout).await?;
                            return Ok(Ended::StartTls(stream));
                        }
                    }
                }
            }
        }
        if !out.is_empty() {
            send(&mut stream, out.as_bytes(), cfg.idle_timeout).await?;
        }
    }
}

/// The answer to a complete body: refused for its size or for want of storage, else the
/// acceptor's. A body that went to disk is read back whole in its turn among the large
/// messages (at most the spool's number at once).
async fn decide(body: Body, env: &Envelope, cfg: &SmtpConfig, acceptor: &dyn Acceptor) -> Vec<Reply> {
    let storage = || Reply::new(452, "4.3.1", "insufficient system storage for the message; try again later");
    match body.refused() {
        Some(Refused::TooBig) => {
            return vec![Reply::new(552, "5.3.4", format!("message larger than {} bytes", cfg.max_message_size))];
        }
        Some(Refused::Storage) => return vec![storage()],
        None => {}
    }
    let _turn = if body.spooled() {
        match tokio::time::timeout(cfg.idle_timeout, cfg.spool.large_turn()).await {
            Ok(turn) => Some(turn),
            Err(_) => return vec![Reply::new(451, "4.3.2", "too many large messages at once; try again later")],
        }
    } else {
        None
    };
    let raw = match body.into_bytes().await {
        Ok(raw) => raw,
        Err(e) => {
            cfg.counters.data_spool_failed.inc();
            tracing::warn!(error = %e, "SMTP: reading a mail body back from disk failed");
            return vec![storage()];
        }
    };
    let envelope = MailEnvelope {
        mail_from: env.mail_from.clone().unwrap_or_default(),
        rcpts: env.rcpts.clone(),
        body_8bit: env.body_8bit,
        lmtp: env.lmtp,
    };
    acceptor.accept(&envelope, &raw).await
}

enum Next {
    Stay,
    Data,
    Quit,
    StartTls,
}

fn command(
    req: Request<std::borrow::Cow<'_, str>>,
    env: &mut Envelope,
    cfg: &SmtpConfig,
    offer_tls: bool,
) -> (Reply, Next) {
    match req {
        Request::Lhlo { .. } if !cfg.lmtp => (Reply::new(500, "5.5.1", "this is SMTP; say EHLO"), Next::Stay),
        Request::Ehlo { .. } | Request::Helo { .. } if cfg.lmtp => {
            (Reply::new(500, "5.5.1", "this is LMTP; say LHLO"), Next::Stay)
        }
        Request::Ehlo { host } | Request::Lhlo { host } => {
            env.helo = true;
            env.lmtp = cfg.lmtp;
            env.mail_from = None;
            env.body_8bit = false;
            env.rcpts.clear();
            let mut r = Reply::new(250, "", format!("{} greets {host}", cfg.hostname));
            r.more = vec![format!("SIZE {}", cfg.max_message_size), "8BITMIME".into(), "ENHANCEDSTATUSCODES".into()];
            if offer_tls {
                r.more.push("STARTTLS".into());
            }
            (r, Next::Stay)
        }
        Request::Helo { host } => {
            env.helo = true;
            (Reply::new(250, "2.0.0", format!("{} greets {host}", cfg.hostname)), Next::Stay)
        }
        Request::Mail { from } => {
            if !env.helo {
                return (Reply::new(503, "5.5.1", "say EHLO first"), Next::Stay);
            }
            if env.mail_from.is_some() {
                return (Reply::new(503, "5.5.1", "nested MAIL command"), Next::Stay);
            }
            if from.size > cfg.max_message_size {
                return (
                    Reply::new(552, "5.3.4", format!("message larger than {} bytes", cfg.max_message_size)),
                    Next::Stay,
                );
            }
            env.mail_from = Some(from.address.to_string());
            env.body_8bit = from.flags & smtp_proto::MAIL_BODY_8BITMIME != 0;
            (Reply::new(250, "2.1.0", "sender ok"), Next::Stay)
        }
        Request::Rcpt { to } => {
            if env.mail_from.is_none() {
                return (Reply::new(503, "5.5.1", "need MAIL before RCPT"), Next::Stay);
            }
            let gateway = cfg.gateway_addresses.contains(&to.address.to_ascii_lowercase());
            if !gateway && cfg.reinject.is_none() {
                let addr = to.address.to_ascii_lowercase();
                return (Reply::new(550, "5.1.1", format!("<{addr}>: not an AQ gateway address here")), Next::Stay);
            }
            if env.rcpts.len() >= 100 {
                return (Reply::new(452, "4.5.3", "too many recipients"), Next::Stay);
            }
            env.rcpts.push(Recipient { address: to.address.to_string(), gateway });
            (Reply::new(250, "2.1.5", "recipient ok"), Next::Stay)
        }
        Request::Data => {
            if env.rcpts.is_empty() {
                return (Reply::new(503, "5.5.1", "need RCPT before DATA"), Next::Stay);
            }
            (Reply::new(354, "", "end data with <CR><LF>.<CR><LF>"), Next::Data)
        }
        Request::Rset => {
            env.mail_from = None;
            env.body_8bit = false;
            env.rcpts.clear();
            (Reply::new(250, "2.0.0", "reset"), Next::Stay)
        }
        Request::Noop { .. } => (Reply::new(250, "2.0.0", "ok"), Next::Stay),
        Request::Vrfy { .. } => (Reply::new(252, "2.5.0", "cannot verify"), Next::Stay),
        Request::Quit => (Reply::new(221, "2.0.0", "bye"), Next::Quit),
        Request::StartTls if offer_tls => (Reply::new(220, "2.0.0", "ready to start TLS"), Next::StartTls),
        Request::StartTls => (Reply::new(454, "4.7.0", "TLS not available"), Next::Stay),
        Request::Bdat { .. } => (Reply::new(502, "5.5.1", "BDAT not supported; use DATA"), Next::Stay),
        Request::Auth { .. } => {
            (Reply::new(502, "5.5.1", "AUTH not supported: mail is authenticated by its S/MIME signature"), Next::Stay)
        }
        _ => (Reply::new(502, "5.5.1", "command not implemented"), Next::Stay),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Accepts everything, remembering what it saw. In LMTP it answers per recipient:
    /// 250 for gateway recipients, 451 for the others.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Vec<u8>>>, Mutex<Vec<MailEnvelope>>);

    #[async_trait]
    impl Acceptor for Recorder {
        async fn accept(&self, env: &MailEnvelope, raw: &[u8]) -> Vec<Reply> {
            self.0.lock().expect("lock").push(raw.to_vec());
            self.1.lock().expect("lock").push(env.clone());
            if raw.windows(6).any(|w| w == b"REJECT") {
                vec![Reply::new(550, "5.7.1", "signature does not verify")]
            } else if raw.windows(9).any(|w| w == b"PER-RCPT!") {
                env.rcpts
                    .iter()
                    .map(
                        |r| {
                            if r.gateway {
                                Reply::new(250, "2.0.0", "queued")
                            } else {
                                Reply::new(451, "4.4.1", "later")
                            }
                        },
                    )
                    .collect()
            } else {
                vec![Reply::new(250, "2.0.0", "queued")]
            }
        }
    }

    /// Plays a client script against a session over an in-memory stream; returns the
    /// server's whole output.
    async fn converse(cfg: &SmtpConfig, acc: &Recorder, client: &[&str]) -> String {
        let (mut c, s) = tokio::io::duplex(1 << 20);
        let server = async {
            let _ = run_session(s, cfg, acc, false).await.expect("session");
        };
        let script = async {
            let mut out = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            for line in client {
                c.write_all(line.as_bytes()).await.expect("write");
                // Let the server answer before the next command (no pipelining assumed).
                let n = c.read(&mut buf).await.expect("read");
                out.extend_from_slice(&buf[..n]);
            }
            drop(c);
            String::from_utf8_lossy(&out).to_string()
        };
        let (_, out) = tokio::join!(server, script);
        out
    }

    fn codes(out: &str) -> Vec<&str> {
        out.lines().filter(|l| l.len() >= 4 && &l[3..4] == " ").map(|l| &l[..3]).collect()
    }

    #[tokio::test]
    async fn a_mail_to_the_gateway_is_handed_to_the_acceptor() {
        let cfg = SmtpConfig::default();
        let acc = Recorder::default();
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "EHLO client\r\n",
                "MAIL FROM:<scott@example.com>\r\n",
                "RCPT TO:<nobody@localhost>\r\n",
                "RCPT TO:<AQ@localhost>\r\n",
                "DATA\r\n",
                "Subject: x\r\n\r\nhello\r\n..dot\r\n.\r\n",
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(codes(&out), ["220", "250", "250", "550", "250", "354", "250", "221"], "{out}");
        assert!(out.contains("250-SIZE"), "{out}");
        let seen = acc.0.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        let env = &acc.1.lock().expect("lock")[0];
        assert_eq!(env.mail_from, "scott@example.com");
        assert_eq!(env.rcpts, [Recipient { address: "AQ@localhost".into(), gateway: true }]);
        assert!(!env.lmtp && !env.body_8bit);
        assert!(
            String::from_utf8_lossy(&seen[0]).contains("hello\r\n.dot"),
            "dot-unstuffed: {:?}",
            String::from_utf8_lossy(&seen[0])
        );
    }

    #[tokio::test]
    async fn starttls_drops_what_was_pipelined_before_the_handshake() {
        let cfg = SmtpConfig { starttls: true, ..SmtpConfig::default() };
        let acc = Recorder::default();
        let (mut c, s) = tokio::io::duplex(1 << 16);
        let server = async { run_session(s, &cfg, &acc, false).await.expect("session") };
        let client = async {
            let mut buf = vec![0u8; 4096];
            let mut out = Vec::new();
            let n = c.read(&mut buf).await.expect("greeting");
            out.extend_from_slice(&buf[..n]);
            c.write_all(b"EHLO c\r\n").await.expect("write");
            let n = c.read(&mut buf).await.expect("ehlo");
            out.extend_from_slice(&buf[..n]);
            // An attacker's command rides along in the same packet as STARTTLS.
            c.write_all(b"STARTTLS\r\nMAIL FROM:<evil@x>\r\n").await.expect("write");
            let n = c.read(&mut buf).await.expect("starttls");
            out.extend_from_slice(&buf[..n]);
            String::from_utf8_lossy(&out).to_string()
        };
        let (ended, out) = tokio::join!(server, client);
        assert!(out.contains("250-STARTTLS") || out.contains("250 STARTTLS"), "{out}");
        assert!(out.ends_with("220 2.0.0 ready to start TLS\r\n"), "nothing answered the pipelined MAIL: {out}");
        assert!(matches!(ended, Ended::StartTls(_)), "the caller gets the stream for the handshake");
    }

    #[tokio::test]
    async fn lmtp_answers_once_per_recipient() {
        let cfg = SmtpConfig {
            lmtp: true,
            gateway_addresses: vec!["aq@localhost".into(), "aq2@localhost".into()],
            ..SmtpConfig::default()
        };
        let acc = Recorder::default();
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "EHLO c\r\n",
                "LHLO c\r\n",
                "MAIL FROM:<scott@example.com>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "RCPT TO:<aq2@localhost>\r\n",
                "DATA\r\n",
                "Subject: x\r\n\r\nhi\r\n.\r\n",
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(codes(&out), ["220", "500", "250", "250", "250", "250", "354", "250", "250", "221"], "{out}");
        assert_eq!(acc.0.lock().expect("lock").len(), 1, "one message, decided once");
    }

    #[tokio::test]
    async fn sequence_errors_oversize_and_rejections() {
        let cfg = SmtpConfig { max_message_size: 64, ..SmtpConfig::default() };
        let acc = Recorder::default();
        let big = format!("{}\r\n.\r\n", "x".repeat(200));
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "MAIL FROM:<a@b>\r\n",
                "HELO c\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                "MAIL FROM:<a@b> SIZE=1000\r\n",
                "MAIL FROM:<a@b>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                &big,
                "MAIL FROM:<a@b>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                "REJECT\r\n.\r\n",
                "BOGUS\r\n",
                "STARTTLS\r\n",
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(
            codes(&out),
            [
                "220", "503", "250", "503", "503", "552", "250", "250", "354", "552", "250", "250", "354", "550",
                "502", "454", "221"
            ],
            "{out}"
        );
        assert_eq!(acc.0.lock().expect("lock").len(), 1, "the oversized message never reached the acceptor");
    }

    #[tokio::test]
    async fn with_reinjection_every_recipient_is_accepted_and_reaches_the_acceptor() {
        let cfg = SmtpConfig { reinject: Some("127.0.0.1:10026".into()), ..SmtpConfig::default() };
        let acc = Recorder::default();
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "EHLO postfix\r\n",
                "MAIL FROM:<> BODY=8BITMIME\r\n",
                "RCPT TO:<Bob@Example.com>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                "Subject: x\r\n\r\nhello\r\n.\r\n",
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(codes(&out), ["220", "250", "250", "250", "250", "354", "250", "221"], "{out}");
        let env = &acc.1.lock().expect("lock")[0];
        assert_eq!(env.mail_from, "", "the null sender");
        assert!(env.body_8bit);
        assert_eq!(
            env.rcpts,
            [
                Recipient { address: "Bob@Example.com".into(), gateway: false },
                Recipient { address: "aq@localhost".into(), gateway: true }
            ]
        );
    }

    #[tokio::test]
    async fn lmtp_passes_per_recipient_replies_on() {
        let cfg = SmtpConfig { lmtp: true, reinject: Some("127.0.0.1:10026".into()), ..SmtpConfig::default() };
        let acc = Recorder::default();
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "LHLO c\r\n",
                "MAIL FROM:<scott@example.com>\r\n",
                "RCPT TO:<bob@example.com>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                "Subject: PER-RCPT!\r\n\r\nhi\r\n.\r\n",
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(codes(&out), ["220", "250", "250", "250", "250", "354", "451", "250", "221"], "{out}");
    }

    /// A client over an in-memory stream that sends at chosen moments (time is paused and
    /// advances by itself while everyone waits).
    struct Client(tokio::io::DuplexStream, tokio::time::Instant);

    impl Client {
        fn start(cfg: SmtpConfig, acc: Arc<Recorder>) -> (Self, tokio::task::JoinHandle<()>) {
            let (c, s) = tokio::io::duplex(1 << 20);
            let server = tokio::spawn(async move {
                let _ = run_session(s, &cfg, acc.as_ref(), false).await;
            });
            (Self(c, tokio::time::Instant::now()), server)
        }

        async fn say(&mut self, line: &str) -> String {
            self.0.write_all(line.as_bytes()).await.expect("write");
            self.reply().await
        }

        async fn reply(&mut self) -> String {
            let mut buf = vec![0u8; 4096];
            let n = self.0.read(&mut buf).await.expect("read");
            String::from_utf8_lossy(&buf[..n]).to_string()
        }

        fn secs(&self) -> u64 {
            self.1.elapsed().as_secs()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn before_mail_a_client_has_the_short_timeout_and_noop_does_not_extend_it() {
        let metrics = aqgate_core::metrics::Metrics::new();
        let counters = SmtpCounters::register(&metrics);
        let cfg = SmtpConfig { counters: counters.clone(), ..SmtpConfig::default() };
        let (mut c, server) = Client::start(cfg, Arc::default());
        assert!(c.reply().await.starts_with("220"));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(c.say("EHLO c\r\n").await.starts_with("250"));
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert!(c.say("NOOP\r\n").await.starts_with("250"));
        let bye = c.reply().await;
        assert!(bye.starts_with("421 4.4.2") && bye.contains("no mail transaction"), "{bye}");
        assert_eq!(c.secs(), 30, "30 s from the connection, whatever was said before MAIL");
        server.await.expect("session");
        assert_eq!((counters.timeout_before_mail.get(), counters.timeout_idle.get()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn inside_a_transaction_the_long_idle_timeout_applies_and_a_message_restarts_the_short_one() {
        let cfg = SmtpConfig::default();
        let counters = cfg.counters.clone();
        let acc = Arc::new(Recorder::default());
        let (mut c, server) = Client::start(cfg, acc.clone());
        c.reply().await;
        c.say("EHLO c\r\n").await;
        assert!(c.say("MAIL FROM:<a@b>\r\n").await.starts_with("250"));
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert!(c.say("RCPT TO:<aq@localhost>\r\n").await.starts_with("250"), "still there after 200 s");
        c.say("DATA\r\n").await;
        assert!(c.say("Subject: x\r\n\r\nhi\r\n.\r\n").await.starts_with("250"));
        let accepted_at = c.secs();
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(c.say("MAIL FROM:<a@b>\r\n").await.starts_with("250"), "within 30 s of the last message");
        let bye = c.reply().await;
        assert!(bye.starts_with("421 4.4.2") && bye.contains("timeout"), "{bye}");
        assert_eq!(c.secs() - accepted_at, 25 + 300, "the idle timeout inside the transaction");
        server.await.expect("session");
        assert_eq!((counters.timeout_before_mail.get(), counters.timeout_idle.get()), (0, 1));
        assert_eq!(acc.0.lock().expect("lock").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_data_is_cut_off_at_the_data_timeout() {
        let cfg = SmtpConfig { data_timeout: Duration::from_secs(60), ..SmtpConfig::default() };
        let counters = cfg.counters.clone();
        let acc = Arc::new(Recorder::default());
        let (mut c, server) = Client::start(cfg, acc.clone());
        c.reply().await;
        c.say("EHLO c\r\n").await;
        c.say("MAIL FROM:<a@b>\r\n").await;
        c.say("RCPT TO:<aq@localhost>\r\n").await;
        assert!(c.say("DATA\r\n").await.starts_with("354"));
        let start = c.secs();
        // A byte every 5 s: never silent for the idle timeout, never finished.
        let bye = loop {
            c.0.write_all(b"x").await.expect("write");
            tokio::select! {
                r = c.reply() => break r,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        };
        assert!(bye.starts_with("421 4.4.2") && bye.contains("did not arrive in time"), "{bye}");
        assert_eq!(c.secs() - start, 60);
        server.await.expect("session");
        assert_eq!(counters.timeout_data.get(), 1);
        assert!(acc.0.lock().expect("lock").is_empty(), "nothing decided");
    }

    #[tokio::test]
    async fn a_body_past_the_memory_share_is_spooled_and_reaches_the_acceptor_whole() {
        let cfg = SmtpConfig { spool: DataSpool::new(std::env::temp_dir(), 4096, 1), ..SmtpConfig::default() };
        let counters = cfg.counters.clone();
        let acc = Recorder::default();
        let lines: String = (0..5000).map(|i| format!("line {i}\r\n..stuffed {i}\r\n")).collect();
        let out = converse(
            &cfg,
            &acc,
            &[
                "",
                "EHLO c\r\n",
                "MAIL FROM:<a@b>\r\n",
                "RCPT TO:<aq@localhost>\r\n",
                "DATA\r\n",
                &format!("Subject: big\r\n\r\n{lines}.\r\n"),
                "QUIT\r\n",
            ],
        )
        .await;
        assert_eq!(codes(&out), ["220", "250", "250", "250", "354", "250", "221"], "{out}");
        let want = format!("Subject: big\r\n\r\n{}", lines.replace("\n..", "\n."));
        assert_eq!(String::from_utf8_lossy(&acc.0.lock().expect("lock")[0]), want);
        assert_eq!(counters.data_spooled.get(), 1);
    }

    /// Holds each message a while, noting how many it held at once.
    #[derive(Default)]
    struct Slow(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl Acceptor for Slow {
        async fn accept(&self, _: &MailEnvelope, _: &[u8]) -> Vec<Reply> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.0.fetch_add(1, SeqCst) + 1;
            self.1.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.0.fetch_sub(1, SeqCst);
            vec![Reply::new(250, "2.0.0", "queued")]
        }
    }

    // Time is paused: the acceptor's 50 ms pass only once every session waits, so the
    // sessions overlap however slowly the machine runs them.
    #[tokio::test(start_paused = true)]
    async fn large_messages_are_decided_one_turn_at_a_time_small_ones_at_once() {
        let cfg = SmtpConfig { spool: DataSpool::new(std::env::temp_dir(), 1024, 2), ..SmtpConfig::default() };
        let mail = |size: usize| format!("Subject: x\r\n\r\n{}\r\n.\r\n", "y".repeat(size));
        let run = |acc: Arc<Slow>, size: usize| {
            let cfg = cfg.clone();
            async move {
                let (mut c, s) = tokio::io::duplex(1 << 16);
                let client = async {
                    let mut buf = vec![0u8; 4096];
                    for l in ["", "EHLO c\r\n", "MAIL FROM:<a@b>\r\n", "RCPT TO:<aq@localhost>\r\n", "DATA\r\n"] {
                        c.write_all(l.as_bytes()).await.expect("write");
                        let _ = c.read(&mut buf).await.expect("read");
                    }
                    c.write_all(mail(size).as_bytes()).await.expect("write");
                    let n = c.read(&mut buf).await.expect("read");
                    drop(c);
                    String::from_utf8_lossy(&buf[..n]).to_string()
                };
                let (_, reply) = tokio::join!(run_session(s, &cfg, acc.as_ref(), false), client);
                assert!(reply.starts_with("250"), "{reply}");
            }
        };
        let large = Arc::new(Slow::default());
        futures_util::future::join_all((0..6).map(|_| run(large.clone(), 20_000))).await;
        assert_eq!(large.1.load(std::sync::atomic::Ordering::SeqCst), 2, "two large messages at most");
        let small = Arc::new(Slow::default());
        futures_util::future::join_all((0..6).map(|_| run(small.clone(), 100))).await;
        assert_eq!(small.1.load(std::sync::atomic::Ordering::SeqCst), 6, "small ones are not held back");
    }
}
