//! The configuration file through the real binary: its values apply, the environment
//! beats it, a flag beats the environment; an invalid file is reported as a whole, with
//! key paths and the file's name, before anything starts; aqgate.example.toml is valid
//! and names every flag of `serve`, `smtp` and `notify`.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Proc, free_port, fresh_sqlite_url};

const BIN: &str = env!("CARGO_BIN_EXE_aqgate");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/aqgate.example.toml");
const TOPOLOGY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/topology.toml");

/// `aqgate` with none of the caller's `AQGATE_*` variables (they would change the result).
fn aqgate() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AQGATE_") {
            c.env_remove(k);
        }
    }
    c
}

/// A configuration file with `text`, in the temp directory.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(text: &str) -> Self {
        // A random name: a port number, free now, may be handed to a parallel test's file too,
        // whose drop would then delete this one.
        let id = &aqgate_core::engine::session::random_id()[..12];
        let p = std::env::temp_dir().join(format!("aqgate-config-{}-{id}.toml", std::process::id()));
        std::fs::write(&p, text).expect("write the configuration file");
        Self(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("UTF-8 path")
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Starts `cmd` and waits until `GET /readyz` on `port` answers 200.
fn start(mut cmd: Command, port: u16) -> Proc {
    let mut s = Proc::spawn("aqgate serve", &mut cmd);
    s.wait_ready(port, Duration::from_secs(60));
    s
}

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The first line an SMTP server on `port` greets with.
fn smtp_greeting(port: u16) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect to the SMTP filter");
    c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).expect("greeting");
    String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string()
}

fn run(cmd: &mut Command) -> (Output, Duration) {
    let t = Instant::now();
    let out = cmd.output().expect("run aqgate");
    (out, t.elapsed())
}

#[test]
fn the_files_values_apply() {
    let (http, smtp) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let file = ConfigFile::new(&format!(
        "[database]\nurl = {db:?}\n[http]\nlisten = \"127.0.0.1:{http}\"\n\
         [smtp]\nlisten = \"127.0.0.1:{smtp}\"\nhostname = \"mx.config.example\"\n[notify]\nenabled = false\n"
    ));
    let mut cmd = aqgate();
    cmd.args(["--config", file.path(), "serve"]);
    let _s = start(cmd, http);
    let greeting = smtp_greeting(smtp);
    assert!(greeting.starts_with("220 mx.config.example"), "the file's SMTP address and host name: {greeting}");
    // The same file names the database for `admin` (through AQGATE_CONFIG this time).
    let (out, _) = run(aqgate().env("AQGATE_CONFIG", file.path()).args(["admin", "queues"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.lines().any(|l| l.starts_with("QS.NEW_ORDERS_QUE ")), "the file's database: {listing}");
}

#[test]
fn the_environment_beats_the_file() {
    let (in_file, in_env) = (free_port(), free_port());
    let file = ConfigFile::new(&format!(
        "[database]\nurl = {:?}\n[http]\nlisten = \"127.0.0.1:{in_file}\"\n[smtp]\nenabled = false\n",
        fresh_sqlite_url()
    ));
    let mut cmd = aqgate();
    cmd.args(["--config", file.path(), "serve"]).env("AQGATE_LISTEN", format!("127.0.0.1:{in_env}"));
    let _s = start(cmd, in_env);
    assert!(!listening(in_file), "the file's address is not used when the environment gives one");
}

#[test]
fn a_flag_beats_the_environment_and_the_file() {
    let (in_file, in_env, on_line) = (free_port(), free_port(), free_port());
    let file = ConfigFile::new(&format!(
        "[database]\nurl = {:?}\n[http]\nlisten = \"127.0.0.1:{in_file}\"\n[smtp]\nenabled = false\n",
        fresh_sqlite_url()
    ));
    let mut cmd = aqgate();
    cmd.args(["--config", file.path(), "serve", "--listen", &format!("127.0.0.1:{on_line}")])
        .env("AQGATE_LISTEN", format!("127.0.0.1:{in_env}"));
    let _s = start(cmd, on_line);
    assert!(!listening(in_file) && !listening(in_env), "only the flag's address is used");
}

/// `topology.apply = false` keeps what the database has; a topology given in the
/// environment outranks it.
#[test]
fn a_topology_in_the_environment_beats_the_files_apply_false() {
    let queues = |file: &ConfigFile| {
        let (out, _) = run(aqgate().args(["--config", file.path(), "admin", "queues"]));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().skip(1).count()
    };
    for (env, want_queues) in [(None, false), (Some(TOPOLOGY), true)] {
        let port = free_port();
        let file = ConfigFile::new(&format!(
            "[database]\nurl = {:?}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[smtp]\nenabled = false\n\
             [topology]\napply = false\n",
            fresh_sqlite_url()
        ));
        let mut cmd = aqgate();
        cmd.args(["--config", file.path(), "serve"]);
        if let Some(t) = env {
            cmd.env("AQGATE_TOPOLOGY", t);
        }
        let s = start(cmd, port);
        drop(s);
        assert_eq!(queues(&file) > 0, want_queues, "AQGATE_TOPOLOGY={env:?}");
    }
}

#[test]
fn an_unknown_key_and_a_bad_value_stop_the_start_with_key_and_file_named() {
    let port = free_port();
    let db_file = std::env::temp_dir().join(format!("aqgate-config-never-{}.db", free_port()));
    let file = ConfigFile::new(&format!(
        "[database]\nurl = \"sqlite://{}\"\n[http]\nlisten = \"x\"\nlistn = \"127.0.0.1:1\"\n",
        db_file.display()
    ));
    let (out, took) = run(aqgate().args(["--config", file.path(), "serve", "--listen", &format!("127.0.0.1:{port}")]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("{}: unknown key http.listn", file.path())), "{err}");
    assert!(
        err.contains(&format!("{}: http.listen: invalid value \"x\": invalid socket address", file.path())),
        "{err}"
    );
    assert!(!err.contains("listening"), "nothing started: {err}");
    assert!(!db_file.exists(), "the database was not even opened");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn every_error_is_reported_at_once_and_no_password_is_shown() {
    let file = ConfigFile::new(
        "[database]\nurl = \"postgres://aqgate:hunter2@127.0.0.1/aqgate\"\nport = 5432\n\
         [http]\nmax_body = \"4 MiB\"\n[sessions]\nsecure_cookie = \"yes\"\ntimeout = -1\n\
         [notify]\nallow = [\"public\", 10]\n[smtp]\nlisten = \"localhost\"\n[runtime]\nworker_threads = 0\n\
         [serve.http]\nlisten = \"127.0.0.1:1\"\n",
    );
    let (out, _) = run(aqgate().args(["--config", file.path(), "serve"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let name = file.path();
    for want in [
        "unknown key database.port",
        "http.max_body: expected an integer, found string",
        "sessions.secure_cookie: expected true or false, found string",
        "sessions.timeout: invalid value \"-1\"",
        "notify.allow[1]: expected a string, found integer",
        "smtp.listen: invalid value \"localhost\"",
        "runtime.worker_threads: invalid value \"0\": 0 is not in 1..=1024",
        "unknown key serve",
    ] {
        assert!(err.lines().any(|l| l.contains(&format!("{name}: {want}"))), "{want:?} not in:\n{err}");
    }
    assert!(err.contains(&format!("{name}: 8 error(s)")), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_missing_file_is_named() {
    let missing = std::env::temp_dir().join(format!("aqgate-no-such-config-{}.toml", free_port()));
    let (out, _) = run(aqgate().arg("serve").env("AQGATE_CONFIG", &missing));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("{}: No such file", missing.display())), "{err}");
}

/// The flags of `aqgate SUB --help`, e.g. `--listen`.
fn flags_of(sub: &str) -> Vec<String> {
    let (out, _) = run(aqgate().args([sub, "--help"]));
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim_start)
        // `-h, --help`: the long name after the short one.
        .map(|l| if l.starts_with('-') && l.get(2..4) == Some(", ") { &l[4..] } else { l })
        .filter_map(|l| l.strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', '=']).next().unwrap_or_default()))
        .filter(|f| f != "--help" && f != "--config")
        .collect()
}

#[test]
fn the_example_file_is_valid_and_names_every_flag() {
    let (out, _) = run(aqgate().args(["--config", EXAMPLE, "config", "check"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
    let example = std::fs::read_to_string(EXAMPLE).expect("read the example");
    let named = |flag: &str| {
        example.match_indices(flag).any(|(i, _)| {
            example[i + flag.len()..].chars().next().is_some_and(|c| !(c.is_ascii_alphanumeric() || c == '-'))
        })
    };
    let mut unnamed = Vec::new();
    for sub in ["serve", "smtp", "notify"] {
        let flags = flags_of(sub);
        assert!(flags.len() > 5, "{sub}: {flags:?}");
        unnamed.extend(flags.into_iter().filter(|f| !named(f)).map(|f| format!("{sub} {f}")));
    }
    assert!(unnamed.is_empty(), "flags aqgate.example.toml does not name: {unnamed:?}");
    // `aqgate config check` without a file is an error, not a silent success.
    let (out, _) = run(aqgate().args(["config", "check"]));
    assert!(!out.status.success());
}

/// Every flag of every command says what it does in `--help` (not only its default).
#[test]
fn every_flag_has_a_help_text() {
    let commands: [&[&str]; 15] = [
        &["serve"],
        &["smtp"],
        &["notify"],
        &["admin", "apply"],
        &["admin", "queues"],
        &["admin", "messages"],
        &["admin", "agents"],
        &["admin", "spool"],
        &["admin", "notifications"],
        &["admin", "jobs"],
        &["admin", "gateway"],
        &["admin", "registrations"],
        &["admin", "hash-password"],
        &["mail", "sign"],
        &["config", "check"],
    ];
    let mut bare = Vec::new();
    for c in commands {
        let (out, _) = run(aqgate().args(c).arg("--help"));
        assert!(out.status.success(), "{c:?} --help");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            let flag = w[0].trim_start().starts_with("--") || w[0].trim_start().starts_with('-');
            let said = w[1].trim();
            if flag && w[0].starts_with("  ") && (said.is_empty() || said.starts_with('[')) {
                bare.push(format!("{}: {}", c.join(" "), w[0].trim()));
            }
        }
    }
    assert!(bare.is_empty(), "flags without a help text: {bare:?}");
}

/// `config check` finds what would stop `serve` with the file's settings, as `serve`
/// would: plain HTTP beyond loopback, a topology file that does not resolve.
#[test]
fn config_check_refuses_what_would_stop_serve() {
    let dir = std::env::temp_dir().join(format!("aqgate-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let check = |file: &str, extra: &[&str]| {
        let out = aqgate().args(["--config", file]).args(extra).args(["config", "check"]).output().expect("run");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p.to_string_lossy().to_string()
    };
    let open = file("open.toml", "[http]\nlisten = \"0.0.0.0:8470\"\n");
    let (ok, err) = check(&open, &[]);
    assert!(!ok && err.contains("refusing plain HTTP on 0.0.0.0:8470"), "{err}");
    let allowed = file("allowed.toml", "[http]\nlisten = \"0.0.0.0:8470\"\nallow_plain_http = true\n");
    let (ok, err) = check(&allowed, &[]);
    assert!(ok, "{err}");
    let topology = file("bad-topology.toml", "[[queues]]\nname = \"NO_SCHEMA\"\nqueue_table = \"X.Y\"\n");
    let bad = file("bad.toml", &format!("[topology]\nfile = \"{topology}\"\n"));
    let (ok, err) = check(&bad, &[]);
    assert!(!ok && err.contains("bad-topology.toml") && err.contains("would not start"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `cmd` that must stop by itself within 10 s: its exit status and stderr (a server
/// that starts instead is killed, and the test fails).
fn stops_by_itself(cmd: &mut Command) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start aqgate");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for aqgate") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("aqgate started instead of refusing the configuration");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    (status, err)
}

/// The file's values are the parser's defaults, which its `requires` do not check: a
/// `plain_listen` (or a certificate without its key) in the file without HTTPS stops the
/// start rather than serving plain HTTP on an address beyond the plain-HTTP policy.
#[test]
fn a_plain_listen_in_the_file_without_https_stops_the_start() {
    let (port, plain) = (free_port(), free_port());
    let db = fresh_sqlite_url();
    let listen = format!("127.0.0.1:{port}");
    let args = ["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", &db];
    let file = ConfigFile::new(&format!("[http]\nplain_listen = \"0.0.0.0:{plain}\"\n"));
    let (status, err) = stops_by_itself(aqgate().args(["--config", file.path()]).args(args));
    assert!(!status.success(), "{err}");
    assert!(err.contains("needs --tls-cert and --tls-key"), "{err}");
    assert!(!listening(plain) && !listening(port), "nothing listens");

    let cert = concat!(env!("CARGO_MANIFEST_DIR"), "/certs/gateway-tls.pem");
    let file = ConfigFile::new(&format!("[http]\ntls_cert = \"{cert}\"\n"));
    let (status, err) = stops_by_itself(aqgate().args(["--config", file.path()]).args(args));
    assert!(!status.success(), "{err}");
    assert!(err.contains("--tls-cert needs --tls-key"), "{err}");
}
