//! Writing IDAP documents: server responses (including `Fault` and `AQXmlNotification`) and
//! client requests.
//!
//! The output follows the element structure of the reference examples: an `Envelope` in the
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
            // The reference: "faultstring - indicates a client error or a server error".
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
            w.close("consumer_options");
            w.commit(r.commit);
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

/// Escapes character data. `>` is escaped so that `]]>` cannot occur; `\r` as a character
/// reference so that a conforming parser's line-end normalisation keeps it.
fn escape_text(out: &mut String, s: &str) {
    escape_with(out, s, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'\r' => Some("&#13;"),
        _ => None,
    });
}

/// Writes `s`, replacing the ASCII bytes `escape` names; the runs between them (payload
/// hex, mostly) are copied whole.
fn escape_with(out: &mut String, s: &str, escape: impl Fn(u8) -> Option<&'static str>) {
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if let Some(replacement) = escape(b) {
            // `i` is at an ASCII byte, so both slices fall on character boundaries.
            out.push_str(s.get(start..i).unwrap_or_default());
            out.push_str(replacement);
            start = i + 1;
        }
    }
    out.push_str(s.get(start..).unwrap_or_default());
}

/// Escapes an attribute value for double quotes; whitespace other than the space is written
/// as character references so that attribute-value normalisation keeps it.
fn escape_attr(out: &mut String, s: &str) {
    escape_with(out, s, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' => Some("&quot;"),
        b'\t' => Some("&#9;"),
        b'\n' => Some("&#10;"),
        b'\r' => Some("&#13;"),
        _ => None,
    });
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
        self.indent();
        self.out.push_str("<destination");
        if d.lookup == LookupType::Ldap {
            self.out.push_str(" lookup_type=\"LDAP\"");
        }
        self.out.push('>');
        escape_text(&mut self.out, &d.name);
        self.out.push_str("</destination>");
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

    /// `message_header`, in the order of the reference's receive response (example 14).
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
mod tests {
    use super::super::parse::{Limits, parse_request, parse_response};
    use super::*;
    use proptest::prelude::*;
    use quick_xml::Reader;
    use quick_xml::events::Event;

    const EX12: &str = include_str!("../../../../examples/12-response-send.xml");
    const EX13: &str = include_str!("../../../../examples/13-response-publish.xml");
    const EX14: &str = include_str!("../../../../examples/14-response-receive-adt.xml");
    const EX15: &str = include_str!("../../../../examples/15-response-commit.xml");
    const EX17: &str = include_str!("../../../../examples/17-servlet-response-send.xml");
    const EX01: &str = include_str!("../../../../examples/01-send-adt-single-consumer.xml");
    const EX09: &str = include_str!("../../../../examples/09-register-mailto.xml");

    /// An element-name tree (local names only), ignoring text, attributes and layout.
    #[derive(Debug, PartialEq)]
    struct Shape(String, Vec<Shape>);

    fn shape(xml: &str) -> Shape {
        let mut reader = Reader::from_str(xml);
        let mut stack: Vec<Shape> = vec![Shape(String::new(), Vec::new())];
        loop {
            match reader.read_event() {
                Ok(Event::Start(s)) => {
                    let name = String::from_utf8_lossy(s.local_name().as_ref()).into_owned();
                    stack.push(Shape(name, Vec::new()));
                }
                Ok(Event::Empty(s)) => {
                    let name = String::from_utf8_lossy(s.local_name().as_ref()).into_owned();
                    if let Some(top) = stack.last_mut() {
                        top.1.push(Shape(name, Vec::new()));
                    }
                }
                Ok(Event::End(_)) => {
                    let done = stack.pop().expect("balanced");
                    stack.last_mut().expect("balanced").1.push(done);
                }
                Ok(Event::Eof) => break,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
        stack.pop().expect("root")
    }

    fn parse_resp(xml: &str) -> Envelope<Response> {
        parse_response(xml.as_bytes(), &Limits::default()).unwrap_or_else(|e| panic!("{e}\n{xml}"))
    }

    fn parse_req(xml: &str) -> Envelope<Request> {
        parse_request(xml.as_bytes(), &Limits::default()).unwrap_or_else(|e| panic!("{e}\n{xml}"))
    }

    #[test]
    fn response_examples_round_trip_with_the_same_structure() {
        for ex in [EX12, EX13, EX14, EX15, EX17] {
            let parsed = parse_resp(ex);
            let written = write_response(&parsed);
            assert!(written.starts_with("<?xml version=\"1.0\"?>"));
            assert_eq!(parse_resp(&written), parsed, "{written}");
            assert_eq!(shape(&written), shape(ex), "{written}");
        }
    }

    #[test]
    fn request_examples_round_trip_with_the_same_structure() {
        for ex in [EX01, EX09] {
            let parsed = parse_req(ex);
            let written = write_request(&parsed);
            assert_eq!(parse_req(&written), parsed, "{written}");
            assert_eq!(shape(&written), shape(ex), "{written}");
        }
    }

    #[test]
    fn fault_structure() {
        let env = Envelope {
            headers: vec![],
            body: Response::Fault(Fault { kind: FaultKind::Server, code: 600, message: "store <down> & out".into() }),
        };
        let xml = write_response(&env);
        assert!(xml.contains("<Fault xmlns=\"http://ns.oracle.com/AQ/schemas/envelope\">"));
        assert!(xml.contains("<faultcode>600</faultcode>"));
        assert!(xml.contains("<faultstring>Server error: store &lt;down&gt; &amp; out</faultstring>"));
        assert!(xml.contains("<status_response xmlns=\"http://ns.oracle.com/AQ/schemas/access\">"));
        assert!(xml.contains("<status_code>-1</status_code>"));
        assert_eq!(parse_resp(&xml), env);
    }

    #[test]
    fn write_node_is_verbatim() {
        let mut node = XmlNode::new("p:a");
        node.attrs.push(("xmlns:p".into(), "urn:p".into()));
        node.attrs.push(("q".into(), "\"<&>\"\t\n".into()));
        node.children.push(XmlChild::Text(" x < y && z > w\r\n".into()));
        node.push(XmlNode::new("b"));
        node.push(XmlNode::with_text("c", "  "));
        let mut out = String::new();
        write_node(&mut out, &node);
        assert_eq!(
            out,
            "<p:a xmlns:p=\"urn:p\" q=\"&quot;&lt;&amp;&gt;&quot;&#9;&#10;\"> x &lt; y &amp;&amp; z \
             &gt; w&#13;\n<b/><c>  </c></p:a>"
        );
    }

    // --- property tests -----------------------------------------------------------------

    /// Printable text including XML's special characters and non-ASCII; trimmed, because
    /// scalar values are trimmed on parsing.
    fn text() -> impl Strategy<Value = String> {
        "[ -~éü€中😀]{0,12}".prop_map(|s| s.trim().to_owned())
    }

    fn non_empty_text() -> impl Strategy<Value = String> {
        text().prop_filter("non-empty", |s| !s.is_empty())
    }

    fn hex_id() -> impl Strategy<Value = String> {
        prop::collection::vec(any::<u8>(), 1..17).prop_map(hex::encode_upper)
    }

    fn name() -> impl Strategy<Value = String> {
        "[A-Za-z_][A-Za-z0-9_.-]{0,8}".prop_filter("reserved", |n| !n.to_ascii_lowercase().starts_with("xml"))
    }

    /// Text as a payload may hold it: kept exactly, so not trimmed.
    fn raw_text() -> impl Strategy<Value = String> {
        "[ -~éü€中😀]{1,12}"
    }

    /// Brings a generated node into the form parsing produces: adjacent texts merged,
    /// whitespace-only text dropped beside elements, unique attribute names.
    fn normalize(mut node: XmlNode) -> XmlNode {
        let mut seen = std::collections::HashSet::new();
        node.attrs.retain(|(k, _)| seen.insert(k.clone()));
        let has_elements = node.children.iter().any(|c| matches!(c, XmlChild::Element(_)));
        let mut children: Vec<XmlChild> = Vec::new();
        for c in node.children {
            match c {
                XmlChild::Element(e) => children.push(XmlChild::Element(normalize(e))),
                XmlChild::Text(t) if t.is_empty() || (has_elements && t.trim().is_empty()) => {}
                XmlChild::Text(t) => {
                    if let Some(XmlChild::Text(prev)) = children.last_mut() {
                        prev.push_str(&t);
                    } else {
                        children.push(XmlChild::Text(t));
                    }
                }
            }
        }
        node.children = children;
        node
    }

    fn xml_node() -> impl Strategy<Value = XmlNode> {
        let leaf = (name(), prop::collection::vec((name(), raw_text()), 0..3), prop::option::of(raw_text())).prop_map(
            |(name, attrs, text)| XmlNode { name, attrs, children: text.into_iter().map(XmlChild::Text).collect() },
        );
        leaf.prop_recursive(4, 24, 4, |inner| {
            (
                name(),
                prop::collection::vec((name(), raw_text()), 0..3),
                prop::collection::vec(
                    prop_oneof![inner.prop_map(XmlChild::Element), raw_text().prop_map(XmlChild::Text)],
                    0..4,
                ),
            )
                .prop_map(|(name, attrs, children)| XmlNode { name, attrs, children })
        })
        .prop_map(normalize)
    }

    fn agent() -> impl Strategy<Value = AgentRef> {
        (prop::option::of(text()), prop::option::of(text()), prop::option::of(any::<i32>()), prop::option::of(text()))
            .prop_map(|(name, address, protocol, alias)| AgentRef { name, address, protocol, alias })
    }

    fn header() -> impl Strategy<Value = MessageHeader> {
        (
            (
                prop::option::of(hex_id()),
                prop::option::of(text()),
                prop::option::of(any::<i64>()),
                prop::option::of(any::<i64>()),
                prop::option::of(any::<i64>()),
            ),
            (
                prop::option::of(any::<i64>()),
                prop::option::of(agent()),
                prop::collection::vec(agent(), 0..3),
                prop::option::of(any::<i32>()),
                prop::option::of(text()),
            ),
        )
            .prop_map(
                |(
                    (message_id, correlation, expiration, delay, priority),
                    (delivery_count, sender_id, recipient_list, message_state, exception_queue),
                )| MessageHeader {
                    message_id,
                    correlation,
                    expiration,
                    delay,
                    priority,
                    delivery_count,
                    sender_id,
                    recipient_list,
                    message_state,
                    exception_queue,
                },
            )
    }

    fn message() -> impl Strategy<Value = Message> {
        (prop::option::of(any::<u32>()), header(), xml_node()).prop_map(|(number, header, payload)| Message {
            number,
            header,
            payload,
        })
    }

    fn destination() -> impl Strategy<Value = Destination> {
        (non_empty_text(), any::<bool>()).prop_map(|(name, ldap)| Destination {
            name,
            lookup: if ldap { LookupType::Ldap } else { LookupType::Database },
        })
    }

    fn visibility_s() -> impl Strategy<Value = Visibility> {
        prop_oneof![Just(Visibility::OnCommit), Just(Visibility::Immediate)]
    }

    fn enqueue() -> impl Strategy<Value = EnqueueRequest> {
        (destination(), visibility_s(), prop::option::of(text()), prop::collection::vec(message(), 1..3), any::<bool>())
            .prop_map(|(destination, visibility, transformation, messages, commit)| EnqueueRequest {
                producer: ProducerOptions { destination, visibility, transformation },
                messages,
                commit,
            })
    }

    fn consumer() -> impl Strategy<Value = ConsumerOptions> {
        let selector = prop_oneof![
            text().prop_map(Selector::Correlation),
            hex_id().prop_map(Selector::MessageId),
            text().prop_map(Selector::Condition),
        ];
        let dequeue = prop_oneof![Just(DequeueMode::Remove), Just(DequeueMode::Browse), Just(DequeueMode::Locked)];
        let navigation = prop_oneof![
            Just(NavigationMode::FirstMessage),
            Just(NavigationMode::NextMessage),
            Just(NavigationMode::NextTransaction)
        ];
        (
            destination(),
            prop::option::of(text()),
            prop::option::of(any::<u64>()),
            prop::option::of(selector),
            visibility_s(),
            dequeue,
            navigation,
            prop::option::of(text()),
        )
            .prop_map(
                |(
                    destination,
                    consumer_name,
                    wait_time,
                    selector,
                    visibility,
                    dequeue_mode,
                    navigation,
                    transformation,
                )| ConsumerOptions {
                    destination,
                    consumer_name,
                    wait_time,
                    selector,
                    visibility,
                    dequeue_mode,
                    navigation,
                    transformation,
                },
            )
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            enqueue().prop_map(Request::Send),
            enqueue().prop_map(Request::Publish),
            (consumer(), any::<bool>())
                .prop_map(|(consumer, commit)| Request::Receive(ReceiveRequest { consumer, commit })),
            (destination(), prop::option::of(text()), non_empty_text(), any::<bool>()).prop_map(
                |(destination, consumer_name, notify_url, commit)| {
                    Request::Register(RegisterRequest { destination, consumer_name, notify_url, commit })
                }
            ),
            Just(Request::Commit),
            Just(Request::Rollback),
        ]
    }

    fn status() -> impl Strategy<Value = StatusResponse> {
        (any::<i32>(), prop::option::of(any::<i32>()), prop::option::of(text())).prop_map(
            |(status_code, error_code, error_message)| StatusResponse { status_code, error_code, error_message },
        )
    }

    fn enqueue_result() -> impl Strategy<Value = EnqueueResult> {
        (non_empty_text(), prop::collection::vec(hex_id(), 0..3))
            .prop_map(|(destination, message_ids)| EnqueueResult { destination, message_ids })
    }

    fn response() -> impl Strategy<Value = Response> {
        prop_oneof![
            (status(), prop::option::of(enqueue_result())).prop_map(|(s, r)| Response::Send(s, r)),
            (status(), prop::option::of(enqueue_result())).prop_map(|(s, r)| Response::Publish(s, r)),
            (status(), prop::option::of((non_empty_text(), prop::collection::vec(message(), 0..3)))).prop_map(
                |(s, r)| Response::Receive(s, r.map(|(destination, messages)| ReceiveResult { destination, messages }))
            ),
            status().prop_map(Response::Register),
            status().prop_map(Response::Commit),
            status().prop_map(Response::Rollback),
            (non_empty_text(), prop::option::of(text()), prop::collection::vec(header(), 0..3)).prop_map(
                |(destination, consumer_name, messages)| {
                    Response::Notification(Notification { destination, consumer_name, messages })
                }
            ),
            (any::<bool>(), any::<i32>(), text()).prop_map(|(server, code, message)| {
                Response::Fault(Fault {
                    kind: if server { FaultKind::Server } else { FaultKind::Client },
                    code,
                    message,
                })
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn requests_round_trip(body in request(), headers in prop::collection::vec(xml_node(), 0..2)) {
            let env = Envelope { headers, body };
            let xml = write_request(&env);
            let parsed = parse_request(xml.as_bytes(), &Limits::default());
            prop_assert_eq!(parsed, Ok(env), "{}", xml);
        }

        #[test]
        fn responses_round_trip(body in response(), headers in prop::collection::vec(xml_node(), 0..2)) {
            let env = Envelope { headers, body };
            let xml = write_response(&env);
            let parsed = parse_response(xml.as_bytes(), &Limits::default());
            prop_assert_eq!(parsed, Ok(env), "{}", xml);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_request(&bytes, &Limits::default());
            let _ = parse_response(&bytes, &Limits::default());
        }

        #[test]
        fn mutated_documents_never_panic(cut in 0usize..2000, junk in "[<>&/!?a-z\"'=\\[\\] ]{0,8}") {
            let mut doc = EX01.to_owned();
            let at = cut.min(doc.len());
            if doc.is_char_boundary(at) {
                doc.insert_str(at, &junk);
            }
            let _ = parse_request(doc.as_bytes(), &Limits::default());
        }
    }
}
