//! The SMTP scenario: signed mails sent to the SMTP filter, replies counted.

use super::*;

/// One SMTP client: a connection kept open, one mail after another.
pub(super) async fn smtp_client(
    addr: String,
    from: String,
    mails: Arc<Vec<String>>,
    next: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
    pace: Option<Duration>,
) -> anyhow::Result<(Vec<u64>, u64, Vec<(String, Instant)>)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    // Reads one (possibly multi-line) reply; returns its code.
    async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> anyhow::Result<u16> {
        let mut line = String::new();
        loop {
            line.clear();
            anyhow::ensure!(r.read_line(&mut line).await? > 0, "connection closed");
            if line.as_bytes().get(3) != Some(&b'-') {
                return Ok(line.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0));
            }
        }
    }
    reply(&mut r).await?;
    w.write_all(b"EHLO bench\r\n").await?;
    reply(&mut r).await?;
    let (mut lat, mut refused) = (Vec::new(), 0);
    let mut ids = Vec::new();
    let mut n = 0u64;
    let mut tick = pace.map(tokio::time::interval);
    while !stop.load(Ordering::Relaxed) {
        if let Some(t) = tick.as_mut() {
            t.tick().await;
        }
        n += 1;
        // One template (re-sent copies) or the next distinct mail until they run out.
        let mail = if mails.len() == 1 {
            &mails[0]
        } else {
            match mails.get(next.fetch_add(1, Ordering::Relaxed)) {
                Some(m) => m,
                None => break,
            }
        };
        w.write_all(format!("MAIL FROM:<{from}>\r\nRCPT TO:<aq@localhost>\r\nDATA\r\n").as_bytes()).await?;
        for _ in 0..3 {
            reply(&mut r).await?;
        }
        let mid = format!("bench-{n}-{}@example.com", std::process::id() as u64 * 1_000_000 + u64::from(rand_u32()));
        let id = format!("Message-ID: <{mid}>");
        let body: String = mail
            .lines()
            .map(|l| {
                if l.starts_with("Message-ID:") {
                    id.clone()
                } else if l.starts_with('.') {
                    format!(".{l}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\r\n");
        w.write_all(body.as_bytes()).await?;
        let t = Instant::now();
        w.write_all(b"\r\n.\r\n").await?;
        let code = reply(&mut r).await?;
        if code == 250 {
            lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            ids.push((mid, t));
        } else {
            refused += 1;
        }
    }
    let _ = w.write_all(b"QUIT\r\n").await;
    Ok((lat, refused, ids))
}

/// The smtp scenario's mails: one template (`--mail`), or `--mails` distinct signed ones.
pub(super) fn smtp_mails(args: &Args) -> anyhow::Result<Vec<String>> {
    let (Some(idap), Some(cert), Some(key)) = (&args.idap, &args.sign_cert, &args.sign_key) else {
        let path = args
            .mail
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the smtp scenario needs --mail FILE or --idap/--sign-cert/--sign-key"))?;
        return Ok(vec![std::fs::read_to_string(&path)?]);
    };
    let (idap, cert, key) = (std::fs::read_to_string(idap)?, std::fs::read(cert)?, std::fs::read(key)?);
    let t = Instant::now();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let chunk = args.mails.div_ceil(threads);
    let mails = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let (idap, cert, key, from) = (&idap, &cert, &key, &args.mail_from);
                sc.spawn(move || -> anyhow::Result<Vec<String>> {
                    let mut out = Vec::new();
                    for i in (k * chunk)..((k + 1) * chunk).min(args.mails) {
                        let doc = idap.replacen("<Envelope", &format!("<!-- aqgate-bench {i} --><Envelope"), 1);
                        let m = aqgate_mail::smime::sign(doc.as_bytes(), cert, key, from, "aq@localhost", "bench")
                            .map_err(|e| anyhow::anyhow!("sign: {e}"))?;
                        out.push(String::from_utf8(m)?);
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("signer panicked"))?)
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let mails: Vec<String> = mails.into_iter().flatten().collect();
    eprintln!("signed {} distinct mails in {:.1}s", mails.len(), t.elapsed().as_secs_f64());
    Ok(mails)
}

pub(super) fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::try_from(Instant::now().elapsed().as_nanos()).unwrap_or(0));
    u32::try_from(h.finish() & 0xFFFF_FFFF).unwrap_or(0)
}

/// The SMTP scenario: `--clients` connections send the mails (each mail once, at `--rate`
/// in all if given) for `--seconds`; with `--reply-sink` the replies are awaited and their
/// delay reported too.
pub(super) async fn smtp_bench(args: &Args) -> anyhow::Result<()> {
    let mails = Arc::new(smtp_mails(args)?);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let replies: Replies = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    if let Some(addr) = &args.reply_sink {
        let l = tokio::net::TcpListener::bind(addr).await?;
        tokio::spawn(reply_sink(l, replies.clone()));
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            tokio::spawn(smtp_client(
                args.smtp.clone(),
                args.mail_from.clone(),
                mails.clone(),
                next.clone(),
                stop.clone(),
                args.rate.map(|r| Duration::from_secs_f64(args.clients as f64 / r.max(1) as f64)),
            ))
        })
        .collect();
    let run_end = Instant::now() + Duration::from_secs(args.seconds);
    while Instant::now() < run_end && next.load(Ordering::Relaxed) < mails.len().max(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut all, mut refused, mut sent) = (Vec::new(), 0, Vec::new());
    for t in tasks {
        let (l, r, ids) = t.await??;
        all.extend(l);
        refused += r;
        sent.extend(ids);
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    if args.reply_sink.is_some() {
        let deadline = Instant::now() + Duration::from_secs(30);
        while replies.lock().unwrap_or_else(|p| p.into_inner()).len() < sent.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let got = replies.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut to_reply: Vec<u64> = sent
            .iter()
            .filter_map(|(id, t)| {
                got.get(id).map(|at| u64::try_from(at.saturating_duration_since(*t).as_micros()).unwrap_or(u64::MAX))
            })
            .collect();
        to_reply.sort_unstable();
        println!(
            "replies received={} of {} p50_to_reply={:.2}ms p99_to_reply={:.2}ms",
            to_reply.len(),
            sent.len(),
            percentile(&to_reply, 0.50).as_secs_f64() * 1000.0,
            percentile(&to_reply, 0.99).as_secs_f64() * 1000.0,
        );
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = all.len() as f64 / elapsed.as_secs_f64();
    println!(
        "scenario=Smtp clients={} accepted={} refused={refused} mails/s={rate:.0} p50_to_250={:.2}ms p99_to_250={:.2}ms",
        args.clients,
        all.len(),
        percentile(&all, 0.50).as_secs_f64() * 1000.0,
        percentile(&all, 0.99).as_secs_f64() * 1000.0,
    );
    Ok(())
}
