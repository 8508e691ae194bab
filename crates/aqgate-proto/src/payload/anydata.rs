//! `SYS.ANYDATA` payloads: one queue, messages of any type, the type travelling with each.
//!
//! In a send the payload element says its type: `<raw>`, a JMS element, an element named
//! after a declared object type, `<VARCHAR2>` / `<NUMBER>` (Oracle's ANYDATA built-ins), or
//! any element marked `aqgate:type_name="SYS.XMLTYPE"` (in [`AQGATE_NS`]) for an XMLType
//! value. The attribute may be written on any of them and must then agree with the element.
//! The stored form is text, type-tagged: `<ANYDATA type="ORDER_TYP"><ORDER_TYP>…</ORDER_TYP>
//! </ANYDATA>`, the inner element being the canonical form of its kind (RAW as upper-case
//! hex in `<raw>`). A dequeue gives the inner element back with `aqgate:type_name` set to
//! the type's name (Oracle's `ANYDATA.GetTypeName`).

use super::*;
use crate::idap::model::AQGATE_NS;

/// The aqgate attribute that names a payload's type (local name, in [`AQGATE_NS`]).
pub const TYPE_NAME_ATTR: &str = "type_name";
/// The prefix aqgate writes the attribute with.
const PREFIX: &str = "aqgate";
/// Longest `<VARCHAR2>` value in an ANYDATA payload, in bytes (PL/SQL's VARCHAR2 limit).
const VARCHAR2_MAX: u32 = 32767;

/// The type of one value in an ANYDATA payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyType {
    /// A payload kind of its own (RAW, an object type, a JMS type, XMLType).
    Kind(PayloadKind),
    Varchar2,
    Number,
}

impl AnyType {
    /// The type's name as `ANYDATA.GetTypeName` gives it: `SYS.RAW`, `SYS.VARCHAR2`,
    /// `SYS.NUMBER`, `SYS.XMLTYPE`, `SYS.AQ$_JMS_TEXT_MESSAGE`, or the object type's name.
    pub fn name(&self) -> String {
        match self {
            AnyType::Kind(PayloadKind::Raw) => "SYS.RAW".into(),
            AnyType::Kind(k) => k.to_string(),
            AnyType::Varchar2 => "SYS.VARCHAR2".into(),
            AnyType::Number => "SYS.NUMBER".into(),
        }
    }

    /// A type name as written in `aqgate:type_name` or a stored form (any case, `SYS.`
    /// optional for the built-ins).
    pub fn parse(s: &str) -> Option<Self> {
        let up = s.trim().to_ascii_uppercase();
        let base = up.strip_prefix("SYS.").unwrap_or(&up);
        match base {
            "VARCHAR2" => return Some(AnyType::Varchar2),
            "NUMBER" => return Some(AnyType::Number),
            "RAW" => return Some(AnyType::Kind(PayloadKind::Raw)),
            _ => {}
        }
        match PayloadKind::parse(&up).ok()? {
            PayloadKind::AnyData => None,
            k => Some(AnyType::Kind(k)),
        }
    }
}

/// The prefix under which `node` declares [`AQGATE_NS`], if it does.
fn aqgate_prefix(node: &XmlNode) -> Option<&str> {
    node.attrs.iter().find_map(|(k, v)| (v == AQGATE_NS).then(|| k.strip_prefix("xmlns:")).flatten())
}

/// The `aqgate:type_name` attribute of a payload element, if it has one.
pub fn type_name_attr(node: &XmlNode) -> Option<&str> {
    let prefix = aqgate_prefix(node)?;
    let qname = format!("{prefix}:{TYPE_NAME_ATTR}");
    node.attrs.iter().find(|(k, _)| *k == qname).map(|(_, v)| v.as_str())
}

/// `node` without `aqgate:type_name` (and without the declaration of aqgate's namespace,
/// when nothing else uses it): what a typed queue stores of a payload that came from an
/// ANYDATA queue.
pub fn without_type_name(node: &XmlNode) -> Cow<'_, XmlNode> {
    let Some(prefix) = aqgate_prefix(node) else { return Cow::Borrowed(node) };
    let qname = format!("{prefix}:{TYPE_NAME_ATTR}");
    let decl = format!("xmlns:{prefix}");
    let mut out = node.clone();
    out.attrs.retain(|(k, _)| *k != qname);
    let used = out.name.starts_with(&format!("{prefix}:"))
        || out.attrs.iter().any(|(k, _)| k.starts_with(&format!("{prefix}:")))
        || uses_prefix(&out.children, prefix);
    if !used {
        out.attrs.retain(|(k, _)| *k != decl);
    }
    Cow::Owned(out)
}

fn uses_prefix(children: &[XmlChild], prefix: &str) -> bool {
    let p = format!("{prefix}:");
    children.iter().any(|c| match c {
        XmlChild::Element(e) => {
            e.name.starts_with(&p) || e.attrs.iter().any(|(k, _)| k.starts_with(&p)) || uses_prefix(&e.children, prefix)
        }
        XmlChild::Text(_) => false,
    })
}

/// Whether a payload marked with `aqgate:type_name` (from an ANYDATA queue) may go into a
/// queue of `kind`: the type it names must be `kind`.
pub(super) fn check_marked(kind: &PayloadKind, node: &XmlNode) -> Result<(), PayloadError> {
    let Some(name) = type_name_attr(node) else { return Ok(()) };
    match AnyType::parse(name) {
        Some(AnyType::Kind(k)) if k == *kind => Ok(()),
        _ => Err(PayloadError::WrongRoot {
            expected: kind.to_string(),
            queue: format!("a queue of type {kind}"),
            got: format!("{} of type {}", node.name, name.trim()),
        }),
    }
}

/// The type of a payload element sent to an ANYDATA queue.
fn type_of(reg: &TypeRegistry, node: &XmlNode) -> Result<AnyType, PayloadError> {
    let local = node.local_name().to_ascii_uppercase();
    let by_element = match local.as_str() {
        "RAW" => Some(AnyType::Kind(PayloadKind::Raw)),
        "VARCHAR2" => Some(AnyType::Varchar2),
        "NUMBER" => Some(AnyType::Number),
        "JMS_TEXT_MESSAGE" => Some(AnyType::Kind(PayloadKind::JmsText)),
        "JMS_MAP_MESSAGE" => Some(AnyType::Kind(PayloadKind::JmsMap)),
        "JMS_BYTES_MESSAGE" => Some(AnyType::Kind(PayloadKind::JmsBytes)),
        "JMS_OBJECT_MESSAGE" => Some(AnyType::Kind(PayloadKind::JmsObject)),
        n if reg.contains(n) => Some(AnyType::Kind(PayloadKind::Object(n.to_string()))),
        _ => None,
    };
    let unknown = || PayloadError::WrongRoot {
        expected: "a payload of a known type (RAW, VARCHAR2, NUMBER, an object type, a JMS type, \
                   or XML marked aqgate:type_name=\"SYS.XMLTYPE\")"
            .into(),
        queue: "a SYS.ANYDATA queue".into(),
        got: node.name.clone(),
    };
    match (type_name_attr(node), by_element) {
        (None, Some(t)) => Ok(t),
        (None, None) => Err(unknown()),
        (Some(name), by_element) => match AnyType::parse(name) {
            Some(AnyType::Kind(PayloadKind::Xml)) => Ok(AnyType::Kind(PayloadKind::Xml)),
            Some(AnyType::Kind(PayloadKind::Object(t))) if !reg.contains(&t) => Err(PayloadError::WrongRoot {
                expected: "a declared object type".into(),
                queue: "a SYS.ANYDATA queue".into(),
                got: format!("type {}", name.trim()),
            }),
            Some(t) if by_element.as_ref() == Some(&t) => Ok(t),
            Some(t) => Err(PayloadError::WrongRoot {
                expected: format!("the element of type {}", t.name()),
                queue: "a SYS.ANYDATA queue".into(),
                got: node.name.clone(),
            }),
            None => Err(unknown()),
        },
    }
}

/// The canonical inner element of a value of type `t`.
fn canonical_value(t: &AnyType, reg: &TypeRegistry, node: &XmlNode) -> Result<XmlNode, PayloadError> {
    let scalar = |spec: &str, name: &str| -> Result<XmlNode, PayloadError> {
        let ty = parse_builtin(spec).ok().flatten().ok_or_else(|| invalid(name, "unknown type"))?;
        let text = leaf_text(node, name)?;
        Ok(leaf(name, canon_scalar(&ty, &text, name)?.unwrap_or_default()))
    };
    match t {
        AnyType::Varchar2 => scalar(&format!("VARCHAR2({VARCHAR2_MAX} BYTE)"), "VARCHAR2"),
        AnyType::Number => scalar("NUMBER", "NUMBER"),
        AnyType::Kind(PayloadKind::Xml) => normalize_xml(&without_type_name(node), 0),
        AnyType::Kind(k) => canonical(k, reg, &without_type_name(node)),
    }
}

/// The stored form of a payload sent to an ANYDATA queue.
pub(super) fn encode_any(reg: &TypeRegistry, node: &XmlNode) -> Result<Vec<u8>, PayloadError> {
    let t = type_of(reg, node)?;
    let inner = canonical_value(&t, reg, node)?;
    let mut wrapper = XmlNode::new("ANYDATA");
    wrapper.attrs.push(("type".into(), t.name()));
    wrapper.children.push(XmlChild::Element(inner));
    Ok(to_xml(&wrapper)?.into_bytes())
}

/// The value and its type in a stored ANYDATA form.
pub(super) fn split_stored(stored: &[u8]) -> Result<(AnyType, XmlNode), PayloadError> {
    let text = std::str::from_utf8(stored).map_err(|e| PayloadError::Corrupt(format!("not UTF-8: {e}")))?;
    let root = parse_xml(text).map_err(PayloadError::Corrupt)?;
    if root.name != "ANYDATA" {
        return Err(PayloadError::Corrupt(format!("stored <{}> where <ANYDATA> belongs", root.name)));
    }
    let name = root.attrs.iter().find(|(k, _)| k == "type").map(|(_, v)| v.as_str()).unwrap_or_default();
    let t =
        AnyType::parse(name).ok_or_else(|| PayloadError::Corrupt(format!("unknown ANYDATA type {}", quote(name))))?;
    let mut inner = root.children.into_iter().filter_map(|c| match c {
        XmlChild::Element(e) => Some(e),
        XmlChild::Text(_) => None,
    });
    let value = inner.next().ok_or_else(|| PayloadError::Corrupt("ANYDATA without a value".into()))?;
    Ok((t, value))
}

/// The payload element a dequeue returns: the value as sent (canonical), marked with its
/// type's name.
pub(super) fn decode_any(stored: &[u8]) -> Result<XmlNode, PayloadError> {
    let (t, mut value) = split_stored(stored)?;
    mark(&mut value, &t.name());
    Ok(value)
}

/// Sets `aqgate:type_name` on `node` (declaring aqgate's namespace if it is not).
fn mark(node: &mut XmlNode, type_name: &str) {
    let prefix = match aqgate_prefix(node) {
        Some(p) => p.to_string(),
        None => {
            // A prefix the element does not use for anything else.
            let mut p = PREFIX.to_string();
            let mut n = 0;
            while node.attrs.iter().any(|(k, _)| *k == format!("xmlns:{p}")) || node.name.starts_with(&format!("{p}:"))
            {
                n += 1;
                p = format!("{PREFIX}{n}");
            }
            node.attrs.push((format!("xmlns:{p}"), AQGATE_NS.to_string()));
            p
        }
    };
    let qname = format!("{prefix}:{TYPE_NAME_ATTR}");
    node.attrs.retain(|(k, _)| *k != qname);
    node.attrs.push((qname, type_name.to_string()));
}

/// The type of an ANYDATA payload as a dequeue returned it (its `aqgate:type_name`).
pub fn type_of_returned(node: &XmlNode) -> Option<AnyType> {
    type_name_attr(node).and_then(AnyType::parse)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reg() -> TypeRegistry {
        let def = TypeDef {
            name: "POINT_TYP".into(),
            kind: TypeKind::Object,
            attributes: vec![
                AttributeDef { name: "X".into(), ty: "NUMBER(5)".into() },
                AttributeDef { name: "LABEL".into(), ty: "VARCHAR2(10)".into() },
            ],
            element: None,
            max: None,
        };
        TypeRegistry::new(vec![def]).unwrap()
    }

    fn node(xml: &str) -> XmlNode {
        parse_xml(xml).unwrap()
    }

    fn round_trip(xml: &str) -> (String, XmlNode) {
        let stored = encode(&PayloadKind::AnyData, &reg(), &node(xml)).unwrap();
        let back = decode(&PayloadKind::AnyData, &reg(), &stored).unwrap();
        (String::from_utf8(stored).unwrap(), back)
    }

    #[test]
    fn each_type_round_trips_with_its_name() {
        for (xml, name) in [
            ("<raw>0a0B</raw>", "SYS.RAW"),
            ("<point_typ><x>12</x><label>a&amp;b</label></point_typ>", "POINT_TYP"),
            ("<jms_text_message><text_data>hi</text_data></jms_text_message>", "SYS.AQ$_JMS_TEXT_MESSAGE"),
            ("<VARCHAR2>hello</VARCHAR2>", "SYS.VARCHAR2"),
            ("<NUMBER>-1.5E3</NUMBER>", "SYS.NUMBER"),
            (r#"<doc a:type_name="SYS.XMLTYPE" xmlns:a="urn:aqgate:idap"><b>1</b></doc>"#, "SYS.XMLTYPE"),
        ] {
            let (stored, back) = round_trip(xml);
            assert!(stored.starts_with(&format!("<ANYDATA type=\"{name}\">")), "{stored}");
            assert_eq!(type_name_attr(&back), Some(name), "{back:?}");
            assert_eq!(type_of_returned(&back).unwrap().name(), name);
            // What comes back goes in again as the same value.
            let again = encode(&PayloadKind::AnyData, &reg(), &back).unwrap();
            assert_eq!(String::from_utf8(again).unwrap(), stored);
        }
        let (_, back) = round_trip("<raw>0a0B</raw>");
        assert_eq!(back.text(), "0A0B");
        let (stored, back) = round_trip(r#"<doc a:type_name="SYS.XMLTYPE" xmlns:a="urn:aqgate:idap"><b>1</b></doc>"#);
        assert!(!stored.contains("urn:aqgate:idap"), "the mark is not stored: {stored}");
        assert_eq!(back.child("b").unwrap().text(), "1");
    }

    #[test]
    fn unknown_and_mismatched_types_are_refused() {
        let refused = |xml: &str| encode(&PayloadKind::AnyData, &reg(), &node(xml)).unwrap_err().to_string();
        assert!(refused("<other_typ><x>1</x></other_typ>").contains("known type"));
        assert!(refused("<point_typ><nope>1</nope></point_typ>").contains("nope"));
        assert!(refused("<point_typ><x>123456</x></point_typ>").contains("X"));
        assert!(refused("<NUMBER>twelve</NUMBER>").contains("not a NUMBER"));
        let e = refused(r#"<raw a:type_name="POINT_TYP" xmlns:a="urn:aqgate:idap">00</raw>"#);
        assert!(e.contains("POINT_TYP"), "{e}");
        let e = refused(r#"<x a:type_name="NOPE_TYP" xmlns:a="urn:aqgate:idap"/>"#);
        assert!(e.contains("declared object type"), "{e}");
    }

    #[test]
    fn a_marked_payload_enters_a_typed_queue_of_its_type_only() {
        let stored = encode(&PayloadKind::AnyData, &reg(), &node("<point_typ><x>1</x></point_typ>")).unwrap();
        let back = decode(&PayloadKind::AnyData, &reg(), &stored).unwrap();
        let typed = PayloadKind::Object("POINT_TYP".into());
        let s = String::from_utf8(encode(&typed, &reg(), &back).unwrap()).unwrap();
        assert_eq!(s, "<POINT_TYP><X>1</X></POINT_TYP>");
        assert!(matches!(encode(&PayloadKind::Xml, &reg(), &back), Err(PayloadError::WrongRoot { .. })));
        let xml = decode(
            &PayloadKind::AnyData,
            &reg(),
            &encode(&PayloadKind::AnyData, &reg(), &node(r#"<d t:type_name="xmltype" xmlns:t="urn:aqgate:idap"/>"#))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(String::from_utf8(encode(&PayloadKind::Xml, &reg(), &xml).unwrap()).unwrap(), "<d/>");
    }

    #[test]
    fn anydata_parses_as_a_payload_kind() {
        assert_eq!(PayloadKind::parse("sys.anydata").unwrap(), PayloadKind::AnyData);
        assert_eq!(PayloadKind::parse("ANYDATA").unwrap(), PayloadKind::AnyData);
        assert_eq!(PayloadKind::AnyData.to_string(), "SYS.ANYDATA");
        assert!(!reg().has_user_data_path(&PayloadKind::AnyData, &[]));
        assert!(encode(&PayloadKind::AnyData, &reg(), &node("<raw>zz</raw>")).is_err());
        assert!(decode(&PayloadKind::AnyData, &reg(), b"<raw>00</raw>").is_err());
    }
}
