//! The IdP as its SAML metadata describes it: its entityID and its signing certificates.

use samael::crypto::CertificateDer;
use samael::metadata::EntityDescriptor;

/// The identity provider aqgate trusts.
#[derive(Debug, Clone)]
pub struct Idp {
    /// Its entityID: an assertion's Issuer must be exactly this.
    pub entity_id: String,
    certs: Vec<CertificateDer>,
}

impl Idp {
    /// An IdP with these signing certificates (DER).
    pub fn new(entity_id: impl Into<String>, certs: Vec<Vec<u8>>) -> Result<Self, String> {
        let entity_id = entity_id.into();
        if entity_id.trim().is_empty() {
            return Err("the IdP's entityID is empty".into());
        }
        if certs.is_empty() {
            return Err("the IdP has no signing certificate".into());
        }
        for der in &certs {
            openssl::x509::X509::from_der(der).map_err(|e| format!("a signing certificate does not parse: {e}"))?;
        }
        Ok(Self { entity_id, certs: certs.into_iter().map(CertificateDer::from).collect() })
    }

    /// The IdP of a metadata document (`EntityDescriptor` with an `IDPSSODescriptor`): its
    /// certificates for `use="signing"`, else those without a `use`.
    pub fn from_metadata(xml: &str) -> Result<Self, String> {
        if xml.contains("<!DOCTYPE") || xml.contains("<!ENTITY") {
            return Err("the IdP metadata has a DOCTYPE; it is not accepted".into());
        }
        let ed: EntityDescriptor = xml.parse().map_err(|e| format!("the IdP metadata does not parse: {e}"))?;
        let entity_id = ed.entity_id.clone().ok_or("the IdP metadata has no entityID")?;
        let descriptors = ed.idp_sso_descriptors.unwrap_or_default();
        if descriptors.is_empty() {
            return Err("the IdP metadata has no IDPSSODescriptor".into());
        }
        let pick = |signing: bool| -> Vec<String> {
            descriptors
                .iter()
                .flat_map(|d| &d.key_descriptors)
                .filter(|k| match k.key_use.as_deref() {
                    Some("signing") => signing,
                    None | Some("") => !signing,
                    _ => false,
                })
                .filter_map(|k| k.key_info.x509_data.as_ref())
                .flat_map(|x| x.certificates.iter().cloned())
                .collect()
        };
        let mut b64 = pick(true);
        if b64.is_empty() {
            b64 = pick(false);
        }
        let certs = crate::certs_from_base64(&b64)?;
        Self::new(entity_id, certs.into_iter().map(|c| c.der_data().to_vec()).collect())
    }

    pub(crate) fn certs(&self) -> &[CertificateDer] {
        &self.certs
    }
}
