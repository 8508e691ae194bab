//! The servlet over HTTPS with real clients: curl (HTTP/2 by ALPN, client certificates,
//! Basic on the same listener, Secure cookies) and `openssl s_client` (the alerts a refused
//! certificate gets, the certificate reloaded on SIGHUP); plain HTTP only on loopback.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn cert(name: &str) -> String {
    format!("{ROOT}/certs/client/{name}.pem")
}

fn key(name: &str) -> String {
    format!("{ROOT}/certs/client/{name}.key.pem")
}

/// A directory of its own for one test's files.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("aqgate-test-https-{tag}-{}", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The demo directory plus an entry `uid=svc` whose userCertificate is certs/client/svc.pem
/// (a certificate without an e-mail address), and the demo topology plus agent `svc`
/// pointing at that entry.
fn directory_and_topology(dir: &Path) -> (PathBuf, PathBuf) {
    use base64::Engine as _;
    let pem = std::fs::read(cert("svc")).expect("svc.pem");
    let der = openssl::x509::X509::from_pem(&pem).expect("svc certificate").to_der().expect("der");
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut ldif = std::fs::read_to_string(format!("{ROOT}/ldap-fixtures/directory.ldif")).expect("demo LDIF");
    ldif.push_str(&format!(
        "\ndn: uid=svc,ou=people,dc=aqgate,dc=example\nobjectClass: inetOrgPerson\nuid: svc\ncn: svc\nsn: svc\n\
         userCertificate;binary:: {b64}\n"
    ));
    let ldif_path = dir.join("directory.ldif");
    std::fs::write(&ldif_path, ldif).expect("write LDIF");
    let topology = format!(
        "{}\n[[agents]]\nname = \"svc\"\nprotocols = [\"http\"]\ndb_users = [\"QS\"]\n\
         certificate_location = \"uid=svc,ou=people,dc=aqgate,dc=example\"\n",
        aqgate_admin::DEFAULT_TOPOLOGY
    );
    let topo_path = dir.join("topology.toml");
    std::fs::write(&topo_path, topology).expect("write topology");
    (ldif_path, topo_path)
}

struct Tls {
    proc: Proc,
    https: u16,
    plain: u16,
    db: String,
    dir: PathBuf,
}

/// `aqgate serve` with HTTPS on one port (client CA and CRL of certs/client/) and plain
/// HTTP on another, both on loopback; `extra` flags added.
fn serve_tls(tag: &str, server_cert: (&str, &str), extra: &[&str]) -> Tls {
    let dir = scratch(tag);
    let (ldif, topology) = directory_and_topology(&dir);
    let (https, plain) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let (listen, plain_listen) = (format!("127.0.0.1:{https}"), format!("127.0.0.1:{plain}"));
    let (ca, crl) = (cert("ca"), format!("{ROOT}/certs/client/ca.crl"));
    let mut cmd = aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db]);
    cmd.args(["--tls-cert", server_cert.0, "--tls-key", server_cert.1, "--tls-client-ca", &ca]);
    cmd.args(["--tls-client-crl", &crl, "--plain-listen", &plain_listen]);
    cmd.args(["--ldif", ldif.to_str().expect("utf-8"), "--topology", topology.to_str().expect("utf-8")]);
    cmd.args(extra);
    let mut proc = Proc::spawn("aqgate serve (https)", &mut cmd);
    proc.wait_ready(plain, Duration::from_secs(60));
    Tls { proc, https, plain, db, dir }
}

fn demo_server_cert() -> (String, String) {
    (format!("{ROOT}/certs/gateway-tls.pem"), format!("{ROOT}/certs/gateway-tls.key.pem"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e} (scripts/ensure-tools.sh installs it)"))
}

/// What curl made of one POST of `body_file` (an example) to the HTTPS port.
struct Curl {
    exit: i32,
    status: u16,
    version: String,
    headers: String,
    body: String,
    stderr: String,
}

fn curl(port: u16, client: Option<&str>, basic: Option<&str>, body_file: &str, extra: &[&str]) -> Curl {
    let dir = scratch("curl");
    let headers = dir.join("headers");
    let mut c = Command::new("curl");
    c.args(["-sS", "--cacert", &format!("{ROOT}/certs/ca.pem"), "-H", "Content-Type: text/xml"]);
    // An example's file name, or an absolute path.
    let body = if body_file.starts_with('/') { body_file.to_string() } else { format!("{ROOT}/examples/{body_file}") };
    c.args(["--data-binary", &format!("@{body}"), "-D", headers.to_str().expect("utf-8")]);
    c.args(["-w", "\n%{http_code} %{http_version}"]);
    if let Some(n) = client {
        c.args(["--cert", &cert(n), "--key", &key(n)]);
    }
    if let Some(b) = basic {
        c.args(["-u", b]);
    }
    c.args(extra);
    c.arg(format!("https://localhost:{port}/aqserv"));
    let out = run(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let mut tail = tail.split_whitespace();
    let status = tail.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let version = tail.next().unwrap_or("").to_string();
    let headers = std::fs::read_to_string(&headers).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    Curl {
        exit: out.status.code().unwrap_or(-1),
        status,
        version,
        headers,
        body: body.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

fn example_file(nn: &str) -> String {
    std::fs::read_dir(format!("{ROOT}/examples"))
        .expect("examples")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .find(|f| f.starts_with(&format!("{nn}-")))
        .unwrap_or_else(|| panic!("no example {nn}"))
}

#[test]
fn client_certificates_log_in_as_their_agent_and_basic_still_works() {
    let (c, k) = demo_server_cert();
    let s = serve_tls("login", (&c, &k), &[]);
    let send = example_file("01");
    // scott's certificate (its e-mail address is scott's directory mail): HTTP/2, no password.
    let r = curl(s.https, Some("scott"), None, &send, &[]);
    assert_eq!((r.exit, r.status), (0, 200), "{} {}", r.stderr, r.body);
    assert_eq!(r.version, "2", "ALPN chose HTTP/2");
    assert!(r.body.contains("AQXmlSendResponse") && r.body.contains("QS.NEW_ORDERS_QUE"), "{}", r.body);
    let cookie =
        r.headers.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).expect("a session cookie");
    assert!(cookie.contains("; Secure"), "cookies are Secure over TLS: {cookie}");
    // HTTP/1.1 when the client offers only that.
    let r = curl(s.https, Some("scott"), None, &send, &["--http1.1"]);
    assert_eq!((r.status, r.version.as_str()), (200, "1.1"), "{}", r.body);
    // Basic on the same listener, without a certificate.
    let r = curl(s.https, None, Some("scott:tiger"), &send, &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("AQXmlSendResponse"), "{}", r.body);
    // A certificate with no e-mail address that is svc's directory certificate logs in as
    // svc, who enqueues as QS: on that secure queue it may name scott (the example's
    // sender_id), who is enabled for QS, but not john, who is not…
    let r = curl(s.https, Some("svc"), None, &send, &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("AQXmlSendResponse"), "{}", r.body);
    let johns = s.dir.join("send-as-john.xml");
    let body = std::fs::read_to_string(format!("{ROOT}/examples/{send}"))
        .expect("the example")
        .replace("<agent_name>scott<", "<agent_name>john<");
    std::fs::write(&johns, body).expect("write");
    let r = curl(s.https, Some("svc"), None, johns.to_str().expect("utf-8"), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("agent JOHN is not enabled for database user QS, as which SVC enqueues"), "{}", r.body);
    // …and receives as svc (QS's privileges): the first of the open sends is invisible,
    // uncommitted, so the receive finds nothing — as svc, not as an unknown client.
    let r = curl(s.https, Some("svc"), None, &example_file("05"), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("25228"), "a receive as svc, nothing committed: {}", r.body);
    // Nothing was committed by any of it.
    assert_eq!(depth(&s.db, "QS.NEW_ORDERS_QUE"), 0);
    // Certificate and credentials of different agents: refused.
    let r = curl(s.https, Some("scott"), Some("john:welcome"), &send, &[]);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.body.contains("the client certificate logs in as SCOTT, the credentials as JOHN"), "{}", r.body);
    // Neither certificate nor credentials.
    assert_eq!(curl(s.https, None, None, &send, &[]).status, 401);
    // The plain listener beside HTTPS serves on loopback.
    let (st, _) = http_get(s.plain, "/healthz").expect("plain listener");
    assert_eq!(st, 200);
    drop(s.proc);
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn refused_client_certificates_get_a_clear_answer_and_change_nothing() {
    let (c, k) = demo_server_cert();
    let s = serve_tls("refused", (&c, &k), &[]);
    let send = example_file("01");
    // Refused by the mapping to agents: 401 with the reason.
    for (name, reason) in [
        ("mallory", "client certificate CN=mallory (mallory@example.com) is no agent's directory certificate"),
        ("no-eku", "client certificate CN=scott has no extendedKeyUsage (clientAuth required)"),
    ] {
        let r = curl(s.https, Some(name), None, &send, &[]);
        assert_eq!(r.status, 401, "{name}: {}", r.body);
        assert!(r.body.contains(reason), "{name}: {}", r.body);
    }
    // Refused by the handshake: no HTTP answer at all, a TLS alert naming the problem
    // (TLS 1.2, where the alert ends the handshake the client is still in), and the reason
    // in the server's log.
    for (name, alert, logged) in [
        ("expired", "certificate expired", "certificate expired"),
        ("revoked", "certificate revoked", "Revoked"),
        ("wrong-eku", "unsupported certificate", "extended key usage"),
        ("untrusted", "unknown ca", "UnknownIssuer"),
    ] {
        let r = curl(s.https, Some(name), None, &send, &[]);
        assert_ne!(r.exit, 0, "{name}: curl must fail: {}", r.body);
        assert_eq!(r.status, 0, "{name}: no HTTP answer");
        let out = run(Command::new("openssl")
            .args(["s_client", "-tls1_2", "-brief", "-connect", &format!("127.0.0.1:{}", s.https)])
            .args(["-CAfile", &format!("{ROOT}/certs/ca.pem"), "-cert", &cert(name), "-key", &key(name)])
            .stdin(std::process::Stdio::null()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(alert), "{name}: s_client should see the alert {alert:?}:\n{text}");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !s.proc.log().lines().any(|l| l.contains("TLS handshake refused") && l.contains(logged)) {
            assert!(std::time::Instant::now() < deadline, "{name}: {logged:?} not logged:\n{}", s.proc.log_tail(20));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(depth(&s.db, "QS.NEW_ORDERS_QUE"), 0);
    let r = curl(s.https, None, Some("scott:tiger"), &example_file("05"), &[]);
    assert!(r.body.contains("25228"), "nothing was enqueued by the refused requests: {}", r.body);
    drop(s.proc);
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn a_required_client_certificate_refuses_the_handshake_without_one() {
    let (c, k) = demo_server_cert();
    let s = serve_tls("required", (&c, &k), &["--require-client-cert"]);
    let send = example_file("05");
    let r = curl(s.https, None, Some("scott:tiger"), &send, &[]);
    assert_eq!(r.status, 0, "no certificate, no HTTP: {}", r.body);
    assert_ne!(r.exit, 0);
    let r = curl(s.https, Some("scott"), None, &send, &[]);
    assert_eq!(r.status, 200, "{} {}", r.stderr, r.body);
    assert!(r.body.contains("25228"), "{}", r.body);
    drop(s.proc);
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The subject of the certificate the server presents now.
fn served_subject(port: u16) -> String {
    let out = run(Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", "localhost"])
        .stdin(std::process::Stdio::null()));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no certificate served:\n{text}"))
        .to_string()
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let dir = scratch("reload");
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key.pem"));
    let (c, k) = demo_server_cert();
    std::fs::copy(&c, &cert_file).expect("copy cert");
    std::fs::copy(&k, &key_file).expect("copy key");
    let s = serve_tls("reload", (cert_file.to_str().expect("utf-8"), key_file.to_str().expect("utf-8")), &[]);
    assert!(served_subject(s.https).contains("CN = localhost"), "{}", served_subject(s.https));
    // A new certificate in place of the old one (openssl makes it), then SIGHUP.
    let out = run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/O=aqgate TEST ONLY/CN=renewed",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost", "-keyout"])
        .arg(&key_file)
        .arg("-out")
        .arg(&cert_file));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    s.proc.signal("-HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !served_subject(s.https).contains("CN = renewed") {
        assert!(std::time::Instant::now() < deadline, "not reloaded:\n{}", s.proc.log_tail(20));
        std::thread::sleep(Duration::from_millis(100));
    }
    // A broken file on the next reload keeps the certificate in use.
    std::fs::write(&cert_file, "not a certificate").expect("break the file");
    s.proc.signal("-HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !s.proc.log().contains("TLS reload failed; keeping the old certificate") {
        assert!(std::time::Instant::now() < deadline, "no reload failure logged:\n{}", s.proc.log_tail(20));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(served_subject(s.https).contains("CN = renewed"));
    drop(s.proc);
    let _ = std::fs::remove_dir_all(&s.dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plain_http_is_refused_beyond_loopback_unless_allowed() {
    let db = fresh_sqlite_url();
    let port = free_port().to_string();
    let listen = format!("0.0.0.0:{port}");
    let out = run(&mut aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("refusing plain HTTP on 0.0.0.0:{port} (--listen)")), "{err}");
    assert!(err.contains("--allow-plain-http"), "{err}");
    // Explicitly allowed, it serves.
    let mut p = Proc::spawn(
        "aqgate serve (plain allowed)",
        &mut aqgate(&[
            "serve",
            "--no-smtp",
            "--no-notify",
            "--listen",
            &listen,
            "--database",
            &db,
            "--allow-plain-http",
        ]),
    );
    p.wait_ready(port.parse().expect("port"), Duration::from_secs(60));
}

/// A client that opens a request and stops in the middle of its head (after the TLS
/// handshake, or on the plain listener) is disconnected after the request-head timeout, so
/// it holds no connection for long and a graceful shutdown does not wait for it forever.
#[test]
fn a_trickled_request_head_is_cut_off_and_does_not_hold_up_shutdown() {
    use std::io::{Read, Write};
    let (c, k) = demo_server_cert();
    let mut s = serve_tls("trickle", (&c, &k), &[]);
    let head = "POST /aqserv HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/xml\r\n";
    let mut tls = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &format!("127.0.0.1:{}", s.https)])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client (scripts/ensure-tools.sh installs it)");
    let mut tls_in = tls.stdin.take().expect("stdin");
    tls_in.write_all(head.as_bytes()).expect("write the head");
    tls_in.flush().expect("flush");
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", s.plain)).expect("connect");
    plain.write_all(head.as_bytes()).expect("write the head");
    plain.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let t = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let n = plain.read(&mut buf).expect("the server closes the connection, not the read timeout");
    assert_eq!(n, 0, "closed without an answer");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // s_client ends when the server closes the TLS connection.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tls.try_wait().expect("wait").is_none() {
        assert!(std::time::Instant::now() < deadline, "the TLS connection is still open");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Once more, and shut down meanwhile: the server exits without waiting for the client.
    let mut again = std::net::TcpStream::connect(("127.0.0.1", s.plain)).expect("connect");
    again.write_all(head.as_bytes()).expect("write the head");
    std::thread::sleep(Duration::from_millis(200));
    s.proc.signal("-TERM");
    assert!(s.proc.wait_exit(Duration::from_secs(20)).success());
    drop(tls_in);
}
