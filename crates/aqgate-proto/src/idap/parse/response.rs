//! Step 2 for responses: the method responses, their status and results, notifications
//! and faults.

use super::*;

pub(super) fn parse_response_method(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Response> {
    if e.local == "Fault" && e.ns.as_deref().is_none_or(|ns| ns == ENVELOPE_NS) {
        return Ok(Response::Fault(parse_fault(e, path)?));
    }
    expect_ns(e, ACCESS_NS, path)?;
    check_attrs(e, &[], path)?;
    Ok(match &*e.local {
        "AQXmlSendResponse" => {
            let (status, result) = parse_status_and_result(e, path, "send_result", limits)?;
            Response::Send(status, result.map(|r| r.into_enqueue()).transpose()?)
        }
        "AQXmlPublishResponse" => {
            let (status, result) = parse_status_and_result(e, path, "publish_result", limits)?;
            Response::Publish(status, result.map(|r| r.into_enqueue()).transpose()?)
        }
        "AQXmlReceiveResponse" if is_listen_response(e) => {
            let mut status = None;
            let mut result = None;
            for c in struct_children(e, path)? {
                let p = child_path(path, c);
                if c.ns.as_deref() == Some(AQGATE_NS) && c.local == "listen_result" {
                    set_once(&mut result, parse_listen_result(c, &p)?, &p)?;
                    continue;
                }
                expect_ns(c, ACCESS_NS, &p)?;
                match &*c.local {
                    "status_response" => set_once(&mut status, parse_status(c, &p)?, &p)?,
                    _ => return Err(unknown(c, path)),
                }
            }
            Response::Listen(required(status, "status_response", path)?, result)
        }
        "AQXmlReceiveResponse" => {
            let (status, result) = parse_status_and_result(e, path, "receive_result", limits)?;
            Response::Receive(status, result.map(|r| r.into_receive()).transpose()?)
        }
        "AQXmlRegisterResponse" => Response::Register(parse_status_only(e, path)?),
        "AQXmlCommitResponse" => Response::Commit(parse_status_only(e, path)?),
        "AQXmlRollbackResponse" => Response::Rollback(parse_status_only(e, path)?),
        "AQXmlNotification" => Response::Notification(parse_notification(e, path, limits)?),
        _ => return Err(invalid(format!("{path}: unknown response <{}>", snip(&e.qname)))),
    })
}

/// Whether a receive response answers a LISTEN (holds `aqgate:listen_result`).
fn is_listen_response(e: &Elem) -> bool {
    e.elements().any(|c| c.ns.as_deref() == Some(AQGATE_NS) && c.local == "listen_result")
}

pub(super) fn parse_status(e: &Elem, path: &Path<'_>) -> Result<StatusResponse> {
    check_attrs(e, &[], path)?;
    let (mut status_code, mut error_code, mut error_message) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_code" => set_once(&mut status_code, number(c, &p)?, &p)?,
            "error_code" => set_once(&mut error_code, number(c, &p)?, &p)?,
            "error_message" => set_once(&mut error_message, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(StatusResponse { status_code: required(status_code, "status_code", path)?, error_code, error_message })
}

pub(super) fn parse_status_only(e: &Elem, path: &Path<'_>) -> Result<StatusResponse> {
    let mut status = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_response" => set_once(&mut status, parse_status(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    required(status, "status_response", path)
}

/// The content of `send_result`, `publish_result` or `receive_result`.
pub(super) struct RawResult {
    pub(super) path: String,
    pub(super) destination: Option<String>,
    pub(super) message_ids: Vec<String>,
    pub(super) messages: Option<Vec<RawMessage>>,
}

impl RawResult {
    pub(super) fn into_enqueue(self) -> Result<EnqueueResult> {
        if self.messages.is_some() {
            return Err(invalid(format!("{}: unexpected <message_set>", self.path)));
        }
        Ok(EnqueueResult {
            destination: required(self.destination, "destination", &self.path)?,
            message_ids: self.message_ids,
        })
    }

    pub(super) fn into_receive(self) -> Result<ReceiveResult> {
        if !self.message_ids.is_empty() {
            return Err(invalid(format!("{}: unexpected <message_id>", self.path)));
        }
        let set_path = format!("{}/message_set", self.path);
        let messages = self
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.with_payload(&set_path))
            .collect::<Result<Vec<_>>>()?;
        Ok(ReceiveResult { destination: required(self.destination, "destination", &self.path)?, messages })
    }
}

pub(super) fn parse_status_and_result(
    e: &Elem,
    path: &Path<'_>,
    result_name: &str,
    limits: &Limits,
) -> Result<(StatusResponse, Option<RawResult>)> {
    let (mut status, mut result) = (None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "status_response" => set_once(&mut status, parse_status(c, &p)?, &p)?,
            name if name == result_name => set_once(&mut result, parse_result(c, &p, limits)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok((required(status, "status_response", path)?, result))
}

pub(super) fn parse_result(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<RawResult> {
    check_attrs(e, &[], path)?;
    let mut r = RawResult { path: path.to_string(), destination: None, message_ids: Vec::new(), messages: None };
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut r.destination, non_empty(c, &p)?, &p)?,
            "message_id" => r.message_ids.push(hex_id(c, &p)?),
            "message_set" => set_once(&mut r.messages, parse_message_set(c, &p, limits, 0)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok(r)
}

pub(super) fn parse_notification(e: &Elem, path: &Path<'_>, limits: &Limits) -> Result<Notification> {
    let (mut options, mut messages) = (None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ACCESS_NS, &p)?;
        match &*c.local {
            "notification_options" => {
                check_attrs(c, &[], &p)?;
                let (mut destination, mut consumer_name) = (None, None);
                for o in struct_children(c, &p)? {
                    let op = child_path(&p, o);
                    expect_ns(o, ACCESS_NS, &op)?;
                    match &*o.local {
                        "destination" => set_once(&mut destination, non_empty(o, &op)?, &op)?,
                        "consumer_name" => set_once(&mut consumer_name, leaf(o, &op)?, &op)?,
                        _ => return Err(unknown(o, &p)),
                    }
                }
                let destination = required(destination, "destination", &p)?;
                set_once(&mut options, (destination, consumer_name), &p)?;
            }
            "message_set" => {
                let set = parse_message_set(c, &p, limits, 0)?;
                // Notifications carry properties only; a stray payload is ignored.
                set_once(&mut messages, set.into_iter().map(|m| m.header).collect(), &p)?;
            }
            _ => return Err(unknown(c, path)),
        }
    }
    let (destination, consumer_name) = required(options, "notification_options", path)?;
    Ok(Notification { destination, consumer_name, messages: messages.unwrap_or_default() })
}

pub(super) fn parse_fault(e: &Elem, path: &Path<'_>) -> Result<Fault> {
    check_attrs(e, &[], path)?;
    let (mut faultcode, mut faultstring, mut detail) = (None, None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, ENVELOPE_NS, &p)?;
        match &*c.local {
            "faultcode" => set_once(&mut faultcode, leaf(c, &p)?, &p)?,
            "faultstring" => set_once(&mut faultstring, leaf(c, &p)?, &p)?,
            "detail" => {
                check_attrs(c, &[], &p)?;
                let mut status = None;
                for d in struct_children(c, &p)? {
                    let dp = child_path(&p, d);
                    expect_ns(d, ACCESS_NS, &dp)?;
                    match &*d.local {
                        "status_response" => set_once(&mut status, parse_status(d, &dp)?, &dp)?,
                        _ => return Err(unknown(d, &p)),
                    }
                }
                set_once(&mut detail, status, &p)?;
            }
            _ => return Err(unknown(c, path)),
        }
    }
    let faultcode = required(faultcode, "faultcode", path)?;
    let faultstring = faultstring.unwrap_or_default();
    let status = detail.flatten();

    // The numeric faultcode is aqgate's (and the servlet's); a SOAP-style symbolic one
    // ("Client") falls back on the detail's error_code.
    let code = match faultcode.parse::<i32>() {
        Ok(code) => code,
        Err(_) => status
            .as_ref()
            .and_then(|s| s.error_code)
            .ok_or_else(|| invalid(format!("{path}/faultcode: '{}' is not an error number", snip(&faultcode))))?,
    };
    let server = |s: &str| s.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("server"));
    let kind = if server(&faultstring) || server(&faultcode) { FaultKind::Server } else { FaultKind::Client };
    let message = match status.and_then(|s| s.error_message) {
        Some(m) => m,
        None => ["Client error:", "Server error:"]
            .iter()
            .find_map(|p| faultstring.strip_prefix(p))
            .map(|m| m.trim().to_owned())
            .unwrap_or(faultstring),
    };
    Ok(Fault { kind, code, message })
}
