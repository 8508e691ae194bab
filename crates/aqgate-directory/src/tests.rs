//! Tests: escaping, the LDIF parser, configuration, and the LDAP client against servers
//! that never answer or are not there. The conformance suite, run against both backends
//! (the LDAP one on a throwaway slapd), is the workspace's tests/directory.rs: it shares
//! the slapd helper of the integration tests.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::dn::{normalize_dn, parse_dn};
use super::ldif::parse_ldif;
use super::*;

const HOSTILE_LDIF: &str = include_str!("../../../ldap-fixtures/test-hostile.ldif");
const SCOTT_DER: &[u8] = include_bytes!("../../../certs/scott.der");
const JOHN_DER: &[u8] = include_bytes!("../../../certs/john.der");
const BIND_DN: &str = "cn=admin,dc=aqgate,dc=example";

// ---- escaping --------------------------------------------------------------------------------

#[test]
fn filter_escaping_rfc4515() {
    assert_eq!(escape_filter_value("NEW_ORDERS"), "NEW_ORDERS");
    assert_eq!(escape_filter_value("*"), "\\2a");
    assert_eq!(escape_filter_value("a*b(c)d\\e"), "a\\2ab\\28c\\29d\\5ce");
    assert_eq!(escape_filter_value("x\0y"), "x\\00y");
    assert_eq!(escape_filter_value("KÖNIG"), "K\\c3\\96NIG");
    assert_eq!(escape_filter_value("*)(uid=*))(|(uid=*"), "\\2a\\29\\28uid=\\2a\\29\\29\\28|\\28uid=\\2a");
    // The escaped value always parses as one equality assertion.
    for v in ["*", "(", ")", "\\", "\0", "a)(objectClass=*", "é*", "\\2a"] {
        let f = format!("(cn={})", escape_filter_value(v));
        assert!(ldap3::parse_filter(&f).is_ok(), "{f}");
        assert!(!escape_filter_value(v).contains(['*', '(', ')', '\0']));
    }
}

#[test]
fn dn_escaping_rfc4514() {
    assert_eq!(escape_dn_value("scott"), "scott");
    assert_eq!(escape_dn_value("x,dc=evil"), "x\\,dc\\=evil");
    assert_eq!(escape_dn_value("a+b;c<d>e\"f\\g"), "a\\+b\\;c\\<d\\>e\\\"f\\\\g");
    assert_eq!(escape_dn_value("#x"), "\\#x");
    assert_eq!(escape_dn_value("x#"), "x#");
    assert_eq!(escape_dn_value(" a "), "\\ a\\ ");
    assert_eq!(escape_dn_value("a\0b"), "a\\00b");
    assert_eq!(escape_dn_value("KÖNIG*(x)"), "KÖNIG*(x)");
    for v in ["x,dc=evil", " lead", "trail ", "#hash", "a\\b", "a\0b", "KÖNIG", "*", "a+b=c", "\"q\"", " ", ""] {
        let dn = format!("cn={},dc=example", escape_dn_value(v));
        let parsed = parse_dn(&dn).unwrap();
        assert_eq!(parsed.len(), 2, "{dn}");
        assert_eq!(parsed[0], vec![("cn".to_string(), v.to_string())], "{dn}");
    }
}

proptest::proptest! {
    #[test]
    fn dn_escape_round_trips(v in "\\PC{0,12}|[ #,+=;<>\\\\\"\\x00a-z]{0,8}") {
        let dn = format!("uid={},ou=people", escape_dn_value(&v));
        let parsed = parse_dn(&dn).unwrap();
        proptest::prop_assert_eq!(&parsed[0], &vec![("uid".to_string(), v.clone())]);
        proptest::prop_assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn filter_escape_has_no_specials(v in "\\PC{0,16}|[*()\\\\\\x00a-z]{0,8}") {
        let e = escape_filter_value(&v);
        proptest::prop_assert!(e.is_ascii());
        proptest::prop_assert!(!e.contains(['*', '(', ')', '\0']));
        let unescaped = ldap3::ldap_unescape(&e).unwrap();
        proptest::prop_assert_eq!(unescaped.as_bytes(), v.as_bytes());
    }
}

#[test]
fn dn_parsing_and_normalisation() {
    assert_eq!(
        normalize_dn("CN=New_Orders , OU=Queues,dc=AQGATE ,dc=example").unwrap(),
        normalize_dn("cn=new_orders,ou=queues,dc=aqgate,dc=example").unwrap()
    );
    assert_eq!(normalize_dn("cn=B\\5CS").unwrap(), normalize_dn("cn=B\\\\S").unwrap());
    assert_eq!(normalize_dn("cn=a+sn=b").unwrap(), normalize_dn("sn=B+cn=A").unwrap());
    assert_eq!(parse_dn("cn=#04024869").unwrap()[0][0].1, "Hi");
    assert_eq!(parse_dn("").unwrap().len(), 0);
    assert_ne!(normalize_dn("cn=x\\,dc\\=evil").unwrap(), normalize_dn("cn=x,dc=evil").unwrap());
    for bad in ["cn", "=x", "cn=x,", "cn=a\\", "cn=a\\zz", "cn=a\"b", "c n=x", "cn=\\c3"] {
        assert!(parse_dn(bad).is_err(), "{bad:?} should not parse");
    }
}

// ---- LDIF parser -----------------------------------------------------------------------------

#[test]
fn ldif_folding_base64_comments() {
    let text = "version: 1\r\n\r\n# a comment\r\n#  folded\r\n  comment line\r\ndn: cn=x,dc=exa\r\n mple\r\nobjectClass: top\r\ncn: x\r\ndescription: a long\r\n  value\r\nsn:: S8O2bmln\r\nuserCertificate;binary:: AAEC\r\n /w==\r\n\r\n\r\n# trailing comment\r\ndn:: Y249ecOkLGRjPWV4YW1wbGU=\r\ncn:\r\nmail:   spaced@example.com\r\n";
    let recs = parse_ldif(text).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].dn, "cn=x,dc=example");
    assert_eq!(
        recs[0].attrs,
        vec![
            ("objectclass".to_string(), b"top".to_vec()),
            ("cn".to_string(), b"x".to_vec()),
            ("description".to_string(), b"a long value".to_vec()),
            ("sn".to_string(), "König".as_bytes().to_vec()),
            ("usercertificate;binary".to_string(), vec![0, 1, 2, 0xff]),
        ]
    );
    assert_eq!(recs[1].dn, "cn=yä,dc=example");
    assert_eq!(recs[1].attrs[0], ("cn".to_string(), Vec::new()));
    assert_eq!(recs[1].attrs[1], ("mail".to_string(), b"spaced@example.com".to_vec()));
}

#[test]
fn ldif_errors_name_the_line() {
    let cases = [
        ("cn: x\n", "line 1"),
        (" continued\n", "line 1"),
        ("dn: cn=x\ncn:: !!!\n", "line 2"),
        ("dn: cn=x\ncn:< file:///etc/passwd\n", "line 2"),
        ("dn: cn=x\nchangetype: delete\n", "line 2"),
        ("dn: cn=x\nno colon here\n", "line 2"),
        ("dn: cn=x\ncn: x\ndn: cn=y\n", "line 3"),
        ("version: 2\n\ndn: cn=x\n", "line 1"),
        ("dn: cn=x\nbad name: x\n", "line 2"),
    ];
    for (text, want) in cases {
        let err = parse_ldif(text).unwrap_err();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    // Duplicate DNs (after normalisation) are refused by the backend.
    let err = LdifDirectory::from_ldif("dn: cn=x,dc=e\ncn: x\n\ndn: CN=X, dc=E\ncn: x\n", "dc=e").err().unwrap();
    assert!(matches!(err, DirectoryError::Config(m) if m.contains("duplicate")));
}

#[test]
fn fixtures_parse_and_hold_the_generated_certificates() {
    let recs = parse_ldif(EMBEDDED_LDIF).unwrap();
    assert!(recs.len() >= 20, "{}", recs.len());
    let cert_of = |uid: &str| {
        let dn = format!("uid={uid},ou=people,dc=aqgate,dc=example");
        let r = recs.iter().find(|r| r.dn == dn).unwrap();
        r.attrs.iter().find(|(k, _)| k == "usercertificate;binary").unwrap().1.clone()
    };
    assert_eq!(cert_of("scott"), SCOTT_DER, "run scripts/gen-placeholder-certs.sh --update-ldif");
    assert_eq!(cert_of("john"), JOHN_DER, "run scripts/gen-placeholder-certs.sh --update-ldif");
    assert!(check_certificate(&cert_of("broken")).is_err());
    assert!(parse_ldif(HOSTILE_LDIF).unwrap().len() >= 9);
}

// ---- configuration ---------------------------------------------------------------------------

fn ldap_cfg(url: &str) -> DirectoryConfig {
    DirectoryConfig { url: Some(url.to_string()), ..DirectoryConfig::default() }
}

#[test]
fn url_rules() {
    use super::ldap::{Transport, parse_url};
    let ok = |u: &str| parse_url(u).unwrap();
    assert_eq!(ok("ldap://127.0.0.1:3890").tls, Transport::Plain);
    assert_eq!(ok("ldap://localhost").tls, Transport::Plain);
    assert_eq!(ok("ldap://[::1]:389/").tls, Transport::Plain);
    assert_eq!(ok("ldap://127.8.9.10").tls, Transport::Plain);
    assert_eq!(ok("ldaps://ldap.example.com").tls, Transport::Ldaps);
    assert_eq!(ok("ldap://ldap.example.com/????!StartTLS").tls, Transport::StartTls);
    assert_eq!(ok("ldap://10.0.0.1:389/????1.3.6.1.4.1.1466.20037").tls, Transport::StartTls);
    assert_eq!(ok("ldap://[::1]:389/????StartTLS").url, "ldap://[::1]:389");
    for bad in [
        "ldap://ldap.example.com",
        "ldap://10.0.0.1:389",
        "ldap://127.0.0.1.evil.example",
        "ldap://localhost.evil.example/",
        "ldap://[2001:db8::1]",
        "http://127.0.0.1",
        "ldapi://%2Frun%2Fslapd",
        "127.0.0.1:389",
        "ldap://",
        "ldap://127.0.0.1:99999",
        "ldap://127.0.0.1/dc=x",
        "ldap://127.0.0.1/????!bogus",
        "ldaps://h/????!StartTLS",
    ] {
        assert!(matches!(parse_url(bad), Err(DirectoryError::Config(_))), "{bad} should be refused");
    }
}

#[tokio::test]
async fn open_checks_the_configuration() {
    let err = |cfg: DirectoryConfig| async move { open(&cfg).await.err().unwrap() };
    assert!(
        matches!(err(ldap_cfg("ldap://ldap.example.com")).await, DirectoryError::Config(m) if m.contains("loopback"))
    );
    let mut cfg = ldap_cfg("ldap://127.0.0.1:1");
    cfg.bind_dn = Some(BIND_DN.to_string());
    assert!(matches!(err(cfg.clone()).await, DirectoryError::Config(_)), "bind DN without password");
    cfg.bind_password = Some(String::new());
    assert!(matches!(err(cfg.clone()).await, DirectoryError::Config(_)), "empty password");
    let mut cfg = ldap_cfg("ldaps://127.0.0.1:1");
    cfg.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
    assert!(matches!(err(cfg).await, DirectoryError::Config(_)));
    let mut cfg = ldap_cfg("ldap://127.0.0.1:1");
    cfg.base_dn = "not a dn".to_string();
    assert!(matches!(err(cfg).await, DirectoryError::Config(_)));
    let cfg = DirectoryConfig { ldif_path: Some(PathBuf::from("/nonexistent.ldif")), ..DirectoryConfig::default() };
    assert!(matches!(err(cfg).await, DirectoryError::Config(_)));
    // A valid LDAP config opens without connecting.
    assert!(open(&ldap_cfg("ldap://127.0.0.1:1")).await.is_ok());
}

#[test]
fn debug_redacts_the_password() {
    let mut cfg = ldap_cfg("ldaps://ldap.example.com");
    cfg.bind_dn = Some(BIND_DN.to_string());
    cfg.bind_password = Some("hunter2-secret".to_string());
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("<redacted>"));
    let dir = LdapDirectory::new(&cfg).unwrap();
    assert!(!format!("{dir:?}").contains("hunter2"));
}

// ---- the LDAP client without a working server -----------------------------------------------

/// A server that accepts connections and never answers: Unavailable after the timeout, not a hang.
#[tokio::test]
async fn ldap_silent_server_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let timeout = Duration::from_millis(700);
    let cfg = DirectoryConfig {
        url: Some(format!("ldap://127.0.0.1:{port}")),
        bind_dn: Some(BIND_DN.into()),
        bind_password: Some("x".into()),
        timeout,
        ..DirectoryConfig::default()
    };
    let d = open(&cfg).await.unwrap();
    for _ in 0..2 {
        let start = Instant::now();
        let r = d.resolve_agent_alias("SCOTT_ALIAS").await;
        let took = start.elapsed();
        eprintln!("silent server: {r:?} after {} ms", took.as_millis());
        assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");
        assert!(
            took >= timeout - Duration::from_millis(50) && took < timeout + Duration::from_millis(1500),
            "{took:?}"
        );
    }
    // Anonymous: the search itself hangs (no bind step).
    let cfg = DirectoryConfig { bind_dn: None, bind_password: None, ..cfg };
    let d = open(&cfg).await.unwrap();
    let start = Instant::now();
    let r = d.resolve_queue("NEW_ORDERS").await;
    assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");
    assert!(start.elapsed() < timeout + Duration::from_millis(1500));
    hold.abort();
}

/// Nothing listens: Unavailable at once.
#[tokio::test]
async fn ldap_nothing_listening() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = open(&ldap_cfg(&format!("ldap://127.0.0.1:{port}"))).await.unwrap();
    let start = Instant::now();
    let r = d.mail_address("scott").await;
    eprintln!("refused: {r:?} after {} ms", start.elapsed().as_millis());
    assert!(matches!(r, Err(DirectoryError::Unavailable(_))), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn malformed_certificates_are_malformed() {
    assert!(check_certificate(SCOTT_DER).is_ok());
    assert!(check_certificate(b"").is_err());
    assert!(check_certificate(b"not a certificate").is_err());
    assert!(check_certificate(&SCOTT_DER[..SCOTT_DER.len() - 1]).is_err());
    let mut trailing = SCOTT_DER.to_vec();
    trailing.push(0);
    assert!(check_certificate(&trailing).is_err());
}
