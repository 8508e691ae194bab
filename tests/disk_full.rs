//! A full disk under load, through the real binary: the database's filesystem is a small
//! tmpfs (the suite runs as root) that a filler file fills while four clients send 20 KB
//! messages, each committed in its request. While the disk is full, every send is refused
//! with fault 1653 (never answered 0, never the generic 600), `/readyz` says "store full"
//! and `/metrics` counts it; once the filler goes, sends succeed again without a restart;
//! and after a clean stop every acknowledged message is in the queue and no refused one is.
//! On SQLite and on a private PostgreSQL whose whole data directory (WAL included) sits on
//! the tmpfs, so that PostgreSQL also meets the full disk in its own WAL (a PANIC and its
//! own crash and restart).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::Response;
use common::tmpfs::{Tmpfs, fill};
use common::*;

/// 20 KB of RAW whose first eight hex digits are `n`; the rest pseudo-random, so that
/// neither SQLite nor PostgreSQL's TOAST compression shrinks it.
fn payload(n: usize) -> String {
    use std::fmt::Write;
    let mut s = format!("{n:08X}");
    let mut x = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while s.len() < 20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let _ = write!(s, "{x:016X}");
    }
    s.truncate(20_000);
    s
}

#[derive(Default)]
struct Ledger {
    acked: BTreeSet<usize>,
    refused: BTreeSet<usize>,
    /// Answers other than status 0 and fault 1653: the message's number, the fault code
    /// (or HTTP status), the text.
    other: Vec<(usize, i32, String)>,
    /// Sends whose outcome the client cannot know (no answer).
    unknown: BTreeSet<usize>,
    /// Acknowledged after the disk was filled, and after it was freed again.
    acked_after_free: usize,
}

/// Sends numbered messages (`worker`, `worker + 4`, …), each with a commit, until `stop`.
async fn sender(port: u16, worker: usize, stop: Arc<AtomicBool>, freed: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let mut n = worker;
    while !stop.load(Ordering::SeqCst) {
        let p = payload(n);
        let body = raw_send("AQUSER.RAW_QUE", &[("", p.as_str())], COMMIT);
        let after_free = freed.load(Ordering::SeqCst);
        let answer = idap_request(&client, &aqserv(port), SCOTT, body).send().await;
        let text = match answer {
            Ok(r) if r.status().as_u16() == 200 => r.text().await.ok(),
            Ok(r) => {
                let st = r.status().as_u16();
                let t = r.text().await.unwrap_or_default();
                ledger.lock().expect("ledger").other.push((n, i32::from(st), format!("HTTP {st}: {t}")));
                None
            }
            Err(_) => None,
        };
        let mut l = ledger.lock().expect("ledger");
        match text.as_deref().map(|t| parse_idap(t.as_bytes())) {
            Some(Response::Send(..)) => {
                l.acked.insert(n);
                if after_free {
                    l.acked_after_free += 1;
                }
            }
            Some(Response::Fault(f)) if f.code == code::STORE_FULL => {
                l.refused.insert(n);
            }
            Some(Response::Fault(f)) => l.other.push((n, f.code, f.message)),
            Some(other) => l.other.push((n, -1, format!("{other:?}"))),
            None => {
                l.unknown.insert(n);
            }
        }
        drop(l);
        n += 4;
    }
}

fn serve(db: &str, port: u16) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(
        "aqgate serve (disk full)",
        &mut aqgate(&["serve", "--no-smtp", "--no-notify", "--listen", &listen, "--database", db]),
    );
    p.wait_ready(port, Duration::from_secs(60));
    p
}

/// The numbers of the messages in AQUSER.RAW_QUE, read through a fresh server.
async fn stored_numbers(db: &str) -> Vec<usize> {
    let port = free_port();
    let _p = serve(db, port);
    let got = drain_payloads(port, "AQUSER.RAW_QUE").await;
    got.iter().map(|p| usize::from_str_radix(&p[..8], 16).expect("numbered payload")).collect()
}

/// The load, the full disk, the freed disk, the stop: what every test here checks.
/// `restart_db` is called after the filler is removed (PostgreSQL may have stopped).
async fn full_disk_under_load(db: &str, full: &Path, crash_expected: bool, restart_db: impl Fn()) {
    let port = free_port();
    let mut server = serve(db, port);
    let stop = Arc::new(AtomicBool::new(false));
    let freed = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let senders: Vec<_> =
        (0..4).map(|w| tokio::spawn(sender(port, w, stop.clone(), freed.clone(), ledger.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!ledger.lock().expect("ledger").acked.is_empty(), "sends succeed before the disk fills");

    let filler = fill(full);
    // Refusals, readiness and the metric while the disk stays full.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut saw_not_ready, mut saw_metric) = (false, false);
    // PostgreSQL whose WAL meets the full disk crashes rather than refusing: its clients see
    // connections cut, not "disk full".
    let failures =
        |l: &Ledger| if crash_expected { l.refused.len() + l.other.len() + l.unknown.len() } else { l.refused.len() };
    saw_metric |= crash_expected;
    let enough = if crash_expected { 1 } else { 20 };
    while failures(&ledger.lock().expect("ledger")) < enough || !saw_not_ready || !saw_metric {
        if Instant::now() >= deadline {
            let l = ledger.lock().expect("ledger");
            panic!(
                "a full disk not reported within 60 s: refused {}, /readyz 503 seen {saw_not_ready}, metric seen {saw_metric}; other faults: {:?}",
                l.refused.len(),
                l.other.iter().take(5).collect::<Vec<_>>()
            );
        }
        if let Some((503, body)) = tokio::task::spawn_blocking(move || http_get(port, "/readyz")).await.expect("readyz")
        {
            assert!(body.contains("full") || crash_expected, "/readyz says why: {body}");
            saw_not_ready = true;
        }
        if !saw_metric {
            saw_metric = tokio::task::spawn_blocking(move || {
                http_get(port, "/metrics").is_some_and(|(_, t)| t.contains("\naqgate_database_writes_refused 1\n"))
            })
            .await
            .expect("metrics");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if crash_expected {
        // Long enough for PostgreSQL's crash, its restart and whatever its recovery meets.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let refused_while_full = ledger.lock().expect("ledger").refused.len();

    // The load stops (it would fill the small disk again), space is freed, and the server
    // finds out by itself (no restart): ready again, and sends succeed.
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.await.expect("sender");
    }
    std::fs::remove_file(&filler).expect("remove the filler");
    restart_db();
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::task::spawn_blocking(move || http_get(port, "/readyz")).await.expect("readyz").map(|(st, _)| st)
        != Some(200)
    {
        assert!(Instant::now() < deadline, "/readyz not ready within 60 s of freeing space");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(port, "aqgate_database_writes_refused"), 0, "no longer refusing");
    freed.store(true, Ordering::SeqCst);
    stop.store(false, Ordering::SeqCst);
    let senders: Vec<_> = (0..4)
        .map(|w| tokio::spawn(sender(port, 1_000_000 + w, stop.clone(), freed.clone(), ledger.clone())))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ledger.lock().expect("ledger").acked_after_free < 20 {
        assert!(Instant::now() < deadline, "sends did not succeed again within 60 s of freeing space");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.await.expect("sender");
    }
    let refusals = metric(port, "aqgate_database_full_refusals_total");
    assert!(refusals > 0, "refused writes counted: {refusals}");
    server.signal("-TERM");
    assert!(server.wait_exit(Duration::from_secs(30)).success(), "a clean stop");
    assert!(server.log().contains("disk is full"), "the log says when writes start failing");
    assert!(server.log().contains("writes again"), "and when they succeed again");

    let stored: BTreeSet<usize> = stored_numbers(db).await.into_iter().collect();
    let l = ledger.lock().expect("ledger");
    let lost: Vec<_> = l.acked.difference(&stored).take(10).collect();
    let refused_but_stored: Vec<_> = l.refused.intersection(&stored).take(10).collect();
    // Faults that say the request was not performed must be true.
    let not_performed_but_stored: Vec<_> = l
        .other
        .iter()
        .filter(|(n, _, m)| m.contains("not performed") && !m.contains("may or may not") && stored.contains(n))
        .take(10)
        .collect();
    assert!(not_performed_but_stored.is_empty(), "answered 'not performed', yet stored: {not_performed_but_stored:?}");
    eprintln!(
        "disk full: {} acknowledged, {} refused with 1653 ({} while full), {} other faults, {} unanswered; {} stored",
        l.acked.len(),
        l.refused.len(),
        refused_while_full,
        l.other.len(),
        l.unknown.len(),
        stored.len()
    );
    assert!(lost.is_empty(), "acknowledged but not stored: {lost:?} (of {})", l.acked.len());
    assert!(refused_but_stored.is_empty(), "refused as not performed, yet stored: {refused_but_stored:?}");
    if crash_expected {
        // PostgreSQL's own crash and restart: requests cut off by it may or may not have
        // been performed, and say so; none is answered 0 unless stored (checked above).
        for (_, c, m) in &l.other {
            assert!(
                [code::INTERNAL, code::STORE_FULL, 503].contains(c),
                "a fault during the crash is a store fault: {c} {m}"
            );
        }
    } else {
        assert!(l.other.is_empty(), "every refusal is fault 1653: {:?}", l.other.iter().take(5).collect::<Vec<_>>());
        assert!(l.unknown.is_empty(), "every send answered: {} unanswered", l.unknown.len());
        let stray: Vec<_> = stored.iter().filter(|n| !l.acked.contains(n)).take(10).collect();
        assert!(stray.is_empty(), "stored but never acknowledged: {stray:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_full_disk_refuses_loses_nothing_and_recovers() {
    let fs = Tmpfs::mount("sqlite", 24);
    let db = format!("sqlite://{}", fs.dir.join("aq.db").display());
    full_disk_under_load(&db, &fs.dir, false, || {}).await;
}

/// A private PostgreSQL cluster whose data directory (WAL included) is `dir`, on `port`,
/// run as the `postgres` user; stopped when dropped.
struct PrivatePg {
    dir: PathBuf,
    log: PathBuf,
    port: u16,
}

fn pg_bin(name: &str) -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<_> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("PostgreSQL's binaries in {} (scripts/ensure-postgres.sh): {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    versions.sort();
    versions.last().expect("a PostgreSQL version").join("bin").join(name)
}

fn as_postgres(args: &[&str]) -> std::process::Output {
    Command::new("runuser").args(["-u", "postgres", "--"]).args(args).output().expect("runuser")
}

impl PrivatePg {
    fn init(dir: PathBuf, wal: Option<PathBuf>, port: u16) -> Self {
        let log = std::env::temp_dir().join(format!("aqgate-test-full-pg-{port}.log"));
        let _ = std::fs::remove_file(&log);
        std::fs::write(&log, "").expect("pg log");
        let st = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .arg(&log)
            .args(wal.iter())
            .status()
            .expect("chown");
        assert!(st.success(), "chown the cluster's directory to postgres");
        let data = dir.to_str().expect("utf-8");
        // Small WAL segments, so that the WAL too meets the full disk.
        let initdb = pg_bin("initdb");
        let mut args = vec![
            initdb.to_str().expect("utf-8"),
            "-D",
            data,
            "-U",
            "postgres",
            "--auth=trust",
            "--wal-segsize=1",
            "--no-sync",
        ];
        let waldir = wal.as_ref().map(|w| format!("--waldir={}", w.display()));
        args.extend(waldir.as_deref());
        let out = as_postgres(&args);
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let pg = Self { dir, log, port };
        pg.start();
        pg
    }

    fn running(&self) -> bool {
        as_postgres(&[pg_bin("pg_ctl").to_str().expect("utf-8"), "-D", self.dir.to_str().expect("utf-8"), "status"])
            .status
            .success()
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c max_wal_size=32MB -c min_wal_size=2MB -c shared_buffers=8MB",
            self.port
        );
        let out = as_postgres(&[
            pg_bin("pg_ctl").to_str().expect("utf-8"),
            "-D",
            self.dir.to_str().expect("utf-8"),
            "-l",
            self.log.to_str().expect("utf-8"),
            "-o",
            &opts,
            "-w",
            "-t",
            "60",
            "start",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = as_postgres(&[
            pg_bin("pg_ctl").to_str().unwrap_or("pg_ctl"),
            "-D",
            self.dir.to_str().unwrap_or("."),
            "-m",
            "immediate",
            "stop",
        ]);
        if std::thread::panicking() {
            eprintln!(
                "PostgreSQL's log {}:\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_full_data_disk_refuses_loses_nothing_and_recovers() {
    let fs = Tmpfs::mount("pg-data", 96);
    let data = fs.dir.join("data");
    std::fs::create_dir(&data).expect("data directory");
    let pg = PrivatePg::init(data, None, free_port());
    full_disk_under_load(&pg.url(), &fs.dir, false, || {}).await;
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_full_wal_disk_crashes_postgres_loses_nothing_and_recovers() {
    let fs = Tmpfs::mount("pg-d", 96);
    let wal_fs = Tmpfs::mount("pg-wal", 16);
    let data = fs.dir.join("data");
    std::fs::create_dir(&data).expect("data directory");
    let wal = wal_fs.dir.join("wal");
    std::fs::create_dir(&wal).expect("WAL directory");
    let pg = PrivatePg::init(data, Some(wal), free_port());
    // A WAL that cannot grow is a PANIC: every backend ends and the postmaster restarts
    // (or stops, if its recovery finds no space either). Once space is back it runs again,
    // as an operator's supervisor would see to.
    full_disk_under_load(&pg.url(), &wal_fs.dir, true, || {
        if !pg.running() {
            pg.start();
        }
    })
    .await;
    drop(pg);
}
