//! Another aqgate as a propagation destination, over IDAP: one AQXmlSend with a trailing
//! commit per message, as the job's remote agent, with
//! `Idempotency-Key: prop-<job>-<source message id>`. The requests go through
//! `aqgate_client` (one POST each, no session, no retry of its own: the job retries), and
//! the answers are classified here.
//!
//! Exactly once: the local batch (the receive of that one message) commits only after the
//! remote answered the send. If this process dies in between, the message goes back to the
//! source and is sent again with the same key; the remote, which recorded the key with the
//! send in one transaction, answers the recorded response and enqueues nothing (within its
//! `--idempotency-window`, 24 h by default). A request the remote is performing at that
//! moment (409) is a transient failure, tried again. A re-sent message carries what then
//! remains of its delay and expiration, so its body can differ from the first send's: the
//! remote's 24051 (the key used with another request, HTTP 422) says that the first was
//! performed, and the message counts as sent.
//!
//! Outcomes: an IDAP response of the send is success; a Fault whose code says the message
//! can never be taken (no such queue, payload type, not permitted, invalid, too large: 413
//! or 25443) is permanent (the exception queue); anything else — connection refused, a
//! timeout, 5xx, 401 (credentials are a configuration matter), 25207 (the queue closed for
//! enqueue there, until an operator opens it) — is transient.
//!
//! [`Spaces`] sends for synchronous remote queue spaces (see
//! `aqgate_core::engine::synchronous`): all messages of a client's send in one AQXmlSend
//! with a trailing commit, under a key the engine derives from the client's, and the
//! remote's answer classified as Tuxedo's domain gateway maps a remote status
//! ([`RemoteRefusal`]): a request that never went out (connection refused, no such host,
//! no connection within 10 s) is not performed; one that went out and got no answer may
//! have been.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aqgate_client::client::{Client, Config, PostError, Reply};
use aqgate_client::request;
use aqgate_core::error::code;
use aqgate_core::propagation::RemoteDef;
use aqgate_core::remote::{RemoteRefusal, RemoteSend, RemoteSpaces};
use aqgate_proto::idap::{self, Limits, Message, Response};

pub struct Remote {
    client: Client,
}

pub enum Sent {
    Done,
    Permanent(String),
    Transient(String),
}

impl Remote {
    /// The remote's client; the password is read now, from the environment or the file.
    pub fn new(def: &RemoteDef) -> Result<Self, String> {
        let password = super::secret(def.password_env.as_deref(), def.password_file.as_deref())?
            .ok_or("no password_env or password_file")?;
        let mut config = Config::new(def.url.clone(), def.agent.clone(), password);
        if let Some(f) = &def.ca_file {
            config.ca_pem = Some(std::fs::read(f).map_err(|e| format!("{f}: {e}"))?);
        }
        // Every send commits there and is one request; the job retries, under the same key.
        config.sessions = false;
        config.attempts = 1;
        let client = Client::new(config).map_err(|e| match &def.ca_file {
            Some(f) if !e.starts_with("HTTP client") => format!("{f}: {e}"),
            _ => e,
        })?;
        Ok(Self { client })
    }

    fn url(&self) -> &str {
        self.client.url()
    }

    /// Sends `message` to `queue` there, under the key for (`job`, `source_id`).
    pub async fn send(&self, job: &str, source_id: &str, queue: &str, message: Message) -> Sent {
        let body = request::document(request::send(queue, vec![message], true));
        let r = self.client.post(body, Some(&format!("prop-{job}-{source_id}"))).await;
        let Reply { status, body: text, .. } = match r {
            Ok(r) => r,
            Err(PostError::NotSent(e) | PostError::NoAnswer(e)) => {
                return Sent::Transient(format!("{}: {e}", self.url()));
            }
            Err(PostError::Reading(e)) => return Sent::Transient(format!("{}: reading the answer: {e}", self.url())),
        };
        if status == 413 {
            return Sent::Permanent(format!("{}: 413, the message is larger than the remote takes", self.url()));
        }
        if let Ok(Response::Fault(f)) = idap::parse_response(&text, &Limits::default()).map(|e| e.body)
            && [code::IDEMPOTENCY_MISMATCH, code::IDEMPOTENCY_NOT_KEPT].contains(&f.code)
        {
            // The key was recorded with another body: an earlier send of this message, which
            // was performed (the remote records no Fault), with more of its delay or
            // expiration left then. The message is there.
            tracing::info!(url = %self.url(), message = %source_id,
                "the remote performed an earlier send of this message; not sent again");
            return Sent::Done;
        }
        if status != 200 {
            let snippet: String = String::from_utf8_lossy(&text).chars().take(200).collect();
            return Sent::Transient(format!("{}: HTTP {status}: {}", self.url(), snippet.trim()));
        }
        match idap::parse_response(&text, &Limits::default()).map(|e| e.body) {
            Ok(Response::Send(..)) => Sent::Done,
            Ok(Response::Fault(f)) => {
                let why = format!("remote fault {}: {}", f.code, f.message);
                if PERMANENT.contains(&f.code) { Sent::Permanent(why) } else { Sent::Transient(why) }
            }
            Ok(other) => Sent::Transient(format!("{}: unexpected answer {:?}", self.url(), other_name(&other))),
            Err(e) => Sent::Transient(format!("{}: the answer is not IDAP: {e}", self.url())),
        }
    }
}

impl Remote {
    /// Sends all of `send`'s messages in one request that commits there.
    pub async fn send_all(&self, send: &RemoteSend) -> Result<Vec<String>, RemoteRefusal> {
        let body = request::document(request::send(&send.queue, send.messages.clone(), true));
        let Reply { status, body: text, .. } = match self.client.post(body, Some(&send.key)).await {
            Ok(r) => r,
            Err(PostError::NotSent(e)) => return Err(RemoteRefusal::Unreachable(bounded(&e))),
            Err(PostError::NoAnswer(e)) => return Err(RemoteRefusal::InDoubt(bounded(&e))),
            Err(PostError::Reading(e)) => {
                return Err(RemoteRefusal::InDoubt(format!("reading the answer: {}", bounded(&e))));
            }
        };
        let answer = idap::parse_response(&text, &Limits::default()).map(|e| e.body);
        match (status, answer) {
            (200, Ok(Response::Send(_, Some(res)))) => Ok(res.message_ids),
            (_, Ok(Response::Fault(f))) => Err(classify(status, f.code, &f.message)),
            (413, _) => Err(RemoteRefusal::NoSpace("HTTP 413, the request is larger than the remote takes".into())),
            (_, _) => {
                let snippet: String = String::from_utf8_lossy(&text).chars().take(200).collect();
                let why = format!("HTTP {status}: {}", bounded(snippet.trim()));
                // A server error that is no IDAP answer comes from something between (a
                // proxy's 502 or 504): the remote may have committed before it.
                if status >= 500 { Err(RemoteRefusal::InDoubt(why)) } else { Err(RemoteRefusal::System(why)) }
            }
        }
    }
}

/// The class of a remote fault (the domain gateway's diagnostics).
fn classify(status: u16, fault: i32, message: &str) -> RemoteRefusal {
    let why = format!("remote fault {fault}: {}", bounded(message));
    match fault {
        code::NO_SUCH_QUEUE => RemoteRefusal::NoSuchQueue(why),
        code::INVALID_VALUE
        | code::PAYLOAD_MISMATCH
        | code::NOT_PERMITTED
        | code::AGENT_NOT_ENABLED
        | code::NO_RECIPIENTS
        | code::NOT_MULTI_CONSUMER
        | code::TRANSFORMATION
        | code::CONDITION_BUDGET => RemoteRefusal::Invalid(why),
        idap::CodecError::TOO_LARGE
        | code::STORE_FULL
        | code::SESSION_LIMIT
        | code::FLOW_CONTROL
        | code::IDEMPOTENCY_LIMIT => RemoteRefusal::NoSpace(why),
        // The key was used before (with another body, or its answer was not kept): the
        // remote performed that request.
        code::IDEMPOTENCY_MISMATCH | code::IDEMPOTENCY_NOT_KEPT => RemoteRefusal::Performed(why),
        code::IDEMPOTENCY_IN_PROGRESS => RemoteRefusal::InDoubt(why),
        code::INTERNAL if message.contains("may or may not") => RemoteRefusal::InDoubt(why),
        _ if status == 413 => RemoteRefusal::NoSpace(why),
        _ => RemoteRefusal::System(why),
    }
}

/// At most 300 characters of a remote's text.
fn bounded(s: &str) -> String {
    let mut out: String = s.chars().take(300).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// The clients of the synchronous remote queue spaces, one per space, made at its first
/// send (and again when the space's definition changed).
#[derive(Default)]
pub struct Spaces {
    clients: Mutex<HashMap<String, (RemoteDef, Arc<Remote>)>>,
}

impl std::fmt::Debug for Spaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spaces").finish_non_exhaustive()
    }
}

impl Spaces {
    fn client(&self, send: &RemoteSend) -> Result<Arc<Remote>, RemoteRefusal> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((def, c)) = clients.get(&send.space)
            && *def == send.login
        {
            return Ok(c.clone());
        }
        let c = Arc::new(
            Remote::new(&send.login)
                .map_err(|e| RemoteRefusal::System(format!("the space's login: {}", bounded(&e))))?,
        );
        // Bounded by the topology's spaces: one entry per space name.
        clients.insert(send.space.clone(), (send.login.clone(), c.clone()));
        Ok(c)
    }
}

#[async_trait::async_trait]
impl RemoteSpaces for Spaces {
    async fn send(&self, send: &RemoteSend) -> Result<Vec<String>, RemoteRefusal> {
        self.client(send)?.send_all(send).await
    }
}

/// Remote fault codes after which the same message is never taken.
const PERMANENT: &[i32] = &[
    code::NO_SUCH_QUEUE,
    code::PAYLOAD_MISMATCH,
    code::NOT_PERMITTED,
    code::INVALID_VALUE,
    code::NO_RECIPIENTS,
    code::NOT_MULTI_CONSUMER,
    // The send is one message: too large for the remote's request limits is the message.
    idap::CodecError::TOO_LARGE,
];

fn other_name(r: &Response) -> &'static str {
    match r {
        Response::Publish(..) => "AQXmlPublishResponse",
        Response::Receive(..) | Response::Listen(..) => "AQXmlReceiveResponse",
        Response::Register(..) => "AQXmlRegisterResponse",
        Response::Commit(..) => "AQXmlCommitResponse",
        Response::Rollback(..) => "AQXmlRollbackResponse",
        Response::Notification(..) => "AQXmlNotification",
        Response::Send(..) | Response::Fault(..) => "response",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_faults_map_to_the_domain_gateways_classes() {
        let class = |status: u16, fault: i32, text: &str| match classify(status, fault, text) {
            RemoteRefusal::NoSuchQueue(_) => "QMEBADQUEUE",
            RemoteRefusal::Invalid(_) => "QMEINVAL",
            RemoteRefusal::NoSpace(_) => "QMENOSPACE",
            RemoteRefusal::System(_) => "QMESYSTEM",
            RemoteRefusal::Unreachable(_) => "TPENOENT",
            RemoteRefusal::InDoubt(_) => "in doubt",
            RemoteRefusal::Performed(_) => "performed",
        };
        for (status, fault, text, want) in [
            (200, code::NO_SUCH_QUEUE, "queue X does not exist", "QMEBADQUEUE"),
            (200, code::NOT_PERMITTED, "not permitted", "QMEINVAL"),
            (200, code::PAYLOAD_MISMATCH, "RAW", "QMEINVAL"),
            (200, code::NO_RECIPIENTS, "none", "QMEINVAL"),
            (200, code::INVALID_VALUE, "bad", "QMEINVAL"),
            (200, idap::CodecError::TOO_LARGE, "too large", "QMENOSPACE"),
            (200, code::STORE_FULL, "disk full", "QMENOSPACE"),
            (503, code::SESSION_LIMIT, "sessions", "QMENOSPACE"),
            (200, code::FLOW_CONTROL, "flow", "QMENOSPACE"),
            (413, code::INVALID_VALUE + 1, "?", "QMENOSPACE"),
            (200, code::ENQUEUE_DISABLED, "disabled", "QMESYSTEM"),
            (200, code::INTERNAL, "internal error", "QMESYSTEM"),
            (200, code::INTERNAL, "the request may or may not have been performed", "in doubt"),
            (409, code::IDEMPOTENCY_IN_PROGRESS, "now", "in doubt"),
            (422, code::IDEMPOTENCY_MISMATCH, "another request", "performed"),
        ] {
            assert_eq!(class(status, fault, text), want, "{status} {fault} {text}");
        }
        let long = "x".repeat(1000);
        let RemoteRefusal::System(why) = classify(200, 1, &long) else { panic!("QMESYSTEM") };
        assert!(why.chars().count() < 340, "bounded: {}", why.len());
    }
}
