//! The AQ servlet: IDAP over HTTP (axum).
//!
//! `POST /aqserv` (also `/aqserv/servlet/{name}`, the original's path shape) takes an
//! IDAP document (`text/xml` or `application/xml`) and answers `text/xml`. Transport-level
//! failures get an HTTP status and no XML body (401, 408, 413, 415, 429, 503); everything
//! the IDAP layer can decode gets an IDAP response or `Fault` with status 200. The caller
//! is authenticated from the request's head before its body is read (`login`).
//!
//! Authentication is HTTP Basic against the agents of the topology, or over HTTPS a client
//! certificate ([`client_cert`]); the first request of a client opens a session and answers with an `AQSESSIONID` cookie that carries it (and its
//! transaction) across requests. A gateway agent may act for another agent with the
//! `AQ-On-Behalf-Of` header. Agents that federate through an IdP log in with a SAML 2.0
//! assertion instead (`saml`).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use aqgate_core::auth;
use aqgate_core::engine::{Abandon, ClientSchedule, Engine, IdempotencyClaim, Resumed, Session};
use aqgate_core::error::{AqError, code};
use aqgate_proto::idap::{self, Envelope, Limits};

mod client_cert;
mod login;
mod parse;
mod password;
#[cfg_attr(not(feature = "saml"), path = "servlet/no_saml.rs")]
mod saml;

pub use saml::SamlVerifier;

pub use client_cert::TlsConnection;
pub use password::{PasswordGate, PasswordLimits};

use aqgate_proto::names::WSSE_NS;
pub use aqgate_proto::names::{
    CLIENT_TIMEZONE_HEADER, IDEMPOTENCY_HEADER, ON_BEHALF_HEADER, REPLAYED_HEADER, SCHEDULE_HEADER, SESSION_COOKIE,
};

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub limits: Limits,
    /// Recently verified Basic credentials (see [`auth::CredentialCache`]).
    pub credentials: Arc<auth::CredentialCache>,
    /// Mark the session cookie `Secure` (clients send it back over HTTPS only): for a
    /// servlet behind a TLS-terminating proxy.
    pub secure_cookie: bool,
    /// IDAP requests being answered now (long polls included); `/metrics` shows it, so an
    /// operator sees what a graceful shutdown waits for.
    pub in_flight: Arc<std::sync::atomic::AtomicU64>,
    /// (agent, idempotency key) of requests being performed in this process now.
    pub idempotent_in_flight: Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
    /// SAML login (see [`saml`]); `None`: off.
    pub saml: Option<Arc<SamlVerifier>>,
    /// A request body not received whole within this is answered 408.
    pub body_timeout: std::time::Duration,
    /// The listeners' connections (their caps and counters; `/metrics` shows them).
    pub edge: Arc<crate::edge::Connections>,
    /// Bounds on password checks (see [`password`]).
    pub passwords: Arc<PasswordGate>,
    /// The turns for parsing large bodies off the runtime's worker (see [`parse`]).
    pub large_parses: Arc<parse::LargeParses>,
    /// What `/metrics` shows after this crate's own figures; `None`: nothing more.
    pub more_metrics: Option<MoreMetrics>,
}

/// Figures `/metrics` shows that the HTTP edge does not compute itself (the wiring passes in
/// the administration read model's: the propagation jobs and the gateway links), rendered
/// as Prometheus text; an error (a store that does not answer) makes `/metrics` a 503.
pub type MoreMetrics =
    Arc<dyn Fn(Arc<Engine>) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send>> + Send + Sync>;

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
            limits,
            credentials: Arc::new(auth::CredentialCache::new(std::time::Duration::from_secs(300), engine.clock())),
            secure_cookie: false,
            in_flight: Arc::default(),
            idempotent_in_flight: Arc::default(),
            saml: None,
            body_timeout: std::time::Duration::from_secs(30),
            edge: crate::edge::Connections::new(crate::edge::EdgeConfig::default(), &engine.config().metrics),
            passwords: Arc::new(PasswordGate::new(PasswordLimits::default(), &engine.config().metrics)),
            large_parses: parse::LargeParses::new(),
            more_metrics: None,
            engine,
        }
    }
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/aqserv", post(idap_post))
        .route("/aqserv/servlet/{name}", post(idap_post))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Checks `user`'s `password` exactly as a Basic login to the servlet does (the
/// verified-credentials cache, then a turn of the bounded password checks, with their
/// back-off per client address and per agent): the agent, or the answer to give (401, 429
/// with Retry-After, 503). Other surfaces of the HTTP listener (the web console) log in
/// through this, never through a hasher of their own.
pub async fn check_password(
    s: &AppState,
    user: &str,
    password: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<aqgate_core::topology::AgentInfo, Response> {
    login::basic_login(s, user, password, peer).await
}

/// Prometheus text: the counters of this process's metrics registry, requests in flight, and the outbox as the store
/// has it (pending and parked notifications, also those of other processes), then what [`AppState::more_metrics`]
/// renders (in the binary: every propagation job's state, backlog and lag, also of jobs that other processes run,
/// and the gateway links').
async fn metrics(State(s): State<AppState>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::new();
    let metric = |out: &mut String, name: &str, kind: &str, help: &str, v: String| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    };
    metric(
        &mut out,
        "aqgate_idap_requests_in_flight",
        "gauge",
        "IDAP requests being answered now, long polls included.",
        s.in_flight.load(Relaxed).to_string(),
    );
    metric(
        &mut out,
        "aqgate_http_connections_open",
        "gauge",
        "Connections the HTTP listeners hold now (at most --http-max-connections).",
        s.edge.open().to_string(),
    );
    metric(
        &mut out,
        "aqgate_runtime_worker_threads",
        "gauge",
        "The async runtime's worker threads (--worker-threads).",
        tokio::runtime::Handle::current().metrics().num_workers().to_string(),
    );
    metric(
        &mut out,
        "aqgate_database_writes_refused",
        "gauge",
        "1 while the database refuses writes for want of space (fault 1653), else 0.",
        u8::from(s.engine.store().writes_refused()).to_string(),
    );
    out.push_str(&format!(
        "# HELP aqgate_database_full_refusals_total Writes the database refused for want of space.\n\
         # TYPE aqgate_database_full_refusals_total counter\naqgate_database_full_refusals_total {}\n",
        s.engine.store().full_refusals()
    ));
    metric(
        &mut out,
        "aqgate_buffered_bytes",
        "gauge",
        "Bytes of memory this process's unspilled buffered messages hold (at most --buffered-max-bytes).",
        s.engine.buffered_bytes().to_string(),
    );
    s.engine.config().metrics.render(&mut out);
    match s.engine.store().notify_counts().await {
        Ok((pending, parked)) => {
            metric(
                &mut out,
                "aqgate_notify_outbox_pending",
                "gauge",
                "Committed notifications not yet delivered.",
                pending.to_string(),
            );
            metric(
                &mut out,
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
    if let Some(more) = &s.more_metrics {
        match more(s.engine.clone()).await {
            Ok(text) => out.push_str(&text),
            Err(e) => {
                tracing::warn!(error = %e, "metrics");
                return (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response();
            }
        }
    }
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Ready when a write would succeed: the store commits a small write (see
/// `Store::probe_write`); a full disk and an unreachable database are told apart.
async fn readyz(State(s): State<AppState>) -> Response {
    match tokio::time::timeout(READYZ_WITHIN, s.engine.store().probe_write()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n").into_response(),
        Ok(Err(e)) if e.is_full() => {
            (StatusCode::SERVICE_UNAVAILABLE, "store full: writes are refused\n").into_response()
        }
        Ok(Err(_)) => (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store unavailable: no answer in time\n").into_response(),
    }
}

/// `/readyz` answers within this: a database that does not answer (a connection attempt
/// waiting out its timeout) is not ready, and a health checker learns it before its own
/// timeout.
const READYZ_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

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

/// The Set-Cookie value that makes a client forget its session cookie.
fn clear_cookie_value(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}")
}

/// `r`, with the session cookie cleared.
fn forget_cookie(mut r: Response, secure: bool) -> Response {
    if let Ok(v) = HeaderValue::from_str(&clear_cookie_value(secure)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
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

/// 401 with the reason in the body (a client certificate that logs in as no agent).
fn unauthorized_because(reason: &str) -> Response {
    let mut r = unauthorized();
    *r.body_mut() = axum::body::Body::from(format!("{reason}\n"));
    r
}

/// Raises its [`Abandon`] when dropped (see `idap_post`).
struct AbandonOnDrop(Arc<Abandon>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// The session cookie's value; an empty one (a cleared cookie sent back) counts as none.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').find_map(|kv| {
            let (k, val) = kv.trim().split_once('=')?;
            (k == SESSION_COOKIE && !val.trim().is_empty()).then(|| val.trim().to_string())
        })
    })
}

enum Who {
    /// Authenticated by credentials as this effective agent; `cookie`: the session it names;
    /// `soap_token`: by the SAML token in the request's own `wsse:Security` header entry;
    /// `saml`: the assertion that logged it in, to be used when the request runs.
    Agent { agent: String, cookie: Option<String>, soap_token: bool, saml: Option<SamlUse> },
    /// The session cookie alone.
    Cookie(String),
}

/// A verified SAML assertion that logged a request in. It is used (recorded in the store's
/// replay cache, shared by every node) only when the request is about to run, so that a
/// request refused before that — a cookie of another agent's session, a malformed body, the
/// session cap — leaves it unused. (A build without SAML never makes one.)
#[cfg_attr(not(feature = "saml"), allow(dead_code))]
struct SamlUse {
    issuer: String,
    assertion_id: String,
    agent: String,
    /// Until when the store remembers it.
    until: aqgate_core::clock::Micros,
}

impl SamlUse {
    async fn once(&self, s: &AppState) -> Result<(), Response> {
        match s.engine.store().saml_assertion_once(&self.issuer, &self.assertion_id, self.until).await {
            Ok(true) => {
                tracing::info!(agent = %self.agent, assertion = %self.assertion_id, "SAML login");
                Ok(())
            }
            Ok(false) => Err(saml_refused(format!(
                "SAML assertion refused: assertion {} was used before (an assertion logs in once; keep the \
                 session cookie instead)",
                self.assertion_id
            ))),
            Err(e) => Err(fault(&AqError::from(e), None)),
        }
    }
}

/// A 401 whose IDAP Fault says why a SAML login was refused.
fn saml_refused(msg: impl Into<String>) -> Response {
    let msg = msg.into();
    tracing::info!(reason = %msg, "SAML login refused");
    let mut r = fault(&AqError::client(code::NOT_PERMITTED, msg), None);
    *r.status_mut() = StatusCode::UNAUTHORIZED;
    r
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

/// The `Idempotency-Key` header's key: a structured-field string (`"…"`) as the draft has
/// it, or a bare token; 1–255 printable ASCII characters. `Ok(None)` without the header.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, AqError> {
    let mut values = headers.get_all(IDEMPOTENCY_HEADER).iter();
    let Some(v) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(AqError::invalid("Idempotency-Key is given more than once"));
    }
    let v = v.to_str().map_err(|_| AqError::invalid("Idempotency-Key is not printable ASCII"))?.trim();
    let key = match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or_else(|| AqError::invalid("Idempotency-Key: unterminated string"))?,
        None => v,
    };
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\')
    {
        return Err(AqError::invalid(
            "Idempotency-Key must be 1 to 255 printable ASCII characters (no quotes, backslashes or spaces)",
        ));
    }
    Ok(Some(key.to_string()))
}

/// The `AQ-Schedule` and `AQ-Client-Timezone` headers (the engine reads them: see
/// `aqgate_core::engine::schedule`); `Ok(None)` without a schedule.
fn client_schedule(headers: &HeaderMap) -> Result<Option<ClientSchedule>, AqError> {
    let one = |name: &str| -> Result<Option<String>, AqError> {
        let mut values = headers.get_all(name).iter();
        let Some(v) = values.next() else { return Ok(None) };
        if values.next().is_some() {
            return Err(AqError::invalid(format!("{name} is given more than once")));
        }
        let v = v.to_str().map_err(|_| AqError::invalid(format!("{name} is not printable ASCII")))?;
        Ok(Some(v.trim().to_string()))
    };
    let Some(value) = one(SCHEDULE_HEADER)? else { return Ok(None) };
    Ok(Some(ClientSchedule { value, timezone: one(CLIENT_TIMEZONE_HEADER)? }))
}

/// An IDAP Fault with an HTTP status other than 200 (idempotency conflicts, as the
/// draft's 409 and 422).
fn fault_with_status(status: StatusCode, e: &AqError) -> Response {
    let mut r = fault(e, None);
    *r.status_mut() = status;
    r
}

/// A fault for a request refused for an agent's share (sessions, idempotency records) is
/// also HTTP 503 with `Retry-After`: nothing of it was performed, and it may be sent again
/// once the agent's sessions end or its records age out.
fn limited(mut r: Response, fault_code: i32) -> Response {
    let retry_after = match fault_code {
        code::SESSION_LIMIT => "5",
        code::IDEMPOTENCY_LIMIT => "60",
        _ => return r,
    };
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(retry_after));
    r
}

/// The recorded response of an earlier request with the same key, byte for byte.
fn replayed(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/xml; charset=utf-8")),
            (axum::http::HeaderName::from_static(REPLAYED_HEADER), HeaderValue::from_static("true")),
        ],
        body,
    )
        .into_response()
}

/// How a request ended, as the task that performed it reports.
enum Outcome {
    /// Performed (or refused by the engine): the response, and whether the request opened
    /// a session that is now stored (its cookie is answered).
    Done { result: Result<idap::Response, AqError>, new_session: Option<String> },
    /// The session cookie is of no use any more: fault, and the cookie is cleared.
    Gone(AqError),
    /// An earlier request with the same idempotency key answered this.
    Replay(Vec<u8>),
    /// A ready answer (401, idempotency conflicts).
    Answer(Response),
}

async fn idap_post(
    State(mut s): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    tls: Option<axum::Extension<TlsConnection>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // Which connection the request came on (absent when the router is driven directly).
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a);
    let origin = peer.as_ref().map_or(0, origin_of);
    let _in_flight = InFlight::enter(&s.in_flight);
    if !content_type_ok(&headers) {
        login::discard_arrived(&headers, body).await;
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "IDAP requests are text/xml or application/xml\n").into_response();
    }
    let tls = tls.map(|axum::Extension(t)| t);
    // Over TLS the cookie is Secure: the client sends it back over HTTPS only.
    s.secure_cookie |= tls.is_some();
    let head = match login::authenticate(&s, &headers, tls.as_ref(), peer.map(|p| p.ip())).await {
        Ok(w) => w,
        Err(r) => {
            login::discard_arrived(&headers, body).await;
            return r;
        }
    };
    let body = match login::read_body(&s, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let who = match login::authenticate_by_body(&s, &headers, tls.as_ref(), &body, head).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(e) => return fault_with_status(StatusCode::BAD_REQUEST, &e),
    };
    // Parsed before a session is opened: a request refused here leaves none behind.
    let envelope = match parse::request(&s.engine, &s.large_parses, &body, &s.limits).await {
        Ok(e) => e,
        Err(e) => return fault(&AqError::client(e.error_code(), e.to_string()), None),
    };
    // A security token in the request is the identity it claims: one that did not log the
    // request in (SAML off, or a parser that saw no token where this one does) is refused,
    // never ignored in favour of other credentials.
    if !matches!(who, Who::Agent { soap_token: true, .. })
        && envelope.headers.iter().any(|h| h.local_name() == "Security" && h.namespace() == Some(WSSE_NS))
    {
        return saml_refused(match &s.saml {
            None if cfg!(feature = "saml") => {
                "the request's Header carries a wsse:Security token, but SAML login is not configured on this server \
                 (--saml-idp-metadata)"
            }
            None => crate::SAML_FEATURE_MISSING,
            Some(_) => "the request's Header carries a wsse:Security token that did not log it in",
        });
    }
    if let Some(m) = headers.get("idapmethodname") {
        let checked = m.to_str().map_err(|_| AqError::invalid("IDAPMethodName header is not text")).and_then(|v| {
            idap::check_method_header(v, &envelope.body).map_err(|e| AqError::client(e.error_code(), e.to_string()))
        });
        if let Err(e) = checked {
            return fault(&e, None);
        }
    }
    let schedule = match client_schedule(&headers) {
        Ok(s) => s,
        Err(e) => return fault(&e, None),
    };
    // A schedule is part of the request: the same body with another one is another request.
    let request_hash = key.as_ref().map(|_| {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        d.update(&body);
        if let Some(s) = &schedule {
            for part in [Some(s.value.as_str()), s.timezone.as_deref()] {
                d.update(b"\0");
                d.update(part.unwrap_or("").as_bytes());
            }
        }
        d.finish().as_ref().to_vec()
    });
    // The request runs to its end in its own task even if the client goes away: a request
    // cancelled between its database commit and the answer would be performed unanswered
    // with nothing to tell (and a session's next request must find it settled).
    let state = s.clone();
    // Dropped with this handler: when the client goes away before the answer, hyper drops
    // the handler, and a long poll of the request stops waiting (it takes nothing).
    let abandon = AbandonOnDrop(Arc::new(Abandon::default()));
    let abandoned = abandon.0.clone();
    let task = tokio::spawn(async move {
        let s = state;
        let engine = s.engine.clone();
        let (cookie, expected, saml) = match who {
            Who::Agent { agent, cookie, saml, .. } => (cookie, Some(agent), saml),
            Who::Cookie(id) => (Some(id), None, None),
        };
        let hash = cookie.as_deref().map(aqgate_core::engine::session::id_hash);
        // Requests of one session take turns in this process.
        let _turn = match &hash {
            Some(h) => Some(engine.sessions.turn(h).await),
            None => None,
        };
        // A session this process wrote last starts from its copy (no read); if another
        // process wrote it since, the request's own write finds out, nothing of it
        // happened, and it runs once more from the row.
        let mut from_copy = false;
        let mut session = match (&cookie, expected.as_deref()) {
            (None, Some(agent)) => Session::new(agent, engine.now()),
            (None, None) => return Outcome::Answer(unauthorized()),
            (Some(id), expected) => {
                let copy = hash
                    .as_deref()
                    .and_then(|h| engine.sessions.last_written(h))
                    .filter(|row| expected.is_none_or(|e| e == row.agent) && engine.agent(&row.agent).is_some());
                match copy.and_then(|row| Session::from_row(id, &row)) {
                    Some(sess) => {
                        from_copy = true;
                        sess
                    }
                    None => match resume(&s, id, expected).await {
                        Ok(sess) => sess,
                        Err(o) => return o,
                    },
                }
            }
        };
        let new = session.stored.is_none();
        let mut in_flight = None;
        if let (Some(key), Some(request_hash)) = (key, request_hash) {
            match engine.store().idempotency_get(&session.agent, &key).await {
                Ok(Some(rec)) => return replay_of(rec, &request_hash),
                Ok(None) => {}
                Err(e) => return Outcome::Done { result: Err(e.into()), new_session: None },
            }
            let entry = (session.agent.clone(), key.clone());
            if !s.idempotent_in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(entry.clone()) {
                return Outcome::Answer(fault_with_status(
                    StatusCode::CONFLICT,
                    &AqError::client(
                        code::IDEMPOTENCY_IN_PROGRESS,
                        "a request with this Idempotency-Key is being performed now; send it again later",
                    ),
                ));
            }
            in_flight = Some(InFlightKey(s.idempotent_in_flight.clone(), entry));
            session.idempotency = Some(IdempotencyClaim { key, request_hash });
        }
        if let Some(u) = &saml
            && let Err(r) = u.once(&s).await
        {
            return Outcome::Answer(r);
        }
        session.origin = origin;
        session.abandon = Some(abandoned.clone());
        session.schedule = schedule.clone();
        let mut result = engine.execute_envelope(&mut session, envelope).await;
        if from_copy
            && let (Err(e), Some(id)) = (&result, &cookie)
            && e.code == code::SESSION_BUSY
        {
            let claim = session.idempotency.take();
            session = match resume(&s, id, expected.as_deref()).await {
                Ok(sess) => sess,
                Err(o) => {
                    if let Some(h) = &hash {
                        engine.sessions.forget(h);
                    }
                    return o;
                }
            };
            session.idempotency = claim;
            session.origin = origin;
            session.abandon = Some(abandoned);
            session.schedule = schedule;
            result = match parse::request(&s.engine, &s.large_parses, &body, &s.limits).await {
                Ok(envelope) => engine.execute_envelope(&mut session, envelope).await,
                Err(e) => Err(AqError::client(e.error_code(), e.to_string())),
            };
        }
        if let Some(h) = &hash {
            match &result {
                Ok(_) => engine.sessions.wrote(&session),
                Err(_) => engine.sessions.forget(h),
            }
        } else if session.stored.is_some() {
            engine.sessions.wrote(&session);
        }
        if let (Err(e), Some(claim)) = (&result, &session.idempotency)
            && e.code == code::IDEMPOTENCY_IN_PROGRESS
        {
            // Another process performed the same key first: its response is the answer.
            if let Ok(Some(rec)) = engine.store().idempotency_get(&session.agent, &claim.key).await {
                return replay_of(rec, &claim.request_hash);
            }
        }
        drop(in_flight);
        if let Err(e) = &result
            && e.code == code::SESSION_EXPIRED
        {
            return Outcome::Gone(e.clone());
        }
        // A session opened by this request that holds nothing (no open work, no navigation
        // position) has no row and gets no cookie: clients that never send the cookie back
        // must not pile up sessions. The next request simply opens a new one.
        let new_session = (new && session.stored.is_some()).then(|| session.id.clone());
        Outcome::Done { result, new_session }
    });
    let outcome = match task.await {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "request task failed");
            let e = AqError::server(code::INTERNAL, "internal error; the request may not have been performed");
            Outcome::Done { result: Err(e), new_session: None }
        }
    };
    drop(abandon);
    match outcome {
        Outcome::Done { result, new_session } => {
            let cookie = new_session.as_deref().map(|id| set_cookie_value(id, s.secure_cookie));
            match result {
                Ok(resp) => xml(idap::write_response(&Envelope { headers: Vec::new(), body: resp }), cookie.as_deref()),
                Err(e) => limited(fault(&e, cookie.as_deref()), e.code),
            }
        }
        Outcome::Gone(e) => fault(&e, Some(&clear_cookie_value(s.secure_cookie))),
        Outcome::Replay(body) => replayed(body),
        Outcome::Answer(r) => r,
    }
}

/// Removes its (agent, key) from the in-flight set when dropped.
struct InFlightKey(Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>, (String, String));

impl Drop for InFlightKey {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

fn replay_of(rec: aqgate_core::store::IdempotencyRecord, request_hash: &[u8]) -> Outcome {
    if rec.request_hash != request_hash {
        return Outcome::Answer(fault_with_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            &AqError::client(
                code::IDEMPOTENCY_MISMATCH,
                "this Idempotency-Key was used before with a different request; use a new key for a new request",
            ),
        ));
    }
    Outcome::Replay(rec.response)
}

/// The session the cookie `id` names, for `expected` (the agent the credentials
/// authenticated; `None`: the cookie alone is the credential). A cookie that names no live
/// session of that agent is never quietly a fresh session: its work may be gone, so the
/// client hears so and drops the cookie.
async fn resume(s: &AppState, id: &str, expected: Option<&str>) -> Result<Session, Outcome> {
    let unknown = || {
        Outcome::Gone(AqError::client(
            code::SESSION_UNKNOWN,
            format!(
                "the session cookie names no session{} (it ended, or was never issued here); \
                 whatever it left uncommitted is not committed: start the transaction again without the cookie",
                expected.map(|a| format!(" of agent {a}")).unwrap_or_default()
            ),
        ))
    };
    let ours = |agent: &str| expected.is_none_or(|e| e == agent);
    match s.engine.resume(id).await {
        Ok(Resumed::Live(sess)) if ours(&sess.agent) => {
            if s.engine.agent(&sess.agent).is_none() {
                // The agent was removed: its cookie authenticates nobody.
                return Err(Outcome::Answer(unauthorized()));
            }
            Ok(*sess)
        }
        Ok(Resumed::Ended { agent, .. }) if ours(&agent) => {
            Err(Outcome::Gone(aqgate_core::engine::session_expired_error()))
        }
        // The cookie alone authenticated nobody.
        Ok(_) if expected.is_none() => Err(Outcome::Answer(forget_cookie(unauthorized(), s.secure_cookie))),
        Ok(_) => Err(unknown()),
        Err(e) => Err(Outcome::Done { result: Err(e), new_session: None }),
    }
}
