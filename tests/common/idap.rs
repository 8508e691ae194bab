//! IDAP over HTTP for the tests: a POST of an envelope to a servlet's `/aqserv` with Basic
//! credentials (and the session cookie, if there is one) through `aqgate_client`, and the
//! answer parsed. The raw forms ([`idap_request`], [`http_as`]) leave status and headers to
//! the caller.

use aqgate_proto::idap::{self, Limits, Response};

/// The demo agent most tests speak as.
pub const SCOTT: (&str, &str) = ("scott", "tiger");

/// The servlet's IDAP URL on 127.0.0.1:`port`.
pub fn aqserv(port: u16) -> String {
    format!("http://127.0.0.1:{port}/aqserv")
}

/// The IDAP POST, not sent yet: `body` to `url` as `(agent, password)` (HTTP Basic),
/// `text/xml`. The caller adds headers (a cookie, an idempotency key), sends it and reads
/// the answer.
pub fn idap_request(
    http: &reqwest::Client,
    url: &str,
    (agent, password): (&str, &str),
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    http.post(url).basic_auth(agent, Some(password)).header("content-type", "text/xml").body(body)
}

/// The cookie (`NAME=value`) a response sets, if it sets one.
pub fn set_cookie(r: &reqwest::Response) -> Option<String> {
    let value = r.headers().get("set-cookie")?.to_str().ok()?;
    value.split(';').next().map(String::from)
}

/// An IDAP response document, parsed (it must parse).
pub fn parse_idap(body: &[u8]) -> Response {
    idap::parse_response(body, &Limits::default())
        .unwrap_or_else(|e| panic!("not an IDAP response ({e}): {}", String::from_utf8_lossy(body)))
        .body
}

/// One IDAP request to the servlet on `port` as `(agent, password)`, in the session whose
/// cookie `cookie` holds (if any; a cookie the server sets replaces it, one it clears is
/// gone): status and body. Sent once, unbounded in time and size, as a test wants it.
pub async fn http_as(
    port: u16,
    (agent, password): (&str, &str),
    cookie: &mut Option<String>,
    body: &str,
) -> (u16, String) {
    use aqgate_proto::names::SESSION_COOKIE;
    let mut config = aqgate_client::Config::new(aqserv(port), agent, password);
    config.timeout = std::time::Duration::from_secs(3600);
    config.max_answer = usize::MAX;
    config.attempts = 1;
    let client = aqgate_client::Client::new(config).expect("client");
    let prefix = format!("{SESSION_COOKIE}=");
    client.set_session(cookie.as_deref().and_then(|c| c.strip_prefix(&prefix)).map(String::from));
    let r = client.post(body.to_string(), None).await.expect("post");
    *cookie = client.session().map(|t| format!("{prefix}{t}"));
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

/// As [`http_as`], answered 200: the IDAP response.
pub async fn idap_in(port: u16, agent: (&str, &str), cookie: &mut Option<String>, body: &str) -> Response {
    let (status, text) = http_as(port, agent, cookie, body).await;
    assert_eq!(status, 200, "{text}");
    parse_idap(text.as_bytes())
}

/// One IDAP request to the servlet on `port` as `agent` (no session kept), answered 200.
pub async fn idap(port: u16, agent: &str, password: &str, body: &str) -> Response {
    idap_in(port, (agent, password), &mut None, body).await
}

/// One IDAP request to the servlet on `port` as scott (no session kept).
pub async fn http(port: u16, body: &str) -> Response {
    idap(port, SCOTT.0, SCOTT.1, body).await
}
