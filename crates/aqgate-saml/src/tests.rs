//! Unit tests of the shape rules and the metadata (signatures are tested against a real
//! IdP in the workspace's `tests/saml.rs`).

use super::*;

const UNSIGNED: &str = r#"<saml:Assertion xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion" ID="_a" Version="2.0" IssueInstant="2026-01-01T00:00:00Z"><saml:Issuer>https://idp.example</saml:Issuer><saml:Subject><saml:NameID>scott</saml:NameID></saml:Subject></saml:Assertion>"#;

fn shape(xml: &str, form: Form) -> Result<structure::Located, SamlError> {
    let doc = structure::parse_strict(xml)?;
    structure::locate(&doc, form)
}

#[test]
fn unsigned_doctype_comments_and_two_assertions_are_refused() {
    assert_eq!(shape(UNSIGNED, Form::Standalone).expect_err("refused").0, "the assertion is not signed");
    let dtd = format!("<!DOCTYPE x [<!ENTITY e 'scott'>]>{UNSIGNED}");
    assert!(shape(&dtd, Form::Standalone).expect_err("refused").0.contains("DOCTYPE"));
    let comment = UNSIGNED.replace("scott<", "scott<!---->@evil.example<");
    assert!(shape(&comment, Form::Standalone).expect_err("refused").0.contains("comment"));
    let two = format!(
        r#"<samlp:Response xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol" ID="_r">{UNSIGNED}{}</samlp:Response>"#,
        UNSIGNED.replace("_a", "_b")
    );
    assert!(shape(&two, Form::Standalone).expect_err("refused").0.contains("2 assertions"));
    assert!(shape("<a><b></a>", Form::Standalone).expect_err("refused").0.contains("well-formed"));
    let unbound = UNSIGNED.replace(r#" xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion""#, "");
    assert!(shape(&unbound, Form::Standalone).expect_err("refused").0.contains("undeclared namespace prefix"));
    assert!(shape("<x/>", Form::Standalone).expect_err("refused").0.contains("0 assertions"));
}

/// A signature as an IdP writes it (values are not checked here), over `#_a`.
const SIG: &str = r##"<ds:Signature xmlns:ds="http://www.w3.org/2000/09/xmldsig#"><ds:SignedInfo><ds:CanonicalizationMethod Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#"/><ds:SignatureMethod Algorithm="http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"/><ds:Reference URI="#_a"><ds:Transforms><ds:Transform Algorithm="http://www.w3.org/2000/09/xmldsig#enveloped-signature"/><ds:Transform Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#"/></ds:Transforms><ds:DigestMethod Algorithm="http://www.w3.org/2001/04/xmlenc#sha256"/><ds:DigestValue>AAAA</ds:DigestValue></ds:Reference></ds:SignedInfo><ds:SignatureValue>AAAA</ds:SignatureValue><ds:KeyInfo><ds:X509Data><ds:X509Certificate>AAAA</ds:X509Certificate></ds:X509Data></ds:KeyInfo></ds:Signature>"##;

fn signed_with(sig: &str) -> String {
    UNSIGNED.replace("</saml:Issuer>", &format!("</saml:Issuer>{sig}"))
}

#[test]
fn a_signature_must_reference_its_parent() {
    let xml = signed_with(&SIG.replace("#_a", "#_other"));
    assert!(shape(&xml, Form::Standalone).expect_err("refused").0.contains("does not cover"));
    assert_eq!(shape(&signed_with(SIG), Form::Standalone).expect("shape").assertion_id, "_a");
    let nested = UNSIGNED.replace("<saml:NameID>", &format!("<saml:NameID>{SIG}"));
    assert!(shape(&nested, Form::Standalone).expect_err("refused").0.contains("somewhere other"));
}

#[test]
fn a_signature_may_ask_only_for_what_an_idp_needs() {
    let enveloped = r#"<ds:Transform Algorithm="http://www.w3.org/2000/09/xmldsig#enveloped-signature"/>"#;
    let xslt = r#"<ds:Transform Algorithm="http://www.w3.org/TR/1999/REC-xslt-19991116"><xsl:stylesheet xmlns:xsl="http://www.w3.org/1999/XSL/Transform" version="1.0"><xsl:include href="http://127.0.0.1:9/x"/></xsl:stylesheet></ds:Transform>"#;
    let xpath = r#"<ds:Transform Algorithm="http://www.w3.org/TR/1999/REC-xpath-19991116"><ds:XPath>count(//.|//@*|//namespace::*)</ds:XPath></ds:Transform>"#;
    let exc_with_prefixes = r#"<ds:Transform Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#"><ec:InclusiveNamespaces xmlns:ec="http://www.w3.org/2001/10/xml-exc-c14n#" PrefixList="xs"/></ds:Transform>"#;
    let cases: &[(String, &str)] = &[
        (SIG.replace(enveloped, xslt), "REC-xslt-19991116\" is refused"),
        (SIG.replace(enveloped, xpath), "REC-xpath-19991116\" is refused"),
        (SIG.replace(enveloped, &enveloped.repeat(3)), "more than 3 transforms"),
        (
            SIG.replace(enveloped, r#"<ds:Transform Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#WithComments"/>"#),
            "WithComments\" is refused",
        ),
        (SIG.replace("<ds:Transform Algorithm=\"http://www.w3.org/2001/10/xml-exc-c14n#\"/>", exc_with_prefixes), ""),
        (
            SIG.replace("http://www.w3.org/2001/04/xmlenc#sha256", "http://www.w3.org/2000/09/xmldsig#sha1"),
            "SHA-1 is broken",
        ),
        (SIG.replace("http://www.w3.org/2001/04/xmlenc#sha256", "http://www.w3.org/2001/04/xmldsig-more#md5"), "MD5 is broken"),
        (
            SIG.replace("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256", "http://www.w3.org/2000/09/xmldsig#rsa-sha1"),
            "SignatureMethod \"http://www.w3.org/2000/09/xmldsig#rsa-sha1\" is refused: SHA-1",
        ),
        (
            SIG.replace("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256", "http://www.w3.org/2001/04/xmldsig-more#hmac-sha256"),
            "HMAC",
        ),
        (
            SIG.replace(
                "<ds:X509Data>",
                r#"<ds:RetrievalMethod URI="http://127.0.0.1:9/key" Type="http://www.w3.org/2000/09/xmldsig#X509Data"/><ds:X509Data>"#,
            ),
            "RetrievalMethod",
        ),
        (SIG.replace("</ds:KeyInfo>", "</ds:KeyInfo><ds:Object>x</ds:Object>"), "<Object>, which is not accepted"),
        (
            SIG.replace("xml-exc-c14n#\"/><ds:SignatureMethod", "xml-exc-c14n#WithComments\"/><ds:SignatureMethod"),
            "CanonicalizationMethod",
        ),
        (SIG.replace("<ds:SignatureValue>AAAA</ds:SignatureValue>", ""), "no SignatureValue"),
    ];
    for (sig, why) in cases {
        let got = shape(&signed_with(sig), Form::Standalone);
        if why.is_empty() {
            got.expect("accepted");
        } else {
            let e = got.expect_err(why).0;
            assert!(e.contains(why), "expected {why:?} in {e:?}");
        }
    }
}

#[test]
fn the_parser_says_why_it_refuses() {
    let deep = format!("{}{}", "<a>".repeat(10_000), "</a>".repeat(10_000));
    let refusal = |xml: &str| structure::parse_strict(xml).err().expect("refused").0;
    assert!(refusal(&deep).contains("nested deeper than"));
    let bad = refusal("<a><b></a>");
    assert!(bad.starts_with("the document is not well-formed XML: "), "{bad}");
}

#[test]
fn the_soap_form_needs_the_security_header() {
    let env = |inner: &str| {
        format!(
            r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Header>{inner}</Header><Body><AQXmlCommit xmlns="http://ns.oracle.com/AQ/schemas/access"/></Body></Envelope>"#
        )
    };
    let wsse = |a: &str| format!(r#"<wsse:Security xmlns:wsse="{WSSE_NS}">{a}</wsse:Security>"#);
    assert_eq!(has_security_header(env(&wsse(UNSIGNED)).as_bytes()), Ok(true));
    assert_eq!(has_security_header(env("").as_bytes()), Ok(false));
    assert_eq!(has_security_header(b"<Envelope/>"), Ok(false));
    let nested = env(&format!("<x>{}</x>", wsse(UNSIGNED)));
    assert!(has_security_header(nested.as_bytes()).expect_err("refused").0.contains("entry of the Header"));
    // A request that names WS-Security but that the strict parser refuses says why.
    let dtd = format!("<!DOCTYPE Envelope>{}", env(&wsse(UNSIGNED)));
    assert!(has_security_header(dtd.as_bytes()).expect_err("refused").0.contains("DOCTYPE"));
    let deep = env(&wsse(&format!("{}{}", "<x>".repeat(10_000), "</x>".repeat(10_000))));
    assert!(has_security_header(deep.as_bytes()).expect_err("refused").0.contains("nested deeper"));
    assert_eq!(shape(&env(&wsse(UNSIGNED)), Form::SoapHeader).expect_err("refused").0, "the assertion is not signed");
    assert!(shape(&env(&wsse("")), Form::SoapHeader).expect_err("refused").0.contains("0 assertions"));
    // An assertion elsewhere in the request counts too.
    let extra = env(&wsse(UNSIGNED)).replace("<Body>", &format!("<Body>{}", UNSIGNED.replace("_a", "_b")));
    assert!(shape(&extra, Form::SoapHeader).expect_err("refused").0.contains("2 assertions"));
}

#[test]
fn metadata_needs_an_entity_id_and_a_signing_certificate() {
    let md = r#"<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" entityID="https://idp.example"><md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol"><md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="https://idp.example/sso"/></md:IDPSSODescriptor></md:EntityDescriptor>"#;
    assert!(Idp::from_metadata(md).expect_err("refused").contains("no signing certificate"));
    assert!(Idp::from_metadata("<x").is_err());
    assert!(Idp::from_metadata(&format!("<!DOCTYPE x>{md}")).expect_err("refused").contains("DOCTYPE"));
}

#[test]
fn a_signed_element_that_would_be_costly_to_canonicalise_is_refused() {
    let signed = signed_with(SIG);
    let many_ns: String = (0..40).map(|i| format!(" xmlns:n{i}=\"u:{i}\"")).collect();
    let xml = signed.replacen("<saml:Assertion ", &format!("<saml:Assertion{many_ns} "), 1);
    assert!(shape(&xml, Form::Standalone).expect_err("refused").0.contains("namespace declarations"));
    let many_elements = format!("<x>{}</x>", "<y/>".repeat(1_000));
    let xml = signed.replace("</saml:Subject>", &format!("</saml:Subject>{many_elements}"));
    assert!(shape(&xml, Form::Standalone).expect_err("refused").0.contains("more than 1000 elements"));
    // A handful of either is what an IdP writes.
    let few = signed.replacen("<saml:Assertion ", "<saml:Assertion xmlns:a=\"u:a\" xmlns:b=\"u:b\" ", 1);
    shape(&few, Form::Standalone).expect("accepted");
}
