//! JMS payloads (`SYS.AQ$_JMS_{TEXT,MAP,BYTES,OBJECT}_MESSAGE`): the JMS header fields, typed
//! user properties and the body of each kind, checked into their canonical element.

use std::collections::BTreeSet;

use super::*;
use crate::idap::model::{XmlChild, XmlNode};
use crate::value::Value;

pub(super) const TYPED_VALUES: [&str; 8] = [
    "int_value",
    "string_value",
    "long_value",
    "double_value",
    "boolean_value",
    "float_value",
    "short_value",
    "byte_value",
];

pub(super) fn canon_jms(kind: &PayloadKind, node: &XmlNode) -> Result<XmlNode, PayloadError> {
    let Some((root, body_name)) = kind.jms_root() else {
        return Err(invalid("payload", "not a JMS payload type"));
    };
    if !node.local_name().eq_ignore_ascii_case(root) {
        return Err(PayloadError::WrongRoot {
            expected: root.into(),
            queue: format!("a {kind} queue"),
            got: node.name.clone(),
        });
    }
    let mut props: Option<XmlNode> = None;
    let mut user: Option<XmlNode> = None;
    let mut body: Option<XmlNode> = None;
    for e in child_elements(node, root)? {
        let ln = e.local_name().to_ascii_lowercase();
        let path = format!("{root}.{ln}");
        let slot = match ln.as_str() {
            "oracle_jms_properties" => &mut props,
            "user_properties" => &mut user,
            n if n == body_name => &mut body,
            "text_data" | "map_data" | "bytes_data" | "ser_object_data" => {
                return Err(invalid(root, format!("<{ln}> does not belong in a <{root}> (expected <{body_name}>)")));
            }
            _ => return Err(invalid(root, format!("unknown element <{}>", e.name))),
        };
        if slot.is_some() {
            return Err(invalid(root, format!("duplicate element <{ln}>")));
        }
        *slot = Some(match ln.as_str() {
            "oracle_jms_properties" => canon_jms_header(e, &path)?,
            "user_properties" => canon_named_values(e, "user_properties", "property", &path)?,
            "text_data" => leaf("text_data", leaf_text(e, &path)?),
            "map_data" => canon_named_values(e, "map_data", "item", &path)?,
            _ => leaf(&ln, hex_upper(&parse_hex(&leaf_text(e, &path)?).map_err(|m| invalid(&path, m))?)),
        });
    }
    let mut out = XmlNode::new(root);
    for part in [props, user].into_iter().flatten() {
        if !part.children.is_empty() {
            out.push(part);
        }
    }
    if let Some(b) = body {
        out.push(b);
    }
    Ok(out)
}

pub(super) fn canon_jms_header(node: &XmlNode, path: &str) -> Result<XmlNode, PayloadError> {
    const ORDER: [&str; 5] = ["type", "reply_to", "appid", "groupid", "group_sequence"];
    // Outer Some: the element was given (to catch duplicates); inner None: it was empty.
    let mut fields: [Option<Option<XmlNode>>; 5] = Default::default();
    for e in child_elements(node, path)? {
        let ln = e.local_name().to_ascii_lowercase();
        let p = format!("{path}.{ln}");
        if matches!(ln.as_str(), "userid" | "timestamp" | "recv_timestamp") {
            return Err(invalid(&p, "is set by the server; a client cannot supply it"));
        }
        let Some(i) = ORDER.iter().position(|o| *o == ln) else {
            return Err(invalid(path, format!("unknown element <{}>", e.name)));
        };
        let Some(slot) = fields.get_mut(i) else { continue };
        if slot.is_some() {
            return Err(invalid(path, format!("duplicate element <{ln}>")));
        }
        let v = match ln.as_str() {
            "reply_to" => {
                let r = canon_reply_to(e, &p)?;
                (!r.children.is_empty()).then_some(r)
            }
            "group_sequence" => {
                let t = leaf_text(e, &p)?;
                let t = t.trim();
                if t.is_empty() {
                    None
                } else {
                    let n: i32 =
                        parse_int(t).ok_or_else(|| invalid(&p, format!("value {} is not a 32-bit int", quote(t))))?;
                    Some(leaf(&ln, n.to_string()))
                }
            }
            _ => {
                let t = leaf_text(e, &p)?;
                let t = t.trim();
                if t.chars().count() > JMS_HEADER_MAX {
                    return Err(invalid(&p, format!("longer than {JMS_HEADER_MAX} characters")));
                }
                (!t.is_empty()).then(|| leaf(&ln, t))
            }
        };
        *slot = Some(v);
    }
    let mut out = XmlNode::new("oracle_jms_properties");
    for f in fields.into_iter().flatten().flatten() {
        out.push(f);
    }
    Ok(out)
}

/// Sets `userid` (JMSXUserID) in the `oracle_jms_properties` of a JMS payload as stored:
/// the agent that enqueued the message, which only the server knows (a client cannot
/// supply it, see `canon_jms_header`). It goes where Oracle's `aq$_jms_header` has it,
/// after `type` and `reply_to`; a payload without properties gets them.
pub fn set_jms_userid(payload: &mut XmlNode, userid: &str) {
    let is = |c: &XmlChild, names: &[&str]| matches!(c, XmlChild::Element(e) if names.iter().any(|n| e.local_name().eq_ignore_ascii_case(n)));
    let i = match payload.children.iter().position(|c| is(c, &["oracle_jms_properties"])) {
        Some(i) => i,
        None => {
            payload.children.insert(0, XmlChild::Element(XmlNode::new("oracle_jms_properties")));
            0
        }
    };
    let Some(XmlChild::Element(props)) = payload.children.get_mut(i) else { return };
    props.children.retain(|c| !is(c, &["userid"]));
    let at = props.children.iter().position(|c| !is(c, &["type", "reply_to"])).unwrap_or(props.children.len());
    props.children.insert(at, XmlChild::Element(leaf("userid", userid)));
}

/// Sets `timestamp` (JMSTimestamp: the enqueue time, in milliseconds since the epoch) in the
/// `oracle_jms_properties` of a JMS payload as stored, as Oracle fills it at enqueue. It is
/// the last of the properties a stored payload has (after `group_sequence`, where Oracle's
/// header order has it); a payload without properties gets them.
pub fn set_jms_timestamp(payload: &mut XmlNode, millis: i64) {
    let is = |c: &XmlChild, name: &str| matches!(c, XmlChild::Element(e) if e.local_name().eq_ignore_ascii_case(name));
    let i = match payload.children.iter().position(|c| is(c, "oracle_jms_properties")) {
        Some(i) => i,
        None => {
            payload.children.insert(0, XmlChild::Element(XmlNode::new("oracle_jms_properties")));
            0
        }
    };
    let Some(XmlChild::Element(props)) = payload.children.get_mut(i) else { return };
    props.children.retain(|c| !is(c, "timestamp"));
    props.children.push(XmlChild::Element(leaf("timestamp", millis.to_string())));
}

pub(super) fn canon_reply_to(node: &XmlNode, path: &str) -> Result<XmlNode, PayloadError> {
    const ORDER: [&str; 3] = ["agent_name", "address", "protocol"];
    let mut fields: [Option<String>; 3] = Default::default();
    for e in child_elements(node, path)? {
        let ln = e.local_name().to_ascii_lowercase();
        let p = format!("{path}.{ln}");
        let Some(i) = ORDER.iter().position(|o| *o == ln) else {
            return Err(invalid(path, format!("unknown element <{}>", e.name)));
        };
        let t = leaf_text(e, &p)?;
        let t = t.trim();
        let Some(slot) = fields.get_mut(i) else { continue };
        if slot.is_some() {
            return Err(invalid(path, format!("duplicate element <{ln}>")));
        }
        let v = if ln == "protocol" && !t.is_empty() {
            let n: i32 = parse_int(t)
                .filter(|n: &i32| *n >= 0)
                .ok_or_else(|| invalid(&p, format!("value {} is not a protocol number", quote(t))))?;
            n.to_string()
        } else {
            t.to_string()
        };
        *slot = Some(v);
    }
    let mut out = XmlNode::new("reply_to");
    for (name, v) in ORDER.iter().zip(fields) {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push(leaf(name, v));
        }
    }
    Ok(out)
}

/// Integer text (optional sign) in range of `T`.
pub(super) fn parse_int<T: std::str::FromStr>(t: &str) -> Option<T> {
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// `user_properties` / `map_data`: a list of `property` / `item` with a name and one typed value.
pub(super) fn canon_named_values(
    node: &XmlNode,
    out_name: &str,
    item: &str,
    path: &str,
) -> Result<XmlNode, PayloadError> {
    let mut out = XmlNode::new(out_name);
    let mut names = BTreeSet::new();
    for (i, e) in child_elements(node, path)?.into_iter().enumerate() {
        if !e.local_name().eq_ignore_ascii_case(item) {
            return Err(invalid(path, format!("expected <{item}>, got <{}>", e.name)));
        }
        let name = match e.child("name") {
            Some(n) => leaf_text(n, &format!("{path}.{item}[{}].name", i + 1))?.trim().to_string(),
            None => String::new(),
        };
        let ip = if name.is_empty() { format!("{path}.{item}[{}]", i + 1) } else { format!("{path}.{item}[{name}]") };
        if name.is_empty() {
            return Err(invalid(&ip, "needs a non-empty <name>"));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(&ip, "name given more than once"));
        }
        let mut value: Option<XmlNode> = None;
        let mut seen_name = false;
        for c in child_elements(e, &ip)? {
            let ln = c.local_name().to_ascii_lowercase();
            if ln == "name" {
                if seen_name {
                    return Err(invalid(&ip, "duplicate element <name>"));
                }
                seen_name = true;
                continue;
            }
            if !TYPED_VALUES.contains(&ln.as_str()) {
                return Err(invalid(&ip, format!("unknown element <{}>", c.name)));
            }
            if value.is_some() {
                return Err(invalid(&ip, "needs exactly one value element, got more"));
            }
            let vp = format!("{ip}.{ln}");
            let text = canon_typed(&ln, &leaf_text(c, &vp)?, &vp)?;
            value = Some(leaf(&ln, text));
        }
        let Some(value) = value else {
            return Err(invalid(&ip, format!("needs one of {}", TYPED_VALUES.join(", "))));
        };
        let mut p = XmlNode::new(item);
        p.push(leaf("name", name));
        p.push(value);
        out.push(p);
    }
    Ok(out)
}

/// Checks a typed JMS value; returns its canonical text.
pub(super) fn canon_typed(tag: &str, text: &str, path: &str) -> Result<String, PayloadError> {
    let t = text.trim();
    let bad = |what: &str| invalid(path, format!("value {} is not {what}", quote(t)));
    Ok(match tag {
        "string_value" => text.to_string(),
        "int_value" => parse_int::<i32>(t).ok_or_else(|| bad("a 32-bit int"))?.to_string(),
        "long_value" => parse_int::<i64>(t).ok_or_else(|| bad("a 64-bit long"))?.to_string(),
        "short_value" => parse_int::<i16>(t).ok_or_else(|| bad("a 16-bit short"))?.to_string(),
        "byte_value" => parse_int::<i8>(t).ok_or_else(|| bad("an 8-bit byte"))?.to_string(),
        "float_value" => {
            Decimal::parse(t).ok_or_else(|| bad("a float"))?;
            let v: f32 = t.parse().map_err(|_| bad("a float"))?;
            if !v.is_finite() {
                return Err(bad("within float range"));
            }
            t.to_string()
        }
        "double_value" => {
            Decimal::parse(t).ok_or_else(|| bad("a double"))?;
            let v: f64 = t.parse().map_err(|_| bad("a double"))?;
            if !v.is_finite() {
                return Err(bad("within double range"));
            }
            t.to_string()
        }
        "boolean_value" => {
            if t.eq_ignore_ascii_case("true") {
                "true".into()
            } else if t.eq_ignore_ascii_case("false") {
                "false".into()
            } else {
                return Err(bad("a boolean (true or false)"));
            }
        }
        _ => return Err(invalid(path, format!("unknown value element <{tag}>"))),
    })
}

/// The selector value of a stored typed JMS value element.
pub(super) fn typed_value(e: &XmlNode) -> Value {
    let ln = e.local_name().to_ascii_lowercase();
    let text = e.text();
    match ln.as_str() {
        "string_value" => Value::Text(text),
        "boolean_value" => Value::Bool(text.trim().eq_ignore_ascii_case("true")),
        "int_value" | "long_value" | "short_value" | "byte_value" | "float_value" | "double_value" => {
            Decimal::parse(text.trim()).map_or(Value::Null, |d| Value::Number(d.to_f64()))
        }
        _ => Value::Null,
    }
}
