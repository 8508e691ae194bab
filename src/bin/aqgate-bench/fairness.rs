//! The fairness scenario: honest agents at a steady moderate rate, first alone (the quiet
//! machine), then while a fifth client runs one attack after another (`attacks`);
//! per phase the honest latencies and errors, and at the end a ledger of every
//! acknowledged honest send: received exactly once, or the run fails.
//!
//! Each honest agent alternates a send + commit of one small RAW message (its correlation
//! `FAIR-<agent>-<n>` numbers it) and a receive + commit on `--queue`, `--honest-rate`
//! requests per second, a new connection per request (as a client that runs curl per
//! message). A receive not answered within `--request-timeout` counts as a timeout, but its
//! connection stays open and its answer, when it comes, still goes to the ledger (the server
//! performs a request whose client is gone). Request k of an agent is due at start + k / rate, and its latency
//! is counted from then, not from when it was actually sent (a server that stalls for 10 s
//! is charged 10 s for every request that should have run meanwhile, as wrk2 does). A
//! request belongs to the phase in which it was due; an agent still behind when the next
//! phase begins abandons the slots left of the last one (counted, with what they waited).

use std::collections::{BTreeMap, HashMap};

use super::*;
mod attacks;

use attacks::{Attack, AttackCtx};

/// Counts by outcome ("fault 24031", "HTTP 503", "timeout", …).
pub(super) type Tally = BTreeMap<String, u64>;

pub(super) fn count(t: &mut Tally, what: impl Into<String>) {
    *t.entry(what.into()).or_default() += 1;
}

fn show(t: &Tally) -> String {
    if t.is_empty() {
        return "-".into();
    }
    t.iter().map(|(k, v)| format!("{k}×{v}")).collect::<Vec<_>>().join(", ")
}

#[derive(clap::Args, Debug)]
pub(super) struct FairArgs {
    /// Fairness: seconds of honest load alone (the quiet-machine p99).
    #[arg(long, default_value_t = 60)]
    quiet_seconds: u64,
    /// Fairness: seconds each attack runs while the honest load goes on.
    #[arg(long, default_value_t = 60)]
    attack_seconds: u64,
    /// Fairness: seconds after each attack, honest load only, still counted in its phase
    /// (a server still busy with the attack's requests shows there).
    #[arg(long, default_value_t = 5)]
    settle_seconds: u64,
    /// Fairness: the attacks to run, in order (letters of `fairness/attacks.rs`).
    #[arg(long, default_value = "a,b,c,d,e,f,g,h,i")]
    attacks: String,
    /// Fairness: the honest agents, `name:password`, comma-separated.
    #[arg(long, default_value = "scott:tiger,alice:fair-demo,bob:fair-demo,carol:fair-demo")]
    honest: String,
    /// Fairness: requests per second of each honest agent (half sends, half receives).
    #[arg(long, default_value_t = 20)]
    honest_rate: u64,
    /// Fairness: an honest request not answered within this many seconds is a timeout.
    #[arg(long, default_value_t = 30)]
    request_timeout: u64,
    /// Fairness: RAW payload bytes of an honest message.
    #[arg(long, default_value_t = 256)]
    honest_payload: usize,
    /// Fairness: the local address the attacks connect from (honest agents use the
    /// default, 127.0.0.1), so that per-client limits can tell them apart.
    #[arg(long, default_value = "127.0.0.2")]
    pub(super) attack_source: std::net::IpAddr,
    /// Fairness: the local address of the SMTP probe that plays another mail client while
    /// attack (i) holds the slots.
    #[arg(long, default_value = "127.0.0.3")]
    pub(super) probe_source: std::net::IpAddr,
    /// Fairness: the attackers, `letter=name:password`, comma-separated; attacks not named
    /// use `a`'s agent (`f` floods its agent with a wrong password).
    #[arg(long, default_value = "a=john:welcome,d=trudy:fair-demo,f=mallory:fair-demo")]
    attackers: String,
    /// Fairness: the queue of the attack's own RAW messages (single consumer).
    #[arg(long, default_value = "AQUSER.FAIR_ATTACK_QUE")]
    pub(super) attack_queue: String,
    /// Fairness: a multi-consumer RAW queue for the recipient-list attacks.
    #[arg(long, default_value = "AQUSER.FAIR_TOPIC")]
    pub(super) attack_topic: String,
}

/// One honest request's record.
struct Sample {
    phase: usize,
    micros: u64,
    /// None: answered as asked (a receive that found nothing included).
    error: Option<String>,
}

/// What one honest agent did.
#[derive(Default)]
struct Honest {
    samples: Vec<Sample>,
    acked: Vec<String>,
    received: Vec<String>,
    /// Receives whose answer was lost (broken connection, or still unanswered at the
    /// end): a message may have been taken for them.
    receives_unknown: u64,
    /// Receives past their timeout, still waiting for their answer.
    late: Vec<tokio::task::JoinHandle<anyhow::Result<(u16, String)>>>,
}

/// The first `<tag>…</tag>` values of an answer.
fn values<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(j) = rest.find(&close) else { break };
        out.push(&rest[..j]);
        rest = &rest[j..];
    }
    out
}

/// An answer's outcome: None when it is a success, else what to count it as. A receive
/// that found nothing (25228) is a success.
pub(super) fn outcome(r: &anyhow::Result<(u16, String)>) -> Option<String> {
    outcome_by(r, None)
}

/// As `outcome`; a timeout at `deadline` (an attack's end) is "unanswered at the end".
pub(super) fn outcome_by(r: &anyhow::Result<(u16, String)>, deadline: Option<Instant>) -> Option<String> {
    match r {
        Err(e) if e.downcast_ref::<tokio::time::error::Elapsed>().is_some() => {
            Some(if deadline.is_some_and(|d| Instant::now() >= d) { "unanswered at the end" } else { "timeout" }.into())
        }
        Err(e) => Some(format!("io: {}", e.root_cause().to_string().chars().take(40).collect::<String>())),
        Ok((s, _)) if !(200..300).contains(s) => Some(format!("HTTP {s}")),
        Ok((_, t)) if t.contains("<Fault") => match values(t, "faultcode").first() {
            Some(&"25228") => None,
            Some(c) => Some(format!("fault {c}")),
            None => Some("fault ?".into()),
        },
        Ok(_) => None,
    }
}

/// A request with a time limit; a timed-out connection is dropped.
pub(super) async fn timed(c: &mut Client, body: &[u8], limit: Duration) -> anyhow::Result<(u16, String)> {
    match tokio::time::timeout(limit, c.post_status(body)).await {
        Ok(r) => r,
        Err(e) => {
            c.conn = None;
            Err(e.into())
        }
    }
}

pub(super) fn hex(n: usize, byte: u8) -> String {
    format!("{byte:02X}").repeat(n)
}

/// A send of one RAW message with a correlation, with or without a trailing commit.
pub(super) fn send_one(queue: &str, correlation: &str, hex: &str, commit: bool) -> String {
    format!(
        r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlSend xmlns="http://ns.oracle.com/AQ/schemas/access"><producer_options><destination>{queue}</destination></producer_options><message_set><message_count>1</message_count><message><message_number>1</message_number><message_header><correlation>{correlation}</correlation></message_header><message_payload><raw>{hex}</raw></message_payload></message></message_set>{}</AQXmlSend></Body></Envelope>"#,
        if commit { "<AQXmlCommit/>" } else { "" }
    )
}

fn pair(s: &str) -> anyhow::Result<(String, String)> {
    let (u, p) = s.split_once(':').ok_or_else(|| anyhow::anyhow!("{s:?}: expected name:password"))?;
    Ok((u.trim().to_string(), p.to_string()))
}

/// One honest agent's load until `end` (offsets from `t0`).
async fn honest(
    args: Arc<Args>,
    user: String,
    password: String,
    t0: Instant,
    phase_ends: Arc<Vec<Duration>>,
) -> anyhow::Result<Honest> {
    let f = &args.fair;
    let client = || Client::new(&args.url, &user, &password, args.cacert.as_deref());
    let payload = hex(f.honest_payload, 0x5A);
    let receive = receive_xml(&args.queue);
    let limit = Duration::from_secs(f.request_timeout);
    #[allow(clippy::cast_precision_loss)]
    let period = Duration::from_secs_f64(1.0 / f.honest_rate.max(1) as f64);
    let end = *phase_ends.last().unwrap_or(&Duration::ZERO);
    let mut h = Honest::default();
    let (mut k, mut n) = (0u32, 0u64);
    loop {
        let due = period * k;
        if due >= end {
            break;
        }
        let phase_of = |at: Duration| phase_ends.iter().position(|e| at < *e).unwrap_or(phase_ends.len() - 1);
        let phase = phase_of(due);
        // Behind into a later phase: this phase's slots left are abandoned (counted with
        // what they waited so far), so that one phase's backlog does not run into the next.
        let now = t0.elapsed();
        if now >= end || phase < phase_of(now) {
            let micros = u64::try_from((t0 + due).elapsed().as_micros()).unwrap_or(u64::MAX);
            h.samples.push(Sample { phase, micros, error: Some("not sent: behind at the phase's end".into()) });
            k += 1;
            continue;
        }
        tokio::time::sleep_until((t0 + due).into()).await;
        let send = k % 2 == 0;
        k += 1;
        let r = if send {
            n += 1;
            let id = format!("FAIR-{user}-{n}");
            let r = timed(&mut client()?, send_one(&args.queue, &id, &payload, true).as_bytes(), limit).await;
            if matches!(&r, Ok((200, t)) if t.contains("<status_code>0</status_code>") && !t.contains("<Fault")) {
                h.acked.push(id);
            }
            r
        } else {
            let (mut c, body) = (client()?, receive.clone());
            let mut task = tokio::spawn(async move { c.post_status(body.as_bytes()).await });
            let r = match tokio::time::timeout(limit, &mut task).await {
                Ok(done) => done.unwrap_or_else(|e| Err(e.into())),
                Err(e) => {
                    h.late.push(task);
                    Err(e.into())
                }
            };
            match &r {
                Ok((200, t)) => h.received.extend(values(t, "correlation").into_iter().map(String::from)),
                Err(e) if e.downcast_ref::<tokio::time::error::Elapsed>().is_none() => h.receives_unknown += 1,
                _ => {}
            }
            r
        };
        let micros = u64::try_from((t0 + due).elapsed().as_micros()).unwrap_or(u64::MAX);
        h.samples.push(Sample { phase, micros, error: outcome(&r) });
    }
    Ok(h)
}

/// Takes every message left on the queue (as the first honest agent); their correlations.
async fn drain(args: &Args) -> anyhow::Result<(Vec<String>, u64)> {
    let (user, password) = pair(args.fair.honest.split(',').next().unwrap_or_default())?;
    let mut c = Client::new(&args.url, &user, &password, args.cacert.as_deref())?;
    let receive = receive_xml(&args.queue);
    let (mut got, mut failures) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let r = timed(&mut c, receive.as_bytes(), Duration::from_secs(60)).await;
        match &r {
            Ok((200, t)) if t.contains("<faultcode>25228</faultcode>") => return Ok((got, failures)),
            Ok((200, t)) if !t.contains("<Fault") => got.extend(values(t, "correlation").into_iter().map(String::from)),
            _ => {
                failures += 1;
                eprintln!("drain: {}", outcome(&r).unwrap_or_default());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    anyhow::bail!("the queue {} did not drain in 300 s", args.queue)
}

fn left(until: Instant) -> Duration {
    until.saturating_duration_since(Instant::now())
}

fn ms(micros: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = micros as f64 / 1000.0;
    v
}

/// The fairness scenario (see the module's header).
pub(super) async fn fairness_bench(args: Args) -> anyhow::Result<()> {
    Client::new(&args.url, "", "", args.cacert.as_deref())?;
    let args = Arc::new(args);
    let f = &args.fair;
    let honest_agents: Vec<(String, String)> = f.honest.split(',').map(pair).collect::<anyhow::Result<_>>()?;
    let attacks: Vec<Attack> = f.attacks.split(',').map(|s| s.trim().parse()).collect::<anyhow::Result<_>>()?;
    let mut attackers = HashMap::new();
    for a in f.attackers.split(',') {
        let (letter, cred) =
            a.split_once('=').ok_or_else(|| anyhow::anyhow!("{a:?}: expected letter=name:password"))?;
        attackers.insert(letter.trim().to_string(), pair(cred)?);
    }
    let default_attacker = attackers.get("a").cloned().ok_or_else(|| anyhow::anyhow!("--attackers has no a="))?;

    // Phase ends, as offsets from the start.
    let quiet = Duration::from_secs(f.quiet_seconds);
    let (attack, settle) = (Duration::from_secs(f.attack_seconds), Duration::from_secs(f.settle_seconds));
    let mut ends = vec![quiet];
    for i in 1..=attacks.len() {
        ends.push(quiet + (attack + settle) * u32::try_from(i)?);
    }
    let ends = Arc::new(ends);
    let mut names = vec!["quiet".to_string()];
    names.extend(attacks.iter().map(|a| a.to_string()));
    eprintln!(
        "fairness: {} honest agents at {}/s each; {} s quiet, then {} attacks of {} s (+{} s settling); {} s in all",
        honest_agents.len(),
        f.honest_rate,
        f.quiet_seconds,
        attacks.len(),
        f.attack_seconds,
        f.settle_seconds,
        ends.last().map_or(0, Duration::as_secs)
    );

    let t0 = Instant::now() + Duration::from_millis(200);
    let tasks: Vec<_> = honest_agents
        .iter()
        .map(|(u, p)| tokio::spawn(honest(args.clone(), u.clone(), p.clone(), t0, ends.clone())))
        .collect();

    // The attacks, one after another, each on a thread and runtime of its own.
    let ctx = Arc::new(AttackCtx::new(&args, default_attacker, attackers)?);
    let mut outcomes = Vec::new();
    for (i, a) in attacks.iter().enumerate() {
        let start = t0 + ends[i];
        tokio::time::sleep_until(start.into()).await;
        eprintln!("attack {a}: start");
        let (ctx, a, deadline) = (ctx.clone(), *a, start + attack);
        let tally = tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            anyhow::Ok(rt.block_on(ctx.run(a, deadline)))
        })
        .await??;
        eprintln!("attack {a}: {}", show(&tally));
        outcomes.push(tally);
    }

    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await??);
    }
    // The late receives' answers, for at most two minutes more.
    let until = Instant::now() + Duration::from_secs(120);
    for h in &mut all {
        for task in std::mem::take(&mut h.late) {
            match tokio::time::timeout(left(until), task).await {
                Ok(Ok(Ok((200, t)))) => h.received.extend(values(&t, "correlation").into_iter().map(String::from)),
                Ok(Ok(Ok(_))) => {}
                _ => h.receives_unknown += 1,
            }
        }
    }
    let (drained, drain_failures) = drain(&args).await?;
    report(&names, &all, &outcomes, drained, drain_failures)
}

fn report(
    names: &[String],
    all: &[Honest],
    outcomes: &[Tally],
    drained: Vec<String>,
    drain_failures: u64,
) -> anyhow::Result<()> {
    let mut by_phase: Vec<(Vec<u64>, Tally)> = vec![(Vec::new(), Tally::new()); names.len()];
    for s in all.iter().flat_map(|h| &h.samples) {
        let (lat, errors) = &mut by_phase[s.phase];
        lat.push(s.micros);
        if let Some(e) = &s.error {
            count(errors, e.clone());
        }
    }
    let mut quiet_p99 = 0;
    println!(
        "{:<28} {:>8} {:>9} {:>9} {:>10} {:>7}  honest errors / attack outcome",
        "phase", "requests", "p50 ms", "p99 ms", "max ms", "p99/q"
    );
    for (i, (lat, errors)) in by_phase.iter_mut().enumerate() {
        lat.sort_unstable();
        let p = |q| u64::try_from(percentile(lat, q).as_micros()).unwrap_or(u64::MAX);
        let p99 = p(0.99);
        if i == 0 {
            quiet_p99 = p99.max(1);
        }
        #[allow(clippy::cast_precision_loss)]
        let ratio = p99 as f64 / quiet_p99 as f64;
        println!(
            "{:<28} {:>8} {:>9.2} {:>9.2} {:>10.2} {:>7.2}  errors: {}",
            names[i],
            lat.len(),
            ms(p(0.50)),
            ms(p99),
            ms(lat.last().copied().unwrap_or(0)),
            ratio,
            show(errors)
        );
        if i > 0 {
            println!("{:<28} {:>56}  attack: {}", "", "", show(&outcomes[i - 1]));
        }
    }

    // The ledger.
    let mut seen: HashMap<&str, u64> = HashMap::new();
    for id in all.iter().flat_map(|h| &h.received).chain(&drained) {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    let acked: Vec<&String> = all.iter().flat_map(|h| &h.acked).collect();
    let lost: Vec<&&String> = acked.iter().filter(|id| !seen.contains_key(id.as_str())).collect();
    let duplicated = seen.values().filter(|n| **n > 1).count();
    let acked_set: std::collections::HashSet<&str> = acked.iter().map(|s| s.as_str()).collect();
    let unacked_delivered = seen.keys().filter(|id| !acked_set.contains(*id)).count();
    let unknown: u64 = all.iter().map(|h| h.receives_unknown).sum();
    println!(
        "ledger: acknowledged={} received={} drained={} lost={} duplicated={duplicated} delivered-unacknowledged={unacked_delivered} receives-without-answer={unknown} drain-retries={drain_failures}",
        acked.len(),
        all.iter().map(|h| h.received.len()).sum::<usize>(),
        drained.len(),
        lost.len(),
    );
    if !lost.is_empty() {
        let some: Vec<&str> = lost.iter().take(10).map(|s| s.as_str()).collect();
        println!("lost (first 10): {}", some.join(" "));
    }
    if lost.is_empty() && duplicated == 0 {
        return Ok(());
    }
    if unknown > 0 {
        println!("({unknown} honest receives never answered: they may have taken lost messages)");
    }
    println!("FAILED: {} acknowledged messages lost, {duplicated} delivered more than once", lost.len());
    std::process::exit(1)
}
