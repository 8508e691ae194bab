//! The console scenario: `--clients` clients fetch each of `--pages` in turn for
//! `--seconds`, as an agent logged in with Basic; per page its p50, p99 and slowest answer
//! and its size. Every answer but 200 counts as a fault.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::{Args, Client, percentile};

/// Per page: the latencies in µs of its 200 answers, the faults, the last answer's size.
type PageRuns = BTreeMap<String, (Vec<u64>, u64, usize)>;

pub(crate) async fn pages_bench(args: &Args) -> anyhow::Result<()> {
    let pages: Vec<String> = args.pages.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
    anyhow::ensure!(!pages.is_empty(), "--pages names no page");
    let pages = Arc::new(pages);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let c = Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref())?;
        tasks.push(tokio::spawn(page_client(c, pages.clone(), stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = PageRuns::new();
    for t in tasks {
        for (page, (lat, faults, size)) in t.await?? {
            let e = all.entry(page).or_default();
            e.0.extend(lat);
            e.1 += faults;
            e.2 = e.2.max(size);
        }
    }
    for (page, (mut lat, faults, size)) in all {
        lat.sort_unstable();
        println!(
            "scenario=Pages page={page} clients={} requests={} faults={faults} bytes={size} p50={:.2}ms p99={:.2}ms max={:.2}ms",
            args.clients,
            lat.len(),
            percentile(&lat, 0.50).as_secs_f64() * 1000.0,
            percentile(&lat, 0.99).as_secs_f64() * 1000.0,
            percentile(&lat, 1.0).as_secs_f64() * 1000.0,
        );
    }
    Ok(())
}

/// One client: every page in turn until `stop` (the first round unmeasured: the password
/// check and the first query plans).
async fn page_client(mut c: Client, pages: Arc<Vec<String>>, stop: Arc<AtomicBool>) -> anyhow::Result<PageRuns> {
    for p in pages.iter() {
        let (status, body) = c.get_status(p).await?;
        anyhow::ensure!(status == 200, "GET {p}: HTTP {status}: {}", body.chars().take(300).collect::<String>());
    }
    let mut runs = PageRuns::new();
    while !stop.load(Ordering::Relaxed) {
        for p in pages.iter() {
            let t = Instant::now();
            let r = c.get_status(p).await;
            let e = runs.entry(p.clone()).or_default();
            match r {
                Ok((200, body)) => {
                    e.0.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                    e.2 = body.len();
                }
                _ => e.1 += 1,
            }
        }
    }
    Ok(runs)
}
