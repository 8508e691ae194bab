//! The directory as the engine and the mail path see it: queue names, agent aliases,
//! notification aliases, mail addresses and certificates. The implementations (LDAP, an
//! embedded LDIF file) are in the `aqgate-directory` crate.

/// An AQ agent as an agent alias resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    pub name: String,
    pub address: Option<String>,
    pub protocol: Option<i32>,
}

/// Why a directory operation failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DirectoryError {
    /// Permanent: the directory has no such entry (or it lacks the attribute asked for).
    #[error("not found in the directory: {0}")]
    NotFound(String),
    /// Temporary: the directory is unreachable, too slow or busy; retry later.
    #[error("directory unavailable: {0}")]
    Unavailable(String),
    /// The directory holds unusable data, e.g. a certificate that is not DER X.509.
    #[error("malformed directory data: {0}")]
    Malformed(String),
    /// The configuration is wrong (bad URL, plain LDAP to a remote host, bind refused, …).
    #[error("directory configuration: {0}")]
    Config(String),
}

impl DirectoryError {
    /// True for errors that may go away by themselves (retry later: SMTP 4xx).
    pub fn is_transient(&self) -> bool {
        matches!(self, DirectoryError::Unavailable(_))
    }
}

/// Where an agent's certificates are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateLocation {
    /// The DN of an entry whose `userCertificate` holds them (an agent's `certificate_location`).
    Dn(String),
    /// The entries whose `mail` is this address.
    Mail(String),
}

/// The directory as the rest of aqgate sees it.
#[async_trait::async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Resolves a queue's directory name (`lookup_type="LDAP"`) to its database name `SCHEMA.QUEUE`.
    async fn resolve_queue(&self, name: &str) -> Result<String, DirectoryError>;
    /// Resolves an `agent_alias` to the agent's name, address and protocol.
    async fn resolve_agent_alias(&self, alias: &str) -> Result<AgentEntry, DirectoryError>;
    /// The DER certificates at a location, each checked to be an X.509 certificate
    /// (`Malformed` if any is not; `NotFound` if there is no entry or no certificate).
    async fn certificates(&self, at: &CertificateLocation) -> Result<Vec<Vec<u8>>, DirectoryError>;
    /// The mail address of an agent (`uid`): `NotFound` if the directory has no such agent,
    /// `Ok(None)` if it has one without a `mail`.
    async fn mail_address(&self, agent: &str) -> Result<Option<String>, DirectoryError>;
    /// The agents (`uid`s) whose entry has the mail address `addr` (any `mail` value,
    /// case-insensitively): one search, however many agents there are.
    async fn agents_with_mail(&self, addr: &str) -> Result<Vec<String>, DirectoryError>;
    /// Resolves a notification alias to its target, a `mailto:` URL.
    async fn resolve_notification_alias(&self, alias: &str) -> Result<String, DirectoryError>;
    /// Drops cached entries (the next operations ask the server).
    fn invalidate(&self);
}

/// Case folding used for every case-insensitive comparison of directory names (Unicode
/// lower-casing of both sides, no whitespace folding).
pub fn fold(s: &str) -> String {
    s.chars().flat_map(char::to_lowercase).collect()
}
