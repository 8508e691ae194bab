//! What the web console's `oneshot` tests share: requests as an agent (Basic, password
//! `pw`), a POST as a same-origin console page sends it, and an answer read whole.

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use tower::ServiceExt;

/// One agent per console role on AQUSER's queues (`c_viewer`, `c_reader`, `c_operator`,
/// `c_admin`), one with none (`c_none`) and an admin of OE's (`c_oe`); password `pw`.
pub const ROLE_AGENTS: &str = r#"
[[agents]]
name = "c_none"
password = "pw"
db_users = ["AQUSER"]

[[agents]]
name = "c_viewer"
password = "pw"
db_users = ["AQUSER"]
console = "viewer"

[[agents]]
name = "c_reader"
password = "pw"
db_users = ["AQUSER"]
console = "reader"

[[agents]]
name = "c_operator"
password = "pw"
db_users = ["AQUSER"]
console = "operator"

[[agents]]
name = "c_admin"
password = "pw"
db_users = ["AQUSER"]
console = "admin"

[[agents]]
name = "c_oe"
password = "pw"
db_users = ["OE"]
console = "admin"
"#;

/// An answer of the router: status, headers, body as text.
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Answer {
    /// Header `name`'s value (empty when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }
}

/// `req` through a clone of `router`, its answer read whole.
pub async fn call(router: &axum::Router, req: Request<Body>) -> Answer {
    let r = router.clone().oneshot(req).await.expect("the router answers");
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    Answer { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&bytes).to_string() }
}

/// HTTP Basic for `agent` with the tests' password `pw`.
pub fn basic(agent: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{agent}:pw")))
}

/// A GET of `path`, as `agent` (none: anonymous).
pub fn get_as(path: &str, agent: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(a) = agent {
        b = b.header(header::AUTHORIZATION, basic(a));
    }
    b.body(Body::empty()).expect("request")
}

/// A POST of the form `form` to `path` as a same-origin page of the console sends it, as
/// `agent` (none: anonymous).
pub fn post_as(path: &str, agent: Option<&str>, form: &str) -> Request<Body> {
    let mut b = Request::post(path)
        .header(header::HOST, "127.0.0.1:8470")
        .header(header::ORIGIN, "http://127.0.0.1:8470")
        .header("sec-fetch-site", "same-origin")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(a) = agent {
        b = b.header(header::AUTHORIZATION, basic(a));
    }
    b.body(Body::from(form.to_string())).expect("request")
}
