//! The SMTP receiving side: a session loop generic over its stream, with smtp-proto parsing
//! the commands. The session knows SMTP; what happens to a complete message (verify, spool)
//! is the [`Acceptor`]'s business, and its answer is sent at the end of DATA.

use std::time::Duration;

use async_trait::async_trait;
use smtp_proto::request::receiver::{DataReceiver, RequestReceiver};
use smtp_proto::{Error as ProtoError, Request};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
    /// A client silent for this long is disconnected (421).
    pub idle_timeout: Duration,
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
    Data { buf: Vec<u8>, receiver: DataReceiver, too_big: bool },
}

/// Runs one SMTP session until QUIT, disconnect, idle timeout or STARTTLS. `tls`: the
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
        stream.write_all(format!("220 {} ESMTP aqgate\r\n", cfg.hostname).as_bytes()).await?;
    }
    let offer_tls = cfg.starttls && !tls;
    // Besides the per-read idle timeout, a whole session is bounded: a client trickling a
    // byte now and then cannot hold a connection slot for ever.
    let deadline = tokio::time::Instant::now() + cfg.max_session;
    let mut env = Envelope::default();
    let mut receiver = RequestReceiver::default();
    let mut mode = Mode::Command;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let wait = cfg.idle_timeout.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let n = match tokio::time::timeout(wait, stream.read(&mut chunk)).await {
            Ok(Ok(0)) => return Ok(Ended::Closed),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                stream.write_all(b"421 4.4.2 timeout, closing\r\n").await?;
                return Ok(Ended::Closed);
            }
        };
        let mut bytes = chunk[..n].iter();
        let mut out = String::new();
        loop {
            match &mut mode {
                Mode::Data { buf, receiver: data, too_big } => {
                    let done = data.ingest(&mut bytes, buf);
                    if buf.len() > cfg.max_message_size {
                        // Keep reading to the end of DATA, but keep nothing.
                        *too_big = true;
                        buf.clear();
                    }
                    if !done {
                        break;
                    }
                    let replies = if *too_big {
                        vec![Reply::new(552, "5.3.4", format!("message larger than {} bytes", cfg.max_message_size))]
                    } else {
                        let envelope = MailEnvelope {
                            mail_from: env.mail_from.clone().unwrap_or_default(),
                            rcpts: env.rcpts.clone(),
                            body_8bit: env.body_8bit,
                            lmtp: env.lmtp,
                        };
                        acceptor.accept(&envelope, buf).await
                    };
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
                    mode = Mode::Command;
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
                            mode = Mode::Data { buf: Vec::new(), receiver: DataReceiver::new(), too_big: false }
                        }
                        Next::Quit => {
                            stream.write_all(out.as_bytes()).await?;
                            return Ok(Ended::Closed);
                        }
                        Next::StartTls => {
                            // Whatever the client pipelined after STARTTLS is discarded: it
                            // was sent in the clear and must not be taken as if encrypted.
                            stream.write_all(out.as_bytes()).await?;
                            stream.flush().await?;
                            return Ok(Ended::StartTls(stream));
                        }
                    }
                }
            }
        }
        if !out.is_empty() {
            stream.write_all(out.as_bytes()).await?;
            stream.flush().await?;
        }
    }
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
}
