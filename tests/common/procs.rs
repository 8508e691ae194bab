//! Child processes of a test (`aqgate serve`, `aqgate smtp`, `aqgate notify`, HAProxy):
//! each one in a [`Proc`], which kills it (SIGKILL) and reaps it when dropped — also when
//! the test fails — and keeps its output in a log file. A test that fails prints where
//! the log is, and its last lines.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `aqgate` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_aqgate");

/// `aqgate ARGS`, to be started with [`Proc::spawn`] (or run to the end).
pub fn aqgate(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    c
}

/// A running child process: killed and reaped when dropped.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// The log is this guard's own file in the temp directory: removed with the guard,
    /// unless the test is failing.
    own_log: bool,
}

impl Proc {
    /// Starts `cmd` (`name` says what it is in messages) with its output in a log file of
    /// its own in the temp directory.
    pub fn spawn(name: &str, cmd: &mut Command) -> Self {
        let log = std::env::temp_dir()
            .join(format!("aqgate-test-{name}-{}.log", &aqgate_core::engine::session::random_id()[..12]));
        let mut p = Self::spawn_logged(name, cmd, &log);
        p.own_log = true;
        p
    }

    /// Starts `cmd` with standard input closed and its standard output and error appended
    /// to `log` (which outlives the guard).
    pub fn spawn_logged(name: &str, cmd: &mut Command, log: &Path) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{name}: log file {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the log handle");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Self { name: name.to_string(), child, log: log.to_path_buf(), own_log: false }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the process wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for a failure message.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap_or_else(|e| panic!("{}: wait: {e}", self.name))
    }

    /// Waits (at most `within`) for the process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.exited() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}; log: {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most 30 s) until something listens on 127.0.0.1:`port`; panics if the
    /// process exits first.
    pub fn wait_port(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(st) = self.exited() {
                panic!(
                    "{} exited ({st}) before listening on port {port}; {}:\n{}",
                    self.name,
                    self.log.display(),
                    self.log_tail(30)
                );
            }
            assert!(Instant::now() < deadline, "{}: port {port} never opened; log: {}", self.name, self.log.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (at most `within`) until `GET /readyz` on `port` answers 200; panics if the
    /// process exits first.
    pub fn wait_ready(&mut self, port: u16, within: Duration) {
        let deadline = Instant::now() + within;
        while http_get(port, "/readyz").map(|(st, _)| st) != Some(200) {
            if let Some(st) = self.exited() {
                panic!("{} exited ({st}) while starting; {}:\n{}", self.name, self.log.display(), self.log_tail(30));
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready within {within:?}; log: {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` (as `kill` spells it: `-TERM`, `-HUP`, `-STOP`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.id().to_string()]).status().expect("run kill").success();
        assert!(ok, "kill {sig} {}", self.name);
    }

    /// SIGKILL, and reaped: what dropping it does, said out loud.
    pub fn kill9(self) {
        drop(self);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL on Unix; nothing if it was reaped already.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{} (pid {}), {}:\n{}", self.name, self.child.id(), self.log.display(), self.log_tail(30));
        } else if self.own_log {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// `GET path` on 127.0.0.1:`port` with a bare HTTP/1.0 request: status and body, or `None`
/// when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    c.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
    let mut text = String::new();
    c.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// The value of an unlabelled gauge or counter in `/metrics`.
pub fn metric(port: u16, name: &str) -> i64 {
    let (status, text) = http_get(port, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// `aqgate admin queues` on `db`: each queue's depth.
pub fn depths(db: &str) -> std::collections::BTreeMap<String, i64> {
    let out = Command::new(BIN).args(["admin", "queues", "--database", db]).output().expect("admin queues");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?.to_string();
            let depth = l.split_whitespace().last()?.parse().ok()?;
            Some((name, depth))
        })
        .collect()
}

/// The depth of `queue` in `db` (as `aqgate admin queues` shows it).
pub fn depth(db: &str, queue: &str) -> i64 {
    depths(db).get(queue).copied().unwrap_or_else(|| panic!("{queue} not listed"))
}

/// Waits until `queue` in `db` holds `n` messages.
pub fn wait_depth(db: &str, queue: &str, n: i64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let d = depth(db, queue);
        if d == n {
            return;
        }
        assert!(Instant::now() < deadline, "{queue} holds {d}, not {n}, after {within:?}: {:?}", depths(db));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `ok` holds, looking every 50 ms.
pub fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `aqgate admin jobs --json` on `db`: every job's figures, by name.
pub fn jobs(db: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let out = Command::new(BIN).args(["admin", "jobs", "--json", "--database", db]).output().expect("admin jobs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("admin jobs --json");
    list.into_iter().map(|j| (j["name"].as_str().unwrap_or_default().to_string(), j)).collect()
}

/// Waits until job `name` of `db` is listed and meets `ok`; its figures then.
pub fn wait_job(db: &str, name: &str, within: Duration, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let all = jobs(db);
        if let Some(j) = all.get(name).filter(|j| ok(j)) {
            return j.clone();
        }
        assert!(Instant::now() < deadline, "job {name} not as expected within {within:?}: {all:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
