//! Transformations at enqueue and dequeue (see `topology::transformation`): which one a
//! request applies, and the message it makes. A transformation that fails on a message
//! fails the request (ORA-25229, naming the transformation and the attribute) before
//! anything is written, so a request is never applied in part.

use std::sync::Arc;

use crate::error::{AqError, code};
use crate::idap::model::XmlNode;
use crate::payload::{self, Transformation};
use crate::topology::{Catalog, QueueInfo};

use super::ConditionLimits;

/// The transformation a request names; a name the topology does not know is a Fault.
fn named<'c>(catalog: &'c Catalog, name: &str) -> Result<&'c Arc<Transformation>, AqError> {
    catalog.transformation(name).ok_or_else(|| {
        AqError::invalid(format!(
            "transformation {} does not exist (declare it in [[transformations]] of the topology)",
            name.trim().to_ascii_uppercase()
        ))
    })
}

/// `producer_options/transformation`: it must make the queue's payload type.
pub(super) fn for_enqueue<'c>(
    catalog: &'c Catalog,
    name: &str,
    queue: &QueueInfo,
) -> Result<&'c Arc<Transformation>, AqError> {
    let t = named(catalog, name)?;
    if t.to != queue.payload {
        return Err(AqError::client(
            code::PAYLOAD_MISMATCH,
            format!(
                "transformation {} makes {} payloads, and queue {} takes {}: name a transformation to {}",
                t.name, t.to, queue.name, queue.payload, queue.payload
            ),
        ));
    }
    Ok(t)
}

/// The transformation a dequeue applies: the one it names (its `from_type` must be the
/// queue's), else the subscriber's. The one named wins, as in Oracle: the consumer says
/// what it can read for this dequeue, and both start from the queue's type, so they
/// cannot be chained.
pub(super) fn for_dequeue(
    catalog: &Catalog,
    named_by_request: Option<&str>,
    queue: &QueueInfo,
    consumer: &str,
) -> Result<Option<Arc<Transformation>>, AqError> {
    if let Some(name) = named_by_request.filter(|n| !n.trim().is_empty()) {
        let t = named(catalog, name)?;
        if t.from != queue.payload {
            return Err(AqError::client(
                code::PAYLOAD_MISMATCH,
                format!(
                    "transformation {} transforms {} payloads, and queue {} holds {}: name a transformation from {}",
                    t.name, t.from, queue.name, queue.payload, queue.payload
                ),
            ));
        }
        return Ok(Some(t.clone()));
    }
    let subscribed = queue.subscribers.iter().find(|s| s.name == consumer).and_then(|s| s.transformation.as_deref());
    Ok(subscribed.and_then(|n| catalog.transformation(n)).cloned())
}

/// The message a client sends (of the transformation's `from_type`) made into the payload
/// that is stored.
pub(super) fn incoming(
    catalog: &Catalog,
    t: &Transformation,
    node: &XmlNode,
    limits: &ConditionLimits,
) -> Result<XmlNode, AqError> {
    let stored = payload::encode(&t.from, &catalog.types, node).map_err(|e| {
        AqError::client(
            code::PAYLOAD_MISMATCH,
            format!("payload does not match the from type {} of transformation {}: {e}", t.from, t.name),
        )
    })?;
    t.apply_within(&catalog.types, &stored, limits.limits).map_err(failed)
}

/// A stored payload made into the one a consumer receives.
pub(super) fn outgoing(
    catalog: &Catalog,
    t: &Transformation,
    stored: &[u8],
    limits: &ConditionLimits,
) -> Result<XmlNode, AqError> {
    t.apply_within(&catalog.types, stored, limits.limits).map_err(failed)
}

/// 25229, or 2393 when the transformation needed more work than its budget (the text
/// names the transformation, the attribute and the limit).
fn failed(e: payload::TransformError) -> AqError {
    if e.message.starts_with(crate::selector::OVER_BUDGET) {
        return AqError::client(
            code::CONDITION_BUDGET,
            format!("{e} (--condition-max-steps, --condition-max-text-bytes)"),
        );
    }
    AqError::client(code::TRANSFORMATION, e.to_string())
}
