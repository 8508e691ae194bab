//! The listing's filters from a page's query: each checked and capped here, handed to the
//! store as values (`ViewFilter`: bound parameters of its SQL, never its text), and shown
//! back in the form as typed (escaped by the template).

use std::collections::HashMap;

use aqgate_admin::messages::STATES;
use aqgate_core::store::{Expiry, ViewFilter};

/// The longest text a filter takes (correlation, sender, payload search).
pub(crate) const TEXT_MAX: usize = 256;

/// The filters as typed, for the form.
#[derive(Default)]
pub(crate) struct Shown {
    pub min_priority: String,
    pub max_priority: String,
    pub corr: String,
    pub corr_prefix: bool,
    pub sender: String,
    pub from: String,
    pub before: String,
    pub payload: String,
}

fn text(p: &HashMap<String, String>, name: &str) -> Result<Option<String>, String> {
    match p.get(name).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) if s.len() > TEXT_MAX => Err(format!("{name}: at most {TEXT_MAX} bytes")),
        Some(s) => Ok(Some(s.to_string())),
    }
}

fn int(p: &HashMap<String, String>, name: &str) -> Result<Option<i64>, String> {
    text(p, name)?.map(|s| s.parse::<i64>().map_err(|_| format!("{name}: a whole number, not {s:?}"))).transpose()
}

/// A time as a date and time in UTC (`2026-01-31T12:00`, seconds optional, `T` or a
/// space), in microseconds.
fn time(p: &HashMap<String, String>, name: &str) -> Result<Option<i64>, String> {
    let Some(s) = text(p, name)? else { return Ok(None) };
    let t = s.replace(' ', "T");
    let parsed = chrono::NaiveDateTime::parse_from_str(&t, "%Y-%m-%dT%H:%M:%S%.f")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(&t, "%Y-%m-%dT%H:%M"))
        .map_err(|_| format!("{name}: a date and time in UTC such as 2026-01-31T12:00, not {s:?}"))?;
    Ok(Some(parsed.and_utc().timestamp_micros()))
}

/// The filter a query asks for, and what to show back; an error names the bad field.
pub(crate) fn parse(p: &HashMap<String, String>) -> Result<(ViewFilter, Shown), String> {
    let state = match text(p, "state")?.map(|s| s.to_ascii_uppercase()) {
        Some(s) if !STATES.contains(&s.as_str()) => return Err(format!("state: one of {}", STATES.join(", "))),
        s => s,
    };
    let reason = match text(p, "reason")? {
        None => None,
        Some(r) => match Expiry::ALL.iter().find(|e| e.oracle_name().eq_ignore_ascii_case(&r)) {
            Some(e) => Some(e.code()),
            None => {
                let names: Vec<&str> = Expiry::ALL.iter().map(|e| e.oracle_name()).collect();
                return Err(format!("reason: one of {}", names.join(", ")));
            }
        },
    };
    let corr_prefix = p.get("corr_prefix").is_some_and(|v| !v.is_empty());
    let f = ViewFilter {
        state,
        min_priority: int(p, "min_priority")?,
        max_priority: int(p, "max_priority")?,
        correlation: text(p, "corr")?,
        corr_prefix,
        sender: text(p, "sender")?,
        enq_from: time(p, "from")?,
        enq_before: time(p, "before")?,
        reason,
        payload: text(p, "payload")?.map(String::into_bytes),
        msgid: None,
    };
    let shown = |n: &str| p.get(n).map(|s| s.trim().to_string()).unwrap_or_default();
    let s = Shown {
        min_priority: shown("min_priority"),
        max_priority: shown("max_priority"),
        corr: shown("corr"),
        corr_prefix,
        sender: shown("sender"),
        from: shown("from"),
        before: shown("before"),
        payload: shown("payload"),
    };
    Ok((f, s))
}
