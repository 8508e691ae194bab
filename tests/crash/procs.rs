//! The processes of a crash run: `aqgate serve` nodes that are killed with SIGKILL and
//! restarted on the same database and ports, the killer that does it at random moments,
//! and HAProxy in front of several nodes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::common::{BIN, Proc};

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Seconds an idle session lives. Short, so that the sessions of clients that never learnt
/// their cookie (the answer was lost in a kill) roll back before the final drain; long
/// enough for a commit retried across a restart.
pub const SESSION_TIMEOUT_SECS: u64 = 8;

/// A fresh scratch directory for one run.
pub fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("aqgate-crash-{tag}-{}", &aqgate_core::engine::session::random_id()[..12]));
    std::fs::create_dir_all(&dir).expect("create scratch directory");
    dir
}

/// One `aqgate serve` process slot: the same arguments (database, ports) at every start.
pub struct Node {
    pub name: String,
    pub port: u16,
    args: Vec<String>,
    log: PathBuf,
    proc: Option<Proc>,
    pub starts: u64,
}

impl Node {
    /// `serve` on 127.0.0.1:`port` with `db`, the session timeout above and `extra` flags;
    /// its output is appended to `dir/NAME.log` over all its starts.
    pub fn new(name: &str, dir: &Path, db: &str, port: u16, extra: &[String]) -> Self {
        let mut args: Vec<String> = ["serve", "--listen", &format!("127.0.0.1:{port}"), "--database", db]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--session-timeout".to_string(), SESSION_TIMEOUT_SECS.to_string()]);
        args.extend(extra.iter().cloned());
        Self { name: name.into(), port, args, log: dir.join(format!("{name}.log")), proc: None, starts: 0 }
    }

    pub fn spawn(&mut self) {
        assert!(self.proc.is_none(), "{} is running already", self.name);
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("open node log");
        self.starts += 1;
        let _ = writeln!(log, "==== crash test: start {} of {}", self.starts, self.name);
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args).env("RUST_LOG", "info").env("NO_COLOR", "1");
        self.proc = Some(Proc::spawn_logged(&self.name, &mut cmd, &self.log));
    }

    /// Waits until `/readyz` answers 200. Panics if the process exits or `within` passes.
    pub fn wait_ready(&mut self, within: Duration) {
        let proc = self.proc.as_mut().unwrap_or_else(|| panic!("{} is not running", self.name));
        proc.wait_ready(self.port, within);
    }

    pub fn start(&mut self) {
        self.spawn();
        self.wait_ready(Duration::from_secs(60));
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What the killer did.
pub struct KillReport {
    pub kills: u64,
    /// Kills while a node was still starting (before its `/readyz`).
    pub kills_while_starting: u64,
    pub nodes: Vec<Node>,
}

/// Shared between the killer and the clients: the number of kills so far (the clients
/// note it in their histories) and the end of the load.
#[derive(Default)]
pub struct Clock {
    pub generation: AtomicU64,
    pub stop: AtomicBool,
    /// The test failed: the killer ends at once (and its nodes with it).
    abort: AtomicBool,
}

impl Clock {
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
}

impl super::common::signed_mail::Run for Clock {
    fn stopped(&self) -> bool {
        Clock::stopped(self)
    }

    fn generation(&self) -> u64 {
        Clock::generation(self)
    }
}

/// The killer's thread. Dropped without [`Killer::finish`] (a test failing), it stops the
/// thread and waits for it, so no node outlives the test.
pub struct Killer {
    handle: Option<std::thread::JoinHandle<KillReport>>,
    clock: Arc<Clock>,
}

impl Killer {
    /// Waits for the end of the load (blocking).
    pub fn finish(mut self) -> KillReport {
        let h = self.handle.take().expect("the killer is running");
        h.join().expect("the killer thread panicked (see above)")
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.clock.abort.store(true, Ordering::SeqCst);
            let _ = h.join();
        }
    }
}

/// Kills one of `nodes` (chosen at random) with SIGKILL every 0.3–1.5 s and starts it again
/// at once on the same database and port, until at least `min_kills` kills and `min_load`
/// have passed, or `max_load` has. Some kills hit a node that is still starting (recovery
/// interrupted). At the end one last kill and restart, then every node is left running
/// and ready, and the load is told to stop.
pub fn killer(
    mut nodes: Vec<Node>,
    clock: Arc<Clock>,
    seed: u64,
    min_kills: u64,
    min_load: Duration,
    max_load: Duration,
) -> Killer {
    let c = clock.clone();
    let handle = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let (mut kills, mut kills_while_starting) = (0, 0);
        let mut starting: Option<usize> = None;
        while (kills < min_kills || t0.elapsed() < min_load) && t0.elapsed() < max_load {
            let pause = Instant::now() + Duration::from_millis(rng.gen_range(300..=1500));
            while Instant::now() < pause && !clock.aborted() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if clock.aborted() {
                return KillReport { kills, kills_while_starting, nodes };
            }
            let i = rng.gen_range(0..nodes.len());
            if starting == Some(i) {
                kills_while_starting += 1;
            } else if let Some(j) = starting.take() {
                nodes[j].wait_ready(Duration::from_secs(60));
            }
            nodes[i].kill9();
            kills += 1;
            clock.generation.fetch_add(1, Ordering::SeqCst);
            nodes[i].spawn();
            // One restart in five is left starting: the next kill may interrupt it.
            if rng.gen_bool(0.2) {
                starting = Some(i);
            } else {
                starting = None;
                nodes[i].wait_ready(Duration::from_secs(60));
            }
        }
        // The last kill, then every node up again for the end of the load and the drain.
        let i = rng.gen_range(0..nodes.len());
        nodes[i].kill9();
        kills += 1;
        clock.generation.fetch_add(1, Ordering::SeqCst);
        nodes[i].spawn();
        for n in &mut nodes {
            n.wait_ready(Duration::from_secs(60));
        }
        clock.stop.store(true, Ordering::SeqCst);
        KillReport { kills, kills_while_starting, nodes }
    });
    Killer { handle: Some(handle), clock: c }
}

/// HAProxy in the foreground (`-db`) with `deploy/haproxy/haproxy.cfg`, copied into the
/// run's directory; the addresses come from the environment variables the file reads.
pub struct Haproxy {
    cfg: PathBuf,
    dir: PathBuf,
    env: Vec<(String, String)>,
    proc: Option<Proc>,
    pub port: u16,
}

impl Haproxy {
    /// Renders and checks (`haproxy -c`) the configuration for a front on `port` and the
    /// three nodes on `nodes`.
    pub fn prepare(dir: &Path, port: u16, nodes: &[u16]) -> Self {
        assert_eq!(nodes.len(), 3, "the example configuration has three nodes");
        let template = std::fs::read_to_string(format!("{ROOT}/deploy/haproxy/haproxy.cfg")).expect("haproxy.cfg");
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, template).expect("write haproxy.cfg");
        let mut env = vec![("AQGATE_LB_LISTEN".to_string(), format!("127.0.0.1:{port}"))];
        for (i, p) in nodes.iter().enumerate() {
            env.push((format!("AQGATE_NODE{}", i + 1), format!("127.0.0.1:{p}")));
        }
        let out =
            Command::new("haproxy").args(["-c", "-f"]).arg(&cfg).envs(env.iter().cloned()).output().unwrap_or_else(
                |e| panic!("haproxy is required for the multi-node test (scripts/ensure-tools.sh): {e}"),
            );
        assert!(
            out.status.success(),
            "haproxy refuses the configuration: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self { cfg, dir: dir.to_path_buf(), env, proc: None, port }
    }

    /// Starts HAProxy (the nodes are up) and waits until a node answers `/readyz` through it.
    pub fn start_after_nodes(mut self) -> Self {
        let mut cmd = Command::new("haproxy");
        cmd.args(["-db", "-f"]).arg(&self.cfg).envs(self.env.iter().cloned());
        let proc = self.proc.insert(Proc::spawn_logged("haproxy", &mut cmd, &self.dir.join("haproxy.log")));
        // Ready when a node answers through it.
        proc.wait_ready(self.port, Duration::from_secs(30));
        self
    }
}

/// `aqgate admin ARGS`: its standard output.
pub fn admin(args: &[&str]) -> String {
    let out = Command::new(BIN).arg("admin").args(args).output().expect("run aqgate admin");
    assert!(out.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The depth `admin queues` lists for `queue`.
pub fn depth(db: &str, queue: &str) -> i64 {
    let listing = admin(&["queues", "--database", db]);
    listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(queue))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{queue} not listed in:\n{listing}"))
}
