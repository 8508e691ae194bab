//! Private broker instances for the tests that kill a broker: NATS with JetStream, a
//! RabbitMQ node and Mosquitto, each on free ports of its own with its own data directory
//! in the temp directory, never the shared ones the other tests use. Each runs as a
//! [`Proc`] and is started again on the same port and data after a kill ([`Broker::kill9`])
//! or a graceful stop ([`Broker::stop`]). A missing binary fails the test, naming
//! `scripts/ensure-brokers.sh`, which installs them.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Proc, free_port};

/// The first of `candidates` that exists, else the test fails saying what to install.
fn binary(what: &str, candidates: &[&str]) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(what)).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates.iter().map(PathBuf::from).chain(on_path).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("{what} is not installed (looked at {candidates:?} and PATH): run scripts/ensure-brokers.sh")
    })
}

/// A broker of this test's own.
pub struct Broker {
    name: String,
    pub port: u16,
    pub dir: PathBuf,
    command: Box<dyn Fn() -> Command + Send>,
    /// How long a start may take.
    boot: Duration,
    proc: Option<Proc>,
    /// Started as a process group of its own, killed as one (RabbitMQ: a shell script, the
    /// Erlang VM and its helpers).
    group: bool,
    pub starts: usize,
}

fn temp_dir(kind: &str) -> PathBuf {
    let d =
        std::env::temp_dir().join(format!("aqgate-test-{kind}-{}", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

impl Broker {
    /// `nats-server -js` on a free port, its store in a directory of its own.
    pub fn nats() -> Self {
        let bin = binary("nats-server", &["/usr/sbin/nats-server", "/usr/bin/nats-server"]);
        let (port, dir) = (free_port(), temp_dir("nats"));
        let store = dir.join("js");
        let command = Box::new(move || {
            let mut c = Command::new(&bin);
            c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"]).arg(&store);
            c
        });
        Self::started("nats-server", port, dir, command, Duration::from_secs(30), false)
    }

    /// A RabbitMQ node `aqgt-TAG@localhost` in the foreground, with an empty configuration
    /// and no plugins (so the system's own, e.g. the management plugin's port, do not
    /// clash), its Mnesia, logs and Erlang cookie in its own directory.
    pub fn rabbitmq(tag: &str) -> Self {
        let bin = binary("rabbitmq-server", &["/usr/lib/rabbitmq/bin/rabbitmq-server"]);
        let (port, dist, dir) = (free_port(), free_port(), temp_dir("rabbitmq"));
        std::fs::write(dir.join("rabbitmq.conf"), "").expect("rabbitmq.conf");
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("enabled_plugins");
        let node = format!("aqgt-{tag}@localhost");
        let d = dir.clone();
        let command = Box::new(move || {
            let mut c = Command::new(&bin);
            c.current_dir(&d)
                .env("HOME", &d)
                .env("RABBITMQ_NODENAME", &node)
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", dist.to_string())
                .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", d.join("log"))
                .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"));
            c
        });
        Self::started("rabbitmq-server", port, dir, command, Duration::from_secs(120), true)
    }

    /// Mosquitto with persistence in its own directory. Mosquitto started as root runs as
    /// the user `mosquitto`, so the directory is open to it.
    pub fn mosquitto() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let bin = binary("mosquitto", &["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]);
        let (port, dir) = (free_port(), temp_dir("mosquitto"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
                dir.display()
            ),
        )
        .expect("mosquitto.conf");
        let command = Box::new(move || {
            let mut c = Command::new(&bin);
            c.arg("-c").arg(&conf);
            c
        });
        Self::started("mosquitto", port, dir, command, Duration::from_secs(30), false)
    }

    fn started(
        name: &str,
        port: u16,
        dir: PathBuf,
        command: Box<dyn Fn() -> Command + Send>,
        boot: Duration,
        group: bool,
    ) -> Self {
        let mut b = Self { name: name.to_string(), port, dir, command, boot, proc: None, group, starts: 0 };
        b.start();
        b
    }

    /// Starts it (again, on the same port and data) and waits until it listens.
    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "{} is running", self.name);
        let mut cmd = (self.command)();
        if self.group {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let log = self.dir.join(format!("{}.log", self.name));
        let mut p = Proc::spawn_logged(&self.name, &mut cmd, &log);
        let deadline = Instant::now() + self.boot;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(st) = p.exited() {
                panic!("{} exited ({st}) while starting; {}:\n{}", self.name, log.display(), p.log_tail(30));
            }
            assert!(
                Instant::now() < deadline,
                "{} not listening within {:?}; log {}",
                self.name,
                self.boot,
                log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.starts += 1;
        self.proc = Some(p);
    }

    /// SIGKILL (to the whole group, for RabbitMQ), and waits until every process of it is
    /// gone and the port is free.
    pub fn kill9(&mut self) {
        let Some(p) = self.proc.take() else { return };
        if self.group {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", p.id())]).status();
        }
        let pid = p.id();
        drop(p);
        if self.group {
            wait_gone(&format!("-{pid}"));
        }
        self.wait_port_free();
    }

    /// SIGTERM, and waits until it has exited (Mosquitto writes its persistence then).
    pub fn stop(&mut self) {
        let Some(mut p) = self.proc.take() else { return };
        p.signal("-TERM");
        p.wait_exit(Duration::from_secs(60));
        self.wait_port_free();
    }

    fn wait_port_free(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "{}: port {} still answers after the stop", self.name, self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits until `kill -0 TARGET` (a pid, or `-PGID` for a group) fails: nothing left.
fn wait_gone(target: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive = Command::new("kill")
            .args(["-0", "--", target])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !alive {
            return;
        }
        assert!(Instant::now() < deadline, "processes {target} still there 30 s after SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            if self.group {
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", p.id())]).status();
            }
            drop(p);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("{}: its data and log stay in {}", self.name, self.dir.display());
        }
    }
}
