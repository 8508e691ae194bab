//! SAML 2.0 login against a real IdP: SimpleSAMLphp (scripts/simplesamlphp.sh) signs
//! assertions after a real login through its form, and a real `aqgate serve` takes them in
//! the `AQ-SAML-Assertion` header or in the IDAP `Header` (`wsse:Security`). The forgery
//! corpus is built from those real signed documents (and re-signed with xmlsec1 where a
//! forgery needs a valid signature over changed content); each is refused with a Fault
//! that says why, and performs nothing. Two nodes on one PostgreSQL database share the
//! replay cache.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::*;

const SP: &str = "urn:aqgate:test";
const RAWQ: &str = "AQUSER.RAW_QUE";
const SAML_NS: &str = "urn:oasis:names:tc:SAML:2.0:assertion";

/// An IdP and an `aqgate serve` that trusts it, on a fresh SQLite database, with one more
/// agent (`mailonly`, not enabled for HTTP).
struct Setup {
    idp: SimpleSamlPhp,
    port: u16,
    _serve: Proc,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A scratch directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let d =
                std::env::temp_dir().join(format!("aqgate-saml-{}", &aqgate_core::engine::session::random_id()[..12]));
            std::fs::create_dir_all(&d).expect("mkdir");
            Self(d)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn setup(extra: &[&str]) -> Setup {
    let idp = SimpleSamlPhp::start();
    let dir = tempdir::Dir::new();
    let db = format!("sqlite://{}", dir.0.join("aq.db").display());
    let (serve, port) = node(&idp, &dir, &db, extra);
    Setup { idp, port, _serve: serve, _dir: dir }
}

/// `aqgate serve` on `db` trusting `idp`, ready; its topology file goes into `dir`.
fn node(idp: &SimpleSamlPhp, dir: &tempdir::Dir, db: &str, extra: &[&str]) -> (Proc, u16) {
    let topology = dir.0.join("topology.toml");
    std::fs::write(
        &topology,
        format!(
            "{}\n[[agents]]\nname = \"mailonly\"\npassword = \"mailonly\"\nprotocols = [\"smtp\"]\ndb_users = [\"AQUSER\"]\n",
            aqgate_admin::DEFAULT_TOPOLOGY
        ),
    )
    .expect("topology");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let metadata = idp.metadata();
    let mut args = vec![
        "serve",
        "--no-smtp",
        "--no-notify",
        "--listen",
        &listen,
        "--database",
        db,
        "--topology",
        topology.to_str().expect("path"),
        "--saml-idp-metadata",
        metadata.to_str().expect("path"),
        "--saml-entity-id",
        SP,
    ];
    args.extend_from_slice(extra);
    let ready = extra.iter().position(|a| *a == "--plain-listen").map_or(port, |i| {
        extra[i + 1].rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("--plain-listen port")
    });
    let mut serve = Proc::spawn("aqgate serve", &mut aqgate(&args));
    serve.wait_ready(ready, Duration::from_secs(60));
    (serve, port)
}

/// Over HTTPS, a client certificate that logs in as another agent than the assertion's
/// subject is refused (and the assertion stays unused); the same agent's is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_of_another_agent_is_refused() {
    let root = env!("CARGO_MANIFEST_DIR");
    let idp = SimpleSamlPhp::start();
    let dir = tempdir::Dir::new();
    let db = format!("sqlite://{}", dir.0.join("aq.db").display());
    let plain = format!("127.0.0.1:{}", free_port());
    let (tls_cert, tls_key, client_ca) = (
        format!("{root}/certs/gateway-tls.pem"),
        format!("{root}/certs/gateway-tls.key.pem"),
        format!("{root}/certs/client/ca.pem"),
    );
    let flags =
        ["--tls-cert", &tls_cert, "--tls-key", &tls_key, "--tls-client-ca", &client_ca, "--plain-listen", &plain];
    let (_serve, port) = node(&idp, &dir, &db, &flags);
    let body = dir.0.join("send.xml");
    std::fs::write(&body, send("3001")).expect("body");
    let curl = |assertion: &str| {
        let out = Command::new("curl")
            .args(["-sS", "--cacert", &format!("{root}/certs/ca.pem"), "-H", "Content-Type: text/xml"])
            .args([
                "--cert",
                &format!("{root}/certs/client/scott.pem"),
                "--key",
                &format!("{root}/certs/client/scott.key.pem"),
            ])
            .args(["-H", &format!("AQ-SAML-Assertion: {assertion}"), "-w", "\n%{http_code}"])
            .arg("--data-binary")
            .arg(format!("@{}", body.display()))
            .arg(format!("https://localhost:{port}/aqserv"))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let john = idp.login(SP, "john", "welcome");
    let r = curl(&john);
    assert!(r.ends_with("\n401"), "{r}");
    assert!(r.contains("the client certificate logs in as SCOTT, the SAML assertion as JOHN"), "{r}");
    let r = curl(&idp.login(SP, "scott", "tiger"));
    assert!(r.ends_with("\n200") && r.contains("AQXmlSendResponse"), "{r}");
    // john's assertion was not used up by the refusal: over plain HTTP it logs in once.
    let plain_port: u16 = plain.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("port");
    assert_ok(&with_header(plain_port, &unb64(&john), send("3002")).await);
    let mut got = drain(plain_port).await;
    got.sort();
    assert_eq!(got, ["3001", "3002"]);
}

/// Two nodes on one PostgreSQL database share the replay cache: an assertion used on one
/// is refused on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assertion_used_on_one_node_is_refused_on_another() {
    let idp = SimpleSamlPhp::start();
    let db = fresh_pg_url().await;
    let (dir_a, dir_b) = (tempdir::Dir::new(), tempdir::Dir::new());
    let (_a, port_a) = node(&idp, &dir_a, &db, &[]);
    let (_b, port_b) = node(&idp, &dir_b, &db, &[]);
    let response = unb64(&idp.login(SP, "scott", "tiger"));
    let assertion = assertion_of(&unb64(&idp.login(SP, "john", "welcome")));
    assert_ok(&with_header(port_a, &response, send("2001")).await);
    assert_refused(&with_header(port_b, &response, send("2002")).await, "was used before");
    assert_ok(&post(port_b, &[], in_soap_header(&assertion, &send("2003"))).await);
    assert_refused(&post(port_a, &[], in_soap_header(&assertion, &send("2004"))).await, "was used before");
    let mut got = drain(port_a).await;
    got.sort();
    assert_eq!(got, ["2001", "2003"]);
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(s: &str) -> String {
    use base64::Engine as _;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).expect("base64")).expect("utf-8")
}

/// `s[from..to]` where `from` is where `start` begins and `to` where `end` ends (first
/// occurrences from `at`).
fn span(s: &str, start: &str, end: &str) -> (usize, usize) {
    let a = s.find(start).unwrap_or_else(|| panic!("no {start} in {s}"));
    let b = s[a..].find(end).unwrap_or_else(|| panic!("no {end} in {s}")) + a + end.len();
    (a, b)
}

fn cut<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let (a, b) = span(s, start, end);
    &s[a..b]
}

/// The signed assertion of a Response, as a document of its own (its `saml` prefix,
/// declared on the Response, declared on it: exclusive canonicalisation makes that the
/// same signed bytes).
fn assertion_of(response: &str) -> String {
    cut(response, "<saml:Assertion ", "</saml:Assertion>").replacen(
        "<saml:Assertion ",
        &format!("<saml:Assertion xmlns:saml=\"{SAML_NS}\" "),
        1,
    )
}

/// The value of the first attribute ` name="…"` in `s`.
fn attr(s: &str, name: &str) -> String {
    let pat = format!(" {name}=\"");
    let a = s.find(&pat).unwrap_or_else(|| panic!("no {name} in {s}")) + pat.len();
    let b = s[a..].find('"').expect("end quote") + a;
    s[a..b].to_string()
}

fn without_signatures(xml: &str) -> String {
    let mut s = xml.to_string();
    while let Some(a) = s.find("<ds:Signature ") {
        let b = s[a..].find("</ds:Signature>").expect("end") + a + "</ds:Signature>".len();
        s.replace_range(a..b, "");
    }
    s
}

/// Signs the assertion `xml` (whose Signature template is its first `ds:Signature`, values
/// cleared) with `key` (PEM) by xmlsec1; `cert` is put into the KeyInfo when given.
fn sign(xml: &str, key: &Path, cert: Option<&Path>) -> String {
    let mut t = xml.to_string();
    let clear = |t: &mut String, open: &str, close: &str| {
        let (a, b) = span(t, open, close);
        t.replace_range(a..b, &format!("{open}{close}"));
    };
    clear(&mut t, "<ds:DigestValue>", "</ds:DigestValue>");
    clear(&mut t, "<ds:SignatureValue>", "</ds:SignatureValue>");
    if t.contains("<ds:KeyInfo>") {
        let (a, b) = span(&t, "<ds:KeyInfo>", "</ds:KeyInfo>");
        t.replace_range(a..b, "");
    }
    if cert.is_some() {
        t = t.replacen("</ds:SignatureValue>", "</ds:SignatureValue><ds:KeyInfo><ds:X509Data/></ds:KeyInfo>", 1);
    }
    let dir = tempdir::Dir::new();
    let (input, output) = (dir.0.join("in.xml"), dir.0.join("out.xml"));
    std::fs::write(&input, t).expect("write");
    let keyspec = match cert {
        Some(c) => format!("{},{}", key.display(), c.display()),
        None => key.display().to_string(),
    };
    let out = Command::new("xmlsec1")
        .args(["--sign", "--privkey-pem", &keyspec, "--id-attr:ID", &format!("{SAML_NS}:Assertion"), "--output"])
        .arg(&output)
        .arg(&input)
        .output()
        .expect("run xmlsec1 (scripts/ensure-tools.sh installs it)");
    assert!(out.status.success(), "xmlsec1: {}", String::from_utf8_lossy(&out.stderr));
    let signed = std::fs::read_to_string(&output).expect("read");
    // xmlsec1 writes an XML declaration: the assertion alone is what a client sends.
    signed.find("<saml:Assertion").map(|i| signed[i..].to_string()).expect("the assertion")
}

/// A send of one RAW message with a trailing commit.
fn send(payload: &str) -> String {
    raw_send(RAWQ, &[("", payload)], COMMIT)
}

async fn post(port: u16, headers: &[(&str, String)], body: String) -> (u16, String, Option<String>) {
    let mut rb = reqwest::Client::new().post(aqserv(port)).header("content-type", "text/xml").body(body);
    for (k, v) in headers {
        rb = rb.header(*k, v);
    }
    let r = rb.send().await.expect("post");
    let cookie = set_cookie(&r);
    (r.status().as_u16(), r.text().await.expect("body"), cookie)
}

/// POSTs `body` with the assertion `xml` in `AQ-SAML-Assertion`.
async fn with_header(port: u16, xml: &str, body: String) -> (u16, String, Option<String>) {
    post(port, &[("aq-saml-assertion", b64(xml))], body).await
}

/// The request `body` with the assertion `xml` in its Header, as WS-Security carries it.
fn in_soap_header(xml: &str, body: &str) -> String {
    let wsse = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd";
    let header = format!("<Header><wsse:Security xmlns:wsse=\"{wsse}\">{xml}</wsse:Security></Header>");
    let i = body.find("<Body>").expect("a Body");
    format!("{}{header}{}", &body[..i], &body[i..])
}

/// Everything on the queue, taken as scott with Basic (and committed).
async fn drain(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let r = http(port, &receive(RAWQ, "<wait_time>0</wait_time>", COMMIT)).await;
        match r {
            Response::Fault(f) if f.code == code::NO_MESSAGE => return out,
            r => out.extend(received(&r).iter().map(raw_of)),
        }
    }
}

fn assert_refused((status, body, _): &(u16, String, Option<String>), why: &str) {
    assert_eq!(*status, 401, "{body}");
    let f = match parse_idap(body.as_bytes()) {
        Response::Fault(f) => f,
        other => panic!("not a Fault: {other:?}"),
    };
    assert!(f.message.contains(why), "expected a fault saying {why:?}, got {:?}", f.message);
}

fn assert_ok((status, body, _): &(u16, String, Option<String>)) {
    assert_eq!(*status, 200, "{body}");
    assert!(!matches!(parse_idap(body.as_bytes()), Response::Fault(_)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_idp_assertion_logs_in_once_in_either_form() {
    let s = setup(&[]);
    let port = s.port;

    // The Response as the IdP posts it (Response and assertion signed), in the HTTP header.
    let response = unb64(&s.idp.login(SP, "scott", "tiger"));
    let r = with_header(port, &response, send("0A01")).await;
    assert_ok(&r);
    assert_eq!(drain(port).await, ["0A01"], "performed as scott");
    // The same assertion again: a replay.
    let again = with_header(port, &response, send("0A02")).await;
    assert_refused(&again, "was used before");

    // The assertion alone, in the IDAP request's own Header (wsse:Security).
    let assertion = assertion_of(&unb64(&s.idp.login(SP, "scott", "tiger")));
    let r = post(port, &[], in_soap_header(&assertion, &send("0A03"))).await;
    assert_ok(&r);
    let replay = post(port, &[], in_soap_header(&assertion, &send("0A04"))).await;
    assert_refused(&replay, "was used before");
    assert_eq!(drain(port).await, ["0A03"]);

    // Only the assertion signed (no Response signature), and only the Response signed.
    for sp in ["urn:aqgate:assertion-signed", "urn:aqgate:response-signed"] {
        let r = with_header(port, &unb64(&s.idp.login(sp, "john", "welcome")), send("0B01")).await;
        assert_ok(&r);
    }
    assert_eq!(drain(port).await, ["0B01", "0B01"]);

    // A session opened with SAML goes on with its cookie alone, as with Basic.
    let login =
        with_header(port, &unb64(&s.idp.login(SP, "scott", "tiger")), raw_send(RAWQ, &[("", "0C01")], "")).await;
    assert_ok(&login);
    let cookie = login.2.clone().expect("a session cookie");
    assert_eq!(drain(port).await, Vec::<String>::new(), "not committed yet");
    let commit = post(port, &[("cookie", cookie)], envelope(COMMIT)).await;
    assert_ok(&commit);
    assert_eq!(drain(port).await, ["0C01"]);

    // Who the subject names: no agent; an agent not enabled for HTTP.
    let nobody = with_header(port, &unb64(&s.idp.login(SP, "nobody", "nobody")), send("0D01")).await;
    assert_refused(&nobody, "names no agent");
    let mail = with_header(port, &unb64(&s.idp.login(SP, "mailonly", "mailonly")), send("0D02")).await;
    assert_refused(&mail, "not enabled for HTTP");
    // Both a SAML assertion and Basic credentials: refused, whoever they name.
    let both = post(
        port,
        &[
            ("aq-saml-assertion", b64(&unb64(&s.idp.login(SP, "john", "welcome")))),
            ("authorization", "Basic c2NvdHQ6dGlnZXI=".into()),
        ],
        send("0D03"),
    )
    .await;
    assert_refused(&both, "not both");
    assert_eq!(drain(port).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attribute_can_name_the_agent() {
    let s = setup(&["--saml-agent-attribute", "mail"]);
    // mail is scott@example.com, which names no agent; the NameID (scott) is not used.
    let r = with_header(s.port, &unb64(&s.idp.login(SP, "scott", "tiger")), send("0E01")).await;
    assert_refused(&r, "\"scott@example.com\" names no agent");
    drop(s);
    let s = setup(&["--saml-agent-attribute", "uid"]);
    let r = with_header(s.port, &unb64(&s.idp.login(SP, "scott", "tiger")), send("0E02")).await;
    assert_ok(&r);
    assert_eq!(drain(s.port).await, ["0E02"]);
}

/// A Response signed by the IdP over its whole content (only the Response signed): the
/// material of XSW1–XSW3. The evil assertion names john instead of scott, with a new ID.
fn evil_assertion(response: &str) -> String {
    let a = cut(response, "<saml:Assertion ", "</saml:Assertion>");
    let id = attr(a, "ID");
    a.replace(&format!(" ID=\"{id}\""), " ID=\"_evil\"").replace(">scott</saml:NameID>", ">john</saml:NameID>")
}

fn response_id(response: &str) -> String {
    attr(cut(response, "<samlp:Response ", ">"), "ID")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgeries_are_refused_and_perform_nothing() {
    let s = setup(&[]);
    let port = s.port;
    let key = s.idp.key();
    let mut corpus: Vec<(&str, String, &str)> = Vec::new();

    // --- Response-level signatures (only the Response signed) -----------------------
    let resp = unb64(&s.idp.login("urn:aqgate:response-signed", "scott", "tiger"));
    let rid = response_id(&resp);
    let signature = cut(&resp, "<ds:Signature ", "</ds:Signature>").to_string();
    let evil = evil_assertion(&resp);
    let open = cut(&resp, "<samlp:Response ", ">").replace(&format!(" ID=\"{rid}\""), " ID=\"_evilresponse\"");
    let issuer = cut(&resp, "<saml:Issuer>", "</saml:Issuer>").to_string();
    let status = cut(&resp, "<samlp:Status>", "</samlp:Status>").to_string();
    // XSW1: an evil Response whose copied signature holds the original Response (ds:Object).
    let sig_with_orig =
        signature.replacen("</ds:Signature>", &format!("<ds:Object>{resp}</ds:Object></ds:Signature>"), 1);
    corpus.push(("XSW1", format!("{open}{issuer}{sig_with_orig}{status}{evil}</samlp:Response>"), "assertions"));
    // XSW2: an evil Response with the original Response beside (before) the signature.
    corpus.push(("XSW2", format!("{open}{issuer}{resp}{signature}{status}{evil}</samlp:Response>"), "assertions"));
    // XSW3: an evil Response with the original Response in its Extensions.
    corpus.push((
        "XSW3",
        format!("{open}{issuer}<samlp:Extensions>{resp}</samlp:Extensions>{status}{evil}</samlp:Response>"),
        "assertions",
    ));
    // The evil assertion put in place of the signed one: the digest no longer matches.
    let (a, b) = span(&resp, "<saml:Assertion ", "</saml:Assertion>");
    let swapped = format!("{}{}{}", &resp[..a], evil.replace("_evil", &attr(&resp[a..b], "ID")), &resp[b..]);
    corpus.push(("content changed under the signature", swapped, "signature is not valid"));

    // --- Assertion-level signatures (only the assertion signed) ---------------------
    let resp = unb64(&s.idp.login("urn:aqgate:assertion-signed", "scott", "tiger"));
    let orig = cut(&resp, "<saml:Assertion ", "</saml:Assertion>").to_string();
    let oid = attr(&orig, "ID");
    let asig = cut(&orig, "<ds:Signature ", "</ds:Signature>").to_string();
    let bare = orig.replace(&asig, "");
    let evil =
        bare.replace(&format!(" ID=\"{oid}\""), " ID=\"_evil\"").replace(">scott</saml:NameID>", ">john</saml:NameID>");
    let in_response = |inner: &str| resp.replace(&orig, inner);
    let evil_signed = |sig: &str| evil.replacen("</saml:Issuer>", &format!("</saml:Issuer>{sig}"), 1);
    // XSW4: the evil assertion wraps the original one.
    corpus.push((
        "XSW4",
        in_response(&evil.replacen("</saml:Assertion>", &format!("{orig}</saml:Assertion>"), 1)),
        "assertions",
    ));
    // XSW5: the evil assertion carries the copied signature; the original (unsigned) follows.
    corpus.push(("XSW5", in_response(&format!("{}{bare}", evil_signed(&asig))), "assertions"));
    // XSW6: the evil assertion carries the copied signature, the original inside it.
    let sig_with = asig.replacen("</ds:Signature>", &format!("<ds:Object>{orig}</ds:Object></ds:Signature>"), 1);
    corpus.push(("XSW6", in_response(&evil_signed(&sig_with)), "assertions"));
    // XSW7: the original in an Extensions element, the evil assertion after it.
    corpus.push(("XSW7", in_response(&format!("<samlp:Extensions>{orig}</samlp:Extensions>{evil}")), "assertions"));
    // XSW8: the evil assertion's copied signature holds the original, unsigned, in an Object.
    let sig_with_bare = asig.replacen("</ds:Signature>", &format!("<ds:Object>{bare}</ds:Object></ds:Signature>"), 1);
    corpus.push(("XSW8", in_response(&evil_signed(&sig_with_bare)), "assertions"));
    // One assertion only, the evil one, with the copied signature: its reference is not its own.
    corpus.push(("signature moved to another assertion", in_response(&evil_signed(&asig)), "does not cover"));

    // --- Unsigned, another key -------------------------------------------------------
    let resp = unb64(&s.idp.login(SP, "scott", "tiger"));
    corpus.push(("unsigned", without_signatures(&resp), "not signed"));
    let standalone = assertion_of(&unb64(&s.idp.login("urn:aqgate:assertion-signed", "scott", "tiger")));
    let other = tempdir::Dir::new();
    let (okey, ocert) = (other.0.join("k.pem"), other.0.join("c.pem"));
    let st = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=attacker"])
        .arg("-keyout")
        .arg(&okey)
        .arg("-out")
        .arg(&ocert)
        .output()
        .expect("openssl");
    assert!(st.status.success());
    // Its certificate rides along in KeyInfo: it must not be trusted.
    corpus.push(("signed by another key", sign(&standalone, &okey, Some(&ocert)), "signature is not valid"));

    // --- Signed by the IdP's key, but wrong: times, audience, issuer ----------------
    let fresh = || assertion_of(&unb64(&s.idp.login("urn:aqgate:assertion-signed", "scott", "tiger")));
    let set_attr = |xml: &str, attr: &str, value: &str| -> String {
        let mut out = String::new();
        let mut rest = xml;
        let pat = format!("{attr}=\"");
        while let Some(i) = rest.find(&pat) {
            let j = rest[i + pat.len()..].find('"').expect("end") + i + pat.len();
            out.push_str(&rest[..i]);
            out.push_str(&format!("{pat}{value}"));
            rest = &rest[j..];
        }
        out.push_str(rest);
        out
    };
    corpus.push(("expired", sign(&set_attr(&fresh(), "NotOnOrAfter", "2020-01-01T00:00:00Z"), &key, None), "expired"));
    corpus.push((
        "not yet valid",
        sign(&set_attr(&fresh(), "NotBefore", "2099-01-01T00:00:00Z"), &key, None),
        "not yet valid",
    ));
    let f = fresh();
    let wrong_issuer = f.replace(&format!(">{}<", s.idp.entity_id()), ">https://evil.example/idp<");
    corpus.push(("wrong issuer", sign(&wrong_issuer, &key, None), "issued by \"https://evil.example/idp\""));
    corpus.push(("wrong audience", unb64(&s.idp.login("urn:other:sp", "scott", "tiger")), "audience"));
    let bearerless =
        fresh().replace("urn:oasis:names:tc:SAML:2.0:cm:bearer", "urn:oasis:names:tc:SAML:2.0:cm:holder-of-key");
    corpus.push(("not bearer", sign(&bearerless, &key, None), "no bearer SubjectConfirmation"));
    // The control: the same re-signing of an unchanged assertion is accepted (below), so
    // the refusals above are the checks', not the signer's.
    let control = sign(&fresh(), &key, None);

    // --- A comment inside the NameID, a DOCTYPE -------------------------------------
    let evil_resp = unb64(&s.idp.login(SP, "scott@evil.example", "evil"));
    let commented = evil_resp.replace(">scott@evil.example</saml:NameID>", ">scott<!---->@evil.example</saml:NameID>");
    assert_ne!(commented, evil_resp);
    corpus.push(("comment in the NameID", commented, "comment"));
    let doctype =
        format!("<!DOCTYPE samlp:Response [<!ENTITY who \"scott\">]>{}", unb64(&s.idp.login(SP, "scott", "tiger")));
    corpus.push(("DOCTYPE", doctype, "DOCTYPE"));

    for (name, xml, why) in &corpus {
        let r = with_header(port, xml, send("0F01")).await;
        assert_eq!(r.0, 401, "{name}: {}", r.1);
        if !r.1.contains(why) {
            let _ = std::fs::write(std::env::temp_dir().join("aqgate-saml-failed.xml"), xml);
        }
        assert!(r.1.contains(why), "{name}: {}", r.1);
        assert_refused(&r, why);
    }
    // The SOAP-header form is held to the same rules.
    let r = post(port, &[], in_soap_header(&without_signatures(&standalone), &send("0F02"))).await;
    assert_refused(&r, "not signed");
    let r = post(
        port,
        &[],
        in_soap_header(&format!("{standalone}{}", assertion_of(&evil_assertion(&resp))), &send("0F03")),
    )
    .await;
    assert_refused(&r, "assertions");
    // A second assertion whose prefix is declared nowhere (so that a namespace-blind
    // count would miss it).
    let hidden = in_soap_header(&format!("{standalone}{}", evil_assertion(&resp)), &send("0F05"));
    assert_refused(&post(port, &[], hidden).await, "undeclared namespace prefix");
    assert_eq!(drain(port).await, Vec::<String>::new(), "no forgery performed anything");

    // The full text of a NameID is its name: scott@evil.example is no agent (never scott).
    let r = with_header(port, &evil_resp, send("0F04")).await;
    assert_refused(&r, "\"scott@evil.example\" names no agent");
    // Nothing was recorded for the refused: the assertion the "other key" forgery came
    // from still logs in once, and the control re-signed by the IdP's key too.
    assert_ok(&with_header(port, &standalone, send("1001")).await);
    assert_ok(&with_header(port, &control, send("1002")).await);
    assert_eq!(drain(port).await, ["1001", "1002"]);
}

/// Many logins at once (xmlsec verifies on the blocking pool, several at a time): each
/// assertion logs in exactly once, even when the same one comes twice at the same moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_logins_each_succeed_once() {
    let s = setup(&[]);
    let port = s.port;
    let responses: Vec<String> = (0..12).map(|_| unb64(&s.idp.login(SP, "scott", "tiger"))).collect();
    let mut tasks = Vec::new();
    for (i, r) in responses.iter().enumerate() {
        for copy in 0..2 {
            let (r, payload) = (r.clone(), format!("{:02X}{copy:02X}", i));
            tasks.push(tokio::spawn(async move { with_header(port, &r, send(&payload)).await }));
        }
    }
    let mut ok = 0;
    for t in tasks {
        let r = t.await.expect("task");
        match r.0 {
            200 => {
                assert_ok(&r);
                ok += 1;
            }
            _ => assert_refused(&r, "was used before"),
        }
    }
    assert_eq!(ok, responses.len(), "each assertion exactly once");
    let got = drain(port).await;
    assert_eq!(got.len(), responses.len());
    let mut ids: Vec<String> = got.iter().map(|p| p[..2].to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), responses.len(), "one message per assertion: {got:?}");
}

/// IdP accounts whose uid only looks like scott's (a trailing no-break or ideographic space,
/// padding, a Cyrillic letter) are refused with the reason, never taken for scott; scott
/// himself logs in. The attribute form is held to the same rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_names_are_refused_not_taken_for_an_agent() {
    let cases = [
        ("scott-nbsp", "surrounding whitespace"),
        ("scott-ideographic", "surrounding whitespace"),
        ("scott-padded", "surrounding whitespace"),
        ("scott-cyrillic", "U+043E"),
    ];
    for attribute in [None, Some("uid")] {
        let extra: Vec<&str> = attribute.map_or(vec![], |a| vec!["--saml-agent-attribute", a]);
        let s = setup(&extra);
        for (user, why) in cases {
            let r = with_header(s.port, &unb64(&s.idp.login(SP, user, "tiger")), send("1101")).await;
            assert_refused(&r, why);
        }
        assert_eq!(drain(s.port).await, Vec::<String>::new(), "no look-alike performed anything");
        assert_ok(&with_header(s.port, &unb64(&s.idp.login(SP, "scott", "tiger")), send("1102")).await);
        assert_eq!(drain(s.port).await, ["1102"]);
    }
}

/// A Response in `AQ-SAML-Assertion` and another agent's assertion in the IDAP Header:
/// refused as two identities (neither wins), and neither assertion is used up by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_assertions_in_both_forms_is_refused() {
    let s = setup(&[]);
    let scott = unb64(&s.idp.login(SP, "scott", "tiger"));
    let john = assertion_of(&unb64(&s.idp.login(SP, "john", "welcome")));
    let both = with_header(s.port, &scott, in_soap_header(&john, &send("1201"))).await;
    assert_refused(&both, "both in AQ-SAML-Assertion and in its IDAP Header");
    assert_eq!(drain(s.port).await, Vec::<String>::new());
    assert_ok(&with_header(s.port, &scott, send("1202")).await);
    assert_ok(&post(s.port, &[], in_soap_header(&john, &send("1203"))).await);
    let mut got = drain(s.port).await;
    got.sort();
    assert_eq!(got, ["1202", "1203"]);
}

/// Sets every `name="…"` attribute of the element that starts with `element` (first one).
fn set_on(xml: &str, element: &str, name: &str, value: &str) -> String {
    let (a, b) = span(xml, element, ">");
    let old = attr(&xml[a..b], name);
    let tag = xml[a..b].replacen(&format!(" {name}=\"{old}\""), &format!(" {name}=\"{value}\""), 1);
    format!("{}{tag}{}", &xml[..a], &xml[b..])
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// An assertion with two bearer confirmations, one ending in a few seconds and one in ten
/// minutes, is remembered until the later one ends: after the earlier end (and the skew)
/// and a restart, whose first time-manager round purges what is past its time, the replay
/// is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assertion_is_remembered_until_its_last_confirmation_ends() {
    let idp = SimpleSamlPhp::start();
    let dir = tempdir::Dir::new();
    let db = format!("sqlite://{}", dir.0.join("aq.db").display());
    let skew = ["--saml-clock-skew", "1"];
    let now = chrono::Utc::now();
    let (soon, later) = (rfc3339(now + chrono::Duration::seconds(3)), rfc3339(now + chrono::Duration::minutes(10)));
    let fresh = assertion_of(&unb64(&idp.login("urn:aqgate:assertion-signed", "scott", "tiger")));
    let confirmation = cut(&fresh, "<saml:SubjectConfirmation ", "</saml:SubjectConfirmation>").to_string();
    let short = set_on(&confirmation, "<saml:SubjectConfirmationData ", "NotOnOrAfter", &soon);
    let long = set_on(&confirmation, "<saml:SubjectConfirmationData ", "NotOnOrAfter", &later);
    let two = fresh.replace(&confirmation, &format!("{short}{long}"));
    let two = set_on(&two, "<saml:Conditions ", "NotOnOrAfter", &later);
    let signed = sign(&two, &idp.key(), None);

    let (serve, port) = node(&idp, &dir, &db, &skew);
    assert_ok(&with_header(port, &signed, send("1301")).await);
    drop(serve);
    // Past the short confirmation's end and the skew.
    let wait = (now + chrono::Duration::seconds(5) - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    let (_serve, port) = node(&idp, &dir, &db, &skew);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_refused(&with_header(port, &signed, send("1302")).await, "was used before");
    assert_eq!(drain(port).await, ["1301"]);
}

/// A forged assertion (its digest and signature garbage) whose signature asks for an
/// XSLT transform that includes a URL, an XPath filter, or a key fetched by
/// `RetrievalMethod`: refused before any of it runs, naming what was refused; the URL is
/// never fetched. Signatures the IdP's key made with SHA-1, or an HMAC method, are refused
/// naming the algorithm. Nothing libxml2 or xmlsec say reaches standard error raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_may_ask_only_for_safe_work() {
    let s = setup(&[]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let trap = format!("http://127.0.0.1:{}/internal", listener.local_addr().expect("addr").port());
    let fresh = || assertion_of(&unb64(&s.idp.login("urn:aqgate:assertion-signed", "scott", "tiger")));
    let enveloped = r#"<ds:Transform Algorithm="http://www.w3.org/2000/09/xmldsig#enveloped-signature"/>"#;
    let garbage = |xml: String| {
        let (a, b) = span(&xml, "<ds:DigestValue>", "</ds:DigestValue>");
        let xml = format!("{}<ds:DigestValue>AAAA</ds:DigestValue>{}", &xml[..a], &xml[b..]);
        let (a, b) = span(&xml, "<ds:SignatureValue>", "</ds:SignatureValue>");
        format!("{}<ds:SignatureValue>AAAA</ds:SignatureValue>{}", &xml[..a], &xml[b..])
    };
    let xslt = format!(
        r#"<ds:Transform Algorithm="http://www.w3.org/TR/1999/REC-xslt-19991116"><xsl:stylesheet xmlns:xsl="http://www.w3.org/1999/XSL/Transform" version="1.0"><xsl:include href="{trap}"/></xsl:stylesheet></ds:Transform>"#
    );
    let xpath = r#"<ds:Transform Algorithm="http://www.w3.org/TR/1999/REC-xpath-19991116"><ds:XPath>count(//.|//@*|//namespace::*)</ds:XPath></ds:Transform>"#;
    let retrieval =
        format!(r#"<ds:KeyInfo><ds:RetrievalMethod URI="{trap}" Type="http://www.w3.org/2000/09/xmldsig#X509Data"/>"#);
    let sha1 = fresh()
        .replace("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256", "http://www.w3.org/2000/09/xmldsig#rsa-sha1")
        .replace("http://www.w3.org/2001/04/xmlenc#sha256", "http://www.w3.org/2000/09/xmldsig#sha1");
    let sha1 = sign(&sha1, &s.idp.key(), None);
    assert!(sha1.contains("xmldsig#rsa-sha1"), "xmlsec1 signed with SHA-1");
    // Canonicalisation that would cost minutes: many namespaces in scope times many
    // elements, under inclusive canonicalisation (which is allowed).
    let costly = {
        let ns: String = (0..500).map(|i| format!(" xmlns:n{i}=\"u:{i}\"")).collect();
        let a = fresh()
            .replace(
                "http://www.w3.org/2001/10/xml-exc-c14n#\"/></ds:Transforms>",
                "http://www.w3.org/TR/2001/REC-xml-c14n-20010315\"/></ds:Transforms>",
            )
            .replacen("<saml:Assertion ", &format!("<saml:Assertion{ns} "), 1);
        garbage(a.replace("</saml:Subject>", &format!("</saml:Subject><x>{}</x>", "<y/>".repeat(2_000))))
    };
    assert!(costly.contains("REC-xml-c14n-20010315"), "the transform was replaced");
    let cases = [
        ("costly canonicalisation", costly, "namespace declarations in scope"),
        ("XSLT", garbage(fresh().replace(enveloped, &xslt)), "REC-xslt-19991116\" is refused"),
        ("XPath", garbage(fresh().replace(enveloped, xpath)), "REC-xpath-19991116\" is refused"),
        ("RetrievalMethod", garbage(fresh().replace("<ds:KeyInfo>", &retrieval)), "RetrievalMethod"),
        ("SHA-1 signed by the IdP", sha1, "SHA-1 is broken"),
        (
            "HMAC",
            garbage(fresh().replace(
                "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
                "http://www.w3.org/2001/04/xmldsig-more#hmac-sha256",
            )),
            "HMAC",
        ),
    ];
    for (name, xml, why) in &cases {
        let started = std::time::Instant::now();
        let r = with_header(s.port, xml, send("1401")).await;
        assert_eq!(r.0, 401, "{name}: {}", r.1);
        assert_refused(&r, why);
        assert!(started.elapsed() < Duration::from_secs(5), "{name}: refused at once");
    }
    // Also in the IDAP Header.
    let r = post(s.port, &[], in_soap_header(&garbage(fresh().replace(enveloped, &xslt)), &send("1402"))).await;
    assert_refused(&r, "REC-xslt-19991116\" is refused");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(listener.accept().is_err(), "the server fetched the URL a forged signature named");
    assert_eq!(drain(s.port).await, Vec::<String>::new());

    // What libxml2 and xmlsec report goes through the log, not printed by them: a
    // malformed assertion, and a digest that does not match.
    let malformed = format!("<saml:Assertion xmlns:saml=\"{SAML_NS}\">scott</saml:Nope>");
    assert_refused(&with_header(s.port, &malformed, send("1403")).await, "not well-formed XML: ");
    let wrong = fresh().replacen(">scott</saml:NameID>", ">john</saml:NameID>", 1);
    // Twice: xmlsec's initialisation in the first verification sets its own callback.
    for _ in 0..2 {
        assert_refused(&with_header(s.port, &wrong, send("1404")).await, "signature is not valid");
    }
    let log = s._serve.log();
    for raw in ["parser error :", "func=xmlSec", ":error="] {
        assert!(!log.contains(raw), "a library printed {raw:?} itself: {log}");
    }
    for source in ["source=\"libxml2\"", "source=\"xmlsec\""] {
        assert!(log.contains(source), "the libraries' messages are logged ({source}): {log}");
    }
}

/// A token in the IDAP Header of a request the strict parser refuses (a DOCTYPE, nesting
/// 10,000 deep) is answered with the SAML Fault and its reason, not a bare 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_token_the_strict_parser_refuses_gets_the_reason() {
    let s = setup(&[]);
    let assertion = assertion_of(&unb64(&s.idp.login(SP, "scott", "tiger")));
    let doctype = format!("<!DOCTYPE Envelope [<!ENTITY x \"y\">]>{}", in_soap_header(&assertion, &send("1501")));
    assert_refused(&post(s.port, &[], doctype).await, "DOCTYPE");
    let deep = format!("{}{}", "<x>".repeat(10_000), "</x>".repeat(10_000));
    let deep =
        in_soap_header(&assertion, &send("1502")).replace("</wsse:Security>", &format!("{deep}</wsse:Security>"));
    assert_refused(&post(s.port, &[], deep).await, "nested deeper than");
    // The assertion was not used by either.
    assert_ok(&post(s.port, &[], in_soap_header(&assertion, &send("1503"))).await);
    assert_eq!(drain(s.port).await, ["1503"]);
}

/// An assertion that comes with a session cookie of another agent is refused with the
/// session's fault and stays unused: it logs in afterwards, once. So does one whose request
/// is refused before it runs (a body that is not IDAP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_it_runs_leaves_its_assertion_unused() {
    let s = setup(&[]);
    let john =
        with_header(s.port, &unb64(&s.idp.login(SP, "john", "welcome")), raw_send(RAWQ, &[("", "1601")], "")).await;
    assert_ok(&john);
    let johns_cookie = john.2.clone().expect("john's session cookie");
    let scott = unb64(&s.idp.login(SP, "scott", "tiger"));
    let with_cookie = post(s.port, &[("aq-saml-assertion", b64(&scott)), ("cookie", johns_cookie)], send("1602")).await;
    assert!(
        matches!(parse_idap(with_cookie.1.as_bytes()), Response::Fault(ref f) if f.message.contains("names no session of agent SCOTT")),
        "{}",
        with_cookie.1
    );
    let malformed = with_header(s.port, &scott, "<Envelope".to_string()).await;
    assert!(matches!(parse_idap(malformed.1.as_bytes()), Response::Fault(_)), "{}", malformed.1);
    assert_ok(&with_header(s.port, &scott, send("1603")).await);
    assert_refused(&with_header(s.port, &scott, send("1604")).await, "was used before");
    assert_eq!(drain(s.port).await, ["1603"], "john's open send is not committed; scott's runs once");
}
