//! Writing IDAP documents: server responses (including `Fault` and `AQXmlNotification`) and
//! client requests.
//!
//! The output follows the element structure of Oracle's documented examples: an `Envelope` in the
//! default namespace [`ENVELOPE_NS`], an optional `Header`, a `Body` whose method element
//! re-declares the default namespace as [`ACCESS_NS`]. Structure is indented for readability;
//! payloads and header entries are written verbatim by [`write_node`], without added
//! whitespace, so their text survives a round trip exactly.
//!
//! Optional values are written only when present, and enumerations only when they differ
//! from the schema default, so [`super::parse`] reads back what was written. Scalar text is
//! trimmed on parsing, so strings with surrounding whitespace do not round-trip (payload text
//! does).

use std::fmt::Display;

use super::model::*;
use crate::xml::{escape_attr, escape_text};

/// Writes a response document (UTF-8).
pub fn write_response(resp: &Envelope<Response>) -> String {
    let mut w = Writer::new(&resp.headers);
    match &resp.body {
        Response::Send(status, result) => {
            w.open_ns("AQXmlSendResponse", ACCESS_NS);
            w.status(status);
            if let Some(r) = result {
                w.enqueue_result("send_result", r);
            }
            w.close("AQXmlSendResponse");
        }
        Response::Publish(status, result) => {
            w.open_ns("AQXmlPublishResponse", ACCESS_NS);
            w.status(status);
            if let Some(r) = result {
                w.enqueue_result("publish_result", r);
            }
            w.close("AQXmlPublishResponse");
        }
        Response::Receive(status, result) => {
            w.open_ns("AQXmlReceiveResponse", ACCESS_NS);
            w.status(status);
            if let Some(r) = result {
                w.open("receive_result");
                w.leaf("destination", &r.destination);
                w.message_set(&r.messages);
                w.close("receive_result");
            }
            w.close("AQXmlReceiveResponse");
        }
        Response::Listen(status, result) => {
            w.open_ns("AQXmlReceiveResponse", ACCESS_NS);
            w.status(status);
            if let Some(r) = result {
                w.open_aqgate("listen_result");
                w.leaf("aqgate:destination", &r.destination);
                w.opt_leaf("aqgate:consumer_name", r.consumer_name.as_ref());
                w.close("aqgate:listen_result");
            }
            w.close("AQXmlReceiveResponse");
        }
        Response::Register(status) => w.status_only("AQXmlRegisterResponse", status),
        Response::Commit(status) => w.status_only("AQXmlCommitResponse", status),
        Response::Rollback(status) => w.status_only("AQXmlRollbackResponse", status),
        Response::Notification(n) => {
            w.open_ns("AQXmlNotification", ACCESS_NS);
            w.open("notification_options");
            w.leaf("destination", &n.destination);
            w.opt_leaf("consumer_name", n.consumer_name.as_ref());
            w.close("notification_options");
            w.open("message_set");
            w.leaf("message_count", n.messages.len());
            for (i, h) in n.messages.iter().enumerate() {
                w.open("message");
                w.leaf("message_number", i + 1);
                w.header(h);
                w.close("message");
            }
            w.close("message_set");
            w.close("AQXmlNotification");
        }
        Response::Fault(f) => {
            w.open_ns("Fault", ENVELOPE_NS);
            w.leaf("faultcode", f.code);
            // Oracle's specification: "faultstring - indicates a client error or a server error".
            let side = match f.kind {
                FaultKind::Client => "Client",
                FaultKind::Server => "Server",
            };
            w.leaf("faultstring", format!("{side} error: {}", f.message));
            w.open("detail");
            w.open_ns("status_response", ACCESS_NS);
            w.leaf("status_code", -1);
            w.leaf("error_code", f.code);
            w.leaf("error_message", &f.message);
            w.close("status_response");
            w.close("detail");
            w.close("Fault");
        }
    }
    w.finish()
}

/// Writes a request document (UTF-8).
pub fn write_request(req: &Envelope<Request>) -> String {
    let mut w = Writer::new(&req.headers);
    let method = req.body.method_name();
    match &req.body {
        Request::Send(e) | Request::Publish(e) => {
            w.open_ns(method, ACCESS_NS);
            w.open("producer_options");
            w.destination(&e.producer.destination);
            if e.producer.visibility != Visibility::default() {
                w.leaf("visibility", visibility(e.producer.visibility));
            }
            w.opt_leaf("transformation", e.producer.transformation.as_ref());
            w.delivery_mode(e.producer.delivery_mode);
            w.close("producer_options");
            w.message_set(&e.messages);
            w.commit(e.commit);
            w.close(method);
        }
        Request::Receive(r) => {
            let c = &r.consumer;
            w.open_ns(method, ACCESS_NS);
            w.open("consumer_options");
            w.destination(&c.destination);
            w.opt_leaf("consumer_name", c.consumer_name.as_ref());
            w.opt_leaf("wait_time", c.wait_time);
            if let Some(s) = &c.selector {
                w.open("selector");
                match s {
                    Selector::Correlation(v) => w.leaf("correlation", v),
                    Selector::MessageId(v) => w.leaf("message_id", v),
                    Selector::Condition(v) => w.leaf("condition", v),
                }
                w.close("selector");
            }
            if c.visibility != Visibility::default() {
                w.leaf("visibility", visibility(c.visibility));
            }
            if c.dequeue_mode != DequeueMode::default() {
                w.leaf("dequeue_mode", dequeue_mode(c.dequeue_mode));
            }
            if c.navigation != NavigationMode::default() {
                w.leaf("navigation_mode", navigation_mode(c.navigation));
            }
            w.opt_leaf("transformation", c.transformation.as_ref());
            w.delivery_mode(c.delivery_mode);
            w.close("consumer_options");
            w.commit(r.commit);
            w.close(method);
        }
        Request::Listen(l) => {
            w.open_ns(method, ACCESS_NS);
            w.open_aqgate("listen");
            for a in &l.agents {
                w.open("aqgate:agent");
                w.destination_as("aqgate:destination", &a.destination);
                w.opt_leaf("aqgate:consumer_name", a.consumer_name.as_ref());
                w.close("aqgate:agent");
            }
            w.opt_leaf("aqgate:wait_time", l.wait_time);
            w.close("aqgate:listen");
            w.close(method);
        }
        Request::Register(r) => {
            w.open_ns(method, ACCESS_NS);
            w.open("register_options");
            w.destination(&r.destination);
            w.opt_leaf("consumer_name", r.consumer_name.as_ref());
            w.leaf("notify_url", &r.notify_url);
            w.close("register_options");
            w.commit(r.commit);
            w.close(method);
        }
        Request::Commit | Request::Rollback => w.empty_ns(method, ACCESS_NS),
    }
    w.finish()
}

/// Appends `node` as XML, verbatim: names and attributes as given, text escaped, no added
/// whitespace. An element without children is written as `<name/>`.
pub fn write_node(out: &mut String, node: &XmlNode) {
    out.push('<');
    out.push_str(&node.name);
    for (name, value) in &node.attrs {
        out.push(' ');
        out.push_str(name);
        out.push_str("=\"");
        escape_attr(out, value);
        out.push('"');
    }
    if node.children.is_empty() {
        out.push_str("/>");
        return;
    }
    out.push('>');
    for child in &node.children {
        match child {
            XmlChild::Element(e) => write_node(out, e),
            XmlChild::Text(t) => escape_text(out, t),
        }
    }
    out.push_str("</");
    out.push_str(&node.name);
    out.push('>');
}

fn visibility(v: Visibility) -> &'static str {
    match v {
        Visibility::OnCommit => "ON_COMMIT",
        Visibility::Immediate => "IMMEDIATE",
    }
}

fn dequeue_mode(m: DequeueMode) -> &'static str {
    match m {
        DequeueMode::Remove => "REMOVE",
        DequeueMode::Browse => "BROWSE",
        DequeueMode::Locked => "LOCKED",
    }
}

fn navigation_mode(m: NavigationMode) -> &'static str {
    match m {
        NavigationMode::FirstMessage => "FIRST_MESSAGE",
        NavigationMode::NextMessage => "NEXT_MESSAGE",
        NavigationMode::NextTransaction => "NEXT_TRANSACTION",
    }
}

/// An indenting writer for the structural part of a document. It opens the envelope (and
/// header) on creation and the `Body`; [`Writer::finish`] closes them.
struct Writer {
    out: String,
    depth: usize,
}

impl Writer {
    fn new(headers: &[XmlNode]) -> Self {
        let mut w = Writer { out: String::from("<?xml version=\"1.0\"?>"), depth: 0 };
        w.open_ns("Envelope", ENVELOPE_NS);
        if !headers.is_empty() {
            w.open("Header");
            for h in headers {
                w.indent();
                write_node(&mut w.out, h);
            }
            w.close("Header");
        }
        w.open("Body");
        w
    }

    fn finish(mut self) -> String {
        self.close("Body");
        self.close("Envelope");
        self.out.push('\n');
        self.out
    }

    fn indent(&mut self) {
        self.out.push('\n');
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
    }

    fn open(&mut self, name: &str) {
        self.indent();
        self.out.push('<');
        self.out.push_str(name);
        self.out.push('>');
        self.depth += 1;
    }

    fn open_ns(&mut self, name: &str, ns: &str) {
        self.indent();
        self.out.push('<');
        self.out.push_str(name);
        self.out.push_str(" xmlns=\"");
        escape_attr(&mut self.out, ns);
        self.out.push_str("\">");
        self.depth += 1;
    }

    fn empty_ns(&mut self, name: &str, ns: &str) {
        self.indent();
        self.out.push('<');
        self.out.push_str(name);
        self.out.push_str(" xmlns=\"");
        escape_attr(&mut self.out, ns);
        self.out.push_str("\"/>");
    }

    fn close(&mut self, name: &str) {
        self.depth = self.depth.saturating_sub(1);
        self.indent();
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push('>');
    }

    fn leaf(&mut self, name: &str, value: impl Display) {
        self.indent();
        self.out.push('<');
        self.out.push_str(name);
        self.out.push('>');
        escape_text(&mut self.out, &value.to_string());
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push('>');
    }

    /// `aqgate:delivery_mode` in aqgate's namespace, when not the default.
    fn delivery_mode(&mut self, mode: DeliveryMode) {
        let v = match mode {
            DeliveryMode::Persistent => return,
            DeliveryMode::Buffered => "BUFFERED",
            DeliveryMode::PersistentOrBuffered => "PERSISTENT_OR_BUFFERED",
        };
        self.indent();
        self.out.push_str("<aqgate:delivery_mode xmlns:aqgate=\"");
        escape_attr(&mut self.out, AQGATE_NS);
        self.out.push_str("\">");
        self.out.push_str(v);
        self.out.push_str("</aqgate:delivery_mode>");
    }

    fn opt_leaf(&mut self, name: &str, value: Option<impl Display>) {
        if let Some(v) = value {
            self.leaf(name, v);
        }
    }

    fn commit(&mut self, commit: bool) {
        if commit {
            self.indent();
            self.out.push_str("<AQXmlCommit/>");
        }
    }

    fn destination(&mut self, d: &Destination) {
        self.destination_as("destination", d);
    }

    fn destination_as(&mut self, name: &str, d: &Destination) {
        self.indent();
        self.out.push('<');
        self.out.push_str(name);
        if d.lookup == LookupType::Ldap {
            self.out.push_str(" lookup_type=\"LDAP\"");
        }
        self.out.push('>');
        escape_text(&mut self.out, &d.name);
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push('>');
    }

    /// Opens `aqgate:<name>`, declaring aqgate's namespace.
    fn open_aqgate(&mut self, name: &str) {
        self.indent();
        self.out.push_str("<aqgate:");
        self.out.push_str(name);
        self.out.push_str(" xmlns:aqgate=\"");
        escape_attr(&mut self.out, AQGATE_NS);
        self.out.push_str("\">");
        self.depth += 1;
    }

    fn status(&mut self, s: &StatusResponse) {
        self.open("status_response");
        self.leaf("status_code", s.status_code);
        self.opt_leaf("error_code", s.error_code);
        self.opt_leaf("error_message", s.error_message.as_ref());
        self.close("status_response");
    }

    fn status_only(&mut self, method: &str, s: &StatusResponse) {
        self.open_ns(method, ACCESS_NS);
        self.status(s);
        self.close(method);
    }

    fn enqueue_result(&mut self, name: &str, r: &EnqueueResult) {
        self.open(name);
        self.leaf("destination", &r.destination);
        for id in &r.message_ids {
            self.leaf("message_id", id);
        }
        self.close(name);
    }

    fn message_set(&mut self, messages: &[Message]) {
        self.open("message_set");
        self.leaf("message_count", messages.len());
        for m in messages {
            self.open("message");
            self.opt_leaf("message_number", m.number);
            self.header(&m.header);
            self.open("message_payload");
            self.indent();
            write_node(&mut self.out, &m.payload);
            self.close("message_payload");
            self.close("message");
        }
        self.close("message_set");
    }

    /// `message_header`, in the order of Oracle's documented receive response.
    fn header(&mut self, h: &MessageHeader) {
        self.open("message_header");
        self.opt_leaf("message_id", h.message_id.as_ref());
        self.opt_leaf("correlation", h.correlation.as_ref());
        self.opt_leaf("priority", h.priority);
        self.opt_leaf("delivery_count", h.delivery_count);
        if let Some(s) = &h.sender_id {
            self.agent("sender_id", s);
        }
        if !h.recipient_list.is_empty() {
            self.open("recipient_list");
            for r in &h.recipient_list {
                self.agent("recipient", r);
            }
            self.close("recipient_list");
        }
        self.opt_leaf("message_state", h.message_state);
        self.opt_leaf("expiration", h.expiration);
        self.opt_leaf("delay", h.delay);
        self.opt_leaf("exception_queue", h.exception_queue.as_ref());
        self.close("message_header");
    }

    fn agent(&mut self, name: &str, a: &AgentRef) {
        self.open(name);
        self.opt_leaf("agent_name", a.name.as_ref());
        self.opt_leaf("address", a.address.as_ref());
        self.opt_leaf("protocol", a.protocol);
        self.opt_leaf("agent_alias", a.alias.as_ref());
        self.close(name);
    }
}

#[cfg(test)]
mod tests;
