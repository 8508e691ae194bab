//! Step 2 for requests: the AQ methods (`AQXmlSend`, `AQXmlPublish`, `AQXmlReceive`,
//! `AQXmlRegister`, `AQXmlCommit`, `AQXmlRollback`) and their options, messages and headers.

use std::fmt;

use super::*;

pub(super) fn parse_request_method(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Request> {
    expect_ns(e, ACCESS_NS, path)?;
    check_attrs(e, &[], path)?;
    Ok(match &*e.local {
        "AQXmlSend" => Request::Send(parse_enqueue(e, path, limits)?),
        "AQXmlPublish" => Request::Publish(parse_enqueue(e, path, limits)?),
        "AQXmlReceive" => parse_receive(e, path)?,
        "AQXmlRegister" => Request::Register(parse_register(e, path)?),
        "AQXmlCommit" => {
            empty(e, path)?;
            Request::Commit
        }
        "AQXmlRollback" => {
            empty(e, path)?;
            Request::Rollback
        }
        _ => return Err(invalid(format!("{path}: unknown method <{}>", snip(&e.qname)))),
    })
}

/// Handles a trailing `<AQXmlCommit/>` child at `index` of `count` children.
pub(super) fn commit_flag(c: &Elem<'_>, p: &Path<'_>, commit: &mut bool, index: usize, count: usize) -> Result<()> {
    empty(c, p)?;
    if *commit {
        return Err(invalid(format!("{p}: duplicate element")));
    }
    if index + 1 != count {
        return Err(invalid(format!("{p} must be the last element")));
    }
    *commit = true;
    Ok(())
}

pub(super) fn parse_enqueue(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<EnqueueRequest> {
    let mut producer = None;
    let mut messages = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "producer_options" => set_once(&mut producer, parse_producer(c, &p)?, &p)?,
            "message_set" => {
                let set = parse_message_set(c, &p, limits, 1)?;
                let set = set.into_iter().map(|m| m.with_payload(&p)).collect::<Result<Vec<_>>>()?;
                set_once(&mut messages, set, &p)?;
            }
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(EnqueueRequest {
        producer: required(producer, "producer_options", path)?,
        messages: required(messages, "message_set", path)?,
        commit,
    })
}

pub(super) fn parse_destination(e: &Elem, path: &Path<'_>) -> Result<Destination> {
    check_attrs(e, &["lookup_type"], path)?;
    let lookup = match attr(e, "lookup_type") {
        None => LookupType::Database,
        Some(v) => keyword(
            v.trim(),
            &[("DATABASE", LookupType::Database), ("LDAP", LookupType::Ldap)],
            &path.child("@lookup_type"),
        )?,
    };
    let name = leaf_text(e, path)?;
    if name.is_empty() {
        return Err(invalid(format!("{path} is empty")));
    }
    Ok(Destination { name, lookup })
}

pub(super) fn parse_visibility(e: &Elem, path: &Path<'_>) -> Result<Visibility> {
    let s = leaf(e, path)?;
    keyword(&s, &[("ON_COMMIT", Visibility::OnCommit), ("IMMEDIATE", Visibility::Immediate)], path)
}

/// An extension element of [`AQGATE_NS`] among options: `delivery_mode` only, once;
/// `PERSISTENT_OR_BUFFERED` only where `either` (a dequeue). `Ok(false)`: not one.
fn extension(c: &Elem, p: &Path<'_>, path: &Path<'_>, either: bool, mode: &mut Option<DeliveryMode>) -> Result<bool> {
    if c.ns.as_deref() != Some(AQGATE_NS) {
        return Ok(false);
    }
    if c.local != "delivery_mode" {
        return Err(unknown(c, path));
    }
    let s = leaf(c, p)?;
    let mut table = vec![("PERSISTENT", DeliveryMode::Persistent), ("BUFFERED", DeliveryMode::Buffered)];
    if either {
        table.push(("PERSISTENT_OR_BUFFERED", DeliveryMode::PersistentOrBuffered));
    }
    set_once(mode, keyword(&s, &table, p)?, p)?;
    Ok(true)
}

/// `delivery_mode` written without aqgate's namespace: say where it belongs.
fn unqualified_extension(c: &Elem, path: &Path<'_>) -> CodecError {
    if c.local == "delivery_mode" {
        return invalid(format!(
            "{path}: <{}> is an aqgate extension, not IDAP: write it in namespace '{AQGATE_NS}' \
             (<aqgate:delivery_mode xmlns:aqgate=\"{AQGATE_NS}\">BUFFERED</aqgate:delivery_mode>)",
            snip(&c.qname)
        ));
    }
    unknown(c, path)
}

pub(super) fn parse_producer(e: &Elem, path: &Path<'_>) -> Result<ProducerOptions> {
    check_attrs(e, &[], path)?;
    let (mut destination, mut visibility, mut transformation) = (None, None, None);
    let mut delivery_mode = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        if extension(c, &p, path, false, &mut delivery_mode)? {
            continue;
        }
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "visibility" => set_once(&mut visibility, parse_visibility(c, &p)?, &p)?,
            "transformation" => set_once(&mut transformation, leaf(c, &p)?, &p)?,
            _ => return Err(unqualified_extension(c, path)),
        }
    }
    Ok(ProducerOptions {
        destination: required(destination, "destination", path)?,
        visibility: visibility.unwrap_or_default(),
        transformation,
        delivery_mode: delivery_mode.unwrap_or_default(),
    })
}

/// A `message` before the caller decides what its payload must be.
pub(super) struct RawMessage {
    pub(super) number: Option<u32>,
    pub(super) header: MessageHeader,
    pub(super) payload: Option<XmlNode>,
}

impl RawMessage {
    pub(super) fn with_payload(self, set_path: &impl fmt::Display) -> Result<Message> {
        let Some(payload) = self.payload else {
            let n = self.number.map(|n| format!(" {n}")).unwrap_or_default();
            return Err(invalid(format!("{set_path}: message{n} has no <message_payload>")));
        };
        Ok(Message { number: self.number, header: self.header, payload })
    }
}

pub(super) fn parse_message_set(
    e: &Elem,
    path: &Path<'_>,
    limits: &Limits,
    min_messages: usize,
) -> Result<Vec<RawMessage>> {
    check_attrs(e, &[], path)?;
    let mut count: Option<usize> = None;
    let mut messages = Vec::new();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_count" => set_once(&mut count, number(c, &p)?, &p)?,
            "message" => {
                if messages.len() >= limits.max_messages {
                    return Err(CodecError::TooLarge(format!(
                        "{path} holds more than {} messages",
                        limits.max_messages
                    )));
                }
                messages.push(parse_message(c, &p)?);
            }
            _ => return Err(unknown(c, path)),
        }
    }
    if let Some(n) = count
        && n != messages.len()
    {
        return Err(invalid(format!("{path}: message_count is {n} but {} messages are given", messages.len())));
    }
    if messages.len() < min_messages {
        return Err(invalid(format!("{path} contains no message")));
    }
    // message_number names a message (responses and faults refer to it): once each.
    let mut seen = std::collections::HashSet::with_capacity(messages.len());
    if let Some(n) = messages.iter().filter_map(|m| m.number).find(|n| !seen.insert(*n)) {
        return Err(invalid(format!("{path}: message_number {n} is given twice")));
    }
    Ok(messages)
}

pub(super) fn parse_message(e: &Elem, path: &Path<'_>) -> Result<RawMessage> {
    check_attrs(e, &[], path)?;
    let (mut number_, mut header, mut payload) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_number" => set_once(&mut number_, number(c, &p)?, &p)?,
            "message_header" => set_once(&mut header, parse_header(c, &p)?, &p)?,
            "message_payload" => set_once(&mut payload, parse_payload(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(RawMessage { number: number_, header: header.unwrap_or_default(), payload })
}

pub(super) fn parse_payload(e: &Elem, path: &Path<'_>) -> Result<XmlNode> {
    check_attrs(e, &[], path)?;
    let children = struct_children(e, path)?;
    match children.as_slice() {
        [one] => Ok(to_xml_node(one)),
        [] => Err(invalid(format!("{path} must contain one element, found none"))),
        [_, extra, ..] => {
            Err(invalid(format!("{path} must contain one element, found another <{}>", snip(&extra.qname))))
        }
    }
}

pub(super) fn parse_header(e: &Elem, path: &Path<'_>) -> Result<MessageHeader> {
    check_attrs(e, &[], path)?;
    let mut h = MessageHeader::default();
    let mut recipients = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "message_id" => set_once(&mut h.message_id, hex_id(c, &p)?, &p)?,
            "correlation" => set_once(&mut h.correlation, leaf(c, &p)?, &p)?,
            "expiration" => set_once(&mut h.expiration, number(c, &p)?, &p)?,
            "delay" => set_once(&mut h.delay, number(c, &p)?, &p)?,
            "priority" => set_once(&mut h.priority, number(c, &p)?, &p)?,
            "delivery_count" => set_once(&mut h.delivery_count, number(c, &p)?, &p)?,
            "sender_id" => set_once(&mut h.sender_id, parse_agent(c, &p)?, &p)?,
            "recipient_list" => set_once(&mut recipients, parse_recipients(c, &p)?, &p)?,
            "message_state" => set_once(&mut h.message_state, number(c, &p)?, &p)?,
            "exception_queue" => set_once(&mut h.exception_queue, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    h.recipient_list = recipients.unwrap_or_default();
    Ok(h)
}

/// Sets one agent field from `c`; `Ok(false)` if `c` is not an agent field, and an error
/// naming `c` if the field is already set.
pub(super) fn agent_field(agent: &mut AgentRef, c: &Elem<'_>, p: &Path<'_>) -> Result<bool> {
    match &*c.local {
        "agent_name" => set_once(&mut agent.name, leaf(c, p)?, p)?,
        "address" => set_once(&mut agent.address, leaf(c, p)?, p)?,
        "protocol" => set_once(&mut agent.protocol, number(c, p)?, p)?,
        "agent_alias" => set_once(&mut agent.alias, leaf(c, p)?, p)?,
        _ => return Ok(false),
    }
    Ok(true)
}

pub(super) fn agent_field_set(agent: &AgentRef, local: &str) -> bool {
    match local {
        "agent_name" => agent.name.is_some(),
        "address" => agent.address.is_some(),
        "protocol" => agent.protocol.is_some(),
        "agent_alias" => agent.alias.is_some(),
        _ => false,
    }
}

pub(super) fn parse_agent(e: &Elem, path: &Path<'_>) -> Result<AgentRef> {
    check_attrs(e, &[], path)?;
    let mut agent = AgentRef::default();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        if !agent_field(&mut agent, c, &p)? {
            return Err(unknown(c, path));
        }
    }
    Ok(agent)
}

pub(super) fn parse_recipients(e: &Elem, path: &Path<'_>) -> Result<Vec<AgentRef>> {
    check_attrs(e, &["lookup_type"], path)?;
    if let Some(v) = attr(e, "lookup_type") {
        let lookup = keyword(
            v.trim(),
            &[("DATABASE", LookupType::Database), ("LDAP", LookupType::Ldap)],
            &path.child("@lookup_type"),
        )?;
        if lookup == LookupType::Ldap {
            return Err(CodecError::Unsupported(format!(
                "{path}: lookup_type LDAP for a recipient list (use agent_alias)"
            )));
        }
    }
    let mut wrapped: Vec<AgentRef> = Vec::new();
    let mut direct: Vec<AgentRef> = Vec::new();
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "recipient" | "agent" => wrapped.push(parse_agent(c, &p)?),
            local => {
                // Shorthand form: a field already set starts the next recipient.
                if direct.last().is_none_or(|a| agent_field_set(a, local)) {
                    direct.push(AgentRef::default());
                }
                let Some(current) = direct.last_mut() else {
                    return Err(unknown(c, path));
                };
                if !agent_field(current, c, &p)? {
                    return Err(unknown(c, path));
                }
            }
        }
    }
    match (wrapped.is_empty(), direct.is_empty()) {
        (_, true) => Ok(wrapped),
        (true, false) => Ok(direct),
        (false, false) => Err(invalid(format!("{path}: mixes <recipient> elements with bare agent fields"))),
    }
}

/// `AQXmlReceive`: `consumer_options` (a dequeue), or `aqgate:listen` (a LISTEN, which
/// takes nothing and so takes no `AQXmlCommit`).
pub(super) fn parse_receive(e: &Elem, path: &Path<'_>) -> Result<Request> {
    let mut consumer = None;
    let mut listen = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        if c.ns.as_deref() == Some(AQGATE_NS) && c.local == "listen" {
            set_once(&mut listen, parse_listen(c, &p)?, &p)?;
            continue;
        }
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "consumer_options" => set_once(&mut consumer, parse_consumer(c, &p)?, &p)?,
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    match (consumer, listen) {
        (Some(_), Some(_)) => Err(invalid(format!("{path} holds both consumer_options and aqgate:listen"))),
        (None, Some(_)) if commit => Err(invalid(format!(
            "{path}: aqgate:listen dequeues nothing, so there is nothing to commit: send AQXmlCommit on its own"
        ))),
        (None, Some(l)) => Ok(Request::Listen(l)),
        (consumer, None) => {
            Ok(Request::Receive(ReceiveRequest { consumer: required(consumer, "consumer_options", path)?, commit }))
        }
    }
}

pub(super) fn parse_wait_time(e: &Elem, path: &Path<'_>) -> Result<Option<u64>> {
    let s = leaf(e, path)?;
    if s.eq_ignore_ascii_case("FOREVER") || s == "-1" {
        return Ok(None);
    }
    if s.eq_ignore_ascii_case("NO_WAIT") {
        return Ok(Some(0));
    }
    s.parse()
        .map(Some)
        .map_err(|_| invalid(format!("{path}: '{}' is not a number of seconds (or FOREVER, NO_WAIT)", snip(&s))))
}

pub(super) fn parse_selector(e: &Elem, path: &Path<'_>) -> Result<Selector> {
    check_attrs(e, &[], path)?;
    let mut selector: Option<(Selector, &str)> = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        let s = match &*c.local {
            "correlation" => Selector::Correlation(leaf(c, &p)?),
            "message_id" => Selector::MessageId(hex_id(c, &p)?),
            "condition" => Selector::Condition(leaf(c, &p)?),
            _ => return Err(unknown(c, path)),
        };
        if let Some((_, first)) = &selector {
            return Err(invalid(format!(
                "{path} must hold exactly one of correlation, message_id, condition; found <{first}> and <{}>",
                c.local
            )));
        }
        selector = Some((s, &c.local));
    }
    selector
        .map(|(s, _)| s)
        .ok_or_else(|| invalid(format!("{path} must hold one of correlation, message_id, condition")))
}

pub(super) fn parse_consumer(e: &Elem, path: &Path<'_>) -> Result<ConsumerOptions> {
    check_attrs(e, &[], path)?;
    let mut destination = None;
    let mut consumer_name = None;
    let mut wait_time = None;
    let mut selector = None;
    let mut visibility = None;
    let mut dequeue_mode = None;
    let mut navigation = None;
    let mut transformation = None;
    let mut delivery_mode = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        if extension(c, &p, path, true, &mut delivery_mode)? {
            continue;
        }
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "consumer_name" => set_once(&mut consumer_name, leaf(c, &p)?, &p)?,
            "wait_time" => set_once(&mut wait_time, parse_wait_time(c, &p)?, &p)?,
            "selector" => set_once(&mut selector, parse_selector(c, &p)?, &p)?,
            "visibility" => set_once(&mut visibility, parse_visibility(c, &p)?, &p)?,
            "dequeue_mode" => {
                let s = leaf(c, &p)?;
                let mode = keyword(
                    &s,
                    &[
                        ("REMOVE", DequeueMode::Remove),
                        ("BROWSE", DequeueMode::Browse),
                        ("LOCKED", DequeueMode::Locked),
                    ],
                    &p,
                )?;
                set_once(&mut dequeue_mode, mode, &p)?;
            }
            "navigation_mode" => {
                let s = leaf(c, &p)?;
                let mode = keyword(
                    &s,
                    &[
                        ("FIRST_MESSAGE", NavigationMode::FirstMessage),
                        ("NEXT_MESSAGE", NavigationMode::NextMessage),
                        ("NEXT_TRANSACTION", NavigationMode::NextTransaction),
                    ],
                    &p,
                )?;
                set_once(&mut navigation, mode, &p)?;
            }
            "transformation" => set_once(&mut transformation, leaf(c, &p)?, &p)?,
            _ => return Err(unqualified_extension(c, path)),
        }
    }
    Ok(ConsumerOptions {
        destination: required(destination, "destination", path)?,
        consumer_name,
        wait_time: wait_time.flatten(),
        selector,
        visibility: visibility.unwrap_or_default(),
        dequeue_mode: dequeue_mode.unwrap_or_default(),
        navigation: navigation.unwrap_or_default(),
        transformation,
        delivery_mode: delivery_mode.unwrap_or_default(),
    })
}

pub(super) fn parse_register(e: &Elem, path: &Path<'_>) -> Result<RegisterRequest> {
    let mut options = None;
    let mut commit = false;
    let children = struct_children(e, path)?;
    for (i, c) in children.iter().enumerate() {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "register_options" => set_once(&mut options, parse_register_options(c, &p)?, &p)?,
            "AQXmlCommit" => commit_flag(c, &p, &mut commit, i, children.len())?,
            _ => return Err(unknown(c, path)),
        }
    }
    let (destination, consumer_name, notify_url) = required(options, "register_options", path)?;
    Ok(RegisterRequest { destination, consumer_name, notify_url, commit })
}

pub(super) fn parse_register_options(e: &Elem, path: &Path<'_>) -> Result<(Destination, Option<String>, String)> {
    check_attrs(e, &[], path)?;
    let (mut destination, mut consumer_name, mut notify_url) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "consumer_name" => set_once(&mut consumer_name, leaf(c, &p)?, &p)?,
            // Empty means "unregister" (aqgate's documented form).
            "notify_url" => set_once(&mut notify_url, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok((required(destination, "destination", path)?, consumer_name, required(notify_url, "notify_url", path)?))
}
