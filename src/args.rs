//! The command line's arguments, by group: those of `serve`, `smtp` and `notify`, and the
//! groups they share (the database, the directory, the SMTP filter, the notification
//! dispatcher), with what each group makes of its values. Each has a key in the
//! configuration file (see `config`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use aqgate_admin::cli::Db;
pub use aqgate_http::cli::{EdgeArgs, SamlArgs, TlsArgs};

/// `aqgate serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: Db,
    /// Address to listen on.
    #[arg(long, env = "AQGATE_LISTEN", default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// Topology file applied at start; the built-in demo topology when absent.
    #[arg(long, env = "AQGATE_TOPOLOGY")]
    pub topology: Option<PathBuf>,
    /// Do not apply any topology at start (keep what the database has).
    #[arg(long, conflicts_with = "topology")]
    pub no_topology: bool,
    /// Idle sessions roll back after this many seconds.
    #[arg(long, env = "AQGATE_SESSION_TIMEOUT", default_value_t = 300)]
    pub session_timeout: u64,
    /// An expired session's cookie is answered "expired" (25254) for this many seconds;
    /// after that, "unknown session" (24049).
    #[arg(long, env = "AQGATE_SESSION_TOMBSTONE_TTL", default_value_t = 86_400)]
    pub session_tombstone_ttl: u64,
    /// A request performed under an Idempotency-Key is remembered (and replayed to a
    /// retry) for this many seconds.
    #[arg(long, env = "AQGATE_IDEMPOTENCY_WINDOW", default_value_t = 86_400)]
    pub idempotency_window: u64,
    /// Longest receive wait_time honoured, in seconds.
    #[arg(long, env = "AQGATE_MAX_WAIT", default_value_t = 60)]
    pub max_wait: u64,
    /// Largest request body, in bytes (larger: 413).
    #[arg(long, env = "AQGATE_MAX_BODY", default_value_t = 4 * 1024 * 1024)]
    pub max_body: usize,
    /// Open sessions the store may hold, all agents together: a request that would leave
    /// one more open is refused (fault 18, HTTP 503); one that ends its transaction is not.
    #[arg(long, env = "AQGATE_MAX_SESSIONS", default_value_t = 100_000)]
    pub max_sessions: usize,
    /// Open sessions one agent may hold (counted in the store): a request of that agent
    /// that would leave one more open is refused (fault 18, HTTP 503).
    #[arg(long, env = "AQGATE_MAX_SESSIONS_PER_AGENT", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions_per_agent: u64,
    /// The largest response an idempotency record keeps whole, in bytes; a larger one is
    /// kept as its size and SHA-256, and a retry is told so (fault 24062).
    #[arg(long, env = "AQGATE_IDEMPOTENCY_MAX_RESPONSE_BYTES", default_value_t = 256 << 10)]
    pub idempotency_max_response_bytes: u64,
    /// Requests recorded under Idempotency-Keys one agent may have kept (within
    /// --idempotency-window): beyond, a request with a new key is refused (fault 24061).
    #[arg(long, env = "AQGATE_IDEMPOTENCY_MAX_RECORDS_PER_AGENT", default_value_t = 10_000_000)]
    pub idempotency_max_records_per_agent: u64,
    /// Bytes of idempotency records (keys and responses) one agent may have kept: beyond,
    /// new records keep the response's size and SHA-256 only.
    #[arg(long, env = "AQGATE_IDEMPOTENCY_MAX_BYTES_PER_AGENT", default_value_t = 4 << 30)]
    pub idempotency_max_bytes_per_agent: u64,
    /// PostgreSQL: every this many seconds, look for aqgate's own tables whose dead rows
    /// (deleted messages, ended sessions) reach 10,000 and a fifth of their live rows, and
    /// vacuum them, and for those whose rows changed by 10,000 and a tenth since their
    /// statistics were gathered, and analyze them; one process at a time; for databases
    /// whose autovacuum is off or behind. A look is one read of PostgreSQL's statistics.
    /// 0: never.
    #[arg(long, env = "AQGATE_VACUUM_EVERY", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub vacuum_every: u64,
    /// A propagation job's lease lasts this many seconds unrenewed (renewed every third of
    /// it): another node takes a job over this long after its holder died.
    #[arg(long, env = "AQGATE_PROPAGATION_LEASE_TTL", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub propagation_lease_ttl: u64,
    /// Messaging Gateway, inbound: the largest broker message body a job takes into its
    /// destination, for links without `max_message_bytes`; a larger one goes to the job's
    /// exception queue (MQTT announces twice this, plus 64 KiB, as its Maximum Packet Size).
    #[arg(long, env = "AQGATE_BROKER_MAX_MESSAGE_BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u64).range(1024..=(128 << 20)))]
    pub broker_max_message_bytes: u64,
    /// Flow control: buffered messages a queue holds in memory at most (unspilled); a
    /// buffered enqueue beyond is refused with 25307 until consumers catch up.
    #[arg(long, env = "AQGATE_BUFFERED_MAX_MESSAGES", default_value_t = 5000)]
    pub buffered_max_messages: usize,
    /// Bytes of buffered messages a queue keeps in memory (each counted whole: payload,
    /// recipients, header fields); past them the queue's oldest are spilled to the store.
    #[arg(long, env = "AQGATE_BUFFERED_SPILL_BYTES", default_value_t = 64 << 20)]
    pub buffered_spill_bytes: usize,
    /// Bytes of buffered messages the process keeps in memory, all queues together; past
    /// them the oldest are spilled, and while spilling fails an enqueue that would go past
    /// them is refused with 25307.
    #[arg(long, env = "AQGATE_BUFFERED_MAX_BYTES", default_value_t = 256 << 20)]
    pub buffered_max_bytes: usize,
    /// Recipients one message's recipient_list may name (Oracle's limit is 1,024); a request
    /// naming more is refused whole with 24031.
    #[arg(long, env = "AQGATE_MAX_RECIPIENTS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_recipients: u64,
    /// Receives one agent may have waiting at once (long polls, wait_time > 0); one more is
    /// answered at once as a receive that does not wait (a message if one is there, else
    /// 25228 saying why).
    #[arg(long, env = "AQGATE_MAX_LONG_POLLS_PER_AGENT", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_long_polls_per_agent: u64,
    /// Steps one evaluation of a dequeue condition, subscriber rule or transformation may
    /// take (nodes, characters compared, copied or scanned); over it, the request is refused
    /// with 2393 naming the condition.
    #[arg(long, env = "AQGATE_CONDITION_MAX_STEPS", default_value_t = aqgate_proto::selector::DEFAULT_MAX_STEPS,
          value_parser = clap::value_parser!(u64).range(1000..=1_000_000_000))]
    pub condition_max_steps: u64,
    /// Bytes the longest text of an evaluation may have (a payload attribute, `tab.user_data`
    /// of a RAW message as hex, a concatenation, a function's result); over it, 2393.
    #[arg(long, env = "AQGATE_CONDITION_MAX_TEXT_BYTES", default_value_t = aqgate_proto::selector::DEFAULT_MAX_TEXT_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(64..=(64 << 20)))]
    pub condition_max_text_bytes: u64,
    /// Steps all the condition evaluations of one dequeue scan (or one enqueue's rules) may
    /// take together, payload bytes read counted; over it, 2393.
    #[arg(long, env = "AQGATE_CONDITION_REQUEST_STEPS", default_value_t = aqgate_core::engine::DEFAULT_REQUEST_STEPS,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000_000))]
    pub condition_request_steps: u64,
    /// Buffered messages in memory longer than this many seconds are spilled to the store.
    #[arg(long, env = "AQGATE_BUFFERED_SPILL_AFTER", default_value_t = 600)]
    pub buffered_spill_after: u64,
    /// Mark the session cookie Secure (when clients reach the servlet over HTTPS, e.g.
    /// through a TLS-terminating proxy).
    #[arg(long, env = "AQGATE_SECURE_COOKIE")]
    pub secure_cookie: bool,
    /// Serve the web console (`/console`) also on a listener that is not on a loopback
    /// address; on loopback listeners it is served without this (docs/console.md).
    #[arg(long, env = "AQGATE_CONSOLE")]
    pub console: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub edge: EdgeArgs,
    #[command(flatten)]
    pub directory: DirectoryArgs,
    #[command(flatten)]
    pub mail: MailArgs,
    #[command(flatten)]
    pub notify: NotifyArgs,
    #[command(flatten)]
    pub saml: SamlArgs,
}

/// `aqgate smtp`.
#[derive(clap::Args)]
pub struct SmtpArgs {
    #[command(flatten)]
    pub db: Db,
    /// The servlet's IDAP endpoint.
    #[arg(long, env = "AQGATE_SERVLET_URL", default_value = "http://127.0.0.1:8470/aqserv")]
    pub servlet_url: String,
    #[command(flatten)]
    pub directory: DirectoryArgs,
    #[command(flatten)]
    pub mail: MailArgs,
}

/// `aqgate notify`.
#[derive(clap::Args)]
pub struct NotifyCommandArgs {
    #[command(flatten)]
    pub db: Db,
    /// On SQLite (no cross-process signal), look for new notifications this often (ms).
    #[arg(long, default_value_t = 200)]
    pub poll_ms: u64,
    #[command(flatten)]
    pub directory: DirectoryArgs,
    #[command(flatten)]
    pub mail: MailArgs,
    #[command(flatten)]
    pub notify: NotifyArgs,
}

/// The SMTP ingestion filter.
#[derive(clap::Args, Clone)]
pub struct MailArgs {
    /// Address of the SMTP filter.
    #[arg(long, env = "AQGATE_SMTP_LISTEN", default_value = "127.0.0.1:2525")]
    pub smtp_listen: SocketAddr,
    /// Run without the SMTP filter.
    #[arg(long)]
    pub no_smtp: bool,
    /// The name the SMTP filter greets with.
    #[arg(long, env = "AQGATE_SMTP_HOSTNAME", default_value = "localhost")]
    pub smtp_hostname: String,
    /// Addresses the filter accepts mail for (repeatable); the first is the From of replies.
    #[arg(long = "gateway-address", env = "AQGATE_GATEWAY_ADDRESS", default_value = "aq@localhost")]
    pub gateway_addresses: Vec<String>,
    /// PEM certificate chain for STARTTLS (with --smtp-tls-key); without it no STARTTLS.
    #[arg(long, env = "AQGATE_SMTP_TLS_CERT", requires = "smtp_tls_key")]
    pub smtp_tls_cert: Option<PathBuf>,
    /// PEM private key for STARTTLS.
    #[arg(long, env = "AQGATE_SMTP_TLS_KEY", requires = "smtp_tls_cert")]
    pub smtp_tls_key: Option<PathBuf>,
    /// Speak LMTP instead of SMTP on --smtp-listen (e.g. for a Postfix lmtp: content filter).
    #[arg(long, env = "AQGATE_LMTP")]
    pub lmtp: bool,
    /// Largest mail accepted, in bytes (larger: 552).
    #[arg(long, env = "AQGATE_SMTP_MAX_SIZE", default_value_t = 10 * 1024 * 1024)]
    pub smtp_max_size: usize,
    /// SMTP sessions held at once; one more is refused with 421 4.3.2.
    #[arg(long, env = "AQGATE_SMTP_MAX_CONNECTIONS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub smtp_max_connections: u64,
    /// SMTP sessions one client (an IPv4 address, an IPv6 /64) holds at once; one more is
    /// refused with 421 4.7.0.
    #[arg(long, env = "AQGATE_SMTP_MAX_PER_CLIENT", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub smtp_max_per_client: u64,
    /// Clients exempt from --smtp-max-per-client (repeatable or comma-separated addresses
    /// and CIDR blocks), e.g. the MTA in front of a content filter, which speaks for all.
    #[arg(long = "smtp-per-client-exempt", env = "AQGATE_SMTP_PER_CLIENT_EXEMPT", value_delimiter = ',')]
    pub smtp_per_client_exempt: Vec<String>,
    /// Seconds a client has to start a mail transaction (MAIL FROM), from connecting or from
    /// its previous message; then 421 4.4.2.
    #[arg(long, env = "AQGATE_SMTP_MAIL_TIMEOUT", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub smtp_mail_timeout: u64,
    /// Seconds a whole DATA may take, from its 354 to the final dot; then 421 4.4.2.
    #[arg(long, env = "AQGATE_SMTP_DATA_TIMEOUT", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub smtp_data_timeout: u64,
    /// Bytes of a mail body kept in memory while it arrives; the rest goes to an unnamed
    /// temporary file in --smtp-data-dir.
    #[arg(long, env = "AQGATE_SMTP_DATA_MEMORY", default_value_t = 1 << 20)]
    pub smtp_data_memory: usize,
    /// Directory in which the filter makes its private directory for mail bodies past
    /// --smtp-data-memory (default: the system's temporary directory).
    #[arg(long, env = "AQGATE_SMTP_DATA_DIR")]
    pub smtp_data_dir: Option<PathBuf>,
    /// Mail bodies past --smtp-data-memory read back into memory and decided at once; the
    /// others wait, on disk, for their turn.
    #[arg(long, env = "AQGATE_SMTP_MAX_LARGE_MESSAGES", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub smtp_max_large_messages: u64,
    /// PEM file of CA certificates that agent certificates must chain to (repeatable).
    /// Default with the embedded directory: the TEST ONLY CA in certs/ca.pem.
    #[arg(long = "smime-ca", env = "AQGATE_SMIME_CA")]
    pub smime_ca: Vec<PathBuf>,
    /// PEM CRL files checked for revoked certificates (repeatable): of the --smime-ca CAs,
    /// or of intermediate CAs that mails carry.
    #[arg(long = "smime-crl", env = "AQGATE_SMIME_CRL")]
    pub smime_crl: Vec<PathBuf>,
    /// The gateway's S/MIME certificate (PEM, emailProtection; with --smime-reply-key):
    /// replies are signed with it, and requests encrypted to it are accepted. Default with
    /// the embedded directory: the TEST ONLY certs/gateway-smime.pem.
    #[arg(long, env = "AQGATE_SMIME_REPLY_CERT", requires = "smime_reply_key")]
    pub smime_reply_cert: Option<PathBuf>,
    /// The private key of --smime-reply-cert (PEM).
    #[arg(long, env = "AQGATE_SMIME_REPLY_KEY", requires = "smime_reply_cert")]
    pub smime_reply_key: Option<PathBuf>,
    /// Directory where replies are written as .eml files (when no relay is given).
    #[arg(long, env = "AQGATE_MAIL_OUTBOX", default_value = "aqgate-outbox")]
    pub mail_outbox: PathBuf,
    /// Hand mail for other recipients on to this SMTP server (`smtp://HOST:PORT`, e.g.
    /// Postfix's reinjection smtpd) instead of refusing them: aqgate as a before-queue
    /// content filter (deploy/postfix/README.md).
    #[arg(long, env = "AQGATE_SMTP_REINJECT")]
    pub smtp_reinject: Option<String>,
    /// Send replies through this SMTP relay instead (e.g. smtp://127.0.0.1:25).
    #[arg(long, env = "AQGATE_MAIL_RELAY")]
    pub mail_relay: Option<String>,
    /// The agent the filter posts to the servlet as (it needs `gateway = true`).
    #[arg(long, env = "AQGATE_GATEWAY_AGENT", default_value = "aqgateway")]
    pub gateway_agent: String,
    /// File holding the gateway agent's password (or AQGATE_GATEWAY_PASSWORD).
    #[arg(long, env = "AQGATE_GATEWAY_PASSWORD_FILE")]
    pub gateway_password_file: Option<PathBuf>,
    /// Hours a finished mail is remembered: a re-sent copy within them gets the original
    /// response again (not performed twice); after them it is a new request.
    #[arg(long, env = "AQGATE_DEDUPE_WINDOW_HOURS", default_value_t = 168)]
    pub dedupe_window_hours: u64,
}

/// The notification dispatcher (AQXmlNotification to registered http(s):// and mailto: targets).
#[derive(clap::Args, Clone)]
pub struct NotifyArgs {
    /// Run without the dispatcher (notifications wait in the outbox for `aqgate notify`).
    #[arg(long)]
    pub no_notify: bool,
    /// Allowed HTTP targets (repeatable or comma-separated): `public` (globally routable
    /// addresses), a CIDR block or IP (`10.1.0.0/16`, `127.0.0.1`), a host name or
    /// `*.suffix`. Private, loopback and link-local addresses need an explicit rule.
    #[arg(long = "notify-allow", env = "AQGATE_NOTIFY_ALLOW", value_delimiter = ',', default_value = "public")]
    pub notify_allow: Vec<String>,
    /// Allowed mailto: addresses (repeatable or comma-separated): `directory` (the mail of
    /// an entry in the directory), a domain (`example.com`), `*.domain` (its subdomains),
    /// or `any`. The directory's notification aliases are always allowed.
    #[arg(
        long = "notify-mail-allow",
        env = "AQGATE_NOTIFY_MAIL_ALLOW",
        value_delimiter = ',',
        default_value = "directory"
    )]
    pub notify_mail_allow: Vec<String>,
    /// Seconds one HTTP notification may take.
    #[arg(long, env = "AQGATE_NOTIFY_TIMEOUT", default_value_t = 10)]
    pub notify_timeout: u64,
    /// Failed attempts (with exponential backoff from 1 s to 5 min) before a notification
    /// is parked.
    #[arg(long, env = "AQGATE_NOTIFY_MAX_ATTEMPTS", default_value_t = 15)]
    pub notify_max_attempts: i64,
    /// Notifications in flight at once.
    #[arg(long, env = "AQGATE_NOTIFY_CONCURRENCY", default_value_t = 64)]
    pub notify_concurrency: usize,
    /// Notifications in flight at once to one target (an HTTP origin: scheme, host and
    /// port; a mailto: domain), so that a slow target never holds every slot.
    #[arg(long, env = "AQGATE_NOTIFY_PER_TARGET", default_value_t = 4)]
    pub notify_per_target: usize,
    /// Failed attempts in a row (timeouts, refused connections, non-2xx answers) after
    /// which a target's circuit opens: nothing is sent to it for the cool-down; 0 never.
    #[arg(long, env = "AQGATE_NOTIFY_BREAKER_FAILURES", default_value_t = 5)]
    pub notify_breaker_failures: u32,
    /// Seconds an open circuit waits before one probe (doubling while probes fail, up to 5 min).
    #[arg(long, env = "AQGATE_NOTIFY_BREAKER_COOLDOWN", default_value_t = 30)]
    pub notify_breaker_cooldown: u64,
    /// From address of mailto: notifications (default: the first --gateway-address).
    #[arg(long, env = "AQGATE_NOTIFY_FROM")]
    pub notify_from: Option<String>,
    /// PEM file of CA certificates trusted for https:// targets besides the public roots
    /// (repeatable), e.g. an internal CA.
    #[arg(long = "notify-ca-file", env = "AQGATE_NOTIFY_CA_FILE")]
    pub notify_ca_files: Vec<PathBuf>,
}

impl NotifyArgs {
    pub fn config(
        &self,
        mail: &MailArgs,
        directory: std::sync::Arc<dyn aqgate_directory::Directory>,
    ) -> anyhow::Result<aqgate_notify::NotifyConfig> {
        let policy = aqgate_notify::Policy::parse(&self.notify_allow).map_err(|e| anyhow::anyhow!(e))?;
        let mail_policy = self.mail_policy()?;
        let from = match &self.notify_from {
            Some(f) => f.clone(),
            None => mail.gateway_addresses.first().cloned().unwrap_or_else(|| "aq@localhost".into()),
        };
        let mut extra_roots_pem = Vec::new();
        for f in &self.notify_ca_files {
            extra_roots_pem.push(std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?);
        }
        Ok(aqgate_notify::NotifyConfig {
            policy: std::sync::Arc::new(policy),
            mail_policy: std::sync::Arc::new(mail_policy),
            extra_roots_pem,
            http_timeout: Duration::from_secs(self.notify_timeout.max(1)),
            concurrency: self.notify_concurrency.max(1),
            per_target: self.notify_per_target.max(1),
            breaker_failures: self.notify_breaker_failures,
            breaker_cooldown: Duration::from_secs(self.notify_breaker_cooldown.max(1)),
            max_attempts: self.notify_max_attempts.max(1),
            mail: Some((mail_transport(mail), from)),
            directory: Some(directory),
            ..Default::default()
        })
    }
}

impl NotifyArgs {
    /// The `mailto:` policy of `--notify-mail-allow`.
    pub fn mail_policy(&self) -> anyhow::Result<aqgate_notify::policy::MailPolicy> {
        aqgate_notify::policy::MailPolicy::parse(&self.notify_mail_allow).map_err(|e| anyhow::anyhow!(e))
    }
}

pub fn mail_transport(a: &MailArgs) -> aqgate_mail::worker::ReplyTransport {
    match &a.mail_relay {
        Some(url) => aqgate_mail::worker::ReplyTransport::Relay(url.clone()),
        None => aqgate_mail::worker::ReplyTransport::Files(a.mail_outbox.clone()),
    }
}

/// Where agent aliases, LDAP destinations and certificates are looked up.
#[derive(clap::Args, Clone)]
pub struct DirectoryArgs {
    /// LDAP server: `ldaps://host`, `ldap://host/????!StartTLS`, or plain `ldap://` on
    /// loopback. Without it, the embedded LDIF directory (`--ldif`, or the built-in demo one).
    #[arg(long, env = "AQGATE_LDAP_URL")]
    pub ldap_url: Option<String>,
    /// Base DN of the searches.
    #[arg(long, env = "AQGATE_LDAP_BASE_DN", default_value = aqgate_directory::DEFAULT_BASE_DN)]
    pub ldap_base_dn: String,
    /// Simple bind DN (anonymous when absent).
    #[arg(long, env = "AQGATE_LDAP_BIND_DN")]
    pub ldap_bind_dn: Option<String>,
    /// File holding the bind password (or set AQGATE_LDAP_PASSWORD); never logged.
    #[arg(long, env = "AQGATE_LDAP_PASSWORD_FILE")]
    pub ldap_password_file: Option<PathBuf>,
    /// PEM file of CA certificates trusted for the LDAP server.
    #[arg(long, env = "AQGATE_LDAP_CA_FILE")]
    pub ldap_ca_file: Option<PathBuf>,
    /// Seconds one directory operation may take before it fails as temporary.
    #[arg(long, env = "AQGATE_LDAP_TIMEOUT", default_value_t = 5)]
    pub ldap_timeout: u64,
    /// LDIF file for the embedded directory (default: the built-in demo directory).
    #[arg(long, env = "AQGATE_LDIF")]
    pub ldif: Option<PathBuf>,
}

impl DirectoryArgs {
    pub fn config(&self) -> anyhow::Result<aqgate_directory::DirectoryConfig> {
        let bind_password = match (&self.ldap_password_file, std::env::var("AQGATE_LDAP_PASSWORD").ok()) {
            (Some(f), _) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            (None, p) => p,
        };
        Ok(aqgate_directory::DirectoryConfig {
            url: self.ldap_url.clone(),
            base_dn: self.ldap_base_dn.clone(),
            bind_dn: self.ldap_bind_dn.clone(),
            bind_password,
            ldif_path: self.ldif.clone(),
            timeout: Duration::from_secs(self.ldap_timeout),
            ca_file: self.ldap_ca_file.clone(),
            ..Default::default()
        })
    }
}
