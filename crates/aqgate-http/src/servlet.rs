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
use aqgate_core::engine::{ClientSchedule, Engine};
use aqgate_core::error::{AqError, code};
use aqgate_proto::idap::{self, Envelope, Limits};

mod client_cert;
mod login;
mod parse;
mod password;
mod request;
#[cfg_attr(not(feature = "saml"), path = "servlet/no_saml.rs")]
mod saml;

pub use saml::SamlVerifier;

pub use client_cert::TlsConnection;
pub use password::{PasswordGate, PasswordLimits};

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
        .route("/aqserv", post(request::idap_post))
        .route("/aqserv/servlet/{name}", post(request::idap_post))
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
/// and the gateway links'). During a database outage the store's figures are left out (the rest answers at once).
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
    let health = s.engine.store().health();
    metric(
        &mut out,
        "aqgate_database_available",
        "gauge",
        "1 while the database takes writes, 0 during an outage (unreachable, connection lost, read-only; fault 1034).",
        u8::from(health.available).to_string(),
    );
    metric(
        &mut out,
        "aqgate_database_outages_total",
        "counter",
        "Outages of the database this process saw (each logged once when it begins and once when it ends).",
        health.outages.to_string(),
    );
    metric(
        &mut out,
        "aqgate_database_outage_seconds",
        "gauge",
        "Seconds of the database outage going on, or else of the last one (0: none yet).",
        format!("{:.3}", health.outage_seconds),
    );
    metric(
        &mut out,
        "aqgate_database_vacuums_total",
        "counter",
        "Tables of aqgate's this process vacuumed because their dead rows were due (--vacuum-every).",
        health.vacuums.to_string(),
    );
    metric(
        &mut out,
        "aqgate_database_vacuumed_rows_total",
        "counter",
        "Dead rows the tables this process vacuumed held before.",
        health.vacuumed_rows.to_string(),
    );
    metric(
        &mut out,
        "aqgate_database_analyzes_total",
        "counter",
        "Tables of aqgate's this process analyzed alone because their statistics were due (rows changed since they were gathered).",
        health.analyzes.to_string(),
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
    if !health.available {
        // The figures the store keeps are not to be had now: the rest is still shown (the
        // outage's own gauges above all), without waiting for the database.
        tracing::debug!("metrics: the database is unavailable; its figures are left out");
        return ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response();
    }
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

/// Ready when a write would succeed, as the store's last check found (a small write
/// committed; see `Store::check_health`): answered from that state, never waiting for the
/// database longer than [`READYZ_WITHIN`], however many ask at once (one check runs at a
/// time). A full disk, a database that is away and one whose state is not known are told
/// apart in the body.
async fn readyz(State(s): State<AppState>) -> Response {
    use aqgate_core::store::Readiness;
    let health = match tokio::time::timeout(READYZ_WITHIN, s.engine.store().check_health(READYZ_WAIT)).await {
        Ok(h) => h.readiness,
        Err(_) => Readiness::Unknown("no answer in time".into()),
    };
    let not_ready = |body: String| (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], body);
    match health {
        Readiness::Ready => (StatusCode::OK, "ready\n").into_response(),
        Readiness::Full => not_ready("store full: writes are refused\n".into()).into_response(),
        Readiness::Unavailable(why) => not_ready(format!("database unavailable: {why}\n")).into_response(),
        Readiness::Unknown(why) => not_ready(format!("database state unknown: {why}\n")).into_response(),
    }
}

/// `/readyz` answers within this: a database that does not answer is not waited for, and a
/// health checker learns it before its own timeout.
const READYZ_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// How long `/readyz` waits for a check it found due (none ran within the last second: no
/// prober in this process) before it answers from the last state.
const READYZ_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

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

/// A fault for a request refused for an agent's share (sessions, idempotency records) or
/// because the database is away (1034) is also HTTP 503 with `Retry-After`: nothing of it
/// was performed, and it may be sent again once the agent's sessions end, its records age
/// out, or the database is back.
fn limited(mut r: Response, fault_code: i32) -> Response {
    let retry_after = match fault_code {
        code::SESSION_LIMIT => "5",
        code::IDEMPOTENCY_LIMIT => "60",
        code::STORE_UNAVAILABLE => "2",
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
