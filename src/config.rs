//! The configuration file: `--config FILE` (or `AQGATE_CONFIG`), one TOML file with every
//! setting of `serve`, `smtp` and `notify` (aqgate.example.toml shows them all).
//!
//! Precedence: the file < the environment (the `AQGATE_*` variables) < the command line.
//! The file's values become the defaults of the command-line parser, which already lets
//! an environment variable beat its default and a flag beat both. The whole file is
//! checked before anything starts, and every problem in it is reported at once, with its
//! key path and the file's name. A value that may hold a credential (a database URL with
//! a password) is never shown, neither in an error nor as a default in `--help`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command};

/// What a key takes in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string (an address, a path, a URL, a name).
    Text,
    /// An integer.
    Integer,
    /// A boolean: the flag's value.
    Flag,
    /// A boolean that is the flag's opposite (`smtp.enabled = false` is `--no-smtp`).
    NotFlag,
    /// An array of strings (a repeatable flag); a single string is one element, split
    /// where the flag splits its value (`notify.allow = "public,10.0.0.0/8"`).
    List,
}

/// One key of the file and the command-line argument it sets.
#[derive(Debug)]
pub struct Key {
    /// `section.name`.
    pub path: &'static str,
    /// The clap id of the argument (the field name).
    pub arg: &'static str,
    pub kind: Kind,
    /// The value may hold a credential (a URL's password): never shown.
    pub secret: bool,
    /// An environment variable that outranks this key although it is not its flag's own:
    /// a password given in the environment beats a password file named in the file (as
    /// it yields to a password file given as a flag or in the environment).
    pub yields_to: Option<&'static str>,
}

const fn key(path: &'static str, arg: &'static str, kind: Kind) -> Key {
    Key { path, arg, kind, secret: false, yields_to: None }
}

const fn secret(path: &'static str, arg: &'static str) -> Key {
    Key { path, arg, kind: Kind::Text, secret: true, yields_to: None }
}

const fn password_file(path: &'static str, arg: &'static str, env: &'static str) -> Key {
    Key { path, arg, kind: Kind::Text, secret: false, yields_to: Some(env) }
}

/// Every key of the file. A test checks that every argument of `serve`, `smtp` and
/// `notify` has one, and that aqgate.example.toml shows each.
pub const KEYS: &[Key] = &[
    key("runtime.worker_threads", "worker_threads", Kind::Integer),
    key("log.level", "log_level", Kind::Text),
    key("log.file", "log_file", Kind::Text),
    secret("database.url", "database"),
    key("database.vacuum_every", "vacuum_every", Kind::Integer),
    key("http.listen", "listen", Kind::Text),
    key("http.max_body", "max_body", Kind::Integer),
    key("http.max_wait", "max_wait", Kind::Integer),
    key("http.max_long_polls_per_agent", "max_long_polls_per_agent", Kind::Integer),
    key("http.idempotency_window", "idempotency_window", Kind::Integer),
    key("http.idempotency_max_response_bytes", "idempotency_max_response_bytes", Kind::Integer),
    key("http.idempotency_max_records_per_agent", "idempotency_max_records_per_agent", Kind::Integer),
    key("http.idempotency_max_bytes_per_agent", "idempotency_max_bytes_per_agent", Kind::Integer),
    key("http.tls_cert", "tls_cert", Kind::Text),
    key("http.tls_key", "tls_key", Kind::Text),
    key("http.client_ca", "tls_client_ca", Kind::List),
    key("http.client_crl", "tls_client_crl", Kind::List),
    key("http.require_client_cert", "require_client_cert", Kind::Flag),
    key("http.plain_listen", "plain_listen", Kind::Text),
    key("http.console", "console", Kind::Flag),
    key("http.allow_plain_http", "allow_plain_http", Kind::Flag),
    key("http.header_timeout", "http_header_timeout", Kind::Integer),
    key("http.body_timeout", "http_body_timeout", Kind::Integer),
    key("http.idle_timeout", "http_idle_timeout", Kind::Integer),
    key("http.max_connections", "http_max_connections", Kind::Integer),
    key("http.max_connections_per_ip", "http_max_connections_per_ip", Kind::Integer),
    key("auth.password_checks", "password_checks", Kind::Integer),
    key("auth.password_check_wait_ms", "password_check_wait_ms", Kind::Integer),
    key("auth.failures_before_backoff", "auth_failures_before_backoff", Kind::Integer),
    key("auth.backoff_max", "auth_backoff_max", Kind::Integer),
    key("topology.file", "topology", Kind::Text),
    key("topology.apply", "no_topology", Kind::NotFlag),
    key("sessions.timeout", "session_timeout", Kind::Integer),
    key("sessions.tombstone_ttl", "session_tombstone_ttl", Kind::Integer),
    key("sessions.max", "max_sessions", Kind::Integer),
    key("sessions.max_per_agent", "max_sessions_per_agent", Kind::Integer),
    key("sessions.secure_cookie", "secure_cookie", Kind::Flag),
    key("propagation.lease_ttl", "propagation_lease_ttl", Kind::Integer),
    key("propagation.broker_max_message_bytes", "broker_max_message_bytes", Kind::Integer),
    key("messages.max_recipients", "max_recipients", Kind::Integer),
    key("conditions.max_steps", "condition_max_steps", Kind::Integer),
    key("conditions.max_text_bytes", "condition_max_text_bytes", Kind::Integer),
    key("conditions.request_steps", "condition_request_steps", Kind::Integer),
    key("buffered.max_messages", "buffered_max_messages", Kind::Integer),
    key("buffered.spill_bytes", "buffered_spill_bytes", Kind::Integer),
    key("buffered.max_bytes", "buffered_max_bytes", Kind::Integer),
    key("buffered.spill_after", "buffered_spill_after", Kind::Integer),
    key("directory.ldap_url", "ldap_url", Kind::Text),
    key("directory.base_dn", "ldap_base_dn", Kind::Text),
    key("directory.bind_dn", "ldap_bind_dn", Kind::Text),
    password_file("directory.password_file", "ldap_password_file", "AQGATE_LDAP_PASSWORD"),
    key("directory.ca_file", "ldap_ca_file", Kind::Text),
    key("directory.timeout", "ldap_timeout", Kind::Integer),
    key("directory.ldif", "ldif", Kind::Text),
    key("smtp.enabled", "no_smtp", Kind::NotFlag),
    key("smtp.listen", "smtp_listen", Kind::Text),
    key("smtp.hostname", "smtp_hostname", Kind::Text),
    key("smtp.lmtp", "lmtp", Kind::Flag),
    key("smtp.max_size", "smtp_max_size", Kind::Integer),
    key("smtp.max_connections", "smtp_max_connections", Kind::Integer),
    key("smtp.max_per_client", "smtp_max_per_client", Kind::Integer),
    key("smtp.per_client_exempt", "smtp_per_client_exempt", Kind::List),
    key("smtp.mail_timeout", "smtp_mail_timeout", Kind::Integer),
    key("smtp.data_timeout", "smtp_data_timeout", Kind::Integer),
    key("smtp.data_memory", "smtp_data_memory", Kind::Integer),
    key("smtp.data_dir", "smtp_data_dir", Kind::Text),
    key("smtp.max_large_messages", "smtp_max_large_messages", Kind::Integer),
    key("smtp.tls_cert", "smtp_tls_cert", Kind::Text),
    key("smtp.tls_key", "smtp_tls_key", Kind::Text),
    secret("smtp.reinject", "smtp_reinject"),
    secret("smtp.servlet_url", "servlet_url"),
    key("gateway.addresses", "gateway_addresses", Kind::List),
    key("gateway.agent", "gateway_agent", Kind::Text),
    password_file("gateway.password_file", "gateway_password_file", "AQGATE_GATEWAY_PASSWORD"),
    key("gateway.dedupe_window_hours", "dedupe_window_hours", Kind::Integer),
    key("smime.ca", "smime_ca", Kind::List),
    key("smime.crl", "smime_crl", Kind::List),
    key("smime.reply_cert", "smime_reply_cert", Kind::Text),
    key("smime.reply_key", "smime_reply_key", Kind::Text),
    key("mail.outbox", "mail_outbox", Kind::Text),
    secret("mail.relay", "mail_relay"),
    key("notify.enabled", "no_notify", Kind::NotFlag),
    key("notify.allow", "notify_allow", Kind::List),
    key("notify.mail_allow", "notify_mail_allow", Kind::List),
    key("notify.timeout", "notify_timeout", Kind::Integer),
    key("notify.max_attempts", "notify_max_attempts", Kind::Integer),
    key("notify.concurrency", "notify_concurrency", Kind::Integer),
    key("notify.per_target", "notify_per_target", Kind::Integer),
    key("notify.breaker_failures", "notify_breaker_failures", Kind::Integer),
    key("notify.breaker_cooldown", "notify_breaker_cooldown", Kind::Integer),
    key("notify.from", "notify_from", Kind::Text),
    key("notify.ca_files", "notify_ca_files", Kind::List),
    key("notify.poll_ms", "poll_ms", Kind::Integer),
    key("saml.idp_metadata", "saml_idp_metadata", Kind::Text),
    key("saml.entity_id", "saml_entity_id", Kind::Text),
    key("saml.clock_skew", "saml_clock_skew", Kind::Integer),
    key("saml.agent_attribute", "saml_agent_attribute", Kind::Text),
];

/// The configuration file named on the command line (`--config FILE`, `--config=FILE`,
/// before or after the subcommand), else by `AQGATE_CONFIG`. Read before the command line
/// is parsed, since the file's values become the parser's defaults.
pub fn file_named(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os("AQGATE_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// A file that was read and applied.
#[derive(Debug)]
pub struct Loaded {
    /// The parser, with the file's values as its defaults.
    pub command: Command,
    /// How many keys the file set.
    pub settings: usize,
}

/// Reads `path` and makes its values the defaults of `command`'s arguments (in every
/// subcommand that has them). `Err`: every problem, each line naming the file and the key.
pub fn load(command: Command, path: &Path) -> Result<Loaded, Vec<String>> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{name}: {e}")])?;
    let settings = check(&command, &text)
        .map_err(|errors| errors.into_iter().map(|e| format!("{name}: {e}")).collect::<Vec<_>>())?;
    let count = settings.len();
    let mut command = command;
    for (k, values) in settings {
        if k.yields_to.is_some_and(|env| std::env::var_os(env).is_some_and(|v| !v.is_empty())) {
            continue;
        }
        command = set_default(command, k, &values);
    }
    Ok(Loaded { command, settings: count })
}

/// The settings of the file `text` as the strings the command line would take, each
/// checked by its argument's own parser; `Err`: every problem, as `key: what`.
pub fn check(command: &Command, text: &str) -> Result<Vec<(&'static Key, Vec<String>)>, Vec<String>> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| vec![parse_error(text, &e)])?;
    let mut errors = Vec::new();
    let mut settings = Vec::new();
    for (section, value) in &table {
        if !KEYS.iter().any(|k| k.path.split_once('.').is_some_and(|(s, _)| s == section)) {
            errors.push(format!("unknown key {section}"));
            continue;
        }
        let Some(entries) = value.as_table() else {
            errors.push(format!("{section}: expected a table ([{section}]), found {}", value.type_str()));
            continue;
        };
        for (name, value) in entries {
            let path = format!("{section}.{name}");
            let Some(k) = KEYS.iter().find(|k| k.path == path) else {
                errors.push(format!("unknown key {path}"));
                continue;
            };
            match values_of(command, k, value) {
                Ok(v) => settings.push((k, v)),
                Err(e) => errors.extend(e),
            }
        }
    }
    let set = |p: &str| settings.iter().find(|(k, _)| k.path == p).map(|(_, v)| v.as_slice());
    if set("topology.file").is_some() && set("topology.apply") == Some(&["true".to_string()][..]) {
        errors.push("topology.file and topology.apply = false exclude each other".into());
    }
    if !cfg!(feature = "saml") && set("saml.idp_metadata").is_some() {
        errors.push(format!("saml.idp_metadata: {}", aqgate_http::SAML_FEATURE_MISSING));
    }
    if errors.is_empty() { Ok(settings) } else { Err(errors) }
}

/// `line L, column C: message`, without the excerpt of the file the parser's own message
/// carries (it could show a password).
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {}", e.message().trim_end())
        }
        None => e.message().trim_end().to_string(),
    }
}

/// The strings `value` gives argument `k.arg`, each checked by that argument's parser.
fn values_of(command: &Command, k: &Key, value: &toml::Value) -> Result<Vec<String>, Vec<String>> {
    let path = k.path;
    let wrong = |expected: &str| vec![format!("{path}: expected {expected}, found {}", value.type_str())];
    let Some(arg) = find_arg(command, k.arg) else {
        return Err(vec![format!("{path}: no such setting in this version")]);
    };
    let values = match (k.kind, value) {
        (Kind::Text, toml::Value::String(s)) => vec![s.clone()],
        (Kind::Text, _) => return Err(wrong("a string")),
        (Kind::Integer, toml::Value::Integer(i)) => vec![i.to_string()],
        (Kind::Integer, _) => return Err(wrong("an integer")),
        (Kind::Flag, toml::Value::Boolean(b)) => vec![b.to_string()],
        (Kind::NotFlag, toml::Value::Boolean(b)) => vec![(!b).to_string()],
        (Kind::Flag | Kind::NotFlag, _) => return Err(wrong("true or false")),
        (Kind::List, toml::Value::String(s)) => match arg.get_value_delimiter() {
            Some(d) => s.split(d).map(str::to_string).collect(),
            None => vec![s.clone()],
        },
        (Kind::List, toml::Value::Array(items)) => {
            let mut v = Vec::new();
            let mut errors = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item.as_str() {
                    Some(s) => v.push(s.to_string()),
                    None => errors.push(format!("{path}[{i}]: expected a string, found {}", item.type_str())),
                }
            }
            if !errors.is_empty() {
                return Err(errors);
            }
            v
        }
        (Kind::List, _) => return Err(wrong("an array of strings")),
    };
    if matches!(k.kind, Kind::Flag | Kind::NotFlag) {
        return Ok(values);
    }
    let mut errors = Vec::new();
    for (i, v) in values.iter().enumerate() {
        if let Err(why) = parse_as(arg, v) {
            let at = if matches!(value, toml::Value::Array(_)) { format!("{path}[{i}]") } else { path.to_string() };
            let shown = if k.secret { "(not shown)".to_string() } else { format!("{v:?}") };
            errors.push(format!("{at}: invalid value {shown}: {why}"));
        }
    }
    if errors.is_empty() { Ok(values) } else { Err(errors) }
}

/// Runs `arg`'s own value parser on `value` (the check the flag gets).
fn parse_as(arg: &Arg, value: &str) -> Result<(), String> {
    let probe = Command::new("aqgate")
        .no_binary_name(true)
        .arg(Arg::new("value").long("value").action(ArgAction::Set).value_parser(arg.get_value_parser().clone()));
    let as_flag = format!("--value={value}");
    match probe.try_get_matches_from([as_flag.as_str()]) {
        Ok(_) => Ok(()),
        Err(e) => Err(match std::error::Error::source(&e) {
            Some(why) => why.to_string(),
            None => e.kind().to_string(),
        }),
    }
}

/// The argument `id` of `command` or of any of its subcommands.
fn find_arg<'a>(command: &'a Command, id: &str) -> Option<&'a Arg> {
    command
        .get_arguments()
        .find(|a| a.get_id() == id)
        .or_else(|| command.get_subcommands().find_map(|s| find_arg(s, id)))
}

/// Makes `values` the default of argument `k.arg` wherever `command` has it.
fn set_default(command: Command, k: &Key, values: &[String]) -> Command {
    let mut command = command;
    if command.get_arguments().any(|a| a.get_id() == k.arg) {
        // clap keeps defaults as `&'static str` (without its `string` feature): the file's
        // values are read once, at start, and live as long as the process.
        let values: Vec<&'static str> = values.iter().map(|v| &*Box::leak(v.clone().into_boxed_str())).collect();
        let list = k.kind == Kind::List;
        let hide = k.secret;
        command = command.mut_arg(k.arg, move |a| {
            let a = match (list, values.as_slice()) {
                (false, [one]) => a.default_value(*one),
                _ => a.default_values(values),
            };
            if hide { a.hide_default_value(true) } else { a }
        });
    }
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for n in names {
        command = command.mut_subcommand(n, |s| set_default(s, k, values));
    }
    command
}

/// Whether the value of argument `wins` was given (command line or environment) while
/// `loses` only has its default, i.e. the file's value: then `wins`, of the higher rank,
/// decides where the two exclude each other (`--topology` over `topology.apply = false`).
pub fn given_over_default(m: &ArgMatches, wins: &str, loses: &str) -> bool {
    use clap::parser::ValueSource;
    let given = matches!(m.value_source(wins), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
    given && m.value_source(loses) == Some(ValueSource::DefaultValue)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The arguments that are not settings: the file's own name.
    const NOT_SETTINGS: &[&str] = &["config"];

    const EXAMPLE: &str = include_str!("../aqgate.example.toml");

    /// The parser as it runs (global arguments in every subcommand, flags' defaults set).
    fn built() -> Command {
        let mut c = crate::Cli::command();
        c.build();
        c
    }

    /// The example with its commented-out settings (`# key = value`) switched on.
    fn example_all_set() -> String {
        EXAMPLE
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.split_once(" = ").is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
                {
                    rest
                }
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn every_argument_of_serve_smtp_and_notify_has_a_key() {
        let cli = built();
        let mut missing = Vec::new();
        let global: Vec<_> = cli.get_arguments().collect();
        for sub in ["serve", "smtp", "notify"] {
            let s = cli.find_subcommand(sub).expect("subcommand");
            for a in s.get_arguments().chain(global.iter().copied()) {
                let id = a.get_id().as_str();
                if NOT_SETTINGS.contains(&id) || matches!(a.get_action(), ArgAction::Help | ArgAction::Version) {
                    continue;
                }
                match KEYS.iter().find(|k| k.arg == id) {
                    None => missing.push(format!("{sub} --{}", a.get_long().unwrap_or(id))),
                    Some(k) => {
                        let bool_flag = matches!(a.get_action(), ArgAction::SetTrue);
                        let repeatable = matches!(a.get_action(), ArgAction::Append);
                        assert_eq!(bool_flag, matches!(k.kind, Kind::Flag | Kind::NotFlag), "{}: kind", k.path);
                        assert_eq!(repeatable, k.kind == Kind::List, "{}: kind", k.path);
                    }
                }
            }
        }
        assert!(missing.is_empty(), "arguments without a key in config::KEYS: {missing:?}");
        for k in KEYS {
            assert!(find_arg(&cli, k.arg).is_some(), "{} names no argument {}", k.path, k.arg);
            assert_eq!(KEYS.iter().filter(|o| o.path == k.path || o.arg == k.arg).count(), 1, "{} twice", k.path);
        }
    }

    #[test]
    fn the_example_shows_every_key_and_parses() {
        let cli = built();
        let as_is = check(&cli, EXAMPLE).unwrap_or_else(|e| panic!("aqgate.example.toml: {e:?}"));
        let all = check(&cli, &example_all_set()).unwrap_or_else(|e| panic!("aqgate.example.toml, all set: {e:?}"));
        let shown: Vec<&str> = all.iter().map(|(k, _)| k.path).collect();
        let unshown: Vec<&str> = KEYS.iter().map(|k| k.path).filter(|p| !shown.contains(p)).collect();
        assert!(unshown.is_empty(), "keys the example does not show: {unshown:?}");
        assert!(as_is.len() < all.len(), "the settings without a default are commented out");
        // The values set in the example are the defaults.
        for (k, values) in &as_is {
            let a = find_arg(&cli, k.arg).expect("argument");
            let default: Vec<String> =
                a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            assert_eq!(&default, values, "{}: the example shows the default", k.path);
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let cli = built();
        let text = "[http]\nlisten = \"x\"\nlistn = 1\nmax_body = \"big\"\n[nope]\n[notify]\nallow = [\"public\", 3]\n\
                    [database]\nurl = 5\n[sessions]\nsecure_cookie = \"yes\"\n[runtime]\nworker_threads = 0\n";
        let errors = check(&cli, text).expect_err("invalid");
        let want = [
            "http.listen: invalid value \"x\": invalid socket address syntax",
            "unknown key http.listn",
            "http.max_body: expected an integer, found string",
            "unknown key nope",
            "notify.allow[1]: expected a string, found integer",
            "database.url: expected a string, found integer",
            "sessions.secure_cookie: expected true or false, found string",
            "runtime.worker_threads: invalid value \"0\": 0 is not in 1..=1024",
        ];
        for w in want {
            assert!(errors.iter().any(|e| e == w), "{w:?} not in {errors:#?}");
        }
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
    }

    #[test]
    fn a_syntax_error_names_the_place_without_the_text() {
        let cli = built();
        let errors = check(&cli, "[database]\nurl = \"postgres://u:hunter2@h/db\n").expect_err("unterminated");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("line 2, column "), "{errors:?}");
        assert!(!errors[0].contains("hunter2"), "{errors:?}");
    }

    #[test]
    fn a_list_given_as_one_string_is_split_as_the_flag_splits_it() {
        let cli = built();
        let s = check(&cli, "[notify]\nallow = \"public,10.0.0.0/8\"\n[smime]\nca = \"a,b.pem\"\n").expect("valid");
        let get = |p: &str| s.iter().find(|(k, _)| k.path == p).map(|(_, v)| v.clone()).expect(p);
        assert_eq!(get("notify.allow"), ["public", "10.0.0.0/8"]);
        assert_eq!(get("smime.ca"), ["a,b.pem"]);
    }
}
