//! Tests of the IDAP writer: the examples written back with the same structure, faults,
//! verbatim payloads, and round trips of generated documents.

use proptest::prelude::*;
use quick_xml::Reader;
use quick_xml::events::Event;

use super::super::parse::{Limits, parse_request, parse_response};
use super::*;

const EX12: &str = include_str!("../../../../../examples/12-response-send.xml");
const EX13: &str = include_str!("../../../../../examples/13-response-publish.xml");
const EX14: &str = include_str!("../../../../../examples/14-response-receive-adt.xml");
const EX15: &str = include_str!("../../../../../examples/15-response-commit.xml");
const EX17: &str = include_str!("../../../../../examples/17-servlet-response-send.xml");
const EX01: &str = include_str!("../../../../../examples/01-send-adt-single-consumer.xml");
const EX09: &str = include_str!("../../../../../examples/09-register-mailto.xml");

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

fn delivery_s(either: bool) -> impl Strategy<Value = DeliveryMode> {
    let third = if either { DeliveryMode::PersistentOrBuffered } else { DeliveryMode::Buffered };
    prop_oneof![Just(DeliveryMode::Persistent), Just(DeliveryMode::Buffered), Just(third)]
}

fn enqueue() -> impl Strategy<Value = EnqueueRequest> {
    (
        destination(),
        visibility_s(),
        prop::option::of(text()),
        prop::collection::vec(message(), 1..3),
        any::<bool>(),
        delivery_s(false),
    )
        .prop_map(|(destination, visibility, transformation, messages, commit, delivery_mode)| EnqueueRequest {
            producer: ProducerOptions { destination, visibility, transformation, delivery_mode },
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
        delivery_s(true),
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
                delivery_mode,
            )| ConsumerOptions {
                destination,
                consumer_name,
                wait_time,
                selector,
                visibility,
                dequeue_mode,
                navigation,
                transformation,
                delivery_mode,
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
    (any::<i32>(), prop::option::of(any::<i32>()), prop::option::of(text()))
        .prop_map(|(status_code, error_code, error_message)| StatusResponse { status_code, error_code, error_message })
}

fn enqueue_result() -> impl Strategy<Value = EnqueueResult> {
    (non_empty_text(), prop::collection::vec(hex_id(), 0..3))
        .prop_map(|(destination, message_ids)| EnqueueResult { destination, message_ids })
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (status(), prop::option::of(enqueue_result())).prop_map(|(s, r)| Response::Send(s, r)),
        (status(), prop::option::of(enqueue_result())).prop_map(|(s, r)| Response::Publish(s, r)),
        (status(), prop::option::of((non_empty_text(), prop::collection::vec(message(), 0..3)))).prop_map(|(s, r)| {
            Response::Receive(s, r.map(|(destination, messages)| ReceiveResult { destination, messages }))
        }),
        status().prop_map(Response::Register),
        status().prop_map(Response::Commit),
        status().prop_map(Response::Rollback),
        (non_empty_text(), prop::option::of(text()), prop::collection::vec(header(), 0..3)).prop_map(
            |(destination, consumer_name, messages)| {
                Response::Notification(Notification { destination, consumer_name, messages })
            }
        ),
        (any::<bool>(), any::<i32>(), text()).prop_map(|(server, code, message)| {
            Response::Fault(Fault { kind: if server { FaultKind::Server } else { FaultKind::Client }, code, message })
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
