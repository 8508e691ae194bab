//! Who is asking, and the login that makes a console session.
//!
//! A request is the agent's whose Basic credentials it carries (checked exactly as the
//! servlet checks them: `aqgate_http::servlet::check_password`, with its cache, bounded
//! turns and back-off), else the agent of the session its `__Host-aqgate_console` cookie
//! names. The agent's role is its topology's `console` key, read on every request; an
//! agent without one is refused (403) everywhere.
//!
//! The login form (`POST /console/login`) checks the same way and sets the cookie:
//! `__Host-` (so `Secure`, `Path=/`, no `Domain`), `HttpOnly`, `SameSite=Strict`.

use std::net::SocketAddr;

use askama::Template;
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use aqgate_core::topology::{AgentInfo, ConsoleRole};

use crate::Console;
use crate::answer::{forbidden, html, see_other};

/// The console's session cookie.
pub const COOKIE: &str = "__Host-aqgate_console";

/// The most a login form's body may be.
const FORM_MAX: usize = 4096;

/// The caller of a console request (see the module's documentation).
pub(crate) struct Caller {
    pub agent: AgentInfo,
    pub role: ConsoleRole,
}

impl Caller {
    /// The refusal (403) when the caller's role is below `role`.
    pub(crate) fn below(&self, role: ConsoleRole) -> Option<Response> {
        (self.role < role).then(|| forbidden(&format!("the {} role is needed", role.as_str())))
    }
}

impl FromRequestParts<Console> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Response> {
        let basic = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(aqgate_core::auth::parse_basic);
        let agent = match basic {
            Some((user, password)) => {
                aqgate_http::servlet::check_password(&c.http, &user, &password, peer(parts)).await?
            }
            None => {
                let by_cookie = cookie(&parts.headers)
                    .and_then(|t| c.sessions.agent(&t))
                    .and_then(|name| c.http.engine.agent(&name));
                match by_cookie {
                    Some(a) => a,
                    None if parts.method == Method::GET || parts.method == Method::HEAD => {
                        return Err(see_other("/console/login"));
                    }
                    None => return Err((StatusCode::UNAUTHORIZED, "log in first\n").into_response()),
                }
            }
        };
        let Some(role) = agent.console else {
            return Err(forbidden(&format!("agent {} has no console access", agent.name)));
        };
        Ok(Caller { agent, role })
    }
}

fn peer(parts: &Parts) -> Option<std::net::IpAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
}

/// The console cookie's value; an empty one counts as none.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').find_map(|kv| {
            let (k, val) = kv.trim().split_once('=')?;
            (k == COOKIE && !val.trim().is_empty()).then(|| val.trim().to_string())
        })
    })
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    error: Option<&'a str>,
}

pub(crate) async fn login_form() -> Response {
    html(StatusCode::OK, &LoginPage { error: None })
}

/// `POST /console/login`: `agent` and `password` form fields.
pub(crate) async fn login(State(c): State<Console>, req: Request) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let Ok(body) = axum::body::to_bytes(req.into_body(), FORM_MAX).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large\n").into_response();
    };
    let (mut user, mut password) = (String::new(), String::new());
    for (k, v) in url::form_urlencoded::parse(&body) {
        match k.as_ref() {
            "agent" => user = v.into_owned(),
            "password" => password = v.into_owned(),
            _ => {}
        }
    }
    let agent = match aqgate_http::servlet::check_password(&c.http, &user, &password, peer).await {
        Ok(a) => a,
        Err(r) if r.status() == StatusCode::UNAUTHORIZED => {
            return html(StatusCode::UNAUTHORIZED, &LoginPage { error: Some("Wrong agent name or password.") });
        }
        Err(r) => return r,
    };
    if agent.console.is_none() {
        return html(StatusCode::FORBIDDEN, &LoginPage { error: Some("This agent has no console access.") });
    }
    let token = c.sessions.open(&agent.name);
    tracing::info!(agent = %agent.name, "console login");
    let mut r = see_other("/console/");
    if let Ok(v) = HeaderValue::from_str(&format!("{COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict")) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `POST /console/logout`: the session ends and the cookie is cleared.
pub(crate) async fn logout(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Some(t) = cookie(&headers) {
        c.sessions.close(&t);
    }
    let mut r = see_other("/console/login");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("__Host-aqgate_console=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=Strict"),
    );
    r
}
