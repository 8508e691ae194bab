//! What a selector condition or subscriber rule sees of a message: its properties, its
//! payload attributes (`tab.user_data.…`) and JMS user properties.

use crate::clock::{MICROS_PER_SEC, Micros};
use crate::payload::{PayloadKind, PayloadView, TypeRegistry};
use crate::selector::ConditionContext;
use crate::store::{NewMessage, StoredMessage};
use crate::value::Value;

/// The message properties a condition can name (lower-case, aliases included): exactly
/// those [`MessageContext`] answers (a test checks the two agree).
pub const MESSAGE_PROPERTIES: &[&str] = &[
    "priority",
    "corrid",
    "correlation",
    "msgid",
    "message_id",
    "enq_time",
    "state",
    "msg_state",
    "message_state",
    "delay",
    "expiration",
    "retry_count",
    "delivery_count",
    "sender_name",
    "sender_address",
    "sender_protocol",
    "exception_queue",
    "consumer_name",
    "q_name",
    "queue",
];

pub struct MessageContext<'a> {
    msgid: [u8; 16],
    corrid: Option<&'a str>,
    priority: i64,
    enq_time: Micros,
    delay_until: Option<Micros>,
    expire_at: Option<Micros>,
    sender: Option<&'a str>,
    exception_queue: Option<&'a str>,
    retry_count: i64,
    state: i32,
    consumer: &'a str,
    queue_name: &'a str,
    payload: PayloadView<'a>,
}

impl<'a> MessageContext<'a> {
    pub fn for_stored(m: &'a StoredMessage, queue_name: &'a str, kind: &'a PayloadKind, reg: &'a TypeRegistry) -> Self {
        Self {
            msgid: m.msgid,
            corrid: m.corrid.as_deref(),
            priority: m.priority,
            enq_time: m.enq_time,
            delay_until: m.delay_until,
            expire_at: m.expire_at,
            sender: m.sender.as_deref(),
            exception_queue: m.exception_queue.as_deref(),
            retry_count: m.retry_count,
            state: m.state,
            consumer: &m.consumer,
            queue_name,
            payload: PayloadView::new(kind, reg, &m.payload),
        }
    }

    pub fn for_new(m: &'a NewMessage, queue_name: &'a str, kind: &'a PayloadKind, reg: &'a TypeRegistry) -> Self {
        Self {
            msgid: m.msgid,
            corrid: m.corrid.as_deref(),
            priority: m.priority,
            enq_time: m.enq_time,
            delay_until: m.delay_until,
            expire_at: m.expire_at,
            sender: m.sender.as_deref(),
            exception_queue: m.exception_queue.as_deref(),
            retry_count: 0,
            state: if m.delay_until.is_some() { 1 } else { 0 },
            consumer: "",
            queue_name,
            payload: PayloadView::new(kind, reg, &m.payload),
        }
    }

    /// The context as consumer `consumer` sees the message (`consumer_name`).
    pub fn as_consumer(self, consumer: &'a str) -> Self {
        Self { consumer, ..self }
    }

    fn sender_field(&self, field: &str) -> Value {
        let Some(a) = self.sender.and_then(super::agent_from_json) else { return Value::Null };
        match field {
            "name" => a.name.map_or(Value::Null, Value::Text),
            "address" => a.address.map_or(Value::Null, Value::Text),
            _ => a.protocol.map_or(Value::Null, |p| Value::Number(f64::from(p))),
        }
    }
}

fn text(v: Option<&str>) -> Value {
    v.map_or(Value::Null, |s| Value::Text(s.to_string()))
}

#[allow(clippy::cast_precision_loss)]
fn num(v: i64) -> Value {
    Value::Number(v as f64)
}

impl ConditionContext for MessageContext<'_> {
    fn property(&self, name: &str) -> Option<Value> {
        Some(match name {
            "priority" => num(self.priority),
            "corrid" | "correlation" => text(self.corrid),
            "msgid" | "message_id" => Value::Text(crate::payload::hex_upper(&self.msgid)),
            "enq_time" => Value::Text(format_timestamp(self.enq_time)),
            "state" | "msg_state" | "message_state" => num(i64::from(self.state)),
            "delay" => self.delay_until.map_or(Value::Null, |t| Value::Text(format_timestamp(t))),
            "expiration" => self.expire_at.map_or(Value::Null, |t| Value::Text(format_timestamp(t))),
            "retry_count" | "delivery_count" => num(self.retry_count),
            "sender_name" => self.sender_field("name"),
            "sender_address" => self.sender_field("address"),
            "sender_protocol" => self.sender_field("protocol"),
            "exception_queue" => text(self.exception_queue),
            "consumer_name" => text(Some(self.consumer).filter(|c| !c.is_empty())),
            "q_name" | "queue" => Value::Text(self.queue_name.to_string()),
            _ => return None,
        })
    }

    fn user_data(&self, path: &[String]) -> Value {
        self.payload.user_data(path)
    }

    fn user_data_within(&self, path: &[String], max_bytes: usize) -> Result<Value, usize> {
        self.payload.user_data_within(path, max_bytes)
    }

    fn user_property(&self, name: &str) -> Value {
        self.payload.user_property(name)
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC), which compares correctly as text.
pub fn format_timestamp(t: Micros) -> String {
    let secs = t.div_euclid(MICROS_PER_SEC);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_property_list_is_what_the_context_answers() {
        let m = NewMessage::for_test([7; 16], 1);
        let reg = TypeRegistry::default();
        let ctx = MessageContext::for_new(&m, "Q", &PayloadKind::Raw, &reg);
        for p in MESSAGE_PROPERTIES {
            assert!(ctx.property(p).is_some(), "{p}");
        }
        for other in ["deptno", "country", "user_data", "payload"] {
            assert!(ctx.property(other).is_none(), "{other}");
        }
    }

    #[test]
    fn timestamps_format_as_utc() {
        assert_eq!(format_timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(format_timestamp(951_782_400 * MICROS_PER_SEC + 61 * MICROS_PER_SEC), "2000-02-29 00:01:01");
        assert_eq!(format_timestamp(-MICROS_PER_SEC), "1969-12-31 23:59:59");
    }
}
