//! The web console in process, through `tower::ServiceExt::oneshot` on the router the binary
//! serves (the servlet's with the console's merged in), over an engine on a fresh store:
//! the security headers on every answer, each role against each route, the cross-origin
//! refusal, login and logout with the cookie's attributes, an XSS corpus in payloads,
//! correlations and agent names shown only escaped, browsing that changes nothing, and
//! the queue list's keyset paging.

mod common;

use std::collections::BTreeSet;

use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::Limits;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine as _;
use common::console::{Answer, basic, call, get_as, post_as};
use common::*;

/// The name of an admin agent that tries to be markup.
const MARKUP_AGENT: &str = "<b onmouseover=alert(1)>x</b>";

/// The demo topology, a local job, and one agent per console role (and one without).
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

{}

[[agents]]
name = "{MARKUP_AGENT}"
password = "pw"
db_users = ["AQUSER"]
console = "admin"
"#,
        aqgate_admin::DEFAULT_TOPOLOGY,
        common::console::ROLE_AGENTS
    )
}

/// The router `aqgate serve` serves on a loopback listener, and the engine's harness.
async fn router(b: Backend) -> (axum::Router, Harness) {
    let h = Harness::with_topology(b, &topology()).await;
    let state = AppState::new(h.engine.clone(), Limits::default());
    let r = app(state.clone()).merge(aqgate_console::router(state, aqgate_console::ConsoleConfig::default()));
    (r, h)
}

/// Every console answer carries these, whatever its status.
fn assert_security_headers(a: &Answer, what: &str) {
    let csp = a.header("content-security-policy");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{what}: CSP {csp:?} lacks {part}");
    }
    assert!(!csp.contains("unsafe"), "{what}: {csp}");
    assert_eq!(a.header("x-content-type-options"), "nosniff", "{what}");
    assert_eq!(a.header("referrer-policy"), "no-referrer", "{what}");
    assert_eq!(a.header("cache-control"), "no-store", "{what}");
}

/// Sends RAW messages (hex payloads) to AQUSER.RAW_QUE as scott, committed; their ids.
async fn send_raw(h: &Harness, msgs: &[(&str, &str)]) -> Vec<String> {
    let mut s = h.session("scott");
    let r = h.run(&mut s, &raw_send("AQUSER.RAW_QUE", msgs, "<AQXmlCommit/>")).await.expect("send");
    sent_ids(&r)
}

/// (msg_id, state, retry_count, consumer) of every row `admin messages` lists.
async fn listed(h: &Harness, queue: &str) -> Vec<(String, String, String, String)> {
    let (rows, _) =
        aqgate_admin::messages::messages(h.engine.store().as_ref(), queue, None, 10_000).await.expect("admin messages");
    let col = |r: &[(&str, Option<String>)], c: &str| {
        r.iter().find(|(n, _)| *n == c).and_then(|(_, v)| v.clone()).unwrap_or_default()
    };
    rows.iter()
        .map(|r| (col(r, "msg_id"), col(r, "msg_state"), col(r, "retry_count"), col(r, "consumer_name")))
        .collect()
}

async fn depth_of(h: &Harness, queue: &str) -> i64 {
    let rows = aqgate_admin::queues(h.engine.store().as_ref()).await.expect("queues");
    rows.iter().find(|q| q.name == queue).map(|q| q.depth).expect("the queue")
}

#[tokio::test]
async fn each_role_against_each_route_with_the_headers_on_every_answer() {
    let (r, h) = router(Backend::Sqlite).await;
    let id = send_raw(&h, &[("", "0A0B")]).await.remove(0);
    let q = "/console/queues/AQUSER.RAW_QUE/messages";
    let gets = [
        ("/console/", [403, 200, 200, 200, 200]),
        ("/console/queues", [403, 200, 200, 200, 200]),
        (q, [403, 403, 200, 200, 200]),
        (&format!("{q}/{id}"), [403, 403, 200, 200, 200]),
        (&format!("{q}/{id}/payload"), [403, 403, 200, 200, 200]),
        ("/console/agents", [403, 403, 403, 403, 200]),
    ];
    let roles = ["c_none", "c_viewer", "c_reader", "c_operator", "c_admin"];
    for (path, want) in gets {
        for (agent, want) in roles.iter().zip(want) {
            let a = call(&r, get_as(path, Some(agent))).await;
            assert_eq!(a.status.as_u16(), want, "{agent} GET {path}: {}", a.body);
            assert_security_headers(&a, &format!("{agent} GET {path}"));
        }
    }
    // A forced POST by each role below operator is refused, and changes nothing.
    for (agent, want) in roles.iter().zip([403, 403, 403, 303, 303]) {
        let path = "/console/jobs/copy_job/disable";
        let a = call(&r, post_as(path, Some(agent), "")).await;
        assert_eq!(a.status.as_u16(), want, "{agent} POST {path}: {}", a.body);
        assert_security_headers(&a, &format!("{agent} POST {path}"));
        let jobs = aqgate_admin::jobs::jobs(h.engine.store().as_ref()).await.expect("jobs");
        let requested = jobs.iter().find(|j| j.name == "COPY_JOB").map(|j| j.requested).expect("the job");
        assert_eq!(requested, if want == 303 { "DISABLED" } else { "ENABLED" }, "after {agent}'s POST");
        let a = call(&r, post_as("/console/jobs/copy_job/enable", Some(agent), "")).await;
        assert_eq!(a.status.as_u16(), want, "{agent} enable");
    }
    // The operator sees the actions, the viewer does not.
    let a = call(&r, get_as("/console/", Some("c_operator"))).await;
    assert!(a.body.contains("/console/jobs/COPY_JOB/disable"), "{}", a.body);
    let a = call(&r, get_as("/console/", Some("c_viewer"))).await;
    assert!(!a.body.contains("/console/jobs/"), "{}", a.body);
    assert!(!a.body.contains(q), "a viewer gets no link to messages: {}", a.body);
    // Scoped by the queue privileges: OE's agent sees none of AQUSER's queues, even as admin.
    let a = call(&r, get_as("/console/queues", Some("c_oe"))).await;
    assert!(a.body.contains("OE.OE_NEW_ORDERS_QUE") && !a.body.contains("AQUSER.RAW_QUE"), "{}", a.body);
    assert_eq!(call(&r, get_as(q, Some("c_oe"))).await.status, StatusCode::FORBIDDEN);
    assert_eq!(call(&r, post_as("/console/jobs/copy_job/disable", Some("c_oe"), "")).await.status.as_u16(), 403);
    // The rest: the assets, the login page, an unknown page, wrong credentials.
    for (path, want) in [
        ("/console/assets/console.css", 200),
        ("/console/assets/console.js", 200),
        ("/console/assets/nothing.js", 404),
        ("/console/login", 200),
        ("/console/nothing", 404),
    ] {
        let a = call(&r, get_as(path, Some("c_viewer"))).await;
        assert_eq!(a.status.as_u16(), want, "GET {path}");
        assert_security_headers(&a, path);
    }
    let token = base64::engine::general_purpose::STANDARD.encode("c_admin:nope");
    let wrong = Request::get("/console/").header(header::AUTHORIZATION, format!("Basic {token}"));
    let a = call(&r, wrong.body(Body::empty()).expect("request")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_security_headers(&a, "wrong password");
}

#[tokio::test]
async fn a_cross_origin_post_is_refused() {
    let (r, h) = router(Backend::Sqlite).await;
    let path = "/console/jobs/copy_job/disable";
    let forged = [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "http://evil.example"), ("host", "127.0.0.1:8470")],
        vec![("origin", "null"), ("host", "127.0.0.1:8470")],
    ];
    for headers in forged {
        let mut b = Request::post(path).header(header::AUTHORIZATION, basic("c_admin"));
        for (k, v) in &headers {
            b = b.header(*k, *v);
        }
        let a = call(&r, b.body(Body::empty()).expect("request")).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{headers:?}");
        assert_security_headers(&a, "cross-origin");
        let mut login =
            Request::post("/console/login").header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (k, v) in &headers {
            login = login.header(*k, *v);
        }
        let a = call(&r, login.body(Body::from("agent=c_admin&password=pw")).expect("request")).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "a login from another site: {headers:?}");
        assert!(a.headers.get(header::SET_COOKIE).is_none());
    }
    let jobs = aqgate_admin::jobs::jobs(h.engine.store().as_ref()).await.expect("jobs");
    assert!(jobs.iter().all(|j| j.requested == "ENABLED"), "nothing changed");
}

#[tokio::test]
async fn login_logout_and_the_cookie() {
    let (r, _h) = router(Backend::Sqlite).await;
    // Without credentials: a page sends to the login form, a POST is refused.
    let a = call(&r, get_as("/console/", None)).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.header("location"), "/console/login");
    assert_security_headers(&a, "redirect");
    assert_eq!(call(&r, post_as("/console/jobs/copy_job/disable", None, "")).await.status, StatusCode::UNAUTHORIZED);
    // Wrong password: the form again, 401, and no Basic prompt.
    let a = call(&r, post_as("/console/login", None, "agent=c_reader&password=nope")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.headers.get(header::WWW_AUTHENTICATE).is_none());
    assert!(a.body.contains("Wrong agent name or password"), "{}", a.body);
    assert!(a.headers.get(header::SET_COOKIE).is_none());
    // No console role: refused, no session.
    let a = call(&r, post_as("/console/login", None, "agent=c_none&password=pw")).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.headers.get(header::SET_COOKIE).is_none());
    // The right one.
    let a = call(&r, post_as("/console/login", None, "agent=c_reader&password=pw")).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(a.header("location"), "/console/");
    let set = a.header("set-cookie").to_string();
    let attrs: BTreeSet<&str> = set.split(';').skip(1).map(str::trim).collect();
    assert_eq!(attrs, BTreeSet::from(["Path=/", "Secure", "HttpOnly", "SameSite=Strict"]), "{set}");
    let pair = set.split(';').next().expect("name=value");
    let (name, token) = pair.split_once('=').expect("name=value");
    assert_eq!(name, aqgate_console::COOKIE);
    assert_eq!(name, "__Host-aqgate_console");
    assert!(token.len() >= 64, "a long random token: {token}");
    let with_cookie =
        |path: &str| Request::get(path).header(header::COOKIE, pair.to_string()).body(Body::empty()).expect("request");
    let a = call(&r, with_cookie("/console/")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("C_READER (reader)"), "{}", a.body);
    assert_eq!(call(&r, with_cookie("/console/agents")).await.status, StatusCode::FORBIDDEN, "the cookie's role");
    // Logout ends the session and clears the cookie.
    let mut out = post_as("/console/logout", None, "");
    out.headers_mut().insert(header::COOKIE, pair.parse().expect("cookie"));
    let a = call(&r, out).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let cleared = a.header("set-cookie");
    assert!(cleared.starts_with("__Host-aqgate_console=;") && cleared.contains("Max-Age=0"), "{cleared}");
    let a = call(&r, with_cookie("/console/")).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "the old cookie no longer works");
    let a = call(&r, with_cookie("/console/nothing")).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "nor on an unknown page");
}

/// Markup and script that must never reach the page as such.
const CORPUS: [&str; 5] = [
    "<script>alert(1)</script>",
    "\"><img src=x onerror=alert(1)>",
    "javascript:alert(1)",
    "'><svg onload=alert(1)>",
    "</textarea><iframe src=javascript:alert(1)>",
];

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

/// `s` as the templates escape it (numeric character references).
fn html_escaped(s: &str) -> String {
    s.replace('&', "&#38;").replace('<', "&#60;").replace('>', "&#62;").replace('"', "&#34;").replace('\'', "&#39;")
}

/// What must not be in any page: the corpus's markup, unescaped.
fn assert_inert(page: &str, what: &str) {
    for bad in ["<script>alert", "<img src=x", "<svg onload", "<iframe", "onerror=alert(1)>", "href=\"javascript:"] {
        assert!(!page.contains(bad), "{what}: {bad:?} unescaped in\n{page}");
    }
}

async fn the_xss_corpus_appears_only_escaped(b: Backend) {
    let (r, h) = router(b).await;
    let mut s = h.session("scott");
    for (i, text) in CORPUS.iter().enumerate() {
        let corr = xml_escape(text);
        let hex = hex::encode_upper(text.as_bytes());
        let header = format!("<correlation>{corr}</correlation>");
        h.run(&mut s, &raw_send("AQUSER.RAW_QUE", &[(&header, &hex)], "<AQXmlCommit/>")).await.expect("RAW");
        let jms = format!("<jms_text_message><text_data>{corr}</text_data></jms_text_message>");
        let send = |dest: &str, payload: &str| {
            envelope(&format!(
                r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header>{header}</message_header><message_payload>{payload}</message_payload></message></message_set><AQXmlCommit/></AQXmlSend>"#
            ))
        };
        h.run(&mut s, &send("AQUSER.JMS_TEXTQ", &jms)).await.expect("JMS text");
        let xml = format!("<xml_data><note n=\"{corr}\">{corr}</note><i>{i}</i></xml_data>");
        h.run(&mut s, &send("AQUSER.XML_QUE", &xml)).await.expect("XML");
    }
    for queue in ["AQUSER.RAW_QUE", "AQUSER.JMS_TEXTQ", "AQUSER.XML_QUE"] {
        let list = call(&r, get_as(&format!("/console/queues/{queue}/messages"), Some("c_admin"))).await;
        assert_eq!(list.status, StatusCode::OK);
        assert_inert(&list.body, queue);
        for text in CORPUS {
            assert!(list.body.contains(&html_escaped(text)), "the correlation {text}, escaped: {}", list.body);
        }
        let ids = listed(&h, queue).await;
        assert_eq!(ids.len(), CORPUS.len());
        for (id, ..) in ids {
            let a = call(&r, get_as(&format!("/console/queues/{queue}/messages/{id}"), Some("c_admin"))).await;
            assert_eq!(a.status, StatusCode::OK, "{}", a.body);
            assert_inert(&a.body, &format!("{queue} {id}"));
            assert!(a.body.contains("<pre>"), "the payload is shown: {}", a.body);
        }
    }
    // An agent whose name is markup: in the navigation and on the agents page, escaped.
    for path in ["/console/", "/console/agents"] {
        let a = call(&r, get_as(path, Some(MARKUP_AGENT))).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.body);
        assert!(!a.body.to_ascii_lowercase().contains("<b onmouseover"), "{path}: {}", a.body);
        assert!(a.body.contains(&html_escaped("<B ONMOUSEOVER=ALERT(1)>X</B>")), "{path}: {}", a.body);
    }
}

#[tokio::test]
async fn the_xss_corpus_appears_only_escaped_sqlite() {
    the_xss_corpus_appears_only_escaped(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_xss_corpus_appears_only_escaped_postgres() {
    the_xss_corpus_appears_only_escaped(Backend::Postgres).await;
}

async fn viewing_fifty_messages_changes_nothing(b: Backend) {
    let (r, h) = router(b).await;
    let payloads: Vec<String> = (0..50).map(|i| format!("{i:04X}")).collect();
    let msgs: Vec<(&str, &str)> = payloads.iter().map(|p| ("", p.as_str())).collect();
    let ids = send_raw(&h, &msgs).await;
    assert_eq!(ids.len(), 50);
    let before = listed(&h, "AQUSER.RAW_QUE").await;
    let depth = depth_of(&h, "AQUSER.RAW_QUE").await;
    let base = "/console/queues/AQUSER.RAW_QUE/messages";
    let a = call(&r, get_as(&format!("{base}?limit=100"), Some("c_reader"))).await;
    assert_eq!(a.status, StatusCode::OK);
    for (id, payload) in ids.iter().zip(&payloads) {
        assert!(a.body.contains(id.as_str()), "{id} listed");
        let page = call(&r, get_as(&format!("{base}/{id}"), Some("c_reader"))).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert!(page.body.contains(&format!("<pre>{payload}</pre>")), "the payload as hex: {}", page.body);
        let d = call(&r, get_as(&format!("{base}/{id}/payload"), Some("c_reader"))).await;
        assert_eq!(d.status, StatusCode::OK);
        assert_eq!(d.header("content-type"), "application/octet-stream");
        assert_eq!(d.header("content-disposition"), format!("attachment; filename=\"{id}.bin\""));
        assert_eq!(hex::encode_upper(d.body.as_bytes()), *payload);
    }
    assert_eq!(listed(&h, "AQUSER.RAW_QUE").await, before, "states and retry counts unchanged");
    assert!(before.iter().all(|(_, state, retry, _)| state == "READY" && retry == "0"), "{before:?}");
    assert_eq!(depth_of(&h, "AQUSER.RAW_QUE").await, depth);
    // And a receive still takes the first one, first.
    let mut s = h.session("scott");
    let got = h.run(&mut s, &receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", "")).await.expect("receive");
    assert!(raw_of(&received(&got)[0]).eq_ignore_ascii_case(&payloads[0]));
}

#[tokio::test]
async fn viewing_fifty_messages_changes_nothing_sqlite() {
    viewing_fifty_messages_changes_nothing(Backend::Sqlite).await;
}

#[tokio::test]
async fn viewing_fifty_messages_changes_nothing_postgres() {
    viewing_fifty_messages_changes_nothing(Backend::Postgres).await;
}

/// The `href` of the page's "Next page" link, unescaped.
fn next_link(page: &str) -> Option<String> {
    let end = page.find("\" rel=\"next\"")?;
    let start = page[..end].rfind("href=\"")? + 6;
    Some(page[start..end].replace("&amp;", "&").replace("&#38;", "&"))
}

/// The queue names of a queue page, in order.
fn queue_names(page: &str) -> Vec<String> {
    page.split("<tr><td>")
        .skip(1)
        .map(|row| {
            let cell = &row[..row.find("</td>").unwrap_or(row.len())];
            let text = match cell.find("\">") {
                Some(i) => &cell[i + 2..cell.find("</a>").unwrap_or(cell.len())],
                None => cell,
            };
            text.to_string()
        })
        .collect()
}

#[tokio::test]
async fn queue_pages_return_each_queue_once() {
    let (r, h) = router(Backend::Sqlite).await;
    send_raw(&h, &[("", "01"), ("", "02"), ("", "03")]).await;
    let everyone = queue_names(&call(&r, get_as("/console/queues?limit=500", Some("c_viewer"))).await.body);
    assert!(everyone.len() > 5, "{everyone:?}");
    for sort in ["name", "backlog"] {
        let mut seen = Vec::new();
        let mut next = Some(format!("/console/queues?sort={sort}&limit=2"));
        while let Some(path) = next {
            let a = call(&r, get_as(&path, Some("c_viewer"))).await;
            assert_eq!(a.status, StatusCode::OK, "{path}");
            let names = queue_names(&a.body);
            assert!(names.len() <= 2, "{names:?}");
            seen.extend(names);
            next = next_link(&a.body);
        }
        let unique: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "{sort}: none twice: {seen:?}");
        assert_eq!(unique, everyone.iter().collect(), "{sort}: every one");
        if sort == "backlog" {
            assert_eq!(seen[0], "AQUSER.RAW_QUE", "the largest backlog first");
        } else {
            let mut sorted = seen.clone();
            sorted.sort();
            assert_eq!(seen, sorted);
        }
    }
    let a = call(&r, get_as("/console/queues?q=jms", Some("c_viewer"))).await;
    let names = queue_names(&a.body);
    assert!(!names.is_empty() && names.iter().all(|n| n.contains("JMS")), "{names:?}");
}

/// The real binary: the console on a loopback listener by default; on one others reach only
/// with `--console`.
#[test]
fn served_on_loopback_by_default_and_elsewhere_only_when_configured() {
    for (listen_on, extra, want) in [
        ("127.0.0.1", &[][..], 200),
        ("0.0.0.0", &["--allow-plain-http"][..], 404),
        ("0.0.0.0", &["--allow-plain-http", "--console"][..], 200),
    ] {
        let port = free_port();
        let listen = format!("{listen_on}:{port}");
        let db = fresh_sqlite_url();
        let mut p = Proc::spawn(
            "aqgate serve",
            aqgate(&["serve", "--no-smtp", "--listen", &listen, "--database", &db]).args(extra),
        );
        p.wait_ready(port, std::time::Duration::from_secs(60));
        let (status, body) = http_get(port, "/console/login").expect("an answer");
        assert_eq!(status, want, "{listen} {extra:?}: {body}");
        assert_eq!(http_get(port, "/healthz").expect("healthz").0, 200);
    }
}
