//! The forwarding worker: takes verified mails from the spool, posts each IDAP request to
//! the servlet over HTTP as the gateway agent on behalf of the verified agent, and mails
//! the response (or Fault) back. Retries with backoff while the servlet is unreachable;
//! a mail is forwarded once (its spool row records the response), and a re-sent copy gets
//! the original response again.
//!
//! Each mail is its own session: what it commits stays committed; open ON_COMMIT work it
//! leaves is rolled back right after, and the reply says so.
//!
//! Every forward carries an idempotency key made of the spool row's identity, which the
//! servlet records with the response in the request's own transaction. A forward repeated
//! after a crash (before the response reached the spool), or after an answer lost on the
//! way, gets the recorded response and performs nothing: a mail answered 250 is performed
//! exactly once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use aqgate_core::clock::{Clock, MICROS_PER_SEC};
use aqgate_core::store::{SpooledMail, Store};

pub use crate::outbound::{ReplyTransport, SendError, send_formatted, send_mail};
use crate::smime::{GatewayIdentity, ReplyHeaders, reply_mail};
use aqgate_proto::names::{IDEMPOTENCY_HEADER, ON_BEHALF_HEADER, SESSION_COOKIE};

#[derive(Clone)]
pub struct WorkerConfig {
    /// The servlet's IDAP endpoint, e.g. `http://127.0.0.1:8470/aqserv`.
    pub servlet_url: String,
    pub gateway_agent: String,
    pub gateway_password: String,
    /// The From address of replies.
    pub reply_from: String,
    pub transport: ReplyTransport,
    /// Give up forwarding after this many failed attempts (the mail is then `failed`,
    /// visible in the spool, and its sender gets a Fault reply).
    pub max_attempts: i64,
    /// How long a finished mail is remembered: within it, a re-sent copy gets the original
    /// response again; after it, the copy is a new request.
    pub dedupe_window: Duration,
    /// The gateway's S/MIME certificate and key: replies are signed with it (`None`:
    /// replies are plain text/xml mail).
    pub identity: Option<Arc<GatewayIdentity>>,
    /// This process (`host:pid:random`), named in its claims on spooled mail, so that a
    /// restart after a crash takes them back at once (`Store::spool_unclaim`).
    pub claim_owner: String,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("servlet_url", &self.servlet_url)
            .field("gateway_agent", &self.gateway_agent)
            .field("reply_from", &self.reply_from)
            .finish_non_exhaustive()
    }
}

pub struct Worker {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    cfg: WorkerConfig,
    http: reqwest::Client,
    /// Rung when a mail is spooled.
    pub wake: Arc<Notify>,
}

/// Outcome of one forwarding attempt.
enum Forwarded {
    /// The servlet answered (IDAP response or Fault); `rolled_back`: open work undone.
    Answer { body: Vec<u8>, rolled_back: bool },
    /// Try again later.
    Retry(String),
    /// Will never work (e.g. the gateway's credentials are refused).
    Permanent(String),
}

/// How long the worker waits for the database to come back after a failure that says it
/// is away, before it looks again (it looks at once when a check finds it back).
const OUTAGE_PAUSE: Duration = Duration::from_secs(30);

const ROLLBACK: &str = r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body><AQXmlRollback xmlns="http://ns.oracle.com/AQ/schemas/access"/></Body></Envelope>"#;

impl Worker {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, cfg: WorkerConfig) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap_or_default();
        Self { store, clock, cfg, http, wake: Arc::new(Notify::new()) }
    }

    /// Works the spool until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut purged: Option<tokio::time::Instant> = None;
        loop {
            if purged.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                self.purge().await;
                purged = Some(tokio::time::Instant::now());
            }
            let worked = match self.run_once().await {
                Ok(n) => n,
                Err(e) if e.is_unavailable() => {
                    // Logged once by the store; the spool waits until the database is back.
                    tracing::debug!(error = %e, "mail worker: the database is unavailable");
                    tokio::select! {
                        _ = self.store.until_available(OUTAGE_PAUSE) => {}
                        _ = shutdown.changed() => return,
                    }
                    self.take_back_claims().await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "mail worker");
                    self.take_back_claims().await;
                    0
                }
            };
            if worked > 0 {
                continue;
            }
            let notified = self.wake.notified();
            tokio::select! {
                _ = notified => {}
                // Retries come due without a wake-up.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Ends this process's claims on spooled mail after a round that failed. Between two
    /// rounds none of its mails is in flight, so a claim still held is one whose outcome
    /// could not be recorded (the database went away between the claim and the record, as
    /// in a failover): the mail is due again at once instead of after the claim's lease.
    /// Forwarding it again is safe (the idempotency key); a failure here only means waiting
    /// for the lease.
    async fn take_back_claims(&self) {
        match self.store.spool_unclaim(&self.cfg.claim_owner, self.clock.now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(mails = n, "mail worker: took back its claims after a failed round"),
            Err(e) => {
                tracing::debug!(error = %e, "mail worker: taking back its claims failed; they end with their lease")
            }
        }
    }

    /// Forgets finished mails older than the dedupe window.
    pub async fn purge(&self) {
        let window = i64::try_from(self.cfg.dedupe_window.as_micros()).unwrap_or(i64::MAX);
        match self.store.spool_purge(self.clock.now().saturating_sub(window)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(mails = n, "spool: finished mails past the dedupe window forgotten"),
            Err(e) if e.is_unavailable() => tracing::debug!(error = %e, "spool purge: the database is unavailable"),
            Err(e) => tracing::warn!(error = %e, "spool purge"),
        }
    }

    /// Forwards and answers what is due now, up to 8 mails at a time (each is its own
    /// session); returns how many mails it handled.
    pub async fn run_once(self: &Arc<Self>) -> Result<usize, aqgate_core::store::StoreError> {
        let due = self.store.spool_due(self.clock.now(), 32).await?;
        let n = due.len();
        let mut set = tokio::task::JoinSet::new();
        // Replies sent, recorded for the whole batch in one statement at its end. A crash
        // before that re-sends those replies (at least once), never re-forwards a mail:
        // the response itself is recorded before any reply goes out.
        let mut replied = Vec::new();
        let mut outcome = Ok(());
        for m in due {
            if set.len() >= 8
                && let Some(r) = set.join_next().await
            {
                collect(r, &mut replied, &mut outcome);
            }
            let me = self.clone();
            set.spawn(async move { me.handle(&m).await });
        }
        while let Some(r) = set.join_next().await {
            collect(r, &mut replied, &mut outcome);
        }
        self.store.spool_replied(&replied).await?;
        outcome.map(|()| n)
    }

    /// Forwards (if not done yet) and replies; returns (id, replies sent) when replies went out.
    async fn handle(&self, m: &SpooledMail) -> Result<Option<(i64, i64)>, aqgate_core::store::StoreError> {
        if !self.store.spool_claim(m.id, self.clock.now(), &self.cfg.claim_owner).await? {
            // Another process's worker has it.
            return Ok(None);
        }
        let mut m = m.clone();
        if m.state == "new" {
            match self.forward(&m).await {
                Forwarded::Answer { body, rolled_back } => {
                    let body = if rolled_back { annotate_rollback(&body) } else { body };
                    self.store.spool_attempted(m.id, Some(&body), None, None).await?;
                    m.response = Some(body);
                }
                Forwarded::Retry(why) if m.attempts + 1 < self.cfg.max_attempts => {
                    let backoff = 2_i64.saturating_pow(u32::try_from(m.attempts.clamp(0, 8)).unwrap_or(8)).min(300);
                    tracing::info!(mail = m.id, attempt = m.attempts + 1, error = %why, "servlet unreachable; will retry");
                    let at = self.clock.now() + backoff * MICROS_PER_SEC;
                    return self.store.spool_attempted(m.id, None, Some(&why), Some(at)).await.map(|()| None);
                }
                Forwarded::Retry(why) | Forwarded::Permanent(why) => {
                    tracing::warn!(mail = m.id, error = %why, "forwarding failed for good");
                    let fault = fault_xml(&why);
                    self.store.spool_attempted(m.id, Some(fault.as_bytes()), Some(&why), None).await?;
                    m.response = Some(fault.into_bytes());
                }
            }
        }
        let Some(response) = m.response.clone() else { return Ok(None) };
        let mut sent = m.replies_sent;
        while sent < m.replies_wanted {
            if let Err(e) = self.reply(&m, &response, sent).await {
                // The reply stays owed; the spool row is retried. A relay's permanent
                // refusal is retried too: the request was performed, and its answer is
                // kept until an operator sees the row (`admin spool`).
                tracing::warn!(mail = m.id, error = %e, permanent = e.is_permanent(), "reply not sent; will retry");
                let at = self.clock.now() + 30 * MICROS_PER_SEC;
                self.store.spool_attempted(m.id, None, Some(&e.to_string()), Some(at)).await?;
                break;
            }
            sent += 1;
        }
        Ok((sent > m.replies_sent).then_some((m.id, sent)))
    }

    async fn forward(&self, m: &SpooledMail) -> Forwarded {
        let post = |body: Vec<u8>, cookie: Option<&str>, key: Option<String>| {
            let mut rb = self
                .http
                .post(&self.cfg.servlet_url)
                .basic_auth(&self.cfg.gateway_agent, Some(&self.cfg.gateway_password))
                .header("content-type", "text/xml")
                .header(ON_BEHALF_HEADER, m.agent.clone())
                .body(body);
            if let Some(c) = cookie {
                rb = rb.header("cookie", c.to_string());
            }
            if let Some(k) = key {
                rb = rb.header(IDEMPOTENCY_HEADER, k);
            }
            rb.send()
        };
        let resp = match post(m.idap.clone(), None, Some(idempotency_key(m))).await {
            Ok(r) => r,
            // Not performed, or performed and recorded under the mail's key: either way the
            // next attempt (with the same key) answers it exactly once.
            Err(e) => return Forwarded::Retry(format!("servlet unreachable or its answer lost: {e}")),
        };
        let status = resp.status();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .filter(|c| c.starts_with(SESSION_COOKIE))
            .map(String::from);
        let body = match resp.bytes().await {
            Ok(b) => b.to_vec(),
            Err(e) => return Forwarded::Retry(format!("the servlet's answer was lost: {e}")),
        };
        if status.is_server_error() || status == reqwest::StatusCode::CONFLICT {
            // Not performed (refused before anything was done, e.g. too many sessions), or
            // performed under the mail's key (the next attempt gets the recorded answer),
            // or being performed by another attempt right now: safe to retry.
            return Forwarded::Retry(format!("servlet answered HTTP {status}"));
        }
        if !status.is_success() {
            return Forwarded::Permanent(format!("servlet refused the gateway: HTTP {status}"));
        }
        // A kept session means open work (or a browse position): this mail's session ends
        // here, so roll it back.
        let rolled_back = match cookie {
            Some(c) => post(ROLLBACK.as_bytes().to_vec(), Some(&c), None).await.is_ok(),
            None => false,
        };
        Forwarded::Answer { body, rolled_back }
    }

    /// Mails reply number `index` (0: the first) of `m`: signed when the gateway has a
    /// certificate, encrypted when the request came encrypted. The first answers the mail
    /// that asked; later ones answer the latest re-sent copy. The Message-ID is the same
    /// whenever the same reply is sent again (after a crash).
    async fn reply(&self, m: &SpooledMail, response: &[u8], index: i64) -> Result<(), SendError> {
        let subject = match m.subject.as_deref() {
            Some(s) if s.to_ascii_lowercase().starts_with("re:") => s.to_string(),
            Some(s) => format!("Re: {s}"),
            None => "Re: AQ request".to_string(),
        };
        let asked = if index == 0 { None } else { m.resend_message_id.as_deref() };
        let in_reply_to = asked.unwrap_or(&m.message_id).trim_start_matches('<').trim_end_matches('>').to_string();
        let from = &self.cfg.reply_from;
        let domain = from.rsplit_once('@').map(|(_, d)| d).unwrap_or("localhost");
        let digest: String = m.dedupe_key.chars().filter(char::is_ascii_alphanumeric).take(16).collect();
        let message_id = format!("aqgate.{}.{index}.{digest}@{domain}", m.id);
        let now = self.clock.now() / MICROS_PER_SEC;
        // Signing (and encrypting) is CPU work: on a blocking thread, so the runtime's
        // workers keep serving requests meanwhile.
        let (id, from_owned, to, xml) = (m.id, from.clone(), m.reply_to.clone(), response.to_vec());
        let (identity, encrypt_to) = (self.cfg.identity.clone(), m.encrypt_to.clone());
        let mail = tokio::task::spawn_blocking(move || {
            let extra = [("X-AQ-Request-Id", id.to_string())];
            let headers = ReplyHeaders {
                from: &from_owned,
                to: &to,
                subject: &subject,
                message_id: &message_id,
                in_reply_to: (!in_reply_to.is_empty()).then_some(in_reply_to.as_str()),
                extra: &extra,
            };
            reply_mail(&headers, &xml, identity.as_deref(), encrypt_to.as_deref(), now)
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "reply signing task failed");
            SendError::Transient("reply: the signing did not finish".into())
        })?
        .map_err(|e| SendError::Permanent(format!("reply: {e}")))?;
        send_formatted(&self.cfg.transport, from, &m.reply_to, &mail).await
    }
}

/// The idempotency key of a spooled mail's forward: its spool row (id and body digest, so
/// that a row id used again by a rebuilt spool is another key).
fn idempotency_key(m: &SpooledMail) -> String {
    let digest: String = m.dedupe_key.chars().filter(char::is_ascii_alphanumeric).take(32).collect();
    format!("mail-{}-{digest}", m.id)
}

/// Gathers one handled mail's outcome: replies sent, or the first error.
fn collect(
    r: Result<Result<Option<(i64, i64)>, aqgate_core::store::StoreError>, tokio::task::JoinError>,
    replied: &mut Vec<(i64, i64)>,
    outcome: &mut Result<(), aqgate_core::store::StoreError>,
) {
    match r {
        Ok(Ok(Some(x))) => replied.push(x),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            if outcome.is_ok() {
                *outcome = Err(e);
            }
        }
        Err(e) => {
            if outcome.is_ok() {
                *outcome = Err(aqgate_core::store::StoreError::corrupt(format!("mail worker task: {e}")));
            }
        }
    }
}

/// Marks a response whose mail left ON_COMMIT work open: that work was rolled back.
fn annotate_rollback(body: &[u8]) -> Vec<u8> {
    let note = b"<!-- aqgate: this request left uncommitted work; it was rolled back when the mail's session ended. Add <AQXmlCommit/> to commit it. -->\n";
    let text = String::from_utf8_lossy(body);
    // After the XML declaration, if any, so the document stays well-formed.
    match text.strip_prefix("<?xml").and_then(|rest| rest.find("?>").map(|i| i + 7)) {
        Some(end) => {
            let mut out = body[..end].to_vec();
            out.push(b'\n');
            out.extend_from_slice(note);
            out.extend_from_slice(&body[end..]);
            out
        }
        None => [note.as_slice(), body].concat(),
    }
}

fn fault_xml(why: &str) -> String {
    use aqgate_proto::idap::{Envelope, Fault, FaultKind, Response, write_response};
    write_response(&Envelope {
        headers: Vec::new(),
        body: Response::Fault(Fault {
            kind: FaultKind::Server,
            code: aqgate_proto::code::INTERNAL,
            message: why.to_string(),
        }),
    })
}
