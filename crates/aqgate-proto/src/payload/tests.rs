//! Tests of the payload kinds: declarations, validation and canonical forms, the stored
//! form, selector lookups, and properties.

use proptest::prelude::*;
use serde::Deserialize;

use super::*;
use crate::value::Value;

const EX01: &str = include_str!("../../../../examples/01-send-adt-single-consumer.xml");
const EX02: &str = include_str!("../../../../examples/02-publish-adt-multi-consumer.xml");
const EX03: &str = include_str!("../../../../examples/03-send-jms-text.xml");
const EX14: &str = include_str!("../../../../examples/14-response-receive-adt.xml");
const EX16: &str = include_str!("../../../../examples/16-servlet-send-oe-order.xml");
const TOPOLOGY: &str = include_str!("../../../../config/topology.toml");

#[derive(Deserialize)]
struct Topo {
    types: Vec<TypeDef>,
}

fn demo_defs() -> Vec<TypeDef> {
    toml::from_str::<Topo>(TOPOLOGY).unwrap().types
}

fn reg() -> TypeRegistry {
    TypeRegistry::new(demo_defs()).unwrap()
}

/// Drops layout whitespace the way the IDAP parser does (text beside elements).
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

fn find<'n>(n: &'n XmlNode, name: &str) -> Option<&'n XmlNode> {
    if n.local_name() == name {
        return Some(n);
    }
    n.elements().find_map(|e| find(e, name))
}

/// The element inside `<message_payload>` of an example document.
fn example_payload(doc: &str) -> XmlNode {
    let root = strip_layout(&parse_xml(doc).unwrap());
    find(&root, "message_payload").unwrap().elements().next().unwrap().clone()
}

fn round_trip(kind: &PayloadKind, node: &XmlNode) -> XmlNode {
    let r = reg();
    let stored = encode(kind, &r, node).unwrap();
    decode(kind, &r, &stored).unwrap()
}

fn obj(name: &str, fields: &[(&str, &str)]) -> XmlNode {
    let mut n = XmlNode::new(name);
    for (k, v) in fields {
        n.push(XmlNode::with_text(*k, *v));
    }
    n
}

fn err_of(kind: &PayloadKind, node: &XmlNode) -> String {
    encode(kind, &reg(), node).unwrap_err().to_string()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn demo_topology_types_parse_and_build() {
    let defs = demo_defs();
    assert_eq!(defs.len(), 6);
    let r = TypeRegistry::new(defs.clone()).unwrap();
    for t in ["CUSTOMER_TYP", "BOOK_TYP", "LINEITEM_TYP", "LINEITEMS_VARTYP", "ORDER_TYP", "EMP_TYP"] {
        assert!(r.contains(t), "{t}");
    }
    assert!(!r.contains("NOPE_TYP"));
    // The engine stores the definitions as JSON.
    let json = serde_json::to_string(&defs).unwrap();
    let back: Vec<TypeDef> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, defs);
}

#[test]
fn typedef_toml_shape() {
    let t: Topo = toml::from_str(
        r#"
            [[types]]
            name = "EMP_TYP"
            kind = "object"
            attributes = [ { name = "EMPNO", type = "NUMBER(4)" }, { name = "ENAME", type = "VARCHAR2(10)" } ]
            [[types]]
            name = "EMPS"
            kind = "varray"
            element = "EMP_TYP"
            max = 3
            "#,
    )
    .unwrap();
    assert_eq!(t.types[1].element.as_deref(), Some("EMP_TYP"));
    assert_eq!(t.types[1].max, Some(3));
    assert!(TypeRegistry::new(t.types).is_ok());
    // Unknown keys are rejected.
    assert!(toml::from_str::<Topo>("[[types]]\nname = \"A\"\nkind = \"object\"\nbogus = 1\n").is_err());
    assert!(toml::from_str::<Topo>("[[types]]\nname = \"A\"\nkind = \"table\"\n").is_err());
    assert!(
        toml::from_str::<Topo>(
            "[[types]]\nname = \"A\"\nkind = \"object\"\nattributes = [{ name = \"X\", type = \"DATE\", len = 3 }]"
        )
        .is_err()
    );
}

fn def(name: &str, attrs: &[(&str, &str)]) -> TypeDef {
    TypeDef {
        name: name.into(),
        kind: TypeKind::Object,
        attributes: attrs.iter().map(|(n, t)| AttributeDef { name: (*n).into(), ty: (*t).into() }).collect(),
        element: None,
        max: None,
    }
}

#[test]
fn registry_rejects_bad_definitions() {
    let e = TypeRegistry::new(vec![def("A", &[("X", "B_TYP")])]).unwrap_err().to_string();
    assert!(e.contains("A.X: unknown type B_TYP"), "{e}");
    let e = TypeRegistry::new(vec![def("A", &[("X", "B")]), def("B", &[("Y", "QS.A")])]).unwrap_err().to_string();
    assert!(e.contains("type cycle: A -> B -> A"), "{e}");
    let e = TypeRegistry::new(vec![def("A", &[("X", "A")])]).unwrap_err().to_string();
    assert!(e.contains("cycle"), "{e}");
    let e = TypeRegistry::new(vec![def("A", &[("X", "NUMBER(0)")])]).unwrap_err().to_string();
    assert!(e.contains("A.X"), "{e}");
    for bad in ["VARCHAR2", "NUMBER(3,x)", "NUMBER(", "RAW", "DATE(3)", "1ABC", "VARCHAR2(10 WORDS)", "TIMESTAMP(12)"] {
        assert!(TypeRegistry::new(vec![def("A", &[("X", bad)])]).is_err(), "{bad}");
    }
    for good in [
        "NUMBER",
        "number(5)",
        "NUMBER(7, 2)",
        "NUMBER(*,2)",
        "NUMBER(5,-2)",
        "INTEGER",
        "VARCHAR2(10 CHAR)",
        "VARCHAR2(10 BYTE)",
        "CHAR",
        "CHAR(3)",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP(3)",
        "RAW(16)",
        "BLOB",
        "CLOB",
        "XMLTYPE",
        "SYS.XMLTYPE",
        "FLOAT",
    ] {
        assert!(TypeRegistry::new(vec![def("A", &[("X", good)])]).is_ok(), "{good}");
    }
    assert!(TypeRegistry::new(vec![def("A", &[("X", "DATE")]), def("a", &[("Y", "DATE")])]).is_err());
    assert!(TypeRegistry::new(vec![def("A", &[("X", "DATE"), ("x", "DATE")])]).is_err());
    assert!(TypeRegistry::new(vec![def("A", &[])]).is_err());
    assert!(TypeRegistry::new(vec![def("DATE", &[("X", "DATE")])]).is_err());
    let v = TypeDef {
        name: "V".into(),
        kind: TypeKind::Varray,
        attributes: vec![],
        element: Some("NUMBER".into()),
        max: None,
    };
    assert!(TypeRegistry::new(vec![v.clone()]).is_err());
    assert!(TypeRegistry::new(vec![TypeDef { max: Some(0), ..v.clone() }]).is_err());
    assert!(TypeRegistry::new(vec![TypeDef { max: Some(2), ..v }]).is_ok());
    // Schema-qualified names lose their schema.
    let r = TypeRegistry::new(vec![def("aquser.emp2", &[("x", "date")])]).unwrap();
    assert!(r.contains("EMP2"));
}

#[test]
fn payload_kind_parse() {
    use PayloadKind::*;
    let cases = [
        ("RAW", Raw),
        ("raw", Raw),
        ("SYS.AQ$_JMS_TEXT_MESSAGE", JmsText),
        ("aq$_jms_text_message", JmsText),
        ("sys.aq$_jms_map_message", JmsMap),
        ("AQ$_JMS_BYTES_MESSAGE", JmsBytes),
        ("SYS.AQ$_JMS_OBJECT_MESSAGE", JmsObject),
        ("XMLTYPE", Xml),
        (" sys.XMLType ", Xml),
        ("QS.ORDER_TYP", Object("ORDER_TYP".into())),
        ("emp_typ", Object("EMP_TYP".into())),
    ];
    for (s, k) in cases {
        assert_eq!(PayloadKind::parse(s).unwrap(), k, "{s}");
    }
    for bad in
        ["", "  ", "A.B.C", "1TYP", "ORDER TYP", "QS.", "SYS.AQ$_JMS_STREAM_MESSAGE", "NUMBER", "VARCHAR2(10)", "A-B"]
    {
        assert!(PayloadKind::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(JmsText.to_string(), "SYS.AQ$_JMS_TEXT_MESSAGE");
    assert_eq!(Object("ORDER_TYP".into()).to_string(), "ORDER_TYP");
}

#[test]
fn example_01_and_16_orders_round_trip() {
    let kind = PayloadKind::Object("ORDER_TYP".into());
    for doc in [EX01, EX16] {
        let p = example_payload(doc);
        assert_eq!(p.name, "ORDER_TYP");
        assert_eq!(round_trip(&kind, &p), p);
    }
    let stored = encode(&kind, &reg(), &example_payload(EX01)).unwrap();
    let text = String::from_utf8(stored).unwrap();
    assert!(text.starts_with("<ORDER_TYP><ORDERNO>4471</ORDERNO>"), "{text}");
    assert!(text.contains("<ITEMS><ITEMS_ITEM><QUANTITY>3</QUANTITY>"), "{text}");
}

#[test]
fn example_02_round_trips_to_example_14() {
    let kind = PayloadKind::Object("EMP_TYP".into());
    let p = example_payload(EX02);
    let back = round_trip(&kind, &p);
    assert_eq!(back, p);
    assert_eq!(back, example_payload(EX14));
    assert!(back.child("JOB").is_none());
    assert_eq!(back.child("HIREDATE").unwrap().text(), "2023-09-18");
}

#[test]
fn example_03_jms_text_round_trips() {
    let p = example_payload(EX03);
    assert_eq!(round_trip(&PayloadKind::JmsText, &p), p);
}

#[test]
fn object_canonicalisation() {
    let kind = PayloadKind::Object("EMP_TYP".into());
    let mut n =
        obj("emp_typ", &[("deptno", "7"), ("Ename", " Mary "), ("SAL", " 100.125 "), ("COMM", "1.50"), ("JOB", "")]);
    n.attrs.push(("xmlns".into(), "urn:x".into()));
    n.children.insert(0, XmlChild::Text("\n  ".into()));
    let back = round_trip(&kind, &n);
    let want = obj("EMP_TYP", &[("ENAME", " Mary "), ("SAL", "100.13"), ("COMM", "1.50"), ("DEPTNO", "7")]);
    assert_eq!(back, want);
    // Rounding that carries, and negative values.
    let back = round_trip(&kind, &obj("EMP_TYP", &[("SAL", "-9999.999"), ("COMM", "+0.004")]));
    assert_eq!(back, obj("EMP_TYP", &[("SAL", "-10000"), ("COMM", "0")]));
    // Exponent notation is a NUMBER; unchanged by rounding, so kept.
    let back = round_trip(&kind, &obj("EMP_TYP", &[("EMPNO", "1E3")]));
    assert_eq!(back, obj("EMP_TYP", &[("EMPNO", "1E3")]));
}

#[test]
fn varray_and_nested_objects() {
    let kind = PayloadKind::Object("ORDER_TYP".into());
    let mut items = XmlNode::new("items");
    for i in 0..3 {
        let mut it = XmlNode::new("whatever");
        it.push(XmlNode::with_text("quantity", i.to_string()));
        items.push(it);
    }
    items.push(XmlNode::new("EMPTY"));
    let mut o = XmlNode::new("ORDER_TYP");
    o.push(items);
    o.push(XmlNode::new("CUSTOMER"));
    let back = round_trip(&kind, &o);
    assert_eq!(back.child("CUSTOMER"), Some(&XmlNode::new("CUSTOMER")));
    let its: Vec<&XmlNode> = back.child("ITEMS").unwrap().elements().collect();
    assert_eq!(its.len(), 4);
    assert!(its.iter().all(|i| i.name == "ITEMS_ITEM"));
    assert_eq!(its[2].child("QUANTITY").unwrap().text(), "2");
    assert!(its[3].children.is_empty());
    // An empty collection stays an empty collection.
    let mut o = XmlNode::new("ORDER_TYP");
    o.push(XmlNode::new("ITEMS"));
    assert_eq!(round_trip(&kind, &o), o);
}

#[test]
fn scalar_varray_xmltype_raw_timestamp_attributes() {
    let defs = vec![
        TypeDef {
            name: "TAGS".into(),
            kind: TypeKind::Varray,
            attributes: vec![],
            element: Some("VARCHAR2(5)".into()),
            max: Some(2),
        },
        def(
            "DOC_TYP",
            &[("ID", "INTEGER"), ("TAGS", "TAGS"), ("BODY", "XMLTYPE"), ("SIG", "RAW(2)"), ("AT", "TIMESTAMP(3)")],
        ),
    ];
    let r = TypeRegistry::new(defs).unwrap();
    let kind = PayloadKind::Object("DOC_TYP".into());
    let mut n = XmlNode::new("DOC_TYP");
    n.push(XmlNode::with_text("ID", "5"));
    let mut tags = XmlNode::new("TAGS");
    tags.push(XmlNode::with_text("t", "ab"));
    tags.push(XmlNode::new("t"));
    n.push(tags);
    let mut body = XmlNode::new("BODY");
    let mut inner = XmlNode::new("x:order");
    inner.attrs.push(("xmlns:x".into(), "urn:o".into()));
    inner.children.push(XmlChild::Text("a & b <c>\r\n".into()));
    body.push(inner.clone());
    n.push(body);
    n.push(XmlNode::with_text("SIG", " ab cd "));
    n.push(XmlNode::with_text("AT", "2024-02-29T23:59:59.123"));
    let stored = encode(&kind, &r, &n).unwrap();
    let back = decode(&kind, &r, &stored).unwrap();
    let tags: Vec<&XmlNode> = back.child("TAGS").unwrap().elements().collect();
    assert_eq!(tags[0], &XmlNode::with_text("TAGS_ITEM", "ab"));
    assert_eq!(tags[1], &XmlNode::new("TAGS_ITEM"));
    assert_eq!(back.child("BODY").unwrap().elements().next(), Some(&inner));
    assert_eq!(back.child("SIG").unwrap().text(), "ABCD");
    let v = PayloadView::new(&kind, &r, &stored);
    assert_eq!(v.user_data(&s(&["at"])), Value::Text("2024-02-29 23:59:59.123".into()));
    assert_eq!(v.user_data(&s(&["id"])), Value::Number(5.0));
    assert_eq!(v.user_data(&s(&["tags"])), Value::Null);
    assert_eq!(
        v.user_data(&s(&["body"])),
        Value::Text("<x:order xmlns:x=\"urn:o\">a &amp; b &lt;c&gt;&#13;\n</x:order>".into())
    );
    let mut bad = XmlNode::new("DOC_TYP");
    let mut tags = XmlNode::new("TAGS");
    tags.push(XmlNode::with_text("t", "toolong"));
    bad.push(tags);
    let e = encode(&kind, &r, &bad).unwrap_err().to_string();
    assert!(e.starts_with("DOC_TYP.TAGS[1]: "), "{e}");
    let e = encode(&kind, &r, &obj("DOC_TYP", &[("AT", "2024-01-01 1:2:3.1234")])).unwrap_err().to_string();
    assert!(e.contains("DOC_TYP.AT"), "{e}");
    let e = encode(&kind, &r, &obj("DOC_TYP", &[("SIG", "ABCDEF")])).unwrap_err().to_string();
    assert!(e.contains("DOC_TYP.SIG") && e.contains("RAW(2)"), "{e}");
}

#[test]
fn mismatch_table() {
    let emp = PayloadKind::Object("EMP_TYP".into());
    let order = PayloadKind::Object("ORDER_TYP".into());
    let mut many = XmlNode::new("ORDER_TYP");
    let mut items = XmlNode::new("ITEMS");
    for _ in 0..251 {
        items.push(XmlNode::new("ITEMS_ITEM"));
    }
    many.push(items);
    let mut nested_bad = XmlNode::new("ORDER_TYP");
    nested_bad.push(obj("CUSTOMER", &[("ZIP", "abc")]));
    let jms = |props: &[(&str, &str)], user: Option<(&str, &str, &str)>| {
        let mut n = XmlNode::new("jms_text_message");
        n.push(obj("oracle_jms_properties", props));
        if let Some((name, tag, v)) = user {
            let mut up = XmlNode::new("user_properties");
            up.push(obj("property", &[("name", name), (tag, v)]));
            n.push(up);
        }
        n.push(XmlNode::with_text("text_data", "hi"));
        n
    };
    let cases: Vec<(PayloadKind, XmlNode, &str)> = vec![
        (emp.clone(), obj("ORDER_TYP", &[]), "expected <EMP_TYP> payload for a queue of type EMP_TYP, got <ORDER_TYP>"),
        (PayloadKind::Raw, obj("EMP_TYP", &[]), "expected <raw> payload for a RAW queue, got <EMP_TYP>"),
        (emp.clone(), obj("EMP_TYP", &[("FOO", "1")]), "EMP_TYP: unknown attribute FOO"),
        (emp.clone(), obj("EMP_TYP", &[("EMPNO", "1"), ("empno", "2")]), "EMP_TYP: duplicate attribute EMPNO"),
        (emp.clone(), obj("EMP_TYP", &[("DEPTNO", "100")]), "EMP_TYP.DEPTNO: value '100' is too large for NUMBER(2)"),
        (emp.clone(), obj("EMP_TYP", &[("SAL", "100000")]), "EMP_TYP.SAL: value '100000' is too large for NUMBER(7,2)"),
        (
            emp.clone(),
            obj("EMP_TYP", &[("HIREDATE", "2000-02-30")]),
            "EMP_TYP.HIREDATE: value '2000-02-30' is not a valid DATE",
        ),
        (emp.clone(), obj("EMP_TYP", &[("HIREDATE", "1900-02-29 0:0:0")]), "EMP_TYP.HIREDATE"),
        (emp.clone(), obj("EMP_TYP", &[("HIREDATE", "2001-01-01 24:0:0")]), "EMP_TYP.HIREDATE"),
        (
            emp.clone(),
            obj("EMP_TYP", &[("ENAME", "Maximilianus")]),
            "EMP_TYP.ENAME: value of 12 characters is too long for VARCHAR2(10)",
        ),
        (emp.clone(), obj("EMP_TYP", &[("EMPNO", "12a")]), "EMP_TYP.EMPNO: value '12a' is not a NUMBER"),
        (emp.clone(), obj("EMP_TYP", &[("EMPNO", "1e999")]), "EMP_TYP.EMPNO"),
        (order.clone(), nested_bad, "ORDER_TYP.CUSTOMER.ZIP: value 'abc' is not a NUMBER"),
        (order.clone(), many, "ORDER_TYP.ITEMS: more than 250 items"),
        (order.clone(), obj("ORDER_TYP", &[("CUSTOMER", "text")]), "ORDER_TYP.CUSTOMER: unexpected text 'text'"),
        (PayloadKind::Raw, XmlNode::with_text("raw", "0g"), "raw: value '0g' is not hexadecimal"),
        (PayloadKind::Raw, XmlNode::with_text("RAW", "abc"), "raw: value 'abc' is not hexadecimal"),
        (
            PayloadKind::JmsMap,
            jms(&[], None),
            "expected <jms_map_message> payload for a SYS.AQ$_JMS_MAP_MESSAGE queue, got <jms_text_message>",
        ),
        (
            PayloadKind::JmsText,
            jms(&[], Some(("Count", "int_value", "abc"))),
            "jms_text_message.user_properties.property[Count].int_value: value 'abc' is not a 32-bit int",
        ),
        (PayloadKind::JmsText, jms(&[], Some(("Big", "int_value", "2147483648"))), "property[Big].int_value"),
        (PayloadKind::JmsText, jms(&[], Some(("B", "byte_value", "128"))), "property[B].byte_value"),
        (PayloadKind::JmsText, jms(&[], Some(("F", "float_value", "1e39"))), "property[F].float_value"),
        (PayloadKind::JmsText, jms(&[], Some(("T", "boolean_value", "yes"))), "property[T].boolean_value"),
        (
            PayloadKind::JmsText,
            jms(&[("userid", "scott")], None),
            "jms_text_message.oracle_jms_properties.userid: is set by the server",
        ),
        (PayloadKind::JmsText, jms(&[("timestamp", "1")], None), "oracle_jms_properties.timestamp"),
        (PayloadKind::JmsText, jms(&[("group_sequence", "x")], None), "oracle_jms_properties.group_sequence"),
        (PayloadKind::JmsText, jms(&[("color", "x")], None), "unknown element <color>"),
    ];
    for (kind, node, want) in cases {
        let e = err_of(&kind, &node);
        assert!(e.contains(want), "got {e:?}, want {want:?}");
    }
}

/// The server sets `userid` on the way out; what was stored keeps its order around it, and
/// the same payload cannot bring its own (`userid: is set by the server` above).
#[test]
fn jms_userid_is_set_in_the_stored_payload_in_header_order() {
    let names = |n: &XmlNode| -> Vec<String> { n.elements().map(|e| e.name.clone()).collect() };
    let mut n = XmlNode::new("jms_text_message");
    n.push(obj("oracle_jms_properties", &[("type", "t"), ("appid", "AQProduct"), ("groupid", "AQ")]));
    n.push(XmlNode::with_text("text_data", "hi"));
    let stored = encode(&PayloadKind::JmsText, &reg(), &n).unwrap();
    let mut out = decode(&PayloadKind::JmsText, &reg(), &stored).unwrap();
    set_jms_userid(&mut out, "SCOTT");
    let props = out.child("oracle_jms_properties").unwrap();
    assert_eq!(names(props), s(&["type", "userid", "appid", "groupid"]));
    assert_eq!(props.child("userid").unwrap().text(), "SCOTT");
    // Set again: replaced, not added.
    set_jms_userid(&mut out, "JOHN");
    let props = out.child("oracle_jms_properties").unwrap();
    assert_eq!(names(props), s(&["type", "userid", "appid", "groupid"]));
    assert_eq!(props.child("userid").unwrap().text(), "JOHN");
    // A payload stored without properties gets them, before the body.
    let mut bare = XmlNode::new("jms_text_message");
    bare.push(XmlNode::with_text("text_data", "hi"));
    let stored = encode(&PayloadKind::JmsText, &reg(), &bare).unwrap();
    let mut out = decode(&PayloadKind::JmsText, &reg(), &stored).unwrap();
    set_jms_userid(&mut out, "SCOTT");
    assert_eq!(names(&out), s(&["oracle_jms_properties", "text_data"]));
    assert_eq!(names(out.child("oracle_jms_properties").unwrap()), s(&["userid"]));
}

#[test]
fn jms_structure_errors_and_other_kinds() {
    let mut n = XmlNode::new("jms_text_message");
    n.push(XmlNode::with_text("map_data", "x"));
    assert!(err_of(&PayloadKind::JmsText, &n).contains("<map_data> does not belong"));
    let mut n = XmlNode::new("jms_text_message");
    let mut up = XmlNode::new("user_properties");
    up.push(obj("property", &[("name", "A"), ("int_value", "1"), ("long_value", "2")]));
    n.push(up);
    assert!(err_of(&PayloadKind::JmsText, &n).contains("exactly one value"));
    let mut n = XmlNode::new("jms_text_message");
    let mut up = XmlNode::new("user_properties");
    up.push(obj("property", &[("name", "A"), ("int_value", "1")]));
    up.push(obj("property", &[("name", "A"), ("int_value", "2")]));
    n.push(up);
    assert!(err_of(&PayloadKind::JmsText, &n).contains("more than once"));

    // Map, bytes and object messages.
    let mut m = XmlNode::new("jms_map_message");
    let mut md = XmlNode::new("map_data");
    md.push(obj("item", &[("name", "qty"), ("short_value", " +12 ")]));
    md.push(obj("item", &[("name", "ok"), ("boolean_value", "TRUE")]));
    md.push(obj("item", &[("name", "pi"), ("double_value", "3.14")]));
    md.push(obj("item", &[("name", "s"), ("string_value", "")]));
    m.push(md);
    let back = round_trip(&PayloadKind::JmsMap, &m);
    let items: Vec<&XmlNode> = back.child("map_data").unwrap().elements().collect();
    assert_eq!(items[0].child("short_value").unwrap().text(), "12");
    assert_eq!(items[1].child("boolean_value").unwrap().text(), "true");
    assert_eq!(items[3].child("string_value"), Some(&XmlNode::new("string_value")));
    let mut b = XmlNode::new("jms_bytes_message");
    b.push(XmlNode::with_text("bytes_data", "0a0B"));
    let back = round_trip(&PayloadKind::JmsBytes, &b);
    assert_eq!(back.child("bytes_data").unwrap().text(), "0A0B");
    let mut o = XmlNode::new("jms_object_message");
    let mut props = XmlNode::new("oracle_jms_properties");
    let mut reply = XmlNode::new("reply_to");
    reply.push(XmlNode::with_text("protocol", "0"));
    reply.push(XmlNode::with_text("agent_name", "bob"));
    props.push(reply);
    props.push(XmlNode::with_text("group_sequence", "007"));
    props.push(XmlNode::with_text("type", " T "));
    o.push(props);
    o.push(XmlNode::with_text("ser_object_data", "ACED"));
    let back = round_trip(&PayloadKind::JmsObject, &o);
    let p = back.child("oracle_jms_properties").unwrap();
    let names: Vec<&str> = p.elements().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["type", "reply_to", "group_sequence"]);
    let names: Vec<&str> = p.child("reply_to").unwrap().elements().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["agent_name", "protocol"]);
    assert_eq!(p.child("group_sequence").unwrap().text(), "7");
    let r = reg();
    let stored = encode(&PayloadKind::JmsObject, &r, &o).unwrap();
    let v = PayloadView::new(&PayloadKind::JmsObject, &r, &stored);
    assert_eq!(v.user_property("JMSXGroupSeq"), Value::Number(7.0));
    assert_eq!(v.user_property("type"), Value::Text("T".into()));
    assert_eq!(v.user_property("appid"), Value::Null);
}

#[test]
fn user_data_lookups() {
    let r = reg();
    let emp = PayloadKind::Object("EMP_TYP".into());
    let stored = encode(&emp, &r, &example_payload(EX02)).unwrap();
    let v = PayloadView::new(&emp, &r, &stored);
    assert_eq!(v.user_data(&s(&["deptno"])), Value::Number(40.0));
    assert_eq!(v.user_data(&s(&["comm"])), Value::Number(312.75));
    assert_eq!(v.user_data(&s(&["ename"])), Value::Text("Okafor".into()));
    assert_eq!(v.user_data(&s(&["hiredate"])), Value::Text("2023-09-18 00:00:00".into()));
    assert_eq!(v.user_data(&s(&["job"])), Value::Null);
    assert_eq!(v.user_data(&s(&["nope"])), Value::Null);
    assert_eq!(v.user_data(&s(&[])), Value::Null);
    assert_eq!(v.user_data(&s(&["deptno", "x"])), Value::Null);
    assert_eq!(v.user_property("Country"), Value::Null);

    let order = PayloadKind::Object("ORDER_TYP".into());
    let stored = encode(&order, &r, &example_payload(EX01)).unwrap();
    let v = PayloadView::new(&order, &r, &stored);
    assert_eq!(v.user_data(&s(&["customer", "country"])), Value::Text("USA".into()));
    assert_eq!(v.user_data(&s(&["customer", "zip"])), Value::Number(97209.0));
    assert_eq!(v.user_data(&s(&["customer"])), Value::Null);
    assert_eq!(v.user_data(&s(&["items"])), Value::Null);
    assert_eq!(v.user_data(&s(&["items", "items_item"])), Value::Null);
    assert_eq!(v.user_data(&s(&["orderno"])), Value::Number(4471.0));

    let raw = PayloadKind::Raw;
    let v = PayloadView::new(&raw, &r, &[0xab, 1]);
    assert_eq!(v.user_data(&[]), Value::Text("AB01".into()));
    assert_eq!(v.user_data(&s(&["x"])), Value::Null);
    assert_eq!(v.user_property("x"), Value::Null);

    let xml = PayloadKind::Xml;
    let mut doc = XmlNode::new("po");
    doc.push(XmlNode::with_text("Region", "EAST"));
    let stored = encode(&xml, &r, &doc).unwrap();
    let v = PayloadView::new(&xml, &r, &stored);
    assert_eq!(v.user_data(&s(&["region"])), Value::Text("EAST".into()));
}

#[test]
fn jms_user_property_lookups() {
    let r = reg();
    let kind = PayloadKind::JmsText;
    let mut p = example_payload(EX03);
    let up = p.children.iter_mut().find_map(|c| match c {
        XmlChild::Element(e) if e.name == "user_properties" => Some(e),
        _ => None,
    });
    let up = up.unwrap();
    up.push(obj("property", &[("name", "count"), ("int_value", "-3")]));
    up.push(obj("property", &[("name", "COUNT"), ("long_value", "9")]));
    up.push(obj("property", &[("name", "vip"), ("boolean_value", "false")]));
    let stored = encode(&kind, &r, &p).unwrap();
    let v = PayloadView::new(&kind, &r, &stored);
    assert_eq!(v.user_property("Warehouse"), Value::Text("PDX-2".into()));
    assert_eq!(v.user_property("warehouse"), Value::Text("PDX-2".into()));
    assert_eq!(v.user_property("Carrier"), Value::Text("Cascade Freight".into()));
    assert_eq!(v.user_property("count"), Value::Number(-3.0));
    assert_eq!(v.user_property("COUNT"), Value::Number(9.0));
    assert_eq!(v.user_property("vip"), Value::Bool(false));
    assert_eq!(v.user_property("missing"), Value::Null);
    assert_eq!(v.user_property("appid"), Value::Text("aqgate-demo".into()));
    assert_eq!(v.user_property("JMSXGroupID"), Value::Text("dock-3".into()));
    assert_eq!(v.user_data(&s(&["text_data"])), Value::Text("Pallet 17 leaves dock 3 at 06:40.".into()));
    assert_eq!(v.user_data(&s(&["text_len"])), Value::Number(33.0));
    assert_eq!(v.user_data(&s(&["header", "appid"])), Value::Text("aqgate-demo".into()));
}

#[test]
fn raw_and_xml_kinds() {
    let r = reg();
    let back = round_trip(&PayloadKind::Raw, &XmlNode::with_text("raw", " 02 3f4523\n"));
    assert_eq!(back, XmlNode::with_text("raw", "023F4523"));
    assert_eq!(encode(&PayloadKind::Raw, &r, &XmlNode::new("raw")).unwrap(), Vec::<u8>::new());
    assert_eq!(round_trip(&PayloadKind::Raw, &XmlNode::new("raw")), XmlNode::new("raw"));
    let mut nested = XmlNode::new("raw");
    nested.push(XmlNode::new("x"));
    assert!(encode(&PayloadKind::Raw, &r, &nested).is_err());

    let mut doc = XmlNode::new("p:doc");
    doc.attrs.push(("xmlns:p".into(), "urn:p".into()));
    doc.attrs.push(("note".into(), "a\"b\t<c>\n".into()));
    doc.children.push(XmlChild::Text(" lead ".into()));
    doc.push(XmlNode::with_text("p:x", "]]> &amp;"));
    doc.children.push(XmlChild::Text("tail".into()));
    doc.push(XmlNode::new("empty"));
    assert_eq!(round_trip(&PayloadKind::Xml, &doc), doc);
    // Adjacent and empty text children are merged / dropped.
    let mut split = XmlNode::new("a");
    split.children = vec![XmlChild::Text("x".into()), XmlChild::Text(String::new()), XmlChild::Text("y".into())];
    assert_eq!(round_trip(&PayloadKind::Xml, &split), XmlNode::with_text("a", "xy"));
    // Unserializable content is an error, not a broken stored form.
    assert!(encode(&PayloadKind::Xml, &r, &XmlNode::new("1bad")).is_err());
    assert!(encode(&PayloadKind::Xml, &r, &XmlNode::with_text("a", "\u{1}")).is_err());
    let mut dup = XmlNode::new("a");
    dup.attrs = vec![("k".into(), "1".into()), ("k".into(), "2".into())];
    assert!(encode(&PayloadKind::Xml, &r, &dup).is_err());
}

#[test]
fn decode_rejects_corrupt_stored_forms() {
    let r = reg();
    let emp = PayloadKind::Object("EMP_TYP".into());
    for bad in [
        &b"<ORDER_TYP/>"[..],
        b"<EMP_TYP>",
        b"\xff\xfe",
        b"",
        b"<!DOCTYPE x><EMP_TYP/>",
        b"<EMP_TYP/><EMP_TYP/>",
        b"x<EMP_TYP/>",
    ] {
        assert!(decode(&emp, &r, bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    assert!(decode(&PayloadKind::JmsText, &r, b"<jms_map_message/>").is_err());
    assert!(decode(&PayloadKind::Xml, &r, b"<a><b></a>").is_err());
    let v = PayloadView::new(&emp, &r, b"<EMP_TYP><DEPTNO>");
    assert_eq!(v.user_data(&s(&["deptno"])), Value::Null);
}

#[test]
fn decimal_rounding() {
    let round = |t: &str, s: i64| {
        let mut d = Decimal::parse(t).unwrap();
        d.round_to_scale(s);
        d.to_plain()
    };
    assert_eq!(round("1.005", 2), "1.01");
    assert_eq!(round("-1.005", 2), "-1.01");
    assert_eq!(round("9.995", 2), "10");
    assert_eq!(round("0.0049", 2), "0");
    assert_eq!(round("0.5", 0), "1");
    assert_eq!(round("12345", -2), "12300");
    assert_eq!(round("12355", -1), "12360");
    assert_eq!(round("0.00001", 2), "0");
    assert_eq!(round("1.5e-3", 4), "0.0015");
    assert_eq!(round("000120.0100", 5), "120.01");
    for bad in ["", "+", ".", "1..2", "1e", "1e+", "e5", "1 2", "0x10", "1e12345", "--1"] {
        assert!(Decimal::parse(bad).is_none(), "{bad}");
    }
    assert!(Decimal::parse(".5").is_some() && Decimal::parse("5.").is_some());
}

#[test]
fn dates() {
    for good in ["1996-01-01 0:0:0", "2000-02-29", "2000-08-23T10:20:30", "9999-12-31 23:59:59", "2024-2-3 1:2:3"] {
        assert!(DateTime::parse(good).is_some(), "{good}");
    }
    for bad in [
        "1900-02-29",
        "2000-02-30",
        "2000-13-01",
        "0000-01-01",
        "99-01-01",
        "2000-01-01 1:2",
        "2000-01-01 1:60:0",
        "2000-01-01x",
        "2000-04-31",
    ] {
        assert!(DateTime::parse(bad).is_none(), "{bad}");
    }
    // A DATE may carry zero fractional seconds, not others.
    let kind = PayloadKind::Object("EMP_TYP".into());
    assert!(encode(&kind, &reg(), &obj("EMP_TYP", &[("HIREDATE", "1996-01-01 00:00:00.0")])).is_ok());
    assert!(encode(&kind, &reg(), &obj("EMP_TYP", &[("HIREDATE", "1996-01-01 00:00:00.5")])).is_err());
}

fn emp_strategy() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    let num = |max: u32| proptest::option::of((0..max).prop_map(|n| n.to_string()));
    let money = proptest::option::of((0u32..100_000, 0u32..100).prop_map(|(i, f)| format!("{i}.{f:02}")));
    let name = |n: usize| {
        proptest::option::of(
            proptest::string::string_regex(&format!("[a-zA-Z0-9 <>&\"'éß\u{1F600}]{{1,{n}}}")).unwrap(),
        )
    };
    let date = proptest::option::of(
        (1u32..=9999, 1u32..=12, 1u32..=28, 0u32..24, 0u32..60, 0u32..60)
            .prop_map(|(y, m, d, h, mi, s)| format!("{y:04}-{m:02}-{d:02} {h}:{mi}:{s}")),
    );
    (num(10_000), name(10), name(9), num(10_000), date, money.clone(), money, num(100)).prop_map(
        |(empno, ename, job, mgr, hire, sal, comm, deptno)| {
            [
                ("EMPNO", empno),
                ("ENAME", ename),
                ("JOB", job),
                ("MGR", mgr),
                ("HIREDATE", hire),
                ("SAL", sal),
                ("COMM", comm),
                ("DEPTNO", deptno),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
        },
    )
}

fn arb_xml() -> impl Strategy<Value = XmlNode> {
    let name = "[a-zA-Z_][a-zA-Z0-9_.-]{0,6}";
    let text = "[a-z <>&\"'\r\n\t]{1,8}";
    let leaf = (name, proptest::option::of(text)).prop_map(|(n, t)| match t {
        Some(t) => XmlNode::with_text(n, t),
        None => XmlNode::new(n),
    });
    leaf.prop_recursive(4, 24, 4, move |inner| {
        (
            name,
            proptest::collection::vec((inner, proptest::option::of(text)), 0..4),
            proptest::option::of(("k[0-9]", text)),
        )
            .prop_map(|(n, kids, attr)| {
                let mut node = XmlNode::new(n);
                if let Some((k, v)) = attr {
                    node.attrs.push((k, v));
                }
                for (k, t) in kids {
                    node.push(k);
                    if let Some(t) = t {
                        node.children.push(XmlChild::Text(t));
                    }
                }
                node
            })
    })
}

/// A plain byte-at-a-time decoder, to check `parse_hex`'s SIMD path and its byte loop.
fn parse_hex_reference(text: &str) -> Result<Vec<u8>, usize> {
    let mut out = Vec::new();
    let mut high: Option<u8> = None;
    for (i, b) in text.bytes().enumerate() {
        if b" \t\r\n".contains(&b) {
            continue;
        }
        let n = (b as char).to_digit(16).ok_or(i)? as u8;
        match high.take() {
            None => high = Some(n),
            Some(h) => out.push(h << 4 | n),
        }
    }
    if high.is_some() { Err(usize::MAX) } else { Ok(out) }
}

proptest! {
    #[test]
    fn hex_fast_path_agrees_with_the_reference(
        digits in "[0-9a-fA-F]{0,80}",
        noise in proptest::option::of((any::<prop::sample::Index>(), prop::sample::select(vec![" ", "\n", "\t", "\r", "g", "é", "0"]))),
    ) {
        let mut text = digits.clone();
        if let Some((at, what)) = noise {
            text.insert_str(at.index(text.len() + 1), what);
        }
        let got = parse_hex(&text);
        match parse_hex_reference(&text) {
            Ok(bytes) => prop_assert_eq!(got, Ok(bytes)),
            Err(usize::MAX) => prop_assert!(got.unwrap_err().contains("odd number of digits")),
            Err(pos) => {
                let msg = got.unwrap_err();
                prop_assert!(msg.contains(&format!("at position {pos})")), "{}", msg);
            }
        }
    }

    #[test]
    fn raw_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..200), lower in any::<bool>()) {
        let r = TypeRegistry::default();
        let h = if lower { hex::encode(&bytes) } else { hex::encode_upper(&bytes) };
        let stored = encode(&PayloadKind::Raw, &r, &XmlNode::with_text("raw", h)).unwrap();
        prop_assert_eq!(&stored, &bytes);
        let back = decode(&PayloadKind::Raw, &r, &stored).unwrap();
        prop_assert_eq!(back.text(), hex::encode_upper(&bytes));
        prop_assert_eq!(hex_upper(&bytes), hex::encode_upper(&bytes));
        prop_assert_eq!(encode(&PayloadKind::Raw, &r, &back).unwrap(), bytes);
    }

    #[test]
    fn emp_round_trip(fields in emp_strategy(), shuffle in any::<prop::sample::Index>()) {
        let r = reg();
        let kind = PayloadKind::Object("EMP_TYP".into());
        let want = obj("EMP_TYP", &fields.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
        // Send in a rotated order with lower-case names: canonical order comes back.
        let mut sent: Vec<(String, String)> =
            fields.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
        if !sent.is_empty() {
            let n = shuffle.index(sent.len());
            sent.rotate_left(n);
        }
        let node = obj("emp_typ", &sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>());
        let stored = encode(&kind, &r, &node).unwrap();
        let back = decode(&kind, &r, &stored).unwrap();
        prop_assert_eq!(&back, &want);
        prop_assert_eq!(encode(&kind, &r, &back).unwrap(), stored.clone());
        let v = PayloadView::new(&kind, &r, &stored);
        for (k, val) in &fields {
            let got = v.user_data(&[k.to_ascii_lowercase()]);
            match *k {
                "ENAME" | "JOB" => prop_assert_eq!(got, Value::Text(val.clone())),
                "HIREDATE" => prop_assert!(matches!(got, Value::Text(_))),
                _ => prop_assert_eq!(got, Value::Number(val.parse::<f64>().unwrap())),
            }
        }
    }

    #[test]
    fn xml_round_trip(node in arb_xml()) {
        let r = TypeRegistry::default();
        let canon = normalize_xml(&node, 0).unwrap();
        let stored = encode(&PayloadKind::Xml, &r, &node).unwrap();
        prop_assert_eq!(decode(&PayloadKind::Xml, &r, &stored).unwrap(), canon);
    }

    #[test]
    fn never_panics_on_stored_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        text in "[<>/a-zA-Z_ &;#=\"]{0,40}",
    ) {
        let r = reg();
        let kinds = [
            PayloadKind::Raw,
            PayloadKind::Object("EMP_TYP".into()),
            PayloadKind::JmsText,
            PayloadKind::Xml,
            PayloadKind::Object("GONE".into()),
        ];
        for k in &kinds {
            for b in [&bytes[..], text.as_bytes()] {
                let _ = decode(k, &r, b);
                let v = PayloadView::new(k, &r, b);
                let _ = v.user_data(&["deptno".to_string()]);
                let _ = v.user_property("x");
            }
        }
    }

    #[test]
    fn never_panics_on_payload_nodes(node in arb_xml(), kind_idx in 0usize..7) {
        let r = reg();
        let kinds = [
            PayloadKind::Raw,
            PayloadKind::Object("EMP_TYP".into()),
            PayloadKind::Object("ORDER_TYP".into()),
            PayloadKind::JmsText,
            PayloadKind::JmsMap,
            PayloadKind::Xml,
            PayloadKind::Object("GONE".into()),
        ];
        let _ = encode(&kinds[kind_idx], &r, &node);
    }

    #[test]
    fn numbers_fit_their_declaration(i in -99_999i64..=99_999, f in 0u32..1000) {
        let r = reg();
        let kind = PayloadKind::Object("EMP_TYP".into());
        let t = format!("{i}.{f:03}");
        match encode(&kind, &r, &obj("EMP_TYP", &[("SAL", &t)])) {
            Ok(stored) => {
                let v = PayloadView::new(&kind, &r, &stored).user_data(&["sal".to_string()]);
                let Value::Number(n) = v else { panic!("not a number") };
                let want = t.parse::<f64>().unwrap();
                prop_assert!((n - want).abs() <= 0.005 + 1e-9, "{} vs {}", n, want);
            }
            Err(e) => prop_assert!(e.to_string().contains("EMP_TYP.SAL"), "{}", e),
        }
    }
}
