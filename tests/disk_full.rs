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
use common::*;

/// A tmpfs of `mb` MiB mounted on a new directory; unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(tag: &str, mb: u32) -> Self {
        let dir = std::env::temp_dir().join(format!("aqgate-test-full-{tag}-{}", std::process::id()));
        let _ = Command::new("umount").arg("-l").arg(&dir).status();
        std::fs::create_dir_all(&dir).expect("mount point");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m,mode=0777"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "mounting a {mb} MiB tmpfs on {} failed: the disk-full tests need root (as CI runs them)",
            dir.display()
        );
        Self { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes `dir/filler` until the filesystem has no space left; its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).expect("filler");
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling {}: {e}", p.display()),
        }
    }
    // The last partial pages too.
    let small = [0u8; 512];
    while let Ok(n) = f.write(&small) {
        if n == 0 {
            break;
        }
    }
    let _ = f.sync_all();
    p
}

/// 20 KB of RAW whose first eight hex digits are `n`.
fn payload(n: usize) -> String {
    let mut s = format!("{n:08X}");
    s.push_str(&"AB".repeat(10_000 - 4));
    s
}

#[derive(Default)]
struct Ledger {
    acked: BTreeSet<usize>,
    refused: BTreeSet<usize>,
    /// Fault codes other than 1653, with their messages.
    other: Vec<(i32, String)>,
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
                ledger.lock().expect("ledger").other.push((i32::from(st), format!("HTTP {st}: {t}")));
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
            Some(Response::Fault(f)) => l.other.push((f.code, f.message)),
            Some(other) => l.other.push((-1, format!("{other:?}"))),
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
async fn full_disk_under_load(db: &str, fs: &Tmpfs, crash_expected: bool, restart_db: impl Fn()) {
    let port = free_port();
    let mut server = serve(db, port);
    let stop = Arc::new(AtomicBool::new(false));
    let freed = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let senders: Vec<_> =
        (0..4).map(|w| tokio::spawn(sender(port, w, stop.clone(), freed.clone(), ledger.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!ledger.lock().expect("ledger").acked.is_empty(), "sends succeed before the disk fills");

    let filler = fill(&fs.dir);
    // Refusals, readiness and the metric while the disk stays full.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut saw_not_ready, mut saw_metric) = (false, false);
    while ledger.lock().expect("ledger").refused.len() < 20 || !saw_not_ready || !saw_metric {
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
            assert!(body.contains("full"), "/readyz says why: {body}");
            saw_not_ready = true;
        }
        if !saw_metric {
            saw_metric = tokio::task::spawn_blocking(move || {
                http_get(port, "/metrics").is_some_and(|(_, t)| t.contains("\naqgate_store_writes_refused 1\n"))
            })
            .await
            .expect("metrics");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
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
    assert_eq!(metric(port, "aqgate_store_writes_refused"), 0, "no longer refusing");
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
    let refusals = metric(port, "aqgate_store_full_refusals_total");
    assert!(refusals > 0, "refused writes counted: {refusals}");
    server.signal("-TERM");
    assert!(server.wait_exit(Duration::from_secs(30)).success(), "a clean stop");
    assert!(server.log().contains("disk is full"), "the log says when writes start failing");
    assert!(server.log().contains("writes again"), "and when they succeed again");

    let stored: BTreeSet<usize> = stored_numbers(db).await.into_iter().collect();
    let l = ledger.lock().expect("ledger");
    let lost: Vec<_> = l.acked.difference(&stored).take(10).collect();
    let refused_but_stored: Vec<_> = l.refused.intersection(&stored).take(10).collect();
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
        for (c, m) in &l.other {
            assert!(*c != 600 || m.contains("may or may not"), "a fault during the crash says what happened: {c} {m}");
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
    full_disk_under_load(&db, &fs, false, || {}).await;
}
