//! The console's live overview in a real browser (headless Chromium, `tests/common/browser.rs`)
//! against a real `aqgate serve`: logged in through the form, the overview open, one
//! message enqueued over IDAP HTTP; the queue's depth on the page must change within 3 s
//! without a reload (the script's EventSource and fragment fetch), with no console error
//! and no CSP violation.

mod common;

use std::time::{Duration, Instant};

use common::browser::Browser;
use common::gateway::serve;
use common::*;
use fantoccini::Locator;

const VIEWER: &str = r#"
[[agents]]
name = "live_viewer"
password = "pw"
db_users = ["AQUSER"]
console = "viewer"
"#;

/// The depth the overview shows for `queue` (`None`: no such row).
async fn depth(b: &Browser, queue: &str) -> Option<i64> {
    let js = format!(
        "var r = document.querySelector('tr[data-queue=\"{queue}\"] td.depth'); return r ? r.textContent : null;"
    );
    let v = b.client().execute(&js, vec![]).await.expect("read the depth");
    v.as_str().and_then(|s| s.trim().parse().ok())
}

async fn attribute(b: &Browser, js: &str) -> String {
    let v = b.client().execute(js, vec![]).await.expect("execute");
    v.as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_overview_follows_an_enqueue_without_a_reload() {
    let topology = demo_topology_with("console-live", VIEWER);
    let db = fresh_sqlite_url();
    let port = free_port();
    let _server = serve("console live", &db, port, &topology);
    let base = format!("http://127.0.0.1:{port}");
    let b = Browser::start().await;

    b.visit(&format!("{base}/console/login")).await;
    let form = b.client().form(Locator::Css("form.login")).await.expect("the login form");
    form.set_by_name("agent", "live_viewer").await.expect("agent");
    form.set_by_name("password", "pw").await.expect("password");
    form.submit().await.expect("log in");
    let on_by = Instant::now() + Duration::from_secs(10);
    loop {
        let url = b.client().current_url().await.expect("url");
        if url.path() == "/console/" {
            break;
        }
        assert!(Instant::now() < on_by, "logged in, on the overview: {url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.assert_clean("the overview").await;

    let before = depth(&b, "AQUSER.RAW_QUE").await.expect("the queue's row");
    // The stream is open before the enqueue (a reopened stream fetches every fragment anyway).
    let open_by = Instant::now() + Duration::from_secs(10);
    while attribute(&b, "return document.querySelector('[data-live-events]').getAttribute('data-live-state');").await
        != "open"
    {
        assert!(Instant::now() < open_by, "the event stream did not open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.client().execute("window.__sameDocument = 'yes';", vec![]).await.expect("mark the document");

    let r = idap(port, "john", "welcome", &raw_send("AQUSER.RAW_QUE", &[("", "0A0B")], "<AQXmlCommit/>")).await;
    assert!(!sent_ids(&r).is_empty(), "enqueued: {r:?}");
    let sent = Instant::now();
    loop {
        if depth(&b, "AQUSER.RAW_QUE").await == Some(before + 1) {
            break;
        }
        assert!(sent.elapsed() < Duration::from_secs(3), "the overview did not show depth {} within 3 s", before + 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attribute(&b, "return window.__sameDocument;").await, "yes", "no reload");
    b.assert_clean("the live overview").await;
    b.close().await;
}
