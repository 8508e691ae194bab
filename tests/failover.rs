//! A PostgreSQL failover under load: `aqgate serve` on a Patroni cluster of two PostgreSQL 15
//! nodes with synchronous replication, through HAProxy routing to the primary
//! (`scripts/pg-cluster.sh`, `deploy/patroni/`). Three loads run at once:
//!
//! - four HTTP senders send numbered RAW messages with a trailing commit, each under an
//!   `Idempotency-Key` and sent again with the same key after any failure until it is
//!   answered; a local propagation job moves them to a second queue, and one receiver takes
//!   them from there (under keys too);
//! - two more senders, alike, feed the outbound Messaging Gateway job `TO_RABBIT`, which
//!   moves their messages to a queue of the RabbitMQ on 127.0.0.1:5672 (at least once: a
//!   message published again after a doubt carries `x-aqgate-redelivered`);
//! - two mail submitters send S/MIME-signed mails to aqgate's SMTP listener, each mail's
//!   IDAP request one numbered message with a commit; a mail is submitted until it is
//!   answered 250, always the same bytes (`common::signed_mail`: the spool knows a copy by
//!   its signed content's digest, not by its Message-ID, and answers it "already have this
//!   request" without performing it again).
//!
//! Meanwhile the primary's postmaster is killed with SIGKILL five times, each time waiting
//! for a new leader, and one planned switchover follows. After the load, mails still
//! unanswered are submitted again until answered 250, the worker forwards every spooled
//! mail, the jobs' sources empty, and everything is drained: every acknowledged HTTP
//! message received exactly once and nothing else; every mail answered 250 performed exactly once (however
//! often it was submitted) and none never answered 250; every message acknowledged to the
//! gateway job's senders at RabbitMQ, never twice without the mark, and the job with
//! nothing in doubt. Sessions time out after the default 300 s: a job's batch whose
//! rollback failed in an outage is rolled back again before the job's next batch, so its
//! messages move once the database is back.
//!
//! The figures (time from each kill to the new leader and to the first commit of a request
//! sent after it, what `/readyz` answered during the outage; the mails accepted, performed,
//! twice, lost; the gateway's messages at the broker and their duplicates, marked or not)
//! are printed: run with `--nocapture` to read them. The cluster takes fixed ports (23790,
//! 23800, 25000, 25432-25433, 28008-28009).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::{Limits, Response};
use common::gateway::{copies_of, rabbit, rabbit_drain};
use common::signed_mail::{self as mail, MailFigures};
use common::{COMMIT, SCOTT, aqserv, demo_topology_with, hex, http_get, idap_request, raw_send, receive};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// HAProxy's front (routes to the primary) and the nodes' Patroni REST APIs.
const LB: u16 = 25000;
const APIS: [u16; 2] = [28008, 28009];
const KILLS: usize = 5;
const SENDERS: u64 = 4;
const SOURCE: &str = "AQUSER.RAW_QUE";
const INBOX: &str = "AQUSER.RAW_INBOX";
/// Senders to the outbound gateway job's source (numbers from 10 000 000), and mail
/// submitters (numbers from 20 000 000, performed into [`MAIL_QUEUE`]).
const GATEWAY_SENDERS: u64 = 2;
const OUT_QUEUE: &str = "AQUSER.RAW_OUT";
const SUBMITTERS: u64 = 2;
const MAIL_QUEUE: &str = "AQUSER.RAW_ARCHIVE";
/// A sender that has not got its message acknowledged after this gives up (and the test fails).
const GIVE_UP: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- the cluster

/// The cluster `scripts/pg-cluster.sh` runs in a directory of its own; stopped (and its
/// directory removed, unless the test failed) when dropped.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("aqgate-failover-{}", &aqgate_core::engine::session::random_id()[..12]));
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        let c = Self { dir };
        let out = c.script("start");
        assert!(
            out.status.success(),
            "scripts/pg-cluster.sh start {} (scripts/ensure-patroni.sh installs what it needs): {}{}",
            c.dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn script(&self, what: &str) -> Output {
        Command::new(format!("{ROOT}/scripts/pg-cluster.sh"))
            .arg(what)
            .arg(&self.dir)
            .output()
            .expect("run scripts/pg-cluster.sh")
    }

    /// The members as Patroni's `GET /cluster` lists them (from whichever node answers).
    fn members(&self) -> Vec<serde_json::Value> {
        APIS.iter()
            .find_map(|p| {
                let (status, body) = http_get(*p, "/cluster")?;
                let v: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
                v["members"].as_array().cloned()
            })
            .unwrap_or_default()
    }

    /// The member of `role` (`leader`, `sync_standby`) in state `running`.
    fn member(&self, role: &str) -> Option<String> {
        self.members()
            .iter()
            .find(|m| m["role"] == role && m["state"] == "running")
            .and_then(|m| m["name"].as_str().map(String::from))
    }

    /// Waits until a leader runs with a synchronous standby (a failover is possible); the
    /// leader and the standby.
    fn wait_synchronous(&self, within: Duration) -> (String, String) {
        let deadline = Instant::now() + within;
        loop {
            if let (Some(l), Some(s)) = (self.member("leader"), self.member("sync_standby"))
                && self.streams_synchronously()
            {
                return (l, s);
            }
            assert!(Instant::now() < deadline, "no leader with a synchronous standby within {within:?}: {:#?}", {
                self.members()
            });
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until a leader other than `old` runs; its name.
    fn wait_new_leader(&self, old: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(l) = self.member("leader").filter(|l| l != old) {
                return l;
            }
            assert!(Instant::now() < deadline, "no new leader after {old} within {within:?}: {:#?}", self.members());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of `node`'s postmaster (the first line of its `postmaster.pid`).
    fn postmaster(&self, node: &str) -> u32 {
        let f = self.dir.join(node).join("data/postmaster.pid");
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        text.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("{}: {text}", f.display()))
    }

    /// `patronictl ARGS` with the first node's configuration, ended after 60 s.
    fn patronictl(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["60", "patronictl", "-c"])
            .arg(self.dir.join("node1.yml"))
            .args(args)
            .output()
            .expect("run patronictl")
    }

    /// Whether the primary (through HAProxy) streams to a synchronous standby, as
    /// PostgreSQL itself says (`pg_stat_replication`).
    fn streams_synchronously(&self) -> bool {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &LB.to_string(), "-U", "postgres", "-d", "postgres", "-XAtqc"])
            .arg("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'")
            .env("PGCONNECT_TIMEOUT", "2")
            .output();
        out.is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "1")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = self.script("stop");
        if !out.status.success() {
            eprintln!("pg-cluster.sh stop: {}", String::from_utf8_lossy(&out.stderr));
        }
        if std::thread::panicking() {
            eprintln!("the cluster's logs (etcd, node1, node2, haproxy): {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------- the load

/// What the clients learnt.
#[derive(Default)]
struct Ledger {
    /// Numbers whose send was attempted, and those answered status 0.
    attempted: BTreeSet<u64>,
    acked: BTreeSet<u64>,
    /// Given up after [`GIVE_UP`] without an answer.
    given_up: BTreeSet<u64>,
    /// Every number a receive-and-commit returned with status 0 (the drain's included).
    received: Vec<u64>,
    /// (attempt sent, answered) of each acknowledged send.
    commits: Vec<(Instant, Instant)>,
    /// Failed attempts, by what went wrong.
    failures: BTreeMap<String, u64>,
}

type Shared = Arc<Mutex<Ledger>>;

/// The end of the load, and the outages so far (noted in the mails' histories).
#[derive(Default)]
struct Phase {
    stop: AtomicBool,
    outages: AtomicU64,
}

impl mail::Run for Phase {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn generation(&self) -> u64 {
        self.outages.load(Ordering::SeqCst)
    }
}

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// IDAP over HTTP as scott to the gateway.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    fn new(port: u16) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("http client");
        Self { http, url: aqserv(port) }
    }

    /// `body` under `key`: the IDAP answer, or what went wrong (its outcome unknown).
    async fn post(&self, body: &str, key: &str) -> Result<Response, String> {
        let r = idap_request(&self.http, &self.url, SCOTT, body.to_string())
            .header("idempotency-key", key)
            .send()
            .await
            .map_err(|e| if e.is_connect() { "not connected".to_string() } else { "no answer".to_string() })?;
        let status = r.status().as_u16();
        let bytes = r.bytes().await.map_err(|_| "answer cut".to_string())?;
        match aqgate_proto::idap::parse_response(&bytes, &Limits::default()) {
            Ok(env) => Ok(env.body),
            Err(_) => Err(format!("HTTP {status}, not IDAP")),
        }
    }
}

/// The fault code of an answer that is not a success.
fn fault_code(r: &Response) -> Option<i32> {
    match r {
        Response::Fault(f) => Some(f.code),
        Response::Send(s, _) | Response::Receive(s, _) if s.status_code != 0 => Some(s.error_code.unwrap_or(-1)),
        Response::Send(..) | Response::Receive(..) => None,
        _ => Some(-1),
    }
}

/// The numbers a successful receive returned.
fn numbers(r: &Response) -> Vec<u64> {
    match r {
        Response::Receive(_, Some(res)) => res
            .messages
            .iter()
            .map(|m| {
                let text = m.payload.text();
                u64::from_str_radix(text.trim(), 16).unwrap_or_else(|_| panic!("not a numbered payload: {text}"))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Sender `s`: one message per request to `queue` (number `s * 1_000_000 + n`, with a
/// trailing commit), each under a new `Idempotency-Key` and sent again with that key after
/// any failure, until answered status 0; until the load stops.
async fn sender(c: Client, s: u64, queue: &'static str, ledger: Shared, phase: Arc<Phase>) {
    use mail::Run;
    let mut n = 0;
    while !phase.stopped() {
        let number = s * 1_000_000 + n;
        n += 1;
        let payload = hex(usize::try_from(number).expect("small"));
        let body = raw_send(queue, &[("<correlation>failover</correlation>", &payload)], COMMIT);
        let key = uuid::Uuid::new_v4().to_string();
        lock(&ledger).attempted.insert(number);
        let give_up = Instant::now() + GIVE_UP;
        loop {
            let sent = Instant::now();
            let failure = match c.post(&body, &key).await {
                Ok(r) => match fault_code(&r) {
                    None => {
                        let mut l = lock(&ledger);
                        l.acked.insert(number);
                        l.commits.push((sent, Instant::now()));
                        break;
                    }
                    Some(f) => format!("send: fault {f}"),
                },
                Err(e) => format!("send: {e}"),
            };
            *lock(&ledger).failures.entry(failure).or_default() += 1;
            if Instant::now() >= give_up {
                lock(&ledger).given_up.insert(number);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One receive-and-commit of at most one message from the inbox (waiting up to `wait`
/// seconds), under a key and sent again with it until answered: how many it took.
async fn receive_one(c: &Client, wait: u64, ledger: &Shared) -> usize {
    let body = receive(INBOX, &format!("<wait_time>{wait}</wait_time>"), COMMIT);
    let key = uuid::Uuid::new_v4().to_string();
    let give_up = Instant::now() + GIVE_UP;
    loop {
        let failure = match c.post(&body, &key).await {
            Ok(r) => match fault_code(&r) {
                None => {
                    let got = numbers(&r);
                    lock(ledger).received.extend(&got);
                    return got.len();
                }
                Some(code::NO_MESSAGE) => return 0,
                Some(f) => format!("receive: fault {f}"),
            },
            Err(e) => format!("receive: {e}"),
        };
        *lock(ledger).failures.entry(failure).or_default() += 1;
        assert!(Instant::now() < give_up, "a receive was not answered within {GIVE_UP:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One of the drainers after the load: takes from the inbox until it is empty (at most 120 s).
async fn drain(c: Client, ledger: Shared) {
    let began = Instant::now();
    while receive_one(&c, 0, &ledger).await > 0 {
        assert!(began.elapsed() < Duration::from_secs(120), "the inbox was not drained within 120 s");
    }
}

/// The receiver: takes from the inbox until the load stops.
async fn receiver(c: Client, ledger: Shared, phase: Arc<Phase>) {
    use mail::Run;
    while !phase.stopped() {
        receive_one(&c, 1, &ledger).await;
    }
}

// ---------------------------------------------------------------- the outages

/// What `/readyz` answered during an outage: status and body (`None`: no answer), and
/// how long it took.
#[derive(Debug)]
struct Readyz {
    answer: Option<(u16, String)>,
    latency: Duration,
}

/// `/readyz` of the gateway on `port` while its database has no primary (from half a
/// second after the primary was killed, before a new leader is promoted): asked every
/// 100 ms until it says not ready, for at most 5 s. Each answer comes within the bound
/// `/readyz` keeps (500 ms; 1 s allowed on this loaded machine), and the outage is told:
/// 503. The first 503 (or the last answer) is returned, with its latency.
fn readyz_during_outage(port: u16) -> Readyz {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let t = Instant::now();
        let answer = http_get(port, "/readyz").map(|(status, body)| (status, body.trim().to_string()));
        let r = Readyz { answer, latency: t.elapsed() };
        assert!(r.answer.is_some() && r.latency < Duration::from_secs(1), "/readyz during an outage: {r:?}");
        if r.answer.as_ref().is_some_and(|(status, _)| *status == 503) || Instant::now() > until {
            assert_eq!(r.answer.as_ref().map(|a| a.0), Some(503), "/readyz told the outage within 5 s: {r:?}");
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One outage: what was done, when, and what followed.
struct Outage {
    what: String,
    at: Instant,
    /// From `at` until Patroni listed the new leader.
    new_leader_after: Duration,
    readyz: Option<Readyz>,
}

/// Kills the primary's postmaster `KILLS` times (each time once a synchronous standby
/// runs, after a moment of load, then waiting for the new leader), then switches over once;
/// then waits until the cluster is synchronous again. Each outage is counted in `phase`.
fn fail_over(cluster: &Cluster, gateway: u16, phase: &Phase) -> Vec<Outage> {
    let mut outages = Vec::new();
    for k in 1..=KILLS {
        let (leader, _) = cluster.wait_synchronous(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1500));
        let pid = cluster.postmaster(&leader);
        let ok = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("run kill").success();
        let at = Instant::now();
        phase.outages.fetch_add(1, Ordering::SeqCst);
        assert!(ok, "kill -KILL {pid} ({leader}'s postmaster)");
        // A commit the standby acknowledged in the moments before the walsender noticed
        // its postmaster gone still succeeds: look once the outage has settled in.
        std::thread::sleep(Duration::from_millis(500));
        let readyz = Some(readyz_during_outage(gateway));
        let new = cluster.wait_new_leader(&leader, Duration::from_secs(30));
        outages.push(Outage {
            what: format!("kill {k}: {leader}'s postmaster (pid {pid}) killed, {new} promoted"),
            at,
            new_leader_after: at.elapsed(),
            readyz,
        });
    }
    let (leader, standby) = cluster.wait_synchronous(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(1500));
    let at = Instant::now();
    phase.outages.fetch_add(1, Ordering::SeqCst);
    // patronictl exits 0 also when the switchover is refused: the new leader tells.
    let out = cluster.patronictl(&["switchover", "--leader", &leader, "--candidate", &standby, "--force"]);
    assert!(out.status.success(), "patronictl switchover: {}", String::from_utf8_lossy(&out.stderr));
    let new = cluster.wait_new_leader(&leader, Duration::from_secs(30));
    assert_eq!(new, standby, "the switchover's candidate leads: {}", String::from_utf8_lossy(&out.stdout));
    outages.push(Outage {
        what: format!("switchover: {leader} to {new}"),
        at,
        new_leader_after: at.elapsed(),
        readyz: None,
    });
    cluster.wait_synchronous(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(1500));
    outages
}

/// From `at` to the answer of the first acknowledged send that was sent after it.
fn first_commit_after(commits: &[(Instant, Instant)], at: Instant) -> Option<Duration> {
    commits.iter().filter(|(sent, _)| *sent >= at).map(|(_, answered)| *answered - at).min()
}

/// The longest time without an acknowledged send around an outage: between consecutive
/// answers from just before `o.at` until a few seconds after its new leader (for a planned
/// switchover, whose first commit after `at` may still go to the old primary).
fn longest_pause(commits: &[(Instant, Instant)], o: &Outage) -> Duration {
    let from = o.at.checked_sub(Duration::from_millis(500)).unwrap_or(o.at);
    let to = o.at + o.new_leader_after + Duration::from_secs(5);
    let mut answered: Vec<Instant> = commits.iter().map(|(_, a)| *a).filter(|a| (from..to).contains(a)).collect();
    answered.sort();
    answered.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

// ---------------------------------------------------------------- the topology

/// The demo topology with the local propagation job `relay` (SOURCE to INBOX), the queue
/// OUT_QUEUE and the outbound gateway job `to_rabbit` from it to RabbitMQ queue `qout`
/// (at least once: a copy published again after a doubt is marked x-aqgate-redelivered).
fn topology(qout: &str) -> PathBuf {
    demo_topology_with(
        "failover",
        &format!(
            r#"
[[propagations]]
name = "relay"
source = "{SOURCE}"
destination = "{INBOX}"
batch_size = 20
retry_backoff_ms = 200

[[queues]]
name = "{OUT_QUEUE}"
queue_table = "AQUSER.RAW_TAB"

[[gateway.links]]
name = "rabbit"
kind = "rabbitmq"
url = "amqp://127.0.0.1:5672/%2f"
username = "guest"
password_env = "AQGT_RABBIT_PASSWORD"

[[gateway.foreign_queues]]
name = "out"
link = "rabbit"
native_name = "{qout}"
create = true

[[gateway.jobs]]
name = "to_rabbit"
source = "{OUT_QUEUE}"
destination = "out@rabbit"
batch_size = 20
retry_backoff_ms = 200
"#
        ),
    )
}

// ---------------------------------------------------------------- the test

#[test]
fn patroni_failover_loses_and_duplicates_no_acknowledged_message() {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime").block_on(
        async {
            let t0 = Instant::now();
            let cluster = Arc::new(Cluster::start());
            let db = format!("postgres://postgres@127.0.0.1:{LB}/postgres");
            let qout = format!("aqgt.{}.failover", common::gateway::tag());
            let topology = topology(&qout);
            let (port, smtp) = (common::free_port(), common::free_port());
            let outbox = std::env::temp_dir().join(format!("{}.outbox", topology.display()));
            // The default session timeout (300 s): a job's batch whose rollback failed in an
            // outage is rolled back again by the job's next batch, not left to the timeout.
            let flags =
                ["--smtp-listen", &format!("127.0.0.1:{smtp}"), "--mail-outbox", outbox.to_str().expect("utf-8 path")];
            let gateway = common::gateway::serve_with("failover", &db, port, &topology, &flags);
            common::wait_port(smtp);
            let broker = rabbit().await;
            let (ledger, out): (Shared, Shared) = (Arc::default(), Arc::default());
            let mails: mail::Mails = Arc::default();
            let phase = Arc::new(Phase::default());
            let mut clients = tokio::task::JoinSet::new();
            for s in 0..SENDERS {
                clients.spawn(sender(Client::new(port), s, SOURCE, ledger.clone(), phase.clone()));
            }
            for s in 10..10 + GATEWAY_SENDERS {
                clients.spawn(sender(Client::new(port), s, OUT_QUEUE, out.clone(), phase.clone()));
            }
            for s in 0..SUBMITTERS {
                let request = move |n: u64| {
                    let id = hex(usize::try_from((20 + s) * 1_000_000 + n).expect("small"));
                    (id.clone(), raw_send(MAIL_QUEUE, &[("<correlation>mail</correlation>", &id)], COMMIT))
                };
                clients.spawn(mail::submitter(smtp, s, request, mails.clone(), phase.clone()));
            }
            clients.spawn(receiver(Client::new(port), ledger.clone(), phase.clone()));

            let (c, p) = (cluster.clone(), phase.clone());
            let outages = tokio::task::spawn_blocking(move || fail_over(&c, port, &p)).await.expect("the outages");
            phase.stop.store(true, Ordering::SeqCst);
            while let Some(r) = clients.join_next().await {
                r.expect("client task");
            }
            let load_secs = t0.elapsed().as_secs_f64();

            // Mails not answered 250 yet go again (the same bytes) until they are; then the
            // worker forwards what the spool holds.
            let after_load = Instant::now();
            mail::resubmit_pending(smtp, &mails, outages.len() as u64, Duration::from_secs(30)).await;
            let spool = mail::wait_spool(&db, Duration::from_secs(60), false).await;
            assert_eq!(spool.unforwarded, 0, "mails not forwarded after the load:\n{}", spool.listing);
            // The jobs move what is left in their sources.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let d = common::depths(&db);
                if d.get(SOURCE) == Some(&0) && d.get(OUT_QUEUE) == Some(&0) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the jobs did not move everything: {d:?}\n{:#}\nsessions: {:#}\nthe gateway's source: {}",
                    common::gateway::admin_json(&db, "jobs"),
                    common::gateway::admin_json(&db, "sessions"),
                    String::from_utf8_lossy(
                        &common::aqgate(&["admin", "messages", OUT_QUEUE, "--database", &db])
                            .output()
                            .expect("admin messages")
                            .stdout
                    )
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let settle_secs = after_load.elapsed().as_secs_f64();

            // The drains: the inbox, the mails' queue, and RabbitMQ's queue.
            let drained_at = Instant::now();
            let mail_drain = tokio::spawn(common::drain_payloads(port, MAIL_QUEUE));
            let mut drainers = tokio::task::JoinSet::new();
            for _ in 0..4 {
                drainers.spawn(drain(Client::new(port), ledger.clone()));
            }
            while let Some(r) = drainers.join_next().await {
                r.expect("drain task");
            }
            let mut performed = std::collections::HashMap::new();
            for p in mail_drain.await.expect("the mails' drain") {
                *performed.entry(p).or_insert(0u32) += 1;
            }
            let inbox_left = common::depth(&db, INBOX);
            let in_doubt =
                common::gateway::job(&common::gateway::admin_json(&db, "jobs"), "TO_RABBIT")["in_doubt"].clone();
            let at_broker = copies_of(rabbit_drain(&broker, &qout).await);
            let figures = Figures {
                mail: MailFigures::of(&mails, &performed),
                replies_owed: spool.replies_owed,
                out: OutFigures::of(&out, &at_broker),
                phases: format!(
                    "start and load {load_secs:.1}s, mails and jobs settled {settle_secs:.1}s, drain {:.1}s",
                    drained_at.elapsed().as_secs_f64()
                ),
            };
            report(&ledger, &outages, &figures);

            {
                let l = lock(&ledger);
                let distinct: BTreeSet<u64> = l.received.iter().copied().collect();
                let lost = l.acked.difference(&distinct).count();
                let duplicated = l.received.len() - distinct.len();
                let unexpected = distinct.difference(&l.attempted).count();
                assert!(l.acked.len() > 100, "too little load went through: {}", l.acked.len());
                assert_eq!((lost, duplicated, unexpected), (0, 0, 0), "lost, duplicated, unexpected");
                assert!(l.given_up.is_empty(), "sends never acknowledged: {:?}", l.given_up);
                assert_eq!(inbox_left, 0, "the inbox is empty after the drain");
            }

            let m = &figures.mail;
            assert!(m.mails > 10, "too few mails went through: {}", m.mails);
            assert_eq!((m.twice, m.lost, m.unexpected), (0, 0, 0), "mails performed twice, lost, unexpected");
            assert_eq!(m.never_accepted, 0, "mails never answered 250");

            let o = &figures.out;
            assert!(o.acked > 100, "too little went through the gateway job: {}", o.acked);
            assert_eq!((o.lost, o.unmarked, o.unexpected), (0, 0, 0), "gateway: lost, unmarked duplicates, unexpected");
            let given_up = lock(&out).given_up.clone();
            assert!(given_up.is_empty(), "gateway sends never acknowledged: {given_up:?}");
            assert_eq!(in_doubt, 0, "TO_RABBIT has nothing in doubt once its source is empty");

            drop(gateway);
            let _ = broker.queue_delete(qout.as_str().into(), Default::default()).await;
            let _ = std::fs::remove_file(topology);
            let _ = std::fs::remove_dir_all(outbox);
        },
    );
}

/// What the outbound gateway job's messages became at RabbitMQ.
struct OutFigures {
    attempted: usize,
    acked: usize,
    /// Messages at the broker (distinct), and copies beyond the first.
    at_broker: usize,
    duplicates: usize,
    /// Acknowledged to their sender and not at the broker.
    lost: usize,
    /// Copies beyond the first that do not carry x-aqgate-redelivered (a message may arrive
    /// once unmarked, then again marked after a doubt; never twice unmarked).
    unmarked: usize,
    /// At the broker, never sent.
    unexpected: usize,
    /// The senders' failed attempts, by what went wrong.
    failures: BTreeMap<String, u64>,
}

impl OutFigures {
    fn of(ledger: &Shared, copies: &common::gateway::Copies) -> Self {
        let l = lock(ledger);
        let sent = |set: &BTreeSet<u64>| -> BTreeSet<String> {
            set.iter().map(|n| hex(usize::try_from(*n).expect("small"))).collect()
        };
        let (attempted, acked) = (sent(&l.attempted), sent(&l.acked));
        Self {
            attempted: attempted.len(),
            acked: acked.len(),
            at_broker: copies.len(),
            duplicates: common::gateway::duplicates(copies),
            lost: acked.iter().filter(|p| !copies.contains_key(*p)).count(),
            unmarked: copies.values().map(|(n, marked)| (n - marked).saturating_sub(1)).sum(),
            unexpected: copies.keys().filter(|p| !attempted.contains(*p)).count(),
            failures: l.failures.clone(),
        }
    }
}

/// The figures of the mails and of the gateway job, and how long each phase took.
struct Figures {
    mail: MailFigures,
    /// Mails forwarded whose reply was still owed after the load (it goes out when the
    /// mail's claim ends: the reply is at least once, recorded after it went).
    replies_owed: usize,
    out: OutFigures,
    phases: String,
}

/// Prints the run's figures.
fn report(ledger: &Shared, outages: &[Outage], f: &Figures) {
    let l = lock(ledger);
    let distinct: BTreeSet<u64> = l.received.iter().copied().collect();
    println!(
        "failover: attempted={} acknowledged={} received={} distinct={} lost={} duplicated={} unexpected={} given_up={} \
         ({})",
        l.attempted.len(),
        l.acked.len(),
        l.received.len(),
        distinct.len(),
        l.acked.difference(&distinct).count(),
        l.received.len() - distinct.len(),
        distinct.difference(&l.attempted).count(),
        l.given_up.len(),
        f.phases,
    );
    let m = &f.mail;
    println!(
        "failover: mails={} accepted={} (after the load {}) performed={} twice={} lost={} unexpected={} \
         never_accepted={} | submissions={} retried after a 4xx or no reply={} answered \"already have\"={} \
         replies still owed={}",
        m.mails,
        m.accepted_during_load + m.accepted_after_load,
        m.accepted_after_load,
        m.performed,
        m.twice,
        m.lost,
        m.unexpected,
        m.never_accepted,
        m.submissions,
        m.retried,
        m.dedupe_hits,
        f.replies_owed,
    );
    for story in &m.stories {
        println!("failover:   mail {story}");
    }
    let o = &f.out;
    println!(
        "failover: gateway TO_RABBIT attempted={} acknowledged={} at the broker={} lost={} duplicates={} \
         (marked x-aqgate-redelivered: {}, unmarked: {}) unexpected={}",
        o.attempted,
        o.acked,
        o.at_broker,
        o.lost,
        o.duplicates,
        o.duplicates - o.unmarked,
        o.unmarked,
        o.unexpected,
    );
    for o in outages {
        let first =
            first_commit_after(&l.commits, o.at).map_or("none".to_string(), |d| format!("{:.2}s", d.as_secs_f64()));
        let readyz = o.readyz.as_ref().map_or(String::new(), |r| {
            let said = r.answer.as_ref().map_or("no answer".to_string(), |(s, b)| format!("{s} {b:?}"));
            format!(", /readyz during the outage: {said} in {} ms", r.latency.as_millis())
        });
        println!(
            "failover:   {}: new leader after {:.2}s, first commit after {first}, no commit for {:.2}s{readyz}",
            o.what,
            o.new_leader_after.as_secs_f64(),
            longest_pause(&l.commits, o).as_secs_f64()
        );
    }
    println!("failover:   failed attempts (retried with the same key): {:?}", l.failures);
    println!("failover:   failed attempts to the gateway job's source: {:?}", f.out.failures);
}
