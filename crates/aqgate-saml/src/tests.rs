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

#[test]
fn a_signature_must_reference_its_parent() {
    let sig = r##"<ds:Signature xmlns:ds="http://www.w3.org/2000/09/xmldsig#"><ds:SignedInfo><ds:Reference URI="#_other"/></ds:SignedInfo></ds:Signature>"##;
    let xml = UNSIGNED.replace("</saml:Issuer>", &format!("</saml:Issuer>{sig}"));
    assert!(shape(&xml, Form::Standalone).expect_err("refused").0.contains("does not cover"));
    let ok = xml.replace("#_other", "#_a");
    assert_eq!(shape(&ok, Form::Standalone).expect("shape").assertion_id, "_a");
    let nested = UNSIGNED.replace("<saml:NameID>", &format!("<saml:NameID>{sig}"));
    assert!(shape(&nested, Form::Standalone).expect_err("refused").0.contains("somewhere other"));
}

#[test]
fn the_soap_form_needs_the_security_header() {
    let env = |inner: &str| {
        format!(
            r#"<Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Header>{inner}</Header><Body><AQXmlCommit xmlns="http://ns.oracle.com/AQ/schemas/access"/></Body></Envelope>"#
        )
    };
    let wsse = |a: &str| format!(r#"<wsse:Security xmlns:wsse="{WSSE_NS}">{a}</wsse:Security>"#);
    assert!(has_security_header(env(&wsse(UNSIGNED)).as_bytes()));
    assert!(!has_security_header(env("").as_bytes()));
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
