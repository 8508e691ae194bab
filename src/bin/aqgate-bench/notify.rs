//! The notification scenario: registrations that POST to a sink here, and the time from
//! commit to delivery.

use super::*;

pub(super) fn message_id_in(xml: &str) -> Option<String> {
    element_in(xml, "message_id")
}

fn element_in(xml: &str, name: &str) -> Option<String> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(xml[start..end].to_string())
}

/// The notify scenario: paced single sends; latency from commit to notification received.
pub(super) async fn notify_bench(args: &Args) -> anyhow::Result<()> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Arrivals = Arc<Mutex<HashMap<String, (Instant, u32)>>>;
    let arrivals: Arrivals = Arc::new(Mutex::new(HashMap::new()));
    // Notifications of a propagation job's destination name the source message in their
    // correlation.
    let key = if args.register_queue.is_some() { "correlation" } else { "message_id" };
    let app = axum::Router::new().route(
        "/n",
        axum::routing::post({
            let arrivals = arrivals.clone();
            move |body: String| {
                let arrivals = arrivals.clone();
                async move {
                    let now = Instant::now();
                    if let Some(id) = element_in(&body, key) {
                        let mut a = arrivals.lock().unwrap_or_else(|p| p.into_inner());
                        a.entry(id).and_modify(|e| e.1 += 1).or_insert((now, 1));
                    }
                    "ok"
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref())?;
    let mk =
        || Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref()).expect("--url was checked above");
    let reg = format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{}</destination><notify_url>http://127.0.0.1:{port}/n</notify_url></register_options><AQXmlCommit/></AQXmlRegister></Body></Envelope>"#,
        args.register_queue.as_deref().unwrap_or(&args.queue)
    );
    let r = mk().post(reg).await?;
    anyhow::ensure!(!r.contains("<Fault"), "register failed (is the server run with --notify-allow 127.0.0.1?): {r}");
    let hex = "AB".repeat(args.payload);
    let body = Arc::new(send_xml(&args.queue, 1, &hex));
    let stop = Arc::new(AtomicBool::new(false));
    let per_client = Duration::from_secs_f64(args.clients as f64 / args.rate.unwrap_or(1000).max(1) as f64);
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let mut c = mk();
        let body = body.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let _ = c.post(receive_xml("AQUSER.NO_SUCH_QUEUE")).await;
            let mut sent: Vec<(String, Instant, Instant)> = Vec::new();
            let mut tick = tokio::time::interval(per_client);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let t0 = Instant::now();
                match c.post((*body).clone()).await {
                    Ok(text) => {
                        if let Some(id) = message_id_in(&text) {
                            sent.push((id, t0, Instant::now()));
                        }
                    }
                    Err(e) => eprintln!("send failed: {e}"),
                }
            }
            sent
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = Vec::new();
    for t in tasks {
        sent.extend(t.await?);
    }
    let elapsed = start.elapsed();
    // Let the last notifications arrive.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = arrivals.lock().unwrap_or_else(|p| p.into_inner()).len();
        if got >= sent.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = arrivals.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (mut from_ack, mut from_send, mut missing, mut dups) = (Vec::new(), Vec::new(), 0, 0);
    for (id, t0, t1) in &sent {
        match a.get(id) {
            Some((at, n)) => {
                from_ack.push(u64::try_from(at.saturating_duration_since(*t1).as_micros()).unwrap_or(u64::MAX));
                from_send.push(u64::try_from(at.saturating_duration_since(*t0).as_micros()).unwrap_or(u64::MAX));
                dups += n - 1;
            }
            None => missing += 1,
        }
    }
    from_ack.sort_unstable();
    from_send.sort_unstable();
    #[allow(clippy::cast_precision_loss)]
    let rate = sent.len() as f64 / elapsed.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "scenario=Notify clients={} enqueues={} enqueues/s={rate:.0} notified={} missing={missing} duplicates={dups} \
         commit_ack->received p50={:.2}ms p99={:.2}ms max={:.2}ms | send_start->received p50={:.2}ms p99={:.2}ms",
        args.clients,
        sent.len(),
        from_ack.len(),
        ms(percentile(&from_ack, 0.50)),
        ms(percentile(&from_ack, 0.99)),
        ms(percentile(&from_ack, 1.0)),
        ms(percentile(&from_send, 0.50)),
        ms(percentile(&from_send, 0.99)),
    );
    Ok(())
}

pub(super) type Replies = Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>;

/// A minimal SMTP sink for the server's reply mails: records when each arrived, by the
/// Message-ID in its In-Reply-To.
pub(super) async fn reply_sink(listener: tokio::net::TcpListener, replies: Replies) {
    while let Ok((stream, _)) = listener.accept().await {
        let replies = replies.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
            let _ = stream.set_nodelay(true);
            let (r, mut w) = stream.into_split();
            let mut r = BufReader::new(r);
            if w.write_all(b"220 bench sink\r\n").await.is_err() {
                return;
            }
            let mut line = String::new();
            let mut in_data = false;
            let mut reply_to: Option<String> = None;
            loop {
                line.clear();
                match r.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if in_data {
                    if line == ".\r\n" || line == ".\n" {
                        in_data = false;
                        if let Some(id) = reply_to.take() {
                            replies.lock().unwrap_or_else(|p| p.into_inner()).insert(id, Instant::now());
                        }
                        if w.write_all(b"250 ok\r\n").await.is_err() {
                            return;
                        }
                    } else if let Some(v) = line.strip_prefix("In-Reply-To:") {
                        reply_to = Some(v.trim().trim_start_matches('<').trim_end_matches('>').to_string());
                    }
                    continue;
                }
                let cmd = line.get(..4).unwrap_or("").to_ascii_uppercase();
                let answer: &[u8] = match cmd.as_str() {
                    "EHLO" | "HELO" => b"250 sink\r\n",
                    "DATA" => {
                        in_data = true;
                        b"354 go\r\n"
                    }
                    "QUIT" => {
                        let _ = w.write_all(b"221 bye\r\n").await;
                        return;
                    }
                    _ => b"250 ok\r\n",
                };
                if w.write_all(answer).await.is_err() {
                    return;
                }
            }
        });
    }
}
