//! The IDAP side of a crash run: producers with unique payloads and consumers over HTTP,
//! the ledger that classifies every payload, the final drain and the figures.
//!
//! Every payload is classified by what its producer was told:
//! - CONFIRMED: the committing answer was an IDAP response with status 0;
//! - REFUSED: an answer of its transaction was an IDAP Fault (and no earlier attempt of the
//!   committing request had an unknown outcome): it must never be delivered;
//! - ABANDONED: its transaction was certainly never committed (the enqueue's answer was
//!   lost, so its session's cookie is unknown and nobody can commit it; or the commit never
//!   reached a server): it must never be delivered either;
//! - INDETERMINATE: the committing answer was never received: delivered at most once.
//!
//! A consumer counts a payload consumed only when the removal's commit answered status 0
//! (a receive with a trailing commit answers both at once). A receive whose commit faulted
//! leaves the message to be delivered again; one whose commit answer was lost made it
//! "maybe consumed". A receive-and-commit whose answer was lost may have taken a message
//! nobody saw: such answers are counted, and confirmed payloads never seen are lost only
//! beyond that count. When the server honours `Idempotency-Key` (a probe at the start tells),
//! requests with a trailing commit carry a key and are sent again with the same key after
//! a lost answer, which resolves them exactly.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aqgate_core::error::code;
use aqgate_proto::idap::{self, Limits, Response};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::common::{SCOTT, aqserv, idap_request, set_cookie};
use super::procs::Clock;

pub const QUEUE: &str = "AQUSER.RAW_QUE";
const ENV_OPEN: &str = r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body>"#;
const ENV_CLOSE: &str = "</Body></Envelope>";
const ACCESS_NS: &str = "http://ns.oracle.com/AQ/schemas/access";
/// How long a client keeps retrying one request whose outcome it does not know yet.
const RETRY_FOR: Duration = Duration::from_secs(20);

/// An AQXmlSend of RAW `payloads` (text, sent as hex) to the queue, ON_COMMIT, with a
/// trailing commit or not.
pub fn send_xml(payloads: &[String], commit: bool) -> String {
    let mut set = format!("<message_count>{}</message_count>", payloads.len());
    for (i, p) in payloads.iter().enumerate() {
        set.push_str(&format!(
            "<message><message_number>{}</message_number><message_header><correlation>crash</correlation></message_header><message_payload><raw>{}</raw></message_payload></message>",
            i + 1,
            hex::encode_upper(p)
        ));
    }
    let commit = if commit { "<AQXmlCommit/>" } else { "" };
    format!(
        r#"{ENV_OPEN}<AQXmlSend xmlns="{ACCESS_NS}"><producer_options><destination>{QUEUE}</destination><visibility>ON_COMMIT</visibility></producer_options><message_set>{set}</message_set>{commit}</AQXmlSend>{ENV_CLOSE}"#
    )
}

/// An AQXmlReceive (REMOVE, ON_COMMIT) from the queue, with a trailing commit or not.
fn receive_xml(wait: u64, commit: bool) -> String {
    let commit = if commit { "<AQXmlCommit/>" } else { "" };
    format!(
        r#"{ENV_OPEN}<AQXmlReceive xmlns="{ACCESS_NS}"><consumer_options><destination>{QUEUE}</destination><wait_time>{wait}</wait_time><visibility>ON_COMMIT</visibility><dequeue_mode>REMOVE</dequeue_mode></consumer_options>{commit}</AQXmlReceive>{ENV_CLOSE}"#
    )
}

fn commit_xml() -> String {
    format!(r#"{ENV_OPEN}<AQXmlCommit xmlns="{ACCESS_NS}"/>{ENV_CLOSE}"#)
}

fn rollback_xml() -> String {
    format!(r#"{ENV_OPEN}<AQXmlRollback xmlns="{ACCESS_NS}"/>{ENV_CLOSE}"#)
}

/// What came back for one request.
pub enum Answer {
    /// An IDAP document, and the session cookie (`AQSESSIONID=…`) if one was set.
    Idap(Response, Option<String>),
    /// Certainly not performed: no connection, or refused before it ran (HTTP 503).
    NotSent(String),
    /// The outcome is unknown: the answer was lost, or was not IDAP.
    Lost(String),
}

/// An HTTP client speaking IDAP as one agent to one URL.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    pub fn new(port: u16) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .connect_timeout(Duration::from_secs(3))
            .pool_max_idle_per_host(2)
            .build()
            .expect("http client");
        Self { http, url: aqserv(port) }
    }

    pub async fn post(&self, body: &str, cookie: Option<&str>, key: Option<&str>) -> Answer {
        let mut rb = idap_request(&self.http, &self.url, SCOTT, body.to_string());
        if let Some(c) = cookie {
            rb = rb.header("cookie", c);
        }
        if let Some(k) = key {
            rb = rb.header("idempotency-key", k);
        }
        let r = match rb.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Answer::NotSent(format!("connect: {e}")),
            Err(e) => return Answer::Lost(format!("send: {e}")),
        };
        let status = r.status().as_u16();
        let set_cookie = set_cookie(&r).filter(|c| c.starts_with("AQSESSIONID="));
        let bytes = match r.bytes().await {
            Ok(b) => b,
            Err(e) => return Answer::Lost(format!("body: {e}")),
        };
        match status {
            200 => match idap::parse_response(&bytes, &Limits::default()) {
                Ok(env) => Answer::Idap(env.body, set_cookie),
                Err(e) => Answer::Lost(format!("unparsable answer ({e}): {}", String::from_utf8_lossy(&bytes))),
            },
            503 => Answer::NotSent("HTTP 503".into()),
            s => Answer::Lost(format!("HTTP {s}: {}", String::from_utf8_lossy(&bytes))),
        }
    }
}

fn fault_code(r: &Response) -> Option<i32> {
    match r {
        Response::Fault(f) => Some(f.code),
        Response::Send(s, _)
        | Response::Publish(s, _)
        | Response::Receive(s, _)
        | Response::Commit(s)
        | Response::Rollback(s)
        | Response::Register(s)
            if s.status_code != 0 =>
        {
            Some(s.error_code.unwrap_or(-1))
        }
        _ => None,
    }
}

/// The payloads (as text) of a successful receive answer.
fn received(r: &Response) -> Vec<String> {
    match r {
        Response::Receive(s, Some(res)) if s.status_code == 0 => res
            .messages
            .iter()
            .map(|m| {
                let hex_text = m.payload.text();
                hex::decode(hex_text.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_else(|| format!("<undecodable {hex_text}>"))
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Being sent (the producer has not finished with it yet).
    Pending,
    Confirmed,
    Refused(i32),
    Abandoned,
    Indeterminate,
}

/// Everything the clients learnt, by payload.
#[derive(Default)]
pub struct Ledger {
    pub outcome: HashMap<String, Outcome>,
    /// Removals whose commit answered status 0 (the drain's included).
    pub consumed: HashMap<String, u32>,
    pub drained: u64,
    /// Payloads a receive returned (committed or not).
    pub seen: HashSet<String>,
    /// Received, but the commit's outcome is unknown.
    pub maybe: HashSet<String>,
    /// Receive-and-commit requests whose answer was lost: each may have taken a message.
    pub unseen_takes: u64,
    pub faults: BTreeMap<i32, u64>,
    pub lost_answers: u64,
    pub anomalies: Vec<String>,
    pub history: HashMap<String, Vec<String>>,
    /// Payloads the `Idempotency-Key` probe sent (not part of the figures).
    pub probe: HashSet<String>,
}

pub type Shared = Arc<Mutex<Ledger>>;

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ledger {
    fn note(&mut self, ids: &[String], kills: u64, what: &str) {
        for id in ids {
            self.history.entry(id.clone()).or_default().push(format!("[kills {kills}] {what}"));
        }
    }

    fn classify(&mut self, ids: &[String], o: Outcome) {
        for id in ids {
            self.outcome.insert(id.clone(), o);
        }
    }

    fn fault(&mut self, c: i32) {
        *self.faults.entry(c).or_default() += 1;
    }

    fn consume(&mut self, ids: &[String]) {
        for id in ids {
            *self.consumed.entry(id.clone()).or_default() += 1;
        }
    }
}

/// The outcome of a commit (or a request with a trailing commit) sent until its outcome
/// is known or it cannot be.
enum Committed {
    /// Status 0.
    Ok,
    /// A Fault, with no earlier attempt of unknown outcome: nothing was committed.
    Refused(i32),
    /// Never reached a server.
    NotSent,
    /// Unknown (an attempt's answer was lost, and no later one said it was committed).
    Unknown,
}

/// Where a request's events are written down: the ledger, under the payloads concerned.
#[derive(Clone, Copy)]
struct Track<'a> {
    ledger: &'a Shared,
    clock: &'a Clock,
    ids: &'a [String],
}

/// Sends `body` until its outcome is known: again after a connection that was never made,
/// and — when `retry_lost` — again after a lost answer (a session's commit, or a request
/// carrying an honoured `Idempotency-Key`). Stops retrying at `RETRY_FOR`.
async fn commit_until_known(
    c: &Client,
    body: &str,
    cookie: Option<&str>,
    key: Option<&str>,
    retry_lost: bool,
    t: Track<'_>,
) -> Committed {
    let Track { ledger, clock, ids } = t;
    let deadline = Instant::now() + RETRY_FOR;
    let mut unknown = false;
    loop {
        match c.post(body, cookie, key).await {
            Answer::Idap(r, _) => {
                let mut l = lock(ledger);
                return match fault_code(&r) {
                    None => {
                        l.note(ids, clock.generation(), "commit answered 0");
                        Committed::Ok
                    }
                    Some(code) => {
                        l.fault(code);
                        l.note(ids, clock.generation(), &format!("commit answered Fault {code}"));
                        if unknown { Committed::Unknown } else { Committed::Refused(code) }
                    }
                };
            }
            Answer::NotSent(e) => {
                lock(ledger).note(ids, clock.generation(), &format!("commit not sent: {e}"));
            }
            Answer::Lost(e) => {
                unknown = true;
                let mut l = lock(ledger);
                l.lost_answers += 1;
                l.note(ids, clock.generation(), &format!("commit answer lost: {e}"));
                if !retry_lost {
                    return Committed::Unknown;
                }
            }
        }
        if Instant::now() >= deadline {
            return if unknown { Committed::Unknown } else { Committed::NotSent };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Best effort: roll the session back (a Fault answered one of its requests).
async fn rollback(c: &Client, cookie: &str) {
    let _ = c.post(&rollback_xml(), Some(cookie), None).await;
}

/// One producer: transactions of 1–2 unique payloads `{tag}-p{n}-{counter}`, half as a
/// session (send, then a separate commit with the cookie), half as one request with a
/// trailing commit, until the load stops.
pub async fn producer(c: Client, n: usize, tag: String, seed: u64, honoured: bool, ledger: Shared, clock: Arc<Clock>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counter = 0u64;
    while !clock.stopped() {
        let ids: Vec<String> = (0..rng.gen_range(1..=2))
            .map(|_| {
                counter += 1;
                format!("{tag}-p{n}-{counter:06}")
            })
            .collect();
        lock(&ledger).classify(&ids, Outcome::Pending);
        let outcome = if rng.gen_bool(0.5) {
            let think = if rng.gen_bool(0.3) { rng.gen_range(1..300) } else { 0 };
            session_send(&c, &ids, think, &ledger, &clock).await
        } else {
            let key = honoured.then(|| uuid::Uuid::new_v4().to_string());
            lock(&ledger).note(&ids, clock.generation(), "send with trailing commit");
            let body = send_xml(&ids, true);
            match commit_until_known(
                &c,
                &body,
                None,
                key.as_deref(),
                honoured,
                Track { ledger: &ledger, clock: &clock, ids: &ids },
            )
            .await
            {
                Committed::Ok => Outcome::Confirmed,
                Committed::Refused(code) => Outcome::Refused(code),
                Committed::NotSent => Outcome::Abandoned,
                Committed::Unknown => Outcome::Indeterminate,
            }
        };
        lock(&ledger).classify(&ids, outcome);
    }
}

async fn session_send(c: &Client, ids: &[String], think_ms: u64, ledger: &Shared, clock: &Clock) -> Outcome {
    let body = send_xml(ids, false);
    let deadline = Instant::now() + RETRY_FOR;
    let cookie = loop {
        match c.post(&body, None, None).await {
            Answer::Idap(r, cookie) => {
                if let Some(code) = fault_code(&r) {
                    {
                        let mut l = lock(ledger);
                        l.fault(code);
                        l.note(ids, clock.generation(), &format!("session send answered Fault {code}"));
                    }
                    if let Some(ck) = cookie {
                        rollback(c, &ck).await;
                    }
                    return Outcome::Refused(code);
                }
                let Some(cookie) = cookie else {
                    let mut l = lock(ledger);
                    l.anomalies.push(format!("an ON_COMMIT send of {ids:?} answered without a session cookie"));
                    l.note(ids, clock.generation(), "session send answered 0 without a cookie");
                    return Outcome::Abandoned;
                };
                lock(ledger).note(ids, clock.generation(), &format!("session send answered 0, {cookie}"));
                break cookie;
            }
            Answer::NotSent(e) => {
                if Instant::now() >= deadline {
                    return Outcome::Abandoned;
                }
                lock(ledger).note(ids, clock.generation(), &format!("session send not sent: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Answer::Lost(e) => {
                // The session (if one was opened) is unknown to us: nobody can commit it.
                let mut l = lock(ledger);
                l.lost_answers += 1;
                l.note(ids, clock.generation(), &format!("session send answer lost: {e}"));
                return Outcome::Abandoned;
            }
        }
    };
    if think_ms > 0 {
        tokio::time::sleep(Duration::from_millis(think_ms)).await;
    }
    match commit_until_known(c, &commit_xml(), Some(&cookie), None, true, Track { ledger, clock, ids }).await {
        Committed::Ok => Outcome::Confirmed,
        Committed::Refused(code) => {
            rollback(c, &cookie).await;
            Outcome::Refused(code)
        }
        Committed::NotSent => Outcome::Abandoned,
        Committed::Unknown => Outcome::Indeterminate,
    }
}

/// One consumer: removals from the queue, half in a session (receive, then a separate
/// commit with the cookie), half as one request with a trailing commit; wait_time 0 or 1.
pub async fn consumer(c: Client, n: usize, seed: u64, honoured: bool, ledger: Shared, clock: Arc<Clock>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let who = format!("consumer {n}");
    while !clock.stopped() {
        let wait = rng.gen_range(0..=1);
        if rng.gen_bool(0.5) {
            session_receive(&c, &who, wait, &ledger, &clock).await;
        } else {
            receive_and_commit(&c, &who, wait, honoured, &ledger, &clock).await;
        }
    }
}

/// A receive with a trailing commit; returns how many messages it consumed (`None`: the
/// outcome is unknown).
async fn receive_and_commit(
    c: &Client,
    who: &str,
    wait: u64,
    honoured: bool,
    ledger: &Shared,
    clock: &Clock,
) -> Option<usize> {
    let key = honoured.then(|| uuid::Uuid::new_v4().to_string());
    let body = receive_xml(wait, true);
    let deadline = Instant::now() + RETRY_FOR;
    let mut unknown = false;
    loop {
        match c.post(&body, None, key.as_deref()).await {
            Answer::Idap(r, _) => {
                if let Some(code) = fault_code(&r) {
                    // After a lost answer (only retried with an honoured key) this says the
                    // first attempt took nothing either.
                    lock(ledger).fault(code);
                    if code == code::NO_MESSAGE && wait == 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    return Some(0);
                }
                let ids = received(&r);
                let mut l = lock(ledger);
                l.seen.extend(ids.iter().cloned());
                l.note(&ids, clock.generation(), &format!("{who}: received and committed (answered 0)"));
                l.consume(&ids);
                return Some(ids.len());
            }
            Answer::NotSent(_) => {}
            Answer::Lost(_) => {
                let mut l = lock(ledger);
                l.lost_answers += 1;
                if !honoured {
                    l.unseen_takes += 1;
                    return None;
                }
                unknown = true;
            }
        }
        if Instant::now() >= deadline || (clock.stopped() && !unknown) {
            if unknown {
                lock(ledger).unseen_takes += 1;
                return None;
            }
            return Some(0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn session_receive(c: &Client, who: &str, wait: u64, ledger: &Shared, clock: &Clock) {
    let (r, cookie) = match c.post(&receive_xml(wait, false), None, None).await {
        Answer::Idap(r, cookie) => (r, cookie),
        Answer::NotSent(_) => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return;
        }
        Answer::Lost(_) => {
            // Whatever it locked belongs to a session we never learnt: it rolls back.
            lock(ledger).lost_answers += 1;
            return;
        }
    };
    if let Some(code) = fault_code(&r) {
        lock(ledger).fault(code);
        if let Some(ck) = cookie {
            rollback(c, &ck).await;
        }
        if code == code::NO_MESSAGE && wait == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        return;
    }
    let ids = received(&r);
    {
        let mut l = lock(ledger);
        l.seen.extend(ids.iter().cloned());
        l.note(&ids, clock.generation(), &format!("{who}: received in a session, {cookie:?}"));
    }
    let Some(cookie) = cookie else {
        lock(ledger).anomalies.push(format!("an ON_COMMIT receive of {ids:?} answered without a session cookie"));
        return;
    };
    match commit_until_known(c, &commit_xml(), Some(&cookie), None, true, Track { ledger, clock, ids: &ids }).await {
        Committed::Ok => lock(ledger).consume(&ids),
        Committed::Refused(..) | Committed::NotSent => rollback(c, &cookie).await,
        Committed::Unknown => lock(ledger).maybe.extend(ids.iter().cloned()),
    }
}

/// Whether the server honours `Idempotency-Key`: the same send with a trailing commit,
/// twice with one key, must enqueue one message. The probe's messages are removed again.
pub async fn probe_idempotency(c: &Client, tag: &str, ledger: &Shared) -> bool {
    let id = format!("{tag}-probe");
    lock(ledger).probe.insert(id.clone());
    let key = uuid::Uuid::new_v4().to_string();
    let body = send_xml(std::slice::from_ref(&id), true);
    for _ in 0..2 {
        match c.post(&body, None, Some(&key)).await {
            Answer::Idap(r, _) => assert!(fault_code(&r).is_none(), "probe send refused: {r:?}"),
            Answer::NotSent(e) | Answer::Lost(e) => panic!("probe send failed: {e}"),
        }
    }
    let mut copies = 0;
    loop {
        match c.post(&receive_xml(0, true), None, None).await {
            Answer::Idap(r, _) => {
                let got = received(&r);
                if got.is_empty() {
                    break;
                }
                assert!(got.iter().all(|g| *g == id), "the queue held more than the probe: {got:?}");
                copies += got.len();
            }
            Answer::NotSent(e) | Answer::Lost(e) => panic!("probe receive failed: {e}"),
        }
    }
    assert!(copies == 1 || copies == 2, "probe: {copies} copies");
    copies == 1
}

/// Removes everything left in the queue with receive-and-commit requests on a server that
/// is no longer killed, adding what it takes to the consumed counts. It goes on until the
/// queue is empty and the sessions of answers lost in the kills have timed out.
pub async fn drain(c: &Client, ledger: &Shared, not_before: Instant, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        assert!(Instant::now() < deadline, "the queue was not drained within {within:?}");
        match c.post(&receive_xml(0, true), None, None).await {
            Answer::Idap(r, _) => {
                let ids = received(&r);
                if ids.is_empty() {
                    assert_eq!(fault_code(&r), Some(code::NO_MESSAGE), "drain: {r:?}");
                    if Instant::now() >= not_before {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
                let mut l = lock(ledger);
                l.seen.extend(ids.iter().cloned());
                l.note(&ids, 0, "drained");
                l.drained += ids.len() as u64;
                l.consume(&ids);
            }
            Answer::NotSent(e) | Answer::Lost(e) => {
                let mut l = lock(ledger);
                l.anomalies.push(format!("drain request failed on a server that was not killed: {e}"));
                l.unseen_takes += 1;
            }
        }
    }
}

/// The figures of a run.
pub struct Figures {
    pub sent_confirmed: usize,
    pub refused: usize,
    pub abandoned: usize,
    pub indeterminate: usize,
    pub consumed: u64,
    pub drained: u64,
    pub lost: usize,
    pub unseen_confirmed: usize,
    pub duplicated: usize,
    pub unexpected: usize,
    pub report: Vec<String>,
}

impl Figures {
    pub fn of(ledger: &Shared) -> Self {
        let l = lock(ledger);
        let count = |f: &dyn Fn(&Outcome) -> bool| l.outcome.values().filter(|o| f(o)).count();
        let mut report = Vec::new();
        let story = |id: &str| l.history.get(id).map(|h| h.join("; ")).unwrap_or_default();
        let probe = |id: &String| l.probe.contains(id);
        let mut unseen: Vec<&String> = l
            .outcome
            .iter()
            .filter(|(id, o)| **o == Outcome::Confirmed && !l.consumed.contains_key(*id) && !l.maybe.contains(*id))
            .map(|(id, _)| id)
            .collect();
        unseen.sort();
        let lost = unseen.len().saturating_sub(usize::try_from(l.unseen_takes).unwrap_or(usize::MAX));
        if lost > 0 {
            for id in unseen.iter().take(8) {
                report.push(format!("lost {id}: {}", story(id)));
            }
        }
        let mut duplicated: Vec<(&String, &u32)> = l.consumed.iter().filter(|(id, n)| **n > 1 && !probe(id)).collect();
        duplicated.sort();
        for (id, n) in duplicated.iter().take(8) {
            report.push(format!("duplicated {id} ({n} times): {}", story(id)));
        }
        let mut unexpected: Vec<String> = l
            .seen
            .iter()
            .filter(|id| !probe(id))
            .filter(|id| match l.outcome.get(*id) {
                None => true,
                Some(Outcome::Refused(_)) | Some(Outcome::Abandoned) => true,
                Some(_) => false,
            })
            .map(|id| format!("{id} ({:?})", l.outcome.get(id)))
            .collect();
        unexpected.sort();
        for id in unexpected.iter().take(8) {
            let bare = id.split(' ').next().unwrap_or_default();
            report.push(format!("unexpected {id}: {}", story(bare)));
        }
        for a in l.anomalies.iter().take(8) {
            report.push(format!("anomaly: {a}"));
        }
        Self {
            sent_confirmed: count(&|o| *o == Outcome::Confirmed),
            refused: count(&|o| matches!(o, Outcome::Refused(_))),
            abandoned: count(&|o| *o == Outcome::Abandoned),
            indeterminate: count(&|o| matches!(o, Outcome::Indeterminate | Outcome::Pending)),
            consumed: l.consumed.iter().filter(|(id, _)| !probe(id)).map(|(_, n)| u64::from(*n)).sum(),
            drained: l.drained,
            lost,
            unseen_confirmed: unseen.len(),
            duplicated: duplicated.len(),
            unexpected: unexpected.len(),
            report,
        }
    }

    pub fn extras(ledger: &Shared) -> String {
        let l = lock(ledger);
        format!(
            "maybe_consumed={} unseen_takes={} lost_answers={} faults={:?}",
            l.maybe.len(),
            l.unseen_takes,
            l.lost_answers,
            l.faults
        )
    }
}
