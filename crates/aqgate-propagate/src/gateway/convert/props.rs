//! JMS properties across the gateway: the JMS header fields (IDAP's `oracle_jms_properties`)
//! and the typed user properties (`user_properties`) of a JMS message, read from a payload
//! going out and written into one coming in, with the bounds on what a message carries
//! (the mapping table is in docs/gateway.md, "JMS properties").
//!
//! - A broker with typed headers (RabbitMQ's AMQP field tables) carries each property with
//!   its type. Brokers whose headers are strings (NATS, MQTT v5 user properties) carry the
//!   value's text, and the header `AQ-Property-Types` (a JSON object, property name → JMS
//!   type: `int`, `long`, `short`, `byte`, `float`, `double`, `boolean`) names the types of
//!   those that are not strings; a header it does not name is a string property.
//! - The header fields travel where the broker has a slot for them (AMQP's `type`,
//!   `app_id`, `reply_to`; MQTT's response topic), else as the JMS names of the field:
//!   `JMSType`, `JMSXAppID`, `JMSXGroupID`, `JMSXGroupSeq`, `JMSReplyTo` (the reply agent's
//!   address), `JMSReplyToName`, `JMSReplyToProtocol`; going out also `JMSXUserID` and
//!   `JMSTimestamp` (AQ sets both at enqueue, so coming in they are not taken). A reserved
//!   header of the wrong type is a conversion failure.
//! - A map message's body is a JSON object of typed values; `AQ-Map-Types` names the JMS
//!   type of each item a JSON reader would type otherwise (a `long` 5, a `float`).
//! - **Bounds.** At most [`MAX_PROPERTIES`] user properties, names of up to
//!   [`MAX_NAME_BYTES`] of ASCII letters, digits, `_ - . $` (none reserved: `AQ-*`, `JMS*`,
//!   `x-*`, `Nats-*`, `Content-Type`, `message-id`), string values of up to
//!   [`MAX_VALUE_BYTES`], [`MAX_TOTAL_BYTES`] in all. A message past them does not convert:
//!   it goes to the job's exception queue with the reason, as a body that does not convert.

use aqgate_proto::idap::{XmlChild, XmlNode};

/// The most user properties a message carries across the gateway.
pub const MAX_PROPERTIES: usize = 64;
/// The longest property name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// The longest string value, in bytes.
pub const MAX_VALUE_BYTES: usize = 4000;
/// Names and values of a message's properties together, in bytes.
pub const MAX_TOTAL_BYTES: usize = 32 * 1024;

/// The header naming the JMS types of the properties a string-only broker carries.
pub const PROPERTY_TYPES: &str = "AQ-Property-Types";
/// The header naming the JMS types of a map message's items a JSON reader would not infer.
pub const MAP_TYPES: &str = "AQ-Map-Types";

pub const JMS_TYPE: &str = "JMSType";
pub const JMS_APPID: &str = "JMSXAppID";
pub const JMS_GROUPID: &str = "JMSXGroupID";
pub const JMS_GROUPSEQ: &str = "JMSXGroupSeq";
pub const JMS_REPLY_TO: &str = "JMSReplyTo";
pub const JMS_REPLY_TO_NAME: &str = "JMSReplyToName";
pub const JMS_REPLY_TO_PROTOCOL: &str = "JMSReplyToProtocol";
pub const JMS_USERID: &str = "JMSXUserID";
pub const JMS_TIMESTAMP: &str = "JMSTimestamp";

/// A JMS property's (or map item's) value, typed as JMS (and IDAP's `*_value` elements).
#[derive(Debug, Clone, PartialEq)]
pub enum JmsValue {
    Boolean(bool),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    String(String),
}

impl JmsValue {
    /// The JMS type's name (`AQ-Property-Types`, `AQ-Map-Types`).
    pub fn type_name(&self) -> &'static str {
        match self {
            JmsValue::Boolean(_) => "boolean",
            JmsValue::Byte(_) => "byte",
            JmsValue::Short(_) => "short",
            JmsValue::Int(_) => "int",
            JmsValue::Long(_) => "long",
            JmsValue::Float(_) => "float",
            JmsValue::Double(_) => "double",
            JmsValue::String(_) => "string",
        }
    }

    /// The value's text (what a string-only broker carries, and the IDAP element's text).
    pub fn text(&self) -> String {
        match self {
            JmsValue::Boolean(b) => b.to_string(),
            JmsValue::Byte(n) => n.to_string(),
            JmsValue::Short(n) => n.to_string(),
            JmsValue::Int(n) => n.to_string(),
            JmsValue::Long(n) => n.to_string(),
            // Debug: the shortest text that reads back the same, with an exponent when large.
            JmsValue::Float(f) => format!("{f:?}"),
            JmsValue::Double(f) => format!("{f:?}"),
            JmsValue::String(s) => s.clone(),
        }
    }

    /// `text` read as JMS type `ty` (a type name, or an IDAP `<ty>_value` element's name).
    pub fn parse(ty: &str, text: &str) -> Option<Self> {
        let ty = ty.strip_suffix("_value").unwrap_or(ty);
        let t = text.trim();
        let finite = |f: f64| f.is_finite().then_some(f);
        Some(match ty {
            "string" => JmsValue::String(text.to_string()),
            "boolean" if t.eq_ignore_ascii_case("true") => JmsValue::Boolean(true),
            "boolean" if t.eq_ignore_ascii_case("false") => JmsValue::Boolean(false),
            "byte" => JmsValue::Byte(t.parse().ok()?),
            "short" => JmsValue::Short(t.parse().ok()?),
            "int" => JmsValue::Int(t.parse().ok()?),
            "long" => JmsValue::Long(t.parse().ok()?),
            "float" => JmsValue::Float(t.parse::<f32>().ok().filter(|f| f.is_finite())?),
            "double" => JmsValue::Double(finite(t.parse().ok()?)?),
            _ => return None,
        })
    }

    /// The IDAP element holding it (`int_value`, …).
    fn element(&self) -> String {
        format!("{}_value", self.type_name())
    }

    /// As a JSON value (a map message's body).
    pub fn json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            JmsValue::Boolean(b) => J::Bool(*b),
            JmsValue::Byte(n) => J::from(*n),
            JmsValue::Short(n) => J::from(*n),
            JmsValue::Int(n) => J::from(*n),
            JmsValue::Long(n) => J::from(*n),
            JmsValue::Float(f) => serde_json::Number::from_f64(f64::from(*f)).map_or(J::Null, J::Number),
            JmsValue::Double(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            JmsValue::String(s) => J::String(s.clone()),
        }
    }

    /// JSON value `v` with JMS type `ty` (from `AQ-Map-Types`), or the type a JSON reader
    /// infers: a whole number an `int` (a `long` past 32 bits), another number a `double`,
    /// `true`/`false` a `boolean`, a string a `string`; anything else its JSON text.
    pub fn of_json(v: &serde_json::Value, ty: Option<&str>) -> Option<Self> {
        use serde_json::Value as J;
        let inferred = match v {
            J::Bool(b) => JmsValue::Boolean(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => i32::try_from(i).map_or(JmsValue::Long(i), JmsValue::Int),
                None => JmsValue::Double(n.as_f64()?),
            },
            J::String(s) => JmsValue::String(s.clone()),
            other => JmsValue::String(other.to_string()),
        };
        match ty {
            None => Some(inferred),
            Some(t) if t == inferred.type_name() => Some(inferred),
            Some(t) => JmsValue::parse(t, &inferred.text()),
        }
    }
}

/// The JMS header fields (IDAP's `oracle_jms_properties`) a message carries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JmsFields {
    pub jms_type: Option<String>,
    pub appid: Option<String>,
    pub groupid: Option<String>,
    pub group_sequence: Option<i32>,
    pub reply_to_name: Option<String>,
    pub reply_to_address: Option<String>,
    pub reply_to_protocol: Option<i32>,
    /// Outbound only: AQ sets it at enqueue.
    pub userid: Option<String>,
    /// Outbound only (milliseconds since the epoch): AQ sets it at enqueue.
    pub timestamp: Option<i64>,
}

/// What a JMS message carries besides its body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JmsProps {
    pub fields: JmsFields,
    /// The user properties, in their order.
    pub user: Vec<(String, JmsValue)>,
    /// A map message's items a JSON reader would type otherwise: name → JMS type.
    pub map_types: Vec<(String, &'static str)>,
}

fn text_of(n: &XmlNode, name: &str) -> Option<String> {
    n.child(name).map(XmlNode::text).map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// A name shown in a reason or a log line: quoted and escaped, at most 64 characters.
pub fn shown(name: &str) -> String {
    let cut: String = name.chars().take(64).collect();
    if cut.len() < name.len() { format!("{cut:?}…") } else { format!("{cut:?}") }
}

/// Whether `name` is reserved for the gateway, the JMS header fields or a broker (never a
/// user property).
pub fn reserved(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    ["aq-", "x-", "jms", "nats-"].iter().any(|p| l.starts_with(p))
        || matches!(l.as_str(), "content-type" | "message-id")
}

/// Checks user properties `user` against the bounds.
pub fn check(user: &[(String, JmsValue)]) -> Result<(), String> {
    if user.len() > MAX_PROPERTIES {
        return Err(format!("{} user properties, over the gateway's {MAX_PROPERTIES}", user.len()));
    }
    let mut total = 0;
    for (name, v) in user {
        let ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.$".contains(&b));
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !ok {
            return Err(format!(
                "property {} is not a name the gateway carries (1 to {MAX_NAME_BYTES} ASCII letters, digits, _ - . $)",
                shown(name)
            ));
        }
        if reserved(name) {
            return Err(format!("property {} has a reserved name (AQ-*, JMS*, x-*, Nats-*)", shown(name)));
        }
        let len = v.text().len();
        if len > MAX_VALUE_BYTES {
            return Err(format!("property {}: {len} bytes, over the gateway's {MAX_VALUE_BYTES}", shown(name)));
        }
        total += name.len() + len;
    }
    if total > MAX_TOTAL_BYTES {
        return Err(format!("user properties of {total} bytes, over the gateway's {MAX_TOTAL_BYTES}"));
    }
    Ok(())
}

impl JmsProps {
    /// The header fields and user properties of JMS payload `p` (as a client receives it),
    /// checked against the bounds.
    pub fn of_payload(p: &XmlNode) -> Result<Self, String> {
        let mut out = JmsProps::default();
        if let Some(h) = p.child("oracle_jms_properties") {
            let f = &mut out.fields;
            f.jms_type = text_of(h, "type");
            f.appid = text_of(h, "appid");
            f.groupid = text_of(h, "groupid");
            f.group_sequence = text_of(h, "group_sequence").and_then(|t| t.parse().ok());
            f.userid = text_of(h, "userid");
            f.timestamp = text_of(h, "timestamp").and_then(|t| t.parse().ok());
            if let Some(r) = h.child("reply_to") {
                f.reply_to_name = text_of(r, "agent_name");
                f.reply_to_address = text_of(r, "address");
                f.reply_to_protocol = text_of(r, "protocol").and_then(|t| t.parse().ok());
            }
        }
        if let Some(u) = p.child("user_properties") {
            for prop in u.elements() {
                let name = prop.child("name").map(XmlNode::text).unwrap_or_default();
                let Some(v) = prop.elements().find(|c| c.local_name() != "name") else { continue };
                let value = JmsValue::parse(&v.local_name().to_ascii_lowercase(), &v.text())
                    .ok_or_else(|| format!("property {} has no JMS value", shown(&name)))?;
                out.user.push((name, value));
            }
        }
        check(&out.user)?;
        Ok(out)
    }

    /// The `oracle_jms_properties` and `user_properties` elements of a payload coming in
    /// (those with content), in their order.
    pub fn elements(&self) -> Vec<XmlNode> {
        let f = &self.fields;
        let mut h = XmlNode::new("oracle_jms_properties");
        if let Some(t) = &f.jms_type {
            h.children.push(XmlChild::Element(leaf("type", t)));
        }
        let mut r = XmlNode::new("reply_to");
        for (name, v) in [
            ("agent_name", f.reply_to_name.clone()),
            ("address", f.reply_to_address.clone()),
            ("protocol", f.reply_to_protocol.map(|p| p.to_string())),
        ] {
            if let Some(v) = v {
                r.children.push(XmlChild::Element(leaf(name, &v)));
            }
        }
        if !r.children.is_empty() {
            h.children.push(XmlChild::Element(r));
        }
        for (name, v) in [
            ("appid", f.appid.clone()),
            ("groupid", f.groupid.clone()),
            ("group_sequence", f.group_sequence.map(|n| n.to_string())),
        ] {
            if let Some(v) = v {
                h.children.push(XmlChild::Element(leaf(name, &v)));
            }
        }
        let mut u = XmlNode::new("user_properties");
        for (name, v) in &self.user {
            u.children.push(XmlChild::Element(item("property", name, v)));
        }
        [h, u].into_iter().filter(|n| !n.children.is_empty()).collect()
    }

    /// Everything as string headers (NATS, MQTT): the header fields under their JMS names,
    /// the user properties as their text, and `AQ-Property-Types` / `AQ-Map-Types`.
    pub fn string_headers(&self) -> Vec<(String, String)> {
        let f = &self.fields;
        let mut h: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                h.push((k.to_string(), v));
            }
        };
        put(JMS_TYPE, f.jms_type.clone());
        put(JMS_APPID, f.appid.clone());
        put(JMS_GROUPID, f.groupid.clone());
        put(JMS_GROUPSEQ, f.group_sequence.map(|n| n.to_string()));
        put(JMS_REPLY_TO, f.reply_to_address.clone());
        put(JMS_REPLY_TO_NAME, f.reply_to_name.clone());
        put(JMS_REPLY_TO_PROTOCOL, f.reply_to_protocol.map(|n| n.to_string()));
        put(JMS_USERID, f.userid.clone());
        put(JMS_TIMESTAMP, f.timestamp.map(|n| n.to_string()));
        let mut types = serde_json::Map::new();
        for (name, v) in &self.user {
            if !matches!(v, JmsValue::String(_)) {
                types.insert(name.clone(), v.type_name().into());
            }
            h.push((name.clone(), v.text()));
        }
        if !types.is_empty() {
            h.push((PROPERTY_TYPES.into(), serde_json::Value::Object(types).to_string()));
        }
        if let Some(m) = self.map_types_header() {
            h.push((MAP_TYPES.into(), m));
        }
        h
    }

    /// `AQ-Map-Types`, if a map item needs it.
    pub fn map_types_header(&self) -> Option<String> {
        if self.map_types.is_empty() {
            return None;
        }
        let m: serde_json::Map<String, serde_json::Value> =
            self.map_types.iter().map(|(k, t)| (k.clone(), serde_json::Value::from(*t))).collect();
        Some(serde_json::Value::Object(m).to_string())
    }
}

/// What a broker message's headers said of its JMS properties, gathered as they come (in
/// any order) and read into [`JmsProps`] by [`Gathered::props`].
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    pub fields: JmsFields,
    pub user: Vec<(String, JmsValue)>,
    /// More user properties came than are kept: how many in all.
    pub user_seen: usize,
    pub property_types: Option<String>,
    pub map_types: Option<String>,
    /// A reserved header of the wrong type: why the message does not convert.
    pub wrong: Option<String>,
}

impl Gathered {
    /// Header `name` with value `v` (typed where the broker types it; a string otherwise).
    /// `AQ-*` headers other than the two type lists are the caller's.
    pub fn header(&mut self, name: &str, v: JmsValue) {
        let text = || match &v {
            JmsValue::String(s) => Some(s.trim().to_string()).filter(|s| !s.is_empty()),
            other => Some(other.text()),
        };
        let int = |what: &str, wrong: &mut Option<String>| match &v {
            JmsValue::Byte(_) | JmsValue::Short(_) | JmsValue::Int(_) | JmsValue::Long(_) | JmsValue::String(_) => {
                let t = v.text();
                match t.trim().parse::<i32>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        wrong.get_or_insert_with(|| format!("header {what}: {} is not a 32-bit int", shown(&t)));
                        None
                    }
                }
            }
            other => {
                wrong.get_or_insert_with(|| format!("header {what}: a {}, not an int", other.type_name()));
                None
            }
        };
        let f = &mut self.fields;
        match name.to_ascii_lowercase().as_str() {
            "aq-property-types" => self.property_types = text(),
            "aq-map-types" => self.map_types = text(),
            "jmstype" => f.jms_type = text(),
            "jmsxappid" => f.appid = text(),
            "jmsxgroupid" => f.groupid = text(),
            "jmsxgroupseq" => f.group_sequence = int(JMS_GROUPSEQ, &mut self.wrong),
            "jmsreplyto" => f.reply_to_address = text(),
            "jmsreplytoname" => f.reply_to_name = text(),
            "jmsreplytoprotocol" => f.reply_to_protocol = int(JMS_REPLY_TO_PROTOCOL, &mut self.wrong),
            _ if reserved(name) => {}
            _ => {
                self.user_seen += 1;
                // Kept up to one past the bound, so that `check` names the excess.
                if self.user.len() <= MAX_PROPERTIES {
                    self.user.push((name.to_string(), v));
                }
            }
        }
    }

    /// The properties, string ones typed by `AQ-Property-Types`, checked against the bounds.
    pub fn props(&self) -> Result<JmsProps, String> {
        if let Some(w) = &self.wrong {
            return Err(w.clone());
        }
        if self.user_seen > MAX_PROPERTIES {
            return Err(format!("{} user properties, over the gateway's {MAX_PROPERTIES}", self.user_seen));
        }
        let types = match &self.property_types {
            Some(t) => type_list(PROPERTY_TYPES, t)?,
            None => Vec::new(),
        };
        let mut user = self.user.clone();
        for (name, ty) in &types {
            let Some((_, v)) = user.iter_mut().find(|(n, _)| n == name) else { continue };
            if let JmsValue::String(s) = v {
                *v = JmsValue::parse(ty, s).ok_or_else(|| {
                    format!("property {}: {} is not a JMS {ty} ({PROPERTY_TYPES})", shown(name), shown(s))
                })?;
            }
        }
        check(&user)?;
        Ok(JmsProps { fields: self.fields.clone(), user, map_types: Vec::new() })
    }

    /// `AQ-Map-Types`, read.
    pub fn map_types(&self) -> Result<Vec<(String, String)>, String> {
        match &self.map_types {
            Some(t) => type_list(MAP_TYPES, t),
            None => Ok(Vec::new()),
        }
    }
}

/// A type list header (`AQ-Property-Types`, `AQ-Map-Types`): a JSON object of name → type.
fn type_list(header: &str, t: &str) -> Result<Vec<(String, String)>, String> {
    const TYPES: [&str; 8] = ["string", "boolean", "byte", "short", "int", "long", "float", "double"];
    let bad = || format!("header {header} is not a JSON object of JMS type names");
    let v: serde_json::Value = serde_json::from_str(t).map_err(|_| bad())?;
    let obj = v.as_object().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(obj.len());
    for (k, ty) in obj {
        let ty = ty.as_str().filter(|t| TYPES.contains(t)).ok_or_else(bad)?;
        out.push((k.clone(), ty.to_string()));
    }
    Ok(out)
}

fn leaf(name: &str, text: &str) -> XmlNode {
    let mut n = XmlNode::new(name);
    n.children.push(XmlChild::Text(text.to_string()));
    n
}

/// A `property` / `item` element: its name and typed value.
pub fn item(element: &str, name: &str, v: &JmsValue) -> XmlNode {
    let mut p = XmlNode::new(element);
    p.children.push(XmlChild::Element(leaf("name", name)));
    p.children.push(XmlChild::Element(leaf(&v.element(), &v.text())));
    p
}
