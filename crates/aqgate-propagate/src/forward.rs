//! An HTTP service as the end of a job (Tuxedo's TMQFORWARD): each message is POSTed to the
//! service, and the job commits its dequeue when the service answers 2xx.
//!
//! - The body is the payload element (`application/xml`, e.g. `<raw>0A1B</raw>` or
//!   `<ORDER_TYP>…</ORDER_TYP>`) or, with `format = "json"`, `{"message_id", "queue",
//!   "correlation", "priority", "delivery_count", "payload"}` with the payload as the hex
//!   of a RAW message or the XML text of any other.
//! - Headers: `AQ-Message-Id`, `AQ-Queue`, `AQ-Priority`, `AQ-Delivery-Count`,
//!   `AQ-Correlation` (when it is printable), and with `secret_env`
//!   `AQ-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<message id>.<body>")>`
//!   as notifications have.
//! - 2xx: the dequeue commits; with `reply_queue` the response body is enqueued there (RAW,
//!   the source's correlation) in the same transaction.
//! - Anything else: with `failure_queue` the answer's body is enqueued there (committed on
//!   its own), and the dequeue is rolled back, so the message's retry count grows and after
//!   the queue's `max_retries` the engine moves it to its exception queue; the job waits
//!   its backoff before the next attempt.
//! - The target must pass the notification allowlist (`--notify-allow`), checked after DNS
//!   on every connection; redirects are not followed.

use std::sync::Arc;
use std::time::Duration;

use aqgate_core::engine::{Engine, JobTally, Session};
use aqgate_core::error::{AqError, code};
use aqgate_core::propagation::{ForwardDef, PropagationInfo};
use aqgate_proto::idap::{self, MessageHeader, Request, Response};

use super::{Moved, Stats, rolled_back, send};

pub struct Forwarder {
    def: ForwardDef,
    http: reqwest::Client,
    secret: Option<String>,
}

impl Forwarder {
    pub fn new(engine: &Engine, def: &ForwardDef) -> Result<Self, String> {
        let policy = engine.config().notify_policy.clone();
        let host = aqgate_core::notify_policy::http_target_host(&def.url)?;
        policy.check_host(&host)?;
        let secret = match &def.secret_env {
            Some(v) => Some(std::env::var(v).map_err(|_| format!("the environment variable {v} is not set"))?),
            None => None,
        };
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .dns_resolver(Arc::new(aqgate_notify::PolicyResolver { policy }))
            .user_agent(concat!("aqgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self { def: def.clone(), http, secret })
    }
}

fn render(format: &str, queue: &str, m: &idap::Message) -> (Vec<u8>, &'static str) {
    let mut xml = String::new();
    idap::write_node(&mut xml, &m.payload);
    if format == "json" {
        let h = &m.header;
        let payload = if m.payload.name == "raw" { m.payload.text() } else { xml };
        let v = serde_json::json!({
            "message_id": h.message_id,
            "queue": queue,
            "correlation": h.correlation,
            "priority": h.priority,
            "delivery_count": h.delivery_count,
            "payload": payload,
        });
        (v.to_string().into_bytes(), "application/json")
    } else {
        (xml.into_bytes(), "application/xml")
    }
}

/// A RAW message of `body` with `correlation`, to enqueue to a reply or failure queue.
fn raw_message(body: &[u8], correlation: Option<String>) -> idap::Message {
    idap::Message {
        number: Some(1),
        header: MessageHeader { correlation, ..MessageHeader::default() },
        payload: idap::XmlNode {
            name: "raw".into(),
            attrs: Vec::new(),
            children: vec![idap::XmlChild::Text(aqgate_proto::payload::hex_upper(body))],
        },
    }
}

pub async fn move_one(engine: &Engine, job: &PropagationInfo, f: &Forwarder, stats: &Stats) -> Result<Moved, AqError> {
    let mut session = Session::new(&job.agent, engine.now());
    let m = match super::waiting_receive(engine, &mut session, job, stats).await {
        Ok(Response::Receive(_, Some(r))) => r.messages.into_iter().next(),
        Ok(_) => None,
        Err(e) if e.code == code::NO_MESSAGE => None,
        Err(e) => return Err(rolled_back(engine, &mut session, e).await),
    };
    let Some(m) = m else { return Ok(Moved::Done(0)) };
    let h = &m.header;
    let id = h.message_id.clone().unwrap_or_default();
    let (body, content_type) = render(&f.def.format, &job.source, &m);
    let mut req = f
        .http
        .post(&f.def.url)
        .header("content-type", content_type)
        .header("AQ-Message-Id", &id)
        .header("AQ-Queue", &job.source)
        .header("AQ-Priority", h.priority.unwrap_or(1).to_string())
        .header("AQ-Delivery-Count", h.delivery_count.unwrap_or(0).to_string());
    if let Some(c) = &h.correlation
        && reqwest::header::HeaderValue::from_str(c).is_ok()
    {
        req = req.header("AQ-Correlation", c);
    }
    if let Some(secret) = &f.secret {
        let t = engine.now() / 1_000_000;
        req = req.header("AQ-Signature", aqgate_notify::signature(secret, t, &id, &body));
    }
    let answer = match req.body(body).send().await {
        Ok(r) => {
            let status = r.status();
            match r.bytes().await {
                Ok(b) => Ok((status, b)),
                Err(e) => Err(format!("reading the answer: {e}")),
            }
        }
        Err(e) => Err(e.without_url().to_string()),
    };
    match answer {
        Ok((status, reply)) if status.is_success() => {
            session.tally = Some(JobTally::moved(&job.name, 1));
            let done = match &f.def.reply_queue {
                Some(q) => {
                    engine.execute(&mut session, send(q, vec![raw_message(&reply, h.correlation.clone())])).await
                }
                None => engine.execute(&mut session, Request::Commit).await,
            };
            if let Err(e) = done {
                let e = AqError { message: format!("after the service took message {id}: {}", e.message), ..e };
                return Err(rolled_back(engine, &mut session, e).await);
            }
            stats.moved(1, engine.now());
            Ok(Moved::Done(1))
        }
        Ok((status, reply)) => {
            if let Some(q) = &f.def.failure_queue {
                let mut s = Session::new(&job.agent, engine.now());
                if let Err(e) = engine.execute(&mut s, send(q, vec![raw_message(&reply, h.correlation.clone())])).await
                {
                    tracing::warn!(job = %job.name, error = %e.message, "enqueueing the failure answer failed");
                }
            }
            let e = AqError::server(code::INTERNAL, format!("{}: HTTP {status} for message {id}", f.def.url));
            Err(rolled_back(engine, &mut session, e).await)
        }
        Err(why) => {
            let e = AqError::server(code::INTERNAL, format!("{}: {why} (message {id})", f.def.url));
            Err(rolled_back(engine, &mut session, e).await)
        }
    }
}
