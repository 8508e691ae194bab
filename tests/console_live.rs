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
use common::console::get_as;
use common::*;
use futures_util::StreamExt;
use tower::ServiceExt;

/// A payload no page may show.
const SECRET: &str = "5EC12E7A5EC12E7A";

/// The demo topology and the agents of every console role.
fn topology() -> String {
    format!("{}{}", aqgate_admin::DEFAULT_TOPOLOGY, common::console::ROLE_AGENTS)
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

async fn call(r: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let a = common::console::call(r, req).await;
    (a.status, a.body)
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

/// The demo topology with 55 more queues, and an operator and a viewer.
fn many_queues() -> String {
    let mut t = format!(
        "{}\n[[agents]]\nname = \"c_viewer\"\npassword = \"pw\"\ndb_users = [\"AQUSER\"]\nconsole = \"viewer\"\n\n[[agents]]\nname = \"c_operator\"\npassword = \"pw\"\ndb_users = [\"AQUSER\"]\nconsole = \"operator\"\n\n[[queues]]\nname = \"AQUSER.RAW_COPY\"\nqueue_table = \"AQUSER.RAW_TAB\"\n\n[[propagations]]\nname = \"copy_job\"\nsource = \"AQUSER.RAW_QUE\"\ndestination = \"AQUSER.RAW_COPY\"\nenabled = false\n",
        aqgate_admin::DEFAULT_TOPOLOGY
    );
    for i in 0..55 {
        t.push_str(&format!("\n[[queues]]\nname = \"AQUSER.MANY_Q{i:02}\"\nqueue_table = \"AQUSER.RAW_TAB\"\n"));
    }
    t
}

/// The queue names of a page's rows, in order (`<tr data-queue=…>` of the overview, the
/// first cell's link text of the queue list).
fn queue_names(body: &str) -> Vec<String> {
    body.split("<tr><td>")
        .skip(1)
        .map(|r| {
            let cell = r.split("</td>").next().unwrap_or_default();
            cell.rsplit_once("\">").map_or(cell, |(_, t)| t).trim_end_matches("</a>").to_string()
        })
        .collect()
}

async fn many_queues_are_paged_by_backlog_and_age(b: Backend) {
    let h = Harness::with_topology(b, &many_queues()).await;
    let state = AppState::new(h.engine.clone(), Limits::default());
    let cfg = aqgate_console::ConsoleConfig { sample_every: Duration::from_millis(10), ..Default::default() };
    let r = app(state.clone()).merge(aqgate_console::router(state, cfg));
    let mut s = h.session("scott");
    let msg = |n: usize| vec![("<correlation>M</correlation>", "AB"); n];
    h.run(&mut s, &raw_send("AQUSER.MANY_Q03", &msg(1), "<AQXmlCommit/>")).await.expect("send");
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.run(&mut s, &raw_send("AQUSER.MANY_Q07", &msg(3), "<AQXmlCommit/>")).await.expect("send");
    let row = row_until(&r, "c_viewer", "AQUSER.MANY_Q07", |row| cells(row).get(6).is_some_and(|d| d == "3")).await;
    assert!(!row.is_empty());

    // The overview: the 50 deepest, by name, and how many more the queue list has.
    let (status, overview) = call(&r, get_as("/console/", Some("c_viewer"))).await;
    assert_eq!(status, StatusCode::OK);
    let shown = overview.matches("<tr data-queue=").count();
    assert_eq!(shown, 50, "{overview}");
    let (_, by_name) = call(&r, get_as("/console/queues?limit=500", Some("c_viewer"))).await;
    let all = queue_names(&by_name).len();
    assert!(all > 60, "the viewer sees the 55 more: {by_name}");
    assert!(overview.contains(&format!("{} more in the", all - 50)), "{overview}");
    for deep in ["AQUSER.MANY_Q03", "AQUSER.MANY_Q07"] {
        assert!(overview.contains(&format!("data-queue=\"{deep}\"")), "{deep} is among the deepest");
    }

    // The queue list by age: the oldest ready message's queue first, pages without overlap.
    let (_, page1) = call(&r, get_as("/console/queues?sort=age&limit=1", Some("c_viewer"))).await;
    assert_eq!(queue_names(&page1), ["AQUSER.MANY_Q03"], "{page1}");
    let next = page1.split("<a href=\"").find(|l| l.contains("rel=\"next\"")).expect("a next page");
    let next = next.split('"').next().unwrap_or_default().replace("&#38;", "&").replace("&amp;", "&");
    let next = next.strip_prefix("/console/queues?").expect("the queue list");
    let (_, page2) = call(&r, get_as(&format!("/console/queues?{next}"), Some("c_viewer"))).await;
    assert_eq!(queue_names(&page2), ["AQUSER.MANY_Q07"], "{page2}");
    // By backlog: the deepest first.
    let (_, by_backlog) = call(&r, get_as("/console/queues?sort=backlog&limit=2", Some("c_viewer"))).await;
    assert_eq!(queue_names(&by_backlog), ["AQUSER.MANY_Q07", "AQUSER.MANY_Q03"], "{by_backlog}");
    let (_, by_name) = call(&r, get_as("/console/queues?limit=20", Some("c_viewer"))).await;
    assert_eq!(queue_names(&by_name).len(), 20, "a page of 20 by name");
}

#[tokio::test]
async fn many_queues_are_paged_by_backlog_and_age_sqlite() {
    many_queues_are_paged_by_backlog_and_age(Backend::Sqlite).await;
}

#[tokio::test]
async fn many_queues_are_paged_by_backlog_and_age_postgres() {
    many_queues_are_paged_by_backlog_and_age(Backend::Postgres).await;
}

/// A job's reset from the console: an operator's, refused to a viewer; a job that never ran
/// has nothing to reset (400).
#[tokio::test]
async fn a_job_is_reset_by_an_operator_only() {
    let h = Harness::with_topology(Backend::Sqlite, &many_queues()).await;
    let state = AppState::new(h.engine.clone(), Limits::default());
    let r = app(state.clone()).merge(aqgate_console::router(state, aqgate_console::ConsoleConfig::default()));
    let post = |agent: &str| {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{agent}:pw"));
        Request::post("/console/jobs/copy_job/reset")
            .header(header::HOST, "127.0.0.1:8470")
            .header(header::ORIGIN, "http://127.0.0.1:8470")
            .header("sec-fetch-site", "same-origin")
            .header(header::AUTHORIZATION, format!("Basic {basic}"))
            .body(Body::empty())
            .expect("request")
    };
    let (status, _) = call(&r, post("c_viewer")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = call(&r, post("c_operator")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("nothing to reset"), "{body}");
    // Once it has a status (as a running job writes it), the reset ends its lease.
    let now = h.engine.now();
    assert!(h.engine.store().job_lease("COPY_JOB", "test-node", now, now + 60_000_000).await.expect("lease"));
    let (status, _) = call(&r, post("c_operator")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        h.engine.store().job_lease("COPY_JOB", "another-node", now, now + 60_000_000).await.expect("lease"),
        "the lease ended"
    );
    let (_, overview) = call(&r, get_as("/console/", Some("c_operator"))).await;
    assert!(overview.contains("aqgate admin jobs --reset COPY_JOB"), "the reset's command line: {overview}");
}
