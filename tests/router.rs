//! The servlet's router in process, without a socket: requests go to `aqgate_http::servlet::app`
//! through `tower::ServiceExt::oneshot`, over an engine on a fresh SQLite store. Basic
//! credentials, the IDAP answer of an example, a refused DOCTYPE, and the health routes.

mod common;

use aqgate_core::error::code;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{CodecError, Limits, Response};
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use common::*;
use tower::ServiceExt;

/// The router over a fresh engine (SQLite, the demo topology), and that engine's harness.
async fn router() -> (axum::Router, Harness) {
    let h = Harness::new(Backend::Sqlite).await;
    (app(AppState::new(h.engine.clone(), Limits::default())), h)
}

/// `POST /aqserv` of `body` as text/xml, with Basic `credentials` if given.
fn post(body: &str, credentials: Option<(&str, &str)>) -> Request<Body> {
    let mut b = Request::post("/aqserv").header(header::CONTENT_TYPE, "text/xml");
    if let Some((agent, password)) = credentials {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{agent}:{password}"));
        b = b.header(header::AUTHORIZATION, format!("Basic {token}"));
    }
    b.body(Body::from(body.to_string())).expect("request")
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

/// One request through the router: status, headers and body.
async fn call(router: &axum::Router, req: Request<Body>) -> Answer {
    let r = router.clone().oneshot(req).await.expect("the router answers");
    let (parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    Answer { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&bytes).to_string() }
}

async fn depth_total(h: &Harness) -> i64 {
    aqgate_admin::queues(h.engine.store().as_ref()).await.expect("queues").iter().map(|q| q.depth).sum()
}

#[tokio::test]
async fn example_01_with_basic_credentials_answers_a_send_response() {
    let (router, h) = router().await;
    let a = call(&router, post(&example("01"), Some(SCOTT))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let ct = a.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(ct.starts_with("text/xml"), "{ct}");
    assert!(a.body.contains("AQXmlSendResponse"), "{}", a.body);
    match parse_idap(a.body.as_bytes()) {
        Response::Send(_, Some(res)) => {
            assert_eq!(res.destination, "QS.NEW_ORDERS_QUE");
            assert_eq!(res.message_ids.len(), 1, "{res:?}");
        }
        other => panic!("not a send result: {other:?}"),
    }
    // Example 01 leaves its send open: the answer carries the session's cookie.
    let cookie = a.headers.get(header::SET_COOKIE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(cookie.starts_with("AQSESSIONID=") && cookie.len() > "AQSESSIONID=".len(), "{cookie}");
    assert_eq!(depth_total(&h).await, 0, "not committed yet");
}

#[tokio::test]
async fn no_or_wrong_credentials_answer_401_with_a_challenge() {
    let (router, h) = router().await;
    for credentials in [None, Some(("scott", "wrong")), Some(("nobody", "tiger"))] {
        let a = call(&router, post(&example("01"), credentials)).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{credentials:?}");
        let challenge = a.headers.get(header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(challenge.starts_with("Basic "), "{credentials:?}: {challenge:?}");
        assert!(a.body.is_empty(), "no XML body: {}", a.body);
        assert!(a.headers.get(header::SET_COOKIE).is_none(), "no session for {credentials:?}");
    }
    assert_eq!(depth_total(&h).await, 0);
}

#[tokio::test]
async fn a_doctype_answers_an_idap_fault_and_enqueues_nothing() {
    let (router, h) = router().await;
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let with_doctype = send.replacen("<Envelope", "<!DOCTYPE Envelope [<!ENTITY x \"y\">]><Envelope", 1);
    assert_ne!(with_doctype, send, "example 01 has an Envelope");
    let a = call(&router, post(&with_doctype, Some(SCOTT))).await;
    assert_eq!(a.status, StatusCode::OK, "an IDAP fault, not a transport error: {}", a.body);
    match parse_idap(a.body.as_bytes()) {
        Response::Fault(f) => assert_eq!(f.code, CodecError::DOCTYPE, "{f:?}"),
        other => panic!("expected a fault, got {other:?}"),
    }
    assert_eq!(depth_total(&h).await, 0, "nothing enqueued");
    // The same request without the DOCTYPE goes through.
    let a = call(&router, post(&send, Some(SCOTT))).await;
    assert!(matches!(parse_idap(a.body.as_bytes()), Response::Send(..)), "{}", a.body);
    assert_eq!(depth_total(&h).await, 1);
}

#[tokio::test]
async fn health_and_readiness_answer_200_and_other_paths_404() {
    let (router, _h) = router().await;
    let get = |path: &str| Request::get(path).body(Body::empty()).expect("request");
    let a = call(&router, get("/healthz")).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ok\n"));
    let a = call(&router, get("/readyz")).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "ready\n"));
    assert_eq!(call(&router, get("/nothing-here")).await.status, StatusCode::NOT_FOUND);
    // IDAP is POST only.
    assert_eq!(call(&router, get("/aqserv")).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_receive_without_a_message_is_a_fault_not_an_error_status() {
    let (router, _h) = router().await;
    let a = call(&router, post(&receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT), Some(SCOTT))).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        matches!(parse_idap(a.body.as_bytes()), Response::Fault(ref f) if f.code == code::NO_MESSAGE),
        "{}",
        a.body
    );
}

/// What a server without SAML login says to a request that claims an identity with a SAML
/// token: in a build without the `saml` feature, that it is missing; with it, that SAML is
/// not configured.
fn saml_off_reason() -> &'static str {
    if cfg!(feature = "saml") {
        "SAML login is not configured on this server"
    } else {
        aqgate_http::SAML_FEATURE_MISSING
    }
}

#[tokio::test]
async fn a_saml_token_on_a_server_without_saml_is_refused_not_ignored() {
    let (router, h) = router().await;
    // The header form, alone and beside valid Basic credentials: 401, the reason in a Fault.
    for credentials in [None, Some(SCOTT)] {
        let mut req = post(&example("01"), credentials);
        req.headers_mut().insert("aq-saml-assertion", "PHNhbWw6QXNzZXJ0aW9uLz4=".parse().expect("value"));
        let a = call(&router, req).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{credentials:?}: {}", a.body);
        match parse_idap(a.body.as_bytes()) {
            Response::Fault(f) => assert!(f.message.contains(saml_off_reason()), "{f:?}"),
            other => panic!("expected a fault, got {other:?}"),
        }
    }
    // The IDAP-header form (wsse:Security), however its namespace is declared.
    let token = "<saml:Assertion xmlns:saml=\"urn:oasis:names:tc:SAML:2.0:assertion\" ID=\"_x\"/>";
    let ns = aqgate_proto::names::WSSE_NS;
    for security in [
        format!("<wsse:Security xmlns:wsse=\"{ns}\">{token}</wsse:Security>"),
        format!("<Security xmlns=\"{ns}\">{token}</Security>"),
    ] {
        let body = example("01").replacen("<Body>", &format!("<Header>{security}</Header><Body>"), 1);
        assert!(body.contains("<Header>"), "example 01 has a <Body>");
        let a = call(&router, post(&body, Some(SCOTT))).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{security}: {}", a.body);
        assert!(a.body.contains(saml_off_reason()), "{}", a.body);
    }
    assert_eq!(depth_total(&h).await, 0, "nothing was performed");
    assert_eq!(h.engine.stored_sessions(), 0, "no session was opened");
}
