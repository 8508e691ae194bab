//! The mail side of S/MIME: the sender address, the `multipart/signed` split as the
//! verifier does it, the signature part and its DER (SignerInfos, signingTime, carried
//! certificates), IDAP extraction from the signed content, and the whole verification
//! with the test CA and the agents' certificates.
//!
//! Every input is tried as a whole mail, and also as a boundary line followed by a
//! `multipart/signed` body, as DER, and as a signed MIME entity.
#![no_main]

use std::sync::OnceLock;

use aqgate_mail::extract::idap_document;
use aqgate_mail::smime::{
    TrustStore, sender_address, signature_der, signed_data, signer_info_count, split_signed, verify,
    without_certificates,
};
use libfuzzer_sys::fuzz_target;
use mail_parser::{MessageParser, MimeHeaders};
use openssl::asn1::Asn1Time;
use openssl::x509::{X509, X509Crl};

const CA_PEM: &[u8] = include_bytes!("../../certs/ca.pem");
const CA_CRL: &[u8] = include_bytes!("../../certs/ca.crl");
const SCOTT_PEM: &[u8] = include_bytes!("../../certs/scott.pem");
const SCOTT_DER: &[u8] = include_bytes!("../../certs/scott.der");
const JOHN_DER: &[u8] = include_bytes!("../../certs/john.der");

struct Fixture {
    trust: TrustStore,
    certs: Vec<Vec<u8>>,
    now: i64,
}

fn unix(t: &openssl::asn1::Asn1TimeRef) -> i64 {
    let epoch = Asn1Time::from_unix(0).expect("epoch");
    let d = epoch.diff(t).expect("diff");
    i64::from(d.days) * 86_400 + i64::from(d.secs)
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // The verifier contains a panic of the openssl crate on hostile DER (see
        // `smime::verify`); libFuzzer's hook would abort on it. Panics from anywhere
        // else still abort.
        let libfuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_openssl = info.location().is_some_and(|l| l.file().contains("/openssl-0."));
            if !in_openssl {
                libfuzzer_hook(info);
            }
        }));
        let crl = X509Crl::from_pem(CA_CRL).expect("CRL");
        let scott = X509::from_pem(SCOTT_PEM).expect("certificate");
        Fixture {
            trust: TrustStore::from_pem(&[CA_PEM], &[CA_CRL]).expect("trust store"),
            // The directory's certificates for the sender (both agents, whoever it is).
            certs: vec![SCOTT_DER.to_vec(), JOHN_DER.to_vec()],
            now: unix(crl.last_update()).max(unix(scott.not_before())) + 3600,
        }
    })
}

fn signed_body(body: &[u8], boundary: &str) {
    if let Ok((content, signature)) = split_signed(body, boundary) {
        let _ = idap_document(&content);
        if let Ok(der) = signature_der(signature) {
            der_helpers(&der);
        }
    }
}

fn der_helpers(der: &[u8]) {
    let _ = signed_data(der);
    let _ = signer_info_count(der);
    if let Some(stripped) = without_certificates(der) {
        let _ = signer_info_count(&stripped);
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    // A whole mail.
    let _ = sender_address(data);
    if let Some(message) = MessageParser::default().parse(data) {
        let root = message.root_part();
        if let Some(boundary) = root.content_type().and_then(|ct| ct.attribute("boundary")) {
            let body = data.get(root.raw_body_offset() as usize..).unwrap_or_default();
            signed_body(body, boundary);
        }
    }
    let _ = verify(data, &f.certs, &f.trust, f.now);
    // A boundary line, then a multipart/signed body.
    if let Some(nl) = data.iter().position(|&b| b == b'\n')
        && let Ok(boundary) = std::str::from_utf8(&data[..nl])
    {
        signed_body(&data[nl + 1..], boundary.trim_end_matches('\r'));
    }
    // DER, and a signed entity.
    der_helpers(data);
    let _ = idap_document(data);
});
