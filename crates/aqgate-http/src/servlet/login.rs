//! Who is calling, worked out before the request's body is read: Basic credentials (under
//! the password checks' bounds, `password`), a client certificate, the session cookie, a
//! SAML assertion in a header; only a `wsse:Security` token inside the body needs the body
//! first. Then the body itself, read within its size and time limits; and what of a refused
//! request's body is dropped so that the client reads its answer.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use aqgate_core::auth;
use aqgate_core::engine::Resumed;
use aqgate_core::error::{AqError, code};
use aqgate_core::topology::AgentInfo;

use super::password;
use super::saml;
use super::{AppState, ON_BEHALF_HEADER, TlsConnection, Who};
use super::{fault, forget_cookie, session_cookie, unauthorized, unauthorized_because};

/// Works out who is calling from the request's head alone, before its body is read: a
/// caller it does not authenticate is answered (401) without the body ever being read.
/// Basic credentials (+ on-behalf-of), when present, are always verified (wrong ones are
/// 401, whatever the cookie); the cookie then counts only if it names a session of that
/// agent. Over HTTPS a client certificate that maps to an agent logs in as that agent
/// without a password; with Basic credentials as well, both must name the same agent.
/// Without either, the session cookie alone is the credential: a server-issued token of
/// one agent, valid while the session lives (and the agent exists) — looked up here, and
/// checked again when the session is loaded. A SAML assertion in `AQ-SAML-Assertion`
/// (`saml`) is checked first, and excludes the others.
///
/// `Ok(None)`: the head carries no credentials and SAML login is on, so a `wsse:Security`
/// token in the body may log the request in (`saml::login_by_body`). Such a body is read
/// before anyone is authenticated, bounded by `--max-body`, `--http-body-timeout` and the
/// connection caps.
pub(super) async fn authenticate(
    s: &AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
    peer: Option<std::net::IpAddr>,
) -> Result<Option<Who>, Response> {
    if let Some(who) = saml::login_by_header(s, headers, tls).await {
        return who.map(Some);
    }
    let basic = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(auth::parse_basic);
    let on_behalf = headers.get(ON_BEHALF_HEADER).and_then(|v| v.to_str().ok()).map(str::trim).map(String::from);
    let by_cert = match tls {
        Some(t) => t.agent(&s.engine).await,
        None => None,
    };
    let agent = match (basic, by_cert) {
        (Some((user, password)), by_cert) => {
            let agent = basic_login(s, &user, &password, peer).await?;
            if let Some(Ok(c)) = by_cert
                && c != agent.name
            {
                return Err(unauthorized_because(&format!(
                    "the client certificate logs in as {c}, the credentials as {}",
                    agent.name
                )));
            }
            agent
        }
        (None, Some(Ok(name))) => s.engine.agent(&name).ok_or_else(unauthorized)?,
        (None, Some(Err(reason))) => {
            tracing::info!(%reason, "client certificate refused");
            return Err(unauthorized_because(&reason));
        }
        (None, None) if s.saml.is_some() => return Ok(None),
        (None, None) => {
            let id = session_cookie(headers).filter(|_| on_behalf.is_none()).ok_or_else(unauthorized)?;
            cookie_names_a_session(s, &id).await?;
            return Ok(Some(Who::Cookie(id)));
        }
    };
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
    Ok(Some(Who::Agent { agent: effective, cookie: session_cookie(headers), soap_token: false, saml: None }))
}

/// A cookie that names no session is answered 401 (and cleared) before the body is read:
/// this process's copy of the session it names, else the store's row (live or ended: the
/// request says which when it runs).
async fn cookie_names_a_session(s: &AppState, id: &str) -> Result<(), Response> {
    let hash = aqgate_core::engine::session::id_hash(id);
    if s.engine.sessions.last_written(&hash).is_some_and(|row| s.engine.agent(&row.agent).is_some()) {
        return Ok(());
    }
    match s.engine.resume(id).await {
        Ok(Resumed::Live(_) | Resumed::Ended { .. }) => Ok(()),
        Ok(Resumed::Unknown) => Err(forget_cookie(unauthorized(), s.secure_cookie)),
        Err(e) => Err(fault(&e, None)),
    }
}

/// The caller, once the head has named none and the body is read: a `wsse:Security` token
/// of the body, else the session cookie alone (see [`authenticate`]).
pub(super) async fn authenticate_by_body(
    s: &AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
    body: &Bytes,
    head: Option<Who>,
) -> Result<Who, Response> {
    let by_saml_header = matches!(head, Some(Who::Agent { saml: Some(_), .. }));
    if let Some(who) = saml::login_by_body(s, headers, tls, body, by_saml_header).await {
        return who;
    }
    match head {
        Some(who) => Ok(who),
        None => session_cookie(headers)
            .filter(|_| !headers.contains_key(ON_BEHALF_HEADER))
            .map(Who::Cookie)
            .ok_or_else(unauthorized),
    }
}

/// The agent whose Basic credentials these are (401 otherwise). Credentials verified
/// recently pass at once; others wait for a turn of the bounded password checks, unless
/// the client or the agent is barred after repeated failures (see [`password`]).
pub(super) async fn basic_login(
    s: &AppState,
    user: &str,
    password: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<AgentInfo, Response> {
    let agent = s.engine.agent(user).filter(|a| a.password_hash.is_some());
    if let Some(a) = &agent
        && s.credentials.check(&a.name, password)
    {
        return Ok(a.clone());
    }
    let name = agent.as_ref().map(|a| a.name.clone());
    let caller = password::Caller { ip: peer, agent: name.as_deref() };
    let turn = match s.passwords.turn(caller).await {
        Ok(t) => t,
        Err(password::Refusal::Barred(wait)) => {
            // Answered after a pause (a quarter of the bar left, at most 250 ms): a client
            // that ignores Retry-After and asks again at once gets a few answers a second
            // per connection, instead of spending the runtime's time on tens of thousands
            // (the connection caps bound the pauses).
            tokio::time::sleep((wait / 4).min(password::BARRED_PAUSE)).await;
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
                "too many failed logins: wait before trying again\n",
            )
                .into_response());
        }
        Err(password::Refusal::Busy) => {
            return Err((StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], "password checks are busy\n")
                .into_response());
        }
    };
    let Some(agent) = agent else {
        s.passwords.failed(caller);
        return Err(unauthorized());
    };
    let (p, hash) = (password.to_string(), agent.password_hash.clone().unwrap_or_default());
    let ok = tokio::task::spawn_blocking(move || auth::verify_password(&p, &hash)).await.unwrap_or(false);
    drop(turn);
    s.passwords.checked();
    if !ok {
        s.passwords.failed(caller);
        return Err(unauthorized());
    }
    s.passwords.succeeded(caller);
    s.credentials.remember(&agent.name, password);
    Ok(agent)
}

/// Reads and drops what of a refused request's body arrives at once (at most 64 KiB within
/// 100 ms), so that a client that sent a small body with its head reads the answer rather
/// than a reset (HTTP/1.1) or a cancelled stream (HTTP/2). A large or unsent body is not
/// waited for, and one announced with `Expect: 100-continue` is not asked for.
pub(super) async fn discard_arrived(headers: &HeaderMap, mut body: axum::body::Body) {
    use http_body_util::BodyExt;
    if headers.get(header::EXPECT).is_some() {
        return;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(100);
    let mut seen = 0;
    while seen < 64 * 1024 {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => seen += f.data_ref().map_or(0, Bytes::len),
            _ => break,
        }
    }
}

/// The request body, read only once the caller is known: at most `--max-body` bytes (413)
/// within `--http-body-timeout` (408). Both close the connection and say so: the rest of the
/// body is never read, so a client must not send its next request on that connection.
pub(super) async fn read_body(s: &AppState, headers: &HeaderMap, body: axum::body::Body) -> Result<Bytes, Response> {
    let max = s.limits.max_bytes;
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            [(header::CONNECTION, "close")],
            format!("the request body is over {max} bytes\n"),
        )
            .into_response()
    };
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX)) {
        return Err(too_large());
    }
    match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e).is_some_and(|c| c.is::<http_body_util::LengthLimitError>());
            if over {
                Err(too_large())
            } else {
                Err((StatusCode::BAD_REQUEST, "the request body could not be read\n").into_response())
            }
        }
        Err(_) => {
            s.edge.body_timeouts.inc();
            Err((
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                "the request body did not arrive within --http-body-timeout\n",
            )
                .into_response())
        }
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
