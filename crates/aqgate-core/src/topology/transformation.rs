//! Transformations as the topology declares them (`[[transformations]]`,
//! DBMS_TRANSFORM.CREATE_TRANSFORMATION with its ADD_ATTRIBUTE_TRANSFORMATIONs):
//!
//! ```toml
//! [[transformations]]
//! name = "AQUSER.ORDER_TO_EMP"        # SCHEMA.NAME, as queues
//! from_type = "QS.ORDER_TYP"          # any payload type: an object type, RAW, a JMS type, XMLTYPE
//! to_type = "AQUSER.EMP_TYP"          # an object type
//! required = ["EMPNO"]                # optional: attributes that must not come out NULL
//! [transformations.attributes]        # target attribute = expression over `source`
//! EMPNO = "source.ORDERNO + 1000"
//! ENAME = "UPPER(SUBSTR(source.CUSTOMER.NAME, 1, 10))"
//! ```
//!
//! Target attributes without an expression are NULL. Where they are used — a request's
//! `producer_options/transformation` (enqueue: the message is of `from_type`, stored as
//! `to_type`, which must be the queue's payload type), `consumer_options/transformation`
//! (dequeue: `from_type` must be the queue's), a subscriber's `transformation` (applied
//! when it dequeues without one of its own) and a local propagation job's `transformation`
//! (applied to each message moved) — is checked by the topology too.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::canon;
use crate::payload::{PayloadKind, Transformation, TypeRegistry};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TransformationDef {
    /// `SCHEMA.NAME`.
    pub name: String,
    pub from_type: String,
    pub to_type: String,
    /// Target attribute → expression (see `aqgate_proto::selector::Expression`).
    pub attributes: BTreeMap<String, String>,
    /// Target attributes whose value must not be NULL: a message that gives NULL for one
    /// fails the transformation (object attributes are otherwise nullable, as in Oracle).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
}

/// Compiled transformations by upper-case name.
pub type Transformations = BTreeMap<String, Arc<Transformation>>;

/// Checks and compiles the transformations; every problem is pushed to `errors` with its key path.
pub fn resolve(defs: &[TransformationDef], types: &TypeRegistry, errors: &mut Vec<String>) -> Transformations {
    let mut out = Transformations::new();
    for (i, d) in defs.iter().enumerate() {
        let key = format!("transformations[{i}] ({})", d.name);
        let name = canon(&d.name);
        if !super::is_qualified(&name) {
            errors.push(format!("{key}.name: expected SCHEMA.NAME"));
            continue;
        }
        let kind = |what: &str, s: &str, errors: &mut Vec<String>| match PayloadKind::parse(s) {
            Ok(PayloadKind::Object(n)) if !types.contains(&n) => {
                errors.push(format!("{key}.{what}: unknown type {n} (declare it in [[types]])"));
                None
            }
            Ok(PayloadKind::AnyData) => {
                errors.push(format!(
                    "{key}.{what}: SYS.ANYDATA cannot be transformed (a transformation maps one declared type to another)"
                ));
                None
            }
            Ok(k) => Some(k),
            Err(e) => {
                errors.push(format!("{key}.{what}: {e}"));
                None
            }
        };
        let (Some(from), Some(to)) = (kind("from_type", &d.from_type, errors), kind("to_type", &d.to_type, errors))
        else {
            continue;
        };
        match Transformation::compile(&name, from, to, &d.attributes, &d.required, types) {
            Ok(t) => {
                if out.insert(name, Arc::new(t)).is_some() {
                    errors.push(format!("{key}: defined twice"));
                }
            }
            Err(es) => errors.extend(es.into_iter().map(|e| format!("{key}.{e}"))),
        }
    }
    out
}

/// The transformation `name` refers to (at `key`), if its `from` type is `from` (and, when
/// given, its `to` type is `to`); otherwise an error for the topology.
pub fn check_use(
    all: &Transformations,
    name: &str,
    from: &PayloadKind,
    to: Option<&PayloadKind>,
    key: &str,
) -> Result<String, String> {
    let n = canon(name);
    let Some(t) = all.get(&n) else {
        return Err(format!("{key}: unknown transformation {n} (declare it in [[transformations]])"));
    };
    if t.from != *from {
        return Err(format!("{key}: {n} transforms {}, not {from}", t.from));
    }
    if let Some(to) = to
        && t.to != *to
    {
        return Err(format!("{key}: {n} makes {}, not {to}", t.to));
    }
    Ok(n)
}
