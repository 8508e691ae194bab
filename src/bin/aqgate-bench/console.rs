//! The console scenarios. `pages`: `--clients` clients fetch each of `--pages` in turn for
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

/// The tabs scenario: `--tabs` open consoles for `--seconds`, each as the console's script
/// is: the overview once, then its event stream, and the fragment each event names fetched
/// again. Prints the events and fragments seen, and the fragments' latencies.
pub(crate) async fn tabs_bench(args: &Args) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..args.tabs {
        let c = Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref())?;
        tasks.push(tokio::spawn(tab(c, stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut events, mut faults, mut lat) = (0u64, 0u64, Vec::new());
    for t in tasks {
        let (e, f, l) = t.await??;
        events += e;
        faults += f;
        lat.extend(l);
    }
    lat.sort_unstable();
    println!(
        "scenario=Tabs tabs={} seconds={} events={events} fragments={} faults={faults} p50={:.2}ms p99={:.2}ms",
        args.tabs,
        args.seconds,
        lat.len(),
        percentile(&lat, 0.50).as_secs_f64() * 1000.0,
        percentile(&lat, 0.99).as_secs_f64() * 1000.0,
    );
    Ok(())
}

/// One tab: its events, its failed fetches, its fragments' latencies in µs.
async fn tab(mut c: Client, stop: Arc<AtomicBool>) -> anyhow::Result<(u64, u64, Vec<u64>)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (status, body) = c.get_status("/console/").await?;
    anyhow::ensure!(status == 200, "GET /console/: HTTP {status}: {}", body.chars().take(300).collect::<String>());
    let stream = tokio::net::TcpStream::connect(&c.addr).await?;
    let mut stream = tokio::io::BufReader::new(stream);
    let head = format!(
        "GET /console/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n\r\n",
        c.addr, c.authorization
    );
    stream.get_mut().write_all(head.as_bytes()).await?;
    let (mut events, mut faults, mut lat) = (0, 0, Vec::new());
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        let read = tokio::time::timeout(Duration::from_millis(200), stream.read_line(&mut line)).await;
        let Ok(read) = read else { continue };
        if read? == 0 {
            anyhow::bail!("the event stream ended");
        }
        if let Some(fragment) = line.trim_end().strip_prefix("data: ") {
            events += 1;
            let t = Instant::now();
            match c.get_status(&format!("/console/fragments/{fragment}")).await {
                Ok((200, _)) => lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
                _ => faults += 1,
            }
        } else if line.starts_with("HTTP/1.1 ") && !line.starts_with("HTTP/1.1 200") {
            anyhow::bail!("GET /console/events: {}", line.trim_end());
        }
    }
    Ok((events, faults, lat))
}
