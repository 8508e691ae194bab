//! The publish form (operator, on a queue the caller may enqueue to):
//! `GET /console/queues/{queue}/publish` shows it; `POST` with `action=preview` shows the
//! IDAP document it would send, with `action=send` sends it. The document is built by
//! the protocol's writer (every value escaped), parsed back as the servlet parses a
//! request, and performed by the engine as the caller's agent in a session of its own,
//! committed with the request (`<AQXmlCommit/>`): the servlet's path, with the engine's
//! checks (privileges, header fields, recipients). RAW payloads are typed as UTF-8 text
//! or as hex; JMS text as its text; other payload types are not published here.

use askama::Template;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use aqgate_core::topology::{ConsoleRole, QueueInfo};
use aqgate_proto::idap::{
    self, AgentRef, DeliveryMode, Destination, EnqueueRequest, Envelope, Message, MessageHeader, ProducerOptions,
    Request as IdapRequest, Response as IdapResponse, Visibility, XmlNode,
};
use aqgate_proto::payload::PayloadKind;

use crate::Console;
use crate::answer::{bad_request, forbidden, html};
use crate::caller::Caller;
use crate::messages::enc;
use crate::pages::{Nav, enqueuable};

/// The most a publish form's body may be.
const FORM_MAX: usize = 256 * 1024;
/// Recipients a form may name.
const RECIPIENTS_MAX: usize = 32;
/// The longest correlation and recipient name.
const NAME_MAX: usize = 128;

/// The form as typed.
#[derive(Default)]
struct Form {
    payload: String,
    hex: bool,
    priority: String,
    delay: String,
    expiration: String,
    correlation: String,
    recipients: String,
}

#[derive(Template)]
#[template(path = "publish.html")]
struct Publish {
    nav: Nav,
    queue: String,
    payload_type: &'static str,
    raw: bool,
    multi: bool,
    f: Form,
    xml: Option<String>,
    /// The `aqgate send` command line that sends the same message ("Copy as CLI").
    cli: Option<String>,
    sent: Option<String>,
    error: Option<String>,
    messages: String,
}

/// `aqgate send` (docs/client.md) with the form's message: a RAW payload as hex, a JMS
/// text as the text; the fields left empty left out.
fn send_line(agent: &str, q: &QueueInfo, f: &Form) -> String {
    let mut args: Vec<String> = vec!["send".into(), "--user".into(), agent.into(), q.name.clone()];
    if payload_type(q).is_some_and(|(_, raw)| raw) {
        let hex = if f.hex { f.payload.trim().to_ascii_uppercase() } else { hex::encode_upper(f.payload.as_bytes()) };
        args.extend(["--raw-hex".into(), hex]);
    } else {
        args.push(f.payload.clone());
    }
    for (flag, v) in [
        ("--priority", &f.priority),
        ("--delay", &f.delay),
        ("--expiration", &f.expiration),
        ("--correlation", &f.correlation),
    ] {
        if !v.trim().is_empty() {
            args.extend([flag.to_string(), v.trim().to_string()]);
        }
    }
    for r in f.recipients.split([',', ' ']).filter(|r| !r.is_empty()) {
        args.extend(["--recipient".into(), r.to_string()]);
    }
    let mut line = String::from("aqgate");
    for a in &args {
        line.push(' ');
        line.push_str(&crate::cli::quote(a));
    }
    line
}

fn payload_type(q: &QueueInfo) -> Option<(&'static str, bool)> {
    match q.payload {
        PayloadKind::Raw => Some(("RAW", true)),
        PayloadKind::JmsText => Some(("SYS.AQ$_JMS_TEXT_MESSAGE", false)),
        _ => None,
    }
}

/// The refusal unless the caller is an operator who may enqueue to `queue` of a payload
/// type the form can write; else the queue.
fn check(c: &Console, who: &Caller, queue: &str) -> Result<QueueInfo, Box<Response>> {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return Err(Box::new(r));
    }
    if !enqueuable(c, &who.agent, queue) {
        return Err(Box::new(forbidden("You may not enqueue to this queue.")));
    }
    let resolved = c.http.engine.resolved();
    let q = resolved.catalog.queue(queue).cloned().ok_or_else(|| Box::new(bad_request("No such queue.")))?;
    if payload_type(&q).is_none() {
        return Err(Box::new(bad_request(
            "The form publishes RAW and JMS text messages only; this queue's payload type is another.",
        )));
    }
    Ok(q)
}

fn page(who: &Caller, q: &QueueInfo, f: Form) -> Publish {
    let (payload_type, raw) = payload_type(q).unwrap_or(("", false));
    Publish {
        nav: Nav::of(who),
        queue: q.name.clone(),
        payload_type,
        raw,
        multi: q.multi_consumer,
        f,
        xml: None,
        cli: None,
        sent: None,
        error: None,
        messages: format!("/console/queues/{}/messages", enc(&q.name)),
    }
}

pub(crate) async fn form(State(c): State<Console>, who: Caller, Path(queue): Path<String>) -> Response {
    match check(&c, &who, &queue) {
        Ok(q) => html(StatusCode::OK, &page(&who, &q, Form::default())),
        Err(r) => *r,
    }
}

fn number(s: &str, name: &str) -> Result<Option<i64>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<i64>().map(Some).map_err(|_| format!("{name}: a whole number, not {s:?}"))
}

/// The request the form asks for, or what is wrong with it.
fn request(q: &QueueInfo, f: &Form) -> Result<IdapRequest, String> {
    let payload = if q.payload == PayloadKind::Raw {
        let bytes = if f.hex {
            let digits: String = f.payload.chars().filter(|c| !c.is_whitespace()).collect();
            hex::decode(&digits).map_err(|_| "payload: not hexadecimal (pairs of 0-9, A-F)".to_string())?
        } else {
            f.payload.as_bytes().to_vec()
        };
        XmlNode::with_text("raw", hex::encode_upper(bytes))
    } else {
        let mut n = XmlNode::new("jms_text_message");
        n.push(XmlNode::with_text("text_data", f.payload.clone()));
        n
    };
    let correlation = Some(f.correlation.trim().to_string()).filter(|s| !s.is_empty());
    if correlation.as_ref().is_some_and(|c| c.len() > NAME_MAX) {
        return Err(format!("correlation: at most {NAME_MAX} bytes"));
    }
    let recipients: Vec<String> =
        f.recipients.split([',', ' ', '\n', '\r', '\t']).filter(|s| !s.is_empty()).map(str::to_string).collect();
    if recipients.len() > RECIPIENTS_MAX {
        return Err(format!("recipients: at most {RECIPIENTS_MAX}"));
    }
    if recipients.iter().any(|r| r.len() > NAME_MAX) {
        return Err(format!("recipients: each at most {NAME_MAX} bytes"));
    }
    let header = MessageHeader {
        correlation,
        priority: number(&f.priority, "priority")?,
        delay: number(&f.delay, "delay")?,
        expiration: number(&f.expiration, "expiration")?,
        recipient_list: recipients.into_iter().map(|r| AgentRef { name: Some(r), ..AgentRef::default() }).collect(),
        ..MessageHeader::default()
    };
    let e = EnqueueRequest {
        producer: ProducerOptions {
            destination: Destination::database(q.name.clone()),
            visibility: Visibility::OnCommit,
            transformation: None,
            delivery_mode: DeliveryMode::Persistent,
        },
        messages: vec![Message { number: Some(1), header, payload }],
        commit: true,
    };
    Ok(if q.multi_consumer { IdapRequest::Publish(e) } else { IdapRequest::Send(e) })
}

/// `POST /console/queues/{queue}/publish`: the form's fields (`payload`, `encoding`
/// text|hex, `priority`, `delay`, `expiration`, `correlation`, `recipients`, `action`
/// preview|send).
pub(crate) async fn post(State(c): State<Console>, who: Caller, Path(queue): Path<String>, req: Request) -> Response {
    let q = match check(&c, &who, &queue) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    let Ok(body) = axum::body::to_bytes(req.into_body(), FORM_MAX).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the form is too large\n").into_response();
    };
    let mut f = Form::default();
    let mut send = false;
    for (k, v) in url::form_urlencoded::parse(&body) {
        match k.as_ref() {
            "payload" => f.payload = v.into_owned(),
            "encoding" => f.hex = v == "hex",
            "priority" => f.priority = v.into_owned(),
            "delay" => f.delay = v.into_owned(),
            "expiration" => f.expiration = v.into_owned(),
            "correlation" => f.correlation = v.into_owned(),
            "recipients" => f.recipients = v.into_owned(),
            "action" => send = v == "send",
            _ => {}
        }
    }
    let built = request(&q, &f);
    let cli = send_line(&who.agent.name, &q, &f);
    let mut p = page(&who, &q, f);
    let idap = match built {
        Ok(r) => r,
        Err(e) => {
            p.error = Some(e);
            return html(StatusCode::BAD_REQUEST, &p);
        }
    };
    let xml = idap::write_request(&Envelope { headers: Vec::new(), body: idap });
    p.xml = Some(xml.clone());
    p.cli = Some(cli);
    if !send {
        return html(StatusCode::OK, &p);
    }
    // As the servlet takes it: parsed within its limits, performed in a session of the
    // caller's agent.
    let envelope = match idap::parse_request(xml.as_bytes(), &c.http.limits) {
        Ok(e) => e,
        Err(e) => {
            p.error = Some(format!("the request does not parse: {e}"));
            return html(StatusCode::BAD_REQUEST, &p);
        }
    };
    let engine = &c.http.engine;
    let mut session = aqgate_core::engine::Session::new(&who.agent.name, engine.now());
    match engine.execute_envelope(&mut session, envelope).await {
        Ok(IdapResponse::Send(_, Some(r)) | IdapResponse::Publish(_, Some(r))) => {
            tracing::info!(agent = %who.agent.name, queue = %q.name, "console: message published");
            p.sent = Some(r.message_ids.join(", "));
            html(StatusCode::OK, &p)
        }
        Ok(IdapResponse::Fault(f)) => {
            p.error = Some(format!("refused: {} {}", f.code, f.message));
            html(StatusCode::BAD_REQUEST, &p)
        }
        Ok(_) => {
            p.error = Some("the engine answered without message ids".into());
            html(StatusCode::INTERNAL_SERVER_ERROR, &p)
        }
        Err(e) => {
            p.error = Some(format!("refused: ORA-{:05} {}", e.code, e.message));
            let status = if e.kind == aqgate_proto::idap::FaultKind::Client {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            html(status, &p)
        }
    }
}
