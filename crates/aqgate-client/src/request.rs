//! Typed IDAP requests and their XML: every value goes through `aqgate_proto`'s model and
//! writer, which escape text and attributes, so no caller's string is pasted into XML.

use aqgate_proto::idap::{
    self, AgentRef, ConsumerOptions, DeliveryMode, DequeueMode, Destination, EnqueueRequest, Envelope, Message,
    MessageHeader, NavigationMode, ProducerOptions, ReceiveRequest, Request, Selector, Visibility, XmlNode,
};

/// A payload as the client sends it and reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// The bytes of a `RAW` queue's message (`<raw>hex</raw>`).
    Raw(Vec<u8>),
    /// A JMS text message (`SYS.AQ$_JMS_TEXT_MESSAGE`: `<jms_text_message><text_data>`).
    Text(String),
    /// Any other payload element, as XML (what a receive answers; to send one, give its
    /// element to [`Outgoing::node`]).
    Xml(String),
}

impl Payload {
    /// The `message_payload` element of a raw or text payload; `None` for [`Payload::Xml`].
    pub fn to_node(&self) -> Option<XmlNode> {
        match self {
            Payload::Raw(bytes) => Some(XmlNode::with_text("raw", hex::encode_upper(bytes))),
            Payload::Text(text) => {
                let mut n = XmlNode::new("jms_text_message");
                n.push(XmlNode::with_text("text_data", text.clone()));
                Some(n)
            }
            Payload::Xml(_) => None,
        }
    }

    /// What a received `message_payload` element holds: `raw` as bytes, a JMS text
    /// message's `text_data` as text, anything else as its XML.
    pub fn from_node(node: &XmlNode) -> Self {
        match node.local_name() {
            "raw" => match hex::decode(node.text().trim()) {
                Ok(bytes) => Payload::Raw(bytes),
                Err(_) => Payload::Xml(as_xml(node)),
            },
            "jms_text_message" => match node.child("text_data") {
                Some(t) => Payload::Text(t.text()),
                None => Payload::Xml(as_xml(node)),
            },
            _ => Payload::Xml(as_xml(node)),
        }
    }
}

fn as_xml(node: &XmlNode) -> String {
    let mut s = String::new();
    idap::write_node(&mut s, node);
    s
}

/// One message to send, with the header fields a producer sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The element inside `message_payload`.
    pub payload: XmlNode,
    pub priority: Option<i64>,
    /// Seconds before the message may be dequeued.
    pub delay: Option<i64>,
    /// Seconds the message may wait for a consumer once its delay ended.
    pub expiration: Option<i64>,
    pub correlation: Option<String>,
    /// Recipients by agent name (multi-consumer queues).
    pub recipients: Vec<String>,
}

impl Outgoing {
    /// A message whose payload is the element `payload` (an object type's, an XMLType's).
    pub fn node(payload: XmlNode) -> Self {
        Self { payload, priority: None, delay: None, expiration: None, correlation: None, recipients: Vec::new() }
    }

    /// A `RAW` queue's message of these bytes.
    pub fn raw(bytes: &[u8]) -> Self {
        Self::node(XmlNode::with_text("raw", hex::encode_upper(bytes)))
    }

    /// A JMS text message.
    pub fn text(text: impl Into<String>) -> Self {
        let mut n = XmlNode::new("jms_text_message");
        n.push(XmlNode::with_text("text_data", text.into()));
        Self::node(n)
    }

    /// The protocol's message, numbered `number` in its message set.
    pub fn to_message(&self, number: u32) -> Message {
        Message {
            number: Some(number),
            header: MessageHeader {
                correlation: self.correlation.clone(),
                expiration: self.expiration,
                delay: self.delay,
                priority: self.priority,
                recipient_list: self
                    .recipients
                    .iter()
                    .map(|r| AgentRef { name: Some(r.clone()), ..AgentRef::default() })
                    .collect(),
                ..MessageHeader::default()
            },
            payload: self.payload.clone(),
        }
    }
}

/// An AQXmlSend (or, with `publish`, AQXmlPublish) of `messages` to `queue`; `commit`
/// adds the trailing AQXmlCommit.
pub fn send(queue: &str, messages: Vec<Message>, commit: bool) -> Request {
    let e = EnqueueRequest {
        producer: ProducerOptions {
            destination: Destination::database(queue),
            visibility: Visibility::OnCommit,
            transformation: None,
            delivery_mode: DeliveryMode::Persistent,
        },
        messages,
        commit,
    };
    Request::Send(e)
}

/// As [`send`], an AQXmlPublish.
pub fn publish(queue: &str, messages: Vec<Message>, commit: bool) -> Request {
    match send(queue, messages, commit) {
        Request::Send(e) => Request::Publish(e),
        other => other,
    }
}

/// How a receive selects and takes its message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Receive {
    pub queue: String,
    /// Multi-consumer queues: the subscriber or recipient.
    pub consumer: Option<String>,
    /// Seconds to wait for a message; `None` is the server's default.
    pub wait: Option<u64>,
    pub selector: Option<Selector>,
    /// BROWSE: look, take nothing (from the first message).
    pub browse: bool,
    /// Buffered messages (IMMEDIATE, as they must be).
    pub buffered: bool,
    /// A trailing AQXmlCommit.
    pub commit: bool,
}

impl Receive {
    pub fn new(queue: impl Into<String>) -> Self {
        Self { queue: queue.into(), ..Self::default() }
    }

    /// The protocol's request.
    pub fn to_request(&self) -> Request {
        Request::Receive(ReceiveRequest {
            consumer: ConsumerOptions {
                destination: Destination::database(self.queue.clone()),
                consumer_name: self.consumer.clone(),
                wait_time: self.wait,
                selector: self.selector.clone(),
                visibility: if self.buffered { Visibility::Immediate } else { Visibility::OnCommit },
                dequeue_mode: if self.browse { DequeueMode::Browse } else { DequeueMode::Remove },
                navigation: if self.browse { NavigationMode::FirstMessage } else { NavigationMode::NextMessage },
                transformation: None,
                delivery_mode: if self.buffered { DeliveryMode::Buffered } else { DeliveryMode::Persistent },
            },
            commit: self.commit,
        })
    }
}

/// The request as an IDAP document (UTF-8), every value escaped by the writer.
pub fn document(request: Request) -> String {
    idap::write_request(&Envelope { headers: Vec::new(), body: request })
}

/// Makes a send, publish or receive one of buffered messages (IMMEDIATE, as they must
/// be, and `aqgate:delivery_mode` BUFFERED); other requests are left as they are.
pub fn buffered(request: &mut Request) {
    match request {
        Request::Send(e) | Request::Publish(e) => {
            e.producer.visibility = Visibility::Immediate;
            e.producer.delivery_mode = DeliveryMode::Buffered;
        }
        Request::Receive(r) => {
            r.consumer.visibility = Visibility::Immediate;
            r.consumer.delivery_mode = DeliveryMode::Buffered;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aqgate_proto::idap::{Limits, parse_request};

    #[test]
    fn values_are_escaped_and_read_back_as_given() {
        let hostile = "a</destination><evil/>&\"'<";
        let mut m = Outgoing::text(format!("text {hostile}"));
        m.correlation = Some(hostile.into());
        m.recipients = vec![hostile.into()];
        m.priority = Some(3);
        m.delay = Some(5);
        m.expiration = Some(60);
        let xml = document(send(hostile, vec![m.to_message(1)], true));
        assert!(!xml.contains("<evil/>"), "{xml}");
        let back = parse_request(xml.as_bytes(), &Limits::default()).expect("parses").body;
        let Request::Send(e) = back else { panic!("a send: {back:?}") };
        assert_eq!(e.producer.destination.name, hostile);
        assert!(e.commit);
        let h = &e.messages[0].header;
        assert_eq!(h.correlation.as_deref(), Some(hostile));
        assert_eq!((h.priority, h.delay, h.expiration), (Some(3), Some(5), Some(60)));
        assert_eq!(h.recipient_list[0].name.as_deref(), Some(hostile));
        assert_eq!(Payload::from_node(&e.messages[0].payload), Payload::Text(format!("text {hostile}")));
    }

    #[test]
    fn a_receive_says_what_it_asks() {
        let mut r = Receive::new("Q<1>");
        r.consumer = Some("c&d".into());
        r.wait = Some(7);
        r.selector = Some(Selector::Condition("tab.user_data.x > 1 AND corrid = 'a<b'".into()));
        r.browse = true;
        let xml = document(r.to_request());
        let back = parse_request(xml.as_bytes(), &Limits::default()).expect("parses").body;
        let Request::Receive(got) = back else { panic!("a receive") };
        let c = got.consumer;
        assert_eq!(c.destination.name, "Q<1>");
        assert_eq!(c.consumer_name.as_deref(), Some("c&d"));
        assert_eq!(c.wait_time, Some(7));
        assert_eq!(c.dequeue_mode, DequeueMode::Browse);
        assert_eq!(c.navigation, NavigationMode::FirstMessage);
        assert_eq!(c.selector, r.selector);
        assert!(!got.commit);
    }

    #[test]
    fn raw_payloads_are_upper_hex_both_ways() {
        let p = Payload::Raw(vec![0, 0xab, 0xff]);
        let node = p.to_node().expect("raw");
        assert_eq!(Outgoing::raw(&[0, 0xab, 0xff]).payload, node);
        assert_eq!(node.text(), "00ABFF");
        assert_eq!(Payload::from_node(&node), p);
        assert_eq!(Payload::from_node(&XmlNode::with_text("raw", "zz")), Payload::Xml("<raw>zz</raw>".into()));
    }
}
