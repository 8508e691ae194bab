//! aqgate's LISTEN (Oracle's DBMS_AQ.LISTEN) inside IDAP: `aqgate:listen` in
//! `AQXmlReceive` (instead of `consumer_options`) and `aqgate:listen_result` in its
//! response (instead of `receive_result`). Every element of both is in [`AQGATE_NS`]:
//!
//! ```xml
//! <aqgate:listen xmlns:aqgate="urn:aqgate:idap">
//!   <aqgate:agent><aqgate:destination>AQUSER.Q1</aqgate:destination></aqgate:agent>
//!   <aqgate:agent><aqgate:destination>AQUSER.T2</aqgate:destination>
//!                 <aqgate:consumer_name>APP1</aqgate:consumer_name></aqgate:agent>
//!   <aqgate:wait_time>10</aqgate:wait_time>
//! </aqgate:listen>
//! ```

use super::*;

/// `aqgate:listen`: 1 to [`MAX_LISTEN_AGENTS`] agents and an optional wait time.
pub(super) fn parse_listen(e: &Elem, path: &Path<'_>) -> Result<ListenRequest> {
    check_attrs(e, &[], path)?;
    let mut agents = Vec::new();
    let mut wait_time = None;
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, AQGATE_NS, &p)?;
        match &*c.local {
            "agent" => {
                if agents.len() >= MAX_LISTEN_AGENTS {
                    return Err(CodecError::TooLarge(format!(
                        "{path} names more than {MAX_LISTEN_AGENTS} agents (LISTEN's limit)"
                    )));
                }
                agents.push(parse_agent_of(c, &p)?);
            }
            "wait_time" => set_once(&mut wait_time, parse_wait_time(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    if agents.is_empty() {
        return Err(invalid(format!("{path} names no <aqgate:agent>")));
    }
    Ok(ListenRequest { agents, wait_time: wait_time.flatten() })
}

/// One `aqgate:agent` (or the content of `aqgate:listen_result`): a destination and an
/// optional consumer name.
fn agent_fields(e: &Elem, path: &Path<'_>) -> Result<(Destination, Option<String>)> {
    check_attrs(e, &[], path)?;
    let (mut destination, mut consumer_name) = (None, None);
    for c in struct_children(e, path)? {
        let p = child_path(path, c);
        expect_ns(c, AQGATE_NS, &p)?;
        match &*c.local {
            "destination" => set_once(&mut destination, parse_destination(c, &p)?, &p)?,
            "consumer_name" => set_once(&mut consumer_name, leaf(c, &p)?, &p)?,
            _ => return Err(unknown(c, path)),
        }
    }
    Ok((required(destination, "destination", path)?, consumer_name.filter(|n| !n.is_empty())))
}

fn parse_agent_of(e: &Elem, path: &Path<'_>) -> Result<ListenAgent> {
    let (destination, consumer_name) = agent_fields(e, path)?;
    Ok(ListenAgent { destination, consumer_name })
}

/// `aqgate:listen_result`.
pub(super) fn parse_listen_result(e: &Elem, path: &Path<'_>) -> Result<ListenResult> {
    let (destination, consumer_name) = agent_fields(e, path)?;
    Ok(ListenResult { destination: destination.name, consumer_name })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::idap::{write_request, write_response};

    fn envelope(body: &str) -> String {
        format!(
            r#"<?xml version="1.0"?><Envelope xmlns="http://ns.oracle.com/AQ/schemas/envelope"><Body>
            <AQXmlReceive xmlns="http://ns.oracle.com/AQ/schemas/access">{body}</AQXmlReceive></Body></Envelope>"#
        )
    }

    fn agents(n: usize) -> String {
        (0..n).map(|i| format!("<x:agent><x:destination>AQ.Q{i}</x:destination></x:agent>")).collect()
    }

    fn listen(inner: &str) -> String {
        envelope(&format!(r#"<x:listen xmlns:x="urn:aqgate:idap">{inner}</x:listen>"#))
    }

    #[test]
    fn a_listen_parses_and_round_trips() {
        let xml = listen(
            "<x:agent><x:destination>AQUSER.Q1</x:destination></x:agent>\
             <x:agent><x:destination lookup_type=\"LDAP\">cn=t2</x:destination><x:consumer_name>APP1</x:consumer_name></x:agent>\
             <x:wait_time>7</x:wait_time>",
        );
        let env = parse_request(xml.as_bytes(), &Limits::default()).unwrap();
        let Request::Listen(l) = &env.body else { panic!("{:?}", env.body) };
        assert_eq!(l.wait_time, Some(7));
        assert_eq!(l.agents.len(), 2);
        assert_eq!(l.agents[0], ListenAgent { destination: Destination::database("AQUSER.Q1"), consumer_name: None });
        assert_eq!(l.agents[1].destination.lookup, LookupType::Ldap);
        assert_eq!(l.agents[1].consumer_name.as_deref(), Some("APP1"));
        assert_eq!(env.body.method_name(), "AQXmlReceive");
        let again = parse_request(write_request(&env).as_bytes(), &Limits::default()).unwrap();
        assert_eq!(again.body, env.body);
        let forever = parse_request(
            listen(&format!("{}<x:wait_time>FOREVER</x:wait_time>", agents(1))).as_bytes(),
            &Limits::default(),
        );
        assert!(matches!(forever.unwrap().body, Request::Listen(ListenRequest { wait_time: None, .. })));
    }

    #[test]
    fn bad_listens_are_refused() {
        let err = |xml: &str| parse_request(xml.as_bytes(), &Limits::default()).unwrap_err();
        assert!(matches!(err(&listen(&agents(MAX_LISTEN_AGENTS + 1))), CodecError::TooLarge(m) if m.contains("32")));
        assert!(parse_request(listen(&agents(MAX_LISTEN_AGENTS)).as_bytes(), &Limits::default()).is_ok());
        assert!(matches!(err(&listen("")), CodecError::Invalid(m) if m.contains("no <aqgate:agent>")));
        assert!(matches!(
            err(&listen("<x:agent><x:consumer_name>A</x:consumer_name></x:agent>")),
            CodecError::Invalid(_)
        ));
        // Children in aqgate's namespace (or none), not IDAP's.
        let e = err(&listen("<x:agent><destination>AQ.Q</destination></x:agent>"));
        assert!(matches!(e, CodecError::WrongNamespace(_)), "{e:?}");
        let commit =
            envelope(&format!(r#"<x:listen xmlns:x="urn:aqgate:idap">{}</x:listen><AQXmlCommit/>"#, agents(1)));
        assert!(matches!(err(&commit), CodecError::Invalid(m) if m.contains("nothing to commit")));
        let both = envelope(&format!(
            r#"<consumer_options><destination>AQ.Q</destination></consumer_options><x:listen xmlns:x="urn:aqgate:idap">{}</x:listen>"#,
            agents(1)
        ));
        assert!(matches!(err(&both), CodecError::Invalid(m) if m.contains("both")));
        let other = envelope(r#"<x:other xmlns:x="urn:aqgate:idap"/>"#);
        assert!(matches!(err(&other), CodecError::WrongNamespace(_) | CodecError::Invalid(_)));
    }

    #[test]
    fn a_listen_result_round_trips() {
        for consumer in [None, Some("APP1".to_string())] {
            let env = Envelope {
                headers: Vec::new(),
                body: Response::Listen(
                    StatusResponse::ok(),
                    Some(ListenResult { destination: "AQUSER.Q2".into(), consumer_name: consumer.clone() }),
                ),
            };
            let xml = write_response(&env);
            assert!(xml.contains("<aqgate:listen_result xmlns:aqgate=\"urn:aqgate:idap\">"), "{xml}");
            assert_eq!(parse_response(xml.as_bytes(), &Limits::default()).unwrap().body, env.body);
        }
    }
}
