//! Conversion between AQ messages and broker messages (the mapping table is in the README,
//! "Messaging Gateway"), the same for every broker: each broker module puts [`Outgoing`]
//! into its own properties and headers and reads its deliveries into [`Incoming`].
//!
//! Bodies, by the AQ queue's payload type:
//!
//! | AQ payload | broker body | content type |
//! |---|---|---|
//! | RAW | the bytes | `application/octet-stream` |
//! | JMS text | `text_data` as UTF-8 | `text/plain; charset=utf-8` |
//! | JMS bytes | `bytes_data` | `application/octet-stream` |
//! | JMS map | `map_data` as a JSON object of strings | `application/json` |
//! | object type, XMLType, JMS object | the payload element's XML | `application/xml` |
//!
//! Header fields travel as `AQ-*` headers both ways (`AQ-Message-Id`, `AQ-Correlation`,
//! `AQ-Priority`, `AQ-Expiration`, `AQ-Delay`); a broker's own field (RabbitMQ's
//! `message_id`, `correlation_id`, `expiration`) is filled too. Inbound, a body the
//! destination's type cannot take is a conversion failure: the message goes to the job's
//! exception queue with the reason.

use aqgate_core::payload::PayloadKind;
use aqgate_proto::idap::{self, AgentRef, Envelope, Limits, Message, MessageHeader, Request, XmlChild, XmlNode};

/// A message on its way to a broker.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The AQ message id.
    pub id: String,
    pub body: Vec<u8>,
    pub content_type: &'static str,
    pub correlation: Option<String>,
    /// AQ's priority (smaller is more urgent).
    pub priority: i64,
    /// Milliseconds left of the message's expiration, if it has one.
    pub expiration_ms: Option<u64>,
    /// Sent before, and perhaps received by the broker (in doubt): marked for consumers.
    pub redelivered: bool,
    /// The AQ source queue.
    pub queue: String,
}

impl Outgoing {
    /// The `AQ-*` headers every broker carries.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![("AQ-Message-Id", self.id.clone()), ("AQ-Priority", self.priority.to_string())];
        h.push(("AQ-Queue", self.queue.clone()));
        if let Some(c) = &self.correlation {
            h.push(("AQ-Correlation", c.clone()));
        }
        if let Some(ms) = self.expiration_ms {
            h.push(("AQ-Expiration", ms.div_ceil(1000).to_string()));
        }
        if self.redelivered {
            h.push(("x-aqgate-redelivered", "true".into()));
        }
        h
    }
}

/// A broker message on its way to AQ.
#[derive(Debug, Clone, Default)]
pub struct Incoming {
    /// What identifies this message at the broker for deduplication (stream sequence,
    /// `message_id`, `aq-message-id`); `None`: it cannot be told from a redelivery.
    pub broker_id: Option<String>,
    /// The broker says it delivered this message before.
    pub redelivered: bool,
    pub body: Vec<u8>,
    /// The broker's message id (for `preserve_message_id`).
    pub message_id: Option<String>,
    pub correlation: Option<String>,
    pub priority: Option<i64>,
    pub expiration: Option<i64>,
    pub delay: Option<i64>,
    /// This connection's handle for the ack.
    pub tag: u64,
}

impl Incoming {
    /// Reads the `AQ-*` headers (any case) into the fields they map to.
    pub fn header(&mut self, name: &str, value: &str) {
        let v = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "aq-correlation" if self.correlation.is_none() => self.correlation = Some(v.to_string()),
            "aq-priority" => self.priority = v.parse().ok().or(self.priority),
            "aq-expiration" => self.expiration = v.parse().ok().filter(|s| *s > 0),
            "aq-delay" => self.delay = v.parse().ok().filter(|s| *s > 0),
            "aq-message-id" if self.message_id.is_none() => self.message_id = Some(v.to_string()),
            _ => {}
        }
    }
}

/// The broker body and content type of AQ message `m` (a payload of kind `kind`), or why it
/// has none.
pub fn body_of(kind: &PayloadKind, m: &Message) -> Result<(Vec<u8>, &'static str), String> {
    let p = &m.payload;
    match kind {
        PayloadKind::Raw => Ok((unhex(&p.text())?, "application/octet-stream")),
        PayloadKind::JmsText => {
            Ok((p.child("text_data").map(XmlNode::text).unwrap_or_default().into_bytes(), "text/plain; charset=utf-8"))
        }
        PayloadKind::JmsBytes => {
            Ok((unhex(&p.child("bytes_data").map(XmlNode::text).unwrap_or_default())?, "application/octet-stream"))
        }
        PayloadKind::JmsMap => {
            let mut map = serde_json::Map::new();
            if let Some(items) = p.child("map_data") {
                for item in items.children.iter().filter_map(element) {
                    let name = item.child("name").map(XmlNode::text).unwrap_or_default();
                    let value = item
                        .children
                        .iter()
                        .filter_map(element)
                        .find(|c| c.local_name() != "name")
                        .map(XmlNode::text)
                        .unwrap_or_default();
                    map.insert(name, serde_json::Value::String(value));
                }
            }
            Ok((serde_json::Value::Object(map).to_string().into_bytes(), "application/json"))
        }
        PayloadKind::Object(_) | PayloadKind::Xml | PayloadKind::JmsObject => {
            let mut xml = String::new();
            idap::write_node(&mut xml, p);
            Ok((xml.into_bytes(), "application/xml"))
        }
    }
}

fn element(c: &XmlChild) -> Option<&XmlNode> {
    match c {
        XmlChild::Element(e) => Some(e),
        XmlChild::Text(_) => None,
    }
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    hex::decode(s.trim()).map_err(|e| format!("the stored RAW payload is not hex: {e}"))
}

/// The AQ message a broker message becomes on a queue of payload `kind`, as sent by `agent`;
/// `preserve`: the broker's message id is the correlation. An error says why the body does
/// not convert.
pub fn message_of(kind: &PayloadKind, m: &Incoming, agent: &str, preserve: bool) -> Result<Message, String> {
    let payload = match kind {
        PayloadKind::Raw => leaf("raw", aqgate_proto::payload::hex_upper(&m.body)),
        PayloadKind::JmsText => {
            let text = std::str::from_utf8(&m.body).map_err(|_| "the body is not UTF-8 text".to_string())?;
            let mut n = XmlNode::new("jms_text_message");
            n.children.push(XmlChild::Element(leaf("text_data", text.to_string())));
            n
        }
        PayloadKind::JmsBytes => {
            let mut n = XmlNode::new("jms_bytes_message");
            n.children.push(XmlChild::Element(leaf("bytes_data", aqgate_proto::payload::hex_upper(&m.body))));
            n
        }
        PayloadKind::JmsMap => {
            let v: serde_json::Value =
                serde_json::from_slice(&m.body).map_err(|e| format!("the body is not a JSON object: {e}"))?;
            let obj = v.as_object().ok_or("the body is not a JSON object")?;
            let mut data = XmlNode::new("map_data");
            for (k, v) in obj {
                let s = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let mut item = XmlNode::new("item");
                item.children.push(XmlChild::Element(leaf("name", k.clone())));
                item.children.push(XmlChild::Element(leaf("string_value", s)));
                data.children.push(XmlChild::Element(item));
            }
            let mut n = XmlNode::new("jms_map_message");
            n.children.push(XmlChild::Element(data));
            n
        }
        PayloadKind::Object(_) | PayloadKind::Xml | PayloadKind::JmsObject => xml_payload(&m.body)?,
    };
    let correlation = if preserve { m.message_id.clone() } else { m.correlation.clone() };
    Ok(Message {
        number: Some(1),
        header: MessageHeader {
            correlation: correlation.map(|c| c.chars().take(128).collect()),
            priority: m.priority,
            expiration: m.expiration,
            delay: m.delay,
            sender_id: Some(AgentRef { name: Some(agent.to_string()), ..AgentRef::default() }),
            ..MessageHeader::default()
        },
        payload,
    })
}

fn leaf(name: &str, text: String) -> XmlNode {
    let mut n = XmlNode::new(name);
    n.children.push(XmlChild::Text(text));
    n
}

/// An XML body read as a payload element, through the IDAP parser (its limits, and its
/// refusal of DTDs): the body goes into a one-message AQXmlSend, and exactly one message
/// with one payload element must come out.
fn xml_payload(body: &[u8]) -> Result<XmlNode, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8 XML".to_string())?;
    let mut t = text.trim_start_matches('\u{feff}').trim();
    if t.starts_with("<?xml")
        && let Some(end) = t.find("?>")
    {
        t = t[end + 2..].trim_start();
    }
    if !t.starts_with('<') {
        return Err("the body is not an XML element".into());
    }
    let doc = format!(
        "<Envelope xmlns=\"http://ns.oracle.com/AQ/schemas/envelope\"><Body>\
         <AQXmlSend xmlns=\"http://ns.oracle.com/AQ/schemas/access\"><producer_options>\
         <destination>X.X</destination></producer_options><message_set><message>\
         <message_header/><message_payload>{t}</message_payload></message></message_set>\
         </AQXmlSend></Body></Envelope>"
    );
    match idap::parse_request(doc.as_bytes(), &Limits::default()) {
        Ok(Envelope { body: Request::Send(mut r), .. }) if r.messages.len() == 1 => {
            Ok(r.messages.pop().map(|m| m.payload).unwrap_or_else(|| XmlNode::new("none")))
        }
        Ok(_) => Err("the body is not one XML element".into()),
        Err(e) => Err(format!("the body is not a payload element: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(body: &[u8]) -> Incoming {
        Incoming { body: body.to_vec(), ..Incoming::default() }
    }

    #[test]
    fn raw_round_trips_as_bytes() {
        let m = message_of(&PayloadKind::Raw, &incoming(&[0, 1, 0xfe]), "PROP$J", false).expect("converts");
        assert_eq!(m.payload.text(), "0001FE");
        let (body, ct) = body_of(&PayloadKind::Raw, &m).expect("body");
        assert_eq!((body, ct), (vec![0, 1, 0xfe], "application/octet-stream"));
    }

    #[test]
    fn text_must_be_utf8() {
        let e = message_of(&PayloadKind::JmsText, &incoming(&[0xff, 0xfe]), "PROP$J", false).expect_err("refused");
        assert!(e.contains("UTF-8"), "{e}");
        let m = message_of(&PayloadKind::JmsText, &incoming("héllo".as_bytes()), "PROP$J", false).expect("converts");
        let (body, _) = body_of(&PayloadKind::JmsText, &m).expect("body");
        assert_eq!(body, "héllo".as_bytes());
    }

    #[test]
    fn xml_bodies_go_through_the_idap_parser() {
        let ok = message_of(&PayloadKind::Xml, &incoming(b"<?xml version=\"1.0\"?><a><b>1</b></a>"), "P", false)
            .expect("converts");
        assert_eq!(ok.payload.local_name(), "a");
        for bad in [
            &b"<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>"[..],
            b"not xml",
            b"<a>",
            b"<a/></message_payload></message><message><message_header/><message_payload><b/>",
        ] {
            assert!(
                message_of(&PayloadKind::Xml, &incoming(bad), "P", false).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn headers_map_to_fields_and_preserve_takes_the_broker_id() {
        let mut m = incoming(b"");
        m.header("AQ-Priority", "3");
        m.header("aq-correlation", "c-1");
        m.header("AQ-Delay", "0");
        m.message_id = Some("broker-1".into());
        let a = message_of(&PayloadKind::Raw, &m, "P", false).expect("converts");
        assert_eq!((a.header.priority, a.header.correlation.as_deref(), a.header.delay), (Some(3), Some("c-1"), None));
        let b = message_of(&PayloadKind::Raw, &m, "P", true).expect("converts");
        assert_eq!(b.header.correlation.as_deref(), Some("broker-1"));
    }
}
