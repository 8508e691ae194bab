//! The AQ servlet: IDAP over HTTP (axum).
//!
//! `POST /aqserv` (also `/aqserv/servlet/{name}`, the original's path shape) takes an
//! IDAP document (`text/xml` or `application/xml`) and answers `text/xml`. Transport-level
//! failures get an HTTP status and no XML body (401, 413, 415); everything the IDAP layer
//! can decode gets an IDAP response or `Fault` with status 200.
//!
//! Authentication is HTTP Basic against the agents of the topology; the first request of a
//! client opens a session and answers with an `AQSESSIONID` cookie that carries it (and its
//! transaction) across requests. A gateway agent may act for another agent with the
//! `AQ-On-Behalf-Of` header.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth;
use crate::engine::{Abandon, Engine, Lookup, SessionRef};
use crate::error::{AqError, code};
use crate::idap::{self, Envelope, Limits};
use crate::topology::AgentInfo;

pub const SESSION_COOKIE: &str = "AQSESSIONID";
pub const ON_BEHALF_HEADER: &str = "aq-on-behalf-of";

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub limits: Limits,
    /// Recently verified Basic credentials (see [`auth::CredentialCache`]).
    pub credentials: Arc<auth::CredentialCache>,
    /// Open sessions beyond this get 503 (each holds memory until it times out).
    pub max_sessions: usize,
    /// Mark the session cookie `Secure` (clients send it back over HTTPS only): for a
    /// servlet behind a TLS-terminating proxy.
    pub secure_cookie: bool,
    /// IDAP requests being answered now (long polls included); `/metrics` shows it, so an
    /// operator sees what a graceful shutdown waits for.
    pub in_flight: Arc<std::sync::atomic::AtomicU64>,
}

/// Counts one request in [`AppState::in_flight`] for as long as it lives, also when the
/// client goes away and the handler is dropped.
struct InFlight(Arc<std::sync::atomic::AtomicU64>);

impl InFlight {
    fn enter(counter: &Arc<std::sync::atomic::AtomicU64>) -> Self {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl AppState {
    pub fn new(engine: Arc<Engine>, limits: Limits) -> Self {
        Self {
            engine,
            limits,
            credentials: Arc::new(auth::CredentialCache::new(std::time::Duration::from_secs(300))),
            max_sessions: 100_000,
            secure_cookie: false,
            in_flight: Arc::default(),
        }
    }
}

pub fn app(state: AppState) -> Router {
    let max_body = state.limits.max_bytes;
    Router::new()
        .route("/aqserv", post(idap_post))
        .route("/aqserv/servlet/{name}", post(idap_post))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Prometheus text: notification counters of this process and the outbox as the store
/// has it (pending and parked notifications, also those of other processes).
async fn metrics(State(s): State<AppState>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    let m = &crate::notify::METRICS;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    };
    metric(
        "aqgate_idap_requests_in_flight",
        "gauge",
        "IDAP requests being answered now, long polls included.",
        s.in_flight.load(Relaxed).to_string(),
    );
    let g = &crate::store::postgres::GROUP_METRICS;
    for (name, help, v) in [
        (
            "aqgate_pg_insert_statements_total",
            "Statements of the PostgreSQL insert writer (group commit).",
            &g.insert_statements,
        ),
        ("aqgate_pg_insert_requests_total", "Committed enqueues the insert writer wrote in them.", &g.insert_requests),
        ("aqgate_pg_take_statements_total", "Statements of the PostgreSQL receive writer.", &g.take_statements),
        ("aqgate_pg_take_requests_total", "Receives the receive writer answered with them.", &g.take_requests),
        ("aqgate_pg_group_waits_total", "Writer batches that waited for a regular client connection.", &g.waits),
    ] {
        metric(name, "counter", help, v.load(Relaxed).to_string());
    }
    metric(
        "aqgate_notifications_delivered_total",
        "counter",
        "Notifications delivered by this process.",
        m.delivered.load(Relaxed).to_string(),
    );
    metric(
        "aqgate_notification_failures_total",
        "counter",
        "Failed notification attempts in this process.",
        m.failed_attempts.load(Relaxed).to_string(),
    );
    metric(
        "aqgate_notifications_parked_total",
        "counter",
        "Notifications this process parked after failing too often.",
        m.parked.load(Relaxed).to_string(),
    );
    match s.engine.store().notify_counts().await {
        Ok((pending, parked)) => {
            metric(
                "aqgate_notify_outbox_pending",
                "gauge",
                "Committed notifications not yet delivered.",
                pending.to_string(),
            );
            metric(
                "aqgate_notify_outbox_parked",
                "gauge",
                "Notifications parked, waiting for an operator.",
                parked.to_string(),
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics: outbox counts");
            return (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response();
        }
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

async fn readyz(State(s): State<AppState>) -> Response {
    match s.engine.store().begin().await {
        Ok(tx) => match tx.commit().await {
            Ok(()) => (StatusCode::OK, "ready\n").into_response(),
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response(),
        },
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response(),
    }
}

/// A connection's name for the store's group commit (never 0, which means "unknown").
fn origin_of(peer: &std::net::SocketAddr) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    peer.hash(&mut h);
    h.finish().max(1)
}

/// The Set-Cookie value for a new session.
fn set_cookie_value(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}")
}

/// An IDAP answer; `cookie` is a whole Set-Cookie value (see [`set_cookie_value`]).
fn xml(body: String, cookie: Option<&str>) -> Response {
    let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, "text/xml; charset=utf-8")], body).into_response();
    if let Some(c) = cookie
        && let Ok(v) = HeaderValue::from_str(c)
    {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn fault(e: &AqError, cookie: Option<&str>) -> Response {
    xml(idap::write_response(&Envelope { headers: Vec::new(), body: idap::Response::Fault(e.to_fault()) }), cookie)
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Basic realm=\"aqgate\", charset=\"UTF-8\"")])
        .into_response()
}

/// Raises its [`Abandon`] when dropped (see `idap_post`).
struct AbandonOnDrop(Arc<Abandon>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').find_map(|kv| {
            let (k, val) = kv.trim().split_once('=')?;
            (k == SESSION_COOKIE).then(|| val.trim().to_string())
        })
    })
}

enum Who {
    /// An existing session.
    Session(SessionRef),
    /// Authenticated; a new session for this effective agent.
    New(String),
}

/// Works out who is calling. Basic credentials (+ on-behalf-of), when present, are always
/// verified (wrong ones are 401, whatever the cookie), and then the cookie counts only if
/// it names a session of that agent. Without credentials the session cookie alone is the
/// credential: a server-issued token of one agent, valid while the session lives (and the
/// agent exists). The second value: the cookie named an expired session of this agent
/// (its tombstone is used up here, so a request that fails to authenticate does not).
async fn authenticate(s: &AppState, headers: &HeaderMap) -> Result<(Who, bool), Response> {
    let basic = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(auth::parse_basic);
    let on_behalf = headers.get(ON_BEHALF_HEADER).and_then(|v| v.to_str().ok()).map(str::trim).map(String::from);
    let Some((user, password)) = basic else {
        let id = session_cookie(headers).filter(|_| on_behalf.is_none()).ok_or_else(unauthorized)?;
        let owner = s.engine.sessions.owner(&id).filter(|a| s.engine.agent(a).is_some()).ok_or_else(unauthorized)?;
        return match s.engine.sessions.get(&id, &owner) {
            Lookup::Live(sess) => Ok((Who::Session(sess), false)),
            Lookup::Expired => Ok((Who::New(owner), true)),
            Lookup::Unknown => Err(unauthorized()),
        };
    };
    let Some(agent) = s.engine.agent(&user) else { return Err(unauthorized()) };
    let Some(hash) = agent.password_hash.clone() else { return Err(unauthorized()) };
    if !s.credentials.check(&agent.name, &password) {
        let p = password.clone();
        let ok = tokio::task::spawn_blocking(move || auth::verify_password(&p, &hash)).await.unwrap_or(false);
        if !ok {
            return Err(unauthorized());
        }
        s.credentials.remember(&agent.name, &password);
    }
    let effective = match on_behalf {
        None => {
            if !agent.http {
                return Err(fault(
                    &AqError::client(
                        code::NOT_PERMITTED,
                        format!("agent {} is not enabled for HTTP access", agent.name),
                    ),
                    None,
                ));
            }
            agent.name.clone()
        }
        Some(other) => on_behalf_of(s, &agent, &other).map_err(|e| fault(&e, None))?,
    };
    // A cookie is bound to the agent its session speaks for; credentials for someone else
    // start afresh.
    match session_cookie(headers).map(|id| s.engine.sessions.get(&id, &effective)) {
        Some(Lookup::Live(sess)) => Ok((Who::Session(sess), false)),
        Some(Lookup::Expired) => Ok((Who::New(effective), true)),
        Some(Lookup::Unknown) | None => Ok((Who::New(effective), false)),
    }
}

fn on_behalf_of(s: &AppState, gateway: &AgentInfo, other: &str) -> Result<String, AqError> {
    if !gateway.gateway {
        return Err(AqError::client(
            code::NOT_PERMITTED,
            format!("agent {} may not act on behalf of other agents", gateway.name),
        ));
    }
    let target =
        s.engine.agent(other).ok_or_else(|| AqError::client(code::NOT_PERMITTED, format!("unknown agent {other}")))?;
    if !target.smtp {
        return Err(AqError::client(
            code::NOT_PERMITTED,
            format!("agent {} is not enabled for SMTP access", target.name),
        ));
    }
    Ok(target.name)
}

/// Only XML is accepted: a browser cannot send `text/xml` cross-site without a CORS
/// preflight, so a hostile page cannot replay a victim's cached Basic credentials with a
/// "simple" (form-encoded or untyped) request.
fn content_type_ok(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    matches!(mime.as_str(), "text/xml" | "application/xml")
}

async fn idap_post(
    State(s): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Which connection the request came on (absent when the router is driven directly).
    let origin = peer.map_or(0, |axum::Extension(axum::extract::ConnectInfo(a))| origin_of(&a));
    let _in_flight = InFlight::enter(&s.in_flight);
    if !content_type_ok(&headers) {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "IDAP requests are text/xml or application/xml\n").into_response();
    }
    let (who, expired) = match authenticate(&s, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    if expired {
        // The client learns once that its work is gone; its next request starts afresh.
        let e = AqError::client(
            code::SESSION_EXPIRED,
            "the session timed out and its uncommitted work was rolled back; send the request again",
        );
        return fault(&e, None);
    }
    // Parsed before a session is opened: a request refused here leaves none behind.
    let envelope = match idap::parse_request(&body, &s.limits) {
        Ok(e) => e,
        Err(e) => return fault(&AqError::client(e.error_code(), e.to_string()), None),
    };
    if let Some(m) = headers.get("idapmethodname") {
        let checked = m.to_str().map_err(|_| AqError::invalid("IDAPMethodName header is not text")).and_then(|v| {
            idap::check_method_header(v, &envelope.body).map_err(|e| AqError::client(e.error_code(), e.to_string()))
        });
        if let Err(e) = checked {
            return fault(&e, None);
        }
    }
    let (session, new_cookie) = match who {
        Who::Session(sess) => (sess, None),
        Who::New(agent) => {
            if s.engine.sessions.len() >= s.max_sessions {
                return (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "5")], "too many open sessions\n")
                    .into_response();
            }
            let (id, sess) = s.engine.sessions.create(&agent, s.engine.now());
            (sess, Some(id))
        }
    };
    let set_cookie = new_cookie.as_deref().map(|id| set_cookie_value(id, s.secure_cookie));
    // The request runs to its end in its own task even if the client goes away: a request
    // cancelled between its database commit and the session's bookkeeping would leave
    // tagged rows the session no longer knows about.
    let engine = s.engine.clone();
    // Dropped with this handler: when the client goes away before the answer, hyper drops
    // the handler, and a long poll of the request stops waiting (it takes nothing).
    let abandon = AbandonOnDrop(Arc::new(Abandon::default()));
    let abandoned = abandon.0.clone();
    let task = tokio::spawn(async move {
        let mut guard = session.lock_owned().await;
        if guard.closed {
            return (
                Err(AqError::client(
                    code::SESSION_EXPIRED,
                    "the session timed out and its uncommitted work was rolled back",
                )),
                true,
            );
        }
        guard.origin = origin;
        guard.abandon = Some(abandoned);
        let result = engine.execute_envelope(&mut guard, envelope).await;
        guard.abandon = None;
        // A session opened by this request that holds nothing (no open work, no navigation
        // position) is not kept: clients that never send the cookie back must not pile up
        // sessions. The next request simply opens a new one.
        (result, !guard.pending && guard.positions.is_empty())
    });
    let (result, stateless) = match task.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "request task failed");
            (Err(AqError::server(code::INTERNAL, "internal error; the request may not have been performed")), false)
        }
    };
    let cookie = match new_cookie.as_deref() {
        Some(id) if stateless => {
            s.engine.sessions.remove(id, false);
            None
        }
        _ => set_cookie.as_deref(),
    };
    match result {
        Ok(resp) => xml(idap::write_response(&Envelope { headers: Vec::new(), body: resp }), cookie),
        Err(e) => fault(&e, cookie),
    }
}
