//! SAML 2.0 login: an assertion signed by the configured IdP authenticates its subject's
//! agent, in the `AQ-SAML-Assertion` header (base64 of the assertion's or the IdP
//! Response's exact XML) or in the IDAP request's own `Header` as
//! `wsse:Security/saml:Assertion`. The request then goes on as a Basic-authenticated one
//! of that agent (sessions, cookies).
//!
//! The checks are `aqgate_saml`'s; here: which form applies, the agent the subject names
//! (enabled for HTTP), and the assertion id to use once through the store (`SamlUse`,
//! when the request runs), so every node of a database refuses a replay. Nothing is
//! recorded for an assertion that is refused, nor for a request refused before it runs.

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use axum::response::Response;

use aqgate_proto::names::{ON_BEHALF_HEADER, SAML_ASSERTION_HEADER};
use aqgate_saml::Form;

use super::{AppState, SamlUse, TlsConnection, Who, session_cookie};

/// What verifies the assertions.
pub type SamlVerifier = aqgate_saml::Verifier;

use super::saml_refused as refused;

/// `None` when the request does not log in with an `AQ-SAML-Assertion` header; else who
/// it is, or the refusal. A client certificate on the connection that logs in as another
/// agent is a refusal too (as with Basic).
pub(super) async fn login_by_header(
    s: &AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
) -> Option<Result<Who, Response>> {
    if !headers.contains_key(SAML_ASSERTION_HEADER) {
        return None;
    }
    Some(login_with(s, headers, tls, &Bytes::new(), Form::Standalone).await)
}

/// The same for a token in the body's IDAP `Header` (`wsse:Security`), once the body is
/// read; `by_header`: the request logged in with `AQ-SAML-Assertion` already, and a token
/// in the body too is refused (a request logs in with one).
pub(super) async fn login_by_body(
    s: &AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
    body: &Bytes,
    by_header: bool,
) -> Option<Result<Who, Response>> {
    // Parsing the request for its header is the blocking pool's work; only a request that
    // names WS-Security's namespace at all is parsed. One the strict parser refuses is
    // refused with its reason: whatever token it carries is not ignored.
    let in_soap = if s.saml.is_some() && mentions(body, aqgate_saml::WSSE_NS) {
        let b = body.clone();
        match tokio::task::spawn_blocking(move || aqgate_saml::has_security_header(&b)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Some(Err(refused(e.to_string()))),
            Err(_) => return Some(Err(refused("the request could not be read for a SAML token"))),
        }
    } else {
        false
    };
    match (by_header, in_soap) {
        (true, true) => Some(Err(refused(
            "the request carries SAML assertions both in AQ-SAML-Assertion and in its IDAP Header \
             (wsse:Security); a request logs in with one",
        ))),
        (false, true) => Some(login_with(s, headers, tls, body, Form::SoapHeader).await),
        (_, false) => None,
    }
}

fn mentions(body: &[u8], what: &str) -> bool {
    memchr::memmem::find(body, what.as_bytes()).is_some()
}

async fn login_with(
    s: &AppState,
    headers: &HeaderMap,
    tls: Option<&TlsConnection>,
    body: &Bytes,
    form: Form,
) -> Result<Who, Response> {
    let Some(verifier) = s.saml.clone() else {
        return Err(refused("SAML login is not configured on this server (--saml-idp-metadata)"));
    };
    if headers.contains_key(header::AUTHORIZATION) {
        return Err(refused("a request authenticates with either a SAML assertion or Authorization, not both"));
    }
    if headers.contains_key(ON_BEHALF_HEADER) {
        return Err(refused("a SAML-authenticated agent cannot act on behalf of another agent"));
    }
    let xml: Bytes = match form {
        Form::Standalone => {
            let mut values = headers.get_all(SAML_ASSERTION_HEADER).iter();
            let (Some(v), None) = (values.next(), values.next()) else {
                return Err(refused("AQ-SAML-Assertion is given more than once"));
            };
            if v.len() > aqgate_saml::MAX_BYTES * 4 / 3 + 4 {
                return Err(refused("AQ-SAML-Assertion is too large"));
            }
            use base64::Engine as _;
            let text: Vec<u8> = v.as_bytes().iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
            match base64::engine::general_purpose::STANDARD.decode(text) {
                Ok(x) => Bytes::from(x),
                Err(_) => return Err(refused("AQ-SAML-Assertion is not base64")),
            }
        }
        Form::SoapHeader => body.clone(),
    };
    let now_us = s.engine.now();
    let now = chrono::DateTime::from_timestamp_micros(now_us).unwrap_or_default();
    let v = verifier.clone();
    let verified = tokio::task::spawn_blocking(move || v.verify(&xml, form, now))
        .await
        .map_err(|_| refused("the assertion could not be checked"))?
        .map_err(|e| refused(e.to_string()))?;
    let Some(agent) = s.engine.agent(&verified.subject) else {
        return Err(refused(format!("SAML assertion refused: {:?} names no agent", verified.subject)));
    };
    if !agent.http {
        return Err(refused(format!("agent {} is not enabled for HTTP access", agent.name)));
    }
    if let Some(t) = tls
        && let Some(Ok(by_cert)) = t.agent(&s.engine).await
        && by_cert != agent.name
    {
        return Err(refused(format!(
            "the client certificate logs in as {by_cert}, the SAML assertion as {}",
            agent.name
        )));
    }
    // Used only when the request runs (`SamlUse::once`): an assertion refused for any
    // reason above, or a request refused before it runs, leaves it unused.
    let saml = SamlUse {
        issuer: verified.issuer,
        assertion_id: verified.assertion_id,
        agent: agent.name.clone(),
        until: verified.remember_until.timestamp_micros(),
    };
    Ok(Who::Agent {
        agent: agent.name,
        cookie: session_cookie(headers),
        soap_token: form == Form::SoapHeader,
        saml: Some(saml),
    })
}
