//! Unit tests of smime.

#![allow(clippy::unwrap_used)]
use super::sign::{base64_lines, rfc5322_date};
use super::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const CA_PEM: &[u8] = include_bytes!("../../../../certs/ca.pem");
const CA_CRL: &[u8] = include_bytes!("../../../../certs/ca.crl");
const CA_KEY: &[u8] = include_bytes!("../../../../certs/ca.key.pem");
const OTHER_CA_PEM: &[u8] = include_bytes!("../../../../certs/other-ca.pem");
const OTHER_CA_KEY: &[u8] = include_bytes!("../../../../certs/other-ca.key.pem");
const SCOTT_PEM: &[u8] = include_bytes!("../../../../certs/scott.pem");
const SCOTT_KEY: &[u8] = include_bytes!("../../../../certs/scott.key.pem");
const SCOTT_DER: &[u8] = include_bytes!("../../../../certs/scott.der");
const JOHN_PEM: &[u8] = include_bytes!("../../../../certs/john.pem");
const JOHN_KEY: &[u8] = include_bytes!("../../../../certs/john.key.pem");
const JOHN_DER: &[u8] = include_bytes!("../../../../certs/john.der");
const EXPIRED_PEM: &[u8] = include_bytes!("../../../../certs/expired.pem");
const EXPIRED_KEY: &[u8] = include_bytes!("../../../../certs/expired.key.pem");
const EXPIRED_DER: &[u8] = include_bytes!("../../../../certs/expired.der");
const WRONG_EKU_PEM: &[u8] = include_bytes!("../../../../certs/wrong-eku.pem");
const WRONG_EKU_KEY: &[u8] = include_bytes!("../../../../certs/wrong-eku.key.pem");
const WRONG_EKU_DER: &[u8] = include_bytes!("../../../../certs/wrong-eku.der");
const REVOKED_PEM: &[u8] = include_bytes!("../../../../certs/revoked.pem");
const REVOKED_KEY: &[u8] = include_bytes!("../../../../certs/revoked.key.pem");
const REVOKED_DER: &[u8] = include_bytes!("../../../../certs/revoked.der");
const OTHER_SCOTT_PEM: &[u8] = include_bytes!("../../../../certs/other-ca-scott.pem");
const OTHER_SCOTT_KEY: &[u8] = include_bytes!("../../../../certs/other-ca-scott.key.pem");
const OTHER_SCOTT_DER: &[u8] = include_bytes!("../../../../certs/other-ca-scott.der");
const GATEWAY_TLS_PEM: &[u8] = include_bytes!("../../../../certs/gateway-tls.pem");
const GATEWAY_SMIME_PEM: &[u8] = include_bytes!("../../../../certs/gateway-smime.pem");
const GATEWAY_SMIME_KEY: &[u8] = include_bytes!("../../../../certs/gateway-smime.key.pem");
const SCOTT_EC_PEM: &[u8] = include_bytes!("../../../../certs/scott-ec.pem");
const SCOTT_EC_KEY: &[u8] = include_bytes!("../../../../certs/scott-ec.key.pem");
const SCOTT_EC_DER: &[u8] = include_bytes!("../../../../certs/scott-ec.der");
const SCOTT_PSS_PEM: &[u8] = include_bytes!("../../../../certs/scott-pss.pem");
const SCOTT_PSS_KEY: &[u8] = include_bytes!("../../../../certs/scott-pss.key.pem");
const SCOTT_PSS_DER: &[u8] = include_bytes!("../../../../certs/scott-pss.der");
const SUB_CA_PEM: &[u8] = include_bytes!("../../../../certs/sub-ca.pem");
const SUB_CA_CRL: &[u8] = include_bytes!("../../../../certs/sub-ca.crl");
const SUB_SCOTT_PEM: &[u8] = include_bytes!("../../../../certs/sub-ca-scott.pem");
const SUB_SCOTT_KEY: &[u8] = include_bytes!("../../../../certs/sub-ca-scott.key.pem");
const SUB_SCOTT_DER: &[u8] = include_bytes!("../../../../certs/sub-ca-scott.der");
const SUB_REVOKED_PEM: &[u8] = include_bytes!("../../../../certs/sub-ca-revoked.pem");
const SUB_REVOKED_KEY: &[u8] = include_bytes!("../../../../certs/sub-ca-revoked.key.pem");
const SUB_REVOKED_DER: &[u8] = include_bytes!("../../../../certs/sub-ca-revoked.der");

const IDAP: &str = "<?xml version=\"1.0\"?>\r\n<Envelope xmlns=\"http://schemas.xmlsoap.org/soap/envelope/\">\r\n\
                    <Body><AQXmlSend xmlns=\"http://ns.oracle.com/AQ/schemas/access\"><queue_name>scott_queue\
                    </queue_name></AQXmlSend></Body></Envelope>";
const HEADERS: &str = "From: Scott <scott@example.com>\nTo: aq@example.com\nSubject: IDAP request\n\
                       Message-ID: <req-1@example.com>\nReply-To: replies@example.com\n";

/// Inside every test certificate's validity and after the CRL's lastUpdate, derived from the
/// files so that regenerating them keeps the tests valid; and not before the system time,
/// which is the signingTime of what openssl, gpgsm and `sign` sign here.
fn now() -> i64 {
    let crl = X509Crl::from_pem(CA_CRL).unwrap();
    let mut latest = unix(crl.last_update());
    for pem in [SCOTT_PEM, JOHN_PEM, WRONG_EKU_PEM, REVOKED_PEM, OTHER_SCOTT_PEM, SCOTT_EC_PEM, SUB_SCOTT_PEM] {
        latest = latest.max(unix(X509::from_pem(pem).unwrap().not_before()));
    }
    (latest + 3600).max(system_time())
}

fn system_time() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

fn unix(time: &openssl::asn1::Asn1TimeRef) -> i64 {
    asn1_unix(time).unwrap()
}

fn trust() -> TrustStore {
    TrustStore::from_pem(&[CA_PEM], &[CA_CRL]).unwrap()
}

fn gateway() -> GatewayIdentity {
    GatewayIdentity::from_pem(GATEWAY_SMIME_PEM, GATEWAY_SMIME_KEY).unwrap()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("aqgate-smime-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(program: &str, args: &[&Path], what: &str, env: &[(&str, &Path)]) -> Vec<u8> {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let mut command = Command::new(program);
    command.args(&args).stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap_or_else(|e| panic!("{what}: cannot run {program}: {e}"));
    assert!(output.status.success(), "{what}: {program} failed: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

fn entity() -> Vec<u8> {
    format!("Content-Type: text/xml; charset=utf-8\r\n\r\n{IDAP}").into_bytes()
}

/// `openssl <tool> -sign` of `entity` by `signer`; `extra` are further arguments.
fn openssl_sign(tool: &str, signers: &[(&[u8], &[u8])], entity: &[u8], extra: &[&str]) -> Vec<u8> {
    let dir = TempDir::new();
    let input = dir.file("in.eml", entity);
    let mut args: Vec<PathBuf> = vec![tool.into(), "-sign".into(), "-in".into(), input];
    for (i, (cert, key)) in signers.iter().enumerate() {
        args.push("-signer".into());
        args.push(dir.file(&format!("signer{i}.pem"), cert));
        args.push("-inkey".into());
        args.push(dir.file(&format!("signer{i}.key.pem"), key));
    }
    args.extend(extra.iter().map(PathBuf::from));
    let args: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
    run("openssl", &args, "openssl sign", &[])
}

fn mail(headers: &str, smime: &[u8]) -> Vec<u8> {
    let mut out = headers.as_bytes().to_vec();
    out.extend_from_slice(smime);
    out
}

fn scott_detached() -> Vec<u8> {
    mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]))
}

fn verify_as(raw: &[u8], cert: &[u8]) -> Verdict {
    verify(raw, &[cert.to_vec()], &trust(), now())
}

fn assert_pass(verdict: Verdict) -> Verified {
    match verdict {
        Verdict::Pass(verified) => {
            assert_eq!(verified.from, "scott@example.com");
            assert_eq!(String::from_utf8_lossy(&verified.idap).trim_end(), IDAP);
            *verified
        }
        other => panic!("expected Pass, got {other:?}"),
    }
}

fn assert_fail(verdict: Verdict, needle: &str) {
    match verdict {
        Verdict::Fail(reason) => assert!(reason.contains(needle), "reason {reason:?} lacks {needle:?}"),
        other => panic!("expected Fail containing {needle:?}, got {other:?}"),
    }
}

/// A refusal (Fail or PermError: both are 550 5.7.1) that says `needle`.
fn assert_refused(verdict: Verdict, needle: &str) {
    match verdict {
        Verdict::Fail(reason) | Verdict::PermError(reason) => {
            assert!(reason.contains(needle), "reason {reason:?} lacks {needle:?}")
        }
        other => panic!("expected a refusal containing {needle:?}, got {other:?}"),
    }
}

/// gpgsm (GnuPG's S/MIME) with a throwaway home: scott's key imported, the test CA trusted.
/// Returns base64 (no PEM armour) of the signature of `entity`.
/// gpgsm now and then (a freshly started agent, ~1 run in 20 in parallel tests) loses the
/// imported key or certificate ("No secret key", "No public key"): the whole import and
/// signing is tried again in a fresh home, up to three times.
fn gpgsm_sign(entity: &[u8], detached: bool) -> String {
    let mut last = String::new();
    for _ in 0..3 {
        match gpgsm_sign_once(entity, detached) {
            Ok(signature) => return signature,
            Err(why) => last = why,
        }
    }
    panic!("gpgsm sign failed three times: {last}");
}

fn gpgsm_sign_once(entity: &[u8], detached: bool) -> Result<String, String> {
    let dir = TempDir::new();
    let home = dir.0.join("gnupg");
    std::fs::create_dir_all(&home).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::fs::write(home.join("gpg-agent.conf"), "allow-loopback-pinentry\n").unwrap();
    let fingerprint = X509::from_pem(CA_PEM).unwrap().digest(openssl::hash::MessageDigest::sha1()).unwrap();
    let fingerprint: Vec<String> = fingerprint.iter().map(|b| format!("{b:02X}")).collect();
    std::fs::write(home.join("trustlist.txt"), format!("{} S relax\n", fingerprint.join(":"))).unwrap();
    let cert = dir.file("scott.pem", SCOTT_PEM);
    let key = dir.file("scott.key.pem", SCOTT_KEY);
    let p12 = dir.0.join("scott.p12");
    // gpgsm 2.2 reads only the classic PKCS#12 encryption; empty password, no prompt.
    run(
        "openssl",
        &[
            p("pkcs12"),
            p("-export"),
            p("-in"),
            &cert,
            p("-inkey"),
            &key,
            p("-out"),
            &p12,
            p("-passout"),
            p("pass:"),
            p("-certpbe"),
            p("PBE-SHA1-3DES"),
            p("-keypbe"),
            p("PBE-SHA1-3DES"),
            p("-macalg"),
            p("sha1"),
        ],
        "pkcs12 export",
        &[],
    );
    let env = [("GNUPGHOME", home.as_path())];
    let ca = dir.file("ca.pem", CA_PEM);
    run("gpgsm", &[p("--batch"), p("--import"), &ca], "gpgsm import CA", &env);
    // gpgsm exits 2 after a successful PKCS#12 import (it ignores the agent's passphrase
    // inquiries), and now and then (a freshly started agent, ~1 run in 20) the secret
    // key does not arrive: import until gpgsm lists it.
    for _ in 0..5 {
        let _ = Command::new("gpgsm")
            .args([p("--batch"), p("--pinentry-mode"), p("loopback"), p("--import"), &p12])
            .env("GNUPGHOME", &home)
            .stdin(Stdio::null())
            .output()
            .expect("gpgsm must be installed (GnuPG's S/MIME implementation)");
        let secret = run("gpgsm", &[p("--batch"), p("--with-colons"), p("--list-secret-keys")], "gpgsm list", &env);
        if String::from_utf8_lossy(&secret).lines().any(|l| l.starts_with("crs:")) {
            break;
        }
    }
    let input = dir.file("in.eml", entity);
    let out = dir.0.join("sig.b64");
    let mode = if detached { "--detach-sign" } else { "--sign" };
    let signed = Command::new("gpgsm")
        .args([
            p("--batch"),
            p("--pinentry-mode"),
            p("loopback"),
            p("--disable-crl-checks"),
            p("--disable-policy-checks"),
            p("--local-user"),
            p("scott@example.com"),
            p("--base64"),
            p("--output"),
            &out,
            p(mode),
            &input,
        ])
        .env("GNUPGHOME", &home)
        .stdin(Stdio::null())
        .output()
        .expect("gpgsm must be installed (GnuPG's S/MIME implementation)");
    let _ = Command::new("gpgconf").args(["--kill", "gpg-agent"]).env("GNUPGHOME", &home).output();
    if !signed.status.success() {
        return Err(String::from_utf8_lossy(&signed.stderr).into_owned());
    }
    Ok(String::from_utf8(std::fs::read(&out).unwrap()).unwrap())
}

// ---- passing mail -------------------------------------------------------------------------

#[test]
fn openssl_detached_passes_with_headers() {
    let verified = assert_pass(verify_as(&scott_detached(), SCOTT_DER));
    assert_eq!(verified.message_id.as_deref(), Some("req-1@example.com"));
    assert_eq!(verified.reply_to.as_deref(), Some("replies@example.com"));
    assert_eq!(verified.subject.as_deref(), Some("IDAP request"));
}

#[test]
fn openssl_detached_without_embedded_certificate_passes() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nocerts"]));
    assert_pass(verify_as(&raw, SCOTT_DER));
}

#[test]
fn openssl_opaque_passes() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
    assert!(String::from_utf8_lossy(&raw).contains("application/x-pkcs7-mime"));
    assert_pass(verify_as(&raw, SCOTT_DER));
}

#[test]
fn crlf_mail_passes() {
    let raw = String::from_utf8(scott_detached()).unwrap().replace("\r\n", "\n").replace('\n', "\r\n");
    assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
}

#[test]
fn gpgsm_opaque_passes() {
    let signature = gpgsm_sign(&entity(), false);
    let raw = format!(
        "{HEADERS}MIME-Version: 1.0\nContent-Type: application/pkcs7-mime; smime-type=signed-data; \
         name=\"smime.p7m\"\nContent-Transfer-Encoding: base64\nContent-Disposition: attachment; \
         filename=\"smime.p7m\"\n\n{signature}"
    );
    assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
}

#[test]
fn gpgsm_detached_passes() {
    let signature = gpgsm_sign(&entity(), true);
    let raw = format!(
        "{HEADERS}MIME-Version: 1.0\r\nContent-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; \
         micalg=sha-256; boundary=\"gpgsm-b\"\r\n\r\n--gpgsm-b\r\n{}\r\n--gpgsm-b\r\nContent-Type: \
         application/pkcs7-signature\r\nContent-Transfer-Encoding: base64\r\n\r\n{signature}\r\n--gpgsm-b--\r\n",
        String::from_utf8(entity()).unwrap()
    );
    assert_pass(verify_as(raw.as_bytes(), SCOTT_DER));
}

#[test]
fn split_signed_canonicalises_like_openssl() {
    let body = b"preamble\n--b\nContent-Type: text/plain\n\nline 1\r\nline 2\r\r\n\n--bb not ours\n--b  \r\nsig\n--b--\r\nepilogue";
    let (content, signature) = split_signed(body, "b").unwrap();
    assert_eq!(content, b"Content-Type: text/plain\r\n\r\nline 1\r\nline 2\r\n\r\n--bb not ours");
    assert_eq!(signature, b"sig\n");
    // Without a close delimiter the second part runs to the end.
    assert_eq!(split_signed(b"--b\na\n--b\nsig", "b").unwrap(), (b"a".to_vec(), &b"sig"[..]));
    for (body, parts) in [(&b"--b\na\n--b--\n"[..], 1), (b"--b\na\n--b\nb\n--b\nc\n--b--\n", 3), (b"no delimiter", 0)] {
        let Err(Verdict::PermError(why)) = split_signed(body, "b") else { panic!("{body:?} split") };
        assert!(why.contains(&format!("has {parts} parts")), "{why}");
    }
}

#[test]
fn embedded_certificates_are_dropped_before_parsing() {
    let raw = scott_detached();
    let message = MessageParser::default().parse(&raw).unwrap();
    let root = message.root_part();
    let body = &raw[root.raw_body_offset() as usize..];
    let (content, part) = split_signed(body, root.content_type().unwrap().attribute("boundary").unwrap()).unwrap();
    let der = signature_der(part).unwrap();
    assert_eq!(signed_data(&der).unwrap().certificates.len(), 1);
    let stripped = without_certificates(&der).expect("openssl's DER is stripped");
    assert!(stripped.len() < der.len() - 500, "{} vs {}", stripped.len(), der.len());
    assert!(signed_data(&stripped).unwrap().certificates.is_empty());
    assert_eq!(signer_info_count(&stripped), Ok(1));
    // What remains still verifies against the directory certificate alone.
    let mut certs = Stack::new().unwrap();
    certs.push(X509::from_der(SCOTT_DER).unwrap()).unwrap();
    let flags = CMSOptions::NOINTERN | CMSOptions::NO_SIGNER_CERT_VERIFY;
    let mut without = CmsContentInfo::from_der(&stripped).unwrap();
    without.verify(Some(&certs), None, Some(&content), None, flags).unwrap();
    let mut altered = content.clone();
    altered[40] ^= 1;
    assert!(without.verify(Some(&certs), None, Some(&altered), None, flags).is_err());
    // Already without certificates, not DER, or something else: left to OpenSSL whole.
    assert_eq!(without_certificates(&stripped), None);
    assert_eq!(without_certificates(&[0x30, 0x80, 0x06, 0x00, 0x00, 0x00]), None);
    assert_eq!(without_certificates(b"garbage"), None);
}

#[test]
fn opaque_without_transfer_encoding_header_passes() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
    let text = String::from_utf8(raw).unwrap();
    let without: String =
        text.lines().filter(|l| !l.starts_with("Content-Transfer-Encoding")).map(|l| format!("{l}\n")).collect();
    assert_ne!(without, text);
    assert_pass(verify_as(without.as_bytes(), SCOTT_DER));
}

#[test]
fn second_part_must_be_a_pkcs7_signature() {
    let text = String::from_utf8(scott_detached()).unwrap();
    let raw = text.replacen("Content-Type: application/x-pkcs7-signature", "Content-Type: text/plain", 1);
    assert_ne!(raw, text);
    match verify_as(raw.as_bytes(), SCOTT_DER) {
        Verdict::PermError(why) => assert!(why.contains("text/plain, not application/pkcs7-signature"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_remembered_chain_still_expires() {
    let trust = trust();
    let scott = X509::from_pem(SCOTT_PEM).unwrap();
    let (not_before, not_after) = (unix(scott.not_before()), unix(scott.not_after()));
    let raw = scott_detached();
    let at = |t: i64| verify(&raw, &[SCOTT_DER.to_vec()], &trust, t);
    assert_pass(at(now()));
    assert_eq!(trust.chains.lock().unwrap().len(), 1, "the chain is remembered");
    assert_pass(at(now() + 60));
    assert_fail(at(not_after + 1), "expired");
    assert_fail(at(not_before - 1), "not yet valid");
    assert_pass(at(now()));
}

#[test]
fn own_sign_output_passes_here_and_in_openssl_cli() {
    let raw = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "Grüße").unwrap();
    let text = String::from_utf8(raw.clone()).unwrap();
    assert!(text.replace("\r\n", "").find('\n').is_none(), "CRLF line endings only");
    for header in ["From: ", "To: ", "Subject: ", "Date: ", "Message-ID: <", "MIME-Version: 1.0"] {
        assert!(text.contains(&format!("\r\n{header}")) || text.starts_with(header), "{header} missing");
    }
    let verified = assert_pass(verify_as(&raw, SCOTT_DER));
    assert_eq!(verified.idap, IDAP.as_bytes());
    assert_eq!(verified.subject.as_deref(), Some("Grüße"));
    // A second implementation agrees.
    let dir = TempDir::new();
    let mail = dir.file("signed.eml", &raw);
    let ca = dir.file("ca.pem", CA_PEM);
    let content = run(
        "openssl",
        &[p("smime"), p("-verify"), p("-in"), &mail, p("-CAfile"), &ca, p("-purpose"), p("smimesign")],
        "openssl smime -verify of sign() output",
        &[],
    );
    assert!(String::from_utf8_lossy(&content).contains("Content-Type: text/xml"));
}

#[test]
fn sign_refuses_a_from_that_is_not_the_certificates() {
    let err = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "john@example.com", "aq@example.com", "x").unwrap_err();
    assert!(err.contains("not the certificate's e-mail"), "{err}");
    assert!(sign(IDAP.as_bytes(), SCOTT_PEM, JOHN_KEY, "scott@example.com", "aq@example.com", "x").is_err());
    assert!(sign(b"", SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "x").is_err());
    assert!(sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "a\r\nBcc: x", "x").is_err());
}

#[test]
fn idap_message_attachment_passes() {
    let entity = format!(
        "Content-Type: multipart/mixed; boundary=\"inner\"\r\n\r\n--inner\r\nContent-Type: text/plain\r\n\r\n\
         The request is attached.\r\n--inner\r\nContent-Type: application/octet-stream\r\n\
         Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"IDAP_MESSAGE.dat\"\r\n\r\n\
         {}\r\n--inner--\r\n",
        base64_lines(IDAP.as_bytes(), 76)
    );
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], entity.as_bytes(), &[]));
    let verified = assert_pass(verify_as(&raw, SCOTT_DER));
    assert_eq!(verified.idap, IDAP.as_bytes());
}

#[test]
fn from_is_compared_case_insensitively_and_lower_cased() {
    let headers = HEADERS.replace("scott@example.com", "Scott@EXAMPLE.com");
    let raw = mail(&headers, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
    assert_pass(verify_as(&raw, SCOTT_DER));
}

#[test]
fn passes_when_the_sender_has_several_directory_certificates() {
    let verdict = verify(&scott_detached(), &[JOHN_DER.to_vec(), SCOTT_DER.to_vec()], &trust(), now());
    assert_pass(verdict);
}

// ---- refused mail --------------------------------------------------------------------------

#[test]
fn tampered_detached_body_fails() {
    let raw = String::from_utf8(scott_detached()).unwrap().replace("scott_queue", "scott_queuf");
    assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "signature does not verify");
}

#[test]
fn tampered_opaque_content_fails() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach"]));
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\n\n").unwrap();
    let mut der = BASE64.decode(body.replace(['\n', '\r'], "")).unwrap();
    let at = der.windows(11).position(|w| w == b"scott_queue").unwrap();
    der[at + 10] = b'f';
    let raw = format!("{head}\n\n{}\n", base64_lines(&der, 64));
    assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "signature does not verify");
}

#[test]
fn unsigned_mail_fails() {
    let raw = format!("{HEADERS}MIME-Version: 1.0\nContent-Type: text/xml\n\n{IDAP}");
    assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "not signed");
    let raw = format!("{HEADERS}\n{IDAP}");
    assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "not signed");
}

#[test]
fn encrypted_only_mail_fails() {
    let dir = TempDir::new();
    let input = dir.file("in.eml", &entity());
    let recipient = dir.file("scott.pem", SCOTT_PEM);
    let smime = run("openssl", &[p("smime"), p("-encrypt"), p("-in"), &input, &recipient], "encrypt", &[]);
    // Without a gateway key, encrypted mail is refused as such.
    assert_refused(verify_as(&mail(HEADERS, &smime), SCOTT_DER), "no certificate to decrypt it");
    // With one, a mail encrypted to someone else is not ours...
    let gateway = gateway();
    let policy = Policy { gateway: Some(&gateway), ..Policy::default() };
    let verdict = verify_with(&mail(HEADERS, &smime), &[SCOTT_DER.to_vec()], &trust(), &policy, now());
    assert_refused(verdict, "not encrypted to the gateway's certificate");
    // ...and one encrypted to the gateway but not signed inside is not signed.
    let to_gateway = dir.file("gateway.pem", GATEWAY_SMIME_PEM);
    let smime = run("openssl", &[p("smime"), p("-encrypt"), p("-in"), &input, &to_gateway], "encrypt", &[]);
    let verdict = verify_with(&mail(HEADERS, &smime), &[SCOTT_DER.to_vec()], &trust(), &policy, now());
    assert_fail(verdict, "not signed: the encrypted mail holds text/xml");
}

#[test]
fn signed_by_another_agent_fails() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(JOHN_PEM, JOHN_KEY)], &entity(), &[]));
    assert_fail(verify_as(&raw, SCOTT_DER), "not scott@example.com's certificate in the directory");
}

#[test]
fn from_mismatch_fails() {
    let headers = HEADERS.replace("scott@example.com", "john@example.com");
    let raw = mail(&headers, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
    assert_fail(verify_as(&raw, SCOTT_DER), "From address john@example.com is not the signer certificate's");
}

#[test]
fn two_from_headers_fail() {
    let raw = mail("From: john@example.com\n", &scott_detached());
    assert_fail(verify_as(&raw, SCOTT_DER), "2 From headers");
    assert!(sender_address(&raw).is_err_and(|e| e.contains("2 From headers")));
    let obsolete = mail("FROM : john@example.com\n", &scott_detached());
    assert!(sender_address(&obsolete).is_err());
}

#[test]
fn sender_address_rules() {
    assert_eq!(sender_address(&scott_detached()), Ok("scott@example.com".to_string()));
    assert!(sender_address(b"From: a@example.com, b@example.com\n\nx").is_err_and(|e| e.contains("2 addresses")));
    assert!(sender_address(b"To: a@example.com\n\nx").is_err_and(|e| e.contains("no From")));
    assert!(sender_address(b"From: undisclosed\n\nx").is_err());
    assert!(sender_address(b"From: group: a@example.com;\n\nx").is_err());
    // A From line in the body is not a header.
    assert!(sender_address(b"From: a@example.com\n\nFrom: b@example.com\n").is_ok());
}

#[test]
fn expired_certificate_fails() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(EXPIRED_PEM, EXPIRED_KEY)], &entity(), &[]));
    assert_fail(verify_as(&raw, EXPIRED_DER), "certificate has expired");
}

#[test]
fn validity_is_checked_at_the_injected_time() {
    let raw = scott_detached();
    // 2021-06-01: before scott's certificate was issued.
    assert_fail(verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 1_622_505_600), "not yet valid");
    // A minute after scott's certificate ends (no CRL, whose own validity would speak first).
    let after = unix(X509::from_pem(SCOTT_PEM).unwrap().not_after()) + 60;
    let no_crl = TrustStore::from_pem(&[CA_PEM], &[]).unwrap();
    assert_fail(verify(&raw, &[SCOTT_DER.to_vec()], &no_crl, after), "certificate has expired");
    assert_pass(verify(&raw, &[SCOTT_DER.to_vec()], &no_crl, now()));
}

#[test]
fn revoked_certificate_fails() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(REVOKED_PEM, REVOKED_KEY)], &entity(), &[]));
    assert_fail(verify_as(&raw, REVOKED_DER), "is revoked");
}

/// An empty CRL in `ca`'s name valid from `from` to `until`, signed with `key_pem`.
fn crl_signed_by(ca: &X509, key_pem: &[u8], from: i64, until: i64) -> Vec<u8> {
    let ca_key = PKey::private_key_from_pem(key_pem).unwrap();
    let mut builder = openssl::x509::X509CrlBuilder::new().unwrap();
    builder.set_issuer_name(ca.subject_name()).unwrap();
    builder.set_last_update(&Asn1Time::from_unix(from).unwrap()).unwrap();
    builder.set_next_update(&Asn1Time::from_unix(until).unwrap()).unwrap();
    // authorityKeyIdentifier = SEQUENCE { [0] keyIdentifier } with the CA's key id.
    let key_id = ca.subject_key_id().unwrap().as_slice().to_vec();
    let mut aki = vec![0x30, u8::try_from(key_id.len() + 2).unwrap(), 0x80, u8::try_from(key_id.len()).unwrap()];
    aki.extend_from_slice(&key_id);
    let oid = openssl::asn1::Asn1Object::from_str("2.5.29.35").unwrap();
    let aki = openssl::asn1::Asn1OctetString::new_from_bytes(&aki).unwrap();
    builder.append_extension(openssl::x509::X509Extension::new_from_der(&oid, false, &aki).unwrap()).unwrap();
    let oid = openssl::asn1::Asn1Object::from_str("2.5.29.20").unwrap();
    let number = openssl::asn1::Asn1OctetString::new_from_bytes(&[0x02, 0x01, 0x01]).unwrap();
    builder.append_extension(openssl::x509::X509Extension::new_from_der(&oid, false, &number).unwrap()).unwrap();
    builder.sign(&ca_key, openssl::hash::MessageDigest::sha256()).unwrap();
    builder.build().unwrap().to_pem().unwrap()
}

#[test]
fn stale_crl_is_a_temporary_error() {
    let ca = X509::from_pem(CA_PEM).unwrap();
    let stale = crl_signed_by(&ca, CA_KEY, now() - 7200, now() - 3600);
    let trust = TrustStore::from_pem(&[CA_PEM], &[&stale]).unwrap();
    let verdict = verify(&scott_detached(), &[SCOTT_DER.to_vec()], &trust, now());
    assert!(
        matches!(&verdict, Verdict::TempError(reason) if reason.contains("revocation status unknown")),
        "{verdict:?}"
    );
}

#[test]
fn wrong_eku_fails() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(WRONG_EKU_PEM, WRONG_EKU_KEY)], &entity(), &[]));
    assert_fail(verify_as(&raw, WRONG_EKU_DER), "emailProtection");
}

#[test]
fn untrusted_ca_fails_even_when_the_mail_carries_that_ca() {
    let dir = TempDir::new();
    let other_ca = dir.file("other-ca.pem", OTHER_CA_PEM);
    let other_ca = other_ca.to_str().unwrap();
    for extra in [&[][..], &["-certfile", other_ca][..]] {
        let raw = mail(HEADERS, &openssl_sign("smime", &[(OTHER_SCOTT_PEM, OTHER_SCOTT_KEY)], &entity(), extra));
        // Without the CA no path is found; with it carried, the path ends in a root that is
        // not a trust anchor.
        let verdict = verify_as(&raw, OTHER_SCOTT_DER);
        let expected = if extra.is_empty() {
            "unable to get local issuer certificate"
        } else {
            "self-signed certificate in certificate chain"
        };
        assert_fail(verdict, expected);
    }
}

#[test]
fn signed_part_wrapped_in_multipart_mixed_fails() {
    let signed = openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]);
    let raw = format!(
        "{HEADERS}MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"outer\"\n\n--outer\n\
         Content-Type: text/xml\n\n<evil/>\n--outer\n{}\n--outer--\n",
        String::from_utf8(signed).unwrap().replace("MIME-Version: 1.0\n", "")
    );
    assert_fail(verify_as(raw.as_bytes(), SCOTT_DER), "does not cover the whole message");
}

#[test]
fn two_signers_fail() {
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY), (JOHN_PEM, JOHN_KEY)], &entity(), &[]));
    assert_fail(verify(&raw, &[SCOTT_DER.to_vec(), JOHN_DER.to_vec()], &trust(), now()), "2 signers");
}

#[test]
fn directory_without_certificate_fails_and_unreadable_one_is_temporary() {
    assert_fail(verify(&scott_detached(), &[], &trust(), now()), "no certificate");
    assert!(matches!(
        verify(&scott_detached(), &[b"not DER".to_vec()], &trust(), now()),
        Verdict::TempError(reason) if reason.contains("unreadable")
    ));
}

#[test]
fn no_idap_document_is_a_permanent_error() {
    let entity = b"Content-Type: text/plain\r\n\r\nhello";
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], entity, &[]));
    assert!(matches!(verify_as(&raw, SCOTT_DER), Verdict::PermError(reason) if reason.contains("no IDAP")));
}

#[test]
fn garbage_signature_is_a_permanent_error() {
    let raw = format!(
        "{HEADERS}MIME-Version: 1.0\nContent-Type: application/pkcs7-mime; smime-type=signed-data\n\
         Content-Transfer-Encoding: base64\n\nAAAA\n"
    );
    assert!(matches!(verify_as(raw.as_bytes(), SCOTT_DER), Verdict::PermError(_)));
}

// ---- trust store and helpers --------------------------------------------------------------

#[test]
fn trust_store_rules() {
    assert!(TrustStore::from_pem(&[], &[]).is_err());
    assert!(TrustStore::from_pem(&[b"junk"], &[]).is_err());
    // A CRL in a trusted CA's name must be signed by that CA.
    let forged = crl_signed_by(&X509::from_pem(CA_PEM).unwrap(), OTHER_CA_KEY, now() - 60, now() + 3600);
    assert!(
        TrustStore::from_pem(&[CA_PEM], &[&forged])
            .is_err_and(|e| e.contains("is not signed by the trusted CA of that name")),
        "a CRL in the CA's name signed by another key is refused"
    );
    // A CRL no trusted CA issued is an intermediate's: kept, and reported.
    let kept = TrustStore::from_pem(&[OTHER_CA_PEM], &[CA_CRL]).unwrap();
    assert_eq!(kept.intermediate_crl_issuers().len(), 1);
    assert!(kept.intermediate_crl_issuers()[0].contains("placeholder CA"), "{:?}", kept.intermediate_crl_issuers());
    let both = TrustStore::from_pem(&[OTHER_CA_PEM, CA_PEM], &[CA_CRL, SUB_CA_CRL]).unwrap();
    assert_eq!(both.intermediate_crl_issuers(), ["O=aqgate TEST ONLY, CN=aqgate TEST ONLY intermediate CA"]);
    assert!(TrustStore::from_pem(&[include_bytes!("../../../../certs/ca.der")], &[]).is_ok());
    assert!(TrustStore::from_pem_files(&[PathBuf::from("/nonexistent/ca.pem")], &[]).is_err());
    let dir = TempDir::new();
    let ca = dir.file("ca.pem", CA_PEM);
    let crl = dir.file("ca.crl", CA_CRL);
    assert!(TrustStore::from_pem_files(&[ca], &[crl]).is_ok());
    let _ = OTHER_CA_KEY;
}

#[test]
fn trust_store_and_verdict_are_shareable_across_tasks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TrustStore>();
    assert_send_sync::<Verdict>();
}

#[test]
fn gateway_tls_certificate_is_for_localhost_server_auth() {
    let cert = X509::from_pem(GATEWAY_TLS_PEM).unwrap();
    assert!(cert.extended_key_usage().unwrap().contains(X509ExtendedKeyUsage::SSL_SERVER));
    let names: Vec<String> = cert
        .subject_alt_names()
        .unwrap()
        .iter()
        .filter_map(|n| n.dnsname().map(str::to_string).or_else(|| n.ipaddress().map(|ip| format!("{ip:?}"))))
        .collect();
    assert!(names.contains(&"localhost".to_string()), "{names:?}");
    assert!(names.contains(&"[127, 0, 0, 1]".to_string()), "{names:?}");
}

#[test]
fn rfc5322_dates() {
    assert_eq!(rfc5322_date(0), "Thu, 1 Jan 1970 00:00:00 +0000");
    assert_eq!(rfc5322_date(1_798_761_600), "Fri, 1 Jan 2027 00:00:00 +0000");
    assert_eq!(rfc5322_date(951_827_696), "Tue, 29 Feb 2000 12:34:56 +0000");
}

#[test]
fn signer_count_rejects_truncated_der() {
    assert!(signer_info_count(&[]).is_err());
    assert!(signer_info_count(&[0x30, 0x80, 0, 0]).is_err());
    assert!(signer_info_count(&[0x30, 0x05, 0x06]).is_err());
}

/// A mutation proptest once found: corrupted MIME headers made OpenSSL's S/MIME reader
/// record an error whose data is not UTF-8, and the openssl crate panicked collecting it.
/// The MIME layer is now ours (no single-byte mutation of a signed mail reaches that
/// panic any more), and `verify` still contains one should another path reach it. Every
/// mutation in the window that used to panic is a rejection.
#[test]
fn mutated_signature_headers_are_a_rejection_not_a_panic() {
    for at in 700..900 {
        let mut raw =
            sign_at(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "x", 1_780_000_000)
                .unwrap();
        if let Some(b) = raw.get_mut(at) {
            *b = 128;
        }
        raw.truncate(3245);
        assert!(!matches!(verify(&raw, &[SCOTT_PEM.to_vec()], &trust(), 1_780_000_000), Verdict::Pass(_)));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn verify_never_panics_on_mutated_mail(at in 0usize..4000, byte in proptest::num::u8::ANY, cut in 0usize..4000) {
        let mut raw = sign(IDAP.as_bytes(), SCOTT_PEM, SCOTT_KEY, "scott@example.com", "aq@example.com", "x").unwrap();
        if let Some(b) = raw.get_mut(at) { *b = byte; }
        raw.truncate(cut.max(1));
        let _ = verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 1_800_000_000);
        let _ = sender_address(&raw);
    }

    #[test]
    fn verify_never_panics_on_garbage(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let _ = verify(&raw, &[SCOTT_DER.to_vec()], &trust(), 0);
    }
}

// ---- RFC 5652 / RFC 8551: what standard S/MIME stacks produce --------------------------------

/// `faketime TIME openssl …`: a signature with a chosen signingTime (libfaketime moves the
/// clock openssl reads).
fn openssl_sign_at(time: &str, signer: (&[u8], &[u8]), entity: &[u8]) -> Vec<u8> {
    let dir = TempDir::new();
    let input = dir.file("in.eml", entity);
    let cert = dir.file("signer.pem", signer.0);
    let key = dir.file("signer.key.pem", signer.1);
    let args = [p(time), p("openssl"), p("cms"), p("-sign"), p("-in"), &input, p("-signer"), &cert, p("-inkey"), &key];
    run("faketime", &args, "faketime openssl cms -sign", &[])
}

/// Python's `cryptography` (Debian's python3-cryptography): its PKCS#7 S/MIME builder signs
/// `entity` with `hash` and the builder `options` (Python expressions).
fn python_sign(signer: (&[u8], &[u8]), entity: &[u8], hash: &str, options: &str) -> Vec<u8> {
    let dir = TempDir::new();
    let input = dir.file("in.eml", entity);
    let cert = dir.file("signer.pem", signer.0);
    let key = dir.file("signer.key.pem", signer.1);
    let script = dir.file(
        "sign.py",
        format!(
            "import sys\n\
             from cryptography import x509\n\
             from cryptography.hazmat.primitives import hashes, serialization\n\
             from cryptography.hazmat.primitives.serialization import pkcs7\n\
             cert = x509.load_pem_x509_certificate(open(sys.argv[1], 'rb').read())\n\
             key = serialization.load_pem_private_key(open(sys.argv[2], 'rb').read(), None)\n\
             data = open(sys.argv[3], 'rb').read()\n\
             out = pkcs7.PKCS7SignatureBuilder().set_data(data).add_signer(cert, key, hashes.{hash}())\
             .sign(serialization.Encoding.SMIME, [{options}])\n\
             sys.stdout.buffer.write(out)\n"
        )
        .as_bytes(),
    );
    run(PYTHON, &[&script, &cert, &key, &input], "python3 cryptography pkcs7 sign", &[])
}

/// Debian's Python, which has Debian's python3-cryptography (scripts/ensure-tools.sh).
const PYTHON: &str = "/usr/bin/python3";

fn verify_scott_with(raw: &[u8], cert: &[u8]) -> Verified {
    match verify(raw, &[cert.to_vec(), SCOTT_DER.to_vec()], &trust(), now()) {
        Verdict::Pass(v) => {
            assert_eq!(v.signer, cert, "the signer is the certificate that signed");
            assert_pass(Verdict::Pass(v))
        }
        other => panic!("expected Pass, got {other:?}"),
    }
}

#[test]
fn subject_key_identifier_signers_pass() {
    for extra in [&["-keyid"][..], &["-keyid", "-nodetach"], &["-keyid", "-nocerts"]] {
        let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), extra));
        let der = openssl_cms_der(&raw);
        let view = signed_data(&der).unwrap();
        assert!(matches!(view.signers[0].sid, SignerId::KeyId(_)), "{extra:?}: {:?}", view.signers[0].sid);
        assert_pass(verify_as(&raw, SCOTT_DER));
        // The key identifier names scott's certificate, not john's.
        assert_fail(verify_as(&raw, JOHN_DER), "not scott@example.com's certificate in the directory");
    }
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
    assert!(matches!(signed_data(&openssl_cms_der(&raw)).unwrap().signers[0].sid, SignerId::IssuerSerial { .. }));
    assert_pass(verify_as(&raw, SCOTT_DER));
}

/// The SignedData DER of a mail, detached or opaque.
fn openssl_cms_der(raw: &[u8]) -> Vec<u8> {
    let message = MessageParser::default().parse(raw).unwrap();
    let root = message.root_part();
    match root.content_type().and_then(|ct| ct.attribute("boundary")) {
        Some(boundary) => {
            let body = &raw[root.raw_body_offset() as usize..];
            signature_der(split_signed(body, boundary).unwrap().1).unwrap()
        }
        None => base64_or_der(root.contents()),
    }
}

#[test]
fn sha384_and_sha512_pass() {
    for md in ["sha256", "sha384", "sha512"] {
        let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-md", md]));
        assert_pass(verify_as(&raw, SCOTT_DER));
    }
}

#[test]
fn rsassa_pss_signatures_pass() {
    // scott's RSA key signing RSASSA-PSS, with SHA-256 and SHA-512.
    for md in ["sha256", "sha512"] {
        let extra = ["-md", md, "-keyopt", "rsa_padding_mode:pss"];
        let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &extra));
        assert_eq!(signed_data(&openssl_cms_der(&raw)).unwrap().signers[0].signature, oid::RSA_PSS);
        assert_pass(verify_as(&raw, SCOTT_DER));
    }
    // A certificate with an RSASSA-PSS key.
    let extra = ["-keyid", "-keyopt", "rsa_padding_mode:pss"];
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PSS_PEM, SCOTT_PSS_KEY)], &entity(), &extra));
    assert_eq!(signed_data(&openssl_cms_der(&raw)).unwrap().signers[0].signature, oid::RSA_PSS);
    verify_scott_with(&raw, SCOTT_PSS_DER);
    // OpenSSL 3.0 signs with an RSASSA-PSS key without -keyopt under the rsaEncryption OID,
    // which no verifier can check: said so, not taken for a changed content.
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PSS_PEM, SCOTT_PSS_KEY)], &entity(), &["-keyid"]));
    let verdict = verify(&raw, &[SCOTT_PSS_DER.to_vec()], &trust(), now());
    assert_fail(verdict.clone(), "it could not be checked (illegal or unsupported padding mode)");
}

#[test]
fn ecdsa_signatures_pass() {
    for md in ["sha256", "sha384", "sha512"] {
        let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_EC_PEM, SCOTT_EC_KEY)], &entity(), &["-md", md]));
        verify_scott_with(&raw, SCOTT_EC_DER);
    }
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_EC_PEM, SCOTT_EC_KEY)], &entity(), &["-nodetach"]));
    verify_scott_with(&raw, SCOTT_EC_DER);
    // An ECDSA signature verified against the RSA certificate alone names another certificate.
    assert_fail(verify_as(&raw, SCOTT_DER), "not scott@example.com's certificate in the directory");
}

#[test]
fn python_cryptography_signatures_pass() {
    let detached = "pkcs7.PKCS7Options.DetachedSignature";
    type Signer<'a> = (&'a [u8], &'a [u8]);
    let cases: [(Signer<'_>, &[u8], &str, &str); 4] = [
        ((SCOTT_PEM, SCOTT_KEY), SCOTT_DER, "SHA256", detached),
        ((SCOTT_PEM, SCOTT_KEY), SCOTT_DER, "SHA512", detached),
        ((SCOTT_EC_PEM, SCOTT_EC_KEY), SCOTT_EC_DER, "SHA384", detached),
        (
            (SCOTT_EC_PEM, SCOTT_EC_KEY),
            SCOTT_EC_DER,
            "SHA256",
            "pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.NoAttributes",
        ),
    ];
    for (signer, der, hash, options) in cases {
        let raw = mail(HEADERS, &python_sign(signer, &entity(), hash, options));
        verify_scott_with(&raw, der);
    }
    // Its Text option makes the content text/plain: an IDAP envelope there is the request.
    let raw = mail(
        HEADERS,
        &python_sign(
            (SCOTT_PEM, SCOTT_KEY),
            IDAP.as_bytes(),
            "SHA256",
            &format!("{detached}, pkcs7.PKCS7Options.Text"),
        ),
    );
    assert_pass(verify_as(&raw, SCOTT_DER));
}

#[test]
fn weak_or_unknown_algorithms_are_refused_by_name() {
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-md", "sha1"]));
    assert_fail(verify_as(&raw, SCOTT_DER), "digest algorithm SHA-1 is not accepted here");
    // The signature algorithm rewritten (outside what the signature covers) to
    // sha1WithRSAEncryption, and to an OID nobody knows: refused by name.
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-nodetach", "-nocerts"]));
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\n\n").unwrap();
    let der = BASE64.decode(body.replace(['\r', '\n'], "")).unwrap();
    let rsa = [&[0x06, 0x09][..], oid::RSA].concat();
    let at = der.windows(rsa.len()).position(|w| w == rsa).expect("the signatureAlgorithm");
    for (last, needle) in [
        (0x05, "signature algorithm's hash SHA-1 is not accepted here"),
        (0x63, "signature algorithm with OID 1.2.840.113549.1.1.99 is not accepted here"),
    ] {
        let mut patched = der.clone();
        patched[at + rsa.len() - 1] = last;
        let raw = format!("{head}\n\n{}\n", base64_lines(&patched, 64));
        let verdict = verify_as(raw.as_bytes(), SCOTT_DER);
        assert_fail(verdict.clone(), needle);
        let Verdict::Fail(why) = verdict else { unreachable!() };
        assert!(!why.contains("altered") && !why.contains("changed"), "{why}");
    }
    // EdDSA is named.
    let info = SignerInfoView {
        sid: SignerId::KeyId(b"x"),
        digest: oid::SHA512,
        signature: oid::ED25519,
        signature_params: None,
        signing_time: None,
    };
    let Err(Verdict::Fail(why)) = layer::check_algorithms(&info) else { panic!("Ed25519 accepted") };
    assert!(
        why.contains("signature algorithm Ed25519 is not accepted here (RSA PKCS#1 v1.5, RSASSA-PSS or ECDSA"),
        "{why}"
    );
}

#[test]
fn intermediates_carried_in_the_mail_build_the_path() {
    let dir = TempDir::new();
    let sub_ca = dir.file("sub-ca.pem", SUB_CA_PEM);
    let sub_ca = sub_ca.to_str().unwrap();
    let with =
        mail(HEADERS, &openssl_sign("cms", &[(SUB_SCOTT_PEM, SUB_SCOTT_KEY)], &entity(), &["-certfile", sub_ca]));
    verify_scott_with(&with, SUB_SCOTT_DER);
    // Without the intermediate there is no path to the trust anchor, also right after a mail
    // that carried it (the remembered chain needs it too).
    let without = mail(HEADERS, &openssl_sign("cms", &[(SUB_SCOTT_PEM, SUB_SCOTT_KEY)], &entity(), &[]));
    let trust = trust();
    assert_pass(verify(&with, &[SUB_SCOTT_DER.to_vec()], &trust, now()));
    assert_fail(verify(&without, &[SUB_SCOTT_DER.to_vec()], &trust, now()), "unable to get local issuer certificate");
    assert_pass(verify(&with, &[SUB_SCOTT_DER.to_vec()], &trust, now()));
    // The signer must still be the directory's certificate: the one the mail carries is not.
    assert_fail(verify_as(&with, SCOTT_DER), "not scott@example.com's certificate in the directory");
    // The intermediate alone is never a trust anchor.
    let only_sub = TrustStore::from_pem(&[OTHER_CA_PEM], &[]).unwrap();
    assert_fail(verify(&with, &[SUB_SCOTT_DER.to_vec()], &only_sub, now()), "unable to get local issuer certificate");
}

#[test]
fn an_intermediates_crl_can_be_configured() {
    let dir = TempDir::new();
    let sub_ca = dir.file("sub-ca.pem", SUB_CA_PEM);
    let extra = ["-certfile", sub_ca.to_str().unwrap()];
    let revoked = mail(HEADERS, &openssl_sign("cms", &[(SUB_REVOKED_PEM, SUB_REVOKED_KEY)], &entity(), &extra));
    let good = mail(HEADERS, &openssl_sign("cms", &[(SUB_SCOTT_PEM, SUB_SCOTT_KEY)], &entity(), &extra));
    let with_crl = TrustStore::from_pem(&[CA_PEM], &[CA_CRL, SUB_CA_CRL]).unwrap();
    assert_fail(verify(&revoked, &[SUB_REVOKED_DER.to_vec()], &with_crl, now()), "the signer certificate (serial");
    assert_fail(verify(&revoked, &[SUB_REVOKED_DER.to_vec()], &with_crl, now()), "is revoked");
    assert_pass(verify(&good, &[SUB_SCOTT_DER.to_vec()], &with_crl, now()));
    // Not configured: not revocation-checked (as for a trusted CA without a CRL).
    assert_pass(verify(&revoked, &[SUB_REVOKED_DER.to_vec()], &trust(), now()));
    // A stale CRL of the intermediate: status unknown.
    let stale = crl_signed_by(
        &X509::from_pem(SUB_CA_PEM).unwrap(),
        include_bytes!("../../../../certs/sub-ca.key.pem"),
        now() - 7200,
        now() - 3600,
    );
    let stale = TrustStore::from_pem(&[CA_PEM], &[&stale]).unwrap();
    assert!(
        matches!(verify(&good, &[SUB_SCOTT_DER.to_vec()], &stale, now()), Verdict::TempError(why) if why.contains("intermediate CA"))
    );
}

#[test]
fn openssl_smime_text_puts_the_request_in_text_plain() {
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], IDAP.as_bytes(), &["-text"]));
    assert_pass(verify_as(&raw, SCOTT_DER));
    let raw =
        mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], IDAP.as_bytes(), &["-text", "-nodetach"]));
    assert_pass(verify_as(&raw, SCOTT_DER));
    // Plain text that is not an IDAP envelope is still no request.
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], b"<note>hello</note>", &["-text"]));
    assert!(matches!(verify_as(&raw, SCOTT_DER), Verdict::PermError(why) if why.contains("no IDAP")));
}

// ---- nested signatures -----------------------------------------------------------------------

#[test]
fn another_agents_request_wrapped_in_a_signature_is_refused() {
    for inner_extra in [&[][..], &["-nodetach"]] {
        let johns = openssl_sign("smime", &[(JOHN_PEM, JOHN_KEY)], &entity(), inner_extra);
        for outer_extra in [&[][..], &["-nodetach"]] {
            let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &johns, outer_extra));
            let verdict = verify(&raw, &[SCOTT_DER.to_vec()], &trust(), now());
            assert_fail(verdict, "not scott@example.com's certificate in the directory");
            // Even when the directory lists john's certificate for scott, john's address is not From.
            let verdict = verify(&raw, &[SCOTT_DER.to_vec(), JOHN_DER.to_vec()], &trust(), now());
            assert_fail(verdict, "From address scott@example.com is not the signer certificate's");
        }
    }
}

#[test]
fn layers_signed_by_the_same_agent_pass() {
    let inner = openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]);
    let middle = openssl_sign("cms", &[(SCOTT_EC_PEM, SCOTT_EC_KEY)], &inner, &["-nodetach"]);
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &middle, &[]));
    let verified = assert_pass(verify(&raw, &[SCOTT_DER.to_vec(), SCOTT_EC_DER.to_vec()], &trust(), now()));
    assert_eq!(verified.signer, SCOTT_DER, "the outermost signer");
    // A layer the directory does not list for the agent fails the whole mail.
    assert_fail(verify_as(&raw, SCOTT_DER), "not scott@example.com's certificate in the directory");
    // A tampered inner layer too.
    let text = String::from_utf8(inner.clone()).unwrap();
    let cut = text.find("Content-Type: text/xml").unwrap();
    let tampered = format!("{}{}", &text[..cut], text[cut..].replacen("scott_queue", "scott_queuf", 1));
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], tampered.as_bytes(), &[]));
    assert_fail(verify_as(&raw, SCOTT_DER), "signature does not verify");
    // Too deep.
    let mut deep = entity();
    for _ in 0..5 {
        deep = openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &deep, &[]);
    }
    assert_fail(verify_as(&mail(HEADERS, &deep), SCOTT_DER), "signed more than 4 times over");
}

#[test]
fn a_signed_or_encrypted_part_inside_the_signed_content_is_refused() {
    let johns = String::from_utf8(openssl_sign("smime", &[(JOHN_PEM, JOHN_KEY)], &entity(), &[])).unwrap();
    let mixed = format!(
        "Content-Type: multipart/mixed; boundary=\"m\"\r\n\r\n--m\r\nContent-Type: text/plain\r\n\r\nsee below\r\n--m\r\n{}\r\n--m--\r\n",
        johns.replace("MIME-Version: 1.0\n", "")
    );
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], mixed.as_bytes(), &[]));
    assert_fail(verify_as(&raw, SCOTT_DER), "holds a multipart/signed part next to other parts");
    let dir = TempDir::new();
    let input = dir.file("in.eml", &entity());
    let recipient = dir.file("gateway.pem", GATEWAY_SMIME_PEM);
    let encrypted = run("openssl", &[p("smime"), p("-encrypt"), p("-in"), &input, &recipient], "encrypt", &[]);
    let raw = mail(HEADERS, &openssl_sign("smime", &[(SCOTT_PEM, SCOTT_KEY)], &encrypted, &[]));
    assert_fail(verify_as(&raw, SCOTT_DER), "encrypted content inside a signature is not accepted");
}

// ---- signingTime -------------------------------------------------------------------------------

#[test]
fn signing_time_is_checked_when_present() {
    let at = |time: &str| mail(HEADERS, &openssl_sign_at(time, (SCOTT_PEM, SCOTT_KEY), &entity()));
    let real = system_time();
    let policy = Policy::default();
    let check = |raw: &[u8], now: i64| verify_with(raw, &[SCOTT_DER.to_vec()], &trust(), &policy, now);
    // Signed now: passes now, and a day later.
    let fresh = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
    assert_pass(check(&fresh, real));
    assert_pass(check(&fresh, real + 86_400));
    // In the future of the arrival: a few minutes of skew are fine, an hour is not.
    assert_pass(check(&fresh, real - 120));
    assert_fail(check(&fresh, real - 3600), "more than 5 minutes after the mail arrived");
    // Older than the replay window (the dedupe window): refused, so a late replay is too.
    assert_fail(check(&fresh, real + 168 * 3600 + 60), "older than the replay window");
    let short = Policy { replay_window: 3600, ..Policy::default() };
    assert_fail(verify_with(&fresh, &[SCOTT_DER.to_vec()], &trust(), &short, real + 7200), "more than 1 hours before");
    let unlimited = Policy { replay_window: 0, ..Policy::default() };
    assert_pass(verify_with(&fresh, &[SCOTT_DER.to_vec()], &trust(), &unlimited, real + 400 * 86_400));
    // Before the certificate was issued (its validity is checked at arrival, the
    // signingTime against it).
    let before = at("2021-06-01 12:00:00");
    assert_fail(check(&before, real), "outside the signer certificate's validity");
    // Signed two hours ago (after the certificate was issued), arrived now, with a replay
    // window of an hour.
    let not_before = unix(X509::from_pem(SCOTT_PEM).unwrap().not_before());
    let earlier = at(&format!("@{}", (real - 7200).max(not_before + 60)));
    assert_fail(verify_with(&earlier, &[SCOTT_DER.to_vec()], &trust(), &short, real), "older than the replay window");
    assert_pass(check(&earlier, real));
}

#[test]
fn signing_times_are_read_as_rfc_5652_writes_them() {
    let raw = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &[]));
    let der = openssl_cms_der(&raw);
    let at = signed_data(&der).unwrap().signers[0].signing_time.clone().unwrap().unwrap();
    assert!((at - system_time()).abs() < 120, "{at}");
    let no_attrs = mail(HEADERS, &openssl_sign("cms", &[(SCOTT_PEM, SCOTT_KEY)], &entity(), &["-noattr"]));
    assert_eq!(signed_data(&openssl_cms_der(&no_attrs)).unwrap().signers[0].signing_time, None);
    assert_pass(verify_as(&no_attrs, SCOTT_DER));
}

// ---- encrypted requests --------------------------------------------------------------------------

#[test]
fn a_signed_request_encrypted_to_the_gateway_passes() {
    let gateway = gateway();
    let policy = Policy { gateway: Some(&gateway), ..Policy::default() };
    let dir = TempDir::new();
    let signed = scott_detached();
    let plain = assert_pass(verify_as(&signed, SCOTT_DER));
    assert!(!plain.encrypted);
    // The signed mail's MIME entity (its body with its Content-Type), encrypted.
    let text = String::from_utf8(signed.clone()).unwrap();
    let entity_at = text.find("MIME-Version").unwrap();
    let input = dir.file("signed.eml", &text.as_bytes()[entity_at..]);
    let to = dir.file("gateway.pem", GATEWAY_SMIME_PEM);
    for (tool, cipher) in [("smime", "-aes256"), ("cms", "-aes-128-cbc"), ("cms", "-aes-256-gcm")] {
        let args = [p(tool), p("-encrypt"), p(cipher), p("-in"), &input, &to];
        let smime = run("openssl", &args, "openssl encrypt", &[]);
        let raw = mail(HEADERS, &smime);
        let verified = match verify_with(&raw, &[SCOTT_DER.to_vec()], &trust(), &policy, now()) {
            Verdict::Pass(v) => assert_pass(Verdict::Pass(v)),
            other => panic!("{tool} {cipher}: {other:?}"),
        };
        assert!(verified.encrypted);
        assert_eq!(verified.signer, SCOTT_DER);
        assert_eq!(verified.digest, plain.digest, "the same signed request, encrypted, is the same request");
    }
    // aqgate's own: sign_encrypted.
    let raw = sign_encrypted(
        IDAP.as_bytes(),
        SCOTT_PEM,
        SCOTT_KEY,
        "scott@example.com",
        "aq@localhost",
        "x",
        GATEWAY_SMIME_PEM,
    )
    .unwrap();
    assert!(assert_pass(verify_with(&raw, &[SCOTT_DER.to_vec()], &trust(), &policy, now())).encrypted);
    // A damaged encrypted key: one answer, whatever broke inside (no oracle).
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut der = BASE64.decode(body.replace(['\r', '\n'], "")).unwrap();
    let key_at = der.windows(4).position(|w| w == [0x04, 0x82, 0x01, 0x00]).expect("the RSA-encrypted key") + 4;
    der[key_at + 100] ^= 0x55;
    let damaged = format!("{head}\r\n\r\n{}\r\n", base64_lines(&der, 64));
    assert_refused(
        verify_with(damaged.as_bytes(), &[SCOTT_DER.to_vec()], &trust(), &policy, now()),
        "cannot be decrypted with the gateway's key",
    );
}

/// What decrypts to noise (a damaged key decrypted with OpenSSL's random stand-in key whose
/// CBC padding happened to pass) gets the answer every other decryption failure gets.
#[test]
fn an_encrypted_mail_that_holds_noise_cannot_be_decrypted() {
    let gateway = gateway();
    let policy = Policy { gateway: Some(&gateway), ..Policy::default() };
    let dir = TempDir::new();
    // Noise from a fixed generator, its first line no header field.
    let mut x: u32 = 0x2545_f491;
    let noise: Vec<u8> = (0..4096)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i == 0 { 0x8f } else { x.to_le_bytes()[0] }
        })
        .collect();
    let input = dir.file("noise.bin", &noise);
    let to = dir.file("gateway.pem", GATEWAY_SMIME_PEM);
    let args = [p("cms"), p("-encrypt"), p("-binary"), p("-aes-256-cbc"), p("-in"), &input, &to];
    let raw = mail(HEADERS, &run("openssl", &args, "openssl encrypt", &[]));
    assert_refused(
        verify_with(&raw, &[SCOTT_DER.to_vec()], &trust(), &policy, now()),
        "cannot be decrypted with the gateway's key",
    );
}

#[test]
fn a_header_section_opens_a_mime_entity() {
    use super::envelope::starts_with_header_field as header;
    assert!(header(b"Content-Type: text/plain\r\n\r\nbody"));
    assert!(header(b"MIME-Version: 1.0\nContent-Type: multipart/signed;\n\tprotocol=x\n\n"));
    assert!(header("Subject: caf\u{e9}\r\n\r\n".as_bytes()), "UTF-8 in a value (RFC 6532)");
    assert!(header("Subject: a\r\n caf\u{e9}\r\n\r\n".as_bytes()), "and in a folded line");
    assert!(!header(b"A: x\r\n \x01\r\n\r\n"), "a control character in a folded line");
    assert!(!header(b"\r\nbody"), "no field");
    assert!(!header(b"Content-Type: text/plain\r\n"), "no end of the header section");
    assert!(!header(b"\tfolded: first\r\n\r\n"), "a continuation with nothing to continue");
    assert!(!header(b"Bad Name: x\r\n\r\n"), "a space in a name");
    assert!(header(b"Subject : x\r\n\r\n"), "obsolete whitespace before the colon");
    assert!(!header(b" : x\r\n\r\n"), "a name of whitespace only");
    assert!(!header(b": x\r\n\r\n"), "an empty name");
    assert!(!header(b"no colon\r\n\r\n"));
    assert!(!header(b"A: \x01\r\n\r\n"), "a control character in a value");
    assert!(!header(&[0x8f, b':', b'\n', b'\n']), "an 8-bit name");
}

#[test]
fn gateway_identity_rules() {
    let id = gateway();
    assert_eq!(id.emails(), ["aq@localhost"]);
    assert!(!format!("{id:?}").contains("PRIVATE"));
    assert!(
        GatewayIdentity::from_pem(GATEWAY_SMIME_PEM, SCOTT_KEY).is_err_and(|e| e.contains("not the certificate's"))
    );
    assert!(
        GatewayIdentity::from_pem(GATEWAY_TLS_PEM, include_bytes!("../../../../certs/gateway-tls.key.pem"))
            .is_err_and(|e| e.contains("emailProtection"))
    );
    assert!(GatewayIdentity::from_pem(b"junk", GATEWAY_SMIME_KEY).is_err());
}

#[test]
fn replies_are_signed_and_encrypted_for_openssl() {
    let id = gateway();
    let headers = ReplyHeaders {
        from: "aq@localhost",
        to: "scott@example.com",
        subject: "Re: IDAP request",
        message_id: "reply-1@localhost",
        in_reply_to: Some("req-1@example.com"),
        extra: &[("X-AQ-Request-Id", "7".to_string())],
    };
    let xml = b"<?xml version=\"1.0\"?><Envelope/>";
    let dir = TempDir::new();
    let ca = dir.file("ca.pem", CA_PEM);
    // Signed: openssl verifies it against the test CA.
    let signed = reply_mail(&headers, xml, Some(&id), None, now()).unwrap();
    let text = String::from_utf8(signed.clone()).unwrap();
    for h in [
        "Message-ID: <reply-1@localhost>",
        "In-Reply-To: <req-1@example.com>",
        "References: <req-1@example.com>",
        "X-AQ-Request-Id: 7",
    ] {
        assert!(text.contains(h), "{h} missing:\n{text}");
    }
    let file = dir.file("signed.eml", &signed);
    let out = run(
        "openssl",
        &[p("smime"), p("-verify"), p("-in"), &file, p("-CAfile"), &ca, p("-purpose"), p("smimesign")],
        "verify reply",
        &[],
    );
    assert!(String::from_utf8_lossy(&out).contains("Content-Type: text/xml"));
    // Signed, then encrypted to scott: scott decrypts, then verifies.
    let enc = reply_mail(&headers, xml, Some(&id), Some(SCOTT_DER), now()).unwrap();
    assert!(String::from_utf8_lossy(&enc).contains("smime-type=enveloped-data"));
    let file = dir.file("enc.eml", &enc);
    let (cert, key) = (dir.file("scott.pem", SCOTT_PEM), dir.file("scott.key.pem", SCOTT_KEY));
    let inner = run(
        "openssl",
        &[p("cms"), p("-decrypt"), p("-in"), &file, p("-recip"), &cert, p("-inkey"), &key],
        "decrypt reply",
        &[],
    );
    let inner = dir.file("inner.eml", &inner);
    let out = run(
        "openssl",
        &[p("cms"), p("-verify"), p("-in"), &inner, p("-CAfile"), &ca, p("-purpose"), p("smimesign")],
        "verify decrypted reply",
        &[],
    );
    assert!(String::from_utf8_lossy(&out).contains("Content-Type: text/xml"));
    // Unsigned (no gateway certificate): a plain text/xml mail.
    let plain = String::from_utf8(reply_mail(&headers, xml, None, None, now()).unwrap()).unwrap();
    assert!(plain.contains("Content-Type: text/xml; charset=utf-8") && !plain.contains("pkcs7"), "{plain}");
    assert!(reply_mail(&ReplyHeaders { to: "a\r\nBcc: x@y", ..headers.clone() }, xml, None, None, now()).is_err());
}
