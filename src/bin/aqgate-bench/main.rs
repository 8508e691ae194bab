//! Load generator for the AQ servlet: N concurrent HTTP(S) clients, each with its own session,
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
//!   `--notify-allow 127.0.0.1`). With `--register-queue DEST` it registers on DEST, the
//!   destination of a propagation job from the queue (`preserve_message_id`), and the
//!   latency is the propagation lag up to the destination's notification.
//! - `store`: no HTTP or XML: committed enqueues straight into the store at `--database`.
//! - `parse`: no HTTP or store: the batch request parsed in this process, by `--clients`
//!   threads.
//! - `fairness`: honest agents at a steady rate, alone and then while another client runs
//!   one attack after another; per phase the honest latencies against the quiet phase's,
//!   and a ledger of every acknowledged send (`fairness.rs`, `scripts/bench-fairness.sh`).
//! - `pages`: the web console's pages (`--pages`) fetched in turn, as an agent logged in
//!   with Basic: per page its render time (`console.rs`, `scripts/bench-console.sh`).
//! - `tabs`: `--tabs` open console tabs, each on the live overview's event stream and
//!   fetching the fragment each event names (`console.rs`, `scripts/bench-console.sh`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aqgate_client::request::{self, Outgoing, Receive};
use aqgate_proto::idap::{Request, XmlNode};
use clap::{Parser, ValueEnum};

mod broker;
mod console;
mod fairness;
mod in_process;
mod notify;
mod smtp;

use {in_process::*, notify::*, smtp::*};

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
    /// The store alone: `--clients` take the head of `--queue` (REMOVE + commit, one
    /// message each) straight from the store at `--database`, until it is empty or for
    /// `--seconds`.
    Take,
    /// The codec alone: the batch scenario's request (`--batch` messages) parsed over and
    /// over in this process by `--clients` threads, to tell the XML's share of the servlet.
    Parse,
    /// A bare broker client (`--broker`): `--count` messages published with confirmations
    /// awaited per batch of `--batch`, the peer of an outbound gateway job.
    BrokerPublish,
    /// A bare broker client: `--count` messages consumed and acked, the peer of an inbound
    /// gateway job.
    BrokerConsume,
    /// Honest agents alone, then while a fifth client attacks (`--attacks`), with a ledger.
    Fairness,
    /// The web console's pages (`--pages`), each fetched in turn by every client.
    Pages,
    /// `--tabs` open console tabs: each holds the event stream and fetches the fragment
    /// each event names.
    Tabs,
}

#[derive(Parser, Debug)]
#[command(name = "aqgate-bench", about = "Drive the aqgate servlet over HTTP and measure it")]
struct Args {
    /// `http://HOST:PORT/PATH` or `https://…` (HTTP/1.1 over TLS; see `--cacert`).
    #[arg(long, default_value = "http://127.0.0.1:8470/aqserv")]
    url: String,
    /// PEM CA certificates an https `--url` is verified against.
    #[arg(long)]
    cacert: Option<std::path::PathBuf>,
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
    /// Send and receive buffered messages (delivery_mode BUFFERED, IMMEDIATE) instead of
    /// persistent ones (send, batch, receive).
    #[arg(long)]
    buffered: bool,
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
    /// The notify scenario registers on this queue instead of `--queue`: with a
    /// propagation job from `--queue` to it that has `preserve_message_id`, the latency is
    /// source commit → destination commit's notification (matched by correlation).
    #[arg(long)]
    register_queue: Option<String>,
    /// The store scenario's database (a PostgreSQL URL or a SQLite path/URL). It gets the
    /// migrations and the queue `--queue`.
    #[arg(long)]
    database: Option<String>,
    /// The broker scenarios' broker.
    #[arg(long, value_enum, default_value = "nats")]
    broker: broker::Broker,
    /// The broker's URL (credentials included, for RabbitMQ).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    broker_url: String,
    /// NATS subject, RabbitMQ queue or MQTT topic.
    #[arg(long, default_value = "aqgate.bench")]
    target: String,
    /// The NATS stream that holds `--target`.
    #[arg(long, default_value = "AQGATE_BENCH")]
    stream: String,
    /// Messages the broker scenarios publish or consume.
    #[arg(long, default_value_t = 20_000)]
    count: usize,
    /// The pages scenario's paths, separated by commas (e.g. `/console/,/console/queues`).
    #[arg(long, default_value = "/console/,/console/queues")]
    pages: String,
    /// Console tabs open at once in the tabs scenario.
    #[arg(long, default_value_t = 10)]
    tabs: usize,
    #[command(flatten)]
    fair: fairness::FairArgs,
}

/// An AQXmlSend of `n` RAW messages of the payload `hex` to `queue` (buffered: IMMEDIATE,
/// `aqgate:delivery_mode` BUFFERED), with a trailing AQXmlCommit if `commit`.
fn send_doc(queue: &str, n: usize, hex: &str, buffered: bool, commit: bool) -> String {
    let messages = (1..=n)
        .map(|i| Outgoing::node(XmlNode::with_text("raw", hex)).to_message(u32::try_from(i).unwrap_or(u32::MAX)))
        .collect();
    let mut send = request::send(queue, messages, commit);
    if buffered {
        request::buffered(&mut send);
    }
    request::document(send)
}

/// [`send_doc`], persistent and committed.
fn send_xml(queue: &str, n: usize, hex: &str) -> String {
    send_doc(queue, n, hex, false, true)
}

/// An AQXmlReceive (REMOVE, no wait) with a trailing AQXmlCommit; `buffered`: IMMEDIATE,
/// buffered messages.
fn receive_doc(queue: &str, buffered: bool) -> String {
    let mut r = Receive::new(queue);
    r.wait = Some(0);
    r.buffered = buffered;
    r.commit = true;
    request::document(r.to_request())
}

fn receive_xml(queue: &str) -> String {
    receive_doc(queue, false)
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
    conn: Option<tokio::io::BufReader<Box<dyn Stream>>>,
    request: Vec<u8>,
    /// For https: the connector and the name the server's certificate must have.
    tls: Option<(tokio_rustls::TlsConnector, rustls_pki_types::ServerName<'static>)>,
    /// The local address connections are made from (the fairness scenario's attacks come
    /// from another loopback address than the honest agents).
    bind: Option<std::net::IpAddr>,
    /// Header lines (each ending in CRLF) added to every request.
    headers: String,
}

/// A connection, plain or TLS.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// The TLS client configuration for `--cacert` (ring, HTTP/1.1 by ALPN).
fn tls_connector(cacert: Option<&std::path::Path>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use rustls_pki_types::pem::PemObject;
    let path = cacert.ok_or_else(|| anyhow::anyhow!("an https --url needs --cacert"))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(path)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

impl Client {
    fn new(url: &str, user: &str, password: &str, cacert: Option<&std::path::Path>) -> anyhow::Result<Self> {
        use base64::Engine as _;
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            _ => anyhow::bail!("--url must be http://HOST:PORT/PATH or https://…"),
        };
        let (addr, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
        let tls = if tls {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
            let name = rustls_pki_types::ServerName::try_from(host)?;
            Some((tls_connector(cacert)?, name))
        } else {
            None
        };
        Ok(Self {
            tls,
            addr: addr.to_string(),
            path,
            authorization: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            ),
            cookie: None,
            conn: None,
            request: Vec::new(),
            bind: None,
            headers: String::new(),
        })
    }

    async fn post(&mut self, body: String) -> anyhow::Result<String> {
        let (status, text) = self.post_status(body.as_bytes()).await?;
        anyhow::ensure!((200..300).contains(&status), "HTTP {status}: {text}");
        Ok(text)
    }

    /// One request; the answer's HTTP status and body, whatever the status.
    async fn post_status(&mut self, body: &[u8]) -> anyhow::Result<(u16, String)> {
        let path = self.path.clone();
        let r = self.exchange("POST", &path, body).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    /// A GET of `path` on the server; the answer's HTTP status and body, whatever the status.
    async fn get_status(&mut self, path: &str) -> anyhow::Result<(u16, String)> {
        let r = self.exchange("GET", path, &[]).await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    fn connect(&self) -> impl Future<Output = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
        connect(self.addr.clone(), self.bind)
    }

    async fn exchange(&mut self, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, String)> {
        use std::io::Write as _;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        if self.conn.is_none() {
            let s = self.connect().await?;
            s.set_nodelay(true)?;
            let s: Box<dyn Stream> = match &self.tls {
                Some((connector, name)) => Box::new(connector.connect(name.clone(), s).await?),
                None => Box::new(s),
            };
            self.conn = Some(tokio::io::BufReader::with_capacity(64 * 1024, s));
        }
        let conn = self.conn.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
        self.request.clear();
        write!(
            self.request,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        )?;
        self.request.extend_from_slice(self.headers.as_bytes());
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
        Ok((status, String::from_utf8(text)?))
    }
}

/// A TCP connection to `addr`, from `bind` if given.
async fn connect(addr: String, bind: Option<std::net::IpAddr>) -> std::io::Result<tokio::net::TcpStream> {
    let Some(ip) = bind else { return tokio::net::TcpStream::connect(&addr).await };
    let to = tokio::net::lookup_host(&addr)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to nothing")))?;
    let socket = if to.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.bind(std::net::SocketAddr::new(ip, 0))?;
    socket.connect(to).await
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_micros(sorted[i.min(sorted.len() - 1)])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if matches!(args.scenario, Scenario::BrokerPublish | Scenario::BrokerConsume) {
        let t = broker::Target { broker: args.broker, url: &args.broker_url, name: &args.target, stream: &args.stream };
        return match args.scenario {
            Scenario::BrokerPublish => broker::publish(&t, args.count, args.batch, args.payload).await,
            _ => broker::consume(&t, args.count, 256).await,
        };
    }
    if args.scenario == Scenario::Fairness {
        return fairness::fairness_bench(args).await;
    }
    if args.scenario == Scenario::Smtp {
        return smtp_bench(&args).await;
    }
    if args.scenario == Scenario::Store {
        return store_bench(&args).await;
    }
    if args.scenario == Scenario::Take {
        return take_bench(&args).await;
    }
    if args.scenario == Scenario::Notify {
        return notify_bench(&args).await;
    }
    if args.scenario == Scenario::Parse {
        return parse_bench(&args).await;
    }
    if args.scenario == Scenario::Pages {
        return console::pages_bench(&args).await;
    }
    if args.scenario == Scenario::Tabs {
        return console::tabs_bench(&args).await;
    }
    http_bench(&args).await
}

/// The HTTP scenarios (`send`, `batch`, `transact`, `receive`): the queue filled first for
/// `receive`, then `--clients` clients post their cycle of requests for `--seconds`.
async fn http_bench(args: &Args) -> anyhow::Result<()> {
    let hex = "AB".repeat(args.payload);
    Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref())?;
    let mk =
        || Client::new(&args.url, &args.user, &args.password, args.cacert.as_deref()).expect("--url was checked above");
    if args.scenario == Scenario::Receive {
        prefill(args, &mut mk(), &hex).await?;
    }
    let per_request = match args.scenario {
        Scenario::Batch => args.batch,
        _ => 1,
    };
    let bodies = Arc::new(cycle(args, &hex));
    let stop = Arc::new(AtomicBool::new(false));
    let faults = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| tokio::spawn(client_run(mk(), bodies.clone(), stop.clone(), faults.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await?);
    }
    report(args, per_request, faults.load(Ordering::Relaxed), runs);
    Ok(())
}

/// Fills the queue with at least `--prefill` messages, in batches of 500, for `receive`.
async fn prefill(args: &Args, c: &mut Client, hex: &str) -> anyhow::Result<()> {
    let body = send_doc(&args.queue, 500, hex, args.buffered, true);
    let mut n = 0;
    while n < args.prefill {
        c.post(body.clone()).await?;
        n += 500;
    }
    eprintln!("prefilled {n} messages");
    Ok(())
}

/// The requests of one cycle of an HTTP scenario, posted in turn.
fn cycle(args: &Args, hex: &str) -> Vec<String> {
    match args.scenario {
        Scenario::Send => vec![send_doc(&args.queue, 1, hex, args.buffered, true)],
        Scenario::Batch => vec![send_doc(&args.queue, args.batch, hex, args.buffered, true)],
        Scenario::Transact => {
            vec![send_doc(&args.queue, 1, hex, false, false), request::document(Request::Commit)]
        }
        Scenario::Receive => vec![receive_doc(&args.queue, args.buffered)],
        Scenario::Smtp
        | Scenario::Notify
        | Scenario::Store
        | Scenario::Take
        | Scenario::Parse
        | Scenario::BrokerPublish
        | Scenario::BrokerConsume
        | Scenario::Fairness
        | Scenario::Pages
        | Scenario::Tabs => vec![receive_xml(&args.queue)],
    }
}

/// One client: its session opened outside the measurement, then cycles until `stop`; a
/// cycle with a fault or a failed request counts in `faults` and not in the latencies.
async fn client_run(mut c: Client, bodies: Arc<Vec<String>>, stop: Arc<AtomicBool>, faults: Arc<AtomicU64>) -> Run {
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
}

/// One client's run: its request latencies in µs, and how long it ran.
type Run = (Vec<u64>, Duration);

/// Prints a scenario's result line from its clients' runs (latencies in µs, time taken).
fn report(args: &Args, per_request: usize, faults: u64, runs: Vec<Run>) {
    let elapsed = runs.iter().map(|(_, e)| *e).max().unwrap_or(Duration::ZERO);
    let mut all: Vec<u64> = runs.into_iter().flat_map(|(lat, _)| lat).collect();
    all.sort_unstable();
    let requests = all.len();
    #[allow(clippy::cast_precision_loss)]
    let msgs_per_sec = (requests * per_request) as f64 / elapsed.as_secs_f64();
    println!(
        "scenario={:?} delivery={} clients={} payload={}B batch={} requests={} faults={} msgs/s={:.0} p50={:.2}ms p99={:.2}ms",
        args.scenario,
        if args.buffered { "buffered" } else { "persistent" },
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
