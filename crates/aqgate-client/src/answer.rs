//! IDAP answers as typed results: a send's message ids, a receive's messages with their
//! payloads, a commit's or rollback's status, and a `Fault`'s code and text.

use aqgate_proto::code;
use aqgate_proto::idap::{self, FaultKind, Limits, Message, Response};

use crate::request::Payload;

/// What a request answered, when it was not a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// AQXmlSend / AQXmlPublish: the queue and one id per message sent.
    Sent {
        destination: String,
        message_ids: Vec<String>,
    },
    /// AQXmlReceive: the queue and the messages taken (or seen, browsing); empty when
    /// there was none (fault 25228, no message within the wait).
    Received {
        destination: String,
        messages: Vec<Received>,
    },
    Committed,
    RolledBack,
    /// Another answer (register, listen, notification), its element's name.
    Other(&'static str),
}

/// One received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub message_id: Option<String>,
    pub correlation: Option<String>,
    pub priority: Option<i64>,
    pub delivery_count: Option<i64>,
    pub sender: Option<String>,
    pub payload: Payload,
}

impl Received {
    fn from_message(m: &Message) -> Self {
        let h = &m.header;
        Self {
            message_id: h.message_id.clone(),
            correlation: h.correlation.clone(),
            priority: h.priority,
            delivery_count: h.delivery_count,
            sender: h.sender_id.as_ref().and_then(|s| s.name.clone()),
            payload: Payload::from_node(&m.payload),
        }
    }
}

/// An IDAP Fault: Oracle-style code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: i32,
    pub message: String,
    /// The client's doing (`true`) or the server's.
    pub client: bool,
    /// The HTTP status it came with (200, or 409/422/503/400/401).
    pub status: u16,
}

/// A document that is an IDAP answer: `Ok` its result, `Err` its fault. A receive's 25228
/// (no message) is an empty [`Answer::Received`].
pub fn interpret(status: u16, body: &[u8]) -> Result<Result<Answer, Fault>, String> {
    let parsed = idap::parse_response(body, &Limits::default()).map_err(|e| e.to_string())?;
    Ok(match parsed.body {
        Response::Send(s, r) | Response::Publish(s, r) => match (s.status_code, r) {
            (0, Some(r)) => Ok(Answer::Sent { destination: r.destination, message_ids: r.message_ids }),
            _ => Err(status_fault(status, s)),
        },
        Response::Receive(s, r) => match (s.status_code, r) {
            (0, Some(r)) => Ok(Answer::Received {
                destination: r.destination,
                messages: r.messages.iter().map(Received::from_message).collect(),
            }),
            (0, None) => Ok(Answer::Received { destination: String::new(), messages: Vec::new() }),
            _ => Err(status_fault(status, s)),
        },
        Response::Commit(s) if s.status_code == 0 => Ok(Answer::Committed),
        Response::Rollback(s) if s.status_code == 0 => Ok(Answer::RolledBack),
        Response::Commit(s) | Response::Rollback(s) | Response::Register(s) if s.status_code != 0 => {
            Err(status_fault(status, s))
        }
        Response::Fault(f) if f.code == code::NO_MESSAGE => {
            Ok(Answer::Received { destination: String::new(), messages: Vec::new() })
        }
        Response::Fault(f) => {
            Err(Fault { code: f.code, message: f.message, client: f.kind == FaultKind::Client, status })
        }
        Response::Register(_) => Ok(Answer::Other("AQXmlRegisterResponse")),
        Response::Listen(..) => Ok(Answer::Other("AQXmlReceiveResponse")),
        Response::Notification(_) => Ok(Answer::Other("AQXmlNotification")),
        Response::Commit(_) | Response::Rollback(_) => Ok(Answer::Other("response")),
    })
}

fn status_fault(status: u16, s: idap::StatusResponse) -> Fault {
    Fault {
        code: s.error_code.unwrap_or(-1),
        message: s.error_message.unwrap_or_else(|| "the request failed".into()),
        client: true,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aqgate_proto::idap::{
        EnqueueResult, Envelope, MessageHeader, ReceiveResult, StatusResponse, XmlNode, write_response,
    };

    fn doc(r: Response) -> Vec<u8> {
        write_response(&Envelope { headers: Vec::new(), body: r }).into_bytes()
    }

    #[test]
    fn answers_become_typed_results() {
        let sent = doc(Response::Send(
            StatusResponse::ok(),
            Some(EnqueueResult { destination: "Q".into(), message_ids: vec!["A1".into(), "A2".into()] }),
        ));
        assert_eq!(
            interpret(200, &sent).expect("idap"),
            Ok(Answer::Sent { destination: "Q".into(), message_ids: vec!["A1".into(), "A2".into()] })
        );
        let m = Message {
            number: Some(1),
            header: MessageHeader {
                message_id: Some("0A1B".into()),
                correlation: Some("c<&>".into()),
                priority: Some(2),
                ..MessageHeader::default()
            },
            payload: XmlNode::with_text("raw", "4869"),
        };
        let got = doc(Response::Receive(
            StatusResponse::ok(),
            Some(ReceiveResult { destination: "Q".into(), messages: vec![m] }),
        ));
        let Ok(Answer::Received { messages, .. }) = interpret(200, &got).expect("idap") else { panic!("received") };
        assert_eq!(messages[0].message_id.as_deref(), Some("0A1B"));
        assert_eq!(messages[0].correlation.as_deref(), Some("c<&>"));
        assert_eq!(messages[0].payload, Payload::Raw(b"Hi".to_vec()));
        assert_eq!(interpret(200, &doc(Response::Commit(StatusResponse::ok()))), Ok(Ok(Answer::Committed)));
        assert_eq!(interpret(200, &doc(Response::Rollback(StatusResponse::ok()))), Ok(Ok(Answer::RolledBack)));
    }

    #[test]
    fn faults_keep_code_text_and_status_and_no_message_is_empty() {
        let f = |code: i32| {
            doc(Response::Fault(idap::Fault { kind: FaultKind::Client, code, message: format!("because {code}") }))
        };
        assert_eq!(
            interpret(422, &f(code::IDEMPOTENCY_MISMATCH)),
            Ok(Err(Fault { code: 24051, message: "because 24051".into(), client: true, status: 422 }))
        );
        assert_eq!(
            interpret(200, &f(code::NO_MESSAGE)),
            Ok(Ok(Answer::Received { destination: String::new(), messages: Vec::new() }))
        );
        assert!(interpret(502, b"<html>bad gateway</html>").is_err());
    }
}
