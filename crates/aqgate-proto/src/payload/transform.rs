//! Transformations (DBMS_TRANSFORM.CREATE_TRANSFORMATION with one
//! ADD_ATTRIBUTE_TRANSFORMATION per target attribute): a message of one payload type made
//! into a message of an object type, each target attribute computed by an [`Expression`]
//! over the source (`source.<attribute>`).
//!
//! The target is an object type: its declared attributes are what the expressions fill. RAW,
//! JMS and XMLTYPE payloads have no declared attributes to compute (Oracle builds them with
//! a PL/SQL function, which aqgate does not run), so they may only be the source.
//!
//! [`Transformation::compile`] checks everything it can once, at topology load: every
//! target attribute exists, every expression parses, every `source` path exists in the
//! source type, objects are copied whole into attributes of the same type and never
//! computed with, literals fit their attribute, and a required attribute has an
//! expression. [`Transformation::apply`] checks each computed value against its attribute
//! (NUMBER precision, VARCHAR2 length, DATE syntax, ...) as an enqueue does, and a failure
//! names the attribute.

use std::collections::BTreeMap;

use super::*;
use crate::selector::{Budget, ConditionContext, Expression, Limits, ValueType};
use crate::value::Value;

/// A compiled transformation.
#[derive(Debug, Clone)]
pub struct Transformation {
    /// `SCHEMA.NAME`, upper-case.
    pub name: String,
    pub from: PayloadKind,
    /// Always an object type.
    pub to: PayloadKind,
    /// In the target type's declared order; attributes without an expression are NULL.
    attributes: Vec<TargetAttr>,
}

#[derive(Debug, Clone)]
struct TargetAttr {
    name: String,
    ty: Ty,
    expr: Expression,
    required: bool,
}

/// A transformation that failed on one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("error on transformation of message: transformation {transformation}, attribute {attribute}: {message}")]
pub struct TransformError {
    pub transformation: String,
    pub attribute: String,
    pub message: String,
}

impl Transformation {
    /// Checks and compiles a transformation. `attributes`: target attribute name →
    /// expression text; `required`: attributes whose value must not be NULL. Errors are
    /// `<key>: <problem>`, the key relative to the transformation (`attributes.ENAME`).
    pub fn compile(
        name: &str,
        from: PayloadKind,
        to: PayloadKind,
        attributes: &BTreeMap<String, String>,
        required: &[String],
        reg: &TypeRegistry,
    ) -> Result<Transformation, Vec<String>> {
        let mut errors = Vec::new();
        let PayloadKind::Object(target) = &to else {
            return Err(vec![format!(
                "to_type: {to} has no attributes to compute; a transformation makes an object type (declared in [[types]])"
            )]);
        };
        let Some(Body::Object(declared)) = reg.types.get(target) else {
            return Err(vec![format!("to_type: {target} is not a declared object type")]);
        };
        let mut exprs: Vec<Option<Expression>> = vec![None; declared.len()];
        for (attr, text) in attributes {
            let key = format!("attributes.{attr}");
            let Some(i) = declared.iter().position(|a| a.name.eq_ignore_ascii_case(attr.trim())) else {
                errors.push(format!("{key}: {target} has no attribute {attr}"));
                continue;
            };
            let a = &declared[i];
            if exprs[i].is_some() {
                errors.push(format!("{key}: {} is given twice", a.name));
                continue;
            }
            let expr = match Expression::parse(text) {
                Ok(e) => e,
                Err(e) => {
                    errors.push(format!("{key}: {e}"));
                    continue;
                }
            };
            match check_target(&expr, &a.ty, &from, reg, &format!("{target}.{}", a.name)) {
                Ok(()) => exprs[i] = Some(expr),
                Err(e) => errors.push(format!("{key}: {e}")),
            }
        }
        for r in required {
            match declared.iter().position(|a| a.name.eq_ignore_ascii_case(r.trim())) {
                None => errors.push(format!("required: {target} has no attribute {r}")),
                Some(i) if !attributes.keys().any(|k| k.trim().eq_ignore_ascii_case(&declared[i].name)) => {
                    errors.push(format!("required: {} has no expression in attributes", declared[i].name))
                }
                Some(_) => {}
            }
        }
        if attributes.is_empty() {
            errors.push("attributes: give an expression for at least one attribute".into());
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let attributes = declared
            .iter()
            .zip(exprs)
            .filter_map(|(a, e)| {
                e.map(|expr| TargetAttr {
                    name: a.name.clone(),
                    ty: a.ty.clone(),
                    expr,
                    required: required.iter().any(|r| r.trim().eq_ignore_ascii_case(&a.name)),
                })
            })
            .collect();
        Ok(Transformation { name: name.to_string(), from, to, attributes })
    }

    /// The target element for the stored (source) payload `stored`, in canonical form,
    /// within the default [`Limits`].
    pub fn apply(&self, reg: &TypeRegistry, stored: &[u8]) -> Result<XmlNode, TransformError> {
        self.apply_within(reg, stored, Limits::default())
    }

    /// [`Transformation::apply`] with one budget of `limits` for all its expressions: a
    /// transformation that needs more fails, naming the attribute where it stopped.
    pub fn apply_within(&self, reg: &TypeRegistry, stored: &[u8], limits: Limits) -> Result<XmlNode, TransformError> {
        let mut budget = Budget::of(limits);
        let view = PayloadView::new(&self.from, reg, stored);
        let target = self.to.to_string();
        let mut out = XmlNode::new(&target);
        for a in &self.attributes {
            let fail = |message: String| TransformError {
                transformation: self.name.clone(),
                attribute: a.name.clone(),
                message,
            };
            let path = format!("{target}.{}", a.name);
            if let (AttrType::Named(_), Some(src)) = (&a.ty.kind, a.expr.as_path()) {
                // An object copied whole (checked at compile time to be of this type).
                match source_element(&view, src) {
                    Some(e) => {
                        let node = XmlNode { name: a.name.clone(), attrs: Vec::new(), children: e.children.clone() };
                        let v = canon_value(reg, &a.ty, &node, &a.name, &path).map_err(|e| fail(reason(e)))?;
                        out.push(v.unwrap_or_else(|| XmlNode::new(&a.name)));
                    }
                    None if a.required => return Err(fail(null_required())),
                    None => {}
                }
                continue;
            }
            let text = match a.expr.eval_within(&Source(&view), &mut budget).map_err(fail)? {
                Value::Null | Value::Bool(_) => {
                    if a.required {
                        return Err(fail(null_required()));
                    }
                    continue;
                }
                Value::Number(n) => number_text(n),
                Value::Text(s) => s,
            };
            match canon_value(reg, &a.ty, &leaf(&a.name, text), &a.name, &path).map_err(|e| fail(reason(e)))? {
                Some(v) => {
                    out.push(v);
                }
                None if a.required => return Err(fail(null_required())),
                None => {}
            }
        }
        Ok(out)
    }
}

fn null_required() -> String {
    "the expression gives NULL, and the attribute is required".into()
}

/// A payload check's message without the path (the error names the attribute already).
fn reason(e: PayloadError) -> String {
    match e {
        PayloadError::Invalid { message, .. } => message,
        other => other.to_string(),
    }
}

/// A computed number as NUMBER text: integers without `.0`, others in plain notation.
fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { format!("{n}") }
}

/// The element at `source.<path>` of an object payload (the root for the empty path).
fn source_element<'v>(view: &'v PayloadView<'_>, path: &[String]) -> Option<&'v XmlNode> {
    let mut cur = view.tree()?;
    for seg in path {
        cur = cur.child(seg)?;
    }
    Some(cur)
}

/// Expressions see the source payload as `source...`; they have no message properties.
struct Source<'a, 'v>(&'a PayloadView<'v>);

impl ConditionContext for Source<'_, '_> {
    fn property(&self, _name: &str) -> Option<Value> {
        None
    }
    fn user_data(&self, path: &[String]) -> Value {
        self.0.user_data(path)
    }
    fn user_data_within(&self, path: &[String], max_bytes: usize) -> Result<Value, usize> {
        self.0.user_data_within(path, max_bytes)
    }
    fn user_property(&self, _name: &str) -> Value {
        Value::Null
    }
}

/// The static type of `source.<path>` in payloads of kind `from`; `None` if it names nothing.
fn source_type(reg: &TypeRegistry, from: &PayloadKind, path: &[String]) -> Option<ValueType> {
    let text = |p: &[String]| if p.is_empty() { "source".to_string() } else { format!("source.{}", p.join(".")) };
    match from {
        PayloadKind::Raw => path.is_empty().then_some(ValueType::Text),
        PayloadKind::Xml => (!path.is_empty()).then_some(ValueType::Unknown),
        PayloadKind::Object(t) => {
            let mut ty = AttrType::Named(t.clone());
            for seg in path {
                let AttrType::Named(name) = &ty else { return None };
                let Some(Body::Object(attrs)) = reg.types.get(name) else { return None };
                ty = attrs.iter().find(|a| a.name.eq_ignore_ascii_case(seg))?.ty.kind.clone();
            }
            Some(match ty {
                AttrType::Number { .. } => ValueType::Number,
                AttrType::Named(n) => ValueType::Composite { path: text(path), type_name: n },
                AttrType::Xml => ValueType::Unknown,
                _ => ValueType::Text,
            })
        }
        _ if path.is_empty() || !reg.has_user_data_path(from, path) => None,
        _ => Some(match path {
            [s] if s.eq_ignore_ascii_case("text_len") => ValueType::Number,
            [_, f] if f.eq_ignore_ascii_case("group_sequence") => ValueType::Number,
            _ => ValueType::Text,
        }),
    }
}

/// Whether `expr` can give a value of attribute type `ty` (what can be known before a message).
fn check_target(expr: &Expression, ty: &Ty, from: &PayloadKind, reg: &TypeRegistry, path: &str) -> Result<(), String> {
    let vt = expr.value_type(&|p| source_type(reg, from, p))?;
    match (&ty.kind, vt) {
        (AttrType::Named(want), ValueType::Composite { type_name, .. }) if *want == type_name => return Ok(()),
        (AttrType::Named(want), ValueType::Composite { path, type_name }) => {
            return Err(format!("{path} is of type {type_name}, the attribute of type {want}"));
        }
        (AttrType::Named(want), _) => {
            return Err(format!("the attribute is of object type {want}: give source.<attribute> of type {want}"));
        }
        (_, ValueType::Composite { path, type_name }) => {
            return Err(format!("{path} is of object type {type_name}: name one of its attributes"));
        }
        (AttrType::Date | AttrType::Timestamp { .. } | AttrType::Raw { .. }, ValueType::Number) => {
            return Err(format!("a NUMBER cannot be a {}", ty.decl));
        }
        (AttrType::Xml, _) => return Ok(()),
        _ => {}
    }
    match expr.literal() {
        Some(Value::Number(n)) => canon_scalar(ty, &number_text(*n), path).map_err(reason).map(|_| ()),
        Some(Value::Text(s)) => canon_scalar(ty, s, path).map_err(reason).map(|_| ()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPOLOGY: &str = include_str!("../../../../config/topology.toml");

    #[derive(serde::Deserialize)]
    struct Topo {
        types: Vec<TypeDef>,
    }

    fn reg() -> TypeRegistry {
        TypeRegistry::new(toml::from_str::<Topo>(TOPOLOGY).expect("demo topology").types).expect("types")
    }

    fn compile(from: &str, to: &str, attrs: &[(&str, &str)], required: &[&str]) -> Result<Transformation, Vec<String>> {
        let attributes = attrs.iter().map(|(a, e)| (a.to_string(), e.to_string())).collect();
        let required: Vec<String> = required.iter().map(|r| r.to_string()).collect();
        let (from, to) = (PayloadKind::parse(from).expect("from"), PayloadKind::parse(to).expect("to"));
        Transformation::compile("S.T", from, to, &attributes, &required, &reg())
    }

    fn stored(kind: &PayloadKind, xml: &str) -> Vec<u8> {
        let node = parse_xml(xml).expect("xml");
        encode(kind, &reg(), &node).expect("payload")
    }

    fn children(n: &XmlNode) -> Vec<(String, String)> {
        n.elements().map(|e| (e.name.clone(), e.text())).collect()
    }

    #[test]
    fn an_order_becomes_an_employee_and_objects_are_copied_whole() {
        let t = compile(
            "ORDER_TYP",
            "CUSTOMER_TYP",
            &[("CUSTNO", "source.ORDERNO"), ("NAME", "UPPER(source.CUSTOMER.NAME)"), ("CITY", "'Oslo'")],
            &["CUSTNO"],
        )
        .expect("compiles");
        let order = stored(
            &t.from,
            "<ORDER_TYP><ORDERNO>5</ORDERNO><CUSTOMER><NAME>ann</NAME><CITY>Rome</CITY></CUSTOMER></ORDER_TYP>",
        );
        let out = t.apply(&reg(), &order).expect("applies");
        assert_eq!(out.name, "CUSTOMER_TYP");
        let want: Vec<(String, String)> = [("CUSTNO", "5"), ("NAME", "ANN"), ("CITY", "Oslo")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(children(&out), want, "declared order, not the order given");

        // An object attribute copied whole into one of the same type.
        let t = compile(
            "ORDER_TYP",
            "ORDER_TYP",
            &[("ORDERNO", "source.ORDERNO * 10"), ("CUSTOMER", "source.CUSTOMER")],
            &[],
        )
        .expect("compiles");
        let out = t.apply(&reg(), &order).expect("applies");
        assert_eq!(out.child("ORDERNO").map(|e| e.text()), Some("50".into()));
        assert_eq!(out.child("CUSTOMER").and_then(|c| c.child("CITY")).map(|e| e.text()), Some("Rome".into()));
    }

    #[test]
    fn sources_of_every_payload_kind() {
        let jms = compile(
            "SYS.AQ$_JMS_TEXT_MESSAGE",
            "BOOK_TYP",
            &[("TITLE", "source.text_data"), ("PRICE", "source.text_len")],
            &[],
        )
        .expect("jms source");
        let msg = stored(&jms.from, "<jms_text_message><text_data>Dune</text_data></jms_text_message>");
        let out = jms.apply(&reg(), &msg).expect("applies");
        assert_eq!(out.child("PRICE").map(|e| e.text()), Some("4".into()));
        let raw = compile("RAW", "BOOK_TYP", &[("ISBN", "source")], &[]).expect("raw source");
        let out = raw.apply(&reg(), &[0xAB, 0x01]).expect("applies");
        assert_eq!(out.child("ISBN").map(|e| e.text()), Some("AB01".into()));
        let xml = compile("SYS.XMLTYPE", "BOOK_TYP", &[("TITLE", "source.book.title")], &[]).expect("xml source");
        let doc = stored(&xml.from, "<doc><book><title>Emma</title></book></doc>");
        assert_eq!(xml.apply(&reg(), &doc).expect("applies").child("TITLE").map(|e| e.text()), Some("Emma".into()));
    }

    #[test]
    fn failures_name_transformation_and_attribute() {
        let t = compile(
            "EMP_TYP",
            "EMP_TYP",
            &[("EMPNO", "source.EMPNO * 10"), ("ENAME", "source.ENAME || '-x'"), ("SAL", "source.SAL / source.COMM")],
            &["EMPNO"],
        )
        .expect("compiles");
        let fails = |xml: &str| t.apply(&reg(), &stored(&t.from, xml)).expect_err(xml);
        let e = fails("<EMP_TYP><EMPNO>1000</EMPNO></EMP_TYP>");
        assert_eq!((e.transformation.as_str(), e.attribute.as_str()), ("S.T", "EMPNO"));
        assert!(e.message.contains("too large for NUMBER(4)"), "{e}");
        let e = fails("<EMP_TYP><EMPNO>1</EMPNO><ENAME>ABCDEFGHI</ENAME></EMP_TYP>");
        assert_eq!(
            (e.attribute.as_str(), e.message.as_str()),
            ("ENAME", "value of 11 characters is too long for VARCHAR2(10)")
        );
        let e = fails("<EMP_TYP><EMPNO>1</EMPNO><SAL>5</SAL><COMM>0</COMM></EMP_TYP>");
        assert_eq!((e.attribute.as_str(), e.message.as_str()), ("SAL", "division by zero"));
        let e = fails("<EMP_TYP><ENAME>A</ENAME></EMP_TYP>");
        assert_eq!(
            e.to_string(),
            "error on transformation of message: transformation S.T, attribute EMPNO: the expression gives NULL, and the attribute is required"
        );
    }

    #[test]
    fn checked_at_compile_time() {
        let errors = |from: &str, to: &str, attrs: &[(&str, &str)], required: &[&str]| {
            compile(from, to, attrs, required).expect_err("refused").join("\n")
        };
        assert!(errors("ORDER_TYP", "RAW", &[("X", "1")], &[]).contains("to_type: RAW has no attributes to compute"));
        let e = errors(
            "ORDER_TYP",
            "EMP_TYP",
            &[
                ("NOPE", "1"),
                ("ENAME", "'much too long for ten'"),
                ("EMPNO", "source.CUSTOMER"),
                ("HIREDATE", "1"),
                ("JOB", "source.x"),
            ],
            &["MGR"],
        );
        for want in [
            "attributes.NOPE: EMP_TYP has no attribute NOPE",
            "attributes.ENAME: value of 21 characters is too long for VARCHAR2(10)",
            "attributes.EMPNO: source.customer is of object type CUSTOMER_TYP: name one of its attributes",
            "attributes.HIREDATE: a NUMBER cannot be a DATE",
            "attributes.JOB: source.x names nothing in the source type",
            "required: MGR has no expression in attributes",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
        assert!(
            errors("ORDER_TYP", "ORDER_TYP", &[("CUSTOMER", "source.ITEMS")], &[])
                .contains("source.items is of type LINEITEMS_VARTYP")
        );
    }
}
