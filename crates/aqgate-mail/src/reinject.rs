//! Reinjection: hands a message on, unchanged, to the next SMTP server — Postfix's
//! "after-filter" smtpd when aqgate runs as a before-queue content filter
//! (`smtpd_proxy_filter`). A small SMTP client of its own rather than lettre's transport:
//! the envelope sender is passed on as it came (the null sender `<>` included), recipients
//! are passed on byte for byte (no address re-parsing), each recipient's reply is kept (LMTP
//! answers per recipient), and the next server's exact reply can be passed back to the
//! client. Dot-stuffing and the final `.` are done here.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::smtp::Reply;

/// Where and how messages are reinjected.
#[derive(Debug, Clone)]
pub struct Reinjector {
    /// `HOST:PORT` of the SMTP server.
    pub addr: String,
    /// The name said in EHLO.
    pub helo: String,
    /// Longest wait for the connection and for each reply.
    pub timeout: Duration,
}

/// A reply from the next server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Upstream {
    code: u16,
    /// The reply's lines without the code, joined with spaces (the enhanced status code,
    /// when the server sends one, stays at the front).
    text: String,
    /// EHLO keywords (the lines after the first), upper-case.
    lines: Vec<String>,
}

impl Upstream {
    /// The same reply, to be passed back to our own client.
    fn pass_on(&self) -> Reply {
        // An empty enhanced status renders the text alone: the next server's own enhanced
        // status code (at the front of its text) is kept as it is.
        Reply::new(self.code, "", self.text.clone())
    }
}

/// Parses `smtp://HOST:PORT` (or a bare `HOST:PORT`) into `HOST:PORT`.
pub fn parse_target(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("smtp://").unwrap_or(url).trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| format!("{url}: expected smtp://HOST:PORT"))?;
    if host.is_empty() || host.contains(['/', '@', '?', '#']) {
        return Err(format!("{url}: expected smtp://HOST:PORT"));
    }
    port.parse::<u16>().map_err(|_| format!("{url}: bad port {port}"))?;
    Ok(rest.to_string())
}

enum Failure {
    /// Could not talk to the server at all (connect, timeout, broken connection).
    Io(String),
    /// The server refused the transaction (greeting, EHLO, MAIL FROM or DATA).
    Refused(Upstream),
}

impl Reinjector {
    /// Sends `raw` for `rcpts` with envelope sender `from` ("" for `<>`). Returns one reply
    /// per recipient, in order: a refused RCPT keeps its own reply, accepted ones get the
    /// reply to the message. With `all_or_nothing` (SMTP, where the client gets one answer
    /// for the whole mail) a single refused recipient aborts the transaction before DATA
    /// and every recipient gets the refusal (a temporary one first, if any).
    pub async fn send(
        &self,
        from: &str,
        rcpts: &[&str],
        body_8bit: bool,
        raw: &[u8],
        all_or_nothing: bool,
    ) -> Vec<Reply> {
        let attempt = async {
            let stream = tokio::net::TcpStream::connect(&self.addr).await.map_err(|e| Failure::Io(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            self.converse(stream, from, rcpts, body_8bit, raw, all_or_nothing).await
        };
        // One bound for the whole conversation besides the per-reply timeouts.
        let overall = self.timeout * 4;
        let result = match tokio::time::timeout(overall, attempt).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Io(format!("no answer within {}s", overall.as_secs()))),
        };
        match result {
            Ok(replies) => replies,
            Err(Failure::Io(why)) => {
                tracing::warn!(server = %self.addr, error = %why, "reinjection failed");
                vec![Reply::new(451, "4.4.1", format!("cannot hand the mail on ({why}); try again later")); rcpts.len()]
            }
            Err(Failure::Refused(u)) => {
                tracing::info!(server = %self.addr, code = u.code, text = %u.text, "reinjection refused");
                vec![u.pass_on(); rcpts.len()]
            }
        }
    }

    async fn converse<S>(
        &self,
        stream: S,
        from: &str,
        rcpts: &[&str],
        body_8bit: bool,
        raw: &[u8],
        all_or_nothing: bool,
    ) -> Result<Vec<Reply>, Failure>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut s = BufReader::new(stream);
        let greeting = self.read_reply(&mut s).await?;
        if greeting.code != 220 {
            return Err(Failure::Refused(greeting));
        }
        let ehlo = self.command(&mut s, &format!("EHLO {}", self.helo)).await?;
        let eight_bit = if ehlo.code == 250 {
            ehlo.lines.iter().any(|l| l == "8BITMIME")
        } else {
            let helo = self.command(&mut s, &format!("HELO {}", self.helo)).await?;
            if helo.code != 250 {
                return Err(Failure::Refused(helo));
            }
            false
        };
        let body = if body_8bit && eight_bit { " BODY=8BITMIME" } else { "" };
        let mail = self.command(&mut s, &format!("MAIL FROM:<{from}>{body}")).await?;
        if mail.code != 250 {
            let _ = self.command(&mut s, "QUIT").await;
            return Err(Failure::Refused(mail));
        }
        let mut per_rcpt: Vec<Option<Upstream>> = Vec::with_capacity(rcpts.len());
        for r in rcpts {
            let reply = self.command(&mut s, &format!("RCPT TO:<{r}>")).await?;
            per_rcpt.push(if reply.code == 250 || reply.code == 251 { None } else { Some(reply) });
        }
        let refused: Vec<&Upstream> = per_rcpt.iter().flatten().collect();
        if refused.len() == rcpts.len() || (all_or_nothing && !refused.is_empty()) {
            let worst = refused.iter().find(|u| u.code < 500).or(refused.first()).map(|u| (*u).clone());
            let _ = self.command(&mut s, "RSET").await;
            let _ = self.command(&mut s, "QUIT").await;
            return Err(Failure::Refused(worst.unwrap_or(mail)));
        }
        let data = self.command(&mut s, "DATA").await?;
        if data.code != 354 {
            let _ = self.command(&mut s, "QUIT").await;
            return Err(Failure::Refused(data));
        }
        let io = |e: std::io::Error| Failure::Io(e.to_string());
        s.get_mut().write_all(&dot_stuff(raw)).await.map_err(io)?;
        s.get_mut().flush().await.map_err(io)?;
        let done = self.read_reply(&mut s).await?;
        let _ = self.command(&mut s, "QUIT").await;
        Ok(per_rcpt.into_iter().map(|r| r.unwrap_or_else(|| done.clone()).pass_on()).collect())
    }

    async fn command<S>(&self, s: &mut BufReader<S>, line: &str) -> Result<Upstream, Failure>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let io = |e: std::io::Error| Failure::Io(e.to_string());
        s.get_mut().write_all(format!("{line}\r\n").as_bytes()).await.map_err(io)?;
        s.get_mut().flush().await.map_err(io)?;
        self.read_reply(s).await
    }

    async fn read_reply<S>(&self, s: &mut BufReader<S>) -> Result<Upstream, Failure>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut texts = Vec::new();
        let mut line = Vec::new();
        for _ in 0..100 {
            line.clear();
            let n = match tokio::time::timeout(self.timeout, (&mut *s).take(4096).read_until(b'\n', &mut line)).await {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(Failure::Io(e.to_string())),
                Err(_) => return Err(Failure::Io(format!("no reply within {}s", self.timeout.as_secs()))),
            };
            if n == 0 {
                return Err(Failure::Io("the server closed the connection".into()));
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\r', '\n']);
            let code = text.get(..3).and_then(|c| c.parse::<u16>().ok()).filter(|c| (200..600).contains(c));
            let Some(code) = code else {
                return Err(Failure::Io(format!("not an SMTP reply: {text:?}")));
            };
            let sep = text.as_bytes().get(3).copied();
            texts.push(text.get(4..).unwrap_or("").to_string());
            if sep != Some(b'-') {
                let first = texts.first().cloned().unwrap_or_default();
                let lines = texts.iter().skip(1).map(|l| l.to_ascii_uppercase()).collect();
                let joined = texts.join(" ");
                return Ok(Upstream { code, text: if joined.is_empty() { first } else { joined }, lines });
            }
        }
        Err(Failure::Io("reply too long".into()))
    }
}

/// The message as DATA sends it: every line that starts with `.` gets a second one, line
/// ends stay as they are, the last line is ended, and `.` CRLF closes it.
pub fn dot_stuff(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + raw.len() / 64 + 8);
    let mut at_line_start = true;
    for &b in raw {
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
    }
    if !raw.is_empty() && !at_line_start {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_stuffing_and_the_end_of_data() {
        assert_eq!(
            dot_stuff(b".first\r\nmid\r\n.\r\n..two\r\nlast"),
            b"..first\r\nmid\r\n..\r\n...two\r\nlast\r\n.\r\n"
        );
        assert_eq!(dot_stuff(b"a\r\n"), b"a\r\n.\r\n");
        assert_eq!(dot_stuff(b"a\n.b\n"), b"a\n..b\n.\r\n", "a bare LF ends a line too");
    }

    #[test]
    fn targets() {
        assert_eq!(parse_target("smtp://127.0.0.1:10026").as_deref(), Ok("127.0.0.1:10026"));
        assert_eq!(parse_target("localhost:25").as_deref(), Ok("localhost:25"));
        assert!(parse_target("smtp://127.0.0.1").is_err());
        assert!(parse_target("smtp://u@h:25").is_err());
        assert!(parse_target("smtp://h:x").is_err());
    }

    /// A scripted SMTP server: answers each command with the next canned reply, records
    /// what it was sent.
    async fn fake_server(replies: Vec<&'static str>) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let h = tokio::spawn(async move {
            let (sock, _) = l.accept().await.expect("accept");
            let mut s = BufReader::new(sock);
            let mut seen = String::new();
            let mut replies = replies.into_iter();
            s.get_mut().write_all(b"220 fake ESMTP\r\n").await.expect("greet");
            let mut in_data = false;
            loop {
                let mut line = String::new();
                if s.read_line(&mut line).await.expect("read") == 0 {
                    return seen;
                }
                seen.push_str(&line);
                if in_data {
                    if line == ".\r\n" {
                        in_data = false;
                    } else {
                        continue;
                    }
                }
                let Some(r) = replies.next() else { return seen };
                if r.starts_with("354") {
                    in_data = true;
                }
                s.get_mut().write_all(r.as_bytes()).await.expect("reply");
            }
        });
        (addr, h)
    }

    fn reinjector(addr: String) -> Reinjector {
        Reinjector { addr, helo: "aqgate.test".into(), timeout: Duration::from_secs(5) }
    }

    #[tokio::test]
    async fn null_sender_8bitmime_and_the_next_servers_reply_passed_on() {
        let (addr, h) = fake_server(vec![
            "250-fake\r\n250-8BITMIME\r\n250 SIZE 1000\r\n",
            "250 2.1.0 Ok\r\n",
            "250 2.1.5 Ok\r\n",
            "354 go\r\n",
            "250 2.0.0 Ok: queued as ABC\r\n",
            "221 bye\r\n",
        ])
        .await;
        let got = reinjector(addr).send("", &["Bob@example.com"], true, b"Subject: x\r\n\r\n.dot\r\n", true).await;
        assert_eq!(got, [Reply::new(250, "", "2.0.0 Ok: queued as ABC")]);
        let seen = h.await.expect("server");
        assert!(seen.contains("MAIL FROM:<> BODY=8BITMIME\r\n"), "{seen}");
        assert!(seen.contains("RCPT TO:<Bob@example.com>\r\n"), "{seen}");
        assert!(seen.contains("\r\n\r\n..dot\r\n.\r\n"), "dot-stuffed: {seen}");
    }

    #[tokio::test]
    async fn one_refused_recipient_aborts_in_smtp_and_is_kept_apart_in_lmtp() {
        let script = |last: [&'static str; 3]| {
            let mut s = vec![
                "250 fake\r\n",
                "250 2.1.0 Ok\r\n",
                "550 5.1.1 <x@example.com>: Recipient address rejected\r\n",
                "250 2.1.5 Ok\r\n",
            ];
            s.extend(last);
            s
        };
        let (addr, h) = fake_server(script(["250 2.0.0 reset\r\n", "221 bye\r\n", "221 bye\r\n"])).await;
        let got = reinjector(addr).send("a@b", &["x@example.com", "bob@example.com"], false, b"x\r\n", true).await;
        assert_eq!(got, vec![Reply::new(550, "", "5.1.1 <x@example.com>: Recipient address rejected"); 2]);
        let seen = h.await.expect("server");
        assert!(!seen.contains("DATA") && seen.contains("RSET"), "{seen}");
        let (addr, _h) = fake_server(script(["354 go\r\n", "250 2.0.0 Ok: queued\r\n", "221 bye\r\n"])).await;
        let got = reinjector(addr).send("a@b", &["x@example.com", "bob@example.com"], false, b"x\r\n", false).await;
        assert_eq!(got[0].code, 550);
        assert_eq!(got[1], Reply::new(250, "", "2.0.0 Ok: queued"));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_temporary_failure() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let got = reinjector(format!("127.0.0.1:{port}")).send("a@b", &["c@d"], false, b"x\r\n", true).await;
        assert_eq!((got[0].code, got[0].status), (451, "4.4.1"), "{got:?}");
    }
}
