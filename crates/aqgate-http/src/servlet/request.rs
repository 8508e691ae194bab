//! An IDAP request's way through the servlet, in named phases: the transport's checks and
//! the login ([`admit`]), the checks of the request itself ([`check`]), then in a task of its
//! own ([`perform`]) the session ([`open_session`]), the idempotency key ([`claim_key`]),
//! the engine's run (once more from the stored row when another process wrote the session:
//! [`run_again_from_row`]), what the process remembers of it ([`settle`]), and the HTTP
//! answer ([`answer`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use aqgate_core::engine::{Abandon, ClientSchedule, IdempotencyClaim, Resumed, Session};
use aqgate_core::error::{AqError, code};
use aqgate_proto::idap::{self, Envelope};
use aqgate_proto::names::WSSE_NS;

use super::{
    AppState, InFlight, TlsConnection, Who, clear_cookie_value, client_schedule, content_type_ok, fault,
    fault_with_status, forget_cookie, idempotency_key, limited, login, origin_of, parse, replayed, saml_refused,
    set_cookie_value, unauthorized, xml,
};

/// Raises its [`Abandon`] when dropped (see [`idap_post`]).
struct AbandonOnDrop(Arc<Abandon>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandon();
    }
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

/// A request that passed every check made before it runs.
struct Checked {
    /// The `Idempotency-Key`, if given.
    key: Option<String>,
    /// The body's digest (and the schedule's) that a replay under `key` must match; with a
    /// key only.
    request_hash: Option<Vec<u8>>,
    envelope: Envelope<idap::Request>,
    schedule: Option<ClientSchedule>,
}

/// What every run of the request puts into its session: where it came from, the flag that
/// says its client went away, the client's schedule.
struct Attach {
    origin: u64,
    abandon: Arc<Abandon>,
    schedule: Option<ClientSchedule>,
}

impl Attach {
    fn to(&self, session: &mut Session) {
        session.origin = self.origin;
        session.abandon = Some(self.abandon.clone());
        session.schedule = self.schedule.clone();
    }
}

/// `POST /aqserv`: admitted, checked, performed in its own task, answered.
pub(super) async fn idap_post(
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
    let tls = tls.map(|axum::Extension(t)| t);
    let (who, body) = match admit(&mut s, &headers, tls.as_ref(), peer, body).await {
        Ok(admitted) => admitted,
        Err(r) => return r,
    };
    let checked = match check(&s, &headers, &who, &body).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    // The request runs to its end in its own task even if the client goes away: a request
    // cancelled between its database commit and the answer would be performed unanswered
    // with nothing to tell (and a session's next request must find it settled).
    // Dropped with this handler: when the client goes away before the answer, hyper drops
    // the handler, and a long poll of the request stops waiting (it takes nothing).
    let abandon = AbandonOnDrop(Arc::new(Abandon::default()));
    let attach = Attach { origin, abandon: abandon.0.clone(), schedule: checked.schedule.clone() };
    let task = tokio::spawn(perform(s.clone(), who, checked, body, attach));
    let outcome = match task.await {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "request task failed");
            let e = AqError::server(code::INTERNAL, "internal error; the request may not have been performed");
            Outcome::Done { result: Err(e), new_session: None }
        }
    };
    drop(abandon);
    answer(&s, outcome)
}

/// The transport's checks and the login: an XML content type, the caller authenticated
/// from the head, the body read within its bounds, then authenticated by the body where
/// the head did not say who it is. A request refused before its body is read has what of
/// the body arrived dropped.
async fn admit(
    s: &mut AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
    peer: Option<std::net::SocketAddr>,
    body: axum::body::Body,
) -> Result<(Who, Bytes), Response> {
    if !content_type_ok(headers) {
        login::discard_arrived(headers, body).await;
        return Err(
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "IDAP requests are text/xml or application/xml\n").into_response()
        );
    }
    // Over TLS the cookie is Secure: the client sends it back over HTTPS only.
    s.secure_cookie |= tls.is_some();
    let head = match login::authenticate(s, headers, tls, peer.map(|p| p.ip())).await {
        Ok(w) => w,
        Err(r) => {
            login::discard_arrived(headers, body).await;
            return Err(r);
        }
    };
    let body = login::read_body(s, headers, body).await?;
    let who = login::authenticate_by_body(s, headers, tls, &body, head).await?;
    Ok((who, body))
}

/// The request's own checks, made before a session is opened so that a request refused
/// here leaves none behind: the `Idempotency-Key`, the IDAP document parsed, no security
/// token that did not log it in, `IDAPMethodName` matching the body, the `AQ-Schedule`.
async fn check(s: &AppState, headers: &HeaderMap, who: &Who, body: &Bytes) -> Result<Checked, Response> {
    let key = idempotency_key(headers).map_err(|e| fault_with_status(StatusCode::BAD_REQUEST, &e))?;
    let envelope = parse::request(&s.engine, &s.large_parses, body, &s.limits)
        .await
        .map_err(|e| fault(&AqError::client(e.error_code(), e.to_string()), None))?;
    // A security token in the request is the identity it claims: one that did not log the
    // request in (SAML off, or a parser that saw no token where this one does) is refused,
    // never ignored in favour of other credentials.
    if !matches!(who, Who::Agent { soap_token: true, .. })
        && envelope.headers.iter().any(|h| h.local_name() == "Security" && h.namespace() == Some(WSSE_NS))
    {
        return Err(saml_refused(match &s.saml {
            None if cfg!(feature = "saml") => {
                "the request's Header carries a wsse:Security token, but SAML login is not configured on this server \
                 (--saml-idp-metadata)"
            }
            None => crate::SAML_FEATURE_MISSING,
            Some(_) => "the request's Header carries a wsse:Security token that did not log it in",
        }));
    }
    if let Some(m) = headers.get("idapmethodname") {
        m.to_str()
            .map_err(|_| AqError::invalid("IDAPMethodName header is not text"))
            .and_then(|v| {
                idap::check_method_header(v, &envelope.body).map_err(|e| AqError::client(e.error_code(), e.to_string()))
            })
            .map_err(|e| fault(&e, None))?;
    }
    let schedule = client_schedule(headers).map_err(|e| fault(&e, None))?;
    // A schedule is part of the request: the same body with another one is another request.
    let request_hash = key.as_ref().map(|_| {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        d.update(body);
        if let Some(s) = &schedule {
            for part in [Some(s.value.as_str()), s.timezone.as_deref()] {
                d.update(b"\0");
                d.update(part.unwrap_or("").as_bytes());
            }
        }
        d.finish().as_ref().to_vec()
    });
    Ok(Checked { key, request_hash, envelope, schedule })
}

/// Performs a checked request in its session (the task of [`idap_post`]): its turn among
/// the session's requests, the session, the idempotency key, a SAML assertion used once,
/// the engine's run, and what the process remembers of it.
async fn perform(s: AppState, who: Who, checked: Checked, body: Bytes, attach: Attach) -> Outcome {
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
    let (mut session, from_copy) = match open_session(&s, cookie.as_deref(), expected.as_deref(), hash.as_deref()).await
    {
        Ok(opened) => opened,
        Err(o) => return o,
    };
    let new = session.stored.is_none();
    let in_flight = match claim_key(&s, &mut session, checked.key, checked.request_hash).await {
        Ok(guard) => guard,
        Err(o) => return o,
    };
    if let Some(u) = &saml
        && let Err(r) = u.once(&s).await
    {
        return Outcome::Answer(r);
    }
    attach.to(&mut session);
    let mut result = engine.execute_envelope(&mut session, checked.envelope).await;
    if from_copy
        && let (Err(e), Some(id)) = (&result, &cookie)
        && e.code == code::SESSION_BUSY
    {
        let again = run_again_from_row(&s, &mut session, id, expected.as_deref(), &attach, &body).await;
        result = match again {
            Ok(r) => r,
            Err(o) => {
                if let Some(h) = &hash {
                    engine.sessions.forget(h);
                }
                return o;
            }
        };
    }
    settle(&s, &session, result, hash.as_deref(), new, in_flight).await
}

/// The request's session: a new one for credentials without a cookie; for a cookie, this
/// process's copy when it wrote the session last (no read; `true` beside it), else the
/// stored row ([`resume`]).
async fn open_session(
    s: &AppState,
    cookie: Option<&str>,
    expected: Option<&str>,
    hash: Option<&[u8]>,
) -> Result<(Session, bool), Outcome> {
    let engine = &s.engine;
    match (cookie, expected) {
        (None, Some(agent)) => Ok((Session::new(agent, engine.now()), false)),
        (None, None) => Err(Outcome::Answer(unauthorized())),
        (Some(id), expected) => {
            // A session this process wrote last starts from its copy (no read); if another
            // process wrote it since, the request's own write finds out, nothing of it
            // happened, and it runs once more from the row.
            let copy = hash
                .and_then(|h| engine.sessions.last_written(h))
                .filter(|row| expected.is_none_or(|e| e == row.agent) && engine.agent(&row.agent).is_some());
            match copy.and_then(|row| Session::from_row(id, &row)) {
                Some(sess) => Ok((sess, true)),
                None => Ok((resume(s, id, expected).await?, false)),
            }
        }
    }
}

/// The idempotency phase, for a request with a key: the recorded response of an earlier
/// request with it is the answer (a replay); one being performed in this process now is a
/// 409; else the key is claimed in the session (the engine records the response with the
/// commit), and in this process until the returned guard is dropped.
async fn claim_key(
    s: &AppState,
    session: &mut Session,
    key: Option<String>,
    request_hash: Option<Vec<u8>>,
) -> Result<Option<InFlightKey>, Outcome> {
    let (Some(key), Some(request_hash)) = (key, request_hash) else { return Ok(None) };
    match s.engine.store().idempotency_get(&session.agent, &key).await {
        Ok(Some(rec)) => return Err(replay_of(rec, &request_hash)),
        Ok(None) => {}
        Err(e) => return Err(Outcome::Done { result: Err(e.into()), new_session: None }),
    }
    let entry = (session.agent.clone(), key.clone());
    if !s.idempotent_in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(entry.clone()) {
        return Err(Outcome::Answer(fault_with_status(
            StatusCode::CONFLICT,
            &AqError::client(
                code::IDEMPOTENCY_IN_PROGRESS,
                "a request with this Idempotency-Key is being performed now; send it again later",
            ),
        )));
    }
    session.idempotency = Some(IdempotencyClaim { key, request_hash });
    Ok(Some(InFlightKey(s.idempotent_in_flight.clone(), entry)))
}

/// The request run once more, from the session's stored row: it ran from this process's
/// copy and another process had written the session since (nothing of the first run
/// happened). The body is parsed again (the first run consumed its envelope); the
/// idempotency claim carries over. An `Err` is the answer (the session is gone).
async fn run_again_from_row(
    s: &AppState,
    session: &mut Session,
    id: &str,
    expected: Option<&str>,
    attach: &Attach,
    body: &Bytes,
) -> Result<Result<idap::Response, AqError>, Outcome> {
    let claim = session.idempotency.take();
    *session = resume(s, id, expected).await?;
    session.idempotency = claim;
    attach.to(session);
    Ok(match parse::request(&s.engine, &s.large_parses, body, &s.limits).await {
        Ok(envelope) => s.engine.execute_envelope(session, envelope).await,
        Err(e) => Err(AqError::client(e.error_code(), e.to_string())),
    })
}

/// What the process remembers of a run, and its outcome: the session's copy kept (or
/// forgotten after an error), the response of another process that performed the same
/// idempotency key first, the key released, an expired session's cookie cleared, and the
/// cookie of a session this request opened and stored.
async fn settle(
    s: &AppState,
    session: &Session,
    result: Result<idap::Response, AqError>,
    hash: Option<&[u8]>,
    new: bool,
    in_flight: Option<InFlightKey>,
) -> Outcome {
    let engine = &s.engine;
    if let Some(h) = hash {
        match &result {
            Ok(_) => engine.sessions.wrote(session),
            Err(_) => engine.sessions.forget(h),
        }
    } else if session.stored.is_some() {
        engine.sessions.wrote(session);
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
}

/// The HTTP answer to an outcome: the IDAP response or fault (with the new session's
/// cookie, or the cleared one), a replayed response, or a ready answer.
fn answer(s: &AppState, outcome: Outcome) -> Response {
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

/// The recorded response of an earlier request with the same key as the answer, if the request is the same.
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
