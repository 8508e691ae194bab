//! The checks of a signed assertion's content: version, issuer, audience, validity
//! period, bearer confirmation, and its subject (the NameID's whole text, or an attribute).

use chrono::{DateTime, Utc};
use libxml::tree::Node;

use crate::nodes::is;
use crate::{ASSERTION_NS, BEARER, SamlError, Verified, Verifier, refuse};

fn children(node: &Node, local: &str) -> Vec<Node> {
    node.get_child_elements().into_iter().filter(|c| is(c, ASSERTION_NS, local)).collect()
}

fn one(node: &Node, local: &str) -> Result<Node, SamlError> {
    let mut c = children(node, local);
    match c.len() {
        1 => Ok(c.remove(0)),
        0 => refuse(format!("the assertion has no {local}")),
        _ => refuse(format!("the assertion has more than one {local}")),
    }
}

fn time(node: &Node, attr: &str) -> Result<Option<DateTime<Utc>>, SamlError> {
    let Some(v) = node.get_attribute(attr) else { return Ok(None) };
    DateTime::parse_from_rfc3339(v.trim())
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|_| SamlError(format!("{attr} {v:?} is not an xs:dateTime")))
}

/// The text of a leaf element, whole (all its text, however it was split), trimmed: for
/// values compared with configuration (issuer, audience).
fn leaf_text(node: &Node, what: &str) -> Result<String, SamlError> {
    Ok(exact_text(node, what)?.trim().to_string())
}

/// The text of a leaf element exactly as signed, for a name that becomes an agent: it
/// must be printable ASCII with no surrounding whitespace, so that no look-alike (`scott`
/// followed by a no-break or ideographic space, or padded) passes for another's name.
fn subject_text(node: &Node, what: &str) -> Result<String, SamlError> {
    let t = exact_text(node, what)?;
    if t.trim() != t {
        return refuse(format!("{what} {t:?} has surrounding whitespace; a name is matched exactly"));
    }
    if let Some(c) = t.chars().find(|c| !c.is_ascii_graphic() && *c != ' ') {
        return refuse(format!(
            "{what} {t:?} holds the character U+{:04X}; an agent's name is printable ASCII",
            u32::from(c)
        ));
    }
    Ok(t)
}

fn exact_text(node: &Node, what: &str) -> Result<String, SamlError> {
    if !node.get_child_elements().is_empty() {
        return refuse(format!("{what} has child elements"));
    }
    let t = node.get_content();
    if t.trim().is_empty() {
        return refuse(format!("{what} is empty"));
    }
    Ok(t)
}

/// Checks `a`, the assertion the signature covers, at `now`.
pub(crate) fn check(a: &Node, v: &Verifier, now: DateTime<Utc>) -> Result<Verified, SamlError> {
    if a.get_attribute("Version").as_deref() != Some("2.0") {
        return refuse("the assertion is not SAML 2.0");
    }
    let id = a.get_attribute("ID").unwrap_or_default();
    let issuer = leaf_text(&one(a, "Issuer")?, "Issuer")?;
    if issuer != v.idp.entity_id {
        return refuse(format!("the assertion was issued by {issuer:?}, not by the IdP {:?}", v.idp.entity_id));
    }
    // Checked: a skew beyond the calendar's range makes nothing early or late.
    let early = |t: DateTime<Utc>| now.checked_add_signed(v.skew).is_some_and(|x| t > x);
    let late = |t: DateTime<Utc>| now.checked_sub_signed(v.skew).is_some_and(|x| x >= t);

    let conditions = one(a, "Conditions")?;
    let not_before = time(&conditions, "NotBefore")?;
    let not_on_or_after = time(&conditions, "NotOnOrAfter")?;
    if not_before.is_some_and(early) {
        return refuse("the assertion is not yet valid (Conditions NotBefore)");
    }
    if not_on_or_after.is_some_and(late) {
        return refuse("the assertion has expired (Conditions NotOnOrAfter)");
    }
    let restrictions = children(&conditions, "AudienceRestriction");
    if restrictions.is_empty() {
        return refuse("the assertion has no AudienceRestriction");
    }
    for r in &restrictions {
        let audiences: Vec<String> =
            children(r, "Audience").iter().map(|x| x.get_content().trim().to_string()).collect();
        if !audiences.contains(&v.audience) {
            return refuse(format!("the assertion's audience is {audiences:?}, not {:?}", v.audience));
        }
    }

    let subject = one(a, "Subject")?;
    let mut last = SamlError("the assertion has no bearer SubjectConfirmation".into());
    let mut confirmed = false;
    // The id is remembered for as long as any bearer confirmation could accept the
    // assertion: the latest of their ends, also of those not valid now (one valid later
    // would otherwise let the assertion in again once the id is forgotten).
    let mut latest_end: Option<DateTime<Utc>> = None;
    for sc in children(&subject, "SubjectConfirmation") {
        if sc.get_attribute("Method").as_deref() != Some(BEARER) {
            continue;
        }
        let Some(data) = children(&sc, "SubjectConfirmationData").into_iter().next() else {
            last = SamlError("the bearer SubjectConfirmation has no SubjectConfirmationData".into());
            continue;
        };
        let Some(until) = time(&data, "NotOnOrAfter")? else {
            last = SamlError("the bearer SubjectConfirmationData has no NotOnOrAfter".into());
            continue;
        };
        latest_end = latest_end.max(Some(until));
        if time(&data, "NotBefore")?.is_some_and(early) {
            last = SamlError("the assertion is not yet valid (SubjectConfirmationData NotBefore)".into());
            continue;
        }
        if late(until) {
            last = SamlError("the assertion has expired (SubjectConfirmationData NotOnOrAfter)".into());
            continue;
        }
        confirmed = true;
    }
    let Some(latest_end) = latest_end.filter(|_| confirmed) else { return Err(last) };
    let valid_until = not_on_or_after.map_or(latest_end, |c| c.min(latest_end));

    let name = match &v.agent_attribute {
        None => {
            let name_id = children(&subject, "NameID");
            match name_id.as_slice() {
                [n] => subject_text(n, "the NameID")?,
                [] => return refuse("the assertion's Subject has no NameID"),
                _ => return refuse("the assertion's Subject has more than one NameID"),
            }
        }
        Some(attr) => attribute(a, attr)?,
    };
    Ok(Verified {
        issuer,
        assertion_id: id,
        subject: name,
        remember_until: valid_until.checked_add_signed(v.skew).unwrap_or(DateTime::<Utc>::MAX_UTC),
    })
}

/// The one value of the attribute named `attr` (its `Name`, or its `FriendlyName`).
fn attribute(a: &Node, attr: &str) -> Result<String, SamlError> {
    let mut values = Vec::new();
    for st in children(a, "AttributeStatement") {
        for at in children(&st, "Attribute") {
            let named = at.get_attribute("Name").as_deref() == Some(attr)
                || at.get_attribute("FriendlyName").as_deref() == Some(attr);
            if named {
                for val in children(&at, "AttributeValue") {
                    values.push(subject_text(&val, &format!("the attribute {attr:?}"))?);
                }
            }
        }
    }
    match values.len() {
        1 => Ok(values.remove(0)),
        0 => refuse(format!("the assertion has no attribute {attr:?}")),
        _ => refuse(format!("the attribute {attr:?} has more than one value")),
    }
}
