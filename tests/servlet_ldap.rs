//! The servlet with a real OpenLDAP directory (slapd started by scripts/slapd.sh): an
//! example rewritten with `lookup_type="LDAP"` and `agent_alias` works end to end; the
//! directory going away gives a temporary fault within the timeout, and coming back
//! needs no restart.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aqgate::servlet::{AppState, app};
use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_directory::DirectoryConfig;
use aqgate_proto::idap::{self, Limits, Response};
use common::*;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/slapd.sh");

struct Slapd(PathBuf);

impl Slapd {
    fn start(dir: &Path) -> String {
        let out = Command::new("bash").arg(SCRIPT).arg("start").arg(dir).output().expect("run slapd.sh");
        assert!(out.status.success(), "slapd.sh start: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().last().expect("url").trim().to_string()
    }
    fn stop(dir: &Path) {
        let out = Command::new("bash").arg(SCRIPT).arg("stop").arg(dir).output().expect("run slapd.sh");
        assert!(out.status.success(), "slapd.sh stop: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(SCRIPT).arg("stop").arg(&self.0).output();
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &str) -> Response {
    let r = http
        .post(url)
        .basic_auth("scott", Some("tiger"))
        .header("content-type", "text/xml")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    idap::parse_response(r.text().await.expect("body").as_bytes(), &Limits::default()).expect("parse").body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_destination_and_agent_alias_end_to_end_with_slapd() {
    let dir = std::env::temp_dir().join(format!("aqgate-slapd-{}", aqgate_core::engine::session::random_id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let guard = Slapd(dir.clone());
    let ldap_url = Slapd::start(&dir);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("slapd file").trim().to_string();
    let cfg = DirectoryConfig {
        url: Some(ldap_url),
        bind_dn: Some(read("bind_dn")),
        bind_password: Some(read("bind_password")),
        timeout: Duration::from_secs(2),
        cache_ttl: Duration::ZERO,
        ..Default::default()
    };
    let directory = aqgate_directory::open(&cfg).await.expect("ldap directory");

    let db = fresh_sqlite_url();
    let store = store_with_topology(&db, aqgate::DEFAULT_TOPOLOGY).await;
    let config = EngineConfig { directory: Some(directory), ..Default::default() };
    let engine = Engine::start(store, Arc::new(SystemClock), config).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/aqserv", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app(AppState::new(engine, Limits::default()))).await });
    let http = reqwest::Client::new();

    let send = example01_via_directory().replace("</message_set>", "</message_set><AQXmlCommit/>");
    let r = post(&http, &url, &send).await;
    assert!(matches!(&r, Response::Send(_, Some(x)) if x.destination == "QS.NEW_ORDERS_QUE"), "{r:?}");
    let recv = example("07").replace(
        "<destination>QS.NEW_ORDERS_QUE</destination>",
        r#"<destination lookup_type="LDAP">NEW_ORDERS</destination>"#,
    );
    let r = post(&http, &url, &recv).await;
    let m = &received(&r)[0];
    assert_eq!(m.header.correlation.as_deref(), Some("HLB-4471"));
    assert_eq!(m.header.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("scott"), "alias resolved by slapd");

    // The directory goes away: a temporary (server) fault, within the timeout, nothing enqueued.
    Slapd::stop(&dir);
    let t = Instant::now();
    let r = post(&http, &url, &send).await;
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
    match r {
        Response::Fault(f) => {
            assert_eq!(f.code, code::DIRECTORY_UNAVAILABLE, "{f:?}");
            assert_eq!(f.kind, aqgate_proto::idap::FaultKind::Server);
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    // It comes back: no restart needed.
    Slapd::start(&dir);
    let r = post(&http, &url, &send).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let r = post(&http, &url, &recv).await;
    assert_eq!(received(&r).len(), 1, "exactly the one message sent after recovery");
    let r = post(&http, &url, &recv).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == code::NO_MESSAGE), "{r:?}");
    // Stop slapd before its directory (which holds its pid file) goes.
    Slapd::stop(&dir);
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
