//! Shared test scaffolding: a fresh database per test (a SQLite file, or a new PostgreSQL
//! database on the server named by AQGATE_TEST_PG_URL), the demo topology applied, and
//! an engine with a manual clock; child processes ([`procs`]), a real slapd ([`slapd`]), a
//! real SAML IdP ([`simplesamlphp`]), private brokers to kill ([`brokers`]), a TCP proxy
//! that cuts connections ([`cutproxy`]), signed mail over SMTP under faults
//! ([`signed_mail`]), what the Messaging Gateway's tests share ([`gateway`]), IDAP over
//! HTTP ([`idap_http`]), the web console's requests ([`console`]) and a real headless
//! Chromium ([`browser`]).
#![allow(dead_code, unused_imports)]

// `idap` is the protocol crate's module here.
pub mod brokers;
pub mod browser;
pub mod console;
pub mod cutproxy;
pub mod gateway;
#[path = "idap.rs"]
mod idap_http;
mod numbered;
mod procs;
pub mod signed_mail;
mod simplesamlphp;
mod slapd;
pub mod tmpfs;

pub use idap_http::{SCOTT, aqserv, http, http_as, idap, idap_in, idap_request, parse_idap, set_cookie};
pub use numbered::{
    RAW_QUEUES, assert_exactly, demo_topology_with, drain_payloads, hex, send_numbered, write_demo_topology,
};
pub use procs::{BIN, Proc, aqgate, depth, depths, http_get, jobs, metric, wait_depth, wait_job, wait_until};
pub use simplesamlphp::SimpleSamlPhp;
pub use slapd::Slapd;

use std::sync::Arc;

use aqgate_core::clock::{Clock, ManualClock};
use aqgate_core::engine::{Engine, EngineConfig, Session};
use aqgate_core::store::Store;
use aqgate_core::topology::Topology;
use aqgate_proto::idap::{self, Limits, Request, Response};

pub const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

pub fn example(name: &str) -> String {
    let dir = std::fs::read_dir(EXAMPLES).expect("examples directory");
    for e in dir.flatten() {
        let f = e.file_name().to_string_lossy().to_string();
        if f.starts_with(name) {
            return std::fs::read_to_string(e.path()).expect("read example");
        }
    }
    panic!("no example {name}");
}

fn rand_name() -> String {
    aqgate_core::engine::session::random_id()[..12].to_string()
}

/// The PostgreSQL server the tests use. Required: the suite does not silently skip it.
pub fn pg_admin_url() -> String {
    std::env::var("AQGATE_TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A new, empty PostgreSQL database; returns its URL.
pub async fn fresh_pg_url() -> String {
    use sqlx::Connection;
    let admin = pg_admin_url();
    let name = format!("aqgate_t_{}", rand_name());
    let mut c = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| {
        panic!("PostgreSQL at {admin} is required for the store suite (scripts/ensure-postgres.sh starts one): {e}")
    });
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut c).await.expect("create database");
    let base = admin.rsplit_once('/').map(|(b, _)| b.to_string()).expect("url has a database");
    format!("{base}/{name}")
}

/// A new SQLite file in the temp directory; returns its URL.
pub fn fresh_sqlite_url() -> String {
    let p = std::env::temp_dir().join(format!("aqgate-test-{}.db", rand_name()));
    format!("sqlite://{}", p.display())
}

/// (sender agent name, enq_user_id) of every message stored in the database `url`, in
/// enqueue order: what the store's columns hold, read with SQL.
pub async fn stored_senders(url: &str) -> Vec<(Option<String>, Option<String>)> {
    use sqlx::{Connection, Row};
    let sql = "SELECT sender, enq_user_id FROM messages ORDER BY seq";
    let rows: Vec<(Option<String>, Option<String>)> = if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("open sqlite");
        let rows = sqlx::query(sql).fetch_all(&mut c).await.expect("select messages");
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect postgres");
        let rows = sqlx::query(sql).fetch_all(&mut c).await.expect("select messages");
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    rows.into_iter()
        .map(|(sender, enq)| {
            let name = sender.map(|j| {
                let v: serde_json::Value = serde_json::from_str(&j).expect("sender is JSON");
                v.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_string()
            });
            (name, enq)
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub async fn fresh_url(b: Backend) -> String {
    match b {
        Backend::Sqlite => fresh_sqlite_url(),
        Backend::Postgres => fresh_pg_url().await,
    }
}

pub async fn store_with_topology(url: &str, topology: &str) -> Arc<dyn Store> {
    let store = aqgate_store::open(url).await.expect("open store");
    let t = Topology::from_toml(topology).expect("topology parses");
    aqgate_admin::apply(store.as_ref(), &t, false).await.expect("apply topology");
    store
}

pub struct Harness {
    pub engine: Arc<Engine>,
    pub clock: Arc<ManualClock>,
    pub url: String,
}

pub const T0: i64 = 1_780_000_000_000_000;

impl Harness {
    pub async fn new(b: Backend) -> Self {
        Self::with_topology(b, aqgate_admin::DEFAULT_TOPOLOGY).await
    }

    pub async fn with_topology(b: Backend, topology: &str) -> Self {
        Self::with_config(b, topology, EngineConfig::default()).await
    }

    /// With the embedded (LDIF) demo directory.
    pub async fn with_directory(b: Backend) -> Self {
        let dir = aqgate_directory::open(&Default::default()).await.expect("embedded directory");
        Self::with_config(
            b,
            aqgate_admin::DEFAULT_TOPOLOGY,
            EngineConfig { directory: Some(dir), ..Default::default() },
        )
        .await
    }

    pub async fn with_config(b: Backend, topology: &str, config: EngineConfig) -> Self {
        let url = fresh_url(b).await;
        let store = store_with_topology(&url, topology).await;
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::start(store, clock.clone() as Arc<dyn Clock>, config).await.expect("engine");
        Self { engine, clock, url }
    }

    pub fn session(&self, agent: &str) -> Session {
        Session::new(&agent.to_ascii_uppercase(), self.clock.now())
    }

    /// Parses `xml` and executes it; a Fault comes back as `Err(code)`.
    pub async fn run(&self, s: &mut Session, xml: &str) -> Result<Response, (i32, String)> {
        let req = idap::parse_request(xml.as_bytes(), &Limits::default()).expect("request parses").body;
        self.exec(s, req).await
    }

    pub async fn exec(&self, s: &mut Session, req: Request) -> Result<Response, (i32, String)> {
        self.engine.execute(s, req).await.map_err(|e| (e.code, e.message))
    }
}

/// `<Envelope><Body>{inner}</Body></Envelope>` in the reference's namespaces.
pub fn envelope(inner: &str) -> String {
    format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body>{inner}</Body></Envelope>"#
    )
}

/// An AQXmlSend of RAW payloads to AQUSER.RAW_QUE with optional header XML per message.
pub fn raw_send(dest: &str, msgs: &[(&str, &str)], extra: &str) -> String {
    let mut set = format!("<message_count>{}</message_count>", msgs.len());
    for (i, (hdr, hex)) in msgs.iter().enumerate() {
        set.push_str(&format!(
            "<message><message_number>{}</message_number><message_header>{hdr}</message_header><message_payload><raw>{hex}</raw></message_payload></message>",
            i + 1
        ));
    }
    envelope(&format!(
        r#"<AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{dest}</destination></producer_options><message_set>{set}</message_set>{extra}</AQXmlSend>"#
    ))
}

pub fn receive(dest: &str, opts: &str, extra: &str) -> String {
    envelope(&format!(
        r#"<AQXmlReceive xmlns="http://ns.oracle.com/AQ/schemas/access"><consumer_options><destination>{dest}</destination>{opts}</consumer_options>{extra}</AQXmlReceive>"#
    ))
}

pub const COMMIT: &str = r#"<AQXmlCommit xmlns="http://ns.oracle.com/AQ/schemas/access"/>"#;
pub const ROLLBACK: &str = r#"<AQXmlRollback xmlns="http://ns.oracle.com/AQ/schemas/access"/>"#;

/// The messages of a receive response.
pub fn received(r: &Response) -> Vec<idap::Message> {
    match r {
        Response::Receive(_, Some(res)) => res.messages.clone(),
        other => panic!("not a receive result: {other:?}"),
    }
}

pub fn raw_of(m: &idap::Message) -> String {
    m.payload.text()
}

pub fn sent_ids(r: &Response) -> Vec<String> {
    match r {
        Response::Send(_, Some(res)) | Response::Publish(_, Some(res)) => res.message_ids.clone(),
        other => panic!("not an enqueue result: {other:?}"),
    }
}

/// Example 01 with its destination looked up in the directory (`NEW_ORDERS` names
/// QS.NEW_ORDERS_QUE there) and its sender given as an agent alias.
pub fn example01_via_directory() -> String {
    example("01")
        .replace(
            "<destination>QS.NEW_ORDERS_QUE</destination>",
            r#"<destination lookup_type="LDAP">NEW_ORDERS</destination>"#,
        )
        .replace("<agent_name>scott</agent_name>", "<agent_alias>SCOTT_ALIAS</agent_alias>")
}

/// A spooled mail from scott, as the SMTP filter would store it.
pub fn spooled(message_id: &str, idap: &str) -> aqgate_core::store::SpooledMail {
    aqgate_core::store::SpooledMail {
        id: 0,
        received_at: T0,
        agent: "SCOTT".into(),
        message_id: message_id.into(),
        dedupe_key: format!("digest-of-{message_id}"),
        reply_to: "scott@example.com".into(),
        subject: Some("new order".into()),
        idap: idap.as_bytes().to_vec(),
        state: String::new(),
        attempts: 0,
        response: None,
        last_error: None,
        replies_wanted: 0,
        replies_sent: 0,
        resend_message_id: None,
        encrypt_to: None,
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Below the kernel's ephemeral range (from which bind(0) and every outgoing connection
    // take their ports): a port handed out here and bound by a server a moment later cannot
    // have been taken meanwhile by some other test's client connection, and a counter
    // hands each port out once per test process (test binaries run one after another).
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()))
        .unwrap_or(32768);
    const FIRST: u32 = 20_000;
    if low < FIRST + 1_000 {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
    }
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = low - FIRST;
    let _ = NEXT.compare_exchange(u32::MAX, std::process::id() % span, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let port = u16::try_from(FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % span).expect("a port below 65536");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {FIRST} and {low}")
}

/// Waits (at most 30 s) until something listens on 127.0.0.1:`port`.
pub fn wait_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A mail as a test reads it: the mail as it is, then the XML of its text/xml part with
/// the transfer encoding undone (replies are S/MIME-signed, their XML base64-encoded).
pub fn readable(mail: &str) -> String {
    match aqgate_mail::extract::idap_document(mail.as_bytes()) {
        Ok(xml) => format!("{mail}\n{}", String::from_utf8_lossy(&xml)),
        Err(_) => mail.to_string(),
    }
}
