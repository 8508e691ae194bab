//! The HTTP side: one agent's IDAP POSTs to a servlet URL, HTTP Basic, the session cookie
//! carried from answer to request (the servlet keeps a transaction across requests by
//! it), an `Idempotency-Key` on every request, transient failures tried again with the
//! same key, and bounds (connect and request timeouts, the answer's size).

use std::sync::Mutex;
use std::time::Duration;

use aqgate_proto::code;
use aqgate_proto::idap::Request;
use aqgate_proto::names::{IDEMPOTENCY_HEADER, SESSION_COOKIE};

use crate::answer::{self, Answer, Fault};
use crate::request;

/// The most of an answer read by default: a send's answer is its message ids.
pub const MAX_ANSWER: usize = 16 << 20;

/// How a [`Client`] is made.
#[derive(Clone)]
pub struct Config {
    /// The servlet's IDAP URL (`http://127.0.0.1:8470/aqserv`).
    pub url: String,
    pub agent: String,
    pub password: String,
    /// PEM certificates trusted for an `https` URL, besides none (no system roots).
    pub ca_pem: Option<Vec<u8>>,
    pub connect_timeout: Duration,
    /// The whole request, answer included (a receive's wait must fit in it).
    pub timeout: Duration,
    pub max_answer: usize,
    /// Attempts of a request whose failure is transient (1: no retry).
    pub attempts: u32,
    /// The pause before the first retry, doubled before each further one.
    pub backoff: Duration,
    /// Carry the session cookie the servlet sets (`false`: every request on its own).
    pub sessions: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config").field("url", &self.url).field("agent", &self.agent).finish_non_exhaustive()
    }
}

impl Config {
    /// `agent` with `password` at `url`: 10 s to connect, 60 s a request, answers up to
    /// [`MAX_ANSWER`], 3 attempts 200 ms apart (doubling).
    pub fn new(url: impl Into<String>, agent: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            agent: agent.into(),
            password: password.into(),
            ca_pem: None,
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(60),
            max_answer: MAX_ANSWER,
            attempts: 3,
            backoff: Duration::from_millis(200),
            sessions: true,
        }
    }
}

/// Why a POST got no HTTP answer, or no whole one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// The request never went out (no connection): nothing was performed.
    NotSent(String),
    /// It went out and no answer came (a timeout, a connection cut): it may have been performed.
    NoAnswer(String),
    /// The answer's head came and its body could not be read (or is over the bound).
    Reading(String),
}

/// An HTTP answer: its status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, if given.
    pub retry_after: Option<u64>,
}

/// Why a typed request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The servlet answered with an IDAP Fault.
    Fault(Fault),
    /// 401 without a Fault: the credentials (or the session token) were refused.
    Unauthorized,
    /// An answer that is no IDAP document (a proxy's page, 413, 415…).
    Http { status: u16, text: String },
    /// No (whole) answer, after the retries.
    Transport(PostError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Fault(x) => write!(f, "fault {}: {}", x.code, x.message),
            Error::Unauthorized => write!(f, "HTTP 401: the credentials were refused"),
            Error::Http { status, text } => write!(f, "HTTP {status}: {text}"),
            Error::Transport(PostError::NotSent(e)) => write!(f, "not sent: {e}"),
            Error::Transport(PostError::NoAnswer(e)) => write!(f, "no answer (it may have been performed): {e}"),
            Error::Transport(PostError::Reading(e)) => write!(f, "reading the answer: {e}"),
        }
    }
}

impl std::error::Error for Error {}

/// One agent's client of one servlet. Requests of one client share its session (the
/// servlet's transaction), so they are sent one after the other.
pub struct Client {
    http: reqwest::Client,
    config: Config,
    session: Mutex<Option<String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(config: Config) -> Result<Self, String> {
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout);
        if let Some(pem) = &config.ca_pem {
            for c in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| e.to_string())? {
                b = b.add_root_certificate(c);
            }
        }
        let http = b.build().map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self { http, config, session: Mutex::new(None) })
    }

    pub fn url(&self) -> &str {
        &self.config.url
    }

    /// The session token (the `AQSESSIONID` cookie's value) the client carries, if any.
    pub fn session(&self) -> Option<String> {
        self.session.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Carry `token` (a session an earlier client was given) from the next request on.
    pub fn set_session(&self, token: Option<String>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = token.filter(|t| !t.is_empty());
    }

    /// One POST of `body` under `key` (no retry): the answer as it came, at most
    /// `max_answer` bytes. The session cookie goes along, and one the answer sets or
    /// clears is kept.
    pub async fn post(&self, body: String, key: Option<&str>) -> Result<Reply, PostError> {
        let mut rb = self
            .http
            .post(&self.config.url)
            .basic_auth(&self.config.agent, Some(&self.config.password))
            .header("content-type", "text/xml")
            .body(body);
        if let Some(k) = key {
            rb = rb.header(IDEMPOTENCY_HEADER, k);
        }
        if let Some(s) = self.session() {
            rb = rb.header("cookie", format!("{SESSION_COOKIE}={s}"));
        }
        let r = match rb.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(PostError::NotSent(without_url(&e))),
            Err(e) => return Err(PostError::NoAnswer(without_url(&e))),
        };
        self.keep_cookie(&r);
        let status = r.status().as_u16();
        let retry_after =
            r.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
        let body = read_bounded(r, self.config.max_answer).await.map_err(PostError::Reading)?;
        Ok(Reply { status, body, retry_after })
    }

    fn keep_cookie(&self, r: &reqwest::Response) {
        if !self.config.sessions {
            return;
        }
        for v in r.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()) {
            let first = v.split(';').next().unwrap_or("");
            if let Some((k, val)) = first.split_once('=')
                && k.trim() == SESSION_COOKIE
            {
                self.set_session(Some(val.trim().to_string()));
            }
        }
    }

    /// `request` under a new idempotency key, tried again with the same key while its
    /// failure is transient.
    pub async fn call(&self, request: Request) -> Result<Answer, Error> {
        self.call_with_key(request, &new_key()).await
    }

    /// `request` under `key`: transient failures (no connection, no answer, 409 the same
    /// key in progress, 502–504, 503 with `Retry-After`, fault 24050 the session busy) are
    /// tried again with the same key, so the servlet performs it at most once.
    pub async fn call_with_key(&self, request: Request, key: &str) -> Result<Answer, Error> {
        let body = request::document(request);
        let mut pause = self.config.backoff;
        let mut attempt = 1;
        loop {
            let outcome = self.once(body.clone(), key).await;
            let again = match &outcome {
                Err(Error::Transport(_)) => true,
                Err(Error::Http { status, .. }) => matches!(status, 502..=504),
                Err(Error::Fault(f)) => matches!(f.status, 409 | 502..=504) || f.code == code::SESSION_BUSY,
                _ => false,
            };
            if !again || attempt >= self.config.attempts.max(1) {
                return outcome;
            }
            attempt += 1;
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
        }
    }

    async fn once(&self, body: String, key: &str) -> Result<Answer, Error> {
        let reply = self.post(body, Some(key)).await.map_err(Error::Transport)?;
        match answer::interpret(reply.status, &reply.body) {
            Ok(Ok(a)) if reply.status == 200 => Ok(a),
            Ok(Ok(_)) => Err(Error::Http { status: reply.status, text: snippet(&reply.body) }),
            Ok(Err(f)) => Err(Error::Fault(f)),
            Err(_) if reply.status == 401 => Err(Error::Unauthorized),
            Err(_) => Err(Error::Http { status: reply.status, text: snippet(&reply.body) }),
        }
    }
}

/// A fresh idempotency key (a UUID).
pub fn new_key() -> String {
    format!("aqgate-client-{}", uuid::Uuid::new_v4())
}

/// At most 200 characters of an answer that is no IDAP document.
fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect::<String>().trim().to_string()
}

/// The body of `r`, at most `max` bytes.
pub async fn read_bounded(mut r: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| without_url(&e))? {
        if out.len() + chunk.len() > max {
            return Err(format!("the answer is over {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A reqwest error without its URL (the caller names the URL, without credentials), with
/// its causes.
pub fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" for url ({u})"), "");
    }
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A servlet stand-in that answers `answers` in turn (status, extra header lines,
    /// body), one per connection; what it was sent: each request's head.
    async fn stand_in(answers: Vec<(u16, &'static str, String)>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/aqserv", l.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let mut heads = Vec::new();
            for (status, headers, body) in answers {
                let (mut c, _) = l.accept().await.expect("accept");
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                let head = loop {
                    let n = c.read(&mut buf).await.expect("read");
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                            })
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        if rest.len() >= len {
                            break head.to_ascii_lowercase();
                        }
                    }
                };
                heads.push(head);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
                    body.len()
                );
                c.write_all(answer.as_bytes()).await.expect("write");
            }
            heads
        });
        (url, task)
    }

    fn doc(r: aqgate_proto::idap::Response) -> String {
        aqgate_proto::idap::write_response(&aqgate_proto::idap::Envelope { headers: Vec::new(), body: r })
    }

    #[tokio::test]
    async fn transient_failures_are_tried_again_under_the_same_key_and_the_session_is_carried() {
        let busy = doc(aqgate_proto::idap::Response::Fault(aqgate_proto::idap::Fault {
            kind: aqgate_proto::idap::FaultKind::Client,
            code: code::IDEMPOTENCY_IN_PROGRESS,
            message: "in progress".into(),
        }));
        let ok = doc(aqgate_proto::idap::Response::Commit(aqgate_proto::idap::StatusResponse::ok()));
        let (url, server) = stand_in(vec![
            (409, "", busy),
            (200, "set-cookie: AQSESSIONID=tok1; Path=/; HttpOnly\r\n", ok.clone()),
            (200, "", ok),
        ])
        .await;
        let mut config = Config::new(url, "scott", "tiger");
        config.backoff = Duration::from_millis(1);
        let c = Client::new(config).expect("client");
        assert_eq!(c.call(Request::Commit).await, Ok(Answer::Committed));
        assert_eq!(c.session().as_deref(), Some("tok1"));
        assert_eq!(c.call(Request::Commit).await, Ok(Answer::Committed));
        let heads = server.await.expect("stand-in");
        let key = |h: &str| h.lines().find(|l| l.starts_with("idempotency-key:")).map(str::to_string);
        assert!(key(&heads[0]).is_some(), "{}", heads[0]);
        assert_eq!(key(&heads[0]), key(&heads[1]), "the retry has the same key");
        assert_ne!(key(&heads[1]), key(&heads[2]), "a new request, a new key");
        assert!(!heads[1].contains("cookie: aqsessionid"), "no session before the servlet opened one");
        assert!(heads[2].contains("cookie: aqsessionid=tok1"), "{}", heads[2]);
        assert!(heads[2].contains("authorization: basic"), "credentials on every request");
    }

    #[tokio::test]
    async fn answers_over_the_cap_are_refused_and_401_is_unauthorized() {
        let (url, server) = stand_in(vec![(200, "", "x".repeat(100)), (401, "", String::new())]).await;
        let mut config = Config::new(url, "scott", "wrong");
        config.max_answer = 50;
        config.attempts = 1;
        let c = Client::new(config).expect("client");
        let r = c.post("<x/>".into(), None).await;
        assert!(matches!(r, Err(PostError::Reading(ref e)) if e.contains("over 50 bytes")), "{r:?}");
        assert_eq!(c.call(Request::Commit).await, Err(Error::Unauthorized));
        server.await.expect("stand-in");
    }
}
