//! The command-line flags of the HTTP edge (clap argument groups the binary's `serve`
//! flattens): HTTPS and client certificates ([`TlsArgs`]), the listeners' and the password
//! checks' bounds ([`EdgeArgs`]), SAML login ([`SamlArgs`]); each turned into the
//! configuration of this crate's parts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// HTTPS on the servlet, and client-certificate login.
#[derive(clap::Args, Clone)]
pub struct TlsArgs {
    /// PEM certificate chain: the servlet serves HTTPS on --listen (with --tls-key).
    /// Reloaded on SIGHUP.
    #[arg(long, env = "AQGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "AQGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM file of CA certificates whose client certificates log in (repeatable): the
    /// server then asks clients for a certificate.
    #[arg(long = "tls-client-ca", env = "AQGATE_TLS_CLIENT_CA", value_delimiter = ',', requires = "tls_cert")]
    pub tls_client_ca: Vec<PathBuf>,
    /// PEM CRL of a client CA (repeatable).
    #[arg(long = "tls-client-crl", env = "AQGATE_TLS_CLIENT_CRL", value_delimiter = ',', requires = "tls_client_ca")]
    pub tls_client_crl: Vec<PathBuf>,
    /// Refuse HTTPS clients without a client certificate (by default they may log in with
    /// Basic credentials on the same listener).
    #[arg(long, env = "AQGATE_REQUIRE_CLIENT_CERT", requires = "tls_client_ca")]
    pub require_client_cert: bool,
    /// Also serve plain HTTP here, beside HTTPS on --listen.
    #[arg(long, env = "AQGATE_PLAIN_LISTEN", requires = "tls_cert")]
    pub plain_listen: Option<SocketAddr>,
    /// Allow plain HTTP on an address other than loopback (behind a TLS-terminating proxy,
    /// or on a trusted network). Without it, plain HTTP serves loopback only.
    #[arg(long, env = "AQGATE_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: bool,
}

impl TlsArgs {
    /// The HTTPS files, and the plain-HTTP policy checked against `listen`.
    pub fn config(&self, listen: SocketAddr) -> anyhow::Result<Option<crate::https::TlsFiles>> {
        let plain_ok = |a: SocketAddr, what: &str| {
            anyhow::ensure!(
                a.ip().is_loopback() || self.allow_plain_http,
                "refusing plain HTTP on {a} ({what}): configure --tls-cert and --tls-key to serve HTTPS, or pass \
                 --allow-plain-http (e.g. behind a TLS-terminating proxy)"
            );
            Ok(())
        };
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                if let Some(p) = self.plain_listen {
                    plain_ok(p, "--plain-listen")?;
                }
                Ok(Some(crate::https::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                    client_crl: self.tls_client_crl.clone(),
                    require_client_cert: self.require_client_cert,
                }))
            }
            (None, None) => {
                // Flags and the environment have clap's `requires`; values of the
                // configuration file are defaults, which clap does not check: without these,
                // a file's `http.plain_listen` would serve plain HTTP beyond the policy.
                if let Some(p) = self.plain_listen {
                    anyhow::bail!(
                        "--plain-listen {p} (http.plain_listen) is the plain listener beside HTTPS: it needs \
                         --tls-cert and --tls-key (without them --listen serves plain HTTP)"
                    );
                }
                anyhow::ensure!(
                    self.tls_client_ca.is_empty() && self.tls_client_crl.is_empty() && !self.require_client_cert,
                    "--tls-client-ca, --tls-client-crl and --require-client-cert need --tls-cert and --tls-key"
                );
                plain_ok(listen, "--listen")?;
                Ok(None)
            }
            (Some(_), None) => anyhow::bail!("--tls-cert needs --tls-key (http.tls_key)"),
            (None, Some(_)) => anyhow::bail!("--tls-key needs --tls-cert (http.tls_cert)"),
        }
    }
}

/// The HTTP listeners' bounds and the password checks' (what one client may hold).
#[derive(clap::Args, Clone)]
pub struct EdgeArgs {
    /// Seconds a connection may take to send a whole request head: from its start (after
    /// the TLS handshake, which has as long), or from its first byte after an idle spell.
    #[arg(long, env = "AQGATE_HTTP_HEADER_TIMEOUT", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_header_timeout: u64,
    /// Seconds a request body may take to arrive whole (longer: 408, the connection closes).
    #[arg(long, env = "AQGATE_HTTP_BODY_TIMEOUT", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_body_timeout: u64,
    /// Seconds a kept connection may stay idle between requests.
    #[arg(long, env = "AQGATE_HTTP_IDLE_TIMEOUT", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub http_idle_timeout: u64,
    /// Connections held at once, all HTTP listeners together (kept below half the open
    /// files limit); one more is closed at once.
    #[arg(long, env = "AQGATE_HTTP_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub http_max_connections: u64,
    /// Connections held at once from one client address (an IPv6 /64); one more is closed
    /// at once. 0: no such cap (behind a proxy, every client has its address).
    #[arg(long, env = "AQGATE_HTTP_MAX_CONNECTIONS_PER_IP", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub http_max_connections_per_ip: u64,
    /// Password checks (argon2, 19 MiB each) run at once.
    #[arg(long, env = "AQGATE_PASSWORD_CHECKS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub password_checks: u64,
    /// Milliseconds a request waits for its password check's turn (longer: 503).
    #[arg(long, env = "AQGATE_PASSWORD_CHECK_WAIT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub password_check_wait_ms: u64,
    /// Failed logins in a row, from one client address or for one agent, before they are
    /// barred (429): 1 s, doubling with each further failure.
    #[arg(long, env = "AQGATE_AUTH_FAILURES_BEFORE_BACKOFF", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub auth_failures_before_backoff: u64,
    /// The longest bar after failed logins, in seconds.
    #[arg(long, env = "AQGATE_AUTH_BACKOFF_MAX", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub auth_backoff_max: u64,
}

impl EdgeArgs {
    pub fn edge(&self) -> crate::edge::EdgeConfig {
        crate::edge::EdgeConfig {
            header_timeout: Duration::from_secs(self.http_header_timeout),
            idle_timeout: Duration::from_secs(self.http_idle_timeout),
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
            max_connections_per_ip: usize::try_from(self.http_max_connections_per_ip).unwrap_or(usize::MAX),
        }
    }

    pub fn passwords(&self) -> crate::servlet::PasswordLimits {
        crate::servlet::PasswordLimits {
            concurrent: usize::try_from(self.password_checks).unwrap_or(1),
            wait: Duration::from_millis(self.password_check_wait_ms),
            failures_before_backoff: u32::try_from(self.auth_failures_before_backoff).unwrap_or(u32::MAX),
            backoff_max: Duration::from_secs(self.auth_backoff_max),
        }
    }
}

/// SAML 2.0 login (see docs/security.md, "SAML"): on when `--saml-idp-metadata` is given.
#[derive(clap::Args, Clone)]
pub struct SamlArgs {
    /// The IdP's SAML metadata file (its entityID and signing certificate); turns SAML login on.
    #[arg(long, env = "AQGATE_SAML_IDP_METADATA", requires = "saml_entity_id")]
    pub saml_idp_metadata: Option<PathBuf>,
    /// aqgate's own entityID: an assertion's Audience must be this.
    #[arg(long, env = "AQGATE_SAML_ENTITY_ID", requires = "saml_idp_metadata")]
    pub saml_entity_id: Option<String>,
    /// Clock skew allowed against the IdP, in seconds (NotBefore, NotOnOrAfter); at most a day.
    #[arg(long, env = "AQGATE_SAML_CLOCK_SKEW", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub saml_clock_skew: u64,
    /// The assertion attribute (Name or FriendlyName) naming the agent, instead of the NameID.
    #[arg(long, env = "AQGATE_SAML_AGENT_ATTRIBUTE")]
    pub saml_agent_attribute: Option<String>,
}

impl SamlArgs {
    /// The verifier, or `None` without `--saml-idp-metadata`.
    #[cfg(feature = "saml")]
    pub fn verifier(&self) -> anyhow::Result<Option<std::sync::Arc<crate::servlet::SamlVerifier>>> {
        let (Some(file), Some(entity_id)) = (&self.saml_idp_metadata, &self.saml_entity_id) else { return Ok(None) };
        let xml = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let idp = aqgate_saml::Idp::from_metadata(&xml).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let skew = Duration::from_secs(self.saml_clock_skew);
        Ok(Some(std::sync::Arc::new(aqgate_saml::Verifier::new(
            idp,
            entity_id.clone(),
            skew,
            self.saml_agent_attribute.clone(),
        ))))
    }

    /// `None` without `--saml-idp-metadata`; with it, the refusal: this build has no SAML.
    #[cfg(not(feature = "saml"))]
    pub fn verifier(&self) -> anyhow::Result<Option<std::sync::Arc<crate::servlet::SamlVerifier>>> {
        match &self.saml_idp_metadata {
            None => Ok(None),
            Some(_) => anyhow::bail!("--saml-idp-metadata: {}", crate::SAML_FEATURE_MISSING),
        }
    }
}
