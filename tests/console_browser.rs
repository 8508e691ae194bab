//! The web console in a real browser (headless Chromium under ChromeDriver,
//! `tests/common/browser.rs`) against a real `aqgate serve`: the login form and every page
//! with no console error and no CSP violation (a screenshot of each, for the README), the
//! publish form's Send;
//! fifty messages viewed one by one leaving their states, retry counts and the depth as
//! they were; an XSS corpus in RAW, JMS and XML payloads, correlations and an agent's name
//! shown as text and never run; a viewer shown no action, and a POST it forces refused.

mod common;

use std::time::Duration;

use common::browser::{Browser, screenshot_dir};
use common::gateway::serve;
use common::*;
use fantoccini::Locator;
use serde_json::Value;

/// An agent whose name is markup, with the console's admin role.
const MARKUP_AGENT: &str = "<img src=x onerror=window.__xss=1>";

/// Markup that would run if a page pasted it in: each sets `window.__xss`.
const CORPUS: [&str; 5] = [
    "<script>window.__xss=1</script>",
    "\"><img src=x onerror=window.__xss=1>",
    "javascript:window.__xss=1",
    "'><svg onload=window.__xss=1>",
    "</textarea><iframe src=javascript:window.__xss=1>",
];

fn console_topology() -> std::path::PathBuf {
    demo_topology_with(
        "console-browser",
        &format!(
            r#"
[[queues]]
name = "AQUSER.RAW_COPY"
queue_table = "AQUSER.RAW_TAB"

[[propagations]]
name = "copy_job"
source = "AQUSER.RAW_QUE"
destination = "AQUSER.RAW_COPY"
enabled = false

[[agents]]
name = "c_viewer"
password = "pw"
db_users = ["AQUSER"]
console = "viewer"

[[agents]]
name = "c_admin"
password = "pw"
db_users = ["AQUSER"]
console = "admin"

[[agents]]
name = "{}"
password = "pw"
db_users = ["AQUSER"]
console = "admin"
"#,
            MARKUP_AGENT.replace('"', "\\\"")
        ),
    )
}

/// A served console and a browser logged in to it as `agent` (password `pw`) through the
/// login form.
struct Console {
    base: String,
    db: String,
    port: u16,
    browser: Browser,
    _server: Proc,
}

async fn console_as(what: &str, agent: &str) -> Console {
    let db = fresh_sqlite_url();
    let port = free_port();
    let server = serve(what, &db, port, &console_topology());
    let base = format!("http://127.0.0.1:{port}");
    let browser = Browser::start().await;
    log_in(&browser, &base, agent).await;
    Console { base, db, port, browser, _server: server }
}

async fn log_in(b: &Browser, base: &str, agent: &str) {
    let text = b.visit(&format!("{base}/console/login")).await;
    assert!(text.contains("Log in"), "the login form: {text}");
    let c = b.client();
    let field =
        |css: &'static str| async move { c.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}")) };
    field("input[name=agent]").await.send_keys(agent).await.expect("type the agent");
    field("input[name=password]").await.send_keys("pw").await.expect("type the password");
    field("form.login button[type=submit]").await.click().await.expect("log in");
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("form[action='/console/logout']"))
        .await
        .unwrap_or_else(|e| panic!("logged in as {agent}: {e}"));
    b.assert_clean("the overview after the login").await;
}

/// The `href`s of the page's links that contain `part`.
async fn links(b: &Browser, part: &str) -> Vec<String> {
    let v = b
        .client()
        .execute(
            "return Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href')).filter(h => h && h.includes(arguments[0]));",
            vec![Value::from(part)],
        )
        .await
        .expect("read the links");
    v.as_array().expect("a list").iter().filter_map(|h| h.as_str().map(String::from)).collect()
}

/// `aqgate admin messages QUEUE --json`: each message's id, state and retry count.
fn messages(db: &str, queue: &str) -> Vec<(String, String, String)> {
    let out = aqgate(&["admin", "messages", queue, "--database", db, "--json"]).output().expect("admin");
    assert!(out.status.success(), "admin messages: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = v.as_array().or_else(|| v["rows"].as_array()).unwrap_or_else(|| panic!("rows in {v}"));
    rows.iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().map_or_else(|| r[k].to_string(), str::to_string);
            (f("MSG_ID"), f("MSG_STATE"), f("RETRY_COUNT"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_page_in_the_browser_without_an_error_and_its_screenshot() {
    let c = console_as("console pages", "c_admin").await;
    let b = &c.browser;
    http(
        c.port,
        &raw_send("AQUSER.RAW_QUE", &[("<correlation>ORDER-1</correlation>", "48454C4C4F")], "<AQXmlCommit/>"),
    )
    .await;
    let mut shots = Vec::new();
    let overview = b.visit(&format!("{}/console/", c.base)).await;
    assert!(overview.contains("AQUSER.RAW_QUE") && overview.contains("COPY_JOB"), "{overview}");
    // The live figures catch up with the enqueue without a reload.
    let depth_cell = "tr[data-queue='AQUSER.RAW_QUE'] td.depth";
    let mut shown = String::new();
    for _ in 0..50 {
        // The live overview swaps its fragments in: a cell found just before a swap is
        // stale (or, mid-swap, not there) by the time it is read, and is looked up again.
        let read = match b.client().find(Locator::Css(depth_cell)).await {
            Ok(cell) => cell.text().await,
            Err(e) => Err(e),
        };
        match read {
            Ok(text) => shown = text,
            Err(e) if e.is_stale_element_reference() || e.is_no_such_element() => {}
            Err(e) => panic!("the depth's text: {e}"),
        }
        if shown == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(shown, "1", "the overview's depth of AQUSER.RAW_QUE");
    shots.push(b.screenshot("console-overview").await);
    let queues = b.visit(&format!("{}/console/queues?sort=backlog", c.base)).await;
    assert!(queues.contains("AQUSER.RAW_COPY"), "{queues}");
    shots.push(b.screenshot("console-queues").await);
    let list = b.visit(&format!("{}/console/queues/AQUSER.RAW_QUE/messages", c.base)).await;
    assert!(list.contains("ORDER-1"), "{list}");
    shots.push(b.screenshot("console-messages").await);
    let one = links(b, "/messages/").await;
    let one = one.iter().find(|h| !h.ends_with("/payload")).expect("a link to the message");
    let message = b.visit(&format!("{}{one}", c.base)).await;
    assert!(message.contains("48454C4C4F"), "the RAW payload as hex: {message}");
    shots.push(b.screenshot("console-message").await);
    let timeline = links(b, "/timeline").await;
    let timeline = b.visit(&format!("{}{}", c.base, timeline.first().expect("a link to the timeline"))).await;
    assert!(timeline.to_ascii_lowercase().contains("enqueue"), "the timeline: {timeline}");
    shots.push(b.screenshot("console-timeline").await);
    let agents = b.visit(&format!("{}/console/agents", c.base)).await;
    assert!(agents.contains("C_VIEWER") && agents.contains("viewer"), "{agents}");
    shots.push(b.screenshot("console-agents").await);
    let tester = b.visit(&format!("{}/console/queues/AQUSER.RAW_QUE/tester?condition=priority+%3E%3D+0", c.base)).await;
    assert!(tester.contains("1 of 1 messages match") && tester.contains("ORDER-1"), "the tester: {tester}");
    shots.push(b.screenshot("console-tester").await);
    // The publish form: its Send enqueues, the answer names the message and the request.
    b.visit(&format!("{}/console/queues/AQUSER.RAW_QUE/publish", c.base)).await;
    let cl = b.client();
    cl.find(Locator::Css("textarea[name=payload]"))
        .await
        .expect("payload")
        .send_keys("sent from the browser")
        .await
        .expect("type");
    cl.find(Locator::Css("button[value=send]")).await.expect("Send").click().await.expect("click");
    cl.wait().for_element(Locator::Css("pre")).await.expect("the answer");
    b.assert_clean("the publish form's answer").await;
    let sent = b.text().await;
    assert!(sent.contains("AQXmlSend"), "the request shown: {sent}");
    let hex = hex::encode_upper("sent from the browser");
    assert!(
        sent.contains(&format!("aqgate send --user C_ADMIN AQUSER.RAW_QUE --raw-hex {hex}")),
        "its command line: {sent}"
    );
    shots.push(b.screenshot("console-publish").await);
    assert_eq!(depth(&c.db, "AQUSER.RAW_QUE"), 2, "the published message is in the queue");
    let topology = b.visit(&format!("{}/console/topology", c.base)).await;
    assert!(topology.contains("COPY_JOB"), "the graph: {topology}");
    shots.push(b.screenshot("console-topology").await);
    let replay = b.visit(&format!("{}/console/queues/AQUSER.AQ$_RAW_TAB_E/replay", c.base)).await;
    assert!(replay.contains("Replay"), "{replay}");
    for page in ["audit", "sessions", "spool", "notifications"] {
        b.visit(&format!("{}/console/{page}", c.base)).await;
    }
    for shot in shots {
        let png = std::fs::read(&shot).expect("the screenshot");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 2000, "a PNG in {}", screenshot_dir().display());
    }
    // Log out: the cookie's session ends, the console asks for a login again.
    b.client()
        .find(Locator::Css("form[action='/console/logout'] button"))
        .await
        .expect("log out")
        .click()
        .await
        .expect("click");
    b.client().wait().for_element(Locator::Css("form.login")).await.expect("back at the login form");
    let again = b.visit(&format!("{}/console/queues", c.base)).await;
    assert!(again.contains("Log in"), "after the logout: {again}");
    c.browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_messages_viewed_in_the_browser_change_nothing() {
    let c = console_as("console fifty", "c_admin").await;
    let msgs: Vec<(String, String)> =
        (0..50).map(|i| (format!("<correlation>V{i:02}</correlation>"), format!("{i:04X}"))).collect();
    let refs: Vec<(&str, &str)> = msgs.iter().map(|(h, p)| (h.as_str(), p.as_str())).collect();
    http(c.port, &raw_send("AQUSER.RAW_QUE", &refs, "<AQXmlCommit/>")).await;
    let before = messages(&c.db, "AQUSER.RAW_QUE");
    assert_eq!(before.len(), 50, "{before:?}");
    let depth_before = depth(&c.db, "AQUSER.RAW_QUE");

    c.browser.visit(&format!("{}/console/queues/AQUSER.RAW_QUE/messages", c.base)).await;
    let pages: Vec<String> =
        links(&c.browser, "/messages/").await.into_iter().filter(|h| !h.ends_with("/payload")).collect();
    assert_eq!(pages.len(), 50, "a link to each message: {pages:?}");
    for p in &pages {
        let text = c.browser.visit(&format!("{}{p}", c.base)).await;
        assert!(text.contains("READY"), "{p}: {text}");
    }
    assert_eq!(messages(&c.db, "AQUSER.RAW_QUE"), before, "states and retry counts as they were");
    assert_eq!(depth(&c.db, "AQUSER.RAW_QUE"), depth_before);
    // And every message is still there for a consumer, in order.
    let r = http(c.port, &receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", "<AQXmlCommit/>")).await;
    assert_eq!(received(&r).len(), 1, "{r:?}");
    assert_eq!(raw_of(&received(&r)[0]), "0000");
    c.browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_xss_corpus_never_runs_in_the_browser() {
    let c = console_as("console xss", MARKUP_AGENT).await;
    let escape = |s: &str| {
        s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
    };
    for text in CORPUS {
        let corr = escape(text);
        let header = format!("<correlation>{corr}</correlation>");
        let hex = hex::encode_upper(text.as_bytes());
        http(c.port, &raw_send("AQUSER.RAW_QUE", &[(&header, &hex)], "<AQXmlCommit/>")).await;
        let send = |dest: &str, payload: &str| {
            envelope(&format!(
                r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header>{header}</message_header><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
            ))
        };
        http(
            c.port,
            &send("AQUSER.JMS_TEXTQ", &format!("<jms_text_message><text_data>{corr}</text_data></jms_text_message>")),
        )
        .await;
        http(c.port, &send("AQUSER.XML_QUE", &format!("<xml_data><note n=\"{corr}\">{corr}</note></xml_data>"))).await;
    }
    let b = &c.browser;
    let mut seen = 0;
    for queue in ["AQUSER.RAW_QUE", "AQUSER.JMS_TEXTQ", "AQUSER.XML_QUE"] {
        let list = b.visit(&format!("{}/console/queues/{queue}/messages", c.base)).await;
        for text in CORPUS {
            assert!(list.contains(text), "{queue}: the correlation {text} shown as text: {list}");
        }
        for p in links(b, "/messages/").await.into_iter().filter(|h| !h.ends_with("/payload")) {
            let page = b.visit(&format!("{}{p}", c.base)).await;
            assert!(CORPUS.iter().any(|t| page.contains(t)), "{p}: the corpus shown as text: {page}");
            seen += 1;
        }
    }
    assert_eq!(seen, 3 * CORPUS.len(), "every message's page visited");
    // The agent's own name, in the navigation of every page, is text too.
    for path in ["/console/", "/console/queues", "/console/agents"] {
        let page = b.visit(&format!("{}{path}", c.base)).await;
        assert!(page.contains(&MARKUP_AGENT.to_ascii_uppercase()), "{path}: {page}");
    }
    let ran = b.client().execute("return window.__xss === undefined ? 0 : window.__xss;", vec![]).await.expect("read");
    assert_eq!(ran, Value::from(0), "no markup of the corpus ran");
    c.browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_sees_no_action_and_a_forced_post_is_refused() {
    let c = console_as("console viewer", "c_viewer").await;
    let b = &c.browser;
    let overview = b.visit(&format!("{}/console/", c.base)).await;
    assert!(overview.contains("COPY_JOB"), "the viewer sees the job: {overview}");
    let count = |css: &'static str| async move {
        let n = b.client().execute("return document.querySelectorAll(arguments[0]).length;", vec![Value::from(css)]);
        n.await.unwrap_or_else(|e| panic!("count {css}: {e}")).as_u64()
    };
    assert_eq!(count("form[action^='/console/jobs/']").await, Some(0), "no job action for a viewer");
    assert_eq!(count("button").await, count("form[action='/console/logout'] button").await, "no button but Log out");
    assert!(links(b, "/messages").await.is_empty(), "a viewer gets no link to payloads");
    // A POST the page itself sends (same origin, the viewer's cookie): refused.
    let status = b
        .client()
        .execute_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/console/jobs/copy_job/enable', {method: 'POST', headers: {'content-type': 'application/x-www-form-urlencoded'}, body: ''})\
               .then(r => done(r.status), e => done(String(e)));",
            vec![],
        )
        .await
        .expect("the forced POST");
    assert_eq!(status, Value::from(403), "a viewer's POST");
    let payload = b
        .client()
        .execute_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/console/queues/AQUSER.RAW_QUE/messages').then(r => done(r.status), e => done(String(e)));",
            vec![],
        )
        .await
        .expect("the forced GET");
    assert_eq!(payload, Value::from(403), "a viewer reading messages");
    let jobs = common::gateway::admin_json(&c.db, "jobs");
    assert_eq!(common::gateway::job(&jobs, "COPY_JOB")["requested"], "DISABLED", "the job stayed disabled: {jobs}");
    c.browser.close().await;
}
