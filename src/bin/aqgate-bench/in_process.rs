//! Scenarios without the HTTP edge: the store alone (enqueues, head-taking), and the IDAP
//! codec alone.

use super::*;

/// The store at `--database` (migrated) and the id of `--queue` in it (created if new),
/// for the in-process `scenario`.
async fn store_and_queue(
    args: &Args,
    scenario: &str,
) -> anyhow::Result<(Arc<dyn aqgate_core::store::Store>, aqgate_core::store::QueueId)> {
    let url = args.database.as_deref().ok_or_else(|| anyhow::anyhow!("the {scenario} scenario needs --database"))?;
    let store = aqgate_store::open(url).await?;
    let mut tx = store.begin().await?;
    let queue = tx.ensure_queue(&args.queue).await?;
    tx.commit().await?;
    Ok((store, queue))
}

/// The store scenario: each client enqueues `--batch` committed messages at a time through
/// `Store::insert_committed`, as the servlet does for a send with a trailing commit. Each
/// client is its own producer, so the PostgreSQL group commit batches as for connections.
pub(super) async fn store_bench(args: &Args) -> anyhow::Result<()> {
    use aqgate_core::store::NewMessage;
    let (store, queue) = store_and_queue(args, "store").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..args.clients {
        let (store, stop) = (store.clone(), stop.clone());
        let (n, payload) = (args.batch, vec![0xab_u8; args.payload]);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
                let msgs: Vec<NewMessage> = (0..n)
                    .map(|_| NewMessage {
                        msgid: *uuid::Uuid::now_v7().as_bytes(),
                        queue,
                        corrid: None,
                        priority: 1,
                        enq_time: now,
                        delay_until: None,
                        expire_at: None,
                        sender: None,
                        enq_user_id: None,
                        exception_queue: None,
                        payload: payload.clone(),
                        enq_txn: None,
                        consumers: vec![String::new()],
                        prio_key: 0,
                        spilled: false,
                        group: None,
                        enq_txn_id: None,
                        origin: None,
                    })
                    .collect();
                let t = Instant::now();
                store.insert_committed(&msgs, client as u64 + 1).await?;
                lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            anyhow::Ok((lat, start.elapsed()))
        }));
    }
    // A store error ends the run: every request counted was committed.
    run_in_process(args, &stop, tasks).await
}

/// The take scenario: each client takes the head of `--queue` and commits it, one message
/// at a time through `Store::take_head`, as the servlet does for a REMOVE receive with a
/// trailing commit (the PostgreSQL writer groups concurrent clients' takes). A client stops
/// when the queue is empty or after `--seconds`: a way to pass a backlog through the
/// queue's rows fast.
pub(super) async fn take_bench(args: &Args) -> anyhow::Result<()> {
    use aqgate_core::store::CandidateQuery;
    let (store, queue) = store_and_queue(args, "take").await?;
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for client in 0..args.clients {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let start = Instant::now();
            while Instant::now() < until {
                let now = aqgate_core::clock::Clock::now(&aqgate_core::clock::SystemClock);
                let q = CandidateQuery::head(queue, "", format!("bench-take-{client}"), now);
                let t = Instant::now();
                if store.take_head(&q, client as u64 + 1).await?.is_none() {
                    break;
                }
                lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            anyhow::Ok((lat, start.elapsed()))
        }));
    }
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await??);
    }
    report(args, 1, 0, runs);
    Ok(())
}

/// The parse scenario: each client thread parses the batch request document in a loop.
pub(super) async fn parse_bench(args: &Args) -> anyhow::Result<()> {
    use aqgate_proto::idap::parse::{Limits, parse_request};
    let doc = Arc::new(send_xml(&args.queue, args.batch, &"AB".repeat(args.payload)));
    parse_request(doc.as_bytes(), &Limits::default())?;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (doc, stop) = (doc.clone(), stop.clone());
            tokio::task::spawn_blocking(move || {
                let mut lat = Vec::new();
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    parse_request(doc.as_bytes(), &Limits::default())?;
                    lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                }
                anyhow::Ok((lat, start.elapsed()))
            })
        })
        .collect();
    run_in_process(args, &stop, tasks).await
}

/// The in-process scenarios' end: lets the clients run for `--seconds`, stops them and
/// reports `--batch` messages per request. An error in any client ends the run.
pub(super) async fn run_in_process(
    args: &Args,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Run>>>,
) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await??);
    }
    report(args, args.batch, 0, runs);
    Ok(())
}
