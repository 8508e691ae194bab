//! Tests: escaping, the LDIF parser, configuration, and one conformance suite run against
//! both backends (the LDAP one on a throwaway slapd started by `scripts/slapd.sh`).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
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

// ---- the throwaway slapd ---------------------------------------------------------------------

fn repo() -> PathBuf {
    // The repository root: two levels above this crate.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Slapd {
    dir: PathBuf,
    url: String,
    ldaps_url: String,
}

static SLAPD_SEQ: AtomicUsize = AtomicUsize::new(0);

impl Slapd {
    fn start() -> Slapd {
        let dir = std::env::temp_dir().join(format!(
            "aqgate-slapd-{}-{}",
            std::process::id(),
            SLAPD_SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let hostile = repo().join("ldap-fixtures/test-hostile.ldif");
        let url = Self::run(&["start", dir.to_str().unwrap(), hostile.to_str().unwrap()]);
        let ldaps_url = std::fs::read_to_string(dir.join("ldaps_url")).unwrap().trim().to_string();
        Slapd { dir, url: url.trim().to_string(), ldaps_url }
    }

    fn run(args: &[&str]) -> String {
        let script = repo().join("scripts/slapd.sh");
        let out = Command::new("bash").arg(&script).args(args).output().unwrap();
        assert!(out.status.success(), "slapd.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn stop(&self) {
        Self::run(&["stop", self.dir.to_str().unwrap()]);
    }

    fn restart(&self) {
        let url = Self::run(&["start", self.dir.to_str().unwrap()]);
        assert_eq!(url.trim(), self.url, "restart keeps the port");
    }

    fn config(&self, url: &str) -> DirectoryConfig {
        DirectoryConfig {
            url: Some(url.to_string()),
            bind_dn: Some(BIND_DN.to_string()),
            bind_password: Some(std::fs::read_to_string(self.dir.join("bind_password")).unwrap()),
            timeout: Duration::from_secs(2),
            ..DirectoryConfig::default()
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(repo().join("scripts/slapd.sh")).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    let slapd = Slapd::start();
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
    let slapd = Slapd::start();
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
    let slapd = Slapd::start();
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
    let slapd = Slapd::start();
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
    let slapd = Slapd::start();
    let timeout = Duration::from_millis(800);
    let cfg = DirectoryConfig { timeout, cache_ttl: Duration::ZERO, ..slapd.config(&slapd.url) };
    let d = open(&cfg).await.unwrap();
    assert_eq!(d.resolve_queue("EMPLOYEES").await, Ok("AQUSER.EMP_TOPIC".into()));
    let pid = std::fs::read_to_string(slapd.dir.join("slapd.pid")).unwrap().trim().to_string();
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    signal("-STOP");
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
