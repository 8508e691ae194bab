//! aqgate in a real browser (headless Chromium under ChromeDriver, `tests/common/browser.rs`),
//! and the tests of that harness itself.
//!
//! A browser test starts `aqgate serve` (`common::gateway::serve`), then
//! `common::browser::Browser::start()`, and goes through pages with `Browser::visit(url)`,
//! which fails on any console error or CSP violation and returns the page's text
//! (`Browser::goto`, `console_errors`, `csp_violations`, `assert_clean` and `screenshot` for
//! finer steps; `Browser::client()` for clicks and forms).
//!
//! The harness's own tests serve tiny pages from a throwaway HTTP server: an inline script
//! under a CSP that forbids it must be reported as a violation (and must not run), a
//! `console.error` must be reported as a console error, and a page with neither must report
//! nothing; so a harness that stopped seeing either would fail here.

mod common;

use axum::Router;
use axum::http::header::{CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::routing::get;
use common::browser::{Browser, screenshot_dir};
use common::gateway::serve;
use common::*;

/// The CSP of the harness's test pages: scripts from the page's origin only.
const CSP: &str = "default-src 'self'; script-src 'self'";

fn page(body: &'static str) -> ([(axum::http::HeaderName, &'static str); 2], &'static str) {
    ([(CONTENT_SECURITY_POLICY, CSP), (CONTENT_TYPE, "text/html; charset=utf-8")], body)
}

fn script(body: &'static str) -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    ([(CONTENT_TYPE, "text/javascript")], body)
}

/// A throwaway server of the harness's test pages on 127.0.0.1; returns its base URL.
async fn test_pages() -> String {
    let app = Router::new()
        .route("/favicon.ico", get(|| async { axum::http::StatusCode::NO_CONTENT }))
        .route(
            "/clean",
            get(|| async {
                page("<!doctype html><title>clean</title><p>quiet</p><script src=\"/quiet.js\"></script>")
            }),
        )
        .route("/quiet.js", get(|| async { script("document.body.dataset.ran = 'yes';") }))
        .route(
            "/inline",
            get(|| async {
                page("<!doctype html><title>inline</title><script>document.title = 'inline ran';</script><p>x</p>")
            }),
        )
        .route(
            "/console",
            get(|| async { page("<!doctype html><title>console</title><script src=\"/error.js\"></script>") }),
        )
        .route("/error.js", get(|| async { script("console.error('harness probe: an error');") }))
        .route("/throws.js", get(|| async { script("throw new Error('harness probe: uncaught');") }))
        .route(
            "/throws",
            get(|| async { page("<!doctype html><title>throws</title><script src=\"/throws.js\"></script>") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the test pages");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve the test pages") });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_harness_reports_csp_violations_and_console_errors() {
    let base = test_pages().await;
    let b = Browser::start().await;

    // Nothing to report: the harness does not cry wolf, and the page's script did run.
    let text = b.visit(&format!("{base}/clean")).await;
    assert!(text.contains("quiet"), "{text}");
    let ran = b.client().execute("return document.body.dataset.ran;", vec![]).await.expect("execute");
    assert_eq!(ran, "yes", "the page's own script ran");

    // An inline script under a CSP without 'unsafe-inline': refused, and reported.
    b.goto(&format!("{base}/inline")).await;
    let violations = b.csp_violations().await;
    assert!(
        violations.iter().any(|v| v.starts_with("script-src") && v.contains("inline")),
        "the refused inline script is a violation: {violations:?}"
    );
    let title = b.client().title().await.expect("title");
    assert_eq!(title, "inline", "the inline script must not have run");
    let errors = b.console_errors().await;
    assert!(
        errors.iter().any(|e| e.contains("Content Security Policy")),
        "Chromium says so on its console: {errors:?}"
    );

    // console.error: reported, and only once (the log hands each entry out once).
    b.goto(&format!("{base}/console")).await;
    let errors = b.console_errors().await;
    assert!(errors.iter().any(|e| e.contains("harness probe: an error")), "{errors:?}");
    assert!(b.csp_violations().await.is_empty(), "a new page starts with no violations");
    assert!(b.console_errors().await.is_empty(), "each entry is handed out once");

    // An uncaught exception is a console error too.
    b.goto(&format!("{base}/throws")).await;
    let errors = b.console_errors().await;
    assert!(errors.iter().any(|e| e.contains("harness probe: uncaught")), "{errors:?}");

    // And `visit`, the check the console's tests use, fails on such a page.
    let inline = format!("{base}/inline");
    let b = std::sync::Arc::new(b);
    let b2 = b.clone();
    let failed = tokio::spawn(async move { b2.visit(&inline).await }).await;
    assert!(failed.is_err(), "visit must fail on a page with a CSP violation");
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_and_metrics_in_the_browser() {
    let topology = demo_topology_with("browser", "");
    let db = fresh_sqlite_url();
    let port = free_port();
    let _server = serve("browser", &db, port, &topology);
    let b = Browser::start().await;

    let ready = b.visit(&format!("http://127.0.0.1:{port}/readyz")).await;
    assert!(!ready.trim().is_empty(), "readyz says something");

    let metrics = b.visit(&format!("http://127.0.0.1:{port}/metrics")).await;
    assert!(metrics.contains("# TYPE aqgate_http_connections_open gauge"), "/metrics as text: {metrics}");
    assert!(metrics.lines().any(|l| l.starts_with("aqgate_http_connections_open ")), "{metrics}");
    let shot = b.screenshot("metrics").await;
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000, "a PNG in {}", screenshot_dir().display());
    b.close().await;
}
