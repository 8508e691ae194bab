//! Notifications: AQXmlNotification to `http(s)://` and `mailto:` targets, at least once.
//!
//! - The outbox is transactional: the store writes one `notify_outbox` row per (message,
//!   registration) in the transaction that inserts the message, tagged with the session
//!   transaction until it commits ([`aqgate_core::store::StoreTx::insert_messages`]); a rolled-back
//!   enqueue leaves no row, a committed one always has its rows.
//! - The [`Dispatcher`] delivers from the outbox. It is event-driven: it sleeps until the
//!   engine signals a commit (in-process; on PostgreSQL also the `aqgate_enqueue`
//!   LISTEN/NOTIFY channel, so commits of other processes wake it), the next retry or
//!   delayed message falls due, or shutdown.
//! - It claims rows with a lease (the row's next attempt moves to the lease's end), so a
//!   crashed dispatcher's claims come due again: delivery is at least once, and every
//!   notification carries a stable id (`AQ-Notification-Id`, `X-AQ-Notification-Id`) for
//!   receivers to drop duplicates.
//! - HTTP: POST text/xml; 2xx is delivery; anything else (status, timeout, refused
//!   connection) is retried with exponential backoff; after `max_attempts` the row is
//!   parked — visible in `aqgate admin notifications` and `/metrics`, put back with
//!   `aqgate admin notifications --retry-parked`, never dropped. Targets are checked
//!   against the [`Policy`] allowlist at registration and again, after DNS, at
//!   every delivery; redirects are not followed. A registration with a secret gets an
//!   `AQ-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<id>.<body>")>`.
//! - Fair shares between targets ([`targets`]): at most `per_target` attempts in flight to
//!   one target (an HTTP origin, a mail domain), claims that leave out the rows of targets
//!   with no room and take at most `per_target` rows of one URL, the claimed rows started
//!   round-robin across targets, and a circuit breaker per target: a target that keeps
//!   failing (or never answers) is left alone for a cool-down, its rows pending, and gets one
//!   probe after it. One agent's dead receiver never delays another agent's notifications.
//! - `mailto:`: the XML as a text/xml mail through the mail transport (relay or `.eml`
//!   files); `mailto:ALIAS` (no `@`) is resolved through the directory at delivery.

pub use aqgate_core::notify_policy as policy;

mod targets;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lettre::Message;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use tokio::sync::{Notify, Semaphore};

use aqgate_core::clock::{MICROS_PER_SEC, Micros};
use aqgate_core::engine::{Engine, agent_from_json};
use aqgate_core::metrics::{Counter, Gauge};
use aqgate_core::store::{ClaimShape, OutboxEntry, Store};
use aqgate_directory::Directory;
use aqgate_mail::outbound::{ReplyTransport, SendError, send_mail};
use aqgate_proto::idap::model::{Envelope, MessageHeader, Notification, Response};

pub use policy::Policy;

/// The dispatcher's counters (registered in the engine's metrics registry).
#[derive(Debug, Clone)]
struct Counters {
    delivered: Counter,
    failed_attempts: Counter,
    parked: Counter,
    breaker_opens: Counter,
    breakers_open: Gauge,
    target_waits: Counter,
}

impl Counters {
    fn register(m: &aqgate_core::metrics::Metrics) -> Self {
        Self {
            delivered: m.counter("aqgate_notifications_delivered_total", "Notifications delivered by this process."),
            failed_attempts: m
                .counter("aqgate_notification_failures_total", "Failed notification attempts in this process."),
            parked: m.counter(
                "aqgate_notifications_parked_total",
                "Notifications this process parked after failing too often.",
            ),
            breaker_opens: m.counter(
                "aqgate_notify_breaker_opens_total",
                "Times a notification target's circuit opened (failing again and again, or a failed probe).",
            ),
            breakers_open: m.gauge(
                "aqgate_notify_breakers_open",
                "Notification targets whose circuit is open now (or half-open, waiting for its probe).",
            ),
            target_waits: m.counter(
                "aqgate_notify_target_limit_waits_total",
                "Claimed notifications given back because their target had --notify-per-target in flight.",
            ),
        }
    }
}

/// Tunables of the dispatcher.
#[derive(Clone)]
pub struct NotifyConfig {
    pub policy: Arc<Policy>,
    /// Which `mailto:` addresses (not aliases) may be mailed, checked again at delivery.
    pub mail_policy: Arc<policy::MailPolicy>,
    /// Per HTTP request (connect + answer).
    pub http_timeout: Duration,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// Deliveries in flight at once to one target (an HTTP origin, a mail domain).
    pub per_target: usize,
    /// Consecutive failed attempts to one target that open its circuit (0: never).
    pub breaker_failures: u32,
    /// How long an open circuit waits before one probe; doubles while probes fail, up to
    /// `max_backoff`.
    pub breaker_cooldown: Duration,
    /// Attempts before a notification is parked.
    pub max_attempts: i64,
    /// First retry delay; doubles per attempt up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Outbound mail for `mailto:` targets; without it they are parked with a clear error.
    pub mail: Option<(ReplyTransport, String)>,
    /// Resolves `mailto:ALIAS`.
    pub directory: Option<Arc<dyn Directory>>,
    /// Extra CA certificates (PEM) trusted for `https://` targets, beside the public roots.
    pub extra_roots_pem: Vec<Vec<u8>>,
    /// Without an in-process or LISTEN/NOTIFY signal (a standalone dispatcher on SQLite),
    /// look for work this often.
    pub fallback_poll: Option<Duration>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            policy: Arc::new(Policy::default()),
            mail_policy: Arc::new(policy::MailPolicy::default()),
            http_timeout: Duration::from_secs(10),
            concurrency: 64,
            per_target: 4,
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            max_attempts: 15,
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            mail: None,
            directory: None,
            extra_roots_pem: Vec::new(),
            fallback_poll: None,
        }
    }
}

impl std::fmt::Debug for NotifyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifyConfig")
            .field("policy", &self.policy)
            .field("http_timeout", &self.http_timeout)
            .field("concurrency", &self.concurrency)
            .field("per_target", &self.per_target)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown", &self.breaker_cooldown)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// Try again later; the target is not to blame (e.g. the directory could not be asked).
    Retry(String),
    /// The target did not take it (timeout, connection, status, the relay's transient
    /// refusal): try again later; counts toward its circuit.
    Target(String),
    /// Given up in flight: the target's circuit opened meanwhile.
    Abandoned,
    /// Will not work without an operator (e.g. the target is not allowed): park now.
    Park(String),
}

pub struct Dispatcher {
    engine: Arc<Engine>,
    store: Arc<dyn Store>,
    cfg: NotifyConfig,
    http: reqwest::Client,
    /// Rung on every commit that may have produced notifications.
    wake: Arc<Notify>,
    /// Rung when a target that had no room has some again.
    freed: Notify,
    targets: targets::Targets,
    counters: Counters,
}

/// An attempt's outcome, with the time before which a retry must not come (the target's
/// circuit is open until then).
type Done = (OutboxEntry, Result<(), Failure>, Option<Micros>);

/// Claims per store round trip.
const BATCH: usize = 256;

/// How often the dispatcher reloads which queues have registrations (for registrations
/// made by other processes; its own process tells it at once).
const REFRESH: Duration = Duration::from_secs(2);

/// How long the dispatcher waits for the database to come back before it looks again (it
/// looks at once when a check finds it back).
const OUTAGE_PAUSE: Duration = Duration::from_secs(30);

/// A store failure of the dispatcher's loop: at debug when it is the database being away
/// (`outage`; the store logs the outage once), else a warning.
fn outage_or_warn(outage: bool, e: &dyn std::fmt::Display, what: &str) {
    if outage {
        tracing::debug!(error = %e, "{what}: the database is unavailable");
    } else {
        tracing::warn!(error = %e, "{what}");
    }
}

impl Dispatcher {
    pub fn new(engine: Arc<Engine>, cfg: NotifyConfig) -> Result<Arc<Self>, String> {
        let mut builder = reqwest::Client::builder();
        for pem in &cfg.extra_roots_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("notification CA file: {e}"))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .timeout(cfg.http_timeout)
            .connect_timeout(cfg.http_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(PolicyResolver { policy: cfg.policy.clone() }))
            .pool_max_idle_per_host(cfg.concurrency)
            .user_agent(concat!("aqgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("notification HTTP client: {e}"))?;
        let store = engine.store().clone();
        let wake = engine.commit_signal();
        let counters = Counters::register(&engine.config().metrics);
        let targets = targets::Targets::new(targets::Limits {
            per_target: cfg.per_target.max(1),
            failures: cfg.breaker_failures,
            cooldown: i64::try_from(cfg.breaker_cooldown.as_micros()).unwrap_or(i64::MAX).max(1),
            max_cooldown: i64::try_from(cfg.max_backoff.max(cfg.breaker_cooldown).as_micros()).unwrap_or(i64::MAX),
        });
        Ok(Arc::new(Self { engine, store, cfg, http, wake, freed: Notify::new(), targets, counters }))
    }

    /// Delivers until `shutdown` changes. While the database is away (`Store::health`) it
    /// waits for it instead of failing every second.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(self.cfg.concurrency.max(1)));
        let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
        let recorder = tokio::spawn(self.clone().record(done_rx));
        let lease =
            i64::try_from((self.cfg.http_timeout * 3 + Duration::from_secs(30)).as_micros()).unwrap_or(i64::MAX);
        let mut refreshed: Option<tokio::time::Instant> = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            if !self.store.health().available {
                // The store logged the outage once: the outbox waits until the database is
                // back (or looks again after a while) instead of failing every second.
                tokio::select! {
                    _ = self.store.until_available(OUTAGE_PAUSE) => {}
                    _ = shutdown.changed() => break,
                }
            }
            // Which queues have registrations (only their commits wake us): registrations
            // made by other processes are seen within REFRESH.
            if refreshed.is_none_or(|t| t.elapsed() >= REFRESH) {
                if let Err(e) = self.engine.refresh_registered().await {
                    outage_or_warn(
                        e.code == aqgate_proto::code::STORE_UNAVAILABLE,
                        &e,
                        "notification dispatcher: loading registrations",
                    );
                }
                refreshed = Some(tokio::time::Instant::now());
            }
            // Is anything due? A read, before any claim (a write). Targets with no room
            // now (their limit in flight, their circuit open) are left out.
            let now = self.engine.now();
            let skip = self.targets.skip_urls(now);
            let due = match self.store.notify_next_due(&skip).await {
                Ok(d) => d,
                Err(e) => {
                    outage_or_warn(e.is_unavailable(), &e, "notification outbox: next due");
                    Some(now.saturating_add(MICROS_PER_SEC))
                }
            };
            if due.is_none_or(|t| t > now) {
                // Sleep until a commit, a target has room again, the next due row or
                // probe, or shutdown.
                let next = match (due, self.targets.next_half_open(now)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let mut sleep_for = next.map_or(REFRESH, |t| micros_to_duration(t.saturating_sub(now)).min(REFRESH));
                if let Some(p) = self.cfg.fallback_poll {
                    sleep_for = sleep_for.min(p);
                }
                let sleep = tokio::time::sleep(sleep_for);
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = self.freed.notified() => {}
                    _ = sleep => {}
                    _ = shutdown.changed() => break,
                }
                continue;
            }
            // Claim only what can start now: claimed rows wait for nobody.
            let first = tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = shutdown.changed() => break,
            };
            let room = (permits.available_permits() + 1).min(BATCH);
            let now = self.engine.now();
            let shape = ClaimShape { per_url: Some(self.cfg.per_target.max(1) as i64), skip_urls: skip };
            let claimed = match self.store.notify_claim(now, now.saturating_add(lease), room as i64, &shape).await {
                Ok(c) => c,
                Err(e) => {
                    outage_or_warn(e.is_unavailable(), &e, "notification outbox: claim failed; retrying");
                    drop(first);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.changed() => break,
                    }
                }
            };
            if claimed.is_empty() {
                // Due, but another dispatcher holds it right now: do not spin.
                drop(first);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
                    _ = shutdown.changed() => break,
                }
            }
            self.start(claimed, first, &permits, &done_tx).await;
        }
        drop(done_tx);
        // Deliveries in flight finish (bounded by the HTTP timeout) and are recorded.
        let _ = tokio::time::timeout(self.cfg.http_timeout + Duration::from_secs(1), recorder).await;
    }

    /// Starts the claimed rows round-robin across their targets, each within its target's
    /// limit and circuit; the rest are given back (due now, or when the circuit half-opens).
    async fn start(
        self: &Arc<Self>,
        claimed: Vec<OutboxEntry>,
        first: tokio::sync::OwnedSemaphorePermit,
        permits: &Arc<Semaphore>,
        done_tx: &tokio::sync::mpsc::UnboundedSender<Done>,
    ) {
        let now = self.engine.now();
        let mut first = Some(first);
        let mut back: BTreeMap<Micros, Vec<i64>> = BTreeMap::new();
        for entry in round_robin(claimed) {
            let ticket = match self.targets.admit(&entry.notify_url, now) {
                targets::Admit::Go(t) => t,
                targets::Admit::Busy => {
                    self.counters.target_waits.inc();
                    back.entry(now).or_default().push(entry.id);
                    continue;
                }
                targets::Admit::Open(until) => {
                    back.entry(until).or_default().push(entry.id);
                    continue;
                }
            };
            let permit = match first.take() {
                Some(p) => p,
                None => match permits.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let me = self.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                let mut opened = ticket.opened.clone();
                let result = tokio::select! {
                    r = me.deliver(&entry) => r,
                    _ = opened.changed() => Err(Failure::Abandoned),
                };
                let not_before = me.finish(&ticket, &result).await;
                let _ = done.send((entry, result, not_before));
                drop(permit);
            });
        }
        for (at, ids) in back {
            if let Err(e) = self.store.notify_release(&ids, at).await {
                // Their lease runs out and they are claimed again.
                tracing::warn!(error = %e, n = ids.len(), "could not give back notifications");
            }
        }
    }

    /// Ends an attempt for its target's limit and circuit. Returns until when the circuit is
    /// open, if it is (no retry before then).
    async fn finish(&self, ticket: &targets::Ticket, result: &Result<(), Failure>) -> Option<Micros> {
        let outcome = match result {
            Ok(()) => targets::Outcome::Delivered,
            Err(Failure::Target(_)) => targets::Outcome::Failed,
            Err(_) => targets::Outcome::Neutral,
        };
        let now = self.engine.now();
        let f = self.targets.finish(ticket, outcome, now);
        if let Some((until, urls)) = &f.opened {
            self.counters.breaker_opens.inc();
            let secs = until.saturating_sub(now) / MICROS_PER_SEC;
            tracing::warn!(target = %ticket.key, cooldown_secs = secs, "notification target keeps failing: circuit open");
            // Its pending rows wait for the probe: nobody claims them meanwhile.
            if let Err(e) = self.store.notify_defer(urls, *until).await {
                tracing::warn!(error = %e, "could not defer a failing target's notifications");
            }
        }
        if f.closed {
            tracing::info!(target = %ticket.key, "notification target answers again: circuit closed");
        }
        if f.opened.is_some() || f.closed {
            self.counters.breakers_open.set(self.targets.not_closed() as u64);
        }
        if f.freed || f.closed {
            self.freed.notify_one();
        }
        self.targets.open_until(&ticket.key, now)
    }

    /// Records outcomes: deliveries in batches (one statement for many), failures one by one.
    async fn record(self: Arc<Self>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Done>) {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < 512 {
                match rx.try_recv() {
                    Ok(x) => batch.push(x),
                    Err(_) => break,
                }
            }
            let delivered: Vec<i64> = batch.iter().filter(|(_, r, _)| r.is_ok()).map(|(e, _, _)| e.id).collect();
            if !delivered.is_empty() {
                if let Err(e) = self.store.notify_delivered(&delivered).await {
                    // The lease runs out and they go again: at least once, never lost.
                    tracing::warn!(error = %e, n = delivered.len(), "could not record delivered notifications");
                }
                self.counters.delivered.add(delivered.len() as u64);
            }
            for (entry, result, not_before) in batch {
                let Err(f) = result else { continue };
                self.counters.failed_attempts.inc();
                let (why, park) = match f {
                    Failure::Retry(w) | Failure::Target(w) => {
                        let park = entry.attempts >= self.cfg.max_attempts;
                        (w, park)
                    }
                    Failure::Abandoned => {
                        let park = entry.attempts >= self.cfg.max_attempts;
                        ("given up: the target's circuit opened (it keeps failing)".to_string(), park)
                    }
                    Failure::Park(w) => (w, true),
                };
                let next = (!park).then(|| {
                    let retry = self.engine.now().saturating_add(self.backoff(entry.attempts));
                    not_before.map_or(retry, |t| t.max(retry))
                });
                if park {
                    self.counters.parked.inc();
                    tracing::warn!(id = entry.id, url = %redact_url(&entry.notify_url), attempts = entry.attempts, error = %why, "notification parked");
                } else {
                    tracing::info!(id = entry.id, url = %redact_url(&entry.notify_url), attempts = entry.attempts, error = %why, "notification failed; will retry");
                }
                if let Err(e) = self.store.notify_failed(entry.id, &why, next).await {
                    tracing::warn!(error = %e, "could not record a failed notification");
                }
                // Its retry may be due before whatever the dispatcher sleeps until.
                self.wake.notify_one();
            }
        }
    }

    /// Backoff after `attempts` failed attempts: min·2^(n-1), capped, ±20 % jitter.
    fn backoff(&self, attempts: i64) -> Micros {
        let exp = u32::try_from(attempts.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
        let base = self.cfg.min_backoff.saturating_mul(1u32 << exp.min(20)).min(self.cfg.max_backoff);
        let micros = i64::try_from(base.as_micros()).unwrap_or(i64::MAX);
        let jitter = rand::random::<f64>() * 0.4 - 0.2;
        micros.saturating_add((micros as f64 * jitter) as i64).max(1)
    }

    async fn deliver(&self, e: &OutboxEntry) -> Result<(), Failure> {
        let body = self.render(e);
        let url = e.notify_url.trim();
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            self.post(e, url, body).await
        } else if lower.starts_with("mailto:") {
            self.mail(e, &url["mailto:".len()..], body).await
        } else {
            Err(Failure::Park(format!("unsupported notify_url scheme: {}", redact_url(url))))
        }
    }

    async fn post(&self, e: &OutboxEntry, url: &str, body: String) -> Result<(), Failure> {
        let parsed = reqwest::Url::parse(url).map_err(|err| Failure::Park(format!("notify_url: {err}")))?;
        let host = parsed.host_str().ok_or_else(|| Failure::Park("notify_url has no host".into()))?;
        // IP literals never reach the resolver: check them here.
        self.cfg.policy.check_host(host).map_err(Failure::Park)?;
        let id = e.notification_id();
        let mut req = self
            .http
            .post(parsed)
            .header("Content-Type", "text/xml; charset=utf-8")
            .header("AQ-Notification-Id", &id)
            .header("AQ-Notification-Attempt", e.attempts.to_string());
        if let Some(secret) = e.secret.as_deref() {
            let t = self.engine.now() / MICROS_PER_SEC;
            req = req.header("AQ-Signature", signature(secret, t, &id, body.as_bytes()));
        }
        match req.body(body).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(Failure::Target(format!("HTTP {}", r.status()))),
            Err(err) => {
                if let Some(why) = denied(&err) {
                    return Err(Failure::Park(why));
                }
                Err(Failure::Target(error_chain(&err)))
            }
        }
    }

    async fn mail(&self, e: &OutboxEntry, target: &str, body: String) -> Result<(), Failure> {
        let Some((transport, from)) = &self.cfg.mail else {
            return Err(Failure::Park("mailto: notification, but no mail transport is configured".into()));
        };
        let target = target.trim_start_matches("//").trim();
        let address = if target.contains('@') {
            // Allowed at registration; a policy narrowed since parks it.
            match self.cfg.mail_policy.check(target, self.cfg.directory.as_deref()).await {
                Ok(()) => {}
                Err(policy::MailRefusal::NotAllowed(why)) => return Err(Failure::Park(why)),
                Err(policy::MailRefusal::Directory(err)) => return Err(Failure::Retry(format!("directory: {err}"))),
            }
            target.to_string()
        } else {
            let Some(dir) = &self.cfg.directory else {
                return Err(Failure::Park(format!("mailto:{target} is an alias, and no directory is configured")));
            };
            match dir.resolve_notification_alias(target).await {
                Ok(t) => t.trim_start_matches("mailto:").trim_start_matches("//").to_string(),
                Err(aqgate_directory::DirectoryError::NotFound(w)) => return Err(Failure::Park(w)),
                Err(err) => return Err(Failure::Retry(format!("directory: {err}"))),
            }
        };
        let id = e.notification_id();
        let from = from.parse().map_err(|err| Failure::Park(format!("notification From {from}: {err}")))?;
        let to = address.parse().map_err(|err| Failure::Park(format!("notification address {address}: {err}")))?;
        let subject = match e.consumer.as_str() {
            "" => format!("AQ notification: {}", self.queue_name(e)),
            c => format!("AQ notification: {} ({c})", self.queue_name(e)),
        };
        let content_type =
            ContentType::parse("text/xml; charset=utf-8").map_err(|err| Failure::Park(err.to_string()))?;
        let mut msg = Message::builder()
            .from(from)
            .to(to)
            .subject(subject)
            .message_id(Some(format!("<{id}@aqgate.notification>")))
            .header(content_type)
            .body(body)
            .map_err(|err| Failure::Park(format!("notification mail: {err}")))?;
        msg.headers_mut().insert_raw(HeaderValue::new(HeaderName::new_from_ascii_str("X-AQ-Notification-Id"), id));
        send_mail(transport, msg).await.map_err(|e| match e {
            // The relay refused it for good (5xx): the same mail would be refused again.
            SendError::Permanent(why) => Failure::Park(why),
            SendError::Transient(why) => Failure::Target(why),
        })
    }

    fn queue_name(&self, e: &OutboxEntry) -> String {
        self.engine.resolved().names.get(&e.queue).cloned().unwrap_or_else(|| format!("#{}", e.queue))
    }

    /// The AQXmlNotification document for one outbox entry.
    pub fn render(&self, e: &OutboxEntry) -> String {
        let resolved = self.engine.resolved();
        let queue = resolved.names.get(&e.queue).and_then(|n| resolved.catalog.queues.get(n));
        let default_eq = queue.map(|q| q.exception_queue.clone());
        let now = self.engine.now();
        let header = MessageHeader {
            message_id: Some(aqgate_proto::payload::hex_upper(&e.msgid)),
            correlation: e.corrid.clone(),
            expiration: e
                .expire_at
                .map(|x| x.saturating_sub(e.delay_until.unwrap_or(e.enq_time)).saturating_div(MICROS_PER_SEC)),
            delay: e.delay_until.map(|d| d.saturating_sub(e.enq_time).saturating_div(MICROS_PER_SEC)),
            priority: Some(e.priority),
            delivery_count: None,
            sender_id: e.sender.as_deref().and_then(agent_from_json),
            recipient_list: Vec::new(),
            message_state: Some(if e.delay_until.is_some_and(|t| t > now) { 1 } else { 0 }),
            exception_queue: e.exception_queue.clone().filter(|x| Some(x) != default_eq.as_ref()),
        };
        let n = Notification {
            destination: self.queue_name(e),
            consumer_name: (!e.consumer.is_empty()).then(|| e.consumer.clone()),
            messages: vec![header],
        };
        aqgate_proto::idap::write::write_response(&Envelope { headers: Vec::new(), body: Response::Notification(n) })
    }
}

/// The claimed rows in claim order within each target, taking one of each target in turn.
fn round_robin(claimed: Vec<OutboxEntry>) -> Vec<OutboxEntry> {
    let mut queues: Vec<(String, std::collections::VecDeque<OutboxEntry>)> = Vec::new();
    let n = claimed.len();
    for e in claimed {
        let key = targets::target_of(&e.notify_url);
        match queues.iter_mut().find(|(k, _)| *k == key) {
            Some((_, q)) => q.push_back(e),
            None => queues.push((key, std::collections::VecDeque::from([e]))),
        }
    }
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        for (_, q) in queues.iter_mut() {
            if let Some(e) = q.pop_front() {
                out.push(e);
            }
        }
    }
    out
}

/// `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<notification id>.<body>")>`.
pub fn signature(secret: &str, t: i64, id: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(t.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(id.as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("t={t},v1={}", hex::encode(ctx.sign().as_ref()))
}

/// Checks an `AQ-Signature` header value (for receivers and tests): the HMAC matches and
/// the timestamp is within `tolerance_secs` of `now_secs`.
pub fn verify_signature(secret: &str, header: &str, id: &str, body: &[u8], now_secs: i64, tolerance_secs: i64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", x)) => t = x.parse::<i64>().ok(),
            Some(("v1", x)) => v1 = hex::decode(x).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return false };
    if (now_secs - t).abs() > tolerance_secs {
        return false;
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let msg = [t.to_string().as_bytes(), b".", id.as_bytes(), b".", body].concat();
    ring::hmac::verify(&key, &msg, &v1).is_ok()
}

fn micros_to_duration(m: Micros) -> Duration {
    Duration::from_micros(u64::try_from(m).unwrap_or(0))
}

/// A URL for logs: no user info, no query string (they may carry tokens).
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.scheme() == "http" || u.scheme() == "https" => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            if u.query().is_some() {
                u.set_query(Some("redacted"));
            }
            u.to_string()
        }
        _ => url.chars().take(200).collect(),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// The resolver refused every address of the target (policy), as opposed to a lookup or
/// network failure.
fn denied(e: &reqwest::Error) -> Option<String> {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(x) = src {
        if let Some(d) = x.downcast_ref::<Denied>() {
            return Some(d.0.clone());
        }
        src = x.source();
    }
    None
}

#[derive(Debug)]
struct Denied(String);

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Denied {}

/// Resolves names and keeps only the addresses the policy allows, so the connection can
/// only go where the policy says (checked after DNS, on every delivery). The HTTP
/// forwarder of propagation jobs connects through it too.
pub struct PolicyResolver {
    pub policy: Arc<Policy>,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let trusted = policy.host_trusted(&host);
            let allowed: Vec<SocketAddr> =
                addrs.iter().copied().filter(|a| trusted || policy.ip_allowed(a.ip())).collect();
            if allowed.is_empty() {
                let err: Box<dyn std::error::Error + Send + Sync> = Box::new(Denied(format!(
                    "notification target {host} resolves only to addresses that are not allowed ({}); add an allow rule (--notify-allow)",
                    addrs.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
                )));
                return Err(err);
            }
            let it: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(it)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_round_trip_and_tamper() {
        let s = signature("s3cret", 1_700_000_000, "ID-1", b"<x/>");
        assert!(s.starts_with("t=1700000000,v1="));
        assert!(verify_signature("s3cret", &s, "ID-1", b"<x/>", 1_700_000_010, 300));
        assert!(!verify_signature("other", &s, "ID-1", b"<x/>", 1_700_000_010, 300), "wrong secret");
        assert!(!verify_signature("s3cret", &s, "ID-2", b"<x/>", 1_700_000_010, 300), "id is signed");
        assert!(!verify_signature("s3cret", &s, "ID-1", b"<y/>", 1_700_000_010, 300), "body is signed");
        assert!(!verify_signature("s3cret", &s, "ID-1", b"<x/>", 1_700_001_000, 300), "stale");
        assert!(!verify_signature("s3cret", "garbage", "ID-1", b"<x/>", 1_700_000_000, 300));
    }

    #[test]
    fn redaction_hides_credentials_and_query() {
        assert_eq!(redact_url("https://u:p@h.example/x?token=abc"), "https://h.example/x?redacted");
        assert_eq!(redact_url("mailto:a@b.example"), "mailto:a@b.example");
    }
}
