//! SAML login in a build without the `saml` feature: there is none, and a request that
//! claims an identity with an `AQ-SAML-Assertion` header is refused with a 401 that says
//! so, never served as if the header were not there. (An IDAP `wsse:Security` header entry
//! is refused by the servlet after parsing, in every build: see `idap_post`.)

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;

use aqgate_proto::names::SAML_ASSERTION_HEADER;

use super::{AppState, TlsConnection, Who};

/// Never made: this build verifies no assertion.
#[derive(Debug)]
pub enum SamlVerifier {}

/// `None` without an `AQ-SAML-Assertion` header; with one, the refusal.
pub(super) async fn login_by_header(
    _s: &AppState,
    headers: &HeaderMap,
    _tls: Option<&TlsConnection>,
) -> Option<Result<Who, Response>> {
    if headers.contains_key(SAML_ASSERTION_HEADER) {
        Some(Err(super::saml_refused(crate::SAML_FEATURE_MISSING)))
    } else {
        None
    }
}

/// Always `None`: a `wsse:Security` token is refused after parsing.
pub(super) async fn login_by_body(
    _s: &AppState,
    _headers: &HeaderMap,
    _tls: Option<&TlsConnection>,
    _body: &Bytes,
    _by_header: bool,
) -> Option<Result<Who, Response>> {
    None
}
