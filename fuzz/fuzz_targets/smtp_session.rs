//! The SMTP/LMTP session fed arbitrary client bytes over an in-memory stream.
//!
//! Input: a flags byte (LMTP, STARTTLS offered, reinjection, a tiny size limit, already
//! TLS), a chunk-size byte (how the client's bytes are split into reads), then what the
//! client sends. Every reply the server writes must be well-formed: lines of a 3-digit
//! code, then ' ' or '-', ending in CRLF.
#![no_main]

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use aqgate_mail::smtp::{Acceptor, Ended, MailEnvelope, Reply, SmtpConfig, run_session};
use async_trait::async_trait;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Serves the client's bytes in chunks, then end of file; keeps what the server writes.
struct Stream<'a> {
    input: &'a [u8],
    chunk: usize,
    output: &'a RefCell<Vec<u8>>,
}

impl AsyncRead for Stream<'_> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let n = self.chunk.min(self.input.len()).min(buf.remaining());
        let (head, tail) = self.input.split_at(n);
        buf.put_slice(head);
        self.input = tail;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Stream<'_> {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.output.borrow_mut().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Answers by what the message says: nothing, one reply per recipient, too few, too many.
struct Answers;

#[async_trait]
impl Acceptor for Answers {
    async fn accept(&self, envelope: &MailEnvelope, raw: &[u8]) -> Vec<Reply> {
        let ok = || Reply::new(250, "2.0.0", "queued");
        match raw.first().copied().unwrap_or(0) % 5 {
            0 => Vec::new(),
            1 => envelope.rcpts.iter().map(|_| ok()).collect(),
            2 => vec![Reply::new(550, "5.7.1", String::from_utf8_lossy(raw).into_owned())],
            3 => (0..envelope.rcpts.len() + 1).map(|_| ok()).collect(),
            _ => vec![ok()],
        }
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime"))
}

fn check_replies(out: &[u8]) {
    assert!(
        out.is_empty() || out.ends_with(b"\r\n"),
        "output does not end in CRLF: {:?}",
        String::from_utf8_lossy(out)
    );
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let ok = line.len() >= 5
            && line[..3].iter().all(u8::is_ascii_digit)
            && matches!(line[3], b' ' | b'-')
            && line.ends_with(b"\r")
            && !line[..line.len() - 1].contains(&b'\r');
        assert!(ok, "malformed reply line {:?}", String::from_utf8_lossy(line));
    }
}

fuzz_target!(|data: &[u8]| {
    let [flags, chunk, input @ ..] = data else { return };
    let cfg = SmtpConfig {
        lmtp: flags & 1 != 0,
        starttls: flags & 2 != 0,
        reinject: (flags & 4 != 0).then(|| "127.0.0.1:1".to_string()),
        max_message_size: if flags & 8 != 0 { 64 } else { 1 << 20 },
        gateway_addresses: vec!["aq@localhost".into(), "Ünï@localhost".into()],
        ..SmtpConfig::default()
    };
    let tls = flags & 16 != 0;
    let chunk = if *chunk == 0 { usize::MAX } else { usize::from(*chunk) };
    let output = RefCell::new(Vec::new());
    let mut next = Some((Stream { input, chunk, output: &output }, tls));
    runtime().block_on(async {
        while let Some((stream, tls)) = next.take() {
            match run_session(stream, &cfg, &Answers, tls).await {
                Ok(Ended::Closed) => {}
                // As if the handshake succeeded: a new session on the rest of the input.
                Ok(Ended::StartTls(stream)) => next = Some((stream, true)),
                Err(e) => panic!("an in-memory session failed: {e}"),
            }
        }
    });
    check_replies(&output.borrow());
});
