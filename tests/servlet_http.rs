//! The servlet over real HTTP: all 17 examples, sessions and cookies, the
//! transport-level statuses, and the bad-input corpus (each gives its documented fault and
//! changes nothing in the store).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{self, Limits, Response};
use common::*;

struct Server {
    addr: SocketAddr,
    engine: Arc<Engine>,
    http: reqwest::Client,
    /// The database's URL.
    url: String,
}

impl Server {
    async fn start(b: Backend) -> Self {
        Self::start_with(b, Limits::default()).await
    }

    async fn start_with(b: Backend, limits: Limits) -> Self {
        // Example 09 registers mailto:hr-events@example.com: the examples' domain is allowed.
        let mail = aqgate_core::notify_policy::MailPolicy::parse(&["example.com"]).expect("mail policy");
        let config = EngineConfig { notify_mail_policy: Arc::new(mail), ..EngineConfig::default() };
        Self::start_configured(b, limits, config).await
    }

    async fn start_configured(b: Backend, limits: Limits, config: EngineConfig) -> Self {
        let url = fresh_url(b).await;
        let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
        let engine = Engine::start(store, Arc::new(SystemClock), config).await.expect("engine");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = app(AppState::new(engine.clone(), limits));
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { addr, engine, http: reqwest::Client::new(), url }
    }

    fn url(&self) -> String {
        format!("http://{}/aqserv", self.addr)
    }

    async fn depth_total(&self) -> i64 {
        aqgate_admin::queues(self.engine.store().as_ref()).await.expect("queues").iter().map(|q| q.depth).sum()
    }
}

/// One HTTP client: credentials plus the session cookie the server hands out.
struct Client<'a> {
    server: &'a Server,
    user: &'a str,
    password: &'a str,
    cookie: Option<String>,
    /// The whole Set-Cookie value last received.
    last_set_cookie: Option<String>,
}

struct Reply {
    status: u16,
    content_type: String,
    body: String,
    set_cookie: Option<String>,
}

impl Reply {
    fn idap(&self) -> Response {
        assert_eq!(self.status, 200, "body: {}", self.body);
        assert!(self.content_type.starts_with("text/xml"), "{}", self.content_type);
        idap::parse_response(self.body.as_bytes(), &Limits::default()).expect("response parses").body
    }

    fn fault_code(&self) -> i32 {
        match self.idap() {
            Response::Fault(f) => f.code,
            other => panic!("expected a fault, got {other:?}"),
        }
    }
}

impl<'a> Client<'a> {
    fn new(server: &'a Server, user: &'a str, password: &'a str) -> Self {
        Self { server, user, password, cookie: None, last_set_cookie: None }
    }

    async fn post_with(&mut self, body: &str, extra: &[(&str, &str)]) -> Reply {
        self.post_bytes(body.as_bytes().to_vec(), extra).await
    }

    async fn post_bytes(&mut self, body: Vec<u8>, extra: &[(&str, &str)]) -> Reply {
        let mut rb = idap_request(&self.server.http, &self.server.url(), (self.user, self.password), body);
        if let Some(c) = &self.cookie {
            rb = rb.header("cookie", c.clone());
        }
        for (k, v) in extra {
            rb = rb.header(*k, *v);
        }
        let resp = rb.send().await.expect("http");
        let set_cookie = resp.headers().get("set-cookie").and_then(|v| v.to_str().ok()).map(String::from);
        if let Some(sc) = &set_cookie {
            self.cookie = sc.split(';').next().map(String::from);
            self.last_set_cookie = Some(sc.clone());
        }
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let body = resp.text().await.expect("body");
        Reply { status, content_type, body, set_cookie }
    }

    async fn post(&mut self, body: &str) -> Reply {
        self.post_with(body, &[]).await
    }
}

/// Element names in document order, with depth: the "structure" of an XML document.
fn structure(xml: &str) -> Vec<(usize, String)> {
    let mut r = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    let mut depth = 0;
    loop {
        match r.read_event().expect("xml") {
            quick_xml::events::Event::Start(e) => {
                out.push((depth, String::from_utf8_lossy(e.local_name().as_ref()).to_string()));
                depth += 1;
            }
            quick_xml::events::Event::Empty(e) => {
                out.push((depth, String::from_utf8_lossy(e.local_name().as_ref()).to_string()))
            }
            quick_xml::events::Event::End(_) => depth -= 1,
            quick_xml::events::Event::Eof => break,
            _ => {}
        }
    }
    out
}

/// The structure of `ours` restricted to the protocol elements the example shows: same
/// elements in the same nesting, payload elements included.
fn assert_same_structure(ours: &str, example: &str) {
    assert_eq!(structure(ours), structure(example), "ours:\n{ours}\nexample:\n{example}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_seventeen_examples_work_over_http() {
    let s = Server::start(Backend::Sqlite).await;
    let mut scott = Client::new(&s, "scott", "tiger");
    let mut john = Client::new(&s, "john", "welcome");

    // 01: send an ORDER_TYP; the answer has example 12's structure.
    let r = scott.post(&example("01")).await;
    assert!(r.set_cookie.as_deref().is_some_and(|c| c.starts_with("AQSESSIONID=") && c.contains("HttpOnly")));
    assert!(r.set_cookie.as_deref().is_some_and(|c| !c.contains("Secure")), "Secure only when configured");
    assert!(
        matches!(r.idap(), Response::Send(_, Some(ref x)) if x.destination == "QS.NEW_ORDERS_QUE" && x.message_ids[0].len() == 32)
    );
    assert_same_structure(&r.body, &example("12"));
    // 10: commit, the same session (cookie); example 15's structure.
    let r = scott.post(&example("10")).await;
    assert!(matches!(r.idap(), Response::Commit(_)));
    assert_same_structure(&r.body, &example("15"));
    // 02: publish to the topic; example 13's structure.
    let r = scott.post(&example("02")).await;
    assert!(matches!(r.idap(), Response::Publish(_, Some(_))));
    assert_same_structure(&r.body, &example("13"));
    // 04: publish and commit in one request (commits 02 too).
    assert!(matches!(scott.post(&example("04")).await.idap(), Response::Publish(..)));
    // 03: JMS text message, as john; then roll it back (11).
    assert!(matches!(john.post(&example("03")).await.idap(), Response::Send(..)));
    let r = john.post(&example("11")).await;
    assert!(matches!(r.idap(), Response::Rollback(_)));
    // 08: browse the order; 07: receive and commit it; 05: nothing left.
    let r = scott.post(&example("08")).await;
    assert_eq!(received(&r.idap())[0].header.correlation.as_deref(), Some("HLB-4471"));
    let r = scott.post(&example("07")).await;
    assert_eq!(received(&r.idap())[0].header.correlation.as_deref(), Some("HLB-4471"));
    assert_eq!(scott.post(&example("05")).await.fault_code(), code::NO_MESSAGE);
    // 06: receive deptno = 40 for APP1 (published by 02 and 04); example 14's structure.
    let r = scott.post(&example("06")).await;
    let m = received(&r.idap());
    assert_eq!(m[0].payload.child("DEPTNO").map(|d| d.text()).as_deref(), Some("40"));
    assert_same_structure(&r.body, &example("14"));
    // 09: register for mail to a real address; a placeholder instead of the address gets a
    // clear fault.
    let placeholder = example("09").replace("hr-events@example.com", "[e-mail]");
    assert_eq!(scott.post(&placeholder).await.fault_code(), code::INVALID_VALUE);
    let r = scott.post(&example("09")).await;
    assert!(matches!(r.idap(), Response::Register(_)));
    // 16: john sends to OE's queue; example 17's structure.
    let r = john.post(&example("16")).await;
    assert!(matches!(r.idap(), Response::Send(_, Some(ref x)) if x.destination == "OE.OE_NEW_ORDERS_QUE"));
    assert_same_structure(&r.body, &example("17"));
    // 12-15 and 17 are responses: our client side parses each of them.
    for n in ["12", "13", "14", "15", "17"] {
        idap::parse_response(example(n).as_bytes(), &Limits::default()).unwrap_or_else(|e| panic!("example {n}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_work_on_postgres_too() {
    let s = Server::start(Backend::Postgres).await;
    let mut scott = Client::new(&s, "scott", "tiger");
    assert!(matches!(scott.post(&example("01")).await.idap(), Response::Send(..)));
    assert!(matches!(scott.post(&example("10")).await.idap(), Response::Commit(_)));
    assert!(matches!(scott.post(&example("04")).await.idap(), Response::Publish(..)));
    let r = scott.post(&example("06")).await;
    assert_eq!(received(&r.idap())[0].payload.child("DEPTNO").map(|d| d.text()).as_deref(), Some("40"));
    let r = scott.post(&example("07")).await;
    assert_eq!(received(&r.idap())[0].header.correlation.as_deref(), Some("HLB-4471"));
    assert_eq!(s.depth_total().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_carry_transactions_and_cookies_cannot_be_chosen() {
    let s = Server::start(Backend::Sqlite).await;
    let mut a = Client::new(&s, "scott", "tiger");
    assert!(matches!(a.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], "")).await.idap(), Response::Send(..)));
    assert_eq!(s.depth_total().await, 0, "not committed yet");
    // A client-invented session id names no session: a fault (never a fresh session that
    // would confirm a commit), and the cookie is cleared.
    let mut forger = Client::new(&s, "scott", "tiger");
    let forged = "AQSESSIONID=00000000000000000000000000000000";
    forger.cookie = Some(forged.into());
    let r = forger.post(&envelope(COMMIT)).await;
    assert_eq!(r.fault_code(), code::SESSION_UNKNOWN);
    assert!(r.set_cookie.as_deref().is_some_and(|c| c.contains("Max-Age=0")), "cleared: {:?}", r.set_cookie);
    assert_eq!(s.depth_total().await, 0);
    let r = forger.post(&raw_send("AQUSER.RAW_QUE", &[("", "02")], "")).await;
    let issued = r.set_cookie.expect("open work gets a session cookie");
    assert!(!issued.starts_with(forged), "the server issues its own id: {issued}");
    forger.post(&envelope(ROLLBACK)).await.idap();
    // Another agent's credentials with a's cookie do not get a's session.
    let mut thief = Client::new(&s, "john", "welcome");
    thief.cookie = a.cookie.clone();
    assert_eq!(thief.post(&envelope(COMMIT)).await.fault_code(), code::SESSION_UNKNOWN);
    assert_eq!(s.depth_total().await, 0);
    // a commits through its cookie.
    assert!(matches!(a.post(&envelope(COMMIT)).await.idap(), Response::Commit(_)));
    assert_eq!(s.depth_total().await, 1);
}

/// Credentials that come with a request are always checked: a live session cookie does
/// not make a wrong password good. The cookie alone is the session's token. A request
/// refused before it runs (not XML, a method header naming another method) leaves no
/// session behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_never_makes_wrong_credentials_good() {
    let s = Server::start(Backend::Sqlite).await;
    let mut a = Client::new(&s, "scott", "tiger");
    assert!(matches!(a.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], "")).await.idap(), Response::Send(..)));
    let cookie = a.cookie.clone().expect("open work gets a session");
    let mut wrong = Client::new(&s, "scott", "wrong");
    wrong.cookie = Some(cookie.clone());
    assert_eq!(wrong.post(&envelope(COMMIT)).await.status, 401, "the cookie with a wrong password");
    let mut nobody = Client::new(&s, "nobody", "tiger");
    nobody.cookie = Some(cookie.clone());
    assert_eq!(nobody.post(&envelope(COMMIT)).await.status, 401, "the cookie with an unknown agent");
    assert_eq!(s.depth_total().await, 0, "neither committed");
    let forged = s
        .http
        .post(s.url())
        .header("content-type", "text/xml")
        .header("cookie", "AQSESSIONID=00000000000000000000000000000000")
        .body(envelope(COMMIT))
        .send()
        .await
        .expect("http");
    assert_eq!(forged.status().as_u16(), 401, "an unknown cookie without credentials");
    let r = s
        .http
        .post(s.url())
        .header("content-type", "text/xml")
        .header("cookie", cookie)
        .body(envelope(COMMIT))
        .send()
        .await
        .expect("http");
    assert_eq!(r.status().as_u16(), 200, "the session's cookie alone");
    assert_eq!(s.depth_total().await, 1, "committed through the cookie");

    let open = s.engine.store().session_count().await.expect("count");
    for _ in 0..5 {
        let mut c = Client::new(&s, "scott", "tiger");
        let r = c.post("not XML").await;
        assert!(r.fault_code() > 0 && r.set_cookie.is_none());
        let r = c
            .post_with(
                &raw_send("AQUSER.RAW_QUE", &[("", "01")], ""),
                &[("IDAPMethodName", "http://ns.oracle.com/AQ/schemas/access#AQXmlReceive")],
            )
            .await;
        assert!(r.fault_code() > 0 && r.set_cookie.is_none());
    }
    assert_eq!(s.engine.store().session_count().await.expect("count"), open, "refused requests opened no session");
}

/// An idle session's cookie answers "expired" (25254) to its own agent, every time until
/// the tombstone's time is up, and the fault clears the cookie, so the client's next
/// request starts afresh; a request with the cookie that fails to authenticate learns
/// nothing, and another agent's credentials with it get "unknown session", never a fresh
/// session that would confirm a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_sessions_agent_learns_that_it_expired() {
    let config = EngineConfig { session_timeout: Duration::from_millis(200), ..EngineConfig::default() };
    let s = Server::start_configured(Backend::Sqlite, Limits::default(), config).await;
    let mut a = Client::new(&s, "scott", "tiger");
    assert!(matches!(a.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], "")).await.idap(), Response::Send(..)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(s.engine.expire_sessions().await, 1);
    let mut wrong = Client::new(&s, "scott", "wrong");
    wrong.cookie = a.cookie.clone();
    assert_eq!(wrong.post(&envelope(COMMIT)).await.status, 401);
    let mut john = Client::new(&s, "john", "welcome");
    john.cookie = a.cookie.clone();
    assert_eq!(john.post(&envelope(COMMIT)).await.fault_code(), code::SESSION_UNKNOWN, "not john's session");
    let cookie = a.cookie.clone();
    let r = a.post(&envelope(COMMIT)).await;
    assert_eq!(r.fault_code(), code::SESSION_EXPIRED);
    assert!(
        r.set_cookie.as_deref().is_some_and(|c| c.contains("Max-Age=0")),
        "the cookie is cleared: {:?}",
        r.set_cookie
    );
    let mut again = Client::new(&s, "scott", "tiger");
    again.cookie = cookie;
    assert_eq!(again.post(&envelope(COMMIT)).await.fault_code(), code::SESSION_EXPIRED, "told every time");
    assert!(matches!(a.post(&envelope(COMMIT)).await.idap(), Response::Commit(_)), "then a fresh session");
    assert_eq!(s.depth_total().await, 0, "the send was rolled back");
}

/// A long poll whose client hung up stops waiting: a message sent afterwards stays in the
/// queue for somebody who is there to receive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_whose_client_left_takes_nothing() {
    use tokio::io::AsyncWriteExt;
    let s = Server::start(Backend::Sqlite).await;
    let body = receive("AQUSER.RAW_QUE", "<wait_time>20</wait_time>", COMMIT);
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let head = format!(
        "POST /aqserv HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic c2NvdHQ6dGlnZXI=\r\n\
         Content-Type: text/xml\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    tcp.write_all(format!("{head}{body}").as_bytes()).await.expect("request");
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(tcp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut p = Client::new(&s, "scott", "tiger");
    assert!(matches!(p.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], COMMIT)).await.idap(), Response::Send(..)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.depth_total().await, 1, "nobody took the message");
    let mut c = Client::new(&s, "scott", "tiger");
    assert!(matches!(
        c.post(&receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT)).await.idap(),
        Response::Receive(..)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_acts_on_behalf_of_agents() {
    let s = Server::start(Backend::Sqlite).await;
    let mut gw = Client::new(&s, "aqgateway", "gateway-demo");
    let r = gw.post_with(&example("01"), &[("AQ-On-Behalf-Of", "scott")]).await;
    assert!(matches!(r.idap(), Response::Send(..)));
    assert!(matches!(gw.post_with(&example("10"), &[("AQ-On-Behalf-Of", "scott")]).await.idap(), Response::Commit(_)));
    assert_eq!(s.depth_total().await, 1);
    // The gateway acts with scott's privileges, not its own: john may not dequeue QS's queue.
    let mut gw2 = Client::new(&s, "aqgateway", "gateway-demo");
    assert_eq!(gw2.post_with(&example("05"), &[("AQ-On-Behalf-Of", "john")]).await.fault_code(), code::NOT_PERMITTED);
    // An ordinary agent may not act for another.
    let mut john = Client::new(&s, "john", "welcome");
    assert_eq!(john.post_with(&example("05"), &[("AQ-On-Behalf-Of", "scott")]).await.fault_code(), code::NOT_PERMITTED);
    // The gateway itself is not enabled for… anything but acting for others? It has no
    // database users, so on its own it may not touch the queue.
    let mut gw3 = Client::new(&s, "aqgateway", "gateway-demo");
    assert_eq!(gw3.post(&example("05")).await.fault_code(), code::NOT_PERMITTED);
}

/// Oracle's sender_id rule, through HTTP on both backends: on an ordinary queue sender_id is
/// the application's, kept as given (another agent, a name that is no agent, an alias);
/// on a secure queue (the demo's order queues) it must name an agent enabled for the
/// database user the request enqueues as. The authenticated agent is recorded apart
/// (`enq_user_id`) and shown to JMS receivers as `userid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_id_is_the_applications_and_the_enqueuing_agent_is_recorded() {
    for b in [Backend::Sqlite, Backend::Postgres] {
        sender_id_rule(b).await;
    }
}

async fn sender_id_rule(b: Backend) {
    let dir = aqgate_directory::open(&Default::default()).await.expect("embedded directory");
    let s = Server::start_configured(b, Limits::default(), EngineConfig { directory: Some(dir), ..Default::default() })
        .await;
    let commit = |xml: &str| xml.replace("</message_set>", "</message_set><AQXmlCommit/>");
    let sender_of = |r: &Reply| match r.idap() {
        Response::Receive(_, Some(res)) => {
            res.messages.first().and_then(|m| m.header.sender_id.as_ref()).and_then(|a| a.name.clone())
        }
        other => panic!("expected a receive result, got {other:?}"),
    };
    let mut scott = Client::new(&s, "scott", "tiger");
    let mut john = Client::new(&s, "john", "welcome");

    // Ordinary queue: scott sends john's JMS message (example 03, sender_id john) as it is.
    let r = scott.post(&commit(&example("03"))).await;
    assert!(matches!(r.idap(), Response::Send(..)), "{b:?}: {}", r.body);
    assert_eq!(stored_senders(&s.url).await, [(Some("john".into()), Some("SCOTT".into()))], "{b:?}");
    let r = john.post(&receive("AQUSER.JMS_TEXTQ", "<wait_time>0</wait_time>", COMMIT)).await;
    assert_eq!(sender_of(&r).as_deref(), Some("john"), "{b:?}");
    let got = received(&r.idap());
    let props = got[0].payload.child("oracle_jms_properties").expect("JMS properties");
    assert_eq!(props.child("userid").map(|u| u.text()).as_deref(), Some("SCOTT"), "JMSXUserID: {}", r.body);
    assert_eq!(props.child("appid").map(|u| u.text()).as_deref(), Some("aqgate-demo"), "{}", r.body);

    // A sender that is no agent at all, and an alias (resolved through the directory).
    let app = raw_send("AQUSER.RAW_QUE", &[("<sender_id><agent_name>APP_X</agent_name></sender_id>", "0A")], COMMIT);
    assert!(matches!(scott.post(&app).await.idap(), Response::Send(..)));
    let alias =
        raw_send("AQUSER.RAW_QUE", &[("<sender_id><agent_alias>JOHN_ALIAS</agent_alias></sender_id>", "0B")], COMMIT);
    assert!(matches!(scott.post(&alias).await.idap(), Response::Send(..)));
    // None: the authenticated agent.
    assert!(matches!(john.post(&raw_send("AQUSER.RAW_QUE", &[("", "0C")], COMMIT)).await.idap(), Response::Send(..)));
    assert_eq!(
        stored_senders(&s.url).await,
        [
            (Some("APP_X".into()), Some("SCOTT".into())),
            (Some("john".into()), Some("SCOTT".into())),
            (Some("JOHN".into()), Some("JOHN".into())),
        ],
        "{b:?}"
    );
    for want in ["APP_X", "john", "JOHN"] {
        let r = scott.post(&receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT)).await;
        assert_eq!(sender_of(&r).as_deref(), Some(want), "{b:?}");
    }

    // Secure queue: john enqueues to QS's order queue as OE (its grant). scott is not
    // enabled for OE, APP_X is no agent; the whole request is refused.
    let claims_scott = commit(&example("01"));
    for (claim, why) in [
        ("<agent_name>scott</agent_name>", "agent SCOTT is not enabled for database user OE"),
        ("<agent_name>APP_X</agent_name>", "APP_X is no agent, so it is not enabled for database user OE"),
        ("<agent_alias>SCOTT_ALIAS</agent_alias>", "agent SCOTT is not enabled for database user OE"),
    ] {
        let r = john.post(&claims_scott.replace("<agent_name>scott</agent_name>", claim)).await;
        assert_eq!(r.fault_code(), code::AGENT_NOT_ENABLED, "{b:?} {claim}: {}", r.body);
        assert!(
            r.body.contains(&format!(
                "message 1: sender_id names {}, but queue QS.NEW_ORDERS_QUE is in secure queue table \
                 QS.ORDERS_SQTAB: {why}, as which JOHN enqueues to it",
                if claim.contains("APP_X") { "APP_X" } else { "SCOTT" }
            )),
            "{}",
            r.body
        );
    }
    assert_eq!(s.depth_total().await, 0, "nothing of the refused requests was enqueued");
    // john names himself (or his alias), or nobody; scott, as QS, names scott.
    let as_john = claims_scott.replace("<agent_name>scott</agent_name>", "<agent_name>john</agent_name>");
    assert!(matches!(john.post(&as_john).await.idap(), Response::Send(..)));
    let as_alias = claims_scott.replace("<agent_name>scott</agent_name>", "<agent_alias>JOHN_ALIAS</agent_alias>");
    assert!(matches!(john.post(&as_alias).await.idap(), Response::Send(..)));
    let anonymous =
        claims_scott.replace("<sender_id>\n              <agent_name>scott</agent_name>\n            </sender_id>", "");
    assert!(!anonymous.contains("sender_id"), "the example's sender_id is taken out");
    assert!(matches!(john.post(&anonymous).await.idap(), Response::Send(..)));
    assert!(matches!(scott.post(&claims_scott).await.idap(), Response::Send(..)));
    assert_eq!(
        stored_senders(&s.url).await,
        [
            (Some("john".into()), Some("JOHN".into())),
            (Some("john".into()), Some("JOHN".into())),
            (Some("JOHN".into()), Some("JOHN".into())),
            (Some("scott".into()), Some("SCOTT".into())),
        ],
        "{b:?}"
    );
    for want in ["john", "john", "JOHN", "scott"] {
        assert_eq!(sender_of(&scott.post(&example("07")).await).as_deref(), Some(want), "{b:?}");
    }

    // A gateway acting on behalf of scott enqueues as scott: the same rule, and scott recorded.
    let mut gw = Client::new(&s, "aqgateway", "gateway-demo");
    let r = gw.post_with(&as_john, &[("AQ-On-Behalf-Of", "scott")]).await;
    assert_eq!(r.fault_code(), code::AGENT_NOT_ENABLED, "{}", r.body);
    assert!(r.body.contains("agent JOHN is not enabled for database user QS, as which SCOTT enqueues"), "{}", r.body);
    let r = gw.post_with(&commit(&example("03")), &[("AQ-On-Behalf-Of", "scott")]).await;
    assert!(matches!(r.idap(), Response::Send(..)), "{}", r.body);
    assert_eq!(stored_senders(&s.url).await, [(Some("john".into()), Some("SCOTT".into()))], "{b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_clients_do_not_pile_up_sessions_and_the_cap_holds() {
    let s = Server::start(Backend::Sqlite).await;
    for _ in 0..50 {
        let mut c = Client::new(&s, "scott", "tiger");
        assert_eq!(
            c.post(&receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT)).await.fault_code(),
            code::NO_MESSAGE
        );
    }
    assert_eq!(
        s.engine.store().session_count().await.expect("count"),
        0,
        "no session kept for requests that left nothing open"
    );
    // At the cap, a request that would leave a new session open is refused with 503 and
    // fault 18 (one that ends its transaction is served: tests/fair_shares.rs).
    let url = fresh_url(Backend::Sqlite).await;
    let store = store_with_topology(&url, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let shares = aqgate_core::engine::Shares { max_sessions: 2, ..Default::default() };
    let config = EngineConfig { shares, ..EngineConfig::default() };
    let engine = Engine::start(store, Arc::new(SystemClock), config).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut state = AppState::new(engine.clone(), Limits::default());
    state.secure_cookie = true;
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    let capped = Server { addr, engine, http: reqwest::Client::new(), url };
    let mut open = Vec::new();
    for i in 0..2 {
        let mut c = Client::new(&capped, "scott", "tiger");
        assert!(
            matches!(c.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], "")).await.idap(), Response::Send(..)),
            "session {i}"
        );
        open.push(c);
        let sc = open[i].last_set_cookie.clone().unwrap_or_default();
        assert!(sc.contains("; Secure") && sc.contains("HttpOnly"), "{sc}");
    }
    let mut third = Client::new(&capped, "scott", "tiger");
    let r = third.post(&raw_send("AQUSER.RAW_QUE", &[("", "01")], "")).await;
    assert_eq!(r.status, 503);
    let f = idap::parse_response(r.body.as_bytes(), &Limits::default()).expect("a fault").body;
    assert!(matches!(f, Response::Fault(ref x) if x.code == code::SESSION_LIMIT), "{f:?}");
    // Existing sessions carry on.
    assert!(matches!(open[0].post(&envelope(COMMIT)).await.idap(), Response::Commit(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idap_header_entries_are_accepted() {
    let s = Server::start(Backend::Sqlite).await;
    let mut c = Client::new(&s, "scott", "tiger");
    let doc = raw_send("AQUSER.RAW_QUE", &[("", "0C")], COMMIT)
        .replace("<Body>", r#"<Header><transaction_id xmlns="urn:example:txn">T-42</transaction_id></Header><Body>"#);
    assert!(doc.contains("<Header>"));
    assert!(matches!(c.post(&doc).await.idap(), Response::Send(..)));
    assert_eq!(s.depth_total().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints() {
    let s = Server::start(Backend::Sqlite).await;
    let r = s.http.get(format!("http://{}/healthz", s.addr)).send().await.expect("healthz");
    assert_eq!(r.status().as_u16(), 200);
    let r = s.http.get(format!("http://{}/readyz", s.addr)).send().await.expect("readyz");
    assert_eq!(r.status().as_u16(), 200);
}

const DEEP: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_documented_answer_and_changes_nothing() {
    let s = Server::start_with(Backend::Sqlite, Limits { max_bytes: 256 * 1024, ..Limits::default() }).await;
    let good = raw_send("AQUSER.RAW_QUE", &[("", "01")], COMMIT);
    let mut c = Client::new(&s, "scott", "tiger");

    // Transport level: HTTP status, no XML body.
    let mut nobody = Client::new(&s, "scott", "wrong");
    let r = nobody.post(&good).await;
    assert_eq!(r.status, 401);
    assert!(r.body.is_empty());
    let r = s.http.post(s.url()).header("content-type", "text/xml").body(good.clone()).send().await.expect("http");
    assert_eq!(r.status().as_u16(), 401, "no credentials");
    assert!(r.headers().get("www-authenticate").is_some());
    let r = s
        .http
        .post(s.url())
        .basic_auth("scott", Some("tiger"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("http");
    assert_eq!(r.status().as_u16(), 415);
    // No "simple" cross-site requests: a form-encoded or untyped body is refused too.
    for ct in [Some("application/x-www-form-urlencoded"), Some("text/plain"), None] {
        let mut rb = s.http.post(s.url()).basic_auth("scott", Some("tiger")).body(good.clone());
        if let Some(ct) = ct {
            rb = rb.header("content-type", ct);
        }
        assert_eq!(rb.send().await.expect("http").status().as_u16(), 415, "{ct:?}");
    }
    let big = format!("{}{}", good, " ".repeat(300 * 1024));
    // The server answers 413 from the head and closes without reading the body: a client
    // still writing may see the connection reset before it reads the answer (a transport
    // race, not an answer), so the request is sent again until an answer is read. The
    // answer says `Connection: close`, so the client does not send its next request on a
    // connection the server is closing (the requests below share this client's pool).
    let mut answer = None;
    for _ in 0..5 {
        let rb = idap_request(&s.http, &s.url(), ("scott", "tiger"), big.clone().into_bytes());
        if let Ok(resp) = rb.send().await {
            let connection = resp.headers().get("connection").and_then(|v| v.to_str().ok()).map(str::to_owned);
            answer = Some((resp.status().as_u16(), connection));
            break;
        }
    }
    assert_eq!(answer, Some((413, Some("close".to_owned()))));

    // IDAP level: a Fault naming the problem.
    let bomb = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body>&lol2;</Body></Envelope>"#;
    let deep = format!(
        "{}{}{}",
        r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>AQUSER.RAW_QUE</destination></producer_options><message_set><message><message_payload>"#,
        "<a>".repeat(DEEP),
        "</a>".repeat(DEEP)
    );
    let cases: Vec<(&str, Vec<u8>, i32)> = vec![
        ("malformed XML", b"<Envelope><Body><AQXmlSend>".to_vec(), 0),
        ("not XML at all", b"hello".to_vec(), 0),
        (
            "invalid UTF-8",
            good.replace("<raw>01</raw>", "<raw>01</raw>\u{1}")
                .into_bytes()
                .into_iter()
                .map(|b| if b == 1 { 0xff } else { b })
                .collect(),
            0,
        ),
        ("wrong namespace", Vec::from(good.replace("http://ns.oracle.com/AQ/schemas/access", "urn:evil")), 0),
        (
            "wrong envelope namespace",
            Vec::from(good.replace("http://ns.oracle.com/AQ/schemas/envelope", "urn:evil")),
            0,
        ),
        ("DOCTYPE / entity bomb", bomb.as_bytes().to_vec(), 0),
        ("deep nesting", Vec::from(deep), 0),
        (
            "message_count mismatch",
            Vec::from(good.replace("<message_count>1</message_count>", "<message_count>2</message_count>")),
            0,
        ),
        ("invalid hex payload", Vec::from(good.replace("<raw>01</raw>", "<raw>0G</raw>")), code::PAYLOAD_MISMATCH),
        (
            "type mismatch",
            Vec::from(
                example("02")
                    .replace("<DEPTNO>40</DEPTNO>", "<DEPTNO>forty</DEPTNO>")
                    .replace("</message_set>", "</message_set><AQXmlCommit/>"),
            ),
            code::PAYLOAD_MISMATCH,
        ),
        ("unknown queue", Vec::from(good.replace("AQUSER.RAW_QUE", "AQUSER.NOPE")), code::NO_SUCH_QUEUE),
        ("not permitted", Vec::from(example("16")), code::NOT_PERMITTED),
        ("unknown element", Vec::from(good.replace("<producer_options>", "<producer_options><colour>red</colour>")), 0),
        (
            "invalid message_id selector",
            Vec::from(receive("AQUSER.RAW_QUE", "<selector><message_id>XYZ</message_id></selector>", "")),
            0,
        ),
        (
            "short message_id selector",
            Vec::from(receive(
                "AQUSER.RAW_QUE",
                "<wait_time>0</wait_time><selector><message_id>ABCD</message_id></selector>",
                "",
            )),
            code::INVALID_VALUE,
        ),
        (
            "hostile condition",
            Vec::from(receive(
                "AQUSER.RAW_QUE",
                "<wait_time>0</wait_time><selector><condition>priority = 1 OR 1=1; DELETE FROM messages</condition></selector>",
                "",
            )),
            code::BAD_CONDITION,
        ),
    ];
    for (what, body, want) in &cases {
        let r = c.post_bytes(body.clone(), &[]).await;
        let got = r.fault_code();
        if *want != 0 {
            assert_eq!(got, *want, "{what}: {}", r.body);
        } else {
            assert!(got > 0, "{what}: a codec fault, got {got}");
        }
        match r.idap() {
            Response::Fault(f) => assert!(!f.message.is_empty(), "{what}: the fault explains"),
            _ => unreachable!(),
        }
    }
    // IDAPMethodName must agree with the body.
    let r = c.post_with(&good, &[("IDAPMethodName", "http://ns.oracle.com/AQ/schemas/access#AQXmlReceive")]).await;
    assert!(r.fault_code() > 0);
    let r = c.post_with(&good, &[("IDAPMethodName", "urn:other#AQXmlSend")]).await;
    assert!(r.fault_code() > 0);
    c.post(&envelope(COMMIT)).await.idap();
    assert_eq!(s.depth_total().await, 0, "nothing was enqueued by any bad request");
    // And the good request, with a matching IDAPMethodName, still works.
    let r = c.post_with(&good, &[("IDAPMethodName", "http://ns.oracle.com/AQ/schemas/access#AQXmlSend")]).await;
    assert!(matches!(r.idap(), Response::Send(..)));
    assert_eq!(s.depth_total().await, 1);
}

/// `Idempotency-Key`: a request is performed at most once per agent and key; a retry gets
/// the first response byte for byte (marked as replayed); the same key with another
/// request is refused (422); concurrent requests with one key perform it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_performs_a_request_at_most_once() {
    for b in [Backend::Sqlite, Backend::Postgres] {
        let s = Server::start(b).await;
        let post = |user: &'static str, password: &'static str, key: &'static str, body: String| {
            idap_request(&s.http, &s.url(), (user, password), body).header("Idempotency-Key", key).send()
        };
        let send = raw_send("AQUSER.RAW_QUE", &[("", "01")], COMMIT);
        let r1 = post("scott", "tiger", "\"order-1\"", send.clone()).await.expect("http");
        assert_eq!(r1.status().as_u16(), 200);
        assert!(r1.headers().get("idempotent-replayed").is_none());
        let body1 = r1.bytes().await.expect("body");
        let r2 = post("scott", "tiger", "\"order-1\"", send.clone()).await.expect("http");
        assert_eq!(r2.status().as_u16(), 200);
        assert_eq!(r2.headers().get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));
        assert_eq!(r2.bytes().await.expect("body"), body1, "byte for byte");
        assert_eq!(s.depth_total().await, 1, "performed once ({b:?})");
        // Keys are per agent.
        let r = post("john", "welcome", "\"order-1\"", send.clone()).await.expect("http");
        assert!(r.headers().get("idempotent-replayed").is_none());
        assert_eq!(s.depth_total().await, 2);
        // The same key for another request.
        let other = raw_send("AQUSER.RAW_QUE", &[("", "02")], COMMIT);
        let r = post("scott", "tiger", "\"order-1\"", other).await.expect("http");
        assert_eq!(r.status().as_u16(), 422);
        let f = idap::parse_response(&r.bytes().await.expect("body"), &Limits::default()).expect("fault").body;
        assert!(matches!(f, Response::Fault(ref x) if x.code == code::IDEMPOTENCY_MISMATCH), "{f:?}");
        assert_eq!(s.depth_total().await, 2);
        let r = post("scott", "tiger", "two words", send.clone()).await.expect("http");
        assert_eq!(r.status().as_u16(), 400, "a malformed key");
        // Concurrent retries: one performs, the others get its response or 409.
        let mut tasks = Vec::new();
        for _ in 0..6 {
            tasks.push(post("scott", "tiger", "order-2", send.clone()));
        }
        let mut ids = std::collections::HashSet::new();
        for r in futures_join(tasks).await {
            let r = r.expect("http");
            match r.status().as_u16() {
                200 => {
                    let body =
                        idap::parse_response(&r.bytes().await.expect("body"), &Limits::default()).expect("parse").body;
                    let Response::Send(_, Some(res)) = body else { panic!("{body:?}") };
                    ids.extend(res.message_ids);
                }
                409 => {}
                other => panic!("status {other}"),
            }
        }
        assert_eq!(ids.len(), 1, "one message id in every answer");
        assert_eq!(s.depth_total().await, 3, "performed once ({b:?})");
        // A receive under a key: its retry returns the same message and removes nothing more.
        let recv = receive("AQUSER.RAW_QUE", "<wait_time>0</wait_time>", COMMIT);
        let a = post("scott", "tiger", "take-1", recv.clone()).await.expect("http").bytes().await.expect("body");
        let b2 = post("scott", "tiger", "take-1", recv.clone()).await.expect("http").bytes().await.expect("body");
        assert_eq!(a, b2);
        assert_eq!(s.depth_total().await, 2, "one message taken ({b:?})");
    }
}

async fn futures_join<F>(fs: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}
