//! Client-certificate login (AQ's "SSL certificate based client authentication").
//!
//! The TLS handshake has already checked the certificate: it chains to a `--tls-client-ca`,
//! is within its validity, is not revoked by a configured CRL, and does not carry an
//! extendedKeyUsage without clientAuth (see `https`). This module maps it to an agent:
//!
//! - the certificate must carry an extendedKeyUsage that includes clientAuth (one without
//!   the extension is refused too);
//! - it names the agents whose directory certificate it is (DER-equal to a
//!   `userCertificate` at the agent's `certificate_location`), and the agents whose
//!   directory `mail` equals one of its rfc822Name subject alternative names
//!   (case-insensitively);
//! - exactly one agent of the topology must be named, and it must be enabled for HTTP.
//!
//! The answer is worked out once per connection and kept with it.

use std::sync::Arc;

use aqgate_core::directory::CertificateLocation;
use aqgate_core::engine::Engine;
use openssl::nid::Nid;
use openssl::x509::{X509, X509ExtendedKeyUsage};

/// What a TLS connection tells the servlet: it is TLS, and the client's certificate, if
/// it sent one (the handshake verified it).
#[derive(Clone, Default)]
pub struct TlsConnection {
    pub client_cert: Option<Arc<[u8]>>,
    /// The agent the certificate maps to, once asked and answered for good (a directory
    /// outage is asked again on the next request).
    identity: Arc<tokio::sync::OnceCell<Result<String, String>>>,
}

impl TlsConnection {
    pub fn new(client_cert: Option<Vec<u8>>) -> Self {
        Self { client_cert: client_cert.map(Arc::from), identity: Arc::default() }
    }

    /// The agent the client certificate logs in as, or why it logs in as none; `None`
    /// without a client certificate.
    pub async fn agent(&self, engine: &Engine) -> Option<Result<String, String>> {
        let der = self.client_cert.clone()?;
        if let Some(known) = self.identity.get() {
            return Some(known.clone());
        }
        let answer = agent_for_certificate(engine, der).await;
        match &answer {
            Err(Mapping::Unavailable(why)) => Some(Err(why.clone())),
            Ok(name) => Some(self.identity.get_or_init(|| async { Ok(name.clone()) }).await.clone()),
            Err(Mapping::Refused(why)) => Some(self.identity.get_or_init(|| async { Err(why.clone()) }).await.clone()),
        }
    }
}

/// Why a certificate logs in as no agent.
pub enum Mapping {
    /// For good, for this certificate and topology.
    Refused(String),
    /// The directory could not be asked: maybe on the next request.
    Unavailable(String),
}

impl From<String> for Mapping {
    fn from(s: String) -> Self {
        Self::Refused(s)
    }
}

/// The one agent `der` logs in as (see the module documentation).
pub async fn agent_for_certificate(engine: &Engine, der: Arc<[u8]>) -> Result<String, Mapping> {
    let cert = X509::from_der(&der).map_err(|_| Mapping::Refused("the client certificate cannot be read".into()))?;
    let subject = subject_text(&cert);
    match cert.extended_key_usage() {
        Some(eku) if eku.contains(X509ExtendedKeyUsage::SSL_CLIENT) => {}
        Some(_) => {
            return Err(
                format!("client certificate {subject}: its extendedKeyUsage does not include clientAuth").into()
            );
        }
        None => {
            return Err(format!("client certificate {subject} has no extendedKeyUsage (clientAuth required)").into());
        }
    }
    let emails: Vec<String> = cert
        .subject_alt_names()
        .map(|names| names.iter().filter_map(|n| n.email().map(str::to_string)).collect())
        .unwrap_or_default();
    let Some(dir) = engine.config().directory.clone() else {
        return Err(Mapping::Refused("client certificates need the directory, and none is configured".into()));
    };
    let catalog = engine.resolved().catalog.clone();
    let mut named: Vec<String> = Vec::new();
    for agent in catalog.agents.values() {
        let Some(dn) = &agent.certificate_location else { continue };
        match dir.certificates(&CertificateLocation::Dn(dn.clone())).await {
            Ok(certs) if certs.iter().any(|c| c.as_slice() == &der[..]) => named.push(agent.name.clone()),
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                return Err(Mapping::Unavailable(format!("the directory is unavailable: {e}")));
            }
            Err(_) => {}
        }
    }
    for mail in &emails {
        match dir.agents_with_mail(mail).await {
            Ok(uids) => named.extend(uids.iter().filter_map(|u| catalog.agent(u)).map(|a| a.name.clone())),
            Err(e) if e.is_transient() => {
                return Err(Mapping::Unavailable(format!("the directory is unavailable: {e}")));
            }
            Err(_) => {}
        }
    }
    named.sort();
    named.dedup();
    let name = match named.as_slice() {
        [one] => one.clone(),
        [] => {
            let mails = if emails.is_empty() { "no e-mail address".to_string() } else { emails.join(", ") };
            return Err(format!(
                "client certificate {subject} ({mails}) is no agent's directory certificate, and no agent has its \
                 e-mail address"
            )
            .into());
        }
        many => {
            return Err(
                format!("client certificate {subject} names several agents ({}); refused", many.join(", ")).into()
            );
        }
    };
    match catalog.agent(&name) {
        Some(a) if a.http => Ok(a.name.clone()),
        Some(a) => Err(format!("agent {} is not enabled for HTTP access", a.name).into()),
        None => Err(format!("unknown agent {name}").into()),
    }
}

fn subject_text(cert: &X509) -> String {
    let name = cert.subject_name();
    let cn = name.entries_by_nid(Nid::COMMONNAME).next().and_then(|e| e.data().to_string().ok());
    match cn {
        Some(cn) => format!("CN={cn}"),
        None => "(no CN)".to_string(),
    }
}
