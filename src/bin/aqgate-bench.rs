//! Load generator for the AQ servlet: N concurrent HTTP clients, each with its own session,
//! drive one scenario for a fixed time and report messages per second and latency
//! percentiles. See BENCHMARKS.md for the commands and results.
//!
//! Scenarios (RAW payloads of `--payload` bytes):
//! - `send`: one message per request, with a trailing AQXmlCommit;
//! - `batch`: a message_set of `--batch` messages, with a trailing AQXmlCommit;
//! - `transact`: one message per AQXmlSend without a commit, then an AQXmlCommit request
//!   (as examples 01 and 10): the session's transaction path, each client committing its
//!   own transaction; latency covers both requests;
//! - `receive`: AQXmlReceive (REMOVE) with a trailing AQXmlCommit; the queue is filled
//!   first (in batches) with enough messages for the run.
//! - `smtp`: signed mails (`--mail`, e.g. from `aqgate mail sign`) over SMTP to `--smtp`;
//!   each gets a fresh Message-ID (outside the signed part, so the signature still holds);
//!   latency is end of DATA → the 250. With `--reply-sink ADDR` the bench also runs an SMTP
//!   sink there (run the server with `--mail-relay smtp://ADDR`) and reports end of DATA →
//!   reply mail received, matched by In-Reply-To.
//! - `notify`: registers `--user` for notifications on the queue to an HTTP receiver in this
//!   process, then sends single messages (+ commit) at `--rate` per second in all; latency
//!   is commit → notification POST received (the server must allow the receiver:
//!   `--notify-allow 127.0.0.1`).
//! - `store`: no HTTP or XML: committed enqueues straight into the store at `--database`.
//! - `parse`: no HTTP or store: the batch request parsed in this process, by `--clients`
//!   threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

/// The server's allocator, so that the parse and store scenarios cost what they cost there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Scenario {
    Send,
    Batch,
    /// A send, then a commit as a request of its own.
    Transact,
    Receive,
    Smtp,
    Notify,
    /// The store alone: committed enqueues of `--batch` messages straight into the store
    /// at `--database` (the servlet's code path below HTTP and XML), to tell the database's
    /// share from the servlet's.
    Store,
    /// The codec alone: the batch scenario's request (`--batch` messages) parsed over and
    /// over in this process by `--clients` threads, to tell the XML's share of the servlet.
    Parse,
}

#[derive(Parser, Debug)]
#[command(name = "aqgate-bench", about = "Drive the aqgate servlet over HTTP and measure it")]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8470/aqserv")]
    url: String,
    #[arg(long, value_enum, default_value = "send")]
    scenario: Scenario,
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Messages per request in the batch scenario.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    #[arg(long, default_value = "AQUSER.RAW_QUE")]
    queue: String,
    #[arg(long, default_value = "scott")]
    user: String,
    #[arg(long, default_value = "tiger")]
    password: String,
    /// Messages to enqueue before a receive run.
    #[arg(long, default_value_t = 60_000)]
    prefill: usize,
    /// SMTP server for the smtp scenario.
    #[arg(long, default_value = "127.0.0.1:2525")]
    smtp: String,
    /// A signed mail (RFC 5322) for the smtp scenario.
    #[arg(long)]
    mail: Option<std::path::PathBuf>,
    #[arg(long, default_value = "scott@example.com")]
    mail_from: String,
    /// Sign distinct mails before the run (smtp scenario): the IDAP file (each copy gets its
    /// own XML comment, so every mail is a new request, not a re-sent copy).
    #[arg(long, requires_all = ["sign_cert", "sign_key"])]
    idap: Option<std::path::PathBuf>,
    #[arg(long)]
    sign_cert: Option<std::path::PathBuf>,
    #[arg(long)]
    sign_key: Option<std::path::PathBuf>,
    /// How many distinct mails to sign (the run stops early when they are used up).
    #[arg(long, default_value_t = 10_000)]
    mails: usize,
    /// Receive the server's reply mails on this address (smtp scenario).
    #[arg(long)]
    reply_sink: Option<String>,
    /// Requests per second in all: enqueues in the notify scenario (default 1000), mails in
    /// the smtp scenario (default: as fast as the server takes them).
    #[arg(long)]
    rate: Option<u64>,
    /// The store scenario's database (a PostgreSQL URL or a SQLite path/URL). It gets the
    /// migrations and the queue `--queue`.
    #[arg(long)]
    database: Option<String>,
}

fn send_xml(queue: &str, n: usize, hex: &str) -> String {
    let mut s = String::with_capacity(n * (hex.len() + 200) + 400);
    s.push_str(r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>"#);
    s.push_str(queue);
    s.push_str("</destination></producer_options><message_set>");
    s.push_str(&format!("<message_count>{n}</message_count>"));
    for i in 1..=n {
        s.push_str(&format!(
            "<message><message_number>{i}</message_number><message_payload><raw>{hex}</raw></message_payload></message>"
        ));
    }
    s.push_str("</message_set><AQXmlCommit/></AQXmlSend></Body></Envelope>");
    s
}

const COMMIT_XML: &str = r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlCommit xmlns="http://ns.oracle.com/AQ/schemas/access"/></Body></Envelope>"#;

fn receive_xml(queue: &str) -> String {
    format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlReceive xmlns="http://ns.oracle.com/AQ/schemas/access"><consumer_options><destination>{queue}</destination><wait_time>0</wait_time></consumer_options><AQXmlCommit/></AQXmlReceive></Body></Envelope>"#
    )
}

/// One load-generating client: a minimal HTTP/1.1 keep-alive client (as wrk is), one
/// connection, each request written in one go and the response read by Content-Length.
/// (reqwest took a fifth of this two-core machine in the send scenario, CPU the server and
/// PostgreSQL then lacked.) The first request authenticates; later ones carry the session
/// cookie.
struct Client {
    /// host:port
    addr: String,
    path: String,
    authorization: String,
    cookie: Option<String>,
    conn: Option<tokio::io::BufReader<tokio::net::TcpStream>>,
    request: Vec<u8>,
}

impl Client {
    fn new(url: &str, user: &str, password: &str) -> anyhow::Result<Self> {
        use base64::Engine as _;
        let rest = url.strip_prefix("http://").ok_or_else(|| anyhow::anyhow!("--url must be http://HOST:PORT/PATH"))?;
        let (addr, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
        Ok(Self {
            addr: addr.to_string(),
            path,
            authorization: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ),
            cookie: None,
            conn: None,
            request: Vec::new(),
        })
    }

    async fn post(&mut self, body: String) -> anyhow::Result<String> {
        let r = self.exchange(body.as_bytes()).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    async fn exchange(&mut self, body: &[u8]) -> anyhow::Result<String> {
        use std::io::Write as _;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        if self.conn.is_none() {
            let s = tokio::net::TcpStream::connect(&self.addr).await?;
            s.set_nodelay(true)?;
            self.conn = Some(tokio::io::BufReader::with_capacity(64 * 1024, s));
        }
        let conn = self.conn.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
        self.request.clear();
        write!(
            self.request,
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n",
            self.path,
            self.addr,
            body.len()
        )?;
        match &self.cookie {
            Some(c) => write!(self.request, "Cookie: {c}\r\n\r\n")?,
            None => write!(self.request, "Authorization: {}\r\n\r\n", self.authorization)?,
        }
        self.request.extend_from_slice(body);
        conn.get_mut().write_all(&self.request).await?;

        let mut line = String::new();
        anyhow::ensure!(conn.read_line(&mut line).await? > 0, "connection closed");
        let status: u16 = line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let (mut length, mut close) = (None, false);
        loop {
            line.clear();
            anyhow::ensure!(conn.read_line(&mut line).await? > 0, "connection closed in the headers");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let Some((name, value)) = l.split_once(':') else { continue };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("set-cookie") {
                self.cookie = value.split(';').next().map(String::from);
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
                close = true;
            }
        }
        let length = length.ok_or_else(|| anyhow::anyhow!("HTTP {status} without Content-Length"))?;
        let mut text = vec![0; length];
        conn.read_exact(&mut text).await?;
        if close {
            self.conn = None;
        }
        let text = String::from_utf8(text)?;
        anyhow::ensure!((200..300).contains(&status), "HTTP {status}: {text}");
        Ok(text)
    }
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_micros(sorted[i.min(sorted.len() - 1)])
}

/// One SMTP client: a connection kept open, one mail after another.
async fn smtp_client(
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
fn smtp_mails(args: &Args) -> anyhow::Result<Vec<String>> {
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

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::try_from(Instant::now().elapsed().as_nanos()).unwrap_or(0));
    u32::try_from(h.finish() & 0xFFFF_FFFF).unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.scenario == Scenario::Smtp {
        let mails = Arc::new(smtp_mails(&args)?);
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
                    got.get(id)
                        .map(|at| u64::try_from(at.saturating_duration_since(*t).as_micros()).unwrap_or(u64::MAX))
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
        return Ok(());
    }
    if args.scenario == Scenario::Store {
        return store_bench(&args).await;
    }
    if args.scenario == Scenario::Notify {
        return notify_bench(&args).await;
    }
    if args.scenario == Scenario::Parse {
        return parse_bench(&args).await;
    }
    let hex = "AB".repeat(args.payload);
    Client::new(&args.url, &args.user, &args.password)?;
    let mk = || Client::new(&args.url, &args.user, &args.password).expect("--url was checked above");

    if args.scenario == Scenario::Receive {
        let mut c = mk();
        let body = send_xml(&args.queue, 500, &hex);
        let mut n = 0;
        while n < args.prefill {
            c.post(body.clone()).await?;
            n += 500;
        }
        eprintln!("prefilled {n} messages");
    }

    let per_request = match args.scenario {
        Scenario::Batch => args.batch,
        _ => 1,
    };
    // The requests of one cycle, posted in turn.
    let bodies = Arc::new(match args.scenario {
        Scenario::Send => vec![send_xml(&args.queue, 1, &hex)],
        Scenario::Batch => vec![send_xml(&args.queue, args.batch, &hex)],
        Scenario::Transact => {
            vec![send_xml(&args.queue, 1, &hex).replace("<AQXmlCommit/>", ""), COMMIT_XML.to_string()]
        }
        Scenario::Receive | Scenario::Smtp | Scenario::Notify | Scenario::Store | Scenario::Parse => {
            vec![receive_xml(&args.queue)]
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let faults = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let mut c = mk();
        let bodies = bodies.clone();
        let stop = stop.clone();
        let faults = faults.clone();
        tasks.push(tokio::spawn(async move {
            // Warm up: open the session (one argon2 verification) outside the measurement.
            let _ = c.post(receive_xml("AQUSER.NO_SUCH_QUEUE")).await;
            let mut lat = Vec::new();
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let mut ok = true;
                for body in bodies.iter() {
                    match c.post(body.clone()).await {
                        Ok(text) if text.contains("<Fault") => ok = false,
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("request failed: {e}");
                            ok = false;
                        }
                    }
                    if !ok {
                        faults.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                if ok {
                    lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                }
            }
            (lat, start.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await?);
    }
    report(&args, per_request, faults.load(Ordering::Relaxed), runs);
    Ok(())
}

/// Prints a scenario's result line from its clients' runs (latencies in µs, time taken).
/// One client's run: its request latencies in µs, and how long it ran.
type Run = (Vec<u64>, Duration);

fn report(args: &Args, per_request: usize, faults: u64, runs: Vec<Run>) {
    let elapsed = runs.iter().map(|(_, e)| *e).max().unwrap_or(Duration::ZERO);
    let mut all: Vec<u64> = runs.into_iter().flat_map(|(lat, _)| lat).collect();
    all.sort_unstable();
    let requests = all.len();
    #[allow(clippy::cast_precision_loss)]
    let msgs_per_sec = (requests * per_request) as f64 / elapsed.as_secs_f64();
    println!(
        "scenario={:?} clients={} payload={}B batch={} requests={} faults={} msgs/s={:.0} p50={:.2}ms p99={:.2}ms",
        args.scenario,
        args.clients,
        args.payload,
        per_request,
        requests,
        faults,
        msgs_per_sec,
        percentile(&all, 0.50).as_secs_f64() * 1000.0,
        percentile(&all, 0.99).as_secs_f64() * 1000.0,
    );
}

/// The store scenario: each client enqueues `--batch` committed messages at a time through
/// `Store::insert_committed`, as the servlet does for a send with a trailing commit. Each
/// client is its own producer, so the PostgreSQL group commit batches as for connections.
async fn store_bench(args: &Args) -> anyhow::Result<()> {
    use aqgate_core::store::NewMessage;
    let url = args.database.as_deref().ok_or_else(|| anyhow::anyhow!("the store scenario needs --database"))?;
    let store = aqgate_store::open(url).await?;
    let queue = {
        let mut tx = store.begin().await?;
        let q = tx.ensure_queue(&args.queue).await?;
        tx.commit().await?;
        q
    };
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
                        exception_queue: None,
                        payload: payload.clone(),
                        enq_txn: None,
                        consumers: vec![String::new()],
                        prio_key: 0,
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

/// The parse scenario: each client thread parses the batch request document in a loop.
async fn parse_bench(args: &Args) -> anyhow::Result<()> {
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
async fn run_in_process(
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

fn message_id_in(xml: &str) -> Option<String> {
    let start = xml.find("<message_id>")? + "<message_id>".len();
    let end = xml[start..].find("</message_id>")? + start;
    Some(xml[start..end].to_string())
}

/// The notify scenario: paced single sends; latency from commit to notification received.
async fn notify_bench(args: &Args) -> anyhow::Result<()> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Arrivals = Arc<Mutex<HashMap<String, (Instant, u32)>>>;
    let arrivals: Arrivals = Arc::new(Mutex::new(HashMap::new()));
    let app = axum::Router::new().route(
        "/n",
        axum::routing::post({
            let arrivals = arrivals.clone();
            move |body: String| {
                let arrivals = arrivals.clone();
                async move {
                    let now = Instant::now();
                    if let Some(id) = message_id_in(&body) {
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
    Client::new(&args.url, &args.user, &args.password)?;
    let mk = || Client::new(&args.url, &args.user, &args.password).expect("--url was checked above");
    let reg = format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlRegister xmlns="http://ns.oracle.com/AQ/schemas/access"><register_options><destination>{}</destination><notify_url>http://127.0.0.1:{port}/n</notify_url></register_options><AQXmlCommit/></AQXmlRegister></Body></Envelope>"#,
        args.queue
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

type Replies = Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>;

/// A minimal SMTP sink for the server's reply mails: records when each arrived, by the
/// Message-ID in its In-Reply-To.
async fn reply_sink(listener: tokio::net::TcpListener, replies: Replies) {
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
