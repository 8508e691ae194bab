//! What every console answer carries and what every state-changing request must show.
//!
//! - Headers on every answer (pages, assets, refusals, redirects): a strict
//!   Content-Security-Policy (no inline script or style, no framing, forms to this origin
//!   only), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//!   `Cache-Control: no-store`.
//! - A request other than GET, HEAD or OPTIONS is refused (403) unless the browser says it
//!   comes from the console's own origin: `Sec-Fetch-Site: same-origin`, else an `Origin`
//!   whose host and port are the request's `Host`. A request with neither header is no
//!   browser's (every browser the console supports sends them on a POST), and passes: a
//!   cross-site page cannot make a browser leave them out.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                              connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The console's middleware (see the module's documentation).
pub(crate) async fn guard(req: Request, next: Next) -> Response {
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let mut r = if safe || same_origin(req.headers()) {
        next.run(req).await
    } else {
        (StatusCode::FORBIDDEN, "cross-origin request refused\n").into_response()
    };
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

/// Whether a state-changing request comes from the console's own origin (see the
/// module's documentation).
fn same_origin(h: &HeaderMap) -> bool {
    let get = |n: &str| h.get(n).map(|v| v.to_str().unwrap_or("\u{0}"));
    if let Some(site) = get("sec-fetch-site") {
        return site.eq_ignore_ascii_case("same-origin");
    }
    match (get("origin"), get("host")) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            let authority = origin.split_once("://").map(|(_, a)| a);
            authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
        }
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn same_origin_is_told_by_fetch_metadata_then_origin() {
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin"), ("origin", "http://evil.example")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "none")])));
        assert!(same_origin(&headers(&[("origin", "http://127.0.0.1:8080"), ("host", "127.0.0.1:8080")])));
        assert!(!same_origin(&headers(&[("origin", "http://127.0.0.1:9090"), ("host", "127.0.0.1:8080")])));
        assert!(!same_origin(&headers(&[("origin", "null"), ("host", "127.0.0.1:8080")])));
        assert!(!same_origin(&headers(&[("origin", "http://127.0.0.1:8080")])));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])), "no browser");
    }
}
