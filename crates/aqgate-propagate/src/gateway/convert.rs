//! Conversion between AQ messages and broker messages (the mapping table is in docs/gateway.md,
//! "Conversion"), the same for every broker: each broker module puts [`Outgoing`]
//! into its own properties and headers and reads its deliveries into [`Incoming`].
//!
//! Bodies, by the AQ queue's payload type:
//!
//! | AQ payload | broker body | content type |
//! |---|---|---|
//! | RAW | the bytes | `application/octet-stream` |
//! | JMS text | `text_data` as UTF-8 | `text/plain; charset=utf-8` |
//! | JMS bytes | `bytes_data` | `application/octet-stream` |
//! | JMS map | `map_data` as a JSON object of typed values | `application/json` |
//! | object type, XMLType, JMS object | the payload element's XML | `application/xml` |
//!
//! Header fields travel as `AQ-*` headers both ways (`AQ-Message-Id`, `AQ-Correlation`,
//! `AQ-Priority`, `AQ-Expiration`, `AQ-Delay`) when the job's `aq_msg_properties` is on (the
//! default; [`Outgoing::headers`], [`Incoming::settle`]); a broker's own field (RabbitMQ's
//! `message_id`, `correlation_id`, `expiration`) is filled and read either way. An outbound
//! job's messages carry `x-aqgate-link` (the link's name), by which an inbound job with
//! `no_local` leaves them. A JMS message's header
//! fields and user properties travel as [`props`] says. Inbound, a body the destination's
//! type cannot take, or properties past the bounds, is a conversion failure: the message
//! goes to the job's exception queue with the reason.

pub mod props;

use aqgate_core::payload::PayloadKind;
use aqgate_proto::idap::{self, AgentRef, Envelope, Limits, Message, MessageHeader, Request, XmlChild, XmlNode};
use props::{Gathered, JmsProps, JmsValue};

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
    /// A JMS message's header fields and user properties.
    pub props: JmsProps,
    /// How the job publishes it (its `delivery_mode`, and whether the `AQ-*` headers go).
    pub mode: Mode,
}

/// How an outbound job publishes (its options, the same for each of its messages).
#[derive(Debug, Clone, Default)]
pub struct Mode {
    /// The broker keeps it across a restart and confirms it (`delivery_mode`).
    pub persistent: bool,
    /// The `AQ-*` headers go with it (`aq_msg_properties`).
    pub aq_properties: bool,
    /// The link it goes over, marked `x-aqgate-link` (for inbound jobs' `no_local`).
    pub link: Option<String>,
}

impl Mode {
    /// The mode of the messages of a job with `options` over `link`.
    pub fn of(options: &aqgate_core::topology::gateway::JobOptions, link: &str) -> Self {
        Self {
            persistent: options.delivery_mode.persistent(),
            aq_properties: options.aq_msg_properties,
            link: Some(link.to_string()),
        }
    }
}

/// The header that names the link an outbound job published over (`no_local`).
pub const LINK_MARK: &str = "x-aqgate-link";

impl Outgoing {
    /// The `AQ-*` headers every broker carries (none when the job's `aq_msg_properties` is
    /// off), and the gateway's own marks.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if self.mode.aq_properties {
            h.push(("AQ-Message-Id", self.id.clone()));
            h.push(("AQ-Priority", self.priority.to_string()));
            h.push(("AQ-Queue", self.queue.clone()));
            if let Some(c) = &self.correlation {
                h.push(("AQ-Correlation", c.clone()));
            }
            if let Some(ms) = self.expiration_ms {
                h.push(("AQ-Expiration", ms.div_ceil(1000).to_string()));
            }
        }
        if let Some(l) = &self.mode.link {
            h.push((LINK_MARK, l.clone()));
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
    /// What the headers say of JMS properties.
    pub jms: Gathered,
    /// What the `AQ-*` headers say, taken into the fields above by [`Incoming::settle`]
    /// when the job's `aq_msg_properties` is on.
    pub aq: AqHeaders,
    /// The link an outbound job of the gateway published it over (`x-aqgate-link`).
    pub link_mark: Option<String>,
    /// This connection's handle for the ack.
    pub tag: u64,
}

/// The AQ message properties a broker message's `AQ-*` headers give.
#[derive(Debug, Clone, Default)]
pub struct AqHeaders {
    pub message_id: Option<String>,
    pub correlation: Option<String>,
    pub priority: Option<i64>,
    pub expiration: Option<i64>,
    pub delay: Option<i64>,
}

impl Incoming {
    /// Reads a string header: the `AQ-*` ones (any case) into the fields they map to, the
    /// others into the JMS properties ([`props::Gathered::header`]).
    pub fn header(&mut self, name: &str, value: &str) {
        self.typed_header(name, JmsValue::String(value.to_string()));
    }

    /// Reads a header the broker types (RabbitMQ), as [`Incoming::header`].
    pub fn typed_header(&mut self, name: &str, value: JmsValue) {
        let text = || value.text().trim().to_string();
        let aq = &mut self.aq;
        match name.to_ascii_lowercase().as_str() {
            "aq-correlation" if aq.correlation.is_none() => aq.correlation = Some(text()),
            "aq-priority" => aq.priority = text().parse().ok().or(aq.priority),
            "aq-expiration" => aq.expiration = text().parse().ok().filter(|s| *s > 0),
            "aq-delay" => aq.delay = text().parse().ok().filter(|s| *s > 0),
            "aq-message-id" if aq.message_id.is_none() => aq.message_id = Some(text()),
            LINK_MARK if self.link_mark.is_none() => self.link_mark = Some(text()),
            _ => self.jms.header(name, value),
        }
    }

    /// With `aq_properties` (the job's `aq_msg_properties`), the `AQ-*` headers' values
    /// become the message's priority, expiration and delay, and its correlation and message
    /// id where the broker's own fields give none; without, they are dropped.
    pub fn settle(&mut self, aq_properties: bool) {
        let aq = std::mem::take(&mut self.aq);
        if aq_properties {
            self.correlation = self.correlation.take().or(aq.correlation);
            self.message_id = self.message_id.take().or(aq.message_id);
            self.priority = aq.priority.or(self.priority);
            self.expiration = aq.expiration.or(self.expiration);
            self.delay = aq.delay.or(self.delay);
        }
    }
}

/// The broker body, content type and JMS properties of AQ message `m` (a payload of kind
/// `kind`), or why it has none.
pub fn body_of(kind: &PayloadKind, m: &Message) -> Result<(Vec<u8>, &'static str, JmsProps), String> {
    let mut props = match kind {
        PayloadKind::JmsText | PayloadKind::JmsBytes | PayloadKind::JmsMap | PayloadKind::JmsObject => {
            JmsProps::of_payload(&m.payload)?
        }
        _ => JmsProps::default(),
    };
    let (body, content_type) = body_only(kind, m, &mut props)?;
    Ok((body, content_type, props))
}

fn body_only(kind: &PayloadKind, m: &Message, props: &mut JmsProps) -> Result<(Vec<u8>, &'static str), String> {
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
                    let Some(e) = item.children.iter().filter_map(element).find(|c| c.local_name() != "name") else {
                        continue;
                    };
                    let value = JmsValue::parse(&e.local_name().to_ascii_lowercase(), &e.text())
                        .ok_or_else(|| format!("map item {} has no JMS value", props::shown(&name)))?;
                    let json = value.json();
                    // What a JSON reader would make of it, else its type in AQ-Map-Types.
                    if JmsValue::of_json(&json, None).as_ref().map(JmsValue::type_name) != Some(value.type_name()) {
                        props.map_types.push((name.clone(), value.type_name()));
                    }
                    map.insert(name, json);
                }
            }
            Ok((serde_json::Value::Object(map).to_string().into_bytes(), "application/json"))
        }
        PayloadKind::Object(_) | PayloadKind::Xml | PayloadKind::JmsObject | PayloadKind::AnyData => {
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
    let mut payload = match kind {
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
            let types = m.jms.map_types()?;
            let mut data = XmlNode::new("map_data");
            for (k, v) in obj {
                let ty = types.iter().find(|(n, _)| n == k).map(|(_, t)| t.as_str());
                let value = JmsValue::of_json(v, ty).ok_or_else(|| {
                    format!(
                        "map item {}: {v} is not a JMS {} ({})",
                        props::shown(k),
                        ty.unwrap_or("value"),
                        props::MAP_TYPES
                    )
                })?;
                data.children.push(XmlChild::Element(props::item("item", k, &value)));
            }
            let mut n = XmlNode::new("jms_map_message");
            n.children.push(XmlChild::Element(data));
            n
        }
        PayloadKind::Object(_) | PayloadKind::Xml | PayloadKind::JmsObject | PayloadKind::AnyData => {
            xml_payload(&m.body)?
        }
    };
    if matches!(kind, PayloadKind::JmsText | PayloadKind::JmsBytes | PayloadKind::JmsMap) {
        // The header fields and user properties go before the body.
        let parts = m.jms.props()?.elements();
        for (i, e) in parts.into_iter().enumerate() {
            payload.children.insert(i, XmlChild::Element(e));
        }
    }
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
        let (body, ct, _) = body_of(&PayloadKind::Raw, &m).expect("body");
        assert_eq!((body, ct), (vec![0, 1, 0xfe], "application/octet-stream"));
    }

    #[test]
    fn aq_headers_follow_the_jobs_option_and_the_link_mark_goes_always() {
        let mut o = Outgoing {
            id: "ID1".into(),
            body: Vec::new(),
            content_type: "application/octet-stream",
            correlation: Some("c".into()),
            priority: 2,
            expiration_ms: Some(1500),
            redelivered: false,
            queue: "A.Q".into(),
            props: JmsProps::default(),
            mode: Mode { persistent: true, aq_properties: true, link: Some("RABBIT".into()) },
        };
        let names = |o: &Outgoing| o.headers().into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            names(&o),
            ["AQ-Message-Id", "AQ-Priority", "AQ-Queue", "AQ-Correlation", "AQ-Expiration", LINK_MARK]
        );
        o.mode.aq_properties = false;
        assert_eq!(names(&o), [LINK_MARK]);
        let mut inc = incoming(b"");
        inc.header("x-aqgate-link", "RABBIT");
        assert_eq!(inc.link_mark.as_deref(), Some("RABBIT"));
        assert!(inc.jms.user.is_empty(), "the mark is no user property");
    }

    #[test]
    fn text_must_be_utf8() {
        let e = message_of(&PayloadKind::JmsText, &incoming(&[0xff, 0xfe]), "PROP$J", false).expect_err("refused");
        assert!(e.contains("UTF-8"), "{e}");
        let m = message_of(&PayloadKind::JmsText, &incoming("héllo".as_bytes()), "PROP$J", false).expect("converts");
        let (body, _, _) = body_of(&PayloadKind::JmsText, &m).expect("body");
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
        let mut off = m.clone();
        m.settle(true);
        off.settle(false);
        let plain = message_of(&PayloadKind::Raw, &off, "P", false).expect("converts");
        assert_eq!((plain.header.priority, plain.header.correlation), (None, None), "aq_msg_properties off");
        m.message_id = Some("broker-1".into());
        let a = message_of(&PayloadKind::Raw, &m, "P", false).expect("converts");
        assert_eq!((a.header.priority, a.header.correlation.as_deref(), a.header.delay), (Some(3), Some("c-1"), None));
        let b = message_of(&PayloadKind::Raw, &m, "P", true).expect("converts");
        assert_eq!(b.header.correlation.as_deref(), Some("broker-1"));
    }

    fn jms_text(props: &str, user: &str) -> Message {
        let xml = format!(
            "<jms_text_message><oracle_jms_properties>{props}</oracle_jms_properties>\
             <user_properties>{user}</user_properties><text_data>hi</text_data></jms_text_message>"
        );
        with_payload(&xml)
    }

    fn with_payload(xml: &str) -> Message {
        let m = message_of(&PayloadKind::Raw, &incoming(b""), "P", false).expect("a message");
        Message { payload: xml_payload(xml.as_bytes()).expect("xml"), ..m }
    }

    fn prop(name: &str, tag: &str, v: &str) -> String {
        format!("<property><name>{name}</name><{tag}>{v}</{tag}></property>")
    }

    /// `(name, element, text)` of each user property of payload `p`.
    fn user_of(p: &XmlNode) -> Vec<(String, String, String)> {
        p.child("user_properties")
            .map(|u| {
                u.elements()
                    .map(|e| {
                        let v = e.elements().find(|c| c.local_name() != "name").expect("value");
                        (e.child("name").expect("name").text(), v.local_name().to_string(), v.text())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn typed_user() -> String {
        [
            prop("Warehouse", "string_value", "PDX-2"),
            prop("Count", "int_value", "5"),
            prop("Big", "long_value", "5"),
            prop("Ratio", "double_value", "0.25"),
            prop("F", "float_value", "1.5"),
            prop("Rush", "boolean_value", "true"),
            prop("S", "short_value", "-3"),
            prop("B", "byte_value", "7"),
        ]
        .concat()
    }

    const FIELDS: &str = "<type>order</type><reply_to><agent_name>scott</agent_name>\
        <address>AQUSER.REPLYQ</address><protocol>0</protocol></reply_to><userid>SCOTT</userid>\
        <appid>shop</appid><groupid>g-1</groupid><group_sequence>3</group_sequence><timestamp>1700000000123</timestamp>";

    #[test]
    fn jms_properties_round_trip_through_string_headers_with_their_types() {
        let m = jms_text(FIELDS, &typed_user());
        let (body, _, props) = body_of(&PayloadKind::JmsText, &m).expect("converts");
        assert_eq!(body, b"hi");
        let h = props.string_headers();
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("Warehouse").as_deref(), Some("PDX-2"));
        assert_eq!(get("Count").as_deref(), Some("5"));
        assert_eq!(get("JMSXGroupSeq").as_deref(), Some("3"));
        assert_eq!(get("JMSReplyTo").as_deref(), Some("AQUSER.REPLYQ"));
        assert_eq!(get("JMSXUserID").as_deref(), Some("SCOTT"));
        let types: serde_json::Value = serde_json::from_str(&get("AQ-Property-Types").expect("types")).expect("json");
        assert_eq!(types["Count"], "int");
        assert_eq!(types["Big"], "long");
        assert!(types.get("Warehouse").is_none(), "strings need no type: {types}");
        // Back, in reverse order (the types header before or after the values).
        let mut inc = incoming(b"hi");
        for (k, v) in h.iter().rev() {
            inc.header(k, v);
        }
        let back = message_of(&PayloadKind::JmsText, &inc, "P", false).expect("converts");
        let want = vec![
            ("Warehouse", "string_value", "PDX-2"),
            ("Count", "int_value", "5"),
            ("Big", "long_value", "5"),
            ("Ratio", "double_value", "0.25"),
            ("F", "float_value", "1.5"),
            ("Rush", "boolean_value", "true"),
            ("S", "short_value", "-3"),
            ("B", "byte_value", "7"),
        ];
        let mut got = user_of(&back.payload);
        got.sort();
        let mut want: Vec<(String, String, String)> =
            want.into_iter().map(|(a, b, c)| (a.into(), b.into(), c.into())).collect();
        want.sort();
        assert_eq!(got, want);
        let h = back.payload.child("oracle_jms_properties").expect("fields");
        let f = |n: &str| h.child(n).map(XmlNode::text);
        assert_eq!(
            (f("type"), f("appid"), f("groupid"), f("group_sequence")),
            (Some("order".into()), Some("shop".into()), Some("g-1".into()), Some("3".into()))
        );
        let r = h.child("reply_to").expect("reply_to");
        assert_eq!(r.child("agent_name").map(XmlNode::text).as_deref(), Some("scott"));
        assert_eq!(r.child("address").map(XmlNode::text).as_deref(), Some("AQUSER.REPLYQ"));
        assert_eq!(r.child("protocol").map(XmlNode::text).as_deref(), Some("0"));
        // AQ sets these at enqueue: not taken from a broker.
        assert!(f("userid").is_none() && f("timestamp").is_none());
        // Into a RAW queue the properties have nowhere to go: only the bytes.
        assert_eq!(message_of(&PayloadKind::Raw, &inc, "P", false).expect("raw").payload.text(), "6869");
    }

    #[test]
    fn typed_headers_are_user_properties_and_reserved_ones_are_not() {
        let mut inc = incoming(b"x");
        inc.typed_header("Count", JmsValue::Int(5));
        inc.typed_header("On", JmsValue::Boolean(false));
        inc.typed_header("x-death", JmsValue::String("q".into()));
        inc.typed_header("AQ-Queue", JmsValue::String("Q".into()));
        inc.typed_header("Nats-Msg-Id", JmsValue::String("1".into()));
        inc.typed_header("JMSXGroupSeq", JmsValue::Long(9));
        inc.typed_header("AQ-Priority", JmsValue::Int(2));
        inc.settle(true);
        let m = message_of(&PayloadKind::JmsText, &inc, "P", false).expect("converts");
        assert_eq!(
            user_of(&m.payload),
            vec![
                ("Count".into(), "int_value".into(), "5".into()),
                ("On".into(), "boolean_value".into(), "false".into())
            ]
        );
        assert_eq!(m.header.priority, Some(2));
        let seq = m.payload.child("oracle_jms_properties").and_then(|h| h.child("group_sequence")).map(XmlNode::text);
        assert_eq!(seq.as_deref(), Some("9"));
    }

    #[test]
    fn map_values_keep_their_types() {
        let items = "<item><name>qty</name><int_value>5</int_value></item>\
            <item><name>big</name><long_value>5</long_value></item>\
            <item><name>f</name><float_value>2.5</float_value></item>\
            <item><name>d</name><double_value>2</double_value></item>\
            <item><name>ok</name><boolean_value>true</boolean_value></item>\
            <item><name>s</name><string_value>5</string_value></item>";
        let xml = format!("<jms_map_message><map_data>{items}</map_data></jms_map_message>");
        let m = with_payload(&xml);
        let (body, ct, props) = body_of(&PayloadKind::JmsMap, &m).expect("converts");
        assert_eq!(ct, "application/json");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(json["qty"], serde_json::json!(5));
        assert_eq!(json["s"], serde_json::json!("5"));
        assert_eq!(json["ok"], serde_json::json!(true));
        let mut types = props.map_types.clone();
        types.sort();
        assert_eq!(
            types,
            vec![("big".into(), "long"), ("f".into(), "float")],
            "a double 2 is 2.0 in JSON: read as a double"
        );
        let mut inc = incoming(&body);
        for (k, v) in props.string_headers() {
            inc.header(&k, &v);
        }
        let back = message_of(&PayloadKind::JmsMap, &inc, "P", false).expect("converts");
        let mut got: Vec<(String, String, String)> = back
            .payload
            .child("map_data")
            .expect("map_data")
            .elements()
            .map(|e| {
                let v = e.elements().find(|c| c.local_name() != "name").expect("value");
                (e.child("name").expect("name").text(), v.local_name().to_string(), v.text())
            })
            .collect();
        got.sort();
        let want = [
            ("big", "long_value", "5"),
            ("d", "double_value", "2.0"),
            ("f", "float_value", "2.5"),
            ("ok", "boolean_value", "true"),
            ("qty", "int_value", "5"),
            ("s", "string_value", "5"),
        ];
        assert_eq!(got, want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).to_vec());
        // A foreign JSON body without types: a JSON reader's types.
        let plain = message_of(&PayloadKind::JmsMap, &incoming(br#"{"n": 7, "x": 1.5}"#), "P", false).expect("map");
        let tags: Vec<String> = plain
            .payload
            .child("map_data")
            .expect("map_data")
            .elements()
            .map(|e| e.elements().nth(1).expect("value").local_name().to_string())
            .collect();
        assert_eq!(tags, ["int_value", "double_value"]);
    }

    #[test]
    fn properties_past_the_bounds_or_mistyped_do_not_convert() {
        let many: String = (0..=props::MAX_PROPERTIES).map(|i| prop(&format!("p{i}"), "int_value", "1")).collect();
        let e = body_of(&PayloadKind::JmsText, &jms_text("", &many)).expect_err("too many");
        assert!(e.contains("65 user properties"), "{e}");
        let long = prop("big", "string_value", &"x".repeat(props::MAX_VALUE_BYTES + 1));
        assert!(body_of(&PayloadKind::JmsText, &jms_text("", &long)).expect_err("too long").contains("4001 bytes"));
        let e =
            body_of(&PayloadKind::JmsText, &jms_text("", &prop("x-trace", "int_value", "1"))).expect_err("reserved");
        assert!(e.contains("reserved"), "{e}");
        let e = body_of(&PayloadKind::JmsText, &jms_text("", &prop("a b\n", "int_value", "1"))).expect_err("name");
        assert!(e.contains(r#""a b\n""#), "escaped: {e}");
        let mut inc = incoming(b"x");
        for i in 0..100 {
            inc.header(&format!("h{i}"), "v");
        }
        let e = message_of(&PayloadKind::JmsText, &inc, "P", false).expect_err("too many in");
        assert!(e.contains("100 user properties"), "{e}");
        assert_eq!(inc.jms.user.len(), props::MAX_PROPERTIES + 1, "no more kept than needed to say so");
        let mut inc = incoming(b"x");
        inc.header("Count", "five");
        inc.header("AQ-Property-Types", r#"{"Count":"int"}"#);
        let e = message_of(&PayloadKind::JmsText, &inc, "P", false).expect_err("mistyped");
        assert!(e.contains("not a JMS int"), "{e}");
        let mut inc = incoming(b"x");
        inc.header("JMSXGroupSeq", "third");
        let e = message_of(&PayloadKind::JmsText, &inc, "P", false).expect_err("reserved, mistyped");
        assert!(e.contains("JMSXGroupSeq"), "{e}");
        let mut inc = incoming(b"x");
        inc.header("AQ-Property-Types", "Count=int");
        assert!(message_of(&PayloadKind::JmsText, &inc, "P", false).is_err());
    }
}
