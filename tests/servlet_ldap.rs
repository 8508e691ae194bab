//! The servlet with a real OpenLDAP directory (slapd started by scripts/slapd.sh): an
//! example rewritten with `lookup_type="LDAP"` and `agent_alias` works end to end; the
//! directory going away gives a temporary fault within the timeout, and coming back
//! needs no restart.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::error::code;
use aqgate_directory::DirectoryConfig;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::{Limits, Response};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_destination_and_agent_alias_end_to_end_with_slapd() {
    let slapd = Slapd::start();
    let cfg = DirectoryConfig { cache_ttl: Duration::ZERO, ..slapd.config(&slapd.url) };
    let directory = aqgate_directory::open(&cfg).await.expect("ldap directory");

    let db = fresh_sqlite_url();
    let store = store_with_topology(&db, aqgate_admin::DEFAULT_TOPOLOGY).await;
    let config = EngineConfig { directory: Some(directory), ..Default::default() };
    let engine = Engine::start(store, Arc::new(SystemClock), config).await.expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app(AppState::new(engine, Limits::default()))).await });

    let send = example01_via_directory().replace("</message_set>", "</message_set><AQXmlCommit/>");
    let r = http(port, &send).await;
    assert!(matches!(&r, Response::Send(_, Some(x)) if x.destination == "QS.NEW_ORDERS_QUE"), "{r:?}");
    let recv = example("07").replace(
        "<destination>QS.NEW_ORDERS_QUE</destination>",
        r#"<destination lookup_type="LDAP">NEW_ORDERS</destination>"#,
    );
    let r = http(port, &recv).await;
    let m = &received(&r)[0];
    assert_eq!(m.header.correlation.as_deref(), Some("HLB-4471"));
    assert_eq!(m.header.sender_id.as_ref().and_then(|s| s.name.as_deref()), Some("scott"), "alias resolved by slapd");

    // The directory goes away: a temporary (server) fault, within the timeout, nothing enqueued.
    slapd.stop();
    let t = Instant::now();
    let r = http(port, &send).await;
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
    match r {
        Response::Fault(f) => {
            assert_eq!(f.code, code::DIRECTORY_UNAVAILABLE, "{f:?}");
            assert_eq!(f.kind, aqgate_proto::idap::FaultKind::Server);
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    // It comes back: no restart needed.
    slapd.restart();
    let r = http(port, &send).await;
    assert!(matches!(r, Response::Send(..)), "{r:?}");
    let r = http(port, &recv).await;
    assert_eq!(received(&r).len(), 1, "exactly the one message sent after recovery");
    let r = http(port, &recv).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == code::NO_MESSAGE), "{r:?}");
    // Stopped before its directory (which holds its pid file) goes.
    slapd.stop();
    drop(slapd);
}
