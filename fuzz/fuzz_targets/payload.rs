//! Payload validation and the stored form.
//!
//! The first byte chooses what the rest is:
//! * 0..=3: an XML payload element, validated for one of the queue kinds below
//!   (`encode`); a payload that is accepted must decode, and encoding the decoded
//!   element again must give the same stored form (the canonical form is stable);
//! * 4..=5: stored bytes of one of the kinds (`decode`, and selector lookups on them);
//! * 6: a queue table's `payload_type` (`PayloadKind::parse`);
//! * 7: `[[types]]` declarations in TOML (`TypeRegistry::new`).
//!
//! The second byte chooses the queue kind.
#![no_main]

use std::sync::OnceLock;

use aqgate_proto::idap::{XmlChild, XmlNode};
use aqgate_proto::payload::{PayloadKind, PayloadView, TypeDef, TypeRegistry, decode, encode};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// The demo types and a few more, so that every attribute type is there.
const TYPES: &str = r#"
[[types]]
name = "CUSTOMER_TYP"
kind = "object"
attributes = [
  { name = "CUSTNO", type = "NUMBER" },
  { name = "CUSTID", type = "VARCHAR2(20)" },
  { name = "NAME", type = "VARCHAR2(100)" },
  { name = "STREET", type = "VARCHAR2(100)" },
  { name = "CITY", type = "VARCHAR2(30)" },
  { name = "STATE", type = "VARCHAR2(2)" },
  { name = "ZIP", type = "NUMBER" },
  { name = "COUNTRY", type = "VARCHAR2(20)" },
]

[[types]]
name = "BOOK_TYP"
kind = "object"
attributes = [
  { name = "TITLE", type = "VARCHAR2(50)" },
  { name = "AUTHORS", type = "VARCHAR2(50)" },
  { name = "ISBN", type = "VARCHAR2(20)" },
  { name = "PRICE", type = "NUMBER" },
]

[[types]]
name = "LINEITEM_TYP"
kind = "object"
attributes = [
  { name = "QUANTITY", type = "NUMBER" },
  { name = "ITEM", type = "BOOK_TYP" },
  { name = "SUBTOTAL", type = "NUMBER" },
]

[[types]]
name = "LINEITEMS_VARTYP"
kind = "varray"
element = "LINEITEM_TYP"
max = 250

[[types]]
name = "ORDER_TYP"
kind = "object"
attributes = [
  { name = "ORDERNO", type = "NUMBER" },
  { name = "STATUS", type = "VARCHAR2(30)" },
  { name = "ORDERTYPE", type = "VARCHAR2(30)" },
  { name = "ORDERREGION", type = "VARCHAR2(30)" },
  { name = "CUSTOMER", type = "CUSTOMER_TYP" },
  { name = "PAYMENTMETHOD", type = "VARCHAR2(30)" },
  { name = "ITEMS", type = "LINEITEMS_VARTYP" },
  { name = "CCNUMBER", type = "VARCHAR2(20)" },
  { name = "ORDER_DATE", type = "DATE" },
]

[[types]]
name = "EMP_TYP"
kind = "object"
attributes = [
  { name = "EMPNO", type = "NUMBER(4)" },
  { name = "ENAME", type = "VARCHAR2(10)" },
  { name = "JOB", type = "VARCHAR2(9)" },
  { name = "MGR", type = "NUMBER(4)" },
  { name = "HIREDATE", type = "DATE" },
  { name = "SAL", type = "NUMBER(7,2)" },
  { name = "COMM", type = "NUMBER(7,2)" },
  { name = "DEPTNO", type = "NUMBER(2)" },
]

[[types]]
name = "ALL_TYP"
kind = "object"
attributes = [
  { name = "N", type = "NUMBER" },
  { name = "NS", type = "NUMBER(*,-3)" },
  { name = "NP", type = "NUMBER(38,127)" },
  { name = "NN", type = "NUMBER(1,-84)" },
  { name = "I", type = "INTEGER" },
  { name = "F", type = "FLOAT(10)" },
  { name = "V", type = "VARCHAR2(5 BYTE)" },
  { name = "C", type = "CHAR" },
  { name = "D", type = "DATE" },
  { name = "T", type = "TIMESTAMP(9)" },
  { name = "T0", type = "TIMESTAMP(0)" },
  { name = "R", type = "RAW(4)" },
  { name = "B", type = "BLOB" },
  { name = "CL", type = "CLOB" },
  { name = "X", type = "XMLTYPE" },
  { name = "E", type = "EMP_TYP" },
  { name = "L", type = "NUMS_VARTYP" },
  { name = "LL", type = "LISTS_VARTYP" },
]

[[types]]
name = "NUMS_VARTYP"
kind = "varray"
element = "NUMBER(3,1)"
max = 3

[[types]]
name = "LISTS_VARTYP"
kind = "varray"
element = "NUMS_VARTYP"
max = 2
"#;

#[derive(Deserialize)]
struct Types {
    #[serde(default)]
    types: Vec<TypeDef>,
}

fn registry() -> &'static TypeRegistry {
    static REG: OnceLock<TypeRegistry> = OnceLock::new();
    REG.get_or_init(|| {
        let defs = toml::from_str::<Types>(TYPES).expect("the target's types parse").types;
        TypeRegistry::new(defs).expect("the target's types are valid")
    })
}

fn kind(b: u8) -> PayloadKind {
    match b % 11 {
        0 => PayloadKind::Raw,
        1 => PayloadKind::Object("ORDER_TYP".into()),
        2 => PayloadKind::Object("EMP_TYP".into()),
        3 => PayloadKind::Object("ALL_TYP".into()),
        4 => PayloadKind::JmsText,
        5 => PayloadKind::JmsMap,
        6 => PayloadKind::JmsBytes,
        7 => PayloadKind::JmsObject,
        8 => PayloadKind::Xml,
        9 => PayloadKind::AnyData,
        _ => PayloadKind::Object("LINEITEMS_VARTYP".into()),
    }
}

/// Drops whitespace-only text beside elements, as the IDAP parser does in payloads.
fn strip_layout(n: &XmlNode) -> XmlNode {
    let has_elements = n.elements().next().is_some();
    XmlNode {
        name: n.name.clone(),
        attrs: n.attrs.clone(),
        children: n
            .children
            .iter()
            .filter_map(|c| match c {
                XmlChild::Element(e) => Some(XmlChild::Element(strip_layout(e))),
                XmlChild::Text(t) if has_elements && t.trim().is_empty() => None,
                XmlChild::Text(t) => Some(XmlChild::Text(t.clone())),
            })
            .collect(),
    }
}

const PATHS: &[&[&str]] = &[
    &[],
    &["orderno"],
    &["customer", "country"],
    &["items"],
    &["sal"],
    &["hiredate"],
    &["t"],
    &["e", "deptno"],
    &["text_data"],
    &["text_len"],
    &["header", "type"],
    &["header", "group_sequence"],
    &["a", "b"],
];

fn lookups(kind: &PayloadKind, reg: &TypeRegistry, stored: &[u8]) {
    let view = PayloadView::new(kind, reg, stored);
    for path in PATHS {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        let _ = view.user_data(&path);
        let _ = reg.has_user_data_path(kind, &path);
    }
    for name in ["Country", "country", "JMSType", "type", "JMSXGroupSeq", "groupid", ""] {
        let _ = view.user_property(name);
    }
}

fuzz_target!(|data: &[u8]| {
    let [mode, k, rest @ ..] = data else { return };
    let reg = registry();
    let kind = kind(*k);
    match mode % 8 {
        0..=3 => {
            let Ok(node) = decode(&PayloadKind::Xml, reg, rest) else { return };
            let node = if mode & 1 == 0 { strip_layout(&node) } else { node };
            let Ok(stored) = encode(&kind, reg, &node) else { return };
            let decoded = match decode(&kind, reg, &stored) {
                Ok(d) => d,
                Err(e) => panic!("an accepted payload does not decode: {e}\n{}", String::from_utf8_lossy(&stored)),
            };
            let again = match encode(&kind, reg, &decoded) {
                Ok(s) => s,
                Err(e) => panic!("a decoded payload is refused: {e}\n{}", String::from_utf8_lossy(&stored)),
            };
            assert_eq!(
                String::from_utf8_lossy(&again),
                String::from_utf8_lossy(&stored),
                "the stored form is not stable"
            );
            lookups(&kind, reg, &stored);
        }
        4 | 5 => {
            let _ = decode(&kind, reg, rest);
            lookups(&kind, reg, rest);
        }
        6 => {
            if let Ok(s) = std::str::from_utf8(rest) {
                let _ = PayloadKind::parse(s);
            }
        }
        _ => {
            if let Ok(s) = std::str::from_utf8(rest)
                && let Ok(types) = toml::from_str::<Types>(s)
                && let Ok(reg) = TypeRegistry::new(types.types)
            {
                let node = XmlNode::new("ORDER_TYP");
                let _ = encode(&PayloadKind::Object("ORDER_TYP".into()), &reg, &node);
            }
        }
    }
});
