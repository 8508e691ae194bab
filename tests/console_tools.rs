//! The console's tools through `tower::ServiceExt::oneshot` on the router the binary serves,
//! over an engine on a fresh store (SQLite and PostgreSQL where the store is involved): the
//! message listing's keyset pages and its filters (in the store's SQL, SQL-ish input
//! harmless), one message looked up by its id, the condition tester, the publish form, and
//! the topology graph.

mod common;

use aqgate_core::engine::context::format_timestamp;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::Limits;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::console::call;
use common::*;

/// A forwarder's URL that tries to be markup.
const MARKUP_URL: &str = "http://127.0.0.1:9/in?a=1&b=<i>x</i>";

fn topology() -> String {
    format!(
        r#"{}
[[queues]]
name = "AQUSER.RAW_COPY"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "copy_job"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_COPY"

[[queues]]
name = "AQUSER.RAW_SINK"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "sink_job"
source = "AQUSER.RAW_COPY"
destination = "AQUSER.RAW_SINK"
enabled = false

[[propagations]]
name = "forward_job"
source = "AQUSER.RAW_SINK"
forward = {{ url = "{MARKUP_URL}" }}

{}
"#,
        aqgate_admin::DEFAULT_TOPOLOGY,
        common::console::ROLE_AGENTS
    )
}

async fn router(b: Backend) -> (axum::Router, Harness) {
    let h = Harness::with_topology(b, &topology()).await;
    let state = AppState::new(h.engine.clone(), Limits::default());
    let r = app(state.clone()).merge(aqgate_console::router(state, aqgate_console::ConsoleConfig::default()));
    (r, h)
}

fn get_as(path: &str, agent: &str) -> Request<Body> {
    common::console::get_as(path, Some(agent))
}

/// A POST as a same-origin page of the console sends it.
fn post_as(path: &str, agent: &str, form: &str) -> Request<Body> {
    common::console::post_as(path, Some(agent), form)
}

/// `s` percent-encoded for a query or a form (every byte but letters and digits).
fn enc(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Sends RAW messages to `queue` as `agent`, committed; their ids.
async fn send_as(h: &Harness, agent: &str, queue: &str, msgs: &[(&str, &str)]) -> Vec<String> {
    let mut s = h.session(agent);
    let r = h.run(&mut s, &raw_send(queue, msgs, "<AQXmlCommit/>")).await.expect("send");
    sent_ids(&r)
}

/// The message ids of a listing page, in order.
fn listed_ids(page: &str) -> Vec<String> {
    page.split("<tr><td><a href=\"")
        .skip(1)
        .filter_map(|row| {
            let start = row.find("\">")? + 2;
            let end = row.find("</a>")?;
            Some(row[start..end].to_string())
        })
        .collect()
}

/// The `href` of the page's "Next page" link, unescaped.
fn next_link(page: &str) -> Option<String> {
    let end = page.find("\" rel=\"next\"")?;
    let start = page[..end].rfind("href=\"")? + 6;
    Some(page[start..end].replace("&amp;", "&").replace("&#38;", "&"))
}

const MESSAGES: &str = "/console/queues/AQUSER.RAW_QUE/messages";

/// Every page of a listing from `first`, followed by its Next links; the ids in order.
async fn all_pages(r: &axum::Router, first: &str) -> (Vec<String>, usize) {
    let (mut ids, mut pages, mut at) = (Vec::new(), 0, Some(first.to_string()));
    while let Some(url) = at {
        let a = call(r, get_as(&url, "c_reader")).await;
        assert_eq!(a.status, StatusCode::OK, "{url}: {}", a.body);
        ids.extend(listed_ids(&a.body));
        pages += 1;
        assert!(pages < 20, "the pages end");
        at = next_link(&a.body);
    }
    (ids, pages)
}

async fn pages_return_each_message_once_in_order(b: Backend) {
    let (r, h) = router(b).await;
    let payloads: Vec<String> = (0..25).map(|i| format!("{i:04X}")).collect();
    let msgs: Vec<(&str, &str)> = payloads.iter().map(|p| ("", p.as_str())).collect();
    let sent = send_as(&h, "scott", "AQUSER.RAW_QUE", &msgs).await;
    let (ids, pages) = all_pages(&r, &format!("{MESSAGES}?limit=10")).await;
    assert_eq!(ids, sent, "every message once, in dequeue order");
    assert!(pages >= 3, "{pages} pages");
    // The first page holds the first ten alone.
    let first = call(&r, get_as(&format!("{MESSAGES}?limit=10"), "c_reader")).await;
    assert_eq!(listed_ids(&first.body), sent[..10]);
    // A cursor that is none of the listing's is refused, clearly.
    let bad = call(&r, get_as(&format!("{MESSAGES}?after=L.x.1"), "c_reader")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("cursor"), "{}", bad.body);
}

#[tokio::test]
async fn pages_return_each_message_once_in_order_sqlite() {
    pages_return_each_message_once_in_order(Backend::Sqlite).await;
}

#[tokio::test]
async fn pages_return_each_message_once_in_order_postgres() {
    pages_return_each_message_once_in_order(Backend::Postgres).await;
}

async fn filters_narrow_in_the_store(b: Backend) {
    let (r, h) = router(b).await;
    let a = send_as(
        &h,
        "scott",
        "AQUSER.RAW_QUE",
        &[
            ("<correlation>ORDER-1</correlation><priority>1</priority>", "6E6565646C652D6F6E65"),
            ("<correlation>ORDER-2</correlation><priority>5</priority>", "AA"),
        ],
    )
    .await;
    h.clock.advance_secs(3_600);
    let later = send_as(
        &h,
        "c_operator",
        "AQUSER.RAW_QUE",
        &[("<correlation>INVOICE-1</correlation><priority>9</priority>", "BB")],
    )
    .await;
    let all = [a.clone(), later.clone()].concat();
    let list = |q: String| {
        let r = r.clone();
        async move {
            let a = call(&r, get_as(&format!("{MESSAGES}?{q}"), "c_reader")).await;
            assert_eq!(a.status, StatusCode::OK, "{q}: {}", a.body);
            listed_ids(&a.body)
        }
    };
    assert_eq!(list(String::new()).await, all);
    assert_eq!(list("min_priority=5".into()).await, [a[1].clone(), later[0].clone()]);
    assert_eq!(list("max_priority=4".into()).await, [a[0].clone()]);
    assert_eq!(list("min_priority=2&max_priority=6".into()).await, [a[1].clone()]);
    assert_eq!(list("corr=ORDER-2".into()).await, [a[1].clone()]);
    assert_eq!(list("corr=ORDER".into()).await, Vec::<String>::new(), "exact unless a prefix");
    assert_eq!(list("corr=ORDER&corr_prefix=1".into()).await, a);
    assert_eq!(list("sender=c_operator".into()).await, later);
    assert_eq!(list("sender=SCOTT".into()).await, a);
    let mid = format_timestamp(T0 + 1_800_000_000);
    assert_eq!(list(format!("from={}", enc(&mid))).await, later);
    assert_eq!(list(format!("before={}", enc(&mid))).await, a);
    assert_eq!(list("payload=needle".into()).await, [a[0].clone()]);
    assert_eq!(list("state=READY&corr=INVOICE-1".into()).await, later);
    assert_eq!(list("reason=MAX_RETRY_EXCEEDED".into()).await, Vec::<String>::new());
    let page = call(&r, get_as(&format!("{MESSAGES}?payload=x"), "c_reader")).await;
    assert!(page.body.contains("KiB of each payload"), "the page says the search is bounded");
    // SQL-ish input is a value, never SQL: it matches nothing and breaks nothing.
    for evil in ["' OR '1'='1", "x'); DROP TABLE messages; --", "%", "_", "\\", "\" OR 1=1 --", "$1"] {
        for field in ["corr", "sender", "payload"] {
            let got = list(format!("{field}={}&corr_prefix=1", enc(evil))).await;
            assert!(got.is_empty(), "{field}={evil:?} matched {got:?}");
        }
    }
    assert_eq!(list(String::new()).await, all, "the table is still there");
    // Bad input: 400, saying what.
    for (q, says) in [
        ("min_priority=high", "min_priority"),
        ("from=yesterday", "from"),
        ("state=GONE", "state"),
        ("reason=BECAUSE", "reason"),
    ] {
        let a = call(&r, get_as(&format!("{MESSAGES}?{q}"), "c_reader")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{q}");
        assert!(a.body.contains(says), "{q}: {}", a.body);
    }
    let long = "x".repeat(300);
    assert_eq!(call(&r, get_as(&format!("{MESSAGES}?corr={long}"), "c_reader")).await.status, StatusCode::BAD_REQUEST);

    // An exception queue's rows by their reason.
    send_as(&h, "scott", "AQUSER.RAW_QUE", &[("<correlation>EXP</correlation><expiration>1</expiration>", "CC")]).await;
    h.clock.advance_secs(60);
    h.engine.time_manager_round(true).await;
    let exq = "/console/queues/AQUSER.AQ$_RAW_TAB_E/messages";
    let got = call(&r, get_as(&format!("{exq}?reason=TIME_EXPIRATION"), "c_reader")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(listed_ids(&got.body).len(), 1, "{}", got.body);
    let none = call(&r, get_as(&format!("{exq}?reason=PROPAGATION_FAILURE"), "c_reader")).await;
    assert!(listed_ids(&none.body).is_empty());
}

#[tokio::test]
async fn filters_narrow_in_the_store_sqlite() {
    filters_narrow_in_the_store(Backend::Sqlite).await;
}

#[tokio::test]
async fn filters_narrow_in_the_store_postgres() {
    filters_narrow_in_the_store(Backend::Postgres).await;
}

async fn one_message_is_looked_up_by_its_id(b: Backend) {
    let (r, h) = router(b).await;
    let payloads: Vec<String> = (0..30).map(|i| format!("{i:04X}")).collect();
    let msgs: Vec<(&str, &str)> = payloads.iter().map(|p| ("", p.as_str())).collect();
    let ids = send_as(&h, "scott", "AQUSER.RAW_QUE", &msgs).await;
    // The last one is on no first page, in no state chosen: found all the same.
    let first = call(&r, get_as(&format!("{MESSAGES}?limit=5"), "c_reader")).await;
    assert!(!first.body.contains(&ids[29]));
    let page = call(&r, get_as(&format!("{MESSAGES}/{}?state=WAIT", ids[29]), "c_reader")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<pre>001D</pre>"), "{}", page.body);
    // And through the store directly: one message's rows alone.
    let filter = aqgate_core::store::ViewFilter {
        msgid: Some(hex::decode(&ids[29]).expect("hex").try_into().expect("16 bytes")),
        ..Default::default()
    };
    let (rows, next, _) = aqgate_admin::messages::page(h.engine.store().as_ref(), "AQUSER.RAW_QUE", &filter, None, 1)
        .await
        .expect("lookup");
    assert_eq!(rows.len(), 1);
    assert!(next.is_none());
    assert!(rows[0].iter().any(|(c, v)| *c == "msg_id" && v.as_deref() == Some(ids[29].as_str())));
    let missing = call(&r, get_as(&format!("{MESSAGES}/{}", "00".repeat(16)), "c_reader")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn one_message_is_looked_up_by_its_id_sqlite() {
    one_message_is_looked_up_by_its_id(Backend::Sqlite).await;
}

#[tokio::test]
async fn one_message_is_looked_up_by_its_id_postgres() {
    one_message_is_looked_up_by_its_id(Backend::Postgres).await;
}

fn outcomes(page: &str) -> Vec<String> {
    page.split("<tr class=\"verdict\">")
        .skip(1)
        .map(|row| {
            let cells: Vec<&str> = row.split("<td>").collect();
            cells.get(3).map(|c| c.split("</td>").next().unwrap_or_default().to_string()).unwrap_or_default()
        })
        .collect()
}

async fn the_tester_judges_with_the_engines_evaluator(b: Backend) {
    let (r, h) = router(b).await;
    send_as(
        &h,
        "scott",
        "AQUSER.RAW_QUE",
        &[
            ("<correlation>A</correlation><priority>1</priority>", "01"),
            ("<correlation>B</correlation><priority>7</priority>", "02"),
        ],
    )
    .await;
    let tester = "/console/queues/AQUSER.RAW_QUE/tester";
    let before =
        aqgate_admin::messages::messages(h.engine.store().as_ref(), "AQUSER.RAW_QUE", None, 100).await.expect("rows");
    let a = call(&r, get_as(&format!("{tester}?condition={}", enc("priority > 5")), "c_reader")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(outcomes(&a.body), ["no match", "match"], "{}", a.body);
    assert!(a.body.contains("aqgate admin test-condition AQUSER.RAW_QUE &#39;priority &#62; 5&#39;"), "{}", a.body);
    // Its CLI twin gives the same verdicts, as JSON and as a table.
    let twin = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_aqgate"))
            .args(["admin", "test-condition"])
            .args(args)
            .args(["--database", &h.url])
            .env_remove("AQGATE_CONFIG")
            .output()
            .expect("run admin test-condition")
    };
    let out = twin(&["AQUSER.RAW_QUE", "priority > 5", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let verdicts: Vec<&str> =
        report["verdicts"].as_array().expect("verdicts").iter().filter_map(|v| v["outcome"].as_str()).collect();
    assert_eq!(verdicts, ["no_match", "match"], "{report}");
    assert_eq!(report["matched"], 1, "{report}");
    let out = twin(&["aquser.raw_que", "corrid = 'B'"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains("1 of 2 messages of AQUSER.RAW_QUE match"), "{table}");
    let out = twin(&["AQUSER.RAW_QUE", "priority >"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid condition"), "{out:?}");
    let a = call(&r, get_as(&format!("{tester}?condition={}", enc("corrid = 'A' OR corrid = 'B'")), "c_reader")).await;
    assert_eq!(outcomes(&a.body), ["match", "match"]);
    // Not a condition: 400 with the parser's reason.
    let a = call(&r, get_as(&format!("{tester}?condition={}", enc("priority >")), "c_reader")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.body.contains("invalid condition"), "{}", a.body);
    // A name no message of the queue has: refused as a dequeue refuses it.
    let a = call(&r, get_as(&format!("{tester}?condition={}", enc("tab.user_data.nothing = 1")), "c_reader")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    // Over the evaluation's budget: an error with why.
    let heavy = format!("corrid LIKE '{}'", "%a".repeat(400));
    let mut cfg = aqgate_core::engine::EngineConfig::default();
    cfg.conditions.limits.max_steps = 3;
    let tight = Harness::with_config(b, &topology(), cfg).await;
    let state = AppState::new(tight.engine.clone(), Limits::default());
    let rt = aqgate_console::router(state, aqgate_console::ConsoleConfig::default());
    send_as(&tight, "scott", "AQUSER.RAW_QUE", &[("<correlation>aaaa</correlation>", "01")]).await;
    let a = call(&rt, get_as(&format!("{tester}?condition={}", enc(&heavy)), "c_reader")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(outcomes(&a.body), ["error"], "{}", a.body);
    // Too long: refused before parsing.
    let a = call(&r, get_as(&format!("{tester}?condition={}", "a".repeat(4_100)), "c_reader")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    // Nothing changed, and a viewer may not test.
    let after =
        aqgate_admin::messages::messages(h.engine.store().as_ref(), "AQUSER.RAW_QUE", None, 100).await.expect("rows");
    assert_eq!(before, after);
    assert_eq!(call(&r, get_as(tester, "c_viewer")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(call(&r, get_as(tester, "c_oe")).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_tester_judges_with_the_engines_evaluator_sqlite() {
    the_tester_judges_with_the_engines_evaluator(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_tester_judges_with_the_engines_evaluator_postgres() {
    the_tester_judges_with_the_engines_evaluator(Backend::Postgres).await;
}

/// The IDAP request a publish page shows, unescaped once.
fn shown_xml(page: &str) -> String {
    let start = page.find("<pre class=\"xml\">").expect("the request is shown") + 17;
    let end = start + page[start..].find("</pre>").expect("its end");
    let mut text = page[start..end].to_string();
    for (from, to) in [
        ("&#60;", "<"),
        ("&#62;", ">"),
        ("&#34;", "\""),
        ("&#39;", "'"),
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&quot;", "\""),
    ] {
        text = text.replace(from, to);
    }
    text.replace("&#38;", "&").replace("&amp;", "&")
}

async fn an_operator_publishes_and_a_receive_gets_it(b: Backend) {
    let (r, h) = router(b).await;
    let path = "/console/queues/AQUSER.RAW_QUE/publish";
    let form = format!(
        "payload={}&encoding=text&priority=3&correlation={}&action=send",
        enc("hello <world> & co"),
        enc("C<1>")
    );
    let a = call(&r, post_as(path, "c_operator", &form)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("AQXmlSend"), "the request is shown");
    let xml = shown_xml(&a.body);
    assert!(xml.contains("<correlation>C&lt;1&gt;</correlation>"), "the request, escaped on the page: {xml}");
    assert!(!a.body.contains("<world>") && !a.body.contains("<correlation>"), "never as markup");
    let start = a.body.find("class=\"msgid\">").expect("the new id") + 14;
    let id = &a.body[start..start + 32];
    // An IDAP receive gets it, with what the form said.
    let mut s = h.session("scott");
    let got = h.run(&mut s, &receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT)).await.expect("receive");
    let m = &received(&got)[0];
    assert_eq!(m.header.message_id.as_deref(), Some(id));
    assert_eq!(raw_of(m), hex::encode_upper("hello <world> & co"));
    assert_eq!(m.header.priority, Some(3));
    assert_eq!(m.header.correlation.as_deref(), Some("C<1>"));
    // A preview sends nothing.
    let a = call(&r, post_as(path, "c_operator", "payload=0A0B&encoding=hex&action=preview")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(shown_xml(&a.body).contains("<raw>0A0B</raw>"), "{}", a.body);
    assert!(!a.body.contains("class=\"msgid\""));
    assert!(
        aqgate_admin::messages::messages(h.engine.store().as_ref(), "AQUSER.RAW_QUE", None, 10)
            .await
            .expect("rows")
            .0
            .is_empty()
    );
    // Bad input: 400, saying what.
    let a = call(&r, post_as(path, "c_operator", "payload=zz&encoding=hex&action=send")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.body.contains("hexadecimal"));
    let a = call(&r, post_as(path, "c_operator", "payload=x&priority=high&action=send")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    // A reader's forced POST, and an operator of another schema: 403, nothing sent.
    for agent in ["c_reader", "c_viewer"] {
        let a = call(&r, post_as(path, agent, "payload=x&action=send")).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{agent}");
    }
    assert_eq!(call(&r, get_as(path, "c_reader")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(call(&r, post_as(path, "c_oe", "payload=x&action=send")).await.status, StatusCode::FORBIDDEN);
    assert!(
        aqgate_admin::messages::messages(h.engine.store().as_ref(), "AQUSER.RAW_QUE", None, 10)
            .await
            .expect("rows")
            .0
            .is_empty()
    );
    // A JMS text queue takes text.
    let a = call(&r, post_as("/console/queues/AQUSER.JMS_TEXTQ/publish", "c_operator", "payload=hi&action=send")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("text_data"));
    // Another payload type is refused clearly.
    let a = call(&r, post_as("/console/queues/AQUSER.XML_QUE/publish", "c_operator", "payload=x&action=send")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_operator_publishes_and_a_receive_gets_it_sqlite() {
    an_operator_publishes_and_a_receive_gets_it(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_operator_publishes_and_a_receive_gets_it_postgres() {
    an_operator_publishes_and_a_receive_gets_it(Backend::Postgres).await;
}

#[tokio::test]
async fn the_topology_graph_shows_the_jobs_escaped() {
    let (r, h) = router(Backend::Sqlite).await;
    send_as(&h, "scott", "AQUSER.RAW_QUE", &[("", "01"), ("", "02")]).await;
    let a = call(&r, get_as("/console/topology", "c_admin")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("<svg"), "{}", a.body);
    assert!(a.body.contains(">COPY_JOB</text>"), "{}", a.body);
    assert!(a.body.contains(">SINK_JOB</text>") && a.body.contains(">FORWARD_JOB</text>"), "{}", a.body);
    assert!(
        a.body.contains("&amp;b=&lt;i&gt;x&lt;/i&gt;") || a.body.contains("&#38;b=&#60;i&#62;"),
        "escaped: {}",
        a.body
    );
    assert!(!a.body.contains("<i>x</i>"), "never as markup");
    assert!(a.body.contains("backlog 2"), "{}", a.body);
    assert!(a.body.contains("job disabled"), "the disabled job's colour: {}", a.body);
    assert!(a.body.contains(">AQUSER.RAW_COPY</text>"));
    for agent in ["c_viewer", "c_reader", "c_operator"] {
        assert_eq!(call(&r, get_as("/console/topology", agent)).await.status, StatusCode::FORBIDDEN, "{agent}");
    }
    // An admin of another schema sees none of these jobs.
    let other = call(&r, get_as("/console/topology", "c_oe")).await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(!other.body.contains("COPY_JOB") && !other.body.contains("FORWARD_JOB"), "{}", other.body);
}

/// The graph is live: a fragment of its own (admin only), with each job's rate, that the
/// event stream names to an admin (and to nobody else) when a job's figures change.
#[tokio::test]
async fn the_topology_graph_is_live() {
    use futures_util::StreamExt;
    use tower::ServiceExt;
    let (r, h) = router(Backend::Sqlite).await;
    let page = call(&r, get_as("/console/topology", "c_admin")).await;
    assert!(page.body.contains("data-live-events=\"/console/events\""), "{}", page.body);
    assert!(page.body.contains("data-fragment-url=\"/console/fragments/topology\""), "{}", page.body);
    let graph = call(&r, get_as("/console/fragments/topology", "c_admin")).await;
    assert_eq!(graph.status, StatusCode::OK, "{}", graph.body);
    assert!(graph.body.starts_with("<p>") && graph.body.contains("<svg"), "the graph alone: {}", graph.body);
    assert!(graph.body.contains("0 moved · 0.0/s"), "each job's rate: {}", graph.body);
    assert!(graph.body.contains("backlog 0"), "{}", graph.body);
    for agent in ["c_viewer", "c_operator"] {
        let a = call(&r, get_as("/console/fragments/topology", agent)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{agent}");
    }
    let stream = |agent: &'static str| {
        let r = r.clone();
        async move {
            let resp = r.oneshot(get_as("/console/events", agent)).await.expect("answer");
            assert_eq!(resp.status(), StatusCode::OK);
            resp.into_body().into_data_stream()
        }
    };
    let (mut admin, mut viewer) = (stream("c_admin").await, stream("c_viewer").await);
    send_as(&h, "scott", "AQUSER.RAW_QUE", &[("", "01"), ("", "02")]).await;
    let mut said = [String::new(), String::new()];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(8);
    while !(said[0].contains("data: topology") && said[1].contains("data: queues")) {
        assert!(tokio::time::Instant::now() < deadline, "no topology event within 8 s: {said:?}");
        tokio::select! {
            Some(Ok(t)) = admin.next() => said[0].push_str(&String::from_utf8_lossy(&t)),
            Some(Ok(t)) = viewer.next() => said[1].push_str(&String::from_utf8_lossy(&t)),
            () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
    assert!(!said[1].contains("topology"), "a viewer is not told of the graph: {said:?}");
    let graph = call(&r, get_as("/console/fragments/topology", "c_admin")).await;
    assert!(graph.body.contains("backlog 2"), "{}", graph.body);
}

/// `aqgate admin messages`' twin of the console's listing: the same filters, and a page's
/// `--after` that goes on.
async fn admin_messages_pages_with_filters(b: Backend) {
    let h = Harness::with_topology(b, &topology()).await;
    let msgs: Vec<(String, String)> = (0..6)
        .map(|i| {
            (format!("<correlation>{}-{i}</correlation>", if i % 2 == 0 { "EVEN" } else { "ODD" }), format!("{i:02X}"))
        })
        .collect();
    let refs: Vec<(&str, &str)> = msgs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let ids = send_as(&h, "scott", "AQUSER.RAW_QUE", &refs).await;
    let filter =
        aqgate_core::store::ViewFilter { correlation: Some("EVEN".into()), corr_prefix: true, ..Default::default() };
    let store = h.engine.store().as_ref();
    let (mut seen, mut after) = (Vec::new(), None::<String>);
    for _ in 0..5 {
        let (mut out, mut note) = (Vec::new(), Vec::new());
        aqgate_admin::messages::print_messages(
            store,
            "AQUSER.RAW_QUE",
            &filter,
            after.as_deref(),
            2,
            false,
            &mut out,
            &mut note,
        )
        .await
        .expect("admin messages");
        let out = String::from_utf8(out).expect("utf-8");
        seen.extend(ids.iter().filter(|id| out.contains(id.as_str())).cloned());
        after = out.lines().last().and_then(|l| l.split("--after ").nth(1)).map(str::to_string);
        if after.is_none() {
            break;
        }
    }
    assert_eq!(seen, [ids[0].clone(), ids[2].clone(), ids[4].clone()]);
    let mut sink = Vec::new();
    let bad = aqgate_admin::messages::print_messages(
        store,
        "AQUSER.RAW_QUE",
        &filter,
        Some("nonsense"),
        2,
        false,
        &mut sink,
        &mut Vec::new(),
    )
    .await;
    assert!(bad.is_err_and(|e| e.to_string().contains("--after")));
}

#[tokio::test]
async fn admin_messages_pages_with_filters_sqlite() {
    admin_messages_pages_with_filters(Backend::Sqlite).await;
}

#[tokio::test]
async fn admin_messages_pages_with_filters_postgres() {
    admin_messages_pages_with_filters(Backend::Postgres).await;
}

/// The payload search looks at no more than its bound a page, says so, and goes on from
/// there on the next page.
#[tokio::test]
async fn the_payload_search_is_bounded_and_goes_on() {
    let (r, h) = router(Backend::Sqlite).await;
    let rows = aqgate_core::store::PAYLOAD_SEARCH_ROWS;
    let filler: Vec<(&str, &str)> = vec![("", "00"); 500];
    for _ in 0..rows / 500 {
        send_as(&h, "scott", "AQUSER.RAW_QUE", &filler).await;
    }
    let needle = send_as(&h, "scott", "AQUSER.RAW_QUE", &[("", "6E6565646C65")]).await;
    let first = call(&r, get_as(&format!("{MESSAGES}?payload=needle&limit=10"), "c_reader")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(listed_ids(&first.body).is_empty(), "the bound reached before the needle");
    assert!(first.body.contains("The payload search stopped after"), "said: {}", first.body);
    let next = next_link(&first.body).expect("a next page");
    let second = call(&r, get_as(&next, "c_reader")).await;
    assert_eq!(listed_ids(&second.body), needle);
}
