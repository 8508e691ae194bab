//! The console's live overview in process, through `tower::ServiceExt::oneshot` on the
//! router the binary serves, over an engine on a fresh store (SQLite and PostgreSQL): the
//! store's grouped figures by state, the sampler's figures on the page and its fragments
//! (role-checked, the caller's queues only, no payload), the event stream that says an
//! enqueue changed the queues, its cap (503), and the queue gauges of `/metrics`.

mod common;

use std::time::Duration;

use aqgate_core::store::QueueFigures;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::Limits;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use common::*;
use futures_util::StreamExt;
use tower::ServiceExt;

/// A payload no page may show.
const SECRET: &str = "5EC12E7A5EC12E7A";

fn topology() -> String {
    format!(
        r#"{}
[[agents]]
name = "c_none"
password = "pw"
db_users = ["AQUSER"]

[[agents]]
name = "c_viewer"
password = "pw"
db_users = ["AQUSER"]
console = "viewer"

[[agents]]
name = "c_reader"
password = "pw"
db_users = ["AQUSER"]
console = "reader"

[[agents]]
name = "c_oe"
password = "pw"
db_users = ["OE"]
console = "admin"
"#,
        aqgate_admin::DEFAULT_TOPOLOGY
    )
}

async fn router(b: Backend, max_streams: usize) -> (axum::Router, Harness) {
    let h = Harness::with_topology(b, &topology()).await;
    let state = AppState::new(h.engine.clone(), Limits::default());
    let cfg = aqgate_console::ConsoleConfig {
        sample_every: Duration::from_millis(10), // clamped to a second
        max_streams,
        ..Default::default()
    };
    (app(state.clone()).merge(aqgate_console::router(state, cfg)), h)
}

fn get_as(path: &str, agent: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(a) = agent {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{a}:pw"));
        b = b.header(header::AUTHORIZATION, format!("Basic {basic}"));
    }
    b.body(Body::empty()).expect("request")
}

async fn call(r: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = r.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).to_string())
}

async fn send(h: &Harness, header: &str) {
    let mut s = h.session("scott");
    h.run(&mut s, &raw_send("AQUSER.RAW_QUE", &[(header, SECRET)], "<AQXmlCommit/>")).await.expect("send");
}

/// The fragment's row of `queue` (its cells' text), waited for until `want` holds.
async fn row_until(r: &axum::Router, agent: &str, queue: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let (status, body) = call(r, get_as("/console/fragments/queues", Some(agent))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let row = body
            .split("<tr ")
            .find(|l| l.starts_with(&format!("data-queue=\"{queue}\"")))
            .map(|l| l.split("</tr>").next().unwrap_or_default().to_string())
            .unwrap_or_default();
        if want(&row) {
            return row;
        }
        assert!(tokio::time::Instant::now() < deadline, "the row of {queue} never became what was wanted: {row}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cells(row: &str) -> Vec<String> {
    row.split("<td")
        .skip(1)
        .map(|c| c.split('>').nth(1).unwrap_or_default().split('<').next().unwrap_or_default().to_string())
        .collect()
}

async fn the_store_counts_messages_by_state(b: Backend) {
    let h = Harness::with_topology(b, &topology()).await;
    send(&h, "<correlation>R1</correlation>").await;
    send(&h, "<correlation>R2</correlation>").await;
    send(&h, "<correlation>W</correlation><delay>3600</delay>").await;
    send(&h, "<correlation>E</correlation><expiration>1</expiration>").await;
    h.clock.advance_secs(5);
    let store = h.engine.store();
    let id = h.engine.resolved().ids["AQUSER.RAW_QUE"];
    let figures = store.queue_figures(h.engine.now(), 0).await.expect("figures");
    let f: QueueFigures = *figures.iter().find(|f| f.queue == id).expect("the queue's figures");
    assert_eq!((f.ready, f.waiting, f.expired, f.newer), (2, 1, 1, 4), "{f:?}");
    assert_eq!(f.oldest_ready, Some(T0), "{f:?}");
    let after = store.queue_figures(h.engine.now(), f.last_seq).await.expect("figures");
    assert!(after.iter().all(|f| f.newer == 0), "nothing is newer than the last seq: {after:?}");
    assert_eq!(store.spool_backlog().await.expect("spool"), 0);

    let metrics = aqgate_admin::status::metrics(&h.engine).await.expect("metrics");
    for line in [
        "aqgate_queue_messages{queue=\"AQUSER.RAW_QUE\",state=\"ready\"} 2",
        "aqgate_queue_messages{queue=\"AQUSER.RAW_QUE\",state=\"waiting\"} 1",
        "aqgate_queue_messages{queue=\"AQUSER.RAW_QUE\",state=\"expired\"} 1",
        "aqgate_queue_oldest_ready_seconds{queue=\"AQUSER.RAW_QUE\"} 5.000",
        "aqgate_mail_spool_backlog 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}

#[tokio::test]
async fn the_store_counts_messages_by_state_sqlite() {
    the_store_counts_messages_by_state(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_store_counts_messages_by_state_postgres() {
    the_store_counts_messages_by_state(Backend::Postgres).await;
}

async fn a_viewer_gets_the_figures_but_no_payload(b: Backend) {
    let (r, h) = router(b, 10).await;
    send(&h, "<correlation>R1</correlation>").await;
    send(&h, "<correlation>W</correlation><delay>3600</delay>").await;
    let (status, page) = call(&r, get_as("/console/", Some("c_viewer"))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("data-live-events=\"/console/events\""), "{page}");
    assert!(page.contains("<svg class=\"spark\""), "the charts are drawn in the page: {page}");
    assert!(page.contains("href=\"/metrics\""), "{page}");
    assert!(!page.contains(SECRET) && !page.contains("/messages"), "a viewer sees no message: {page}");
    let row = row_until(&r, "c_viewer", "AQUSER.RAW_QUE", |row| !row.is_empty()).await;
    let c = cells(&row);
    assert_eq!(&c[3..7], ["1", "1", "0", "2"], "ready, waiting, expired, depth: {row}");
    assert_eq!(c[7], "0 s", "oldest ready: {row}");

    // One more, after the first sample: counted as enqueued within the hour.
    send(&h, "<correlation>R2</correlation>").await;
    let row = row_until(&r, "c_viewer", "AQUSER.RAW_QUE", |row| cells(row).get(3).is_some_and(|c| c == "2")).await;
    assert!(row.contains("aria-label=\"Enqueued per minute over the last hour, 1 in all"), "{row}");
    let (_, backlog) = call(&r, get_as("/console/fragments/backlog", Some("c_viewer"))).await;
    assert!(backlog.contains("Mail spool backlog"), "{backlog}");

    // A reader is shown the way to the messages; the OE admin not this queue at all.
    let (_, reader) = call(&r, get_as("/console/fragments/queues", Some("c_reader"))).await;
    assert!(reader.contains("href=\"/console/queues/AQUSER.RAW_QUE/messages\""), "{reader}");
    assert!(!reader.contains(SECRET), "{reader}");
    let (_, oe) = call(&r, get_as("/console/fragments/queues", Some("c_oe"))).await;
    assert!(!oe.contains("AQUSER.RAW_QUE") && oe.contains("OE."), "{oe}");
}

#[tokio::test]
async fn a_viewer_gets_the_figures_but_no_payload_sqlite() {
    a_viewer_gets_the_figures_but_no_payload(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_viewer_gets_the_figures_but_no_payload_postgres() {
    a_viewer_gets_the_figures_but_no_payload(Backend::Postgres).await;
}

#[tokio::test]
async fn fragments_and_events_are_role_checked() {
    let (r, _h) = router(Backend::Sqlite, 10).await;
    for path in ["/console/fragments/queues", "/console/fragments/backlog", "/console/events"] {
        let resp = r.clone().oneshot(get_as(path, None)).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{path} without a login");
        let resp = r.clone().oneshot(get_as(path, Some("c_none"))).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{path} without a console role");
        let resp = r.clone().oneshot(get_as(path, Some("c_viewer"))).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::OK, "{path} as a viewer");
        assert!(resp.headers().contains_key(header::CONTENT_SECURITY_POLICY), "{path}");
    }
    let (status, _) = call(&r, get_as("/console/fragments/nothing", Some("c_viewer"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The next SSE text within `within`, or `None`.
async fn next_text(body: &mut axum::body::BodyDataStream, within: Duration) -> Option<String> {
    match tokio::time::timeout(within, body.next()).await {
        Ok(Some(Ok(bytes))) => Some(String::from_utf8_lossy(&bytes).to_string()),
        Ok(Some(Err(e))) => panic!("the stream failed: {e}"),
        Ok(None) => panic!("the stream ended"),
        Err(_) => None,
    }
}

async fn an_enqueue_is_an_event(b: Backend) {
    let (r, h) = router(b, 10).await;
    let resp = r.clone().oneshot(get_as("/console/events", Some("c_viewer"))).await.expect("answer");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = resp.into_body().into_data_stream();
    // Nothing changes: nothing is said.
    assert_eq!(next_text(&mut body, Duration::from_millis(2500)).await, None);
    send(&h, "<correlation>LIVE</correlation>").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut seen = String::new();
    while !seen.contains("event: overview\ndata: queues\n") {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "no event within 5 s: {seen:?}");
        if let Some(t) = next_text(&mut body, left).await {
            seen.push_str(&t);
        }
    }
    assert!(!seen.contains(SECRET), "{seen}");
}

#[tokio::test]
async fn an_enqueue_is_an_event_sqlite() {
    an_enqueue_is_an_event(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_enqueue_is_an_event_postgres() {
    an_enqueue_is_an_event(Backend::Postgres).await;
}

#[tokio::test]
async fn the_streams_past_the_cap_are_refused() {
    let (r, _h) = router(Backend::Sqlite, 2).await;
    let one = r.clone().oneshot(get_as("/console/events", Some("c_viewer"))).await.expect("answer");
    let two = r.clone().oneshot(get_as("/console/events", Some("c_reader"))).await.expect("answer");
    assert_eq!((one.status(), two.status()), (StatusCode::OK, StatusCode::OK));
    let (status, body) = call(&r, get_as("/console/events", Some("c_viewer"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    drop(one);
    let three = r.clone().oneshot(get_as("/console/events", Some("c_viewer"))).await.expect("answer");
    assert_eq!(three.status(), StatusCode::OK, "a closed stream frees its place");
    drop((two, three));
}
