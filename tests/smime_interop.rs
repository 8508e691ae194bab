//! S/MIME as other implementations write it, through the real binary: mails signed by the
//! openssl CLI (`cms -sign` with issuerAndSerialNumber and `-keyid`, SHA-384/512, RSASSA-PSS,
//! ECDSA, an intermediate carried in the mail, `smime -text`), by gpgsm and by Python's
//! `cryptography`, delivered by swaks to aqgate's SMTP filter and performed; what is not
//! exactly the agent's signed request (another agent's request wrapped in a signature,
//! SHA-1, a revoked or unchainable certificate, a signingTime out of bounds) is refused
//! at SMTP time with the reason and changes nothing. Encrypted requests and signed
//! (and encrypted) replies, checked with the openssl CLI, are in the second half.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aqgate_proto::idap::Response;
use base64::Engine as _;
use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn cert(name: &str) -> String {
    format!("{ROOT}/certs/{name}")
}

/// The demo directory with scott's further certificates (EC, RSASSA-PSS, two from the
/// intermediate CA) added to his entry: an agent may have several.
fn directory_with_scotts_certificates(dir: &Path) -> PathBuf {
    let ldif = std::fs::read_to_string(format!("{ROOT}/ldap-fixtures/directory.ldif")).expect("demo LDIF");
    let mut extra = String::new();
    for name in ["scott-ec.der", "scott-pss.der", "sub-ca-scott.der", "sub-ca-revoked.der"] {
        let der = std::fs::read(cert(name)).expect("certificate");
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        extra.push_str(&format!("userCertificate;binary:: {b64}\n"));
    }
    let anchor = "mail: scott@example.com\n";
    assert!(ldif.contains(anchor), "scott's entry");
    let path = dir.join("directory.ldif");
    std::fs::write(&path, ldif.replacen(anchor, &format!("{anchor}{extra}"), 1)).expect("write LDIF");
    path
}

fn run(program: &str, args: &[&str], what: &str) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {program} (scripts/ensure-tools.sh installs it): {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A mail from scott (headers with a fresh Message-ID) around `smime` (an S/MIME entity).
fn mail(dir: &Path, name: &str, smime: &[u8]) -> PathBuf {
    let id = aqgate_core::engine::session::random_id();
    let mut raw = format!(
        "From: Scott <scott@example.com>\r\nTo: aq@localhost\r\nSubject: {name}\r\nMessage-ID: <{name}-{id}@example.com>\r\n"
    )
    .into_bytes();
    raw.extend_from_slice(smime);
    let path = dir.join(format!("{name}.eml"));
    std::fs::write(&path, raw).expect("write mail");
    path
}

/// `openssl TOOL -sign` of `entity` by `signer` (certs/NAME.pem, NAME.key.pem) with `extra`.
fn openssl_signed(dir: &Path, signer: &str, tool: &str, entity: &[u8], extra: &[&str]) -> Vec<u8> {
    let input = dir.join(format!("entity-{}", aqgate_core::engine::session::random_id()));
    std::fs::write(&input, entity).expect("write entity");
    let (c, k) = (cert(&format!("{signer}.pem")), cert(&format!("{signer}.key.pem")));
    let mut args = vec![tool, "-sign", "-in", input.to_str().expect("path"), "-signer", &c, "-inkey", &k];
    args.extend_from_slice(extra);
    run("openssl", &args, &format!("openssl {tool} -sign {extra:?}"))
}

/// The same, at a chosen signing time (`faketime`, e.g. `@1790000000`).
fn openssl_signed_at(dir: &Path, time: &str, entity: &[u8]) -> Vec<u8> {
    let input = dir.join(format!("entity-{}", aqgate_core::engine::session::random_id()));
    std::fs::write(&input, entity).expect("write entity");
    let (c, k) = (cert("scott.pem"), cert("scott.key.pem"));
    let args = [time, "openssl", "cms", "-sign", "-in", input.to_str().expect("path"), "-signer", &c, "-inkey", &k];
    run("faketime", &args, "faketime openssl cms -sign")
}

/// A text/xml entity in canonical form (CRLF line ends, as S/MIME signs it).
fn entity(idap: &str) -> Vec<u8> {
    let idap = idap.replace("\r\n", "\n").replace('\n', "\r\n");
    format!("Content-Type: text/xml; charset=utf-8\r\n\r\n{idap}").into_bytes()
}

/// Python's `cryptography` (Debian's, in /usr/bin/python3): a detached S/MIME signature.
fn python_signed(dir: &Path, signer: &str, entity: &[u8], hash: &str, text: bool) -> Vec<u8> {
    let input = dir.join(format!("entity-{}", aqgate_core::engine::session::random_id()));
    std::fs::write(&input, entity).expect("write entity");
    let options = if text {
        "[pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Text]"
    } else {
        "[pkcs7.PKCS7Options.DetachedSignature]"
    };
    let script = format!(
        "import sys\n\
         from cryptography import x509\n\
         from cryptography.hazmat.primitives import hashes, serialization\n\
         from cryptography.hazmat.primitives.serialization import pkcs7\n\
         cert = x509.load_pem_x509_certificate(open(sys.argv[1], 'rb').read())\n\
         key = serialization.load_pem_private_key(open(sys.argv[2], 'rb').read(), None)\n\
         data = open(sys.argv[3], 'rb').read()\n\
         out = pkcs7.PKCS7SignatureBuilder().set_data(data).add_signer(cert, key, hashes.{hash}())\
         .sign(serialization.Encoding.SMIME, {options})\n\
         sys.stdout.buffer.write(out)\n"
    );
    let (c, k) = (cert(&format!("{signer}.pem")), cert(&format!("{signer}.key.pem")));
    run("/usr/bin/python3", &["-c", &script, &c, &k, input.to_str().expect("path")], "python3 cryptography sign")
}

/// gpgsm's detached signature of `entity` as scott, as a multipart/signed entity.
fn gpgsm_signed(dir: &Path, entity: &[u8]) -> Vec<u8> {
    let sig = gpgsm(dir, entity, &["--local-user", "scott@example.com", "--base64", "--detach-sign"]);
    let body = String::from_utf8(entity.to_vec()).expect("entity");
    let sig = String::from_utf8(sig).expect("base64");
    format!(
        "MIME-Version: 1.0\r\nContent-Type: multipart/signed; protocol=\"application/pkcs7-signature\"; \
         micalg=sha-256; boundary=\"gpgsm-b\"\r\n\r\n--gpgsm-b\r\n{body}\r\n--gpgsm-b\r\nContent-Type: \
         application/pkcs7-signature\r\nContent-Transfer-Encoding: base64\r\n\r\n{sig}\r\n--gpgsm-b--\r\n"
    )
    .into_bytes()
}

/// gpgsm's encryption of `entity` to the gateway's certificate, as an application/pkcs7-mime
/// entity.
fn gpgsm_encrypted(dir: &Path, entity: &[u8]) -> Vec<u8> {
    let enc = gpgsm(dir, entity, &["--recipient", "aq@localhost", "--base64", "--encrypt"]);
    let enc = String::from_utf8(enc).expect("base64");
    format!(
        "MIME-Version: 1.0\r\nContent-Type: application/pkcs7-mime; smime-type=enveloped-data; name=\"smime.p7m\"\r\n\
         Content-Transfer-Encoding: base64\r\n\r\n{enc}\r\n"
    )
    .into_bytes()
}

/// gpgsm `op` on `entity` in a throwaway home (the test CA trusted, scott's key and the
/// gateway's certificate imported). gpgsm now and then loses a freshly imported key ("No
/// secret key"): tried up to three times, each in a fresh home.
fn gpgsm(dir: &Path, entity: &[u8], op: &[&str]) -> Vec<u8> {
    let mut last = String::new();
    for _ in 0..3 {
        let home = dir.join(format!("gnupg-{}", &aqgate_core::engine::session::random_id()[..8]));
        match gpgsm_once(&home, entity, op) {
            Ok(out) => return out,
            Err(why) => last = why,
        }
    }
    panic!("gpgsm {op:?} failed three times: {last}");
}

fn gpgsm_once(home: &Path, entity: &[u8], op: &[&str]) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(home).expect("gnupg home");
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::write(home.join("gpg-agent.conf"), "allow-loopback-pinentry\n").expect("agent conf");
    let fp = run("openssl", &["x509", "-in", &cert("ca.pem"), "-noout", "-fingerprint", "-sha1"], "fingerprint");
    let fp = String::from_utf8_lossy(&fp).trim().rsplit('=').next().unwrap_or_default().to_string();
    std::fs::write(home.join("trustlist.txt"), format!("{fp} S relax\n")).expect("trustlist");
    let p12 = home.join("scott.p12");
    let p12s = p12.to_str().expect("path");
    let export = ["pkcs12", "-export", "-in", &cert("scott.pem"), "-inkey", &cert("scott.key.pem"), "-out", p12s];
    let pbe = ["-passout", "pass:", "-certpbe", "PBE-SHA1-3DES", "-keypbe", "PBE-SHA1-3DES", "-macalg", "sha1"];
    run("openssl", &[&export[..], &pbe[..]].concat(), "pkcs12 export");
    let gpgsm = |args: &[&str]| Command::new("gpgsm").args(args).env("GNUPGHOME", home).stdin(Stdio::null()).output();
    for c in ["ca.pem", "gateway-smime.pem"] {
        gpgsm(&["--batch", "--import", &cert(c)]).map_err(|e| format!("gpgsm (scripts/ensure-tools.sh): {e}"))?;
    }
    for _ in 0..5 {
        // gpgsm exits 2 after a successful PKCS#12 import; the listing says whether it came.
        let _ = gpgsm(&["--batch", "--pinentry-mode", "loopback", "--import", p12s]);
        let listed = gpgsm(&["--batch", "--with-colons", "--list-secret-keys"]).map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&listed.stdout).lines().any(|l| l.starts_with("crs:")) {
            break;
        }
    }
    let input = home.join("in.eml");
    std::fs::write(&input, entity).expect("write entity");
    let out = home.join("out.b64");
    let common = ["--batch", "--pinentry-mode", "loopback", "--disable-crl-checks", "--disable-policy-checks"];
    let mut args: Vec<&str> = common.to_vec();
    args.extend_from_slice(&["--output", out.to_str().expect("path")]);
    args.extend_from_slice(op);
    args.push(input.to_str().expect("path"));
    let done = gpgsm(&args).map_err(|e| e.to_string())?;
    let _ = Command::new("gpgconf").args(["--kill", "gpg-agent"]).env("GNUPGHOME", home).output();
    if !done.status.success() {
        return Err(String::from_utf8_lossy(&done.stderr).into_owned());
    }
    std::fs::read(&out).map_err(|e| e.to_string())
}

/// swaks' exit status and transcript.
fn swaks(port: u16, mail: &Path) -> (bool, String) {
    let out = Command::new("swaks")
        .args(["--server", &format!("127.0.0.1:{port}"), "--from", "scott@example.com", "--to", "aq@localhost"])
        .args(["--helo", "client.test", "--data"])
        .arg(mail)
        .stdin(Stdio::null())
        .output()
        .expect("swaks (scripts/ensure-tools.sh installs it)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}

fn outbox(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut all: Vec<(PathBuf, String)> = std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok().map(|t| (e.path(), t))).collect())
        .unwrap_or_default();
    all.sort();
    all
}

async fn wait_for_replies(dir: &Path, n: usize) -> Vec<(PathBuf, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox(dir).len() < n {
        assert!(Instant::now() < deadline, "{} replies of {n}", outbox(dir).len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    outbox(dir)
}

/// A serving aqgate with scott's further certificates, the intermediate's CRL, the gateway's
/// S/MIME certificate and a one-hour dedupe (replay) window.
struct Served {
    _serve: Proc,
    hp: u16,
    sp: u16,
    work: PathBuf,
    out_dir: PathBuf,
}

fn serve(name: &str) -> Served {
    let work = std::env::temp_dir().join(format!("aqgate-{name}-{}", aqgate_core::engine::session::random_id()));
    std::fs::create_dir_all(&work).expect("mkdir");
    let out_dir = work.join("outbox");
    let ldif = directory_with_scotts_certificates(&work);
    let (hp, sp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let args = [
        "serve".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{hp}"),
        "--smtp-listen".into(),
        format!("127.0.0.1:{sp}"),
        "--database".into(),
        db,
        "--ldif".into(),
        ldif.to_str().expect("path").into(),
        "--smime-ca".into(),
        cert("ca.pem"),
        "--smime-crl".into(),
        cert("ca.crl"),
        "--smime-crl".into(),
        cert("sub-ca.crl"),
        "--smime-reply-cert".into(),
        cert("gateway-smime.pem"),
        "--smime-reply-key".into(),
        cert("gateway-smime.key.pem"),
        "--dedupe-window-hours".into(),
        "1".into(),
        "--mail-outbox".into(),
        out_dir.to_str().expect("path").into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serve = Proc::spawn(&format!("aqgate serve ({name})"), &mut aqgate(&args));
    wait_port(hp);
    wait_port(sp);
    Served { _serve: serve, hp, sp, work, out_dir }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

fn now() -> i64 {
    i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs())
        .expect("time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_signed_by_other_implementations_is_performed_and_bad_mail_refused() {
    let s = serve("interop");
    let dir = s.work.as_path();
    let good = example("04");
    let request = entity(&good);
    let sub_ca = cert("sub-ca.pem");
    let accepted: Vec<(&str, Vec<u8>)> = vec![
        ("openssl-cms", openssl_signed(dir, "scott", "cms", &request, &[])),
        ("openssl-cms-keyid", openssl_signed(dir, "scott", "cms", &request, &["-keyid"])),
        ("openssl-cms-keyid-opaque", openssl_signed(dir, "scott", "cms", &request, &["-keyid", "-nodetach"])),
        ("openssl-sha384", openssl_signed(dir, "scott", "cms", &request, &["-md", "sha384"])),
        ("openssl-sha512", openssl_signed(dir, "scott", "cms", &request, &["-md", "sha512"])),
        ("openssl-pss", openssl_signed(dir, "scott", "cms", &request, &["-keyopt", "rsa_padding_mode:pss"])),
        (
            "openssl-pss-key",
            openssl_signed(dir, "scott-pss", "cms", &request, &["-md", "sha384", "-keyopt", "rsa_padding_mode:pss"]),
        ),
        ("openssl-ec", openssl_signed(dir, "scott-ec", "cms", &request, &["-md", "sha384"])),
        ("openssl-intermediate", openssl_signed(dir, "sub-ca-scott", "cms", &request, &["-certfile", &sub_ca])),
        ("openssl-smime-text", openssl_signed(dir, "scott", "smime", good.as_bytes(), &["-text"])),
        ("gpgsm", gpgsm_signed(dir, &request)),
        ("python-rsa", python_signed(dir, "scott", &request, "SHA256", false)),
        ("python-ec", python_signed(dir, "scott-ec", &request, "SHA512", false)),
        ("python-text", python_signed(dir, "scott", good.as_bytes(), "SHA256", true)),
    ];
    for (name, smime) in &accepted {
        let (ok, transcript) = swaks(s.sp, &mail(dir, name, smime));
        assert!(ok && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{name}:\n{transcript}");
    }

    // Refused, each with its reason; these carry a send to NEW_ORDERS_QUE, which must stay empty.
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let bad_request = entity(&send);
    let johns = openssl_signed(dir, "john", "smime", &bad_request, &[]);
    let hour = 3600;
    let refused: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "john-wrapped-by-scott",
            openssl_signed(dir, "scott", "smime", &johns, &[]),
            "not scott@example.com's certificate in the directory",
        ),
        (
            "sha1",
            openssl_signed(dir, "scott", "cms", &bad_request, &["-md", "sha1"]),
            "digest algorithm SHA-1 is not accepted",
        ),
        (
            "revoked-by-the-intermediate",
            openssl_signed(dir, "sub-ca-revoked", "cms", &bad_request, &["-certfile", &sub_ca]),
            "is revoked",
        ),
        (
            "no-path",
            openssl_signed(dir, "sub-ca-scott", "cms", &bad_request, &[]),
            "unable to get local issuer certificate",
        ),
        (
            "signed-in-the-future",
            openssl_signed_at(dir, &format!("@{}", now() + hour), &bad_request),
            "more than 5 minutes after the mail arrived",
        ),
        (
            "signed-before-the-window",
            openssl_signed_at(dir, &format!("@{}", now() - 2 * hour), &bad_request),
            "older than the replay window",
        ),
    ];
    for (name, smime, reason) in &refused {
        let (ok, transcript) = swaks(s.sp, &mail(dir, name, smime));
        assert!(!ok && transcript.contains("<** 550 5.7.1"), "{name} was not refused:\n{transcript}");
        assert!(transcript.contains(reason), "{name}: the reply does not say {reason:?}:\n{transcript}");
    }

    // Every accepted mail was performed and answered once; the refused ones neither.
    let replies = wait_for_replies(&s.out_dir, accepted.len()).await;
    assert_eq!(replies.len(), accepted.len(), "one reply per accepted mail, none for the refused");
    for (_, reply) in &replies {
        assert!(reply.contains("To: scott@example.com"), "{reply}");
    }
    let r = http(s.hp, &example("07")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
}

/// A reply as scott reads it with the openssl CLI: decrypted with `recipient`'s key if it is
/// encrypted (must be exactly when `encrypted`), then verified against the test CA as signed
/// by the gateway; the verified content's XML.
fn open_reply(dir: &Path, reply: &Path, encrypted: bool, recipient: &str) -> String {
    let text = std::fs::read_to_string(reply).expect("reply");
    assert_eq!(text.contains("smime-type=enveloped-data"), encrypted, "{text}");
    let signed = if encrypted {
        let (c, k) = (cert(&format!("{recipient}.pem")), cert(&format!("{recipient}.key.pem")));
        let inner = run(
            "openssl",
            &["cms", "-decrypt", "-in", reply.to_str().expect("path"), "-recip", &c, "-inkey", &k],
            "decrypt the reply",
        );
        let path = dir.join(format!("decrypted-{}", aqgate_core::engine::session::random_id()));
        std::fs::write(&path, inner).expect("write");
        path
    } else {
        reply.to_path_buf()
    };
    let signer = dir.join(format!("signer-{}", aqgate_core::engine::session::random_id()));
    let args = ["cms", "-verify", "-in", signed.to_str().expect("path"), "-CAfile", &cert("ca.pem")];
    let more = ["-purpose", "smimesign", "-signer", signer.to_str().expect("path")];
    let content = run("openssl", &[&args[..], &more[..]].concat(), "verify the reply");
    // Signed by the gateway's certificate.
    let by = std::fs::read_to_string(&signer).expect("signer");
    let gateway = std::fs::read_to_string(cert("gateway-smime.pem")).expect("gateway certificate");
    assert_eq!(by.trim(), gateway.trim(), "the reply is signed with --smime-reply-cert");
    readable(&String::from_utf8_lossy(&content))
}

fn request_id(eml: &Path) -> String {
    let text = std::fs::read_to_string(eml).expect("mail");
    text.lines().find_map(|l| l.strip_prefix("Message-ID: ")).expect("Message-ID").trim().to_string()
}

/// `aqgate mail sign` as scott, optionally `--encrypt-to` the gateway.
fn aqgate_sign(dir: &Path, name: &str, idap: &str, encrypt: bool) -> PathBuf {
    let req = dir.join(format!("{name}.xml"));
    std::fs::write(&req, idap).expect("write request");
    let mut cmd = Command::new(BIN);
    cmd.args(["mail", "sign"]).arg(&req);
    cmd.args(["--cert", &cert("scott.pem"), "--key", &cert("scott.key.pem"), "--from", "scott@example.com"]);
    cmd.args(["--subject", name]);
    if encrypt {
        cmd.args(["--encrypt-to", &cert("gateway-smime.pem")]);
    }
    let out = cmd.output().expect("aqgate mail sign");
    assert!(out.status.success(), "sign: {}", String::from_utf8_lossy(&out.stderr));
    let eml = dir.join(format!("{name}.eml"));
    std::fs::write(&eml, out.stdout).expect("write mail");
    eml
}

/// `openssl TOOL -encrypt` of `entity` to `to` (certs/TO.pem) with `cipher`.
fn openssl_encrypted(dir: &Path, entity: &[u8], tool: &str, cipher: &str, to: &str) -> Vec<u8> {
    let input = dir.join(format!("plain-{}", aqgate_core::engine::session::random_id()));
    std::fs::write(&input, entity).expect("write entity");
    let to = cert(&format!("{to}.pem"));
    run("openssl", &[tool, "-encrypt", cipher, "-in", input.to_str().expect("path"), &to], "openssl encrypt")
}

/// The reply (path, text) that answers the mail with Message-ID `id`.
fn reply_to(replies: &[(PathBuf, String)], id: &str) -> (PathBuf, String) {
    let found: Vec<&(PathBuf, String)> =
        replies.iter().filter(|(_, t)| t.contains(&format!("In-Reply-To: {id}"))).collect();
    assert_eq!(found.len(), 1, "one reply to {id}: {replies:?}");
    found[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_requests_are_performed_and_replies_are_signed_and_encrypted() {
    let s = serve("encrypted");
    let dir = s.work.as_path();
    let publish = example("04");

    // Signed, then encrypted to the gateway: by `aqgate mail sign --encrypt-to`, by the
    // openssl CLI (enveloped-data AES-256-CBC over an ECDSA-signed request; authEnveloped-
    // data AES-256-GCM), by gpgsm. And one only signed.
    let by_aqgate = aqgate_sign(dir, "aqgate-encrypted", &publish, true);
    let ec_signed = openssl_signed(dir, "scott-ec", "smime", &entity(&publish), &[]);
    let by_openssl =
        mail(dir, "openssl-encrypted", &openssl_encrypted(dir, &ec_signed, "smime", "-aes256", "gateway-smime"));
    let rsa_signed = openssl_signed(dir, "scott", "cms", &entity(&publish), &["-keyid"]);
    let by_gcm = mail(dir, "openssl-gcm", &openssl_encrypted(dir, &rsa_signed, "cms", "-aes-256-gcm", "gateway-smime"));
    let gpg_signed = gpgsm_signed(dir, &entity(&publish));
    let by_gpgsm = mail(dir, "gpgsm-encrypted", &gpgsm_encrypted(dir, &gpg_signed));
    let plain = aqgate_sign(dir, "signed-only", &publish, false);
    for eml in [&by_aqgate, &by_openssl, &by_gcm, &by_gpgsm, &plain] {
        let (ok, transcript) = swaks(s.sp, eml);
        assert!(ok && transcript.contains("250 2.0.0 verified for agent SCOTT"), "{}:\n{transcript}", eml.display());
    }

    // Refused and not performed: encrypted to someone else, encrypted but not signed.
    let send = example("01").replace("</message_set>", "</message_set><AQXmlCommit/>");
    let signed_send = openssl_signed(dir, "scott", "smime", &entity(&send), &[]);
    let not_ours = mail(dir, "to-scott", &openssl_encrypted(dir, &signed_send, "smime", "-aes256", "scott"));
    let unsigned = mail(dir, "unsigned", &openssl_encrypted(dir, &entity(&send), "smime", "-aes256", "gateway-smime"));
    for (eml, reason) in [(&not_ours, "not encrypted to the gateway's certificate"), (&unsigned, "not signed")] {
        let (ok, transcript) = swaks(s.sp, eml);
        assert!(!ok && transcript.contains("<** 550 5.7.1"), "{}:\n{transcript}", eml.display());
        assert!(transcript.contains(reason), "{}: {reason:?}:\n{transcript}", eml.display());
    }

    // Each answer threads to its request; encrypted requests get replies encrypted to the
    // signer's directory certificate, signed by the gateway; openssl reads them all.
    let replies = wait_for_replies(&s.out_dir, 5).await;
    assert_eq!(replies.len(), 5, "nothing for the refused mails");
    for (eml, encrypted, recipient) in [
        (&by_aqgate, true, "scott"),
        (&by_openssl, true, "scott-ec"),
        (&by_gcm, true, "scott"),
        (&by_gpgsm, true, "scott"),
        (&plain, false, "scott"),
    ] {
        let (path, text) = reply_to(&replies, &request_id(eml));
        assert!(text.contains("Message-ID: <aqgate.") && text.contains("To: scott@example.com"), "{text}");
        let xml = open_reply(dir, &path, encrypted, recipient);
        assert!(xml.contains("AQXmlPublishResponse"), "{}: {xml}", eml.display());
    }

    // The encrypted request encrypted again (a new ciphertext of the same signed mail) is a
    // replay: not performed again; the response goes again, threaded to this copy, encrypted.
    let text = std::fs::read_to_string(&by_openssl).expect("mail");
    let again = dir.join("again.eml");
    std::fs::write(
        &again,
        format!(
            "Message-ID: <again@example.com>\r\n{}",
            String::from_utf8_lossy(&openssl_encrypted(dir, &ec_signed, "cms", "-aes-128-cbc", "gateway-smime"))
        ),
    )
    .expect("write");
    let headers: String = text
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("From:") || l.starts_with("To:") || l.starts_with("Subject:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    let again_text = std::fs::read_to_string(&again).expect("mail");
    std::fs::write(&again, format!("{headers}{again_text}")).expect("write");
    let (ok, transcript) = swaks(s.sp, &again);
    assert!(ok && transcript.contains("already have this request"), "{transcript}");
    let replies = wait_for_replies(&s.out_dir, 6).await;
    let (path, _) = reply_to(&replies, "<again@example.com>");
    assert!(open_reply(dir, &path, true, "scott-ec").contains("AQXmlPublishResponse"));
    let r = http(s.hp, &example("07")).await;
    assert!(matches!(r, Response::Fault(ref f) if f.code == aqgate_core::error::code::NO_MESSAGE), "{r:?}");
}
