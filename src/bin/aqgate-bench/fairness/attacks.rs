//! The fairness scenario's attacks: each a small reproduction of a way one client could
//! starve the others, run by `fairness` on a current-thread runtime of its own (one core at
//! most of the load generator) until its deadline, rate-limited or with a fixed number of
//! connections, from `--attack-source`. Each returns a tally of what the server answered.
//!
//! - (a) a 1.9 MB RAW message, then BROWSEs of it with pathological conditions in turn: a
//!   3,923-character `LIKE '%000…0001'`, `LIKE '%' || SUBSTR(tab.user_data, 1, 200000) ||
//!   '1'`, and a 63-term `||` chain; one at a time;
//! - (b) publishes with 130,000 distinct recipients, one at a time, 1 s apart;
//! - (c) buffered publishes of a 1-byte payload with 3,900 recipients of 1,000 characters,
//!   3 per second;
//! - (d) new sessions (a send left uncommitted, no cookie) as fast as 8 connections go;
//! - (e) 200 unauthenticated requests holding 4.19 MB of an unfinished body, then a byte
//!   every 5 s, and 1,100 connections that send nothing;
//! - (f) wrong passwords, 16 connections;
//! - (g) 200 long-poll receives on the honest queue that cannot match;
//! - (h) BROWSEs of the 1.9 MB message with a fresh `Idempotency-Key` each, 1 per second;
//! - (i) 300 SMTP connections held (20 of them in a trickled DATA of 8 MB), while a probe
//!   from `--probe-source` connects once a second and records the greeting.

use std::sync::atomic::AtomicBool;

use super::*;
use aqgate_proto::idap::Selector;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attack {
    LikeBrowse,
    Recipients,
    BufferedRecipients,
    Sessions,
    Slowloris,
    WrongPassword,
    LongPolls,
    Idempotency,
    SmtpSlots,
}

impl std::str::FromStr for Attack {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "a" => Self::LikeBrowse,
            "b" => Self::Recipients,
            "c" => Self::BufferedRecipients,
            "d" => Self::Sessions,
            "e" => Self::Slowloris,
            "f" => Self::WrongPassword,
            "g" => Self::LongPolls,
            "h" => Self::Idempotency,
            "i" => Self::SmtpSlots,
            _ => anyhow::bail!("unknown attack {s:?} (a to i)"),
        })
    }
}

impl std::fmt::Display for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::LikeBrowse => "(a) LIKE browses of 1.9 MB",
            Self::Recipients => "(b) 130k recipients",
            Self::BufferedRecipients => "(c) buffered 3.9k long rcpts",
            Self::Sessions => "(d) session flood",
            Self::Slowloris => "(e) slow bodies + silent",
            Self::WrongPassword => "(f) wrong passwords",
            Self::LongPolls => "(g) 200 long polls",
            Self::Idempotency => "(h) idempotent browses",
            Self::SmtpSlots => "(i) SMTP slots",
        })
    }
}

impl Attack {
    fn letter(self) -> &'static str {
        match self {
            Self::LikeBrowse => "a",
            Self::Recipients => "b",
            Self::BufferedRecipients => "c",
            Self::Sessions => "d",
            Self::Slowloris => "e",
            Self::WrongPassword => "f",
            Self::LongPolls => "g",
            Self::Idempotency => "h",
            Self::SmtpSlots => "i",
        }
    }
}

/// What the attacks need of the arguments.
pub(super) struct AttackCtx {
    url: String,
    cacert: Option<std::path::PathBuf>,
    source: std::net::IpAddr,
    probe_source: std::net::IpAddr,
    smtp: String,
    honest_queue: String,
    queue: String,
    topic: String,
    default_agent: (String, String),
    agents: HashMap<String, (String, String)>,
    /// The 1.9 MB message is on `queue` (sent by the first of (a) and (h) that runs).
    big_sent: AtomicBool,
}

const BIG: usize = 1_900_000;

fn browse(queue: &str, condition: Option<&str>) -> String {
    let mut r = Receive::new(queue);
    r.wait = Some(0);
    r.selector = condition.map(|c| Selector::Condition(c.to_string()));
    r.browse = true;
    request::document(r.to_request())
}

/// A publish of a 1-byte RAW message to `recipients`, committed or buffered.
fn publish(topic: &str, recipients: impl Iterator<Item = String>, buffered: bool) -> String {
    let mut m = Outgoing::raw(&[1]);
    m.recipients = recipients.collect();
    let mut publish = request::publish(topic, vec![m.to_message(1)], !buffered);
    if buffered {
        request::buffered(&mut publish);
    }
    request::document(publish)
}

fn base36(mut n: u32, width: usize) -> String {
    let digits = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut s = Vec::new();
    while n > 0 || s.len() < width {
        s.push(digits[(n % 36) as usize]);
        n /= 36;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl AttackCtx {
    pub(super) fn new(
        args: &Args,
        default_agent: (String, String),
        agents: HashMap<String, (String, String)>,
    ) -> anyhow::Result<Self> {
        let f = &args.fair;
        Ok(Self {
            url: args.url.clone(),
            cacert: args.cacert.clone(),
            source: f.attack_source,
            probe_source: f.probe_source,
            smtp: args.smtp.clone(),
            honest_queue: args.queue.clone(),
            queue: f.attack_queue.clone(),
            topic: f.attack_topic.clone(),
            default_agent,
            agents,
            big_sent: AtomicBool::new(false),
        })
    }

    fn client(&self, a: Attack) -> Client {
        let (u, p) = self.agents.get(a.letter()).unwrap_or(&self.default_agent);
        let mut c = Client::new(&self.url, u, p, self.cacert.as_deref()).expect("the URL was checked");
        c.bind = Some(self.source);
        c
    }

    /// Runs attack `a` until `deadline`; what the server answered.
    pub(super) async fn run(&self, a: Attack, deadline: Instant) -> Tally {
        let mut t = Tally::new();
        match a {
            Attack::LikeBrowse => self.like_browse(deadline, &mut t).await,
            Attack::Recipients => {
                let body = publish(&self.topic, (0..130_000).map(|i| format!("R{}", base36(i, 4))), false);
                self.paced(a, body, Duration::from_secs(1), deadline, &mut t).await;
            }
            Attack::BufferedRecipients => {
                let pad = "X".repeat(990);
                let body = publish(&self.topic, (0..3_900).map(|i| format!("L{i:05}{pad}")), true);
                self.paced(a, body, Duration::from_millis(333), deadline, &mut t).await;
            }
            Attack::Sessions => self.sessions(deadline, &mut t).await,
            Attack::Slowloris => self.slowloris(deadline, &mut t).await,
            Attack::WrongPassword => self.wrong_password(deadline, &mut t).await,
            Attack::LongPolls => self.long_polls(deadline, &mut t).await,
            Attack::Idempotency => {
                self.ensure_big(&mut t).await;
                let mut c = self.client(a);
                let body = browse(&self.queue, None);
                let mut n = 0u64;
                while !left(deadline).is_zero() {
                    n += 1;
                    c.headers = format!("Idempotency-Key: \"fair-{}-{n}\"\r\n", std::process::id());
                    c.cookie = None;
                    let next = Instant::now() + Duration::from_secs(1);
                    let r = timed(&mut c, body.as_bytes(), left(deadline)).await;
                    count(&mut t, outcome_by(&r, Some(deadline)).unwrap_or_else(|| "browsed".into()));
                    tokio::time::sleep_until(next.min(deadline).into()).await;
                }
            }
            Attack::SmtpSlots => self.smtp_slots(deadline, &mut t).await,
        }
        t
    }

    /// One request at a time, at most one per `pace`.
    async fn paced(&self, a: Attack, body: String, pace: Duration, deadline: Instant, t: &mut Tally) {
        let mut c = self.client(a);
        while !left(deadline).is_zero() {
            let next = Instant::now() + pace;
            let r = timed(&mut c, body.as_bytes(), left(deadline)).await;
            count(t, outcome_by(&r, Some(deadline)).unwrap_or_else(|| "accepted".into()));
            tokio::time::sleep_until(next.min(deadline).into()).await;
        }
    }

    async fn ensure_big(&self, t: &mut Tally) {
        if self.big_sent.load(Ordering::Relaxed) {
            return;
        }
        let mut c = self.client(Attack::LikeBrowse);
        let body = send_one(&self.queue, "FAIR-BIG", &hex(BIG, 0), true);
        let r = timed(&mut c, body.as_bytes(), Duration::from_secs(120)).await;
        match outcome(&r) {
            None => self.big_sent.store(true, Ordering::Relaxed),
            Some(e) => count(t, format!("1.9 MB send: {e}")),
        }
    }

    async fn like_browse(&self, deadline: Instant, t: &mut Tally) {
        self.ensure_big(t).await;
        let long = format!("tab.user_data LIKE '%{}1'", "0".repeat(3_921));
        let substr = "tab.user_data LIKE '%' || SUBSTR(tab.user_data, 1, 200000) || '1'".to_string();
        let chain = format!("({}) = 'x'", vec!["tab.user_data"; 63].join(" || "));
        let forms = [("long LIKE", long), ("SUBSTR LIKE", substr), ("63-term ||", chain)];
        let mut c = self.client(Attack::LikeBrowse);
        for (name, cond) in forms.iter().cycle() {
            if left(deadline).is_zero() {
                break;
            }
            c.cookie = None;
            let started = Instant::now();
            let r = timed(&mut c, browse(&self.queue, Some(cond)).as_bytes(), left(deadline)).await;
            let what = outcome_by(&r, Some(deadline)).unwrap_or_else(|| "answered".into());
            let took = match started.elapsed().as_secs() {
                0 => "< 1 s",
                1..10 => "1-10 s",
                _ => "≥ 10 s",
            };
            count(t, format!("{name}: {what} in {took}"));
            tokio::time::sleep(Duration::from_millis(200).min(left(deadline))).await;
        }
    }

    async fn sessions(&self, deadline: Instant, t: &mut Tally) {
        let body = Arc::new(send_one(&self.queue, "FAIR-SESSION", "01", false));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let mut c = self.client(Attack::Sessions);
                let body = body.clone();
                tokio::spawn(async move {
                    let mut t = Tally::new();
                    while !left(deadline).is_zero() {
                        c.cookie = None;
                        let r = timed(&mut c, body.as_bytes(), left(deadline).min(Duration::from_secs(10))).await;
                        let opened = matches!(&r, Ok((200, _))) && c.cookie.is_some();
                        count(
                            &mut t,
                            outcome_by(&r, Some(deadline))
                                .unwrap_or_else(|| if opened { "session opened" } else { "no cookie" }.into()),
                        );
                    }
                    t
                })
            })
            .collect();
        merge(tasks, t).await;
    }

    async fn wrong_password(&self, deadline: Instant, t: &mut Tally) {
        let (user, _) = self.agents.get("f").unwrap_or(&self.default_agent).clone();
        let body = Arc::new(receive_xml(&self.queue));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let mut c = Client::new(&self.url, &user, &format!("wrong-{i}"), self.cacert.as_deref())
                    .expect("the URL was checked");
                c.bind = Some(self.source);
                let body = body.clone();
                tokio::spawn(async move {
                    let mut t = Tally::new();
                    while !left(deadline).is_zero() {
                        let r = timed(&mut c, body.as_bytes(), left(deadline).min(Duration::from_secs(30))).await;
                        count(&mut t, outcome_by(&r, Some(deadline)).unwrap_or_else(|| "accepted!".into()));
                    }
                    t
                })
            })
            .collect();
        merge(tasks, t).await;
    }

    async fn long_polls(&self, deadline: Instant, t: &mut Tally) {
        let mut poll = Receive::new(self.honest_queue.clone());
        poll.wait = Some(30);
        poll.selector = Some(Selector::Correlation("FAIR-NEVER-MATCHES".into()));
        let body = Arc::new(request::document(poll.to_request()));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let mut c = self.client(Attack::LongPolls);
            let body = body.clone();
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::new();
                while !left(deadline).is_zero() {
                    let r = timed(&mut c, body.as_bytes(), left(deadline)).await;
                    match outcome_by(&r, Some(deadline)) {
                        // Cut off by the deadline: a poll that was still waiting.
                        Some(e) if e == "unanswered at the end" => count(&mut t, "waiting at the end"),
                        Some(e) => {
                            count(&mut t, e);
                            tokio::time::sleep(Duration::from_millis(500).min(left(deadline))).await;
                        }
                        None => count(&mut t, "waited 30 s, nothing"),
                    }
                }
                t
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        merge(tasks, t).await;
    }

    async fn slowloris(&self, deadline: Instant, t: &mut Tally) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const LENGTH: usize = 4_190_000;
        let chunk: Arc<Vec<u8>> = Arc::new(vec![b'<'; LENGTH - 100]);
        let c = self.client(Attack::Slowloris);
        let head = Arc::new(format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/xml\r\nContent-Length: {LENGTH}\r\n\r\n",
            c.path, c.addr
        ));
        let mut tasks = Vec::new();
        for i in 0..1_300 {
            let (chunk, head) = (chunk.clone(), head.clone());
            let connecting = c.connect();
            let holder = i < 200;
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::new();
                let kind = if holder { "slow body" } else { "silent" };
                let mut s = match connecting.await {
                    Ok(s) => s,
                    Err(e) => {
                        count(&mut t, format!("{kind}: connect failed: {}", e.kind()));
                        return t;
                    }
                };
                if holder {
                    let written = async {
                        s.write_all(head.as_bytes()).await?;
                        s.write_all(&chunk).await
                    };
                    if let Err(e) = tokio::time::timeout(left(deadline), written).await.unwrap_or(Ok(())) {
                        count(&mut t, format!("{kind}: write failed: {}", e.kind()));
                        return t;
                    }
                }
                let mut buf = [0u8; 512];
                loop {
                    let pause = Duration::from_secs(5).min(left(deadline));
                    if pause.is_zero() {
                        count(&mut t, format!("{kind}: held to the end"));
                        return t;
                    }
                    match tokio::time::timeout(pause, s.read(&mut buf)).await {
                        Err(_) if holder => {
                            if s.write_all(b"<").await.is_err() {
                                count(&mut t, format!("{kind}: closed by the server"));
                                return t;
                            }
                        }
                        Err(_) => {}
                        Ok(Ok(0) | Err(_)) => {
                            count(&mut t, format!("{kind}: closed by the server"));
                            return t;
                        }
                        Ok(Ok(n)) => {
                            let status =
                                String::from_utf8_lossy(&buf[..n]).split(' ').nth(1).unwrap_or("?").to_string();
                            count(&mut t, format!("{kind}: answered HTTP {status}"));
                            return t;
                        }
                    }
                }
            }));
            // Opened at 200 per second.
            tokio::time::sleep(Duration::from_millis(5).min(left(deadline))).await;
        }
        merge(tasks, t).await;
    }

    async fn smtp_slots(&self, deadline: Instant, t: &mut Tally) {
        let mut tasks = Vec::new();
        for i in 0..300 {
            let (addr, source) = (self.smtp.clone(), self.source);
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::new();
                let what = match smtp_hold(&addr, source, i < 20, deadline).await {
                    Ok(s) => s,
                    Err(e) => format!("holder: {}", e.root_cause().to_string().chars().take(40).collect::<String>()),
                };
                count(&mut t, what);
                t
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The probe: another client's greeting, once a second.
        let mut probes = Tally::new();
        while !left(deadline).is_zero() {
            let next = Instant::now() + Duration::from_secs(1);
            let code = tokio::time::timeout(Duration::from_secs(5), smtp_greeting(&self.smtp, self.probe_source)).await;
            count(
                &mut probes,
                match code {
                    Ok(Ok(c)) => format!("probe greeted {c}"),
                    Ok(Err(e)) => format!("probe: {}", e.root_cause().to_string().chars().take(40).collect::<String>()),
                    Err(_) => "probe: no greeting in 5 s".into(),
                },
            );
            tokio::time::sleep_until(next.min(deadline).into()).await;
        }
        merge(tasks, t).await;
        t.extend(probes);
    }
}

async fn merge(tasks: Vec<tokio::task::JoinHandle<Tally>>, t: &mut Tally) {
    for task in tasks {
        if let Ok(x) = task.await {
            for (k, v) in x {
                *t.entry(k).or_default() += v;
            }
        }
    }
}

async fn smtp_connect(addr: &str, source: std::net::IpAddr) -> anyhow::Result<tokio::net::TcpStream> {
    let to = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| anyhow::anyhow!("{addr}: no address"))?;
    let s = tokio::net::TcpSocket::new_v4()?;
    s.bind(std::net::SocketAddr::new(source, 0))?;
    Ok(s.connect(to).await?)
}

/// The code of one SMTP reply (its last line).
async fn smtp_reply<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> anyhow::Result<u16> {
    use tokio::io::AsyncBufReadExt;
    let mut line = String::new();
    loop {
        line.clear();
        anyhow::ensure!(r.read_line(&mut line).await? > 0, "closed");
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok(line.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0));
        }
    }
}

async fn smtp_greeting(addr: &str, source: std::net::IpAddr) -> anyhow::Result<u16> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::io::BufReader::new(smtp_connect(addr, source).await?);
    let code = smtp_reply(&mut s).await?;
    let _ = s.get_mut().write_all(b"QUIT\r\n").await;
    Ok(code)
}

/// Holds one SMTP connection until `deadline`: greeted, then idle after EHLO, or (`data`)
/// in a DATA of 8 MB sent at once, then a line every 5 s.
async fn smtp_hold(addr: &str, source: std::net::IpAddr, data: bool, deadline: Instant) -> anyhow::Result<String> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::io::BufReader::new(smtp_connect(addr, source).await?);
    let greeting = smtp_reply(&mut s).await?;
    if greeting != 220 {
        return Ok(format!("holder greeted {greeting}"));
    }
    s.get_mut().write_all(b"EHLO attacker\r\n").await?;
    smtp_reply(&mut s).await?;
    if data {
        s.get_mut().write_all(b"MAIL FROM:<john@example.com>\r\nRCPT TO:<aq@localhost>\r\nDATA\r\n").await?;
        for _ in 0..3 {
            smtp_reply(&mut s).await?;
        }
        let line = format!("{}\r\n", "A".repeat(998));
        let block = line.repeat(8_000);
        s.get_mut().write_all(block.as_bytes()).await?;
    }
    let kind = if data { "holder in DATA" } else { "holder idle" };
    loop {
        let pause = Duration::from_secs(5).min(left(deadline));
        if pause.is_zero() {
            return Ok(format!("{kind}: held to the end"));
        }
        match tokio::time::timeout(pause, smtp_reply(&mut s)).await {
            Err(_) => {
                if data {
                    s.get_mut().write_all(b"AAAA\r\n").await?;
                }
            }
            Ok(Ok(code)) => return Ok(format!("{kind}: server said {code}")),
            Ok(Err(_)) => return Ok(format!("{kind}: closed by the server")),
        }
    }
}
