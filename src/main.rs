//! The `aqgate` binary's command line: `serve`, `smtp`, `notify`, `admin …`, `mail sign`,
//! `config check`, parsed (the configuration file's values as the defaults, see `config`)
//! and dispatched: to `service` for the long-running commands, to `aqgate_admin::cli` for
//! the administration tables.

mod args;
mod config;
mod server;
mod service;

#[cfg(all(feature = "saml", feature = "vendored-openssl"))]
compile_error!(
    "the `saml` feature links xmlsec1, which uses the system OpenSSL; build it without the vendored one: \
     cargo build --release --no-default-features --features saml"
);

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use args::{NotifyCommandArgs, ServeArgs, SmtpArgs};

/// mimalloc instead of glibc's malloc: a message_set of 100 allocates and frees a few
/// thousand buffers of 1–2 KiB across the runtime's threads, and glibc's arenas spent
/// about 30 % of the servlet's CPU on that (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "aqgate", version, about = "Oracle-AQ-style queuing over HTTP (IDAP) and signed e-mail")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Threads that run requests (the async runtime's workers). By default one per CPU, or
    /// half of them (at least one) when the database is on this host: SQLite, or PostgreSQL
    /// at a loopback address or a Unix socket, whose backends need the cores at the same
    /// moments as the requests.
    #[arg(long, global = true, env = "AQGATE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
    /// Configuration file (TOML, every setting of serve, smtp and notify; see
    /// aqgate.example.toml). The environment beats it, flags beat both.
    #[arg(long, global = true, env = "AQGATE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// What is logged: a level (`error`, `warn`, `info`, `debug`, `trace`), optionally per
    /// module (`info,aqgate_propagate=debug`), in tracing's filter syntax.
    #[arg(long, global = true, env = "AQGATE_LOG", value_name = "FILTER", default_value = DEFAULT_LOG)]
    log_level: String,
    /// Append the log to FILE (created if missing, plain text) instead of writing it to
    /// standard error. It is opened once: rotate it with copytruncate, or restart.
    #[arg(long, global = true, env = "AQGATE_LOG_FILE", value_name = "FILE")]
    log_file: Option<PathBuf>,
}

/// The log filter without `--log-level`: aqgate's own lines, and only the drivers' warnings.
const DEFAULT_LOG: &str = "info,sqlx=warn,lapin=error";

/// Starts the log as `--log-level` and `--log-file` say; a bad filter or a file that cannot
/// be opened is an error before anything runs.
fn start_log(filter: &str, file: Option<&std::path::Path>) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| format!("--log-level {filter}: {e}"))?;
    let log = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("--log-file {}: {e}", path.display()))?;
            log.with_writer(std::sync::Mutex::new(f)).with_ansi(false).init();
        }
        // Colours for a terminal only: journald or a redirect gets plain text.
        None => log.with_writer(std::io::stderr).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
    Ok(())
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Command {
    /// Run the AQ servlet (and background duties) in one process.
    Serve(ServeArgs),
    /// Run only the notification dispatcher, on the database a servlet elsewhere writes.
    Notify(NotifyCommandArgs),
    /// Administration.
    Admin {
        #[command(subcommand)]
        command: aqgate_admin::cli::AdminCommand,
    },
    /// Run only the SMTP filter and its forwarding worker, posting to a servlet elsewhere
    /// (sharing its database).
    Smtp(SmtpArgs),
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
    /// IDAP from the shell: send, receive, browse, commit, rollback (docs/client.md).
    #[command(flatten)]
    Client(aqgate_client::cli::ClientCommand),
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
        /// The signer's certificate (PEM; further certificates in the file, such as
        /// intermediate CAs, travel in the signature).
        #[arg(long)]
        cert: PathBuf,
        /// The signer's private key (PEM).
        #[arg(long)]
        key: PathBuf,
        /// The mail's From address: the agent's directory mail address, which the SMTP
        /// filter finds the agent by.
        #[arg(long)]
        from: String,
        /// The mail's To address: the gateway's.
        #[arg(long, default_value = "aq@localhost")]
        to: String,
        /// The mail's Subject.
        #[arg(long, default_value = "AQ request")]
        subject: String,
        /// Then encrypt the signed mail to this certificate (PEM; the gateway's S/MIME
        /// certificate): S/MIME enveloped-data, AES-256-CBC.
        #[arg(long)]
        encrypt_to: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
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
    // `config check` also reads the settings as `serve` would take them.
    let as_serve = command.clone();
    let matches = command.get_matches_from(&args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = start_log(&cli.log_level, cli.log_file.as_deref()) {
        eprintln!("aqgate: {e}");
        return ExitCode::from(2);
    }
    // `--topology` (or AQGATE_TOPOLOGY) outranks the file's `topology.apply = false`.
    if let (Command::Serve(ServeArgs { no_topology, .. }), Some(("serve", m))) =
        (&mut cli.command, matches.subcommand())
        && config::given_over_default(m, "topology", "no_topology")
    {
        *no_topology = false;
    }
    if let Command::Config { command: ConfigCommand::Check } = cli.command {
        let Some(path) = file else {
            eprintln!("aqgate: no configuration file: give --config FILE or set AQGATE_CONFIG");
            return ExitCode::FAILURE;
        };
        // What would stop `serve` with them (its policies, files and topology).
        let problems = match as_serve.try_get_matches_from(["aqgate", "serve"]).map(|m| Cli::from_arg_matches(&m)) {
            Ok(Ok(Cli { command: Command::Serve(a), .. })) => service::serve_problems(&a),
            Ok(Ok(_)) => Vec::new(),
            Ok(Err(e)) | Err(e) => vec![e.to_string()],
        };
        if !problems.is_empty() {
            for p in &problems {
                eprintln!("aqgate: serve: {p}");
            }
            eprintln!("aqgate: {}: `serve` would not start: {} problem(s)", path.display(), problems.len());
            return ExitCode::FAILURE;
        }
        println!("{}: ok, {} setting(s)", path.display(), settings.unwrap_or(0));
        return ExitCode::SUCCESS;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    // Services say how many they run on; the short-lived commands keep the runtime's default.
    if let Some(db) = service_database(&cli.command) {
        let n = cli.worker_threads.map_or_else(|| default_workers(cpus, db), usize::from);
        tracing::info!(worker_threads = n, cpus, "runtime (--worker-threads sets the number)");
        builder.worker_threads(n);
    } else if let Some(n) = cli.worker_threads {
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
        // `aqgate admin … | head`: the reader went away; the end, quietly, as SIGPIPE would be.
        Err(e) if e.chain().any(|c| c.downcast_ref::<aqgate_admin::OutputError>().is_some_and(|o| o.reader_gone())) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aqgate: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The database of a command that runs a service (its runtime's size matters); `None` for
/// the short-lived commands, which keep the runtime's default.
fn service_database(command: &Command) -> Option<&str> {
    match command {
        Command::Serve(a) => Some(&a.db.database),
        Command::Smtp(a) => Some(&a.db.database),
        Command::Notify(a) => Some(&a.db.database),
        _ => None,
    }
}

/// Worker threads for a service on `cpus` CPUs whose store is `database`: one per CPU, or
/// half of them (at least one) when the database runs on this host. A request spends about
/// as much CPU in PostgreSQL's backend as in aqgate (BENCHMARKS.md, "Threads"), at the same
/// moments: a worker per CPU then leaves the database's backends, the kernel's network
/// stack and the clients on the host to preempt request threads, and every hand-off
/// between tasks on two workers wakes a thread. Measured on 2 CPUs beside PostgreSQL, one
/// worker serves single sends and receives faster than two and batches as fast; single
/// sends mixed with batches lose about a tenth (BENCHMARKS.md, "Threads").
fn default_workers(cpus: usize, database: &str) -> usize {
    if database_is_local(database) { (cpus / 2).max(1) } else { cpus.max(1) }
}

/// Whether `database` (a store URL) is on this host: SQLite (any URL the store does not
/// open as PostgreSQL, as `aqgate_store::open` decides), or PostgreSQL at a loopback
/// address, `localhost`, or a Unix socket. The host is the one the driver connects to, read
/// by the driver's own parser (`host`/`hostaddr` parameters, a percent-encoded socket
/// path, `PGHOST` when the URL names none). A database in another container of the same
/// machine counts as elsewhere.
fn database_is_local(database: &str) -> bool {
    use std::str::FromStr;
    if !(database.starts_with("postgres://") || database.starts_with("postgresql://")) {
        return true;
    }
    let Ok(o) = sqlx::postgres::PgConnectOptions::from_str(database) else { return false };
    let host = o.get_host().trim_matches(['[', ']']);
    o.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `e` and its causes, `: `-separated, each cause left out that the message before it
/// already ends with (an error that shows its source, e.g. the store's `database: …`).
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if text.is_empty() {
            text = c;
        } else if !text.ends_with(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => service::serve(a).await,
        Command::Smtp(a) => service::smtp(a).await,
        Command::Notify(a) => service::notify(a).await,
        // Answered in main, before the runtime starts.
        Command::Config { command: ConfigCommand::Check } => Ok(()),
        Command::Mail { command: MailCommand::Sign { file, cert, key, from, to, subject, encrypt_to } } => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
            let (idap, cert, key) = (read(&file)?, read(&cert)?, read(&key)?);
            let mail = match encrypt_to {
                Some(to_cert) => {
                    aqgate_mail::smime::sign_encrypted(&idap, &cert, &key, &from, &to, &subject, &read(&to_cert)?)
                }
                None => aqgate_mail::smime::sign(&idap, &cert, &key, &from, &to, &subject),
            }
            .map_err(|e| anyhow::anyhow!("sign: {e}"))?;
            use std::io::Write as _;
            std::io::stdout().write_all(&mail)?;
            Ok(())
        }
        Command::Admin { command } => aqgate_admin::cli::run(command).await,
        Command::Client(c) => aqgate_client::cli::run(c).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_on_this_host_gets_half_the_cpus() {
        for local in [
            "sqlite://aqgate.db",
            "sqlite::memory:",
            "postgres://postgres@127.0.0.1:5432/aqgate",
            "postgres://u@localhost/aqgate",
            "postgresql://u@[::1]:5432/aqgate",
            "postgres:///aqgate",
            "postgres://u@db/aqgate?host=/var/run/postgresql",
            "postgres://u@%2Fvar%2Frun%2Fpostgresql/aqgate",
            "postgres://u@db.example.com/aqgate?host=localhost",
            // The socket wins over a later hostaddr: the driver connects through it.
            "postgres://u@127.0.0.1/aqgate?host=/tmp&hostaddr=10.0.0.7",
        ] {
            assert!(database_is_local(local), "{local}");
            assert_eq!(default_workers(8, local), 4, "{local}");
            assert_eq!(default_workers(2, local), 1, "{local}");
            assert_eq!(default_workers(1, local), 1, "{local}");
        }
        for remote in [
            "postgres://u@db.example.com/aqgate",
            "postgres://u@10.0.0.7:5432/aqgate",
            "postgres://u@localhost/aqgate?host=db.example.com",
            "postgres:///aqgate?hostaddr=10.0.0.7",
        ] {
            assert!(!database_is_local(remote), "{remote}");
            assert_eq!(default_workers(8, remote), 8, "{remote}");
        }
    }
}
