//! The directory conformance suite, run against both backends: the embedded LDIF (and an
//! LDIF file with the hostile test entries), and LDAP on a throwaway slapd
//! (`scripts/slapd.sh`, through the shared [`Slapd`] helper) — over TLS, with and without
//! bind, and while the server stops, comes back, or freezes. The directory crate's own unit
//! tests cover escaping, the LDIF parser and the configuration.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aqgate_directory::{
    AgentEntry, CertificateLocation, DEFAULT_BASE_DN, Directory, DirectoryConfig, DirectoryError, EMBEDDED_LDIF,
    LdifDirectory, escape_dn_value, open,
};
use common::Slapd;

const HOSTILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/ldap-fixtures/test-hostile.ldif");
const HOSTILE_LDIF: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/ldap-fixtures/test-hostile.ldif"));
const SCOTT_DER: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/certs/scott.der"));
const JOHN_DER: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/certs/john.der"));

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// slapd with the demo directory and the hostile test entries.
fn start_slapd() -> Slapd {
    Slapd::start_with(&[Path::new(HOSTILE)])
}

fn ldif_with_hostile() -> LdifDirectory {
    LdifDirectory::from_ldif(&format!("{EMBEDDED_LDIF}\n{HOSTILE_LDIF}"), DEFAULT_BASE_DN).unwrap()
}

// ---- the conformance suite (both backends) ---------------------------------------------------

fn not_found<T: std::fmt::Debug>(r: Result<T, DirectoryError>, what: &str) {
    assert!(matches!(r, Err(DirectoryError::NotFound(_))), "{what}: expected NotFound, got {r:?}");
}

fn subject_cn(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string()
}

/// The demo data, as every backend must serve it.
async fn conformance(d: &dyn Directory) {
    // queues: directory name -> database name, case-insensitive
    for (name, db) in [
        ("NEW_ORDERS", "QS.NEW_ORDERS_QUE"),
        ("new_orders", "QS.NEW_ORDERS_QUE"),
        ("OE_ORDERS", "OE.OE_NEW_ORDERS_QUE"),
        ("EMPLOYEES", "AQUSER.EMP_TOPIC"),
        ("JMS_TEXT", "AQUSER.JMS_TEXTQ"),
        ("RAW", "AQUSER.RAW_QUE"),
        ("AQUSER.RAW_QUE", "AQUSER.RAW_QUE"),
        ("aquser.raw_que", "AQUSER.RAW_QUE"),
    ] {
        assert_eq!(d.resolve_queue(name).await, Ok(db.to_string()), "{name}");
    }
    not_found(d.resolve_queue("QS.NEW_ORDERS_QUE").await, "database name is not a directory name");
    not_found(d.resolve_queue("NEW_ORDERS ").await, "trailing space");
    not_found(d.resolve_queue("NEW ORDERS").await, "space");
    not_found(d.resolve_queue("").await, "empty");
    not_found(d.resolve_queue("SCOTT_ALIAS").await, "an agent alias is not a queue");
    let err = d.resolve_queue("NO_SUCH_QUEUE").await.unwrap_err();
    assert!(err.to_string().contains("NO_SUCH_QUEUE"), "{err}");

    // agent aliases
    let scott = AgentEntry { name: "scott".into(), address: Some("AQUSER.EMP_TOPIC".into()), protocol: Some(0) };
    assert_eq!(d.resolve_agent_alias("SCOTT_ALIAS").await, Ok(scott.clone()));
    assert_eq!(d.resolve_agent_alias("scott_alias").await, Ok(scott));
    assert_eq!(
        d.resolve_agent_alias("JOHN_ALIAS").await,
        Ok(AgentEntry { name: "john".into(), address: Some("QS.NEW_ORDERS_QUE".into()), protocol: Some(0) })
    );
    assert_eq!(
        d.resolve_agent_alias("JOHN_NAME_ONLY").await,
        Ok(AgentEntry { name: "john".into(), address: None, protocol: None })
    );
    not_found(d.resolve_agent_alias("scott").await, "agent name is not an alias");
    not_found(d.resolve_agent_alias("NEW_ORDERS").await, "queue is not an agent alias");

    // notification aliases: exact
    assert_eq!(d.resolve_notification_alias("ORDERS_DESK").await, Ok("mailto:scott@example.com".into()));
    assert_eq!(d.resolve_notification_alias("john-notify").await, Ok("mailto:john@example.com".into()));
    not_found(d.resolve_notification_alias("orders_desk").await, "notification aliases are case-sensitive");
    not_found(d.resolve_notification_alias("JOHN-NOTIFY").await, "notification aliases are case-sensitive");

    // mail addresses
    assert_eq!(d.mail_address("scott").await, Ok(Some("scott@example.com".into())));
    assert_eq!(d.mail_address("JOHN").await, Ok(Some("john@example.com".into())));
    assert_eq!(d.mail_address("nomail").await, Ok(None));
    not_found(d.mail_address("nobody").await, "unknown agent");
    assert_eq!(d.agents_with_mail("scott@example.com").await, Ok(vec!["scott".to_string()]));
    assert_eq!(d.agents_with_mail("JOHN@Example.COM").await, Ok(vec!["john".to_string()]));
    assert_eq!(d.agents_with_mail("nobody@example.com").await, Ok(vec![]));

    // certificates
    let by_dn = |dn: &str| CertificateLocation::Dn(dn.to_string());
    let by_mail = |m: &str| CertificateLocation::Mail(m.to_string());
    assert_eq!(d.certificates(&by_dn("uid=scott,ou=people,dc=aqgate,dc=example")).await, Ok(vec![SCOTT_DER.to_vec()]));
    assert_eq!(
        d.certificates(&by_dn("UID=Scott, OU=People, DC=aqgate, DC=example")).await,
        Ok(vec![SCOTT_DER.to_vec()])
    );
    assert_eq!(d.certificates(&by_mail("john@example.com")).await, Ok(vec![JOHN_DER.to_vec()]));
    assert_eq!(d.certificates(&by_mail("John@Example.COM")).await, Ok(vec![JOHN_DER.to_vec()]));
    not_found(d.certificates(&by_dn("uid=nomail,ou=people,dc=aqgate,dc=example")).await, "entry without certificate");
    not_found(d.certificates(&by_dn("uid=nobody,ou=people,dc=aqgate,dc=example")).await, "no such entry");
    not_found(d.certificates(&by_dn("uid=scott,ou=people,dc=other,dc=example")).await, "other tree");
    not_found(d.certificates(&by_dn("not a dn")).await, "not a DN");
    not_found(d.certificates(&by_mail("nobody@example.com")).await, "unknown mail");
    for at in [by_dn("uid=broken,ou=people,dc=aqgate,dc=example"), by_mail("broken@example.com")] {
        let r = d.certificates(&at).await;
        assert!(matches!(&r, Err(DirectoryError::Malformed(m)) if m.contains("uid=broken")), "{at:?}: {r:?}");
    }
    d.invalidate();
    assert_eq!(d.resolve_queue("RAW").await, Ok("AQUSER.RAW_QUE".into()));
}

/// Names with filter and DN metacharacters, NUL and non-ASCII match only themselves.
async fn hostile(d: &dyn Directory) {
    let q = |n: &'static str, db: &'static str| (n, db);
    for (name, db) in [
        q("A*B", "AQUSER.STAR_QUE"),
        q("a*b", "AQUSER.STAR_QUE"),
        q("P(X)", "AQUSER.PAREN_QUE"),
        q("B\\S", "AQUSER.BACKSLASH_QUE"),
        q("x,dc=evil", "AQUSER.COMMA_QUE"),
        q("KÖNIG_Q", "AQUSER.KOENIG_QUE"),
        q("könig_q", "AQUSER.KOENIG_QUE"),
    ] {
        assert_eq!(d.resolve_queue(name).await, Ok(db.to_string()), "{name:?}");
    }
    for name in [
        "*",
        "A*",
        "*B",
        "A**B",
        "NEW_*",
        "*NEW_ORDERS*",
        "P(X",
        "P(X))",
        "(X)",
        "B\\\\S",
        "B\\5CS",
        "B\\5cS",
        "B",
        "\\",
        "\0",
        "RAW\0",
        "RAW\0*",
        "NEW_ORDERS)(cn=*",
        "*)(objectClass=*",
        "NEW_ORDERS))(|(cn=*",
        "x",
        "cn=x,dc=evil",
        "x\\,dc\\=evil",
        "KONIG_Q",
        "KÖNIG",
        "KÖNIG_Q\u{301}",
        "ÅGENT",
        "A\u{0}B",
    ] {
        not_found(d.resolve_queue(name).await, &format!("queue {name:?}"));
    }
    assert_eq!(d.resolve_agent_alias("AL(*)IAS").await.map(|a| a.name), Ok("star-agent".to_string()));
    assert_eq!(d.resolve_agent_alias("ÅGENT").await.map(|a| a.name), Ok("ågent".to_string()));
    assert_eq!(d.resolve_agent_alias("ågent").await.map(|a| a.name), Ok("ågent".to_string()));
    for alias in ["AL(", "AL(*", "*", "AL*", "SCOTT*", "*ALIAS", "AL(\\2a)IAS", "AGENT", "SCOTT_ALIAS\0"] {
        not_found(d.resolve_agent_alias(alias).await, &format!("alias {alias:?}"));
    }
    assert_eq!(d.resolve_notification_alias("n*tify").await, Ok("mailto:star@example.com".into()));
    for alias in ["*", "n*", "N*TIFY", "ORDERS*", "john-*"] {
        not_found(d.resolve_notification_alias(alias).await, &format!("notification alias {alias:?}"));
    }
    // people: uid and mail with metacharacters
    assert_eq!(d.mail_address("star*(agent)\\").await, Ok(Some("star*@example.com".into())));
    for agent in ["*", "s*", "star*", "star*(agent)", "sc*tt", "scott)(uid=*", "scott\0"] {
        not_found(d.mail_address(agent).await, &format!("agent {agent:?}"));
    }
    assert_eq!(d.agents_with_mail("star*@example.com").await, Ok(vec!["star*(agent)\\".to_string()]));
    for mail in ["*", "*@example.com", "s*@example.com", "scott@*", "*)(mail=*", "scott@example.com\0"] {
        assert_eq!(d.agents_with_mail(mail).await, Ok(vec![]), "mail {mail:?}");
    }
    let ca = d.certificates(&CertificateLocation::Mail("star*@example.com".into())).await.unwrap();
    assert_eq!(ca.len(), 1);
    assert!(subject_cn(&ca[0]).contains("CA"));
    for mail in ["*", "*@example.com", "s*@example.com", "scott@*", "*)(mail=*"] {
        not_found(d.certificates(&CertificateLocation::Mail(mail.into())).await, &format!("mail {mail:?}"));
    }
    // DNs built with escape_dn_value name exactly one entry
    let dn = format!("uid={},ou=people,dc=aqgate,dc=example", escape_dn_value("star*(agent)\\"));
    assert_eq!(d.certificates(&CertificateLocation::Dn(dn)).await, Ok(ca.clone()));
    for uid in ["*", "star*", "star*(agent)", "scott,ou=people", "scott\0"] {
        let dn = format!("uid={},ou=people,dc=aqgate,dc=example", escape_dn_value(uid));
        not_found(d.certificates(&CertificateLocation::Dn(dn)).await, &format!("uid {uid:?}"));
    }
    // An unescaped DN with an injected RDN is just another (non-existent) entry.
    not_found(
        d.certificates(&CertificateLocation::Dn("uid=x,dc=evil,ou=people,dc=aqgate,dc=example".into())).await,
        "injected RDN",
    );
}

#[tokio::test]
async fn conformance_ldif_embedded_default() {
    let d = open(&DirectoryConfig::default()).await.unwrap();
    conformance(d.as_ref()).await;
    // the embedded default has no test entries
    not_found(d.resolve_queue("A*B").await, "hostile entries are test-only");
}

#[tokio::test]
async fn conformance_ldif_file() {
    let path = std::env::temp_dir().join(format!("aqgate-dir-{}.ldif", std::process::id()));
    std::fs::write(&path, format!("{EMBEDDED_LDIF}\n{HOSTILE_LDIF}")).unwrap();
    let cfg = DirectoryConfig { ldif_path: Some(path.clone()), ..DirectoryConfig::default() };
    let d = open(&cfg).await.unwrap();
    let _ = std::fs::remove_file(&path);
    conformance(d.as_ref()).await;
    hostile(d.as_ref()).await;
    let direct = ldif_with_hostile();
    hostile(&direct).await;
}

#[tokio::test]
async fn conformance_ldap() {
    let slapd = start_slapd();
    let d = open(&slapd.config(&slapd.url)).await.unwrap();
    conformance(d.as_ref()).await;
    hostile(d.as_ref()).await;
    // without cache, too
    let cfg = DirectoryConfig { cache_ttl: Duration::ZERO, ..slapd.config(&slapd.url) };
    let d = open(&cfg).await.unwrap();
    conformance(d.as_ref()).await;
    hostile(d.as_ref()).await;
    // many concurrent operations share the one connection
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let d = d.clone();
            tokio::spawn(async move {
                let (name, db) =
                    if i % 2 == 0 { ("NEW_ORDERS", "QS.NEW_ORDERS_QUE") } else { ("RAW", "AQUSER.RAW_QUE") };
                assert_eq!(d.resolve_queue(name).await, Ok(db.to_string()));
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn ldap_over_tls() {
    let slapd = start_slapd();
    // ldaps:// with the test CA
    let cfg = DirectoryConfig { ca_file: Some(slapd.ca()), ..slapd.config(&slapd.ldaps_url) };
    let d = open(&cfg).await.unwrap();
    assert_eq!(d.resolve_queue("NEW_ORDERS").await, Ok("QS.NEW_ORDERS_QUE".into()));
    // StartTLS on the ldap:// port
    let url = format!("{}/????!StartTLS", slapd.url);
    let cfg = DirectoryConfig { ca_file: Some(slapd.ca()), ..slapd.config(&url) };
    let d = open(&cfg).await.unwrap();
    assert_eq!(d.resolve_agent_alias("SCOTT_ALIAS").await.map(|a| a.name), Ok("scott".into()));
    // a server certificate the client does not trust: refused, promptly
    let own_ca = repo().join("certs/ca.pem");
    for url in [slapd.ldaps_url.clone(), format!("{}/????!StartTLS", slapd.url)] {
        let cfg = DirectoryConfig { ca_file: Some(own_ca.clone()), ..slapd.config(&url) };
        let d = open(&cfg).await.unwrap();
        let start = Instant::now();
        let r = d.resolve_queue("NEW_ORDERS").await;
        assert!(matches!(r, Err(DirectoryError::Unavailable(ref m)) if m.contains("connect")), "{url}: {r:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}

#[tokio::test]
async fn ldap_bind_is_required_and_checked() {
    let slapd = start_slapd();
    let cfg = DirectoryConfig { bind_password: Some("wrong".into()), ..slapd.config(&slapd.url) };
    let r = open(&cfg).await.unwrap().resolve_queue("NEW_ORDERS").await;
    assert!(matches!(&r, Err(DirectoryError::Config(m)) if !m.contains("wrong") && m.contains("49")), "{r:?}");
    // anonymous: the test server refuses anonymous searches (insufficientAccessRights)
    let cfg = DirectoryConfig { bind_dn: None, bind_password: None, ..slapd.config(&slapd.url) };
    let r = open(&cfg).await.unwrap().resolve_queue("NEW_ORDERS").await;
    assert!(matches!(&r, Err(DirectoryError::Config(m)) if m.contains("50")), "{r:?}");
}

/// slapd stopped mid-test: Unavailable within the timeout; restarted: the same object works again.
#[tokio::test]
async fn ldap_server_stops_and_comes_back() {
    let slapd = start_slapd();
    let timeout = Duration::from_secs(2);
    let cfg = DirectoryConfig { timeout, cache_ttl: Duration::from_secs(300), ..slapd.config(&slapd.url) };
    let d = open(&cfg).await.unwrap();
    assert_eq!(d.resolve_queue("NEW_ORDERS").await, Ok("QS.NEW_ORDERS_QUE".into()));

    slapd.stop();
    // cached answers survive the outage until invalidated
    assert_eq!(d.resolve_queue("NEW_ORDERS").await, Ok("QS.NEW_ORDERS_QUE".into()));
    d.invalidate();
    for _ in 0..3 {
        let start = Instant::now();
        let r = d.resolve_queue("NEW_ORDERS").await;
        let took = start.elapsed();
        eprintln!("slapd stopped: {r:?} after {} ms", took.as_millis());
        assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");
        assert!(r.unwrap_err().is_transient());
        assert!(took < timeout + Duration::from_millis(1500), "took {took:?}");
    }
    let r = d.certificates(&CertificateLocation::Mail("scott@example.com".into())).await;
    assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");

    slapd.restart();
    let start = Instant::now();
    assert_eq!(d.resolve_queue("NEW_ORDERS").await, Ok("QS.NEW_ORDERS_QUE".into()));
    eprintln!("after restart: answered in {} ms", start.elapsed().as_millis());
    assert_eq!(d.mail_address("scott").await, Ok(Some("scott@example.com".into())));

    // A connection that dies under an open Directory (server restarted between two calls):
    // the next call reconnects transparently.
    slapd.stop();
    slapd.restart();
    d.invalidate();
    assert_eq!(d.resolve_queue("RAW").await, Ok("AQUSER.RAW_QUE".into()));
}

/// slapd frozen (SIGSTOP) under an open connection: the search times out (Unavailable within
/// the timeout), the wedged connection is dropped, and the same object recovers after SIGCONT.
#[tokio::test]
async fn ldap_server_frozen_then_thawed() {
    let slapd = start_slapd();
    let timeout = Duration::from_millis(800);
    let cfg = DirectoryConfig { timeout, cache_ttl: Duration::ZERO, ..slapd.config(&slapd.url) };
    let d = open(&cfg).await.unwrap();
    assert_eq!(d.resolve_queue("EMPLOYEES").await, Ok("AQUSER.EMP_TOPIC".into()));
    let pid = std::fs::read_to_string(slapd.dir.join("slapd.pid")).unwrap().trim().to_string();
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    signal("-STOP");
    // The stop takes effect as each of slapd's threads next enters the kernel: wait until
    // all of it is stopped, so that the search below cannot be answered first.
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T')))
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !stopped() {
        assert!(Instant::now() < deadline, "slapd did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let r = d.resolve_queue("EMPLOYEES").await;
    let took = start.elapsed();
    signal("-CONT");
    eprintln!("slapd frozen: {r:?} after {} ms", took.as_millis());
    assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");
    assert!(took >= timeout - Duration::from_millis(50) && took < timeout + Duration::from_millis(1500), "{took:?}");
    let start = Instant::now();
    assert_eq!(d.resolve_queue("EMPLOYEES").await, Ok("AQUSER.EMP_TOPIC".into()));
    eprintln!("after thaw: answered in {} ms", start.elapsed().as_millis());
}
