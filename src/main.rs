//! The `aqgate` binary: `serve`, `admin …`.

mod config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use aqgate::server::{ServeConfig, serve};
use aqgate_core::engine::EngineConfig;
use aqgate_core::topology::Topology;
use aqgate_proto::idap::Limits;

/// mimalloc instead of glibc's malloc: a message_set of 100 allocates and frees a few
/// thousand buffers of 1–2 KiB across the runtime's threads, and glibc's arenas spent
/// about 30 % of the servlet's CPU on that (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` for command output: a reader that went away (`aqgate admin … | head`) ends
/// the process quietly, as SIGPIPE would, instead of the panic `println!` raises.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("aqgate: writing the output: {e}");
            std::process::exit(1);
        }
    }};
}

#[derive(Parser)]
#[command(name = "aqgate", version, about = "Oracle-AQ-style queuing over HTTP (IDAP) and signed e-mail")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Threads that run requests (the async runtime's workers); by default one per CPU.
    /// With the database on the same small machine, fewer can be faster: on 2 cores with
    /// PostgreSQL beside it, 1 serves single-message requests ~10 % faster and batches as
    /// fast (BENCHMARKS.md).
    #[arg(long, global = true, env = "AQGATE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
    /// Configuration file (TOML, every setting of serve, smtp and notify; see
    /// aqgate.example.toml). The environment beats it, flags beat both.
    #[arg(long, global = true, env = "AQGATE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(clap::Args, Clone)]
struct Db {
    /// `sqlite://FILE` (created if missing) or `postgres://…`.
    #[arg(long, env = "AQGATE_DATABASE_URL", default_value = "sqlite://aqgate.db")]
    database: String,
}

/// The SMTP ingestion filter.
#[derive(clap::Args, Clone)]
struct MailArgs {
    /// Address of the SMTP filter.
    #[arg(long, env = "AQGATE_SMTP_LISTEN", default_value = "127.0.0.1:2525")]
    smtp_listen: SocketAddr,
    /// Run without the SMTP filter.
    #[arg(long)]
    no_smtp: bool,
    /// The name the SMTP filter greets with.
    #[arg(long, env = "AQGATE_SMTP_HOSTNAME", default_value = "localhost")]
    smtp_hostname: String,
    /// Addresses the filter accepts mail for (repeatable); the first is the From of replies.
    #[arg(long = "gateway-address", env = "AQGATE_GATEWAY_ADDRESS", default_value = "aq@localhost")]
    gateway_addresses: Vec<String>,
    /// PEM certificate chain for STARTTLS (with --smtp-tls-key); without it no STARTTLS.
    #[arg(long, env = "AQGATE_SMTP_TLS_CERT", requires = "smtp_tls_key")]
    smtp_tls_cert: Option<PathBuf>,
    /// PEM private key for STARTTLS.
    #[arg(long, env = "AQGATE_SMTP_TLS_KEY", requires = "smtp_tls_cert")]
    smtp_tls_key: Option<PathBuf>,
    /// Speak LMTP instead of SMTP on --smtp-listen (e.g. for a Postfix lmtp: content filter).
    #[arg(long, env = "AQGATE_LMTP")]
    lmtp: bool,
    /// Largest mail accepted, in bytes (larger: 552).
    #[arg(long, env = "AQGATE_SMTP_MAX_SIZE", default_value_t = 10 * 1024 * 1024)]
    smtp_max_size: usize,
    /// PEM file of CA certificates that agent certificates must chain to (repeatable).
    /// Default with the embedded directory: the TEST ONLY CA in certs/ca.pem.
    #[arg(long = "smime-ca", env = "AQGATE_SMIME_CA")]
    smime_ca: Vec<PathBuf>,
    /// PEM CRL files checked for revoked certificates (repeatable).
    #[arg(long = "smime-crl", env = "AQGATE_SMIME_CRL")]
    smime_crl: Vec<PathBuf>,
    /// Directory where replies are written as .eml files (when no relay is given).
    #[arg(long, env = "AQGATE_MAIL_OUTBOX", default_value = "aqgate-outbox")]
    mail_outbox: PathBuf,
    /// Hand mail for other recipients on to this SMTP server (`smtp://HOST:PORT`, e.g.
    /// Postfix's reinjection smtpd) instead of refusing them: aqgate as a before-queue
    /// content filter (deploy/postfix/README.md).
    #[arg(long, env = "AQGATE_SMTP_REINJECT")]
    smtp_reinject: Option<String>,
    /// Send replies through this SMTP relay instead (e.g. smtp://127.0.0.1:25).
    #[arg(long, env = "AQGATE_MAIL_RELAY")]
    mail_relay: Option<String>,
    /// The agent the filter posts to the servlet as (it needs `gateway = true`).
    #[arg(long, env = "AQGATE_GATEWAY_AGENT", default_value = "aqgateway")]
    gateway_agent: String,
    /// File holding the gateway agent's password (or AQGATE_GATEWAY_PASSWORD).
    #[arg(long, env = "AQGATE_GATEWAY_PASSWORD_FILE")]
    gateway_password_file: Option<PathBuf>,
    /// Hours a finished mail is remembered: a re-sent copy within them gets the original
    /// response again (not performed twice); after them it is a new request.
    #[arg(long, env = "AQGATE_DEDUPE_WINDOW_HOURS", default_value_t = 168)]
    dedupe_window_hours: u64,
}

/// The notification dispatcher (AQXmlNotification to registered http(s):// and mailto: targets).
#[derive(clap::Args, Clone)]
struct NotifyArgs {
    /// Run without the dispatcher (notifications wait in the outbox for `aqgate notify`).
    #[arg(long)]
    no_notify: bool,
    /// Allowed HTTP targets (repeatable or comma-separated): `public` (globally routable
    /// addresses), a CIDR block or IP (`10.1.0.0/16`, `127.0.0.1`), a host name or
    /// `*.suffix`. Private, loopback and link-local addresses need an explicit rule.
    #[arg(long = "notify-allow", env = "AQGATE_NOTIFY_ALLOW", value_delimiter = ',', default_value = "public")]
    notify_allow: Vec<String>,
    /// Seconds one HTTP notification may take.
    #[arg(long, env = "AQGATE_NOTIFY_TIMEOUT", default_value_t = 10)]
    notify_timeout: u64,
    /// Failed attempts (with exponential backoff from 1 s to 5 min) before a notification
    /// is parked.
    #[arg(long, env = "AQGATE_NOTIFY_MAX_ATTEMPTS", default_value_t = 15)]
    notify_max_attempts: i64,
    /// Notifications in flight at once.
    #[arg(long, env = "AQGATE_NOTIFY_CONCURRENCY", default_value_t = 64)]
    notify_concurrency: usize,
    /// From address of mailto: notifications (default: the first --gateway-address).
    #[arg(long, env = "AQGATE_NOTIFY_FROM")]
    notify_from: Option<String>,
    /// PEM file of CA certificates trusted for https:// targets besides the public roots
    /// (repeatable), e.g. an internal CA.
    #[arg(long = "notify-ca-file", env = "AQGATE_NOTIFY_CA_FILE")]
    notify_ca_files: Vec<PathBuf>,
}

impl NotifyArgs {
    fn config(
        &self,
        mail: &MailArgs,
        directory: std::sync::Arc<dyn aqgate_directory::Directory>,
    ) -> anyhow::Result<aqgate::notify::NotifyConfig> {
        let policy = aqgate::notify::Policy::parse(&self.notify_allow).map_err(|e| anyhow::anyhow!(e))?;
        let from = match &self.notify_from {
            Some(f) => f.clone(),
            None => mail.gateway_addresses.first().cloned().unwrap_or_else(|| "aq@localhost".into()),
        };
        let mut extra_roots_pem = Vec::new();
        for f in &self.notify_ca_files {
            extra_roots_pem.push(std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?);
        }
        Ok(aqgate::notify::NotifyConfig {
            policy: std::sync::Arc::new(policy),
            extra_roots_pem,
            http_timeout: Duration::from_secs(self.notify_timeout.max(1)),
            concurrency: self.notify_concurrency.max(1),
            max_attempts: self.notify_max_attempts.max(1),
            mail: Some((mail_transport(mail), from)),
            directory: Some(directory),
            ..Default::default()
        })
    }
}

fn mail_transport(a: &MailArgs) -> aqgate_mail::worker::ReplyTransport {
    match &a.mail_relay {
        Some(url) => aqgate_mail::worker::ReplyTransport::Relay(url.clone()),
        None => aqgate_mail::worker::ReplyTransport::Files(a.mail_outbox.clone()),
    }
}

/// Where agent aliases, LDAP destinations and certificates are looked up.
#[derive(clap::Args, Clone)]
struct DirectoryArgs {
    /// LDAP server: `ldaps://host`, `ldap://host/????!StartTLS`, or plain `ldap://` on
    /// loopback. Without it, the embedded LDIF directory (`--ldif`, or the built-in demo one).
    #[arg(long, env = "AQGATE_LDAP_URL")]
    ldap_url: Option<String>,
    /// Base DN of the searches.
    #[arg(long, env = "AQGATE_LDAP_BASE_DN", default_value = aqgate_directory::DEFAULT_BASE_DN)]
    ldap_base_dn: String,
    /// Simple bind DN (anonymous when absent).
    #[arg(long, env = "AQGATE_LDAP_BIND_DN")]
    ldap_bind_dn: Option<String>,
    /// File holding the bind password (or set AQGATE_LDAP_PASSWORD); never logged.
    #[arg(long, env = "AQGATE_LDAP_PASSWORD_FILE")]
    ldap_password_file: Option<PathBuf>,
    /// PEM file of CA certificates trusted for the LDAP server.
    #[arg(long, env = "AQGATE_LDAP_CA_FILE")]
    ldap_ca_file: Option<PathBuf>,
    /// Seconds one directory operation may take before it fails as temporary.
    #[arg(long, env = "AQGATE_LDAP_TIMEOUT", default_value_t = 5)]
    ldap_timeout: u64,
    /// LDIF file for the embedded directory (default: the built-in demo directory).
    #[arg(long, env = "AQGATE_LDIF")]
    ldif: Option<PathBuf>,
}

impl DirectoryArgs {
    fn config(&self) -> anyhow::Result<aqgate_directory::DirectoryConfig> {
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

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Command {
    /// Run the AQ servlet (and background duties) in one process.
    Serve {
        #[command(flatten)]
        db: Db,
        /// Address to listen on.
        #[arg(long, env = "AQGATE_LISTEN", default_value = "127.0.0.1:8470")]
        listen: SocketAddr,
        /// Topology file applied at start; the built-in demo topology when absent.
        #[arg(long, env = "AQGATE_TOPOLOGY")]
        topology: Option<PathBuf>,
        /// Do not apply any topology at start (keep what the database has).
        #[arg(long, conflicts_with = "topology")]
        no_topology: bool,
        /// Idle sessions roll back after this many seconds.
        #[arg(long, env = "AQGATE_SESSION_TIMEOUT", default_value_t = 300)]
        session_timeout: u64,
        /// An expired session's cookie is answered "expired" (25254) for this many seconds;
        /// after that, "unknown session" (24049).
        #[arg(long, env = "AQGATE_SESSION_TOMBSTONE_TTL", default_value_t = 86_400)]
        session_tombstone_ttl: u64,
        /// A request performed under an Idempotency-Key is remembered (and replayed to a
        /// retry) for this many seconds.
        #[arg(long, env = "AQGATE_IDEMPOTENCY_WINDOW", default_value_t = 86_400)]
        idempotency_window: u64,
        /// Longest receive wait_time honoured, in seconds.
        #[arg(long, env = "AQGATE_MAX_WAIT", default_value_t = 60)]
        max_wait: u64,
        /// Largest request body, in bytes (larger: 413).
        #[arg(long, env = "AQGATE_MAX_BODY", default_value_t = 4 * 1024 * 1024)]
        max_body: usize,
        /// New sessions are refused with 503 while the store holds this many.
        #[arg(long, env = "AQGATE_MAX_SESSIONS", default_value_t = 100_000)]
        max_sessions: usize,
        /// Mark the session cookie Secure (when clients reach the servlet over HTTPS, e.g.
        /// through a TLS-terminating proxy).
        #[arg(long, env = "AQGATE_SECURE_COOKIE")]
        secure_cookie: bool,
        #[command(flatten)]
        directory: DirectoryArgs,
        #[command(flatten)]
        mail: MailArgs,
        #[command(flatten)]
        notify: NotifyArgs,
    },
    /// Run only the notification dispatcher, on the database a servlet elsewhere writes.
    Notify {
        #[command(flatten)]
        db: Db,
        /// On SQLite (no cross-process signal), look for new notifications this often (ms).
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
        #[command(flatten)]
        directory: DirectoryArgs,
        #[command(flatten)]
        mail: MailArgs,
        #[command(flatten)]
        notify: NotifyArgs,
    },
    /// Administration.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Run only the SMTP filter and its forwarding worker, posting to a servlet elsewhere
    /// (sharing its database).
    Smtp {
        #[command(flatten)]
        db: Db,
        /// The servlet's IDAP endpoint.
        #[arg(long, env = "AQGATE_SERVLET_URL", default_value = "http://127.0.0.1:8470/aqserv")]
        servlet_url: String,
        #[command(flatten)]
        directory: DirectoryArgs,
        #[command(flatten)]
        mail: MailArgs,
    },
    /// Mail helpers for clients.
    Mail {
        #[command(subcommand)]
        command: MailCommand,
    },
    /// The configuration file.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check the configuration file (--config or AQGATE_CONFIG): every problem is reported,
    /// nothing is started.
    Check,
}

#[derive(Subcommand)]
enum MailCommand {
    /// Wrap an IDAP file into an S/MIME-signed mail (multipart/signed) on standard output,
    /// ready for sendmail or `swaks --data -`.
    Sign {
        /// The IDAP request (XML).
        file: PathBuf,
        /// The signer's certificate (PEM).
        #[arg(long)]
        cert: PathBuf,
        /// The signer's private key (PEM).
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        from: String,
        #[arg(long, default_value = "aq@localhost")]
        to: String,
        #[arg(long, default_value = "AQ request")]
        subject: String,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Make the database's topology equal to FILE; prints what changed.
    Apply {
        file: PathBuf,
        #[command(flatten)]
        db: Db,
        /// Print what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List queues with their depth (committed messages).
    Queues {
        #[command(flatten)]
        db: Db,
    },
    /// List agents: protocols, database users, gateway flag, certificate location.
    Agents {
        #[command(flatten)]
        db: Db,
    },
    /// Mail the SMTP filter accepted and has not finished: to forward, replies owed, or
    /// failed for good.
    Spool {
        #[command(flatten)]
        db: Db,
    },
    /// Notifications not yet delivered (pending retries and parked ones), or put parked
    /// ones back in line.
    Notifications {
        #[command(flatten)]
        db: Db,
        /// Put every parked notification back in line (due now, attempts reset).
        #[arg(long)]
        retry_parked: bool,
    },
    /// List registrations, or set the HMAC secret of one (read from standard input, or
    /// AQGATE_NOTIFY_SECRET; an empty secret removes it).
    Registrations {
        #[command(flatten)]
        db: Db,
        /// Set the secret of the registration QUEUE CONSUMER AGENT (CONSUMER `-` on a
        /// single-consumer queue).
        #[arg(long, num_args = 3, value_names = ["QUEUE", "CONSUMER", "AGENT"])]
        set_secret: Option<Vec<String>>,
    },
    /// Print an argon2 hash of the password read from standard input (for `password_hash`).
    HashPassword,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AQGATE_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let file = config::file_named(&args);
    let mut command = Cli::command();
    let mut settings = None;
    if let Some(path) = &file {
        match config::load(command, path) {
            Ok(loaded) => {
                command = loaded.command;
                settings = Some(loaded.settings);
            }
            Err(errors) => {
                for e in &errors {
                    eprintln!("aqgate: {e}");
                }
                eprintln!(
                    "aqgate: {}: {} error(s) in the configuration; nothing started",
                    path.display(),
                    errors.len()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let matches = command.get_matches_from(&args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `--topology` (or AQGATE_TOPOLOGY) outranks the file's `topology.apply = false`.
    if let (Command::Serve { no_topology, .. }, Some(("serve", m))) = (&mut cli.command, matches.subcommand())
        && config::given_over_default(m, "topology", "no_topology")
    {
        *no_topology = false;
    }
    if let Command::Config { command: ConfigCommand::Check } = cli.command {
        let Some(path) = file else {
            eprintln!("aqgate: no configuration file: give --config FILE or set AQGATE_CONFIG");
            return ExitCode::FAILURE;
        };
        println!("{}: ok, {} setting(s)", path.display(), settings.unwrap_or(0));
        return ExitCode::SUCCESS;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = cli.worker_threads {
        builder.worker_threads(usize::from(n));
    }
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("aqgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aqgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            db,
            listen,
            topology,
            no_topology,
            session_timeout,
            session_tombstone_ttl,
            idempotency_window,
            max_wait,
            max_body,
            max_sessions,
            secure_cookie,
            directory: directory_args,
            mail: mail_args,
            notify: notify_args,
        } => {
            let stop = shutdown_signal();
            let directory = aqgate_directory::open(&directory_args.config()?)
                .await
                .map_err(|e| anyhow::anyhow!("directory: {e}"))?;
            let topology = match (topology, no_topology) {
                (_, true) => None,
                (Some(p), _) => Some(std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?),
                (None, false) => Some(aqgate::DEFAULT_TOPOLOGY.to_string()),
            };
            let cfg = ServeConfig {
                listen,
                database_url: db.database,
                topology,
                engine: EngineConfig {
                    max_wait: Duration::from_secs(max_wait),
                    session_timeout: Duration::from_secs(session_timeout),
                    tombstone_ttl: Duration::from_secs(session_tombstone_ttl),
                    idempotency_window: Duration::from_secs(idempotency_window),
                    directory: Some(directory.clone()),
                    notify_policy: std::sync::Arc::new(
                        aqgate::notify::Policy::parse(&notify_args.notify_allow).map_err(|e| anyhow::anyhow!(e))?,
                    ),
                    ..EngineConfig::default()
                },
                limits: Limits { max_bytes: max_body, ..Limits::default() },
                tick: Duration::from_secs(1),
                max_sessions,
                secure_cookie,
                notify: if notify_args.no_notify {
                    None
                } else {
                    Some(notify_args.config(&mail_args, directory.clone())?)
                },
            };
            let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
            let mail = if mail_args.no_smtp {
                None
            } else {
                Some(mail_config(&mail_args, directory_args.ldap_url.is_some(), directory.clone()).await?)
            };
            serve(cfg, listener, mail, stop).await
        }
        Command::Smtp { db, servlet_url, directory: directory_args, mail: mail_args } => {
            let stop = shutdown_signal();
            let directory = aqgate_directory::open(&directory_args.config()?)
                .await
                .map_err(|e| anyhow::anyhow!("directory: {e}"))?;
            let mail = mail_config(&mail_args, directory_args.ldap_url.is_some(), directory).await?;
            aqgate::server::smtp_only(&db.database, servlet_url, mail, stop).await
        }
        Command::Notify { db, poll_ms, directory: directory_args, mail: mail_args, notify: notify_args } => {
            let stop = shutdown_signal();
            let directory = aqgate_directory::open(&directory_args.config()?)
                .await
                .map_err(|e| anyhow::anyhow!("directory: {e}"))?;
            let cfg = notify_args.config(&mail_args, directory)?;
            aqgate::server::notify_only(&db.database, cfg, Duration::from_millis(poll_ms.max(10)), stop).await
        }
        // Answered in main, before the runtime starts.
        Command::Config { command: ConfigCommand::Check } => Ok(()),
        Command::Mail { command: MailCommand::Sign { file, cert, key, from, to, subject } } => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
            let mail = aqgate_mail::smime::sign(&read(&file)?, &read(&cert)?, &read(&key)?, &from, &to, &subject)
                .map_err(|e| anyhow::anyhow!("sign: {e}"))?;
            use std::io::Write as _;
            std::io::stdout().write_all(&mail)?;
            Ok(())
        }
        Command::Admin { command } => match command {
            AdminCommand::Apply { file, db, dry_run } => {
                let text = std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
                let topo =
                    Topology::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.join("; ")))?;
                let store = aqgate_store::open(&db.database).await?;
                let changes = aqgate::admin::apply(store.as_ref(), &topo, dry_run).await?;
                if changes.is_empty() {
                    out!("no changes");
                }
                for c in changes {
                    out!("{c}");
                }
                Ok(())
            }
            AdminCommand::Queues { db } => {
                let store = aqgate_store::open(&db.database).await?;
                out!("{:<32} {:<16} {:<28} {:>8}", "QUEUE", "KIND", "PAYLOAD", "DEPTH");
                for q in aqgate::admin::queues(store.as_ref()).await? {
                    out!("{:<32} {:<16} {:<28} {:>8}", q.name, q.kind, q.payload, q.depth);
                }
                Ok(())
            }
            AdminCommand::Agents { db } => {
                let store = aqgate_store::open(&db.database).await?;
                out!("{:<16} {:<10} {:<20} {:<8} CERTIFICATE_LOCATION", "AGENT", "PROTOCOLS", "DB_USERS", "GATEWAY");
                for a in aqgate::admin::agents(store.as_ref()).await? {
                    out!(
                        "{:<16} {:<10} {:<20} {:<8} {}",
                        a.name,
                        a.protocols,
                        a.db_users,
                        if a.gateway { "yes" } else { "no" },
                        a.certificate_location.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            AdminCommand::Spool { db } => {
                let store = aqgate_store::open(&db.database).await?;
                let rows = store.spool_pending(1000).await?;
                if rows.is_empty() {
                    out!("spool empty: every accepted mail was forwarded and answered");
                }
                out!(
                    "{:>6} {:<8} {:<10} {:>8} {:>7}  {:<40} LAST_ERROR",
                    "ID",
                    "STATE",
                    "AGENT",
                    "ATTEMPTS",
                    "REPLIES",
                    "MESSAGE_ID"
                );
                for m in rows {
                    out!(
                        "{:>6} {:<8} {:<10} {:>8} {:>3}/{:<3}  {:<40} {}",
                        m.id,
                        m.state,
                        m.agent,
                        m.attempts,
                        m.replies_sent,
                        m.replies_wanted,
                        m.message_id,
                        m.last_error.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            AdminCommand::Notifications { db, retry_parked } => {
                let store = aqgate_store::open(&db.database).await?;
                if retry_parked {
                    let n =
                        store.notify_unpark(aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock)).await?;
                    out!("{n} parked notification(s) put back in line");
                    return Ok(());
                }
                let names: std::collections::HashMap<_, _> =
                    store.queue_ids().await?.into_iter().map(|(n, id)| (id, n)).collect();
                let (pending, parked) = store.notify_counts().await?;
                out!("{pending} pending, {parked} parked");
                out!(
                    "{:<44} {:<7} {:>8} {:<24} {:<12} {:<40} LAST_ERROR",
                    "NOTIFICATION_ID",
                    "STATE",
                    "ATTEMPTS",
                    "QUEUE",
                    "CONSUMER",
                    "TARGET"
                );
                for e in store.notify_pending(1000).await? {
                    out!(
                        "{:<44} {:<7} {:>8} {:<24} {:<12} {:<40} {}",
                        e.notification_id(),
                        e.state,
                        e.attempts,
                        names.get(&e.queue).map_or("?", String::as_str),
                        if e.consumer.is_empty() { "-" } else { &e.consumer },
                        aqgate::notify::redact_url(&e.notify_url),
                        e.last_error.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            AdminCommand::Registrations { db, set_secret } => {
                let store = aqgate_store::open(&db.database).await?;
                let ids: std::collections::HashMap<_, _> = store.queue_ids().await?.into_iter().collect();
                if let Some(args) = set_secret {
                    let [queue, consumer, agent] = args.as_slice() else {
                        anyhow::bail!("--set-secret takes QUEUE CONSUMER AGENT");
                    };
                    let queue = aqgate_core::topology::canon(queue);
                    let qid = *ids.get(&queue).ok_or_else(|| anyhow::anyhow!("no queue {queue}"))?;
                    let consumer = if consumer == "-" { String::new() } else { aqgate_core::topology::canon(consumer) };
                    let secret = match std::env::var("AQGATE_NOTIFY_SECRET") {
                        Ok(s) => s,
                        Err(_) => {
                            let mut line = String::new();
                            std::io::stdin().read_line(&mut line)?;
                            line.trim_end_matches(['\r', '\n']).to_string()
                        }
                    };
                    let secret = (!secret.is_empty()).then_some(secret.as_str());
                    let agent = aqgate_core::topology::canon(agent);
                    if !store.set_registration_secret(qid, &consumer, &agent, secret).await? {
                        anyhow::bail!("no registration of agent {agent} for {queue} consumer {consumer:?}");
                    }
                    out!(
                        "secret {} for {queue} {consumer:?} {agent}",
                        if secret.is_some() { "set" } else { "removed" }
                    );
                    return Ok(());
                }
                let names: std::collections::HashMap<_, _> = ids.into_iter().map(|(n, id)| (id, n)).collect();
                out!("{:<28} {:<16} {:<16} NOTIFY_URL", "QUEUE", "CONSUMER", "AGENT");
                for r in store.all_registrations().await? {
                    out!(
                        "{:<28} {:<16} {:<16} {}",
                        names.get(&r.queue).map_or("?", String::as_str),
                        if r.consumer.is_empty() { "-" } else { &r.consumer },
                        r.agent,
                        aqgate::notify::redact_url(&r.notify_url)
                    );
                }
                Ok(())
            }
            AdminCommand::HashPassword => {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
                let h = aqgate_core::auth::hash_password(line.trim_end_matches(['\r', '\n']))
                    .map_err(|e| anyhow::anyhow!(e))?;
                out!("{h}");
                Ok(())
            }
        },
    }
}

/// The TEST ONLY CA and CRL that sign the demo agents' certificates (certs/).
const DEMO_CA: &[u8] = include_bytes!("../certs/ca.pem");
const DEMO_CRL: &[u8] = include_bytes!("../certs/ca.crl");

async fn mail_config(
    a: &MailArgs,
    real_directory: bool,
    directory: std::sync::Arc<dyn aqgate_directory::Directory>,
) -> anyhow::Result<aqgate::server::MailConfig> {
    use aqgate_mail::smime::TrustStore;
    let trust = if a.smime_ca.is_empty() {
        // The demo CA is only a default next to the demo directory: a real directory needs
        // a real CA, said explicitly.
        anyhow::ensure!(
            !real_directory,
            "--ldap-url needs --smime-ca (the CA agent certificates chain to), or --no-smtp"
        );
        tracing::warn!("SMTP filter trusts the TEST ONLY demo CA (certs/ca.pem); use --smime-ca in production");
        TrustStore::from_pem(&[DEMO_CA], &[DEMO_CRL]).map_err(|e| anyhow::anyhow!("demo CA: {e}"))?
    } else {
        TrustStore::from_pem_files(&a.smime_ca, &a.smime_crl).map_err(|e| anyhow::anyhow!("S/MIME trust: {e}"))?
    };
    let gateway_password = match (&a.gateway_password_file, std::env::var("AQGATE_GATEWAY_PASSWORD").ok()) {
        (Some(f), _) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        (None, Some(p)) => p,
        (None, None) => {
            tracing::warn!("SMTP filter uses the DEMO gateway password; set AQGATE_GATEWAY_PASSWORD");
            "gateway-demo".to_string()
        }
    };
    let addresses: Vec<String> = a.gateway_addresses.iter().map(|x| x.trim().to_ascii_lowercase()).collect();
    let reply_from = addresses.first().cloned().ok_or_else(|| anyhow::anyhow!("--gateway-address is empty"))?;
    let tls = match (&a.smtp_tls_cert, &a.smtp_tls_key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
            Some(aqgate_mail::gateway::tls_acceptor(&read(c)?, &read(k)?).map_err(|e| anyhow::anyhow!(e))?)
        }
        (None, None) => None,
        // Flags and the environment are checked by clap; the configuration file here.
        _ => anyhow::bail!("STARTTLS needs both --smtp-tls-cert and --smtp-tls-key (smtp.tls_cert, smtp.tls_key)"),
    };
    let smtp_listener = tokio::net::TcpListener::bind(a.smtp_listen).await?;
    Ok(aqgate::server::MailConfig {
        smtp_listener,
        smtp: aqgate_mail::smtp::SmtpConfig {
            hostname: a.smtp_hostname.clone(),
            gateway_addresses: addresses,
            reinject: match &a.smtp_reinject {
                Some(url) => Some(aqgate_mail::reinject::parse_target(url).map_err(|e| anyhow::anyhow!(e))?),
                None => None,
            },
            max_message_size: a.smtp_max_size,
            idle_timeout: Duration::from_secs(300),
            starttls: tls.is_some(),
            max_session: Duration::from_secs(1800),
            lmtp: a.lmtp,
        },
        tls,
        trust,
        directory,
        gateway_agent: a.gateway_agent.clone(),
        gateway_password,
        reply_from,
        transport: mail_transport(a),
        dedupe_window: Duration::from_secs(a.dedupe_window_hours.saturating_mul(3600)),
    })
}

/// Registers the handlers for SIGTERM and SIGINT at once (so a signal that arrives while
/// the service is still starting — migrations, topology — is not the default "die" but a
/// graceful stop as soon as it serves) and resolves when one arrives.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down");
    }
}
