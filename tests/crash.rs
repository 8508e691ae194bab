//! The kill -9 checker: the real binary under load is killed with SIGKILL at random moments
//! (at least 20 times per run, 0.3–1.5 s apart) and restarted at once on the same database
//! and port, while clients keep going through the restarts. Every payload sent is
//! classified by what its producer was told (see `crash/load.rs`), everything consumed is
//! counted, the queue is drained at the end, and the figures must show nothing lost,
//! nothing duplicated and nothing delivered that was refused or never sent.
//!
//! Variants: HTTP on SQLite, HTTP on PostgreSQL, signed mail over SMTP, three
//! `aqgate serve` nodes on one PostgreSQL database behind HAProxy (round-robin, no sticky
//! sessions), one node killed at a time, and a propagation pair (two aqgates, a job from one
//! to the other over HTTP), either killed. `AQGATE_CRASH_SEED=N` replays a kill schedule and
//! the clients' choices (the timing of a run is never the same). The variants run one at a
//! time, whatever `--test-threads` says: each wants the machine for itself.

mod common;
#[path = "crash/load.rs"]
mod load;
#[path = "crash/procs.rs"]
mod procs;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::signed_mail::{self as mail, MailFigures};
use load::{Client, Figures, Ledger, QUEUE, Shared};
use procs::{Clock, Haproxy, Node, SESSION_TIMEOUT_SECS};

const MIN_KILLS: u64 = 20;
const MIN_LOAD: Duration = Duration::from_secs(40);
const MAX_LOAD: Duration = Duration::from_secs(55);
const PRODUCERS: usize = 3;
const CONSUMERS: usize = 2;

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs one variant on its own two-thread runtime, after the variants before it.
fn run<F: std::future::Future<Output = ()>>(f: F) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime").block_on(f);
}

fn seed() -> u64 {
    std::env::var("AQGATE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

fn serve_flags(no_smtp: bool) -> Vec<String> {
    let mut v = vec!["--no-notify".to_string()];
    if no_smtp {
        v.push("--no-smtp".into());
    }
    v
}

/// Where the load goes: producers send to `produce`, consumers receive from `consume` (the
/// same port, or the two ends of a propagation job). `upstream`: databases whose queue must
/// have emptied (propagated) before the drain of `db`, the consumers' database.
struct Ends<'a> {
    produce: u16,
    consume: u16,
    db: &'a str,
    upstream: &'a [&'a str],
}

/// Producers and consumers over HTTP while `nodes` are killed; then the drain and the
/// figures.
async fn http_run(variant: &str, mut nodes: Vec<Node>, ends: Ends<'_>, proxy: Option<Haproxy>) {
    let Ends { produce, consume, db, upstream } = ends;
    let t0 = Instant::now();
    let seed = seed();
    let tag = variant.replace(' ', "-");
    nodes[0].start();
    for n in nodes.iter_mut().skip(1) {
        n.start();
    }
    let logs: Vec<String> = nodes.iter().map(|n| n.log_path().display().to_string()).collect();
    let proxy = proxy.map(|p| p.start_after_nodes());
    let ledger: Shared = Arc::new(Mutex::new(Ledger::default()));
    let client = Client::new(consume);
    let honoured = load::probe_idempotency(&client, &tag, &ledger).await;

    let clock = Arc::new(Clock::default());
    let killer = procs::killer(nodes, clock.clone(), seed, MIN_KILLS, MIN_LOAD, MAX_LOAD);
    let mut clients = tokio::task::JoinSet::new();
    for p in 0..PRODUCERS {
        let s = seed.wrapping_add(1 + p as u64);
        clients.spawn(load::producer(Client::new(produce), p, tag.clone(), s, honoured, ledger.clone(), clock.clone()));
    }
    for c in 0..CONSUMERS {
        let s = seed.wrapping_add(100 + c as u64);
        clients.spawn(load::consumer(Client::new(consume), c, s, honoured, ledger.clone(), clock.clone()));
    }
    let report = tokio::task::spawn_blocking(move || killer.finish()).await.expect("the killer");
    let load_secs = t0.elapsed().as_secs_f64();
    let finishing = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(r) = clients.join_next().await {
            r.expect("client task");
        }
    });
    finishing.await.expect("the clients finished their last transactions");
    // Sessions opened by answers lost in the kills hold their work until they time out.
    let not_before = Instant::now() + Duration::from_secs(SESSION_TIMEOUT_SECS + 2);
    for up in upstream {
        let deadline = Instant::now() + Duration::from_secs(120);
        while procs::depth(up, QUEUE) > 0 {
            assert!(Instant::now() < deadline, "{variant}: {up} did not propagate its queue");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    load::drain(&client, &ledger, not_before, Duration::from_secs(40)).await;
    let depth = procs::depth(db, QUEUE);
    let f = Figures::of(&ledger);
    println!(
        "crash[{variant}]: sent_confirmed={} refused={} indeterminate={} consumed={} lost={} duplicated={} unexpected={} \
         | abandoned={} drained={} unseen_confirmed={} {} depth_after_drain={depth} kills={} (while starting: {}) \
         idempotency_key={} load={load_secs:.1}s total={:.1}s seed={seed}",
        f.sent_confirmed,
        f.refused,
        f.indeterminate,
        f.consumed,
        f.lost,
        f.duplicated,
        f.unexpected,
        f.abandoned,
        f.drained,
        f.unseen_confirmed,
        Figures::extras(&ledger),
        report.kills,
        report.kills_while_starting,
        if honoured { "honoured" } else { "ignored" },
        t0.elapsed().as_secs_f64(),
    );
    for line in &f.report {
        println!("crash[{variant}]:   {line}");
    }
    drop(proxy);
    drop(report.nodes);
    assert!(report.kills >= MIN_KILLS, "only {} kills", report.kills);
    assert!(f.sent_confirmed > 0 && f.consumed > 0, "no load went through");
    assert_eq!(
        (f.lost, f.duplicated, f.unexpected),
        (0, 0, 0),
        "{variant}: lost, duplicated, unexpected (server logs: {logs:?})"
    );
    assert_eq!(depth, 0, "{variant}: the queue is not empty after the drain");
    for up in upstream {
        assert_eq!(procs::depth(up, QUEUE), 0, "{variant}: {up} holds messages after the drain");
    }
}

/// HTTP clients against one node on a fresh SQLite file.
#[test]
fn kill9_checker_http_on_sqlite_loses_and_duplicates_nothing() {
    run(async {
        let dir = procs::scratch("sqlite");
        let db = common::fresh_sqlite_url();
        let port = common::free_port();
        let node = Node::new("node", &dir, &db, port, &serve_flags(true));
        http_run("http sqlite", vec![node], Ends { produce: port, consume: port, db: &db, upstream: &[] }, None).await;
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// HTTP clients against one node on a fresh PostgreSQL database.
#[test]
fn kill9_checker_http_on_postgres_loses_and_duplicates_nothing() {
    run(async {
        let dir = procs::scratch("pg");
        let db = common::fresh_pg_url().await;
        let port = common::free_port();
        let node = Node::new("node", &dir, &db, port, &serve_flags(true));
        http_run("http postgres", vec![node], Ends { produce: port, consume: port, db: &db, upstream: &[] }, None)
            .await;
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// Three nodes on one PostgreSQL database behind HAProxy (round-robin, no stickiness: a
/// session's requests land on any node); one node at a time is killed and restarted.
#[test]
fn kill9_checker_one_of_three_nodes_behind_haproxy_loses_and_duplicates_nothing() {
    run(async {
        let dir = procs::scratch("multi");
        let db = common::fresh_pg_url().await;
        let ports: Vec<u16> = (0..3).map(|_| common::free_port()).collect();
        let nodes: Vec<Node> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| Node::new(&format!("node{}", i + 1), &dir, &db, *p, &serve_flags(true)))
            .collect();
        let lb = common::free_port();
        let proxy = Haproxy::prepare(&dir, lb, &ports);
        let ends = Ends { produce: lb, consume: lb, db: &db, upstream: &[] };
        http_run("3 nodes haproxy postgres", nodes, ends, Some(proxy)).await;
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// A propagation pair: producers send to A (SQLite), whose job moves each message to B
/// (PostgreSQL) over HTTP under its idempotency key, and consumers receive from B; either
/// node is killed. Every confirmed message is consumed once at B, none is left at A.
#[test]
fn kill9_checker_a_propagation_pair_loses_and_duplicates_nothing() {
    run(async {
        let dir = procs::scratch("pair");
        let (a_db, b_db) = (common::fresh_sqlite_url(), common::fresh_pg_url().await);
        let (a_port, b_port) = (common::free_port(), common::free_port());
        let password = dir.join("b-password");
        std::fs::write(&password, "tiger").expect("write the password file");
        let topology = dir.join("a-topology.toml");
        let demo = std::fs::read_to_string(format!("{}/config/topology.toml", procs::ROOT)).expect("demo topology");
        std::fs::write(
            &topology,
            format!(
                r#"{demo}
[[propagations]]
name = "pair"
source = "{QUEUE}"
destination = "{QUEUE}"
concurrency = 4
retry_backoff_ms = 100
remote = {{ url = "http://127.0.0.1:{b_port}/aqserv", agent = "scott", password_file = "{}" }}
"#,
                password.display()
            ),
        )
        .expect("write A's topology");
        let mut a_flags = serve_flags(true);
        a_flags.extend(["--topology".to_string(), topology.display().to_string()]);
        let a = Node::new("a", &dir, &a_db, a_port, &a_flags);
        let b = Node::new("b", &dir, &b_db, b_port, &serve_flags(true));
        let ends = Ends { produce: a_port, consume: b_port, db: &b_db, upstream: &[&a_db] };
        http_run("propagation pair sqlite to postgres", vec![a, b], ends, None).await;
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// Signed mails over SMTP while the server (SMTP filter, forwarding worker and servlet in
/// one process, on SQLite) is killed: each mail answered 250 is performed exactly once;
/// mails not answered 250 are submitted again after the load, until they are.
#[test]
fn kill9_checker_signed_mail_is_performed_exactly_once() {
    run(async {
        let t0 = Instant::now();
        let seed = seed();
        let dir = procs::scratch("mail");
        let db = common::fresh_sqlite_url();
        let (hp, sp) = (common::free_port(), common::free_port());
        let outbox = dir.join("outbox");
        let mut flags = serve_flags(false);
        flags.extend(
            ["--smtp-listen", &format!("127.0.0.1:{sp}"), "--mail-outbox", outbox.to_str().expect("utf-8 path")]
                .map(String::from),
        );
        let mut node = Node::new("node", &dir, &db, hp, &flags);
        node.start();
        common::wait_port(sp);
        let log = node.log_path().display().to_string();

        let mails: mail::Mails = Arc::new(Mutex::new(Vec::new()));
        let clock = Arc::new(Clock::default());
        let killer = procs::killer(vec![node], clock.clone(), seed, MIN_KILLS, MIN_LOAD, MAX_LOAD);
        let mut submitters = tokio::task::JoinSet::new();
        for s in 0..PRODUCERS {
            let sd = seed.wrapping_add(1 + s as u64);
            let request = move |n: u64| {
                let id = format!("mail-s{s}-{n:06}");
                let idap = load::send_xml(std::slice::from_ref(&id), true);
                (id, idap)
            };
            submitters.spawn(mail::submitter(sp, sd, request, mails.clone(), clock.clone()));
        }
        let report = tokio::task::spawn_blocking(move || killer.finish()).await.expect("the killer");
        let load_secs = t0.elapsed().as_secs_f64();
        while let Some(r) = submitters.join_next().await {
            r.expect("submitter task");
        }
        common::wait_port(sp);
        // Every mail not answered 250 yet is submitted again until it is.
        mail::resubmit_pending(sp, &mails, clock.generation(), Duration::from_secs(20)).await;
        // The worker forwards after the 250: wait (bounded) until the spool is worked off.
        let spool = mail::wait_spool(&db, Duration::from_secs(30), true).await;
        let spool_empty = spool.empty();

        let ledger: Shared = Arc::new(Mutex::new(Ledger::default()));
        let client = Client::new(hp);
        load::drain(&client, &ledger, Instant::now(), Duration::from_secs(30)).await;
        let depth = procs::depth(&db, QUEUE);
        let replies = std::fs::read_dir(&outbox)
            .map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect::<Vec<_>>())
            .unwrap_or_default();
        let reply_faults = replies.iter().filter(|r| r.contains("Fault")).count();

        let f = MailFigures::of(&mails, &ledger.lock().unwrap_or_else(|e| e.into_inner()).consumed);
        println!(
            "crash[mail sqlite]: mails={} accepted_during_load={} accepted_after_load={} performed={} \
             performed_twice={} lost={} unexpected={} | submissions={} retried={} dedupe_hits={} never_accepted={} \
             replies={} reply_faults={reply_faults} spool_empty={spool_empty} depth_after_drain={depth} kills={} \
             (while starting: {}) load={load_secs:.1}s total={:.1}s seed={seed}",
            f.mails,
            f.accepted_during_load,
            f.accepted_after_load,
            f.performed,
            f.twice,
            f.lost,
            f.unexpected,
            f.submissions,
            f.retried,
            f.dedupe_hits,
            f.never_accepted,
            replies.len(),
            report.kills,
            report.kills_while_starting,
            t0.elapsed().as_secs_f64(),
        );
        for story in &f.stories {
            println!("crash[mail sqlite]:   {story}");
        }
        if !spool_empty {
            println!("crash[mail sqlite]:   spool not worked off:\n{}", spool.listing);
        }
        for r in replies.iter().filter(|r| r.contains("Fault")).take(3) {
            let fault = r.lines().filter(|l| l.contains("Fault") || l.contains("error")).collect::<Vec<_>>().join(" ");
            println!("crash[mail sqlite]:   a reply carried a Fault: {fault}");
        }
        drop(report.nodes);
        assert!(report.kills >= MIN_KILLS, "only {} kills", report.kills);
        assert!(f.mails > 0, "no mail went through");
        assert_eq!((f.twice, f.lost, f.unexpected), (0, 0, 0), "performed twice, lost, unexpected ({log})");
        assert_eq!(f.never_accepted, 0);
        let _ = std::fs::remove_dir_all(dir);
    });
}
